/* SPDX-License-Identifier: MIT */
/* metrics.c - fixed tables of series and a Prometheus text renderer.  The
 * daemon is single-threaded, so plain fields suffice. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "proto.h"
#include "wex.h"

/* Seconds; from a 100 us remap to a minute-long copy over a slow link. */
static const double bucket_le[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
				    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
				    5,      10,      30,     60,    120 };
static const char *const bucket_text[] = { "0.0001", "0.00025", "0.0005", "0.001", "0.0025",
					   "0.005",  "0.01",    "0.025",  "0.05",  "0.1",
					   "0.25",   "0.5",     "1",      "2.5",   "5",
					   "10",     "30",      "60",     "120" };
#define NBUCKETS ((int)WEX_ARRAY_SIZE(bucket_le))

_Static_assert(WEX_METRICS_LABEL_MAX >= WEX_NAME_MAX, "metric labels hold whole names");

struct series {
	char label[2][WEX_METRICS_LABEL_MAX];
	uint64_t count;             /* counters; histogram observations */
	double sum;                 /* histograms */
	uint64_t bucket[NBUCKETS];  /* histograms, not cumulative */
};

struct family {
	const char *name;
	const char *help;
	const char *label[2]; /* label names; NULL when absent */
	struct series s[WEX_METRICS_MAX_SERIES];
	int n;
};

static struct family counters[WEX_M_COUNTER_COUNT] = {
	[WEX_M_SYNCS] = { "wex_syncs_total", "Consumer syncs completed, by mode.", { "mode" } },
	[WEX_M_SYNC_BYTES] = { "wex_sync_bytes_total",
			       "Bytes made visible to consumers by syncs, by mode and memory backend.",
			       { "mode", "backend" } },
	[WEX_M_ERRORS] = { "wex_errors_total", "Requests answered with an error, by error code.",
			   { "code" } },
	[WEX_M_REFUSED] = { "wex_refused_connections_total",
			    "Connections refused (access lists, max_clients, max_clients_per_uid, "
			    "draining, no fd left "
			    "for a pidfd), and config set/reload and verify requests by users other "
			    "than root and wexd's own, by reason.",
			    { "reason" } },
	[WEX_M_REQUESTS] = { "wex_requests_total", "Control requests received, by operation.",
			     { "op" } },
	[WEX_M_BEGIN_WRITE_TIMEOUTS] = { "wex_begin_write_timeouts_total",
					 "begin_write calls that gave up waiting for leases (EBUSY), "
					 "by model.",
					 { "model" } },
	[WEX_M_VERIFIES] = { "wex_verifications_total",
			     "Consumer ranks' comparisons of their weights with the producer's "
			     "(wexctl verify, WEX_SYNC_VERIFY), by result: equal, differ, "
			     "unverifiable (a view sync), failed (could not compare).",
			     { "result" } },
	[WEX_M_FALLBACKS] = { "wex_sync_fallbacks_total",
			      "Consumer syncs that ran on a weaker path than wex's default, by "
			      "fallback: pageable_staging (host memory copied onto a GPU "
			      "unpinned), rw_mapping (a trainer's GPU memory mapped read-write: "
			      "the driver refused read-only), unpinned_verify (verification's "
			      "gather buffers not page-locked).",
			      { "fallback" } },
	[WEX_M_RELOADS] = { "wex_config_reloads_total",
			    "Reloads of the configuration file (SIGHUP, wexctl config reload), by "
			    "result: ok, refused (the running configuration kept).",
			    { "result" } },
	[WEX_M_LOOP_RETRIES] = { "wex_event_loop_retries_total",
				 "Waits of the io_uring event loop that failed for the moment and "
				 "were retried, by error: EAGAIN (the kernel short of memory for a "
				 "submission), EBUSY (the completion queue overflowed), EBADR (the "
				 "kernel dropped completions; wexd carried on); no_sqe: requests "
				 "the ring had no room for, queued again at the next turn.",
				 { "error" } },
};

static struct family histograms[WEX_M_HISTOGRAM_COUNT] = {
	[WEX_M_SYNC_SECONDS] = { "wex_sync_duration_seconds",
				 "Time from a consumer's sync request to its completion, by mode.",
				 { "mode" } },
	[WEX_M_PUBLISH_VISIBLE] = { "wex_publish_to_visible_seconds",
				    "Time from the first producer rank's publish of a version to "
				    "its visibility (all ranks published)." },
	[WEX_M_BEGIN_WRITE_WAIT] = { "wex_begin_write_wait_seconds",
				     "Time begin_write waited for leases on the buffer to end, "
				     "including waits that timed out." },
};

static const struct {
	const char *name, *help;
} gauge_meta[WEX_M_GAUGE_COUNT] = {
	[WEX_M_CLIENTS] = { "wex_clients", "Connected clients." },
	[WEX_M_LEASES] = { "wex_leases", "Leases held by consumer groups." },
	[WEX_M_SEGMENTS] = { "wex_segments", "Memory segments registered by producers." },
	[WEX_M_EXPORTED] = { "wex_exported_bytes", "Bytes in registered memory segments." },
	[WEX_M_MODELS] = { "wex_models", "Models known to the daemon." },
};
static double gauges[WEX_M_GAUGE_COUNT];

static char info_version[WEX_METRICS_LABEL_MAX], info_backend[WEX_METRICS_LABEL_MAX];
static int info_set;

/* Copies a label value, replacing bytes that would make the exposition
 * invalid (control characters other than newline, which is escaped, and
 * what is not UTF-8: a cut inside a character too) with '?'.  UTF-8 stays:
 * the format takes it, and model names may be any (two names of one
 * length, all '?', would share one series). */
static void copy_label(char *dst, const char *src)
{
	size_t i = 0;

	for (; src && src[i] && i < WEX_METRICS_LABEL_MAX - 1; i++) {
		unsigned char c = (unsigned char)src[i];

		dst[i] = ((c < 0x20 && c != '\n') || c == 0x7f) ? '?' : (char)c;
	}
	dst[i] = '\0';
	wex__utf8_scrub(dst);
}

/* Finds or adds the series for (l1, l2); the last slot is "other". */
static struct series *series_get(struct family *f, const char *l1, const char *l2)
{
	const char *want[2] = { f->label[0] ? (l1 ? l1 : "") : "", f->label[1] ? (l2 ? l2 : "") : "" };
	char tmp[2][WEX_METRICS_LABEL_MAX];
	struct series *s;

	copy_label(tmp[0], want[0]);
	copy_label(tmp[1], want[1]);
	for (int i = 0; i < f->n; i++) {
		s = &f->s[i];
		if (!strcmp(s->label[0], tmp[0]) && !strcmp(s->label[1], tmp[1]))
			return s;
	}
	if (f->n == WEX_METRICS_MAX_SERIES - 1) {
		/* Full: one shared overflow series. */
		copy_label(tmp[0], f->label[0] ? "other" : "");
		copy_label(tmp[1], f->label[1] ? "other" : "");
		for (int i = 0; i < f->n; i++) {
			s = &f->s[i];
			if (!strcmp(s->label[0], tmp[0]) && !strcmp(s->label[1], tmp[1]))
				return s;
		}
	}
	if (f->n == WEX_METRICS_MAX_SERIES)
		return &f->s[f->n - 1];
	s = &f->s[f->n++];
	memset(s, 0, sizeof(*s));
	memcpy(s->label, tmp, sizeof(tmp));
	return s;
}

void wex__metrics_count(enum wex_counter c, const char *l1, const char *l2, uint64_t n)
{
	if ((unsigned)c >= WEX_M_COUNTER_COUNT)
		return;
	series_get(&counters[c], l1, l2)->count += n;
}

void wex__metrics_observe(enum wex_histogram h, const char *l1, double seconds)
{
	struct series *s;

	if ((unsigned)h >= WEX_M_HISTOGRAM_COUNT)
		return;
	if (!(seconds > 0)) /* also NaN */
		seconds = 0;
	s = series_get(&histograms[h], l1, NULL);
	s->count++;
	s->sum += seconds;
	for (int i = 0; i < NBUCKETS; i++) {
		if (seconds <= bucket_le[i]) {
			s->bucket[i]++;
			break;
		}
	}
}

void wex__metrics_set(enum wex_gauge g, double v)
{
	if ((unsigned)g < WEX_M_GAUGE_COUNT)
		gauges[g] = v;
}

void wex__metrics_add(enum wex_gauge g, double delta)
{
	if ((unsigned)g < WEX_M_GAUGE_COUNT)
		gauges[g] += delta;
}

void wex__metrics_set_info(const char *version, const char *io_backend)
{
	copy_label(info_version, version);
	copy_label(info_backend, io_backend);
	info_set = 1;
}

void wex__metrics_sync(const char *mode, const char *backend, uint64_t bytes, double seconds)
{
	wex__metrics_count(WEX_M_SYNCS, mode, NULL, 1);
	wex__metrics_count(WEX_M_SYNC_BYTES, mode, backend, bytes);
	wex__metrics_observe(WEX_M_SYNC_SECONDS, mode, seconds);
}

void wex__metrics_reset(void)
{
	for (int i = 0; i < WEX_M_COUNTER_COUNT; i++)
		counters[i].n = 0;
	for (int i = 0; i < WEX_M_HISTOGRAM_COUNT; i++)
		histograms[i].n = 0;
	memset(gauges, 0, sizeof(gauges));
	info_set = 0;
}

struct buf {
	char *p;
	size_t len, cap;
	int oom;
};

static void __attribute__((format(printf, 2, 3))) bprintf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = 1;
			return;
		}
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = (b->cap + (size_t)n + 1) * 2;
		char *p = realloc(b->p, cap);

		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

/* Label values escape backslash, double quote and newline; HELP text
 * escapes backslash and newline (the exposition format's rules). */
static void bescape(struct buf *b, const char *s, int quote)
{
	for (; *s; s++) {
		if (*s == '\\')
			bprintf(b, "\\\\");
		else if (*s == '\n')
			bprintf(b, "\\n");
		else if (*s == '"' && quote)
			bprintf(b, "\\\"");
		else
			bprintf(b, "%c", *s);
	}
}

/* Shortest decimal that reads back as the same double. */
static void bdouble(struct buf *b, double v)
{
	char tmp[40];

	if (isnan(v)) {
		bprintf(b, "NaN");
		return;
	}
	if (isinf(v)) {
		bprintf(b, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(tmp, sizeof(tmp), "%.*g", prec, v);
		if (strtod(tmp, NULL) == v)
			break;
	}
	bprintf(b, "%s", tmp);
}

static void bheader(struct buf *b, const char *name, const char *help, const char *type)
{
	bprintf(b, "# HELP %s ", name);
	bescape(b, help, 0);
	bprintf(b, "\n# TYPE %s %s\n", name, type);
}

/* Writes {a="x",b="y"[,le="..."]} or nothing when there are no labels. */
static void blabels(struct buf *b, const struct family *f, const struct series *s, const char *le)
{
	int n = 0;

	for (int i = 0; i < 2; i++) {
		if (!f->label[i])
			continue;
		bprintf(b, "%s%s=\"", n++ ? "," : "{", f->label[i]);
		bescape(b, s->label[i], 1);
		bprintf(b, "\"");
	}
	if (le)
		bprintf(b, "%sle=\"%s\"", n++ ? "," : "{", le);
	if (n)
		bprintf(b, "}");
}

char *wex__metrics_render(void)
{
	struct buf b = { 0 };

	b.cap = 8192;
	b.p = malloc(b.cap);
	if (!b.p)
		return NULL;
	for (int i = 0; i < WEX_M_COUNTER_COUNT; i++) {
		const struct family *f = &counters[i];

		bheader(&b, f->name, f->help, "counter");
		for (int j = 0; j < f->n; j++) {
			bprintf(&b, "%s", f->name);
			blabels(&b, f, &f->s[j], NULL);
			bprintf(&b, " %llu\n", (unsigned long long)f->s[j].count);
		}
	}
	for (int i = 0; i < WEX_M_HISTOGRAM_COUNT; i++) {
		const struct family *f = &histograms[i];
		struct series zero = { 0 };
		int n = f->n;

		bheader(&b, f->name, f->help, "histogram");
		/* An unlabelled histogram always has its one series, so that
		 * rate() works from the first scrape. */
		if (!n && !f->label[0])
			n = 1;
		for (int j = 0; j < n; j++) {
			const struct series *s = j < f->n ? &f->s[j] : &zero;
			uint64_t cum = 0;

			for (int k = 0; k < NBUCKETS; k++) {
				cum += s->bucket[k];
				bprintf(&b, "%s_bucket", f->name);
				blabels(&b, f, s, bucket_text[k]);
				bprintf(&b, " %llu\n", (unsigned long long)cum);
			}
			bprintf(&b, "%s_bucket", f->name);
			blabels(&b, f, s, "+Inf");
			bprintf(&b, " %llu\n", (unsigned long long)s->count);
			bprintf(&b, "%s_sum", f->name);
			blabels(&b, f, s, NULL);
			bprintf(&b, " ");
			bdouble(&b, s->sum);
			bprintf(&b, "\n%s_count", f->name);
			blabels(&b, f, s, NULL);
			bprintf(&b, " %llu\n", (unsigned long long)s->count);
		}
	}
	for (int i = 0; i < WEX_M_GAUGE_COUNT; i++) {
		bheader(&b, gauge_meta[i].name, gauge_meta[i].help, "gauge");
		bprintf(&b, "%s ", gauge_meta[i].name);
		bdouble(&b, gauges[i]);
		bprintf(&b, "\n");
	}
	if (info_set) {
		bheader(&b, "wex_info", "Build and event loop of the running daemon.", "gauge");
		bprintf(&b, "wex_info{version=\"");
		bescape(&b, info_version, 1);
		bprintf(&b, "\",io_backend=\"");
		bescape(&b, info_backend, 1);
		bprintf(&b, "\"} 1\n");
	}
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
