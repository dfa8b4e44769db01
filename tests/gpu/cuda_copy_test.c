/* SPDX-License-Identifier: MIT */
/*
 * cuda_copy_test.c - the GPU copy executor against the host executor (label
 * gpu; 77 without a device).  The same wex_copy_op list runs on host copies
 * of the buffers (wex_mem_host_copy, the reference) and on the device;
 * the results must be byte-identical.  Shapes: contiguous, strided rows
 * (2D), two levels with compatible strides (3D), two levels that 3D cannot
 * express, three levels, contiguous-in-disguise, zero counts, pitches
 * below the row length (overlapping source rows), and > 4096 small ops
 * (several cuMemcpyBatchAsync calls).  On the emulated driver the run
 * must have gone through cuMemcpy3DAsync, cuMemcpy2DAsync and
 * cuMemcpyBatchAsync (so their emulation is what the bytes prove; a
 * batch's copies run there last first).
 *   peer_reads_alloc  wex_cuda_alloc memory on device 0 is read and written
 *                     by copies device 1 runs (peer access, as for
 *                     cudaMalloc memory)
 *   host_ptr_no_context  wex_mem_ptr_on_gpu of host memory from a thread
 *                     with no context: -1, without retaining (creating)
 *                     device 0's primary context to ask
 *   huge_pitch        2D and 3D shapes whose pitch is one above
 *                     CU_DEVICE_ATTRIBUTE_MAX_PITCH (emulated: lowered to
 *                     1 MiB) arrive whole, cut into rows
 *   mixed_layout      a layout with host pieces and pieces in VMM memory
 *                     only device 0 reaches, filled from device 1 (and
 *                     device 0) memory: the copies into device 0's
 *                     memory run there whichever op comes first
 *   random_shapes     30 rounds of 200 random ops (0 to 3 levels, counts 0
 *                     to 4, negative, zero and short strides) against the
 *                     host executor
 *   memcpy3d_offsets  cuMemcpy3DAsync itself with X/Y/Z offsets on both
 *                     sides, device and host memory, against the same
 *                     copy done on the CPU (the driver's semantics, which
 *                     the emulation must match)
 *   unfolded_op       an op as an older wexd sends it (three levels listed
 *                     outermost first, one of a single index) arrives
 *                     right, in one copy call (it was 32 before the
 *                     executor folded ops)
 *   sync_copy_waits   emulated only: a cuMemcpyDtoH read-back does not see
 *                     copies still queued on a non-blocking stream (the
 *                     driver's stream synchronization rules, which the
 *                     emulation must match for a missing wait to show)
 */
#include <pthread.h>
#include <sys/mman.h>

#include "gpu_util.h"

#define BUF (16u << 20)

static struct wex_copy_op ops[6000];
static size_t nops;

/* The driver has cuMemcpyBatchAsync (12.8 and later): the executor batches. */
static int batched(void)
{
	return wex__cu.cuMemcpyBatchAsync13 || wex__cu.cuMemcpyBatchAsync12;
}

static void add(uint64_t s, uint64_t d, uint64_t len, uint32_t nouter, const uint64_t *cnt,
		const int64_t *ss, const int64_t *ds)
{
	struct wex_copy_op *o = &ops[nops++];

	*o = (struct wex_copy_op){ .src = s, .dst = d, .len = len, .nouter = nouter };
	for (uint32_t i = 0; i < nouter; i++) {
		o->count[i] = cnt[i];
		o->src_stride[i] = ss[i];
		o->dst_stride[i] = ds[i];
	}
}

/* Offsets into the buffers; rebased to host or device addresses below. */
static void build(void)
{
	add(0, 0, 1u << 20, 0, NULL, NULL, NULL);
	add(1u << 20, (1u << 20) + 3, 1000, 1, (uint64_t[]){ 300 }, (int64_t[]){ 1024 },
	    (int64_t[]){ 2000 });
	add(2u << 20, 3u << 20, 96, 2, (uint64_t[]){ 10, 20 }, (int64_t[]){ 128, 1280 },
	    (int64_t[]){ 100, 1000 });
	add(4u << 20, 5u << 20, 64, 2, (uint64_t[]){ 10, 7 }, (int64_t[]){ 100, 1234 },
	    (int64_t[]){ 64, 640 });
	add(6u << 20, 7u << 20, 32, 3, (uint64_t[]){ 4, 5, 6 }, (int64_t[]){ 48, 400, 4000 },
	    (int64_t[]){ 32, 128, 640 });
	add(8u << 20, 8u << 20, 256, 2, (uint64_t[]){ 16, 8 }, (int64_t[]){ 256, 4096 },
	    (int64_t[]){ 256, 4096 });
	add(9u << 20, 9u << 20, 256, 1, (uint64_t[]){ 0 }, (int64_t[]){ 256 }, (int64_t[]){ 256 });
	add(10u << 20, (10u << 20) + 5000, 64, 1, (uint64_t[]){ 50 }, (int64_t[]){ 16 },
	    (int64_t[]){ 64 });
	for (int i = 0; i < 5000; i++)
		add((11u << 20) + (uint64_t)i * 37, (12u << 20) + (uint64_t)i * 41, 29, 0, NULL, NULL,
		    NULL);
}

static void rebase(uint64_t s, uint64_t d)
{
	for (size_t i = 0; i < nops; i++) {
		ops[i].src += s;
		ops[i].dst += d;
	}
}

static void unbase(uint64_t s, uint64_t d)
{
	rebase(-s, -d);
}

/* Host and device buffers of n bytes each: ds filled with pattern vs,
 * dd with vd, hs and hd holding the same bytes, out for read-backs. */
struct bufs {
	unsigned char *hs, *hd, *out;
	CUdeviceptr ds, dd;
};

static void bufs_open(struct bufs *b, size_t n, int vs, int vd)
{
	b->hs = malloc(n);
	b->hd = malloc(n);
	b->out = malloc(n);
	CHECK(b->hs && b->hd && b->out);
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuMemAlloc(&b->ds, n));
	CU_OK(wex__cu.cuMemAlloc(&b->dd, n));
	dev_fill(b->ds, n, vs);
	dev_fill(b->dd, n, vd);
	CU_OK(wex__cu.cuMemcpyDtoH(b->hs, b->ds, n));
	CU_OK(wex__cu.cuMemcpyDtoH(b->hd, b->dd, n));
}

static void bufs_close(struct bufs *b)
{
	CU_OK(wex__cu.cuMemFree(b->ds));
	CU_OK(wex__cu.cuMemFree(b->dd));
	free(b->hs);
	free(b->hd);
	free(b->out);
}

static void test(void)
{
	struct bufs b;

	bufs_open(&b, BUF, 1, 2);
	build();
	rebase((uint64_t)(uintptr_t)b.hs, (uint64_t)(uintptr_t)b.hd);
	CHECK_OK(wex_mem_host_copy(ops, nops, 1));
	unbase((uint64_t)(uintptr_t)b.hs, (uint64_t)(uintptr_t)b.hd);
	rebase(b.ds, b.dd);
	unsigned long n3 = emul_calls("cuMemcpy3DAsync"), n2 = emul_calls("cuMemcpy2DAsync");
	unsigned long nb = emul_calls("cuMemcpyBatchAsync");

	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(ops, nops, 1));
	/* Batches too: the emulation runs a batch's copies last first (no
	 * order is promised), so these bytes prove the executor's copies do
	 * not depend on each other. */
	if (emulated())
		CHECK(emul_calls("cuMemcpy3DAsync") > n3 && emul_calls("cuMemcpy2DAsync") > n2 &&
		      (!batched() || emul_calls("cuMemcpyBatchAsync") > nb));
	CU_OK(wex__cu.cuMemcpyDtoH(b.out, b.dd, BUF));
	for (size_t i = 0; i < BUF; i++)
		if (b.out[i] != b.hd[i]) {
			fprintf(stderr, "byte %zu differs: gpu %u host %u\n", i, b.out[i], b.hd[i]);
			exit(T_EXIT_FAIL);
		}
	/* Batching off (WEX_CUDA_BATCH=0; gpu_sync's unbatched phase): the
	 * same bytes, not one batch call. */
	dev_fill(b.dd, BUF, 2);
	nb = emul_calls("cuMemcpyBatchAsync");
	CHECK(wex__cuda_copy_batch(0) == 1); /* on before (no WEX_CUDA_BATCH here) */
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(ops, nops, 1));
	CHECK(wex__cuda_copy_batch(1) == 0);
	if (emulated())
		CHECK(emul_calls("cuMemcpyBatchAsync") == nb); /* batching off: no batch */
	CU_OK(wex__cu.cuMemcpyDtoH(b.out, b.dd, BUF));
	CHECK(memcmp(b.out, b.hd, BUF) == 0);
	/* The same ops with device source and host (pageable) destination:
	 * unified addressing lets one executor serve both. */
	unbase(b.ds, b.dd);
	memset(b.out, 0, BUF);
	rebase(b.ds, (uint64_t)(uintptr_t)b.out);
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_IPC)->copy(ops, 1, 1));
	CHECK(memcmp(b.out, b.hd, 1u << 20) == 0);
	bufs_close(&b);
}

/* xorshift64: the same shapes every run. */
static uint64_t rnd_state = 88172645463325252ull;

static uint64_t rnd(uint64_t n)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return n ? rnd_state % n : 0;
}

#define RND_REGION (64u << 10)
#define RND_OPS 200u

/* Random shapes (0 to 3 levels, counts 0 to 4, negative, zero, short and
 * long strides, levels of one row) through the GPU executor against the
 * host executor, each op in a region of its own; destinations never
 * overlap within an op (as the planner's), sources may. */
static void random_shapes(void)
{
	struct bufs b;

	bufs_open(&b, BUF, 1, 2);
	for (int it = 0; it < 30; it++) {
		nops = 0;
		for (uint64_t k = 0; k < RND_OPS; k++) {
			uint64_t base = k * RND_REGION + RND_REGION / 2, len = 1 + rnd(40), cnt[3];
			int64_t ss[3], ds[3], span = (int64_t)len;
			uint32_t no = (uint32_t)rnd(4);

			for (uint32_t i = 0; i < no; i++) {
				cnt[i] = rnd(5);
				ds[i] = span + (int64_t)rnd(3) * (int64_t)rnd(20);
				if (rnd(4) == 0)
					ds[i] = -ds[i];
				span = (ds[i] < 0 ? -ds[i] : ds[i]) * (int64_t)(cnt[i] ? cnt[i] : 1);
				switch (rnd(5)) {
				case 0:
					ss[i] = ds[i];
					break;
				case 1:
					ss[i] = 0;
					break;
				case 2:
					ss[i] = -(int64_t)rnd(200);
					break;
				case 3:
					ss[i] = (int64_t)(len * rnd(4));
					break;
				default:
					ss[i] = (int64_t)rnd(300);
					break;
				}
			}
			add(base, base, len, no, cnt, ss, ds);
		}
		CU_OK(wex__cu.cuMemcpyDtoH(b.hd, b.dd, BUF));
		rebase((uint64_t)(uintptr_t)b.hs, (uint64_t)(uintptr_t)b.hd);
		CHECK_OK(wex_mem_host_copy(ops, nops, 1));
		unbase((uint64_t)(uintptr_t)b.hs, (uint64_t)(uintptr_t)b.hd);
		rebase(b.ds, b.dd);
		CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(ops, nops, 1));
		unbase(b.ds, b.dd);
		CU_OK(wex__cu.cuMemcpyDtoH(b.out, b.dd, BUF));
		for (size_t i = 0; i < RND_OPS * RND_REGION; i++)
			if (b.out[i] != b.hd[i]) {
				const struct wex_copy_op *o = &ops[i / RND_REGION];

				fprintf(stderr, "round %d byte %zu differs: gpu %u host %u (op: len %llu, "
					"%u levels, counts %llu %llu %llu)\n", it, i, b.out[i], b.hd[i],
					(unsigned long long)o->len, o->nouter,
					(unsigned long long)o->count[0], (unsigned long long)o->count[1],
					(unsigned long long)o->count[2]);
				exit(T_EXIT_FAIL);
			}
	}
	bufs_close(&b);
}

/* The CPU's version of one CUDA_MEMCPY3D between host buffers. */
static void ref3d(unsigned char *d, const unsigned char *s, const CUDA_MEMCPY3D *c)
{
	for (size_t z = 0; z < c->Depth; z++)
		for (size_t y = 0; y < c->Height; y++)
			memcpy(d + ((c->dstZ + z) * c->dstHeight + c->dstY + y) * c->dstPitch +
				       c->dstXInBytes,
			       s + ((c->srcZ + z) * c->srcHeight + c->srcY + y) * c->srcPitch +
				       c->srcXInBytes,
			       c->WidthInBytes);
}

#define B3 (1u << 20)

static void memcpy3d_offsets(void)
{
	struct bufs b;
	CUDA_MEMCPY3D c;

	bufs_open(&b, B3, 4, 5);
	/* Device to device: offsets in every dimension, different pitches
	 * and slice heights on the two sides. */
	memset(&c, 0, sizeof(c));
	c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c.srcDevice = b.ds;
	c.srcXInBytes = 7;
	c.srcY = 3;
	c.srcZ = 2;
	c.srcPitch = 512;
	c.srcHeight = 40;
	c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c.dstDevice = b.dd;
	c.dstXInBytes = 100;
	c.dstY = 1;
	c.dstZ = 4;
	c.dstPitch = 384;
	c.dstHeight = 33;
	c.WidthInBytes = 250;
	c.Height = 30;
	c.Depth = 9;
	CU_OK(wex__cu.cuMemcpy3DAsync(&c, NULL));
	CU_OK(wex__cu.cuCtxSynchronize());
	ref3d(b.hd, b.hs, &c);
	CU_OK(wex__cu.cuMemcpyDtoH(b.out, b.dd, B3));
	CHECK(memcmp(b.out, b.hd, B3) == 0);
	/* Device to host, with offsets: the host side by pointer. */
	memcpy(b.out, b.hd, B3);
	c.dstMemoryType = CU_MEMORYTYPE_HOST;
	c.dstHost = b.out;
	c.dstDevice = 0;
	c.srcZ = 0;
	c.dstZ = 1;
	CU_OK(wex__cu.cuMemcpy3DAsync(&c, NULL));
	CU_OK(wex__cu.cuCtxSynchronize());
	ref3d(b.hd, b.hs, &c);
	CHECK(memcmp(b.out, b.hd, B3) == 0);
	bufs_close(&b);
}

/* Strided copies whose pitch is above CU_DEVICE_ATTRIBUTE_MAX_PITCH, which
 * cuMemcpy2DAsync/cuMemcpy3DAsync refuse: the executor cuts them into
 * rows and every byte arrives.  The emulated driver's limit is lowered
 * to 1 MiB (WEX_EMUL_MAX_PITCH); on a GPU the source spans 3 pitches of
 * 2 GiB (6 GiB, only the rows touched). */
static void huge_pitch(void)
{
	const uint64_t len = 4096;
	struct wex_copy_op op[2];
	unsigned long n2, nb;
	CUdeviceptr ds, dd;
	uint64_t p;
	int max;

	CHECK_OK(wex__cuda_use_device(0));
	if (emulated())
		setenv("WEX_EMUL_MAX_PITCH", "1048576", 1);
	max = wex__cuda_dev_attr(0, CU_DEVICE_ATTRIBUTE_MAX_PITCH);
	printf("  CU_DEVICE_ATTRIBUTE_MAX_PITCH = %d\n", max);
	CHECK(max > 0);
	CHECK(!emulated() || max == 1 << 20);
	p = (uint64_t)max + 1;
	CU_OK(wex__cu.cuMemAlloc(&ds, 3 * p + len));
	CU_OK(wex__cu.cuMemAlloc(&dd, 6 * len));
	/* Source rows at 0, p, 2p and 3p, each its own pattern. */
	for (unsigned k = 0; k < 4; k++)
		dev_fill(ds + k * p, len, 20 + k);
	/* 2D: rows 0 and 1 -> dd[0..2).  3D: rows 0, 1 (slice 0) and 2, 3
	 * (slice 1: slice stride 2p) -> dd[2..6). */
	op[0] = (struct wex_copy_op){ .src = ds, .dst = dd, .len = len, .nouter = 1,
				      .count = { 2 }, .src_stride = { (int64_t)p },
				      .dst_stride = { (int64_t)len } };
	op[1] = (struct wex_copy_op){ .src = ds, .dst = dd + 2 * len, .len = len, .nouter = 2,
				      .count = { 2, 2 },
				      .src_stride = { (int64_t)p, 2 * (int64_t)p },
				      .dst_stride = { (int64_t)len, 2 * (int64_t)len } };
	n2 = emul_calls("cuMemcpy2DAsync");
	nb = emul_calls("cuMemcpyBatchAsync");
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(op, 2, 1));
	for (unsigned k = 0; k < 2; k++)
		CHECK(dev_check(dd + k * len, len, 20 + k, 0));
	for (unsigned k = 0; k < 4; k++)
		CHECK(dev_check(dd + (2 + k) * len, len, 20 + k, 0));
	/* Emulated: 2D was tried and refused, and the rows went in batches
	 * (where the driver has them). */
	if (emulated())
		CHECK(emul_calls("cuMemcpy2DAsync") > n2 &&
		      (!batched() || emul_calls("cuMemcpyBatchAsync") > nb));
	CU_OK(wex__cu.cuMemFree(ds));
	CU_OK(wex__cu.cuMemFree(dd));
}

/* Asking whether host memory is GPU memory, from a thread with no
 * context: no (the driver answers INVALID_VALUE without one), and no
 * primary context retained to ask (one on GPU 0 costs hundreds of MiB in
 * a process working on another GPU), none left current. */
static void host_ptr_no_context(void)
{
	static char host[4096];
	CUcontext cur = (CUcontext)1;
	unsigned long n;

	CHECK_OK(wex__cuda_load());
	n = emul_calls("cuDevicePrimaryCtxRetain");
	CHECK(wex_mem_ptr_on_gpu((uint64_t)(uintptr_t)host) == -1);
	CHECK(emul_calls("cuDevicePrimaryCtxRetain") == n);
	CU_OK(wex__cu.cuCtxGetCurrent(&cur));
	CHECK(cur == NULL);
}

/* A thread with no context asks about device memory of a process that
 * works on device 1 only (wex_released: what every copy sync checks):
 * the driver needs a context for cuMemGetAddressRange (and, on real
 * drivers, for pointer queries), and wex borrows the one it already holds
 * rather than making one on device 0 (hundreds of MiB of GPU 0 per
 * process on a real GPU). */
static void *released_from_thread(void *arg)
{
	CHECK(wex_released(arg, 4096, NULL) == 0);
	return NULL;
}

static void no_context_thread_device1(void)
{
	pthread_t t;
	void *p = NULL;

	CHECK_OK(wex__cuda_load());
	if (gpu_count() < 2) {
		printf("  one device: not tried\n");
		return;
	}
	CHECK_OK(wex_cuda_malloc(2u << 20, 1, &p));
	CHECK(pthread_create(&t, NULL, released_from_thread, p) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(emul_ctx_retained(0) <= 0);
	wex_cuda_free(p, 2u << 20, 1, NULL);
}

/* Device dev copies n bytes at p into memory of its own: the copy's
 * result, what arrived checked against dev_fill's seed where it succeeded. */
static CUresult copy_out_on(int dev, const void *p, size_t n, unsigned seed)
{
	CUdeviceptr d = 0;
	CUstream s;
	CUresult r;

	CHECK_OK(wex__cuda_use_device(dev));
	CU_OK(wex__cu.cuMemAlloc(&d, n));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	r = wex__cu.cuMemcpyAsync(d, (CUdeviceptr)(uintptr_t)p, n, s);
	if (r == CUDA_SUCCESS) {
		CU_OK(wex__cu.cuStreamSynchronize(s));
		CHECK(dev_check(d, n, seed, 0));
	}
	CU_OK(wex__cu.cuStreamDestroy(s));
	CU_OK(wex__cu.cuMemFree(d));
	return r;
}

/* Memory wex_cuda_alloc gives a trainer (PyTorch's pluggable allocator:
 * its stand-in for cudaMalloc) is reached by another GPU with peer access,
 * as cudaMalloc memory is once peer access is on: a copy device 1 runs out
 * of it (t.to("cuda:1")) and one into it arrive whole (VMM memory is
 * reached only by the devices cuMemSetAccess named: the copy faulted). */
static void peer_reads_alloc(void)
{
	const size_t n = 2u << 20;
	CUdeviceptr d1 = 0;
	CUstream s;
	void *p = NULL;

	CHECK_OK(wex__cuda_load());
	if (gpu_count() < 2 || !gpu_can_peer(1, 0)) {
		printf("  no second device with peer access to device 0: not tried\n");
		return;
	}
	CHECK_OK(wex_cuda_malloc(n, 0, &p));
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)p, n, 5);
	CHECK_OK(wex__cuda_use_device(1));
	CU_OK(wex__cu.cuMemAlloc(&d1, n));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuMemcpyAsync(d1, (CUdeviceptr)(uintptr_t)p, n, s));
	CU_OK(wex__cu.cuStreamSynchronize(s));
	CHECK(dev_check(d1, n, 5, 0));
	dev_fill(d1, n, 9);
	CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)p, d1, n, s));
	CU_OK(wex__cu.cuStreamSynchronize(s));
	CHECK_OK(wex__cuda_use_device(0));
	CHECK(dev_check((uint64_t)(uintptr_t)p, n, 9, 0));
	CHECK_OK(wex__cuda_use_device(1));
	CU_OK(wex__cu.cuStreamDestroy(s));
	CU_OK(wex__cu.cuMemFree(d1));
	wex_cuda_free(p, n, 0, NULL);
	if (!emulated())
		return;
	/* The peers' grant refused (not a sticky error): the memory is
	 * device 0's alone, the allocation stands, said in a warning; a copy
	 * device 1 runs out of it faults.  With three devices
	 * (cuda_copy_3dev_emul) the driver refuses device 1 only: device 2
	 * keeps its access (one call for the pair, then one each), and the
	 * warning names device 1 alone. */
	const int three = gpu_count() >= 3 && gpu_can_peer(2, 0);
	{
		unsigned long calls = emul_calls("cuMemSetAccess");
		char log[4096], want[256];
		ssize_t got;
		int fd = memfd_create("log", MFD_CLOEXEC), saved, ret;

		CHECK(fd >= 0);
		fflush(stderr);
		saved = dup(2);
		CHECK(saved >= 0 && dup2(fd, 2) == 2);
		if (three)
			setenv("WEX_EMUL_REFUSE_ACCESS", "1", 1);
		else
			emul_fail("cuMemSetAccess", 2, CUDA_ERROR_INVALID_VALUE);
		/* (Checked once stderr is back: a failure said into the log
		 * would go unseen.) */
		ret = wex_cuda_malloc(n, 0, &p);
		fflush(stderr);
		CHECK(dup2(saved, 2) == 2);
		close(saved);
		got = pread(fd, log, sizeof(log) - 1, 0);
		close(fd);
		log[got > 0 ? got : 0] = '\0';
		fputs(log, stderr);
		unsetenv("WEX_EMUL_REFUSE_ACCESS");
		CHECK_OK(ret);
		CHECK(got > 0);
		/* Its own device's access, then the peers' (refused), then
		 * each peer alone where there were two. */
		CHECK(emul_calls("cuMemSetAccess") == calls + (three ? 4 : 2));
		snprintf(want, sizeof(want),
			 "giving device(s) 1, with peer access to device 0, access to memory "
			 "allocated there was refused (cuMemSetAccess: %s)",
			 three ? "CUDA_ERROR_NOT_SUPPORTED" : "CUDA_ERROR_INVALID_VALUE");
		CHECK(strstr(log, want) != NULL);
	}
	if (three) {
		/* Device 2 reaches it still. */
		CHECK_OK(wex__cuda_use_device(0));
		dev_fill((uint64_t)(uintptr_t)p, n, 4);
		CHECK(copy_out_on(2, p, n, 4) == CUDA_SUCCESS);
	}
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)p, n, 3);
	CHECK(dev_check((uint64_t)(uintptr_t)p, n, 3, 0));
	CHECK(copy_out_on(1, p, n, 3) == CUDA_ERROR_ILLEGAL_ADDRESS);
	CHECK_OK(wex__cuda_use_device(0));
	wex_cuda_free(p, n, 0, NULL);
}

/* VMM memory of `size` bytes on device `dev` that only `dev` may reach
 * (what expandable_segments:True gives an engine on one GPU: PyTorch
 * grants no peer access unless asked); *h and *va for engine_free. */
static CUdeviceptr engine_vmm(int dev, uint64_t size, CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc acc = gpu_rw_access();
	CUdeviceptr va = 0;

	prop.location.id = dev;
	acc.location.id = dev;
	CHECK_OK(wex__cuda_use_device(dev));
	CU_OK(wex__cu.cuMemAddressReserve(&va, size, 0, 0, 0));
	CU_OK(wex__cu.cuMemCreate(h, size, &prop, 0));
	CU_OK(wex__cu.cuMemMap(va, size, 0, *h, 0));
	CU_OK(wex__cu.cuMemSetAccess(va, size, &acc, 1));
	return va;
}

static void engine_free(CUdeviceptr va, uint64_t size, CUmemGenericAllocationHandle h)
{
	CU_OK(wex__cu.cuMemUnmap(va, size));
	CU_OK(wex__cu.cuMemRelease(h));
	CU_OK(wex__cu.cuMemAddressFree(va, size));
}

/* 1 when the n host bytes at h hold dev_fill(seed)'s pattern from `from`. */
static int host_check(const unsigned char *h, size_t n, unsigned seed, size_t from)
{
	for (size_t i = 0; i < n; i++) {
		size_t k = i + from;

		if (h[i] != (unsigned char)(k * 131u + seed * 7u + (k >> 12))) {
			fprintf(stderr, "host byte %zu: %u != expected\n", i, h[i]);
			return 0;
		}
	}
	return 1;
}

/* A layout mixing host pieces (weights offloaded to CPU memory) with GPU
 * pieces in VMM memory only device 0 reaches, filled from a producer on
 * device 1 whose memory device 0 may read (an import mapped for the
 * layout's device, as wex maps it): the copies into device 0's memory run
 * on device 0 whatever op comes first, also when the sources lie on both
 * devices.  (Run on device 1, the copy engine would fault on memory that
 * device was given no access to: CUDA_ERROR_ILLEGAL_ADDRESS, a sticky
 * error that ends the engine's context.) */
static void mixed_layout(void)
{
	const uint64_t g = gpu_granularity(), half = 1u << 20;
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	CUmemGenericAllocationHandle h;
	unsigned char *host = malloc(2 * half);
	void *p1 = NULL, *p0 = NULL;
	CUdeviceptr eng;

	CHECK(host);
	if (gpu_count() < 2 || !gpu_can_peer(0, 1) || !gpu_can_peer(1, 0)) {
		printf("  no second device with peer access: not tried\n");
		free(host);
		return;
	}
	/* The producer's memory on device 1 (device 0 given access, as the
	 * import for the layout's device is), and some on device 0. */
	CHECK_OK(wex_cuda_malloc(2 * half, 1, &p1));
	CHECK_OK(wex__cuda_use_device(1));
	dev_fill((uint64_t)(uintptr_t)p1, 2 * half, 6);
	CHECK_OK(wex_cuda_malloc(half, 0, &p0));
	CHECK_OK(wex__cuda_use_device(0));
	dev_fill((uint64_t)(uintptr_t)p0, half, 7);
	eng = engine_vmm(0, g, &h);
	/* Host piece first, then the GPU piece; one producer device. */
	{
		struct wex_copy_op o[2] = {
			{ .src = (uint64_t)(uintptr_t)p1, .dst = (uint64_t)(uintptr_t)host,
			  .len = half },
			{ .src = (uint64_t)(uintptr_t)p1 + half, .dst = eng, .len = half },
		};

		memset(host, 0, 2 * half);
		CHECK_OK(vmm->copy(o, 2, 1));
		CHECK(host_check(host, half, 6, 0));
		CHECK_OK(wex__cuda_use_device(0));
		CHECK(dev_check(eng, half, 6, half));
	}
	/* A host piece filled from host memory first (nothing on a GPU
	 * there), then the GPU piece; the calling thread on device 1. */
	CHECK_OK(wex__cuda_use_device(1));
	{
		struct wex_copy_op o[2] = {
			{ .src = (uint64_t)(uintptr_t)host, .dst = (uint64_t)(uintptr_t)host + half,
			  .len = half },
			{ .src = (uint64_t)(uintptr_t)p1, .dst = eng, .len = half },
		};

		CHECK_OK(vmm->copy(o, 2, 1));
		CHECK(host_check(host + half, half, 6, 0));
		CHECK_OK(wex__cuda_use_device(0));
		CHECK(dev_check(eng, half, 6, 0));
	}
	/* Sources on both devices (the host pieces' copies spread over
	 * them), the GPU piece's source on device 1. */
	{
		struct wex_copy_op o[3] = {
			{ .src = (uint64_t)(uintptr_t)p0, .dst = (uint64_t)(uintptr_t)host,
			  .len = half },
			{ .src = (uint64_t)(uintptr_t)p1, .dst = (uint64_t)(uintptr_t)host + half,
			  .len = half },
			{ .src = (uint64_t)(uintptr_t)p1 + half, .dst = eng, .len = half },
		};

		memset(host, 0, 2 * half);
		CHECK_OK(vmm->copy(o, 3, 1));
		CHECK(host_check(host, half, 7, 0));
		CHECK(host_check(host + half, half, 6, 0));
		CHECK_OK(wex__cuda_use_device(0));
		CHECK(dev_check(eng, half, 6, half));
	}
	CHECK_OK(wex__cuda_use_device(0));
	engine_free(eng, g, h);
	wex_cuda_free(p0, half, 0, NULL);
	wex_cuda_free(p1, 2 * half, 1, NULL);
	free(host);
}

/*
 * Emulated driver only (WEX_EMUL_DEFER=1): a synchronous cuMemcpyDtoH runs
 * on the legacy stream, which waits for its context's blocking streams
 * but not for a CU_STREAM_NON_BLOCKING stream such as the executor's
 * ("Stream synchronization behavior" in the driver API reference).  So a
 * read-back through it must not see a 1D, 2D or batched copy still queued
 * on a non-blocking stream; otherwise every test that checks bytes that
 * way would pass with the executor's (or a lease's) wait missing.  On a
 * GPU the queued copy may have finished: not asserted there.
 */
/* Copy calls the emulated driver saw (-1 on a GPU). */
static long long copy_calls(void)
{
	unsigned long long (*f)(void) =
		(unsigned long long (*)(void))(uintptr_t)emul_sym("wex_emul_copy_calls");

	return f ? (long long)f() : -1;
}

static void unfolded_op(void)
{
	enum { N = 1 << 16 };
	struct bufs b;
	struct wex_copy_op op = { .len = 256, .nouter = 3, .count = { 4, 1, 32 },
				  .src_stride = { 16384, 0, 512 }, .dst_stride = { 8192, 0, 256 } };
	long long before;

	bufs_open(&b, N, 3, 4);
	op.src = (uint64_t)(uintptr_t)b.hs;
	op.dst = (uint64_t)(uintptr_t)b.hd;
	CHECK_OK(wex_mem_host_copy(&op, 1, 1));
	op.src = b.ds;
	op.dst = b.dd;
	before = copy_calls();
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(&op, 1, 1));
	if (before >= 0) {
		printf("  unfolded op: %lld copy call(s)\n", copy_calls() - before);
		CHECK(copy_calls() - before == 1);
	}
	CU_OK(wex__cu.cuMemcpyDtoH(b.out, b.dd, N));
	CHECK(memcmp(b.out, b.hd, N) == 0);
	bufs_close(&b);
}

static void sync_copy_waits(void)
{
	enum { N = 1 << 16 };
	const char *defer = getenv("WEX_EMUL_DEFER");
	CUdeviceptr ds, dd[3];
	CUstream nb, bl;

	CHECK_OK(wex__cuda_use_device(0)); /* (loads the driver emulated() asks) */
	if (!emulated() || !defer || strcmp(defer, "1")) {
		printf("  not the emulated driver with WEX_EMUL_DEFER=1: not tried\n");
		return;
	}
	CU_OK(wex__cu.cuMemAlloc(&ds, N));
	for (int i = 0; i < 3; i++) {
		CU_OK(wex__cu.cuMemAlloc(&dd[i], N));
		dev_fill(dd[i], N, 2);
	}
	dev_fill(ds, N, 1);
	CU_OK(wex__cu.cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuStreamCreate(&bl, 0));
	/* 1D, 2D (rows of 256 bytes) and a batch of two, non-blocking. */
	CU_OK(wex__cu.cuMemcpyAsync(dd[0], ds, N, nb));
	{
		CUDA_MEMCPY2D c = {
			.srcMemoryType = CU_MEMORYTYPE_UNIFIED, .srcDevice = ds, .srcPitch = 256,
			.dstMemoryType = CU_MEMORYTYPE_UNIFIED, .dstDevice = dd[1], .dstPitch = 256,
			.WidthInBytes = 256, .Height = N / 256,
		};

		CU_OK(wex__cu.cuMemcpy2DAsync(&c, nb));
	}
	if (batched()) {
		CUmemcpyAttributes attr = { .srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM };
		CUdeviceptr dst[2] = { dd[2], dd[2] + N / 2 }, src[2] = { ds, ds + N / 2 };
		size_t len[2] = { N / 2, N / 2 }, idx = 0, fail = 0;

		if (wex__cu.cuMemcpyBatchAsync13)
			CU_OK(wex__cu.cuMemcpyBatchAsync13(dst, src, len, 2, &attr, &idx, 1, nb));
		else
			CU_OK(wex__cu.cuMemcpyBatchAsync12(dst, src, len, 2, &attr, &idx, 1, &fail, nb));
	}
	for (int i = 0; i < 3; i++)
		CHECK(dev_check(dd[i], N, 2, 0)); /* still the old bytes */
	CU_OK(wex__cu.cuStreamSynchronize(nb));
	for (int i = 0; i < (batched() ? 3 : 2); i++)
		CHECK(dev_check(dd[i], N, 1, 0));
	/* A blocking stream's copy: the legacy stream waits for it. */
	dev_fill(dd[0], N, 2);
	CU_OK(wex__cu.cuMemcpyAsync(dd[0], ds, N, bl));
	CHECK(dev_check(dd[0], N, 1, 0));
	CU_OK(wex__cu.cuStreamDestroy(nb));
	CU_OK(wex__cu.cuStreamDestroy(bl));
	for (int i = 0; i < 3; i++)
		CU_OK(wex__cu.cuMemFree(dd[i]));
	CU_OK(wex__cu.cuMemFree(ds));
}

int main(void)
{
	int ret;

	gpu_require();
	ret = run_one("host_ptr_no_context", host_ptr_no_context);
	ret |= run_one("no_context_thread_device1", no_context_thread_device1);
	ret |= run_one("strided_copy", test);
	ret |= run_one("random_shapes", random_shapes);
	ret |= run_one("memcpy3d_offsets", memcpy3d_offsets);
	ret |= run_one("huge_pitch", huge_pitch);
	ret |= run_one("peer_reads_alloc", peer_reads_alloc);
	ret |= run_one("mixed_layout", mixed_layout);
	ret |= run_one("unfolded_op", unfolded_op);
	ret |= run_one("sync_copy_waits", sync_copy_waits);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
