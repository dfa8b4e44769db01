/* SPDX-License-Identifier: MIT */
/*
 * client.c - libwex, the client library for producers and consumers.
 *
 * Each client owns one connection to wexd and speaks one request at a time.
 * The daemon holds metadata only: weight bytes stay in the producer's
 * memory, which the consumer maps (remap) or copies from (copy).  When wexd
 * restarts, a client reconnects and re-registers by itself on its next
 * call; a consumer keeps its mappings and buffers meanwhile.  A producer
 * does not wait for its next call: its watch (a thread) reconnects as soon
 * as wexd is back, and tells it the version its memory still holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "log.h"
#include "plan.h"
#include "proto.h"
#include "verify.h"
#include "vmm/backend.h"
#include "wex.h"

struct own_seg {
	struct wex_mem_seg seg;
	uint32_t id;
	int part;      /* one allocation of a chained segment below */
	size_t *parts; /* chained: indices of its parts in osegs */
	size_t nparts;
	/* Its fd was closed once wexd held one (seg.ops->export_fd makes
	 * another for the next wexd). */
	int reexport;
};

/* The parts of chained segments one fetch received, kept until the
 * segment that chains them arrives (possibly in a later message). */
struct stash {
	struct stashed {
		uint32_t rank, id;
		struct wex_mem_desc desc;
		int fd;
	} *v;
	size_t n;
};

struct pseg {
	uint32_t rank, id;
	struct wex_mem_seg seg;
	int pin_tried; /* host staging: pinning this import was attempted */
};

struct region {
	uint32_t prank, segid;
	struct wex_mem_region r;
	const struct wex_mem_seg *mapped; /* the producer segment shown, or NULL */
};

struct wex_client {
	int fd;
	char sock[256];
	char model[WEX_NAME_MAX];
	char group[WEX_NAME_MAX];
	int role;
	uint32_t rank, world, timeout_ms;
	int timeout_set; /* timeout_ms came from the caller (else wexd's defaults for waits) */
	int threads;
	char err[512];
	/* producer */
	struct own_seg *osegs;
	size_t nosegs;
	struct wex_tensor *ptensors;
	size_t nptensors;
	uint64_t writing;
	/* The version this producer last published, with no write begun
	 * since (0: none): its memory still holds it, and a reconnect tells
	 * a new wexd so (publish "restored"). */
	uint64_t published;
	/* A write a reconnect could not go on with (wexd refused to begin it
	 * again): its version, and what the publish of it says. */
	uint64_t write_lost_v;
	char write_lost[400];
	struct watch *watch; /* NULL: none (not a producer, or WEX_CLIENT_NO_WATCH) */
	/* Held only while an fd of the client's is made or closed and stored
	 * (never across I/O), and by fork(): a child knows every fd it
	 * copied (fork_child closes them), and a fork never waits for wexd. */
	pthread_mutex_t state;
	/* consumer */
	struct wex_tensor *layout;
	size_t nlayout;
	uint8_t *layout_host; /* per tensor: memory the CUDA driver did not know at attach */
	size_t *layout_order; /* the layout's indexes in address order (check_mapped) */
	uint64_t layout_gen;
	int fetched;
	uint32_t nprod;
	struct pseg *psegs;
	size_t npsegs;
	struct wex_tensor *tables;
	uint32_t *table_ranks;
	size_t ntables;
	size_t *rank_first; /* nprod+1 prefix offsets into tables */
	struct wex_plan_op *plan;
	size_t nplan;
	struct region *regions;
	size_t nregions;
	int device;         /* CUDA ordinal for reserved regions (-1: the segment's) */
	uint64_t version;
	/* The version the consumer's own buffers hold (0: none).  Not
	 * `version`: a REMAP_VIEW sync serves a version without writing the
	 * buffers, and a COPY sync of that same version must still copy. */
	uint64_t copied;
	uint64_t lease_version; /* the version the held lease is on */
	/* The version the last successful sync got, kept across reconnects:
	 * a new wexd's group round on it is passed, not waited for, by an
	 * acquire of a newer one (acquire "held"). */
	uint64_t took;
	uint64_t conn_gen;      /* connections made after the first (reconnects) */
	/* Inside reconnect: its requests neither reconnect nor retry (a
	 * second reconnect nested in the first would register everything on
	 * the newest wexd, and the first then register the rest again). */
	int reconnecting;
	int has_lease;
	int lease_lost; /* a reconnect took the held lease with the old wexd */
	/* A lease reported lost with no wexd to give it back to (lease_lost_err):
	 * a wexd started later may hold it (read from its lease journal) until
	 * a hello from this client names none; cleared by such a hello. */
	int lease_owed;
	int dirty;
	/* Same-address regions got private memory back holding what they
	 * showed while a lease was held, and wexd has not answered on that
	 * lease's connection since: until it does, it may have died (the
	 * lease with it) before the copy, and the producer have written. */
	int restore_unconfirmed;
	json_t *report; /* the last finished sync, sent with the next request */
	unsigned sync_fb; /* WEX_FB_* the sync running now took */
	uint64_t verify_ask; /* the last acquire's ask to verify (wexctl verify's ticket), or 0 */
	int lease_kept; /* the last error reply said a held lease stands */
	/* Where the attached layout lives: -2 not looked at yet, -1 host
	 * memory, else the CUDA ordinal of its first GPU-resident piece. */
	int layout_dev;
	/* This is a forked child's copy of a client its parent opened
	 * (pid: the opener): it holds no connection, and calls refuse. */
	int forked;
	pid_t pid;
	struct wex_client *next_open; /* this process's open clients */
	/* wex_cancel, from any thread: call_seq is odd while a call it may
	 * cancel runs (wex_sync, wex_begin_write; changed only by the
	 * thread that runs it), cancel_seq the call it cancelled, and
	 * cancel_efd wakes that call's wait for wexd's answer
	 * (cancel_wait: only then, on the calling thread).  wexd_cancels:
	 * the wexd said hello with "cancel" (ends a wait at a "cancel"). */
	_Atomic uint64_t call_seq, cancel_seq;
	_Atomic uint64_t asked_seq; /* cancel_seq's by wex_cancel only (not signals) */
	_Atomic int wexd_cancels;
	_Atomic int cancel_local; /* the call running is a publish or a
				   * registration: cancelled here */
	int reg_call; /* the call running is a registration (REGISTERING) */
	/* The end of the grace a cancel gives wexd (call_grace), for the
	 * call call_seq was grace_seq in. */
	uint64_t grace_end, grace_seq;
	int cancel_efd;
	int cancel_wait;
	int eintr;     /* WEX_CLIENT_EINTR: a signal ends a wait */
	int signalled; /* a signal ended the wait of the call running now */
	/* While a call wex_cancel and signals end (begin_write, publish,
	 * sync) sends the request it waits on (begin_write, publish, its
	 * first acquire), on its own thread: the call's end (0: none).  A
	 * reconnect inside it connects and waits for hello's answer no
	 * longer, and ends there on wex_cancel and signals (the attempt is
	 * given up); att_held: the attempt holds the signals
	 * (WEX_CLIENT_EINTR; att_mask: the mask before) and takes them only
	 * where it waits (att_wait; att_hold). */
	uint64_t call_end;
	int att_held;
	sigset_t att_mask, att_wait;
	/* A publish of pub_v that a signal ended (-EINTR) tries again, when
	 * called again for it next, only until pub_end; pub_end_now is the
	 * running publish's. */
	uint64_t pub_v, pub_end, pub_end_now;
	/* A reconnect found the version being written published: wexd
	 * carried out its publish, whose answer the client never had (it
	 * gave the publish up after a signal, wex_cancel or its timeout).
	 * The next publish of it succeeds without asking again. */
	uint64_t pub_found;
};

/* Runs `call` (an int expression) and gives the calling thread its device
 * binding back afterwards: every public call that may reach a GPU backend
 * goes through this (see wex_mem_thread_save). */
#define KEEP_THREAD_DEVICE(ret, call)                                          \
	do {                                                                   \
		struct wex_mem_thread_state ts_;                               \
									       \
		wex_mem_thread_save(&ts_);                                     \
		(ret) = (call);                                                \
		wex_mem_thread_restore(&ts_);                                  \
	} while (0)

static int set_err(struct wex_client *c, int ret, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Where the calling thread's errors go: the client's last error, except
 * on a producer's watch thread, whose reconnects must not overwrite what
 * the caller's last call said. */
static __thread char *err_to;

static char *err_buf(struct wex_client *c)
{
	return err_to ? err_to : c->err;
}

static int set_err(struct wex_client *c, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err_buf(c), sizeof(c->err), fmt, ap);
	va_end(ap);
	/* UTF-8 even when cut inside a sequence: it goes to wexd as JSON
	 * (a verification's why) and to Python as str. */
	wex__utf8_scrub(err_buf(c));
	return ret;
}

/* Public entry points: no client, or a NULL the call needs, is -EINVAL
 * (with the reason when there is a client to hold it), never a fault. */
#define ARGS_OK(c, cond)                                                              \
	do {                                                                          \
		if (!(c))                                                             \
			return -EINVAL;                                               \
		if ((c)->forked)                                                      \
			return set_err((c), -ECHILD,                                  \
				       "%s: this client was opened by process %d before a " \
				       "fork; a child process opens its own",         \
				       __func__, (int)(c)->pid);                      \
		if (!(cond))                                                          \
			return set_err((c), -EINVAL, "%s: a required pointer is NULL", \
				       __func__);                                     \
	} while (0)

/* ARGS_OK for a call that acts (not a query): its wex_last_error is its
 * own from then on, never an earlier call's where it fails without one. */
#define CALL_OK(c, cond)                                                              \
	do {                                                                          \
		ARGS_OK(c, cond);                                                     \
		(c)->err[0] = '\0';                                                   \
	} while (0)

/*
 * A fork copies the open clients into the child, their connection to wexd
 * included.  A child that kept it (a data-loader worker, say) would keep
 * the parent's leases and ranks alive after the parent died, and one that
 * used it would interleave its requests with the parent's.  So the child
 * closes every inherited connection and segment fd at once, and its copies
 * only refuse (-ECHILD) and free (wex_client_close).
 */
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static struct wex_client *open_clients;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

/*
 * A producer's watch.  Between its calls (the whole rollout, from a
 * publish to the next step's begin_write) a trainer makes none, so a wexd
 * that restarted meanwhile would not learn of its memory, nor of the
 * version that memory holds, until then, and engines waiting for that
 * version would wait in vain.  The watch is a thread that polls a dup of
 * the connection for a hang-up only (replies are the calling thread's)
 * and reconnects at once, retrying until wexd is back; the reconnect
 * re-registers everything and restores the published version.  Each call
 * of the client holds `call`, so the watch acts only between calls (a
 * call that meets a dead wexd reconnects by itself, as without a watch).
 * The client's `state` covers the watch's fds too.  wex_client_close stops the
 * watch through stopfd, which also ends any request the watch is waiting
 * on (a hung wexd).
 */
struct watch {
	pthread_t thread;
	pthread_mutex_t call;  /* held by every call, and by the watch while it acts */
	int efd;               /* eventfd: a new connection to watch */
	int stopfd;            /* eventfd: stop (written once) */
	int wantfd;            /* eventfd: a call waits for `call` (want > 0) */
	atomic_int want;
	int dupfd;             /* the connection watched (-1: none) */
	uint64_t gen;          /* the conn_gen of dupfd */
	uint64_t up_ns;        /* when the watch last connected */
	atomic_int stop;
	int warned;            /* this outage's first failure was logged */
	int yielded;           /* its reconnect gave way to a call (want) */
	unsigned backoff_ms;   /* wait before the next try (0: at once) */
	char err[512];         /* the watch's own errors (not the caller's) */
};

static void fork_prepare(void)
{
	pthread_mutex_lock(&open_lock);
	for (struct wex_client *c = open_clients; c; c = c->next_open)
		if (!c->forked)
			pthread_mutex_lock(&c->state);
}

static void fork_parent(void)
{
	for (struct wex_client *c = open_clients; c; c = c->next_open)
		if (!c->forked)
			pthread_mutex_unlock(&c->state);
	pthread_mutex_unlock(&open_lock);
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* The child has no watch thread: its copy's locks are never taken again
 * (every call refuses, and closing only frees). */
static void fork_child(void)
{
	for (struct wex_client *c = open_clients; c; c = c->next_open) {
		if (c->forked)
			continue;
		c->forked = 1;
		close_fd(&c->fd);
		close_fd(&c->cancel_efd);
		if (c->watch) {
			close_fd(&c->watch->dupfd);
			close_fd(&c->watch->efd);
			close_fd(&c->watch->stopfd);
			close_fd(&c->watch->wantfd);
		}
		pthread_mutex_unlock(&c->state);
		for (size_t i = 0; i < c->nosegs; i++)
			close_fd(&c->osegs[i].seg.fd);
		for (size_t i = 0; i < c->npsegs; i++)
			close_fd(&c->psegs[i].seg.fd);
	}
	pthread_mutex_unlock(&open_lock);
}

static void fork_init(void)
{
	pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void open_add(struct wex_client *c)
{
	pthread_once(&fork_once, fork_init);
	pthread_mutex_lock(&open_lock);
	c->next_open = open_clients;
	open_clients = c;
	pthread_mutex_unlock(&open_lock);
}

static void open_remove(struct wex_client *c)
{
	pthread_mutex_lock(&open_lock);
	for (struct wex_client **p = &open_clients; *p; p = &(*p)->next_open)
		if (*p == c) {
			*p = c->next_open;
			break;
		}
	pthread_mutex_unlock(&open_lock);
}

static void watch_enter(struct watch *w);

/* Every call of a client with a watch holds its `call` lock. */
#define LOCKED(c, ret, expr)                                                   \
	do {                                                                   \
		if ((c)->watch)                                                \
			watch_enter((c)->watch);                               \
		(ret) = (expr);                                                \
		if ((c)->watch)                                                \
			pthread_mutex_unlock(&(c)->watch->call);               \
	} while (0)

static void state_lock(struct wex_client *c)
{
	pthread_mutex_lock(&c->state);
}

static void state_unlock(struct wex_client *c)
{
	pthread_mutex_unlock(&c->state);
}

/* Ends the connection to wexd.  Shut down first: wexd must see it go
 * even while the watch still holds a dup of it (which wakes it). */
static void conn_drop(struct wex_client *c)
{
	state_lock(c);
	if (c->fd >= 0) {
		shutdown(c->fd, SHUT_RDWR);
		close(c->fd);
	}
	c->fd = -1;
	state_unlock(c);
}

/* On a producer's watch thread: its stopfd, which ends a request it waits
 * on (-1 elsewhere). */
static __thread int cancel_fd = -1;

/* The client's own allocations, once its memory and fds are dealt with
 * (or, in a forked child's copy, left to the child's exit: its fds went
 * at the fork, and unmapping GPU memory is no call a forked child may
 * make). */
static void client_free(struct wex_client *c)
{
	json_decref(c->report);
	for (size_t i = 0; i < c->nosegs; i++)
		free(c->osegs[i].parts);
	free(c->osegs);
	free(c->psegs);
	free(c->regions);
	free(c->ptensors);
	free(c->layout);
	free(c->layout_host);
	free(c->layout_order);
	free(c->tables);
	free(c->table_ranks);
	free(c->rank_first);
	free(c->plan);
	free(c->watch);
	close_fd(&c->cancel_efd);
	pthread_mutex_destroy(&c->state);
	free(c);
}

/* Waits for this process's queued GPU work (the engine's kernels too) on
 * the devices wex uses: before a lease whose memory those kernels may read
 * ends (guarantee 1: the producer may write once it has), and before a
 * copy overwrites weights they may read.  0 at once without CUDA. */
static int settle(struct wex_client *c, const char *what)
{
	int ret = wex_mem_settle();

	if (ret < 0)
		return set_err(c, ret, "%s: waiting for this process's GPU work to complete: %s",
			       what, wex_strerror(ret));
	return 0;
}

/* The CUDA ordinal of the attached layout's first GPU-resident piece, or
 * -1 when it is all host memory (asked once per attach). */
static int layout_device(struct wex_client *c)
{
	if (c->layout_dev != -2)
		return c->layout_dev;
	c->layout_dev = -1;
	for (size_t i = 0; i < c->nlayout; i++) {
		int d = wex_mem_ptr_on_gpu((uint64_t)(uintptr_t)c->layout[i].ptr);

		if (d >= 0) {
			c->layout_dev = d;
			break;
		}
	}
	return c->layout_dev;
}

/* The device that must reach imported producer memory besides its owner:
 * the client's device when set, else the device the attached layout lives
 * on (copies run there), else none. */
static int access_device(struct wex_client *c)
{
	return c->device >= 0 ? c->device : layout_device(c);
}

/* Why the calling thread's last wex_client_open failed: there is no
 * client to hold it (wex_last_error(NULL) returns it). */
static __thread char open_err[512];

static int open_fail(int ret, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int open_fail(int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(open_err, sizeof(open_err), fmt, ap);
	va_end(ap);
	return ret;
}

WEX_API const char *wex_last_error(wex_client_t *c)
{
	return c ? c->err : open_err;
}

/* ---------------------------------------------------------------------- */
/* Transport.                                                              */

/* The connection is gone (or dropped) with no reply since regions were
 * restored under its lease (restore_unconfirmed): the copy may hold a mix
 * of what the producer wrote after the lease went, so the weights are
 * dirty. */
static void restore_doubted(struct wex_client *c)
{
	if (!c->restore_unconfirmed)
		return;
	c->restore_unconfirmed = 0;
	c->dirty = 1;
	c->copied = 0;
}

/* How long a reply to a request that lets wexd wait wait_ms is waited
 * for: wexd answers every wait by its own deadline; the margin only
 * guards against a daemon that stopped answering. */
static uint64_t reply_limit_ms(uint32_t wait_ms)
{
	return (uint64_t)wait_ms + 5000; /* (ppoll's timespec holds it) */
}

/* wex_cancel asked to cancel the call this thread runs now. */
static int cancel_asked(struct wex_client *c)
{
	uint64_t s = atomic_load(&c->call_seq);

	return (s & 1) && atomic_load(&c->cancel_seq) == s;
}

/* wex_cancel may be called from a signal handler. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
	       "wex_cancel needs lock-free 64-bit atomics");

/* WEX_CLIENT_EINTR: holds (blocks) every signal on the calling thread
 * but those a fault raises (they cannot wait), puts its mask as it was in
 * *mask and the one to wait under in *wait: *mask plus the signals that
 * end no wait (held through it: children, terminal size, profilers'
 * timers, sockets, real-time signals). */
static const int fault_sigs[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT };
static const int quiet_sigs[] = { SIGCHLD, SIGWINCH, SIGURG, SIGPROF, SIGVTALRM, SIGPIPE, SIGIO };

static void signals_held(sigset_t *mask, sigset_t *wait)
{
	sigset_t held;

	sigfillset(&held);
	for (size_t i = 0; i < WEX_ARRAY_SIZE(fault_sigs); i++)
		sigdelset(&held, fault_sigs[i]);
	pthread_sigmask(SIG_BLOCK, &held, mask);
	*wait = *mask;
	for (size_t i = 0; i < WEX_ARRAY_SIZE(quiet_sigs); i++)
		sigaddset(wait, quiet_sigs[i]);
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		sigaddset(wait, sig);
}

/* Marks the call s (call_seq's value while it runs) cancelled, never
 * going back to an older call's number (a second canceller, or a
 * handler, that read call_seq before this one). */
static void cancel_mark(_Atomic uint64_t *seq, uint64_t s)
{
	uint64_t cur = atomic_load(seq);

	while (cur < s && !atomic_compare_exchange_weak(seq, &cur, s))
		;
}

/*
 * A wait for the GPU (a publish's, a sync's settle before its acquire),
 * WEX_CLIENT_EINTR, on the call's own thread: run on a thread of its own
 * (every signal held there; the caller's context current, RELAXED capture
 * mode) while the calling thread waits for it in ppoll under its own mask,
 * as it waits for wexd.  A signal is taken there, its handler runs at
 * once, and the call goes on as if it came in its next wait (cancel_mark:
 * a sync ends before it acquires, a publish gives a hung wexd
 * HUNG_GRACE_MS).  The GPU wait is waited for to its end either way (a
 * publish may not be sent before).  (In the driver on the calling thread
 * a handler ran unseen; holding the signals there instead sends one aimed
 * at the process, Ctrl-C, to another thread.)
 */
struct gpu_job {
	struct wex_client *c;
	int (*fn)(struct wex_client *c, uint64_t arg);
	uint64_t arg;
	struct wex_mem_thread_state ts; /* the caller's */
	int efd, ret;
};

static void *gpu_job_main(void *arg)
{
	struct gpu_job *j = arg;
	struct wex_mem_thread_state own, theirs = j->ts;
	uint64_t one = 1;

	wex_mem_thread_save(&own); /* (RELAXED) */
	theirs.relaxed = 0;
	wex_mem_thread_restore(&theirs); /* the caller's context */
	j->ret = j->fn(j->c, j->arg);
	wex_mem_thread_restore(&own);
	(void)!write(j->efd, &one, sizeof(one));
	return NULL;
}

static int gpu_wait(struct wex_client *c, int (*fn)(struct wex_client *c, uint64_t arg),
		    uint64_t arg)
{
	struct gpu_job j = { .c = c, .fn = fn, .arg = arg };
	struct pollfd pfd;
	sigset_t mask, wait;
	pthread_t th;
	int r;

	/* (No driver in the process: no GPU work, nothing to wait for.) */
	if (!c->eintr || cancel_fd >= 0 || c->att_held || !wex_mem_gpu_in_process())
		return fn(c, arg);
	j.efd = eventfd(0, EFD_CLOEXEC);
	if (j.efd < 0)
		return fn(c, arg);
	wex_mem_thread_save(&j.ts);
	/* (From here a signal waits for the ppoll; the thread starts with
	 * every one held.) */
	signals_held(&mask, &wait);
	if (pthread_create(&th, NULL, gpu_job_main, &j) != 0) {
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
		wex_mem_thread_restore(&j.ts);
		close(j.efd);
		return fn(c, arg);
	}
	pfd = (struct pollfd){ .fd = j.efd, .events = POLLIN };
	for (;;) {
		r = ppoll(&pfd, 1, NULL, &wait);
		if (r > 0)
			break;
		if (r < 0 && errno == EINTR) {
			c->signalled = 1;
			cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
		} else if (r < 0) {
			/* (ENOMEM: the kernel's, for a moment.) */
			const struct timespec nap = { .tv_nsec = 1000000 };

			nanosleep(&nap, NULL);
		}
	}
	pthread_join(th, NULL);
	pthread_sigmask(SIG_SETMASK, &mask, NULL);
	wex_mem_thread_restore(&j.ts);
	close(j.efd);
	return j.ret;
}

/* Around a call wex_cancel may cancel (on the thread that runs it,
 * before it waits for the watch's lock: a cancel then is not lost). */
static void cancelable_begin(struct wex_client *c)
{
	atomic_fetch_add(&c->call_seq, 1); /* odd */
}

static void cancelable_end(struct wex_client *c)
{
	atomic_fetch_add(&c->call_seq, 1); /* even */
}

/* req is a wait wex_cancel may end: the call's acquire or begin_write
 * (cancel_wait, set under the watch's lock), not one of a reconnect
 * inside it (which begins a write again); or a sync's fetch, which waits
 * while wexd's planner builds its plan (seconds for millions of cells;
 * a fetch answered already makes wexd ignore the cancel). */
static int cancelable_req(const struct wex_client *c, json_t *req)
{
	const char *op = json_string_value(json_object_get(req, "op")) ?: "";

	return c->cancel_wait && !c->reconnecting &&
	       (!strcmp(op, "acquire") || !strcmp(op, "begin_write") || !strcmp(op, "fetch"));
}

/* limit_ms, or what is left of the running call's time if less (at least
 * 1 ms: its last try). */
static uint64_t call_left_ms(const struct wex_client *c, uint64_t limit_ms)
{
	uint64_t now = wex__now_ns(), left;

	if (!c->call_end)
		return limit_ms;
	left = c->call_end > now ? (c->call_end - now + 999999) / 1000000ull : 1;
	return left < limit_ms ? left : limit_ms;
}

/* What ends a wait for wexd's answer inside a reconnect (raw_rpc): none
 * but the answer (or the watch's stop); wex_cancel and signals, for the
 * call that reconnects on its own thread (pfd[2]: cancel_efd); a call that
 * waits for the lock the watch holds while it waits for hello's answer
 * (pfd[2]: wantfd).
 * Either gives the new connection up: nothing of the call's own was asked
 * on it yet, and the next call reconnects. */
enum { GIVE_UP_NONE, GIVE_UP_CANCEL, GIVE_UP_WANT };

/* How long wexd's answer is waited for once a cancel was sent, or (on the
 * calling thread, WEX_CLIENT_EINTR) a signal came, where dropping the
 * connection loses nothing asked (a cancelled wait, a hello, a publish): a
 * wexd that answers nothing by then (stopped, deadlocked) has the
 * connection dropped, so that Ctrl-C acts in seconds, not at the
 * request's timeout.  A publish so given up is either not run (wexd runs
 * no request of a client that hung up) or was (wexd answered just as the
 * client gave up, or a wexd that predates this ran it): the next
 * reconnect finds which in hello's published version, and the publish
 * called again succeeds or is sent again.  So for the requests of the
 * call's own reconnect after wexd answered its hello: given up, the next
 * call reconnects in full; and for a registration call of its own
 * (REGISTERING): given up, nothing of it is kept (the caller calls it
 * again), and wexd forgets what it registered on the connection, as it
 * does at the request's timeout. */
#define HUNG_GRACE_MS 3000u

/* What wait_answer waits for: a request's answer; a hello's (a signal
 * gives a hung wexd HUNG_GRACE_MS); one that a signal or wex_cancel gives
 * HUNG_GRACE_MS, nothing sent to wexd (a publish, which does not wait in
 * wexd; the requests of the call's own reconnect after hello; a
 * registration call's). */
enum { ANSWER_PLAIN, ANSWER_HELLO, ANSWER_GRACE };

/*
 * The end of the grace a cancel of the running call gives wexd: set at
 * the first wait that sees the cancel, and kept for the call's later
 * requests.  Each wait gave its own request HUNG_GRACE_MS, so that a
 * registration of several parts (a chained segment) on a wexd slow to
 * answer each, but within the grace, ended parts x 3 s after the cancel,
 * or not at all.
 */
static uint64_t call_grace(struct wex_client *c)
{
	uint64_t seq = atomic_load(&c->call_seq);

	if (c->grace_seq != seq) {
		c->grace_seq = seq;
		c->grace_end = wex__now_ns() + HUNG_GRACE_MS * 1000000ull;
	}
	return c->grace_end;
}

/*
 * Polls pfd (wexd's answer, the watch's stop, wex_cancel's wake-up) for up
 * to limit_ms.  A cancel of the call waiting here asks wexd, once, to end
 * the wait: its answer (-ECANCELED, or the one it sent before the cancel
 * came) is this request's, and is waited for as before, up to
 * HUNG_GRACE_MS (a signal, WEX_CLIENT_EINTR, asks the same cancel: a
 * wexd that predates cancels is waited for as before); so is the answer
 * to a hello after a signal came (on the calling thread: hello).  Returns
 * poll's count (0: nothing came in time), or a negative errno: -ECANCELED
 * or -EBUSY where give_up says the wait ends on a cancel or signal, or
 * for a call; -ETIME when the grace ran out.  mask (may be NULL): the
 * signal mask to wait under (ppoll; signals_held's `wait`).
 */
static int wait_answer(struct wex_client *c, struct pollfd *pfd, uint64_t limit_ms,
		       const sigset_t *mask, int give_up, int kind)
{
	uint64_t end = wex__now_ns() + limit_ms * 1000000ull, now, left, tick, grace = 0;
	struct timespec ts;
	int ret, sent = 0;

	for (;;) {
		/* (Also when cancelled before this request went: its wake-up
		 * was read by an earlier wait of the same call.) */
		if (give_up == GIVE_UP_CANCEL && cancel_asked(c))
			return -ECANCELED;
		if (give_up == GIVE_UP_WANT && atomic_load(&c->watch->want))
			return -EBUSY;
		if (kind == ANSWER_GRACE && !grace && cancel_asked(c))
			grace = call_grace(c);
		if (kind != ANSWER_GRACE && !give_up && pfd[2].fd >= 0 && !sent &&
		    cancel_asked(c) && atomic_load(&c->wexd_cancels)) {
			char msg[64];
			ssize_t n;

			snprintf(msg, sizeof(msg), "{\"v\": %d, \"op\": \"cancel\"}", WEX_PROTO_VERSION);
			/* Sent or not, once: where the connection is gone,
			 * the receive says so (after any answer already in). */
			n = wex_sock_send(c->fd, msg, strlen(msg), NULL, 0, 0);
			if (n < 0)
				wex_debug("client", "cancel: %s", strerror((int)-n));
			sent = 1;
			if (!grace)
				grace = call_grace(c);
		}
		now = wex__now_ns();
		if (grace && now >= grace)
			return -ETIME;
		left = now >= end ? 0 : end - now;
		if (grace && grace - now < left)
			left = grace - now;
		ts.tv_sec = (time_t)(left / 1000000000ull);
		ts.tv_nsec = (long)(left % 1000000000ull);
		ret = ppoll(pfd, 3, &ts, mask);
		if (ret < 0 && errno == EINTR) {
			/* A signal (its handler ran): WEX_CLIENT_EINTR ends
			 * the wait, for the caller's runtime to act on it. */
			if (c->att_held) {
				/* In the call's reconnect: it ends there
				 * before hello's answer, else at the call's
				 * next wait. */
				c->signalled = 1;
				cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
				if (give_up == GIVE_UP_CANCEL)
					return -ECANCELED;
			} else if (pfd[2].fd >= 0 && c->eintr &&
				   (kind == ANSWER_GRACE || atomic_load(&c->wexd_cancels))) {
				c->signalled = 1;
				cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
			}
			if (kind == ANSWER_HELLO && c->eintr && cancel_fd < 0 && !grace)
				grace = wex__now_ns() + HUNG_GRACE_MS * 1000000ull;
			continue;
		}
		if (ret == 0 && grace && wex__now_ns() >= grace)
			return -ETIME;
		if (ret <= 0 || !(pfd[2].revents & POLLIN) ||
		    (pfd[0].revents | pfd[1].revents))
			return ret < 0 ? -errno : ret;
		/* (A wake-up for a call before this one is no cancel.) */
		if (read(pfd[2].fd, &tick, sizeof(tick)) < 0 && errno != EAGAIN)
			return -errno;
	}
}

static int raw_rpc(struct wex_client *c, json_t *req, const int *fds, int nfds, json_t **reply,
		   int *rfds, int maxr, int *nrfds, uint32_t wait_ms)
{
	char *s, *buf;
	size_t len;
	ssize_t n;
	uint64_t limit;
	int mflags = 0, got = 0, ret;
	/* (poll skips the entries with fd -1.) */
	struct pollfd pfd[3] = { { .fd = c->fd, .events = POLLIN },
				 { .fd = cancel_fd, .events = POLLIN },
				 { .fd = -1, .events = POLLIN } };
	json_error_t je;
	int tmpfds[WEX_SOCK_MAX_FDS];

	sigset_t mask, wait;
	const char *rop = json_string_value(json_object_get(req, "op")) ?: "";
	int masked = 0, give_up = GIVE_UP_NONE, hello = !strcmp(rop, "hello"),
	    kind = hello ? ANSWER_HELLO : ANSWER_PLAIN;

	json_object_set_new(req, "v", json_integer(WEX_PROTO_VERSION));
	s = wex__json_dump(req, &len);
	if (!s)
		return -ENOMEM;
	/* A wait wex_cancel may end (wexd's answer to the cancel is this
	 * request's). */
	if (cancelable_req(c, req)) {
		pfd[2].fd = c->cancel_efd;
		/* WEX_CLIENT_EINTR: a signal from here on is held until the
		 * wait's ppoll, which takes it (EINTR): one handled before
		 * (between the send and the poll) would end no wait. */
		if (c->eintr) {
			signals_held(&mask, &wait);
			masked = 1;
		}
	} else if (c->reconnecting && cancel_fd < 0 && c->call_end && hello) {
		/* (Once wexd answered hello it is not hung: the rest of the
		 * reconnect, registering everything again, has its usual
		 * time, below.) */
		give_up = GIVE_UP_CANCEL;
		pfd[2].fd = c->cancel_efd;
	} else if (c->reconnecting && cancel_fd < 0 && c->call_end) {
		/* The call's reconnect, wexd's hello answered: registering
		 * everything again has its usual time, but a wex_cancel or a
		 * signal (held to the wait: att_hold) gives a wexd that
		 * stalled since HUNG_GRACE_MS to answer.  Given up, the
		 * reconnect is made again in full by the next call (wexd runs
		 * nothing of a connection closed). */
		kind = ANSWER_GRACE;
		pfd[2].fd = c->cancel_efd;
	} else if (c->reconnecting && cancel_fd >= 0 && c->watch && hello) {
		/* (Only before wexd answered: one that answers is not hung,
		 * and an attempt given up after it registered anything would
		 * be made again in full.) */
		give_up = GIVE_UP_WANT;
		pfd[2].fd = c->watch->wantfd;
	} else if (c->eintr && cancel_fd < 0 && !c->att_held && hello) {
		/* A hello outside those: a signal, held to the wait as
		 * above, gives a hung wexd HUNG_GRACE_MS to answer. */
		signals_held(&mask, &wait);
		masked = 1;
	} else if (c->reg_call && c->call_end && !c->reconnecting && cancel_fd < 0) {
		/* A registration call of its own (a segment, the tensor
		 * table, the layout): as a publish, below.  Given up, the
		 * connection is dropped as at its timeout, wexd forgets what
		 * was registered on it, and the next call reconnects,
		 * registering what the client holds. */
		kind = ANSWER_GRACE;
		pfd[2].fd = c->cancel_efd;
		if (c->eintr) {
			signals_held(&mask, &wait);
			masked = 1;
		}
	} else if (!strcmp(rop, "publish") && c->call_end && !c->reconnecting && cancel_fd < 0) {
		/* wex_publish's own (not a reconnect's restore): wex_cancel
		 * and, held to the wait as above, a signal give a hung wexd
		 * HUNG_GRACE_MS to answer. */
		kind = ANSWER_GRACE;
		pfd[2].fd = c->cancel_efd;
		if (c->eintr) {
			signals_held(&mask, &wait);
			masked = 1;
		}
	}
	n = wex_sock_send(c->fd, s, len, fds, nfds, masked || c->att_held ? MSG_DONTWAIT : 0);
	if (n == -EAGAIN && (masked || c->att_held)) {
		/* wexd's queue is full (a hung wexd): a send that waits does
		 * so with the signals free (a SIGTERM still acts), and one
		 * handled meanwhile is not seen by the wait. */
		pthread_sigmask(SIG_SETMASK, masked ? &mask : &c->att_mask, NULL);
		n = wex_sock_send(c->fd, s, len, fds, nfds, 0);
		if (masked)
			signals_held(&mask, &wait);
		else
			signals_held(&c->att_mask, &c->att_wait);
	}
	free(s);
	if (n < 0) {
		if (masked)
			pthread_sigmask(SIG_SETMASK, &mask, NULL);
		return (int)n;
	}
	limit = reply_limit_ms(wait_ms);
	if (give_up == GIVE_UP_CANCEL)
		limit = call_left_ms(c, limit);
	ret = wait_answer(c, pfd, limit, masked ? &wait : c->att_held ? &c->att_wait : NULL, give_up,
			  kind);
	if (masked)
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
	if (ret == -ETIME) {
		const char *op = json_string_value(json_object_get(req, "op")) ?: "a request";

		/* (As after a timeout: its answer would be taken for the next
		 * request's, and wexd drops what it held for us.) */
		conn_drop(c);
		restore_doubted(c);
		/* (A call that ends on a signal says so: signal_ended.) */
		if (kind == ANSWER_GRACE && c->reconnecting)
			return set_err(c, -ECANCELED, "%swexd at %s answered hello but not %s within %u s, reconnecting (a wexd that stalled?): connection dropped; the next call reconnects",
				       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ? "cancelled (wex_cancel); " : "",
				       c->sock, rop, HUNG_GRACE_MS / 1000);
		if (kind == ANSWER_GRACE && c->reg_call)
			return set_err(c, -ECANCELED, "%swexd at %s did not answer %s within %u s (a hung wexd?): connection dropped (wexd forgets what this client registered on it); nothing of this call is kept: call it again (the next call reconnects and registers it all again)",
				       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ? "cancelled (wex_cancel); " : "",
				       c->sock, rop, HUNG_GRACE_MS / 1000);
		if (kind == ANSWER_GRACE)
			return set_err(c, -ECANCELED, "%swexd at %s did not answer publish v%lld within %u s (a hung wexd?): connection dropped: whether wexd published it is known once it answers; publish it again (that succeeds either way)",
				       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ? "cancelled (wex_cancel); " : "",
				       c->sock, (long long)json_integer_value(json_object_get(req, "version")),
				       HUNG_GRACE_MS / 1000);
		if (!hello)
			return set_err(c, -ECANCELED, "%swexd at %s did not answer the cancel of %s within %u s (a hung wexd?): connection dropped",
				       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ? "cancelled (wex_cancel); " : "",
				       c->sock, op, HUNG_GRACE_MS / 1000);
		return set_err(c, -EINTR, "interrupted by a signal (WEX_CLIENT_EINTR): wexd at %s did not answer hello within %u s of it (a hung wexd?): connection dropped",
			       c->sock, HUNG_GRACE_MS / 1000);
	}
	if (give_up && (ret == -ECANCELED || ret == -EBUSY)) {
		const char *op = json_string_value(json_object_get(req, "op")) ?: "a request";

		/* (Its answer, if any, would be taken for the next request's.) */
		conn_drop(c);
		if (ret == -EBUSY) {
			c->watch->yielded = 1;
			return set_err(c, ret, "gave reconnecting to wexd at %s up to a call (waited for its answer to %s)",
				       c->sock, op);
		}
		return set_err(c, ret, "%swhile reconnecting to wexd at %s (waiting for its answer to %s)",
			       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ? "cancelled (wex_cancel) " : "",
			       c->sock, op);
	}
	if (ret < 0)
		return ret;
	if (cancel_fd >= 0 && (pfd[1].revents & POLLIN)) {
		/* The client is closing: its watch asks no more. */
		conn_drop(c);
		return set_err(c, -ECANCELED, "the client is closing");
	}
	if (ret == 0) {
		/* The request may still be pending in wexd, and its reply would
		 * be taken for the next request's: drop the connection (wexd
		 * then drops what it held for us); the next call reconnects. */
		conn_drop(c);
		restore_doubted(c);
		if (give_up == GIVE_UP_CANCEL && limit < reply_limit_ms(wait_ms))
			return set_err(c, -ETIMEDOUT, "reconnecting to wexd at %s: it did not answer hello within %llu ms, what was left of the call's timeout (a hung wexd?)",
				       c->sock, (unsigned long long)limit);
		return set_err(c, -ETIMEDOUT, "wexd did not answer within %llu ms (connection dropped)",
			       (unsigned long long)limit);
	}
	buf = malloc(1 << 20);
	if (!buf)
		return -ENOMEM;
	n = wex_sock_recv(c->fd, buf, 1 << 20, tmpfds, WEX_SOCK_MAX_FDS, &got, &mflags, 0);
	if (n <= 0) {
		free(buf);
		wex_sock_close_fds(tmpfds, got);
		return n == 0 ? -ECONNRESET : (int)n;
	}
	/* wexd answered after any restore: the lease outlived it. */
	c->restore_unconfirmed = 0;
	*reply = json_loadb(buf, (size_t)n, 0, &je);
	free(buf);
	/* (The fds of a reply with MSG_CTRUNC were dropped for want of one.) */
	if ((mflags & MSG_CTRUNC) && wex_fd_exhausted()) {
		/* The kernel dropped the fds it could not install here. */
		struct rlimit rl = { 0 };

		json_decref(*reply);
		*reply = NULL;
		wex_sock_close_fds(tmpfds, got);
		getrlimit(RLIMIT_NOFILE, &rl);
		return set_err(c, -EMFILE,
			       "this process is out of file descriptors (limit %llu): the fds of "
			       "wexd's reply were dropped; raise it (ulimit -n, LimitNOFILE=)",
			       (unsigned long long)rl.rlim_cur);
	}
	/* A reply larger than one message comes whole in a sealed memfd
	 * (a status listing of many clients), the message naming it. */
	if (*reply && !(mflags & (MSG_TRUNC | MSG_CTRUNC)) && got == 1 &&
	    json_is_true(json_object_get(*reply, "reply_in_fd"))) {
		const void *data;
		size_t dlen;

		json_decref(*reply);
		*reply = NULL;
		if (wex_table_map(tmpfds[0], WEX_REPLY_MAX, &data, &dlen) == 0) {
			*reply = json_loadb(data, dlen, 0, &je);
			wex_table_unmap(data, dlen);
		}
		wex_sock_close_fds(tmpfds, got);
		got = 0;
		if (!*reply)
			return set_err(c, -EBADMSG, "malformed reply from wexd (in its memfd)");
	}
	if (!*reply || (mflags & (MSG_TRUNC | MSG_CTRUNC)) || got > maxr) {
		json_decref(*reply);
		*reply = NULL;
		wex_sock_close_fds(tmpfds, got);
		return set_err(c, -EBADMSG, "malformed reply from wexd");
	}
	if (rfds) {
		memcpy(rfds, tmpfds, sizeof(int) * (size_t)got);
		*nrfds = got;
	} else {
		wex_sock_close_fds(tmpfds, got);
	}
	return 0;
}

static int reply_status(struct wex_client *c, json_t *reply)
{
	const char *code = "EUNKNOWN", *msg = "";

	if (json_is_true(json_object_get(reply, "ok")))
		return 0;
	json_unpack(reply, "{s:{s?s, s?s}}", "error", "code", &code, "message", &msg);
	snprintf(err_buf(c), sizeof(c->err), "%s", msg);
	c->lease_kept = json_is_true(json_object_get(reply, "lease_kept"));
	return wex__errcode(code);
}

static int reconnect(struct wex_client *c);
static void watch_kick(struct watch *w);

/* Longest wait wexd accepts as a default (config.c: one day). */
#define DAEMON_WAIT_MAX_MS 86400000u

/*
 * The wait of a blocking request (begin_write, acquire): the caller's
 * timeout, else the client's if one was set, goes into req as timeout_ms;
 * with neither, req names none and wexd's configured default applies
 * (begin_write_timeout_ms, sync_timeout_ms).  Returns how long to wait for
 * the reply (wexd answers every wait by its deadline).
 */
static uint32_t wait_of(const struct wex_client *c, uint32_t timeout_ms, json_t *req)
{
	if (!timeout_ms && c->timeout_set)
		timeout_ms = c->timeout_ms;
	if (!timeout_ms)
		return DAEMON_WAIT_MAX_MS;
	json_object_set_new(req, "timeout_ms", json_integer(timeout_ms));
	return timeout_ms;
}

/* The connection to wexd is gone, and the lease with it, whether or not
 * a reconnect succeeds (reconnect says the same once it does): a release
 * that then finds no wexd to reconnect to must still report the lost
 * lease, not only "cannot connect", and the next one must not say "no
 * lease held". */
static void lease_went(struct wex_client *c)
{
	if (c->has_lease) {
		c->lease_lost = 1;
		c->has_lease = 0;
	}
}

/* The connection to wexd went (its end closed it, or it never was). */
static int conn_lost(int ret)
{
	return ret == -EPIPE || ret == -ECONNRESET || ret == -ENOTCONN;
}

/* The connection to wexd failed, or no wexd answers at its socket (not a
 * refusal by wexd, not the wait's own timeout). */
static int daemon_gone(int ret)
{
	return ret == -WEX_EDAEMON || conn_lost(ret) || ret == -ECONNREFUSED || ret == -ENOENT ||
	       ret == -ESHUTDOWN;
}

/* One request; on a lost daemon, reconnect once and retry. `req` is taken.
 * Received fds (if rfds) are the caller's. */
/* begin_write of v, which this rank published: a reconnect found it
 * published (pub_found), or its publish succeeded (a caller whose runtime
 * raised as it returned, as Python does on Ctrl-C, may not know). */
static int found_err(struct wex_client *c, uint64_t v)
{
	return set_err(c, -EALREADY, "begin_write v%llu: v%llu is published already: %s; write v%llu next",
		       (unsigned long long)v, (unsigned long long)v,
		       v == c->pub_found ? "wexd carried out the publish of it that failed (its answer was lost with the connection; found on reconnecting)" :
					   "this rank's last publish was of it, and succeeded",
		       (unsigned long long)v + 1);
}

static int rpc(struct wex_client *c, json_t *req, const int *fds, int nfds, json_t **out,
	       int *rfds, int maxr, int *nrfds, uint32_t wait_ms)
{
	json_t *reply = NULL;
	int ret, tries = 0, own_end = 0;

	if (nrfds)
		*nrfds = 0;
	/* A registration call's request (REGISTERING): its reconnect, if
	 * any, is one a signal or wex_cancel ends, within the client's
	 * timeout from here (not from the call's start: its local work, an
	 * allocation, is not counted). */
	if (c->reg_call && !c->call_end && !c->reconnecting && cancel_fd < 0) {
		c->call_end = wex__now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
		own_end = 1;
	}
	/* Metrics: wexd learns of a finished sync on the next request, so the
	 * sync itself pays no extra round trip. */
	if (c->report) {
		json_object_set_new(req, "report", c->report);
		c->report = NULL;
	}
again:
	if (c->fd < 0) {
		ret = c->reconnecting ? set_err(c, -WEX_EDAEMON, "lost wexd again while reconnecting") :
					reconnect(c);
		if (ret < 0)
			goto out;
		/* A publish whose write the reconnect found carried out
		 * already (its answer was lost with the connection), or could
		 * not go on with: asked, wexd would refuse it as not begun.
		 * A begin_write of the version found published: refused as
		 * not newer, for no reason the caller could see. */
		if (c->pub_found && !strcmp(json_string_value(json_object_get(req, "op")) ?: "", "begin_write") &&
		    (uint64_t)json_integer_value(json_object_get(req, "version")) == c->pub_found) {
			ret = found_err(c, c->pub_found);
			goto out;
		}
		if (!strcmp(json_string_value(json_object_get(req, "op")) ?: "", "publish") &&
		    !json_is_true(json_object_get(req, "restored"))) {
			uint64_t v = (uint64_t)json_integer_value(json_object_get(req, "version"));

			if (v && v == c->pub_found) {
				ret = 0;
				goto out;
			}
			if (v && v == c->write_lost_v && v != c->writing) {
				ret = set_err(c, -EINVAL, "publish v%llu: %s", (unsigned long long)v,
					      c->write_lost);
				goto out;
			}
		}
	}
	ret = raw_rpc(c, req, fds, nfds, &reply, rfds, maxr, nrfds, wait_ms);
	/* (A cancelled wait is not sent again to a new wexd.) */
	if (conn_lost(ret) && !c->reconnecting && tries++ == 0 &&
	    !(cancel_asked(c) && cancelable_req(c, req)) &&
	    strcmp(json_string_value(json_object_get(req, "op")) ?: "", "hello")) {
		wex_warn("client", "lost wexd (%s): reconnecting", strerror(-ret));
		conn_drop(c);
		lease_went(c);
		goto again;
	}
	/* A call wexd did not answer dropped the connection, and wexd drops
	 * the lease with it: lost, unless this was the release of it, which
	 * then ends it as asked. */
	if ((ret == -ETIMEDOUT || ret == -ECANCELED || ret == -EINTR) && c->fd < 0 &&
	    strcmp(json_string_value(json_object_get(req, "op")) ?: "", "release"))
		lease_went(c);
	if (ret < 0) {
		/* (Inside reconnect, which then starts over: gone is gone.) */
		if (conn_lost(ret) && c->reconnecting)
			conn_drop(c);
		if (ret == -EPIPE || ret == -ECONNRESET)
			ret = set_err(c, -WEX_EDAEMON, "wexd closed the connection");
		goto out;
	}
	ret = reply_status(c, reply);
	if (ret < 0 && rfds) {
		wex_sock_close_fds(rfds, *nrfds);
		*nrfds = 0;
	}
	if (ret == 0 && out) {
		*out = reply;
		reply = NULL;
	}
out:
	if (own_end)
		c->call_end = 0;
	json_decref(reply);
	json_decref(req);
	return ret;
}

static int simple_rpc(struct wex_client *c, json_t *req, json_t **out)
{
	return rpc(c, req, NULL, 0, out, NULL, 0, NULL, c->timeout_ms);
}

static const char *role_str(int role)
{
	return role == WEX_ROLE_PRODUCER ? "producer" : role == WEX_ROLE_CONSUMER ? "consumer" : "admin";
}

/* Says hello on a new connection.  A consumer whose lease went with the
 * old one (lease_lost) names it: a remap lease that wexd wrote down
 * outlives a restart of wexd, and is taken back (*reclaimed = 1). */
static json_t *hello_req(const struct wex_client *c)
{
	char name[64];
	json_t *req;

	snprintf(name, sizeof(name), "pid-%d", (int)getpid());
	req = json_pack("{s:s, s:s, s:s, s:I, s:I, s:s}", "op", "hello", "role", role_str(c->role),
			"name", name, "rank", (json_int_t)c->rank, "world", (json_int_t)c->world,
			"group", c->group);
	if (req && c->role != WEX_ROLE_ADMIN)
		json_object_set_new(req, "model", json_string(c->model));
	if (req && c->role == WEX_ROLE_CONSUMER && c->lease_lost && c->lease_version)
		json_object_set_new(req, "lease", json_integer((json_int_t)c->lease_version));
	return req;
}

/* The error of wexd's refusal of a new connection (reply_status's),
 * prefixed as one. */
static int refusal(struct wex_client *c, json_t *reply)
{
	char why[sizeof(c->err)];
	int ret = reply_status(c, reply);

	memcpy(why, err_buf(c), sizeof(why)); /* (the watch's own, on its thread) */
	set_err(c, ret, "wexd at %s refused this client: %s", c->sock, why);
	return ret;
}

static int hello(struct wex_client *c, int *reclaimed, uint64_t *published)
{
	json_t *req = hello_req(c), *reply = NULL;
	int ret;

	*reclaimed = 0;
	if (!req)
		return -ENOMEM;
	ret = raw_rpc(c, req, NULL, 0, &reply, NULL, 0, NULL, c->timeout_ms);
	json_decref(req);
	if (ret < 0)
		return ret;
	/* (A refusal read as the answer: the send came before wexd closed.) */
	ret = json_is_true(json_object_get(reply, "refused")) ? refusal(c, reply) :
								  reply_status(c, reply);
	if (ret == 0) {
		*reclaimed = json_is_true(json_object_get(reply, "lease_reclaimed"));
		if (published && json_integer_value(json_object_get(reply, "published")) > 0)
			*published = (uint64_t)json_integer_value(json_object_get(reply, "published"));
		atomic_store(&c->wexd_cancels, json_is_true(json_object_get(reply, "cancel")));
	}
	json_decref(reply);
	return ret;
}

static int register_seg(struct wex_client *c, struct own_seg *o);
static int send_tensors(struct wex_client *c);
static int send_layout(struct wex_client *c, int doubt);

/* wexd closed a new connection before its hello's answer: the reason it
 * left there (max_clients reached, a drain, no fd left) when it left one. */
static int refused(struct wex_client *c, int ret)
{
	char buf[1024];
	json_t *reply = NULL;
	ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);

	if (n > 0)
		reply = json_loadb(buf, (size_t)n, 0, NULL);
	if (reply && json_is_false(json_object_get(reply, "ok"))) {
		ret = refusal(c, reply);
	} else {
		set_err(c, ret, "wexd at %s closed the connection during hello: it refuses new "
			"clients while max_clients are connected (or max_clients_per_uid of its "
			"user's), while it drains after SIGTERM, "
			"and when it is out of file descriptors (its log says which)", c->sock);
	}
	json_decref(reply);
	return ret;
}

/*
 * A reconnect attempt inside a call a signal ends (WEX_CLIENT_EINTR, and
 * call_end: on the call's own thread) holds the signals from its start to
 * its end, and takes them only where it waits (ppoll under att_wait): a
 * handler that ran between two steps would end no wait.  One still held
 * at its end (it came between two waits) is marked as having come, for
 * the call's next wait, or its retry's nap, to end at once.
 */
static void att_hold(struct wex_client *c)
{
	if (!c->eintr || !c->call_end || c->att_held || cancel_fd >= 0)
		return;
	signals_held(&c->att_mask, &c->att_wait);
	c->att_held = 1;
}

static void att_release(struct wex_client *c)
{
	sigset_t pend;

	if (!c->att_held)
		return;
	if (sigpending(&pend) == 0)
		for (int sig = 1; sig < NSIG; sig++)
			if (sigismember(&pend, sig) == 1 && sigismember(&c->att_wait, sig) == 0) {
				c->signalled = 1;
				cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
				break;
			}
	c->att_held = 0;
	pthread_sigmask(SIG_SETMASK, &c->att_mask, NULL); /* (its handler runs now) */
}

/* Connects c->fd for a call (call_end): a queue of connections that
 * stays full (a hung wexd) is tried again every 10 ms up to limit_ms,
 * napping where wex_cancel, and a signal (WEX_CLIENT_EINTR, att_hold),
 * end the attempt. */
static int call_connect(struct wex_client *c, uint64_t limit_ms)
{
	uint64_t end = wex__now_ns() + limit_ms * 1000000ull, now, left, tick;
	struct pollfd pfd = { .fd = c->cancel_efd, .events = POLLIN };
	struct timespec ts;
	int ret;

	while ((ret = wex_sock_connect_fd(c->fd, c->sock, 0)) == -EAGAIN &&
	       (now = wex__now_ns()) < end) {
		left = end - now < 10000000ull ? end - now : 10000000ull;
		ts.tv_sec = 0;
		ts.tv_nsec = (long)left;
		ret = ppoll(&pfd, 1, &ts, c->att_held ? &c->att_wait : NULL);
		if (ret > 0)
			(void)!read(c->cancel_efd, &tick, sizeof(tick)); /* (an earlier call's too) */
		else if (ret < 0 && errno == EINTR && c->att_held) {
			c->signalled = 1;
			cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
		}
		if (cancel_asked(c))
			return set_err(c, -ECANCELED, "%swhile connecting to wexd at %s (its queue of connections was full)",
				       c->signalled ? "" : "cancelled (wex_cancel) ", c->sock);
	}
	return ret;
}

/* Connects c->fd outside a call's time (wex_client_open, wex_release),
 * WEX_CLIENT_EINTR, on the caller's thread: a signal its caller handles
 * ends a wait for room in a full queue (a hung wexd) with -EINTR, as it
 * ends a wait for wexd's answer; those that end no wait are held through
 * it (their handlers run after). */
static int connect_intr(struct wex_client *c, int wait_ms)
{
	sigset_t quiet, old;
	int ret;

	sigemptyset(&quiet);
	for (size_t i = 0; i < WEX_ARRAY_SIZE(quiet_sigs); i++)
		sigaddset(&quiet, quiet_sigs[i]);
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		sigaddset(&quiet, sig);
	pthread_sigmask(SIG_BLOCK, &quiet, &old);
	ret = wex_sock_connect_fd_intr(c->fd, c->sock, wait_ms);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret;
}

/* After a daemon restart: a new connection, hello, and everything this
 * client had registered, so that its peers find it again. */
static int reconnect_once(struct wex_client *c, int *greeted)
{
	/* Regions restored under a lease the old connection took with it
	 * are whole only if the new wexd gives that lease back. */
	int doubt = c->restore_unconfirmed, reclaimed = 0, ret;
	uint64_t limit, published = 0;

	c->restore_unconfirmed = 0;
	state_lock(c); /* a fork copies this fd only with c->fd naming it */
	c->fd = wex_sock_new();
	state_unlock(c);
	/* A full queue (a hung wexd) is waited on as long as a reply would
	 * be, within what is left of the call's time, where wex_cancel and
	 * signals end it (call_connect); the watch never waits: it could not
	 * be stopped then. */
	limit = reply_limit_ms(c->timeout_ms);
	att_hold(c);
	if (c->fd < 0)
		ret = c->fd;
	else if (c->call_end && cancel_fd < 0)
		ret = call_connect(c, call_left_ms(c, limit));
	else if (c->eintr && cancel_fd < 0)
		ret = connect_intr(c, limit > INT_MAX ? INT_MAX : (int)limit);
	else
		ret = wex_sock_connect_fd(c->fd, c->sock,
					  cancel_fd >= 0 ? 0 : limit > INT_MAX ? INT_MAX : (int)limit);
	if (ret < 0) {
		if (c->fd < 0)
			c->fd = -1;
		else
			conn_drop(c);
		if (ret == -ECANCELED)
			; /* (call_connect said why) */
		else if (ret == -EAGAIN)
			set_err(c, ret, "cannot connect to wexd at %s: its queue of connections stayed full (a hung daemon?)",
				c->sock);
		else if (ret == -EACCES)
			set_err(c, ret, "cannot connect to wexd at %s: %s (the socket's group, wex under systemd, must include this user)",
				c->sock, strerror(-ret));
		else if (ret == -EINTR)
			set_err(c, ret, "cannot connect to wexd at %s: a signal ended the wait for room in its queue of connections (WEX_CLIENT_EINTR; a hung daemon?)",
				c->sock);
		else
			set_err(c, ret, "cannot connect to wexd at %s: %s", c->sock, strerror(-ret));
		goto doubted;
	}
	c->conn_gen++;
	ret = hello(c, &reclaimed, &published);
	if (ret < 0) {
		if (ret == -ECONNRESET || ret == -EPIPE)
			ret = refused(c, ret);
		goto err;
	}
	*greeted = 1;
	c->lease_owed = 0; /* (a hello that named no lease ended it) */
	if (c->role == WEX_ROLE_PRODUCER) {
		for (size_t i = 0; i < c->nosegs; i++)
			if ((ret = register_seg(c, &c->osegs[i])) < 0)
				goto err;
		/* Any table wexd accepted, an empty one too (a rank whose FSDP
		 * shards are all empty): ptensors is set once one was. */
		if (c->ptensors && (ret = send_tensors(c)) < 0)
			goto err;
		/* wexd published the version being written: it carried out
		 * the publish whose answer never came (given up after a
		 * signal, wex_cancel or its timeout; this rank's publish is
		 * one that version needed).  The write is over: the rank holds
		 * the version, said again below as after any publish, and
		 * the publish called again for it succeeds. */
		if (c->writing && published == c->writing) {
			wex_info("client", "wexd published v%llu of model '%s' from a publish whose answer producer rank %u never had: the rank holds it",
				 (unsigned long long)c->writing, c->model, c->rank);
			c->published = c->writing;
			c->pub_found = c->writing;
			c->writing = 0;
		}
		/* A write begun on the old daemon goes on: begin it again here
		 * (no lease held then, so none the new daemon read back from
		 * its lease journal holds it), or the publish that ends it is
		 * refused as "not begun".  If the new
		 * daemon refuses, the publish reports that. */
		if (c->writing) {
			json_t *req = json_pack("{s:s, s:I, s:I}", "op", "begin_write", "version",
						(json_int_t)c->writing, "timeout_ms",
						(json_int_t)c->timeout_ms);

			ret = rpc(c, req, NULL, 0, NULL, NULL, 0, NULL, c->timeout_ms);
			if (ret < 0 && c->fd < 0)
				goto err; /* wexd went again: the write goes on at the next */
			if (ret < 0) {
				/* Refused: the write cannot go on, and the
				 * publish that would end it says why. */
				snprintf(c->write_lost, sizeof(c->write_lost),
					 "wexd restarted during the write of v%llu and refused to let it go on (%.200s): begin_write it again",
					 (unsigned long long)c->writing, err_buf(c));
				c->write_lost_v = c->writing;
				c->writing = 0;
			}
		} else if (c->published) {
			/* The memory still holds the version last published (no
			 * write begun since): a new wexd would otherwise know of
			 * no version until the next step publishes, and engines
			 * that wait for this one before the rollout that step
			 * waits for would wait in vain. */
			json_t *req = json_pack("{s:s, s:I, s:b}", "op", "publish", "version",
						(json_int_t)c->published, "restored", 1);

			ret = rpc(c, req, NULL, 0, NULL, NULL, 0, NULL, c->timeout_ms);
			if (ret < 0 && c->fd < 0)
				goto err; /* wexd went again */
			if (ret < 0)
				wex_warn("client", "wexd did not take back v%llu, which producer rank %u of model '%s' still holds (%s): consumers get it only once published again",
					 (unsigned long long)c->published, c->rank, c->model, err_buf(c));
		}
	} else if (c->role == WEX_ROLE_CONSUMER) {
		if (c->nlayout && (ret = send_layout(c, doubt && !reclaimed)) < 0)
			goto err;
		if (reclaimed) {
			/* The new wexd held the producer off meanwhile: the
			 * lease never lapsed, and the release ends it. */
			c->has_lease = 1;
			c->lease_lost = 0;
			doubt = 0;
		} else {
			if (c->has_lease)
				c->lease_lost = 1;
			c->has_lease = 0;
		}
		c->fetched = 0;
		/* A new wexd numbers versions afresh (a restarted trainer may
		 * publish "v1" again): the next copy sync copies whatever its
		 * version number, and the next sync of any mode reports a
		 * change. */
		c->copied = 0;
		c->version = 0;
	}
	if (c->watch)
		watch_kick(c->watch); /* a new connection to watch */
	ret = 0;
	goto doubted;
err:
	conn_drop(c);
doubted:
	if (doubt) {
		c->dirty = 1;
		c->copied = 0;
	}
	att_release(c);
	return ret;
}

/* A wexd that went again while this client re-registered (restarted
 * twice in a row) is reconnected to from the start, a few times: each
 * attempt registers everything once, on one daemon. */
static int reconnect(struct wex_client *c)
{
	int ret;

	for (int tries = 0;; tries++) {
		int greeted = 0;

		c->reconnecting = 1;
		ret = reconnect_once(c, &greeted);
		c->reconnecting = 0;
		if (ret >= 0 || !greeted || tries == 2 || (ret != -WEX_EDAEMON && !conn_lost(ret)))
			return ret;
		wex_warn("client", "lost wexd again while reconnecting (%s): reconnecting", err_buf(c));
	}
}

/* ---------------------------------------------------------------------- */
/* A producer's watch (struct watch).                                      */

static void watch_free(struct wex_client *c);

/* Takes `call` for a call; one the watch holds while it reconnects is
 * asked for (want, wantfd): the watch gives its attempt up, and the call
 * reconnects itself, where wex_cancel and signals end it. */
static void watch_enter(struct watch *w)
{
	uint64_t one = 1;

	if (pthread_mutex_trylock(&w->call) == 0)
		return;
	atomic_fetch_add(&w->want, 1);
	(void)!write(w->wantfd, &one, sizeof(one));
	pthread_mutex_lock(&w->call);
	atomic_fetch_sub(&w->want, 1);
}

/* How often a call that wex_cancel and signals end tries the lock the
 * watch holds (call_enter). */
#define CALL_ENTER_TICK_NS 5000000ull

/*
 * watch_enter for a call that wex_cancel and signals (WEX_CLIENT_EINTR)
 * end (begin_write, publish: cancelable_begin ran): the watch holds the
 * lock through a whole reconnect, and re-registering with a wexd that
 * stopped after its hello takes each request's timeout; a cancel or a
 * signal's handler (Python's Ctrl-C) would be seen only after.  The lock
 * is tried every CALL_ENTER_TICK_NS while the call waits on cancel_efd,
 * its signals held but in the wait (as raw_rpc's), for as long as the
 * watch takes (a reconnect has its usual time, however short the call's
 * timeout).  0: held; -ECANCELED, -EINTR: not (nothing of the call done).
 * (Without a watch, or for another call, as watch_enter.)
 */
static int call_enter(struct wex_client *c)
{
	struct watch *w = c->watch;
	struct pollfd pfd = { .fd = c->cancel_efd, .events = POLLIN };
	const struct timespec tick = { .tv_nsec = (long)CALL_ENTER_TICK_NS };
	uint64_t one = 1, n;
	sigset_t mask, wait;
	int ret = 0, r;

	if (!w)
		return 0;
	if (pthread_mutex_trylock(&w->call) == 0)
		return 0;
	if (!(atomic_load(&c->call_seq) & 1)) {
		watch_enter(w);
		return 0;
	}
	atomic_fetch_add(&w->want, 1);
	(void)!write(w->wantfd, &one, sizeof(one));
	if (c->eintr)
		signals_held(&mask, &wait);
	while (pthread_mutex_trylock(&w->call) != 0) {
		if (cancel_asked(c)) {
			ret = set_err(c, -ECANCELED, "cancelled (wex_cancel) while waiting for the producer's watch, which was reconnecting to wexd at %s",
				      c->sock);
			break;
		}
		r = ppoll(&pfd, 1, &tick, c->eintr ? &wait : NULL);
		if (r > 0) {
			(void)!read(c->cancel_efd, &n, sizeof(n)); /* (an earlier call's too) */
		} else if (r < 0 && errno == EINTR && c->eintr) {
			ret = set_err(c, -EINTR, "interrupted by a signal (WEX_CLIENT_EINTR) while waiting for the producer's watch, which was reconnecting to wexd at %s",
				      c->sock);
			break;
		}
	}
	if (c->eintr)
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
	atomic_fetch_sub(&w->want, 1);
	return ret;
}

static void watch_kick(struct watch *w)
{
	uint64_t one = 1;

	if (w->efd >= 0)
		(void)!write(w->efd, &one, sizeof(one));
}

/* A connection that lasted less than this was not really back: the next
 * try waits (a wexd that hangs up at once is not hammered). */
#define WATCH_UP_NS 1000000000ull

static int watch_backoff(struct watch *w)
{
	w->backoff_ms = w->backoff_ms ? w->backoff_ms * 2 : 20;
	if (w->backoff_ms > 1000)
		w->backoff_ms = 1000;
	return (int)w->backoff_ms;
}

/* The watch's dup of the connection (NULL c->fd: none). */
static void watch_dup(struct wex_client *c, struct watch *w)
{
	state_lock(c);
	close_fd(&w->dupfd);
	if (c->fd >= 0)
		w->dupfd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
	w->gen = c->conn_gen;
	state_unlock(c);
}

/* One turn of the watch, under `call`; `hup`: the watched connection hung
 * up.  Returns how long to wait for the next (-1: until woken). */
static int watch_step(struct wex_client *c, struct watch *w, int hup)
{
	int ret;

	if (c->fd >= 0 && w->dupfd >= 0 && w->gen == c->conn_gen) {
		if (!hup)
			return -1;
		wex_warn("client", "wexd hung up on producer rank %u of model '%s': reconnecting",
			 c->rank, c->model);
		conn_drop(c);
		watch_dup(c, w);
		if (wex__now_ns() - w->up_ns < WATCH_UP_NS)
			return watch_backoff(w);
		w->backoff_ms = 0;
	}
	if (c->fd < 0) {
		w->yielded = 0;
		ret = reconnect(c);
		if (ret == -ECANCELED)
			return -1; /* closing */
		if (w->yielded) {
			watch_dup(c, w);
			return 20; /* the call reconnects meanwhile */
		}
		if (ret == -EACCES || ret == -EPERM || ret == -EADDRINUSE || ret == -EINVAL ||
		    ret == -WEX_EPROTO_VERSION) {
			/* wexd is there and refuses this client (access taken
			 * away by a reload, its rank taken): asking again
			 * would be refused again. */
			wex_warn("client", "wexd refused producer rank %u of model '%s' (%s): it reconnects at its next call",
				 c->rank, c->model, w->err);
			watch_dup(c, w);
			return -1;
		}
		if (ret < 0 || c->fd < 0) {
			if (!w->warned++)
				wex_warn("client", "producer rank %u of model '%s' cannot reconnect yet (%s): retrying",
					 c->rank, c->model, w->err);
			watch_dup(c, w);
			return watch_backoff(w);
		}
		w->warned = 0;
		wex_info("client", "producer rank %u of model '%s' reconnected to wexd%s", c->rank,
			 c->model, c->writing ? " (its write goes on)" : c->published ? " (it holds its version again)" : "");
	}
	if (w->gen != c->conn_gen || w->dupfd < 0) {
		watch_dup(c, w);
		w->up_ns = wex__now_ns();
	}
	return w->dupfd < 0 ? 1000 : -1; /* out of fds: look again later */
}

static void *watch_main(void *arg)
{
	struct wex_client *c = arg;
	struct watch *w = c->watch;
	int wait_ms = -1;

	err_to = w->err;
	cancel_fd = w->stopfd;
	for (;;) {
		struct pollfd p[3] = { { .fd = w->efd, .events = POLLIN },
				       { .fd = w->stopfd, .events = POLLIN },
				       { .fd = w->dupfd, .events = POLLRDHUP } };
		uint64_t n;
		int hup;

		if (poll(p, 3, wait_ms) < 0 && errno != EINTR)
			p[0].revents = p[2].revents = 0;
		if (atomic_load(&w->stop))
			break;
		if (p[0].revents & POLLIN)
			(void)!read(w->efd, &n, sizeof(n));
		hup = !!(p[2].revents & (POLLRDHUP | POLLHUP | POLLERR));
		pthread_mutex_lock(&w->call);
		wait_ms = watch_step(c, w, hup);
		pthread_mutex_unlock(&w->call);
	}
	return NULL;
}

/* Starts a producer's watch (open_add done: fork() sees it from now on).
 * Its fds are made, and closed, under `state`, with the watch known to
 * fork(): a child never inherits one unknown to its fork handler. */
static int watch_start(struct wex_client *c)
{
	struct watch *w = calloc(1, sizeof(*w));
	sigset_t all, old;
	int ret = 0;

	if (!w)
		return -ENOMEM;
	w->efd = w->stopfd = w->wantfd = w->dupfd = -1;
	atomic_init(&w->stop, 0);
	atomic_init(&w->want, 0);
	pthread_mutex_init(&w->call, NULL);
	pthread_mutex_lock(&open_lock);
	c->watch = w;
	pthread_mutex_unlock(&open_lock);
	state_lock(c);
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd >= 0)
		w->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->stopfd >= 0)
		w->wantfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd < 0 || w->stopfd < 0 || w->wantfd < 0 || (w->dupfd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0)) < 0)
		ret = -errno;
	w->gen = c->conn_gen;
	w->up_ns = wex__now_ns();
	state_unlock(c);
	if (ret == 0) {
		/* The application's signals go to its own threads. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		ret = -pthread_create(&w->thread, NULL, watch_main, c);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (ret < 0)
		watch_free(c);
	return ret;
}

/* Closes the watch's fds and forgets it (its thread ended, or never ran). */
static void watch_free(struct wex_client *c)
{
	struct watch *w = c->watch;

	state_lock(c);
	close_fd(&w->dupfd);
	close_fd(&w->efd);
	close_fd(&w->stopfd);
	close_fd(&w->wantfd);
	state_unlock(c);
	pthread_mutex_lock(&open_lock);
	c->watch = NULL;
	pthread_mutex_unlock(&open_lock);
	pthread_mutex_destroy(&w->call);
	free(w);
}

static void watch_stop(struct wex_client *c)
{
	struct watch *w = c->watch;
	uint64_t one = 1;

	if (!w)
		return;
	/* Not under `call`: the watch may hold it, waiting on wexd. */
	atomic_store(&w->stop, 1);
	(void)!write(w->stopfd, &one, sizeof(one));
	pthread_join(w->thread, NULL);
	watch_free(c);
}

/* ---------------------------------------------------------------------- */

/* Whether s can go into a JSON string (jansson takes valid UTF-8 only). */
static int utf8_ok(const char *s)
{
	json_t *j = json_string(s);

	json_decref(j);
	return j != NULL;
}

WEX_API int wex_client_open(const struct wex_client_params *p, wex_client_t **out)
{
	struct wex_client *c;
	const char *group, *sock;
	char sockbuf[PATH_MAX + 64]; /* $WEX_SOCKET past c->sock is refused, not cut */
	int ret;

	open_err[0] = '\0';
	if (!p || !out)
		return open_fail(-EINVAL, "wex_client_open: params and out may not be NULL");
	if (!(p->field_mask & WEX_CLIENT_FIELD_ROLE) || p->role < WEX_ROLE_PRODUCER ||
	    p->role > WEX_ROLE_ADMIN)
		return open_fail(-EINVAL, "wex_client_open: role must be WEX_ROLE_PRODUCER, "
				 "WEX_ROLE_CONSUMER or WEX_ROLE_ADMIN (with WEX_CLIENT_FIELD_ROLE)");
	if (p->role != WEX_ROLE_ADMIN &&
	    (!(p->field_mask & WEX_CLIENT_FIELD_MODEL) || !p->model || !*p->model ||
	     strlen(p->model) >= WEX_NAME_MAX))
		return open_fail(-EINVAL, "wex_client_open: a producer or consumer needs a model "
				 "name of 1..%d bytes (with WEX_CLIENT_FIELD_MODEL)", WEX_NAME_MAX - 1);
	/* Cut short, a name would be another's: a group that differs only
	 * past the cut would share ranks and rounds, a socket another wexd. */
	group = (p->field_mask & WEX_CLIENT_FIELD_GROUP) && p->group ? p->group : "default";
	if (strlen(group) >= WEX_NAME_MAX)
		return open_fail(-EINVAL, "wex_client_open: the group name is %zu bytes long, "
				 "over the %d a group name may have", strlen(group), WEX_NAME_MAX - 1);
	/* They travel in hello's JSON, which holds only UTF-8: jansson would
	 * refuse to build it (-ENOMEM here, or a hello without the model). */
	if ((p->role != WEX_ROLE_ADMIN && !utf8_ok(p->model)) || !utf8_ok(group))
		return open_fail(-EINVAL, "wex_client_open: the %s name is not valid UTF-8",
				 p->role != WEX_ROLE_ADMIN && !utf8_ok(p->model) ? "model" : "group");
	sock = (p->field_mask & WEX_CLIENT_FIELD_SOCKET) && p->socket ?
		       p->socket : wex__default_socket(sockbuf, sizeof(sockbuf));
	if (strlen(sock) >= sizeof(c->sock))
		return open_fail(-EINVAL, "wex_client_open: the socket path is %zu bytes long, "
				 "over the %zu a socket path may have", strlen(sock),
				 sizeof(c->sock) - 1);
	c = calloc(1, sizeof(*c));
	if (!c)
		return open_fail(-ENOMEM, "wex_client_open: out of memory");
	pthread_mutex_init(&c->state, NULL);
	pthread_once(&log_once, wex__log_init); /* a producer's watch logs */
	c->fd = -1;
	c->cancel_efd = -1;
	c->role = p->role;
	snprintf(c->sock, sizeof(c->sock), "%s", sock);
	if (p->field_mask & WEX_CLIENT_FIELD_MODEL)
		snprintf(c->model, sizeof(c->model), "%s", p->model);
	snprintf(c->group, sizeof(c->group), "%s", group);
	c->world = 1;
	if (p->field_mask & WEX_CLIENT_FIELD_RANK) {
		c->rank = p->rank;
		c->world = p->world_size ? p->world_size : 1;
	}
	c->eintr = (p->field_mask & WEX_CLIENT_FIELD_FLAGS) && (p->flags & WEX_CLIENT_EINTR);
	c->timeout_set = (p->field_mask & WEX_CLIENT_FIELD_TIMEOUT) && p->timeout_ms;
	c->timeout_ms = c->timeout_set ? p->timeout_ms : 30000;
	c->device = -1;
	c->layout_dev = -2;
	if (p->field_mask & WEX_CLIENT_FIELD_DEVICE) {
		if (p->device < 0) {
			client_free(c);
			return open_fail(-EINVAL, "wex_client_open: device must be a CUDA ordinal "
					 "(0 or more), not %d", p->device);
		}
		c->device = p->device;
	}
	if ((p->field_mask & WEX_CLIENT_FIELD_COPY_THREADS) && p->copy_threads) {
		c->threads = (int)p->copy_threads;
	} else {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		c->threads = n > 8 ? 8 : n < 1 ? 1 : (int)n;
	}
	c->pid = getpid();
	open_add(c); /* before its fds exist: a fork closes them from then on */
	state_lock(c);
	c->cancel_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	ret = c->cancel_efd < 0 ? -errno : 0;
	state_unlock(c);
	if (ret < 0) {
		open_remove(c);
		client_free(c);
		return open_fail(ret, "wex_client_open: eventfd: %s", strerror(-ret));
	}
	ret = reconnect(c);
	if (ret < 0) {
		/* wexd's reason (a rank held, another world size, access
		 * refused) or the connect's, naming the socket. */
		open_fail(ret, "%s%s", c->err[0] ? c->err : strerror(-ret),
			  ret == -ENOENT || ret == -ECONNREFUSED ?
				  " (is wexd running? $WEX_SOCKET or the client's socket names the path it listens on)" :
				  "");
		open_remove(c);
		client_free(c);
		return ret;
	}
	if (c->role == WEX_ROLE_PRODUCER &&
	    !((p->field_mask & WEX_CLIENT_FIELD_FLAGS) && (p->flags & WEX_CLIENT_NO_WATCH)) &&
	    (ret = watch_start(c)) < 0) {
		wex_warn("client", "cannot start the watch of producer rank %u of model '%s': %s (WEX_CLIENT_NO_WATCH opens without one)",
			 c->rank, c->model, strerror(-ret));
		open_fail(ret, "cannot start the watch of producer rank %u of model '%s': %s "
			  "(WEX_CLIENT_NO_WATCH opens without one)", c->rank, c->model,
			  strerror(-ret));
		open_remove(c);
		conn_drop(c);
		client_free(c);
		return ret;
	}
	*out = c;
	return 0;
}

/* Gives the same-address regions flagged in done (NULL: all) their own
 * memory back, holding what they showed: whole only if a lease kept the
 * producer out until the copy was done, which a held lease does once wexd
 * answers on its connection again (restore_unconfirmed); with none held,
 * the weights are dirty at once.  Returns how many showed the producer. */
static int unmap_regions(struct wex_client *c, const char *done)
{
	int shown = 0;

	for (size_t i = 0; i < c->nregions; i++) {
		struct region *g = &c->regions[i];

		if (done && !done[i])
			continue;
		g->mapped = NULL;
		if (!g->r.fixed)
			continue;
		shown++;
		/* Lost bytes (-WEX_EDIRTY), a region left showing the
		 * producer's memory, or bytes it may have been writing:
		 * either way its weights are not ours. */
		if (g->r.ops->unmap_fixed(&g->r) < 0 || !c->has_lease) {
			c->dirty = 1;
			c->copied = 0;
		} else {
			c->restore_unconfirmed = 1;
		}
	}
	return shown;
}

/* unmap_regions for a same-address sync that failed: the regions that
 * showed the producer hold the version this sync acquired, while those it
 * had not swapped yet, and weights outside regions, may hold an older one.
 * Possibly two versions, called one: dirty (as wex_sync says). */
static void regions_undo(struct wex_client *c, const char *done)
{
	if (unmap_regions(c, done)) {
		c->dirty = 1;
		c->copied = 0;
	}
}

/* Releases a segment this client lists (a fork's handler closes the
 * listed fds in the child): its fd is closed under the state lock, so a
 * child never closes that number again after another thread reused it. */
static void seg_release(struct wex_client *c, struct wex_mem_seg *seg)
{
	state_lock(c);
	close_fd(&seg->fd);
	state_unlock(c);
	seg->ops->release(seg);
}

static void consumer_unmap_all(struct wex_client *c)
{
	struct pseg *p = c->psegs;

	unmap_regions(c, NULL);
	for (size_t i = 0; i < c->npsegs; i++)
		if (c->psegs[i].seg.ops)
			seg_release(c, &c->psegs[i].seg);
	/* A fork's handler reads the array (its fds): never a freed one. */
	state_lock(c);
	c->psegs = NULL;
	c->npsegs = 0;
	state_unlock(c);
	free(p);
}

/*
 * A lease a closing client could not end because no wexd answered (between
 * a crash and the restart, RestartSec=): a wexd started later reads it
 * from its lease journal and, this process still living, would hold the
 * producer off until it exits, for memory it no longer maps.  A thread of
 * its own says the hello that ends it as soon as a wexd answers (every
 * 20 ms, backing off to 1 s, for up to OWED_HELLO_MS), with every signal
 * blocked; the client itself is gone by then.
 */
#define OWED_HELLO_MS 600000u

struct owed_hello {
	char sock[256];
	char *msg;
	size_t len;
};

/* 1 once wexd answered the hello itself (not a refusal of the connection
 * before it: shutting down, max_clients, out of fds). */
static int owed_answered(int ret)
{
	return !daemon_gone(ret) && ret != -EBUSY && ret != -EMFILE && ret != -ETIMEDOUT &&
	       ret != -EAGAIN;
}

static void *owed_main(void *arg)
{
	struct owed_hello *o = arg;
	uint64_t end = wex__now_ns() + OWED_HELLO_MS * 1000000ull;
	useconds_t wait = 20000;

	for (;;) {
		int fd = wex_sock_new(), ret = -ECONNREFUSED;

		if (fd >= 0 && wex_sock_connect_fd(fd, o->sock, 1000) == 0 &&
		    wex_sock_send(fd, o->msg, o->len, NULL, 0, 0) == (ssize_t)o->len) {
			struct pollfd pfd = { .fd = fd, .events = POLLIN };
			char buf[4096];
			ssize_t n;

			if (poll(&pfd, 1, 1000) > 0 && (n = recv(fd, buf, sizeof(buf), 0)) > 0) {
				json_t *reply = json_loadb(buf, (size_t)n, 0, NULL);
				const char *code = "EUNKNOWN";

				if (json_is_true(json_object_get(reply, "ok")))
					ret = 0;
				else if (!json_unpack(reply, "{s:{s:s}}", "error", "code", &code))
					ret = wex__errcode(code);
				json_decref(reply);
			}
		}
		if (fd >= 0)
			close(fd);
		if (owed_answered(ret) || wex__now_ns() >= end)
			break;
		usleep(wait);
		wait = wait * 2 > 1000000 ? 1000000 : wait * 2;
	}
	free(o->msg);
	free(o);
	return NULL;
}

static void owed_hello_later(struct wex_client *c)
{
	struct owed_hello *o = calloc(1, sizeof(*o));
	json_t *req = hello_req(c); /* (names no lease: c->lease_lost is 0 by now) */
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t th;
	int ret = -1;

	if (req)
		json_object_set_new(req, "v", json_integer(WEX_PROTO_VERSION));
	if (o && req) {
		snprintf(o->sock, sizeof(o->sock), "%s", c->sock);
		o->msg = wex__json_dump(req, &o->len);
	}
	json_decref(req);
	if (o && o->msg && pthread_attr_init(&attr) == 0) {
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		ret = pthread_create(&th, &attr, owed_main, o);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&attr);
	}
	if (ret != 0) {
		wex_warn("client", "rank %u of group '%s' of model '%s': cannot end its lease at a wexd that is down: a wexd started later holds the producer off until this process exits",
			 c->rank, c->group, c->model);
		if (o)
			free(o->msg);
		free(o);
	}
}

static void client_close(wex_client_t *c)
{
	if (!c)
		return;
	if (!c->forked)
		watch_stop(c); /* (a forked copy has no thread to stop) */
	if (c->forked) {
		open_remove(c);
		client_free(c);
		return;
	}
	/* A lease this connection cannot give back (wexd restarted, or is
	 * down) may be held for this process by a wexd that read it from its
	 * lease journal: said hello to once the memory is unmapped, below. */
	/* (So may one a release already reported as not given back, for want
	 * of a wexd: lease_owed.) */
	int owed = c->role == WEX_ROLE_CONSUMER &&
		   (c->lease_lost || c->lease_owed || (c->has_lease && c->fd < 0));

	/* So may its take of its group's open round (written down with no
	 * lease held, registry.c note_wanted) when the wexd it took it from
	 * is gone: nothing else ends that before this process exits. */
	if (c->role == WEX_ROLE_CONSUMER && !owed && c->took && c->world > 1) {
		struct pollfd pfd = { .fd = c->fd, .events = POLLRDHUP };

		owed = c->fd < 0 || (poll(&pfd, 1, 0) > 0 &&
				     (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)));
	}

	if (c->has_lease && c->fd >= 0) {
		json_t *req = json_pack("{s:s}", "op", "release"), *reply = NULL;

		/* The last sync is reported with this release, as with any
		 * request (rpc): there is no later one. */
		if (req && c->report) {
			json_object_set_new(req, "report", c->report);
			c->report = NULL;
		}
		/* The engine's kernels may still read what the lease shows. */
		wex_mem_settle();
		/* One that finds wexd gone leaves it to a hello; one that times
		 * out drops the connection, which ends the lease there, unless
		 * that wexd is killed before it reads the hang-up (systemd's
		 * watchdog) and started again: then the next holds it from its
		 * journal.  A hung wexd would not answer a hello either: said
		 * later, on a thread of its own (2). */
		if (raw_rpc(c, req, NULL, 0, &reply, NULL, 0, NULL, 1000) < 0)
			owed = c->fd >= 0 ? 1 : 2;
		json_decref(reply);
		json_decref(req);
	}
	conn_drop(c);
	/* Regions go without getting their contents back (unreserve unmaps
	 * whatever they show): a copy of weights about to be freed would
	 * only cost GPU memory, which may not be there. */
	for (size_t i = 0; i < c->nregions; i++) {
		c->regions[i].r.ops->unreserve(&c->regions[i].r);
		c->regions[i].mapped = NULL;
	}
	c->nregions = 0;
	consumer_unmap_all(c);
	if (owed) {
		/* A hello that names no lease ends it there (at most one
		 * bounded round trip; no wexd, nothing held). */
		int reclaimed, ret = -ECONNREFUSED;

		c->lease_lost = 0;
		c->has_lease = 0;
		c->timeout_ms = 1000;
		state_lock(c); /* a fork copies this fd only with c->fd naming it */
		c->fd = owed == 1 ? wex_sock_new() : -1;
		if (c->fd < 0)
			c->fd = -1;
		state_unlock(c);
		if (c->fd >= 0 && (ret = wex_sock_connect_fd(c->fd, c->sock, 1000)) == 0)
			ret = hello(c, &reclaimed, NULL);
		conn_drop(c);
		/* No wexd answered (down between a crash and its restart):
		 * said once one does. */
		if (!owed_answered(ret))
			owed_hello_later(c);
	}
	for (size_t i = 0; i < c->nosegs; i++)
		seg_release(c, &c->osegs[i].seg);
	/* Off fork()'s list only now that its fds are closed: a child that
	 * another thread forked meanwhile closed its copies, so wexd saw the
	 * connection end here (a copy would hold the rank for the child). */
	open_remove(c);
	client_free(c);
}

WEX_API void wex_client_close(wex_client_t *c)
{
	struct wex_mem_thread_state ts;

	wex_mem_thread_save(&ts);
	client_close(c);
	wex_mem_thread_restore(&ts);
}

/* ---------------------------------------------------------------------- */
/* Producer.                                                               */

static const char *kind_str(int k)
{
	return k == WEX_MEM_HOST ? "host" : k == WEX_MEM_CUDA_VMM ? "cuda_vmm" : "cuda_ipc";
}

static int register_seg(struct wex_client *c, struct own_seg *o)
{
	char hex[2 * WEX_HANDLE_MAX + 1];
	json_t *req, *reply = NULL;
	int ret;

	for (uint32_t b = 0; b < o->seg.desc.handle_len; b++)
		sprintf(hex + 2 * b, "%02x", o->seg.desc.handle[b]);
	hex[2 * o->seg.desc.handle_len] = '\0';
	req = json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:I}", "op", "register_segment", "kind",
			kind_str(o->seg.desc.kind), "size", (json_int_t)o->seg.desc.size, "device",
			o->seg.desc.device, "handle", hex, "handle_offset",
			(json_int_t)o->seg.desc.handle_offset, "alloc_size",
			(json_int_t)o->seg.desc.alloc_size);
	if (o->part)
		json_object_set_new(req, "part", json_true());
	if (o->nparts) {
		json_t *pa = json_array();

		/* Ids as this daemon numbered the parts (they precede us). */
		for (size_t i = 0; i < o->nparts; i++)
			json_array_append_new(pa, json_integer(c->osegs[o->parts[i]].id));
		json_object_set_new(req, "parts", pa);
	}
	if (o->reexport && o->seg.fd < 0) {
		int nfd = -1;

		/* Stored under the fork lock (a child closes it), made
		 * outside it: no driver call under a lock fork() takes.  A
		 * fork in between leaves the child this one fd (close-on-exec;
		 * it keeps the allocation alive until the child exits). */
		ret = o->seg.ops->export_fd(&o->seg, &nfd);
		state_lock(c);
		o->seg.fd = nfd;
		state_unlock(c);
		if (ret < 0) {
			json_decref(req);
			return set_err(c, ret, "%s: exporting a segment of %llu bytes again for the new wexd: %s",
				       o->seg.ops->name, (unsigned long long)o->seg.desc.size,
				       wex_strerror(ret));
		}
	}
	/* Host shared memory goes to wexd opened again read-only, here,
	 * where the producer may open its own file: every consumer gets
	 * wexd's copy.  wexd does the same, but under wexd.service's
	 * capabilities root may not open another user's 0600 /dev/shm file,
	 * and passed the producer's writable fd on.  (Only shared memory, as
	 * wexd: an open of a FUSE file asks its server.) */
	int sfd = o->seg.fd, rofd = -1;

	if (sfd >= 0 && o->seg.desc.kind == WEX_MEM_HOST && (rofd = wex_sock_fd_readonly(sfd)) >= 0)
		sfd = rofd;
	ret = rpc(c, req, sfd >= 0 ? &sfd : NULL, sfd >= 0 ? 1 : 0, &reply, NULL, 0, NULL,
		  c->timeout_ms);
	if (rofd >= 0)
		close(rofd);
	if (ret < 0)
		return ret; /* the fd stays: released with the segment (a failed
			     * add by its caller), or sent again at a retry */
	/* A wrapped segment's fd is only a way to share it, and wexd holds
	 * its own copy now. */
	if (o->seg.fd >= 0 && !o->seg.owner && o->seg.ops->export_fd) {
		state_lock(c);
		close_fd(&o->seg.fd);
		state_unlock(c);
		o->reexport = 1;
	}
	o->id = (uint32_t)json_integer_value(json_object_get(reply, "segment"));
	json_decref(reply);
	return 0;
}

static int signal_ended(struct wex_client *c, int ret);
static int regions_leave(struct wex_client *c, int ret, int held);

/*
 * Around a registration call of its own (wex_segment_alloc and
 * wex_segment_register_*, wex_register_tensors, wex_attach): wex_cancel
 * and signals (WEX_CLIENT_EINTR) end its wait for the watch's lock at
 * once, and give a wexd that does not answer its request HUNG_GRACE_MS
 * (raw_rpc: reg_call); a reconnect before a request is made as one inside
 * wex_begin_write (rpc sets call_end: the client's timeout from then).
 */
#define REGISTERING(c, ret, expr)                                              \
	do {                                                                   \
		atomic_store(&(c)->cancel_local, 1);                           \
		cancelable_begin(c);                                           \
		(c)->signalled = 0;                                            \
		(ret) = call_enter(c);                                         \
		if ((ret) == 0) {                                              \
			(c)->reg_call = 1;                                     \
			(ret) = signal_ended((c), (expr));                     \
			(c)->reg_call = 0;                                     \
			if ((c)->watch)                                        \
				pthread_mutex_unlock(&(c)->watch->call);       \
		}                                                              \
		cancelable_end(c);                                             \
		atomic_store(&(c)->cancel_local, 0);                           \
	} while (0)

/* Both: a registration that may reach a GPU backend (the calling thread
 * keeps its device binding, as KEEP_THREAD_DEVICE). */
#define REGISTERING_KEEP_DEVICE(c, ret, expr)                                  \
	do {                                                                   \
		struct wex_mem_thread_state kts_;                              \
									       \
		wex_mem_thread_save(&kts_);                                    \
		REGISTERING(c, ret, expr);                                     \
		wex_mem_thread_restore(&kts_);                                 \
	} while (0)

/* Registers seg and keeps it.  A part (part != 0) or a chained segment
 * (parts: indices of its parts in osegs, taken over on success). */
static int add_seg_ex(struct wex_client *c, struct wex_mem_seg *seg, int part, size_t *parts,
		      size_t nparts, uint32_t *id)
{
	struct own_seg *n;
	int ret;

	/* A fork's handler walks the array (its fds), under the state lock:
	 * never a freed one, and a segment counted only once it is whole. */
	state_lock(c);
	n = realloc(c->osegs, (c->nosegs + 1) * sizeof(*n));
	if (n)
		c->osegs = n;
	state_unlock(c);
	if (!n)
		return -ENOMEM;
	memset(&n[c->nosegs], 0, sizeof(n[0]));
	n[c->nosegs].seg = *seg;
	n[c->nosegs].part = part;
	n[c->nosegs].parts = parts;
	n[c->nosegs].nparts = nparts;
	ret = register_seg(c, &n[c->nosegs]);
	if (ret < 0)
		return ret;
	*id = n[c->nosegs].id;
	state_lock(c);
	c->nosegs++;
	state_unlock(c);
	return 0;
}

static int add_seg(struct wex_client *c, struct wex_mem_seg *seg, uint32_t *id)
{
	return add_seg_ex(c, seg, 0, NULL, 0, id);
}

/*
 * A range over several VMM allocations (PyTorch expandable segments): each
 * allocation is wrapped and registered as a part, then one chained segment
 * lists them; a consumer maps the parts back to back, so the range keeps
 * its layout.  Parts registered before a failure stay with the client
 * (unused; released at close).
 */
static int register_chained(struct wex_client *c, const struct wex_mem_ops *ops, void *ptr,
			    uint64_t size, uint32_t *id)
{
	struct wex_mem_seg *parts = NULL, whole;
	size_t n = 0, first = c->nosegs, *idx = NULL, i;
	uint64_t total = 0;
	uint32_t pid;
	int ret;

	ret = ops->wrap_chunks(ptr, size, NULL, 0, &n);
	if (ret < 0 && ret != -ENOSPC)
		return set_err(c, ret, "%s: cannot enumerate the allocations under %llu bytes: %s",
			       ops->name, (unsigned long long)size, wex_strerror(ret));
	parts = calloc(n ? n : 1, sizeof(*parts));
	idx = calloc(n ? n : 1, sizeof(*idx));
	if (!parts || !idx) {
		ret = -ENOMEM;
		goto out;
	}
	ret = ops->wrap_chunks(ptr, size, parts, n, &n);
	if (ret < 0) {
		set_err(c, ret, "%s: cannot export the %zu allocations under %llu bytes: %s%s",
			ops->name, n, (unsigned long long)size, wex_strerror(ret),
			ret == -EOPNOTSUPP ? " (memory not created exportable)" : "");
		goto out;
	}
	for (i = 0; i < n; i++) {
		total += parts[i].desc.alloc_size;
		ret = add_seg_ex(c, &parts[i], 1, NULL, 0, &pid);
		if (ret < 0) {
			while (i < n)
				ops->release(&parts[i++]);
			goto out;
		}
		idx[i] = first + i;
	}
	memset(&whole, 0, sizeof(whole));
	whole.ops = ops;
	whole.desc = parts[0].desc;
	whole.desc.size = size;
	whole.desc.alloc_size = total;
	whole.desc.handle_len = 0; /* a fabric handle names one allocation */
	whole.ptr = ptr;
	whole.fd = -1; /* the parts own every fd and handle */
	ret = add_seg_ex(c, &whole, 0, idx, n, id);
	if (ret == 0)
		idx = NULL;
out:
	/* Given up with the connection (a hung wexd, a timeout): wexd
	 * forgot the parts too, and none is the caller's: released, so that
	 * no reconnect registers them again and the call made again numbers
	 * its segments as this one would have.  (With the connection up,
	 * wexd keeps them, and so must the client, to number alike.) */
	if (ret < 0 && c->fd < 0)
		while (c->nosegs > first) {
			state_lock(c); /* (off a fork's list before its fds close) */
			c->nosegs--;
			state_unlock(c);
			seg_release(c, &c->osegs[c->nosegs].seg);
			free(c->osegs[c->nosegs].parts);
		}
	free(parts);
	free(idx);
	return ret;
}

/* The backend of `kind`, usable here, or an error saying what is missing. */
static int backend_ready(struct wex_client *c, int kind, const struct wex_mem_ops **out)
{
	const struct wex_mem_ops *ops = wex_mem_backend(kind);
	char why[256] = "";
	int ret;

	if (!ops)
		return set_err(c, kind == WEX_SEG_CUDA_VMM || kind == WEX_SEG_CUDA_IPC ? -WEX_ENOCUDA : -EINVAL,
			       "segment kind %d: %s", kind,
			       kind == WEX_SEG_CUDA_VMM || kind == WEX_SEG_CUDA_IPC ?
				       "this build has no CUDA backend (cuda.h was not found at build time)" :
				       "unknown kind");
	ret = ops->probe(why, sizeof(why));
	if (ret < 0)
		return set_err(c, ret, "%s backend unavailable: %s", ops->name, why);
	*out = ops;
	return 0;
}

static int segment_alloc(wex_client_t *c, int kind, int device, uint64_t size, uint32_t *id,
			 void **ptr)
{
	const struct wex_mem_ops *ops;
	struct wex_mem_seg seg;
	uint32_t sid;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers allocate segments");
	if (kind == WEX_SEG_HOST_PINNED) {
		/* Pinning needs the driver: ask the CUDA backend first. */
		const struct wex_mem_ops *cu = wex_mem_backend(WEX_MEM_CUDA_VMM);
		char why[256] = "";

		if (!cu)
			return set_err(c, -WEX_ENOCUDA, "WEX_SEG_HOST_PINNED: this build has no CUDA "
				       "backend (cuda.h was not found at build time) to pin host memory");
		ret = cu->probe(why, sizeof(why));
		if (ret < 0)
			return set_err(c, ret, "WEX_SEG_HOST_PINNED needs the CUDA driver to pin host "
				       "memory: %s", why);
	}
	ret = backend_ready(c, kind == WEX_SEG_HOST_PINNED ? WEX_SEG_HOST : kind, &ops);
	if (ret < 0)
		return ret;
	ret = ops->alloc(size, device, &seg);
	if (ret < 0)
		return set_err(c, ret, "%s: allocating %llu bytes: %s", ops->name,
			       (unsigned long long)size, wex_strerror(ret));
	if (kind == WEX_SEG_HOST_PINNED) {
		ret = wex_mem_host_pin(&seg, device);
		if (ret < 0) {
			ops->release(&seg);
			return set_err(c, ret, "pinning a host segment of %llu bytes for device %d: %s",
				       (unsigned long long)size, device, wex_strerror(ret));
		}
	}
	ret = add_seg(c, &seg, &sid);
	if (ret < 0) {
		ops->release(&seg);
		return ret;
	}
	*id = sid;
	*ptr = seg.ptr;
	return 0;
}

WEX_API int wex_segment_alloc(wex_client_t *c, int kind, int device, uint64_t size, uint32_t *id,
			      void **ptr)
{
	int ret;

	CALL_OK(c, id && ptr);
	REGISTERING_KEEP_DEVICE(c, ret, segment_alloc(c, kind, device, size, id, ptr));
	return ret;
}

static int segment_register_fd(wex_client_t *c, int fd, void *ptr, uint64_t size, uint32_t *id)
{
	struct wex_mem_seg seg;
	uint32_t sid;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers register segments");
	/* Consumers map it read-only through wexd's duplicate (same access
	 * mode): one write-only (or O_PATH) would fail every consumer's
	 * fetch of all this rank's segments, long after this call. */
	ret = fd >= 0 ? fcntl(fd, F_GETFL) : 0;
	if (ret >= 0 && fd >= 0 && ((ret & O_ACCMODE) == O_WRONLY || (ret & O_PATH)))
		return set_err(c, -EBADF, "cannot use fd %d: it is open %s, and consumers map it "
			       "for reading (open it O_RDWR or O_RDONLY)", fd,
			       (ret & O_PATH) ? "as O_PATH" : "write-only");
	ret = wex_mem_host_ops.wrap(ptr, size, fd, &seg);
	if (ret < 0) {
		struct stat st;

		/* (-EINVAL says nothing of which.) */
		if (fd < 0 || !size || fstat(fd, &st) < 0 || (uint64_t)st.st_size >= size)
			return set_err(c, ret, "cannot use fd %d for %llu bytes: %s", fd,
				       (unsigned long long)size,
				       fd < 0 ? "not a file descriptor" : !size ? "size 0" :
				       wex_strerror(ret));
		return set_err(c, ret, "cannot use fd %d for %llu bytes: its file holds only %llu "
			       "(a pipe, a socket or a directory holds none)", fd,
			       (unsigned long long)size, (unsigned long long)st.st_size);
	}
	ret = add_seg(c, &seg, &sid);
	if (ret < 0) {
		wex_mem_host_ops.release(&seg);
		return ret;
	}
	*id = sid;
	return 0;
}

WEX_API int wex_segment_register_fd(wex_client_t *c, int fd, void *ptr, uint64_t size, uint32_t *id)
{
	int ret;

	CALL_OK(c, id);
	REGISTERING(c, ret, segment_register_fd(c, fd, ptr, size, id));
	return ret;
}

static int segment_register_ptr(wex_client_t *c, int kind, void *ptr, uint64_t size, uint32_t *id)
{
	const struct wex_mem_ops *ops;
	struct wex_mem_seg seg;
	uint32_t sid;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers register segments");
	if (kind != WEX_SEG_CUDA_VMM && kind != WEX_SEG_CUDA_IPC)
		return set_err(c, -EINVAL, "register_ptr: kind %d is not a CUDA kind (host memory: "
			       "wex_segment_register_fd)", kind);
	if (!ptr || !size || size > UINTPTR_MAX - (uintptr_t)ptr)
		return set_err(c, -EINVAL, "register_ptr: %llu bytes at %p: %s",
			       (unsigned long long)size, ptr,
			       !ptr ? "a NULL address" : !size ? "an empty range" :
				      "the range runs past the end of the address space");
	ret = backend_ready(c, kind, &ops);
	if (ret < 0)
		return ret;
	ret = ops->wrap(ptr, size, -1, &seg);
	if (ret == -E2BIG && ops->wrap_chunks != wex_mem_enotsup_wrap_chunks)
		return register_chained(c, ops, ptr, size, id);
	if (ret < 0)
		return set_err(c, ret, "%s: cannot export %llu bytes: %s%s", ops->name,
			       (unsigned long long)size, wex_strerror(ret),
			       ret == -E2BIG ? " (the range runs past its allocation: register each allocation's range)" :
			       ret == -EOPNOTSUPP ? " (memory not created exportable)" : "");
	ret = add_seg(c, &seg, &sid);
	if (ret < 0) {
		ops->release(&seg);
		return ret;
	}
	*id = sid;
	return 0;
}

WEX_API int wex_segment_register_ptr(wex_client_t *c, int kind, void *ptr, uint64_t size,
				     uint32_t *id)
{
	int ret;

	CALL_OK(c, id);
	REGISTERING_KEEP_DEVICE(c, ret, segment_register_ptr(c, kind, ptr, size, id));
	return ret;
}

/* Whether addr lies in one of the client's reserved regions. */
static int in_regions(const struct wex_client *c, uint64_t addr)
{
	for (size_t j = 0; j < c->nregions; j++) {
		uint64_t a = (uint64_t)(uintptr_t)c->regions[j].r.addr;

		if (addr >= a && addr < a + c->regions[j].r.size)
			return 1;
	}
	return 0;
}

struct addr_index {
	uint64_t p;
	size_t i;
};

static int addr_index_cmp(const void *a, const void *b)
{
	const struct addr_index *x = a, *y = b;

	return x->p < y->p ? -1 : x->p > y->p ? 1 : (x->i > y->i) - (x->i < y->i);
}

/* The indexes of t[0..n) in the order of their addresses (malloc'ed;
 * NULL when out of memory): check_mapped walks them so, and asks the
 * driver about each GPU mapping once (two queries) however the layout
 * orders its tensors (host memory: a few queries a tensor at attach, none
 * at a sync); attach_disjoint finds overlapping tensors so. */
static size_t *address_order(const struct wex_tensor *t, size_t n)
{
	struct addr_index *a = calloc(n ? n : 1, sizeof(*a));
	size_t *order = calloc(n ? n : 1, sizeof(*order));

	if (!a || !order) {
		free(a);
		free(order);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		a[i].p = (uint64_t)(uintptr_t)t[i].ptr;
		a[i].i = i;
	}
	qsort(a, n, sizeof(*a), addr_index_cmp);
	for (size_t i = 0; i < n; i++)
		order[i] = a[i].i;
	free(a);
	return order;
}

/*
 * Refuses a layout with a tensor where the engine released its GPU memory
 * and kept the addresses (vLLM's sleep mode, SGLang's
 * release_memory_occupation): a copy or a comparison there would fault,
 * on the GPU (a sticky error: the process's CUDA context is lost) or on
 * the CPU.  The engine hooks refuse that first; this covers every
 * engine.  Tensors in the client's own regions are wex's to map.  At
 * attach, `host` (n bytes) gets 1 for each tensor whose memory the
 * driver did not know (host memory): a sync skips those (see c->layout_host).
 * The tensors are taken in `order` (address order: the released tensor at
 * the lowest address is the one named; see address_order).
 */
static int check_mapped(struct wex_client *c, const struct wex_tensor *t, size_t n,
			const size_t *order, const char *what, uint8_t *host)
{
	struct wex_mem_thread_state ts;
	struct wex_mem_span known = { 0 };
	uint64_t span, at;
	int ret = 0;

	wex_mem_thread_save(&ts);
	for (size_t k = 0; k < n && !ret; k++) {
		size_t i = order[k];
		uint64_t p = (uint64_t)(uintptr_t)t[i].ptr;

		if (!p || in_regions(c, p) || (!host && c->layout_host && c->layout_host[i]) ||
		    wex__tensor_span(&t[i], &span) < 0)
			continue;
		if (wex_mem_ptr_released(p, span, &at, &known) == 1)
			ret = set_err(c, -EFAULT, "%s: tensor '%s' (%llu bytes at 0x%llx): nothing is mapped at 0x%llx, which the CUDA driver knows as a reserved range: the engine released this memory and kept its addresses (vLLM's sleep mode, SGLang's release_memory_occupation); wake its weights first; nothing was %s",
				      what, t[i].name, (unsigned long long)span,
				      (unsigned long long)p, (unsigned long long)at,
				      host ? "attached" : strcmp(what, "verify") ? "acquired or copied" :
				      "compared");
		else if (host && known.asked > 0 && known.unknown &&
			 !(p >= known.lo && p + span <= known.hi))
			host[i] = 1;
	}
	wex_mem_thread_restore(&ts);
	return ret;
}

/* `held`: for a reconnect's re-send of the layout, the version its
 * buffers hold (0: none, or new buffers). */
static int send_table(struct wex_client *c, const char *op, const struct wex_tensor *t, size_t n,
		      uint64_t held)
{
	json_t *req;
	int fd, ret;

	fd = wex__table_pack(t, NULL, n);
	if (fd < 0)
		return set_err(c, fd, "cannot pack tensor table: %s", strerror(-fd));
	req = json_pack("{s:s}", "op", op);
	if (req && held)
		json_object_set_new(req, "held", json_integer((json_int_t)held));
	if (req && !strcmp(op, "attach")) {
		/* The GPU the layout lives on: wexd plans its copies from
		 * producer memory on that GPU wherever it holds them.  The
		 * queries may bind a context: the thread gets its own back
		 * (this runs on reconnects inside any call too). */
		struct wex_mem_thread_state ts;
		char uuid[48];

		wex_mem_thread_save(&ts);
		for (size_t i = 0; i < n; i++) {
			int d = wex_mem_ptr_on_gpu((uint64_t)(uintptr_t)t[i].ptr);

			if (d >= 0) {
				if (wex_mem_device_uuid(d, uuid, sizeof(uuid)) == 0)
					json_object_set_new(req, "device", json_string(uuid));
				break;
			}
		}
		wex_mem_thread_restore(&ts);
	}
	ret = rpc(c, req, &fd, 1, NULL, NULL, 0, NULL, c->timeout_ms);
	close(fd);
	return ret;
}

static int send_tensors(struct wex_client *c)
{
	return send_table(c, "register_tensors", c->ptensors, c->nptensors, 0);
}

/* Checks every tensor (and, for a consumer's layout, that it has a ptr)
 * and returns a malloc'd copy the client keeps. */
static int copy_tensors(struct wex_client *c, const struct wex_tensor *t, size_t n, int need_ptr,
			struct wex_tensor **out)
{
	struct wex_tensor *copy;
	char err[256];
	int ret;

	for (size_t i = 0; i < n; i++) {
		if ((ret = wex__tensor_check(&t[i], err, sizeof(err))) < 0)
			return set_err(c, ret, "%s: %s (tensor %zu of the %zu)",
				       need_ptr ? "attach" : "register_tensors", err, i, n);
		if (need_ptr && !t[i].ptr)
			return set_err(c, -EINVAL, "attach: tensor '%s' has no ptr", t[i].name);
		/* A consumer's elements are written: two at one address would
		 * each take the other's bytes (a producer's are only read). */
		if (need_ptr && (ret = wex__tensor_overlaps(&t[i], err, sizeof(err))) < 0)
			return set_err(c, ret, "attach: %s: a copy cannot give each its bytes", err);
	}
	copy = malloc((n ? n : 1) * sizeof(*copy));
	if (!copy)
		return -ENOMEM;
	if (n) /* t may be NULL for an empty table */
		memcpy(copy, t, n * sizeof(*t));
	if (!need_ptr)
		for (size_t i = 0; i < n; i++)
			copy[i].ptr = NULL;
	*out = copy;
	return 0;
}

static int register_tensors(wex_client_t *c, const struct wex_tensor *t, size_t n)
{
	struct wex_tensor *copy;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers register tensors");
	ret = copy_tensors(c, t, n, 0, &copy);
	if (ret < 0)
		return ret;
	/* Kept only once wexd accepted it: a reconnect re-sends what the
	 * client keeps, and a refused table must not lock it out. */
	ret = send_table(c, "register_tensors", copy, n, 0);
	if (ret < 0) {
		free(copy);
		return ret;
	}
	/* Other tensors change what the version published means (wexd
	 * forgets it too). */
	if (n != c->nptensors || (n && memcmp(copy, c->ptensors, n * sizeof(*copy))))
		c->published = 0;
	free(c->ptensors);
	c->ptensors = copy;
	c->nptensors = n;
	return 0;
}

WEX_API int wex_register_tensors(wex_client_t *c, const struct wex_tensor *t, size_t n)
{
	int ret;

	CALL_OK(c, t || !n);
	REGISTERING(c, ret, register_tensors(c, t, n));
	return ret;
}

/* Sleeps ms, or less when wex_cancel asks to cancel the running call, or
 * (WEX_CLIENT_EINTR) a signal's handler runs, as it ends a wait for wexd
 * (wait_answer): returns 1 then. */
static int cancel_nap(struct wex_client *c, unsigned ms)
{
	uint64_t end = wex__now_ns() + (uint64_t)ms * 1000000ull, now, tick, left;
	struct pollfd pfd = { .fd = c->cancel_efd, .events = POLLIN };
	sigset_t mask, wait;
	struct timespec ts;
	int ret;

	if (c->eintr)
		signals_held(&mask, &wait);
	while (!cancel_asked(c) && (now = wex__now_ns()) < end) {
		left = end - now;
		ts.tv_sec = (time_t)(left / 1000000000ull);
		ts.tv_nsec = (long)(left % 1000000000ull);
		ret = ppoll(&pfd, 1, &ts, c->eintr ? &wait : NULL);
		if (ret > 0)
			(void)!read(c->cancel_efd, &tick, sizeof(tick)); /* (an earlier call's too) */
		else if (ret < 0 && errno == EINTR && c->eintr) {
			c->signalled = 1;
			cancel_mark(&c->cancel_seq, atomic_load(&c->call_seq));
		}
	}
	if (c->eintr)
		pthread_sigmask(SIG_SETMASK, &mask, NULL);
	return cancel_asked(c);
}

/*
 * A call that waits (begin_write, sync) found no wexd (daemon_gone: a
 * restart, whose next daemon may not listen yet, or a crash): waits a
 * little (*nap_ms, 20 ms doubling to 1 s; 0 the first time) before it is
 * tried again, up to `end` (the call's timeout).  Returns 0 to try again;
 * else the error to return: ret, saying how long it was tried, or
 * -ECANCELED when wex_cancel, or a signal (WEX_CLIENT_EINTR), asked
 * meanwhile.
 */
static int away_retry(struct wex_client *c, int ret, const char *what, uint64_t end,
		      unsigned *nap_ms)
{
	unsigned nap = *nap_ms ? *nap_ms : 20;
	uint64_t now = wex__now_ns();

	if (cancel_asked(c)) {
		/* (Asked during the try itself: a signal held through its
		 * reconnect, or a wex_cancel between its waits.) */
		char why[sizeof(c->err)];

		memcpy(why, c->err, sizeof(why));
		return c->signalled ? set_err(c, -ECANCELED, "%s: wexd was away (%s)", what, why) :
				      set_err(c, -ECANCELED, "%s cancelled (wex_cancel) while wexd was away (%s)",
					      what, why);
	}
	if (now >= end) {
		char why[sizeof(c->err)];

		memcpy(why, c->err, sizeof(why));
		return *nap_ms ? set_err(c, ret, "%s (%s tried again until its timeout)", why, what) : ret;
	}
	if (!*nap_ms)
		wex_warn("client", "%s: %s: trying again for up to %llu ms", what, err_buf(c),
			 (unsigned long long)((end - now) / 1000000ull));
	*nap_ms = nap >= 500 ? 1000 : nap * 2;
	if (nap * 1000000ull > end - now) /* (the last try comes at the timeout) */
		nap = (unsigned)((end - now + 999999) / 1000000);
	if (cancel_nap(c, nap))
		return c->signalled ? set_err(c, -ECANCELED, "%s: wexd was away", what) :
				      set_err(c, -ECANCELED, "%s cancelled (wex_cancel) while wexd was away", what);
	return 0;
}

/* Refuses writing or publishing a version over wrapped memory its owner
 * freed and allocated again at the same address (or left unmapped): wex
 * still holds the memory it wrapped, which engines would go on reading
 * while the trainer writes the new memory. */
static int own_segs_same(wex_client_t *c, const char *op, uint64_t version)
{
	for (size_t i = 0; i < c->nosegs; i++) {
		const struct own_seg *o = &c->osegs[i];
		int ret;

		/* Ranges of one allocation registered in a row (register_module,
		 * legacy IPC) share the backend's record of it: asked once. */
		if (i && o->seg.priv && o->seg.priv == c->osegs[i - 1].seg.priv &&
		    o->seg.ops == c->osegs[i - 1].seg.ops)
			continue;
		if (!o->seg.ops || !o->seg.ops->same || (ret = o->seg.ops->same(&o->seg)) == 0)
			continue;
		if (ret != -ESTALE)
			return set_err(c, ret, "%s v%llu: checking the %s memory registered at 0x%llx: %s",
				       op, (unsigned long long)version, o->seg.ops->name,
				       (unsigned long long)(uintptr_t)o->seg.ptr, wex_strerror(ret));
		return set_err(c, ret, "%s v%llu: the %s memory registered at 0x%llx (%llu bytes) is not there any more: it was freed and other memory allocated at its address, or none (parameter offload, torch.cuda.empty_cache()); engines would go on reading the old memory, %s: register the parameters again (a new TrainerRank) once they are back",
			       op, (unsigned long long)version, o->seg.ops->name,
			       (unsigned long long)(uintptr_t)o->seg.ptr,
			       (unsigned long long)o->seg.desc.size,
			       o->seg.ops->kind == WEX_MEM_CUDA_IPC ?
				       "which their legacy IPC handle names (freed memory: undefined)" :
				       "which wex holds");
	}
	return 0;
}

static int begin_write(wex_client_t *c, uint64_t version, uint32_t timeout_ms)
{
	unsigned nap_ms = 0;
	uint32_t limit;
	uint64_t end;
	json_t *req;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers write");
	if (version > INT64_MAX) /* JSON integers are signed 64-bit */
		return set_err(c, -EINVAL, "begin_write: version %llu is over 2^63-1, the largest wexd takes",
			       (unsigned long long)version);
	if (cancel_asked(c))
		return set_err(c, -ECANCELED, "begin_write v%llu cancelled (wex_cancel) before it was sent to wexd",
			       (unsigned long long)version);
	if (version && (version == c->pub_found || version == c->published) && version != c->writing)
		return found_err(c, version);
	if ((ret = own_segs_same(c, "begin_write", version)) < 0)
		return ret;
	limit = timeout_ms ? timeout_ms : c->timeout_ms;
	end = wex__now_ns() + (uint64_t)limit * 1000000ull;
	for (;;) {
		req = json_pack("{s:s, s:I}", "op", "begin_write", "version", (json_int_t)version);
		c->call_end = end;
		ret = rpc(c, req, NULL, 0, NULL, NULL, 0, NULL, wait_of(c, timeout_ms, req));
		c->call_end = 0;
		/* wexd went (a restart: its drain ended, or a crash) and the
		 * one reconnect found none answering yet: the next may be
		 * starting.  Tried again within the call's time, as a
		 * trainer's step must not fail for a planned restart. */
		if (!daemon_gone(ret) || (ret = away_retry(c, ret, "begin_write", end, &nap_ms)) < 0)
			break;
		if (timeout_ms) { /* (what is left of it, for wexd's wait) */
			uint64_t now = wex__now_ns();

			timeout_ms = now >= end ? 1 : (uint32_t)((end - now) / 1000000ull) ?: 1;
		}
	}
	if (ret == 0) {
		c->writing = version;
		c->write_lost_v = 0;
		c->pub_found = 0;
		c->published = 0; /* the memory is being overwritten */
	}
	return ret;
}

/* A call whose wait a signal ended (WEX_CLIENT_EINTR): -EINTR. */
static int signal_ended(struct wex_client *c, int ret)
{
	char why[sizeof(c->err)];

	/* (Not when wex_cancel asked too: that cancel is reported.) */
	if (!c->signalled || ret != -ECANCELED ||
	    atomic_load(&c->asked_seq) == atomic_load(&c->call_seq))
		return ret;
	memcpy(why, c->err, sizeof(why));
	return set_err(c, -EINTR, "interrupted by a signal (WEX_CLIENT_EINTR): %s", why);
}

static int begin_write_call(wex_client_t *c, uint64_t version, uint32_t timeout_ms)
{
	int ret;

	c->cancel_wait = 1;
	c->signalled = 0;
	c->pub_end = 0; /* (a publish interrupted before is not gone on with) */
	ret = signal_ended(c, begin_write(c, version, timeout_ms));
	c->cancel_wait = 0;
	return ret;
}

WEX_API int wex_begin_write(wex_client_t *c, uint64_t version, uint32_t timeout_ms)
{
	int ret;

	CALL_OK(c, 1);
	cancelable_begin(c);
	/* (The watch's lock: a wait wex_cancel and signals end.) */
	ret = call_enter(c);
	if (ret == 0) {
		ret = begin_write_call(c, version, timeout_ms);
		if (c->watch)
			pthread_mutex_unlock(&c->watch->call);
	}
	cancelable_end(c);
	return ret;
}

/* Waits for the GPU work that may still write a version about to be
 * published. */
static int publish_gpu_wait(wex_client_t *c, uint64_t version)
{
	int ret, host = 0;

	/* GPU writes may still be queued (PyTorch returns before kernels
	 * finish): the version becomes visible only once they completed, on
	 * every device holding a segment of ours. */
	for (size_t i = 0; i < c->nosegs; i++) {
		const struct own_seg *o = &c->osegs[i];
		size_t j;

		if (o->seg.desc.kind == WEX_MEM_HOST)
			host = 1;
		if (o->part || o->seg.desc.kind == WEX_MEM_HOST)
			continue;
		for (j = 0; j < i; j++)
			if (!c->osegs[j].part && !strcmp(c->osegs[j].seg.desc.device, o->seg.desc.device))
				break;
		if (j < i)
			continue; /* device already waited for */
		ret = o->seg.ops->sync_device(&o->seg);
		if (ret < 0)
			return set_err(c, ret, "publish v%llu: waiting for the GPU work on %s: %s",
				       (unsigned long long)version, o->seg.desc.device,
				       wex_strerror(ret));
	}
	/* Host segments filled from a GPU (host staging: the trainer's
	 * asynchronous device-to-host copies) are complete only once the
	 * process's GPU work is: a no-op where nobody loaded CUDA. */
	if (host && (ret = settle(c, "publish")) < 0)
		return ret;
	return 0;
}

/* cont: the end of an interrupted publish of version to go on with, 0 for
 * the client's timeout from now. */
static int publish(wex_client_t *c, uint64_t version, uint64_t cont)
{
	unsigned nap_ms = 0;
	uint64_t end;
	json_t *req;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return set_err(c, -EPERM, "only producers publish");
	/* A reconnect found it carried out (pub_found). */
	if (c->pub_found == version && c->published == version && c->writing != version && version) {
		c->pub_found = 0;
		return 0;
	}
	if (c->writing != version && c->write_lost_v == version && version)
		return set_err(c, -EINVAL, "publish v%llu: %s", (unsigned long long)version,
			       c->write_lost);
	if (c->writing != version && c->fd >= 0)
		return set_err(c, -EINVAL, "publish v%llu: begin_write it first",
			       (unsigned long long)version);
	/* (A signal meanwhile: gpu_wait.) */
	ret = gpu_wait(c, publish_gpu_wait, version);
	if (ret < 0)
		return ret;
	if ((ret = own_segs_same(c, "publish", version)) < 0)
		return ret;
	/* No wexd answering (a restart, the next one not listening yet):
	 * tried again within the client's timeout, as begin_write is. */
	end = cont ? cont : wex__now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
	c->pub_end_now = end;
	do {
		req = json_pack("{s:s, s:I}", "op", "publish", "version", (json_int_t)version);
		c->call_end = end;
		ret = simple_rpc(c, req, NULL);
		c->call_end = 0;
	} while (daemon_gone(ret) && (ret = away_retry(c, ret, "publish", end, &nap_ms)) == 0);
	if (ret == 0) {
		c->writing = 0;
		c->published = version;
		c->pub_found = 0;
	}
	return ret;
}

static int publish_call(wex_client_t *c, uint64_t version)
{
	/* Only the next call after -EINTR goes on with its time. */
	uint64_t cont = c->pub_end && c->pub_v == version ? c->pub_end : 0;
	int ret;

	c->signalled = 0;
	c->pub_end = 0;
	c->pub_end_now = 0;
	ret = signal_ended(c, publish(c, version, cont));
	if (ret == -EINTR && c->pub_end_now) {
		c->pub_v = version;
		c->pub_end = c->pub_end_now;
	}
	return ret;
}

WEX_API int wex_publish(wex_client_t *c, uint64_t version)
{
	int ret;

	CALL_OK(c, 1);
	/* wex_cancel and signals (WEX_CLIENT_EINTR) end its tries while no
	 * wexd answers (away_retry), as they do begin_write's. */
	atomic_store(&c->cancel_local, 1);
	cancelable_begin(c);
	ret = call_enter(c); /* (as wex_begin_write's) */
	if (ret == 0) {
		KEEP_THREAD_DEVICE(ret, publish_call(c, version));
		if (c->watch)
			pthread_mutex_unlock(&c->watch->call);
	}
	cancelable_end(c);
	atomic_store(&c->cancel_local, 0);
	return ret;
}

/* ---------------------------------------------------------------------- */
/* Consumer.                                                               */

/* A reconnect's re-send of the layout: the same buffers, which hold the
 * version its last sync got unless doubted (`doubt`: regions restored
 * under a lease the new wexd did not give back, or weights dirty).  Said
 * ("held", as an acquire says it), a new wexd's group round on that
 * version that passed this rank keeps passing it (registry.c
 * wexd_attach): before, any call after a restart (a status request, say)
 * re-sent the layout as new buffers, and the round waited for this rank,
 * idle with the version, holding the producer off until it synced again. */
static int send_layout(struct wex_client *c, int doubt)
{
	return send_table(c, "attach", c->layout, c->nlayout,
			  doubt || c->dirty || c->world < 2 ? 0 : c->took);
}

/* Whether a and b are the same elements at the same address (a tensor
 * under two names: tied weights, as reserve_like mirrors a producer's). */
static int same_view(const struct wex_tensor *a, const struct wex_tensor *b)
{
	if (a->ptr != b->ptr || a->dtype != b->dtype || a->ndim != b->ndim)
		return 0;
	for (uint32_t d = 0; d < a->ndim && d < WEX_MAX_DIMS; d++)
		if (a->shape[d] != b->shape[d] || a->start[d] != b->start[d] ||
		    a->extent[d] != b->extent[d] || a->strides[d] != b->strides[d])
			return 0;
	return 1;
}

/* Refuses two tensors of a layout whose bytes (first to last, strides
 * included) overlap, naming both: a copy would write one over the other
 * (a verify then fails whatever is synced), in the caller's memory or in
 * the client's regions alike.  `order` is the address order. */
static int attach_disjoint(struct wex_client *c, const struct wex_tensor *t, size_t n,
			   const size_t *order)
{
	uint64_t end = 0, span;
	size_t last = 0;
	int have = 0;

	for (size_t k = 0; k < n; k++) {
		size_t i = order[k];
		uint64_t p = (uint64_t)(uintptr_t)t[i].ptr;

		if (wex__tensor_span(&t[i], &span) < 0 || !span)
			continue; /* (checked already; empty: no bytes) */
		if (have && p < end && same_view(&t[i], &t[last]))
			continue; /* tied weights: one tensor under two names */
		if (have && p < end)
			return set_err(c, -EINVAL,
				       "attach: tensors '%s' (%llu bytes at 0x%llx) and '%s' (%llu bytes at 0x%llx) overlap in memory: a copy would write one over the other; nothing attached",
				       t[last].name, (unsigned long long)(end - (uint64_t)(uintptr_t)t[last].ptr),
				       (unsigned long long)(uintptr_t)t[last].ptr, t[i].name,
				       (unsigned long long)span, (unsigned long long)p);
		if (!have || p + span > end) {
			end = p + span;
			last = i;
			have = 1;
		}
	}
	return 0;
}

static int attach(wex_client_t *c, const struct wex_tensor *t, size_t n)
{
	struct wex_tensor *copy = NULL;
	uint8_t *host;
	size_t *order;
	int ret;

	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "only consumers attach");
	ret = copy_tensors(c, t, n, 1, &copy);
	if (ret < 0)
		return ret;
	host = calloc(n ? n : 1, 1);
	order = address_order(copy, n);
	if (!host || !order) {
		free(copy);
		free(host);
		free(order);
		return set_err(c, -ENOMEM, "attach: out of memory");
	}
	ret = attach_disjoint(c, copy, n, order);
	if (ret >= 0)
		ret = check_mapped(c, copy, n, order, "attach", host);
	if (ret >= 0) {
		int held = c->has_lease;

		ret = send_table(c, "attach", copy, n, 0);
		/* Given up (a hung wexd) or timed out, the connection went,
		 * and the lease held with it: same-address regions get
		 * private memory back (dirty); views may change under the
		 * reader. */
		if (ret < 0 && held && !c->has_lease) {
			char why[sizeof(c->err)];
			int fixed = 0;

			for (size_t i = 0; i < c->nregions; i++)
				fixed |= c->regions[i].r.fixed;
			memcpy(why, c->err, sizeof(why));
			if (fixed)
				regions_leave(c, ret, 1);
			set_err(c, ret, "%s; the lease on v%llu went with the connection: %s",
				why, (unsigned long long)c->lease_version,
				fixed ? "the same-address regions got private memory back holding what they showed, which the producer may have begun to overwrite (weights dirty, sync before serving)" :
					"what views show may change under the reader (sync again)");
		}
	}
	if (ret < 0) {
		free(copy);
		free(host);
		free(order);
		return ret;
	}
	free(c->layout);
	free(c->layout_host);
	free(c->layout_order);
	c->layout = copy;
	c->layout_host = host;
	c->layout_order = order;
	c->nlayout = n;
	c->layout_dev = -2;
	c->fetched = 0; /* the plan depends on the layout */
	c->copied = 0;  /* and new buffers hold nothing yet */
	return 0;
}

WEX_API int wex_attach(wex_client_t *c, const struct wex_tensor *t, size_t n)
{
	int ret;

	CALL_OK(c, t || !n);
	REGISTERING(c, ret, attach(c, t, n));
	return ret;
}

static void stash_clear(struct stash *s)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i].fd >= 0)
			close(s->v[i].fd);
	free(s->v);
	s->v = NULL;
	s->n = 0;
}

/* Maps a chained segment from the parts fetch kept: takes every part's fd. */
static int import_chained(struct wex_client *c, struct stash *sh, const struct wex_mem_ops *ops,
			  const struct wex_mem_desc *whole, uint32_t rank, json_t *parts,
			  struct wex_mem_seg *seg)
{
	size_t n = json_array_size(parts), i;
	struct wex_mem_desc *descs;
	int *fds, ret;
	json_t *v;

	descs = calloc(n ? n : 1, sizeof(*descs));
	fds = calloc(n ? n : 1, sizeof(*fds));
	if (!descs || !fds) {
		free(descs);
		free(fds);
		return -ENOMEM;
	}
	json_array_foreach(parts, i, v) {
		struct stashed *st = NULL;

		for (size_t k = 0; k < sh->n; k++)
			if (sh->v[k].rank == rank && sh->v[k].id == (uint32_t)json_integer_value(v) &&
			    sh->v[k].fd >= 0)
				st = &sh->v[k];
		if (!st) {
			for (size_t k = 0; k < i; k++)
				close(fds[k]);
			free(descs);
			free(fds);
			return set_err(c, -EBADMSG, "fetch: producer rank %u chains part %lld, not received",
				       rank, (long long)json_integer_value(v));
		}
		descs[i] = st->desc;
		fds[i] = st->fd;
		st->fd = -1;
	}
	ret = ops->import_chunks(descs, fds, n, access_device(c), seg);
	if (ret == 0)
		seg->desc.size = whole->size;
	free(descs);
	free(fds);
	return ret;
}

static int import_segments(struct wex_client *c, struct stash *sh, json_t *segs, int *fds,
			   int nfds)
{
	size_t i;
	json_t *js;

	json_array_foreach(segs, i, js) {
		const char *kind = "", *device = "", *handle = "";
		json_int_t rank, id, size, hoff = 0, asize = 0, fdi = -1;
		json_t *parts = json_object_get(js, "parts");
		struct wex_mem_desc desc;
		const struct wex_mem_ops *ops;
		struct pseg *n;
		int fd = -1, ret;

		if (json_unpack(js, "{s:I, s:I, s:s, s:I, s:s, s:s, s:I, s:I, s:I}", "rank", &rank,
				"id", &id, "kind", &kind, "size", &size, "device", &device, "handle",
				&handle, "handle_offset", &hoff, "alloc_size", &asize, "fd", &fdi) < 0)
			return set_err(c, -EBADMSG, "fetch: malformed segment entry");
		if (rank < 0 || rank >= c->nprod || id < 0 || id > UINT32_MAX || size <= 0)
			return set_err(c, -EBADMSG,
				       "fetch: malformed segment entry (producer rank %lld of %u, segment %lld, %lld bytes)",
				       (long long)rank, c->nprod, (long long)id, (long long)size);
		memset(&desc, 0, sizeof(desc));
		desc.kind = !strcmp(kind, "host") ? WEX_MEM_HOST :
			    !strcmp(kind, "cuda_vmm") ? WEX_MEM_CUDA_VMM : WEX_MEM_CUDA_IPC;
		desc.size = (uint64_t)size;
		desc.handle_offset = (uint64_t)hoff;
		desc.alloc_size = (uint64_t)asize;
		snprintf(desc.device, sizeof(desc.device), "%s", device);
		for (size_t b = 0; b + 1 < strlen(handle) && b / 2 < WEX_HANDLE_MAX; b += 2) {
			unsigned v;

			sscanf(handle + b, "%2x", &v);
			desc.handle[desc.handle_len++] = (unsigned char)v;
		}
		if (fdi >= 0) {
			if (fdi >= nfds)
				return set_err(c, -EBADMSG, "fetch: fd index out of range");
			fd = fds[fdi];
			fds[fdi] = -1;
		}
		if (json_is_true(json_object_get(js, "part"))) {
			/* Kept for the chained segment listing it. */
			struct stashed *st = realloc(sh->v, (sh->n + 1) * sizeof(*st));

			if (!st) {
				if (fd >= 0)
					close(fd);
				return -ENOMEM;
			}
			sh->v = st;
			sh->v[sh->n++] = (struct stashed){ .rank = (uint32_t)rank, .id = (uint32_t)id,
							   .desc = desc, .fd = fd };
			continue;
		}
		ops = wex_mem_backend(desc.kind);
		if (!ops) {
			if (fd >= 0)
				close(fd);
			return set_err(c, -WEX_ENOCUDA,
				       "producer rank %lld exports %s memory; this build has no CUDA backend",
				       (long long)rank, kind);
		}
		/* A fork's handler walks the array (its fds), under the state
		 * lock: never a freed one. */
		state_lock(c);
		n = realloc(c->psegs, (c->npsegs + 1) * sizeof(*n));
		if (n)
			c->psegs = n;
		state_unlock(c);
		if (!n) {
			if (fd >= 0)
				close(fd);
			return -ENOMEM;
		}
		memset(&n[c->npsegs], 0, sizeof(n[0]));
		n[c->npsegs].rank = (uint32_t)rank;
		n[c->npsegs].id = (uint32_t)id;
		if (parts) {
			if (fd >= 0)
				close(fd);
			ret = import_chained(c, sh, ops, &desc, (uint32_t)rank, parts,
					     &n[c->npsegs].seg);
		} else {
			ret = ops->import(&desc, fd, access_device(c), &n[c->npsegs].seg);
		}
		if (ret < 0)
			return set_err(c, ret, "importing %s segment %lld of producer rank %lld%s: %s",
				       kind, (long long)id, (long long)rank,
				       parts ? " (chained allocations)" : "", wex_strerror(ret));
		/* A fork's child closes its fd from here on (one forked since
		 * the fd came in, before this, keeps a copy until it execs). */
		state_lock(c);
		c->npsegs++;
		state_unlock(c);
	}
	return 0;
}

/* Pages after the first tell whether the producers' layout moved since
 * the first (a rank registered another segment: wexd numbers segments
 * across ranks, so later pages would repeat or shift entries), and the
 * connection whether they come from the same wexd.  Otherwise the fetch
 * starts over; this many times at most. */
#define FETCH_RESTARTS 8

static int fetched_check(struct wex_client *c);

static int fetch(struct wex_client *c)
{
	struct stash sh = { 0 };
	json_int_t start = 0;
	uint64_t conn = 0;
	int ret, restarts = 0;

restart:
	consumer_unmap_all(c);
	/* Until this fetch completes, nothing fetched earlier holds: a failed
	 * fetch is retried by the next sync. */
	c->fetched = 0;
	free(c->plan);
	c->plan = NULL;
	c->nplan = 0;
	do {
		int fds[WEX_SOCK_MAX_FDS], nfds = 0;
		json_int_t tfd = -1, pfd = -1, world = 0, gen = 0, more = -1;
		json_t *req, *reply = NULL;
		char err[256];

		req = json_pack("{s:s, s:I}", "op", "fetch", "start", start);
		ret = rpc(c, req, NULL, 0, &reply, fds, WEX_SOCK_MAX_FDS, &nfds, c->timeout_ms);
		if (ret < 0) {
			stash_clear(&sh);
			return ret;
		}
		json_unpack(reply, "{s:I, s:I, s:I, s:I, s?I}", "tables_fd", &tfd, "plan_fd", &pfd,
			    "world", &world, "layout_gen", &gen, "more", &more);
		/* Pages of one layout from one daemon only: a restarted wexd
		 * may number the same layout generation otherwise (producers
		 * that re-registered in another order). */
		if (start > 0 && ((uint64_t)gen != c->layout_gen || c->conn_gen != conn)) {
			const char *why = c->conn_gen != conn ? "wexd restarted" :
								"the producers' segments changed";

			wex_sock_close_fds(fds, nfds);
			json_decref(reply);
			stash_clear(&sh);
			if (++restarts > FETCH_RESTARTS)
				return set_err(c, -EAGAIN,
					       "fetch: %s during each of %d fetches (layout %llu, then %llu): sync again once that stops",
					       why, restarts, (unsigned long long)c->layout_gen,
					       (unsigned long long)gen);
			wex_debug("client", "fetch: %s between pages (layout %llu, then %llu): fetching again",
				  why, (unsigned long long)c->layout_gen, (unsigned long long)gen);
			start = 0;
			goto restart;
		}
		if (start == 0) {
			conn = c->conn_gen;
			c->layout_gen = (uint64_t)gen;
			c->nprod = 0;
			free(c->tables);
			free(c->table_ranks);
			c->tables = NULL;
			c->table_ranks = NULL;
			c->ntables = 0;
			/* wexd's reply is checked as any input: indices name
			 * fds of this message, the world is one wexd accepts,
			 * and a layout attached gets its plan (without one a
			 * copy sync would copy nothing and call it done). */
			snprintf(err, sizeof(err), "malformed reply (tables_fd %lld, plan_fd %lld of %d fds, world %lld%s)",
				 (long long)tfd, (long long)pfd, nfds, (long long)world,
				 c->nlayout && pfd < 0 ? ", no plan for the attached layout" : "");
			ret = tfd < 0 || tfd >= nfds || pfd >= nfds || pfd == tfd ||
					      (pfd < 0 && c->nlayout) || world < 1 || world > WEX_WORLD_MAX ?
				      -EBADMSG :
				      wex__table_unpack(fds[tfd], &c->tables, &c->table_ranks,
							&c->ntables, err, sizeof(err));
			if (ret == 0 && pfd >= 0)
				ret = wex__plan_unpack(fds[pfd], &c->plan, &c->nplan, err, sizeof(err));
			if (ret < 0) {
				set_err(c, ret, "fetch: %s", err);
				goto chunk_out;
			}
			c->nprod = (uint32_t)world;
			close_fd(&fds[tfd]);
			if (pfd >= 0)
				close_fd(&fds[pfd]);
		}
		ret = import_segments(c, &sh, json_object_get(reply, "segments"), fds, nfds);
chunk_out:
		wex_sock_close_fds(fds, nfds);
		json_decref(reply);
		if (ret < 0) {
			stash_clear(&sh);
			return ret;
		}
		/* A next page that is not past this one would be asked for
		 * again and again, each time importing its segments anew. */
		if (more >= 0 && more <= start) {
			stash_clear(&sh);
			return set_err(c, -EBADMSG,
				       "fetch: malformed reply (the page at %lld says the next starts at %lld)",
				       (long long)start, (long long)more);
		}
		start = more;
	} while (start >= 0);
	stash_clear(&sh); /* parts no segment chained: nothing names them */
	free(c->rank_first);
	c->rank_first = calloc((size_t)c->nprod + 1, sizeof(size_t));
	if (!c->rank_first)
		return -ENOMEM;
	for (size_t i = 0; i < c->ntables; i++)
		if (c->table_ranks[i] < c->nprod)
			c->rank_first[c->table_ranks[i] + 1]++;
	for (uint32_t r = 0; r < c->nprod; r++)
		c->rank_first[r + 1] += c->rank_first[r];
	ret = fetched_check(c);
	if (ret < 0)
		return ret;
	c->fetched = 1;
	return 0;
}

static struct pseg *find_pseg(struct wex_client *c, uint32_t rank, uint32_t id)
{
	for (size_t i = 0; i < c->npsegs; i++)
		if (c->psegs[i].rank == rank && c->psegs[i].id == id)
			return &c->psegs[i];
	return NULL;
}

/* Whether the bytes one side of a plan op touches, from `off` on, stay
 * within [0, size): len bytes per row, rows nouter levels deep. */
static int op_side_ok(uint64_t off, uint64_t len, uint32_t nouter, const uint64_t *count,
		      const int64_t *stride, uint64_t size)
{
	uint64_t below = 0, above = 0, end;

	for (uint32_t k = 0; k < nouter; k++)
		if (count[k] == 0)
			return 1; /* no row: nothing touched */
	for (uint32_t k = 0; k < nouter; k++) {
		uint64_t step = stride[k] < 0 ? -(uint64_t)stride[k] : (uint64_t)stride[k], d;

		if (__builtin_mul_overflow(count[k] - 1, step, &d) ||
		    __builtin_add_overflow(stride[k] < 0 ? below : above, d,
					   stride[k] < 0 ? &below : &above))
			return 0;
	}
	return below <= off && !__builtin_add_overflow(off, above, &end) &&
	       !__builtin_add_overflow(end, len, &end) && end <= size;
}

/*
 * What wexd sent, checked before anything is copied or handed out: every
 * tensor of the tables lies in its segment, and every plan op reads
 * within its producer segment and writes within the attached tensor it
 * names.  wexd is trusted with the weights, not with this process's
 * memory: a reply it got wrong must fail the sync, not scribble on the
 * engine's heap or GPU.
 */
static int fetched_check(struct wex_client *c)
{
	for (size_t i = 0; i < c->ntables; i++) {
		const struct wex_tensor *t = &c->tables[i];
		struct pseg *s;
		uint64_t span;

		if (c->table_ranks[i] >= c->nprod)
			return set_err(c, -EBADMSG, "fetch: tensor '%s' names producer rank %u, of %u",
				       t->name, c->table_ranks[i], c->nprod);
		/* Each rank's entries are one slice of the table (rank_first):
		 * out of order, a rank's slice would hold another's tensors,
		 * checked against that other rank's segments. */
		if (i > 0 && c->table_ranks[i] < c->table_ranks[i - 1])
			return set_err(c, -EBADMSG,
				       "fetch: malformed reply (tensor '%s' of producer rank %u follows one of rank %u: the table is not in rank order)",
				       t->name, c->table_ranks[i], c->table_ranks[i - 1]);
		s = find_pseg(c, c->table_ranks[i], t->segment);
		if (s && (wex__tensor_span(t, &span) < 0 || t->offset > s->seg.desc.size ||
			  span > s->seg.desc.size - t->offset))
			return set_err(c, -EBADMSG,
				       "fetch: tensor '%s' of producer rank %u lies past the end of its segment %u (offset %llu, %llu bytes)",
				       t->name, c->table_ranks[i], t->segment,
				       (unsigned long long)t->offset,
				       (unsigned long long)s->seg.desc.size);
	}
	for (size_t i = 0; i < c->nplan; i++) {
		const struct wex_plan_op *p = &c->plan[i];
		struct pseg *s = find_pseg(c, p->src_rank, p->src_seg);
		uint64_t span;

		if (!s || p->dst_piece >= c->nlayout || p->nouter > 3)
			return set_err(c, -EBADMSG, "fetch: plan op %zu names a missing segment or tensor", i);
		if (wex__tensor_span(&c->layout[p->dst_piece], &span) < 0 ||
		    !op_side_ok(p->src_off, p->len, p->nouter, p->count, p->src_stride,
				s->seg.desc.size) ||
		    !op_side_ok(p->dst_off, p->len, p->nouter, p->count, p->dst_stride, span))
			return set_err(c, -EBADMSG,
				       "fetch: plan op %zu reaches past segment %u of producer rank %u or past tensor '%s'",
				       i, p->src_seg, p->src_rank, c->layout[p->dst_piece].name);
	}
	return 0;
}

/* An acquire failed after wexd dropped the lease held before it (a
 * timeout, a lost connection; `held`), or with none held since an earlier
 * wex_release or a lost connection: the producer may write now, so no
 * same-address region may go on showing its memory (as after any failed
 * sync).  Each gets private memory back holding what it showed, which the
 * producer may already have been writing: the weights are dirty. */
static int regions_leave(struct wex_client *c, int ret, int held)
{
	char why[sizeof(c->err)];
	int shown = 0;

	for (size_t i = 0; i < c->nregions; i++)
		shown |= c->regions[i].r.fixed;
	if (!shown)
		return ret;
	memcpy(why, c->err, sizeof(why));
	unmap_regions(c, NULL);
	c->dirty = 1;
	c->copied = 0;
	if (!held)
		return set_err(c, ret,
			       "%.200s; no lease held what the same-address regions showed (released, or lost with wexd's connection), so they got private memory back holding it, which the producer may have begun to overwrite: weights dirty, sync before serving",
			       why);
	return set_err(c, ret,
		       "%.200s; the lease on v%llu went with it, so the same-address regions got private memory back holding what they showed, which the producer may have begun to overwrite: weights dirty, sync before serving",
		       why, (unsigned long long)c->lease_version);
}

/* The lease a reconnect took with the old wexd, reported once (by the
 * release that would have ended it): the producer may have written while
 * this rank read its memory; the new daemon would only say "no lease". */
static int lease_lost_err(struct wex_client *c)
{
	char why[256];

	c->lease_lost = 0;
	/* No wexd to give it back to: one started later reads the lease
	 * from its journal, and ends it on this client's next call. */
	if (c->fd < 0) {
		c->lease_owed = 1;
		/* (A release call starts with no message: the reason is then
		 * only that no wexd answers.) */
		if (c->err[0])
			snprintf(why, sizeof(why), "%.200s", c->err);
		else
			snprintf(why, sizeof(why), "no wexd answers at %.200s", c->sock);
		return set_err(c, -WEX_EDAEMON,
			       "release: the lease on v%llu could not be given back (%s): a wexd started later keeps the producer waiting until this client's next call or its close, or its exit",
			       (unsigned long long)c->lease_version, why);
	}
	return set_err(c, -WEX_EDAEMON,
		       "release: the lease on v%llu was lost with wexd's connection (wexd restarted without it, or stopped answering) before this release: the producer may have written while this rank read its memory",
		       (unsigned long long)c->lease_version);
}

/* Gives the held lease back.  A remap lease first waits for the GPU work
 * that may read the producer's memory (`wait`); a copy lease has nothing
 * left to wait for (the executor waited for its copies).  The lease is
 * given back even when that wait fails (a GPU fault ends the work too).
 * `failed`: the sync under the lease failed (wexd is told so). */
static int release_lease(struct wex_client *c, int wait, int failed)
{
	json_t *req;
	int ret, wret = 0;

	if (!c->has_lease)
		return 0;
	if (wait)
		wret = settle(c, "release");
	req = json_pack("{s:s, s:I}", "op", "release", "version", (json_int_t)c->lease_version);
	/* The sync under this lease failed: wexd then does not count this
	 * rank as holding the version (older wexds ignore the key). */
	if (req && failed)
		json_object_set_new(req, "failed", json_true());
	if (wret < 0) {
		char why[sizeof(c->err)];

		memcpy(why, c->err, sizeof(why));
		simple_rpc(c, req, NULL);
		memcpy(c->err, why, sizeof(why));
		ret = wret;
	} else {
		ret = simple_rpc(c, req, NULL);
	}
	c->has_lease = 0;
	/* Not answered (a hung wexd), the connection dropped: that wexd ends
	 * the lease once it reads the hang-up, but one killed first (systemd's
	 * watchdog) and started again holds it from its journal until a hello
	 * names none. */
	if (ret < 0 && c->fd < 0)
		c->lease_owed = 1;
	/* The connection was lost during this release (the new daemon said
	 * "no lease"). */
	if (c->lease_lost && wret == 0)
		ret = lease_lost_err(c);
	c->lease_lost = 0;
	return ret;
}

/*
 * Host staging, consumer side: page-locks each host segment the plan reads
 * (read-only, once per import; the host backend unpins it when it unmaps)
 * so that the host-to-device copies run by DMA at link speed instead of
 * through the driver's pageable bounce buffers.  WEX_HOST_PIN says what
 * happens to a segment that cannot be pinned: unset or 1, the sync fails
 * naming why, before anything is copied (no unexpected slow path); try,
 * it is copied from pageable memory (a warning once per import); 0,
 * nothing is pinned.  A sync that copies from pageable memory reports the
 * fallback to wexd (pageable_staging: wexctl status, metrics).  0, or a
 * negative errno with c's error set.
 */
static int pin_host_sources(struct wex_client *c, int dev)
{
	static int told;
	int pin = -1; /* 1: required; 2: tried; 0: never; -1: not read yet */

	for (size_t i = 0; i < c->nplan; i++) {
		struct pseg *s = find_pseg(c, c->plan[i].src_rank, c->plan[i].src_seg);
		int ret;

		if (!s || s->seg.ops->kind != WEX_MEM_HOST || s->seg.pinned)
			continue;
		/* Read where it matters: a plan with no host segment to pin
		 * never fails on it. */
		if (pin < 0) {
			const char *env = getenv("WEX_HOST_PIN");

			pin = 1;
			if (env && *env && strcmp(env, "1")) {
				if (!strcmp(env, "0"))
					pin = 0;
				else if (!strcmp(env, "try"))
					pin = 2;
				else
					return set_err(c, -EINVAL, "copy: WEX_HOST_PIN=%s: use 1 (page-lock host segments copied onto a GPU, or fail; the default), try (copy from pageable memory where that fails) or 0 (never page-lock); nothing was copied",
						       env);
			}
			if (!pin && !__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
				wex_info("client", "WEX_HOST_PIN=0: host segments are copied onto GPUs "
					 "from pageable memory");
		}
		if (!pin || (pin == 2 && s->pin_tried)) {
			c->sync_fb |= WEX_FB_PAGEABLE_STAGING;
			continue;
		}
		s->pin_tried = 1;
		ret = wex_mem_host_pin(&s->seg, dev);
		if (!ret)
			continue;
		if (pin == 1)
			return set_err(c, ret, "copy: host segment %u of producer rank %u (%llu bytes) could not be page-locked for device %d (%s; the log says why): copied from pageable memory it would move at a fraction of the link's speed; nothing was copied. WEX_HOST_PIN=try allows that (reported in wexctl status), WEX_HOST_PIN=0 never page-locks",
				       s->id, s->rank, (unsigned long long)s->seg.desc.size, dev,
				       wex_strerror(ret));
		wex_warn("client", "host segment %u of producer rank %u stays pageable "
			 "(WEX_HOST_PIN=try): pinning %llu bytes for device %d failed (%s, reason "
			 "above); its copies run slower",
			 s->id, s->rank, (unsigned long long)s->seg.desc.size, dev,
			 wex_strerror(ret));
		c->sync_fb |= WEX_FB_PAGEABLE_STAGING;
	}
	return 0;
}

/* The plan resolved into absolute copies (*out, c->nplan of them, free()),
 * the bytes they move and the executor that runs them: the CUDA one when
 * any producer segment or the layout is GPU memory (it takes device and
 * host addresses alike), else the host one; NULL for an empty plan. */
static int plan_ops(struct wex_client *c, struct wex_copy_op **out, uint64_t *bytes,
		    const struct wex_mem_ops **exec)
{
	struct wex_copy_op *ops;
	const struct wex_mem_ops *be = NULL;
	uint64_t total = 0;

	ops = malloc((c->nplan ? c->nplan : 1) * sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	for (size_t i = 0; i < c->nplan; i++) {
		const struct wex_plan_op *p = &c->plan[i];
		struct pseg *s = find_pseg(c, p->src_rank, p->src_seg);
		uint64_t rows = 1;

		if (!s || p->dst_piece >= c->nlayout || p->nouter > 3) {
			free(ops);
			return set_err(c, -EBADMSG, "plan op %zu names a missing segment or tensor", i);
		}
		/* Any CUDA kind's executor runs every copy of the plan: it
		 * takes device and host addresses alike. */
		if (!be || (be->kind == WEX_MEM_HOST && s->seg.ops->kind != WEX_MEM_HOST))
			be = s->seg.ops;
		ops[i].src = (uint64_t)(uintptr_t)s->seg.ptr + p->src_off;
		ops[i].dst = (uint64_t)(uintptr_t)c->layout[p->dst_piece].ptr + p->dst_off;
		ops[i].len = p->len;
		ops[i].nouter = p->nouter;
		for (int k = 0; k < 3; k++) {
			ops[i].count[k] = p->count[k];
			ops[i].src_stride[k] = p->src_stride[k];
			ops[i].dst_stride[k] = p->dst_stride[k];
			if ((uint32_t)k < p->nouter)
				rows *= p->count[k];
		}
		total += rows * p->len;
	}
	/* Host producer memory into GPU weights (host staging: the producer
	 * wrote a host segment, this engine's layout is on a GPU): the GPU
	 * executor, which takes host sources; memcpy cannot reach device
	 * memory. */
	if (be && be->kind == WEX_MEM_HOST && layout_device(c) >= 0) {
		const struct wex_mem_ops *g = wex_mem_backend(WEX_MEM_CUDA_VMM);

		if (!g) {
			free(ops);
			return set_err(c, -WEX_ENOCUDA, "copy: the layout is GPU memory but this build has no CUDA backend");
		}
		be = g;
	}
	*out = ops;
	*bytes = total;
	*exec = be;
	return 0;
}

/* ": <call>: <CUDA error>, copying tensor \"name\"" for the failed copy
 * where the backend says (wex__copy_fail), else "". */
static void copy_fail_text(const struct wex_client *c, char *buf, size_t len)
{
	const struct wex_copy_fail *f = &wex__copy_fail;
	long lo = f->op_lo, hi = f->op_hi;
	int n = 0;

	buf[0] = '\0';
	if (f->call[0])
		n = snprintf(buf, len, ": %s", f->call);
	if (n < 0 || (size_t)n >= len || lo < 0 || hi < lo || (size_t)hi >= c->nplan ||
	    c->plan[lo].dst_piece >= c->nlayout || c->plan[hi].dst_piece >= c->nlayout)
		return;
	if (lo == hi || c->plan[lo].dst_piece == c->plan[hi].dst_piece)
		snprintf(buf + n, len - (size_t)n, "%scopying tensor \"%s\" (plan op %ld)",
			 n ? ", " : ": ", c->layout[c->plan[lo].dst_piece].name, lo);
	else
		snprintf(buf + n, len - (size_t)n,
			 "%scopying tensors \"%s\" to \"%s\" (plan ops %ld to %ld, batched)",
			 n ? ", " : ": ", c->layout[c->plan[lo].dst_piece].name,
			 c->layout[c->plan[hi].dst_piece].name, lo, hi);
}

static int run_copy(struct wex_client *c, uint64_t *bytes)
{
	struct wex_copy_op *ops;
	const struct wex_mem_ops *be;
	uint64_t total;
	int ret = plan_ops(c, &ops, &total, &be);

	if (ret < 0)
		return ret;
	wex__copy_fail.call[0] = '\0'; /* (backend.h: cleared here only) */
	wex__copy_fail.op_lo = wex__copy_fail.op_hi = -1;
	ret = be ? be->copy(ops, c->nplan, c->threads) : 0;
	free(ops);
	if (ret == 0)
		*bytes = total;
	return ret;
}

/*
 * Verification (WEX_SYNC_VERIFY, or wexd's ask for `wexctl verify`): every
 * byte the plan covers in the attached layout is compared with the
 * producer's memory it comes from, while this sync's lease keeps the
 * producer out.  0 when equal (*bytes compared); -WEX_EVERIFY naming the
 * first difference (the weights are then dirty); or the error that kept
 * the comparison from finishing.  *rep (set in every case) is what wexd
 * is told.
 */
static int verify_plan(struct wex_client *c, uint64_t version, uint64_t *bytes, json_t **rep)
{
	struct wex_copy_op *ops;
	const struct wex_mem_ops *be;
	struct wex_verify_diff diff = { 0 };
	uint64_t total, t0 = wex__now_ns();
	int ret;

	*bytes = 0;
	/* wexd's ask (wexctl verify) comes with the acquire, after the
	 * sync's own check: the layout may have been released since. */
	ret = check_mapped(c, c->layout, c->nlayout, c->layout_order, "verify", NULL);
	if (ret < 0) {
		*rep = json_pack("{s:s, s:I, s:s}", "result", "failed", "version",
				 (json_int_t)version, "why", c->err);
		return ret;
	}
	ret = plan_ops(c, &ops, &total, &be);
	if (ret == 0) {
		ret = wex__verify_ops(ops, c->nplan, be && be->kind != WEX_MEM_HOST ? be : NULL,
				      c->threads, &diff);
		free(ops);
	}
	if (diff.unpinned)
		c->sync_fb |= WEX_FB_UNPINNED_VERIFY;
	if (ret < 0) {
		*rep = json_pack("{s:s, s:I, s:s}", "result", "failed", "version", (json_int_t)version,
				 "why", wex_strerror(ret));
		return set_err(c, ret, "verify of v%llu could not compare the weights: %s",
			       (unsigned long long)version, wex_strerror(ret));
	}
	*bytes = total;
	*rep = json_pack("{s:s, s:I, s:I, s:f}", "result", ret ? "differ" : "equal", "version",
			 (json_int_t)version, "bytes", (json_int_t)total, "seconds",
			 (double)(wex__now_ns() - t0) / 1e9);
	if (ret == 0)
		return 0;
	{
		const struct wex_plan_op *p = &c->plan[diff.op];
		const struct wex_tensor *t = &c->layout[p->dst_piece];
		uint64_t off = p->dst_off + diff.dst_off;

		json_object_set_new(*rep, "differ_bytes", json_integer((json_int_t)diff.bytes));
		json_object_set_new(*rep, "tensor", json_string(t->name));
		json_object_set_new(*rep, "offset", json_integer((json_int_t)off));
		c->dirty = 1;
		c->copied = 0;
		return set_err(c, -WEX_EVERIFY,
			       "verify of v%llu: %llu of %llu bytes differ from the producer's; the first in the plan's order is in '%s' (piece %u of this rank, %s) at byte %llu of its buffer, read from producer rank %u segment %u at byte %llu: weights are dirty; sync again",
			       (unsigned long long)version, (unsigned long long)diff.bytes,
			       (unsigned long long)total, t->name, p->dst_piece,
			       wex_dtype_name(t->dtype), (unsigned long long)off, p->src_rank,
			       p->src_seg, (unsigned long long)(p->src_off + diff.src_off));
	}
}

/* Whether a verification that ended in `ret` (< 0) lets the sync go on:
 * 1 when only wexd asked (wexctl verify) and the comparison could not run
 * (out of memory, say): the weights are whole as far as anything knows,
 * wexd hears that it failed and the log says why.  0 (fail the sync) for
 * a difference, a sticky CUDA error, or a caller that asked. */
static int verify_goes_on(struct wex_client *c, int ret, int asked)
{
	if (asked || ret == -WEX_EVERIFY || ret == -ENOTRECOVERABLE)
		return 0;
	wex_warn("client", "%s (wexctl verify asked; the sync goes on)", c->err);
	c->err[0] = 0;
	return 1;
}

/* wexd asked for a verification that this sync cannot make (a view, or a
 * same-address sync with no layout attached): it is told why. */
static json_t *verify_none(uint64_t version, const char *why)
{
	return json_pack("{s:s, s:I, s:s}", "result", "unverifiable", "version", (json_int_t)version,
			 "why", why);
}

/* Whether two descriptions put the same elements at the same places: the
 * first ndim dims only (what lies past them means nothing), strides as
 * they act (all 0 is C order; a dim of extent 1 is never stepped).  0 if
 * they do; else 1, with what differs (producer's value first) in `why`. */
static int box_differs(const struct wex_tensor *a, const struct wex_tensor *b, char *why,
		       size_t len)
{
	int64_t sa[WEX_MAX_DIMS], sb[WEX_MAX_DIMS];

	if (a->dtype != b->dtype || a->ndim != b->ndim) {
		snprintf(why, len, "dtype %s vs %s, ndim %u vs %u", wex_dtype_name(a->dtype),
			 wex_dtype_name(b->dtype), a->ndim, b->ndim);
		return 1;
	}
	wex__tensor_strides(a, sa);
	wex__tensor_strides(b, sb);
	for (uint32_t i = 0; i < a->ndim; i++) {
		if (a->start[i] != b->start[i] || a->extent[i] != b->extent[i]) {
			snprintf(why, len, "dim %u: box [%llu, +%llu) vs [%llu, +%llu)", i,
				 (unsigned long long)a->start[i], (unsigned long long)a->extent[i],
				 (unsigned long long)b->start[i], (unsigned long long)b->extent[i]);
			return 1;
		}
		if (a->extent[i] > 1 && sa[i] != sb[i]) {
			snprintf(why, len, "dim %u: stride %lld vs %lld elements", i,
				 (long long)sa[i], (long long)sb[i]);
			return 1;
		}
	}
	return 0;
}

/* Same-address remap needs the consumer's tensors to sit exactly where the
 * producer's do: name the first that does not. */
static int check_fixed_layout(struct wex_client *c, struct region *g)
{
	uint64_t base = (uint64_t)(uintptr_t)g->r.addr, span = 0;
	char why[128];

	for (size_t i = 0; i < c->nlayout; i++) {
		const struct wex_tensor *t = &c->layout[i];
		uint64_t p = (uint64_t)(uintptr_t)t->ptr;
		int found = 0;

		if (p < base || p >= base + g->r.size)
			continue;
		for (size_t j = c->rank_first[g->prank]; j < c->rank_first[g->prank + 1]; j++) {
			const struct wex_tensor *s = &c->tables[j];

			if (s->segment != g->segid || strcmp(s->name, t->name))
				continue;
			if (s->offset != p - base)
				return set_err(c, -WEX_ELAYOUT,
					       "remap: tensor '%s' is at offset %llu of the region, producer rank %u's at %llu",
					       t->name, (unsigned long long)(p - base), g->prank,
					       (unsigned long long)s->offset);
			if (box_differs(s, t, why, sizeof(why)))
				return set_err(c, -WEX_ELAYOUT,
					       "remap: tensor '%s' differs from producer rank %u's: %s",
					       t->name, g->prank, why);
			/* The region shows its bytes only up to its end: the
			 * rest would keep what it held (an older version). */
			if (wex__tensor_span(s, &span) < 0 || span > g->r.size - (p - base))
				return set_err(c, -WEX_ELAYOUT,
					       "remap: tensor '%s' (%llu bytes at offset %llu) runs past the end of its region of %llu bytes",
					       t->name, (unsigned long long)span,
					       (unsigned long long)(p - base),
					       (unsigned long long)g->r.size);
			found = 1;
			break;
		}
		if (!found)
			return set_err(c, -WEX_ELAYOUT,
				       "remap: tensor '%s' is not in producer rank %u's segment %u",
				       t->name, g->prank, g->segid);
	}
	return 0;
}

/* Whether every attached tensor starts in a same-address region (where
 * check_fixed_layout placed it whole: its end in the region too).  True
 * too with none attached: the regions are then all the weights there are. */
static int layout_in_regions(const struct wex_client *c)
{
	for (size_t i = 0; i < c->nlayout; i++)
		if (!in_regions(c, (uint64_t)(uintptr_t)c->layout[i].ptr))
			return 0;
	return 1;
}

/* Whether every reserved region can show its producer segment. */
static int map_regions_check(struct wex_client *c)
{
	int ret;

	for (size_t i = 0; i < c->nregions; i++) {
		struct region *g = &c->regions[i];
		struct pseg *s = find_pseg(c, g->prank, g->segid);

		if (!s)
			return set_err(c, -WEX_ELAYOUT, "remap: producer rank %u has no segment %u",
				       g->prank, g->segid);
		if (g->r.ops != s->seg.ops)
			return set_err(c, -WEX_ELAYOUT, "remap: region is %s memory, segment is %s",
				       g->r.ops->name, s->seg.ops->name);
		/* The region's start shows the segment's start (seg.ptr), which
		 * lies handle_offset bytes into its first allocation. */
		if (g->r.size > s->seg.desc.alloc_size - s->seg.desc.handle_offset)
			return set_err(c, -WEX_ELAYOUT,
				       "remap: region of %llu bytes exceeds producer segment of %llu",
				       (unsigned long long)g->r.size,
				       (unsigned long long)(s->seg.desc.alloc_size -
							    s->seg.desc.handle_offset));
		if (!(g->mapped == &s->seg && g->r.fixed) && (ret = check_fixed_layout(c, g)) < 0)
			return ret;
	}
	return 0;
}

/* Shows the producer's segments in every reserved region.  All regions
 * are checked before any is mapped; when a check fails, regions still
 * showing the producer from an earlier sync go back to private memory, and
 * a mapping that still fails undoes the ones this call made: a failed sync
 * leaves no region showing the producer without a lease. */
static int map_regions(struct wex_client *c, uint64_t *bytes)
{
	char *done;
	int ret;

	ret = map_regions_check(c);
	if (ret < 0) {
		char why[sizeof(c->err)];

		memcpy(why, c->err, sizeof(why));
		regions_undo(c, NULL);
		memcpy(c->err, why, sizeof(why));
		return ret;
	}
	done = calloc(c->nregions ? c->nregions : 1, 1);
	if (!done) {
		regions_undo(c, NULL);
		return set_err(c, -ENOMEM, "remap: out of memory");
	}
	for (size_t i = 0; i < c->nregions; i++) {
		struct region *g = &c->regions[i];
		struct pseg *s = find_pseg(c, g->prank, g->segid);

		*bytes += g->r.size;
		if (g->mapped == &s->seg && g->r.fixed) {
			/* Already showing it: a metadata-only sync.  Still
			 * undone with the others if a later region fails (the
			 * lease it is shown under is given back). */
			done[i] = 1;
			continue;
		}
		ret = g->r.ops->map_fixed(&g->r, &s->seg, s->seg.desc.handle_offset);
		if (ret < 0) {
			if (ret == -WEX_EDIRTY) {
				/* Back on its own memory, its bytes lost. */
				g->mapped = NULL;
				c->dirty = 1;
				c->copied = 0;
			}
			/* Still showing what it showed before (an older version
			 * of the producer's memory): undone with the others, and
			 * so are the regions after it that still show the
			 * producer (a failed restore left them so). */
			for (size_t j = i; j < c->nregions; j++)
				if (c->regions[j].r.fixed)
					done[j] = 1;
			regions_undo(c, done);
			free(done);
			return set_err(c, ret, "remap: map_fixed: %s%s", wex_strerror(ret),
				       ret == -EINVAL && g->r.lead != s->seg.desc.handle_offset ?
					       " (the region was reserved for a segment starting at another offset in its allocation: the producer registered it again; wex_reserve a new region)" :
				       ret == -WEX_EDIRTY && g->r.lost ? " (the region's own bytes were lost and no memory could be mapped there again: reads there fault until a copy sync maps fresh memory)" :
				       ret == -WEX_EDIRTY ? " (the region's own bytes were lost: copy-sync before serving from it)" : "");
		}
		g->mapped = &s->seg;
		done[i] = 1;
	}
	free(done);
	return 0;
}

/* Fetches the producers' segments, waiting up to the client's timeout for
 * every producer rank to register (a consumer may start first). */
static int fetch_wait(struct wex_client *c, const char *what)
{
	uint64_t t0 = wex__now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull;
	useconds_t nap = 2000;
	int ret;

	for (;;) {
		ret = fetch(c);
		if (ret == 0 || (ret != -EAGAIN && ret != -WEX_ENOPUBLISHED))
			return ret;
		if (wex__now_ns() - t0 >= limit) {
			char why[sizeof(c->err)];

			memcpy(why, c->err, sizeof(why));
			return set_err(c, -ETIMEDOUT, "%s: model '%s' has no registered producer after %u ms (%s)",
				       what, c->model, c->timeout_ms, why);
		}
		usleep(nap);
		if (nap < 100000)
			nap *= 2;
	}
}

static int reserve(wex_client_t *c, uint32_t prank, uint32_t segment, uint64_t size, void **ptr)
{
	const struct wex_mem_ops *ops;
	int ret, device = c->device;
	struct region *n;
	struct pseg *s;

	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "only consumers reserve");
	if (!size)
		return set_err(c, -EINVAL, "reserve: size 0");
	/* The region must be of the producer segment's kind, and by default
	 * on the producer's device (the colocated case): learn it first.  A
	 * held lease means the fetched tables are current (a sync fetched
	 * them), and a fetch would unmap what that lease shows. */
	if (!c->fetched && !c->has_lease && (ret = fetch_wait(c, "reserve")) < 0)
		return ret;
	if (!c->fetched)
		return set_err(c, -EAGAIN, "reserve: the producers' segments are not known yet (sync first)");
	if (prank >= c->nprod)
		return set_err(c, -EINVAL, "reserve: model '%s' has producer ranks 0..%u, not %u",
			       c->model, c->nprod - 1, prank);
	s = find_pseg(c, prank, segment);
	if (!s)
		return set_err(c, -EINVAL, "reserve: producer rank %u has no segment %u", prank,
			       segment);
	ops = s->seg.ops;
	if (device < 0 && (ret = wex_mem_device_of(&s->seg.desc, &device)) < 0)
		return set_err(c, ret, "reserve: producer rank %u's device %s is not visible here (set WEX_CLIENT_FIELD_DEVICE)",
			       prank, s->seg.desc.device);
	if (device < 0)
		device = 0;
	n = realloc(c->regions, (c->nregions + 1) * sizeof(*n));
	if (!n)
		return set_err(c, -ENOMEM, "reserve: out of memory");
	c->regions = n;
	memset(&n[c->nregions], 0, sizeof(n[0]));
	n[c->nregions].prank = prank;
	n[c->nregions].segid = segment;
	ret = ops->reserve(size, s->seg.desc.handle_offset, device, &n[c->nregions].r);
	if (ret < 0)
		return set_err(c, ret, "reserve %llu bytes of %s memory on device %d: %s",
			       (unsigned long long)size, ops->name, device, wex_strerror(ret));
	*ptr = n[c->nregions].r.addr;
	c->nregions++;
	return 0;
}

WEX_API int wex_reserve(wex_client_t *c, uint32_t prank, uint32_t segment, uint64_t size, void **ptr)
{
	int ret;

	CALL_OK(c, ptr);
	KEEP_THREAD_DEVICE(ret, reserve(c, prank, segment, size, ptr));
	return ret;
}

/* The report of the sync just finished, sent with the next request: its
 * mode, backend, bytes and time, and the fallbacks it ran on (the sync's
 * own, and any producer memory this client maps read-write because the
 * driver refused read-only). */
static void set_report(struct wex_client *c, const char *mode, uint64_t bytes, uint64_t t0)
{
	const char *backend = c->npsegs ? c->psegs[0].seg.ops->name : "host";
	unsigned fb = c->sync_fb;

	for (size_t i = 0; i < c->npsegs && !(fb & WEX_FB_RW_MAPPING); i++)
		if (c->psegs[i].seg.rw)
			fb |= WEX_FB_RW_MAPPING;
	for (size_t i = 0; i < c->nregions && !(fb & WEX_FB_RW_MAPPING); i++)
		if (c->regions[i].r.fixed && c->regions[i].r.rw)
			fb |= WEX_FB_RW_MAPPING;
	json_decref(c->report);
	c->report = json_pack("{s:s, s:s, s:I, s:f}", "mode", mode, "backend", backend, "bytes",
			      (json_int_t)bytes, "seconds", (double)(wex__now_ns() - t0) / 1e9);
	if (c->report && fb)
		json_object_set_new(c->report, "fallbacks", wex__fallbacks_json(fb));
}

/* Adds a verification's outcome (taken) to the report of the sync, with
 * the ticket of wexd's ask it answers (0: the caller asked). */
static void report_verify(struct wex_client *c, json_t *v)
{
	if (!v)
		return;
	json_object_set_new(v, "ticket", json_integer((json_int_t)c->verify_ask));
	if (c->report)
		json_object_set_new(c->report, "verify", v);
	else
		json_decref(v);
}

/* A sync acquiring again (after a restart, or wexd away) waits what is
 * left of its timeout_ms since t0 (the client's if it gave none), at
 * least a moment for a version already published; 0 with neither. */
static uint32_t wait_left(const struct wex_client *c, uint32_t timeout_ms, uint64_t t0)
{
	uint32_t limit = timeout_ms ? timeout_ms : c->timeout_set ? c->timeout_ms : 0;
	uint64_t spent = (wex__now_ns() - t0) / 1000000ull;

	return !limit ? 0 : spent + 1 >= limit ? 1 : (uint32_t)(limit - spent);
}

static int sync_settle(struct wex_client *c, uint64_t unused)
{
	(void)unused;
	return settle(c, "sync");
}

static int sync_(wex_client_t *c, int mode, uint64_t min_version, uint32_t timeout_ms,
		 struct wex_sync_result *res)
{
	uint64_t t0 = wex__now_ns(), bytes = 0, ops = 0, version, gen, conn, vbytes = 0, vt0 = 0,
		 vt1 = 0;
	json_t *req, *reply = NULL, *vrep = NULL;
	double waited;
	uint32_t wait, away_ms = timeout_ms ? timeout_ms : c->timeout_ms;
	unsigned nap_ms = 0;
	int ret, retried = 0, held, restored = 0, verify = !!(mode & WEX_SYNC_VERIFY), asked = mode;

	mode &= ~WEX_SYNC_VERIFY;
	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "only consumers sync");
	if (min_version > INT64_MAX) /* JSON integers are signed 64-bit */
		return set_err(c, -EINVAL, "sync: min_version %llu is over 2^63-1, the largest wexd takes",
			       (unsigned long long)min_version);
	if (verify && mode == WEX_SYNC_REMAP_VIEW)
		return set_err(c, -EINVAL, "verify: a view sync has no weights of its own to compare (wex_view reads the producer's memory): verify a copy or same-address sync");
	if (verify && mode == WEX_SYNC_REMAP_FIXED && !c->nlayout)
		return set_err(c, -EINVAL, "verify: a same-address sync is verified through the attached layout (the tensors in the regions): wex_attach it first");
	if (mode == WEX_SYNC_COPY && !c->nlayout)
		return set_err(c, -EINVAL, "copy sync: attach this rank's layout first (wex_attach)");
	if (mode == WEX_SYNC_REMAP_FIXED && !c->nregions)
		return set_err(c, -EINVAL, "same-address sync: reserve regions first (wex_reserve)");
	if (mode < WEX_SYNC_COPY || mode > WEX_SYNC_REMAP_FIXED)
		/* (The caller's mode, not what is left of it without
		 * WEX_SYNC_VERIFY: -1 is not "-257".) */
		return set_err(c, -EINVAL, "sync mode %d unknown (WEX_SYNC_COPY, WEX_SYNC_REMAP_VIEW or WEX_SYNC_REMAP_FIXED, optionally | WEX_SYNC_VERIFY)",
			       asked);
	c->sync_fb = 0;
	/* Before anything is acquired: memory the engine released, which a
	 * copy would write or a verification read (a same-address sync
	 * writes only the client's regions). */
	if ((mode == WEX_SYNC_COPY || verify) && c->nlayout &&
	    (ret = check_mapped(c, c->layout, c->nlayout, c->layout_order,
				mode == WEX_SYNC_COPY ? "copy sync" : "verified same-address sync",
				NULL)) < 0)
		return ret;
	/* The acquire ends the lease held now (wexd drops it), and a copy
	 * overwrites the weights in place: either way the engine's GPU work
	 * that may still read them must be done first. */
	/* (A lease lost with the connection may come back at a restarted
	 * wexd, which this acquire then ends: settle for it too.) */
	/* (A signal meanwhile ends the sync below: gpu_wait.) */
	if ((c->has_lease || c->lease_lost || mode == WEX_SYNC_COPY) &&
	    (ret = gpu_wait(c, sync_settle, 0)) < 0)
		return ret;
again:
	/* Nothing sent: a lease held stands.  (Not on an acquire again
	 * after a restart: it ends the lease the reconnect may have taken
	 * back, and wexd then ends its wait at the cancel.) */
	if (!retried && cancel_asked(c))
		return set_err(c, -ECANCELED, "sync %s before it acquired a version%s",
			       atomic_load(&c->asked_seq) == atomic_load(&c->call_seq) ?
				       "cancelled (wex_cancel)" : "ended",
			       c->has_lease ? ": the lease held before stands" : "");
	req = json_pack("{s:s, s:I, s:i}", "op", "acquire", "min_version", (json_int_t)min_version,
			"mode", mode);
	if (c->took)
		json_object_set_new(req, "held", json_integer((json_int_t)c->took));
	wait = wait_of(c, timeout_ms, req);
	/* wexd drops our previous lease once it takes this acquire on (and
	 * then answers it, times it out or ends its wait at shutdown); an
	 * acquire it refuses outright (shutting down, bad arguments) leaves
	 * the previous lease held, says so ("lease_kept"), and the caller may
	 * still use and release it. */
	held = c->has_lease;
	conn = c->conn_gen;
	c->has_lease = 0;
	c->lease_kept = 0;
	/* (Not on an acquire again after a restart during the fetch: that
	 * reconnect was made, and a cancel since is for wexd to answer.) */
	if (!retried)
		c->call_end = wex__now_ns() + (uint64_t)(timeout_ms ? timeout_ms : away_ms) * 1000000ull;
	ret = rpc(c, req, NULL, 0, &reply, NULL, 0, NULL, wait);
	c->call_end = 0;
	if (ret < 0) {
		/* wexd says whether it refused the acquire before taking it on
		 * (the previous lease stands) or dropped that lease first. */
		/* A reconnect inside rpc may have taken a lease back from a
		 * restarted wexd, which then stands only if wexd said so on
		 * that connection. */
		if (c->lease_kept && c->fd >= 0 && (held || c->conn_gen != conn)) {
			c->has_lease = 1;
		} else {
			c->has_lease = 0;
			ret = regions_leave(c, ret, held);
		}
		/* Acquiring again after a restart: what the first fetch gave
		 * regions back is mixed weights, whatever lease stands. */
		if (restored) {
			c->dirty = 1;
			c->copied = 0;
		}
		/* No wexd answers (a restart whose next daemon does not
		 * listen yet, a crash): acquired again within the caller's
		 * time, as the caller would sync again (nothing is held now).
		 * Not after ESHUTDOWN: a draining wexd's answer to a sync. */
		if (!c->has_lease && ret != -ESHUTDOWN && daemon_gone(ret) &&
		    (ret = away_retry(c, ret, "sync", t0 + (uint64_t)away_ms * 1000000ull, &nap_ms)) == 0) {
			timeout_ms = wait_left(c, timeout_ms, t0);
			goto again;
		}
		return ret;
	}
	version = (uint64_t)json_integer_value(json_object_get(reply, "version"));
	gen = (uint64_t)json_integer_value(json_object_get(reply, "layout_gen"));
	/* wexctl verify: wexd asks this rank to verify this sync. */
	c->verify_ask = (uint64_t)json_integer_value(json_object_get(reply, "verify"));
	waited = json_real_value(json_object_get(reply, "waited_ms")) / 1e3;
	json_decref(reply);
	c->has_lease = 1;
	c->lease_lost = 0;
	c->lease_version = version;
	/* A wexd restart after the acquire takes the lease with it (the new
	 * daemon knows none), and the producer may then write: every step
	 * below checks that the connection is still the one that got it. */
	conn = c->conn_gen;
	if (!c->fetched || gen != c->layout_gen) {
		/* The fetch gives regions that show the producer their own
		 * memory back, holding this version there (under its lease),
		 * while the weights outside them may hold an older one: if
		 * the sync fails from here on, that mix is dirty (err_release). */
		for (size_t i = 0; i < c->nregions; i++)
			restored |= c->regions[i].r.fixed;
		ret = fetch(c);
		/* A fetch that met a restart went on at the new wexd, which
		 * may not know the producers yet (they reconnect on their next
		 * call): its refusal is no answer; acquire again there. */
		if (ret < 0 && c->conn_gen == conn)
			goto err_release;
	}
	if (c->conn_gen != conn) {
		/* Restarted during the fetch: acquire again from the new one
		 * (which ends the lease the reconnect may have taken back).
		 * The lease the restart took was this sync's own, never the
		 * caller's: no later wex_release reports it as lost. */
		int back = c->has_lease;

		c->has_lease = 0;
		c->lease_lost = 0;
		c->fetched = 0;
		if (!retried++) {
			/* Within the caller's timeout, not a second one. */
			timeout_ms = wait_left(c, timeout_ms, t0);
			goto again;
		}
		if (back) {
			/* Taken back at the third wexd: give it back there. */
			c->has_lease = 1;
			release_lease(c, 0, 1);
			c->lease_lost = 0;
		}
		if (restored) {
			c->dirty = 1;
			c->copied = 0;
		}
		return set_err(c, -WEX_EDAEMON, "wexd restarted twice during one sync: sync again");
	}
	if (mode == WEX_SYNC_COPY) {
		int changed = version != c->copied || c->dirty, first = 0;

		for (size_t i = 0; i < c->nregions && !changed; i++)
			changed = c->regions[i].r.fixed || c->regions[i].r.lost;
		/* A layout in GPU memory takes the GPU executor, which copies
		 * host sources by DMA from page-locked memory: pinned (or
		 * refused) before anything of the weights changes. */
		if (changed && layout_device(c) >= 0 &&
		    (ret = pin_host_sources(c, layout_device(c))) < 0)
			goto err_release;

		/* A copy writes the consumer's own memory: regions showing the
		 * producer's get their private memory back first, every one
		 * of them even when one fails (the first failure is reported). */
		for (size_t i = 0; i < c->nregions; i++) {
			struct region *g = &c->regions[i];

			/* A lost region (an earlier failure left it without
			 * memory it can write) gets fresh memory first. */
			if (!g->r.fixed && !g->r.lost)
				continue;
			/* -WEX_EDIRTY: back on its own memory with its
			 * bytes lost, which the copy below rewrites. */
			ret = g->r.ops->unmap_fixed(&g->r);
			if (!g->r.fixed)
				g->mapped = NULL;
			changed = 1;
			if (!g->r.lost && (ret >= 0 || ret == -WEX_EDIRTY))
				continue;
			c->dirty = 1;
			c->copied = 0;
			if (first)
				continue;
			if (g->r.lost) {
				first = ret < 0 ? ret : -WEX_EDIRTY;
				set_err(c, first, "copy: same-address region at %p has no memory of its own since a failed swap and none can be mapped there (%s): weights are dirty; sync again, or close the client",
					g->r.addr, wex_strerror(ret));
			} else {
				/* Still showing the producer's memory, which the
				 * producer may write once the lease ends. */
				first = ret;
				set_err(c, ret, "copy: restoring same-address region: %s (it still shows the producer's memory: weights are dirty)",
					wex_strerror(ret));
			}
		}
		if (first) {
			ret = first;
			goto err_release;
		}

		if (changed) {
			char cwhy[640];

			c->dirty = 1;
			ret = run_copy(c, &bytes);
			if (ret < 0)
				copy_fail_text(c, cwhy, sizeof(cwhy));
			if (ret == -ENOTRECOVERABLE) {
				/* A sticky CUDA error: no later sync can succeed. */
				set_err(c, ret, "copy of v%llu failed%s: this process's CUDA context is unusable after a sticky error (see the log; it may come from the engine's own GPU work): weights are dirty; restart the process",
					(unsigned long long)version, cwhy);
				goto err_release;
			}
			if (ret < 0) {
				set_err(c, -WEX_EDIRTY, "copy of v%llu failed (%s%s): weights are dirty",
					(unsigned long long)version, wex_strerror(ret), cwhy);
				ret = -WEX_EDIRTY;
				goto err_release;
			}
			c->dirty = 0;
			c->copied = version;
		}
		if (verify || c->verify_ask) {
			vt0 = wex__now_ns();
			ret = verify_plan(c, version, &vbytes, &vrep);
			vt1 = wex__now_ns();
			if (ret < 0 && !verify_goes_on(c, ret, verify)) {
				set_report(c, "copy", bytes, t0);
				report_verify(c, vrep);
				goto err_release;
			}
		}
		c->version = version;
		c->took = version;
		set_report(c, "copy", bytes, t0);
		report_verify(c, vrep);
		vrep = NULL;
		ret = release_lease(c, 0, 0);
		if (c->conn_gen != conn || ret == -WEX_EDAEMON) {
			/* The release found wexd restarted, or gone and not yet
			 * back (-WEX_EDAEMON: the lease went with the
			 * connection): the lease was gone for part of the copy,
			 * so the producer may have written under it. */
			c->has_lease = 0;
			if (changed) {
				c->dirty = 1;
				c->copied = 0;
				c->took = 0;
				return set_err(c, -WEX_EDIRTY,
					       "wexd restarted or went away during the copy of v%llu: its lease was lost, so the producer may have written meanwhile; the weights may be mixed: sync again",
					       (unsigned long long)version);
			}
			ret = 0; /* nothing was copied: nothing to doubt */
		}
		if (ret < 0)
			return ret;
		if (res) {
			res->changed = changed;
		}
		ops = changed ? c->nplan : 0;
	} else if (mode == WEX_SYNC_REMAP_FIXED) {
		ret = map_regions(c, &bytes);
		if (ret < 0)
			goto err_release;
		if (verify || (c->verify_ask && c->nlayout)) {
			vt0 = wex__now_ns();
			ret = verify_plan(c, version, &vbytes, &vrep);
			vt1 = wex__now_ns();
			if (ret < 0 && !verify_goes_on(c, ret, verify)) {
				/* The regions show the producer's memory at
				 * places that do not hold what the layout says:
				 * they get their own memory back (dirty). */
				regions_undo(c, NULL);
				c->dirty = 1;
				c->copied = 0;
				set_report(c, "remap-fixed", bytes, t0);
				report_verify(c, vrep);
				goto err_release;
			}
		} else if (c->verify_ask) {
			vrep = verify_none(version, "same-address sync with no attached layout");
		}
		/* Every region shows the version now: weights all in them
		 * are whole again, whatever an earlier failure left. */
		if (c->dirty && layout_in_regions(c))
			c->dirty = 0;
		if (res)
			res->changed = version != c->version;
		c->version = version;
		c->took = version;
	} else {
		for (size_t i = 0; i < c->npsegs; i++)
			bytes += c->psegs[i].seg.desc.size;
		/* Its fetch gave same-address regions their own memory back,
		 * holding this version, while weights outside them hold the
		 * one copied before: the engine's own weights are mixed. */
		if (restored && c->copied != version && !layout_in_regions(c)) {
			c->dirty = 1;
			c->copied = 0;
		}
		if (res)
			res->changed = version != c->version;
		c->version = version;
		c->took = version;
		if (c->verify_ask)
			vrep = verify_none(version, "view sync: it reads the producer's memory, nothing of its own to compare");
	}
	if (mode != WEX_SYNC_COPY) {
		set_report(c, mode == WEX_SYNC_REMAP_VIEW ? "remap-view" : "remap-fixed", bytes, t0);
		if (vrep) {
			/* A remap lease lasts the rollout: wexctl verify
			 * hears now rather than at its end. */
			report_verify(c, vrep);
			vrep = NULL;
			simple_rpc(c, json_pack("{s:s}", "op", "ping"), NULL);
		}
	}
	if (res) {
		res->version = version;
		res->bytes = bytes;
		res->ops = ops;
		res->seconds = (double)(wex__now_ns() - t0) / 1e9;
		res->waited = waited;
		/* Only for a caller that asked: one built before these
		 * fields existed never asks, and its struct ends before. */
		if (verify) {
			res->verified = vbytes;
			res->verify_seconds = (double)(vt1 - vt0) / 1e9;
		}
	}
	return 0;
err_release:
	/* Regions this sync gave their own memory back hold its version,
	 * which it did not make the one served: mixed weights (wex_sync).
	 * (No lease stands here: this one is given back below.  The one an
	 * -ESHUTDOWN leaves standing is refused before any fetch.) */
	if (restored) {
		c->dirty = 1;
		c->copied = 0;
	}
	/* Give the new lease back; the caller learns why the sync failed,
	 * not how the release went. */
	{
		char why[sizeof(c->err)];

		memcpy(why, c->err, sizeof(why));
		release_lease(c, 0, 1);
		/* A lease lost with the connection here was this sync's
		 * own: its error says what happened. */
		c->lease_lost = 0;
		memcpy(c->err, why, sizeof(why));
	}
	return ret;
}

WEX_API int wex_sync(wex_client_t *c, int mode, uint64_t min_version, uint32_t timeout_ms,
		     struct wex_sync_result *res)
{
	int ret;

	CALL_OK(c, res);
	cancelable_begin(c);
	c->cancel_wait = 1;
	c->signalled = 0;
	KEEP_THREAD_DEVICE(ret, sync_(c, mode, min_version, timeout_ms, res));
	ret = signal_ended(c, ret);
	c->cancel_wait = 0;
	cancelable_end(c);
	return ret;
}

WEX_API int wex_cancel(wex_client_t *c)
{
	uint64_t s, one = 1;

	if (!c)
		return -EINVAL;
	if (c->forked)
		return -ECHILD;
	s = atomic_load(&c->call_seq);
	if (!(s & 1))
		return 0;
	cancel_mark(&c->cancel_seq, s);
	cancel_mark(&c->asked_seq, s);
	/* (Full only after 2^64 - 2 unread wake-ups.) */
	if (write(c->cancel_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		return -errno;
	/* (A publish waits in wexd for nothing: no cancel is sent.) */
	return atomic_load(&c->wexd_cancels) || atomic_load(&c->cancel_local) ? 1 : -EOPNOTSUPP;
}

WEX_API int wex_release(wex_client_t *c)
{
	CALL_OK(c, 1);
	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "only consumers hold leases");
	if (!c->has_lease) {
		if (c->lease_lost)
			return lease_lost_err(c);
		/* After a release that found no wexd: a wexd started since
		 * holds that lease (read from its journal) until this client
		 * connects again, and saying hello without it ends it. */
		if (c->fd < 0)
			reconnect(c);
		return set_err(c, -ENOENT, "no lease held");
	}
	return release_lease(c, 1, 0);
}

WEX_API int wex_is_dirty(wex_client_t *c)
{
	ARGS_OK(c, 1);
	return c->dirty;
}

WEX_API int wex_released(const void *ptr, uint64_t len, uint64_t *at)
{
	struct wex_mem_thread_state ts;
	struct wex_mem_span known = { 0 };
	uint64_t a = 0;
	int ret;

	if (!ptr)
		return -EINVAL;
	wex_mem_thread_save(&ts);
	ret = wex_mem_ptr_released((uint64_t)(uintptr_t)ptr, len, &a, &known);
	wex_mem_thread_restore(&ts);
	if (ret == 1 && at)
		*at = a;
	return ret;
}

WEX_API int wex_view(wex_client_t *c, uint32_t prank, const char *name, void **ptr,
		     struct wex_tensor *desc)
{
	ARGS_OK(c, 1);
	if (!name || !ptr)
		return set_err(c, -EINVAL, "view: name and ptr must not be NULL");
	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "view: only consumers view producers' tensors (after a sync)");
	if (!c->fetched || prank >= c->nprod)
		return set_err(c, -ENOENT, "no producer rank %u%s", prank,
			       c->fetched ? "" : " (sync first)");
	for (size_t j = c->rank_first[prank]; j < c->rank_first[prank + 1]; j++) {
		const struct wex_tensor *t = &c->tables[j];
		struct pseg *s;

		if (strcmp(t->name, name))
			continue;
		s = find_pseg(c, prank, t->segment);
		if (!s)
			return set_err(c, -ENOENT, "segment of '%s' not mapped", name);
		*ptr = (char *)s->seg.ptr + t->offset;
		if (desc) {
			*desc = *t;
			desc->ptr = *ptr;
		}
		return 0;
	}
	return set_err(c, -ENOENT, "producer rank %u has no tensor '%s'", prank, name);
}

WEX_API int wex_producer_tensors(wex_client_t *c, uint32_t prank, const struct wex_tensor **t,
				 size_t *n)
{
	ARGS_OK(c, t && n);
	if (c->role != WEX_ROLE_CONSUMER)
		return set_err(c, -EPERM, "producer_tensors: only consumers fetch producers' tables (a sync, wex_reserve)");
	if (!c->fetched || prank >= c->nprod)
		return set_err(c, -ENOENT, "no producer rank %u%s", prank,
			       c->fetched ? "" : " (sync first)");
	*t = c->tables + c->rank_first[prank];
	*n = c->rank_first[prank + 1] - c->rank_first[prank];
	return (int)c->nprod;
}

static int request_rpc(wex_client_t *c, const char *op, json_t *req, json_t **reply)
{
	/* What a producer's request changes is not tracked here: its memory
	 * may no longer hold the version last published, so a reconnect
	 * does not restore that. */
	static const char *const ro[] = { "status", "ping",    "models",    "clients",
					  "metrics", "plans", "config_get" };
	size_t i = 0;

	while (i < sizeof(ro) / sizeof(ro[0]) && strcmp(op, ro[i]))
		i++;
	if (c->role == WEX_ROLE_PRODUCER && i == sizeof(ro) / sizeof(ro[0]))
		c->published = 0;
	/* A consumer's lease is libwex's to end: ended by a raw request, the
	 * producer could overwrite memory the engine still reads through
	 * its views or regions, with libwex none the wiser. */
	if (c->role == WEX_ROLE_CONSUMER && c->has_lease &&
	    (!strcmp(op, "release") || !strcmp(op, "acquire") || !strcmp(op, "attach") ||
	     !strcmp(op, "fetch") || !strcmp(op, "hello"))) {
		json_decref(req);
		return set_err(c, -EINVAL, "request '%s': this client holds a lease on v%llu, which a raw "
			       "request would end behind libwex's back (the producer could then "
			       "overwrite what its views show): call wex_release or wex_sync",
			       op, (unsigned long long)c->lease_version);
	}
	/* wexd answers a fetch with the producers' memory as fds, which a
	 * JSON string cannot carry: dropped, its well-formed reply would be
	 * called malformed. */
	if (!strcmp(op, "fetch")) {
		json_decref(req);
		return set_err(c, -EINVAL, "request 'fetch': wexd answers it with the producers' memory as file descriptors, which wex_request cannot hand over: wex_sync and wex_reserve fetch");
	}
	return simple_rpc(c, req, reply);
}

WEX_API int wex_request(wex_client_t *c, const char *op, const char *args_json, char **json)
{
	json_t *req, *reply = NULL;
	json_error_t je;
	int ret;

	ARGS_OK(c, op && json);
	/* wexctl prints this call's message when there is one: none left
	 * from an earlier call may stand in for a failure that sets none
	 * (a lost connection). */
	c->err[0] = '\0';
	/* wexd answers none that finds nothing waiting: this call would
	 * wait for a reply in vain, then drop the connection (and a lease). */
	if (!strcmp(op, "cancel"))
		return set_err(c, -EINVAL, "request 'cancel': wexd answers it only in place of a waiting request; call wex_cancel");
	/* (jansson would leave it out of the request: wexd's "no op".) */
	if (!utf8_ok(op))
		return set_err(c, -EINVAL, "request: the op is not valid UTF-8");
	if (args_json) {
		req = json_loads(args_json, 0, &je);
		if (!req || !json_is_object(req)) {
			json_decref(req);
			return set_err(c, -EINVAL, "request arguments are not a JSON object: %s",
				       req ? "valid JSON of another type" : je.text);
		}
	} else {
		req = json_object();
	}
	json_object_set_new(req, "op", json_string(op));
	LOCKED(c, ret, request_rpc(c, op, req, &reply));
	if (ret < 0)
		return ret;
	*json = json_dumps(reply, JSON_INDENT(2));
	json_decref(reply);
	return *json ? 0 : -ENOMEM;
}
