#!/bin/sh
# qwen2_convert.sh WEXCTL SRC - proves `wexctl plan` and `wexctl convert` on
# the real Qwen2-0.5B config.json (tests/data) and a generated full-size
# checkpoint (494M parameters, bf16, Hugging Face's sharded form with its
# index): hf -> megatron tp=2,pp=2 -> vllm tp=2 -> hf gives back every
# tensor byte for byte, in one file and in 200 MB shards; plan reports zero redundancy, and with 128 trainer
# replicas a lower bound the busiest source stays within 1.1x of.
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
# More trainer replicas than the planner tracks per holder set (128 > 64):
# its bound stays a lower bound (it was the demand over only 64 ranks,
# reported at 0.52x) and the busiest source within 1.1x of it.
"$WEXCTL" plan --config "$cfg" --from megatron:tp=1,dp=128 --to vllm:tp=2 --json >"$d/plan.json"
$PY - "$d/plan.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
x = r["busiest_link_vs_bound"]
print("dp=128: busiest source %.4fx its lower bound" % x)
assert 1.0 <= x <= 1.1, "busiest_link_vs_bound %s at dp=128" % x
PYEOF
# transformers 4.56 and later name the dtype "dtype" (not "torch_dtype"):
# float32 weights are twice the bytes of the bf16 default.
$PY - "$cfg" "$d/f32.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c.pop("torch_dtype", None)
c["dtype"] = "float32"
json.dump(c, open(sys.argv[2], "w"))
PYEOF
b16=$("$WEXCTL" plan --config "$cfg" --from hf --to vllm:tp=2 --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["bytes_needed"])')
b32=$("$WEXCTL" plan --config "$d/f32.json" --from hf --to vllm:tp=2 --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["bytes_needed"])')
[ "$b32" = $((b16 * 2)) ] || { echo "FAIL: \"dtype\": \"float32\" planned $b32 bytes, not 2 x $b16"; exit 1; }
"$WEXCTL" convert --config "$cfg" --from hf --to megatron:tp=2,pp=2 "$d/hf" "$d/meg"
ls "$d/meg"
"$WEXCTL" convert --config "$cfg" --from megatron:tp=2,pp=2 --to vllm:tp=2 "$d/meg" "$d/vllm"
rm -rf "$d/meg"
# With progress shown (the copies then run in steps of 256 MiB: four for
# this rank), into a log: the rank's line once its file is on disk.
"$WEXCTL" convert --config "$cfg" --from vllm:tp=2 --to hf --progress always "$d/vllm" "$d/back" 2>"$d/progress.txt"
cat "$d/progress.txt"
grep -Eq '^wexctl convert: rank 0 of 1: 942\.3 MiB in 1 file on disk, ' "$d/progress.txt" ||
	{ echo "FAIL: --progress always: no line for rank 0 of 1 on disk"; exit 1; }
[ ! -e "$d/back/model.safetensors.index.json" ] || { echo "FAIL: an index beside one model.safetensors"; exit 1; }
$PY "$SRC/tests/planner/qwen2_ckpt.py" compare "$d/hf" "$d/back/model.safetensors"
$PY "$SRC/tests/planner/qwen2_ckpt.py" compare "$d/hf" "$d/back"
# In shards of at most 200 MB of tensors, as save_pretrained writes them
# (the 272 MB embedding alone in its file).
"$WEXCTL" convert --config "$cfg" --from vllm:tp=2 --to hf --max-shard-size 200MB --progress always "$d/vllm" "$d/shards" 2>"$d/progress.txt"
grep -Eq '^wexctl convert: rank 0 of 1: 942\.3 MiB in 5 files on disk, ' "$d/progress.txt" ||
	{ cat "$d/progress.txt"; echo "FAIL: --progress always: no line for rank 0 of 1's 5 files"; exit 1; }
ls "$d/shards"
# 988 MB: the embedding, then 716 MB in four files of at most 200 MB.
n=$(ls "$d/shards" | grep -c '^model-0000[1-5]-of-00005\.safetensors$' || true)
[ "$n" = 5 ] || { echo "FAIL: 200 MB shards: $n files named model-0000K-of-00005.safetensors, not 5"; exit 1; }
$PY "$SRC/tests/planner/qwen2_ckpt.py" compare "$d/hf" "$d/shards" 200000000
echo "PASS: Qwen2-0.5B hf -> megatron tp2 pp2 -> vllm tp2 -> hf (one file, and 200 MB shards) is byte-identical"
