/* SPDX-License-Identifier: MIT */
/* ops_test.h - the few helpers the tests/ops programs share: exit codes
 * (liburing's T_EXIT_*), a check that names the failing line, and files. */
#ifndef WEX_OPS_TEST_H
#define WEX_OPS_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,       \
				__LINE__, #cond);                                    \
			exit(T_EXIT_FAIL);                                           \
		}                                                                    \
	} while (0)

#define CHECK_CONTAINS(hay, needle)                                                  \
	do {                                                                         \
		if (!strstr((hay), (needle))) {                                      \
			fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n",    \
				__FILE__, __LINE__, (hay), (needle));                \
			exit(T_EXIT_FAIL);                                           \
		}                                                                    \
	} while (0)

/* Writes text to a new temporary file; returns its malloc'd path. */
static inline char *t_write_tmp(const char *text)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	size_t len = strlen(dir) + 32;
	char *path = malloc(len);
	FILE *f;
	int fd;

	CHECK(path != NULL);
	snprintf(path, len, "%s/wex-ops-XXXXXX", dir);
	fd = mkstemp(path);
	CHECK(fd >= 0);
	f = fdopen(fd, "w");
	CHECK(f != NULL);
	CHECK(fputs(text, f) >= 0);
	CHECK(fclose(f) == 0);
	return path;
}

/* Clears every variable the configuration reads, so the caller's
 * environment cannot change a test's outcome. */
static inline void t_clear_env(void)
{
	static const char *const vars[] = { "WEX_SOCKET", "WEX_SOCKET_MODE", "WEX_SOCKET_GROUP",
		"WEX_IO", "WEX_LOG_LEVEL", "WEX_BEGIN_WRITE_TIMEOUT_MS", "WEX_SYNC_TIMEOUT_MS",
		"WEX_MAX_MESSAGE_BYTES", "WEX_MAX_CLIENTS", "WEX_WATCHDOG", "WEX_DRAIN_TIMEOUT_MS",
		"WEX_MAX_OPEN_FILES" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
}

#endif
