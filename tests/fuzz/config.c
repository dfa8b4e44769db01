/* SPDX-License-Identifier: MIT */
/*
 * config.c - fuzzes wexd's configuration (config.h): the input up to its
 * first NUL byte is the JSON file, read by wex__config_load through a
 * memfd; after it, each line NAME=VALUE is a runtime "config set"
 * (wex__config_set), or with a leading '-' a command-line flag
 * (wex__config_set_flag).  The WEX_* environment is cleared first.
 *
 * A refusal must say why.  A configuration it loads must hold values in
 * their ranges; a set that fails must leave the configuration as it was
 * (config.h), one that succeeds must record its source; and reloading the
 * unchanged file must succeed and report nothing changed.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "fuzz.h"
#include "log.h"

static const char *const env_vars[] = {
	"WEX_SOCKET",	       "WEX_SOCKET_MODE",     "WEX_SOCKET_GROUP",
	"WEX_IO",	       "WEX_LOG_LEVEL",	      "WEX_BEGIN_WRITE_TIMEOUT_MS",
	"WEX_SYNC_TIMEOUT_MS", "WEX_MAX_MESSAGE_BYTES", "WEX_MAX_CLIENTS",
	"WEX_WATCHDOG",	       "WEX_DRAIN_TIMEOUT_MS", "WEX_MAX_OPEN_FILES",
};

static char *dump(const struct wex_config *cfg)
{
	json_t *j = wex__config_to_json(cfg);
	char *s;

	FZ_ASSERT(j, "config_to_json failed");
	s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	FZ_ASSERT(s, "config_to_json does not serialise");
	json_decref(j);
	return s;
}

static void check_values(const struct wex_config *cfg)
{
	FZ_ASSERT(cfg->socket && cfg->socket[0] == '/' &&
			  strlen(cfg->socket) < sizeof(((struct sockaddr_un *)0)->sun_path),
		  "socket \"%s\"", cfg->socket ? cfg->socket : "(null)");
	FZ_ASSERT(cfg->socket_mode <= 0777, "socket_mode %o", cfg->socket_mode);
	FZ_ASSERT(cfg->socket_group.gid >= -1 && cfg->socket_group.gid < UINT32_MAX &&
			  (cfg->socket_group.gid < 0) == !cfg->socket_group.name,
		  "socket_group %lld", (long long)cfg->socket_group.gid);
	FZ_ASSERT(cfg->io_backend >= WEX_IO_AUTO && cfg->io_backend <= WEX_IO_EPOLL, "io_backend %d",
		  cfg->io_backend);
	FZ_ASSERT(cfg->log_level >= WEX_LOG_ERROR && cfg->log_level <= WEX_LOG_TRACE,
		  "log_level %d", cfg->log_level);
	FZ_ASSERT(cfg->max_message_bytes >= 4096 && cfg->max_message_bytes <= 16 << 20,
		  "max_message_bytes %lld", (long long)cfg->max_message_bytes);
	FZ_ASSERT(cfg->max_clients >= 1 && cfg->max_clients <= 65536, "max_clients %lld",
		  (long long)cfg->max_clients);
	FZ_ASSERT(cfg->begin_write_timeout_ms >= 0 && cfg->sync_timeout_ms >= 0 &&
			  cfg->drain_timeout_ms >= 0 && cfg->max_open_files >= 0,
		  "a negative time or limit");
	for (size_t i = 0; i < cfg->models.n; i++) {
		const struct wex_model_acl *a = &cfg->models.v[i];

		FZ_ASSERT(a->name && a->name[0] && strlen(a->name) < WEX_NAME_MAX, "model %zu name",
			  i);
		FZ_ASSERT(a->producers.present || (!a->producers.uids.n && !a->producers.gids.n),
			  "model %s: ids for an absent role", a->name);
		FZ_ASSERT(a->consumers.present || (!a->consumers.uids.n && !a->consumers.gids.n),
			  "model %s: ids for an absent role", a->name);
	}
	for (int i = 0; i < WEX_CF_COUNT; i++)
		FZ_ASSERT(cfg->source[i] <= WEX_CONFIG_SRC_FLAG, "field %d source %d", i,
			  cfg->source[i]);
}

static void set_one(struct wex_config *cfg, char *line)
{
	char *eq = strchr(line, '='), err[1024] = "", *before, *after;
	int flag = line[0] == '-', ret, i;

	if (!eq)
		return;
	*eq = '\0';
	before = dump(cfg);
	if (flag)
		ret = wex__config_set_flag(cfg, line + 1, eq + 1, "--flag", err, sizeof(err));
	else
		ret = wex__config_set(cfg, line, eq + 1, err, sizeof(err));
	after = dump(cfg);
	if (ret < 0) {
		FZ_ASSERT(err[0], "set %s refused without a reason (%d)", line, ret);
		FZ_ASSERT(ret == -ENOENT || ret == -EPERM || ret == -EINVAL || ret == -ERANGE ||
				  ret == -ENAMETOOLONG,
			  "set %s: %d", line, ret);
		FZ_ASSERT(!strcmp(before, after), "a refused set of %s changed the configuration",
			  line + flag);
	} else {
		FZ_ASSERT(ret == 0, "set %s: %d", line, ret);
		i = wex__config_field_index(line + flag);
		FZ_ASSERT(i >= 0, "set an unknown field %s", line + flag);
		FZ_ASSERT(cfg->source[i] == (flag ? WEX_CONFIG_SRC_FLAG : WEX_CONFIG_SRC_RUNTIME),
			  "%s: source %d after a set", line + flag, cfg->source[i]);
		check_values(cfg);
	}
	free(before);
	free(after);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	const uint8_t *nul = memchr(data, 0, size);
	size_t flen = nul ? (size_t)(nul - data) : size;
	char path[64], err[1024] = "", *sets, *line, *next;
	struct wex_config cfg;
	json_t *report = NULL;
	int fd, ret;

	if (!init) {
		for (size_t i = 0; i < WEX_ARRAY_SIZE(env_vars); i++)
			unsetenv(env_vars[i]);
		wex__log_level = WEX_LOG_ERROR;
		init = 1;
	}
	fd = memfd_create("fz-config", MFD_CLOEXEC);
	FZ_ASSERT(fd >= 0, "memfd_create: %s", strerror(errno));
	FZ_ASSERT(flen == 0 || write(fd, data, flen) == (ssize_t)flen, "write: %s",
		  strerror(errno));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ret = wex__config_load(&cfg, path, 1, err, sizeof(err));
	if (ret < 0) {
		FZ_ASSERT(err[0], "refused without a reason (%d)", ret);
		close(fd);
		return 0;
	}
	check_values(&cfg);
	sets = nul ? fz_strdup(nul + 1, size - flen - 1) : fz_strdup(data, 0);
	for (line = sets; line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		set_one(&cfg, line);
	}
	free(sets);
	ret = wex__config_reload(&cfg, &report, err, sizeof(err));
	FZ_ASSERT(ret == 0, "reloading the same file: %s", err);
	FZ_ASSERT(!json_array_size(json_object_get(report, "changed")) &&
			  !json_array_size(json_object_get(report, "restart_needed")),
		  "reloading the same file changed something");
	check_values(&cfg);
	json_decref(report);
	wex__config_free(&cfg);
	close(fd);
	return 0;
}
