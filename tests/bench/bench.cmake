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
