# Benchmarks: each prints its baseline measured in the same run and the ratio
# to it, and ends with one JSON line.  They run in CTest (label bench) so
# that they keep working; speed targets are read from their output, never
# asserted by a timed test.
add_executable(host_sync tests/bench/host_sync.c)
target_link_libraries(host_sync PRIVATE wex wex_example_model)
add_test(NAME bench_host_sync COMMAND host_sync $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync PROPERTIES LABELS "bench" TIMEOUT 600 SKIP_RETURN_CODE 77)
# The small preset end to end (seconds), so that a CI run without the bench
# label's full size still checks the baselines: among others that the
# socket baseline's transfer takes no page faults (a writer forked after
# the destination was written measured copy-on-write, not the socket).
add_test(NAME bench_host_sync_small COMMAND host_sync $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync_small PROPERTIES LABELS "bench" TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "WEX_BENCH_SMALL=1")
# host_sync with its copy syncs made to move nothing (lost_copy.c wraps
# wex_sync): it must fail its check, not post a figure.
add_executable(host_sync_lost_copy tests/bench/host_sync.c tests/bench/lost_copy.c)
target_link_libraries(host_sync_lost_copy PRIVATE wex wex_example_model ${CMAKE_DL_LIBS})
add_test(NAME bench_host_sync_lost_copy COMMAND host_sync_lost_copy $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync_lost_copy PROPERTIES LABELS "bench" TIMEOUT 60
  ENVIRONMENT "WEX_BENCH_SMALL=1" PASS_REGULAR_EXPRESSION "host_sync: copied bytes are wrong")
# Every end, finished or failed, leaves the JSON object as the last line
# (tests/bench/bench_json.py), with "error" null or saying why, and the
# medians' run counts.
find_program(WEX_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(WEX_PYTHON3 python3)
if(WEX_PYTHON3)
  add_test(NAME bench_host_sync_json COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
    cpu host_sync $<TARGET_FILE:host_sync>)
  set_tests_properties(bench_host_sync_json PROPERTIES LABELS "bench" TIMEOUT 120
    ENVIRONMENT "WEX_BENCH_SMALL=1;WEXD_BIN=$<TARGET_FILE:wexd>;WEX_BENCH_JSON_KEYS=runs,baseline_runs,error,baselines.stream_ms,baselines.limit_ms,ratios.copy_vs_limit")
  add_test(NAME bench_host_sync_term_json COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
    cputerm host_sync $<TARGET_FILE:host_sync>)
  set_tests_properties(bench_host_sync_term_json PROPERTIES LABELS "bench" TIMEOUT 120
    ENVIRONMENT "WEX_BENCH_SMALL=1;WEXD_BIN=$<TARGET_FILE:wexd>")
  add_test(NAME bench_host_sync_lost_copy_json COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
    cpufail host_sync $<TARGET_FILE:host_sync_lost_copy>)
  set_tests_properties(bench_host_sync_lost_copy_json PROPERTIES LABELS "bench" TIMEOUT 60
    ENVIRONMENT "WEX_BENCH_SMALL=1;WEXD_BIN=$<TARGET_FILE:wexd>")
  if(TARGET bench_plan_scale)
    # One instance (seconds); a config that is not there.
    add_test(NAME bench_plan_scale_json COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
      cpu plan_scale $<TARGET_FILE:bench_plan_scale>)
    set_tests_properties(bench_plan_scale_json PROPERTIES LABELS "bench" TIMEOUT 120
      ENVIRONMENT "WEX_SRC=${CMAKE_SOURCE_DIR};WEX_PLAN_SCALE_INSTANCES=1;WEX_BENCH_JSON_KEYS=plan_vs_limit,busiest_link_vs_bound")
    add_test(NAME bench_plan_scale_fail_json COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
      cpufail plan_scale $<TARGET_FILE:bench_plan_scale>)
    set_tests_properties(bench_plan_scale_fail_json PROPERTIES LABELS "bench" TIMEOUT 60
      ENVIRONMENT "WEX_SRC=/nonexistent")
  endif()
endif()
