# Operating wexd as a service (issue 6): configuration, metrics, systemd.
# config.c and metrics.c are core (wexctl computes the default socket path;
# tests link them through wex_core); sdnotify.c uses libsystemd where found,
# which only the wexd target links, so it is daemon-only.
list(APPEND WEX_CORE_SOURCES src/config.c src/metrics.c)
list(APPEND WEX_DAEMON_SOURCES src/sdnotify.c)

set(WEX_OPS_TESTS
  ops_config_precedence
  ops_config_invalid
  ops_config_runtime
  ops_config_reload
  ops_config_access
  ops_metrics_render
)
foreach(t ${WEX_OPS_TESTS})
  wex_add_test(${t} SOURCES tests/ops/${t}.c LABELS ops TIMEOUT 30)
endforeach()

# sdnotify.c is compiled into its test with the same switch as wexd; where
# that is libsystemd, ops_sdnotify_native also tests the code a wexd built
# without it runs.
wex_add_test(ops_sdnotify SOURCES tests/ops/ops_sdnotify.c src/sdnotify.c LABELS ops TIMEOUT 30)
if(WEX_HAVE_SYSTEMD)
  target_include_directories(ops_sdnotify PRIVATE ${SYSTEMD_INCLUDE_DIR})
  target_link_libraries(ops_sdnotify PRIVATE ${SYSTEMD_LIBRARY})
  target_compile_definitions(ops_sdnotify PRIVATE WEX_HAVE_SYSTEMD=1)
  wex_add_test(ops_sdnotify_native SOURCES tests/ops/ops_sdnotify.c src/sdnotify.c LABELS ops TIMEOUT 30)
endif()

add_test(NAME ops_install_prefix
  COMMAND sh ${CMAKE_SOURCE_DIR}/tests/ops/install_prefix.sh ${CMAKE_BINARY_DIR})
set_tests_properties(ops_install_prefix PROPERTIES TIMEOUT 60 LABELS ops)
# The quickstart and README's install steps build Release (-O3), which CI's
# builds do not: its optimiser-dependent warnings, with -Werror.  Once, in
# the build without sanitizers (the flags it tests are not the build's).
if(NOT WEX_SANITIZE AND NOT WEX_FUZZ)
  set(WEX_RW_CUDA "")
  if(WEX_HAVE_CUDA_HEADERS)
    set(WEX_RW_CUDA ${CUDA_DRIVER_INCLUDE_DIR})
  endif()
  set(WEX_RW_SYSTEMD 0)
  set(WEX_RW_INCS "${URING_INCLUDE_DIR} ${JANSSON_INCLUDE_DIR}")
  if(WEX_HAVE_SYSTEMD)
    set(WEX_RW_SYSTEMD 1)
    set(WEX_RW_INCS "${WEX_RW_INCS} ${SYSTEMD_INCLUDE_DIR}")
  endif()
  add_test(NAME build_release_warnings
    COMMAND sh ${CMAKE_SOURCE_DIR}/tests/ops/release_warnings.sh ${CMAKE_SOURCE_DIR}
      ${CMAKE_C_COMPILER} "${CMAKE_C_FLAGS_RELEASE}"
      "${WEX_RW_INCS}" "${WEX_RW_CUDA}" "${WEX_RW_SYSTEMD}")
  set_tests_properties(build_release_warnings PROPERTIES TIMEOUT 300 LABELS ops)
endif()
add_test(NAME ops_systemd_verify
  COMMAND sh ${CMAKE_SOURCE_DIR}/tests/ops/systemd_verify.sh ${CMAKE_SOURCE_DIR}/systemd $<TARGET_FILE:wexd>)
set_tests_properties(ops_systemd_verify PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60 LABELS ops)
