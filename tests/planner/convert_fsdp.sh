#!/bin/sh
# convert_fsdp.sh - proves `wexctl convert` (the real binary, $WEXCTL_BIN)
# writes FSDP2 shards (fsdp:fsdp=N, HSDP dp=M) of a generated tiny
# Qwen2-like checkpoint (hidden 32, 2 KV heads of 8, vocabulary 211) that
# PyTorch's torch.chunk agrees with, rank file by rank file
# (fsdp_ckpt_check.py, with /usr/bin/python3's torch): fsdp=5 holds 7,7,7,
# 7,4 rows of 32 and 4,4,4,4,0 of the k/v projections (an empty tensor on
# rank 4).  The help names the engine.  fsdp -> vllm tp=2 -> fsdp gives the same rank files as hf ->
# fsdp, and back to hf every byte of the checkpoint.
# Needs: WEXCTL_BIN, PLANNER_CONVERT_BIN (the planner_convert helper),
# SRC (the source tree).
set -u
: "${WEXCTL_BIN:?}" "${PLANNER_CONVERT_BIN:?}" "${SRC:?}"
PY=/usr/bin/python3
[ -x $PY ] || { echo "skip: $PY missing"; exit 77; }
$PY -c 'import torch' 2>/dev/null || { echo "skip: $PY has no torch"; exit 77; }
d=$(mktemp -d /tmp/wex-convert-fsdp-XXXXXX) || exit 1
trap 'rm -rf "$d"' EXIT
"$PLANNER_CONVERT_BIN" gen "$d" || exit 1
# The help names the engine and its key.
case "$("$WEXCTL_BIN" convert --help 2>&1)" in
*"fsdp=N"*"engines: hf fsdp "*"fsdp: dim-0 chunks"*) ;;
*) echo "convert --help does not name the fsdp engine and fsdp=N"; exit 1 ;;
esac
cv() { "$WEXCTL_BIN" convert --config "$d/config.json" --from "$1" --to "$2" "$3" "$4" || exit 1; }
cv hf fsdp:fsdp=5 "$d/hf" "$d/f5"
$PY "$SRC/tests/planner/fsdp_ckpt_check.py" "$d/hf" "$d/f5" 5 1 || exit 1
cv hf fsdp:fsdp=3,dp=2 "$d/hf" "$d/h3"
$PY "$SRC/tests/planner/fsdp_ckpt_check.py" "$d/hf" "$d/h3" 3 2 || exit 1
# Through an inference layout and back: the same files.
cv fsdp:fsdp=5 vllm:tp=2 "$d/f5" "$d/vllm"
cv vllm:tp=2 fsdp:fsdp=5 "$d/vllm" "$d/f5b"
cv fsdp:fsdp=5 fsdp:fsdp=3,dp=2 "$d/f5b" "$d/h3b"
for r in 0 1 2 3 4; do
	cmp "$d/f5/rank-$r.safetensors" "$d/f5b/rank-$r.safetensors" || { echo "fsdp -> vllm -> fsdp changed rank $r"; exit 1; }
done
for r in 0 1 2 3 4 5; do
	cmp "$d/h3/rank-$r.safetensors" "$d/h3b/rank-$r.safetensors" || { echo "fsdp=5 -> fsdp=3,dp=2 differs from hf -> it (rank $r)"; exit 1; }
done
cv fsdp:fsdp=3,dp=2 hf "$d/h3b" "$d/back"
"$PLANNER_CONVERT_BIN" compare "$d" "$d/back" || exit 1
echo "wexctl convert writes FSDP2 shards as torch.chunk cuts them, and back"
