#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""checkpoint_check_test - wex.checkpoint.compare: does an engine hold its
weights where its layout says, judged against the safetensors checkpoint
it loaded?  CPU PyTorch; the engine's tensors are what `wexctl convert`
writes for each rank of the layout (the bytes a correct engine holds).

Checked, on a tiny Qwen3-MoE (4 experts, fused w13) and a dense Qwen2:
  - vllm:tp=2 and sglang:tp=2 ranks of the MoE model against a sharded
    checkpoint (two files): every piece the rank holds compared (the
    count equals the layout's pieces), nothing skipped;
  - same-shape re-layouts refused, naming the engine tensor, the
    checkpoint tensor and the element: w13 as [w3; w1] (FlashInfer's
    swap), an expert's gate rows reversed (a shuffle), one element
    changed in the middle row of a piece, a padded-vocabulary
    embedding's rows shifted; each fails compare() on the rank it is in;
  - canonical names without a layout (hf), a strided (transposed view)
    tensor with the same values passing;
  - what the checkpoint cannot show is skipped with the reason: a tensor
    it lacks, one stored in a dtype the engine's cannot be cast from
    (F8 for BF16), an engine tensor not in the layout's shape or dtype
    (attaching refuses it); F32 and F16 checkpoints compared after the
    cast to the engine's BF16 that its loader does; a rank with nothing
    compared refused when the checkpoint was given, "not checked" when
    the hook chose it (wex.engine.EngineRank); the hook's choice
    (checkpoint_for); model.safetensors.index.json selecting the files;
  - unreadable checkpoints refused naming the file: no safetensors file,
    a truncated header, data offsets past the end, a tensor in two
    files, a path that does not exist, a shard the index maps that is
    not there, a file cut short while it is read (a ValueError, not a
    SIGBUS); paths with spaces, non-ASCII and glob characters.
Needs Debian's python3-torch and python3-numpy (exit 77 without).
Environment: WEX_LIB, WEXCTL_BIN, PYTHONPATH with adapters/python.
"""
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import types
import unittest

try:
    __import__("numpy")  # wex.checkpoint reads the checkpoint with it
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("checkpoint_check_test: skipped: no PyTorch/numpy for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
import wex.engine
from wex import checkpoint
import layout_glue_test as glue

MOE = dict(glue.CONFIG, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
           num_experts=4, moe_intermediate_size=32, head_dim=16, vocab_size=120)


def tensors_of(path):
    """{name: tensor} of a safetensors file wexctl convert wrote."""
    out = {}
    for name, (dt, shape, b) in glue.read_safetensors(path).items():
        assert dt == "BF16", dt
        out[name] = torch.frombuffer(bytearray(b), dtype=torch.int16).view(
            torch.bfloat16).reshape(shape)
    return out


class CheckpointCompare(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="wex-ckpt-")
        cls.dirs = {}
        for name, cfg in (("moe", MOE), ("dense", glue.CONFIG)):
            d = os.path.join(cls.tmp.name, name)
            os.makedirs(os.path.join(d, "ckpt"))
            path = os.path.join(d, "ckpt", "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            hf = wex.Layout(path, "hf")
            g = torch.Generator().manual_seed(5)
            ts = [(n, dt, s, glue.to_bytes(torch.randn(s, generator=g).to(torch.bfloat16)))
                  for n, dt, s, _ in hf.rank(0)]
            # Sharded, as large checkpoints are.
            half = len(ts) // 2
            glue.write_safetensors(os.path.join(d, "ckpt", "model-00001-of-00002.safetensors"),
                                   ts[:half])
            glue.write_safetensors(os.path.join(d, "ckpt", "model-00002-of-00002.safetensors"),
                                   ts[half:])
            for spec in ("vllm:tp=2", "sglang:tp=2"):
                out = os.path.join(d, spec.split(":")[0])
                r = subprocess.run([os.environ["WEXCTL_BIN"], "convert", "--config", path,
                                    "--from", "hf", "--to", spec, os.path.join(d, "ckpt"), out],
                                   capture_output=True, text=True)
                assert r.returncode == 0, "wexctl convert --to %s: %s" % (spec, r.stderr)
            cls.dirs[name] = (d, path, ts)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def rank(self, model, engine, k):
        d, cfg, _ = self.dirs[model]
        layout = wex.Layout(cfg, "%s:tp=2" % engine)
        return (tensors_of(os.path.join(d, engine, "rank-%d.safetensors" % k)), layout,
                os.path.join(d, "ckpt"), cfg)

    def compare(self, params, layout, ckpt, cfg, k):
        return checkpoint.compare(list(params.items()), ckpt, layout=layout, rank=k, config=cfg)

    def test_correct_ranks_pass(self):
        for model in ("moe", "dense"):
            for engine in ("vllm", "sglang"):
                for k in range(2):
                    params, layout, ckpt, cfg = self.rank(model, engine, k)
                    rep = self.compare(params, layout, ckpt, cfg, k)
                    npieces = sum(len(ps) for _, _, _, ps in layout.rank(k))
                    self.assertEqual(rep["pieces"], npieces, (model, engine, k))
                    self.assertEqual(rep["skipped"], [], (model, engine, k))
                    self.assertGreater(rep["elements"], npieces)
                    self.assertEqual(rep["bytes"], 2 * rep["elements"])

    def assert_refused(self, params, layout, ckpt, cfg, k, tensor, canonical):
        with self.assertRaises(checkpoint.CheckpointMismatch) as e:
            self.compare(params, layout, ckpt, cfg, k)
        msg = str(e.exception)
        self.assertIn("engine tensor %s " % tensor, msg)
        self.assertIn(canonical, msg)
        self.assertIn(layout.spec, msg)
        return msg

    def test_same_shape_relayouts_refused(self):
        # FlashInfer's w13 as [w3; w1]: the halves of every expert swapped.
        for engine, w13 in (("vllm", "model.layers.1.mlp.experts.w13_weight"),
                            ("sglang", "model.layers.1.mlp.experts.w13_weight")):
            for k in range(2):
                params, layout, ckpt, cfg = self.rank("moe", engine, k)
                w = params[w13]
                h = w.shape[1] // 2
                params[w13] = torch.cat([w[:, h:], w[:, :h]], 1)
                msg = self.assert_refused(params, layout, ckpt, cfg, k, w13,
                                          "model.layers.1.mlp.experts.0.gate_proj.weight")
                self.assertIn("element [%d, 0] differs" % (16 * k), msg)
        # An expert's gate rows reversed (a shuffle that keeps the shape).
        params, layout, ckpt, cfg = self.rank("moe", "vllm", 0)
        w13 = "model.layers.0.mlp.experts.w13_weight"
        params[w13] = params[w13].clone()
        params[w13][2, :16] = params[w13][2, :16].flip(0)
        self.assert_refused(params, layout, ckpt, cfg, 0, w13,
                            "model.layers.0.mlp.experts.2.gate_proj.weight")
        # One element of a middle row of w2 (down_proj of expert 3).
        params, layout, ckpt, cfg = self.rank("moe", "vllm", 1)
        w2 = "model.layers.0.mlp.experts.w2_weight"
        params[w2] = params[w2].clone()
        params[w2][3, 32, 0] += 1
        msg = self.assert_refused(params, layout, ckpt, cfg, 1, w2,
                                  "model.layers.0.mlp.experts.3.down_proj.weight")
        self.assertIn("element [32, 16] differs (1 of", msg)
        # Dense: the padded embedding's rows shifted by one.
        params, layout, ckpt, cfg = self.rank("dense", "vllm", 0)
        emb = "model.embed_tokens.weight"
        params[emb] = params[emb].roll(1, 0)
        self.assert_refused(params, layout, ckpt, cfg, 0, emb, emb)
        # The other rank, untouched, still passes.
        params, layout, ckpt, cfg = self.rank("dense", "vllm", 1)
        self.assertGreater(self.compare(params, layout, ckpt, cfg, 1)["pieces"], 0)

    def test_canonical_names(self):
        d, cfg, ts = self.dirs["dense"]
        params = {n: torch.frombuffer(bytearray(b), dtype=torch.int16).view(
            torch.bfloat16).reshape(s) for n, _, s, b in ts}
        ckpt = os.path.join(d, "ckpt")
        for config in (cfg, None):
            rep = checkpoint.compare(list(params.items()), ckpt, config=config)
            self.assertEqual((rep["pieces"], rep["skipped"]), (len(params), []))
        # A transposed view holding the same values (strides (1, rows)).
        name = "model.layers.0.self_attn.q_proj.weight"
        params[name] = params[name].t().contiguous().t()
        self.assertFalse(params[name].is_contiguous())
        self.assertEqual(checkpoint.compare(list(params.items()), ckpt)["pieces"], len(params))
        params[name] = params[name].t()  # the transpose itself: other values per index
        with self.assertRaises(checkpoint.CheckpointMismatch) as e:
            checkpoint.compare(list(params.items()), ckpt)
        self.assertIn("(canonical)", str(e.exception))

    def test_bad_elems(self):
        """elems below 1, or not an int, is refused naming it (0 failed in
        numpy; a float or a string likewise); 1 compares one element per
        sampled row."""
        d, cfg, ts = self.dirs["dense"]
        params = {n: torch.frombuffer(bytearray(b), dtype=torch.int16).view(
            torch.bfloat16).reshape(s) for n, _, s, b in ts}
        ckpt = os.path.join(d, "ckpt")
        for bad in (0, -1, 1.5, "64", True, None):
            with self.assertRaises(ValueError, msg=repr(bad)) as e:
                checkpoint.compare(list(params.items()), ckpt, elems=bad)
            self.assertIn("elems (the elements compared per sampled row) must be an int of "
                          "at least 1, not %r" % (bad,), str(e.exception))
        one = checkpoint.compare(list(params.items()), ckpt, elems=1)
        full = checkpoint.compare(list(params.items()), ckpt)
        self.assertEqual(one["pieces"], len(params))
        self.assertLess(one["elements"], full["elements"])
        # An integer of NumPy or PyTorch is an int, as wex takes them
        # elsewhere (was refused: "must be an int of at least 1, not 1").
        import numpy
        for n in (numpy.int64(1), torch.tensor(1)):
            rep = checkpoint.compare(list(params.items()), ckpt, elems=n)
            self.assertEqual((rep["pieces"], rep["elements"]), (one["pieces"], one["elements"]))
        for bad in (numpy.int64(0), numpy.True_):
            with self.assertRaises(ValueError, msg=repr(bad)):
                checkpoint.compare(list(params.items()), ckpt, elems=bad)

    def test_skipped_and_nothing_compared(self):
        d, cfg, ts = self.dirs["dense"]
        sub = os.path.join(self.tmp.name, "partial")
        os.makedirs(sub, exist_ok=True)
        # lm_head left out, the final norm stored as F8_E4M3 (no cast to
        # BF16 is the engine's), the embedding as F32 (cast as the engine's
        # loader casts it: compared), layer 1's k_proj in another shape.
        kept = []
        for n, dt, s, b in ts:
            t = torch.frombuffer(bytearray(b), dtype=torch.int16).view(torch.bfloat16)
            if n == "lm_head.weight":
                continue
            if n == "model.norm.weight":
                dt, b = "F8_E4M3", b[:len(b) // 2]
            elif n == "model.embed_tokens.weight":
                dt, b = "F32", t.float().numpy().tobytes()
            elif n == "model.layers.1.self_attn.k_proj.weight":
                s = (s[1], s[0])
            kept.append((n, dt, s, b))
        glue.write_safetensors(os.path.join(sub, "model.safetensors"), kept)
        params, layout, _, _ = self.rank("dense", "vllm", 0)
        rep = self.compare(params, layout, sub, cfg, 0)
        self.assertEqual(sorted(rep["skipped"]),
                         ["lm_head.weight (not in the checkpoint)",
                          "model.layers.1.self_attn.k_proj.weight (the checkpoint's shape "
                          "[64, 32] is not the config's [32, 64])",
                          "model.norm.weight (the checkpoint holds F8_E4M3, the engine BF16)"])
        npieces = sum(len(ps) for _, _, _, ps in layout.rank(0))
        self.assertEqual(rep["pieces"], npieces - 3)
        # A caller's skip (what the engine rewrites after loading).
        rep = checkpoint.compare(list(params.items()), os.path.join(d, "ckpt"), layout=layout,
                                 rank=0, config=cfg,
                                 skip=lambda n, dt: "rewritten" if "mlp" in n else None)
        self.assertEqual(rep["pieces"] + len(rep["skipped"]), npieces)
        self.assertTrue(rep["skipped"] and
                        all(x.endswith(" (rewritten)") and "mlp" in x for x in rep["skipped"]),
                        rep["skipped"])
        # An F32 checkpoint of values BF16 cannot hold: the engine holds
        # them rounded (torch's .to, as its loader's copy_); compared so.
        name = "model.layers.0.self_attn.q_proj.weight"
        full = torch.randn(64, 64, generator=torch.Generator().manual_seed(9))
        f16 = torch.randn(32, 64, generator=torch.Generator().manual_seed(8)).half()
        glue.write_safetensors(os.path.join(sub, "model.safetensors"),
                               [(name, "F32", (64, 64), full.numpy().tobytes()),
                                ("model.layers.0.self_attn.k_proj.weight", "F16", (32, 64),
                                 f16.view(torch.int16).numpy().tobytes())])
        qkv = "model.layers.0.self_attn.qkv_proj.weight"
        params[qkv] = params[qkv].clone()
        params[qkv][:32] = full[:32].to(torch.bfloat16)       # rank 0's q rows
        params[qkv][32:48] = f16[:16].to(torch.bfloat16)      # its k rows
        rep = self.compare(params, layout, sub, cfg, 0)
        self.assertEqual(rep["pieces"], 2)
        params[qkv][0, 5] = full[0, 5].to(torch.bfloat16) + 1  # one element off
        with self.assertRaises(checkpoint.CheckpointMismatch) as e:
            self.compare(params, layout, sub, cfg, 0)
        self.assertIn("element [0, 5] differs", str(e.exception))
        params, layout, _, _ = self.rank("dense", "vllm", 0)
        # An engine tensor not in the layout's shape or dtype is left to
        # attach_module's refusal, named here.
        bad = dict(params)
        bad["model.norm.weight"] = torch.zeros(63, dtype=torch.bfloat16)
        bad["model.layers.0.input_layernorm.weight"] = torch.zeros(64)
        rep = self.compare(bad, layout, os.path.join(d, "ckpt"), cfg, 0)
        self.assertEqual(sorted(rep["skipped"]),
                         ["model.layers.0.input_layernorm.weight (the engine's F32 [64] is "
                          "not the layout's BF16 [64])",
                          "model.norm.weight (the engine's BF16 [63] is not the layout's "
                          "BF16 [64])"])
        # No layout: an engine tensor is the whole canonical one, so one
        # in another shape than the checkpoint's is skipped, named (half
        # its rows compared as equal; the same bytes reshaped, as
        # different).
        w = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
        glue.write_safetensors(os.path.join(sub, "model.safetensors"),
                               [("w", "F32", (8, 8), w.numpy().tobytes())])
        for t in (w[:4].clone(), w.reshape(4, 16).clone()):
            rep = checkpoint.compare([("w", t)], sub)
            self.assertEqual((rep["pieces"], rep["skipped"]),
                             (0, ["w (the checkpoint's shape [8, 8] is not the engine's %s)"
                                  % list(t.shape)]))
        self.assertEqual(checkpoint.compare([("w", w.clone())], sub)["pieces"], 1)
        # A checkpoint that shows none of the rank's tensors: EngineRank
        # refuses one it was given rather than call that checked, and says
        # "not checked" for one it chose itself (checkpoint_auto).
        glue.write_safetensors(os.path.join(sub, "model.safetensors"),
                               [("other.weight", "BF16", (2,), b"\0" * 4)])
        with self.assertRaises(ValueError) as e:
            wex.engine.EngineRank("m", list(params.items()), rank=0, world_size=2,
                                  layout=layout, checkpoint=sub, config=cfg)
        self.assertIn("nothing compared", str(e.exception))
        # One the hook chose itself (auto) is reported, not refused: one
        # that shows nothing, and one that cannot be read.
        rank = types.SimpleNamespace(layout=layout)
        check = wex.engine.EngineRank._check
        got = check(rank, list(params.items()), sub, True, None, 0, cfg, None)
        self.assertTrue(got.startswith("not checked: %s shows none" % sub), got)
        with self.assertRaises(ValueError):
            check(rank, list(params.items()), sub, False, None, 0, cfg, None)
        bad = os.path.join(self.tmp.name, "unreadable")
        os.makedirs(bad, exist_ok=True)
        with open(os.path.join(bad, "model.safetensors"), "wb") as f:
            f.write(b"garbage")
        got = check(rank, list(params.items()), bad, True, None, 0, cfg, None)
        self.assertTrue(got.startswith("not checked: ") and "not a safetensors file" in got, got)
        with self.assertRaises(ValueError):
            check(rank, list(params.items()), bad, False, None, 0, cfg, None)
        # A difference is refused either way, saying how it was chosen.
        params["model.norm.weight"] = params["model.norm.weight"] + 1
        with self.assertRaises(checkpoint.CheckpointMismatch) as e:
            check(rank, list(params.items()), os.path.join(d, "ckpt"), True, None, 0, cfg, None)
        self.assertIn("checkpoint=None compared with the model directory", str(e.exception))

    def test_checkpoint_for(self):
        """The hooks' choice of checkpoint (wex.engine.checkpoint_for)."""
        d, cfg, _ = self.dirs["dense"]
        ck = os.path.join(d, "ckpt")
        cf = wex.engine.checkpoint_for
        self.assertEqual(cf(None, ck, "auto"), (ck, None, True))
        self.assertEqual(cf(None, ck, "fastsafetensors"), (ck, None, True))
        self.assertEqual(cf(None, "org/model", "safetensors", config=os.path.join(ck, "x.json")),
                         (ck, None, True))
        self.assertEqual(cf(None, ck, "dummy")[:2], (None, "the engine's load_format is dummy"))
        self.assertEqual(cf(None, ck, None)[1], "the engine's load_format is unknown")
        self.assertEqual(cf(None, d, "auto")[1], "no .safetensors checkpoint found at %s" % d)
        self.assertEqual(cf(False, ck, "auto")[:2], (None, "checkpoint=False"))
        # Given: used as given (a pathlib.Path too), not chosen here ...
        self.assertEqual(cf(pathlib.Path(ck), d, "pt"), (ck, None, False))
        with self.assertRaises(ValueError):
            cf(ck, d, "dummy")
        with self.assertRaises(ValueError):
            cf(3, d, "auto")
        # ... and neither once a sync changed the weights.
        for given in (None, ck):
            self.assertEqual(cf(given, ck, "auto", updated=True)[:2],
                             (None, "a sync changed the weights since the engine loaded them"))
        # ... or once they were lost otherwise: the reason given is said.
        self.assertEqual(cf(None, ck, "auto", updated="vLLM's sleep mode discarded them")[:2],
                         (None, "vLLM's sleep mode discarded them"))

    def test_index_json(self):
        """A directory with both a merged file and shards: the files its
        model.safetensors.index.json maps are read (as vLLM does)."""
        d, cfg, ts = self.dirs["dense"]
        both = os.path.join(self.tmp.name, "both")
        shutil.copytree(os.path.join(d, "ckpt"), both)
        glue.write_safetensors(os.path.join(both, "model.safetensors"), ts)
        with self.assertRaises(ValueError) as e:
            checkpoint.index(both)
        self.assertIn("is in both", str(e.exception))
        half = len(ts) // 2
        wm = {n: "model-0000%d-of-00002.safetensors" % (1 if i < half else 2)
              for i, (n, _, _, _) in enumerate(ts)}
        with open(os.path.join(both, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
        got = checkpoint.index(both)
        self.assertEqual(sorted(got), sorted(n for n, _, _, _ in ts))
        self.assertNotIn("model.safetensors", {os.path.basename(v[0]) for v in got.values()})
        with open(os.path.join(both, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"x": "gone.safetensors"}}, f)
        with self.assertRaises(ValueError) as e:
            checkpoint.index(both)
        self.assertIn("maps no .safetensors file", str(e.exception))
        # A shard the index names that is not there (still being written
        # or downloaded): refused naming it, not its tensors reported as
        # "not in the checkpoint" and the rest called checked.
        os.remove(os.path.join(both, "model.safetensors"))
        os.rename(os.path.join(both, "model-00002-of-00002.safetensors"),
                  os.path.join(both, "partial.tmp"))
        with open(os.path.join(both, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": wm}, f)
        with self.assertRaises(ValueError) as e:
            checkpoint.index(both)
        self.assertIn("model-00002-of-00002.safetensors", str(e.exception))
        self.assertIn("not there", str(e.exception))
        params = {n: torch.frombuffer(bytearray(b), dtype=torch.int16).view(
            torch.bfloat16).reshape(s) for n, _, s, b in ts}
        with self.assertRaises(ValueError) as e:
            checkpoint.compare(list(params.items()), both, config=cfg)
        self.assertIn("model-00002-of-00002.safetensors", str(e.exception))
        os.rename(os.path.join(both, "partial.tmp"),
                  os.path.join(both, "model-00002-of-00002.safetensors"))
        self.assertEqual(checkpoint.compare(list(params.items()), both,
                                            config=cfg)["pieces"], len(ts))
        # The index file itself named as the checkpoint: the files it maps
        # are read, not the JSON file refused as "not a safetensors file";
        # under another name (a diffusers-style index) too.
        idxf = os.path.join(both, "model.safetensors.index.json")
        self.assertEqual(checkpoint.index(idxf), checkpoint.index(both))
        self.assertEqual(checkpoint.compare(list(params.items()), idxf,
                                            config=cfg)["pieces"], len(ts))
        other = os.path.join(both, "weights.safetensors.index.json")
        with open(other, "w") as f:
            json.dump({"weight_map": {n: "model-00001-of-00002.safetensors"
                                      for n, _, _, _ in ts[:half]}}, f)
        self.assertEqual(sorted(checkpoint.index(other)), sorted(n for n, _, _, _ in ts[:half]))
        os.remove(other)
        with open(os.path.join(both, "model.safetensors.index.json"), "w") as f:
            f.write("[1]")
        with self.assertRaises(ValueError) as e:
            checkpoint.index(both)
        self.assertIn("not a safetensors index", str(e.exception))

    def test_path_with_glob_characters(self):
        """A checkpoint directory whose path has spaces, non-ASCII letters
        or glob's special characters ([...], *, ?) is read as named, by
        compare and by the hooks' choice of checkpoint."""
        d, cfg, ts = self.dirs["dense"]
        params = {n: torch.frombuffer(bytearray(b), dtype=torch.int16).view(
            torch.bfloat16).reshape(s) for n, _, s, b in ts}
        for name in ("run 1", "r\u00e9sum\u00e9", "exp[lr=1e-5]", "step*?"):
            ck = os.path.join(self.tmp.name, "paths", name)
            shutil.copytree(os.path.join(d, "ckpt"), ck)
            rep = checkpoint.compare(list(params.items()), ck, config=cfg)
            self.assertEqual((rep["pieces"], rep["skipped"]), (len(ts), []), name)
            self.assertEqual(wex.engine.checkpoint_for(None, ck, "auto"), (ck, None, True), name)

    def test_checkpoint_changed_while_read(self):
        """A checkpoint file cut short after its header was read (a trainer
        saving over the directory the engine loaded): refused as a
        ValueError naming the file (the hooks then report "not checked"),
        not an IndexError, nor a SIGBUS that kills the engine's process
        while the file is read."""
        w = torch.randn(4, 4096, generator=torch.Generator().manual_seed(4))
        ck = os.path.join(self.tmp.name, "rewritten")
        os.makedirs(ck, exist_ok=True)
        path = os.path.join(ck, "model.safetensors")
        tensors = [("a", "F32", (4, 4096), w.numpy().tobytes()),
                   ("b", "F32", (4, 4096), w.numpy().tobytes())]
        glue.write_safetensors(path, tensors)
        # Cut between the header and the data reads.
        orig = checkpoint._read_headers

        def cut(files):
            out = orig(files)
            os.truncate(path, 4096)
            return out

        checkpoint._read_headers = cut
        try:
            with self.assertRaises(ValueError) as e:
                checkpoint.compare([("a", w), ("b", w)], ck)
        finally:
            checkpoint._read_headers = orig
        self.assertNotIsInstance(e.exception, checkpoint.CheckpointMismatch)
        self.assertIn(path, str(e.exception))
        # Cut while being read (after the first tensor's read): in a child
        # process, which a SIGBUS would kill.
        glue.write_safetensors(path, tensors)
        code = ("import os, sys, torch\n"
                "from wex import checkpoint\n"
                "w = torch.randn(4, 4096, generator=torch.Generator().manual_seed(4))\n"
                "orig = checkpoint._ckpt_bytes\n"
                "def cut(*a):\n"
                "    out = orig(*a)\n"
                "    os.truncate(sys.argv[2], 4096)\n"
                "    return out\n"
                "checkpoint._ckpt_bytes = cut\n"
                "try:\n"
                "    checkpoint.compare([('a', w), ('b', w)], sys.argv[1])\n"
                "except ValueError as e:\n"
                "    print('refused:', e)\n")
        r = subprocess.run([sys.executable, "-c", code, ck, path], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "child ended with %d: %s" % (r.returncode, r.stderr))
        self.assertIn("refused: ", r.stdout)
        self.assertIn(path, r.stdout)

    def test_bad_checkpoints(self):
        params, layout, _, cfg = self.rank("dense", "vllm", 0)
        base = os.path.join(self.tmp.name, "bad")

        def fresh(name):
            p = os.path.join(base, name)
            shutil.rmtree(p, ignore_errors=True)
            os.makedirs(p)
            return p

        def refused(path, *words):
            with self.assertRaises(ValueError) as e:
                self.compare(params, layout, path, cfg, 0)
            self.assertNotIsInstance(e.exception, checkpoint.CheckpointMismatch)
            for w in words:
                self.assertIn(w, str(e.exception))

        refused(fresh("empty"), "no .safetensors file")
        refused(os.path.join(base, "missing"), "no such file")
        p = fresh("short")
        with open(os.path.join(p, "model.safetensors"), "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
        refused(p, "model.safetensors", "not a safetensors file")
        p = fresh("past")
        glue.write_safetensors(os.path.join(p, "model.safetensors"),
                               [("model.norm.weight", "BF16", (64,), b"\0" * 128)])
        with open(os.path.join(p, "model.safetensors"), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(p, "model.safetensors")) - 2)
        refused(p, "model.norm.weight", "outside the file")
        p = fresh("twice")
        for i in (1, 2):
            glue.write_safetensors(os.path.join(p, "m%d.safetensors" % i),
                                   [("model.norm.weight", "BF16", (64,), b"\0" * 128)])
        refused(p, "model.norm.weight", "m1.safetensors", "m2.safetensors")

        # Headers the reference implementation refuses (huggingface/
        # safetensors): refused here too, as ValueError (a RecursionError or
        # OverflowError would end an engine's attach instead of reporting
        # the checkpoint unchecked).
        def raw(name, header, data=b""):
            p = fresh(name)
            with open(os.path.join(p, "model.safetensors"), "wb") as f:
                f.write(struct.pack("<Q", len(header)) + header + data)
            return p

        ent = '{"dtype":"BF16","shape":%s,"data_offsets":[0,128]}'
        refused(raw("dup", ('{"model.norm.weight":%s,"model.norm.weight":%s}'
                            % (ent % "[64]", ent % "[64]")).encode(), b"\0" * 128),
                "appears twice")
        refused(raw("utf16", ('{"model.norm.weight":%s}' % (ent % "[64]")).encode("utf-16"),
                    b"\0" * 128), "not UTF-8 JSON")
        refused(raw("float", ('{"model.norm.weight":%s}' % (ent % "[64.0]")).encode(),
                    b"\0" * 128), "no valid dtype, shape")
        refused(raw("size", ('{"model.norm.weight":%s}' % (ent % "[65]")).encode(),
                    b"\0" * 128), "128 bytes for shape [65] of BF16")
        refused(raw("inf", ('{"model.norm.weight":%s}' % (ent % "[Infinity]")).encode(),
                    b"\0" * 128), "not UTF-8 JSON")
        refused(raw("deep", b"[" * 100000 + b"]" * 100000), "not UTF-8 JSON")
        refused(raw("dtype", ('{"model.norm.weight":%s}'
                              % (ent % "[64]").replace("BF16", "Q7")).encode(), b"\0" * 128),
                "no valid dtype")


if __name__ == "__main__":
    unittest.main(verbosity=2)
