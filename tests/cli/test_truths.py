"""test_truths.py - what the operator is told is what happens: refusal lines once a second per
compartment across processes, a reload that names every adaptive change, a `set` that pins an
adaptive limit where it says, the fleet agent's liveness, and JSON log lines from the CLI's own
long-running commands."""

import re
import subprocess
import time

import harness
from harness import PY, Server, comp_of, new_segment, shim_env, status_json
from harness_cli import cli_ok, config_file

_WAIT_THEN_CONNECT = (
    "import socket, sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.connect(('127.0.0.1', %d)); print('ok', flush=True)\n"
    "except OSError as e:\n"
    "    print('refused', e.errno, flush=True)\n")


def _holder(config, port):
    """A process under config that holds one connection to port until killed."""
    p = subprocess.Popen([PY, "-c", "import socket,sys; s=socket.create_connection("
                          "('127.0.0.1',%d)); print('up',flush=True); sys.stdin.read()" % port],
                         env=shim_env(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    harness.defer(p.kill)
    assert p.stdout.readline().strip() == "up"
    return p


def test_refusal_lines_are_once_a_second_per_compartment_across_processes():
    """Ten processes refused by one full compartment within a few milliseconds print one line
    between them (a second may tick during the burst: then two), and a later line, whichever
    process prints it, counts the refusals the others did not print. The witness of the
    refusals is the server, which accepts only the holder's connection."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [{"name": "pay", "destinations": ["127.0.0.1:%d" % srv.port],
                                "max_connections": 1}])
    _holder(config, srv.port)
    srv.wait_live(1, timeout=20)
    procs = [subprocess.Popen([PY, "-c", _WAIT_THEN_CONNECT % srv.port], env=shim_env(config),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(10)]
    for p in procs:
        harness.defer(p.kill)
    # Every process is up (its interpreter started) before any connects.
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [p.communicate(timeout=30) for p in procs]
    span = time.monotonic() - t0
    assert all(o[0].startswith("refused") for o in outs), outs
    lines = [ln for o in outs for ln in o[1].splitlines() if "refused" in ln]
    assert len(lines) <= 1 + int(span), \
        "%d refusal lines from 10 processes refused within %.2f s:\n%s" % (
            len(lines), span, "\n".join(lines))
    assert srv.accepted == 1, "the server accepted %d connections" % srv.accepted
    assert comp_of(status_json(seg), "pay")["rejected"] == 10
    # A second later, one more refusal prints a line that counts the ones left unprinted.
    time.sleep(1.1)
    r = harness.run([PY, "-c", _WAIT_THEN_CONNECT % srv.port], shim_env(config), 30, "go\n")
    assert r.stdout.startswith("ready\nrefused"), r.stdout
    suppressed = [int(n) for n in re.findall(r"\((\d+) similar suppressed\)", r.stderr)]
    assert suppressed and suppressed[0] == 10 - len(lines), (lines, r.stderr)
