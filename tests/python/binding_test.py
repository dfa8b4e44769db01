#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""binding_test - the Python glue (adapters/python/wex) over libwex, end to
end through a real wexd, with no torch: a producer process (this script,
"producer") registers two tensors and publishes versions whose bytes derive
from the version; the test, a consumer, checks every byte in REMAP_VIEW,
COPY and REMAP_FIXED mode, that a verified copy sync (verify=True) finds a
byte changed in the engine's buffers, that begin_write waits for its remap lease, and
that bad input raises WexError / ValueError with the cause, and that
wex.cuda_alloc without a CUDA driver raises ENOCUDA saying so.

WEX_PY_KIND=host (default) uses host segments; WEX_PY_KIND=vmm uses
wex_cuda_alloc + register_ptr(WEX_SEG_CUDA_VMM) on the producer and
wex_cuda_alloc'd copy targets on the consumer, meant to run against
tests/gpu/emul_cuda.c ($WEX_CUDA_LIB), whose device memory the CPU can read.
Environment: WEX_LIB (libwex.so), WEXD_BIN, PYTHONPATH with adapters/python.
"""
import contextlib
import ctypes
import errno
import os
import pathlib
import select
import signal
import sys
import threading
import time
import unittest
import warnings

import wex
from wexd_harness import WexdProducerCase

MODEL = "pyglue"
SEG_SIZE = 4 << 20
KIND = os.environ.get("WEX_PY_KIND", "host")
# (name, dtype, shape, offset): "a" bf16, "b" f32 at 1 MiB (another page).
TENSORS = (("layers.0.a", "BF16", (256, 1024), 0), ("layers.0.b", "F32", (1000,), 1 << 20))


def nbytes(dtype, shape):
    n = wex.DTYPE_SIZE[dtype]
    for s in shape:
        n *= s
    return n


def pattern(version, idx, n):
    """The bytes of tensor idx at version: a byte ramp seeded by both."""
    seed = (version * 31 + idx * 7) & 0xFF
    ramp = bytes((seed + i) & 0xFF for i in range(256))
    return (ramp * (n // 256 + 1))[:n]


def producer():
    c = wex.Client(wex.ROLE_PRODUCER, MODEL, rank=0, world_size=1)
    if KIND == "vmm":
        base = wex.cuda_alloc(SEG_SIZE, 0)
        seg = c.register_ptr(wex.SEG_CUDA_VMM, base, SEG_SIZE)
    else:
        seg, base = c.segment_alloc(wex.SEG_HOST, SEG_SIZE)
    c.register_tensors([wex.tensor(n, d, s, segment=seg, offset=o) for n, d, s, o in TENSORS])
    for line in sys.stdin:
        v = int(line)
        c.begin_write(v, 20000)
        for i, (_, d, s, o) in enumerate(TENSORS):
            n = nbytes(d, s)
            ctypes.memmove(base + o, pattern(v, i, n), n)
        c.publish(v)
        print("published %d" % v, flush=True)
    c.close()
    if KIND == "vmm":
        wex.cuda_free(base, SEG_SIZE, 0)


class Binding(WexdProducerCase):
    def check_bytes(self, v, ptrs):
        for i, (n, d, s, _) in enumerate(TENSORS):
            got = ctypes.string_at(ptrs[n], nbytes(d, s))
            self.assertEqual(got, pattern(v, i, len(got)), "%s at v%d" % (n, v))

    def test_modes(self):
        self.publish(1)
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="g", timeout_ms=10000)
        self.addCleanup(c.close)

        # View: pointers into the producer's memory.
        r = c.sync(wex.SYNC_REMAP_VIEW)
        self.assertEqual((r.version, r.changed), (1, 1))
        table, nprod = c.producer_tensors(0)
        self.assertEqual(nprod, 1)
        self.assertEqual([t.name.decode() for t in table], [n for n, *_ in TENSORS])
        self.assertEqual([(t.dtype_name, t.dims("shape"), t.offset) for t in table],
                         [(d, s, o) for _, d, s, o in TENSORS])
        views = {}
        for n, d, s, _ in TENSORS:
            views[n], desc = c.view(n)
            self.assertEqual(desc.nbytes(), nbytes(d, s))
        self.check_bytes(1, views)

        # Copy into the consumer's own buffers (same version: lease kept).
        own, keep = {}, []
        for n, d, s, _ in TENSORS:
            if KIND == "vmm":
                own[n] = wex.cuda_alloc(nbytes(d, s), 0)
                self.addCleanup(wex.cuda_free, own[n], nbytes(d, s), 0)
            else:
                buf = ctypes.create_string_buffer(nbytes(d, s))
                keep.append(buf)
                own[n] = ctypes.addressof(buf)
        c.attach([wex.tensor(n, d, s, ptr=own[n]) for n, d, s, _ in TENSORS])
        r = c.sync(wex.SYNC_COPY, min_version=1)
        self.assertEqual(r.version, 1)
        self.assertEqual(r.bytes, sum(nbytes(d, s) for _, d, s, _ in TENSORS))
        self.check_bytes(1, own)
        self.assertFalse(c.is_dirty())

        # Verified: every byte compared; one the engine changed is found.
        total = sum(nbytes(d, s) for _, d, s, _ in TENSORS)
        r = c.sync(wex.SYNC_COPY, min_version=1, verify=True)
        self.assertEqual((r.verified, r.changed), (total, 0))
        b = own["layers.0.b"] + 12
        ctypes.memmove(b, bytes([ctypes.string_at(b, 1)[0] ^ 0xFF]), 1)
        with self.assertRaises(wex.WexError) as e:
            c.sync(wex.SYNC_COPY, min_version=1, verify=True)
        self.assertEqual(e.exception.code, wex.EVERIFY)
        self.assertIn("'layers.0.b' (piece 1 of this rank, F32) at byte 12 ", str(e.exception))
        self.assertTrue(c.is_dirty())
        r = c.sync(wex.SYNC_COPY, min_version=1, verify=True)
        self.assertEqual((r.verified, r.changed), (total, 1))
        self.check_bytes(1, own)
        self.assertFalse(c.is_dirty())
        with self.assertRaises(wex.WexError) as e:
            c.sync(wex.SYNC_REMAP_VIEW, min_version=1, verify=True)
        self.assertEqual(e.exception.code, errno.EINVAL)

        # A remap lease holds the producer's next write until released.
        r = c.sync(wex.SYNC_REMAP_VIEW, min_version=1)
        self.prod.stdin.write("2\n")
        self.prod.stdin.flush()
        ready, _, _ = select.select([self.prod.stdout], [], [], 0.5)
        self.assertFalse(ready, "the producer wrote v2 under a remap lease")
        c.release()
        self.assertEqual(self.prod.stdout.readline().strip(), "published 2")

        # Same address: reserved regions replaced by the producer's memory.
        r = c.sync(wex.SYNC_REMAP_VIEW, min_version=2)
        self.check_bytes(2, {n: c.view(n)[0] for n, *_ in TENSORS})
        base = c.reserve(0, table[0].segment, SEG_SIZE)
        fixed = {n: base + o for n, _, _, o in TENSORS}
        c.attach([wex.tensor(n, d, s, ptr=fixed[n]) for n, d, s, _ in TENSORS])
        r = c.sync(wex.SYNC_REMAP_FIXED, min_version=2)
        self.assertEqual(r.version, 2)
        self.check_bytes(2, fixed)
        # Copy again, now into the reserved region (private memory again).
        r = c.sync(wex.SYNC_COPY, min_version=2)
        self.check_bytes(2, fixed)
        # A copy's lease ends with the copy.
        with self.assertRaises(wex.WexError) as e:
            c.release()
        self.assertEqual(e.exception.code, errno.ENOENT)

        st = c.request("status")
        self.assertTrue(st["ok"])
        self.assertIn(MODEL, [m["name"] for m in st["models"]])

    def waiting_sync(self, c, out):
        """A thread whose sync of c waits for a version never published
        (30 s at most); what it returned or raised goes in out["r"]."""
        def sync():
            try:
                out["r"] = c.sync(wex.SYNC_REMAP_VIEW, min_version=1 << 40, timeout_ms=30000)
            except wex.WexError as e:
                out["r"] = e
        t = threading.Thread(target=sync, daemon=True)
        t.start()
        return t

    def test_cancel(self):
        """Client.cancel() from another thread ends a sync's wait for a
        version: WexError ECANCELED there; idle or closed: False."""
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="cancel", timeout_ms=10000)
        self.assertFalse(c.cancel())
        out = {}

        t = self.waiting_sync(c, out)
        t0 = time.monotonic()
        # Once wexd lists it waiting: the cancel ends wexd's wait.
        self.await_acquire("cancel")
        self.assertTrue(c.cancel())
        t.join(10)
        self.assertFalse(t.is_alive(), "the cancelled sync still waits")
        self.assertIsInstance(out["r"], wex.WexError)
        self.assertEqual(out["r"].code, errno.ECANCELED)
        self.assertIn("cancelled by the client", str(out["r"]))
        self.assertLess(time.monotonic() - t0, 10)
        self.assertFalse(c.cancel())
        c.close()
        self.assertFalse(c.cancel())
        # close() while a sync waits in another thread: the wait is
        # cancelled (it held the client's lock: close waited its timeout).
        # First a close deferred for a live tensor over the client's
        # memory (a stand-in holder here): it cancels nothing, the sync
        # waits on (the close waits for the call, as before, then defers).
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="cancel-close", timeout_ms=10000)
        holder = type("Holder", (), {})()
        c._track(holder)
        out.clear()
        t = self.waiting_sync(c, out)
        t0 = time.monotonic()
        self.await_acquire("cancel-close")

        def deferred_close():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                c.close()
        closer = threading.Thread(target=deferred_close, daemon=True)
        closer.start()
        t.join(0.5)
        self.assertTrue(t.is_alive(), "a deferred close cancelled the sync: %r" % out.get("r"))
        self.assertTrue(c.cancel())
        t.join(10)
        closer.join(10)
        self.assertFalse(t.is_alive() or closer.is_alive())
        self.assertIsNotNone(c._h, "closed under a live tensor")
        self.assertEqual(out["r"].code, errno.ECANCELED)
        # close(force=True) while a sync waits: cancelled, closed.
        out.clear()
        t = self.waiting_sync(c, out)
        t0 = time.monotonic()
        self.await_acquire("cancel-close")
        c.close(force=True)
        self.assertIsNone(c._h)
        self.assertLess(time.monotonic() - t0, 10, "close() waited for the sync's timeout")
        t.join(10)
        self.assertIsInstance(out["r"], wex.WexError)
        self.assertEqual(out["r"].code, errno.ECANCELED)
        self.assertFalse(c.cancel())
        del holder

    def test_fork_while_waiting(self):
        """A child forked while a thread of the parent waits in a sync of
        a client: the child's calls on its copy refuse (WexError ECHILD)
        and its close() frees the copy (both waited for ever on the
        client's lock, which the parent's thread held)."""
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="fork", timeout_ms=10000)
        self.addCleanup(c.close)
        out = {}
        t = self.waiting_sync(c, out)
        self.await_acquire("fork")
        pid = os.fork()
        if pid == 0:
            code = 9
            try:
                signal.alarm(10)  # (the hang: killed by SIGALRM)
                try:
                    c.is_dirty()
                    code = 1
                except wex.WexError as err:
                    code = 0 if err.code == errno.ECHILD else 2
                c.close()
            finally:
                os._exit(code)
        _, st = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(st), 0,
                         "a call or close() in the forked child: not WexError(ECHILD), "
                         "or it hung (-14: SIGALRM)")
        self.assertTrue(c.cancel())
        t.join(10)
        self.assertEqual(out["r"].code, errno.ECANCELED)

    def test_view_bytes_names(self):
        """Names given as bytes, as a Tensor holds them (producer_tensors'
        .name), are taken as str ones are (AttributeError before); other
        types are a TypeError."""
        c = wex.Client(wex.ROLE_CONSUMER, MODEL.encode(), group=b"bytes", timeout_ms=5000)
        self.addCleanup(c.close)
        # (After test_modes, whose versions go up to 3.)
        self.publish(10)
        c.sync(wex.SYNC_REMAP_VIEW, min_version=10)
        table, _ = c.producer_tensors(0)
        for t in table:
            ptr, desc = c.view(t.name)
            self.assertEqual((ptr, desc.name), c.view(t.name.decode())[0:1] + (t.name,))
        c.release()
        self.assertTrue(c.request(b"status")["ok"])
        with self.assertRaisesRegex(TypeError, "tensor name must be str or bytes"):
            c.view(7)
        with self.assertRaisesRegex(TypeError, "model must be str or bytes"):
            wex.Client(wex.ROLE_CONSUMER, 7)

    def test_tensor_finalizer(self):
        """The last tensor over a client's memory, dropped while a sync of
        that client waits in another thread, is let go at once (its
        finalizer waited for that sync: 5.5 s of a 6 s wait); the close
        deferred for it is made once the sync returns.  A finalizer run
        inside cancel() (the collector runs where Python allocates) does
        not deadlock on the handle's lock."""
        import gc
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="finalizer", timeout_ms=10000)
        holder = type("Holder", (), {})()
        c._track(holder)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c.close()
        self.assertIsNotNone(c._h, "closed under a live tensor")
        out = {}

        t = self.waiting_sync(c, out)
        self.await_acquire("finalizer")
        t0 = time.monotonic()
        del holder
        gc.collect()
        self.assertLess(time.monotonic() - t0, 2, "the finalizer waited for the sync")
        self.assertTrue(t.is_alive())
        self.assertIsNotNone(c._h, "closed under the running sync")
        self.assertTrue(c.cancel())
        t.join(10)
        self.assertEqual(out["r"].code, errno.ECANCELED)
        t0 = time.monotonic()
        while c._h is not None and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        self.assertIsNone(c._h, "the deferred close was not made after the sync")

        # The finalizer inside cancel(): wex_cancel drops the last tensor.
        # (A group of its own: _h is cleared as the deferred close above
        # begins, in a thread of its own, and the rank is free only once
        # its connection is closed: the same rank was refused EADDRINUSE
        # now and then.)
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="finalizer-cancel", timeout_ms=10000)
        holders = [type("Holder", (), {})()]
        c._track(holders[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c.close()
        real = c._lib

        class Lib:
            def __getattr__(self, name):
                return getattr(real, name)

            def wex_cancel(self, h):
                holders.clear()
                gc.collect()
                return real.wex_cancel(h)
        c._lib = Lib()
        done = []
        canceller = threading.Thread(target=lambda: done.append(c.cancel()), daemon=True)
        canceller.start()
        canceller.join(10)
        self.assertEqual(done, [False], "cancel() deadlocked on its finalizer")
        t0 = time.monotonic()
        while c._h is not None and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        self.assertIsNone(c._h, "the deferred close was not made after cancel()")

    def test_signal(self):
        """A signal during a sync's wait on the main thread: Python runs
        its handler at once (CLIENT_EINTR), not at the wait's timeout:
        Ctrl-C's KeyboardInterrupt, or what a handler raises, propagates;
        a handler that raises nothing lets the sync wait on."""
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="signal", timeout_ms=10000)
        self.addCleanup(c.close)
        main = threading.main_thread().ident
        self.assertEqual(threading.get_ident(), main)

        def waiting():
            with wex.Client(wex.ROLE_ADMIN) as admin:
                return [k["waiting"] for k in admin.request("clients")["clients"]
                        if k["pid"] == os.getpid() and k["group"] == "signal"]

        def cancels():  # cancels wexd received
            with wex.Client(wex.ROLE_ADMIN) as admin:
                text = admin.request("metrics")["text"]
            return sum(float(line.split()[-1]) for line in text.splitlines()
                       if line.startswith('wex_requests_total{op="cancel"}'))

        def kill_when_waiting(sig):
            t0 = time.monotonic()
            while waiting() != ["acquire"] and time.monotonic() - t0 < 10:
                time.sleep(0.01)
            signal.pthread_kill(main, sig)
        far = 1 << 40
        for sig, handler, exc in ((signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
                                  (signal.SIGUSR1, self._raise_stop, RuntimeError)):
            old = signal.signal(sig, handler)
            try:
                threading.Thread(target=kill_when_waiting, args=(sig,), daemon=True).start()
                t0 = time.monotonic()
                with self.assertRaises(exc):
                    c.sync(wex.SYNC_REMAP_VIEW, min_version=far, timeout_ms=30000)
                self.assertLess(time.monotonic() - t0, 10, "%s waited for the timeout" % sig)
            finally:
                signal.signal(sig, old)
            self.assertEqual(waiting(), [""])  # wexd's wait ended too
            self.assertFalse(c.cancel())
        # A handler that raises nothing, called every 50 ms for 2 s: the
        # sync waits on, and times out after its 3 s in all (what is left
        # is waited again, not the whole timeout: that would be 5 s).
        seen, stop = [], threading.Event()

        def keep_killing():
            kill_when_waiting(signal.SIGUSR1)
            t0 = time.monotonic()
            while not stop.wait(0.05) and time.monotonic() - t0 < 2:
                signal.pthread_kill(main, signal.SIGUSR1)
        old = signal.signal(signal.SIGUSR1, lambda *a: seen.append(a[0]))
        killer = threading.Thread(target=keep_killing, daemon=True)
        try:
            killer.start()
            t0 = time.monotonic()
            with self.assertRaises(wex.WexError) as e:
                c.sync(wex.SYNC_REMAP_VIEW, min_version=far, timeout_ms=3000)
            took = time.monotonic() - t0
        finally:
            stop.set()
            # (Before the handler goes: a SIGUSR1 the thread sends after,
            # late on a loaded machine, would kill the process.)
            killer.join()
            signal.signal(signal.SIGUSR1, old)
        self.assertEqual(e.exception.code, errno.ETIMEDOUT)
        self.assertGreater(len(seen), 5)
        self.assertGreater(cancels(), 5)  # each ended a wait
        self.assertGreaterEqual(took, 2.9)
        self.assertLess(took, 4.3, "a signal restarted the whole wait")
        # SIGCHLD (a DataLoader worker's exit) ends no wait: it is held
        # through it, its handler runs after.  (A wait of 3 s: the thread
        # must see it in wexd's list, and signal, before it times out; in
        # 1 s, the list's round trips slowed as on a loaded machine made
        # the signal come after the wait, and the handler saw none.)
        seen.clear()
        before = cancels()
        old = signal.signal(signal.SIGCHLD, lambda *a: seen.append(a[0]))
        try:
            threading.Thread(target=kill_when_waiting, args=(signal.SIGCHLD,),
                             daemon=True).start()
            t0 = time.monotonic()
            with self.assertRaises(wex.WexError) as e:
                c.sync(wex.SYNC_REMAP_VIEW, min_version=far, timeout_ms=3000)
            took = time.monotonic() - t0
        finally:
            signal.signal(signal.SIGCHLD, old)
        self.assertEqual(e.exception.code, errno.ETIMEDOUT)
        self.assertGreaterEqual(took, 2.95)
        self.assertEqual(seen, [signal.SIGCHLD])
        self.assertEqual(cancels(), before, "SIGCHLD cancelled the wait")
        self.assertTrue(c.request("status")["ok"])

    @staticmethod
    def _raise_stop(*_):
        raise RuntimeError("stop")

    def test_bad_input(self):
        with self.assertRaises(ValueError):
            wex.tensor("x", "BF17", (2,))
        with self.assertRaises(ValueError):
            wex.tensor("", "BF16", (2,))
        with self.assertRaises(ValueError):
            wex.tensor("x" * wex.NAME_MAX, "BF16", (2,))
        with self.assertRaises(ValueError):
            wex.tensor("x", "BF16", (1,) * 9)
        with self.assertRaises(ValueError):
            wex.tensor("x", "BF16", (2, 2), start=(0,))
        # What ctypes would truncate or wrap: a NUL in a name, a negative
        # dimension, values past their C type.
        with self.assertRaises(ValueError):
            wex.tensor("layers.0\0.evil", "BF16", (2,))
        with self.assertRaises(ValueError):
            wex.tensor("x", "BF16", (-1,))
        with self.assertRaises(ValueError):
            wex.tensor("x", "BF16", (2,), offset=1 << 64)

        # Parameters wex_client_open refuses (or would truncate): EINVAL
        # saying which.
        for kw, why in ((dict(role=wex.ROLE_CONSUMER), "needs a model name"),
                        (dict(role=7, model=MODEL), "role must be"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, rank=1, world_size=1),
                         "rank 1 is not in"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, device=-1), "device must"),
                        # ctypes would cut it to 32 bits: a 2-rank group.
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, rank=1,
                              world_size=(1 << 32) + 2), "world_size must"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, world_size=-1),
                         "world_size must"),
                        (dict(role=wex.ROLE_CONSUMER, model="m" * wex.NAME_MAX), "model must"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, group="g" * 200),
                         "group must"),
                        # ctypes would pass these cut at the NUL: another
                        # model, group or socket than the one named.
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL + "\0x"), "model contains a NUL"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, group="g\0h"),
                         "group contains a NUL"),
                        (dict(role=wex.ROLE_CONSUMER, model=MODEL, socket=self.sock + "\0x"),
                         "socket contains a NUL")):
            with self.assertRaises(wex.WexError, msg=str(kw)) as e:
                wex.Client(**kw)
            self.assertEqual(e.exception.code, errno.EINVAL)
            self.assertIn(why, str(e.exception))

        # A dtype number past int32: refused, not cut to 32 bits (2**32 + 7
        # would be BF16).
        with self.assertRaises(ValueError):
            wex.tensor("x", (1 << 32) + 7, (2,))
        # A socket given as a path object or bytes is taken as str is.
        for sock in (pathlib.Path(self.sock), os.fsencode(self.sock)):
            c3 = wex.Client(wex.ROLE_ADMIN, socket=sock)
            c3.close()
        # A layout whose config path is not UTF-8: WexError, its message
        # decoded with replacements (it was UnicodeDecodeError).
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(os.fsdecode(b"/nonexistent-\xff/config.json"), "hf")
        self.assertIn("config.json", str(e.exception))
        # A spec and config given as bytes are named as the str would be
        # (they were "layout b'hf' of b'/...'"), and spec is a str, as
        # EngineRank.describe() puts it in JSON.
        with self.assertRaises(wex.WexError) as e:
            wex.Layout(b"/nonexistent/config.json", b"hf")
        self.assertIn("layout hf of /nonexistent/config.json:", str(e.exception))
        cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                           "qwen2-0.5b-config.json")
        with wex.Layout(os.fsencode(cfg), b"vllm:tp=2") as lay:
            self.assertEqual((lay.spec, lay.world), ("vllm:tp=2", 2))
        # last_error read while another thread closes the client: under the
        # lock that close takes (the ASan build saw a use after free).
        for _ in range(50):
            c4 = wex.Client(wex.ROLE_ADMIN)
            stop = threading.Event()

            def reader(c=c4, stop=stop):
                while not stop.is_set():
                    self.assertIsInstance(c.last_error, str)

            t = threading.Thread(target=reader)
            t.start()
            c4.close()
            stop.set()
            t.join()

        # wex.released: the error's code is the errno (EINVAL for ptr 0).
        with self.assertRaises(wex.WexError) as e:
            wex.released(0, 4096)
        self.assertEqual((e.exception.code, e.exception.errno), (errno.EINVAL, errno.EINVAL))

        # No daemon at that socket.
        with self.assertRaises(wex.WexError) as e:
            wex.Client(wex.ROLE_CONSUMER, MODEL, socket=os.path.join(self.dir, "none.sock"))
        self.assertIn(e.exception.code, (errno.ENOENT, errno.ECONNREFUSED))
        self.assertIn("none.sock", str(e.exception))  # the path it tried

        # A rank another connection holds: EADDRINUSE with wexd's reason.
        held = wex.Client(wex.ROLE_PRODUCER, "pyglue-held", rank=0, world_size=1, watch=False)
        self.addCleanup(held.close)
        with self.assertRaises(wex.WexError) as e:
            wex.Client(wex.ROLE_PRODUCER, "pyglue-held", rank=0, world_size=1, watch=False)
        self.assertEqual(e.exception.code, errno.EADDRINUSE)
        self.assertIn("held by pid %d" % os.getpid(), str(e.exception))

        # A producer runs its watch (one thread of libwex's), unless
        # watch=False; a consumer has none.  Threads are told by id: one
        # joined before (the reader above) may leave /proc meanwhile.
        def tasks():
            return set(os.listdir("/proc/self/task"))
        for role, watch, more in ((wex.ROLE_PRODUCER, True, 1), (wex.ROLE_PRODUCER, False, 0),
                                  (wex.ROLE_CONSUMER, True, 0)):
            before = tasks()
            w = wex.Client(role, "pyglue-watch", group="w", watch=watch)
            self.assertEqual(len(tasks() - before), more, "role %d watch=%s" % (role, watch))
            w.close()
            # (A joined thread leaves /proc a moment after the join: later
            # still on a loaded machine; 10 s at most.)
            end = time.monotonic() + 10
            while tasks() - before and time.monotonic() < end:
                time.sleep(0.01)
            self.assertEqual(tasks() - before, set())

        # A tensor in a segment that does not exist: EINVAL naming it.
        p = wex.Client(wex.ROLE_PRODUCER, "pyglue-bad", rank=0, world_size=1)
        self.addCleanup(p.close)
        with self.assertRaises(wex.WexError) as e:
            p.register_tensors([wex.tensor("w.bad", "BF16", (4,), segment=99)])
        self.assertEqual(e.exception.code, errno.EINVAL)
        self.assertIn("w.bad", str(e.exception))

        # Pinned host staging needs a CUDA driver: without one, a clear
        # ENOCUDA; with one (a GPU, or the emulated driver), a host
        # segment this process can write.
        try:
            sid, ptr = p.segment_alloc(wex.SEG_HOST_PINNED, 1 << 16)
        except wex.WexError as err:
            self.assertEqual(err.code, wex.ENOCUDA)
            self.assertIn("cuda", str(err).lower())
        else:
            ctypes.memset(ptr, 7, 1 << 16)
            self.assertEqual(ctypes.string_at(ptr + 100, 1), b"\x07")

        # Versions and timeouts ctypes would wrap (-1 to 2**64-1, 2**32
        # to 0, "wexd's default"): refused here.
        for call in (lambda: p.begin_write(-1), lambda: p.begin_write(2, timeout_ms=1 << 32),
                     lambda: p.publish(1 << 64)):
            with self.assertRaises(ValueError):
                call()

        # Consumer calls on a producer, and an unknown view.
        with self.assertRaises(wex.WexError) as e:
            p.sync(wex.SYNC_COPY)
        self.assertEqual(e.exception.code, errno.EPERM)
        # A failure's message is its own, never an earlier call's: this
        # one sets none in libwex (a forked child's copy says ECHILD).
        self.assertIn("consumer", p.last_error)
        # In a forked child every call refuses (ECHILD), is_dirty too (it
        # said "dirty" for the error code).
        pid = os.fork()
        if pid == 0:
            try:
                c0 = wex.Client.__new__(wex.Client)
                c0.__dict__.update(p.__dict__)
                try:
                    c0.is_dirty()
                    code = 1
                except wex.WexError as err:
                    code = 0 if err.code == errno.ECHILD else 2
                c0._h = None  # the child's copy: nothing of its own to close
            except BaseException:
                code = 3
            os._exit(code)
        _, st = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(st), 0,
                         "is_dirty in a forked child: not WexError(ECHILD)")
        c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="bad", timeout_ms=5000)
        self.addCleanup(c.close)
        with self.assertRaises(wex.WexError) as e:
            c.view("no.such.tensor")
        self.assertEqual(e.exception.code, errno.ENOENT)
        # Strings ctypes would cut at a NUL: refused before any call.
        with self.assertRaisesRegex(ValueError, "tensor name contains a NUL"):
            c.view(TENSORS[0][0] + "\0x")
        with self.assertRaisesRegex(ValueError, "request op contains a NUL"):
            c.request("status\0x")
        with self.assertRaisesRegex(ValueError, "config contains a NUL"):
            wex.Layout("/nonexistent\0/config.json", "hf")
        with self.assertRaisesRegex(ValueError, "layout spec contains a NUL"):
            wex.Layout("/nonexistent/config.json", "hf\0tp=2")
        # Nothing of a model that was never published.
        q = wex.Client(wex.ROLE_CONSUMER, "pyglue-none", group="g", timeout_ms=300)
        self.addCleanup(q.close)
        t0 = time.monotonic()
        with self.assertRaises(wex.WexError) as e:
            q.sync(wex.SYNC_REMAP_VIEW, timeout_ms=300)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn(e.exception.code, (errno.ETIMEDOUT, wex.ENOPUBLISHED, wex.ENOMODEL))
        # Closed clients refuse further calls.
        c2 = wex.Client(wex.ROLE_CONSUMER, MODEL, group="closed")
        c2.close()
        with self.assertRaises(wex.WexError) as e:
            c2.release()
        self.assertEqual(e.exception.code, errno.EBADF)


    def test_argument_types(self):
        """Every public call refuses a wrong type or a value its C type
        cannot hold with TypeError / ValueError naming the argument: never
        ctypes.ArgumentError ("argument 2: wrong type"), and never taken
        as something else (True as 1, 1.5 as 1, "7" as 7, 2**32 + 1 as 1,
        -1 as 2**64-1, 2**64 as NULL, a str as its buffer's address)."""
        p = wex.Client(wex.ROLE_PRODUCER, "pyglue-types", rank=0, world_size=1, watch=False)
        self.addCleanup(p.close)
        c = wex.Client(wex.ROLE_CONSUMER, "pyglue-types", group="g", timeout_ms=300)
        self.addCleanup(c.close)
        fd = os.memfd_create("pyglue-types")
        self.addCleanup(os.close, fd)
        cases = [
            # (call, exception, words the message holds)
            (lambda: c.sync("copy"), TypeError, "mode must be an int (wex.SYNC_COPY"),
            (lambda: c.sync(None, verify=True), TypeError, "mode must be an int"),
            (lambda: c.sync(True), TypeError, "mode must be an int"),
            (lambda: c.sync((1 << 32) + wex.SYNC_COPY), ValueError, "mode must be a C int"),
            (lambda: c.sync(7), ValueError, "mode must be wex.SYNC_COPY"),
            (lambda: c.sync(wex.SYNC_COPY, min_version=1.5), TypeError, "min_version"),
            (lambda: c.sync(wex.SYNC_COPY, timeout_ms="10"), TypeError, "timeout_ms"),
            (lambda: p.segment_alloc("host", 4096), TypeError, "kind must be an int (wex.SEG_HOST"),
            (lambda: p.segment_alloc((1 << 32) + wex.SEG_HOST, 4096), ValueError, "kind"),
            (lambda: p.segment_alloc(wex.SEG_HOST, True), TypeError, "size must be an int"),
            (lambda: p.segment_alloc(wex.SEG_HOST, 4096.0), TypeError, "size must be an int"),
            (lambda: p.segment_alloc(wex.SEG_HOST, "4096"), TypeError, "size must be an int"),
            (lambda: p.segment_alloc(wex.SEG_HOST, 4096, "0"), TypeError, "device"),
            (lambda: p.register_fd((1 << 32) + 1, 4096, 4096), ValueError, "fd must be"),
            (lambda: p.register_fd(fd, "buffer", 4096), TypeError, "ptr must be an int"),
            (lambda: p.register_fd(fd, -1, 4096), ValueError, "ptr must be in"),
            (lambda: p.register_ptr(wex.SEG_CUDA_VMM, 1 << 64, 4096), ValueError, "ptr must be in"),
            (lambda: p.register_ptr("vmm", 4096, 4096), TypeError, "kind must be an int"),
            (lambda: p.register_tensors([("w", 7, 1)]), TypeError, "item 0 is tuple"),
            (lambda: p.register_tensors("w"), TypeError, "list of wex.Tensor"),
            (lambda: c.attach(None), TypeError, "list of wex.Tensor"),
            (lambda: p.begin_write(True), TypeError, "version must be an int"),
            (lambda: p.begin_write(2.0), TypeError, "version must be an int"),
            (lambda: p.publish("1"), TypeError, "version must be an int"),
            (lambda: c.reserve(0, 0, 1.5), TypeError, "size must be an int"),
            (lambda: c.view("x", None), TypeError, "prank must be an int"),
            (lambda: c.producer_tensors(True), TypeError, "prank must be an int"),
            (lambda: c.request("status", [1]), TypeError, "args must be a dict"),
            (lambda: c.request("status", {"x": float("nan")}), ValueError, "args are not JSON"),
            (lambda: wex.released(4096, True), TypeError, "nbytes must be an int"),
            (lambda: wex.strerror(1.5), TypeError, "code must be an int"),
            (lambda: wex.cuda_alloc(4096, "0"), TypeError, "device must be an int"),
            (lambda: wex.cuda_free(4096, None), TypeError, "size must be an int"),
            (lambda: wex.cuda_free("p", 4096), TypeError, "ptr must be an int"),
            (lambda: wex.Layout(None, "hf"), TypeError, "config must be"),
            (lambda: wex.tensor(5, "BF16", (2,)), TypeError, "tensor name must be"),
            (lambda: wex.tensor([1], "BF16", (2,)), TypeError, "tensor name must be"),
            (lambda: wex.tensor(1 << 64, "BF16", (2,)), TypeError, "tensor name must be"),
            (lambda: wex.tensor("x", b"BF16", (2,)), TypeError, "dtype must be"),
            (lambda: wex.tensor("x", 7.0, (2,)), TypeError, "dtype must be"),
            (lambda: wex.tensor("x", "BF16", "12"), TypeError, "shape must be a sequence"),
            (lambda: wex.tensor("x", "BF16", None), TypeError, "shape must be a sequence"),
            (lambda: wex.tensor("x", "BF16", (2.5,)), TypeError, "shape must be an int"),
            (lambda: wex.tensor("x", "BF16", (True,)), TypeError, "shape must be an int"),
            (lambda: wex.tensor("x", "BF16", (2,), start=("1",)), TypeError, "start"),
            (lambda: wex.tensor("x", "BF16", (2,), strides=(1.5,)), TypeError, "stride"),
            (lambda: wex.tensor("x", "BF16", (2,), offset=True), TypeError, "offset"),
            (lambda: wex.tensor("x", "BF16", (2,), ptr=-1), ValueError, "ptr must be in"),
            (lambda: wex.tensor("x", "BF16", (2,), ptr=1 << 64), ValueError, "ptr must be in"),
            (lambda: wex.Client(wex.ROLE_CONSUMER, MODEL, rank="0"), TypeError, "rank must be"),
            (lambda: wex.Client(wex.ROLE_CONSUMER, MODEL, world_size=None), TypeError,
             "world_size must be"),
            (lambda: wex.Client(wex.ROLE_CONSUMER, MODEL, device="0"), TypeError, "device must"),
            (lambda: wex.Client(wex.ROLE_CONSUMER, MODEL, timeout_ms=True), TypeError,
             "timeout_ms must"),
            (lambda: wex.Client(wex.ROLE_CONSUMER, MODEL, socket=5), TypeError, "socket must"),
            # A str made of bytes that are not UTF-8 (os.fsdecode's
            # surrogates): a bare UnicodeEncodeError, naming nothing.
            (lambda: wex.tensor("w\udcff", "BF16", (2,)), ValueError,
             "tensor name is not UTF-8"),
            (lambda: c.view("w\udcff"), ValueError, "tensor name is not UTF-8"),
            (lambda: c.request("st\udcffatus"), ValueError, "request op is not UTF-8"),
            (lambda: wex.Layout("/nonexistent/config.json", "hf\udcff"), ValueError,
             "layout spec is not UTF-8"),
        ]
        try:
            import numpy
        except ImportError:
            numpy = None
        if numpy is not None:
            cases += [
                # A tensor or array where an address is wanted: a 0-d
                # integer one was taken as the address its value is, others
                # raised NumPy's TypeError naming nothing.
                (lambda: wex.tensor("x", "BF16", (2,), ptr=numpy.array(4096)), TypeError,
                 "ptr must be an address"),
                (lambda: p.register_fd(fd, numpy.zeros(3), 4096), TypeError,
                 "ptr must be an address"),
                (lambda: p.register_ptr(wex.SEG_CUDA_VMM, numpy.zeros(3), 4096), TypeError,
                 "ptr must be an address"),
                # NumPy's bools were 1 (a copy sync, version 1).
                (lambda: c.sync(numpy.True_), TypeError, "mode must be an int"),
                (lambda: p.begin_write(numpy.True_), TypeError, "version must be an int"),
                # Arrays that refuse __index__: NumPy's message, naming nothing.
                (lambda: p.segment_alloc(wex.SEG_HOST, numpy.array([4096, 1])), TypeError,
                 "size must be an int"),
                (lambda: wex.tensor("x", numpy.array(7.0), (2,)), TypeError, "dtype must be"),
                (lambda: wex.released(numpy.array(4096), 1), TypeError,
                 "ptr must be an address"),
                # An array as the list of tensors: its rows were the items
                # ("item 0 is float64").
                (lambda: p.register_tensors(numpy.zeros(2)), TypeError, "not numpy.ndarray"),
                (lambda: c.attach([numpy.zeros(2)]), TypeError, "item 0 is numpy.ndarray"),
            ]
        for i, (call, exc, words) in enumerate(cases):
            with self.subTest(case=i, words=words):
                with self.assertRaises((TypeError, ValueError)) as e:
                    call()
                self.assertNotIsInstance(e.exception, ctypes.ArgumentError)
                self.assertIsInstance(e.exception, exc)
                self.assertIn(words, str(e.exception))
        # A bool as a role (True == ROLE_PRODUCER) is no role.
        with self.assertRaisesRegex(wex.WexError, "role must be"):
            wex.Client(True, MODEL)
        # A model or group that is not UTF-8 text, given as str: refused
        # as the same bytes are (EINVAL), not as a bare UnicodeEncodeError.
        for kw in (dict(model="m\udcff"), dict(model=MODEL, group="g\udcff")):
            with self.assertRaises(wex.WexError, msg=str(kw)) as e:
                wex.Client(wex.ROLE_CONSUMER, **kw)
            self.assertEqual(e.exception.code, errno.EINVAL)
            self.assertIn("is not UTF-8", str(e.exception))
        if numpy is not None:
            # (An array as a role: "truth value of an array is ambiguous".)
            for role in (numpy.True_, numpy.array([1, 2]), numpy.array(1.0)):
                with self.assertRaisesRegex(wex.WexError, "role must be", msg=repr(role)):
                    wex.Client(role, MODEL)
            # NumPy's integers are ints, the role and addresses too.
            wex.Client(numpy.int64(wex.ROLE_ADMIN)).close()
            self.assertEqual(wex.tensor("x", "BF16", (2,), ptr=numpy.uint64(4096)).ptr, 4096)
        # Nothing of the refused calls reached wexd: no version begun.
        seg, _ = p.segment_alloc(wex.SEG_HOST, 4096)
        # (Any iterable of tensors.)
        p.register_tensors(wex.tensor(n, "BF16", (2,), segment=seg) for n in ("w",))
        p.begin_write(1)
        p.publish(1)
        # A name given as bytes still names (repr too, undecodable or not).
        self.assertIn("\\x01", repr(wex.tensor(b"\x01", "BF16", (2,))))
        self.assertIn("BF16", repr(wex.tensor(b"w\xff", "BF16", (2,))))

    def test_interrupt_after_create(self):
        """A signal's handler that raises (Ctrl-C's KeyboardInterrupt) as
        a C call that created something returns, before Python holds it:
        the call is replaced by one that makes the real call and then
        raises, as the handler does at the call's end."""
        import gc
        L = wex.lib()

        def patched(name, after):
            real = getattr(L, name)

            def fn(*args):
                ret = real(*args)
                after(args)
                raise KeyboardInterrupt
            setattr(L, name, fn)
            self.addCleanup(setattr, L, name, real)

        def recording(name, into):
            real = getattr(L, name)

            def fn(*args):
                into.append(args)
                return real(*args)
            setattr(L, name, fn)
            self.addCleanup(setattr, L, name, real)

        # A layout: closed by its __del__ (it had no lock to close it with).
        with self.subTest("layout"):
            opened, closed = [], []
            patched("wex_layout_open", lambda a: opened.append(a[3]._obj.value))
            recording("wex_layout_close", closed)
            cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                               "qwen2-0.5b-config.json")
            try:
                wex.Layout(cfg, "hf")
            except KeyboardInterrupt:
                pass
            gc.collect()
            self.assertTrue(opened and opened[0])
            self.assertIn(opened[0], [getattr(a[0], "value", a[0]) for a in closed],
                          "the layout was never closed")

        # A request's reply: freed.
        with self.subTest("request"):
            freed, replies = [], []
            patched("wex_request", lambda a: replies.append(a[3]._obj.value))
            recording("wex_free", freed)
            with wex.Client(wex.ROLE_ADMIN) as adm:
                with self.assertRaises(KeyboardInterrupt):
                    adm.request("status")
            self.assertTrue(replies and replies[0])
            self.assertIn(replies[0], [getattr(a[0], "value", a[0]) for a in freed],
                          "the reply was never freed")

        # A same-address region: known to the client (attach_module keeps
        # tensors outside the client's regions alive on their own).
        with self.subTest("reserve"):
            c = wex.Client(wex.ROLE_CONSUMER, MODEL, group="intr", timeout_ms=10000)
            self.addCleanup(c.close)
            reserved = []
            patched("wex_reserve", lambda a: reserved.append(a[4]._obj.value))
            with self.assertRaises(KeyboardInterrupt):
                c.reserve(0, 0, 4096)
            self.assertTrue(reserved and reserved[0])
            self.assertIn((reserved[0], 4096), c._regions)

        # A segment: kept for the same call again, which returns it (no
        # second segment, nor the same memory registered twice); a call
        # after that makes a new one.
        with self.subTest("segments"):
            import mmap
            p = wex.Client(wex.ROLE_PRODUCER, "intr-seg", rank=0, world_size=1,
                           timeout_ms=10000)
            self.addCleanup(p.close)
            fd = os.memfd_create("pyglue-intr")
            self.addCleanup(os.close, fd)
            os.ftruncate(fd, 4096)
            mm = mmap.mmap(fd, 4096)
            addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
            for name, call, out in (
                    ("wex_segment_alloc", lambda: p.segment_alloc(wex.SEG_HOST, 4096),
                     lambda a: (a[4]._obj.value, a[5]._obj.value)),
                    ("wex_segment_register_fd", lambda: p.register_fd(fd, addr, 4096),
                     lambda a: a[4]._obj.value)):
                real, made = getattr(L, name), []

                def first_raises(*args, real=real, made=made, out=out):
                    ret = real(*args)
                    made.append(out(args))
                    if len(made) == 1:
                        raise KeyboardInterrupt
                    return ret
                setattr(L, name, first_raises)
                self.addCleanup(setattr, L, name, real)
                with self.assertRaises(KeyboardInterrupt):
                    call()
                self.assertEqual(call(), made[0], name)
                self.assertEqual(len(made), 1, name)
                self.assertNotEqual(call(), made[0], name)
                self.assertEqual(len(made), 2, name)

        # A publish that succeeded: the same publish again succeeds (it
        # said "begin_write it first"), nothing published twice; one
        # after it is refused as before.
        with self.subTest("publish"):
            p = wex.Client(wex.ROLE_PRODUCER, "intr-pub", rank=0, world_size=1,
                           timeout_ms=10000)
            self.addCleanup(p.close)
            seg, _ = p.segment_alloc(wex.SEG_HOST, 4096)
            p.register_tensors([wex.tensor("a", "BF16", (16,), segment=seg, offset=0)])
            p.begin_write(1)
            real, published = L.wex_publish, []

            def first_raises(h, v):
                ret = real(h, v)
                published.append((v, ret))
                if len(published) == 1:
                    raise KeyboardInterrupt
                return ret
            L.wex_publish = first_raises
            self.addCleanup(setattr, L, "wex_publish", real)
            with self.assertRaises(KeyboardInterrupt):
                p.publish(1)
            p.publish(1)
            self.assertEqual(published[:2], [(1, 0), (1, -errno.EINVAL)])
            with self.assertRaises(wex.WexError) as e:
                p.publish(1)
            self.assertEqual(e.exception.code, errno.EINVAL)
            with self.assertRaises(wex.WexError) as e:
                p.begin_write(1)
            self.assertEqual(e.exception.code, errno.EALREADY)
            p.begin_write(2)
            p.publish(2)

        # A sync that fetched the producer's memory again (it registered
        # again, elsewhere) while a view of the old memory is alive: the
        # next sync that completes names that view (ESTALE), as that one
        # would have; it was forgotten, its memory zeros from then on.
        with self.subTest("sync views"):
            model = "intr-views"
            p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1, timeout_ms=10000)
            seg, _ = p.segment_alloc(wex.SEG_HOST, 4096)
            p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
            p.begin_write(1)
            p.publish(1)
            c = wex.Client(wex.ROLE_CONSUMER, model, group="v", timeout_ms=10000)
            self.addCleanup(c.close)
            c.sync(wex.SYNC_REMAP_VIEW, 1)
            ptr = c.view("w")[0]

            class Holder:  # (what holds a view tensor's memory: torch_util's)
                pass
            holder = Holder()
            c._track(holder, view=("w", 0, ptr, 256, True))
            c.release()
            p.close()
            p = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1, timeout_ms=10000)
            self.addCleanup(p.close)
            seg, _ = p.segment_alloc(wex.SEG_HOST, 1 << 22)  # (mapped elsewhere)
            p.register_tensors([wex.tensor("w", "F32", (64,), segment=seg)])
            p.begin_write(2)
            p.publish(2)
            real = L.wex_sync

            def raises(*args):
                real(*args)
                raise KeyboardInterrupt
            L.wex_sync = raises
            try:
                with self.assertRaises(KeyboardInterrupt):
                    c.sync(wex.SYNC_REMAP_VIEW, 2)
            finally:
                L.wex_sync = real
            self.assertEqual(ctypes.string_at(ptr, 8), bytes(8))  # zeros, no SIGSEGV
            c.release()
            with self.assertRaises(wex.WexError) as e:
                c.sync(wex.SYNC_REMAP_VIEW, 2)
            self.assertEqual(e.exception.code, errno.ESTALE, str(e.exception))
            self.assertIn("(w)", str(e.exception))
            c.sync(wex.SYNC_REMAP_VIEW, 2)  # told once
            del holder  # (its finalizer: _untrack)

        # Device memory: freed, nothing else ever would.
        with self.subTest("cuda_alloc"):
            if not hasattr(L, "wex_cuda_malloc"):
                self.skipTest("libwex built without the CUDA headers")
            cfree = []

            def fake_malloc(size, device, pp):
                pp._obj.value = 0x7f0000001000  # (never dereferenced)
                raise KeyboardInterrupt
            real_malloc, real_free = L.wex_cuda_malloc, L.wex_cuda_free
            L.wex_cuda_malloc = fake_malloc
            L.wex_cuda_free = lambda *a: cfree.append(a)
            try:
                with self.assertRaises(KeyboardInterrupt):
                    wex.cuda_alloc(1 << 21, 0)
            finally:
                L.wex_cuda_malloc, L.wex_cuda_free = real_malloc, real_free
            self.assertEqual([a[:3] for a in cfree], [(0x7f0000001000, 1 << 21, 0)])


def own_wexd(case, prefix):
    """A wexd of the test's own, in a temporary directory (killed, and the
    directory removed, at the test's cleanup): (its socket, its process)."""
    from wexd_harness import start_wexd
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix=prefix)
    case.addCleanup(shutil.rmtree, d)
    sock = os.path.join(d, "wexd.sock")
    wexd = start_wexd(dict(os.environ, WEX_SOCKET=sock))
    case.addCleanup(wexd.wait)
    case.addCleanup(wexd.kill)
    return sock, wexd


def small_producer(case, model, sock, **kw):
    """Producer rank 0 of 1 of `model` with one tensor in a host segment
    (closed at cleanup)."""
    c = wex.Client(wex.ROLE_PRODUCER, model, rank=0, world_size=1, socket=sock, **kw)
    case.addCleanup(c.close)
    seg, _ = c.segment_alloc(wex.SEG_HOST, 1 << 20)
    c.register_tensors([wex.tensor("layers.0.a", "BF16", (256,), segment=seg, offset=0)])
    return c


@contextlib.contextmanager
def signal_after(sig, handler, delay):
    """Runs the block with `handler` for sig, which is sent to the main
    thread `delay` s into it; the list it yields gets the block's length
    in seconds once it ends."""
    main = threading.main_thread().ident
    old = signal.signal(sig, handler)
    timer = threading.Timer(delay, signal.pthread_kill, (main, sig))
    took = []
    t0 = time.monotonic()
    timer.start()
    try:
        yield took
    finally:
        took.append(time.monotonic() - t0)
        timer.cancel()
        timer.join()  # (before the handler goes: the signal would kill)
        signal.signal(sig, old)


@contextlib.contextmanager
def stalled(wexd, secs):
    """Runs the block with wexd stopped and going on `secs` s into it,
    and SIGUSR1, whose handler raises nothing, sent 0.3 s into it; yields
    (seen, took): the signals the handler saw, and (once the block ends)
    its length in seconds."""
    os.kill(wexd.pid, signal.SIGSTOP)
    seen = []
    cont = threading.Timer(secs, os.kill, (wexd.pid, signal.SIGCONT))
    try:
        with signal_after(signal.SIGUSR1, lambda *a: seen.append(a[0]), 0.3) as took:
            cont.start()
            yield seen, took
    finally:
        cont.cancel()
        cont.join()


class PublishAway(unittest.TestCase):
    """A publish that finds no wexd (a restart, a crash) tries again up to
    the client's timeout; a signal whose handler raises nothing, late in
    those tries, ends the call (-EINTR, so that Python runs the handler)
    and the binding calls again: that call goes on with the interrupted
    one's time instead of the whole timeout again."""

    def test_signal_late(self):
        sock, wexd = own_wexd(self, "wex-pyaway-")
        c = small_producer(self, "pyaway", sock, timeout_ms=6000, watch=False)
        c.begin_write(1)
        wexd.kill()
        wexd.wait()
        seen = []
        # (Half-way: a loaded machine may fire it late, not past the end.)
        with signal_after(signal.SIGUSR1, lambda *a: seen.append(a[0]), 3.0) as took:
            with self.assertRaises(wex.WexError) as e:
                c.publish(1)
        self.assertEqual(seen, [signal.SIGUSR1])
        self.assertIn("tried again until its timeout", str(e.exception))
        self.assertGreaterEqual(took[0], 5.9)
        # (Without going on: the signal at 3 s, then 6 s again.)
        self.assertLess(took[0], 8.0, "the signal started the whole timeout again")


class HungWexd(unittest.TestCase):
    """A wexd that takes connections and never answers (hung after a
    restart): Ctrl-C during begin_write raises KeyboardInterrupt at once,
    though the producer's watch was itself waiting on that wexd's hello
    (it gives its attempt up to the call); a handler that raises nothing
    lets the call end at its own timeout, not at the client's."""

    def test_ctrl_c(self):
        import socket

        sock, wexd = own_wexd(self, "wex-pyhung-")
        c = small_producer(self, "pyhung", sock, timeout_ms=30000)
        c.begin_write(1)
        c.publish(1)
        wexd.kill()
        wexd.wait()
        os.unlink(sock)
        hung = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.addCleanup(hung.close)
        hung.bind(sock)
        hung.listen(16)
        # The watch reconnects, and waits on hello: its connection waits in
        # the queue of this socket, which never accepts.  (Was a sleep of
        # 1.5 s: on a loaded machine the call below may come first, and
        # then it is not the case this tests.)
        self.assertTrue(select.select([hung], [], [], 20)[0],
                        "the producer's watch did not connect again in 20 s")
        with signal_after(signal.SIGINT, signal.default_int_handler, 0.5) as took:
            with self.assertRaises(KeyboardInterrupt):
                c.begin_write(2, timeout_ms=20000)
        self.assertLess(took[0], 5.0, "Ctrl-C waited for wexd's answer")
        seen = []
        with signal_after(signal.SIGUSR1, lambda *a: seen.append(a[0]), 0.5) as took:
            with self.assertRaises(wex.WexError) as e:
                c.begin_write(2, timeout_ms=2000)
        self.assertEqual(seen, [signal.SIGUSR1])
        self.assertIn(e.exception.code, (errno.ETIMEDOUT,), str(e.exception))
        self.assertGreaterEqual(took[0], 1.9)
        self.assertLess(took[0], 5.0, "the call waited for the client's timeout")

    def test_ctrl_c_stopped(self):
        """A wexd stopped (SIGSTOP) on a live connection: Ctrl-C during a
        sync's wait raises KeyboardInterrupt 3 s after it (wexd never
        answers the cancel; the connection is dropped), not at the wait's
        timeout; once wexd goes on, the consumer syncs again."""
        sock, wexd = own_wexd(self, "wex-pystop-")
        p = small_producer(self, "pystop", sock)
        p.begin_write(1)
        p.publish(1)
        c = wex.Client(wex.ROLE_CONSUMER, "pystop", socket=sock, timeout_ms=30000)
        self.addCleanup(c.close)
        os.kill(wexd.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        with signal_after(signal.SIGINT, signal.default_int_handler, 0.5) as took:
            with self.assertRaises(KeyboardInterrupt):
                c.sync(wex.SYNC_REMAP_VIEW, min_version=1 << 40, timeout_ms=20000)
        self.assertGreaterEqual(took[0], 3.4)
        self.assertLess(took[0], 7.0, "Ctrl-C waited for the stopped wexd")
        os.kill(wexd.pid, signal.SIGCONT)
        self.assertEqual(c.sync(wex.SYNC_REMAP_VIEW, min_version=1, timeout_ms=10000).version, 1)

    def test_publish_stopped(self):
        """Ctrl-C during a publish to a stopped wexd raises
        KeyboardInterrupt 3 s after it (the connection is dropped; before,
        the publish waited for the client's timeout plus 5 s); once wexd
        goes on, the publish called again succeeds and an engine that kept
        the model in wexd gets the version.  With a handler that raises
        nothing and wexd stalled 4.5 s, the binding publishes again by
        itself and the call succeeds."""
        sock, wexd = own_wexd(self, "wex-pypubstop-")
        p = small_producer(self, "pypubstop", sock, timeout_ms=30000)
        p.begin_write(1)
        p.publish(1)
        c = wex.Client(wex.ROLE_CONSUMER, "pypubstop", socket=sock, timeout_ms=30000)
        self.addCleanup(c.close)
        self.assertEqual(c.sync(wex.SYNC_REMAP_VIEW, min_version=1, timeout_ms=10000).version, 1)
        c.release()
        p.begin_write(2)
        os.kill(wexd.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        with signal_after(signal.SIGINT, signal.default_int_handler, 0.5) as took:
            with self.assertRaises(KeyboardInterrupt):
                p.publish(2)
        self.assertGreaterEqual(took[0], 3.4)
        self.assertLess(took[0], 7.0, "Ctrl-C waited for the stopped wexd")
        os.kill(wexd.pid, signal.SIGCONT)
        p.publish(2)
        self.assertEqual(c.sync(wex.SYNC_REMAP_VIEW, min_version=2, timeout_ms=10000).version, 2)
        c.release()

        p.begin_write(3)
        with stalled(wexd, 4.5) as (seen, took):
            p.publish(3)
        self.assertEqual(seen, [signal.SIGUSR1])
        self.assertGreaterEqual(took[0], 4.4)
        self.assertLess(took[0], 12.0)
        self.assertEqual(c.sync(wex.SYNC_REMAP_VIEW, min_version=3, timeout_ms=10000).version, 3)

    def written_seen(self, p, c, v):
        """p writes and publishes v; consumer c sees it (a view sync)."""
        p.begin_write(v)
        p.publish(v)
        self.assertEqual(c.sync(wex.SYNC_REMAP_VIEW, min_version=v, timeout_ms=10000).version, v)
        c.release()

    def test_register_stopped(self):
        """Ctrl-C during register_tensors to a stopped wexd raises
        KeyboardInterrupt 3 s after it (before, the call waited for the
        client's timeout plus 5 s); once wexd goes on, the call made again
        succeeds and the version written after reaches an engine.  With a
        handler that raises nothing and wexd stalled 4.5 s, the binding
        calls again by itself and succeeds; with one that calls cancel(),
        the call ends with ECANCELED, not made again."""
        sock, wexd = own_wexd(self, "wex-pyregstop-")
        p = small_producer(self, "pyregstop", sock, timeout_ms=30000)
        table = [wex.tensor("layers.0.a", "BF16", (256,), segment=0, offset=0)]
        c = wex.Client(wex.ROLE_CONSUMER, "pyregstop", socket=sock, timeout_ms=30000)
        self.addCleanup(c.close)
        os.kill(wexd.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        with signal_after(signal.SIGINT, signal.default_int_handler, 0.5) as took:
            with self.assertRaises(KeyboardInterrupt):
                p.register_tensors(table)
        self.assertGreaterEqual(took[0], 3.4)
        self.assertLess(took[0], 7.0, "Ctrl-C waited for the stopped wexd")
        os.kill(wexd.pid, signal.SIGCONT)
        p.register_tensors(table)
        self.written_seen(p, c, 1)

        with stalled(wexd, 4.5) as (seen, took):
            p.register_tensors(table)
        self.assertEqual(seen, [signal.SIGUSR1])
        self.assertGreaterEqual(took[0], 4.4)
        self.assertLess(took[0], 12.0)
        self.written_seen(p, c, 2)

        # A handler that calls cancel() (a SIGTERM handler's way): the
        # call ends with ECANCELED, not made again.
        os.kill(wexd.pid, signal.SIGSTOP)
        answers = []
        with signal_after(signal.SIGUSR1, lambda *a: answers.append(p.cancel()), 0.3) as took:
            with self.assertRaises(wex.WexError) as e:
                p.register_tensors(table)
        os.kill(wexd.pid, signal.SIGCONT)
        # (The handler runs once the call returned -EINTR: no call runs
        # then for cancel() to end.)
        self.assertEqual(len(answers), 1)
        self.assertEqual(e.exception.errno, errno.ECANCELED)
        self.assertGreaterEqual(took[0], 3.2)
        self.assertLess(took[0], 7.0)
        p.register_tensors(table)

    def test_open_stalled(self):
        """A wexd that stalls (stopped for 4 s, then going on) while a
        client opens, and one signal whose handler raises nothing at
        0.3 s: the hello is given up 3 s after the signal (-EINTR), the
        binding opens again, and the client is open once wexd goes on."""
        sock, wexd = own_wexd(self, "wex-pystall-")
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        with stalled(wexd, 4.0) as (seen, took):
            c = wex.Client(wex.ROLE_ADMIN, socket=sock)
        self.addCleanup(c.close)
        self.assertEqual(seen, [signal.SIGUSR1])
        self.assertGreaterEqual(took[0], 3.9)
        self.assertLess(took[0], 10.0)
        self.assertIn("models", c.request("status"))


    def test_open_ctrl_c(self):
        """Ctrl-C while a producer opens on a wexd that stalls less than
        3 s: the open goes on to succeed, KeyboardInterrupt is raised as
        it returns, and the client it opened is closed (it was left open,
        holding its rank: opening it again said EADDRINUSE until the
        process ended)."""
        sock, wexd = own_wexd(self, "wex-pyopenint-")
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        os.kill(wexd.pid, signal.SIGSTOP)
        cont = threading.Timer(1.5, os.kill, (wexd.pid, signal.SIGCONT))
        cont.start()
        self.addCleanup(cont.join)
        with signal_after(signal.SIGINT, signal.default_int_handler, 0.3) as took:
            with self.assertRaises(KeyboardInterrupt):
                wex.Client(wex.ROLE_PRODUCER, "pyopenint", rank=0, world_size=1,
                           socket=sock, watch=False)
        self.assertGreaterEqual(took[0], 1.4)  # (it waited for wexd's answer)
        c = wex.Client(wex.ROLE_PRODUCER, "pyopenint", rank=0, world_size=1, socket=sock,
                       watch=False, timeout_ms=5000)
        c.close()


    def test_close_signal(self):
        """A signal during close() of a consumer holding a lease (its
        release waits for a wexd stalled for 2 s): Ctrl-C's KeyboardInterrupt
        leaves the client closed, not naming the freed client (the next
        close() or __del__ freed it again: "double free or corruption");
        a handler that calls cancel() (a SIGTERM handler's way) gets False
        (it deadlocked on the lock close() holds)."""
        sock, wexd = own_wexd(self, "wex-pyclosesig-")
        self.addCleanup(os.kill, wexd.pid, signal.SIGCONT)
        p = small_producer(self, "pyclosesig", sock, watch=False)
        p.begin_write(1)
        p.publish(1)
        answers = []
        for handler, exc in ((signal.default_int_handler, KeyboardInterrupt),
                             (lambda *a: answers.append(c.cancel()), None)):
            c = wex.Client(wex.ROLE_CONSUMER, "pyclosesig", socket=sock, timeout_ms=5000)
            c.sync(wex.SYNC_REMAP_VIEW, min_version=1)
            os.kill(wexd.pid, signal.SIGSTOP)
            cont = threading.Timer(2.0, os.kill, (wexd.pid, signal.SIGCONT))
            cont.start()
            signal.alarm(30)  # (the deadlock: killed)
            try:
                with signal_after(signal.SIGINT, handler, 0.3):
                    if exc is None:
                        c.close()
                    else:
                        with self.assertRaises(exc):
                            c.close()
            finally:
                signal.alarm(0)
                cont.join()
            self.assertIsNone(c._h, "KeyboardInterrupt left the freed client in place")
            c.close()
            with self.assertRaises(wex.WexError) as e:
                c.is_dirty()
            self.assertEqual(e.exception.code, errno.EBADF)
        self.assertEqual(answers, [False])


class NoDriver(unittest.TestCase):
    """wex.cuda_alloc without a CUDA driver: ENOCUDA saying so, not an
    out-of-memory error.  In a child whose $WEX_CUDA_LIB names no file (the
    driver is loaded once per process), so that it holds on a GPU machine
    and under the emulated driver too."""

    def test_cuda_alloc(self):
        import subprocess
        env = dict(os.environ, WEX_CUDA_LIB="/nonexistent/libcuda.so.1")
        out = subprocess.run([sys.executable, __file__, "cuda_alloc"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr.decode())
        code, text = out.stdout.decode().split(" ", 1)
        self.assertEqual(int(code), wex.ENOCUDA, text)
        self.assertIn("no CUDA driver", text)
        self.assertNotIn("memory", text.lower())


def cuda_alloc_child():
    """Prints the code and text of wex.cuda_alloc's error (none: fails)."""
    try:
        p = wex.cuda_alloc(1 << 20, 0)
    except wex.WexError as err:
        print(err.code, str(err))
        return
    wex.cuda_free(p, 1 << 20, 0)
    sys.exit("wex.cuda_alloc succeeded without a driver")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "producer":
        producer()
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "cuda_alloc":
        cuda_alloc_child()
        sys.exit(0)
    unittest.main(verbosity=2)
