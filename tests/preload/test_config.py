"""test_config.py - bad configs fail open (or exit 78 when strict); includes are read by the shim."""

import json
import os

from harness import (CONNECT_PROBE, Server, Shim, new_segment, run_py, shim_env, shim_lines, tmpdir,
                     write_file)

# Connects three times to argv[1] and keeps them; a limit of 1 would refuse two.
CONNECT3 = """
import socket, sys
port = int(sys.argv[1])
held = [socket.create_connection(('127.0.0.1', port), timeout=5) for _ in range(3)]
print('ran', len(held))
"""


def _bad_configs(port, seg):
    """(name, text, line of the error) for a few kinds of mistakes."""
    dest = '"127.0.0.1:%d"' % port
    return [
        ("syntax", 'segment = "%s";\ncompartments = (\n'
                   '  { name = "a"; destinations = [ %s ]; max_connections = ; }\n);\n' % (seg, dest), 3),
        ("zero limit", 'segment = "%s";\ncompartments = (\n  { name = "a"; destinations = [ %s ];\n'
                       '    max_connections = 0; }\n);\n' % (seg, dest), 4),
        ("bad address", 'segment = "%s";\ncompartments = (\n  { name = "a";\n    max_connections = 1;\n'
                        '    destinations = [ "127.0.0.1:99999" ]; }\n);\n' % seg, 5),
        ("unknown errno", 'segment = "%s";\ncompartments = (\n  { name = "a"; destinations = [ %s ];\n'
                          '    max_connections = 1;\n    errno = "EWHATEVER"; }\n);\n' % (seg, dest), 5),
    ]


def test_bad_config_fails_open_with_one_line_naming_file_and_line():
    srv = Server()
    seg = new_segment()
    for what, text, line in _bad_configs(srv.port, seg):
        path = write_file(text)
        r = run_py(CONNECT3, shim_env(path), args=[str(srv.port)])
        assert r.returncode == 0 and r.stdout.strip() == "ran 3", \
            "%s: the program did not run unlimited (exit %d, stdout %r, stderr %r)" % (
                what, r.returncode, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and shim_lines(r.stderr), \
            "%s: want exactly one bulkshim line on stderr, got %r" % (what, r.stderr)
        assert "%s:%d" % (path, line) in lines[0], \
            "%s: the message does not name %s:%d: %r" % (what, path, line, lines[0])
    assert not os.path.exists("/dev/shm/bulkshim." + seg), "an invalid config created its segment"


def test_bulkshim_strict_env_exits_78_on_bad_config():
    srv = Server()
    what, text, line = _bad_configs(srv.port, new_segment())[1]
    path = write_file(text)
    r = run_py(CONNECT3, shim_env(path, strict="1"), args=[str(srv.port)])
    assert r.returncode == 78, "BULKSHIM_STRICT=1 with a bad config: exit %d, want 78 (stderr %r)" % (
        r.returncode, r.stderr)
    assert "ran" not in r.stdout, "the program ran: %r" % r.stdout
    assert "%s:%d" % (path, line) in r.stderr, "no message naming %s:%d: %r" % (path, line, r.stderr)
    assert srv.accepted == 0


def test_strict_true_in_config_exits_78_on_bad_config():
    srv = Server()
    seg = new_segment()
    path = write_file('strict = true;\nsegment = "%s";\ncompartments = (\n'
                      '  { name = "a"; destinations = [ "127.0.0.1:%d" ];\n'
                      '    max_connections = -2; }\n);\n' % (seg, srv.port))
    r = run_py(CONNECT3, shim_env(path), args=[str(srv.port)])
    assert r.returncode == 78, "strict = true with a bad config: exit %d, want 78 (stderr %r)" % (
        r.returncode, r.stderr)
    assert "ran" not in r.stdout
    assert "%s:5" % path in r.stderr, "no message naming %s:5: %r" % (path, r.stderr)
    # Without strict the same mistake fails open.
    text = open(path).read().replace("strict = true;", "strict = false;")
    path2 = write_file(text)
    r = run_py(CONNECT3, shim_env(path2), args=[str(srv.port)])
    assert r.returncode == 0 and "ran 3" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_a_config_that_is_a_fifo_or_includes_one_never_stalls_the_program():
    # A FIFO nobody writes would block the read at start-up for ever: the
    # program runs unlimited after one line naming the file, or exits 78
    # when strict. The same for a FIFO that the config @includes, named at
    # the line that includes it.
    srv = Server()
    d = tmpdir()
    fifo = os.path.join(d, "svc.cfg")
    os.mkfifo(fifo)
    os.mkfifo(os.path.join(d, "comps.cfg"))
    inc = write_file('segment = "%s";\n@include "comps.cfg"\n' % new_segment())
    for path, what in ((fifo, "%s: is a FIFO, not a regular file" % fifo),
                       (inc, '%s:2: @include "comps.cfg": %s is a FIFO' % (
                           inc, os.path.join(d, "comps.cfg")))):
        r = run_py(CONNECT3, shim_env(path), args=[str(srv.port)], timeout=30)
        assert r.returncode == 0 and r.stdout.strip() == "ran 3", \
            "%s: the program did not run unlimited (exit %d, stdout %r, stderr %r)" % (
                path, r.returncode, r.stdout, r.stderr)
        lines = shim_lines(r.stderr)
        assert len(lines) == 1 and what in lines[0] and "running without limits" in lines[0], \
            "want one line saying %r, got %r" % (what, r.stderr)
        r = run_py(CONNECT3, shim_env(path, strict="1"), args=[str(srv.port)], timeout=30)
        assert r.returncode == 78 and "ran" not in r.stdout and what in r.stderr, \
            "strict: exit %d, want 78 (stdout %r, stderr %r)" % (r.returncode, r.stdout, r.stderr)


def test_a_config_given_by_its_full_path_includes_a_file_by_its_full_path():
    # As systemd gives it: /dir/svc.cfg, which includes /dir/conf.d/comps.cfg.
    # libconfig 1.5 alone would look for /dir//dir/conf.d/comps.cfg and the
    # program would run unlimited; the shim reads the include itself. An
    # error in the included file names that file and its own line.
    srv = Server()
    d = tmpdir()
    os.mkdir(os.path.join(d, "conf.d"))
    comps = os.path.join(d, "conf.d", "comps.cfg")
    seg = new_segment()
    with open(comps, "w") as f:
        f.write('# limits\ncompartments = ( { name = "a";\n'
                '  destinations = [ "127.0.0.1:%d" ]; max_connections = 1; } );\n' % srv.port)
    svc = os.path.join(d, "svc.cfg")
    with open(svc, "w") as f:
        f.write('segment = "%s";\n@include "%s"   # the compartments\n' % (seg, comps))
    r = run_py(CONNECT_PROBE, shim_env(svc), args=[str(srv.port)])
    assert r.returncode == 3, "exit %d (stderr %r)" % (r.returncode, r.stderr)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["res"] == ["ok", "refused", "refused"], \
        "the included compartment did not limit: %r (stderr %r)" % (got, r.stderr)
    with open(comps, "w") as f:
        f.write('# limits\ncompartments = ( { name = "a";\n'
                '  destinations = [ "127.0.0.1:%d" ]; max_connections = 0; } );\n' % srv.port)
    r = run_py(CONNECT3, shim_env(svc), args=[str(srv.port)])
    lines = shim_lines(r.stderr)
    assert r.returncode == 0 and len(lines) == 1 and lines[0].find("%s:3: " % comps) >= 0, \
        "want one line at %s:3, got %r" % (comps, r.stderr)


def test_missing_config_warns_once_and_runs():
    srv = Server()
    missing = os.path.join(tmpdir(), "no-such.cfg")
    r = run_py(CONNECT3, shim_env(missing), args=[str(srv.port)])
    assert r.returncode == 0 and r.stdout.strip() == "ran 3", (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and shim_lines(r.stderr) and missing in lines[0], \
        "want one warning naming %s, got %r" % (missing, r.stderr)


def test_valid_config_is_silent_when_nothing_is_refused():
    srv = Server()
    shim = Shim([{"name": "a", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 3}])
    r = run_py(CONNECT3, shim.env(), args=[str(srv.port)])
    assert r.returncode == 0 and r.stdout.strip() == "ran 3", (r.returncode, r.stdout, r.stderr)
    assert r.stderr == "", "a good config and no refusal still wrote %r" % r.stderr
    shim.expect("a", in_use=0, admitted=3, rejected=0, peak=3)
