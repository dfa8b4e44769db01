#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_glue_test - wex.torch_util with CPU PyTorch on host segments,
through a real wexd: a producer process keeps a model's tensors (bf16 and
f32) in a wex host segment, as torch tensors over it (from_ptr), and
publishes versions written with torch ops; the test, an engine, reads them
as tensors over the producer's memory (view_tensors), copies them in place
into its own parameters (attach_module) and remaps them at reserved
addresses (reserve_like), checking each with torch.equal.  The CUDA-only
path (register_module over caching-allocator segments) is
tests/gpu/torch_check.py; here it must refuse CPU tensors.

Needs Debian's python3-torch (exit 77 with the reason without it).
Environment: WEX_LIB, WEXD_BIN, PYTHONPATH with adapters/python.
"""
import errno
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

try:
    import torch
except ImportError as e:
    if __name__ == "__main__" and len(sys.argv) == 1:
        print("torch_glue_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        sys.exit(77)
    raise

import wex
from wexd_harness import WexdProducerCase
from wex import torch_util

MODEL = "torch-glue"
SHAPES = (("embed.weight", (1000, 64), torch.bfloat16),
          ("layers.0.norm.weight", (64,), torch.float32),
          ("layers.0.mlp.weight", (256, 64), torch.bfloat16),
          ("lm_head.weight", (1000, 64), torch.bfloat16))


def expected(v):
    g = torch.Generator().manual_seed(v)
    return {n: torch.randn(s, generator=g).to(d) for n, s, d in SHAPES}


def layout():
    """(name, shape, dtype, offset): each tensor 4 KiB aligned."""
    out, off = [], 0
    for n, s, d in SHAPES:
        out.append((n, s, d, off))
        nb = torch.empty(s, dtype=d).numel() * torch.empty((), dtype=d).element_size()
        off += (nb + 4095) & ~4095
    return out, off


def producer():
    c = wex.Client(wex.ROLE_PRODUCER, MODEL, rank=0, world_size=1)
    lay, size = layout()
    seg, base = c.segment_alloc(wex.SEG_HOST, size)
    tensors = {n: torch_util.from_ptr(base + o, s, d, "cpu") for n, s, d, o in lay}
    c.register_tensors([wex.tensor(n, torch_util.wex_dtype(d), s, segment=seg, offset=o)
                        for n, s, d, o in lay])
    for line in sys.stdin:
        v = int(line)
        c.begin_write(v, 5000)
        for n, t in expected(v).items():
            tensors[n].copy_(t)
        c.publish(v)
        print("published %d" % v, flush=True)
    c.close()


class TorchGlue(WexdProducerCase):
    def assert_equal(self, what, got, want):
        self.assertEqual(sorted(got), sorted(want), what)
        for n in want:
            self.assertEqual(got[n].dtype, want[n].dtype, "%s: %s" % (what, n))
            self.assertTrue(torch.equal(got[n], want[n]), "%s: %s differs" % (what, n))

    def test_versions(self):
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="engine", timeout_ms=10000)
        self.addCleanup(c.close)
        own = {n: torch.zeros(s, dtype=d) for n, s, d in SHAPES}
        fixed = None
        for v in (1, 2, 3):
            self.publish(v)
            want = expected(v)
            r = c.sync(wex.SYNC_REMAP_VIEW, min_version=v)
            self.assertEqual(r.version, v)
            self.assert_equal("view v%d" % v, torch_util.view_tensors(c, device="cpu"), want)
            if not torch.cuda.is_available():
                # Without CUDA the default device is the host (README's
                # engine lines, device left out).
                self.assert_equal("view v%d, no device given" % v,
                                  torch_util.view_tensors(c), want)
            if fixed is None:
                fixed = torch_util.reserve_like(c, device="cpu")
                # The engine's pointers, taken before the swap.
                ptrs = {n: t.data_ptr() for n, t in fixed.items()}
            torch_util.attach_module(c, fixed.items())
            r = c.sync(wex.SYNC_REMAP_FIXED, min_version=v)
            self.assertEqual(r.version, v)
            self.assertEqual({n: t.data_ptr() for n, t in fixed.items()}, ptrs)
            self.assert_equal("same-address v%d" % v, fixed, want)
            torch_util.attach_module(c, own.items())
            r = c.sync(wex.SYNC_COPY, min_version=v)
            self.assertEqual(r.version, v)
            self.assert_equal("copy v%d" % v, own, want)
        # The copies are the engine's own: a later version leaves them be.
        self.publish(4)
        self.assert_equal("copy after v4", own, expected(3))
        # A table naming a tensor the producer does not have: ELAYOUT,
        # naming it.
        buf = torch.zeros(4, dtype=torch.bfloat16)
        with self.assertRaises(wex.WexError) as e:
            c.attach([wex.tensor("no.such", "BF16", (4,), ptr=buf.data_ptr())])
            c.sync(wex.SYNC_COPY, timeout_ms=5000)
        self.assertEqual(e.exception.code, wex.ELAYOUT, str(e.exception))
        self.assertIn("no.such", str(e.exception))
        # ... and the failed sync gave its lease back: the producer writes on.
        self.publish(5)

    def test_close_waits_for_tensors(self):
        """close() (or leaving a with block) while tensors over the
        client's memory are alive: the client stays open, with a warning,
        until the last goes (it crashed the process when they were read)."""
        import gc
        import warnings

        model = "torch-glue-close"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        p.register_tensors([wex.tensor("w", "F32", (64, 32), segment=seg)])
        src = torch_util.from_ptr(base, (64, 32), torch.float32, "cpu")
        want = torch.arange(64 * 32, dtype=torch.float32).view(64, 32)
        p.begin_write(1)
        src.copy_(want)
        p.publish(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with wex.Client(wex.ROLE_CONSUMER, model, group="closer", timeout_ms=10000) as c:
                c.sync(wex.SYNC_REMAP_VIEW, min_version=1)
                views = torch_util.view_tensors(c, device="cpu")
        self.assertTrue(any("still alive" in str(w.message) for w in caught),
                        [str(w.message) for w in caught])
        self.assertIsNotNone(c._h, "closed under live tensors")
        self.assertTrue(torch.equal(views["w"], want), "views after the with block")
        part = views["w"][3:5]  # a view of a view keeps it too
        del views
        gc.collect()
        self.assertIsNotNone(c._h, "closed while a slice of a view lives")
        self.assertTrue(torch.equal(part, want[3:5]))
        del part
        gc.collect()
        self.assertIsNone(c._h, "still open once no tensor is left")
        # close(force=True) closes at once.
        c = wex.Client(wex.ROLE_CONSUMER, model, group="closer", timeout_ms=10000)
        c.sync(wex.SYNC_REMAP_VIEW, min_version=1)
        views = torch_util.view_tensors(c, device="cpu")
        c.close(force=True)
        self.assertIsNone(c._h)
        del views

    def test_close_while_making_views(self):
        """close() in another thread while view_tensors or reserve_like
        makes its tensors: the close waits for them and is then deferred
        for them, as for any live tensor (was: it closed the client
        between a view() or reserve() and the tensor over what it
        returned, unmapping that memory: reading the tensor crashed the
        process)."""
        import gc
        import threading
        import warnings

        model = "torch-glue-close-race"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
        p.begin_write(1)
        torch_util.from_ptr(base, (64,), torch.float32, "cpu").fill_(1.0)
        p.publish(1)
        for which, call, make in (("view", "view", torch_util.view_tensors),
                                  ("reserve", "reserve", torch_util.reserve_like)):
            c = wex.Client(wex.ROLE_CONSUMER, model, group="race-" + which, timeout_ms=10000)
            c.sync(wex.SYNC_REMAP_VIEW, 1)
            closer = threading.Thread(target=c.close, daemon=True)
            real = getattr(c, call)

            def hook(*args, real=real, closer=closer):
                out = real(*args)
                if not closer.is_alive() and closer.ident is None:
                    # Another thread's close() right after the call: it
                    # ran to its end here before the fix.  (Bounded: it
                    # waits for view_tensors now.)
                    closer.start()
                    closer.join(2)
                return out
            setattr(c, call, hook)
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                got = make(c, device="cpu")
                closer.join(30)
            self.assertFalse(closer.is_alive(), "%s: close() did not end" % which)
            self.assertIsNotNone(c._h, "%s: the client closed under the tensors %s made "
                                 "(reading them would crash)" % (which, make.__name__))
            self.assertEqual(float(got["w"].sum()), 64.0 if which == "view" else 0.0, which)
            del got
            gc.collect()
            self.assertIsNone(c._h, "%s: still open once no tensor is left" % which)

    def test_trainer_closed_during_write(self):
        """TrainerRank.close() in another thread while a write() block
        runs: the block's end raises ValueError saying so, nothing
        published (was: AttributeError, 'NoneType' object has no
        attribute 'publish')."""
        import threading
        import wex.trainer

        model = "torch-glue-trainer-close"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        t = wex.trainer.TrainerRank(model, [("w", w)], client=p,
                                    segments=[(seg, base, 1 << 12)])
        with self.assertRaises(ValueError) as e:
            with t.write(1):
                w.fill_(1.0)
                closer = threading.Thread(target=t.close)
                closer.start()
                closer.join()
        self.assertIn("closed during write(1)", str(e.exception))
        self.assertEqual(t.version, 0)
        with self.assertRaises(ValueError):
            t.publish(2)

    def test_trainer_segments_without_client(self):
        """TrainerRank given segments= but no client=: refused at once,
        saying the segments are a client's (was: its own new client joined
        wexd and register_tensors failed, "tensor 'w' names segment 0, rank
        has 0", naming neither argument)."""
        import wex.trainer

        model = "torch-glue-trainer-segs"
        p = wex.Client(wex.ROLE_PRODUCER, model + "-owner", rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        with self.assertRaises(ValueError) as e:
            wex.trainer.TrainerRank(model, [("w", w)], segments=[(seg, base, 1 << 12)])
        self.assertIn("pass that producer client as client=", str(e.exception))
        # segments=[] (a rank whose every tensor is empty) needs no client.
        with wex.trainer.TrainerRank(model, [("e", torch.zeros(0, 4))], segments=[]) as t:
            t.publish(1)

    def test_trainer_dtype_named(self):
        """A parameter of a dtype wex has no element type for (complex
        rotary tables): refused naming the parameter, before anything is
        registered (was: "wex has no element type for torch.complex64",
        naming none, raised once the table was made, after the CUDA
        path had exported the memory)."""
        import wex.trainer

        model = "torch-glue-trainer-dtype"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 13)
        segs = [(seg, base, 1 << 13)]
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        z = torch_util.from_ptr(base + 4096, (8,), torch.complex64, "cpu")
        # (Each naming its own ignore=: an engine's attach_module said
        # TrainerRank's.)
        for call, who in ((lambda: wex.trainer.TrainerRank(model, [("w", w), ("rope.freqs", z)],
                                                           client=p, segments=segs),
                           "TrainerRank"),
                          (lambda: torch_util.attach_module(p, [("rope.freqs", z)]),
                           "EngineRank")):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertIn("rope.freqs is torch.complex64", str(e.exception))
            self.assertIn("leave it out (%s's ignore=)" % who, str(e.exception))
        t = wex.trainer.TrainerRank(model, [("w", w), ("rope.freqs", z)], client=p,
                                    segments=segs, ignore="rope.*")
        t.publish(1)

    def test_trainer_same_address_other_tensor(self):
        """A parameter whose .data is set to another tensor at the
        registered address (rows cut off a padded vocabulary, a transpose)
        or that was empty when registered and holds rows now: write()
        refuses it, naming it (was: published, the engines reading the
        memory in the registered shape and strides, or never getting the
        new rows)."""
        import wex.trainer

        model = "torch-glue-trainer-reshaped"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 13)
        segs = [(seg, base, 1 << 13)]
        m = torch.nn.Module()
        m.embed = torch.nn.Parameter(torch_util.from_ptr(base, (16, 8), torch.float32, "cpu"))
        m.extra = torch.nn.Parameter(torch.zeros(0, 8))
        for given in ("pairs", "callable"):
            t = wex.trainer.TrainerRank(model, list(m.named_parameters()) if given == "pairs"
                                        else m, client=p, segments=segs)
            v = 0 if given == "pairs" else 2  # (the versions the first one published)
            t.publish(v + 1)
            whole = m.embed.data
            for new, why in ((whole[:12], "now float32 [12, 8] with strides [8, 1] at the "
                              "address registered as float32 [16, 8] with strides [8, 1]"),
                             (whole.view(8, 16).t(), "now float32 [16, 8] with strides [1, 16]"
                              " at the address registered as float32 [16, 8] with strides "
                              "[8, 1]")):
                m.embed.data = new
                self.assertEqual(t.moved(), ["embed (%s)" % why], given)
                with self.assertRaises(ValueError) as e:
                    with t.write(v + 2):
                        self.fail("the block ran")
                self.assertIn("embed (%s); nothing begun" % why, str(e.exception))
            m.embed.data = whole
            self.assertEqual(t.moved(), [], given)
            rows = torch_util.from_ptr(base + 4096, (4, 8), torch.float32, "cpu")
            m.extra.data = rows
            self.assertEqual(t.moved(), ["extra (empty when registered, now [4, 8]: not "
                                         "registered)"], given)
            m.extra.data = torch.zeros(0, 8)
            self.assertEqual(t.moved(), [], given)
            with t.write(v + 2):
                m.embed.data.fill_(1.0)
            p.register_tensors([])  # (the next TrainerRank registers again)
        if hasattr(m, "extra"):
            del m.extra  # an empty one gone: engines read nothing of it
            self.assertEqual(t.moved(), [])

    def test_trainer_same_address_strides_shown(self):
        """The strides write() names for a parameter with a dim of 1
        element that is another tensor at its address are PyTorch's (were
        shown as 0 there, which PyTorch's strides are only for a
        broadcast dim); such a stride alone differing is no change."""
        import wex.trainer

        model = "torch-glue-trainer-strides"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        m = torch.nn.Module()
        m.bias = torch.nn.Parameter(torch_util.from_ptr(base, (16, 1), torch.float32, "cpu"))
        t = wex.trainer.TrainerRank(model, m, client=p, segments=[(seg, base, 1 << 12)])
        whole = m.bias.data
        m.bias.data = whole.as_strided((16, 1), (1, 5))
        self.assertEqual(t.moved(), [])
        m.bias.data = whole[:12]
        self.assertEqual(t.moved(), ["bias (now float32 [12, 1] with strides [1, 1] at the "
                                     "address registered as float32 [16, 1] with strides "
                                     "[1, 1])"])
        m.bias.data = whole
        t.publish(1)

    def test_trainer_version_tensor(self):
        """TrainerRank.write(v) with v a 0-d integer tensor (a step
        counter): the rank counts v as a Python int, not the tensor, so
        the counter's next in-place += 1 is the next version (was: kept
        as self.version, it changed with the counter and the next write
        was refused, "version 2 is not newer than 2")."""
        import wex.trainer

        model = "torch-glue-trainer-step"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        t = wex.trainer.TrainerRank(model, [("w", w)], client=p,
                                    segments=[(seg, base, 1 << 12)])
        step = torch.ones((), dtype=torch.int64)
        t.publish(step)
        step += 1
        with t.write(step):
            w.fill_(2.0)
        self.assertIs(type(t.describe()["version"]), int)
        self.assertEqual(t.describe()["version"], 2)
        # (A float tensor's refusal is a C++ exception inside torch, which
        # aborts under the preloaded ASan runtime.)
        if "libasan" not in os.environ.get("LD_PRELOAD", ""):
            with self.assertRaises(TypeError):
                t.publish(torch.tensor(3.0))

    def test_trainer_client_rank(self):
        """TrainerRank given client= opened as another rank, world size or
        model than its own rank=, world_size= and model: refused naming
        both (was: rank 1's tensors registered as rank 0's pieces of the
        layout, published, and the engines' sync failed later with "element
        ... has no producer")."""
        import wex.trainer

        model = "torch-glue-trainer-rank"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=1, world_size=2)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        segs = [(seg, base, 1 << 12)]
        for kw in ({"world_size": 2}, {"rank": 1}, {"rank": 1, "world_size": 2,
                                                    "model": "other"}):
            kw = dict(kw)
            with self.assertRaises(ValueError) as e:
                wex.trainer.TrainerRank(kw.pop("model", model), [("w", w)], client=p,
                                        segments=segs, **kw)
            self.assertIn("rank 1 of 2", str(e.exception))
        t = wex.trainer.TrainerRank(model, [("w", w)], client=p, segments=segs, rank=1,
                                    world_size=2)
        self.assertEqual(t.describe()["rank"], 1)

    def test_trainer_client_rank_types(self):
        """TrainerRank's rank= and world_size= taken as wex.Client takes
        them: a 0-d tensor or NumPy rank counts as its int (was: kept,
        describe()["rank"] a tensor); None, a bool, a float refused naming
        the argument (was, with client=: "%d format: a real number is
        required, not NoneType"); a client opened with world_size=0
        (libwex: rank 0 of 1) is rank 0 of 1 (was: refused, "rank 0 of
        0")."""
        import numpy as np
        import wex.trainer

        model = "torch-glue-trainer-types"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=1, world_size=2)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        segs = [(seg, base, 1 << 12)]
        for kw, what in (({"world_size": None, "rank": 1}, "world_size"),
                         ({"world_size": 2, "rank": None}, "rank"),
                         ({"world_size": 2, "rank": True}, "rank"),
                         ({"world_size": 2.0, "rank": 1}, "world_size")):
            with self.assertRaises(TypeError) as e:
                wex.trainer.TrainerRank(model, [("w", w)], client=p, segments=segs, **kw)
            self.assertIn("%s must be an int" % what, str(e.exception))
        t = wex.trainer.TrainerRank(model, [("w", w)], client=p, segments=segs,
                                    rank=torch.tensor(1), world_size=np.int64(2))
        self.assertEqual((type(t.describe()["rank"]), type(t.describe()["world_size"])),
                         (int, int))
        p0 = wex.Client(wex.ROLE_PRODUCER, model + "-0", rank=0, world_size=0)
        self.addCleanup(p0.close)
        seg, base = p0.segment_alloc(wex.SEG_HOST, 1 << 12)
        w = torch_util.from_ptr(base, (64,), torch.float32, "cpu")
        t = wex.trainer.TrainerRank(model + "-0", [("w", w)], client=p0,
                                    segments=[(seg, base, 1 << 12)])
        t.publish(1)
        self.assertEqual(t.describe()["version"], 1)

    def test_views_after_refetch(self):
        """View tensors kept across a sync that fetched the producers'
        memory again (the producer registered again, elsewhere): that
        sync raises WexError ESTALE naming them (the synced version in
        .result), and reading them gives zeros, not a SIGSEGV (the
        process crashed there)."""
        model = "torch-glue-refetch"
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(lambda: p.close())
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
        p.begin_write(1)
        torch_util.from_ptr(base, (64,), torch.float32, "cpu").fill_(1.0)
        p.publish(1)
        c = wex.Client(wex.ROLE_CONSUMER, model, group="keep", timeout_ms=5000)
        self.addCleanup(c.close)
        c.sync(wex.SYNC_REMAP_VIEW, 1)
        old = torch_util.view_tensors(c, device="cpu")["w"][8:]  # (a slice keeps it too)
        self.assertEqual(float(old.sum()), 56.0)
        c.release()
        p.close()
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 22)  # (mapped elsewhere)
        p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
        p.begin_write(2)
        torch_util.from_ptr(base, (64,), torch.float32, "cpu").fill_(2.0)
        p.publish(2)
        with self.assertRaises(wex.WexError) as e:
            c.sync(wex.SYNC_REMAP_VIEW, 2)
        self.assertEqual(e.exception.code, errno.ESTALE, str(e.exception))
        self.assertIn("(w)", str(e.exception))
        self.assertEqual(e.exception.result.version, 2)
        self.assertEqual(float(old.sum()), 0.0)  # zeros, no SIGSEGV
        self.assertEqual(float(torch_util.view_tensors(c, device="cpu")["w"].sum()), 128.0)
        c.sync(wex.SYNC_REMAP_VIEW, 2)  # nothing fetched again: no error
        del old

    def test_tables(self):
        """Strided and empty producer tensors, views that outlive their
        client object, and several pieces of one name."""
        import ctypes
        import gc

        p = wex.Client(wex.ROLE_PRODUCER, "torch-glue-tables", rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        buf = (ctypes.c_float * 64).from_address(base)
        for i in range(64):
            buf[i] = float(i)
        p.register_tensors([
            wex.tensor("s", "F32", (4, 4), strides=(8, 1), segment=seg, offset=0),
            wex.tensor("e", "F32", (0, 4), segment=seg, offset=4096),
            wex.tensor("w", "F32", (4,), segment=seg, offset=8192)])
        p.begin_write(1)
        p.publish(1)
        want = torch.arange(32, dtype=torch.float32).view(4, 8)[:, :4]

        def views():
            c = wex.Client(wex.ROLE_CONSUMER, "torch-glue-tables", group="views",
                           timeout_ms=5000)
            c.sync(wex.SYNC_REMAP_VIEW, 1)
            return torch_util.view_tensors(c, device="cpu")

        v = views()  # the client object is gone from here on
        gc.collect()
        self.assertTrue(torch.equal(v["s"], want), v["s"])
        self.assertEqual(v["s"].stride(), (8, 1))
        self.assertEqual(tuple(v["e"].shape), (0, 4))
        self.assertEqual(float(v["w"].sum()), 0.0)  # offset 8192: zeros
        c = wex.Client(wex.ROLE_CONSUMER, "torch-glue-tables", group="fixed", timeout_ms=5000)
        self.addCleanup(c.close)
        c.sync(wex.SYNC_REMAP_VIEW, 1)
        r = torch_util.reserve_like(c, device="cpu")
        self.assertEqual(r["s"].stride(), (8, 1))
        self.assertEqual(tuple(r["e"].shape), (0, 4))
        # The reserved tensors attach as they are, the strided one with
        # its strides and the empty one (PyTorch gives it no address)
        # included, for same-address and copy syncs.
        torch_util.attach_module(c, r.items())
        c.sync(wex.SYNC_REMAP_FIXED, 1)
        self.assertTrue(torch.equal(r["s"], want), r["s"])
        c.sync(wex.SYNC_COPY, 1)
        self.assertTrue(torch.equal(r["s"], want), r["s"])
        # An engine's strided tensors: a transpose, and a slice at an
        # offset into a wider buffer.
        wide = torch.full((6, 10), -1.0)
        own = {"s": torch.full((4, 4), -1.0).t(), "e": torch.zeros(0, 4), "w": wide[1, 3:7]}
        torch_util.attach_module(c, own.items())
        c.sync(wex.SYNC_COPY, 1)
        self.assertTrue(torch.equal(own["s"], want), own["s"])
        self.assertEqual(float(own["w"].abs().sum()), 0.0)
        self.assertEqual(float(wide.sum()), -56.0)  # nothing else written
        own = {"s": torch.full((6, 4), -1.0)[1:5], "w": wide[2:6, 0]}
        torch_util.attach_module(c, own.items())
        c.sync(wex.SYNC_COPY, 1)
        self.assertTrue(torch.equal(own["s"], want), own["s"])
        self.assertEqual(float(own["w"].abs().sum()), 0.0)
        # Two pieces of one name cannot be a dict entry: refused, named.
        q = wex.Client(wex.ROLE_PRODUCER, "torch-glue-pieces", rank=0, world_size=1)
        self.addCleanup(q.close)
        seg, base = q.segment_alloc(wex.SEG_HOST, 1 << 16)
        q.register_tensors([
            wex.tensor("w", "F32", (4, 4), start=(0, 0), extent=(2, 4), segment=seg, offset=0),
            wex.tensor("w", "F32", (4, 4), start=(2, 0), extent=(2, 4), segment=seg,
                       offset=4096)])
        q.begin_write(1)
        q.publish(1)
        k = wex.Client(wex.ROLE_CONSUMER, "torch-glue-pieces", group="g", timeout_ms=5000)
        self.addCleanup(k.close)
        k.sync(wex.SYNC_REMAP_VIEW, 1)
        with self.assertRaisesRegex(ValueError, "several pieces of w"):
            torch_util.view_tensors(k, device="cpu")

    def test_register_module_segments(self):
        """register_module over segments the producer registered itself
        (here a host segment; on a GPU, wex_cuda_alloc memory): strided
        tensors go with their strides and reach an engine exact, by view
        and by copy; empty ones are left out (only empty ones: an empty
        table, no segment); overlapping ones and ones outside the
        segments are refused."""
        p = wex.Client(wex.ROLE_PRODUCER, "torch-glue-regmod", rank=0, world_size=1)
        self.addCleanup(p.close)
        size = 1 << 16
        seg, base = p.segment_alloc(wex.SEG_HOST, size)
        buf = torch_util.from_ptr(base, (size // 4,), torch.float32, "cpu")
        mine = {"t": buf[:512].view(16, 32).t(),                # strides (1, 32)
                "c": buf[1024:1088].view(8, 8)[:, 2:6],         # a slice of a wider row
                "x": buf[2048:2058],                            # contiguous at an offset
                "e": buf[4096:4096].view(0, 4)}                 # empty
        segs = [(seg, base, size)]
        with self.assertRaisesRegex(ValueError, "o has overlapping elements"):
            torch_util.register_module(p, [("o", buf[:4].expand(4, 4))], segments=segs)
        with self.assertRaisesRegex(ValueError, "is in none of the segments given"):
            torch_util.register_module(p, [("f", torch.zeros(4))], segments=segs)
        e = wex.Client(wex.ROLE_PRODUCER, "torch-glue-regmod-empty", rank=0, world_size=1)
        self.addCleanup(e.close)
        self.assertEqual(torch_util.register_module(e, [("e", mine["e"])], segments=segs), [])
        got = torch_util.register_module(p, mine.items(), segments=segs)
        self.assertEqual(got, [(seg, base, size)])
        g = torch.Generator().manual_seed(7)
        p.begin_write(1)
        for t in mine.values():
            t.copy_(torch.randn(t.shape, generator=g))
        p.publish(1)
        want = {n: t.clone() for n, t in mine.items() if n != "e"}
        c = wex.Client(wex.ROLE_CONSUMER, "torch-glue-regmod", group="g", timeout_ms=5000)
        self.addCleanup(c.close)
        c.sync(wex.SYNC_REMAP_VIEW, 1)
        v = torch_util.view_tensors(c, device="cpu")
        self.assertEqual(sorted(v), ["c", "t", "x"])
        for n, w in want.items():
            self.assertTrue(torch.equal(v[n], w), n)
        self.assertEqual(v["t"].stride(), (1, 32))
        own = {n: torch.full(tuple(w.shape), -1.0) for n, w in want.items()}
        torch_util.attach_module(c, own.items())
        c.sync(wex.SYNC_COPY, 1)
        for n, w in want.items():
            self.assertTrue(torch.equal(own[n], w), n)

    def test_register_ranges(self):
        """register_module's default path registers only the bytes under
        the tensors: per allocator segment, their spans with gaps under
        the merge gap closed, split at larger gaps, never across a
        segment's end; each tensor's table offset is from its range."""
        self.assertEqual(torch_util.merge_spans([(50, 60), (0, 10), (12, 20), (30, 40)], 5),
                         [(0, 20), (30, 40), (50, 60)])
        self.assertEqual(torch_util.merge_spans([(0, 100), (10, 20), (99, 120)], 1),
                         [(0, 120)])
        buf = torch.zeros(4096, dtype=torch.float32)  # 16 KiB standing for two segments
        base = buf.data_ptr()
        segs = [(base, 8192), (base + 8192, 8192)]
        items = [("a", buf[0:64]),                     # 0..256
                 ("b", buf[80:144]),                   # 320..576: 64 B gap, merged
                 ("t", buf[512:576].view(8, 8).t()),   # 2048..2304: strided, own range
                 ("c", buf[2048:2112]),                # 8192.. (second segment, at its start:
                 ("e", buf[0:0])]                      # not merged with t across the end)
        placed = torch_util._placed(items, segs, "nowhere")
        self.assertEqual([n for n, *_ in placed], ["a", "b", "t", "c"])

        class Recorder:
            def __init__(self):
                self.calls = []

            def register_ptr(self, kind, ptr, size):
                self.calls.append((kind, ptr - base, size))
                return 100 + len(self.calls)

        rec = Recorder()
        used, moved = torch_util._register_ranges(rec, wex.SEG_CUDA_VMM, placed, gap=1024)
        self.assertEqual(rec.calls, [(wex.SEG_CUDA_VMM, 0, 576), (wex.SEG_CUDA_VMM, 2048, 256),
                                     (wex.SEG_CUDA_VMM, 8192, 256)])
        where = {n: (used[r], p - r[0]) for n, _, p, _, _, r in moved}
        self.assertEqual(where, {"a": (101, 0), "b": (101, 320), "t": (102, 0), "c": (103, 0)})
        # One gap wide enough to merge everything in a segment.
        rec = Recorder()
        torch_util._register_ranges(rec, wex.SEG_CUDA_VMM, placed, gap=1 << 20)
        self.assertEqual([c[1:] for c in rec.calls], [(0, 2304), (8192, 256)])
        with self.assertRaisesRegex(ValueError, r"^x \(0x[0-9a-f]+, 40 bytes\) is in nowhere$"):
            torch_util._placed([("x", torch.zeros(10))], segs, "nowhere")

    def test_register_ranges_small_chunks(self):
        """In an expandable segment of PyTorch's small pool (2 MiB chunks:
        CUDACachingAllocator's kSmallBuffer), parameters 3 MiB apart are
        two ranges: a gap of a chunk or more may hold whole chunks with no
        parameter, and PyTorch unmaps such chunks (empty_cache(), or its retry when an
        allocation runs out of memory), which a range over them would have
        wex hold and begin_write refuse as moved memory.  In a large
        expandable segment (20 MiB chunks) and in one allocation (MemPool,
        cudaMalloc) they stay one range.  The allocator's segments come
        from torch.cuda.memory_snapshot(), stood in for here."""
        buf = torch.zeros(4 << 20, dtype=torch.uint8)   # 4 MiB standing for segments
        base, mib = buf.data_ptr(), 1 << 20
        snap = [{"device": 0, "address": base, "total_size": 4 * mib, "segment_type": kind,
                 "is_expandable": exp} for kind, exp in (("small", True),)]
        items = [("a", buf[0:1024]), ("b", buf[3 * mib:3 * mib + 1024])]

        class Recorder:
            def __init__(self):
                self.calls = []

            def register_ptr(self, kind, ptr, size):
                self.calls.append((ptr - base, size))
                return len(self.calls)

        had = getattr(torch.cuda, "memory_snapshot", None)
        self.addCleanup(setattr, torch.cuda, "memory_snapshot", had)
        want = {("small", True): [(0, 1024), (3 * mib, 1024)],
                ("large", True): [(0, 3 * mib + 1024)],
                ("large", False): [(0, 3 * mib + 1024)],
                ("small", False): [(0, 3 * mib + 1024)]}
        for (kind, exp), ranges in want.items():
            snap[0].update(segment_type=kind, is_expandable=exp)
            torch.cuda.memory_snapshot = lambda: [dict(snap[0]), dict(snap[0], device=1)]
            placed = torch_util._placed(items, torch_util._segments(0), "nowhere")
            rec = Recorder()
            torch_util._register_ranges(rec, wex.SEG_CUDA_VMM, placed)
            self.assertEqual(rec.calls, ranges, (kind, exp))

    def test_attach_keeps(self):
        """attach_module keeps the tensors copy syncs write into alive (a
        temporary, e.g. a .contiguous() copy, would otherwise be freed
        memory that the next sync writes into) until the next attach or
        close(), but not those over the client's own reserved regions: the
        client can still be collected."""
        import gc
        import weakref

        p = wex.Client(wex.ROLE_PRODUCER, "torch-glue-keep", rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        p.register_tensors([wex.tensor("w", "F32", (64, 32), segment=seg)])
        src = torch_util.from_ptr(base, (64, 32), torch.float32, "cpu")
        p.begin_write(1)
        src.copy_(torch.arange(64 * 32, dtype=torch.float32).view(64, 32))
        p.publish(1)
        want = src.clone()
        c = wex.Client(wex.ROLE_CONSUMER, "torch-glue-keep", group="keep", timeout_ms=5000)
        self.addCleanup(c.close)

        def attach_temporary():
            t = torch.zeros(32, 64).t().contiguous()  # the engine's copy
            torch_util.attach_module(c, [("w", t)])
            return weakref.ref(t)

        ref = attach_temporary()
        gc.collect()
        self.assertIsNotNone(ref(), "the attached tensor was freed")
        c.sync(wex.SYNC_COPY, 1)
        self.assertTrue(torch.equal(ref(), want))
        # A new attach lets the old tensors go; close() lets the new ones go.
        ref2 = attach_temporary()
        gc.collect()
        self.assertIsNone(ref())
        self.assertIsNotNone(ref2())
        c.close()
        gc.collect()
        self.assertIsNone(ref2())

        # Reserved tensors attached to their own client: no cycle.
        def fixed():
            k = wex.Client(wex.ROLE_CONSUMER, "torch-glue-keep", group="fixed",
                           timeout_ms=5000)
            k.sync(wex.SYNC_REMAP_VIEW, 1)
            r = torch_util.reserve_like(k, device="cpu")
            torch_util.attach_module(k, r.items())
            k.sync(wex.SYNC_REMAP_FIXED, 1)
            self.assertTrue(torch.equal(r["w"], want))
            return weakref.ref(k)

        kref = fixed()
        gc.collect()
        self.assertIsNone(kref(), "the client of reserved tensors was never collected")

    def arange_consumer(self, model):
        """A consumer of `model`, whose one producer rank published v1: a
        tensor "w" of 64 F32, 0 to 63 (both closed at cleanup)."""
        p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1)
        self.addCleanup(p.close)
        seg, base = p.segment_alloc(wex.SEG_HOST, 1 << 16)
        p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
        p.begin_write(1)
        torch_util.from_ptr(base, (64,), torch.float32, "cpu").copy_(torch.arange(64.0))
        p.publish(1)
        c = wex.Client(wex.ROLE_CONSUMER, model, group="g", timeout_ms=5000)
        self.addCleanup(c.close)
        return c

    def test_attach_threads(self):
        """attach_module from two threads on one client: the tensors kept
        are those of the table attached last (before, a thread could keep
        its tensors after the other's table was attached: a copy sync
        then wrote into memory nothing kept, and the kept tensors were
        never written).  Each attach pauses once attached, the widest
        window there is; the sync then fills the tensors kept."""
        c = self.arange_consumer("torch-glue-threads")
        real = c.attach
        tables = []
        first_in = threading.Event()

        def attach(table):
            real(table)
            tables.append(table[0].ptr)
            if threading.current_thread().name == "first":
                first_in.set()
                time.sleep(0.5)  # (the other thread's attach_module comes here)

        c.attach = attach
        mine = {"first": torch.zeros(64), "second": torch.zeros(64)}

        def run():
            torch_util.attach_module(c, [("w", mine[threading.current_thread().name])])

        a = threading.Thread(target=run, name="first")
        a.start()
        self.assertTrue(first_in.wait(10))
        b = threading.Thread(target=run, name="second")
        b.start()
        a.join(10)
        b.join(10)
        del c.attach
        self.assertEqual(len(tables), 2)
        kept = [t.data_ptr() for _, t in c._attached]
        self.assertEqual(kept, [tables[-1]], "the tensors kept are not the table attached")
        c.sync(wex.SYNC_COPY, 1)
        last = [t for t in mine.values() if t.data_ptr() == tables[-1]][0]
        self.assertTrue(torch.equal(last, torch.arange(64.0)))

    def test_attach_interrupted(self):
        """An attach_module whose attach libwex made, interrupted as the
        call returned (a signal's handler raising there: Ctrl-C's
        KeyboardInterrupt), keeps the storage of the table libwex then
        holds (before: the client kept only that of the attach before;
        the caller's tensors let go of, the next copy sync wrote into
        memory nothing kept).  An attach libwex refused keeps what was
        kept (its table stays attached)."""
        import gc

        c = self.arange_consumer("torch-glue-intr")
        torch_util.attach_module(c, [("w", torch.zeros(64))])
        first = [t.data_ptr() for _, t in c._attached]
        real = c.attach

        def attach(table):
            real(table)
            raise KeyboardInterrupt  # (as the C call returned)

        c.attach = attach
        mine = torch.zeros(64)
        ptr = mine.data_ptr()
        with self.assertRaises(KeyboardInterrupt):
            torch_util.attach_module(c, [("w", mine)])
        del c.attach
        kept = [t.data_ptr() for _, t in c._attached]
        self.assertIn(ptr, kept, "the attached table's storage is not kept")
        # Refused by libwex (two tensors overlapping): as before.
        both = torch.zeros(64)
        with self.assertRaises(wex.WexError):
            torch_util.attach_module(c, [("w", both), ("v", both[1:])])
        self.assertEqual([t.data_ptr() for _, t in c._attached], kept)
        del mine
        gc.collect()
        c.sync(wex.SYNC_COPY, 1)
        got = [t for _, t in c._attached if t.data_ptr() == ptr][0]
        self.assertTrue(torch.equal(got, torch.arange(64.0)))
        self.assertTrue(first)

    def test_refusals(self):
        with self.assertRaises(ValueError):
            torch_util.wex_dtype(torch.complex64)
        with self.assertRaises(ValueError):
            torch_util.torch_dtype("INVALID")
        # No tensor at address 0 or -1 (read, it crashed the process), nor
        # at an address given as something else than an int.
        for ptr, exc in ((0, ValueError), (-1, ValueError), (None, TypeError),
                         (1.5, TypeError)):
            with self.assertRaisesRegex(exc, "from_ptr"):
                torch_util.from_ptr(ptr, (4,), torch.float32, "cpu")
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="refusals")
        self.addCleanup(c.close)
        # Elements sharing an address cannot each receive their own bytes.
        with self.assertRaisesRegex(ValueError, "w has overlapping elements"):
            torch_util.attach_module(c, [("w", torch.zeros(4).expand(4, 4))])
        with self.assertRaisesRegex(ValueError, "v has overlapping elements"):
            torch_util.attach_module(c, [("v", torch.zeros(16).as_strided((4, 4), (1, 2)))])
        # Strides not nested whose elements are all apart: taken (offsets
        # 0 3 2 5 4 7); too many elements to compare one by one: refused
        # as possibly overlapping.
        self.assertEqual(torch_util._table_strides("u", torch.zeros(8).as_strided((3, 2), (2, 3))),
                         (2, 3))
        big = torch.zeros(1025 * 1025).as_strided((1025, 1025), (1, 1024))
        with self.assertRaisesRegex(ValueError, "big has strides that are not nested"):
            torch_util._table_strides("big", big)
        # libwex's wex_attach refuses the same tensors in the same words
        # (a table made without the glue), and two tensors sharing bytes
        # (one storage under two names), naming both; the copy wrote them
        # over each other and every verified sync failed.
        for name, t in (("w", torch.zeros(4).expand(4, 4)),
                        ("v", torch.zeros(16).as_strided((4, 4), (1, 2))), ("big", big)):
            with self.assertRaises(ValueError) as glue:
                torch_util._table_strides(name, t)
            with self.assertRaises(wex.WexError) as e:
                c.attach([wex.tensor(name, "F32", t.shape, strides=t.stride(),
                                     ptr=t.data_ptr())])
            self.assertEqual(e.exception.code, errno.EINVAL)
            self.assertIn("tensor '%s' %s" % (name, str(glue.exception)[len(name) + 1:]),
                          str(e.exception))
        # A view PyTorch negates as it reads it (complex.conj().imag): its
        # memory holds the values unnegated, which a copy would move.
        neg = torch.complex(torch.zeros(4), torch.ones(4)).conj().imag
        self.assertTrue(neg.is_neg())
        with self.assertRaisesRegex(ValueError, "neg is a view PyTorch negates"):
            torch_util.attach_module(c, [("neg", neg)])
        x = torch.zeros(4, 4)
        # One tensor under two names (tied weights) is taken; another view
        # of the same storage is not.
        torch_util.attach_module(c, [("w", x), ("tied", x)])
        with self.assertRaisesRegex(wex.WexError, "tensors '(w|tied)' .* and '(w|tied)' .*overlap"):
            torch_util.attach_module(c, [("w", x), ("tied", x.t())])
        with self.assertRaisesRegex(wex.WexError, "tensors 'w' .* and 'x' .*overlap"):
            torch_util.attach_module(c, [("w", x[:2]), ("x", x[1:])])
        p = wex.Client(wex.ROLE_PRODUCER, "torch-glue-cpu", rank=0, world_size=1)
        self.addCleanup(p.close)
        with self.assertRaisesRegex(ValueError, "CUDA device"):
            torch_util.register_module(p, [("w", torch.zeros(4))])
        with self.assertRaisesRegex(ValueError, "no tensors"):
            torch_util.register_module(p, [])
        # A dict (state_dict()) is taken as its items; a NumPy array or a
        # bare tensor in place of a pair is a TypeError naming it (before:
        # "not enough values to unpack", or AttributeError: 'str' or
        # 'numpy.ndarray' object has no attribute 'detach').
        import numpy
        own = {"w": torch.zeros(4, 4), "wt": torch.zeros(4, 4)}
        torch_util.attach_module(c, own)
        self.assertEqual([id(held) for held, _ in c._attached], [id(t) for t in own.values()])
        with self.assertRaisesRegex(TypeError, "attach_module: w is a ndarray, not a torch.Tensor"):
            torch_util.attach_module(c, [("w", numpy.zeros((4, 4), numpy.float32))])
        with self.assertRaisesRegex(TypeError, "register_module: expected .name, tensor. pairs"):
            torch_util.register_module(p, [torch.zeros(4)])
        with self.assertRaisesRegex(ValueError, "CUDA device"):
            torch_util.register_module(p, {"w": torch.zeros(4)})

    # torch's C++ exceptions (a wrapper subclass's storage) abort under the
    # ASan runtime preloaded into Python (its __cxa_throw interceptor finds
    # no real one): the build without sanitizers runs this.
    @unittest.skipIf("libasan" in os.environ.get("LD_PRELOAD", ""),
                     "torch's C++ exceptions abort under the preloaded ASan runtime")
    def test_trainer_framework_tensors(self):
        """What Megatron-Core trainers hold, read against its source: an FP8
        parameter (Transformer Engine's Float8Tensor, --fp8-param-gather: a
        wrapper subclass, BF16 by dtype over 1-byte FP8 storage) is refused
        naming it, not registered as BF16 over the wrong bytes; a DeepSeek-V3
        layout's router.expert_bias, a buffer in Megatron's TopKRouter (never
        in named_parameters()), is named as missing with where to find it, and
        one registered still bf16 (Float16Module's cast, before the router's
        first forward makes it fp32 again) is refused saying so."""

        class Fake8(torch.Tensor):
            @staticmethod
            def __new__(cls, data):
                r = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=torch.bfloat16,
                                                        device=data.device)
                r._data = data
                return r

            __torch_function__ = torch._C._disabled_torch_function_impl

            @classmethod
            def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.detach.default:
                    return args[0]
                raise NotImplementedError(func)

        class NoClient:
            def register_tensors(self, t):
                raise AssertionError("registered %d tensors" % len(t))

        buf = torch.zeros(4096, dtype=torch.uint8)
        segs = [(1, buf.data_ptr(), 4096)]
        with self.assertRaisesRegex(ValueError, "linear_fc1.weight .*Fake8.*no storage of its own"):
            torch_util.register_module(NoClient(), [("linear_fc1.weight",
                                                     Fake8(buf[:64].view(8, 8)))], segments=segs)
        cfg = {"model_type": "deepseek_v3", "hidden_size": 16, "num_hidden_layers": 2,
               "num_attention_heads": 4, "intermediate_size": 24, "moe_intermediate_size": 8,
               "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
               "q_lora_rank": 12, "kv_lora_rank": 8, "qk_nope_head_dim": 4,
               "qk_rope_head_dim": 2, "v_head_dim": 4, "vocab_size": 128,
               "torch_dtype": "bfloat16"}
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        lay = wex.Layout(path, "megatron:tp=1")
        phys = torch_util.layout_tensors(lay, 0)
        params = [(n, t) for n, t in phys.items() if not n.endswith("router.expert_bias")]
        with self.assertRaisesRegex(ValueError, "missing decoder.layers.1.mlp.router.expert_bias"
                                    ".*named_buffers"):
            torch_util.register_module(NoClient(), params, layout=lay, rank=0, segments=segs)
        # Registered before the first forward, the buffer is still the
        # bf16 Float16Module cast it to: refused, saying when it is fp32.
        bias = "decoder.layers.1.mlp.router.expert_bias"
        params = [(n, t.bfloat16() if n == bias else t) for n, t in phys.items()]
        with self.assertRaisesRegex(ValueError, bias + ": dtype BF16, the layout .* has F32.*"
                                    "first forward"):
            torch_util.register_module(NoClient(), params, layout=lay, rank=0, segments=segs)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer()
        sys.exit(0)
    unittest.main(verbosity=2)
