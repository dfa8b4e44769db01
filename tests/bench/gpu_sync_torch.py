#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gpu_sync_torch.py - the PyTorch CUDA-IPC baseline for tests/bench/gpu_sync.c.

Two processes on one GPU, the same tensors as the C bench (same size
generator, bf16): a producer owns the weights; a consumer owns its own copy
and syncs it the way SGLang's update_weights_from_tensor does:

  per_tensor  the producer calls torch.multiprocessing.reductions.reduce_tensor
              on every tensor and sends the handles; the consumer rebuilds
              each tensor (cudaIpcOpenMemHandle of its caching-allocator
              segment, closed again when the rebuilt tensor dies, as in
              SGLang) and copies it into its own parameter;
  bucket      the producer flattens the tensors into buckets of
              WEX_BENCH_BUCKET_MB (torch.cat, a copy), sends one handle per
              bucket; the consumer copies the slices out.

Each sync is timed in the consumer from its request to torch.cuda.synchronize()
after the last copy; the best of WEX_BENCH_REPS syncs after one warm-up is
reported (the first, with its one-time costs, separately).  Before each
sync the consumer's tensors are zeroed (untimed), after it the first,
middle and last element of every tensor must hold the producer's value: a
phase's figures are reported only when all its syncs delivered
("torch_check" false and "torch_reason" name the first that did not), and
the per-tensor figures stay when the bucket phase fails.  Both processes
run PyTorch's default allocator (cudaMalloc segments, legacy CUDA IPC):
PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF are dropped, as expandable
segments would share through another path.  Prints one JSON line; when
torch or CUDA is missing, the timings are null and "torch_reason" says
why; a producer that dies or hangs fails the baseline within
WEX_BENCH_TORCH_S (150; gpu_sync sets it to its remaining budget) instead
of hanging the bench.  Environment:
WEX_BENCH_GB (16), WEX_BENCH_TENSORS (300), WEX_BENCH_REPS (3),
WEX_BENCH_BUCKET_MB (512).
"""
import json
import os
import queue
import sys
import time


def tensor_elems(gb, n):
    """Element counts of the n bf16 tensors; mirrors gpu_sync.c."""
    avg = int(gb * (1 << 30)) // 2 // n
    out = []
    for i in range(n):
        frac = ((i * 2654435761) & 0xFFFFFFFF) % 1000
        e = avg * (500 + 3 * frac) // 2000
        e &= ~127
        out.append(max(e, 128))
    return out


class CheckError(RuntimeError):
    """A sync did not deliver the producer's values."""


def tval(i):
    """Tensor i's value: never 0 (the consumer's tensors are zeroed before
    each sync), exact in bf16, neighbours differ."""
    return float(i % 7 + 1)


def producer(elems, bucket_bytes, req, resp):
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.set_device(0)
    ts = [torch.full((e,), tval(i), dtype=torch.bfloat16, device="cuda")
          for i, e in enumerate(elems)]
    torch.cuda.synchronize()
    resp.put("ready")
    while True:
        msg = req.get()
        if msg == "stop":
            break
        if msg == "per_tensor":
            torch.cuda.synchronize()
            resp.put([reduce_tensor(t) for t in ts])
            if req.get() == "stop":  # else the consumer's ack: handles may go
                break
        elif msg == "bucket":
            buckets, cur, size = [], [], 0
            for t in ts:
                nb = t.numel() * t.element_size()
                if cur and size + nb > bucket_bytes:
                    buckets.append(cur)
                    cur, size = [], 0
                cur.append(t)
                size += nb
            if cur:
                buckets.append(cur)
            flats = [torch.cat([t.view(-1) for t in b]) for b in buckets]
            torch.cuda.synchronize()
            resp.put([(reduce_tensor(f), [t.numel() for t in b]) for f, b in zip(flats, buckets)])
            if req.get() == "stop":
                break
            del flats


def main():
    gb = float(os.environ.get("WEX_BENCH_GB", "16"))
    n = int(os.environ.get("WEX_BENCH_TENSORS", "300"))
    reps = max(1, int(os.environ.get("WEX_BENCH_REPS", "3")))
    bucket_bytes = int(os.environ.get("WEX_BENCH_BUCKET_MB", "512")) << 20
    limit = float(os.environ.get("WEX_BENCH_TORCH_S", "150"))
    out = {"torch_ipc_per_tensor_ms": None, "torch_ipc_bucket_ms": None}
    # Before torch reads them; the spawned producer inherits os.environ.
    os.environ.pop("PYTORCH_ALLOC_CONF", None)
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    try:
        import torch
        import torch.multiprocessing as mp
    except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
        out["torch_reason"] = "torch unavailable: %s" % e
        print(json.dumps(out))
        return 0
    if not torch.cuda.is_available():
        out["torch_reason"] = "torch %s has no usable CUDA device" % torch.__version__
        print(json.dumps(out))
        return 0
    out["torch_version"] = torch.__version__
    elems = tensor_elems(gb, n)
    ctx = mp.get_context("spawn")
    req, resp = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=producer, args=(elems, bucket_bytes, req, resp))
    p.start()
    deadline = time.monotonic() + limit

    def answer():
        """The producer's next message; fails if it died or time is up."""
        while True:
            try:
                return resp.get(timeout=1)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError("producer exited with %s" % p.exitcode) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("no answer from the producer in %.0f s" % limit) from None

    phase = "start"
    try:
        torch.cuda.set_device(0)
        out["torch_device"] = torch.cuda.get_device_name(0)
        own = [torch.empty((e,), dtype=torch.bfloat16, device="cuda") for e in elems]
        want = torch.tensor([tval(i) for i in range(n)], dtype=torch.bfloat16, device="cuda")
        if answer() != "ready":
            raise RuntimeError("producer did not start")

        def zero():
            """Untimed: the consumer's tensors to 0, so that a check after a
            sync tells whether that sync delivered."""
            for t in own:
                t.zero_()
            torch.cuda.synchronize()

        def check(what):
            """First, middle and last element of every tensor hold the
            producer's value."""
            for k in (0, None, -1):
                got = torch.stack([t[t.numel() // 2 if k is None else k] for t in own])
                if not torch.equal(got, want):
                    bad = (got != want).nonzero()[0].item()
                    raise CheckError("%s: tensor %d holds %s, not %s" % (
                        what, bad, got[bad].item(), want[bad].item()))

        def sync_per_tensor():
            t0 = time.perf_counter()
            req.put("per_tensor")
            handles = answer()
            for (fn, args), dst in zip(handles, own):
                dst.copy_(fn(*args))
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            req.put("ack")
            return (t1 - t0) * 1e3

        def sync_bucket():
            t0 = time.perf_counter()
            req.put("bucket")
            items = answer()
            k = 0
            for (fn, args), numels in items:
                flat = fn(*args)
                off = 0
                for ne in numels:
                    own[k].copy_(flat[off:off + ne])
                    off += ne
                    k += 1
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            req.put("ack")
            return (t1 - t0) * 1e3

        def timed(sync, what):
            """First (warm-up) and best of reps, each sync checked."""
            times = []
            for i in range(reps + 1):
                zero()
                times.append(sync())
                check("%s sync %d" % (what, i))
            return times[0], min(times[1:])

        phase = "per-tensor"
        (out["torch_ipc_per_tensor_first_ms"],
         out["torch_ipc_per_tensor_ms"]) = timed(sync_per_tensor, "per-tensor")
        phase = "bucket"
        (out["torch_ipc_bucket_first_ms"],
         out["torch_ipc_bucket_ms"]) = timed(sync_bucket, "bucket")
        out["torch_check"] = True
    except Exception as e:  # noqa: BLE001
        # What was measured (and checked) before the failure stays.
        if isinstance(e, CheckError):
            out["torch_check"] = False
        out["torch_reason"] = "torch baseline failed in its %s phase: %r" % (phase, e)
    finally:
        req.put("stop")
        # Within the caller's limit (ours + 10 s): our JSON line must come.
        p.join(timeout=max(1.0, min(30.0, deadline + 5 - time.monotonic())))
        if p.is_alive():
            p.kill()
            p.join()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
