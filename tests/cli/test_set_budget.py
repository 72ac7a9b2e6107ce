"""test_set_budget.py - `bulkshim set` refuses a change that breaks the config's budget or pool
sums, as `check` and `reload` refuse such a file, unless --force.

The witness is a loopback server counting its own live connections: a refused change leaves
the limit where it was for every attached process.
"""

import subprocess

import harness
from harness import PY, Server, comp_of, new_segment, shim_env, status_json, write_file
from harness_cli import (attach, cli, cli_fails, cli_ok, config_file, connect_py,
                         hold_connections)



def _most(srv, config, n):
    """Has a process under config make n connections to srv and hold them
    until the witness has seen every one; returns how many connected and the
    most the witness held at once."""
    code = connect_py(srv.port, n).replace("print(ok)\n", "print(ok, flush=True)\n"
                                           "import sys\nsys.stdin.read()\n")
    p = subprocess.Popen([PY, "-c", code], env=shim_env(config), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    harness.defer(p.kill)
    ok = int(p.stdout.readline())
    srv.wait_live(ok, timeout=20)
    p.stdin.close()
    p.wait(10)
    return ok, srv.max_live


def test_set_over_the_budget_is_refused_with_the_arithmetic():
    """budget 10 - 2 reserved with a = 4 and b = 4: `set a max_connections 9` (9 + 4 > 8) is
    refused, by -c and by -s; the witness still sees 4; --force applies it and says so."""
    srv, other = Server(), Server()
    seg = new_segment()
    config = config_file(seg, [
        {"name": "a", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 4},
        {"name": "b", "destinations": ["127.0.0.1:%d" % other.port], "max_connections": 4},
    ], top={"budget": {"pool": 10, "reserved": 2}})
    # A process holding a permit of b: without one, the next process to start would
    # apply the file's limits again, whatever `set` did.
    holder = hold_connections(config, other.port)
    r = cli("set", "-c", config, "a", "max_connections", "9")
    ok, most = _most(srv, config, 9)
    assert ok == 4 and most == 4, "%d connected, witness held %d, against the configured 4 " \
        "after a set over budget (exit %d: %s%s)" % (ok, most, r.returncode, r.stdout, r.stderr)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert "budget exceeded: 9 + 4 = 13 > 10 - 2 reserved" in r.stderr, r.stderr
    assert "--force sets it anyway" in r.stderr, r.stderr
    # By segment name, the config is the one the segment records.
    cli_fails("set", "-s", seg, "a", "max_connections=9",
              want=r"budget exceeded: 9 \+ 4 = 13 > 10 - 2 reserved")
    # --all counts every compartment's new value.
    cli_fails("set", "-s", seg, "--all", "max_connections", "5",
              want=r"budget exceeded: 5 \+ 5 = 10 > 10 - 2 reserved")
    assert comp_of(status_json(seg), "a")["limit"] == 4
    # Within the budget it goes through.
    out = cli_ok("set", "-s", seg, "b", "max_connections", "3")
    assert "b max_connections 4 -> 3" in out, out
    # --force applies it, and says what it breaks.
    r = cli("set", "-s", seg, "--force", "a", "max_connections", "9")
    assert r.returncode == 0 and "a max_connections 4 -> 9" in r.stdout, (r.stdout, r.stderr)
    assert "--force: setting a max_connections 9" in r.stderr and "9 + 3 = 12" in r.stderr, \
        r.stderr
    assert comp_of(status_json(seg), "a")["limit"] == 9
    # Lowering a limit never breaks a sum, even while the sums are broken.
    out = cli_ok("set", "-s", seg, "b", "max_connections", "1")
    assert "b max_connections 3 -> 1" in out, out
    holder.kill()
    holder.wait(10)


def test_set_of_a_pool_size_over_the_budget_is_refused():
    """A pool counts in the budget as the most it can have in use: raising its size past
    the budget is refused with the pool's share in the sum; --force applies it."""
    seg = new_segment()
    config = write_file(
        'segment = "%s";\nbudget = { pool = 10; };\npools = ( { name = "p"; size = 6; } );\n'
        'compartments = (\n'
        '  { name = "a"; destinations = [ "127.0.0.1:1" ]; max_connections = 4; },\n'
        '  { name = "c"; destinations = [ "127.0.0.1:2" ]; max_connections = 8; pool = "p";'
        ' guaranteed = 2; }\n);\n' % seg)
    assert attach(config).returncode == 0
    err = cli_fails("set", "-c", config, "p", "size", "7",
                    want=r"budget exceeded: 4 \+ 7 \(pool p\) = 11 > 10")
    assert "--force" in err, err
    out = cli_ok("set", "-c", config, "--force", "p", "size", "7")
    assert "pool p size 6 -> 7" in out, out
