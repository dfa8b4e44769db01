# The long tests that mostly wait first.  Where CTest has no timings of its
# own yet (a clean clone's CI run) it starts tests in descending COST, else
# in the order they are declared: then these started last (py_binding and
# py_binding_vmm_emul, a minute each of waiting on the timeouts they
# prove, ran on alone at the end with the cores half idle).  Only tests
# that wait: with the CPU-bound ones (copy_diff, cuda_cycles_emul,
# verify_ops, the planner's) put first too, those ran all at once under
# the sanitizers and copy_diff passed its 120 s.  Costs: each test's
# longest time in tests/run.sh's two builds (eight tests on two cores) on
# the dev VM on 2026-12-02, where it used a quarter of that or less on a
# core; tests not named keep cost 0.
set(wex_test_costs
  round_restarts 62 svc_cli_errors 60 py_binding 58 py_binding_vmm_emul 57
  svc_socket_path 51 svc_cli_epoll 51 svc_cli 51 lease_journal 44
  lease_invariants_uring 34 lease_invariants_epoll 31 svc_access_control 25)
while(wex_test_costs)
  list(POP_FRONT wex_test_costs name cost)
  if(TEST ${name})
    set_tests_properties(${name} PROPERTIES COST ${cost})
  endif()
endwhile()
