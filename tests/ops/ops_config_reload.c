/* SPDX-License-Identifier: MIT */
/*
 * ops_config_reload: proves the SIGHUP reload rules: an invalid file leaves
 * the running configuration exactly as it was; a valid one is swapped in,
 * reporting the fields that changed and those that need a restart (which
 * keep their running value), and values set at run time keep outranking the
 * file; a file gone at a reload is refused whether it was named or the
 * default one that was loaded before; a file setting watchdog false is
 * refused where systemd asks for pings (wexd would not start again); under
 * socket activation a changed socket field is "not_applied", not
 * "restart_needed" (a restart gets systemd's socket too).
 */
#include <errno.h>

#include "config.h"
#include "ops_test.h"

static void rewrite(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	CHECK(f != NULL);
	CHECK(fputs(text, f) >= 0);
	CHECK(fclose(f) == 0);
}

static int has(json_t *arr, const char *name)
{
	size_t i;
	json_t *e;

	json_array_foreach(arr, i, e)
		if (!strcmp(json_string_value(e), name))
			return 1;
	return 0;
}

int main(void)
{
	struct wex_config cfg;
	json_t *rep = NULL, *kept;
	char err[512], *path;

	t_clear_env();
	path = t_write_tmp("{\"begin_write_timeout_ms\": 1000, \"socket\": \"/tmp/a.sock\",\n"
			   " \"models\": {\"policy\": {\"producers\": {\"uids\": [1000]}}}}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(wex__config_set(&cfg, "sync_timeout_ms", "1234", err, sizeof(err)) == 0);

	/* Invalid: nothing changes, and the message names the field. */
	rewrite(path, "{\"begin_write_timeout_ms\": 2000, \"max_clients\": \"many\"}");
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == -EINVAL);
	CHECK(rep == NULL);
	CHECK_CONTAINS(err, "field 'max_clients'");
	printf("refused as expected: %s\n", err);
	CHECK(cfg.begin_write_timeout_ms == 1000);
	CHECK(cfg.source[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] == WEX_CONFIG_SRC_FILE);
	CHECK(!strcmp(cfg.socket, "/tmp/a.sock"));
	CHECK(cfg.models.n == 1 && cfg.models.v[0].producers.uids.ids[0] == 1000);
	CHECK(cfg.sync_timeout_ms == 1234);
	CHECK(!wex__config_allowed(&cfg, "policy", WEX_ROLE_PRODUCER, 1001, 1001, NULL, -1));

	/* Unparsable: the same. */
	rewrite(path, "{");
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == -EINVAL);
	CHECK(cfg.begin_write_timeout_ms == 1000);

	/* Valid: swapped in, with the report. */
	rewrite(path, "{\"begin_write_timeout_ms\": 2000, \"socket\": \"/tmp/b.sock\",\n"
		      " \"sync_timeout_ms\": 5, \"max_clients\": 7, \"io_backend\": \"epoll\",\n"
		      " \"models\": {\"policy\": {\"producers\": {\"uids\": [1001]}}}}");
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == 0);
	CHECK(rep != NULL);
	{
		char *s = json_dumps(rep, JSON_COMPACT);

		printf("reload report: %s\n", s);
		free(s);
	}
	json_t *changed = json_object_get(rep, "changed");
	json_t *restart = json_object_get(rep, "restart_needed");

	CHECK(has(changed, "begin_write_timeout_ms") && has(changed, "max_clients"));
	CHECK(has(changed, "models"));
	CHECK(!has(changed, "sync_timeout_ms") && !has(restart, "sync_timeout_ms"));
	CHECK(has(restart, "socket") && has(restart, "io_backend"));
	CHECK(!has(changed, "socket") && !has(changed, "log_level"));
	CHECK(json_array_size(changed) == 3 && json_array_size(restart) == 2);
	/* The file's 5 lost to the runtime 1234: said, not passed over. */
	kept = json_object_get(rep, "overridden");
	CHECK(has(kept, "sync_timeout_ms") && json_array_size(kept) == 1);
	json_decref(rep);

	CHECK(cfg.begin_write_timeout_ms == 2000);
	CHECK(cfg.max_clients == 7);
	CHECK(wex__config_allowed(&cfg, "policy", WEX_ROLE_PRODUCER, 1001, 1001, NULL, -1));
	CHECK(!wex__config_allowed(&cfg, "policy", WEX_ROLE_PRODUCER, 1000, 1000, NULL, -1));
	/* Restart-only fields keep what the daemon is actually using. */
	CHECK(!strcmp(cfg.socket, "/tmp/a.sock"));
	CHECK(cfg.io_backend == WEX_IO_AUTO);
	CHECK(cfg.source[WEX_CF_IO_BACKEND] == WEX_CONFIG_SRC_DEFAULT);
	/* The runtime value outranks the file's 5. */
	CHECK(cfg.sync_timeout_ms == 1234);
	CHECK(cfg.source[WEX_CF_SYNC_TIMEOUT_MS] == WEX_CONFIG_SRC_RUNTIME);

	/* A reload with the file gone: it was given explicitly, so refused. */
	unlink(path);
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == -ENOENT);
	CHECK(cfg.begin_write_timeout_ms == 2000);

	wex__config_free(&cfg);

	/* Not named on the command line (the default path): missing at start
	 * is fine, and a reload then keeps the defaults; once loaded, the file
	 * gone at a reload is refused too (its access lists would go). */
	CHECK(wex__config_load(&cfg, path, 0, err, sizeof(err)) == 0);
	CHECK(!cfg.file_found && cfg.source[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] == WEX_CONFIG_SRC_DEFAULT);
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == 0);
	rewrite(path, "{\"begin_write_timeout_ms\": 3000,\n"
		      " \"models\": {\"policy\": {\"producers\": {\"uids\": [1001]}}}}");
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == 0);
	CHECK(cfg.file_found && cfg.begin_write_timeout_ms == 3000 && !cfg.path_explicit);
	unlink(path);
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == -ENOENT);
	CHECK_CONTAINS(err, path);
	printf("default file gone, refused: %s\n", err);
	CHECK(cfg.begin_write_timeout_ms == 3000);
	CHECK(!wex__config_allowed(&cfg, "policy", WEX_ROLE_PRODUCER, 1000, 1000, NULL, -1));
	wex__config_free(&cfg);

	/* A flag outranks the file after a reload; the file setting it to
	 * another value is reported as overridden, the same value is not. */
	rewrite(path, "{\"log_level\": \"warn\", \"socket\": \"/tmp/a.sock\"}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(wex__config_set_flag(&cfg, "log_level", "debug", "--log-level", err, sizeof(err)) == 0);
	CHECK(wex__config_set_flag(&cfg, "socket", "/tmp/a.sock", "--socket", err, sizeof(err)) == 0);
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == 0);
	kept = json_object_get(rep, "overridden");
	CHECK(has(kept, "log_level") && json_array_size(kept) == 1);
	CHECK(json_array_size(json_object_get(rep, "changed")) == 0);
	json_decref(rep);
	CHECK(cfg.source[WEX_CF_LOG_LEVEL] == WEX_CONFIG_SRC_FLAG);
	wex__config_free(&cfg);

	/* Under a unit with WatchdogSec=, wexd refuses to start with watchdog
	 * false: a reload of such a file is refused too, naming the field,
	 * rather than answered "needs a restart" (a restart that fails). */
	rewrite(path, "{\"watchdog\": true, \"sync_timeout_ms\": 100}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	cfg.watchdog_required = 1;
	rewrite(path, "{\"watchdog\": false, \"sync_timeout_ms\": 200}");
	rep = NULL;
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == -EINVAL);
	CHECK(rep == NULL);
	CHECK_CONTAINS(err, "field 'watchdog'");
	CHECK_CONTAINS(err, path);
	CHECK_CONTAINS(err, "WatchdogSec=");
	printf("watchdog false under WatchdogSec= refused: %s\n", err);
	CHECK(cfg.watchdog == 1 && cfg.sync_timeout_ms == 100);
	/* Kept across a reload that is taken. */
	rewrite(path, "{\"watchdog\": true, \"sync_timeout_ms\": 300}");
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == 0);
	CHECK(cfg.watchdog_required && cfg.sync_timeout_ms == 300);
	rewrite(path, "{\"watchdog\": false}");
	CHECK(wex__config_reload(&cfg, NULL, err, sizeof(err)) == -EINVAL);
	wex__config_free(&cfg);
	/* WEX_WATCHDOG=true outranks the file, now and at a restart: a
	 * file setting it false is taken (overridden), not refused. */
	setenv("WEX_WATCHDOG", "true", 1);
	rewrite(path, "{\"watchdog\": true}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	cfg.watchdog_required = 1;
	rewrite(path, "{\"watchdog\": false, \"sync_timeout_ms\": 400}");
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == 0);
	CHECK(has(json_object_get(rep, "overridden"), "watchdog"));
	CHECK(cfg.watchdog == 1 && cfg.source[WEX_CF_WATCHDOG] == WEX_CONFIG_SRC_ENV);
	CHECK(cfg.sync_timeout_ms == 400);
	json_decref(rep);
	wex__config_free(&cfg);
	unsetenv("WEX_WATCHDOG");

	/* Under socket activation the socket fields apply at no restart
	 * either: "not_applied", not "restart_needed"; others as ever. */
	rewrite(path, "{\"socket_mode\": \"0660\"}");
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	cfg.socket_passed = 1;
	rewrite(path, "{\"socket_mode\": \"0600\", \"io_backend\": \"epoll\"}");
	CHECK(wex__config_reload(&cfg, &rep, err, sizeof(err)) == 0);
	CHECK(has(json_object_get(rep, "not_applied"), "socket_mode"));
	CHECK(json_array_size(json_object_get(rep, "not_applied")) == 1);
	CHECK(!has(json_object_get(rep, "restart_needed"), "socket_mode"));
	CHECK(has(json_object_get(rep, "restart_needed"), "io_backend"));
	CHECK(cfg.socket_mode == 0660 && cfg.socket_passed);
	json_decref(rep);
	wex__config_free(&cfg);
	unlink(path);
	free(path);
	printf("PASS\n");
	return T_EXIT_PASS;
}
