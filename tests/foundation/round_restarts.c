/* SPDX-License-Identifier: MIT */
/*
 * round_restarts - a consumer group of three ranks syncs one version across
 * several wexd restarts (SIGKILL, started again as systemd does), each rank
 * in copy mode, one producer rank.  A rank's take of its group's open round
 * is written down (journal.h, WEX_JOURNAL_ROUND), and the next wexd passes
 * it when the group opens a round on that version there; the passed take
 * stays written down while that round is open, so the wexd after the next
 * passes it too.
 *
 *  - twice: rank 0 takes v1; restart; rank 1 takes v1 (the round passes
 *    rank 0's take); restart; rank 2 takes v1: the group took v1 whole, so
 *    the round closes and the trainer writes v2 at once.  (Before, the
 *    second restart forgot rank 0's take: the round waited for rank 0,
 *    idle in its rollout with v1, and held the trainer off until rank 0
 *    synced again; the trainer's begin_write ended in EBUSY.)
 *  - twice_term: the same, the second restart a graceful stop (SIGTERM).
 *  - thrice: the same with a third restart, rank 1 syncing v1 again
 *    between the second and the third.
 *  - served_pass: all three ranks took v1; rank 2's engine goes, rank 1's
 *    restarts and syncs v1 again: the new round on v1 passes rank 0 (served
 *    v1 by this wexd) and waits for rank 2's slot; restart; rank 2's next
 *    engine takes v1, and the group took it whole.  (Before, a rank that
 *    passed a round was not written down: the next wexd's round waited for
 *    rank 0, idle with v1, holding the trainer off.)
 *  - exit_down: rank 0's engine (a child process) took v1; restart; rank 1
 *    takes v1 (passing rank 0's take); wexd is killed, rank 0's engine
 *    exits while no wexd runs, and wexd starts again: rank 0's take ended
 *    with its process, so the round waits for rank 0's slot (holding the
 *    trainer off), and the slot's next process takes v1 at once, which
 *    closes it.  (So before too.)
 *  - exit_up: rank 0's engine took v1, its take was passed at the next
 *    wexd (the round open there, rank 2 not yet), and it exits while that
 *    wexd runs: it holds nothing of the round any more, so the round waits
 *    for its slot again as for any rank that died (before: rank 2's take
 *    closed the round, the trainer wrote v2, and rank 0's next process got
 *    v2 while ranks 1 and 2 served v1).  exit_up_view: the same with
 *    rank 0's engine holding a remap-view lease of v1 (its record).
 *  - group_empties: rank 0 took v1; restart; rank 1 takes v1 (passing
 *    rank 0's take, rank 0 idle and not connected to this wexd) and its
 *    engine goes, no rank of the group connected: rank 0's take still
 *    holds the trainer off, and rank 1's next process and rank 2 take v1.
 *    (Before, the round closed with the group's last connected rank and
 *    ended rank 0's take: the trainer wrote v2, which ranks 1 and 2 got
 *    while rank 0 served v1.)
 *  - resent: rank 0 took v1; restart; rank 1 takes v1 (passing rank 0's
 *    take); rank 0, idle with v1, asks this wexd for its status: libwex
 *    reconnects, re-sending its layout with the version it holds, and the
 *    round keeps passing it (written down for its new connection), so
 *    rank 2's take closes it.  (Before, wexd took the re-sent layout for
 *    new buffers: the round waited for rank 0 until it synced again,
 *    holding the trainer off.)  resent_restart: across another restart
 *    too.  resent_fresh: rank 0 then attaches its buffers anew (no
 *    version said): the round waits for its sync.  resent_again: rank 1's
 *    engine then restarts and syncs v1 again: the round it opens on v1
 *    passes rank 0, which counts as serving v1 (before: as serving
 *    nothing, so the round waited for it, idle with v1, holding the
 *    trainer off until it synced again).
 *  - gone_held: rank 0 took v1; restart; rank 1 takes v1 (passing rank
 *    0's take, rank 0 idle and not connected); the trainer exits, the
 *    memory behind v1 with it, and comes back writing v2: rank 0's passed
 *    take counts among the lost round's holders, as rank 1's does, so
 *    rank 2 gets ESTALE until rank 0 syncs again (before: rank 2 got v2
 *    while rank 0 served v1).  gone_exit: the same with rank 0's engine a
 *    child process that exits instead of syncing again: its slot holds
 *    nothing of the lost round any more, and rank 2 gets v2.
 *    gone_resent: rank 0 calls that wexd (a status request) before the
 *    trainer exits: its pass, kept, counts too.
 *  - gone_empty, gone_idle: rank 0's take from before that no round at
 *    the next wexd passed (the group's ranks all left, as in
 *    group_empties; or none synced there) when the trainer exits: it
 *    holds the trainer off no more (before: the trainer's begin_write of
 *    v2 waited for rank 0's process, EBUSY), and rank 0's peers get ESTALE
 *    until it syncs again.  gone_restart: gone_idle, wexd restarting after
 *    the trainer wrote v2: the take is written down as lost, and the next
 *    wexd gives the peers ESTALE too (before, it forgot the take: they got
 *    v2 while rank 0 served v1).  gone_called_restart: the same, rank 0
 *    calling that wexd (a status request) before the restart: its record
 *    stays, its connection's (before, it went at that call, and the next
 *    wexd gave the peers v2).  gone_readonly: the journal read-only when
 *    the trainer exits, writable again before the restart: the take is
 *    written down as lost then (before, its record still said "round").
 *  - gone_view: rank 0 views v1 (a remap-view lease) and the trainer
 *    exits: the lease holds the trainer off until rank 0 releases it, and
 *    then ranks 1 and 2 get ESTALE until rank 0 syncs again (its views
 *    show v1).  gone_view_restart: the same, wexd restarting before the
 *    release: the lease is written down as one of a lost round
 *    ("lost-remap-view"), so the next wexd does both too (before, it was
 *    written as a plain lease: the next wexd gave ranks 1 and 2 v2 once
 *    rank 0 released it, its views showing v1).  gone_view_down: rank 0
 *    releases its lease while no wexd runs, and its next call (a status
 *    request) ends it at the next wexd: its take of the lost round stays
 *    written down, and a further restart gives ranks 1 and 2 ESTALE too.
 *  - gone_view_passed: rank 0 views v1 (a remap-view lease); restart;
 *    rank 1 takes v1 (the round passes rank 0's lease) and the trainer
 *    exits: the lease from before counts among the lost round's holders
 *    as one taken here does (written "lost-remap-view", holding the
 *    trainer off until released), and rank 2 gets ESTALE until rank 0
 *    syncs again (before: it was not counted, and rank 2 got v2 while
 *    rank 0's views showed v1).  gone_view_passed_restart: wexd restarts
 *    after the loss too.  gone_view_passed_resent: rank 0 calls that wexd
 *    (a status request) before the trainer exits, taking its lease back.
 *    gone_view_claimed: as gone_view_restart, rank 0 taking its lease back
 *    (a status request) and wexd restarting again before it releases it:
 *    still "lost-remap-view".  gone_view_exit, gone_view_passed_exit: rank
 *    0's engine (a child) holds such a lease, read back or marked lost at
 *    this wexd, and dies: the lease ends (the trainer writes v2) and its
 *    slot holds nothing of the lost round (every rank gets v2).
 *  - lost_here_restart: ranks 0 and 1 take v1 here, the trainer exits and
 *    writes v2, wexd restarts: their takes of the lost round were written
 *    down as lost, so rank 2 gets ESTALE until both sync again (before,
 *    the next wexd gave it v2 while ranks 0 and 1 served v1).
 *
 * Every check is structural: status (the group's open round, leases held
 * from before), the journal's records, versions and bytes synced.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "fixture.h"

static struct t_wexd d;

/* Records of held leases or takes in the journal (journal.h). */
#define journal_count() t_journal_files(d.sock, 1)

/* The version of the round open to group "g" of `model` (0: none). */
static uint64_t group_round(const char *model)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model), *g;
	uint64_t v = 0;
	size_t i;

	json_array_foreach(m ? json_object_get(m, "groups") : NULL, i, g)
		if (!strcmp(json_string_value(json_object_get(g, "name")) ?: "", "g"))
			v = (uint64_t)json_integer_value(json_object_get(g, "round"));
	json_decref(st);
	return v;
}

/* Entries of `model`'s held[] (takes and leases from before this wexd). */
static int held_count(const char *model)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model);
	int n = m ? (int)json_array_size(json_object_get(m, "held")) : 0;

	json_decref(st);
	return n;
}

/* The mode of `model`'s first held[] entry, in `buf` ("" when none). */
static const char *held_mode(const char *model, char *buf, size_t len)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model);
	json_t *h = json_array_get(m ? json_object_get(m, "held") : NULL, 0);

	snprintf(buf, len, "%s", json_string_value(json_object_get(h, "mode")) ?: "");
	json_decref(st);
	return buf;
}

/* Entries of `model`'s held[] whose mode is `mode`. */
static int held_modes(const char *model, const char *mode)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model), *h;
	int n = 0;
	size_t i;

	json_array_foreach(m ? json_object_get(m, "held") : NULL, i, h)
		n += !strcmp(json_string_value(json_object_get(h, "mode")) ?: "", mode);
	json_decref(st);
	return n;
}

/* The pid of `model`'s producer rank 0 once it holds v1 at this wexd (0:
 * not connected, or not yet). */
static int producer_pid(const char *model)
{
	json_t *st = t_status(d.sock), *m = t_status_model(st, model);
	json_t *pr = json_array_get(m ? json_object_get(m, "producers") : NULL, 0);
	int pid = pr && json_integer_value(json_object_get(pr, "published")) >= 1 ?
			  (int)json_integer_value(json_object_get(pr, "pid")) : 0;

	json_decref(st);
	return pid;
}

/* Rank `rank` of the three of group "g": each rank holds the whole
 * model (3 does not divide the preset's shapes), in a region reserved
 * against the producer's segment, its layout attached. */
static void cons_open(struct t_cons *k, const char *model, uint32_t rank)
{
	struct ex_cfg cfg;

	memset(k, 0, sizeof(*k));
	T_ASSERT(ex_cfg_preset(&cfg, "tiny") == 0, "preset tiny");
	k->n = ex_shards(&cfg, 0, 1, &k->t, &k->seg_bytes);
	T_ASSERT(k->n > 0, "ex_shards(tiny, 0/1)");
	k->rank = rank;
	k->c = t_open(WEX_ROLE_CONSUMER, model, "g", rank, 3);
	T_WEX(k->c, wex_reserve(k->c, 0, 0, k->seg_bytes, &k->region));
	for (int i = 0; i < k->n; i++)
		k->t[i].ptr = (char *)k->region + k->t[i].offset;
	T_WEX(k->c, wex_attach(k->c, k->t, (size_t)k->n));
}

static void restart(void)
{
	t_wexd_kill(&d);
	t_wexd_restart(&d);
}

/* A graceful stop (SIGTERM, as systemctl restart), then a start. */
static void restart_term(void)
{
	int st;

	T_ASSERT(kill(d.pid, SIGTERM) == 0, "SIGTERM wexd");
	T_ASSERT(waitpid(d.pid, &st, 0) == d.pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		 "wexd stopped cleanly");
	d.pid = 0;
	t_wexd_restart(&d);
}

static void take(struct t_cons *k, uint64_t v)
{
	struct wex_sync_result r;

	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, v, 10000, &r));
	T_ASSERT(r.version == v && t_own_bad(k, v) == 0, "rank %u took v%llu (got v%llu)", k->rank,
		 (unsigned long long)v, (unsigned long long)r.version);
}

/* The group took v1 whole: no round open, nothing held or written down,
 * and the trainer writes v2 (begin_write granted: nothing holds it), which
 * every rank of the group then takes. */
static void group_took_v1(const char *model, struct t_prod *p, struct t_cons *k, int n)
{
	int ret;

	T_ASSERT(group_round(model) == 0,
		 "every rank of the group took v1, yet its round on v%llu is still open",
		 (unsigned long long)group_round(model));
	T_ASSERT(held_count(model) == 0 && journal_count() == 0,
		 "nothing of the round is held (%d) or written down (%d records)",
		 held_count(model), journal_count());
	ret = wex_begin_write(p->c, 2, 10000);
	T_ASSERT(ret == 0, "the trainer writes v2: %s (%s)", wex_strerror(ret),
		 wex_last_error(p->c));
	ex_fill(p->base, p->t, (size_t)p->n, 2, 1);
	T_WEX(p->c, wex_publish(p->c, 2));
	for (int i = 0; i < n; i++)
		take(&k[i], 2);
	T_ASSERT(group_round(model) == 0 && journal_count() == 0,
		 "the round on v2 closed (%d records)", journal_count());
}

/* `term`: the second restart is a graceful stop. */
static void twice(int restarts, int term)
{
	const char *model = term ? "twice-term" : restarts == 2 ? "twice" : "thrice";
	struct t_prod p;
	struct t_cons k[3];

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t r = 0; r < 3; r++)
		cons_open(&k[r], model, r);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	T_ASSERT(journal_count() == 1, "rank 0's take is written down (%d)", journal_count());
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1, "the round on v1 waits for rank 2");
	if (term)
		restart_term();
	else
		restart();
	if (restarts == 3) {
		/* Rank 1 syncs v1 again (a repeated request): its hello ends
		 * its own take from before, and it takes v1 again. */
		take(&k[1], 1);
		T_ASSERT(group_round(model) == 1, "the round on v1 waits for rank 2");
		restart();
	}
	take(&k[2], 1);
	group_took_v1(model, &p, k, 3);
	printf("round_restarts: %s: the group took v1 across %d restarts%s; the trainer wrote v2\n",
	       model, restarts, term ? " (the second graceful)" : "");
	for (uint32_t r = 0; r < 3; r++)
		t_cons_close(&k[r]);
	t_prod_close(&p);
}

/* All three ranks took v1; rank 2's engine goes and rank 1's restarts and
 * syncs v1 again: a new round on v1, which rank 0 (served v1 by this wexd)
 * passes at once, waits for rank 2's slot.  wexd restarts; rank 2's next
 * engine takes v1: the group took it whole. */
static void served_pass(void)
{
	const char *model = "served";
	struct t_prod p;
	struct t_cons k[3];

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t r = 0; r < 3; r++)
		cons_open(&k[r], model, r);
	t_prod_write(&p, 1);
	for (uint32_t r = 0; r < 3; r++)
		take(&k[r], 1);
	T_ASSERT(group_round(model) == 0, "the group took v1 whole");
	t_cons_close(&k[2]);
	t_cons_close(&k[1]);
	cons_open(&k[1], model, 1);
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1, "the round rank 1 opened on v1 waits for rank 2");
	restart();
	cons_open(&k[2], model, 2);
	take(&k[2], 1);
	group_took_v1(model, &p, k, 3);
	printf("round_restarts: %s: rank 0 passed the round on v1 at the next wexd too\n", model);
	for (uint32_t r = 0; r < 3; r++)
		t_cons_close(&k[r]);
	t_prod_close(&p);
}

/* Rank 0 takes v1; restart; rank 1 takes v1 (the round passes rank 0's
 * take, rank 0 idle with v1 and not yet connected to this wexd); rank 1's
 * engine goes, leaving no rank of the group connected: rank 0's take still
 * holds the trainer off (its process holds v1, as it would were it
 * connected), and rank 1's next process and rank 2 take v1.  (Before, the
 * group's round closed with its last connected rank and ended rank 0's
 * take: the trainer wrote v2, which ranks 1 and 2 then got while rank 0
 * served v1.) */
static void group_empties(void)
{
	const char *model = "empties";
	struct t_prod p;
	struct t_cons k[3];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1, "the round on v1 waits for rank 2");
	t_cons_close(&k[1]);
	/* (A condition, not a timed sleep: wexd sees rank 1 go, the group
	 * with it.) */
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw rank 1 go");
		usleep(20000);
	}
	T_ASSERT(held_count(model) == 1, "rank 0's take from before still holds (%d held)",
		 held_count(model));
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "rank 0 holds v1: the trainer waits to write v2: %s",
		 wex_strerror(ret));
	cons_open(&k[1], model, 1);
	take(&k[1], 1);
	take(&k[2], 1);
	group_took_v1(model, &p, k, 3);
	printf("round_restarts: %s: rank 0's take held the trainer off with no rank connected\n",
	       model);
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* Rank 0 takes v1; restart; rank 1 takes v1 (the round passes rank 0's
 * take); rank 0, idle with v1, calls the new wexd with something other
 * than a sync (a status request): libwex reconnects, saying hello and
 * re-sending its layout, the same buffers, which hold v1.  The round keeps
 * passing rank 0 (`restarts`: across a further restart too), and rank 2's
 * take closes it.  (Before, wexd took the re-sent layout for new buffers:
 * the round waited for rank 0 until it synced again, holding the trainer
 * off, its begin_write EBUSY.)  `fresh`: rank 0 then attaches new buffers,
 * which hold nothing: the round waits for it again, and its sync takes
 * v1. */
static void resent(int restarts, int fresh, int again)
{
	const char *model = fresh ? "resent-fresh" : restarts ? "resent-restart" :
			    again ? "resent-again" : "resent";
	struct t_prod p;
	struct t_cons k[3];
	char *json = NULL;
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1 && held_count(model) == 1,
		 "the round on v1 passed rank 0's take and waits for rank 2");
	T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
	free(json);
	T_ASSERT(held_count(model) == 0, "rank 0's process called this wexd (%d held)",
		 held_count(model));
	T_ASSERT(journal_count() == 2, "rank 0's pass stays written down, as rank 1's take (%d records)",
		 journal_count());
	for (int i = 0; i < restarts; i++)
		restart();
	if (fresh) {
		T_WEX(k[0].c, wex_attach(k[0].c, k[0].t, (size_t)k[0].n));
		take(&k[2], 1);
		ret = wex_begin_write(p.c, 2, 200);
		T_ASSERT(ret == -EBUSY, "rank 0 attached new buffers: the round waits for it, "
			 "holding the trainer off: %s", wex_strerror(ret));
		take(&k[0], 1);
	} else {
		take(&k[2], 1);
	}
	if (again) {
		/* Rank 1's engine restarts and syncs v1 again: the round it
		 * opens on v1 passes rank 0 (serving v1, its re-sent buffers
		 * hold it) and rank 2.  (Before, rank 0 counted as serving
		 * nothing: the round waited for it, idle with v1, holding the
		 * trainer off until it synced again.) */
		T_ASSERT(group_round(model) == 0, "the group took v1 whole");
		t_cons_close(&k[1]);
		cons_open(&k[1], model, 1);
		take(&k[1], 1);
		T_ASSERT(group_round(model) == 0,
			 "the round rank 1 opened again on v1 passes rank 0 (it re-sent its buffers "
			 "holding v1) and rank 2, yet it is still open");
	}
	group_took_v1(model, &p, k, 3);
	printf("round_restarts: %s: rank 0's reconnect %s\n", model,
	       fresh ? "then new buffers: the round waited for its sync" :
		       restarts ? "kept its pass across another restart" : "kept its pass");
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}


/* Rank 0's engine: a child process that takes v1 in `mode` and waits to
 * be killed. */
static pid_t engine0(const char *model, int mode)
{
	int pfd[2];
	char ch = 0;
	pid_t child;

	T_ASSERT(pipe(pfd) == 0, "pipe");
	child = t_fork();
	if (child == 0) {
		struct t_cons k;

		close(pfd[0]);
		cons_open(&k, model, 0);
		if (mode == WEX_SYNC_COPY) {
			take(&k, 1);
		} else {
			struct wex_sync_result r;

			T_WEX(k.c, wex_sync(k.c, mode, 1, 10000, &r));
			T_ASSERT(r.version == 1 && t_view_bad(&k, 0, 1) == 0, "rank 0 views v1");
		}
		(void)!write(pfd[1], "s", 1);
		for (;;)
			pause();
	}
	close(pfd[1]);
	T_ASSERT(read(pfd[0], &ch, 1) == 1, "rank 0's engine took v1");
	close(pfd[0]);
	return child;
}

static void engine0_dies(pid_t child)
{
	kill(child, SIGKILL);
	T_ASSERT(t_wait(child) == 128 + SIGKILL, "rank 0's engine was killed");
}

/* Rank 0 takes v1 (`exits`: its engine a child process); restart; rank 1
 * takes v1 (the round passes rank 0's take, rank 0 idle and not
 * connected); the trainer exits, the memory behind v1 with it, and comes
 * back writing v2 (nothing of the lost round holds it off).  Rank 1 (which
 * took the lost round here) syncs again and gets v2; rank 0 still holds
 * v1, as a connected rank that took the lost round would: rank 2 gets
 * ESTALE until rank 0 syncs again (before: rank 0's passed take ended with
 * the round, and rank 2 got v2 while rank 0 served v1).  `exits`: rank 0's
 * engine exits instead: its slot holds nothing of the lost round any
 * more, rank 2 gets v2, and so does rank 0's next process. */
static void gone_held(int exits, int resent)
{
	const char *model = exits ? "gone-exit" : resent ? "gone-resent" : "gone-held";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	pid_t child = 0;
	char *json = NULL;
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 1);
	if (exits)
		child = engine0(model, WEX_SYNC_COPY);
	for (uint32_t i = exits ? 1 : 0; i < 3; i++)
		cons_open(&k[i], model, i);
	if (!exits)
		take(&k[0], 1);
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1 && held_count(model) == 1,
		 "the round on v1 passed rank 0's take and waits for rank 2");
	if (resent) {
		T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
		free(json);
	}
	t_prod_close(&p);
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	/* (Rank 1's take, made here, is written down as lost too.) */
	T_ASSERT(held_count(model) == !resent && journal_count() == 2,
		 "rank 0's take of the lost round is held (%d), rank 0's and rank 1's written down "
		 "as lost (%d records)", held_count(model), journal_count());
	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 2);
	take(&k[1], 2);
	ret = wex_sync(k[2].c, WEX_SYNC_COPY, 2, 2000, &r);
	T_ASSERT(ret == -ESTALE, "rank 0 holds v1 of the lost round: rank 2 waits for it to sync "
		 "again (ESTALE), yet got %s (v%llu)", ret ? wex_strerror(ret) : "it",
		 (unsigned long long)r.version);
	if (exits) {
		engine0_dies(child);
		/* (A condition, not a timed sleep: wexd looks for the exits
		 * of processes holding takes from before it now and then.) */
		for (double t0 = t_now(); held_count(model) != 0;) {
			T_ASSERT(t_now() - t0 < 30.0, "rank 0's take outlived its process");
			usleep(20000);
		}
		take(&k[2], 2);
		T_ASSERT(group_round(model) == 2, "the round on v2 waits for rank 0's slot");
		cons_open(&k[0], model, 0);
		take(&k[0], 2);
	} else {
		take(&k[0], 2);
		take(&k[2], 2);
	}
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: rank 0's passed take counted among the lost round's%s\n",
	       model, exits ? " until its engine exited" : resent ? " (it had called wexd)" : "");
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* Rank 0 takes v1; restart; `empty`: rank 1 takes v1 (passing rank 0's
 * take) and its engine goes, no rank of the group connected (as in
 * group_empties), else no rank syncs at this wexd; the trainer exits and
 * comes back.  Rank 0's take from before (no round here passes it) holds
 * v1 of a lost round: it holds the trainer off no more (before: its
 * begin_write of v2 waited for rank 0's process, EBUSY, until that called
 * wexd or exited), and rank 0's peers get ESTALE until it syncs again.
 * `again`: wexd restarts after the trainer wrote v2, before rank 0 syncs
 * again: the take is written down as lost, so the next wexd too gives
 * rank 0's peers ESTALE (before, its record was removed: the next wexd
 * forgot it, and ranks 1 and 2 got v2 while rank 0 served v1). */
static void gone_unpassed(int empty, int again)
{
	const char *model = again == 2 ? "gone-called-restart" : again ? "gone-restart" :
			    empty ? "gone-empty" : "gone-idle";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	restart();
	if (empty) {
		take(&k[1], 1);
		t_cons_close(&k[1]);
	}
	/* (Conditions, not timed sleeps: wexd sees rank 1 go, the group with
	 * it; the trainer said it holds v1 again, v1 lost when it exits.) */
	for (double t0 = t_now(); group_round(model) != 0 || producer_pid(model) == 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw rank 1 go or the trainer come back");
		usleep(20000);
	}
	T_ASSERT(held_count(model) == 1, "rank 0's take from before is held (%d)",
		 held_count(model));
	t_prod_close(&p);
	for (double t0 = t_now(); producer_pid(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	T_ASSERT(journal_count() == 1, "rank 0's take of the lost round is written down as lost (%d)",
		 journal_count());
	t_prod_open(&p, model, "tiny", 0, 1);
	ret = wex_begin_write(p.c, 2, 2000);
	T_ASSERT(ret == 0, "v1 is lost: rank 0's take of it holds the trainer off no more: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	if (again == 2) {
		char *json = NULL;

		/* Rank 0, idle with v1, calls this wexd (libwex reconnects):
		 * its take stays written down as lost, now its connection's. */
		T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
		free(json);
		T_ASSERT(journal_count() == 1,
			 "rank 0 called wexd, not synced: its take of the lost round stays "
			 "written down (%d records)", journal_count());
		restart();
	} else if (again) {
		/* wexd restarts before rank 0 syncs again: the next one still
		 * counts rank 0's take among the lost round's. */
		restart();
		T_ASSERT(held_count(model) == 1 && journal_count() == 1,
			 "rank 0's take of the lost round outlived the restart (%d held, %d records)",
			 held_count(model), journal_count());
	}
	if (empty)
		cons_open(&k[1], model, 1);
	for (uint32_t i = 1; i < 3; i++) {
		ret = wex_sync(k[i].c, WEX_SYNC_COPY, 2, 2000, &r);
		T_ASSERT(ret == -ESTALE, "rank 0 holds v1 of the lost round: rank %u waits for it "
			 "to sync again (ESTALE), yet got %s (v%llu)", i,
			 ret ? wex_strerror(ret) : "it", (unsigned long long)r.version);
	}
	take(&k[0], 2);
	take(&k[1], 2);
	take(&k[2], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: rank 0's take from before counted among the lost round's\n",
	       model);
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* Ranks 0 and 1 take v1 at this wexd; the trainer exits, the memory
 * behind v1 with it, and comes back writing v2; wexd restarts before
 * ranks 0 and 1 sync again: their takes of the lost round are written
 * down as lost, so the next wexd gives rank 2 ESTALE until both have
 * synced again (before, the lost round's takes ended with it: the next
 * wexd gave rank 2 v2 while ranks 0 and 1 served v1). */
static void lost_here_restart(void)
{
	const char *model = "lost-here-restart";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	take(&k[1], 1);
	t_prod_close(&p);
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	T_ASSERT(journal_count() == 2, "ranks 0 and 1 took the lost round: written down as lost "
		 "(%d records)", journal_count());
	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 2);
	restart();
	T_ASSERT(held_count(model) == 2, "both takes of the lost round outlived the restart (%d)",
		 held_count(model));
	ret = wex_sync(k[2].c, WEX_SYNC_COPY, 2, 2000, &r);
	T_ASSERT(ret == -ESTALE, "ranks 0 and 1 hold v1 of the lost round: rank 2 waits for them "
		 "to sync again (ESTALE), yet got %s (v%llu)", ret ? wex_strerror(ret) : "it",
		 (unsigned long long)r.version);
	take(&k[0], 2);
	ret = wex_sync(k[2].c, WEX_SYNC_COPY, 2, 2000, &r);
	T_ASSERT(ret == -ESTALE, "rank 1 holds v1 of the lost round: rank 2 waits for it (ESTALE), "
		 "yet got %s (v%llu)", ret ? wex_strerror(ret) : "it", (unsigned long long)r.version);
	take(&k[1], 2);
	take(&k[2], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: takes of a lost round made here outlived a restart\n", model);
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* Rank 0 views v1 (a remap-view lease, written down); the trainer exits,
 * the memory behind v1 with it: rank 0's lease of the lost round still
 * holds the trainer off, and its views show v1.  `again`: wexd restarts
 * before rank 0 syncs again: the next wexd holds the trainer off with the
 * lease as the first did.  Rank 0 releases its lease (the rollout ends),
 * the trainer writes v2: rank 1 gets ESTALE until rank 0 syncs again, at
 * the next wexd too (before, the lease was written down as a plain one,
 * and the next wexd, its lost mark forgotten, gave rank 1 v2 while rank
 * 0's views showed v1). */
static void gone_view(int again)
{
	const char *model = again == 3 ? "gone-view-claimed" : again == 2 ? "gone-view-down" :
			    again ? "gone-view-restart" :
			    "gone-view";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	char mode[32];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	T_WEX(k[0].c, wex_sync(k[0].c, WEX_SYNC_REMAP_VIEW, 1, 10000, &r));
	T_ASSERT(r.version == 1 && t_view_bad(&k[0], 0, 1) == 0, "rank 0 views v1");
	t_prod_close(&p);
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	T_ASSERT(journal_count() == 1, "rank 0's lease is written down (%d records)",
		 journal_count());
	if (again == 2) {
		char *json = NULL;

		/* Rank 0 releases its lease while no wexd runs (it cannot give
		 * it back); its next call, a status request, says hello naming
		 * no lease: the next wexd ends the lease, and the take of the
		 * lost round stays written down, its connection's. */
		t_wexd_kill(&d);
		ret = wex_release(k[0].c);
		T_ASSERT(ret == -WEX_EDAEMON, "release with no wexd: %s", wex_strerror(ret));
		t_wexd_restart(&d);
		T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
		free(json);
		T_ASSERT(held_count(model) == 0 && journal_count() == 1,
			 "rank 0's lease ended, its take of the lost round written down (%d held, "
			 "%d records)", held_count(model), journal_count());
		restart();
		T_ASSERT(held_count(model) == 1 && !strcmp(held_mode(model, mode, sizeof(mode)), "lost"),
			 "rank 0's take of the lost round outlived the restart (%d held, mode '%s')",
			 held_count(model), held_mode(model, mode, sizeof(mode)));
		t_prod_open(&p, model, "tiny", 0, 1);
	} else {
		if (again) {
			restart();
			T_ASSERT(held_count(model) == 1 &&
				 !strcmp(held_mode(model, mode, sizeof(mode)), "lost-remap-view"),
				 "rank 0's lease of the lost round outlived the restart (%d held, "
				 "mode '%s')", held_count(model), held_mode(model, mode, sizeof(mode)));
		}
		if (again == 3) {
			char *json = NULL;

			/* Rank 0 takes its lease back (a status request), and
			 * wexd restarts again before it releases it. */
			T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
			free(json);
			T_ASSERT(held_count(model) == 0 && journal_count() == 1,
				 "rank 0 took its lease back (%d held, %d records)",
				 held_count(model), journal_count());
			restart();
			T_ASSERT(held_count(model) == 1 &&
				 !strcmp(held_mode(model, mode, sizeof(mode)), "lost-remap-view"),
				 "rank 0's lease taken back outlived a second restart as one of the "
				 "lost round (%d held, mode '%s')", held_count(model),
				 held_mode(model, mode, sizeof(mode)));
		}
		t_prod_open(&p, model, "tiny", 0, 1);
		ret = wex_begin_write(p.c, 2, 200);
		T_ASSERT(ret == -EBUSY, "rank 0's lease of the lost v1 holds the trainer off: %s",
			 wex_strerror(ret));
		T_WEX(k[0].c, wex_release(k[0].c));
		/* (After a reconnect the client knows no producer tensors to
		 * check the views by until it syncs.) */
		T_ASSERT(again || t_view_bad(&k[0], 0, 1) == 0, "rank 0's views still show v1");
	}
	ret = wex_begin_write(p.c, 2, 2000);
	T_ASSERT(ret == 0, "rank 0 released its lease: the trainer writes v2: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	for (uint32_t i = 1; i < 3; i++) {
		ret = wex_sync(k[i].c, WEX_SYNC_COPY, 2, 2000, &r);
		T_ASSERT(ret == -ESTALE, "rank 0 holds v1 of the lost round (its views show it): "
			 "rank %u waits for it to sync again (ESTALE), yet got %s (v%llu)", i,
			 ret ? wex_strerror(ret) : "it", (unsigned long long)r.version);
	}
	take(&k[0], 2);
	take(&k[1], 2);
	take(&k[2], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: a lease of a lost round counted among its holders%s\n", model,
	       again ? " across a restart" : "");
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* Rank 0 views v1 (a remap-view lease, written down as a plain one);
 * restart; rank 1 takes v1 (the round passes rank 0's lease, rank 0 idle
 * and not connected); the trainer exits, the memory behind v1 with it:
 * rank 0's lease from before is one of the lost round, written down so
 * ("lost-remap-view"), and still holds the trainer off.  `again`: wexd
 * restarts before rank 0 calls it; 2: rank 0 calls that wexd (a status
 * request, taking its lease back) before the trainer exits, and wexd
 * restarts after.  Rank 0 releases its lease, the trainer
 * writes v2: rank 1 (which took the lost round here) syncs again, and
 * rank 2 gets ESTALE until rank 0 syncs again, its views showing v1
 * (before, the round's pass of rank 0's lease was not counted among the
 * lost round's holders: rank 2 got v2 while rank 0's views showed v1). */
static void gone_view_passed(int again)
{
	const char *model = again == 2 ? "gone-view-passed-resent" :
			    again ? "gone-view-passed-restart" : "gone-view-passed";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	T_WEX(k[0].c, wex_sync(k[0].c, WEX_SYNC_REMAP_VIEW, 1, 10000, &r));
	T_ASSERT(r.version == 1 && t_view_bad(&k[0], 0, 1) == 0, "rank 0 views v1");
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1 && held_count(model) == 1,
		 "the round on v1 passed rank 0's lease and waits for rank 2");
	if (again == 2) {
		char *json = NULL;

		T_WEX(k[0].c, wex_request(k[0].c, "status", NULL, &json));
		free(json);
		T_ASSERT(held_count(model) == 0, "rank 0 took back its lease (%d held)",
			 held_count(model));
	}
	t_prod_close(&p);
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	if (again)
		restart();
	/* (After a restart, rank 1's take of the lost round is held too.) */
	T_ASSERT(held_count(model) == 1 + !!again && held_modes(model, "lost-remap-view") == 1,
		 "rank 0's lease from before is one of the lost round (%d held, %d of them "
		 "lost-remap-view)", held_count(model), held_modes(model, "lost-remap-view"));
	t_prod_open(&p, model, "tiny", 0, 1);
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "rank 0's lease of the lost v1 holds the trainer off: %s",
		 wex_strerror(ret));
	T_WEX(k[0].c, wex_release(k[0].c));
	ret = wex_begin_write(p.c, 2, 2000);
	T_ASSERT(ret == 0, "rank 0 released its lease: the trainer writes v2: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	take(&k[1], 2);
	ret = wex_sync(k[2].c, WEX_SYNC_COPY, 2, 2000, &r);
	T_ASSERT(ret == -ESTALE, "rank 0 holds v1 of the lost round (its views show it): rank 2 "
		 "waits for it to sync again (ESTALE), yet got %s (v%llu)",
		 ret ? wex_strerror(ret) : "it", (unsigned long long)r.version);
	take(&k[0], 2);
	take(&k[2], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: a passed lease from before counted among the lost round's "
	       "holders%s\n", model, again == 2 ? " (it had called wexd), across a restart" :
	       again ? " across a restart" : "");
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

/* 1 if status shows the lease journal unwritable. */
/* Rank 0's engine (a child process) views v1 (a remap-view lease); the
 * trainer exits, the memory behind v1 with it; `passed`: wexd restarts
 * first and rank 1 takes v1 there (the round passes rank 0's lease, which
 * the loss then marks lost), else wexd restarts after (the lease read
 * back as "lost-remap-view").  The trainer comes back, held off by the
 * lease; rank 0's engine dies: its slot holds nothing of the lost round
 * any more, the trainer writes v2, and ranks 1, 2 and rank 0's next
 * process get it. */
static void gone_view_exit(int passed)
{
	const char *model = passed ? "gone-view-passed-exit" : "gone-view-exit";
	struct t_prod p;
	struct t_cons k[3];
	char mode[32];
	pid_t child;
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 1);
	child = engine0(model, WEX_SYNC_REMAP_VIEW);
	for (uint32_t i = 1; i < 3; i++)
		cons_open(&k[i], model, i);
	if (passed) {
		restart();
		take(&k[1], 1);
	}
	t_prod_close(&p);
	for (double t0 = t_now(); group_round(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	if (!passed)
		restart();
	T_ASSERT(held_count(model) == 1 &&
		 !strcmp(held_mode(model, mode, sizeof(mode)), "lost-remap-view"),
		 "rank 0's lease of the lost round is held (%d held, mode '%s')",
		 held_count(model), held_mode(model, mode, sizeof(mode)));
	t_prod_open(&p, model, "tiny", 0, 1);
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "rank 0's lease of the lost v1 holds the trainer off: %s",
		 wex_strerror(ret));
	engine0_dies(child);
	for (double t0 = t_now(); held_count(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "rank 0's lease outlived its process");
		usleep(20000);
	}
	ret = wex_begin_write(p.c, 2, 2000);
	T_ASSERT(ret == 0, "rank 0's engine died: the trainer writes v2: %s (%s)",
		 wex_strerror(ret), wex_last_error(p.c));
	ex_fill(p.base, p.t, (size_t)p.n, 2, 1);
	T_WEX(p.c, wex_publish(p.c, 2));
	take(&k[1], 2);
	take(&k[2], 2);
	cons_open(&k[0], model, 0);
	take(&k[0], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	printf("round_restarts: %s: a lost lease ended with its engine\n", model);
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
}

static int journal_unwritable(void)
{
	json_t *st = t_status(d.sock);
	int u = json_object_get(json_object_get(json_object_get(st, "daemon"), "lease_journal"),
				"unwritable") != NULL;

	json_decref(st);
	return u;
}

static void journal_wait_unwritable(int want)
{
	for (double t0 = t_now(); journal_unwritable() != want;) {
		T_ASSERT(t_now() - t0 < 30.0, "status never showed the journal %s",
			 want ? "unwritable" : "writable");
		usleep(20000);
	}
}

static int journal_mounted;

/* (A failed check leaves no mount behind: the temp dir goes.) */
static void journal_umount(void)
{
	char cmd[400];

	if (!journal_mounted)
		return;
	journal_mounted = 0;
	snprintf(cmd, sizeof(cmd), "umount '%s.leases' 2>/dev/null", d.sock);
	(void)!system(cmd);
}

/* Runs a mount(8) command on the journal's directory; 0 if it ran. */
static int journal_mount(const char *opts)
{
	char cmd[800];

	snprintf(cmd, sizeof(cmd), "mount %s '%s.leases' '%s.leases' 2>/dev/null", opts, d.sock,
		 d.sock);
	if (system(cmd) != 0)
		return -1;
	if (!journal_mounted)
		atexit(journal_umount);
	journal_mounted = 1;
	return 0;
}

/* Rank 0 takes v1; restart; the journal's filesystem turns read-only
 * (a read-only remount of a bind mount: needs root, else skipped); the
 * trainer exits, the memory behind v1 with it: rank 0's take of the lost
 * round cannot be rewritten as lost; the filesystem is made writable
 * again, and wexd writes then what it could not (status shows it
 * writable); the trainer writes v2; restart: the next wexd gives rank 0's
 * peers ESTALE (before, the record still said "round": the next wexd gave
 * them v2 while rank 0 served v1, and held the trainer's next
 * begin_write off until rank 0's process called it). */
static void gone_readonly(void)
{
	const char *model = "gone-readonly";
	struct wex_sync_result r;
	struct t_prod p;
	struct t_cons k[3];
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	for (uint32_t i = 0; i < 3; i++)
		cons_open(&k[i], model, i);
	t_prod_write(&p, 1);
	take(&k[0], 1);
	t_wexd_kill(&d);
	/* (Mounted before wexd opens it: a remount then reaches its fd.) */
	if (journal_mount("--bind") < 0) {
		t_wexd_restart(&d);
		printf("round_restarts: %s: SKIP (cannot bind-mount the journal: needs root)\n",
		       model);
		for (uint32_t i = 0; i < 3; i++)
			t_cons_close(&k[i]);
		t_prod_close(&p);
		return;
	}
	t_wexd_restart(&d);
	T_ASSERT(journal_mount("-o remount,bind,ro") == 0, "remount the journal read-only");
	journal_wait_unwritable(1);
	for (double t0 = t_now(); producer_pid(model) == 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "the trainer never came back");
		usleep(20000);
	}
	t_prod_close(&p);
	for (double t0 = t_now(); producer_pid(model) != 0;) {
		T_ASSERT(t_now() - t0 < 30.0, "wexd never saw the trainer go");
		usleep(20000);
	}
	T_ASSERT(journal_mount("-o remount,bind,rw") == 0, "remount the journal read-write");
	journal_wait_unwritable(0);
	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 2);
	restart();
	for (uint32_t i = 1; i < 3; i++) {
		ret = wex_sync(k[i].c, WEX_SYNC_COPY, 2, 2000, &r);
		T_ASSERT(ret == -ESTALE, "rank 0 holds v1 of the lost round: rank %u waits for it "
			 "to sync again (ESTALE), yet got %s (v%llu)", i,
			 ret ? wex_strerror(ret) : "it", (unsigned long long)r.version);
	}
	take(&k[0], 2);
	take(&k[1], 2);
	take(&k[2], 2);
	T_ASSERT(group_round(model) == 0 && held_count(model) == 0 && journal_count() == 0,
		 "the group took v2 whole (%d held, %d records)", held_count(model),
		 journal_count());
	T_ASSERT(wex_begin_write(p.c, 3, 2000) == 0, "nothing holds the trainer off v3: %s",
		 wex_last_error(p.c));
	printf("round_restarts: %s: a take lost while the journal was read-only was written down "
	       "as lost once it could be\n", model);
	for (uint32_t i = 0; i < 3; i++)
		t_cons_close(&k[i]);
	t_prod_close(&p);
	t_wexd_kill(&d);
	journal_umount();
	t_wexd_restart(&d);
}

/* `up`: rank 0's engine dies while the wexd that passed its take runs
 * (else while no wexd runs, before the next one starts); `mode`: its sync's
 * (the record written down is its take of the round, or its remap lease). */
static void engine_exits(int up, int mode)
{
	const char *model = !up ? "exit-down" : mode == WEX_SYNC_COPY ? "exit-up" : "exit-up-view";
	struct t_prod p;
	struct t_cons k[3];
	pid_t child;
	int ret;

	t_prod_open(&p, model, "tiny", 0, 1);
	t_prod_write(&p, 1);
	child = engine0(model, mode);
	for (uint32_t r = 1; r < 3; r++)
		cons_open(&k[r], model, r);
	restart();
	take(&k[1], 1);
	T_ASSERT(group_round(model) == 1, "the round on v1 waits for rank 2");
	if (up) {
		engine0_dies(child);
		/* (A condition, not a timed sleep: wexd looks for the exits of
		 * processes holding takes from before it now and then.) */
		for (double t0 = t_now(); held_count(model) != 0;) {
			T_ASSERT(t_now() - t0 < 30.0, "rank 0's take outlived its process");
			usleep(20000);
		}
		T_ASSERT(journal_count() == 1, "only rank 1's take stays written (%d records)",
			 journal_count());
	} else {
		t_wexd_kill(&d);
		engine0_dies(child);
		t_wexd_restart(&d);
	}
	/* Rank 2 takes v1; rank 0's slot holds nothing (its engine died):
	 * the round waits for it, and holds the trainer off. */
	take(&k[2], 1);
	ret = wex_begin_write(p.c, 2, 200);
	T_ASSERT(ret == -EBUSY, "rank 0's engine died: the round on v1 waits for its slot, and "
		 "holds the trainer off: %s", wex_strerror(ret));
	T_ASSERT(group_round(model) == 1, "the round on v1 is open (round v%llu)",
		 (unsigned long long)group_round(model));
	/* Rank 0's next process takes v1 at once. */
	cons_open(&k[0], model, 0);
	take(&k[0], 1);
	group_took_v1(model, &p, k, 3);
	printf("round_restarts: %s: rank 0's engine died %s; its next process took v1\n", model,
	       up ? "while wexd ran" : "while no wexd ran");
	for (uint32_t r = 0; r < 3; r++)
		t_cons_close(&k[r]);
	t_prod_close(&p);
}

/* Runs every case, or the one named by argv[1]. */
int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : NULL;

	t_wexd_start(&d);
	t_check_backend(d.sock);
	if (!only || !strcmp(only, "twice"))
		twice(2, 0);
	if (!only || !strcmp(only, "twice_term"))
		twice(2, 1);
	if (!only || !strcmp(only, "thrice"))
		twice(3, 0);
	if (!only || !strcmp(only, "served_pass"))
		served_pass();
	if (!only || !strcmp(only, "group_empties"))
		group_empties();
	if (!only || !strcmp(only, "resent"))
		resent(0, 0, 0);
	if (!only || !strcmp(only, "resent_restart"))
		resent(1, 0, 0);
	if (!only || !strcmp(only, "resent_fresh"))
		resent(0, 1, 0);
	if (!only || !strcmp(only, "resent_again"))
		resent(0, 0, 1);
	if (!only || !strcmp(only, "gone_held"))
		gone_held(0, 0);
	if (!only || !strcmp(only, "gone_exit"))
		gone_held(1, 0);
	if (!only || !strcmp(only, "gone_resent"))
		gone_held(0, 1);
	if (!only || !strcmp(only, "gone_empty"))
		gone_unpassed(1, 0);
	if (!only || !strcmp(only, "gone_idle"))
		gone_unpassed(0, 0);
	if (!only || !strcmp(only, "gone_restart"))
		gone_unpassed(0, 1);
	if (!only || !strcmp(only, "gone_called_restart"))
		gone_unpassed(0, 2);
	if (!only || !strcmp(only, "lost_here_restart"))
		lost_here_restart();
	if (!only || !strcmp(only, "gone_readonly"))
		gone_readonly();
	if (!only || !strcmp(only, "gone_view"))
		gone_view(0);
	if (!only || !strcmp(only, "gone_view_restart"))
		gone_view(1);
	if (!only || !strcmp(only, "gone_view_down"))
		gone_view(2);
	if (!only || !strcmp(only, "gone_view_claimed"))
		gone_view(3);
	if (!only || !strcmp(only, "gone_view_passed"))
		gone_view_passed(0);
	if (!only || !strcmp(only, "gone_view_passed_restart"))
		gone_view_passed(1);
	if (!only || !strcmp(only, "gone_view_passed_resent"))
		gone_view_passed(2);
	if (!only || !strcmp(only, "gone_view_exit"))
		gone_view_exit(0);
	if (!only || !strcmp(only, "gone_view_passed_exit"))
		gone_view_exit(1);
	if (!only || !strcmp(only, "exit_down"))
		engine_exits(0, WEX_SYNC_COPY);
	if (!only || !strcmp(only, "exit_up"))
		engine_exits(1, WEX_SYNC_COPY);
	if (!only || !strcmp(only, "exit_up_view"))
		engine_exits(1, WEX_SYNC_REMAP_VIEW);
	t_wexd_stop(&d);
	printf("round_restarts: PASS\n");
	t_exit(T_EXIT_PASS);
}
