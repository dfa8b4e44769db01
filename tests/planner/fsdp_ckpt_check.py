#!/usr/bin/python3
"""fsdp_ckpt_check.py - checks `wexctl convert --to fsdp:fsdp=N,dp=M` output
against PyTorch itself, independently of wex's layout code: rank
r = s + N*m holds, under each canonical name of the Hugging Face checkpoint,
torch.chunk(t, N, dim=0)[s] (an empty tensor of 0 rows where torch.chunk
gives fewer than N chunks, as FSDP2's _chunk_with_empty), and nothing else.

  fsdp_ckpt_check.py HF_DIR RANK_DIR N M

Exit 0 pass, 1 fail, 77 skip (no torch).
"""
import glob, json, os, struct, sys

try:
    import torch
except ImportError:
    print("skip: torch is not importable by", sys.executable)
    sys.exit(77)

# Compared as integers of the element's size: bytes, not float values.
INT = {"BF16": torch.int16, "F16": torch.int16, "F32": torch.int32, "F64": torch.int64,
       "F8_E4M3": torch.uint8, "F8_E5M2": torch.uint8, "I64": torch.int64, "I32": torch.int32}


def read(path):
    """name -> (dtype name, integer tensor of its shape)."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    out = {}
    for k, e in json.loads(b[8:8 + n]).items():
        if k == "__metadata__":
            continue
        o = e["data_offsets"]
        raw = bytearray(b[8 + n + o[0]:8 + n + o[1]])
        t = torch.frombuffer(raw, dtype=INT[e["dtype"]]) if raw else torch.empty(0, dtype=INT[e["dtype"]])
        out[k] = (e["dtype"], t.reshape(e["shape"]))
    return out


def main(hf, rdir, n, m):
    ref = {}
    for p in sorted(glob.glob(os.path.join(hf, "*.safetensors"))):
        ref.update(read(p))
    files = sorted(glob.glob(os.path.join(rdir, "rank-*.safetensors")))
    if len(files) != n * m:
        sys.exit(f"FAIL: {len(files)} rank files, wanted {n * m}")
    for r in range(n * m):
        got = read(os.path.join(rdir, f"rank-{r}.safetensors"))
        if set(got) != set(ref):
            sys.exit(f"FAIL: rank {r} holds other names than the checkpoint: "
                     f"{sorted(set(got) ^ set(ref))[:3]}")
        for name, (dt, t) in ref.items():
            chunks = list(torch.chunk(t, n, dim=0))
            want = chunks[r % n] if r % n < len(chunks) else t.new_empty((0,) + tuple(t.shape[1:]))
            gdt, g = got[name]
            if gdt != dt or g.shape != want.shape or not torch.equal(g, want):
                sys.exit(f"FAIL: rank {r} {name}: {gdt} {list(g.shape)}, wanted torch.chunk's "
                         f"{dt} {list(want.shape)} (or its bytes differ)")
    print(f"{rdir}: {n * m} ranks, each of {len(ref)} tensors is torch.chunk(t, {n}, dim=0)[rank % {n}]")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
