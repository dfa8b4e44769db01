#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""handle_test - what owns a libwex handle in the Python glue (wex.Client,
wex.Layout): copy.copy, copy.deepcopy and pickle refuse it with a TypeError
(a shallow copy held the same handle: closing one left the other using the
freed client or layout, and the second close freed it again: glibc aborted
the process, "double free"), and a Layout whose lock a thread of the parent
held across a fork answers in the child (rank() waited for ever there).
Environment: WEX_LIB, WEXD_BIN, PYTHONPATH with adapters/python and
tests/python."""
import copy
import ctypes
import json
import os
import pickle
import shutil
import signal
import tempfile
import threading
import unittest

import wex
from wexd_harness import start_wexd

# A small qwen2 (adapters/families), as layout_glue_test's.
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 128, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "max_position_embeddings": 256,
    "rope_theta": 1000000.0,
}


class Handles(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="wex-py-handle-")
        cls.cfg = os.path.join(cls.dir, "config.json")
        with open(cls.cfg, "w") as f:
            json.dump(CONFIG, f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir)

    def refused(self, obj, forget):
        """Each way of copying obj raises TypeError; where one made a copy
        instead, forget(copy) keeps its collection from freeing the
        handle again (the process would abort before the failure shows)."""
        for what, how in (("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy),
                          ("pickle", lambda o: pickle.loads(pickle.dumps(o)))):
            with self.subTest(what):
                try:
                    dup = how(obj)
                except TypeError as e:
                    self.assertIn("handle", str(e))
                    continue
                except Exception as e:
                    self.fail("%s of a %s raised %s: %s, not a TypeError"
                              % (what, type(obj).__name__, type(e).__name__, e))
                forget(dup)
                self.fail("%s of a %s made a copy holding the same handle"
                          % (what, type(obj).__name__))

    def test_layout_copy(self):
        lay = wex.Layout(self.cfg, "vllm:tp=2")
        self.addCleanup(lay.close)

        def forget(dup):
            dup.handle = ctypes.c_void_p()
        self.refused(lay, forget)
        self.assertEqual(len(lay.rank(0)), len(lay.rank(1)))

    def test_client_copy(self):
        sock = os.path.join(self.dir, "wexd.sock")
        wexd = start_wexd(dict(os.environ, WEX_SOCKET=sock))
        self.addCleanup(wexd.wait)
        self.addCleanup(wexd.kill)
        c = wex.Client(wex.ROLE_ADMIN, socket=sock)
        self.addCleanup(c.close)

        def forget(dup):
            dup._h = None
        self.refused(c, forget)
        self.assertTrue(c.request("status")["ok"])

    def test_layout_fork(self):
        """A child forked while another thread of the parent is in a
        Layout's rank() (holding its lock, as here) calls rank() on its
        copy."""
        lay = wex.Layout(self.cfg, "vllm:tp=2")
        self.addCleanup(lay.close)
        held, done = threading.Event(), threading.Event()

        def hold():
            with lay._lock:
                held.set()
                done.wait(30)
        t = threading.Thread(target=hold)
        t.start()
        self.addCleanup(t.join)
        self.addCleanup(done.set)
        held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 9
            try:
                signal.alarm(10)  # (the hang: killed by SIGALRM)
                code = 0 if len(lay.rank(1)) > 0 else 1
                lay.close()
            finally:
                os._exit(code)
        _, st = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(st), 0,
                         "Layout.rank() in a forked child: it hung (-14: SIGALRM)")


if __name__ == "__main__":
    unittest.main()
