/* SPDX-License-Identifier: MIT */
/*
 * cuda_cycles - 1000 sync cycles through a real wexd on GPU memory, with
 * fd and device-memory leak checks, then a consumer killed while it copies.
 *
 * The producer (a child) holds its weights in an expandable-segment-like
 * range (two VMM allocations back to back, registered as one chained
 * segment) and writes each version with an asynchronous memset on its own
 * stream, then publishes (wex_publish waits for that GPU work).  The
 * consumer (this process), per cycle: asks for version v, syncs REMAP_VIEW,
 * REMAP_FIXED and COPY of v, and checks sampled bytes of every tensor in
 * each mode (every byte every 100 cycles).  Every 50 cycles it closes its
 * client and opens a new one, so segments are imported and released and
 * regions reserved and freed again.  Between cycle 10 and the end, this
 * process's fd count must not change and free device memory must not drop
 * (beyond 32 MiB of noise: an 8 MiB region leaked per reopen shows by
 * cycle 250).
 *
 * Then a second consumer process loops attach + COPY sync (every sync
 * copies) and is killed with SIGKILL: wexd must still answer, the producer
 * must be able to write the next version (the dead consumer's lease is
 * gone), and this process must sync that version and find every byte.
 *
 * Needs a CUDA driver and device (exit 77 with the reason otherwise); CI
 * runs it against tests/gpu/emul_cuda.c (cuda_cycles_emul), with
 * asynchronous work deferred until a synchronisation, and 250 cycles
 * (WEX_TEST_CYCLES): there each cycle faults its copies' pages in anew,
 * about 86 ms a cycle on a 2-core VM.  The GPU run keeps 1000.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_util.h"
#include "wex.h"

#define NT 4
#define TBYTES (2ull << 20) /* U8 [2048, 1024] */
#define CYCLES 1000 /* WEX_TEST_CYCLES may lower it, not below MIN_CYCLES */
#define MIN_CYCLES 250 /* 5 reopens: a region leaked per reopen shows */
#define REOPEN 50
#define FULL 100
#define NOISE (32ull << 20)

static void make_tensors(struct wex_tensor *t, uint32_t seg, char *base)
{
	memset(t, 0, sizeof(*t) * NT);
	for (int i = 0; i < NT; i++) {
		snprintf(t[i].name, sizeof(t[i].name), "w.%d", i);
		t[i].dtype = WEX_DT_U8;
		t[i].ndim = 2;
		t[i].shape[0] = t[i].extent[0] = 2048;
		t[i].shape[1] = t[i].extent[1] = 1024;
		t[i].segment = seg;
		t[i].offset = (uint64_t)i * TBYTES;
		if (base)
			t[i].ptr = base + t[i].offset;
	}
}

static unsigned char vbyte(uint64_t v)
{
	return (unsigned char)(v * 37 + 11);
}

/* The producer: writes version after version on request ('w' in, 'k' out). */
static void producer(int cmd, int ack)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "cycles" };
	uint64_t total = NT * TBYTES, chunk = total / 2, v = 0;
	CUmemGenericAllocationHandle h[2];
	struct wex_tensor t[NT];
	wex_client_t *c;
	CUdeviceptr va;
	CUstream st;
	uint32_t seg;
	char ch;

	CHECK(chunk % gpu_granularity() == 0);
	va = gpu_expandable(2, chunk, h);
	CU_OK(wex__cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CHECK_OK(wex_client_open(&p, &c));
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, total, &seg));
	make_tensors(t, seg, NULL);
	CHECK_OK(wex_register_tensors(c, t, NT));
	while (read(cmd, &ch, 1) == 1 && ch == 'w') {
		int ret;

		v++;
		ret = wex_begin_write(c, v, 10000);
		if (ret < 0)
			fprintf(stderr, "producer: begin_write v%llu: %s\n", (unsigned long long)v,
				wex_last_error(c));
		CHECK_OK(ret);
		CU_OK(wex__cu.cuMemsetD8Async(va, vbyte(v), total, st));
		CHECK_OK(wex_publish(c, v));
		CHECK(write(ack, "k", 1) == 1);
	}
	wex_client_close(c);
	CU_OK(wex__cu.cuStreamDestroy(st));
	gpu_expandable_free(va, 2, chunk, h);
	_exit(0);
}

static void next_version(int cmd, int ack)
{
	char ch;

	CHECK(write(cmd, "w", 1) == 1);
	CHECK(read(ack, &ch, 1) == 1 && ch == 'k');
}

/* Bytes of tensor i at dev that do not hold v: the whole tensor, or 4 KiB
 * at each end. */
static uint64_t bad_bytes(const char *dev, uint64_t v, int full, unsigned char *h)
{
	uint64_t bad = 0;

	if (full) {
		CHECK_OK(xfer(h, dev, TBYTES));
		for (uint64_t b = 0; b < TBYTES; b++)
			bad += h[b] != vbyte(v);
		return bad;
	}
	CHECK_OK(xfer(h, dev, 4096));
	CHECK_OK(xfer(h + 4096, dev + TBYTES - 4096, 4096));
	for (int b = 0; b < 8192; b++)
		bad += h[b] != vbyte(v);
	return bad;
}

struct consumer {
	wex_client_t *c;
	void *region;
	uint32_t seg;
};

static void consumer_open(struct consumer *k, const char *group)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL |
						     WEX_CLIENT_FIELD_GROUP,
				       .role = WEX_ROLE_CONSUMER, .model = "cycles", .group = group };
	const struct wex_tensor *pt;
	struct wex_sync_result r;
	struct wex_tensor t[NT];
	size_t n;

	CHECK_OK(wex_client_open(&p, &k->c));
	/* Learn the producer's segment id, then lay this rank out like it. */
	CHECK_OK(wex_sync(k->c, WEX_SYNC_REMAP_VIEW, 1, 10000, &r));
	CHECK(wex_producer_tensors(k->c, 0, &pt, &n) == 1 && n == NT);
	k->seg = pt[0].segment;
	CHECK_OK(wex_release(k->c));
	CHECK_OK(wex_reserve(k->c, 0, k->seg, NT * TBYTES, &k->region));
	make_tensors(t, 0, k->region);
	CHECK_OK(wex_attach(k->c, t, NT));
}

/* One cycle on version v: view, same-address and copy, each checked. */
static uint64_t cycle(struct consumer *k, uint64_t v, int full, unsigned char *h)
{
	struct wex_sync_result r;
	uint64_t bad = 0;

	CHECK_OK(wex_sync(k->c, WEX_SYNC_REMAP_VIEW, v, 10000, &r));
	CHECK(r.version == v);
	for (int i = 0; i < NT; i++) {
		char name[16];
		void *p;

		snprintf(name, sizeof(name), "w.%d", i);
		CHECK_OK(wex_view(k->c, 0, name, &p, NULL));
		bad += bad_bytes(p, v, full, h);
	}
	CHECK_OK(wex_sync(k->c, WEX_SYNC_REMAP_FIXED, v, 10000, &r));
	for (int i = 0; i < NT; i++)
		bad += bad_bytes((char *)k->region + i * TBYTES, v, full, h);
	CHECK_OK(wex_sync(k->c, WEX_SYNC_COPY, v, 10000, &r));
	CHECK(r.version == v && !wex_is_dirty(k->c));
	for (int i = 0; i < NT; i++)
		bad += bad_bytes((char *)k->region + i * TBYTES, v, full, h);
	return bad;
}

/* The consumer that gets killed: every sync copies (attach forgets what
 * the buffers hold).  Forked before this process touches CUDA (a child
 * of a CUDA process cannot use CUDA), it starts when `go` says so. */
static void copier(int go, int ready)
{
	struct consumer k;
	int n = 0;
	char ch;

	if (read(go, &ch, 1) != 1)
		_exit(0); /* the test ended before the kill step */
	consumer_open(&k, "victim");
	for (;;) {
		struct wex_tensor t[NT];
		struct wex_sync_result r;

		make_tensors(t, 0, k.region);
		CHECK_OK(wex_attach(k.c, t, NT));
		CHECK_OK(wex_sync(k.c, WEX_SYNC_COPY, 0, 10000, &r));
		if (++n == 3)
			CHECK(write(ready, "r", 1) == 1);
	}
}

static uint64_t cycle_count(void)
{
	const char *e = getenv("WEX_TEST_CYCLES");
	char *end;
	unsigned long long n;

	if (!e || !*e)
		return CYCLES;
	n = strtoull(e, &end, 10);
	if (*end || n < MIN_CYCLES || n > CYCLES) {
		fprintf(stderr, "cuda_cycles: WEX_TEST_CYCLES=%s: want %d to %d\n", e, MIN_CYCLES,
			CYCLES);
		exit(T_EXIT_FAIL);
	}
	return n;
}

int main(void)
{
	int rdy[2], go[2], st, fds0 = -1;
	struct gpu_world w;
	char ch;
	uint64_t bad = 0, mem0 = 0, v, ncycles = cycle_count();
	unsigned char *h;
	pid_t victim;
	struct consumer k;
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	char *status = NULL;

	gpu_require();
	gpu_world_start(&w, producer);
	CHECK(pipe(rdy) == 0 && pipe(go) == 0);
	victim = fork();
	CHECK(victim >= 0);
	if (victim == 0) {
		close(rdy[0]);
		close(go[1]);
		copier(go[0], rdy[1]);
	}
	close(rdy[1]);
	close(go[0]);
	h = malloc(TBYTES);
	CHECK(h != NULL);

	next_version(w.to_prod, w.from_prod);
	consumer_open(&k, "engine");
	for (v = 1; v <= ncycles; v++) {
		if (v > 1)
			next_version(w.to_prod, w.from_prod);
		bad += cycle(&k, v, v % FULL == 0, h);
		if (v % REOPEN == 0) {
			wex_client_close(k.c);
			consumer_open(&k, "engine");
		}
		if (v == 10) {
			fds0 = fd_count();
			mem0 = mem_free();
		}
	}
	printf("%llu cycles of view + same-address + copy: %llu bad bytes; fds %d -> %d; "
	       "free device memory %llu -> %llu MiB\n", (unsigned long long)ncycles,
	       (unsigned long long)bad, fds0,
	       fd_count(), (unsigned long long)(mem0 >> 20), (unsigned long long)(mem_free() >> 20));
	CHECK(bad == 0);
	CHECK_FDS(fds0);
	CHECK(mem_free() + NOISE >= mem0);

	/* A consumer killed while it copies. */
	CHECK(write(go[1], "g", 1) == 1);
	close(go[1]);
	CHECK(read(rdy[0], &ch, 1) == 1);
	nanosleep(&ts, NULL);
	CHECK(kill(victim, SIGKILL) == 0);
	CHECK(waitpid(victim, &st, 0) == victim && WIFSIGNALED(st));
	close(rdy[0]);
	CHECK_OK(wex_request(k.c, "status", NULL, &status)); /* wexd answers */
	wex_free(status);
	next_version(w.to_prod, w.from_prod); /* the producer may write: no lease left */
	bad = cycle(&k, v, 1, h);
	CHECK(bad == 0);
	printf("consumer killed mid-copy: wexd answers, the producer wrote v%llu, "
	       "this consumer read every byte of it\n", (unsigned long long)v);

	wex_client_close(k.c);
	gpu_world_stop(&w);
	free(h);
	printf("PASS\n");
	return 0;
}
