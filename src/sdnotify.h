/* SPDX-License-Identifier: MIT */
/*
 * sdnotify.h - the little of systemd that wexd uses: readiness, watchdog,
 * stopping and status notifications (sd_notify), and a listening socket
 * passed by socket activation (wexd.socket).
 *
 * Through libsystemd where WEX_HAVE_SYSTEMD is defined (the wexd target
 * when libsystemd was found); otherwise sdnotify.c speaks the protocol
 * itself, so that a wexd built without libsystemd-dev still works under
 * the shipped units (Type=notify, WatchdogSec=, wexd.socket).  Outside a
 * unit (no $NOTIFY_SOCKET, no LISTEN_FDS) the calls are no-ops that return
 * 0 (-1 for wex__sd_listen_fd), so wexd runs the same outside systemd.
 * Each notification is one datagram on a local socket, sent without
 * waiting (never through libsystemd's sd_notify, which waits while the
 * manager's queue is full): a manager that does not read cannot stall
 * wexd's loop.  While its queue is full, the calls return -EAGAIN; changes
 * of state (ready, reloading, stopping) are then held back, in order, for
 * wex__sd_flush, and status and watchdog pings are skipped (the next one
 * stands for them).
 */
#ifndef WEX_SDNOTIFY_H
#define WEX_SDNOTIFY_H

#include <stdint.h>

/* READY=1 (after the socket listens); returns >0 sent, 0 not under systemd,
 * or a negative errno (-EAGAIN: held back, see above).  The others return
 * the same. */
int wex__sd_ready(void);

/* RELOADING=1 before a SIGHUP reload; call wex__sd_ready() when done. */
int wex__sd_reloading(void);

/* WATCHDOG=1; call at least every wex__sd_watchdog_usec()/2. */
int wex__sd_watchdog(void);

/* The unit's watchdog interval in microseconds, 0 when not asked for
 * (WatchdogSec= unset, or not under systemd). */
uint64_t wex__sd_watchdog_usec(void);

/* STOPPING=1 when a SIGTERM drain begins. */
int wex__sd_stopping(void);

/* STATUS=<text>, shown by systemctl status (e.g. "3 clients, 2 models"). */
int wex__sd_status(const char *text);

/* Sends the changes of state held back while the manager's queue was full,
 * oldest first, as far as it takes them now; returns how many are still
 * held.  Never blocks; call it now and then (wexd's tick). */
int wex__sd_flush(void);

/*
 * Returns the AF_UNIX SOCK_SEQPACKET listening socket systemd passed
 * (LISTEN_FDS), which the caller then owns; -1 when none was passed: bind
 * your own socket; another negative errno
 * (-ENOTSOCK) when systemd passed fds but none of them is such a socket: a
 * broken wexd.socket, so exit rather than bind over systemd's path.
 * Clears the LISTEN_* variables so children do not inherit them.  Passed
 * fds of other kinds are logged and closed.
 */
int wex__sd_listen_fd(void);

#endif
