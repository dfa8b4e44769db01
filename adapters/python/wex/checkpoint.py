# SPDX-License-Identifier: MIT
"""wex.checkpoint - does an engine hold its weights as the layout says?

wex copies the trainer's weights into the engine's tensors where the
layout says each canonical piece lives.  An engine (or a kernel backend
it picked) that re-lays out a tensor after loading, keeping its shape
(MoE kernels that store w13 as [w3; w1] or shuffle it in tiles,
quantization post-processing), would read those copies as something
else: wrong outputs, no error.  Checking backends by name cannot know
every one; comparing bytes can.  Before the first copy, while the
engine still holds what it loaded, compare() reads a sample of every
piece the rank holds from the model's safetensors checkpoint and from
the engine's tensor, where the layout places it, and raises
CheckpointMismatch, naming the tensor and the element, on the first
difference.

The sample: for each piece, up to `elems` elements of its first, middle
and last rows (the innermost dimension), so a swap of halves, an
interleave or a tile shuffle shows while a 700 GB checkpoint costs a few
reads per piece.  Only what the engine loaded from that checkpoint can
be compared: an engine started with dummy weights, or one the weights
were already updated in, differs everywhere.

    from wex.checkpoint import compare
    report = compare(model.named_parameters(), "/ckpt/qwen3-moe",
                     layout=wex.Layout(cfg, "vllm:tp=2"), rank=tp_rank, config=cfg)
"""
import glob
import json
import os
import struct
import time

import wex
from wex import torch_util

__all__ = ["CheckpointMismatch", "compare", "index"]

# A safetensors header is JSON of at most this many bytes (the reference
# implementation's limit; it also caps what a corrupt length makes us read).
_HEADER_MAX = 100000000

# Bits an element of each safetensors dtype takes (huggingface/safetensors
# Dtype::bitsize): the data must be numel * bits / 8 bytes, whole bytes.
_DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
               "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
               "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


def _no_dups(pairs):
    """A JSON object without repeated keys (the reference refuses them: a
    reader that keeps the last would see other tensors than one that keeps
    the first)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("key %r appears twice" % k)
        out[k] = v
    return out


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


def _naturals(v, n=None):
    """v as a tuple of non-negative JSON integers (n of them if given)."""
    if not isinstance(v, list) or (n is not None and len(v) != n) or \
            any(type(d) is not int or d < 0 for d in v):
        raise TypeError
    return tuple(v)


class CheckpointMismatch(ValueError):
    """The engine's tensor does not hold the checkpoint's values where
    the layout places them."""


def index(checkpoint):
    """{name: (path, dtype, shape, data offset in the file, nbytes)} of
    every tensor in `checkpoint` (a .safetensors file, a sharded
    checkpoint's *.safetensors.index.json: the files it maps, or a
    directory: the files its model.safetensors.index.json maps, else every
    *.safetensors in it, as sharded checkpoints keep them).  Raises
    ValueError naming the file for one that cannot be read or is not
    safetensors, a tensor in two files, a file the index maps that is not
    there, or a directory with none."""
    checkpoint = os.fspath(checkpoint)
    idx = None
    if os.path.isfile(checkpoint) and checkpoint.endswith(".safetensors.index.json"):
        idx = checkpoint
        checkpoint = os.path.dirname(checkpoint) or "."
    elif os.path.isdir(checkpoint):
        idx = os.path.join(checkpoint, "model.safetensors.index.json")
    if os.path.isdir(checkpoint):
        files = sorted(glob.glob(os.path.join(glob.escape(checkpoint), "*.safetensors")))
        if os.path.isfile(idx):
            # What the engines read where both a merged file and shards
            # are there (vLLM's filter_duplicate_safetensors_files).
            try:
                with open(idx) as f:
                    mapped = set(json.load(f)["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError("%s: not a safetensors index (%s)" % (idx, e)) from None
            files = [f for f in files if os.path.basename(f) in mapped]
            if not files:
                raise ValueError("%s maps no .safetensors file that is there" % idx)
            # A shard still being written or downloaded: its tensors are
            # in the checkpoint, just not readable yet.
            gone = sorted(m for m in mapped
                          if not os.path.isfile(os.path.join(checkpoint, str(m))))
            if gone:
                raise ValueError("%s maps %s, which %s not there (a checkpoint still being "
                                 "written or downloaded?)" % (idx, ", ".join(map(str, gone[:3])),
                                                             "is" if len(gone) == 1 else "are"))
        if not files:
            raise ValueError("checkpoint %s holds no .safetensors file" % checkpoint)
    elif os.path.isfile(checkpoint):
        files = [checkpoint]
    else:
        raise ValueError("checkpoint %s: no such file or directory" % checkpoint)
    try:
        return _read_headers(files)
    except OSError as e:
        raise ValueError("checkpoint %s: %s" % (checkpoint, e)) from None


def _read_headers(files):
    out = {}
    for path in files:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None or n > min(size - 8, _HEADER_MAX):
                raise ValueError("%s is not a safetensors file (header length %s, file of "
                                 "%d bytes)" % (path, n, size))
            try:
                header = json.loads(f.read(n).decode("utf-8"), object_pairs_hook=_no_dups,
                                    parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                raise ValueError("%s: safetensors header is not UTF-8 JSON without repeated "
                                 "keys: %s" % (path, "nested too deep" if isinstance(
                                     e, RecursionError) else e)) from None
        if not isinstance(header, dict):
            raise ValueError("%s: safetensors header is not a JSON object" % path)
        base = 8 + n
        for name, v in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape = v["dtype"], _naturals(v["shape"])
                start, end = _naturals(v["data_offsets"], 2)
                bits = _DTYPE_BITS[dtype]
            except (KeyError, TypeError):
                raise ValueError("%s: tensor %s has no valid dtype, shape and data_offsets"
                                 % (path, name)) from None
            if not start <= end or base + end > size:
                raise ValueError("%s: tensor %s's data_offsets [%d, %d] lie outside the file"
                                 % (path, name, start, end))
            nbits = bits
            for d in shape:
                nbits *= d
            if nbits % 8 or nbits // 8 != end - start:
                raise ValueError("%s: tensor %s: %d bytes for shape %s of %s" % (
                    path, name, end - start, list(shape), dtype))
            if name in out:
                raise ValueError("tensor %s is in both %s and %s" % (name, out[name][0], path))
            out[name] = (path, dtype, shape, base + start, end - start)
    return out


def _sample(extent, elems):
    """Index deltas (a numpy int64 array, one row per element, one column
    per dimension) of the sampled elements of a box of `extent`: up to
    `elems` elements at the start, the middle and the end of its first,
    middle and last rows."""
    import numpy as np

    nd = len(extent)
    if nd == 0:
        return np.zeros((1, 0), dtype=np.int64)
    last = extent[-1]
    rows = []
    for pick in (lambda e: 0, lambda e: e // 2, lambda e: e - 1):
        rows.append(tuple(pick(e) for e in extent[:-1]))
    rows = sorted(set(rows))
    k = min(elems, last)
    cols = sorted({c for s in (0, (last - k) // 2, last - k) for c in range(s, s + k)})
    cols = np.array(cols, dtype=np.int64)
    out = np.empty((len(rows) * len(cols), nd), dtype=np.int64)
    for i, r in enumerate(rows):
        blk = out[i * len(cols):(i + 1) * len(cols)]
        blk[:, :-1] = r
        blk[:, -1] = cols
    return out


def _offsets(piece, deltas, start=None):
    """Element offsets, from the piece's physical tensor's start, of the
    canonical elements at `deltas` from the box's start (or, with start,
    from that canonical index: the same elements seen from another
    piece of the same tensor)."""
    import numpy as np

    nd = piece.ndim
    isz = wex.DTYPE_SIZE[piece.dtype_name]
    strides = [piece.strides[d] for d in range(nd)]
    if not any(strides):
        # All zero: C order over the box (as the planner reads them).
        acc = 1
        for d in reversed(range(nd)):
            strides[d] = acc
            acc *= piece.extent[d]
    strides = np.array(strides, dtype=np.int64)
    if start is not None:
        shift = np.array([start[d] - piece.start[d] for d in range(nd)], dtype=np.int64)
        deltas = deltas + shift
    return piece.offset // isz + (deltas @ strides if nd else np.zeros(len(deltas), np.int64))


def _canonical(config, adapters):
    """{canonical name: (checkpoint tensor name, its piece)} from the hf
    layout of config (every canonical tensor whole, under the checkpoint's
    own names)."""
    out = {}
    with wex.Layout(config, "hf", adapters) as hf:
        for name, _, _, pieces in hf.rank(0):
            for p in pieces:
                out[p.name.decode()] = (name, p)
    return out


_INT_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
# Float types an engine may load a checkpoint's tensor as (its --dtype);
# the loader's copy_ casts, round to nearest even, as torch's .to does.
_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def _ints(t):
    """t (detached) viewed as integers of its element size: indexing works
    on those for every dtype (not on float8 in every PyTorch)."""
    import torch

    return t.detach().view(getattr(torch, _INT_OF_SIZE[t.element_size()]))


def _as_bytes(x):
    """The bytes of the elements of integer tensor x, in order, as a numpy
    uint8 array (copied to the host)."""
    return x.reshape(-1).contiguous().cpu().numpy().view("u1")


def _ckpt_bytes(files, entry, idx, dtype):
    """The bytes of the checkpoint tensor's elements at `idx`, cast to
    `dtype` (the engine's) where the checkpoint holds another float type.
    Read with pread, one read per run of consecutive elements (not
    mapped: a file cut short while mapped would kill the process with
    SIGBUS); files: {path: open file}, the caller closes them.  Raises
    ValueError naming the file for one that is not as its header said."""
    import numpy as np
    import torch

    path, have, _, data, nbytes = entry
    isz = wex.DTYPE_SIZE[have]
    try:
        f = files.get(path)
        if f is None:
            f = files[path] = open(path, "rb", buffering=0)
        size = os.fstat(f.fileno()).st_size
        # Runs of consecutive element offsets, in the order asked.
        cut = np.nonzero(np.diff(idx) != 1)[0] + 1
        parts = []
        for run in np.split(idx, cut) if len(idx) else ():
            n, at = len(run) * isz, data + int(run[0]) * isz
            b = os.pread(f.fileno(), n, at) if data + nbytes <= size else b""
            if len(b) != n:
                raise ValueError("%s: %d bytes at offset %d could not be read: the file has "
                                 "%d bytes, its header says %d: cut short since it was "
                                 "read (being written over?)"
                                 % (path, n, at, os.fstat(f.fileno()).st_size, data + nbytes))
            parts.append(b)
    except OSError as e:
        raise ValueError("checkpoint file %s: %s" % (path, e)) from None
    raw = np.frombuffer(bytearray(b"".join(parts)), dtype=np.uint8)
    if have == dtype:
        return raw
    ints = torch.from_numpy(raw.view(_INT_OF_SIZE[isz]))
    cast = ints.view(getattr(torch, _FLOATS[have])).to(getattr(torch, _FLOATS[dtype]))
    return _as_bytes(_ints(cast))


def compare(named_tensors, checkpoint, layout=None, rank=0, config=None, adapters=None,
            elems=64, skip=None):
    """Compares a sample of each piece of this rank's tensors with the
    checkpoint; returns {"pieces", "elements", "bytes", "skipped",
    "seconds", "checkpoint"} (skipped: ["name (why)"] of pieces the
    checkpoint cannot show: a tensor it lacks, such as a tied lm_head,
    or holds in another dtype).  Raises CheckpointMismatch on the first
    difference, ValueError for a checkpoint that cannot be read.

    A checkpoint file cut short while it is compared (being written over)
    is refused, ValueError naming it.

    named_tensors: the engine's (name, tensor) pairs, as attached
    (wex.engine.select_parameters).  layout, rank: the engine's wex.Layout
    and rank (the tensors are then its physical tensors, contiguous);
    without a layout, tensors carry canonical names and shapes.  config:
    the model's config.json, to map canonical names to the checkpoint's
    (the hf layout; without it they are the same).  elems: the elements
    compared per sampled row, at least 1.  skip: a function of
    (canonical name, dtype name) returning why a piece is not to be
    compared (the engine rewrites it after loading), or None."""
    # (0 would compare nothing and report the pieces compared; a float
    # or a string failed deep in numpy.)  A NumPy or PyTorch integer is
    # an int, as wex._int takes it.
    try:
        n = wex._int(elems, "elems")
    except TypeError:
        n = 0
    if n < 1:
        raise ValueError("elems (the elements compared per sampled row) must be an int of "
                         "at least 1, not %r" % (elems,))
    elems = n
    files = {}
    try:
        return _compare(files, named_tensors, checkpoint, layout, rank, config, adapters,
                        elems, skip)
    finally:
        for f in files.values():
            f.close()


def _compare(maps, named_tensors, checkpoint, layout, rank, config, adapters, elems, skip):
    import numpy as np
    import torch

    t0 = time.monotonic()
    ckpt = index(checkpoint)
    names = _canonical(config, adapters) if config else {}
    tensors = [(n, t) for n, t in named_tensors if t.numel()]
    if layout is not None:
        where = {n: (dt, tuple(shape), ps) for n, dt, shape, ps in layout.rank(rank)}
    skipped = []
    pieces = elements = nbytes = 0
    for name, t in tensors:
        own = (None,)
        if layout is not None:
            dt, shape, own = where.get(name, (None, None, ()))
            if own and (torch_util.wex_dtype(t.dtype) != dt or tuple(t.shape) != shape or
                        not t.is_contiguous()):
                # Attaching refuses it, saying why; nothing to read here.
                skipped.append("%s (the engine's %s %s%s is not the layout's %s %s)"
                               % (name, torch_util.wex_dtype(t.dtype), list(t.shape),
                                  "" if t.is_contiguous() else " strided", dt, list(shape)))
                continue
        # (piece or None, canonical name, its start, sampled deltas,
        # checkpoint entry, the checkpoint's element offsets)
        wanted = []
        for p in own:
            if p is not None:
                cname, dtype, extent = p.name.decode(), p.dtype_name, p.dims()
                start = p.dims("start")
            else:
                # The whole canonical tensor, wherever its strides put it.
                cname, dtype, extent = name, torch_util.wex_dtype(t.dtype), tuple(t.shape)
                start = (0,) * len(extent)
            if not all(extent):
                continue
            why = skip(cname, dtype) if skip is not None else None
            if why:
                skipped.append("%s (%s)" % (cname, why))
                continue
            hname, hp = names.get(cname, (cname, None))
            entry = ckpt.get(hname)
            if entry is None:
                skipped.append("%s (not in the checkpoint)" % cname)
                continue
            if entry[1] != dtype and (entry[1] not in _FLOATS or dtype not in _FLOATS):
                skipped.append("%s (the checkpoint holds %s, the engine %s)"
                               % (cname, entry[1], dtype))
                continue
            shape = entry[2]
            # No layout: the engine's tensor is the whole canonical one,
            # shaped as it (half its rows would compare as equal; the same
            # bytes in another shape, as different).
            full = tuple(hp.dims("shape")) if hp is not None else tuple(shape)
            if p is None and full != tuple(extent):
                skipped.append("%s (the %s shape %s is not the engine's %s)"
                               % (cname, "checkpoint's" if hp is None else "config's",
                                  list(full), list(extent)))
                continue
            deltas = _sample(extent, elems)
            if hp is not None:
                if shape != hp.dims("shape"):
                    skipped.append("%s (the checkpoint's shape %s is not the config's %s)"
                                   % (cname, list(shape), list(hp.dims("shape"))))
                    continue
                cidx = _offsets(hp, deltas, start=start)
            else:
                # The checkpoint's tensor is the canonical one, C order.
                cstr = np.array([int(np.prod(shape[d + 1:], dtype=np.int64))
                                 for d in range(len(shape))], dtype=np.int64)
                cidx = ((deltas + np.array(start, dtype=np.int64)) @ cstr if len(shape)
                        else np.zeros(len(deltas), np.int64))
            if len(shape) != len(extent) or cidx.min() < 0 or \
                    (cidx.max() + 1) * wex.DTYPE_SIZE[entry[1]] > entry[4]:
                skipped.append("%s (the checkpoint's shape %s does not hold the piece)"
                               % (cname, list(shape)))
                continue
            wanted.append((p, cname, start, deltas, entry, cidx))
        if not wanted:
            continue
        # One small gather on the tensor's device for all its pieces.
        if layout is not None:
            idx = np.concatenate([_offsets(p, deltas) for p, _, _, deltas, _, _ in wanted])
            got = _as_bytes(_ints(t).reshape(-1)[torch.from_numpy(idx).to(t.device)])
        else:
            deltas = wanted[0][3]
            cols = tuple(torch.from_numpy(deltas[:, d]).to(t.device)
                         for d in range(deltas.shape[1]))
            got = _as_bytes(_ints(t)[cols])
        isz = t.element_size()
        at = 0
        for p, cname, start, deltas, entry, cidx in wanted:
            n = len(deltas) * isz
            mine = got[at:at + n]
            want = _ckpt_bytes(maps, entry, cidx, torch_util.wex_dtype(t.dtype))
            at += n
            if not np.array_equal(mine, want):
                diff = (mine != want).reshape(-1, isz).any(axis=1)
                bad = int(np.nonzero(diff)[0][0])
                raise CheckpointMismatch(
                    "engine tensor %s does not hold the checkpoint's %s where the layout %s "
                    "places it: element %s differs (%d of %d sampled elements of this piece "
                    "do; checkpoint %s): the engine re-laid out or transformed its weights "
                    "after loading (an MoE kernel backend, quantization post-processing), "
                    "was loaded from another checkpoint, or its weights were changed since "
                    "(its own weight-update API, sleep mode level 2); a copy would be read "
                    "wrong. Pass checkpoint=False to skip this check only if the engine "
                    "reads the layout's bytes as they are"
                    % (name, cname, layout.spec if layout is not None else "(canonical)",
                       [int(deltas[bad][d]) + start[d] for d in range(len(start))],
                       int(diff.sum()), len(deltas), entry[0]))
            pieces += 1
            elements += len(deltas)
            nbytes += n
    return {"checkpoint": checkpoint, "pieces": pieces, "elements": elements, "bytes": nbytes,
            "skipped": skipped, "seconds": time.monotonic() - t0}

