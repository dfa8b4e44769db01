/* SPDX-License-Identifier: MIT */
/*
 * cuda_verify_test.c - the comparison behind WEX_SYNC_VERIFY
 * (wex__verify_ops, src/verify.h) on its GPU path, through the CUDA
 * backend (label gpu; 77 without a device): ops reading cuMemAlloc memory
 * and writing cuMemAlloc or host memory, both sides gathered by the GPU
 * executor into host buffers in runs of 64 KiB (wex__verify_unit), so
 * that a few MiB make dozens of runs, each compared while the next one is
 * gathered.
 *   runs          equal bytes compare equal; a byte changed in the first
 *                 run and one in the last are both counted and the first
 *                 one reported (op, offsets from its dst and src); two in
 *                 late runs, one in an op writing host memory: the same.
 *                 Emulated: the gather copied no pageable host memory
 *                 (wex_emul_pageable_copies: its buffers were pinned while
 *                 the copies ran), two buffer pairs were pinned
 *                 (cuMemHostRegister), and both unpinned before the call
 *                 returned (as many registrations as before)
 *   gather_error  emulated: a device-to-host copy of the gather fails
 *                 (wex_emul_fail) in the first run, a middle one and the
 *                 last: the call returns the driver's error (-EPERM),
 *                 every pinned buffer is unpinned
 *   pin_refused   emulated: cuMemHostRegister refuses the first pair, then
 *                 the second: the comparison goes on through the pageable
 *                 buffer with the same result, warns once per process,
 *                 and unpins the pair it pinned
 */
#include <sys/mman.h>

#include "gpu_util.h"
#include "src/verify.h"

#define UNIT (64u << 10)
#define SZ (6u << 20)

static CUdeviceptr dsrc, ddst;
static unsigned char *hdst; /* destinations in host memory */
static struct wex_copy_op ops[160];
static size_t nops;
static uint64_t so, dof, hof; /* next free byte of dsrc, ddst, hdst */

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(uint64_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return n ? rng % n : 0;
}

/* `rows` rows of `len` bytes, `gap` bytes apart in the source, packed in
 * the destination (device memory, or host memory when `host`). */
static void add_op(uint64_t len, uint64_t rows, uint64_t gap, int host)
{
	struct wex_copy_op *op;
	uint64_t *off = host ? &hof : &dof;

	CHECK(nops < sizeof(ops) / sizeof(ops[0]));
	op = &ops[nops++];
	memset(op, 0, sizeof(*op));
	op->src = dsrc + so;
	op->dst = host ? (uint64_t)(uintptr_t)(hdst + *off) : ddst + *off;
	op->len = len;
	if (rows > 1) {
		op->nouter = 1;
		op->count[0] = rows;
		op->src_stride[0] = (int64_t)(len + gap);
		op->dst_stride[0] = (int64_t)len;
	}
	so += rows * (len + gap) + 64;
	*off += rows * len + 64;
	CHECK(so <= SZ && *off <= SZ);
}

/* Byte b of row r of op i: its offsets from the op's src and dst. */
static void at(size_t i, uint64_t r, uint64_t b, uint64_t *s, uint64_t *d)
{
	*s = r * (uint64_t)(ops[i].nouter ? ops[i].src_stride[0] : 0) + b;
	*d = r * (uint64_t)(ops[i].nouter ? ops[i].dst_stride[0] : 0) + b;
}

static uint64_t rows_of(size_t i)
{
	return ops[i].nouter ? ops[i].count[0] : 1;
}

/* Flips the byte at addr, device or host memory. */
static void flip(uint64_t addr)
{
	unsigned char c;

	if (wex_mem_ptr_on_gpu(addr) < 0) {
		*(unsigned char *)(uintptr_t)addr ^= 0x5A;
		return;
	}
	CU_OK(wex__cu.cuMemcpyDtoH(&c, (CUdeviceptr)addr, 1));
	c ^= 0x5A;
	CU_OK(wex__cu.cuMemcpyHtoD((CUdeviceptr)addr, &c, 1));
	/* From pageable memory the copy may return before its DMA reached
	 * the device (CUDA's API sync behavior), and the comparison runs on
	 * wex's non-blocking stream: wait for it. */
	CU_OK(wex__cu.cuCtxSynchronize());
}

/* The buffers, and ops over them whose destinations hold their sources'
 * bytes (copied by the executor); the bytes outside every op differ. */
static void setup(int contiguous_only)
{
	CHECK_OK(wex__cuda_use_device(0));
	CU_OK(wex__cu.cuMemAlloc(&dsrc, SZ));
	CU_OK(wex__cu.cuMemAlloc(&ddst, SZ));
	hdst = malloc(SZ);
	CHECK(hdst);
	memset(hdst, 0xEE, SZ);
	dev_fill(dsrc, SZ, 3);
	dev_fill(ddst, SZ, 9);
	so = dof = hof = 0;
	nops = 0;
	if (contiguous_only) {
		/* One row each: with batches off, one cuMemcpyAsync per unit
		 * and side, in plan order. */
		while (nops < 60)
			add_op(8192 + rnd(40000), 1, 0, 0);
	} else {
		/* A row longer than a unit (cut by bytes), rows cut along
		 * their dim, and many small ops; every fifth into host
		 * memory. */
		add_op(UNIT + UNIT / 2 + 7, 1, 0, 0);
		add_op(300, 600, 40, 0);
		while (nops < 120)
			add_op(1 + rnd(3000), 1 + rnd(60), rnd(2) ? 0 : rnd(100), nops % 5 == 0);
	}
	CHECK_OK(wex_mem_cuda_vmm_ops.copy(ops, nops, 1));
	CHECK(wex__ops_bytes(ops, nops) > 16 * (uint64_t)UNIT);
	CHECK(wex__verify_unit(UNIT) == 64u << 20);
}

static void teardown(void)
{
	wex__verify_unit(64u << 20);
	CU_OK(wex__cu.cuMemFree(dsrc));
	CU_OK(wex__cu.cuMemFree(ddst));
	free(hdst);
}

/* What the emulated driver counted, before and after a verification. */
struct counts {
	unsigned long reg, unreg;
	long pageable;
	int regs;
};

static struct counts counts(void)
{
	return (struct counts){ .reg = emul_calls("cuMemHostRegister"),
				.unreg = emul_calls("cuMemHostUnregister"),
				.pageable = emul_pageable_copies(), .regs = emul_host_regs() };
}

/* Emulated: every pin the verification made was undone before it
 * returned; `pins` of them succeeded, and the gather copied `pageable`
 * copies' worth of pageable memory (-1: some, 0: none). */
static void check_pins(struct counts was, unsigned long tried, unsigned long pins, int pageable)
{
	struct counts now = counts();

	if (!emulated())
		return;
	CHECK(now.regs == was.regs);
	CHECK(now.reg - was.reg == tried);
	CHECK(now.unreg - was.unreg == pins);
	if (pageable)
		CHECK(now.pageable > was.pageable);
	else
		CHECK(now.pageable == was.pageable);
}

static void expect(int threads, int want, size_t op, uint64_t dst_off, uint64_t src_off,
		   uint64_t bytes)
{
	struct wex_verify_diff d;
	struct counts was = counts();
	int ret = wex__verify_ops(ops, nops, &wex_mem_cuda_vmm_ops, threads, &d);

	if (ret != want || (want && (d.op != op || d.dst_off != dst_off || d.src_off != src_off ||
				     d.bytes != bytes))) {
		fprintf(stderr, "verify (%d threads): %d, op %zu dst+%llu src+%llu %llu bytes; "
			"expected %d, op %zu dst+%llu src+%llu %llu bytes\n", threads, ret, d.op,
			(unsigned long long)d.dst_off, (unsigned long long)d.src_off,
			(unsigned long long)d.bytes, want, op, (unsigned long long)dst_off,
			(unsigned long long)src_off, (unsigned long long)bytes);
		exit(T_EXIT_FAIL);
	}
	/* Dozens of runs: both pairs pinned, nothing left pinned. */
	check_pins(was, 2, 2, 0);
}

static void runs(void)
{
	size_t last, host_op = 5;
	uint64_t s1, d1, s2, d2;

	setup(0);
	last = nops - 1;
	CHECK(wex_mem_ptr_on_gpu(ops[host_op].dst) < 0 && wex_mem_ptr_on_gpu(ops[last].dst) >= 0);
	for (int threads = 1; threads <= 4; threads += 3) {
		expect(threads, 0, 0, 0, 0, 0);
		/* The first run and the last. */
		at(0, 0, 5, &s1, &d1);
		at(last, rows_of(last) - 1, ops[last].len - 1, &s2, &d2);
		flip(ops[0].dst + d1);
		flip(ops[last].src + s2);
		expect(threads, 1, 0, d1, s1, 2);
		flip(ops[0].dst + d1);
		flip(ops[last].src + s2);
		/* Two late runs: the earlier op is reported. */
		at(last - 2, 0, 0, &s1, &d1);
		flip(ops[last].dst + d2);
		flip(ops[last - 2].src + s1);
		expect(threads, 1, last - 2, d1, s1, 2);
		flip(ops[last].dst + d2);
		flip(ops[last - 2].src + s1);
		/* An op into host memory (a side gathered with memcpy), and
		 * a later one on the GPU. */
		at(host_op, rows_of(host_op) - 1, 0, &s1, &d1);
		flip(ops[host_op].dst + d1);
		flip(ops[last].dst + d2);
		expect(threads, 1, host_op, d1, s1, 2);
		flip(ops[host_op].dst + d1);
		flip(ops[last].dst + d2);
		expect(threads, 0, 0, 0, 0, 0);
	}
	teardown();
}

static void gather_error(void)
{
	struct wex_verify_diff d;
	unsigned long calls, at_call[3];

	setup(1);
	if (!emulated()) {
		printf("gather_error: failures are injected on the emulated driver only: not tried\n");
		teardown();
		return;
	}
	/* One cuMemcpyAsync per unit and side, none batched. */
	wex__cuda_copy_batch(0);
	calls = emul_calls("cuMemcpyAsync");
	CHECK(wex__verify_ops(ops, nops, &wex_mem_cuda_vmm_ops, 2, &d) == 0);
	calls = emul_calls("cuMemcpyAsync") - calls;
	CHECK(calls >= 2 * nops);
	at_call[0] = 1;
	at_call[1] = calls / 2;
	at_call[2] = calls;
	for (int i = 0; i < 3; i++) {
		struct counts was = counts();

		emul_fail("cuMemcpyAsync", at_call[i], CUDA_ERROR_NOT_PERMITTED);
		CHECK(wex__verify_ops(ops, nops, &wex_mem_cuda_vmm_ops, 2, &d) == -EPERM);
		/* The first run's failure came before the second pair was
		 * made; the others after both were pinned. */
		check_pins(was, i ? 2 : 1, i ? 2 : 1, 0);
	}
	CHECK(wex__verify_ops(ops, nops, &wex_mem_cuda_vmm_ops, 2, &d) == 0);
	wex__cuda_copy_batch(1);
	teardown();
}

static void pin_refused(void)
{
	char log[8192], *p;
	int fd, saved, warned = 0;
	ssize_t got;
	uint64_t s, d;

	setup(0);
	if (!emulated()) {
		printf("pin_refused: refusals are injected on the emulated driver only: not tried\n");
		teardown();
		return;
	}
	/* The log, to count the warnings. */
	fd = memfd_create("log", MFD_CLOEXEC);
	CHECK(fd >= 0);
	fflush(stderr);
	saved = dup(2);
	CHECK(saved >= 0 && dup2(fd, 2) == 2);
	at(40, 0, 1, &s, &d);
	flip(ops[40].dst + d);
	for (unsigned long nth = 1; nth <= 2; nth++) {
		struct wex_verify_diff diff;
		struct counts was = counts();

		emul_fail("cuMemHostRegister", nth, CUDA_ERROR_OUT_OF_MEMORY);
		CHECK(wex__verify_ops(ops, nops, &wex_mem_cuda_vmm_ops, 2, &diff) == 1);
		CHECK(diff.op == 40 && diff.dst_off == d && diff.src_off == s && diff.bytes == 1);
		/* Two tried, one refused: its copies went to pageable memory. */
		check_pins(was, 2, 1, 1);
	}
	flip(ops[40].dst + d);
	CHECK(dup2(saved, 2) == 2);
	close(saved);
	got = pread(fd, log, sizeof(log) - 1, 0);
	close(fd);
	CHECK(got >= 0);
	log[got] = '\0';
	fputs(log, stderr);
	for (p = log; (p = strstr(p, "did not pin")); p++)
		warned++;
	CHECK(warned == 1);
	teardown();
}

int main(void)
{
	int ret;

	gpu_require();
	ret = run_one("runs", runs);
	ret |= run_one("gather_error", gather_error);
	ret |= run_one("pin_refused", pin_refused);
	printf("%s\n", ret ? "FAIL" : "PASS");
	return ret ? T_EXIT_FAIL : T_EXIT_PASS;
}
