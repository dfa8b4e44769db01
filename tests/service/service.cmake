# Service tests (issue 6): a live wexd driven as an operator would.
set(SVC ${CMAKE_SOURCE_DIR}/tests/service)
add_test(NAME svc_access_control COMMAND sh ${SVC}/access_control.sh
  $<TARGET_FILE:wexd> $<TARGET_FILE:wex-producer> $<TARGET_FILE:wexctl>)
add_test(NAME svc_socket_activate COMMAND sh ${SVC}/socket_activate.sh
  $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl> $<TARGET_FILE:wex-producer>)
add_test(NAME svc_socket_activate_epoll COMMAND sh ${SVC}/socket_activate.sh
  $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl> $<TARGET_FILE:wex-producer>)
set_tests_properties(svc_socket_activate_epoll PROPERTIES ENVIRONMENT "WEX_IO=epoll")
add_test(NAME svc_reload_flags COMMAND sh ${SVC}/reload_flags.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_wait_group_restart COMMAND sh ${SVC}/wait_group_restart.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex-producer>)
add_test(NAME svc_activation_drain COMMAND sh ${SVC}/activation_drain.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex-producer>)
add_test(NAME svc_activation_drain_epoll COMMAND sh ${SVC}/activation_drain.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex-producer>)
set_tests_properties(svc_activation_drain_epoll PROPERTIES ENVIRONMENT "WEX_IO=epoll")
add_test(NAME svc_max_clients COMMAND sh ${SVC}/max_clients.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_max_clients_admin COMMAND sh ${SVC}/max_clients_admin.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_max_clients_per_uid COMMAND sh ${SVC}/max_clients_per_uid.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_socket_path COMMAND sh ${SVC}/socket_path.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_io_fallback COMMAND sh ${SVC}/io_fallback.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_io_transient COMMAND sh ${SVC}/io_transient.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_io_no_sqe COMMAND sh ${SVC}/io_no_sqe.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_io_dropped COMMAND sh ${SVC}/io_dropped.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_io_recv_give_up COMMAND sh ${SVC}/io_recv_give_up.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_io_dropped_no_sqe COMMAND sh ${SVC}/io_dropped_no_sqe.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_io_retry_stress COMMAND sh ${SVC}/io_retry_stress.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_drain_timeout COMMAND sh ${SVC}/drain_timeout.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex-producer>)
add_test(NAME svc_cli COMMAND sh ${SVC}/cli.sh
  $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl> $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_cli_epoll COMMAND sh ${SVC}/cli.sh
  $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl> $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
set_tests_properties(svc_cli_epoll PROPERTIES ENVIRONMENT "WEX_IO=epoll")
add_test(NAME svc_cli_errors COMMAND sh ${SVC}/cli_errors.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex-consumer>)
add_test(NAME svc_journal_log COMMAND sh ${SVC}/journal_log.sh $<TARGET_FILE:wexd>)
add_test(NAME svc_inherited_fds COMMAND sh ${SVC}/inherited_fds.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_cli_hung COMMAND sh ${SVC}/cli_hung.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_metrics_restore COMMAND sh ${SVC}/metrics_restore.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer>)
add_test(NAME svc_readme_run_wexd COMMAND sh ${SVC}/readme_run_wexd.sh ${CMAKE_SOURCE_DIR}/README.md
  $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_readme_run_wexd PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
wex_add_test(svc_sigterm_sync SOURCES tests/service/sigterm_sync.c LIBS wex wex_example_model LABELS service TIMEOUT 120)
set_tests_properties(svc_access_control svc_cli_errors svc_journal_log svc_inherited_fds svc_cli_hung svc_metrics_restore svc_max_clients svc_max_clients_admin svc_max_clients_per_uid svc_socket_path svc_io_fallback svc_io_transient svc_io_no_sqe svc_io_dropped svc_io_recv_give_up svc_io_dropped_no_sqe svc_io_retry_stress svc_drain_timeout svc_reload_flags svc_wait_group_restart svc_activation_drain svc_activation_drain_epoll svc_socket_activate svc_socket_activate_epoll svc_cli
  svc_cli_epoll PROPERTIES
  LABELS service TIMEOUT 120 SKIP_RETURN_CODE 77)
add_test(NAME svc_notify_reload COMMAND sh ${SVC}/notify_reload.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer>)
set_tests_properties(svc_notify_reload PROPERTIES LABELS service TIMEOUT 120 SKIP_RETURN_CODE 77)
add_test(NAME svc_notify_stuck COMMAND sh ${SVC}/notify_stuck.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_notify_stuck PROPERTIES LABELS service TIMEOUT 180 SKIP_RETURN_CODE 77)
add_test(NAME svc_fuse_fd COMMAND sh ${SVC}/fuse_fd.sh $<TARGET_FILE:wexd>)
add_test(NAME svc_fuse_fd_epoll COMMAND sh ${SVC}/fuse_fd.sh $<TARGET_FILE:wexd>)
set_tests_properties(svc_fuse_fd_epoll PROPERTIES ENVIRONMENT "WEX_IO=epoll")
set_tests_properties(svc_fuse_fd svc_fuse_fd_epoll PROPERTIES LABELS service TIMEOUT 60
  SKIP_RETURN_CODE 77)
add_test(NAME svc_reload_env COMMAND sh ${SVC}/reload_env.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
add_test(NAME svc_metrics_declared COMMAND sh ${SVC}/metrics_declared.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_reload_env svc_metrics_declared PROPERTIES LABELS service TIMEOUT 60)
add_test(NAME svc_held_status COMMAND sh ${SVC}/held_status.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex>)
set_tests_properties(svc_held_status PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_journal_faults COMMAND sh ${SVC}/journal_faults.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex>)
set_tests_properties(svc_journal_faults PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_journal_readonly COMMAND sh ${SVC}/journal_readonly.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_journal_readonly PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_journal_off_fixed_readonly COMMAND sh ${SVC}/journal_off_fixed_readonly.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_journal_off_fixed_readonly PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_journal_unwritable_later COMMAND sh ${SVC}/journal_unwritable_later.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wexctl>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex>)
set_tests_properties(svc_journal_unwritable_later PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_journal_warn_once COMMAND sh ${SVC}/journal_warn_once.sh $<TARGET_FILE:wexd>
  $<TARGET_FILE:wex-producer> $<TARGET_FILE:wex>)
set_tests_properties(svc_journal_warn_once PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_notify_watchdog_gap COMMAND sh ${SVC}/notify_watchdog_gap.sh $<TARGET_FILE:wexd>)
set_tests_properties(svc_notify_watchdog_gap PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
add_test(NAME svc_plan_watchdog COMMAND sh ${SVC}/plan_watchdog.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex>)
set_tests_properties(svc_plan_watchdog PROPERTIES LABELS service TIMEOUT 180 SKIP_RETURN_CODE 77)
add_test(NAME svc_plan_async COMMAND sh ${SVC}/plan_async.sh $<TARGET_FILE:wexd> $<TARGET_FILE:wex> $<TARGET_FILE:wexctl>)
set_tests_properties(svc_plan_async PROPERTIES LABELS service TIMEOUT 240 SKIP_RETURN_CODE 77)
add_test(NAME svc_unit_caps COMMAND sh ${SVC}/unit_caps.sh ${CMAKE_SOURCE_DIR}/systemd/wexd.service
  $<TARGET_FILE:wexd> $<TARGET_FILE:wex>)
set_tests_properties(svc_unit_caps PROPERTIES LABELS service TIMEOUT 60 SKIP_RETURN_CODE 77)
# They create the user wex-allowed where it is missing (a fresh machine):
# at once, one's useradd found the other's user and failed.
set_tests_properties(svc_access_control svc_unit_caps svc_max_clients_per_uid PROPERTIES
  RESOURCE_LOCK wex_test_users)
if(WEX_SANITIZE)
  # libwex is instrumented: the Python engine needs the ASan runtime first.
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE WEX_SVC_ASAN_RT OUTPUT_STRIP_TRAILING_WHITESPACE)
  set_tests_properties(svc_held_status svc_journal_faults svc_journal_warn_once svc_journal_unwritable_later svc_cli_errors svc_unit_caps svc_plan_watchdog svc_plan_async PROPERTIES ENVIRONMENT "WEX_PY_PRELOAD=${WEX_SVC_ASAN_RT}")
endif()
wex_add_test(svc_client_errors SOURCES tests/service/client_errors.c LIBS wex_test_foundation wex wex_example_model
  LABELS service TIMEOUT 60)
