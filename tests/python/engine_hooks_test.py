#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""engine_hooks_test - the hooks that run inside vLLM's and SGLang's worker
processes (wex.vllm.WorkerExtension, wex.sglang.load) and wex.engine,
through a real wexd, CPU PyTorch on host segments.

The trainer is layout_glue_test's producer child: Megatron tp=2 ranks of a
tiny Qwen2 registered with register_module(layout=megatron:tp=2).  The
engines are stand-ins: objects with the attributes the hooks read of
vLLM's Worker (model_runner.model, device, vllm_config) and SGLang's
loader arguments, the modules the hooks import from the engines
(vllm.distributed.parallel_state, sglang.srt.distributed,
sglang.srt.server_args; neither engine is installed here) answering given
parallel sizes, and torch modules holding the engines' parameters under
the layouts' names (qkv_proj, gate_up_proj, padded vocabulary).  Checked:
  - vLLM: wex_attach derives the layout (vllm:tp=2) and the rank from the
    parallel state and the config from the model directory; wex_sync
    copies in place, verified, byte for byte what wexctl convert writes
    for each rank, and wexd's view (check_group) agrees; a later version
    overwrites weights the engine changed; wrapper prefixes stripped,
    ignored parameters left alone and listed; a re-allocated parameter is
    refused by name (its memory still held), and so is one replaced by a
    new Parameter object (nothing written into the orphaned one), or
    removed or added, when the parameters are given as a callable;
  - refused with a message that says what to do: a sync before attach, a
    second attach, a parameter the layout lacks, a model directory
    without config.json, a layout whose world is not the engine's, MLA,
    EPLB, expert_placement_strategy round_robin, enable_elastic_ep,
    prefill context parallelism, a dense DP replica without {dp} in its
    group (and {dp} substituted), {dp} with experts and dp > 1; for a
    model with experts, the MoE settings that re-lay out expert weights
    (VLLM_USE_FLASHINFER_MOE_*, VLLM_ROCM_USE_AITER[_MOE], moe_backend, a
    FusedMoE quant_method's backend), which a dense model ignores; a
    block-FP8 model vLLM requantizes for DeepGEMM (is_deep_gemm_e8m0_used and,
    for a Linear layer, should_use_deepgemm_for_fp8_linear: not with a float16
    model dtype or DeepGEMM unsupported); FP8 weights vLLM converted to
    e4m3fnuz on ROCm MI300; an unquantized checkpoint vLLM quantizes after
    loading (quantization="fp8"); a
    dense model with enable_expert_parallel (or SGLang --ep-size) gets no
    ep= in its spec, and a model other than DeepSeek under SGLang's
    --moe-dense-tp-size 1 no dense_tp=;
  - default specs from SGLang's server arguments (dp-attention, ep,
    dp_lm_head, dense_tp, a2a, fuse_shared) and their refusals (dp
    replicas, EPLB, redundant experts, a placement file, attention CP,
    moe-dp, an SGLang with neither get_global_server_args nor
    runtime_context.get_server_args; one that retired the first for the
    second reads its arguments there);
  - SGLang: the request read twice by an unrelated process after torch's
    ForkingPickler, refused under the file_system sharing strategy; the
    loader attaches on the first call, syncs on each, runs
    post_load_weights after a sync that changed the weights unless told
    not to (not for the same version again), detaches (only its own
    group); a failure that leaves the weights as they were is logged and
    returns (status() says why, check() names the rank behind) and the
    retry syncs; one that leaves them mixed raises, post_load_weights
    failing after a changed sync included (the rank detached, check()
    fails, the next request recovers); post_load=True without
    post_load_weights is refused before attaching; bad requests are
    logged; the draft model is skipped;
  - sleep mode (vLLM's sleep/wake_up, SGLang's torch_memory_saver
    pause/resume, both simulated on the CPU by scribbling on the
    weights): a sync (request) while the weights are released is refused
    before touching them, as is a vLLM attach; woken with a CPU backup
    (vLLM level 1, --enable-weights-cpu-backup) the version held stands;
    woken without one, a sync of the version held copies it whole again
    (a sync would otherwise copy nothing and serve the scribble); a vLLM
    sleep before wex_attach is seen in vLLM's state; a vLLM sleep called
    while a sync waits for its version in another thread waits for it
    (its CPU backup holds the copied bytes);
  - wex.trainer.TrainerRank: Megatron tp=2 ranks registered through their
    layout (a wrapper prefix stripped, a parameter ignored) publish around
    a step that changes them in place, engines (wex.engine.EngineRank,
    vllm:tp=2) hold the new bytes; a step that raises publishes nothing
    and leaves describe()["writing"] at its version, another version is
    refused while it is open, and its retry publishes; a parameter
    moved to new memory since it was registered is refused by name
    (nothing begun, or the version left unpublished).
Needs Debian's python3-torch (exit 77 with the reason without it).
Environment: WEX_LIB, WEXD_BIN, WEXCTL_BIN, PYTHONPATH with adapters/python.
"""
import enum
import errno
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
import unittest.mock

try:
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("engine_hooks_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
import wex.checkpoint
import wex.engine
import wex.sglang
import wex.vllm
from wex import torch_util
from wexd_harness import WexdProducerCase
import layout_glue_test as glue

MODEL = glue.MODEL


def module_of(named, prefix=""):
    """A torch module whose named_parameters() are `named` (dotted names
    become submodules, as in the engines' models), under `prefix`."""
    root = torch.nn.Module()
    for name, t in named.items():
        *path, leaf = (prefix + name).split(".")
        m = root
        for p in path:
            if p not in m._modules:
                m.add_module(p, torch.nn.Module())
            m = m._modules[p]
        m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


def params_of(module, prefix=""):
    return {n[len(prefix):]: p.data for n, p in module.named_parameters()}


# What the hooks import from the engines, which are not installed here:
# vllm.distributed.parallel_state's groups, sglang.srt.distributed's and
# sglang.srt.server_args.get_global_server_args, answering from PAR and
# SERVER_ARGS, so the hooks' own detection code runs.
PAR = {}
SERVER_ARGS = types.SimpleNamespace()


def _group(key):
    def get():
        size, rank = PAR.get(key, (1, 0))
        if size is None:  # as vLLM's get_pcp_group() where _PCP was never made
            raise AssertionError("%s group is not initialized" % key)
        return types.SimpleNamespace(world_size=size, rank_in_group=rank)
    return get


def install_engine_modules():
    mods = {}
    for name in ("vllm", "vllm.distributed", "vllm.distributed.parallel_state", "sglang",
                 "sglang.srt", "sglang.srt.distributed", "sglang.srt.server_args"):
        mods[name] = types.ModuleType(name)
        sys.modules[name] = mods[name]
    ps = mods["vllm.distributed.parallel_state"]
    ps.get_tp_group, ps.get_pp_group = _group("tp"), _group("pp")
    ps.get_dp_group, ps.get_pcp_group = _group("dp"), _group("pcp")
    mods["vllm.distributed"].parallel_state = ps
    sd = mods["sglang.srt.distributed"]
    sd.get_tp_group, sd.get_pp_group = _group("tp"), _group("pp")
    mods["sglang.srt.server_args"].get_global_server_args = lambda: SERVER_ARGS


install_engine_modules()


def set_par(tp=(2, 0), pp=(1, 0), dp=(1, 0), pcp=(1, 0)):
    PAR.clear()
    PAR.update(tp=tp, pp=pp, dp=dp, pcp=pcp)


def set_server_args(model_path, **kw):
    SERVER_ARGS.__dict__.clear()
    SERVER_ARGS.__dict__.update(dict(model_path=model_path, dp_size=1,
                                     enable_dp_attention=False, ep_size=1), **kw)


class VllmWorker(wex.vllm.WorkerExtension):
    """What wex.vllm.WorkerExtension reads of vLLM's Worker."""

    def __init__(self, model_dir, module, use_mla=False, moe_backend=None, load_format=None,
                 **parallel):
        self.model_runner = types.SimpleNamespace(model=module)
        self.device = torch.device("cpu")
        self.vllm_config = types.SimpleNamespace(
            kernel_config=types.SimpleNamespace(moe_backend=moe_backend or "auto"),
            model_config=types.SimpleNamespace(model=model_dir, use_mla=use_mla),
            parallel_config=types.SimpleNamespace(**dict(
                dict(enable_expert_parallel=False, enable_eplb=False,
                     data_parallel_index=0), **parallel)))
        if load_format is not None:  # vLLM's LoadConfig
            self.vllm_config.load_config = types.SimpleNamespace(load_format=load_format)


def scribble(module, value):
    """What new physical memory holds in place of the weights (here
    `value` everywhere: a CPU tensor cannot be unmapped)."""
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)


class SleepyWorker(VllmWorker):
    """VllmWorker with vLLM's sleep mode as its Worker and CuMemAllocator
    do it: sleep(level) backs the weights up at level 1, then releases
    their memory (scribbled on here: 3 everywhere); wake_up(tags) maps
    new memory (7 everywhere) and, after level 1, copies the backup
    back, for tags None or with "weights"."""

    def sleep(self, level=1):
        module = self.model_runner.model
        self.backup = ([p.detach().clone() for p in module.parameters()]
                       if level == 1 else None)
        scribble(module, 3)

    def wake_up(self, tags=None):
        if tags is not None and "weights" not in tags:
            return
        module = self.model_runner.model
        scribble(module, 7)
        if self.backup is not None:
            with torch.no_grad():
                for p, b in zip(module.parameters(), self.backup):
                    p.copy_(b)
        self.backup = None


class TaggedSleepyWorker(SleepyWorker):
    """SleepyWorker as newer vLLM's Worker sleeps (vllm/v1/worker/
    gpu_worker.py, sleep(level=1, tags=None), which its executor calls
    with kwargs level and tags): tags None sleeps the weights and the KV
    cache, backing the weights up at level 1 only; given tags
    (LLM.sleep(tags=[...])) sleep those alone, with no CPU backup: the
    weights untouched without "weights", discarded with it."""

    def sleep(self, level=1, tags=None):
        if "weights" not in (tags if tags is not None else ["weights", "kv_cache"]):
            return
        module = self.model_runner.model
        self.backup = ([p.detach().clone() for p in module.parameters()]
                       if tags is None and level == 1 else None)
        scribble(module, 3)


class DiscardingWorker(SleepyWorker):
    """SleepyWorker as the 2026 vLLM Worker sleeps (vllm/v1/worker/
    gpu_worker.py; vllm-project/vllm's tests/v1/worker test
    test_worker_tracks_asleep_tags_across_sleep_and_partial_wake): it
    keeps the tags it released in _asleep_tags (sleep(level) adds weights
    and kv_cache, wake_up(tags) removes the tags woken, None: all), and
    discard(tags) (the executor's discard; CuMemBackend.discard ->
    CuMemAllocator.discard, vllm/device_allocator/sleep_mode_backend.py)
    releases those tags' memory with no CPU backup."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._asleep_tags = set()

    def sleep(self, level=1):
        super().sleep(level)
        self._asleep_tags = {"weights", "kv_cache"}

    def wake_up(self, tags=None):
        super().wake_up(tags)
        self._asleep_tags -= set(tags) if tags is not None else set(self._asleep_tags)

    def discard(self, tags):
        self._asleep_tags |= set(tags)
        if "weights" in tags:
            self.backup = None
            scribble(self.model_runner.model, 3)


class PinnedSleepyWorker(SleepyWorker):
    """SleepyWorker with a sleep-mode backend other than vLLM's "cumem"
    (model_config.sleep_mode_backend; vllm/device_allocator/
    sleep_mode_backend.py: SleepModeBackendFactory, plugins register
    more) that keeps the host copy of the weights it took at the first
    suspend for the life of the process, as a vLLM "pinned_weights"
    backend (PinnedWeightsBackend._attach_backups) does: later level-1
    sleeps only unmap, and each wake-up copies that first copy back."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.vllm_config.model_config.sleep_mode_backend = "pinned_weights"
        self.pinned = None

    def sleep(self, level=1):
        if self.pinned is None:
            self.pinned = [p.detach().clone() for p in self.model_runner.model.parameters()]
        self.backup = self.pinned
        scribble(self.model_runner.model, 3)


class ReloadingWorker(VllmWorker):
    """VllmWorker with the worker's reload_weights as vLLM's
    GPUModelRunner.reload_weights(weights_iterator=None, weights_path=None,
    is_checkpoint_format=True) does it (vllm/v1/worker/gpu_model_runner.py,
    2026): model.load_weights of the weights given (or the checkpoint's),
    or, where is_checkpoint_format=False (weights already in kernel
    format), model.get_parameter(name).copy_(weight) of each, which does
    not go through load_weights."""

    def reload_weights(self, weights_iterator=None, weights_path=None,
                       is_checkpoint_format=True):
        model = self.model_runner.model
        weights = list(weights_iterator or [])
        if is_checkpoint_format:
            model.load_weights(weights)
            return
        with torch.no_grad():
            for name, weight in weights:
                model.get_parameter(name).copy_(weight)


class ResidentReloadingWorker(DiscardingWorker, ReloadingWorker):
    """DiscardingWorker with ReloadingWorker's reload_weights, refused
    while "weights" sleep as the 2026 worker refuses it
    (_require_resident_weights: RuntimeError naming the sleep, before
    anything is written; vllm-project/vllm's tests/v1/worker test
    test_reload_weights_rejected_while_weights_asleep)."""

    def reload_weights(self, *a, **kw):
        if "weights" in self._asleep_tags:
            raise RuntimeError("Cannot reload weights while the weights are asleep")
        return ReloadingWorker.reload_weights(self, *a, **kw)


class CuMemAllocation:
    """vLLM's AllocationData (vllm/device_allocator/__init__.py at
    055e47c28003156421365af985d676fc921cb075, cumem.py): handle, tag,
    cpu_backup_tensor and is_asleep, which CuMemAllocator.sleep() sets
    on every allocation it unmaps (backing up those of offload_tags),
    discard(tags) on those of the tags (no backup), and wake_up(tags)
    clears on those it maps again."""

    def __init__(self, tag, cpu_backup_tensor=None, is_asleep=False):
        self.handle = (0, 4096, id(self), 0)
        self.tag, self.cpu_backup_tensor, self.is_asleep = tag, cpu_backup_tensor, is_asleep


class MemorySaver:
    """torch_memory_saver's process-wide instance as SGLang's
    release/resume_memory_occupation use it: pause(tag) releases the
    memory of that tag's regions (None: all), resume(tag) maps new memory,
    with the content copied back where `backup` (enable_cpu_backup)."""

    def __init__(self, models):
        self.models, self.backup, self.saved, self.fail = models, False, None, False

    def pause(self, tag=None):
        if tag in (None, "weights"):
            self.saved = ([[p.detach().clone() for p in m.parameters()] for m in self.models]
                          if self.backup else None)
            for m in self.models:
                scribble(m, 3)

    def resume(self, tag=None):
        if self.fail:
            raise RuntimeError("cuMemCreate: out of memory")
        if tag in (None, "weights"):
            for i, m in enumerate(self.models):
                scribble(m, 7)
                if self.saved is not None:
                    with torch.no_grad():
                        for p, b in zip(m.parameters(), self.saved[i]):
                            p.copy_(b)
            self.saved = None


def all_equal(module, value):
    return all(bool((p == value).all()) for p in module.parameters())


def vpar(tp_rank, tp=2, pp=1, pp_rank=0, dp=1, dp_rank=0):
    return {"tp": tp, "tp_rank": tp_rank, "pp": pp, "pp_rank": pp_rank, "dp": dp,
            "dp_rank": dp_rank}


class EngineHooks(WexdProducerCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="wex-hooks-")
        d = cls.tmp.name
        os.environ["WEX_LAYOUT_TEST_DIR"] = d
        cfg = os.path.join(d, "config.json")
        with open(cfg, "w") as f:
            json.dump(glue.CONFIG, f)
        hf = wex.Layout(cfg, "hf")
        g = torch.Generator().manual_seed(11)
        canonical = {n: glue.to_bytes(torch.randn(s, generator=g).to(torch.bfloat16))
                     for n, _, s, _ in hf.rank(0)}
        os.mkdir(os.path.join(d, "hf"))
        glue.write_safetensors(os.path.join(d, "hf", "model.safetensors"),
                               [(n, dt, s, canonical[n]) for n, dt, s, _ in hf.rank(0)])
        for spec, out in (("megatron:tp=2", "megatron"), ("vllm:tp=2", "vllm"),
                          ("sglang:tp=2", "sglang")):
            r = subprocess.run([os.environ["WEXCTL_BIN"], "convert", "--config", cfg, "--from",
                                "hf", "--to", spec, os.path.join(d, "hf"),
                                os.path.join(d, out)], capture_output=True, text=True)
            assert r.returncode == 0, "wexctl convert --to %s: %s" % (spec, r.stderr)
        # A model directory without config.json (a hub id, say).
        os.mkdir(os.path.join(d, "noconfig"))
        # A config of a model with experts (the refusals that depend on
        # it come before the layout is opened).
        os.mkdir(os.path.join(d, "moe"))
        with open(os.path.join(d, "moe", "config.json"), "w") as f:
            json.dump(dict(glue.CONFIG, model_type="qwen3_moe", num_experts=4,
                           moe_intermediate_size=32), f)
        super().setUpClass()
        cls.version = 0

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.tmp.cleanup()

    def next_version(self):
        type(self).version += 1
        self.publish(self.version)
        return self.version

    def want(self, spec, k):
        return glue.read_safetensors(os.path.join(self.tmp.name, spec, "rank-%d.safetensors" % k))

    def engine_params(self, spec, k):
        d = self.tmp.name
        return torch_util.layout_tensors(wex.Layout(os.path.join(d, "config.json"),
                                                    "%s:tp=2" % spec), k)

    def assert_holds(self, params, spec, k):
        want = self.want(spec, k)
        self.assertEqual(sorted(want), sorted(params))
        for name, t in params.items():
            self.assertEqual(glue.to_bytes(t), want[name][2], "%s rank %d: %s" % (spec, k, name))

    def test_vllm_worker_extension(self):
        d = self.tmp.name
        workers, modules = [], []
        for k in range(2):
            # vLLM's model under a wrapper, with one tensor the layout lacks.
            p = self.engine_params("vllm", k)
            p["model.rotary_emb.inv_freq"] = torch.ones(4)
            m = module_of(p, prefix="module.")
            modules.append(m)
            workers.append(VllmWorker(d, m))

        def on(k, fn, *a, **kw):  # runs a worker's method as rank k of tp=2
            set_par(tp=(2, k))
            return getattr(workers[k], fn)(*a, **kw)

        # The parameter the layout lacks is refused by name unless ignored.
        with self.assertRaises(ValueError) as e:
            on(0, "wex_attach", model=MODEL, group="vllm", strip_prefix="module.")
        self.assertIn("model.rotary_emb.inv_freq", str(e.exception))
        self.assertIsNone(workers[0].wex_status())
        with self.assertRaises(ValueError) as e:
            on(0, "wex_sync", min_version=1)
        self.assertIn("wex_attach first", str(e.exception))
        for k, w in enumerate(workers):
            info = on(k, "wex_attach", model=MODEL, group="vllm", strip_prefix="module.",
                      ignore=["model.rotary_emb.*"])
            self.addCleanup(w.wex_detach)
            self.assertEqual((info["rank"], info["world_size"], info["layout"]), (k, 2, "vllm:tp=2"))
            self.assertEqual(info["ignored"], ["model.rotary_emb.inv_freq"])
            self.assertEqual(info["tensors"], len(self.want("vllm", k)))
        with self.assertRaises(ValueError) as e:
            on(0, "wex_attach", model=MODEL, group="vllm")
        self.assertIn("already attached", str(e.exception))

        v = self.next_version()
        for k, w in enumerate(workers):
            r = on(k, "wex_sync", min_version=v, verify=True)
            self.assertEqual((r["version"], r["rank"], r["group"]), (v, k, "vllm"))
            params = params_of(modules[k], "module.")
            ignored = params.pop("model.rotary_emb.inv_freq")
            self.assertTrue(torch.equal(ignored, torch.ones(4)))
            self.assertEqual(r["verified"], sum(t.numel() * 2 for t in params.values()))
            self.assertGreater(r["bytes"], 0)
            self.assertEqual(w.wex_status()["version"], v)
            self.assert_holds(params, "vllm", k)
        # wexd's view agrees (what a driver checks with DP engines).
        ranks = wex.engine.check_group(MODEL, "vllm", v, world_size=2)
        self.assertEqual([r["served"] for r in ranks], [v, v])

        # The engine's weights changed under it (or a failed rollout scribbled
        # on them): the next version is copied whole into the same tensors.
        qkv = modules[1].module.model.layers._modules["0"].self_attn.qkv_proj.weight
        ptr = qkv.data_ptr()
        with torch.no_grad():
            for p in modules[1].parameters():
                p.zero_()
        v = self.next_version()
        for k in range(2):
            self.assertEqual(on(k, "wex_sync", min_version=v)["version"], v)
        self.assertEqual(qkv.data_ptr(), ptr)
        params = params_of(modules[1], "module.")
        params.pop("model.rotary_emb.inv_freq")
        self.assert_holds(params, "vllm", 1)

        # A version that never comes: the wait ends with an error, and
        # check_group names the ranks behind.
        with self.assertRaises(wex.WexError):
            on(0, "wex_sync", min_version=v + 100, timeout_ms=300)
        with self.assertRaises(RuntimeError) as e:
            wex.engine.check_group(MODEL, "vllm", v + 100)
        self.assertIn("rank 0 at version %d" % v, str(e.exception))

        # The engine re-allocated a parameter (a reload): its old memory is
        # not written; the sync is refused until attached again.
        qkv.data = qkv.data.clone()
        with self.assertRaises(ValueError) as e:
            on(1, "wex_sync", min_version=v)
        self.assertIn("re-allocated", str(e.exception))
        self.assertIn("qkv_proj", str(e.exception))
        # The memory attached is still held by the client (not freed for
        # another tensor while wex may write it).
        kept = [x for e in workers[1]._wex.client._attached
                for x in (e if isinstance(e, tuple) else (e,))]
        self.assertTrue(any(t.data_ptr() == ptr for t in kept))

    def test_vllm_refusals(self):
        d = self.tmp.name
        m = module_of(self.engine_params("vllm", 0))
        set_par(tp=(2, 0))
        w = VllmWorker(os.path.join(d, "noconfig"), m)
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="cfg")
        self.assertIn("config=", str(e.exception))
        # config= given: attaches.
        info = w.wex_attach(model=MODEL, group="cfg", config=os.path.join(d, "config.json"))
        self.assertEqual(info["layout"], "vllm:tp=2")
        w.wex_detach()
        self.assertIsNone(w.wex_status())
        # The layout's world is not the engine's.
        set_par(tp=(4, 0))
        w = VllmWorker(d, m)
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="world", layout="vllm:tp=2")
        self.assertIn("has 2 ranks, but this engine runs 4", str(e.exception))
        # tp=4 of 2 KV heads and 4 heads exists, but these parameters are tp=2's.
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="world")
        self.assertIn("shape", str(e.exception))
        # What a copy of the checkpoint's tensors cannot keep right.
        set_par(tp=(2, 0))
        for kw, words in (({"use_mla": True}, "MLA"), ({"enable_eplb": True}, "EPLB")):
            with self.assertRaises(ValueError) as e:
                VllmWorker(d, m, **kw).wex_attach(model=MODEL, group="x")
            self.assertIn(words, str(e.exception))
        set_par(tp=(2, 0), pcp=(2, 0))
        with self.assertRaises(ValueError) as e:
            VllmWorker(d, m).wex_attach(model=MODEL, group="x")
        self.assertIn("context parallel", str(e.exception))
        # Dense data parallelism: engine 1 is an engine of its own; without
        # {dp} in the group it would take engine 0's ranks.
        set_par(tp=(2, 0))
        with self.assertRaises(ValueError) as e:
            VllmWorker(d, m, data_parallel_index=1).wex_attach(model=MODEL, group="roll")
        self.assertIn("{dp}", str(e.exception))
        w = VllmWorker(d, m, data_parallel_index=1)
        self.assertEqual(w.wex_attach(model=MODEL, group="roll-{dp}")["group"], "roll-1")
        w.wex_detach()
        # vLLM before PR #30739 (no data_parallel_index; a dense engine's
        # data_parallel_rank reset to 0): {dp} is 0 in every replica, and
        # the second replica's rank is refused, held by the first.
        old = [VllmWorker(d, m) for _ in range(2)]
        for x in old:
            del x.vllm_config.parallel_config.data_parallel_index
        self.assertEqual(old[0].wex_attach(model=MODEL, group="old-{dp}")["group"], "old-0")
        with self.assertRaises(wex.WexError) as e:
            old[1].wex_attach(model=MODEL, group="old-{dp}")
        self.assertIn("rank 0 of group 'old-0' is held by pid %d" % os.getpid(),
                      str(e.exception))
        old[0].wex_detach()
        # Dense data parallelism vLLM keeps in one world (external_launcher:
        # data_parallel_size stays 2): with {dp}, replica 1's ranks are a
        # group of their own, tp ranks from 0, no dp in the layout (its
        # world was tp * dp, which that group could never complete);
        # without {dp}, one group of all replicas, dp in the layout.
        for k in range(2):
            set_par(tp=(2, k), dp=(2, 1))
            w = VllmWorker(d, m, data_parallel_index=1,
                           distributed_executor_backend="external_launcher")
            info = w.wex_attach(model=MODEL, group="roll-{dp}")
            self.assertEqual((info["group"], info["rank"], info["world_size"], info["layout"]),
                             ("roll-1", k, 2, "vllm:tp=2"))
            w.wex_detach()
            w = VllmWorker(d, m, data_parallel_index=1,
                           distributed_executor_backend="external_launcher")
            info = w.wex_attach(model=MODEL, group="roll")
            self.assertEqual((info["group"], info["rank"], info["world_size"], info["layout"]),
                             ("roll", k + 2, 4, "vllm:tp=2,dp=2"))
            w.wex_detach()
        # A vLLM whose get_pcp_group()/get_dp_group() assert (never
        # initialised): none of that parallelism, not an AssertionError.
        set_par(tp=(2, 0), dp=(None, 0), pcp=(None, 0))
        w = VllmWorker(d, m)
        self.assertEqual(w.wex_attach(model=MODEL, group="x")["world_size"], 2)
        w.wex_detach()
        set_par(tp=(2, 0))
        # Experts placed other than contiguously, or DP/EP resized at run time.
        for kw, words in (({"expert_placement_strategy": "round_robin"},
                           "expert_placement_strategy='round_robin'"),
                          ({"enable_elastic_ep": True}, "enable_elastic_ep")):
            with self.assertRaises(ValueError) as e:
                VllmWorker(d, m, **kw).wex_attach(model=MODEL, group="x")
            self.assertIn(words, str(e.exception))
        w = VllmWorker(d, m, expert_placement_strategy="linear", enable_elastic_ep=False)
        w.wex_attach(model=MODEL, group="x")
        w.wex_detach()
        # A dense model with enable_expert_parallel (vLLM ignores it): no ep=.
        w = VllmWorker(d, m, enable_expert_parallel=True)
        self.assertEqual(w.wex_attach(model=MODEL, group="x")["layout"], "vllm:tp=2")
        w.wex_detach()
        # {dp} with a model with experts and dp > 1: one engine, one group.
        moe = os.path.join(d, "moe")
        set_par(tp=(2, 0), dp=(2, 1))
        with self.assertRaises(ValueError) as e:
            VllmWorker(moe, m, data_parallel_index=1).wex_attach(model=MODEL, group="r-{dp}")
        self.assertIn("{dp}", str(e.exception))
        self.assertIn("one engine", str(e.exception))
        set_par(tp=(2, 0))

    def test_vllm_deepseek_without_mla(self):
        """vLLM refuses nothing for DeepSeek with MLA off (VLLM_MLA_DISABLE=1,
        use_mla False; with MLA the hook refuses it): DeepseekV2Attention
        then holds q_a_proj and kv_a_proj_with_mqa apart, whole, where MLA
        fuses them into fused_qkv_a_proj (vllm/model_executor/models/
        deepseek_v2.py); with sequence-parallel MoE (use_sequence_parallel_moe:
        DP + EP with tp > 1) DeepseekV2MoE builds the shared experts whole
        on every rank (DeepseekV2MLP disable_tp=is_sequence_parallel).
        Those are the parameters the hook must attach."""
        d = os.path.join(self.tmp.name, "ds-nomla")
        os.makedirs(d, exist_ok=True)
        cfg = os.path.join(d, "config.json")
        with open(cfg, "w") as f:
            json.dump({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                       "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "intermediate_size": 24, "moe_intermediate_size": 8,
                       "n_routed_experts": 4, "n_shared_experts": 1,
                       "first_k_dense_replace": 1, "q_lora_rank": 12, "kv_lora_rank": 8,
                       "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
                       "vocab_size": 128, "torch_dtype": "bfloat16"}, f)

        def vllm_params(spec, sp_moe=False):
            # The MLA layout's tensors, as vLLM holds them with MLA off.
            out = {}
            for n, t in torch_util.layout_tensors(wex.Layout(cfg, spec), 0).items():
                if n.endswith("fused_qkv_a_proj.weight"):
                    pre = n[:-len("fused_qkv_a_proj.weight")]
                    out[pre + "q_a_proj.weight"] = t[:12].clone()
                    out[pre + "kv_a_proj_with_mqa.weight"] = t[12:].clone()
                elif sp_moe and "shared_experts.gate_up_proj" in n:
                    out[n] = torch.zeros(16, 16, dtype=t.dtype)
                elif sp_moe and "shared_experts.down_proj" in n:
                    out[n] = torch.zeros(16, 8, dtype=t.dtype)
                else:
                    out[n] = t
            return out

        set_par(tp=(2, 0))
        self.addCleanup(set_par)
        w = VllmWorker(d, module_of(vllm_params("vllm:tp=2")), use_mla=False)
        info = w.wex_attach(model=MODEL, group="ds", checkpoint=False)
        w.wex_detach()
        self.assertEqual(info["layout"], "vllm:tp=2,no_mla=1")
        set_par(tp=(2, 0), dp=(2, 0))
        w = VllmWorker(d, module_of(vllm_params("vllm:tp=2,dp=2,ep=4", sp_moe=True)),
                       use_mla=False, enable_expert_parallel=True,
                       use_sequence_parallel_moe=True)
        info = w.wex_attach(model=MODEL, group="ds-sp", checkpoint=False)
        w.wex_detach()
        self.assertEqual(info["layout"], "vllm:tp=2,dp=2,ep=4,no_mla=1,sp_moe=1")

    def test_vllm_mla_refusal_hint(self):
        """The MLA refusal says to restart vLLM with VLLM_MLA_DISABLE=1 only
        for the model types the vllm layout describes with MLA off
        (deepseek_v2, deepseek_v3).  vLLM's other MLA models (kimi_k2 and
        deepseek_v32 among them: ModelConfig.is_deepseek_mla) have no wex
        layout, MLA or not, and DeepSeek-V3.2's sparse attention does not
        even build without MLA (DeepseekV2Attention asserts it has no
        topk_indices_buffer): a restart on that advice would only fail
        again."""
        def refusal(model_type):
            d = os.path.join(self.tmp.name, "mla-" + model_type)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump({"model_type": model_type, "kv_lora_rank": 8}, f)
            w = VllmWorker(d, module_of({}), use_mla=True)
            with self.assertRaises(ValueError) as cm:
                w.wex_attach(model=MODEL, group="mla", checkpoint=False)
            return str(cm.exception)

        set_par(tp=(2, 0))
        self.addCleanup(set_par)
        for mt in ("deepseek_v3", "deepseek_v2"):
            self.assertIn("VLLM_MLA_DISABLE=1", refusal(mt))
        for mt in ("kimi_k2", "deepseek_v32"):
            msg = refusal(mt)
            self.assertIn("uses MLA", msg)
            self.assertNotIn("start vLLM with VLLM_MLA_DISABLE=1", msg)
            self.assertIn(mt, msg)

    def test_vllm_moe_relayout_refused(self):
        """MoE kernels that re-lay out the experts' weights in their shape
        (FlashInfer's w13 -> [w3; w1], ROCm AITER's shuffle): refused for
        a model with experts, by the variable or setting that selects
        them; a dense model is not refused for them."""
        d = self.tmp.name
        moe = os.path.join(d, "moe")
        m = module_of(self.engine_params("vllm", 0))
        set_par(tp=(2, 0))
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("VLLM_")}
        self.addCleanup(os.environ.update, saved)

        def attach_error(model_dir, module=m, **kw):
            w = VllmWorker(model_dir, module, **kw)
            try:
                w.wex_attach(model=MODEL, group="moe")
            except Exception as e:
                return str(e)
            finally:
                w.wex_detach()
            return None

        def with_env(env, fn):
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                return fn()
            finally:
                for k, v in old.items():
                    if v is None:
                        del os.environ[k]
                    else:
                        os.environ[k] = v

        # No such setting: the MoE checks pass (the layout of this small
        # config then refuses the dense parameters for other reasons).
        clean = attach_error(moe)
        self.assertNotIn("re-lay", clean or "")
        for env, name in (({"VLLM_USE_FLASHINFER_MOE_FP16": "1"}, "VLLM_USE_FLASHINFER_MOE_FP16"),
                          ({"VLLM_USE_FLASHINFER_MOE_FP8": "1"}, "VLLM_USE_FLASHINFER_MOE_FP8"),
                          ({"VLLM_ROCM_USE_AITER": "1"}, "VLLM_ROCM_USE_AITER"),
                          ({"VLLM_ROCM_USE_AITER": "true", "VLLM_ROCM_USE_AITER_MOE": "1"},
                           "VLLM_ROCM_USE_AITER_MOE")):
            err = with_env(env, lambda: attach_error(moe))
            self.assertIsNotNone(err, env)
            self.assertIn(name, err)
            # The same environment does not refuse a dense model.
            self.assertIsNone(with_env(env, lambda: attach_error(d)), env)
        # Set false: not refused for it.
        for env in ({"VLLM_USE_FLASHINFER_MOE_FP16": "0"},
                    {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "0"}):
            self.assertNotIn("re-lay", with_env(env, lambda: attach_error(moe)) or "", env)
        # vLLM's moe_backend setting, and a FusedMoE layer's quant_method.
        err = attach_error(moe, moe_backend="flashinfer_cutlass")
        self.assertIn("moe_backend='flashinfer_cutlass'", err)
        self.assertNotIn("re-lay", attach_error(moe, moe_backend="triton") or "")
        m2 = module_of(self.engine_params("vllm", 0))
        experts = m2.model.layers._modules["0"].mlp
        experts.quant_method = types.SimpleNamespace(
            unquantized_backend=types.SimpleNamespace(name="FLASHINFER_CUTLASS"))
        err = attach_error(moe, m2)
        self.assertIn("model.layers.0.mlp", err)
        self.assertIn("FLASHINFER_CUTLASS", err)
        experts.quant_method = types.SimpleNamespace(rocm_aiter_moe_enabled=True)
        self.assertIn("rocm_aiter_moe_enabled", attach_error(moe, m2))
        experts.quant_method = types.SimpleNamespace(
            unquantized_backend=types.SimpleNamespace(name="TRITON"))
        self.assertNotIn("re-lay", attach_error(moe, m2) or "")
        # An FP8 MoE method's backend, which vLLM picks with no variable or
        # setting (oracle/fp8.py: FlashInfer, DeepGEMM, AITER, Marlin
        # rewrite w13/w2; Triton and vLLM's CUTLASS leave them as loaded).
        Backend = enum.Enum("Fp8MoeBackend", "TRITON VLLM_CUTLASS FLASHINFER_CUTLASS AITER")

        class Fp8MoEMethod:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        for name in ("FLASHINFER_CUTLASS", "AITER"):
            experts.quant_method = Fp8MoEMethod(fp8_backend=Backend[name])
            err = attach_error(moe, m2)
            self.assertIn("%s MoE kernel backend (Fp8MoEMethod.fp8_backend)" % name, err or "")
        for name in ("TRITON", "VLLM_CUTLASS"):
            experts.quant_method = Fp8MoEMethod(fp8_backend=Backend[name])
            self.assertNotIn("re-lay", attach_error(moe, m2) or "", name)
        # vLLM's FusedMoEModularMethod, which replaces a layer's quant_method
        # after loading under DP + EP with an all2all backend, keeps the
        # method that converted the weights (and its backend) as
        # old_quant_method; newer layers also as base_quant_method.
        class FusedMoEModularMethod:
            def __init__(self, old):
                self.old_quant_method, self.disable_expert_map = old, False

        for name in ("FLASHINFER_CUTLASS", "AITER"):
            experts.quant_method = FusedMoEModularMethod(
                Fp8MoEMethod(fp8_backend=Backend[name]))
            err = attach_error(moe, m2)
            self.assertIn("%s MoE kernel backend (Fp8MoEMethod.fp8_backend)" % name, err or "")
        experts.quant_method = FusedMoEModularMethod(Fp8MoEMethod(rocm_aiter_moe_enabled=True))
        self.assertIn("rocm_aiter_moe_enabled", attach_error(moe, m2) or "")
        experts.quant_method = FusedMoEModularMethod(Fp8MoEMethod(fp8_backend=Backend.TRITON))
        experts.base_quant_method = Fp8MoEMethod(fp8_backend=Backend.FLASHINFER_CUTLASS)
        self.assertIn("FLASHINFER_CUTLASS", attach_error(moe, m2) or "")
        del experts.base_quant_method
        self.assertNotIn("re-lay", attach_error(moe, m2) or "")
        # A backend attribute of an MoE method that wex does not know:
        # refused (fails closed), even for a name that is fine elsewhere.
        experts.quant_method = Fp8MoEMethod(mxfp4_backend=Backend.TRITON)
        err = attach_error(moe, m2)
        self.assertIn("Fp8MoEMethod.mxfp4_backend", err or "")
        self.assertIn("does not know", err)
        # ... but a linear method's backend is not the experts'.
        LinearMethod = type("Fp8LinearMethod", (), {})
        lm = LinearMethod()
        lm.kernel_backend = Backend.AITER
        experts.quant_method = lm
        self.assertNotIn("re-lay", attach_error(moe, m2) or "")

    def test_vllm_routed_experts_names(self):
        """Newer vLLM releases keep a FusedMoE layer's expert weights on
        a child module (experts.routed_experts.w13_weight): wex_attach
        takes them as the vllm engine file's experts.w13_weight; both
        spellings of one weight are refused."""
        moe = os.path.join(self.tmp.name, "moe")
        layout = wex.Layout(os.path.join(moe, "config.json"), "vllm:tp=2")
        params = torch_util.layout_tensors(layout, 0)
        renamed = {n.replace(".experts.", ".experts.routed_experts."): t
                   for n, t in params.items()}
        self.assertTrue(any(".experts.routed_experts.w13_weight" in n for n in renamed))
        self.assertTrue(any(".experts.routed_experts.w2_weight" in n for n in renamed))
        set_par(tp=(2, 0))
        w = VllmWorker(moe, module_of(renamed))
        info = w.wex_attach(model=MODEL + "-moe", group="routed", checkpoint=False)
        self.addCleanup(w.wex_detach)
        self.assertEqual((info["tensors"], info["ignored"]), (len(params), []))
        # The old spelling beside the new one: one weight under two names.
        w13 = next(n for n in params if n.endswith("experts.w13_weight"))
        both = dict(renamed, **{w13: params[w13]})
        w2 = VllmWorker(moe, module_of(both))
        with self.assertRaises(ValueError) as e:
            w2.wex_attach(model=MODEL + "-moe", group="routed2", checkpoint=False)
        self.assertIn(w13, str(e.exception))
        self.assertEqual(list(wex.vllm.engine_names([("experts.routed_experts.w2_weight", 1)])),
                         [("experts.w2_weight", 1)])
        self.assertEqual(list(wex.vllm.engine_names([("experts.routed_experts.w2_weight", 1),
                                                     ("a.w", 2)], originals=True)),
                         [("experts.w2_weight", 1, "experts.routed_experts.w2_weight"),
                          ("a.w", 2, "a.w")])
        # ignore= patterns written with vLLM's names match them: a weight
        # the layout does not hold is left out; one it holds is then
        # missing (as under the file's name), not updated unasked.
        extra = dict(renamed)
        extra[w13.replace(".experts.", ".experts.routed_experts.") + "_extra"] = torch.zeros(2)
        w3 = VllmWorker(moe, module_of(extra))
        info = w3.wex_attach(model=MODEL + "-moe", group="routed3", checkpoint=False,
                             ignore=["*.routed_experts.*_extra"])
        self.addCleanup(w3.wex_detach)
        self.assertEqual((info["tensors"], info["ignored"]), (len(params), [w13 + "_extra"]))
        w4 = VllmWorker(moe, module_of(renamed))
        with self.assertRaises(ValueError) as e:
            w4.wex_attach(model=MODEL + "-moe", group="routed4", checkpoint=False,
                          ignore=[w13.replace(".experts.", ".experts.routed_experts.")])
        self.assertIn("missing %s" % w13, str(e.exception))

    def test_vllm_rocm_padding_refused(self):
        """On ROCm vLLM pads the rows of a FusedMoE layer's w13_weight and
        w2_weight after loading (VLLM_ROCM_MOE_PADDING, on by default:
        fused_moe/unquantized_fused_moe_method.py _maybe_pad_weight,
        F.pad(w, (0, 256 bytes))[..., :-pad], kept for the Triton
        backend, the one wex allows there), and an FP8 Linear weight's
        (VLLM_ROCM_FP8_PADDING, quantization/fp8.py): the same shape and
        values, rows apart.  The vllm layout's pieces are in C order, so
        wex_attach refuses such a tensor, naming the variable to set to
        0, not only saying that it is not contiguous."""
        moe = os.path.join(self.tmp.name, "moe")
        layout = wex.Layout(os.path.join(moe, "config.json"), "vllm:tp=2")
        params = torch_util.layout_tensors(layout, 0)
        w13 = next(n for n in params if n.endswith("experts.w13_weight"))
        w2 = next(n for n in params if n.endswith("experts.w2_weight"))
        set_par(tp=(2, 0))

        def padded(t):
            pad = 256 // t.element_size()
            return torch.nn.functional.pad(t, (0, pad))[..., :-pad]

        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("VLLM_")}
        self.addCleanup(os.environ.update, saved)
        for name in (w13, w2):
            p = dict(params, **{name: padded(params[name])})
            self.assertFalse(p[name].is_contiguous())
            w = VllmWorker(moe, module_of(p))
            with unittest.mock.patch.object(torch.version, "hip", "6.3.0", create=True):
                with self.assertRaises(ValueError) as e:
                    w.wex_attach(model=MODEL + "-moe", group="rocm-pad", checkpoint=False)
            self.assertIsNone(w.wex_status())  # nothing attached
            self.assertIn(name, str(e.exception))
            self.assertIn("VLLM_ROCM_MOE_PADDING=0", str(e.exception))
        # A dense model's padded FP8 Linear weight (here a BF16 stand-in).
        d = self.tmp.name
        dense = self.engine_params("vllm", 0)
        o = next(n for n in dense if n.endswith("self_attn.o_proj.weight"))
        dense[o] = padded(dense[o])
        w = VllmWorker(d, module_of(dense))
        with unittest.mock.patch.object(torch.version, "hip", "6.3.0", create=True):
            with self.assertRaises(ValueError) as e:
                w.wex_attach(model=MODEL, group="rocm-pad2", checkpoint=False)
        self.assertIn(o, str(e.exception))
        self.assertIn("VLLM_ROCM_FP8_PADDING=0", str(e.exception))
        # An ignored parameter is not refused for its strides.
        w = VllmWorker(d, module_of(dict(dense, **{"extra.weight": padded(torch.zeros(4, 128))})))
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="rocm-pad3", checkpoint=False,
                         ignore=["extra.*"])
        self.assertNotIn("extra.weight", str(e.exception))
        self.assertIn(o, str(e.exception))
        # On CUDA, a block scale DeepGEMM keeps column-major (TMA-aligned)
        # after loading (Fp8MoEMethod get_col_major_tma_aligned_tensor,
        # fp8_utils transform_sf_into_required_layout): named, with the
        # variable that turns DeepGEMM off.
        plain = self.engine_params("vllm", 0)
        scale = o.replace(".weight", ".weight_scale_inv")
        w = VllmWorker(d, module_of(dict(plain, **{scale: torch.zeros(3, 4).t()})))
        with unittest.mock.patch.object(torch.version, "hip", None, create=True):
            with self.assertRaises(ValueError) as e:
                w.wex_attach(model=MODEL, group="dg-col", checkpoint=False)
        self.assertIn(scale, str(e.exception))
        self.assertIn("VLLM_USE_DEEP_GEMM=0", str(e.exception))

    def test_vllm_rocm_fnuz_refused(self):
        """On ROCm MI300 (gfx942) vLLM converts an FP8 e4m3fn checkpoint
        after loading (w8a8_utils normalize_e4m3fn_to_e4m3fnuz: the weight
        viewed as float8_e4m3fnuz, its scales doubled in new tensors): the
        trainer's e4m3fn bytes would be read as other values.  wex_attach
        refuses such a tensor naming that conversion, before anything is
        attached, not with a dtype message that leaves the cause unsaid.
        (Debian's torch has no float8 dtypes: int8 stands in for it.)"""
        d = self.tmp.name
        dense = self.engine_params("vllm", 0)
        o = next(n for n in dense if n.endswith("self_attn.o_proj.weight"))
        fnuz = getattr(torch, "float8_e4m3fnuz", torch.int8)
        dense[o] = torch.zeros(dense[o].shape, dtype=torch.int8).view(fnuz)
        set_par(tp=(2, 0))
        w = VllmWorker(d, module_of(dense))
        with unittest.mock.patch.object(torch, "float8_e4m3fnuz", fnuz, create=True):
            with self.assertRaises(ValueError) as e:
                w.wex_attach(model=MODEL, group="rocm-fnuz", checkpoint=False)
        self.assertIsNone(w.wex_status())  # nothing attached
        self.assertIn(o, str(e.exception))
        self.assertIn("normalize_e4m3fn_to_e4m3fnuz", str(e.exception))
        # Ignored: not refused for it.
        with unittest.mock.patch.object(torch, "float8_e4m3fnuz", fnuz, create=True):
            with self.assertRaises(ValueError) as e:
                w.wex_attach(model=MODEL, group="rocm-fnuz2", checkpoint=False, ignore=[o])
        self.assertNotIn("normalize_e4m3fn_to_e4m3fnuz", str(e.exception))

    def test_vllm_online_quant_refused(self):
        """vLLM started with quantization="fp8" on an unquantized checkpoint
        (config.json without quantization_config) quantizes it after
        loading (quantization/fp8.py Fp8LinearMethod: ops.scaled_fp8_quant,
        the weight replaced by qweight.t(), a weight_scale added): the
        layout's BF16 tensors are not what the kernels read.  Refused
        naming the quantization, not for the transposed weight's strides
        alone, nor on ROCm naming VLLM_ROCM_FP8_PADDING, which does not
        cause it.  Debian's torch has no float8: int8 stands in."""
        d = self.tmp.name
        dense = self.engine_params("vllm", 0)
        o = next(n for n in dense if n.endswith("self_attn.o_proj.weight"))
        qweight = torch.zeros(tuple(dense[o].shape)[::-1], dtype=torch.int8).t()
        quant = dict(dense, **{o: qweight, o + "_scale": torch.ones(1)})
        set_par(tp=(2, 0))
        for hip in (None, "6.3.0"):
            w = VllmWorker(d, module_of(quant))
            w.vllm_config.model_config.quantization = "fp8"
            with unittest.mock.patch.object(torch.version, "hip", hip, create=True):
                with self.assertRaises(ValueError) as e:
                    w.wex_attach(model=MODEL, group="online-quant", checkpoint=False)
            self.assertIsNone(w.wex_status())  # nothing attached
            self.assertIn("quantization='fp8'", str(e.exception))
            self.assertIn("without --quantization", str(e.exception))
            self.assertNotIn("PADDING", str(e.exception))
        # A quantization that does not quantize at load: not refused for it.
        w = VllmWorker(d, module_of(dense))
        w.vllm_config.model_config.quantization = "awq"
        w.wex_attach(model=MODEL, group="online-quant2", checkpoint=False)
        w.wex_detach()

    def test_vllm_pp_stage_ends(self):
        """vLLM's Qwen3-MoE (and Qwen2-MoE) builds model.embed_tokens,
        model.norm and lm_head on every pipeline stage (not
        PPMissingLayer), reading them on the first or last only: each
        stage attaches, those it does not read left out (ignored), the
        ones it reads attached."""
        moe = os.path.join(self.tmp.name, "moe")
        layout = wex.Layout(os.path.join(moe, "config.json"), "vllm:tp=1,pp=2")
        ends = {"model.embed_tokens.weight": (128, 64), "model.norm.weight": (64,),
                "lm_head.weight": (128, 64)}
        want = {0: ["lm_head.weight", "model.norm.weight"], 1: ["model.embed_tokens.weight"]}
        for k in range(2):
            params = torch_util.layout_tensors(layout, k)
            held = len(params)
            for name, shape in ends.items():
                params.setdefault(name, torch.zeros(shape, dtype=torch.bfloat16))
            set_par(tp=(1, 0), pp=(2, k))
            w = VllmWorker(moe, module_of(params))
            info = w.wex_attach(model=MODEL + "-pp", group="pp-ends", checkpoint=False)
            self.addCleanup(w.wex_detach)
            self.assertEqual(info["tensors"], held)
            self.assertEqual(sorted(info["ignored"]), want[k])
        self.assertEqual(wex.vllm.stage_end_ignores(layout, 0, vpar(0, tp=1)), ())

    def test_replaced_parameter_refused(self):
        """A parameter the engine replaced with a new Parameter object
        since attach (layer.weight = Parameter(new), vLLM's
        process_weights_after_loading on a reload) is refused by name at
        the next sync; nothing is written into the orphaned tensor."""
        d = self.tmp.name
        modules, workers = [], []
        for k in range(2):
            m = module_of(self.engine_params("vllm", k))
            modules.append(m)
            workers.append(VllmWorker(d, m))
            set_par(tp=(2, k))
            workers[k].wex_attach(model=MODEL, group="replaced")
            self.addCleanup(workers[k].wex_detach)
        v = self.next_version()
        for k in range(2):
            set_par(tp=(2, k))
            self.assertEqual(workers[k].wex_sync(min_version=v)["version"], v)
        attn = modules[0].model.layers._modules["0"].self_attn
        old = attn.qkv_proj.weight
        attn.qkv_proj.weight = torch.nn.Parameter(torch.zeros_like(old), requires_grad=False)
        with torch.no_grad():
            old.fill_(3)
        v = self.next_version()
        set_par(tp=(2, 0))
        with self.assertRaises(ValueError) as e:
            workers[0].wex_sync(min_version=v)
        self.assertIn("qkv_proj", str(e.exception))
        self.assertIn("replaced", str(e.exception))
        self.assertTrue(bool((old == 3).all()))        # not written
        self.assertTrue(bool((attn.qkv_proj.weight == 0).all()))
        self.assertIn("model.layers.0.self_attn.qkv_proj.weight (replaced by a new object)",
                      workers[0]._wex.moved())
        # Re-attached, the new Parameter is the one synced.
        attached = workers[0]._wex
        workers[0].wex_detach()
        with self.assertRaises(wex.WexError):  # (the layout the hook opened went with it)
            attached.layout.rank(0)
        workers[0].wex_attach(model=MODEL, group="replaced")
        self.assertEqual(workers[0].wex_sync(min_version=v)["version"], v)
        self.assert_holds(params_of(modules[0]), "vllm", 0)
        # EngineRank given the bound method: the same; a parameter removed
        # or added is named too.
        m = module_of(self.engine_params("vllm", 1))
        r = wex.engine.EngineRank(MODEL, m.named_parameters, rank=1, world_size=2,
                                  layout="vllm:tp=2", config=os.path.join(d, "config.json"),
                                  group="replaced-er")
        self.addCleanup(r.close)
        self.assertEqual(r.sync(min_version=v)["version"], v)
        norm = m.model.norm
        norm.weight = torch.nn.Parameter(norm.weight.detach().clone(), requires_grad=False)
        m.model.extra = torch.nn.Parameter(torch.zeros(2))
        self.assertEqual(sorted(r.moved()), ["model.extra (added)",
                                             "model.norm.weight (replaced by a new object)"])
        with self.assertRaises(ValueError):
            r.sync(min_version=v)
        # Given the module itself: its named_parameters, as above (was:
        # called as a function, running its forward, which failed with
        # "forward() missing ... argument" or "missing the required
        # forward function", nothing about parameters).
        m = module_of(self.engine_params("vllm", 0))
        r = wex.engine.EngineRank(MODEL, m, rank=0, world_size=2, layout="vllm:tp=2",
                                  config=os.path.join(d, "config.json"), group="replaced-mod")
        self.addCleanup(r.close)
        self.assertEqual(r.sync(min_version=v)["version"], v)
        self.assert_holds(params_of(m), "vllm", 0)
        norm = m.model.norm
        norm.weight = torch.nn.Parameter(norm.weight.detach().clone(), requires_grad=False)
        self.assertEqual(r.moved(), ["model.norm.weight (replaced by a new object)"])

    def test_layout_closed_with_rank(self):
        """A layout EngineRank or TrainerRank opened from a spec string is
        closed with the rank (before, only once collected); one given as a
        wex.Layout is the caller's, open still.  (TrainerRank's:
        test_trainer_rank.)"""
        d = self.tmp.name
        cfg = os.path.join(d, "config.json")
        m = module_of(self.engine_params("vllm", 0))
        r = wex.engine.EngineRank(MODEL, m, rank=0, world_size=2, layout="vllm:tp=2",
                                  config=cfg, group="own-layout")
        r.close()
        with self.assertRaises(wex.WexError) as e:
            r.layout.rank(0)
        self.assertIn("layout vllm:tp=2 is closed", str(e.exception))
        self.assertEqual(r.describe()["layout"], "vllm:tp=2")
        given = wex.Layout(cfg, "vllm:tp=2")
        self.addCleanup(given.close)
        r = wex.engine.EngineRank(MODEL, m, rank=0, world_size=2, layout=given,
                                  group="given-layout")
        r.close()
        self.assertTrue(given.rank(0))

    def waiting_sync(self, group):
        """(module, EngineRank of it in `group`, the next version, {"sync":
        the result or exception}, the thread) of a rank whose sync, on
        that thread, waits in wexd for a version 50 past the next."""
        m = module_of(self.engine_params("vllm", 0))
        r = wex.engine.EngineRank(MODEL, m.named_parameters, rank=0, world_size=2,
                                  layout="vllm:tp=2",
                                  config=os.path.join(self.tmp.name, "config.json"),
                                  group=group)
        self.addCleanup(r.close)
        v = self.next_version()
        out = {}

        def sync():
            try:
                out["sync"] = r.sync(min_version=v + 50, timeout_ms=60000)
            except BaseException as e:  # reported by the callers' assertions
                out["sync"] = e
        t = threading.Thread(target=sync, daemon=True)
        t.start()
        self.await_acquire(group)
        return m, r, v, out, t

    def test_forget_failed_then_sync(self):
        """A forget() that fails (wexd not answering the attach) still
        has the next sync copy every byte of the version (was: the next
        sync of the held version copied nothing, returning that version
        over the weights the caller had said were lost)."""
        m = module_of(self.engine_params("vllm", 0))
        r = wex.engine.EngineRank(MODEL, m.named_parameters, rank=0, world_size=2,
                                  layout="vllm:tp=2",
                                  config=os.path.join(self.tmp.name, "config.json"),
                                  group="forget-fails")
        self.addCleanup(r.close)
        v = self.next_version()
        self.assertEqual(r.sync(min_version=v)["version"], v)
        self.assert_holds(params_of(m), "vllm", 0)
        scribble(m, 5)  # the engine lost the bytes
        with unittest.mock.patch.object(wex.engine.torch_util, "attach_module",
                                        side_effect=wex.WexError(errno.ECONNRESET, "attach")):
            with self.assertRaises(wex.WexError):
                r.forget()
        out = r.sync(min_version=v)
        self.assertEqual(out["version"], v)
        self.assert_holds(params_of(m), "vllm", 0)

    def test_overwritten_during_sync(self):
        """overwritten() (the engine's own reload, in its thread) while a
        sync of the rank waits for a version in another thread cancels
        that wait and forgets at once (was: it waited, holding the
        engine's reload, until the version was published or the sync's
        wait timed out); the cancelled sync says why, and the next sync
        copies the whole version."""
        m, r, v, out, t = self.waiting_sync("overwriting")
        scribble(m, 5)  # the engine's reload wrote other weights in place
        said = {}
        ow = threading.Thread(target=lambda: said.update(ok=r.overwritten("a reload")),
                              daemon=True)
        t0 = time.monotonic()
        ow.start()
        ow.join(30)
        self.assertFalse(ow.is_alive(), "overwritten() waited for the sync's version")
        self.assertLess(time.monotonic() - t0, 30)
        self.assertTrue(said.get("ok"))
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(out["sync"], wex.WexError, out["sync"])
        self.assertEqual(out["sync"].code, errno.ECANCELED)
        self.assertIn("a reload", str(out["sync"]))
        self.assertEqual(r.version, 0)
        self.assertEqual(r.sync(min_version=v)["version"], v)
        self.assert_holds(params_of(m), "vllm", 0)

    def test_overwritten_spares_later_sync(self):
        """overwritten() cancels only the syncs that were running when it
        was called: one begun after it (which forgets first itself, and
        then copies the whole version) holding the client when overwritten()
        next tries for it runs on (was: cancelled, WexError ECANCELED, and
        overwritten() waited for it to end)."""
        m, r, v, out, t = self.waiting_sync("overwriting2")
        real, later, turns = r.client._lock, {}, [0]
        harness = self

        class Lock:  # the real lock; overwritten()'s second try finds the later sync there
            def __getattr__(self, name):
                return getattr(real, name)

            def __enter__(self):
                return real.__enter__()

            def __exit__(self, *a):
                return real.__exit__(*a)

            def acquire(self, *a, **k):
                if threading.current_thread().name == "overwriting":
                    turns[0] += 1
                    if turns[0] == 2:
                        t.join(10)  # the first sync, cancelled

                        def sync():
                            try:
                                later["sync"] = r.sync(min_version=v + 50, timeout_ms=1500)
                            except BaseException as e:
                                later["sync"] = e
                        later["t"] = threading.Thread(target=sync, daemon=True)
                        later["t"].start()
                        harness.await_acquire("overwriting2", thread=later["t"])
                return real.acquire(*a, **k)

            def release(self):
                return real.release()

        r.client._lock = Lock()
        try:
            said = {}
            ow = threading.Thread(target=lambda: said.update(ok=r.overwritten("a reload")),
                                  name="overwriting", daemon=True)
            ow.start()
            # (Bounds for a loaded machine: its joins and waits above, and
            # the later sync's 1.5 s.)
            ow.join(60)
            self.assertFalse(ow.is_alive())
            self.assertTrue(said.get("ok"))
            self.assertEqual(out["sync"].code, errno.ECANCELED)
            later["t"].join(30)
            self.assertFalse(later["t"].is_alive())
        finally:
            r.client._lock = real
        self.assertIsInstance(later["sync"], wex.WexError, later["sync"])
        self.assertNotEqual(later["sync"].code, errno.ECANCELED, later["sync"])
        self.assertEqual(r.forgotten, 1)
        self.assertEqual(r.sync(min_version=v)["version"], v)
        self.assert_holds(params_of(m), "vllm", 0)

    def test_overwritten_after_later_sync(self):
        """overwritten() whose turn for the client comes only once a sync
        begun after it has forgotten and copied the whole version, and
        ended, forgets no second time (was: it did, whenever that sync
        ended before overwritten() next tried for the client, as a sync
        that times out on a loaded machine may: the rank said version 0,
        and wexd counted it as not holding the version just copied)."""
        m, r, v, out, t = self.waiting_sync("overwriting3")
        real, later, turns = r.client._lock, {}, [0]

        class Lock:  # the real lock; before overwritten()'s second try, a later sync runs to its end
            def __getattr__(self, name):
                return getattr(real, name)

            def __enter__(self):
                return real.__enter__()

            def __exit__(self, *a):
                return real.__exit__(*a)

            def acquire(self, *a, **k):
                if threading.current_thread().name == "overwriting3":
                    turns[0] += 1
                    if turns[0] == 2:
                        t.join(10)  # the first sync, cancelled
                        s = threading.Thread(
                            target=lambda: later.update(sync=r.sync(min_version=v)))
                        s.start()
                        s.join(30)
                return real.acquire(*a, **k)

            def release(self):
                return real.release()

        r.client._lock = Lock()
        try:
            said = {}
            ow = threading.Thread(target=lambda: said.update(ok=r.overwritten("a reload")),
                                  name="overwriting3", daemon=True)
            ow.start()
            ow.join(30)
            self.assertFalse(ow.is_alive())
            self.assertTrue(said.get("ok"))
            self.assertEqual(out["sync"].code, errno.ECANCELED)
        finally:
            r.client._lock = real
        self.assertEqual((later["sync"]["version"], later["sync"]["changed"]), (v, 1))
        self.assertEqual(r.forgotten, 1)
        self.assertEqual(r.version, v)
        served = {x["rank"]: x.get("served", 0)
                  for x in wex.engine.group_status(MODEL, "overwriting3")}
        self.assertEqual(served.get(0), v)
        self.assertEqual(r.sync(min_version=v)["changed"], 0)
        self.assert_holds(params_of(m), "vllm", 0)

    def test_overwritten_during_forget(self):
        """overwritten() called while a forget() in another thread is
        between its attach and its end, with a sync in a third thread
        having copied the whole version in between (over the bytes the
        reload then wrote), forgets all the same (was: the forget's end
        cleared what overwritten() had asked, and overwritten() returned
        True without forgetting: wexd counted the rank as serving the
        version while the engine held the reload's weights, and the next
        sync copied nothing).  Both ways there: the forget ends while
        overwritten() waits for the client (held by another call), and
        just before overwritten() gets it."""
        m = module_of(self.engine_params("vllm", 0))
        r = wex.engine.EngineRank(MODEL, m.named_parameters, rank=0, world_size=2,
                                  layout="vllm:tp=2",
                                  config=os.path.join(self.tmp.name, "config.json"),
                                  group="forget-overwritten")
        self.addCleanup(r.close)
        v = self.next_version()
        self.assertEqual(r.sync(min_version=v)["version"], v)
        real_attach, real_lock = wex.engine.torch_util.attach_module, r.client._lock
        for n, held in enumerate((True, False)):
            attached, go = threading.Event(), threading.Event()

            def attach(*a, **k):  # the real one; the "forgetting" thread then pauses
                out = real_attach(*a, **k)
                if threading.current_thread().name == "forgetting":
                    attached.set()
                    go.wait(30)
                return out

            class Lock:  # the real lock; overwritten() tries for it once the forget ended
                def __getattr__(self, name):
                    return getattr(real_lock, name)

                def __enter__(self):
                    return real_lock.__enter__()

                def __exit__(self, *a):
                    return real_lock.__exit__(*a)

                def acquire(self, *a, **k):
                    if threading.current_thread().name == "overwriting4":
                        go.set()
                        f.join(30)
                    return real_lock.acquire(*a, **k)

                def release(self):
                    return real_lock.release()
            said = {}
            with unittest.mock.patch.object(wex.engine.torch_util, "attach_module", attach):
                f = threading.Thread(target=r.forget, name="forgetting", daemon=True)
                f.start()
                self.assertTrue(attached.wait(30))
                # A sync meanwhile: it forgets first itself, and copies the whole version.
                self.assertEqual(r.sync(min_version=v)["changed"], 1)
                scribble(m, 5 + n)  # then the engine's reload writes other weights in place
                ow = threading.Thread(target=lambda: said.update(ok=r.overwritten("a reload")),
                                      name="overwriting4", daemon=True)
                if held:
                    with real_lock:  # (a call on the client in another thread, as dirty())
                        ow.start()
                        t0 = time.monotonic()
                        while r._overwrites[0] != n + 1 and time.monotonic() - t0 < 30:
                            time.sleep(0.01)
                        go.set()
                        f.join(30)
                else:
                    r.client._lock = Lock()
                    try:
                        ow.start()
                        ow.join(30)
                    finally:
                        r.client._lock = real_lock
                ow.join(30)
                self.assertFalse(f.is_alive() or ow.is_alive())
            self.assertTrue(said.get("ok"))
            self.assertEqual(r.version, 0)
            served = {x["rank"]: x.get("served", 0)
                      for x in wex.engine.group_status(MODEL, "forget-overwritten")}
            self.assertNotEqual(served.get(0), v, "wexd counts the overwritten rank as serving "
                                "v%d (lock held: %s)" % (v, held))
            self.assertEqual(r.sync(min_version=v)["version"], v)
            self.assert_holds(params_of(m), "vllm", 0)

    def test_close_during_sync(self):
        """EngineRank.close() while a sync of the rank waits for a version
        in another thread cancels that wait (was: close waited the sync's
        whole timeout, and a sync it overtook failed with AttributeError):
        the sync raises WexError ECANCELED saying the rank is being
        closed; syncs after it raise ValueError; close() inside a sync of
        the rank is refused."""
        d = self.tmp.name
        m, r, v, out, t = self.waiting_sync("closing")
        t0 = time.monotonic()
        r.close()
        self.assertLess(time.monotonic() - t0, 10, "close() waited for the sync's timeout")
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertIsInstance(out["sync"], wex.WexError, out["sync"])
        self.assertEqual(out["sync"].code, errno.ECANCELED)
        self.assertIn("being closed", str(out["sync"]))
        self.assertIsNone(r.client)
        self.assertFalse(r.dirty())
        with self.assertRaises(ValueError):
            r.sync(min_version=v)
        r.close()  # again: nothing to do
        # dirty() in one thread while another closes the rank: False, as
        # for a closed rank (was: WexError EBADF "client is closed" when
        # the close came between its look at the client and its call).
        r3 = wex.engine.EngineRank(MODEL, m.named_parameters, rank=0, world_size=2,
                                   layout="vllm:tp=2", config=os.path.join(d, "config.json"),
                                   group="closing3")
        self.addCleanup(r3.close)
        real = r3.client.is_dirty

        def closed_meanwhile():
            closer = threading.Thread(target=r3.close)
            closer.start()
            closer.join()
            return real()
        r3.client.is_dirty = closed_meanwhile
        self.assertFalse(r3.dirty())
        # From inside a sync of the rank (a parameter callable that closes).
        r2 = wex.engine.EngineRank(MODEL, m.named_parameters, rank=0, world_size=2,
                                   layout="vllm:tp=2", config=os.path.join(d, "config.json"),
                                   group="closing2")
        self.addCleanup(r2.close)
        errs = []

        def closing_params():
            try:
                r2.close()
            except ValueError as e:
                errs.append(str(e))
            return m.named_parameters()
        r2._resolve = closing_params
        self.assertEqual(r2.sync(min_version=v)["version"], v)
        self.assertTrue(errs and "inside a sync" in errs[0], errs)
        self.assertIsNotNone(r2.client)

    def test_default_specs(self):
        self.assertEqual(wex.vllm.default_spec(vpar(0, tp=4)), "vllm:tp=4")
        self.assertEqual(wex.vllm.default_spec(vpar(0, tp=2, pp=2, dp=2), expert_parallel=True),
                         "vllm:tp=2,pp=2,dp=2,ep=4")
        # A custom pipeline split from the engines' variables.
        for var, spec in (("VLLM_PP_LAYER_PARTITION",
                           lambda: wex.vllm.default_spec(vpar(0, tp=2, pp=3))),):
            self.addCleanup(os.environ.pop, var, None)
            os.environ[var] = "10,12,6"
            self.assertEqual(spec(), "vllm:tp=2,pp=3,stages=10/12/6")
            for bad in ("10,18", "10,x,6"):
                os.environ[var] = bad
                with self.assertRaises(ValueError) as e:
                    spec()
                self.assertIn(var, str(e.exception))
            os.environ[var] = "28"
            self.assertEqual(wex.vllm.default_spec(vpar(0, tp=2)), "vllm:tp=2")
            os.environ.pop(var)
        # vLLM's layout rank orders dp inside pp.
        self.assertEqual(wex.vllm.layout_rank(vpar(1, tp=2, pp=2, pp_rank=1, dp=2, dp_rank=1)),
                         1 + 2 * (1 + 2 * 1))
        # SGLang's, from its server arguments through parallel_info.
        set_par(tp=(8, 3))
        set_server_args("/m", dp_size=4, enable_dp_attention=True, ep_size=8,
                        enable_dp_lm_head=True, moe_dense_tp_size=1, moe_a2a_backend="deepep")
        par = wex.sglang.parallel_info()
        self.assertEqual((par["tp"], par["tp_rank"], par["model_path"]), (8, 3, "/m"))
        self.assertEqual(wex.sglang.default_spec(par, fuse_shared=False),
                         "sglang:tp=8,dp=4,dp_attention=1,ep=8,dp_lm_head=1,dense_tp=1,a2a=1")
        set_server_args("/m", ep_size=2)
        self.assertEqual(wex.sglang.default_spec(wex.sglang.parallel_info(), fuse_shared=True),
                         "sglang:tp=8,ep=2,fuse_shared=1")
        set_par(tp=(8, 3), pp=(2, 1))
        set_server_args("/m")
        self.addCleanup(os.environ.pop, "SGLANG_PP_LAYER_PARTITION", None)
        os.environ["SGLANG_PP_LAYER_PARTITION"] = "20,8"
        self.assertEqual(wex.sglang.default_spec(wex.sglang.parallel_info()),
                         "sglang:tp=8,pp=2,stages=20/8")
        os.environ["SGLANG_PP_LAYER_PARTITION"] = "28"
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(wex.sglang.parallel_info())
        self.assertIn("SGLANG_PP_LAYER_PARTITION", str(e.exception))
        del os.environ["SGLANG_PP_LAYER_PARTITION"]
        set_par(tp=(8, 3))
        for kw, words in (({"dp_size": 2}, "enable-dp-attention"),
                          ({"enable_eplb": True}, "EPLB"),
                          ({"ep_num_redundant_experts": 8}, "redundant"),
                          ({"init_expert_location": "/tmp/placement.json"}, "EPLB"),
                          ({"attn_cp_size": 2}, "context parallelism"),
                          ({"moe_dp_size": 2}, "moe-dp-size"),
                          # sglang.srt.layers.moe.utils.MoeA2ABackend: only
                          # deepep/mooncake are described (a2a=1).
                          ({"moe_a2a_backend": "mori"}, "moe-a2a-backend mori"),
                          ({"moe_a2a_backend": "flashinfer"}, "moe-a2a-backend flashinfer")):
            set_server_args("/m", **kw)
            with self.assertRaises(ValueError) as e:
                wex.sglang.default_spec(wex.sglang.parallel_info())
            self.assertIn(words, str(e.exception), kw)
        # SGLANG_SHARED_EXPERT_TP1 keeps the shared experts whole: refused.
        set_server_args("/m")
        self.addCleanup(os.environ.pop, "SGLANG_SHARED_EXPERT_TP1", None)
        os.environ["SGLANG_SHARED_EXPERT_TP1"] = "1"
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(wex.sglang.parallel_info())
        self.assertIn("SGLANG_SHARED_EXPERT_TP1", str(e.exception))
        self.assertEqual(wex.sglang.default_spec(wex.sglang.parallel_info(), experts=False),
                         "sglang:tp=8")
        # A model without shared experts (Qwen3-MoE, Mixtral): nothing to keep
        # whole, not refused.
        self.assertEqual(wex.sglang.default_spec(wex.sglang.parallel_info(), shared=False),
                         "sglang:tp=8")
        with tempfile.TemporaryDirectory() as cd:
            for c, want in (({"num_experts": 8}, False), ({"n_shared_experts": 1}, True),
                            ({"shared_expert_intermediate_size": 64}, True)):
                cfgp = os.path.join(cd, "config.json")
                with open(cfgp, "w") as f:
                    json.dump(c, f)
                self.assertEqual(wex.sglang._has_shared(cfgp), want, c)
        del os.environ["SGLANG_SHARED_EXPERT_TP1"]
        # An embedding whole on every rank under dp-attention (SGLang before
        # PR #17403, or SGLANG_ENABLE_EMBED_REPLICATION=1) is embed_rep=1.
        set_server_args("/m", dp_size=4, enable_dp_attention=True)
        par = wex.sglang.parallel_info()
        with tempfile.TemporaryDirectory() as cd:
            cfgp = os.path.join(cd, "config.json")
            with open(cfgp, "w") as f:
                json.dump({"vocab_size": 100}, f)
            emb = torch.nn.Module()
            emb.model = torch.nn.Module()
            emb.model.embed_tokens = torch.nn.Embedding(128, 4)   # 100 padded to 64s: whole
            self.assertTrue(wex.sglang._embed_whole(emb, par, cfgp))
            emb.model.embed_tokens = torch.nn.Embedding(64, 4)    # split over attention TP 2
            self.assertFalse(wex.sglang._embed_whole(emb, par, cfgp))
            self.addCleanup(os.environ.pop, "SGLANG_ENABLE_EMBED_REPLICATION", None)
            os.environ["SGLANG_ENABLE_EMBED_REPLICATION"] = "1"
            self.assertTrue(wex.sglang._embed_whole(emb, par, cfgp))
            del os.environ["SGLANG_ENABLE_EMBED_REPLICATION"]
        self.assertEqual(wex.sglang.default_spec(par, embed_rep=True),
                         "sglang:tp=8,dp=4,dp_attention=1,embed_rep=1")
        # An SGLang that retired get_global_server_args (it raises) for
        # runtime_context.get_server_args: the arguments are read there.
        sa = sys.modules["sglang.srt.server_args"]
        real = sa.get_global_server_args

        def retired():
            raise RuntimeError("get_global_server_args() is retired")
        sa.get_global_server_args = retired
        self.addCleanup(setattr, sa, "get_global_server_args", real)
        rc = types.ModuleType("sglang.srt.runtime_context")
        rc.get_server_args = lambda: SERVER_ARGS
        sys.modules["sglang.srt.runtime_context"] = rc
        self.addCleanup(sys.modules.pop, "sglang.srt.runtime_context", None)
        set_server_args("/m", dp_size=4, enable_dp_attention=True, enable_dp_lm_head=True)
        set_par(tp=(8, 0))
        par = wex.sglang.parallel_info()
        self.assertEqual((par["known"], par["model_path"], par["dp"]), (True, "/m", 4))
        self.assertEqual(wex.sglang.default_spec(par),
                         "sglang:tp=8,dp=4,dp_attention=1,dp_lm_head=1")
        # Neither answers (no runtime_context, get_global_server_args
        # retired or absent): the layout must be given.
        del sys.modules["sglang.srt.runtime_context"]
        self.assertFalse(wex.sglang.parallel_info()["known"])
        del sa.get_global_server_args
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(wex.sglang.parallel_info())
        self.assertIn("layout=", str(e.exception))
        self.assertIn("runtime_context.get_server_args", str(e.exception))
        # select_parameters: two names stripped onto one are refused.
        with self.assertRaises(ValueError):
            wex.engine.select_parameters([("a.w", 1), ("b.w", 2)], strip_prefix=("a.", "b."))
        # Megatron's wrappers, as README and wex.trainer give them: DDP
        # around Float16Module (bf16) and DDP alone; the first match only.
        megatron = ("module.module.", "module.")
        for names in (["module.module.decoder.x", "module.module.embedding.y"],
                      ["module.decoder.x", "module.embedding.y"]):
            kept, _ = wex.engine.select_parameters([(n, 0) for n in names],
                                                   strip_prefix=megatron)
            self.assertEqual([n for n, _ in kept], ["decoder.x", "embedding.y"])
        # Patterns and prefixes given as generators hold for every name
        # (and for the checks that select again); a mapping (state_dict())
        # is its items; anything but (name, tensor) pairs is refused.
        kept, dropped = wex.engine.select_parameters(
            [("m.a", 1), ("m.b", 2), ("m.c", 3)], strip_prefix=(p for p in ["m."]),
            ignore=(p for p in ["a", "c"]))
        self.assertEqual((kept, dropped), ([("b", 2)], ["a", "c"]))
        self.assertEqual(wex.engine.select_parameters({"x": 1, "y": 2}, ignore="y"),
                         ([("x", 1)], ["y"]))
        with self.assertRaises(TypeError) as e:
            wex.engine.select_parameters(["x", "y"])
        self.assertIn("(name, tensor) pairs", str(e.exception))
        self.assertEqual(wex.engine.selection("p.", (i for i in ["a"])), (("p.",), ("a",)))

    def test_sglang_resolved_args(self):
        # An SGLang with runtime_context keeps its ServerArgs as given
        # ("retains the raw input") and publishes what it resolved:
        # get_parallel() for the parallel namespace, get_context().
        # config_leaf() for the rest.  --moe-a2a-backend deepep without
        # --ep-size runs ep_size = tp_size (arg_groups/overrides.py
        # _a2a_ep_size); --dp 4 --enable-dp-attention resolves to
        # attn_dp_size 4, dp_size 1, enable_dp_attention False (PR #41818);
        # DWDP forces enable_dp_lm_head and moe_dense_tp_size 1.  The
        # layout is SGLang's resolved one, whichever accessor gave the
        # record (get_global_server_args as a shim over the context, or
        # retired for runtime_context.get_server_args).
        sa = sys.modules["sglang.srt.server_args"]
        real = sa.get_global_server_args
        self.addCleanup(setattr, sa, "get_global_server_args", real)
        resolved = dict(tp_size=8, dp_size=1, attn_dp_size=4, enable_dp_attention=False,
                        ep_size=8, enable_dp_lm_head=True, moe_dense_tp_size=1,
                        attn_cp_size=1, moe_dp_size=1)
        leaves = dict(moe_a2a_backend="deepep", enable_eplb=False,
                      ep_num_redundant_experts=0, init_expert_location="trivial",
                      model_path="/m")

        class Parallel:
            def __getattr__(self, name):
                if name in resolved:
                    return resolved[name]
                raise AttributeError("ParallelContext has no %r" % name)

        class Context:
            def config_leaf(self, name):
                if name in leaves:
                    return leaves[name]
                raise ValueError("%r is not a config leaf (no namespace)" % name)

        rc = types.ModuleType("sglang.srt.runtime_context")
        rc.get_server_args = lambda: SERVER_ARGS
        rc.get_parallel, rc.get_context = Parallel, Context
        sys.modules["sglang.srt.runtime_context"] = rc
        self.addCleanup(sys.modules.pop, "sglang.srt.runtime_context", None)
        # The raw record: what was typed (--dp 4 --enable-dp-attention
        # --moe-a2a-backend deepep --enable-dwdp...), not what runs.
        set_server_args("/m", dp_size=4, enable_dp_attention=True, ep_size=1,
                        enable_dp_lm_head=False, moe_a2a_backend="deepep")
        set_par(tp=(8, 0))
        want = "sglang:tp=8,dp=4,dp_attention=1,ep=8,dp_lm_head=1,dense_tp=1,a2a=1"

        def retired():
            raise RuntimeError("get_global_server_args() is retired")
        for accessor in (real, retired):
            sa.get_global_server_args = accessor
            par = wex.sglang.parallel_info()
            self.assertEqual((par["dp"], par["dp_attention"], par["ep"], par["dp_lm_head"],
                              par["dense_tp"], par["a2a"]), (4, True, 8, True, True, True))
            self.assertEqual(wex.sglang.default_spec(par), want)
        # Attention context parallelism SGLang derived (DeepSeek's
        # --enable-prefill-cp: attn_cp_size = tp_size // attn_dp_size) is
        # refused, though the record says attn_cp_size 1.
        resolved.update(attn_dp_size=1, attn_cp_size=8)
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(wex.sglang.parallel_info())
        self.assertIn("context parallelism", str(e.exception))
        # No attention DP resolved: dp_size is replicas, refused as before.
        resolved.update(attn_cp_size=1, dp_size=2)
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(wex.sglang.parallel_info())
        self.assertIn("enable-dp-attention", str(e.exception))
        # Nothing published (the accessors raise): the record's fields.
        def unpublished(*a):
            raise ValueError("config namespace 'parallel' not published")
        rc.get_parallel = rc.get_context = unpublished
        set_server_args("/m", dp_size=4, enable_dp_attention=True, ep_size=8,
                        moe_a2a_backend="deepep")
        self.assertEqual(wex.sglang.default_spec(wex.sglang.parallel_info()),
                         "sglang:tp=8,dp=4,dp_attention=1,ep=8,a2a=1")

    def test_sglang_request_serialization(self):
        # SGLang serializes the request (MultiprocessingSerializer: torch's
        # ForkingPickler) in the driver, and every rank reads it, through
        # its HTTP API from a process of no relation: the tensor must
        # travel by value.
        from torch.multiprocessing.reductions import ForkingPickler
        import io
        buf = io.BytesIO()
        ForkingPickler(buf).dump(wex.sglang.request(MODEL, group="g", min_version=3))
        code = ("import pickle, sys\n"
                "b = sys.stdin.buffer.read()\n"
                "for _ in range(2):\n"
                "    (name, t), = pickle.loads(b)\n"
                "print(name, tuple(t.shape))\n")
        r = subprocess.run([sys.executable, "-c", code], input=buf.getvalue(),
                           capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr.decode())
        self.assertIn(b'"min_version": 3', r.stdout)
        # Under the file_system strategy torch pickles even an empty
        # tensor as a shared-memory file name: refused, saying why.
        import torch.multiprocessing as tmp
        was = tmp.get_sharing_strategy()
        self.addCleanup(tmp.set_sharing_strategy, was)
        tmp.set_sharing_strategy("file_system")
        with self.assertRaises(ValueError) as e:
            wex.sglang.request(MODEL, group="g", min_version=3)
        self.assertIn("file_system", str(e.exception))
        tmp.set_sharing_strategy("file_descriptor")
        self.assertEqual(len(wex.sglang.request(MODEL, group="g")), 1)
        # Prefixes and patterns given as generators travel as lists.
        (name, _), = wex.sglang.request(MODEL, strip_prefix=(p for p in ["module."]),
                                        ignore=(p for p in ["x"]))
        self.assertIn('"ignore": ["x"]', name)
        self.assertIn('"strip_prefix": ["module."]', name)

    def sglang_ranks(self, fail=False):
        """Two SGLang rank models of this test's checkpoint, each with a
        post_load_weights that counts its runs (m.post_loads) and raises
        while m.fail; and load(k, req), the hook run as rank k."""
        set_server_args(self.tmp.name)
        models = []
        for k in range(2):
            m = module_of(self.engine_params("sglang", k))
            m.post_loads, m.fail = 0, fail

            def post_load_weights(m=m):
                if m.fail:
                    raise RuntimeError("post_load exploded")
                m.post_loads += 1
            m.post_load_weights = post_load_weights
            models.append(m)

        def load(k, req):
            set_par(tp=(2, k))
            return wex.sglang.load(models[k], req)
        return models, load

    def test_sglang_loader(self):
        models, load = self.sglang_ranks()
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sglang", min_version=v, verify=True)
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sglang", detach=True))
            r = load(k, req)
            self.assertEqual((r["version"], r["rank"], r["group"]), (v, k, "sglang"))
            self.assertEqual(models[k].post_loads, 1)  # the model has post_load_weights
            self.assertGreater(r["verified"], 0)
            self.assertTrue(wex.sglang.status(models[k])["ok"])
            self.assert_holds(params_of(models[k]), "sglang", k)
        self.assertEqual(len(wex.sglang.check(MODEL, "sglang", v, world_size=2)), 2)
        # The same version again (to every rank, as SGLang sends it):
        # nothing changed, post_load_weights not run.
        for k in range(2):
            r = load(k, req)
            self.assertEqual((r["version"], r["changed"]), (v, 0))
            self.assertNotIn("post_load", r)
            self.assertEqual(models[k].post_loads, 1)

        # Same arguments again: syncs, no second attach; post_load=False skips it.
        v = self.next_version()
        with torch.no_grad():
            for p in models[0].parameters():
                p.fill_(1)
        r = load(0, wex.sglang.request(MODEL, group="sglang", min_version=v, post_load=False))
        self.assertEqual(r["version"], v)
        self.assertEqual(models[0].post_loads, 1)
        self.assert_holds(params_of(models[0]), "sglang", 0)
        # Rank 1 has not synced v: the driver's check says so.
        with self.assertRaises(RuntimeError) as e:
            wex.sglang.check(MODEL, "sglang", v)
        self.assertIn("rank 1 at version %d" % (v - 1), str(e.exception))

        # A failure that leaves the weights as they were is logged, not
        # raised (SGLang would stop the server): no version in time.
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(load(1, wex.sglang.request(MODEL, group="sglang",
                                                         min_version=v + 50,
                                                         sync_timeout_ms=300)))
        self.assertIn("weights unchanged", logs.output[0])
        st = wex.sglang.status(models[1])
        self.assertFalse(st["ok"])
        self.assertIn("WexError", st["error"])
        self.assertEqual(load(1, wex.sglang.request(MODEL, group="sglang", min_version=v))
                         ["version"], v)
        self.assertEqual(len(wex.sglang.check(MODEL, "sglang", v, world_size=2)), 2)

        # Changing what was attached is refused (logged); detach, then it
        # attaches again.
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(load(0, wex.sglang.request(MODEL, group="other", min_version=v)))
        self.assertIn("group", logs.output[0])
        with self.assertLogs("wex.sglang", "ERROR"):
            load(0, wex.sglang.request(MODEL, group="other", detach=True))  # not its group
        attached = wex.sglang._ranks[id(models[0])][0]
        self.assertIsNone(load(0, wex.sglang.request(MODEL, group="sglang", detach=True)))
        # The layout the hook opened went with the rank.
        with self.assertRaises(wex.WexError):
            attached.layout.rank(0)
        r = load(0, wex.sglang.request(MODEL, group="other", min_version=v))
        self.assertEqual((r["group"], r["version"]), ("other", v))
        load(0, wex.sglang.request(MODEL, group="other", detach=True))
        load(0, req)  # back in its group, for the cleanup

        # A failure that leaves the weights mixed raises.
        held = wex.sglang._ranks[id(models[0])][0]

        def interrupted(**kw):
            raise wex.WexError(wex.EDIRTY, "sync: the copy was interrupted")
        held.sync, held.dirty = interrupted, lambda: True
        self.addCleanup(delattr, held, "sync")
        self.addCleanup(delattr, held, "dirty")
        with self.assertLogs("wex.sglang", "ERROR"):
            with self.assertRaises(wex.WexError):
                load(0, wex.sglang.request(MODEL, group="sglang", min_version=v))

        # Not a request, or a request this version of the loader does not know.
        for bad in ([], [("model.embed_tokens.weight", torch.zeros(1))],
                    [("wex:{not json", torch.zeros(1))],
                    [('wex:{"model": "m", "colour": 1}', torch.zeros(1))]):
            with self.assertLogs("wex.sglang", "ERROR"):
                self.assertIsNone(load(1, bad))
        # post_load=True on a model without post_load_weights.
        plain = module_of(self.engine_params("sglang", 0))
        set_par(tp=(2, 0))
        self.addCleanup(wex.sglang.load, plain,
                        wex.sglang.request(MODEL, group="plain", detach=True))
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            wex.sglang.load(plain, wex.sglang.request(MODEL, group="plain", min_version=v,
                                                      post_load=True))
        self.assertIn("post_load_weights", logs.output[0])
        self.assertNotIn(id(plain), wex.sglang._ranks)            # refused before attaching
        self.assertEqual(wex.engine.group_status(MODEL, "plain"), [])
        with self.assertRaises(ValueError):
            wex.sglang.request("")

        # Speculative decoding's draft model: skipped.
        class DeepseekV3ForCausalLMNextN(torch.nn.Module):
            pass
        with self.assertLogs("wex.sglang", "INFO") as logs:
            self.assertIsNone(wex.sglang.load(DeepseekV3ForCausalLMNextN(), req))
        self.assertIn("draft", logs.output[0])
        # A STANDALONE draft of a plain model class, shaped as the target
        # (rank 0's parameters): recognised by its config's checkpoint.
        draft = module_of(self.engine_params("sglang", 0))
        draft.config = types.SimpleNamespace(name_or_path="/ckpt/draft")
        set_server_args(self.tmp.name, speculative_algorithm="STANDALONE",
                        speculative_draft_model_path="/ckpt/draft")
        set_par(tp=(2, 0))
        with self.assertLogs("wex.sglang", "INFO") as logs:
            self.assertIsNone(wex.sglang.load(draft, req))
        self.assertIn("draft checkpoint /ckpt/draft", logs.output[0])
        self.assertNotIn(id(draft), wex.sglang._ranks)
        # ... and one the hook cannot tell from the target (loaded from the
        # target's path): refused as a second model for rank 0, which
        # stays the target's.
        draft.config.name_or_path = self.tmp.name
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(wex.sglang.load(draft, req))
        self.assertIn("another model of the same worker", logs.output[0])
        self.assertNotIn(id(draft), wex.sglang._ranks)
        self.assertEqual(wex.sglang._ranks[id(models[0])][0].rank, 0)
        # Server args not set (not an SGLang worker): the hook's own
        # message, not SGLang's ValueError.
        def unset():
            raise ValueError("Global server args is not set yet!")
        sys.modules["sglang.srt.server_args"].get_global_server_args = unset
        self.addCleanup(setattr, sys.modules["sglang.srt.server_args"],
                        "get_global_server_args", lambda: SERVER_ARGS)
        self.assertEqual(wex.sglang.parallel_info()["known"], False)

    def test_sglang_post_load_failure(self):
        """post_load_weights() failing after a sync that changed the
        weights leaves them mixed: load raises, the rank is detached (so
        check() does not report it served), status() says mixed; the next
        request attaches, copies and runs post_load_weights again."""
        models, load = self.sglang_ranks(fail=True)
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-post", min_version=v)
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sg-post", detach=True))
            with self.assertLogs("wex.sglang", "ERROR") as logs:
                with self.assertRaises(wex.sglang.MixedWeights) as e:
                    load(k, req)
            self.assertIn("post_load exploded", str(e.exception))
            self.assertIn("mixed", logs.output[0])
            self.assertNotIn("unchanged", "\n".join(logs.output))
            st = wex.sglang.status(models[k])
            self.assertEqual((st["ok"], st["mixed"]), (False, True))
        with self.assertRaises(RuntimeError):
            wex.sglang.check(MODEL, "sg-post", v)
        # Fixed: the next request attaches, copies and runs it.
        for k in range(2):
            models[k].fail = False
            r = load(k, req)
            self.assertEqual((r["version"], r.get("post_load")), (v, True))
            self.assertEqual(models[k].post_loads, 1)
            self.assert_holds(params_of(models[k]), "sglang", k)
        self.assertEqual(len(wex.sglang.check(MODEL, "sg-post", v, world_size=2)), 2)

    def test_sglang_post_load_after_unanswered_release(self):
        """A copy sync that completed, then raised because wexd did not
        answer its release in time (wex.h: ETIMEDOUT, the weights hold the
        version whole, not dirty), ran no post_load_weights; the driver's
        retry of that version copies nothing (changed 0), and must run it
        then: otherwise the rank serves the new weights with what
        post_load_weights derived from the old ones."""
        models, load = self.sglang_ranks()
        v = self.next_version()
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sg-rel", detach=True))
            load(k, wex.sglang.request(MODEL, group="sg-rel", min_version=v))
            self.assertEqual(models[k].post_loads, 1)
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-rel", min_version=v)
        client = wex.sglang._ranks[id(models[0])][0].client
        real = client.sync

        def copied_then_unanswered(*a, **kw):
            real(*a, **kw)
            raise wex.WexError(errno.ETIMEDOUT, "wexd did not answer within 100 ms "
                               "(connection dropped)")
        with unittest.mock.patch.object(client, "sync", copied_then_unanswered):
            with self.assertLogs("wex.sglang", "ERROR"):
                self.assertIsNone(load(0, req))
        self.assertFalse(wex.sglang.status(models[0])["ok"])
        self.assertEqual(models[0].post_loads, 1)
        # The retry: the version is held already, nothing copied.
        r = load(0, req)
        self.assertEqual((r["version"], r["changed"]), (v, 0))
        self.assertEqual(models[0].post_loads, 2)
        self.assertTrue(r.get("post_load"))
        # And once more: post_load_weights ran for this version, not again.
        r = load(0, req)
        self.assertEqual(models[0].post_loads, 2)
        self.assertNotIn("post_load", r)

    def test_sglang_changed_after_unanswered_release(self):
        """The first sync after SGLang loaded the checkpoint copied the
        version, then raised (wexd did not answer its release in time:
        not dirty); its retry copied nothing (changed 0).  The weights are
        the trainer's: attached again after a detach, the rank must not
        be compared with the checkpoint (it was, and refused as re-laid
        out: review h118)."""
        ck = self.checkpoint_dir()
        set_server_args(ck, load_format="auto")
        model = module_of(self.loaded_params("sglang", 0))

        def load(req):
            set_par(tp=(2, 0))
            return wex.sglang.load(model, req)

        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-ckrel", min_version=v)
        self.addCleanup(load, wex.sglang.request(MODEL, group="sg-ckrel", detach=True))
        real = wex.engine.EngineRank.sync

        def copied_then_unanswered(rank, *a, **kw):
            real(rank, *a, **kw)
            raise wex.WexError(errno.ETIMEDOUT, "wexd did not answer within 100 ms "
                               "(connection dropped)")
        with unittest.mock.patch.object(wex.engine.EngineRank, "sync", copied_then_unanswered):
            with self.assertLogs("wex.sglang", "ERROR"):
                self.assertIsNone(load(req))
        r = load(req)
        self.assertEqual((r["version"], r["changed"]), (v, 0))
        load(wex.sglang.request(MODEL, group="sg-ckrel", detach=True))
        r = load(req)
        self.assertIsNotNone(r, wex.sglang.status(model))
        self.assertEqual(r["version"], v)
        self.assertEqual(wex.sglang._ranks[id(model)][0].describe()["checkpoint_check"],
                         "not checked: a sync changed the weights since the engine loaded them")

    def test_vllm_changed_after_unanswered_release(self):
        """As for SGLang: vLLM's first sync after loading the checkpoint
        copied the version, then raised (wexd did not answer its release
        in time: not dirty); its retry copied nothing (changed 0).  The
        weights are the trainer's: attached again after a detach, the
        rank must not be compared with the checkpoint (it was)."""
        ck = self.checkpoint_dir()
        m = module_of(self.loaded_params("vllm", 0))
        w = VllmWorker(ck, m, load_format="auto")
        self.addCleanup(w.wex_detach)
        set_par(tp=(2, 0))
        self.assertIsInstance(w.wex_attach(model=MODEL, group="vllm-ckrel")["checkpoint_check"],
                              dict)
        v = self.next_version()
        real = wex.engine.EngineRank.sync

        def copied_then_unanswered(rank, *a, **kw):
            real(rank, *a, **kw)
            raise wex.WexError(errno.ETIMEDOUT, "wexd did not answer within 100 ms "
                               "(connection dropped)")
        with unittest.mock.patch.object(wex.engine.EngineRank, "sync", copied_then_unanswered):
            with self.assertRaises(wex.WexError):
                w.wex_sync(min_version=v)
        r = w.wex_sync(min_version=v)
        self.assertEqual((r["version"], r["changed"]), (v, 0))
        w.wex_detach()
        info = w.wex_attach(model=MODEL, group="vllm-ckrel")
        self.assertEqual(info["checkpoint_check"], "not checked: a sync changed the weights "
                         "since the engine loaded them")
        self.assertEqual(w.wex_sync(min_version=v)["version"], v)

    def test_check_default_group(self):
        """Ranks attached with no group are in wexd's group "default":
        check() with group None (as the request was sent) finds them,
        instead of saying no rank is attached."""
        models, load = self.sglang_ranks()
        v = self.next_version()
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, detach=True))
            self.assertEqual(load(k, wex.sglang.request(MODEL, min_version=v))["version"], v)
        self.assertEqual(len(wex.sglang.check(MODEL, None, v, world_size=2)), 2)
        self.assertEqual(len(wex.engine.group_status(MODEL, None)), 2)

    def test_sglang_load_weights_elsewhere(self):
        """SGLang's other weight updates (update_weights_from_disk,
        _from_distributed, _from_tensor with another load_format) write
        through model.load_weights into the attached parameters in place:
        the rank forgets its version at once (check() no longer counts
        it), and the next request copies the whole version again instead
        of nothing (it served the other weights as the version before)."""
        models, load = self.sglang_ranks()
        for m in models:
            def load_weights(weights, m=m):  # as update_weights_from_disk does
                for _ in weights:
                    pass
                scribble(m, 5)
            m.load_weights = load_weights
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-reload", min_version=v)
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sg-reload", detach=True))
            self.assertEqual(load(k, req)["changed"], 1)
        self.assertEqual(len(wex.sglang.check(MODEL, "sg-reload", v, world_size=2)), 2)
        set_par(tp=(2, 0))
        models[0].load_weights([("model.embed_tokens.weight", torch.zeros(1))])
        self.assertTrue(all_equal(models[0], 5))
        with self.assertRaises(RuntimeError) as e:
            wex.sglang.check(MODEL, "sg-reload", v)
        self.assertIn("rank 0 at version 0", str(e.exception))
        r = load(0, req)
        self.assertEqual((r["version"], r["changed"], r.get("post_load")), (v, 1, True))
        self.assert_holds(params_of(models[0]), "sglang", 0)
        self.assertEqual(len(wex.sglang.check(MODEL, "sg-reload", v, world_size=2)), 2)
        self.assertEqual(load(1, req)["changed"], 0)  # rank 1 was not reloaded
        # Detached and attached again: wrapped once, still seen.
        load(0, wex.sglang.request(MODEL, group="sg-reload", detach=True))
        self.assertEqual(load(0, req)["changed"], 1)
        models[0].load_weights([])
        self.assertEqual(load(0, req)["changed"], 1)
        self.assert_holds(params_of(models[0]), "sglang", 0)
        # A load that replaced a parameter (as process_weights_after_loading
        # may): the rank cannot be attached again as it was; it is
        # detached, so check() does not count it served.
        def replacing(weights, m=models[1]):
            scribble(m, 5)
            emb = m.model.embed_tokens
            emb.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
        held = wex.sglang._ranks[id(models[1])]
        models[1].load_weights = replacing  # wrapped as the attach would have
        wex.sglang._watch_load_weights(models[1])
        set_par(tp=(2, 1))
        with self.assertLogs("wex.sglang", "WARNING") as logs:
            models[1].load_weights([])
        self.assertIn("detached this rank", "\n".join(logs.output))
        self.assertNotIn(id(models[1]), wex.sglang._ranks)
        self.assertIsNone(held[0].client)
        with self.assertRaises(RuntimeError) as e:
            wex.sglang.check(MODEL, "sg-reload", v)
        self.assertIn("rank 1 not attached", str(e.exception))
        r = load(1, req)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        self.assert_holds(params_of(models[1]), "sglang", 1)

    def test_sglang_dense_ep(self):
        """--ep-size on a dense model (SGLang ignores it) leaves ep out of
        the default spec; a model with experts keeps it."""
        d = self.tmp.name
        set_server_args(d, ep_size=2)
        set_par(tp=(2, 0))
        par = wex.sglang.parallel_info()
        self.assertEqual(wex.sglang.default_spec(par, experts=False), "sglang:tp=2")
        self.assertEqual(wex.sglang.default_spec(par, experts=True), "sglang:tp=2,ep=2")
        m = module_of(self.engine_params("sglang", 0))
        req = wex.sglang.request(MODEL, group="sg-ep")
        self.addCleanup(wex.sglang.load, m, wex.sglang.request(MODEL, group="sg-ep",
                                                               detach=True))
        self.assertIsNotNone(wex.sglang.load(m, req), wex.sglang.status(m))
        self.assertEqual(wex.sglang._ranks[id(m)][0].describe()["layout"], "sglang:tp=2")

    def test_sglang_dense_tp_ignored(self):
        """--moe-dense-tp-size 1 changes only DeepSeek's dense-layer MLPs
        (DeepseekV2DecoderLayer builds them whole on every rank); SGLang's
        Qwen2-MoE and Qwen3-MoE build every layer sparse ("all layers are
        sparse") and its dense models never read it, so their weights are
        laid out as without it: dense_tp is left out of their default
        spec (the layout refuses it for them), as ep is for a dense
        model; a DeepSeek model keeps it."""
        d = self.tmp.name
        set_server_args(d, moe_dense_tp_size=1)
        set_par(tp=(2, 0))
        par = wex.sglang.parallel_info()
        self.assertTrue(par["dense_tp"])
        m = module_of(self.engine_params("sglang", 0))
        v = self.next_version()
        self.addCleanup(wex.sglang.load, m, wex.sglang.request(MODEL, group="sg-dense-tp",
                                                               detach=True))
        r = wex.sglang.load(m, wex.sglang.request(MODEL, group="sg-dense-tp", min_version=v))
        self.assertIsNotNone(r, wex.sglang.status(m))
        self.assertEqual(wex.sglang._ranks[id(m)][0].describe()["layout"], "sglang:tp=2")
        self.assert_holds(params_of(m), "sglang", 0)
        # Qwen3-MoE: its spec opens.
        cfg = os.path.join(d, "moe", "config.json")
        spec = wex.sglang.default_spec(par, experts=True, shared=False,
                                       dense=wex.sglang._dense_tp_model(cfg))
        self.assertEqual(spec, "sglang:tp=2")
        wex.Layout(cfg, spec)
        # DeepSeek (and a config that cannot be read) keeps it.
        ds = os.path.join(d, "ds-dense-tp.json")
        with open(ds, "w") as f:
            json.dump({"model_type": "deepseek_v3"}, f)
        for c in (ds, os.path.join(d, "missing.json")):
            self.assertEqual(wex.sglang.default_spec(par, dense=wex.sglang._dense_tp_model(c)),
                             "sglang:tp=2,dense_tp=1")

    def test_sglang_qwen3_dense_dp_attention(self):
        """SGLang's dense Qwen3 splits its attention over the attention-TP
        group under --enable-dp-attention (models/qwen3.py Qwen3Attention:
        attn_tp_rank/attn_tp_size), its MLP over all tp ranks, as the MoE
        models do: the hook's spec for it is a layout wex describes."""
        d = self.tmp.name
        set_server_args(d, dp_size=2, enable_dp_attention=True, enable_dp_lm_head=True)
        set_par(tp=(4, 0))
        par = wex.sglang.parallel_info()
        spec = wex.sglang.default_spec(par, experts=False, shared=False, dense=False)
        self.assertEqual(spec, "sglang:tp=4,dp=2,dp_attention=1,dp_lm_head=1")
        cfg = os.path.join(d, "qwen3-dense.json")
        with open(cfg, "w") as f:
            json.dump({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
                       "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 24,
                       "vocab_size": 101, "torch_dtype": "bfloat16"}, f)
        for sp in (spec, spec + ",embed_rep=1"):
            with wex.Layout(cfg, sp) as lay:
                # Rank 3: attention-TP rank 1 of 2: q heads 2 and 3, KV head 1.
                qkv = {n: p for n, _, _, p in lay.rank(3)}[
                    "model.layers.0.self_attn.qkv_proj.weight"]
                self.assertEqual([(t.name.decode().rsplit(".", 2)[-2], t.start[0], t.extent[0])
                                  for t in qkv],
                                 [("q_proj", 8, 8), ("k_proj", 4, 4), ("v_proj", 4, 4)])

    def test_sglang_fp8_kv_scales(self):
        """A model SGLang builds with an FP8 quant_config holds, beside
        its weights, the KV-cache scales of each RadixAttention:
        k_scale and v_scale, scalar float32 Parameters
        (layers/quantization/kv_cache.py BaseKVCacheMethod.create_weights,
        which Fp8Config.get_quant_method returns for a RadixAttention;
        models/llama.py LlamaAttention's attn and models/deepseek_v2.py's
        attn_mqa and attn_mha are built with quant_config), kept after
        loading (process_weights_after_loading copies into them in
        place).  No layout names them and a trainer has none: the hook
        attaches without them (left as SGLang set them), instead of
        refusing every FP8 model's rank."""
        set_server_args(self.tmp.name)
        set_par(tp=(2, 0))
        params = dict(self.engine_params("sglang", 0))
        for name in [n for n in params if n.endswith(".self_attn.o_proj.weight")]:
            base = name[:-len("o_proj.weight")]
            for attn in ("attn", "attn_mqa", "attn_mha", "attn_mqa_for_dcp_decode"):
                for s in ("k_scale", "v_scale"):
                    params[base + attn + "." + s] = torch.tensor(1.0, dtype=torch.float32)
        m = module_of(params)
        self.assertTrue(any(n.endswith("attn.k_scale") for n, _ in m.named_parameters()))
        v = self.next_version()
        self.addCleanup(wex.sglang.load, m, wex.sglang.request(MODEL, group="sg-kv",
                                                               detach=True))
        r = wex.sglang.load(m, wex.sglang.request(MODEL, group="sg-kv", min_version=v))
        self.assertIsNotNone(r, wex.sglang.status(m))
        self.assertEqual(r["version"], v)
        held = params_of(m)
        for name in [n for n in held if n.endswith("_scale")]:
            self.assertEqual(float(held.pop(name)), 1.0, name)  # untouched
        self.assert_holds(held, "sglang", 0)

    def test_sglang_a2a_without_shared_experts(self):
        """--moe-a2a-backend deepep on a MoE model without shared experts
        (Qwen3-MoE): SGLang builds its experts as with --ep-size tp
        (models/qwen3_moe.py Qwen3MoeSparseMoeBlock: the same FusedMoE
        class family over moe_ep/moe_tp, the gate replicated; server_args
        sets ep_size = tp_size under deepep/mooncake) and has no shared
        expert for a2a=1 to keep whole: the spec is tp and ep, which the
        layout describes, not a2a=1, which it describes for DeepSeek
        only (refusing the model)."""
        cfg = os.path.join(self.tmp.name, "moe", "config.json")
        set_par(tp=(2, 0))
        set_server_args(os.path.dirname(cfg), moe_a2a_backend="deepep", ep_size=2)
        par = wex.sglang.parallel_info()
        spec = wex.sglang.default_spec(par, experts=wex.engine.has_experts(cfg),
                                       shared=wex.sglang._has_shared(cfg))
        self.assertEqual(spec, "sglang:tp=2,ep=2")
        lay = wex.Layout(cfg, spec)  # what _attach opens: no longer refused
        for k in range(2):
            self.assertIn(("model.layers.0.mlp.experts.w13_weight", (2, 64, 64)),
                          [(n, tuple(sh)) for n, _, sh, _ in lay.rank(k)])
        # With shared experts (DeepSeek) a2a=1 stays: they are whole there.
        self.assertEqual(wex.sglang.default_spec(par, shared=True), "sglang:tp=2,ep=2,a2a=1")

    def sglang_refused(self, load, m, req, group):
        """Rank 0's model m, loading req (of `group`), is refused before it
        attaches, logged: the error its status reports."""
        self.addCleanup(load, 0, wex.sglang.request(MODEL, group=group, detach=True))
        with self.assertLogs("wex.sglang", "ERROR"):
            load(0, req)
        self.assertNotIn(id(m), wex.sglang._ranks)
        return wex.sglang.status(m)["error"]

    def test_sglang_rl_on_policy_dtype(self):
        """SGLang's --rl-on-policy-target keeps the embeddings and norms in
        fp32 whatever the checkpoint holds (params_dtype, RMSNorm's
        weight_dtype): the attach refuses them by dtype, saying that flag
        is why (before: only the dtypes); without the flag, only the
        dtypes."""
        models, load = self.sglang_ranks()
        m = models[0]
        emb = m.model.embed_tokens
        emb.weight = torch.nn.Parameter(emb.weight.detach().float(), requires_grad=False)
        req = wex.sglang.request(MODEL, group="sg-on-policy", sync_timeout_ms=50)
        for target, hint in (("fsdp", True), (None, False)):
            set_server_args(self.tmp.name, rl_on_policy_target=target)
            err = self.sglang_refused(load, m, req, "sg-on-policy")
            self.assertIn("model.embed_tokens.weight: dtype F32, the layout ", err)
            self.assertEqual("--rl-on-policy-target" in err, hint, err)

    def test_sglang_on_policy_contract_dtype(self):
        """SGLang's --true-on-policy-contract (sglang.srt.true_on_policy:
        RMSNorm's weight_dtype fp32; miles sets it without
        --rl-on-policy-target) gets the hint too, naming it (before: no
        hint without --rl-on-policy-target, and with both, "start SGLang
        without" the one that left the norms fp32 all the same)."""
        models, load = self.sglang_ranks()
        m = models[0]
        norm = m.model.norm
        norm.weight = torch.nn.Parameter(norm.weight.detach().float(), requires_grad=False)
        req = wex.sglang.request(MODEL, group="sg-contract", sync_timeout_ms=50)
        contract = "qwen3_dense_true_on_policy_v1"
        for args, names in ((dict(true_on_policy_contract=contract),
                             ["--true-on-policy-contract"]),
                            (dict(true_on_policy_contract=contract, rl_on_policy_target="fsdp"),
                             ["--rl-on-policy-target", "--true-on-policy-contract"])):
            set_server_args(self.tmp.name, **args)
            err = self.sglang_refused(load, m, req, "sg-contract")
            self.assertIn("model.norm.weight: dtype F32, the layout ", err)
            self.assertIn("SGLang runs with %s," % " and ".join(names), err)
            self.assertIn("start SGLang without %s" % ("them" if len(names) > 1 else "it"), err)

    def test_sglang_moe_relayout_refused(self):
        """A MoE runner backend that re-lays out the experts' weights after
        loading in their shape is refused before anything is attached:
        --moe-runner-backend flashinfer_trtllm (SGLang's
        layers/moe/moe_runner/flashinfer_trtllm.py
        align_fp8_moe_weights_for_flashinfer_trtllm: w13 rows reordered for
        the gated GEMM and w13/w2 shuffled by shuffle_matrix_a, same
        (E, 2N, H) shape; server_args picks it for "auto" on SM100 for
        DeepSeek-V3 and Qwen3-MoE FP8), and the boolean flags of older
        SGLang (enable_flashinfer_trtllm_moe, ...).  Without the refusal
        a copy lands in checkpoint order under kernels that read the
        shuffled order (nothing compares it with --load-format dummy)."""
        d = self.tmp.name
        cfg = os.path.join(d, "moe", "config.json")
        set_par(tp=(2, 0))
        m = module_of(torch_util.layout_tensors(wex.Layout(cfg, "sglang:tp=2"), 0))
        for kw, words in (({"moe_runner_backend": "flashinfer_trtllm"}, "flashinfer_trtllm"),
                          ({"moe_runner_backend": "flashinfer_cutlass"}, "flashinfer_cutlass"),
                          ({"enable_flashinfer_trtllm_moe": True},
                           "enable-flashinfer-trtllm-moe")):
            set_server_args(os.path.dirname(cfg), load_format="dummy", **kw)
            self.addCleanup(wex.sglang.load, m, wex.sglang.request("wex-moe", group="sg-moe",
                                                                   detach=True))
            with self.assertLogs("wex.sglang", "ERROR"):
                wex.sglang.load(m, wex.sglang.request("wex-moe", group="sg-moe",
                                                      sync_timeout_ms=50))
            self.assertNotIn(id(m), wex.sglang._ranks, kw)  # refused before attaching
            self.assertIn(words, wex.sglang.status(m)["error"], kw)
        # ROCm AITER (layers/quantization/fp8.py Fp8MoEMethod with _use_aiter:
        # shuffle_weight(w13_weight, (16, 16)) copied back in place).
        set_server_args(os.path.dirname(cfg), load_format="dummy")
        self.addCleanup(os.environ.pop, "SGLANG_USE_AITER", None)
        os.environ["SGLANG_USE_AITER"] = "1"
        par = wex.sglang.parallel_info()
        with unittest.mock.patch.object(torch.version, "hip", "6.3.0", create=True):
            self.assertIn("SGLANG_USE_AITER", wex.sglang._relayout(par, True, False))
            # Fp8LinearMethod's gfx950 bpreshuffle: a dense block-FP8 model too.
            self.assertIn("SGLANG_USE_AITER", wex.sglang._relayout(par, False, True))
            self.assertIsNone(wex.sglang._relayout(par, False, False))
        self.assertIsNone(wex.sglang._relayout(par, True, True))  # CUDA
        del os.environ["SGLANG_USE_AITER"]
        # The backends that keep the weights as loaded are not refused.
        for runner in ("auto", "triton", "deep_gemm"):
            set_server_args(os.path.dirname(cfg), load_format="dummy", moe_runner_backend=runner)
            self.assertIsNone(wex.sglang._relayout(wex.sglang.parallel_info(), True, False),
                              runner)
        # A dense model is not refused for a MoE runner it does not use.
        set_server_args(os.path.dirname(cfg), moe_runner_backend="flashinfer_trtllm")
        self.assertIsNone(wex.sglang._relayout(wex.sglang.parallel_info(), False, True))

    def test_sglang_refusals(self):
        d = self.tmp.name
        m = module_of(self.engine_params("sglang", 0))
        set_par(tp=(2, 0))
        set_server_args(d, dp_size=2)
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            wex.sglang.load(m, wex.sglang.request(MODEL, group="dp"))
        self.assertIn("one engine per replica", logs.output[0])
        set_server_args(os.path.join(d, "noconfig"))
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            wex.sglang.load(m, wex.sglang.request(MODEL, group="cfg"))
        self.assertIn("config=", logs.output[0])
        self.assertFalse(wex.sglang.status(m)["ok"])
        # Nothing stayed attached after the refusals.
        self.assertNotIn(id(m), wex.sglang._ranks)

    def checkpoint_dir(self):
        """A model directory as engines load it: config.json and the
        checkpoint's model.safetensors."""
        d = self.tmp.name
        ck = os.path.join(d, "ckpt")
        if not os.path.isdir(ck):
            os.mkdir(ck)
            shutil.copy(os.path.join(d, "config.json"), ck)
            shutil.copy(os.path.join(d, "hf", "model.safetensors"), ck)
        return ck

    def loaded_params(self, spec, k):
        """engine_params holding what the engine loads from the checkpoint
        (wexctl convert's bytes for rank k)."""
        params = self.engine_params(spec, k)
        for name, (_, _, b) in self.want(spec, k).items():
            params[name].view(-1).view(torch.int16).copy_(
                torch.frombuffer(bytearray(b), dtype=torch.int16))
        return params

    @staticmethod
    def swap_gate_up(module):
        """[up; gate] in every gate_up_proj, in place (FlashInfer's w13
        swap, the kind of re-layout that keeps the shape)."""
        with torch.no_grad():
            for n, p in module.named_parameters():
                if n.endswith("gate_up_proj.weight"):
                    h = p.shape[0] // 2
                    p.copy_(torch.cat([p[h:], p[:h]]))

    def test_vllm_checkpoint_check(self):
        """wex_attach compares the worker's tensors with the checkpoint
        vLLM loaded (load_format auto) before attaching: a same-shape
        re-layout is refused by name, nothing attached; a correct rank
        attaches and says what it compared; after a sync changed the
        weights, attaching again does not compare; dummy weights and
        checkpoint=False are not compared (and say why); checkpoint=
        with dummy weights is refused."""
        ck = self.checkpoint_dir()
        workers, modules = [], []
        for k in range(2):
            m = module_of(self.loaded_params("vllm", k))
            modules.append(m)
            workers.append(VllmWorker(ck, m, load_format="auto"))
            self.addCleanup(workers[k].wex_detach)

        def on(k, fn, *a, **kw):
            set_par(tp=(2, k))
            return getattr(workers[k], fn)(*a, **kw)

        # Rank 1's gate_up_proj re-laid out in its shape: refused, naming it.
        self.swap_gate_up(modules[1])
        with self.assertRaises(wex.checkpoint.CheckpointMismatch) as e:
            on(1, "wex_attach", model=MODEL, group="vllm-ck")
        self.assertIn("gate_up_proj", str(e.exception))
        self.assertIn("up_proj.weight", str(e.exception))
        self.assertIsNone(workers[1].wex_status())
        self.assertEqual(wex.engine.group_status(MODEL, "vllm-ck"), [])
        # As loaded: both ranks attach, every piece of theirs compared.
        self.swap_gate_up(modules[1])
        layout = wex.Layout(os.path.join(ck, "config.json"), "vllm:tp=2")
        for k in range(2):
            info = on(k, "wex_attach", model=MODEL, group="vllm-ck")
            chk = info["checkpoint_check"]
            self.assertIsInstance(chk, dict, chk)
            self.assertEqual(chk["checkpoint"], ck)
            self.assertEqual(chk["pieces"], sum(len(ps) for _, _, _, ps in layout.rank(k)))
            self.assertEqual(chk["skipped"], 0)
        v = self.next_version()
        for k in range(2):
            self.assertEqual(on(k, "wex_sync", min_version=v)["changed"], 1)
            self.assert_holds(params_of(modules[k]), "vllm", k)
        # The weights are the trainer's now, not the checkpoint's: attaching
        # again (after a detach) does not compare them.
        # Named explicitly, nor then.
        for given in (None, ck):
            on(0, "wex_detach")
            info = on(0, "wex_attach", model=MODEL, group="vllm-ck", checkpoint=given)
            self.assertEqual(info["checkpoint_check"], "not checked: a sync changed the "
                             "weights since the engine loaded them")
            self.assertEqual(on(0, "wex_sync", min_version=v)["version"], v)
        # A model directory whose checkpoint shows none of the rank's
        # tensors (other names): chosen automatically, it is "not
        # checked", saying why; named explicitly, it is refused.
        other = os.path.join(self.tmp.name, "ckpt-other")
        if not os.path.isdir(other):
            os.mkdir(other)
            shutil.copy(os.path.join(ck, "config.json"), other)
            glue.write_safetensors(os.path.join(other, "model.safetensors"),
                                   [("transformer.wte.weight", "BF16", (2,), b"\0" * 4)])
        w3 = VllmWorker(other, module_of(self.loaded_params("vllm", 0)), load_format="auto")
        self.addCleanup(w3.wex_detach)
        set_par(tp=(2, 0))
        chk = w3.wex_attach(model=MODEL, group="vllm-other")["checkpoint_check"]
        self.assertTrue(chk.startswith("not checked: %s shows none of this rank's parameters"
                                       % other), chk)
        w3.wex_detach()
        with self.assertRaises(ValueError) as e:
            w3.wex_attach(model=MODEL, group="vllm-other", checkpoint=other)
        self.assertIn("nothing compared", str(e.exception))
        # The refusal of an automatic choice says so, and how to skip it.
        m4 = module_of(self.loaded_params("vllm", 0))
        self.swap_gate_up(m4)
        w4 = VllmWorker(ck, m4, load_format="auto")
        with self.assertRaises(wex.checkpoint.CheckpointMismatch) as e:
            w4.wex_attach(model=MODEL, group="vllm-other")
        self.assertIn("checkpoint=None compared with the model directory", str(e.exception))
        self.assertIn("checkpoint=False", str(e.exception))

        # Dummy weights: not compared, and checkpoint= is refused.
        m = module_of(self.loaded_params("vllm", 0))
        w = VllmWorker(ck, m, load_format="dummy")
        self.addCleanup(w.wex_detach)
        set_par(tp=(2, 0))
        self.swap_gate_up(m)  # not looked at
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="vllm-dummy", checkpoint=ck)
        self.assertIn("load_format='dummy'", str(e.exception))
        self.assertEqual(w.wex_attach(model=MODEL, group="vllm-dummy")["checkpoint_check"],
                         "not checked: the engine's load_format is dummy")
        w.wex_detach()
        # checkpoint=False: not compared; an explicit checkpoint where the
        # model directory holds none (d has only config.json) is compared.
        self.assertEqual(w.wex_attach(model=MODEL, group="vllm-dummy", checkpoint=False)
                         ["checkpoint_check"], "not checked: checkpoint=False")
        w.wex_detach()
        m2 = module_of(self.loaded_params("vllm", 0))
        w2 = VllmWorker(self.tmp.name, m2)
        self.addCleanup(w2.wex_detach)
        self.assertEqual(w2.wex_attach(model=MODEL, group="vllm-explicit")["checkpoint_check"],
                         "not checked: the engine's load_format is unknown")
        w2.wex_detach()
        info = w2.wex_attach(model=MODEL, group="vllm-explicit",
                             checkpoint=os.path.join(self.tmp.name, "hf"))
        self.assertGreater(info["checkpoint_check"]["pieces"], 0)
        w2.wex_detach()
        self.swap_gate_up(m2)
        with self.assertRaises(wex.checkpoint.CheckpointMismatch):
            w2.wex_attach(model=MODEL, group="vllm-explicit",
                          checkpoint=os.path.join(self.tmp.name, "hf"))

    def test_sglang_checkpoint_check(self):
        """The SGLang loader compares each worker's tensors with the
        checkpoint SGLang loaded (load_format auto) on the first
        request: a re-laid-out rank is refused (logged, not attached,
        check() names it); a correct one attaches and syncs; attached
        again after a sync changed its weights, it does not compare."""
        ck = self.checkpoint_dir()
        set_server_args(ck, load_format="auto")
        models = [module_of(self.loaded_params("sglang", k)) for k in range(2)]
        self.swap_gate_up(models[1])

        def load(k, req):
            set_par(tp=(2, k))
            return wex.sglang.load(models[k], req)

        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-ck", min_version=v)
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sg-ck", detach=True))
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(load(1, req))
        self.assertIn("gate_up_proj", logs.output[0])
        self.assertIn("weights unchanged", logs.output[0])
        self.assertNotIn(id(models[1]), wex.sglang._ranks)
        self.assertIn("CheckpointMismatch", wex.sglang.status(models[1])["error"])
        # The same request again: refused at once, not compared again;
        # and so after SGLang released and resumed the weights without a
        # backup (the first request watched its memory saver): a rank
        # never attached was never changed by wex.
        tms = types.ModuleType("torch_memory_saver")
        tms.torch_memory_saver = saver = MemorySaver([models[1]])
        sys.modules["torch_memory_saver"] = tms
        self.addCleanup(sys.modules.pop, "torch_memory_saver")
        self.addCleanup(setattr, wex.sglang, "_released", None)
        with unittest.mock.patch.object(wex.checkpoint, "compare",
                                        side_effect=AssertionError("compared again")):
            for release in (False, True):
                if release:
                    saver.pause(tag="weights")
                    saver.resume(tag="weights")
                with self.assertLogs("wex.sglang", "ERROR") as logs:
                    self.assertIsNone(load(1, req))
                self.assertIn("gate_up_proj", logs.output[0])
                self.assertIn("not compared again", logs.output[0])
                self.assertNotIn(id(models[1]), wex.sglang._ranks)
        self.assertTrue(saver._wex_wrapped)
        # detach=True: the next request compares again (and refuses).
        load(1, wex.sglang.request(MODEL, group="sg-ck", detach=True))
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(load(1, req))
        self.assertNotIn("not compared again", logs.output[0])
        self.assertIn("CheckpointMismatch", wex.sglang.status(models[1])["error"])
        r = load(0, req)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        chk = wex.sglang._ranks[id(models[0])][0].describe()["checkpoint_check"]
        self.assertIsInstance(chk, dict, chk)
        self.assertGreater(chk["pieces"], 0)
        with self.assertRaises(RuntimeError) as e:
            wex.sglang.check(MODEL, "sg-ck", v, world_size=2)
        self.assertIn("rank 1 not attached", str(e.exception))
        self.assert_holds(params_of(models[0]), "sglang", 0)
        # Detached and attached again: the weights are the trainer's, not compared.
        load(0, wex.sglang.request(MODEL, group="sg-ck", detach=True))
        self.assertEqual(load(0, req)["version"], v)
        self.assertEqual(wex.sglang._ranks[id(models[0])][0].describe()["checkpoint_check"],
                         "not checked: a sync changed the weights since the engine loaded them")
        # checkpoint=False for the rank that re-laid out: attaches; later
        # requests need not repeat it.
        req2 = wex.sglang.request(MODEL, group="sg-ck2", min_version=v, checkpoint=False)
        self.addCleanup(load, 1, wex.sglang.request(MODEL, group="sg-ck2", detach=True))
        self.assertEqual(load(1, req2)["version"], v)
        self.assertEqual(load(1, wex.sglang.request(MODEL, group="sg-ck2", min_version=v))
                         ["version"], v)
        # A pathlib.Path is a path.
        self.assertIn(ck, wex.sglang.request(MODEL, checkpoint=pathlib.Path(ck))[0][0])

    def test_sglang_ue8m0(self):
        """SGLang's DeepGEMM UE8M0 requantization of block-FP8 scales
        (deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0), which makes the scales
        packed int32 tensors in new memory: such a model is refused at
        attach, naming the switch that turns it off; not a model without
        block scales, nor with the flag off."""
        d = self.tmp.name
        fp8 = os.path.join(d, "fp8.json")
        with open(fp8, "w") as f:
            json.dump(dict(glue.CONFIG, quantization_config={
                "quant_method": "fp8", "weight_block_size": [128, 128]}), f)
        mod = types.ModuleType("sglang.srt.layers.deep_gemm_wrapper")
        mod.DEEPGEMM_SCALE_UE8M0 = False
        layers = types.ModuleType("sglang.srt.layers")
        layers.deep_gemm_wrapper = mod
        for name, m in (("sglang.srt.layers", layers),
                        ("sglang.srt.layers.deep_gemm_wrapper", mod)):
            self.addCleanup(sys.modules.pop, name, None)
            sys.modules[name] = m
        self.assertFalse(wex.sglang._ue8m0_requant(fp8))
        mod.DEEPGEMM_SCALE_UE8M0 = True
        self.assertTrue(wex.sglang._ue8m0_requant(fp8))
        self.assertFalse(wex.sglang._ue8m0_requant(os.path.join(d, "config.json")))
        # Other block sizes are not requantized; a config.json that does
        # not parse is not refused for UE8M0 (wex.Layout reports it).
        other = os.path.join(d, "fp8-64.json")
        with open(other, "w") as f:
            json.dump(dict(glue.CONFIG, quantization_config={
                "quant_method": "fp8", "weight_block_size": [64, 64]}), f)
        self.assertFalse(wex.sglang._ue8m0_requant(other))
        with open(other, "w") as f:
            f.write("{not json")
        self.assertFalse(wex.sglang._ue8m0_requant(other))
        model_dir = os.path.join(d, "fp8model")
        os.makedirs(model_dir, exist_ok=True)
        shutil.copy(fp8, os.path.join(model_dir, "config.json"))
        m = module_of(self.engine_params("sglang", 0))
        set_par(tp=(2, 0))
        set_server_args(model_dir)

        def attach_log():
            with self.assertLogs("wex.sglang", "ERROR") as logs:
                wex.sglang.load(m, wex.sglang.request(MODEL, group="ue8m0"))
            self.assertNotIn(id(m), wex.sglang._ranks)
            return logs.output[0]
        err = attach_log()
        self.assertIn("UE8M0", err)
        self.assertIn("SGLANG_ENABLE_JIT_DEEPGEMM=0", err)
        mod.DEEPGEMM_SCALE_UE8M0 = False
        self.assertNotIn("UE8M0", attach_log())  # (refused for the FP8 layout's dtypes)
        mod.DEEPGEMM_SCALE_UE8M0 = True
        # Older SGLang: the module under sglang.srt.layers.quantization.
        for name in ("sglang.srt.layers", "sglang.srt.layers.deep_gemm_wrapper"):
            del sys.modules[name]
        quant = types.ModuleType("sglang.srt.layers.quantization")
        quant.deep_gemm_wrapper = mod
        for name, m in (("sglang.srt.layers", layers),
                        ("sglang.srt.layers.quantization", quant),
                        ("sglang.srt.layers.quantization.deep_gemm_wrapper", mod)):
            self.addCleanup(sys.modules.pop, name, None)
            sys.modules[name] = m
        del layers.deep_gemm_wrapper
        self.assertTrue(wex.sglang._ue8m0_requant(fp8))
        mod.DEEPGEMM_SCALE_UE8M0 = False
        self.assertFalse(wex.sglang._ue8m0_requant(fp8))
        with self.assertRaises(ValueError):
            wex.sglang.request(MODEL, checkpoint=True)

    def test_vllm_deep_gemm_requant(self):
        """vLLM's DeepGEMM requantization of block-FP8 weights and scales
        after loading (vllm.utils.deep_gemm.is_deep_gemm_e8m0_used(); an
        older vLLM's is_blackwell_deep_gemm_used()): UE8M0 scales written
        over the loaded ones, int32 packed scales in new memory on
        Blackwell.  Such a model is refused at attach, before anything is
        attached, naming the switch that turns it off; not with the flag
        false, nor a vLLM without the module, nor a model without block
        scales."""
        d = self.tmp.name
        model_dir = os.path.join(d, "vllm-fp8")
        os.makedirs(model_dir, exist_ok=True)
        cfg = os.path.join(model_dir, "config.json")
        with open(cfg, "w") as f:
            json.dump(dict(glue.CONFIG, quantization_config={
                "quant_method": "fp8", "weight_block_size": [16, 16],
                "activation_scheme": "dynamic"}), f)
        layout = wex.Layout(cfg, "vllm:tp=2")
        # Debian's torch may lack float8 dtypes: U8 stands in (the layout
        # then refuses those tensors' dtype, after the check tested here).
        params = {n: torch.zeros(shape, dtype=torch.uint8 if dt.startswith("F8") and
                                 not hasattr(torch, "float8_e4m3fn")
                                 else torch_util.torch_dtype(dt))
                  for n, dt, shape, _ in layout.rank(0)}
        self.assertTrue(any(n.endswith("weight_scale_inv") for n in params))
        m = module_of(params)
        fp8_ok = hasattr(torch, "float8_e4m3fn")
        dense = module_of(self.engine_params("vllm", 0))
        set_par(tp=(2, 0))
        dg = types.ModuleType("vllm.utils.deep_gemm")
        utils = types.ModuleType("vllm.utils")
        utils.deep_gemm = dg
        for name, mod in (("vllm.utils", utils), ("vllm.utils.deep_gemm", dg)):
            self.addCleanup(sys.modules.pop, name, None)
            sys.modules[name] = mod
        flag = {"on": False}
        dg.is_deep_gemm_e8m0_used = lambda: flag["on"]

        def attach_error(model_dir, module, **kw):
            w = VllmWorker(model_dir, module)
            try:
                w.wex_attach(model=MODEL, group="dg", **kw)
            except Exception as e:
                self.assertIsNone(w.wex_status())  # nothing attached
                return str(e)
            w.wex_detach()
            return None

        def not_refused(err):  # attaches, or refused for something else
            if fp8_ok:
                self.assertIsNone(err)
            else:
                self.assertNotIn("DeepGEMM", err or "")

        # Flag false: attaches.
        not_refused(attach_error(model_dir, m))
        flag["on"] = True
        err = attach_error(model_dir, m)
        self.assertIsNotNone(err)
        self.assertIn("is_deep_gemm_e8m0_used", err)
        self.assertIn("VLLM_USE_DEEP_GEMM=0", err)
        # Given only a wex.Layout (no config.json read): seen in vLLM's
        # parameter names (*_scale_inv).
        self.assertIn("VLLM_USE_DEEP_GEMM=0", attach_error(model_dir, m, layout=layout) or "")
        # A model without block scales is not refused for it.
        self.assertIsNone(attach_error(d, dense))
        # vLLM requantizes a block-FP8 Linear layer only where
        # should_use_deepgemm_for_fp8_linear(layer.orig_dtype, weight) says
        # DeepGEMM runs it (fp8_utils maybe_post_process_fp8_weight_block):
        # DeepGEMM supported, a bfloat16 model dtype, the weight's shape in
        # its multiples (here the stand-in's 16).  Its Fp8LinearMethod
        # layers carry weight_block_size and orig_dtype.
        blocks = [(n, mod) for n, mod in m.named_modules() if "weight_scale_inv" in mod._parameters]
        self.assertTrue(blocks)
        # --dtype float16: DeepGEMM runs no layer, none is requantized.
        for _, mod in blocks:
            mod.weight_block_size, mod.orig_dtype = [16, 16], torch.float16
        supported = {"on": True}
        dg.should_use_deepgemm_for_fp8_linear = lambda out, weight: (
            supported["on"] and out == torch.bfloat16 and weight.shape[0] % 16 == 0 and
            weight.shape[1] % 16 == 0)
        not_refused(attach_error(model_dir, m))
        # bfloat16: refused, naming a layer vLLM requantizes.
        for _, mod in blocks:
            mod.orig_dtype = torch.bfloat16
        err = attach_error(model_dir, m) or ""
        self.assertIn("VLLM_USE_DEEP_GEMM=0", err)
        self.assertIn(blocks[0][0], err)
        # A GPU DeepGEMM does not support (is_deep_gemm_supported() false).
        supported["on"] = False
        not_refused(attach_error(model_dir, m))
        supported["on"] = True
        # A release whose predicate takes the weight's shape.
        dg.should_use_deepgemm_for_fp8_linear = lambda out, shape: (
            out == torch.bfloat16 and shape[0] % 16 == 0 and shape[1] % 16 == 0)
        self.assertIn("VLLM_USE_DEEP_GEMM=0", attach_error(model_dir, m) or "")
        for _, mod in blocks:
            mod.orig_dtype = torch.float16
        not_refused(attach_error(model_dir, m))
        # A layer that does not say its dtype: refused (cannot tell).
        del blocks[-1][1].orig_dtype
        self.assertIn(blocks[-1][0], attach_error(model_dir, m) or "")
        # A FusedMoE layer with block scales: Fp8MoEMethod requantizes it
        # whatever the model dtype (about 0.10; later only for DeepGEMM's
        # backend, which _refuse_moe_relayout refuses).
        experts = module_of({"model.layers.0.mlp.experts.w13_weight": torch.zeros(2, 32, 16),
                             "model.layers.0.mlp.experts.w13_weight_scale_inv":
                             torch.ones(2, 2, 1)})
        self.assertEqual(wex.vllm._deep_gemm_requant(experts),
                         ("is_deep_gemm_e8m0_used", "model.layers.0.mlp.experts"))
        for _, mod in blocks:
            mod.__dict__.pop("orig_dtype", None)
            del mod.weight_block_size
        del dg.should_use_deepgemm_for_fp8_linear
        # An older vLLM's name for it.
        del dg.is_deep_gemm_e8m0_used
        dg.is_blackwell_deep_gemm_used = lambda: flag["on"]
        self.assertIn("is_blackwell_deep_gemm_used", attach_error(model_dir, m) or "")
        flag["on"] = False
        not_refused(attach_error(model_dir, m))
        # A vLLM without vllm.utils.deep_gemm: not refused for it.
        flag["on"] = True
        del sys.modules["vllm.utils.deep_gemm"]
        sys.modules["vllm.utils"] = types.ModuleType("vllm.utils")
        not_refused(attach_error(model_dir, m))

    def test_vllm_sleep_mode(self):
        """vLLM's sleep mode: a sync while the weights sleep is refused
        before touching them; after level 1 (backed up) the version held
        stands; after level 2 (memory new, bytes lost) the rank forgets
        its version at once and the next sync copies it whole again; a
        wake-up that raises counts as lost; a sleep before wex_attach is
        seen in vLLM's state."""
        d = self.tmp.name
        workers, modules = [], []
        for k in range(2):
            modules.append(module_of(self.engine_params("vllm", k)))
            workers.append(SleepyWorker(d, modules[-1], load_format="dummy"))

        def on(k, fn, *a, **kw):
            set_par(tp=(2, k))
            return getattr(workers[k], fn)(*a, **kw)

        for k, w in enumerate(workers):
            on(k, "wex_attach", model=MODEL, group="vllm-sleep")
            self.addCleanup(w.wex_detach)
        v = self.next_version()
        for k in range(2):
            self.assertTrue(on(k, "wex_sync", min_version=v)["changed"])

        # Level 1: refused while asleep (and after waking only the KV
        # cache), with a new version that a sync would copy: nothing written.
        for w in workers:
            w.sleep(level=1)
        v2 = self.next_version()
        for k in range(2):
            with self.assertRaises(ValueError) as e:
                on(k, "wex_sync", min_version=v2)
            self.assertIn("vLLM is asleep (sleep level 1)", str(e.exception))
            self.assertIn("nothing copied", str(e.exception))
            self.assertTrue(all_equal(modules[k], 3))
        self.assertEqual(workers[0].wex_status()["released"], "vLLM is asleep (sleep level 1)")
        workers[0].wake_up(tags=["kv_cache"])
        with self.assertRaises(ValueError):
            on(0, "wex_sync", min_version=v2)
        for w in workers:
            w.wake_up(tags=["weights"])
        for k in range(2):
            self.assertEqual(on(k, "wex_sync", min_version=v2)["changed"], 1)
        # Level 1 with no new version: the backup comes back, the version
        # held stands (nothing copied).
        for w in workers:
            w.sleep(level=1)
            w.wake_up()
        for k in range(2):
            r = on(k, "wex_sync", min_version=v2)
            self.assertEqual((r["version"], r["changed"], r["bytes"]), (v2, 0, 0))
            self.assert_holds(params_of(modules[k]), "vllm", k)
            st = workers[k].wex_status()
            self.assertEqual((st["forgotten"], st["lost"]), (0, None))

        # Level 2: the bytes are lost on waking.  The ranks forget v2 at
        # once (wexd no longer counts them), and a sync of v2 copies it
        # whole again (without the hook: changed 0, the 7s served).
        for w in workers:
            w.sleep(level=2)
            w.wake_up()
        self.assertTrue(all_equal(modules[1], 7))
        self.assertEqual([r.get("served", 0)
                          for r in wex.engine.group_status(MODEL, "vllm-sleep")], [0, 0])
        for k in range(2):
            st = workers[k].wex_status()
            self.assertEqual(st["forgotten"], 1)
            self.assertIn("without its bytes", st["lost"])
            self.assertTrue(workers[k]._wex.dirty())
            # A later attach is not compared with the checkpoint, saying why.
            self.assertIn("sleep mode discarded the weights", workers[k]._wex_changed)
            r = on(k, "wex_sync", min_version=v2)
            self.assertEqual((r["version"], r["changed"]), (v2, 1))
            self.assertEqual(r["bytes"], st["bytes"])
            self.assert_holds(params_of(modules[k]), "vllm", k)
            self.assertIsNone(workers[k].wex_status()["lost"])
            self.assertFalse(workers[k]._wex.dirty())
            self.assertTrue(workers[k]._wex_changed)
            self.assertEqual(on(k, "wex_sync", min_version=v2)["changed"], 0)
        self.assertEqual(len(wex.engine.check_group(MODEL, "vllm-sleep", v2, world_size=2)), 2)
        # Attached again after a wake-up that lost them: not compared with
        # the checkpoint, saying why; after the next sync, that a sync
        # changed them.
        workers[0].sleep(level=2)
        workers[0].wake_up()
        for why in ("vLLM's sleep mode discarded the weights", "a sync changed the weights"):
            workers[0].wex_detach()
            on(0, "wex_attach", model=MODEL, group="vllm-sleep")
            self.assertTrue(workers[0].wex_status()["checkpoint_check"].startswith(
                "not checked: " + why), workers[0].wex_status()["checkpoint_check"])
            self.assertEqual(on(0, "wex_sync", min_version=v2)["version"], v2)
        self.assert_holds(params_of(modules[0]), "vllm", 0)

        # A wake-up that raises (its rollback unmaps the weights again, the
        # backups spent): still asleep, then lost even after level 1.  The
        # class's method is looked up at each call (patched later: seen).
        def broken(worker, tags=None):
            raise RuntimeError("cuMemMap: out of memory")
        workers[0].sleep(level=1)
        with unittest.mock.patch.object(SleepyWorker, "wake_up", broken):
            with self.assertRaises(RuntimeError):
                workers[0].wake_up()
        with self.assertRaises(ValueError):
            on(0, "wex_sync", min_version=v2)
        workers[0].wake_up()
        r = on(0, "wex_sync", min_version=v2)
        self.assertEqual((r["version"], r["changed"]), (v2, 1))
        self.assert_holds(params_of(modules[0]), "vllm", 0)

        # A sleep that raises: vLLM counts itself awake; the hook too,
        # with the bytes counted lost (libwex refuses what is left
        # unmapped): the next sync copies the version whole.
        def broken_sleep(worker, level=1):
            scribble(worker.model_runner.model, 3)
            raise RuntimeError("cudaMemcpy: out of pinned memory")
        with unittest.mock.patch.object(SleepyWorker, "sleep", broken_sleep):
            with self.assertRaises(RuntimeError):
                workers[0].sleep(level=1)
        self.assertIsNone(workers[0].wex_status()["released"])
        r = on(0, "wex_sync", min_version=v2)
        self.assertEqual((r["version"], r["changed"]), (v2, 1))
        self.assert_holds(params_of(modules[0]), "vllm", 0)

        # Forgetting fails (a parameter re-allocated while asleep): said in
        # "lost"; the sync refuses by name until attached again.
        workers[1].sleep(level=2)
        qkv = modules[1].model.layers._modules["0"].self_attn.qkv_proj.weight
        qkv.data = qkv.data.clone()
        workers[1].wake_up()
        self.assertIn("attaching again failed", workers[1].wex_status()["lost"])
        with self.assertRaises(ValueError) as e:
            on(1, "wex_sync", min_version=v2)
        self.assertIn("qkv_proj", str(e.exception))
        workers[1].wex_detach()
        on(1, "wex_attach", model=MODEL, group="vllm-sleep")
        self.assertEqual(on(1, "wex_sync", min_version=v2)["changed"], 1)
        self.assert_holds(params_of(modules[1]), "vllm", 1)

        # Detached while asleep: attach refused until the weights wake.
        workers[0].sleep(level=2)
        workers[0].wex_detach()
        with self.assertRaises(ValueError) as e:
            on(0, "wex_attach", model=MODEL, group="vllm-sleep")
        self.assertIn("wake_up(tags=['weights'])", str(e.exception))
        workers[0].wake_up()
        on(0, "wex_attach", model=MODEL, group="vllm-sleep")
        self.assertEqual(on(0, "wex_sync", min_version=v2)["changed"], 1)
        self.assert_holds(params_of(modules[0]), "vllm", 0)

        # A sleep before the first wex_attach (nothing wrapped yet), seen
        # in vLLM's state: level 2's saved buffers, level 1's CPU backups.
        fresh = SleepyWorker(d, module_of(self.engine_params("vllm", 1)), load_format="dummy")
        fresh._sleep_saved_buffers = {"model.rotary_emb.inv_freq": torch.ones(4)}
        set_par(tp=(2, 1))
        with self.assertRaises(ValueError) as e:
            fresh.wex_attach(model=MODEL, group="vllm-fresh")
        self.assertIn("sleep level 2", str(e.exception))
        fresh._sleep_saved_buffers = {}
        cumem = types.ModuleType("vllm.device_allocator.cumem")
        backup = types.SimpleNamespace(tag="weights", cpu_backup_tensor=torch.zeros(1))

        class CuMemAllocator:
            instance = types.SimpleNamespace(pointer_to_data={
                1: types.SimpleNamespace(tag="kv_cache", cpu_backup_tensor=None), 2: backup})
        cumem.CuMemAllocator = CuMemAllocator
        for name, mod in (("vllm.device_allocator", types.ModuleType("vllm.device_allocator")),
                          ("vllm.device_allocator.cumem", cumem)):
            sys.modules[name] = mod
            self.addCleanup(sys.modules.pop, name)
        fresh.vllm_config.model_config.enable_sleep_mode = True
        with self.assertRaises(ValueError) as e:
            fresh.wex_attach(model=MODEL, group="vllm-fresh")
        self.assertIn("sleep level 1", str(e.exception))
        backup.cpu_backup_tensor = None  # woken
        fresh.wex_attach(model=MODEL, group="vllm-fresh")
        fresh.wex_detach()

        # libwex's own check (wex.released), which EngineRank asks before
        # reading or attaching anything (the binding here: no driver is
        # loaded, so None; NULL refused); a tensor the driver says is
        # released (patched: there is no GPU) refuses the attach by name.
        host = torch.zeros(4)
        self.assertIsNone(wex.released(host.data_ptr(), 16))
        with self.assertRaises(wex.WexError):
            wex.released(0, 1)
        name, first = next(iter(fresh.model_runner.model.named_parameters()))
        gone, asked = first.data_ptr(), {}

        def released(p, n):
            asked[p] = n
            return p if p == gone else None
        with unittest.mock.patch.object(wex, "released", released):
            with self.assertRaises(ValueError) as e:
                fresh.wex_attach(model=MODEL, group="vllm-fresh")
        self.assertIn("released the memory of %s (nothing mapped at %#x)" % (name, gone),
                      str(e.exception))
        self.assertEqual(asked[gone], first.numel() * first.element_size())
        # A strided view's span: from its first element to past its last.
        view = torch.zeros(6, 8)[:, 2:5]
        asked.clear()
        with unittest.mock.patch.object(wex, "released", released):
            self.assertIsNone(wex.engine._released([("v", view)]))
        self.assertEqual(asked[view.data_ptr()], (5 * 8 + 3) * 4)
        self.assertIsNone(fresh.wex_status())

    def test_vllm_sleep_tags(self):
        """Newer vLLM's tag sleep (LLM.sleep(tags=[...]), the worker's
        sleep(level=1, tags=...)): sleeping the KV cache alone leaves the
        weights as they are, so syncs go on, also after its wake-up;
        sleeping "weights" by tag discards them (no CPU backup, whatever
        the level), so waking them forgets the version and the next sync
        copies it whole."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        w = TaggedSleepyWorker(d, module, load_format="dummy")
        other = VllmWorker(d, module_of(self.engine_params("vllm", 1)), load_format="dummy")

        def sync(min_version):
            set_par(tp=(2, 1))  # the group's other rank keeps up
            other.wex_sync(min_version=min_version)
            set_par(tp=(2, 0))
            return w.wex_sync(min_version=min_version)

        for k, x in ((1, other), (0, w)):
            set_par(tp=(2, k))
            x.wex_attach(model=MODEL, group="vllm-tags")
            self.addCleanup(x.wex_detach)
        v = self.next_version()
        self.assertEqual(sync(v)["changed"], 1)

        # The KV cache alone: the weights stay mapped and synced.
        w.sleep(level=1, tags=["kv_cache"])
        self.assertIsNone(w.wex_status()["released"])
        v2 = self.next_version()
        self.assertEqual(sync(v2)["changed"], 1)
        self.assert_holds(params_of(module), "vllm", 0)
        w.wake_up(tags=["kv_cache"])
        self.assertIsNone(w.wex_status()["released"])
        self.assertEqual(sync(v2)["changed"], 0)

        # The weights by tag (level 1, the default, offloads nothing
        # here): refused while asleep; woken, their bytes are lost.
        w.sleep(level=1, tags=["weights"])
        with self.assertRaises(ValueError) as e:
            sync(v2)
        self.assertIn("nothing copied", str(e.exception))
        w.wake_up(tags=["weights"])
        self.assertTrue(all_equal(module, 7))
        st = w.wex_status()
        self.assertEqual(st["forgotten"], 1)
        self.assertIn("without its bytes", st["lost"])
        r = sync(v2)
        self.assertEqual((r["version"], r["changed"]), (v2, 1))
        self.assert_holds(params_of(module), "vllm", 0)
        # Positionally, as the method's signature allows.
        w.sleep(1, ["weights", "kv_cache"])
        w.wake_up()
        self.assertEqual(sync(v2)["changed"], 1)
        self.assert_holds(params_of(module), "vllm", 0)

    def install_cumem(self, *allocations):
        """vllm.device_allocator.cumem with a CuMemAllocator instance whose
        pointer_to_data holds `allocations` (CuMemAllocation)."""
        cumem = types.ModuleType("vllm.device_allocator.cumem")

        class CuMemAllocator:
            instance = types.SimpleNamespace(
                pointer_to_data={0x1000 * (k + 1): a for k, a in enumerate(allocations)})
        cumem.CuMemAllocator = CuMemAllocator
        for name, mod in (("vllm.device_allocator", types.ModuleType("vllm.device_allocator")),
                          ("vllm.device_allocator.cumem", cumem)):
            sys.modules[name] = mod
            self.addCleanup(sys.modules.pop, name)

    def test_vllm_weights_released_before_attach(self):
        """A release of the weights before wex_attach (nothing wrapped yet)
        that leaves no CPU backup and no saved buffers (newer vLLM's tag
        sleep or discard of "weights", a level-2 sleep of a model without
        buffers) is seen in vLLM's state: the worker's _asleep_tags, or
        CuMemAllocator's is_asleep of the allocations tagged "weights";
        the attach is refused, saying so, before anything reads them."""
        d = self.tmp.name
        set_par(tp=(2, 0))
        w = DiscardingWorker(d, module_of(self.engine_params("vllm", 0)), load_format="dummy")
        w.discard(("weights",))
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="vllm-before")
        self.assertIn("asleep tags: ['weights']", str(e.exception))
        self.assertIn("wake_up(tags=['weights'])", str(e.exception))
        self.assertIsNone(w.wex_status())
        w.wake_up(tags=["kv_cache"])  # the KV cache alone: still released
        with self.assertRaises(ValueError):
            w.wex_attach(model=MODEL, group="vllm-before")
        w.wake_up(tags=["weights"])
        w.wex_attach(model=MODEL, group="vllm-before")
        w.wex_detach()
        # A vLLM whose worker keeps no such set: CuMemAllocator's
        # per-allocation is_asleep.
        fresh = SleepyWorker(d, module_of(self.engine_params("vllm", 0)), load_format="dummy")
        fresh.vllm_config.model_config.enable_sleep_mode = True
        weights = CuMemAllocation("weights", is_asleep=True)
        self.install_cumem(CuMemAllocation("kv_cache", is_asleep=True), weights,
                           CuMemAllocation("weights"))
        with self.assertRaises(ValueError) as e:
            fresh.wex_attach(model=MODEL, group="vllm-before")
        self.assertIn("1 of the 2 allocations tagged 'weights' are released", str(e.exception))
        weights.is_asleep = False  # woken
        fresh.wex_attach(model=MODEL, group="vllm-before")
        fresh.wex_detach()

    def test_vllm_discard_weights(self):
        """Newer vLLM's discard(tags) (the executor's discard; the worker's
        discard releases those tags' memory with no CPU backup): of
        "weights", a sync is refused while they are released, and waking
        them forgets the version, so the next sync copies it whole (it
        copied nothing, and vLLM served the discarded memory); of the KV
        cache alone, syncs go on."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        w = DiscardingWorker(d, module, load_format="dummy")
        other = VllmWorker(d, module_of(self.engine_params("vllm", 1)), load_format="dummy")

        def sync(min_version):
            set_par(tp=(2, 1))
            other.wex_sync(min_version=min_version)
            set_par(tp=(2, 0))
            return w.wex_sync(min_version=min_version)

        for k, x in ((1, other), (0, w)):
            set_par(tp=(2, k))
            x.wex_attach(model=MODEL, group="vllm-discard")
            self.addCleanup(x.wex_detach)
        v = self.next_version()
        self.assertEqual(sync(v)["changed"], 1)
        w.discard(("kv_cache",))
        self.assertIsNone(w.wex_status()["released"])
        self.assertEqual(sync(v)["changed"], 0)
        w.wake_up(tags=["kv_cache"])
        w.discard(tags=("weights",))
        with self.assertRaises(ValueError) as e:
            sync(v)
        self.assertIn("vLLM discarded its weights' memory", str(e.exception))
        self.assertIn("nothing copied", str(e.exception))
        w.wake_up(tags=["weights"])
        self.assertTrue(all_equal(module, 7))
        self.assertEqual(w.wex_status()["forgotten"], 1)
        r = sync(v)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        self.assert_holds(params_of(module), "vllm", 0)

    def test_vllm_reload_weights_kernel_format(self):
        """The worker's reload_weights with weights in kernel format
        (is_checkpoint_format=False) copies them into the parameters
        without the model's load_weights: the rank forgets its version
        all the same (once, also where reload_weights goes through
        load_weights), and the next sync copies it whole again."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        module.load_weights = lambda weights: scribble(module, 5)
        w = ReloadingWorker(d, module, load_format="dummy")
        set_par(tp=(2, 0))
        w.wex_attach(model=MODEL, group="vllm-kernel")
        self.addCleanup(w.wex_detach)
        v = self.next_version()
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        name, p = next(iter(module.named_parameters()))
        w.reload_weights([(name, torch.full_like(p, 9))], is_checkpoint_format=False)
        self.assertTrue(bool((p == 9).all()))
        self.assertEqual(w.wex_status()["forgotten"], 1)
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        self.assert_holds(params_of(module), "vllm", 0)
        w.reload_weights([])  # through load_weights: forgotten once
        self.assertTrue(all_equal(module, 5))
        self.assertEqual(w.wex_status()["forgotten"], 2)
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        self.assert_holds(params_of(module), "vllm", 0)

    def test_vllm_reload_refused_asleep(self):
        """A reload vLLM refuses while the weights sleep (it writes
        nothing) neither forgets the version nor detaches the rank:
        libwex refuses to attach released memory (patched here: no GPU),
        so a forget there would fail and close the rank; after the
        level-1 wake-up the weights hold the version, and the next sync
        copies nothing."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        module.load_weights = lambda weights: scribble(module, 5)
        w = ResidentReloadingWorker(d, module, load_format="dummy")
        set_par(tp=(2, 0))
        w.wex_attach(model=MODEL, group="vllm-refused")
        self.addCleanup(w.wex_detach)
        v = self.next_version()
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        w.sleep(level=1)
        attach = wex.engine.torch_util.attach_module

        def attach_mapped(*a, **kw):  # as libwex: nothing mapped, EFAULT
            if "weights" in w._asleep_tags:
                raise wex.WexError(errno.EFAULT, "nothing is mapped at the weights")
            return attach(*a, **kw)
        with unittest.mock.patch.object(wex.engine.torch_util, "attach_module", attach_mapped):
            with self.assertRaises(RuntimeError):
                w.reload_weights([])
        self.assertIsNotNone(w.wex_status(), "a refused reload detached the rank")
        self.assertEqual(w.wex_status()["forgotten"], 0)
        w.wake_up()
        r = w.wex_sync(min_version=v)
        self.assertEqual((r["version"], r["changed"], r["bytes"]), (v, 0, 0))
        self.assert_holds(params_of(module), "vllm", 0)

    def test_vllm_load_weights_threads(self):
        """Loads in two threads at once, the first ending first: each
        forgets the version, and a load after both still does (the
        nesting is counted per thread; a count shared by both stayed at
        1, and every later load went unseen: the next sync copied
        nothing over vLLM's weights)."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        gates = []

        def load_weights(weights):
            gate = gates.pop(0) if gates else None
            if gate is not None:
                gate[0].set()
                self.assertTrue(gate[1].wait(30))
            scribble(module, 5)
        module.load_weights = load_weights
        w = VllmWorker(d, module, load_format="dummy")
        set_par(tp=(2, 0))
        w.wex_attach(model=MODEL, group="vllm-threads")
        self.addCleanup(w.wex_detach)
        v = self.next_version()
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        runs = []
        for _ in range(2):
            gate = (threading.Event(), threading.Event())
            gates.append(gate)
            t = threading.Thread(target=module.load_weights, args=([],))
            t.start()
            self.assertTrue(gate[0].wait(30))
            runs.append((t, gate))
        for t, gate in runs:  # the first to enter ends first
            gate[1].set()
            t.join(30)
        forgotten = w.wex_status()["forgotten"]
        self.assertGreaterEqual(forgotten, 1)
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        module.load_weights([])
        self.assertEqual(w.wex_status()["forgotten"], forgotten + 1, "a later load went unseen")
        self.assertEqual(w.wex_sync(min_version=v)["changed"], 1)
        self.assert_holds(params_of(module), "vllm", 0)

    def test_vllm_sleep_backend_other(self):
        """A level-1 wake-up copies back the weights as they were at the
        sleep only with vLLM's "cumem" sleep-mode backend; another one
        (a host copy kept from the first suspend) may copy back older
        bytes: the rank forgets its version, and the next sync copies it
        whole (it copied nothing, and vLLM served the older weights)."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        w = PinnedSleepyWorker(d, module, load_format="dummy")
        other = VllmWorker(d, module_of(self.engine_params("vllm", 1)), load_format="dummy")

        def sync(min_version):
            set_par(tp=(2, 1))
            other.wex_sync(min_version=min_version)
            set_par(tp=(2, 0))
            return w.wex_sync(min_version=min_version)

        for k, x in ((1, other), (0, w)):
            set_par(tp=(2, k))
            x.wex_attach(model=MODEL, group="vllm-pinned")
            self.addCleanup(x.wex_detach)
        w.sleep(level=1)  # the first suspend: the copy kept (not the version)
        w.wake_up()
        v = self.next_version()
        self.assertEqual(sync(v)["changed"], 1)
        w.sleep(level=1)
        w.wake_up()
        self.assertEqual(w.wex_status()["forgotten"], 2)  # at each wake-up
        r = sync(v)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        self.assert_holds(params_of(module), "vllm", 0)

    def test_vllm_load_weights_elsewhere(self):
        """vLLM's own reloads (the worker's reload_weights, the weight-
        transfer engine's update_weights) and RL frameworks' updates
        through collective_rpc (model_runner.model.load_weights(weights=
        [(name, tensor)]): veRL, OpenRLHF, vLLM's RLHF examples) write
        into the attached parameters in place: the rank forgets its
        version at once (check_group no longer counts it) and the next
        sync copies the whole version again instead of nothing; a load
        that replaced a parameter detaches the rank, saying so."""
        d = self.tmp.name
        workers, modules = [], []
        for k in range(2):
            modules.append(module_of(self.engine_params("vllm", k)))

            def load_weights(weights, m=modules[-1]):  # as a model's load_weights does
                for _ in weights:
                    pass
                scribble(m, 5)
            modules[-1].load_weights = load_weights
            workers.append(VllmWorker(d, modules[-1], load_format="dummy"))

        def on(k, fn, *a, **kw):
            set_par(tp=(2, k))
            return getattr(workers[k], fn)(*a, **kw)

        for k, w in enumerate(workers):
            on(k, "wex_attach", model=MODEL, group="vllm-reload")
            self.addCleanup(w.wex_detach)
        v = self.next_version()
        for k in range(2):
            self.assertEqual(on(k, "wex_sync", min_version=v)["changed"], 1)
        self.assertEqual(len(wex.engine.check_group(MODEL, "vllm-reload", v, world_size=2)), 2)
        workers[0].model_runner.model.load_weights(
            weights=[("model.embed_tokens.weight", torch.zeros(1))])
        self.assertTrue(all_equal(modules[0], 5))
        with self.assertRaises(RuntimeError) as e:
            wex.engine.check_group(MODEL, "vllm-reload", v, world_size=2)
        self.assertIn("rank 0 at version 0", str(e.exception))
        r = on(0, "wex_sync", min_version=v)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        self.assert_holds(params_of(modules[0]), "vllm", 0)
        self.assertEqual(on(1, "wex_sync", min_version=v)["changed"], 0)  # not reloaded
        self.assertEqual(len(wex.engine.check_group(MODEL, "vllm-reload", v, world_size=2)), 2)
        # Detached and attached again: wrapped once, still seen.
        on(0, "wex_detach")
        on(0, "wex_attach", model=MODEL, group="vllm-reload")
        self.assertEqual(on(0, "wex_sync", min_version=v)["changed"], 1)
        modules[0].load_weights([])
        self.assertEqual(on(0, "wex_sync", min_version=v)["changed"], 1)
        # A load that replaced a parameter (process_weights_after_loading
        # may): the rank cannot forget as it was attached: detached.
        def replacing(weights, m=modules[1]):
            scribble(m, 5)
            emb = m.model.embed_tokens
            emb.weight = torch.nn.Parameter(emb.weight.detach().clone(), requires_grad=False)
        modules[1].load_weights = replacing
        on(1, "wex_detach")
        on(1, "wex_attach", model=MODEL, group="vllm-reload")
        set_par(tp=(2, 1))
        with self.assertLogs("wex", "WARNING"):
            modules[1].load_weights([])
        self.assertIsNone(workers[1].wex_status())
        with self.assertRaises(RuntimeError) as e:
            wex.engine.check_group(MODEL, "vllm-reload", v, world_size=2)
        self.assertIn("rank 1", str(e.exception))
        with self.assertRaises(ValueError) as e:
            on(1, "wex_sync", min_version=v)
        self.assertIn("detached: vLLM loaded other weights", str(e.exception))
        on(1, "wex_attach", model=MODEL, group="vllm-reload")
        r = on(1, "wex_sync", min_version=v)
        self.assertEqual((r["version"], r["changed"]), (v, 1))
        self.assert_holds(params_of(modules[1]), "vllm", 1)

    def test_vllm_sleep_during_sync(self):
        """A sleep called while a sync runs in another thread: a sync
        waiting for its version is cancelled (WexError ECANCELED, nothing
        copied; the sleep goes on at once, its CPU backup holding what the
        weights held); one past its wait (here held in its last step)
        ends first, and the sleep's backup holds the bytes it copied; a
        sync started while the sleep waits is refused; a sleep interrupted
        while it waits leaves nothing asleep; released() from inside a
        sync of the rank is refused."""
        d = self.tmp.name
        module = module_of(self.engine_params("vllm", 0))
        worker = SleepyWorker(d, module, load_format="dummy")
        other = VllmWorker(d, module_of(self.engine_params("vllm", 1)), load_format="dummy")
        for k, w in enumerate((worker, other)):  # the trainer waits for both ranks
            set_par(tp=(2, k))
            w.wex_attach(model=MODEL, group="vllm-busy")
            self.addCleanup(w.wex_detach)
        v = self.next_version()
        for w in (worker, other):
            self.assertEqual(w.wex_sync(min_version=v)["version"], v)
        scribble(module, 5)  # what the weights hold before the next copy
        out = {}

        def sync(**kw):
            try:
                out["sync"] = worker.wex_sync(timeout_ms=60000, **kw)
            except BaseException as e:  # reported by the assertions below
                out["sync"] = e

        def sleep():
            out["sleep"] = worker.sleep(level=1)

        # 1. Waiting for v + 1 (not published): cancelled by the sleep.
        syncer = threading.Thread(target=sync, kwargs={"min_version": v + 1}, daemon=True)
        syncer.start()
        # Once wexd lists it waiting: the sleep cancels wexd's wait.
        self.await_acquire("vllm-busy")
        t0 = time.monotonic()
        sleeper = threading.Thread(target=sleep, daemon=True)
        sleeper.start()
        syncer.join(30)
        sleeper.join(30)
        self.assertFalse(syncer.is_alive() or sleeper.is_alive())
        self.assertLess(time.monotonic() - t0, 10, "the sleep waited for the sync's timeout")
        self.assertIsInstance(out["sync"], wex.WexError, out["sync"])
        self.assertEqual(out["sync"].code, errno.ECANCELED)
        self.assertIn("vLLM is asleep (sleep level 1): the weights' memory is being released: "
                      "this sync was cancelled", str(out["sync"]))
        self.assertIn("cancelled by the client", str(out["sync"].__cause__))
        self.assertFalse(worker._wex.dirty())
        worker.wake_up()
        self.assertTrue(all_equal(module, 5))  # nothing copied, before or after the backup
        self.assertEqual(self.next_version(), v + 1)
        self.assertEqual(other.wex_sync(min_version=v + 1)["version"], v + 1)
        r = worker.wex_sync(min_version=v + 1)
        self.assertEqual((r["version"], r["changed"]), (v + 1, 1))
        self.assert_holds(params_of(module), "vllm", 0)

        # 2. Past its wait: the sleep waits for it to end.
        scribble(module, 5)
        worker._wex.forget()  # (so the next sync copies every byte again)
        out.clear()
        copied, go = threading.Event(), threading.Event()
        real = worker._wex.client.sync

        def held_sync(*a, **kw):
            r = real(*a, **kw)
            copied.set()
            go.wait(60)
            return r
        with unittest.mock.patch.object(worker._wex.client, "sync", side_effect=held_sync):
            syncer = threading.Thread(target=sync, kwargs={"min_version": v + 1},
                                      daemon=True)
            syncer.start()
            self.assertTrue(copied.wait(30))
            # A sleep interrupted while it waits (Ctrl-C): nothing slept.
            with unittest.mock.patch.object(worker._wex._syncs, "wait",
                                            side_effect=KeyboardInterrupt):
                with self.assertRaises(KeyboardInterrupt):
                    worker.sleep(level=1)
            self.assertIsNone(worker.wex_status()["released"])
            self.assertIsNone(worker._wex_sleeping())
            sleeper = threading.Thread(target=sleep, daemon=True)
            sleeper.start()
            # It waits as long as the sync runs (a failure here: the sleep
            # went ahead under a sync that had not ended).
            sleeper.join(0.5)
            self.assertTrue(sleeper.is_alive(), "the sleep did not wait for the sync")
            # (Waits on what the sleep says, not on the 0.5 s: a loaded
            # machine may not have run the sleeper's thread that far.)
            end = time.monotonic() + 30
            while worker.wex_status()["released"] is None and time.monotonic() < end:
                time.sleep(0.01)
            self.assertEqual(worker.wex_status()["released"], "vLLM is asleep (sleep level 1)")
            self.assertTrue(sleeper.is_alive(), "the sleep did not wait for the sync")
            self.assertNotIn("sleep", out)
            # A sync that starts while the sleep waits is refused.
            with self.assertRaises(ValueError) as e:
                worker.wex_sync(min_version=v + 1)
            self.assertIn("vLLM is asleep (sleep level 1)", str(e.exception))
            go.set()
            syncer.join(60)
            sleeper.join(60)
        self.assertFalse(syncer.is_alive() or sleeper.is_alive())
        self.assertIsInstance(out["sync"], dict, out["sync"])
        self.assertEqual((out["sync"]["version"], out["sync"]["changed"]), (v + 1, 1))
        self.assertEqual(worker.wex_status()["released"], "vLLM is asleep (sleep level 1)")
        with self.assertRaises(ValueError):
            worker.wex_sync(min_version=v + 1)
        worker.wake_up()
        # The backup taken by the sleep: the copied version, not the 5s.
        self.assert_holds(params_of(module), "vllm", 0)
        r = worker.wex_sync(min_version=v + 1)
        self.assertEqual((r["version"], r["changed"], r["bytes"]), (v + 1, 0, 0))
        # released() from inside a sync of the rank (it would wait for
        # itself): refused, the sync fails, nothing counts as released.
        rank = worker._wex
        with unittest.mock.patch.object(rank, "moved",
                                        side_effect=lambda: rank.released("inside")):
            with self.assertRaises(ValueError) as e:
                worker.wex_sync(min_version=v + 1)
        self.assertIn("called from inside a sync of this rank", str(e.exception))
        self.assertEqual((rank.released_why, rank._syncing), (None, {}))
        self.assertEqual(worker.wex_sync(min_version=v + 1)["version"], v + 1)

    def test_sglang_memory_saver(self):
        """SGLang's release/resume_memory_occupation (torch_memory_saver's
        pause/resume, called as SGLang does, tag=...): a request while the
        weights are released is refused (logged) before touching them, an
        attach too; resumed without a CPU backup, the ranks forget their
        version at once and the next request copies it whole again; with
        one, it stands; a resume that raises counts as lost; a pause
        interrupted while a rank waits for a sync pauses nothing."""
        models, load = self.sglang_ranks()
        saver = MemorySaver(models)
        tms = types.ModuleType("torch_memory_saver")
        tms.torch_memory_saver = saver
        sys.modules["torch_memory_saver"] = tms
        self.addCleanup(sys.modules.pop, "torch_memory_saver")
        self.addCleanup(setattr, wex.sglang, "_released", None)
        self.addCleanup(SERVER_ARGS.__dict__.pop, "enable_weights_cpu_backup", None)
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sglang-saver", min_version=v, post_load=False)
        detach = wex.sglang.request(MODEL, group="sglang-saver", detach=True)
        for k in range(2):
            self.addCleanup(load, k, detach)
            self.assertEqual(load(k, req)["changed"], 1)
        self.assertTrue(saver._wex_wrapped)

        saver.pause(tag="kv_cache")  # not the weights: served as before
        self.assertEqual(load(0, req)["changed"], 0)
        saver.resume(tag="kv_cache")
        saver.pause(tag="weights")
        v2 = self.next_version()  # a request would copy it
        req2 = wex.sglang.request(MODEL, group="sglang-saver", min_version=v2, post_load=False)
        for k in range(2):
            with self.assertLogs("wex.sglang", "ERROR") as logs:
                self.assertIsNone(load(k, req2))
            self.assertIn("released its weights' memory", logs.output[0])
            self.assertFalse(wex.sglang.status(models[k])["ok"])
            self.assertTrue(all_equal(models[k], 3))  # nothing written
        saver.resume(tag="kv_cache")  # the weights stay released
        with self.assertLogs("wex.sglang", "ERROR"):
            self.assertIsNone(load(1, req2))
        # Attaching is refused too while they are released.
        load(0, detach)
        with self.assertLogs("wex.sglang", "ERROR") as logs:
            self.assertIsNone(load(0, req2))
        self.assertIn("not attached", logs.output[0])
        self.assertNotIn(id(models[0]), wex.sglang._ranks)

        saver.resume(tag="weights")  # no CPU backup: new memory
        # Rank 1 forgot v at once: wexd no longer counts it as served.
        served = {r["rank"]: r.get("served", 0)
                  for r in wex.engine.group_status(MODEL, "sglang-saver")}
        self.assertEqual(served.get(1), 0)
        self.assertIn("without its bytes", wex.sglang._ranks[id(models[1])][0].lost)
        self.assertIn("without their bytes", wex.sglang._changed[models[0]])
        for k in range(2):
            r = load(k, req2)
            self.assertEqual((r["version"], r["changed"]), (v2, 1))
            self.assert_holds(params_of(models[k]), "sglang", k)
            self.assertEqual(load(k, req2)["changed"], 0)
        # Model 0 attached after the loss: not compared, saying why.
        self.assertIn("not checked: SGLang released the weights and resumed them without",
                      wex.sglang._ranks[id(models[0])][0].describe()["checkpoint_check"])
        self.assertEqual(len(wex.sglang.check(MODEL, "sglang-saver", v2, world_size=2)), 2)

        # --enable-weights-cpu-backup: the bytes come back; pause() with no
        # tag releases every tag, the weights included.
        SERVER_ARGS.enable_weights_cpu_backup = True
        saver.backup = True
        saver.pause()
        with self.assertLogs("wex.sglang", "ERROR"):
            self.assertIsNone(load(0, req2))
        saver.resume()
        for k in range(2):
            r = load(k, req2)
            self.assertEqual((r["version"], r["changed"]), (v2, 0))
            self.assert_holds(params_of(models[k]), "sglang", k)

        # A resume that raises counts as one that lost the bytes, backup
        # or not (what is left unmapped, libwex refuses: cuda_released):
        # the ranks forget their version, the next request copies whole.
        saver.pause(tag="weights")
        saver.fail = True
        with self.assertRaises(RuntimeError):
            saver.resume(tag="weights")
        saver.fail = False
        self.assertIsNone(wex.sglang._released)
        self.assertIn("resume that failed", wex.sglang._changed[models[0]])
        for k in range(2):
            self.assertEqual(load(k, req2)["changed"], 1)
            self.assert_holds(params_of(models[k]), "sglang", k)

        # A pause interrupted (released() raising, as Ctrl-C would) while
        # the rank told last waits for a sync of its own: nothing paused,
        # the rank told first told so, requests served as before.
        ranks = [r for r, _, _ in wex.sglang._ranks.values()]
        self.assertEqual(len(ranks), 2)
        with unittest.mock.patch.object(ranks[1]._syncs, "wait", side_effect=KeyboardInterrupt):
            ranks[1]._syncing[-1] = 1  # a sync on another thread
            try:
                with self.assertRaises(KeyboardInterrupt):
                    saver.pause(tag="weights")
            finally:
                del ranks[1]._syncing[-1]
        self.assertIsNone(wex.sglang._released)
        self.assertEqual([r.released_why for r in ranks], [None, None])
        for k in range(2):  # saver.pause not called (it writes 3s)
            self.assert_holds(params_of(models[k]), "sglang", k)
            self.assertEqual(load(k, req2)["changed"], 0)

    def test_sglang_memory_saver_own_instance(self):
        """SGLang before its memory tags (mid 2025) paused and resumed a
        TorchMemorySaver() of its own (pause() with no tag), not
        torch_memory_saver's process-wide instance, which a newer
        torch_memory_saver also has: those are seen too (a request while
        released is refused; resumed without a backup, the ranks forget
        their version and the next request copies it whole), instead of
        copying nothing into the weights' new memory."""
        models, load = self.sglang_ranks()
        tms = types.ModuleType("torch_memory_saver")
        tms.TorchMemorySaver = MemorySaver
        tms.torch_memory_saver = MemorySaver([])  # not the one SGLang pauses
        own = MemorySaver(models)                 # SGLang's _primary_memory_saver
        sys.modules["torch_memory_saver"] = tms
        self.addCleanup(sys.modules.pop, "torch_memory_saver")
        self.addCleanup(setattr, wex.sglang, "_released", None)
        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sg-own-saver", min_version=v, post_load=False)
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, group="sg-own-saver",
                                                        detach=True))
            self.assertEqual(load(k, req)["changed"], 1)
        own.pause()
        for k in range(2):
            with self.assertLogs("wex.sglang", "ERROR") as logs:
                self.assertIsNone(load(k, req))
            self.assertIn("released its weights' memory", logs.output[0])
            self.assertTrue(all_equal(models[k], 3))  # nothing written
        own.resume()
        with self.assertRaises(RuntimeError):
            wex.sglang.check(MODEL, "sg-own-saver", v)
        for k in range(2):
            r = load(k, req)
            self.assertEqual((r["version"], r["changed"]), (v, 1))
            self.assert_holds(params_of(models[k]), "sglang", k)
        self.assertEqual(len(wex.sglang.check(MODEL, "sg-own-saver", v, world_size=2)), 2)

    def test_fork_during_sync(self):
        """A child forked while a thread of the parent waits in a sync of an
        EngineRank: in the child, sync() refuses (WexError ECHILD) and
        close() returns, freeing its copy (was: close() waited for ever
        for the parent's sync, which no thread of the child runs)."""
        import signal
        _, r, v, out, t = self.waiting_sync("forking")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(20)  # (a hang kills the child: SIGALRM)
                try:
                    r.sync(min_version=v)
                    code = 2
                except wex.WexError as e:
                    code = 0 if e.code == errno.ECHILD else 3
                if code == 0:
                    r.close()
                    code = 0 if r.client is None else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        r.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertEqual(os.waitstatus_to_exitcode(status), 0,
                         "in the forked child (1: raised, 2: sync ran, 3: not ECHILD, "
                         "4: not closed, -14: close() hung)")
        self.assertIsInstance(out["sync"], wex.WexError, out["sync"])
        self.assertEqual(out["sync"].code, errno.ECANCELED)

    def test_trainer_rank(self):
        """wex.trainer.TrainerRank: Megatron tp=2 ranks registered through
        their layout, versions published by write(), read by two
        wex.engine.EngineRank engines in vLLM's layout."""
        import ctypes
        import wex.trainer
        d = self.tmp.name
        cfg = os.path.join(d, "config.json")
        model = "trainer-hook"
        trainers = []
        for k in range(2):
            files = glue.read_safetensors(os.path.join(d, "megatron", "rank-%d.safetensors" % k))
            c = wex.Client(wex.ROLE_PRODUCER, model, rank=k, world_size=2)
            self.addCleanup(c.close)
            size = sum(len(b) for _, _, b in files.values())
            seg, base = c.segment_alloc(wex.SEG_HOST, size)
            named, at = {}, base
            for name, (dt, shape, b) in files.items():
                ctypes.memmove(at, b, len(b))
                named[name] = torch_util.from_ptr(at, shape, torch_util.torch_dtype(dt),
                                                  device="cpu")
                at += len(b)
            m = module_of(named, prefix="module.")
            m.extra = torch.nn.Parameter(torch.zeros(3))  # not in the layout
            with self.assertRaises(ValueError) as e:
                wex.trainer.TrainerRank(model, m.named_parameters(), rank=k, world_size=2,
                                        layout="megatron:tp=2", config=cfg, client=c,
                                        segments=[(seg, base, size)], strip_prefix="module.")
            self.assertIn("extra", str(e.exception))
            with self.assertRaises(ValueError) as e:
                wex.trainer.TrainerRank(model, m.named_parameters(), rank=k, world_size=4,
                                        layout="megatron:tp=2", config=cfg, client=c)
            self.assertIn("has 2 ranks, but this trainer runs 4", str(e.exception))
            # Rank 0 given the module (its named_parameters, enumerated
            # again at each write; was: called, running its forward), rank
            # 1 the pairs.
            t = wex.trainer.TrainerRank(model, m if k == 0 else
                                        m.named_parameters(), rank=k, world_size=2,
                                        layout="megatron:tp=2", config=cfg, client=c,
                                        segments=[(seg, base, size)], strip_prefix="module.",
                                        ignore=["extra"])
            self.assertEqual(t.describe()["ignored"], ["extra"])
            trainers.append((t, m))
        for t, _ in trainers:
            t.publish(1)
        engines = []
        for k in range(2):
            p = self.engine_params("vllm", k)
            e = wex.engine.EngineRank(model, p.items(), rank=k, world_size=2,
                                      layout="vllm:tp=2", config=cfg, group="g",
                                      timeout_ms=10000)
            self.addCleanup(e.close)
            self.assertEqual(e.sync(min_version=1)["version"], 1)
            self.assert_holds(p, "vllm", k)
            engines.append((e, p))

        # A step that changes the weights in place, then published.
        for t, m in trainers:
            with t.write(2):
                self.assertEqual(t.describe()["writing"], 2)
                with torch.no_grad():
                    for name, p in m.named_parameters():
                        if name != "extra":
                            p.fill_(1.5)
            self.assertEqual(t.describe()["version"], 2)
        for e, p in engines:
            self.assertEqual(e.sync(min_version=2)["version"], 2)
            for name, x in p.items():
                self.assertTrue(bool((x == 1.5).all()), name)
        with self.assertRaises(ValueError):
            with trainers[0][0].write(2):
                pass

        # A step that fails: nothing published, engines keep version 2.
        for t, _ in trainers:
            with self.assertRaises(RuntimeError):
                with t.write(3):
                    raise RuntimeError("the optimizer step failed")
            self.assertEqual(t.describe()["version"], 2)
            self.assertEqual(t.describe()["writing"], 3)   # as wexd sees it
        with self.assertRaises(wex.WexError):
            engines[0][0].sync(min_version=3, timeout_ms=300)
        # wexd refuses another version while the group writes 3: the step
        # is retried as version 3.
        with self.assertRaises(wex.WexError) as e:
            with trainers[0][0].write(4):
                pass
        self.assertIn("write the same version", str(e.exception))
        for t, m in trainers:
            with t.write(3):
                with torch.no_grad():
                    for name, p in m.named_parameters():
                        if name != "extra":
                            p.fill_(-2.0)
        for t, _ in trainers:
            self.assertEqual((t.describe()["version"], t.describe()["writing"]), (3, None))
        for e, p in engines:
            self.assertEqual(e.sync(min_version=3)["version"], 3)
            for name, x in p.items():
                self.assertTrue(bool((x == -2.0).all()), name)
        # A parameter moved to new memory (FSDP2's first forward from
        # PyTorch 2.5 until its PR #163130, an assignment to .data):
        # refused by name on entry, nothing begun; inside the block,
        # nothing published.
        t0, m0 = trainers[0]
        name, p0 = next((n, p) for n, p in m0.named_parameters() if n != "extra")
        name = name[len("module."):]
        old = p0.data
        p0.data = old.clone()
        self.assertEqual(t0.moved(), [name + " (re-allocated)"])
        with self.assertRaises(ValueError) as e:
            with t0.write(4):
                self.fail("the block ran")
        self.assertIn("not where they were registered (engines read the memory registered): "
                      "%s (re-allocated); nothing begun" % name, str(e.exception))
        p0.data = old
        # Given the callable: a parameter replaced by a Parameter in new
        # memory, and one added, are refused; a new Parameter over the
        # same memory is not.  Given the pairs, the replacement is not
        # seen (the registered object keeps its memory); .data is.
        owner, leaf = m0.get_submodule("module." + name.rsplit(".", 1)[0]), name.rsplit(".", 1)[1]
        setattr(owner, leaf, torch.nn.Parameter(old.clone(), requires_grad=False))
        self.assertEqual(t0.moved(), [name + " (replaced by a Parameter in new memory)"])
        with self.assertRaises(ValueError) as e:
            with t0.write(4):
                self.fail("the block ran")
        self.assertIn("%s (replaced by a Parameter in new memory); nothing begun" % name,
                      str(e.exception))
        setattr(owner, leaf, torch.nn.Parameter(old, requires_grad=False))
        self.assertEqual(t0.moved(), [])
        setattr(owner, leaf, p0)
        m0.module.added = torch.nn.Parameter(torch.zeros(2))
        self.assertEqual(t0.moved(), ["added (added)"])
        del m0.module.added
        t1, m1 = trainers[1]
        name1, p1 = next((n, p) for n, p in m1.named_parameters() if n != "extra")
        name1 = name1[len("module."):]
        owner1 = m1.get_submodule("module." + name1.rsplit(".", 1)[0])
        setattr(owner1, name1.rsplit(".", 1)[1],
                torch.nn.Parameter(p1.data.clone(), requires_grad=False))
        self.assertEqual(t1.moved(), [])
        setattr(owner1, name1.rsplit(".", 1)[1], p1)
        old1 = p1.data
        p1.data = old1.clone()
        self.assertEqual(t1.moved(), [name1 + " (re-allocated)"])
        p1.data = old1
        self.assertEqual((t0.describe()["version"], t0.describe()["writing"]), (3, None))
        p0.data = old
        with self.assertRaises(ValueError) as e:
            with t0.write(4):
                p0.data = old.clone()
        self.assertIn("v4 not published", str(e.exception))
        self.assertEqual((t0.describe()["version"], t0.describe()["writing"]), (3, 4))
        p0.data = old
        for t, _ in trainers:
            t.publish(4)
        for e, p in engines:
            self.assertEqual(e.sync(min_version=4)["version"], 4)
        for t, _ in trainers:
            t.close()
            with self.assertRaises(ValueError):
                with t.write(5):
                    pass
            # The layout it opened from its spec string went with it.
            with self.assertRaises(wex.WexError) as e:
                t.layout.rank(0)
            self.assertIn("layout megatron:tp=2 is closed", str(e.exception))


class TrainerMovedDTensor(unittest.TestCase):
    """TrainerRank.moved() with FSDP2 DTensor parameters, against stand-ins
    (this PyTorch may have no DTensor): the shard's memory is read from
    _local_tensor (to_local() is an autograd call per parameter); the
    unsharded Parameter FSDP2 shows between its all-gather and its
    reshard (a DTensor sharded otherwise with FSDP2 over TP, a
    post-forward shard) is not a replacement (the shard registered is
    checked); a DTensor sharded alike in new memory is, and so is a
    shard swapped."""

    def test_dtensor(self):
        import wex.trainer

        class DT:
            placements, device_mesh = ("Shard(0)",), "mesh"

            def __init__(self, local):
                self._local_tensor = local

            def to_local(self):
                raise AssertionError("to_local() called")

        a, b = torch.zeros(4), torch.zeros(4)
        t = DT(a)
        # (What TrainerRank registered of it: _entry, its shard's address,
        # shape, strides and dtype.)
        where = [("w", t, wex.trainer._entry(t))]
        t0 = object.__new__(wex.trainer.TrainerRank)
        t0._where, t0._select = where, (None, ())
        now = {"w": t}
        t0._resolve = lambda: now.items()
        self.assertEqual(t0.moved(), [])
        now["w"] = torch.nn.Parameter(torch.zeros(8))   # FSDP2 unsharded
        self.assertEqual(t0.moved(), [])
        # FSDP2 over TP: the unsharded Parameter is a DTensor sharded
        # otherwise; reshard_after_forward=<int>: the post-forward shard
        # (another mesh).
        tp_view = DT(torch.zeros(8))
        tp_view.placements = ("Shard(1)",)
        now["w"] = tp_view
        self.assertEqual(t0.moved(), [])
        post = DT(torch.zeros(4))
        post.device_mesh = "post-forward mesh"
        now["w"] = post
        self.assertEqual(t0.moved(), [])
        now["w"] = DT(b)                                  # sharded alike
        self.assertEqual(t0.moved(), ["w (replaced by a Parameter in new memory)"])
        now["w"] = t
        t._local_tensor = b                              # reset_sharded_param
        self.assertEqual(t0.moved(), ["w (re-allocated)"])


class TrainerRetry(unittest.TestCase):
    """TrainerRank.write(v) again after a publish that raised (Ctrl-C) but
    that wexd carried out: libwex's begin_write of v says EALREADY (test
    publish_answer shows that it does), the block does not run, and the
    rank counts v published, so write(v + 1) goes on.  Against a stand-in
    for the client that answers as libwex does."""

    def test_published_already(self):
        import wex.trainer
        calls = []

        class Client:
            def begin_write(self, v, timeout_ms):
                calls.append(("begin_write", v))
                if ("publish", v) in calls:
                    raise wex.WexError(errno.EALREADY, "begin_write v%d: v%d is published "
                                       "already" % (v, v))

            def publish(self, v):
                calls.append(("publish", v))
                if calls.count(("publish", v)) == 1 and v == 2:
                    raise KeyboardInterrupt

        t = object.__new__(wex.trainer.TrainerRank)
        t.client, t.version, t._writing, t._where, t._resolve = Client(), 1, None, [], None
        with self.assertRaises(KeyboardInterrupt):
            with t.write(2):
                pass
        self.assertEqual((t.version, t._writing), (1, 2))
        with self.assertRaises(wex.WexError) as e:
            with t.write(2):
                self.fail("the block ran for a version published already")
        self.assertEqual(e.exception.code, errno.EALREADY)
        self.assertEqual((t.version, t._writing), (2, None))
        with t.write(3):
            pass
        self.assertEqual(t.version, 3)
        self.assertEqual(calls, [("begin_write", 2), ("publish", 2), ("begin_write", 2),
                                 ("begin_write", 3), ("publish", 3)])


def producer():
    glue.producer()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer()
    else:
        unittest.main()
