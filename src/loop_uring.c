/* SPDX-License-Identifier: MIT */
/*
 * loop_uring.c - the io_uring backend: multishot accept on the listener,
 * one recvmsg (with SCM_RIGHTS) in flight per connection, poll for watched
 * fds.  A connection being closed has its recvmsg cancelled, and its io is
 * freed only once the cancelled completion has arrived.
 */
#include <errno.h>
#include <fcntl.h>
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
};

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
	u->multishot_ok = 1;
	l->priv = u;
	return 0;
err:
	io_uring_queue_exit(&u->ring);
	free(u);
	return ret;
}

static struct io_uring_sqe *get_sqe(struct ur *u)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

	if (!sqe) {
		io_uring_submit(&u->ring);
		sqe = io_uring_get_sqe(&u->ring);
	}
	return sqe;
}

static int arm_accept(struct wex_loop *l, struct wex_loop_watch *w)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe)
		return -EBUSY;
	if (u->multishot_ok)
		io_uring_prep_multishot_accept(sqe, w->fd, NULL, NULL, SOCK_CLOEXEC);
	else
		io_uring_prep_accept(sqe, w->fd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data(sqe, w);
	w->armed = 1;
	return 0;
}

static int ur_listen(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_LISTEN;
	return arm_accept(l, w);
}

static int arm_poll(struct wex_loop *l, struct wex_loop_watch *w)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, w->fd, POLLIN);
	io_uring_sqe_set_data(sqe, w);
	w->armed = 1;
	return 0;
}

/* Out of fds, io_uring fails an accept at once, a client waiting or not:
 * the listener waits for a client with a poll instead (armed == 2). */
static int arm_listen_poll(struct wex_loop *l, struct wex_loop_watch *w)
{
	int ret = arm_poll(l, w);

	if (!ret)
		w->armed = 2;
	return ret;
}

static int ur_watch(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_WATCH;
	return arm_poll(l, w);
}

static int arm_recv(struct wex_loop *l, struct wex_loop_io *io)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe = get_sqe(u);

	if (!sqe)
		return -EBUSY;
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
	return arm_recv(l, io);
}

/* Watches the peer's pidfd with a one-shot poll (an exited process's
 * pidfd stays readable). */
static int ur_watch_pid(struct wex_loop *l, struct wex_loop_io *io, int pidfd)
{
	struct io_uring_sqe *sqe = get_sqe(l->priv);

	if (!sqe) {
		close(pidfd);
		return -EBUSY;
	}
	io->pid.fd = pidfd;
	io_uring_prep_poll_add(sqe, pidfd, POLLIN);
	io_uring_sqe_set_data(sqe, &io->pid);
	io->pid.armed = 1;
	return 0;
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
		wex__loop_defer_free(l, io);
}

static void ur_close(struct wex_loop *l, struct wex_loop_io *io)
{
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe;

	if (io->closing)
		return;
	io->closing = 1;
	if (io->pid.armed && (sqe = get_sqe(u))) {
		io_uring_prep_cancel(sqe, &io->pid, 0);
		io_uring_sqe_set_data(sqe, NULL);
	}
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
		arm_recv(l, io);
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
		arm_recv(l, io);
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
	if (!u->transient_logged_ns || now - u->transient_logged_ns >= 60000000000ull) {
		wex_warn("loop", "io_uring_enter: %s (%llu time(s) so far): %s; retried", strerror(-err),
			 u->transient,
			 err == -EAGAIN ? "the kernel is short of memory for the submission"
					: "the completion queue overflowed; draining it");
		u->transient_logged_ns = now;
	}
	if (!io_uring_cq_ready(&u->ring))
		nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
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
	ts = (struct __kernel_timespec){
		.tv_sec = timeout_ms / 1000,
		.tv_nsec = (long long)(timeout_ms % 1000) * 1000000,
	};
	if (u->transient_every && ++u->waits % u->transient_every == 0)
		ret = u->waits / u->transient_every % 2 ? -EAGAIN : -EBUSY; /* acted (tests) */
	else
		ret = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1,
						       timeout_ms >= 0 ? &ts : NULL, NULL);
	if (ret == -EAGAIN || ret == -EBUSY)
		transient(u, ret);
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
		switch (*(int *)data) {
		case WEX_LOOP_KIND_LISTEN: {
			struct wex_loop_watch *w = data;

			if (w->stopped) {
				/* Cancelled by unlisten; an accept that won the
				 * race is handed on (and refused there). */
				if (w->armed == 1 && res >= 0)
					l->cbs.on_accept(l->arg, res);
				if (!(flags & IORING_CQE_F_MORE))
					w->armed = 0;
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
				if (r < 0) /* no reserve: a poll would fire at once */
					wex__loop_pause(l, w);
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
				if (io->fd < 0)
					wex__loop_defer_free(l, io);
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
	struct ur *u = l->priv;
	struct io_uring_sqe *sqe;

	if (w->stopped)
		return;
	w->stopped = 1;
	if (l->paused == w)
		l->paused = NULL;
	if (w->armed && (sqe = get_sqe(u))) {
		io_uring_prep_cancel(sqe, w, 0);
		io_uring_sqe_set_data(sqe, NULL);
		io_uring_submit(&u->ring);
	}
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
