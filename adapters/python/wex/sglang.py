# SPDX-License-Identifier: MIT
"""wex.sglang - the weight-sync hook inside SGLang's scheduler processes.

SGLang runs a custom weight loader named on its command line in every
TP worker, with the worker's model, when update_weights_from_tensor
names it as load_format.  wex's loader takes no tensors: the request
(wex.sglang.request) carries what to sync, and each worker copies the
trainer's newest version into its own parameters in place:

    # server: python -m sglang.launch_server ... --custom-weight-loader wex.sglang.load
    # (Engine(..., custom_weight_loader=["wex.sglang.load"]) in Python)
    import wex.sglang
    engine.update_weights_from_tensor(
        wex.sglang.request(model="policy", group="rollout0", min_version=step),
        load_format="wex.sglang.load")
    wex.sglang.check("policy", "rollout0", step)   # raises unless every rank has it

An SGLang with weight-update sessions (2026: /begin_weight_update and
/end_weight_update) takes update_weights_from_tensor only inside one
(without it the request is refused, or an assertion stops the server):
open one before the request, end it after.

The first request of a worker attaches its parameters (SGLang's names:
qkv_proj, gate_up_proj, w13_weight, a padded vocabulary) as rank
tp_rank + tp * pp_rank of the layout SGLang's server arguments describe
("sglang:tp=T,pp=P"; ",dp=N,dp_attention=1" with --enable-dp-attention
or --attn-dp-size, ",ep=E" with --ep-size, dp_lm_head, dense_tp (for
DeepSeek: other models build no MLP by it), a2a (for a model with
shared experts: without them an all-to-all backend is ep=tp alone),
each as SGLang resolved it, and fuse_shared when
the model fused DeepSeek's shared expert), from the model's config.json
(its directory, or the local Hugging Face cache), but for the KV-cache
scales an FP8 model's attention holds (attn.k_scale, attn.v_scale: left
as SGLang set them); `layout=` gives another
spec (",ep=E" only for a model with experts).  Later requests must ask
for the same model, group and layout.  Each sync enumerates the model's
parameters again: one the engine replaced or re-allocated since attach
is refused by name, nothing copied (detach, then attach again).  SGLang's
other weight updates (update_weights_from_disk, _from_distributed,
_from_tensor with another load_format) write through the model's
load_weights, which the attach wraps: after one the rank forgets its
version (check() no longer counts it) and the next request copies the
whole version again (load_format "direct" is not seen).  A model
with post_load_weights() (DeepSeek's MLA keeps w_kc/w_vc, copies of
kv_b_proj) has it run after each sync that changed the weights, or that
returned a version no earlier request of this rank returned (a copy
that completed before its request failed: wexd did not answer its
release in time), not again for the version it ran for, unless
post_load=False; post_load=True on a model without it is refused before
anything is attached or copied.
A block-FP8 model that SGLang requantizes to UE8M0 for DeepGEMM
(DEEPGEMM_SCALE_UE8M0: SM100, and SM120 in some releases) is refused at
attach, saying so: its scales become packed int32 tensors in new
memory, which the trainer's F32 block scales cannot be copied into
(SGLANG_ENABLE_JIT_DEEPGEMM=0 turns that off).

Before the first attach, where SGLang loaded the model's safetensors
(load_format auto, safetensors or fastsafetensors) and no sync changed
the weights since,
each worker compares samples of every piece it holds with the
checkpoint where the layout places them (wex.checkpoint): a tensor
SGLang or a kernel backend re-laid out or transformed after loading,
keeping its shape, is refused by name (logged), instead of being
written where a kernel reads something else.  With dummy weights
nothing is compared (status() and the attach log say so).

Errors.  SGLang stops the whole server when a loader raises, and ignores
what a loader returns.  So a failure that leaves the weights as they
were (a refusal at attach, no version in time, wexd unreachable) is
logged, not raised: the worker keeps serving the version it holds, and
check() (wexd's view of the group) tells the driver.  A failure that
leaves them mixed (a copy interrupted half-way, a verification that found
a difference, post_load_weights() failing after a sync that changed
the weights: MixedWeights) raises: serving mixed weights is worse than
stopping.  After a post_load_weights() failure the rank is also detached,
so check() names it as not attached; status() says mixed=True.

Refused (logged): --dp N without --enable-dp-attention (independent
replicas that a worker cannot tell apart: run one engine per replica,
each its own group), EPLB and redundant experts (experts move between
ranks), attention context parallelism and --moe-dp-size, and for a
model with experts a MoE runner backend that re-lays out their weights
after loading (--moe-runner-backend other than auto, triton or deep_gemm,
as SGLang resolved it: "auto" becomes flashinfer_trtllm on SM100 for
DeepSeek-V3 and Qwen3-MoE FP8; an older SGLang's
--enable-flashinfer-*-moe and --enable-triton-kernel-moe), and
SGLANG_USE_AITER on ROCm for a model with experts or block-FP8 weights
(AITER shuffles them in place).  Skipped
(logged): the draft model of speculative decoding (the loader is called
for it too; it holds other tensors).

Memory saver: the first request wraps pause() and resume() of
torch_memory_saver's TorchMemorySaver class, which SGLang's
release_memory_occupation and resume_memory_occupation call (on the
process-wide instance, or on one of SGLang's own before its memory
tags).  While the weights are released nothing
is mapped at their addresses: requests are refused (logged; check()
names the rank) before anything touches them; resume them first.
Resumed without --enable-weights-cpu-backup they hold nothing
meaningful: each rank forgets its version at once (check() no longer
counts it), the next request copies the whole version, and the
checkpoint is not compared again; until one succeeds the weights count
as lost, and a request that fails raises, as for mixed weights.  A
release before the first request is not seen by the hook (nothing is
wrapped yet); libwex refuses that request where the CUDA driver reports
nothing mapped at the weights (wex.released): send the first request
while the weights are resident.

SGLang flushes its cache after an update (flush_cache=True) and
asserts that the flush worked, which it does not while requests run or
wait: pause generation or drain the server before the request (or pass
flush_cache=False and flush once it is idle).  The draft is recognised by
its class name (NextN, Eagle, MTP, Draft), or, for a STANDALONE draft of
a plain model class, by its config's checkpoint path
(--speculative-draft-model-path).  One the hook does not recognise is
refused (logged): by the target's layout, or, once the target is
attached, as a second model for the same rank; SGLang calls the loader
for the draft first, so a draft recognised by neither and shaped as the
target would take the rank on the first request (the target is then
refused): give such a draft another class or path.
"""
import json
import logging
import os
import weakref

import wex
import wex.checkpoint
from wex.engine import (EngineRank, check_group, checkpoint_for, config_path, fp8_block_size,
                        has_experts, selection, stages_from_env)

__all__ = ["request", "load", "check", "status", "parallel_info", "default_spec",
           "MixedWeights"]

log = logging.getLogger("wex.sglang")

PREFIX = "wex:"
_ATTACH_KEYS = ("model", "group", "layout", "config", "adapters", "socket", "timeout_ms",
                "copy_threads", "strip_prefix", "ignore")
# checkpoint is read when a request attaches, and need not be repeated.
_SYNC_KEYS = ("min_version", "sync_timeout_ms", "verify", "post_load", "detach", "checkpoint")
_DRAFT_CLASSES = ("NextN", "Eagle", "MTP", "Draft")
_ranks = {}   # id(model) -> (EngineRank, attach arguments, model: kept, so the id stays its)
_status = {}  # id(model) -> the last request's outcome, for status()
# id(model) -> the version its rank's last successful sync returned (see
# _load: post_load_weights is owed for a version the hook never saw).
_served = {}
# model -> why its weights are not the ones SGLang loaded: True (a sync
# changed them) or a reason (checkpoint_for's `updated`).
_changed = weakref.WeakKeyDictionary()
# model -> ((attach arguments, checkpoint), message) of its last attach
# refused by the checkpoint comparison.
_refused = weakref.WeakKeyDictionary()
_seen = weakref.WeakSet()  # models attached at some point
# While SGLang's weights are released (torch_memory_saver paused): why.
_released = None
_WEIGHTS_TAG = "weights"  # SGLang's GPU_MEMORY_TYPE_WEIGHTS
# The KV-cache scales of each RadixAttention in a model SGLang builds with
# an FP8 quant_config (layers/quantization/kv_cache.py BaseKVCacheMethod,
# which Fp8Config.get_quant_method gives a RadixAttention: LlamaAttention's
# attn, DeepSeek's attn_mqa, attn_mha and attn_mqa_for_dcp_decode): scalar
# Parameters beside the weights, in no layout and no trainer's; never
# synced, left as SGLang set them.
_KV_SCALES = ("*.attn*.k_scale", "*.attn*.v_scale")


def _watch_memory_saver():
    """Wraps pause() and resume() of torch_memory_saver's TorchMemorySaver
    class (the class of its process-wide instance), which SGLang's
    release_memory_occupation and resume_memory_occupation call with tag
    "weights" (or None: every tag): on the process-wide instance, or, in
    SGLang before its memory tags (mid 2025), on a TorchMemorySaver() of
    its own (pause() with no tag), which a wrapper of the instance alone
    would not see.  While the weights are paused nothing is mapped at
    their addresses: requests are refused (logged, check() names the
    rank) before anything touches them.  Resumed without a CPU backup
    (SGLang's --enable-weights-cpu-backup), they hold nothing
    meaningful: each rank forgets its version (check() no longer counts
    it), the next request copies the whole version, and the checkpoint
    is not compared again.
    A pause or resume that raises counts as a resume that lost them
    (libwex refuses what is left unmapped); the wrappers never raise but
    what torch_memory_saver raises.  Nothing to
    watch where torch_memory_saver is not installed (SGLang cannot
    release memory then)."""
    global _unwatched
    try:
        import torch_memory_saver
    except ImportError:
        return
    saver = getattr(torch_memory_saver, "torch_memory_saver", None)
    cls = type(saver) if saver is not None else \
        getattr(torch_memory_saver, "TorchMemorySaver", None)
    if not isinstance(cls, type) or not callable(getattr(cls, "pause", None)) or \
            not callable(getattr(cls, "resume", None)):
        if not _unwatched:
            _unwatched = True
            log.warning("wex: this torch_memory_saver has no TorchMemorySaver class to "
                        "watch: a request while SGLang's weights are released "
                        "is not refused, and resumed weights are not known to be lost")
        return
    if cls.__dict__.get("_wex_wrapped", False):
        return
    pause, resume = cls.pause, cls.resume

    def weights(args, kwargs):
        tag = kwargs.get("tag", args[0] if args else None)
        return tag is None or tag == _WEIGHTS_TAG

    def wex_pause(self, *args, **kwargs):
        global _released
        if not weights(args, kwargs):
            return pause(self, *args, **kwargs)
        before, _released = _released, ("SGLang released its weights' memory "
                                         "(release_memory_occupation)")
        told = []
        try:  # each waits for a sync of its rank running in another thread
            for rank, _, _ in list(_ranks.values()):
                rank.released(_released)
                told.append(rank)
        except BaseException:  # interrupted: nothing paused (by this call)
            _released = before
            if before is None:
                for rank in told:
                    rank.restored(True)
            raise
        try:
            return pause(self, *args, **kwargs)
        except BaseException:
            # SGLang goes on as if it had not paused, with some of the
            # memory released perhaps: libwex refuses what is not mapped,
            # and what is holds nothing certain.
            _back(False, "an SGLang pause that failed may have discarded the weights")
            raise

    def wex_resume(self, *args, **kwargs):
        if not (weights(args, kwargs) and _released is not None):
            return resume(self, *args, **kwargs)
        try:
            out = resume(self, *args, **kwargs)
        except BaseException:
            # As above: what is mapped now holds nothing certain.
            _back(False, "an SGLang resume that failed may have discarded the weights")
            raise
        try:
            kept = bool(getattr(_server_args(), "enable_weights_cpu_backup", False))
        except Exception:
            kept = False
        _back(kept)
        return out

    cls.pause, cls.resume = wex_pause, wex_resume
    cls._wex_wrapped = True


_unwatched = False  # warned that torch_memory_saver cannot be watched


def _back(kept, why=None):
    """SGLang's weights are mapped again (or their pause or resume
    raised: `why`): every attached rank is told; without their bytes (not
    kept), no model attached before is compared with the checkpoint again
    (a model never attached still is: its refusal stands)."""
    global _released
    _released = None
    for rank, _, _ in _ranks.values():
        rank.restored(kept)  # never raises
    if not kept:
        for model in _seen:
            _changed[model] = why or ("SGLang released the weights and resumed them "
                                      "without their bytes (no --enable-weights-cpu-backup)")


def request(model, *, group=None, layout=None, config=None, adapters=None, socket=None,
            timeout_ms=None, copy_threads=None, strip_prefix=None, ignore=(), min_version=0,
            sync_timeout_ms=0, verify=False, post_load=None, detach=False, checkpoint=None):
    """The named_tensors for engine.update_weights_from_tensor(...,
    load_format="wex.sglang.load"): one (name, tensor) pair whose name
    carries the arguments (SGLang sends names as they are to every
    worker; the tensor, empty, is there because it wants one).  Under
    torch.multiprocessing's default sharing strategy, file_descriptor,
    torch pickles an empty tensor by value, so the request also goes
    through SGLang's HTTP API and to every rank; under "file_system" it
    pickles even an empty tensor as the name of a shared-memory file,
    which a rank in another container or host cannot open: refused
    (ValueError) while that strategy is set.  sync_timeout_ms: how long a sync waits
    for min_version (0: timeout_ms if given, else wexd's
    sync_timeout_ms); timeout_ms: the client's, for each call to wexd.
    post_load: None runs the model's post_load_weights() where it has
    one, True requires it, False never.  detach=True closes the worker's
    client (of this model and group) instead of syncing.  checkpoint: the
    safetensors checkpoint SGLang loaded, compared in samples with each
    worker's tensors where the layout places each piece when it attaches
    (a tensor re-laid out or transformed after loading is refused, naming
    it: wex.checkpoint); None: the model's directory (or its hub cache
    snapshot) when SGLang loaded its safetensors (load_format auto,
    safetensors or fastsafetensors; not dummy); False: never (the weights
    were updated by other means since they were loaded).  Either way not
    once a sync changed the weights.  Read when a request attaches; later
    requests need not repeat it."""
    import torch

    if not model or not isinstance(model, str):
        raise ValueError("request: model must be the name the trainer publishes under")
    # torch/multiprocessing/reductions.py, reduce_storage: the file_system
    # strategy is tested before the empty-storage case (pickled by value).
    import torch.multiprocessing
    if torch.multiprocessing.get_sharing_strategy() == "file_system":
        raise ValueError("request: torch.multiprocessing's sharing strategy is 'file_system', "
                         "under which torch pickles even the request's empty tensor as a "
                         "shared-memory file name that an SGLang rank in another process "
                         "tree, container or host cannot open; set 'file_descriptor' "
                         "(torch.multiprocessing.set_sharing_strategy) around this call and "
                         "update_weights_from_tensor")
    # (Lists, whatever they were given as: generators included.)
    strip_prefix, ignore = selection(strip_prefix, ignore)
    args = {"model": model, "group": group, "layout": layout, "config": config,
            "adapters": adapters, "socket": socket, "timeout_ms": timeout_ms,
            "copy_threads": copy_threads,
            "strip_prefix": list(strip_prefix), "ignore": list(ignore),
            "min_version": int(min_version), "sync_timeout_ms": int(sync_timeout_ms),
            "verify": bool(verify), "post_load": post_load if post_load is None else
            bool(post_load), "detach": bool(detach),
            "checkpoint": _path_arg(checkpoint)}
    return [(PREFIX + json.dumps(args, sort_keys=True), torch.empty(0, dtype=torch.uint8))]


def _path_arg(checkpoint):
    if checkpoint is None or checkpoint is False:
        return checkpoint
    try:
        return os.fspath(checkpoint)
    except TypeError:
        raise ValueError("request: checkpoint must be a path, False or None, not %r"
                         % (checkpoint,)) from None


def _parse(named_tensors):
    named = list(named_tensors)
    if len(named) != 1 or not isinstance(named[0][0], str) or \
            not named[0][0].startswith(PREFIX):
        raise ValueError("wex.sglang.load takes the named_tensors of wex.sglang.request(...), "
                         "not %d tensors (%s)" % (len(named),
                                                  ", ".join(str(n) for n, _ in named[:3])))
    try:
        args = json.loads(named[0][0][len(PREFIX):])
    except ValueError as e:
        raise ValueError("wex.sglang.load: the request's arguments are not JSON: %s" % e)
    if not isinstance(args, dict) or not isinstance(args.get("model"), str):
        raise ValueError("wex.sglang.load: the request names no model")
    unknown = sorted(set(args) - set(_ATTACH_KEYS) - set(_SYNC_KEYS))
    if unknown:
        raise ValueError("wex.sglang.load: unknown arguments %s" % ", ".join(unknown))
    return args


def _server_args():
    """SGLang's server arguments: get_global_server_args(), or, in an
    SGLang that retired it (it raises RuntimeError there),
    runtime_context.get_server_args() (the same arguments as given: read
    settings through _resolved, which prefers what SGLang resolved);
    None where neither answers (not an SGLang worker, or an SGLang with
    neither: then the layout must be given)."""
    try:
        from sglang.srt.server_args import get_global_server_args
    except ImportError:
        get_global_server_args = None
    if get_global_server_args is not None:
        try:
            return get_global_server_args()
        except ValueError:  # "Global server args is not set yet!" (not an SGLang worker)
            return None
        except RuntimeError:  # "get_global_server_args() is retired": runtime_context
            pass
    try:
        from sglang.srt.runtime_context import get_server_args
    except ImportError:
        return None
    try:
        return get_server_args()
    except (ValueError, RuntimeError, AttributeError):  # nothing published yet
        return None


_MISSING = object()


def _resolved(sa):
    """A reader of SGLang's settings by ServerArgs field name:
    get(name, default).  An SGLang with sglang.srt.runtime_context keeps
    its ServerArgs as given ("get_server_args() retains the raw input for
    diagnostics") and publishes what it resolved (ep_size = tp_size under
    an all-to-all MoE backend, --dp N --enable-dp-attention moved to
    attn_dp_size, the DeepSeek prefill-CP and DWDP settings, ...) in
    namespace accessors: get_parallel() for the parallel namespace,
    get_context().config_leaf(name) for the others, and, on an
    unpublished record, arg_groups.overrides.resolution_result(sa, name).
    Those come first, in that order, where they answer; then the field
    itself (an older SGLang resolved ServerArgs in place, in
    __post_init__)."""
    import importlib

    readers = []
    try:
        rc = importlib.import_module("sglang.srt.runtime_context")
    except ImportError:
        rc = None
    if rc is not None:
        if callable(getattr(rc, "get_parallel", None)):
            readers.append(lambda n: getattr(rc.get_parallel(), n))
        if callable(getattr(rc, "get_context", None)):
            readers.append(lambda n: rc.get_context().config_leaf(n))
        try:
            rr = importlib.import_module("sglang.srt.arg_groups.overrides").resolution_result
        except (ImportError, AttributeError):
            rr = None
        if callable(rr):
            readers.append(lambda n: rr(sa, n, _MISSING))

    def get(name, default=None):
        for read in readers:
            try:
                value = read(name)
            except Exception:  # not published here, not a leaf, not this SGLang's
                continue
            if value is not _MISSING:
                return value
        return getattr(sa, name, default)
    return get


def parallel_info():
    """This SGLang worker's parallel state: tp, tp_rank, pp, pp_rank
    (sglang.srt.distributed's groups) and, from the server arguments as
    SGLang resolved them (_resolved), dp, dp_attention, ep, dp_lm_head,
    dense_tp, a2a, eplb, attn_cp, moe_dp and model_path, load_format,
    revision (None for those an older SGLang does not say).  dp is the
    attention data-parallel width where SGLang says one (attn_dp_size >
    1: dp_attention), else dp_size (replicas, or an older SGLang's
    --dp with --enable-dp-attention)."""
    from sglang.srt.distributed import get_pp_group, get_tp_group

    tp, pp = get_tp_group(), get_pp_group()
    out = {"tp": tp.world_size, "tp_rank": tp.rank_in_group, "pp": pp.world_size,
           "pp_rank": pp.rank_in_group}
    sa = _server_args()
    if sa is None:
        return dict(out, known=False, model_path=None, load_format=None, revision=None)
    get = _resolved(sa)
    a2a = get("moe_a2a_backend")
    location = get("init_expert_location")
    # SGLang with --attn-dp-size (PR #41818) resolves the deprecated
    # --dp N --enable-dp-attention to attn_dp_size N, dp_size 1 and
    # enable_dp_attention False.
    attn_dp = get("attn_dp_size")
    if isinstance(attn_dp, int) and not isinstance(attn_dp, bool) and attn_dp > 1:
        dp, dp_attention = attn_dp, True
    else:
        dp = int(get("dp_size", 1) or 1)
        dp_attention = attn_dp is None and bool(get("enable_dp_attention", False))
    out.update(
        known=True, model_path=get("model_path"),
        load_format=get("load_format"), revision=get("revision"),
        dp=dp, dp_attention=dp_attention,
        ep=int(get("ep_size", 1) or 1),
        dp_lm_head=bool(get("enable_dp_lm_head", False)),
        dense_tp=get("moe_dense_tp_size") == 1,
        a2a=a2a in ("deepep", "mooncake") or bool(get("enable_deepep_moe", False)),
        a2a_backend=a2a,
        eplb=bool(get("enable_eplb", False)) or
        int(get("ep_num_redundant_experts", 0) or 0) > 0 or
        location not in (None, "trivial"),
        attn_cp=int(get("attn_cp_size", 1) or 1),
        moe_dp=int(get("moe_dp_size", 1) or 1),
        moe_runner=getattr(get("moe_runner_backend"), "value", get("moe_runner_backend")),
        moe_flags=[n for n in _MOE_RELAYOUT_FLAGS if get(n, False) is True])
    return out


# sglang.srt.layers.moe.utils.MoeRunnerBackend values whose kernels read the
# experts' weights as the loaders wrote them (DeepGEMM's UE8M0 requant is
# refused on its own).  The others re-lay them out after loading, several
# in their shape: layers/moe/moe_runner/flashinfer_trtllm.py
# align_fp8_moe_weights_for_flashinfer_trtllm reorders w13's rows for the
# gated GEMM and shuffles w13 and w2 (shuffle_matrix_a); triton_kernel
# transposes them; server_args picks flashinfer_trtllm for "auto" on SM100
# (DeepSeek-V3, Qwen3-MoE FP8), so that is read as SGLang resolved it.
_MOE_RUNNERS_OK = (None, "auto", "triton", "deep_gemm")
# An older SGLang's switches for the same backends (before
# --moe-runner-backend).
_MOE_RELAYOUT_FLAGS = ("enable_flashinfer_trtllm_moe", "enable_flashinfer_cutlass_moe",
                       "enable_flashinfer_mxfp4_moe", "enable_flashinfer_moe",
                       "enable_triton_kernel_moe")


def _relayout(par, experts, block_fp8):
    """Why this worker's kernels read weights laid out other than as
    loaded, or None: for a model with experts a MoE runner backend that
    re-lays them out; with AITER on ROCm the experts, and a block-FP8
    model's linear weights (layers/quantization/fp8.py: Fp8MoEMethod under
    _use_aiter, and Fp8LinearMethod's bpreshuffle on gfx950, run
    shuffle_weight(..., (16, 16)) and copy it back in place)."""
    if experts:
        runner = par.get("moe_runner")
        if runner not in _MOE_RUNNERS_OK:
            return "--moe-runner-backend %s" % runner
        if par.get("moe_flags"):
            return "--%s" % par["moe_flags"][0].replace("_", "-")
    import torch
    if (experts or block_fp8) and _env_on("SGLANG_USE_AITER") and \
            getattr(torch.version, "hip", None):
        return "SGLANG_USE_AITER=%s (ROCm AITER kernels)" % os.environ["SGLANG_USE_AITER"]
    return None


def _env_on(name):
    """Whether SGLang's boolean environment variable `name` is set true
    (sglang.srt.environ EnvBool: "1", "true", "yes", "on", "y", "t", any
    case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on", "y", "t")


# The model types whose SGLang class builds dense-layer MLPs by
# --moe-dense-tp-size (enable_moe_dense_fully_dp: models/deepseek_v2.py
# DeepseekV2DecoderLayer, whole on every rank with 1); the sglang layout's
# param_model_types for dense_tp.
_DENSE_TP_TYPES = ("deepseek_v2", "deepseek_v3")


def _dense_tp_model(cfg):
    """Whether --moe-dense-tp-size changes the weights of the model of
    config.json `cfg`: DeepSeek's dense layers.  SGLang's Qwen2-MoE and
    Qwen3-MoE build every layer sparse (their decoder layers'
    is_layer_sparse is always True), and its dense models never read it,
    so theirs are laid out as without it.  True where the config cannot
    say (wex.Layout reports it)."""
    try:
        with open(cfg) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return True
    return not isinstance(c, dict) or c.get("model_type") in _DENSE_TP_TYPES


def _has_shared(cfg):
    """Whether the model of config.json `cfg` has shared experts (DeepSeek's
    n_shared_experts, Qwen2-MoE's shared_expert_intermediate_size); true
    where the config cannot say (the refusal it guards is the safe side)."""
    try:
        with open(cfg) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return True
    if not isinstance(c, dict):
        return True
    return any(isinstance(c.get(k), int) and not isinstance(c.get(k), bool) and c[k] > 0
               for k in ("n_shared_experts", "shared_expert_intermediate_size"))


def default_spec(par, fuse_shared=False, experts=True, embed_rep=False, shared=True,
                 dense=True):
    """The sglang layout spec for this worker's parallel state; refuses
    what the layout cannot describe or a worker cannot place.  experts:
    whether the model has routed experts (--ep-size is left out of a dense
    model's spec: SGLang ignores it there, the layout refuses it); shared:
    whether it has shared experts as well; dense: whether SGLang builds the
    model's dense-layer MLPs by --moe-dense-tp-size (_dense_tp_model:
    DeepSeek; it is left out of other models' spec as --ep-size is).  The
    stages SGLANG_PP_LAYER_PARTITION gives, where set, go in the spec."""
    if not par.get("known"):
        raise ValueError("SGLang's server arguments cannot be read here (neither "
                         "server_args.get_global_server_args nor "
                         "runtime_context.get_server_args answered): its parallel sizes are "
                         "unknown, pass layout= (e.g. 'sglang:tp=%d')" % par["tp"])
    if par["dp"] > 1 and not par["dp_attention"]:
        raise ValueError("SGLang --dp %d without attention data parallelism "
                         "(--enable-dp-attention, or --attn-dp-size in newer SGLang) runs "
                         "independent replicas, and a worker cannot tell which it is: run one "
                         "engine per replica, each syncing as its own group" % par["dp"])
    if par["eplb"]:
        raise ValueError("EPLB or redundant experts move experts between ranks; the sglang "
                         "layout places them in order (--init-expert-location trivial, no "
                         "--enable-eplb, --ep-num-redundant-experts 0)")
    if par["attn_cp"] > 1 or par["moe_dp"] > 1:
        raise ValueError("attention context parallelism (attn_cp_size %d) and --moe-dp-size "
                         "(%d) are not described by the sglang layout"
                         % (par["attn_cp"], par["moe_dp"]))
    # sglang.srt.layers.moe.utils.MoeA2ABackend: only deepep and mooncake are
    # described (a2a=1); mori, nixl, flashinfer, ascend_fuseep, megamoe, ...
    # place routed or shared experts otherwise.
    if experts and shared and _env_on("SGLANG_SHARED_EXPERT_TP1"):
        # models/deepseek_v2.py DeepseekV2MoE: _shared_expert_use_tp1 ... or
        # envs.SGLANG_SHARED_EXPERT_TP1.get() -> shared experts tp_size=1.
        raise ValueError("SGLANG_SHARED_EXPERT_TP1 is set: SGLang keeps the shared experts whole "
                         "on every rank, which the sglang layout does not describe; unset it "
                         "or pass layout=")
    if experts and par.get("a2a_backend") not in (None, "none", "deepep", "mooncake"):
        raise ValueError("--moe-a2a-backend %s is not described by the sglang layout (only "
                         "deepep and mooncake are: a2a=1); pass layout= if you know its "
                         "placement" % par["a2a_backend"])
    spec = "sglang:tp=%d" % par["tp"]
    if par["pp"] > 1:
        spec += ",pp=%d" % par["pp"] + stages_from_env("SGLANG_PP_LAYER_PARTITION", par["pp"])
    if par["dp"] > 1:
        spec += ",dp=%d,dp_attention=1" % par["dp"]
    if par["ep"] > 1 and experts:
        spec += ",ep=%d" % par["ep"]
    for key in ("dp_lm_head", "dense_tp", "a2a"):
        # a2a=1 says where the shared experts are (whole on every rank);
        # without them an all-to-all backend changes nothing ep=tp does
        # not say (models/qwen3_moe.py Qwen3MoeSparseMoeBlock builds its
        # experts over moe_ep/moe_tp alike under DeepEP), and a2a=1
        # would refuse such a model (the layout describes it for DeepSeek).
        # dense_tp=1 likewise: only DeepSeek builds MLPs by it.
        if par[key] and (key != "a2a" or (experts and shared)) and \
                (key != "dense_tp" or dense):
            spec += ",%s=1" % key
    if embed_rep and par["dp"] > 1 and par["dp_attention"]:
        spec += ",embed_rep=1"
    if fuse_shared:
        spec += ",fuse_shared=1"
    return spec


def _block_fp8(cfg):
    """Whether config.json `cfg` is of a block-quantized FP8 checkpoint
    (quantization_config with weight_block_size); False where it cannot
    be read (wex.Layout reports it)."""
    try:
        return bool(fp8_block_size(cfg))
    except (OSError, ValueError):
        return False


def _ue8m0_requant(cfg):
    """Whether SGLang rewrites this model's FP8 weights and scales to
    UE8M0 after loading (DeepGEMM on SM100, and SM120 in some
    releases: deep_gemm_wrapper's DEEPGEMM_SCALE_UE8M0, in
    sglang.srt.layers or, in older SGLang,
    sglang.srt.layers.quantization; for FP8 checkpoints quantized in
    128x128 blocks: fp8_utils requantizes no other block size, and older
    SGLang asserts it).  A config.json that cannot be read is not judged
    here (wex.Layout reports it)."""
    import importlib

    flag = False
    for where in ("sglang.srt.layers.deep_gemm_wrapper",
                  "sglang.srt.layers.quantization.deep_gemm_wrapper"):
        try:
            flag = bool(getattr(importlib.import_module(where), "DEEPGEMM_SCALE_UE8M0", False))
            break
        except ImportError:
            continue
    if not flag:
        return False
    try:
        return fp8_block_size(cfg) == [128, 128]
    except (OSError, ValueError):
        return False


def _embed_whole(model, par, cfg):
    """Whether SGLang keeps embed_tokens whole on every rank under
    dp-attention (the sglang layout's embed_rep=1): with
    SGLANG_ENABLE_EMBED_REPLICATION, and in every SGLang before PR #17403
    (January 2026), which built it with enable_tp=not enable_dp_attention.
    Seen in the model: its rows are the whole vocabulary padded to 64."""
    if not (par.get("dp_attention") and par.get("dp", 1) > 1):
        return False
    if _env_on("SGLANG_ENABLE_EMBED_REPLICATION"):
        return True
    try:
        with open(cfg) as f:
            vocab = int(json.load(f)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            return p.dim() == 2 and p.shape[0] == -(-vocab // 64) * 64 and \
                par["tp"] // par["dp"] > 1
    return False


def _attach(model, args):
    par = parallel_info()
    cfg = args.get("config") or config_path(par.get("model_path"), par.get("revision"))
    ckpt, why, auto = checkpoint_for(args.get("checkpoint"), par.get("model_path"),
                                     par.get("load_format"),
                                     None if args.get("config") else cfg, _changed.get(model, False))
    if _ue8m0_requant(cfg):
        # fp8_utils.requant_weight_ue8m0_inplace: weight_scale_inv.data =
        # the UE8M0 scales packed four to an int32, in another shape, in
        # new memory (and the weights requantized to match them).
        raise ValueError("SGLang requantizes this block-FP8 model's weights and scales to "
                         "UE8M0 for DeepGEMM (DEEPGEMM_SCALE_UE8M0) after "
                         "loading: its weight_scale_inv become int32 tensors of packed "
                         "scales in new memory, which the trainer's F32 block scales cannot "
                         "be copied into, and a copy of the trainer's FP8 weights would be "
                         "read under them; start SGLang with SGLANG_ENABLE_JIT_DEEPGEMM=0")
    relayout = _relayout(par, has_experts(cfg), _block_fp8(cfg))
    if relayout:
        # Refused whatever the layout: none describes the kernels' order.
        raise ValueError("%s re-lays out the weights after loading (FlashInfer TRT-LLM "
                         "shuffles the experts' w13/w2 in their shape, AITER those and "
                         "FP8 linear weights), so a copy in the "
                         "checkpoint's order would be read wrong: start SGLang without it "
                         "(for the MoE runner: --moe-runner-backend triton, or auto where "
                         "SGLang does not resolve it to a FlashInfer backend); not attached"
                         % relayout)
    spec = args.get("layout") or default_spec(
        par, int(getattr(model, "num_fused_shared_experts", 0) or 0) > 0,
        experts=has_experts(cfg), embed_rep=_embed_whole(model, par, cfg),
        shared=_has_shared(cfg), dense=_dense_tp_model(cfg))
    layout = wex.Layout(cfg, spec, args.get("adapters"))
    device = None
    for _, t in model.named_parameters():
        if getattr(t, "is_cuda", False):
            device = t.device.index
            break
    # The bound method, not its result: each sync enumerates the
    # parameters again and refuses one the engine replaced.
    try:
        rank = EngineRank(args["model"], model.named_parameters,
                          rank=par["tp_rank"] + par["tp"] * par["pp_rank"],
                          world_size=par["tp"] * par["pp"], layout=layout,
                          group=args.get("group"), socket=args.get("socket"),
                          timeout_ms=args.get("timeout_ms"),
                          copy_threads=args.get("copy_threads"),
                          device=device, strip_prefix=args.get("strip_prefix"),
                          ignore=tuple(args.get("ignore") or ()) + _KV_SCALES, checkpoint=ckpt,
                          checkpoint_auto=auto, config=cfg,
                          adapters=args.get("adapters"))
    except ValueError as e:
        # --rl-on-policy-target: the embeddings and norms made fp32 (their
        # params_dtype, RMSNorm's weight_dtype) whatever the checkpoint's;
        # --true-on-policy-contract (sglang.srt.true_on_policy, without
        # the other in the RL frameworks that set it): the norms.
        if ": dtype F32, the layout " not in str(e):
            raise
        sa = _server_args()
        flags = [f for f, k in (("--rl-on-policy-target", "rl_on_policy_target"),
                                ("--true-on-policy-contract", "true_on_policy_contract"))
                 if getattr(sa, k, None) is not None]
        if not flags:
            raise
        both = len(flags) > 1
        raise ValueError("%s; SGLang runs with %s, which %s the %s in fp32 whatever the "
                         "checkpoint holds, and wex copies without converting dtypes: start "
                         "SGLang without %s" % (
                             e, " and ".join(flags), "keep" if both else "keeps",
                             "embeddings and norms" if getattr(sa, "rl_on_policy_target", None)
                             is not None else "norms", "them" if both else "it")) from None
    rank._own_layout = True  # (made here: closed with the rank, as one it opens)
    if why:
        rank.checked = "not checked: " + why
    return rank


class MixedWeights(RuntimeError):
    """The sync changed the weights, then post_load_weights() failed:
    the attached tensors hold the new version, what the model derives
    from them (DeepSeek's w_kc/w_vc, requantized scales) does not."""


def _load(model, args):
    attach = {k: args.get(k) for k in _ATTACH_KEYS}
    held = _ranks.get(id(model))
    if args.get("detach"):
        _refused.pop(model, None)  # the next request compares again
        if held is None:
            return None
        if (held[1]["model"], held[1]["group"]) != (args["model"], args.get("group")):
            raise ValueError("detach: this worker is attached to %r group %r, not %r group %r"
                             % (held[1]["model"], held[1]["group"], args["model"],
                                args.get("group")))
        held[0].close()
        del _ranks[id(model)]
        _served.pop(id(model), None)
        return None
    post = args.get("post_load")
    fn = getattr(model, "post_load_weights", None)
    if post and fn is None:  # before anything is attached or copied
        raise ValueError("post_load=True, but %s has no post_load_weights()"
                         % type(model).__name__)
    _watch_memory_saver()
    if held is None:
        if _released is not None:
            raise ValueError("%s: nothing is mapped at the weights' addresses; "
                             "resume_memory_occupation first; not attached" % _released)
        par = parallel_info()
        me = par["tp_rank"] + par["tp"] * par["pp_rank"]  # _attach's rank
        for other in _ranks.values():
            if other[2] is not model and (other[1]["model"], other[1]["group"], other[0].rank) \
                    == (args["model"], args.get("group"), me):
                # Another model of this worker holds that rank (a draft not
                # recognised, a second engine in one process): it would
                # take the rank over, and the two would alternate.
                raise ValueError("this worker attached %s as rank %d of %r group %r already; "
                                 "%s is another model of the same worker (a speculative-"
                                 "decoding draft?): not attached"
                                 % (type(other[2]).__name__, other[0].rank, args["model"],
                                    other[0].group, type(model).__name__))
        key = (attach, args.get("checkpoint"))
        before = _refused.get(model)
        if before is not None and before[0] == key and model not in _changed:
            # The same weights, the same request: the same difference
            # (a compare costs seconds per request on a large model).
            raise wex.checkpoint.CheckpointMismatch(
                "%s (found by this worker's first request like this one; not compared "
                "again: send detach=True to compare again, or checkpoint=False)" % before[1])
        try:
            rank = _attach(model, args)
        except wex.checkpoint.CheckpointMismatch as e:
            _refused[model] = (key, str(e))
            raise
        _refused.pop(model, None)
        _seen.add(model)
        _ranks[id(model)] = held = (rank, attach, model)
        _served.pop(id(model), None)
        _watch_load_weights(model)
        log.info("wex: attached %s", rank.describe())
    elif held[1] != attach:
        changed = sorted(k for k in _ATTACH_KEYS if held[1].get(k) != attach.get(k))
        raise ValueError("this worker is attached with other arguments (%s differ): send "
                         "detach=True first" % ", ".join(changed))
    try:
        out = held[0].sync(min_version=args.get("min_version", 0),
                           timeout_ms=args.get("sync_timeout_ms", 0),
                           verify=args.get("verify", False))
    except BaseException:
        if held[0].dirty():  # a copy that failed half-way changed them too
            _changed[model] = True
        raise
    # (As below: a version no earlier request returned was copied, if not
    # by this request, by one that then raised, not dirty.)
    seen, _served[id(model)] = _served.get(id(model)), out["version"]
    if out.get("changed") or seen != out["version"]:
        # No longer the checkpoint's: a later attach does not compare.
        _changed[model] = True
    # Only after a sync that copied something: post_load_weights rewrites
    # derived tensors (and in some models attached ones) in place, and a
    # second run over the same version need not leave them as the first.
    # Or for a version this hook never saw a sync return: a copy that
    # completed and then raised (wexd did not answer its release in time:
    # ETIMEDOUT, not dirty) left it in the weights, and its retry copies
    # nothing (changed 0).
    if fn is not None and post is not False and (out.get("changed") or
                                                 seen != out["version"]):
        try:
            fn()
        except Exception as e:
            # The weights are the new version, what post_load derives is
            # not: mixed.  Detach, so that wexd (and check()) no longer
            # count this rank as served; the next request attaches again,
            # copies everything and runs post_load_weights again.
            rank = held[0]
            del _ranks[id(model)]
            _served.pop(id(model), None)
            rank.close()
            raise MixedWeights("post_load_weights() of %s failed after the sync copied version "
                               "%d (%s: %s): detached this rank; the next request attaches "
                               "again" % (type(model).__name__, out["version"],
                                          type(e).__name__, e)) from e
        out["post_load"] = True
    log.info("wex: rank %d of %s now holds version %d (%d bytes copied in %.3f s)",
             out["rank"], out["group"], out["version"], out["bytes"], out["seconds"])
    return out


def _watch_load_weights(model):
    """Wraps `model`'s load_weights (once), through which SGLang's other
    weight updates write into the attached parameters in place:
    update_weights_from_disk (DefaultModelLoader.
    load_weights_and_postprocess), update_weights_from_distributed and
    update_weights_from_tensor with another load_format (None,
    flattened_bucket).  After one, the weights are not the version the
    rank holds: it forgets it (check() no longer counts it), and the next
    request copies the whole version again instead of nothing; where it
    cannot (the load replaced parameters), it is detached."""
    fn = getattr(model, "load_weights", None)
    if not callable(fn) or getattr(fn, "_wex_wrapped", False):
        return

    def wex_load_weights(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        finally:  # (one that raised may have written some of them)
            held = _ranks.get(id(model))
            why = "SGLang loaded other weights into %s (load_weights)" % type(model).__name__
            if held is not None and held[2] is model and not held[0].overwritten(why):
                # (It replaced or re-allocated parameters, say): detached,
                # so that wexd (and check()) no longer count the version;
                # the next request attaches again.
                del _ranks[id(model)]
                try:
                    held[0].close()
                except Exception as e:
                    log.warning("wex: %s: detaching failed: %s", why, e)
                log.warning("wex: %s: detached this rank; the next request attaches again", why)

    wex_load_weights._wex_wrapped = True
    model.load_weights = wex_load_weights


def _draft(model):
    """Why `model` is a speculative-decoding draft (SGLang calls the loader
    for the draft too, before the target), or None: its class name
    (NextN, Eagle, MTP, Draft), or, for a draft of a plain model class
    (--speculative-algorithm STANDALONE), the checkpoint its config was
    read from: --speculative-draft-model-path, not --model-path."""
    name = type(model).__name__
    if any(k in name for k in _DRAFT_CLASSES):
        return "%s is a speculative-decoding draft model" % name
    try:
        sa = _server_args()
    except Exception:
        return None
    draft = getattr(sa, "speculative_draft_model_path", None)
    cfg = getattr(model, "config", None)
    src = getattr(cfg, "name_or_path", None) or getattr(cfg, "_name_or_path", None)
    if draft and src and src == draft and draft != getattr(sa, "model_path", None):
        return ("%s was loaded from the speculative-decoding draft checkpoint %s"
                % (name, draft))
    return None


def load(model, named_tensors):
    """SGLang's custom weight loader (--custom-weight-loader
    wex.sglang.load): attaches this worker's parameters on its first
    request, then syncs them in place.  Returns the sync's dict (SGLang
    drops it; status() keeps it), None for a detach or a skipped draft
    model, or, for a failure that left the weights as they were, None
    after logging it (see the module's doc); raises when the weights are
    mixed (a copy interrupted, a verification that failed, or
    post_load_weights() failing after a sync that changed them:
    MixedWeights)."""
    name = type(model).__name__
    draft = _draft(model)
    if draft:
        log.info("wex: %s: not synced", draft)
        return None
    try:
        args = _parse(named_tensors)
        out = _load(model, args)
    except Exception as e:
        held = _ranks.get(id(model))
        mixed = isinstance(e, MixedWeights) or (held is not None and held[0].dirty())
        _status[id(model)] = {"ok": False, "mixed": mixed,
                              "error": "%s: %s" % (type(e).__name__, e)}
        if mixed:
            log.error("wex: the weights of %s are %s: %s", name,
                      "lost" if held is not None and held[0].lost else "mixed", e)
            raise
        log.error("wex: weights unchanged (%s holds version %s): %s", name,
                  held[0].version if held is not None else "none", e)
        return None
    _status[id(model)] = dict(out or {}, ok=True)
    return out


def status(model):
    """The last request's outcome in this worker for `model` (SGLang's
    model object): the sync's dict with ok=True, or ok=False, error and
    mixed (True when the request left the weights mixed)."""
    return _status.get(id(model))


def check(model, group, min_version, world_size=None, socket=None):
    """For the driver, after update_weights_from_tensor: raises
    RuntimeError unless every rank of `group` of wex model `model` was
    served min_version (wex.engine.check_group; the server's log says
    why a rank was not)."""
    return check_group(model, group, min_version, world_size=world_size, socket=socket)
