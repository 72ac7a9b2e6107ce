"""test_privdrop.py - a root master that drops privileges (Apache, nginx, PHP-FPM) keeps counting."""

import os
import pwd
import stat

from harness import PY, SHM_PREFIX, Server, Shim, Skip, run_py, shim_lines, tmpdir

# Run as root under the shim: the master takes one permit, forks a worker
# that becomes nobody and takes the second (the limit is 2), is refused a
# third, closes one and execs a fresh interpreter as nobody, which attaches
# the segment by name (owned by nobody, mode 0600) and must be counted too.
MASTER = r"""
import os, pwd, socket, sys
port = int(sys.argv[1]); py = sys.argv[2]
nobody = pwd.getpwnam("nobody")

def attempt():
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        return s
    except OSError as e:
        s.close()
        return e.errno

held = attempt()
assert isinstance(held, socket.socket), "master refused: %r" % held
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    os.setgroups([]); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid)
    mine = attempt()
    third = attempt()
    out = "worker:%s:%s;" % (isinstance(mine, socket.socket), third)
    mine.close()
    # The new image runs as nobody: it opens the segment by name.
    os.dup2(w, 1)
    code = ("import socket, sys\n"
            "def attempt():\n"
            "    s = socket.socket()\n"
            "    try:\n"
            "        s.connect(('127.0.0.1', %d)); return s\n"
            "    except OSError as e:\n"
            "        s.close(); return e.errno\n"
            "a = attempt(); b = attempt()\n"
            "sys.stdout.write('%s' + 'exec:%%s:%%s' %% (hasattr(a, 'fileno'), b))\n" % (port, out))
    os.execv(py, [py, "-c", code])
os.close(w)
got = b""
while True:
    chunk = os.read(r, 4096)
    if not chunk:
        break
    got += chunk
_, st = os.waitpid(pid, 0)
print(got.decode(), "status:%d" % st)
"""


def test_root_master_dropping_privileges_keeps_counting():
    if os.geteuid() != 0:
        raise Skip("needs root to drop privileges")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        raise Skip("no user nobody")
    srv = Server()
    shim = Shim([{"name": "backend", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 2}], extra='owner = "nobody"; mode = "0600";')
    # The worker's new image reads the config as nobody.
    os.chmod(tmpdir(), 0o755)
    os.chmod(shim.config, 0o644)
    r = run_py(MASTER, shim.env(), args=(str(srv.port), PY))
    assert r.returncode == 0, "master failed (%d): %s" % (r.returncode, r.stderr)
    out = r.stdout.strip()
    # ECONNREFUSED is 111 on Linux.
    assert "worker:True:111;" in out, "the worker after setuid was not counted: %r (stderr %r)" % (
        out, r.stderr)
    assert "exec:True:111" in out, "the exec'd worker (nobody) was not counted: %r (stderr %r)" % (
        out, r.stderr)
    assert "status:0" in out, out
    assert not any("without limits" in l for l in shim_lines(r.stderr)), r.stderr
    st = os.stat(SHM_PREFIX + shim.segment)
    assert st.st_uid == nobody.pw_uid, "segment owned by uid %d, want nobody" % st.st_uid
    assert stat.S_IMODE(st.st_mode) == 0o600, "segment mode %o, want 600" % stat.S_IMODE(st.st_mode)
    shim.wait("backend", "in_use", 0)
    srv.stop()
