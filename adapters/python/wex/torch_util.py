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
PYTORCH_ALLOC_CONF=expandable_segments:True (PYTORCH_CUDA_ALLOC_CONF before
torch 2.8) and call register_module the same way (its segments are
exportable; a parameter may span chunks).  Tensors over device memory
(view_tensors, reserve_like) go through __cuda_array_interface__, which
PyTorch reads with NumPy.
"""
import ctypes

import torch

import wex

_TO_WEX = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
    torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
    torch.float32: "F32", torch.int64: "I64", torch.float64: "F64",
}
for _n, _w in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64"),
               ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
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
    by a raw pointer only (pytorch#171962)."""
    if not hasattr(torch.cuda, "MemPool"):
        raise RuntimeError("torch %s has no torch.cuda.MemPool (2.5 or later)" % torch.__version__)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(wex.lib_path(), "wex_cuda_alloc",
                                                     "wex_cuda_free")
    return alloc, torch.cuda.MemPool(alloc.allocator())


def _segments(device):
    """Mapped ranges (address, size) of the caching allocator on device,
    every pool's, sorted.  An expandable segment shows as one range per
    stretch of mapped chunks."""
    out = []
    for s in torch.cuda.memory_snapshot():
        if s.get("device", device) == device and s["total_size"]:
            out.append((s["address"], s["total_size"]))
    out.sort()
    return out


def register_module(client, named_tensors, kind=wex.SEG_CUDA_VMM):
    """Registers the memory under named CUDA tensors (e.g.
    model.named_parameters()) with a producer client and their table.

    Every caching-allocator segment holding one of the tensors is
    registered whole (once); each tensor must be contiguous.  Returns the
    list of (segment id, address, size) registered.
    """
    items = [(n, t.detach()) for n, t in named_tensors]
    if not items:
        raise ValueError("no tensors to register")
    dev = items[0][1].device
    if dev.type != "cuda":
        raise ValueError("register_module: tensors must be on a CUDA device, %s is on %s"
                         % (items[0][0], dev))
    torch.cuda.synchronize(dev)
    segs = _segments(dev.index)
    used = {}
    table = []
    for name, t in items:
        if t.device != dev:
            raise ValueError("%s is on %s, the others on %s" % (name, t.device, dev))
        if not t.is_contiguous():
            raise ValueError("%s is not contiguous" % name)
        p, nb = t.data_ptr(), t.numel() * t.element_size()
        seg = next(((a, s) for a, s in segs if a <= p and p + nb <= a + s), None)
        if seg is None:
            raise ValueError("%s (0x%x, %d bytes) is in no caching-allocator segment of %s"
                             % (name, p, nb, dev))
        if seg not in used:
            used[seg] = client.register_ptr(kind, seg[0], seg[1])
        table.append(wex.tensor(name, wex_dtype(t.dtype), t.shape, segment=used[seg],
                                offset=p - seg[0]))
    client.register_tensors(table)
    return [(sid, a, s) for (a, s), sid in used.items()]


def attach_module(client, named_tensors):
    """Attaches a consumer's own tensors (its engine layout, same names and
    shapes as the producer's) for copies in place."""
    table = []
    for name, t in named_tensors:
        t = t.detach()
        if not t.is_contiguous():
            raise ValueError("%s is not contiguous" % name)
        table.append(wex.tensor(name, wex_dtype(t.dtype), t.shape, ptr=t.data_ptr()))
    client.attach(table)


class _CudaArray:
    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2,
        }


def from_ptr(ptr, shape, dtype, device=None):
    """A tensor over memory at ptr (no copy): device memory when device is
    a CUDA device (or None with ptr a device address), else host memory.
    The memory must outlive the tensor (the client's mapping)."""
    shape = tuple(int(s) for s in shape)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if device is not None and torch.device(device).type == "cpu":
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=torch.uint8)
    else:
        try:
            raw = torch.as_tensor(_CudaArray(ptr, nbytes), device=device)
        except RuntimeError as e:
            # PyTorch parses __cuda_array_interface__ with NumPy, which
            # its wheels do not require.
            if "Numpy is not available" not in str(e):
                raise
            raise RuntimeError("wex.torch_util: tensors over device memory need NumPy "
                               "(torch %s reads __cuda_array_interface__ through it)"
                               % torch.__version__) from e
    return raw.view(dtype).view(shape)


def view_tensors(client, prank=0, device=None):
    """After a REMAP_VIEW sync: {name: tensor over the producer's memory}."""
    out = {}
    table, _ = client.producer_tensors(prank)
    for t in table:
        name = t.name.decode()
        ptr, desc = client.view(name, prank)
        out[name] = from_ptr(ptr, desc.dims(), torch_dtype(desc.dtype_name), device)
    return out


def reserve_like(client, prank=0, device=None):
    """Reserves same-address regions for every segment of producer rank
    prank and returns {name: tensor placed there at the producer's offset}.
    Attach them (attach_module) before a REMAP_FIXED sync."""
    table, _ = client.producer_tensors(prank)
    need = {}
    for t in table:
        need[t.segment] = max(need.get(t.segment, 0), t.offset + t.nbytes())
    base = {sid: client.reserve(prank, sid, size) for sid, size in sorted(need.items())}
    return {t.name.decode(): from_ptr(base[t.segment] + t.offset, t.dims(),
                                      torch_dtype(t.dtype_name), device) for t in table}
