/* SPDX-License-Identifier: MIT */
/*
 * ops_config_invalid: proves that a bad configuration is refused, never
 * half-applied: an unparsable file, a value of the wrong type or range, an
 * unknown field (top level or inside "models"; a top-level one gets the
 * nearest field name and the list of fields), an unknown user name, a bad
 * WEX_* variable, a missing explicitly given file and a directory given as
 * the file each fail with a message naming the file or variable, the field
 * and the reason, and leave the output struct untouched.  A missing
 * default file is not an error.
 */
#include <errno.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "ops_test.h"
#include "proto.h" /* wex__utf8_scrub */

static char err[1024];

/* Loads text as a config file; expects failure rc and a message containing
 * each of the given fragments ("%s" in them becomes the file's path). */
static void expect_file_error(const char *text, int rc, const char *frag1, const char *frag2)
{
	struct wex_config cfg, sentinel;
	char *path = t_write_tmp(text), want[1024];

	memset(&cfg, 0xa5, sizeof(cfg));
	memcpy(&sentinel, &cfg, sizeof(cfg));
	err[0] = '\0';
	if (wex__config_load(&cfg, path, 1, err, sizeof(err)) != rc) {
		fprintf(stderr, "file %s: expected rc %d, message: %s\n", text, rc, err);
		exit(T_EXIT_FAIL);
	}
	CHECK(!memcmp(&cfg, &sentinel, sizeof(cfg)));
	snprintf(want, sizeof(want), frag1, path);
	CHECK_CONTAINS(err, want);
	if (frag2)
		CHECK_CONTAINS(err, frag2);
	printf("refused as expected: %s\n", err);
	unlink(path);
	free(path);
}

int main(void)
{
	struct wex_config cfg;
	char *path;

	t_clear_env();

	/* The message format of the issue, exactly. */
	expect_file_error("{\"begin_write_timeout_ms\": \"abc\"}", -EINVAL,
			  "config %s: field 'begin_write_timeout_ms': expected a non-negative "
			  "integer, got \"abc\"", NULL);
	expect_file_error("{\"begin_write_timeout_ms\": -1}", -ERANGE,
			  "field 'begin_write_timeout_ms'", "got -1");
	expect_file_error("{\"max_message_bytes\": 100}", -ERANGE, "config %s: field "
			  "'max_message_bytes': expected an integer in [4096, 16777216], got 100",
			  NULL);
	expect_file_error("{\"bogus\": 1}", -EINVAL, "config %s: field 'bogus': unknown field",
			  "fields: socket, socket_mode,");
	/* A typo gets the field it was probably meant to be. */
	expect_file_error("{\"log-level\": \"debug\"}", -EINVAL, "field 'log-level': unknown field",
			  "did you mean 'log_level'?");
	expect_file_error("{\"sync_timeout\": 5}", -EINVAL, "field 'sync_timeout'",
			  "did you mean 'sync_timeout_ms'?");
	expect_file_error("{\"log_level\": \"loud\"}", -EINVAL, "field 'log_level'",
			  "expected one of error|warn|info|debug|trace, got \"loud\"");
	expect_file_error("{\"watchdog\": \"maybe\"}", -EINVAL, "field 'watchdog'",
			  "expected true or false");
	expect_file_error("{\"socket_mode\": 660}", -EINVAL, "field 'socket_mode'",
			  "octal mode string");
	expect_file_error("{\"socket_mode\": \"01777\"}", -EINVAL, "field 'socket_mode'", NULL);
	/* Octal digits only: strtoul skipped a leading tab or newline. */
	expect_file_error("{\"socket_mode\": \"\\t0660\"}", -EINVAL, "field 'socket_mode'",
			  "octal mode string");
	expect_file_error("{\"socket_mode\": \"\\n0660\"}", -EINVAL, "field 'socket_mode'",
			  "octal mode string");
	expect_file_error("{\"socket\": \"relative.sock\"}", -EINVAL, "field 'socket'",
			  "absolute path");
	expect_file_error("{\"socket_group\": \"no-such-group-wex\"}", -EINVAL,
			  "field 'socket_group'", "unknown group \"no-such-group-wex\"");
	/* A long value is cut for the message, but not inside a UTF-8
	 * character: the message goes to the log (journald shows a line that
	 * is not UTF-8 as "[blob data]") and to wexctl. */
	{
		char copy[sizeof(err)];

		expect_file_error("{\"log_level\": \"\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
				  "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
				  "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9"
				  "\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\u00e9\"}",
				  -EINVAL, "field 'log_level'", "...");
		memcpy(copy, err, sizeof(err));
		wex__utf8_scrub(copy);
		if (strcmp(copy, err)) {
			fprintf(stderr, "message cut inside a UTF-8 character: %s\n", err);
			exit(T_EXIT_FAIL);
		}
	}
	expect_file_error("{\"begin_write_timeout_ms\": 1,}", -EINVAL, "config %s: line 1",
			  NULL);
	expect_file_error("[1, 2]", -EINVAL, "config %s: expected a JSON object", NULL);
	/* Duplicate keys would let a later line silently win. */
	expect_file_error("{\"log_level\": \"info\", \"log_level\": \"debug\"}", -EINVAL,
			  "config %s: line 1", "duplicate");
	expect_file_error("{\"models\": {\"policy\": {\"producers\": {\"uids\": [0, "
			  "\"no-such-user-wex\"]}}}}", -EINVAL,
			  "field 'models.policy.producers.uids[1]': unknown user \"no-such-user-wex\"",
			  NULL);
	expect_file_error("{\"models\": {\"prod-*\": {\"producers\": {\"uids\": [0]}}}}", -EINVAL,
			  "'*' stands alone", NULL);
	/* No client could name such a model: the entry would do nothing. */
	expect_file_error("{\"models\": {\"a\\u0001b\": {\"producers\": {\"uids\": [0]}}}}",
			  -EINVAL, "field 'models': a model name may not hold control characters",
			  NULL);
	expect_file_error("{\"models\": {\"policy\": {\"writers\": {}}}}", -EINVAL,
			  "field 'models.policy.writers': unknown field", NULL);
	expect_file_error("{\"models\": {\"policy\": {\"consumers\": {\"uids\": [0], "
			  "\"names\": []}}}}", -EINVAL,
			  "field 'models.policy.consumers.names': unknown field", NULL);
	expect_file_error("{\"models\": {\"policy\": {\"consumers\": {\"gids\": [-5]}}}}",
			  -EINVAL, "field 'models.policy.consumers.gids[0]'", "out of range");

	/* A bad variable names the variable and the field. */
	setenv("WEX_IO", "kqueue", 1);
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == -EINVAL);
	CHECK_CONTAINS(err, "environment WEX_IO: field 'io_backend': expected one of "
			    "auto|io_uring|epoll, got \"kqueue\"");
	printf("refused as expected: %s\n", err);
	unsetenv("WEX_IO");
	setenv("WEX_DRAIN_TIMEOUT_MS", "10s", 1);
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == -EINVAL);
	CHECK_CONTAINS(err, "environment WEX_DRAIN_TIMEOUT_MS: field 'drain_timeout_ms': "
			    "expected a non-negative integer, got \"10s\"");
	unsetenv("WEX_DRAIN_TIMEOUT_MS");

	/* A missing file is an error only when it was asked for. */
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 1, err, sizeof(err)) == -ENOENT);
	CHECK_CONTAINS(err, "config /nonexistent/wexd.json:");
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	wex__config_free(&cfg);
	/* A directory named as the file (--config /etc/wex) says so; it was
	 * "line 1 column 0: '[' or '{' expected near end of file". */
	CHECK(wex__config_load(&cfg, "/", 1, err, sizeof(err)) == -EISDIR);
	CHECK_CONTAINS(err, "config /: is a directory");
	printf("refused as expected: %s\n", err);

	/* The example shipped for /etc/wex/wexd.json loads. */
	if (getenv("WEX_SRC")) {
		char p[4096];

		snprintf(p, sizeof(p), "%s/systemd/wexd.json", getenv("WEX_SRC"));
		if (wex__config_load(&cfg, p, 1, err, sizeof(err)) != 0) {
			fprintf(stderr, "shipped example refused: %s\n", err);
			return T_EXIT_FAIL;
		}
		wex__config_free(&cfg);
	}

	/* A valid file after all of that still loads (no state leaked). */
	path = t_write_tmp("{\"log_level\": \"warn\"}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(cfg.log_level == 1);
	wex__config_free(&cfg);
	unlink(path);
	free(path);
	/* Names in any case, as libwex takes WEX_LOG_LEVEL=DEBUG (wexd
	 * refused to start with it). */
	path = t_write_tmp("{\"log_level\": \"DEBUG\", \"io_backend\": \"Epoll\"}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(cfg.log_level == WEX_LOG_DEBUG);
	wex__config_free(&cfg);
	unlink(path);
	free(path);
	printf("PASS\n");
	return T_EXIT_PASS;
}
