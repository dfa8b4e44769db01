#!/bin/sh
# convert_test.sh - proves `wexctl convert` (the real binary, $WEXCTL_BIN)
# reshards a generated tiny Qwen2-like HF checkpoint to megatron tp=2,pp=2,
# then to vllm tp=2, then back to hf with every byte unchanged; converting
# into the input directory itself gives the same bytes as into a fresh one.  Skips (77)
# while wexctl does not dispatch `convert` yet.
# Needs: WEXCTL_BIN, PLANNER_CONVERT_BIN (the planner_convert helper).
set -u
: "${WEXCTL_BIN:?}" "${PLANNER_CONVERT_BIN:?}"
d=$(mktemp -d /tmp/wex-convert-sh-XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
"$PLANNER_CONVERT_BIN" gen "$d" || exit 1
out=$("$WEXCTL_BIN" convert --help 2>&1)
case "$out" in
*"usage: wexctl convert"*) ;;
*) echo "skip: wexctl does not dispatch 'convert' yet"; exit 77 ;;
esac
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to megatron:tp=2,pp=2 "$d/hf" "$d/meg" || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to vllm:tp=2 "$d/meg" "$d/vllm" || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/back" || exit 1
"$PLANNER_CONVERT_BIN" compare "$d" "$d/back/rank-0.safetensors" || exit 1
# In place (OUTDIR = the input): the same bytes as into a fresh directory
# (outputs are written beside and renamed over the inputs, which stay mapped).
cp -r "$d/meg" "$d/meg2"
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to megatron:tp=1,pp=2 "$d/meg" "$d/pp" || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to megatron:tp=1,pp=2 "$d/meg2" "$d/meg2" || exit 1
for r in 0 1; do
	cmp "$d/pp/rank-$r.safetensors" "$d/meg2/rank-$r.safetensors" || { echo "in-place convert wrote other bytes (rank $r)"; exit 1; }
done
ls "$d/meg2" | grep -q '\.tmp\.' && { echo "in-place convert left temporary files"; exit 1; }
"$WEXCTL_BIN" plan --config "$d/config.json" --from megatron:tp=2,pp=2,dp=2 --to vllm:tp=2 --json || exit 1
echo "wexctl convert round trip is byte-identical"
