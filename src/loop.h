/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the daemon's single-threaded event loop, with an io_uring backend
 * (multishot accept, recvmsg with fds) and an epoll backend behind one table
 * of operations (redis ae.c).  The backend is chosen at start: io_uring
 * unless unavailable (containers often block it) or WEX_IO=epoll.
 *
 * The loop only receives.  Replies are sent by the caller with
 * MSG_DONTWAIT: a client has at most one request in flight, so its socket
 * buffer never fills unless it stops reading, and then it is dropped.
 */
#ifndef WEX_LOOP_H
#define WEX_LOOP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "ipc/sock.h"

enum {
	WEX_LOOP_KIND_LISTEN = 1,
	WEX_LOOP_KIND_CONN,
	WEX_LOOP_KIND_WATCH,
	WEX_LOOP_KIND_PID,
	WEX_LOOP_KIND_PROBE,
};

struct wex_loop_io;

/* io_uring: a request the ring had no room for (its submission queue full
 * and submitting it failing: EAGAIN under memory pressure, EBUSY while
 * completions overflow), queued here and retried at each turn of the loop
 * until it goes, so that no connection, watch or listener is left waiting
 * on nothing. */
struct wex_loop_retry {
	struct wex_loop_retry *next, *prev;
	int op;            /* the backend's: 0 when none waits */
	uint64_t since_ns; /* when it first found no room (CLOCK_MONOTONIC) */
};

/* A connection's peer process, watched through a pidfd for its exit: the
 * socket may outlive it (a child made with clone() without fork's
 * handlers, an fd passed on), and its leases and ranks must not. */
struct wex_loop_pid {
	int kind; /* first member, as in the io: WEX_LOOP_KIND_PID */
	int fd;   /* the pidfd, owned by the loop; -1 if not watched */
	int armed; /* io_uring: its poll is in flight */
	struct wex_loop_io *io;
	struct wex_loop_retry retry;
};

/* Per-connection receive state, embedded in the daemon's connection. */
struct wex_loop_io {
	int kind; /* first member: io_uring user_data points here */
	int fd;
	int closing;
	int inflight;
	void *owner;
	struct wex_loop_io *next_free;
	struct msghdr msg;
	struct iovec iov;
	char *buf;
	size_t buflen;
	union {
		char cbuf[WEX_SOCK_CBUF_LEN];
		struct cmsghdr align;
	} c;
	struct wex_loop_pid pid;
	struct wex_loop_retry retry;
};

/* A watched fd (listener or signalfd): callback when readable. */
struct wex_loop_watch {
	int kind;
	int fd;
	int armed;
	int stopped; /* listener: unlisten was called */
	void (*cb)(void *arg, int fd, int res);
	void *arg;
	struct wex_loop_retry retry;
	/* io_uring: accepts or polls queued so far; after the kernel dropped
	 * completions, a cancel (user_data &probe) finds out whether this
	 * watch's is still in the ring (the arms it saw: probe.gen). */
	unsigned gen;
	struct {
		int kind; /* WEX_LOOP_KIND_PROBE */
		unsigned gen;
	} probe;
};

struct wex_loop;

struct wex_loop_cbs {
	/* A connection was accepted: `fd` is close-on-exec, non-blocking
	 * under epoll and blocking under io_uring (its receives are the
	 * loop's; every send must pass MSG_DONTWAIT). */
	void (*on_accept)(void *arg, int fd);
	/* A message (len > 0), an orderly close (0) or an error (< 0).  fds
	 * belong to the callee.  mflags has MSG_TRUNC / MSG_CTRUNC. */
	void (*on_msg)(void *arg, struct wex_loop_io *io, ssize_t len, int *fds, int nfds,
		       int mflags);
	/* The io is no longer referenced by the loop and may be freed. */
	void (*on_free)(void *arg, struct wex_loop_io *io);
	/* The process watched with watch_pid has exited (called once, and
	 * never for an io being closed). */
	void (*on_peer_exit)(void *arg, struct wex_loop_io *io);
};

struct wex_loop_ops {
	const char *name;
	int (*init)(struct wex_loop *l, char *why, size_t len);
	int (*listen)(struct wex_loop *l, struct wex_loop_watch *w);
	int (*watch)(struct wex_loop *l, struct wex_loop_watch *w);
	int (*add)(struct wex_loop *l, struct wex_loop_io *io);
	void (*close)(struct wex_loop *l, struct wex_loop_io *io);
	/* Watches pidfd (which the loop then owns and closes with io, and
	 * closes at once on failure) for its process's exit: on_peer_exit. */
	int (*watch_pid)(struct wex_loop *l, struct wex_loop_io *io, int pidfd);
	/* Stops accepting on listener w for good; connections not accepted
	 * yet stay in the kernel's backlog (under socket activation, for the
	 * next wexd).  An accept already under way may still complete. */
	void (*unlisten)(struct wex_loop *l, struct wex_loop_watch *w);
	int (*run_once)(struct wex_loop *l, int timeout_ms);
	void (*fini)(struct wex_loop *l);
};

/* Events (epoll) or completions (io_uring) a turn of the loop handles, and
 * connections it accepts: the rest wait for the next turn, after wexd's
 * timers, so that no flood starves connected clients. */
#define WEX_LOOP_BATCH 64

struct wex_loop {
	const struct wex_loop_ops *ops;
	struct wex_loop_cbs cbs;
	void *arg;
	size_t msg_max;
	void *priv;
	struct wex_loop_io *free_list;
	char why_fallback[256]; /* why io_uring was not used, if it was not */
	int reserve_fd;         /* held for wex__loop_emfile, -1 if none */
	int no_reserve;         /* test hook (WEX_LOOP_NO_RESERVE=1): never hold one */
	uint64_t emfile_refused;
	struct wex_loop_watch *paused; /* listener paused by wex__loop_pause */
	uint64_t resume_ns;            /* CLOCK_MONOTONIC */
};

extern const struct wex_loop_ops wex__loop_epoll_ops;
extern const struct wex_loop_ops wex__loop_uring_ops;

/* Picks and initialises a backend: `which` is "auto", "io_uring" or
 * "epoll".  "auto" falls back to epoll, recording why; a forced backend that
 * fails is an error. */
int wex__loop_init(struct wex_loop *l, const char *which, size_t msg_max, char *err, size_t len);

/* Prepares io for a connected fd (allocates its buffer). */
int wex__loop_io_init(struct wex_loop *l, struct wex_loop_io *io, int fd, void *owner);

/* The listener's accept failed with EMFILE/ENFILE.  The pending connection
 * would keep the listener readable (epoll) or fail every accept at once
 * (io_uring): the loop would spin, logging each failure, and the client
 * would wait for good.  Frees the reserved fd, accepts on it and closes the
 * connection (the client sees it end), and reserves an fd again.  Returns 1
 * if it took a connection, 0 if none was waiting, -1 if there is no reserve
 * (another fd took its slot): the backend then pauses the listener with
 * wex__loop_pause.  Needs a non-blocking listener. */
int wex__loop_emfile(struct wex_loop *l, int listen_fd);
/* Marks listener w paused for WEX_LOOP_PAUSE_MS (the backend has stopped
 * watching it); the backend's run_once waits at most until then
 * (wex__loop_wait_ms) and resumes it when wex__loop_resume_due says so. */
#define WEX_LOOP_PAUSE_MS 100
void wex__loop_pause(struct wex_loop *l, struct wex_loop_watch *w);
int wex__loop_wait_ms(struct wex_loop *l, int timeout_ms);
/* The paused listener if its pause is over (then no longer marked), else
 * NULL. */
struct wex_loop_watch *wex__loop_resume_due(struct wex_loop *l);
/* Closes the reserved fd (backends' fini). */
void wex__loop_fini_common(struct wex_loop *l);

/* Defers on_free until the loop no longer touches the io. */
void wex__loop_defer_free(struct wex_loop *l, struct wex_loop_io *io);
void wex__loop_reap(struct wex_loop *l);

#endif
