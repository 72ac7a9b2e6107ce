"""test_permissions.py - segment ownership and modes, other users, secure execution, long inputs.

Tests that run a program as another user (nobody, with setpriv) need root;
the suite runs as root in CI. Their configs live in a directory every user
can read.
"""

import os
import re
import stat
import time

import harness
from harness import (CLI, PY, Server, clean_env, config_text, new_segment, run, shim_lines,
                     status_json, unique)
from harness_hard import (as_nobody, c_program, env_for, is_root, nobody, probe, readable_by_all,
                          shared_dir)

SHM = "/dev/shm/bulkshim."


def _need_root():
    assert is_root(), "this test creates other users' files and runs as nobody: run it as root"
    assert readable_by_all(harness.LIB), \
        "%s must be readable by every user for the tests that run as nobody" % harness.LIB


def _config(srv, limit=2, extra="", segment=None, where=None):
    """A config for compartment "web" -> srv, in a directory all users read."""
    segment = segment or new_segment()
    path = os.path.join(where or shared_dir(), unique("cfg") + ".cfg")
    with open(path, "w") as f:
        f.write(config_text([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                              "max_connections": limit}], segment, extra))
    os.chmod(path, 0o644)
    return path, segment


def _create(config):
    """Runs the shim once so that it creates the segment."""
    got, r = probe(env_for(config), 1, 0)
    assert r.returncode == 0 and not shim_lines(r.stderr), "the shim did not start: %r" % r.stderr


def _inert_line(lines, segment, why):
    # The lines that name the fix (test_operator.py checks them) follow it.
    lines = [l for l in lines if ": fix: " not in l]
    path = SHM + segment
    assert len(lines) == 1 and path in lines[0] and why in lines[0] and \
        "running without limits" in lines[0], \
        "want one line naming %s, saying %r and 'running without limits': %r" % (path, why, lines)


# ---- the mode and owner of a new segment ----

def test_new_segment_gets_mode_0600_by_default():
    srv = Server()
    config, segment = _config(srv)
    old = os.umask(0)
    try:
        _create(config)
    finally:
        os.umask(old)
    st = os.stat(SHM + segment)
    assert stat.S_IMODE(st.st_mode) == 0o600, "mode %o, want 0600" % stat.S_IMODE(st.st_mode)
    assert st.st_uid == os.geteuid(), "owner %d, want %d" % (st.st_uid, os.geteuid())


def test_new_segment_gets_the_configured_mode_whatever_the_umask():
    srv = Server()
    config, segment = _config(srv, extra='mode = "0640";')
    old = os.umask(0o077)
    try:
        _create(config)
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(SHM + segment).st_mode)
    assert mode == 0o640, "mode %o, want 0640" % mode


# ---- another user ----

def test_another_user_cannot_attach_and_runs_unlimited_with_a_message():
    _need_root()
    srv = Server()
    config, segment = _config(srv, limit=1)
    _create(config)
    env = env_for(config)
    r = run(*as_nobody([PY, "-c", "import socket,sys; p=int(sys.argv[1]); "
                                  "h=[socket.create_connection(('127.0.0.1',p)) for _ in range(3)]; "
                                  "print(len(h))", str(srv.port)], env))
    assert r.returncode == 0 and r.stdout.strip() == "3", \
        "nobody's three connects should all go through (shim inert): %r %r" % (r.stdout, r.stderr)
    _inert_line(shim_lines(r.stderr), segment, "Permission denied")
    web = status_json(segment)["compartments"][0]
    assert web["admitted"] == 0 and web["in_use"] == 0, "nobody changed the segment: %r" % web


def test_another_user_cannot_read_the_status():
    _need_root()
    srv = Server()
    config, segment = _config(srv)
    _create(config)
    r = run(*as_nobody([CLI, "status", "-s", segment]))
    assert r.returncode != 0, "nobody read a 0600 segment: %r" % r.stdout
    assert segment in r.stderr and "Permission denied" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, "want one clear line: %r" % r.stderr


def test_another_user_may_read_but_not_change_a_0644_segment():
    _need_root()
    srv = Server()
    config, segment = _config(srv, extra='mode = "0644";')
    _create(config)
    r = run(*as_nobody([CLI, "status", "-s", segment, "--json"]))
    assert r.returncode == 0, "nobody cannot read a 0644 segment: %r" % r.stderr
    for argv in (["set", "-s", segment, "web", "max_connections", "9"],
                 ["reset", "-s", segment],
                 ["reset", "-s", segment, "web"],
                 ["reload", "-c", config, "-s", segment]):
        r = run(*as_nobody([CLI] + argv))
        assert r.returncode != 0, "nobody ran `bulkshim %s`: %r" % (" ".join(argv), r.stdout)
        err = r.stderr.strip()
        assert "permission denied" in err.lower() and segment in err and len(err.splitlines()) == 1, \
            "`bulkshim %s` as nobody should fail with one clear line: %r" % (" ".join(argv), err)
    web = status_json(segment)["compartments"][0]
    assert web["limit"] == 2, "the limit changed to %r" % web["limit"]
    # nobody's own shim cannot attach it for writing either.
    got, r = probe(env_for(config), srv.port, 3)
    assert got == ["ok", "ok", "ECONNREFUSED"], "root's own run: %r" % got
    r = run(*as_nobody([PY, "-c", "import socket,sys; socket.create_connection(('127.0.0.1',"
                                  "int(sys.argv[1])))", str(srv.port)], env_for(config)))
    _inert_line(shim_lines(r.stderr), segment, "Permission denied")


# ---- what is already at the segment's name ----

def _victim():
    """A file of another user with known contents; returns (path, contents)."""
    uid, gid = nobody()
    d = shared_dir()
    path = os.path.join(d, "victim")
    data = b"precious data of another user\n"
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, uid, gid)
    os.chmod(path, 0o666)
    return path, data


def _planted(kind):
    """A segment name with something other than a segment at it."""
    srv = Server()
    segment = new_segment()
    config, _ = _config(srv, segment=segment)
    path = SHM + segment
    target = None
    if kind == "symlink":
        target = _victim()
        os.symlink(target[0], path)
    elif kind == "directory":
        os.mkdir(path)
        harness.defer(os.rmdir, path)
    elif kind == "fifo":
        os.mkfifo(path)
    return srv, config, segment, target


def _refused(srv, config, segment, why):
    got, r = probe(env_for(config), srv.port, 3)
    assert got == ["ok"] * 3, "the shim should be inert: %r (%r)" % (got, r.stderr)
    _inert_line(shim_lines(r.stderr), segment, why)
    s = run([CLI, "status", "-s", segment], clean_env())
    assert s.returncode != 0 and segment in s.stderr, "status accepted it: %r %r" % (s.stdout, s.stderr)


def test_symlink_at_the_segment_name_is_never_followed():
    srv, config, segment, (victim, data) = _planted("symlink")
    before = os.stat(victim)
    _refused(srv, config, segment, "is a symbolic link; not followed")
    with open(victim, "rb") as f:
        assert f.read() == data, "the symlink's target was changed"
    after = os.stat(victim)
    assert (after.st_size, after.st_mode, after.st_uid) == \
        (before.st_size, before.st_mode, before.st_uid), "the target's size, mode or owner changed"
    assert os.path.islink(SHM + segment), "the symlink was replaced"


def test_directory_at_the_segment_name_is_refused():
    srv, config, segment, _ = _planted("directory")
    _refused(srv, config, segment, "is a directory, not a shared-memory object")


def test_fifo_at_the_segment_name_is_refused_without_blocking():
    srv, config, segment, _ = _planted("fifo")
    t0 = time.monotonic()
    _refused(srv, config, segment, "not a regular shared-memory object")
    assert time.monotonic() - t0 < 10
    assert stat.S_ISFIFO(os.lstat(SHM + segment).st_mode)


def test_segment_of_another_user_is_not_used():
    # nobody creates the segment first (as if to set the limits for root's
    # programs); root's shim must not use it. Nobody maps it any more, so
    # root replaces it with its own and the config's limit holds
    # (test_squatter.py has the mapped case).
    _need_root()
    srv = Server()
    config, segment = _config(srv, limit=1, extra='mode = "0666";')
    r = run(*as_nobody([PY, "-c", "pass"], env_for(config)))
    assert r.returncode == 0 and not shim_lines(r.stderr), \
        "nobody could not create the segment: %r" % r.stderr
    st = os.stat(SHM + segment)
    assert st.st_uid == nobody()[0], "the segment belongs to uid %d (%r)" % (st.st_uid, r.stderr)
    got, r = probe(env_for(config), srv.port, 3)
    assert got == ["ok", "ECONNREFUSED", "ECONNREFUSED"], "root's limit of 1: %r (%s)" % (
        got, r.stderr)
    assert os.stat(SHM + segment).st_uid == 0, "root still uses nobody's segment"
    lines = [l for l in shim_lines(r.stderr) if "belonged to uid %d" % nobody()[0] in l]
    assert len(lines) == 1 and "removed" in lines[0], r.stderr


# ---- secure execution ----

SECURE_SRC = r'''
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/socket.h>
#include <unistd.h>

/* Prints AT_SECURE, then "ok" or the errno name of each of N connects. */
int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int n = argc > 2 ? atoi(argv[2]) : 0;

	a.sin_port = htons((unsigned short)atoi(argv[1]));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	printf("secure=%lu", getauxval(AT_SECURE));
	for (int i = 0; i < n; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		printf(" %s", connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 ? "ok" :
		    errno == ECONNREFUSED ? "ECONNREFUSED" : strerror(errno));
	}
	printf("\n");
	return 0;
}
'''


def test_secure_execution_ignores_bulkshim_variables():
    # The loader drops LD_PRELOAD for a setgid program, so the shim is
    # linked in instead (an absolute DT_NEEDED, which secure execution
    # still loads): the same binary limits connects when run normally and
    # ignores BULKSHIM_CONFIG and BULKSHIM_LOG once it is setgid.
    _need_root()
    srv = Server()
    config, segment = _config(srv, limit=1)
    exe = c_program(SECURE_SRC, "secure", [harness.LIB])
    os.chmod(os.path.dirname(exe), 0o755)
    env = clean_env()
    env["BULKSHIM_CONFIG"] = config
    env["BULKSHIM_LOG"] = "debug"
    r = run([exe, str(srv.port), "2"], env)
    assert r.stdout.split() == ["secure=0", "ok", "ECONNREFUSED"], \
        "linked in and not secure, the shim should limit to 1: %r %r" % (r.stdout, r.stderr)
    os.unlink(SHM + segment)
    os.chown(exe, 0, nobody()[1])
    os.chmod(exe, 0o2755)
    r = run([exe, str(srv.port), "2"], env)
    assert r.stdout.split() == ["secure=1", "ok", "ok"], \
        "in secure execution BULKSHIM_CONFIG must be ignored: %r %r" % (r.stdout, r.stderr)
    assert not shim_lines(r.stderr), "the shim spoke in secure execution: %r" % r.stderr
    assert not os.path.exists(SHM + segment), "the segment of BULKSHIM_CONFIG was created"


# ---- long inputs ----

def _load(text):
    """Writes a config, runs `bulkshim check` and python under the shim on
    it; returns (check result, python result)."""
    path = os.path.join(shared_dir(), unique("long") + ".cfg")
    with open(path, "w") as f:
        f.write(text)
    check = run([CLI, "check", path], clean_env(), timeout=60)
    py = run([PY, "-c", "pass"], env_for(path), timeout=60)
    assert py.returncode == 0, "python under the shim exited %d: %r" % (py.returncode, py.stderr[-500:])
    return check, py


# An error about a long input says how long it was and what the maximum is.
TOO_LONG = r"\b\d{4} (bytes|characters)\b.*\b(longer|more) than \d+"


def _refused_clearly(text, pattern=TOO_LONG):
    check, py = _load(text)
    assert check.returncode != 0, "bulkshim check accepted it"
    lines = shim_lines(py.stderr)
    assert len(lines) == 1 and "running without limits" in lines[0], lines
    for said in (check.stderr, lines[0]):
        assert re.search(pattern, said), "want /%s/ in %r" % (pattern, said)
    assert len(lines[0]) < 1100, "an overlong line: %d characters" % len(lines[0])


def test_4000_character_unix_path_is_refused_clearly():
    path = "unix:/" + "p" * 4000
    _refused_clearly('compartments = ( { name = "u"; destinations = [ "%s" ]; '
                     'max_connections = 1; } );\n' % path)


def test_4000_character_host_name_is_refused_clearly():
    host = ".".join(["h" * 60] * 66)[:4000] + ":80"
    _refused_clearly('compartments = ( { name = "h"; destinations = [ "%s" ]; '
                     'max_connections = 1; } );\n' % host)


def test_overlong_compartment_and_segment_names_are_refused_clearly():
    _refused_clearly('compartments = ( { name = "%s"; destinations = [ "127.0.0.1:1" ]; '
                     'max_connections = 1; } );\n' % ("n" * 4000))
    _refused_clearly('segment = "%s";\ncompartments = ( { name = "a"; destinations = '
                     '[ "127.0.0.1:1" ]; max_connections = 1; } );\n' % ("s" * 4000))


def test_overlong_config_path_is_refused_clearly():
    path = "/tmp/" + "d" * 5000 + ".cfg"
    r = run([PY, "-c", "pass"], env_for(path))
    lines = shim_lines(r.stderr)
    assert r.returncode == 0 and len(lines) == 1, "want one line: %r" % r.stderr
    # The reason must survive: a line that starts with 5,000 characters of
    # path is cut before it says what is wrong.
    assert "too long" in lines[0] and "running without limits" in lines[0], \
        "the reason was cut off: ...%r" % lines[0][-200:]


def test_ten_thousand_destinations_work():
    srv = Server()
    segment = new_segment()
    dests = ["10.%d.%d.%d:80" % (i >> 16, (i >> 8) & 255, i & 255) for i in range(9999)]
    dests.append("127.0.0.1:%d" % srv.port)
    text = config_text([{"name": "many", "destinations": dests, "max_connections": 1}], segment)
    check, py = _load(text)
    assert check.returncode == 0, "bulkshim check refused 10,000 destinations: %r" % check.stderr
    path = os.path.join(shared_dir(), unique("many") + ".cfg")
    with open(path, "w") as f:
        f.write(text)
    t0 = time.monotonic()
    got, r = probe(env_for(path), srv.port, 2)
    assert got == ["ok", "ECONNREFUSED"], "the 10,000th destination is not limited: %r %r" % (
        got, r.stderr[-500:])
    assert time.monotonic() - t0 < 10, "start-up with 10,000 destinations took too long"


def test_thousand_compartments_work_and_1025_are_refused():
    srv = Server()
    segment = new_segment()
    comps = [{"name": "c%d" % i, "destinations": ["10.0.%d.%d:80" % (i >> 8, i & 255)],
              "max_connections": 1} for i in range(999)]
    comps.append({"name": "last", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 1})
    text = config_text(comps, segment)
    path = os.path.join(shared_dir(), unique("thousand") + ".cfg")
    with open(path, "w") as f:
        f.write(text)
    got, r = probe(env_for(path), srv.port, 2)
    assert got == ["ok", "ECONNREFUSED"], "the 1,000th compartment is not limited: %r %r" % (
        got, r.stderr[-500:])
    names = [c["name"] for c in status_json(segment)["compartments"]]
    assert len(names) == 1000 and names[-1] == "last", "status shows %d compartments" % len(names)
    more = comps + [{"name": "c%d" % i, "destinations": ["10.9.%d.%d:80" % (i >> 8, i & 255)],
                     "max_connections": 1} for i in range(1000, 1025)]
    _refused_clearly(config_text(more, new_segment()), r"1025 compartments, more than .*1024")
