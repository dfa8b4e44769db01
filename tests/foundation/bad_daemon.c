/* SPDX-License-Identifier: MIT */
/*
 * bad_daemon - proves that libwex checks what wexd sends before acting on
 * it, against a stand-in for wexd on a thread that answers a consumer's
 * fetch with one mistake at a time:
 *  - a plan or tables fd index out of range (huge, or past the fds of the
 *    message), no plan although a layout is attached, a world of 0 or
 *    2^32-1, a segment of a rank past the world, a tensor lying past the
 *    end of its segment, and plan ops that read past the producer's
 *    segment or write past the attached tensor (an offset of 2^40, one
 *    byte too far, one row too many, a negative stride, a count whose
 *    rows overflow 64 bits), a tensor table out of producer-rank order
 *    (each rank's slice would hold another's tensors), and a page whose
 *    "more" does not name a later page (fetched again and again, each time
 *    importing its segments anew, until the fds ran out): the sync fails
 *    with -EBADMSG, the consumer process lives, its own fds stay open, and
 *    its buffer is untouched;
 *  - the same stand-in answering correctly (with a strided op that ends
 *    exactly at the segment's end) gets a copy of every byte: the checks
 *    refuse only what is wrong;
 *  - a producer whose wexd hangs up while the client re-registers after
 *    a restart (wexd restarted twice in a row) registers each of its
 *    segments exactly once on the daemon it ends up with, and the call
 *    that met the first hang-up succeeds there;
 *  - a client opened against a wexd whose queue of connections is full
 *    (hung) fails with -EAGAIN after its timeout plus the 5 s reply
 *    margin, instead of waiting for room for ever, also while signals
 *    (a SIGCHLD, a profiler's tick: handled, SA_RESTART) keep coming
 *    (the connect failed with -EINTR at the first);
 *  - one opened with WEX_CLIENT_EINTR (the Python module's) against that
 *    full queue ends with -EINTR at a signal its caller handles (Ctrl-C),
 *    not at a SIGCHLD, and not only once the timeout and the margin
 *    passed (Python raised KeyboardInterrupt then).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "helpers.h"
#include "ipc/sock.h"
#include "plan.h"
#include "proto.h"
#include "wex.h"

#define SEG 4096
#define NCASES_FDS 8 /* fds the consumer opens before it syncs */

enum fetch_case {
	F_GOOD,
	F_GOOD_STRIDED,
	F_PFD_HUGE,
	F_PFD_PAST,
	F_TFD_PAST,
	F_NO_PLAN,
	F_WORLD_0,
	F_WORLD_HUGE,
	F_SEG_RANK,
	F_TABLE_PAST,
	F_DST_HUGE,
	F_DST_ONE_PAST,
	F_SRC_ONE_PAST,
	F_ROW_TOO_MANY,
	F_NEG_STRIDE,
	F_ROWS_OVERFLOW,
	F_RANK_ORDER,
	F_MORE_STUCK,
	F_NCASES
};

static const char *const case_name[F_NCASES] = {
	"good",         "good, strided",  "plan_fd 2^40",   "plan_fd past the fds",
	"tables_fd past the fds", "no plan for the layout", "world 0", "world 2^32-1",
	"segment of rank 1 of 1", "tensor past its segment", "dst_off 2^40",
	"dst one byte past",  "src one byte past", "one row too many", "negative stride",
	"rows overflow", "table out of rank order", "more: 0 again",
};

static struct {
	int lfd;
	atomic_int fcase;
	/* producer part */
	atomic_int drop;     /* hang up the current connection now */
	atomic_int conns;    /* connections accepted */
	atomic_int regs[8];  /* register_segment requests per connection */
	atomic_int stop;
	pthread_t th;
} fk;

static int table_fd(uint64_t offset)
{
	struct wex_tensor t;
	uint32_t rank = 0;

	t_u8_tensor(&t, "w", SEG, 0, offset);
	return wex__table_pack(&t, &rank, 1);
}

/* Two valid entries, rank 1's first: rank 0's slice would be rank 1's. */
static int table_fd_unsorted(void)
{
	struct wex_tensor t[2];
	uint32_t rank[2] = { 1, 0 };

	t_u8_tensor(&t[0], "w1", SEG, 0, 0);
	t_u8_tensor(&t[1], "w", SEG, 0, 0);
	return wex__table_pack(t, rank, 2);
}

static int plan_fd(const struct wex_plan_op *op)
{
	struct wex_plan p = { .ops = (struct wex_plan_op *)op, .nops = 1 };

	return wex__plan_pack(&p);
}

static int seg_fd(void)
{
	int fd = memfd_create("bad-daemon-seg", MFD_CLOEXEC);
	unsigned char buf[SEG];

	T_ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
	for (int i = 0; i < SEG; i++)
		buf[i] = (unsigned char)(i * 7 + 1);
	T_ASSERT(write(fd, buf, SEG) == SEG, "filling the segment");
	return fd;
}

/* count rows of SEG/2 bytes, read src_stride apart, written SEG/2 apart. */
static void half_rows(struct wex_plan_op *op, uint64_t count, int64_t src_stride)
{
	op->len = SEG / 2;
	op->nouter = 1;
	op->count[0] = count;
	op->src_stride[0] = src_stride;
	op->dst_stride[0] = SEG / 2;
}

/* The fetch reply of case fc: fds in fds[], their count returned. */
static json_t *fetch_reply(int fc, int *fds, int *nfds)
{
	struct wex_plan_op op = { .len = SEG };
	json_int_t world = 1, pfd = 1, tfd = 0, srank = 0;
	json_t *seg, *r;

	switch (fc) {
	case F_GOOD_STRIDED: /* two rows of 2048 bytes, the last ending at SEG */
		half_rows(&op, 2, SEG / 2);
		break;
	case F_DST_HUGE:
		op.dst_off = 1ull << 40;
		break;
	case F_DST_ONE_PAST:
		op.dst_off = 1;
		break;
	case F_SRC_ONE_PAST:
		op.src_off = 1;
		break;
	case F_ROW_TOO_MANY:
		half_rows(&op, 3, SEG / 2);
		break;
	case F_NEG_STRIDE:
		half_rows(&op, 2, -(int64_t)(SEG / 2));
		break;
	case F_ROWS_OVERFLOW:
		op.len = 1;
		op.nouter = 2;
		op.count[0] = op.count[1] = 1ull << 33;
		op.src_stride[0] = op.src_stride[1] = op.dst_stride[0] = op.dst_stride[1] = 1ll << 31;
		break;
	}
	*nfds = 0;
	fds[(*nfds)++] = fc == F_RANK_ORDER ? table_fd_unsorted() : table_fd(fc == F_TABLE_PAST ? 8 : 0);
	if (fc != F_NO_PLAN)
		fds[(*nfds)++] = plan_fd(&op);
	fds[*nfds] = seg_fd();
	if (fc == F_PFD_HUGE)
		pfd = 1ll << 40;
	else if (fc == F_PFD_PAST)
		pfd = 5;
	else if (fc == F_TFD_PAST)
		tfd = 6;
	else if (fc == F_NO_PLAN)
		pfd = -1;
	else if (fc == F_WORLD_0)
		world = 0;
	else if (fc == F_WORLD_HUGE)
		world = 4294967295ll;
	else if (fc == F_RANK_ORDER)
		world = 2;
	else if (fc == F_SEG_RANK)
		srank = 1;
	seg = json_pack("{s:I, s:i, s:s, s:i, s:s, s:s, s:i, s:i, s:i}", "rank", srank, "id", 0,
			"kind", "host", "size", SEG, "device", "", "handle", "", "handle_offset", 0,
			"alloc_size", SEG, "fd", *nfds);
	(*nfds)++;
	r = json_pack("{s:b, s:I, s:I, s:I, s:i, s:[o]}", "ok", 1, "tables_fd", tfd, "plan_fd",
		      pfd, "world", world, "layout_gen", 1, "segments", seg);
	/* The page asked for (start 0) again, as the next. */
	if (fc == F_MORE_STUCK)
		json_object_set_new(r, "more", json_integer(0));
	return r;
}

static void answer(int fd, json_t *r, const int *fds, int nfds)
{
	size_t len;
	char *s = json_dumps(r, JSON_COMPACT);

	len = strlen(s);
	wex_sock_send(fd, s, len, fds, nfds, 0);
	free(s);
	json_decref(r);
}

/* The stand-in: one connection at a time.  Connection k (from 1) of a
 * producer hangs up at its second register_segment when k == 2. */
static void *fake_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&fk.stop)) {
		struct pollfd pl = { .fd = fk.lfd, .events = POLLIN };
		int fd, k, nreg = 0;

		if (poll(&pl, 1, 50) <= 0)
			continue;
		fd = accept4(fk.lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		k = atomic_fetch_add(&fk.conns, 1) + 1;
		for (;;) {
			char op[64];

			if (t_stand_in_request(fd, &fk.stop, &fk.drop, op, sizeof(op)) < 0)
				break;
			if (!strcmp(op, "register_segment")) {
				if (k == 2 && nreg == 1)
					break; /* a second restart, mid re-registration */
				if (k < 8)
					atomic_fetch_add(&fk.regs[k], 1);
				answer(fd, json_pack("{s:b, s:i}", "ok", 1, "segment", nreg++), NULL, 0);
			} else if (!strcmp(op, "acquire")) {
				answer(fd, json_pack("{s:b, s:i, s:i, s:f}", "ok", 1, "version", 1,
						     "layout_gen", 1, "waited_ms", 0.0),
				       NULL, 0);
			} else if (!strcmp(op, "fetch")) {
				int rfds[4], nr;
				json_t *r = fetch_reply(atomic_load(&fk.fcase), rfds, &nr);

				answer(fd, r, rfds, nr);
				wex_sock_close_fds(rfds, nr);
			} else {
				answer(fd, json_pack("{s:b}", "ok", 1), NULL, 0);
			}
		}
		close(fd);
	}
	return NULL;
}

static char sock[300];

/* In a child: a consumer attaches a 4096-byte tensor and syncs in `mode`;
 * exits 0 when the outcome is what case fc calls for, else says why. */
static void consumer_case(int fc, int mode)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_SOCKET | WEX_CLIENT_FIELD_ROLE |
			      WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_TIMEOUT,
		.socket = sock,
		.role = WEX_ROLE_CONSUMER,
		.model = "bad",
		.timeout_ms = 2000,
	};
	static unsigned char buf[SEG];
	struct wex_sync_result res;
	struct wex_tensor t;
	wex_client_t *c;
	int own[NCASES_FDS], good = fc == F_GOOD || fc == F_GOOD_STRIDED, ret;

	/* A client that fetches one page for ever runs out of fds soon,
	 * and fails some other way, instead of filling the machine's. */
	if (fc == F_MORE_STUCK) {
		struct rlimit rl = { 256, 256 };

		T_ASSERT(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit: %s", strerror(errno));
		alarm(20);
	}
	for (int i = 0; i < NCASES_FDS; i++) {
		own[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		T_ASSERT(own[i] >= 0, "open /dev/null");
	}
	memset(buf, 0xee, sizeof(buf));
	T_WEX(NULL, wex_client_open(&p, &c));
	t_u8_tensor(&t, "w", SEG, 0, 0);
	t.ptr = buf;
	T_WEX(c, wex_attach(c, &t, 1));
	ret = wex_sync(c, mode, 0, 2000, &res);
	if (good) {
		T_ASSERT(ret == 0, "%s: sync: %s (%s)", case_name[fc], wex_strerror(ret),
			 wex_last_error(c));
		T_ASSERT(res.bytes == SEG, "%s: %llu bytes copied, not %d", case_name[fc],
			 (unsigned long long)res.bytes, SEG);
		for (int i = 0; i < SEG; i++)
			T_ASSERT(buf[i] == (unsigned char)(i * 7 + 1), "%s: byte %d not copied",
				 case_name[fc], i);
	} else {
		T_ASSERT(ret == -EBADMSG, "%s: sync returned %s (%s), not EBADMSG", case_name[fc],
			 wex_strerror(ret), wex_last_error(c));
		for (int i = 0; i < SEG; i++)
			T_ASSERT(buf[i] == 0xee, "%s: byte %d of the engine's buffer changed",
				 case_name[fc], i);
	}
	for (int i = 0; i < NCASES_FDS; i++)
		T_ASSERT(fcntl(own[i], F_GETFD) >= 0, "%s: the consumer's fd %d was closed",
			 case_name[fc], own[i]);
	printf("%-24s %s: %s\n", case_name[fc], mode == WEX_SYNC_COPY ? "copy" : "view",
	       good ? "copied, every byte checked" : wex_last_error(c));
	wex_client_close(c);
	t_exit(T_EXIT_PASS);
}

static void consumer_cases(void)
{
	for (int fc = 0; fc < F_NCASES; fc++) {
		/* A tensor past its segment is what a view would hand out. */
		int mode = fc == F_TABLE_PAST ? WEX_SYNC_REMAP_VIEW : WEX_SYNC_COPY;
		pid_t pid;
		int st;

		atomic_store(&fk.fcase, fc);
		fflush(stdout);
		pid = t_fork();
		if (pid == 0)
			consumer_case(fc, mode);
		st = t_wait(pid);
		T_ASSERT(st == 0, "case '%s': the consumer %s %d", case_name[fc],
			 st > 128 ? "died of signal" : "exited", st > 128 ? st - 128 : st);
	}
}

/* A producer with two segments; wexd restarts (hang-up), and hangs up
 * again at the second segment's re-registration. */
static void double_restart(void)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_SOCKET | WEX_CLIENT_FIELD_ROLE |
			      WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_TIMEOUT |
			      WEX_CLIENT_FIELD_FLAGS,
		.socket = sock,
		.role = WEX_ROLE_PRODUCER,
		.model = "bad",
		.timeout_ms = 2000,
		.flags = WEX_CLIENT_NO_WATCH,
	};
	wex_client_t *c;
	uint32_t id[3];
	void *ptr;
	int n;

	atomic_store(&fk.conns, 0);
	T_WEX(NULL, wex_client_open(&p, &c));
	T_WEX(c, wex_segment_alloc(c, WEX_SEG_HOST, 0, SEG, &id[0], &ptr));
	T_WEX(c, wex_segment_alloc(c, WEX_SEG_HOST, 0, SEG, &id[1], &ptr));
	atomic_store(&fk.drop, 1);
	while (atomic_load(&fk.drop))
		usleep(5000);
	/* Meets the hang-up, reconnects, meets the second one, and starts
	 * over on the third connection. */
	T_WEX(c, wex_segment_alloc(c, WEX_SEG_HOST, 0, SEG, &id[2], &ptr));
	n = atomic_load(&fk.conns);
	T_ASSERT(n == 3, "%d connections, not 3", n);
	T_ASSERT(atomic_load(&fk.regs[1]) == 2 && atomic_load(&fk.regs[2]) == 1,
		 "registrations on the first two connections: %d and %d, not 2 and 1",
		 atomic_load(&fk.regs[1]), atomic_load(&fk.regs[2]));
	T_ASSERT(atomic_load(&fk.regs[3]) == 3,
		 "the third connection got %d segment registrations, not 3 (each segment once)",
		 atomic_load(&fk.regs[3]));
	T_ASSERT(id[2] == 2, "the new segment got id %u on the third connection, not 2", id[2]);
	printf("double restart: each of 3 segments registered once on the third wexd\n");
	wex_client_close(c);
}

static void on_tick(int sig)
{
	(void)sig;
}

/* Signals the thread that opens the client every 100 ms. */
static void *ticker(void *arg)
{
	pthread_t main_th = *(pthread_t *)arg;

	for (;;) {
		usleep(100000);
		pthread_kill(main_th, SIGUSR1);
	}
	return NULL;
}

/* A listener at dir/name whose queue of connections is full (backlog 0,
 * one connection waiting in it): a hung wexd, which accepts nothing. */
struct full_queue {
	struct sockaddr_un sa;
	int lfd, filler;
};

static void full_queue_open(struct full_queue *q, const char *dir, const char *name)
{
	q->sa = (struct sockaddr_un){ .sun_family = AF_UNIX };
	snprintf(q->sa.sun_path, sizeof(q->sa.sun_path), "%s/%s", dir, name);
	q->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	T_ASSERT(q->lfd >= 0 && bind(q->lfd, (struct sockaddr *)&q->sa, sizeof(q->sa)) == 0 &&
			 listen(q->lfd, 0) == 0,
		 "a listener with no room: %s", strerror(errno));
	q->filler = wex_sock_connect(q->sa.sun_path);
	T_ASSERT(q->filler >= 0, "filling the queue: %s", strerror(-q->filler));
}

static void full_queue_close(struct full_queue *q)
{
	close(q->filler);
	close(q->lfd);
	unlink(q->sa.sun_path);
}

/* A wexd that accepts nothing, its queue full: opening a client fails
 * with -EAGAIN once the timeout and the reply margin (5 s) passed,
 * instead of waiting for room for ever, signals handled meanwhile or not. */
static void hung_queue(const char *dir, int ticks)
{
	struct full_queue q;
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_SOCKET | WEX_CLIENT_FIELD_ROLE |
			      WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_TIMEOUT,
		.socket = q.sa.sun_path,
		.role = WEX_ROLE_CONSUMER,
		.model = "bad",
		.timeout_ms = 200,
	};
	wex_client_t *c = NULL;
	double t0;
	int ret, st;
	pid_t pid;

	full_queue_open(&q, dir, "hung.sock");
	fflush(stdout);
	pid = t_fork();
	if (pid == 0) {
		pthread_t self = pthread_self(), th;

		alarm(30); /* the old behaviour: waits for ever */
		if (ticks) {
			struct sigaction sa_tick = { .sa_handler = on_tick, .sa_flags = SA_RESTART };

			sigaction(SIGUSR1, &sa_tick, NULL);
			T_ASSERT(pthread_create(&th, NULL, ticker, &self) == 0, "pthread_create");
		}
		t0 = t_now();
		ret = wex_client_open(&p, &c);
		T_ASSERT(ret == -EAGAIN, "open against a full queue%s: %s, not EAGAIN (%s)",
			 ticks ? " with a signal every 100 ms" : "", wex_strerror(ret),
			 wex_last_error(NULL));
		T_ASSERT(t_now() - t0 < 15, "open took %.1f s", t_now() - t0);
		T_ASSERT(t_now() - t0 > 5, "open gave up after %.1f s", t_now() - t0);
		printf("hung queue%s: open failed with EAGAIN after %.1f s (timeout 0.2 s + 5 s)\n",
		       ticks ? " (a signal every 100 ms)" : "", t_now() - t0);
		t_exit(T_EXIT_PASS);
	}
	st = t_wait(pid);
	T_ASSERT(st == 0, "the client against a full queue %s %d", st > 128 ? "died of signal" : "exited",
		 st > 128 ? st - 128 : st);
	full_queue_close(&q);
}

/* SIGCHLD every 100 ms for a second (a signal that ends no wait), then
 * SIGUSR2 (the caller's Ctrl-C), to the thread that opens the client. */
static void *chld_then_usr2(void *arg)
{
	pthread_t main_th = *(pthread_t *)arg;

	for (int i = 0; i < 10; i++) {
		usleep(100000);
		pthread_kill(main_th, SIGCHLD);
	}
	pthread_kill(main_th, SIGUSR2);
	return NULL;
}

/* WEX_CLIENT_EINTR against a full queue: a signal the caller handles ends
 * the open with -EINTR (a runtime that handles signals only once the call
 * returns, Python's Ctrl-C, waited out the timeout plus 5 s); SIGCHLD,
 * which ends no wait, does not. */
static void hung_queue_eintr(const char *dir)
{
	struct full_queue q;
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_SOCKET | WEX_CLIENT_FIELD_ROLE |
			      WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_TIMEOUT |
			      WEX_CLIENT_FIELD_FLAGS,
		.socket = q.sa.sun_path,
		.role = WEX_ROLE_CONSUMER,
		.model = "bad",
		.timeout_ms = 10000,
		.flags = WEX_CLIENT_EINTR,
	};
	wex_client_t *c = NULL;
	double t0, t;
	int ret, st;
	pid_t pid;

	full_queue_open(&q, dir, "hung-eintr.sock");
	fflush(stdout);
	pid = t_fork();
	if (pid == 0) {
		struct sigaction sa_sig = { .sa_handler = on_tick }; /* (no SA_RESTART: Python's) */
		pthread_t self = pthread_self(), th;

		alarm(30);
		sigaction(SIGCHLD, &sa_sig, NULL);
		sigaction(SIGUSR2, &sa_sig, NULL);
		T_ASSERT(pthread_create(&th, NULL, chld_then_usr2, &self) == 0, "pthread_create");
		t0 = t_now();
		ret = wex_client_open(&p, &c);
		t = t_now() - t0;
		T_ASSERT(ret == -EINTR && t > 0.9 && t < 4,
			 "WEX_CLIENT_EINTR open against a full queue, SIGCHLD ticks then SIGUSR2 at 1 s: %s after %.1f s, not EINTR after the SIGUSR2 (%s)",
			 wex_strerror(ret), t, wex_last_error(NULL));
		printf("hung queue, WEX_CLIENT_EINTR: open ended with EINTR at the caller's signal after %.1f s (%s)\n",
		       t, wex_last_error(NULL));
		t_exit(T_EXIT_PASS);
	}
	st = t_wait(pid);
	T_ASSERT(st == 0, "the WEX_CLIENT_EINTR client against a full queue %s %d",
		 st > 128 ? "died of signal" : "exited", st > 128 ? st - 128 : st);
	full_queue_close(&q);
}

int main(void)
{
	char dir[] = "/tmp/wex-bad-daemon-XXXXXX";

	T_ASSERT(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(sock, sizeof(sock), "%s/wexd.sock", dir);
	fk.lfd = wex_sock_listen(sock, 0600, (gid_t)-1, NULL);
	T_ASSERT(fk.lfd >= 0, "listen on %s: %s", sock, strerror(-fk.lfd));
	T_ASSERT(pthread_create(&fk.th, NULL, fake_main, NULL) == 0, "pthread_create");
	consumer_cases();
	double_restart();
	hung_queue(dir, 0);
	hung_queue(dir, 1);
	hung_queue_eintr(dir);
	atomic_store(&fk.stop, 1);
	pthread_join(fk.th, NULL);
	close(fk.lfd);
	unlink(sock);
	rmdir(dir);
	printf("bad_daemon: PASS\n");
	return 0;
}
