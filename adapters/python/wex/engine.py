# SPDX-License-Identifier: MIT
"""wex.engine - what one inference-engine rank runs: attach its own
parameters once, copy the trainer's newest version into them in place
before each rollout.

The engine-specific hooks (wex.vllm, wex.sglang) find the rank, the
layout and the parameters inside the engine's worker process and hand
them to EngineRank; a custom engine uses it directly:

    from wex.engine import EngineRank
    r = EngineRank("policy", model.named_parameters, rank=tp_rank,
                   world_size=tp, layout="vllm:tp=2", config="/ckpt/config.json",
                   group="rollout0")
    r.sync(min_version=step)        # before each rollout; in place, so
                                    # CUDA graphs stay valid

Every parameter the layout holds must be given, in its shape and dtype
(the layout's names: strip a wrapper's prefix with strip_prefix=); a
parameter the layout does not hold is refused by name unless `ignore=`
lists it (fnmatch patterns): an ignored parameter is never updated, so
the list is the caller's statement that it should not be.

Give the parameters as a callable (model.named_parameters, the bound
method, not its result) and each sync enumerates the module again: a
parameter the engine replaced since attach (layer.weight =
Parameter(new), as vLLM's process_weights_after_loading does on a
reload) is then refused by name instead of copied into the orphaned
tensor.  Given as pairs, only a parameter whose memory moved (p.data =
new) can be seen.
"""
import collections.abc
import errno
import fnmatch
import glob
import json
import logging
import os
import threading
import time
import weakref

import wex
from wex import torch_util

log = logging.getLogger("wex.engine")

# Every EngineRank of this process (see _after_fork).
_ranks = weakref.WeakSet()


def _after_fork():
    """In a forked child: no thread of the child is in a sync of a rank,
    whatever the parent's threads were doing.  A sync the parent ran in
    another thread stayed counted in the child's copy: its close() and
    released() waited for it for ever (its client refuses in the child,
    ECHILD, and frees its copy on close)."""
    for r in list(_ranks):
        r._syncs = threading.Condition()
        r._syncing = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def select_parameters(named, strip_prefix=None, ignore=()):
    """([(name, tensor)] kept, [names ignored]): names with strip_prefix
    (a string or a tuple of them) removed where they start with it, those
    matching an `ignore` pattern (with or without the prefix) left out.
    An item may be (name, tensor, original): a name the engine's glue
    gave a parameter the engine calls `original` (vllm.engine_names),
    the pattern matched against both.  Two parameters that end up under
    one name are refused."""
    strip_prefix, ignore = selection(strip_prefix, ignore)
    if isinstance(named, collections.abc.Mapping):
        named = named.items()

    def strip(name):
        for p in strip_prefix:
            if p and name.startswith(p):
                return name[len(p):]
        return name

    kept, dropped, seen = [], [], {}
    for item in named:
        if not isinstance(item, (tuple, list)) or len(item) < 2 or \
                not isinstance(item[0], str):
            raise TypeError("parameters are (name, tensor) pairs (model.named_parameters, "
                            "or a mapping of names to tensors), not %r" % (item,))
        full, t = item[0], item[1]
        name = strip(full)
        said = {full, name}.union(*({o, strip(o)} for o in item[2:]))
        if any(fnmatch.fnmatchcase(n, pat) for n in said for pat in ignore):
            dropped.append(name)
            continue
        if name in seen:
            raise ValueError("parameters %s and %s are both %s once %r is stripped"
                             % (seen[name], full, name, strip_prefix))
        seen[name] = full
        kept.append((name, t))
    return kept, dropped


def selection(strip_prefix, ignore):
    """(strip_prefix, ignore) as tuples: either may be given as one string
    or as any iterable (a generator, read once here, is kept whole for the
    checks that select again)."""
    return tuple((strip_prefix,) if isinstance(strip_prefix, str) else strip_prefix or ()), \
        tuple((ignore,) if isinstance(ignore, str) else ignore or ())


def parameters_changed(where, now, why):
    """["name (why)"] of the (name, tensor, address) registered in `where`
    that are not as they were: why(t, address, cur) says how (None: as
    it was), cur being the tensor now under the name in `now` (the
    parameters enumerated again, {name: tensor}; None: not enumerated,
    cur is t); a name not in `now` is "removed", one only in `now`
    "added"."""
    out = []
    for name, t, p in where:
        cur = t if now is None else now.pop(name, None)
        reason = "removed" if cur is None else why(t, p, cur)
        if reason:
            out.append("%s (%s)" % (name, reason))
    out.extend("%s (added)" % name for name in sorted(now or ()))
    return out


def config_path(model_path, revision=None):
    """The config.json of a model an engine was started with: in its
    directory, or, for a Hugging Face hub id, in the local hub cache at
    `revision` (the engine's; None: main) (huggingface_hub's
    try_to_load_from_cache; nothing is downloaded).  Raises ValueError
    asking for config= when neither has it.  The engine's config
    overrides (vLLM's hf_overrides, SGLang's --json-model-override-args)
    are not applied: a model they change needs config= naming a
    config.json that has them."""
    if model_path and os.path.isfile(os.path.join(model_path, "config.json")):
        return os.path.join(model_path, "config.json")
    if model_path and not os.path.isabs(model_path):
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(repo_id=model_path, filename="config.json",
                                           revision=revision)
            if isinstance(found, str) and os.path.isfile(found):
                return found
        except Exception:  # no huggingface_hub, or not a repo id
            pass
    raise ValueError("the model %r%s is neither a directory with a config.json nor in the local "
                     "Hugging Face cache; pass config= (the path of the model's config.json)"
                     % (model_path, " at revision %r" % revision if revision else ""))


# Load formats that read the model directory's safetensors as they are.
_SAFETENSORS_FORMATS = ("auto", "safetensors", "fastsafetensors")


def checkpoint_for(checkpoint, model_path, load_format, config=None, updated=False):
    """(the checkpoint to compare an engine's weights with before its
    first copy, or None; why None; whether it was chosen here):
    wex.checkpoint.compare, run by EngineRank(checkpoint=).  checkpoint:
    False (never), a path (refused for an engine started with dummy
    weights), or None (auto: the engine's model directory, or, for a hub
    id, the directory of its cached `config`, when it holds .safetensors
    files that the engine's load_format, auto, safetensors or
    fastsafetensors, reads).  Either way not once `updated`: the weights
    are not the loaded ones any more (True: a sync of this process
    changed them; a string: why else, the reason given)."""
    lf = getattr(load_format, "value", load_format)
    lf = str(lf).lower() if lf is not None else None
    if checkpoint is False:
        return None, "checkpoint=False", False
    if checkpoint is not None:
        given = checkpoint
        try:
            checkpoint = os.fspath(checkpoint)
        except TypeError:
            checkpoint = None
        if not isinstance(checkpoint, str) or not checkpoint:
            raise ValueError("checkpoint must be a path, False or None, not %r" % (given,))
        if lf == "dummy":
            raise ValueError("checkpoint=%r given, but the engine was started with "
                             "load_format='dummy': its weights are random, not the "
                             "checkpoint's" % checkpoint)
    if updated:
        return None, (updated if isinstance(updated, str) else
                      "a sync changed the weights since the engine loaded them"), False
    if checkpoint is not None:
        return checkpoint, None, False
    if lf not in _SAFETENSORS_FORMATS:
        return None, ("the engine's load_format is %s" % lf if lf else
                      "the engine's load_format is unknown"), False
    d = model_path if model_path and os.path.isdir(model_path) else (
        os.path.dirname(config) if config else None)
    if not d or not glob.glob(os.path.join(glob.escape(d), "*.safetensors")):
        return None, "no .safetensors checkpoint found at %s" % (d or model_path), False
    return d, None, True


def stages_from_env(name, pp):
    """",stages=a/b/..." for a layout spec from environment variable `name`
    (comma-separated layer counts, one per pipeline stage: vLLM's
    VLLM_PP_LAYER_PARTITION, SGLang's SGLANG_PP_LAYER_PARTITION, as the
    engine reads it), "" when it is unset or pp is 1.  Raises ValueError,
    naming the variable, for one that is not pp counts (the engine
    refuses it too); the layout checks that they sum to the model's
    layers."""
    value = os.environ.get(name)
    if pp <= 1 or value is None or not value.strip():
        return ""
    try:
        counts = [int(x) for x in value.split(",")]
    except ValueError:
        raise ValueError("%s=%r: expected comma-separated layer counts, one per pipeline stage"
                         % (name, value)) from None
    if len(counts) != pp or any(c < 0 for c in counts):
        raise ValueError("%s=%r gives %d stage(s); the engine runs %d pipeline stages"
                         % (name, value, len(counts), pp))
    return ",stages=" + "/".join(str(c) for c in counts)


_EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


def has_experts(config):
    """Whether the model of config.json `config` (a path) has routed
    experts (n_routed_experts, num_experts or num_local_experts above 0,
    the keys the MoE families read).  A config that cannot be read
    raises."""
    with open(config) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError("%s is not a JSON object" % config)
    for key in _EXPERT_KEYS:
        n = cfg.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return True
    return False


def fp8_block_size(config):
    """quantization_config.weight_block_size of the model of config.json
    `config` (a path): what it says, None where it says none.  A config
    that cannot be read raises (OSError, ValueError)."""
    with open(config) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError("%s is not a JSON object" % config)
    q = cfg.get("quantization_config")
    return q.get("weight_block_size") if isinstance(q, dict) else None


def group_status(model, group, socket=None):
    """[{rank, pid, served, ...}] of consumer group `group` of `model` as
    wexd reports them (wexctl status: pid 0 for a rank not attached;
    served, the version last handed to it), or [] when no rank of it is
    attached.  group None is "default", as EngineRank names it.  An admin
    request: the caller must be allowed wexctl status."""
    group = group or "default"
    with wex.Client(wex.ROLE_ADMIN, socket=socket) as c:
        models = c.request("status").get("models", [])
    for m in models:
        if m.get("name") == model:
            for g in m.get("groups", []):
                if g.get("name") == group:
                    return g.get("ranks", [])
    return []


def check_group(model, group, min_version, world_size=None, socket=None):
    """Raises RuntimeError naming the ranks of `group` that are not
    attached or were not served min_version (the engine's log says why:
    the SGLang hook logs a failed sync instead of raising); returns the
    ranks' status otherwise.  world_size: how many ranks there must be."""
    group = group or "default"
    ranks = group_status(model, group, socket)
    if not ranks:
        raise RuntimeError("no rank of group %r of model %r is attached: see the engine's log"
                           % (group, model))
    if world_size is not None and len(ranks) != world_size:
        raise RuntimeError("group %r of model %r has %d ranks, not %d"
                           % (group, model, len(ranks), world_size))
    behind = ["rank %d %s" % (r["rank"], "not attached" if not r.get("pid") else
                              "at version %d" % r.get("served", 0))
              for r in ranks if not r.get("pid") or r.get("served", 0) < min_version]
    if behind:
        raise RuntimeError("group %r of model %r is not at version %d: %s (see the engine's "
                           "log)" % (group, model, min_version, ", ".join(behind)))
    return ranks


def as_layout(layout, config=None, adapters=None, world_size=None, who="engine"):
    """A wex.Layout from a Layout or a spec string (which needs the
    model's config.json); None stays None (the canonical names).  With
    world_size, a layout of another number of ranks is refused (`who`
    runs world_size ranks)."""
    if layout is not None and not isinstance(layout, wex.Layout):
        if not isinstance(layout, str):
            raise TypeError("layout must be a wex.Layout or a spec string such as "
                            "'vllm:tp=2', not %r" % (layout,))
        if not config:
            raise ValueError("layout %r needs config=, the model's config.json" % layout)
        layout = wex.Layout(config, layout, adapters)
    if layout is not None and world_size is not None and layout.world != world_size:
        raise ValueError("layout %s has %d ranks, but this %s runs %d"
                         % (layout.spec, layout.world, who, world_size))
    return layout


def _released(items):
    """'name (nothing mapped at ADDRESS)' of the first tensor whose GPU
    memory the engine released keeping its addresses (wex.released), or
    None."""
    for name, t in items:
        if not t.numel() or not t.data_ptr():  # no memory (meta tensors)
            continue
        span = t.element_size() * (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride())))
        at = wex.released(t.data_ptr(), span)
        if at is not None:
            return "%s (nothing mapped at %#x)" % (name, at)
    return None


class EngineRank:
    """One engine rank: a consumer client of `group` with its parameters
    attached (in `layout`, rank `rank` of `world_size`), syncing in place.

    model: the name the trainer publishes under.  named_parameters: the
    engine's (name, tensor) pairs, or better a callable returning them
    (model.named_parameters, or the module itself, which stands for
    its named_parameters): then each sync enumerates them again and
    refuses, by name, a parameter the engine replaced, removed or added
    since attach (see the module's doc).  layout:
    a wex.Layout, a spec string with config=, or None when the engine's
    tensors carry the canonical (Hugging Face) names and shapes.  device:
    the CUDA ordinal the rank's weights are on (None: the client's
    default).  timeout_ms: how long each call to wexd may take (the
    client's); sync(timeout_ms=) is how long a sync waits for a version.
    checkpoint: the safetensors checkpoint (a directory, a .safetensors
    file or a sharded checkpoint's *.safetensors.index.json) the engine
    loaded these weights from, not yet updated: before attaching,
    a sample of every piece the rank holds is compared with it
    (wex.checkpoint.compare; config=, the model's config.json, maps
    canonical names to the checkpoint's), and a tensor the engine holds
    otherwise than the layout says (re-laid out in its shape by a kernel
    backend, transformed) is refused by name (CheckpointMismatch, a
    ValueError) instead of being written where the engine reads
    something else.  describe()["checkpoint_check"] says what was
    compared (or why nothing was).
    """

    def __init__(self, model, named_parameters, *, rank=0, world_size=1, layout=None,
                 config=None, adapters=None, group=None, socket=None, timeout_ms=None,
                 copy_threads=None, device=None, strip_prefix=None, ignore=(),
                 checkpoint=None, checkpoint_auto=False, checkpoint_skip=None):
        self.layout = as_layout(layout, config, adapters, world_size, "engine")
        # (One made here from a spec string is closed with the rank.)
        self._own_layout = self.layout is not None and self.layout is not layout
        if not 0 <= rank < world_size:
            raise ValueError("rank %d is not in 0..%d" % (rank, world_size - 1))
        if callable(getattr(named_parameters, "named_parameters", None)):
            # The model itself (a torch module, callable: its forward):
            # its named_parameters.
            named_parameters = named_parameters.named_parameters
        self._resolve = named_parameters if callable(named_parameters) else None
        self._select = selection(strip_prefix, ignore)
        items, self.ignored = select_parameters(
            named_parameters() if self._resolve else named_parameters, *self._select)
        if not items:
            raise ValueError("no parameters to attach (%d ignored)" % len(self.ignored))
        # Before anything is attached: the engine must hold the bytes the
        # layout says where it says (a backend that re-laid them out in
        # their shape would read wex's copies as something else).
        self.checked = "not checked (no checkpoint given)"
        gone = _released(items)
        if gone:
            # Reading them (the comparison below) or copying into them
            # would fault; libwex's attach refuses them too.
            raise ValueError("the engine released the memory of %s and kept its addresses "
                             "(vLLM's sleep mode, SGLang's release_memory_occupation): wake "
                             "its weights first; nothing compared or attached" % gone)
        if checkpoint:
            self.checked = self._check(items, checkpoint, checkpoint_auto, checkpoint_skip,
                                       rank, config, adapters)
        self.model = model
        self.group = group or "default"
        self.rank = rank
        self.world_size = world_size
        # What each parameter was at attach (the object and its memory):
        # an engine that re-allocates its weights (p.data = new) or
        # replaces them (layer.weight = Parameter(new): a reload,
        # quantization post-processing) would have wex copy into memory
        # the engine no longer reads.  attach_module keeps the attached
        # storage alive, so that memory is never another tensor's.
        self._where = [(name, t, t.data_ptr()) for name, t in items]
        self.client = wex.Client(wex.ROLE_CONSUMER, model, group=self.group, rank=rank,
                                 world_size=world_size, socket=socket, timeout_ms=timeout_ms,
                                 copy_threads=copy_threads, device=device)
        try:
            torch_util.attach_module(self.client, items,
                                     layout=self.layout, rank=rank if self.layout else None)
        except BaseException:
            self.client.close(force=True)
            raise
        self.tensors = len(items)
        self.bytes = sum(t.numel() * t.element_size() for _, t in items)
        self.version = 0
        self.released_why = None     # see released()
        # sync() calls running: thread ident -> count; released() waits
        # for them (under _syncs, with released_why).
        self._syncs = threading.Condition()
        self._syncing = {}
        # The syncs running, one token each (overwritten() cancels only
        # those begun before it: a later one forgets first itself).
        self._entries = set()
        _ranks.add(self)  # (a forked child's copy counts none of the parent's syncs)
        self._cancel_warned = False
        self._closing = False        # close() waits for running syncs
        self.lost = None             # see restored(): why the weights hold nothing
        self._forget_pending = False  # restored() lost them, forget() not yet done
        self.forgotten = 0           # forget() calls
        self._overwrites = (0, None)  # overwritten() calls, the last one's why

    def _check(self, items, checkpoint, auto, skip, rank, config, adapters):
        """What describe()["checkpoint_check"] says: wex.checkpoint.compare
        of the tensors with `checkpoint`; raises for a difference, and,
        for a checkpoint the caller named (not `auto`), for one that
        cannot be read or shows nothing."""
        from wex import checkpoint as ckpt

        try:
            rep = ckpt.compare(items, checkpoint, layout=self.layout,
                               rank=rank if self.layout else 0, config=config,
                               adapters=adapters, skip=skip)
        except ckpt.CheckpointMismatch as e:
            if not auto:
                raise
            raise ckpt.CheckpointMismatch(
                "%s (checkpoint=None compared with the model directory the engine loaded; "
                "if its weights were changed since by other means, pass checkpoint=False)"
                % e) from None
        except ValueError as e:
            if not auto:
                raise
            return "not checked: %s" % e
        if not rep["pieces"]:
            why = ", ".join(rep["skipped"][:3]) or "no piece"
            if auto:
                return ("not checked: %s shows none of this rank's parameters as the engine "
                        "holds them (%s)" % (checkpoint, why))
            raise ValueError("checkpoint %s shows none of this rank's %d parameters (%s): "
                             "nothing compared; give the checkpoint the engine loaded, or "
                             "checkpoint=False" % (checkpoint, len(items), why))
        out = {k: rep[k] for k in ("checkpoint", "pieces", "elements", "seconds")}
        # The first few: a rank whose experts were all skipped must not
        # read as checked.
        out["skipped"] = len(rep["skipped"])
        out["skipped_first"] = rep["skipped"][:5]
        return out

    def moved(self):
        """["name (why)"] of the parameters that are not what was attached:
        memory moved (re-allocated), and, when the parameters were given
        as a callable, a different object under the name (replaced), a
        name gone (removed) or a new one (added)."""
        return parameters_changed(
            self._where, self._resolve and dict(select_parameters(self._resolve(),
                                                                  *self._select)[0]),
            lambda t, p, cur: ("replaced by a new object" if cur is not t else
                               "re-allocated" if t.data_ptr() != p else None))

    def released(self, why):
        """The engine released its weights' physical memory (vLLM's sleep
        mode, SGLang's release_memory_occupation: the addresses stay,
        nothing is mapped there): until restored(), sync() refuses,
        naming `why`, before anything touches that memory (a copy there
        would fault and leave the process's CUDA context unusable).
        A sync of this rank running in another thread when it is called
        ends first: one waiting for a version to be published is
        cancelled (wex_cancel: it raises WexError with code ECANCELED,
        nothing copied), one copying completes; released() returns once
        it has ended, logging a warning every 5 s it waits, so the engine
        releases nothing under a copy, and a trainer that waits for the
        engine's memory before it publishes does not wait on a sync that
        waits for that publish.  A sync that starts after it is refused.
        (Against a wexd that predates cancels, the wait runs to its
        publish or timeout, with a warning saying so.)  Called from a
        thread inside a sync of this rank: ValueError (it would wait for
        itself).  Interrupted while it waits (KeyboardInterrupt): the
        weights count as not released, and the exception propagates."""
        with self._syncs:
            if threading.get_ident() in self._syncing:
                raise ValueError("released(%r) called from inside a sync of this rank: the "
                                 "sync must return before the weights' memory is released"
                                 % (why,))
            before, self.released_why = self.released_why, why
            t0 = warned = time.monotonic()
            try:
                while self._syncing:
                    # Again each turn: a sync counted here may not have
                    # reached its wait (or libwex) yet; a cancel of one
                    # that copies changes nothing.
                    self._cancel_syncs(why)
                    self._syncs.wait(0.05)
                    if self._syncing and time.monotonic() - warned >= 5.0:
                        warned = time.monotonic()
                        log.warning("wex: %s: rank %d of %s waits %.0f s for a sync to end "
                                    "before the weights' memory is released (its copy runs)",
                                    why, self.rank, self.group, warned - t0)
            except BaseException:
                self.released_why = before
                raise

    def _cancel_syncs(self, why):
        """Cancels the wait of this rank's sync running in another thread
        (under _syncs, from released())."""
        client = self.client
        if client is None:
            return
        try:
            client.cancel()
        except wex.WexError as e:
            if not self._cancel_warned:
                self._cancel_warned = True
                log.warning("wex: %s: rank %d of %s cannot cancel a sync waiting for a "
                            "version (%s)%s", why, self.rank, self.group, e,
                            ": the release waits for its publish or timeout"
                            if e.code == errno.EOPNOTSUPP else "")

    def restored(self, kept):
        """The weights' memory is mapped again.  kept: it holds what it
        held before released() (a CPU backup was copied back); otherwise
        it holds nothing meaningful: forget() at once (so wexd, and
        check_group, no longer count this rank as holding its version),
        or, where that fails, at the next sync, which copies the whole
        version again, even one this rank held.  Until a sync succeeds,
        dirty() is True and describe()["lost"] says why.  Never raises
        for a failed forget() (it runs inside the engine's wake-up).
        Syncs stay refused until it returns."""
        try:
            if kept:
                return
            self.lost = "the engine's memory was released and mapped again without its bytes"
            self._forget_pending = True
            try:
                self.forget()
            except Exception as e:  # the next sync tries again, and raises
                self.lost += " (attaching again failed: %s; the next sync retries)" % e
        finally:
            with self._syncs:
                self.released_why = None

    def overwritten(self, why):
        """The engine wrote other weights into the attached parameters in
        place (a reload of its own, `why`): they are whole, but not the
        version this rank holds.  forget() at once (so wexd, and
        check_group, no longer count this rank as holding it), or, where
        that fails, at the next sync, which copies the whole version
        again, even one this rank held.  Returns whether it forgot (False:
        wexd still counts the version; close() the rank where that must
        not stand).  Never raises.  A sync of this rank waiting for a
        version in another thread holds the client until it is published:
        its wait is cancelled (WexError ECANCELED naming `why`, nothing
        copied), so this returns now, not then."""
        with self._syncs:
            self._forget_pending = True
            self._overwrites = (self._overwrites[0] + 1, why)
            # Only these are cancelled: a sync begun after this call sees
            # _forget_pending and forgets first itself (cancelling it, as
            # was done, failed a sync that would copy the whole version).
            before = set(self._entries)
        client = self.client
        try:
            while client is not None and not client._lock.acquire(timeout=0.05):
                with self._syncs:
                    old = before & self._entries
                if old:
                    self._cancel_syncs(why)
                elif not self._forget_pending:
                    return True  # a sync begun since forgot, and holds the client
            try:
                # (A sync begun since may have forgotten, copied the whole
                # version and ended before this got the client: forgetting
                # again would undo that copy in wexd's count.)
                if client is not None and not self._forget_pending:
                    return True
                self.forget()
            finally:
                if client is not None:
                    client._lock.release()
        except Exception as e:  # the next sync tries again, and raises
            log.warning("wex: %s: rank %d of %s could not forget its version (%s); the next "
                        "sync retries", why, self.rank, self.group, e)
            return False
        return True

    def forget(self):
        """The parameters no longer hold what wex copied into them (the
        engine lost or overwrote their bytes): attaches them again, so
        the next sync copies every byte of its version, even one this
        rank holds (a sync of the version held copies nothing
        otherwise).  One round trip to wexd; where it fails, the next sync
        attaches again first."""
        client = self.client  # (close() in another thread sets it None)
        if client is None:
            raise ValueError("this engine rank is closed")
        # Where this fails, the next sync forgets first (the caller said
        # the bytes are lost: a sync of the version held copies nothing).
        self._forget_pending = True
        # (An overwritten() from here on may follow bytes written after
        # the attach below, and a sync in another thread that copied the
        # version over them in between: that forget stays pending.)
        asked = self._overwrites[0]
        moved = self.moved()
        if moved:
            raise ValueError("the engine re-allocated or replaced %d parameter(s) since they "
                             "were attached (%s): detach and attach again"
                             % (len(moved), ", ".join(moved[:3])))
        torch_util.attach_module(client, [(n, t) for n, t, _ in self._where],
                                 layout=self.layout, rank=self.rank if self.layout else None)
        self.version = 0
        self.forgotten += 1
        if self._overwrites[0] == asked:
            self._forget_pending = False

    def sync(self, min_version=0, timeout_ms=0, verify=False):
        """Copies the newest published version (at least min_version,
        waiting up to timeout_ms for it; 0: the client's timeout_ms if
        given, else wexd's sync_timeout_ms) into the parameters in place;
        verify=True compares every byte with the trainer's before
        returning.  libwex first waits for the process's queued GPU work
        (the engine's kernels that read the weights).  Returns a dict:
        version, bytes, ops, seconds, changed, waited, verified,
        verify_seconds (libwex's struct wex_sync_result), rank, group and
        wall_seconds.  Raises ValueError, before anything is copied,
        while the weights' memory is released (released(): wake it
        first), and, naming them, when the engine re-allocated or
        replaced parameters since attach (moved(); attach again).  The
        first sync after restored(kept=False) copies the whole version,
        even one this rank held.  wex.WexError with code ECANCELED,
        nothing copied, when released() in another thread cancelled its
        wait for a version.  wex.WexError otherwise (the
        weights are dirty on EVERIFY and on a copy that failed half-way,
        dirty() says so: the next sync copies everything again)."""
        me, entered = threading.get_ident(), False
        seen = self._overwrites[0]
        try:
            with self._syncs:
                if self.client is None or self._closing:
                    raise ValueError("this engine rank is closed")
                if self.released_why is not None:
                    raise ValueError("%s: the weights' memory is released (nothing is mapped "
                                     "at their addresses); wake the engine's weights first; "
                                     "nothing copied" % self.released_why)
                self._syncing[me] = self._syncing.get(me, 0) + 1
                token = object()
                self._entries.add(token)
                entered = True
            return self._sync(min_version, timeout_ms, verify)
        except wex.WexError as e:
            if e.code == errno.ECANCELED and self._closing:
                raise wex.WexError(errno.ECANCELED, "this engine rank is being closed: this sync "
                                   "was cancelled while it waited for a version; nothing "
                                   "copied") from e
            if e.code == errno.ECANCELED and self.released_why is not None:
                raise wex.WexError(errno.ECANCELED, "%s: the weights' memory is being "
                                   "released: this sync was cancelled while it waited for a "
                                   "version; nothing copied (sync again once the weights are "
                                   "back)" % self.released_why) from e
            if e.code == errno.ECANCELED and self._overwrites[0] != seen:
                raise wex.WexError(errno.ECANCELED, "%s: the engine overwrote the weights "
                                   "in place: this sync was cancelled while it waited for a "
                                   "version; nothing copied (sync again: it copies the whole "
                                   "version)" % self._overwrites[1]) from e
            raise
        finally:
            if entered:
                with self._syncs:
                    self._entries.discard(token)
                    self._syncing[me] -= 1
                    if not self._syncing[me]:
                        del self._syncing[me]
                    self._syncs.notify_all()

    def _sync(self, min_version, timeout_ms, verify):
        moved = self.moved()
        if moved:
            raise ValueError("the engine re-allocated or replaced %d parameter(s) since they "
                             "were attached (%s%s): the engine no longer reads the memory wex "
                             "would write; nothing copied, detach and attach again"
                             % (len(moved), ", ".join(moved[:3]),
                                " ..." if len(moved) > 3 else ""))
        if self._forget_pending:
            self.forget()
        t0 = time.monotonic()
        r = self.client.sync(wex.SYNC_COPY, min_version=min_version, timeout_ms=timeout_ms,
                             verify=verify)
        self.lost = None
        self.version = r.version
        out = r.as_dict()
        if not verify:
            out["verified"], out["verify_seconds"] = 0, 0.0
        out.update(rank=self.rank, group=self.group, wall_seconds=time.monotonic() - t0)
        return out

    def dirty(self):
        """True when the weights are mixed (a copy failed half-way, or a
        verification found a difference) or lost (restored(kept=False))
        until a sync succeeds."""
        client = self.client  # (close() in another thread sets it None)
        if client is None:
            return False
        if self.lost is not None:
            return True
        try:
            return client.is_dirty()
        except wex.WexError as e:
            # (Closed in another thread since: closed counts as not dirty,
            # as above; was WexError EBADF "client is closed".)
            if e.code == errno.EBADF and self.client is None:
                return False
            raise

    def describe(self):
        """What is attached: a dict for logs and RPC replies."""
        return {"model": self.model, "group": self.group, "rank": self.rank,
                "world_size": self.world_size,
                "layout": self.layout.spec if self.layout else "canonical",
                "tensors": self.tensors, "bytes": self.bytes, "ignored": list(self.ignored),
                "version": self.version, "checkpoint_check": self.checked,
                "released": self.released_why, "lost": self.lost, "forgotten": self.forgotten}

    def close(self):
        """Detaches this rank (its client closes).  A sync of this rank
        running in another thread ends first, as for released(): one
        waiting for a version is cancelled (WexError ECANCELED, nothing
        copied), one copying completes; syncs after it, or started while
        it waits, raise ValueError.  Called from inside a sync of this
        rank: ValueError (it would wait for itself)."""
        with self._syncs:
            client = self.client
            if client is None:
                return
            if threading.get_ident() in self._syncing:
                raise ValueError("close() called from inside a sync of this rank: the sync "
                                 "must return first")
            self._closing = True
            t0 = warned = time.monotonic()
            try:
                while self._syncing:
                    self._cancel_syncs("close")
                    self._syncs.wait(0.05)
                    if self._syncing and time.monotonic() - warned >= 5.0:
                        warned = time.monotonic()
                        log.warning("wex: close: rank %d of %s waits %.0f s for a sync to end",
                                    self.rank, self.group, warned - t0)
            except BaseException:
                self._closing = False
                raise
            self.client = None
        client.close()
        if self._own_layout:
            self.layout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
