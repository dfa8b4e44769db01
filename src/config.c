/* SPDX-License-Identifier: MIT */
/* config.c - wexd's configuration table, its layers and access lists.  See
 * config.h for the rules; this file keeps them in one table so that the
 * loader, "config set", reload and status cannot disagree about a field. */
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "proto.h"
#include "wex.h"

enum ftype { FT_STRING, FT_INT, FT_BOOL, FT_ENUM, FT_MODE, FT_GROUP, FT_MODELS };

#define F_MODIFIABLE 1 /* runtime "config set" (and reload) may change it */
#define F_RELOAD 2     /* SIGHUP may change it; otherwise it needs a restart */

/* A parsed value before it is stored, so that a bad value changes nothing. */
union fval {
	char *s;
	int64_t i;
	int b;
	uint32_t mode;
	struct wex_group_ref g;
	struct wex_models m;
};

struct field;
/* Extra check after the type's own parsing; writes the reason to why. */
typedef int (*validate_fn)(const struct field *f, const union fval *v, char *why, size_t len);

struct field {
	const char *name;
	enum ftype type;
	size_t off, size;
	const char *env;   /* WEX_* variable, NULL: file only */
	const char *def;   /* default as text, NULL: none or computed */
	int64_t min, max;  /* FT_INT */
	const char *const *names; /* FT_ENUM, NULL-terminated */
	validate_fn validate;
	int flags;
	const char *doc;
};

static int validate_socket(const struct field *f, const union fval *v, char *why, size_t len);

static const char *const io_names[] = { "auto", "io_uring", "epoll", NULL };
/* Indexed like enum wex_log_level in log.h. */
static const char *const level_names[] = { "error", "warn", "info", "debug", "trace", NULL };

#define FLD(m) offsetof(struct wex_config, m), sizeof(((struct wex_config *)0)->m)
#define DAY_MS 86400000LL

static const struct field fields[WEX_CF_COUNT] = {
	[WEX_CF_SOCKET] = { "socket", FT_STRING, FLD(socket), "WEX_SOCKET", NULL, 0, 0, NULL,
		validate_socket, 0,
		"listening socket path; default $XDG_RUNTIME_DIR/wex/wexd.sock for a user, "
		"/run/wex/wexd.sock for root or a system service; ignored under socket activation" },
	[WEX_CF_SOCKET_MODE] = { "socket_mode", FT_MODE, FLD(socket_mode), "WEX_SOCKET_MODE", "0660",
		0, 0, NULL, NULL, 0,
		"permission bits of the socket file, an octal string; under socket activation "
		"wexd.socket's SocketMode= applies instead" },
	[WEX_CF_SOCKET_GROUP] = { "socket_group", FT_GROUP, FLD(socket_group), "WEX_SOCKET_GROUP",
		NULL, 0, 0, NULL, NULL, 0,
		"group (name or gid) that owns the socket file, so its members may connect; "
		"null: the daemon's group; under socket activation wexd.socket's SocketGroup= "
		"applies instead" },
	[WEX_CF_IO_BACKEND] = { "io_backend", FT_ENUM, FLD(io_backend), "WEX_IO", "auto", 0, 0,
		io_names, NULL, 0,
		"event loop: auto (io_uring, epoll when io_uring is unavailable), io_uring or epoll" },
	[WEX_CF_LOG_LEVEL] = { "log_level", FT_ENUM, FLD(log_level), "WEX_LOG_LEVEL", "info", 0, 0,
		level_names, NULL, F_MODIFIABLE | F_RELOAD, "error, warn, info, debug or trace" },
	[WEX_CF_BEGIN_WRITE_TIMEOUT_MS] = { "begin_write_timeout_ms", FT_INT,
		FLD(begin_write_timeout_ms), "WEX_BEGIN_WRITE_TIMEOUT_MS", "30000", 0, DAY_MS, NULL,
		NULL, F_MODIFIABLE | F_RELOAD,
		"how long begin_write waits for leases on the buffer before EBUSY (0: fail at once)" },
	[WEX_CF_SYNC_TIMEOUT_MS] = { "sync_timeout_ms", FT_INT, FLD(sync_timeout_ms),
		"WEX_SYNC_TIMEOUT_MS", "60000", 0, DAY_MS, NULL, NULL, F_MODIFIABLE | F_RELOAD,
		"how long a consumer's sync may wait for a published version before ETIMEDOUT" },
	[WEX_CF_MAX_MESSAGE_BYTES] = { "max_message_bytes", FT_INT, FLD(max_message_bytes),
		"WEX_MAX_MESSAGE_BYTES", "65536", 4096, 16 << 20, NULL, NULL, 0,
		"largest control message accepted; larger tables travel in a sealed memfd" },
	[WEX_CF_MAX_CLIENTS] = { "max_clients", FT_INT, FLD(max_clients), "WEX_MAX_CLIENTS", "1024",
		1, 65536, NULL, NULL, F_RELOAD,
		"connections beyond this many are refused (existing ones stay); root and wexd's "
		"own user may open 4 more (wexctl status, config reload)" },
	[WEX_CF_MAX_CLIENTS_PER_UID] = { "max_clients_per_uid", FT_INT, FLD(max_clients_per_uid),
		"WEX_MAX_CLIENTS_PER_UID", "0", 0, 65536, NULL, NULL, F_RELOAD,
		"connections one user (uid) may hold at once, so that one user cannot take every "
		"max_clients slot; root and wexd's own user are not capped; 0: no cap" },
	[WEX_CF_WATCHDOG] = { "watchdog", FT_BOOL, FLD(watchdog), "WEX_WATCHDOG", "true", 0, 0,
		NULL, NULL, 0, "send WATCHDOG=1 to systemd when the unit sets WatchdogSec=" },
	[WEX_CF_DRAIN_TIMEOUT_MS] = { "drain_timeout_ms", FT_INT, FLD(drain_timeout_ms),
		"WEX_DRAIN_TIMEOUT_MS", "10000", 0, 3600000, NULL, NULL, F_MODIFIABLE | F_RELOAD,
		"on SIGTERM, how long to wait for leases and in-flight requests before exiting" },
	[WEX_CF_MAX_OPEN_FILES] = { "max_open_files", FT_INT, FLD(max_open_files),
		"WEX_MAX_OPEN_FILES", "0", 0, 1 << 30, NULL, NULL, 0,
		"file-descriptor limit wexd sets for itself at start (it holds one per exported "
		"allocation: an expandable-segments trainer exports one per 20 MiB); 0: raise "
		"the soft limit to the hard limit, at most 1048576" },
	[WEX_CF_MAX_TABLE_BYTES] = { "max_table_bytes", FT_INT, FLD(max_table_bytes),
		"WEX_MAX_TABLE_BYTES", "0", 0, INT64_MAX, NULL, NULL, F_MODIFIABLE | F_RELOAD,
		"bytes of tensor tables (producers' and consumers' layouts) wexd holds for its "
		"clients at most, each tensor counted at its size in wexd's memory; a table past "
		"it is refused (ENOMEM); 0: a quarter of the machine's memory" },
	[WEX_CF_PLANNER_THREADS] = { "planner_threads", FT_INT, FLD(planner_threads),
		"WEX_PLANNER_THREADS", "4", 1, 256, NULL, NULL, F_MODIFIABLE | F_RELOAD,
		"plans built at once, each on a thread of its own (a plan of millions of cells "
		"takes seconds and up to about 1.5 GB while built); a fetch whose plan would be "
		"one more waits until one is done" },
	[WEX_CF_MODELS] = { "models", FT_MODELS, FLD(models), NULL, NULL, 0, 0, NULL, NULL, F_RELOAD,
		"per-model access lists {\"<model>|*\": {\"producers\": {\"uids\": [..], \"gids\": "
		"[..]}, \"consumers\": {..}}}; an absent model or role admits any local user, "
		"root is always admitted" },
};

static wex_config_groups_fn groups_fn;

static void *fptr(const struct wex_config *cfg, const struct field *f)
{
	return (char *)cfg + f->off;
}

static void models_free(struct wex_models *m)
{
	for (size_t i = 0; i < m->n; i++) {
		free(m->v[i].name);
		free(m->v[i].producers.uids.ids);
		free(m->v[i].producers.gids.ids);
		free(m->v[i].consumers.uids.ids);
		free(m->v[i].consumers.gids.ids);
	}
	free(m->v);
	json_decref(m->json);
	memset(m, 0, sizeof(*m));
}

static void fval_free(const struct field *f, union fval *v)
{
	switch (f->type) {
	case FT_STRING:
		free(v->s);
		break;
	case FT_GROUP:
		free(v->g.name);
		break;
	case FT_MODELS:
		models_free(&v->m);
		break;
	default:
		break;
	}
	memset(v, 0, sizeof(*v));
}

/* Takes ownership of *v: frees the field's old value and stores the new. */
static void fval_store(struct wex_config *cfg, const struct field *f, union fval *v)
{
	union fval old;

	memcpy(&old, fptr(cfg, f), f->size);
	fval_free(f, &old);
	memcpy(fptr(cfg, f), v, f->size);
	memset(v, 0, sizeof(*v));
}

/* The field's value as JSON (new reference), for status and comparison. */
static json_t *fval_json(const struct wex_config *cfg, const struct field *f)
{
	union fval v;
	char buf[16];

	memcpy(&v, fptr(cfg, f), f->size);
	switch (f->type) {
	case FT_STRING:
		return v.s ? json_string(v.s) : json_null();
	case FT_INT:
		return json_integer(v.i);
	case FT_BOOL:
		return json_boolean(v.b);
	case FT_ENUM:
		return json_string(f->names[v.b]);
	case FT_MODE:
		snprintf(buf, sizeof(buf), "%04o", (unsigned)v.mode);
		return json_string(buf);
	case FT_GROUP:
		return v.g.name ? json_string(v.g.name) : json_null();
	case FT_MODELS:
		return v.m.json ? json_deep_copy(v.m.json) : json_object();
	}
	return json_null();
}

/* A short rendering of a bad value for error messages. */
static void describe(json_t *v, char *buf, size_t len)
{
	char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);

	if (!s) {
		snprintf(buf, len, "?");
		return;
	}
	if (strlen(s) > 64) {
		size_t cut = 58;

		/* Not inside a UTF-8 character: the message goes to the log
		 * and to wexctl, both of which want UTF-8. */
		while (cut && ((unsigned char)s[cut] & 0xc0) == 0x80)
			cut--;
		strcpy(s + cut, "...");
	}
	snprintf(buf, len, "%s", s);
	free(s);
}

static int validate_socket(const struct field *f, const union fval *v, char *why, size_t len)
{
	struct sockaddr_un sa;

	if (v->s[0] != '/') {
		snprintf(why, len, "expected an absolute path, got \"%s\"", v->s);
		return -EINVAL;
	}
	if (strlen(v->s) >= sizeof(sa.sun_path)) {
		snprintf(why, len, "path is longer than %zu bytes", sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	return 0;
}

static int parse_id(json_t *e, int group, uint32_t *out, char *why, size_t len)
{
	char buf[80];

	if (json_is_integer(e)) {
		json_int_t n = json_integer_value(e);

		/* (uid_t)-1 means "no id" to the kernel; never let it match. */
		if (n < 0 || n >= (json_int_t)UINT32_MAX) {
			snprintf(why, len, "id %lld out of range", (long long)n);
			return -EINVAL;
		}
		*out = (uint32_t)n;
		return 0;
	}
	if (json_is_string(e) && json_string_length(e) > 0) {
		const char *name = json_string_value(e);
		char pwbuf[16384];
		int rc;

		if (group) {
			struct group gr, *res = NULL;

			rc = getgrnam_r(name, &gr, pwbuf, sizeof(pwbuf), &res);
			if (!rc && res) {
				*out = (uint32_t)res->gr_gid;
				return 0;
			}
		} else {
			struct passwd pw, *res = NULL;

			rc = getpwnam_r(name, &pw, pwbuf, sizeof(pwbuf), &res);
			if (!rc && res) {
				*out = (uint32_t)res->pw_uid;
				return 0;
			}
		}
		if (rc)
			snprintf(why, len, "cannot look up %s \"%s\": %s", group ? "group" : "user",
				 name, strerror(rc));
		else
			snprintf(why, len, "unknown %s \"%s\"", group ? "group" : "user", name);
		return -EINVAL;
	}
	describe(e, buf, sizeof(buf));
	snprintf(why, len, "expected a %s name or a non-negative integer id, got %s",
		 group ? "group" : "user", buf);
	return -EINVAL;
}

static int parse_idlist(json_t *arr, int group, struct wex_idlist *out, char *sub, size_t sublen,
			char *why, size_t len)
{
	size_t i, n = json_array_size(arr);
	json_t *e;
	int rc;

	if (!json_is_array(arr)) {
		snprintf(why, len, "expected an array of %s names or ids", group ? "group" : "user");
		return -EINVAL;
	}
	out->ids = calloc(n ? n : 1, sizeof(*out->ids));
	if (!out->ids) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	json_array_foreach(arr, i, e) {
		rc = parse_id(e, group, &out->ids[i], why, len);
		if (rc < 0) {
			size_t l = strlen(sub);

			snprintf(sub + l, sublen - l, "[%zu]", i);
			return rc;
		}
	}
	out->n = n;
	return 0;
}

static int parse_role(json_t *obj, struct wex_role_acl *r, char *sub, size_t sublen, char *why,
		      size_t len)
{
	const char *key;
	json_t *v;
	int rc;

	if (!json_is_object(obj)) {
		snprintf(why, len, "expected an object with \"uids\" and/or \"gids\"");
		return -EINVAL;
	}
	r->present = 1;
	json_object_foreach(obj, key, v) {
		size_t l = strlen(sub);
		int group;

		if (!strcmp(key, "uids"))
			group = 0;
		else if (!strcmp(key, "gids"))
			group = 1;
		else {
			snprintf(sub + l, sublen - l, ".%s", key);
			snprintf(why, len, "unknown field (expected \"uids\" or \"gids\")");
			return -EINVAL;
		}
		snprintf(sub + l, sublen - l, ".%s", key);
		rc = parse_idlist(v, group, group ? &r->gids : &r->uids, sub, sublen, why, len);
		if (rc < 0)
			return rc;
		sub[l] = '\0';
	}
	return 0;
}

static int parse_models(json_t *obj, struct wex_models *m, char *sub, size_t sublen, char *why,
			size_t len)
{
	const char *name, *key;
	json_t *entry, *v;
	int rc;

	if (!json_is_object(obj)) {
		snprintf(why, len, "expected an object of model names");
		return -EINVAL;
	}
	m->v = calloc(json_object_size(obj) + 1, sizeof(*m->v));
	if (!m->v) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	json_object_foreach(obj, name, entry) {
		struct wex_model_acl *a = &m->v[m->n];

		snprintf(sub, sublen, ".%s", name);
		if (!*name || strlen(name) >= WEX_NAME_MAX) {
			snprintf(why, len, "a model name must have 1 to %d bytes", WEX_NAME_MAX - 1);
			return -EINVAL;
		}
		/* As wexd refuses them in a client's hello: no client could
		 * name such a model, and the entry would silently do nothing. */
		if (!wex__name_printable(name)) {
			snprintf(sub, sublen, "%s", "");
			snprintf(why, len, "a model name may not hold control characters");
			return -EINVAL;
		}
		/* "*" is the only pattern: "prod-*" would match nothing and
		 * leave those models open, silently. */
		if (strchr(name, '*') && strcmp(name, "*")) {
			snprintf(why, len, "'*' stands alone (every other model), not in a name: "
				 "list the models by name");
			return -EINVAL;
		}
		if (!json_is_object(entry)) {
			snprintf(why, len, "expected an object with \"producers\" and/or \"consumers\"");
			return -EINVAL;
		}
		a->name = strdup(name);
		if (!a->name) {
			snprintf(why, len, "out of memory");
			return -ENOMEM;
		}
		m->n++;
		json_object_foreach(entry, key, v) {
			size_t l = strlen(sub);

			snprintf(sub + l, sublen - l, ".%s", key);
			if (!strcmp(key, "producers"))
				rc = parse_role(v, &a->producers, sub, sublen, why, len);
			else if (!strcmp(key, "consumers"))
				rc = parse_role(v, &a->consumers, sub, sublen, why, len);
			else {
				snprintf(why, len,
					 "unknown field (expected \"producers\" or \"consumers\")");
				rc = -EINVAL;
			}
			if (rc < 0)
				return rc;
			sub[l] = '\0';
		}
	}
	sub[0] = '\0';
	m->json = json_deep_copy(obj);
	if (!m->json) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static int parse_group(json_t *v, struct wex_group_ref *g, char *why, size_t len)
{
	char buf[32];
	uint32_t id;
	int rc;

	g->gid = -1;
	if (json_is_null(v))
		return 0;
	if (json_is_string(v)) {
		const char *s = json_string_value(v);
		char *end;
		unsigned long n;

		/* A string of digits is a gid, as chown(1) reads it. */
		errno = 0;
		n = strtoul(s, &end, 10);
		if (*s && !*end && s[0] != '-' && !errno && n < UINT32_MAX) {
			id = (uint32_t)n;
		} else {
			rc = parse_id(v, 1, &id, why, len);
			if (rc < 0)
				return rc;
		}
		g->name = strdup(s);
	} else {
		rc = parse_id(v, 1, &id, why, len);
		if (rc < 0)
			return rc;
		snprintf(buf, sizeof(buf), "%u", id);
		g->name = strdup(buf);
	}
	if (!g->name) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	g->gid = id;
	return 0;
}

/* Parses v for field f into *out.  On error returns a negative errno, writes
 * the reason to why and a sub-path (".policy.producers.uids[1]") to sub, and
 * leaves nothing allocated. */
static int parse_value(const struct field *f, json_t *v, union fval *out, char *sub, size_t sublen,
		       char *why, size_t len)
{
	char got[80];
	int rc = 0;

	memset(out, 0, sizeof(*out));
	sub[0] = '\0';
	describe(v, got, sizeof(got));
	switch (f->type) {
	case FT_STRING:
		if (!json_is_string(v) || !json_string_length(v)) {
			snprintf(why, len, "expected a non-empty string, got %s", got);
			return -EINVAL;
		}
		out->s = strdup(json_string_value(v));
		if (!out->s) {
			snprintf(why, len, "out of memory");
			return -ENOMEM;
		}
		break;
	case FT_INT:
		if (!json_is_integer(v)) {
			if (f->min == 0)
				snprintf(why, len, "expected a non-negative integer, got %s", got);
			else if (f->min == 1)
				snprintf(why, len, "expected a positive integer, got %s", got);
			else
				snprintf(why, len, "expected an integer >= %lld, got %s",
					 (long long)f->min, got);
			return -EINVAL;
		}
		out->i = json_integer_value(v);
		if (out->i < f->min || out->i > f->max) {
			snprintf(why, len, "expected an integer in [%lld, %lld], got %s",
				 (long long)f->min, (long long)f->max, got);
			return -ERANGE;
		}
		break;
	case FT_BOOL:
		if (!json_is_boolean(v)) {
			snprintf(why, len, "expected true or false, got %s", got);
			return -EINVAL;
		}
		out->b = json_is_true(v);
		break;
	case FT_ENUM: {
		char list[128] = "";

		for (int i = 0; json_is_string(v) && f->names[i]; i++) {
			/* (Any case, as libwex reads WEX_LOG_LEVEL.) */
			if (!strcasecmp(json_string_value(v), f->names[i])) {
				out->b = i;
				goto out_validate;
			}
		}
		for (int i = 0; f->names[i]; i++) {
			size_t l = strlen(list);

			snprintf(list + l, sizeof(list) - l, "%s%s", i ? "|" : "", f->names[i]);
		}
		snprintf(why, len, "expected one of %s, got %s", list, got);
		return -EINVAL;
	}
	case FT_MODE: {
		const char *s = json_is_string(v) ? json_string_value(v) : "";
		char *end;
		unsigned long m;

		/* A string, because JSON has no octal numbers and 660 read as
		 * decimal would be a surprising mode. */
		/* Octal digits only (strtoul takes blanks and a sign). */
		m = strtoul(s, &end, 8);
		if (!*s || *end || s[strspn(s, "01234567")] || m > 0777) {
			snprintf(why, len, "expected an octal mode string such as \"0660\", got %s",
				 got);
			return -EINVAL;
		}
		out->mode = (uint32_t)m;
		break;
	}
	case FT_GROUP:
		rc = parse_group(v, &out->g, why, len);
		break;
	case FT_MODELS:
		rc = parse_models(v, &out->m, sub, sublen, why, len);
		break;
	}
	if (rc < 0)
		goto err_free;
out_validate:
	if (f->validate) {
		rc = f->validate(f, out, why, len);
		if (rc < 0)
			goto err_free;
	}
	return 0;

err_free:
	fval_free(f, out);
	return rc;
}

/* Text (environment, "config set", defaults) to JSON by the field's type:
 * numbers and booleans are converted when they parse, and otherwise kept as
 * a string so the error shows what was given. */
static json_t *text_json(const struct field *f, const char *s)
{
	static const char *const yes[] = { "true", "1", "yes", "on" };
	static const char *const no[] = { "false", "0", "no", "off" };
	char *end;
	long long n;

	switch (f->type) {
	case FT_INT:
		errno = 0;
		n = strtoll(s, &end, 10);
		if (*s && !*end && !errno && s[0] != ' ')
			return json_integer(n);
		break;
	case FT_BOOL:
		for (size_t i = 0; i < WEX_ARRAY_SIZE(yes); i++) {
			if (!strcasecmp(s, yes[i]))
				return json_true();
			if (!strcasecmp(s, no[i]))
				return json_false();
		}
		break;
	case FT_GROUP:
		if (!*s || !strcmp(s, "none"))
			return json_null();
		break;
	case FT_MODELS:
		return json_loads(s, JSON_REJECT_DUPLICATES, NULL);
	default:
		break;
	}
	return json_string(s);
}

static void set_origin(struct wex_config *cfg, int i, int source, const char *origin)
{
	free(cfg->origin[i]);
	cfg->origin[i] = origin ? strdup(origin) : NULL;
	cfg->source[i] = (uint8_t)source;
}

/* Builds the socket default without $WEX_SOCKET, which the environment
 * layer applies itself so that status names it as the source. */
static int socket_default(char *buf, size_t len)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	int n;

	if (geteuid() != 0 && xdg && xdg[0] == '/')
		n = snprintf(buf, len, "%s/wex/wexd.sock", xdg);
	else
		n = snprintf(buf, len, "%s", WEX_CONFIG_SYSTEM_SOCKET);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int wex__config_default_socket(char *buf, size_t len)
{
	const char *s = getenv("WEX_SOCKET");
	int n;

	if (s && *s) {
		n = snprintf(buf, len, "%s", s);
		return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
	}
	return socket_default(buf, len);
}

/* Edit distance of two short names ('-' and '_' counted equal), capped. */
static int name_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	int row[64], prev, cur;

	if (la >= WEX_ARRAY_SIZE(row) || lb >= WEX_ARRAY_SIZE(row))
		return INT_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		prev = row[0];
		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int same = a[i - 1] == b[j - 1] ||
				   ((a[i - 1] == '-' || a[i - 1] == '_') &&
				    (b[j - 1] == '-' || b[j - 1] == '_'));

			cur = prev + !same;
			if (row[j] + 1 < cur)
				cur = row[j] + 1;
			if (row[j - 1] + 1 < cur)
				cur = row[j - 1] + 1;
			prev = row[j];
			row[j] = cur;
		}
	}
	return row[lb];
}

/* "unknown field (did you mean 'log_level'?; fields: socket, ...)": what an
 * operator needs to fix a typo without opening the documentation. */
int wex__config_unknown_field(const char *name, char *why, size_t len)
{
	int best = -1, bestd = 3; /* suggest within 2 edits only */
	size_t l;

	for (int i = 0; i < WEX_CF_COUNT; i++) {
		int dist = name_distance(name, fields[i].name);

		/* "sync_timeout" for "sync_timeout_ms": a unit left out. */
		if (dist >= bestd && strlen(name) >= 4 &&
		    !strncmp(name, fields[i].name, strlen(name)))
			dist = bestd - 1;

		if (dist < bestd) {
			bestd = dist;
			best = i;
		}
	}
	if (best >= 0)
		snprintf(why, len, "unknown field (did you mean '%s'?; fields:", fields[best].name);
	else
		snprintf(why, len, "unknown field (fields:");
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		l = strlen(why);
		snprintf(why + l, len - l, "%s %s", i ? "," : "", fields[i].name);
	}
	l = strlen(why);
	snprintf(why + l, len - l, ")");
	return -ENOENT;
}

/* Parses text or JSON for one field and stores it with its source. */
static int apply(struct wex_config *cfg, int i, json_t *v, int source, const char *origin,
		 const char *where, char *err, size_t errlen)
{
	const struct field *f = &fields[i];
	char why[256], sub[WEX_NAME_MAX + 64];
	union fval val;
	int rc;

	rc = parse_value(f, v, &val, sub, sizeof(sub), why, sizeof(why));
	if (rc < 0) {
		snprintf(err, errlen, "%s: field '%s%s': %s", where, f->name, sub, why);
		return rc;
	}
	fval_store(cfg, f, &val);
	set_origin(cfg, i, source, origin);
	return 0;
}

static int apply_defaults(struct wex_config *cfg, char *err, size_t errlen)
{
	char sock[sizeof(((struct sockaddr_un *)0)->sun_path) + 64];
	json_t *v;
	int rc;

	cfg->socket_group.gid = -1;
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		const struct field *f = &fields[i];

		if (i == WEX_CF_SOCKET) {
			if (socket_default(sock, sizeof(sock)) < 0) {
				snprintf(err, errlen, "default socket path is too long");
				return -ENAMETOOLONG;
			}
			v = json_string(sock);
		} else if (f->type == FT_MODELS) {
			v = json_object();
		} else if (!f->def) {
			continue;
		} else {
			v = text_json(f, f->def);
		}
		if (!v)
			return -ENOMEM;
		rc = apply(cfg, i, v, WEX_CONFIG_SRC_DEFAULT, NULL, "default", err, errlen);
		json_decref(v);
		if (rc < 0)
			return rc;
	}
	return 0;
}

static int apply_file(struct wex_config *cfg, const char *path, int path_explicit, char *err,
		      size_t errlen)
{
	json_error_t jerr;
	const char *key;
	json_t *root, *v;
	struct stat st;
	int rc = 0;

	/* Only a missing default file is fine: an explicit one that is missing,
	 * or any file we may not read, is an error (loud failure). */
	if (stat(path, &st) < 0) {
		if (errno == ENOENT && !path_explicit)
			return 0;
		rc = -errno;
		snprintf(err, errlen, "config %s: %s", path, strerror(errno));
		return rc;
	}
	cfg->file_found = 1;
	if (S_ISDIR(st.st_mode)) {
		/* jansson reads a directory as an empty file. */
		snprintf(err, errlen, "config %s: is a directory (name the JSON file, e.g. "
			 "%s)", path, WEX_CONFIG_DEFAULT_PATH);
		return -EISDIR;
	}
	root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		/* jansson reports open/read failures with line -1. */
		if (jerr.line < 1)
			snprintf(err, errlen, "config %s: %s", path, jerr.text);
		else
			snprintf(err, errlen, "config %s: line %d column %d: %s", path, jerr.line,
				 jerr.column, jerr.text);
		return -EINVAL;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "config %s: expected a JSON object at the top level", path);
		rc = -EINVAL;
		goto out_decref;
	}
	json_object_foreach(root, key, v) {
		char where[PATH_MAX + 16];
		int i = wex__config_field_index(key);

		if (i < 0) {
			char why[384];

			wex__config_unknown_field(key, why, sizeof(why));
			snprintf(err, errlen, "config %s: field '%s': %s", path, key, why);
			rc = -EINVAL;
			goto out_decref;
		}
		snprintf(where, sizeof(where), "config %s", path);
		rc = apply(cfg, i, v, WEX_CONFIG_SRC_FILE, path, where, err, errlen);
		if (rc < 0)
			goto out_decref;
	}
out_decref:
	json_decref(root);
	return rc;
}

static int apply_env(struct wex_config *cfg, char *err, size_t errlen)
{
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		const struct field *f = &fields[i];
		char where[64];
		const char *s;
		json_t *v;
		int rc;

		/* An empty variable counts as unset, as shells make unsetting
		 * awkward in unit files and wrappers. */
		if (!f->env || !(s = getenv(f->env)) || !*s)
			continue;
		v = text_json(f, s);
		if (!v) {
			snprintf(err, errlen, "environment %s: field '%s': cannot parse \"%s\"", f->env,
				 f->name, s);
			return -EINVAL;
		}
		/* What the file says stays known: a reload says it is
		 * outranked, not passed over in silence. */
		free(cfg->shadowed[i]);
		cfg->shadowed[i] = NULL;
		if (cfg->source[i] == WEX_CONFIG_SRC_FILE) {
			json_t *fv = fval_json(cfg, f);

			cfg->shadowed[i] = fv ? json_dumps(fv, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
			json_decref(fv);
		}
		snprintf(where, sizeof(where), "environment %s", f->env);
		rc = apply(cfg, i, v, WEX_CONFIG_SRC_ENV, f->env, where, err, errlen);
		json_decref(v);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int wex__config_load(struct wex_config *out, const char *path, int path_explicit, char *err,
		     size_t errlen)
{
	struct wex_config cfg;
	int rc;

	memset(&cfg, 0, sizeof(cfg));
	if (!path) {
		path = WEX_CONFIG_DEFAULT_PATH;
		path_explicit = 0;
	}
	cfg.path = strdup(path);
	if (!cfg.path) {
		rc = -ENOMEM;
		snprintf(err, errlen, "config: out of memory");
		goto err_free;
	}
	cfg.path_explicit = path_explicit;
	WEX_CHECK_GOTO(apply_defaults(&cfg, err, errlen), rc, err_free);
	WEX_CHECK_GOTO(apply_file(&cfg, path, path_explicit, err, errlen), rc, err_free);
	WEX_CHECK_GOTO(apply_env(&cfg, err, errlen), rc, err_free);
	*out = cfg;
	return 0;

err_free:
	wex__config_free(&cfg);
	return rc;
}

/* The wexd.socket setting that decides field i where systemd passes the
 * socket (socket activation), or NULL for a field that is no socket's. */
static const char *socket_unit_key(int i)
{
	return i == WEX_CF_SOCKET ? "ListenSequentialPacket=" :
	       i == WEX_CF_SOCKET_MODE ? "SocketMode=" :
	       i == WEX_CF_SOCKET_GROUP ? "SocketGroup=" : NULL;
}

int wex__config_set(struct wex_config *cfg, const char *name, const char *value, char *err,
		    size_t errlen)
{
	int i = wex__config_field_index(name);
	json_t *v;
	int rc;

	if (i < 0) {
		char why[384];

		wex__config_unknown_field(name, why, sizeof(why));
		snprintf(err, errlen, "config set: field '%s': %s", name, why);
		return -ENOENT;
	}
	if (!(fields[i].flags & F_MODIFIABLE)) {
		/* The environment is read once, at start: a reload (SIGHUP)
		 * re-reads only the file. */
		/* The environment and a flag outrank the file, at a reload
		 * and at a restart alike: "set it in the file" would not do;
		 * nor would anything of wexd's where systemd passes the
		 * socket. */
		if (cfg->socket_passed && socket_unit_key(i))
			snprintf(err, errlen,
				 "config set: field '%s': cannot change at run time; systemd passes "
				 "wexd its socket (socket activation), so wexd's own settings do not "
				 "apply to it, now or after a restart: set %s in wexd.socket "
				 "(systemctl edit wexd.socket) and restart the socket and wexd",
				 name, socket_unit_key(i));
		else if (cfg->source[i] == WEX_CONFIG_SRC_ENV)
			snprintf(err, errlen,
				 "config set: field '%s': cannot change at run time; it is set by "
				 "%s in wexd's environment, which outranks the file: change it "
				 "there and restart wexd",
				 name, fields[i].env);
		else if (cfg->source[i] == WEX_CONFIG_SRC_FLAG)
			snprintf(err, errlen,
				 "config set: field '%s': cannot change at run time; it is set on "
				 "wexd's command line%s%s%s, which outranks the file and the "
				 "environment: change it there and restart wexd",
				 name, cfg->origin[i] ? " (" : "", cfg->origin[i] ? cfg->origin[i] : "",
				 cfg->origin[i] ? ")" : "");
		else if (fields[i].flags & F_RELOAD)
			snprintf(err, errlen,
				 "config set: field '%s': cannot change at run time; set it in the "
				 "file and reload wexd (SIGHUP)",
				 name);
		else
			snprintf(err, errlen,
				 "config set: field '%s': cannot change at run time; set it in the "
				 "file%s and restart wexd",
				 name, fields[i].env ? " or the environment" : "");
		return -EPERM;
	}
	v = text_json(&fields[i], value);
	if (!v) {
		snprintf(err, errlen, "config set: field '%s': cannot parse \"%s\" (%s)", name, value,
			 fields[i].type == FT_MODELS ? "JSON" : "not UTF-8 text");
		return -EINVAL;
	}
	rc = apply(cfg, i, v, WEX_CONFIG_SRC_RUNTIME, NULL, "config set", err, errlen);
	json_decref(v);
	return rc; /* (wexd logs it, naming who set it) */
}

int wex__config_set_flag(struct wex_config *cfg, const char *name, const char *value,
			 const char *where, char *err, size_t errlen)
{
	int i = wex__config_field_index(name);
	json_t *v;
	int rc;

	if (i < 0) {
		snprintf(err, errlen, "%s: field '%s': unknown field", where, name);
		return -ENOENT;
	}
	v = text_json(&fields[i], value);
	if (!v) {
		/* Not JSON (models), or not UTF-8 (a string); jansson says
		 * the same NULL for want of memory, far less likely. */
		snprintf(err, errlen, "%s: field '%s': cannot parse \"%s\" (%s)", where, name,
			 value, fields[i].type == FT_MODELS ? "JSON" : "not UTF-8 text");
		return -EINVAL;
	}
	rc = apply(cfg, i, v, WEX_CONFIG_SRC_FLAG, where, where, err, errlen);
	json_decref(v);
	return rc;
}

static void swap_field(struct wex_config *a, struct wex_config *b, int i)
{
	const struct field *f = &fields[i];
	union fval t;
	char *o;
	uint8_t s;

	memcpy(&t, fptr(a, f), f->size);
	memcpy(fptr(a, f), fptr(b, f), f->size);
	memcpy(fptr(b, f), &t, f->size);
	o = a->origin[i], a->origin[i] = b->origin[i], b->origin[i] = o;
	s = a->source[i], a->source[i] = b->source[i], b->source[i] = s;
}

int wex__config_reload(struct wex_config *cfg, json_t **report, char *err, size_t errlen)
{
	json_t *changed = json_array(), *restart = json_array(), *kept = json_array(), *rep = NULL;
	json_t *unapplied = json_array();
	struct wex_config next;
	int rc;

	if (!changed || !restart || !kept || !unapplied) {
		rc = -ENOMEM;
		snprintf(err, errlen, "config reload: out of memory");
		goto out_decref;
	}
	/* A default file that was there and is gone now is more likely a
	 * deployment half done than a wish for the defaults, which would drop
	 * its access lists: refused, like an explicit file gone. */
	rc = wex__config_load(&next, cfg->path, cfg->path_explicit || cfg->file_found, err, errlen);
	if (rc < 0)
		goto out_decref;
	/* Restart-only, but a file wexd would refuse at its next start is
	 * refused now, as start does: "needs a restart" would promise a
	 * restart that fails (exit 2, not restarted by the unit). */
	if (cfg->watchdog_required && !next.watchdog) {
		snprintf(err, errlen, "%s%s%s: field 'watchdog': false, but systemd asks for watchdog "
			 "pings (WatchdogSec= in the unit), so wexd would not start again with it: "
			 "remove WatchdogSec= (systemctl edit wexd.service) or set watchdog to true",
			 next.source[WEX_CF_WATCHDOG] == WEX_CONFIG_SRC_ENV ? "environment" : "config",
			 next.origin[WEX_CF_WATCHDOG] ? " " : "",
			 next.origin[WEX_CF_WATCHDOG] ? next.origin[WEX_CF_WATCHDOG] : "");
		wex__config_free(&next);
		rc = -EINVAL;
		goto out_decref;
	}
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		const struct field *f = &fields[i];
		json_t *a, *b;
		int same;

		a = fval_json(cfg, f);
		b = fval_json(&next, f);
		same = a && b && json_equal(a, b);
		/* Runtime values and command-line flags outrank the file and
		 * the environment, also after a reload; one the file (or the
		 * environment) sets otherwise is said, not passed over
		 * silently: the operator who edited the file expects it. */
		if (cfg->source[i] == WEX_CONFIG_SRC_RUNTIME || cfg->source[i] == WEX_CONFIG_SRC_FLAG) {
			if (!same && next.source[i] != WEX_CONFIG_SRC_DEFAULT) {
				char *sa = a ? json_dumps(a, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
				char *sb = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

				json_array_append_new(kept, json_string(f->name));
				wex_warn("config", "reload: %s is %s in %s%s%s, but %s set it to %s, which "
					 "outranks it; keeping %s", f->name, sb ? sb : "?",
					 wex__config_source_name(next.source[i]), next.origin[i] ? " " : "",
					 next.origin[i] ? next.origin[i] : "",
					 cfg->source[i] == WEX_CONFIG_SRC_RUNTIME ? "wexctl config set"
					 : cfg->origin[i] ? cfg->origin[i] : "a flag",
					 sa ? sa : "?", sa ? sa : "?");
				free(sa);
				free(sb);
			}
			json_decref(a);
			json_decref(b);
			swap_field(cfg, &next, i);
			continue;
		}
		/* The environment outranks the file: an edit of the file
		 * that it overrides is said, as for a flag (the variable is
		 * read at start only, so it stands until a restart). */
		if (next.source[i] == WEX_CONFIG_SRC_ENV && next.shadowed[i]) {
			char *sb = b ? json_dumps(b, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;

			if (!sb || strcmp(sb, next.shadowed[i])) {
				json_array_append_new(kept, json_string(f->name));
				wex_warn("config", "reload: %s is %s in file %s, but environment %s set "
					 "it to %s, which outranks it; keeping %s", f->name,
					 next.shadowed[i], next.path, f->env, sb ? sb : "?",
					 sb ? sb : "?");
			}
			free(sb);
		}
		json_decref(a);
		json_decref(b);
		if (same) {
			/* The value stands, but its source may have moved
			 * (e.g. from the environment into the file). */
			continue;
		}
		if (f->flags & F_RELOAD) {
			json_array_append_new(changed, json_string(f->name));
			wex_info("config", "reload: %s changed", f->name);
		} else if (cfg->socket_passed && socket_unit_key(i)) {
			/* "Needs a restart" would be false: the next wexd
			 * gets systemd's socket too, as start warns. */
			json_array_append_new(unapplied, json_string(f->name));
			wex_warn("config", "reload: %s changed, but systemd passed wexd its socket "
				 "(socket activation): it applies neither now nor after a restart; "
				 "set %s in wexd.socket instead", f->name, socket_unit_key(i));
			swap_field(cfg, &next, i);
		} else {
			json_array_append_new(restart, json_string(f->name));
			wex_warn("config", "reload: %s changed but needs a restart; keeping the "
				 "running value", f->name);
			swap_field(cfg, &next, i);
		}
	}
	if (report) {
		rep = json_pack("{s:O,s:O,s:O,s:O}", "changed", changed, "restart_needed", restart,
				"overridden", kept, "not_applied", unapplied);
		if (!rep) {
			wex__config_free(&next);
			rc = -ENOMEM;
			snprintf(err, errlen, "config reload: out of memory");
			goto out_decref;
		}
		*report = rep;
	}
	next.path_explicit = cfg->path_explicit;
	next.watchdog_required = cfg->watchdog_required;
	next.socket_passed = cfg->socket_passed;
	wex__config_free(cfg);
	*cfg = next;
	rc = 0;

out_decref:
	json_decref(changed);
	json_decref(restart);
	json_decref(kept);
	json_decref(unapplied);
	return rc;
}

json_t *wex__config_to_json(const struct wex_config *cfg)
{
	struct wex_config def;
	char err[256];
	json_t *out = json_object();

	memset(&def, 0, sizeof(def));
	if (!out || apply_defaults(&def, err, sizeof(err)) < 0)
		goto err_free;
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		const struct field *f = &fields[i];
		json_t *e;

		e = json_pack("{s:o,s:o,s:s,s:o,s:b,s:b,s:s}", "value", fval_json(cfg, f), "default",
			      fval_json(&def, f), "source", wex__config_source_name(cfg->source[i]),
			      "origin", cfg->origin[i] ? json_string(cfg->origin[i]) : json_null(),
			      "modifiable", !!(f->flags & F_MODIFIABLE), "reload",
			      !!(f->flags & (F_MODIFIABLE | F_RELOAD)), "doc", f->doc);
		if (!e || json_object_set_new(out, f->name, e) < 0)
			goto err_free;
	}
	wex__config_free(&def);
	return out;

err_free:
	wex__config_free(&def);
	json_decref(out);
	return NULL;
}

void wex__config_log(const struct wex_config *cfg)
{
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		json_t *v;
		char *s;

		if (cfg->source[i] == WEX_CONFIG_SRC_DEFAULT)
			continue;
		v = fval_json(cfg, &fields[i]);
		s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
		wex_info("config", "%s = %s (from %s%s%s)", fields[i].name, s ? s : "?",
			 wex__config_source_name(cfg->source[i]), cfg->origin[i] ? " " : "",
			 cfg->origin[i] ? cfg->origin[i] : "");
		free(s);
		json_decref(v);
	}
}

static int real_groups(uid_t uid, gid_t gid, gid_t *groups, int *n)
{
	char buf[16384];
	struct passwd pw, *res = NULL;
	int rc;

	rc = getpwuid_r(uid, &pw, buf, sizeof(buf), &res);
	if (rc)
		return -rc;
	if (!res) {
		/* A uid without a passwd entry has no supplementary groups
		 * that we can know of. */
		*n = 0;
		return 0;
	}
	if (getgrouplist(res->pw_name, gid, groups, n) < 0)
		return -ERANGE;
	return 0;
}

static int id_in(const struct wex_idlist *l, uint32_t id)
{
	for (size_t i = 0; i < l->n; i++)
		if (l->ids[i] == id)
			return 1;
	return 0;
}

int wex__config_allowed(const struct wex_config *cfg, const char *model, int role, uid_t uid,
			gid_t gid, const gid_t *peer_groups, int npeer)
{
	const struct wex_model_acl *entry = NULL, *star = NULL;
	const struct wex_role_acl *r;
	wex_config_groups_fn fn = groups_fn ? groups_fn : real_groups;
	gid_t *groups = NULL;
	int n = 64, ok = 0;

	if (uid == 0)
		return 1;
	for (size_t i = 0; i < cfg->models.n; i++) {
		if (model && !strcmp(cfg->models.v[i].name, model))
			entry = &cfg->models.v[i];
		else if (!strcmp(cfg->models.v[i].name, "*"))
			star = &cfg->models.v[i];
	}
	if (!entry)
		entry = star;
	if (!entry)
		return 1;
	if (role == WEX_ROLE_PRODUCER)
		r = &entry->producers;
	else if (role == WEX_ROLE_CONSUMER)
		r = &entry->consumers;
	else
		return 0;
	if (!r->present)
		return 1;
	if (id_in(&r->uids, uid) || id_in(&r->gids, gid))
		return 1;
	if (!r->gids.n)
		return 0;
	/* The groups the process holds, where the kernel says: one that
	 * dropped a group is no member, one given it (sg, setpriv) is. */
	if (npeer >= 0) {
		for (int i = 0; i < npeer; i++)
			if (id_in(&r->gids, peer_groups[i]))
				return 1;
		return 0;
	}
	/* getgrouplist says how many groups there are when the array is too
	 * small; one retry with that size suffices. */
	for (int tries = 0; tries < 2; tries++) {
		int want = n;
		gid_t *g = realloc(groups, (size_t)want * sizeof(*g));
		int rc;

		if (!g)
			break;
		groups = g;
		rc = fn(uid, gid, groups, &n);
		if (rc == 0) {
			for (int i = 0; i < n && !ok; i++)
				ok = id_in(&r->gids, groups[i]);
			break;
		}
		if (rc != -ERANGE || n <= want) {
			wex_warn("config", "cannot list the groups of uid %u: %s", (unsigned)uid,
				 strerror(-rc));
			break;
		}
	}
	free(groups);
	return ok;
}

void wex__config_free(struct wex_config *cfg)
{
	for (int i = 0; i < WEX_CF_COUNT; i++) {
		union fval v;

		memcpy(&v, fptr(cfg, &fields[i]), fields[i].size);
		fval_free(&fields[i], &v);
		memset(fptr(cfg, &fields[i]), 0, fields[i].size);
		free(cfg->origin[i]);
		cfg->origin[i] = NULL;
		free(cfg->shadowed[i]);
		cfg->shadowed[i] = NULL;
	}
	free(cfg->path);
	cfg->path = NULL;
	cfg->socket_group.gid = -1;
}

const char *wex__config_source_name(int source)
{
	static const char *const names[] = { "default", "file", "env", "runtime", "flag" };

	if (source < 0 || source >= (int)WEX_ARRAY_SIZE(names))
		return "?";
	return names[source];
}

const char *wex__config_io_backend_name(int backend)
{
	if (backend < 0 || backend >= (int)WEX_ARRAY_SIZE(io_names) - 1)
		return "?";
	return io_names[backend];
}

int wex__config_field_index(const char *name)
{
	for (int i = 0; i < WEX_CF_COUNT; i++)
		if (name && !strcmp(fields[i].name, name))
			return i;
	return -ENOENT;
}

const char *wex__config_field_name(int field)
{
	return field >= 0 && field < WEX_CF_COUNT ? fields[field].name : NULL;
}

int wex__config_field_modifiable(int field)
{
	return field >= 0 && field < WEX_CF_COUNT && (fields[field].flags & F_MODIFIABLE);
}

void wex__config_set_groups_fn(wex_config_groups_fn fn)
{
	groups_fn = fn;
}
