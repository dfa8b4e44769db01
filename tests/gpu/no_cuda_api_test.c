/* SPDX-License-Identifier: MIT */
/*
 * no_cuda_api_test.c - libwex and wexd built without the CUDA toolkit's
 * headers (issue 4, point 1).  Registered only in such a build;
 * tests/gpu/no_cuda_build.sh makes one from a build that has them.
 *  - the allocator entry points exist and fail: wex_cuda_alloc returns
 *    NULL, wex_cuda_malloc -WEX_ENOCUDA, wex_cuda_free ignores NULL;
 *  - wex_segment_alloc of WEX_SEG_CUDA_VMM, WEX_SEG_CUDA_IPC and
 *    WEX_SEG_HOST_PINNED, and wex_segment_register_ptr of the CUDA kinds,
 *    fail with -WEX_ENOCUDA saying the build has no CUDA backend; the
 *    client keeps working;
 *  - a consumer whose producer exports cuda_vmm memory (a raw producer:
 *    wexd needs no CUDA to pass the segment on) fails wex_reserve and
 *    wex_sync with -WEX_ENOCUDA naming the producer rank and the kind,
 *    holds no lease afterwards and keeps no fd that came with the
 *    segment;
 *  - the host backend serves copy and same-address syncs, every byte
 *    checked.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fixture.h"
#include "proto.h"

#define CUDA_MODEL "gpu-model"
#define HOST_MODEL "host-model"

static json_t *expect(int fd, const char *req, const int *fds, int nfds, const char *code)
{
	json_t *r = t_raw_rpc(fd, req, fds, nfds);

	if (strcmp(t_code(r), code))
		T_FAIL("%s: expected %s, got %s (%s)", req, code, t_code(r), t_msg(r));
	return r;
}

/* -WEX_ENOCUDA, and the client's last error contains `what`. */
static void expect_nocuda(wex_client_t *c, int ret, const char *call, const char *what)
{
	T_ASSERT(ret == -WEX_ENOCUDA, "%s: -WEX_ENOCUDA, got %s", call, wex_strerror(ret));
	T_ASSERT(strstr(wex_last_error(c), what), "%s: the error says '%s': %s", call, what,
		 wex_last_error(c));
	printf("%s: %s\n", call, wex_last_error(c));
}

/* A producer that exports one cuda_vmm segment, as a CUDA build of libwex
 * would, and publishes v1 of a one-tensor model.  Returns its socket. */
static int raw_gpu_producer(const char *sock)
{
	struct wex_tensor t;
	int fd = t_raw_connect(sock), mfd, tfd;

	json_decref(expect(fd,
			   "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"" CUDA_MODEL
			   "\",\"rank\":0,\"world\":1,\"name\":\"gpu-producer\"}",
			   NULL, 0, "OK"));
	mfd = memfd_create("t-vmm", MFD_CLOEXEC);
	T_ASSERT(mfd >= 0 && ftruncate(mfd, 1 << 21) == 0, "memfd");
	json_decref(expect(fd,
			   "{\"v\":1,\"op\":\"register_segment\",\"kind\":\"cuda_vmm\",\"size\":2097152,"
			   "\"device\":\"GPU-8a1e2f3c-0000-4000-8000-000000000001\"}",
			   &mfd, 1, "OK"));
	close(mfd);
	t_u8_tensor(&t, "w", 4096, 0, 0);
	tfd = wex__table_pack(&t, NULL, 1);
	T_ASSERT(tfd >= 0, "pack table: %d", tfd);
	json_decref(expect(fd, "{\"v\":1,\"op\":\"register_tensors\"}", &tfd, 1, "OK"));
	close(tfd);
	json_decref(expect(fd, "{\"v\":1,\"op\":\"begin_write\",\"version\":1}", NULL, 0, "OK"));
	json_decref(expect(fd, "{\"v\":1,\"op\":\"publish\",\"version\":1}", NULL, 0, "OK"));
	return fd;
}

static void producer_side(void)
{
	wex_client_t *c = t_open(WEX_ROLE_PRODUCER, "errors", NULL, 0, 1);
	static char buf[1 << 16];
	uint32_t id = 0;
	void *ptr = NULL;

	expect_nocuda(c, wex_segment_alloc(c, WEX_SEG_CUDA_VMM, 0, 1 << 21, &id, &ptr),
		      "wex_segment_alloc(WEX_SEG_CUDA_VMM)", "no CUDA backend");
	T_ASSERT(ptr == NULL, "no memory handed out");
	expect_nocuda(c, wex_segment_alloc(c, WEX_SEG_CUDA_IPC, 0, 1 << 21, &id, &ptr),
		      "wex_segment_alloc(WEX_SEG_CUDA_IPC)", "no CUDA backend");
	expect_nocuda(c, wex_segment_alloc(c, WEX_SEG_HOST_PINNED, 0, 1 << 21, &id, &ptr),
		      "wex_segment_alloc(WEX_SEG_HOST_PINNED)", "no CUDA");
	expect_nocuda(c, wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, buf, sizeof(buf), &id),
		      "wex_segment_register_ptr(WEX_SEG_CUDA_VMM)", "no CUDA backend");
	expect_nocuda(c, wex_segment_register_ptr(c, WEX_SEG_CUDA_IPC, buf, sizeof(buf), &id),
		      "wex_segment_register_ptr(WEX_SEG_CUDA_IPC)", "no CUDA backend");
	/* The client still works: a host segment, registered. */
	T_WEX(c, wex_segment_alloc(c, WEX_SEG_HOST, 0, 1 << 16, &id, &ptr));
	T_ASSERT(ptr != NULL, "host segment mapped");
	memset(ptr, 0x5a, 1 << 16);
	wex_client_close(c);
}

static void consumer_of_gpu_memory(struct t_wexd *d)
{
	int pfd = raw_gpu_producer(d->sock), before, ret;
	wex_client_t *c = t_open(WEX_ROLE_CONSUMER, CUDA_MODEL, "engine", 0, 1);
	static unsigned char own[4096];
	struct wex_sync_result r;
	struct wex_tensor t;
	void *region = NULL;

	before = t_fd_count(getpid());
	ret = wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r);
	expect_nocuda(c, ret, "wex_sync(REMAP_VIEW) of cuda_vmm memory",
		      "producer rank 0 exports cuda_vmm memory; this build has no CUDA backend");
	T_ASSERT(t_leases(d->sock, CUDA_MODEL) == 0, "the failed sync holds no lease");
	T_ASSERT(t_fd_count(getpid()) == before, "no fd kept: %d before, %d after", before,
		 t_fd_count(getpid()));
	ret = wex_reserve(c, 0, 0, 1 << 21, &region);
	expect_nocuda(c, ret, "wex_reserve against cuda_vmm memory", "exports cuda_vmm memory");
	T_ASSERT(region == NULL, "no region handed out");
	T_ASSERT(t_fd_count(getpid()) == before, "no fd kept after wex_reserve");
	/* The producer is unharmed: it may write and publish again. */
	json_decref(expect(pfd, "{\"v\":1,\"op\":\"begin_write\",\"version\":2,\"timeout_ms\":2000}",
			   NULL, 0, "OK"));
	json_decref(expect(pfd, "{\"v\":1,\"op\":\"publish\",\"version\":2}", NULL, 0, "OK"));
	/* A copy into the consumer's own host buffer needs the source mapped
	 * too. */
	t_u8_tensor(&t, "w", sizeof(own), 0, 0);
	t.ptr = own;
	T_WEX(c, wex_attach(c, &t, 1));
	ret = wex_sync(c, WEX_SYNC_COPY, 2, 5000, &r);
	expect_nocuda(c, ret, "wex_sync(COPY) of cuda_vmm memory", "exports cuda_vmm memory");
	T_ASSERT(t_leases(d->sock, CUDA_MODEL) == 0, "and holds no lease");
	wex_client_close(c);
	close(pfd);
}

static void host_path(void)
{
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;

	t_prod_open(&p, HOST_MODEL, "tiny", 0, 1);
	t_cons_open(&k, HOST_MODEL, "g", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(&k, 1) == 0, "copy sync: every byte holds v1");
	t_prod_write(&p, 2);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_FIXED, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k, 2) == 0, "same-address sync: every byte reads v2");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(t_view_bad(&k, 0, 2) == 0, "view sync: every byte reads v2");
	t_cons_close(&k);
	t_prod_close(&p);
}

int main(void)
{
	struct t_wexd d;

	T_ASSERT(wex_cuda_alloc(1 << 20, 0, NULL) == NULL, "wex_cuda_alloc fails without CUDA");
	{
		void *p = NULL;
		int ret = wex_cuda_malloc(1 << 20, 0, &p);

		T_ASSERT(ret == -WEX_ENOCUDA && !p, "wex_cuda_malloc: -WEX_ENOCUDA, got %s",
			 wex_strerror(ret));
	}
	wex_cuda_free(NULL, 0, 0, NULL);
	t_wexd_start(&d);
	producer_side();
	consumer_of_gpu_memory(&d);
	host_path();
	t_wexd_stop(&d);
	printf("no_cuda_api: PASS\n");
	t_exit(T_EXIT_PASS);
}
