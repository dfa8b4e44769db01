/* SPDX-License-Identifier: MIT */
/*
 * config.h - wexd's configuration: one table of fields (redis
 * static_configs[]), each with a name, a type, a default, a doc line, a
 * validator and flags saying whether it may change at run time.
 *
 * Layers, lowest first: defaults < JSON file (default /etc/wex/wexd.json) <
 * WEX_* environment < runtime "config set" (only fields marked modifiable).
 * Every field remembers which layer gave its value (and, for the file and
 * the environment, which file or variable), so status can say where a
 * non-default value came from.
 *
 * Access lists ("models"): the file may hold
 *
 *   "models": {
 *     "policy": { "producers": { "uids": [1000, "alice"], "gids": ["trainers"] },
 *                 "consumers": { "gids": [2000] } },
 *     "*":      { "consumers": { "uids": [] } }
 *   }
 *
 * A model without an entry of its own uses the "*" entry; with neither, any
 * local user may produce and consume it.  Inside an entry, an absent role
 * ("producers"/"consumers") means any local user may take that role; a role
 * that is present admits only the listed uids and the members of the listed
 * gids (primary or supplementary), so "consumers": {} admits nobody but root.
 * Root (uid 0) is always admitted.  Names are resolved when the file is
 * loaded; an unknown user or group name is an error.
 *
 * Nothing here blocks except user and group lookups (NSS), which happen at
 * load/reload time and in wex__config_allowed (getgrouplist).
 */
#ifndef WEX_CONFIG_H
#define WEX_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "wex.h" /* enum wex_role */

#define WEX_CONFIG_DEFAULT_PATH "/etc/wex/wexd.json"
#define WEX_CONFIG_SYSTEM_SOCKET "/run/wex/wexd.sock"

enum wex_io_backend { WEX_IO_AUTO = 0, WEX_IO_URING, WEX_IO_EPOLL };

/* Where a field's value came from. */
enum wex_config_source {
	WEX_CONFIG_SRC_DEFAULT = 0,
	WEX_CONFIG_SRC_FILE,
	WEX_CONFIG_SRC_ENV,
	WEX_CONFIG_SRC_RUNTIME,
	WEX_CONFIG_SRC_FLAG, /* wexd's command line: kept across reloads */
};

/* Field indices, in table order (config.c's table is indexed by these). */
enum wex_config_field {
	WEX_CF_SOCKET = 0,
	WEX_CF_SOCKET_MODE,
	WEX_CF_SOCKET_GROUP,
	WEX_CF_IO_BACKEND,
	WEX_CF_LOG_LEVEL,
	WEX_CF_BEGIN_WRITE_TIMEOUT_MS,
	WEX_CF_SYNC_TIMEOUT_MS,
	WEX_CF_MAX_MESSAGE_BYTES,
	WEX_CF_MAX_CLIENTS,
	WEX_CF_MAX_CLIENTS_PER_UID,
	WEX_CF_WATCHDOG,
	WEX_CF_DRAIN_TIMEOUT_MS,
	WEX_CF_MAX_OPEN_FILES,
	WEX_CF_MAX_TABLE_BYTES,
	WEX_CF_PLANNER_THREADS,
	WEX_CF_MODELS,
	WEX_CF_COUNT
};

/* A list of resolved uids or gids. */
struct wex_idlist {
	uint32_t *ids;
	size_t n;
};

/* One role of one model entry; present == 0 means "any local user". */
struct wex_role_acl {
	int present;
	struct wex_idlist uids;
	struct wex_idlist gids;
};

struct wex_model_acl {
	char *name; /* a model name or "*" */
	struct wex_role_acl producers;
	struct wex_role_acl consumers;
};

struct wex_models {
	struct wex_model_acl *v;
	size_t n;
	json_t *json; /* the entries as given (names unresolved), for status */
};

struct wex_config {
	char *socket;              /* listening path */
	uint32_t socket_mode;      /* permission bits of the socket file */
	struct wex_group_ref {
		char *name;        /* as given (name or number), NULL: none */
		int64_t gid;       /* resolved at load time, -1: none */
	} socket_group;            /* group that owns the socket file */
	int io_backend;            /* enum wex_io_backend */
	int log_level;             /* enum wex_log_level (log.h) */
	int64_t begin_write_timeout_ms;
	int64_t sync_timeout_ms;
	int64_t max_message_bytes;
	int64_t max_clients;
	int64_t max_clients_per_uid; /* one user's connections at most; 0: no cap */
	int watchdog;              /* send WATCHDOG=1 when systemd asks for it */
	int64_t drain_timeout_ms;  /* SIGTERM: wait this long for leases, then exit */
	int64_t max_open_files;    /* fd limit set at start; 0: the hard limit */
	int64_t max_table_bytes;   /* clients' tensor tables held; 0: a quarter of RAM */
	int64_t planner_threads;   /* plans built at once, each on a thread */
	struct wex_models models;

	/* bookkeeping */
	char *path;        /* the file (the default path when none was named) */
	int path_explicit; /* path came from --config: missing is an error */
	int file_found;    /* the file was there and loaded */
	int watchdog_required; /* systemd asks for pings (WatchdogSec=): wexd
				* refuses to start with watchdog false, so a
				* reload refuses a file that sets it so (kept
				* across reloads; wexd sets it at start) */
	int socket_passed; /* systemd passed the socket (activation): socket,
			    * socket_mode and socket_group apply neither at a
			    * reload nor at a restart (kept across reloads) */
	uint8_t source[WEX_CF_COUNT];      /* enum wex_config_source */
	char *origin[WEX_CF_COUNT];        /* file path or env var name, or NULL */
	char *shadowed[WEX_CF_COUNT];      /* the file's value (JSON) where the
					    * environment outranks it, or NULL */
};

/*
 * Builds a configuration from defaults, the file and the environment into
 * *out (which the caller owns afterwards and frees with wex__config_free).
 * path: the file; NULL means WEX_CONFIG_DEFAULT_PATH.  path_explicit: the
 * path was given on the command line, so a missing file is an error (a
 * missing default file is fine, except at a reload: see
 * wex__config_reload).  On failure returns -EINVAL (bad value,
 * unknown field, unparsable file), -ENOENT (explicit file missing) or
 * another negative errno, writes a one-line message naming the file or
 * variable, the field and the reason to err, and leaves *out untouched.
 */
int wex__config_load(struct wex_config *out, const char *path, int path_explicit, char *err,
		     size_t errlen);

/*
 * Runtime "config set": parses value (text; booleans as true/false/1/0) for
 * the field called name and applies it.  Only fields marked modifiable are
 * accepted: others give -EPERM with a message saying a restart is needed.
 * Unknown names give -ENOENT, bad values -EINVAL; cfg is unchanged on error.
 */
int wex__config_set(struct wex_config *cfg, const char *name, const char *value, char *err,
		    size_t errlen);

/*
 * A command-line flag of wexd: parses value (text) for the field called
 * name, whether or not it is modifiable at run time, and stores it with the
 * source "flag", which a reload keeps (a later "config set" still wins,
 * being the newer word).  Errors as wex__config_set, with "--FLAG" named
 * by the caller in err's prefix `where`.
 */
int wex__config_set_flag(struct wex_config *cfg, const char *name, const char *value,
			 const char *where, char *err, size_t errlen);

/*
 * SIGHUP: re-reads the same file and environment into a new configuration;
 * only if it is valid is it swapped into *cfg.  Fields that need a restart
 * keep their running value; values set at run time keep overriding (the
 * precedence order holds across reloads).  A file that was loaded before
 * must still be there (a missing default file is refused too: its access
 * lists would silently go).  If report is not NULL it gets a
 * new object {"changed":[names], "restart_needed":[names],
 * "overridden":[names], "not_applied":[names]} (caller decrefs);
 * "not_applied" names the socket fields changed under socket activation
 * (socket_passed), which a restart would not apply either (wexd.socket
 * decides); "overridden" names the fields the
 * file or environment sets to other than a flag's or "config set"'s value,
 * which is kept (and logged as a warning).  Changes are also logged.  Returns 0, or a negative errno with
 * err filled and *cfg untouched.
 */
int wex__config_reload(struct wex_config *cfg, json_t **report, char *err, size_t errlen);

/*
 * {"field": {"value":..., "default":..., "source":"file", "origin":"/etc/..",
 *  "modifiable":bool, "reload":bool, "doc":"..."}, ...}.  New reference;
 * NULL on ENOMEM.
 */
json_t *wex__config_to_json(const struct wex_config *cfg);

/* Logs each non-default value and where it came from (info level). */
void wex__config_log(const struct wex_config *cfg);

/*
 * May uid (primary gid gid, as SO_PEERCRED reports) take role
 * (WEX_ROLE_PRODUCER or WEX_ROLE_CONSUMER from wex.h) on model?  Returns 1
 * yes, 0 no; other roles (WEX_ROLE_ADMIN) are not per model and give 0 for
 * anyone but root: the daemon decides those itself.  `groups` (ngroups of
 * them) are the supplementary groups the client's process holds
 * (SO_PEERGROUPS); with ngroups -1 (unknown) the uid's groups in the group
 * database are looked up (getgrouplist), which may block on NSS.
 */
int wex__config_allowed(const struct wex_config *cfg, const char *model, int role, uid_t uid,
			gid_t gid, const gid_t *groups, int ngroups);

/* Frees what the configuration owns; the struct itself is the caller's. */
void wex__config_free(struct wex_config *cfg);

/* Name, source name and field lookup helpers. */
const char *wex__config_source_name(int source);
const char *wex__config_io_backend_name(int backend);
int wex__config_field_index(const char *name); /* -ENOENT if unknown */
/* Writes "unknown field (did you mean ...; fields: ...)" for name to why;
 * returns -ENOENT. */
int wex__config_unknown_field(const char *name, char *why, size_t len);
const char *wex__config_field_name(int field);
int wex__config_field_modifiable(int field);

/*
 * The default socket path per DESIGN section 7, for clients and wexctl:
 * $WEX_SOCKET, else /run/wex/wexd.sock for root, else
 * $XDG_RUNTIME_DIR/wex/wexd.sock for a user who has one, else
 * /run/wex/wexd.sock (a system daemon started by systemd).  Writes at most
 * len bytes to buf; returns 0 or -ENAMETOOLONG.
 */
int wex__config_default_socket(char *buf, size_t len);

/*
 * Tests only: replaces the supplementary-group lookup (getgrouplist over
 * getpwuid_r) used by wex__config_allowed.  fn fills up to *n gids and sets
 * *n; returns 0 or a negative errno.  NULL restores the real lookup.
 */
typedef int (*wex_config_groups_fn)(uid_t uid, gid_t gid, gid_t *groups, int *n);
void wex__config_set_groups_fn(wex_config_groups_fn fn);

#endif
