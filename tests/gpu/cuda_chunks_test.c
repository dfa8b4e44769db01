/* SPDX-License-Identifier: MIT */
/*
 * cuda_chunks - weights over several VMM allocations (PyTorch
 * expandable segments), and publish ordering, through a real wexd.
 *
 * The producer builds what PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
 * builds: one reserved address range with NCH allocations (cuMemCreate,
 * POSIX fd handle type) mapped back to back, and tensors laid across the
 * allocation boundaries.  It registers the whole range with one
 * wex_segment_register_ptr call.  The consumer (this process):
 *  1. syncs REMAP_VIEW and reads every tensor through wex_view, including
 *     those that straddle two allocations;
 *  2. copies v1 into a region it reserved (default device: the producer
 *     segment's, found by UUID) and checks every byte;
 *  3. swaps the producer's allocations under that region (REMAP_FIXED)
 *     and checks every byte at the same addresses; a second region shows
 *     a segment the producer registered from inside its first allocation
 *     (1.5 MiB in, off the granularity, as a tensor of an expandable
 *     segment starts): the region is reserved with that lead and every
 *     allocation is mapped from its start (the emulated driver refuses
 *     cuMemMap offsets, as the reference says);
 *  4. restarts wexd (both sides register and import the chain again),
 *     then lets the producer write v2 with asynchronous copies on its own
 *     stream and publish without synchronising: wex_publish must wait for
 *     that GPU work, so the consumer sees v2 in every byte, remapped and
 *     copied.
 * Needs a CUDA driver and device (exit 77 with the reason otherwise).  CI
 * runs it against tests/gpu/emul_cuda.c with WEX_EMUL_DEFER=1, where
 * asynchronous copies stay queued until the producer synchronises: a
 * publish that did not wait would show v1 bytes in step 4.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_util.h"
#include "wex.h"

#define NCH 3
#define NT 6
#define ROWS 768
#define COLS 1024 /* bf16: 1.5 MiB a tensor, so tensors 2 and 5 cross allocations */
#define TBYTES ((uint64_t)ROWS * COLS * 2)
/* A second range of more allocations than one wexd message carries fds
 * (60): the consumer must keep parts across messages. */
#define NLONG 70

static uint16_t val(int v, int t, uint64_t e)
{
	return (uint16_t)(e * 2654435761u ^ (uint32_t)t * 40503u ^ (uint32_t)v * 0x9e37u);
}

static void make_tensors(struct wex_tensor *t, uint32_t seg)
{
	gpu_bf16_tensors(t, NT, ROWS, COLS, seg);
}

/* The tensor over the long range: row i is allocation i. */
static void add_long(struct wex_tensor *t, uint32_t seg, uint64_t gran)
{
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "long.weight");
	t->dtype = WEX_DT_U8;
	t->ndim = 2;
	t->shape[0] = t->extent[0] = NLONG;
	t->shape[1] = t->extent[1] = gran;
	t->segment = seg;
}

static unsigned char long_byte(int i)
{
	return (unsigned char)(i * 3 + 1);
}

static void fill(uint16_t *h, int v)
{
	for (int i = 0; i < NT; i++)
		for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++)
			h[(size_t)i * ROWS * COLS + e] = val(v, i, e);
}

/* Elements of tensor t (at dev) that do not hold version v. */
static uint64_t bad_elems(const void *dev, int v, int t, uint16_t *h)
{
	uint64_t bad = 0;

	CHECK_OK(xfer(h, dev, TBYTES));
	for (uint64_t e = 0; e < (uint64_t)ROWS * COLS; e++)
		bad += h[e] != val(v, t, e);
	return bad;
}

static void producer(int go_fd, int done_fd)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "chunks" };
	CUmemGenericAllocationHandle h[NCH], hl[NLONG];
	struct wex_tensor t[2 * NT];
	uint64_t total = NT * TBYTES, gran, chunk;
	CUdeviceptr va, vl;
	CUstream st;
	wex_client_t *c;
	uint16_t *host;
	uint32_t seg, segl, segoff;
	char ch;
	int ret, nfd;

	gran = gpu_granularity();
	chunk = (total / NCH + gran - 1) / gran * gran;
	CHECK(chunk % TBYTES != 0); /* some tensor crosses a boundary */
	va = gpu_expandable(NCH, chunk, h);
	vl = gpu_expandable(NLONG, gran, hl);
	host = malloc(total);
	CHECK(host != NULL);
	fill(host, 1);
	CHECK_OK(xfer((void *)(uintptr_t)va, host, total));
	CU_OK(wex__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	for (int i = 0; i < NLONG; i++)
		CU_OK(wex__cu.cuMemsetD8Async(vl + i * gran, long_byte(i), gran, st));

	CHECK_OK(wex_client_open(&p, &c));
	nfd = fd_count();
	ret = wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, total, &seg);
	if (ret < 0)
		fprintf(stderr, "register_ptr: %s\n", wex_last_error(c));
	CHECK_OK(ret);
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)vl, NLONG * gran,
					  &segl));
	/* The same range from tensor 1 on: a segment that starts inside its
	 * first allocation, off the granularity. */
	CHECK(TBYTES % gran != 0);
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)(va + TBYTES),
					  total - TBYTES, &segoff));
	/* 2 * NCH + NLONG allocations exported, and no fd kept for them:
	 * wexd holds the copies (a model in 20 MiB chunks has thousands). */
	printf("producer: %d fds more after registering %d allocations\n", fd_count() - nfd,
	       2 * NCH + NLONG);
	fflush(stdout);
	if (fd_count() - nfd > 2 && !under_sanitizer()) {
		fd_list();
		CHECK(fd_count() - nfd <= 2);
	}
	make_tensors(t, seg);
	add_long(&t[NT], segl, gran);
	for (int i = 1; i < NT; i++) {
		t[NT + i] = t[i];
		snprintf(t[NT + i].name, sizeof(t[NT + i].name), "off.%d.weight", i);
		t[NT + i].segment = segoff;
		t[NT + i].offset = (uint64_t)(i - 1) * TBYTES;
	}
	/* A part alone is not a segment tensors may name. */
	t[0].segment = 0;
	CHECK(wex_register_tensors(c, t, NT + 1) == -EINVAL);
	CHECK(strstr(wex_last_error(c), "part") != NULL);
	make_tensors(t, seg);
	CHECK_OK(wex_register_tensors(c, t, 2 * NT));
	CHECK_OK(wex_begin_write(c, 1, 5000));
	CHECK_OK(wex_publish(c, 1));
	CHECK(write(done_fd, "1", 1) == 1);

	/* v2: asynchronous copies on a stream of our own, then publish with
	 * no synchronisation of ours. */
	CHECK(read(go_fd, &ch, 1) == 1);
	CHECK_OK(wex_begin_write(c, 2, 5000));
	fill(host, 2);
	for (int i = 0; i < NT; i++)
		CU_OK(wex__cu.cuMemcpyAsync(va + i * TBYTES,
					    (CUdeviceptr)(uintptr_t)((char *)host + i * TBYTES),
					    TBYTES, st));
	CHECK_OK(wex_publish(c, 2));
	CHECK(write(done_fd, "2", 1) == 1);

	CHECK(read(go_fd, &ch, 1) >= 0); /* hold the memory until the consumer is done */
	wex_client_close(c);
	CU_OK(wex__cu.cuStreamDestroy(st));
	gpu_expandable_free(va, NCH, chunk, h);
	gpu_expandable_free(vl, NLONG, gran, hl);
	free(host);
	_exit(0);
}

/* Every tensor, read at base + offset, holds version v. */
static void check_all(wex_client_t *c, char *base, int v, uint16_t *h, const char *what)
{
	uint64_t bad = 0;

	for (int i = 0; i < NT; i++) {
		void *p = base ? base + (uint64_t)i * TBYTES : NULL;
		char name[64];

		if (!p) {
			snprintf(name, sizeof(name), "layers.%d.weight", i);
			CHECK_OK(wex_view(c, 0, name, &p, NULL));
		}
		bad += bad_elems(p, v, i, h);
	}
	if (bad)
		fprintf(stderr, "%s: %llu elements do not hold v%d\n", what, (unsigned long long)bad, v);
	CHECK(bad == 0);
	printf("ok: %s: v%d in every byte\n", what, v);
}

/* Tensors 1.. of the segment that starts at tensor 1, laid out from base. */
static void check_off(char *base, int v, uint16_t *h, const char *what)
{
	uint64_t bad = 0;

	for (int i = 1; i < NT; i++)
		bad += bad_elems(base + (uint64_t)(i - 1) * TBYTES, v, i, h);
	if (bad)
		fprintf(stderr, "%s: %llu elements do not hold v%d\n", what,
			(unsigned long long)bad, v);
	CHECK(bad == 0);
	printf("ok: %s: v%d in every byte\n", what, v);
}

/* Through a view: the first and last byte of every allocation of the
 * long range hold that allocation's value. */
static void check_long(wex_client_t *c)
{
	struct wex_tensor d;
	unsigned char b[2];
	uint64_t bad = 0;
	char *p;

	CHECK_OK(wex_view(c, 0, "long.weight", (void **)&p, &d));
	for (int i = 0; i < NLONG; i++) {
		CHECK_OK(xfer(&b[0], p + i * d.shape[1], 1));
		CHECK_OK(xfer(&b[1], p + (i + 1) * d.shape[1] - 1, 1));
		bad += (b[0] != long_byte(i)) + (b[1] != long_byte(i));
	}
	CHECK(bad == 0);
	printf("ok: remap-view over %d allocations (more than one message of fds)\n", NLONG);
}

int main(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER, .model = "chunks" };
	uint64_t total = NT * TBYTES;
	const struct wex_tensor *pt;
	struct wex_sync_result r;
	struct wex_tensor t[NT];
	struct gpu_world w;
	wex_client_t *c;
	int st;
	size_t npt;
	uint32_t seg, segoff = 0;
	uint16_t *h;
	void *region, *region2;
	char ch;

	gpu_require();
	gpu_world_start(&w, producer);
	CHECK(read(w.from_prod, &ch, 1) == 1 && ch == '1');

	h = malloc(TBYTES);
	CHECK(h != NULL);
	CHECK_OK(wex_client_open(&p, &c));

	/* 1. Views into the chained allocations. */
	CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	CHECK(r.version == 1);
	check_all(c, NULL, 1, h, "remap-view over 3 allocations");
	check_long(c);
	CHECK(wex_producer_tensors(c, 0, &pt, &npt) == 1 && npt == 2 * NT);
	seg = pt[0].segment;
	for (size_t i = 0; i < npt; i++)
		if (!strcmp(pt[i].name, "off.1.weight"))
			segoff = pt[i].segment;
	CHECK(segoff != 0 && segoff != seg);
	CHECK_OK(wex_release(c));

	/* 2. Copy into a reserved region (on the producer's device by
	 *    default), laid out as the producer's range. */
	CHECK_OK(wex_reserve(c, 0, seg, total, &region));
	make_tensors(t, 0);
	for (int i = 0; i < NT; i++)
		t[i].ptr = (char *)region + t[i].offset;
	CHECK_OK(wex_attach(c, t, NT));
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r));
	CHECK(r.version == 1 && r.bytes == total);
	check_all(c, region, 1, h, "copy into the reserved region");

	/* 3. The producer's allocations under the same addresses; the
	 *    second region for the segment that starts 1.5 MiB into its
	 *    first allocation. */
	CHECK_OK(wex_reserve(c, 0, segoff, total - TBYTES, &region2));
	CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_FIXED, 1, 5000, &r));
	check_all(c, region, 1, h, "remap-fixed over 3 allocations");
	check_off(region2, 1, h, "remap-fixed of a segment starting inside its allocation");
	CHECK_OK(wex_release(c));

	/* wexd restarts: the producer re-registers its parts and the chain
	 * on its next call, the consumer imports them again on its next sync. */
	kill(w.wexd, SIGTERM);
	CHECK(waitpid(w.wexd, &st, 0) == w.wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	w.wexd = gpu_start_wexd();

	/* 4. v2, written asynchronously and published without a sync of the
	 *    producer's own. */
	CHECK(write(w.to_prod, "g", 1) == 1);
	CHECK(read(w.from_prod, &ch, 1) == 1 && ch == '2');
	CHECK_OK(wex_sync(c, WEX_SYNC_REMAP_FIXED, 2, 5000, &r));
	CHECK(r.version == 2);
	check_all(c, region, 2, h, "remap-fixed after an unsynchronised publish");
	check_off(region2, 2, h, "remap-fixed (lead) after an unsynchronised publish");
	CHECK_OK(wex_sync(c, WEX_SYNC_COPY, 2, 5000, &r));
	check_all(c, region, 2, h, "copy after an unsynchronised publish");

	wex_client_close(c);
	gpu_world_stop(&w);
	free(h);
	printf("PASS: a range over %d VMM allocations through wexd (view, copy, same-address, a wexd restart), "
	       "and a publish that waits for the producer's GPU work\n", NCH);
	return 0;
}
