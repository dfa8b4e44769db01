/* SPDX-License-Identifier: MIT */
/*
 * ops_config_runtime: proves that "config set" changes only fields marked
 * modifiable: a field that needs a restart (socket, io_backend, ...) or
 * comes from the file only (models) is refused with -EPERM and a message
 * naming it and the way to change it that works (the file and a reload,
 * which never re-reads the environment; or a restart; the environment
 * and a restart for one the environment or a flag sets, which outranks the
 * file, whether or not a reload could change it), an unknown field with
 * -ENOENT, a bad value with -EINVAL, and a
 * refused set changes nothing; a modifiable field changes and is recorded
 * as set at run time.
 */
#include <errno.h>

#include "config.h"
#include "log.h"
#include "ops_test.h"

int main(void)
{
	struct wex_config cfg;
	char err[512], sock[256];
	static const char *const fixed[] = { "socket", "socket_mode", "socket_group",
		"io_backend", "max_message_bytes", "max_clients", "watchdog", "models" };

	t_clear_env();
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	snprintf(sock, sizeof(sock), "%s", cfg.socket);

	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		int f = wex__config_field_index(fixed[i]);
		char want[128];

		CHECK(f >= 0 && !wex__config_field_modifiable(f));
		CHECK(wex__config_set(&cfg, fixed[i], "1", err, sizeof(err)) == -EPERM);
		snprintf(want, sizeof(want), "field '%s': cannot change at run time", fixed[i]);
		CHECK_CONTAINS(err, want);
		CHECK(cfg.source[f] == WEX_CONFIG_SRC_DEFAULT);
		/* The way to change it that works: a reload re-reads the file,
		 * never the environment (read once, at start). */
		if (!strcmp(fixed[i], "max_clients") || !strcmp(fixed[i], "models"))
			CHECK_CONTAINS(err, "set it in the file and reload wexd");
		else
			CHECK_CONTAINS(err, "or the environment and restart wexd");
		CHECK(!strstr(err, "environment and reload"));
		printf("refused as expected: %s\n", err);
	}
	CHECK(!strcmp(cfg.socket, sock));
	CHECK(cfg.io_backend == WEX_IO_AUTO);

	CHECK(wex__config_set(&cfg, "no_such_field", "1", err, sizeof(err)) == -ENOENT);
	CHECK_CONTAINS(err, "field 'no_such_field': unknown field");

	CHECK(wex__config_set(&cfg, "log_level", "verbose", err, sizeof(err)) == -EINVAL);
	CHECK_CONTAINS(err, "config set: field 'log_level': expected one of");
	CHECK(cfg.log_level == WEX_LOG_INFO && cfg.source[WEX_CF_LOG_LEVEL] == WEX_CONFIG_SRC_DEFAULT);
	CHECK(wex__config_set(&cfg, "sync_timeout_ms", "-3", err, sizeof(err)) == -ERANGE);
	CHECK(cfg.sync_timeout_ms == 60000);

	CHECK(wex__config_set(&cfg, "log_level", "debug", err, sizeof(err)) == 0);
	CHECK(cfg.log_level == WEX_LOG_DEBUG && cfg.source[WEX_CF_LOG_LEVEL] == WEX_CONFIG_SRC_RUNTIME);
	CHECK(wex__config_set(&cfg, "sync_timeout_ms", "250", err, sizeof(err)) == 0);
	CHECK(cfg.sync_timeout_ms == 250);
	CHECK(wex__config_set(&cfg, "drain_timeout_ms", "0", err, sizeof(err)) == 0);
	CHECK(cfg.drain_timeout_ms == 0);

	wex__config_free(&cfg);

	/* max_clients set by the environment: a reload re-reads the file,
	 * which the environment outranks; the way that works is named. */
	CHECK(setenv("WEX_MAX_CLIENTS", "64", 1) == 0);
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	CHECK(cfg.max_clients == 64 && cfg.source[WEX_CF_MAX_CLIENTS] == WEX_CONFIG_SRC_ENV);
	CHECK(wex__config_set(&cfg, "max_clients", "8", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set by WEX_MAX_CLIENTS in wexd's environment");
	CHECK(!strstr(err, "set it in the file and reload"));
	CHECK(cfg.max_clients == 64);
	printf("refused as expected: %s\n", err);
	/* ... and on wexd's command line, likewise. */
	CHECK(wex__config_set_flag(&cfg, "max_clients", "32", "--max-clients", err, sizeof(err)) == 0);
	CHECK(wex__config_set(&cfg, "max_clients", "8", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set on wexd's command line");
	CHECK(!strstr(err, "set it in the file and reload"));
	wex__config_free(&cfg);
	unsetenv("WEX_MAX_CLIENTS");

	/* A restart-only field the environment or a flag sets: the file and
	 * a restart would not change it (they outrank the file), so the
	 * message names what does; it said "set it in the file or the
	 * environment and restart wexd". */
	CHECK(setenv("WEX_IO", "epoll", 1) == 0);
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	CHECK(wex__config_set(&cfg, "io_backend", "io_uring", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set by WEX_IO in wexd's environment");
	CHECK(!strstr(err, "set it in the file"));
	printf("refused as expected: %s\n", err);
	CHECK(wex__config_set_flag(&cfg, "socket", "/tmp/flag.sock", "--socket", err, sizeof(err)) == 0);
	CHECK(wex__config_set(&cfg, "socket", "/tmp/other.sock", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set on wexd's command line (--socket)");
	CHECK(!strstr(err, "set it in the file"));
	printf("refused as expected: %s\n", err);
	wex__config_free(&cfg);
	unsetenv("WEX_IO");
	/* Where systemd passes the socket, no setting of wexd's applies to
	 * it: the message names wexd.socket's (it said to set it in the file
	 * or the environment and restart wexd). */
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	cfg.socket_passed = 1;
	CHECK(wex__config_set(&cfg, "socket_group", "wex", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set SocketGroup= in wexd.socket");
	CHECK(!strstr(err, "set it in the file"));
	printf("refused as expected: %s\n", err);
	CHECK(wex__config_set(&cfg, "io_backend", "epoll", err, sizeof(err)) == -EPERM);
	CHECK_CONTAINS(err, "set it in the file");
	wex__config_free(&cfg);
	printf("PASS\n");
	return T_EXIT_PASS;
}
