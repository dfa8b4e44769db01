#!/usr/bin/python3
"""qwen2_ckpt.py - generates and compares Hugging Face safetensors checkpoints
for the `wexctl convert` test, with the standard library only.

  qwen2_ckpt.py gen CONFIG OUTDIR      sharded HF checkpoint (2 files + index)
  qwen2_ckpt.py compare REFDIR PATH [MAX]
                                       every tensor of REFDIR byte-equal in PATH
                                       (a file, or an HF directory with its
                                       index; MAX: bytes of tensors per file)
"""
import json, os, random, struct, sys


def tensors(cfg):
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    out = [("model.embed_tokens.weight", [cfg["vocab_size"], h])]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", [heads * hd, h]), (p + "self_attn.q_proj.bias", [heads * hd]),
                (p + "self_attn.k_proj.weight", [kv * hd, h]), (p + "self_attn.k_proj.bias", [kv * hd]),
                (p + "self_attn.v_proj.weight", [kv * hd, h]), (p + "self_attn.v_proj.bias", [kv * hd]),
                (p + "self_attn.o_proj.weight", [h, heads * hd]),
                (p + "mlp.gate_proj.weight", [i, h]), (p + "mlp.up_proj.weight", [i, h]),
                (p + "mlp.down_proj.weight", [h, i]),
                (p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
    out.append(("model.norm.weight", [h]))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [cfg["vocab_size"], h]))
    return out


def nbytes(shape):
    n = 2
    for d in shape:
        n *= d
    return n


def write_file(path, items, rng):
    hdr, off = {}, 0
    for name, shape in items:
        hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + nbytes(shape)]}
        off += nbytes(shape)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in items:
            left = nbytes(shape)
            while left:
                k = min(left, 1 << 24)
                f.write(os.urandom(k))
                left -= k
    return off


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def gen(cfg_path, out):
    cfg = json.load(open(cfg_path))
    ts = tensors(cfg)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(12345)
    half = len(ts) // 2
    total, wmap = 0, {}
    for k, part in enumerate((ts[:half], ts[half:])):
        fn = f"model-{k + 1:05d}-of-00002.safetensors"
        total += write_file(os.path.join(out, fn), part, rng)
        wmap.update({name: fn for name, _ in part})
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(out, "model.safetensors.index.json"), "w"))
    print(f"generated {len(ts)} tensors, {total} bytes in {out}")


def located(path, max_shard=None):
    """name -> (file, header entry, data offset) of a .safetensors file, or
    of an HF directory read through its index (without one, its
    model.safetensors alone), checked: the index names
    every tensor its files hold and no other, total_size is their bytes,
    and with max_shard each file holds at most that many bytes of tensors
    (or one tensor)."""
    if not os.path.isdir(path):
        hdr, off = read_header(path)
        return {k: (path, e, off) for k, e in hdr.items() if k != "__metadata__"}
    if not os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        # One file, as save_pretrained writes it: no index.
        if sorted(f for f in os.listdir(path) if f.endswith(".safetensors")) != ["model.safetensors"]:
            sys.exit(f"FAIL: {path} has no index and not model.safetensors alone")
        return located(os.path.join(path, "model.safetensors"))
    idx = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    wmap, out, total = idx["weight_map"], {}, 0
    for fn in sorted(set(wmap.values())):
        hdr, off = read_header(os.path.join(path, fn))
        held = {k: e for k, e in hdr.items() if k != "__metadata__"}
        size = sum(e["data_offsets"][1] - e["data_offsets"][0] for e in held.values())
        if max_shard is not None and size > max_shard and len(held) > 1:
            sys.exit(f"FAIL: {fn} holds {size} bytes in {len(held)} tensors, over {max_shard}")
        for k, e in held.items():
            if wmap.get(k) != fn:
                sys.exit(f"FAIL: {fn} holds {k}, which the index puts in {wmap.get(k)}")
            out[k] = (os.path.join(path, fn), e, off)
        total += size
    if set(out) != set(wmap):
        sys.exit(f"FAIL: the index names {len(wmap)} tensors, its files hold {len(out)}")
    if idx["metadata"]["total_size"] != total:
        sys.exit(f"FAIL: total_size {idx['metadata']['total_size']} != {total}")
    print(f"{path}: {len(set(wmap.values()))} files, {total} bytes")
    return out


def compare(ref, path, max_shard=None):
    want, got = located(ref), located(path, max_shard)
    if set(want) != set(got):
        sys.exit(f"FAIL: {len(set(want) ^ set(got))} tensors in one checkpoint only, e.g. "
                 f"{sorted(set(want) ^ set(got))[0]}")
    for name in sorted(want):
        (ff, e, off), (gf, o, goff) = want[name], got[name]
        if o["shape"] != e["shape"] or o["dtype"] != e["dtype"]:
            sys.exit(f"FAIL: {name}: shape/dtype {o['shape']} {o['dtype']} != {e['shape']} {e['dtype']}")
        with open(ff, "rb") as f, open(gf, "rb") as g:
            f.seek(off + e["data_offsets"][0])
            g.seek(goff + o["data_offsets"][0])
            size = e["data_offsets"][1] - e["data_offsets"][0]
            while size:
                k = min(size, 1 << 24)
                if f.read(k) != g.read(k):
                    sys.exit(f"FAIL: {name}: bytes differ")
                size -= k
    print(f"all {len(want)} tensors byte-identical")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gen":
        gen(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
