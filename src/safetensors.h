/* SPDX-License-Identifier: MIT */
/*
 * safetensors.h - a strict reader and a writer of the safetensors format
 * (u64 LE header length N | N bytes of JSON | data).  The reader rejects
 * what the reference implementation rejects: N over 100,000,000 or past
 * the file, duplicate keys, unknown dtypes, sizes that disagree with the
 * shape, holes or overlaps between tensors, and data that does not end
 * exactly at the end of the file.  It also refuses some files the
 * reference takes, whole: a dtype wex does not read (C64, and the
 * sub-byte F4, F6_E2M3, F6_E3M2), a tensor entry with keys besides dtype,
 * shape and data_offsets, "__metadata__": null, a name holding NUL or of
 * WEX_NAME_MAX bytes or more, and more than WEX_MAX_DIMS dimensions.
 */
#ifndef WEX_SAFETENSORS_H
#define WEX_SAFETENSORS_H

#include <stddef.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>
#include "wex.h"

#define WEX_ST_MAX_HEADER 100000000ull

struct wex_st_tensor {
	char name[WEX_NAME_MAX];
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[WEX_MAX_DIMS];
	uint64_t begin, end;   /* bytes, relative to the data start */
	const void *data;      /* reader: the mapped bytes; writer: the source */
};

struct wex_st_file {
	int fd;
	void *map;
	uint64_t size;
	uint64_t data_off;     /* 8 + N */
	struct timespec mtime; /* as opened (wex__st_changed) */
	struct wex_st_tensor *t;
	size_t n;
	struct wex_st_tensor **by_name; /* t's entries sorted by name (wex__st_find) */
};

/* qsort order of (struct wex_st_tensor *)s by [begin, end). */
int wex__st_by_begin(const void *a, const void *b);

/*
 * Validates a header of n bytes for a data area of data_size bytes and
 * returns its tensors (malloc'ed, data pointers unset).  Errors: -EINVAL
 * with the reason in err, -ENOMEM.  Pure.
 */
int wex__st_parse_header(const char *hdr, size_t n, uint64_t data_size, struct wex_st_tensor **t,
			 size_t *nt, char *err, size_t errlen);

/* Opens and maps `path` read-only and validates it.  Blocks (file I/O).
 * Errors: -errno of open/mmap, -EINVAL (message in err). */
int wex__st_open(const char *path, struct wex_st_file *f, char *err, size_t errlen);
void wex__st_close(struct wex_st_file *f);
const struct wex_st_tensor *wex__st_find(const struct wex_st_file *f, const char *name);

/*
 * A file shrunk while mapped (rewritten in place under its name, as
 * safetensors' save_file does: it truncates first) faults on its pages
 * past the new end: SIGBUS.  wex__st_guard installs a SIGBUS handler, for
 * the process, that maps zeros over the rest of an open file's mapping
 * where a read faults in it (other faults stay fatal); wex__st_changed
 * then says, -EIO with `path` in err, that f's size or mtime is not what
 * it was when opened (both sizes given), or that a read of it faulted
 * (also how an I/O error shows): what was read from it is not to be used.
 * Files are opened and closed while no read of a mapped one runs in
 * another thread.
 */
int wex__st_guard(void);
int wex__st_changed(const struct wex_st_file *f, const char *path, char *err, size_t errlen);

/*
 * Writes t[0..n) (name, dtype, ndim, shape, data) to `path`: tensors
 * ordered by descending element size then name so each is aligned to its
 * element size; header padded with spaces to a multiple of 8.  Written to
 * `path`.tmp.PID, synced, then renamed.  Blocks.
 * Errors: -errno (the cause named in err), -EINVAL (bad dtype, duplicate
 * name).
 */
int wex__st_write(const char *path, const struct wex_st_tensor *t, size_t n, char *err,
		  size_t errlen);

/*
 * The same file written in place, without a copy of its data in memory:
 * wex__st_create writes the header, claims the data's blocks (a full disk
 * fails here) and maps the data area; each t[i].data then points at the
 * tensor's bytes in the file (zeros until written; cast to write), and
 * t[i].begin/end are set.  wex__st_finish syncs, renames over `path` and
 * unmaps; wex__st_abort (after create, instead of finish) unmaps and
 * removes the temporary.  Both leave `out` closed.
 */
struct wex_st_out {
	int fd;
	void *map;
	uint64_t size, data_off;
	char path[PATH_MAX];
	char tmp[PATH_MAX + 32];
};

int wex__st_create(const char *path, struct wex_st_tensor *t, size_t n, struct wex_st_out *out,
		   char *err, size_t errlen);
int wex__st_finish(struct wex_st_out *out, char *err, size_t errlen);
void wex__st_abort(struct wex_st_out *out);

#endif
