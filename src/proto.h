/* SPDX-License-Identifier: MIT */
/*
 * proto.h - the control protocol (DESIGN section 7).
 *
 * Every message is one JSON object.  Requests: {"v":1,"op":"...",...}.
 * Replies: {"ok":true,...} or {"ok":false,"error":{"code":"EBUSY",
 * "message":"..."}}.  Tables (tensors, plans) travel as sealed memfds in
 * the binary formats below, attached to a small message.
 *
 * Requests (role that may send them):
 *   hello            any       role, model, group, rank, world, name
 *   register_segment producer  kind, size, device, handle, handle_offset, alloc_size (+1 fd: host, cuda_vmm)
 *   register_tensors producer  (+1 fd: sealed tensor table)
 *   begin_write      producer  version, timeout_ms          (deferred reply)
 *   publish          producer  version
 *   attach           consumer  device (+0 or 1 fd: sealed tensor table of its own layout)
 *   acquire          consumer  min_version, timeout_ms, mode (deferred reply)
 *   fetch            consumer  start  -> segments + fds, tables, plan
 *   release          consumer  version
 *   cancel           any       (while a deferred reply is awaited: it comes
 *                              now, -ECANCELED; otherwise ignored, no reply;
 *                              hello's reply says "cancel": true)
 *   status, models, clients, plans        any
 */
#ifndef WEX_PROTO_H
#define WEX_PROTO_H

#include <jansson.h>
#include <stdint.h>

#include "wex.h"
#include "plan.h"

#define WEX_MSG_MAX_DEFAULT 65536
/* 1 if s holds no control character (bytes below 0x20, 0x7f, and the C1
 * controls U+0080..U+009F in UTF-8). */
int wex__name_printable(const char *s);

/* Producer ranks of one model at most (hello's world). */
#define WEX_WORLD_MAX 65536
#define WEX_TABLE_MAX (1ull << 32) /* largest table memfd accepted */
/* Largest reply accepted in a memfd ({"ok":true,"reply_in_fd":true} with
 * one fd: a reply too large for one message). */
#define WEX_REPLY_MAX (1ull << 30)

/* "EBUSY" for -EBUSY, "WEX_ELAYOUT" for -WEX_ELAYOUT; "EUNKNOWN" otherwise. */
const char *wex__errname(int err);
/* Inverse; returns a negative code (-WEX_EREMOTE when unknown). */
int wex__errcode(const char *name);

/* Replaces, in place, each byte of s that does not begin a valid UTF-8
 * sequence with '?' (as jansson validates: no overlong forms, surrogates or
 * code points past U+10FFFF), so that text cut at a byte limit or copied
 * from a client's binary data can go into a JSON string. */
void wex__utf8_scrub(char *s);
/* s made one line of printable UTF-8 in place, for status and the log:
 * what is not UTF-8 (wex__utf8_scrub) and each control character that
 * wex__name_printable refuses become '?' (a C1 control: "??"). */
void wex__text_scrub(char *s);

/* {"ok":false,"error":{"code":...,"message":...}} (new reference); the
 * message is scrubbed to valid UTF-8. */
json_t *wex__reply_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* {"ok":true} (new reference). */
json_t *wex__reply_ok(void);

/* Serialises compactly; returns malloc'd text or NULL. */
char *wex__json_dump(const json_t *j, size_t *len);

/* Binary tensor table: header then `count` fixed-size entries. */
#define WEX_TABLE_MAGIC 0x54584557u /* "WEXT" */
#define WEX_PLAN_MAGIC 0x50584557u  /* "WEXP" */
#define WEX_TABLE_VERSION 1

struct wex_table_hdr {
	uint32_t magic;
	uint32_t version;
	uint64_t count;
	uint64_t entry_size;
	uint64_t reserved;
};

struct wex_wire_tensor {
	char name[WEX_NAME_MAX];
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[WEX_MAX_DIMS];
	uint64_t start[WEX_MAX_DIMS];
	uint64_t extent[WEX_MAX_DIMS];
	int64_t strides[WEX_MAX_DIMS];
	uint32_t segment;
	uint32_t rank; /* producer rank, in tables the daemon sends */
	uint64_t offset;
};

/* Packs tensors into a sealed memfd (ptr is not sent).  `ranks` may be NULL
 * (rank 0).  Returns the fd or -errno. */
int wex__table_pack(const struct wex_tensor *t, const uint32_t *ranks, size_t n);

/* Maps and validates a tensor table fd (not taken); on success *out is a
 * malloc'd array of n tensors, *ranks (if not NULL) a malloc'd rank array.
 * Validation: magic, sizes, names NUL-terminated and non-empty, dtype, ndim,
 * box within shape, no overflow.  err receives a message naming the entry. */
int wex__table_unpack(int fd, struct wex_tensor **out, uint32_t **ranks, size_t *n, char *err,
		      size_t errlen);

/* Checks one tensor's description (as above). */
int wex__tensor_check(const struct wex_tensor *t, char *err, size_t errlen);

/* Bytes from the tensor's first byte to one past its last (with strides). */
int wex__tensor_span(const struct wex_tensor *t, uint64_t *span);

/* Elements checked one by one below this many (adapters/python/wex's
 * _OVERLAP_EXACT too). */
#define WEX_OVERLAP_EXACT (1 << 20)

/* 0 when no two elements of t (its box, as wex__tensor_check accepted it)
 * share an address: at once when its dims of extent > 1, by stride, are
 * nested (each stride at least the one below times its extent); otherwise
 * every element's offset is compared, up to WEX_OVERLAP_EXACT elements,
 * and more are refused (they may overlap).  -EINVAL naming the tensor in
 * err, as the Python glue words it (_table_strides); -ENOMEM. */
int wex__tensor_overlaps(const struct wex_tensor *t, char *err, size_t errlen);

/* Packs/unpacks a plan's ops (same sealing and validation). */
int wex__plan_pack(const struct wex_plan *p);
int wex__plan_unpack(int fd, struct wex_plan_op **ops, size_t *n, char *err, size_t errlen);

/* The socket clients use: $WEX_SOCKET; else, for a user other than root
 * with $XDG_RUNTIME_DIR set, $XDG_RUNTIME_DIR/wex/wexd.sock, or
 * /run/wex/wexd.sock when the user's does not exist and the system's does
 * or cannot be reached (EACCES: wex__socket_pick); else /run/wex/wexd.sock.
 * wexd itself listens on the user's path (wex__config_default_socket): no
 * fallback there. */
const char *wex__default_socket(char *buf, size_t len);
const char *wex__socket_pick(const char *user, const char *system);

/* Monotonic time. */
uint64_t wex__now_ns(void);

/* Weaker paths a consumer's sync ran on, named in its sync report
 * ("fallbacks": [names]), counted and shown by wexd: host memory copied
 * onto a GPU from pageable memory (WEX_HOST_PIN=try or 0), a trainer's GPU
 * memory mapped read-write (the driver refused read-only), verification
 * through gather buffers that could not be page-locked. */
enum {
	WEX_FB_PAGEABLE_STAGING = 1u << 0,
	WEX_FB_RW_MAPPING = 1u << 1,
	WEX_FB_UNPINNED_VERIFY = 1u << 2,
	WEX_FB_COUNT = 3
};

/* The name of fallback bit i (0 <= i < WEX_FB_COUNT). */
const char *wex__fallback_name(int i);

/* The bits named in a JSON array of strings; unknown names and non-strings
 * are left out (clients cannot add series to wexd's metrics). */
unsigned wex__fallbacks_parse(const json_t *names);

/* A new JSON array of the names of the bits set (NULL: out of memory). */
json_t *wex__fallbacks_json(unsigned bits);

#endif
