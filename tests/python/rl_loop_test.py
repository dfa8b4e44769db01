#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""rl_loop_test - examples/rl_loop.py fails fast, saying why:
  - wexd killed mid-run: exit 1 with "rl_loop: failed: wexd exited with
    -9" (the engine waited for the trainer's next version forever, main
    joined each process for 300 s, then the ctest timeout hid the cause);
  - one of the two processes killed mid-run: exit 1 with "rl_loop:
    failed: trainer|engine exited with -9" (its peer waited forever);
  - a wexd that does not start: its log's content in the message (the
    message named a log file in a directory already removed); a --wexd
    that does not exist: a one-line message, no traceback;
  - --steps 0 and --steps -3: refused, exit 2 (they claimed success);
  - SIGTERM to rl_loop (timeout(1), a CI job cancelled, kill): exit 143
    with its wexd, trainer and engine gone (it died at once, leaving its
    wexd, the temporary directory, and the two processes training on);
    also a SIGTERM that lands while Popen starts wexd (after the fork,
    before Popen returned: wexd was left running, and re-created the
    temporary directory rl_loop had just removed).
A run that hangs is killed after 90 s and fails the test.
Needs Debian's python3-torch (exit 77 without).
Environment: WEX_LIB, WEXD_BIN, PYTHONPATH with adapters/python.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

try:
    import torch
    del torch  # (only whether it imports)
except ImportError as e:
    print("rl_loop_test: skipped: no PyTorch for %s: %s" % (sys.executable, e))
    sys.exit(77)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "examples", "rl_loop.py")
HANG_S = 90


class RlLoop(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="wex-rltest-")
        self.addCleanup(self.tmp.cleanup)
        self.pidfile = os.path.join(self.tmp.name, "wexd.pid")
        # A wexd that writes down its pid, for the test to kill it.
        self.wexd = os.path.join(self.tmp.name, "wexd.sh")
        with open(self.wexd, "w") as f:
            f.write('#!/bin/sh\necho $$ > "%s"\nexec "%s"\n'
                    % (self.pidfile, os.environ["WEXD_BIN"]))
        os.chmod(self.wexd, 0o755)

    def start(self, *args):
        """rl_loop.py ARGS in a session of its own; its output collected."""
        p = subprocess.Popen([sys.executable, SCRIPT] + list(args),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        self.addCleanup(self.reap, p)
        p.lines = []
        p.seen = threading.Condition()

        def pump():
            for line in p.stdout:
                with p.seen:
                    p.lines.append(line)
                    p.seen.notify_all()
            with p.seen:
                p.lines.append(None)
                p.seen.notify_all()
        p.reader = threading.Thread(target=pump, daemon=True)
        p.reader.start()
        return p

    def reap(self, p):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        p.reader.join(10)
        p.stdout.close()

    def wait_line(self, p, pattern):
        with p.seen:
            ok = p.seen.wait_for(lambda: None in p.lines or
                                 any(x and re.search(pattern, x) for x in p.lines),
                                 timeout=HANG_S)
        self.assertTrue(ok and None not in p.lines,
                        "no line matching %r: %s" % (pattern, "".join(filter(None, p.lines))))

    def finish(self, p):
        """rl_loop's exit status and output; fails when it hangs."""
        try:
            rc = p.wait(HANG_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            p.reader.join(10)
            self.fail("rl_loop still running %d s after the failure: %s"
                      % (HANG_S, "".join(filter(None, p.lines))))
        p.reader.join(10)
        return rc, "".join(filter(None, p.lines))

    def test_wexd_killed(self):
        p = self.start("--wexd", self.wexd, "--steps", "100000")
        self.wait_line(p, r"^version +3 ")
        with open(self.pidfile) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        rc, out = self.finish(p)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"rl_loop: failed: wexd exited with -9", out)

    def test_process_killed(self):
        p = self.start("--wexd", self.wexd, "--steps", "100000")
        self.wait_line(p, r"^version +3 ")
        kids = self.kids(p)
        self.assertEqual(len(kids), 2, "rl_loop's processes: %s" % kids)
        os.kill(min(kids), signal.SIGKILL)
        rc, out = self.finish(p)
        self.assertEqual(rc, 1, out)
        self.assertRegex(out, r"rl_loop: failed: (trainer|engine) exited with -9", out)

    def kids(self, p):
        """rl_loop's trainer and engine: its children started by spawn."""
        kids = []
        for pid in os.listdir("/proc"):
            try:
                with open("/proc/%s/stat" % pid) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == p.pid and b"spawn_main" in cmd:
                kids.append(int(pid))
        return kids

    def test_sigterm(self):
        p = self.start("--wexd", self.wexd, "--steps", "100000")
        self.wait_line(p, r"^version +3 ")
        kids = self.kids(p)
        self.assertEqual(len(kids), 2, "rl_loop's processes: %s" % kids)
        with open(self.pidfile) as f:
            wexd = int(f.read())
        os.kill(p.pid, signal.SIGTERM)
        rc, out = self.finish(p)
        left = []
        for pid in kids + [wexd]:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                left.append(pid)
                os.kill(pid, signal.SIGKILL)
        self.assertEqual(left, [], "left running after SIGTERM (trainer, engine, wexd: "
                         "%s, %d): %s" % (kids, wexd, out))
        self.assertEqual(rc, 143, out)
        self.assertIn("rl_loop: stopped by signal 15", out)

    def test_sigterm_while_wexd_starts(self):
        # rl_loop run with a Popen that sends SIGTERM to rl_loop once its
        # child runs: the signal's handler raises inside Popen, as a real
        # SIGTERM does while Popen waits for the child's exec.
        prog = ("import os, runpy, signal, subprocess, sys\n"
                "class P(subprocess.Popen):\n"
                "    def __init__(self, *a, **k):\n"
                "        super().__init__(*a, **k)\n"
                "        os.kill(os.getpid(), signal.SIGTERM)\n"
                "subprocess.Popen = P\n"
                "sys.argv = [%r, '--wexd', %r, '--steps', '100000']\n"
                "runpy.run_path(%r, run_name='__main__')\n" % (SCRIPT, self.wexd, SCRIPT))
        p = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out = p.communicate(timeout=HANG_S)[0]
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out = p.communicate()[0]
        # The wexd wrapper writes its pid at once, if it got to run.
        for _ in range(40):
            if os.path.exists(self.pidfile):
                break
            time.sleep(0.05)
        if os.path.exists(self.pidfile):
            with open(self.pidfile) as f:
                wexd = int(f.read())
            for _ in range(40):  # (exiting: a moment to go)
                try:
                    with open("/proc/%d/stat" % wexd) as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    break
                if state == "Z":
                    break
                time.sleep(0.05)
            else:
                os.kill(wexd, signal.SIGKILL)
                self.fail("wexd %d left running after a SIGTERM while it started: %s"
                          % (wexd, out))
        self.assertEqual(p.returncode, 143, out)
        self.assertIn("rl_loop: stopped by signal 15", out)

    def test_wexd_does_not_start(self):
        bad = os.path.join(self.tmp.name, "bad.sh")
        with open(bad, "w") as f:
            f.write("#!/bin/sh\necho 'wexd: cannot listen: some reason' >&2\nexit 3\n")
        os.chmod(bad, 0o755)
        rc, out = self.finish(self.start("--wexd", bad))
        self.assertEqual(rc, 1, out)
        self.assertIn("did not start (exit status 3)", out)
        self.assertIn("wexd: cannot listen: some reason", out)
        missing = os.path.join(self.tmp.name, "nonexistent")
        rc, out = self.finish(self.start("--wexd", missing))
        self.assertEqual(rc, 1, out)
        self.assertIn("rl_loop: cannot start wexd %s: No such file or directory" % missing, out)
        self.assertNotIn("Traceback", out)

    def test_bad_steps(self):
        for steps in ("0", "-3", "x"):
            rc, out = self.finish(self.start("--wexd", self.wexd, "--steps", steps))
            self.assertEqual(rc, 2, out)
            self.assertIn("argument --steps: invalid positive value", out)
            self.assertFalse(os.path.exists(self.pidfile), "wexd started for --steps " + steps)


if __name__ == "__main__":
    unittest.main(verbosity=2)
