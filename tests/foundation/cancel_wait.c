/* SPDX-License-Identifier: MIT */
/*
 * cancel_wait - proves that wex_cancel ends a call's wait for wexd, and
 * only that:
 *
 *  - idle: with no call running it returns 0, and the next sync (of a
 *    version already published) is not cancelled;
 *  - acquire: a copy sync waiting for v2 in a thread returns -ECANCELED
 *    within a second of wex_cancel (which returns 1), naming the wait;
 *    wexd no longer lists the client as waiting, and the same connection
 *    (same client id: no reconnect) then copies v2 whole;
 *  - lease: a view sync holding v2's lease, then waiting for v3, is
 *    cancelled: the lease is given up (status shows none), as after a
 *    timeout, so the producer's begin_write goes at once;
 *  - signal: wex_cancel from a SIGALRM handler ends the wait;
 *  - eintr: a signal to the waiting thread, whose handler does nothing,
 *    ends the wait of a client opened with WEX_CLIENT_EINTR (-EINTR,
 *    wexd's wait over) and not that of one without (its timeout); also
 *    one that comes as the acquire goes out, before the wait's poll
 *    (held until the poll takes it); a wait both wex_cancel and a signal
 *    ended returns -ECANCELED (the cancel is reported);
 *  - begin_write: a producer waiting for a consumer's lease is cancelled
 *    (-ECANCELED, nothing begun: a publish is refused); wexd no longer
 *    counts its pending write, so another consumer's acquire of the
 *    version already published is served at once instead of queueing
 *    behind the writer; begin_write works again once the lease ends;
 *  - late: a cancel that crosses wexd's answer (made as the acquire goes
 *    out, for a version already published: the cancel goes too, and
 *    wexd, no longer waiting, ignores it) or that comes after the wait
 *    (as the copy's release goes out: no cancel is sent) returns 1 and
 *    changes nothing: the sync copies its version whole, the replies
 *    stay paired with their requests on the same connection, and the
 *    next sync that waits is not cancelled by the leftover wake-up;
 *    wex_request "cancel" is refused (wexd would never answer it);
 *  - protocol: a "cancel" on a connection where nothing waits gets no
 *    reply (before hello and after), and the next request's reply is its
 *    own;
 *  - old wexd: against a stand-in whose hello does not offer cancels,
 *    wex_cancel of a waiting sync returns -EOPNOTSUPP, sends nothing,
 *    and the sync gets the stand-in's own answer.
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "fixture.h"
#include "ipc/sock.h"
#include "proto.h"

#define MODEL "cancel"

static struct t_wexd d;

/* sendmsg interposed (libwex.so's calls too): at the next request whose op
 * is cancel_at, wex_cancel(cancel_client) first (its return in
 * cancel_ret); the "cancel" messages this process sends are counted. */
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
static sendmsg_fn real_sendmsg;
static const char *_Atomic cancel_at;
/* At the next request whose op is kill_at: SIGUSR1 to the sending thread
 * first. */
static const char *_Atomic kill_at;
static wex_client_t *cancel_client;
static atomic_int cancel_ret, cancels_sent;

static int is_op(const void *buf, size_t len, const char *want)
{
	json_t *j = json_loadb(buf, len, 0, NULL);
	const char *op = NULL;
	int hit;

	json_unpack(j, "{s?s}", "op", &op);
	hit = op && !strcmp(op, want);
	json_decref(j);
	return hit;
}

__attribute__((visibility("default"))) ssize_t sendmsg(int fd, const struct msghdr *msg,
							 int flags)
{
	if (!real_sendmsg)
		real_sendmsg = (sendmsg_fn)(uintptr_t)dlsym(RTLD_NEXT, "sendmsg");
	if (msg->msg_iovlen == 1) {
		const void *buf = msg->msg_iov[0].iov_base;
		size_t len = msg->msg_iov[0].iov_len;
		const char *at = atomic_load(&cancel_at);

		const char *k = atomic_load(&kill_at);

		if (is_op(buf, len, "cancel"))
			atomic_fetch_add(&cancels_sent, 1);
		if (at && is_op(buf, len, at)) {
			atomic_store(&cancel_at, NULL);
			atomic_store(&cancel_ret, wex_cancel(cancel_client));
		}
		if (k && is_op(buf, len, k)) {
			atomic_store(&kill_at, NULL);
			pthread_kill(pthread_self(), SIGUSR1);
		}
	}
	return real_sendmsg(fd, msg, flags);
}

struct syncer {
	wex_client_t *c;
	int mode;
	uint64_t min_version;
	int ret;
	double seconds;
	char err[512];
	pthread_t th;
};

static void *sync_main(void *arg)
{
	struct syncer *s = arg;
	struct wex_sync_result r;
	double t0 = t_now();

	s->ret = wex_sync(s->c, s->mode, s->min_version, 20000, &r);
	s->seconds = t_now() - t0;
	snprintf(s->err, sizeof(s->err), "%s", wex_last_error(s->c));
	return NULL;
}

static void sync_start(struct syncer *s, wex_client_t *c, int mode, uint64_t min_version)
{
	memset(s, 0, sizeof(*s));
	s->c = c;
	s->mode = mode;
	s->min_version = min_version;
	T_ASSERT(pthread_create(&s->th, NULL, sync_main, s) == 0, "pthread_create");
}

/* The id of the client of `role` ("consumer@group": of that group only)
 * with this pid that wexd lists, and whether it waits ("acquire",
 * "begin_write" or ""). */
static long client_state(const char *role, char *waiting, size_t len)
{
	const char *at = strchr(role, '@');
	size_t rlen = at ? (size_t)(at - role) : strlen(role);
	json_t *r, *c;
	size_t i;
	long id = -1;
	int fd = t_raw_connect(d.sock);

	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"clients\"}", NULL, 0);
	snprintf(waiting, len, "?");
	json_array_foreach(json_object_get(r, "clients"), i, c) {
		const char *cr = json_string_value(json_object_get(c, "role")) ?: "";

		if (strlen(cr) != rlen || strncmp(cr, role, rlen) ||
		    json_integer_value(json_object_get(c, "pid")) != getpid() ||
		    (at && strcmp(json_string_value(json_object_get(c, "group")) ?: "", at + 1)))
			continue;
		id = (long)json_integer_value(json_object_get(c, "id"));
		snprintf(waiting, len, "%s", json_string_value(json_object_get(c, "waiting")) ?: "");
	}
	json_decref(r);
	close(fd);
	return id;
}

/* Polls wexd until the client of `role` waits (`what`); returns its id. */
static long wait_for_waiting(const char *role, const char *what)
{
	char w[32] = "";
	long id = -1;

	for (double t0 = t_now(); t_now() - t0 < 10.0; usleep(5000)) {
		id = client_state(role, w, sizeof(w));
		if (!strcmp(w, what))
			return id;
	}
	T_FAIL("wexd never listed the %s waiting in %s (last: '%s')", role, what, w);
}

static void case_idle_and_acquire(struct t_prod *p, struct t_cons *k)
{
	struct wex_sync_result r;
	struct syncer s;
	char w[32];
	long id, id2;
	double t0;

	T_ASSERT(wex_cancel(k->c) == 0, "cancel with nothing running: 0");
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && t_own_bad(k, 1) == 0, "the sync after an idle cancel copies v1");

	sync_start(&s, k->c, WEX_SYNC_COPY, 2);
	id = wait_for_waiting("consumer", "acquire");
	t0 = t_now();
	T_ASSERT(wex_cancel(k->c) == 1, "cancel of a waiting sync: 1");
	pthread_join(s.th, NULL);
	printf("acquire cancelled after %.3f s: %s\n", t_now() - t0, s.err);
	T_ASSERT(s.ret == -ECANCELED, "the waiting sync returns -ECANCELED, got %s: %s",
		 wex_strerror(s.ret), s.err);
	T_ASSERT(t_now() - t0 < 1.0, "within a second of the cancel (%.3f s)", t_now() - t0);
	T_ASSERT(strstr(s.err, "acquire v2") && strstr(s.err, "cancelled by the client"),
		 "the error names the wait: %s", s.err);
	T_ASSERT(t_own_bad(k, 1) == 0, "the weights still hold v1 whole");
	T_ASSERT(wex_is_dirty(k->c) == 0, "not dirty");
	id2 = client_state("consumer", w, sizeof(w));
	T_ASSERT(id2 == id && !strcmp(w, ""), "same connection (id %ld, was %ld), not waiting ('%s')",
		 id2, id, w);

	t_prod_write(p, 2);
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(k, 2) == 0, "then v2 is copied whole");
	T_ASSERT(client_state("consumer", w, sizeof(w)) == id, "still the same connection");
	T_ASSERT(wex_cancel(k->c) == 0, "cancel after the sync returned: 0");
}

static void case_lease(struct t_prod *p, struct t_cons *k)
{
	struct wex_sync_result r;
	struct syncer s;

	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(t_leases(d.sock, MODEL) == 1, "the view sync holds a lease");
	sync_start(&s, k->c, WEX_SYNC_REMAP_VIEW, 3);
	wait_for_waiting("consumer", "acquire");
	T_ASSERT(wex_cancel(k->c) == 1, "cancel of a waiting view sync: 1");
	pthread_join(s.th, NULL);
	T_ASSERT(s.ret == -ECANCELED, "-ECANCELED, got %s: %s", wex_strerror(s.ret), s.err);
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "the lease was given up");
	T_ASSERT(wex_release(k->c) == -ENOENT, "the client holds no lease either");
	T_WEX(p->c, wex_begin_write(p->c, 3, 1000));
	ex_fill(p->base, p->t, (size_t)p->n, 3, 1);
	T_WEX(p->c, wex_publish(p->c, 3));
}

static wex_client_t *alarm_client;
static atomic_int alarm_ret = 99;

static void on_alarm(int sig)
{
	(void)sig;
	atomic_store(&alarm_ret, wex_cancel(alarm_client));
}

static void case_signal(struct t_cons *k)
{
	struct sigaction sa = { .sa_handler = on_alarm };
	struct itimerval it = { .it_value = { .tv_usec = 300000 } };
	struct wex_sync_result r;
	double t0 = t_now();
	int ret;

	alarm_client = k->c;
	sigemptyset(&sa.sa_mask);
	T_ASSERT(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
	T_ASSERT(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
	ret = wex_sync(k->c, WEX_SYNC_COPY, 4, 20000, &r);
	printf("signal: sync returned %s after %.3f s\n", wex_strerror(ret), t_now() - t0);
	T_ASSERT(atomic_load(&alarm_ret) == 1, "wex_cancel in the handler returned %d",
		 atomic_load(&alarm_ret));
	T_ASSERT(ret == -ECANCELED, "the sync the handler cancelled: %s: %s", wex_strerror(ret),
		 wex_last_error(k->c));
	T_ASSERT(t_now() - t0 < 5.0, "ended by the cancel, not its 20 s timeout (%.3f s)",
		 t_now() - t0);
	signal(SIGALRM, SIG_DFL);
}

static void on_nothing(int sig)
{
	(void)sig;
}

struct kicker {
	pthread_t target, th;
	const char *role;
};

/* Sends SIGUSR1 to the target thread once wexd lists the client of
 * this role waiting. */
static void *kick_main(void *arg)
{
	struct kicker *k = arg;

	wait_for_waiting(k->role, "acquire");
	pthread_kill(k->target, SIGUSR1);
	return NULL;
}

static void case_eintr(struct t_cons *k)
{
	sigset_t after;
	struct sigaction sa = { .sa_handler = on_nothing };
	struct kicker kk = { .target = pthread_self(), .role = "consumer@g" };
	struct wex_sync_result r;
	struct t_cons ke;
	char w[32];
	double t0;
	int ret;

	sigemptyset(&sa.sa_mask);
	T_ASSERT(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
	/* Without the flag: the signal ends nothing. */
	T_ASSERT(pthread_create(&kk.th, NULL, kick_main, &kk) == 0, "pthread_create");
	t0 = t_now();
	ret = wex_sync(k->c, WEX_SYNC_COPY, 100, 1000, &r);
	pthread_join(kk.th, NULL);
	T_ASSERT(ret == -ETIMEDOUT && t_now() - t0 >= 0.95,
		 "without WEX_CLIENT_EINTR the sync waits its 1 s: %s after %.3f s",
		 wex_strerror(ret), t_now() - t0);

	t_client_flags = WEX_CLIENT_EINTR;
	t_cons_open(&ke, MODEL, "eintr", "tiny", 0, 1);
	t_client_flags = 0;
	kk.role = "consumer@eintr";
	T_ASSERT(pthread_create(&kk.th, NULL, kick_main, &kk) == 0, "pthread_create");
	t0 = t_now();
	ret = wex_sync(ke.c, WEX_SYNC_COPY, 100, 20000, &r);
	pthread_join(kk.th, NULL);
	printf("eintr: sync returned %s after %.3f s: %s\n", wex_strerror(ret), t_now() - t0,
	       wex_last_error(ke.c));
	T_ASSERT(ret == -EINTR, "with WEX_CLIENT_EINTR: -EINTR, got %s: %s", wex_strerror(ret),
		 wex_last_error(ke.c));
	T_ASSERT(t_now() - t0 < 5.0, "not its 20 s timeout (%.3f s)", t_now() - t0);
	T_ASSERT(strstr(wex_last_error(ke.c), "interrupted by a signal") &&
		 strstr(wex_last_error(ke.c), "cancelled by the client"),
		 "the error says why: %s", wex_last_error(ke.c));
	client_state("consumer@eintr", w, sizeof(w));
	T_ASSERT(!strcmp(w, ""), "wexd's wait is over ('%s')", w);
	T_ASSERT(wex_cancel(ke.c) == 0 && wex_is_dirty(ke.c) == 0, "nothing runs, not dirty");
	/* A signal before the wait's poll (as the acquire goes out). */
	atomic_store(&kill_at, "acquire");
	t0 = t_now();
	ret = wex_sync(ke.c, WEX_SYNC_COPY, 100, 20000, &r);
	T_ASSERT(atomic_load(&kill_at) == NULL, "the signal was sent");
	T_ASSERT(ret == -EINTR && t_now() - t0 < 5.0,
		 "a signal before the poll ends the wait too: %s after %.3f s: %s",
		 wex_strerror(ret), t_now() - t0, wex_last_error(ke.c));
	/* Both a wex_cancel and a signal (its handler cancels, in the
	 * wait's poll): the cancel is reported. */
	sa.sa_handler = on_alarm;
	alarm_client = ke.c;
	atomic_store(&alarm_ret, 99);
	T_ASSERT(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
	atomic_store(&kill_at, "acquire");
	ret = wex_sync(ke.c, WEX_SYNC_COPY, 100, 20000, &r);
	T_ASSERT(atomic_load(&kill_at) == NULL && atomic_load(&alarm_ret) == 1,
		 "the signal was sent, its handler cancelled (%d)", atomic_load(&alarm_ret));
	T_ASSERT(ret == -ECANCELED, "cancelled and signalled: -ECANCELED, got %s: %s",
		 wex_strerror(ret), wex_last_error(ke.c));
	T_ASSERT(pthread_sigmask(SIG_BLOCK, NULL, &after) == 0 && sigismember(&after, SIGUSR1) == 0 &&
		 sigismember(&after, SIGINT) == 0 && sigismember(&after, SIGCHLD) == 0,
		 "the thread's signal mask is as it was (nothing left held)");
	T_WEX(ke.c, wex_sync(ke.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(t_own_bad(&ke, r.version) == 0, "then it syncs v%llu whole",
		 (unsigned long long)r.version);
	t_cons_close(&ke);
	signal(SIGUSR1, SIG_DFL);
}

struct writer {
	wex_client_t *c;
	int ret;
	char err[512];
	pthread_t th;
};

static void *write_main(void *arg)
{
	struct writer *w = arg;

	w->ret = wex_begin_write(w->c, 4, 20000);
	snprintf(w->err, sizeof(w->err), "%s", wex_last_error(w->c));
	return NULL;
}

static void case_begin_write(struct t_prod *p, struct t_cons *k)
{
	struct wex_sync_result r;
	struct writer w = { .c = p->c };
	struct t_cons k2;
	double t0;
	int ret;

	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_REMAP_VIEW, 3, 5000, &r));
	T_ASSERT(pthread_create(&w.th, NULL, write_main, &w) == 0, "pthread_create");
	wait_for_waiting("producer", "begin_write");
	t0 = t_now();
	T_ASSERT(wex_cancel(p->c) == 1, "cancel of a waiting begin_write: 1");
	pthread_join(w.th, NULL);
	printf("begin_write cancelled after %.3f s: %s\n", t_now() - t0, w.err);
	T_ASSERT(w.ret == -ECANCELED, "-ECANCELED, got %s: %s", wex_strerror(w.ret), w.err);
	T_ASSERT(strstr(w.err, "begin_write v4") && strstr(w.err, "cancelled by the client"),
		 "the error names the wait: %s", w.err);
	ret = wex_publish(p->c, 4);
	T_ASSERT(ret < 0, "nothing was begun: publish v4 refused (%s)", wex_strerror(ret));

	/* A writer waiting would hold new readers back (writer priority):
	 * the cancelled one no longer does. */
	t_cons_open(&k2, MODEL, "other", "tiny", 0, 1);
	t0 = t_now();
	T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 3, 5000, &r));
	T_ASSERT(r.version == 3 && t_own_bad(&k2, 3) == 0, "another group copies v3");
	T_ASSERT(r.waited < 0.5, "at once, not behind the cancelled writer (waited %.3f s)",
		 r.waited);
	t_cons_close(&k2);

	T_WEX(k->c, wex_release(k->c));
	T_WEX(p->c, wex_begin_write(p->c, 4, 2000));
	ex_fill(p->base, p->t, (size_t)p->n, 4, 1);
	T_WEX(p->c, wex_publish(p->c, 4));
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 4, 5000, &r));
	T_ASSERT(r.version == 4 && t_own_bad(k, 4) == 0, "v4 copied after the cancelled write");
}

/* Publishes v, then copy-syncs it with a wex_cancel made as its request
 * `op` goes out, which must return 1; returns the cancels sent before. */
static int late_sync(struct t_prod *p, struct t_cons *k, uint64_t v, const char *op,
		     struct wex_sync_result *r)
{
	int sent;

	t_prod_write(p, v);
	cancel_client = k->c;
	atomic_store(&cancel_ret, 99);
	sent = atomic_load(&cancels_sent);
	atomic_store(&cancel_at, op);
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, v, 5000, r));
	T_ASSERT(atomic_load(&cancel_ret) == 1, "cancel as the %s went: 1, got %d", op,
		 atomic_load(&cancel_ret));
	return sent;
}

static void case_late(struct t_prod *p, struct t_cons *k)
{
	struct wex_sync_result r;
	struct syncer s;
	char w[32], *st = NULL;
	long id = client_state("consumer", w, sizeof(w));
	int sent;

	/* Crossing the answer. */
	sent = late_sync(p, k, 5, "acquire", &r);
	T_ASSERT(atomic_load(&cancels_sent) == sent + 1, "the cancel went to wexd (%d sent)",
		 atomic_load(&cancels_sent) - sent);
	T_ASSERT(r.version == 5 && r.changed && t_own_bad(k, 5) == 0, "v5 copied whole");
	T_WEX(k->c, wex_request(k->c, "status", NULL, &st));
	T_ASSERT(strstr(st, "\"models\"") && !strstr(st, "ECANCELED"),
		 "the next request gets its own reply: %.200s", st);
	free(st);
	T_ASSERT(client_state("consumer", w, sizeof(w)) == id, "same connection");

	/* After the wait: no cancel is sent. */
	sent = late_sync(p, k, 6, "release", &r);
	T_ASSERT(atomic_load(&cancels_sent) == sent, "no cancel was sent after the wait");
	T_ASSERT(r.version == 6 && t_own_bad(k, 6) == 0, "v6 copied whole");

	/* The wake-up left by it cancels no later wait. */
	sync_start(&s, k->c, WEX_SYNC_COPY, 7);
	wait_for_waiting("consumer", "acquire");
	usleep(100000);
	t_prod_write(p, 7);
	pthread_join(s.th, NULL);
	T_ASSERT(s.ret == 0, "the next sync waits and copies v7: %s: %s", wex_strerror(s.ret), s.err);
	T_ASSERT(t_own_bad(k, 7) == 0 && client_state("consumer", w, sizeof(w)) == id,
		 "v7 whole, same connection");
	T_ASSERT(atomic_load(&cancels_sent) == sent, "no cancel was sent");

	T_ASSERT(wex_request(k->c, "cancel", NULL, &st) == -EINVAL &&
		 strstr(wex_last_error(k->c), "wex_cancel"),
		 "wex_request 'cancel' refused: %s", wex_last_error(k->c));
}

/* No reply to a "cancel" that finds nothing waiting. */
static void no_reply(int fd, const char *when)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	json_t *r;

	t_raw_send(fd, "{\"v\":1,\"op\":\"cancel\"}", 21, NULL, 0);
	T_ASSERT(poll(&pf, 1, 300) == 0, "%s: a cancel with nothing waiting gets no reply", when);
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"ping\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK") && !json_object_get(r, "version"),
		 "%s: the next request gets its own reply: %s", when, t_msg(r));
	json_decref(r);
}

static void case_protocol(void)
{
	int fd = t_raw_connect(d.sock);
	json_t *r;

	no_reply(fd, "before hello");
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
		      "\",\"group\":\"raw\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK") && json_is_true(json_object_get(r, "cancel")),
		 "hello offers cancels: %s", t_msg(r));
	json_decref(r);
	no_reply(fd, "after hello");
	r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"acquire\",\"mode\":2,\"min_version\":1}", NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "acquire of a published version: %s", t_msg(r));
	json_decref(r);
	no_reply(fd, "after an answered acquire");
	close(fd);
}

/* A wexd from before cancels: its hello says nothing of them. */
static struct {
	int lfd;
	atomic_int acquired, extra;
	char extra_op[64];
} old;

static void send_json(int fd, json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);

	T_ASSERT(s && wex_sock_send(fd, s, strlen(s), NULL, 0, 0) > 0, "stand-in send");
	free(s);
	json_decref(j);
}

static void *old_main(void *arg)
{
	struct pollfd pl = { .fd = old.lfd, .events = POLLIN };
	atomic_int stop = 0;
	char op[64];
	int fd;

	(void)arg;
	/* (The listening socket does not block.) */
	T_ASSERT(poll(&pl, 1, 10000) == 1, "stand-in: no client within 10 s");
	fd = accept4(old.lfd, NULL, NULL, SOCK_CLOEXEC);
	T_ASSERT(fd >= 0, "stand-in accept: %s", strerror(errno));
	while (t_stand_in_request(fd, &stop, NULL, op, sizeof(op)) > 0) {
		if (!strcmp(op, "hello")) {
			send_json(fd, json_pack("{s:b, s:i, s:i, s:b}", "ok", 1, "v", 1, "published", 0,
						"lease_reclaimed", 0));
		} else if (!strcmp(op, "acquire")) {
			struct pollfd pf = { .fd = fd, .events = POLLIN };

			atomic_store(&old.acquired, 1);
			/* The client cancels meanwhile: nothing may come. */
			while (atomic_load(&old.acquired) == 1)
				usleep(1000);
			if (poll(&pf, 1, 300) > 0 &&
			    t_stand_in_request(fd, &stop, NULL, old.extra_op, sizeof(old.extra_op)) > 0)
				atomic_store(&old.extra, 1);
			send_json(fd, wex__reply_error(-ETIMEDOUT, "stand-in: no version"));
		} else {
			send_json(fd, wex__reply_ok());
		}
	}
	close(fd);
	return NULL;
}

static void case_old_wexd(void)
{
	char sock[320];
	struct wex_client_params prm = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_SOCKET,
		.role = WEX_ROLE_CONSUMER, .model = MODEL, .socket = sock,
	};
	wex_client_t *c = NULL;
	struct syncer s;
	pthread_t th;
	int ret;

	snprintf(sock, sizeof(sock), "%s/old.sock", d.dir);
	old.lfd = wex_sock_listen(sock, 0600, (gid_t)-1, NULL);
	T_ASSERT(old.lfd >= 0, "listen on %s: %s", sock, strerror(-old.lfd));
	T_ASSERT(pthread_create(&th, NULL, old_main, NULL) == 0, "pthread_create");
	T_WEX(NULL, wex_client_open(&prm, &c));
	sync_start(&s, c, WEX_SYNC_REMAP_VIEW, 1);
	for (double t0 = t_now(); !atomic_load(&old.acquired) && t_now() - t0 < 10.0;)
		usleep(1000);
	T_ASSERT(atomic_load(&old.acquired), "the stand-in got the acquire");
	ret = wex_cancel(c);
	T_ASSERT(ret == -EOPNOTSUPP, "cancel against a wexd without cancels: -EOPNOTSUPP, got %d",
		 ret);
	atomic_store(&old.acquired, 2);
	pthread_join(s.th, NULL);
	T_ASSERT(!atomic_load(&old.extra), "nothing was sent to it (got '%s')", old.extra_op);
	T_ASSERT(s.ret == -ETIMEDOUT && strstr(s.err, "stand-in: no version"),
		 "the sync got the stand-in's answer: %s: %s", wex_strerror(s.ret), s.err);
	wex_client_close(c);
	pthread_join(th, NULL);
	close(old.lfd);
	unlink(sock);
}

int main(void)
{
	struct t_prod p;
	struct t_cons k;

	t_tiny_v1(&d, &p, &k, MODEL);
	T_ASSERT(wex_cancel(NULL) == -EINVAL, "cancel of NULL: -EINVAL");
	case_idle_and_acquire(&p, &k);
	case_lease(&p, &k);
	case_signal(&k);
	case_eintr(&k);
	case_begin_write(&p, &k);
	case_late(&p, &k);
	case_protocol();
	case_old_wexd();
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	printf("cancel_wait: PASS\n");
	return T_EXIT_PASS;
}
