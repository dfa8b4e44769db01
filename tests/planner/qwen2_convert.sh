#!/bin/sh
# qwen2_convert.sh WEXCTL SRC - proves `wexctl plan` and `wexctl convert` on
# the real Qwen2-0.5B config.json (tests/data) and a generated full-size
# checkpoint (494M parameters, bf16, Hugging Face's sharded form with its
# index): hf -> megatron tp=2,pp=2 -> vllm tp=2 -> hf gives back every
# tensor byte for byte; plan reports zero redundancy.
WEXCTL=$1 SRC=$2
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v "$PY" >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
d=$(mktemp -d /tmp/wex-qwen2-XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
cfg="$SRC/tests/data/qwen2-0.5b-config.json"
set -e
$PY "$SRC/tests/planner/qwen2_ckpt.py" gen "$cfg" "$d/hf"
"$WEXCTL" plan --config "$cfg" --from megatron:tp=2,pp=2,dp=2 --to vllm:tp=2 | tee "$d/plan.txt"
grep -q "zero redundancy" "$d/plan.txt"
"$WEXCTL" convert --config "$cfg" --from hf --to megatron:tp=2,pp=2 "$d/hf" "$d/meg"
ls "$d/meg"
"$WEXCTL" convert --config "$cfg" --from megatron:tp=2,pp=2 --to vllm:tp=2 "$d/meg" "$d/vllm"
rm -rf "$d/meg"
"$WEXCTL" convert --config "$cfg" --from vllm:tp=2 --to hf "$d/vllm" "$d/back"
$PY "$SRC/tests/planner/qwen2_ckpt.py" compare "$d/hf" "$d/back/rank-0.safetensors"
echo "PASS: Qwen2-0.5B hf -> megatron tp2 pp2 -> vllm tp2 -> hf is byte-identical"
