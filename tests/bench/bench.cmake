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
# Copies into transposed tensors (the host copy executor's tiles) against
# memcpy and the element loop; the small size in CTest (seconds), the full
# one ([4096, 8192]) by hand.
wex_add_test(bench_host_transpose SOURCES tests/bench/host_transpose.c LABELS bench TIMEOUT 120)
set_tests_properties(bench_host_transpose PROPERTIES ENVIRONMENT "WEX_BENCH_SMALL=1")
# The host comparison (`wexctl verify`, WEX_SYNC_VERIFY) of the same ops
# against memcmp and the element loop; small in CTest, full by hand.
wex_add_test(bench_verify_transpose SOURCES tests/bench/verify_transpose.c LABELS bench TIMEOUT 120)
set_tests_properties(bench_verify_transpose PROPERTIES ENVIRONMENT "WEX_BENCH_SMALL=1")
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
  # bench_json_test(NAME MODE BENCH TARGET TIMEOUT ENV): bench_json.py's
  # MODE check of TARGET, whose JSON names itself BENCH.
  function(bench_json_test name mode bench target timeout env)
    add_test(NAME ${name} COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py
      ${mode} ${bench} $<TARGET_FILE:${target}>)
    set_tests_properties(${name} PROPERTIES LABELS "bench" TIMEOUT ${timeout} ENVIRONMENT "${env}")
  endfunction()
  set(hs_env "WEX_BENCH_SMALL=1;WEXD_BIN=$<TARGET_FILE:wexd>")
  bench_json_test(bench_host_sync_json cpu host_sync host_sync 120
    "${hs_env};WEX_BENCH_JSON_KEYS=runs,baseline_runs,error,baselines.stream_ms,baselines.limit_ms,ratios.copy_vs_limit,ratios.copy_vs_memcpy,ratios.copy_vs_socket,remap_metadata_ms,remap_touched_ms,ratios.remap_touched_vs_copy")
  bench_json_test(bench_host_sync_term_json cputerm host_sync host_sync 120 "${hs_env}")
  bench_json_test(bench_host_sync_lost_copy_json cpufail host_sync host_sync_lost_copy 60 "${hs_env}")
  if(TARGET bench_plan_scale)
    # One instance (seconds); a config that is not there.
    bench_json_test(bench_plan_scale_json cpu plan_scale bench_plan_scale 120
      "WEX_SRC=${CMAKE_SOURCE_DIR};WEX_PLAN_SCALE_INSTANCES=1;WEX_BENCH_JSON_KEYS=plan_vs_limit,busiest_link_vs_bound")
    bench_json_test(bench_plan_scale_fail_json cpufail plan_scale bench_plan_scale 60 "WEX_SRC=/nonexistent")
  endif()
endif()
# plan_scale's 2 s limit is for its 32 instances: a run of one is not
# judged against it (plan_vs_limit null; it read 0.05 "of the limit").
if(TARGET bench_plan_scale)
  add_test(NAME bench_plan_scale_one_unjudged COMMAND bench_plan_scale)
  set_tests_properties(bench_plan_scale_one_unjudged PROPERTIES LABELS "bench" TIMEOUT 120
    ENVIRONMENT "WEX_SRC=${CMAKE_SOURCE_DIR};WEX_PLAN_SCALE_INSTANCES=1"
    PASS_REGULAR_EXPRESSION "\"instances\":1,[^\n]*\"plan_vs_limit\":null,")
endif()
# A SIGTERM while a failed run's exit handler cleans up adds no second
# JSON line after the one saying why it failed.
add_test(NAME bench_host_sync_term_after_error COMMAND sh ${CMAKE_SOURCE_DIR}/tests/bench/term_after_error.sh
  $<TARGET_FILE:host_sync_lost_copy> $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync_term_after_error PROPERTIES LABELS "bench" TIMEOUT 60 SKIP_RETURN_CODE 77)
# host_sync with its same-address syncs made to map nothing: it must fail
# its check, not post a figure (the engine's buffer held the copied bytes).
add_test(NAME bench_host_sync_lost_fixed COMMAND host_sync_lost_copy $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync_lost_fixed PROPERTIES LABELS "bench" TIMEOUT 60
  ENVIRONMENT "WEX_BENCH_SMALL=1;WEX_BENCH_LOSE=fixed" PASS_REGULAR_EXPRESSION "host_sync: same-address remapped bytes are wrong")
