/* SPDX-License-Identifier: MIT */
/*
 * wexd_verify.c - `wexctl verify` in the daemon (DESIGN section 4,
 * guarantee 4: exactness proved on demand).
 *
 * wexd never touches weight bytes, so it cannot compare them itself.  An
 * operator's ask marks the model's consumer groups with a ticket; each
 * rank's next acquire carries the ticket, and the rank's libwex compares
 * what its sync made visible with the producer's memory before its lease
 * ends, then reports the outcome with its next request (a copy's release,
 * at once for a remap).  The operator polls the ticket.  An ask stands
 * for a time the operator gives (its wait): ranks that sync after it are
 * not asked, so an engine restarted days later does not verify for an
 * ask nobody waits on.  A group goes when its last rank leaves, so the ask
 * is also kept on the model, by group name, while it stands: an engine
 * whose ranks all restart within it makes the group again, asked, and a
 * poll meanwhile reports its ranks absent.  A rank whose process answered
 * an ask and then left is reported done, with that answer and pid (its
 * answer kept on the group, and with the ask while the group is gone),
 * not absent.  A model goes with its last
 * client, so its standing asks then wait with wexd (verify_orphans) for
 * a client to make it again.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "proto.h"
#include "wexd.h"

static const char *const results[] = { "equal", "differ", "unverifiable", "failed" };

static struct model *find_model(struct wexd *d, const char *name)
{
	for (struct model *m = d->models; m; m = m->next)
		if (!strcmp(m->name, name))
			return m;
	return NULL;
}

static void kept_free(struct verify_kept **k, uint32_t world)
{
	if (!k)
		return;
	for (uint32_t i = 0; i < world; i++)
		free(k[i]);
	free(k);
}

/* Frees the asks of a list that no longer stand. */
static void prune_list(struct verify_stand **sp)
{
	uint64_t now = wex__now_ns();

	while (*sp) {
		struct verify_stand *s = *sp;

		if (now < s->until_ns) {
			sp = &s->next;
			continue;
		}
		*sp = s->next;
		kept_free(s->kept, s->world);
		free(s);
	}
}

static void stands_prune(struct model *m)
{
	prune_list(&m->verify_stands);
}

static struct verify_stand *stand_find(struct model *m, const char *group)
{
	for (struct verify_stand *s = m->verify_stands; s; s = s->next)
		if (!strcmp(s->group, group))
			return s;
	return NULL;
}

static struct cgroup *group_find(struct model *m, const char *name)
{
	for (struct cgroup *g = m->groups; g; g = g->next)
		if (!strcmp(g->name, name))
			return g;
	return NULL;
}

void wexd_verify_group_made(struct model *m, struct cgroup *g)
{
	struct verify_stand *s;

	stands_prune(m);
	s = stand_find(m, g->name);
	if (!s)
		return;
	g->verify_ticket = s->ticket;
	g->verify_asked_ns = s->asked_ns;
	g->verify_until_ns = s->until_ns;
	/* (Answers of another world's ranks mean nothing to this one.) */
	if (s->kept && s->world == g->world)
		g->verify_kept = s->kept;
	else
		kept_free(s->kept, s->world);
	s->kept = NULL;
	s->world = g->world;
}

void wexd_verify_left(struct cgroup *g, const struct conn *c)
{
	struct verify_kept *k;

	if (c->rank >= g->world)
		return;
	if (!c->verify_done) {
		/* A process that synced since an earlier one answered, and
		 * answered nothing itself: that answer no longer speaks for
		 * what the rank served (a poll shows the rank absent). */
		if (c->syncs && g->verify_kept && g->verify_kept[c->rank]) {
			free(g->verify_kept[c->rank]);
			g->verify_kept[c->rank] = NULL;
		}
		return;
	}
	if (!g->verify_kept && !(g->verify_kept = calloc(g->world, sizeof(*g->verify_kept)))) {
		wex_warn("verify", "out of memory: group '%s' rank %u's answer (ticket %llu) not kept after it left",
			 g->name, c->rank, (unsigned long long)c->verify_done);
		return;
	}
	k = g->verify_kept[c->rank];
	/* An answer to a later ask of an earlier process stays. */
	if (k && k->rec.ticket > c->verify_done)
		return;
	if (!k && !(k = malloc(sizeof(*k)))) {
		wex_warn("verify", "out of memory: group '%s' rank %u's answer (ticket %llu) not kept after it left",
			 g->name, c->rank, (unsigned long long)c->verify_done);
		return;
	}
	k->rec = c->answered;
	k->pid = c->pid;
	k->served = c->served_version;
	g->verify_kept[c->rank] = k;
}

void wexd_verify_group_gone(struct model *m, struct cgroup *g)
{
	struct verify_stand *s = stand_find(m, g->name);

	if (s && !s->kept && s->world == g->world)
		s->kept = g->verify_kept;
	else
		kept_free(g->verify_kept, g->world);
	g->verify_kept = NULL;
}

void wexd_verify_kept_free(struct cgroup *g)
{
	kept_free(g->verify_kept, g->world);
	g->verify_kept = NULL;
}

void wexd_verify_forget(struct wexd *d, struct model *m)
{
	stands_prune(m);
	prune_list(&d->verify_orphans);
	while (m->verify_stands) {
		struct verify_stand *s = m->verify_stands;

		m->verify_stands = s->next;
		memcpy(s->model, m->name, sizeof(s->model));
		s->next = d->verify_orphans;
		d->verify_orphans = s;
	}
}

void wexd_verify_model_made(struct wexd *d, struct model *m)
{
	struct verify_stand **sp = &d->verify_orphans;

	prune_list(sp);
	while (*sp) {
		struct verify_stand *s = *sp;

		if (strcmp(s->model, m->name)) {
			sp = &s->next;
			continue;
		}
		*sp = s->next;
		s->next = m->verify_stands;
		m->verify_stands = s;
	}
}

void wexd_verify_free(struct wexd *d)
{
	while (d->verify_orphans) {
		struct verify_stand *s = d->verify_orphans;

		d->verify_orphans = s->next;
		kept_free(s->kept, s->world);
		free(s);
	}
}

void wexd_verify_ask(struct conn *c, json_t *reply)
{
	struct cgroup *g = c->group;

	if (g && g->verify_ticket > c->verify_done && wex__now_ns() < g->verify_until_ns) {
		json_object_set_new(reply, "verify", json_integer((json_int_t)g->verify_ticket));
		c->verify_asked = g->verify_ticket;
		c->verify_asked_sync = c->syncs;
	}
}

/* A client's string, kept for status and the log: control characters
 * become '?', so that a name cannot forge log lines, and so does what is
 * not UTF-8 (a cut inside a sequence too: JSON takes UTF-8 only). */
static void copy_str(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src ? src : "");
	wex__text_scrub(dst);
}

void wexd_verify_take(struct conn *c, const char *mode, json_t *v)
{
	struct verify_rec r = { 0 };
	const char *result = NULL, *tensor = NULL, *why = NULL;
	json_int_t ticket = 0, version = 0, bytes = 0, differ = 0, offset = 0;
	double secs = 0;
	size_t i;

	if (!v || json_unpack(v, "{s:I, s:s, s:I, s?I, s?F, s?I, s?s, s?I, s?s}", "ticket",
			      &ticket, "result", &result, "version", &version, "bytes", &bytes,
			      "seconds", &secs, "differ_bytes", &differ, "tensor", &tensor,
			      "offset", &offset, "why", &why) < 0)
		return;
	for (i = 0; i < sizeof(results) / sizeof(results[0]); i++)
		if (!strcmp(result, results[i]))
			break;
	/* An unknown result or negative figures: dropped. */
	if (i == sizeof(results) / sizeof(results[0]) || ticket < 0 || version < 0 || bytes < 0 ||
	    differ < 0 || offset < 0 || !(secs >= 0 && secs <= 86400))
		return;
	/* An answer only to an ask this connection was told of: a ticket of
	 * another group's ask, or one an earlier wexd gave, would mark an
	 * ask answered that no sync of this rank verified. */
	if ((uint64_t)ticket > c->verify_asked) {
		wex_warn("verify", "model '%s' group '%s' rank %u (pid %d): reported ticket %lld, which it was never given (the last it was given: %llu); taken as its own verification",
			 c->model ? c->model->name : "?", c->group ? c->group->name : "?", c->rank,
			 (int)c->pid, (long long)ticket, (unsigned long long)c->verify_asked);
		ticket = 0;
	}
	r.ticket = (uint64_t)ticket;
	r.version = (uint64_t)version;
	r.bytes = (uint64_t)bytes;
	r.differ_bytes = (uint64_t)differ;
	r.offset = (uint64_t)offset;
	r.seconds = secs;
	r.at_ns = wex__now_ns();
	copy_str(r.result, sizeof(r.result), result);
	copy_str(r.mode, sizeof(r.mode), mode);
	copy_str(r.tensor, sizeof(r.tensor), tensor);
	copy_str(r.why, sizeof(r.why), why);
	c->verify = r;
	/* The answer to an ask is kept apart: a verification the engine
	 * asked for itself later does not take its place. */
	if (r.ticket && r.ticket >= c->verify_done) {
		c->verify_done = r.ticket;
		c->answered = r;
	}
	wex__metrics_count(WEX_M_VERIFIES, r.result, NULL, 1);
	if (!strcmp(r.result, "differ"))
		wex_warn("verify", "model '%s' group '%s' rank %u (pid %d): v%llu differs from the producer's: %llu bytes, the first in '%s' at byte %llu of this rank's piece",
			 c->model ? c->model->name : "?", c->group ? c->group->name : "?", c->rank,
			 (int)c->pid, (unsigned long long)r.version,
			 (unsigned long long)r.differ_bytes, r.tensor, (unsigned long long)r.offset);
	else
		wex_info("verify", "model '%s' group '%s' rank %u (pid %d): v%llu %s (%s, %llu bytes)%s%s",
			 c->model ? c->model->name : "?", c->group ? c->group->name : "?", c->rank,
			 (int)c->pid, (unsigned long long)r.version, r.result, r.mode,
			 (unsigned long long)r.bytes, *r.why ? ": " : "", r.why);
}

static json_t *rec_json(const struct verify_rec *r)
{
	json_t *o;

	if (!r->at_ns)
		return json_null();
	o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:f}", "result", r->result, "mode", r->mode,
		      "ticket", (json_int_t)r->ticket, "version", (json_int_t)r->version, "bytes",
		      (json_int_t)r->bytes, "seconds", r->seconds, "age_s",
		      (double)(wex__now_ns() - r->at_ns) / 1e9);
	if (!strcmp(r->result, "differ")) {
		json_object_set_new(o, "differ_bytes", json_integer((json_int_t)r->differ_bytes));
		json_object_set_new(o, "tensor", json_string(r->tensor));
		json_object_set_new(o, "offset", json_integer((json_int_t)r->offset));
	}
	if (*r->why)
		json_object_set_new(o, "why", json_string(r->why));
	return o;
}

json_t *wexd_verify_json(const struct conn *c)
{
	return rec_json(&c->verify);
}

/* The names of m's consumer groups, for an error message. */
static void group_names(const struct model *m, char *out, size_t len)
{
	size_t at = 0;

	out[0] = 0;
	for (const struct cgroup *g = m->groups; g && at + 1 < len; g = g->next) {
		int n = snprintf(out + at, len - at, "%s%s", at ? ", " : "", g->name);

		if (n < 0)
			break;
		at += (size_t)n;
	}
}

/*
 * A world over this many ranks lists only the ranks with an engine and
 * counts the others (ranks_unlisted, all in one state: absent, or
 * not-asked), as status does (registry.c WEX_STATUS_WORLD_ALL): any local
 * client may say hello as rank 0 of 65536, and every poll of a waiting
 * wexctl verify (ten a second) then built 65536 ranks' lines, 8 MB, in
 * wexd's loop, holding every other client up.
 */
#define VERIFY_WORLD_ALL 1024u

/* Where every rank of g stands on `ticket`. */
static json_t *group_state(const struct cgroup *g, uint64_t ticket)
{
	json_t *ranks = json_array(), *o;
	uint64_t now = wex__now_ns(), unlisted = 0;

	for (uint32_t i = 0; i < g->world; i++) {
		const struct conn *c = g->ranks ? g->ranks[i] : NULL;
		/* No process there now, but the last one there answered an ask. */
		const struct verify_kept *kp = !c && g->verify_kept ? g->verify_kept[i] : NULL;
		/* Its sync was asked and still holds the lease it was asked
		 * with: comparing (a copy answers with its release, which may
		 * come after the ask stood; it answers all the same). */
		int comparing = c && c->verify_asked >= ticket && c->verify_done < ticket &&
				c->has_lease && c->syncs == c->verify_asked_sync;
		const char *state;

		if (kp && kp->rec.ticket < ticket)
			kp = NULL;
		if (!c && !kp && g->world > VERIFY_WORLD_ALL) {
			unlisted++;
			continue;
		}
		if (g->verify_ticket < ticket)
			state = "not-asked";
		else if ((c && c->verify_done >= ticket) || kp)
			state = "done";
		else if (!c)
			state = "absent"; /* no engine there, the ask standing or not */
		else if (now >= g->verify_until_ns && !comparing)
			state = "expired"; /* no sync answered it in time */
		else
			state = "pending";
		o = json_pack("{s:i, s:i, s:s, s:I}", "rank", (int)i,
			      "pid", c ? (int)c->pid : kp ? (int)kp->pid : 0, "state", state,
			      "served", (json_int_t)(c ? c->served_version : kp ? kp->served : 0));
		if (c && c->last_sync_ns)
			json_object_set_new(o, "last_sync_s_ago",
					    json_real((double)(now - c->last_sync_ns) / 1e9));
		if (c && !strcmp(state, "done"))
			json_object_set_new(o, "verify", rec_json(&c->answered));
		if (kp) {
			/* (Answered, then its process left.) */
			json_object_set_new(o, "verify", rec_json(&kp->rec));
			json_object_set_new(o, "gone", json_true());
		}
		if (comparing)
			json_object_set_new(o, "comparing", json_true());
		json_array_append_new(ranks, o);
	}
	/* standing: whether the ask still stands (an absent rank answers it
	 * no more once it does not; wexctl stops waiting for it). */
	o = json_pack("{s:s, s:i, s:b, s:o}", "name", g->name, "world", (int)g->world, "standing",
		      now < g->verify_until_ns, "ranks", ranks);
	if (o && unlisted) {
		json_object_set_new(o, "ranks_unlisted", json_integer((json_int_t)unlisted));
		json_object_set_new(o, "unlisted_state",
				    json_string(g->verify_ticket < ticket ? "not-asked" : "absent"));
	}
	return o;
}

/* Where the ranks of a group an ask stands for, gone for now, stand on
 * `ticket`: absent, the ask standing or not, but for those that answered
 * before they left (done). */
static json_t *gone_state(const struct verify_stand *s, uint64_t ticket)
{
	struct cgroup gone = { .world = s->world, .verify_ticket = s->ticket,
			       .verify_asked_ns = s->asked_ns, .verify_until_ns = s->until_ns,
			       .verify_kept = s->kept };

	memcpy(gone.name, s->group, sizeof(gone.name));
	return group_state(&gone, ticket);
}

/* A poll of an ask whose model went with its last client: the groups it
 * asked that stand still, every rank absent (NULL: none). */
static json_t *orphan_poll(struct wexd *d, const char *model, const char *group, uint64_t ticket)
{
	json_t *groups = NULL;

	/* (Matched before the expired are pruned: an ask that just stopped
	 * standing reads as its ranks absent, not as no model.) */
	for (struct verify_stand *s = d->verify_orphans; s; s = s->next) {
		if (strcmp(s->model, model) || (group && strcmp(s->group, group)) ||
		    s->ticket < ticket)
			continue;
		if (!groups && !(groups = json_array()))
			break;
		json_array_append_new(groups, gone_state(s, ticket));
	}
	prune_list(&d->verify_orphans);
	return groups;
}

json_t *wexd_verify(struct wexd *d, struct conn *c, json_t *req)
{
	const char *model = NULL, *group = NULL;
	json_int_t ticket = 0, stand = 60000;
	json_error_t je;
	struct model *m;
	json_t *groups;
	char names[512];
	int found = 0;

	if (json_unpack_ex(req, &je, 0, "{s:s, s?s, s?I, s?I}", "model", &model, "group", &group,
			   "ticket", &ticket, "stand_ms", &stand) < 0)
		return wex__reply_error(-EINVAL, "verify: %s", je.text);
	if (stand < 1 || stand > 86400000)
		return wex__reply_error(-EINVAL, "verify: stand_ms %lld: 1 to 86400000 (how long the ask stands)",
					(long long)stand);
	/* Asking costs every engine of the model a comparison: the daemon's
	 * owner and root only, as for config set.  Refused before the model
	 * and its groups are looked at, so that such a user is not sent to
	 * attach an engine only to be refused then. */
	if (!ticket && c->uid != 0 && c->uid != geteuid()) {
		wex__metrics_count(WEX_M_REFUSED, "verify", NULL, 1);
		return wex__reply_error(-EACCES, "verify: uid %d may not ask engines to verify (wexd's owner and root may)",
					(int)c->uid);
	}
	m = find_model(d, model);
	if (!m && ticket > 0 && (uint64_t)ticket <= d->verify_seq &&
	    (groups = orphan_poll(d, model, group, (uint64_t)ticket)))
		return json_pack("{s:b, s:I, s:s, s:I, s:o}", "ok", 1, "ticket", ticket, "model",
				 model, "published", (json_int_t)0, "groups", groups);
	if (!m)
		return wex__reply_error(-ENOENT, "verify: wexd has no model '%.*s' (wexctl models lists them)",
					WEX_NAME_MAX, model);
	for (struct cgroup *g = m->groups; g; g = g->next)
		found |= !group || !strcmp(g->name, group);
	/* A poll: a group that went while an ask of it stood is there still
	 * (its engine restarting). */
	for (struct verify_stand *s = m->verify_stands; s && ticket; s = s->next)
		found |= s->ticket >= (uint64_t)ticket && (!group || !strcmp(s->group, group));
	if (!found && group) {
		group_names(m, names, sizeof(names));
		return wex__reply_error(-ENOENT, "verify: model '%s' has no consumer group '%.*s' (%s%s)",
					m->name, WEX_NAME_MAX, group, *names ? "groups: " : "none yet",
					names);
	}
	if (!found)
		return wex__reply_error(-ENOENT, "verify: model '%s' has no consumer group yet: no engine has attached to verify",
					m->name);
	if (ticket < 0 || (uint64_t)ticket > d->verify_seq)
		return wex__reply_error(-EINVAL, "verify: ticket %lld was never given (the last is %llu; wexd restarted?)",
					(long long)ticket, (unsigned long long)d->verify_seq);
	if (!ticket) {
		/* Each asked group's ask is kept on the model too (it replaces
		 * an older one of the group, as on the group). */
		stands_prune(m);
		for (struct cgroup *g = m->groups; g; g = g->next) {
			struct verify_stand *s;

			if ((group && strcmp(g->name, group)) || stand_find(m, g->name))
				continue;
			s = calloc(1, sizeof(*s));
			if (!s)
				return wex__reply_error(-ENOMEM, "verify: out of memory");
			snprintf(s->group, sizeof(s->group), "%s", g->name);
			s->next = m->verify_stands;
			m->verify_stands = s;
		}
		ticket = (json_int_t)++d->verify_seq;
		for (struct cgroup *g = m->groups; g; g = g->next) {
			struct verify_stand *s;
			uint64_t until;

			if (group && strcmp(g->name, group))
				continue;
			g->verify_ticket = (uint64_t)ticket;
			g->verify_asked_ns = wex__now_ns();
			/* A newer ask answers the older ones too (a rank's
			 * answer is done for every ticket up to its own): it
			 * never ends sooner than one that still stands, or a
			 * quick `wexctl verify --timeout 0` would leave another
			 * operator's wait nothing to answer it (expired). */
			until = g->verify_asked_ns + (uint64_t)stand * 1000000ull;
			if (until > g->verify_until_ns)
				g->verify_until_ns = until;
			s = stand_find(m, g->name);
			s->world = g->world;
			s->ticket = g->verify_ticket;
			s->asked_ns = g->verify_asked_ns;
			s->until_ns = g->verify_until_ns;
		}
		wex_info("verify", "uid %d (pid %d) asked model '%s'%s%s%s to verify its next sync within %.1f s (ticket %lld)",
			 (int)c->uid, (int)c->pid, m->name, group ? " group '" : "", group ? group : "",
			 group ? "'" : "", (double)stand / 1e3, (long long)ticket);
	}
	groups = json_array();
	for (struct cgroup *g = m->groups; g; g = g->next)
		if (!group || !strcmp(g->name, group))
			json_array_append_new(groups, group_state(g, (uint64_t)ticket));
	/* Groups this ticket (or a later ask) asked that are gone for now:
	 * every rank absent until an engine makes the group again. */
	for (struct verify_stand *s = m->verify_stands; s; s = s->next) {
		if ((group && strcmp(s->group, group)) || s->ticket < (uint64_t)ticket ||
		    group_find(m, s->group))
			continue;
		json_array_append_new(groups, gone_state(s, (uint64_t)ticket));
	}
	return json_pack("{s:b, s:I, s:s, s:I, s:o}", "ok", 1, "ticket", ticket, "model", m->name,
			 "published", (json_int_t)m->published, "groups", groups);
}
