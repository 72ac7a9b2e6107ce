"""test_remove_attached.py - `bulkshim rm` and `prune` keep a segment that anything still uses:
processes attached that hold no permit at the moment, and a kernel engine pinned for it.

A segment removed under processes that have it mapped splits the count: they go on counting
in the removed copy while the next process makes a fresh one, and each copy admits the
limit. The witness is a loopback server counting its own live connections.
"""

import fcntl
import os
import signal
import subprocess

import harness
from harness import PY, Server, new_segment, shim_env, wait_until
from harness_cli import cli, cli_ok, config_file, web_comp

LIMIT = 2


def _shm(seg):
    return harness.SHM_PREFIX + seg


class Idle:
    """A process attached to config's segment that holds nothing until told
    to connect: each line "N" on its stdin makes N connections to port (kept
    open), and it answers with how many succeeded."""

    CODE = ("import socket,sys\nheld=[]\nprint('up',flush=True)\n"
            "for line in sys.stdin:\n"
            "    ok=0\n"
            "    for _ in range(int(line)):\n"
            "        try:\n"
            "            held.append(socket.create_connection(('127.0.0.1',%d))); ok+=1\n"
            "        except OSError: pass\n"
            "    print(ok,flush=True)\n")

    def __init__(self, config, port, wait=True):
        self.p = subprocess.Popen([PY, "-c", self.CODE % port], env=shim_env(config),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        harness.defer(self.stop)
        if wait:
            self.up()

    def up(self):
        """Waits until it has started (and attached)."""
        assert self.p.stdout.readline().strip() == "up"

    def connect(self, n):
        self.p.stdin.write("%d\n" % n)
        self.p.stdin.flush()
        return int(self.p.stdout.readline())

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


def _after_removal(srv, config, old):
    """What a removal did: a new process takes what it may, then the old
    attached ones try too; returns the most the witness held at once."""
    new = Idle(config, srv.port)
    held = new.connect(LIMIT)
    for p in old:
        held += p.connect(LIMIT)
    srv.wait_live(held, timeout=20)
    return srv.max_live


def test_rm_keeps_a_segment_idle_processes_are_attached_to():
    """rm without --force refuses a segment whose attached processes hold nothing now,
    and the limit holds at the witness for them and a process started afterwards."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    old = [Idle(config, srv.port) for _ in range(2)]
    r = cli("rm", seg)
    most = _after_removal(srv, config, old)
    assert most <= LIMIT, "witness held %d connections against a limit of %d after rm " \
        "(exit %d: %s%s)" % (most, LIMIT, r.returncode, r.stdout, r.stderr)
    assert r.returncode == 1 and os.path.exists(_shm(seg)), (r.stdout, r.stderr)
    assert "holds no permits but is in use (attached by 2 processes" in r.stderr, r.stderr
    assert all("pid %d (python" % p.p.pid in r.stderr for p in old), r.stderr
    assert "--force removes it" in r.stderr, r.stderr


def test_prune_keeps_a_segment_idle_processes_are_attached_to():
    """prune keeps an old segment nobody holds permits in while processes have it
    attached, and says so; the limit holds at the witness afterwards."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    old = [Idle(config, srv.port) for _ in range(2)]
    r = cli("prune", "--older-than", "0", seg)
    most = _after_removal(srv, config, old)
    assert most <= LIMIT, "witness held %d connections against a limit of %d after prune " \
        "(%s)" % (most, LIMIT, r.stdout)
    assert r.returncode == 0 and os.path.exists(_shm(seg)), (r.stdout, r.stderr)
    assert "kept segment %s" % seg in r.stdout and "attached by 2 processes" in r.stdout, r.stdout
    assert "removed 0 segments; kept 1" in r.stdout, r.stdout


def test_a_dead_attacher_does_not_keep_a_segment():
    """A process killed while attached (reaped or still a zombie) no longer keeps its
    segment from prune: only live mappings count."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    a = Idle(config, srv.port)
    out = cli_ok("prune", "--older-than", "0", seg)
    assert "kept segment %s" % seg in out and os.path.exists(_shm(seg)), out
    # Killed and not reaped: its pid is still there, as a zombie.
    os.kill(a.p.pid, signal.SIGKILL)
    wait_until(lambda: open("/proc/%d/stat" % a.p.pid).read().split(")")[1].split()[0] == "Z",
               5, what="a zombie")
    out = cli_ok("prune", "--older-than", "0", seg)
    assert "removed segment %s" % seg in out and not os.path.exists(_shm(seg)), out
    a.stop()
    # One that is reaped, likewise.
    b = Idle(config, srv.port)
    assert "kept segment" in cli_ok("prune", "--older-than", "0", seg)
    b.stop()
    out = cli_ok("prune", "--older-than", "0", seg)
    assert "removed segment %s" % seg in out and not os.path.exists(_shm(seg)), out


def test_force_removes_an_attached_segment_and_says_what_it_breaks():
    """rm --force and prune --force remove an attached segment, naming who is attached
    and what the removal breaks."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    a = Idle(config, srv.port)
    r = cli("rm", "--force", seg)
    assert r.returncode == 0 and not os.path.exists(_shm(seg)), (r.stdout, r.stderr)
    assert "in use: --force" in r.stdout and "pid %d (python" % a.p.pid in r.stdout, r.stdout
    assert "go on counting in the removed copy" in r.stdout, r.stdout
    a.stop()
    b = Idle(config, srv.port)
    out = cli_ok("prune", "--older-than", "0", "--force", seg)
    assert "removed segment %s" % seg in out and not os.path.exists(_shm(seg)), out
    assert "pid %d (python" % b.p.pid in out and "removed copy" in out, out


def test_rm_and_prune_keep_a_segment_a_kernel_engine_uses():
    """A segment that only a kernel engine uses (no process maps it) is kept by rm and
    prune; --force removes it and says that the engine stays attached."""
    can = subprocess.run(["sh", os.path.join(harness.ROOT, "tests", "kernel", "can_load.sh")],
                         capture_output=True, text=True)
    if can.returncode != 0:
        raise harness.Skip(can.stdout.strip())
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    with open("/proc/self/mounts") as f:
        mnt = [l.split()[1] for l in f if len(l.split()) > 2 and l.split()[2] == "cgroup2"][0]
    cg = os.path.join(mnt, harness.unique("bsrm"))
    os.mkdir(cg)
    harness.defer(lambda: os.path.isdir(cg) and os.rmdir(cg))
    harness.defer(lambda: cli("detach", "-c", config))
    r = cli("attach", "-c", config, "--cgroup", cg)
    if r.returncode != 0:
        raise harness.Skip("the kernel engine does not load here: %s" % r.stderr.strip())
    r = cli("rm", seg)
    assert r.returncode == 1 and os.path.exists(_shm(seg)), (r.stdout, r.stderr)
    assert "used by the kernel engine attached to 1 cgroup" in r.stderr, r.stderr
    assert "bulkshim detach -s %s" % seg in r.stderr, r.stderr
    out = cli_ok("prune", "--older-than", "0", seg)
    assert "kept segment %s" % seg in out and os.path.exists(_shm(seg)), out
    out = cli_ok("rm", "--force", seg)
    assert not os.path.exists(_shm(seg)) and "kernel engine stays attached" in out, out


F_SETLEASE, F_WRLCK, F_UNLCK = 1024, 1, 2


def test_a_program_starting_during_the_removal_makes_a_fresh_segment():
    """A program that opens the segment while rm holds its lease and removes it never
    counts in the removed object: it makes a fresh segment, and the limit holds at the
    witness for it and a process started afterwards."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, LIMIT)])
    r = harness.run([PY, "-c", "pass"], shim_env(config))
    assert r.returncode == 0 and os.path.exists(_shm(seg)), r.stderr
    # What rm does: a write lease on an object nobody maps, held across the unlink.
    old = signal.signal(signal.SIGIO, signal.SIG_IGN)
    fd = os.open(_shm(seg), os.O_RDONLY | os.O_NONBLOCK)
    try:
        fcntl.fcntl(fd, F_SETLEASE, F_WRLCK)
        a = Idle(config, srv.port, wait=False)
        # Its open meets the lease (and breaks it) before the name goes.
        wait_until(lambda: "BREAK" in open("/proc/locks").read() or a.p.poll() is not None,
                   30, what="the lease broken")
        os.unlink(_shm(seg))
    finally:
        fcntl.fcntl(fd, F_SETLEASE, F_UNLCK)
        os.close(fd)
        signal.signal(signal.SIGIO, old)
    a.up()
    with open("/proc/%d/maps" % a.p.pid) as f:
        mapped = [line.strip() for line in f if ("bulkshim." + seg) in line]
    b = Idle(config, srv.port)
    srv.wait_live(b.connect(LIMIT) + a.connect(LIMIT), timeout=20)
    assert srv.max_live <= LIMIT, "witness held %d connections against a limit of %d " \
        "(the starting program maps %s)" % (srv.max_live, LIMIT, mapped)
    assert mapped and not any("(deleted)" in m for m in mapped), mapped
