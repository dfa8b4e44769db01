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

The first request of a worker attaches its parameters (SGLang's names:
qkv_proj, gate_up_proj, w13_weight, a padded vocabulary) as rank
tp_rank + tp * pp_rank of the layout "sglang:tp=T,pp=P" (",dp=N,
dp_attention=1" with --enable-dp-attention, ",ep=E" with --ep-size),
from the model's config.json; `layout=` gives another spec (fuse_shared,
a2a, dense_tp, ...).  Later requests must ask for the same model, group
and layout.  post_load=True runs the model's post_load_weights() after
each sync (DeepSeek's MLA keeps w_kc/w_vc, copies of kv_b_proj).

SGLang ignores what a loader returns: a failed sync raises in the
worker, which SGLang treats as it treats any failed weight update (its
scheduler logs the exception; the version an engine holds is in
`wexctl status`).  Not covered: --dp N without --enable-dp-attention
(independent replicas: run one engine per replica, each with its own
group), and the draft model of speculative decoding (the loader is
called for it too; it has its own names).
"""
import json
import logging
import os

import wex
from wex.engine import EngineRank

__all__ = ["request", "load", "parallel_info", "default_spec"]

log = logging.getLogger("wex.sglang")

PREFIX = "wex:"
_ATTACH_KEYS = ("model", "group", "layout", "config", "adapters", "socket", "timeout_ms",
                "copy_threads", "strip_prefix", "ignore")
_SYNC_KEYS = ("min_version", "sync_timeout_ms", "verify", "post_load", "detach")
_ranks = {}  # id(model) -> (EngineRank, attach arguments, model: kept, so the id stays its)


def request(model, *, group=None, layout=None, config=None, adapters=None, socket=None,
            timeout_ms=None, copy_threads=None, strip_prefix=None, ignore=(), min_version=0,
            sync_timeout_ms=0, verify=False, post_load=False, detach=False):
    """The named_tensors for engine.update_weights_from_tensor(...,
    load_format="wex.sglang.load"): one (name, tensor) pair whose name
    carries the arguments (SGLang sends names as they are to every
    worker; the one-byte tensor is there because it wants a tensor).
    sync_timeout_ms is how long a sync waits for min_version (0: wexd's
    sync_timeout_ms); timeout_ms is each call to wexd's.  detach=True
    closes the worker's client instead of syncing."""
    import torch

    args = {"model": model, "group": group, "layout": layout, "config": config,
            "adapters": adapters, "socket": socket, "timeout_ms": timeout_ms,
            "copy_threads": copy_threads, "strip_prefix": strip_prefix,
            "ignore": list(ignore) if not isinstance(ignore, str) else [ignore],
            "min_version": int(min_version), "sync_timeout_ms": int(sync_timeout_ms),
            "verify": bool(verify), "post_load": bool(post_load), "detach": bool(detach)}
    if not model or not isinstance(model, str):
        raise ValueError("request: model must be the name the trainer publishes under")
    return [(PREFIX + json.dumps(args, sort_keys=True), torch.zeros(1, dtype=torch.uint8))]


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
    try:
        from sglang.srt.server_args import get_global_server_args
        return get_global_server_args()
    except ImportError:  # SGLang before get_global_server_args
        from sglang.srt.managers.schedule_batch import global_server_args_dict
        return type("ServerArgs", (), dict(global_server_args_dict))


def parallel_info():
    """{tp, tp_rank, pp, pp_rank, dp, dp_attention, ep, model_path} of this
    SGLang worker: sglang.srt.distributed's groups and the server args."""
    from sglang.srt.distributed import get_pp_group, get_tp_group

    sa = _server_args()
    tp, pp = get_tp_group(), get_pp_group()
    return {"tp": tp.world_size, "tp_rank": tp.rank_in_group, "pp": pp.world_size,
            "pp_rank": pp.rank_in_group, "dp": int(getattr(sa, "dp_size", 1) or 1),
            "dp_attention": bool(getattr(sa, "enable_dp_attention", False)),
            "ep": int(getattr(sa, "ep_size", 1) or 1),
            "model_path": getattr(sa, "model_path", None)}


def default_spec(par):
    """The sglang layout spec for these parallel sizes; refuses what one
    worker cannot place (dp replicas without dp-attention)."""
    if par["dp"] > 1 and not par["dp_attention"]:
        raise ValueError("SGLang --dp %d without --enable-dp-attention runs independent "
                         "replicas, and a worker cannot tell which it is: run one engine per "
                         "replica, each syncing as its own group" % par["dp"])
    spec = "sglang:tp=%d" % par["tp"]
    if par["pp"] > 1:
        spec += ",pp=%d" % par["pp"]
    if par["dp"] > 1:
        spec += ",dp=%d,dp_attention=1" % par["dp"]
    if par["ep"] > 1:
        spec += ",ep=%d" % par["ep"]
    return spec


def _config_path(par, config):
    if config:
        return config
    path = par.get("model_path")
    if path and os.path.isfile(os.path.join(path, "config.json")):
        return os.path.join(path, "config.json")
    raise ValueError("wex.sglang.load: the model %r is not a local directory with a "
                     "config.json; pass config= (the path of the model's config.json)"
                     % (path,))


def _attach(model, args):
    par = parallel_info()
    if par["dp"] > 1 and not par["dp_attention"]:
        default_spec(par)  # raises, saying why
    spec = args.get("layout")
    layout = wex.Layout(_config_path(par, args.get("config")),
                        spec or default_spec(par), args.get("adapters"))
    device = None
    for _, t in model.named_parameters():
        if getattr(t, "is_cuda", False):
            device = t.device.index
            break
    return EngineRank(args["model"], model.named_parameters(),
                      rank=par["tp_rank"] + par["tp"] * par["pp_rank"],
                      world_size=par["tp"] * par["pp"], layout=layout,
                      group=args.get("group"), socket=args.get("socket"),
                      timeout_ms=args.get("timeout_ms"), copy_threads=args.get("copy_threads"),
                      device=device, strip_prefix=args.get("strip_prefix"),
                      ignore=args.get("ignore") or ())


def load(model, named_tensors):
    """SGLang's custom weight loader (--custom-weight-loader
    wex.sglang.load): attaches this worker's parameters on its first
    request, then syncs them in place.  Returns the sync's dict (SGLang
    drops it) or None for detach."""
    args = _parse(named_tensors)
    attach = {k: args.get(k) for k in _ATTACH_KEYS}
    held = _ranks.get(id(model))
    if args.get("detach"):
        if held is not None:
            held[0].close()
            del _ranks[id(model)]
        return None
    if held is None:
        rank = _attach(model, args)
        _ranks[id(model)] = held = (rank, attach, model)
        log.info("wex: attached %s", rank.describe())
    elif held[1] != attach:
        changed = sorted(k for k in _ATTACH_KEYS if held[1].get(k) != attach.get(k))
        raise ValueError("wex.sglang.load: this worker is attached with other arguments "
                         "(%s differ): send detach=True first" % ", ".join(changed))
    out = held[0].sync(min_version=args.get("min_version", 0),
                       timeout_ms=args.get("sync_timeout_ms", 0),
                       verify=args.get("verify", False))
    if args.get("post_load"):
        fn = getattr(model, "post_load_weights", None)
        if fn is None:
            raise ValueError("post_load=True, but %s has no post_load_weights()"
                             % type(model).__name__)
        fn()
    log.info("wex: rank %d of %s now holds version %d (%d bytes copied in %.3f s)",
             out["rank"], out["group"], out["version"], out["bytes"], out["seconds"])
    return out
