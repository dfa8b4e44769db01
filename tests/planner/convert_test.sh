#!/bin/sh
# convert_test.sh - proves `wexctl convert` (the real binary, $WEXCTL_BIN)
# reshards a generated tiny Qwen2-like HF checkpoint to megatron tp=2,pp=2,
# then to vllm tp=2, then back to hf with every byte unchanged; converting
# into the input directory itself gives the same bytes as into a fresh one,
# and an extra tensor of another dtype in the checkpoint changes nothing
# (and is named on stderr as not converted).  A source file with a tensor
# of another shape or dtype, without one, or two files with one tensor
# are refused naming the files (and both shapes); IN the index of an hf
# checkpoint reads as its directory; a rank directory without
# rank-0.safetensors names it; a --config that is a
# directory or does not parse is named; SIGTERM leaves OUTDIR empty, a
# SIGHUP or SIGINT the caller ignores (nohup) is ignored; what
# a killed convert left is removed by the next, and a second convert into
# one OUTDIR at once is refused naming the first; a rename into place
# failing part way names the files in place and the mix left, and the
# first failing names an earlier index removed.
# --to hf also copies the tokenizer and generation config found beside IN
# or --config (IN's first), never over a file OUTDIR already has; one model.safetensors gets
# no index, as save_pretrained writes none (an earlier one is removed),
# and reads back as a directory.  An OUTDIR that is a file, a symbolic
# link to nothing, and an
# unknown engine are bad values (exit 2), refused before anything is
# written.  Skips (77)
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
# The help says what IN may be and what OUTDIR gets.
case "$out" in
*"IN: "*"rank-K.safetensors"*"OUTDIR gets rank-K.safetensors"*"tokenizer"*"generation_config.json"*) ;;
*) echo "convert --help does not say what IN and OUTDIR hold: $out"; exit 1 ;;
esac
# The LAYOUT help names SGLang's DeepEP and replicated-embedding keys.
case "$out" in
*"a2a=0|1,embed_rep=0|1"*"a2a=1: --moe-a2a-backend deepep|mooncake"*"embed_rep=1 (with dp_attention=1)"*) ;;
*) echo "convert --help does not describe a2a= and embed_rep=: $out"; exit 1 ;;
esac
# plan's --rank and --json are not convert's: refused (2), not ignored
# while every rank is written.
for o in "--rank 1" --json; do
	"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to megatron:tp=2 $o "$d/hf" "$d/o-opt" 2>"$d/opt.err"
	rc=$?
	[ $rc = 2 ] && [ ! -e "$d/o-opt" ] || { echo "convert $o: exit $rc, not 2: $(cat "$d/opt.err")"; exit 1; }
done
# ... also given before the command (wexctl --json convert).
"$WEXCTL_BIN" --json convert --config "$d/config.json" --from hf --to megatron:tp=2 "$d/hf" "$d/o-opt" 2>"$d/opt.err"
rc=$?
[ $rc = 2 ] && [ ! -e "$d/o-opt" ] || { echo "wexctl --json convert: exit $rc, not 2: $(cat "$d/opt.err")"; exit 1; }
# ... and is never taken as the value of an option given last without one.
"$WEXCTL_BIN" --json plan --from hf --to megatron:tp=2 --config 2>"$d/opt.err" >/dev/null
rc=$?
[ $rc = 2 ] || { echo "wexctl --json plan ... --config: exit $rc, not 2: $(cat "$d/opt.err")"; exit 1; }
# wexctl --json plan prints JSON, as plan --json does.
"$WEXCTL_BIN" --json plan --config "$d/config.json" --from hf --to megatron:tp=2 >"$d/plan.json" || exit 1
PYJ=/usr/bin/python3; [ -x $PYJ ] || PYJ=python3
$PYJ -c 'import json,sys; json.load(open(sys.argv[1]))["bytes_needed"]' "$d/plan.json" ||
	{ echo "wexctl --json plan did not print JSON: $(head -c 300 "$d/plan.json")"; exit 1; }
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to megatron:tp=2,pp=2 "$d/hf" "$d/meg" || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to vllm:tp=2 "$d/meg" "$d/vllm" || exit 1
# IN the hf checkpoint's model.safetensors.index.json: read as its
# directory is (it was read as a safetensors file: "header length
# 8387229874382703227 exceeds the 100,000,000 byte limit").
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf" "$d/o-dir" >/dev/null || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf/model.safetensors.index.json" "$d/o-idx" 2>"$d/idx.err" >/dev/null ||
	{ echo "IN an index: $(cat "$d/idx.err")"; exit 1; }
for r in 0 1; do
	cmp "$d/o-dir/rank-$r.safetensors" "$d/o-idx/rank-$r.safetensors" || { echo "IN an index read otherwise than its directory (rank $r)"; exit 1; }
done
rm -rf "$d/o-dir" "$d/o-idx"
# A rank directory without its rank-0.safetensors, or an empty one: the
# missing file is named (it said "the source layout has 2 ranks but DIR is
# one checkpoint").
mkdir "$d/v-no0" "$d/v-empty" && cp "$d/vllm/rank-1.safetensors" "$d/v-no0/" || exit 1
for v in v-no0 v-empty; do
	"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/$v" "$d/o-no0" 2>"$d/no0.err"
	rc=$?
	[ $rc = 1 ] && [ ! -e "$d/o-no0" ] && grep -qF "convert: $d/$v/rank-0.safetensors: No such file or directory" "$d/no0.err" ||
		{ echo "$v as a source of 2 ranks: exit $rc: $(cat "$d/no0.err")"; exit 1; }
done
rm -rf "$d/v-no0" "$d/v-empty"
# The tokenizer files beside --config and beside IN (which wins); one
# OUTDIR already has is kept.
echo '{"model": "tok"}' >"$d/tokenizer.json"
echo '{"max_new_tokens": 7}' >"$d/generation_config.json"
echo 'from config dir' >"$d/special_tokens_map.json"
echo 'from IN' >"$d/vllm/special_tokens_map.json"
echo 'from config dir' >"$d/tokenizer_config.json"
mkdir "$d/back" && echo 'already there' >"$d/back/tokenizer_config.json"
# An earlier conversion's index (naming files not there) is not left to
# misdirect readers.
echo '{"metadata": {}, "weight_map": {"x": "model-00001-of-00002.safetensors"}}' >"$d/back/model.safetensors.index.json"
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/back" || exit 1
[ ! -e "$d/back/model.safetensors.index.json" ] ||
	{ echo "--to hf wrote (or kept) an index beside one model.safetensors: $(cat "$d/back/model.safetensors.index.json")"; exit 1; }
"$PLANNER_CONVERT_BIN" compare "$d" "$d/back/model.safetensors" || exit 1
"$PLANNER_CONVERT_BIN" compare "$d" "$d/back" || exit 1
# ... and, with no index, reads back as an hf directory.
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/back" "$d/vllm-back" || exit 1
for r in 0 1; do
	cmp "$d/vllm/rank-$r.safetensors" "$d/vllm-back/rank-$r.safetensors" || { echo "hf directory without index read back otherwise (rank $r)"; exit 1; }
done
# OUTDIR a file, an unknown engine: bad values (2), named, nothing written
# (OUTDIR was named through a temporary file of its own).
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/back/model.safetensors" 2>"$d/bad.err"
rc=$?
[ $rc = 2 ] && head -n 1 "$d/bad.err" | grep -qF "convert: OUTDIR $d/back/model.safetensors: not a directory" ||
	{ echo "OUTDIR a file: exit $rc: $(cat "$d/bad.err")"; exit 1; }
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/none/sub" 2>"$d/bad.err"
rc=$?
[ $rc = 2 ] && head -n 1 "$d/bad.err" | grep -qF "convert: OUTDIR $d/none/sub: its parent $d/none: No such file or directory" ||
	{ echo "OUTDIR in no directory: exit $rc: $(cat "$d/bad.err")"; exit 1; }
# IN or OUTDIR an empty string (a variable not set): a bad value, named
# (it said ": No such file or directory", exit 1).
for w in in out; do
	if [ $w = in ]; then set -- "" "$d/o-empty"; else set -- "$d/vllm" ""; fi
	"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$@" 2>"$d/bad.err"
	rc=$?
	[ $rc = 2 ] && [ ! -e "$d/o-empty" ] && head -n 1 "$d/bad.err" | grep -qE "convert: (IN|OUTDIR) is an empty string" ||
		{ echo "$w an empty string: exit $rc: $(cat "$d/bad.err")"; exit 1; }
done
set --
# A symbolic link to nothing (a volume not mounted) is not a directory
# either: it said "OUTDIR/.wexctl-convert.lock: No such file or directory", exit 1.
ln -s "$d/gone" "$d/o-link"
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/o-link" 2>"$d/bad.err"
rc=$?
[ $rc = 2 ] && [ ! -e "$d/gone" ] && head -n 1 "$d/bad.err" | grep -qF "convert: OUTDIR $d/o-link: a symbolic link to $d/gone, which does not exist" ||
	{ echo "OUTDIR a dangling symbolic link: exit $rc: $(cat "$d/bad.err")"; exit 1; }
# --config naming the model's directory (which holds config.json), or a
# config under another name that does not parse: named, with the cause
# (they said "DIR: Cannot allocate memory" and "config.json: ...").
"$WEXCTL_BIN" convert --config "$d" --from hf --to vllm:tp=2 "$d/hf" "$d/o-cfg" 2>"$d/cfg.err"
rc=$?
[ $rc != 0 ] && [ ! -e "$d/o-cfg" ] && grep -qF "convert: $d: Is a directory" "$d/cfg.err" ||
	{ echo "--config a directory: exit $rc: $(cat "$d/cfg.err")"; exit 1; }
echo '{"model_type": "qwen2",' >"$d/qwen-cfg.json"
"$WEXCTL_BIN" plan --config "$d/qwen-cfg.json" --from hf --to vllm:tp=2 2>"$d/cfg.err" >/dev/null
rc=$?
[ $rc = 1 ] && grep -qF "plan: $d/qwen-cfg.json: " "$d/cfg.err" ||
	{ echo "--config that does not parse, not named: exit $rc: $(cat "$d/cfg.err")"; exit 1; }
for side in "--from nope --to hf" "--from vllm:tp=2 --to nope"; do
	"$WEXCTL_BIN" convert --config "$d/config.json" $side "$d/vllm" "$d/o-eng" 2>"$d/bad.err"
	rc=$?
	[ $rc = 2 ] && [ ! -e "$d/o-eng" ] && head -n 1 "$d/bad.err" | grep -q "convert: --[a-z]*: unknown engine \"nope\"" ||
		{ echo "convert $side: exit $rc: $(cat "$d/bad.err")"; exit 1; }
done
for f in tokenizer.json generation_config.json; do
	cmp "$d/$f" "$d/back/$f" || { echo "--to hf did not copy $f from beside --config"; exit 1; }
done
cmp "$d/vllm/special_tokens_map.json" "$d/back/special_tokens_map.json" || { echo "--to hf: special_tokens_map.json is not the one beside IN"; exit 1; }
[ "$(cat "$d/back/tokenizer_config.json")" = "already there" ] || { echo "--to hf overwrote OUTDIR's tokenizer_config.json"; exit 1; }
rm -f "$d/vllm/special_tokens_map.json"
# Not for other targets: a rank directory holds ranks.
[ ! -e "$d/meg/tokenizer.json" ] || { echo "--to megatron copied the tokenizer"; exit 1; }
# An hf directory (model.safetensors, no index) that also holds a one-rank
# conversion's rank-0.safetensors (converted in place): which file is the
# checkpoint is not guessed (rank-0.safetensors alone was read, silently
# where its names are the same: fsdp=1 of an earlier step), both named;
# IN the file reads it.
cp -r "$d/back" "$d/mix"
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to fsdp:fsdp=1 "$d/mix" "$d/mix" >/dev/null || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/mix" "$d/o-mix" 2>"$d/mix.err"
rc=$?
[ $rc = 1 ] && [ ! -e "$d/o-mix" ] && grep -q "rank-0.safetensors.*model.safetensors" "$d/mix.err" ||
	{ echo "hf directory with a rank-0.safetensors beside model.safetensors: exit $rc: $(cat "$d/mix.err")"; exit 1; }
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/mix/model.safetensors" "$d/o-mix" >/dev/null || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from fsdp:fsdp=1 --to vllm:tp=2 "$d/mix/rank-0.safetensors" "$d/o-mix2" >/dev/null || exit 1
# In place (OUTDIR = the input): the same bytes as into a fresh directory
# (outputs are written beside and renamed over the inputs, which stay mapped).
cp -r "$d/meg" "$d/meg2"
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to megatron:tp=1,pp=2 "$d/meg" "$d/pp" || exit 1
"$WEXCTL_BIN" convert --config "$d/config.json" --from megatron:tp=2,pp=2 --to megatron:tp=1,pp=2 "$d/meg2" "$d/meg2" 2>"$d/meg2.err" || exit 1
# Its rank-2 and rank-3 are the old layout's: said, since the directory no
# longer reads as either layout (as a source it is refused for them).
grep -q "rank-2.safetensors.*not from this conversion" "$d/meg2.err" || { echo "stale rank files in OUTDIR went unsaid: $(cat "$d/meg2.err")"; exit 1; }
for r in 0 1; do
	cmp "$d/pp/rank-$r.safetensors" "$d/meg2/rank-$r.safetensors" || { echo "in-place convert wrote other bytes (rank $r)"; exit 1; }
done
ls "$d/meg2" | grep -q '\.tmp\.' && { echo "in-place convert left temporary files"; exit 1; }
# A checkpoint carrying another tensor of another dtype (an F32 rotary
# buffer, as older HF Llama checkpoints have) converts as without it: the
# model's dtype comes from the tensors the layout names.
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
$PY - "$d/hf" "$d/hf1" <<'PYEOF' || exit 1
import glob, json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
tensors = [("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", [4], bytes(16))]
for p in sorted(glob.glob(src + "/*.safetensors")):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    for k, v in sorted(h.items()):
        if k != "__metadata__":
            o = v["data_offsets"]
            tensors.append((k, v["dtype"], v["shape"], b[8 + n + o[0]:8 + n + o[1]]))
h, off, data = {}, 0, b""
for name, dt, shape, by in tensors:
    h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(by)]}
    off += len(by)
    data += by
s = json.dumps(h).encode()
s += b" " * (-len(s) % 8)
os.makedirs(dst)
open(dst + "/model.safetensors", "wb").write(struct.pack("<Q", len(s)) + s + data)
PYEOF
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf1" "$d/vllm1" 2>"$d/extra.err" || { echo "an extra F32 tensor broke the conversion"; exit 1; }
# ... but is not dropped unsaid: a tensor the family does not describe
# (Llama's mlp_bias, an lm_head beside tie_word_embeddings) would be too.
grep -q "1 tensor of the source.*not converted.*rotary_emb.inv_freq" "$d/extra.err" || { echo "a source tensor left out of the conversion went unsaid: $(cat "$d/extra.err")"; exit 1; }
for r in 0 1; do
	cmp "$d/vllm/rank-$r.safetensors" "$d/vllm1/rank-$r.safetensors" || { echo "an extra tensor changed the output (rank $r)"; exit 1; }
done
# A tensor in two files of one source is ambiguous: refused, named.
mkdir "$d/dup" && cp "$d/hf1/model.safetensors" "$d/dup/a.safetensors" &&
	cp "$d/hf1/model.safetensors" "$d/dup/b.safetensors" || exit 1
if "$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/dup" "$d/o-dup" 2>"$d/dup.err"; then
	echo "a checkpoint with a tensor in two files was converted"; exit 1
fi
grep -q "is in two of its files.*$d/dup/a.safetensors.*$d/dup/b.safetensors" "$d/dup.err" ||
	{ echo "a tensor in two files: the files are not named: $(cat "$d/dup.err")"; exit 1; }
# A source file whose tensor has another shape, dtype, or is missing: the
# error names that file and both shapes (it said "is BF16 with 2 dims, the
# layout expects BF16 32 x ... (2 dims)", the same for a transposed one).
for how in shape dtype missing; do
	rm -rf "$d/vbad" && cp -r "$d/vllm" "$d/vbad" || exit 1
	$PY - "$d/vbad/rank-1.safetensors" $how <<'PYEOF' || exit 1
import json, struct, sys
p, how = sys.argv[1], sys.argv[2]
b = open(p, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
k = "model.layers.0.mlp.down_proj.weight"
if how == "shape":
    h[k]["shape"] = h[k]["shape"][::-1]
elif how == "dtype":
    h[k]["dtype"] = "F16"
else:
    del h[k], data[k]
off = 0
for name in data:
    h[name]["data_offsets"] = [off, off + len(data[name])]
    off += len(data[name])
s = json.dumps(h).encode()
s += b" " * (-len(s) % 8)
open(p, "wb").write(struct.pack("<Q", len(s)) + s + b"".join(data.values()))
PYEOF
	"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vbad" "$d/o-bad" 2>"$d/vbad.err"
	rc=$?
	[ $rc = 1 ] && [ ! -e "$d/o-bad" ] && grep -qF "$d/vbad/rank-1.safetensors" "$d/vbad.err" ||
		{ echo "source rank 1 with a bad $how: exit $rc, the file not named: $(cat "$d/vbad.err")"; exit 1; }
	case $how in
	shape) grep -qF "is BF16 [24, 32], the layout expects BF16 [32, 24]" "$d/vbad.err" ;;
	dtype) grep -qF "is F16 [32, 24], the layout expects BF16 [32, 24]" "$d/vbad.err" ;;
	missing) grep -qF "lacks model.layers.0.mlp.down_proj.weight" "$d/vbad.err" ;;
	esac || { echo "source rank 1 with a bad $how: unclear error: $(cat "$d/vbad.err")"; exit 1; }
done
# A convert killed (SIGKILL, the OOM killer) leaves its staged files,
# hidden and a checkpoint's size, more with every retry: the next convert
# into OUTDIR removes them (the .tmp.PID's writer gone or not wexctl
# convert), saying so with their bytes, and nothing else.
mkdir "$d/o-dead"
head -c 1000 /dev/zero >"$d/o-dead/rank-0.safetensors.partial"
head -c 2000 /dev/zero >"$d/o-dead/rank-1.safetensors.partial.tmp.999999999"
head -c 3000 /dev/zero >"$d/o-dead/rank-1.safetensors.partial.tmp.$$"
# (--to hf stages its index and the files beside the weights as FILE.tmp.PID.)
head -c 4000 /dev/zero >"$d/o-dead/model.safetensors.index.json.tmp.999999999"
head -c 5000 /dev/zero >"$d/o-dead/config.json.tmp.999999999"
echo 999999999 >"$d/o-dead/.wexctl-convert.lock" # the lock of the one killed
for f in notes.partial.txt rank-0.safetensors.partial.tmp.x1 config.json.tmp.x12 notes.json.tmp.999999999 .partial download.partial model.bin.partial.tmp.999999999; do
	echo keep >"$d/o-dead/$f"
done
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf" "$d/o-dead" 2>"$d/dead.err" ||
	{ echo "convert into an OUTDIR a killed convert left: $(cat "$d/dead.err")"; exit 1; }
left=$(cd "$d/o-dead" && LC_ALL=C ls -A | tr '\n' ' ')
[ "$left" = ".partial config.json.tmp.x12 download.partial model.bin.partial.tmp.999999999 notes.json.tmp.999999999 notes.partial.txt rank-0.safetensors rank-0.safetensors.partial.tmp.x1 rank-1.safetensors " ] ||
	{ echo "convert into an OUTDIR a killed convert left: left $left"; exit 1; }
for b in 1000 2000 3000 4000 5000; do
	grep -q "removed $d/o-dead/.* $b bytes)" "$d/dead.err" ||
		{ echo "the $b bytes a killed convert left are removed unsaid: $(cat "$d/dead.err")"; exit 1; }
done
grep -qF "removed 5 files" "$d/dead.err" || { echo "no total of what was removed: $(cat "$d/dead.err")"; exit 1; }
# Two converts into one OUTDIR at once: the second (here while the test
# holds the first's lock) is refused naming the first, and removes
# nothing of what the first stages.
mkdir "$d/o-busy"
echo staged >"$d/o-busy/rank-0.safetensors.partial"
$PY - "$d/o-busy" "$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf" "$d/o-busy" 2>"$d/busy.err" >"$d/busy.pid" <<'PYEOF'
import fcntl, os, subprocess, sys
f = open(sys.argv[1] + "/.wexctl-convert.lock", "w")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
f.write("%d\n" % os.getpid())
f.flush()
print(os.getpid(), flush=True)
sys.exit(subprocess.run(sys.argv[2:]).returncode)
PYEOF
rc=$?
[ $rc = 1 ] && [ -e "$d/o-busy/rank-0.safetensors.partial" ] && [ ! -e "$d/o-busy/rank-0.safetensors" ] &&
	grep -qF "$d/o-busy is being written by another wexctl convert (pid $(cat "$d/busy.pid")," "$d/busy.err" ||
	{ echo "a second convert into one OUTDIR: exit $rc, not refused naming the first: $(cat "$d/busy.err"); left: $(ls -A "$d/o-busy")"; exit 1; }
# SIGTERM (Ctrl-C, a scheduler's preemption) half way leaves nothing in
# OUTDIR: it left the ranks written so far as rank-K.safetensors.partial
# and the one being written as .partial.tmp.PID, a checkpoint's size of
# hidden files, more with every retry.  Made deterministic: the signal is
# pending (blocked) as wexctl starts, so it is seen at the first look.
$PY - "$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf" "$d/o-term" 2>"$d/term.err" <<'PYEOF'
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.kill(os.getpid(), signal.SIGTERM)
os.execv(sys.argv[1], sys.argv[1:])
PYEOF
rc=$?
[ $rc != 0 ] && [ -z "$(ls -A "$d/o-term")" ] && grep -q "interrupted" "$d/term.err" ||
	{ echo "SIGTERM during convert: exit $rc, left: $(ls -A "$d/o-term"): $(cat "$d/term.err")"; exit 1; }
# ... but a signal the caller ignores stays ignored: under nohup (SIGHUP)
# or as a job a script runs in the background (SIGINT) the conversion
# goes on (blocked, the ignored signal was held pending, and a hangup
# stopped the conversion nohup was to shield, removing its files).
# Deterministic as above: the signal pending as wexctl starts.
for sig in SIGHUP SIGINT; do
	rm -rf "$d/o-ign"
	$PY - "$sig" "$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to vllm:tp=2 "$d/hf" "$d/o-ign" 2>"$d/ign.err" >/dev/null <<'PYEOF'
import os, signal, sys
s = getattr(signal, sys.argv[1])
signal.signal(s, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, {s})
os.kill(os.getpid(), s)
os.execv(sys.argv[2], sys.argv[2:])
PYEOF
	rc=$?
	[ $rc = 0 ] && cmp "$d/vllm/rank-1.safetensors" "$d/o-ign/rank-1.safetensors" ||
		{ echo "$sig ignored by the caller stopped convert: exit $rc: $(cat "$d/ign.err")"; exit 1; }
done
# A rename into place that fails part way (rank-2's name a directory)
# says which files are this conversion's: it said only the rename's
# error, with OUTDIR's ranks 0 and 1 new and 3 not written.
mkdir -p "$d/o-mix/rank-2.safetensors/x"
"$WEXCTL_BIN" convert --config "$d/config.json" --from hf --to megatron:tp=2,pp=2 "$d/hf" "$d/o-mix" 2>"$d/mix.err" >/dev/null
rc=$?
[ $rc = 1 ] && grep -qF "rank-2.safetensors: Is a directory (the 2 files before it in place, it and the 1 after it not: $d/o-mix mixes this conversion's files with what it held before)" "$d/mix.err" ||
	{ echo "a rename failing part way: exit $rc, not named as mixing: $(cat "$d/mix.err")"; exit 1; }
# The first rename failing (model.safetensors a directory) after an
# earlier index naming it was removed: OUTDIR is not "unchanged" (review
# h118: the message said so, its index gone).
mkdir -p "$d/o-first/model.safetensors/x"
echo '{"metadata": {}, "weight_map": {"x": "model.safetensors"}}' >"$d/o-first/model.safetensors.index.json"
"$WEXCTL_BIN" convert --config "$d/config.json" --from vllm:tp=2 --to hf "$d/vllm" "$d/o-first" 2>"$d/first.err" >/dev/null
rc=$?
[ $rc = 1 ] && [ ! -e "$d/o-first/model.safetensors.index.json" ] &&
	grep -qF "model.safetensors: Is a directory (nothing renamed: $d/o-first unchanged but for its earlier model.safetensors.index.json, removed as naming files of this conversion)" "$d/first.err" ||
	{ echo "the first rename failing after the index went: exit $rc, said: $(cat "$d/first.err")"; exit 1; }
"$WEXCTL_BIN" plan --config "$d/config.json" --from megatron:tp=2,pp=2,dp=2 --to vllm:tp=2 --json || exit 1
echo "wexctl convert round trip is byte-identical"
