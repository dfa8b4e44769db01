/* SPDX-License-Identifier: MIT */
/*
 * sigterm_sync - SIGTERM drains wexd without losing anything:
 *  1. a consumer waiting in sync for a newer version gets a clear
 *     ESHUTDOWN error, is not dirty, and its copied weights (the previous
 *     version) are intact, byte for byte;
 *  2. a copy in flight (a copy-mode lease held) keeps wexd alive while
 *     draining: status still answers (saying draining), new work is refused
 *     with ESHUTDOWN, the release succeeds, and wexd then exits with 0.
 */
#include <errno.h>
#include <jansson.h>
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

static pid_t start_producer(int *cmd_w)
{
	int cmd[2], ack[2];
	pid_t pid;
	char a;

	CHECK(pipe(cmd) == 0 && pipe(ack) == 0, "pipe");
	pid = fork();
	if (pid == 0) {
		struct wex_client_params p = { .field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL,
					       .role = WEX_ROLE_PRODUCER, .model = "policy" };
		struct wex_tensor *t;
		struct ex_cfg cfg;
		uint64_t bytes;
		wex_client_t *c;
		uint32_t seg;
		void *base;
		int n;

		close(cmd[1]); /* so that the lead's close is our EOF */
		ex_cfg_preset(&cfg, "tiny");
		n = ex_shards(&cfg, 0, 1, &t, &bytes);
		if (wex_client_open(&p, &c) || wex_segment_alloc(c, WEX_SEG_HOST, 0, bytes, &seg, &base) ||
		    wex_register_tensors(c, t, (size_t)n) || wex_begin_write(c, 1, 0))
			_exit(1);
		ex_fill(base, t, (size_t)n, 1, 1);
		if (wex_publish(c, 1))
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
	rm_wexd_dir(dir, 0);
	printf("PASS: sigterm drains: waiting sync told ESHUTDOWN, weights intact; in-flight copy finished first\n");
	return 0;
}
