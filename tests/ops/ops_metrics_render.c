/* SPDX-License-Identifier: MIT */
/*
 * ops_metrics_render: proves that wex__metrics_render produces valid
 * Prometheus text exposition: HELP/TYPE for every metric, cumulative
 * histogram buckets ending in +Inf equal to _count, _sum, escaped label
 * values, "other" once a metric has too many label values, and that
 * `promtool check metrics` accepts the output (lint included).  Skips (77)
 * only for the promtool part, after its own checks, when promtool is absent.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/wait.h>

#include "metrics.h"
#include "ops_test.h"

/* Checks every histogram series in text: buckets non-decreasing, +Inf last
 * and equal to the following _count line. */
static void check_histograms(const char *text)
{
	const char *p = text;
	unsigned long long prev = 0, inf = 0;
	int in = 0, nseries = 0;

	while (*p) {
		const char *nl = strchr(p, '\n');
		char line[512];
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		CHECK(len < sizeof(line));
		memcpy(line, p, len);
		line[len] = '\0';
		p += len + (nl ? 1 : 0);
		if (line[0] == '#')
			continue;
		const char *sp = strrchr(line, ' ');

		CHECK(sp != NULL);
		if (strstr(line, "_bucket{")) {
			unsigned long long v = strtoull(sp + 1, NULL, 10);

			if (!in)
				prev = 0;
			in = 1;
			CHECK(v >= prev);
			prev = v;
			if (strstr(line, "le=\"+Inf\"")) {
				inf = v;
				in = 0;
				nseries++;
			}
		} else if (strstr(line, "_count") && strstr(line, "_seconds")) {
			CHECK(strtoull(sp + 1, NULL, 10) == inf);
		}
	}
	CHECK(nseries >= 4);
}

/* Runs promtool check metrics (lint included) on text; 0 when it accepts. */
static int promtool_check(const char *text)
{
	char *path = t_write_tmp(text), cmd[4096];
	int rc;

	snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
	rc = system(cmd);
	unlink(path);
	free(path);
	if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
		fprintf(stderr, "promtool check metrics failed (status %d)\n", rc);
		return -1;
	}
	return 0;
}

int main(void)
{
	char *text, *empty, op[32];
	int rc;

	wex__metrics_reset();
	wex__metrics_sync("view", "cuda_vmm", 1000, 0.0001);
	wex__metrics_sync("view", "cuda_vmm", 24, 0.003);
	wex__metrics_sync("in_place_copy", "host", 1 << 20, 1000.0);
	wex__metrics_count(WEX_M_ERRORS, "EB\"U\\SY\nX", NULL, 1);
	wex__metrics_count(WEX_M_REFUSED, "eacces", NULL, 2);
	/* Bytes that would break the exposition become '?'. */
	wex__metrics_count(WEX_M_ERRORS, "bad\xff\x01", NULL, 1);
	/* Model names are UTF-8 (hello takes any but control characters):
	 * two such names of one length keep a series each, under their own
	 * names, not one "????????????" for both; a cut inside a character
	 * (a label over WEX_METRICS_LABEL_MAX) is what becomes '?'. */
	wex__metrics_count(WEX_M_BEGIN_WRITE_TIMEOUTS, "\u043c\u043e\u0434\u0435\u043b\u044c", NULL, 1);
	wex__metrics_count(WEX_M_BEGIN_WRITE_TIMEOUTS, "\u0437\u0430\u0434\u0430\u0447\u0430", NULL, 2);
	wex__metrics_count(WEX_M_BEGIN_WRITE_TIMEOUTS, "q\"uo\\te sp", NULL, 1);
	{
		char cut[WEX_METRICS_LABEL_MAX + 8];

		memset(cut, 'a', WEX_METRICS_LABEL_MAX - 2);
		snprintf(cut + WEX_METRICS_LABEL_MAX - 2, 8, "\u00e9x");
		wex__metrics_count(WEX_M_BEGIN_WRITE_TIMEOUTS, cut, NULL, 1);
	}
	wex__metrics_observe(WEX_M_PUBLISH_VISIBLE, NULL, 0.02);
	wex__metrics_observe(WEX_M_BEGIN_WRITE_WAIT, NULL, -1); /* clamps to 0 */
	wex__metrics_set(WEX_M_CLIENTS, 3);
	wex__metrics_add(WEX_M_CLIENTS, -1);
	wex__metrics_set(WEX_M_EXPORTED, 16e9);
	wex__metrics_set_info("0.1.0", "epoll");
	for (int i = 0; i < 40; i++) {
		snprintf(op, sizeof(op), "op%d", i);
		wex__metrics_count(WEX_M_REQUESTS, op, NULL, 1);
	}

	text = wex__metrics_render();
	CHECK(text != NULL);
	fputs(text, stdout);

	CHECK_CONTAINS(text, "# HELP wex_syncs_total ");
	CHECK_CONTAINS(text, "# TYPE wex_syncs_total counter\n");
	CHECK_CONTAINS(text, "\nwex_syncs_total{mode=\"view\"} 2\n");
	CHECK_CONTAINS(text, "\nwex_sync_bytes_total{mode=\"view\",backend=\"cuda_vmm\"} 1024\n");
	CHECK_CONTAINS(text, "\nwex_errors_total{code=\"EB\\\"U\\\\SY\\nX\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_refused_connections_total{reason=\"eacces\"} 2\n");
	CHECK_CONTAINS(text, "\nwex_errors_total{code=\"bad??\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_begin_write_timeouts_total{model=\"\u043c\u043e\u0434\u0435\u043b\u044c\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_begin_write_timeouts_total{model=\"\u0437\u0430\u0434\u0430\u0447\u0430\"} 2\n");
	CHECK_CONTAINS(text, "\nwex_begin_write_timeouts_total{model=\"q\\\"uo\\\\te sp\"} 1\n");
	CHECK_CONTAINS(text, "aaaa?\"} 1\n");
	CHECK_CONTAINS(text, "# TYPE wex_sync_duration_seconds histogram\n");
	/* le is inclusive: 0.0001 lands in the first bucket. */
	CHECK_CONTAINS(text, "\nwex_sync_duration_seconds_bucket{mode=\"view\",le=\"0.0001\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_sync_duration_seconds_bucket{mode=\"view\",le=\"0.005\"} 2\n");
	CHECK_CONTAINS(text, "\nwex_sync_duration_seconds_bucket{mode=\"view\",le=\"+Inf\"} 2\n");
	CHECK_CONTAINS(text, "\nwex_sync_duration_seconds_sum{mode=\"view\"} 0.0031\n");
	CHECK_CONTAINS(text, "\nwex_sync_duration_seconds_count{mode=\"view\"} 2\n");
	/* 1000 s is beyond the last finite bucket: only +Inf counts it. */
	CHECK_CONTAINS(text, "{mode=\"in_place_copy\",le=\"120\"} 0\n");
	CHECK_CONTAINS(text, "{mode=\"in_place_copy\",le=\"+Inf\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_publish_to_visible_seconds_bucket{le=\"0.025\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_begin_write_wait_seconds_bucket{le=\"0.0001\"} 1\n");
	CHECK_CONTAINS(text, "\nwex_begin_write_wait_seconds_sum 0\n");
	CHECK_CONTAINS(text, "# TYPE wex_clients gauge\nwex_clients 2\n");
	CHECK_CONTAINS(text, "\nwex_exported_bytes 16000000000\n");
	CHECK_CONTAINS(text, "\nwex_info{version=\"0.1.0\",io_backend=\"epoll\"} 1\n");
	/* 31 distinct ops, then "other" for the 9 beyond. */
	CHECK_CONTAINS(text, "\nwex_requests_total{op=\"op30\"} 1\n");
	CHECK(!strstr(text, "op=\"op31\""));
	CHECK_CONTAINS(text, "\nwex_requests_total{op=\"other\"} 9\n");
	check_histograms(text);

	/* After a reset, unlabelled histograms and gauges still render, and
	 * metrics without samples keep HELP/TYPE. */
	wex__metrics_reset();
	empty = wex__metrics_render();
	CHECK(empty != NULL);
	CHECK_CONTAINS(empty, "\nwex_publish_to_visible_seconds_count 0\n");
	CHECK_CONTAINS(empty, "\nwex_models 0\n");
	CHECK_CONTAINS(empty, "# TYPE wex_syncs_total counter\n");
	CHECK(!strstr(empty, "wex_syncs_total{"));

	if (system("command -v promtool >/dev/null 2>&1") != 0) {
		free(text);
		free(empty);
		printf("SKIP: promtool not found (Debian package: prometheus); format checks "
		       "above passed\n");
		return T_EXIT_SKIP;
	}
	rc = promtool_check(text) | promtool_check(empty);
	free(text);
	free(empty);
	if (rc)
		return T_EXIT_FAIL;
	printf("PASS: promtool check metrics accepts the output\n");
	return T_EXIT_PASS;
}
