/* SPDX-License-Identifier: MIT */
/*
 * lease_journal - proves that a remap lease outlives a wexd restart
 * (src/journal.h): the engine reads the producer's memory for a whole
 * rollout without calling wexd, so a wexd restarted meanwhile must still
 * keep the trainer from writing under it.
 *
 *  - held_until_exit: an engine process holding a remap-view lease; wexd is
 *    SIGKILLed and restarted.  The new wexd shows the lease (status "held",
 *    with the engine's pid) and the trainer's begin_write ends in EBUSY
 *    naming it; once the engine process is killed, the trainer's
 *    begin_write gets in.
 *  - leader_exits: an engine whose main thread exited while another runs
 *    (a zombie leader) still holds its lease after a restart;
 *  - ruid: so does one whose real uid differs from its effective uid (run
 *    as root only): the record names the effective uid (SO_PEERCRED's),
 *    which wexd compared with the process's real uid, taking it for
 *    another user's process that reused the pid, and the trainer wrote
 *    under the engine at once;
 *  - euid_after: so does one that changed its effective uid with seteuid
 *    after it connected (root only; its real and saved uid are still the
 *    record's): it was taken for another user's process;
 *  - uid_after: so does one that dropped all its uids with setuid after it
 *    connected (root only; none of them the record's, its pid and start
 *    time the same): it was taken for another user's process;
 *  - close_after_restart: wex_client_close with no call since the restart
 *    ends the lease at the new wexd (a hello without it);
 *  - stale_records: records left by processes that are gone (a reaped pid;
 *    a live pid whose start time differs, i.e. a reused pid; a live pid in
 *    a record of another boot, or of another user), a record
 *    that does not parse, an empty one (created, never written), one
 *    marked ended and a temporary file an older wexd left are all removed
 *    when wexd starts, and hold nothing.
 *  - claim_mismatch: a hello from the lease's process that names another
 *    version ends the held lease instead of taking it; the client whose
 *    lease that was then learns at its release that it was lost
 *    (-WEX_EDAEMON), and the trainer writes at once.
 *  - sigterm_keeps: a graceful stop (SIGTERM) leaves the records of remap
 *    leases still held; the next wexd holds the trainer off until the
 *    engine releases (0, weights clean).
 *  - journal_off: a journal directory open to others is refused with a
 *    warning and status says why; syncs still work, and a restart then
 *    holds nothing (the documented cost of a journal that is off).
 *  - journal_off_fixed: one refused at start and set right while wexd runs
 *    (chmod 0700) is used from then on: the lease held is written there
 *    and holds after a restart (before: off until a restart, which lost
 *    it);
 *  - journal_off_fixed_stale: a record of the wexd before, left in one
 *    refused at start (its lease lost at this wexd), goes once the
 *    directory is used: before, it stayed beside the engine's new one and
 *    the next wexd held the trainer off with it until the engine exited;
 *  - garbage_appended: bytes after a record's page do not make it a stray:
 *    the lease still holds the trainer off after a restart;
 *  - newer_member: a record with a member this wexd does not know (a newer
 *    wexd's, read after a downgrade) still holds its lease;
 *  - newer_format: so does a record of a newer format (wex_lease 2) that
 *    reads as this wexd's; one that does not is left in place;
 *  - fsize_limit: under a file size limit (ulimit -f) wexd is not killed by
 *    SIGXFSZ: the write fails, the client is told why, wexd keeps serving;
 *  - close_while_down: an engine that closes its client while wexd is down
 *    (between a crash and its restart) ends its lease at the next wexd
 *    once it listens, not only when the engine's process exits; so too
 *    one whose wex_release found no wexd (-WEX_EDAEMON, the lease not
 *    given back) before it closed, its client or the process going on
 *    (close owed that wexd no hello: the trainer waited until the
 *    engine's process exited);
 *  - release_unanswered: a wexd that hangs (SIGSTOP) while an engine holds
 *    a remap lease, and is killed and started again (systemd's watchdog)
 *    without ever reading the engine's hang-up: a wex_release it did not
 *    answer (-ETIMEDOUT, connection dropped), or the release of
 *    wex_client_close, left the lease in its journal, and the next wexd
 *    held the trainer off until the engine's process exited; the hello
 *    owed since (by the closed client too) ends it;
 *  - round_kept: a group of two ranks, rank 0 took v1 and rank 1 not yet
 *    (the round on v1 holds the trainer off), and wexd is SIGKILLed and
 *    restarted: the next wexd still holds the trainer off until rank 1
 *    took v1 too (by copy, before: the round was forgotten, the trainer
 *    wrote v2 at once and rank 1 got v2 while rank 0 served v1), and rank
 *    1 takes v1 at once while the trainer waits to write (before, in
 *    remap-view mode: it waited for the trainer's begin_write to time out,
 *    and the trainer for rank 0's lease).
 *  - round_passed: a rank that holds the version of the round written
 *    down (it took it from an earlier wexd) and asks for the next passes
 *    that round at the next wexd, so the trainer writes at once.
 *  - round_closed_clients: rank 0's take of a round is held after a
 *    restart, and both ranks close their clients with no call between: the
 *    close says hello to the new wexd, which ends the take, and the trainer
 *    writes (before: held off until the engine's process exited).
 *  - round_slot_taken: rank 0's engine took a round and hangs on across a
 *    restart; a new engine takes rank 0 and the group takes that version
 *    whole: the hung engine's take holds the trainer off no more (before:
 *    until that process exited).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "fixture.h"

static struct t_wexd d;

static void journal_path(char *buf, size_t len)
{
	snprintf(buf, len, "%s.leases", d.sock);
}

#define journal_files(held) t_journal_files(d.sock, held)
#define journal_count() journal_files(1)
#define files() journal_files(0)

/* The status entries of leases held from before this wexd, for model. */
static int held_count(const char *model, int pid, uint64_t version, const char *mode)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model), *h, *e;
	size_t i;
	int n = 0;

	h = m ? json_object_get(m, "held") : NULL;
	json_array_foreach(h, i, e) {
		T_ASSERT(json_integer_value(json_object_get(e, "pid")) == pid &&
			 (uint64_t)json_integer_value(json_object_get(e, "version")) == version &&
			 !strcmp(json_string_value(json_object_get(e, "mode")), mode),
			 "held lease %zu of '%s' is pid %d v%llu %s", i, model, pid,
			 (unsigned long long)version, mode);
		n++;
	}
	json_decref(st);
	return n;
}

/* wexctl status names the lease held from before, with its pid, and the
 * journal's directory. */
static void ctl_shows(pid_t pid)
{
	char out[16384], want[64];

	t_wexctl("status", out, sizeof(out));
	snprintf(want, sizeof(want), "  g          0     %-8d        1 remap-view", (int)pid);
	T_ASSERT(strstr(out, "leases held from before this wexd started") && strstr(out, want) &&
		 strstr(out, "lease journal ") && strstr(out, ".leases"),
		 "wexctl status shows the held lease ('%s') and the journal:\n%s", want, out);
}

static void restart(void)
{
	t_wexd_kill(&d);
	t_wexd_restart(&d);
}

/* A trainer and an engine on `model`: v1 published, the engine synced
 * it in `mode` (its lease held). */
static void pair(const char *model, struct t_prod *p, struct t_cons *k, int mode)
{
	struct wex_sync_result r;

	t_prod_open(p, model, "tiny", 0, 1);
	t_cons_open(k, model, "g", "tiny", 0, 1);
	t_prod_write(p, 1);
	T_WEX(k->c, wex_sync(k->c, mode, 1, 5000, &r));
}

/* The trainer writes v (begin_write within timeout_ms must succeed). */
static void trainer_writes(struct t_prod *p, uint64_t v, uint32_t timeout_ms)
{
	T_WEX(p->c, wex_begin_write(p->c, v, timeout_ms));
	T_WEX(p->c, wex_publish(p->c, v));
}

/* Its rollout: a thread that only waits. */
static void *rollout(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

/* A child engine process that syncs v1 of model in remap-view mode and
 * then rolls out until killed; `leader_exit`: its main thread exits
 * (pthread_exit) while the rollout thread runs on, a zombie leader. */
static uid_t engine_ruid = (uid_t)-1; /* set: the engine's real uid (its euid stays) */
static uid_t engine_euid_after = (uid_t)-1; /* set: its euid once synced (seteuid) */
static uid_t engine_uid_after = (uid_t)-1; /* set: all its uids once synced (setuid) */

static pid_t engine(const char *model, int leader_exit)
{
	int pfd[2];
	char c = 0;
	pid_t child;

	T_ASSERT(pipe(pfd) == 0, "pipe");
	child = t_fork();
	if (child == 0) {
		struct t_cons k;
		struct wex_sync_result r;
		pthread_t th;

		close(pfd[0]);
		if (engine_ruid != (uid_t)-1)
			T_ASSERT(setresuid(engine_ruid, geteuid(), geteuid()) == 0, "setresuid: %s",
				 strerror(errno));
		t_cons_open(&k, model, "g", "tiny", 0, 1);
		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		if (engine_euid_after != (uid_t)-1)
			T_ASSERT(seteuid(engine_euid_after) == 0, "seteuid: %s", strerror(errno));
		if (engine_uid_after != (uid_t)-1)
			T_ASSERT(setuid(engine_uid_after) == 0, "setuid: %s", strerror(errno));
		pthread_create(&th, NULL, rollout, NULL);
		(void)!write(pfd[1], "s", 1);
		if (leader_exit)
			pthread_exit(NULL);
		rollout(NULL);
	}
	close(pfd[1]);
	T_ASSERT(read(pfd[0], &c, 1) == 1, "the engine synced");
	close(pfd[0]);
	return child;
}

/* `leader_exit`: the engine's main thread exited while another thread
 * runs on (a zombie leader): it still holds the lease. */
static void held_until_exit(const char *model, int leader_exit)
{
	struct t_prod p;
	pid_t child;
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 1);
	child = engine(model, leader_exit);
	T_ASSERT(journal_count() == 1, "the remap lease is written down (%d records)",
		 journal_count());
	restart();
	T_ASSERT(held_count(model, (int)child, 1, "remap-view") == 1,
		 "status shows the engine's lease held from before the restart%s",
		 leader_exit ? " (its main thread exited, another runs)" : "");
	T_ASSERT(t_leases(d.sock, model) == 1, "and counts it");
	ctl_shows(child);
	ret = wex_begin_write(p.c, 2, 600); /* past a few exit checks */
	T_ASSERT(ret == -EBUSY && strstr(wex_last_error(p.c), "before wexd restarted"),
		 "the trainer waits for the engine's lease: %s (%s)", wex_strerror(ret),
		 wex_last_error(p.c));
	kill(child, SIGKILL);
	T_ASSERT(t_wait(child) == 128 + SIGKILL, "the engine was killed");
	/* The waiting begin_write looks for the engine's exit now and then. */
	trainer_writes(&p, 2, 5000);
	T_ASSERT(held_count(model, 0, 0, "") == 0 && journal_count() == 0,
		 "the held lease ended with its process, and its record with it");
	t_prod_close(&p);
}

/* wex_client_close after a restart, with no call between: the close says
 * hello to the new wexd, which ends the lease it read back. */
static void close_after_restart(void)
{
	struct t_prod p;
	struct t_cons k;

	pair("close", &p, &k, WEX_SYNC_REMAP_FIXED);
	restart();
	T_ASSERT(held_count("close", (int)getpid(), 1, "remap-fixed") == 1, "the lease is held");
	t_cons_close(&k);
	T_ASSERT(held_count("close", 0, 0, "") == 0, "closing the client ended it");
	trainer_writes(&p, 2, 200);
	t_prod_close(&p);
}

static void write_record(const char *name, const char *text)
{
	char path[600];
	int fd;

	journal_path(path, 400);
	strcat(path, "/");
	strcat(path, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	T_ASSERT(fd >= 0, "create %s: %s", path, strerror(errno));
	T_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "write %s", path);
	close(fd);
}

/* A remap-view lease record of model "stale" for pid (uid, start), with
 * `more` JSON members. */
static void stale_record(const char *name, pid_t pid, uid_t uid, int start, const char *more)
{
	char rec[512];

	snprintf(rec, sizeof(rec),
		 "{\"wex_lease\":1,\"model\":\"stale\",\"group\":\"g\",\"rank\":0,\"world\":1,"
		 "\"version\":3,\"mode\":\"remap-view\",\"pid\":%d,\"uid\":%u,\"start\":%d%s}",
		 (int)pid, (unsigned)uid, start, more);
	write_record(name, rec);
}

static void stale_records(void)
{
	pid_t gone = t_fork();
	struct t_prod p;

	if (gone == 0)
		_exit(0);
	t_wait(gone);
	t_wexd_kill(&d);
	stale_record("l-1-1", gone, getuid(), 0, "");
	/* This process, but started at another time: a reused pid. */
	stale_record("l-1-2", getpid(), getuid(), 1, "");
	/* This process, start unknown, but written in another boot. */
	stale_record("l-1-6", getpid(), getuid(), 0,
		     ",\"boot\":\"00000000-0000-0000-0000-000000000000\"");
	/* This process, start unknown, but owned by another user. */
	stale_record("l-1-7", getpid(), getuid() + 4242, 0, "");
	write_record("l-1-3", "{\"wex_lease\":1,\"model\":\"stale\"");
	write_record("l-1-4", ""); /* created, never written */
	write_record("l-1-5", "{\"wex_lease\":0}"); /* ended */
	/* Left by the first journal's create-and-rename, killed between: a
	 * record whose sync was never answered, for a live process. */
	stale_record("tmp-l-1-8", getpid(), getuid(), 0, "");
	t_wexd_restart(&d);
	T_ASSERT(journal_count() == 0, "every stale record was removed (%d left)", journal_count());
	T_ASSERT(t_leases(d.sock, "stale") == 0, "and none holds the model");
	t_prod_open(&p, "stale", "tiny", 0, 1);
	trainer_writes(&p, 4, 200);
	t_prod_close(&p);
}

static void claim_mismatch(void)
{
	struct t_prod p;
	struct t_cons k;
	json_t *rep;
	int fd, ret;

	pair("claim", &p, &k, WEX_SYNC_REMAP_VIEW);
	restart();
	T_ASSERT(held_count("claim", (int)getpid(), 1, "remap-view") == 1, "the lease is held");
	fd = t_raw_connect(d.sock);
	rep = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"claim\","
			    "\"group\":\"g\",\"rank\":0,\"world\":1,\"lease\":7}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK") &&
		 json_is_false(json_object_get(rep, "lease_reclaimed")),
		 "a hello naming v7 does not take the v1 lease: %s", t_code(rep));
	json_decref(rep);
	close(fd);
	T_ASSERT(held_count("claim", 0, 0, "") == 0, "and ends it");
	fd = t_raw_connect(d.sock);
	rep = t_raw_rpc(fd, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"claim\","
			    "\"group\":\"h\",\"lease\":-1}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "EINVAL") && strstr(t_msg(rep), "not a version"),
		 "a hello naming lease -1 is refused: %s %s", t_code(rep), t_msg(rep));
	json_decref(rep);
	close(fd);
	T_WEX(p.c, wex_begin_write(p.c, 2, 5000));
	ret = wex_release(k.c);
	T_ASSERT(ret == -WEX_EDAEMON && strstr(wex_last_error(k.c), "lease on v1 was lost"),
		 "the client learns its lease was lost: %s (%s)", wex_strerror(ret),
		 wex_last_error(k.c));
	t_prod_close(&p);
	t_cons_close(&k);
}

static void sigterm_keeps(void)
{
	struct t_prod p;
	struct t_cons k;
	int st, ret;

	pair("term", &p, &k, WEX_SYNC_REMAP_FIXED);
	T_ASSERT(kill(d.pid, SIGTERM) == 0, "SIGTERM wexd");
	T_ASSERT(waitpid(d.pid, &st, 0) == d.pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "wexd stopped cleanly");
	d.pid = 0;
	T_ASSERT(journal_count() == 1, "the lease still held stays written down (%d records)",
		 journal_count());
	t_wexd_restart(&d);
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "the next wexd holds the trainer off: %s", wex_strerror(ret));
	T_WEX(k.c, wex_release(k.c));
	T_ASSERT(!wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0, "the engine's weights are whole");
	T_ASSERT(journal_count() == 0, "the release marked the record ended");
	t_prod_write(&p, 2);
	t_prod_close(&p);
	t_cons_close(&k);
	/* wexd sees the disconnect asynchronously. */
	for (double t0 = t_now(); files() && t_now() - t0 < 5; usleep(1000))
		;
	T_ASSERT(files() == 0, "the record went with the engine's connection (%d files left)",
		 files());
}

static void journal_off(void)
{
	struct t_prod p;
	struct t_cons k;
	char path[400];
	json_t *st, *j;

	journal_path(path, sizeof(path));
	t_wexd_kill(&d);
	T_ASSERT(chmod(path, 0755) == 0, "chmod %s", path);
	t_wexd_restart(&d);
	st = t_status(d.sock);
	j = json_object_get(json_object_get(st, "daemon"), "lease_journal");
	T_ASSERT(json_is_null(json_object_get(j, "dir")) &&
		 strstr(json_string_value(json_object_get(j, "off")) ?: "", "mode 0700"),
		 "status says the journal is off and why");
	json_decref(st);
	pair("off", &p, &k, WEX_SYNC_REMAP_VIEW);
	T_ASSERT(journal_count() == 0, "nothing was written");
	restart();
	T_WEX(p.c, wex_begin_write(p.c, 2, 200)); /* nothing holds it */
	T_ASSERT(chmod(path, 0700) == 0, "chmod %s back", path);
	t_prod_close(&p);
	t_cons_close(&k);
}

/* Whether status shows the journal on (a directory in use) within secs. */
static int journal_on_within(double secs)
{
	int on = 0;

	for (double t0 = t_now(); !on && t_now() - t0 < secs; usleep(50000)) {
		json_t *st = t_status(d.sock);
		json_t *j = json_object_get(json_object_get(st, "daemon"), "lease_journal");

		on = json_is_string(json_object_get(j, "dir"));
		json_decref(st);
	}
	return on;
}

/* A journal refused at start (mode 0755) and set right while wexd runs
 * (chmod 0700, as its warning invites) is used from then on: the lease
 * held is written there and holds the trainer off after a restart
 * (before, it stayed off until a restart, which lost that lease). */
static void journal_off_fixed(void)
{
	struct t_prod p;
	struct t_cons k;
	char path[400];
	int ret;

	journal_path(path, sizeof(path));
	t_wexd_kill(&d);
	T_ASSERT(chmod(path, 0755) == 0, "chmod %s", path);
	t_wexd_restart(&d);
	pair("offfixed", &p, &k, WEX_SYNC_REMAP_VIEW);
	T_ASSERT(chmod(path, 0700) == 0, "chmod %s back", path);
	T_ASSERT(journal_on_within(5), "status shows the journal on once its mode is set right");
	T_ASSERT(journal_count() == 1, "the lease held is written there (%d records)",
		 journal_count());
	restart();
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "the next wexd holds the trainer off: %s", wex_strerror(ret));
	T_WEX(k.c, wex_release(k.c));
	trainer_writes(&p, 2, 5000);
	t_prod_close(&p);
	t_cons_close(&k);
}

/* A journal refused at start that still holds a record of the wexd
 * before (a lease this wexd did not hold: its engine's release said it was
 * lost), set right later: that record goes when the directory is used, as
 * this wexd's own records now say what is held.  Before, it stayed, and
 * the next wexd held the trainer off with it for good: the engine, back
 * with the lease it synced since, claims one record of its rank at its
 * hello, and the other held the model until the engine exited. */
static void journal_off_fixed_stale(void)
{
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k;
	char path[400];

	journal_path(path, sizeof(path));
	pair("offstale", &p, &k, WEX_SYNC_REMAP_VIEW);
	T_ASSERT(journal_count() == 1, "the lease on v1 is written down");
	t_wexd_kill(&d);
	T_ASSERT(chmod(path, 0755) == 0, "chmod %s", path);
	t_wexd_restart(&d);
	(void)wex_release(k.c); /* lost: the journal is off */
	trainer_writes(&p, 2, 5000);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(chmod(path, 0700) == 0, "chmod %s back", path);
	T_ASSERT(journal_on_within(5), "status shows the journal on once its mode is set right");
	restart();
	T_WEX(k.c, wex_release(k.c)); /* its lease on v2, taken back */
	trainer_writes(&p, 3, 3000);
	T_ASSERT(journal_count() == 0, "no record of a lease is left (%d)", journal_count());
	t_prod_close(&p);
	t_cons_close(&k);
}

/* The record file of the one lease written down. */
static void record_path(char *buf, size_t len)
{
	char path[400];
	struct dirent *e;
	DIR *dir;

	journal_path(path, sizeof(path));
	dir = opendir(path);
	T_ASSERT(dir, "opendir %s", path);
	buf[0] = '\0';
	while ((e = readdir(dir)))
		if (e->d_name[0] != '.')
			snprintf(buf, len, "%s/%s", path, e->d_name);
	closedir(dir);
	T_ASSERT(buf[0], "a record is there");
}

/* Bytes after a whole record (another writer, a file system that kept
 * more than was written): the record still names a live process whose
 * lease must hold the trainer off, not be thrown away. */
static void garbage_appended(void)
{
	struct t_prod p;
	struct t_cons k;
	char rec[700];
	int fd, ret;

	restart(); /* (a journal that is on) */
	pair("tail", &p, &k, WEX_SYNC_REMAP_VIEW);
	t_wexd_kill(&d);
	record_path(rec, sizeof(rec));
	fd = open(rec, O_WRONLY | O_APPEND);
	T_ASSERT(fd >= 0 && write(fd, "\0garbage", 8) == 8, "append to %s", rec);
	close(fd);
	t_wexd_restart(&d);
	T_ASSERT(held_count("tail", (int)getpid(), 1, "remap-view") == 1,
		 "the lease whose record has bytes after it is still held");
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "the trainer waits for it: %s", wex_strerror(ret));
	T_WEX(k.c, wex_release(k.c));
	T_ASSERT(!wex_is_dirty(k.c), "the engine's weights are whole");
	t_prod_write(&p, 2);
	t_prod_close(&p);
	t_cons_close(&k);
}

/* A record written by a newer wexd that added a member: a wexd that
 * starts after a downgrade still holds the lease it names. */
static void newer_member(void)
{
	struct t_prod p;
	int ret;

	t_prod_open(&p, "newer", "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_wexd_kill(&d);
	stale_record("l-9-1", getpid(), getuid(), 0, ",\"future\":{\"x\":1}");
	t_wexd_restart(&d);
	T_ASSERT(journal_count() == 1 && held_count("stale", (int)getpid(), 3, "remap-view") == 1,
		 "the record with a member this wexd does not know still holds its lease (%d)",
		 journal_count());
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == 0, "(another model's trainer writes: %s)", wex_strerror(ret));
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
	t_wexd_kill(&d);
	t_journal_wipe(&d);
	t_wexd_restart(&d);
}

/* A record of a newer wexd's format (wex_lease 2), read after a
 * downgrade: the lease it names still holds as far as this wexd reads it,
 * and one this wexd cannot read is left for the newer one (before, both
 * were removed as "not a lease record (a field is out of range)", and the
 * trainer wrote under the engine that held the lease). */
static void newer_format(void)
{
	char rec[512];
	struct t_prod p;
	int ret;

	t_prod_open(&p, "newer", "tiny", 0, 1);
	t_prod_write(&p, 1);
	t_wexd_kill(&d);
	snprintf(rec, sizeof(rec),
		 "{\"wex_lease\":2,\"model\":\"stale\",\"group\":\"g\",\"rank\":0,\"world\":1,"
		 "\"version\":3,\"mode\":\"remap-view\",\"pid\":%d,\"uid\":%u,\"start\":0}",
		 (int)getpid(), (unsigned)getuid());
	write_record("l-9-2", rec);
	write_record("l-9-3", "{\"wex_lease\":2,\"lease\":{\"model\":\"stale\"}}");
	t_wexd_restart(&d);
	T_ASSERT(journal_files(0) == 2 && held_count("stale", (int)getpid(), 3, "remap-view") == 1,
		 "a newer format's records are kept (%d) and the one read holds its lease",
		 journal_files(0));
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == 0, "(another model's trainer writes: %s)", wex_strerror(ret));
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
	t_wexd_kill(&d);
	t_journal_wipe(&d);
	t_wexd_restart(&d);
}

/* A wexd run under a file size limit (ulimit -f, inherited from a batch
 * system): a write past it fails with EFBIG, said to the client that
 * asked, and wexd keeps serving (before: SIGXFSZ killed it, silently,
 * with every lease it held). */
static void fsize_limit(void)
{
	struct t_prod p;
	struct rlimit old, lim;
	wex_client_t *c;
	void *region;
	int st, ret;

	t_wexd_kill(&d);
	getrlimit(RLIMIT_FSIZE, &old);
	lim = old;
	lim.rlim_cur = 1024;
	T_ASSERT(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
	t_wexd_restart(&d);
	T_ASSERT(setrlimit(RLIMIT_FSIZE, &old) == 0, "setrlimit back");
	t_prod_open(&p, "fsize", "tiny", 0, 1);
	t_prod_write(&p, 1);
	c = t_open(WEX_ROLE_CONSUMER, "fsize", "g", 0, 1);
	ret = wex_reserve(c, 0, 0, p.seg_bytes, &region);
	T_ASSERT(waitpid(d.pid, &st, WNOHANG) == 0, "wexd still runs (status %#x)", st);
	/* (EFBIG itself: it came back as WEX_EREMOTE, an error wexd has no
	 * name for.) */
	T_ASSERT(ret == -EFBIG && strstr(wex_last_error(c), "File too large"),
		 "the fetch says why it failed: %s (%s)", wex_strerror(ret), wex_last_error(c));
	wex_client_close(c);
	t_prod_close(&p);
	restart();
}

/* The engine closes its client while wexd is down (between a crash and
 * its restart): the lease it held ended with its mappings, so the next
 * wexd must not hold the trainer off for it until the engine exits. */
static void close_while_down(void)
{
	struct t_prod p;
	struct t_cons k;
	int ret;

	pair("down", &p, &k, WEX_SYNC_REMAP_VIEW);
	t_wexd_kill(&d);
	t_cons_close(&k);
	t_wexd_restart(&d);
	/* (The closed client's hello comes once this wexd listens.) */
	ret = wex_begin_write(p.c, 2, 5000);
	T_ASSERT(ret == 0, "the trainer writes: %s (%s)", wex_strerror(ret),
		 wex_last_error(p.c));
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
}

/* wex_release while wexd is down, then wex_client_close, wexd down still
 * (`restart_first` 0) or back (1): the next wexd, which read the lease
 * from its journal, lets the trainer write once the closed client's
 * hello came, although the process lives on. */
static void release_then_close(int restart_first)
{
	struct t_prod p;
	struct t_cons k;
	int ret;

	/* (A model of each call's own: the closed client's hello may still
	 * be connected, keeping the last call's model and its v2, when the
	 * next begins.) */
	pair(restart_first ? "rel-down-back" : "rel-down", &p, &k, WEX_SYNC_REMAP_VIEW);
	t_wexd_kill(&d);
	ret = wex_release(k.c);
	T_ASSERT(ret == -WEX_EDAEMON && strstr(wex_last_error(k.c), "could not be given back"),
		 "release while wexd is down: %s (%s)", wex_strerror(ret), wex_last_error(k.c));
	if (restart_first)
		t_wexd_restart(&d);
	t_cons_close(&k);
	if (!restart_first)
		t_wexd_restart(&d);
	ret = wex_begin_write(p.c, 2, 5000);
	T_ASSERT(ret == 0, "after release and close%s, the trainer writes: %s (%s)",
		 restart_first ? " (wexd back)" : " (wexd down)", wex_strerror(ret),
		 wex_last_error(p.c));
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
}

/* A remap-view lease whose release wexd does not answer (stopped), then
 * wexd killed and started again: `in_close` 0, a wex_release that timed
 * out, then wex_client_close; 1, only wex_client_close (its release times
 * out).  The trainer writes once the closed client's hello came. */
static void release_unanswered(int in_close)
{
	struct wex_client_params kp = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_GROUP |
			      WEX_CLIENT_FIELD_TIMEOUT,
		.role = WEX_ROLE_CONSUMER,
		.model = in_close ? "rel-hung-close" : "rel-hung",
		.group = "g",
		.timeout_ms = 300,
	};
	struct wex_sync_result r;
	struct t_prod p;
	wex_client_t *k;
	int ret;

	t_prod_open(&p, kp.model, "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_WEX(NULL, wex_client_open(&kp, &k));
	T_WEX(k, wex_sync(k, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	T_ASSERT(journal_count() == 1, "the remap lease is written down (%d records)",
		 journal_count());
	kill(d.pid, SIGSTOP);
	if (!in_close) {
		ret = wex_release(k);
		T_ASSERT(ret == -ETIMEDOUT, "release to a stopped wexd: %s (%s)", wex_strerror(ret),
			 wex_last_error(k));
	} else {
		wex_client_close(k);
	}
	t_wexd_kill(&d); /* (never resumed: the hang-up is not read) */
	t_wexd_restart(&d);
	if (!in_close)
		wex_client_close(k);
	ret = wex_begin_write(p.c, 2, 8000);
	T_ASSERT(ret == 0, "after a release wexd did not answer%s, and a restart, the trainer writes: %s (%s)",
		 in_close ? " (in close)" : ", then close", wex_strerror(ret), wex_last_error(p.c));
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
}

/* A trainer waiting to write v (`publish`: and publishing it). */
struct writer {
	pthread_t th;
	struct t_prod *p;
	uint64_t v;
	int publish;
	int ret;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;

	w->ret = wex_begin_write(w->p->c, w->v, 10000);
	if (w->ret == 0 && w->publish) {
		ex_fill(w->p->base, w->p->t, (size_t)w->p->n, w->v, 1);
		w->ret = wex_publish(w->p->c, w->v);
	}
	return NULL;
}

/* `mode`: the ranks' sync mode (rank 0's record is then its take of the
 * round, or its remap lease). */
static void round_kept(int mode)
{
	const char *model = mode == WEX_SYNC_COPY ? "round" : "round-view";
	struct t_prod p;
	struct t_cons k0, k1;
	struct wex_sync_result r;
	struct writer w = { .p = &p, .v = 2 };
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	t_cons_open_from(&k0, model, "g", "tiny", 0, 2, 0);
	t_cons_open_from(&k1, model, "g", "tiny", 1, 2, 0);
	t_prod_write(&p, 1);
	T_WEX(k0.c, wex_sync(k0.c, mode, 1, 5000, &r));
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "the open round holds the trainer off: %s", wex_strerror(ret));
	restart();
	ret = wex_begin_write(p.c, 2, 300);
	T_ASSERT(ret == -EBUSY &&
		 strstr(wex_last_error(p.c), mode == WEX_SYNC_COPY ? "its peers not yet" :
								      "before wexd restarted"),
		 "after the restart too, until rank 1 took v1: %s (%s)", wex_strerror(ret),
		 wex_last_error(p.c));
	T_ASSERT(held_count(model, (int)getpid(), 1,
			    mode == WEX_SYNC_COPY ? "round" : "remap-view") == 1,
		 "status shows rank 0's take of the round");
	/* The trainer waits to write v2 (an asynchronous trainer always
	 * does): rank 1 still takes v1 at once, as it would have from the
	 * round (before: it waited for the trainer's timeout). */
	pthread_create(&w.th, NULL, writer_main, &w);
	usleep(100000);
	/* (Its wait, 5 s, ends before the trainer's, 10 s: a sync that
	 * waited for the trainer fails.) */
	T_WEX(k1.c, wex_sync(k1.c, mode, 1, 5000, &r));
	T_ASSERT(r.version == 1, "rank 1 gets v1, the version rank 0 serves (got v%llu)",
		 (unsigned long long)r.version);
	if (mode == WEX_SYNC_COPY) {
		T_ASSERT(t_own_bad(&k1, 1) == 0, "rank 1's weights hold v1");
		T_ASSERT(held_count(model, 0, 0, "") == 0 && journal_count() == 0,
			 "the round closed, and nothing of it stays written down (%d records)",
			 journal_count());
	} else {
		T_ASSERT(t_view_bad(&k1, 0, 1) == 0, "rank 1 views v1");
		T_WEX(k1.c, wex_release(k1.c));
		T_WEX(k0.c, wex_release(k0.c));
	}
	pthread_join(w.th, NULL);
	T_ASSERT(w.ret == 0, "the trainer then writes v2: %s", wex_strerror(w.ret));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	T_WEX(k0.c, wex_sync(k0.c, mode, 2, 5000, &r));
	T_ASSERT(r.version == 2, "rank 0 then gets v2");
	T_WEX(k1.c, wex_sync(k1.c, mode, 2, 5000, &r));
	T_ASSERT(r.version == 2, "and rank 1 v2");
	if (mode == WEX_SYNC_COPY)
		T_ASSERT(t_own_bad(&k0, 2) == 0 && t_own_bad(&k1, 2) == 0 && journal_count() == 0,
			 "whole, and a closed round writes nothing (%d records)", journal_count());
	t_cons_close(&k0);
	t_cons_close(&k1);
	t_prod_close(&p);
}

/* Rank 0 re-syncs v1 after a restart (a round on v1 that rank 1, which
 * took v1 from the wexd before, has not passed yet) and wexd restarts
 * again: rank 1, asking for v2 and saying it holds v1, passes the round
 * rank 0's record holds, and the trainer writes (rather than waiting for
 * rank 0, whose rollout waits for rank 1). */
static void round_passed(void)
{
	struct t_prod p;
	struct t_cons k0, k1;
	struct wex_sync_result r;
	struct writer w = { .p = &p, .v = 2, .publish = 1 };

	t_prod_open(&p, "pass", "tiny", 0, 1);
	t_cons_open_from(&k0, "pass", "g", "tiny", 0, 2, 0);
	t_cons_open_from(&k1, "pass", "g", "tiny", 1, 2, 0);
	t_prod_write(&p, 1);
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_WEX(k1.c, wex_sync(k1.c, WEX_SYNC_COPY, 1, 5000, &r));
	restart();
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(journal_count() == 1, "rank 0's take of the new round is written down (%d)",
		 journal_count());
	restart();
	pthread_create(&w.th, NULL, writer_main, &w);
	usleep(300000);
	/* (Its wait, 5 s, ends before the trainer's, 10 s: a sync that
	 * waited for the trainer to give up fails.) */
	T_WEX(k1.c, wex_sync(k1.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k1, 2) == 0, "rank 1 gets v2 (v%llu)",
		 (unsigned long long)r.version);
	pthread_join(w.th, NULL);
	T_ASSERT(w.ret == 0, "the trainer wrote v2: %s", wex_strerror(w.ret));
	T_ASSERT(held_count("pass", 0, 0, "") == 0 && journal_count() == 1,
		 "nothing held from before; rank 1's take of the round on v2 written (%d records)",
		 journal_count());
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 2, 5000, &r));
	T_ASSERT(r.version == 2 && t_own_bad(&k0, 2) == 0 && journal_count() == 0,
		 "rank 0 too, which closes that round (%d records)", journal_count());
	t_cons_close(&k0);
	t_cons_close(&k1);
	t_prod_close(&p);
}


/* Rank 0 took v1 (its take of the round written down), wexd restarts, and
 * both engines close their clients with no call between: nothing of the
 * group is left to take v1, so the trainer writes (as it would have at the
 * wexd before, whose round ended with the group's last rank). */
static void round_closed_clients(void)
{
	struct t_prod p;
	struct t_cons k0, k1;
	struct wex_sync_result r;
	int ret;

	t_prod_open(&p, "rclose", "tiny", 0, 1);
	t_cons_open_from(&k0, "rclose", "g", "tiny", 0, 2, 0);
	t_cons_open_from(&k1, "rclose", "g", "tiny", 1, 2, 0);
	t_prod_write(&p, 1);
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r));
	restart();
	T_ASSERT(held_count("rclose", (int)getpid(), 1, "round") == 1, "rank 0's take is held");
	/* (Until the killed wexd's sockets are closed, the clients cannot
	 * tell it is gone.) */
	usleep(300000);
	t_cons_close(&k0);
	t_cons_close(&k1);
	ret = wex_begin_write(p.c, 2, 2000);
	T_ASSERT(ret == 0, "with the group's clients closed the trainer writes: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	T_ASSERT(journal_count() == 0, "nothing stays written down (%d records)", journal_count());
	T_WEX(p.c, wex_publish(p.c, 2));
	t_prod_close(&p);
}



/* Rank 0's engine took v1 (its take of the round written down) and hangs
 * on (alive, calling no more) across a wexd restart; a new engine takes
 * its rank, and it and rank 1 take v1 at the next wexd: the group took v1
 * whole, so the hung engine's take holds the trainer off no more (it held
 * it until that process exited). */
static void round_slot_taken(void)
{
	struct t_prod p;
	struct t_cons k0, k1;
	struct wex_sync_result r;
	int pfd[2], ret;
	char ch = 0;
	pid_t child;

	t_prod_open(&p, "rslot", "tiny", 0, 1);
	t_prod_write(&p, 1);
	T_ASSERT(pipe(pfd) == 0, "pipe");
	child = t_fork();
	if (child == 0) {
		struct t_cons k;

		close(pfd[0]);
		t_cons_open_from(&k, "rslot", "g", "tiny", 0, 2, 0);
		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
		(void)!write(pfd[1], "s", 1);
		rollout(NULL);
	}
	close(pfd[1]);
	T_ASSERT(read(pfd[0], &ch, 1) == 1, "the engine synced");
	close(pfd[0]);
	restart();
	T_ASSERT(held_count("rslot", (int)child, 1, "round") == 1, "its take is held");
	t_cons_open_from(&k0, "rslot", "g", "tiny", 0, 2, 0);
	t_cons_open_from(&k1, "rslot", "g", "tiny", 1, 2, 0);
	T_WEX(k0.c, wex_sync(k0.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_WEX(k1.c, wex_sync(k1.c, WEX_SYNC_COPY, 1, 5000, &r));
	ret = wex_begin_write(p.c, 2, 1000);
	T_ASSERT(ret == 0, "the group took v1 whole: the trainer writes: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	T_ASSERT(held_count("rslot", 0, 0, "") == 0 && journal_count() == 0,
		 "and nothing is held from before (%d records)", journal_count());
	T_WEX(p.c, wex_publish(p.c, 2));
	kill(child, SIGKILL);
	T_ASSERT(t_wait(child) == 128 + SIGKILL, "the engine was killed");
	t_cons_close(&k0);
	t_cons_close(&k1);
	t_prod_close(&p);
}

int main(void)
{
	t_wexd_start(&d);
	t_check_backend(d.sock);
	held_until_exit("exit", 0);
	held_until_exit("leader", 1);
	/* An engine whose real uid is not its effective one (a setuid
	 * program's, one that dropped privileges with seteuid): the record
	 * names its effective uid (SO_PEERCRED's), and it still holds. */
	if (geteuid() == 0) {
		engine_ruid = 65534;
		held_until_exit("ruid", 0);
		engine_ruid = (uid_t)-1;
		/* One that dropped privileges with seteuid once connected
		 * (its real and saved uid still the record's, its effective
		 * one not): it still holds too (before, it was taken for
		 * another user's process that took the pid). */
		engine_euid_after = 65534;
		held_until_exit("euid_after", 0);
		engine_euid_after = (uid_t)-1;
		/* One that dropped privileges for good with setuid once
		 * connected (none of its uids the record's now; the same pid
		 * and start time): it still holds (before, it was taken for
		 * another user's process, and the trainer wrote under it). */
		engine_uid_after = 65534;
		held_until_exit("uid_after", 0);
		engine_uid_after = (uid_t)-1;
	}
	close_after_restart();
	stale_records();
	claim_mismatch();
	sigterm_keeps();
	journal_off();
	journal_off_fixed();
	journal_off_fixed_stale();
	garbage_appended();
	newer_member();
	newer_format();
	fsize_limit();
	close_while_down();
	release_then_close(0);
	release_then_close(1);
	release_unanswered(0);
	release_unanswered(1);
	round_kept(WEX_SYNC_COPY);
	round_kept(WEX_SYNC_REMAP_VIEW);
	round_passed();
	round_closed_clients();
	round_slot_taken();
	t_wexd_stop(&d);
	printf("lease_journal: PASS\n");
	t_exit(T_EXIT_PASS);
}
