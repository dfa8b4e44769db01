# The model adaptation layer and the resharding planner (DESIGN section 5):
# layout interpreter (adapters/ data), planner, host executor, safetensors,
# and the `wexctl plan` / `wexctl convert` subcommands.
list(APPEND WEX_CORE_SOURCES src/plan.c src/plan_exec.c src/layout.c src/safetensors.c)
list(APPEND WEX_CTL_SOURCES src/wexctl_plan.c)
# Layout data is read from the source tree when neither the caller nor
# $WEX_ADAPTERS names another place (installed copies: share/wex/adapters).
set_source_files_properties(src/layout.c PROPERTIES
  COMPILE_DEFINITIONS "WEX_ADAPTERS_SRC_DIR=\"${CMAKE_SOURCE_DIR}/adapters\"")

# Tests (tests/planner/): one behaviour per program, label `planner`.
foreach(t property kat_qkv_interleave kat_kv_replication kat_vocab_padding kat_o_bias roundtrip
          bad_layout plan_basic safetensors_bad explicit_pieces kat_moe_experts kat_mla expr_eval
          bad_engine fuzz_inputs kat_sparse_step
          kat_fp8_blocks kat_qwen2_moe kat_fp8_qwen kat_pp_split kat_dp_attention kat_fsdp
          kat_vpp canonical_scalar ops_block random_strided name_flood plan_bound plan_cells plan_ticks
          plan_cancel)
  wex_add_test(planner_${t} SOURCES tests/planner/${t}.c LABELS planner TIMEOUT 60)
endforeach()
# 300 random layouts planned and checked: the sanitizer build takes 7 to
# 10 s on an idle 2-core box, 35 s with it loaded.
set_tests_properties(planner_property PROPERTIES TIMEOUT 120)
# About 1.1G planner steps (plan_bound) and 4.2M cells (plan_cells): 29 s
# and 3 s under the sanitizers with the CPUs to themselves, 60 s and 25 s
# among tests/run.sh's others (CTest runs 4 per core).
set_tests_properties(planner_plan_bound planner_plan_cells planner_plan_ticks PROPERTIES TIMEOUT 240)
# convert.c calls wexctl_cmd_convert/plan directly; it also serves as the
# checkpoint generator and checker of convert_test.sh, which drives the
# real wexctl binary.
wex_add_test(planner_convert SOURCES tests/planner/convert.c src/wexctl_plan.c
  LABELS planner TIMEOUT 60)
add_test(NAME planner_convert_cli COMMAND sh ${CMAKE_SOURCE_DIR}/tests/planner/convert_test.sh)
set_tests_properties(planner_convert_cli PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60 LABELS planner
  ENVIRONMENT "WEXCTL_BIN=$<TARGET_FILE:wexctl>;PLANNER_CONVERT_BIN=$<TARGET_FILE:planner_convert>")
# A new OUTDIR's entry synced in its parent (strace; skips without).
add_test(NAME planner_convert_dirsync COMMAND sh ${CMAKE_SOURCE_DIR}/tests/planner/convert_dirsync.sh)
set_tests_properties(planner_convert_dirsync PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60 LABELS planner
  ENVIRONMENT "WEXCTL_BIN=$<TARGET_FILE:wexctl>;PLANNER_CONVERT_BIN=$<TARGET_FILE:planner_convert>")
# FSDP2 shards written by the real wexctl, checked against torch.chunk
# (/usr/bin/python3 with torch; skips without).
add_test(NAME planner_convert_fsdp COMMAND sh ${CMAKE_SOURCE_DIR}/tests/planner/convert_fsdp.sh)
set_tests_properties(planner_convert_fsdp PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120 LABELS planner
  ENVIRONMENT "WEXCTL_BIN=$<TARGET_FILE:wexctl>;PLANNER_CONVERT_BIN=$<TARGET_FILE:planner_convert>;SRC=${CMAKE_SOURCE_DIR}")

# The adaptation layer in libwex's public API (wex_layout_*).
wex_add_test(planner_layout_api SOURCES tests/planner/layout_api.c LIBS wex LABELS planner)

# Benchmark: DeepSeek-V3 from 1024 Megatron GPUs to 32 vLLM instances.
wex_add_test(bench_plan_scale SOURCES tests/bench/plan_scale.c LABELS bench TIMEOUT 600)

# wexctl plan and convert on the real Qwen2-0.5B config and a generated
# full-size checkpoint (about 1 GB written and converted three times).
add_test(NAME planner_qwen2_convert
  COMMAND sh ${CMAKE_SOURCE_DIR}/tests/planner/qwen2_convert.sh $<TARGET_FILE:wexctl> ${CMAKE_SOURCE_DIR})
set_tests_properties(planner_qwen2_convert PROPERTIES LABELS "planner;slow" TIMEOUT 300 SKIP_RETURN_CODE 77)
