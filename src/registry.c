/* SPDX-License-Identifier: MIT */
/*
 * registry.c - models, producer ranks, consumer groups, versions and leases.
 *
 * The rules (DESIGN section 4), single-buffer mode:
 *  - A version is published when all N producer ranks published it.
 *  - begin_write waits until no lease holds the model's buffer; while any
 *    rank writes or waits to write, no new lease is granted (writers are
 *    not starved), so a consumer never reads a mix of two versions.
 *  - All M ranks of a consumer group get the same version: the first rank to
 *    acquire opens a round on the newest version and the group holds it
 *    (one lease) until every rank took it.
 *  - A dead client loses its leases and registrations, nothing else.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ipc/sock.h"
#include "log.h"
#include "metrics.h"
#include "proto.h"
#include "wexd.h"

#define EMSG_LEN 512
/* How often leases held from before this wexd are checked for their
 * processes' exit while a producer waits for them. */
#define HELD_CHECK_NS 200000000ull

static struct model *model_find(struct wexd *d, const char *name)
{
	for (struct model *m = d->models; m; m = m->next)
		if (!strcmp(m->name, name))
			return m;
	return NULL;
}

static void plan_jobs_cancel(struct wexd *d, const struct model *m);

/* The producers' layout changed: cached plans and the tables' memfd no
 * longer fit, and plans being built for the old one are stopped. */
static void model_invalidate(struct wexd *d, struct model *m)
{
	m->layout_gen++;
	plan_jobs_cancel(d, m);
	if (m->tables_fd >= 0)
		close(m->tables_fd);
	m->tables_fd = -1;
}

/* What to do about err, when it says wexd has no fd left. */
static const char *fds_hint(int err)
{
	return err == -EMFILE || err == -ENFILE ?
		       " (wexd is out of file descriptors: raise max_open_files or LimitNOFILE=)" : "";
}

static void plan_entry_free(struct plan_entry *p)
{
	if (p->fd >= 0)
		close(p->fd);
	wex__plan_free(p->plan);
	free(p->layout);
	free(p);
}

/* Whether plan p was made for consumer c's layout as it is now. */
static int plan_fits(const struct plan_entry *p, const struct model *m, const struct conn *c)
{
	return p->layout_gen == m->layout_gen && p->consumer_hash == c->layout_hash &&
	       p->crank == c->rank && c->group && p->cworld == c->group->world &&
	       p->nlayout == c->nlayout && !strcmp(p->device, c->device) &&
	       (!p->nlayout || !memcmp(p->layout, c->layout, p->nlayout * sizeof(*p->layout)));
}

static void plans_free(struct model *m)
{
	while (m->plans) {
		struct plan_entry *p = m->plans;

		m->plans = p->next;
		plan_entry_free(p);
	}
}

/* Forgets plans no connected consumer can use any more (a layout that left,
 * or an older producer layout), closing their memfds. */
static void plans_gc(struct model *m)
{
	struct plan_entry **pp = &m->plans;

	while (*pp) {
		struct plan_entry *p = *pp;
		int used = 0;

		/* Used: by a rank it was made for (the key of plan_get). */
		for (struct cgroup *g = m->groups; g && !used; g = g->next)
			used = p->cworld == g->world && p->crank < g->world && g->ranks[p->crank] &&
			       plan_fits(p, m, g->ranks[p->crank]);
		if (used) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		plan_entry_free(p);
	}
}

/*
 * Plans are built off the loop.  A plan of millions of cells takes seconds
 * (2.4 s for a vLLM tp=8 rank of DeepSeek-V3 from FSDP2 over 64 ranks,
 * 18.8 s over 256 on the dev VM): built in wexd's loop, it held every other
 * client off meanwhile (their syncs, a producer's publish, status).  Each
 * plan is built on a thread of its own, then packed into its memfd; the
 * fetch that asked waits (WAIT_PLAN), as do fetches of the same plan, and
 * fetches of others while planner_threads plans are built: all ask again
 * when one is done.  planner_threads bounds the memory plans take while
 * built (the planner's cell bound each): one rank's long plan no longer
 * holds up every other rank's and model's, and an engine's tp ranks are
 * planned side by side.  A thread reads the consumer layout from its own
 * copy and the producer tables in place: a table freed meanwhile (its rank
 * left or registered others) is kept until no job reads it (table_free),
 * and a plan for a layout that changed, or a model that went (m NULL), is
 * stopped (cancel) and thrown away.
 */
struct plan_job {
	struct plan_job *next;
	struct plan_entry *p; /* its key set (plan_fits); plan, fd, build_ms by the thread */
	struct model *m;      /* NULL once the model went */
	struct wex_plan_src *srcs;
	uint32_t nsrc;
	uint8_t *near;
	struct wex_tensor **keep; /* producer tables freed while it runs (nsrc slots) */
	uint32_t nkeep;
	int efd;
	int ret;
	char err[EMSG_LEN];
	char group[WEX_NAME_MAX]; /* of the consumer that asked first (its log line) */
	uint64_t start_ns;
	pthread_t thread;
	char model[WEX_NAME_MAX]; /* its name, for the log once m went */
	atomic_int cancel; /* set by the loop: the plan is no longer wanted */
	atomic_int done;   /* set by the thread before it writes efd */
};

static void table_free(struct wexd *d, struct wex_tensor *t);

static void prank_clear(struct wexd *d, struct prank *r)
{
	for (uint32_t i = 0; i < r->nsegs; i++) {
		/* (A producer's file: its close may wait on a FUSE server.) */
		wex_sock_close_nowait(r->segs[i].fd);
		free(r->segs[i].parts);
	}
	free(r->segs);
	table_free(d, r->t);
	d->table_bytes -= r->nt * sizeof(*r->t);
	r->segs = NULL;
	r->nsegs = 0;
	r->t = NULL;
	r->nt = 0;
	r->has_table = 0;
	r->bytes = 0;
}


/* Unlinks g from m and frees it. */
static void group_free(struct model *m, struct cgroup *g)
{
	for (struct cgroup **gp = &m->groups; *gp; gp = &(*gp)->next)
		if (*gp == g) {
			*gp = g->next;
			break;
		}
	wexd_verify_group_gone(m, g);
	free(g->ranks);
	free(g->taken);
	free(g);
}

static void model_free(struct wexd *d, struct model *m)
{
	struct model **pp;

	for (pp = &d->models; *pp; pp = &(*pp)->next)
		if (*pp == m) {
			*pp = m->next;
			break;
		}
	for (uint32_t i = 0; i < m->world; i++)
		prank_clear(d, &m->ranks[i]);
	free(m->ranks);
	while (m->groups)
		group_free(m, m->groups);
	wexd_verify_forget(d, m);
	plans_free(m);
	plan_jobs_cancel(d, m);
	for (struct plan_job *j = d->plan_jobs; j; j = j->next)
		if (j->m == m)
			j->m = NULL; /* its plan is thrown away */
	if (m->tables_fd >= 0)
		close(m->tables_fd);
	wex_info("registry", "model '%s' removed (no clients left)", m->name);
	free(m);
}

/* A model with no client left is forgotten: its bytes lived in the clients. */
static void model_maybe_free(struct wexd *d, struct model *m)
{
	if (m->held)
		return;
	for (uint32_t i = 0; i < m->world; i++)
		if (m->ranks[i].c)
			return;
	for (struct cgroup *g = m->groups; g; g = g->next)
		for (uint32_t i = 0; i < g->world; i++)
			if (g->ranks[i])
				return;
	model_free(d, m);
}

static void lease_note(struct conn *c);
static void held_round_end(struct wexd *d, struct model *m, struct cgroup *g);
static void held_rounds_lose(struct wexd *d, struct model *m);
static void held_lost_mark(struct cgroup *g, const struct held *h);
static int held_holds(const struct held *h);

/* Closes group g's round; `held`: the takes from before this wexd that
 * it passed end with it (held_round_end). */
static void round_end(struct wexd *d, struct model *m, struct cgroup *g, int held)
{
	if (!g->round_open)
		return;
	g->round_open = 0;
	if (m->leases)
		m->leases--; /* the group's hold */
	/* The takes written down for it end with it, those it passed
	 * from before this wexd too. */
	for (uint32_t i = 0; i < g->world; i++)
		if (g->ranks[i] && g->ranks[i]->note_mode == WEX_JOURNAL_ROUND)
			lease_note(g->ranks[i]);
	if (held && m->held)
		held_round_end(d, m, g);
}

static void round_close(struct wexd *d, struct model *m, struct cgroup *g)
{
	round_end(d, m, g, 1);
}

/* Rank r of group g holds nothing of the open round any more (it left,
 * its sync of the round's version failed, it attached new buffers): the
 * round waits for it again, as for a rank that never took it. */
static void round_untake(struct cgroup *g, uint32_t r)
{
	if (g->round_open && g->taken[r]) {
		g->taken[r] = 0;
		g->ntaken--;
		if (g->ranks[r])
			lease_note(g->ranks[r]);
	}
}

/* (Re)sizes group g, which no rank holds, for `world` ranks. */
static int group_resize(struct wexd *d, struct model *m, struct cgroup *g, uint32_t world)
{
	struct conn **ranks = calloc(world, sizeof(*ranks));
	uint8_t *taken = calloc(world, 2);

	if (!ranks || !taken) {
		free(ranks);
		free(taken);
		return -ENOMEM;
	}
	round_close(d, m, g);
	wexd_verify_kept_free(g);
	free(g->ranks);
	free(g->taken);
	g->ranks = ranks;
	g->taken = taken;
	g->lost = taken + world;
	g->nlost = 0;
	g->ntaken = 0;
	g->world = world;
	return 0;
}

/*
 * The memory behind the model's published versions went: a producer rank
 * left, or registered other memory after it had published.  Leases granted
 * before are stale (keeping one, or fetching under one, is refused), and an
 * open round is lost: the ranks that took it hold a version their peers can
 * no longer get, so until each of them syncs again the others are refused
 * (ESTALE) rather than handed another version.
 */
static void memory_gone(struct wexd *d, struct model *m)
{
	m->epoch++;
	/* (Shutting down, its producers told by disconnect: the takes from
	 * before stay written, for the next wexd, as held_round_end's.) */
	if (m->held && !d->journal.keep)
		held_rounds_lose(d, m);
	for (struct cgroup *g = m->groups; g; g = g->next) {
		if (!g->round_open)
			continue;
		/* (A rank that passed the round, 2, holds no lease of it:
		 * either it waits for a newer version, or it held this one
		 * before the round opened and, like its peers, syncs again.
		 * But one that passed its take of this round from before this
		 * wexd (or its remap lease, which may be one), 3, holds it as
		 * a rank that took it here does, its process connected since
		 * (held_rounds_lose: or idle with the version): before, its
		 * peers got the next version while it served this one.) */
		for (uint32_t i = 0; i < g->world; i++)
			if (g->ranks[i] && !g->lost[i] && (g->taken[i] == 1 || g->taken[i] == 3)) {
				g->lost[i] = 1;
				g->nlost++;
			}
		if (g->nlost)
			g->lost_version = g->round_version;
		/* (Written down as lost, note_wanted: a wexd restarted before
		 * they sync again gives their peers ESTALE too.) */
		for (uint32_t i = 0; i < g->world; i++)
			if (g->ranks[i] && g->lost[i])
				lease_note(g->ranks[i]);
		round_close(d, m, g);
	}
}

static struct model *model_get(struct wexd *d, const char *name, uint32_t world, int producer,
			       char *err, size_t errlen)
{
	struct model *m = model_find(d, name);

	if (m) {
		if (producer && m->world == 0) {
			m->ranks = calloc(world, sizeof(*m->ranks));
			if (!m->ranks)
				return NULL;
			m->world = world;
		} else if (producer && m->world != world) {
			int live = 0;

			for (uint32_t i = 0; i < m->world; i++)
				live |= m->ranks[i].c != NULL;
			if (!live) {
				/* A trainer restarted with another world size: no
				 * rank of the old one is left to disagree. */
				struct prank *nr = calloc(world, sizeof(*nr));

				if (!nr)
					return NULL;
				for (uint32_t i = 0; i < m->world; i++)
					prank_clear(d, &m->ranks[i]);
				free(m->ranks);
				m->ranks = nr;
				m->world = world;
				m->writing = 0;
				model_invalidate(d, m);
				plans_free(m);
				return m;
			}
			snprintf(err, errlen,
				 "model '%s' has %u producer ranks, this producer says %u", name,
				 m->world, world);
			return NULL;
		}
		return m;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return NULL;
	snprintf(m->name, sizeof(m->name), "%s", name);
	m->tables_fd = -1;
	if (producer) {
		m->ranks = calloc(world, sizeof(*m->ranks));
		if (!m->ranks) {
			free(m);
			return NULL;
		}
		m->world = world;
	}
	m->next = d->models;
	d->models = m;
	wexd_verify_model_made(d, m);
	return m;
}

/*
 * The connection holding producer rank `rank` of `model`, or that rank of
 * consumer group `group` (NULL: producer), is closed if its client has
 * already gone (wexd_conn_close_if_gone): a rank is held by one live
 * connection at a time, and a process restarted in place of a dead one
 * gets its rank even when its hello overtakes the dead one's hang-up.
 * Called before the model is looked up: closing may free it.
 */
static void free_rank_of_gone(struct wexd *d, const char *model, const char *group,
			      json_int_t rank)
{
	struct model *m = model_find(d, model);
	struct conn *c = NULL;

	if (!m)
		return;
	if (!group) {
		if ((uint64_t)rank < m->world)
			c = m->ranks[rank].c;
	} else {
		for (struct cgroup *g = m->groups; g; g = g->next)
			if (!strcmp(g->name, group) && (uint64_t)rank < g->world)
				c = g->ranks[rank];
	}
	if (c)
		wexd_conn_close_if_gone(d, c);
}

/*
 * A hello whose world size differs from the group's (NULL: the model's
 * producers) may come from an engine or trainer restarted with another
 * size right after its old ranks died: close every rank whose client is
 * already gone, as free_rank_of_gone does for the rank asked for, so
 * that the resize is not refused for connections wexd has not yet seen
 * close.  Called before the model is looked up again: closing may free it.
 */
static void free_gone_ranks(struct wexd *d, const char *model, const char *group,
			    json_int_t world)
{
	for (int again = 1; again;) {
		struct model *m = model_find(d, model);
		struct cgroup *g = NULL;

		again = 0;
		if (!m)
			return;
		if (!group) {
			if (!m->world || m->world == (uint64_t)world)
				return;
			for (uint32_t i = 0; i < m->world; i++)
				if (m->ranks[i].c && wexd_conn_close_if_gone(d, m->ranks[i].c)) {
					again = 1; /* m may be gone: look it up again */
					break;
				}
			continue;
		}
		for (g = m->groups; g && strcmp(g->name, group); g = g->next)
			;
		if (!g || g->world == (uint64_t)world)
			return;
		for (uint32_t i = 0; i < g->world; i++)
			if (g->ranks[i] && wexd_conn_close_if_gone(d, g->ranks[i])) {
				again = 1; /* g (and m) may be gone: look them up again */
				break;
			}
	}
}

static const char *role_name(int role)
{
	switch (role) {
	case WEX_ROLE_PRODUCER:
		return "producer";
	case WEX_ROLE_CONSUMER:
		return "consumer";
	case WEX_ROLE_ADMIN:
		return "admin";
	default:
		return "none";
	}
}

static const char *mode_name(int mode)
{
	switch (mode) {
	case WEX_SYNC_COPY:
		return "copy";
	case WEX_SYNC_REMAP_VIEW:
		return "remap-view";
	case WEX_SYNC_REMAP_FIXED:
		return "remap-fixed";
	case WEX_JOURNAL_ROUND:
		return "round";
	case WEX_JOURNAL_LOST:
		return "lost";
	case WEX_JOURNAL_LOST | WEX_SYNC_REMAP_VIEW:
		return "lost-remap-view";
	case WEX_JOURNAL_LOST | WEX_SYNC_REMAP_FIXED:
		return "lost-remap-fixed";
	default:
		return "-";
	}
}

static int held_claim(struct wexd *d, struct conn *c, uint64_t lease);

/* ---------------------------------------------------------------------- */

json_t *wexd_hello(struct wexd *d, struct conn *c, json_t *req)
{
	const char *role = NULL, *model = NULL, *group = "default", *name = "";
	json_int_t rank = 0, world = 1, lease = 0;
	char err[EMSG_LEN] = "";
	json_error_t je;

	if (c->role)
		return wex__reply_error(-EINVAL, "hello already done on this connection");
	/* lease: a consumer reconnecting holds this version (a remap lease an
	 * earlier wexd granted), which it takes back if this wexd holds it. */
	if (json_unpack_ex(req, &je, 0, "{s:s, s?s, s?s, s?I, s?I, s?s, s?I}", "role", &role,
			   "model", &model, "group", &group, "rank", &rank, "world", &world,
			   "name", &name, "lease", &lease) < 0)
		return wex__reply_error(-EINVAL, "hello: %s", je.text);
	if (lease < 0)
		return wex__reply_error(-EINVAL, "hello: lease v%lld is not a version",
					(long long)lease);
	snprintf(c->name, sizeof(c->name), "%s", name);
	/* Cut at 63 bytes, perhaps inside a character: clients and status
	 * put it in JSON. */
	wex__text_scrub(c->name);
	if (!strcmp(role, "admin")) {
		c->role = WEX_ROLE_ADMIN;
		return json_pack("{s:b, s:i, s:s}", "ok", 1, "v", WEX_PROTO_VERSION, "io",
				 wexd_io_backend(d));
	}
	if (strcmp(role, "producer") && strcmp(role, "consumer"))
		return wex__reply_error(-EINVAL, "hello: role '%s' unknown (producer, consumer, admin)",
					role);
	if (!model || !*model || strlen(model) >= WEX_NAME_MAX)
		return wex__reply_error(-EINVAL, "hello: a %s needs a model name (1..%d bytes)", role,
					WEX_NAME_MAX - 1);
	/* Names go into logs and operators' terminals. */
	if (!wex__name_printable(model) || !wex__name_printable(group))
		return wex__reply_error(-EINVAL, "hello: model and group names may not hold control characters");
	if (world < 1 || world > WEX_WORLD_MAX || rank < 0 || rank >= world)
		return wex__reply_error(-EINVAL, "hello: rank %lld outside world size %lld",
					(long long)rank, (long long)world);
	free_rank_of_gone(d, model, strcmp(role, "producer") ? group : NULL, rank);
	free_gone_ranks(d, model, strcmp(role, "producer") ? group : NULL, world);
	if (!strcmp(role, "producer")) {
		struct model *m = model_get(d, model, (uint32_t)world, 1, err, sizeof(err));

		if (!m)
			return wex__reply_error(-EINVAL, "hello: %s", err[0] ? err : "out of memory");
		if (m->ranks[rank].c)
			return wex__reply_error(-EADDRINUSE,
						"hello: producer rank %lld of model '%s' is held by pid %d",
						(long long)rank, model, (int)m->ranks[rank].c->pid);
		m->ranks[rank].c = c;
		c->model = m;
		c->rank = (uint32_t)rank;
		c->role = WEX_ROLE_PRODUCER;
		wex_info("registry", "producer pid %d joined model '%s' as rank %lld/%lld",
			 (int)c->pid, model, (long long)rank, (long long)world);
		return json_pack("{s:b, s:i, s:I, s:b}", "ok", 1, "v", WEX_PROTO_VERSION, "published",
				 (json_int_t)m->published, "cancel", 1);
	}
	/* consumer */
	if (strlen(group) >= WEX_NAME_MAX || !*group)
		return wex__reply_error(-EINVAL, "hello: bad group name");
	struct model *m = model_get(d, model, 0, 0, err, sizeof(err));
	struct cgroup *g;

	if (!m)
		return wex__reply_error(-ENOMEM, "hello: out of memory");
	for (g = m->groups; g; g = g->next)
		if (!strcmp(g->name, group))
			break;
	if (g && g->world != (uint32_t)world) {
		int left = 1;

		for (uint32_t i = 0; i < g->world; i++)
			left &= g->ranks[i] == NULL;
		if (!left)
			return wex__reply_error(-EINVAL,
						"hello: group '%s' has %u ranks, this consumer says %lld",
						group, g->world, (long long)world);
		/* Every rank of the old group left: the engine came back with
		 * another world size, as a trainer may. */
		if (group_resize(d, m, g, (uint32_t)world) < 0)
			return wex__reply_error(-ENOMEM, "hello: out of memory");
		wex_info("registry", "group '%s' of model '%s' now has %lld ranks", group, m->name,
			 (long long)world);
	}
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g || group_resize(d, m, g, (uint32_t)world) < 0) {
			free(g);
			return wex__reply_error(-ENOMEM, "hello: out of memory");
		}
		snprintf(g->name, sizeof(g->name), "%s", group);
		g->next = m->groups;
		m->groups = g;
		wexd_verify_group_made(m, g);
		/* (Takes of a lost round from before this wexd whose group's
		 * ranks had all left: its peers wait for them as before.) */
		for (struct held *h = d->held; h; h = h->next)
			if (h->m == m && h->lost && h->r.world == g->world &&
			    !strcmp(h->r.group, g->name))
				held_lost_mark(g, h);
	}
	if (g->ranks[rank])
		return wex__reply_error(-EADDRINUSE, "hello: rank %lld of group '%s' is held by pid %d",
					(long long)rank, group, (int)g->ranks[rank]->pid);
	g->ranks[rank] = c;
	c->model = m;
	c->group = g;
	c->rank = (uint32_t)rank;
	c->role = WEX_ROLE_CONSUMER;
	wex_info("registry", "consumer pid %d joined model '%s' group '%s' as rank %lld/%lld",
		 (int)c->pid, model, group, (long long)rank, (long long)world);
	/* "cancel": a wait of this connection's ends at a "cancel" request
	 * (wexd_cancel); a client never sends one to a wexd that does not
	 * say so, which would answer it as a second request in flight. */
	return json_pack("{s:b, s:i, s:I, s:b, s:b}", "ok", 1, "v", WEX_PROTO_VERSION, "published",
			 (json_int_t)m->published, "lease_reclaimed",
			 held_claim(d, c, (uint64_t)lease), "cancel", 1);
}

static int hex_decode(const char *s, unsigned char *out, size_t max, uint32_t *len)
{
	size_t n = strlen(s);

	if (n % 2 || n / 2 > max)
		return -EINVAL;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;

		/* (sscanf alone takes "+1", "-1" and "0g".) */
		if (!isxdigit((unsigned char)s[2 * i]) || !isxdigit((unsigned char)s[2 * i + 1]) ||
		    sscanf(s + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (unsigned char)v;
	}
	*len = (uint32_t)(n / 2);
	return 0;
}

/* A chained segment: its `parts` (ids of this rank's parts, in address
 * order) must be unclaimed cuda_vmm parts of one device that hold
 * [handle_offset, handle_offset+size). */
static json_t *chain_parts(struct prank *r, struct seg *s, json_t *parts)
{
	uint64_t total = 0;
	size_t i;
	json_t *v;

	if (!json_is_array(parts) || json_array_size(parts) < 2 || json_array_size(parts) > 65536)
		return wex__reply_error(-EINVAL, "register_segment: parts must list 2 or more part ids");
	if (s->desc.kind != WEX_MEM_CUDA_VMM)
		return wex__reply_error(-EINVAL, "register_segment: only cuda_vmm segments chain parts");
	s->parts = calloc(json_array_size(parts), sizeof(*s->parts));
	if (!s->parts)
		return wex__reply_error(-ENOMEM, "register_segment: out of memory");
	json_array_foreach(parts, i, v) {
		json_int_t id = json_integer_value(v);
		struct seg *p;

		if (!json_is_integer(v) || id < 0 || id >= r->nsegs || !r->segs[id].part)
			return wex__reply_error(-EINVAL, "register_segment: parts[%zu] is not a part of this rank",
						i);
		p = &r->segs[id];
		if (p->claimed)
			return wex__reply_error(-EINVAL, "register_segment: part %lld is already chained",
						(long long)id);
		for (size_t j = 0; j < i; j++)
			if (s->parts[j] == (uint32_t)id)
				return wex__reply_error(-EINVAL, "register_segment: part %lld listed twice",
							(long long)id);
		if (p->desc.kind != WEX_MEM_CUDA_VMM || strcmp(p->desc.device, s->desc.device))
			return wex__reply_error(-EINVAL,
						"register_segment: part %lld is not cuda_vmm memory of device %s",
						(long long)id, s->desc.device);
		if (i > 0 && p->desc.handle_offset)
			return wex__reply_error(-EINVAL,
						"register_segment: part %lld starts inside its allocation; only the first may",
						(long long)id);
		if (i == 0 && p->desc.handle_offset != s->desc.handle_offset)
			return wex__reply_error(-EINVAL,
						"register_segment: handle_offset %llu differs from its first part's %llu",
						(unsigned long long)s->desc.handle_offset,
						(unsigned long long)p->desc.handle_offset);
		s->parts[i] = (uint32_t)id;
		if (__builtin_add_overflow(total, p->desc.alloc_size, &total))
			return wex__reply_error(-EOVERFLOW,
						"register_segment: the parts' allocations add up past 2^64 bytes");
	}
	s->nparts = (uint32_t)json_array_size(parts);
	if (s->desc.handle_offset + s->desc.size > total)
		return wex__reply_error(-EINVAL,
					"register_segment: %llu bytes from offset %llu exceed the parts' %llu",
					(unsigned long long)s->desc.size,
					(unsigned long long)s->desc.handle_offset,
					(unsigned long long)total);
	s->desc.alloc_size = total;
	return NULL;
}

json_t *wexd_register_segment(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds)
{
	const char *kind = NULL, *device = "", *handle = "";
	json_int_t size = 0, hoff = 0, asize = 0;
	json_t *parts = NULL, *err;
	int k, need_fd, part = 0, fl;
	struct prank *r;
	struct seg s, *ns;
	json_error_t je;

	if (c->role != WEX_ROLE_PRODUCER)
		return wex__reply_error(-EPERM, "register_segment: only producers register segments");
	if (json_unpack_ex(req, &je, 0, "{s:s, s:I, s?s, s?s, s?I, s?I, s?b, s?o}", "kind", &kind,
			   "size", &size, "device", &device, "handle", &handle, "handle_offset",
			   &hoff, "alloc_size", &asize, "part", &part, "parts", &parts) < 0)
		return wex__reply_error(-EINVAL, "register_segment: %s", je.text);
	if (!strcmp(kind, "host"))
		k = WEX_MEM_HOST;
	else if (!strcmp(kind, "cuda_vmm"))
		k = WEX_MEM_CUDA_VMM;
	else if (!strcmp(kind, "cuda_ipc"))
		k = WEX_MEM_CUDA_IPC;
	else
		return wex__reply_error(-EINVAL, "register_segment: kind '%s' unknown (host, cuda_vmm, cuda_ipc)",
					kind);
	if (part && parts)
		return wex__reply_error(-EINVAL, "register_segment: a part cannot chain parts");
	if (part && k != WEX_MEM_CUDA_VMM)
		return wex__reply_error(-EINVAL, "register_segment: only cuda_vmm memory comes in parts");
	/* A chained segment's memory travels with its parts; VMM memory made
	 * with fabric handles only (PyTorch's choice where IMEX works) as its
	 * 64-byte fabric handle. */
	need_fd = k != WEX_MEM_CUDA_IPC && !parts;
	if (k == WEX_MEM_CUDA_VMM && need_fd && nfds == 0 && strlen(handle) == 2 * 64)
		need_fd = 0;
	if (nfds != need_fd)
		return wex__reply_error(-EINVAL, "register_segment: %s%s takes %d fd, got %d",
					parts ? "a chained " : "kind ", kind, need_fd, nfds);
	if (size <= 0)
		return wex__reply_error(-EINVAL, "register_segment: size must be positive");
	if (hoff < 0 || asize < 0)
		return wex__reply_error(-EINVAL, "register_segment: %s %lld is negative",
					hoff < 0 ? "handle_offset" : "alloc_size",
					(long long)(hoff < 0 ? hoff : asize));
	memset(&s, 0, sizeof(s));
	s.desc.kind = k;
	s.desc.size = (uint64_t)size;
	s.desc.handle_offset = (uint64_t)hoff;
	s.desc.alloc_size = asize ? (uint64_t)asize : (uint64_t)size;
	if (s.desc.handle_offset > s.desc.alloc_size ||
	    s.desc.size > s.desc.alloc_size - s.desc.handle_offset)
		return wex__reply_error(-EINVAL,
					"register_segment: handle_offset %lld + size %lld exceed the allocation's %llu bytes",
					(long long)hoff, (long long)size,
					(unsigned long long)s.desc.alloc_size);
	/* Consumers map host memory from its file's start (vmm/host.c: a
	 * host region has no lead): bytes further in would be read from
	 * there, the wrong ones, with nothing to tell. */
	if (k == WEX_MEM_HOST && hoff)
		return wex__reply_error(-EINVAL, "register_segment: host memory starts at its file's "
					"start: handle_offset %lld must be 0 (register a file "
					"holding the segment from its first byte)", (long long)hoff);
	s.part = part;
	/* (It reaches status, wexctl's tables and the planner's log, as an
	 * attach's device does.) */
	if (strlen(device) >= sizeof(s.desc.device) || !wex__name_printable(device))
		return wex__reply_error(-EINVAL,
					"register_segment: device must be a printable name under %zu bytes",
					sizeof(s.desc.device));
	snprintf(s.desc.device, sizeof(s.desc.device), "%s", device);
	if (hex_decode(handle, s.desc.handle, sizeof(s.desc.handle), &s.desc.handle_len) < 0)
		return wex__reply_error(-EINVAL, "register_segment: handle must be hex of at most %d bytes",
					WEX_HANDLE_MAX);
	/* A legacy IPC handle is 64 bytes, a VMM fabric handle too: consumers
	 * refuse any other length at import, each one failing its fetch where
	 * the producer was told its register had worked. */
	if ((k == WEX_MEM_CUDA_IPC && s.desc.handle_len != 64) ||
	    (k == WEX_MEM_CUDA_VMM && s.desc.handle_len && s.desc.handle_len != 64) ||
	    (k == WEX_MEM_HOST && s.desc.handle_len))
		return wex__reply_error(-EINVAL, "register_segment: a %s handle is %s, got %u bytes",
					kind, k == WEX_MEM_HOST ? "empty (the fd is the memory)" :
					k == WEX_MEM_CUDA_IPC ? "64 bytes (CUipcMemHandle)" :
					"empty or a 64-byte fabric handle",
					s.desc.handle_len);
	if (need_fd) {
		struct statx stx;
		struct stat st;

		/* Attributes as cached, asking no FUSE server: one that never
		 * answers stood wexd's loop still. */
		if (statx(fds[0], "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_SIZE,
			  &stx) < 0)
			return wex__reply_error(-EINVAL, "register_segment: statx of its fd: %s",
						strerror(errno));
		st.st_mode = stx.stx_mode;
		st.st_size = (off_t)stx.stx_size;
		/* Consumers map host memory: a pipe or a directory would fail
		 * there, a short file would make every consumer fault. */
		if (k == WEX_MEM_HOST && !S_ISREG(st.st_mode))
			return wex__reply_error(-EINVAL,
						"register_segment: host memory must be a memfd or a regular file");
		/* Consumers mmap it for reading, with this fd's access mode. */
		fl = fcntl(fds[0], F_GETFL);
		if (k == WEX_MEM_HOST && (fl < 0 || (fl & O_ACCMODE) == O_WRONLY || (fl & O_PATH)))
			return wex__reply_error(-EBADF,
						"register_segment: host memory's fd must be open for reading (consumers map it read-only)");
		if (k == WEX_MEM_HOST && (uint64_t)st.st_size < s.desc.size)
			return wex__reply_error(-EINVAL,
						"register_segment: fd is %lld bytes, smaller than size %lld",
						(long long)st.st_size, (long long)size);
		/* A CUDA handle's fd is opaque here, but wexd keeps it and hands
		 * it to every consumer that fetches: a socket would be a live
		 * connection passed on (the producer's own to wexd: wexd would
		 * hold its end, never see it close, and keep its rank for good);
		 * a pipe or a directory is never memory. */
		if (S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISDIR(st.st_mode))
			return wex__reply_error(-EINVAL, "register_segment: its fd is a %s, not memory",
						S_ISSOCK(st.st_mode) ? "socket" :
						S_ISFIFO(st.st_mode) ? "pipe" : "directory");
		/* Every consumer that fetches gets this fd: read-only, so that
		 * it cannot write the producer's memory under the others, cut
		 * its file (SIGBUS in every mapping of it) or seal it through
		 * this fd, whatever the producer's fd allows (wex_segment_alloc's
		 * memfd is O_RDWR).  (/proc opens it writable again where its
		 * mode allows: only seals keep a consumer out, as
		 * wex_segment_alloc's F_SEAL_FUTURE_WRITE does.)  Opened again
		 * through /proc only where that waits on no other process
		 * (shared memory: it has seals; an open on FUSE asks its
		 * server); else, or where this user may not open it, the
		 * producer's fd as it is (libwex sends shared memory opened
		 * again read-only by the producer: root under wexd.service's
		 * capabilities may not open another user's 0600 file). */
		if (k == WEX_MEM_HOST) {
			int ro = wex_sock_fd_readonly(fds[0]);

			if (ro >= 0) {
				close(fds[0]);
				fds[0] = ro;
			} else if (ro != -EALREADY) {
				wex_debug("registry", "register_segment: no read-only open of its fd "
					  "(%s): consumers get the producer's own", strerror(-ro));
			}
		}
	}
	r = &c->model->ranks[c->rank];
	if (r->nsegs >= 65536)
		return wex__reply_error(-ENOSPC, "register_segment: too many segments");
	if (parts && (err = chain_parts(r, &s, parts))) {
		free(s.parts);
		return err;
	}
	ns = realloc(r->segs, (r->nsegs + 1) * sizeof(*ns));
	if (!ns) {
		free(s.parts);
		return wex__reply_error(-ENOMEM, "register_segment: out of memory");
	}
	r->segs = ns;
	s.fd = need_fd ? fds[0] : -1;
	if (need_fd)
		fds[0] = -1; /* kept */
	for (uint32_t i = 0; i < s.nparts; i++)
		r->segs[s.parts[i]].claimed = 1;
	r->segs[r->nsegs] = s;
	if (!part) {
		uint64_t sum = 0;

		r->bytes += s.desc.size;
		for (uint32_t i = 0; i < c->model->world; i++)
			sum += c->model->ranks[i].bytes;
		if (sum > c->model->bytes_peak)
			c->model->bytes_peak = sum;
	}
	model_invalidate(d, c->model);
	return json_pack("{s:b, s:i}", "ok", 1, "segment", r->nsegs++);
}

/* The same with the count unpacked (t, n; freed when refused): a memfd
 * still unsealed when its size was read could have grown before its
 * seals were checked. */
static json_t *table_room_n(struct wexd *d, const char *op, struct wex_tensor *t, size_t n,
			    size_t drop)
{
	uint64_t limit;

	if (wexd_table_room(d, drop * sizeof(*t), n * sizeof(*t), &limit) == 0)
		return NULL;
	free(t);
	return wex__reply_error(-ENOMEM,
				"%s: a table of %zu tensors (%zu bytes in wexd) would take the tensor tables wexd holds (%llu bytes) past max_table_bytes (%llu)",
				op, n, n * sizeof(*t), (unsigned long long)d->table_bytes,
				(unsigned long long)limit);
}

/* Refuses (NULL: room enough) a tensor table in fd that, unpacked in
 * place of `drop` tensors held now, would take wexd past max_table_bytes:
 * counted from the memfd's size before anything is read or allocated. */
static json_t *table_room(struct wexd *d, const char *op, int fd, size_t drop)
{
	uint64_t n = 0, limit;
	struct stat st;

	if (fstat(fd, &st) == 0 && (uint64_t)st.st_size > sizeof(struct wex_table_hdr))
		n = ((uint64_t)st.st_size - sizeof(struct wex_table_hdr)) /
		    sizeof(struct wex_wire_tensor);
	if (wexd_table_room(d, drop * sizeof(struct wex_tensor), n * sizeof(struct wex_tensor),
			    &limit) == 0)
		return NULL;
	return wex__reply_error(-ENOMEM,
				"%s: a table of %llu tensors (%llu bytes in wexd) would take the tensor tables wexd holds (%llu bytes) past max_table_bytes (%llu)",
				op, (unsigned long long)n,
				(unsigned long long)(n * sizeof(struct wex_tensor)),
				(unsigned long long)d->table_bytes, (unsigned long long)limit);
}

json_t *wexd_register_tensors(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds)
{
	char err[EMSG_LEN] = "";
	struct wex_tensor *t = NULL;
	struct prank *r;
	size_t n = 0;
	json_t *full;
	int ret;

	if (c->role != WEX_ROLE_PRODUCER)
		return wex__reply_error(-EPERM, "register_tensors: only producers register tensors");
	if (nfds != 1)
		return wex__reply_error(-EINVAL, "register_tensors takes 1 fd (a sealed table), got %d",
					nfds);
	r = &c->model->ranks[c->rank];
	if ((full = table_room(d, "register_tensors", fds[0], r->nt)))
		return full;
	ret = wex__table_unpack(fds[0], &t, NULL, &n, err, sizeof(err));
	if (ret < 0)
		return wex__reply_error(ret, "register_tensors: %s", err);
	if ((full = table_room_n(d, "register_tensors", t, n, r->nt)))
		return full;
	for (size_t i = 0; i < n; i++) {
		uint64_t span, end;

		if (t[i].segment >= r->nsegs || r->segs[t[i].segment].part) {
			json_t *e = t[i].segment >= r->nsegs ?
					    wex__reply_error(-EINVAL,
							     "register_tensors: tensor '%s' names segment %u, rank has %u",
							     t[i].name, t[i].segment, r->nsegs) :
					    wex__reply_error(-EINVAL,
							     "register_tensors: tensor '%s' names segment %u, a part of a chained segment",
							     t[i].name, t[i].segment);
			free(t);
			return e;
		}
		wex__tensor_span(&t[i], &span);
		if (__builtin_add_overflow(t[i].offset, span, &end) ||
		    end > r->segs[t[i].segment].desc.size) {
			json_t *e = wex__reply_error(-EINVAL,
						     "register_tensors: tensor '%s' [%llu, %llu) exceeds segment %u of %llu bytes",
						     t[i].name, (unsigned long long)t[i].offset,
						     (unsigned long long)end, t[i].segment,
						     (unsigned long long)r->segs[t[i].segment].desc.size);
			free(t);
			return e;
		}
	}
	/* Other tensors (or memory) under a version already published change
	 * what that version means: the rank holds none until it publishes
	 * again, and leases and rounds on the old one are stale. */
	if (r->published && (n != r->nt || (n && memcmp(t, r->t, n * sizeof(*t))))) {
		wex_info("registry", "producer rank %u of model '%s' registered other tensors after "
			 "publishing v%llu: it holds no version until it publishes again", c->rank,
			 c->model->name, (unsigned long long)r->published);
		r->published = 0;
		memory_gone(d, c->model);
	}
	table_free(d, r->t);
	d->table_bytes += n * sizeof(*t) - r->nt * sizeof(*r->t);
	r->t = t;
	r->nt = n;
	r->has_table = 1;
	model_invalidate(d, c->model);
	plans_free(c->model);
	return json_pack("{s:b, s:I}", "ok", 1, "count", (json_int_t)n);
}

/* ---------------------------------------------------------------------- */
/* Versions and leases.                                                    */

static void describe_leases(struct wexd *d, struct model *m, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (struct cgroup *g = m->groups; g; g = g->next) {
		if (g->round_open && off < len)
			off += (size_t)snprintf(buf + off, len - off,
						"%sgroup '%s' waits for %u of %u ranks to take v%llu",
						off ? "; " : "", g->name, g->world - g->ntaken, g->world,
						(unsigned long long)g->round_version);
		for (uint32_t i = 0; i < g->world && off < len; i++) {
			struct conn *c = g->ranks[i];

			if (c && c->has_lease)
				off += (size_t)snprintf(buf + off, len - off,
							"%sgroup '%s' rank %u (pid %d) holds v%llu in %s mode%s",
							off ? "; " : "", g->name, i, (int)c->pid,
							(unsigned long long)c->lease_version,
							mode_name(c->lease_mode),
							c->lease_reclaimed ? " (taken back from before wexd restarted)" :
							c->waiting == WAIT_PLAN ? " (its copy waits for its plan, being built)" : "");
		}
	}
	for (struct held *h = d->held; h && off < len; h = h->next)
		if (h->m != m || !held_holds(h))
			continue;
		else if (h->r.mode == WEX_JOURNAL_ROUND)
			off += (size_t)snprintf(buf + off, len - off,
						"%sgroup '%s' rank %u (pid %d) took v%llu before wexd restarted, its peers not yet (until they take it, that process calls wexd again, or exits)",
						off ? "; " : "", h->r.group, h->r.rank, (int)h->r.pid,
						(unsigned long long)h->r.version);
		else
			off += (size_t)snprintf(buf + off, len - off,
						"%sgroup '%s' rank %u (pid %d) holds v%llu in %s mode from before wexd restarted (until that process calls wexd again, or exits)",
						off ? "; " : "", h->r.group, h->r.rank, (int)h->r.pid,
						(unsigned long long)h->r.version, mode_name(h->r.mode));
}

/* Marks c's journal record ended, if it holds a lease (a copy sync on a
 * connection that once held a remap lease writes nothing). */
static void lease_unnote(struct conn *c)
{
	c->note_mode = 0;
	if (!c->lease_noted)
		return;
	wex__journal_clear(&c->d->journal, c->lease_fd);
	c->lease_noted = 0;
}

static void lease_drop(struct model *m, struct conn *c)
{
	if (!c->has_lease)
		return;
	c->has_lease = 0;
	c->lease_reclaimed = 0;
	if (m->leases)
		m->leases--;
	lease_note(c); /* (a take of its group's open round may stay) */
}

/* What c's journal record must say (its mode, 0: nothing held): its remap
 * lease, else its take of its group's open round, which keeps the producer
 * off until the other ranks take that version too: a wexd restarted
 * meanwhile must not let them get the next one (the group split between
 * two versions).  A group of one rank closes its round as it takes it.  A
 * rank that passed the round (2: it holds that version already) is
 * written so too, for the next wexd to pass it again (before, that wexd's
 * round waited for it, idle with the version, holding the producer off).
 * A rank that holds a lost round's version (cgroup.lost) is written so
 * (WEX_JOURNAL_LOST) until it syncs again or leaves: before, its take of
 * the round ended with the round (or, one from before this wexd, as its
 * process called), and a wexd restarted meanwhile gave its peers the next
 * version while it served the lost one.  So is its remap lease of that
 * round, which still holds the producer off (WEX_JOURNAL_LOST | its mode:
 * before, it was written as a plain lease, and a wexd restarted before
 * that rank synced again gave its peers the next version once it
 * released the lease, its views still showing the lost one). */
static int note_wanted(const struct conn *c, uint64_t *v)
{
	const struct cgroup *g = c->group;

	if (c->has_lease && c->lease_mode != WEX_SYNC_COPY) {
		*v = c->lease_version;
		return c->lease_mode | (g && g->lost[c->rank] ? WEX_JOURNAL_LOST : 0);
	}
	if (g && g->lost[c->rank]) {
		*v = g->lost_version;
		return WEX_JOURNAL_LOST;
	}
	if (g && g->world > 1 && g->round_open && g->taken[c->rank]) {
		*v = g->round_version;
		return WEX_JOURNAL_ROUND;
	}
	return 0;
}

/*
 * Writes c's lease down (journal.h) if it is a remap lease, before wexd
 * answers the sync that took it: the engine may read the producer's
 * memory for a whole rollout without calling again, and a wexd restarted
 * meanwhile must still hold the producer off.  A copy lease is not
 * written: it lasts one sync, whose release finds the restart and reports
 * the weights dirty.  A failed write is logged (the lease is granted:
 * only a restart before it ends would then lose it) and counted in status.
 */
static void lease_note(struct conn *c)
{
	struct wexd *d = c->d;
	struct wex_journal_rec r = { 0 };
	uint64_t v = 0;
	int mode = note_wanted(c, &v), ret;

	if (!mode) {
		lease_unnote(c);
		return;
	}
	/* (Shutting down: what is written stays as it is.) */
	if (d->journal.dirfd < 0 || d->journal.keep)
		return;
	/* (Written already, or not writable for this peer: counted once.) */
	if ((c->lease_noted || c->pid <= 0) && c->note_mode == mode && c->note_version == v)
		return;
	if (c->pid <= 0) {
		/* Peer in a pid namespace wexd cannot see: no process to
		 * hold the lease for after a restart. */
		c->note_mode = mode;
		c->note_version = v;
		if (d->journal.errors++ % 1000 == 0)
			wex_warn("journal", "cannot write down the %s lease of a client whose pid wexd cannot see (another pid namespace): should wexd restart before it ends, the producer could write under it",
				 mode_name(mode));
		return;
	}
	if (!c->start)
		c->start = wex__proc_start(c->pid);
	snprintf(r.model, sizeof(r.model), "%s", c->model->name);
	snprintf(r.group, sizeof(r.group), "%s", c->group->name);
	r.rank = c->rank;
	r.world = c->group->world;
	r.version = v;
	r.mode = mode;
	r.pid = c->pid;
	r.uid = c->uid;
	r.start = c->start;
	ret = wex__journal_put(&d->journal, &c->lease_fd, c->lease_file, &r);
	c->lease_noted = c->lease_fd >= 0; /* a failed rewrite may leave the old record */
	c->note_mode = ret < 0 ? 0 : mode;
	c->note_version = v;
	/* (Counted apart from errors, which other failures, warned apart,
	 * count too: the first of these was not said when one came first.) */
	if (ret < 0) {
		if (d->journal.unwritten++ % 1000 == 0)
			wex_warn("journal", "cannot write down the %s lease of pid %d on model '%s' v%llu in %s: %s: should wexd restart before it ends, the producer could write under it (%llu failed write(s) so far)",
				 mode_name(mode), (int)c->pid, c->model->name,
				 (unsigned long long)v, d->journal.path,
				 strerror(-ret), (unsigned long long)d->journal.errors);
	}
}

/* The connected ranks of group g that passed its open round (2 or 3,
 * which opening it or their syncs set): written down as takes are. */
static void round_note_passed(struct cgroup *g)
{
	for (uint32_t i = 0; i < g->world; i++)
		if (g->ranks[i] && g->taken[i] >= 2)
			lease_note(g->ranks[i]);
}

/* ---------------------------------------------------------------------- */
/* Leases held from before this wexd (journal.h, struct held).             */

/* h holds the producer off: a lease, or a take of a round not lost (a
 * lost remap lease still does, as it does at the wexd that granted it). */
static int held_holds(const struct held *h)
{
	return !h->lost || h->r.mode != WEX_JOURNAL_ROUND;
}

/* h's mode as written down: a lost one's says so (WEX_JOURNAL_LOST). */
static int held_mode(const struct held *h)
{
	if (!h->lost)
		return h->r.mode;
	return h->r.mode == WEX_JOURNAL_ROUND ? WEX_JOURNAL_LOST : h->r.mode | WEX_JOURNAL_LOST;
}

/* Ends h, leaving its model even with nothing left in it (the caller's
 * business: held_drop frees it then). */
static void held_end(struct wexd *d, struct held *h, const char *why)
{
	struct held **pp = &d->held;
	struct model *m = h->m;

	while (*pp != h)
		pp = &(*pp)->next;
	*pp = h->next;
	if (why)
		wex_info("journal", "model '%s': the %s lease of pid %d (group '%s' rank %u) on v%llu, held from before this wexd, ended: %s",
			 m->name, mode_name(h->r.mode), (int)h->r.pid, h->r.group, h->r.rank,
			 (unsigned long long)h->r.version, why);
	if (why) {
		int none = -1;

		wex__journal_del(&d->journal, &none, h->file);
	}
	if (m->leases && held_holds(h))
		m->leases--;
	m->held--;
	free(h);
}

static void held_drop(struct wexd *d, struct held *h, const char *why)
{
	struct model *m = h->m;

	held_end(d, h, why);
	model_maybe_free(d, m);
}

static void held_add(void *arg, const char *name, const struct wex_journal_rec *r)
{
	struct wexd *d = arg;
	char file[WEX_JOURNAL_NAME_MAX], err[EMSG_LEN] = "";
	struct model *m;
	struct held *h;

	snprintf(file, sizeof(file), "%s", name);
	if (!wex__journal_alive(r)) {
		int none = -1;

		wex_info("journal", "model '%s': the %s lease of pid %d on v%llu ended with its process while no wexd ran",
			 r->model, mode_name(r->mode), (int)r->pid, (unsigned long long)r->version);
		wex__journal_del(&d->journal, &none, file);
		return;
	}
	m = model_get(d, r->model, 0, 0, err, sizeof(err));
	h = m ? calloc(1, sizeof(*h)) : NULL;
	if (!h) {
		/* Kept on disk: the next wexd may read it. */
		wex_error("journal", "out of memory reading %s/%s: pid %d's lease on model '%s' v%llu is not held",
			  d->journal.path, file, (int)r->pid, r->model,
			  (unsigned long long)r->version);
		if (m)
			model_maybe_free(d, m);
		return;
	}
	snprintf(h->file, sizeof(h->file), "%s", file);
	h->m = m;
	h->r = *r;
	h->since_ns = wex__now_ns();
	h->next = d->held;
	d->held = h;
	m->held++;
	if (h->r.mode & WEX_JOURNAL_LOST) {
		/* A take of a round lost at an earlier wexd (held_rounds_lose):
		 * a group made here counts it among the lost round's holders
		 * (wexd_hello).  A remap lease of it still holds the producer
		 * off, below. */
		h->r.mode &= ~WEX_JOURNAL_LOST;
		if (!h->r.mode)
			h->r.mode = WEX_JOURNAL_ROUND;
		h->lost = 1;
		wex_info("journal", "model '%s': pid %d (group '%s' rank %u) took v%llu, lost before this wexd started: its peers get ESTALE until it syncs again or exits",
			 m->name, (int)h->r.pid, h->r.group, h->r.rank,
			 (unsigned long long)h->r.version);
		if (h->r.mode == WEX_JOURNAL_ROUND)
			return;
	}
	m->leases++;
	if (h->r.mode == WEX_JOURNAL_ROUND)
		wex_warn("journal", "model '%s': pid %d (group '%s' rank %u) took v%llu before this wexd started, its peers not yet: producers wait until they take it, or it calls wexd again or exits",
			 m->name, (int)h->r.pid, h->r.group, h->r.rank,
			 (unsigned long long)h->r.version);
	else
		wex_warn("journal", "model '%s': pid %d (group '%s' rank %u) still holds v%llu in %s mode from before this wexd started: producers wait until it calls wexd again or exits",
			 m->name, (int)h->r.pid, h->r.group, h->r.rank,
			 (unsigned long long)h->r.version, mode_name(h->r.mode));
}

void wexd_held_load(struct wexd *d)
{
	wex__journal_scan(&d->journal, held_add, d);
	d->held_checked_ns = wex__now_ns();
	if (d->journal.undeleted > 3)
		wex_warn("journal", "%llu records of leases that ended could not be removed from %s (the last: %s): each start reads them again",
			 (unsigned long long)d->journal.undeleted, d->journal.path,
			 strerror(d->journal.undeleted_err));
}

/* Group g (h's) counts h, a take of a lost round from before this wexd,
 * among the lost round's holders, its slot not connected (another
 * process of the slot holds nothing). */
static void held_lost_mark(struct cgroup *g, const struct held *h)
{
	if (!g->ranks[h->r.rank] && !g->lost[h->r.rank]) {
		g->lost[h->r.rank] = 1;
		g->nlost++;
		g->lost_version = h->r.version;
	}
}

/* Writes h's record again where it is: as read back, or as a take of a
 * lost round (WEX_JOURNAL_LOST) once it is one.  0 or -errno. */
static int held_put(struct wexd *d, struct held *h)
{
	struct wex_journal_rec r = h->r;
	int fd = -1, ret;

	r.mode = held_mode(h);
	ret = wex__journal_put(&d->journal, &fd, h->file, &r);
	if (fd >= 0)
		close(fd);
	return ret;
}

/* Ends the held leases whose processes exited.  One that its group's
 * open round passed (held_round_pass) leaves that rank holding nothing of
 * the round, as a rank that took it and died: the round waits for the
 * slot's next process, which takes the version at once (before, the
 * round closed without it, the producer wrote the next version, and the
 * slot's next process got that while its peers served this one). */
static void held_sweep(struct wexd *d)
{
	struct held *h = d->held, *next;

	for (; h; h = next) {
		next = h->next;
		if (wex__journal_alive(&h->r))
			continue;
		for (struct cgroup *g = h->m->groups; g; g = g->next) {
			if (g->world != h->r.world || strcmp(g->name, h->r.group) ||
			    g->ranks[h->r.rank])
				continue;
			if (h->lost && g->lost[h->r.rank]) {
				/* Nothing of the lost round is held in its slot. */
				g->lost[h->r.rank] = 0;
				g->nlost--;
			} else if (!h->lost && g->round_open && g->round_version == h->r.version &&
				   g->taken[h->r.rank] >= 2) {
				round_untake(g, h->r.rank);
			}
		}
		held_drop(d, h, "its process exited");
	}
	d->held_checked_ns = wex__now_ns();
}

/* From the loop's tick and before status, models and metrics: a lease
 * whose process exited leaves what an operator sees (held[], wex_leases,
 * systemctl status) within HELD_CHECK_NS, not only at a producer's next
 * begin_write, which an idle node may never call. */
void wexd_held_check(struct wexd *d)
{
	if (d->held && wex__now_ns() - d->held_checked_ns >= HELD_CHECK_NS)
		held_sweep(d);
}

struct stale_del {
	struct wexd *d;
	unsigned n, kept; /* removed; could not be (a read-only mount) */
};

/* A record of the wexd before, in a directory refused at this one's start
 * (wexd_journal_check): its lease was not held here (the engine that came
 * back was told it was lost; what it holds now is written anew), so it
 * goes: kept, the next wexd would hold it beside the one written since
 * for that process, and the producer off until the process exits. */
static void stale_del(void *arg, const char *name, const struct wex_journal_rec *r)
{
	struct stale_del *s = arg;
	char file[WEX_JOURNAL_NAME_MAX]; /* del clears it: name is logged */
	int none = -1, mode = r->mode & ~WEX_JOURNAL_LOST;
	uint64_t undeleted = s->d->journal.undeleted;

	snprintf(file, sizeof(file), "%s", name);
	wex__journal_del(&s->d->journal, &none, file);
	/* (One that could not be removed is said so, counted by del.) */
	if (s->d->journal.undeleted != undeleted) {
		s->kept++;
		return;
	}
	wex_info("journal", "model '%s': the %s lease of pid %d on v%llu, written by an earlier wexd, was not held by this one (the journal was off at its start): its record %s/%s removed",
		 r->model, mode_name(mode ? mode : WEX_JOURNAL_ROUND), (int)r->pid,
		 (unsigned long long)r->version, s->d->journal.path, name);
	s->n++;
}

/*
 * The journal's directory was removed or replaced while wexd ran (an
 * operator's rm -rf or mv): its records, open in the old one, would go on
 * being written where no wexd reads them, a rewrite succeeding, and a
 * restarted wexd would hold nothing.  Opens the directory at the path
 * again and writes there the record of each lease held (those from before
 * this wexd too), saying so.  From the loop's tick and before status.
 */
void wexd_journal_check(struct wexd *d)
{
	const char *why;
	unsigned n = 0;
	int ret, lost = d->journal_lost;

	if (d->journal.keep || wex__now_ns() - d->journal_checked_ns < HELD_CHECK_NS)
		return;
	d->journal_checked_ns = wex__now_ns();
	if (lost) {
		/* Off since its directory went (or since the start, which
		 * refused it): used again once it can be (the operator's
		 * fix), as a restart of wexd, which loses the leases held,
		 * was the only way back. */
		struct stale_del sd = { d, 0, 0 };

		if (wex__journal_reopen(&d->journal) < 0)
			return;
		d->journal_lost = 0;
		why = NULL;
		if (lost == 2) {
			wex__journal_scan(&d->journal, stale_del, &sd);
			if (sd.n)
				wex_warn("journal", "lease journal %s: %u record(s) of leases an earlier wexd granted, not held by this one (the journal was off at its start), removed",
					 d->journal.path, sd.n);
			if (sd.kept)
				wex_warn("journal", "lease journal %s: %u record(s) of leases an earlier wexd granted, not held by this one (the journal was off at its start), could not be removed (%s): the next wexd reads them, and holds the producer off with those whose processes still live",
					 d->journal.path, sd.kept, strerror(d->journal.undeleted_err));
		}
	} else if (!(why = wex__journal_moved(&d->journal))) {
		/* (Status's unwritable follows it: a filesystem remounted
		 * read-only after a disk error, or made writable again.) */
		if (!wex__journal_access(&d->journal))
			return;
		if (d->journal.nowrite[0])
			wex_warn("journal", "lease journal %s cannot be written any more (%s): the remap leases wexd grants from now on are not written down: a restart would lose them",
				 d->journal.path, d->journal.nowrite);
		else {
			/* (A lease whose write failed is written now: its
			 * engine may not call again for a whole rollout.) */
			for (struct conn *c = d->conns; c; c = c->next)
				lease_note(c);
			/* (And a take from before this wexd of a round lost
			 * meanwhile, held_rounds_lose: before, its record still
			 * said "round", and the next wexd held the producer off
			 * with it and gave its peers the next version.) */
			for (struct held *h = d->held; h; h = h->next)
				if (h->lost)
					held_put(d, h);
			wex_info("journal", "lease journal %s can be written again: the remap leases held are written down", d->journal.path);
		}
		return;
	} else if ((ret = wex__journal_reopen(&d->journal)) < 0) {
		wex_error("journal", "lease journal %s was %s while wexd ran, and cannot be made again (%s): the lease journal is off until it can be: a restart of wexd would lose the remap leases now held",
			  d->journal.path, why, d->journal.why);
		for (struct conn *c = d->conns; c; c = c->next)
			if (c->lease_fd >= 0) {
				close(c->lease_fd);
				c->lease_fd = -1;
				c->lease_file[0] = '\0';
				c->lease_noted = 0;
			}
		d->journal_lost = 1;
		return;
	}
	for (struct conn *c = d->conns; c; c = c->next) {
		/* (Off, each record was closed and forgotten: written anew.) */
		if (!lost) {
			if (c->lease_fd < 0 && !c->lease_file[0])
				continue;
			if (c->lease_fd >= 0)
				close(c->lease_fd);
			c->lease_fd = -1;
			c->lease_noted = 0;
			c->note_mode = 0;
		}
		lease_note(c);
		n += c->lease_noted;
	}
	for (struct held *h = d->held; h; h = h->next)
		if (held_put(d, h) == 0)
			n++;
	if (lost)
		wex_warn("journal", "lease journal %s can be used again: %u lease record(s) written there again%s",
			 d->journal.path, n,
			 d->journal.errors ? " (see lease_journal.write_errors in status for those that failed)" : "");
	else
		wex_warn("journal", "lease journal %s was %s while wexd ran: made again, %u lease record(s) written there again%s",
			 d->journal.path, why, n,
			 d->journal.errors ? " (see lease_journal.write_errors in status for those that failed)" : "");
}

void wexd_held_exit(struct wexd *d)
{
	d->journal.keep = 1;
	while (d->held)
		held_drop(d, d->held, NULL);
}

/*
 * Consumer c said hello: a lease its process held from before this wexd
 * on the same rank is taken over when the client still holds it (`lease`:
 * the version it holds, 0 none), and ended otherwise.  1 if taken over.
 */
static int held_claim(struct wexd *d, struct conn *c, uint64_t lease)
{
	struct held *h;

	for (h = d->held; h; h = h->next)
		if (h->r.pid == c->pid && h->r.uid == c->uid && h->m == c->model &&
		    h->r.rank == c->rank && !strcmp(h->r.group, c->group->name))
			break;
	if (!h)
		return 0;
	/* A hello that waited in the listen backlog longer than its client
	 * did (a slow restart): the client hung up and will say hello again.
	 * Taken here, the lease would end with this dead connection. */
	{
		struct pollfd pfd = { .fd = c->io.fd, .events = POLLRDHUP };

		if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)))
			return 0;
	}
	if (!c->start)
		c->start = wex__proc_start(c->pid);
	/* A take of a round (no lease) ends as its process calls again: the
	 * version the rank holds is its next sync's business. */
	if (h->r.mode == WEX_JOURNAL_ROUND) {
		held_drop(d, h, "its process called this wexd");
		/* A pass of the group's open round that it made stays (until
		 * the layout this process attaches, unless a re-send of the
		 * buffers holding that version, wexd_attach): written down
		 * for this connection, for a wexd restarted meanwhile; so
		 * does a take of a lost round, until it syncs again (before,
		 * its record went here: a wexd restarted before that sync
		 * gave its peers the next version). */
		if ((c->group->round_open && c->group->taken[c->rank]) || c->group->lost[c->rank])
			lease_note(c);
		return 0;
	}
	if (lease != h->r.version || (h->r.start && c->start && h->r.start != c->start)) {
		held_drop(d, h, lease ? "its process holds another version" :
			  "its process reconnected without it");
		/* (A lease of a lost round: its views may still show it.) */
		if (c->group->lost[c->rank])
			lease_note(c);
		return 0;
	}
	c->has_lease = 1;
	c->lease_reclaimed = 1;
	c->lease_version = h->r.version;
	c->lease_epoch = c->model->epoch;
	c->lease_mode = h->r.mode;
	/* The record becomes this connection's (rewritten in place from now
	 * on); a conn holds one record at most, so any of its own goes. */
	wex__journal_del(&d->journal, &c->lease_fd, c->lease_file);
	c->lease_noted = 0;
	snprintf(c->lease_file, sizeof(c->lease_file), "%s", h->file);
	lease_note(c);
	wex_info("journal", "model '%s': pid %d (group '%s' rank %u) took back its %s lease on v%llu",
		 c->model->name, (int)c->pid, h->r.group, h->r.rank, mode_name(h->r.mode),
		 (unsigned long long)h->r.version);
	for (struct held **pp = &d->held; *pp; pp = &(*pp)->next)
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	c->model->held--; /* its count in m->leases is now c's */
	free(h);
	return 1;
}


/* h holds v for a rank of group g other than `rank` (whose slot the
 * acquiring process holds now; UINT32_MAX: any rank), and was not lost. */
static int held_in(const struct held *h, const struct model *m, const struct cgroup *g,
		   uint64_t v, uint32_t rank)
{
	return h->m == m && !h->lost && h->r.version == v && h->r.world == g->world &&
	       h->r.rank != rank && !strcmp(h->r.group, g->name);
}

/* A rank of group g other than `rank` holds v from before this wexd: its
 * lease, or its take of the round the group had open (struct held);
 * `round`: only the latter. */
static int held_in_group(struct wexd *d, struct model *m, struct cgroup *g, uint64_t v,
			 uint32_t rank, int round)
{
	for (struct held *h = d->held; h; h = h->next)
		if (held_in(h, m, g, v, rank) && (!round || h->r.mode == WEX_JOURNAL_ROUND))
			return 1;
	return 0;
}

/*
 * Group g opens a round on v: each of its ranks that holds v from before
 * this wexd (struct held) passes it (3, as a take of it): a lease
 * stays held; so does a take of the round the group had open when wexd
 * restarted (WEX_JOURNAL_ROUND), written down, until this round closes
 * (held_round_end): should wexd restart again first, the next one passes
 * it too (before, it ended here, and the next wexd's round waited for
 * that rank, idle with v, holding the producer off).  One in `rank`'s slot
 * ends (the caller's process takes or holds v).
 */
static void held_round_pass(struct wexd *d, struct model *m, struct cgroup *g, uint64_t v,
			    uint32_t rank)
{
	struct held *h, *next;

	for (h = d->held; h; h = next) {
		next = h->next;
		/* A take of that round in `rank`'s own slot, by a process that
		 * no longer holds the slot: its new process takes v now. */
		if (h->r.mode == WEX_JOURNAL_ROUND && h->r.rank == rank && h->m == m &&
		    h->r.version == v && h->r.world == g->world && !strcmp(h->r.group, g->name)) {
			held_drop(d, h, "another process of its rank took that version at this wexd");
			continue;
		}
		if (!held_in(h, m, g, v, rank))
			continue;
		/* (3: a take of the round, which a loss of the round counts
		 * as one made here, memory_gone; a remap lease too, which may
		 * be one, its mode winning over the round's in its record.) */
		if (!g->taken[h->r.rank]) {
			g->taken[h->r.rank] = 3;
			g->ntaken++;
		}
	}
}

/* Group g's round closes: the takes of the round it passed from before
 * this wexd (held_round_pass) end with it. */
static void held_round_end(struct wexd *d, struct model *m, struct cgroup *g)
{
	struct held *h, *next;

	/* (Shutting down: they stay written, for the next wexd to pass.) */
	if (d->journal.keep)
		return;
	for (h = d->held; h; h = next) {
		next = h->next;
		if (h->r.mode == WEX_JOURNAL_ROUND && held_in(h, m, g, g->round_version, UINT32_MAX))
			held_end(d, h, g->ntaken == g->world ?
					       "its group took that version at this wexd" :
					       "its group's round on that version closed");
	}
}

/* h, a remap lease from before this wexd, is passed by its group's open
 * round (held_round_pass), its slot not connected: a take of that round
 * as far as anyone can tell (its record says its mode, which wins over
 * the round's), as such a lease of a round taken here is. */
static int held_lease_passed(struct model *m, const struct held *h)
{
	for (struct cgroup *g = m->groups; g; g = g->next)
		if (held_in(h, m, g, h->r.version, UINT32_MAX) && g->round_open &&
		    g->round_version == h->r.version && g->taken[h->r.rank] == 3 &&
		    !g->ranks[h->r.rank])
			return 1;
	return 0;
}

/*
 * The memory behind model m's versions went (memory_gone): each take of a
 * round from before this wexd that its process has not called this wexd
 * about (idle with the version, a round here passing it or not) counts
 * among the lost round's holders, as a take made here does: its group's
 * other ranks get ESTALE until its process calls wexd again (held_claim
 * ends it there, the rank connected and lost) or exits (held_sweep), a
 * group made again meanwhile too (held_lost_mark).  It holds the producer
 * off no more (before, a trainer that came back waited for that process
 * where no round here ended it: the group's ranks all left, or none had
 * synced), and its record says it was lost (WEX_JOURNAL_LOST), for a
 * wexd restarted meanwhile (before, it was removed: that wexd forgot the
 * take, and the peers got the next version while that rank served the
 * lost one; a take made here that was lost is written so too,
 * note_wanted).  So does a remap lease from before that the group's open
 * round passed (held_lease_passed), which still holds the producer off,
 * as a lease of a round taken here does (before, it was not counted:
 * once it was released, or at a restart, the peers got the next version
 * while that rank's views showed the lost one).
 */
static void held_rounds_lose(struct wexd *d, struct model *m)
{
	for (struct held *h = d->held; h; h = h->next) {
		if (h->m != m || h->lost ||
		    (h->r.mode != WEX_JOURNAL_ROUND && !held_lease_passed(m, h)))
			continue;
		h->lost = 1;
		held_put(d, h); /* rewritten in place, a record of the lost round */
		if (m->leases && h->r.mode == WEX_JOURNAL_ROUND)
			m->leases--;
		wex_info("journal", "model '%s': pid %d (group '%s' rank %u) took v%llu before this wexd started, and the memory behind it went: its peers get ESTALE until it syncs again or exits",
			 m->name, (int)h->r.pid, h->r.group, h->r.rank,
			 (unsigned long long)h->r.version);
		for (struct cgroup *g = m->groups; g; g = g->next)
			if (g->world == h->r.world && !strcmp(g->name, h->r.group))
				held_lost_mark(g, h);
	}
}

/*
 * Opens group g's round on the published version, for its rank `rank`
 * (which the caller counts).  0 if some producer rank does not hold that
 * version (a rank that left and came back holds nothing until it
 * publishes).
 */
static int round_open_now(struct wexd *d, struct model *m, struct cgroup *g, uint32_t rank)
{
	uint64_t v = m->published;

	for (uint32_t i = 0; i < m->world; i++)
		if (!m->ranks[i].c || m->ranks[i].published != v)
			return 0;
	g->round_open = 1;
	g->round_version = v;
	g->ntaken = 0;
	memset(g->taken, 0, g->world);
	m->leases++; /* the group's hold until every rank took v */
	/* Peers that hold v already (served it from this wexd, in this
	 * epoch) pass at once (2: taken without a lease): a rank that syncs
	 * v again (a repeated request, a restarted engine) must not hold the
	 * producer until every peer takes v again, which idle peers never
	 * do. */
	for (uint32_t i = 0; i < g->world; i++) {
		const struct conn *p = g->ranks[i];

		if (i != rank && p && p->served_version == v && p->served_epoch == m->epoch) {
			g->taken[i] = 2;
			g->ntaken++;
		}
	}
	if (m->held)
		held_round_pass(d, m, g, v, rank);
	return 1;
}

/*
 * A newer version v is asked for while version m->writing is unfinished
 * and no rank is writing it any more (the ranks that published it wait for
 * ranks that will never write it, e.g. after a wexd restart ended their
 * writes): the unfinished version is abandoned, so the group can go on.
 * Its ranks that published it hold no version (their buffers hold the
 * abandoned bytes, never served).
 */
static void abandon_write(struct model *m, uint64_t v)
{
	uint64_t w = m->writing;

	for (uint32_t i = 0; i < m->world; i++)
		if (m->ranks[i].writing == w ||
		    (m->ranks[i].c && m->ranks[i].c->waiting == WAIT_BEGIN_WRITE &&
		     m->ranks[i].c->wait_version == w))
			return; /* someone still writes it */
	wex_warn("registry", "model '%s': v%llu abandoned unfinished for v%llu (published by only "
		 "some ranks, and no rank writes it any more)", m->name, (unsigned long long)w,
		 (unsigned long long)v);
	for (uint32_t i = 0; i < m->world; i++)
		if (m->ranks[i].published == w)
			m->ranks[i].published = 0;
	m->writing = 0;
}

static int begin_write_try(struct wexd *d, struct conn *c, json_t **reply)
{
	struct model *m = c->model;
	struct prank *r = &m->ranks[c->rank];

	/* Leases held from before this wexd end with their processes. */
	if (m->held && wex__now_ns() - d->held_checked_ns >= HELD_CHECK_NS)
		held_sweep(d);
	if (m->leases)
		return 0;
	r->writing = c->wait_version;
	m->writing = c->wait_version;
	if (m->write_pending)
		m->write_pending--;
	c->waiting = WAIT_NONE;
	*reply = json_pack("{s:b, s:I, s:f}", "ok", 1, "version", (json_int_t)c->wait_version,
			   "waited_ms", (double)(wex__now_ns() - c->wait_start_ns) / 1e6);
	return 1;
}

json_t *wexd_begin_write(struct wexd *d, struct conn *c, json_t *req)
{
	json_int_t v = 0, timeout = -1;
	struct model *m;
	struct prank *r;
	json_error_t je;
	json_t *reply = NULL;

	if (c->role != WEX_ROLE_PRODUCER)
		return wex__reply_error(-EPERM, "begin_write: only producers write");
	if (json_unpack_ex(req, &je, 0, "{s:I, s?I}", "version", &v, "timeout_ms", &timeout) < 0)
		return wex__reply_error(-EINVAL, "begin_write: %s", je.text);
	/* In nanoseconds a larger one would wrap into a deadline already
	 * past (or any other). */
	if (timeout > (json_int_t)UINT32_MAX)
		return wex__reply_error(-EINVAL, "begin_write: timeout_ms %lld exceeds %u",
					(long long)timeout, UINT32_MAX);
	m = c->model;
	r = &m->ranks[c->rank];
	if (v <= 0 || (uint64_t)v <= m->published || (uint64_t)v <= r->published)
		return wex__reply_error(-EINVAL, "begin_write: version %lld must exceed published v%llu%s",
					(long long)v,
					(unsigned long long)(r->published > m->published ? r->published :
											    m->published),
					r->published > m->published ?
						" (this rank's; its peers have not published it yet)" : "");
	if (m->writing && m->writing != (uint64_t)v && (uint64_t)v > m->writing &&
	    r->published != m->writing && r->writing != m->writing)
		abandon_write(m, (uint64_t)v);
	if (m->writing && m->writing != (uint64_t)v && r->writing == m->writing)
		return wex__reply_error(-EINVAL,
					"begin_write: v%lld while this rank writes v%llu (begun, not published): finish v%llu first; all ranks write the same version",
					(long long)v, (unsigned long long)m->writing,
					(unsigned long long)m->writing);
	if (m->writing && m->writing != (uint64_t)v)
		return wex__reply_error(-EINVAL,
					"begin_write: v%lld while other ranks write v%llu: all ranks write the same version",
					(long long)v, (unsigned long long)m->writing);
	/* Ranks still waiting to begin theirs count too (m->writing is set
	 * only once one is let in). */
	for (uint32_t i = 0; i < m->world; i++) {
		struct conn *o = m->ranks[i].c;

		if (o && o != c && o->waiting == WAIT_BEGIN_WRITE && o->wait_version != (uint64_t)v)
			return wex__reply_error(-EINVAL,
						"begin_write: v%lld while rank %u waits to write v%llu: all "
						"ranks write the same version", (long long)v, i,
						(unsigned long long)o->wait_version);
	}
	/* Begun already: nothing waited, so no waited_ms (wexd_send would
	 * observe it in wex_begin_write_wait_seconds). */
	if (r->writing == (uint64_t)v)
		return json_pack("{s:b, s:I, s:b}", "ok", 1, "version", v, "again", 1);
	if (!r->has_table)
		return wex__reply_error(-EINVAL, "begin_write: register tensors first");
	/* (Draining too: it waits on, and at wexd's exit libwex sends it
	 * again to the next wexd; wexd_fail_waiters.) */
	c->waiting = WAIT_BEGIN_WRITE;
	c->wait_version = (uint64_t)v;
	c->wait_start_ns = wex__now_ns();
	if (timeout < 0)
		timeout = d->begin_write_timeout_ms;
	c->wait_deadline_ns = c->wait_start_ns + (uint64_t)timeout * 1000000ull;
	m->write_pending++;
	if (begin_write_try(d, c, &reply))
		return reply;
	return NULL; /* deferred */
}

json_t *wexd_publish(struct wexd *d, struct conn *c, json_t *req)
{
	json_int_t v = 0;
	struct model *m;
	struct prank *r;
	json_error_t je;
	uint32_t done = 0;
	int restored = 0;

	if (c->role != WEX_ROLE_PRODUCER)
		return wex__reply_error(-EPERM, "publish: only producers publish");
	if (json_unpack_ex(req, &je, 0, "{s:I, s?b}", "version", &v, "restored", &restored) < 0)
		return wex__reply_error(-EINVAL, "publish: %s", je.text);
	m = c->model;
	r = &m->ranks[c->rank];
	if (restored) {
		/*
		 * A producer that reconnected (after a restart of wexd, or a
		 * dropped connection) says its memory still holds the version
		 * it last published with no write begun since: the rank holds
		 * it again, as if published here, without a begin_write.
		 */
		if (v <= 0 || !r->has_table || r->writing || (r->published && r->published != (uint64_t)v))
			return wex__reply_error(-EINVAL, "publish: rank %u cannot restore v%lld (%s)",
						c->rank, (long long)v,
						v <= 0 ? "no such version" :
						!r->has_table ? "no tensors registered" :
						r->writing ? "a write is begun" : "it holds another version");
		if (m->writing && m->writing != (uint64_t)v)
			return wex__reply_error(-EINVAL,
						"publish: rank %u cannot restore v%lld while other ranks write v%llu",
						c->rank, (long long)v, (unsigned long long)m->writing);
		if ((uint64_t)v < m->published)
			return wex__reply_error(-EINVAL,
						"publish: rank %u cannot restore v%lld: the model is at v%llu",
						c->rank, (long long)v, (unsigned long long)m->published);
		wex_info("registry", "producer rank %u of model '%s' (pid %d) holds v%lld again",
			 c->rank, m->name, (int)c->pid, (long long)v);
	} else if (r->writing != (uint64_t)v || v <= 0) {
		return wex__reply_error(-EINVAL, "publish: v%lld was not begun with begin_write on rank %u",
					(long long)v, c->rank);
	}
	r->restored = restored;
	r->writing = 0;
	r->published = (uint64_t)v;
	if (m->first_publish_v != (uint64_t)v) {
		m->first_publish_v = (uint64_t)v;
		m->first_publish_ns = wex__now_ns();
	}
	for (uint32_t i = 0; i < m->world; i++)
		if (m->ranks[i].published == (uint64_t)v && !m->ranks[i].writing)
			done++;
	if (done == m->world) {
		int any_restored = 0;

		m->published_restored = 1;
		for (uint32_t i = 0; i < m->world; i++) {
			m->published_restored &= m->ranks[i].restored;
			any_restored |= m->ranks[i].restored;
		}
		m->published = (uint64_t)v;
		m->published_ns = wex__now_ns();
		m->writing = 0;
		/* How long the group's first publish waited for its last.  Not
		 * where a rank only said it holds v again (a restart of wexd, a
		 * dropped connection): nothing was published, and the time is
		 * that of reconnecting, or since v was first published, hours. */
		if (!any_restored)
			wex__metrics_observe(WEX_M_PUBLISH_VISIBLE, NULL,
					     (double)(m->published_ns - m->first_publish_ns) / 1e9);
		wex_debug("registry", "model '%s' v%lld published by all %u ranks", m->name,
			  (long long)v, m->world);
	}
	return json_pack("{s:b, s:I, s:b}", "ok", 1, "version", v, "visible", done == m->world);
}

json_t *wexd_attach(struct wexd *d, struct conn *c, json_t *req, int *fds, int nfds)
{
	char err[EMSG_LEN] = "";
	struct wex_tensor *t = NULL;
	size_t n = 0;
	int ret, first = !c->layout && !c->nlayout;
	json_t *hv = json_object_get(req, "held");

	if (c->role != WEX_ROLE_CONSUMER)
		return wex__reply_error(-EPERM, "attach: only consumers attach");
	if (hv && (!json_is_integer(hv) || json_integer_value(hv) < 0))
		return wex__reply_error(-EINVAL, "attach: held must be a version (an integer >= 0)");
	if (nfds > 1)
		return wex__reply_error(-EINVAL, "attach takes 0 or 1 fd, got %d", nfds);
	/* The GPU the layout lives on (its UUID), when it is GPU memory. */
	json_t *dv = json_object_get(req, "device");
	const char *dev = "";

	if (dv) {
		if (!json_is_string(dv))
			return wex__reply_error(-EINVAL, "attach: device must be a string");
		dev = json_string_value(dv);
		if (strlen(dev) >= sizeof(c->device) || !wex__name_printable(dev))
			return wex__reply_error(-EINVAL,
						"attach: device must be a printable name under %zu bytes",
						sizeof(c->device));
	}
	if (nfds == 1) {
		json_t *e = table_room(d, "attach", fds[0], c->nlayout);

		if (e)
			return e;
		ret = wex__table_unpack(fds[0], &t, NULL, &n, err, sizeof(err));
		if (ret < 0)
			return wex__reply_error(ret, "attach: %s", err);
		if ((e = table_room_n(d, "attach", t, n, c->nlayout)))
			return e;
	}
	free(c->layout);
	d->table_bytes += n * sizeof(*t) - c->nlayout * sizeof(*c->layout);
	c->layout = t;
	c->nlayout = n;
	snprintf(c->device, sizeof(c->device), "%s", dev);
	/* FNV-1a over the table and the device: plans are cached per
	 * consumer layout, and depend on where it lives. */
	uint64_t h = 1469598103934665603ull;
	const unsigned char *p = (const unsigned char *)t;

	for (size_t i = 0; i < n * sizeof(*t); i++)
		h = (h ^ p[i]) * 1099511628211ull;
	for (p = (const unsigned char *)c->device; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	c->layout_hash = h;
	/* New buffers: until this rank syncs into them it holds no version
	 * (a round its peers open, or the one open now, waits for it). */
	c->served_version = 0;
	/* Unless this is a reconnect's re-send (its first attach on this
	 * connection, "held": the version those buffers hold, as an acquire
	 * says) of buffers holding the open round's version, which the
	 * producers restored (the bytes the old wexd served): a pass of that
	 * round (the take its process made from before this wexd) stays,
	 * written down for this connection.  Before, the round waited for
	 * the rank again, idle with the version, and held the producer off
	 * until it synced again. */
	struct cgroup *g = c->group;

	if (g && first && hv && g->round_open && g->taken[c->rank] &&
	    (uint64_t)json_integer_value(hv) == g->round_version &&
	    g->round_version == c->model->published && c->model->published_restored) {
		/* Serving it, as a sync of it here would say: a round a peer
		 * opens again on that version passes this rank (round_open_now)
		 * rather than wait for it, idle with the version. */
		c->served_version = g->round_version;
		c->served_epoch = c->model->epoch;
		lease_note(c);
	} else if (g)
		round_untake(g, c->rank);
	return json_pack("{s:b, s:I, s:I}", "ok", 1, "count", (json_int_t)n, "published",
			 (json_int_t)c->model->published);
}

static int acquire_try(struct wexd *d, struct conn *c, json_t **reply)
{
	struct model *m = c->model;
	struct cgroup *g = c->group;
	uint64_t v;
	int opened = 0;

	if (g->round_open && !g->taken[c->rank]) {
		v = g->round_version;
		if (v < c->wait_version && c->wait_held == v && v == m->published &&
		    (m->published_restored ||
		     (c->served_version == v && c->served_epoch == m->epoch))) {
			/* This rank holds the round's version already (it took
			 * it from a wexd that restarted since, which this one
			 * never saw: the producers restored the version, the
			 * same bytes; or from this one, in a round a peer that
			 * restarted since opened again) and asks for a newer
			 * one: it will never take this round, whose hold would
			 * keep the producer from writing the version it waits
			 * for.  It passes (2: taken without a lease); the group
			 * stays on one version.  A rank that does not hold it
			 * waits, as every rank must take the same version. */
			g->taken[c->rank] = 2;
			g->ntaken++;
			if (g->ntaken == g->world)
				round_close(d, m, g);
			else
				lease_note(c);
			d->round_passed = 1;
			return 0;
		}
		if (v < c->wait_version)
			return 0;
	} else if (g->round_open) {
		/* This rank already took the round (1) or passed it (2: it held
		 * the version, or the slot's previous process did): for a newer
		 * version, peers first.  One that asks for the round's version
		 * again takes it again at once, counted once (a repeated
		 * request, as while a peer never syncs): the group stays on
		 * one version. */
		if (g->round_version < c->wait_version)
			return 0;
		v = g->round_version;
		g->ntaken--;
	} else {
		/* A rank of this group holds the published version from before
		 * this wexd (struct held): its lease, or its take of the round
		 * the group had open, keeps the writer off anyway. */
		int held = m->held && m->published &&
			   held_in_group(d, m, g, m->published, c->rank, 0);

		if (!m->published || m->writing)
			return 0;
		if (m->published < c->wait_version) {
			/* This rank holds that version too (it took it from an
			 * earlier wexd, and the producers restored it) and asks
			 * for a newer one: it passes the round its group had
			 * open on it (written down as its peers' takes, which
			 * opening it ends: this is done once), as in the first
			 * branch above, so that the round no longer waits for
			 * it. */
			if (held && c->wait_held == m->published && m->published_restored &&
			    held_in_group(d, m, g, m->published, c->rank, 1) &&
			    round_open_now(d, m, g, c->rank)) {
				g->taken[c->rank] = 2;
				g->ntaken++;
				if (g->ntaken == g->world)
					round_close(d, m, g);
				else
					round_note_passed(g);
				d->round_passed = 1;
			}
			return 0;
		}
		/* A writer waiting keeps new rounds off, but not one on a
		 * version a rank of this group holds from before this wexd:
		 * the group must all take it (one version), and the writer
		 * waits for that rank anyway.  Before, the writer waited for
		 * that rank, and this one for the writer, until one of them
		 * timed out. */
		if (m->write_pending && !held)
			return 0;
		if (!round_open_now(d, m, g, c->rank))
			return 0;
		opened = 1;
		v = m->published;
	}
	g->taken[c->rank] = 1;
	g->ntaken++;
	if (g->lost[c->rank]) {
		/* It moves on from a lost round (it may have waited since
		 * before the memory went, unchecked). */
		g->lost[c->rank] = 0;
		g->nlost--;
	}
	c->has_lease = 1;
	c->lease_version = v;
	c->lease_epoch = m->epoch;
	c->lease_mode = c->wait_mode;
	m->leases++;
	if (g->ntaken == g->world)
		round_close(d, m, g);
	else if (opened)
		round_note_passed(g); /* (those opening it passed) */
	lease_note(c);
	c->waiting = WAIT_NONE;
	c->syncs++;
	c->last_sync_ns = wex__now_ns();
	c->served_version = v;
	c->served_epoch = m->epoch;
	*reply = json_pack("{s:b, s:I, s:I, s:f}", "ok", 1, "version", (json_int_t)v, "layout_gen",
			   (json_int_t)m->layout_gen, "waited_ms",
			   (double)(wex__now_ns() - c->wait_start_ns) / 1e6);
	wexd_verify_ask(c, *reply);
	return 1;
}

/* An acquire refused before it was taken on leaves the previous lease
 * held; the reply says so, and the client keeps it (anything else - a
 * timeout, a wait ended by shutdown - has dropped it). */
static json_t *lease_kept(struct conn *c, json_t *reply)
{
	if (c->has_lease)
		json_object_set_new(reply, "lease_kept", json_true());
	return reply;
}

json_t *wexd_acquire(struct wexd *d, struct conn *c, json_t *req)
{
	json_int_t minv = 0, timeout = -1, mode = WEX_SYNC_COPY, held = 0;
	json_error_t je;
	json_t *reply = NULL;

	if (c->role != WEX_ROLE_CONSUMER)
		return wex__reply_error(-EPERM, "acquire: only consumers acquire");
	if (json_unpack_ex(req, &je, 0, "{s?I, s?I, s?I, s?I}", "min_version", &minv, "timeout_ms",
			   &timeout, "mode", &mode, "held", &held) < 0)
		return lease_kept(c, wex__reply_error(-EINVAL, "acquire: %s", je.text));
	if (mode < WEX_SYNC_COPY || mode > WEX_SYNC_REMAP_FIXED)
		return lease_kept(c, wex__reply_error(-EINVAL, "acquire: mode %lld unknown",
						      (long long)mode));
	if (minv < 0)
		return lease_kept(c, wex__reply_error(-EINVAL, "acquire: min_version %lld is negative",
						      (long long)minv));
	if (timeout > (json_int_t)UINT32_MAX) /* see begin_write */
		return lease_kept(c, wex__reply_error(-EINVAL, "acquire: timeout_ms %lld exceeds %u",
						      (long long)timeout, UINT32_MAX));
	if (d->draining)
		return lease_kept(c, wex__reply_error(-ESHUTDOWN, "acquire: wexd is shutting down"));
	/* Re-syncing a version this rank holds (a switch of mode) keeps the
	 * lease.  Otherwise a new sync ends the previous rollout's lease: in
	 * single-buffer mode the producer cannot write while it is held. */
	if (c->has_lease && minv && (uint64_t)minv <= c->lease_version &&
	    c->lease_epoch == c->model->epoch && !c->lease_reclaimed) {
		struct cgroup *g = c->group;

		if (c->lease_mode != (int)mode) {
			c->lease_mode = (int)mode;
			lease_note(c); /* written down only as a remap lease */
		}
		/* It takes the version again (into the buffers it attached
		 * since, which un-took it): an open round on that version
		 * counts it once more, or would wait for it for good (the
		 * producer's begin_write EBUSY, the group's next sync
		 * ETIMEDOUT).  A failed copy's release un-takes it again. */
		if (g->round_open && g->round_version == c->lease_version && !g->taken[c->rank]) {
			g->taken[c->rank] = 1;
			if (++g->ntaken == g->world)
				round_close(d, c->model, g);
			lease_note(c);
		}
		c->served_version = c->lease_version;
		c->served_epoch = c->model->epoch;
		c->syncs++;
		c->last_sync_ns = wex__now_ns();
		reply = json_pack("{s:b, s:I, s:I, s:f, s:b}", "ok", 1, "version",
				  (json_int_t)c->lease_version, "layout_gen",
				  (json_int_t)c->model->layout_gen, "waited_ms", 0.0, "kept", 1);
		wexd_verify_ask(c, reply);
		return reply;
	}
	if (c->group->nlost) {
		struct cgroup *g = c->group;

		if (!g->lost[c->rank])
			return lease_kept(c, wex__reply_error(
				-ESTALE, "acquire: %u rank(s) of group '%s' hold v%llu from a round that was "
				"lost when the producer's memory went; every rank of the group must sync "
				"again before any gets another version", g->nlost, g->name,
				(unsigned long long)g->lost_version));
		g->lost[c->rank] = 0; /* this holder moves on */
		g->nlost--;
		lease_note(c);
	}
	lease_drop(c->model, c);
	c->waiting = WAIT_ACQUIRE;
	c->wait_version = (uint64_t)minv;
	c->wait_held = held > 0 ? (uint64_t)held : 0;
	c->wait_mode = (int)mode;
	c->wait_start_ns = wex__now_ns();
	if (timeout < 0)
		timeout = d->sync_timeout_ms;
	c->wait_deadline_ns = c->wait_start_ns + (uint64_t)timeout * 1000000ull;
	if (acquire_try(d, c, &reply))
		return reply;
	return NULL;
}

json_t *wexd_release(struct wexd *d, struct conn *c, json_t *req)
{
	json_int_t v = 0;
	json_error_t je;
	int failed = 0;

	if (c->role != WEX_ROLE_CONSUMER)
		return wex__reply_error(-EPERM, "release: only consumers hold leases");
	if (json_unpack_ex(req, &je, 0, "{s?I, s?b}", "version", &v, "failed", &failed) < 0)
		return wex__reply_error(-EINVAL, "release: %s", je.text);
	if (!c->has_lease)
		return wex__reply_error(-ENOENT, "release: no lease held");
	if (v && (uint64_t)v != c->lease_version)
		return wex__reply_error(-EINVAL, "release: lease is on v%llu, not v%lld",
					(unsigned long long)c->lease_version, (long long)v);
	/* The sync under it failed: the rank may not hold the version (a
	 * copy that stopped half-way), so a round its peers open on it
	 * waits for this rank instead of passing it. */
	if (failed && c->served_version == c->lease_version)
		c->served_version = 0;
	/* And if it took its group's open round on that version, the round
	 * waits for it again (its peers must not close it, and the producer
	 * write the next version, while it holds no good copy); its retry
	 * takes the version at once. */
	if (failed && c->group->round_open && c->group->round_version == c->lease_version)
		round_untake(c->group, c->rank);
	lease_drop(c->model, c);
	return wex__reply_ok();
}

/* ---------------------------------------------------------------------- */
/* Fetch: segments (fds), tensor tables and the consumer's plan.           */

static const char *kind_name(int k)
{
	return k == WEX_MEM_HOST ? "host" : k == WEX_MEM_CUDA_VMM ? "cuda_vmm" : "cuda_ipc";
}

static int tables_fd(struct model *m)
{
	struct wex_tensor *all;
	uint32_t *ranks;
	size_t n = 0, k = 0;
	int fd;

	if (m->tables_fd >= 0)
		return m->tables_fd;
	for (uint32_t i = 0; i < m->world; i++)
		n += m->ranks[i].nt;
	all = calloc(n ? n : 1, sizeof(*all));
	ranks = calloc(n ? n : 1, sizeof(*ranks));
	if (!all || !ranks) {
		free(all);
		free(ranks);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < m->world; i++)
		for (size_t j = 0; j < m->ranks[i].nt; j++) {
			/* Millions of pieces take seconds (wexd's watchdog). */
			if (!(k & 0x3fff))
				wex__plan_tick();
			all[k] = m->ranks[i].t[j];
			ranks[k++] = i;
		}
	fd = wex__table_pack(all, ranks, n);
	free(all);
	free(ranks);
	if (fd >= 0)
		m->tables_fd = fd;
	return fd;
}

static void table_free(struct wexd *d, struct wex_tensor *t)
{
	/* A table a job reads is kept by one such job, once: kept, its
	 * address is not handed out again while it is, so a job keeps no
	 * more tables than it has sources.  The job that ends first hands
	 * it on to another that reads it (plan_job_free). */
	for (struct plan_job *j = d->plan_jobs; t && j; j = j->next)
		for (uint32_t i = 0; i < j->nsrc; i++)
			if (j->srcs[i].t == t) {
				j->keep[j->nkeep++] = t;
				return;
			}
	free(t);
}

/* Stops the plans being built for m's producer layout (it changed, or m
 * goes): their threads end soon after, their plans thrown away. */
static void plan_jobs_cancel(struct wexd *d, const struct model *m)
{
	for (struct plan_job *j = d->plan_jobs; j; j = j->next)
		if (j->m == m)
			atomic_store(&j->cancel, 1);
}

static struct plan_entry *plan_cached(struct model *m, struct conn *c)
{
	for (struct plan_entry *p = m->plans; p; p = p->next)
		if (plan_fits(p, m, c)) {
			p->uses++;
			return p;
		}
	return NULL;
}

static void *plan_job_run(void *arg)
{
	struct plan_job *j = arg;
	struct plan_entry *p = j->p;
	uint64_t one = 1;

	wex__plan_cancel_set(&j->cancel);
	j->ret = wex__plan_build(j->srcs, j->nsrc, p->layout, p->nlayout, p->crank, p->cworld,
				 &p->plan, j->err, sizeof(j->err));
	if (!j->ret) {
		p->build_ms = (double)(wex__now_ns() - j->start_ns) / 1e6;
		p->fd = wex__plan_pack(p->plan);
		if (p->fd < 0) {
			j->ret = p->fd;
			snprintf(j->err, sizeof(j->err), "cannot make the plan's sealed memfd: %s%s",
				 strerror(-p->fd), fds_hint(p->fd));
		}
	}
	atomic_store(&j->done, 1);
	/* (An eventfd's counter cannot overflow at one write a job.) */
	(void)!write(j->efd, &one, sizeof(one));
	return NULL;
}

/* Frees job j, already unlinked from d->plan_jobs (its thread joined):
 * the tables it kept go to another job that reads them, or are freed. */
static void plan_job_free(struct wexd *d, struct plan_job *j)
{
	for (uint32_t i = 0; i < j->nkeep; i++)
		table_free(d, j->keep[i]);
	if (j->p)
		plan_entry_free(j->p);
	free(j->keep);
	free(j->srcs);
	free(j->near);
	free(j);
}

/* Starts building consumer c's plan on a thread of its own. */
static int plan_job_start(struct wexd *d, struct model *m, struct conn *c, char *err,
			  size_t errlen)
{
	struct plan_job *j = calloc(1, sizeof(*j));
	struct plan_entry *p = calloc(1, sizeof(*p));
	size_t nsegs = 0;
	int ret;

	if (j)
		j->p = p;
	if (p)
		p->fd = -1;
	for (uint32_t i = 0; i < m->world; i++)
		nsegs += m->ranks[i].nsegs;
	if (!j || !p || !(j->srcs = calloc(m->world ? m->world : 1, sizeof(*j->srcs))) ||
	    !(j->keep = calloc(m->world ? m->world : 1, sizeof(*j->keep))) ||
	    !(j->near = calloc(nsegs ? nsegs : 1, 1)) ||
	    (c->nlayout && !(p->layout = malloc(c->nlayout * sizeof(*c->layout))))) {
		if (j)
			plan_job_free(d, j);
		else
			free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Near: segments on the consumer's GPU (a rank may also hold host
	 * segments, whose elements a replica on another GPU serves as well). */
	nsegs = 0;
	for (uint32_t i = 0; i < m->world; i++) {
		int any = 0;

		j->srcs[i].rank = i;
		j->srcs[i].t = m->ranks[i].t;
		j->srcs[i].n = m->ranks[i].nt;
		j->srcs[i].near_seg = j->near + nsegs;
		j->srcs[i].nnear_seg = m->ranks[i].nsegs;
		for (uint32_t s = 0; c->device[0] && s < m->ranks[i].nsegs; s++)
			if (!strcmp(m->ranks[i].segs[s].desc.device, c->device))
				j->near[nsegs + s] = 1, any = 1;
		nsegs += m->ranks[i].nsegs;
		p->near += (uint32_t)any;
	}
	j->nsrc = m->world;
	j->m = m;
	j->efd = d->plan_efd;
	j->start_ns = wex__now_ns();
	snprintf(j->group, sizeof(j->group), "%s", c->group->name);
	snprintf(j->model, sizeof(j->model), "%s", m->name);
	p->layout_gen = m->layout_gen;
	p->consumer_hash = c->layout_hash;
	p->nlayout = c->nlayout;
	if (c->nlayout)
		memcpy(p->layout, c->layout, c->nlayout * sizeof(*c->layout));
	p->crank = c->rank;
	p->cworld = c->group->world;
	snprintf(p->device, sizeof(p->device), "%s", c->device);
	if ((ret = pthread_create(&j->thread, NULL, plan_job_run, j))) {
		plan_job_free(d, j);
		snprintf(err, errlen, "cannot start a planner thread: %s", strerror(ret));
		return -ret;
	}
	j->next = d->plan_jobs;
	d->plan_jobs = j;
	d->plan_njobs++;
	wex_debug("planner", "model '%s': building the plan for group '%s' rank %u on a thread of its own (%u being built)",
		  m->name, c->group->name, c->rank, d->plan_njobs);
	return 0;
}

/* Consumer c needs a plan no cached one fits: waits for the one being
 * built for it, or has one built (once fewer than planner_threads are).
 * 0: c waits (WAIT_PLAN); else an error. */
static int plan_wait(struct wexd *d, struct model *m, struct conn *c, char *err, size_t errlen)
{
	struct plan_job *j;

	for (j = d->plan_jobs; j; j = j->next)
		if (j->m == m && plan_fits(j->p, m, c))
			break;
	if (!j && d->plan_njobs < (uint64_t)d->cfg.planner_threads) {
		int ret;

		/* Before caching another plan, forget those no connected
		 * consumer can use: a consumer attaching layout after layout,
		 * or a producer registering segment after segment, would
		 * otherwise grow the cache (one sealed memfd each) until wexd
		 * ran out of fds. */
		plans_gc(m);
		if ((ret = plan_job_start(d, m, c, err, errlen)) < 0)
			return ret;
	}
	c->waiting = WAIT_PLAN;
	c->wait_version = c->lease_version;
	c->wait_start_ns = wex__now_ns();
	c->wait_deadline_ns = UINT64_MAX; /* the client's own timeout ends it */
	return 0;
}

static json_t *fetch_page(struct wexd *d, struct conn *c, json_int_t start);

static int wait_start_cmp(const void *a, const void *b)
{
	const struct conn *x = *(struct conn *const *)a, *y = *(struct conn *const *)b;

	return x->wait_start_ns < y->wait_start_ns ? -1 : x->wait_start_ns > y->wait_start_ns;
}

/* A fetch still waiting for a plan asks again, keeping the time its wait
 * began. */
static void plan_retry(struct wexd *d, struct conn *c)
{
	uint64_t since = c->wait_start_ns;
	json_t *reply;

	if (c->dead || c->waiting != WAIT_PLAN)
		return;
	/* A client that gave up meanwhile (its hang-up not yet read) would
	 * otherwise start a plan of seconds no one waits for. */
	if (wexd_conn_close_if_gone(d, c))
		return;
	c->waiting = WAIT_NONE;
	if ((reply = fetch_page(d, c, 0))) {
		wexd_send(d, c, reply, NULL, 0);
		json_decref(reply);
	}
	if (c->waiting == WAIT_PLAN)
		c->wait_start_ns = since;
}

/* The fetches still waiting for a plan ask again, the longest waiting
 * first (it starts the next plan): in d->conns' order, newest first, a
 * fetch could be passed over by newer ones until its client gave up. */
static void plan_waiters_retry(struct wexd *d)
{
	struct conn **w;
	size_t n = 0, k = 0;

	for (struct conn *c = d->conns; c; c = c->next)
		n += !c->dead && c->waiting == WAIT_PLAN;
	if (n > 1 && (w = malloc(n * sizeof(*w)))) {
		for (struct conn *c = d->conns; c; c = c->next)
			if (!c->dead && c->waiting == WAIT_PLAN)
				w[k++] = c;
		qsort(w, n, sizeof(*w), wait_start_cmp);
		for (size_t i = 0; i < n; i++)
			plan_retry(d, w[i]);
		free(w);
		return;
	}
	/* (One, or out of memory: in the list's order.) */
	for (struct conn *c = d->conns; c; c = c->next)
		plan_retry(d, c);
}

/* Job j's thread is done (joined, j unlinked): its plan is cached for the
 * model (unless the producers' layout changed meanwhile, or the model
 * went), or its error answers the fetches that waited for that plan. */
static void plan_job_end(struct wexd *d, struct plan_job *j)
{
	struct model *m = j->m;
	struct plan_entry *p = j->p;

	if (m && p->layout_gen == m->layout_gen && !j->ret) {
		p->uses = 0;
		p->next = m->plans;
		m->plans = p;
		j->p = NULL;
		wex_info("planner", "model '%s' plan for group '%s' rank %u: %zu ops, %llu bytes, %.2f ms%s%s%s",
			 m->name, j->group, p->crank, p->plan->nops,
			 (unsigned long long)p->plan->stats.bytes_moved, p->build_ms,
			 p->device[0] ? ", on " : "", p->device,
			 !p->device[0] ? "" : p->near ? " (read from producer ranks there first)" :
			 " (no producer rank there)");
	} else if (m && p->layout_gen == m->layout_gen) {
		for (struct conn *c = d->conns; c; c = c->next) {
			json_t *reply;

			if (c->dead || c->waiting != WAIT_PLAN || c->model != m || !plan_fits(p, m, c))
				continue;
			c->waiting = WAIT_NONE;
			reply = wex__reply_error(j->ret, "plan: %s", j->err);
			wexd_send(d, c, reply, NULL, 0);
			json_decref(reply);
		}
	} else if (j->ret == -ECANCELED) {
		wex_info("planner", "model '%s': the plan for group '%s' rank %u stopped after %.2f s: %s",
			 j->model, j->group, p->crank,
			 (double)(wex__now_ns() - j->start_ns) / 1e9,
			 m ? "the producers' layout changed" : "the model went");
	}
	plan_job_free(d, j);
}

/* Some planner threads are done: each such job ends (plan_job_end), and
 * the fetches still waiting ask again (one may start the next plan). */
static void plan_jobs_done(void *arg, int fd, int res)
{
	struct wexd *d = arg;
	struct plan_job **jp = &d->plan_jobs, *j;
	uint64_t n;
	int ended = 0;

	(void)res;
	if (read(fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
		return;
	while ((j = *jp)) {
		if (!atomic_load(&j->done)) {
			jp = &j->next;
			continue;
		}
		*jp = j->next;
		d->plan_njobs--;
		pthread_join(j->thread, NULL);
		plan_job_end(d, j);
		ended = 1;
	}
	if (ended)
		plan_waiters_retry(d);
}

/* planner_threads may have grown (config set, a reload): fetches waiting
 * for a thread start their plans now, not when a running one ends. */
void wexd_plan_config(struct wexd *d)
{
	if (d->plan_njobs < (uint64_t)d->cfg.planner_threads)
		plan_waiters_retry(d);
}

int wexd_plan_init(struct wexd *d)
{
	d->plan_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (d->plan_efd < 0)
		return -errno;
	d->plan_watch.fd = d->plan_efd;
	d->plan_watch.cb = plan_jobs_done;
	d->plan_watch.arg = d;
	return d->loop.ops->watch(&d->loop, &d->plan_watch);
}

void wexd_plan_exit(struct wexd *d)
{
	for (struct plan_job *j = d->plan_jobs; j; j = j->next) {
		/* Joined, it would hold the exit for the rest of the plan (up
		 * to a minute at the planner's bounds): its thread ends with
		 * the process, its job and eventfd untouched till then. */
		wex_info("planner", "exiting while a plan was built for %.1f s: it is dropped",
			 (double)(wex__now_ns() - j->start_ns) / 1e9);
		atomic_store(&j->cancel, 1);
		pthread_detach(j->thread);
	}
	if (!d->plan_jobs && d->plan_efd >= 0)
		close(d->plan_efd);
}

#define FETCH_FDS_PER_MSG 60
/* Segments without an fd (legacy CUDA IPC handles, chained segments) cost
 * only bytes: a page also ends at this many bytes of segment entries, far
 * below what one message can carry (the socket's send buffer, about 208
 * KiB).  A page holds at least one entry, however large. */
#define FETCH_BYTES_PER_MSG (64 * 1024)

json_t *wexd_fetch(struct wexd *d, struct conn *c, json_t *req)
{
	json_int_t start = 0;
	json_error_t je;

	if (c->role != WEX_ROLE_CONSUMER)
		return wex__reply_error(-EPERM, "fetch: only consumers fetch");
	if (json_unpack_ex(req, &je, 0, "{s?I}", "start", &start) < 0)
		return wex__reply_error(-EINVAL, "fetch: %s", je.text);
	/* (Before the first page, it was answered as an empty page.) */
	if (start < 0)
		return wex__reply_error(-EINVAL, "fetch: start %lld is negative (segment indexes count from 0)",
					(long long)start);
	return fetch_page(d, c, start);
}

/* Sends the page from segment `start` (the first: with the tables and
 * the plan), or leaves c waiting for its plan; NULL, or an error reply. */
static json_t *fetch_page(struct wexd *d, struct conn *c, json_int_t start)
{
	json_t *reply, *segs;
	int fds[FETCH_FDS_PER_MSG + 2], nfds = 0, ret;
	struct model *m = c->model;
	char err[EMSG_LEN] = "";
	uint64_t idx = 0;
	size_t bytes = 0;

	if (!m->world)
		return wex__reply_error(-WEX_ENOPUBLISHED, "fetch: model '%s' has no producer", m->name);
	if (c->has_lease && c->lease_epoch != m->epoch)
		return wex__reply_error(-ESTALE, "fetch: the producer's memory behind v%llu changed "
					"since it was acquired (a producer rank left or registered other "
					"memory): sync again", (unsigned long long)c->lease_version);
	for (uint32_t i = 0; i < m->world; i++)
		if (!m->ranks[i].c || !m->ranks[i].has_table)
			return wex__reply_error(-EAGAIN, "fetch: producer rank %u of model '%s' is not registered",
						i, m->name);
	reply = json_pack("{s:b, s:I, s:i, s:i, s:i}", "ok", 1, "layout_gen",
			  (json_int_t)m->layout_gen, "world", m->world, "tables_fd", -1, "plan_fd",
			  -1);
	segs = json_array();
	json_object_set_new(reply, "segments", segs);
	if (start == 0) {
		ret = tables_fd(m);
		if (ret < 0) {
			json_decref(reply);
			return wex__reply_error(ret, "fetch: cannot make the tensor tables' sealed memfd: %s%s",
						strerror(-ret), fds_hint(ret));
		}
		json_object_set_new(reply, "tables_fd", json_integer(nfds));
		fds[nfds++] = ret;
		if (c->nlayout) {
			struct plan_entry *p = plan_cached(m, c);

			if (!p) {
				json_decref(reply);
				if ((ret = plan_wait(d, m, c, err, sizeof(err))) < 0)
					return wex__reply_error(ret, "plan: %s", err);
				return NULL;
			}
			json_object_set_new(reply, "plan_fd", json_integer(nfds));
			fds[nfds++] = p->fd;
			json_object_set_new(reply, "plan",
					    json_pack("{s:I, s:I, s:I, s:I, s:f}", "ops",
						      (json_int_t)p->plan->nops, "bytes_needed",
						      (json_int_t)p->plan->stats.bytes_needed,
						      "bytes_moved",
						      (json_int_t)p->plan->stats.bytes_moved, "hash",
						      (json_int_t)(p->plan->hash >> 1), "build_ms",
						      p->build_ms));
		}
	}
	for (uint32_t i = 0; i < m->world; i++) {
		struct prank *r = &m->ranks[i];

		for (uint32_t s = 0; s < r->nsegs; s++, idx++) {
			char hex[2 * WEX_HANDLE_MAX + 1];
			json_t *js;
			size_t len;

			if (idx < (uint64_t)start)
				continue;
			if (nfds >= FETCH_FDS_PER_MSG) {
				json_object_set_new(reply, "more", json_integer((json_int_t)idx));
				goto send;
			}
			for (uint32_t b = 0; b < r->segs[s].desc.handle_len; b++)
				sprintf(hex + 2 * b, "%02x", r->segs[s].desc.handle[b]);
			hex[2 * r->segs[s].desc.handle_len] = '\0';
			js = json_pack("{s:i, s:i, s:s, s:I, s:s, s:s, s:I, s:I, s:i}", "rank", i,
				       "id", s, "kind", kind_name(r->segs[s].desc.kind), "size",
				       (json_int_t)r->segs[s].desc.size, "device",
				       r->segs[s].desc.device, "handle", hex, "handle_offset",
				       (json_int_t)r->segs[s].desc.handle_offset, "alloc_size",
				       (json_int_t)r->segs[s].desc.alloc_size, "fd",
				       r->segs[s].fd >= 0 ? nfds : -1);
			if (r->segs[s].part)
				json_object_set_new(js, "part", json_true());
			if (r->segs[s].nparts) {
				json_t *pa = json_array();

				for (uint32_t q = 0; q < r->segs[s].nparts; q++)
					json_array_append_new(pa, json_integer(r->segs[s].parts[q]));
				json_object_set_new(js, "parts", pa);
			}
			len = json_dumpb(js, NULL, 0, JSON_COMPACT);
			if (bytes && bytes + len > FETCH_BYTES_PER_MSG) {
				json_decref(js);
				json_object_set_new(reply, "more", json_integer((json_int_t)idx));
				goto send;
			}
			bytes += len;
			if (r->segs[s].fd >= 0)
				fds[nfds++] = r->segs[s].fd;
			json_array_append_new(segs, js);
		}
	}
send:
	ret = wexd_send(d, c, reply, fds, nfds);
	json_decref(reply);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Disconnects, waiters.                                                   */

void wexd_conn_drop(struct wexd *d, struct conn *c)
{
	struct model *m = c->model;

	if (!m) {
		c->role = 0;
		return;
	}
	if (c->waiting == WAIT_BEGIN_WRITE && m->write_pending)
		m->write_pending--;
	c->waiting = WAIT_NONE;
	if (c->role == WEX_ROLE_PRODUCER) {
		struct prank *r = &m->ranks[c->rank];

		wex_info("registry", "producer rank %u of model '%s' (pid %d) left%s", c->rank,
			 m->name, (int)c->pid,
			 r->writing ? " while writing: the version stays unpublished" : "");
		prank_clear(d, r);
		r->c = NULL;
		r->writing = 0;
		/* Its bytes lived in the client: the rank no longer holds any
		 * version until it publishes again (acquire checks this), and a
		 * round open on the old version must not hand out the
		 * successor's fresh memory under that version's name. */
		r->published = 0;
		memory_gone(d, m);
		/* A write that no live rank continues is over: without this the
		 * model stayed "writing" forever and a restarted producer's
		 * begin_write of a newer version was refused.  A version some
		 * rank already published stays pending (others hold its bytes). */
		{
			int busy = 0;

			for (uint32_t i = 0; i < m->world; i++)
				busy |= m->ranks[i].writing != 0 ||
					m->ranks[i].published > m->published;
			if (!busy)
				m->writing = 0;
		}
		model_invalidate(d, m);
		plans_free(m);
	} else if (c->role == WEX_ROLE_CONSUMER) {
		struct cgroup *g = c->group;
		int any = 0;

		if (g->lost[c->rank]) {
			g->lost[c->rank] = 0;
			g->nlost--;
		}

		if (c->has_lease)
			wex_info("registry", "consumer rank %u of group '%s' (pid %d) left holding v%llu: lease dropped",
				 c->rank, g->name, (int)c->pid,
				 (unsigned long long)c->lease_version);
		/* The slot's next process holds nothing: the open round waits
		 * for it, and it takes the round's version at once. */
		round_untake(g, c->rank);
		lease_drop(m, c);
		wex__journal_del(&d->journal, &c->lease_fd, c->lease_file);
		c->lease_noted = 0;
		wexd_verify_left(g, c);
		g->ranks[c->rank] = NULL;
		plans_gc(m);
		for (uint32_t i = 0; i < g->world; i++)
			any |= g->ranks[i] != NULL;
		/* With no rank left to take it, the group's round hold would
		 * block the producer forever; and the group itself goes (a
		 * rank that comes back makes it again, with the world it says):
		 * groups that only ever grew would let one client fill wexd's
		 * memory, and its status replies, with empty rank slots. */
		if (!any) {
			/* A take from before this wexd that the round passed
			 * stays held, as it would were its process connected:
			 * that process holds the version, the group's other
			 * ranks not (before, it ended here, the producer wrote
			 * the next version, and the slot's next process got it
			 * while that rank served this one).  A new round on
			 * that version passes it again. */
			round_end(d, m, g, 0);
			group_free(m, g);
		}
		c->group = NULL;
	}
	free(c->layout);
	d->table_bytes -= c->nlayout * sizeof(*c->layout);
	c->layout = NULL;
	c->nlayout = 0;
	c->model = NULL;
	c->role = 0;
	model_maybe_free(d, m);
}

/*
 * For a sync that timed out: when no producer of the model is connected
 * and none ever published, the likeliest cause is a misspelt model name (or a trainer
 * that never started), so say so and name the models that do have
 * producers.  When producers are connected but none published yet, how
 * many are and how many did.  Writes "" otherwise.
 */
static void no_producer_hint(struct wexd *d, struct model *m, char *out, size_t len)
{
	uint32_t up = 0, wrote = 0;
	size_t l;
	int n = 0;

	out[0] = '\0';
	if (m->published)
		return;
	for (uint32_t i = 0; i < m->world; i++) {
		up += m->ranks[i].c != NULL;
		wrote += m->ranks[i].c && m->ranks[i].published;
	}
	if (up) {
		/* Its trainer is there but never published (or not every
		 * rank has yet): say that, not only "published v0". */
		snprintf(out, len, "; no version of it is published yet: %u of %u producer ranks "
			 "connected, %u of them published (a version is visible once every rank "
			 "publishes it)", up, m->world, wrote);
		return;
	}
	snprintf(out, len, "; no producer of model '%s' is connected: check the model name "
		 "(models with producers:", m->name);
	for (struct model *o = d->models; o; o = o->next) {
		int live = 0;

		for (uint32_t i = 0; i < o->world && !live; i++)
			live = o->ranks[i].c != NULL;
		if (o == m || !live)
			continue;
		l = strlen(out);
		snprintf(out + l, len - l, "%s '%s'", n++ ? "," : "", o->name);
	}
	l = strlen(out);
	snprintf(out + l, len - l, "%s)", n ? "" : " none");
}

int wexd_service_waiters(struct wexd *d)
{
	uint64_t now = wex__now_ns(), next = UINT64_MAX;
	int progress = 1;

	/* Granting one request may unblock another (a release lets a writer in;
	 * a publish lets readers in), so repeat until nothing moves. */
	while (progress) {
		progress = 0;
		for (struct conn *c = d->conns; c; c = c->next) {
			json_t *reply = NULL;

			/* (A fetch's plan: answered as the planner's thread
			 * is done, plan_job_done.) */
			if (c->dead || c->waiting == WAIT_NONE || c->waiting == WAIT_PLAN)
				continue;
			if (c->waiting == WAIT_BEGIN_WRITE && begin_write_try(d, c, &reply)) {
				progress = 1;
			} else if (c->waiting == WAIT_ACQUIRE && acquire_try(d, c, &reply)) {
				progress = 1;
			} else if (d->round_passed) {
				/* The round it passed closed: a writer may go. */
				d->round_passed = 0;
				progress = 1;
			} else if (now >= c->wait_deadline_ns) {
				char who[EMSG_LEN];
				struct model *m = c->model;

				if (c->waiting == WAIT_BEGIN_WRITE) {
					describe_leases(d, m, who, sizeof(who));
					if (m->write_pending)
						m->write_pending--;
					/* The longest waits are those that time
					 * out: they count as much as granted ones. */
					wex__metrics_observe(WEX_M_BEGIN_WRITE_WAIT, NULL,
							     (double)(now - c->wait_start_ns) / 1e9);
					wex__metrics_count(WEX_M_BEGIN_WRITE_TIMEOUTS, m->name, NULL, 1);
					reply = wex__reply_error(-EBUSY,
								 "begin_write v%llu of model '%s': %u lease(s) still held after %llu ms: %s",
								 (unsigned long long)c->wait_version, m->name,
								 m->leases,
								 (unsigned long long)((now - c->wait_start_ns) / 1000000),
								 who);
				} else {
					struct cgroup *g = c->group;

					no_producer_hint(d, m, who, sizeof(who));
					/* Its own group's round holds the producers
					 * off the version it waits for, until it
					 * takes the round's: the wait cannot end. */
					if (g && g->round_open && !g->taken[c->rank] &&
					    g->round_version < c->wait_version)
						snprintf(who, sizeof(who),
							 "; group '%s' has a round open on v%llu that waits for this rank (it did not take v%llu from this wexd) and holds the producers off newer versions: sync with min_version %llu or 0 first",
							 g->name, (unsigned long long)g->round_version,
							 (unsigned long long)g->round_version,
							 (unsigned long long)g->round_version);
					reply = wex__reply_error(-ETIMEDOUT,
								 "acquire: no version >= %llu of model '%s' available to group '%s' within %llu ms (published v%llu%s)%s",
								 (unsigned long long)c->wait_version, m->name,
								 c->group->name,
								 (unsigned long long)((now - c->wait_start_ns) / 1000000),
								 (unsigned long long)m->published,
								 m->writing ? ", a write is in progress" : "",
								 who);
				}
				c->waiting = WAIT_NONE;
				progress = 1;
			} else if (c->wait_deadline_ns < next) {
				next = c->wait_deadline_ns;
			}
			/* Waiting for leases from before this wexd: look for
			 * their processes' exit now and then. */
			if (c->waiting == WAIT_BEGIN_WRITE && c->model->held &&
			    now + HELD_CHECK_NS < next)
				next = now + HELD_CHECK_NS;
			if (reply) {
				wexd_send(d, c, reply, NULL, 0);
				json_decref(reply);
			}
		}
	}
	if (next == UINT64_MAX)
		return -1;
	now = wex__now_ns();
	return next <= now ? 0 : (int)((next - now) / 1000000 + 1);
}

json_t *wexd_cancel(struct wexd *d, struct conn *c)
{
	uint64_t now = wex__now_ns(), ms;
	struct model *m = c->model;
	const char *what;

	(void)d;
	if (c->waiting == WAIT_NONE)
		return NULL; /* the wait's answer went before this came */
	ms = (now - c->wait_start_ns) / 1000000;
	if (c->waiting == WAIT_BEGIN_WRITE) {
		if (m->write_pending)
			m->write_pending--;
		/* As a timeout's: the longest waits end this way too. */
		wex__metrics_observe(WEX_M_BEGIN_WRITE_WAIT, NULL, (double)(now - c->wait_start_ns) / 1e9);
		what = "begin_write";
	} else {
		what = c->waiting == WAIT_PLAN ? "fetch" : "acquire";
	}
	c->waiting = WAIT_NONE;
	wex_info("registry", "%s rank %u (pid %d) of model '%s' cancelled its %s of v%llu after %llu ms",
		 c->role == WEX_ROLE_PRODUCER ? "producer" : "consumer", c->rank, (int)c->pid,
		 m->name, what, (unsigned long long)c->wait_version, (unsigned long long)ms);
	return wex__reply_error(-ECANCELED, "%s v%llu of model '%s' cancelled by the client after %llu ms",
				what, (unsigned long long)c->wait_version, m->name,
				(unsigned long long)ms);
}

/*
 * Ends consumers' waits in acquire (the SIGTERM drain: ESHUTDOWN; the
 * engine serves the weights it holds).  Producers' begin_writes wait on:
 * answered during the drain if the lease they wait for ends, else sent
 * again by libwex to the next wexd once this one's exit closes their
 * connection, so that a planned restart fails no trainer that a crash
 * would not.  A waiter that disconnects (wexd_conn_drop) is not observed
 * in wex_begin_write_wait_seconds: nobody waits any more, and its wait has
 * no end that a producer saw.
 */
void wexd_fail_waiters(struct wexd *d, int err, const char *why)
{
	for (struct conn *c = d->conns; c; c = c->next) {
		json_t *reply;

		if (c->dead || c->waiting != WAIT_ACQUIRE)
			continue;
		c->waiting = WAIT_NONE;
		reply = wex__reply_error(err, "%s", why);
		wexd_send(d, c, reply, NULL, 0);
		json_decref(reply);
	}
}

/* ---------------------------------------------------------------------- */
/* Monitoring.                                                             */

/*
 * A world over this many ranks lists only the ranks in use (a client, or
 * state) and counts the others (producers_unlisted, ranks_unlisted): any
 * local client may say hello as rank 0 of 65536, and a status of a few
 * such listed every empty slot (20 of them: 90 MB, 2.9 s of wexd's loop,
 * 1.36 GB at its peak).
 */
#define WEX_STATUS_WORLD_ALL 1024u

json_t *wexd_models_json(struct wexd *d)
{
	json_t *arr = json_array();

	for (struct model *m = d->models; m; m = m->next) {
		json_t *prods = json_array(), *groups = json_array();
		uint64_t bytes = 0;
		const char *state = m->writing ? "writing" : m->published ? "published" : "empty";

		uint64_t unlisted = 0;

		for (uint32_t i = 0; i < m->world; i++) {
			struct prank *r = &m->ranks[i];

			bytes += r->bytes;
			if (m->world > WEX_STATUS_WORLD_ALL && !r->c && !r->nsegs && !r->has_table &&
			    !r->published && !r->writing) {
				unlisted++;
				continue;
			}
			json_array_append_new(prods,
					      json_pack("{s:i, s:i, s:i, s:b, s:I, s:I, s:I, s:I}",
							"rank", i, "pid", r->c ? (int)r->c->pid : 0,
							"segments", r->nsegs, "registered", r->has_table,
							"tensors", (json_int_t)r->nt, "bytes",
							(json_int_t)r->bytes, "published",
							(json_int_t)r->published, "writing",
							(json_int_t)r->writing));
		}
		for (struct cgroup *g = m->groups; g; g = g->next) {
			json_t *ranks = json_array(), *o;
			uint64_t gunlisted = 0;

			for (uint32_t i = 0; i < g->world; i++) {
				struct conn *c = g->ranks[i];

				if (g->world > WEX_STATUS_WORLD_ALL && !c) {
					gunlisted++;
					continue;
				}
				json_array_append_new(ranks,
						      json_pack("{s:i, s:i, s:I, s:s, s:I, s:o}", "rank", i,
								"pid", c ? (int)c->pid : 0, "lease",
								(json_int_t)(c && c->has_lease ? c->lease_version : 0),
								"mode", c && c->has_lease ? mode_name(c->lease_mode) : "-",
								"served",
								(json_int_t)(c ? c->served_version : 0),
								"verify", c ? wexd_verify_json(c) : json_null()));
			}
			o = json_pack("{s:s, s:i, s:I, s:o}", "name", g->name, "world", g->world, "round",
				      (json_int_t)(g->round_open ? g->round_version : 0), "ranks", ranks);
			if (gunlisted)
				json_object_set_new(o, "ranks_unlisted", json_integer((json_int_t)gunlisted));
			json_array_append_new(groups, o);
		}
		json_t *held = json_array();

		for (struct held *h = d->held; h; h = h->next)
			if (h->m == m)
				json_array_append_new(
					held, json_pack("{s:s, s:i, s:i, s:I, s:s, s:f}", "group",
							h->r.group, "rank", (int)h->r.rank, "pid",
							(int)h->r.pid, "version",
							(json_int_t)h->r.version, "mode",
							mode_name(held_mode(h)),
							"since_s",
							(double)(wex__now_ns() - h->since_ns) / 1e9));
		json_array_append_new(arr,
				      json_pack("{s:s, s:s, s:i, s:I, s:b, s:I, s:i, s:i, s:I, s:I, s:o, s:o, s:o}",
						"name", m->name, "state", state, "world", m->world,
						"published", (json_int_t)m->published, "restored",
						m->published && m->published_restored, "writing",
						(json_int_t)m->writing, "write_pending",
						(int)m->write_pending, "leases", m->leases,
						"layout_gen", (json_int_t)m->layout_gen, "bytes",
						(json_int_t)bytes, "producers", prods, "groups",
						groups, "held", held));
		if (unlisted)
			json_object_set_new(json_array_get(arr, json_array_size(arr) - 1),
					    "producers_unlisted", json_integer((json_int_t)unlisted));
	}
	return arr;
}

json_t *wexd_clients_json(struct wexd *d)
{
	json_t *arr = json_array();
	uint64_t now = wex__now_ns();

	for (struct conn *c = d->conns; c; c = c->next) {
		json_t *o;

		if (c->dead)
			continue;
		o = json_pack("{s:I, s:i, s:i, s:i, s:s, s:s, s:s, s:s, s:i, s:I, s:s, s:I, s:f, s:s, s:b}",
			      "id", (json_int_t)c->id, "pid", (int)c->pid, "uid", (int)c->uid,
			      "gid", (int)c->gid, "role", role_name(c->role), "name", c->name,
			      "model", c->model ? c->model->name : "", "group",
			      c->group ? c->group->name : "", "rank", (int)c->rank, "lease",
			      (json_int_t)(c->has_lease ? c->lease_version : 0), "mode",
			      c->has_lease ? mode_name(c->lease_mode) : "-", "syncs",
			      (json_int_t)c->syncs, "last_sync_s_ago",
			      c->last_sync_ns ? (double)(now - c->last_sync_ns) / 1e9 : -1.0,
			      "waiting",
			      c->waiting == WAIT_BEGIN_WRITE ? "begin_write" :
			      c->waiting == WAIT_ACQUIRE ? "acquire" :
			      c->waiting == WAIT_PLAN ? "fetch" : "", "exit_watched",
			      c->io.pid.fd >= 0);
		/* Weaker paths its syncs ran on (a consumer's reports). */
		if (o && c->fallbacks)
			json_object_set_new(o, "fallbacks", wex__fallbacks_json(c->fallbacks));
		json_array_append_new(arr, o);
	}
	return arr;
}

json_t *wexd_plans_json(struct wexd *d)
{
	json_t *arr = json_array();

	for (struct model *m = d->models; m; m = m->next)
		for (struct plan_entry *p = m->plans; p; p = p->next)
			json_array_append_new(
				arr, json_pack("{s:s, s:I, s:i, s:i, s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:f, s:b}",
					       "model", m->name, "layout_gen", (json_int_t)p->layout_gen,
					       "rank", p->crank, "world", p->cworld, "device", p->device,
					       "near_ranks", (int)p->near, "ops",
					       (json_int_t)p->plan->nops, "bytes_needed",
					       (json_int_t)p->plan->stats.bytes_needed, "bytes_moved",
					       (json_int_t)p->plan->stats.bytes_moved, "busiest_src_bytes",
					       (json_int_t)p->plan->stats.busiest_src_bytes, "uses",
					       (json_int_t)p->uses, "build_ms", p->build_ms, "stale",
					       p->layout_gen != m->layout_gen));
	/* The plans threads build now: ops and bytes unknown yet. */
	for (struct plan_job *j = d->plan_jobs; j; j = j->next) {
		struct plan_entry *p = j->p;

		if (!j->m)
			continue;
		json_array_append_new(
			arr, json_pack("{s:s, s:I, s:i, s:i, s:s, s:i, s:s, s:f, s:b, s:b}", "model",
				       j->m->name, "layout_gen", (json_int_t)p->layout_gen, "rank",
				       p->crank, "world", p->cworld, "device", p->device,
				       "near_ranks", (int)p->near, "group", j->group, "building_s",
				       (double)(wex__now_ns() - j->start_ns) / 1e9, "building", 1,
				       "stale", p->layout_gen != j->m->layout_gen));
	}
	return arr;
}

json_t *wexd_status(struct wexd *d, struct conn *c, json_t *req)
{
	json_t *r = wex__reply_ok(), *lj;

	json_object_set_new(r, "daemon",
			    json_pack("{s:i, s:f, s:s, s:s, s:s, s:s, s:i, s:b, s:{s:I, s:I}, s:s}", "pid",
				      (int)getpid(), "uptime_s",
				      (double)(wex__now_ns() - d->start_ns) / 1e9, "io",
				      wexd_io_backend(d), "io_fallback_reason",
				      d->loop.why_fallback, "socket", d->socket_path, "config",
				      d->config_source, "clients", (int)wexd_clients(d), "draining",
				      d->draining, "fds", "open", (json_int_t)wexd_fds_open(),
				      "limit", (json_int_t)d->fd_limit, "exit_watch",
				      d->exit_watch));
	/* Where remap leases are written down to outlive wexd (journal.h). */
	lj = d->journal.dirfd >= 0 ?
	     json_pack("{s:s, s:I}", "dir", d->journal.path, "write_errors",
		       (json_int_t)d->journal.errors) :
	     json_pack("{s:n, s:s}", "dir", "off", d->journal.why);
	/* (A read-only mount, a mode wexd's user lacks: journal.h.) */
	if (lj && d->journal.dirfd >= 0 && d->journal.nowrite[0])
		json_object_set_new(lj, "unwritable", json_string(d->journal.nowrite));
	json_object_set_new(json_object_get(r, "daemon"), "lease_journal", lj);
	json_object_set_new(r, "models", wexd_models_json(d));
	json_object_set_new(r, "clients", wexd_clients_json(d));
	return r;
}
