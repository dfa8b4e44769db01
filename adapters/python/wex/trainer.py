# SPDX-License-Identifier: MIT
"""wex.trainer - what one trainer rank runs: register its parameters once,
then publish a version after each optimizer step.

    from wex.trainer import TrainerRank
    t = TrainerRank("policy", model.named_parameters, rank=rank, world_size=world,
                    layout="megatron:tp=2", config="/ckpt/config.json",
                    # Megatron's DDP (around Float16Module for bf16/fp16)
                    strip_prefix=("module.module.", "module."))
    for step in range(1, steps + 1):
        loss.backward()
        with t.write(step):                        # engines wait; nothing reads
            optimizer.step()                       # the weights change in place
        # published: engines' next sync gets `step`

Parameters stay where the trainer's allocator put them (exportable CUDA
memory: torch_util.exportable_pool or expandable_segments:True); wex
exports them once and engines read them there.  A layout (a spec with
config=, or a wex.Layout) registers the trainer's own tensors (Megatron's
linear_qkv, FSDP2 shards with an fsdp layout) as the canonical pieces they
hold; without one, parameters go under their names (FSDP2 DTensors as
their shards, see torch_util.register_module).

Everything that writes the registered memory belongs inside write(), and
the weights must be whole when it ends (README, "Sync hooks"): Megatron's
distributed optimizer with overlap_param_gather=True all-gathers the
updated shards only in the next forward, so call
chunk.start_param_sync(force_sync=True) for each model chunk after
optimizer.step() inside the block; Megatron's router.expert_bias (a buffer:
pass the *.router.expert_bias ones of named_buffers()) changes in
finalize_model_grads, during the forward-backward step.  A parameter that
moved to new memory since it was registered (FSDP2's first forward from
PyTorch 2.5 until its PR #163130; an assignment to .data) is refused by
write(), naming it (moved()); given the parameters as a callable
(model.named_parameters, the bound method, not its result, or the
module itself), so is one replaced by a Parameter in new memory
(module.weight = Parameter(new)), removed or added.  FSDP2's DTensors are given as they are, with an fsdp
layout too (each registers as its local shard, and write() looks for the
shard where the DTensor has it now: FSDP2 swaps shards into new memory at
lazy_init, at the reshard after a state-dict load and at to()); pairs of
their to_local() results, which keep the memory of the moment, are
refused.
"""
import contextlib
import errno
import itertools

import wex
from wex import torch_util
from wex.engine import as_layout, parameters_changed, select_parameters, selection


def _local(t):
    """The tensor whose memory a parameter registers: an FSDP2 DTensor's
    local shard (its _local_tensor where it has one: to_local() is an
    autograd call), else the tensor."""
    if not torch_util._is_dtensor(t):
        return t
    local = getattr(t, "_local_tensor", None)
    return local if local is not None else t.to_local()


def _from_to_local(t):
    """Whether t is what a DTensor's to_local() returned under autograd
    (its grad_fn is DTensor's _ToTorchTensor): a view of the shard's
    memory of that moment, with nothing leading back to the DTensor, so a
    shard FSDP2 later swaps into new memory (lazy_init, reshard after a
    state-dict load, to()) would not be seen.  (Under torch.no_grad(),
    to_local() returns the _local_tensor itself, which nothing tells
    apart from any tensor.)"""
    return type(getattr(t, "grad_fn", None)).__name__ == "_ToTorchTensorBackward"


def _same_sharding(a, b):
    """Whether DTensors a and b are sharded alike (mesh and placements)."""
    try:
        return bool(a.device_mesh == b.device_mesh) and \
            tuple(a.placements) == tuple(b.placements)
    except Exception:  # stand-ins, or a mesh that does not compare
        return False


def _chunks(chunks, strip):
    """Megatron's model as get_model returns it, a list of model chunks
    (one per virtual pipeline stage, --num-virtual-stages-per-pipeline-rank):
    a callable giving each chunk's parameters, named with strip_prefix
    removed and, with several chunks, prefixed model{v}. as the megatron
    layout with vpp=V names them (its checkpoints' state_dict['model%d']);
    one chunk keeps the names (select_parameters strips them).  With each
    chunk's parameters go its Megatron-Core routers' expert_bias buffers
    (*.router.expert_bias, which the layout has; not the routers' other
    buffers), as README's "Sync hooks" has them passed.  strip: the
    prefixes as selection() gives them (the caller reads a generator
    once).  A model{v}. name comes with the chunk's own, which ignore=
    patterns match too, with or without the prefix (select_parameters)."""

    def named():
        for v, chunk in enumerate(chunks):
            buffers = getattr(chunk, "named_buffers", None)
            for name, t in itertools.chain(chunk.named_parameters(), (
                    (n, b) for n, b in (buffers() if callable(buffers) else ())
                    if n.endswith(".router.expert_bias"))):
                if len(chunks) > 1:
                    yield ("model%d.%s" % (v, next((name[len(p):] for p in strip
                                                    if p and name.startswith(p)), name)),
                           t, name)
                else:
                    yield name, t
    return named


def _check_rows(items, layout, rank):
    """Refuses (ValueError, naming it) a DTensor whose local shard is not
    the box rank `rank` of `layout` holds of it: placements other than
    FSDP2's and HSDP's (Shard(0) on one mesh dim: torch_util._dtensor_box
    refuses the others), or the rows of another rank (a rank= that is not
    the DTensor's shard_rank + fsdp*replica_rank).  Registered as the
    layout's pieces, such a shard went to engines as that rank's rows,
    unseen: its shape alone is that of every rank's when dim 0 divides."""
    dtensors = [(n, t) for n, t in items if torch_util._is_dtensor(t)]
    if not dtensors:
        return
    box = {n: (ps[0].dims("shape"), ps[0].dims("start"), ps[0].dims("extent"))
           for n, _, _, ps in layout.rank(rank) if len(ps) == 1}
    for n, t in dtensors:
        local, shape, start = torch_util._dtensor_box(n, t)
        if not local.numel() or n not in box:
            # (An empty shard holds nothing; a name the layout lacks is
            # refused by register_module, naming it.)
            continue
        if box[n] != (shape, start, tuple(local.shape)):
            rows = lambda s, a, e: "rows [%d, %d) of %s" % (a[0], a[0] + e[0], s)
            raise ValueError(
                "%s: the DTensor holds %s (mesh coordinate %s), rank %d of layout %s %s: "
                "rank= is the layout's (FSDP2: shard_rank + fsdp * replica_rank), and the "
                "layout that of the DTensors' mesh (fsdp:fsdp=N,dp=M)"
                % (n, rows(shape, start, tuple(local.shape)),
                   tuple(t.device_mesh.get_coordinate()), rank, layout.spec, rows(*box[n])))


def _entry(t):
    """What the table registered of parameter t (its local shard): its
    address, shape, strides and dtype; (None, shape) where it is empty
    (nothing registered: no bytes, no address)."""
    local = _local(t)
    if not local.numel():
        return None, tuple(local.shape)
    return local.data_ptr(), tuple(local.shape), local.stride(), local.dtype


def _steps(entry):
    """An _entry's strides where they step: a dim of 1 element steps
    nowhere, its stride is whatever made it (compared as 0; shown as
    PyTorch has it)."""
    return tuple(st if n != 1 else 0 for st, n in zip(entry[2], entry[1]))


def _differs(was, t, moved):
    """How t's local shard is not the table's entry `was` (_entry), or
    None: `moved` where it is in other memory."""
    now = _entry(t)
    if now == was:
        return None
    if was[0] is None:
        # (Left out as empty, engines never got it.)
        return None if now[0] is None else "empty when registered, now %s: not registered" \
            % (list(now[1]),)
    if now[0] != was[0]:
        return moved
    if now[1] == was[1] and now[3] == was[3] and _steps(now) == _steps(was):
        return None
    # (The same address, another tensor over it: .data set to a view of
    # it, such as rows cut off a padded vocabulary: engines read it as
    # the table says.)
    return "now %s %s with strides %s at the address registered as %s %s with strides %s" % (
        str(now[3]).replace("torch.", ""), list(now[1]), list(now[2]),
        str(was[3]).replace("torch.", ""), list(was[1]), list(was[2]))


def _why(t, was, cur):
    """How registered parameter t (registered as _entry `was`), with cur
    under its name now, is not as it was (parameters_changed)."""
    if cur is not t and not (torch_util._is_dtensor(t) and not (
            torch_util._is_dtensor(cur) and _same_sharding(cur, t))):
        return _differs(was, cur, "replaced by a Parameter in new memory")
    # (A registered DTensor shown otherwise is FSDP2's own view between
    # its all-gather and its reshard: the unsharded Parameter, a DTensor
    # of another sharding with FSDP2 over TP or EP, or the post-forward
    # shard of reshard_after_forward=<int>; what was registered is still
    # t's shard.)
    return _differs(was, t, "re-allocated")


class TrainerRank:
    """One producer rank of `model`: its parameters registered (as
    register_module does: `kind`, `segments`, `boxes`, or `layout`), and
    versions published by write()."""

    def __init__(self, model, named_parameters, *, rank=0, world_size=1, layout=None,
                 config=None, adapters=None, socket=None, timeout_ms=None,
                 kind=wex.SEG_CUDA_VMM, segments=None, boxes=None, strip_prefix=None,
                 ignore=(), watch=True, client=None):
        """named_parameters: (name, tensor) pairs, a callable returning
        them (model.named_parameters), the module itself, or Megatron's
        list of model chunks (get_model's; with several, chunk v's names
        are prefixed model{v}. after strip_prefix, as the megatron layout
        with vpp names them; ignore patterns match either name).  client:
        a producer wex.Client the caller opened already (to allocate
        segments= with it first), as this rank: one opened as another
        model, rank or world size than model, rank= and world_size= is
        refused (ValueError); it is then the caller's to close as well."""
        # As Python ints, as wex.Client takes them (refusing None, a bool
        # or a float, naming them): a 0-d tensor rank was kept as given
        # (describe() a tensor), and None, with client=, failed the check
        # below as "%d format: a real number is required" naming nothing.
        rank, world_size = wex._int(rank, "rank"), wex._int(world_size, "world_size")
        self.layout = as_layout(layout, config, adapters, world_size, "trainer")
        # (One made here from a spec string is closed with the rank.)
        self._own_layout = self.layout is not None and self.layout is not layout
        # (Once: a generator strip_prefix or ignore is read here.)
        self._select = selection(strip_prefix, ignore)
        if isinstance(named_parameters, (list, tuple)) and named_parameters and all(
                callable(getattr(m, "named_parameters", None)) for m in named_parameters):
            # Megatron's model chunks (a list even without vpp).
            named_parameters = _chunks(list(named_parameters), self._select[0])
        elif callable(getattr(named_parameters, "named_parameters", None)):
            # The model itself (a torch module, callable: its forward):
            # its named_parameters.
            named_parameters = named_parameters.named_parameters
        self._resolve = named_parameters if callable(named_parameters) else None
        items, self.ignored = select_parameters(
            named_parameters() if self._resolve else named_parameters, *self._select)
        if not items:
            raise ValueError("no parameters to register (%d ignored)" % len(self.ignored))
        if self._resolve is None:
            shards = [n for n, t in items if _from_to_local(t)]
            if shards:
                raise ValueError(
                    "%s: the local shard a DTensor's to_local() returned (FSDP2): a "
                    "view of the shard's memory of now, which FSDP2 swaps for new memory "
                    "(lazy_init, reshard after a state-dict load, to()) unseen; pass the "
                    "DTensors themselves (model.named_parameters(), with a layout too), "
                    "or model.named_parameters (the bound method): write() then checks "
                    "their shards where they are" % (", ".join(shards[:3]) + (
                        " and %d more" % (len(shards) - 3) if len(shards) > 3 else "")))
        if self.layout is not None:
            _check_rows(items, self.layout, rank)
        segments = None if segments is None else list(segments)
        if segments and client is None:
            # (Segment ids are a client's own: this rank's new client has
            # none, and register_tensors failed after it had joined wexd,
            # "tensor 'w' names segment 0, rank has 0".  segments=[], for
            # a rank whose every tensor is empty, needs none.)
            raise ValueError("segments= are segments of the client that allocated or "
                             "registered them: pass that producer client as client= too")
        self.model, self.rank, self.world_size = model, rank, world_size
        self._own = client is None
        opened = getattr(client, "_opened", None)
        if opened is not None:
            # (A client opened as another rank registered this rank's
            # pieces under it, unseen: the engines' plan then failed,
            # "element ... has no producer", or took the wrong rows.)
            name = lambda m: m.encode() if isinstance(m, str) else m
            role, cmodel, crank, cworld = opened
            # (libwex takes world_size 0 as 1: rank 0 of 1.)
            if role != wex.ROLE_PRODUCER or name(cmodel) != name(model) or \
                    (crank, max(cworld, 1)) != (rank, max(world_size, 1)):
                raise ValueError(
                    "client= was opened as %s of model %r, rank %d of %d, but this trainer "
                    "rank is a producer of %r, rank %d of %d: pass TrainerRank the rank= "
                    "and world_size= its client has" % (
                        {wex.ROLE_PRODUCER: "a producer", wex.ROLE_CONSUMER: "a consumer"}.get(
                            role, "an admin client"), cmodel, crank, cworld, model, rank,
                        world_size))
        self.client = client or wex.Client(wex.ROLE_PRODUCER, model, rank=rank,
                                           world_size=world_size, socket=socket,
                                           timeout_ms=timeout_ms, watch=watch)
        try:
            # (With a layout, which gives every box, a DTensor registers
            # as its local shard; self._where keeps the DTensor, whose
            # shard write() finds where it is now.)
            self.segments = torch_util.register_module(
                self.client, items if self.layout is None else
                [(n, _local(t)) for n, t in items], kind=kind, segments=segments, boxes=boxes,
                layout=self.layout, rank=rank if self.layout is not None else None)
        except BaseException:
            if self._own:
                self.client.close(force=True)
            raise
        self.tensors = len(items)
        self.version = 0
        self._writing = None
        # Where each parameter's bytes were registered (engines read
        # there) and as what; empty ones register nothing (and are
        # refused once they are not empty).
        self._where = [(n, t, _entry(t)) for n, t in items]

    @contextlib.contextmanager
    def write(self, version, timeout_ms=0):
        """begin_write(version) on entry (waits, up to timeout_ms, or where
        that is 0 the client's timeout if it has one, else wexd's
        begin_write_timeout_ms, until no engine reads this rank's memory),
        publish(version) when the block ends without an exception (after
        the GPU work queued on the weights' devices completed; where no
        wexd answers, tried again up to the client's timeout, not
        timeout_ms).  Both ends refuse (ValueError, naming them) where
        registered parameters moved to new memory (moved()): nothing
        begun on entry, the version left unpublished at the end.  An
        exception leaves the version unpublished, the weights half-written,
        and the exception goes on: engines keep the version they hold, and
        this rank is still writing `version` (describe()["writing"] says
        so, as wexd does); wexd refuses another version
        while a rank of the group writes this one, so the step is retried
        with the same version (a write() of it again, on every rank that
        began it).  Where the exception came from publish itself (Ctrl-C,
        cancel(), or no answer from wexd) wexd may have published the
        version all the same: the write() of it again then raises
        WexError(EALREADY) on entry, nothing written, and the rank counts
        the version published (self.version): go on with the next one."""
        client = self.client  # (close() in another thread sets it None)
        if client is None:
            raise ValueError("this trainer rank is closed")
        # As a Python int: a 0-d integer tensor (a step counter) kept as
        # self.version changed with the counter's next in-place += 1, and
        # the next write() was refused as "not newer" than itself.
        version = wex._uint(version, 64, "version")
        if version <= self.version:
            raise ValueError("version %d is not newer than %d, the last published"
                             % (version, self.version))
        self._check_moved("nothing begun")
        try:
            client.begin_write(version, timeout_ms)
        except wex.WexError as e:
            if e.code == errno.EALREADY:
                # (The publish that raised went through after all.)
                self.version = version
                self._writing = None
            raise
        # Until publish succeeds this rank writes `version`, as wexd sees
        # it (describe()["writing"]), a failed step included.
        self._writing = version
        yield self
        if self.client is None:
            # (close() in another thread during the block: was an
            # AttributeError on None.)
            raise ValueError("this trainer rank was closed during write(%d): v%d not "
                             "published" % (version, version))
        self._check_moved("v%d not published" % version)
        client.publish(version)
        self.version = version
        self._writing = None

    def moved(self):
        """["name (why)"] of the registered parameters whose memory is no
        longer where it was registered (engines would read the old
        memory): re-allocated (.data assigned, FSDP2's shard swapped),
        another shape, strides or dtype at the address registered (.data
        set to a view of it; engines read it as registered), not empty
        any more where it was registered empty (engines do not get it),
        and, when the parameters were given as a callable
        (model.named_parameters, the bound method), replaced by a
        Parameter in new memory (module.weight = Parameter(new)), removed,
        or added (engines would not get it)."""
        now = None
        if self._resolve is not None:
            now = dict(select_parameters(self._resolve(), *self._select)[0])
        # (An empty one that is gone held nothing engines read.)
        return parameters_changed([w for w in self._where if now is None or w[2][0] is not None
                                   or w[0] in now], now, _why)

    def _check_moved(self, what):
        moved = self.moved()
        if moved:
            raise ValueError(
                "parameters not where they were registered (engines read the memory "
                "registered): %s; %s.  FSDP2 (PyTorch 2.5 until its PR #163130) moves "
                "unevenly sharded parameters at the first forward (lazy_init): register "
                "after the first forward and backward; after assigning .data or a new "
                "Parameter: register again (a new TrainerRank)"
                % (", ".join(moved[:3]) + (" and %d more" % (len(moved) - 3)
                                           if len(moved) > 3 else ""), what))

    def publish(self, version, timeout_ms=0):
        """A write with nothing inside: the weights changed already (or
        this is the first version, the initial weights)."""
        with self.write(version, timeout_ms):
            pass

    def describe(self):
        return {"model": self.model, "rank": self.rank, "world_size": self.world_size,
                "layout": self.layout.spec if self.layout is not None else "canonical",
                "tensors": self.tensors, "ignored": list(self.ignored),
                "segments": len(self.segments), "version": self.version,
                "writing": self._writing}

    def close(self):
        if self.client is not None and self._own:
            self.client.close()
        self.client = None
        if self._own_layout:
            self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
