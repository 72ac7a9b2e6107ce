"""test_warnings.py - running without limits, or with limits other than the file's, is loud: the
library says why and what to do, once per process tree."""

import os
import subprocess

import harness
from harness import (PY, Server, new_segment, run, shim_env, shim_lines, status_json, tmpdir,
                     unique, write_file)
from harness_cli import (attach, cli_ok, config_file, config_text, connect_py, web_comp)
from harness_hard import as_nobody, is_root, shared_dir


def test_permission_denied_names_the_fix():
    """A non-root process facing root's 0600 segment is told the lines to add."""
    assert is_root(), "this test runs a program as nobody: run it as root"
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port)], where=shared_dir())
    r = attach(config)
    assert r.returncode == 0 and not shim_lines(r.stderr), r.stderr
    r = run(*as_nobody([PY, "-c", "pass"], shim_env(config)))
    lines = shim_lines(r.stderr)
    text = "\n".join(lines)
    assert "Permission denied" in text and "running without limits" in text, text
    fix = [l for l in lines if ": fix: " in l]
    assert any("mode 0600" in l and "root" in l for l in fix), \
        "want the owner and mode of the segment: %r" % lines
    assert any('mode = "0660"; group = "nogroup";' in l and config in l and
               "bulkshim rm %s" % seg in l for l in fix), "want the lines to add: %r" % lines


def test_mismatched_limits_are_said_once():
    """A process whose file says other limits than the live segment says so, once."""
    srv = Server()
    seg = new_segment()
    a = config_file(seg, [web_comp(srv.port, 4)])
    holder = subprocess.Popen([PY, "-c", "import socket,sys,time; s=socket.create_connection("
                               "('127.0.0.1',%d)); print('up',flush=True); sys.stdin.read()"
                               % srv.port], env=shim_env(a), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    harness.defer(holder.kill)
    assert holder.stdout.readline().strip() == "up"
    b = config_file(seg, [web_comp(srv.port, 8)])
    script = write_file("#!/bin/sh\nfor i in 1 2 3 4 5; do %s -c pass; done\n" % PY, suffix=".sh")
    os.chmod(script, 0o755)
    r = run([script], shim_env(b))
    warn = [l for l in shim_lines(r.stderr) if "runs with limits other than" in l]
    assert len(warn) == 1, "want one warning for five processes: %r" % r.stderr
    assert "web max_connections 8 (segment: 4)" in warn[0] and "bulkshim reload -c" in warn[0], warn
    # The file that made the segment, with the same limits, says nothing.
    r = attach(a)
    assert not shim_lines(r.stderr), r.stderr
    holder.stdin.close()
    holder.wait(10)


def test_two_config_files_on_one_segment_warn():
    """/etc/a/bulkshim.cfg and /etc/b/bulkshim.cfg share a segment by name: warn."""
    srv = Server()
    seg = unique("bulkshim")
    harness.defer(lambda: os.path.exists("/dev/shm/bulkshim." + seg) and
                  os.unlink("/dev/shm/bulkshim." + seg))
    da, db = os.path.join(tmpdir(), "a"), os.path.join(tmpdir(), "b")
    os.mkdir(da)
    os.mkdir(db)
    # Neither names its segment: both get the base name of the file.
    fa = os.path.join(da, seg + ".cfg")
    fb = os.path.join(db, seg + ".cfg")
    for f in (fa, fb):
        with open(f, "w") as out:
            out.write(config_text([web_comp(srv.port)], seg).replace('segment = "%s";' % seg, ""))
    assert "segment %s" % seg in cli_ok("check", fa)
    r = attach(fa)
    assert not shim_lines(r.stderr), r.stderr
    r = attach(fb)
    warn = [l for l in shim_lines(r.stderr) if "another file" in l]
    assert len(warn) == 1 and fa in warn[0] and fb in warn[0], r.stderr
    r = attach(fa)
    assert not shim_lines(r.stderr), r.stderr
    # The same path saved by an editor that writes a new file (a new inode) is no other file.
    with open(fa + ".new", "w") as out:
        out.write(open(fa).read())
    os.rename(fa + ".new", fa)
    r = attach(fa)
    assert not shim_lines(r.stderr), r.stderr


def test_no_config_warning_once_per_process_tree():
    """A wrapper script that starts many programs prints the no-config warning once."""
    missing = os.path.join(tmpdir(), "nope.cfg")
    script = write_file("#!/bin/sh\nfor i in $(seq 12); do %s -c pass; done\n" % PY, suffix=".sh")
    os.chmod(script, 0o755)
    r = run([script], shim_env(missing))
    warn = [l for l in shim_lines(r.stderr) if "no config file" in l]
    assert len(warn) == 1, "want one warning for 12 programs, got %d: %r" % (len(warn), r.stderr)


def test_a_restart_that_undoes_live_sets_says_so():
    """When nobody holds the segment, the next start applies the file again;
    the live changes it replaces (a kill switch!) are named, not dropped silently."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, 2)])
    assert attach(config).returncode == 0
    cli_ok("set", "-s", seg, "--all", "enforce", "off")
    r = run([PY, "-c", connect_py(srv.port, 1)], shim_env(config))
    warn = [l for l in shim_lines(r.stderr) if "replace what `bulkshim set` had changed" in l]
    assert len(warn) == 1 and "web enforce" in warn[0], r.stderr
    assert status_json(seg)["compartments"][0]["enforce"] is True
    r = run([PY, "-c", connect_py(srv.port, 1)], shim_env(config))
    assert not shim_lines(r.stderr), r.stderr
