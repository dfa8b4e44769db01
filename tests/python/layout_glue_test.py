#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""layout_glue_test - trainer and engine parameters in their own layouts,
attached and registered through wex.Layout (wex_layout_*: the adaptation
layer in libwex's public API) and wex.torch_util, through a real wexd, CPU
PyTorch on host segments.

A tiny Qwen2 (2 layers, 4 heads, 2 KV heads, QKV biases, untied lm_head)
gets random bf16 weights, written as a Hugging Face checkpoint; the real
`wexctl convert` writes them as Megatron tp=2 ranks (QKV interleaved per
query group, gate/up fused) and as vLLM tp=2 ranks (qkv_proj, gate_up_proj
fused, vocab-parallel embedding) - the reference, checked against Python
readers and round trips elsewhere (planner_convert*).  Then:
  - a producer child (2 clients, Megatron ranks 0 and 1, each its own host
    segment) fills its physical tensors from the Megatron files and
    registers them with register_module(..., layout=megatron:tp=2);
  - an engine of 2 ranks allocates its vLLM parameters (layout_tensors),
    attaches them with attach_module(..., layout=vllm:tp=2), copy-syncs
    (verified) and holds, byte for byte, what wexctl convert wrote for its
    rank; an engine of 1 rank with the hf layout holds the checkpoint;
  - refused, naming the tensor: a parameter of the wrong shape or dtype, a
    missing one, one the layout does not have, a non-contiguous one, an
    FSDP2 DTensor (its local shard goes with an fsdp layout), and
    layouts that cannot exist (tp=3 of 4 heads) or a rank past the world;
  - four threads asking one Layout for ranks 0 and 1 at once get the
    same tables as one thread (its calls take turns).
  - wex.trainer.TrainerRank with FSDP2 DTensors (stand-ins) and the fsdp
    layout: registered as their local shards, a shard swapped into new
    memory refused by write() by name; pairs of to_local() results refused;
    DTensors whose rows are not the layout rank's (rank= of another FSDP
    rank, _StridedShard) refused by name;
  - TrainerRank given Megatron's list of model chunks (vpp=2: model{v}.
    names after strip_prefix; one chunk: names kept; ignore= patterns with
    or without the wrappers' prefix, strip_prefix as a generator).
Needs Debian's python3-torch (exit 77 with the reason without it).
Environment: WEX_LIB, WEXD_BIN, WEXCTL_BIN, PYTHONPATH with adapters/python.
"""
import ctypes
import errno
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

try:
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("layout_glue_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
from wex import torch_util
from wexd_harness import WexdProducerCase
from fsdp_glue_test import Mesh, Shard, StandInDTensor, _StridedShard

MODEL = "tinyqwen"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
    "rope_theta": 1000000.0,
}


def to_bytes(t):
    return t.contiguous().view(torch.int16).numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: [(name, dtype name, shape, bytes)]."""
    header, off = {}, 0
    for name, dt, shape, b in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, b in tensors:
            f.write(b)


def read_safetensors(path):
    """{name: (dtype name, shape, bytes)}."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], tuple(v["shape"]), data[base + v["data_offsets"][0]:
                                                    base + v["data_offsets"][1]])
            for k, v in header.items()}


def paths():
    d = os.environ["WEX_LAYOUT_TEST_DIR"]
    return d, os.path.join(d, "config.json")


def producer():
    """Megatron tp=2 ranks 0 and 1, clients of this process, each filling
    its host segment from the converted files and registering it through
    the megatron layout; publishes v when told v."""
    d, cfg = paths()
    layout = wex.Layout(cfg, "megatron:tp=2")
    clients = []
    for k in range(layout.world):
        files = read_safetensors(os.path.join(d, "megatron", "rank-%d.safetensors" % k))
        size = sum(len(b) + 64 for _, _, b in files.values())
        c = wex.Client(wex.ROLE_PRODUCER, MODEL, rank=k, world_size=layout.world)
        seg, base = c.segment_alloc(wex.SEG_HOST, size)
        named, at = [], base
        for name, (dt, shape, b) in files.items():
            t = torch_util.from_ptr(at, shape, torch_util.torch_dtype(dt), device="cpu")
            ctypes.memmove(at, b, len(b))
            named.append((name, t))
            at += len(b) + 64
        torch_util.register_module(c, named, segments=[(seg, base, size)], layout=layout, rank=k)
        clients.append(c)
    for line in sys.stdin:
        v = int(line)
        for c in clients:
            c.begin_write(v, 20000)
        for c in clients:
            c.publish(v)
        print("published %d" % v, flush=True)
    for c in clients:
        c.close()


class MegatronChunk(torch.nn.Module):
    """One of Megatron's model chunks as get_model returns them: DDP around
    Float16Module around a GPTModel chunk, its parameters named
    module.module.*; a router's expert_bias is a buffer (and so is its
    local_tokens_per_expert, which the layout does not have)."""

    def __init__(self, named):
        super().__init__()
        self.named = named

    def named_parameters(self):
        return iter(("module.module." + n, t) for n, t in self.named
                    if not n.endswith("expert_bias"))

    def named_buffers(self):
        return iter([("module.module." + n, t) for n, t in self.named
                     if n.endswith("expert_bias")] +
                    [("module.module.decoder.layers.1.mlp.router."
                      "local_tokens_per_expert", torch.zeros(4))])


class TableClient:
    """A producer client that keeps the table TrainerRank registers."""

    def register_tensors(self, table):
        self.table = table


def chunk_tensors(lay, chunks, buf):
    """Layout rank 0's tensors over buf, 64 bytes apart, as `chunks` lists
    of (name, tensor) under each chunk's own names (model{v}. taken off
    where there are several)."""
    named = [[] for _ in range(chunks)]
    at = 0
    for name, dt, shape, _ in lay.rank(0):
        t = torch.zeros(shape, dtype=torch_util.torch_dtype(dt))
        v, local = (int(name[5]), name[7:]) if chunks > 1 else (0, name)
        t = buf[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        at += t.numel() * t.element_size() + 64
        named[v].append((local, t))
    return named


class LayoutGlue(WexdProducerCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="wex-layout-")
        d = cls.tmp.name
        os.environ["WEX_LAYOUT_TEST_DIR"] = d
        cfg = os.path.join(d, "config.json")
        with open(cfg, "w") as f:
            json.dump(CONFIG, f)
        hf = wex.Layout(cfg, "hf")
        g = torch.Generator().manual_seed(7)
        cls.canonical = {}
        for name, dt, shape, _ in hf.rank(0):
            cls.canonical[name] = to_bytes(torch.randn(shape, generator=g).to(torch.bfloat16))
        os.mkdir(os.path.join(d, "hf"))
        write_safetensors(os.path.join(d, "hf", "model.safetensors"),
                          [(n, dt, s, cls.canonical[n]) for n, dt, s, _ in hf.rank(0)])
        for spec, out in (("megatron:tp=2", "megatron"), ("vllm:tp=2", "vllm")):
            r = subprocess.run([os.environ["WEXCTL_BIN"], "convert", "--config", cfg, "--from",
                                "hf", "--to", spec, os.path.join(d, "hf"),
                                os.path.join(d, out)], capture_output=True, text=True)
            assert r.returncode == 0, "wexctl convert --to %s: %s" % (spec, r.stderr)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.tmp.cleanup()

    def test_engine_layouts(self):
        d, cfg = paths()
        self.publish(1)
        vllm = wex.Layout(cfg, "vllm:tp=2")
        self.assertEqual(vllm.world, 2)
        engines = []
        for k in range(vllm.world):
            c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="vllm", rank=k, world_size=2,
                           timeout_ms=10000)
            self.addCleanup(c.close)
            params = torch_util.layout_tensors(vllm, k)
            self.assertIn("model.layers.0.self_attn.qkv_proj.weight", params)
            torch_util.attach_module(c, params.items(), layout=vllm, rank=k)
            engines.append((c, params))
        for k, (c, params) in enumerate(engines):
            r = c.sync(wex.SYNC_COPY, min_version=1, verify=True)
            self.assertEqual(r.version, 1)
            self.assertEqual(r.verified, sum(t.numel() * 2 for t in params.values()))
            want = read_safetensors(os.path.join(d, "vllm", "rank-%d.safetensors" % k))
            self.assertEqual(sorted(want), sorted(params))
            for name, t in params.items():
                self.assertEqual(to_bytes(t), want[name][2], "vllm rank %d: %s" % (k, name))

        # The canonical layout: the checkpoint itself.
        hf = wex.Layout(cfg, "hf")
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="hf", timeout_ms=10000)
        self.addCleanup(c.close)
        params = torch_util.layout_tensors(hf, 0)
        torch_util.attach_module(c, params.items(), layout=hf, rank=0)
        c.sync(wex.SYNC_COPY, min_version=1)
        for name, t in params.items():
            self.assertEqual(to_bytes(t), self.canonical[name], name)

    def test_refusals(self):
        _, cfg = paths()
        vllm = wex.Layout(cfg, "vllm:tp=2")
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="bad", timeout_ms=10000)
        self.addCleanup(c.close)
        qkv = "model.layers.0.self_attn.qkv_proj.weight"

        def attach(change):
            params = torch_util.layout_tensors(vllm, 0)
            change(params)
            with self.assertRaises(ValueError) as e:
                torch_util.attach_module(c, params.items(), layout=vllm, rank=0)
            return str(e.exception)

        msg = attach(lambda p: p.__setitem__(qkv, torch.zeros(3, 3, dtype=torch.bfloat16)))
        self.assertIn(qkv, msg)
        self.assertIn("shape", msg)
        msg = attach(lambda p: p.__setitem__(qkv, p[qkv].float()))
        self.assertIn(qkv, msg)
        self.assertIn("dtype", msg)
        msg = attach(lambda p: p.pop(qkv))
        self.assertIn("missing", msg)
        self.assertIn(qkv, msg)
        msg = attach(lambda p: p.__setitem__("model.extra.weight", torch.zeros(2)))
        self.assertIn("model.extra.weight", msg)
        msg = attach(lambda p: p.__setitem__(qkv, p[qkv].t().contiguous().t()))
        self.assertIn("contiguous", msg)
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(cfg, "vllm:tp=3")
        self.assertEqual(e.exception.code, wex.ELAYOUT)
        self.assertIn("tp=3", str(e.exception))
        with self.assertRaises(wex.WexError) as e:
            vllm.rank(2)
        self.assertIn("2 ranks", str(e.exception))
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(os.path.join(cfg + ".missing"), "hf")
        with self.assertRaises(ValueError):
            torch_util.attach_module(c, torch_util.layout_tensors(vllm, 0).items(),
                                     layout=vllm)  # no rank

        class StandInDTensor:
            # What the glue reads of an FSDP2 DTensor (torch 1.13 has none).
            shape = (128, 64)
            placements = ()
            device_mesh = None

            def detach(self):
                return self

            def to_local(self):
                return torch.zeros(64, 64, dtype=torch.bfloat16)

        with self.assertRaises(ValueError) as e:
            torch_util.register_module(None, [("model.embed_tokens.weight", StandInDTensor())],
                                       segments=[], layout=wex.Layout(cfg, "hf"), rank=0)
        self.assertIn("DTensor", str(e.exception))

    def test_trainer_fsdp_shards(self):
        """wex.trainer.TrainerRank with FSDP2 parameters and an fsdp layout:
        the DTensors given as pairs register as their local shards, and a
        shard FSDP2 swaps into new memory (lazy_init, reshard after a
        state-dict load, to()) is refused by write(), naming it, while the
        rank writes on once it is back; pairs of to_local() results (a
        view of the shard's memory of that moment: a swap would go unseen,
        engines reading the old memory) are refused, naming them."""
        import wex.trainer
        _, cfg = paths()
        layout = wex.Layout(cfg, "fsdp:fsdp=1")
        c = wex.Client(wex.ROLE_PRODUCER, "tinyqwen-fsdp", rank=0, world_size=1,
                       timeout_ms=10000)
        self.addCleanup(c.close)
        phys = layout.rank(0)
        size = sum(torch_util._storage_bytes(torch.zeros(s, dtype=torch_util.torch_dtype(dt)))
                   + 64 for _, dt, s, _ in phys)
        seg, base = c.segment_alloc(wex.SEG_HOST, size)
        locals_, at = {}, base
        for name, dt, shape, _ in phys:
            t = torch_util.from_ptr(at, shape, torch_util.torch_dtype(dt), device="cpu")
            locals_[name] = t
            at += t.numel() * t.element_size() + 64

        class _ToTorchTensor(torch.autograd.Function):
            # DTensor.to_local() under autograd.
            @staticmethod
            def forward(ctx, local):
                return local.view_as(local)

            @staticmethod
            def backward(ctx, grad):
                return grad


        class DTensor(StandInDTensor):
            # What the glue reads of an FSDP2 DTensor (torch 1.13 has none).
            def __init__(self, local):
                super().__init__(local.shape, local, (Shard(0),), Mesh((1,), (0,)))
                self._local_tensor = local

            def to_local(self):
                return _ToTorchTensor.apply(self._local_tensor.requires_grad_())

        params = [(n, DTensor(t)) for n, t in locals_.items()]
        with self.assertRaises(ValueError) as e:
            wex.trainer.TrainerRank("tinyqwen-fsdp", [(n, p.to_local()) for n, p in params],
                                    rank=0, world_size=1, layout=layout, client=c,
                                    segments=[(seg, base, size)])
        self.assertIn("%s, %s, %s and %d more: the local shard a DTensor's to_local() "
                      "returned" % (params[0][0], params[1][0], params[2][0], len(params) - 3),
                      str(e.exception))
        self.assertIn("pass the DTensors themselves", str(e.exception))
        t = wex.trainer.TrainerRank("tinyqwen-fsdp", params, rank=0, world_size=1,
                                    layout=layout, client=c, segments=[(seg, base, size)])
        t.publish(1)
        name, p = params[0]
        old = p._local_tensor
        p._local_tensor = old.detach().clone()       # FSDP2's reset_sharded_param
        self.assertEqual(t.moved(), [name + " (re-allocated)"])
        with self.assertRaises(ValueError) as e:
            t.publish(2)
        self.assertIn("%s (re-allocated); nothing begun" % name, str(e.exception))
        p._local_tensor = old
        with t.write(2):
            old.detach().fill_(1.0)
        self.assertEqual((t.describe()["version"], t.describe()["writing"]), (2, None))

    def test_trainer_fsdp_rows(self):
        """TrainerRank with DTensors and an fsdp layout checks each shard's
        rows against the layout's rank: the shards of FSDP rank 1 given
        as rank=0 (a rank= that is not shard_rank + fsdp*replica_rank) and
        FSDP over TP (_StridedShard) are refused, naming the parameter,
        not registered as rank 0's rows (their shapes are rank 0's when
        dim 0 divides: engines got rank 1's rows twice, unseen); the right
        rank registers, its table at its rows."""
        import wex.trainer
        _, cfg = paths()
        layout = wex.Layout(cfg, "fsdp:fsdp=2")
        hf = wex.Layout(cfg, "hf")
        buf = torch.zeros(1 << 20, dtype=torch.uint8)
        segs = [(1, buf.data_ptr(), buf.numel())]

        def params(r, placement=Shard(0)):
            out, at = [], 0
            for name, dt, shape, _ in hf.rank(0):
                rows = torch.zeros(shape, dtype=torch.bfloat16).chunk(2)[r]
                t = buf[at:at + 2 * rows.numel()].view(torch.bfloat16).view(rows.shape)
                at += 2 * rows.numel() + 64
                out.append((name, StandInDTensor(shape, t, (placement,), Mesh((2,), (r,)))))
            return out

        class TableClient:
            def register_tensors(self, table):
                self.table = table

        name = hf.rank(0)[0][0]
        for given, placement, what in ((1, Shard(0), "mesh coordinate (1,)"),
                                       (0, _StridedShard(0), "_StridedShard(0)")):
            c = TableClient()
            with self.assertRaises(ValueError) as e:
                wex.trainer.TrainerRank("m", params(given, placement), rank=0, world_size=2,
                                        layout=layout, client=c, segments=segs)
            self.assertIn(name, str(e.exception))
            self.assertIn(what, str(e.exception))
            self.assertFalse(hasattr(c, "table"), "registered")
        for r in (0, 1):
            c = TableClient()
            wex.trainer.TrainerRank("m", params(r), rank=r, world_size=2, layout=layout,
                                    client=c, segments=segs)
            want = {n: ps[0].dims("start") for n, _, _, ps in layout.rank(r)}
            self.assertEqual({t.name.decode(): t.dims("start") for t in c.table}, want)

    def test_trainer_megatron_chunks(self):
        """TrainerRank given Megatron's model as get_model returns it, a list
        of model chunks (one per virtual pipeline stage): each chunk's
        parameters under strip_prefix's names, prefixed model{v}. when
        there are several, as the megatron layout with vpp=V names them
        (was a TypeError: a list is neither pairs nor a callable; and
        strip_prefix could not strip inside a model{v}. name); one chunk
        keeps the names; write() re-enumerates the chunks (moved())."""
        import wex.trainer
        d = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, d)
        cfg = os.path.join(d, "config.json")
        with open(cfg, "w") as f:
            json.dump(dict(CONFIG, num_hidden_layers=4), f)
        buf = torch.zeros(1 << 20, dtype=torch.uint8)
        segs = [(1, buf.data_ptr(), buf.numel())]

        moe = os.path.join(d, "moe.json")
        with open(moe, "w") as f:
            json.dump({"model_type": "deepseek_v3", "hidden_size": 16, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "intermediate_size": 24,
                       "moe_intermediate_size": 8, "n_routed_experts": 4,
                       "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 12,
                       "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 2,
                       "v_head_dim": 4, "vocab_size": 128, "torch_dtype": "bfloat16"}, f)
        for spec, chunks, config in (("megatron:pp=2,vpp=2", 2, cfg), ("megatron:pp=2", 1, cfg),
                                     ("megatron:pp=2,vpp=2", 2, moe)):
            lay = wex.Layout(config, spec)
            named = chunk_tensors(lay, chunks, buf)
            c = TableClient()
            tr = wex.trainer.TrainerRank("m", [MegatronChunk(n) for n in named], rank=0,
                                         world_size=2, layout=lay, client=c, segments=segs,
                                         strip_prefix=("module.module.", "module."))
            want = sorted(p.name for _, _, _, ps in lay.rank(0) for p in ps)
            self.assertEqual(sorted(t.name for t in c.table), want, spec)
            self.assertEqual(tr.moved(), [])
            if config == moe:
                self.assertIn("model1.decoder.layers.0.mlp.router.expert_bias",
                              [n for n, _, _, _ in lay.rank(0)])
                self.assertIn("model.layers.2.mlp.gate.e_score_correction_bias",
                              [t.name.decode() for t in c.table])
            elif chunks > 1:
                self.assertIn("model1.decoder.layers.0.self_attention.linear_qkv.weight",
                              [n for n, _, _, _ in lay.rank(0)])
                named[1].pop()
                self.assertEqual(len(tr.moved()), 1)
                self.assertIn("model1.", tr.moved()[0])
                self.assertIn("(removed)", tr.moved()[0])

    def test_trainer_megatron_chunks_select(self):
        """Megatron's list of model chunks with ignore= and strip_prefix as
        for one module: an ignore pattern written with the wrapper's prefix
        (module.module.mtp.*) or without it (mtp.*) leaves out what the
        chunks have and the layout does not (was refused as model1.mtp...
        "not in the layout": the patterns saw only the model{v}. names); a
        strip_prefix given as a generator strips one chunk's names too (was
        read up by the chunks, then nothing stripped: every name "missing")."""
        import wex.trainer
        d = tempfile.mkdtemp()
        self.addCleanup(__import__("shutil").rmtree, d)
        cfg = os.path.join(d, "config.json")
        with open(cfg, "w") as f:
            json.dump(dict(CONFIG, num_hidden_layers=4), f)
        buf = torch.zeros(1 << 20, dtype=torch.uint8)
        segs = [(1, buf.data_ptr(), buf.numel())]
        extra = torch.zeros(64, dtype=torch.bfloat16)

        for spec, chunks in (("megatron:pp=2,vpp=2", 2), ("megatron:pp=2", 1)):
            lay = wex.Layout(cfg, spec)
            named = chunk_tensors(lay, chunks, buf)
            # The last chunk with a parameter the layout does not have (a
            # multi-token-prediction layer).
            named[-1].append(("mtp.layers.0.enorm.weight", extra))
            want = sorted(p.name for _, _, _, ps in lay.rank(0) for p in ps)
            for ignore in ("module.module.mtp.*", "mtp.*"):
                c = TableClient()
                tr = wex.trainer.TrainerRank(
                    "m", [MegatronChunk(n) for n in named], rank=0, world_size=2, layout=lay,
                    client=c, segments=segs, ignore=(ignore,),
                    strip_prefix=(p for p in ("module.module.", "module.")))
                self.assertEqual(sorted(t.name for t in c.table), want, (spec, ignore))
                self.assertEqual(tr.ignored, ["model1.mtp.layers.0.enorm.weight" if chunks > 1
                                              else "mtp.layers.0.enorm.weight"], spec)
                self.assertEqual(tr.moved(), [])

    def test_layout_threads(self):
        # wex_layout_rank's arrays live until its next call: threads take turns.
        import threading
        _, cfg = paths()
        L = wex.Layout(cfg, "vllm:tp=2")
        want = [[(n, d, s, [bytes(p) for p in ps]) for n, d, s, ps in L.rank(r)] for r in (0, 1)]
        bad = []

        def run(r):
            for _ in range(200):
                got = [(n, d, s, [bytes(p) for p in ps]) for n, d, s, ps in L.rank(r)]
                if got != want[r]:
                    bad.append(r)

        ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1, 0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(bad, [])
        # close() waits for a rank() in another thread (it frees the C
        # layout and the arrays rank() reads): here, one holding the lock.
        closed = threading.Event()
        with L._lock:
            t = threading.Thread(target=lambda: (L.close(), closed.set()))
            t.start()
            self.assertFalse(closed.wait(0.3), "close() freed the layout under a rank() call")
            self.assertTrue(L.handle)
        t.join()
        self.assertTrue(closed.is_set())
        with self.assertRaises(wex.WexError) as e:
            L.rank(0)
        self.assertEqual(e.exception.code, errno.EBADF)
        self.assertIn("closed", str(e.exception))

    def test_bad_engine_names(self):
        """An engine file (users write their own) whose physical names
        collide in a rank (a per-layer name without {L}), or whose FP8
        scale names outgrow the limit past expert 9 (the length was checked
        for expert 0 only), is refused naming the tensor, not laid out with
        one name for two tensors or a name cut short."""
        import shutil
        d, cfg = paths()
        ad = os.path.join(d, "adapters-bad")
        shutil.rmtree(ad, ignore_errors=True)
        shutil.copytree(os.path.join(REPO, "adapters", "families"), os.path.join(ad, "families"))
        os.mkdir(os.path.join(ad, "engines"))
        with open(os.path.join(REPO, "adapters", "engines", "vllm.json")) as f:
            vllm = json.load(f)
        dup = dict(vllm, engine="dupnames", tensors=[
            dict(t, name=t["name"].replace("{L}", "0")) if "input_layernorm" in t["name"]
            else t for t in vllm["tensors"]])
        self.assertNotEqual(dup["tensors"], vllm["tensors"])
        # 149 bytes for expert 0 (its scales fit), 150 from expert 10 on.
        long_name = "model.layers.{L}.mlp.experts.{e}." + "y" * 110 + ".w1.weight"
        loc = dict(vllm, engine="locfp8", tensors=[
            t for t in vllm["tensors"] if "experts.w" not in t["name"]] + [
            {"name": long_name, "kind": "col", "roles": ["e_gate"], "axis": "etp",
             "experts": "local"}])
        for e in (dup, loc):
            with open(os.path.join(ad, "engines", e["engine"] + ".json"), "w") as f:
                json.dump(e, f)
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(cfg, "dupnames:tp=2", adapters=ad)
        self.assertEqual(e.exception.code, wex.ELAYOUT)
        self.assertIn("both named model.layers.0.input_layernorm.weight", str(e.exception))
        moe = os.path.join(d, "fp8moe.json")
        with open(moe, "w") as f:
            json.dump({"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48,
                       "moe_intermediate_size": 16, "num_experts": 12, "num_hidden_layers": 1,
                       "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 100,
                       "torch_dtype": "bfloat16", "head_dim": 8,
                       "quantization_config": {"quant_method": "fp8",
                                               "weight_block_size": [4, 4],
                                               "activation_scheme": "dynamic"}}, f)
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(moe, "locfp8", adapters=ad).rank(0)
        self.assertEqual(e.exception.code, wex.ELAYOUT)
        self.assertIn("expert 10's FP8 scales", str(e.exception))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer()
    else:
        unittest.main()
