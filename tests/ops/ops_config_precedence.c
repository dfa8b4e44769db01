/* SPDX-License-Identifier: MIT */
/*
 * ops_config_precedence: proves the configuration's layer order, defaults <
 * JSON file < WEX_* environment < runtime set, and that each field records
 * the layer (and file or variable) its value came from, as status shows it.
 * Also proves the default socket path rule of DESIGN section 7, and that a
 * user's clients fall back to the system socket also where they may not
 * reach it (so the error they get is the permission one).
 */
#include <errno.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "ops_test.h"
#include "proto.h"

static const char *src(json_t *j, const char *field)
{
	return json_string_value(json_object_get(json_object_get(j, field), "source"));
}

int main(void)
{
	struct wex_config cfg;
	char err[512], sock[256], *path;
	json_t *j, *e;

	t_clear_env();

	/* The default socket: $WEX_SOCKET, else root's system path, else the
	 * user's runtime directory. */
	setenv("XDG_RUNTIME_DIR", "/tmp/wex-xdg-test", 1);
	CHECK(wex__config_default_socket(sock, sizeof(sock)) == 0);
	if (geteuid() == 0)
		CHECK(!strcmp(sock, "/run/wex/wexd.sock"));
	else
		CHECK(!strcmp(sock, "/tmp/wex-xdg-test/wex/wexd.sock"));
	setenv("WEX_SOCKET", "/tmp/explicit.sock", 1);
	CHECK(wex__config_default_socket(sock, sizeof(sock)) == 0);
	CHECK(!strcmp(sock, "/tmp/explicit.sock"));
	CHECK(!strcmp(wex__default_socket(sock, sizeof(sock)), "/tmp/explicit.sock"));
	unsetenv("WEX_SOCKET");
	/* A user's clients use their own wexd's socket, or the system wexd's
	 * when they have none and it exists (a service install needs no
	 * WEX_SOCKET in every user's environment). */
	{
		char d[] = "/tmp/wex-pick-XXXXXX", user[300], sys[300];
		FILE *f;

		CHECK(mkdtemp(d) != NULL);
		snprintf(user, sizeof(user), "%s/user.sock", d);
		snprintf(sys, sizeof(sys), "%s/system.sock", d);
		CHECK(!strcmp(wex__socket_pick(user, sys), user)); /* neither: the user's */
		CHECK((f = fopen(sys, "w")) != NULL);
		fclose(f);
		CHECK(!strcmp(wex__socket_pick(user, sys), sys)); /* only the system's */
		CHECK((f = fopen(user, "w")) != NULL);
		fclose(f);
		CHECK(!strcmp(wex__socket_pick(user, sys), user)); /* both: the user's */
		unlink(user);
		unlink(sys);
		rmdir(d);
	}
	/* The system's socket in a directory this user may not enter (/run/wex
	 * is root:wex 0750 once wexd.service ran, and the user is not yet in
	 * group wex): still the system's, so that connecting says "Permission
	 * denied" and wexctl tells the user to join the group.  The user's own
	 * path, which does not exist, gave "No such file or directory" and "is
	 * wexd running?" while wexd ran. */
	{
		char d[] = "/tmp/wex-pick-XXXXXX", user[300], priv[300], sys[320];
		int status;
		FILE *f;
		pid_t pid;

		CHECK(mkdtemp(d) != NULL);
		CHECK(chmod(d, 0755) == 0);
		snprintf(user, sizeof(user), "%s/user.sock", d);
		snprintf(priv, sizeof(priv), "%s/wex", d);
		snprintf(sys, sizeof(sys), "%s/system.sock", priv);
		CHECK(mkdir(priv, 0750) == 0);
		CHECK((f = fopen(sys, "w")) != NULL);
		fclose(f);
		/* Root passes every permission check: the child drops to
		 * nobody; another user shuts itself out of its own directory. */
		if (geteuid() != 0)
			CHECK(chmod(priv, 0) == 0);
		pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			if (geteuid() == 0 &&
			    (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0))
				_exit(T_EXIT_SKIP);
			if (access(sys, F_OK) == 0 || errno != EACCES)
				_exit(T_EXIT_SKIP); /* still reachable: nothing to prove */
			_exit(strcmp(wex__socket_pick(user, sys), sys) ? T_EXIT_FAIL : T_EXIT_PASS);
		}
		CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
		if (WEXITSTATUS(status) == T_EXIT_SKIP)
			printf("note: cannot shut a user out of a directory here: pick under EACCES not checked\n");
		else if (WEXITSTATUS(status) != T_EXIT_PASS) {
			fprintf(stderr, "a system socket behind EACCES was not picked\n");
			return T_EXIT_FAIL;
		}
		chmod(priv, 0750);
		unlink(sys);
		rmdir(priv);
		rmdir(d);
	}

	/* Defaults only: a missing default file is fine. */
	CHECK(wex__config_load(&cfg, "/nonexistent/wexd.json", 0, err, sizeof(err)) == 0);
	CHECK(cfg.begin_write_timeout_ms == 30000);
	CHECK(cfg.max_message_bytes == 65536);
	CHECK(cfg.drain_timeout_ms == 10000);
	CHECK(cfg.socket_mode == 0660);
	CHECK(cfg.socket_group.gid == -1 && cfg.socket_group.name == NULL);
	CHECK(cfg.io_backend == WEX_IO_AUTO);
	CHECK(cfg.log_level == WEX_LOG_INFO);
	CHECK(cfg.watchdog == 1);
	CHECK(cfg.models.n == 0);
	for (int i = 0; i < WEX_CF_COUNT; i++)
		CHECK(cfg.source[i] == WEX_CONFIG_SRC_DEFAULT);
	wex__config_free(&cfg);

	/* File over defaults, environment over file. */
	path = t_write_tmp("{\"begin_write_timeout_ms\": 5000, \"sync_timeout_ms\": 7000,\n"
			   " \"io_backend\": \"epoll\", \"log_level\": \"debug\",\n"
			   " \"socket\": \"/tmp/file.sock\", \"socket_mode\": \"0600\",\n"
			   " \"socket_group\": 0, \"watchdog\": false}\n");
	setenv("WEX_BEGIN_WRITE_TIMEOUT_MS", "6000", 1);
	setenv("WEX_IO", "io_uring", 1);
	setenv("WEX_WATCHDOG", "yes", 1);
	setenv("WEX_SYNC_TIMEOUT_MS", "", 1); /* empty counts as unset */
	CHECK(wex__config_load(&cfg, path, 1, err, sizeof(err)) == 0);
	CHECK(cfg.begin_write_timeout_ms == 6000);
	CHECK(cfg.source[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] == WEX_CONFIG_SRC_ENV);
	CHECK(!strcmp(cfg.origin[WEX_CF_BEGIN_WRITE_TIMEOUT_MS], "WEX_BEGIN_WRITE_TIMEOUT_MS"));
	CHECK(cfg.sync_timeout_ms == 7000);
	CHECK(cfg.source[WEX_CF_SYNC_TIMEOUT_MS] == WEX_CONFIG_SRC_FILE);
	CHECK(!strcmp(cfg.origin[WEX_CF_SYNC_TIMEOUT_MS], path));
	CHECK(cfg.io_backend == WEX_IO_URING && cfg.source[WEX_CF_IO_BACKEND] == WEX_CONFIG_SRC_ENV);
	CHECK(cfg.log_level == WEX_LOG_DEBUG && cfg.source[WEX_CF_LOG_LEVEL] == WEX_CONFIG_SRC_FILE);
	CHECK(!strcmp(cfg.socket, "/tmp/file.sock"));
	CHECK(cfg.socket_mode == 0600);
	CHECK(cfg.socket_group.gid == 0 && !strcmp(cfg.socket_group.name, "0"));
	CHECK(cfg.watchdog == 1 && cfg.source[WEX_CF_WATCHDOG] == WEX_CONFIG_SRC_ENV);
	CHECK(cfg.max_clients == 1024 && cfg.source[WEX_CF_MAX_CLIENTS] == WEX_CONFIG_SRC_DEFAULT);

	/* Runtime set over the environment. */
	CHECK(wex__config_set(&cfg, "begin_write_timeout_ms", "8000", err, sizeof(err)) == 0);
	CHECK(cfg.begin_write_timeout_ms == 8000);
	CHECK(cfg.source[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] == WEX_CONFIG_SRC_RUNTIME);
	CHECK(cfg.origin[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] == NULL);

	/* Status shows value, source, default, modifiable and doc per field. */
	j = wex__config_to_json(&cfg);
	CHECK(j != NULL);
	CHECK(!strcmp(src(j, "begin_write_timeout_ms"), "runtime"));
	CHECK(!strcmp(src(j, "sync_timeout_ms"), "file"));
	CHECK(!strcmp(src(j, "io_backend"), "env"));
	CHECK(!strcmp(src(j, "max_clients"), "default"));
	e = json_object_get(j, "begin_write_timeout_ms");
	CHECK(json_integer_value(json_object_get(e, "value")) == 8000);
	CHECK(json_integer_value(json_object_get(e, "default")) == 30000);
	CHECK(json_is_true(json_object_get(e, "modifiable")));
	CHECK(json_is_string(json_object_get(e, "doc")));
	e = json_object_get(j, "socket");
	CHECK(json_is_false(json_object_get(e, "modifiable")));
	CHECK(!strcmp(json_string_value(json_object_get(e, "origin")), path));
	e = json_object_get(j, "socket_mode");
	CHECK(!strcmp(json_string_value(json_object_get(e, "value")), "0600"));
	CHECK(json_object_size(j) == WEX_CF_COUNT);
	json_decref(j);

	wex__config_log(&cfg);
	wex__config_free(&cfg);
	unlink(path);
	free(path);
	printf("PASS\n");
	return T_EXIT_PASS;
}
