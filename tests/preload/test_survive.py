"""test_survive.py - the program outlives its segment: truncated under it, or no room to make it.

A mapped segment that shrinks raises SIGBUS at the next access in every
process that maps it; a tmpfs too small for a new segment did the same at
its first write. The library catches the fault of its own mapping, puts
zero pages in its place and runs on without limits, saying so once; the
program's own SIGBUS handling keeps working. The witness of "limits off"
is the server's own count of live connections.
"""

import os
import shlex
import shutil
import subprocess
import time

import harness
from harness import PY, Server, config_text, new_segment, shim_env, shim_lines, write_file
from harness_hard import as_nobody, c_program, is_root, readable_by_all, shared_dir

SHM = "/dev/shm/bulkshim."
SHRANK = "shrank under this process"

# Two threads connect and close in a loop until stdin says "go"; then three
# connections are held at once (a limit of 2 would refuse the third).
LOOPER = r'''
import socket, sys, threading
port = int(sys.argv[1])
stop = threading.Event()
counts = [0, 0]
def loop(i):
    while not stop.is_set():
        try:
            socket.create_connection(("127.0.0.1", port), 5).close()
            counts[i] += 1
        except OSError:
            pass
def hold3():
    held = []
    for _ in range(3):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), 5))
        except OSError:
            pass
    return held
held = hold3()
before = len(held)
for s in held:
    s.close()
ts = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
for t in ts:
    t.start()
print("ready %d" % before, flush=True)
sys.stdin.readline()
stop.set()
for t in ts:
    t.join()
held = hold3()
print("after %d loops %d" % (len(held), sum(counts)), flush=True)
sys.stdin.readline()
'''


def _looper():
    path = os.path.join(shared_dir(), "looper.py")
    with open(path, "w") as f:
        f.write(LOOPER)
    os.chmod(path, 0o644)
    return path


def _config(srv, extra=""):
    seg = new_segment()
    path = os.path.join(shared_dir(), "web.cfg")
    with open(path, "w") as f:
        f.write(config_text([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                              "max_connections": 2}], seg, extra))
    os.chmod(path, 0o644)
    return path, seg


def _truncate_under(srv, config, seg, size, truncate_argv, py_flags=()):
    """Runs LOOPER under the shim, truncates the segment to size while its
    threads loop, and checks that it lives on with its limits off."""
    p = subprocess.Popen([PY] + list(py_flags) + [_looper(), str(srv.port)],
                         env=shim_env(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    harness.defer(p.kill)
    first = p.stdout.readline().split()
    assert first == ["ready", "2"], "before: %r (stderr %s)" % (first, p.stderr.read()[-2000:]
                                                                if p.poll() is not None else "")
    time.sleep(0.3)
    r = subprocess.run(truncate_argv + ["-s", str(size), SHM + seg], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    time.sleep(0.3)
    p.stdin.write("go\n")
    p.stdin.flush()
    after = p.stdout.readline().split()
    assert after[:2] == ["after", "3"] and int(after[3]) > 0, \
        "after truncation to %d: %r, stderr %s" % (size, after, p.stderr.read()[-2000:]
                                                    if p.poll() is not None else "")
    harness.wait_until(lambda: srv.live == 3, 5, what="the server to see 3 live connections")
    p.stdin.write("\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=20)
    assert p.returncode == 0, "exited %d after truncation to %d: %s" % (p.returncode, size, err)
    lines = [line for line in shim_lines(err) if SHRANK in line]
    assert len(lines) == 1, "want one line saying the segment shrank, got: %s" % err
    assert "/dev/shm/bulkshim.%s" % seg in lines[0], lines[0]
    return err


def test_a_live_segment_truncated_to_0_or_4096_ends_no_process():
    """truncate -s 0 and -s 4096 of a mapped segment while two threads connect in a loop:
    rc 0, one line, the limits off (the server holds 3 with a limit of 2)."""
    truncate = [shutil.which("truncate")]
    for size in (0, 4096):
        srv = Server()
        config, seg = _config(srv)
        _truncate_under(srv, config, seg, size, truncate)
        srv.stop()


def test_a_truncation_by_the_segments_unprivileged_owner_ends_no_root_process():
    """A server started as root with `owner` set: the owner, unprivileged, truncates the
    segment; the root process lives on."""
    assert is_root(), "this test truncates as nobody a segment root maps: run it as root"
    assert readable_by_all(harness.LIB), "%s must be readable by every user" % harness.LIB
    srv = Server()
    config, seg = _config(srv, 'owner = "nobody"; mode = "0600";')
    argv, _ = as_nobody([shutil.which("truncate")])
    _truncate_under(srv, config, seg, 0, argv)


def test_a_program_with_faulthandler_survives_a_truncation():
    """python3 -X faulthandler installs its own SIGBUS handler after the library's: the
    library's stays first, and a truncated segment still ends nothing."""
    srv = Server()
    config, seg = _config(srv)
    _truncate_under(srv, config, seg, 0, [shutil.which("truncate")], py_flags=["-X", "faulthandler"])


OWN_SIGBUS = r'''
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static sigjmp_buf back;
static volatile sig_atomic_t plain;

static void on_info(int sig, siginfo_t *si, void *uc) { (void)uc; (void)si; siglongjmp(back, sig); }
static void on_plain(int sig) { (void)sig; plain++; }

int main(int argc, char **argv)
{
	struct sigaction sa, q;
	char path[] = "/tmp/bulkshim-ownbus-XXXXXX";
	int fd = mkstemp(path);
	volatile char *p;

	(void)argc;
	unlink(path);
	if (fd < 0 || ftruncate(fd, 8192) < 0)
		return 2;
	p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return 2;
	p[0] = 1;
	if (ftruncate(fd, 0) < 0)
		return 2;
	/* 1. A handler of its own catches a fault in its own mapping. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_info;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	if (sigsetjmp(back, 1) == 0) {
		p[0] = 2;
		puts("no fault");
	} else {
		puts("own handler caught its fault");
	}
	sigaction(SIGBUS, NULL, &q);
	printf("sigaction reports %s\n", (q.sa_flags & SA_SIGINFO) && q.sa_sigaction == on_info ?
	    "its handler" : "another");
	/* 1b. act and old may be one struct. */
	memset(&q, 0, sizeof(q));
	q.sa_handler = on_plain;
	sigaction(SIGBUS, &q, &q);
	printf("swap returned %s\n", (q.sa_flags & SA_SIGINFO) && q.sa_sigaction == on_info ?
	    "the handler before" : "another");
	sigaction(SIGBUS, NULL, &sa);
	printf("swap installed %s\n", sa.sa_handler == on_plain ? "the new one" : "another");
	sigaction(SIGBUS, &q, NULL);
	/* 2. signal() returns the handler before; a sent SIGBUS reaches it. */
	printf("signal returned %s\n", signal(SIGBUS, on_plain) == (void (*)(int))on_info ?
	    "the handler before" : "another");
	raise(SIGBUS);
	printf("plain handler ran %d\n", (int)plain);
	/* 3. SA_RESETHAND: once, then the default. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_plain;
	sa.sa_flags = SA_RESETHAND;
	sigaction(SIGBUS, &sa, NULL);
	raise(SIGBUS);
	sigaction(SIGBUS, NULL, &q);
	printf("after one %d, reset to %s\n", (int)plain, q.sa_handler == SIG_DFL ? "default" : "other");
	/* 4. A sent SIGBUS the program ignores is ignored. */
	signal(SIGBUS, SIG_IGN);
	raise(SIGBUS);
	puts("ignored");
	/* 5. The default: its own fault ends it with SIGBUS. */
	signal(SIGBUS, SIG_DFL);
	fflush(stdout);
	p[0] = 3;
	puts("still alive");
	return 0;
}
'''


def test_the_programs_own_sigbus_handling_keeps_working():
    """A program's sigaction/signal handlers, SA_RESETHAND, SIG_IGN and the default act
    as without the shim, while the library's handler guards an attached segment."""
    exe = c_program(OWN_SIGBUS, "ownbus")
    srv = Server()
    config, seg = _config(srv)
    bare = subprocess.run([exe], capture_output=True, text=True, timeout=20,
                          env=harness.clean_env())
    under = subprocess.run([exe], capture_output=True, text=True, timeout=20,
                           env=shim_env(config, log="info"))
    assert os.path.exists(SHM + seg), "the program did not attach: %s" % under.stderr
    want = ["own handler caught its fault", "sigaction reports its handler",
            "swap returned the handler before", "swap installed the new one",
            "signal returned the handler before", "plain handler ran 1", "after one 2, reset to default",
            "ignored"]
    assert bare.stdout.splitlines() == want and bare.returncode == -7, (bare.stdout,
                                                                           bare.returncode)
    assert under.stdout.splitlines() == want, "under the shim: %r (stderr %s)" % (
        under.stdout, under.stderr)
    assert under.returncode == -7, "under the shim exited %d: %s" % (under.returncode,
                                                                      under.stderr)
    assert SHRANK not in under.stderr, under.stderr


def _in_small_shm(script, kib=64):
    """Runs sh -c script in a mount namespace whose /dev/shm is a tmpfs of kib KiB."""
    assert is_root(), "this test mounts a small tmpfs on /dev/shm in a namespace: run it as root"
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed"
    inner = ("mount --make-rprivate / && mount -t tmpfs -o size=%dk tmpfs /dev/shm && %s"
             % (kib, script))
    return subprocess.run([unshare, "-m", "sh", "-c", inner], capture_output=True, text=True,
                          timeout=60)


def test_creation_in_a_tmpfs_too_small_fails_open_and_is_no_crash_loop():
    """/dev/shm of 64 KiB: the first start is rc 0 with one line naming the size needed and
    runs without limits; so is the next; an unfinished (sparse) segment left by an older
    creator is no crash loop either."""
    srv = Server()
    config, seg = _config(srv)
    env = shim_env(config)
    probe = os.path.join(shared_dir(), "three.py")
    with open(probe, "w") as f:
        f.write("import socket\nh=[]\nfor _ in range(3):\n"
                "    try: h.append(socket.create_connection(('127.0.0.1', %d), 5))\n"
                "    except OSError: pass\nprint(len(h))\n" % srv.port)
    run = "env %s %s %s" % (" ".join(shlex.quote("%s=%s" % (k, env[k])) for k in
                                     ("LD_PRELOAD", "BULKSHIM_CONFIG")), PY, probe)
    stat = "stat -c 'size %%s' %s%s" % (SHM, seg)
    r = _in_small_shm("%s; echo rc=$?; %s; echo rc=$?; %s" % (run, run, stat))
    out = r.stdout.split("\n")
    assert r.returncode == 0 and out[:4] == ["3", "rc=0", "3", "rc=0"], (r.stdout, r.stderr)
    assert "size 0" in r.stdout, "the object is not left at size 0: %s" % r.stdout
    lines = shim_lines(r.stderr)
    assert len(lines) == 2 and all("cannot reserve" in l and "KiB free" in l for l in lines), \
        r.stderr
    # A segment an older creator sized with ftruncate and died in: sparse, magic 0.
    r = _in_small_shm("truncate -s 1M %s%s && %s; echo rc=$?; %s; echo rc=$?"
                      % (SHM, seg, run, run))
    assert r.returncode == 0 and r.stdout.split("\n")[:4] == ["3", "rc=0", "3", "rc=0"], (
        r.stdout, r.stderr)
    assert "Bus error" not in r.stderr and "cannot reserve" in r.stderr, r.stderr
