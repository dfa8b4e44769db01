/* SPDX-License-Identifier: MIT */
/*
 * gpu_sync.c - colocated ("common card") sync on one GPU: remap latency and
 * in-place copy bandwidth of the cuda_vmm backend against the device's
 * device-to-device copy limit measured in the same run, and against
 * PyTorch CUDA IPC (tests/bench/gpu_sync_torch.py, SGLang's
 * update_weights_from_tensor path) when torch with CUDA is available.
 *
 * It drives the backend ops directly across two processes (fork +
 * socketpair with SCM_RIGHTS), not through wexd: the daemon never touches
 * weight bytes, so what is measured is exactly what a consumer's wex_sync
 * executes.
 *
 *   producer  allocates the weights (WEX_BENCH_GB of bf16 in
 *             WEX_BENCH_TENSORS tensors of varied sizes, packed into
 *             cuda_vmm segments of up to WEX_BENCH_SEG_MB) and exports them;
 *   consumer  imports them (import_ms: the remap "view" mode), reserves
 *             same-address regions laid out like the segments (its own
 *             weights), then measures
 *               d2d      one cuMemcpyAsync per segment, imported -> own
 *                        (the limit: same bytes, fewest calls);
 *               copy     the copy slot with one op per tensor (wex's
 *                        in-place copy);
 *               remap    map_fixed of every region (same-address remap:
 *                        the producer's memory under the engine's
 *                        addresses; remap_ms) and unmap_fixed back
 *                        (unmap_fixed_ms, copies the bytes).
 * Best of WEX_BENCH_REPS (3) after a warm-up.  The last line is one JSON
 * object; ratios: copy_vs_d2d = copy GB/s / d2d GB/s; *_vs_torch_* =
 * torch sync time / wex time (above 1: wex is faster); null with
 * "torch_reason" when the baseline could not run (WEX_BENCH_TORCH=0 skips
 * it).  Without a GPU it prints the reason and exits 77.
 */
#include <math.h>
#include <time.h>

#include "tests/gpu/gpu_util.h"

#ifndef WEX_SOURCE_DIR
#define WEX_SOURCE_DIR "."
#endif

enum { OP_SEG = 1, OP_DONE };

struct layout {
	size_t n, nseg;
	uint64_t *off;   /* tensor offset in its segment */
	uint64_t *bytes; /* tensor size */
	uint32_t *seg;   /* its segment */
	uint64_t *segsz; /* used bytes per segment */
	uint64_t total;
};

struct result {
	double import_ms, copy_ms, d2d_ms, remap_ms, unmap_fixed_ms;
	uint64_t bytes;
	int ok;
	char device[WEX_UUID_LEN];
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double env_num(const char *name, double def)
{
	const char *v = getenv(name);

	return v && *v ? atof(v) : def;
}

/* Tensor sizes vary between 0.25x and 1.75x the mean (gpu_sync_torch.py
 * uses the same generator). */
static void make_layout(struct layout *L, double gb, size_t n, uint64_t segmax)
{
	uint64_t avg = (uint64_t)(gb * (double)(1ull << 30)) / 2 / n, cur = 0;

	L->n = n;
	L->off = calloc(n, sizeof(uint64_t));
	L->bytes = calloc(n, sizeof(uint64_t));
	L->seg = calloc(n, sizeof(uint32_t));
	L->segsz = calloc(n + 1, sizeof(uint64_t));
	CHECK(L->off && L->bytes && L->seg && L->segsz);
	L->nseg = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t frac = (uint32_t)((uint64_t)i * 2654435761u) % 1000;
		uint64_t e = avg * (500 + 3 * (uint64_t)frac) / 2000 & ~(uint64_t)127;

		if (e < 128)
			e = 128;
		L->bytes[i] = e * 2;
		if (cur && cur + L->bytes[i] > segmax) {
			L->segsz[L->nseg++] = cur;
			cur = 0;
		}
		L->off[i] = cur;
		L->seg[i] = (uint32_t)L->nseg;
		cur += (L->bytes[i] + 255) & ~(uint64_t)255;
		L->total += L->bytes[i];
	}
	L->segsz[L->nseg++] = cur;
}

static struct layout L;
static int reps;

static void producer(int sock)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg *s = calloc(L.nseg, sizeof(*s));

	CHECK(s);
	CHECK_OK(wex__cuda_use_device(0));
	for (size_t k = 0; k < L.nseg; k++) {
		CHECK_OK(vmm->alloc(L.segsz[k], 0, &s[k]));
		CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)s[k].ptr,
					      (unsigned char)(0x40 + k % 64), L.segsz[k], NULL));
	}
	CU_OK(wex__cu.cuCtxSynchronize());
	for (size_t k = 0; k < L.nseg; k++)
		tsend(sock, OP_SEG, &s[k].desc, k, s[k].fd);
	trecv(sock, OP_DONE, NULL);
	for (size_t k = 0; k < L.nseg; k++)
		CHECK_OK(vmm->release(&s[k]));
	free(s);
}

static int sample_ok(uint64_t addr, unsigned char want)
{
	unsigned char b[64];

	CU_OK(wex__cu.cuMemcpyDtoH(b, (CUdeviceptr)addr, sizeof(b)));
	for (size_t i = 0; i < sizeof(b); i++)
		if (b[i] != want)
			return 0;
	return 1;
}

static void consumer(int sock, int out)
{
	const struct wex_mem_ops *vmm = wex_mem_backend(WEX_MEM_CUDA_VMM);
	struct wex_mem_seg *s = calloc(L.nseg, sizeof(*s));
	struct wex_mem_region *r = calloc(L.nseg, sizeof(*r));
	struct wex_copy_op *ops = calloc(L.n, sizeof(*ops));
	struct result res = { .bytes = L.total, .ok = 1 };
	CUstream st;
	double t;

	CHECK(s && r && ops);
	res.import_ms = 0;
	for (size_t k = 0; k < L.nseg; k++) {
		int fd;
		struct tmsg m = trecv(sock, OP_SEG, &fd);

		t = now_ms();
		CHECK_OK(vmm->import(&m.desc, fd, &s[m.a]));
		res.import_ms += now_ms() - t;
	}
	memcpy(res.device, s[0].desc.device, sizeof(res.device));
	for (size_t k = 0; k < L.nseg; k++)
		CHECK_OK(vmm->reserve(s[k].desc.alloc_size, 0, &r[k]));
	CU_OK(wex__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));

	/* The limit: the same bytes in one copy per segment. */
	res.d2d_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CU_OK(wex__cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)r[k].addr,
						    (CUdeviceptr)(uintptr_t)s[k].ptr, L.segsz[k], st));
		CU_OK(wex__cu.cuStreamSynchronize(st));
		if (i > 0)
			res.d2d_ms = fmin(res.d2d_ms, now_ms() - t);
	}

	/* wex in-place copy: one op per tensor, into the engine's buffers. */
	for (size_t i = 0; i < L.n; i++)
		ops[i] = (struct wex_copy_op){
			.src = (uint64_t)(uintptr_t)s[L.seg[i]].ptr + L.off[i],
			.dst = (uint64_t)(uintptr_t)r[L.seg[i]].addr + L.off[i],
			.len = L.bytes[i],
		};
	CU_OK(wex__cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)r[0].addr, 0, L.segsz[0], st));
	CU_OK(wex__cu.cuStreamSynchronize(st));
	res.copy_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		t = now_ms();
		CHECK_OK(vmm->copy(ops, L.n, 1));
		if (i > 0)
			res.copy_ms = fmin(res.copy_ms, now_ms() - t);
	}
	res.ok &= sample_ok((uint64_t)(uintptr_t)r[0].addr, 0x40);

	/* Same-address remap of every region, and back. */
	res.remap_ms = res.unmap_fixed_ms = INFINITY;
	for (int i = 0; i <= reps; i++) {
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CHECK_OK(vmm->map_fixed(&r[k], &s[k], 0));
		if (i > 0)
			res.remap_ms = fmin(res.remap_ms, now_ms() - t);
		res.ok &= sample_ok((uint64_t)(uintptr_t)r[L.nseg - 1].addr,
				    (unsigned char)(0x40 + (L.nseg - 1) % 64));
		t = now_ms();
		for (size_t k = 0; k < L.nseg; k++)
			CHECK_OK(vmm->unmap_fixed(&r[k]));
		if (i > 0)
			res.unmap_fixed_ms = fmin(res.unmap_fixed_ms, now_ms() - t);
	}
	for (size_t k = 0; k < L.nseg; k++) {
		CHECK_OK(vmm->unreserve(&r[k]));
		CHECK_OK(vmm->release(&s[k]));
	}
	CU_OK(wex__cu.cuStreamDestroy(st));
	tsend(sock, OP_DONE, NULL, 0, -1);
	CHECK(write(out, &res, sizeof(res)) == (ssize_t)sizeof(res));
	free(s);
	free(r);
	free(ops);
}

/* Runs the torch helper; fills its two timings (NAN: null) and reason. */
static void run_torch(double *per_tensor, double *bucket, char *reason, size_t rlen)
{
	const char *src = getenv("WEX_SRC");
	char cmd[1024], line[4096], last[4096] = "";
	const char *p;
	FILE *f;

	*per_tensor = *bucket = NAN;
	if (env_num("WEX_BENCH_TORCH", 1) == 0) {
		snprintf(reason, rlen, "skipped (WEX_BENCH_TORCH=0)");
		return;
	}
	snprintf(cmd, sizeof(cmd), "python3 '%s/tests/bench/gpu_sync_torch.py' 2>&1",
		 src && *src ? src : WEX_SOURCE_DIR);
	f = popen(cmd, "r");
	if (!f) {
		snprintf(reason, rlen, "cannot run python3");
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		if (line[0] == '{')
			snprintf(last, sizeof(last), "%s", line);
		else
			fputs(line, stderr);
	}
	pclose(f);
	if (!last[0]) {
		snprintf(reason, rlen, "gpu_sync_torch.py printed no result");
		return;
	}
	if ((p = strstr(last, "\"torch_ipc_per_tensor_ms\": ")) && strncmp(p + 27, "null", 4))
		*per_tensor = atof(p + 27);
	if ((p = strstr(last, "\"torch_ipc_bucket_ms\": ")) && strncmp(p + 23, "null", 4))
		*bucket = atof(p + 23);
	reason[0] = '\0';
	if ((p = strstr(last, "\"torch_reason\": \""))) {
		size_t k = 0;

		for (p += 17; *p && *p != '"' && k + 1 < rlen; p++)
			reason[k++] = *p == '\\' ? ' ' : *p;
		reason[k] = '\0';
	}
}

static void json_num(const char *key, double v, int comma)
{
	if (isnan(v) || isinf(v))
		printf("\"%s\":null%s", key, comma ? "," : "");
	else
		printf("\"%s\":%.4f%s", key, v, comma ? "," : "");
}

int main(void)
{
	double gb = env_num("WEX_BENCH_GB", 16), tp, tb, gbs;
	size_t n = (size_t)env_num("WEX_BENCH_TENSORS", 300);
	uint64_t segmax = (uint64_t)env_num("WEX_BENCH_SEG_MB", 1024) << 20;
	struct result res;
	char reason[512];
	int sv[2], pf[2], ret = 0;
	pid_t pp, pc;

	reps = (int)env_num("WEX_BENCH_REPS", 3);
	if (reps < 1)
		reps = 1;
	if (n == 0 || gb <= 0) {
		fprintf(stderr, "bad WEX_BENCH_GB / WEX_BENCH_TENSORS\n");
		return T_EXIT_FAIL;
	}
	gpu_require();
	make_layout(&L, gb, n, segmax);
	printf("gpu_sync: %.2f GiB in %zu bf16 tensors, %zu segments, %d reps\n",
	       (double)L.total / (1u << 30), L.n, L.nseg, reps);
	fflush(stdout);
	pair(sv);
	CHECK(pipe(pf) == 0);
	pp = fork();
	CHECK(pp >= 0);
	if (pp == 0) {
		close(sv[1]);
		producer(sv[0]);
		_exit(0);
	}
	pc = fork();
	CHECK(pc >= 0);
	if (pc == 0) {
		close(sv[0]);
		consumer(sv[1], pf[1]);
		_exit(0);
	}
	close(sv[0]);
	close(sv[1]);
	close(pf[1]);
	ret |= wait_ok(pp, "producer");
	ret |= wait_ok(pc, "consumer");
	if (ret || read(pf[0], &res, sizeof(res)) != (ssize_t)sizeof(res)) {
		printf("{\"bench\":\"gpu_sync\",\"error\":\"a benchmark process failed\"}\n");
		return T_EXIT_FAIL;
	}
	run_torch(&tp, &tb, reason, sizeof(reason));
	gbs = (double)res.bytes / 1e9;
	printf("import %.2f ms, remap %.2f ms, unmap_fixed %.2f ms, copy %.2f ms (%.1f GB/s), "
	       "d2d %.2f ms (%.1f GB/s)\n", res.import_ms, res.remap_ms, res.unmap_fixed_ms,
	       res.copy_ms, gbs / (res.copy_ms / 1e3), res.d2d_ms, gbs / (res.d2d_ms / 1e3));
	printf("{\"bench\":\"gpu_sync\",\"path\":\"cuda_vmm backend ops, 2 processes, fork+socketpair\",\"device\":\"%s\","
	       "\"bytes\":%llu,\"tensors\":%zu,\"segments\":%zu,\"reps\":%d,\"check\":%s,",
	       res.device, (unsigned long long)res.bytes, L.n, L.nseg, reps,
	       res.ok ? "true" : "false");
	json_num("import_ms", res.import_ms, 1);
	json_num("remap_ms", res.remap_ms, 1);
	json_num("unmap_fixed_ms", res.unmap_fixed_ms, 1);
	json_num("copy_ms", res.copy_ms, 1);
	json_num("d2d_ms", res.d2d_ms, 1);
	json_num("copy_gbps", gbs / (res.copy_ms / 1e3), 1);
	json_num("d2d_gbps", gbs / (res.d2d_ms / 1e3), 1);
	json_num("copy_vs_d2d", res.d2d_ms / res.copy_ms, 1);
	json_num("torch_ipc_per_tensor_ms", tp, 1);
	json_num("torch_ipc_bucket_ms", tb, 1);
	json_num("copy_vs_torch_ipc_per_tensor", tp / res.copy_ms, 1);
	json_num("remap_vs_torch_ipc_per_tensor", tp / res.remap_ms, 1);
	json_num("copy_vs_torch_ipc_bucket", tb / res.copy_ms, 1);
	json_num("remap_vs_torch_ipc_bucket", tb / res.remap_ms, reason[0] != '\0');
	if (reason[0])
		printf("\"torch_reason\":\"%s\"", reason);
	printf("}\n");
	return res.ok ? T_EXIT_PASS : T_EXIT_FAIL;
}
