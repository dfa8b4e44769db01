/* SPDX-License-Identifier: MIT */
/* wexd.h - the daemon's state: connections, models, producer ranks,
 * consumer groups, versions and leases (DESIGN sections 3, 4, 8). */
#ifndef WEX_WEXD_H
#define WEX_WEXD_H

#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "journal.h"
#include "loop.h"
#include "plan.h"
#include "vmm/backend.h"
#include "wex.h"

/* WAIT_PLAN: a fetch waits for its plan, built off the loop (plan_job). */
enum { WAIT_NONE = 0, WAIT_BEGIN_WRITE, WAIT_ACQUIRE, WAIT_PLAN };

/* Connections past max_clients that root and wexd's own user may still
 * open (wexctl status, config reload) when the limit is reached. */
#define WEXD_ADMIN_RESERVE 4

struct model;
struct cgroup;
struct plan_job;

/* A consumer rank's last verification (wexctl verify, WEX_SYNC_VERIFY). */
struct verify_rec {
	uint64_t ticket;  /* the ask it answered (0: the engine's own) */
	uint64_t version;
	uint64_t bytes;   /* compared */
	uint64_t differ_bytes;
	uint64_t offset;  /* of the first difference, in the rank's piece */
	double seconds;
	uint64_t at_ns;   /* when it came (0: none yet) */
	char result[16];  /* equal, differ, unverifiable, failed */
	char mode[16];    /* the sync's */
	char tensor[WEX_NAME_MAX]; /* holding the first difference */
	char why[512]; /* as long as libwex's error text (struct wex_client's err) */
};

struct conn {
	struct wex_loop_io io; /* first: the loop hands it back */
	struct wexd *d;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	/* The groups the client's process held when it connected
	 * (SO_PEERGROUPS); ngroups -1: unknown (the group database decides). */
	gid_t *groups;
	int ngroups;
	int role; /* 0 until hello */
	char name[64];
	struct model *model;
	struct cgroup *group;
	uint32_t rank;
	int dead;
	int dropping; /* a reply could not be sent: closed on its next event */
	int refused_logged;
	/* A deferred request. */
	int waiting;
	uint64_t wait_version;
	uint64_t wait_held; /* the version the waiting acquire says its rank holds (0: none) */
	uint64_t wait_start_ns;
	uint64_t wait_deadline_ns;
	int wait_mode;
	/* Consumer state. */
	int has_lease;
	uint64_t lease_version;
	uint64_t lease_epoch; /* the model's epoch when the lease was granted */
	uint64_t served_epoch; /* the model's epoch when served_version was granted */
	int lease_mode;
	/* The lease was taken over from an earlier wexd (struct held): it
	 * holds the producer off until released, but serves no sync. */
	int lease_reclaimed;
	char lease_file[WEX_JOURNAL_NAME_MAX]; /* its journal record ("": none) */
	int lease_fd;                          /* ... open while the connection lives, or -1 */
	int lease_noted;                       /* ... holds a lease now (not marked ended) */
	int note_mode;                         /* ... written with this mode (0: to write) */
	uint64_t note_version;                 /* ... and this version */
	uint64_t start; /* the process's start time (journal.h), 0 until needed */
	uint64_t served_version;
	struct wex_tensor *layout;
	size_t nlayout;
	uint64_t layout_hash;   /* over the layout and device */
	char device[WEX_UUID_LEN]; /* the GPU the layout lives on ("": host) */
	uint64_t syncs;
	uint64_t last_sync_ns;
	unsigned fallbacks; /* WEX_FB_* its syncs have reported (status) */
	uint64_t connected_ns;
	uint64_t verify_asked; /* the newest ask (ticket) this rank was told of */
	uint64_t verify_asked_sync; /* ... by its acquire that made `syncs` this */
	uint64_t verify_done; /* the newest ask (ticket) this rank answered */
	struct verify_rec verify;   /* its last verification, whoever asked */
	struct verify_rec answered; /* its answer to the ask verify_done */
	struct conn *next;
};

struct seg {
	struct wex_mem_desc desc;
	int fd; /* -1 for kinds that travel as a handle */
	/* Chained segments (a range over several VMM allocations): each
	 * allocation is registered as a part, then the segment tensors name
	 * lists them, in address order. */
	int part;          /* 1: a part; tensors cannot name it */
	int claimed;       /* part: listed by a chained segment already */
	uint32_t *parts;   /* chained: the ids of its parts */
	uint32_t nparts;
};

struct prank {
	struct conn *c;
	struct seg *segs;
	uint32_t nsegs;
	struct wex_tensor *t;
	size_t nt;
	int has_table;      /* registered a table, possibly empty (FSDP shards) */
	uint64_t writing;   /* version this rank was granted to write */
	uint64_t published; /* newest version this rank published */
	int restored;       /* ... restored: published before this wexd started */
	uint64_t bytes;
};

struct cgroup {
	char name[WEX_NAME_MAX];
	uint32_t world;
	struct conn **ranks;
	/* Per rank, of the open round: 0 not yet, 1 took it here, 2 passed it
	 * (held its version already), 3 passed its take of it from before
	 * this wexd (registry.c held_round_pass). */
	uint8_t *taken;
	uint32_t ntaken;
	int round_open;
	uint64_t round_version;
	/* Ranks that took a round lost when the memory behind its version went
	 * (taken + world): until each syncs again, its peers are refused
	 * rather than handed another version. */
	uint8_t *lost;
	uint32_t nlost;
	uint64_t lost_version;
	/* wexctl verify asked every rank to verify its next sync (0: never);
	 * until verify_until_ns, a rank whose conn has not answered that
	 * ticket is asked on acquire. */
	uint64_t verify_ticket;
	uint64_t verify_asked_ns;
	uint64_t verify_until_ns;
	/* Per rank (world of them; NULL until one left): the answer of the
	 * last process in that rank's slot that answered an ask and left. */
	struct verify_kept **verify_kept;
	struct cgroup *next;
};

/* A rank's answer to a wexctl verify ask, kept after its process left
 * (wexd_verify_left): a poll shows it done, from that pid, not absent. */
struct verify_kept {
	struct verify_rec rec;
	pid_t pid;
	uint64_t served;
};

/* A wexctl verify ask of one group, kept on the model while it stands
 * (wexd_verify.c): a group whose ranks all left is freed, and the one
 * wexd_hello makes for the same name when an engine comes back is asked
 * from here. */
struct verify_stand {
	char model[WEX_NAME_MAX]; /* (set while on wexd's verify_orphans) */
	char group[WEX_NAME_MAX];
	uint32_t world;
	uint64_t ticket;
	uint64_t asked_ns;
	uint64_t until_ns;
	/* The group's kept answers while it is gone (world of them, or
	 * NULL): the group made again takes them back. */
	struct verify_kept **kept;
	struct verify_stand *next;
};

struct plan_entry {
	uint64_t layout_gen;
	uint64_t consumer_hash;
	/* The consumer layout it was made for, compared whole on a hit (the
	 * hash only finds candidates: two layouts may share one). */
	struct wex_tensor *layout;
	size_t nlayout;
	uint32_t crank, cworld;
	char device[WEX_UUID_LEN]; /* the consumer layout's GPU ("": host) */
	uint32_t near;             /* producer ranks with memory there */
	struct wex_plan *plan;
	int fd;
	uint64_t uses;
	double build_ms;
	struct plan_entry *next;
};

struct model {
	char name[WEX_NAME_MAX];
	uint32_t world;
	struct prank *ranks;
	uint64_t published;
	int published_restored; /* every rank restored it: the bytes an earlier wexd served */
	uint64_t published_ns;
	uint64_t first_publish_v;  /* version whose first rank published at */
	uint64_t first_publish_ns; /* ... this time (publish-to-visible) */
	uint64_t writing;
	uint32_t write_pending;
	uint32_t leases;
	uint32_t held; /* of them, leases held from before this wexd (struct held) */
	uint64_t layout_gen;
	uint64_t epoch; /* bumps when memory behind published versions goes */
	/* The most bytes its ranks exported together: bounds consumers' sync
	 * reports, which may arrive after the producer left (and its bytes). */
	uint64_t bytes_peak;
	int tables_fd; /* cached packed tables for layout_gen, or -1 */
	struct cgroup *groups;
	struct verify_stand *verify_stands; /* asks standing, by group name */
	struct plan_entry *plans;
	struct model *next;
};

/*
 * A remap lease an earlier wexd granted (journal.h), whose process still
 * lived when this wexd started: it holds its model (counted in
 * m->leases) until that process says hello again - taking the lease over
 * when it still holds it, ending it otherwise - or exits.
 */
struct held {
	char file[WEX_JOURNAL_NAME_MAX];
	struct model *m;
	struct wex_journal_rec r; /* as read back */
	uint64_t since_ns;        /* when this wexd read it */
	/* A take of a round that was lost (held_rounds_lose): it holds the
	 * producer off no more, is written down so (WEX_JOURNAL_LOST), and
	 * keeps its slot among the lost round's holders (cgroup.lost) until
	 * its process calls wexd again or exits. */
	int lost;
	struct held *next;
};

struct wexd {
	struct wex_loop loop;
	struct wex_loop_watch listener;
	struct wex_loop_watch sigw;
	int listen_fd;
	/* Held flock on <socket>.lock while wexd owns the path (-1: passed by
	 * systemd). */
	int lock_fd;
	int sig_fd;
	char socket_path[PATH_MAX];
	int socket_owned;
	dev_t socket_dev; /* the socket file wexd made (unlinked at exit only if */
	ino_t socket_ino; /* it is still that file, not another daemon's) */
	struct conn *conns;
	uint32_t nconns; /* in conns: the clients, and those closed not yet freed */
	uint32_t nclosed; /* closed (conn->dead), freed once the loop gives them back */
	struct model *models;
	uint64_t start_ns;
	uint64_t fd_limit; /* RLIMIT_NOFILE set at start */
	/* Bytes of clients' tensor tables held (producers' r->t, consumers'
	 * layouts), against max_table_bytes (wexd_table_room). */
	uint64_t table_bytes;
	uint64_t next_conn_id;
	uint64_t max_clients_refused; /* connections refused at max_clients */
	uint64_t per_uid_refused;     /* ... at max_clients_per_uid */
	uint64_t pidfd_refused;       /* connections refused for want of a pidfd fd */
	/* How clients' processes are watched for their exit (status). */
	char exit_watch[160];
	int draining;
	uint64_t drain_deadline_ns;
	int stop;
	int exit_code;
	size_t msg_max;
	uint32_t begin_write_timeout_ms; /* requests without timeout_ms wait this long */
	uint32_t sync_timeout_ms;
	char config_source[PATH_MAX + 16];
	struct wex_config cfg;
	uint64_t watchdog_usec;
	uint64_t last_watchdog_ns;
	int notify;          /* $NOTIFY_SOCKET set: under a unit */
	char sd_status[256]; /* the last STATUS= sent (systemctl status) */
	struct wex_journal journal;
	struct held *held;
	uint64_t held_checked_ns;
	uint64_t journal_checked_ns; /* wexd_journal_check */
	/* Its directory went and could not be made again (1), or was refused
	 * at the start, its records unread (2): looked at again each tick. */
	int journal_lost;
	int round_passed; /* an acquire passed its group's round (service_waiters) */
	uint64_t verify_seq; /* the last ticket wexctl verify was given */
	/* Asks standing for models that went with their last client, until
	 * a client makes the model again or they stop standing. */
	struct verify_stand *verify_orphans;
	/* The plans threads build (registry.c; at most planner_threads
	 * started), and the eventfd each says it is done on. */
	struct plan_job *plan_jobs;
	uint32_t plan_njobs;
	int plan_efd;
	struct wex_loop_watch plan_watch;
};

/* The clients connected: a connection wexd closed (a hang-up it read, an
 * exit) is not one, though the loop frees it only later (at the end of
 * its turn; under io_uring once its cancelled poll is back). */
static inline uint32_t wexd_clients(const struct wexd *d)
{
	return d->nconns - d->nclosed;
}

/* registry.c: request handlers.  Each returns a reply (new reference), or
 * NULL when the reply is deferred (the conn waits). */
json_t *wexd_hello(struct wexd *d, struct conn *c, json_t *req);
/* wexd.c: fds open in wexd now (-1 if /proc cannot tell). */
long wexd_fds_open(void);
/* 0 when `add` more bytes of tensor tables, `drop` of them given back
 * first, stay within max_table_bytes; else -ENOMEM, with *limit set. */
int wexd_table_room(struct wexd *d, uint64_t drop, uint64_t add, uint64_t *limit);
json_t *wexd_register_segment(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds);
json_t *wexd_register_tensors(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds);
json_t *wexd_begin_write(struct wexd *d, struct conn *c, json_t *req);
json_t *wexd_publish(struct wexd *d, struct conn *c, json_t *req);
json_t *wexd_attach(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds);
json_t *wexd_acquire(struct wexd *d, struct conn *c, json_t *req);
json_t *wexd_release(struct wexd *d, struct conn *c, json_t *req);
/* Sends the fetch reply itself (it carries fds); returns NULL or an error. */
json_t *wexd_fetch(struct wexd *d, struct conn *c, json_t *req);
json_t *wexd_status(struct wexd *d, struct conn *c, json_t *req);
json_t *wexd_models_json(struct wexd *d);
json_t *wexd_clients_json(struct wexd *d);
json_t *wexd_plans_json(struct wexd *d);

/* wexd_verify.c: the "verify" request (ask, or poll with a ticket); the
 * ask added to an acquire's reply; a consumer's verification taken from
 * its report; a rank's last one for status (null: none). */
json_t *wexd_verify(struct wexd *d, struct conn *c, json_t *req);
void wexd_verify_ask(struct conn *c, json_t *reply);
/* A group wexd_hello just made takes the ask standing for its name, if
 * any. */
void wexd_verify_group_made(struct model *m, struct cgroup *g);
/* A consumer rank leaves its group: its answer to an ask is kept on the
 * group.  A group that goes leaves its kept answers with its standing ask
 * (or frees them); one resized frees them. */
void wexd_verify_left(struct cgroup *g, const struct conn *c);
void wexd_verify_group_gone(struct model *m, struct cgroup *g);
void wexd_verify_kept_free(struct cgroup *g);
/* A model that goes leaves its standing asks with wexd, and one made
 * again takes them back: an ask survives a restart of every client of its
 * model (wexd_verify_free at wexd's exit frees what is left). */
void wexd_verify_forget(struct wexd *d, struct model *m);
void wexd_verify_model_made(struct wexd *d, struct model *m);
void wexd_verify_free(struct wexd *d);
void wexd_verify_take(struct conn *c, const char *mode, json_t *v);
json_t *wexd_verify_json(const struct conn *c);

/* A "cancel" request: ends the connection's wait (begin_write, acquire)
 * with -ECANCELED, whose reply answers the request that waited; NULL
 * (no reply) when none waits: that one was answered before it came,
 * and a reply to the cancel would be read as the next request's. */
json_t *wexd_cancel(struct wexd *d, struct conn *c);
/* Drops everything a connection held (leases, registrations, waits). */
void wexd_conn_drop(struct wexd *d, struct conn *c);
/* Re-evaluates deferred requests; answers those now satisfiable or past
 * their deadline.  Returns ms until the next deadline (-1: none). */
int wexd_service_waiters(struct wexd *d);
/* Reads the leases an earlier wexd left in d->journal (at start). */
void wexd_held_load(struct wexd *d);
/* Ends the leases held from before whose processes exited (at most every
 * 200 ms): from the loop's tick, and before status, models and metrics. */
void wexd_held_check(struct wexd *d);
/* Writes the journal again where its directory was removed or replaced
 * while wexd ran (at most every 200 ms): from the tick and before status. */
void wexd_journal_check(struct wexd *d);
/* At exit: forgets leases held from before, leaving their records (and
 * those of leases still held) for the next wexd. */
void wexd_held_exit(struct wexd *d);
/* Fails every consumer's deferred acquire with `err` (shutdown). */
void wexd_fail_waiters(struct wexd *d, int err, const char *why);
/* Plans are built on a thread of their own: its eventfd, watched by the
 * loop (at start: 0 or -errno), and at exit, a plan still being built is
 * left to its thread (the process's exit ends it). */
int wexd_plan_init(struct wexd *d);
void wexd_plan_exit(struct wexd *d);
/* After a configuration change: planner_threads may let waiting fetches
 * start their plans. */
void wexd_plan_config(struct wexd *d);

/* wexd.c */
/* May this peer take `role` on `model`?  Counts and logs a refusal. */
int wexd_allowed(struct wexd *d, struct conn *c, const char *model, int role);
void wexd_count_error(int err);
int wexd_send(struct wexd *d, struct conn *c, json_t *reply, const int *fds, int nfds);
/* Closes c if its client already hung up unseen; 1 if it did. */
int wexd_conn_close_if_gone(struct wexd *d, struct conn *c);
const char *wexd_io_backend(struct wexd *d);

#endif
