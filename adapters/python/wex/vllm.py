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
vLLM's names: qkv_proj, gate_up_proj, a padded vocabulary) as rank
tp_rank + tp * (dp_rank + dp * pp_rank) of the layout
"vllm:tp=T,pp=P,dp=D" (",ep=T*D" with enable_expert_parallel), from the
model's config.json (its directory, or the local Hugging Face cache for a
hub id); `layout=` gives another spec (e.g. stages=...).  wex_sync copies
the trainer's newest version (at least min_version) into them in place,
resharded from whatever layout the trainer registered; the pointers
vLLM's CUDA graphs captured stay valid.  collective_rpc returns each
worker's dict (with data parallelism through vLLM's DP client, the first
engine's only: check the others with wex.engine.check_group); an error
raises in the caller.

Data parallelism: for MoE models vLLM's DP ranks are one engine (dp in
the layout).  For dense models each DP rank is an engine of its own
(vLLM resets its data_parallel_size to 1): give each its own group with
"{dp}" in the group name, which becomes the engine's data_parallel_index
(group="rollout-{dp}"); attaching a second dense replica without it is
refused.

Refused, because a copy of the checkpoint's tensors would leave the
engine computing with stale copies: MLA models (vLLM builds W_UK/W_UV from
kv_b_proj after loading), EPLB (experts move between ranks; the layout's
placement is linear), prefill context parallelism.  Quantized models whose
weights vLLM transforms after loading (process_weights_after_loading:
Marlin repacking) hold tensors in other shapes and are refused by shape.
While vLLM sleeps (sleep mode) its weights are not mapped: wake it first.
"""
import wex
from wex.engine import EngineRank, config_path

__all__ = ["WorkerExtension", "parallel_info", "default_spec"]


def parallel_info():
    """{tp, tp_rank, pp, pp_rank, dp, dp_rank, pcp, pcp_rank} of this vLLM
    worker, from vllm.distributed.parallel_state (initialised in every
    worker)."""
    from vllm.distributed import parallel_state as ps

    out = {}
    for key, get in (("tp", ps.get_tp_group), ("pp", ps.get_pp_group),
                     ("dp", getattr(ps, "get_dp_group", None)),
                     ("pcp", getattr(ps, "get_pcp_group", None))):
        if get is None:  # a vLLM without that kind of parallelism
            out[key], out[key + "_rank"] = 1, 0
            continue
        g = get()
        out[key], out[key + "_rank"] = g.world_size, g.rank_in_group
    return out


def default_spec(par, expert_parallel=False):
    """The vllm layout spec for these parallel sizes."""
    spec = "vllm:tp=%d" % par["tp"]
    if par["pp"] > 1:
        spec += ",pp=%d" % par["pp"]
    if par["dp"] > 1:
        spec += ",dp=%d" % par["dp"]
    if expert_parallel:
        spec += ",ep=%d" % (par["tp"] * par["dp"])
    return spec


def layout_rank(par):
    """The vllm layout's rank of a worker (not vLLM's global rank, which
    orders dp outside pp)."""
    return par["tp_rank"] + par["tp"] * (par["dp_rank"] + par["dp"] * par["pp_rank"])


class WorkerExtension:
    """Mixed into vLLM's worker class (worker_extension_cls): uses
    self.model_runner.model, self.device and self.vllm_config, as vLLM's
    own RLHF examples do."""

    _wex = None

    def _wex_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _wex_configs(self):
        cfg = getattr(self, "vllm_config", None)
        return getattr(cfg, "model_config", None), getattr(cfg, "parallel_config", None)

    def wex_attach(self, model, group=None, layout=None, config=None, adapters=None,
                   socket=None, timeout_ms=None, copy_threads=None, strip_prefix=None,
                   ignore=()):
        """Attaches this worker's parameters for in-place syncs of `model`
        as a rank of consumer group `group` (one per vLLM instance).
        Returns a dict: model, group, rank, world_size, layout, tensors,
        bytes, ignored, version."""
        if self._wex is not None:
            raise ValueError("wex_attach: already attached as %s (wex_detach first)"
                             % self._wex.describe())
        mc, pc = self._wex_configs()
        if getattr(mc, "use_mla", False):
            raise ValueError("wex_attach: %s uses MLA, whose absorbed W_UK/W_UV vLLM computes "
                             "from kv_b_proj after loading: an in-place copy would leave them "
                             "stale" % getattr(mc, "model", "the model"))
        if getattr(pc, "enable_eplb", False):
            raise ValueError("wex_attach: EPLB moves experts between ranks; the vllm layout "
                             "places them in order (start vLLM without --enable-eplb)")
        par = parallel_info()
        if par["pcp"] > 1:
            raise ValueError("wex_attach: prefill context parallelism (%d) is not described "
                             "by the vllm layout" % par["pcp"])
        index = getattr(pc, "data_parallel_index", None)
        if group and "{dp}" in group:
            group = group.replace("{dp}", str(index or 0))
        elif index and par["dp"] == 1:
            raise ValueError("wex_attach: this is data-parallel engine %d of a dense model, an "
                             "engine of its own: put {dp} in the group name (group=%r) so "
                             "each engine syncs as its own group"
                             % (index, (group or "default") + "-{dp}"))
        world = par["tp"] * par["pp"] * par["dp"]
        spec = layout or default_spec(par, bool(getattr(pc, "enable_expert_parallel", False)))
        if isinstance(spec, str):
            spec = wex.Layout(config or config_path(getattr(mc, "model", None)), spec, adapters)
        device = getattr(self, "device", None)
        ordinal = device.index if getattr(device, "type", None) == "cuda" else None
        self._wex = EngineRank(model, self._wex_model().named_parameters(),
                               rank=layout_rank(par), world_size=world, layout=spec,
                               group=group, socket=socket, timeout_ms=timeout_ms,
                               copy_threads=copy_threads, device=ordinal,
                               strip_prefix=strip_prefix, ignore=ignore)
        return self._wex.describe()

    def wex_sync(self, min_version=0, timeout_ms=0, verify=False):
        """In place from the newest published version (at least
        min_version); see wex.engine.EngineRank.sync."""
        if self._wex is None:
            raise ValueError("wex_sync: call wex_attach first")
        return self._wex.sync(min_version=min_version, timeout_ms=timeout_ms, verify=verify)

    def wex_status(self):
        return self._wex.describe() if self._wex is not None else None

    def wex_detach(self):
        if self._wex is not None:
            self._wex.close()
            self._wex = None
