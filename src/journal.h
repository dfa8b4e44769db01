/* SPDX-License-Identifier: MIT */
/*
 * journal.h - remap leases written down so that they outlive wexd.
 *
 * A remap lease lets an engine read the producer's memory for a whole
 * rollout without asking wexd again; if wexd restarts meanwhile, the new
 * daemon must still keep the producer from writing under it.  wexd writes
 * one small file per remap lease into a directory beside its socket
 * (`<socket>.leases`, mode 0700) before it answers the sync, and removes it
 * when the lease ends.  A wexd that starts reads them back: each lease
 * whose process still lives holds its model until that process reconnects
 * (and reclaims it, or says it no longer holds it) or exits.
 *
 * Files are written to a temporary name and renamed, so a reader sees a
 * whole record or none.  Nothing here blocks on anything but the local
 * file system (tmpfs under /run for the packaged unit).
 */
#ifndef WEX_JOURNAL_H
#define WEX_JOURNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "wex.h"

#define WEX_JOURNAL_NAME_MAX 64

struct wex_journal {
	int dirfd;       /* -1: off */
	char path[4096]; /* the directory */
	char why[4400];  /* off: why (names the path) */
	uint64_t seq;    /* names written by this wexd */
	uint64_t errors; /* writes that failed */
	int keep;        /* shutting down: leases still held stay written */
};

struct wex_journal_rec {
	char model[WEX_NAME_MAX];
	char group[WEX_NAME_MAX];
	uint32_t rank, world;
	uint64_t version;
	int mode;
	pid_t pid;
	uid_t uid;
	uint64_t start; /* the process's start time, clock ticks after boot (0: unknown) */
};

/* Opens (creating it, mode 0700) the directory `<socket>.leases`.  A
 * directory that is not ours, a link, or open to others is refused; the
 * journal is then off and `why` says so.  Returns 0 or -errno. */
int wex__journal_open(struct wex_journal *j, const char *socket_path);
void wex__journal_close(struct wex_journal *j);

/* Writes r under `name` (empty: a new unique name is made and stored
 * there).  Returns 0 or -errno. */
int wex__journal_put(struct wex_journal *j, char name[WEX_JOURNAL_NAME_MAX],
		     const struct wex_journal_rec *r);
/* Removes `name` (empty: nothing) and empties it; kept while j->keep. */
void wex__journal_del(struct wex_journal *j, char name[WEX_JOURNAL_NAME_MAX]);

/* Calls cb for each whole record.  A file that does not parse is named in
 * a warning and removed; leftover temporary files are removed. */
void wex__journal_scan(struct wex_journal *j,
		       void (*cb)(void *arg, const char *name, const struct wex_journal_rec *r),
		       void *arg);

/* Start time of process pid (field 22 of /proc/PID/stat); 0 if unknown. */
uint64_t wex__proc_start(pid_t pid);
/* 1 if the process that held a record's lease still lives: pid alive
 * and, where both are known, with the same start time (not a reused pid). */
int wex__journal_alive(pid_t pid, uint64_t start);

#endif
