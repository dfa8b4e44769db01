/* SPDX-License-Identifier: MIT */
/*
 * journal.h - remap leases written down so that they outlive wexd.
 *
 * A remap lease lets an engine read the producer's memory for a whole
 * rollout without asking wexd again; if wexd restarts meanwhile, the new
 * daemon must still keep the producer from writing under it.  wexd writes
 * each remap lease into a directory beside its socket (`<socket>.leases`,
 * mode 0700) before it answers the sync: one file per consumer connection,
 * marked ended when the lease ends and removed with the connection.  A wexd that starts reads them back: each lease
 * whose process still lives holds its model until that process reconnects
 * (and reclaims it, or says it no longer holds it) or exits.  A rank's
 * take of its group's open round (or its pass of it, holding that version
 * already) is written so too (WEX_JOURNAL_ROUND): it holds the model until
 * the group's other ranks take that version at the new wexd, or the
 * process calls it again, or exits; a round the new wexd opens on that
 * version passes it, and it stays written down until that round closes
 * (a wexd restarted meanwhile passes it again).
 *
 * A record is one page, rewritten in place with one pwrite when its
 * lease changes or ends (the file lives as long as the connection), so a
 * reader sees the old record or the new one.  Nothing here blocks on anything but the local
 * file system (tmpfs under /run for the packaged unit).
 */
#ifndef WEX_JOURNAL_H
#define WEX_JOURNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "wex.h"

#define WEX_JOURNAL_NAME_MAX 64

/* The mode of a record that holds no lease: its rank took (or passed,
 * holding it already) the version of its group's open round, which the
 * other ranks have yet to take (the round keeps the producer off until
 * they do: the group must not split between two versions when wexd
 * restarts meanwhile).  Written "round". */
#define WEX_JOURNAL_ROUND 16
/* Such a take of a round that was lost when the producer's memory went
 * (registry.c held_rounds_lose): it holds the producer off no more, but
 * its group's other ranks get ESTALE until its process calls wexd again
 * or exits, at the next wexd too (before, a wexd restarted meanwhile
 * forgot it, and they got the next version while that rank served the
 * lost one).  So is a connected rank's take of a lost round, until it
 * syncs again or leaves (registry.c note_wanted).  Written "lost"; a wexd
 * that does not know it removes it.  With a remap mode (| it): a remap
 * lease of such a round, which still holds the producer off, written with
 * its mode and "lost": true (a wexd that does not know the member holds
 * it as a plain lease). */
#define WEX_JOURNAL_LOST 32

struct wex_journal {
	int dirfd;       /* -1: off */
	char path[4096]; /* the directory */
	char why[4400];  /* off: why (names the path) */
	uint64_t seq;    /* names written by this wexd */
	uint64_t errors; /* writes that failed */
	uint64_t unwritten; /* leases lease_note could not write (warned 1 in 1000) */
	int keep;        /* shutting down: leases still held stay written */
	dev_t dev;       /* the directory dirfd names */
	ino_t ino;
	char nowrite[160]; /* on, but wexd may not write there: why ("": may) */
	uint64_t undeleted; /* records that could not be removed */
	int undeleted_err;  /* why the last one could not (errno) */
};

struct wex_journal_rec {
	char model[WEX_NAME_MAX];
	char group[WEX_NAME_MAX];
	uint32_t rank, world;
	uint64_t version;
	int mode; /* WEX_SYNC_REMAP_* (| WEX_JOURNAL_LOST), WEX_JOURNAL_ROUND or _LOST */
	pid_t pid;
	uid_t uid;
	uint64_t start; /* the process's start time, clock ticks after boot (0: unknown) */
	char boot[40];  /* read back: the boot it was written in ("": unknown) */
};

/* Opens (creating it, mode 0700) the directory `<socket>.leases`.  A
 * directory that is not ours, a link, or open to others is refused; the
 * journal is then off and `why` says so.  Returns 0 or -errno. */
int wex__journal_open(struct wex_journal *j, const char *socket_path);
void wex__journal_close(struct wex_journal *j);
/* Why the path no longer names the directory open ("removed", "replaced":
 * an operator's rm or mv while wexd runs), NULL if it still does (or
 * cannot be told). */
const char *wex__journal_moved(const struct wex_journal *j);
/* Opens the directory at the path again (created if missing), as
 * wex__journal_open; the records are the caller's to write again. */
int wex__journal_reopen(struct wex_journal *j);
/* Sets nowrite anew (a mount remounted, a mode changed while wexd runs);
 * 1 if whether wexd may write there changed. */
int wex__journal_access(struct wex_journal *j);

/* Writes r into the record open at *fd, or (*fd < 0) opens the one named
 * `name`, creating it (empty name: a new unique one, stored there).  A
 * record is one page rewritten in place: one pwrite per change.  Returns
 * 0 or -errno (counted in j->errors). */
int wex__journal_put(struct wex_journal *j, int *fd, char name[WEX_JOURNAL_NAME_MAX],
		     const struct wex_journal_rec *r);
/* Marks the record at fd as a lease that ended (kept while j->keep). */
void wex__journal_clear(struct wex_journal *j, int fd);
/* Closes *fd and removes `name` (kept while j->keep); empties both. */
void wex__journal_del(struct wex_journal *j, int *fd, char name[WEX_JOURNAL_NAME_MAX]);

/* Calls cb for each whole record: the first page of its file (bytes after
 * it are ignored, with a warning), members this wexd does not know
 * ignored, a newer format (wex_lease above 1) read as this wexd's, with a
 * warning.  A file that does not parse is named in a warning and removed
 * (a newer format's is left in place); leftover temporary files are
 * removed. */
void wex__journal_scan(struct wex_journal *j,
		       void (*cb)(void *arg, const char *name, const struct wex_journal_rec *r),
		       void *arg);

/* Start time of process pid (field 22 of /proc/PID/stat); 0 if unknown. */
uint64_t wex__proc_start(pid_t pid);
/* 1 if the process that held a record's lease still lives: written in
 * this boot (where the record says), pid alive and, where known, with the
 * same start time (whatever its uids are now); where that is not known,
 * owned as the record says (one of its uids the record's effective one, as
 * SO_PEERCRED gave it: not a reused pid). */
int wex__journal_alive(const struct wex_journal_rec *r);

#endif
