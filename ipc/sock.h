/* SPDX-License-Identifier: MIT */
/*
 * ipc/sock.h - the control socket: AF_UNIX SOCK_SEQPACKET, one message per
 * record, fds as SCM_RIGHTS, peer credentials from SO_PEERCRED, and sealed
 * memfds for tables too large for a message.  Includes nothing from src/.
 */
#ifndef WEX_IPC_SOCK_H
#define WEX_IPC_SOCK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Most fds one message may carry (the kernel's SCM_MAX_FD is 253). */
#define WEX_SOCK_MAX_FDS 64
/* Control buffer size: room for WEX_SOCK_MAX_FDS fds plus the SCM_INQ or
 * credentials the kernel may append. */
#define WEX_SOCK_CBUF_LEN (CMSG_SPACE(sizeof(int) * WEX_SOCK_MAX_FDS) + CMSG_SPACE(64))

/* Takes the daemon's lock on `path` before it checks for a stale socket
 * there: an exclusive flock on "<path>.lock" (the file made with mode
 * 0600 if missing, the parent directory 0755; the file stays when the
 * daemon exits: removing it would let two daemons lock two files), with
 * the holder's pid written in it.
 * Two daemons started at once over one stale socket would otherwise both
 * find it stale, and the later would remove the earlier's new socket.
 * Returns the fd, to keep open while the daemon runs, or -errno: -EADDRINUSE
 * when another process holds it (*holder: its pid, 0 if not yet written),
 * -EPERM when the file is not a regular file of this user's (-EACCES:
 * the directory refuses this user); *step (if not NULL) names the step
 * that failed. */
int wex_sock_lock(const char *path, pid_t *holder, const char **step);

/* Creates the listening socket at `path` (parent directory made 0755 if
 * missing; a stale socket file is replaced, any other file there is left
 * alone: -EEXIST), non-blocking, close-on-exec, chmod `mode`, chown to
 * `gid` unless (gid_t)-1.  Returns the fd or -errno; *step (if step is not
 * NULL) names the step that failed: "path", "mkdir of its directory",
 * "socket", "check for a running daemon", "check for a stale socket",
 * "bind", "chmod", "chown" or "listen". */
int wex_sock_listen(const char *path, int mode, gid_t gid, const char **step);

/* Connects to `path`; returns a blocking close-on-exec fd or -errno.
 * Blocks only for the connect. */
int wex_sock_connect(const char *path);

/* The same in two steps, for a caller that must know of the fd before it
 * blocks: a new unconnected close-on-exec socket (or -errno), then its
 * connect to `path` (0 or -errno; the fd stays the caller's and blocking
 * either way).  A connect waits only while the listener's queue is full
 * (a hung daemon): for as long as it takes when `wait_ms` < 0, else for
 * at most wait_ms (0: not at all), then -EAGAIN. */
int wex_sock_new(void);
int wex_sock_connect_fd(int fd, const char *path, int wait_ms);
/* The same, but a signal handled while it waits for room ends the wait:
 * -EINTR (wex_sock_connect_fd tries again for what is left of it). */
int wex_sock_connect_fd_intr(int fd, const char *path, int wait_ms);

/* Sends one message with `nfds` fds (not taken: the caller keeps them).
 * `flags` adds to MSG_NOSIGNAL (e.g. MSG_DONTWAIT).  Returns bytes or
 * -errno.  Blocks unless MSG_DONTWAIT. */
ssize_t wex_sock_send(int fd, const void *buf, size_t len, const int *fds, int nfds, int flags);

/* Receives one message into buf (at most `len` bytes) and up to `maxfds`
 * fds into fds[] (*nfds set; the caller owns them).  *mflags receives
 * msg_flags (MSG_TRUNC, MSG_CTRUNC).  Returns bytes, 0 on orderly close, or
 * -errno.  Blocks unless `flags` has MSG_DONTWAIT. */
ssize_t wex_sock_recv(int fd, void *buf, size_t len, int *fds, int maxfds, int *nfds, int *mflags,
		      int flags);

/* Collects the SCM_RIGHTS fds of a received msghdr into fds[] (at most
 * maxfds; extra fds are closed and -EMSGSIZE returned after the others are
 * stored).  Used by both the blocking path and io_uring completions. */
int wex_sock_take_fds(struct msghdr *msg, int *fds, int maxfds, int *nfds);

/* SO_PEERCRED of a connected socket. */
int wex_sock_peercred(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* The supplementary groups the peer's process held when it connected
 * (SO_PEERGROUPS, Linux 4.13): a malloc'd array in *groups (NULL when
 * there are none) and their count, or -errno (-ENOPROTOOPT: a kernel
 * without it). */
int wex_sock_peergroups(int fd, gid_t **groups);

/* A pidfd (close-on-exec) for the process at the other end of a connected
 * socket, readable once it has exited: SO_PEERPIDFD (Linux 6.5), which
 * names the very process that connected, else pidfd_open(pid) (5.3) on
 * pid from SO_PEERCRED, only where the kernel lacks the option.  *how
 * says which.  -ESRCH: that process is gone already (reaped); -ENOENT:
 * its pid is not visible here (another pid namespace); -EMFILE/-ENFILE:
 * no fd for it; other errors are pidfd_open's (ENOSYS, EPERM under a
 * seccomp filter). */
int wex_sock_peer_pidfd(int fd, pid_t pid, const char **how);

/* The same shared memory as fd (a memfd, a tmpfs or hugetlbfs file: it
 * has seals) opened again read-only through /proc/self/fd, to pass on to
 * other processes where fd allows writing: the new fd (close-on-exec), or
 * -EALREADY where none is needed (fd is read-only, or not shared memory:
 * other files are left alone, as an open on FUSE asks its server), or the
 * open's -errno (a file of another user this one may not open). */
int wex_sock_fd_readonly(int fd);

/* Closes fds[0..n) and sets each to -1. */
void wex_sock_close_fds(int *fds, int n);

/* The same for fds a client passed (wexd): without waiting on another
 * process.  Closing a file on a FUSE mount waits for its server to answer
 * the FLUSH that every close sends: for good if that server is the client
 * that passed the fd and never answers (wexd's loop stood still: every
 * client went unanswered); the last close of a socket with SO_LINGER waits
 * up to its linger time.  Such fds (regular files other than shared
 * memory, sockets that linger) are closed in turn by one thread started
 * for them (one that waits holds up only the others queued behind it);
 * the others (memfds, pipes, unix sockets) at once. */
void wex_sock_close_nowait(int fd);
void wex_sock_close_fds_nowait(int *fds, int n);

/* Makes a sealed memfd holding `len` bytes of `data` (seals: write, grow,
 * shrink, seal), so a receiver can trust it cannot change.  Returns the fd
 * or -errno. */
int wex_table_seal(const void *data, size_t len, const char *name);
/* The same, calling step() after each 8 MiB written (wexd pings its
 * watchdog there: a plan of millions of ops is hundreds of MB). */
int wex_table_seal_step(const void *data, size_t len, const char *name, void (*step)(void));

/* Maps a received table memfd read-only after checking that it is sealed
 * against writes and resizing and at most `max` bytes.  data and len receive
 * the mapping (unmap with wex_table_unmap).  Does not take the fd.
 * Errors: -EPERM (not sealed), -EMSGSIZE (too large), -EINVAL. */
int wex_table_map(int fd, size_t max, const void **data, size_t *len);
void wex_table_unmap(const void *data, size_t len);

/* Number of open fds of this process (for leak checks). */
int wex_fd_count(pid_t pid);

/* 1 if this process cannot open another fd (EMFILE or ENFILE). */
int wex_fd_exhausted(void);

#endif
