"""test_spawn.py - children made without fork() (vfork, posix_spawn, popen, system, clone, _Fork) and forks the process table cannot record: the parent's close keeps the permit while the child has the socket."""

import errno
import time

from harness import Agent, FdOps, Server, Shim

# The scenario of every test here: a compartment of one connection. The
# parent connects (the server, the witness, holds 1), makes a child that
# inherits the socket and keeps it, and closes its own copy. The child
# still has the connection, so a new connect must be refused: admitted, the
# server would hold 2 against a limit of 1. Once the child is gone, the
# permit comes back (the connect that finds the compartment full runs the
# reconcile, which asks the kernel) and a connect is admitted again.


def _setup(extra=""):
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}],
                extra)
    return srv, shim


def _refused_while_the_child_holds(srv, attempt, close, why):
    """attempt() connects once (the descriptor if admitted, else None): it
    must be refused while the child holds the parent's old connection. An
    admitted one is held until the server has seen it, so that the failure
    names what the witness counted."""
    srv.wait_live(1)
    for _ in range(3):
        fd = attempt()
        if fd is not None:
            try:
                srv.wait_live(2, timeout=1.0)
            except AssertionError:
                pass
            live = srv.live
            close(fd)
            raise AssertionError("%s: a connect was admitted while the child still holds the "
                                 "connection: the server holds %d against a limit of 1" % (why, live))
    assert srv.live == 1 and srv.max_live == 1, "%s: the server holds %d (max %d), want 1" % (
        why, srv.live, srv.max_live)


def _admitted_after_the_child(srv, attempt, close, why, timeout=5.0):
    """Once the child is gone the permit comes back: a connect is admitted
    within timeout (retried: the reconcile runs at most every 100 ms per
    process)."""
    srv.wait_live(0)
    deadline = time.monotonic() + timeout
    while True:
        fd = attempt()
        if fd is not None:
            break
        assert time.monotonic() < deadline, "%s: the permit did not come back within %.1fs " \
            "after the child was gone" % (why, timeout)
        time.sleep(0.05)
    srv.wait_live(1)
    close(fd)
    assert srv.max_live == 1, "%s: the server held %d at once, want at most 1" % (why, srv.max_live)


# ---- a C program: every way the library wraps ----

def _fdops_spawn(how, env_mode):
    srv, shim = _setup()
    f = FdOps(shim.env(log="off"))
    fd = f.do("tcp", "127.0.0.1", srv.port)
    srv.wait_live(1)
    # The child execs sleep holding fd; the parent closes its copy at once,
    # before a child that loads the library could have adopted the socket.
    pid = f.do("spawn", how, fd, env_mode)

    def attempt():
        try:
            return f.do("tcp", "127.0.0.1", srv.port)
        except OSError as e:
            assert e.errno == errno.ECONNREFUSED, "%s: the connect failed with %s" % (how, e)
            return None

    def close(fd):
        f.do("close", fd)

    why = "%s child (%s)" % (how, env_mode)
    _refused_while_the_child_holds(srv, attempt, close, why)
    assert f.do("reap", pid) == 0
    _admitted_after_the_child(srv, attempt, close, why)
    shim.wait("p", "in_use", 0, timeout=3)
    assert f.exit(0) == 0


def test_a_vfork_child_without_the_library_keeps_the_permit():
    _fdops_spawn("vfork", "bare")


def test_a_vfork_child_with_the_library_keeps_the_permit():
    _fdops_spawn("vfork", "keep")


def test_a_posix_spawn_child_without_the_library_keeps_the_permit():
    _fdops_spawn("posix_spawn", "bare")


def test_a_posix_spawn_child_with_the_library_keeps_the_permit():
    _fdops_spawn("posix_spawn", "keep")


def test_a_posix_spawnp_child_without_the_library_keeps_the_permit():
    _fdops_spawn("posix_spawnp", "bare")


def test_a_clone_child_keeps_the_permit():
    _fdops_spawn("clone", "bare")


def test_a_clone_vfork_child_keeps_the_permit():
    # CLONE_VM | CLONE_VFORK: what glibc's posix_spawn and Java do.
    _fdops_spawn("clone_vfork", "bare")


def test_a_syscall_clone_child_keeps_the_permit():
    _fdops_spawn("sys_clone", "bare")


def test_a_syscall_clone3_child_keeps_the_permit():
    _fdops_spawn("sys_clone3", "bare")


def test_a_Fork_child_keeps_the_permit():
    _fdops_spawn("_Fork", "bare")


# ---- Python: subprocess.Popen (vfork, or posix_spawn) and os.posix_spawn ----

# Run inside the agent: the environment of the child, with or without the library.
CHILD_ENV = """
import subprocess
def child_env(bare):
    env = dict(os.environ)
    if bare:
        env.pop('LD_PRELOAD', None)
    return env
"""

# Each starts `sleep` holding the agent's counted socket s, then closes s
# at once; SPAWNS[how] is the code, CHILD the child's pid.
SPAWNS = {
    # pass_fds makes CPython use vfork (the child clears close-on-exec on
    # its own copy of the descriptor: the parent's stays set).
    "popen_vfork": "p = subprocess.Popen(['sleep', '3600'], pass_fds=(s.fileno(),), "
                   "env=child_env(%s)); CHILD = p.pid",
    # No close_fds, an absolute path, no pipes below 3: CPython uses posix_spawn.
    "popen_posix_spawn": "os.set_inheritable(s.fileno(), True); "
                         "p = subprocess.Popen(['/bin/sleep', '3600'], close_fds=False, "
                         "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
                         "stderr=subprocess.DEVNULL, env=child_env(%s)); CHILD = p.pid",
    # A file action dup2s the close-on-exec socket to a number that survives exec.
    "os_posix_spawn": "CHILD = os.posix_spawn('/bin/sleep', ['sleep', '3600'], child_env(%s), "
                      "file_actions=[(os.POSIX_SPAWN_DUP2, s.fileno(), 9)])",
}


def _python_spawn(how, bare):
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    a.call(CHILD_ENV)
    a.call("s = socket.create_connection(('127.0.0.1', %d))" % srv.port)
    srv.wait_live(1)
    a.call(SPAWNS[how] % bare + "; s.close()")

    def attempt():
        r = a("attempt(('127.0.0.1', %d))" % srv.port)
        if r["ok"]:
            return r["fd"]
        assert r["errno"] == errno.ECONNREFUSED, "%s: the connect failed with %r" % (how, r)
        return None

    def close(fd):
        a.call("close(%d)" % fd)

    why = "%s child (%s)" % (how, "without the library" if bare else "with the library")
    _refused_while_the_child_holds(srv, attempt, close, why)
    a.call("os.kill(CHILD, 9); os.waitpid(CHILD, 0)")
    _admitted_after_the_child(srv, attempt, close, why)
    shim.wait("p", "in_use", 0, timeout=3)
    assert a.finish() == 0


def test_a_subprocess_popen_child_without_the_library_keeps_the_permit():
    _python_spawn("popen_vfork", True)


def test_a_subprocess_popen_child_with_the_library_keeps_the_permit():
    _python_spawn("popen_vfork", False)


def test_a_subprocess_popen_posix_spawn_child_without_the_library_keeps_the_permit():
    _python_spawn("popen_posix_spawn", True)


def test_an_os_posix_spawn_child_without_the_library_keeps_the_permit():
    _python_spawn("os_posix_spawn", True)


def test_an_os_posix_spawn_child_with_the_library_keeps_the_permit():
    _python_spawn("os_posix_spawn", False)


# ---- the C library's popen() and system(), through ctypes ----

# Run inside the agent: libc's popen and system as the program's own calls
# (dlsym finds the library's wrappers first, as the program's PLT would),
# the environment without the library if bare, and the agent's one child.
LIBC = """
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.popen.restype = ctypes.c_void_p
libc.popen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.system.argtypes = [ctypes.c_char_p]
def child_pid():
    me = str(os.getpid())
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                with open('/proc/%s/stat' % p) as f:
                    if f.read().rsplit(')', 1)[1].split()[1] == me:
                        return int(p)
            except OSError:
                pass
    return None
def wait_child():
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5:
        pid = child_pid()
        if pid is not None:
            return pid
        time.sleep(0.005)
    raise RuntimeError('no child')
"""

# The socket is made inheritable: popen's and system's children get every
# descriptor that is not close-on-exec.
LIBC_SPAWNS = {
    "popen": "FP = libc.popen(b'exec sleep 3600', b'r'); s.close(); CHILD = wait_child()",
    # system() returns when the command ends: a thread of the agent waits
    # in it, and the socket is closed once the child exists.
    "system": "threading.Thread(target=libc.system, args=(b'exec sleep 3600',), daemon=True)"
              ".start(); CHILD = wait_child(); s.close()",
}


def _libc_spawn(how, bare):
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    a.call(LIBC)
    a.call("s = socket.create_connection(('127.0.0.1', %d)); os.set_inheritable(s.fileno(), True)"
           % srv.port)
    srv.wait_live(1)
    if bare:
        a.call("libc.unsetenv(b'LD_PRELOAD')")
    a.call(LIBC_SPAWNS[how])

    def attempt():
        r = a("attempt(('127.0.0.1', %d))" % srv.port)
        if r["ok"]:
            return r["fd"]
        assert r["errno"] == errno.ECONNREFUSED, "%s: the connect failed with %r" % (how, r)
        return None

    def close(fd):
        a.call("close(%d)" % fd)

    why = "%s child (%s)" % (how, "without the library" if bare else "with the library")
    _refused_while_the_child_holds(srv, attempt, close, why)
    a.call("os.kill(CHILD, 9)")
    if how == "popen":
        a.call("os.waitpid(CHILD, 0)")
    _admitted_after_the_child(srv, attempt, close, why)
    shim.wait("p", "in_use", 0, timeout=3)
    assert a.finish() == 0


def test_a_popen_child_without_the_library_keeps_the_permit():
    _libc_spawn("popen", True)


def test_a_popen_child_with_the_library_keeps_the_permit():
    _libc_spawn("popen", False)


def test_a_system_child_without_the_library_keeps_the_permit():
    _libc_spawn("system", True)


# ---- fork with the process table full ----

def test_a_fork_with_the_process_table_full_keeps_the_inherited_permit():
    # A table of 2 records and a compartment of 2: A and B hold one
    # connection each, so A's forked child gets no record. A closes its
    # copy of the connection its child still has, B closes its own: one
    # connection is left (the child's), so one more may be admitted and
    # no second: the witness must never hold 3.
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 2}],
                "max_processes = 2;")
    a = Agent(shim.env(log="off"))
    b = Agent(shim.env(log="off"))
    fa = a("tcp(%d)" % srv.port)
    fb = b("tcp(%d)" % srv.port)
    srv.wait_live(2)
    pid = a("fork()")
    a.call("close(%d)" % fa)
    b.call("close(%d)" % fb)
    srv.wait_live(1)
    got = [a("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(3)]
    assert [g["ok"] for g in got] == [True, False, False], \
        "with the child's inherited connection open, want one admitted then refusals: %r " \
        "(server holds %d, max %d)" % (got, srv.live, srv.max_live)
    assert srv.max_live == 2, "the server held %d at once, want at most 2" % srv.max_live
    a.call("close(%d)" % got[0]["fd"])
    srv.wait_live(1)
    assert a("child_exit(%d)" % pid) == 0
    srv.wait_live(0)
    deadline = time.monotonic() + 5
    fds = []
    while len(fds) < 2:
        r = a("attempt(('127.0.0.1', %d))" % srv.port)
        if r["ok"]:
            fds.append(r["fd"])
            continue
        assert time.monotonic() < deadline, "the child's permit did not come back within 5 s"
        time.sleep(0.05)
    assert srv.max_live == 2, "the server held %d at once, want at most 2" % srv.max_live
    a.call("close(%d, %d)" % tuple(fds))
    shim.wait("p", "in_use", 0, timeout=3)
    assert a.finish() == 0
    assert b.finish() == 0
