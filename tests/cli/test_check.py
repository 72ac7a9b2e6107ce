"""test_check.py - `bulkshim check` says every error and warning before its verdict and shows
how each compartment's limit is made (static, pool, adaptive, fleet, the total); a host name
that gives no address is never silent: check fails on it, `run` names the destination it starts
unprotected (and refuses in strict mode), and the library logs one line with file and line.

Host names end in .invalid (RFC 6761), which no resolver may answer with an address.
"""

import os
import pty
import re
import select
import subprocess

import harness
from harness import PY, clean_env, new_segment, run, shim_env, shim_lines, write_file
from harness_cli import cli, cli_ok

GHOST = "nowhere.invalid"


def _ghost_config(seg, top=None, strict=False):
    """A config whose second compartment's only destination is a name that
    gives no address, on line 4 (line 5 with strict)."""
    head = 'segment = "%s";\n' % seg + ("strict = true;\n" if strict else "")
    for k, v in (top or {}).items():
        head += "%s = %s;\n" % (k, v)
    return write_file(head + "compartments = (\n"
                      '  { name = "db"; destinations = [ "127.0.0.1:9" ]; max_connections = 4; },\n'
                      '  { name = "ghost"; destinations = [ "%s:443" ]; max_connections = 3; }\n'
                      ");\n" % GHOST)


def _on_a_terminal(argv, timeout=30):
    """Runs argv with stdout and stderr on one pseudo-terminal, as an
    operator sees it (stdout line-buffered, stderr not); returns the exit
    status and the lines in the order they reached the terminal."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         env=clean_env())
    harness.defer(p.kill)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], timeout)
        assert r, "%s printed nothing for %ds" % (argv[:3], timeout)
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    status = p.wait(timeout=timeout)
    return status, out.decode().replace("\r\n", "\n").splitlines()


def test_check_prints_an_unresolvable_host_before_its_verdict_and_never_ok():
    path = _ghost_config(new_segment())
    status, lines = _on_a_terminal([harness.CLI, "check", path])
    assert status == 1, (status, lines)
    err = [i for i, l in enumerate(lines)
           if re.match(r'bulkshim: %s:4: host "%s" of compartment "ghost" resolves to nothing'
                       % (re.escape(path), re.escape(GHOST)), l)]
    assert len(err) == 1, lines
    assert "not limited" in lines[err[0]], lines[err[0]]
    verdict = [i for i, l in enumerate(lines) if l.startswith(path + ": ")]
    assert len(verdict) == 1 and verdict[0] > err[0], "the error must come first: %r" % lines
    assert not re.search(r": ok\b", lines[verdict[0]]) and "1 error" in lines[verdict[0]], lines
    assert not any(re.search(r"\bok\b", l) for l in lines[:err[0]]), lines
    # The host's own line in the report says it is not limited.
    assert any(l.strip().startswith("host %s:443 (ghost) -> NOTHING" % GHOST) for l in lines), lines


def test_check_prints_a_warning_before_ok():
    seg = new_segment()
    path = write_file(
        'segment = "%s";\n'
        'fleet = { redis = "127.0.0.1:6379"; name = "f"; hosts = 4; };\n'
        'compartments = ( { name = "db"; destinations = [ "127.0.0.1:9" ];\n'
        '  max_connections = 5; fleet_limit = 10; fleet_floor = 3; } );\n' % seg)
    status, lines = _on_a_terminal([harness.CLI, "check", path])
    assert status == 0, (status, lines)
    warn = [i for i, l in enumerate(lines) if l.startswith("bulkshim: warning: %s:3:" % path)]
    ok = [i for i, l in enumerate(lines) if l.startswith(path + ": ok")]
    assert len(warn) == 1 and len(ok) == 1 and warn[0] < ok[0], lines
    assert "1 warning above" in lines[ok[0]], lines[ok[0]]


def test_check_counts_a_pool_once_at_its_size():
    seg = new_segment()
    path = write_file(
        'segment = "%s";\n'
        'pools = ( { name = "p"; size = 8; reserved = 1; } );\n'
        'compartments = (\n'
        '  { name = "a"; destinations = [ "127.0.0.1:1" ]; max_connections = 7; pool = "p";\n'
        '    guaranteed = 2; },\n'
        '  { name = "b"; destinations = [ "127.0.0.1:2" ]; max_connections = 7; pool = "p";\n'
        '    guaranteed = 3; },\n'
        '  { name = "c"; destinations = [ "127.0.0.1:3" ]; max_connections = 4; }\n'
        ');\n' % seg)
    out = cli_ok("check", path)
    lines = out.splitlines()
    total = [l for l in lines if l.strip().startswith("total")]
    assert len(total) == 1, out
    # 4 outside the pool, and the pool at most its 8 less 1 reserved: 11, not 7 + 7 + 4.
    assert re.match(r"\s*total\s+11\s", total[0]) and "no budget set" not in total[0], total
    assert re.search(r"pool p counts 7: its members' ceilings sum to 14, capped at its size 8 "
                     r"less 1 reserved", out), out
    for name, guar in (("a", 2), ("b", 3)):
        at = [i for i, l in enumerate(lines) if l.strip().startswith(name + " ")][0]
        assert re.search(r"pool p: guaranteed %d, ceiling 7; .* at most the pool's 7" % guar,
                         lines[at + 1]), lines[at:at + 2]


def test_check_shows_the_adaptive_range_and_the_fleet_arithmetic():
    seg = new_segment()
    path = write_file(
        'segment = "%s";\n'
        'fleet = { redis = "127.0.0.1:6379"; name = "shop"; hosts = 4; lease_ms = 3000; };\n'
        'compartments = (\n'
        '  { name = "db"; destinations = [ "127.0.0.1:9" ]; max_connections = 5;\n'
        '    fleet_limit = 10; fleet_floor = 2; },\n'
        '  { name = "api"; destinations = [ "127.0.0.1:8" ]; max_connections = 20;\n'
        '    adaptive = { min = 2; max = 16; initial = 6; window_ms = 200; tolerance_pct = 130; }; }\n'
        ');\n' % seg)
    r = cli("check", path)
    assert r.returncode == 0 and "warning" not in r.stderr, (r.returncode, r.stderr)
    out = r.stdout
    assert re.search(r"adaptive max_connections: the live limit starts at 6 and moves between "
                     r"min 2 and max 16 with the latency \(window_ms 200, tolerance_pct 130\)",
                     out), out
    assert re.search(r"fleet shop: fleet_limit 10 across its hosts; .* at most its "
                     r"max_connections 5, and falls to fleet_floor 2 without a valid lease", out), out
    assert re.search(r"hosts 4 x fleet_floor 2 = 8 <= fleet_limit 10", out), out
    assert re.search(r"lease_ms 3000, renewed every 500 ms", out), out


def test_run_names_the_destination_it_starts_unprotected():
    seg = new_segment()
    path = _ghost_config(seg)
    r = run([harness.CLI, "run", "-c", path, "--", PY, "-c", "print('started')"], clean_env(),
            timeout=60)
    harness.defer(cli, "rm", seg)
    assert r.returncode == 0 and r.stdout.strip() == "started", (r.returncode, r.stderr)
    mine = [l for l in r.stderr.splitlines() if l.startswith("bulkshim: ")]
    assert any(re.match(r'bulkshim: warning: %s:4: host "%s" of compartment "ghost" resolves to '
                        r'nothing .*connections to %s:443 are not limited'
                        % (re.escape(path), re.escape(GHOST), re.escape(GHOST)), l)
               for l in mine), r.stderr
    assert any("1 destination NOT PROTECTED" in l for l in mine), r.stderr


def test_run_refuses_an_unresolvable_host_in_strict_mode():
    seg = new_segment()
    for path, env in ((_ghost_config(seg), {"BULKSHIM_STRICT": "1"}),
                      (_ghost_config(seg, strict=True), {})):
        e = clean_env()
        e.update(env)
        r = run([harness.CLI, "run", "-c", path, "--", PY, "-c", "print('started')"], e,
                timeout=60)
        assert r.returncode == 78 and "started" not in r.stdout, (r.returncode, r.stdout, r.stderr)
        assert re.search(r'bulkshim: %s:\d+: host "%s" of compartment "ghost" resolves to nothing'
                         % (re.escape(path), re.escape(GHOST)), r.stderr), r.stderr
        assert "not started: strict mode" in r.stderr, r.stderr


def test_the_library_says_once_per_process_tree_which_host_gave_no_address():
    seg = new_segment()
    path = _ghost_config(seg)
    harness.defer(cli, "rm", seg)
    # A program that starts a second program: the tree says it once.
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True); "
            "print('done')")
    r = run([PY, "-c", code], shim_env(path), timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr
    lines = [l for l in shim_lines(r.stderr) if GHOST in l]
    assert len(lines) == 1, "want one line for the tree: %r" % r.stderr
    assert re.match(r'bulkshim\[\d+\]: %s:4: host "%s" of compartment "ghost" resolves to nothing '
                    r'\(.+\): connections to %s:443 are not limited until the program\'s own '
                    r'lookup of the name returns an address$'
                    % (re.escape(path), re.escape(GHOST), re.escape(GHOST)), lines[0]), lines


def test_status_names_a_destination_that_resolves_to_nothing():
    """Text status says which host-name destination gives no address now, and
    that its connections are not limited; one that resolves is not named."""
    seg = new_segment()
    path = _ghost_config(seg)
    r = run([PY, "-c", "pass"], shim_env(path, log="off"))
    assert r.returncode == 0, r.stderr
    out = cli_ok("status", "-s", seg)
    lines = [l for l in out.splitlines() if GHOST in l]
    assert len(lines) == 1, out
    assert ("destination %s:443 of compartment ghost (line 4 of the config) resolves to "
            "nothing now" % GHOST) in lines[0] and "not limited" in lines[0], lines[0]
    assert "127.0.0.1" not in lines[0]
