# Benchmarks: each prints its baseline measured in the same run and the ratio
# to it, and ends with one JSON line.  They run in CTest (label bench) so
# that they keep working; speed targets are read from their output, never
# asserted by a timed test.
add_executable(host_sync tests/bench/host_sync.c)
target_link_libraries(host_sync PRIVATE wex wex_example_model)
add_test(NAME bench_host_sync COMMAND host_sync $<TARGET_FILE:wexd>)
set_tests_properties(bench_host_sync PROPERTIES LABELS "bench" TIMEOUT 600 SKIP_RETURN_CODE 77)
