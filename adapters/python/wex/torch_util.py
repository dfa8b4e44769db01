# SPDX-License-Identifier: MIT
"""PyTorch helpers over the wex binding: exportable trainer memory, tensor
tables from modules, and tensors over memory wex mapped (no copies).

Trainer, with wex's allocator (one exportable VMM allocation per
caching-allocator segment):

    alloc, pool = wex.torch_util.exportable_pool()
    with torch.cuda.use_mem_pool(pool):
        model = build_model().cuda()
    wex.torch_util.register_module(client, model.named_parameters())

or with no code change at allocation time: start the trainer with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (every torch 2.x honours
that name; the newer PYTORCH_ALLOC_CONF alone is ignored for
expandable_segments by torch 2.9.1, pytorch#183387: set both) and call
register_module the same way (its segments are
exportable; a parameter may span chunks).  Tensors over device memory
(view_tensors, reserve_like) go through __cuda_array_interface__, which
PyTorch reads with NumPy.

An FSDP2 trainer (fully_shard, HSDP) registers its sharded parameters as
they are: each DTensor's local shard goes in as the rows of dim 0 it holds
of the whole tensor (fsdp_rows), so an engine attaches whole or TP-cut
tensors and wex gathers the rows from the ranks, with no all-gather in
the trainer.  A trainer that shards by hand passes boxes=.
"""
import collections.abc
import contextlib
import ctypes

import torch

import wex

_TO_WEX = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
    torch.float32: "F32", torch.int64: "I64", torch.float64: "F64",
}
for _n, _w in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
               ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"),
               ("float8_e8m0fnu", "F8_E8M0")):
    if hasattr(torch, _n):
        _TO_WEX[getattr(torch, _n)] = _w
_FROM_WEX = {v: k for k, v in _TO_WEX.items()}


def wex_dtype(dtype):
    """The safetensors name wex uses for a torch dtype."""
    try:
        return _TO_WEX[dtype]
    except KeyError:
        raise ValueError("wex has no element type for %s" % dtype) from None


def torch_dtype(name):
    try:
        return _FROM_WEX[name]
    except KeyError:
        raise ValueError("no torch dtype for wex element type %s" % name) from None


def exportable_pool():
    """(allocator, pool): a CUDAPluggableAllocator over wex_cuda_alloc and
    wex_cuda_free and a torch.cuda.MemPool using it.  Keep both alive as
    long as any tensor allocated in the pool (pytorch#146431), and drop the
    pool before the allocator: the pool's destructor frees its cached
    segments through the allocator, which the caching allocator may hold
    by a raw pointer only (pytorch#171962).  Use it or
    expandable_segments:True, not both: some PyTorch versions refuse
    allocations in a MemPool while expandable segments are on ("MemPool
    doesn't currently support expandable_segments"), and either way makes
    the parameters exportable."""
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError("torch %s has no torch.cuda.MemPool (2.5 or later)" % torch.__version__)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(wex.lib_path(), "wex_cuda_alloc",
                                                     "wex_cuda_free")
    return alloc, torch.cuda.MemPool(alloc.allocator())


# Parameters closer than a chunk share one registered range: PyTorch maps
# expandable segments in chunks of 2 MiB (its small pool, allocations up
# to 1 MiB) or 20 MiB (large), and two ranges inside one chunk would
# export it twice.  A gap of a whole chunk or more is not registered: a
# chunk holding no parameter is PyTorch's to unmap (empty_cache(), or
# its own retry when an allocation runs out of memory), and one wex held
# would stay in use and fail the next begin_write as moved memory.
MERGE_GAP = 20 << 20
SMALL_GAP = 2 << 20


def _segments(device):
    """Mapped ranges (address, size, merge gap) of the caching allocator
    on device, every pool's, sorted.  An expandable segment shows as one
    range per stretch of mapped chunks; its merge gap is its chunk size
    (SMALL_GAP in the small pool), MERGE_GAP elsewhere."""
    out = []
    for s in torch.cuda.memory_snapshot():
        if s.get("device", device) == device and s["total_size"]:
            small = s.get("is_expandable") and s.get("segment_type") == "small"
            out.append((s["address"], s["total_size"], SMALL_GAP if small else MERGE_GAP))
    out.sort()
    return out


def merge_spans(spans, gap=MERGE_GAP):
    """[(start, end)] -> the sorted ranges covering them, spans less than
    `gap` bytes apart merged into one."""
    out = []
    for a, e in sorted(spans):
        if out and a - out[-1][1] < gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([a, e])
    return [(a, e) for a, e in out]


def _storage_bytes(t):
    """Bytes of t's storage, or None where it has none of its own (a
    wrapper tensor subclass: PyTorch refuses to show it)."""
    try:
        if hasattr(t, "untyped_storage"):
            return t.untyped_storage().nbytes()
        return t.storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return None


def _own_bytes(name, t, nb):
    """Refuses a tensor whose dtype and shape do not describe the storage
    under it: a wrapper subclass with no storage of its own or a nominal
    dtype over other bytes (Transformer Engine's Float8Tensor, which
    Megatron's --fp8-param-gather makes of parameters: BF16 by dtype over
    1-byte FP8 data), whose bytes wex would register as the wrong type."""
    what = "%s (%s, dtype %s)" % (name, type(t).__name__, t.dtype)
    have = _storage_bytes(t)
    try:
        p = t.data_ptr()
    except (RuntimeError, NotImplementedError):
        p = 0
    if have is None or not p:
        raise ValueError("%s has no storage of its own (a tensor subclass wrapping other "
                         "tensors, such as Transformer Engine's Float8Tensor): wex registers "
                         "plain tensors and FSDP2 DTensors; FP8 parameters (Megatron "
                         "--fp8-param-gather) are not supported" % what)
    need = t.storage_offset() * t.element_size() + nb
    if need > have:
        raise ValueError("%s spans %d bytes of a storage of %d: its dtype does not describe "
                         "the bytes under it (a quantized tensor subclass?)" % (what, need, have))
    return p


def _placed(items, ranges, where):
    """[(name, tensor, address, bytes spanned, strides, containing range)]
    for the non-empty tensors, each found in one of ranges ((address,
    size), or _segments' (address, size, merge gap), given back as it is)
    (none when every tensor is empty: an FSDP2 rank past the last chunk
    of each)."""
    out = []
    for name, t in items:
        if t.numel() == 0:
            continue
        strides = _table_strides(name, t)
        nb = _span(tuple(t.shape), strides) * t.element_size()
        p = _own_bytes(name, t, nb)
        seg = next((r for r in ranges if r[0] <= p and p + nb <= r[0] + r[1]), None)
        if seg is None:
            raise ValueError("%s (0x%x, %d bytes) is in %s" % (name, p, nb, where))
        out.append((name, t, p, nb, strides, seg))
    return out


def plan_ranges(placed, gap=MERGE_GAP):
    """The ranges register_module registers for tensors placed in
    allocator segments: per segment, the tensors' spans merged
    (merge_spans, with the segment's own merge gap where it has one),
    never crossing a segment's bounds.  [(start, size)]."""
    by_seg = {}
    for _, _, p, nb, _, seg in placed:
        by_seg.setdefault(seg, []).append((p, p + nb))
    out = []
    for seg in sorted(by_seg):
        out += [(a, e - a) for a, e in merge_spans(by_seg[seg], min(gap, seg[2])
                                                   if len(seg) > 2 else gap)]
    return out


def fsdp_rows(d0, n, r):
    """(first row, rows) of a d0-row dim 0 that rank r of an n-way FSDP2
    shard holds: torch.chunk's chunks of ceil(d0 / n) rows, then empty
    ones for the ranks past the last chunk (FSDP2's _chunk_with_empty: 5
    rows over 4 ranks are 2, 2, 1, 0)."""
    d0, n, r = int(d0), int(n), int(r)
    if d0 < 0 or n < 1 or not 0 <= r < n:
        raise ValueError("fsdp_rows: rank %d of %d ranks over %d rows" % (r, n, d0))
    c = -(-d0 // n)
    a, b = min(r * c, d0), min((r + 1) * c, d0)
    return a, b - a


def _placement_name(p):
    d = getattr(p, "dim", None)
    return "%s(%s)" % (type(p).__name__, "" if d is None else d)


def _dtensor_box(name, t):
    """(local tensor, global shape, start) of a DTensor sharded as FSDP2
    and HSDP shard: Shard(0) over at most one mesh dim, Replicate over the
    others; anything else is refused naming the parameter."""
    placements, mesh = tuple(t.placements), t.device_mesh
    local = t.to_local()
    shape = tuple(int(s) for s in t.shape)
    coord = mesh.get_coordinate()
    if coord is None:
        raise ValueError("%s: this rank is not in the parameter's device mesh" % name)
    shard = None
    for i, p in enumerate(placements):
        if p.is_replicate():
            continue
        # _StridedShard (FSDP over TP) is a Shard too, with other rows.
        if not (p.is_shard() and type(p).__name__ == "Shard" and p.dim == 0) or shard is not None:
            raise ValueError("%s: placements %s: wex describes FSDP2/HSDP shards, Shard(0) "
                             "on one mesh dim and Replicate on the others (not %s on mesh "
                             "dim %d)" % (name, "(" + ", ".join(map(_placement_name, placements))
                                         + ")", _placement_name(p), i))
        shard = i
    start = [0] * len(shape)
    if shard is not None:
        start[0], rows = fsdp_rows(shape[0], mesh.size(shard), coord[shard])
        if tuple(local.shape) != (rows,) + shape[1:]:
            raise ValueError("%s: local shard of shape %s, but rank %d of %d of a %s tensor "
                             "holds %d rows (torch.chunk)" % (name, tuple(local.shape),
                                                             coord[shard], mesh.size(shard),
                                                             shape, rows))
    return local, shape, tuple(start)


def _is_dtensor(t):
    return all(hasattr(t, a) for a in ("to_local", "placements", "device_mesh"))


def _boxed(items, boxes):
    """[(name, local tensor, global shape, start)]: DTensors by their
    placements, boxes' entries by (shape, start), the rest whole."""
    boxes = dict(boxes or {})
    unknown = sorted(set(boxes) - {n for n, _ in items})
    if unknown:
        raise ValueError("boxes names %s, which is not among the tensors" % ", ".join(unknown[:3]))
    out = []
    for name, t in items:
        if _is_dtensor(t):
            if name in boxes:
                raise ValueError("%s: a DTensor has its box from its placements: leave it out "
                                 "of boxes" % name)
            out.append((name,) + _dtensor_box(name, t))
            continue
        if name not in boxes:
            out.append((name, t, tuple(t.shape), (0,) * t.dim()))
            continue
        try:
            shape, start = boxes[name]
        except (TypeError, ValueError):
            raise ValueError("boxes[%r]: expected (shape, start), got %r"
                             % (name, boxes[name])) from None
        shape = tuple(int(s) for s in shape)
        if isinstance(start, int):
            start = (start,) + (0,) * (len(shape) - 1)
        start = tuple(int(s) for s in start)
        if len(shape) != t.dim() or len(start) != t.dim():
            raise ValueError("%s: boxes gives shape %s and start %s for a %d-dim tensor"
                             % (name, shape, start, t.dim()))
        for d, (a, e, s) in enumerate(zip(start, t.shape, shape)):
            if a < 0 or a + e > s:
                raise ValueError("%s: dim %d holds [%d, %d) of %d (boxes start %s, tensor "
                                 "shape %s, whole shape %s)"
                                 % (name, d, a, a + e, s, start, tuple(t.shape), shape))
        out.append((name, t, shape, start))
    return out


def layout_tensors(layout, rank, device="cpu"):
    """{name: zeroed tensor} of the physical tensors that rank `rank` of
    `layout` (a wex.Layout) holds, in its shapes and dtypes, on `device`:
    buffers to attach_module or register_module with that layout (an
    engine's or trainer's own parameters, where they exist, serve as
    they are)."""
    return {name: torch.zeros(shape, dtype=torch_dtype(dt), device=device)
            for name, dt, shape, _ in layout.rank(rank)}


def _layout_items(items, layout, rank):
    """[(name, tensor, [pieces])] for named physical tensors laid out as
    rank `rank` of `layout`: every tensor the layout's rank holds, by
    name, in its shape and dtype, contiguous (the pieces' offsets and
    strides are the layout's); nothing else."""
    if rank is None:
        raise ValueError("layout=%s needs rank=: which rank of its %d these tensors are"
                         % (layout.spec, layout.world))
    for name, t in items:
        if _is_dtensor(t):
            raise ValueError("%s is a DTensor: pass its local shard (to_local()) with an "
                             "fsdp:fsdp=N layout, whose rank holds that shard (wex.trainer."
                             "TrainerRank takes the DTensors, and finds their shards at "
                             "each write)" % name)
    phys = {name: (dt, shape, pieces) for name, dt, shape, pieces in layout.rank(rank)}
    given = dict(items)
    missing = [n for n in phys if n not in given]
    extra = [n for n in given if n not in phys]
    if missing or extra:
        # Megatron-Core's TopKRouter keeps expert_bias as a buffer
        # (register_buffer), so named_parameters() never has it.
        hint = ("; Megatron-Core keeps router.expert_bias as a buffer: pass the "
                "*.router.expert_bias ones of model.named_buffers() too (not the "
                "others: local_tokens_per_expert is a buffer of the router as well)"
                if any(n.endswith("router.expert_bias") for n in missing) else "")
        raise ValueError("%s rank %d: %s%s%s%s" % (
            layout.spec, rank,
            "missing %s" % ", ".join(missing[:3]) + (" and %d more" % (len(missing) - 3)
                                                      if len(missing) > 3 else "")
            if missing else "", "; " if missing and extra else "",
            "not in the layout: %s" % ", ".join(extra[:3]) if extra else "", hint))
    out = []
    for name, t in items:
        dt, shape, pieces = phys[name]
        if tuple(t.shape) != tuple(shape):
            raise ValueError("%s: shape %s, the layout %s (rank %d) has %s"
                             % (name, tuple(t.shape), layout.spec, rank, tuple(shape)))
        if wex_dtype(t.dtype) != dt:
            # Float16Module casts every buffer to bf16/fp16; Megatron-Core's
            # router makes expert_bias fp32 again, in new memory, only in
            # its first forward or a state-dict load or save
            # (_maintain_float32_expert_bias).
            hint = ("; Megatron-Core keeps router.expert_bias in fp32 only from the router's "
                    "first forward (or a checkpoint load) on, Float16Module having cast it "
                    "to %s: register after that" % t.dtype
                    if name.endswith("router.expert_bias") else "")
            raise ValueError("%s: dtype %s, the layout %s has %s%s"
                             % (name, wex_dtype(t.dtype), layout.spec, dt, hint))
        if not t.is_contiguous():
            raise ValueError("%s: not contiguous (strides %s): the layout's pieces assume "
                             "C order" % (name, tuple(t.stride())))
        out.append((name, t, pieces))
    return out


def _piece(piece, **where):
    """A copy of a layout piece placed by segment/offset (a producer's) or
    ptr (a consumer's)."""
    t = wex.Tensor.from_buffer_copy(piece)
    for k, v in where.items():
        setattr(t, k, v)
    return t


def _named(named_tensors, what):
    """[(name, tensor)] of named_tensors: (name, tensor) pairs
    (named_parameters()) or a dict of them (state_dict()); TypeError
    naming what is neither, or a value that is no torch.Tensor (a NumPy
    array), where iterating a dict gave its names (a ValueError or
    AttributeError about a str) and an array had no .detach."""
    if isinstance(named_tensors, collections.abc.Mapping):
        named_tensors = named_tensors.items()
    out = []
    for item in named_tensors:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError("%s: expected (name, tensor) pairs or a dict of tensors, got %r"
                            % (what, item))
        name, t = item
        if not isinstance(t, torch.Tensor) and not _is_dtensor(t):
            raise TypeError("%s: %s is a %s, not a torch.Tensor"
                            % (what, name, type(t).__name__))
        # (Here, before anything is registered, naming the tensor: was
        # "wex has no element type for torch.complex64", naming none,
        # raised as the table was made, after register_module had
        # exported the CUDA tensors' memory into the client.)
        dt = getattr(t, "dtype", None)
        if dt is not None and dt not in _TO_WEX:
            # (attach_module is the engines': EngineRank's ignore= leaves it out there.)
            raise ValueError("%s: %s is %s, which wex has no element type for (safetensors' "
                             "%s): leave it out (%s's ignore=) or keep it in one of those"
                             % (what, name, dt, ", ".join(sorted(set(_TO_WEX.values()))),
                                "EngineRank" if what == "attach_module" else "TrainerRank"))
        # (complex.conj().imag: PyTorch negates or conjugates such a view
        # as it reads it; wex moves the bytes, which hold the values
        # before that.)
        if isinstance(t, torch.Tensor) and (t.is_neg() or t.is_conj()):
            raise ValueError("%s: %s is a view PyTorch %s as it reads it (its memory holds "
                             "other values than it shows): wex moves memory, so the peer "
                             "would get the values unnegated; pass the tensor whose memory "
                             "holds the values" % (what, name, "negates" if t.is_neg()
                                                   else "conjugates"))
        out.append((name, t))
    return out


def register_module(client, named_tensors, kind=wex.SEG_CUDA_VMM, segments=None, boxes=None,
                    layout=None, rank=None):
    """Registers the memory under named tensors (e.g.
    model.named_parameters()) with a producer client, and their table.

    By default the tensors are CUDA tensors of PyTorch's caching
    allocator: only the bytes under them are registered, as `kind` (for
    each allocator segment, the tensors' spans with gaps under its chunk
    size closed: SMALL_GAP in an expandable segment of the small pool,
    MERGE_GAP elsewhere), so the gradients, optimizer state and cached
    free blocks that share an expandable segment with them are exported
    and held by wex only where they share a driver allocation (a 2 or 20
    MiB chunk) with a tensor.  With `segments`, a list of (segment id,
    address, size) the client registered already (segment_alloc,
    register_ptr, register_fd), the tensors are looked up there instead,
    on any device, and nothing more is registered.  Strided tensors (a transpose, a slice
    of a wider buffer) go with their strides; tensors whose elements
    overlap are refused; empty tensors are left out (they hold no bytes,
    and PyTorch gives them no address).  Returns the list of (segment id,
    address, size) the tensors are in.  A rank whose every tensor is
    empty (FSDP2 shards past the last chunk: 5 rows over 8 ranks) registers
    no memory and an empty table, and takes part in each version like the
    others.

    Each tensor is registered whole (start 0, extent its shape), except:
    an FSDP2 DTensor parameter (to_local, placements and device_mesh, as
    fully_shard makes; PyTorch 2.x) is its local shard, registered as rows
    fsdp_rows(...) of dim 0 of its global shape, under Shard(0) on one mesh
    dim (FSDP) and Replicate on the others (HSDP); other placements
    (Shard(1) from shard_placement_fn, FSDP over TP, Partial) are refused
    naming the parameter, and so are FSDP1's parameters (FlatParameter, and
    with use_orig_params=True the 1-D slices of it that its sharded
    parameters are between steps) and DeepSpeed ZeRO-3's (ds_id: empty
    between steps).  And boxes={name: (shape, start)} says that the
    tensor of that name is the box of the whole `shape` starting at
    `start` (a tuple, or an int: the first row of dim 0), extent its own
    shape: for trainers that shard by hand (e.g. a tensor's rows
    fsdp_rows(shape[0], n, r) on rank r).

    With layout= (a wex.Layout, e.g. wex.Layout(config, "megatron:tp=8"))
    and rank=, the tensors are that rank's physical tensors under their
    own names (linear_qkv, linear_fc1, ...): each is registered as the
    canonical pieces the layout says it holds (Megatron's interleaved
    QKV, fused gate/up, TP shards), so no conversion runs in the
    trainer.  Every physical tensor of the rank must be there, in its
    shape and dtype, contiguous, and nothing else.
    """
    named = _named(named_tensors, "register_module")
    for name, t in named:
        # (Read before detach(), which drops the attribute.)
        if getattr(t, "_fsdp_flattened", False):
            raise ValueError(
                "%s is a parameter of FSDP1 (FullyShardedDataParallel; PyTorch marks it "
                "_fsdp_flattened): sharded, it is this rank's FlatParameter or, with "
                "use_orig_params=True, a 1-D slice of it (shape %s), not a box of the whole "
                "tensor, and wex does not describe FSDP1's flat parameters: shard with FSDP2 "
                "(fully_shard, whose DTensors register as their dim-0 shards) or register a "
                "full state dict (the hf layout)" % (name, tuple(t.shape)))
        if hasattr(t, "ds_id") and hasattr(t, "ds_numel"):
            raise ValueError(
                "%s is a DeepSpeed ZeRO-3 parameter (shape %s, %d of its %d elements here): "
                "ZeRO-3 keeps this rank's partition elsewhere (ds_tensor) and the data "
                "whole only while a forward gathers it, empty between steps (it would be "
                "left out as empty), which wex does not describe: register a gathered "
                "copy (GatheredParameters), updated inside write(), or use ZeRO-1/2 or FSDP2"
                % (name, tuple(getattr(t, "ds_shape", ())), t.numel(), t.ds_numel))
    items = [(n, t.detach()) for n, t in named]
    if not items:
        raise ValueError("no tensors to register")
    if layout is not None:
        if boxes:
            raise ValueError("register_module: a layout gives every box; leave boxes out")
        pieces = {n: ps for n, _, ps in _layout_items(items, layout, rank)}
    boxed = _boxed(items, boxes)
    whole = {n: (shape, start) for n, _, shape, start in boxed}
    items = [(n, t) for n, t, _, _ in boxed]
    dev = items[0][1].device
    for name, t in items:
        if t.device != dev:
            raise ValueError("%s is on %s, the others on %s" % (name, t.device, dev))
    if segments is not None:
        ranges = sorted((int(a), int(s)) for _, a, s in segments)
        ids = {(int(a), int(s)): int(i) for i, a, s in segments}
        placed = _placed(items, ranges, "none of the segments given")
        used = {seg: ids[seg] for *_, seg in placed}
    else:
        if dev.type != "cuda":
            raise ValueError(
                "register_module: tensors must be on a CUDA device, %s is on %s%s"
                % (items[0][0], dev, "" if dev.type != "cpu" else
                   " (parameters offloaded to host memory, as by FSDP2's CPUOffloadPolicy "
                   "or DeepSpeed's offload_param, are in memory other processes cannot "
                   "map: train without parameter offload, or keep the weights in host "
                   "segments wex allocated, passed as segments=)"))
        torch.cuda.synchronize(dev)
        placed = _placed(items, _segments(dev.index),
                         "no caching-allocator segment of %s" % dev)
        used, placed = _register_ranges(client, kind, placed)
    if layout is not None:
        table = [_piece(pc, segment=used[seg], offset=p - seg[0] + pc.offset)
                 for name, t, p, _, strides, seg in placed for pc in pieces[name]]
    else:
        table = [wex.tensor(name, wex_dtype(t.dtype), whole[name][0], start=whole[name][1],
                            extent=t.shape, segment=used[seg], offset=p - seg[0],
                            strides=strides)
                 for name, t, p, _, strides, seg in placed]
    client.register_tensors(table)
    return [(sid, a, s) for (a, s), sid in used.items()]


def _register_ranges(client, kind, placed, gap=MERGE_GAP):
    """Registers plan_ranges(placed) with client.register_ptr; returns
    ({(start, size): segment id}, placed with each tensor's range in place
    of its allocator segment)."""
    ranges = plan_ranges(placed, gap)
    used = {r: client.register_ptr(kind, r[0], r[1]) for r in ranges}
    return used, [(n, t, p, nb, st, next(r for r in ranges if r[0] <= p < r[0] + r[1]))
                  for n, t, p, nb, st, _ in placed]


# Elements checked one by one below this; libwex's wex_attach refuses the
# same tensors in the same words (WEX_OVERLAP_EXACT).
_OVERLAP_EXACT = 1 << 20


def _overlaps(t):
    """Whether two elements of t share an address (a stride of 0, as
    expand() makes, or strides too small for the dims inside them):
    False at once for nested strides (each at least the extent of the
    smaller ones); otherwise every element's offset is compared (shape
    (3, 2) with strides (2, 3) does not overlap), "maybe" for a tensor of
    more than _OVERLAP_EXACT elements."""
    need, nested = 1, True
    for st, n in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if st < need:
            nested = False
            break
        need = st * n
    if nested:
        return False
    if t.numel() > _OVERLAP_EXACT:
        return "maybe"
    off = torch.zeros((), dtype=torch.int64)
    for d, (st, n) in enumerate(zip(t.stride(), t.shape)):
        shape = [1] * t.dim()
        shape[d] = n
        off = off + (torch.arange(n, dtype=torch.int64) * st).reshape(shape)
    return off.reshape(-1).unique().numel() != t.numel()


def _table_strides(name, t):
    """t's strides for a wex table entry (None when contiguous); a tensor
    whose elements overlap is refused: they cannot each hold their bytes."""
    over = _overlaps(t)
    if over:
        raise ValueError("%s has %s (strides %s for shape %s)"
                         % (name, "overlapping elements" if over is True else
                            "strides that are not nested and more than %d elements: its "
                            "elements may overlap" % _OVERLAP_EXACT,
                            tuple(t.stride()), tuple(t.shape)))
    return None if t.is_contiguous() else tuple(t.stride())


def attach_module(client, named_tensors, layout=None, rank=None):
    """Attaches a consumer's own tensors (its engine layout, same names and
    shapes as the producer's) for copies in place.  Strided tensors (views,
    slices, transposes, reserve_like's over strided producer tensors) go
    with their strides; tensors whose elements overlap are refused.  Copy
    syncs write into them, so the client keeps their storage alive until
    the next attach_module or its close(), even where the caller's tensor
    is later given other memory (those in its own reserved regions need
    no keeping).  Empty tensors are left out: they hold no bytes, and
    PyTorch gives them no address.

    With layout= (a wex.Layout, e.g. wex.Layout(config, "vllm:tp=2")) and
    rank=, the tensors are the engine's own parameters under its names
    (qkv_proj, gate_up_proj, a padded vocabulary, ...): each is attached
    as the canonical pieces the layout says it holds, and a copy sync
    fills it from the trainer's layout whatever that is.  Every physical
    tensor of the rank must be there, in its shape and dtype, contiguous,
    and nothing else."""
    items = _named(named_tensors, "attach_module")
    pieces = None
    if layout is not None:
        pieces = {n: ps for n, _, ps in _layout_items([(n, h.detach()) for n, h in items],
                                                       layout, rank)}
    table, keep = [], []
    regions = getattr(client, "_regions", ())
    for name, held in items:
        t = held.detach()
        if t.numel() == 0:
            continue
        strides = _table_strides(name, t)
        p = t.data_ptr()
        # A tensor over the client's own region keeps the client alive
        # (from_ptr's owner): the client keeping it back would be a cycle
        # through PyTorch's storage, which the garbage collector cannot see.
        # The caller's tensor, and the detached one: that keeps the
        # storage written to whatever the engine does with its Parameter
        # later (p.data = new, or a new Parameter under the name), so the
        # memory stays ours to write until the next attach or close(),
        # never another tensor's.
        if not any(a <= p < a + s for a, s in regions):
            keep.append((held, t))
        if pieces is not None:
            table.extend(_piece(pc, ptr=p + pc.offset, offset=0, segment=0)
                         for pc in pieces[name])
        else:
            table.append(wex.tensor(name, wex_dtype(t.dtype), t.shape, ptr=p,
                                    strides=strides))
    # The table and what keeps its memory, as one: another thread's
    # attach_module on this client between them would leave its table
    # attached and these buffers kept (the client's lock is reentrant:
    # attach takes it too).
    with getattr(client, "_lock", None) or contextlib.nullcontext():
        try:
            client.attach(table)
        except wex.WexError:
            raise  # (refused: libwex keeps the table attached before, and so this)
        except BaseException:
            # A signal's handler that raised as an attach that succeeded
            # returned (Ctrl-C's KeyboardInterrupt): libwex may hold this
            # table now, whose memory nothing kept.  Both kept.
            client._attached = list(getattr(client, "_attached", None) or ()) + keep
            raise
        client._attached = keep


class _CudaArray:
    def __init__(self, ptr, nbytes, owner=None):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2,
        }
        self._wex_owner = owner  # kept alive with the tensor


def _span(shape, strides):
    """Elements a box of `shape` spans with `strides` (None or all zero:
    contiguous); 0 when any dimension is empty."""
    if any(s == 0 for s in shape):
        return 0
    if not strides or not any(strides):
        n = 1
        for s in shape:
            n *= s
        return n
    if any(st < 0 for st in strides):
        raise ValueError("negative strides are not supported")
    return sum((s - 1) * st for s, st in zip(shape, strides)) + 1


def from_ptr(ptr, shape, dtype, device=None, strides=None, owner=None, _view=None):
    """A tensor over memory at ptr (no copy): device memory when device is
    a CUDA device (or None with ptr a device address), else host memory.
    Host segments on a machine with CUDA need device="cpu"; where PyTorch
    has no CUDA, None means host memory (no device address can exist).
    strides are in elements (None or all zero: contiguous).  The memory
    must outlive the tensor: pass the wex.Client as owner and the tensor
    keeps it (and so its mappings) alive, and its close() waits for the
    tensor to go (see wex.Client); the next sync of that client still
    ends what a view shows.  Device memory stays on the GPU that holds it:
    a device naming another GPU (or a default device that would move it)
    raises ValueError rather than return a copy."""
    shape = tuple(wex._int(s, "from_ptr: shape") for s in shape)
    strides = (tuple(wex._int(s, "from_ptr: strides") for s in strides)
               if strides is not None else None)
    esize = torch.empty((), dtype=dtype).element_size()
    nbytes = _span(shape, strides) * esize
    if device is None and not torch.cuda.is_available():
        device = "cpu"
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=device if device is not None else "cpu")
    # (A tensor at address 0, or at -1 as ctypes takes it (2**64-1),
    # crashed the process when read.)
    if not wex._uint(ptr, 64, "from_ptr: ptr") or ptr + nbytes > 1 << 64:
        raise ValueError("wex.torch_util.from_ptr: no memory of %d bytes at %#x" % (nbytes, ptr))
    track = getattr(owner, "_track", None)
    if device is not None and torch.device(device).type == "cpu":
        buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
        buf._wex_owner = owner  # the storage keeps buf, buf keeps the client
        raw = torch.frombuffer(buf, dtype=torch.uint8)
        holder = buf
    else:
        holder = _CudaArray(ptr, nbytes, owner)
        try:
            # No device here: PyTorch would copy to it when the memory is
            # on another GPU (checked below instead).
            raw = torch.as_tensor(holder)
        except RuntimeError as e:
            # PyTorch parses __cuda_array_interface__ with NumPy, which
            # its wheels do not require.
            if "Numpy is not available" not in str(e):
                raise
            raise RuntimeError("wex.torch_util: tensors over device memory need NumPy "
                               "(torch %s reads __cuda_array_interface__ through it)"
                               % torch.__version__) from e
        want = torch.device(device) if device is not None else None
        if want is not None and (want.type != raw.device.type or
                                 (want.index is not None and want.index != raw.device.index)):
            raise ValueError("wex.torch_util.from_ptr: the memory at %#x is on %s, not %s "
                             "(a tensor there would be a copy)" % (ptr, raw.device, want))
    if raw.data_ptr() != ptr:
        raise ValueError("wex.torch_util.from_ptr: PyTorch copied the memory at %#x to %s "
                         "(a default device?) instead of viewing it" % (ptr, raw.device))
    if track is not None:
        if _view is not None:
            track(holder, view=tuple(_view) + (ptr, nbytes, holder is not raw and
                                               isinstance(holder, ctypes.Array)))
        else:
            track(holder)
    raw = raw.view(dtype)
    if strides and any(strides):
        return raw.as_strided(shape, strides)
    return raw.view(shape)


def _strides(t):
    st = t.dims("strides")
    return st if any(st) else None


def _unique_names(table, prank):
    names = [t.name.decode() for t in table]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError("producer rank %d holds several pieces of %s: a dict by name cannot "
                         "hold them (use client.producer_tensors and client.view)"
                         % (prank, ", ".join(dup[:3])))
    return names


def _client_lock(client):
    """The lock a wex.Client's calls take turns under (reentrant), or
    nothing for another object."""
    lock = getattr(client, "_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def view_tensors(client, prank=0, device=None):
    """After a REMAP_VIEW sync: {name: tensor over the producer's memory}.
    The tensors keep the client alive; its next sync or close() ends what
    they show.  A later sync that fetches the producers' memory again
    (they registered again, a producer or wexd restarted) unmaps it: that
    sync raises WexError (ESTALE, its result as .result) naming the
    tensors, and host ones read zeros from then on instead of crashing
    the process: take them again."""
    out = {}
    # Under the client's lock until every tensor holds the client: a
    # close() or sync in another thread between a view() and its tensor
    # unmapped what the tensor was then made over (reading it crashed the
    # process), unseen by close()'s wait for live tensors and by the
    # sync's stale-view check.
    with _client_lock(client):
        table, _ = client.producer_tensors(prank)
        for name in _unique_names(table, prank):
            ptr, desc = client.view(name, prank)
            out[name] = from_ptr(ptr, desc.dims(), torch_dtype(desc.dtype_name), device,
                                 strides=_strides(desc), owner=client, _view=(name, prank))
    return out


def reserve_like(client, prank=0, device=None):
    """Reserves same-address regions for every segment of producer rank
    prank and returns {name: tensor placed there at the producer's offset}.
    Attach them (attach_module) before a REMAP_FIXED sync."""
    # (Under the client's lock, as view_tensors: a close() in another
    # thread unmapped the regions before the tensors over them held it.)
    with _client_lock(client):
        table, _ = client.producer_tensors(prank)
        _unique_names(table, prank)
        need = {}
        for t in table:
            span = _span(t.dims(), _strides(t)) * wex.DTYPE_SIZE[t.dtype_name]
            need[t.segment] = max(need.get(t.segment, 0), t.offset + span)
        base = {sid: client.reserve(prank, sid, size) for sid, size in sorted(need.items())}
        return {t.name.decode(): from_ptr(base[t.segment] + t.offset, t.dims(),
                                          torch_dtype(t.dtype_name), device,
                                          strides=_strides(t), owner=client) for t in table}
