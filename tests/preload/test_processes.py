"""test_processes.py - permits across fork, exec, exit and SIGKILL."""

import errno
import os
import signal
import socket
import time

from harness import Agent, FdOps, Server, Shim


def _setup(limit):
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": limit}])
    return srv, shim


# Run inside an agent: retries for up to 1.5 s, returns seconds until admitted.
RETRY = """
def retry(port, limit=1.5):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        r = attempt(('127.0.0.1', port))
        if r['ok']:
            return {'fd': r['fd'], 'after': time.monotonic() - t0}
        if r['errno'] != errno.ECONNREFUSED:
            raise OSError(r['errno'], 'unexpected')
        time.sleep(0.01)
    return {'fd': None, 'after': time.monotonic() - t0}
"""


def _proc_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _kill_and_reclaim(reap):
    srv, shim = _setup(3)
    holder = Agent(shim.env(log="off"))
    for _ in range(3):
        holder("tcp(%d)" % srv.port)
    waiter = Agent(shim.env(log="off"))
    waiter.call(RETRY)
    full = waiter("attempt(('127.0.0.1', %d))" % srv.port)
    assert not full["ok"], "compartment of 3 not full with 3 held: %r" % full
    shim.expect("p", in_use=3)

    os.kill(holder.pid, signal.SIGKILL)
    if reap:
        holder.wait_exit(5)
    else:
        # Left unwaited: the holder stays a zombie, which kill(pid, 0) still finds.
        time.sleep(0.05)
        st = _proc_state(holder.pid)
        assert st == "Z", "killed holder should be a zombie, /proc says %r" % st
    got = waiter("retry(%d)" % srv.port, timeout=5)
    assert got["fd"] is not None, "permits of a SIGKILLed holder were not back after %.2fs" % got["after"]
    assert got["after"] <= 1.0, "permits came back after %.2fs, want <= 1 s" % got["after"]
    # All three come back, not just the one that forced the reclaim.
    more = [waiter("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(3)]
    assert [m["ok"] for m in more] == [True, True, False], \
        "after the reclaim, want 2 more admitted then a refusal: %r" % more
    waiter.call("close(%d, %d, %d)" % (got["fd"], more[0]["fd"], more[1]["fd"]))
    c = shim.expect("p", in_use=0)
    assert c.get("reclaimed") == 3, "status shows reclaimed %r, want 3 (the holder's permits)" % (
        c.get("reclaimed"))
    if not reap:
        assert _proc_state(holder.pid) == "Z", "the zombie was reaped early"
        holder.wait_exit(5)
    assert waiter.finish() == 0


def test_sigkilled_holder_permits_reclaimed_within_a_second():
    _kill_and_reclaim(reap=True)


def test_sigkilled_zombie_holder_permits_reclaimed():
    _kill_and_reclaim(reap=False)


def test_status_reclaims_dead_holder():
    srv, shim = _setup(2)
    holder = Agent(shim.env(log="off"))
    holder("tcp(%d)" % srv.port)
    holder("tcp(%d)" % srv.port)
    shim.expect("p", in_use=2)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait_exit(5)
    # No process asks for a permit: `bulkshim status` alone must take them back.
    c = shim.wait("p", "in_use", 0, timeout=1.5)
    assert c.get("reclaimed") == 2, "reclaimed %r, want 2" % c.get("reclaimed")


def test_fork_child_closes_parent_still_holds():
    srv, shim = _setup(1)
    a = Agent(shim.env(log="off"))
    fd = a("tcp(%d)" % srv.port)
    pid = a("fork()")
    a("child(%d, 'close(%d)')" % (pid, fd))
    shim.expect("p", in_use=1)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "the child's close gave back the parent's permit: %r" % r
    a.call("close(%d)" % fd)
    shim.expect("p", in_use=0)
    assert a("child_exit(%d)" % pid) == 0
    shim.expect("p", in_use=0, admitted=1, reclaimed=0)
    assert a.finish() == 0


def _held_until_the_child_exits(a, srv, shim, pid, why):
    """The parent let go of a connection its forked child still has: the
    permit stays taken (a new connect is refused) until the child exits,
    then comes back, and nothing counts as reclaimed."""
    srv.wait_live(1)
    shim.expect("p", in_use=1)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "%s: %r" % (why, r)
    # The child exits normally still holding its copy.
    assert a("child_exit(%d)" % pid) == 0
    shim.expect("p", in_use=0, reclaimed=0)
    srv.wait_live(0)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert r["ok"], "permit not back after the last holder exited: %r" % r
    assert a.finish() == 0


def test_fork_parent_closes_child_still_holds():
    srv, shim = _setup(1)
    a = Agent(shim.env(log="off"))
    fd = a("tcp(%d)" % srv.port)
    pid = a("fork()")
    a.call("close(%d)" % fd)
    _held_until_the_child_exits(a, srv, shim, pid,
                                "the parent's close gave back the permit the child holds")


def _fork_before_connect():
    """An agent that makes a socket S and forks before connecting it:
    returns the server, the shim, the agent and the child's pid."""
    srv, shim = _setup(1)
    a = Agent(shim.env(log="off"))
    a.call("S = socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
    return srv, shim, a, a("fork()")


def test_socket_made_before_fork_and_connected_after_is_held_by_both():
    # The parent connects a socket its child shares, then closes its copy:
    # the connection lives on in the child, and so does its permit.
    srv, shim, a, pid = _fork_before_connect()
    a.call("S.connect(('127.0.0.1', %d))" % srv.port)
    shim.expect("p", in_use=1)
    a.call("S.close()")
    _held_until_the_child_exits(a, srv, shim, pid, "the parent's close gave back the permit "
                                "of a connection its child still has")


def test_socket_made_before_fork_and_connected_by_the_child():
    # The same the other way round: the child connects and closes, the
    # parent keeps its copy of the connected socket.
    srv, shim, a, pid = _fork_before_connect()
    a("child(%d, code=\"S.connect(('127.0.0.1', %d))\")" % (pid, srv.port))
    shim.expect("p", in_use=1)
    a("child(%d, code='S.close()')" % pid)
    assert a("child_exit(%d)" % pid) == 0
    srv.wait_live(1)
    shim.expect("p", in_use=1)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "the child's exit gave back the permit of a connection its parent " \
        "still has: %r" % r
    a.call("S.close()")
    shim.expect("p", in_use=0)
    srv.wait_live(0)
    assert a.finish() == 0


def test_socket_whose_connect_failed_is_shared_again_by_a_fork():
    # A refused connect leaves the socket unconnected: a fork then shares
    # it before its next, successful connect, like a new socket.
    srv = Server()
    with socket.socket() as probe:     # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port, "127.0.0.1:%d" % dead_port],
                  "max_connections": 1}])
    a = Agent(shim.env(log="off"))
    a.call("S = socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
    r = a("S.connect_ex(('127.0.0.1', %d))" % dead_port)
    assert r == errno.ECONNREFUSED, "connect to a closed port: %r" % r
    shim.expect("p", in_use=0)
    pid = a("fork()")
    a.call("S.connect(('127.0.0.1', %d))" % srv.port)
    a.call("S.close()")
    _held_until_the_child_exits(a, srv, shim, pid, "the child's connected copy lost its permit")


def test_socket_whose_connect_the_shim_refused_is_shared_again_by_a_fork():
    # A connect refused by a full compartment leaves the socket as it was:
    # unconnected, so a fork before its next connect shares it, and the
    # permit that connect takes lasts until both copies are gone.
    srv, shim = _setup(1)
    a = Agent(shim.env(log="off"))
    held = a("tcp(%d)" % srv.port)
    a.call("S = socket.socket(socket.AF_INET, socket.SOCK_STREAM)")
    r = a("S.connect_ex(('127.0.0.1', %d))" % srv.port)
    assert r == errno.ECONNREFUSED, "connect to a full compartment: %r" % r
    shim.expect("p", in_use=1, rejected=1)
    a.call("close(%d)" % held)
    srv.wait_live(0)
    pid = a("fork()")
    a.call("S.connect(('127.0.0.1', %d))" % srv.port)
    a.call("S.close()")
    _held_until_the_child_exits(a, srv, shim, pid, "the child's copy of the socket the shim "
                                "refused once lost its permit")


def test_forked_child_exiting_without_closing_leaks_nothing():
    srv, shim = _setup(2)
    a = Agent(shim.env(log="off"))
    fds = [a("tcp(%d)" % srv.port) for _ in range(2)]
    for _ in range(3):
        pid = a("fork()")
        assert a("child(%d, expr='os.getpid()')" % pid) == pid
        assert a("child_exit(%d)" % pid) == 0
        shim.expect("p", in_use=2)
    a.call("close(%d, %d)" % tuple(fds))
    shim.expect("p", in_use=0, admitted=2, reclaimed=0)
    # A child that forks from a process holding nothing takes nothing either.
    pid = a("fork()")
    c = a("child(%d, expr='attempt((\"127.0.0.1\", %d))')" % (pid, srv.port))
    assert c["ok"], c
    shim.expect("p", in_use=1)
    assert a("child_exit(%d)" % pid) == 0
    shim.expect("p", in_use=0, reclaimed=0)
    assert a.finish() == 0


def test_exec_keeps_inherited_socket_counted():
    srv, shim = _setup(1)
    a = Agent(shim.env(log="off"))
    fd = a("tcp(%d)" % srv.port)
    a("os.set_inheritable(%d, True)" % fd)
    a.execv()  # os.execv of a fresh agent; same pid, the new image answers
    assert a("os.fstat(%d).st_mode & 0o170000 == 0o140000" % fd), "fd not inherited as a socket"
    shim.expect("p", in_use=1)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"] and r["errno"] == errno.ECONNREFUSED, \
        "after exec the inherited socket no longer holds its permit: %r" % r
    a.call("close(%d)" % fd)
    shim.expect("p", in_use=0)
    srv.wait_live(0)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert r["ok"], "the new image's close did not give the permit back: %r" % r
    assert a.finish() == 0
    shim.expect("p", in_use=0, reclaimed=0)


def test_exec_releases_cloexec_socket():
    srv, shim = _setup(2)
    a = Agent(shim.env(log="off"))
    keep = a("tcp(%d)" % srv.port)
    a("os.set_inheritable(%d, True)" % keep)
    gone = a("tcp(%d)" % srv.port)  # CPython sockets are close-on-exec
    assert a("os.get_inheritable(%d)" % gone) is False
    shim.expect("p", in_use=2)
    a.execv()
    # The process is alive, so no reclaim can explain a release: only the
    # new image noticing that the close-on-exec descriptor is gone.
    shim.wait("p", "in_use", 1, timeout=1.0)
    srv.wait_live(1)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert r["ok"], "the close-on-exec socket's permit leaked across exec: %r" % r
    r2 = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r2["ok"], "the inherited socket lost its permit across exec: %r" % r2
    a.call("close(%d, %d)" % (keep, r["fd"]))
    shim.expect("p", in_use=0, reclaimed=0)
    assert a.finish() == 0


def test_normal_exit_gives_everything_back():
    srv, other = Server(), Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 3},
                 {"name": "q", "destinations": ["127.0.0.1:%d" % other.port], "max_connections": 2}])
    a = Agent(shim.env(log="off"))
    for _ in range(3):
        a("tcp(%d)" % srv.port)
    a("os.dup(tcp(%d))" % other.port)
    shim.expect("p", in_use=3)
    shim.expect("q", in_use=1)
    assert a.finish() == 0  # returns from its loop: exit(3), no socket closed first
    # Released by the exit itself, not reclaimed as if the process had died.
    shim.expect("p", in_use=0, reclaimed=0)
    shim.expect("q", in_use=0, reclaimed=0)
    b = Agent(shim.env(log="off"))
    got = [b("attempt(('127.0.0.1', %d))" % srv.port)["ok"] for _ in range(4)]
    assert got == [True, True, True, False], "after the holder exited: %r" % got
    assert b.finish() == 0
    shim.expect("p", in_use=0, reclaimed=0)

    # The same from C, with exit(3) called directly.
    f = FdOps(shim.env(log="off"))
    for _ in range(3):
        f.do("tcp", "127.0.0.1", srv.port)
    f.do("tcp", "127.0.0.1", other.port)
    shim.expect("p", in_use=3)
    assert f.exit(0) == 0
    shim.expect("p", in_use=0, reclaimed=0)
    shim.expect("q", in_use=0, reclaimed=0)
