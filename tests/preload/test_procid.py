"""test_procid.py - the cached pid: processes made behind the fork wrapper's back leave the parent's permits alone."""

import errno

from harness import Agent, FdOps, Server, Shim


def _setup():
    """A server and a compartment of one connection to it: while the parent
    holds its permit, any other connect is refused."""
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    return srv, shim


def _child_closes_copy(how):
    """A child made by `how` closes its copy of a counted socket: the
    parent's permit stays until the parent closes it. The parent's next
    connect says whether it does (refused at the limit of 1), before any
    status read could reconcile a permit given back by mistake."""
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    fd = f.do("tcp", "127.0.0.1", srv.port)
    srv.wait_live(1)
    f.do(how, fd)  # returns once the child has exited
    try:
        extra = f.do("tcp", "127.0.0.1", srv.port)
    except OSError as e:
        assert e.errno == errno.ECONNREFUSED, "the connect past the limit: %s" % e
    else:
        raise AssertionError("after %s a second connect was admitted (fd %d): the child's close "
                             "gave the parent's permit back" % (how, extra))
    assert srv.live == 1, "the server holds %d connections, want the parent's one" % srv.live
    shim.expect("p", in_use=1, admitted=1, rejected=1)
    f.do("close", fd)
    srv.wait_live(0)
    # The parent's close gave the permit back once: one connect gets it.
    again = f.do("tcp", "127.0.0.1", srv.port)
    shim.expect("p", in_use=1, admitted=2, rejected=1)
    f.do("close", again)
    shim.wait("p", "in_use", 0, timeout=3)
    assert f.exit(0) == 0


def test_a_vfork_child_closing_a_counted_socket_leaves_the_parents_permit():
    _child_closes_copy("vfork_close")


def test_a_vfork_child_making_a_socket_under_a_counted_number_leaves_the_parents_entry():
    # The child shares our memory, not our descriptors: a socket it makes
    # under the number of one of our counted sockets (its copy closed
    # first) must not take over our entry, or our close would give nothing
    # back. The next connect, in the same process, finds the permit back
    # at once (a status read would reconcile a lost one and hide it).
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    f = FdOps(shim.env(log="off"))
    fd = f.do("tcp", "127.0.0.1", srv.port)
    f.do("vfork_socket", fd)
    f.do("close", fd)
    try:
        again = f.do("tcp", "127.0.0.1", srv.port)
    except OSError as e:
        raise AssertionError("after a vfork child made a socket under its number, the "
                             "parent's close gave no permit back: %s" % e)
    f.do("close", again)
    shim.expect("p", in_use=0, admitted=2, rejected=0)
    assert f.exit(0) == 0


def test_a_Fork_child_closing_a_counted_socket_leaves_the_parents_permit():
    _child_closes_copy("_Fork_close")


def test_a_clone_child_closing_a_counted_socket_leaves_the_parents_permit():
    _child_closes_copy("clone_close")


def test_a_raw_fork_syscall_child_closing_a_counted_socket_leaves_the_parents_permit():
    _child_closes_copy("sysfork_close")


def test_a_python_subprocess_leaves_the_parents_permit():
    # CPython 3.10+ starts subprocesses with vfork(); the child closes every
    # descriptor above 2 (close_fds) with close_range() before exec.
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    a.call("s = socket.create_connection(('127.0.0.1', %d))" % srv.port)
    srv.wait_live(1)
    assert a("__import__('subprocess').run(['true'], close_fds=True).returncode") == 0
    t = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not t["ok"] and t["errno"] == errno.ECONNREFUSED, \
        "after a subprocess a second connect got %r: the parent's permit is gone" % t
    assert srv.live == 1, "the server holds %d connections, want the parent's one" % srv.live
    shim.expect("p", in_use=1, admitted=1, rejected=1)
    a.call("s.close()")
    srv.wait_live(0)
    shim.wait("p", "in_use", 0, timeout=3)
    assert a.finish() == 0
