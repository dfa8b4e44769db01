/* SPDX-License-Identifier: MIT */
/*
 * verify_sync - exactness proved on demand (DESIGN section 4, guarantee
 * 4), through libwex and through `wexctl verify` (argv[1]) against a real
 * wexd, on host memory:
 *  - a copy sync with WEX_SYNC_VERIFY compares every byte and says how
 *    many (res.verified); a byte the engine changed in its own weights
 *    afterwards is found by the next verified sync: -WEX_EVERIFY naming
 *    the tensor and the byte, the weights dirty; the sync after that
 *    copies again and verifies equal;
 *  - a same-address sync with WEX_SYNC_VERIFY compares the layout in the
 *    regions with the producer's memory, and finds a tensor the layout
 *    keeps outside them (-WEX_EVERIFY, regions back on their own memory,
 *    no lease left, dirty until a copy);
 *  - refused: verify on a view sync, on a same-address sync without an
 *    attached layout, unknown mode bits;
 *  - wexctl verify: the rank's next plain sync verifies (exit 0, "equal"),
 *    the one after it does not, and the answer stays the ticket's after
 *    the engine verifies on its own; a sync after the ask stood is not
 *    asked;
 *    a changed byte makes that sync fail with -WEX_EVERIFY and wexctl
 *    exit 3 naming the tensor; a view sync answers "unverifiable" (exit
 *    4); no sync before the timeout is "pending" (exit 4, also with
 *    --no-wait --json); an unknown
 *    model or group is refused (exit 1) naming what exists; status and
 *    metrics show the results;
 *  - an engine whose one rank restarts while an ask stands (wexd frees
 *    its group meanwhile) is asked again: a poll in between reports the
 *    rank absent, the new process's sync verifies, the ticket reports it
 *    done and equal, and wexctl verify exits 0;
 *  - a verification's why longer than wexd keeps, cut inside a UTF-8
 *    sequence, still shows in status (as UTF-8: the cut byte becomes
 *    '?'; JSON takes nothing else, and it was dropped before);
 *  - a rank whose asked sync still compares when wexctl stops waiting
 *    is shown comparing (pending), not "no sync" or expired, and its
 *    late answer counts;
 *  - a rank holding a shard: wexctl names the byte as its piece's;
 *  - a second, short wexctl verify while one waits does not end the
 *    first one's ask sooner;
 *  - a wexctl verify whose wait starts late, while every client of the
 *    model leaves and the ask stops standing, stops waiting for the
 *    absent rank (exit 4, the table), not exit 1 at a poll that finds
 *    the model forgotten;
 *  - a rank that answers an ask and leaves is shown done (its answer and
 *    pid kept, "gone"), with its group and after it, not absent, and
 *    wexctl verify counts its answer; after another process in its slot
 *    synced and left unasked, absent again; a gone group made again
 *    with another world shows that world's answers once gone again;
 *  - a group of a world of 65536 with one rank connected: a poll lists
 *    that rank and counts the absent others (ranks_unlisted), and wexctl
 *    prints a short table and counts them not verified (exit 4).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "fixture.h"

#define MODEL "vfy"

static const char *wexctl;
static struct t_wexd d;

/* Runs wexctl with args (NULL-terminated, after "--socket S") in a child,
 * its output into `out`; returns the child's pid. */
static pid_t wexctl_start(const char *out, const char *const *args)
{
	pid_t pid;

	unlink(out); /* wait_asked reads this run's output, not the last's */
	pid = t_fork();

	if (pid == 0) {
		const char *argv[16] = { "wexctl", "--socket", d.sock };
		int n = 3, fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		while (*args && n < 15)
			argv[n++] = *args++;
		argv[n] = NULL;
		if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		execv(wexctl, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

static char *slurp(const char *path)
{
	static char buf[16384];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

	if (f)
		fclose(f);
	buf[n] = 0;
	return buf;
}

/* Waits (up to 10 s) until wexctl said it asked. */
static void wait_asked(const char *out)
{
	double t0 = t_now();

	while (!strstr(slurp(out), "asked model")) {
		T_ASSERT(t_now() - t0 < 10, "wexctl never said it asked: %s", slurp(out));
		usleep(10000);
	}
}

/* Waits (up to 10 s) until wexd's status lists no group `group` of
 * `model` (NULL: no model `model`): its last rank's (client's) connection
 * dropped. */
static void wait_gone(const char *model, const char *group)
{
	double t0 = t_now();

	for (;;) {
		json_t *st = t_status(d.sock), *m = t_status_model(st, model), *g;
		int there = !group && m;
		size_t i;

		json_array_foreach(json_object_get(m, "groups"), i, g)
			there |= group && !strcmp(json_string_value(json_object_get(g, "name")) ?: "", group);
		json_decref(st);
		if (!there)
			return;
		T_ASSERT(t_now() - t0 < 10, "model '%s' group '%s' never left", model,
			 group ?: "(any)");
		usleep(10000);
	}
}

static int wexctl_run(const char *out, const char *const *args)
{
	return t_wait(wexctl_start(out, args));
}

/* The byte at `off` of consumer tensor i flipped (the engine changing its
 * own weights). */
static void flip(struct t_cons *k, int i, uint64_t off)
{
	((unsigned char *)k->t[i].ptr)[off] ^= 0x40;
}

static uint64_t layout_bytes(const struct t_cons *k)
{
	uint64_t b = 0;

	for (int i = 0; i < k->n; i++)
		b += wex_tensor_nbytes(&k->t[i]);
	return b;
}

/* wex_verifications_total over every result, from wexd's metrics. */
static long verifications(wex_client_t *c)
{
	char *reply = NULL;
	const char *text, *p;
	long n = 0;
	json_t *j;

	T_WEX(c, wex_request(c, "metrics", NULL, &reply));
	j = json_loads(reply, 0, NULL);
	text = json_string_value(json_object_get(j, "text")) ?: "";
	for (p = text; (p = strstr(p, "\nwex_verifications_total{")); p++)
		n += strtol(strchr(p, '}') + 1, NULL, 10);
	json_decref(j);
	wex_free(reply);
	return n;
}

/* wexd's answer to a poll of `ticket` for group g: rank 0's state and
 * result ("" where there is none). */
static void poll_group(wex_client_t *c, const char *model, const char *group, long ticket,
		       char *state, char *result)
{
	char args[128], *reply = NULL;
	json_t *j, *r;

	snprintf(args, sizeof(args), "{\"model\":\"%s\",\"group\":\"%s\",\"ticket\":%ld}",
		 model, group, ticket);
	T_WEX(c, wex_request(c, "verify", args, &reply));
	j = json_loads(reply, 0, NULL);
	r = json_array_get(json_object_get(json_array_get(json_object_get(j, "groups"), 0),
					   "ranks"), 0);
	snprintf(state, 32, "%s", json_string_value(json_object_get(r, "state")) ?: "");
	/* The time since the rank's last sync, named and counted as in the
	 * clients listing (last_sync_s_ago), once it has synced. */
	T_ASSERT(!json_object_get(r, "last_sync_s") &&
		 (!json_integer_value(json_object_get(r, "served")) ||
		  json_real_value(json_object_get(r, "last_sync_s_ago")) >= 0),
		 "verify poll: the time since the last sync is not last_sync_s_ago: %s", reply);
	snprintf(result, 32, "%s",
		 json_string_value(json_object_get(json_object_get(r, "verify"), "result")) ?: "");
	json_decref(j);
	wex_free(reply);
}

static void poll_ticket(wex_client_t *c, long ticket, char *state, char *result)
{
	poll_group(c, MODEL, "g", ticket, state, result);
}

static void library_checks(struct t_cons *k)
{
	struct wex_sync_result r;
	char want[256];
	int ret;

	memset(&r, 0, sizeof(r));
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
	T_ASSERT(r.version == 1 && r.changed && r.bytes == layout_bytes(k) && r.verified == r.bytes,
		 "verified copy: v%llu, %llu bytes copied, %llu verified (layout %llu)",
		 (unsigned long long)r.version, (unsigned long long)r.bytes,
		 (unsigned long long)r.verified, (unsigned long long)layout_bytes(k));
	T_ASSERT(t_own_bad(k, 1) == 0, "the copy holds v1");

	/* A plain sync of what is held verifies nothing (and does not write
	 * the verify fields: a program built before them never asks). */
	{
		long before = verifications(k->c);

		r.verified = 12345;
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(!r.changed && r.verified == 12345 && verifications(k->c) == before,
			 "plain sync: changed %d, verified %llu", r.changed,
			 (unsigned long long)r.verified);
	}

	/* The engine writes one byte of its weights: the next verified sync
	 * (nothing to copy) finds it. */
	flip(k, 3, 5);
	ret = wex_sync(k->c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r);
	T_ASSERT(ret == -WEX_EVERIFY, "changed weights: sync returned %d (%s), not WEX_EVERIFY", ret,
		 wex_last_error(k->c));
	snprintf(want, sizeof(want), "'%s' (piece 3 of this rank, %s) at byte 5 of its buffer",
		 k->t[3].name, wex_dtype_name(k->t[3].dtype));
	T_ASSERT(strstr(wex_last_error(k->c), want) && strstr(wex_last_error(k->c), "1 of "),
		 "the message names the tensor, the byte and the count: %s", wex_last_error(k->c));
	T_ASSERT(wex_is_dirty(k->c) == 1, "a difference leaves the weights dirty");
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "the lease was given back");

	/* Dirty: the next sync copies everything again, then verifies. */
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
	T_ASSERT(r.changed && r.verified == layout_bytes(k) && !wex_is_dirty(k->c) &&
			 t_own_bad(k, 1) == 0,
		 "re-sync: changed %d, verified %llu, dirty %d", r.changed,
		 (unsigned long long)r.verified, wex_is_dirty(k->c));

	/* Same-address: the layout lies in the region, which now shows the
	 * producer's memory; verified through it. */
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 1, 5000, &r));
	T_ASSERT(r.verified == layout_bytes(k) && t_own_bad(k, 1) == 0,
		 "verified same-address sync: %llu bytes", (unsigned long long)r.verified);
	T_WEX(k->c, wex_release(k->c));

	ret = wex_sync(k->c, WEX_SYNC_REMAP_VIEW | WEX_SYNC_VERIFY, 1, 5000, &r);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(k->c), "view sync has no weights"),
		 "verify on a view: %d %s", ret, wex_last_error(k->c));
	ret = wex_sync(k->c, WEX_SYNC_COPY | (1 << 9), 1, 5000, &r);
	T_ASSERT(ret == -EINVAL, "unknown mode bits: %d", ret);
}

/* A same-address sync changes only what lies in its regions: a tensor the
 * layout keeps outside them (a private buffer, still zero) does not hold
 * the version, and a verified sync says so: -WEX_EVERIFY naming it, the
 * regions given their own memory back (no lease is left showing the
 * producer), the weights dirty until a copy sync. */
static void fixed_outside_check(void)
{
	struct t_cons k;
	struct wex_sync_result r;
	void *own;
	int ret;

	t_cons_open_from(&k, MODEL, "fx", "tiny", 0, 1, 0);
	own = calloc(1, wex_tensor_nbytes(&k.t[2]));
	T_ASSERT(own, "calloc");
	k.t[2].ptr = own;
	T_WEX(k.c, wex_attach(k.c, k.t, (size_t)k.n));
	ret = wex_sync(k.c, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 1, 5000, &r);
	T_ASSERT(ret == -WEX_EVERIFY && strstr(wex_last_error(k.c), k.t[2].name) &&
			 wex_is_dirty(k.c) == 1,
		 "same-address sync with a tensor outside the region: %d %s", ret,
		 wex_last_error(k.c));
	T_ASSERT(t_leases(d.sock, MODEL) == 0, "no lease left after the failed verify");
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
	T_ASSERT(r.verified == layout_bytes(&k) && !wex_is_dirty(k.c) && t_own_bad(&k, 1) == 0,
		 "copy after it: %llu verified", (unsigned long long)r.verified);
	t_cons_close(&k);
	free(own);
}

/* A consumer with regions but no attached layout cannot verify a
 * same-address sync. */
static void no_layout_check(void)
{
	wex_client_t *c = t_open(WEX_ROLE_CONSUMER, MODEL, "bare", 0, 1);
	struct wex_sync_result r;
	void *region;
	int ret;

	T_WEX(c, wex_reserve(c, 0, 0, 4096, &region));
	ret = wex_sync(c, WEX_SYNC_REMAP_FIXED | WEX_SYNC_VERIFY, 1, 5000, &r);
	T_ASSERT(ret == -EINVAL && strstr(wex_last_error(c), "wex_attach it first"),
		 "same-address verify without a layout: %d %s", ret, wex_last_error(c));
	wex_client_close(c);
}

/* Sends c's sync report with verification v (taken) on a ping, as libwex
 * sends one with its next request. */
static void send_report(wex_client_t *c, json_t *v)
{
	json_t *rep = json_pack("{s:{s:s, s:I, s:f, s:o}}", "report", "mode", "copy", "bytes",
				(json_int_t)0, "seconds", 0.0, "verify", v);
	char *req, *s = NULL;

	T_ASSERT(rep != NULL, "json_pack of the report");
	req = json_dumps(rep, JSON_COMPACT);
	json_decref(rep);
	T_WEX(c, wex_request(c, "ping", req, &s));
	free(req);
	wex_free(s);
}

static void long_why_check(void)
{
	wex_client_t *c = t_open(WEX_ROLE_CONSUMER, MODEL, "longwhy", 0, 1);
	char why[700], *s = NULL;
	json_t *st, *v = NULL, *g;
	const char *got;
	size_t i;

	/* 300 two-byte characters: wexd keeps 511 bytes, the last the first
	 * byte of a character. */
	for (i = 0; i < 300; i++)
		memcpy(why + 2 * i, "\xc3\xa9", 2);
	why[600] = 0;
	send_report(c, json_pack("{s:I, s:s, s:I, s:s}", "ticket", (json_int_t)0, "result", "failed",
				 "version", (json_int_t)1, "why", why));
	T_WEX(c, wex_request(c, "status", NULL, &s));
	st = json_loads(s, 0, NULL);
	wex_free(s);
	T_ASSERT(st != NULL, "status is JSON");
	json_array_foreach(json_object_get(t_status_model(st, MODEL), "groups"), i, g)
		if (!strcmp(json_string_value(json_object_get(g, "name")) ?: "", "longwhy"))
			v = json_object_get(json_array_get(json_object_get(g, "ranks"), 0), "verify");
	got = json_string_value(json_object_get(v, "why"));
	T_ASSERT(got && strlen(got) == 511 && !strncmp(got, why, 510) && got[510] == '?',
		 "a cut why shows as UTF-8: %zu bytes, ends %s", got ? strlen(got) : 0,
		 got ? got + 500 : "(none)");
	json_decref(st);
	wex_client_close(c);
}

/* A rank's report answers only an ask it was told of: one that names the
 * ticket of an ask standing for its group, before any acquire of the rank
 * carried it (no sync of the rank verified), is its own verification, and
 * the ask stays pending. */
static void forged_answer_check(void)
{
	wex_client_t *f = t_open(WEX_ROLE_CONSUMER, MODEL, "forge", 0, 1);
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	char *reply = NULL, state[32], result[32];
	json_t *j;
	long ticket;

	T_WEX(adm, wex_request(adm, "verify",
			       "{\"model\":\"" MODEL "\",\"group\":\"forge\",\"stand_ms\":20000}",
			       &reply));
	j = json_loads(reply, 0, NULL);
	ticket = (long)json_integer_value(json_object_get(j, "ticket"));
	json_decref(j);
	wex_free(reply);
	T_ASSERT(ticket > 0, "no ticket for the ask");
	send_report(f, json_pack("{s:I, s:s, s:I}", "ticket", (json_int_t)ticket, "result", "equal",
				 "version", (json_int_t)1));
	poll_group(adm, MODEL, "forge", ticket, state, result);
	T_ASSERT(!strcmp(state, "pending"),
		 "a report of ticket %ld no acquire gave the rank answered the ask: %s %s", ticket,
		 state, result);
	wex_client_close(adm);
	wex_client_close(f);
}

/* A rank whose sync was asked is still comparing when wexctl stops
 * waiting (a copy answers with its release, which may come after the ask
 * stood): wexctl says so, not that it did not sync, a poll after the ask
 * stood finds it pending (comparing), not expired, and its answer then
 * makes it done. */
static void comparing_check(void)
{
	wex_client_t *f = t_open(WEX_ROLE_CONSUMER, MODEL, "slow", 0, 1);
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	char out[400], *reply = NULL, state[32], result[32];
	long ticket;
	json_t *j;
	int ret;
	pid_t pid;

	snprintf(out, sizeof(out), "%s/wexctl-slow.out", d.dir);
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--group", "slow",
						      "--timeout", "2", NULL });
	wait_asked(out);
	ticket = strtol(strstr(slurp(out), "(ticket ") + 8, NULL, 10);
	/* The acquire of a copy sync, as libwex sends it: asked. */
	T_WEX(f, wex_request(f, "acquire", "{\"min_version\":1,\"mode\":1}", &reply));
	j = json_loads(reply, 0, NULL);
	T_ASSERT(json_integer_value(json_object_get(j, "verify")) == ticket,
		 "the acquire did not carry ticket %ld: %s", ticket, reply);
	json_decref(j);
	wex_free(reply);
	ret = t_wait(pid);
	T_ASSERT(ret == 4 && strstr(slurp(out), "is comparing") &&
			 !strstr(slurp(out), "no sync since the ask"),
		 "wexctl verify while the asked sync compares: exit %d: %s", ret, slurp(out));
	usleep(200000);
	poll_group(adm, MODEL, "slow", ticket, state, result);
	T_ASSERT(!strcmp(state, "pending"),
		 "ticket %ld, its asked sync comparing after the ask stood: %s", ticket, state);
	send_report(f, json_pack("{s:I, s:s, s:I, s:I}", "ticket", (json_int_t)ticket, "result",
				 "equal", "version", (json_int_t)1, "bytes", (json_int_t)0));
	poll_group(adm, MODEL, "slow", ticket, state, result);
	T_ASSERT(!strcmp(state, "done") && !strcmp(result, "equal"),
		 "ticket %ld answered after the ask stood: %s %s", ticket, state, result);
	T_WEX(f, wex_request(f, "release", "{\"version\":1}", &reply));
	wex_free(reply);
	wex_client_close(adm);
	wex_client_close(f);
}

/* A rank holding a shard (rows from the middle of each tensor): the byte
 * wexctl names is the byte of that rank's piece, and it says so (byte 0
 * here is not the tensor's byte 0). */
static void shard_offset_check(void)
{
	struct wex_sync_result r;
	struct t_cons h[2];
	char out[400], want[256];
	pid_t pid;
	int ret;

	snprintf(out, sizeof(out), "%s/wexctl-half.out", d.dir);
	for (int i = 0; i < 2; i++) {
		t_cons_open_from(&h[i], MODEL, "half", "tiny", (uint32_t)i, 2, 0);
		T_WEX(h[i].c, wex_sync(h[i].c, WEX_SYNC_COPY, 1, 5000, &r));
	}
	T_ASSERT(h[1].t[1].start[0] > 0, "rank 1's piece starts at row %llu",
		 (unsigned long long)h[1].t[1].start[0]);
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--group", "half",
						      "--timeout", "20", NULL });
	wait_asked(out);
	flip(&h[1], 1, 0);
	T_WEX(h[0].c, wex_sync(h[0].c, WEX_SYNC_COPY, 1, 5000, &r));
	ret = wex_sync(h[1].c, WEX_SYNC_COPY, 1, 5000, &r);
	T_ASSERT(ret == -WEX_EVERIFY, "asked sync over a changed shard: %d %s", ret,
		 wex_last_error(h[1].c));
	ret = t_wait(pid);
	snprintf(want, sizeof(want), "the first in '%s' at byte 0 of this rank's piece",
		 h[1].t[1].name);
	T_ASSERT(ret == 3 && strstr(slurp(out), want),
		 "wexctl verify, a shard's byte: exit %d, wants \"%s\": %s", ret, want, slurp(out));
	t_cons_close(&h[0]);
	t_cons_close(&h[1]);
}

/* wexd's answer to a poll of `ticket` for `group`: rank r's "gone" and
 * "pid", and its state and result ("" where there is none). */
static int poll_rank(wex_client_t *c, const char *group, long ticket, int r, char *state,
		     char *result, long *pid)
{
	char args[128], *reply = NULL;
	json_t *j, *o;
	int gone;

	snprintf(args, sizeof(args), "{\"model\":\"%s\",\"group\":\"%s\",\"ticket\":%ld}", MODEL,
		 group, ticket);
	T_WEX(c, wex_request(c, "verify", args, &reply));
	j = json_loads(reply, 0, NULL);
	o = json_array_get(json_object_get(json_array_get(json_object_get(j, "groups"), 0),
					   "ranks"), (size_t)r);
	T_ASSERT(o, "verify poll of group '%s': no rank %d: %s", group, r, reply);
	snprintf(state, 32, "%s", json_string_value(json_object_get(o, "state")) ?: "");
	snprintf(result, 32, "%s",
		 json_string_value(json_object_get(json_object_get(o, "verify"), "result")) ?: "");
	*pid = (long)json_integer_value(json_object_get(o, "pid"));
	gone = json_is_true(json_object_get(o, "gone"));
	json_decref(j);
	wex_free(reply);
	return gone;
}

/*
 * A rank that answers an ask and then leaves (its engine exits; the other
 * rank stays): a poll shows it done, its answer and pid kept, "gone", not
 * absent; wexctl verify, waiting for the other rank, ends at its answer
 * (exit 0), the left rank's line saying its engine answered, then left.
 * The group gone (its other rank leaves too), both answers are kept with
 * the ask, and the group made again takes them back.  Before, an answer went with its connection: the rank showed
 * absent, and wexctl waited for it to its timeout (exit 4).
 */
static void gone_rank_check(void)
{
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	struct wex_sync_result r;
	struct t_cons h[2];
	char out[400], state[32], result[32];
	long ticket, pid;
	double t0;
	int ret;

	snprintf(out, sizeof(out), "%s/wexctl-left.out", d.dir);
	for (int i = 0; i < 2; i++) {
		t_cons_open_from(&h[i], MODEL, "left", "tiny", (uint32_t)i, 2, 0);
		T_WEX(h[i].c, wex_sync(h[i].c, WEX_SYNC_COPY, 1, 5000, &r));
	}
	ret = (int)wexctl_start(out, (const char *const[]){ "verify", MODEL, "--group", "left",
							   "--timeout", "20", NULL });
	wait_asked(out);
	ticket = strtol(strstr(slurp(out), "(ticket ") + 8, NULL, 10);
	T_WEX(h[0].c, wex_sync(h[0].c, WEX_SYNC_COPY, 1, 5000, &r));
	t_cons_close(&h[0]);
	for (t0 = t_now(); !poll_rank(adm, "left", ticket, 0, state, result, &pid);) {
		T_ASSERT(t_now() - t0 < 10, "rank 0 answered and left: after 10 s, state '%s' result '%s'",
			 state, result);
		usleep(10000);
	}
	T_ASSERT(!strcmp(state, "done") && !strcmp(result, "equal") && pid == (long)getpid(),
		 "rank 0 answered and left: state '%s' result '%s' pid %ld", state, result, pid);
	T_WEX(h[1].c, wex_sync(h[1].c, WEX_SYNC_COPY, 1, 5000, &r));
	pid = t_wait((pid_t)ret);
	T_ASSERT(pid == 0 && strstr(slurp(out), "its engine answered, then left") &&
			 strstr(slurp(out), "every rank's weights equal"),
		 "wexctl verify, a rank that answered and left: exit %ld: %s", pid, slurp(out));
	/* The whole group gone: both answers with the ask. */
	t_cons_close(&h[1]);
	wait_gone(MODEL, "left");
	for (int i = 0; i < 2; i++) {
		T_ASSERT(poll_rank(adm, "left", ticket, i, state, result, &pid) &&
				 !strcmp(state, "done") && !strcmp(result, "equal"),
			 "group gone: rank %d is '%s' '%s'", i, state, result);
	}
	/* Made again by rank 1's engine: it takes them back (rank 0's shows
	 * still; rank 1's process is a new one, not asked yet). */
	t_cons_open_from(&h[1], MODEL, "left", "tiny", 1, 2, 0);
	T_ASSERT(poll_rank(adm, "left", ticket, 0, state, result, &pid) && !strcmp(state, "done") &&
			 !strcmp(result, "equal"),
		 "group made again: rank 0 is '%s' '%s'", state, result);
	T_ASSERT(!poll_rank(adm, "left", ticket, 1, state, result, &pid) && strcmp(state, "done"),
		 "group made again: rank 1's new process shows '%s' '%s' as its own", state, result);
	t_cons_close(&h[1]);
	wex_client_close(adm);
}

/* Asks group `group` of MODEL through c, standing stand_ms: the ticket. */
static long ask_group(wex_client_t *c, const char *group, long stand_ms)
{
	char args[160], *reply = NULL;
	json_t *j;
	long ticket;

	snprintf(args, sizeof(args), "{\"model\":\"%s\",\"group\":\"%s\",\"stand_ms\":%ld}",
		 MODEL, group, stand_ms);
	T_WEX(c, wex_request(c, "verify", args, &reply));
	j = json_loads(reply, 0, NULL);
	ticket = (long)json_integer_value(json_object_get(j, "ticket"));
	json_decref(j);
	wex_free(reply);
	return ticket;
}

/*
 * A rank whose engine answered an ask and left, then another process in
 * its slot that synced (after the ask stood: not asked) and left without
 * answering: the first answer no longer speaks for what the rank served,
 * so a poll shows the rank absent, not done with the first process's
 * answer (review h142).  Rank 1 stays connected throughout, so the group
 * and its kept answers stay.
 */
static void replaced_rank_check(void)
{
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	struct wex_sync_result r;
	struct t_cons h[2];
	char state[32], result[32];
	long ticket, pid;
	double t0;

	for (int i = 0; i < 2; i++) {
		t_cons_open_from(&h[i], MODEL, "swap", "tiny", (uint32_t)i, 2, 0);
		T_WEX(h[i].c, wex_sync(h[i].c, WEX_SYNC_COPY, 1, 5000, &r));
	}
	ticket = ask_group(adm, "swap", 500);
	T_WEX(h[0].c, wex_sync(h[0].c, WEX_SYNC_COPY, 1, 5000, &r));
	t_cons_close(&h[0]);
	for (t0 = t_now(); !poll_rank(adm, "swap", ticket, 0, state, result, &pid);) {
		T_ASSERT(t_now() - t0 < 10, "rank 0 answered and left: state '%s'", state);
		usleep(10000);
	}
	usleep(600000); /* the ask no longer stands */
	t_cons_open_from(&h[0], MODEL, "swap", "tiny", 0, 2, 0);
	T_WEX(h[0].c, wex_sync(h[0].c, WEX_SYNC_COPY, 1, 5000, &r));
	t_cons_close(&h[0]);
	for (t0 = t_now(); poll_rank(adm, "swap", ticket, 0, state, result, &pid) ||
			   strcmp(state, "absent");) {
		T_ASSERT(t_now() - t0 < 10,
			 "rank 0's second process synced and left unasked: after 10 s '%s' '%s' pid %ld",
			 state, result, pid);
		usleep(10000);
	}
	t_cons_close(&h[1]);
	wex_client_close(adm);
}

/*
 * A group gone while its ask stands, made again with another world (an
 * engine back with 2 ranks where it had 1): its ranks answer the ask and
 * leave; the gone group's poll shows the new world, both ranks done with
 * their answers.  The ask kept the old world, and the answers, of a
 * world it did not have, were dropped: rank 0 absent, no rank 1
 * (review h142).
 */
static void rewidened_check(void)
{
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	struct wex_sync_result r;
	struct t_cons h[2];
	char state[32], result[32];
	long ticket, pid;

	t_cons_open_from(&h[0], MODEL, "wid", "tiny", 0, 1, 0);
	ticket = ask_group(adm, "wid", 30000);
	t_cons_close(&h[0]);
	wait_gone(MODEL, "wid");
	for (int i = 0; i < 2; i++) {
		t_cons_open_from(&h[i], MODEL, "wid", "tiny", (uint32_t)i, 2, 0);
		T_WEX(h[i].c, wex_sync(h[i].c, WEX_SYNC_COPY, 1, 5000, &r));
	}
	for (int i = 0; i < 2; i++)
		t_cons_close(&h[i]);
	wait_gone(MODEL, "wid");
	for (int i = 0; i < 2; i++)
		T_ASSERT(poll_rank(adm, "wid", ticket, i, state, result, &pid) &&
				 !strcmp(state, "done") && !strcmp(result, "equal"),
			 "group of 2 ranks where the ask had 1, gone: rank %d is '%s' '%s'", i, state,
			 result);
	wex_client_close(adm);
}

/* A two-rank group whose rank 1 never connected: once the ask stops
 * standing, rank 0 (connected, no sync) shows expired, and rank 1 shows
 * absent, "no engine connected as this rank", not expired with "no sync
 * while the ask stood (serves v0)" as if an engine were there. */
static void absent_rank_check(void)
{
	struct t_cons h;
	char out[400];
	const char *line;
	int ret;

	snprintf(out, sizeof(out), "%s/wexctl-lone.out", d.dir);
	t_cons_open_from(&h, MODEL, "lone", "tiny", 0, 2, 0);
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--group", "lone",
						    "--timeout", "0.3", NULL });
	line = strstr(slurp(out), "\nlone             1 ");
	T_ASSERT(ret == 4 && strstr(slurp(out), "\nlone             0 ") &&
			 strstr(strstr(slurp(out), "\nlone             0 "), "expired") && line &&
			 strstr(line, "absent") && strstr(line, "no engine connected as this rank"),
		 "a rank never connected, after the ask stood: exit %d: %s", ret, slurp(out));
	t_cons_close(&h);
}

/* A group of a wide world (any local client may say hello as rank 0 of
 * 65536): a poll lists the ranks with an engine and counts the absent
 * others (ranks_unlisted), as status does, so that each poll of a waiting
 * wexctl verify does not hold wexd's loop building 65536 ranks' lines;
 * wexctl still counts them as not verified (exit 4) and says how many. */
static void wide_world_check(void)
{
	wex_client_t *h = t_open(WEX_ROLE_CONSUMER, MODEL, "wide", 0, 65536), *adm;
	char out[400], *reply = NULL;
	const char *text;
	json_t *j, *g;
	struct stat sb;
	int ret;

	snprintf(out, sizeof(out), "%s/wexctl-wide.out", d.dir);
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--group", "wide",
						    "--timeout", "0.3", NULL });
	T_ASSERT(stat(out, &sb) == 0, "wexctl verify's output: %s", strerror(errno));
	text = slurp(out);
	T_ASSERT(ret == 4 && sb.st_size < 4096 && strstr(text, "\nwide             0 ") &&
			 strstr(text, "65535 rank(s) of group 'wide' absent") &&
			 strstr(text, "0 rank(s) equal; 65536 not verified"),
		 "wexctl verify of a world of 65536 with one rank connected: exit %d, %lld bytes: %.2000s",
		 ret, (long long)sb.st_size, text);
	adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 0);
	T_WEX(adm, wex_request(adm, "verify", "{\"model\":\"" MODEL "\",\"group\":\"wide\"}", &reply));
	j = json_loads(reply, 0, NULL);
	g = json_array_get(json_object_get(j, "groups"), 0);
	T_ASSERT(json_array_size(json_object_get(g, "ranks")) == 1 &&
			 json_integer_value(json_object_get(g, "ranks_unlisted")) == 65535,
		 "verify poll of a world of 65536: %zu ranks listed, %lld unlisted",
		 json_array_size(json_object_get(g, "ranks")),
		 (long long)json_integer_value(json_object_get(g, "ranks_unlisted")));
	json_decref(j);
	wex_free(reply);
	wex_client_close(adm);
	wex_client_close(h);
}

static void wexctl_checks(struct t_cons *k)
{
	char out[400];
	struct wex_sync_result r;
	json_t *st, *ranks, *v;
	pid_t pid;
	int ret;

	snprintf(out, sizeof(out), "%s/wexctl.out", d.dir);

	/* Refusals name what exists. */
	ret = wexctl_run(out, (const char *const[]){ "verify", "nosuch", NULL });
	T_ASSERT(ret == 1 && strstr(slurp(out), "no model 'nosuch'"), "unknown model: exit %d: %s",
		 ret, slurp(out));
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--group", "nope", NULL });
	T_ASSERT(ret == 1 && strstr(slurp(out), "no consumer group 'nope' (groups: ") &&
			 strstr(slurp(out), "g"),
		 "unknown group: exit %d: %s", ret, slurp(out));
	ret = wexctl_run(out, (const char *const[]){ "verify", NULL });
	T_ASSERT(ret == 2, "no model named: exit %d: %s", ret, slurp(out));
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--timeout", "x", NULL });
	T_ASSERT(ret == 2 && strstr(slurp(out), "bad --timeout"), "bad timeout: exit %d: %s", ret,
		 slurp(out));

	/* No sync within the timeout: pending or expired, exit 4; a sync
	 * after the ask stood is not asked. */
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--group", "g", "--timeout",
						    "0.3", NULL });
	T_ASSERT(ret == 4 && (strstr(slurp(out), "pending") || strstr(slurp(out), "expired")) &&
			 strstr(slurp(out), "not verified"),
		 "no sync in time: exit %d: %s", ret, slurp(out));
	/* Nothing verified: VERSION "-", not 0 beside "serves v1". */
	T_ASSERT(strstr(slurp(out), "pending   - ") || strstr(slurp(out), "expired   - "),
		 "no sync in time: a version shown for a rank that verified none: %s", slurp(out));
	{
		long before = verifications(k->c);

		usleep(100000);
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(verifications(k->c) == before, "a sync after the ask expired verified");
	}

	/* --no-wait --json: the ask and where each rank stands, at once. */
	ret = wexctl_run(out, (const char *const[]){ "verify", MODEL, "--no-wait", "--json", NULL });
	T_ASSERT(ret == 4 && strstr(slurp(out), "\"ticket\"") && strstr(slurp(out), "\"pending\""),
		 "--no-wait --json: exit %d: %s", ret, slurp(out));

	/* The rank's next plain sync verifies (the ask above is still open:
	 * a new one is made anyway). */
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--group", "g",
						      "--timeout", "20", NULL });
	wait_asked(out);
	{
		long before = verifications(k->c), ticket;
		char state[32], result[32];

		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(verifications(k->c) == before + 1, "the asked sync did not verify");
		ret = t_wait(pid);
		T_ASSERT(ret == 0 && strstr(slurp(out), " equal ") &&
				 strstr(slurp(out), "every rank's weights equal the trainer's"),
			 "wexctl verify, equal: exit %d: %s", ret, slurp(out));
		ticket = strtol(strstr(slurp(out), "(ticket ") + 8, NULL, 10);
		/* Answered: the next sync is not asked again. */
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(verifications(k->c) == before + 1, "a second sync verified again");
		/* The engine's own verification later does not take the place
		 * of its answer to the ask. */
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY | WEX_SYNC_VERIFY, 1, 5000, &r));
		poll_ticket(k->c, ticket, state, result);
		T_ASSERT(!strcmp(state, "done") && !strcmp(result, "equal"),
			 "ticket %ld after the engine's own verification: %s %s", ticket, state,
			 result);
	}

	/* Two operators at once: a quick look (--timeout 0.2) while a
	 * verify waits does not cut that one's ask short: the rank's sync
	 * after the look ended is still asked, the first wexctl exits 0. */
	{
		char out2[400];

		snprintf(out2, sizeof(out2), "%s/wexctl2.out", d.dir);
		pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--timeout", "20",
							      NULL });
		wait_asked(out);
		ret = wexctl_run(out2, (const char *const[]){ "verify", MODEL, "--timeout", "0.2",
							     NULL });
		T_ASSERT(ret == 4, "a second, short verify: exit %d: %s", ret, slurp(out2));
		usleep(300000);
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		ret = t_wait(pid);
		T_ASSERT(ret == 0 && strstr(slurp(out), " equal "),
			 "a short verify meanwhile cut the first one's ask short: exit %d: %s", ret,
			 slurp(out));
	}

	/* A changed byte: the asked sync fails, wexctl names it, exit 3. */
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--timeout", "20", NULL });
	wait_asked(out);
	flip(k, 1, 2);
	ret = wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r);
	T_ASSERT(ret == -WEX_EVERIFY && wex_is_dirty(k->c), "asked sync over changed weights: %d %s",
		 ret, wex_last_error(k->c));
	ret = t_wait(pid);
	T_ASSERT(ret == 3 && strstr(slurp(out), " differ ") && strstr(slurp(out), k->t[1].name) &&
			 strstr(slurp(out), "1 bytes differ; the first in"),
		 "wexctl verify, differ: exit %d: %s", ret, slurp(out));
	st = t_status(d.sock);
	{
		json_t *g;
		size_t i;

		ranks = NULL;
		json_array_foreach(json_object_get(t_status_model(st, MODEL), "groups"), i, g)
			if (!strcmp(json_string_value(json_object_get(g, "name")) ?: "", "g"))
				ranks = json_object_get(g, "ranks");
	}
	v = json_object_get(json_array_get(ranks, 0), "verify");
	T_ASSERT(v && !strcmp(json_string_value(json_object_get(v, "result")) ?: "", "differ") &&
			 !strcmp(json_string_value(json_object_get(v, "tensor")) ?: "", k->t[1].name),
		 "status shows the rank's last verification");
	json_decref(st);
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(!wex_is_dirty(k->c) && t_own_bad(k, 1) == 0, "re-synced after the difference");

	/* A view sync cannot verify: it says so, exit 4. */
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--timeout", "20", NULL });
	wait_asked(out);
	T_WEX(k->c, wex_sync(k->c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
	ret = t_wait(pid);
	T_ASSERT(ret == 4 && strstr(slurp(out), "unverifiable") && strstr(slurp(out), "view sync"),
		 "wexctl verify over a view sync: exit %d: %s", ret, slurp(out));
	T_WEX(k->c, wex_release(k->c));

	/* The engine restarts while an ask stands (its one rank leaves, so
	 * wexd frees the group, and comes back): the new process is asked,
	 * its sync verifies, and the ticket reports it (wexctl exit 0); in
	 * between, a poll reports the rank absent. */
	pid = wexctl_start(out, (const char *const[]){ "verify", MODEL, "--group", "g",
						      "--timeout", "20", NULL });
	wait_asked(out);
	{
		wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 1);
		long before = verifications(adm), ticket;
		char state[32], result[32];

		ticket = strtol(strstr(slurp(out), "(ticket ") + 8, NULL, 10);
		t_cons_close(k);
		wait_gone(MODEL, "g");
		poll_ticket(adm, ticket, state, result);
		T_ASSERT(!strcmp(state, "absent"), "ticket %ld while the engine restarts: %s",
			 ticket, state);
		t_cons_open(k, MODEL, "g", "tiny", 0, 1);
		T_WEX(k->c, wex_sync(k->c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(verifications(adm) == before + 1,
			 "the restarted engine's sync did not verify");
		poll_ticket(adm, ticket, state, result);
		T_ASSERT(!strcmp(state, "done") && !strcmp(result, "equal"),
			 "ticket %ld after the restarted engine's sync: %s %s", ticket, state, result);
		ret = t_wait(pid);
		T_ASSERT(ret == 0 && strstr(slurp(out), " equal "),
			 "wexctl verify across a restart: exit %d: %s", ret, slurp(out));
		wex_client_close(adm);
	}

	/* Every client of a model restarts while an ask stands (trainer and
	 * engine: wexd frees the model): the ask survives with wexd, a poll
	 * meanwhile reports the rank absent, and the engine's first sync
	 * once both are back verifies (wexctl exit 0). */
	{
		wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 1);
		struct t_prod p2;
		struct t_cons k2;
		char state[32], result[32];
		long before, ticket;

		t_prod_open(&p2, MODEL "2", "tiny", 0, 1);
		t_cons_open(&k2, MODEL "2", "g", "tiny", 0, 1);
		t_prod_write(&p2, 1);
		pid = wexctl_start(out, (const char *const[]){ "verify", MODEL "2", "--timeout",
							      "20", NULL });
		wait_asked(out);
		ticket = strtol(strstr(slurp(out), "(ticket ") + 8, NULL, 10);
		t_cons_close(&k2);
		t_prod_close(&p2);
		wait_gone(MODEL "2", NULL);
		poll_group(adm, MODEL "2", "g", ticket, state, result);
		T_ASSERT(!strcmp(state, "absent"), "ticket %ld while every client restarts: '%s'",
			 ticket, state);
		t_prod_open(&p2, MODEL "2", "tiny", 0, 1);
		t_prod_write(&p2, 1);
		t_cons_open(&k2, MODEL "2", "g", "tiny", 0, 1);
		before = verifications(adm);
		T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_COPY, 1, 5000, &r));
		T_ASSERT(verifications(adm) == before + 1,
			 "the first sync after the model came back did not verify");
		ret = t_wait(pid);
		T_ASSERT(ret == 0 && strstr(slurp(out), " equal "),
			 "wexctl verify across a restart of the model's clients: exit %d: %s", ret,
			 slurp(out));
		t_cons_close(&k2);
		t_prod_close(&p2);
		wex_client_close(adm);
	}

	/* Metrics count each result (differ: the library's, the
	 * same-address sync's, the shard's and wexctl's above). */
	{
		char *reply = NULL;
		json_t *j;
		const char *text;

		T_WEX(k->c, wex_request(k->c, "metrics", NULL, &reply));
		j = json_loads(reply, 0, NULL);
		text = json_string_value(json_object_get(j, "text")) ?: "";
		T_ASSERT(strstr(text, "wex_verifications_total{result=\"equal\"}") &&
				 strstr(text, "wex_verifications_total{result=\"differ\"} 4\n") &&
				 strstr(text, "wex_verifications_total{result=\"unverifiable\"} 1\n"),
			 "metrics: %.400s", strstr(text, "wex_verif") ? strstr(text, "wex_verif") : text);
		json_decref(j);
		wex_free(reply);
	}
}

/* wexctl verify whose own wait starts late (its output a pipe not read
 * yet: the line saying it asked blocks it), while every client of the
 * model leaves and the ask stops standing: its first poll shows the rank
 * absent and the ask no longer standing (wexd then forgets the gone
 * model's ask), and it stops waiting there: the table, exit 4.  It went
 * on waiting for the absent rank (absent counts as not answered yet),
 * and its next poll found no model: exit 1, no table. */
static void orphan_expiry_check(void)
{
	wex_client_t *adm = t_open(WEX_ROLE_ADMIN, NULL, NULL, 0, 1);
	static char got[200000];
	char err[400], args[128], *reply = NULL;
	size_t have = 0;
	struct t_prod p3;
	struct t_cons k3;
	int fds[2], ret;
	long ticket;
	double t0;
	ssize_t n;
	json_t *j;
	pid_t pid;

	snprintf(err, sizeof(err), "%s/wexctl-orphan.err", d.dir);
	t_prod_open(&p3, MODEL "3", "tiny", 0, 1);
	t_cons_open(&k3, MODEL "3", "g", "tiny", 0, 1);
	t_prod_write(&p3, 1);
	/* wexctl's ticket: the one after an ask of this test's own. */
	T_WEX(adm, wex_request(adm, "verify", "{\"model\":\"" MODEL "3\",\"stand_ms\":1}", &reply));
	j = json_loads(reply, 0, NULL);
	ticket = (long)json_integer_value(json_object_get(j, "ticket")) + 1;
	json_decref(j);
	wex_free(reply);
	/* A pipe filled up: wexctl's first line blocks until it is read. */
	T_ASSERT(pipe(fds) == 0, "pipe: %s", strerror(errno));
	fcntl(fds[1], F_SETFL, O_NONBLOCK);
	while (write(fds[1], got, 4096) > 0)
		;
	fcntl(fds[1], F_SETFL, 0);
	pid = t_fork();
	if (pid == 0) {
		int fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd < 0 || dup2(fds[1], 1) < 0 || dup2(fd, 2) < 0)
			_exit(126);
		close(fds[0]);
		execl(wexctl, "wexctl", "--socket", d.sock, "verify", MODEL "3", "--timeout", "1",
		      (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	snprintf(args, sizeof(args), "{\"model\":\"" MODEL "3\",\"ticket\":%ld}", ticket);
	for (t0 = t_now(); wex_request(adm, "verify", args, &reply) < 0; usleep(10000))
		T_ASSERT(t_now() - t0 < 10, "wexctl never asked: %s", wex_last_error(adm));
	wex_free(reply);
	t0 = t_now();
	t_cons_close(&k3);
	t_prod_close(&p3);
	wait_gone(MODEL "3", NULL);
	while (t_now() - t0 < 1.3) /* the ask stood 1 s */
		usleep(10000);
	while ((n = read(fds[0], got + have, sizeof(got) - 1 - have)) > 0)
		have += (size_t)n;
	close(fds[0]);
	got[have] = 0;
	ret = t_wait(pid);
	{
		const char *text = got; /* (past the filler's zeros) */

		while (text < got + have && !*text)
			text++;
		T_ASSERT(ret == 4 && strstr(text, " absent ") &&
				 strstr(text, "no engine connected as this rank"),
			 "wexctl verify of a model gone while it waited: exit %d: %s%s", ret, text,
			 slurp(err));
	}
	wex_client_close(adm);
}

int main(int argc, char **argv)
{
	struct t_prod p;
	struct t_cons k;

	if (argc < 2)
		T_FAIL("usage: verify_sync WEXCTL");
	wexctl = argv[1];
	t_tiny_v1(&d, &p, &k, MODEL);
	library_checks(&k);
	fixed_outside_check();
	no_layout_check();
	long_why_check();
	forged_answer_check();
	comparing_check();
	shard_offset_check();
	absent_rank_check();
	gone_rank_check();
	replaced_rank_check();
	rewidened_check();
	wide_world_check();
	orphan_expiry_check();
	wexctl_checks(&k);
	t_cons_close(&k);
	t_prod_close(&p);
	t_wexd_stop(&d);
	return T_EXIT_PASS;
}
