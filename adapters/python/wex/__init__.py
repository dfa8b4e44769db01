# SPDX-License-Identifier: MIT
"""wex - Python glue over libwex's public C API (src/include/wex.h), by ctypes.

Nothing here talks to wexd itself: every call goes through libwex, so the
Python side gets the same validation, errors and reconnection as C clients.
The library is found through $WEX_LIB (a path), else the system's
``libwex.so.0`` (``cmake --install``).

    import wex
    with wex.Client(wex.ROLE_PRODUCER, model="policy", rank=0, world_size=1) as c:
        seg, ptr = c.segment_alloc(wex.SEG_HOST, 1 << 20)
        c.register_tensors([wex.tensor("w", "BF16", (512, 1024), segment=seg)])
        c.begin_write(1)
        ...                                  # write the bytes at ptr
        c.publish(1)

Errors raise WexError, whose ``code`` is the positive errno (or WEX_E*)
value and whose text is libwex's wex_last_error() of the failing call.
Arguments are checked before any call, naming the one at fault: a wrong
type (a str, float or bool, NumPy's and PyTorch's too, where an int is
wanted; a tensor or array where an address is: its data_ptr() is) raises
TypeError, a value its C type cannot hold (a negative size, a version
past 64 bits, a NUL in a name, a str name that is not UTF-8) ValueError.
PyTorch helpers (pluggable allocator, tensors over wex memory) live in
``wex.torch_util``.
"""
import ctypes
import ctypes.util
import errno
import json
import operator
import os
import threading
import time
import warnings
import weakref

NAME_MAX = 160
MAX_DIMS = 8

ROLE_PRODUCER, ROLE_CONSUMER, ROLE_ADMIN = 1, 2, 3
SEG_HOST, SEG_CUDA_VMM, SEG_CUDA_IPC, SEG_HOST_PINNED = 1, 2, 3, 4
SYNC_COPY, SYNC_REMAP_VIEW, SYNC_REMAP_FIXED = 1, 2, 3
SYNC_VERIFY = 1 << 8  # or'ed into SYNC_COPY / SYNC_REMAP_FIXED: compare every byte
_SEG_KINDS = "wex.SEG_HOST, wex.SEG_HOST_PINNED, wex.SEG_CUDA_VMM or wex.SEG_CUDA_IPC"
_NO_SEGMENT = 0xFFFFFFFF  # (a segment id no call returned)
_SYNC_MODES = "wex.SYNC_COPY, wex.SYNC_REMAP_VIEW or wex.SYNC_REMAP_FIXED"

ERRNO_BASE = 4096
(EPROTO_VERSION, ENOCUDA, ELAYOUT, EDIRTY, ENOPUBLISHED, EDAEMON, ENOMODEL,
 EREMOTE, EVERIFY) = range(ERRNO_BASE, ERRNO_BASE + 9)

# enum wex_dtype, in the header's order; names are safetensors'.
DTYPES = ("INVALID", "BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32",
          "U32", "F32", "I64", "U64", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0")
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
              "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}

_F_SOCKET, _F_ROLE, _F_MODEL, _F_GROUP, _F_RANK = 1, 2, 4, 8, 16
_F_TIMEOUT, _F_COPY_THREADS, _F_DEVICE = 32, 64, 128
_F_FLAGS = 256
CLIENT_NO_WATCH = 1  # enum wex_client_flag
CLIENT_EINTR = 2


class WexError(OSError):
    """A libwex call failed: ``code`` is the positive error number."""

    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code


def _cstr(val, what, path=False, check=True):
    """val encoded for a C string parameter, or ValueError: ctypes would
    pass a NUL-containing value cut at its first NUL ("pol\\0icy" as
    "pol"), so a different name or path than the caller gave."""
    if path:
        try:
            b = os.fsencode(val)
        except TypeError:
            raise TypeError("%s must be str, bytes or os.PathLike, not %s"
                            % (what, type(val).__name__)) from None
    elif isinstance(val, (bytes, bytearray)):
        # (As tensor() takes them: a Tensor's name is bytes.)
        b = bytes(val)
    elif isinstance(val, str):
        # (A name os.fsdecode made of bytes that are not UTF-8 holds
        # surrogates: UnicodeEncodeError, naming no parameter.)
        try:
            b = val.encode()
        except UnicodeEncodeError as e:
            raise ValueError("%s is not UTF-8 text (%s at %d): %r"
                             % (what, e.reason, e.start, val)) from None
    else:
        raise TypeError("%s must be str or bytes, not %s" % (what, _kind(val)))
    if check and b"\0" in b:
        raise ValueError("%s contains a NUL byte: %r" % (what, val))
    return b


def _int(val, what, accepted=None):
    """val as a Python int, or TypeError naming `what`: int() would take
    1.5 as 1 and "7" or b"7" as 7, ctypes a bool as 0 or 1 and a float
    or a str as ctypes.ArgumentError ("argument 2: wrong type", naming
    nothing).  Anything with __index__ (a NumPy integer) is an int, but
    NumPy's and PyTorch's bools (np.True_ and torch.tensor(True) were 1)
    and what refuses __index__ (a float tensor, an array of more than one
    element: their own TypeError, naming nothing)."""
    if not (isinstance(val, bool) or not hasattr(type(val), "__index__") or
            str(getattr(val, "dtype", "")) in ("bool", "torch.bool")):
        try:
            return operator.index(val)
        except TypeError:
            pass
    raise TypeError("%s must be an int%s, not %s" % (
        what, " (%s)" % accepted if accepted else "", _kind(val)))


def _kind(val):
    """val's type for a message: one not built in with its package's name
    (a torch.Tensor is no wex.Tensor), a tensor's or array's with its
    dtype and shape."""
    t = type(val)
    name = t.__name__ if t.__module__ == "builtins" else "%s.%s" % (
        t.__module__.split(".")[0], t.__name__)
    if hasattr(val, "dtype") and hasattr(val, "shape"):
        return "%s (%s, shape %s)" % (name, val.dtype, tuple(val.shape))
    return name


def _uint(val, bits, what):
    """val as an unsigned integer of `bits` bits, or ValueError (ctypes
    would wrap -1 to the largest value, 2**32 to 0); TypeError as _int."""
    v = _int(val, what)
    if not 0 <= v < 1 << bits:
        raise ValueError("%s must be in 0..2**%d-1, not %r" % (what, bits, val))
    return v


def _c_int(val, what, accepted=None):
    """val for a C int parameter (an enum, a device ordinal, an fd):
    ctypes would pass 2**32 + 1 as 1."""
    v = _int(val, what, accepted)
    if not -(1 << 31) <= v < 1 << 31:
        raise ValueError("%s must be a C int (-2**31..2**31-1), not %r" % (what, val))
    return v


def _ptr(val, what):
    """val for a pointer parameter: an address (int) or None.  ctypes
    would pass a str or bytes as the address of Python's own copy of it,
    -1 as 2**64-1 and 2**64 as NULL.  A tensor or array is refused: a
    one-element integer one was taken as the address its value is, not
    as its memory's (data_ptr())."""
    if val is None:
        return None
    # (A NumPy integer is an address: it has __array_interface__ too,
    # but no .ctypes.)
    if (hasattr(val, "data_ptr") or hasattr(val, "__cuda_array_interface__") or
            hasattr(val, "__array_interface__") and hasattr(val, "ctypes")):
        raise TypeError("%s must be an address (an int: tensor.data_ptr(), "
                        "array.ctypes.data), not %s" % (what, _kind(val)))
    return _uint(val, 64, what) or None


def _tensors(tensors, what):
    """A ctypes array of the wex.Tensor items of `tensors`, or TypeError
    naming the first other one (ctypes would build a Tensor from a tuple's
    items as its fields, and take a str as no tensors)."""
    # (A torch tensor or an array is iterable: its rows were the items.)
    if (isinstance(tensors, (str, bytes, bytearray)) or not hasattr(tensors, "__iter__") or
            hasattr(tensors, "dtype")):
        raise TypeError("%s takes a list of wex.Tensor (wex.tensor(...)), not %s"
                        % (what, _kind(tensors)))
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError("%s: item %d is %s, not a wex.Tensor (wex.tensor(...))"
                            % (what, i, _kind(t)))
    return (Tensor * len(tensors))(*tensors)


class Tensor(ctypes.Structure):
    """struct wex_tensor."""
    _fields_ = [
        ("name", ctypes.c_char * NAME_MAX),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * MAX_DIMS),
        ("start", ctypes.c_uint64 * MAX_DIMS),
        ("extent", ctypes.c_uint64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
        ("segment", ctypes.c_uint32),
        ("offset", ctypes.c_uint64),
        ("ptr", ctypes.c_void_p),
    ]

    @property
    def dtype_name(self):
        return DTYPES[self.dtype] if 0 <= self.dtype < len(DTYPES) else "INVALID"

    def dims(self, field="extent"):
        return tuple(getattr(self, field)[i] for i in range(self.ndim))

    def nbytes(self):
        n = DTYPE_SIZE.get(self.dtype_name, 0)
        for e in self.dims():
            n *= e
        return n

    def __repr__(self):
        return "Tensor(%r, %s, shape=%s, start=%s, extent=%s, seg=%d, off=%d)" % (
            self.name.decode(errors="replace"), self.dtype_name, self.dims("shape"),
            self.dims("start"), self.dims(), self.segment, self.offset)


class SyncResult(ctypes.Structure):
    """struct wex_sync_result."""
    _fields_ = [
        ("version", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("ops", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("changed", ctypes.c_int),
        ("waited", ctypes.c_double),
        ("verified", ctypes.c_uint64),
        ("verify_seconds", ctypes.c_double),
    ]

    def as_dict(self):
        return {f: getattr(self, f) for f, _ in self._fields_}


class LayoutTensor(ctypes.Structure):
    """struct wex_layout_tensor: one physical tensor of a layout's rank."""
    _fields_ = [
        ("name", ctypes.c_char * NAME_MAX),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * MAX_DIMS),
        ("nbytes", ctypes.c_uint64),
        ("first", ctypes.c_size_t),
        ("npieces", ctypes.c_size_t),
    ]


class _Handle:
    """What owns a libwex handle that its close() frees once: a copy
    (copy.copy's holds the same handle object) would free it again, or
    use it freed (glibc aborts: double free); pickle and deepcopy failed
    naming some ctypes object.  Open another instead."""

    def __reduce_ex__(self, protocol):
        raise TypeError("a wex.%s owns a libwex handle: it cannot be copied or "
                        "pickled (open another)" % type(self).__name__)


# Every Layout of this process (see _after_fork).
_layouts = weakref.WeakSet()


class Layout(_Handle):
    """An engine or trainer layout of a model (wex_layout_open): which
    physical tensors each rank holds, and which canonical boxes each holds
    (its pieces).  ``config`` is the model's config.json, ``spec`` a layout
    as ``wexctl plan`` takes it ("vllm:tp=2", "megatron:tp=2,pp=2", "hf",
    "fsdp:fsdp=8"; ``wexctl plan --help`` lists them).  Pure computation
    after the files are read; raises WexError with the reason."""

    def __init__(self, config, spec, adapters=None):
        L = lib()
        self._lib = L
        self.handle = ctypes.c_void_p()
        # The arrays wex_layout_rank returns live until its next call:
        # one thread's call and another's copies take turns.  (Made
        # before the open, as spec: a signal's handler that raises as
        # the open returns leaves __del__ to close what it wrote into
        # self.handle, and close() needs the lock.)
        self._lock = threading.Lock()
        _layouts.add(self)  # (its lock is made anew in a forked child)
        # (As str, given as bytes too: it names the layout in messages
        # and in EngineRank.describe(), which is JSON.)
        self.spec = (spec.decode(errors="replace") if isinstance(spec, (bytes, bytearray))
                     else spec)
        world = ctypes.c_uint32()
        err = ctypes.c_void_p()
        args = (_cstr(config, "config", True), _cstr(spec, "layout spec"),
                _cstr(adapters, "adapters", True) if adapters else None)
        try:
            ret = L.wex_layout_open(*args, ctypes.byref(self.handle), ctypes.byref(world),
                                    ctypes.byref(err))
            if ret < 0:
                # (The message may hold a path's undecodable bytes.)
                why = (ctypes.string_at(err.value).decode(errors="replace") if err.value
                       else strerror(ret))
                raise WexError(-ret, "layout %s of %s: %s"
                               % (self.spec, args[0].decode(errors="replace"), why))
        finally:
            if err.value:
                L.wex_free(err)
        self.world = world.value

    def rank(self, rank):
        with self._lock:
            if not self.handle:
                raise WexError(errno.EBADF, "layout %s is closed" % self.spec)
            return self._rank(rank)

    def _rank(self, rank):
        """[(name, dtype name, shape, [Tensor pieces])] of rank's physical
        tensors, in the layout's order.  A piece names a canonical tensor
        and the box of it that the physical tensor holds, at ``offset``
        bytes from the physical tensor's start with ``strides`` (elements);
        the pieces are copies, free to change."""
        phys, nphys = ctypes.POINTER(LayoutTensor)(), ctypes.c_size_t()
        pieces, npieces = ctypes.POINTER(Tensor)(), ctypes.c_size_t()
        ret = self._lib.wex_layout_rank(self.handle, _uint(rank, 32, "rank"), ctypes.byref(phys),
                                        ctypes.byref(nphys), ctypes.byref(pieces),
                                        ctypes.byref(npieces))
        if ret < 0:
            raise WexError(-ret, "layout %s, rank %d: %s"
                           % (self.spec, rank, self._lib.wex_layout_error(self.handle).decode()
                              or strerror(ret)))
        out = []
        for i in range(nphys.value):
            p = phys[i]
            own = []
            for k in range(p.first, p.first + p.npieces):
                own.append(Tensor.from_buffer_copy(pieces[k]))
            out.append((p.name.decode(), DTYPES[p.dtype] if 0 <= p.dtype < len(DTYPES)
                        else "INVALID", tuple(p.shape[d] for d in range(p.ndim)), own))
        return out

    def close(self):
        # After a rank() running in another thread (the C layout and the
        # arrays it returned are freed here).
        with self._lock:
            if self.handle:
                # (Cleared first, as Client's: a KeyboardInterrupt raised
                # as the close returns must not leave it to close again.)
                h, self.handle = self.handle, ctypes.c_void_p()
                self._lib.wex_layout_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class _Params(ctypes.Structure):
    """struct wex_client_params."""
    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("socket", ctypes.c_char_p),
        ("role", ctypes.c_int),
        ("model", ctypes.c_char_p),
        ("group", ctypes.c_char_p),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("timeout_ms", ctypes.c_uint32),
        ("copy_threads", ctypes.c_uint32),
        ("device", ctypes.c_int),
        ("flags", ctypes.c_uint32),
    ]


def tensor(name, dtype, shape, *, start=None, extent=None, strides=None,
           segment=0, offset=0, ptr=None):
    """A Tensor for register_tensors (segment, offset) or attach (ptr).

    ``dtype`` is a safetensors name ("BF16") or an enum value; ``start`` and
    ``extent`` give the box this piece holds of the canonical tensor of
    full shape ``shape`` (default: all of it); ``strides`` are in elements.
    """
    t = Tensor()
    # (bytes(5) would be five NULs, bytes([1]) the name "\\x01".)
    raw = _cstr(name, "tensor name", check=False)
    if not raw or len(raw) >= NAME_MAX or b"\0" in raw:
        raise ValueError("tensor name must be 1..%d bytes without NUL: %r"
                         % (NAME_MAX - 1, name))
    t.name = raw
    name = raw.decode(errors="replace")  # (for the messages below)
    if isinstance(dtype, str):
        if dtype not in DTYPE_SIZE:
            raise ValueError("unknown dtype %r (one of %s)" % (dtype, ", ".join(DTYPE_SIZE)))
        t.dtype = DTYPES.index(dtype)
    else:
        # (ctypes would cut a wider value to 32 bits: 2**32 + 7 is BF16;
        # int() would read b"1" and 1.5 as BOOL.)
        try:
            v = _int(dtype, "dtype")
        except TypeError:
            raise TypeError("%s: dtype must be a safetensors name (%s) or an enum value "
                            "(int), not %s %.40r" % (name, ", ".join(DTYPE_SIZE),
                                                     _kind(dtype), dtype)) from None
        if not -(1 << 31) <= v < 1 << 31:
            raise ValueError("dtype %r is not an int32 enum value" % (dtype,))
        t.dtype = v

    def dims(val, what):
        # (tuple("12") would be two dimensions, tuple(b"1") one of 49.)
        if isinstance(val, (str, bytes, bytearray)) or not hasattr(val, "__iter__"):
            raise TypeError("%s: %s must be a sequence of ints, not %s"
                            % (name, what, _kind(val)))
        return tuple(val)
    shape = dims(shape, "shape")
    if len(shape) > MAX_DIMS:
        raise ValueError("%s: %d dims, at most %d" % (name, len(shape), MAX_DIMS))
    start = dims(start, "start") if start is not None else (0,) * len(shape)
    extent = dims(extent, "extent") if extent is not None else shape
    if len(start) != len(shape) or len(extent) != len(shape):
        raise ValueError("%s: start/extent must have %d dims" % (name, len(shape)))
    t.ndim = len(shape)
    for i, s in enumerate(shape):
        t.shape[i] = _uint(s, 64, "%s: shape" % name)
        t.start[i] = _uint(start[i], 64, "%s: start" % name)
        t.extent[i] = _uint(extent[i], 64, "%s: extent" % name)
    if strides is not None:
        strides = dims(strides, "strides")
        if len(strides) != len(shape):
            raise ValueError("%s: strides must have %d dims" % (name, len(shape)))
        for i, s in enumerate(strides):
            v = _int(s, "%s: stride" % name)
            if not -(1 << 63) <= v < 1 << 63:
                raise ValueError("%s: stride %r out of range" % (name, s))
            t.strides[i] = v
    t.segment = _uint(segment, 32, "%s: segment" % name)
    t.offset = _uint(offset, 64, "%s: offset" % name)
    t.ptr = _ptr(ptr, "%s: ptr" % name)
    return t


_lib = None


def lib():
    """The loaded libwex (ctypes.CDLL), loading it on first use."""
    global _lib
    if _lib is not None:
        return _lib
    path = os.environ.get("WEX_LIB") or ctypes.util.find_library("wex") or "libwex.so.0"
    try:
        L = ctypes.CDLL(path)
    except OSError as e:
        raise WexError(errno.ENOENT, "cannot load libwex (%s): %s; set WEX_LIB to "
                       "the built libwex.so" % (path, e)) from None
    P, I, U32, U64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    sig = {
        "wex_strerror": (ctypes.c_char_p, [I]),
        "wex_free": (None, [P]),
        "wex_client_open": (I, [ctypes.POINTER(_Params), ctypes.POINTER(P)]),
        "wex_client_close": (None, [P]),
        "wex_segment_alloc": (I, [P, I, I, U64, ctypes.POINTER(U32), ctypes.POINTER(P)]),
        "wex_segment_register_fd": (I, [P, I, P, U64, ctypes.POINTER(U32)]),
        "wex_segment_register_ptr": (I, [P, I, P, U64, ctypes.POINTER(U32)]),
        "wex_register_tensors": (I, [P, ctypes.POINTER(Tensor), ctypes.c_size_t]),
        "wex_begin_write": (I, [P, U64, U32]),
        "wex_publish": (I, [P, U64]),
        "wex_attach": (I, [P, ctypes.POINTER(Tensor), ctypes.c_size_t]),
        "wex_reserve": (I, [P, U32, U32, U64, ctypes.POINTER(P)]),
        "wex_sync": (I, [P, I, U64, U32, ctypes.POINTER(SyncResult)]),
        "wex_release": (I, [P]),
        "wex_cancel": (I, [P]),
        "wex_is_dirty": (I, [P]),
        "wex_released": (I, [P, U64, ctypes.POINTER(U64)]),
        "wex_view": (I, [P, U32, ctypes.c_char_p, ctypes.POINTER(P), ctypes.POINTER(Tensor)]),
        "wex_producer_tensors": (I, [P, U32, ctypes.POINTER(ctypes.POINTER(Tensor)),
                                     ctypes.POINTER(ctypes.c_size_t)]),
        "wex_request": (I, [P, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(P)]),
        "wex_last_error": (ctypes.c_char_p, [P]),
        "wex_layout_open": (I, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                ctypes.POINTER(P), ctypes.POINTER(U32), ctypes.POINTER(P)]),
        "wex_layout_rank": (I, [P, U32, ctypes.POINTER(ctypes.POINTER(LayoutTensor)),
                                ctypes.POINTER(ctypes.c_size_t),
                                ctypes.POINTER(ctypes.POINTER(Tensor)),
                                ctypes.POINTER(ctypes.c_size_t)]),
        "wex_layout_error": (ctypes.c_char_p, [P]),
        "wex_layout_close": (None, [P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(L, name)
        f.restype, f.argtypes = res, args
    # The CUDA entry points exist only in builds made with the CUDA headers.
    if hasattr(L, "wex_cuda_alloc"):
        L.wex_cuda_alloc.restype = P
        L.wex_cuda_alloc.argtypes = [ctypes.c_ssize_t, I, P]
        L.wex_cuda_free.restype = None
        L.wex_cuda_free.argtypes = [P, ctypes.c_ssize_t, I, P]
    if hasattr(L, "wex_cuda_malloc"):
        L.wex_cuda_malloc.restype = I
        L.wex_cuda_malloc.argtypes = [ctypes.c_size_t, I, ctypes.POINTER(P)]
    L._path = path
    _lib = L
    return L


def released(ptr, nbytes):
    """The first address in [ptr, ptr + nbytes) where the CUDA driver
    loaded in this process knows a reserved range with nothing mapped (GPU
    memory an engine released keeping its addresses: vLLM's sleep mode,
    torch_memory_saver's pause), or None (mapped, host memory, or no
    driver loaded: wex_released).  WexError (EINVAL) for ptr 0 or a
    range past the end of the address space."""
    at = ctypes.c_uint64()
    ret = lib().wex_released(_ptr(ptr, "ptr"), _uint(nbytes, 64, "nbytes"),
                             ctypes.byref(at))
    if ret < 0:
        raise WexError(-ret, "released: %s" % strerror(ret))
    return at.value if ret == 1 else None


_libc = None


def _fill_unmapped(obj, ptr, nbytes):
    """Private read-only zero pages at the pages of [ptr, ptr + nbytes)
    that nothing is mapped at any more, where a tensor over them (held by
    obj) would otherwise crash the process; unmapped once obj is gone.
    (Never over a mapping: MAP_FIXED_NOREPLACE.)"""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.mmap.restype = ctypes.c_void_p
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    pg = os.sysconf("SC_PAGE_SIZE")
    a = ptr & ~(pg - 1)
    end = (ptr + nbytes + pg - 1) & ~(pg - 1)
    mapped = []
    while a < end:
        # msync answers ENOMEM for a page with nothing mapped.
        if _libc.msync(a, pg, 1) < 0 and ctypes.get_errno() == errno.ENOMEM:
            # PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE
            got = _libc.mmap(a, pg, 1, 0x02 | 0x20 | 0x100000, -1, 0)
            if got == a:
                mapped.append(a)
            elif got not in (None, ctypes.c_void_p(-1).value):
                _libc.munmap(got, pg)  # (a kernel without NOREPLACE: elsewhere)
        a += pg
    if mapped:
        weakref.finalize(obj, lambda: [_libc.munmap(p, pg) for p in mapped])


def lib_path():
    """The file libwex was loaded from (for CUDAPluggableAllocator)."""
    return lib()._path


def strerror(code):
    return lib().wex_strerror(-abs(_c_int(code, "code"))).decode()


def cuda_alloc(size, device=0):
    """wex_cuda_alloc: exportable VMM memory; returns the device address.
    Raises WexError: ENOCUDA without a CUDA driver or device, ENOMEM when
    the device is out of memory, ... (wex_cuda_malloc's error)."""
    L = lib()
    if not hasattr(L, "wex_cuda_alloc"):
        raise WexError(ENOCUDA, "libwex was built without the CUDA headers")
    size = _uint(size, 63, "size")
    device = _c_int(device, "device")
    if not hasattr(L, "wex_cuda_malloc"):
        # An older libwex: NULL says nothing more.
        p = L.wex_cuda_alloc(size, device, None)
        if not p:
            raise WexError(errno.ENOMEM, "wex_cuda_alloc(%d, device %d) failed (see stderr)"
                           % (size, device))
        return p
    p = ctypes.c_void_p()
    try:
        ret = L.wex_cuda_malloc(size, device, ctypes.byref(p))
    except BaseException:
        # A signal's handler (Ctrl-C) raised as the allocation returned:
        # nothing else would ever free it.
        if p.value:
            L.wex_cuda_free(p.value, size, device, None)
        raise
    if ret < 0:
        why = strerror(ret)
        if -ret == ENOCUDA:
            why = "no CUDA driver or device (libwex's log on stderr says which)"
        raise WexError(-ret, "wex_cuda_alloc(%d bytes, device %d): %s" % (size, device, why))
    return p.value


def cuda_free(ptr, size, device=0):
    lib().wex_cuda_free(_ptr(ptr, "ptr"), _uint(size, 63, "size"), _c_int(device, "device"),
                        None)


# Every Client of this process (see _after_fork).
_clients = weakref.WeakSet()


def _after_fork():
    """In a forked child: the locks of each client made anew.  A thread of
    the parent that was in a call of a client (a sync waiting for a
    version) held them, and no thread of the child will release them: the
    child's calls on its copy would wait for ever instead of refusing
    (WexError ECHILD), and its close() too instead of freeing the copy."""
    for c in list(_clients):
        c._lock = threading.RLock()
        c._handle_lock = threading.RLock()
        c._live_lock = threading.RLock()
        c._in_cancel = threading.local()
    # (So is a Layout's: a rank() of the parent's other thread held it.)
    for lay in list(_layouts):
        lay._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Client(_Handle):
    """A libwex client (wex_client_open .. wex_client_close).

    One client may be used from several threads: its calls take turns (a
    lock; libwex needs them one at a time).  Tensors over its memory
    (torch_util.from_ptr with owner=client: view_tensors, reserve_like)
    keep it open: close() while any is alive closes it once the last is
    gone, with a warning (close(force=True) closes at once, and reading
    such a tensor afterwards crashes the process).
    """

    def __init__(self, role, model=None, *, group=None, rank=0, world_size=1,
                 socket=None, timeout_ms=None, copy_threads=None, device=None,
                 watch=True):
        """watch=False: a producer opens without its watch (the thread that
        reconnects as soon as wexd is back after a restart, between this
        producer's calls, and keeps its published version visible)."""
        self._h = None
        self._lock = threading.RLock()
        # cancel() does not take _lock (the call it cancels holds it):
        # this one keeps the handle from being closed under it.
        # (Reentrant: a signal's handler that calls cancel() may run
        # while this thread holds it, in close() or last_error.)
        self._handle_lock = threading.RLock()
        # Per thread: in cancel() (about to hold _handle_lock, or holding it).
        self._in_cancel = threading.local()
        self._cancels = 0  # cancel() calls
        # _live is counted under a lock of its own: a tensor's finalizer
        # (the garbage collector, in any thread) never waits for a call.
        # (Reentrant: a signal handler's finalizer may run inside a block.)
        self._live_lock = threading.RLock()
        self._live = 0            # tensors over this client's memory alive
        self._close_pending = False
        L = lib()
        # What wex_client_open refuses, said here in Python's terms
        # before anything is opened (and a NUL, which C would cut at).
        why = None
        # (Types first, naming the argument: a bool was taken as 0 or 1
        # (role=True a producer), 1.5 as 1, and "1" raised a bare
        # comparison's TypeError.)
        rank, world_size = _int(rank, "rank"), _int(world_size, "world_size")
        if device is not None:
            device = _int(device, "device")
        try:
            role = _int(role, "role")
        except TypeError:
            pass  # (said below, as a value out of range is)
        if type(role) is not int or role not in (ROLE_PRODUCER, ROLE_CONSUMER, ROLE_ADMIN):
            why = "role must be ROLE_PRODUCER, ROLE_CONSUMER or ROLE_ADMIN, not %r" % (role,)
        elif role != ROLE_ADMIN and not model:
            why = "a producer or consumer needs a model name"
        elif not 0 <= world_size < 1 << 32:  # (ctypes would cut it to 32 bits)
            why = "world_size must be in 0..2**32-1, not %r" % (world_size,)
        elif not 0 <= rank < max(world_size, 1):
            why = "rank %d is not in 0..world_size-1 (world_size %d)" % (rank, world_size)
        elif device is not None and device < 0:
            why = "device must be a CUDA ordinal (0 or more), not %d" % device
        enc = {}
        for what, val, limit in (("model", model, NAME_MAX), ("group", group, NAME_MAX),
                                 ("socket", socket, 256)):
            if val is None:
                continue
            # (The socket is a path: str, bytes or os.PathLike, encoded as
            # the file system's names are.)
            try:
                b = _cstr(val, what, path=what == "socket", check=False)
            except ValueError as e:
                # (Not UTF-8: refused as libwex refuses such bytes.)
                why = why or str(e)
                continue
            enc[what] = b
            if why is None and len(b) >= limit:
                why = "%s must be under %d bytes: %r" % (what, limit, val)
            if why is None and b"\0" in b:
                why = "%s contains a NUL byte: %r" % (what, val)
        if why is not None:
            raise WexError(errno.EINVAL, "wex_client_open: %s" % why)
        p = _Params()
        p.field_mask = _F_ROLE | _F_RANK | _F_FLAGS
        # A signal ends a wait for wexd (-EINTR): Python runs its handler
        # once the call returns (see _call_wait), not a timeout later.
        p.flags = CLIENT_EINTR | (0 if watch else CLIENT_NO_WATCH)
        p.role = role
        p.rank = rank
        p.world_size = world_size
        self._keep = []  # the encoded strings must outlive the call
        for flag, field, val in ((_F_SOCKET, "socket", socket), (_F_MODEL, "model", model),
                                 (_F_GROUP, "group", group)):
            if val is not None:
                b = enc[field]
                self._keep.append(b)
                setattr(p, field, b)
                p.field_mask |= flag
        for flag, field, val in ((_F_TIMEOUT, "timeout_ms", timeout_ms),
                                 (_F_COPY_THREADS, "copy_threads", copy_threads),
                                 (_F_DEVICE, "device", device)):
            if val is not None:
                setattr(p, field, _uint(val, 31 if field == "device" else 32, field))
                p.field_mask |= flag
        self._lib = L
        self._timeout_ms = p.timeout_ms if timeout_ms is not None else None
        self._regions = []  # (address, size) of what reserve() returned
        # Segments whose call succeeded as a signal's handler raised
        # (Ctrl-C's KeyboardInterrupt as the C call returned, before
        # Python had the id): {(call, its arguments): what it returns},
        # returned by the same call again instead of a second segment.
        self._unclaimed = {}
        # The version of a publish that raised other than as a WexError
        # (Ctrl-C as it returned): libwex may have published it.
        self._pub_raised = None
        self._attached = []  # what holds the attached buffers (torch_util.attach_module)
        # View tensors alive (torch_util.view_tensors): [weakref to what
        # holds one's memory, name, prank, address, bytes, host]; a sync
        # that fetched again unmaps what they show (see _stale_views).
        self._views = []
        _clients.add(self)  # (its locks are made anew in a forked child)
        h = ctypes.c_void_p()
        # -EINTR: a signal, and then 3 s without wexd's answer to the
        # hello (a hung wexd); Python ran the handler as the call
        # returned, and where it raised nothing the open is tried again,
        # up to the client's timeout.
        end = time.monotonic() + (timeout_ms or 30000) / 1000.0
        try:
            while True:
                ret = L.wex_client_open(ctypes.byref(p), ctypes.byref(h))
                if ret != -errno.EINTR or time.monotonic() >= end:
                    break
            if ret >= 0:
                self._h = h
                # (What it was opened as: wex.trainer.TrainerRank checks a
                # client it is given against its own model and rank.)
                self._opened = (role, model, rank, world_size)
        except BaseException:
            # A handler's exception (Ctrl-C's KeyboardInterrupt) raised as
            # an open that took its signal succeeded after all (wexd
            # answered within 3 s): that client, holding its rank, would
            # be left open with nothing to close it.
            if h.value:
                self._h = None
                L.wex_client_close(h)
            raise
        if ret < 0:
            # (wex_last_error(NULL): why this thread's last open failed.)
            why = L.wex_last_error(None).decode(errors="replace")
            raise WexError(-ret, "wex_client_open: %s" % (why or L.wex_strerror(ret).decode()))

    def _check(self, ret, what):
        if ret < 0:
            raise WexError(-ret, "%s: %s" % (what, self.last_error or strerror(ret)))
        return ret

    def _call(self, what, fn, *args):
        """fn(handle, *args) under the client's lock, checked.  -EINTR (a
        signal, then 3 s without wexd's answer to the hello of a
        reconnect, or to a registration: a hung wexd, nothing of the call
        kept): Python ran the handler as the call returned, and where it
        raised nothing the call is made again, up to the client's
        timeout, unless cancel() was called meanwhile (WexError
        ECANCELED)."""
        with self._lock:
            end = time.monotonic() + (self._timeout_ms or 30000) / 1000.0
            cancels = self._cancels
            while True:
                ret = fn(self.handle, *args)
                if ret != -errno.EINTR or time.monotonic() >= end:
                    return self._check(ret, what)
                # (A handler that called cancel(): as in _call_wait.)
                if self._cancels != cancels:
                    raise WexError(errno.ECANCELED, "%s: cancelled (cancel()) while a signal "
                                   "interrupted it" % what)

    def _call_wait(self, what, fn, timeout_ms, args):
        """_call of a call that waits for wexd (sync, begin_write):
        fn(handle, *args(timeout_ms)).  A signal during that wait ends
        the call (-EINTR, CLIENT_EINTR) so that Python runs the signal's
        handler now, not at the wait's timeout: Ctrl-C's
        KeyboardInterrupt, or any exception a handler raises, propagates
        from here.  Where none raises, the call is made again with what
        is left of timeout_ms (the whole default again when 0), unless
        cancel() was called meanwhile (WexError ECANCELED)."""
        # (0: the client's timeout_ms when given, as libwex reads 0; the
        # re-calls after a signal then get what is left of it, not all of
        # it again.)
        budget = timeout_ms or getattr(self, "_timeout_ms", None) or 0
        end = time.monotonic() + budget / 1000.0 if budget else None
        with self._lock:
            cancels = self._cancels
            while True:
                ret = fn(self.handle, *args(timeout_ms))
                # (Python ran the handler as the call returned.)
                if ret != -errno.EINTR:
                    return self._check(ret, what)
                if self._cancels != cancels:
                    raise WexError(errno.ECANCELED, "%s: cancelled (cancel()) while a signal "
                                   "interrupted its wait" % what)
                if end is not None:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise WexError(errno.ETIMEDOUT, "%s: no answer within %d ms (its "
                                       "wait was interrupted by signals)" % (what, budget))
                    timeout_ms = max(1, int(left * 1000))

    def _track(self, obj, view=None):
        """obj (what holds a tensor's memory) keeps this client open.
        view: (name, prank, address, bytes, host) of a view_tensors
        tensor, checked by each sync (_stale_views)."""
        with self._live_lock:
            self._live += 1
            if view is not None:
                self._views.append([weakref.ref(obj)] + list(view))
        weakref.finalize(obj, self._untrack)

    def _stale_views(self, keep=False):
        """After a sync: the view tensors alive whose memory that sync
        unmapped or moved (it fetched the producers' segments again: they
        registered again, a producer or wexd restarted).  Reading one
        would crash the process (SIGSEGV): host memory no longer mapped
        gets private zero pages in its place, unmapped once the last
        tensor over it is gone.  Returns their names; keep: they stay
        listed, for the next call to return."""
        with self._live_lock:
            self._views = [v for v in self._views if v[0]() is not None]
            views = list(self._views)
        stale = []
        for entry in views:
            ref, name, prank, ptr, nbytes, host = entry
            try:
                now = self.view(name, prank)[0]
            except WexError:
                now = None
            if now == ptr:
                continue
            stale.append(name)
            with self._live_lock:
                if entry in self._views and not keep:
                    self._views.remove(entry)
            obj = ref()
            if host and obj is not None:
                _fill_unmapped(obj, ptr, nbytes)
        return stale

    def _untrack(self):
        # A finalizer: it may run in any thread, inside any call of this
        # client's (the collector runs where Python allocates), while
        # another thread's sync holds the lock for minutes.  The pending
        # close is made here only when nothing holds the client; else a
        # thread of its own makes it once the call holding it returns.
        with self._live_lock:
            self._live -= 1
            if self._live or not self._close_pending:
                return
        owned = getattr(self._lock, "_is_owned", lambda: True)()
        in_cancel = getattr(self._in_cancel, "on", False)
        if not owned and not in_cancel and self._lock.acquire(blocking=False):
            try:
                self._close_if_unused()
            finally:
                self._lock.release()
            return
        threading.Thread(target=self._close_when_free, name="wex-client-close",
                         daemon=True).start()

    def _close_when_free(self):
        with self._lock:
            self._close_if_unused()

    def _close_if_unused(self):
        with self._live_lock:
            if self._live or not self._close_pending:
                return  # (a tensor was made meanwhile)
        self._close_locked(False)

    @property
    def handle(self):
        if self._h is None:
            raise WexError(errno.EBADF, "client is closed")
        return self._h

    @property
    def last_error(self):
        # (_handle_lock: a close() in another thread frees the client.
        # Marked as cancel() does: a finalizer run in here must not close
        # the client on this thread, which holds _handle_lock.)
        prev = getattr(self._in_cancel, "on", False)
        self._in_cancel.on = True
        try:
            with self._handle_lock:
                if self._h is None:
                    return ""
                raw = self._lib.wex_last_error(self._h)
        finally:
            self._in_cancel.on = prev
        return raw.decode(errors="replace")

    def close(self, force=False):
        """Closes the client; deferred while tensors over its memory are
        alive (see the class), unless force.  A sync or begin_write of
        this client waiting for wexd in another thread is cancelled first
        (WexError ECANCELED there), not waited for up to its timeout; one
        copying completes first.  A close deferred for live tensors
        cancels nothing."""
        # The waiting call holds the lock until it returns.  (_live is
        # read again under the lock, where the close is decided.)
        cancel_failed = False
        while not self._lock.acquire(timeout=0.05):
            if not cancel_failed and (force or not self._live):
                try:
                    self.cancel()
                except WexError:  # an older wexd: the call waits on
                    cancel_failed = True
        try:
            self._close_locked(force)
        finally:
            self._lock.release()

    def _close_locked(self, force):
        if self._h is None:
            return
        with self._live_lock:  # (against a finalizer's count)
            live, first = self._live, not self._close_pending
            if live and not force:
                self._close_pending = True
        if live and not force:
            if first:
                warnings.warn("wex.Client.close(): %d tensor(s) over this client's "
                              "memory are still alive: the client (its lease and "
                              "mappings) closes when the last is gone "
                              "(close(force=True) closes now)" % live,
                              RuntimeWarning, stacklevel=3)
            return
        with self._handle_lock:
            # (_h cleared first: a signal's handler runs as the close
            # returns, before the next line; a KeyboardInterrupt raised
            # there left _h naming the freed client, which the next
            # close or __del__ freed again; a handler's cancel() finds
            # the client closed.)
            h, self._h = self._h, None
            self._lib.wex_client_close(h)
        self._regions = []
        self._attached = []
        self._unclaimed = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Nothing refers to the client any more, tensors over its memory
        # included (they hold it).
        try:
            self.close(force=True)
        except Exception:
            pass

    # Producers ---------------------------------------------------------

    def _segment_call(self, what, fn, args, outs, result):
        """_call of a call that makes a segment (fn(handle, *args, *outs),
        which fills outs only where it succeeds): where a signal's handler
        raises as it returns (Ctrl-C), the segment, held by the client
        until close() (libwex frees none earlier), is kept for the same
        call again, which returns it instead of making a second."""
        key = (what,) + tuple(getattr(a, "value", a) for a in args)
        with self._lock:
            if key in self._unclaimed:
                return self._unclaimed.pop(key)
            try:
                self._call(what, fn, *args, *map(ctypes.byref, outs))
            except BaseException:
                if outs[-1].value is not None and outs[-1].value != _NO_SEGMENT:
                    self._unclaimed[key] = result()
                raise
        return result()

    def segment_alloc(self, kind, size, device=0):
        """Returns (segment id, address in this process)."""
        sid, ptr = ctypes.c_uint32(_NO_SEGMENT), ctypes.c_void_p()
        return self._segment_call("segment_alloc", self._lib.wex_segment_alloc,
                                  (_c_int(kind, "kind", _SEG_KINDS), _c_int(device, "device"),
                                   _uint(size, 64, "size")), (sid, ptr),
                                  lambda: (sid.value, ptr.value))

    def register_ptr(self, kind, ptr, size):
        sid = ctypes.c_uint32(_NO_SEGMENT)
        return self._segment_call("register_ptr", self._lib.wex_segment_register_ptr,
                                  (_c_int(kind, "kind", "wex.SEG_CUDA_VMM or wex.SEG_CUDA_IPC"),
                                   _ptr(ptr, "ptr"), _uint(size, 64, "size")), (sid,),
                                  lambda: sid.value)

    def register_fd(self, fd, ptr, size):
        sid = ctypes.c_uint32(_NO_SEGMENT)
        return self._segment_call("register_fd", self._lib.wex_segment_register_fd,
                                  (_c_int(fd, "fd", "a file descriptor"), _ptr(ptr, "ptr"),
                                   _uint(size, 64, "size")), (sid,), lambda: sid.value)

    def register_tensors(self, tensors):
        arr = _tensors(tensors, "register_tensors")
        self._call("register_tensors", self._lib.wex_register_tensors, arr, len(arr))

    def begin_write(self, version, timeout_ms=0):
        v = _uint(version, 64, "version")
        self._pub_raised = None
        self._call_wait("begin_write", self._lib.wex_begin_write,
                        _uint(timeout_ms, 32, "timeout_ms"), lambda t: (v, t))

    def publish(self, version):
        v = _uint(version, 64, "version")
        # (libwex tries again while no wexd answers, up to the client's
        # timeout; a signal ends those tries: -EINTR, called again, and
        # that call goes on with the interrupted one's time.)
        # Where Ctrl-C's KeyboardInterrupt (a signal's handler) raised as
        # a publish of v that succeeded returned, libwex wrote v and
        # refuses the next publish of it ("begin_write it first", nothing
        # begun since): that publish succeeds, as libwex's does where a
        # reconnect found the version published.
        raised, self._pub_raised = self._pub_raised, None
        try:
            self._call_wait("publish", lambda h, _t: self._lib.wex_publish(h, v), 0,
                            lambda t: (t,))
        except WexError as e:
            if raised == v and e.code == errno.EINVAL and "begin_write it first" in str(e):
                return
            raise
        except BaseException:
            self._pub_raised = v
            raise

    # Consumers ---------------------------------------------------------

    def attach(self, tensors):
        arr = _tensors(tensors, "attach")
        self._call("attach", self._lib.wex_attach, arr, len(arr))

    def reserve(self, prank, segment, size):
        """Reserves `size` bytes of producer rank `prank`'s segment kind
        (same-address regions); waits up to the client's timeout for the
        producer to register.  Returns the region's address."""
        ptr = ctypes.c_void_p()
        size = _uint(size, 64, "size")
        with self._lock:
            try:
                self._call("reserve", self._lib.wex_reserve, _uint(prank, 32, "prank"),
                           _uint(segment, 32, "segment"), size, ctypes.byref(ptr))
            finally:
                # (Also where a signal's handler raises as the call
                # returns: the region is the client's either way.)
                if ptr.value:
                    self._regions.append((ptr.value, size))
        return ptr.value

    def sync(self, mode, min_version=0, timeout_ms=0, verify=False):
        """wex_sync; verify=True compares every byte of the attached layout
        with the producer's before the lease ends (WEX_SYNC_VERIFY): a
        difference raises WexError with code EVERIFY and leaves the weights
        dirty.  Where the sync fetched the producers' memory again while
        tensors of an earlier torch_util.view_tensors are alive (their
        memory is unmapped: reading them would crash the process), it
        raises WexError ESTALE naming them, with the completed sync's
        result as ``.result`` (host ones read zeros from then on); where
        the sync that fetched raised instead (Ctrl-C, a timeout), the
        next one that completes raises so."""
        res = SyncResult()
        mode = _c_int(mode, "mode", _SYNC_MODES)
        if mode & ~SYNC_VERIFY not in (SYNC_COPY, SYNC_REMAP_VIEW, SYNC_REMAP_FIXED):
            raise ValueError("mode must be %s (wex.SYNC_VERIFY or'ed in, or verify=True), "
                             "not %r" % (_SYNC_MODES, mode))
        if verify:
            mode |= SYNC_VERIFY
        minv = _uint(min_version, 64, "min_version")
        tmo = _uint(timeout_ms, 32, "timeout_ms")
        try:
            self._call_wait("sync", self._lib.wex_sync, tmo,
                            lambda t: (mode, minv, t, ctypes.byref(res)))
        except BaseException:
            # (A sync that fetched and then failed, or that Ctrl-C's
            # KeyboardInterrupt ended as it returned: the views it
            # unmapped get their zero pages now, and the next sync that
            # completes names them.  They were forgotten here: read as
            # zeros from then on, never told.)
            if self._views and self._h is not None:
                self._stale_views(keep=True)
            raise
        stale = self._stale_views() if self._views and self._h is not None else []
        if stale:
            e = WexError(errno.ESTALE, "sync: version %d synced, but it (or an earlier sync "
                         "that raised) fetched the producers' memory again (they "
                         "registered again, a producer or wexd "
                         "restarted, or attach() since the last fetch): %d tensor(s) from "
                         "an earlier view_tensors (%s) no longer show it (host ones read "
                         "zeros now); take them again with view_tensors" % (res.version, len(stale),
                                           ", ".join(stale[:3]) +
                                           (" ..." if len(stale) > 3 else "")))
            e.result = res
            raise e
        return res

    def release(self):
        self._call("release", self._lib.wex_release)

    def cancel(self):
        """wex_cancel: a sync or begin_write this client runs in another
        thread stops waiting (for a version to be published, or for
        leases to end) and raises WexError with code ECANCELED there; one
        whose wait is over goes on (a copy completes).  Never waits for
        that call.  True when one ran, False when none did (or the client
        is closed); WexError EOPNOTSUPP when the wexd it talks to predates
        cancels (a call already waiting then waits on)."""
        self._cancels += 1  # (seen by a call that a signal interrupted)
        self._in_cancel.on = True  # (before the lock: a finalizer may run at any point)
        try:
            with self._handle_lock:
                if self._h is None:
                    return False
                ret = self._lib.wex_cancel(self._h)
        finally:
            self._in_cancel.on = False
        if ret == -errno.EOPNOTSUPP:
            raise WexError(errno.EOPNOTSUPP, "cancel: the wexd this client talks to cannot "
                           "cancel a wait (it predates cancels): the call waits on until "
                           "answered or timed out")
        if ret < 0:
            raise WexError(-ret, "cancel: %s" % strerror(ret))
        return ret == 1

    def is_dirty(self):
        return bool(self._call("is_dirty", self._lib.wex_is_dirty))

    def view(self, name, prank=0):
        """Returns (address, Tensor) of producer rank prank's piece of name."""
        ptr, desc = ctypes.c_void_p(), Tensor()
        raw = _cstr(name, "tensor name")
        self._call("view %s" % raw.decode(errors="replace"), self._lib.wex_view, _uint(prank, 32, "prank"), raw,
                   ctypes.byref(ptr), ctypes.byref(desc))
        return ptr.value, desc

    def producer_tensors(self, prank=0):
        """The tensor table of producer rank prank (copies) and the rank count."""
        t, n = ctypes.POINTER(Tensor)(), ctypes.c_size_t()
        with self._lock:  # (the table is the client's until its next call)
            nprod = self._call("producer_tensors", self._lib.wex_producer_tensors,
                               _uint(prank, 32, "prank"), ctypes.byref(t), ctypes.byref(n))
            return [Tensor.from_buffer_copy(t[i]) for i in range(n.value)], nprod

    # Monitoring --------------------------------------------------------

    def request(self, op, args=None):
        """One request to wexd; returns its reply as a dict."""
        out = ctypes.c_void_p()
        raw = _cstr(op, "request op")
        if args is not None and not isinstance(args, dict):
            raise TypeError("request %s: args must be a dict (a JSON object) or None, not %s"
                            % (raw.decode(errors="replace"), type(args).__name__))
        try:
            a = json.dumps(args, allow_nan=False).encode() if args is not None else None
        except (TypeError, ValueError) as e:
            raise type(e)("request %s: args are not JSON: %s"
                          % (raw.decode(errors="replace"), e)) from None
        # (The reply is freed also where a signal's handler raises as
        # the call returns.)
        try:
            self._call("request %s" % raw.decode(errors="replace"), self._lib.wex_request,
                       raw, a, ctypes.byref(out))
            return json.loads(ctypes.string_at(out.value).decode())
        finally:
            if out.value:
                self._lib.wex_free(out)
