/* SPDX-License-Identifier: MIT */
/*
 * cuda_copy_test.c - the GPU copy executor against the host executor (label
 * gpu; 77 without a device).  The same wex_copy_op list runs on host copies
 * of the buffers (wex_mem_host_copy, the reference) and on the device;
 * the results must be byte-identical.  Shapes: contiguous, strided rows
 * (2D), two levels with compatible strides (3D), two levels that 3D cannot
 * express, three levels, contiguous-in-disguise, zero counts, pitches
 * below the row length (overlapping source rows), and > 4096 small ops
 * (several cuMemcpyBatchAsync calls).
 */
#include "gpu_util.h"

#define BUF (16u << 20)

static struct wex_copy_op ops[6000];
static size_t nops;

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

static void test(void)
{
	unsigned char *hs = malloc(BUF), *hd = malloc(BUF), *out = malloc(BUF);
	CUdeviceptr ds, dd;

	CHECK(hs && hd && out);
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuMemAlloc(&ds, BUF));
	CU_OK(wex__cu.cuMemAlloc(&dd, BUF));
	dev_fill(ds, BUF, 1);
	dev_fill(dd, BUF, 2);
	CU_OK(wex__cu.cuMemcpyDtoH(hs, ds, BUF));
	CU_OK(wex__cu.cuMemcpyDtoH(hd, dd, BUF));
	build();
	rebase((uint64_t)(uintptr_t)hs, (uint64_t)(uintptr_t)hd);
	CHECK_OK(wex_mem_host_copy(ops, nops, 1));
	unbase((uint64_t)(uintptr_t)hs, (uint64_t)(uintptr_t)hd);
	rebase(ds, dd);
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_VMM)->copy(ops, nops, 1));
	CU_OK(wex__cu.cuMemcpyDtoH(out, dd, BUF));
	for (size_t i = 0; i < BUF; i++)
		if (out[i] != hd[i]) {
			fprintf(stderr, "byte %zu differs: gpu %u host %u\n", i, out[i], hd[i]);
			exit(T_EXIT_FAIL);
		}
	/* The same ops with device source and host (pageable) destination:
	 * unified addressing lets one executor serve both. */
	unbase(ds, dd);
	memset(out, 0, BUF);
	rebase(ds, (uint64_t)(uintptr_t)out);
	CHECK_OK(wex_mem_backend(WEX_MEM_CUDA_IPC)->copy(ops, 1, 1));
	CHECK(memcmp(out, hd, 1u << 20) == 0);
	CU_OK(wex__cu.cuMemFree(ds));
	CU_OK(wex__cu.cuMemFree(dd));
	free(hs);
	free(hd);
	free(out);
}

int main(void)
{
	int ret;

	gpu_require();
	ret = run_one("strided_copy", test);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
