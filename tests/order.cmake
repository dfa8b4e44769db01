# The longest tests first.  Where CTest has no timings of its own yet (a
# clean clone's CI run) it starts tests in descending COST, else in the
# order they are declared: then the longest started last (py_binding and
# py_binding_vmm_emul, a minute each of waiting on the timeouts they
# prove, ran on alone at the end with the cores half idle).  Costs: each
# test's longest time in tests/run.sh's two builds (eight tests on two
# cores) on the dev VM on 2026-12-02; tests not named keep cost 0.
set(wex_test_costs
  cuda_cycles_emul 120 build_without_cuda 96 bench_host_sync 92 verify_ops 89
  gpu_sync_lost_copy_emul 79 planner_plan_bound 75 planner_plan_cells 74
  planner_qwen2_convert 71 client_recovery 65 copy_diff 63 round_restarts 62
  svc_cli_errors 60 build_release_warnings 60 planner_plan_ticks 59 py_binding 58
  py_binding_vmm_emul 57 svc_socket_path 51 svc_cli_epoll 51 svc_cli 51
  svc_plan_async 44 lease_journal 44 gpu_sync_emul 42 py_engine_hooks 41
  py_example_rl_loop_errors 39 bench_plan_scale 38 host_staging_emul 35
  planner_convert_fsdp 34 lease_invariants_uring 34 lease_invariants_epoll 31
  svc_plan_watchdog 28 planner_property 28 planner_convert_cli 28
  py_example_rl_loop 26 svc_io_dropped 25 svc_access_control 25)
while(wex_test_costs)
  list(POP_FRONT wex_test_costs name cost)
  # (Some exist in one build only: build_without_cuda, the CUDA ones.)
  if(TEST ${name})
    set_tests_properties(${name} PROPERTIES COST ${cost})
  endif()
endwhile()
