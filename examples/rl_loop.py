#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rl_loop.py - an RL-style loop through wex on host memory, in PyTorch:
a trainer process trains a small policy and publishes its weights after
each optimizer step (wex.trainer.TrainerRank); an engine process, with a
model of its own, copies each version into its parameters in place before
its "rollout" (wex.engine.EngineRank) and checks that it computes exactly
what the trainer's model computes.  The syncs of every 5th version also
compare every byte with the trainer's (verify=True).

    PYTHONPATH=adapters/python WEX_LIB=build/libwex.so \\
        python3 examples/rl_loop.py --wexd build/wexd [--steps 20]

--wexd starts a wexd of its own in a temporary directory; without it the
script uses the wexd at $WEX_SOCKET (or the default socket).  Needs
PyTorch (Debian's python3-torch serves /usr/bin/python3).  On a GPU the
same hooks take CUDA parameters: the trainer's in exportable memory
(torch_util.exportable_pool, or PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True) with no segments=, the engine's wherever they
are; see README's "Sync hooks".

When either process fails (an exception, wexd gone), the other is stopped
at once and the script exits 1 with "rl_loop: failed: " and the cause.
SIGTERM (or SIGINT) stops both, and the wexd it started, and exits 128 plus
the signal's number.
"""
import argparse
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time

MODEL = "rl-loop-policy"


def policy():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 16))


def receive(q, parent):
    """q.get(), but gives up when the main process is gone (it stops the
    other process when one fails; without it nobody would)."""
    while True:
        try:
            return q.get(timeout=1)
        except queue.Empty:
            if os.getppid() != parent:
                raise SystemExit("the main process is gone")


def trainer(steps, to_engine, from_engine, parent):
    import torch
    import wex
    from wex import torch_util
    from wex.trainer import TrainerRank

    torch.manual_seed(1)
    model = policy()
    # CPU parameters must live in memory wex can share: one host segment,
    # the parameters moved into it (a GPU trainer skips this: its
    # parameters are exported where its allocator put them).
    client = wex.Client(wex.ROLE_PRODUCER, MODEL, rank=0, world_size=1)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    seg, base = client.segment_alloc(wex.SEG_HOST, size)
    at = base
    for p in model.parameters():
        t = torch_util.from_ptr(at, p.shape, p.dtype, device="cpu")
        t.copy_(p.data)
        p.data = t
        at += p.numel() * p.element_size()
    t = TrainerRank(MODEL, model.named_parameters, client=client,
                    segments=[(seg, base, size)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)  # updates in place
    target = torch.nn.Linear(64, 16)
    t.publish(1)  # the initial weights
    for step in range(1, steps + 1):
        x = torch.randn(128, 64)
        loss = torch.nn.functional.mse_loss(model(x), target(x).detach())
        opt.zero_grad()
        loss.backward()
        with t.write(step + 1):  # engines do not read while the step writes
            opt.step()
        probe = torch.randn(8, 64)
        with torch.no_grad():
            to_engine.put((step + 1, float(loss), probe, model(probe)))
        receive(from_engine, parent)  # the engine's rollout is done
    to_engine.put(None)
    t.close()
    client.close()


def engine(to_engine, from_engine, parent):
    import torch
    from wex.engine import EngineRank

    torch.manual_seed(2)  # other weights than the trainer's
    model = policy()
    e = EngineRank(MODEL, model.named_parameters(), group="rollout", timeout_ms=10000)
    ptrs = [p.data_ptr() for p in model.parameters()]
    while True:
        msg = receive(to_engine, parent)
        if msg is None:
            break
        version, loss, probe, want = msg
        r = e.sync(min_version=version, verify=version % 5 == 0)
        with torch.no_grad():
            got = model(probe)  # the "rollout"
        same = torch.equal(got, want)
        print("version %3d  loss %.4f  sync %6.3f ms  %7d bytes%s  outputs %s"
              % (r["version"], loss, r["seconds"] * 1e3, r["bytes"],
                 "  verified %d bytes" % r["verified"] if r["verified"] else "",
                 "equal" if same else "DIFFER"), flush=True)
        if not same or r["version"] != version:
            raise SystemExit("engine: version %d does not compute what the trainer's does"
                             % version)
        from_engine.put(version)
    assert ptrs == [p.data_ptr() for p in model.parameters()], "parameters moved"
    e.close()


def run(target, args, errors):
    """target(*args) in a child process; what ends it with an error is also
    sent to the main process, which names it in its own message."""
    try:
        target(*args)
    except BaseException as e:
        if not (isinstance(e, SystemExit) and e.code in (None, 0)):
            errors.put("%s: %s" % (type(e).__name__, e))
        raise


def wexd_log(tmp):
    """wexd's log, for a message (the directory is removed at exit)."""
    try:
        with open(os.path.join(tmp, "wexd.log"), errors="replace") as f:
            text = f.read().strip()
    except OSError as e:
        text = "(unreadable: %s)" % e
    return "log:\n" + text if text else "log is empty"


def start_wexd(path, tmp, started):
    """Starts wexd and appends it to `started` (for the caller's cleanup,
    also when a signal stops this before it returns)."""
    env = dict(os.environ, WEX_SOCKET=os.path.join(tmp, "wexd.sock"))
    # A signal raised inside Popen (it waits for the child's exec) lost the
    # wexd it had just started, left running: the signal waits until wexd
    # is in `started`.
    deferred["on"] = True
    try:
        with open(os.path.join(tmp, "wexd.log"), "w") as log:
            d = subprocess.Popen([path], env=env, stdout=subprocess.DEVNULL, stderr=log)
            started.append(d)
    except OSError as e:
        raise SystemExit("rl_loop: cannot start wexd %s: %s" % (path, e.strerror or e))
    finally:
        deferred["on"] = False
        if deferred["signum"]:
            raise Stopped(deferred["signum"])
    try:
        for _ in range(200):
            if os.path.exists(env["WEX_SOCKET"]):
                os.environ["WEX_SOCKET"] = env["WEX_SOCKET"]
                return d
            if d.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:
        # (A signal while waiting: the caller never gets d to stop it.)
        d.kill()
        d.wait()
        raise
    d.kill()
    d.wait()
    raise SystemExit("rl_loop: wexd %s did not start (exit status %s); its %s"
                     % (path, d.returncode, wexd_log(tmp)))


def supervise(procs, errors, wexd, tmp, limit_s=300):
    """Waits for both processes.  The first to fail (or wexd exiting, or
    the time limit) ends the run: the survivor is killed, since it would
    wait for its peer forever.  Returns None, or the cause of the failure."""
    pending = {p.sentinel: p for p in procs}
    deadline = time.monotonic() + limit_s
    cause = None
    while pending and cause is None:
        left = deadline - time.monotonic()
        if left <= 0:
            cause = "no result after %d s from %s" % (
                limit_s, ", ".join(p.name for p in pending.values()))
            break
        for s in mp.connection.wait(list(pending), timeout=min(left, 0.5)):
            p = pending.pop(s)
            p.join()
            if p.exitcode != 0 and cause is None:
                cause = "%s exited with %s" % (p.name, p.exitcode)
                if wexd is not None:
                    # wexd gone is the cause; the process only saw it first.
                    try:
                        wexd.wait(0.5)
                        cause = "wexd exited with %s, then %s" % (wexd.returncode, cause)
                    except subprocess.TimeoutExpired:
                        pass
        if cause is None and wexd is not None and wexd.poll() is not None:
            cause = "wexd exited with %s" % wexd.returncode
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()
    if cause is None:
        return None
    # What the failing process raised (it may take a moment to arrive).
    why = []
    try:
        why.append(errors.get(timeout=2))
        while True:
            why.append(errors.get_nowait())
    except queue.Empty:
        pass
    if why:
        cause += " (%s)" % "; ".join(why)
    if wexd is not None and wexd.poll() is not None:
        cause += "; wexd's " + wexd_log(tmp)
    return cause


def positive(text):
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


class Stopped(BaseException):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


# While "on", a signal is noted and raised later (see start_wexd).
deferred = {"on": False, "signum": 0}


def on_signal(signum, frame):
    if deferred["on"]:
        deferred["signum"] = deferred["signum"] or signum
        return
    raise Stopped(signum)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wexd", default=os.environ.get("WEXD_BIN"),
                    help="start this wexd in a temporary directory")
    ap.add_argument("--steps", type=positive, default=20)
    a = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("rl_loop: skipped: no PyTorch for %s: %s" % (sys.executable, e))
        return 77
    # SIGTERM (timeout(1), a cancelled job, kill) ended this process alone
    # at once: its wexd and temporary directory stayed, and the trainer
    # and the engine, whose queues kept them busy, trained on.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = tempfile.TemporaryDirectory(prefix="wex-rl-")
    wexd = None
    started = []  # (the wexd started, for the cleanup below)
    procs = []
    try:
        wexd = start_wexd(a.wexd, tmp.name, started) if a.wexd else None
        ctx = mp.get_context("spawn")
        q_to, q_from, errors = ctx.Queue(), ctx.Queue(), ctx.Queue()
        me = os.getpid()
        procs = [ctx.Process(target=run, args=(trainer, (a.steps, q_to, q_from, me), errors),
                             name="trainer"),
                 ctx.Process(target=run, args=(engine, (q_to, q_from, me), errors),
                             name="engine")]
        for p in procs:
            p.start()
        cause = supervise(procs, errors, wexd, tmp.name)
        if cause is not None:
            print("rl_loop: failed: %s" % cause, flush=True)
            return 1
        print("rl_loop: %d versions trained, published, synced in place and checked" % a.steps)
        return 0
    except Stopped as e:
        print("rl_loop: stopped by signal %d" % e.signum, flush=True)
        return 128 + e.signum
    finally:
        for p in procs:
            if p.pid is not None:  # (started)
                if p.is_alive():
                    p.kill()
                p.join()
        for d in started:
            if d.poll() is None:
                d.terminate()
                d.wait(20)
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
