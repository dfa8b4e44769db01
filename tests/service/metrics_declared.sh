#!/bin/sh
# metrics_declared.sh WEXD WEXCTL - proves that the counters an operator
# alerts on (README: wex_config_reloads_total{result="refused"},
# wex_event_loop_retries_total{error="EBADR"}, the refused connections and
# the verifications, and verify among the refused reasons, as README lists
# it) are exposed at 0 from the start.  Before, a series
# appeared only with its first event, at 1: Prometheus' increase() and
# rate() see no rise in a series that starts at 1, so an alert on them
# missed the first refused reload.  Then a refused reload counts 1.
WEXD=$1 WEXCTL=$2
. "$(dirname "$0")/lib.sh"
echo '{}' >"$TMP/wexd.json"
start_wexd --config "$TMP/wexd.json"
"$WEXCTL" metrics >"$TMP/metrics" || fail "wexctl metrics"
for s in 'wex_config_reloads_total{result="ok"}' 'wex_config_reloads_total{result="refused"}' \
	'wex_event_loop_retries_total{error="EBADR"}' 'wex_event_loop_retries_total{error="no_sqe"}' \
	'wex_event_loop_retries_total{error="EAGAIN"}' 'wex_event_loop_retries_total{error="EBUSY"}' \
	'wex_refused_connections_total{reason="access"}' 'wex_refused_connections_total{reason="max_clients"}' \
	'wex_refused_connections_total{reason="draining"}' 'wex_refused_connections_total{reason="fds"}' \
	'wex_refused_connections_total{reason="config"}' 'wex_refused_connections_total{reason="verify"}' \
	'wex_verifications_total{result="equal"}' 'wex_verifications_total{result="differ"}' \
	'wex_verifications_total{result="unverifiable"}' 'wex_verifications_total{result="failed"}'; do
	grep -qxF "$s 0" "$TMP/metrics" || fail "$s is not exposed at 0 at start: $(grep -F "${s%%\{*}" "$TMP/metrics" | grep -v '^#')"
done
echo '{ "log_level": 7 }' >"$TMP/wexd.json"
"$WEXCTL" config reload 2>/dev/null && fail "a bad file was not refused"
"$WEXCTL" metrics | grep -qxF 'wex_config_reloads_total{result="refused"} 1' ||
	fail "the refused reload was not counted: $("$WEXCTL" metrics | grep '^wex_config_reloads_total')"
if command -v promtool >/dev/null 2>&1; then
	"$WEXCTL" metrics | promtool check metrics >"$TMP/prom" 2>&1 || fail "promtool: $(cat "$TMP/prom")"
fi
stop_wexd
[ "$WEXD_RC" = 0 ] || fail "wexd exit code $WEXD_RC"
echo "PASS: the alerting counters start at 0"
