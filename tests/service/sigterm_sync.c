/* SPDX-License-Identifier: MIT */
/*
 * sigterm_sync - SIGTERM drains wexd without losing anything:
 *  1. a consumer waiting in sync for a newer version gets a clear
 *     ESHUTDOWN error, is not dirty, and its copied weights (the previous
 *     version) are intact, byte for byte;
 *  2. a copy in flight (a copy-mode lease held) keeps wexd alive while
 *     draining: status still answers (saying draining), new work is refused
 *     with ESHUTDOWN, the release succeeds, and wexd then exits with 0;
 *  3. a copy sync whose acquire was answered just before the SIGTERM
 *     completes: its fetch is served during the drain (it was refused with
 *     ESHUTDOWN, and the copy never ran);
 *  4. a producer waiting in begin_write behind a consumer's view lease
 *     rides through a restart (SIGTERM, a new wexd): its begin_write
 *     returns 0 once the consumer releases, not ESHUTDOWN at the SIGTERM
 *     (a crash of wexd never failed it; a planned restart did);
 *  5. a consumer waiting in a copy sync rides through a crash of wexd and
 *     the start of the next one: it acquires again there and gets v2.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "examples/model.h"
#include "tests/wexd_dir.h"
#include "wex.h"

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static pid_t start_wexd(const char *bin)
{
	int p[2];
	char b[8], fds[16];
	pid_t pid;

	CHECK(pipe(p) == 0, "pipe");
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		snprintf(fds, sizeof(fds), "%d", p[1]);
		setenv("WEXD_READY_FD", fds, 1);
		execl(bin, bin, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	CHECK(read(p[0], b, sizeof(b)) > 0, "wexd did not start");
	close(p[0]);
	return pid;
}

/* A producer: rank 0 of model "policy", the tiny model in a host
 * segment, with v1 published (prod_v1: 0, else -1). */
struct prod {
	wex_client_t *c;
	struct wex_tensor *t;
	int n;
	void *base;
};

static int prod_v1(struct prod *w)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_PRODUCER, .model = "policy" };
	struct ex_cfg cfg;
	uint64_t bytes;
	uint32_t seg;

	ex_cfg_preset(&cfg, "tiny");
	w->n = ex_shards(&cfg, 0, 1, &w->t, &bytes);
	if (wex_client_open(&p, &w->c) ||
	    wex_segment_alloc(w->c, WEX_SEG_HOST, 0, bytes, &seg, &w->base) ||
	    wex_register_tensors(w->c, w->t, (size_t)w->n) || wex_begin_write(w->c, 1, 0))
		return -1;
	ex_fill(w->base, w->t, (size_t)w->n, 1, 1);
	return wex_publish(w->c, 1) ? -1 : 0;
}

static pid_t start_producer(int *cmd_w)
{
	int cmd[2], ack[2];
	pid_t pid;
	char a;

	CHECK(pipe(cmd) == 0 && pipe(ack) == 0, "pipe");
	pid = fork();
	if (pid == 0) {
		struct prod w;

		close(cmd[1]); /* so that the lead's close is our EOF */
		if (prod_v1(&w))
			_exit(1);
		(void)!write(ack[1], "r", 1);
		(void)!read(cmd[0], &a, 1); /* hold until told, or until the pipe closes */
		_exit(0);
	}
	CHECK(read(ack[0], &a, 1) == 1, "producer did not publish");
	*cmd_w = cmd[1];
	return pid;
}

static wex_client_t *open_consumer(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
				       .role = WEX_ROLE_CONSUMER, .model = "policy" };
	wex_client_t *c;

	CHECK(wex_client_open(&p, &c) == 0, "consumer open");
	return c;
}

static wex_client_t *open_admin(void)
{
	struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE, .role = WEX_ROLE_ADMIN };
	wex_client_t *c;

	CHECK(wex_client_open(&p, &c) == 0, "admin open");
	return c;
}

/* Polls (not sleeps for) the condition "some client waits in acquire". */
static void wait_for_waiter(wex_client_t *admin)
{
	for (int i = 0; i < 5000; i++) {
		char *s = NULL;
		struct timespec ts = { 0, 1000000 };

		CHECK(wex_request(admin, "clients", NULL, &s) == 0, "clients");
		int found = strstr(s, "\"waiting\": \"acquire\"") != NULL;

		wex_free(s);
		if (found)
			return;
		nanosleep(&ts, NULL);
	}
	CHECK(0, "consumer never waited in acquire");
}

/* Part 3: the consumer, forked, syncs (copy) for v2; exits 0 when it got
 * v2 whole. */
static void copy_consumer(void)
{
	struct wex_tensor *t;
	struct ex_cfg cfg;
	struct wex_sync_result r;
	uint64_t bytes;
	wex_client_t *c = open_consumer();
	int n, ret;
	char *buf;

	ex_cfg_preset(&cfg, "tiny");
	n = ex_shards(&cfg, 0, 1, &t, &bytes);
	buf = malloc(bytes);
	for (int i = 0; i < n; i++)
		t[i].ptr = buf + t[i].offset;
	CHECK(wex_attach(c, t, (size_t)n) == 0, "attach: %s", wex_last_error(c));
	ret = wex_sync(c, WEX_SYNC_COPY, 2, 20000, &r);
	CHECK(ret == 0, "copy sync in flight across the SIGTERM: %d (%s): %s", ret, wex_strerror(ret),
	      wex_last_error(c));
	CHECK(r.version == 2 && ex_check(NULL, t, (size_t)n, 2, 1) == 0, "v%llu copied wrong",
	      (unsigned long long)r.version);
	_exit(0);
}

static void copy_in_flight(const char *bin)
{
	wex_client_t *p, *admin;
	struct prod w;
	pid_t wexd, cons;
	int st;

	wexd = start_wexd(bin);
	CHECK(prod_v1(&w) == 0, "producer: v1");
	p = w.c;
	cons = fork();
	if (cons == 0)
		copy_consumer();
	admin = open_admin();
	wait_for_waiter(admin);
	wex_client_close(admin);
	CHECK(wex_begin_write(p, 2, 0) == 0, "begin_write v2");
	ex_fill(w.base, w.t, (size_t)w.n, 2, 1);
	/* The consumer takes its answer in late: the acquire is answered (a
	 * copy lease the drain waits for) and the fetch comes in the drain. */
	kill(cons, SIGSTOP);
	CHECK(wex_publish(p, 2) == 0, "publish v2");
	nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
	kill(wexd, SIGTERM);
	nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
	CHECK(waitpid(wexd, &st, WNOHANG) == 0, "wexd exited with a copy lease held");
	kill(cons, SIGCONT);
	CHECK(waitpid(cons, &st, 0) == cons && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "the copy in flight did not complete (consumer status %d)", st);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "wexd did not exit cleanly after the copy (status %d)", st);
	wex_client_close(p);
	free(w.t);
}

/* Part 4: the producer, forked, begins writing v2 when told, and writes
 * begin_write's result to `res`. */
static pid_t writer(int *go_w, int *res_r)
{
	int go[2], res[2], ack[2];
	pid_t pid;
	char a;

	/* (Close-on-exec: a wexd started later holds no end of them.) */
	CHECK(pipe2(go, O_CLOEXEC) == 0 && pipe2(res, O_CLOEXEC) == 0 && pipe2(ack, O_CLOEXEC) == 0, "pipe");
	pid = fork();
	if (pid == 0) {
		struct prod w;
		int ret;

		close(go[1]); /* (so that the lead's close is our EOF) */
		close(res[0]);
		if (prod_v1(&w))
			_exit(1);
		(void)!write(ack[1], "r", 1);
		if (read(go[0], &a, 1) != 1)
			_exit(1);
		ret = wex_begin_write(w.c, 2, 20000);
		if (ret)
			fprintf(stderr, "begin_write v2: %s\n", wex_last_error(w.c));
		if (!ret) {
			ex_fill(w.base, w.t, (size_t)w.n, 2, 1);
			if ((ret = wex_publish(w.c, 2)))
				fprintf(stderr, "publish v2: %s\n", wex_last_error(w.c));
		}
		(void)!write(res[1], &ret, sizeof(ret));
		(void)!read(go[0], &a, 1); /* holds v2 until the lead closes go */
		_exit(0);
	}
	close(go[0]);
	close(res[1]);
	CHECK(read(ack[0], &a, 1) == 1, "producer did not publish");
	*go_w = go[1];
	*res_r = res[0];
	return pid;
}

static int answered(int fd, int ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, ms) == 1;
}

static void writer_rides_restart(const char *bin)
{
	struct wex_sync_result r;
	wex_client_t *c, *admin;
	pid_t wexd, prod;
	int go, res, ret = -1, st, found = 0;
	char *s;

	wexd = start_wexd(bin);
	prod = writer(&go, &res);
	c = open_consumer();
	CHECK(wex_sync(c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r) == 0 && r.version == 1, "view sync: %s",
	      wex_last_error(c));
	CHECK(write(go, "g", 1) == 1, "go");
	admin = open_admin();
	for (int i = 0; i < 5000 && !found; i++) {
		CHECK(wex_request(admin, "clients", NULL, &s) == 0, "clients");
		found = strstr(s, "\"waiting\": \"begin_write\"") != NULL;
		wex_free(s);
		if (!found)
			nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	CHECK(found, "the producer never waited in begin_write");
	wex_client_close(admin);
	kill(wexd, SIGTERM);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "wexd did not exit cleanly (status %d)", st);
	CHECK(!answered(res, 300), "begin_write returned during the restart, with the view still held");
	wexd = start_wexd(bin); /* the lease journal holds the producer off */
	CHECK(!answered(res, 300), "begin_write returned under the view, after the restart");
	CHECK(wex_release(c) == 0, "release after the restart: %s", wex_last_error(c));
	CHECK(answered(res, 15000) && read(res, &ret, sizeof(ret)) == sizeof(ret), "begin_write never returned");
	CHECK(ret == 0, "begin_write v2 across a SIGTERM restart: %d (%s)", ret, wex_strerror(ret));
	close(go);
	CHECK(waitpid(prod, &st, 0) == prod && WIFEXITED(st) && WEXITSTATUS(st) == 0, "producer");
	wex_client_close(c);
	kill(wexd, SIGTERM);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0, "wexd");
	close(res);
}

/* Part 5: a consumer waiting in a copy sync when wexd dies (SIGKILL), the
 * next one starting 300 ms later: the sync acquires again there, within
 * its timeout (it failed at once with ECONNREFUSED, 1.5 s into 60). */
static void sync_rides_crash(const char *bin)
{
	wex_client_t *admin;
	pid_t wexd, prod, cons;
	int go, res, ret = -1, st;

	wexd = start_wexd(bin);
	prod = writer(&go, &res);
	cons = fork();
	if (cons == 0)
		copy_consumer();
	admin = open_admin();
	wait_for_waiter(admin);
	wex_client_close(admin);
	kill(wexd, SIGKILL);
	CHECK(waitpid(wexd, &st, 0) == wexd, "wexd");
	nanosleep(&(struct timespec){ 0, 300000000 }, NULL);
	CHECK(waitpid(cons, &st, WNOHANG) == 0, "the sync gave up while wexd was away (status %d)", st);
	wexd = start_wexd(bin);
	CHECK(write(go, "g", 1) == 1, "go");
	CHECK(answered(res, 15000) && read(res, &ret, sizeof(ret)) == sizeof(ret), "producer never wrote");
	CHECK(ret == 0, "producer v2 after the restart: %d (%s)", ret, wex_strerror(ret));
	CHECK(waitpid(cons, &st, 0) == cons && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "the sync waiting across wexd's crash did not get v2 (status %d)", st);
	close(go);
	CHECK(waitpid(prod, &st, 0) == prod && WIFEXITED(st) && WEXITSTATUS(st) == 0, "producer");
	kill(wexd, SIGTERM);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0, "wexd");
	close(res);
}

int main(void)
{
	const char *bin = getenv("WEXD_BIN");
	char dir[] = "/tmp/wex-sigterm-XXXXXX", sock[128];
	struct wex_tensor *t;
	struct ex_cfg cfg;
	struct wex_sync_result r;
	uint64_t bytes;
	int n, ret, st, cmd;
	pid_t wexd, prod, killer;
	wex_client_t *c, *admin;
	char *buf, *s;

	if (!bin) {
		fprintf(stderr, "SKIP: WEXD_BIN not set\n");
		return 77;
	}
	CHECK(mkdtemp(dir), "mkdtemp");
	snprintf(sock, sizeof(sock), "%s/wexd.sock", dir);
	setenv("WEX_SOCKET", sock, 1);

	/* Part 1: a consumer waiting in sync. */
	wexd = start_wexd(bin);
	prod = start_producer(&cmd);
	ex_cfg_preset(&cfg, "tiny");
	n = ex_shards(&cfg, 0, 1, &t, &bytes);
	buf = malloc(bytes);
	for (int i = 0; i < n; i++)
		t[i].ptr = buf + t[i].offset;
	c = open_consumer();
	CHECK(wex_attach(c, t, (size_t)n) == 0, "attach: %s", wex_last_error(c));
	CHECK(wex_sync(c, WEX_SYNC_COPY, 1, 5000, &r) == 0 && r.version == 1, "first sync");
	CHECK(ex_check(NULL, t, (size_t)n, 1, 1) == 0, "v1 bytes wrong");
	killer = fork();
	if (killer == 0) {
		wex_client_t *a = open_admin();

		wait_for_waiter(a);
		wex_client_close(a);
		kill(wexd, SIGTERM);
		_exit(0);
	}
	ret = wex_sync(c, WEX_SYNC_COPY, 2, 20000, &r);
	CHECK(ret == -ESHUTDOWN || ret == -WEX_EDAEMON,
	      "waiting sync during SIGTERM returned %d (%s), expected ESHUTDOWN", ret, wex_strerror(ret));
	CHECK(strstr(wex_last_error(c), "shutting down") || ret == -WEX_EDAEMON,
	      "error does not say why: '%s'", wex_last_error(c));
	CHECK(!wex_is_dirty(c), "consumer marked dirty without a copy");
	CHECK(ex_check(NULL, t, (size_t)n, 1, 1) == 0, "previous version damaged by the shutdown");
	CHECK(waitpid(killer, &st, 0) == killer && WIFEXITED(st) && !WEXITSTATUS(st), "killer");
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "wexd did not exit cleanly (status %d)", st);
	wex_client_close(c);
	close(cmd);
	waitpid(prod, NULL, 0);

	/* Part 2: a copy in flight holds wexd in its drain. */
	wexd = start_wexd(bin);
	prod = start_producer(&cmd);
	c = open_consumer();
	admin = open_admin();
	CHECK(wex_request(c, "acquire", "{\"min_version\":1,\"mode\":1}", &s) == 0,
	      "acquire: %s", wex_last_error(c));
	wex_free(s);
	kill(wexd, SIGTERM);
	/* Status still answers, says draining; new work is refused. */
	for (int i = 0;; i++) {
		CHECK(wex_request(admin, "status", NULL, &s) == 0, "status while draining");
		int draining = strstr(s, "\"draining\": true") != NULL;

		wex_free(s);
		if (draining)
			break;
		CHECK(i < 5000, "wexd never reported draining");
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
	CHECK(waitpid(wexd, &st, WNOHANG) == 0, "wexd exited with a copy in flight");
	ret = wex_request(admin, "models", NULL, &s);
	CHECK(ret == -ESHUTDOWN, "new request while draining returned %d", ret);
	CHECK(wex_request(c, "release", NULL, &s) == 0, "release during drain: %s", wex_last_error(c));
	wex_free(s);
	CHECK(waitpid(wexd, &st, 0) == wexd && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "wexd did not exit cleanly after the copy finished");
	wex_client_close(admin);
	wex_client_close(c);
	close(cmd);
	waitpid(prod, NULL, 0);
	free(buf);
	free(t);

	copy_in_flight(bin);
	writer_rides_restart(bin);
	sync_rides_crash(bin);
	rm_wexd_dir(dir, 0);
	printf("PASS: sigterm drains: waiting sync told ESHUTDOWN, weights intact; in-flight copy finished "
	       "first, its fetch served in the drain; a waiting begin_write rode through a restart, a waiting sync through a crash\n");
	return 0;
}
