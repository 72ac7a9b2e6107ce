"""test_kernel.py - the kernel engine (bulkshim attach, run --kernel) limits what no preload reaches.

Each test runs a client that the preloaded library cannot see (a Go binary,
static or with cgo; a static C binary; io_uring connects; a setuid binary)
under `bulkshim run --kernel`, against a loopback server in this process
that counts live connections as an independent witness. They need root,
cgroup v2, Linux 5.9 and BTF; elsewhere each is skipped with the reason.
"""

import os
import shutil
import stat
import subprocess
import time

import harness as h

ECONNREFUSED = 111
FAST_US = 1000000  # "at once": a refusal may not wait (generous: the machine is busy)


def need_kernel():
    """Skips the test with the reason when this machine cannot load the engine."""
    if os.geteuid() != 0:
        raise h.Skip("the kernel engine needs root (or CAP_BPF + CAP_NET_ADMIN)")
    with open("/proc/self/mounts") as f:
        if not any(line.split()[2] == "cgroup2" for line in f if len(line.split()) > 2):
            raise h.Skip("no cgroup v2 hierarchy is mounted")
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    if (major, minor) < (5, 9):
        raise h.Skip("Linux %d.%d has no cgroup/sock_release (5.9)" % (major, minor))
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        raise h.Skip("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    h.need_built(h.CLI)


def helper(name):
    """A client built by kernel/kernel.mk; the sanitizer run (another build
    directory) uses the plain build's, which need no sanitizer."""
    path = os.path.join(h.HELPERS, name)
    if not os.path.exists(path):
        path = os.path.join(h.ROOT, "build", "tests", name)
    h.need_built(path)
    return path


def kshim(compartments, extra=""):
    """A config for a fresh segment; its kernel engine is detached at the end."""
    s = h.Shim(compartments, extra)
    h.defer(lambda: subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True))
    return s


class Client:
    """A client process under `bulkshim run --kernel` (or any argv), line by line."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env or h.clean_env())
        h.defer(self.kill)
        self.lines = []

    def until_held(self, timeout=30):
        """Reads attempt lines until "held N"; returns (ok count, [(errno, us)])."""
        deadline = time.monotonic() + timeout
        ok, errs = 0, []
        while time.monotonic() < deadline:
            line = self.p.stdout.readline()
            if not line:
                raise AssertionError("client ended early: %s" % self.p.stderr.read())
            self.lines.append(line.strip())
            w = line.split()
            if w[0] == "ok":
                ok += 1
            elif w[0] == "err":
                errs.append((int(w[1]), int(w[2])))
            elif w[0] == "held":
                assert int(w[1]) == ok, self.lines
                return ok, errs
        raise AssertionError("no 'held' line after %ds: %s" % (timeout, self.lines))

    def finish(self, timeout=30):
        """Closes stdin: the client closes its connections and exits."""
        out, err = self.p.communicate("", timeout=timeout)
        assert "closed" in out, (out, err)
        return self.p.returncode, err

    def kill(self):
        """TERM first: `run --kernel` passes it on, then detaches and
        removes its cgroup."""
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def check_limited(argv, limit=2, tries=5, dest=None, server=None):
    """Runs argv (which dials the server `tries` times) under run --kernel with
    max_connections = limit: exactly `limit` connect, the rest are refused with
    ECONNREFUSED at once, status shows them, and after the close 0 is left."""
    need_kernel()
    srv = server or h.Server()
    s = kshim([{"name": "db", "destinations": dest or ["127.0.0.1:%d" % srv.port],
                "max_connections": limit}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--"] + argv)
    ok, errs = c.until_held()
    assert ok == limit, "admitted %d, want %d: %s" % (ok, limit, c.lines)
    assert [e for e, _ in errs] == [ECONNREFUSED] * (tries - limit), c.lines
    assert max(us for _, us in errs) < FAST_US, "a refusal took long: %s" % c.lines
    srv.wait_live(limit)
    assert srv.max_live == limit, "the witness saw %d at once" % srv.max_live
    comp = s.expect("db", in_use=limit, kernel=True, kernel_in_use=limit,
                    admitted=limit, rejected=tries - limit)
    assert comp["rejected_by"]["full"] == tries - limit, comp
    m = subprocess.run([h.CLI, "metrics", "-s", s.segment], capture_output=True, text=True)
    assert 'bulkshim_compartment_in_use{segment="%s",compartment="db"} %d' % (
        s.segment, limit) in m.stdout, m.stdout[:2000]
    rc, err = c.finish()
    assert rc == 0, err
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    assert srv.max_live == limit
    return s, srv


def test_kernel_go_static():
    """A statically linked Go binary (no libc at all) is limited exactly."""
    srv = h.Server()
    go = helper("goclient_static")
    check_limited([go, "127.0.0.1:%d" % srv.port, "5"], server=srv)


def test_kernel_go_cgo_ipv6():
    """Go with cgo dials ::1 through its own syscalls: the IPv6 rule counts it."""
    need_kernel()
    if not h.ipv6_available():
        raise h.Skip("no IPv6 loopback")
    srv = h.Server(host="::1")
    go = helper("goclient_cgo")
    check_limited([go, "[::1]:%d" % srv.port, "5"], dest=["[::1]:%d" % srv.port], server=srv)


def test_kernel_static_c():
    srv = h.Server()
    check_limited([helper("kclient_static"), "127.0.0.1", str(srv.port), "5"], server=srv)


def test_kernel_io_uring():
    """Connects submitted through io_uring never pass a libc connect()."""
    srv = h.Server()
    check_limited([helper("kclient_static"), "-u", "127.0.0.1", str(srv.port), "6"],
                  limit=3, tries=6, server=srv)


def test_kernel_setuid():
    """A setuid-root binary started by an ordinary user: the loader drops
    LD_PRELOAD for it (secure execution); the kernel engine still counts."""
    need_kernel()
    d = os.path.join("/tmp", h.unique("bs-suid-"))
    os.mkdir(d, 0o755)
    h.defer(shutil.rmtree, d, True)
    prog = os.path.join(d, "kclient")
    shutil.copy(helper("kclient"), prog)
    os.chown(prog, 0, 0)
    os.chmod(prog, 0o755 | stat.S_ISUID)
    srv = h.Server()
    check_limited(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", prog,
                   "127.0.0.1", str(srv.port), "5"], server=srv)


def test_kernel_preload_cannot_see_go():
    """The gap the engine closes: under the preloaded library alone the same
    Go binary opens all five connections past a limit of 2."""
    need_kernel()
    srv = h.Server()
    s = h.Shim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                 "max_connections": 2}])
    # --force: `run` refuses a program the shim cannot see.
    c = Client([h.CLI, "run", "-c", s.config, "--force", "--", helper("goclient_static"),
                "127.0.0.1:%d" % srv.port, "5"])
    ok, errs = c.until_held()
    assert ok == 5 and not errs, c.lines
    srv.wait_live(5)
    c.finish()


PY_RULES = r"""
import errno, socket, sys
port = int(sys.argv[1])
held = []
def try_(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    try:
        s.connect(addr)
        held.append(s)
        return "ok"
    except OSError as e:
        s.close()
        return errno.errorcode.get(e.errno, str(e.errno))
out = []
# a: 127.0.0.1/32 port exactly (limit 1); b: 127.0.0.0/8 ports range (limit 2)
out.append(try_(socket.AF_INET, ("127.0.0.1", port)))
out.append(try_(socket.AF_INET, ("127.0.0.1", port)))
out.append(try_(socket.AF_INET, ("127.0.0.2", port)))
out.append(try_(socket.AF_INET6, ("::ffff:127.0.0.3", port)))
out.append(try_(socket.AF_INET, ("127.0.0.4", port)))
print(" ".join(out), flush=True)
sys.stdin.read()
"""


def test_kernel_rules_cidr_ranges_v4mapped():
    """The most specific rule wins as in the shim: a /32 with one port beats
    a /8 with a port range; a v4-mapped IPv6 connect counts as IPv4."""
    need_kernel()
    srv = h.Server(host="0.0.0.0")
    s = kshim([{"name": "a", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1},
               {"name": "b", "destinations": ["127.0.0.0/8:%d-%d" % (srv.port - 1, srv.port + 1)],
                "max_connections": 2}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", h.PY, "-c", PY_RULES,
                str(srv.port)])
    line = c.p.stdout.readline().split()
    assert line == ["ok", "ECONNREFUSED", "ok", "ok", "ECONNREFUSED"], line
    s.expect("a", in_use=1, rejected=1)
    s.expect("b", in_use=2, rejected=1)
    srv.wait_live(3)
    c.p.communicate("", timeout=20)
    s.wait("a", "in_use", 0, timeout=5)
    s.wait("b", "in_use", 0, timeout=5)


PY_TWICE = r"""
import errno, socket, sys
port, dead = int(sys.argv[1]), int(sys.argv[2])
name = lambda r: errno.errorcode.get(r, str(r))
a = socket.socket(); a.setblocking(False)
try:
    a.connect(("127.0.0.1", port))
except BlockingIOError:
    pass
r1 = a.connect_ex(("127.0.0.1", port))  # polling the same connect: 0, EISCONN or EALREADY
d = socket.socket()
r2 = d.connect_ex(("127.0.0.1", dead))  # admitted, then refused by the peer (RST)
r3 = d.connect_ex(("127.0.0.1", port))  # the same socket again: no second permit
c = socket.socket(); r4 = c.connect_ex(("127.0.0.1", port))
print(name(r1), name(r2), name(r3), name(r4), flush=True)
sys.stdin.read()
"""


def test_kernel_second_connect_same_socket():
    """Connecting a socket again (polling a non-blocking connect, or retrying
    after the peer refused) takes no second permit: two sockets hold the two
    permits, a third socket is refused."""
    need_kernel()
    srv = h.Server()
    probe = h.Server()
    dead = probe.port
    probe.stop()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port, "127.0.0.1:%d" % dead],
                "max_connections": 2}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", h.PY, "-c", PY_TWICE,
                str(srv.port), str(dead)])
    r1, r2, r3, r4 = c.p.stdout.readline().split()
    assert r1 in ("0", "EISCONN", "EALREADY"), r1
    assert (r2, r3, r4) == ("ECONNREFUSED", "0", "ECONNREFUSED"), (r2, r3, r4)
    s.expect("db", in_use=2, admitted=2, rejected=1)
    srv.wait_live(2)
    c.p.communicate("", timeout=20)
    s.wait("db", "in_use", 0, timeout=5)


def test_kernel_attach_set_reload_detach():
    """attach to a cgroup; `set` raises the kernel limit live; `reload` moves
    the destination; detach unloads. Status shows KERNEL while attached."""
    need_kernel()
    srv, other = h.Server(), h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    mnt = [l.split()[1] for l in open("/proc/self/mounts") if l.split()[2] == "cgroup2"][0]
    cg = os.path.join(mnt, h.unique("bs-test-"))
    os.mkdir(cg)
    h.defer(lambda: os.path.isdir(cg) and os.rmdir(cg))
    r = subprocess.run([h.CLI, "attach", "-c", s.config, "--cgroup", cg], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "attached" in r.stdout, (r.stdout, r.stderr)
    r = subprocess.run([h.CLI, "attach", "-c", s.config, "--cgroup", cg], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "already attached" in r.stderr, r.stderr
    st = subprocess.run([h.CLI, "status", "-s", s.segment], capture_output=True, text=True)
    assert "KERNEL" in st.stdout, st.stdout
    # A process joins the cgroup, then execs the client.
    join = 'echo 0 > "$1/cgroup.procs" && shift && exec "$@"'

    def client(port, n):
        return Client(["sh", "-c", join, "sh", cg, helper("kclient_static"), "127.0.0.1",
                       str(port), str(n)])
    c = client(srv.port, 3)
    assert c.until_held()[0] == 1, c.lines
    c.finish()
    r = subprocess.run([h.CLI, "set", "-c", s.config, "db", "max_connections", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    c = client(srv.port, 4)
    assert c.until_held()[0] == 3, c.lines
    c.finish()
    with open(s.config, "w") as f:
        f.write(h.config_text([{"name": "db", "destinations": ["127.0.0.1:%d" % other.port],
                                "max_connections": 1}], s.segment))
    r = subprocess.run([h.CLI, "reload", "-c", s.config], capture_output=True, text=True)
    assert r.returncode == 0 and "kernel engine" in r.stdout, (r.stdout, r.stderr)
    c = client(srv.port, 3)         # no longer a destination: nothing limits it
    assert c.until_held()[0] == 3, c.lines
    c.finish()
    c = client(other.port, 3)       # the new destination, with the new limit
    assert c.until_held()[0] == 1, c.lines
    c.finish()
    s.wait("db", "in_use", 0, timeout=5)
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True)
    assert r.returncode == 0 and "unloaded" in r.stdout, (r.stdout, r.stderr)
    st = subprocess.run([h.CLI, "status", "-s", s.segment], capture_output=True, text=True)
    assert "KERNEL" not in st.stdout, st.stdout


def test_kernel_requirements_said_plainly():
    """Without privileges, or with a cgroup that is not v2, attach says what is missing."""
    need_kernel()
    s = h.Shim([{"name": "db", "destinations": ["127.0.0.1:9"], "max_connections": 1}])
    os.chmod(os.path.dirname(s.config), 0o755)
    os.chmod(s.config, 0o644)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "--inh-caps=-all", h.CLI, "attach", "-c", s.config, "--cgroup", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "CAP_BPF and CAP_NET_ADMIN" in r.stderr, r.stderr
    r = subprocess.run([h.CLI, "attach", "-c", s.config, "--cgroup", "/tmp"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not in a cgroup v2 hierarchy" in r.stderr, r.stderr
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True)
    assert r.returncode == 1 and "no kernel engine is loaded" in r.stderr, r.stderr


def test_kernel_observe_mode():
    """enforce = false: nothing is refused, the overflow is counted."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    with open(s.config) as f:
        text = f.read()
    with open(s.config, "w") as f:
        f.write(text.replace("max_connections = 1;", "max_connections = 1; enforce = false;"))
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient_static"),
                "127.0.0.1", str(srv.port), "3"])
    assert c.until_held()[0] == 3, c.lines
    comp = s.expect("db", in_use=3, over=2, rejected=0)
    assert comp["would_reject"]["full"] == 2, comp
    c.finish()
    s.wait("db", "in_use", 0, timeout=5)
    r = subprocess.run([h.CLI, "reset", "-c", s.config], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    comp = s.expect("db", in_use=0, admitted=0, peak=0)
    assert comp["would_reject"]["full"] == 0, comp
