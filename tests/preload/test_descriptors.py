"""test_descriptors.py - copies of a counted socket hold its permit; every way of ending the last one releases it."""

import errno

from harness import Agent, FdOps, Server, Shim


def _setup(limit=1):
    srv = Server()
    shim = Shim([{"name": "d", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": limit}])
    return srv, shim


def _refused(a, srv, why):
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"] and r["errno"] == errno.ECONNREFUSED, \
        "%s: a new connect was not refused (%r), so the permit was given back early" % (why, r)


def _admitted(a, srv, why):
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert r["ok"], "%s: a new connect was refused (%r), so the permit leaked" % (why, r)
    a.call("close(%d)" % r["fd"])


def test_os_dup_copy_keeps_permit_until_last_close():
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    fd = a("tcp(%d)" % srv.port)
    d = a("os.dup(%d)" % fd)  # fcntl64(fd, F_DUPFD_CLOEXEC) in CPython
    a.call("close(%d)" % fd)
    shim.expect("d", in_use=1, admitted=1)
    _refused(a, srv, "original closed, os.dup copy open")
    a.call("close(%d)" % d)
    shim.expect("d", in_use=0)
    _admitted(a, srv, "last copy closed")
    assert a.finish() == 0


def test_os_dup2_and_dup3_copies_keep_permit_until_last_close():
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    # os.dup2 with inheritable=True calls dup2; with inheritable=False, dup3.
    for how in ("True", "False"):
        fd = a("tcp(%d)" % srv.port)
        target = a("os.open('/dev/null', os.O_RDONLY)")
        assert a("os.dup2(%d, %d, inheritable=%s)" % (fd, target, how)) == target
        high = a("os.dup2(%d, 200, inheritable=%s)" % (fd, how))
        assert high == 200
        a.call("close(%d)" % fd)
        shim.expect("d", in_use=1)
        a.call("close(%d)" % target)
        shim.expect("d", in_use=1)
        _refused(a, srv, "dup2(inheritable=%s) copy open" % how)
        a.call("close(200)")
        shim.expect("d", in_use=0)
        _admitted(a, srv, "dup2(inheritable=%s): last copy closed" % how)
    assert a.finish() == 0


def test_os_dup2_over_counted_socket_releases():
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    fd = a("tcp(%d)" % srv.port)
    null = a("os.open('/dev/null', os.O_RDONLY)")
    a("os.dup2(%d, %d)" % (null, fd))
    shim.expect("d", in_use=0)
    srv.wait_live(0)
    _admitted(a, srv, "dup2 over the counted fd")
    a.call("close(%d, %d)" % (fd, null))
    shim.expect("d", in_use=0)
    assert a.finish() == 0


def test_os_closerange_releases():
    srv, shim = _setup(limit=3)
    a = Agent(shim.env(log="off"))
    fds = [a("tcp(%d)" % srv.port) for _ in range(3)]
    d = a("os.dup(%d)" % fds[0])
    shim.expect("d", in_use=3)
    lo, hi = min(fds + [d]), max(fds + [d])
    a("os.closerange(%d, %d)" % (lo, hi + 1))
    shim.expect("d", in_use=0)
    srv.wait_live(0)
    assert a.finish() == 0


def test_socket_makefile_close_releases():
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    code = """
ms = socket.socket()
ms.connect(('127.0.0.1', %d))
mf = ms.makefile('rwb')
ms.close()
""" % srv.port
    a.call(code)
    shim.expect("d", in_use=1)
    _refused(a, srv, "makefile still open")
    a.call("mf.close()")
    shim.expect("d", in_use=0)
    _admitted(a, srv, "makefile closed")
    assert a.finish() == 0


def test_c_dup_family_copies_keep_permit_until_last_close():
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    copies = [("dup", None), ("dup2", 100), ("dup3", 101, 0), ("dup3", 102, 1),
              ("fcntl", "dupfd", 110), ("fcntl", "dupfd_cloexec", 120),
              ("fcntl64", "dupfd", 130), ("fcntl64", "dupfd_cloexec", 140)]
    for op in copies:
        fd = f.do("tcp", "127.0.0.1", srv.port)
        if op[0] == "dup":
            copy = f.do("dup", fd)
        elif op[0] == "dup2":
            copy = f.do("dup2", fd, op[1])
        elif op[0] == "dup3":
            copy = f.do("dup3", fd, op[1], op[2])
        else:
            copy = f.do(op[0], fd, op[1], op[2])
            assert copy >= op[2], "%s returned %d below its minimum %d" % (op, copy, op[2])
        f.do("close", fd)
        c = shim.comp("d")
        assert c["in_use"] == 1, "%s: closing the original released the permit while the copy " \
            "%d is open (in_use %r)" % (op, copy, c["in_use"])
        try:
            extra = f.do("tcp", "127.0.0.1", srv.port)
        except OSError as e:
            assert e.errno == errno.ECONNREFUSED, "%s: %s" % (op, e)
        else:
            raise AssertionError("%s: a second socket got in while the copy held the permit" % (op,))
        f.do("close", copy)
        c = shim.comp("d")
        assert c["in_use"] == 0, "%s: closing the last copy left in_use %r" % (op, c["in_use"])
    assert f.exit(0) == 0


def test_c_dup2_dup3_over_counted_socket_release():
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    for op in (("dup2",), ("dup3", 0), ("dup3", 1)):
        fd = f.do("tcp", "127.0.0.1", srv.port)
        null = f.do("devnull")
        assert f.do(op[0], null, fd, *op[1:]) == fd
        c = shim.comp("d")
        assert c["in_use"] == 0, "%s of /dev/null over the counted fd left in_use %r" % (op, c["in_use"])
        again = f.do("tcp", "127.0.0.1", srv.port)
        f.do("close", again)
        f.do("close", fd)
        f.do("close", null)
    shim.expect("d", in_use=0, admitted=6)
    assert f.exit(0) == 0


def test_c_close_range_releases():
    srv, shim = _setup(limit=3)
    f = FdOps(shim.env(log="off"))
    fds = [f.do("tcp", "127.0.0.1", srv.port) for _ in range(3)]
    shim.expect("d", in_use=3)
    f.do("close_range", min(fds), max(fds))
    shim.expect("d", in_use=0)
    # An open-ended range, as programs write it before exec.
    fds = [f.do("tcp", "127.0.0.1", srv.port) for _ in range(2)]
    f.do("close_range", min(fds), 0xFFFFFFFF)
    shim.expect("d", in_use=0, admitted=5)
    assert f.exit(0) == 0


def test_c_closefrom_releases():
    srv, shim = _setup(limit=3)
    f = FdOps(shim.env(log="off"))
    fds = [f.do("tcp", "127.0.0.1", srv.port) for _ in range(3)]
    copy = f.do("dup2", fds[0], 300)
    shim.expect("d", in_use=3)
    f.do("closefrom", min(fds))
    shim.expect("d", in_use=0)
    srv.wait_live(0)
    assert copy == 300
    assert f.exit(0) == 0


def test_c_fdopen_fclose_releases():
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    fd = f.do("tcp", "127.0.0.1", srv.port)
    stream = f.do("fdopen", fd)
    shim.expect("d", in_use=1)
    f.do("fclose", stream)
    shim.expect("d", in_use=0)
    # fclose of a stream over a copy leaves the permit with the original.
    fd = f.do("tcp", "127.0.0.1", srv.port)
    stream = f.do("fdopen", f.do("dup", fd))
    f.do("fclose", stream)
    shim.expect("d", in_use=1)
    f.do("close", fd)
    shim.expect("d", in_use=0, admitted=2)
    assert f.exit(0) == 0


def test_a_connect_by_syscall_number_takes_and_gives_back_the_permit():
    """syscall(SYS_connect, ...) is admitted like connect(): counted, refused
    when the compartment is full (nothing reaches the kernel), given back by
    close."""
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    a.call("import ctypes, platform, struct\n"
           "libc = ctypes.CDLL(None, use_errno=True)\n"
           "NR = {'x86_64': 42, 'aarch64': 203}[platform.machine()]\n"
           "addr = ctypes.create_string_buffer(struct.pack('=H', socket.AF_INET) + "
           "struct.pack('!H4s8x', %d, socket.inet_aton('127.0.0.1')), 16)\n"
           "s1, s2 = socket.socket(), socket.socket()" % srv.port)
    assert a("libc.syscall(NR, s1.fileno(), addr, 16)") == 0
    shim.expect("d", in_use=1, admitted=1)
    assert a("(libc.syscall(NR, s2.fileno(), addr, 16), ctypes.get_errno())") == \
        [-1, errno.ECONNREFUSED], "a second connect by syscall number was not refused"
    shim.expect("d", in_use=1, rejected=1)
    a.call("s1.close()")
    shim.expect("d", in_use=0)
    assert a("libc.syscall(NR, s2.fileno(), addr, 16)") == 0
    shim.expect("d", in_use=1, admitted=2)
    a.call("s2.close()")
    shim.expect("d", in_use=0)
    assert a.finish() == 0
