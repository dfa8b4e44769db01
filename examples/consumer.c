/* SPDX-License-Identifier: MIT */
/*
 * consumer.c - an inference rank: mirrors one producer rank's shard and, for
 * each version, syncs it in each mode and checks every byte:
 *   view   remap, zero copy: reads the producer's memory at new addresses;
 *   fixed  remap at the same addresses: its own weight buffer is replaced in
 *          place by the producer's memory (every pointer it holds stays valid);
 *   copy   copies the bytes into its own buffer (then releases the lease).
 *
 *   wex-consumer --rank K --world M [--group G] [--model NAME] [--preset P]
 *                [--modes view,fixed,copy] [--versions K] [--quiet] [--hold]
 *                [--threads T] [--timeout-ms MS] [--socket PATH]
 *
 * Defaults: group "engine", model "policy", preset qwen2-0.5b, 3 versions,
 * all three modes, 2 copy threads (0: libwex's own default), syncs waiting
 * up to 60000 ms (--timeout-ms: also the first reserve's wait for the
 * producer, else libwex's 30 s).  --hold stays connected after the last version until
 * SIGTERM.  A lease that could not be released after a rollout (wexd gone:
 * the producer may have written while this rank read) exits 1; so do bytes
 * other than the version's, which stderr names (also with --quiet, which
 * leaves out the line each sync prints).
 *
 * Consumer rank K mirrors producer rank K, so M is the producers' world size
 * (wex_reserve refuses a producer rank that does not exist).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "wex.h"

static volatile sig_atomic_t term;

static void on_term(int s)
{
	term = 1;
}

static const char *mode_label(int m)
{
	return m == WEX_SYNC_COPY ? "copy" : m == WEX_SYNC_REMAP_VIEW ? "remap-view" : "remap-fixed";
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "rank", 1, NULL, 'r' },   { "world", 1, NULL, 'w' },    { "group", 1, NULL, 'g' },
		{ "model", 1, NULL, 'm' },  { "preset", 1, NULL, 'p' },   { "modes", 1, NULL, 'M' },
		{ "versions", 1, NULL, 'v' }, { "quiet", 0, NULL, 'q' },  { "threads", 1, NULL, 't' },
		{ "socket", 1, NULL, 's' }, { "timeout-ms", 1, NULL, 'T' }, { "hold", 0, NULL, 'H' },
		{ "help", 0, NULL, 'h' },   { 0 }
	};
	static const char usage[] =
		"usage: wex-consumer --rank K --world M [--group G] [--model NAME] [--preset P]\n"
		"                    [--modes view,fixed,copy] [--versions K] [--quiet] [--hold]\n"
		"                    [--threads T] [--timeout-ms MS] [--socket PATH]\n"
		"An inference rank syncing K versions in each mode and checking every byte\n"
		"(see examples/consumer.c).\n";
	const char *model = "policy", *preset = "qwen2-0.5b", *group = "engine", *sock = NULL;
	char modes_arg[64] = "view,fixed,copy";
	int modes[3], nmodes = 0, quiet = 0, threads = 2, opt, n, ret, failures = 0, hold = 0;
	int timeout_set = 0;
	uint32_t rank = 0, world = 1, timeout = 60000;
	uint64_t versions = 3, seg_bytes, last = 0, num;
	struct wex_tensor *t;
	struct ex_cfg cfg;
	wex_client_t *c;
	void *region;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'r':
			if (ex_num("consumer", "rank", optarg, 0, 65535, &num) < 0)
				return 2;
			rank = (uint32_t)num;
			break;
		case 'w':
			if (ex_num("consumer", "world", optarg, 1, 65536, &num) < 0)
				return 2;
			world = (uint32_t)num;
			break;
		case 't':
			if (ex_num("consumer", "threads", optarg, 0, 256, &num) < 0)
				return 2;
			threads = (int)num;
			break;
		case 'T':
			if (ex_num("consumer", "timeout-ms", optarg, 0, UINT32_MAX, &num) < 0)
				return 2;
			timeout = (uint32_t)num;
			timeout_set = num > 0;
			break;
		case 'v':
			if (ex_num("consumer", "versions", optarg, 0, UINT32_MAX, &versions) < 0)
				return 2;
			break;
		case 'g': group = optarg; break;
		case 'm': model = optarg; break;
		case 'p': preset = optarg; break;
		case 'M':
			if (strlen(optarg) >= sizeof(modes_arg)) {
				fprintf(stderr, "consumer: --modes '%s' too long\n", optarg);
				return 2;
			}
			snprintf(modes_arg, sizeof(modes_arg), "%s", optarg);
			break;
		case 'q': quiet = 1; break;
		case 's': sock = optarg; break;
		case 'H': hold = 1; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "consumer: unexpected argument '%s'\n%s", argv[optind], usage);
		return 2;
	}
	if (rank >= world) {
		fprintf(stderr, "consumer: --rank %u must be below --world %u\n", rank, world);
		return 2;
	}
	for (char *tok = strtok(modes_arg, ","); tok; tok = strtok(NULL, ",")) {
		if (nmodes == 3) {
			fprintf(stderr, "consumer: --modes takes at most 3 modes\n");
			return 2;
		}
		if (!strcmp(tok, "view"))
			modes[nmodes++] = WEX_SYNC_REMAP_VIEW;
		else if (!strcmp(tok, "fixed"))
			modes[nmodes++] = WEX_SYNC_REMAP_FIXED;
		else if (!strcmp(tok, "copy"))
			modes[nmodes++] = WEX_SYNC_COPY;
		else {
			fprintf(stderr, "consumer: mode '%s' unknown (view, fixed, copy)\n", tok);
			return 2;
		}
	}
	if (!nmodes) {
		fprintf(stderr, "consumer: --modes names no mode (view, fixed, copy)\n");
		return 2;
	}
	if (ex_cfg_preset(&cfg, preset) < 0) {
		fprintf(stderr, "consumer: unknown preset '%s'\n", preset);
		return 2;
	}
	n = ex_shards(&cfg, rank, world, &t, &seg_bytes);
	if (n < 0) {
		fprintf(stderr, "consumer: world %u does not divide the model's dims\n", world);
		return 2;
	}
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_MODEL | WEX_CLIENT_FIELD_RANK |
			      WEX_CLIENT_FIELD_GROUP | WEX_CLIENT_FIELD_COPY_THREADS |
			      (sock ? WEX_CLIENT_FIELD_SOCKET : 0) |
			      (timeout_set ? WEX_CLIENT_FIELD_TIMEOUT : 0),
		.role = WEX_ROLE_CONSUMER, .model = model, .group = group, .rank = rank,
		.world_size = world, .copy_threads = (uint32_t)threads, .socket = sock,
		/* --timeout-ms bounds the first reserve's wait for the
		 * producer too (else the client's 30 s). */
		.timeout_ms = timeout,
	};
	if ((ret = wex_client_open(&p, &c)) < 0) {
		fprintf(stderr, "consumer: connect: %s: %s\n", wex_strerror(ret), wex_last_error(NULL));
		return 1;
	}
	/* The engine's weights live in a region wex reserved, laid out as
	 * producer rank `rank` lays out its segment, so the same buffer serves
	 * copy mode (its own memory) and same-address remap. */
	if ((ret = wex_reserve(c, rank, 0, seg_bytes, &region)) < 0) {
		fprintf(stderr, "consumer: reserve: %s: %s\n", wex_strerror(ret), wex_last_error(c));
		return 1;
	}
	for (int i = 0; i < n; i++)
		t[i].ptr = (char *)region + t[i].offset;
	if ((ret = wex_attach(c, t, (size_t)n)) < 0) {
		fprintf(stderr, "consumer: attach: %s: %s\n", wex_strerror(ret), wex_last_error(c));
		return 1;
	}
	for (uint64_t round = 0; round < versions; round++) {
		for (int k = 0; k < nmodes; k++) {
			struct wex_sync_result r;
			uint64_t bad = 0;
			double t0;

			ret = wex_sync(c, modes[k], k == 0 ? last + 1 : last, timeout, &r);
			if (ret < 0) {
				fprintf(stderr, "consumer rank %u: %s sync: %s: %s\n", rank,
					mode_label(modes[k]), wex_strerror(ret), wex_last_error(c));
				return 1;
			}
			last = r.version;
			t0 = ex_now();
			if (modes[k] == WEX_SYNC_REMAP_VIEW) {
				for (int i = 0; i < n; i++) {
					struct wex_tensor v;
					void *ptr;

					if (wex_view(c, rank, t[i].name, &ptr, &v) < 0) {
						fprintf(stderr, "consumer: view '%s': %s\n", t[i].name,
							wex_last_error(c));
						return 1;
					}
					bad += ex_check(NULL, &v, 1, r.version, 1);
				}
			} else {
				/* Same pointers as before the sync: t[i].ptr. */
				bad = ex_check(NULL, t, (size_t)n, r.version, threads);
			}
			if (bad) {
				/* (Said also with --quiet: the exit status alone
				 * would not say what failed.) */
				failures++;
				fprintf(stderr, "consumer rank %u: v%llu %s: %llu elements differ from the version's\n",
					rank, (unsigned long long)r.version, mode_label(modes[k]),
					(unsigned long long)bad);
			}
			if (!quiet)
			{
				/* The sync's own time, without waiting for the trainer
				 * to publish (printed apart). */
				double own = r.seconds - r.waited;

				char bw[32] = "   (no copy)";

				if (modes[k] == WEX_SYNC_COPY && own > 0)
					snprintf(bw, sizeof(bw), "%7.2f GiB/s",
						 (double)r.bytes / own / (1 << 30));
				printf("consumer rank %u: v%-3llu %-11s %8.1f MiB %-6s in %8.3f ms  %s  %s (waited %.0f ms for the version; checked in %.0f ms)\n",
				       rank, (unsigned long long)r.version, mode_label(modes[k]),
				       (double)r.bytes / (1 << 20),
				       modes[k] == WEX_SYNC_COPY ? "copied" : "mapped", own * 1e3, bw,
				       bad ? "MISMATCH" : "every byte verified", r.waited * 1e3,
				       (ex_now() - t0) * 1e3);
			}
			fflush(stdout);
		}
		if (wex_is_dirty(c)) {
			fprintf(stderr, "consumer: weights dirty\n");
			return 1;
		}
		/* End of this rollout.  -ENOENT: no lease held (a copy sync gave
		 * its lease back).  Any other error: the lease may have been lost
		 * while this rank read (-WEX_EDAEMON), what it checked may not be
		 * what it served. */
		ret = wex_release(c);
		if (ret < 0 && ret != -ENOENT) {
			fprintf(stderr, "consumer rank %u: release v%llu: %s: %s\n", rank,
				(unsigned long long)last, wex_strerror(ret), wex_last_error(c));
			return 1;
		}
	}
	if (hold) {
		/* Stay attached (plans stay cached) until told to go.  SIGTERM
		 * stays blocked but while sigsuspend waits: one arriving between
		 * the test of `term` and the wait is not lost. */
		sigset_t block, old;

		sigemptyset(&block);
		sigaddset(&block, SIGTERM);
		sigprocmask(SIG_BLOCK, &block, &old);
		signal(SIGTERM, on_term);
		printf("consumer rank %u: done, holding\n", rank);
		fflush(stdout);
		while (!term)
			sigsuspend(&old);
		sigprocmask(SIG_SETMASK, &old, NULL);
	}
	wex_client_close(c);
	free(t);
	return failures ? 1 : 0;
}
