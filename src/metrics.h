/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - wexd's counters, gauges and histograms, rendered in the
 * Prometheus text exposition format (version 0.0.4).
 *
 * The set of metrics is fixed here; label values are short strings chosen by
 * the daemon (sync modes, backends, error codes, request ops), at most
 * WEX_METRICS_MAX_SERIES per metric: once a metric has that many, further
 * label values are counted under "other", so a misbehaving client cannot
 * grow the table.  Label values are copied (at most WEX_METRICS_LABEL_MAX-1
 * bytes).  For the single-threaded daemon: no locks, nothing blocks, no
 * allocation except in wex__metrics_render.
 */
#ifndef WEX_METRICS_H
#define WEX_METRICS_H

#include <stdint.h>

#define WEX_METRICS_MAX_SERIES 32
/* A model or group name whole (WEX_NAME_MAX): cut short, two would share
 * one series under a name that is neither. */
#define WEX_METRICS_LABEL_MAX 160

enum wex_counter {
	WEX_M_SYNCS = 0,    /* wex_syncs_total{mode} */
	WEX_M_SYNC_BYTES,   /* wex_sync_bytes_total{mode,backend} */
	WEX_M_ERRORS,       /* wex_errors_total{code} */
	WEX_M_REFUSED,      /* wex_refused_connections_total{reason} */
	WEX_M_REQUESTS,     /* wex_requests_total{op} */
	WEX_M_BEGIN_WRITE_TIMEOUTS, /* wex_begin_write_timeouts_total{model} */
	WEX_M_VERIFIES,     /* wex_verifications_total{result} */
	WEX_M_FALLBACKS,    /* wex_sync_fallbacks_total{fallback} */
	WEX_M_RELOADS,      /* wex_config_reloads_total{result} */
	WEX_M_LOOP_RETRIES, /* wex_event_loop_retries_total{error} */
	WEX_M_COUNTER_COUNT
};

enum wex_histogram {
	WEX_M_SYNC_SECONDS = 0,    /* wex_sync_duration_seconds{mode} */
	WEX_M_PUBLISH_VISIBLE,     /* wex_publish_to_visible_seconds */
	WEX_M_BEGIN_WRITE_WAIT,    /* wex_begin_write_wait_seconds */
	WEX_M_HISTOGRAM_COUNT
};

enum wex_gauge {
	WEX_M_CLIENTS = 0,  /* wex_clients */
	WEX_M_LEASES,       /* wex_leases */
	WEX_M_SEGMENTS,     /* wex_segments */
	WEX_M_EXPORTED,     /* wex_exported_bytes */
	WEX_M_MODELS,       /* wex_models */
	WEX_M_GAUGE_COUNT
};

/* Adds n to a counter.  l1/l2 are the label values in the order listed
 * above; pass NULL for labels the counter does not have. */
void wex__metrics_count(enum wex_counter c, const char *l1, const char *l2, uint64_t n);

/* Records one observation (seconds; negative values count as 0).  l1 is
 * the mode label for WEX_M_SYNC_SECONDS, NULL for the others. */
void wex__metrics_observe(enum wex_histogram h, const char *l1, double seconds);

void wex__metrics_set(enum wex_gauge g, double v);
void wex__metrics_add(enum wex_gauge g, double delta);

/* wex_info{version,io_backend} 1: which build and event loop are running.
 * Strings are copied. */
void wex__metrics_set_info(const char *version, const char *io_backend);

/* Convenience for the common case: one finished sync counts the sync, its
 * bytes and its duration. */
void wex__metrics_sync(const char *mode, const char *backend, uint64_t bytes, double seconds);

/*
 * Renders every metric as Prometheus text.  Returns a malloc'd,
 * NUL-terminated string the caller frees, or NULL on ENOMEM.
 */
char *wex__metrics_render(void);

/* Forgets every value (tests, and a daemon that re-initialises). */
void wex__metrics_reset(void);

#endif
