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
model's config.json; `layout=` gives another spec (e.g. stages=...).
wex_sync copies the trainer's newest version (at least min_version) into
them in place, resharded from whatever layout the trainer registered; the
pointers vLLM's CUDA graphs captured stay valid.  Each returns a dict
per worker (collective_rpc's list); an error raises in the caller.

Quantized models whose weights vLLM transforms after loading
(process_weights_after_loading: Marlin repacking, MLA's absorbed W_UK/W_UV
of DeepSeek) hold tensors a copy of the checkpoint's layout does not
refresh: not covered.
"""
import os

import wex
from wex.engine import EngineRank

__all__ = ["WorkerExtension", "parallel_info", "default_spec"]


def parallel_info():
    """{tp, tp_rank, pp, pp_rank, dp, dp_rank} of this vLLM worker, from
    vllm.distributed.parallel_state (initialised in every worker)."""
    from vllm.distributed import parallel_state as ps

    out = {}
    for key, get in (("tp", ps.get_tp_group), ("pp", ps.get_pp_group),
                     ("dp", getattr(ps, "get_dp_group", None))):
        if get is None:  # vLLM before data parallelism in workers
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

    def _wex_parallel(self):
        return parallel_info()

    def _wex_model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _wex_config_path(self):
        model = getattr(getattr(self, "vllm_config", None), "model_config", None)
        path = getattr(model, "model", None)
        if path and os.path.isfile(os.path.join(path, "config.json")):
            return os.path.join(path, "config.json")
        raise ValueError("wex_attach: the model %r is not a local directory with a config.json;"
                         " pass config= (the path of the model's config.json)" % (path,))

    def _wex_expert_parallel(self):
        par = getattr(getattr(self, "vllm_config", None), "parallel_config", None)
        return bool(getattr(par, "enable_expert_parallel", False))

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
        par = self._wex_parallel()
        world = par["tp"] * par["pp"] * par["dp"]
        spec = layout or default_spec(par, self._wex_expert_parallel())
        if isinstance(spec, str):
            spec = wex.Layout(config or self._wex_config_path(), spec, adapters)
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
