/* SPDX-License-Identifier: MIT */
/*
 * loop_uring.c - the io_uring backend: multishot accept on the listener,
 * one recvmsg (with SCM_RIGHTS) in flight per connection, poll for watched
 * fds.  A connection being closed has its recvmsg cancelled, and its io is
 * freed only once the cancelled completion has arrived.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"
#include "metrics.h"
#include "proto.h"


struct ur {
	struct io_uring ring;
	int multishot_ok;
	/* Transient io_uring_enter failures: how many, when last logged;
	 * WEX_URING_TRANSIENT=N (tests) fails every Nth wait so. */
	unsigned long long transient;
	uint64_t transient_logged_ns;
	unsigned transient_every, waits;
	/* Requests the ring had no room for (get_sqe failed), retried at
	 * each turn (struct wex_loop_retry): a circular list; how many times,
	 * when last logged.  WEX_URING_SQE_FAIL=N (tests) makes one get_sqe
	 * in N, drawn by a fixed pseudo-random sequence, find no room, as a
	 * full submission queue whose submitting failed (every Nth instead
	 * could fail the same retry at every turn, where a turn makes a
	 * multiple of N calls: a lockstep no full queue has);
	 * WEX_URING_SQE_FAIL=recv, every receive but a connection's first. */
	struct wex_loop_retry retry;
	unsigned long long no_room;
	uint64_t no_room_logged_ns;
	unsigned sqe_fail_every;
	uint32_t sqe_rand; /* xorshift32 state */
	int sqe_fail_recv;
	/* Completions the kernel dropped (EBADR), when last logged;
	 * WEX_URING_DROPPED=N (tests) loses a watch's completion at every Nth
	 * wait and reports EBADR at the next. */
	unsigned long long dropped;
	uint64_t dropped_logged_ns;
	unsigned dropped_every;
	/* The listener and watches, probed after completions were dropped;
	 * the one whose completion the acted EBADR loses (tests). */
	struct wex_loop_watch *watches[4];
	unsigned nwatches;
	struct wex_loop_watch *lose;
	int lost;
};

/* What a queued struct wex_loop_retry waits to queue. */
enum {
	RETRY_RECV = 1,    /* a connection's receive (wex_loop_io) */
	RETRY_ACCEPT,      /* the listener's accept (wex_loop_watch) */
	RETRY_LISTEN_POLL, /* its poll for a waiting client */
	RETRY_POLL,        /* a watch's poll */
	RETRY_UNLISTEN,    /* the cancel of the listener's accept or poll */
	RETRY_PID_POLL,    /* the poll of a client's pidfd (wex_loop_pid) */
	RETRY_PID_CANCEL,  /* its cancel, the client's connection closing */
	RETRY_PROBE,       /* a watch's probe after dropped completions */
};

/* A connection whose receive finds no room for this long is closed (its
 * client told by the end of its connection) rather than left waiting. */
#define RETRY_GIVE_UP_NS 10000000000ull
/* How long a turn waits at most while requests wait to be retried. */
#define RETRY_WAIT_MS 10

static int ur_init(struct wex_loop *l, char *why, size_t len)
{
	static const int need[] = { IORING_OP_RECVMSG, IORING_OP_ACCEPT, IORING_OP_POLL_ADD,
				    IORING_OP_ASYNC_CANCEL };
	struct io_uring_probe *probe;
	const char *hook;
	struct ur *u;
	int ret;

	u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	ret = io_uring_queue_init(256, &u->ring, 0);
	if (ret < 0) {
		snprintf(why, len, "io_uring_queue_init: %s", strerror(-ret));
		free(u);
		return ret;
	}
	probe = io_uring_get_probe_ring(&u->ring);
	if (!probe) {
		snprintf(why, len, "io_uring probe failed");
		ret = -ENOSYS;
		goto err;
	}
	for (size_t i = 0; i < WEX_ARRAY_SIZE(need); i++) {
		if (!io_uring_opcode_supported(probe, need[i])) {
			snprintf(why, len, "io_uring lacks opcode %d", need[i]);
			io_uring_free_probe(probe);
			ret = -ENOSYS;
			goto err;
		}
	}
	io_uring_free_probe(probe);
	/* Before 5.11 (no EXT_ARG) liburing times a wait with a timeout
	 * request of its own, whose completion (user_data
	 * LIBURING_UDATA_TIMEOUT) the loop would take for one of its
	 * requests: epoll there.  WEX_URING_NO_EXT_ARG=1 acts as such a
	 * kernel (tests). */
	hook = getenv("WEX_URING_NO_EXT_ARG");
	if (!(u->ring.features & IORING_FEAT_EXT_ARG) || (hook && !strcmp(hook, "1"))) {
		snprintf(why, len, "kernel lacks IORING_FEAT_EXT_ARG (before 5.11)%s",
			 hook && !strcmp(hook, "1") ? " (acted: WEX_URING_NO_EXT_ARG=1)" : "");
		ret = -ENOSYS;
		goto err;
	}
	hook = getenv("WEX_URING_TRANSIENT");
	if (hook)
		u->transient_every = (unsigned)strtoul(hook, NULL, 10);
	hook = getenv("WEX_URING_SQE_FAIL");
	if (hook && !strcmp(hook, "recv"))
		u->sqe_fail_recv = 1;
	else if (hook)
		u->sqe_fail_every = (unsigned)strtoul(hook, NULL, 10), u->sqe_rand = 2463534242u;
	hook = getenv("WEX_URING_DROPPED");
	if (hook)
		u->dropped_every = (unsigned)strtoul(hook, NULL, 10);
	u->retry.next = u->retry.prev = &u->retry;
	u->multishot_ok = 1;
	l->priv = u;
	return 0;
err:
	io_uring_queue_exit(&u->ring);
	free(u);
	return ret;
}

/* Whether a warning last logged at *last is due again (once a minute at
 * most); if so, *last becomes now. */
static int log_due(uint64_t *last, uint64_t now)
{
	if (*last && now - *last < 60000000000ull)
		return 0;
	*last = now;
	return 1;
}

static struct io_uring_sqe *get_sqe(struct ur *u)
{
	struct io_uring_sqe *sqe;

	if (u->sqe_fail_every) {
		u->sqe_rand ^= u->sqe_rand << 13;
		u->sqe_rand ^= u->sqe_rand >> 17;
		u->sqe_rand ^= u->sqe_rand << 5;
		if (u->sqe_rand % u->sqe_fail_every == 0)
			return NULL; /* acted (tests) */
	}
	sqe = io_uring_get_sqe(&u->ring);
	if (!sqe) {
		io_uring_submit(&u->ring);
		sqe = io_uring_get_sqe(&u->ring);
	}
	return sqe;
}

/* Queues r to retry op at the next turns: the ring had no room for it.
 * Logged once a minute at most, with the count. */
static void retry_later(struct wex_loop *l, struct wex_loop_retry *r, int op)
{
	struct ur *u = l->priv;
	uint64_t now = wex__now_ns();

	u->no_room++;
	wex__metrics_count(WEX_M_LOOP_RETRIES, "no_sqe", NULL, 1);
	if (log_due(&u->no_room_logged_ns, now)) {
		wex_warn("loop", "io_uring: no room to queue a request (%llu time(s) so far): the "
			 "submission queue is full and submitting failed (the kernel short of "
			 "memory, or completions overflowing); retried at the next turns",
			 u->no_room);
	}
	if (!r->op) {
		r->since_ns = now;
		r->prev = u->retry.prev;
		r->next = &u->retry;
		u->retry.prev->next = r;
		u->retry.prev = r;
	}
	r->op = op;
}

/* Takes r off the queue of retries, if it is on it. */
static void retry_drop(struct wex_loop_retry *r)
{
	if (!r->op)
		return;
	r->prev->next = r->next;
	r->next->prev = r->prev;
	r->next = r->prev = NULL;
	r->op = 0;
}

static int arm_accept(struct wex_loop *l, struct wex_loop_watch *w)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe) {
		w->armed = 0;
		retry_later(l, &w->retry, RETRY_ACCEPT);
		return 0;
	}
	if (u->multishot_ok)
		io_uring_prep_multishot_accept(sqe, w->fd, NULL, NULL, SOCK_CLOEXEC);
	else
		io_uring_prep_accept(sqe, w->fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, w);
	w->armed = 1;
	w->gen++;
	return 0;
}

static void add_watch(struct ur *u, struct wex_loop_watch *w)
{
	if (u->nwatches < WEX_ARRAY_SIZE(u->watches))
		u->watches[u->nwatches++] = w;
}

static int ur_listen(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_LISTEN;
	add_watch(l->priv, w);
	return arm_accept(l, w);
}

/* Polls w for input: a watch (armed 1), or the listener waiting for a
 * client (armed 2, op RETRY_LISTEN_POLL). */
static int poll_watch(struct wex_loop *l, struct wex_loop_watch *w, int op)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe) {
		w->armed = 0;
		retry_later(l, &w->retry, op);
		return 0;
	}
	io_uring_prep_poll_add(sqe, w->fd, POLLIN);
	io_uring_sqe_set_data(sqe, w);
	w->armed = op == RETRY_LISTEN_POLL ? 2 : 1;
	w->gen++;
	return 0;
}

static int arm_poll(struct wex_loop *l, struct wex_loop_watch *w)
{
	return poll_watch(l, w, RETRY_POLL);
}

/* Out of fds, io_uring fails an accept at once, a client waiting or not:
 * the listener waits for a client with a poll instead (armed == 2). */
static int arm_listen_poll(struct wex_loop *l, struct wex_loop_watch *w)
{
	return poll_watch(l, w, RETRY_LISTEN_POLL);
}

static int ur_watch(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_WATCH;
	add_watch(l->priv, w);
	return arm_poll(l, w);
}

/* Queues io's receive; `again`: not its first (acted failures). */
static int arm_recv(struct wex_loop *l, struct wex_loop_io *io, int again)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = again && u->sqe_fail_recv ? NULL : get_sqe(u);

	if (!sqe) {
		retry_later(l, &io->retry, RETRY_RECV);
		return 0;
	}
	/* The msghdr lives in the io, stable until the completion. */
	io->iov.iov_base = io->buf;
	io->iov.iov_len = io->buflen;
	memset(&io->msg, 0, sizeof(io->msg));
	io->msg.msg_iov = &io->iov;
	io->msg.msg_iovlen = 1;
	io->msg.msg_control = io->c.cbuf;
	io->msg.msg_controllen = sizeof(io->c.cbuf);
	io_uring_prep_recvmsg(sqe, io->fd, &io->msg, MSG_CMSG_CLOEXEC);
	io_uring_sqe_set_data(sqe, io);
	io->inflight = 1;
	return 0;
}

static int ur_add(struct wex_loop *l, struct wex_loop_io *io)
{
	return arm_recv(l, io, 0);
}

/* Polls io's pidfd (io->pid.fd). */
static int arm_pid(struct wex_loop *l, struct wex_loop_io *io)
{
	struct io_uring_sqe *sqe = get_sqe(l->priv);

	if (!sqe) {
		retry_later(l, &io->pid.retry, RETRY_PID_POLL);
		return 0;
	}
	io_uring_prep_poll_add(sqe, io->pid.fd, POLLIN);
	io_uring_sqe_set_data(sqe, &io->pid);
	io->pid.armed = 1;
	return 0;
}

/* Watches the peer's pidfd with a one-shot poll (an exited process's
 * pidfd stays readable). */
static int ur_watch_pid(struct wex_loop *l, struct wex_loop_io *io, int pidfd)
{
	io->pid.fd = pidfd;
	return arm_pid(l, io);
}

/* Cancels the poll of a closing io's pidfd. */
static void cancel_pid(struct wex_loop *l, struct wex_loop_io *io)
{
	struct io_uring_sqe *sqe = get_sqe(l->priv);

	if (!sqe) {
		retry_later(l, &io->pid.retry, RETRY_PID_CANCEL);
		return;
	}
	io_uring_prep_cancel(sqe, &io->pid, 0);
	io_uring_sqe_set_data(sqe, NULL);
}

/* Frees io once the loop is done with it; no retry may name it then. */
static void ur_defer_free(struct wex_loop *l, struct wex_loop_io *io)
{
	retry_drop(&io->retry);
	retry_drop(&io->pid.retry);
	wex__loop_defer_free(l, io);
}

/* Closes a closing io's socket once its receive is back, and frees the io
 * once no operation in the ring names it (its pidfd poll is back too). */
static void finish_close(struct wex_loop *l, struct wex_loop_io *io)
{
	if (io->inflight)
		return;
	close(io->fd);
	io->fd = -1;
	if (!io->pid.armed)
		ur_defer_free(l, io);
}

static void ur_close(struct wex_loop *l, struct wex_loop_io *io)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe;

	if (io->closing)
		return;
	io->closing = 1;
	/* A receive or pidfd poll still waiting for room is not wanted now. */
	retry_drop(&io->retry);
	retry_drop(&io->pid.retry);
	if (io->pid.armed)
		cancel_pid(l, io);
	/* The ring holds its own reference for the poll: the pidfd goes now
	 * (a count of wexd's fds sees the client gone at once). */
	if (io->pid.fd >= 0) {
		close(io->pid.fd);
		io->pid.fd = -1;
	}
	if (io->inflight) {
		if ((sqe = get_sqe(u))) {
			io_uring_prep_cancel(sqe, io, 0);
			io_uring_sqe_set_data(sqe, NULL);
		}
		/* Shutting the socket down also completes the pending recvmsg. */
		shutdown(io->fd, SHUT_RDWR);
	}
	finish_close(l, io);
}

static void handle_recv(struct wex_loop *l, struct wex_loop_io *io, int res)
{
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags;

	io->inflight = 0;
	if (io->closing) {
		/* Fds that raced in with the cancelled receive are ours to
		 * close; an empty message (res 0) may carry them too. */
		if (res >= 0) {
			wex_sock_take_fds(&io->msg, fds, WEX_SOCK_MAX_FDS, &nfds);
			wex_sock_close_fds_nowait(fds, nfds);
		}
		finish_close(l, io);
		return;
	}
	/* A receive the kernel ran in a worker on the non-blocking socket
	 * (older kernels), or one interrupted: nothing arrived, as epoll's
	 * EAGAIN; wait again rather than take it for the client's end. */
	if (res == -EAGAIN || res == -EINTR) {
		arm_recv(l, io, 1);
		return;
	}
	if (res < 0) {
		l->cbs.on_msg(l->arg, io, res, NULL, 0, 0);
		return;
	}
	mflags = io->msg.msg_flags;
	if (wex_sock_take_fds(&io->msg, fds, WEX_SOCK_MAX_FDS, &nfds) < 0)
		mflags |= MSG_CTRUNC;
	l->cbs.on_msg(l->arg, io, res, fds, nfds, mflags);
	/* (0 is an empty message when the connection stays open.) */
	if (!io->closing)
		arm_recv(l, io, 1);
}

/* io_uring_enter failed for the moment: EAGAIN (the kernel could not
 * allocate for the submission, under memory pressure: the requests stay
 * queued and go with the next wait) or EBUSY (the completion queue
 * overflowed: completions the kernel holds back come in once the ring is
 * drained, as this turn does).  Neither ends wexd.  Logged once a minute
 * at most, with the count; a short nap when nothing is there to drain
 * keeps a lasting condition from spinning a core. */
static void transient(struct ur *u, int err)
{
	uint64_t now = wex__now_ns();

	u->transient++;
	wex__metrics_count(WEX_M_LOOP_RETRIES, err == -EAGAIN ? "EAGAIN" : "EBUSY", NULL, 1);
	if (log_due(&u->transient_logged_ns, now)) {
		wex_warn("loop", "io_uring_enter: %s (%llu time(s) so far): %s; retried", strerror(-err),
			 u->transient,
			 err == -EAGAIN ? "the kernel is short of memory for the submission"
					: "the completion queue overflowed; draining it");
	}
	if (!io_uring_cq_ready(&u->ring))
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
}

/* Cancels the listener's accept or poll (unlisten). */
static void cancel_listen(struct wex_loop *l, struct wex_loop_watch *w)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe) {
		retry_later(l, &w->retry, RETRY_UNLISTEN);
		return;
	}
	io_uring_prep_cancel(sqe, w, 0);
	io_uring_sqe_set_data(sqe, NULL);
	io_uring_submit(&u->ring);
}

/* Queues the cancel that probes w (w->probe.gen: the arms it saw); one the
 * ring has no room for is retried (RETRY_PROBE): skipped, a watch whose
 * completion was lost would never be armed again. */
static void probe_watch(struct wex_loop *l, struct wex_loop_watch *w)
{
	struct io_uring_sqe *sqe = get_sqe(l->priv);

	if (!sqe) {
		retry_later(l, &w->retry, RETRY_PROBE);
		return;
	}
	io_uring_prep_cancel(sqe, w, 0);
	io_uring_sqe_set_data(sqe, &w->probe);
}

/* io_uring_enter reported completions the kernel dropped (EBADR, 5.19 and
 * later): the completion queue overflowed and the kernel had no memory to
 * hold the overflow (GFP_ATOMIC failed).  The requests whose completions
 * went are not known, and the kernel clears the condition once it has said
 * so: stopping would drop every client, their ranks and leases, for what
 * costs at most the few whose completions went (a request not answered
 * until its client's timeout; a client's exit still ends its ranks and
 * leases through its pidfd).  Logged as an error once a minute at most,
 * counted, and the loop carries on (the completions the ring holds are
 * drained as on any turn). */
static void dropped(struct wex_loop *l)
{
	struct ur *u = l->priv;
	uint64_t now = wex__now_ns();

	u->dropped++;
	wex__metrics_count(WEX_M_LOOP_RETRIES, "EBADR", NULL, 1);
	if (log_due(&u->dropped_logged_ns, now)) {
		wex_error("loop", "io_uring dropped completions (EBADR, %llu time(s) so far): its "
			  "completion queue overflowed while the kernel was out of memory; a "
			  "client whose completion was lost may wait for an answer until its "
			  "own timeout; carrying on (clients stay connected)", u->dropped);
	}
	/* A multishot accept ends when the completion queue is full: were
	 * its last completion, or a watch's (the signalfd's), among those
	 * lost, wexd would accept no client, or heed no signal, again.  A
	 * cancel of each finds out: one that finds nothing in the ring, with
	 * no completion of the watch seen meanwhile, re-arms it (the
	 * WEX_LOOP_KIND_PROBE completion); one that finds it sends its
	 * completion (-ECANCELED), which re-arms it as any other. */
	for (unsigned i = 0; i < u->nwatches; i++) {
		struct wex_loop_watch *w = u->watches[i];

		if (w->stopped || !w->armed)
			continue;
		w->probe.kind = WEX_LOOP_KIND_PROBE;
		w->probe.gen = w->gen;
		probe_watch(l, w);
	}
}

/* Acts dropped completions (WEX_URING_DROPPED, tests): cancels a watch's
 * request, in turn the listener's and the others', and loses its last
 * completion (ur_run_once skips it), as the kernel would have; the next
 * wait reports EBADR. */
static void act_dropped(struct ur *u)
{
	struct wex_loop_watch *w;
	struct io_uring_sqe *sqe;

	if (!u->nwatches)
		return;
	w = u->watches[u->waits / u->dropped_every % u->nwatches];
	if (w->stopped || !w->armed || !(sqe = get_sqe(u)))
		return;
	io_uring_prep_cancel(sqe, w, 0);
	io_uring_sqe_set_data(sqe, NULL);
	u->lose = w;
}

#define RETRY_OF(r, type) ((type *)(void *)((char *)(r) - offsetof(type, retry)))

/* Queues again what found no room before, now that this turn's
 * completions are drained (the end of the turn submits them).  A connection whose
 * receive finds none for RETRY_GIVE_UP_NS is closed, with a warning,
 * rather than left waiting for good; the listener, watches and cancels are
 * retried until they go. */
static void retry_run(struct wex_loop *l)
{
	struct ur *u = l->priv;
	struct wex_loop_retry *r;
	uint64_t now = wex__now_ns();
	unsigned long n = 0;

	/* Those queued again go at the tail: each is tried once a turn. */
	for (r = u->retry.next; r != &u->retry; r = r->next)
		n++;
	while (n-- && (r = u->retry.next) != &u->retry) {
		uint64_t since = r->since_ns;
		int op = r->op;

		retry_drop(r);
		switch (op) {
		case RETRY_RECV: {
			struct wex_loop_io *io = RETRY_OF(r, struct wex_loop_io);

			if (now - since >= RETRY_GIVE_UP_NS) {
				wex_warn("loop", "io_uring: no room to queue a client's receive for %llu s "
					 "(submission queue full, submitting failing): closing its "
					 "connection rather than leaving it waiting",
					 (unsigned long long)(RETRY_GIVE_UP_NS / 1000000000ull));
				l->cbs.on_msg(l->arg, io, -EBUSY, NULL, 0, 0);
				continue;
			}
			arm_recv(l, io, 1);
			break;
		}
		case RETRY_ACCEPT:
		case RETRY_LISTEN_POLL:
		case RETRY_POLL: {
			struct wex_loop_watch *w = RETRY_OF(r, struct wex_loop_watch);

			if (w->stopped)
				continue;
			if (op == RETRY_ACCEPT)
				arm_accept(l, w);
			else
				poll_watch(l, w, op);
			break;
		}
		case RETRY_UNLISTEN: {
			struct wex_loop_watch *w = RETRY_OF(r, struct wex_loop_watch);

			if (w->armed)
				cancel_listen(l, w);
			break;
		}
		case RETRY_PROBE: {
			struct wex_loop_watch *w = RETRY_OF(r, struct wex_loop_watch);

			/* (Armed again since: nothing to find out.) */
			if (!w->stopped && w->armed && w->gen == w->probe.gen)
				probe_watch(l, w);
			break;
		}
		case RETRY_PID_POLL:
		case RETRY_PID_CANCEL: {
			struct wex_loop_io *io = RETRY_OF(r, struct wex_loop_pid)->io;

			if (op == RETRY_PID_POLL && !io->closing)
				arm_pid(l, io);
			else if (op == RETRY_PID_CANCEL && io->pid.armed)
				cancel_pid(l, io);
			break;
		}
		}
		/* Still waiting: since its first failure. */
		if (r->op)
			r->since_ns = since;
	}
}

static int ur_run_once(struct wex_loop *l, int timeout_ms)
{
	struct ur *u = l->priv;
	struct wex_loop_watch *lw;
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	int ret;

	timeout_ms = wex__loop_wait_ms(l, timeout_ms);
	/* Requests wait for room: the next try comes soon. */
	if (u->retry.next != &u->retry && (timeout_ms < 0 || timeout_ms > RETRY_WAIT_MS))
		timeout_ms = RETRY_WAIT_MS;
	ts = (struct __kernel_timespec){
		.tv_sec = timeout_ms / 1000,
		.tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
	};
	u->waits++;
	if (u->lost) {
		u->lost = 0;
		ret = -EBADR; /* acted (tests): said at the wait after the loss */
	} else if (u->transient_every && u->waits % u->transient_every == 0) {
		ret = u->waits / u->transient_every % 2 ? -EAGAIN : -EBUSY; /* acted (tests) */
	} else {
		if (u->dropped_every && u->waits % u->dropped_every == 0)
			act_dropped(u);
		ret = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1,
						       timeout_ms >= 0 ? &ts : NULL, NULL);
	}
	if (ret == -EAGAIN || ret == -EBUSY)
		transient(u, ret);
	else if (ret == -EBADR)
		dropped(l);
	else if (ret < 0 && ret != -ETIME && ret != -EINTR)
		return ret;
	io_uring_for_each_cqe(&u->ring, head, cqe)
	{
		void *data = io_uring_cqe_get_data(cqe);
		int res = cqe->res;
		unsigned flags = cqe->flags;

		/* At most as many as epoll's turn: the rest wait for the
		 * next, after wexd's timers (waiters' deadlines) had theirs. */
		if (seen == WEX_LOOP_BATCH)
			break;
		seen++;
		if (!data)
			continue; /* a cancel's own completion */
		if (data == u->lose && !(flags & IORING_CQE_F_MORE)) {
			u->lose = NULL;
			u->lost = 1;
			continue; /* acted: dropped (tests) */
		}
		switch (*(int *)data) {
		case WEX_LOOP_KIND_PROBE: {
			struct wex_loop_watch *w =
				(void *)((char *)data - offsetof(struct wex_loop_watch, probe));

			/* (-EALREADY: under way; its completion comes.) */
			if (res != -ENOENT || w->stopped || !w->armed || w->gen != w->probe.gen)
				break;
			wex_warn("loop", "%s: its completion was among those io_uring dropped: "
				 "re-armed", w->kind == WEX_LOOP_KIND_LISTEN ? "the listener's accept"
									: "a watch's poll");
			w->armed = 0;
			if (w->kind == WEX_LOOP_KIND_LISTEN)
				arm_accept(l, w);
			else
				arm_poll(l, w);
			break;
		}
		case WEX_LOOP_KIND_LISTEN: {
			struct wex_loop_watch *w = data;

			if (w->stopped) {
				/* Cancelled by unlisten; an accept that won the
				 * race is handed on (and refused there). */
				if (w->armed == 1 && res >= 0)
					l->cbs.on_accept(l->arg, res);
				if (!(flags & IORING_CQE_F_MORE)) {
					w->armed = 0;
					retry_drop(&w->retry); /* its cancel */
				}
				break;
			}
			if (w->armed == 2) {
				/* The poll of arm_listen_poll: a client waits. */
				arm_accept(l, w);
				break;
			}
			if (res >= 0) {
				/* Left blocking: wexd sends with MSG_DONTWAIT, and
				 * a receive on a non-blocking socket completes
				 * with -EAGAIN on older kernels instead of
				 * waiting. */
				l->cbs.on_accept(l->arg, res);
			} else if (res == -EINVAL && u->multishot_ok) {
				/* Kernels before 5.19 reject multishot accept. */
				u->multishot_ok = 0;
			} else if (res == -EAGAIN && !(flags & IORING_CQE_F_MORE)) {
				/* Kernels before 5.18 (5.15.90) complete an
				 * accept on a non-blocking listener at once:
				 * wait for a client instead of spinning. */
				arm_listen_poll(l, w);
				break;
			} else if (res == -EMFILE || res == -ENFILE) {
				/* Refuses the client if one waits; then waits
				 * for the next one rather than fail again. */
				int r = wex__loop_emfile(l, w->fd);

				if (flags & IORING_CQE_F_MORE)
					break;
				if (r < 0) { /* no reserve: a poll would fire at once */
					/* (Nothing of it in the ring while paused:
					 * no probe after dropped completions re-arms
					 * it then.) */
					w->armed = 0;
					wex__loop_pause(l, w);
				}
				else
					arm_listen_poll(l, w);
				break;
			} else if (res != -ECANCELED) {
				wex_warn("loop", "accept: %s", strerror(-res));
			}
			if (!(flags & IORING_CQE_F_MORE))
				arm_accept(l, w);
			break;
		}
		case WEX_LOOP_KIND_WATCH: {
			struct wex_loop_watch *w = data;

			w->armed = 0;
			w->cb(w->arg, w->fd, res);
			arm_poll(l, w);
			break;
		}
		case WEX_LOOP_KIND_PID: {
			struct wex_loop_io *io = ((struct wex_loop_pid *)data)->io;

			io->pid.armed = 0;
			if (io->closing) {
				/* The socket went with the receive (or goes
				 * with it): only the io is left to free. */
				retry_drop(&io->pid.retry); /* its cancel */
				if (io->fd < 0)
					ur_defer_free(l, io);
			} else if (res > 0) {
				l->cbs.on_peer_exit(l->arg, io);
			} else if (res < 0) {
				wex_warn("loop", "watching a client's process (pidfd poll): %s: its "
					 "exit is no longer watched", strerror(-res));
				close(io->pid.fd); /* status shows it unwatched */
				io->pid.fd = -1;
			}
			break;
		}
		default:
			handle_recv(l, data, res);
			break;
		}
	}
	io_uring_cq_advance(&u->ring, seen);
	if ((lw = wex__loop_resume_due(l)))
		arm_listen_poll(l, lw);
	retry_run(l);
	io_uring_submit(&u->ring);
	wex__loop_reap(l);
	return (int)seen;
}

static void ur_fini(struct wex_loop *l)
{
	struct ur *u = l->priv;

	wex__loop_reap(l);
	wex__loop_fini_common(l);
	if (u) {
		io_uring_queue_exit(&u->ring);
		free(u);
	}
	l->priv = NULL;
}

static void ur_unlisten(struct wex_loop *l, struct wex_loop_watch *w)
{
	if (w->stopped)
		return;
	w->stopped = 1;
	if (l->paused == w)
		l->paused = NULL;
	/* An accept or poll waiting for room is not wanted now. */
	retry_drop(&w->retry);
	if (w->armed)
		cancel_listen(l, w);
}

const struct wex_loop_ops wex__loop_uring_ops = {
	.name = "io_uring",
	.init = ur_init,
	.listen = ur_listen,
	.watch = ur_watch,
	.add = ur_add,
	.close = ur_close,
	.watch_pid = ur_watch_pid,
	.unlisten = ur_unlisten,
	.run_once = ur_run_once,
	.fini = ur_fini,
};
