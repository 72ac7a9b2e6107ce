"""test_joint.py - the kernel engine and the preloaded library on one compartment take from one count.

A compartment limited by the engine (on a cgroup) and by the library (in
programs outside it) is one budget: the engine's program and the library
take their permits from the joint count in the engine's map. Each test
counts against a loopback server's own live connections (the witness).
"""

import json
import os
import signal
import subprocess
import time

import harness as h
from test_kernel import Client, helper, kshim, need_kernel

ECONNREFUSED = 111

CHURN = r"""
import random, socket, sys, time
port, rounds, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
held, ok, refused = [], 0, 0
end = time.monotonic() + 20
# Connects until refused, so that both sides press on the limit; closes one
# connection at random after a refusal, and now and then anyway.
for i in range(rounds):
    if time.monotonic() > end:
        break
    if held and random.random() < 0.2:
        held.pop(random.randrange(len(held))).close()
        continue
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
        ok += 1
    except OSError:
        s.close()
        refused += 1
        time.sleep(0.001)
        if held:
            held.pop(random.randrange(len(held))).close()
for s in held:
    s.close()
print("done", ok, refused, flush=True)
"""


class Witness:
    """tests/fleet/witness.py in a process of its own: counts its live
    connections, taking every end of file already readable before it counts
    an accept, so that a connection and its successor are never counted at
    once however fast the clients churn."""

    def __init__(self):
        d = h.tmpdir()
        self.portfile = os.path.join(d, h.unique("wport"))
        self.outfile = os.path.join(d, h.unique("wout"))
        self.p = subprocess.Popen([h.PY, os.path.join(h.ROOT, "tests", "fleet", "witness.py"),
                                   self.portfile, self.outfile, "120"], env=h.clean_env())
        h.defer(lambda: self.p.poll() is None and self.p.kill())
        h.wait_until(lambda: os.path.exists(self.portfile), 10, 0.02, "the witness")
        with open(self.portfile) as f:
            self.port = int(f.read())

    def stop(self):
        """The most connections it saw live at once."""
        self.p.terminate()
        self.p.wait(10)
        with open(self.outfile) as f:
            return json.load(f)["max"]


def cgroup():
    """A fresh cgroup v2 directory, removed at the end."""
    mnt = [l.split()[1] for l in open("/proc/self/mounts") if l.split()[2] == "cgroup2"][0]
    cg = os.path.join(mnt, h.unique("bs-joint-"))
    os.mkdir(cg)

    def remove():
        for _ in range(50):
            try:
                os.rmdir(cg)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
    h.defer(remove)
    return cg


def in_cgroup(cg, argv):
    """argv run inside cgroup cg (the engine counts it), without the library."""
    return ["sh", "-c", 'echo 0 > "$1/cgroup.procs" && shift && exec "$@"', "sh", cg] + argv


def attach(s, cg):
    r = subprocess.run([h.CLI, "attach", "-c", s.config, "--cgroup", cg], capture_output=True,
                       text=True, env=h.clean_env())
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def cgroup_pids(cg):
    with open(os.path.join(cg, "cgroup.procs")) as f:
        return [int(x) for x in f.read().split()]


def test_joint_engine_and_preload_hold_one_limit():
    """max_connections = 3: two connections held by a program in the engine's
    cgroup leave one to a preloaded program; status says 3 in use and a peak
    of 3, as the witness does. Killing either side gives its permits back."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "2"]))
    assert k.until_held() == (2, []), k.lines
    srv.wait_live(2)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "3"], env=s.env())
    ok, errs = p.until_held()
    assert ok == 1 and [e for e, _ in errs] == [ECONNREFUSED] * 2, p.lines
    srv.wait_live(3)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.expect("db", in_use=3, peak=3, kernel_in_use=2)
    # kill -9 of the preloaded holder: the reclaim gives its permit back.
    p.p.kill()
    p.p.wait()
    srv.wait_live(2, timeout=5)
    s.wait("db", "in_use", 2, timeout=5)
    # kill -9 of the engine's holder: sock_release gives its permits back.
    for pid in cgroup_pids(cg):
        os.kill(pid, signal.SIGKILL)
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    # All three are the library's again, and no more.
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "4"], env=s.env())
    ok, errs = p.until_held()
    assert ok == 3 and [e for e, _ in errs] == [ECONNREFUSED], p.lines
    srv.wait_live(3)
    p.finish()
    srv.wait_live(0, timeout=5)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.wait("db", "in_use", 0, timeout=5)


def test_joint_both_sides_push():
    """Programs in the engine's cgroup and preloaded programs connect and
    close at random on one compartment at once: the witness never sees more
    than the limit, both sides get connections, and nothing is left held."""
    need_kernel()
    w = Witness()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % w.port],
                "max_connections": 3}])
    cg = cgroup()
    attach(s, cg)
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen(in_cgroup(cg, [h.PY, "-c", CHURN, str(w.port), "400",
                                                     str(i)]),
                                      stdout=subprocess.PIPE, text=True, env=h.clean_env()))
        procs.append(subprocess.Popen([h.PY, "-c", CHURN, str(w.port), "400", str(10 + i)],
                                      stdout=subprocess.PIPE, text=True, env=s.env()))
    for p in procs:
        h.defer(lambda p=p: p.poll() is None and p.kill())
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        words = out.split()
        assert p.returncode == 0 and words[0] == "done", out
        results.append((int(words[1]), int(words[2])))
    comp = s.wait("db", "in_use", 0, timeout=5)
    most = w.stop()
    assert most <= 3, "the witness saw %d at once (limit 3)" % most
    engine_ok = results[0][0] + results[2][0]
    library_ok = results[1][0] + results[3][0]
    assert engine_ok > 0 and library_ok > 0, results
    assert sum(r for _, r in results) > 0, "nothing was ever refused: %s" % results
    assert comp["peak"] <= 3, comp


def test_joint_preloaded_process_in_the_cgroup_counts_once():
    """A preloaded program inside the engine's cgroup: the library admits its
    connects and the engine lets them through uncounted, so three connections
    take three permits, not six."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient"), "127.0.0.1",
                str(srv.port), "5"], env=s.env())
    ok, errs = c.until_held()
    assert ok == 3 and [e for e, _ in errs] == [ECONNREFUSED] * 2, c.lines
    srv.wait_live(3)
    s.expect("db", in_use=3, peak=3)
    rc, err = c.finish()
    assert rc == 0, err
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    assert srv.max_live == 3


def test_joint_attach_counts_what_the_library_holds():
    """The engine attached while a preloaded program holds two of three
    permits: the engine's cgroup gets the one left, not three more."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "2"], env=s.env())
    assert p.until_held() == (2, []), p.lines
    cg = cgroup()
    r = attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "3"]))
    ok, errs = k.until_held()
    assert ok == 1 and len(errs) == 2, k.lines
    assert "2 connections of preloaded processes counted in" in r.stdout, r.stdout
    srv.wait_live(3)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.expect("db", in_use=3)
    p.finish()
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    # Given back by the library's close: the engine's side may use all three.
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "4"]))
    assert k.until_held()[0] == 3, k.lines
    k.finish()


HOLD = r"""
import errno, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
held, out = [], []
for i in range(n):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
        out.append("ok")
    except OSError as e:
        s.close()
        out.append(errno.errorcode.get(e.errno, str(e.errno)))
print(" ".join(out), flush=True)
sys.stdin.read()
"""


def as_nobody(s, port, n):
    """A preloaded Python client run as nobody that connects n times and
    holds what it got; returns the process and its first line's words."""
    os.chmod(os.path.dirname(s.config), 0o755)
    os.chmod(s.config, 0o644)
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          h.PY, "-c", HOLD, str(port), str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=s.env(log="error"))
    h.defer(lambda: p.poll() is None and p.kill())
    return p, p.stdout.readline().split()


def test_joint_an_unprivileged_preloaded_process_counts_with_the_engine():
    """attach gives the engine's maps the segment's owner and mode: a
    preloaded process of another user (nobody, segment mode 0666) takes
    from the joint count like root's."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}], extra='mode = "0666";')
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "2"]))
    assert k.until_held() == (2, []), k.lines
    p, got = as_nobody(s, srv.port, 3)
    if got != ["ok", "ECONNREFUSED", "ECONNREFUSED"]:
        p.kill()
        raise AssertionError("nobody's connects: %s (%s)" % (got, p.communicate()[1]))
    srv.wait_live(3)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.expect("db", in_use=3, kernel_joint=3)
    p.communicate("", timeout=20)
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", kernel_joint=0)


def test_joint_a_process_that_cannot_reach_the_engine_refuses_loudly():
    """A preloaded process that may not open the engine's map (its mode
    taken away) refuses the compartment's connects rather than count apart,
    and says why; the witness sees none of its connections."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}], extra='mode = "0666";')
    cg = cgroup()
    attach(s, cg)
    comps = "/sys/fs/bpf/bulkshim/%s/comps" % s.segment.replace(".", "+")
    os.chmod(comps, 0o600)
    p, got = as_nobody(s, srv.port, 2)
    assert got == ["ECONNREFUSED", "ECONNREFUSED"], got
    out, err = p.communicate("", timeout=20)
    assert "counted with a kernel engine" in err and "refused" in err, err
    assert srv.max_live == 0, "the witness saw %d" % srv.max_live
    s.expect("db", in_use=0, kernel_joint=0)


def test_joint_a_segment_made_again_is_counted_with_the_engine():
    """The segment removed while the engine runs (nobody held anything in
    it): the next preloaded process makes it again and finds the engine
    itself, so its connects still take from the joint count."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "2"]))
    assert k.until_held() == (2, []), k.lines
    os.unlink(h.SHM_PREFIX + s.segment)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "3"], env=s.env())
    ok, errs = p.until_held()
    assert ok == 1 and len(errs) == 2, p.lines
    srv.wait_live(3)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.expect("db", in_use=3, kernel_joint=3)
    p.finish()
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)


def test_joint_detach_and_attach_again_while_the_library_holds():
    """Detached (the engine unloaded) and attached again while a preloaded
    program holds two connections: the new engine counts them in once, and
    their closes give back to it exactly what they took."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    cg = cgroup()
    attach(s, cg)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "2"], env=s.env())
    assert p.until_held() == (2, []), p.lines
    s.expect("db", kernel_joint=2)
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True)
    assert r.returncode == 0 and "unloaded" in r.stdout, (r.stdout, r.stderr)
    r = attach(s, cg)
    assert "2 connections of preloaded processes counted in" in r.stdout, r.stdout
    s.expect("db", in_use=2, kernel_joint=2)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "3"]))
    ok, errs = k.until_held()
    assert ok == 1 and len(errs) == 2, k.lines
    srv.wait_live(3)
    p.finish()
    s.wait("db", "kernel_joint", 1, timeout=5)
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", kernel_joint=0)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live


def test_joint_what_a_lost_segment_held_is_put_back():
    """A preloaded holder is killed after its segment was removed: nothing
    can give its permits back from the shared count. The next process makes
    the segment again with nobody holding a record there, and puts the
    shared count back to the engine's own connections: the limit's rest is
    the library's again, no more."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "1"]))
    assert k.until_held() == (1, []), k.lines
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "2"], env=s.env())
    assert p.until_held() == (2, []), p.lines
    s.expect("db", kernel_joint=3)
    os.unlink(h.SHM_PREFIX + s.segment)
    p.p.kill()
    p.p.wait()
    srv.wait_live(1, timeout=5)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "3"],
               env=s.env(log="warn"))
    ok, errs = p.until_held()
    assert ok == 2 and len(errs) == 1, p.lines
    srv.wait_live(3)
    s.expect("db", in_use=3, kernel_joint=3)
    p.finish()
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", kernel_joint=0)


def test_joint_observe_mode_in_the_cgroup_counts_once():
    """enforce = false: a preloaded program inside the engine's cgroup is let
    past the limit by the library, which counts it (over), and the engine
    does not count it again."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 1}])
    with open(s.config) as f:
        text = f.read()
    with open(s.config, "w") as f:
        f.write(text.replace("max_connections = 1;", "max_connections = 1; enforce = false;"))
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient"), "127.0.0.1",
                str(srv.port), "3"], env=s.env())
    assert c.until_held() == (3, []), c.lines
    srv.wait_live(3)
    # The joint count holds every connection of the library's, those let
    # past the limit too (past it): the engine's peak is what both held.
    comp = s.expect("db", in_use=3, over=2, kernel_in_use=0, kernel_joint=3, peak=3)
    assert comp["would_reject"]["full"] == 2, comp
    rc, err = c.finish()
    assert rc == 0, err
    s.wait("db", "in_use", 0, timeout=5)


ON_DEMAND = r"""
import errno, socket, sys
port = int(sys.argv[1])
held = []
for line in sys.stdin:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
        print("ok", flush=True)
    except OSError as e:
        s.close()
        print(errno.errorcode.get(e.errno, str(e.errno)), flush=True)
"""


def test_joint_a_process_started_before_attach_joins_at_its_next_connect():
    """A preloaded program that started (and connected once) before the
    engine was attached takes from the joint count from its next connect
    on, with nothing restarted or reloaded."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 3}])
    p = h.LineProc([h.PY, "-c", ON_DEMAND, str(srv.port)], s.env())
    h.defer(p.kill)
    assert p.cmd("c") == "ok"
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "1"]))
    assert k.until_held() == (1, []), k.lines
    assert p.cmd("c") == "ok"
    assert p.cmd("c") == "ECONNREFUSED"
    srv.wait_live(3)
    assert srv.max_live == 3, "the witness saw %d at once" % srv.max_live
    s.expect("db", in_use=3, kernel_joint=3)
    p.finish()
    k.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", kernel_joint=0)


SPAWN_AND_LEAVE = r"""
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
os.set_inheritable(s.fileno(), True)
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
quiet = [(os.POSIX_SPAWN_OPEN, fd, "/dev/null", os.O_RDWR, 0) for fd in (0, 1, 2)]
pid = os.posix_spawn("/bin/sleep", ["sleep", "60"], env, file_actions=quiet)
print(pid, flush=True)
"""


def test_joint_a_socket_a_spawned_child_keeps_is_counted_after_its_parent_is_gone():
    """max_connections = 1. A preloaded process connects, makes a child
    without the library with posix_spawn that keeps the socket, and exits:
    no process record is left, but the child holds the connection. The next
    preloaded process to attach finds no record; it must not put the count
    shared with the engine back to the engine's own (none), or its own
    connect would pass the limit beside the child's."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 1}])
    cg = cgroup()
    attach(s, cg)
    r = subprocess.run([h.PY, "-c", SPAWN_AND_LEAVE, str(srv.port)], capture_output=True,
                       text=True, env=s.env(), timeout=30)
    assert r.returncode == 0, r.stderr
    child = int(r.stdout.split()[0])
    h.defer(lambda: os.kill(child, signal.SIGKILL))
    srv.wait_live(1)
    s.expect("db", in_use=1, kernel_joint=1)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "1"], env=s.env())
    ok, errs = p.until_held()
    assert ok == 0 and [e for e, _ in errs] == [ECONNREFUSED], p.lines
    assert srv.max_live == 1, "the witness saw %d at once" % srv.max_live
    s.expect("db", kernel_joint=1)
    p.finish()
    # The child's exit closes the last copy: the reconcile gives it back.
    os.kill(child, signal.SIGKILL)
    srv.wait_live(0, timeout=5)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "1"], env=s.env())
    deadline = time.monotonic() + 10
    ok, errs = p.until_held()
    while ok == 0 and time.monotonic() < deadline:
        p.finish()
        time.sleep(0.2)
        p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "1"], env=s.env())
        ok, errs = p.until_held()
    assert ok == 1, p.lines
    p.finish()
    assert srv.max_live == 1, "the witness saw %d at once" % srv.max_live
