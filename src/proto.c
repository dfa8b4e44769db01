/* SPDX-License-Identifier: MIT */
/* proto.c - error names, reply helpers, binary tables. */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "proto.h"
#include "plan.h"

static const struct {
	int code;
	const char *name;
} errnames[] = {
	{ EPERM, "EPERM" },       { ENOENT, "ENOENT" },     { EINTR, "EINTR" },
	{ EIO, "EIO" },           { EBADF, "EBADF" },       { EAGAIN, "EAGAIN" },
	{ ENOMEM, "ENOMEM" },     { EACCES, "EACCES" },     { EFAULT, "EFAULT" },
	{ EBUSY, "EBUSY" },       { EEXIST, "EEXIST" },     { ENODEV, "ENODEV" },
	{ EINVAL, "EINVAL" },     { ENOSPC, "ENOSPC" },     { ERANGE, "ERANGE" },
	{ ENOSYS, "ENOSYS" },     { EMSGSIZE, "EMSGSIZE" }, { EPROTO, "EPROTO" },
	{ EOPNOTSUPP, "EOPNOTSUPP" }, { EADDRINUSE, "EADDRINUSE" },
	{ ECONNRESET, "ECONNRESET" }, { ETIMEDOUT, "ETIMEDOUT" },
	{ ECANCELED, "ECANCELED" },   { ESHUTDOWN, "ESHUTDOWN" }, { ESTALE, "ESTALE" },
	{ EOVERFLOW, "EOVERFLOW" },   { EBADMSG, "EBADMSG" },     { EMFILE, "EMFILE" },
	{ ENFILE, "ENFILE" },         { EFBIG, "EFBIG" },         { EDQUOT, "EDQUOT" },
	{ EROFS, "EROFS" },           { ENAMETOOLONG, "ENAMETOOLONG" },
	{ WEX_EPROTO_VERSION, "WEX_EPROTO_VERSION" }, { WEX_ENOCUDA, "WEX_ENOCUDA" },
	{ WEX_ELAYOUT, "WEX_ELAYOUT" },   { WEX_EDIRTY, "WEX_EDIRTY" },
	{ WEX_ENOPUBLISHED, "WEX_ENOPUBLISHED" }, { WEX_EDAEMON, "WEX_EDAEMON" },
	{ WEX_ENOMODEL, "WEX_ENOMODEL" }, { WEX_EVERIFY, "WEX_EVERIFY" },
};

const char *wex__errname(int err)
{
	if (err < 0)
		err = -err;
	for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
		if (errnames[i].code == err)
			return errnames[i].name;
	return "EUNKNOWN";
}

static const char *const fallback_names[WEX_FB_COUNT] = {
	"pageable_staging",
	"rw_mapping",
	"unpinned_verify",
};

const char *wex__fallback_name(int i)
{
	return i >= 0 && i < WEX_FB_COUNT ? fallback_names[i] : "unknown";
}

unsigned wex__fallbacks_parse(const json_t *names)
{
	unsigned bits = 0;
	size_t k;
	json_t *v;

	if (!json_is_array(names))
		return 0;
	json_array_foreach(names, k, v) {
		const char *s = json_string_value(v);

		for (int i = 0; s && i < WEX_FB_COUNT; i++)
			if (!strcmp(s, fallback_names[i]))
				bits |= 1u << i;
	}
	return bits;
}

json_t *wex__fallbacks_json(unsigned bits)
{
	json_t *a = json_array();

	for (int i = 0; a && i < WEX_FB_COUNT; i++)
		if ((bits & (1u << i)) && json_array_append_new(a, json_string(fallback_names[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

int wex__errcode(const char *name)
{
	for (size_t i = 0; name && i < sizeof(errnames) / sizeof(errnames[0]); i++)
		if (!strcmp(errnames[i].name, name))
			return -errnames[i].code;
	return -WEX_EREMOTE;
}

void wex__utf8_scrub(char *s)
{
	unsigned char *p = (unsigned char *)s;

	while (*p) {
		unsigned c = *p, n, i, cp;

		if (c < 0x80) {
			p++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			n = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 3, cp = c & 0x07;
		else
			n = 0, cp = 0;
		/* A NUL ends the loop here too: it is not a continuation. */
		for (i = 1; n && i <= n && (p[i] & 0xc0) == 0x80; i++)
			cp = (cp << 6) | (p[i] & 0x3f);
		if (!n || i <= n || (n == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
		    (n == 3 && (cp < 0x10000 || cp > 0x10ffff))) {
			*p++ = '?';
			continue;
		}
		/* Noncharacters (U+FDD0..U+FDEF, U+xFFFE, U+xFFFF): valid UTF-8,
		 * but refused by some readers (systemd drops a STATUS= line
		 * holding one): each of their bytes a '?', the length kept. */
		if ((cp >= 0xfdd0 && cp <= 0xfdef) || (cp & 0xfffe) == 0xfffe) {
			memset(p, '?', n + 1);
			p += n + 1;
			continue;
		}
		p += n + 1;
	}
}

json_t *wex__reply_error(int err, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* The message may quote a client's bytes (a tensor name from a
	 * table) or be cut inside a character; jansson refuses invalid UTF-8,
	 * and the client would wait for a reply that never came. */
	wex__utf8_scrub(msg);
	return json_pack("{s:b, s:{s:s, s:s}}", "ok", 0, "error", "code", wex__errname(err),
			 "message", msg);
}

json_t *wex__reply_ok(void)
{
	return json_pack("{s:b}", "ok", 1);
}

char *wex__json_dump(const json_t *j, size_t *len)
{
	char *s = json_dumps(j, JSON_COMPACT);

	if (s && len)
		*len = strlen(s);
	return s;
}

uint64_t wex__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *wex__socket_pick(const char *user, const char *system)
{
	/* The user's own wexd first; where it has none (its socket does not
	 * exist) but the system's wexd listens, that one.  Also where the
	 * system's is out of this user's reach (/run/wex is root:wex 0750
	 * under systemd): connecting there says EACCES, which points at the
	 * missing group membership, where the user's path said ENOENT. */
	if (access(user, F_OK) != 0 && errno == ENOENT &&
	    (access(system, F_OK) == 0 || errno == EACCES))
		return system;
	return user;
}

const char *wex__default_socket(char *buf, size_t len)
{
	const char *s = getenv("WEX_SOCKET");

	if (s && *s) {
		snprintf(buf, len, "%s", s);
		return buf;
	}
	s = getenv("XDG_RUNTIME_DIR");
	if (s && s[0] == '/' && geteuid() != 0) {
		/* As long as the callers' buffers: a longer $XDG_RUNTIME_DIR
		 * was cut here, and the length check after it (a socket's
		 * path is 107 bytes at most) named the cut path. */
		char user[PATH_MAX + 64];

		snprintf(user, sizeof(user), "%s/wex/wexd.sock", s);
		snprintf(buf, len, "%s", wex__socket_pick(user, "/run/wex/wexd.sock"));
		return buf;
	}
	snprintf(buf, len, "/run/wex/wexd.sock");
	return buf;
}

/* ---------------------------------------------------------------------- */

static int mul_ok(uint64_t a, uint64_t b, uint64_t *r)
{
	return !__builtin_mul_overflow(a, b, r);
}

/* Bytes of the control character at s: 1 for one below 0x20 and 0x7f,
 * 2 for U+0080..U+009F, the C1 controls, in UTF-8 (terminals take U+009B
 * for CSI as they take ESC [); 0 for none. */
static size_t control_len(const char *s)
{
	unsigned char c = (unsigned char)s[0], n = (unsigned char)s[1];

	if (c < 0x20 || c == 0x7f)
		return 1;
	return c == 0xc2 && n >= 0x80 && n <= 0x9f ? 2 : 0;
}

int wex__name_printable(const char *s)
{
	for (; *s; s++)
		if (control_len(s))
			return 0;
	return 1;
}

void wex__text_scrub(char *s)
{
	wex__utf8_scrub(s);
	for (size_t n; *s; s++)
		if ((n = control_len(s)) > 0) {
			memset(s, '?', n);
			s += n - 1;
		}
}

int wex__tensor_span(const struct wex_tensor *t, uint64_t *span)
{
	uint64_t es = wex_dtype_size(t->dtype), last = 0, n = 1;
	int contiguous = 1;

	for (uint32_t i = 0; i < t->ndim; i++)
		if (t->strides[i])
			contiguous = 0;
	for (uint32_t i = 0; i < t->ndim; i++) {
		if (t->extent[i] == 0) {
			*span = 0;
			return 0;
		}
		if (!mul_ok(n, t->extent[i], &n))
			return -EOVERFLOW;
	}
	if (contiguous) {
		if (!mul_ok(n, es, span))
			return -EOVERFLOW;
		return 0;
	}
	/* Highest element offset reached, plus one element. */
	for (uint32_t i = 0; i < t->ndim; i++) {
		uint64_t d;

		if (t->strides[i] < 0)
			return -EINVAL;
		if (!mul_ok(t->extent[i] - 1, (uint64_t)t->strides[i], &d) ||
		    __builtin_add_overflow(last, d, &last))
			return -EOVERFLOW;
	}
	/* (Elements reaching 2^64 - 1: one more would wrap the span to 0
	 * bytes, which every segment holds.) */
	if (__builtin_add_overflow(last, 1, &last) || !mul_ok(last, es, span))
		return -EOVERFLOW;
	return 0;
}

int wex__tensor_check(const struct wex_tensor *t, char *err, size_t errlen)
{
	size_t nl = strnlen(t->name, WEX_NAME_MAX);
	uint64_t span;
	int ret;

	if (nl == 0 || nl == WEX_NAME_MAX) {
		snprintf(err, errlen, "tensor name empty or not NUL-terminated within %d bytes",
			 WEX_NAME_MAX);
		return -EINVAL;
	}
	if (!wex_dtype_size(t->dtype)) {
		snprintf(err, errlen, "tensor '%s': invalid dtype %d", t->name, t->dtype);
		return -EINVAL;
	}
	if (t->ndim > WEX_MAX_DIMS) {
		snprintf(err, errlen, "tensor '%s': ndim %u exceeds %d", t->name, t->ndim,
			 WEX_MAX_DIMS);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < t->ndim; i++) {
		uint64_t end;

		if (__builtin_add_overflow(t->start[i], t->extent[i], &end) || end > t->shape[i]) {
			snprintf(err, errlen,
				 "tensor '%s': box [%llu, +%llu) exceeds shape %llu in dim %u",
				 t->name, (unsigned long long)t->start[i],
				 (unsigned long long)t->extent[i], (unsigned long long)t->shape[i],
				 i);
			return -EINVAL;
		}
	}
	ret = wex__tensor_span(t, &span);
	if (ret == -EINVAL) {
		snprintf(err, errlen, "tensor '%s': a negative stride (strides are elements, 0 or more)",
			 t->name);
		return ret;
	}
	/* Past 2^63 bytes (no memory is that large) a stride in bytes does
	 * not fit the planner's signed arithmetic: a consumer's layout with
	 * one made wexd's plan overflow int64. */
	if (ret < 0 || span > (uint64_t)INT64_MAX) {
		snprintf(err, errlen, "tensor '%s': its bytes overflow 63 bits", t->name);
		return -EOVERFLOW;
	}
	return 0;
}

static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* "(a, b)" as Python writes a tuple ("(a,)" for one). */
static void tuple_str(char *buf, size_t len, const void *v, int is_signed, uint32_t n)
{
	size_t at = 1;

	buf[0] = '(';
	buf[1] = '\0';
	for (uint32_t i = 0; i < n && at < len; i++) {
		long long x = is_signed ? (long long)((const int64_t *)v)[i] :
					  (long long)((const uint64_t *)v)[i];

		at += (size_t)snprintf(buf + at, len - at, is_signed ? "%s%lld" : "%s%llu",
				       i ? ", " : "", x);
	}
	if (at < len)
		snprintf(buf + at, len - at, n == 1 ? ",)" : ")");
}

int wex__tensor_overlaps(const struct wex_tensor *t, char *err, size_t errlen)
{
	uint64_t need = 1, n = 1, *off = NULL, cnt;
	uint32_t dims[WEX_MAX_DIMS], nd = 0, ndim = t->ndim < WEX_MAX_DIMS ? t->ndim : WEX_MAX_DIMS;
	int zero = 1, nested = 1, over;
	char st[WEX_MAX_DIMS * 22 + 4], sh[WEX_MAX_DIMS * 22 + 4];

	for (uint32_t i = 0; i < ndim; i++) {
		if (t->strides[i])
			zero = 0;
		if (t->extent[i] == 0)
			return 0; /* no elements */
		if (__builtin_mul_overflow(n, t->extent[i], &n))
			n = UINT64_MAX;
	}
	if (zero)
		return 0; /* C-contiguous */
	/* Dims of extent > 1 by stride (insertion sort: at most 8). */
	for (uint32_t i = 0; i < ndim; i++) {
		uint32_t j = nd++;

		if (t->extent[i] <= 1) {
			nd--;
			continue;
		}
		for (; j > 0 && (uint64_t)t->strides[dims[j - 1]] > (uint64_t)t->strides[i]; j--)
			dims[j] = dims[j - 1];
		dims[j] = i;
	}
	for (uint32_t k = 0; k < nd && nested; k++) {
		uint64_t s = (uint64_t)t->strides[dims[k]];

		if (t->strides[dims[k]] < 0 || s < need ||
		    __builtin_mul_overflow(s, t->extent[dims[k]], &need))
			nested = 0;
	}
	if (nested)
		return 0;
	if (n > WEX_OVERLAP_EXACT) {
		over = 2;
	} else {
		/* Every element's offset, sorted: a repeat is an overlap. */
		off = malloc((size_t)n * sizeof(*off));
		if (!off) {
			snprintf(err, errlen, "tensor '%s': out of memory checking its strides",
				 t->name);
			return -ENOMEM;
		}
		off[0] = 0;
		cnt = 1;
		for (uint32_t k = 0; k < nd; k++) {
			uint32_t d = dims[k];

			for (uint64_t e = 1; e < t->extent[d]; e++)
				for (uint64_t i = 0; i < cnt; i++)
					off[e * cnt + i] = off[i] + e * (uint64_t)t->strides[d];
			cnt *= t->extent[d];
		}
		qsort(off, (size_t)n, sizeof(*off), u64_cmp);
		over = 0;
		for (uint64_t i = 1; i < n && !over; i++)
			over = off[i] == off[i - 1];
		free(off);
		if (!over)
			return 0;
	}
	tuple_str(st, sizeof(st), t->strides, 1, ndim);
	tuple_str(sh, sizeof(sh), t->extent, 0, ndim);
	if (over == 1)
		snprintf(err, errlen, "tensor '%s' has overlapping elements (strides %s for shape %s)",
			 t->name, st, sh);
	else
		snprintf(err, errlen,
			 "tensor '%s' has strides that are not nested and more than %d elements: its elements may overlap (strides %s for shape %s)",
			 t->name, WEX_OVERLAP_EXACT, st, sh);
	return -EINVAL;
}

int wex__table_pack(const struct wex_tensor *t, const uint32_t *ranks, size_t n)
{
	size_t len = sizeof(struct wex_table_hdr) + n * sizeof(struct wex_wire_tensor);
	struct wex_table_hdr *h;
	struct wex_wire_tensor *w;
	int fd;

	h = calloc(1, len);
	if (!h)
		return -ENOMEM;
	h->magic = WEX_TABLE_MAGIC;
	h->version = WEX_TABLE_VERSION;
	h->count = n;
	h->entry_size = sizeof(struct wex_wire_tensor);
	w = (struct wex_wire_tensor *)(h + 1);
	for (size_t i = 0; i < n; i++) {
		/* Millions of pieces take seconds (wexd's watchdog). */
		if (!(i & 0x3fff))
			wex__plan_tick();
		memcpy(w[i].name, t[i].name, WEX_NAME_MAX);
		w[i].name[WEX_NAME_MAX - 1] = '\0';
		w[i].dtype = t[i].dtype;
		w[i].ndim = t[i].ndim;
		memcpy(w[i].shape, t[i].shape, sizeof(w[i].shape));
		memcpy(w[i].start, t[i].start, sizeof(w[i].start));
		memcpy(w[i].extent, t[i].extent, sizeof(w[i].extent));
		memcpy(w[i].strides, t[i].strides, sizeof(w[i].strides));
		w[i].segment = t[i].segment;
		w[i].rank = ranks ? ranks[i] : 0;
		w[i].offset = t[i].offset;
	}
	fd = wex_table_seal_step(h, len, "wex-tensors", wex__plan_tick);
	free(h);
	return fd;
}

int wex__table_unpack(int fd, struct wex_tensor **out, uint32_t **ranks, size_t *n, char *err,
		      size_t errlen)
{
	const struct wex_table_hdr *h;
	const struct wex_wire_tensor *w;
	struct wex_tensor *t = NULL;
	uint32_t *r = NULL;
	const void *data;
	size_t len;
	int ret;

	ret = wex_table_map(fd, WEX_TABLE_MAX, &data, &len);
	if (ret < 0) {
		snprintf(err, errlen, "tensor table: %s",
			 ret == -EPERM ? "memfd is not sealed" : strerror(-ret));
		return ret;
	}
	h = data;
	if (len < sizeof(*h) || h->magic != WEX_TABLE_MAGIC || h->version != WEX_TABLE_VERSION ||
	    h->entry_size != sizeof(struct wex_wire_tensor) ||
	    h->count > (len - sizeof(*h)) / sizeof(struct wex_wire_tensor) ||
	    len != sizeof(*h) + h->count * sizeof(struct wex_wire_tensor)) {
		snprintf(err, errlen, "tensor table: bad header or size (%zu bytes)", len);
		ret = -EINVAL;
		goto out;
	}
	w = (const struct wex_wire_tensor *)(h + 1);
	t = calloc(h->count ? h->count : 1, sizeof(*t));
	r = calloc(h->count ? h->count : 1, sizeof(*r));
	if (!t || !r) {
		ret = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < h->count; i++) {
		/* A table of millions of pieces takes seconds in wexd's loop
		 * (its watchdog; wex__plan_tick_set): 4K pieces, a few ms. */
		if (!(i & 0xfff))
			wex__plan_tick();
		if (strnlen(w[i].name, WEX_NAME_MAX) == WEX_NAME_MAX) {
			snprintf(err, errlen, "tensor table entry %zu: name not NUL-terminated", i);
			ret = -EINVAL;
			goto out;
		}
		memcpy(t[i].name, w[i].name, WEX_NAME_MAX);
		t[i].dtype = w[i].dtype;
		t[i].ndim = w[i].ndim;
		memcpy(t[i].shape, w[i].shape, sizeof(t[i].shape));
		memcpy(t[i].start, w[i].start, sizeof(t[i].start));
		memcpy(t[i].extent, w[i].extent, sizeof(t[i].extent));
		memcpy(t[i].strides, w[i].strides, sizeof(t[i].strides));
		t[i].segment = w[i].segment;
		t[i].offset = w[i].offset;
		r[i] = w[i].rank;
		ret = wex__tensor_check(&t[i], err, errlen);
		if (ret < 0)
			goto out;
	}
	*n = h->count;
	*out = t;
	t = NULL;
	if (ranks) {
		*ranks = r;
		r = NULL;
	}
	ret = 0;
out:
	free(t);
	free(r);
	wex_table_unmap(data, len);
	return ret;
}

int wex__plan_pack(const struct wex_plan *p)
{
	size_t len = sizeof(struct wex_table_hdr) + p->nops * sizeof(struct wex_plan_op);
	struct wex_table_hdr *h = calloc(1, len);
	int fd;

	if (!h)
		return -ENOMEM;
	h->magic = WEX_PLAN_MAGIC;
	h->version = WEX_TABLE_VERSION;
	h->count = p->nops;
	h->entry_size = sizeof(struct wex_plan_op);
	h->reserved = p->hash;
	/* In steps, ticking between them: millions of ops are hundreds of
	 * MB, faulted in twice (here and in the memfd), seconds in wexd's loop
	 * (its watchdog). */
	for (size_t at = 0, step = ((size_t)8 << 20) / sizeof(struct wex_plan_op); at < p->nops;
	     at += step) {
		memcpy((struct wex_plan_op *)(h + 1) + at, p->ops + at,
		       (p->nops - at < step ? p->nops - at : step) * sizeof(struct wex_plan_op));
		wex__plan_tick();
	}
	fd = wex_table_seal_step(h, len, "wex-plan", wex__plan_tick);
	free(h);
	return fd;
}

int wex__plan_unpack(int fd, struct wex_plan_op **ops, size_t *n, char *err, size_t errlen)
{
	const struct wex_table_hdr *h;
	const void *data;
	size_t len;
	int ret;

	ret = wex_table_map(fd, WEX_TABLE_MAX, &data, &len);
	if (ret < 0) {
		snprintf(err, errlen, "plan table: %s", strerror(-ret));
		return ret;
	}
	h = data;
	/* count first, as for a tensor table: count * entry size may wrap to
	 * the length (2^61 ops of 112 bytes read as 0 bytes). */
	if (len < sizeof(*h) || h->magic != WEX_PLAN_MAGIC || h->version != WEX_TABLE_VERSION ||
	    h->entry_size != sizeof(struct wex_plan_op) ||
	    h->count > (len - sizeof(*h)) / sizeof(struct wex_plan_op) ||
	    len != sizeof(*h) + h->count * sizeof(struct wex_plan_op)) {
		snprintf(err, errlen, "plan table: bad header or size");
		ret = -EINVAL;
		goto out;
	}
	*ops = malloc(h->count ? h->count * sizeof(struct wex_plan_op) : 1);
	if (!*ops) {
		ret = -ENOMEM;
		goto out;
	}
	if (h->count)
		memcpy(*ops, h + 1, h->count * sizeof(struct wex_plan_op));
	*n = h->count;
	ret = 0;
out:
	wex_table_unmap(data, len);
	return ret;
}
