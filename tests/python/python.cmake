# Python glue (adapters/python/wex, ctypes over libwex): tests run with the
# Debian interpreter (/usr/bin/python3 first, which serves Debian's
# python3-* packages), against the libwex and wexd of this build.
find_program(WEX_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(WEX_PYTHON3 python3)
if(NOT WEX_PYTHON3)
  message(STATUS "wex: no python3: the Python glue's tests are not built")
  return()
endif()

set(WEX_PY_ENV
  "WEX_LIB=$<TARGET_FILE:wex>"
  "WEXD_BIN=$<TARGET_FILE:wexd>"
  "PYTHONPATH=${CMAKE_SOURCE_DIR}/adapters/python:${CMAKE_SOURCE_DIR}/tests/python"
  "PYTHONDONTWRITEBYTECODE=1")
if(WEX_SANITIZE)
  # libwex is instrumented: the interpreter needs the ASan runtime first.
  # Python's own allocations are not ours to leak-check.
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
    OUTPUT_VARIABLE WEX_ASAN_RT OUTPUT_STRIP_TRAILING_WHITESPACE)
  list(APPEND WEX_PY_ENV "LD_PRELOAD=${WEX_ASAN_RT}" "ASAN_OPTIONS=detect_leaks=0")
endif()

# Label `once`: the tests of the glue's own logic (hooks, layouts,
# checkpoints, the example) run in tests/run.sh's first build only.  Under
# the sanitizers they ran libwex's C through the same ctypes calls as
# py_binding, py_binding_vmm_emul and py_handles, which stay there, and
# took 160 of the sanitizer build's 1000 CPU-seconds (a quarter of its
# 2-core CI time's minutes) in PyTorch's imports and Python itself.
function(wex_py_test name script)
  cmake_parse_arguments(P "" "TIMEOUT" "LABELS;ENV" ${ARGN})
  if(NOT P_TIMEOUT)
    set(P_TIMEOUT 120)
  endif()
  add_test(NAME ${name} COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/${script})
  set_tests_properties(${name} PROPERTIES LABELS "${P_LABELS}" TIMEOUT ${P_TIMEOUT}
    SKIP_RETURN_CODE 77 ENVIRONMENT "${WEX_PY_ENV};${P_ENV}")
endfunction()

wex_py_test(py_binding tests/python/binding_test.py LABELS python)
# wex.Client and wex.Layout refuse copies (each owns a libwex handle), and
# a Layout's lock held across a fork does not hang the child.
wex_py_test(py_handles tests/python/handle_test.py LABELS python)
# CPU PyTorch (Debian's python3-torch, which tests/run.sh installs).
wex_py_test(py_torch_glue tests/python/torch_glue_test.py LABELS "python;once")
# FSDP2 shards (boxes= and DTensor-like parameters) gathered by a consumer.
wex_py_test(py_fsdp_glue tests/python/fsdp_glue_test.py LABELS "python;once")
# Trainer and engine parameters in their own layouts (Megatron tp=2 ->
# vLLM tp=2) through wex.Layout, checked against the real wexctl convert.
wex_py_test(py_layout_glue tests/python/layout_glue_test.py LABELS "python;once"
  ENV "WEXCTL_BIN=$<TARGET_FILE:wexctl>")
# The hooks inside vLLM's and SGLang's workers (wex.vllm, wex.sglang,
# wex.engine) on stand-ins for the engines' workers, through a real wexd.
wex_py_test(py_engine_hooks tests/python/engine_hooks_test.py LABELS "python;once"
  ENV "WEXCTL_BIN=$<TARGET_FILE:wexctl>")
# wex.checkpoint: an engine's tensors compared in samples with the
# safetensors checkpoint it loaded, where its layout places each piece.
wex_py_test(py_checkpoint_check tests/python/checkpoint_check_test.py LABELS "python;once"
  ENV "WEXCTL_BIN=$<TARGET_FILE:wexctl>")
# The Python example: a trainer and an engine process through the hooks,
# the engine's outputs equal to the trainer's after each sync.
wex_py_test(py_example_rl_loop examples/rl_loop.py LABELS "python;once")
# The same failing: wexd or a process killed mid-run, a wexd that does not
# start, a bad --steps; a hang (the survivor waiting for its peer) fails it.
wex_py_test(py_example_rl_loop_errors tests/python/rl_loop_test.py LABELS "python;once" TIMEOUT 300)
if(TARGET wex_emul_cuda)
  # The same through wex_cuda_alloc and CUDA VMM segments, on the emulated
  # driver (tests/gpu/emul_cuda.c).
  wex_py_test(py_binding_vmm_emul tests/python/binding_test.py LABELS "python;cuda"
    ENV "WEX_PY_KIND=vmm" "WEX_CUDA_LIB=$<TARGET_FILE:wex_emul_cuda>" "WEX_EMUL_DEFER=1")
endif()

# PyTorch checks (need PyTorch with CUDA and a GPU; exit 77 with the reason
# otherwise).  They run with the python3 first on PATH, where a CUDA build
# of PyTorch usually lives (a venv), or $WEX_TORCH_PYTHON.
if(DEFINED ENV{WEX_TORCH_PYTHON})
  set(WEX_TORCH_PYTHON $ENV{WEX_TORCH_PYTHON})
else()
  find_program(WEX_TORCH_PYTHON python3)
endif()
foreach(mode mempool expandable fsdp)
  add_test(NAME torch_${mode} COMMAND ${WEX_TORCH_PYTHON}
    ${CMAKE_SOURCE_DIR}/tests/gpu/torch_check.py ${mode})
  set_tests_properties(torch_${mode} PROPERTIES LABELS "gpu;python" TIMEOUT 130 RESOURCE_LOCK gpu
    SKIP_RETURN_CODE 77 ENVIRONMENT "${WEX_PY_ENV}")
endforeach()
# The ctypes mirror in adapters/python/wex against wex.h: struct sizes,
# offsets and field order, constants and enums (printed by a C program
# built against the header), and every wex_* function the package calls
# declared with the header's argument and return types.
add_executable(wex_abi_dump tests/python/abi_dump.c)
target_include_directories(wex_abi_dump PRIVATE ${CMAKE_SOURCE_DIR}/src/include)
target_link_libraries(wex_abi_dump PRIVATE wex)
add_test(NAME py_abi COMMAND ${WEX_PYTHON3} ${CMAKE_SOURCE_DIR}/tests/python/abi_check_test.py
  $<TARGET_FILE:wex_abi_dump> ${CMAKE_SOURCE_DIR}/src/include/wex.h
  ${CMAKE_SOURCE_DIR}/adapters/python/wex)
set_tests_properties(py_abi PROPERTIES LABELS python TIMEOUT 60 ENVIRONMENT "${WEX_PY_ENV}")
