/* SPDX-License-Identifier: MIT */
/*
 * api_contract - the public C API does what wex.h says for calls made
 * wrong: NULL pointers (-EINVAL, never a crash), calls of the wrong role
 * (-EPERM, not "sync first"), calls in the wrong order, sizes of 0 and
 * past the address space, and wex_last_error naming the cause of each.
 *
 * Found by reading wex.h against the code: wex_tensor_nbytes(NULL)
 * crashed; wex_strerror(INT_MIN) negated INT_MIN (undefined: the
 * sanitizer build aborts); a producer's wex_view and wex_producer_tensors
 * answered -ENOENT "sync first" (a producer cannot sync); a begin_write
 * of another version while this very rank wrote one blamed "other ranks";
 * a negative stride was -EOVERFLOW "size overflows or negative stride"
 * (wex.h: -EINVAL), and a nameless tensor's error did not say which of
 * the table it was; wex_segment_register_fd said only "Invalid argument"
 * for fd -1, a size of 0 and a file shorter than the size; and
 * wex_segment_register_ptr took a range past the end of the address
 * space to the backend (whose sum wrapped: an unwritten chunk exported).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixture.h"

/* ret == want, and the client's (or the thread's) last error names has. */
#define EXPECT(c, call, want, has)                                                         \
	do {                                                                               \
		int r_ = (call);                                                           \
		const char *e_ = wex_last_error(c);                                        \
		T_ASSERT(r_ == (want), "%s: %d (%s: %s), expected %d (%s)", #call, r_,      \
			 wex_strerror(r_), e_, (want), wex_strerror(want));                \
		T_ASSERT(strstr(e_, (has)), "%s: last error \"%s\" names no \"%s\"", #call, \
			 e_, (has));                                                       \
	} while (0)

static struct wex_tensor tensor(const char *name, void *ptr)
{
	struct wex_tensor t;

	memset(&t, 0, sizeof(t));
	snprintf(t.name, sizeof(t.name), "%s", name);
	t.dtype = WEX_DT_F32;
	t.ndim = 1;
	t.shape[0] = t.extent[0] = 4;
	t.ptr = ptr;
	return t;
}

static void strings(void)
{
	int odd[] = { 0, 1, -1, 4095, -WEX_ERRNO_END, WEX_ERRNO_END, -99999, INT_MAX, INT_MIN,
		      INT_MIN + 1 };

	for (int e = WEX_ERRNO_BASE; e < WEX_ERRNO_END; e++) {
		const char *s = wex_strerror(-e);

		T_ASSERT(s && *s && !strstr(s, "Unknown"), "wex_strerror(-%d): \"%s\"", e,
			 s ? s : "(null)");
		T_ASSERT(!strcmp(s, wex_strerror(e)), "wex_strerror(%d) differs from its negation", e);
	}
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++)
		T_ASSERT(wex_strerror(odd[i]) != NULL, "wex_strerror(%d) is NULL", odd[i]);
	T_ASSERT(wex_tensor_nbytes(NULL) == 0, "wex_tensor_nbytes(NULL)");
	T_ASSERT(wex_dtype_from_name(NULL) == WEX_DT_INVALID, "wex_dtype_from_name(NULL)");
	T_ASSERT(!wex_dtype_name(WEX_DT_COUNT) && !wex_dtype_size(-1), "dtype out of range");
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result res;
	struct wex_tensor t[2];
	const struct wex_tensor *pt;
	wex_client_t *adm;
	uint32_t id;
	size_t n;
	void *ptr;
	char *json = NULL;
	int fd;

	strings();
	t_tiny_v1(&d, &p, &k, "ac");
	adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 1);

	/* NULL clients and pointers: -EINVAL, no fault. */
	EXPECT(NULL, wex_client_open(NULL, NULL), -EINVAL, "may not be NULL");
	T_ASSERT(wex_sync(NULL, WEX_SYNC_COPY, 0, 0, &res) == -EINVAL, "wex_sync(NULL)");
	T_ASSERT(wex_cancel(NULL) == -EINVAL && wex_release(NULL) == -EINVAL &&
			 wex_is_dirty(NULL) == -EINVAL && wex_released(NULL, 1, NULL) == -EINVAL,
		 "NULL client or ptr");
	wex_client_close(NULL);
	wex_free(NULL);
	EXPECT(p.c, wex_segment_alloc(p.c, WEX_SEG_HOST, 0, 4096, NULL, &ptr), -EINVAL, "NULL");
	EXPECT(p.c, wex_register_tensors(p.c, NULL, 1), -EINVAL, "NULL");
	EXPECT(k.c, wex_sync(k.c, WEX_SYNC_COPY, 0, 100, NULL), -EINVAL, "NULL");
	EXPECT(k.c, wex_view(k.c, 0, NULL, &ptr, NULL), -EINVAL, "NULL");
	EXPECT(k.c, wex_producer_tensors(k.c, 0, NULL, &n), -EINVAL, "NULL");
	EXPECT(adm, wex_request(adm, "ping", NULL, NULL), -EINVAL, "NULL");
	EXPECT(adm, wex_request(adm, "ping", "[1]", &json), -EINVAL, "not a JSON object");

	/* The wrong role: a clear -EPERM.  A producer's view was -ENOENT
	 * "sync first", which a producer cannot do. */
	EXPECT(k.c, wex_begin_write(k.c, 9, 100), -EPERM, "only producers");
	EXPECT(k.c, wex_publish(k.c, 9), -EPERM, "only producers");
	EXPECT(k.c, wex_segment_alloc(k.c, WEX_SEG_HOST, 0, 4096, &id, &ptr), -EPERM,
	       "only producers");
	EXPECT(p.c, wex_sync(p.c, WEX_SYNC_REMAP_VIEW, 0, 100, &res), -EPERM, "only consumers");
	EXPECT(p.c, wex_reserve(p.c, 0, 0, 4096, &ptr), -EPERM, "only consumers");
	EXPECT(p.c, wex_release(p.c), -EPERM, "only consumers");
	EXPECT(p.c, wex_view(p.c, 0, p.t[0].name, &ptr, NULL), -EPERM, "only consumers");
	EXPECT(p.c, wex_producer_tensors(p.c, 0, &pt, &n), -EPERM, "only consumers");
	EXPECT(adm, wex_view(adm, 0, p.t[0].name, &ptr, NULL), -EPERM, "only consumers");
	EXPECT(adm, wex_attach(adm, NULL, 0), -EPERM, "only consumers");

	/* The wrong order. */
	EXPECT(p.c, wex_publish(p.c, 2), -EINVAL, "begin_write it first");
	EXPECT(k.c, wex_release(k.c), -ENOENT, "no lease held");
	T_WEX(p.c, wex_begin_write(p.c, 2, 1000));
	T_WEX(p.c, wex_begin_write(p.c, 2, 1000)); /* (again: the same write) */
	/* This rank itself writes v2: it was told "other ranks write v2". */
	EXPECT(p.c, wex_begin_write(p.c, 3, 1000), -EINVAL, "this rank writes v2");
	T_WEX(p.c, wex_publish(p.c, 2));
	EXPECT(p.c, wex_begin_write(p.c, 2, 1000), -EALREADY, "published already");
	EXPECT(p.c, wex_begin_write(p.c, 1, 1000), -EINVAL, "must exceed published v2");
	EXPECT(p.c, wex_begin_write(p.c, UINT64_MAX, 1000), -EINVAL, "2^63-1");
	EXPECT(k.c, wex_sync(k.c, WEX_SYNC_COPY, 3, 100, &res), -ETIMEDOUT, "no version >= 3");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 0, 1000, &res));
	T_ASSERT(res.version == 2 && res.changed == 1, "sync: v%llu changed %d",
		 (unsigned long long)res.version, res.changed);
	EXPECT(k.c, wex_sync(k.c, 0, 0, 100, &res), -EINVAL, "mode 0 unknown");
	EXPECT(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW | WEX_SYNC_VERIFY, 0, 100, &res), -EINVAL,
	       "view sync");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 0, 1000, &res));
	T_ASSERT(wex_producer_tensors(k.c, 0, &pt, &n) == 1 && n == (size_t)p.n, "tables");
	EXPECT(k.c, wex_view(k.c, UINT32_MAX, pt[0].name, &ptr, NULL), -ENOENT, "no producer rank");
	EXPECT(k.c, wex_request(k.c, "release", NULL, &json), -EINVAL, "holds a lease");
	/* wex_cancel runs beside the call it cancels: it leaves the last
	 * error as it is (wex.h). */
	T_ASSERT(wex_cancel(k.c) == 0 && strstr(wex_last_error(k.c), "holds a lease"),
		 "wex_cancel with no call running: \"%s\"", wex_last_error(k.c));
	T_WEX(k.c, wex_release(k.c));

	/* Bad tensors: -EINVAL naming which, -EOVERFLOW for bytes past
	 * 64 bits.  A negative stride was -EOVERFLOW. */
	t[0] = tensor("ok", k.region);
	t[1] = tensor("neg", (char *)k.region + 64);
	t[1].strides[0] = -1;
	EXPECT(k.c, wex_attach(k.c, t, 2), -EINVAL, "'neg': a negative stride");
	EXPECT(p.c, wex_register_tensors(p.c, t, 2), -EINVAL, "'neg': a negative stride");
	t[1] = tensor("", (char *)k.region + 64);
	EXPECT(k.c, wex_attach(k.c, t, 2), -EINVAL, "tensor 1 of the 2");
	EXPECT(p.c, wex_register_tensors(p.c, t, 2), -EINVAL, "tensor 1 of the 2");
	t[1] = tensor("huge", (char *)k.region + 64);
	t[1].ndim = 2;
	t[1].shape[0] = t[1].extent[0] = 1ull << 62;
	t[1].shape[1] = t[1].extent[1] = 4;
	EXPECT(p.c, wex_register_tensors(p.c, t, 2), -EOVERFLOW, "'huge'");
	t[1].ndim = WEX_MAX_DIMS + 1;
	EXPECT(k.c, wex_attach(k.c, t, 2), -EINVAL, "ndim 9");

	/* Segments: each refusal says why. */
	EXPECT(p.c, wex_segment_alloc(p.c, WEX_SEG_HOST, 0, 0, &id, &ptr), -EINVAL, "0 bytes");
	EXPECT(p.c, wex_segment_alloc(p.c, 99, 0, 4096, &id, &ptr), -EINVAL, "unknown kind");
	EXPECT(p.c, wex_segment_register_fd(p.c, -1, NULL, 4096, &id), -EINVAL,
	       "not a file descriptor");
	fd = memfd_create("short", MFD_CLOEXEC);
	T_ASSERT(fd >= 0 && ftruncate(fd, 4096) == 0, "memfd");
	ptr = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	T_ASSERT(ptr != MAP_FAILED, "mmap");
	EXPECT(p.c, wex_segment_register_fd(p.c, fd, ptr, 0, &id), -EINVAL, "size 0");
	EXPECT(p.c, wex_segment_register_fd(p.c, fd, ptr, 8192, &id), -EINVAL,
	       "holds only 4096");
	T_WEX(p.c, wex_segment_register_fd(p.c, fd, ptr, 4096, &id));
	/* Past the end of the address space: refused before any backend
	 * (the CUDA ones summed ptr + size, which wrapped). */
	EXPECT(p.c, wex_segment_register_ptr(p.c, WEX_SEG_CUDA_VMM, (void *)(UINTPTR_MAX - 4095),
					     1u << 20, &id),
	       -EINVAL, "past the end of the address space");
	EXPECT(p.c, wex_segment_register_ptr(p.c, WEX_SEG_CUDA_IPC, NULL, 4096, &id), -EINVAL,
	       "NULL address");
	EXPECT(k.c, wex_reserve(k.c, 0, 0, 0, &ptr), -EINVAL, "size 0");
	EXPECT(k.c, wex_reserve(k.c, 0, 99, 4096, &ptr), -EINVAL, "no segment 99");
	EXPECT(k.c, wex_reserve(k.c, 7, 0, 4096, &ptr), -EINVAL, "producer ranks 0..0");

	munmap(ptr, 4096);
	wex_client_close(adm);
	t_cons_close(&k);
	t_prod_close(&p);
	close(fd);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
