# SPDX-License-Identifier: MIT
"""wexd_harness - a wexd of the test's own and a producer child, shared by
the Python tests (tests/python, tests/gpu/torch_check.py)."""
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest


def start_wexd(env):
    """Starts $WEXD_BIN with env and returns it once it is ready."""
    r, w = os.pipe()
    wexd = subprocess.Popen([os.environ["WEXD_BIN"]], env=dict(env, WEXD_READY_FD=str(w)),
                            pass_fds=(w,))
    os.close(w)
    ready, _, _ = select.select([r], [], [], 20)
    assert ready and os.read(r, 8), "wexd did not become ready"
    os.close(r)
    return wexd


class WexdProducerCase(unittest.TestCase):
    """A wexd in a fresh directory (WEX_SOCKET points at it) and the test
    script run again as "producer": it publishes version v when told v on
    its stdin, answering "published v"."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="wex-py-")
        cls.sock = os.path.join(cls.dir, "wexd.sock")
        os.environ["WEX_SOCKET"] = cls.sock
        cls.wexd = start_wexd(os.environ)
        script = sys.modules[cls.__module__].__file__
        cls.prod = subprocess.Popen([sys.executable, script, "producer"], text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    @classmethod
    def tearDownClass(cls):
        cls.prod.stdin.close()
        assert cls.prod.wait(20) == 0, "producer exited with %s" % cls.prod.returncode
        cls.prod.stdout.close()
        cls.wexd.terminate()
        assert cls.wexd.wait(20) == 0, "wexd exited with %s" % cls.wexd.returncode
        shutil.rmtree(cls.dir)

    def publish(self, v):
        self.prod.stdin.write("%d\n" % v)
        self.prod.stdin.flush()
        self.assertEqual(self.prod.stdout.readline().strip(), "published %d" % v)

    def await_acquire(self, group, timeout=10.0, thread=None):
        """Polls wexd's client list (a condition, not a timed sleep; at
        most `timeout` seconds) until a consumer of this process in
        `group` waits there in an acquire, or `thread` (the one that
        syncs, where given) has ended: a sync with a short timeout may
        end before it is seen waiting on a loaded machine."""
        import wex  # (the harness itself loads no libwex)

        t0 = time.monotonic()
        with wex.Client(wex.ROLE_ADMIN) as admin:
            while time.monotonic() - t0 < timeout and \
                    (thread is None or thread.is_alive()) and not any(
                    k["pid"] == os.getpid() and k["group"] == group and
                    k["waiting"] == "acquire" for k in admin.request("clients")["clients"]):
                time.sleep(0.01)
