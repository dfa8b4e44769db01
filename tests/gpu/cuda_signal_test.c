/* SPDX-License-Identifier: MIT */
/*
 * cuda_signal - a signal that comes while a call waits for the GPU work
 * before it asks wexd (WEX_CLIENT_EINTR) is seen, through a real wexd.
 *
 * The GPU is kept busy for BUSY_MS (a kernel that spins on the global
 * timer; on the emulated driver WEX_EMUL_SYNC_MS, cuCtxSynchronize taking
 * that long), and a thread sends SIGUSR1 (a handler that notes when and
 * where it ran, as Python's sets a flag) KICK_MS into the call:
 *  1. default_action: a producer child waits in wex_publish for the GPU,
 *     and SIGTERM, left to its default action, ends the process at once,
 *     not once the GPU work is done;
 *  2. publish: wexd stopped (SIGSTOP), the signal sent to the process (as
 *     Ctrl-C is: the kick's thread does not hold it either) in the GPU
 *     wait: the handler runs once, at once, on the calling thread, and the
 *     publish ends with -EINTR, saying so, 3 s (the grace a hung wexd gets
 *     after a signal) after the GPU wait, not at the client's timeout;
 *     wexd going on (SIGCONT), the publish called again succeeds and a
 *     consumer copies the version whole;
 *  3. sync: the signal sent to the calling thread: a copy sync waiting for
 *     a version nobody publishes ends with -EINTR once its GPU wait (the
 *     settle before the acquire) is over, not at its timeout, nothing
 *     acquired, the handler run at once; the next version is then copied
 *     whole;
 *  4. chained: a registration over 3 VMM allocations (as PyTorch's
 *     expandable segments make them) whose third part's request wexd
 *     does not answer (stopped as it is sent), wex_cancel at 0.3 s:
 *     -ECANCELED 3 s after it, and the parts registered before are not
 *     kept: once wexd goes on, the call made again sends 4 requests (3
 *     parts and the chain, none left over to register again) and gets
 *     the id the first would have had;
 *  5. chained, slow: the same registration on a wexd that answers each
 *     part 2 s after it was sent (stopped as each is sent, continued 2 s
 *     later: within the 3 s grace each time), wex_cancel at 0.3 s:
 *     -ECANCELED 3 s after the cancel, in the second part's wait.  Each
 *     wait gave its own request the 3 s: the registration went on to
 *     its end (4 requests, 8 s) and succeeded.
 * With the GPU waited for on the calling thread, the handler runs inside
 * the driver unseen, and cases 2 and 3 wait their timeouts; with the
 * signals held there instead, the one sent to the process goes to the
 * kick's thread, and case 2 does.  Needs a CUDA driver and device
 * (exit 77 with the reason otherwise); CI runs it against
 * tests/gpu/emul_cuda.c (cuda_signal_emul).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_util.h"
#include "wex.h"

#define NT 4
#define ROWS 256
#define COLS 1024 /* bf16: 512 KiB a tensor */
#define BUSY_MS 1000
#define KICK_MS 300
#define TIMEOUT_MS 20000

/* wex_spin(ns): one thread spins until the global timer passed ns. */
static const char spin_ptx[] =
	".version 7.0\n"
	".target sm_80\n"
	".address_size 64\n"
	"\n"
	".visible .entry wex_spin(\n"
	"	.param .u64 p_ns\n"
	")\n"
	"{\n"
	"	.reg .pred %p<2>;\n"
	"	.reg .b64 %rd<5>;\n"
	"\n"
	"	ld.param.u64 %rd1, [p_ns];\n"
	"	mov.u64 %rd2, %globaltimer;\n"
	"	add.s64 %rd3, %rd2, %rd1;\n"
	"LOOP:\n"
	"	mov.u64 %rd4, %globaltimer;\n"
	"	setp.lt.u64 %p1, %rd4, %rd3;\n"
	"	@%p1 bra LOOP;\n"
	"	ret;\n"
	"}\n";

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The handler: how often it ran, when it last did, and on which thread. */
static volatile sig_atomic_t usr1_seen, usr1_here;
static double usr1_at;
static pthread_t main_thread;

static void on_usr1(int sig)
{
	(void)sig;
	usr1_seen++;
	usr1_at = now_s();
	usr1_here = pthread_equal(pthread_self(), main_thread);
}

/* Keeps device 0 busy for ms from now: its next cuCtxSynchronize waits
 * that long.  end_busy after the call under test. */
static void start_busy(unsigned ms)
{
	static CUfunction spin;
	uint64_t ns = (uint64_t)ms * 1000000ull;
	void *args[] = { &ns };
	char v[16];

	if (emulated()) {
		snprintf(v, sizeof(v), "%u", ms);
		setenv("WEX_EMUL_SYNC_MS", v, 1);
		return;
	}
	CHECK_OK(wex__cuda_use_device(0));
	if (!spin) {
		CUmodule mod;

		CU_OK(wex__cu.cuModuleLoadData(&mod, spin_ptx));
		CU_OK(wex__cu.cuModuleGetFunction(&spin, mod, "wex_spin"));
	}
	CU_OK(wex__cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
}

static void end_busy(void)
{
	unsetenv("WEX_EMUL_SYNC_MS");
}

/* SIGUSR1 at KICK_MS from a thread of its own (which does not hold it):
 * to this thread, or to the process (as Ctrl-C or kill(1) send it: the
 * kernel gives it to any thread that does not hold it). */
struct kick {
	pthread_t thread, target;
	int process;
};

static void *kick_run(void *arg)
{
	struct kick *k = arg;

	usleep(KICK_MS * 1000);
	if (k->process)
		kill(getpid(), SIGUSR1);
	else
		pthread_kill(k->target, SIGUSR1);
	return NULL;
}

static void kick_start(struct kick *k, int process)
{
	k->target = pthread_self();
	k->process = process;
	CHECK(pthread_create(&k->thread, NULL, kick_run, k) == 0);
}

static void kick_join(struct kick *k)
{
	CHECK(pthread_join(k->thread, NULL) == 0);
}

static void fill(uint16_t *h, uint64_t total, unsigned v)
{
	for (uint64_t e = 0; e < total / 2; e++)
		h[e] = (uint16_t)(e * 2654435761u ^ v * 40503u);
}

static uint64_t bad_elems(const uint16_t *h, uint64_t total, unsigned v)
{
	uint64_t bad = 0;

	for (uint64_t e = 0; e < total / 2; e++)
		bad += h[e] != (uint16_t)(e * 2654435761u ^ v * 40503u);
	return bad;
}

/* Requests to register a segment this process sent (case 4), and the
 * one before which wexd is stopped (0: none).  libwex sends through
 * sendmsg, which this executable exports (ENABLE_EXPORTS). */
static int seg_requests, stop_at;
static pid_t wexd_pid;
/* Case 5: wexd stopped at each register_segment request (held), and
 * continued SLOW_MS later by slow_run. */
#define SLOW_MS 2000
static atomic_int slow_mode, held;

__attribute__((visibility("default"))) ssize_t sendmsg(int fd, const struct msghdr *msg,
							 int flags)
{
	static ssize_t (*real)(int, const struct msghdr *, int);

	if (!real)
		real = (ssize_t(*)(int, const struct msghdr *, int))(uintptr_t)dlsym(RTLD_NEXT,
										     "sendmsg");
	if (msg->msg_iovlen &&
	    memmem(msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len, "\"register_segment\"", 18) &&
	    (++seg_requests == stop_at || atomic_load(&slow_mode))) {
		kill(wexd_pid, SIGSTOP);
		atomic_store(&held, 1);
	}
	return real(fd, msg, flags);
}

static void *slow_run(void *arg)
{
	(void)arg;
	while (atomic_load(&slow_mode)) {
		if (!atomic_exchange(&held, 0)) {
			usleep(1000);
			continue;
		}
		usleep(SLOW_MS * 1000);
		kill(wexd_pid, SIGCONT);
	}
	return NULL;
}

static void *cancel_run(void *arg)
{
	usleep(KICK_MS * 1000);
	CHECK(wex_cancel(arg) == 1);
	return NULL;
}

/* Registers the 3 allocations at va (3 * gran bytes) through cp while a
 * thread calls wex_cancel KICK_MS in: its result, *dt the seconds it
 * took. */
static int cancelled_register(wex_client_t *cp, CUdeviceptr va, uint64_t gran, uint32_t *id,
			      double *dt)
{
	pthread_t th;
	double t0;
	int ret;

	CHECK(pthread_create(&th, NULL, cancel_run, cp) == 0);
	t0 = now_s();
	ret = wex_segment_register_ptr(cp, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, 3 * gran, id);
	*dt = now_s() - t0;
	CHECK(pthread_join(th, NULL) == 0);
	return ret;
}

static wex_client_t *open_client(int role, const char *model)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_TIMEOUT |
			      WEX_CLIENT_FIELD_FLAGS,
		.role = role, .model = model, .timeout_ms = TIMEOUT_MS, .flags = WEX_CLIENT_EINTR
	};
	wex_client_t *c;
	int ret = wex_client_open(&p, &c);

	if (ret < 0)
		fprintf(stderr, "open: %s\n", wex_last_error(NULL));
	CHECK_OK(ret);
	return c;
}

/* A producer of model with its NT tensors in wex_cuda_alloc'd memory at
 * *dev, registered. */
static wex_client_t *open_producer(const char *model, struct wex_tensor *t, void **dev,
				   uint64_t *total)
{
	wex_client_t *c = open_client(WEX_ROLE_PRODUCER, model);
	uint32_t seg;

	*total = gpu_bf16_tensors(t, NT, ROWS, COLS, 0);
	*dev = wex_cuda_alloc((ssize_t)*total, 0, NULL);
	CHECK(*dev != NULL);
	CHECK_OK(wex_segment_register_ptr(c, WEX_SEG_CUDA_VMM, *dev, *total, &seg));
	CHECK(seg == 0);
	CHECK_OK(wex_register_tensors(c, t, NT));
	return c;
}

static void write_version(wex_client_t *c, void *dev, uint16_t *h, uint64_t total, unsigned v)
{
	CHECK_OK(wex_begin_write(c, v, 5000));
	fill(h, total, v);
	CHECK_OK(xfer(dev, h, total));
}

/* 1. SIGTERM without a handler ends a process waiting in wex_publish for
 * its GPU at once.  Run before this process touches CUDA: the child
 * initialises the driver itself. */
static void default_action(void)
{
	int go[2], st;
	double t0, dt;
	pid_t pid, parent = getpid();
	char ch;

	CHECK(pipe(go) == 0);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct wex_tensor t[NT];
		uint64_t total;
		wex_client_t *c;
		uint16_t *h;
		void *dev;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		close(go[0]);
		c = open_producer("term", t, &dev, &total);
		h = malloc(total);
		write_version(c, dev, h, total, 1);
		start_busy(3 * BUSY_MS);
		CHECK(write(go[1], "r", 1) == 1);
		wex_publish(c, 1);
		_exit(3); /* not reached: SIGTERM came during the GPU wait */
	}
	close(go[1]);
	CHECK(read(go[0], &ch, 1) == 1);
	close(go[0]);
	usleep(KICK_MS * 1000);
	t0 = now_s();
	CHECK(kill(pid, SIGTERM) == 0);
	CHECK(waitpid(pid, &st, 0) == pid);
	dt = now_s() - t0;
	printf("default_action: SIGTERM ended the publishing process %.2f s after it (GPU busy %.1f s more)\n",
	       dt, (3 * BUSY_MS - KICK_MS) / 1000.0);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	CHECK(dt < 1.0);
}

int main(void)
{
	struct sigaction sa = { .sa_handler = on_usr1 }; /* (no SA_RESTART) */
	struct wex_tensor t[NT], ct[NT];
	struct wex_sync_result r;
	wex_client_t *prod, *cons;
	char dir[64], sock[128];
	uint64_t total;
	void *dev, *mine;
	struct kick k;
	pid_t wexd;
	uint16_t *h;
	double t0, dt;
	int ret, st;

	gpu_require();
	main_thread = pthread_self();
	snprintf(dir, sizeof(dir), "/tmp/wex-sig-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/wexd.sock", dir);
	setenv("WEX_SOCKET", sock, 1);
	wexd = gpu_start_wexd();
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);

	default_action();

	prod = open_producer("sig", t, &dev, &total);
	h = malloc(total);
	write_version(prod, dev, h, total, 1);
	CHECK_OK(wex_publish(prod, 1));
	cons = open_client(WEX_ROLE_CONSUMER, "sig");
	mine = wex_cuda_alloc((ssize_t)total, 0, NULL);
	CHECK(mine != NULL);
	memcpy(ct, t, sizeof(ct));
	for (int i = 0; i < NT; i++)
		ct[i].ptr = (char *)mine + ct[i].offset;
	CHECK_OK(wex_attach(cons, ct, NT));
	CHECK_OK(wex_sync(cons, WEX_SYNC_COPY, 1, 5000, &r));
	CHECK(r.version == 1);

	/* 2. publish: wexd stopped, the signal in the GPU wait. */
	write_version(prod, dev, h, total, 2);
	CHECK(kill(wexd, SIGSTOP) == 0);
	usr1_seen = 0;
	start_busy(BUSY_MS);
	kick_start(&k, 1);
	t0 = now_s();
	ret = wex_publish(prod, 2);
	dt = now_s() - t0;
	kick_join(&k);
	end_busy();
	printf("publish: %d after %.2f s (signal to the process at %.1f s, its handler run at %.2f s on %s thread; GPU busy %.1f s): %s\n",
	       ret, dt, KICK_MS / 1000.0, usr1_at - t0, usr1_here ? "the calling" : "another",
	       BUSY_MS / 1000.0, wex_last_error(prod));
	CHECK(ret == -EINTR);
	CHECK(strstr(wex_last_error(prod), "signal") != NULL);
	/* The GPU wait, then the 3 s a hung wexd gets after a signal. */
	CHECK(dt >= (BUSY_MS - 100) / 1000.0 + 3.0 && dt < BUSY_MS / 1000.0 + 5.0);
	/* Once, at once (not when the GPU wait ended), on the calling
	 * thread. */
	CHECK(usr1_seen == 1 && usr1_here && usr1_at - t0 < (KICK_MS + 500) / 1000.0);
	CHECK(kill(wexd, SIGCONT) == 0);
	t0 = now_s();
	ret = wex_publish(prod, 2);
	if (ret < 0)
		fprintf(stderr, "publish again: %s\n", wex_last_error(prod));
	CHECK_OK(ret);
	printf("publish: called again after SIGCONT, succeeded in %.2f s\n", now_s() - t0);
	CHECK_OK(wex_sync(cons, WEX_SYNC_COPY, 2, 5000, &r));
	CHECK(r.version == 2 && r.bytes == total);
	memset(h, 0, total);
	CHECK_OK(xfer(h, mine, total));
	CHECK(bad_elems(h, total, 2) == 0);

	/* 3. sync: waiting for v3, which nobody publishes. */
	usr1_seen = 0;
	start_busy(BUSY_MS);
	kick_start(&k, 0);
	t0 = now_s();
	ret = wex_sync(cons, WEX_SYNC_COPY, 3, TIMEOUT_MS, &r);
	dt = now_s() - t0;
	kick_join(&k);
	end_busy();
	printf("sync: %d after %.2f s (signal at %.1f s, GPU busy %.1f s): %s\n", ret, dt,
	       KICK_MS / 1000.0, BUSY_MS / 1000.0, wex_last_error(cons));
	CHECK(ret == -EINTR);
	CHECK(strstr(wex_last_error(cons), "signal") != NULL);
	CHECK(strstr(wex_last_error(cons), "before it acquired") != NULL);
	CHECK(dt >= (BUSY_MS - 100) / 1000.0 && dt < BUSY_MS / 1000.0 + 2.0);
	CHECK(usr1_seen == 1 && usr1_here && usr1_at - t0 < (KICK_MS + 500) / 1000.0);
	write_version(prod, dev, h, total, 3);
	CHECK_OK(wex_publish(prod, 3));
	CHECK_OK(wex_sync(cons, WEX_SYNC_COPY, 3, 5000, &r));
	CHECK(r.version == 3 && r.bytes == total);
	memset(h, 0, total);
	CHECK_OK(xfer(h, mine, total));
	CHECK(bad_elems(h, total, 3) == 0);

	/* 4. A chained registration given up at its third part. */
	{
		CUmemGenericAllocationHandle ch[3];
		uint64_t gran = gpu_granularity();
		CUdeviceptr va = gpu_expandable(3, gran, ch);
		wex_client_t *cp = open_client(WEX_ROLE_PRODUCER, "chain");
		uint32_t id = 77;

		wexd_pid = wexd;
		seg_requests = 0;
		stop_at = 3;
		ret = cancelled_register(cp, va, gran, &id, &dt);
		printf("chained: %d after %.2f s (wex_cancel at %.1f s, wexd stopped at the third part's request): %s\n",
		       ret, dt, KICK_MS / 1000.0, wex_last_error(cp));
		CHECK(ret == -ECANCELED && id == 77);
		CHECK(dt >= (KICK_MS + 3000 - 100) / 1000.0 && dt < 8.0);
		stop_at = 0;
		CHECK(kill(wexd, SIGCONT) == 0);
		seg_requests = 0;
		ret = wex_segment_register_ptr(cp, WEX_SEG_CUDA_VMM, (void *)(uintptr_t)va, 3 * gran,
					       &id);
		if (ret < 0)
			fprintf(stderr, "chained again: %s\n", wex_last_error(cp));
		printf("chained: called again once wexd went on: %d, id %u, %d requests\n", ret, id,
		       seg_requests);
		CHECK_OK(ret);
		CHECK(id == 3 && seg_requests == 4);
		wex_client_close(cp);
		gpu_expandable_free(va, 3, gran, ch);
	}

	/* 5. The same on a wexd slow to answer each part. */
	{
		CUmemGenericAllocationHandle ch[3];
		uint64_t gran = gpu_granularity();
		CUdeviceptr va = gpu_expandable(3, gran, ch);
		wex_client_t *cp = open_client(WEX_ROLE_PRODUCER, "slow");
		uint32_t id = 77;
		pthread_t sl;

		wexd_pid = wexd;
		seg_requests = 0;
		atomic_store(&held, 0);
		atomic_store(&slow_mode, 1);
		CHECK(pthread_create(&sl, NULL, slow_run, NULL) == 0);
		ret = cancelled_register(cp, va, gran, &id, &dt);
		atomic_store(&slow_mode, 0);
		CHECK(pthread_join(sl, NULL) == 0);
		CHECK(kill(wexd, SIGCONT) == 0);
		printf("chained, slow: %d after %.2f s (wex_cancel at %.1f s, each part answered %.1f s after it was sent, %d requests sent): %s\n",
		       ret, dt, KICK_MS / 1000.0, SLOW_MS / 1000.0, seg_requests,
		       wex_last_error(cp));
		CHECK(ret == -ECANCELED && id == 77);
		/* 3 s after the cancel; the second part's own 3 s would end
		 * at 5 s, and the parts' answers came by 8 s. */
		CHECK(dt >= (KICK_MS + 3000 - 100) / 1000.0 && dt < 4.6);
		wex_client_close(cp);
		gpu_expandable_free(va, 3, gran, ch);
	}

	wex_client_close(cons);
	wex_client_close(prod);
	wex_cuda_free(mine, (ssize_t)total, 0, NULL);
	wex_cuda_free(dev, (ssize_t)total, 0, NULL);
	free(h);
	CHECK(kill(wexd, SIGTERM) == 0);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	{
		char cmd[96];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
		CHECK(system(cmd) == 0);
	}
	printf("PASS\n");
	return T_EXIT_PASS;
}
