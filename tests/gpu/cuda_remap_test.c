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
 */
#include "gpu_util.h"

enum { OP_SEG = 1, OP_MAPPED, OP_CHANGED, OP_DONE };

static const char ptx[] =
	".version 7.0\n"
	".target sm_80\n"
	".address_size 64\n"
	"\n"
	".visible .entry wex_copy_u32(\n"
	"	.param .u64 p_src,\n"
	"	.param .u64 p_dst,\n"
	"	.param .u32 p_n\n"
	")\n"
	"{\n"
	"	.reg .pred %p<2>;\n"
	"	.reg .b32 %r<7>;\n"
	"	.reg .b64 %rd<8>;\n"
	"\n"
	"	ld.param.u64 %rd1, [p_src];\n"
	"	ld.param.u64 %rd2, [p_dst];\n"
	"	ld.param.u32 %r1, [p_n];\n"
	"	mov.u32 %r2, %ctaid.x;\n"
	"	mov.u32 %r3, %ntid.x;\n"
	"	mov.u32 %r4, %tid.x;\n"
	"	mad.lo.s32 %r5, %r2, %r3, %r4;\n"
	"	setp.ge.u32 %p1, %r5, %r1;\n"
	"	@%p1 bra DONE;\n"
	"	cvta.to.global.u64 %rd3, %rd1;\n"
	"	cvta.to.global.u64 %rd4, %rd2;\n"
	"	mul.wide.u32 %rd5, %r5, 4;\n"
	"	add.s64 %rd6, %rd3, %rd5;\n"
	"	add.s64 %rd7, %rd4, %rd5;\n"
	"	ld.global.u32 %r6, [%rd6];\n"
	"	st.global.u32 [%rd7], %r6;\n"
	"DONE:\n"
	"	ret;\n"
	"}\n";

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
	CHECK_OK(vmm->reserve(RSZ, 0, &r));
	CHECK(r.size >= RSZ && r.addr && !r.fixed);
	dev_fill((uint64_t)(uintptr_t)r.addr, RSZ, 1); /* A */
	CU_OK(wex__cu.cuModuleLoadData(&mod, ptx));
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
	CHECK_OK(vmm->import(&m.desc, fd, &seg));
	free_before = mem_free();
	CHECK_OK(vmm->map_fixed(&r, &seg, 0));
	CHECK(r.fixed);
	free_after = mem_free();
	printf("  free before map_fixed %llu MiB, after %llu MiB\n",
	       (unsigned long long)(free_before >> 20), (unsigned long long)(free_after >> 20));
	/* Our own pages went back to the driver: no extra memory. */
	CHECK(free_after + (2u << 20) >= free_before);
	/* The mapping keeps the producer's memory; the import may go. */
	CHECK_OK(vmm->release(&seg));
	run_graph(ge, s);
	CHECK(dev_check(out, RSZ, 2, 0));

	CHECK_OK(vmm->unmap_fixed(&r));
	CHECK(!r.fixed);
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

int main(void)
{
	int ret;

	gpu_require();
	ret = run_pair("same_address_graph", producer, consumer);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
