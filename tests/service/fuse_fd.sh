#!/bin/sh
# fuse_fd.sh WEXD - proves that a client cannot stop wexd's loop with a
# file on a FUSE mount it serves: closing such an fd sends the server a
# FLUSH and waits for its answer, and statx/fstat asks it for attributes
# (GETATTR).  The client here answers neither, for wexd: before, wexd
# stood still in request_wait_answer (no client answered, not even
# wexctl) until the server went away.  Two ways in: an fd passed with a
# request that takes none (wexd closes it at once), and an fd registered
# as a producer's host memory (checked with fstat, then closed when the
# producer leaves).  Now each is answered, another client's ping is
# answered meanwhile, and the FLUSH waits on a thread of wexd's own.
# Needs root and /dev/fuse (skipped otherwise).
WEXD=$1
. "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3; [ -x $PY ] || PY=python3
command -v $PY >/dev/null || skip "python3 missing"
[ "$(id -u)" = 0 ] || skip "needs root to mount a FUSE file system"
[ -c /dev/fuse ] || skip "no /dev/fuse"
start_wexd
$PY - "$WEX_SOCKET" "$WEXD_PID" "$TMP" <<'PYEOF'
import array, ctypes, json, os, socket, struct, sys, threading, time
path, wexd, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)
mnt = tmp + "/mnt"
os.mkdir(mnt)
dev = os.open("/dev/fuse", os.O_RDWR)
if libc.mount(b"wexfuse", mnt.encode(), b"fuse", 6,
              ("fd=%d,rootmode=40000,user_id=0,group_id=0" % dev).encode()) != 0:
    print("SKIP: cannot mount FUSE here: %s" % os.strerror(ctypes.get_errno()))
    sys.exit(77)
ignored = []
def of_wexd(pid):
    try:
        return pid == wexd or ("Tgid:\t%d\n" % wexd) in open("/proc/%d/status" % pid).read()
    except OSError:
        return False
def attr(ino, mode, size, nlink):
    return struct.pack("<QQQQQQIIIIIIIIII", ino, size, 0, 0, 0, 0, 0, 0, 0, mode, nlink,
                       0, 0, 0, 4096, 0)
def serve():
    # A file "f" of 1 MiB; GETATTR and FLUSH from wexd are never answered.
    while True:
        try:
            b = os.read(dev, (1 << 20) + 4096)
        except OSError:
            return
        _, op, uniq, node, _, _, pid = struct.unpack_from("<IIQQIII", b)
        out, err = b"", 0
        if op in (3, 25) and of_wexd(pid):
            ignored.append(("GETATTR" if op == 3 else "FLUSH", pid))
            continue
        if op == 26:    # INIT
            out = struct.pack("<IIIIHHIIHHII", 7, 31, 65536, 0, 16, 12, 65536, 1, 0, 0, 0, 0) + bytes(24)
        elif op == 1:   # LOOKUP
            if b[40:].rstrip(b"\0") == b"f":
                out = struct.pack("<QQQQII", 2, 0, 0, 0, 0, 0) + attr(2, 0o100644, 1 << 20, 1)
            else:
                err = -2
        elif op == 3:   # GETATTR (attributes valid for 0 s: asked each time)
            out = struct.pack("<QII", 0, 0, 0) + (attr(1, 0o40755, 0, 2) if node == 1
                                                   else attr(2, 0o100644, 1 << 20, 1))
        elif op == 14:  # OPEN
            out = struct.pack("<QII", 1, 0, 0)
        elif op not in (25, 18):  # FLUSH, RELEASE: 0
            err = -38
        try:
            os.write(dev, struct.pack("<IiQ", 16 + len(out) * (not err), err, uniq) + (b"" if err else out))
        except OSError:
            pass
threading.Thread(target=serve, daemon=True).start()
def ask(s, req, fds=()):
    s.settimeout(5)
    s.sendmsg([json.dumps(dict(v=1, **req)).encode()],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
    try:
        return json.loads(s.recv(65536))
    except socket.timeout:
        return None
def conn():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s
def ping(what):
    s = conn()
    t = time.time()
    r = ask(s, dict(op="ping"))
    s.close()
    if not r or not r.get("ok"):
        fail("%s: another client's ping went unanswered for 5 s (wexd's loop stood still; "
             "wexd's requests left unanswered: %s)" % (what, ignored))
    print("%s: another client's ping answered in %.1f ms" % (what, (time.time() - t) * 1e3))
def release():
    # The server goes (MNT_FORCE aborts its connection): what waits on it
    # ends (ENOTCONN), wexd before the fix included.
    libc.umount2(mnt.encode(), 2 | 1)
    os.close(dev)
def fail(msg):
    print("FAIL: " + msg)
    release()
    os._exit(1)
try:
    f = os.open(mnt + "/f", os.O_RDONLY)
    # 1. An fd with a request that takes none: wexd closes it (FLUSH).
    s = conn()
    r = ask(s, dict(op="ping"), [f])
    if not r or (r.get("error") or {}).get("code") != "EINVAL":
        fail("a ping carrying a FUSE file's fd was answered %r, expected EINVAL" % r)
    ping("fd refused")
    s.close()
    # 2. The fd as a producer's host memory: fstat (GETATTR), then closed
    # when the producer leaves (FLUSH).
    s = conn()
    ask(s, dict(op="hello", role="producer", model="fuse", world=1))
    r = ask(s, dict(op="register_segment", kind="host", size=4096, device="", handle="",
                    handle_offset=0, alloc_size=4096), [f])
    if not r:
        fail("register_segment of a FUSE file went unanswered (wexd's requests left "
             "unanswered: %s)" % ignored)
    print("register_segment of a FUSE file: %s" % (r.get("error") or "OK"))
    ping("segment registered")
    s.close()
    time.sleep(0.3)
    ping("producer gone")
    print("wexd's requests the FUSE server left unanswered: %s" % ignored)
    if not ignored:
        fail("wexd never asked the FUSE server anything: the test proves nothing")
except BaseException:
    release()
    raise
release()
time.sleep(0.3)
ping("FUSE server gone")
PYEOF
rc=$?
[ $rc = 77 ] && skip "no FUSE here"
[ $rc = 0 ] || fail "see above"
echo "PASS"
