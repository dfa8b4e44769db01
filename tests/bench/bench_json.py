#!/usr/bin/env python3
"""bench_json.py MODE BENCH BINARY - proves that a GPU benchmark's last line
is its JSON object whatever happens, printed once, by the benchmark itself
(not by one of its children), and that its exit status says what happened:

  skip  no driver (WEX_CUDA_LIB=/nonexistent): exit 77, "error" starts
        with "skipped:", the figures null;
  fail  the run fails (the environment given makes it: a wexd that cannot
        start, a driver that loses copies): exit 1, "error" says why,
        "check" false or null;
  term  SIGTERM once the benchmark printed its first line (its handler is
        in place by then): killed by SIGTERM, "error" says so.

A benchmark that needs no GPU (host_sync, WEXD_BIN naming the wexd it
runs; plan_scale) has no skip run:

  cpu      the run finishes: exit 0, "error" null;
  cpufail  the run fails (the environment given makes it): exit 1, "error"
           says why;
  cputerm  SIGTERM once the benchmark printed its first line: killed by
           SIGTERM, the last line its JSON object, "error" saying so.

In the GPU modes the line has every key the skip line has (which is printed
by the same code as a finished run's), so a consumer of the JSON finds the
same keys whatever happened.  Exit 0 when all holds, 1 with the reason.
WEX_BENCH_JSON_KEYS (comma-separated; "a.b" for key b of object a, in the
cpu modes) names keys that must be there too.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def fail(msg, out=""):
    print("FAIL:", msg)
    if out:
        print("-- output tail:\n" + out[-3000:])
    sys.exit(1)


def run(binary, env, term=False):
    """(exit status, stdout) of one run; term: SIGTERM after its first line."""
    p = subprocess.Popen([binary], env=env, stdout=subprocess.PIPE, text=True)
    out = ""
    if term:
        first = p.stdout.readline()
        out += first
        if not first:
            p.wait(timeout=60)
            fail("no line before exit %d" % p.returncode, out)
        p.send_signal(signal.SIGTERM)
    try:
        rest, _ = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        exited = p.poll() is not None
        p.kill()
        try:
            rest, _ = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # (A process it started, a wexd, outlived it with its output.)
            rest = ""
        fail("%s 120 s after start%s" % (
            "exited, but a process it started still held its output open" if exited else
            "still running", " (and SIGTERM)" if term else ""), out + rest)
    return p.returncode, out + rest


def last_json(bench, out):
    lines = [l for l in out.splitlines() if l.strip()]
    if not lines:
        fail("no output", out)
    try:
        obj = json.loads(lines[-1])
    except ValueError as e:
        fail("last line is not JSON (%s): %r" % (e, lines[-1]), out)
    if not isinstance(obj, dict) or obj.get("bench") != bench:
        fail("last line is not the %s object: %r" % (bench, lines[-1]), out)
    n = sum(1 for l in lines if l.lstrip().startswith('{"bench":"%s"' % bench))
    if n != 1:
        fail("%d JSON lines of %s, not one" % (n, bench), out)
    # Figures of the emulated driver (tests/gpu/emul_cuda.c) are the
    # CPU's: the text a person reads says so too, not only the JSON.
    if obj.get("emulated") is True and not any("emulated driver" in l for l in lines[:-1]):
        fail("emulated run: no line of its text says that the driver is emulated", out)
    return obj


def has_key(obj, key):
    """Whether obj has key; "a.b": key b of the object at a."""
    for part in key.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return False
        obj = obj[part]
    return True


def main():
    mode, bench, binary = sys.argv[1:4]
    env = dict(os.environ)
    # A wexd of the run's own lives in a directory under TMPDIR
    # (gpu_world_start): a killed run's is removed with ours.
    tmp = tempfile.mkdtemp(prefix="wexbj-")
    env["TMPDIR"] = tmp
    try:
        if mode in ("cpu", "cpufail", "cputerm"):
            rc, out = run(binary, env, term=mode == "cputerm")
            if mode == "cputerm":
                obj = last_json(bench, out)
                if rc != -signal.SIGTERM:
                    fail("after SIGTERM: exit %d, not killed by SIGTERM" % rc, out)
                if "terminated" not in str(obj.get("error", "")):
                    fail("after SIGTERM: error %r does not say so" % obj.get("error"), out)
                print("PASS: %s cputerm: killed by SIGTERM, last line the JSON object "
                      "(error %r)" % (bench, obj.get("error")))
                return
            obj = last_json(bench, out)
            want_rc = 0 if mode == "cpu" else 1
            if rc != want_rc:
                fail("%s: exit %d, not %d" % (mode, rc, want_rc), out)
            if mode == "cpu" and ("error" not in obj or obj["error"] is not None):
                fail("a finished run: error %s, not null"
                     % (repr(obj["error"]) if "error" in obj else "absent"), out)
            if mode == "cpufail" and not obj.get("error"):
                fail("a failed run: no error in the JSON", out)
            want = {k for k in os.environ.get("WEX_BENCH_JSON_KEYS", "").split(",") if k}
            missing = sorted(k for k in want if not has_key(obj, k))
            if missing:
                fail("%s: keys missing from the JSON line: %s" % (mode, ", ".join(missing)), out)
            print("PASS: %s %s: exit %d, last line the JSON object (%d keys, error %r)"
                  % (bench, mode, rc, len(obj), obj.get("error")))
            return
        skip_env = dict(env, WEX_CUDA_LIB="/nonexistent")
        rc, out = run(binary, skip_env)
        skip = last_json(bench, out)
        if rc != 77:
            fail("without a driver: exit %d, not 77" % rc, out)
        if not str(skip.get("error", "")).startswith("skipped:"):
            fail("without a driver: error %r does not start with 'skipped:'" % skip.get("error"), out)
        if mode == "skip":
            obj = skip
        elif mode == "fail":
            rc, out = run(binary, env)
            obj = last_json(bench, out)
            if rc != 1:
                fail("a failed run: exit %d, not 1" % rc, out)
            if not obj.get("error"):
                fail("a failed run: no error in the JSON", out)
            if obj.get("check") not in (False, None):
                fail("a failed run: check %r" % obj.get("check"), out)
        elif mode == "term":
            rc, out = run(binary, env, term=True)
            obj = last_json(bench, out)
            if rc != -signal.SIGTERM:
                fail("after SIGTERM: exit %d, not killed by SIGTERM" % rc, out)
            if "terminated" not in str(obj.get("error", "")):
                fail("after SIGTERM: error %r does not say so" % obj.get("error"), out)
        else:
            fail("unknown mode %s" % mode)
        want = set(skip) | {k for k in os.environ.get("WEX_BENCH_JSON_KEYS", "").split(",") if k}
        missing = sorted(want - set(obj))
        if missing:
            fail("%s: keys missing from the JSON line: %s" % (mode, ", ".join(missing)), out)
        if mode == "term":
            # Nothing was measured: what the skip line has null is null.
            nonnull = sorted(k for k in skip if skip[k] is None and obj.get(k) is not None)
            if nonnull:
                fail("after SIGTERM: figures not null: %s" % ", ".join(nonnull), out)
        print("PASS: %s %s: exit %d, last line the JSON object (%d keys, error %r)"
              % (bench, mode, rc, len(obj), obj.get("error")))
    finally:
        # A killed run's wexd dies with it (PR_SET_PDEATHSIG), a moment later.
        for _ in range(20):
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.exists(tmp):
                break
            time.sleep(0.25)


if __name__ == "__main__":
    main()
