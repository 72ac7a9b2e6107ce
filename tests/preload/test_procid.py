"""test_procid.py - the cached pid: processes made behind the fork wrapper's back leave the parent's permits alone."""

from harness import Agent, FdOps, Server, Shim, run


def _setup():
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 4}])
    return srv, shim


def _child_closes_copy(how):
    """A child made by `how` closes its copy of a counted socket: the
    parent's permit stays until the parent closes it."""
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    fd = f.do("tcp", "127.0.0.1", srv.port)
    assert shim.comp("p")["in_use"] == 1
    f.do(how, fd)
    c = shim.wait("p", "in_use", 1)
    assert c["in_use"] == 1, "after %s the parent's permit is gone: %r" % (how, c)
    f.do("close", fd)
    shim.wait("p", "in_use", 0, timeout=3)
    assert f.exit(0) == 0


def test_a_vfork_child_closing_a_counted_socket_leaves_the_parents_permit():
    _child_closes_copy("vfork_close")


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
    assert shim.comp("p")["in_use"] == 1
    assert a("__import__('subprocess').run(['true'], close_fds=True).returncode") == 0
    c = shim.wait("p", "in_use", 1)
    assert c["in_use"] == 1, "after a subprocess the parent's permit is gone: %r" % c
    a.call("s.close()")
    shim.wait("p", "in_use", 0, timeout=3)
    assert a.finish() == 0


if __name__ == "__main__":
    run(globals())
