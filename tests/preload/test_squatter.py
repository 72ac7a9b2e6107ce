"""test_squatter.py - a segment name that a stranger made first decides nothing.

/dev/shm is open to every user: anybody can create /dev/shm/bulkshim.NAME
before the service does. Such an object is never used. Root sets the
segment up anew when no process maps the stranger's object; otherwise the
library says who made it and how to fix it, and `bulkshim run` does not
start a program that would run without limits. The witness is the
server's own count of live connections.
"""

import os
import shutil
import subprocess
import time

import harness
from harness import CLI, PY, Server, config_text, new_segment, shim_env, shim_lines
from harness_hard import as_nobody, is_root, nobody, readable_by_all, shared_dir

SHM = "/dev/shm/bulkshim."

HOLD3 = ("import socket,sys\nh=[]\nfor _ in range(3):\n"
         "    try: h.append(socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5))\n"
         "    except OSError: pass\nprint(len(h))\n")


def _need_root():
    assert is_root(), "this test makes files as nobody in /dev/shm: run it as root"
    assert readable_by_all(harness.LIB), "%s must be readable by every user" % harness.LIB


def _setup(extra=""):
    srv = Server()
    seg = new_segment()
    d = shared_dir()
    config = os.path.join(d, "web.cfg")
    with open(config, "w") as f:
        f.write(config_text([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                              "max_connections": 2}], seg, extra))
    os.chmod(config, 0o644)
    probe = os.path.join(d, "hold3.py")
    with open(probe, "w") as f:
        f.write(HOLD3)
    os.chmod(probe, 0o644)
    return srv, seg, config, probe


def _squat(seg, hold=False):
    """nobody creates the segment's name (100 KiB of zeros); with hold, a process of
    nobody keeps it mapped. Returns that process or None."""
    code = ("import mmap,os,sys,time\nfd=os.open(%r, os.O_RDWR|os.O_CREAT|os.O_EXCL, 0o666)\n"
            "os.ftruncate(fd, 102400)\n" % (SHM + seg))
    if hold:
        code += "m=mmap.mmap(fd, 102400)\nprint('held', flush=True)\ntime.sleep(60)\n"
    argv, env = as_nobody([PY, "-c", code])
    if not hold:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        harness.defer(harness._unlink, SHM + seg)
        return None
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    harness.defer(p.kill)
    harness.defer(harness._unlink, SHM + seg)
    assert p.stdout.readline().strip() == "held", p.stderr.read()
    assert os.stat(SHM + seg).st_uid == nobody()[0]
    return p


def _hold3(env, srv, probe):
    r = subprocess.run([PY, probe, str(srv.port)], env=env, capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 0, r.stderr
    return int(r.stdout), shim_lines(r.stderr)


def test_root_replaces_a_squatted_name_nobody_maps():
    """nobody made the name first and left: root's program removes it, sets the segment up
    and is limited (2 of 3), in strict mode too; one line says so."""
    _need_root()
    for strict in (None, "1"):
        srv, seg, config, probe = _setup()
        _squat(seg)
        n, lines = _hold3(shim_env(config, strict=strict), srv, probe)
        assert n == 2, "root's program held %d of 3 with a limit of 2: %s" % (n, lines)
        said = [l for l in lines if "belonged to uid %d" % nobody()[0] in l]
        assert len(said) == 1 and "removed" in said[0], lines
        assert os.stat(SHM + seg).st_uid == 0


def test_a_squatted_name_that_is_mapped_is_not_used_and_run_refuses():
    """nobody keeps its object mapped: root's library does not use it, names the pid and the
    fix in one line, and `bulkshim run` exits 78 with the fix instead of starting."""
    _need_root()
    srv, seg, config, probe = _setup()
    squatter = _squat(seg, hold=True)
    n, lines = _hold3(shim_env(config), srv, probe)
    said = [l for l in lines if "belongs to uid %d" % nobody()[0] in l]
    assert len(said) == 1, lines
    assert "pid %d" % squatter.pid in said[0] or "maps it" in said[0], said[0]
    assert "bulkshim rm --force %s" % seg in said[0] and "running without limits" in said[0], said
    marker = os.path.join(shared_dir(), "ran")
    r = subprocess.run([CLI, "run", "-c", config, "--", "touch", marker], capture_output=True,
                       text=True, timeout=20, env=harness.clean_env())
    assert r.returncode == 78, "run exited %d: %s" % (r.returncode, r.stderr)
    assert not os.path.exists(marker), "run started the program"
    assert "belongs to uid %d" % nobody()[0] in r.stderr and "remove it as root" in r.stderr, \
        r.stderr
    assert os.stat(SHM + seg).st_uid == nobody()[0], "the mapped object was removed"


def test_an_unprivileged_service_does_not_use_a_strangers_segment():
    """A service running as nobody finds the name owned by another user: the library logs
    one line with the fix and `run` exits 78."""
    _need_root()
    srv, seg, config, probe = _setup()
    with open(SHM + seg, "wb") as f:
        f.write(b"\0" * 102400)
    harness.defer(harness._unlink, SHM + seg)
    os.chown(SHM + seg, 12345, 12345)
    argv, env = as_nobody([PY, probe, str(srv.port)], shim_env(config))
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)
    said = [l for l in shim_lines(r.stderr) if "belongs to uid 12345" in l]
    assert r.returncode == 0 and len(said) == 1 and "set owner" in said[0], r.stderr
    argv, env = as_nobody([CLI, "run", "-c", config, "--", "true"])
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20)
    assert r.returncode == 78 and "belongs to uid 12345" in r.stderr, (r.returncode, r.stderr)
