/* SPDX-License-Identifier: MIT */
/* loop_epoll.c - the epoll backend (level-triggered). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"

struct ep {
	int epfd;
};

static int ep_init(struct wex_loop *l, char *why, size_t len)
{
	struct ep *e = calloc(1, sizeof(*e));

	if (!e)
		return -ENOMEM;
	e->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (e->epfd < 0) {
		int ret = -errno;

		snprintf(why, len, "epoll_create1: %s", strerror(errno));
		free(e);
		return ret;
	}
	l->priv = e;
	return 0;
}

static int ep_add_ptr(struct wex_loop *l, int fd, void *ptr)
{
	struct ep *e = l->priv;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = ptr };

	if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	return 0;
}

static int ep_listen(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_LISTEN;
	return ep_add_ptr(l, w->fd, w);
}

static int ep_watch(struct wex_loop *l, struct wex_loop_watch *w)
{
	w->kind = WEX_LOOP_KIND_WATCH;
	return ep_add_ptr(l, w->fd, w);
}

static int ep_add(struct wex_loop *l, struct wex_loop_io *io)
{
	return ep_add_ptr(l, io->fd, io);
}

/* One-shot: an exited process's pidfd stays readable. */
static int ep_watch_pid(struct wex_loop *l, struct wex_loop_io *io, int pidfd)
{
	struct ep *e = l->priv;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT, .data.ptr = &io->pid };

	if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, pidfd, &ev) < 0) {
		int ret = -errno;

		close(pidfd);
		return ret;
	}
	io->pid.fd = pidfd;
	return 0;
}

static void ep_close(struct wex_loop *l, struct wex_loop_io *io)
{
	struct ep *e = l->priv;

	if (io->closing)
		return;
	io->closing = 1;
	epoll_ctl(e->epfd, EPOLL_CTL_DEL, io->fd, NULL);
	close(io->fd);
	io->fd = -1;
	if (io->pid.fd >= 0) {
		/* Its last reference: closing it takes it out of the set. */
		close(io->pid.fd);
		io->pid.fd = -1;
	}
	wex__loop_defer_free(l, io);
}

static void ep_accept(struct wex_loop *l, struct wex_loop_watch *w)
{
	/* At most a batch a turn (level-triggered: the rest come at the
	 * next): a connect flood must not starve connected clients, timers
	 * and signals. */
	for (int i = 0; i < WEX_LOOP_BATCH; i++) {
		int fd = accept4(w->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			int err = errno;

			if (err == EMFILE || err == ENFILE) {
				int r = wex__loop_emfile(l, w->fd);

				if (r > 0)
					continue;
				if (r < 0) {
					/* Level-triggered, the listener stays
					 * readable: stop watching it a while. */
					struct epoll_event ev = { .events = 0, .data.ptr = w };

					epoll_ctl(((struct ep *)l->priv)->epfd, EPOLL_CTL_MOD, w->fd,
						  &ev);
					wex__loop_pause(l, w);
				}
			} else if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
				wex_warn("loop", "accept: %s", strerror(err));
			}
			return;
		}
		l->cbs.on_accept(l->arg, fd);
	}
}

static void ep_recv(struct wex_loop *l, struct wex_loop_io *io)
{
	int fds[WEX_SOCK_MAX_FDS], nfds = 0, mflags = 0;
	ssize_t n;

	/* One message per wake-up keeps one client from starving others. */
	n = wex_sock_recv(io->fd, io->buf, io->buflen, fds, WEX_SOCK_MAX_FDS, &nfds, &mflags,
			  MSG_DONTWAIT);
	if (n == -EAGAIN || n == -EINTR)
		return;
	l->cbs.on_msg(l->arg, io, n, fds, nfds, mflags);
}

static int ep_run_once(struct wex_loop *l, int timeout_ms)
{
	struct ep *e = l->priv;
	struct epoll_event evs[WEX_LOOP_BATCH];
	struct wex_loop_watch *lw;
	int n;

	n = epoll_wait(e->epfd, evs, WEX_LOOP_BATCH, wex__loop_wait_ms(l, timeout_ms));
	if (n < 0)
		return errno == EINTR ? 0 : -errno;
	if ((lw = wex__loop_resume_due(l))) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = lw };

		epoll_ctl(e->epfd, EPOLL_CTL_MOD, lw->fd, &ev);
	}
	for (int i = 0; i < n; i++) {
		int kind = *(int *)evs[i].data.ptr;

		if (kind == WEX_LOOP_KIND_LISTEN) {
			/* (Not after an unlisten earlier in this batch: those
			 * clients wait for the next wexd.) */
			if (!((struct wex_loop_watch *)evs[i].data.ptr)->stopped)
				ep_accept(l, evs[i].data.ptr);
		} else if (kind == WEX_LOOP_KIND_WATCH) {
			struct wex_loop_watch *w = evs[i].data.ptr;

			w->cb(w->arg, w->fd, 0);
		} else if (kind == WEX_LOOP_KIND_PID) {
			struct wex_loop_io *io = ((struct wex_loop_pid *)evs[i].data.ptr)->io;

			/* An io closed earlier in this batch is still here
			 * (freed at the reap below), its pidfd closed. */
			if (!io->closing)
				l->cbs.on_peer_exit(l->arg, io);
		} else {
			struct wex_loop_io *io = evs[i].data.ptr;

			if (!io->closing)
				ep_recv(l, io);
		}
	}
	wex__loop_reap(l);
	return n;
}

static void ep_fini(struct wex_loop *l)
{
	struct ep *e = l->priv;

	wex__loop_reap(l);
	wex__loop_fini_common(l);
	if (e) {
		close(e->epfd);
		free(e);
	}
	l->priv = NULL;
}

static void ep_unlisten(struct wex_loop *l, struct wex_loop_watch *w)
{
	if (w->stopped)
		return;
	w->stopped = 1;
	if (l->paused == w)
		l->paused = NULL;
	epoll_ctl(((struct ep *)l->priv)->epfd, EPOLL_CTL_DEL, w->fd, NULL);
}

const struct wex_loop_ops wex__loop_epoll_ops = {
	.name = "epoll",
	.init = ep_init,
	.listen = ep_listen,
	.watch = ep_watch,
	.add = ep_add,
	.close = ep_close,
	.watch_pid = ep_watch_pid,
	.unlisten = ep_unlisten,
	.run_once = ep_run_once,
	.fini = ep_fini,
};
