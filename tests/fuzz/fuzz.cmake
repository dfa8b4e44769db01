# Coverage-guided fuzzing of wex's input parsers (tests/fuzz/*.c, one
# LLVMFuzzerTestOneInput each).  Every build compiles each harness with
# replay.c into fuzz_replay_NAME, a CTest test (label foundation) that runs
# it on the committed seeds and regressions in tests/fuzz/regress/NAME.
# With -DWEX_FUZZ=ON (clang) fuzz_NAME is also built, linked with libFuzzer;
# the whole tree is then compiled with coverage, ASan and UBSan:
#   fuzz_NAME -max_total_time=600 -timeout=5 -rss_limit_mb=2048 \
#     [-dict=tests/fuzz/NAME.dict] CORPUS tests/fuzz/regress/NAME
# An input it reports (crash-*, leak-*, timeout-*) goes, once fixed, into
# tests/fuzz/regress/NAME under a name that says what it was.
set(WEX_FUZZ_TARGETS safetensors layout_spec model_config proto_tables config journal adapters)
# Sources a harness needs beyond wex_core (wexd's own).
set(WEX_FUZZ_SOURCES_journal src/journal.c)
foreach(t ${WEX_FUZZ_TARGETS})
  wex_add_test(fuzz_replay_${t} SOURCES tests/fuzz/${t}.c ${WEX_FUZZ_SOURCES_${t}} tests/fuzz/replay.c
    ARGS ${CMAKE_SOURCE_DIR}/tests/fuzz/regress/${t} LABELS foundation TIMEOUT 120)
  target_compile_definitions(fuzz_replay_${t} PRIVATE
    WEX_FUZZ_ADAPTERS="${CMAKE_SOURCE_DIR}/adapters")
  if(WEX_FUZZ)
    add_executable(fuzz_${t} tests/fuzz/${t}.c ${WEX_FUZZ_SOURCES_${t}})
    target_compile_definitions(fuzz_${t} PRIVATE WEX_FUZZ_ADAPTERS="${CMAKE_SOURCE_DIR}/adapters")
    target_link_libraries(fuzz_${t} PRIVATE wex_core)
    target_link_options(fuzz_${t} PRIVATE -fsanitize=fuzzer)
  endif()
endforeach()
