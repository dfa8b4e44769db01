# CTest suite.  Fragments of tests/ register their programs here.

# ---------------------------------------------------------------------------
# Issue 2, "foundation": protocol, fd passing, versions/leases/groups,
# bad input (and a seeded protocol fuzz, WEX_FUZZ_ITERS/WEX_FUZZ_SEED), fd
# exhaustion, crash safety, remap modes, host copies, daemon restart and the
# quickstart.  One program per behaviour (tests/foundation/*.c); every test
# that talks to wexd runs twice, once per event-loop backend, and checks via
# `status` that the backend it asked for is the one in use.
add_library(wex_test_foundation STATIC tests/foundation/helpers.c)
target_link_libraries(wex_test_foundation PUBLIC wex_core)

# wex_foundation_test(NAME [LIBS ...] [ARGS ...] [TIMEOUT s] [LOOP]):
# LOOP registers NAME_epoll and NAME_uring (WEX_IO forced), else NAME; one
# program NAME either way (two of each source were 50 programs more to
# compile and link in each of tests/run.sh's builds).
function(wex_foundation_test name)
  cmake_parse_arguments(F "LOOP" "TIMEOUT" "LIBS;ARGS" ${ARGN})
  if(NOT F_TIMEOUT)
    set(F_TIMEOUT 60)
  endif()
  set(src tests/foundation/${name}.c)
  if(F_LOOP)
    foreach(io epoll uring)
      if(io STREQUAL "uring")
        set(env WEX_IO=io_uring)
      else()
        set(env WEX_IO=epoll)
      endif()
      wex_add_test(${name}_${io} PROGRAM ${name} SOURCES ${src}
        LIBS wex_test_foundation ${F_LIBS}
        ARGS ${F_ARGS} LABELS foundation ENV ${env} TIMEOUT ${F_TIMEOUT})
    endforeach()
  else()
    wex_add_test(${name} SOURCES ${src} LIBS wex_test_foundation ${F_LIBS}
      ARGS ${F_ARGS} LABELS foundation TIMEOUT ${F_TIMEOUT})
  endif()
endfunction()

set(WEX_FX_LIBS wex wex_example_model)
wex_foundation_test(proto_roundtrip LOOP)
wex_foundation_test(fd_passing)
wex_foundation_test(torn_reads LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(group_atomicity LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(begin_write_timeout LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(cancel_wait LOOP LIBS ${WEX_FX_LIBS} Threads::Threads)
# It interposes sendmsg, for libwex.so's calls too: export it.
set_target_properties(cancel_wait PROPERTIES ENABLE_EXPORTS ON)
wex_foundation_test(writer_priority LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(bad_input LOOP LIBS wex)
wex_foundation_test(api_contract LIBS ${WEX_FX_LIBS})
wex_foundation_test(proto_fuzz LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(fd_exhaustion LOOP)
wex_foundation_test(killed_consumer LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(remap_modes LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(host_remap_faults LIBS ${WEX_FX_LIBS})
# It interposes mmap and mremap, for libwex.so's calls too: export them.
set_target_properties(host_remap_faults PROPERTIES ENABLE_EXPORTS ON)
# Pure CPU (up to 16 copy threads against a byte-by-byte reference): the
# sanitizer build takes 12 s beside an idle test on 2 cores, 32 s beside a
# busy one and 40 s on a loaded machine, too close to the default 60 s.
wex_foundation_test(host_copy TIMEOUT 180)
# The executor and verify against an element-by-element reference over
# random strides of either sign, alignments and element sizes.  CPU-bound:
# 20 s alone under ASan, past 120 s there beside the suite's other heaviest
# tests.
wex_foundation_test(copy_diff TIMEOUT 240)
wex_foundation_test(daemon_restart LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(away_retry LOOP LIBS ${WEX_FX_LIBS} Threads::Threads)
wex_foundation_test(reconnect_short LIBS ${WEX_FX_LIBS})
wex_foundation_test(driver_probe_cost LIBS ${WEX_FX_LIBS})
# A library named like the CUDA runtime (its name starts with "libcuda")
# loaded all along, as in a process that imported PyTorch.
add_library(wex_cudart_stub MODULE tests/foundation/cudart_stub.c)
set_target_properties(wex_cudart_stub PROPERTIES PREFIX "" OUTPUT_NAME libcudart SUFFIX ".so.12")
add_dependencies(driver_probe_cost wex_cudart_stub)
target_link_libraries(driver_probe_cost PRIVATE ${CMAKE_DL_LIBS})
set_property(TEST driver_probe_cost APPEND PROPERTY ENVIRONMENT
  "WEX_T_CUDART=$<TARGET_FILE:wex_cudart_stub>")
wex_foundation_test(stopped_wexd LOOP LIBS ${WEX_FX_LIBS} Threads::Threads TIMEOUT 120)
wex_foundation_test(publish_answer LOOP LIBS ${WEX_FX_LIBS} Threads::Threads TIMEOUT 120)
wex_foundation_test(stopped_register LOOP LIBS ${WEX_FX_LIBS} Threads::Threads TIMEOUT 120)
wex_foundation_test(watch_lock LOOP LIBS ${WEX_FX_LIBS} Threads::Threads TIMEOUT 120)
wex_foundation_test(quickstart_smoke LOOP LIBS wex
  ARGS $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
wex_foundation_test(killed_producer LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(producer_resize LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(many_segments LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(fetch_race LOOP LIBS ${WEX_FX_LIBS})
# It interposes sendmsg, for libwex.so's calls too: export it.
set_target_properties(fetch_race PROPERTIES ENABLE_EXPORTS ON)
wex_foundation_test(reshard_copy LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(empty_rank LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(msg_limit LOOP)
wex_foundation_test(connect_flood LOOP)
# It times how long a connected client waits for its answers during a
# flood of connections, which other tests at once (four per core) stretch
# past its bound without any starvation by wexd: on the dev VM on
# 2026-12-02, alone 250-470 pings and 10-45 ms at worst, among them once
# 21-35 pings and 0.18-0.36 s.  Run alone.
set_tests_properties(connect_flood_epoll connect_flood_uring PROPERTIES RUN_SERIAL TRUE)
# 256 MiB copies checked byte by byte, and a 6 s wait: 19 s in the sanitizer
# build on an idle 2-core box, 83 s loaded beside host_copy.
wex_foundation_test(client_recovery LIBS wex TIMEOUT 240)
wex_foundation_test(daemon_defaults LIBS ${WEX_FX_LIBS})
wex_foundation_test(metrics_reports LIBS ${WEX_FX_LIBS})
wex_foundation_test(stale_memory LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(write_versions LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(group_resize LIBS ${WEX_FX_LIBS})
wex_foundation_test(client_faults LIBS ${WEX_FX_LIBS})
wex_foundation_test(bad_daemon LIBS wex Threads::Threads)
wex_foundation_test(round_rejoin LOOP LIBS ${WEX_FX_LIBS} Threads::Threads)
wex_foundation_test(round_repeat LOOP LIBS ${WEX_FX_LIBS})
wex_foundation_test(group_churn LOOP)
wex_foundation_test(client_count LOOP)
wex_foundation_test(empty_message LOOP)
wex_foundation_test(sync_restart LIBS ${WEX_FX_LIBS})
wex_foundation_test(lease_journal LIBS ${WEX_FX_LIBS})
# Restarts wexd again and again, case after case: 8 to 12 s alone (12 s under ASan),
# past 60 s under ASan among tests/run.sh's others with a load average
# near 8.
wex_foundation_test(round_restarts LIBS ${WEX_FX_LIBS} TIMEOUT 180)
wex_foundation_test(producer_watch LIBS ${WEX_FX_LIBS} Threads::Threads)
# It interposes sendmsg, for libwex.so's calls too: export it.
set_target_properties(sync_restart PROPERTIES ENABLE_EXPORTS ON)
wex_foundation_test(plan_cache LOOP)
wex_foundation_test(fetch_pages LOOP)
wex_foundation_test(segment_fds LOOP)
wex_foundation_test(table_budget LOOP)
wex_foundation_test(mass_disconnect LOOP TIMEOUT 120)
wex_foundation_test(shutdown_many LOOP TIMEOUT 120)
wex_foundation_test(lease_invariants LOOP)
wex_foundation_test(chaos LOOP LIBS ${WEX_FX_LIBS} TIMEOUT 120)
wex_foundation_test(sync_stress LOOP LIBS ${WEX_FX_LIBS} Threads::Threads TIMEOUT 60)
wex_foundation_test(rank_takeover LOOP)
wex_foundation_test(fork_child LOOP LIBS ${WEX_FX_LIBS})
# Kernels before 6.5 have no SO_PEERPIDFD: wexd watches clients through
# pidfd_open on their SO_PEERCRED pid.
wex_add_test(fork_child_pidfd_open PROGRAM fork_child SOURCES tests/foundation/fork_child.c
  LIBS wex_test_foundation ${WEX_FX_LIBS} ARGS pidfd_open LABELS foundation
  ENV "WEX_IO=io_uring;WEX_SOCK_NO_PEERPIDFD=1")
wex_foundation_test(socket_path)
wex_foundation_test(open_errors LIBS wex)
# (Not linked with libwex: it loads it with dlopen, and unloads it.)
wex_foundation_test(lib_unload LIBS ${CMAKE_DL_LIBS} ARGS $<TARGET_FILE:wex>)
# Guarantee 4 on demand: the byte comparison, and WEX_SYNC_VERIFY and
# wexctl verify against a real wexd.  CPU-bound over 1 to 7 threads: 4 s
# idle, up to 36 s in the ASan build on a loaded 2-core box.
wex_foundation_test(verify_ops TIMEOUT 180)
wex_foundation_test(verify_sync LOOP LIBS ${WEX_FX_LIBS} ARGS $<TARGET_FILE:wexctl>)

# ---------------------------------------------------------------------------
# Issue 4, point 1: a build without the CUDA toolkit's headers has the host
# backend alone and says so.  Where cuda.h is found, build_without_cuda
# configures and builds the tree again with it hidden and runs no_cuda_api
# (registered only in such a build) and the quickstart smoke test there;
# in the build without sanitizers only (tests/run.sh runs both: the tree
# built a third time under them would add half a minute for the same
# checks).
if(WEX_HAVE_CUDA_HEADERS)
  if(NOT WEX_SANITIZE)
    add_test(NAME build_without_cuda
      COMMAND sh ${CMAKE_SOURCE_DIR}/tests/gpu/no_cuda_build.sh ${CMAKE_SOURCE_DIR}
        ${CMAKE_BINARY_DIR}/no-cuda ${CUDA_DRIVER_INCLUDE_DIR} ${CMAKE_BUILD_TYPE}
        ${WEX_SANITIZE} "${CMAKE_PREFIX_PATH}")
    set_tests_properties(build_without_cuda PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
      LABELS cuda)
  endif()
else()
  wex_add_test(no_cuda_api SOURCES tests/gpu/no_cuda_api_test.c
    LIBS wex_test_foundation ${WEX_FX_LIBS} LABELS cuda TIMEOUT 60)
  target_include_directories(no_cuda_api PRIVATE ${CMAKE_SOURCE_DIR}/tests/foundation)
endif()
wex_foundation_test(unread_replies LOOP LIBS ${WEX_FX_LIBS})

# tests/run.sh's verdict names the skipped tests' count (a skip is never
# a pass), with cmake and ctest replaced by fakes.
add_test(NAME run_sh_verdict COMMAND sh ${CMAKE_SOURCE_DIR}/tests/run_sh_verdict.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(run_sh_verdict PROPERTIES TIMEOUT 60)
