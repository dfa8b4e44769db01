/* SPDX-License-Identifier: MIT */
/*
 * safetensors.c - strict safetensors reader (mmap) and writer.  Rules from
 * the reference implementation (platform-facts G): header length at most
 * 100,000,000 and inside the file; JSON object; no duplicate keys;
 * __metadata__ a map of strings; every other entry {dtype, shape,
 * data_offsets}; end - begin == numel * dtype size; sorted by offset the
 * tensors tile the data area from 0 with no holes and end at its end.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

#include "log.h"

#define seterr wex__seterr

int wex__st_by_begin(const void *a, const void *b)
{
	const struct wex_st_tensor *x = *(struct wex_st_tensor *const *)a;
	const struct wex_st_tensor *y = *(struct wex_st_tensor *const *)b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	/* Empty tensors share offsets with their neighbours: order by end. */
	return x->end < y->end ? -1 : x->end > y->end;
}

/* A non-negative JSON integer. */
static int get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

int wex__st_parse_header(const char *hdr, size_t n, uint64_t data_size, struct wex_st_tensor **t,
			 size_t *nt, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root, *v;
	struct wex_st_tensor *a = NULL, **s = NULL;
	const char *key;
	size_t k = 0;
	int ret = -EINVAL;

	root = json_loadb(hdr, n, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		if (je.column < 0) /* (jansson's -1: no position to give) */
			seterr(err, errlen, "header is not valid JSON: %s", je.text);
		else
			seterr(err, errlen, "header is not valid JSON: %s (column %d)", je.text,
			       je.column);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		seterr(err, errlen, "header is not a JSON object");
		goto out;
	}
	a = calloc(json_object_size(root) + 1, sizeof(*a));
	s = calloc(json_object_size(root) + 1, sizeof(*s));
	if (!a || !s) {
		ret = -ENOMEM;
		goto out;
	}
	json_object_foreach(root, key, v) {
		struct wex_st_tensor *x = &a[k];
		json_t *shape, *off, *d;
		const char *dt;
		uint64_t numel = 1, esz;
		size_t i;

		if (!strcmp(key, "__metadata__")) {
			const char *mk;
			json_t *mv;

			if (!json_is_object(v)) {
				seterr(err, errlen, "__metadata__ is not an object");
				goto out;
			}
			json_object_foreach(v, mk, mv)
				if (!json_is_string(mv)) {
					seterr(err, errlen, "__metadata__ value \"%s\" is not a string", mk);
					goto out;
				}
			continue;
		}
		if (strlen(key) >= WEX_NAME_MAX) {
			seterr(err, errlen, "tensor name longer than %d bytes: %.40s...", WEX_NAME_MAX - 1, key);
			goto out;
		}
		if (!json_is_object(v) || json_object_size(v) != 3) {
			seterr(err, errlen, "%s: entry must have exactly dtype, shape, data_offsets", key);
			goto out;
		}
		snprintf(x->name, sizeof(x->name), "%s", key);
		dt = json_string_value(json_object_get(v, "dtype"));
		x->dtype = dt ? wex_dtype_from_name(dt) : WEX_DT_INVALID;
		esz = wex_dtype_size(x->dtype);
		if (!esz) {
			seterr(err, errlen, "%s: unsupported dtype %s%s", key, dt ? dt : "(missing)",
			       dt && (!strcmp(dt, "C64") || !strcmp(dt, "F4") || !strcmp(dt, "F6_E2M3") ||
				      !strcmp(dt, "F6_E3M2"))
				       ? " (a safetensors dtype wex does not read: the file is refused "
					 "whole, even where no layout names this tensor)"
				       : "");
			goto out;
		}
		shape = json_object_get(v, "shape");
		if (!json_is_array(shape) || json_array_size(shape) > WEX_MAX_DIMS) {
			seterr(err, errlen, "%s: shape must be an array of at most %d sizes", key, WEX_MAX_DIMS);
			goto out;
		}
		x->ndim = (uint32_t)json_array_size(shape);
		json_array_foreach(shape, i, d) {
			if (get_u64(d, &x->shape[i]) < 0) {
				seterr(err, errlen, "%s: shape[%zu] is not a non-negative integer", key, i);
				goto out;
			}
			if (x->shape[i] && numel > UINT64_MAX / x->shape[i]) {
				seterr(err, errlen, "%s: shape overflows", key);
				goto out;
			}
			numel *= x->shape[i];
		}
		off = json_object_get(v, "data_offsets");
		if (!json_is_array(off) || json_array_size(off) != 2 ||
		    get_u64(json_array_get(off, 0), &x->begin) < 0 ||
		    get_u64(json_array_get(off, 1), &x->end) < 0 || x->end < x->begin) {
			seterr(err, errlen, "%s: data_offsets must be [begin, end] with begin <= end", key);
			goto out;
		}
		if (numel > UINT64_MAX / esz) {
			seterr(err, errlen, "%s: shape overflows (%llu elements of %s: more bytes than "
			       "64 bits count)", key, (unsigned long long)numel, dt);
			goto out;
		}
		if (x->end - x->begin != numel * esz) {
			seterr(err, errlen, "%s: %llu bytes for %llu elements of %s (%llu expected)", key,
			       (unsigned long long)(x->end - x->begin), (unsigned long long)numel, dt,
			       (unsigned long long)(numel * esz));
			goto out;
		}
		s[k] = x;
		k++;
	}
	qsort(s, k, sizeof(*s), wex__st_by_begin);
	uint64_t at = 0;
	for (size_t i = 0; i < k; i++) {
		if (s[i]->begin != at) {
			seterr(err, errlen, "%s: starts at %llu, expected %llu (%s)", s[i]->name,
			       (unsigned long long)s[i]->begin, (unsigned long long)at,
			       s[i]->begin > at ? "hole" : "overlap");
			goto out;
		}
		at = s[i]->end;
	}
	if (at != data_size) {
		seterr(err, errlen, "tensors cover %llu bytes but the data area holds %llu",
		       (unsigned long long)at, (unsigned long long)data_size);
		goto out;
	}
	*t = a;
	*nt = k;
	a = NULL;
	ret = 0;
out:
	free(a);
	free(s);
	json_decref(root);
	return ret;
}

/* The open files' mappings, for st_sigbus: [lo, hi) each, and whether a
 * read in it faulted. */
static struct {
	uintptr_t lo, hi;
	volatile sig_atomic_t hit;
} *volatile mapped;
static volatile size_t nmapped;
static size_t mapped_cap;
static uintptr_t page_size = 4096;

static int map_add(const void *map, uint64_t size)
{
	if (nmapped == mapped_cap) {
		size_t cap = mapped_cap ? 2 * mapped_cap : 16;
		void *v = realloc((void *)mapped, cap * sizeof(*mapped));

		if (!v)
			return -ENOMEM;
		mapped = v;
		mapped_cap = cap;
	}
	mapped[nmapped].lo = (uintptr_t)map;
	mapped[nmapped].hi = (uintptr_t)map + size;
	mapped[nmapped].hit = 0;
	nmapped = nmapped + 1;
	return 0;
}

static void map_del(const void *map)
{
	for (size_t i = 0; i < nmapped; i++)
		if (mapped[i].lo == (uintptr_t)map) {
			mapped[i].lo = mapped[nmapped - 1].lo;
			mapped[i].hi = mapped[nmapped - 1].hi;
			mapped[i].hit = mapped[nmapped - 1].hit;
			nmapped = nmapped - 1;
			return;
		}
}

static void st_sigbus(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;

	(void)uc;
	for (size_t i = 0; i < nmapped; i++)
		if (a >= mapped[i].lo && a < mapped[i].hi) {
			uintptr_t at = a & ~(page_size - 1);

			/* From the faulting page on: one fault per file. */
			mapped[i].hit = 1;
			if (mmap((void *)at, mapped[i].hi - at, PROT_READ,
				 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED)
				return;
			break;
		}
	/* Not a file of ours: the read faults again, fatal as without us. */
	signal(sig, SIG_DFL);
}

int wex__st_guard(void)
{
	struct sigaction sa;
	long pg = sysconf(_SC_PAGESIZE);

	if (pg > 0)
		page_size = (uintptr_t)pg;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = st_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL) < 0 ? -errno : 0;
}

int wex__st_changed(const struct wex_st_file *f, const char *path, char *err, size_t errlen)
{
	struct stat st;
	int hit = 0;

	for (size_t i = 0; i < nmapped; i++)
		if (mapped[i].lo == (uintptr_t)f->map)
			hit = mapped[i].hit;
	if (fstat(f->fd, &st) < 0) {
		int e = errno;

		seterr(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	if ((uint64_t)st.st_size == f->size && st.st_mtim.tv_sec == f->mtime.tv_sec &&
	    st.st_mtim.tv_nsec == f->mtime.tv_nsec) {
		if (!hit)
			return 0;
		/* Also a SIGBUS: an I/O error reading a mapped page. */
		seterr(err, errlen, "%s: reading it failed (SIGBUS on a mapped page: an I/O "
		       "error?)", path);
		return -EIO;
	}
	seterr(err, errlen, "%s changed while being read (%llu bytes, %llu when opened): another "
	       "process writes it; convert it once it is written", path,
	       (unsigned long long)st.st_size, (unsigned long long)f->size);
	return -EIO;
}

static int by_name(const void *a, const void *b)
{
	return strcmp((*(struct wex_st_tensor *const *)a)->name,
		      (*(struct wex_st_tensor *const *)b)->name);
}

int wex__st_open(const char *path, struct wex_st_file *f, char *err, size_t errlen)
{
	struct stat st;
	uint64_t n;
	int ret;

	memset(f, 0, sizeof(*f));
	/* (O_NONBLOCK: a FIFO is refused below, never waited on.) */
	f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (f->fd < 0) {
		ret = -errno;
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		return ret;
	}
	if (fstat(f->fd, &st) < 0) {
		ret = -errno;
		seterr(err, errlen, "%s: %s", path, strerror(errno));
		goto err;
	}
	if (!S_ISREG(st.st_mode)) {
		/* It said "mmap: No such device", or "0 bytes" for a pipe. */
		seterr(err, errlen, "%s: not a regular file (%s)", path,
		       S_ISDIR(st.st_mode) ? "a directory" : "a pipe, socket or device");
		ret = -EINVAL;
		goto err;
	}
	f->size = (uint64_t)st.st_size;
	f->mtime = st.st_mtim;
	if (f->size < 8) {
		seterr(err, errlen, "%s: %llu bytes, too short for a safetensors header", path,
		       (unsigned long long)f->size);
		ret = -EINVAL;
		goto err;
	}
	f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, f->fd, 0);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		ret = -errno;
		seterr(err, errlen, "%s: mmap: %s", path, strerror(errno));
		goto err;
	}
	if (map_add(f->map, f->size) < 0) {
		munmap(f->map, f->size);
		f->map = NULL;
		seterr(err, errlen, "%s: out of memory", path);
		ret = -ENOMEM;
		goto err;
	}
	{
		const unsigned char *b = f->map;

		n = 0;
		for (int i = 7; i >= 0; i--)
			n = (n << 8) | b[i];
	}
	if (n > WEX_ST_MAX_HEADER || n > f->size - 8) {
		seterr(err, errlen, "%s: header length %llu exceeds %s", path, (unsigned long long)n,
		       n > WEX_ST_MAX_HEADER ? "the 100,000,000 byte limit" : "the file");
		ret = -EINVAL;
		goto err;
	}
	f->data_off = 8 + n;
	ret = wex__st_parse_header((const char *)f->map + 8, (size_t)n, f->size - f->data_off, &f->t,
				   &f->n, err, errlen);
	if (ret < 0) {
		/* Say which file. */
		if (err && errlen > 1) {
			char tmp[512];

			snprintf(tmp, sizeof(tmp), "%s", err);
			seterr(err, errlen, "%s: %s", path, tmp);
		}
		goto err;
	}
	for (size_t i = 0; i < f->n; i++)
		f->t[i].data = (const char *)f->map + f->data_off + f->t[i].begin;
	/* Found by name once per tensor a conversion writes: a scan each
	 * time is quadratic (DeepSeek-V3's 91,000 tensors with FP8 scales). */
	f->by_name = malloc((f->n ? f->n : 1) * sizeof(*f->by_name));
	if (!f->by_name) {
		seterr(err, errlen, "%s: out of memory", path);
		ret = -ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < f->n; i++)
		f->by_name[i] = &f->t[i];
	qsort(f->by_name, f->n, sizeof(*f->by_name), by_name);
	return 0;
err:
	wex__st_close(f);
	return ret;
}

void wex__st_close(struct wex_st_file *f)
{
	if (f->map) {
		map_del(f->map);
		munmap(f->map, f->size);
	}
	if (f->fd >= 0)
		close(f->fd);
	free(f->t);
	free(f->by_name);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}

const struct wex_st_tensor *wex__st_find(const struct wex_st_file *f, const char *name)
{
	size_t lo = 0, hi = f->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(f->by_name[mid]->name, name);

		if (!c)
			return f->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int write_order(const void *a, const void *b)
{
	const struct wex_st_tensor *x = *(struct wex_st_tensor *const *)a;
	const struct wex_st_tensor *y = *(struct wex_st_tensor *const *)b;
	size_t sx = wex_dtype_size(x->dtype), sy = wex_dtype_size(y->dtype);

	if (sx != sy)
		return sx > sy ? -1 : 1;
	return strcmp(x->name, y->name);
}

static uint64_t st_bytes(const struct wex_st_tensor *t)
{
	uint64_t n = wex_dtype_size(t->dtype);

	for (uint32_t i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

/*
 * The header of t[0..n) in write order (descending element size, then
 * name; each tensor aligned to its element size), begin/end set in t.
 * Returns the JSON text (malloc'ed) or NULL with ret set.
 */
static char *st_header(struct wex_st_tensor *t, size_t n, uint64_t *data_size, int *ret,
		       char *err, size_t errlen)
{
	struct wex_st_tensor **o = calloc(n + 1, sizeof(*o));
	json_t *root = json_object();
	char *hdr = NULL;
	uint64_t at = 0;

	*ret = -ENOMEM;
	if (!o || !root)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if (!wex_dtype_size(t[i].dtype) || t[i].ndim > WEX_MAX_DIMS) {
			seterr(err, errlen, "%s: bad dtype or rank", t[i].name);
			*ret = -EINVAL;
			goto out;
		}
		o[i] = &t[i];
	}
	qsort(o, n, sizeof(*o), write_order);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_object(), *shape = json_array();
		uint64_t b = st_bytes(o[i]);

		if (!e || !shape) {
			json_decref(e);
			json_decref(shape);
			goto out;
		}
		for (uint32_t d = 0; d < o[i]->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)o[i]->shape[d]));
		json_object_set_new(e, "dtype", json_string(wex_dtype_name(o[i]->dtype)));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets",
				    json_pack("[II]", (json_int_t)at, (json_int_t)(at + b)));
		if (json_object_get(root, o[i]->name)) {
			json_decref(e);
			seterr(err, errlen, "duplicate tensor name %s", o[i]->name);
			*ret = -EINVAL;
			goto out;
		}
		json_object_set_new(root, o[i]->name, e);
		o[i]->begin = at;
		o[i]->end = at + b;
		at += b;
	}
	json_object_set_new(root, "__metadata__", json_pack("{ss}", "format", "pt"));
	hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	*data_size = at;
out:
	free(o);
	json_decref(root);
	return hdr;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

int wex__st_create(const char *path, struct wex_st_tensor *t, size_t n, struct wex_st_out *out,
		   char *err, size_t errlen)
{
	uint64_t data_size = 0;
	char *hdr;
	int ret;

	memset(out, 0, sizeof(*out));
	out->fd = -1;
	out->map = MAP_FAILED;
	hdr = st_header(t, n, &data_size, &ret, err, errlen);
	if (!hdr) {
		if (ret == -ENOMEM)
			seterr(err, errlen, "out of memory");
		return ret;
	}
	size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
	unsigned char len8[8];

	for (int i = 0; i < 8; i++)
		len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
	out->data_off = 8 + padded;
	out->size = out->data_off + data_size;
	/* Written beside and renamed over the target: an input mapped from
	 * the same path (converting in place) keeps its old bytes. */
	if (snprintf(out->path, sizeof(out->path), "%s", path) >= (int)sizeof(out->path) ||
	    snprintf(out->tmp, sizeof(out->tmp), "%s.tmp.%d", path, (int)getpid()) >=
		    (int)sizeof(out->tmp)) {
		free(hdr);
		out->tmp[0] = '\0';
		seterr(err, errlen, "%s: path too long", path);
		return -ENAMETOOLONG;
	}
	out->fd = open(out->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out->fd < 0) {
		ret = -errno;
		seterr(err, errlen, "%s: %s", out->tmp, strerror(errno));
		out->tmp[0] = '\0';
		free(hdr);
		return ret;
	}
	ret = write_all(out->fd, len8, 8);
	if (ret == 0)
		ret = write_all(out->fd, hdr, hl);
	for (size_t i = hl; ret == 0 && i < padded; i++)
		ret = write_all(out->fd, " ", 1);
	free(hdr);
	/* The data's blocks are claimed now: a full disk or the file size
	 * limit is an error here, never a SIGBUS when a mapped page is
	 * first written.  The file reads as zeros until written. */
	if (ret == 0 && data_size)
		ret = -posix_fallocate(out->fd, 0, (off_t)out->size);
	if (ret < 0) {
		seterr(err, errlen, "%s: write failed: %s", out->tmp, strerror(-ret));
		wex__st_abort(out);
		return ret;
	}
	if (data_size) {
		out->map = mmap(NULL, out->size, PROT_READ | PROT_WRITE, MAP_SHARED, out->fd, 0);
		if (out->map == MAP_FAILED) {
			ret = -errno;
			seterr(err, errlen, "%s: mmap: %s", out->tmp, strerror(errno));
			wex__st_abort(out);
			return ret;
		}
	}
	for (size_t i = 0; i < n; i++)
		t[i].data = data_size ? (char *)out->map + out->data_off + t[i].begin : NULL;
	return 0;
}

int wex__st_finish(struct wex_st_out *out, char *err, size_t errlen)
{
	int ret = 0;

	/* On the disk before the rename publishes it: after a crash the name
	 * holds the old file or the whole new one, never an empty one.  The
	 * first failure's errno is kept ("No space left on device"). */
	if (out->map != MAP_FAILED && msync(out->map, out->size, MS_SYNC) < 0)
		ret = -errno;
	if (ret == 0 && fsync(out->fd) < 0)
		ret = -errno;
	if (ret == 0 && close(out->fd) < 0)
		ret = -errno;
	else if (ret < 0)
		close(out->fd);
	out->fd = -1;
	if (ret < 0) {
		seterr(err, errlen, "%s: write failed: %s", out->tmp, strerror(-ret));
		wex__st_abort(out);
		return ret;
	}
	if (rename(out->tmp, out->path) < 0) {
		ret = -errno;
		seterr(err, errlen, "rename %s to %s: %s", out->tmp, out->path, strerror(errno));
		wex__st_abort(out);
		return ret;
	}
	out->tmp[0] = '\0';
	wex__st_abort(out);
	return 0;
}

void wex__st_abort(struct wex_st_out *out)
{
	if (out->map != MAP_FAILED && out->map)
		munmap(out->map, out->size);
	out->map = MAP_FAILED;
	if (out->fd >= 0)
		close(out->fd);
	out->fd = -1;
	if (out->tmp[0])
		unlink(out->tmp);
	out->tmp[0] = '\0';
}

int wex__st_write(const char *path, const struct wex_st_tensor *t, size_t n, char *err,
		  size_t errlen)
{
	struct wex_st_tensor *c = calloc(n + 1, sizeof(*c));
	struct wex_st_out out;
	int ret;

	if (!c) {
		seterr(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memcpy(c, t, n * sizeof(*c));
	ret = wex__st_create(path, c, n, &out, err, errlen);
	if (ret == 0) {
		for (size_t i = 0; i < n; i++)
			if (c[i].end > c[i].begin)
				memcpy((void *)(uintptr_t)c[i].data, t[i].data, c[i].end - c[i].begin);
		ret = wex__st_finish(&out, err, errlen);
	}
	free(c);
	return ret;
}
