#!/usr/bin/python3
"""qwen2_ckpt.py - generates and compares Hugging Face safetensors checkpoints
for the `wexctl convert` test, with the standard library only.

  qwen2_ckpt.py gen CONFIG OUTDIR      sharded HF checkpoint (2 files + index)
  qwen2_ckpt.py compare REFDIR FILE    every tensor of REFDIR byte-equal in FILE
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


def compare(ref, path):
    idx = json.load(open(os.path.join(ref, "model.safetensors.index.json")))
    got, goff = read_header(path)
    n = 0
    with open(path, "rb") as g:
        for fn in sorted(set(idx["weight_map"].values())):
            hdr, off = read_header(os.path.join(ref, fn))
            with open(os.path.join(ref, fn), "rb") as f:
                for name, e in hdr.items():
                    if name == "__metadata__":
                        continue
                    if name not in got:
                        sys.exit(f"FAIL: {name} missing from {path}")
                    o = got[name]
                    if o["shape"] != e["shape"] or o["dtype"] != e["dtype"]:
                        sys.exit(f"FAIL: {name}: shape/dtype {o['shape']} {o['dtype']} != {e['shape']} {e['dtype']}")
                    f.seek(off + e["data_offsets"][0])
                    g.seek(goff + o["data_offsets"][0])
                    size = e["data_offsets"][1] - e["data_offsets"][0]
                    while size:
                        k = min(size, 1 << 24)
                        if f.read(k) != g.read(k):
                            sys.exit(f"FAIL: {name}: bytes differ")
                        size -= k
                    n += 1
    print(f"all {n} tensors byte-identical")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gen":
        gen(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
