"""test_truths.py - what the operator is told is what happens: refusal lines once a second per
compartment across processes, a reload that names every adaptive change, a `set` that pins an
adaptive limit where it says, the fleet agent's liveness, and JSON log lines from the CLI's own
long-running commands."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import harness
from harness import PY, Server, comp_of, new_segment, shim_env, status_json
from harness_cli import cli_ok, config_file, hold_connections, poke

_WAIT_THEN_CONNECT = (
    "import socket, sys\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.connect(('127.0.0.1', %d)); print('ok', flush=True)\n"
    "except OSError as e:\n"
    "    print('refused', e.errno, flush=True)\n")



def test_refusal_lines_are_once_a_second_per_compartment_across_processes():
    """Ten processes refused by one full compartment within a few milliseconds print one line
    between them (a second may tick during the burst: then two), and a later line, whichever
    process prints it, counts the refusals the others did not print. The witness of the
    refusals is the server, which accepts only the holder's connection."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [{"name": "pay", "destinations": ["127.0.0.1:%d" % srv.port],
                                "max_connections": 1}])
    hold_connections(config, srv.port)
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


def _adaptive_config(seg, port, **ad):
    bounds = {"min": 2, "max": 16}
    bounds.update(ad)
    return config_file(seg, [{"name": "be", "destinations": ["127.0.0.1:%d" % port],
                              "max_inflight": 64, "adaptive": bounds}])


def test_reload_names_and_applies_every_adaptive_change():
    """adaptive max 16 -> 4 (and min, window_ms): the reload lists each change, the limit
    the controller had learned brought within the new bounds, and applies them; a dry run
    counts them; reloading the same file again changes nothing."""
    srv = Server()
    seg = new_segment()
    config = _adaptive_config(seg, srv.port)
    assert subprocess.run([PY, "-c", "pass"], env=shim_env(config)).returncode == 0
    assert comp_of(status_json(seg), "be")["adaptive"]["max"] == 16
    with open(config, "w") as f:
        f.write(open(_adaptive_config(seg, srv.port, min=1, max=4, window_ms=250)).read())
    dry = cli_ok("reload", "--dry-run", "-c", config)
    assert "no setting changes" not in dry, dry
    assert "4 settings change" in dry, dry
    out = cli_ok("reload", "-c", config)
    for line in ("be adaptive.min 2 -> 1", "be adaptive.max 16 -> 4",
                 "be adaptive.window_ms 100 -> 250", "be adaptive.limit 16 -> 4"):
        assert line in out, "%r not in:\n%s" % (line, out)
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["min"], ad["max"], ad["window_ms"], ad["limit"]) == (1, 4, 250, 4), ad
    assert "no setting changes" in cli_ok("reload", "-c", config)


def test_set_pins_the_adaptive_limit_at_its_value_until_adaptive_on():
    """`set be max_inflight 3` on an adaptive compartment: status shows the adaptive limit
    pinned at 3 (mode off, reason pinned), a later set pins it at its new value, and
    `adaptive on` resumes from the pinned value, not from where the controller was."""
    srv = Server()
    seg = new_segment()
    config = _adaptive_config(seg, srv.port)
    assert subprocess.run([PY, "-c", "pass"], env=shim_env(config)).returncode == 0
    assert comp_of(status_json(seg), "be")["adaptive"]["limit"] == 16
    out = cli_ok("set", "-s", seg, "be", "max_inflight", "3")
    assert "pinned at 3" in out, out
    c = comp_of(status_json(seg), "be")
    ad = c["adaptive"]
    assert (c["inflight_limit"], ad["mode"], ad["limit"], ad["last_change_reason"]) == \
        (3, "off", 3, "pinned"), c
    out = cli_ok("set", "-s", seg, "be", "max_inflight", "5")
    assert "pinned at 5" in out, out
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["mode"], ad["limit"]) == ("off", 5), ad
    out = cli_ok("set", "-s", seg, "be", "adaptive", "on")
    assert "resumes from 5" in out, out
    c = comp_of(status_json(seg), "be")
    assert (c["adaptive"]["mode"], c["adaptive"]["limit"], c["inflight_limit"]) == \
        ("on", 5, 64), c
    out = cli_ok("set", "-s", seg, "be", "adaptive", "off")
    assert "pinned at 5" in out, out


def test_status_names_the_knee_an_adaptive_limit_holds_at():
    """A compartment whose controller holds its limit at a knee (one permit more cost latency
    and served less than a quarter more: PostgreSQL on its cores) says so: `status --json`
    has the knee and whether it is sure, the text a line that explains it, `watch` and
    `metrics` the knee; none on a fresh compartment. The knee is written where the controller keeps it (beside
    ctl, in alg[3]: the knee in bits 32-35, sure in bit 63; adaptive.c's keep_store)."""
    srv = Server()
    seg = new_segment()
    config = _adaptive_config(seg, srv.port)
    assert subprocess.run([PY, "-c", "pass"], env=shim_env(config)).returncode == 0
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["knee"], ad["knee_sure"]) == (0, False), ad
    assert "knee" not in cli_ok("status", "-s", seg)
    poke(seg, "be", **{"ad.alg[3]": 2 << 32})
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["knee"], ad["knee_sure"]) == (2, False), ad
    assert "knee at 2: one permit fewer served a quarter less; the permit above it is " \
        "under test" in cli_ok("status", "-s", seg)
    poke(seg, "be", **{"ad.alg[3]": 3 << 32 | 1 << 63})
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["knee"], ad["knee_sure"]) == (3, True), ad
    text = cli_ok("status", "-s", seg)
    assert "knee at 3: one permit more cost latency past the tolerance and served less " \
        "than a quarter more (tried again every 30 s)" in text, text
    # No knee is above 8 permits (a limit where one permit is an eighth of it or more): a
    # segment that says so is damaged, and its adaptive object is not shown.
    poke(seg, "be", **{"ad.alg[3]": 12 << 32})
    c = comp_of(status_json(seg), "be")
    assert c["adaptive"] is None and "adaptive" in c["damaged"], c
    poke(seg, "be", **{"ad.alg[3]": 3 << 32 | 1 << 63})
    frame = cli_ok("watch", "-s", seg, "-n", "1")
    assert re.search(r"adaptive on \(bulkshim\): limit \d+ .*, knee 3\b", frame), frame
    m = cli_ok("metrics", "-s", seg)
    assert re.search(r'^bulkshim_adaptive_knee\{segment="[^"]*",compartment="be"\} 3$', m, re.M), m


def test_status_names_the_edge_an_adaptive_limit_holds_under():
    """A compartment whose controller holds its limit one permit under an edge (the least
    limit whose replies showed a queue) says so: `status --json` has the edge and whether a
    step onto it met the queue again, the text a line that explains it and how often the
    limit steps onto it, `watch` and `metrics` the edge; none on a fresh compartment. The edge
    is written where the controller keeps it (alg[1] above the window's count of slow replies:
    the edge in bits 24-39, the peak, an edge found again, in bits 40-55; keep_store)."""
    srv = Server()
    seg = new_segment()
    config = _adaptive_config(seg, srv.port)
    assert subprocess.run([PY, "-c", "pass"], env=shim_env(config)).returncode == 0
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["edge"], ad["edge_found_again"]) == (0, False), ad
    assert "edge" not in cli_ok("status", "-s", seg)
    poke(seg, "be", **{"ad.alg[1]": 15 << 24 | 5})
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["edge"], ad["edge_found_again"]) == (15, False), ad
    assert "edge at 15: replies waited at 15 in flight; the limit steps onto it every 4 " \
        "windows (not yet found again)" in cli_ok("status", "-s", seg)
    poke(seg, "be", **{"ad.alg[1]": 15 << 24 | 15 << 40})
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["edge"], ad["edge_found_again"]) == (15, True), ad
    text = cli_ok("status", "-s", seg)
    assert "edge at 15: replies waited at 15 in flight; the limit steps onto it every 32 " \
        "windows (found again)" in text, text
    # An edge of a few permits is one (a limit of 4 held under 5); an edge of 1 is not, since
    # no limit is under it: a segment that says so is damaged, and its adaptive object is not
    # shown.
    poke(seg, "be", **{"ad.alg[1]": 5 << 24 | 5 << 40})
    ad = comp_of(status_json(seg), "be")["adaptive"]
    assert (ad["edge"], ad["edge_found_again"]) == (5, True), ad
    poke(seg, "be", **{"ad.alg[1]": 1 << 24})
    c = comp_of(status_json(seg), "be")
    assert c["adaptive"] is None and "adaptive" in c["damaged"], c
    poke(seg, "be", **{"ad.alg[1]": 15 << 24 | 15 << 40})
    frame = cli_ok("watch", "-s", seg, "-n", "1")
    assert re.search(r"adaptive on \(bulkshim\): limit \d+ .*, edge 15\b", frame), frame
    m = cli_ok("metrics", "-s", seg)
    assert re.search(r'^bulkshim_adaptive_edge\{segment="[^"]*",compartment="be"\} 15$', m,
                     re.M), m


def test_status_says_when_the_fleet_agent_is_stopped_or_gone():
    """The agent leasing for a compartment is SIGSTOPped: status --json says fleet_agent
    "stopped" and fleet_redis "no agent" (not the "ok" of its last round trip); SIGCONT: it
    runs and leases again; SIGKILL: "none" and "no agent". The witness is Redis's own entry
    for the host: it stops being renewed while the agent is stopped."""
    sys.path.insert(0, os.path.join(harness.ROOT, "tests", "fleet"))
    import harness_fleet as hf

    redis = hf.Redis()
    srv = Server()
    h = hf.Host("a", harness.unique("fleet"), redis.address(), srv.port, 8, 2, 6, 1000)
    h.start_agent()
    hf.wait_for(lambda: h.status().get("fleet_redis") == "ok", 10, "the agent to lease")
    os.kill(h.agent.pid, signal.SIGSTOP)
    try:
        hf.wait_for(lambda: h.status()["fleet_redis"] == "no agent", 5,
                    "status to see the agent stopped (fleet_redis %r)" % h.status()["fleet_redis"])
        st = h.status()
        assert st["fleet_agent"] == "stopped" and not st["fleet_redis_reachable"], st
        # Redis agrees: the entry's lease runs out unrenewed.
        hf.wait_for(lambda: not [x for x in h.fleet_status()["hosts"] if x["host"] == "a"][0]
                    ["live"], 5, "Redis to see the lease run out")
        assert h.status()["fleet_redis"] == "no agent"
    finally:
        os.kill(h.agent.pid, signal.SIGCONT)
    hf.wait_for(lambda: h.status()["fleet_agent"] == "running" and
                h.status()["fleet_redis"] == "ok" and h.status()["fleet_lease"], 10,
                "the agent to lease again after SIGCONT")
    st = h.status()
    assert (st["fleet_agent"], st["fleet_agent_pid"]) == ("running", h.agent.pid), st
    h.kill_agent()
    st = h.status()
    assert (st["fleet_agent"], st["fleet_redis"]) == ("none", "no agent"), st


JSON_KEYS = {"time", "pid", "program", "level", "message"}


def _json_lines(text, program):
    """Every line of text, each parsed as a JSON object of the library's shape from program."""
    objs = []
    for line in text.splitlines():
        try:
            o = json.loads(line)
        except ValueError:
            raise AssertionError("not a JSON line: %r (in %r)" % (line, text))
        assert JSON_KEYS <= set(o) and o["program"] == program, o
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o["time"]), o
        objs.append(o)
    return objs


def _json_env():
    env = harness.clean_env()
    env["BULKSHIM_LOG_FORMAT"] = "json"
    return env


def test_serve_run_and_fleet_lines_follow_the_json_log_format():
    """With BULKSHIM_LOG_FORMAT=json, `serve` (start and stop), `run` (a config it refuses)
    and `fleet` (its start, a stop) write JSON objects with the library's fields, each line
    one object; without it they write the text lines scripts read."""
    seg = new_segment()
    config = config_file(seg, [{"name": "x", "destinations": ["127.0.0.1:9"],
                                "max_connections": 1}])
    p = subprocess.Popen([harness.CLI, "serve", "--listen", "127.0.0.1:0", "-c", config],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=_json_env())
    harness.defer(p.kill)
    first = p.stderr.readline()
    # Stopped once it serves (its handler of SIGTERM is in place then).
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", first).group(1))
    try:
        urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).close()
    except urllib.error.HTTPError:
        pass    # an answer all the same (no segment yet: 503)
    p.send_signal(signal.SIGTERM)
    rest = p.communicate(timeout=10)[1]
    lines = _json_lines(first + rest, "bulkshim serve")
    assert lines[0]["level"] == "info" and "http://127.0.0.1:" in lines[0]["message"], lines
    assert "stopped" in lines[-1]["message"], lines

    bad = harness.write_file("compartments = ( { name = \"x\"; max_connections = -3; } );\n")
    r = harness.run([harness.CLI, "run", "-c", bad, "true"], _json_env(), 20)
    assert r.returncode == 78, (r.returncode, r.stderr)
    lines = _json_lines(r.stderr, "bulkshim run")
    assert lines and all(o["level"] == "error" for o in lines), lines
    assert "not started" in lines[-1]["message"], lines
    r = harness.run([harness.CLI, "run", "-c", bad, "true"], harness.clean_env(), 20)
    assert r.stderr.startswith("bulkshim: ") and "not started" in r.stderr, r.stderr

    sys.path.insert(0, os.path.join(harness.ROOT, "tests", "fleet"))
    import harness_fleet as hf

    redis = hf.Redis()
    h = hf.Host("a", harness.unique("fleet"), redis.address(), 9, 8, 2, 6, 1000)
    with open(h.log, "a") as f:
        agent = subprocess.Popen([harness.CLI, "fleet", "-c", h.config], env=_json_env(),
                                 stdout=f, stderr=f)
    harness.defer(agent.kill)
    hf.wait_for(lambda: "leasing from Redis" in h.agent_log(), 10, "the agent to lease")
    agent.send_signal(signal.SIGTERM)
    agent.wait(10)
    lines = _json_lines(h.agent_log(), "bulkshim fleet")
    assert any(o["message"].startswith("host a of fleet") for o in lines), lines
    assert any("stopped" in o["message"] for o in lines), lines
