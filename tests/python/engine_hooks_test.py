#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""engine_hooks_test - the hooks that run inside vLLM's and SGLang's worker
processes (wex.vllm.WorkerExtension, wex.sglang.load) and wex.engine,
through a real wexd, CPU PyTorch on host segments.

The trainer is layout_glue_test's producer child: Megatron tp=2 ranks of a
tiny Qwen2 registered with register_module(layout=megatron:tp=2).  The
engines are stand-ins for the workers vLLM and SGLang build: objects with
the attributes the hooks read (vLLM: model_runner.model, device,
vllm_config.model_config.model; SGLang: the model passed to the loader),
whose models are torch modules holding the engines' own parameters under
their names (qkv_proj, gate_up_proj, padded vocabulary) as `wexctl
convert` writes them.  The parallel sizes the hooks read from
vllm.distributed / sglang.srt.distributed are given to them (neither
engine is installed here).  Checked:
  - vLLM: collective_rpc's wex_attach derives the layout (vllm:tp=2) and
    the rank from the parallel sizes and the config from the model
    directory; wex_sync copies in place, verified, byte for byte what
    wexctl convert writes for each rank; a later version overwrites
    weights the engine changed; wrapper prefixes stripped, ignored
    parameters left alone and listed;
  - SGLang: the loader's request survives SGLang's serialization, attaches
    on the first call, syncs on each, runs post_load_weights when asked,
    detaches, and holds what wexctl convert writes for sglang:tp=2;
  - refused with a message that says what to do: a sync before attach, a
    second attach, a parameter the layout lacks, a model directory
    without config.json, a layout whose world is not the engine's, SGLang
    dp replicas without dp-attention, a request changing the group, a
    loader call without a request, post_load on a model without
    post_load_weights; a version that never comes times out with
    wex.WexError;
  - wex.trainer.TrainerRank: Megatron tp=2 ranks registered through their
    layout (a wrapper prefix stripped, a parameter ignored) publish around
    a step that changes them in place, engines (wex.engine.EngineRank,
    vllm:tp=2) hold the new bytes; a step that raises publishes nothing,
    another version is refused while it is open, and its retry publishes.
Needs Debian's python3-torch (exit 77 with the reason without it).
Environment: WEX_LIB, WEXD_BIN, WEXCTL_BIN, PYTHONPATH with adapters/python.
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile
import types
import unittest

try:
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("engine_hooks_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
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


class VllmWorker(wex.vllm.WorkerExtension):
    """What wex.vllm.WorkerExtension reads of vLLM's Worker."""

    def __init__(self, model_dir, par, module, expert_parallel=False):
        self.model_runner = types.SimpleNamespace(model=module)
        self.device = torch.device("cpu")
        self.vllm_config = types.SimpleNamespace(
            model_config=types.SimpleNamespace(model=model_dir),
            parallel_config=types.SimpleNamespace(enable_expert_parallel=expert_parallel))
        self._par = par

    def _wex_parallel(self):
        return self._par


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
            workers.append(VllmWorker(d, vpar(k), m))
        # The parameter the layout lacks is refused by name unless ignored.
        with self.assertRaises(ValueError) as e:
            workers[0].wex_attach(model=MODEL, group="vllm", strip_prefix="module.")
        self.assertIn("model.rotary_emb.inv_freq", str(e.exception))
        self.assertIsNone(workers[0].wex_status())
        with self.assertRaises(ValueError) as e:
            workers[0].wex_sync(min_version=1)
        self.assertIn("wex_attach first", str(e.exception))
        for k, w in enumerate(workers):
            info = w.wex_attach(model=MODEL, group="vllm", strip_prefix="module.",
                                ignore=["model.rotary_emb.*"])
            self.addCleanup(w.wex_detach)
            self.assertEqual((info["rank"], info["world_size"], info["layout"]), (k, 2, "vllm:tp=2"))
            self.assertEqual(info["ignored"], ["model.rotary_emb.inv_freq"])
            self.assertEqual(info["tensors"], len(self.want("vllm", k)))
        with self.assertRaises(ValueError) as e:
            workers[0].wex_attach(model=MODEL, group="vllm")
        self.assertIn("already attached", str(e.exception))

        v = self.next_version()
        for k, w in enumerate(workers):
            r = w.wex_sync(min_version=v, verify=True)
            self.assertEqual((r["version"], r["rank"], r["group"]), (v, k, "vllm"))
            params = params_of(modules[k], "module.")
            ignored = params.pop("model.rotary_emb.inv_freq")
            self.assertTrue(torch.equal(ignored, torch.ones(4)))
            self.assertEqual(r["verified"], sum(t.numel() * 2 for t in params.values()))
            self.assertGreater(r["bytes"], 0)
            self.assertEqual(w.wex_status()["version"], v)
            self.assert_holds(params, "vllm", k)

        # The engine's weights changed under it (or a failed rollout scribbled
        # on them): the next version is copied whole into the same tensors.
        qkv = modules[1].module.model.layers._modules["0"].self_attn.qkv_proj.weight
        ptr = qkv.data_ptr()
        with torch.no_grad():
            for p in modules[1].parameters():
                p.zero_()
        v = self.next_version()
        for w in workers:
            self.assertEqual(w.wex_sync(min_version=v)["version"], v)
        self.assertEqual(qkv.data_ptr(), ptr)
        params = params_of(modules[1], "module.")
        params.pop("model.rotary_emb.inv_freq")
        self.assert_holds(params, "vllm", 1)

        # A version that never comes: the wait ends with an error.
        with self.assertRaises(wex.WexError):
            workers[0].wex_sync(min_version=v + 100, timeout_ms=300)

    def test_vllm_refusals(self):
        d = self.tmp.name
        m = module_of(self.engine_params("vllm", 0))
        w = VllmWorker(os.path.join(d, "noconfig"), vpar(0), m)
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="cfg")
        self.assertIn("config=", str(e.exception))
        # config= given: attaches.
        info = w.wex_attach(model=MODEL, group="cfg", config=os.path.join(d, "config.json"))
        self.assertEqual(info["layout"], "vllm:tp=2")
        w.wex_detach()
        self.assertIsNone(w.wex_status())
        # The layout's world is not the engine's.
        w = VllmWorker(d, vpar(0, tp=4), m)
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="world", layout="vllm:tp=2")
        self.assertIn("has 2 ranks, but this engine runs 4", str(e.exception))
        # tp=4 of 2 KV heads and 4 heads exists, but these parameters are tp=2's.
        with self.assertRaises(ValueError) as e:
            w.wex_attach(model=MODEL, group="world")
        self.assertIn("shape", str(e.exception))

    def test_default_specs(self):
        self.assertEqual(wex.vllm.default_spec(vpar(0, tp=4)), "vllm:tp=4")
        self.assertEqual(wex.vllm.default_spec(vpar(0, tp=2, pp=2, dp=2), expert_parallel=True),
                         "vllm:tp=2,pp=2,dp=2,ep=4")
        # vLLM's layout rank orders dp inside pp.
        self.assertEqual(wex.vllm.layout_rank(vpar(1, tp=2, pp=2, pp_rank=1, dp=2, dp_rank=1)),
                         1 + 2 * (1 + 2 * 1))
        sp = {"tp": 8, "tp_rank": 0, "pp": 1, "pp_rank": 0, "dp": 4, "dp_attention": True,
              "ep": 8}
        self.assertEqual(wex.sglang.default_spec(sp), "sglang:tp=8,dp=4,dp_attention=1,ep=8")
        sp.update(dp_attention=False)
        with self.assertRaises(ValueError) as e:
            wex.sglang.default_spec(sp)
        self.assertIn("enable-dp-attention", str(e.exception))
        # select_parameters: two names stripped onto one are refused.
        with self.assertRaises(ValueError):
            wex.engine.select_parameters([("a.w", 1), ("b.w", 2)], strip_prefix=("a.", "b."))

    def test_sglang_loader(self):
        d = self.tmp.name
        real = wex.sglang.parallel_info
        rank = {"k": 0}

        def par():
            return {"tp": 2, "tp_rank": rank["k"], "pp": 1, "pp_rank": 0, "dp": 1,
                    "dp_attention": False, "ep": 1, "model_path": d}

        wex.sglang.parallel_info = par
        self.addCleanup(setattr, wex.sglang, "parallel_info", real)
        models = []
        for k in range(2):
            m = module_of(self.engine_params("sglang", k))
            m.post_loads = 0

            def post_load_weights(m=m):
                m.post_loads += 1
            m.post_load_weights = post_load_weights
            models.append(m)

        def load(k, req):
            rank["k"] = k
            return wex.sglang.load(models[k], req)

        v = self.next_version()
        req = wex.sglang.request(MODEL, group="sglang", min_version=v, verify=True,
                                 post_load=True)
        # What SGLang's MultiprocessingSerializer does to it on the way.
        from torch.multiprocessing.reductions import ForkingPickler
        req = pickle.loads(ForkingPickler.dumps(req))
        for k in range(2):
            self.addCleanup(load, k, wex.sglang.request(MODEL, detach=True))
            r = load(k, req)
            self.assertEqual((r["version"], r["rank"], r["group"]), (v, k, "sglang"))
            self.assertEqual(models[k].post_loads, 1)
            self.assertGreater(r["verified"], 0)
            self.assert_holds(params_of(models[k]), "sglang", k)

        # Same arguments again: syncs, no second attach.
        v = self.next_version()
        with torch.no_grad():
            for p in models[0].parameters():
                p.fill_(1)
        r = load(0, wex.sglang.request(MODEL, group="sglang", min_version=v))
        self.assertEqual(r["version"], v)
        self.assertEqual(models[0].post_loads, 1)
        self.assert_holds(params_of(models[0]), "sglang", 0)
        # Changing what was attached is refused; detach, then it attaches again.
        with self.assertRaises(ValueError) as e:
            load(0, wex.sglang.request(MODEL, group="other", min_version=v))
        self.assertIn("group", str(e.exception))
        self.assertIsNone(load(0, wex.sglang.request(MODEL, detach=True)))
        r = load(0, wex.sglang.request(MODEL, group="other", min_version=v))
        self.assertEqual((r["group"], r["version"]), ("other", v))
        load(0, wex.sglang.request(MODEL, detach=True))

        # Not a request, or a request this version of the loader does not know.
        for bad in ([], [("model.embed_tokens.weight", torch.zeros(1))],
                    [("wex:{not json", torch.zeros(1))],
                    [('wex:{"model": "m", "colour": 1}', torch.zeros(1))]):
            with self.assertRaises(ValueError):
                load(0, bad)
        # post_load on a model without post_load_weights.
        plain = module_of(self.engine_params("sglang", 0))
        self.addCleanup(wex.sglang.load, plain, wex.sglang.request(MODEL, detach=True))
        rank["k"] = 0
        with self.assertRaises(ValueError) as e:
            wex.sglang.load(plain, wex.sglang.request(MODEL, group="plain", min_version=v,
                                                      post_load=True))
        self.assertIn("post_load_weights", str(e.exception))
        with self.assertRaises(ValueError):
            wex.sglang.request("")

    def test_sglang_refusals(self):
        d = self.tmp.name
        real = wex.sglang.parallel_info
        self.addCleanup(setattr, wex.sglang, "parallel_info", real)
        m = module_of(self.engine_params("sglang", 0))
        wex.sglang.parallel_info = lambda: {"tp": 2, "tp_rank": 0, "pp": 1, "pp_rank": 0,
                                            "dp": 2, "dp_attention": False, "ep": 1,
                                            "model_path": d}
        with self.assertRaises(ValueError) as e:
            wex.sglang.load(m, wex.sglang.request(MODEL, group="dp"))
        self.assertIn("one engine per replica", str(e.exception))
        wex.sglang.parallel_info = lambda: {"tp": 2, "tp_rank": 0, "pp": 1, "pp_rank": 0,
                                            "dp": 1, "dp_attention": False, "ep": 1,
                                            "model_path": os.path.join(d, "noconfig")}
        with self.assertRaises(ValueError) as e:
            wex.sglang.load(m, wex.sglang.request(MODEL, group="cfg"))
        self.assertIn("config=", str(e.exception))
        # Nothing stayed attached after the refusals.
        self.assertEqual(wex.sglang._ranks, {})


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
            t = wex.trainer.TrainerRank(model, m.named_parameters(), rank=k, world_size=2,
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
        for e, p in engines:
            self.assertEqual(e.sync(min_version=3)["version"], 3)
            for name, x in p.items():
                self.assertTrue(bool((x == -2.0).all()), name)
        for t, _ in trainers:
            t.close()
            with self.assertRaises(ValueError):
                with t.write(4):
                    pass


def producer():
    glue.producer()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer()
    else:
        unittest.main()
