/* SPDX-License-Identifier: MIT */
/*
 * cuda_e2e - the CUDA VMM path end to end through a real wexd.
 *
 * A producer process allocates its weights with wex_cuda_alloc (the PyTorch
 * pluggable-allocator entry point), fills them, registers the allocation
 * with wex_segment_register_ptr (no copy: the VMM handle travels as an fd
 * through wexd) and publishes v1.  This process, the consumer, then
 *  1. syncs REMAP_VIEW and reads every byte of the producer's device memory
 *     through wex_view (device-to-host through the backend's executor), the
 *     view mapped on the producer's device as found here by its UUID;
 *  2. syncs COPY into its own wex_cuda_alloc'd buffer, through the plan,
 *     and checks every byte; then verifies it (WEX_SYNC_VERIFY), and
 *     finds one element changed in it;
 *  3. syncs REMAP_FIXED into a region reserved on the producer's device,
 *     verified;
 *  4. checks that the calling thread's current context is what it was;
 *  4b. wexd lists no fallback for those syncs, and (emulated driver)
 *     lists rw_mapping for a client whose read-only mapping was refused;
 *  5. (emulated driver) a copy meeting a sticky CUDA error fails with
 *     -ENOTRECOVERABLE, dirty, the message saying to restart the process;
 * and a registration of non-exportable memory is refused with a reason.
 * On the emulated driver the producer numbers the two devices the other
 * way round (WEX_EMUL_VISIBLE, like CUDA_VISIBLE_DEVICES), so its memory
 * is on this process's device 1 and ordinals alone would pick wrong.
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * also runs it against tests/gpu/emul_cuda.c (cuda_e2e_emul).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_util.h"
#include "ipc/sock.h"
#include "vmm/backend.h"
#include "wex.h"

#define NT 8
#define ROWS 512
#define COLS 1024 /* bf16: 1 MiB a tensor */

static uint16_t val(int t, uint64_t e)
{
	return (uint16_t)(e * 2654435761u ^ (uint32_t)t * 40503u);
}

static void make_tensors(struct wex_tensor *t, uint32_t seg, uint64_t *total)
{
	*total = gpu_bf16_tensors(t, NT, ROWS, COLS, seg);
}

static uint64_t bad_bytes(const uint16_t *h, int t)
{
	uint64_t bad = 0;

	for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++)
		bad += h[e] != val(t, e);
	return bad;
}

static void producer(int go_fd, int done_fd)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "gpu" };
	struct wex_tensor t[NT];
	uint64_t total;
	wex_client_t *c;
	uint16_t *h;
	uint32_t seg;
	void *dev;
	char ch;
	int ret;

	/* On the emulated driver this process numbers the two devices the
	 * other way round (as CUDA_VISIBLE_DEVICES may): its device 0 is the
	 * consumer's device 1, so the device must travel by UUID.  A real
	 * driver ignores the variable. */
	setenv("WEX_EMUL_VISIBLE", "1,0", 1);
	make_tensors(t, 0, &total);
	dev = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(dev != NULL);
	h = malloc(total);
	for (int i = 0; i < NT; i++)
		for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++)
			h[(size_t)i * ROWS * COLS + e] = val(i, e);
	CHECK_OK(xfer(dev, h, total));
	CHECK_OK(wex_client_open(&p, &c));
	ret = wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, dev, total, &seg);
	if (ret < 0)
		fprintf(stderr, "register_ptr: %s\n", wex_last_error(c));
	CHECK_OK(ret);
	/* Host memory is not CUDA memory: refused, with a reason. */
	ret = wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, h, total, &seg);
	CHECK(ret < 0 && wex_last_error(c)[0] != '\0');
	for (int i = 0; i < NT; i++)
		t[i].segment = 0;
	CHECK_OK(wex_register_tensors(c, t, NT));
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));
	{
		char msg[64] = "p";

		CHECK_OK(wex__cuda_device_uuid(0, msg + 1, sizeof(msg) - 1));
		CHECK(write(done_fd, msg, sizeof(msg)) == (ssize_t)sizeof(msg));
	}
	CHECK(read(go_fd, &ch, 1) >= 0); /* hold the memory until the consumer is done */
	wex_client_close(c);
	wex_cuda_free(dev, (ssize_t)total, 0, NULL);
	free(h);
	_exit(0);
}

/* 1 when msg names one of the tensors, quoted. */
static int names_tensor(const char *msg, const struct wex_tensor *t, size_t n)
{
	char q[WEX_NAME_MAX + 2];

	for (size_t i = 0; i < n; i++) {
		snprintf(q, sizeof(q), "\"%s\"", t[i].name);
		if (strstr(msg, q))
			return 1;
	}
	return 0;
}

int main(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER, .model = "gpu" };
	struct wex_tensor t[NT];
	struct wex_sync_result r;
	uint64_t total, bad = 0;
	struct gpu_world w;
	wex_client_t *c;
	uint16_t *h;
	void *mine;
	char msg[64];
	int pdev = -1, ord = -1;

	gpu_require();
	gpu_world_start(&w, producer);
	CHECK(read(w.from_prod, msg, sizeof(msg)) == (ssize_t)sizeof(msg) && msg[0] == 'p');

	make_tensors(t, 0, &total);
	h = malloc(total);
	CHECK_OK(wex_client_open(&p, &c));

	/* 1. Zero copy: the producer's device memory, read through views. */
	CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	CHECK(r.version == 1);
	for (int i = 0; i < NT; i++) {
		void *v;

		CHECK_OK(wex_view(c, 0, t[i].name, &v, NULL));
		if (i == 0) {
			/* Mapped on the producer's device, found by its UUID. */
			CHECK_OK(wex__cuda_device_by_uuid(msg + 1, &pdev));
			/* Pointer queries need a current context on a real
			 * driver (CUDA_ERROR_INVALID_CONTEXT without one), and
			 * wex_sync/wex_view leave this thread with none. */
			{
				struct wex_mem_thread_state ts;

				wex_mem_thread_save(&ts);
				CHECK_OK(wex__cuda_use_device(pdev));
				CU_OK(wex__cu.cuPointerGetAttribute(
					&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
					(CUdeviceptr)(uintptr_t)v));
				wex_mem_thread_restore(&ts);
			}
			printf("producer's device %s is ordinal %d here; the view is on %d\n", msg + 1,
			       pdev, ord);
			CHECK(ord == pdev);
		}
		CHECK_OK(xfer(h, v, (uint64_t)ROWS * COLS * 2));
		bad += bad_bytes(h, i);
	}
	CHECK(bad == 0);
	CHECK_OK(wex_release(c));

	/* 2. In-place copy into this process's own device memory. */
	mine = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(mine != NULL);
	for (int i = 0; i < NT; i++)
		t[i].ptr = (char *)mine + t[i].offset;
	CHECK_OK(wex_attach(c, t, NT));
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r));
	CHECK(r.version == 1 && r.bytes == total);
	CHECK_OK(xfer(h, mine, total));
	for (int i = 0; i < NT; i++)
		bad += bad_bytes(h + (size_t)i * ROWS * COLS, i);
	CHECK(bad == 0);

	/* 2b. Verified (WEX_SYNC_VERIFY): every byte of the engine's device
	 * memory compared with the producer's (both gathered into host
	 * buffers by the GPU executor); one element the engine changed is
	 * found, named, and leaves the weights dirty until a copy. */
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
	CHECK(r.verified == total && !r.changed);
	{
		uint16_t x = (uint16_t)(val(3, 500) ^ 0x01); /* its low byte: byte 1000 */
		char want[WEX_NAME_MAX + 64];

		CHECK_OK(xfer((char *)mine + t[3].offset + 1000, &x, sizeof(x)));
		CHECK(wex_sync(c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r) == -WEX_EVERIFY);
		printf("verify: %s\n", wex_last_error(c));
		snprintf(want, sizeof(want), "'%s' (piece 3 of this rank, BF16) at byte 1000 ", t[3].name);
		CHECK(strstr(wex_last_error(c), want) != NULL);
		CHECK(strstr(wex_last_error(c), "1 of ") != NULL);
		CHECK(wex_is_dirty(c) == 1);
		CHECK_OK(wex_sync(c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
		CHECK(r.changed && r.verified == total && wex_is_dirty(c) == 0);
	}

	/* 3. Same addresses: a region reserved (by default on the producer's
	 * device, found by UUID) shows the producer's memory in place. */
	{
		struct wex_tensor ft[NT];
		void *region;

		CHECK_OK(wex_reserve(c, 0, 0, total, &region));
		CU_OK(wex__cu.cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
						    (CUdeviceptr)(uintptr_t)region));
		CHECK(ord == pdev);
		memcpy(ft, t, sizeof(ft));
		for (int i = 0; i < NT; i++)
			ft[i].ptr = (char *)region + ft[i].offset;
		CHECK_OK(wex_attach(c, ft, NT));
		CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 1, 5000, &r));
		CHECK(r.verified == total);
		CHECK_OK(xfer(h, region, total));
		for (int i = 0; i < NT; i++)
			bad += bad_bytes(h + (size_t)i * ROWS * COLS, i);
		CHECK(bad == 0);
		CHECK_OK(wex_release(c));
		CHECK_OK(wex_attach(c, t, NT));
	}

	/* 4. wex gives the calling thread its device binding back: no
	 * context current before a call that copies on the GPU, none after;
	 * with a second device, its context stays current through a call
	 * that copies between devices (an engine thread stays on its GPU). */
	{
		CUcontext cur = (CUcontext)1, other = NULL;
		CUdevice d1;
		void *tmp;
		int ndev = 0;

		CU_OK(wex__cu.cuCtxSetCurrent(NULL));
		/* Asking whether host memory is on a GPU creates no context and
		 * binds none (the driver answers CUDA_ERROR_INVALID_VALUE for
		 * it without one: nothing to borrow device 0's context for). */
		CHECK(wex__cuda_ptr_on_gpu((uint64_t)(uintptr_t)h) == -1);
		CU_OK(wex__cu.cuCtxGetCurrent(&cur));
		CHECK(cur == NULL);
		cur = (CUcontext)1;
		CHECK_OK(wex_attach(c, t, NT)); /* forgets what the buffers hold: copies */
		CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r));
		CHECK(r.bytes == total);
		CU_OK(wex__cu.cuCtxGetCurrent(&cur));
		CHECK(cur == NULL);
		tmp = wex_cuda_alloc(1 << 20, 0, NULL);
		CHECK(tmp != NULL);
		wex_cuda_free(tmp, 1 << 20, 0, NULL);
		CU_OK(wex__cu.cuCtxGetCurrent(&cur));
		CHECK(cur == NULL);
		CU_OK(wex__cu.cuDeviceGetCount(&ndev));
		if (ndev > 1) {
			CU_OK(wex__cu.cuDeviceGet(&d1, 1));
			CU_OK(wex__cu.cuDevicePrimaryCtxRetain(&other, d1));
			CU_OK(wex__cu.cuCtxSetCurrent(other));
			CHECK_OK(wex_attach(c, t, NT));
			CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r));
			CHECK(r.bytes == total);
			CU_OK(wex__cu.cuCtxGetCurrent(&cur));
			CHECK(cur == other);
			CU_OK(wex__cu.cuCtxSetCurrent(NULL));
		}
		printf("device binding kept across wex calls (%s)\n",
		       ndev > 1 ? "none, and device 1's" : "none; one device: device 1's not tried");
	}

	/* 4b. wexd lists rw_mapping for this client only where the driver
	 * refused read-only mappings, and no unpinned_verify (the gather
	 * buffers were pinned).  A driver that refuses a read-only mapping
	 * (emulated): a fresh client maps the producer's memory read-write,
	 * and wexd lists that (rw_mapping). */
	CHECK(client_fallback(c, NULL, "rw_mapping") == (wex__cuda_vmm_readonly() == 0));
	CHECK(!client_fallback(c, NULL, "unpinned_verify"));
	if (emulated()) {
		struct wex_client_params p2 = p;
		wex_client_t *c2;

		p2.field_mask |= WEX_CLIENT_FIELD_GROUP;
		p2.group = "rw";
		setenv("WEX_EMUL_NO_PROT_READ", "1", 1);
		CHECK_OK(wex_client_open(&p2, &c2));
		CHECK_OK(wex_sync(c2, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		CHECK_OK(wex_release(c2)); /* carries the sync's report */
		unsetenv("WEX_EMUL_NO_PROT_READ");
		CHECK(client_fallback(c, "rw", "rw_mapping"));
		CHECK(!client_fallback(c, "default", "rw_mapping")); /* c: read-only */
		CHECK(!client_fallback(c, "rw", "pageable_staging"));
		CHECK(!client_fallback(c, NULL, "unpinned_verify"));
		wex_client_close(c2);
		printf("a read-write mapping (read-only refused) is listed by wexd: rw_mapping\n");
	}

	/* 5. A copy that meets a sticky CUDA error (illegal address: the
	 * context is unusable from then on) says so, not "sync again". */
	if (emulated()) {
		CHECK_OK(wex_attach(c, t, NT));
		emul_fail("cuMemcpyBatchAsync", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
		emul_fail("cuMemcpyAsync", 1, CUDA_ERROR_ILLEGAL_ADDRESS);
		CHECK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r) == -ENOTRECOVERABLE);
		printf("sticky error: %s\n", wex_last_error(c));
		CHECK(strstr(wex_last_error(c), "restart the process") != NULL);
		/* It names the failed call, its error and what it copied. */
		CHECK(strstr(wex_last_error(c), "cuMemcpy") != NULL);
		CHECK(strstr(wex_last_error(c), ": CUDA_ERROR_ILLEGAL_ADDRESS") != NULL);
		CHECK(names_tensor(wex_last_error(c), t, NT));
		CHECK(wex_is_dirty(c) == 1);
		emul_fail("cuMemcpyBatchAsync", 0, CUDA_SUCCESS);
		emul_fail("cuMemcpyAsync", 0, CUDA_SUCCESS);

		/* One copy of several refused (batch refused, then the
		 * second cuMemcpyAsync): that op's tensor is named. */
		emul_fail("cuMemcpyBatchAsync", 1, CUDA_ERROR_INVALID_VALUE);
		emul_fail("cuMemcpyAsync", 2, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r) == -WEX_EDIRTY);
		printf("failed copy: %s\n", wex_last_error(c));
		CHECK(strstr(wex_last_error(c), "cuMemcpyAsync: CUDA_ERROR_OUT_OF_MEMORY") != NULL);
		CHECK(strstr(wex_last_error(c), "copying tensor \"") != NULL);
		CHECK(names_tensor(wex_last_error(c), t, NT));
		emul_fail("cuMemcpyBatchAsync", 0, CUDA_SUCCESS);
		emul_fail("cuMemcpyAsync", 0, CUDA_SUCCESS);
	}

	wex_client_close(c);
	wex_cuda_free(mine, (ssize_t)total, 0, NULL);
	gpu_world_stop(&w);
	free(h);
	printf("PASS: cuda_vmm through wexd: view and copy of %llu bytes, every byte checked\n",
	       (unsigned long long)total);
	return 0;
}
