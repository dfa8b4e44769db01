/* SPDX-License-Identifier: MIT */
/* loop.c - backend choice and shared helpers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"

int wex__loop_init(struct wex_loop *l, const char *which, size_t msg_max, char *err, size_t len)
{
	const char *hook;
	char why[256] = "";
	int ret;

	l->msg_max = msg_max;
	l->free_list = NULL;
	l->why_fallback[0] = '\0';
	l->emfile_refused = 0;
	l->paused = NULL;
	hook = getenv("WEX_LOOP_NO_RESERVE");
	l->no_reserve = hook && !strcmp(hook, "1");
	l->reserve_fd = l->no_reserve ? -1 : open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (!which || !*which)
		which = "auto";
	if (!strcmp(which, "epoll")) {
		l->ops = &wex__loop_epoll_ops;
		snprintf(l->why_fallback, sizeof(l->why_fallback), "forced by configuration");
		return l->ops->init(l, err, len);
	}
	if (strcmp(which, "io_uring") && strcmp(which, "auto")) {
		snprintf(err, len, "io backend '%s' unknown (expected auto, io_uring or epoll)", which);
		return -EINVAL;
	}
	l->ops = &wex__loop_uring_ops;
	ret = l->ops->init(l, why, sizeof(why));
	if (ret == 0)
		return 0;
	if (!strcmp(which, "io_uring")) {
		snprintf(err, len, "io_uring forced but unavailable: %s", why);
		return ret;
	}
	wex_warn("loop", "io_uring unavailable (%s): using epoll", why);
	snprintf(l->why_fallback, sizeof(l->why_fallback), "%s", why);
	l->ops = &wex__loop_epoll_ops;
	return l->ops->init(l, err, len);
}

int wex__loop_io_init(struct wex_loop *l, struct wex_loop_io *io, int fd, void *owner)
{
	memset(io, 0, sizeof(*io));
	io->kind = WEX_LOOP_KIND_CONN;
	io->fd = fd;
	io->owner = owner;
	io->pid.kind = WEX_LOOP_KIND_PID;
	io->pid.fd = -1;
	io->pid.io = io;
	/* One byte more than the limit, so that an oversized message shows as
	 * MSG_TRUNC instead of passing at exactly the limit. */
	io->buflen = l->msg_max + 1;
	io->buf = malloc(io->buflen);
	return io->buf ? 0 : -ENOMEM;
}

int wex__loop_emfile(struct wex_loop *l, int listen_fd)
{
	int fd;

	if (l->reserve_fd < 0 && !l->no_reserve)
		l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (l->reserve_fd < 0) {
		if (l->emfile_refused++ % 1000 == 0)
			wex_warn("loop", "out of file descriptors, none in reserve: new clients wait "
				 "(accepts paused, retried every %d ms)", WEX_LOOP_PAUSE_MS);
		return -1;
	}
	close(l->reserve_fd);
	fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0)
		close(fd);
	l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	/* Once per thousand: a burst of refusals must not flood the log. */
	if (l->emfile_refused++ % 1000 == 0)
		wex_warn("loop", "out of file descriptors: refused a client (%llu so far); "
			 "raise the limit (LimitNOFILE=) or find who holds them (wexctl clients)",
			 (unsigned long long)l->emfile_refused);
	return 1;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void wex__loop_pause(struct wex_loop *l, struct wex_loop_watch *w)
{
	l->paused = w;
	l->resume_ns = mono_ns() + WEX_LOOP_PAUSE_MS * 1000000ull;
}

int wex__loop_wait_ms(struct wex_loop *l, int timeout_ms)
{
	uint64_t now;
	int left;

	if (!l->paused)
		return timeout_ms;
	now = mono_ns();
	left = now >= l->resume_ns ? 0 : (int)((l->resume_ns - now + 999999) / 1000000);
	return timeout_ms < 0 || left < timeout_ms ? left : timeout_ms;
}

struct wex_loop_watch *wex__loop_resume_due(struct wex_loop *l)
{
	struct wex_loop_watch *w = l->paused;

	if (!w || mono_ns() < l->resume_ns)
		return NULL;
	l->paused = NULL;
	return w;
}

void wex__loop_fini_common(struct wex_loop *l)
{
	if (l->reserve_fd >= 0)
		close(l->reserve_fd);
	l->reserve_fd = -1;
}

void wex__loop_defer_free(struct wex_loop *l, struct wex_loop_io *io)
{
	io->next_free = l->free_list;
	l->free_list = io;
}

void wex__loop_reap(struct wex_loop *l)
{
	while (l->free_list) {
		struct wex_loop_io *io = l->free_list;

		l->free_list = io->next_free;
		if (io->pid.fd >= 0)
			close(io->pid.fd);
		io->pid.fd = -1;
		free(io->buf);
		io->buf = NULL;
		l->cbs.on_free(l->arg, io);
	}
}
