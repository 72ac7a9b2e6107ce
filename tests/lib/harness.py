"""harness.py - what the integration tests share: paths, configs, segments, servers, children.

Every test runs in its own process (see run.py), so the module-level state
here (the cleanup list, the segment counter) belongs to exactly one test.
Everything a test starts registers its own cleanup with defer(); run.py calls
cleanup() when the test function returns or raises.
"""

import errno
import json
import os
import queue
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# ---- paths ----

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("BULKSHIM_BUILD") or os.path.join(ROOT, "build"))
LIB = os.path.join(BUILD, "libbulkshim.so")
CLI = os.path.join(BUILD, "bulkshim")
HELPERS = os.path.join(BUILD, "tests")
# Children under the shim run Debian's python when there is one: it is the
# dynamically linked, distribution-built interpreter users actually preload.
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
SHM_PREFIX = "/dev/shm/bulkshim."
# The tag of this test process; run.py removes leftovers carrying it.
TAG = "t%d" % os.getpid()

def readable_by_all(path):
    """True if any user can reach and read path."""
    path = os.path.abspath(path)
    try:
        if not os.stat(path).st_mode & 0o004:
            return False
        d = os.path.dirname(path)
        while d and d != "/":
            if not os.stat(d).st_mode & 0o001:
                return False
            d = os.path.dirname(d)
    except OSError:
        return False
    return True


def _public_copies():
    """Tests that run as another user (nobody) need the library and the CLI
    where that user can read them; a checkout in a private directory (a
    clone in `mktemp -d`) is not. Then this test uses copies in a
    world-readable directory of its own, removed when it ends."""
    global LIB, CLI, _public
    if os.geteuid() != 0 or not os.path.exists(LIB) or readable_by_all(LIB):
        return
    _public = tempfile.mkdtemp(prefix="bulkshim-%s-lib-" % TAG)
    os.chmod(_public, 0o755)
    for name in ("LIB", "CLI"):
        src = globals()[name]
        if os.path.exists(src):
            dst = os.path.join(_public, os.path.basename(src))
            shutil.copy2(src, dst)
            os.chmod(dst, 0o755)
            globals()[name] = dst


_public = None


class Skip(Exception):
    """Raised by a test that cannot run here (say why); run.py reports it
    as skipped, neither passed nor failed."""


# ---- cleanup ----

_cleanups = []
_tmpdir = None
_seq = 0


def defer(fn, *args):
    """Runs fn(*args) at test end, last registered first."""
    _cleanups.append((fn, args))


_public_copies()
if _public is not None:
    defer(shutil.rmtree, _public, True)


def cleanup():
    """Runs every deferred cleanup; errors are printed, never raised."""
    while _cleanups:
        fn, args = _cleanups.pop()
        try:
            fn(*args)
        except Exception as e:  # a cleanup must not hide the test's result
            print("cleanup %s: %r" % (getattr(fn, "__name__", fn), e), file=sys.stderr)


def tmpdir():
    """This test's private temporary directory, removed at test end."""
    global _tmpdir
    if _tmpdir is None:
        _tmpdir = tempfile.mkdtemp(prefix="bulkshim-%s-" % TAG)
        defer(shutil.rmtree, _tmpdir, True)
    return _tmpdir


def unique(prefix=""):
    """A name unique to this test process: t<pid>_<n>."""
    global _seq
    _seq += 1
    return "%s%s_%d" % (prefix, TAG, _seq)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def new_segment():
    """A fresh segment name whose shm object is removed at test end."""
    name = unique()
    defer(_unlink, SHM_PREFIX + name)
    return name


def need_built(*paths):
    """Fails the test with a clear message when a build product is missing."""
    for p in paths or (LIB, CLI):
        assert os.path.exists(p), "%s is missing: build first (make, or BULKSHIM_BUILD=...)" % p


def helper(name):
    """The path of a compiled helper from tests/helpers/NAME.c."""
    path = os.path.join(HELPERS, name)
    need_built(path)
    return path


# ---- polling ----

def wait_until(pred, timeout, interval=0.01, what="condition"):
    """Polls pred() until it returns a true value or timeout seconds pass.
    Returns that value; raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError("timed out after %.2fs waiting for %s" % (timeout, what))
        time.sleep(interval)


# ---- configs, environments, status ----

def clean_env():
    """The environment without any shim variable or interpreter override."""
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("BULKSHIM_") or k in ("LD_PRELOAD", "PYTHONPATH", "PYTHONHOME",
                                              "PYTHONSTARTUP", "PYTHONINSPECT"):
            del env[k]
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _q(s):
    """A libconfig string literal."""
    return json.dumps(str(s))


CONFIG_KEYS = {"name", "destinations", "max_connections", "errno"}


def config_text(compartments, segment=None, extra=""):
    """libconfig text for a list of compartment dicts with keys name,
    destinations, max_connections and optionally errno. Any other key is an
    error, not left out: a test that sets a key this does not write would
    test nothing (harness_io.IoShim writes the rest)."""
    for c in compartments:
        unknown = set(c) - CONFIG_KEYS
        if unknown:
            raise ValueError("harness.config_text does not write %s (use harness_io.IoShim)"
                             % ", ".join(sorted(unknown)))
    lines = []
    if segment is not None:
        lines.append("segment = %s;" % _q(segment))
    if extra:
        lines.append(extra)
    lines.append("compartments = (")
    items = []
    for c in compartments:
        parts = ["name = %s;" % _q(c["name"]),
                 "destinations = [ %s ];" % ", ".join(_q(d) for d in c["destinations"]),
                 "max_connections = %d;" % c["max_connections"]]
        if c.get("errno"):
            parts.append("errno = %s;" % _q(c["errno"]))
        items.append("  { " + " ".join(parts) + " }")
    lines.append(",\n".join(items))
    lines.append(");")
    return "\n".join(lines) + "\n"


def write_file(text, name=None, suffix=".cfg"):
    """Writes text into this test's temporary directory; returns the path."""
    path = os.path.join(tmpdir(), name or unique("cfg") + suffix)
    with open(path, "w") as f:
        f.write(text)
    return path


def shim_env(config, log=None, strict=None, preload=None, extra=None):
    """An environment that preloads the shim with the given config path."""
    need_built(LIB)
    env = clean_env()
    # BULKSHIM_PRELOAD_PREFIX puts a sanitizer runtime first (make check-sanitize).
    first = os.environ.get("BULKSHIM_PRELOAD_PREFIX", "")
    env["LD_PRELOAD"] = ((first + " " + LIB).strip() if preload is None else preload)
    env["BULKSHIM_CONFIG"] = config
    if log is not None:
        env["BULKSHIM_LOG"] = log
    if strict is not None:
        env["BULKSHIM_STRICT"] = strict
    if extra:
        env.update(extra)
    return env


def status_json(segment, timeout=10):
    """The parsed output of `bulkshim status -s SEGMENT --json`."""
    need_built(CLI)
    r = subprocess.run([CLI, "status", "-s", segment, "--json"], capture_output=True,
                       text=True, timeout=timeout, env=clean_env())
    assert r.returncode == 0, "bulkshim status -s %s --json exited %d: %s" % (
        segment, r.returncode, (r.stderr or r.stdout).strip())
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise AssertionError("bulkshim status --json printed no JSON (%s): %r" % (e, r.stdout[:500]))


def comp_of(status, name):
    """The compartment named name in a status dict."""
    for c in status.get("compartments", []):
        if c.get("name") == name:
            return c
    raise AssertionError("no compartment %r in status: %s" % (name, json.dumps(status)))


class Shim:
    """One test configuration: a config file naming a fresh segment."""

    def __init__(self, compartments, extra=""):
        self.segment = new_segment()
        self.compartments = compartments
        self.config = write_file(config_text(compartments, self.segment, extra))

    def env(self, **kw):
        return shim_env(self.config, **kw)

    def status(self):
        return status_json(self.segment)

    def comp(self, name):
        return comp_of(self.status(), name)

    def wait(self, name, key, value, timeout=1.0):
        """Polls status until compartment name has key == value; returns the
        compartment. Fails with the last value seen."""
        seen = [None]

        def ok():
            c = self.comp(name)
            seen[0] = c
            return c if c.get(key) == value else None
        try:
            return wait_until(ok, timeout, 0.02, "%s.%s == %r" % (name, key, value))
        except AssertionError:
            raise AssertionError("%s.%s stayed %r, want %r within %.1fs (compartment: %s)" % (
                name, key, (seen[0] or {}).get(key), value, timeout, json.dumps(seen[0])))

    def expect(self, name, **want):
        """Asserts the current values of some keys of compartment name."""
        c = self.comp(name)
        bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k) != v}
        assert not bad, "compartment %s: %s (full: %s)" % (
            name, ", ".join("%s is %r, want %r" % (k, g, w) for k, (g, w) in bad.items()),
            json.dumps(c))
        return c


# ---- loopback servers ----

class Server:
    """A stream (or Unix) server on an ephemeral port, served by one thread.

    mode: "hold" accepts and keeps every connection open, reading and
    discarding what arrives, and never answers (a stalled backend);
    "echo" sends back what it reads; "http" answers one HTTP/1.1 request
    with "ok\\n" and closes. live/max_live/accepted count accepted
    connections as an independent witness of what the shim let through;
    a connection stops being live when its peer closes it.
    """

    def __init__(self, mode="hold", host="127.0.0.1", port=0, family=None, path=None):
        self.mode = mode
        self.live = 0
        self.max_live = 0
        self.accepted = 0
        self.path = path
        if path is not None:
            self.family = socket.AF_UNIX
            self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.lsock.bind(path)
            defer(_unlink, path)
            self.addr = path
        else:
            self.family = family or (socket.AF_INET6 if ":" in host else socket.AF_INET)
            self.lsock = socket.socket(self.family, socket.SOCK_STREAM)
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.lsock.bind((host, port))
            self.addr = self.lsock.getsockname()[:2]
        self.port = None if path is not None else self.addr[1]
        self.lsock.listen(512)
        self.lsock.setblocking(False)
        self._conns = {}
        self._stop = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        defer(self.stop)

    def _close_conn(self, sel, conn):
        sel.unregister(conn)
        del self._conns[conn]
        conn.close()
        self.live -= 1

    def _loop(self):
        sel = selectors.DefaultSelector()
        sel.register(self.lsock, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._stop:
            events = sel.select(0.2)
            # Ends before starts: a peer that closed and reconnected must not
            # be seen as two live connections.
            events.sort(key=lambda e: e[0].data == "listen")
            for key, _ in events:
                if key.data == "wake":
                    continue
                if key.data == "listen":
                    self._accept(sel)
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._close_conn(sel, conn)
                    continue
                if self.mode == "echo":
                    try:
                        conn.sendall(data)
                    except OSError:
                        pass
                elif self.mode == "http":
                    self._conns[conn] += data
                    if b"\r\n\r\n" in self._conns[conn]:
                        try:
                            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
                                         b"Connection: close\r\n\r\nok\n")
                        except OSError:
                            pass
                        self._close_conn(sel, conn)
        sel.close()

    def _accept(self, sel):
        while True:
            try:
                conn, _ = self.lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            conn.setblocking(False)
            self._conns[conn] = b""
            sel.register(conn, selectors.EVENT_READ, "conn")
            self.accepted += 1
            self.live += 1
            self.max_live = max(self.max_live, self.live)

    def stop(self):
        """Stops the thread and closes every socket; idempotent."""
        if self._stop:
            return
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join(5)
        for c in list(self._conns):
            c.close()
        self._conns.clear()
        self.lsock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def wait_live(self, n, timeout=2.0):
        """Waits until exactly n connections are live."""
        try:
            wait_until(lambda: self.live == n, timeout, 0.005, "live == %d" % n)
        except AssertionError:
            raise AssertionError("server %s: %d live connections, want %d" % (
                self.addr, self.live, n))


def ipv6_available():
    """True if ::1 can be bound here."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return False
    try:
        s.bind(("::1", 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def dual_stack(mode="hold"):
    """Servers on 127.0.0.1 and ::1 with the same port: (v4, v6). v6 is None
    when this host has no IPv6 loopback."""
    if not ipv6_available():
        return Server(mode), None
    for _ in range(50):
        v6 = Server(mode, host="::1")
        try:
            v4 = Server(mode, host="127.0.0.1", port=v6.port)
            return v4, v6
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            v6.stop()
    raise AssertionError("no port free on both 127.0.0.1 and ::1")


def unix_path(name="s"):
    """A short Unix socket path for this test (sun_path holds 108 bytes)."""
    path = "/tmp/bs-%s-%s.sock" % (unique(), name)
    defer(_unlink, path)
    return path


def free_port():
    """A loopback TCP port free a moment ago, for a server that binds it itself."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_udp_port():
    """A UDP socket bound to an ephemeral loopback port, kept until test end."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    defer(s.close)
    return s, s.getsockname()[1]


# ---- children ----

def _track(p):
    def reap():
        if p.poll() is None:
            p.kill()
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            pass
    defer(reap)
    return p


def curl_env(env):
    """env for a curl process: curl hangs at start-up (in setlocale) with GCC's
    libasan preloaded, shim or not, so under check-sanitize it gets the
    (sanitized) library alone."""
    first = os.environ.get("BULKSHIM_PRELOAD_PREFIX", "")
    if first and env and "LD_PRELOAD" in env:
        env = dict(env, LD_PRELOAD=env["LD_PRELOAD"].replace(first, "").strip())
    return env


def run(argv, env, timeout=20, input=None):
    """Runs argv to completion; returns CompletedProcess with text output."""
    if os.path.basename(argv[0]) == "curl":
        env = curl_env(env)
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("%s did not finish within %ss (stderr: %r)" % (
            argv[:3], timeout, e.stderr))


def run_py(code, env, timeout=20, args=()):
    """Runs a python snippet (under the shim when env says so)."""
    return run([PY, "-c", code] + list(args), env, timeout)


# Python for a program under the shim: three connects to port argv[1], each
# socket kept; prints one JSON line (what each connect did, LD_PRELOAD, the
# variable BS_MARKER, whether libbulkshim.so is mapped) and exits 3.
CONNECT_PROBE = """
import json, os, socket, sys
port = int(sys.argv[1])
res = []
for i in range(3):
    s = socket.socket()
    try:
        s.connect(('127.0.0.1', port))
        res.append('ok')
        s.detach()
    except ConnectionRefusedError:
        res.append('refused')
maps = open('/proc/self/maps').read()
print(json.dumps({'res': res, 'preload': os.environ.get('LD_PRELOAD', ''),
                  'marker': os.environ.get('BS_MARKER'), 'mapped': 'libbulkshim.so' in maps}))
sys.exit(3)
"""


def shim_lines(stderr):
    """The lines the shim wrote to a child's stderr."""
    return [l for l in stderr.splitlines() if re.match(r"bulkshim\[\d+\]: ", l)]


def _gone(p, what, err):
    """Fails the test for a child that is no longer reading its stdin."""
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        pass
    err._t.join(1)
    raise AssertionError("%s is gone (exit %s) (stderr: %r)" % (what, p.returncode, err.text()[-2000:]))


class _Reader:
    """Collects a pipe's lines in a background thread."""

    def __init__(self, f):
        self.q = queue.Queue()
        self.lines = []
        self._t = threading.Thread(target=self._run, args=(f,), daemon=True)
        self._t.start()

    def _run(self, f):
        for line in f:
            self.lines.append(line)
            self.q.put(line)
        self.q.put(None)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return False

    def text(self):
        return "".join(self.lines)


# The python program an Agent runs: it executes the code it is sent, one JSON
# request per line on stdin, one JSON reply per line on stdout. Descriptors
# are handled raw (socket.detach) so that nothing closes them behind the
# test's back; fork() makes a child that serves requests over pipes.
AGENT_SRC = r'''
import errno, json, os, select, socket, sys, time

def tcp(port, host="127.0.0.1", family=None):
    """Connects a blocking TCP socket; returns its raw descriptor."""
    fam = family or (socket.AF_INET6 if ":" in host else socket.AF_INET)
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.connect((host, port))
    except BaseException:
        s.close()
        raise
    return s.detach()

def unix(path, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_UNIX, kind)
    try:
        s.connect(path)
    except BaseException:
        s.close()
        raise
    return s.detach()

def attempt(addr, family=socket.AF_INET, kind=socket.SOCK_STREAM):
    """Tries one connect; returns {"ok", "fd" | "errno", "exc", "dt"}."""
    s = socket.socket(family, kind)
    t0 = time.perf_counter()
    try:
        s.connect(addr)
    except OSError as e:
        dt = time.perf_counter() - t0
        s.close()
        return {"ok": False, "errno": e.errno, "exc": type(e).__name__, "dt": dt}
    dt = time.perf_counter() - t0
    return {"ok": True, "fd": s.detach(), "dt": dt}

def close(*fds):
    for fd in fds:
        os.close(fd)

children = {}

def fork():
    """Forks a child that serves requests too; returns its pid."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w1)
        os.close(r2)
        children.clear()
        serve(os.fdopen(r1, "r"), os.fdopen(w2, "w"))
        os._exit(0)
    os.close(r1)
    os.close(w2)
    children[pid] = (os.fdopen(w1, "w"), os.fdopen(r2, "r"))
    return pid

def child(pid, code="", expr=""):
    """Runs a request in a forked child; returns its value or raises."""
    w, r = children[pid]
    w.write(json.dumps({"code": code, "expr": expr}) + "\n")
    w.flush()
    line = r.readline()
    if not line:
        raise EOFError("child %d is gone" % pid)
    rep = json.loads(line)
    if not rep["ok"]:
        raise RuntimeError("child %d: %s" % (pid, rep))
    return rep["value"]

def child_exit(pid, code="exit_without_closing()"):
    """Has a forked child run code that ends it; returns its wait status."""
    w, r = children.pop(pid)
    w.write(json.dumps({"code": code}) + "\n")
    w.flush()
    r.readline()
    w.close()
    r.close()
    return os.waitpid(pid, 0)[1]

def exit_without_closing(status=0):
    """A normal exit (exit(3), destructors run) that closes no socket itself."""
    sys.stdout.flush()
    sys.exit(status)

def reply(wf, rep):
    wf.write(json.dumps(rep) + "\n")
    wf.flush()

def execv(argv=None):
    """Acknowledges, then replaces this image with a fresh agent."""
    reply(OUT[0], {"ok": True, "value": "exec"})
    argv = argv or [sys.executable, sys.argv[0]]
    os.execv(argv[0], argv)

OUT = [sys.stdout]

def serve(rf, wf):
    OUT[0] = wf
    while True:
        line = rf.readline()
        if not line:
            return
        req = json.loads(line)
        ns = globals()
        try:
            if req.get("code"):
                exec(req["code"], ns)
            val = eval(req["expr"], ns) if req.get("expr") else None
            rep = {"ok": True, "value": val}
        except Exception as e:
            rep = {"ok": False, "exc": type(e).__name__, "errno": getattr(e, "errno", None),
                   "msg": str(e)}
        reply(wf, rep)

reply(sys.stdout, {"ok": True, "value": os.getpid()})
serve(sys.stdin, sys.stdout)
'''


def _close_and_wait(p, what, timeout):
    """Closes p's stdin, if any, and returns its exit status."""
    if p.stdin:
        try:
            p.stdin.close()
        except OSError:
            pass
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s did not exit within %ss" % (what, timeout))


class AgentError(Exception):
    def __init__(self, rep):
        Exception.__init__(self, "%s: %s" % (rep.get("exc"), rep.get("msg")))
        self.exc = rep.get("exc")
        self.errno = rep.get("errno")


class Agent:
    """A python process (usually under the shim) the test drives step by step.

    a.call(code, expr) runs code then returns eval(expr) in the child;
    a(expr) is a.call(expr=expr). Replies must come within timeout seconds.
    prefix is put before the command (it must end by exec'ing it, so that
    the agent's pid is the one started here).
    """

    def __init__(self, env, timeout=10, prefix=()):
        path = os.path.join(tmpdir(), "agent.py")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(AGENT_SRC)
        self.p = _track(subprocess.Popen(list(prefix) + [PY, path], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, text=True, bufsize=1))
        self.pid = self.p.pid
        self.timeout = timeout
        self.out = _Reader(self.p.stdout)
        self.err = _Reader(self.p.stderr)
        first = self._reply(timeout)
        assert first.get("value") == self.pid, "agent did not start: %r" % first

    def _reply(self, timeout):
        line = self.out.get(timeout)
        if line is False:
            raise AssertionError("agent %d gave no reply within %ss (stderr: %r)" % (
                self.pid, timeout, self.err.text()[-2000:]))
        if line is None:
            self.p.wait(5)
            self.err._t.join(1)
            raise AssertionError("agent %d exited (%s) (stderr: %r)" % (
                self.pid, self.p.returncode, self.err.text()[-2000:]))
        return json.loads(line)

    def send(self, code="", expr=""):
        """Sends a request without waiting for its reply."""
        try:
            self.p.stdin.write(json.dumps({"code": code, "expr": expr}) + "\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            _gone(self.p, "agent %d" % self.pid, self.err)

    def call(self, code="", expr="", timeout=None):
        self.send(code, expr)
        rep = self._reply(timeout or self.timeout)
        if not rep["ok"]:
            raise AgentError(rep)
        return rep["value"]

    def execv(self, timeout=None):
        """Has the agent exec a fresh agent image (same pid, same pipes)."""
        assert self.call(expr="execv()") == "exec"
        first = self._reply(timeout or self.timeout)
        assert first.get("value") == self.pid, "the new image said %r" % first

    def __call__(self, expr, timeout=None):
        return self.call(expr=expr, timeout=timeout)

    def stderr(self):
        return self.err.text()

    def finish(self, timeout=10):
        """Closes stdin (the agent returns from its loop and exits normally);
        returns the exit status."""
        return _close_and_wait(self.p, "agent %d" % self.pid, timeout)

    def wait_exit(self, timeout=10):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("agent %d did not exit within %ss" % (self.pid, timeout))
        self.out._t.join(2)
        self.err._t.join(2)
        return rc


class LineProc:
    """A helper program that prints lines the test waits for."""

    def __init__(self, argv, env, stdin=True):
        self.p = _track(subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         env=env, text=True, bufsize=1))
        self.pid = self.p.pid
        self.argv = argv
        self.out = _Reader(self.p.stdout)
        self.err = _Reader(self.p.stderr)

    def line(self, timeout=5):
        l = self.out.get(timeout)
        if l is False:
            raise AssertionError("%s printed nothing within %ss (stderr: %r)" % (
                os.path.basename(self.argv[0]), timeout, self.err.text()[-2000:]))
        if l is None:
            self.p.wait(5)
            self.err._t.join(1)
            raise AssertionError("%s exited (%s) (stderr: %r)" % (
                os.path.basename(self.argv[0]), self.p.returncode, self.err.text()[-2000:]))
        return l.rstrip("\n")

    def send(self, text):
        try:
            self.p.stdin.write(text)
            self.p.stdin.flush()
        except BrokenPipeError:
            _gone(self.p, os.path.basename(self.argv[0]), self.err)

    def cmd(self, text, timeout=5):
        """Sends one command line and returns the reply line."""
        self.send(text + "\n")
        return self.line(timeout)

    def finish(self, timeout=10):
        return _close_and_wait(self.p, self.argv[0], timeout)

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            os.kill(self.pid, sig)


class FdOps(LineProc):
    """The fdops helper: calls libc descriptor functions by name, under the
    shim when env says so. do("dup", fd) returns the result or raises
    OSError with the helper's errno."""

    def __init__(self, env):
        LineProc.__init__(self, [helper("fdops")], env)

    def do(self, *words, timeout=5):
        r = self.cmd(" ".join(str(w) for w in words), timeout)
        kind, _, val = r.partition(" ")
        if kind == "ok":
            return int(val)
        if kind == "err":
            raise OSError(int(val), "%s: %s" % (" ".join(str(w) for w in words), os.strerror(int(val))))
        raise AssertionError("fdops said %r to %r" % (r, words))

    def exit(self, status=0, how="exit", timeout=10):
        """Ends the helper with exit(3) or _exit(2); returns its status."""
        self.send("%s %d\n" % (how, status))
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("fdops did not exit within %ss" % timeout)


def agent_with_hosts(env, text):
    """An Agent (env as for Agent, with LD_PRELOAD) in its own mount
    namespace, whose /etc/hosts is a file of this test holding text. Returns
    (agent, path): rewrite path in place (same inode) to move a name while
    the program runs. Skips without root or unshare(1)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        raise Skip("needs root and unshare(1) to give the program its own /etc/hosts")
    hosts = write_file(text, suffix=".hosts")
    env = dict(env)
    env["BS_PRELOAD"] = env.pop("LD_PRELOAD")
    wrap = ["unshare", "-m", "sh", "-c",
            'mount --bind "$0" /etc/hosts && LD_PRELOAD="$BS_PRELOAD" exec "$@"', hosts]
    return Agent(env, prefix=wrap), hosts

