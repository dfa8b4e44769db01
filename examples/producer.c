/* SPDX-License-Identifier: MIT */
/*
 * producer.c - a trainer rank: builds its shard of a Qwen2-like model in
 * host shared memory, registers it with wexd once, and publishes versions
 * in a loop, each version's bytes derived from the version number.
 *
 *   wex-producer --rank R --world N [--model NAME] [--preset qwen2-0.5b|small|tiny]
 *                [--versions K] [--first V] [--wait-group GROUP] [--hold]
 *                [--interval-ms MS] [--threads T] [--socket PATH]
 *
 * Defaults: model "policy", preset qwen2-0.5b, 3 versions numbered from
 * --first (1), 2 threads filling the weights, the socket libwex picks.
 * --wait-group makes it wait, after each publish, until every rank of that
 * consumer group serves the version (a trainer waiting for its rollout), or
 * until the group, listed before by the same wexd, is gone (its ranks all
 * left: engines that ran their last rollout; a restarted wexd that has not
 * seen the group yet is waited on until it lists it), and exits 1 when wexd
 * cannot tell (gone); --hold keeps the memory
 * exported after the last version until SIGTERM.  SIGTERM or SIGINT
 * (Ctrl-C) stops it at once, also while begin_write waits for leases
 * (WEX_CLIENT_EINTR), and it exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "wex.h"

static volatile sig_atomic_t stop;

static void on_sig(int s)
{
	stop = 1;
}

/* json's string member `key` equals s? */
static int name_is(json_t *j, const char *key, const char *s)
{
	const char *v = json_string_value(json_object_get(j, key));

	return v && !strcmp(v, s);
}

/* The wexd a group was listed by: its pid and start (on this process's
 * monotonic clock, from its uptime), as status says. */
struct seen {
	int listed; /* the group was listed */
	int pid;
	double start;
};

/* The pid and start of the wexd that admin talks to; wex_request's error,
 * or -EPROTO for a status without them. */
static int wexd_id(wex_client_t *admin, int *pid, double *start)
{
	char *s = NULL;
	json_t *j, *dm;
	int ret;

	if ((ret = wex_request(admin, "status", NULL, &s)) < 0)
		return ret;
	j = json_loads(s, 0, NULL);
	wex_free(s);
	dm = json_object_get(j, "daemon");
	ret = json_is_integer(json_object_get(dm, "pid")) &&
			      json_is_number(json_object_get(dm, "uptime_s")) ? 0 : -EPROTO;
	*pid = (int)json_integer_value(json_object_get(dm, "pid"));
	*start = ex_now() - json_number_value(json_object_get(dm, "uptime_s"));
	json_decref(j);
	return ret;
}

/* Every rank of `group` serves at least `v`?  1 yes, 0 not yet, 2 the group,
 * listed by an earlier call (*seen), is gone: its ranks all left, as engines
 * that ran their last rollout do, served or not (wexd forgets a group whose
 * ranks all left, so a poll that came after their last sync never saw it
 * served); wex_request's error (wexd gone: the reason in wex_last_error), or
 * -EPROTO for an answer without a list of models.  A group missing at a
 * wexd that restarted since it was listed is not gone: the new wexd has
 * not seen it yet (its engines come back at their next call), and it is
 * waited for as one never listed. */
static int group_served(wex_client_t *admin, const char *model, const char *group, uint64_t v,
			struct seen *seen)
{
	char *s = NULL;
	json_t *j, *m, *g, *r;
	size_t i, k, l;
	int ok = 0, listed = 0, pid, ret;
	double start;

	if ((ret = wex_request(admin, "models", NULL, &s)) < 0)
		return ret;
	j = json_loads(s, 0, NULL);
	wex_free(s);
	if (!json_is_array(json_object_get(j, "models"))) {
		json_decref(j);
		return -EPROTO;
	}
	json_array_foreach(json_object_get(j, "models"), i, m) {
		if (!name_is(m, "name", model))
			continue;
		json_array_foreach(json_object_get(m, "groups"), k, g) {
			if (!name_is(g, "name", group))
				continue;
			ok = listed = 1;
			json_array_foreach(json_object_get(g, "ranks"), l, r)
				if ((uint64_t)json_integer_value(json_object_get(r, "served")) < v)
					ok = 0;
		}
	}
	json_decref(j);
	if (listed == seen->listed)
		return ok;
	if ((ret = wexd_id(admin, &pid, &start)) < 0)
		return ret;
	if (listed) {
		seen->listed = 1;
		seen->pid = pid;
		seen->start = start;
		return ok;
	}
	/* (A second's slack for the time the answer took; a wexd restarted
	 * in a container may have the same pid.) */
	if (pid != seen->pid || start > seen->start + 1.0) {
		seen->listed = 0;
		return 0;
	}
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "rank", 1, NULL, 'r' },    { "world", 1, NULL, 'w' },       { "model", 1, NULL, 'm' },
		{ "preset", 1, NULL, 'p' },  { "versions", 1, NULL, 'v' },    { "wait-group", 1, NULL, 'g' },
		{ "hold", 0, NULL, 'H' },    { "interval-ms", 1, NULL, 'i' }, { "threads", 1, NULL, 't' },
		{ "socket", 1, NULL, 's' },  { "first", 1, NULL, 'f' },       { "help", 0, NULL, 'h' },
		{ 0 }
	};
	static const char usage[] =
		"usage: wex-producer --rank R --world N [--model NAME] [--preset qwen2-0.5b|small|tiny]\n"
		"                    [--versions K] [--first V] [--wait-group GROUP] [--hold]\n"
		"                    [--interval-ms MS] [--threads T] [--socket PATH]\n"
		"A trainer rank publishing K versions of its shard (see examples/producer.c).\n";
	const char *model = "policy", *preset = "qwen2-0.5b", *wait_group = NULL, *sock = NULL;
	uint32_t rank = 0, world = 1;
	uint64_t versions = 3, first = 1, seg_bytes, num;
	int hold = 0, interval_ms = 0, threads = 2, opt, n, ret;
	struct seen group_seen = { 0, 0, 0 };
	struct wex_tensor *t;
	struct ex_cfg cfg;
	wex_client_t *c, *admin = NULL;
	uint32_t seg;
	void *base;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'r':
			if (ex_num("producer", "rank", optarg, 0, 65535, &num) < 0)
				return 2;
			rank = (uint32_t)num;
			break;
		case 'w':
			if (ex_num("producer", "world", optarg, 1, 65536, &num) < 0)
				return 2;
			world = (uint32_t)num;
			break;
		case 'i':
			if (ex_num("producer", "interval-ms", optarg, 0, 3600000, &num) < 0)
				return 2;
			interval_ms = (int)num;
			break;
		case 't':
			if (ex_num("producer", "threads", optarg, 1, 256, &num) < 0)
				return 2;
			threads = (int)num;
			break;
		case 'v':
			if (ex_num("producer", "versions", optarg, 0, UINT32_MAX, &versions) < 0)
				return 2;
			break;
		case 'f':
			if (ex_num("producer", "first", optarg, 1, INT64_MAX, &first) < 0)
				return 2;
			break;
		case 'm': model = optarg; break;
		case 'p': preset = optarg; break;
		case 'g': wait_group = optarg; break;
		case 'H': hold = 1; break;
		case 's': sock = optarg; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "producer: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	if (rank >= world) {
		fprintf(stderr, "producer: --rank %u must be below --world %u\n", rank, world);
		return 2;
	}
	if (ex_cfg_preset(&cfg, preset) < 0) {
		fprintf(stderr, "producer: unknown preset '%s'\n", preset);
		return 2;
	}
	n = ex_shards(&cfg, rank, world, &t, &seg_bytes);
	if (n < 0) {
		fprintf(stderr, "producer: world %u does not divide the model's dims\n", world);
		return 2;
	}
	signal(SIGTERM, on_sig);
	signal(SIGINT, on_sig);
	/* WEX_CLIENT_EINTR: a signal ends begin_write's wait for leases (up
	 * to 60 s), which it otherwise went on with, Ctrl-C unheeded. */
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_FLAGS | (sock ? WEX_CLIENT_FIELD_SOCKET : 0),
		.role = WEX_ROLE_PRODUCER, .model = model, .rank = rank, .world_size = world,
		.socket = sock, .flags = WEX_CLIENT_EINTR,
	};
	ret = wex_client_open(&p, &c);
	if (ret < 0) {
		fprintf(stderr, "producer: connect: %s: %s\n", wex_strerror(ret), wex_last_error(NULL));
		return 1;
	}
	ret = wex_segment_alloc(c, WEX_SEG_HOST, 0, seg_bytes, &seg, &base);
	if (ret < 0) {
		fprintf(stderr, "producer: segment: %s: %s\n", wex_strerror(ret), wex_last_error(c));
		return 1;
	}
	for (int i = 0; i < n; i++)
		t[i].segment = seg;
	ret = wex_register_tensors(c, t, (size_t)n);
	if (ret < 0) {
		fprintf(stderr, "producer: register: %s: %s\n", wex_strerror(ret), wex_last_error(c));
		return 1;
	}
	printf("producer rank %u/%u: model '%s', %d tensors, %.1f MiB in host shared memory\n", rank,
	       world, model, n, (double)seg_bytes / (1 << 20));
	fflush(stdout);
	if (wait_group) {
		struct wex_client_params ap = {
			.field_mask = WEX_CLIENT_FIELD_ROLE | (sock ? WEX_CLIENT_FIELD_SOCKET : 0),
			.role = WEX_ROLE_ADMIN, .socket = sock,
		};

		if ((ret = wex_client_open(&ap, &admin)) < 0) {
			fprintf(stderr, "producer: admin connect: %s: %s\n", wex_strerror(ret),
				wex_last_error(NULL));
			return 1;
		}
	}
	for (uint64_t v = first; v < first + versions && !stop; v++) {
		double t0 = ex_now(), t1;

		ret = wex_begin_write(c, v, 60000);
		if (ret == -EINTR && stop)
			break;
		if (ret < 0) {
			fprintf(stderr, "producer rank %u: begin_write v%llu: %s: %s\n", rank,
				(unsigned long long)v, wex_strerror(ret), wex_last_error(c));
			return 1;
		}
		t1 = ex_now();
		ex_fill(base, t, (size_t)n, v, threads);
		ret = wex_publish(c, v);
		if (ret == -EINTR && stop)
			break; /* (v perhaps not published: wexd may not have run it) */
		if (ret < 0) {
			fprintf(stderr, "producer rank %u: publish v%llu: %s: %s\n", rank,
				(unsigned long long)v, wex_strerror(ret), wex_last_error(c));
			return 1;
		}
		printf("producer rank %u: published v%llu (waited %.1f ms for leases, wrote in %.1f ms)\n",
		       rank, (unsigned long long)v, (t1 - t0) * 1e3, (ex_now() - t1) * 1e3);
		fflush(stdout);
		/* Never publish the next version before the group served this
		 * one: when wexd cannot say (it is gone), give up. */
		while (admin && !stop &&
		       (ret = group_served(admin, model, wait_group, v, &group_seen)) == 0) {
			struct timespec ts = { 0, 2000000 };

			nanosleep(&ts, NULL);
		}
		if (admin && ret == 2)
			fprintf(stderr, "producer rank %u: group '%s' left (no rank connected) before it "
				"was seen serving v%llu: not waiting for it%s\n", rank, wait_group,
				(unsigned long long)v,
				v + 1 == first + versions ?
					" (the last version: engines done with it leave so, their last "
					"sync between two of these polls)" : "");
		if (admin && ret < 0) {
			fprintf(stderr, "producer rank %u: waiting for group '%s' to serve v%llu: %s: %s\n",
				rank, wait_group, (unsigned long long)v, wex_strerror(ret),
				ret == -EPROTO ? "wexd's answer to 'models' lists no models, or its status no pid and uptime" :
						 wex_last_error(admin));
			return 1;
		}
		if (interval_ms > 0) {
			struct timespec ts = { interval_ms / 1000, (interval_ms % 1000) * 1000000L };

			nanosleep(&ts, NULL);
		}
	}
	if (hold) {
		/* SIGTERM and SIGINT stay blocked but while sigsuspend waits: one
		 * arriving between the test of `stop` and the wait is not lost. */
		sigset_t block, old;

		sigemptyset(&block);
		sigaddset(&block, SIGTERM);
		sigaddset(&block, SIGINT);
		sigprocmask(SIG_BLOCK, &block, &old);
		while (!stop)
			sigsuspend(&old);
		sigprocmask(SIG_SETMASK, &old, NULL);
	}
	wex_client_close(admin);
	wex_client_close(c);
	free(t);
	return 0;
}
