/* SPDX-License-Identifier: MIT */
/*
 * metrics_reports - proves that only consumers' reports of real syncs reach
 * the sync metrics (libwex sends each finished sync's mode, backend, bytes
 * and seconds with its next request): reports sent before hello, by a
 * producer, with a mode or backend outside the known set (labels are a
 * closed set: no client can add series) or with more bytes than the model
 * exports are dropped; a consumer's valid report is counted once; and a
 * real libwex copy sync is counted as "copy" on the "host" backend.
 * A begin_write that times out under a lease is counted too: its wait in
 * wex_begin_write_wait_seconds (at least its timeout) and the timeout in
 * wex_begin_write_timeouts_total{model} (two models whose names share
 * their first 100 bytes counted apart).  And a consumer's last sync,
 * reported after its producer left (and with it the bytes the model
 * exports), is still counted, as is the sync of a consumer that closes
 * right after it (its close's release carries the report).
 * Fallbacks a report names (pageable_staging, rw_mapping, unpinned_verify)
 * count in wex_sync_fallbacks_total and show in the client's status entry
 * only from a consumer's valid report, and only known names.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"

#define MODEL "metered"

static void send_report(int fd, const char *report)
{
	char req[512];
	json_t *r;

	snprintf(req, sizeof(req), "{\"v\":1,\"op\":\"ping\",\"report\":%s}", report);
	r = t_raw_rpc(fd, req, NULL, 0);
	T_ASSERT(!strcmp(t_code(r), "OK"), "ping with a report: %s", t_msg(r));
	json_decref(r);
}

static char *metrics(const char *sock)
{
	int fd = t_raw_connect(sock);
	json_t *r = t_raw_rpc(fd, "{\"v\":1,\"op\":\"metrics\"}", NULL, 0);
	char *text = strdup(json_string_value(json_object_get(r, "text")) ?: "");

	json_decref(r);
	close(fd);
	return text;
}

/* The value of the sample line that starts with `series` (-1: none). */
static double sample(const char *text, const char *series)
{
	size_t n = strlen(series);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, series, n) && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return -1;
}

int main(void)
{
	struct t_wexd d;
	struct t_prod p;
	struct t_cons k;
	struct wex_sync_result r;
	int anon, prod2, cons;
	char *text;
	json_t *rep;

	t_wexd_start(&d);
	t_prod_open(&p, MODEL, "tiny", 0, 1);
	t_prod_write(&p, 1);

	anon = t_raw_connect(d.sock);
	send_report(anon, "{\"mode\":\"copy\",\"backend\":\"host\",\"bytes\":1000,\"seconds\":0.1,"
			  "\"fallbacks\":[\"rw_mapping\"]}");
	prod2 = t_raw_connect(d.sock);
	rep = t_raw_rpc(prod2, "{\"v\":1,\"op\":\"hello\",\"role\":\"producer\",\"model\":\"other\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "producer hello: %s", t_msg(rep));
	json_decref(rep);
	send_report(prod2, "{\"mode\":\"copy\",\"backend\":\"host\",\"bytes\":10,\"seconds\":0.1}");
	cons = t_raw_connect(d.sock);
	rep = t_raw_rpc(cons, "{\"v\":1,\"op\":\"hello\",\"role\":\"consumer\",\"model\":\"" MODEL
			      "\",\"group\":\"raw\"}", NULL, 0);
	T_ASSERT(!strcmp(t_code(rep), "OK"), "consumer hello: %s", t_msg(rep));
	json_decref(rep);
	send_report(cons, "{\"mode\":\"evil\",\"backend\":\"host\",\"bytes\":10,\"seconds\":0.1,"
			  "\"fallbacks\":[\"rw_mapping\"]}");
	/* A valid sync whose fallbacks are not a list of names: the sync
	 * counts (remap-fixed), no fallback does. */
	send_report(cons, "{\"mode\":\"remap-fixed\",\"backend\":\"host\",\"bytes\":10,\"seconds\":0.1,"
			  "\"fallbacks\":\"pageable_staging\"}");
	send_report(cons, "{\"mode\":\"copy\",\"backend\":\"evil\",\"bytes\":10,\"seconds\":0.1}");
	send_report(cons, "{\"mode\":\"copy\",\"backend\":\"host\",\"bytes\":4611686018427387904,"
			  "\"seconds\":0.1}");
	send_report(cons, "{\"mode\":\"copy\",\"backend\":\"host\",\"bytes\":10,\"seconds\":-1}");
	text = metrics(d.sock);
	T_ASSERT(!strstr(text, "evil"), "a client added a label value:\n%s", text);
	T_ASSERT(sample(text, "wex_syncs_total{mode=\"copy\"}") <= 0,
		 "a report from no consumer, or a bad one, was counted: %g",
		 sample(text, "wex_syncs_total{mode=\"copy\"}"));
	T_ASSERT(!strstr(text, "wex_sync_fallbacks_total{"),
		 "a fallback of no consumer, of a bad report, or not in a list, was counted:\n%s",
		 text);
	free(text);

	/* A valid report's fallbacks: the known names count, once each;
	 * others (unknown, not strings) add nothing. */
	send_report(cons, "{\"mode\":\"remap-view\",\"backend\":\"host\",\"bytes\":100,\"seconds\":0.01,"
			  "\"fallbacks\":[\"rw_mapping\",\"evil\",3,\"rw_mapping\"]}");
	text = metrics(d.sock);
	T_ASSERT(!strstr(text, "evil"), "a client added a fallback label:\n%s", text);
	T_ASSERT(sample(text, "wex_sync_fallbacks_total{fallback=\"rw_mapping\"}") == 1,
		 "a reported fallback counts once per sync: %g",
		 sample(text, "wex_sync_fallbacks_total{fallback=\"rw_mapping\"}"));
	T_ASSERT(sample(text, "wex_sync_fallbacks_total{fallback=\"pageable_staging\"}") < 0,
		 "a fallback not reported was counted");
	{
		/* ... and status lists it for that client. */
		json_t *cl = t_raw_rpc(anon, "{\"v\":1,\"op\":\"clients\"}", NULL, 0), *c;
		size_t i;
		int seen = 0;

		json_array_foreach(json_object_get(cl, "clients"), i, c)
			if (!strcmp(json_string_value(json_object_get(c, "group")) ?: "", "raw")) {
				json_t *fb = json_object_get(c, "fallbacks");

				seen = json_array_size(fb) == 1 &&
				       !strcmp(json_string_value(json_array_get(fb, 0)) ?: "", "rw_mapping");
			}
		T_ASSERT(seen, "clients lists rw_mapping for the consumer that reported it");
		json_decref(cl);
	}
	{
		/* wexctl clients says it under its table. */
		char out[16384];

		t_wexctl("clients", out, sizeof(out));
		T_ASSERT(strstr(out, "ran syncs on a fallback: rw_mapping\n") != NULL,
			 "wexctl clients does not name the fallback:\n%s", out);
	}
	T_ASSERT(sample(text, "wex_syncs_total{mode=\"remap-view\"}") == 1,
		 "a consumer's valid report counts once: %g",
		 sample(text, "wex_syncs_total{mode=\"remap-view\"}"));
	T_ASSERT(sample(text, "wex_sync_bytes_total{mode=\"remap-view\",backend=\"host\"}") == 100,
		 "its bytes count: %g",
		 sample(text, "wex_sync_bytes_total{mode=\"remap-view\",backend=\"host\"}"));
	free(text);

	/* A real sync through libwex, reported with the next request. */
	t_cons_open(&k, MODEL, "g", "tiny", 0, 1);
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_COPY, 1, 5000, &r));
	T_ASSERT(t_own_bad(&k, 1) == 0, "copy sync holds v1");
	{
		char *json = NULL; /* the next request carries the report */

		T_WEX(k.c, wex_request(k.c, "ping", NULL, &json));
		wex_free(json);
	}
	text = metrics(d.sock);
	T_ASSERT(sample(text, "wex_syncs_total{mode=\"copy\"}") == 1,
		 "the real copy sync counts once: %g", sample(text, "wex_syncs_total{mode=\"copy\"}"));
	T_ASSERT(sample(text, "wex_sync_bytes_total{mode=\"copy\",backend=\"host\"}") == (double)r.bytes,
		 "with its %llu bytes: %g", (unsigned long long)r.bytes,
		 sample(text, "wex_sync_bytes_total{mode=\"copy\",backend=\"host\"}"));
	free(text);

	/* A begin_write that times out under a remap lease: its wait is the
	 * longest a producer has, and must show. */
	{
		double n0, s0;
		int ret;

		T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
		text = metrics(d.sock);
		n0 = sample(text, "wex_begin_write_wait_seconds_count");
		s0 = sample(text, "wex_begin_write_wait_seconds_sum");
		free(text);
		T_ASSERT(n0 >= 1, "v1's begin_write was observed: %g", n0);
		ret = wex_begin_write(p.c, 2, 100);
		T_ASSERT(ret == -EBUSY, "begin_write under a lease: expected EBUSY, got %s",
			 wex_strerror(ret));
		text = metrics(d.sock);
		T_ASSERT(sample(text, "wex_begin_write_wait_seconds_count") == n0 + 1,
			 "the timed-out begin_write is observed once: %g, was %g",
			 sample(text, "wex_begin_write_wait_seconds_count"), n0);
		T_ASSERT(sample(text, "wex_begin_write_wait_seconds_sum") - s0 >= 0.099,
			 "with at least its 100 ms timeout: %g s",
			 sample(text, "wex_begin_write_wait_seconds_sum") - s0);
		T_ASSERT(sample(text, "wex_begin_write_wait_seconds_bucket{le=\"0.05\"}") <= n0,
			 "and not in a bucket below its wait:\n%s", text);
		T_ASSERT(sample(text, "wex_begin_write_timeouts_total{model=\"" MODEL "\"}") == 1,
			 "the timeout counts under its model: %g",
			 sample(text, "wex_begin_write_timeouts_total{model=\"" MODEL "\"}"));
		free(text);
		T_WEX(k.c, wex_release(k.c));
		/* A begin_write of a version begun already waited for
		 * nothing: no sample. */
		text = metrics(d.sock);
		n0 = sample(text, "wex_begin_write_wait_seconds_count");
		free(text);
		T_WEX(p.c, wex_begin_write(p.c, 2, 1000));
		T_WEX(p.c, wex_begin_write(p.c, 2, 1000));
		text = metrics(d.sock);
		T_ASSERT(sample(text, "wex_begin_write_wait_seconds_count") == n0 + 1,
			 "a begin_write repeated is observed: %g samples for one wait, was %g",
			 sample(text, "wex_begin_write_wait_seconds_count"), n0);
		free(text);
	}

	/* The consumer's last sync, a remap of v2, is reported with its next
	 * request (here its release), which arrives after its producer left:
	 * the bytes the model exports went with the producer. */
	t_prod_write(&p, 2);
	{
		/* A consumer that closes after its sync: the release that
		 * ends its lease at the close carries the report. */
		struct t_cons k2;

		t_cons_open(&k2, MODEL, "g2", "tiny", 0, 1);
		T_WEX(k2.c, wex_sync(k2.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
		t_cons_close(&k2);
		text = metrics(d.sock);
		T_ASSERT(sample(text, "wex_syncs_total{mode=\"remap-view\"}") == 3,
			 "the sync before a close counts: %g",
			 sample(text, "wex_syncs_total{mode=\"remap-view\"}"));
		free(text);
	}
	T_WEX(k.c, wex_sync(k.c, WEX_SYNC_REMAP_VIEW, 2, 5000, &r));
	T_ASSERT(t_view_bad(&k, 0, 2) == 0, "remap sync shows v2");
	t_prod_close(&p);
	for (double t0 = t_now();; usleep(1000)) {
		json_t *st = t_status(d.sock), *m = t_status_model(st, MODEL);
		json_t *pr = json_array_get(json_object_get(m, "producers"), 0);
		int gone = m && pr && json_integer_value(json_object_get(pr, "pid")) == 0;

		json_decref(st);
		if (gone)
			break;
		T_ASSERT(t_now() - t0 < 60, "wexd still lists the producer after 60 s");
	}
	T_WEX(k.c, wex_release(k.c));
	text = metrics(d.sock);
	T_ASSERT(sample(text, "wex_syncs_total{mode=\"remap-view\"}") == 4,
		 "the last sync, reported after its producer left, counts: %g",
		 sample(text, "wex_syncs_total{mode=\"remap-view\"}"));
	T_ASSERT(sample(text, "wex_sync_bytes_total{mode=\"remap-view\",backend=\"host\"}") ==
			 100.0 + 3.0 * (double)r.bytes,
		 "with its %llu bytes: %g", (unsigned long long)r.bytes,
		 sample(text, "wex_sync_bytes_total{mode=\"remap-view\",backend=\"host\"}"));
	free(text);

	close(anon);
	close(prod2);
	close(cons);
	t_cons_close(&k);
	/* Two models whose names share their first 100 bytes: their
	 * timeouts count under their own full names (label values were cut
	 * at 47 bytes: one series for both, named neither). */
	{
#define LONGM "metrics-long-0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567"
		const char *names[2] = { LONGM "-policy", LONGM "-critic" };
		struct t_prod lp[2];
		struct t_cons lk[2];
		char want[256];

		for (int i = 0; i < 2; i++) {
			t_prod_open(&lp[i], names[i], "tiny", 0, 1);
			t_prod_write(&lp[i], 1);
			t_cons_open(&lk[i], names[i], "g", "tiny", 0, 1);
			T_WEX(lk[i].c, wex_sync(lk[i].c, WEX_SYNC_REMAP_VIEW, 1, 5000, &r));
			T_ASSERT(wex_begin_write(lp[i].c, 2, 50) == -EBUSY, "%s: EBUSY", names[i]);
		}
		text = metrics(d.sock);
		for (int i = 0; i < 2; i++) {
			snprintf(want, sizeof(want), "wex_begin_write_timeouts_total{model=\"%s\"}",
				 names[i]);
			T_ASSERT(sample(text, want) == 1, "%s: %g, expected 1 (its own series)\n%s",
				 want, sample(text, want), text);
		}
		free(text);
		for (int i = 0; i < 2; i++) {
			t_cons_close(&lk[i]);
			t_prod_close(&lp[i]);
		}
#undef LONGM
	}

	/* A request refused for what it carries (a ping with an fd: EINVAL)
	 * was received all the same: it counts in wex_requests_total as its
	 * error does in wex_errors_total (it counted only in the errors, so
	 * errors / requests could pass 1). */
	{
		int fd = t_raw_connect(d.sock), nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
		double pings, einval;
		json_t *rr;

		text = metrics(d.sock);
		pings = sample(text, "wex_requests_total{op=\"ping\"}");
		einval = sample(text, "wex_errors_total{code=\"EINVAL\"}");
		free(text);
		rr = t_raw_rpc(fd, "{\"v\":1,\"op\":\"ping\"}", &nul, 1);
		T_ASSERT(!strcmp(t_code(rr), "EINVAL"), "a ping with an fd: %s (%s)", t_code(rr),
			 t_msg(rr));
		json_decref(rr);
		text = metrics(d.sock);
		T_ASSERT(sample(text, "wex_errors_total{code=\"EINVAL\"}") == (einval < 0 ? 0 : einval) + 1,
			 "its error counted once: %g", sample(text, "wex_errors_total{code=\"EINVAL\"}"));
		T_ASSERT(sample(text, "wex_requests_total{op=\"ping\"}") == (pings < 0 ? 0 : pings) + 1,
			 "the refused ping counted as a request: wex_requests_total{op=\"ping\"} %g, "
			 "was %g", sample(text, "wex_requests_total{op=\"ping\"}"), pings);
		free(text);
		close(nul);
		close(fd);
	}

	t_wexd_stop(&d);
	printf("metrics_reports: PASS\n");
	t_exit(T_EXIT_PASS);
}
