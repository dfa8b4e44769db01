#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""torch_check - PyTorch trainer weights published through wexd to an engine
process on the same GPU, checked tensor by tensor with torch.equal.

    torch_check.py mempool      trainer parameters allocated through wex's
                                allocator entry points (CUDAPluggableAllocator
                                over wex_cuda_alloc/wex_cuda_free, in a
                                torch.cuda.MemPool)
    torch_check.py expandable   trainer started with
                                PYTORCH_ALLOC_CONF=expandable_segments:True
                                (and the old name, PYTORCH_CUDA_ALLOC_CONF;
                                no allocator code); the embedding spans
                                several 20 MiB chunks
    torch_check.py fsdp         as expandable, the model under FSDP2
                                (fully_shard over a 1-GPU NCCL mesh):
                                register_module takes the DTensor
                                parameters' local shards (a 1-way shard
                                holds every row) where FSDP2 keeps them

Three processes: a wexd of the test's own, a trainer (a small bf16
decoder-like model; v1 = its initial weights, v2 and v3 each after one real
SGD step whose kernels are still queued when it publishes) and an engine
with its own copy of the model.  For every version the engine
  * remaps (view): tensors over the trainer's memory;
  * remaps (same address): regions reserved through wex, with a CUDA graph
    captured over them before the first swap, replayed after each swap; the
    reserved physical memory is given back while mapped (free memory rises);
  * copies in place into its own parameters;
  * copies, verified, through the engine hook (wex.engine.EngineRank) into
    another copy of the model;
and compares every tensor with torch.equal against the trainer's own copy
of that version (saved to a file after publishing).

Needs PyTorch with CUDA and a GPU: without them it prints the reason and
exits 77.  Environment: WEX_LIB (libwex.so), WEXD_BIN, PYTHONPATH with
adapters/python.
"""
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

MODEL = "torch-check"
VERSIONS = 3
VOCAB, HIDDEN, FFN, LAYERS = 32000, 1024, 4096, 2


def build_model(torch):
    nn = torch.nn
    layers = []
    for _ in range(LAYERS):
        layers += [nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN)]
    return nn.Sequential(nn.Embedding(VOCAB, HIDDEN), *layers,
                         nn.Linear(HIDDEN, VOCAB, bias=False)).to("cuda", torch.bfloat16)


def skip_reason():
    try:
        import torch
    except ImportError as e:
        return "no PyTorch for %s: %s" % (sys.executable, e)
    if not torch.cuda.is_available():
        return "PyTorch %s sees no CUDA device (cuda build: %s)" % (torch.__version__,
                                                                     torch.version.cuda)
    mode = sys.argv[1]
    if mode == "mempool" and not hasattr(torch.cuda, "use_mem_pool"):
        return "PyTorch %s has no torch.cuda.use_mem_pool (2.6 or later)" % torch.__version__
    if mode == "fsdp":
        if fsdp_api() is None:
            return "PyTorch %s has no FSDP2 fully_shard / init_device_mesh" % torch.__version__
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_nccl_available():
            return "PyTorch %s has no NCCL process group" % torch.__version__
    return None


def fsdp_api():
    """(fully_shard, init_device_mesh) of this PyTorch (2.6+:
    torch.distributed.fsdp; 2.4-2.5: torch.distributed._composable.fsdp),
    or None."""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
    except ImportError:
        return None
    return fully_shard, init_device_mesh


def whole(p):
    """The whole tensor of parameter p: a DTensor's full_tensor()."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def trainer(mode, workdir):
    import contextlib
    import gc
    import torch
    import wex
    from wex import torch_util

    torch.cuda.set_device(0)
    alloc = pool = None
    ctx = contextlib.nullcontext()
    if mode == "mempool":
        alloc, pool = torch_util.exportable_pool()
        ctx = torch.cuda.use_mem_pool(pool)
    with ctx:
        torch.manual_seed(1)
        model = build_model(torch)
    del ctx  # it holds the pool too
    if mode == "fsdp":
        import torch.distributed as dist
        fully_shard, init_device_mesh = fsdp_api()
        dist.init_process_group("nccl", init_method="file://" + os.path.join(workdir, "pg"),
                                rank=0, world_size=1)
        # Each parameter becomes a DTensor (Shard(0)) whose local shard
        # FSDP2 copies into a buffer of its own, kept for the run: the
        # optimizer steps it in place; forward and backward all-gather
        # into other memory, freed after.
        fully_shard(model, mesh=init_device_mesh("cuda", (1,)))
    params = list(model.named_parameters())
    if mode == "fsdp":
        bad = [n for n, p in params if not hasattr(p, "to_local")]
        if bad:
            raise AssertionError("fully_shard left %d parameters plain tensors, first %s"
                                 % (len(bad), bad[0]))
    if mode in ("expandable", "fsdp"):
        # Else plain cudaMalloc segments, refused below as not exportable.
        exp = [(s["address"], s["address"] + s["total_size"])
               for s in torch.cuda.memory_snapshot() if s.get("is_expandable")]
        local = [(n, p.to_local() if hasattr(p, "to_local") else p) for n, p in params]
        if not all(any(a <= p.data_ptr() < e for a, e in exp) for _, p in local):
            raise AssertionError("PyTorch %s did not put the parameters in expandable segments "
                                 "(PYTORCH_ALLOC_CONF=%s)" % (torch.__version__,
                                                              os.environ.get("PYTORCH_ALLOC_CONF")))
    # Gradients in the allocator's segments beside the parameters (the
    # same expandable segment): register_module must leave them out.
    warm = torch.randint(0, VOCAB, (4, 64), device="cuda",
                         generator=torch.Generator(device="cuda").manual_seed(3))
    model(warm).float().square().mean().backward()
    c = wex.Client(wex.ROLE_PRODUCER, MODEL, rank=0, world_size=1)
    segs = torch_util.register_module(c, params)
    big = max(p.numel() * p.element_size() for _, p in params)
    total = sum(p.numel() * p.element_size() for _, p in params)
    print("segments %d %d %d %d" % (len(segs), sum(s for _, _, s in segs), big, total),
          flush=True)
    opt = torch.optim.SGD([p for _, p in params], lr=0.5)
    gen = torch.Generator(device="cuda").manual_seed(2)
    loss = None
    for line in sys.stdin:
        v = int(line)
        c.begin_write(v, 60000)
        if v > 1:
            x = torch.randint(0, VOCAB, (4, 64), device="cuda", generator=gen)
            loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        # No torch.cuda.synchronize(): publish must wait for the step.
        c.publish(v)
        torch.save({n: whole(p).detach().cpu() for n, p in params},
                   os.path.join(workdir, "v%d.pt" % v))
        print("published %d" % v, flush=True)
    c.close()
    # The pool's tensors go first (pytorch#146431), then the pool (its
    # destructor frees its segments through the allocator), then the
    # allocator (held by a raw pointer, pytorch#171962).  loss's graph
    # holds the parameters too (AccumulateGrad).
    del model, params, opt, loss
    gc.collect()
    torch.cuda.synchronize()
    del pool
    del alloc
    if mode == "fsdp":
        import torch.distributed as dist
        dist.destroy_process_group()


def engine(workdir):
    import torch
    import wex
    from wex import torch_util

    torch.cuda.set_device(0)
    torch.manual_seed(99)
    own = build_model(torch)
    own_params = dict(own.named_parameters())
    ccopy = wex.Client(wex.ROLE_CONSUMER, MODEL, group="copy", timeout_ms=60000)
    torch_util.attach_module(ccopy, own_params.items())
    # The engine hook (wex.engine.EngineRank, what wex.vllm and wex.sglang
    # run in the engines' workers) on a model of its own, verified.
    from wex.engine import EngineRank
    hooked = build_model(torch)
    hooked_params = dict(hooked.named_parameters())
    hook = EngineRank(MODEL, hooked.named_parameters(), group="hook", timeout_ms=60000,
                      device=0)
    cmap = wex.Client(wex.ROLE_CONSUMER, MODEL, group="remap", timeout_ms=60000)
    fixed = graph = clones = None

    def compare(what, tensors, ref):
        if sorted(tensors) != sorted(ref):
            raise AssertionError("%s: tensors %s, trainer has %s" % (what, sorted(tensors),
                                                                      sorted(ref)))
        bad = [n for n in ref if not torch.equal(tensors[n].cpu(), ref[n])]
        if bad:
            raise AssertionError("%s: %d of %d tensors differ from the trainer's, first %s"
                                 % (what, len(bad), len(ref), bad[0]))

    for line in sys.stdin:
        v = int(line)
        ref = torch.load(os.path.join(workdir, "v%d.pt" % v))
        fig = {"version": v}

        r = cmap.sync(wex.SYNC_REMAP_VIEW, min_version=v)
        assert r.version == v, "view sync served v%d, wanted v%d" % (r.version, v)
        fig["view_ms"] = r.seconds * 1e3
        compare("view v%d" % v, torch_util.view_tensors(cmap), ref)

        if fixed is None:
            fixed = torch_util.reserve_like(cmap)
            torch_util.attach_module(cmap, fixed.items())
            # A graph captured over the reserved regions before any swap.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                [t.clone() for t in fixed.values()]
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                clones = {n: t.clone() for n, t in fixed.items()}
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        r = cmap.sync(wex.SYNC_REMAP_FIXED, min_version=v)
        assert r.version == v, "fixed sync served v%d, wanted v%d" % (r.version, v)
        free1 = torch.cuda.mem_get_info()[0]
        fig["fixed_ms"] = r.seconds * 1e3
        fig["fixed_freed_mib"] = (free1 - free0) / 2**20
        compare("same-address v%d" % v, fixed, ref)
        graph.replay()
        torch.cuda.synchronize()
        compare("graph captured before the swap, v%d" % v, clones, ref)
        mapped = sum(t.numel() * t.element_size() for t in fixed.values())
        if v == 1 and free1 - free0 < mapped - (64 << 20):
            raise AssertionError("same-address remap of %d MiB freed only %.1f MiB of the "
                                 "engine's own memory" % (mapped >> 20, (free1 - free0) / 2**20))
        cmap.release()

        r = ccopy.sync(wex.SYNC_COPY, min_version=v)
        assert r.version == v, "copy sync served v%d, wanted v%d" % (r.version, v)
        fig["copy_ms"] = r.seconds * 1e3
        fig["copy_gib_s"] = r.bytes / max(r.seconds, 1e-9) / 2**30
        compare("copy v%d" % v, own_params, ref)

        r = hook.sync(min_version=v, verify=True)
        assert r["version"] == v, "hook sync served v%d, wanted v%d" % (r["version"], v)
        assert r["verified"] == sum(t.numel() * t.element_size() for t in ref.values()), \
            "hook sync verified %d bytes" % r["verified"]
        fig["hook_ms"] = r["seconds"] * 1e3
        fig["hook_verify_ms"] = r["verify_seconds"] * 1e3
        compare("hook v%d" % v, hooked_params, ref)
        print("checked " + json.dumps(fig), flush=True)
    # Tensors over cmap's regions would keep it open past close().
    fixed = clones = graph = None
    cmap.close()
    ccopy.close()
    hook.close()


def readline(p, timeout, deadline):
    """A line from child p within timeout s, and before deadline (ctest's
    TIMEOUT must not be what ends the test: it would say nothing)."""
    timeout = max(0, min(timeout, deadline - time.monotonic()))
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready:
        raise AssertionError("%s: no answer in %d s" % (p.args[2], timeout))
    line = p.stdout.readline()
    if not line:
        raise AssertionError("%s exited with %s" % (p.args[2], p.wait()))
    return line.strip()


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("mempool", "expandable", "fsdp"):
        print("usage: torch_check.py mempool|expandable|fsdp", file=sys.stderr)
        return 2
    reason = skip_reason()
    if reason:
        print("torch_check %s: skipped: %s" % (mode, reason))
        return 77
    # Under ctest's TIMEOUT (130 s) with time left to stop the children;
    # tests/gpu/device_run.sh sets 60 s so that the three torch checks fit
    # one step.
    deadline = time.monotonic() + float(os.environ.get("WEX_TORCH_CHECK_S", "95"))
    workdir = tempfile.mkdtemp(prefix="wex-torch-")
    env = dict(os.environ, WEX_SOCKET=os.path.join(workdir, "wexd.sock"))
    # PYTORCH_ALLOC_CONF is the name since torch 2.8 and wins over the old
    # PYTORCH_CUDA_ALLOC_CONF (2.9.1 honoured only the old one for
    # expandable_segments, pytorch#183387): both or neither.
    # TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0 makes expandable segments
    # unexportable.
    for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
              "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC"):
        env.pop(k, None)
    from wexd_harness import start_wexd
    wexd = start_wexd(env)
    tenv = dict(env)
    if mode in ("expandable", "fsdp"):
        tenv["PYTORCH_ALLOC_CONF"] = tenv["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    me = os.path.abspath(__file__)
    tr = subprocess.Popen([sys.executable, me, "trainer", mode, workdir], env=tenv, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    en = subprocess.Popen([sys.executable, me, "engine", workdir], env=env, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ok = False
    try:
        nseg, segbytes, big, total = map(int, readline(tr, 120, deadline).split()[1:])
        print("trainer (%s): %d range(s) registered, %.1f MiB, for %.1f MiB of parameters; "
              "largest tensor %.1f MiB" % (mode, nseg, segbytes / 2**20, total / 2**20,
                                           big / 2**20))
        # Only the bytes under the parameters (gaps under MERGE_GAP
        # closed), not whole allocator segments, which hold the warm-up's
        # gradients too.
        from wex import torch_util
        if segbytes > total + nseg * torch_util.MERGE_GAP:
            raise AssertionError("registered %d bytes for %d bytes of parameters in %d ranges"
                                 % (segbytes, total, nseg))
        for v in range(1, VERSIONS + 1):
            t0 = time.monotonic()
            tr.stdin.write("%d\n" % v)
            tr.stdin.flush()
            assert readline(tr, 120, deadline) == "published %d" % v
            en.stdin.write("%d\n" % v)
            en.stdin.flush()
            fig = json.loads(readline(en, 120, deadline).split(" ", 1)[1])
            print("v%d: every tensor torch.equal in view, same-address (+graph) and copy; "
                  "view %.2f ms, same-address %.2f ms (freed %.0f MiB), copy %.2f ms "
                  "(%.1f GiB/s); round %.1f s" % (v, fig["view_ms"], fig["fixed_ms"],
                                                 fig["fixed_freed_mib"], fig["copy_ms"],
                                                 fig["copy_gib_s"], time.monotonic() - t0))
        ok = True
    except (AssertionError, OSError, ValueError) as e:
        print("torch_check %s: %s" % (mode, e))
    finally:
        for p in (tr, en):
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass  # it died: its exit status says how
        for p in (tr, en):
            try:
                p.wait(20 if ok else 10)
            except subprocess.TimeoutExpired:
                print("%s did not exit: killed" % p.args[2])
                p.kill()
                p.wait()
            if p.returncode != 0:
                ok = False
                print("%s exited with %d" % (p.args[2], p.returncode))
        wexd.terminate()
        try:
            wexd.wait(10)
        except subprocess.TimeoutExpired:
            wexd.kill()
            wexd.wait()
        if wexd.returncode != 0:
            ok = False
            print("wexd exited with %d" % wexd.returncode)
    if ok:
        # The reference weights saved per version are as large as the model.
        shutil.rmtree(workdir)
    else:
        print("torch_check %s: kept %s (wexd's socket, the saved weights)" % (mode, workdir))
    print("torch_check %s: %s" % (mode, "passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "trainer":
        trainer(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "engine":
        engine(sys.argv[2])
    else:
        sys.exit(main())
