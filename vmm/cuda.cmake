# CUDA backends (cuda_vmm, cuda_ipc, GPU copy executor, pinned staging) and
# their tests.  Included optionally from vmm/vmm.cmake; compiled only when
# cuda.h was found (otherwise only vmm/cuda_stub.c).  libcuda is never linked: vmm/cudawrap.c dlopen()s it.
if(WEX_HAVE_CUDA_HEADERS)
  list(APPEND WEX_CORE_SOURCES vmm/cudawrap.c vmm/cuda_copy.c vmm/cuda_vmm.c
       vmm/cuda_ipc.c vmm/cuda_alloc.c vmm/cuda_staging.c)
  add_compile_definitions(WEX_HAVE_CUDA_BACKEND=1)
  # cuda.h for the tests and the bench (wex_core adds it for itself later).
  include_directories(${CUDA_DRIVER_INCLUDE_DIR})
else()
  # wex.h declares the allocator entry points either way: stubs that fail.
  list(APPEND WEX_CORE_SOURCES vmm/cuda_stub.c)
endif()
# wex_cuda_alloc/free/malloc live in the static wex_core: make libwex.so pull their
# object in (nothing in src/client.c references them) so that
# CUDAPluggableAllocator("libwex.so", ...) finds them.  The wex target is
# defined after this fragment, hence the deferred call.
if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.19)
  cmake_language(DEFER CALL target_link_options wex PRIVATE
    "LINKER:--undefined=wex_cuda_alloc" "LINKER:--undefined=wex_cuda_free"
    "LINKER:--undefined=wex_cuda_malloc")
endif()

if(WEX_HAVE_CUDA_HEADERS)
  # Stand-in drivers for the loader's error paths (tests/gpu/fake_cuda.c).
  add_library(wex_fake_cuda MODULE tests/gpu/fake_cuda.c)
  add_library(wex_fake_cuda_noproc MODULE tests/gpu/fake_cuda.c)
  target_compile_definitions(wex_fake_cuda_noproc PRIVATE FAKE_NO_PROC=1)
  set_target_properties(wex_fake_cuda wex_fake_cuda_noproc PROPERTIES PREFIX "" C_VISIBILITY_PRESET hidden)

  # No GPU needed: runs everywhere.
  wex_add_test(cuda_loader SOURCES tests/gpu/cuda_loader_test.c LIBS wex LABELS cuda TIMEOUT 60
    ENV "WEX_FAKE_CUDA=$<TARGET_FILE:wex_fake_cuda>"
        "WEX_FAKE_CUDA_NOPROC=$<TARGET_FILE:wex_fake_cuda_noproc>")
  add_dependencies(cuda_loader wex_fake_cuda wex_fake_cuda_noproc)
endif()

if(WEX_HAVE_CUDA_HEADERS)
  # Need a GPU: each exits 77 printing the reason when there is no driver
  # or no device (the probe runs in a child, so the tests stay fork-safe).
  # In this order on the GPU machine (ctest -L gpu, one at a time): the
  # soak test cuda_cycles last, after the benchmarks' smoke runs, so that
  # a run cut short by its time loses the fewest results.
  foreach(t cuda_facts cuda_vmm cuda_remap cuda_copy cuda_ipc cuda_staging cuda_e2e cuda_chunks cuda_realloc cuda_order cuda_near cuda_verify cuda_released cuda_signal)
    wex_add_test(${t} SOURCES tests/gpu/${t}_test.c LIBS wex LABELS gpu TIMEOUT 120)
  endforeach()
  # cuda_signal stops wexd at a request libwex sends: its sendmsg is
  # found first (the executable exports it).
  set_target_properties(cuda_signal PROPERTIES ENABLE_EXPORTS ON)
  target_link_libraries(cuda_signal PRIVATE ${CMAKE_DL_LIBS})
endif()

if(WEX_HAVE_CUDA_HEADERS)
  # Benchmark (needs a GPU; prints the reason and exits 77 without one).
  # Full run: WEX_BENCH_GB=16 ./gpu_sync ; the ctest entry is a small smoke run.
  add_executable(gpu_sync tests/bench/gpu_sync.c)
  target_link_libraries(gpu_sync PRIVATE wex_core m)
  target_compile_definitions(gpu_sync PRIVATE WEX_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  add_test(NAME gpu_sync_smoke COMMAND gpu_sync)
  set_tests_properties(gpu_sync_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180
    LABELS "gpu;bench"
    ENVIRONMENT "WEX_SRC=${CMAKE_SOURCE_DIR};WEX_BENCH_GB=1;WEX_BENCH_TENSORS=50;WEX_BENCH_TORCH=0")
  # Host staging through wexd, pinned against pageable.  Full run:
  # WEX_BENCH_GB=16 ./host_staging
  add_executable(host_staging tests/bench/host_staging.c)
  target_link_libraries(host_staging PRIVATE wex_core wex m)
  add_test(NAME host_staging_smoke COMMAND host_staging)
  set_tests_properties(host_staging_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180
    LABELS "gpu;bench" ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_BENCH_GB=1;WEX_BENCH_TENSORS=50")
  # What the released-memory check costs per mapping, against the
  # device-to-device copy of the same bytes: 2048 mappings of the
  # granularity (4 GiB at 2 MiB), the most mappings per byte there are.
  add_executable(released_check tests/bench/released_check.c)
  target_link_libraries(released_check PRIVATE wex_core wex m)
  add_test(NAME released_check_smoke COMMAND released_check)
  set_tests_properties(released_check_smoke PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
    LABELS "gpu;bench")
  wex_add_test(cuda_cycles SOURCES tests/gpu/cuda_cycles_test.c LIBS wex LABELS gpu TIMEOUT 120)
  # One GPU test at a time under ctest -j (tests/run.sh runs several per
  # core): cuda_cycles' cuMemGetInfo must stay steady, and the benchmarks'
  # bandwidth is the copy's own.  The rest run beside them.
  set_tests_properties(cuda_facts cuda_vmm cuda_remap cuda_copy cuda_ipc cuda_staging cuda_e2e
    cuda_chunks cuda_realloc cuda_order cuda_near cuda_verify cuda_released cuda_signal
    gpu_sync_smoke host_staging_smoke released_check_smoke cuda_cycles PROPERTIES RESOURCE_LOCK gpu)
endif()

if(WEX_HAVE_CUDA_HEADERS)
  # The GPU tests again, against tests/gpu/emul_cuda.c (the driver API
  # emulated on the CPU, see its header): checks the backends' logic,
  # mappings, refcounts and fd hygiene on machines without a GPU.  Not a
  # substitute for the gpu-labelled runs.  WEX_EMUL_DEFER=1: asynchronous
  # copies wait for a synchronisation, as on a GPU, so a missing wait in
  # wex shows as stale bytes.
  add_library(wex_emul_cuda MODULE tests/gpu/emul_cuda.c)
  set_target_properties(wex_emul_cuda PROPERTIES PREFIX "" C_VISIBILITY_PRESET hidden)
  foreach(t cuda_facts cuda_vmm cuda_remap cuda_copy cuda_ipc cuda_staging gpu_sync host_staging cuda_e2e cuda_chunks cuda_realloc cuda_cycles cuda_order cuda_near cuda_verify cuda_released cuda_signal)
    add_test(NAME ${t}_emul COMMAND ${t})
    set_tests_properties(${t}_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
      ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_SRC=${CMAKE_SOURCE_DIR};WEX_BENCH_GB=0.25;WEX_BENCH_TENSORS=40;WEX_BENCH_SEG_MB=64;WEX_BENCH_TORCH=0")
    add_dependencies(${t} wex_emul_cuda)
  endforeach()
  # 250 of the GPU run's 1000 cycles of view, same-address and copy syncs
  # (the least cuda_cycles takes: five reopens, for the leak checks): over
  # emulated device memory each cycle faults 16 MiB of new pages in (86 ms
  # a cycle on a 2-core VM, 118 ms under the sanitizers).
  set_property(TEST cuda_cycles_emul APPEND PROPERTY ENVIRONMENT "WEX_TEST_CYCLES=250")
  # The benchmarks' logic needs one timed run after the warm-up, not three.
  set_property(TEST gpu_sync_emul host_staging_emul APPEND PROPERTY ENVIRONMENT "WEX_BENCH_REPS=1")
  # On the emulated driver no target is judged: its figures are the CPU's.
  set_tests_properties(gpu_sync_emul PROPERTIES FAIL_REGULAR_EXPRESSION "targets: copy/d2d")
  # A driver answering MAPPED 0 for memory it does not know (host memory):
  # only a range it knows counts as released.  One answering MAPPED with an
  # error everywhere: cuMemGetAddressRange tells mapped from released.
  foreach(v ZERO ERR)
    string(TOLOWER ${v} lv)
    add_test(NAME cuda_released_mapped_${lv}_emul COMMAND cuda_released)
    set_tests_properties(cuda_released_mapped_${lv}_emul PROPERTIES SKIP_RETURN_CODE 77
      TIMEOUT 300 LABELS cuda ENVIRONMENT
      "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_MAPPED_${v}=1")
  endforeach()
  # A driver whose pointer queries refuse a thread without a current
  # context (CUDA_ERROR_INVALID_CONTEXT), as cuMemGetAddressRange does: no
  # context is made for them where the process has none, a borrowed one is
  # unbound again, and device 0 gets none in a process working on device 1.
  foreach(t cuda_copy cuda_e2e cuda_released)
    add_test(NAME ${t}_ptrctx_emul COMMAND ${t})
    set_tests_properties(${t}_ptrctx_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
      ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_PTR_NEEDS_CTX=1;WEX_SRC=${CMAKE_SOURCE_DIR}")
  endforeach()
  # A driver that counts a repeated cuIpcOpenMemHandle of one handle in a
  # context and returns the same pointer (cuda.h; the default emulation
  # refuses it, as older drivers do): each open must still get its close.
  add_test(NAME cuda_ipc_refcount_emul COMMAND cuda_ipc)
  set_tests_properties(cuda_ipc_refcount_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
    ENVIRONMENT "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_IPC_REFCOUNT=1")
  # Drivers older than the headers, as a lent GPU may run: 12.8
  # (cuMemcpyBatchAsync with failIdx) and 12.4 (no batches: one
  # cuMemcpyAsync per copy).
  # Three devices, the driver refusing device 1 access to device 0's
  # memory: device 2 keeps it (peer_reads_alloc).
  add_test(NAME cuda_copy_3dev_emul COMMAND cuda_copy)
  set_tests_properties(cuda_copy_3dev_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
    ENVIRONMENT "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_DEVICES=3")
  foreach(v 12080 12040)
    add_test(NAME cuda_copy_drv${v}_emul COMMAND cuda_copy)
    set_tests_properties(cuda_copy_drv${v}_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
      ENVIRONMENT "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_DRIVER_VERSION=${v}")
  endforeach()
  # A node where fabric handles work (IMEX): wex_cuda_alloc memory carries
  # a fabric handle beside its fd, and fabric-only memory is exported.
  foreach(t cuda_vmm cuda_e2e cuda_chunks)
    add_test(NAME ${t}_fabric_emul COMMAND ${t})
    set_tests_properties(${t}_fabric_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
      ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_FABRIC=1;WEX_SRC=${CMAKE_SOURCE_DIR}")
    # The same node, but importers may not import fabric handles (no IMEX
    # channel access for them): memory with an fd too imports through it;
    # fabric-only memory fails to import, naming IMEX (cuda_vmm checks).
    add_test(NAME ${t}_fabric_noimport_emul COMMAND ${t})
    set_tests_properties(${t}_fabric_noimport_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS cuda
      ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_EMUL_FABRIC=1;WEX_EMUL_NO_FABRIC_IMPORT=CUDA_ERROR_NOT_PERMITTED;WEX_SRC=${CMAKE_SOURCE_DIR}")
  endforeach()
  # The tests as device_run.sh's memcheck step runs them under
  # compute-sanitizer (WEX_UNDER_SANITIZER=1): fd counts and the fault
  # probes left out, a tenth of the leak cycles; the rest must still pass.
  foreach(t cuda_vmm cuda_remap cuda_staging cuda_chunks)
    add_test(NAME ${t}_sanitizer_mode_emul COMMAND ${t})
    set_tests_properties(${t}_sanitizer_mode_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      LABELS cuda
      ENVIRONMENT "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_UNDER_SANITIZER=1;WEX_SRC=${CMAKE_SOURCE_DIR}")
  endforeach()
  # The released-check benchmark's logic (2 driver queries a mapping,
  # the released middle one found) on 64 emulated mappings.
  add_test(NAME released_check_emul COMMAND released_check)
  set_tests_properties(released_check_emul PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
    LABELS "cuda;bench" ENVIRONMENT "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_BENCH_MAPPINGS=64")
  add_dependencies(released_check wex_emul_cuda)
  # gpu_sync on a driver that loses the copies of the copy phase's timed
  # runs (not its warm-up): it must fail its check, not post a figure.
  # The layout of gpu_sync_emul moves T = 273785600 bytes a run; the d2d
  # phase's 1 + 3 runs and the copy warm-up come first: [5T, 8T).
  add_test(NAME gpu_sync_lost_copy_emul COMMAND gpu_sync)
  set_tests_properties(gpu_sync_lost_copy_emul PROPERTIES TIMEOUT 300 LABELS "cuda;bench"
    PASS_REGULAR_EXPRESSION "\"check\":false,\"error\":\"tensors lacked their bytes"
    ENVIRONMENT "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_SRC=${CMAKE_SOURCE_DIR};WEX_BENCH_GB=0.25;WEX_BENCH_TENSORS=40;WEX_BENCH_SEG_MB=64;WEX_BENCH_REPS=3;WEX_BENCH_TORCH=0;WEX_EMUL_LOSE_BYTES=1368928000-2190284800")
  # The benchmarks' last line is their JSON object whatever happens, once,
  # from the benchmark itself (tests/bench/bench_json.py): without a driver
  # (exit 77), after a failed run (exit 1) and when terminated.
  find_program(WEX_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  find_program(WEX_PYTHON3 python3)
  if(WEX_PYTHON3)
    set(bj ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/bench/bench_json.py)
    set(bj_emul "WEXD_BIN=$<TARGET_FILE:wexd>;WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>;WEX_EMUL_DEFER=1;WEX_SRC=${CMAKE_SOURCE_DIR};WEX_BENCH_TORCH=0")
    # host_staging: a wexd that cannot start; a driver that loses every
    # copy (the check fails); SIGTERM mid-run (many versions, so that the
    # run is still going).
    add_test(NAME host_staging_json_fail_emul COMMAND ${bj} fail host_staging $<TARGET_FILE:host_staging>)
    set_tests_properties(host_staging_json_fail_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEXD_BIN=/bin/false;WEX_BENCH_GB=0.01;WEX_BENCH_TENSORS=8;WEX_BENCH_REPS=1")
    add_test(NAME host_staging_lost_copy_emul COMMAND ${bj} fail host_staging $<TARGET_FILE:host_staging>)
    set_tests_properties(host_staging_lost_copy_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEX_BENCH_GB=0.01;WEX_BENCH_TENSORS=8;WEX_BENCH_REPS=1;WEX_EMUL_LOSE_BYTES=0-18446744073709551615")
    add_test(NAME host_staging_json_term_emul COMMAND ${bj} term host_staging $<TARGET_FILE:host_staging>)
    set_tests_properties(host_staging_json_term_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEX_BENCH_GB=0.01;WEX_BENCH_TENSORS=8;WEX_BENCH_REPS=100000")
    # gpu_sync: SIGTERM mid-run; the line has every key, the ratios too.
    add_test(NAME gpu_sync_json_term_emul COMMAND ${bj} term gpu_sync $<TARGET_FILE:gpu_sync>)
    set_tests_properties(gpu_sync_json_term_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEX_BENCH_GB=0.01;WEX_BENCH_TENSORS=8;WEX_BENCH_REPS=100000;WEX_BENCH_JSON_KEYS=emulated,copy_vs_d2d,remap_ms,copy_vs_torch_ipc_per_tensor,remap_vs_torch_ipc_per_tensor")
    # released_check: a driver answering MAPPED with an error (five
    # queries a mapping: the check fails); SIGTERM mid-run.
    add_test(NAME released_check_json_fail_emul COMMAND ${bj} fail released_check $<TARGET_FILE:released_check>)
    set_tests_properties(released_check_json_fail_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEX_BENCH_MAPPINGS=16;WEX_EMUL_MAPPED_ERR=1")
    add_test(NAME released_check_json_term_emul COMMAND ${bj} term released_check $<TARGET_FILE:released_check>)
    set_tests_properties(released_check_json_term_emul PROPERTIES ENVIRONMENT
      "${bj_emul};WEX_BENCH_MAPPINGS=16;WEX_BENCH_REPS=1000000;WEX_BENCH_JSON_KEYS=check_ms,d2d_ms,check_vs_d2d")
    set_tests_properties(host_staging_json_fail_emul host_staging_lost_copy_emul
      host_staging_json_term_emul gpu_sync_json_term_emul released_check_json_fail_emul
      released_check_json_term_emul PROPERTIES TIMEOUT 300 LABELS "cuda;bench")
  endif()
endif()
