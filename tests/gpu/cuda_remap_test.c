/* SPDX-License-Identifier: MIT */
/*
 * cuda_remap_test.c - same-address remap on a GPU (label gpu; 77 without a
 * device).  The consumer reserves a region, fills its own memory with
 * pattern A and captures a CUDA graph whose kernel (a tiny PTX copy loaded
 * with cuModuleLoadData) reads the region.  Then map_fixed swaps in the
 * producer's memory (pattern B) under the same addresses: the graph,
 * captured before the swap, reads B; the consumer's own physical memory is
 * released meanwhile (free memory does not drop).  unmap_fixed gives the
 * region its own memory again holding B, which stays B when the producer
 * then overwrites its memory with C.
 *
 * lead: a segment that starts inside its first allocation (as a tensor of
 * PyTorch's expandable segments does), over two allocations of 1 and 2
 * granules.  The region is reserved with that lead: map_fixed maps both
 * allocations from offset 0 (the driver's rule; the emulated driver
 * refuses other offsets), the second one only in part, and the segment's
 * first byte shows at r->addr.  Also: map_fixed with another offset is
 * refused before anything changes; producer memory under the region is
 * read-only (a CPU store faults, emulated); unmap_fixed keeps the bytes;
 * unreserve of a region still showing the producer frees it without a
 * copy; on the emulated driver, a swap failing half-way either leaves the
 * region as it was or says -WEX_EDIRTY with the region on memory of its
 * own, or, with no memory even for that, marks it lost (unmap_fixed gives
 * it fresh memory later, map_fixed can still map there); a region on the other device shows the producer's memory through
 * peer access, and is refused without.
 *
 * capture_elsewhere: wex's public calls run in RELAXED stream capture
 * mode (given back after): wex_cuda_alloc's allocation beside a
 * GLOBAL-mode capture in another thread neither fails nor invalidates it;
 * emulated, a cuMemAlloc made without wex does both.  (Synchronising the
 * capturing context, as wex_cuda_free does, is invalid in any mode.)
 */
#include <pthread.h>

#include "gpu_util.h"

enum { OP_SEG = 1, OP_MAPPED, OP_CHANGED, OP_DONE };

#define RSZ (4u << 20)

static void producer(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg seg;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK_OK(vmm->alloc(RSZ, 0, &seg));
	dev_fill((uint64_t)(uintptr_t)seg.ptr, RSZ, 2); /* B */
	tsend(sock, OP_SEG, &seg.desc, 0, seg.fd);
	trecv(sock, OP_MAPPED, NULL);
	dev_fill((uint64_t)(uintptr_t)seg.ptr, RSZ, 3); /* C */
	tsend(sock, OP_CHANGED, NULL, 0, -1);
	trecv(sock, OP_DONE, NULL);
	CHECK_OK(vmm->release(&seg));
}

static void run_graph(CUgraphExec ge, CUstream s)
{
	CU_OK(wex__cu.cuGraphLaunch(ge, s));
	CU_OK(wex__cu.cuStreamSynchronize(s));
}

static void consumer(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_region r;
	struct wex_mem_seg seg;
	CUmodule mod;
	CUfunction fn;
	CUstream s;
	CUgraph g;
	CUgraphExec ge;
	CUdeviceptr out;
	uint64_t free_before, free_after;
	unsigned n = RSZ / 4;
	void *args[3];
	uint64_t src;
	struct tmsg m;
	int fd;

	CHECK_OK(wex__cuda_use_device(0));
	/* Optional in the loader; every driver since CUDA 11.4 has them. */
	CHECK(wex__cu.cuModuleLoadData && wex__cu.cuStreamBeginCapture &&
	      wex__cu.cuGraphInstantiateWithFlags);
	CHECK_OK(vmm->reserve(RSZ, 0, 0, &r));
	CHECK(r.size >= RSZ && r.addr && !r.fixed);
	dev_fill((uint64_t)(uintptr_t)r.addr, RSZ, 1); /* A */
	CU_OK(wex__cu.cuModuleLoadData(&mod, test_copy_ptx()));
	CU_OK(wex__cu.cuModuleGetFunction(&fn, mod, "wex_copy_u32"));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuMemAlloc(&out, RSZ));
	src = (uint64_t)(uintptr_t)r.addr;
	args[0] = &src;
	args[1] = &out;
	args[2] = &n;
	/* The graph bakes in the region's address. */
	CU_OK(wex__cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
	CU_OK(wex__cu.cuLaunchKernel(fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
	CU_OK(wex__cu.cuStreamEndCapture(s, &g));
	CU_OK(wex__cu.cuGraphInstantiateWithFlags(&ge, g, 0));
	run_graph(ge, s);
	CHECK(dev_check(out, RSZ, 1, 0));

	m = trecv(sock, OP_SEG, &fd);
	CHECK_OK(vmm->import(&m.desc, fd, -1, &seg));
	free_before = mem_free();
	CHECK_OK(vmm->map_fixed(&r, &seg, 0));
	CHECK(r.fixed);
	/* Read-write only where the driver refused read-only (reported). */
	CHECK(r.rw == !wex__cuda_vmm_readonly());
	free_after = mem_free();
	printf("  free before map_fixed %llu MiB, after %llu MiB\n",
	       (unsigned long long)(free_before >> 20), (unsigned long long)(free_after >> 20));
	/* Our own pages (RSZ) went back to the driver: no extra memory
	 * (2 MiB for what the driver may take for the new mapping; not
	 * under compute-sanitizer, whose own device memory moves too). */
	if (!under_sanitizer())
		CHECK(free_after + (2u << 20) >= free_before + RSZ);
	/* The mapping keeps the producer's memory; the import may go. */
	CHECK_OK(vmm->release(&seg));
	run_graph(ge, s);
	CHECK(dev_check(out, RSZ, 2, 0));

	CHECK_OK(vmm->unmap_fixed(&r));
	CHECK(!r.fixed && !r.rw);
	CHECK(dev_check((uint64_t)(uintptr_t)r.addr, RSZ, 2, 0));
	tsend(sock, OP_MAPPED, NULL, 0, -1);
	trecv(sock, OP_CHANGED, NULL);
	/* Private again: the producer's new bytes do not show. */
	run_graph(ge, s);
	CHECK(dev_check(out, RSZ, 2, 0));
	CHECK(dev_check((uint64_t)(uintptr_t)r.addr, RSZ, 2, 0));

	CU_OK(wex__cu.cuGraphExecDestroy(ge));
	CU_OK(wex__cu.cuGraphDestroy(g));
	CU_OK(wex__cu.cuModuleUnload(mod));
	CU_OK(wex__cu.cuStreamDestroy(s));
	CU_OK(wex__cu.cuMemFree(out));
	CHECK_OK(vmm->unreserve(&r));
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* Where the segment starts in its first allocation: off the granularity,
 * so the old scheme (map from this offset) could not work anywhere. */
#define LEAD ((1u << 20) + 8192u)

static void p_lead(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	CUmemAllocationProp prop = gpu_vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc acc = gpu_rw_access();
	CUmemGenericAllocationHandle h[2];
	struct wex_mem_seg w[2];
	uint64_t g, sz[2];
	CUdeviceptr va;
	size_t n = 0;

	CHECK_OK(wex__cuda_use_device(0));
	g = gpu_granularity();
	sz[0] = g;
	sz[1] = 2 * g;
	CU_OK(wex__cu.cuMemAddressReserve(&va, 3 * g, g, 0, 0));
	for (int i = 0; i < 2; i++) {
		CU_OK(wex__cu.cuMemCreate(&h[i], sz[i], &prop, 0));
		CU_OK(wex__cu.cuMemMap(va + (i ? g : 0), sz[i], 0, h[i], 0));
	}
	CU_OK(wex__cu.cuMemSetAccess(va, 3 * g, &acc, 1));
	dev_fill(va, 3 * g, 21);
	CHECK_OK(vmm->wrap_chunks((void *)(uintptr_t)(va + LEAD), 3 * g - LEAD, w, 2, &n));
	CHECK(n == 2 && w[0].desc.handle_offset == LEAD);
	tsend(sock, OP_SEG, &w[0].desc, 0, w[0].fd);
	tsend(sock, OP_SEG, &w[1].desc, 0, w[1].fd);
	trecv(sock, OP_DONE, NULL);
	/* Unchanged by everything the consumer did. */
	CHECK(dev_check(va, 3 * g, 21, 0));
	for (int i = 0; i < 2; i++) {
		CHECK_OK(vmm->release(&w[i]));
		CU_OK(wex__cu.cuMemUnmap(va + (i ? g : 0), sz[i]));
		CU_OK(wex__cu.cuMemRelease(h[i]));
	}
	CU_OK(wex__cu.cuMemAddressFree(va, 3 * g));
}

static void c_lead(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_desc ds[2];
	struct wex_mem_region r, r2;
	struct wex_mem_seg seg;
	uint64_t g, free0;
	unsigned long creates;
	int fds[2], ret;

	CHECK_OK(wex__cuda_use_device(0));
	g = gpu_granularity();
	ds[0] = trecv(sock, OP_SEG, &fds[0]).desc;
	ds[1] = trecv(sock, OP_SEG, &fds[1]).desc;
	CHECK_OK(wex__cuda_vmm_import_chunks(ds, fds, 2, -1, &seg));
	CHECK(seg.desc.handle_offset == LEAD);

	/* 1. The region: g usable bytes from r.addr, LEAD reserved below. */
	CHECK_OK(vmm->reserve(g, LEAD, 0, &r));
	CHECK(r.lead == LEAD && r.size >= g && !r.fixed);
	CHECK(((uint64_t)(uintptr_t)r.addr - LEAD) % g == 0);
	dev_fill((uint64_t)(uintptr_t)r.addr, r.size, 1); /* A */
	/* 2. Another offset: refused, nothing changed. */
	CHECK(vmm->map_fixed(&r, &seg, 0) == -EINVAL);
	CHECK(!r.fixed && dev_check((uint64_t)(uintptr_t)r.addr, r.size, 1, 0));
	/* 3. The lead: both allocations from offset 0, the second in part
	 * (2 granules reserved, 3 in the segment's allocations). */
	CHECK_OK(vmm->map_fixed(&r, &seg, LEAD));
	CHECK(r.fixed);
	CHECK(dev_check((uint64_t)(uintptr_t)r.addr, r.size, 21, LEAD));
	CHECK_STORE(r.addr, 1);
	/* 4. Back to memory of its own, holding the same bytes. */
	CHECK_OK(vmm->unmap_fixed(&r));
	CHECK(!r.fixed && dev_check((uint64_t)(uintptr_t)r.addr, r.size, 21, LEAD));
	/* 5. Dropped while showing the producer: no copy, no new memory. */
	CHECK_OK(vmm->map_fixed(&r, &seg, LEAD));
	free0 = mem_free();
	creates = emul_calls("cuMemCreate");
	CHECK_OK(vmm->unreserve(&r));
	CHECK(!r.fixed && r.addr == NULL);
	CHECK(mem_free() + (2u << 20) >= free0);
	CHECK(emul_calls("cuMemCreate") == creates);

	if (emulated()) {
		/* 6. A swap that fails half-way (the second allocation's
		 * cuMemMap) from private memory: the region is as it was. */
		CHECK_OK(vmm->reserve(g, LEAD, 0, &r2));
		CHECK_OK(wex__cuda_use_device(0));
		dev_fill((uint64_t)(uintptr_t)r2.addr, r2.size, 2);
		emul_fail("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);
		ret = vmm->map_fixed(&r2, &seg, LEAD);
		CHECK(ret < 0 && ret != -WEX_EDIRTY && !r2.fixed);
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 2, 0));
		/* 7. From the producer's memory (own memory given back): the
		 * bytes are lost, the region gets fresh memory: -WEX_EDIRTY. */
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		emul_fail("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(vmm->map_fixed(&r2, &seg, LEAD) == -WEX_EDIRTY);
		CHECK(!r2.fixed);
		dev_fill((uint64_t)(uintptr_t)r2.addr, r2.size, 3); /* usable */
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 3, 0));
		CHECK(!r2.lost);
		/* 7b. The same with no memory for a fresh allocation either:
		 * lost, nothing writable there; unmap_fixed tries again,
		 * returning the driver's error while it still cannot. */
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		emul_fail("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
		emul_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(vmm->map_fixed(&r2, &seg, LEAD) == -WEX_EDIRTY);
		CHECK(!r2.fixed && r2.lost);
		CHECK_STORE(r2.addr, 1);
		emul_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(vmm->unmap_fixed(&r2) == -ENOMEM && r2.lost);
		CHECK(vmm->unmap_fixed(&r2) == -WEX_EDIRTY && !r2.lost && !r2.fixed);
		dev_fill((uint64_t)(uintptr_t)r2.addr, r2.size, 4);
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 4, 0));
		CHECK_OK(vmm->unmap_fixed(&r2)); /* nothing to do now */
		/* Lost with fresh memory mapped but no access granted (its
		 * cuMemSetAccess refused): the retry grants it and says the
		 * bytes are lost, although the memory existed already. */
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		emul_fail("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
		emul_fail("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(vmm->map_fixed(&r2, &seg, LEAD) == -WEX_EDIRTY);
		CHECK(!r2.fixed && r2.lost);
		CHECK_STORE(r2.addr, 1);
		CHECK(vmm->unmap_fixed(&r2) == -WEX_EDIRTY && !r2.lost);
		dev_fill((uint64_t)(uintptr_t)r2.addr, r2.size, 5);
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 5, 0));
		/* A lost region can still show the producer's memory. */
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		emul_fail("cuMemMap", 1, CUDA_ERROR_OUT_OF_MEMORY);
		emul_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(vmm->map_fixed(&r2, &seg, LEAD) == -WEX_EDIRTY && r2.lost);
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		CHECK(r2.fixed && !r2.lost);
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 21, LEAD));
		CHECK_OK(vmm->unmap_fixed(&r2));
		/* 8. unmap_fixed failing before the swap: still showing the
		 * producer; failing at the swap's cuMemMap and retried: done. */
		CHECK_OK(vmm->map_fixed(&r2, &seg, LEAD));
		emul_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY);
		ret = vmm->unmap_fixed(&r2);
		CHECK(ret < 0 && ret != -WEX_EDIRTY && r2.fixed);
		CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 21, LEAD));
		emul_fail("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK_OK(vmm->unmap_fixed(&r2));
		CHECK(!r2.fixed && dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 21, LEAD));
		CHECK_OK(vmm->unreserve(&r2));
		printf("  failed swaps: region unchanged, or -WEX_EDIRTY on memory of its own\n");
	}

	/* 9. A region on the other device, through peer access. */
	if (gpu_count() > 1) {
		CHECK_OK(vmm->reserve(g, LEAD, 1, &r2));
		ret = vmm->map_fixed(&r2, &seg, LEAD);
		if (!gpu_can_peer(1, 0)) {
			CHECK(ret == -EOPNOTSUPP && !r2.fixed);
		} else {
			CHECK_OK(ret);
			CHECK_OK(wex__cuda_use_device(1));
			CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 21, LEAD));
			CHECK_OK(vmm->unmap_fixed(&r2));
			CHECK_OK(wex__cuda_use_device(1));
			CHECK(dev_check((uint64_t)(uintptr_t)r2.addr, r2.size, 21, LEAD));
			if (emulated()) {
				setenv("WEX_EMUL_NO_P2P", "1", 1);
				CHECK(vmm->map_fixed(&r2, &seg, LEAD) == -EOPNOTSUPP && !r2.fixed);
				unsetenv("WEX_EMUL_NO_P2P");
			}
		}
		CHECK_OK(vmm->unreserve(&r2));
		printf("  region on device 1 over device 0's memory: %s\n",
		       ret ? "refused (no peer access)" : "mapped");
	}
	CHECK_OK(vmm->release(&seg));
	tsend(sock, OP_DONE, NULL, 0, -1);
}

/* A thread of the engine capturing a CUDA graph (GLOBAL mode, the
 * default) while this one calls wex: one capture per round, the two
 * threads taking turns. */
struct capturer {
	pthread_mutex_t m;
	pthread_cond_t c;
	int step;     /* 1 capturing, 2 the other thread is done, 3 ended */
	CUresult end; /* cuStreamEndCapture's */
	CUfunction fn;
	CUdeviceptr src, dst;
};

static void step_to(struct capturer *k, int step)
{
	pthread_mutex_lock(&k->m);
	k->step = step;
	pthread_cond_broadcast(&k->c);
	pthread_mutex_unlock(&k->m);
}

static void wait_step(struct capturer *k, int step)
{
	pthread_mutex_lock(&k->m);
	while (k->step < step)
		pthread_cond_wait(&k->c, &k->m);
	pthread_mutex_unlock(&k->m);
}

static void *capture_thread(void *arg)
{
	struct capturer *k = arg;
	unsigned n = 4096 / 4;
	void *args[3] = { &k->src, &k->dst, &n };
	CUgraphExec ge;
	CUstream s;
	CUgraph g;

	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CU_OK(wex__cu.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	CU_OK(wex__cu.cuLaunchKernel(k->fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, NULL));
	step_to(k, 1);
	wait_step(k, 2);
	k->end = wex__cu.cuStreamEndCapture(s, &g);
	if (k->end == CUDA_SUCCESS) {
		CU_OK(wex__cu.cuGraphInstantiateWithFlags(&ge, g, 0));
		CU_OK(wex__cu.cuGraphLaunch(ge, s));
		CU_OK(wex__cu.cuStreamSynchronize(s));
		CU_OK(wex__cu.cuGraphExecDestroy(ge));
		CU_OK(wex__cu.cuGraphDestroy(g));
	}
	CU_OK(wex__cu.cuStreamDestroy(s));
	step_to(k, 3);
	return NULL;
}

/* Runs work() in this thread while another captures; the capture's end. */
static CUresult beside_capture(struct capturer *k, void (*work)(void))
{
	pthread_t t;

	k->step = 0;
	CHECK(pthread_create(&t, NULL, capture_thread, k) == 0);
	wait_step(k, 1);
	work();
	step_to(k, 2);
	CHECK(pthread_join(t, NULL) == 0);
	return k->end;
}

/* wex_cuda_alloc: cuMemCreate and friends, allocations a capture in
 * GLOBAL mode forbids to other threads in GLOBAL mode.  Nothing else here:
 * a query of the test's own could break the capture.  Freed after the
 * capture (the free synchronises the context, invalid during a capture in
 * any mode). */
static void *wex_work_p;

static void wex_work(void)
{
	wex_work_p = wex_cuda_alloc(2u << 20, 0, NULL);
}

static CUresult raw_sync_result;

static void raw_work(void)
{
	CUdeviceptr p = 0;

	raw_sync_result = wex__cu.cuMemAlloc(&p, 4096);
	if (raw_sync_result == CUDA_SUCCESS)
		wex__cu.cuMemFree(p);
}

/*
 * capture_elsewhere: wex's calls switch their thread to RELAXED capture
 * mode (and back): wex_cuda_alloc's allocation while another thread
 * captures a graph in GLOBAL mode neither fails nor invalidates the
 * capture, whose graph then runs; the thread's mode is GLOBAL again
 * afterwards.  Emulated, the control: a cuMemAlloc made without wex fails
 * and invalidates the capture.
 */
static void capture_elsewhere(void)
{
	struct capturer k = { .m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER };
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
	unsigned long creates;
	CUmodule mod;
	CUresult r;

	CHECK_OK(wex__cuda_use_device(0));
	CHECK(wex__cu.cuThreadExchangeStreamCaptureMode);
	CU_OK(wex__cu.cuModuleLoadData(&mod, test_copy_ptx()));
	CU_OK(wex__cu.cuModuleGetFunction(&k.fn, mod, "wex_copy_u32"));
	CU_OK(wex__cu.cuMemAlloc(&k.src, 4096));
	CU_OK(wex__cu.cuMemAlloc(&k.dst, 4096));
	dev_fill(k.src, 4096, 9);
	dev_fill(k.dst, 4096, 1);

	creates = emul_calls("cuMemCreate");
	r = beside_capture(&k, wex_work);
	printf("  wex_cuda_alloc beside a GLOBAL capture: end capture %s\n",
	       wex__cuda_errname(r));
	CHECK(r == CUDA_SUCCESS);
	CHECK(wex_work_p != NULL);
	CHECK(!emulated() || emul_calls("cuMemCreate") > creates); /* it did allocate */
	CHECK(dev_check(k.dst, 4096, 9, 0));                       /* the graph did run */
	wex_cuda_free(wex_work_p, 2u << 20, 0, NULL);
	CU_OK(wex__cu.cuThreadExchangeStreamCaptureMode(&mode));
	CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL); /* given back */

	if (emulated()) {
		r = beside_capture(&k, raw_work);
		printf("  cuMemAlloc without wex beside it: %s, end capture %s\n",
		       wex__cuda_errname(raw_sync_result), wex__cuda_errname(r));
		CHECK(raw_sync_result == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
		CHECK(r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	} else {
		printf("  control without wex: not tried on a GPU\n");
	}
	CU_OK(wex__cu.cuMemFree(k.src));
	CU_OK(wex__cu.cuMemFree(k.dst));
	CU_OK(wex__cu.cuModuleUnload(mod));
}

int main(void)
{
	int ret;

	gpu_require();
	ret = run_pair("same_address_graph", producer, consumer);
	ret |= run_pair("lead", p_lead, c_lead);
	ret |= run_one("capture_elsewhere", capture_elsewhere);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
