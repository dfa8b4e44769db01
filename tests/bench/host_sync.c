/* SPDX-License-Identifier: MIT */
/*
 * host_sync - benchmark of a consumer's sync on the host-memory backend.
 *
 * Model: Qwen2-0.5B-like, 290 tensors, ~1 GB of bf16 (WEX_BENCH_SMALL=1: a
 * small preset, for sanitizer builds).  A real wexd and a producer process;
 * this process is the consumer.  Measured, median of several runs:
 *   - remap sync latency: metadata only (the mapping is kept across
 *     versions, as an engine keeps it across steps), and with every page of
 *     the model touched after the sync; also the first (cold) remap;
 *   - copy sync bandwidth (plan executed with memcpy over T threads;
 *     before each the engine's buffer is zeroed, after it every byte is
 *     compared with the producer's, both untimed);
 *   - a copy sync right after same-address syncs: the region first gets
 *     private memory holding what it showed (new memory, written whole),
 *     then the plan copies into it; against the copy sync above;
 *   - verification (WEX_SYNC_VERIFY on the version held: every byte of
 *     the engine's buffer compared with the producer's, nothing copied),
 *     its comparison time (res.verify_seconds) and the whole sync;
 * and in the same run, the baselines:
 *   - memcpy of the same bytes with the same thread count, and the same
 *     copy with streaming stores (as libwex's executor copies); the faster
 *     of the two is the limit (copy_vs_limit);
 *   - memcmp of the same two buffers with the same thread count (the
 *     limit for verification: both sides read once);
 *   - streaming the bytes through a UNIX stream socket (one stream)
 *     from another process, the producer (its segment into the socket),
 *     into a populated buffer of ours not shared with any process; the
 *     page faults taken meanwhile are counted and must stay few (a
 *     writer forked after the buffer was written measured copy-on-write
 *     faults, not the socket);
 *   - writing then reading a safetensors file in /dev/shm (what RL
 *     frameworks do today).
 * The last line is one JSON object with the figures, the baselines and the
 * ratios (bigger is better for wex, except remap_touched_vs_copy and
 * remap_first_touched_vs_copy, which are remap time over copy time;
 * copy_vs_copy_after_fixed is copy time over the time of a copy after
 * same-address syncs), "runs" and "baseline_runs" (how many runs each
 * median is of) and "error" null.  A run that fails (a check, wexd, the
 * producer) says why on stderr and ends with a JSON line too: "error"
 * saying why, exit 1 (77, "error" "skipped: ...", without a wexd to run).
 *
 * usage: host_sync [WEXD_BIN]   (default: $WEXD_BIN)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "examples/model.h"
#include "tests/bench/bench_util.h"
#include "tests/wexd_dir.h"
#include "wex.h"

#define RUNS 5
#define BASE_RUNS 3 /* the socket and safetensors baselines */

/* Why the run failed: the JSON line an early exit leaves says it. */
static char bench_error[512];
static const char *bench_preset = "";
static int bench_threads;

/* The last line when the run did not finish: error says why (quotes,
 * backslashes and control characters become spaces). */
static void print_error_json_to(FILE *f, const char *error)
{
	fprintf(f, "{\"bench\":\"host_sync\",\"preset\":\"%s\",\"threads\":%d,\"runs\":%d,"
		"\"baseline_runs\":%d,\"error\":\"", bench_preset, bench_threads, RUNS, BASE_RUNS);
	for (const char *c = error; *c; c++)
		fputc(*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 ? ' ' : *c, f);
	fprintf(f, "\"}\n");
	fflush(f);
}

static void print_error_json(const char *error)
{
	print_error_json_to(stdout, error);
}

/* The line a SIGTERM or SIGINT (a ctest timeout, Ctrl-C) leaves
 * (bench_term_arm): wexd and the producer die with us (PR_SET_PDEATHSIG). */
static void print_term(FILE *f, void *arg)
{
	(void)arg;
	print_error_json_to(f, "terminated by a signal before the end");
}

/* Says on stderr why the run fails, and keeps it for the JSON line;
 * returns the exit status, 1. */
static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(bench_error, sizeof(bench_error), fmt, ap);
	va_end(ap);
	fprintf(stderr, "host_sync: %s\n", bench_error);
	return 1;
}

static void die(const char *what, int ret, wex_client_t *c)
{
	exit(fail("%s: %s %s", what, wex_strerror(ret), c ? wex_last_error(c) : ""));
}

/* ---- baselines --------------------------------------------------------- */

/*
 * A copy with streaming (non-temporal) stores, which skip the read for
 * ownership of the destination, as libwex's executor copies runs of 256
 * KiB and more (vmm/host.c): glibc's memcpy streams only above its
 * non-temporal threshold (240 MiB a call on the dev VM), so below it a
 * memcpy "limit" is a copy slower than the memory allows.  Four pages in
 * lockstep, 128 bytes at a time with AVX2 where the CPU has it.
 */
#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void stream_avx2(char *dst, const char *src, size_t len)
{
	for (; len >= 4 * 4096; len -= 4 * 4096, dst += 4 * 4096, src += 4 * 4096)
		for (int off = 0; off < 4096; off += 128)
			for (int p = 0; p < 4; p++)
				for (int k = 0; k < 128; k += 32)
					_mm256_stream_si256((__m256i *)(dst + p * 4096 + off + k),
							    _mm256_loadu_si256((const __m256i *)(src + p * 4096 + off + k)));
	for (; len >= 32; len -= 32, dst += 32, src += 32)
		_mm256_stream_si256((__m256i *)dst, _mm256_loadu_si256((const __m256i *)src));
	_mm_sfence();
	memcpy(dst, src, len);
}

static void stream_copy(char *dst, const char *src, size_t len)
{
	size_t head = (64 - ((uintptr_t)dst & 63)) & 63;

	if (head > len)
		head = len;
	memcpy(dst, src, head);
	dst += head, src += head, len -= head;
	if (__builtin_cpu_supports("avx2")) {
		stream_avx2(dst, src, len);
		return;
	}
	for (; len >= 16; len -= 16, dst += 16, src += 16)
		_mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
	_mm_sfence();
	memcpy(dst, src, len);
}
#else
static void stream_copy(char *dst, const char *src, size_t len)
{
	memcpy(dst, src, len);
}
#endif

struct mc {
	char *dst;
	const char *src;
	size_t len;
	int stream;
};

static void *mc_worker(void *a)
{
	struct mc *m = a;

	if (m->stream)
		stream_copy(m->dst, m->src, m->len);
	else
		memcpy(m->dst, m->src, m->len);
	return NULL;
}

/* memcpy (stream: stream_copy) over `threads` threads. */
static void par_memcpy(char *dst, const char *src, size_t len, int threads, int stream)
{
	pthread_t t[64];
	struct mc m[64];

	for (int i = 0; i < threads; i++) {
		size_t b = len * (size_t)i / (size_t)threads, e = len * (size_t)(i + 1) / (size_t)threads;

		m[i] = (struct mc){ dst + b, src + b, e - b, stream };
		if (i)
			pthread_create(&t[i], NULL, mc_worker, &m[i]);
	}
	mc_worker(&m[0]);
	for (int i = 1; i < threads; i++)
		pthread_join(t[i], NULL);
}

struct mcmp {
	const char *a, *b;
	size_t len;
	int differ;
};

static void *mcmp_worker(void *arg)
{
	struct mcmp *m = arg;

	m->differ = memcmp(m->a, m->b, m->len) != 0;
	return NULL;
}

/* memcmp over `threads` threads; 1 if the buffers differ. */
static int par_memcmp(const char *a, const char *b, size_t len, int threads)
{
	pthread_t t[64];
	struct mcmp m[64];
	int differ = 0;

	for (int i = 0; i < threads; i++) {
		size_t lo = len * (size_t)i / (size_t)threads;
		size_t hi = len * (size_t)(i + 1) / (size_t)threads;

		m[i] = (struct mcmp){ a + lo, b + lo, hi - lo, 0 };
		if (i)
			pthread_create(&t[i], NULL, mcmp_worker, &m[i]);
	}
	mcmp_worker(&m[0]);
	for (int i = 1; i < threads; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < threads; i++)
		differ |= m[i].differ;
	return differ;
}

/* Page faults this process has taken so far (minor and major). */
static long faults_now(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt + ru.ru_majflt;
}

/*
 * The socket baseline: the producer process (another process, as a
 * trainer streaming its weights to an engine would be) writes its
 * segment's `len` bytes into a UNIX stream socket, and this process reads
 * them into dst.  The producer was forked before this process mapped
 * anything big, and dst was mapped after every fork, so no page here is
 * shared copy-on-write with the writer: the clock covers the transfer
 * alone, from the command that starts the writer to the last byte read
 * (a writer forked inside the clock made each page read() filled take a
 * copy-on-write fault, and the fork copied this process's page tables:
 * 3-6x the transfer on the dev VM).  *faults: the page faults taken
 * meanwhile (about none once dst is populated; one per page of dst with
 * copy-on-write).
 */
static double socket_stream(char *dst, size_t len, int cmd_fd, int sock_fd, long *faults)
{
	size_t got = 0;
	long f0 = faults_now();
	double t0 = ex_now();

	if (write(cmd_fd, "s", 1) != 1)
		return -1;
	while (got < len) {
		ssize_t n = read(sock_fd, dst + got, len - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	t0 = ex_now() - t0;
	*faults = faults_now() - f0;
	return got == len ? t0 : -1;
}

/* Write the tensors as a safetensors file in /dev/shm, then read them back
 * tensor by tensor into dst (header parsed for the offsets, as a loader
 * does).  Returns the total time. */
static double safetensors_roundtrip(char *dst, const char *src, const struct wex_tensor *t, int n)
{
	char path[] = "/dev/shm/wex-bench-XXXXXX";
	size_t cap = (size_t)n * 256 + 64, hl = 0, data = 0;
	char *hdr = malloc(cap);
	uint64_t hlen;
	double t0 = ex_now();
	int fd = mkstemp(path);

	if (fd < 0 || !hdr)
		return -1;
	hl += (size_t)snprintf(hdr + hl, cap - hl, "{");
	for (int i = 0; i < n; i++) {
		size_t nb = wex_tensor_nbytes(&t[i]);

		hl += (size_t)snprintf(hdr + hl, cap - hl,
				       "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu%s%.0llu],\"data_offsets\":[%zu,%zu]}",
				       i ? "," : "", t[i].name, (unsigned long long)t[i].extent[0],
				       t[i].ndim == 2 ? "," : "",
				       t[i].ndim == 2 ? (unsigned long long)t[i].extent[1] : 0ull, data,
				       data + nb);
		data += nb;
	}
	hl += (size_t)snprintf(hdr + hl, cap - hl, "}");
	while (hl % 8)
		hdr[hl++] = ' ';
	hlen = hl;
	if (write(fd, &hlen, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl)
		goto fail;
	for (int i = 0; i < n; i++) {
		size_t nb = wex_tensor_nbytes(&t[i]);

		if (write(fd, src + t[i].offset, nb) != (ssize_t)nb)
			goto fail;
	}
	fsync(fd);
	close(fd);
	/* Load: open, read the header, read each tensor to its place. */
	fd = open(path, O_RDONLY);
	if (fd < 0 || read(fd, &hlen, 8) != 8)
		goto fail;
	char *h2 = malloc(hlen + 1);

	if (!h2 || pread(fd, h2, hlen, 8) != (ssize_t)hlen)
		goto fail;
	data = 0;
	for (int i = 0; i < n; i++) {
		size_t nb = wex_tensor_nbytes(&t[i]);
		char *p = strstr(h2, t[i].name); /* locate the entry, as a parser would */

		if (!p || pread(fd, dst + t[i].offset, nb, (off_t)(8 + hlen + data)) != (ssize_t)nb)
			goto fail;
		data += nb;
	}
	free(h2);
	close(fd);
	unlink(path);
	free(hdr);
	return ex_now() - t0;
fail:
	unlink(path);
	free(hdr);
	return -1;
}

/* Whether every tensor's bytes at a equal those at b (b: the producer's
 * segment, checked against the pattern once; memcmp is far faster). */
static int same_tensors(const void *a, const void *b, const struct wex_tensor *t, int n)
{
	for (int i = 0; i < n; i++)
		if (memcmp((const char *)a + t[i].offset, (const char *)b + t[i].offset,
			   wex_tensor_nbytes(&t[i])))
			return 0;
	return 1;
}

/* Ends the consumer's lease and has the producer publish the next version
 * (it waits in begin_write until the lease is gone). */
static int next_version(wex_client_t *c, int cmd_fd, int ack_fd)
{
	char a;

	wex_release(c);
	if (write(cmd_fd, "p", 1) != 1 || read(ack_fd, &a, 1) != 1)
		return -1;
	return 0;
}

/* ---- producer process -------------------------------------------------- */

static void producer(const char *preset, int cmd_fd, int ack_fd, int sock_fd)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
		.role = WEX_ROLE_PRODUCER, .model = "bench",
	};
	struct wex_tensor *t;
	struct ex_cfg cfg;
	uint64_t bytes, v = 1;
	wex_client_t *c;
	uint32_t seg;
	void *base;
	int n, ret;
	char cmd;

	ex_cfg_preset(&cfg, preset);
	n = ex_shards(&cfg, 0, 1, &t, &bytes);
	if ((ret = wex_client_open(&p, &c)) < 0)
		die("producer open", ret, NULL);
	if ((ret = wex_segment_alloc(c, WEX_SEG_HOST, 0, bytes, &seg, &base)) < 0)
		die("producer alloc", ret, c);
	if ((ret = wex_register_tensors(c, t, (size_t)n)) < 0)
		die("producer register", ret, c);
	if ((ret = wex_begin_write(c, v, 0)) < 0)
		die("begin_write", ret, c);
	ex_fill(base, t, (size_t)n, v, 2);
	if ((ret = wex_publish(c, v)) < 0)
		die("publish", ret, c);
	(void)!write(ack_fd, "r", 1);
	/* Each 'p' publishes the next version with the bytes of v1 left in
	 * place, so that the timed path is the sync and not the trainer's
	 * writes (the consumer checks the bytes against v1's pattern).  Each
	 * 's' writes the segment into the baseline's socket (the consumer
	 * counts the bytes and compares them). */
	while (read(cmd_fd, &cmd, 1) == 1 && (cmd == 'p' || cmd == 's')) {
		if (cmd == 's') {
			for (uint64_t off = 0; off < bytes;) {
				uint64_t chunk = bytes - off > (1 << 20) ? (1 << 20) : bytes - off;
				ssize_t w = write(sock_fd, (char *)base + off, chunk);

				if (w <= 0)
					_exit(1);
				off += (uint64_t)w;
			}
			continue;
		}
		v++;
		if ((ret = wex_begin_write(c, v, 0)) < 0)
			die("begin_write", ret, c);
		if ((ret = wex_publish(c, v)) < 0)
			die("publish", ret, c);
		(void)!write(ack_fd, "r", 1);
	}
	wex_client_close(c);
	free(t);
	_exit(0);
}

/* An early return (a failed check) leaves wexd to PR_SET_PDEATHSIG: its
 * socket and journal directory would stay in /tmp. */
static char bench_dir[64];
static pid_t bench_wexd, bench_main;
static int bench_done; /* the finished run's JSON line is out */

static void bench_cleanup(void)
{
	if (getpid() != bench_main)
		return; /* the producer child's die() */
	/* An early exit: the last line is still the JSON object, and a
	 * signal from here on (the cleanup below waits for wexd) stays
	 * blocked, so that no handler writes a second line after it (the
	 * exit status still says the run failed). */
	if (!bench_done) {
		sigset_t term;

		bench_hold_term(&term);
		print_error_json(bench_error[0] ? bench_error : "the run failed (see above)");
	}
	if (bench_wexd > 0) {
		kill(bench_wexd, SIGKILL);
		waitpid(bench_wexd, NULL, 0);
	}
	if (bench_dir[0])
		rm_wexd_dir(bench_dir, 1);
}

int main(int argc, char **argv)
{
	const char *wexd = argc > 1 ? argv[1] : getenv("WEXD_BIN");
	int small = getenv("WEX_BENCH_SMALL") && *getenv("WEX_BENCH_SMALL") == '1';
	const char *preset = small ? "small" : "qwen2-0.5b";
	char dir[64], sock[128];
	int ready[2], cmd[2], ack[2], sv[2], threads, n, ret, bufsz = 4 << 20;
	long sock_faults[BASE_RUNS];
	double vfy_t[RUNS], vsync_t[RUNS], cmp_t[RUNS];
	double copy_t[RUNS], meta_t[RUNS], touch_t[RUNS], fixed_t[RUNS], mc_t[RUNS], stream_t[RUNS], back_t[RUNS],
		sock_t[BASE_RUNS], st_t[BASE_RUNS], first_ms, cold_touch_ms, fixed_first_ms = 0;
	pid_t dpid, ppid, parent = getpid();
	struct wex_tensor *t;
	struct ex_cfg cfg;
	uint64_t bytes, model_bytes = 0, last;
	wex_client_t *c;
	void *region;
	char *dst;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	sigset_t term;

	/* Each line as it is made: a reader (a step's log, bench_json.py)
	 * sees how far a run got. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	threads = ncpu > 8 ? 8 : ncpu < 1 ? 1 : (int)ncpu;
	bench_preset = preset;
	bench_threads = threads;
	if (!wexd) {
		fprintf(stderr, "host_sync: set WEXD_BIN or pass the wexd path\n");
		print_error_json("skipped: no wexd to run (set WEXD_BIN or pass the wexd path)");
		return 77;
	}
	bench_main = getpid();
	atexit(bench_cleanup);
	{
		/* $TMPDIR where short enough for the socket's path (a run a
		 * signal ends leaves it there: bench_json.py's is removed). */
		const char *td = getenv("TMPDIR");

		snprintf(dir, sizeof(dir), "%s/wex-bench-XXXXXX",
			 td && *td == '/' && strlen(td) < 40 ? td : "/tmp");
	}
	if (!mkdtemp(dir))
		return fail("mkdtemp %s: %s", dir, strerror(errno));
	snprintf(bench_dir, sizeof(bench_dir), "%s", dir);
	snprintf(sock, sizeof(sock), "%s/wexd.sock", dir);
	setenv("WEX_SOCKET", sock, 1);
	/* Close-on-exec: wexd must not hold the producer's pipes open, or a
	 * failed producer (or consumer) would leave the other side waiting
	 * on them for ever. */
	if (pipe(ready) < 0 || pipe2(cmd, O_CLOEXEC) < 0 || pipe2(ack, O_CLOEXEC) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return fail("pipe or socketpair: %s", strerror(errno));
	/* The socket baseline's stream: the producer writes into sv[1]. */
	setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
	setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
	dpid = fork();
	if (dpid == 0) {
		char fds[16];

		/* Dies with us, also when we exit on an error (die()), or were
		 * killed before the request took (a SIGTERM'd run). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		close(ready[0]);
		snprintf(fds, sizeof(fds), "%d", ready[1]);
		setenv("WEXD_READY_FD", fds, 1);
		setenv("WEX_LOG_LEVEL", "warn", 1);
		execl(wexd, wexd, (char *)NULL);
		_exit(127);
	}
	bench_wexd = dpid;
	close(ready[1]);
	{
		char b[8];

		if (read(ready[0], b, sizeof(b)) <= 0)
			return fail("wexd did not start (%s)", wexd);
	}
	ppid = fork();
	if (ppid == 0) {
		/* Only our end of each pipe: when we exit, its read sees EOF. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		close(cmd[1]);
		close(ack[0]);
		close(sv[0]);
		producer(preset, cmd[0], ack[1], sv[1]);
	}
	close(cmd[0]);
	close(ack[1]);
	close(sv[1]);
	/* From here a signal's end leaves the JSON line too (the producer,
	 * forked before, keeps the default action). */
	bench_term_arm(print_term, NULL);
	{
		char r;

		if (read(ack[0], &r, 1) != 1)
			return fail("the producer did not publish its first version (see above)");
	}
	ex_cfg_preset(&cfg, preset);
	n = ex_shards(&cfg, 0, 1, &t, &bytes);
	for (int i = 0; i < n; i++)
		model_bytes += wex_tensor_nbytes(&t[i]);
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_COPY_THREADS,
		.role = WEX_ROLE_CONSUMER, .model = "bench", .copy_threads = (uint32_t)threads,
	};
	if ((ret = wex_client_open(&p, &c)) < 0)
		die("consumer open", ret, NULL);
	if ((ret = wex_reserve(c, 0, 0, bytes, &region)) < 0)
		die("reserve", ret, c);
	for (int i = 0; i < n; i++)
		t[i].ptr = (char *)region + t[i].offset;
	if ((ret = wex_attach(c, t, (size_t)n)) < 0)
		die("attach", ret, c);
	memset(region, 0, bytes); /* the engine's buffer exists before the first sync */
	/* Mapped after the last fork (wexd's, the producer's): no page of it
	 * is shared copy-on-write with another process. */
	dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* The baselines write memory of the kind wex_reserve gives the
	 * engine (asked for in huge pages): a copy into 4 KiB pages measured
	 * 35-58 ms against 29-39 ms for the same bytes into huge pages on
	 * the dev VM, which would flatter the ratios. */
	(void)madvise(dst, bytes, MADV_HUGEPAGE);
	memset(dst, 0, bytes);

	printf("host_sync: %s model, %d tensors, %.1f MiB bf16; %d copy threads; wexd %s\n", preset, n,
	       (double)model_bytes / (1 << 20), threads, wexd);

	/* First (cold) remap: fetch, mmap, then every page touched. */
	struct wex_sync_result r;
	double t0 = ex_now();
	volatile uint64_t sink = 0;
	const char *src;

	if ((ret = wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 0, &r)) < 0)
		die("remap", ret, c);
	first_ms = (ex_now() - t0) * 1e3;
	if ((ret = wex_view(c, 0, t[0].name, (void **)&src, NULL)) < 0)
		die("view", ret, c);
	src -= t[0].offset; /* the segment's base */
	for (uint64_t o = 0; o < bytes; o += 4096)
		sink += (uint64_t)src[o];
	cold_touch_ms = (ex_now() - t0) * 1e3;
	if (ex_check(src, t, (size_t)n, r.version, threads))
		return fail("remapped bytes are wrong");
	last = r.version;

	for (int k = 0; k < RUNS; k++) {
		/* A new version each time: the producer waits for our lease. */
		if (next_version(c, cmd[1], ack[0]) < 0)
			return fail("the producer did not publish the next version (see above)");
		t0 = ex_now();
		if ((ret = wex_sync(c, WEX_SYNC_REMAP_VIEW, last + 1, 0, &r)) < 0)
			die("remap", ret, c);
		meta_t[k] = ex_now() - t0;
		for (uint64_t o = 0; o < bytes; o += 4096)
			sink += (uint64_t)src[o];
		touch_t[k] = ex_now() - t0;
		last = r.version;
	}
	for (int k = 0; k < RUNS; k++) {
		if (next_version(c, cmd[1], ack[0]) < 0)
			return fail("the producer did not publish the next version (see above)");
		/* Untimed: the engine's buffer to 0, so that the check after
		 * the sync tells whether this very copy delivered (every
		 * version carries v1's bytes). */
		memset(region, 0, bytes);
		t0 = ex_now();
		if ((ret = wex_sync(c, WEX_SYNC_COPY, last + 1, 0, &r)) < 0)
			die("copy", ret, c);
		copy_t[k] = ex_now() - t0;
		if (getenv("WEX_BENCH_VERBOSE"))
			fprintf(stderr, "copy run %d: %.1f ms (%llu ops, %llu bytes)\n", k, copy_t[k] * 1e3, (unsigned long long)r.ops, (unsigned long long)r.bytes);
		last = r.version;
		if (r.bytes != model_bytes || !same_tensors(region, src, t, n))
			return fail("copied bytes are wrong (copy run %d, %llu of %llu bytes)", k,
				    (unsigned long long)r.bytes, (unsigned long long)model_bytes);

		/* The baselines' destination as the copy sync's: just
		 * written (untimed). */
		memset(dst, 0, bytes);
		t0 = ex_now();
		par_memcpy(dst, src, bytes, threads, 0);
		mc_t[k] = ex_now() - t0;
		memset(dst, 0, bytes);
		t0 = ex_now();
		par_memcpy(dst, src, bytes, threads, 1);
		stream_t[k] = ex_now() - t0;
		if (memcmp(dst, src, bytes))
			return fail("the streaming-store copy baseline copied wrong bytes");
	}
	/* Verification of the version held (nothing to copy): every byte of
	 * the engine's buffer against the producer's, and the same-run
	 * limit, memcmp of the two with the same threads. */
	for (int k = 0; k < RUNS; k++) {
		t0 = ex_now();
		if ((ret = wex_sync(c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, last, 0, &r)) < 0)
			die("verify", ret, c);
		vsync_t[k] = ex_now() - t0;
		vfy_t[k] = r.verify_seconds;
		if (r.changed || r.verified != model_bytes)
			return fail("verify run %d compared %llu of %llu bytes (changed %d)", k,
				    (unsigned long long)r.verified, (unsigned long long)model_bytes,
				    r.changed);
		t0 = ex_now();
		if (par_memcmp(region, src, bytes, threads))
			return fail("the engine's buffer differs from the producer's");
		cmp_t[k] = ex_now() - t0;
	}
	/* Same-address: the first maps the producer's memory over the
	 * engine's buffer; later versions keep the mapping.  The buffer to 0
	 * first (untimed): it holds the copies' bytes, which are the
	 * producer's, so the check after could not tell a mapping that was
	 * never made. */
	memset(region, 0, bytes);
	for (int k = 0; k < RUNS; k++) {
		if (next_version(c, cmd[1], ack[0]) < 0)
			return fail("the producer did not publish the next version (see above)");
		t0 = ex_now();
		if ((ret = wex_sync(c, WEX_SYNC_REMAP_FIXED, last + 1, 0, &r)) < 0)
			die("remap fixed", ret, c);
		fixed_t[k] = ex_now() - t0;
		if (k == 0)
			fixed_first_ms = fixed_t[0] * 1e3;
		last = r.version;
	}
	wex_release(c);
	/* The engine's buffer shows the producer's memory (v1's pattern). */
	if (ex_check(NULL, t, (size_t)n, 1, threads))
		return fail("same-address remapped bytes are wrong");
	/* Back to copying: each time the region gives up the producer's
	 * memory for private memory holding what it showed, then copies
	 * (same-address again between runs). */
	for (int k = 0; k < RUNS; k++) {
		if (k) {
			if (next_version(c, cmd[1], ack[0]) < 0)
				return fail("the producer did not publish the next version (see above)");
			if ((ret = wex_sync(c, WEX_SYNC_REMAP_FIXED, last + 1, 0, &r)) < 0)
				die("remap fixed", ret, c);
			last = r.version;
		}
		if (next_version(c, cmd[1], ack[0]) < 0)
			return fail("the producer did not publish the next version (see above)");
		t0 = ex_now();
		if ((ret = wex_sync(c, WEX_SYNC_COPY, last + 1, 0, &r)) < 0)
			die("copy after same-address", ret, c);
		back_t[k] = ex_now() - t0;
		last = r.version;
		/* Every version carries v1's bytes: this checks that the
		 * restore and the copy left the producer's bytes and that the
		 * plan copied all of them (r.bytes), not that this very copy
		 * wrote them (the copy runs above do that). */
		if (r.bytes != model_bytes || !same_tensors(region, src, t, n))
			return fail("copy after same-address: bytes are wrong (run %d)", k);
	}
	wex_release(c);
	for (int k = 0; k < BASE_RUNS; k++) {
		sock_t[k] = socket_stream(dst, bytes, cmd[1], sv[0], &sock_faults[k]);
		if (sock_t[k] < 0 || memcmp(dst, src, bytes))
			return fail("the socket baseline %s",
				    sock_t[k] < 0 ? "failed" : "delivered wrong bytes");
		/* dst was populated before: a fault per page means the
		 * transfer paid for copy-on-write (a writer forked after dst
		 * was written), not only for the socket. */
		if (sock_faults[k] > 64 + (long)(bytes / 4096 / 16))
			return fail("the socket baseline took %ld page faults for %llu pages of "
				    "populated memory: it measures copy-on-write, not the socket",
				    sock_faults[k], (unsigned long long)(bytes / 4096));
		st_t[k] = safetensors_roundtrip(dst, src, t, n);
		if (st_t[k] < 0)
			return fail("the safetensors baseline failed (writing or reading /dev/shm)");
	}
	(void)!write(cmd[1], "q", 1);
	waitpid(ppid, NULL, 0);
	wex_client_close(c);
	kill(dpid, SIGTERM);
	waitpid(dpid, NULL, 0);
	bench_wexd = 0;
	rm_wexd_dir(dir, 0);

	double copy_s = bench_median(copy_t, RUNS), meta_s = bench_median(meta_t, RUNS),
	       touch_s = bench_median(touch_t, RUNS), fixed_s = bench_median(fixed_t, RUNS),
	       mc_s = bench_median(mc_t, RUNS), stream_s = bench_median(stream_t, RUNS), sock_s = bench_median(sock_t, BASE_RUNS),
	       st_s = bench_median(st_t, BASE_RUNS),
	       vfy_s = bench_median(vfy_t, RUNS), vsync_s = bench_median(vsync_t, RUNS), back_s = bench_median(back_t, RUNS),
	       cmp_s = bench_median(cmp_t, RUNS);
	double gib = (double)model_bytes / (1 << 30);
	double limit_s = stream_s < mc_s ? stream_s : mc_s; /* the faster plain copy */
	long sock_faults_max = 0;

	for (int k = 0; k < BASE_RUNS; k++)
		if (sock_faults[k] > sock_faults_max)
			sock_faults_max = sock_faults[k];

	printf("medians of %d runs (socket and safetensors baselines: of %d)\n", RUNS, BASE_RUNS);
	printf("%-40s %10s %12s\n", "measure (median)", "ms", "GiB/s");
	printf("%-40s %10.3f %12s\n", "remap sync, metadata only", meta_s * 1e3, "-");
	printf("%-40s %10.3f %12s\n", "remap sync + every page touched", touch_s * 1e3, "-");
	printf("%-40s %10.3f %12s\n", "remap same-address sync (kept mapping)", fixed_s * 1e3, "-");
	printf("%-40s %10.3f %12s\n", "remap same-address sync (first map)", fixed_first_ms, "-");
	printf("%-40s %10.3f %12s\n", "first remap (fetch+mmap), pages touched", cold_touch_ms, "-");
	printf("%-40s %10.3f %12.2f\n", "copy sync", copy_s * 1e3, gib / copy_s);
	printf("%-40s %10.3f %12.2f\n", "copy sync after same-address (new mem)", back_s * 1e3,
	       gib / back_s);
	printf("%-40s %10.3f %12.2f\n", "baseline: memcpy, same threads", mc_s * 1e3, gib / mc_s);
	printf("%-40s %10.3f %12.2f\n", "baseline: streaming stores, same threads", stream_s * 1e3,
	       gib / stream_s);
	printf("%-40s %10.3f %12.2f\n", "limit: the faster of the two", limit_s * 1e3, gib / limit_s);
	printf("%-40s %10.3f %12.2f\n", "verify: compare every byte", vfy_s * 1e3, gib / vfy_s);
	printf("%-40s %10.3f %12.2f\n", "verified sync (held version)", vsync_s * 1e3, gib / vsync_s);
	printf("%-40s %10.3f %12.2f\n", "baseline: memcmp, same threads (limit)", cmp_s * 1e3,
	       gib / cmp_s);
	printf("%-40s %10.3f %12.2f\n", "baseline: UNIX stream socket", sock_s * 1e3, gib / sock_s);
	printf("%-40s %10.3f %12.2f\n", "baseline: safetensors write+read /dev/shm", st_s * 1e3,
	       gib / st_s);
	/* The README's targets: one not met is said here and is false in the
	 * JSON line's "targets" (the exit status stays 0: speed is read from
	 * the output, never asserted). */
	static const char *const tname[] = { "copy_vs_memcpy>=0.9", "remap_touched_vs_copy<=0.5",
					     "remap_metadata_ms<2", "copy_vs_socket>=5",
					     "remap_touched_vs_socket>=5" };
	double tval[] = { mc_s / copy_s, touch_s / copy_s, meta_s * 1e3, sock_s / copy_s,
			  sock_s / touch_s };
	int met[] = { tval[0] >= 0.9, tval[1] <= 0.5, tval[2] < 2, tval[3] >= 5, tval[4] >= 5 };

	for (int i = 0; i < 5; i++)
		if (!met[i])
			printf("target not met: %s (measured %.3f)\n", tname[i], tval[i]);
	/* A signal now ends us after the line, as it would have, and no
	 * handler writes a second one. */
	bench_hold_term(&term);
	bench_done = 1;
	printf("{\"bench\":\"host_sync\",\"preset\":\"%s\",\"tensors\":%d,\"bytes\":%llu,\"threads\":%d,"
	       "\"runs\":%d,\"baseline_runs\":%d,\"error\":null,"
	       "\"remap_metadata_ms\":%.4f,\"remap_touched_ms\":%.4f,\"remap_fixed_ms\":%.4f,\"remap_fixed_first_ms\":%.3f,"
	       "\"remap_first_ms\":%.3f,\"remap_first_touched_ms\":%.3f,"
	       "\"copy_ms\":%.3f,\"copy_gib_s\":%.3f,\"copy_after_fixed_ms\":%.3f,\"verify_ms\":%.3f,\"verified_sync_ms\":%.3f,"
	       "\"baselines\":{\"memcpy_ms\":%.3f,\"memcpy_gib_s\":%.3f,\"stream_ms\":%.3f,\"limit_ms\":%.3f,"
	       "\"memcmp_ms\":%.3f,\"socket_ms\":%.3f,"
	       "\"socket_gib_s\":%.3f,\"socket_faults\":%ld,\"safetensors_ms\":%.3f},"
	       "\"ratios\":{\"copy_vs_memcpy\":%.3f,\"copy_vs_limit\":%.3f,\"verify_vs_memcmp\":%.3f,\"remap_touched_vs_copy\":%.4f,"
	       "\"copy_vs_socket\":%.2f,\"remap_touched_vs_socket\":%.2f,\"copy_vs_safetensors\":%.2f,"
	       "\"remap_first_touched_vs_copy\":%.3f,\"copy_vs_copy_after_fixed\":%.3f},"
	       "\"targets\":{\"%s\":%s,\"%s\":%s,\"%s\":%s,\"%s\":%s,\"%s\":%s}}\n",
	       preset, n, (unsigned long long)model_bytes, threads, RUNS, BASE_RUNS, meta_s * 1e3, touch_s * 1e3,
	       fixed_s * 1e3, fixed_first_ms, first_ms, cold_touch_ms, copy_s * 1e3, gib / copy_s,
	       back_s * 1e3, vfy_s * 1e3, vsync_s * 1e3, mc_s * 1e3, gib / mc_s, stream_s * 1e3, limit_s * 1e3,
	       cmp_s * 1e3, sock_s * 1e3, gib / sock_s, sock_faults_max, st_s * 1e3, mc_s / copy_s,
	       limit_s / copy_s, cmp_s / vfy_s, touch_s / copy_s,
	       sock_s / copy_s, sock_s / touch_s, st_s / copy_s, cold_touch_ms / 1e3 / copy_s, copy_s / back_s,
	       tname[0], met[0] ? "true" : "false", tname[1], met[1] ? "true" : "false", tname[2],
	       met[2] ? "true" : "false", tname[3], met[3] ? "true" : "false", tname[4],
	       met[4] ? "true" : "false");
	fflush(stdout);
	sigprocmask(SIG_UNBLOCK, &term, NULL);
	(void)sink;
	munmap(dst, bytes);
	free(t);
	return 0;
}
