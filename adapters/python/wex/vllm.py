# SPDX-License-Identifier: MIT
"""wex.vllm - the weight-sync hook inside vLLM's worker processes.

vLLM loads a worker extension into every worker (each TP/PP/DP rank) and
runs its methods through collective_rpc:

    from vllm import LLM
    llm = LLM(model="/ckpt/qwen2", tensor_parallel_size=2,
              worker_extension_cls="wex.vllm.WorkerExtension")
    llm.collective_rpc("wex_attach", kwargs={"model": "policy", "group": "rollout0"})
    for step in ...:
        # the trainer published version `step` (wex_publish)
        llm.collective_rpc("wex_sync", kwargs={"min_version": step})
        llm.reset_prefix_cache()        # cached KV was computed with the old weights
        outputs = llm.generate(...)

wex_attach attaches the worker's own parameters (model_runner.model,
vLLM's names: qkv_proj, gate_up_proj, a padded vocabulary; a FusedMoE
layer's experts.w13_weight, which newer releases name
experts.routed_experts.w13_weight: either is taken, ignore= patterns
match either, and errors use the first) as rank
tp_rank + tp * (dp_rank + dp * pp_rank) of the layout
"vllm:tp=T,pp=P,dp=D" (",ep=T*D" with enable_expert_parallel, for a
model with experts: vLLM ignores it for a dense one), from the model's
config.json (its directory, or the local Hugging Face cache for a hub
id); `layout=` gives another spec (e.g. stages=...).  wex_sync copies
the trainer's newest version (at least min_version) into them in place,
resharded from whatever layout the trainer registered; the pointers
vLLM's CUDA graphs captured stay valid.  Each sync enumerates the
model's parameters again: one vLLM replaced (a new Parameter object, as
process_weights_after_loading makes on a reload) or re-allocated since
attach is refused by name, nothing copied (detach and attach again).
collective_rpc returns each worker's dict (with data parallelism
through vLLM's DP client, the first engine's only: check the others
with wex.engine.check_group); an error raises in the caller.

Data parallelism: for MoE models vLLM's DP ranks are one engine (dp in
the layout, one group: "{dp}" in the group name is refused there).  For
dense models each DP rank is an engine of its own (vLLM's own DP
launcher resets its data_parallel_size to 1): give each its own group
with "{dp}" in the group name, which becomes the engine's
data_parallel_index (group="rollout-{dp}"); attaching a second dense
replica without it is refused.  Under distributed_executor_backend=
"external_launcher" (torchrun starts every rank) vLLM keeps
data_parallel_size D for a dense model: with "{dp}" each replica is
still a group of its own tp * pp ranks; without it, all D replicas are
one group (dp=D in the layout), which switches version together.

Pipeline parallelism: vLLM's Qwen2-MoE and Qwen3-MoE build
model.embed_tokens, model.norm and lm_head on every stage (loaded, but
read only on the first or last one); on the stages that do not read them
the layout has none of them, and wex_attach leaves them out (listed in
"ignored") instead of refusing them as unknown.

Refused, because a copy of the checkpoint's tensors would leave the
engine computing with stale or misplaced copies: MLA models (vLLM builds
W_UK/W_UV from kv_b_proj after loading; DeepSeek with VLLM_MLA_DISABLE=1
is attached as "vllm:...,no_mla=1", with ",sp_moe=1" where vLLM's
use_sequence_parallel_moe keeps the shared experts whole), EPLB and
expert_placement_strategy other than "linear" (the layout's placement is
contiguous), enable_elastic_ep, prefill context parallelism.  Models
with experts are refused where vLLM's MoE kernels re-lay out the
experts' weights in their own shape: a VLLM_USE_FLASHINFER_MOE_*
variable set true, VLLM_ROCM_USE_AITER with VLLM_ROCM_USE_AITER_MOE (its
default), a moe_backend other than auto/triton, or a FusedMoE
quant_method whose kernel backend (unquantized_backend, fp8_backend, any
other *_backend of an MoE method), which vLLM picks by platform with no
setting, is not one known to keep the weights as loaded (Triton; for
FP8 also vLLM's CUTLASS), that of the method a FusedMoEModularMethod
wraps (old_quant_method: vLLM swaps it in after loading under DP + EP)
included.  On ROCm vLLM pads the rows of the experts' weights
(VLLM_ROCM_MOE_PADDING) and of FP8 Linear weights (VLLM_ROCM_FP8_PADDING),
both on by default, after loading: the same shape and values, rows
apart, which the layout's C-order pieces cannot describe: refused,
naming the variable to set to 0.  Other transforms that
keep the shape (another backend, another version's attribute names)
are caught by comparing the worker's tensors with the safetensors
checkpoint vLLM loaded, in samples of every piece, before the first
attach (wex.checkpoint; checkpoint= of wex_attach): a tensor that does
not hold the checkpoint's values where the layout places them is
refused by name.  That needs the weights vLLM loaded from the
checkpoint: with load_format="dummy" (common in RL, where the first
sync brings the weights) nothing is compared, describe() says so, and
such transforms go unseen (verify=True cannot see them: it compares
what wex wrote, not how a kernel reads it): compare the engine's
outputs after the first sync.  Quantized models whose weights vLLM transforms after loading
into other shapes (Marlin repacking) are refused by shape.  An
unquantized checkpoint that vLLM quantizes after loading (quantization=
fp8, ptpc_fp8, experts_int8 or bitsandbytes with no quantization_config
in config.json) is refused, naming it: its kernels read vLLM's own
quantized tensors.  On ROCm GPUs whose FP8 is the fnuz variant (MI300,
gfx942) vLLM converts an FP8 e4m3fn checkpoint after loading
(normalize_e4m3fn_to_e4m3fnuz: weights viewed as e4m3fnuz, scales
doubled): refused, naming the conversion.  A
block-FP8 model (quantization_config.weight_block_size) is refused
wherever vLLM's DeepGEMM E8M0 mode is on (vllm.utils.deep_gemm's
is_deep_gemm_e8m0_used(), an older vLLM's is_blackwell_deep_gemm_used():
VLLM_USE_DEEP_GEMM with deep_gemm on Blackwell, and on Hopper in the
releases that allow it, and VLLM_USE_DEEP_GEMM_E8M0, both on by default
in recent releases) and a layer is one vLLM requantizes (a FusedMoE
layer; a Linear layer where its should_use_deepgemm_for_fp8_linear(
layer.orig_dtype, weight) holds: not with --dtype float16, nor where
DeepGEMM is unsupported), in which vLLM requantizes the layers DeepGEMM runs
after loading: their weights and F32 block scales are rewritten with
power-of-two (UE8M0) scales in place, and on Blackwell the scales then replaced by int32
tensors of packed exponents in new memory (DeepGEMM there reads only
each scale's exponent, even of F32 scales): the trainer's F32 scales
copied in would not fit or be read as other values.  Start vLLM with
VLLM_USE_DEEP_GEMM=0.  The
speculative-decoding drafter (model_runner.drafter) is not attached:
its own layers keep the weights it loaded.

Sleep mode: wex_attach wraps the worker's sleep() and wake_up().  While
the weights sleep nothing is mapped at their addresses: wex_sync (and
wex_attach) are refused, saying so, before anything touches them; wake
them first (wake_up(tags=["weights"])).  A sleep called while a
wex_sync runs in another thread cancels it if it still waits for its
version (it raises WexError ECANCELED, nothing copied), else waits for
its copy to end first (vLLM's own RPCs to a worker run one at a time,
so this concerns syncs run from threads of your own).  Waking them from a sleep of
level 2 (or any but 1, which copies a CPU backup back) leaves them
holding nothing meaningful: the next wex_sync copies the whole version,
even the one the worker held, and the checkpoint is not compared again.
Level 1 counts as kept only with vLLM's own "cumem" sleep-mode backend
(model_config.sleep_mode_backend), which backs the weights up at each
sleep; another backend (a plugin's) may copy back older bytes (a host
copy kept from its first suspend), so its wake-ups count as lost too.
Newer vLLM also sleeps by memory tag (LLM.sleep(tags=[...]), the
worker's sleep(level, tags)): tags without "weights" (the KV cache
alone) leave the weights mapped and syncs go on; with "weights" they
are discarded with no CPU backup, whatever the level, so counted lost.
The 2026 worker's discard(tags) (the executor's discard) is wrapped
too: of tags without "weights" it leaves them as they are; with
"weights" it releases them with no CPU backup, as a tag sleep.
Where the weights are released when wex_attach is called (before
anything was wrapped), vLLM's state shows it and the attach is refused:
the worker's _asleep_tags (the 2026 worker: sleep, discard and wake_up
keep it), CuMemAllocator's is_asleep of the allocations tagged "weights"
(set by any sleep, tag sleep or discard until their wake-up, in the
releases that have it), and in older ones the CPU backups of level 1 and
the saved buffers of level 2 (for a model that has buffers); an older
vLLM's tag sleep of the weights, or level 2 of a model without buffers,
leaves no trace there, but libwex refuses it where the CUDA driver
reports nothing mapped at the weights (wex.released).  A level-2 sleep
and wake-up before the first attach is not seen at all: the checkpoint
comparison then finds the weights different (the message says so):
call wex_attach before the first sleep.

Weights vLLM loads itself: wex_attach wraps the model's load_weights,
through which RL frameworks' collective_rpc updates (veRL, OpenRLHF,
vLLM's RLHF examples: model_runner.model.load_weights(weights=[(name,
tensor)])) write into the attached parameters in place, and the worker's
reload_weights (also with is_checkpoint_format=False, which copies into
the parameters without load_weights), update_weights and
finish_weight_update (the weight-transfer engine's session).
After one the rank forgets its version (check_group no longer counts
it) and the next wex_sync copies the whole version again, instead of
nothing; where it cannot (the load replaced parameters) the rank is
detached and wex_sync says so (wex_attach again).  One that raises while
the weights sleep (the 2026 worker refuses reloads and updates then)
wrote nothing and changes nothing.  A write that does not
go through load_weights (a copy of your own into the parameters) is not
seen: wex_detach and wex_attach after it.
"""
import enum
import importlib
import json
import os
import threading

import wex
from wex.checkpoint import CheckpointMismatch
from wex.engine import (EngineRank, checkpoint_for, config_path, fp8_block_size, has_experts,
                        select_parameters, stages_from_env)

__all__ = ["WorkerExtension", "parallel_info", "default_spec", "engine_names"]


def parallel_info():
    """{tp, tp_rank, pp, pp_rank, dp, dp_rank, pcp, pcp_rank} of this vLLM
    worker, from vllm.distributed.parallel_state (initialised in every
    worker)."""
    from vllm.distributed import parallel_state as ps

    out = {}
    for key, get in (("tp", ps.get_tp_group), ("pp", ps.get_pp_group),
                     ("dp", getattr(ps, "get_dp_group", None)),
                     ("pcp", getattr(ps, "get_pcp_group", None))):
        g = None
        if get is not None:  # None: a vLLM without that kind of parallelism
            try:
                g = get()
            except AssertionError:  # "... group is not initialized": none of it
                pass
        out[key], out[key + "_rank"] = (g.world_size, g.rank_in_group) if g else (1, 0)
    return out


def default_spec(par, expert_parallel=False, no_mla=False, sp_moe=False):
    """The vllm layout spec for these parallel sizes (with the stages
    VLLM_PP_LAYER_PARTITION gives, where set).  no_mla: a DeepSeek model
    with vLLM's MLA off (q_a_proj and kv_a_proj_with_mqa apart, not
    fused_qkv_a_proj); sp_moe: a DeepSeek model under vLLM's
    sequence-parallel MoE (parallel_config.use_sequence_parallel_moe:
    its shared experts whole on every rank)."""
    spec = "vllm:tp=%d" % par["tp"]
    if par["pp"] > 1:
        spec += ",pp=%d" % par["pp"] + stages_from_env("VLLM_PP_LAYER_PARTITION", par["pp"])
    if par["dp"] > 1:
        spec += ",dp=%d" % par["dp"]
    if expert_parallel:
        spec += ",ep=%d" % (par["tp"] * par["dp"])
    if no_mla:
        spec += ",no_mla=1"
    if sp_moe:
        spec += ",sp_moe=1"
    return spec


# The model types whose vLLM parameters depend on the no_mla and sp_moe
# layout keys (vllm/model_executor/models/deepseek_v2.py: DeepseekV2Attention
# without MLA, DeepseekV2MLP(is_sequence_parallel) for the shared experts).
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")


def _model_type(config):
    """model_type of config.json `config` (a path), or None."""
    with open(config) as f:
        cfg = json.load(f)
    return cfg.get("model_type") if isinstance(cfg, dict) else None


def _served_model_type(mc, config=None):
    """model_type of the model vLLM serves (its hf_text_config's, else
    config.json's: `config` or the model's own), or None where none can
    be read."""
    for c in (getattr(mc, "hf_text_config", None), getattr(mc, "hf_config", None)):
        mt = getattr(c, "model_type", None)
        if isinstance(mt, str):
            return mt
    try:
        return _model_type(config or config_path(getattr(mc, "model", None),
                                                  getattr(mc, "revision", None)))
    except (OSError, ValueError):
        return None


def layout_rank(par):
    """The vllm layout's rank of a worker (not vLLM's global rank, which
    orders dp outside pp)."""
    return par["tp_rank"] + par["tp"] * (par["dp_rank"] + par["dp"] * par["pp_rank"])


# Pipeline-end tensors some vLLM models build on every pipeline stage and
# load from the checkpoint (Qwen2-MoE, Qwen3-MoE: model.embed_tokens,
# model.norm and lm_head are made whatever the stage, not PPMissingLayer:
# vllm/model_executor/models/qwen3_moe.py Qwen3MoeModel and
# Qwen3MoeForCausalLM at 2e0831b0ab951c8896d4dd5d6cb9c3350a4574de, qwen2_moe.py
# at 002fb90788ae749626fb09c6272f0cb604de46b6), but read only on the first
# stage (the embedding) or the last (the final norm and lm_head).  The vllm
# layout holds each on the stage that reads it; elsewhere they are left out
# of the attach (nothing reads them there), not refused as unknown.
_STAGE_ENDS = (("model.embed_tokens.weight", "first"), ("model.norm.weight", "last"),
               ("lm_head.weight", "last"))


def stage_end_ignores(layout, rank, par):
    """The names of _STAGE_ENDS that rank `rank` of `layout` (a
    wex.Layout) does not hold and that its pipeline stage (par's pp_rank
    of pp) does not read: ignore= patterns (exact names) for wex_attach."""
    if par["pp"] <= 1:
        return ()
    held = {name for name, _, _, _ in layout.rank(rank)}
    out = []
    for name, stage in _STAGE_ENDS:
        reads = par["pp_rank"] == (0 if stage == "first" else par["pp"] - 1)
        if name not in held and not reads:
            out.append(name)
    return tuple(out)


def _env_true(name):
    """Whether environment variable `name` is set to a true value (as
    vLLM's envs.py parses its flags: "1"/"true"; any value but
    0/false/no/off/empty counts here, to refuse rather than guess)."""
    v = os.environ.get(name)
    return v is not None and v.strip().lower() not in ("", "0", "false", "no", "off")


# MoE kernels that re-lay out w13_weight/w2_weight after loading, keeping
# their shape, so a copy of the canonical [gate; up] rows would be read as
# something else.  vllm-project/vllm vllm/envs.py: VLLM_USE_FLASHINFER_MOE_FP16,
# _FP8, _FP4 (and later _MXFP4_*) are "bool(int(os.getenv(NAME, "0")))";
# VLLM_ROCM_USE_AITER defaults to False and is the parent switch of
# VLLM_ROCM_USE_AITER_MOE, which defaults to True.  vllm/model_executor/
# layers/fused_moe/oracle/unquantized.py, convert_to_unquantized_kernel_format:
# AITER runs rocm_aiter_ops.shuffle_weights(w13, w2), FLASHINFER_CUTLASS
# swap_w13_to_w31 ("[w3; w1]"); quantization/fp8.py (Fp8MoEMethod) does the
# same for its weights and scales.  vllm/config/kernel.py (recent vLLM):
# KernelConfig.moe_backend, "auto" or a named backend.
_FLASHINFER_MOE_PREFIX = "VLLM_USE_FLASHINFER_MOE_"
_MOE_BACKENDS_OK = ("auto", "triton")
# A FusedMoE quant_method's kernel backend (an Enum, in an attribute named
# *_backend: unquantized_backend, fp8_backend, ...; vLLM picks it by
# platform and shape even with no variable or setting, e.g. FlashInfer
# CUTLASS for bf16 experts on Blackwell, AITER for FP8 on ROCm): the ones
# whose convert_to_*_kernel_format leaves the weights as loaded
# (vllm/model_executor/layers/fused_moe/oracle/unquantized.py and fp8.py:
# TRITON and BATCHED_TRITON for both; VLLM_CUTLASS and
# BATCHED_VLLM_CUTLASS, and NONE, for FP8).  Any other value, or such an
# attribute this list does not know (another quantization, a later vLLM),
# is refused: a re-layout in the same shape would go unseen otherwise.
_KERNEL_BACKENDS_OK = {
    "unquantized_backend": ("TRITON", "BATCHED_TRITON"),
    "fp8_backend": ("TRITON", "BATCHED_TRITON", "VLLM_CUTLASS", "BATCHED_VLLM_CUTLASS", "NONE"),
    "flashinfer_moe_backend": (),  # an older vLLM's: set only for FlashInfer
}


def _kernel_backends(qm, moe):
    """[(attribute, backend name)] of a quant_method: those named in
    _KERNEL_BACKENDS_OK (MoE methods' own names) and, for an MoE method
    (`moe`: its class or a base is named *MoE*, or its layer holds
    w13_weight), every other attribute named *_backend whose value is an
    Enum member (a linear method's own backends are not the experts')."""
    # The known names read as attributes too (a property, __slots__).
    attrs = {k: getattr(qm, k, None) for k in _KERNEL_BACKENDS_OK}
    try:
        attrs.update(vars(qm))
    except TypeError:  # no __dict__
        pass
    out = []
    for k in sorted(attrs):
        v = attrs[k]
        if not k.endswith("_backend") or v is None:
            continue
        if k in _KERNEL_BACKENDS_OK or (moe and isinstance(v, enum.Enum)):
            out.append((k, str(getattr(v, "name", v))))
    return out


# Newer vLLM releases keep a FusedMoE layer's expert weights on a child
# module (fused_moe/routed_experts.py: experts.routed_experts.w13_weight);
# the vllm engine file names them as earlier ones did (experts.w13_weight).
_ROUTED = ".experts.routed_experts."


def engine_names(named, originals=False):
    """vLLM's (name, parameter) pairs under the names of the vllm engine
    file: experts.routed_experts.X as experts.X (newer releases'
    FusedMoE), other names as they are; with originals=True, (name,
    parameter, vLLM's name) triples (EngineRank matches ignore= patterns
    against both).  Errors then name such a parameter as experts.X."""
    for name, t in named:
        new = name
        if _ROUTED in name:
            new = name.replace(_ROUTED, ".experts.", 1)
        elif name.startswith(_ROUTED[1:]):
            new = "experts." + name[len(_ROUTED) - 1:]
        yield (new, t, name) if originals else (new, t)


def _refuse_moe_relayout(vllm_config, module):
    """Raises ValueError, naming the setting, where vLLM's environment or
    configuration selects an MoE backend that re-lays out expert weights
    in their shape (FlashInfer, ROCm AITER); also where a FusedMoE
    layer's quant_method runs a kernel backend other than those known to
    keep the weights as loaded (_KERNEL_BACKENDS_OK), or says it runs
    AITER (rocm_aiter_moe_enabled, an older vLLM's name)."""
    why = sorted(k for k in os.environ if k.startswith(_FLASHINFER_MOE_PREFIX) and _env_true(k))
    if why:
        raise ValueError("wex_attach: %s=%s selects FlashInfer MoE kernels, for which vLLM "
                         "re-lays out the experts' weights after loading in the same shape "
                         "(w13 as [w3; w1]): a copy would be read wrong; unset it (or set 0)"
                         % (why[0], os.environ[why[0]]))
    if _env_true("VLLM_ROCM_USE_AITER") and (
            "VLLM_ROCM_USE_AITER_MOE" not in os.environ or _env_true("VLLM_ROCM_USE_AITER_MOE")):
        raise ValueError("wex_attach: VLLM_ROCM_USE_AITER=%s (with VLLM_ROCM_USE_AITER_MOE, "
                         "default on) selects ROCm AITER MoE kernels, for which vLLM shuffles "
                         "the experts' weights after loading in the same shape: a copy would "
                         "be read wrong; set VLLM_ROCM_USE_AITER_MOE=0"
                         % os.environ["VLLM_ROCM_USE_AITER"])
    backend = getattr(getattr(vllm_config, "kernel_config", None), "moe_backend", None)
    if backend is not None and str(backend) not in _MOE_BACKENDS_OK:
        raise ValueError("wex_attach: moe_backend=%r may re-lay out the experts' weights after "
                         "loading in the same shape: use moe_backend='triton' (or 'auto' with "
                         "no FlashInfer/AITER MoE variable set)" % (backend,))
    for name, m in module.named_modules():
        for qm in _quant_methods(m):
            _refuse_method(name, m, qm)


def _quant_methods(m):
    """The quant methods of module m whose backends shaped its weights:
    its quant_method and the ones that wraps.  vLLM replaces a FusedMoE
    layer's quant_method after loading (FusedMoE.maybe_init_modular_kernel,
    with an all2all backend under DP + EP) by a FusedMoEModularMethod that
    keeps the method which converted the weights as old_quant_method
    (fused_moe/fused_moe_modular_method.py, vllm-project/vllm at
    c9a59901113ccfe729e9c2be54062abee99b37f7); newer layers keep it as
    base_quant_method too."""
    out = []
    for qm in (getattr(m, "quant_method", None), getattr(m, "base_quant_method", None)):
        while qm is not None and len(out) < 8 and all(qm is not o for o in out):
            out.append(qm)
            qm = getattr(qm, "old_quant_method", None)
    return out


def _refuse_method(name, m, qm):
    """_refuse_moe_relayout's checks of one quant method qm of module m."""
    if getattr(qm, "rocm_aiter_moe_enabled", False):
        raise ValueError("wex_attach: %s runs ROCm AITER MoE kernels "
                         "(rocm_aiter_moe_enabled), which shuffle its weights after loading: "
                         "set VLLM_ROCM_USE_AITER_MOE=0" % name)
    moe = hasattr(m, "w13_weight") or any(
        "MoE" in c.__name__ for c in type(qm).__mro__)
    for attr, value in _kernel_backends(qm, moe):
        ok = _KERNEL_BACKENDS_OK.get(attr)
        if ok is not None and value in ok:
            continue
        raise ValueError("wex_attach: %s runs the %s MoE kernel backend (%s.%s)%s, which "
                         "may re-lay out its weights after loading in the same shape: "
                         "start vLLM with moe_backend='triton' (a vLLM without "
                         "moe_backend, for DeepGEMM: VLLM_USE_DEEP_GEMM=0)"
                         % (name, value, type(qm).__name__, attr,
                            "" if ok is not None else
                            ", a backend attribute wex does not know (known to keep the "
                            "weights as loaded: %s)" % ", ".join(
                                "%s %s" % (k, "/".join(v))
                                for k, v in sorted(_KERNEL_BACKENDS_OK.items()) if v)))


def _block_fp8(cfg, module):
    """Whether the model is block-quantized FP8 (vLLM's Fp8Config with
    weight_block_size): from config.json `cfg` where it can be read, else
    from vLLM's parameter names (a block scale is *_scale_inv)."""
    if cfg:
        try:
            return bool(fp8_block_size(cfg))
        except (OSError, ValueError):
            pass
    return any(n.endswith("_scale_inv") for n, _ in module.named_parameters())


# vLLM quantization methods that quantize an unquantized (BF16/FP16)
# checkpoint while or after loading it, where its config.json has no
# quantization_config: quantization/fp8.py (Fp8LinearMethod, online where
# not is_checkpoint_fp8_serialized: ops.scaled_fp8_quant(layer.weight),
# replace_parameter(layer, "weight", qweight.t()) and a new weight_scale),
# ptpc_fp8, experts_int8, and bitsandbytes' in-flight quantization.  The
# layout, from config.json, describes the checkpoint's unquantized tensors.
_ONLINE_QUANT = ("fp8", "ptpc_fp8", "experts_int8", "bitsandbytes")


def _online_quant(mc, cfg):
    """vLLM's quantization (model_config.quantization) where it is one that
    quantizes the unquantized checkpoint of config.json `cfg` (a path)
    after loading (_ONLINE_QUANT), else None."""
    q = getattr(mc, "quantization", None)
    if not cfg or str(q) not in _ONLINE_QUANT:
        return None
    try:
        with open(cfg) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(c, dict) or c.get("quantization_config") or c.get("compression_config"):
        return None
    return str(q)


class _Shape(tuple):
    """A weight's shape, also as .shape: vLLM's
    should_use_deepgemm_for_fp8_linear takes the weight (weight.shape[0])
    in some releases, its shape (weight_shape[0]) in others."""

    @property
    def shape(self):
        return self


def _deep_gemm_requant(module):
    """(the vLLM function that says it requantizes block-FP8 weights and
    scales for DeepGEMM after loading, the first layer of `module` it
    requantizes) where it does, else None.
    vllm/utils/deep_gemm.py: is_deep_gemm_e8m0_used() (True with
    VLLM_USE_DEEP_GEMM, deep_gemm installed, Hopper or Blackwell and
    VLLM_USE_DEEP_GEMM_E8M0; both variables default to 1 in recent
    releases); older releases' is_blackwell_deep_gemm_used().  Where it is
    true, fp8_utils' requant_weight_ue8m0_inplace rewrites a layer's FP8
    weight and F32 weight_scale_inv in place with power-of-two scales:
    Fp8LinearMethod's layers (maybe_post_process_fp8_weight_block) only
    where should_use_deepgemm_for_fp8_linear(layer.orig_dtype, weight)
    (DeepGEMM supported here, a bfloat16 model dtype, the weight's shape
    in DeepGEMM's multiples), asked here of each layer with a
    weight_block_size; Fp8MoEMethod's (w13_weight) for any kernel in about
    0.10, DeepGEMM's in later ones (which _refuse_moe_relayout refuses).
    A block-FP8 layer without the attributes that predicate reads, or a
    vLLM without it, counts as requantized.
    deepgemm_post_process_fp8_weight_block's transform_sf_into_required_layout
    then replaces the scales on Blackwell with int32 tensors of packed
    UE8M0 exponents, MN-major, in new memory (replace_parameter)."""
    try:
        dg = importlib.import_module("vllm.utils.deep_gemm")
    except ImportError:  # a vLLM without DeepGEMM support
        return None
    for name in ("is_deep_gemm_e8m0_used", "is_blackwell_deep_gemm_used"):
        fn = getattr(dg, name, None)
        if callable(fn):
            break
    else:
        return None
    if not fn():
        return None
    linear = getattr(dg, "should_use_deepgemm_for_fp8_linear", None)
    for lname, m in module.named_modules():
        params = dict(m.named_parameters(recurse=False))
        if "w13_weight" in params:  # FusedMoE
            if getattr(m, "weight_block_size", None) is not None or \
                    any(k.endswith("_scale_inv") for k in params):
                return name, lname
            continue
        if getattr(m, "weight_block_size", None) is None and "weight_scale_inv" not in params:
            continue  # not a block-FP8 layer
        w = params.get("weight")
        if w is None:
            continue
        dtype = getattr(m, "orig_dtype", None)
        if not callable(linear) or dtype is None or \
                getattr(m, "weight_block_size", None) is None:
            return name, lname  # cannot tell: counted as requantized
        if linear(dtype, _Shape(w.shape)):
            return name, lname
    return None


# ROCm weight padding: vLLM's envs.py VLLM_ROCM_MOE_PADDING and
# VLLM_ROCM_FP8_PADDING (both "bool(int(os.getenv(NAME, "1")))", on by
# default).  On ROCm, where a row's stride is a multiple of 512 bytes,
# UnquantizedFusedMoEMethod._maybe_pad_weight (fused_moe/
# unquantized_fused_moe_method.py, vllm-project/vllm at
# 017b8f23ef355dd8eb8733d2724f6b125a503acb; oracle/unquantized.py at
# 011fbfd6c93d3f75dc5d7d1a0d4957d74d079bea keeps it for TRITON) and
# Fp8LinearMethod._maybe_pad_weight (quantization/fp8.py at
# 0071b24bf8fe8c3d1bc3516d0ff8477f07964aaf, block-FP8 weights too) replace
# w13_weight/w2_weight (a linear layer's FP8 weight) after loading with
# F.pad(w, (0, 256 bytes))[..., :-pad]: the same shape and values in new
# memory, each row 256 bytes further apart.  The vllm layout's pieces
# assume C order, so such a tensor cannot be attached.
_ROCM_PADDING = (("w13_weight", "VLLM_ROCM_MOE_PADDING"), ("w2_weight", "VLLM_ROCM_MOE_PADDING"))


# The FP8 types of ROCm MI300 (gfx942).  There vLLM's Fp8LinearMethod and
# Fp8MoEMethod (current_platform.is_fp8_fnuz(); quantization/utils/
# w8a8_utils.py normalize_e4m3fn_to_e4m3fnuz, called from fp8_utils'
# process_fp8_weight_*_strategy) turn a loaded e4m3fn weight into
# weight.view(torch.float8_e4m3fnuz) (the bit pattern -0.0, -128, set to 0)
# and its scales into new tensors times 2: e4m3fnuz reads each byte as half
# the e4m3fn value.  wex has no such element type, and the trainer's e4m3fn
# bytes would be read as other values.
_FNUZ = ("float8_e4m3fnuz", "float8_e5m2fnuz")


def _refuse_strided(named, strip_prefix, ignore):
    """Raises ValueError, naming it and the vLLM setting that made it,
    for the first parameter wex_attach would attach (not ignored) that is
    not contiguous: vLLM's ROCm padding (_ROCM_PADDING) leaves the
    weights' rows apart, where the layout's pieces are in C order; or
    that vLLM converted to an FP8 fnuz type (_FNUZ), naming the
    conversion."""
    import torch  # vLLM's workers have it

    kept, _ = select_parameters(named, strip_prefix, ignore)
    fnuz = [getattr(torch, n) for n in _FNUZ if hasattr(torch, n)]
    for name, t in kept:
        if t.dtype in fnuz:
            raise ValueError(
                "wex_attach: %s is %s: vLLM on ROCm GPUs whose FP8 is the fnuz variant "
                "(MI300, gfx942) converts an FP8 e4m3fn checkpoint after loading "
                "(normalize_e4m3fn_to_e4m3fnuz: the weights reinterpreted as e4m3fnuz, "
                "their scales doubled in new tensors), and the trainer's e4m3fn bytes and "
                "scales copied in would be read as other values: wex cannot sync FP8 "
                "weights into vLLM on this GPU; serve the model unquantized (a BF16 "
                "checkpoint), or on a GPU with e4m3fn FP8" % (name, str(t.dtype).split(".")[-1]))
        if t.numel() == 0 or t.is_contiguous():
            continue
        if getattr(torch.version, "hip", None):
            var = next((v for suffix, v in _ROCM_PADDING if name.endswith(suffix)),
                       "VLLM_ROCM_FP8_PADDING")
            why = ("vLLM on ROCm pads its rows after loading (%s, on by default), and the "
                   "vllm layout places its pieces in C order: start vLLM with %s=0"
                   % (var, var))
        else:
            why = ("vLLM laid it out with other strides after loading, and the vllm layout "
                   "places its pieces in C order")
            if name.endswith(("_scale_inv", "weight_scale")):
                # Fp8MoEMethod (get_col_major_tma_aligned_tensor) and
                # fp8_utils' deepgemm_post_process_fp8_weight_block
                # (transform_sf_into_required_layout) replace block scales
                # for DeepGEMM with MN-major ones in new memory.
                why += ("; vLLM's DeepGEMM kernels keep block scales column-major (TMA-"
                        "aligned) in new memory: start vLLM with VLLM_USE_DEEP_GEMM=0")
        raise ValueError("wex_attach: %s is not contiguous (shape %s, strides %s): %s"
                         % (name, tuple(t.shape), tuple(t.stride()), why))


# The worker's methods through which vLLM writes other weights into the
# model's parameters in place (vllm/v1/worker/gpu_worker.py):
# reload_weights (GPUModelRunner.reload_weights: model.load_weights of the
# checkpoint's or given weights, or, where is_checkpoint_format=False,
# model.get_parameter(name).copy_(weight), bypassing load_weights), and the
# weight-transfer engine's session (update_weights, finish_weight_update;
# vllm/distributed/weight_transfer).
_RELOADS = ("reload_weights", "update_weights", "finish_weight_update")


class WorkerExtension:
    """Mixed into vLLM's worker class (worker_extension_cls): uses
    self.model_runner.model, self.device and self.vllm_config, as vLLM's
    own RLHF examples do."""

    _wex = None
    # The weights are not the ones vLLM loaded: True (a sync changed
    # them) or why else (checkpoint_for's `updated`).
    _wex_changed = False
    _wex_asleep = None    # while vLLM's weights sleep: why (see _wex_watch_sleep)
    _wex_lost = False     # ... and whether their bytes are lost on waking
    _wex_detached = None  # why a reload of vLLM's (load_weights) detached the rank

    def _wex_watch_sleep(self):
        """Wraps this worker's sleep() and wake_up() (instance attributes,
        which vLLM's collective_rpc finds before the class's methods) to
        tell the attached rank: while vLLM's weights sleep nothing is
        mapped at their addresses, so a sync is refused; waking them from
        any sleep but level 1 (which copies a CPU backup back) leaves
        them holding nothing meaningful, so the rank forgets its version
        and the next sync copies the whole of it.  A sleep that raises
        counts as a wake-up that lost them (vLLM counts itself awake;
        libwex refuses what is left unmapped); a wake-up that raises
        leaves them asleep, then lost.  The wrappers never raise but what
        vLLM's own methods raise."""
        if "_wex_sleep_wrapped" in self.__dict__:
            return
        if not callable(getattr(self, "sleep", None)) or \
                not callable(getattr(self, "wake_up", None)):
            return  # a vLLM without sleep mode
        # The methods as found at each call (a class patched later is
        # still called), unless the instance had its own already.
        own = {k: self.__dict__[k] for k in ("sleep", "wake_up", "discard")
               if k in self.__dict__}

        def method(name):
            if name in own:
                return own[name]
            f = getattr(type(self), name)
            # A function binds; a callable object a framework patched in
            # (functools.partial) is called as it is.
            return f.__get__(self, type(self)) if hasattr(type(f), "__get__") else f

        self._wex_sleep_wrapped = True

        def wex_sleep(*args, **kwargs):
            level = kwargs.get("level", args[0] if args else 1)
            # Newer vLLM's sleep(level=1, tags=None) (LLM.sleep(tags=...)):
            # given tags sleep those alone, and the weights' with no CPU
            # backup, whatever the level (offload_tags only for tags None
            # and level 1).
            tags = kwargs.get("tags", args[1] if len(args) > 1 else None)
            if tags is not None and "weights" not in tags:
                return method("sleep")(*args, **kwargs)  # the weights stay as they are
            why = "vLLM is asleep (sleep level %s)" % (level,) if tags is None \
                else "vLLM is asleep (sleep tags %s)" % (list(tags),)
            # Level 1 copies the weights back as they were at the sleep
            # only with vLLM's own "cumem" sleep-mode backend (CuMemBackend:
            # CuMemAllocator.sleep backs them up at each sleep,
            # vllm/device_allocator/sleep_mode_backend.py); another
            # backend (a plugin's: a host copy kept from the first
            # suspend, a snapshot on disk) may restore older bytes.
            backend = getattr(self._wex_configs()[0], "sleep_mode_backend", None)
            other = backend is not None and str(getattr(backend, "value", backend)) != "cumem"
            return release("sleep", why, level != 1 or tags is not None or other, args, kwargs)

        def release(name, why, lost, args, kwargs):
            # Before: a sleep that fails half-way leaves them unknown.
            before = (self._wex_asleep, self._wex_lost)
            self._wex_asleep = why
            self._wex_lost = self._wex_lost or lost
            if self._wex is not None:
                try:  # waits for a sync running in another thread
                    self._wex.released(self._wex_asleep)
                except BaseException:  # interrupted: nothing slept
                    self._wex_asleep, self._wex_lost = before
                    raise
            try:
                return method(name)(*args, **kwargs)
            except BaseException:
                # vLLM counts itself awake (its executor marks it asleep
                # only after a sleep that returned), with some memory
                # released perhaps: libwex refuses what is not mapped,
                # and what is holds nothing certain.
                self._wex_asleep, self._wex_lost = None, False
                self._wex_changed = "a vLLM %s that failed may have discarded the weights" % name
                if self._wex is not None:
                    self._wex.restored(kept=False)  # never raises
                raise

        def wex_discard(*args, **kwargs):
            # Newer vLLM's discard(tags) (the executor's discard; the
            # worker adds the tags to its _asleep_tags; CuMemBackend.
            # discard -> CuMemAllocator.discard): unmaps the allocations
            # of those tags with no CPU backup, until a wake_up of them.
            tags = kwargs.get("tags", args[0] if args else ())
            tags = (tags,) if isinstance(tags, str) else tuple(tags or ())
            if "weights" not in tags:
                return method("discard")(*args, **kwargs)  # the weights stay as they are
            return release("discard", "vLLM discarded its weights' memory (discard tags %s)"
                           % (list(tags),), True, args, kwargs)

        def wex_wake_up(*args, **kwargs):
            tags = kwargs.get("tags", args[0] if args else None)
            weights = self._wex_asleep is not None and (tags is None or "weights" in tags)
            try:
                out = method("wake_up")(*args, **kwargs)
            except BaseException:
                if weights:  # its rollback unmaps them again, backups spent
                    self._wex_lost = True
                raise
            if weights:
                lost, self._wex_asleep, self._wex_lost = self._wex_lost, None, False
                if lost:  # not the checkpoint's any more
                    self._wex_changed = ("vLLM's sleep mode discarded the weights (woken "
                                         "without a CPU backup)")
                if self._wex is not None:
                    self._wex.restored(kept=not lost)  # never raises
            return out

        self.sleep, self.wake_up = wex_sleep, wex_wake_up
        if callable(getattr(self, "discard", None)):
            self.discard = wex_discard

    def _wex_sleeping(self):
        """Why vLLM's weights sleep now, seen in its state (for a sleep
        before wex_attach wrapped sleep()), or None: newer vLLM's worker
        keeps the tags it released in _asleep_tags (sleep adds weights and
        kv_cache, discard(tags) its tags, wake_up(tags) removes them), and
        its CuMemAllocator marks each released allocation is_asleep (any
        sleep, tag sleep or discard, until its wake_up); in older ones,
        level 1 leaves CPU backups of the "weights" allocations in
        CuMemAllocator, level 2 the model's buffers in the worker's
        _sleep_saved_buffers (a tag sleep of the weights, or a level-2
        sleep of a model without buffers, leaves no trace there: libwex's
        wex.released refuses those, asking the CUDA driver)."""
        if self._wex_asleep is not None:
            return self._wex_asleep
        tags = getattr(self, "_asleep_tags", None)
        if isinstance(tags, (set, frozenset, list, tuple)) and "weights" in tags:
            return "vLLM is asleep (its worker's asleep tags: %s)" % sorted(tags)
        if getattr(self, "_sleep_saved_buffers", None):
            return "vLLM is asleep (sleep level 2: its saved buffers are not restored)"
        mc, _ = self._wex_configs()
        if not getattr(mc, "enable_sleep_mode", False):
            return None
        try:
            from vllm.device_allocator.cumem import CuMemAllocator
        except ImportError:
            return None
        inst = getattr(CuMemAllocator, "instance", None)
        datas = [d for d in getattr(inst, "pointer_to_data", {}).values()
                 if getattr(d, "tag", None) == "weights"]
        if any(getattr(d, "cpu_backup_tensor", None) is not None for d in datas):
            return "vLLM is asleep (sleep level 1: its weights are backed up in CPU memory)"
        if any(getattr(d, "is_asleep", False) is True for d in datas):
            return ("vLLM is asleep (CuMemAllocator: %d of the %d allocations tagged "
                    "'weights' are released: a sleep, a tag sleep or a discard of them)"
                    % (sum(getattr(d, "is_asleep", False) is True for d in datas), len(datas)))
        return None

    def _wex_watch_load(self):
        """Wraps (once) the model's load_weights (an instance attribute of
        the module, which vLLM's CUDA-graph wrappers forward to) and the
        worker's own weight-loading methods (_RELOADS, instance
        attributes, which collective_rpc finds first), through which
        vLLM's reloads and RL frameworks' weight updates write into the
        attached parameters in place: the worker's reload_weights
        (GPUModelRunner.reload_weights: model.load_weights, or, with
        is_checkpoint_format=False, param.copy_ of each weight given), the
        weight-transfer engine's update_weights and finish_weight_update,
        and the collective_rpc update of veRL, OpenRLHF and vLLM's RLHF
        examples (model_runner.model.load_weights(weights=[(name,
        tensor)])).  After one the weights are not the version the rank
        holds: it forgets it (check_group no longer counts it) and the
        next wex_sync copies the whole version again instead of nothing;
        where it cannot (the load replaced parameters), the rank is
        detached (wex_attach again).  The weights are no longer compared
        with the checkpoint either."""
        model = self._wex_model()
        fn = getattr(model, "load_weights", None)
        if callable(fn) and not getattr(fn, "_wex_wrapped", False):
            model.load_weights = self._wex_loading(
                fn, "vLLM loaded other weights into %s (load_weights)" % type(model).__name__)
        if "_wex_reload_wrapped" in self.__dict__:
            return
        self._wex_reload_wrapped = True
        for name in _RELOADS:
            if not callable(getattr(self, name, None)):
                continue  # not in this vLLM
            own = self.__dict__.get(name)
            if own is None:  # the class's, as found at each call
                def own(*args, _name=name, **kwargs):
                    f = getattr(type(self), _name)
                    return (f.__get__(self, type(self)) if hasattr(type(f), "__get__")
                            else f)(*args, **kwargs)
            setattr(self, name, self._wex_loading(
                own, "vLLM loaded other weights (the worker's %s)" % name))

    def _wex_loading(self, fn, why):
        """fn wrapped: after it returns or raises (one that raised may
        have written some of the weights), the attached rank forgets its
        version (once, for calls nested in one another: reload_weights
        calls load_weights), or is detached where it cannot."""
        # The nesting per thread: a count shared by threads loading at
        # once, restored by each as it saw it, could stay above 0 and
        # keep every later load from forgetting.
        nest = self.__dict__.setdefault("_wex_loading_nest", threading.local())

        def wex_loading(*args, **kwargs):
            depth = getattr(nest, "depth", 0)
            nest.depth = depth + 1
            wrote = False
            try:
                out = fn(*args, **kwargs)
                wrote = True
                return out
            except BaseException:
                # One refused while the weights' memory is released (the
                # 2026 worker refuses reloads and updates while "weights"
                # sleep) wrote nothing: nothing is mapped there, and a
                # forget would fail (libwex refuses released memory) and
                # detach the rank, whose weights a level-1 wake-up brings
                # back whole.
                wrote = self._wex_asleep is None
                raise
            finally:
                nest.depth = depth
                if depth == 0 and wrote:
                    self._wex_changed = why
                    rank = self._wex
                    if rank is not None and not rank.overwritten(why):
                        # wexd would still count the version: detached.
                        self._wex, self._wex_detached = None, why
                        try:
                            rank.close()
                        except Exception:
                            pass

        wex_loading._wex_wrapped = True
        return wex_loading

    def _wex_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _wex_configs(self):
        cfg = getattr(self, "vllm_config", None)
        return getattr(cfg, "model_config", None), getattr(cfg, "parallel_config", None)

    def wex_attach(self, model, group=None, layout=None, config=None, adapters=None,
                   socket=None, timeout_ms=None, copy_threads=None, strip_prefix=None,
                   ignore=(), checkpoint=None):
        """Attaches this worker's parameters for in-place syncs of `model`
        as a rank of consumer group `group` (one per vLLM instance).
        checkpoint: the safetensors checkpoint vLLM loaded, compared in
        samples with the worker's tensors where the layout places each
        piece before anything is attached (a backend that re-laid them
        out is refused, naming the tensor: wex.checkpoint); None: the
        model's directory (or its hub cache snapshot) when vLLM loaded
        its safetensors (load_format auto, safetensors or
        fastsafetensors; not dummy); False: never.  Either way not once a
        sync of this worker changed the weights.
        Returns a dict: model, group, rank, world_size, layout, tensors,
        bytes, ignored, version, checkpoint_check (what was compared, or
        why nothing was), released (why the weights' memory is released
        now, or None), lost (why they hold nothing, until a sync
        succeeds), forgotten (how often the rank forgot its version)."""
        if self._wex is not None:
            raise ValueError("wex_attach: already attached as %s (wex_detach first)"
                             % self._wex.describe())
        asleep = self._wex_sleeping()
        if asleep:
            raise ValueError("wex_attach: %s: its weights' memory is released; wake_up("
                             "tags=['weights']) first" % asleep)
        mc, pc = self._wex_configs()
        if getattr(mc, "use_mla", False):
            mt = _served_model_type(mc, config)
            raise ValueError("wex_attach: %s uses MLA, whose absorbed W_UK/W_UV vLLM computes "
                             "from kv_b_proj after loading: an in-place copy would leave them "
                             "stale (%s)" % (getattr(mc, "model", "the model"),
                                             "start vLLM with VLLM_MLA_DISABLE=1: its "
                                             "attention then reads kv_b_proj itself"
                                             if mt in _DEEPSEEK or mt is None else
                                             "VLLM_MLA_DISABLE=1 would not help: the vllm "
                                             "layout describes MLA off for model_type %s "
                                             "only, not %r" % (" and ".join(_DEEPSEEK), mt)))
        if getattr(pc, "enable_eplb", False):
            raise ValueError("wex_attach: EPLB moves experts between ranks; the vllm layout "
                             "places them in order (start vLLM without --enable-eplb)")
        placement = getattr(pc, "expert_placement_strategy", "linear")
        if placement not in (None, "linear"):
            raise ValueError("wex_attach: expert_placement_strategy=%r places experts on other "
                             "ranks than the vllm layout's contiguous ('linear') placement: "
                             "start vLLM with expert_placement_strategy='linear'" % (placement,))
        if getattr(pc, "enable_elastic_ep", False):
            raise ValueError("wex_attach: enable_elastic_ep resizes data/expert parallelism at "
                             "run time, and the ranks attached would no longer be the "
                             "layout's: start vLLM without it")
        par = parallel_info()
        if par["pcp"] > 1:
            raise ValueError("wex_attach: prefill context parallelism (%d) is not described "
                             "by the vllm layout" % par["pcp"])
        cfg = None
        if config or not isinstance(layout, wex.Layout):
            cfg = config or config_path(getattr(mc, "model", None), getattr(mc, "revision", None))
        load_format = getattr(getattr(getattr(self, "vllm_config", None), "load_config", None),
                              "load_format", None) or getattr(mc, "load_format", None)
        ckpt, why, auto = checkpoint_for(checkpoint, getattr(mc, "model", None), load_format,
                                         None if config else cfg, self._wex_changed)
        # Whether the model has routed experts: from its config.json, or,
        # given only a wex.Layout, from vLLM's FusedMoE parameter names.
        experts = has_experts(cfg) if cfg else any(
            "w13_weight" in n for n, _ in self._wex_model().named_parameters())
        if experts:
            _refuse_moe_relayout(getattr(self, "vllm_config", None), self._wex_model())
        online = _online_quant(mc, cfg)
        if online:
            raise ValueError(
                "wex_attach: vLLM quantizes this unquantized checkpoint after loading it "
                "(quantization=%r; the model's config.json has no quantization_config): the "
                "weights it computes with are its own quantized tensors and scales (an FP8 "
                "weight transposed, in new memory), not the checkpoint's tensors the layout "
                "describes: start vLLM without --quantization (or serve a checkpoint "
                "quantized before loading)" % online)
        requant = _block_fp8(cfg, self._wex_model()) and _deep_gemm_requant(self._wex_model())
        if requant:
            raise ValueError(
                "wex_attach: vLLM requantizes this block-FP8 model's weights and scales for "
                "DeepGEMM after loading (vllm.utils.deep_gemm.%s() is true; layer %s is "
                "one it requantizes): its FP8 weights and F32 weight_scale_inv are rewritten "
                "with power-of-two (UE8M0) scales, and on Blackwell the scales become int32 "
                "tensors of packed exponents in new memory (and DeepGEMM there reads only "
                "each scale's exponent): the trainer's F32 scales copied in place would not "
                "fit or be read as other values; start vLLM with VLLM_USE_DEEP_GEMM=0"
                % (requant[0], requant[1] or "(the model)"))
        index = getattr(pc, "data_parallel_index", None)
        if group and "{dp}" in group:
            if experts and par["dp"] > 1:
                raise ValueError("wex_attach: {dp} in group %r, but with a model with experts "
                                 "vLLM's %d data-parallel ranks are one engine (its experts "
                                 "sharded over them, dp in the layout): one group name for "
                                 "all of them, or they could hold different versions"
                                 % (group, par["dp"]))
            if par["dp"] > 1:
                # A dense model's DP ranks that vLLM keeps in one world
                # (distributed_executor_backend="external_launcher":
                # torchrun starts every rank, data_parallel_size stays D):
                # each is still an engine of its own, here a group of
                # its own tp * pp ranks.
                index = par["dp_rank"] if index is None else index
                par = dict(par, dp=1, dp_rank=0)
            group = group.replace("{dp}", str(index or 0))
        elif index and par["dp"] == 1:
            raise ValueError("wex_attach: this is data-parallel engine %d of a dense model, an "
                             "engine of its own: put {dp} in the group name (group=%r) so "
                             "each engine syncs as its own group"
                             % (index, (group or "default") + "-{dp}"))
        world = par["tp"] * par["pp"] * par["dp"]
        spec = layout
        if not spec:
            # Here vLLM runs DeepSeek without MLA (refused above): its
            # attention keeps q_a_proj and kv_a_proj_with_mqa apart.
            deepseek = _model_type(cfg) in _DEEPSEEK
            spec = default_spec(
                par, experts and bool(getattr(pc, "enable_expert_parallel", False)),
                no_mla=deepseek,
                sp_moe=deepseek and bool(getattr(pc, "use_sequence_parallel_moe", False)))
        own = isinstance(spec, str)
        if own:
            spec = wex.Layout(cfg, spec, adapters)
        ignore = tuple((ignore,) if isinstance(ignore, str) else ignore or ()) + \
            stage_end_ignores(spec, layout_rank(par), par)
        _refuse_strided(engine_names(self._wex_model().named_parameters(), originals=True),
                        strip_prefix, ignore)
        device = getattr(self, "device", None)
        ordinal = device.index if getattr(device, "type", None) == "cuda" else None
        # The callable, not its result: each sync enumerates the parameters
        # again and refuses one vLLM replaced (a reload).
        try:
            self._wex = EngineRank(model,
                                   lambda: engine_names(self._wex_model().named_parameters(),
                                                        originals=True),
                                   rank=layout_rank(par), world_size=world, layout=spec,
                                   group=group, socket=socket, timeout_ms=timeout_ms,
                                   copy_threads=copy_threads, device=ordinal,
                                   strip_prefix=strip_prefix, ignore=ignore, checkpoint=ckpt,
                                   checkpoint_auto=auto, config=cfg, adapters=adapters)
        except CheckpointMismatch as e:
            if not getattr(mc, "enable_sleep_mode", False):
                raise
            raise CheckpointMismatch(
                "%s; vLLM runs with enable_sleep_mode: a sleep of level 2 and a wake-up "
                "before the first wex_attach discard the weights unseen: attach before the "
                "first sleep, or pass checkpoint=False" % e) from None
        # (Made here from a spec: closed with the rank, as one it opens.)
        self._wex._own_layout = own
        if why:
            self._wex.checked = "not checked: " + why
        self._wex_detached = None
        self._wex_watch_sleep()
        self._wex_watch_load()
        return self._wex.describe()

    def wex_sync(self, min_version=0, timeout_ms=0, verify=False):
        """In place from the newest published version (at least
        min_version); see wex.engine.EngineRank.sync."""
        if self._wex is None:
            raise ValueError("wex_sync: call wex_attach first%s"
                             % (" (detached: %s, and the rank could not forget its version)"
                                % self._wex_detached if self._wex_detached else ""))
        try:
            out = self._wex.sync(min_version=min_version, timeout_ms=timeout_ms, verify=verify)
        except ValueError:
            # Refused before anything was copied (released, moved): and
            # dirty() would wait for a sync running in another thread.
            raise
        except BaseException:
            # A copy that failed half-way changed them too.
            if self._wex.dirty():
                self._wex_changed = True
            raise
        # The weights are no longer the checkpoint's: a later attach
        # (after wex_detach) does not compare them with it.  So after any
        # sync that returned: one that copied nothing (changed 0) holds a
        # version an earlier request copied, perhaps one that then raised
        # (wexd did not answer its release in time: ETIMEDOUT, not dirty).
        # (One that copied nothing keeps a reason already given.)
        if out.get("changed") or not self._wex_changed:
            self._wex_changed = True
        return out

    def wex_status(self):
        return self._wex.describe() if self._wex is not None else None

    def wex_detach(self):
        self._wex_detached = None
        if self._wex is not None:
            self._wex.close()
            self._wex = None
