/* SPDX-License-Identifier: MIT */
/*
 * helpers.h - shared pieces of the foundation tests (issue 2): start and
 * stop a private wexd, count fds, talk to wexd over a raw socket, and the
 * exit codes CTest understands (0 pass, 1 fail, 77 skip; liburing's
 * test/helpers.h).
 */
#ifndef WEX_TEST_HELPERS_H
#define WEX_TEST_HELPERS_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

/* Ends the test (from the test's main process: also kills the wexd it
 * started and removes its temp dir; from a forked child: only exits). */
void t_exit(int code) __attribute__((noreturn));

#define T_FAIL(...)                                                               \
	do {                                                                      \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
		fprintf(stderr, __VA_ARGS__);                                     \
		fputc('\n', stderr);                                              \
		t_exit(T_EXIT_FAIL);                                              \
	} while (0)

#define T_ASSERT(cond, ...)                                                       \
	do {                                                                      \
		if (!(cond)) {                                                    \
			fprintf(stderr, "FAIL %s:%d: (%s): ", __FILE__, __LINE__, \
				#cond);                                           \
			fprintf(stderr, __VA_ARGS__);                             \
			fputc('\n', stderr);                                      \
			t_exit(T_EXIT_FAIL);                                      \
		}                                                                 \
	} while (0)

#define T_SKIP(...)                                                               \
	do {                                                                      \
		fprintf(stderr, "SKIP: ");                                        \
		fprintf(stderr, __VA_ARGS__);                                     \
		fputc('\n', stderr);                                              \
		t_exit(T_EXIT_SKIP);                                              \
	} while (0)

/* A libwex call that must succeed: names the call, the code and the
 * client's last error. */
#define T_WEX(c, call)                                                            \
	do {                                                                      \
		int t_ret_ = (call);                                              \
		if (t_ret_ < 0)                                                   \
			T_FAIL("%s: %s: %s", #call, wex_strerror(t_ret_),         \
			       (c) ? wex_last_error(c) : "");                     \
	} while (0)

struct t_wexd {
	pid_t pid;
	char dir[256];
	char sock[300];
};

/* Starts wexd ($WEXD_BIN) in a fresh mkdtemp dir with WEX_SOCKET set (also
 * in this process's environment, so libwex finds it) and waits for its
 * "ready" line on a WEXD_READY_FD pipe.  Skips the test when WEXD_BIN is
 * unset.  Fails the test on error. */
void t_wexd_start(struct t_wexd *d);
/* Starts it again on the same socket (after t_wexd_kill). */
void t_wexd_restart(struct t_wexd *d);
/* SIGTERM, waitpid, asserts a clean exit 0, removes the temp dir. */
void t_wexd_stop(struct t_wexd *d);
/* SIGKILL + waitpid (the socket file stays, as after a crash). */
void t_wexd_kill(struct t_wexd *d);

/* Removes wexd's lease journal (<sock>.leases, journal.h) with what it
 * holds, as if it could not be written; returns the records removed. */
int t_journal_wipe(struct t_wexd *d);

/* Open fds of pid (/proc/PID/fd); fails the test on error. */
int t_fd_count(pid_t pid);
/* Raises this process's soft limit on open files to n where it is lower
 * (a runner's ulimit -n 256); skips (77) where the hard limit is. */
void t_nofile_at_least(unsigned n);

/* wexd's fd count once it settles at `want` (disconnects are processed
 * asynchronously: polls with ping round trips on a connection of its own,
 * kept open until t_wexd_stop/kill and so counted in every reading; no
 * sleeps; up to 5 s); want < 0: after one round trip.  Returns the last
 * count seen. */
int t_wexd_fds_settle(struct t_wexd *d, int want);

/* Raw socket: connect; send arbitrary bytes with fds; receive one reply as
 * JSON (fails the test if none comes within 10 s or it is not JSON). */
int t_raw_connect(const char *sock);
void t_raw_send(int fd, const void *buf, size_t len, const int *fds, int nfds);
json_t *t_raw_recv(int fd);
json_t *t_raw_rpc(int fd, const char *json, const int *fds, int nfds);
/* A raw connection that said hello as a producer of `model` with `world`
 * ranks (answered OK, or the test fails): wide worlds make large statuses. */
int t_raw_producer(const char *sock, const char *model, unsigned world);
/* For a stand-in for wexd on a thread: waits for the next request on
 * connection fd, closes any fds it carried and puts its "op" in op.  1: a
 * request; -1: the client hung up, *stop was set, or *drop (if drop) was
 * set (cleared then): the stand-in hangs up. */
int t_stand_in_request(int fd, atomic_int *stop, atomic_int *drop, char *op, size_t oplen);
/*
 * A relay between libwex and wexd: clients connect to `path`, and a thread
 * per connection passes every message, fds and all, to and from wexd's
 * socket `up`, but for what the test asks (each an atomic it sets):
 *  - swallow: wexd's answer to the next publish (not a restore) is
 *    dropped (swallowed counts them);
 *  - stall: the next connection's requests after its hello are held (not
 *    read; stalled is set once one is) until stall is cleared;
 *  - cut: bumping it closes every connection open then (wexd sees the
 *    client leave, then the client sees wexd hang up).
 * A client's hang-up reaches wexd before any connection the relay takes
 * after it (as it would without the relay: wexd gives a rank to a new
 * connection only once the old one's client is gone).
 */
#define T_RELAY_MAX 64
struct relay_pair;
struct t_relay {
	char path[108];
	const char *up;
	int lfd;
	pthread_t th;
	pthread_mutex_t lock;
	struct relay_pair *open[T_RELAY_MAX]; /* under lock */
	atomic_int stop, swallow, swallowed, stall, stalled, cut, pairs;
};
void t_relay_start(struct t_relay *r, const char *up, const char *path);
void t_relay_stop(struct t_relay *r);
/* Runs `$WEXCTL_BIN args` (args split by the shell) against the wexd of
 * $WEX_SOCKET and puts its stdout, NUL-terminated, in out; fails the test
 * unless it exits 0. */
void t_wexctl(const char *args, char *out, size_t len);
/* "OK" for {"ok":true}, else the error code string (owned by reply). */
const char *t_code(json_t *reply);
const char *t_msg(json_t *reply);

/* xorshift64 for seeded randomized tests: advances *state (never 0) and
 * returns the new value modulo n. */
static inline uint32_t t_rand(uint64_t *state, uint32_t n)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return (uint32_t)(*state % n);
}

/* A seeded randomized test's seed and length: $<prefix>_SEED (replays a
 * schedule) else one from the clock, $<prefix>_SECS else `secs`; printed
 * with how to replay it. */
unsigned long long t_seed(const char *prefix, double *secs);

/* Files in the lease journal of the wexd listening at `sock` (its
 * SOCK.leases directory), -1 where there is none; `held`: only records of
 * leases or takes held (a record whose lease ended stays, marked so, while
 * its connection lives). */
int t_journal_files(const char *sock, int held);

/* One status request on a fresh connection (new reference). */
json_t *t_status(const char *sock);
/* Asserts that status reports the backend named by $WEX_IO (if set). */
void t_check_backend(const char *sock);
/* The model object named `model` in a status reply (borrowed) or NULL. */
json_t *t_status_model(json_t *status, const char *model);
/* Total leases of `model` per status (0 if the model is gone). */
int t_leases(const char *sock, const char *model);
/* wexd's status daemon.exit_watch (how it watches clients' processes),
 * malloc'd. */
char *t_exit_watch(const char *sock);

/* Children that t_exit kills (SIGKILL) when the test fails early. */
void t_track_child(pid_t pid);
/* Forgets a child the caller reaped itself (t_wait does this). */
void t_untrack_child(pid_t pid);
/* fork() that tracks the child; the child's t_exit only exits. */
pid_t t_fork(void);
/* waitpid; returns the exit code, or 128+signal. */
int t_wait(pid_t pid);

/* Monotonic seconds. */
double t_now(void);

struct wex_tensor;
/* *t = a 1-D uint8 tensor `name` of n bytes at `off` in segment `seg`. */
void t_u8_tensor(struct wex_tensor *t, const char *name, uint64_t n, uint32_t seg, uint64_t off);

#endif
