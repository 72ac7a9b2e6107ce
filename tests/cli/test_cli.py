"""test_cli.py - the operator's CLI against live segments: status, set, reload, reset, watch,
metrics, check, size, suggest, list, run, and `make install`."""

import errno
import json
import os
import re
import shutil
import subprocess

import harness
from harness import (CLI, CONNECT_PROBE, LIB, PY, ROOT, Agent, Server, Shim, clean_env,
                     need_built, new_segment, run, tmpdir, wait_until, write_file)
from harness_cli import (Tmux, cli, cli_fails, cli_json, cli_ok, config_text, create_segment,
                         need_tool, poke, sample)


def _one(limit, name="x", **more):
    """A server and a Shim with one compartment for it."""
    srv = Server()
    comp = {"name": name, "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": limit}
    comp.update(more)
    return srv, Shim([comp])


def _refused(t):
    return not t["ok"] and t["errno"] == errno.ECONNREFUSED


# ---- status ----

def test_status_flags_hot_and_shows_new_keys():
    srv, other = Server(), Server()
    seg = new_segment()
    cfg = write_file(config_text([
        {"name": "busy", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 5},
        {"name": "flights", "destinations": ["127.0.0.1:%d" % other.port], "max_inflight": 8},
    ], seg))
    a = Agent(harness.shim_env(cfg))
    held = [a("tcp(%d)" % srv.port) for _ in range(4)]
    a("tcp(%d)" % other.port)
    srv.wait_live(4)

    st = cli_json("status", "-s", seg, "--json")
    busy = harness.comp_of(st, "busy")
    stable = ["name", "limit", "in_use", "peak", "admitted", "rejected", "waiting",
              "last_rejection_ms", "reclaimed", "errno"]
    added = ["inflight", "inflight_limit", "inflight_peak", "over", "enforce", "rejected_by",
             "would_reject", "connect_timeouts", "io_timeouts", "classes", "hot", "unlimited"]
    missing = [k for k in stable + added if k not in busy]
    assert not missing, "status --json lacks %s: %s" % (missing, json.dumps(busy))
    assert list(busy)[:len(stable)] == stable, "the stable keys moved: %r" % list(busy)
    assert st["processes"] == 1, "processes is %r, want 1 (the agent)" % st["processes"]
    assert busy["in_use"] == 4 and busy["limit"] == 5 and busy["hot"] is True, json.dumps(busy)
    assert busy["unlimited"] is False and busy["enforce"] is True
    assert set(busy["rejected_by"]) == {"full", "inflight_full", "wait_timeout", "too_many_waiting",
                                        "class_full", "no_slot", "pool_full", "class_shared_full",
                                        "process_table_full"}, \
        busy["rejected_by"]
    fl = harness.comp_of(st, "flights")
    assert fl["limit"] == 0 and fl["unlimited"] is True and fl["inflight_limit"] == 8, json.dumps(fl)
    assert fl["hot"] is False and fl["in_use"] == 1

    text = cli_ok("status", "-s", seg)
    row = [l for l in text.splitlines() if l.startswith("busy ")]
    assert row and row[0].rstrip().endswith("HOT"), "busy is not flagged HOT: %r" % text
    frow = [l for l in text.splitlines() if l.startswith("flights ")][0]
    assert frow.split()[2] == "-" and "HOT" not in frow, "flights' LIMIT should be '-': %r" % frow
    a.call("close(%d)" % held[0])
    st = cli_json("status", "-s", seg, "--json")
    assert harness.comp_of(st, "busy")["hot"] is False, "3 of 5 is not hot"
    assert a.finish() == 0


# ---- set ----

def test_set_lowers_a_limit_in_the_running_program_without_restart():
    srv, shim = _one(5)
    a = Agent(shim.env(log="off"))
    held = [a("tcp(%d)" % srv.port) for _ in range(2)]
    out = cli_ok("set", "-s", shim.segment, "x", "max_connections", "1")
    assert "5 -> 1" in out and "nothing is revoked" in out, out
    shim.expect("x", limit=1, in_use=2)
    t = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert _refused(t), "a connect after lowering the limit to 1 with 2 in use went through: %r" % t
    srv.wait_live(2)  # nothing was revoked
    a.call("close(%d, %d)" % tuple(held))
    first = a("attempt(('127.0.0.1', %d))" % srv.port)
    second = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert first["ok"] and _refused(second), "limit 1: got %r then %r" % (first, second)
    shim.expect("x", in_use=1, rejected=2)
    # Raising it again is seen at once too.
    cli_ok("set", "-c", shim.config, "x", "max_connections", "3")
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert a.finish() == 0


# Keeps 3 connections open, replacing the oldest every 10 ms; one line per try.
CHURN = """
import socket, sys, time
port, held = int(sys.argv[1]), []
while True:
    if len(held) >= 3:
        held.pop(0).close()
    try:
        held.append(socket.create_connection(('127.0.0.1', port), timeout=5))
        print('ok', flush=True)
    except ConnectionRefusedError:
        print('refused', flush=True)
    time.sleep(0.01)
"""


def test_set_is_seen_by_a_program_looping_on_connect():
    srv, shim = _one(5)
    loop = harness.LineProc([harness.PY, "-c", CHURN, str(srv.port)], shim.env(log="off"),
                            stdin=False)
    assert all(loop.line() == "ok" for _ in range(20)), "limit 5 refused a third connection"
    cli_ok("set", "-s", shim.segment, "x", "max_connections", "1")
    wait_until(lambda: loop.line() == "refused", 5, 0, "a refusal after set")
    tail = [loop.line() for _ in range(20)]
    assert tail == ["refused"] * 20, "with 2 held and a limit of 1, got %r" % tail
    cli_ok("set", "-s", shim.segment, "x", "max_connections", "5")
    wait_until(lambda: loop.line() == "ok", 5, 0, "admissions after raising the limit")
    assert all(loop.line() == "ok" for _ in range(20))
    loop.kill()


def test_set_enforce_off_observes_and_errno_and_timeouts_are_live():
    srv, shim = _one(1)
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    cli_ok("set", "-s", shim.segment, "x", "errno", "EAGAIN")
    t = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not t["ok"] and t["errno"] == errno.EAGAIN, "errno EAGAIN not applied: %r" % t
    cli_ok("set", "-s", shim.segment, "x", "enforce", "off")
    t = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert t["ok"], "observe mode refused a connect: %r" % t
    c = shim.expect("x", enforce=False, in_use=2, over=1)
    assert c["would_reject"]["full"] == 1, json.dumps(c)
    cli_ok("set", "-s", shim.segment, "x", "enforce", "on")
    # EAGAIN cannot go with max_inflight (a spin): back to ECONNREFUSED first.
    for key, value in (("max_wait_ms", "250"), ("max_waiting", "3"), ("connect_timeout_ms", "900"),
                       ("io_timeout_ms", "1200"), ("errno", "ECONNREFUSED"),
                       ("max_inflight", "7")):
        cli_ok("set", "-s", shim.segment, "x", key, value)
    shim.expect("x", enforce=True, max_wait_ms=250, max_waiting=3, connect_timeout_ms=900,
                io_timeout_ms=1200, inflight_limit=7, errno="ECONNREFUSED")
    assert a.finish() == 0


def test_set_rejects_bad_input_with_clear_errors():
    srv, shim = _one(4)
    a = Agent(shim.env())
    a("tcp(%d)" % srv.port)
    seg = shim.segment
    cli_fails("set", "-s", seg, "nope", "max_connections", "2", want=r'no compartment "nope".*x')
    cli_fails("set", "-s", seg, "x", "colour", "2", want=r'unknown key "colour"')
    cli_fails("set", "-s", seg, "x", "max_connections", "0", want=r"between 1 and 1000000")
    cli_fails("set", "-s", seg, "x", "max_connections", "2000000", want=r"between 1 and 1000000")
    cli_fails("set", "-s", seg, "x", "max_connections", "ten", want=r"whole number")
    cli_fails("set", "-s", seg, "x", "max_wait_ms", "600001", want=r"between 0 and 600000")
    cli_fails("set", "-s", seg, "x", "enforce", "maybe", want=r"on or off")
    cli_fails("set", "-s", seg, "x", "errno", "EPERM", want=r'unknown errno "EPERM"')
    cli_fails("set", "-s", seg, "x", "class.batch", "1", want=r'no class "batch"')
    cli_fails("set", "-s", seg, "x", "max_connections", status=2, want=r"usage: bulkshim set")
    shim.expect("x", limit=4, enforce=True)
    assert a.finish() == 0


def test_set_refused_on_a_segment_this_user_cannot_write():
    if os.geteuid() != 0:
        print("SKIP: needs root to create a root-owned segment and run as nobody")
        return
    if shutil.which("setpriv") is None:
        print("SKIP: setpriv (util-linux) is missing")
        return
    seg = new_segment()
    cfg = write_file(config_text([{"name": "x", "destinations": ["127.0.0.1:9"],
                                   "max_connections": 5}], seg, {"mode": "0600"}))
    create_segment(cfg)
    st = os.stat(harness.SHM_PREFIX + seg)
    assert st.st_uid == 0 and st.st_mode & 0o777 == 0o600, oct(st.st_mode)
    # A copy nobody can surely execute, whatever the checkout's permissions.
    d = tmpdir()
    os.chmod(d, 0o755)
    exe = os.path.join(d, "bulkshim")
    shutil.copy(CLI, exe)
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", exe,
                        "set", "-s", seg, "x", "max_connections", "1"],
                       capture_output=True, text=True, timeout=20, env=clean_env())
    assert r.returncode == 1, "set as nobody exited %d: %r" % (r.returncode, r.stderr)
    want = "permission denied: you cannot change segment %s (owner uid 0, mode 0600)" % seg
    assert want in r.stderr, "stderr %r lacks %r" % (r.stderr, want)
    assert harness.comp_of(harness.status_json(seg), "x")["limit"] == 5


# ---- reload ----

def test_reload_applies_limits_and_refuses_new_compartments():
    srv, shim = _one(2)
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    text = config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % srv.port],
                         "max_connections": 7, "max_wait_ms": 100}], shim.segment)
    with open(shim.config, "w") as f:
        f.write(text)
    out = cli_ok("reload", "-c", shim.config)
    assert "max_connections 2 -> 7" in out, out
    shim.expect("x", limit=7, max_wait_ms=100, in_use=1)

    bigger = write_file(config_text([
        {"name": "x", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 3},
        {"name": "y", "destinations": ["127.0.0.1:9"], "max_connections": 3}], shim.segment))
    cli_fails("reload", "-c", bigger, want=r'compartment "y".*not in segment(.|\n)*restart')
    shim.expect("x", limit=7)
    bad = write_file(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % srv.port],
                                   "max_connections": 0}], shim.segment))
    cli_fails("reload", "-c", bad, want=re.escape(bad) + r":\d+:")
    cli_fails("reload", "-s", shim.segment, status=2, want=r"usage: bulkshim reload")
    assert harness.status_json(shim.segment)["generation"] == 1
    assert a.finish() == 0


# ---- reset ----

def test_reset_zeroes_counters_not_permits():
    srv, shim = _one(2)
    a = Agent(shim.env(log="off"))
    held = [a("tcp(%d)" % srv.port) for _ in range(2)]
    for _ in range(3):
        assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port))
    c = shim.expect("x", in_use=2, admitted=2, rejected=3)
    assert c["rejected_by"]["full"] == 3
    assert cli_json("suggest", "-s", shim.segment, "--json")["compartments"][0]["samples"] == 2

    out = cli_ok("reset", "-s", shim.segment, "x")
    assert "reset" in out
    c = shim.expect("x", in_use=2, limit=2, peak=2, admitted=0, rejected=0, last_rejection_ms=0)
    assert not any(c["rejected_by"].values()), c["rejected_by"]
    sug = cli_json("suggest", "-s", shim.segment, "--json")["compartments"][0]
    assert sug["samples"] == 0 and sug["peak_rate"] == 0, "histograms and rates not reset: %r" % sug
    assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port)), "reset gave permits back"
    a.call("close(%d)" % held[0])
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    shim.expect("x", in_use=2, admitted=1, rejected=1)
    cli_ok("reset", "-c", shim.config)
    shim.expect("x", admitted=0, rejected=0, in_use=2)
    cli_fails("reset", "-s", shim.segment, "nope", want=r'no compartment "nope"')
    assert a.finish() == 0


# ---- watch ----

def test_watch_in_tmux_shows_bars_hot_first_and_q_quits():
    tmux = need_tool("tmux", "tmux")
    if tmux is None:
        return
    srv, cool = Server(), Server()
    seg = new_segment()
    cfg = write_file(config_text([
        {"name": "cool", "destinations": ["127.0.0.1:%d" % cool.port], "max_connections": 10},
        {"name": "busy", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 5}], seg))
    a = Agent(harness.shim_env(cfg, log="off"))
    for _ in range(5):
        a("tcp(%d)" % srv.port)
    a("tcp(%d)" % cool.port)
    assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port))
    t = Tmux(tmux)
    t.start("%s watch -s %s -i 0.2" % (CLI, seg))
    screen = t.wait_screen(lambda s: "busy" in s and "cool" in s and "5/5" in s, 5,
                           "both compartments")
    lines = screen.splitlines()
    busy = [i for i, l in enumerate(lines) if l.startswith("busy")][0]
    cool_i = [i for i, l in enumerate(lines) if l.startswith("cool")][0]
    assert busy < cool_i, "the hot compartment is not first:\n%s" % screen
    assert "HOT" in lines[busy] and "[" + "#" * 5 in lines[busy], lines[busy]
    assert "1/10" in lines[cool_i] and "HOT" not in lines[cool_i], lines[cool_i]
    assert re.search(r"1 process\b", screen), "processes attached not shown:\n%s" % screen
    assert "\x1b" not in screen
    t("send-keys", "q")
    wait_until(lambda: not t.alive(), 5, 0.05, "watch to quit on q")

    # ^C in a shell: the terminal is back in canonical mode with echo.
    stty = os.path.join(tmpdir(), "stty.txt")
    t.start("sh")
    t("send-keys", "%s watch -s %s; stty -a > %s" % (CLI, seg, stty), "Enter")
    t.wait_screen(lambda s: "busy" in s and "HOT" in s, 5, "watch in a shell")
    t("send-keys", "C-c")
    wait_until(lambda: os.path.exists(stty) and os.path.getsize(stty) > 0, 5, 0.05, "stty output")
    modes = open(stty).read().split()
    assert "icanon" in modes and "echo" in modes, "tty not restored after ^C: %s" % modes
    assert a.finish() == 0


def test_watch_into_a_pipe_prints_plain_lines():
    srv, shim = _one(2)
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    r = cli("watch", "-s", shim.segment, "-i", "0.2", "-n", "3",
            env=dict(clean_env(), TERM="xterm"))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout, "escape codes in a pipe: %r" % r.stdout[:300]
    frames = [f for f in r.stdout.split("\n\n") if f.strip()]
    assert len(frames) == 3, "want 3 refreshes, got %d: %r" % (len(frames), r.stdout)
    for f in frames:
        assert "segment %s, 1 process holding permits" % shim.segment in f, f
        row = [l for l in f.splitlines() if l.startswith("x ")]
        assert row and "1/2" in row[0], f
    cli_fails("watch", "-s", shim.segment, "-i", "0", status=2, want=r"-i wants seconds")
    r = cli("watch", "-s", shim.segment, "-n", "1", env=dict(clean_env(), TERM="dumb"))
    assert r.returncode == 0 and "\x1b" not in r.stdout
    assert a.finish() == 0


# ---- metrics ----

def _live_segment_with_rejections(limit=2, refused=3):
    """A server, a Shim of one compartment with limit, and an Agent holding limit connections
    after refused attempts were refused."""
    srv, shim = _one(limit)
    a = Agent(shim.env(log="off"))
    for _ in range(limit):
        a("tcp(%d)" % srv.port)
    for _ in range(refused):
        assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port))
    return srv, shim, a


def test_metrics_pass_promtool_with_the_live_values():
    promtool = need_tool("promtool", "prometheus")
    srv, shim, a = _live_segment_with_rejections()
    text = cli_ok("metrics", "-s", shim.segment)
    lab = {"segment": shim.segment, "compartment": "x"}
    assert sample(text, "bulkshim_compartment_in_use", **lab) == 2
    assert sample(text, "bulkshim_compartment_limit", **lab) == 2
    assert sample(text, "bulkshim_admitted_total", **lab) == 2
    assert sample(text, "bulkshim_rejections_total", reason="full", **lab) == 3
    assert sample(text, "bulkshim_rejections_total", reason="wait_timeout", **lab) == 0
    assert sample(text, "bulkshim_timeouts_total", kind="io", **lab) == 0
    assert sample(text, "bulkshim_processes", segment=shim.segment) == 1
    for h in ("bulkshim_connect_seconds", "bulkshim_reply_seconds", "bulkshim_wait_seconds"):
        assert "# TYPE %s histogram" % h in text, h
        buckets = [float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith(h + "_bucket{")]
        assert buckets == sorted(buckets), "%s buckets are not cumulative" % h
        assert buckets[-1] == sample(text, h + "_count", **lab)
    assert 'bulkshim_connect_seconds_bucket{segment="%s",compartment="x",le="+Inf"} 2' % (
        shim.segment) in text
    assert 'le="0.000001"' in text and 'le="1.048576"' in text
    # Outside a fleet, no fleet series at all (not a fleet_limit of 0).
    assert not re.search(r"^bulkshim_fleet_\w+\{", text, re.M), text
    if promtool is None:
        return
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, "promtool check metrics: %s%s" % (r.stdout, r.stderr)
    assert a.finish() == 0


# ---- check ----

def test_check_prints_budget_bars_and_rejects_bad_configs_with_their_line():
    seg = new_segment()
    good = write_file(config_text([
        {"name": "pay", "destinations": ["127.0.0.1:1"], "max_connections": 40},
        {"name": "recs", "destinations": ["127.0.0.1:2"], "max_connections": 25,
         "max_inflight": 8, "max_wait_ms": 100}], seg, {"budget": {"pool": 100, "reserved": 10}}))
    out = cli_ok("check", good)
    lines = out.splitlines()
    assert lines[0].startswith(good + ": ok"), out
    pay = [l for l in lines if l.strip().startswith("pay ")][0]
    assert "#" * 16 + "." in pay, "40 of a pool of 100 in 40 cells is 16: %r" % pay
    assert any("max_inflight 8" in l and "max_wait_ms 100" in l for l in lines), out
    assert any(l.strip().startswith("(reserved)") and "rrrr" in l for l in lines), out
    total = [l for l in lines if l.strip().startswith("total")][0]
    assert " 75 " in total and "of a pool of 100" in total and "=" * 30 in total, total
    assert cli_ok("check", "-q", good) == ""

    bad = [
        ('segment = "%s";\nbudget = { pool = 50; reserved = 10; };\ncompartments = (\n'
         '  { name = "a"; destinations = [ "127.0.0.1:1" ]; max_connections = 30; },\n'
         '  { name = "b"; destinations = [ "127.0.0.1:2" ]; max_connections = 30; }\n);\n' % seg,
         r"budget"),
        ('segment = "%s";\ncompartments = (\n  { name = "a"; destinations = [ "127.0.0.1:1" ];\n'
         '    max_connections = 3;\n    max_waiting = 2; }\n);\n' % seg, r":5: max_waiting"),
        ('segment = "%s";\ncompartments = (\n  { name = "a"; destinations = [ "127.0.0.1:1" ];\n'
         '    max_conections = 3; }\n);\n' % seg, r":4: "),
    ]
    for text, want in bad:
        path = write_file(text)
        err = cli_fails("check", path, want=re.escape(path) + r":\d+")
        assert re.search(want, err), "%r does not match %r" % (err, want)
        err = cli_fails("check", "-q", path, want=re.escape(path))
    cli_fails("check", os.path.join(tmpdir(), "missing.cfg"), want=r"no such file")
    cli_fails("check", status=2, want=r"usage: bulkshim check")


# ---- size and suggest ----

def test_size_shows_littles_law_arithmetic():
    out = cli_ok("size", "--rps", "200", "--latency", "250ms")
    assert out.strip() == ("200 req/s \u00d7 0.250 s \u00d7 2.0 headroom \u00d7 (1 + 0 retries) "
                           "= 100 permits"), out
    assert cli_ok("size", "--rps", "200", "--latency", "0.25s").strip().endswith("= 100 permits")
    assert cli_ok("size", "--rps", "200", "--latency", "0.25").strip().endswith("= 100 permits")
    out = cli_ok("size", "--rps", "3", "--latency", "0.1", "--headroom", "1")
    assert out.strip().endswith("= 1 permit"), "0.3 rounds up to 1, not more: %r" % out
    out = cli_ok("size", "--rps", "120", "--latency", "75ms", "--headroom", "1.5", "--retries", "2")
    assert "120 req/s \u00d7 0.075 s \u00d7 1.5 headroom \u00d7 (1 + 2 retries) = 41 permits" in out, out
    j = cli_json("size", "--rps", "50", "--latency", "40ms", "--retries", "1", "--json")
    assert j == {"rps": 50, "latency_s": 0.04, "headroom": 2, "retries": 1, "permits": 8}, j
    cli_fails("size", "--rps", "200", status=2, want=r"usage: bulkshim size")
    cli_fails("size", "--rps", "-1", "--latency", "1", status=2)
    cli_fails("size", "--rps", "10", "--latency", "5 minutes", status=2, want=r"units")


def test_size_refuses_a_bare_latency_that_is_likely_milliseconds():
    # "--latency 250" meant 250 ms; read as seconds it gave 100,000 permits.
    cli_fails("size", "--rps", "200", "--latency", "250", status=2,
              want=r"--latency 250 has no unit.*write 250ms for milliseconds, or 250s")
    cli_fails("size", "--rps", "200", "--latency", "60.5", status=2, want=r"no unit")
    assert cli_ok("size", "--rps", "200", "--latency", "60").strip().endswith("= 24000 permits")
    assert cli_ok("size", "--rps", "200", "--latency", "250s").strip().endswith("= 100000 permits")


def test_suggest_arithmetic_on_recorded_values():
    seg = new_segment()
    cfg = write_file(config_text([
        {"name": "small", "destinations": ["127.0.0.1:1"], "max_connections": 20},
        {"name": "large", "destinations": ["127.0.0.1:2"], "max_connections": 100},
        {"name": "fit", "destinations": ["127.0.0.1:3"], "max_connections": 10},
        {"name": "observed", "destinations": ["127.0.0.1:4"], "max_connections": 4,
         "enforce": False},
        {"name": "idle", "destinations": ["127.0.0.1:5"], "max_connections": 4},
    ], seg))
    create_segment(cfg)
    # small: 90 replies under 2^15 us, 10 under 2^18 us: p50 0.032768 s, p99 0.262144 s.
    poke(seg, "small", peak_rate=200, rejected=37, **{"rejected_by[0]": 37, "h_reply.bucket[15]": 90,
                                                     "h_reply.bucket[18]": 10, "h_reply.count": 100,
                                                     "rate_ago[0]": 30, "rate_ago[3]": 45,
                                                     "rate_ago[70]": 999})
    poke(seg, "large", peak_rate=10, **{"h_reply.bucket[10]": 50, "h_reply.count": 50})
    # fit: connects timed, nothing held: a connect's time says nothing of a hold.
    poke(seg, "fit", peak_rate=50, **{"h_connect.bucket[16]": 100, "h_connect.count": 100})
    poke(seg, "observed", peak_rate=100, **{"would_reject[0]": 5, "h_reply.bucket[17]": 8,
                                             "h_reply.count": 8})
    j = cli_json("suggest", "-s", seg, "--json")
    by = {c["name"]: c for c in j["compartments"]}
    s = by["small"]
    assert (s["peak_rate"], s["recent_peak_rate"], s["latency_source"]) == (200, 45, "reply"), s
    assert (s["p50_s"], s["p99_s"], s["suggested"]) == (0.032768, 0.262144, 105), s
    assert (s["limit"], s["refused"], s["verdict"]) == (20, 37, "too small"), s
    l = by["large"]
    assert (l["p99_s"], l["suggested"], l["verdict"]) == (0.001024, 1, "too large"), l
    f = by["fit"]
    assert (f["latency_source"], f["p99_s"], f["suggested"], f["verdict"]) == (
        "connect", 0.065536, 0, "no data"), f
    o = by["observed"]
    assert (o["enforce"], o["suggested"], o["refused"], o["verdict"]) == (False, 27, 5, "too small"), o
    assert by["idle"]["verdict"] == "no data", by["idle"]

    text = cli_ok("suggest", "-s", seg)
    assert "upper bounds" in text
    assert "ceil(200/s \u00d7 0.262144 s \u00d7 2) = 105 permits" in text, text
    assert "p50 <= 0.032768 s, p99 <= 0.262144 s (reply, 100 samples)" in text, text
    assert "highest in the last 64 s: 45/s" in text, text
    assert "too small: raise max_connections to 105" in text, text
    assert "would have refused (observe mode) 5 calls" in text, text
    assert "too large" in text


# A thread per connection: connect, hold it `hold` seconds, close, again, for `seconds`.
HOLDERS = r'''
import socket, sys, threading, time
port, n, hold, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + seconds
def work():
    while time.monotonic() < end:
        try:
            s = socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            time.sleep(0.05)
            continue
        time.sleep(hold)
        s.close()
ts = [threading.Thread(target=work) for _ in range(n)]
for t in ts: t.start()
for t in ts: t.join()
'''


def test_suggest_sizes_connections_from_how_long_they_are_held():
    # 4 threads each holding a connection 0.2 s at a time, limit 10, nothing refused: 4 open
    # on average, 20 admitted a second, a hold of 0.2 s; demand 4, 8 permits: it fits.
    srv, shim = _one(10)
    load = subprocess.Popen([PY, "-c", HOLDERS, str(srv.port), "4", "0.2", "4"],
                            env=shim.env(log="off"))
    harness.defer(load.kill)
    def holding():
        # The segment may not exist yet, or be half made by the first client.
        r = cli("status", "-s", shim.segment, "--json")
        return r.returncode == 0 and json.loads(r.stdout)["compartments"][0]["in_use"] >= 3
    wait_until(holding, timeout=10)
    c = cli_json("suggest", "-s", shim.segment, "--window", "2", "--json", timeout=30)
    load.wait(30)
    x, co = c["compartments"][0], c["compartments"][0]["connections"]
    assert 3 <= co["mean_open"] <= 4.2 and co["peak"] == 4, co
    assert 0.15 <= co["mean_hold_s"] <= 0.35, co
    assert co["demand"] == 4 and x["suggested"] == 8 and x["verdict"] == "fits", x


def test_suggest_counts_what_refused_callers_would_have_held():
    # 12 clients each holding one connection at a limit of 8: 8 held, 4 refused. The demand is
    # 12, not what a connect's time would say; a compartment that refused never "fits".
    srv, shim, a = _live_segment_with_rejections(8, 4)
    c = cli_json("suggest", "-s", shim.segment, "--window", "0.5", "--json", timeout=30)
    x, co = c["compartments"][0], c["compartments"][0]["connections"]
    assert co["mean_open"] == 8 and co["asked_ratio_from"] == "lifetime", co
    assert co["demand"] == 12 and x["suggested"] == 24, x
    assert (x["refused"], x["verdict"]) == (4, "too small"), x
    text = cli_ok("suggest", "-s", shim.segment, "--window", "0.5")
    assert "held longer than the window" in text and "raise max_connections to 24" in text, text
    # Refused although the measured demand fits: never "fits".
    seg = new_segment()
    cfg = write_file(config_text([{"name": "adaptive", "destinations": ["127.0.0.1:6"],
                                   "max_connections": 64}], seg))
    create_segment(cfg)
    poke(seg, "adaptive", peak_rate=30, **{"rejected_by[0]": 41860, "h_connect.bucket[10]": 9,
                                           "h_connect.count": 9})
    x = cli_json("suggest", "-s", seg, "--window", "0.2", "--json")["compartments"][0]
    assert (x["refused"], x["verdict"]) == (41860, "refused"), x
    assert a.finish() == 0


# ---- list ----

def test_list_shows_live_segments_and_invalid_ones():
    srv, shim = _one(3)
    a = Agent(shim.env())
    a("tcp(%d)" % srv.port)
    junk = new_segment()
    with open(harness.SHM_PREFIX + junk, "wb") as f:
        f.write(b"\0" * 8192)
    j = cli_json("list", "--json")
    by = {s["name"]: s for s in j["segments"]}
    mine = by.get(shim.segment)
    assert mine and mine["valid"] and mine["processes"] == 1 and mine["compartments"] == ["x"], mine
    assert mine["owner"] and mine["size"] == os.stat(harness.SHM_PREFIX + shim.segment).st_size
    bad = by.get(junk)
    assert bad and not bad["valid"] and "magic" in bad["reason"], bad
    text = cli_ok("list")
    row = [l for l in text.splitlines() if l.startswith(shim.segment + " ")]
    assert row and row[0].split()[3] == "1" and row[0].split()[4] == "x", text
    assert any(l.startswith(junk + " ") and "invalid" in l for l in text.splitlines()), text
    assert a.finish() == 0
    mine = {s["name"]: s for s in cli_json("list", "--json")["segments"]}[shim.segment]
    assert mine["processes"] == 0, "the agent exited: %r" % mine


# ---- run ----

MARKER_C = """
#include <stdlib.h>
__attribute__((constructor)) static void marker(void) { setenv("BS_MARKER", "loaded", 1); }
"""


def test_bulkshim_run_preloads_limits_and_returns_status():
    need_built(CLI, LIB)
    srv = Server()
    shim = Shim([{"name": "run", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 2}])
    src = write_file(MARKER_C, suffix=".c")
    marker = os.path.join(tmpdir(), "marker.so")
    cc = subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", marker, src],
                        capture_output=True, text=True)
    assert cc.returncode == 0, "cannot build the marker library: %s" % cc.stderr
    env = clean_env()
    env["LD_PRELOAD"] = marker
    env["BULKSHIM_LOG"] = "off"
    script = write_file(CONNECT_PROBE, suffix=".py")
    for argv in ([CLI, "run", "-c", shim.config, "--", PY, "-c", CONNECT_PROBE, str(srv.port)],
                 [CLI, "run", "-c", shim.config, PY, script, str(srv.port)]):
        r = run(argv, env)
        assert r.returncode == 3, "%s: exit %d, want the command's 3 (stderr %r)" % (
            " ".join(argv[:5]), r.returncode, r.stderr)
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["res"] == ["ok", "ok", "refused"], "not limited under bulkshim run: %r" % got
        assert got["mapped"], "libbulkshim.so not mapped in the command"
        assert marker in got["preload"].replace(":", " ").split(), \
            "the pre-existing LD_PRELOAD entry was dropped: %r" % got["preload"]
        assert got["marker"] == "loaded", "the pre-existing preload did not load"
        shim.expect("run", in_use=0, rejected=1 if argv[4] == "--" else 2)


# ---- install ----

def test_make_install_and_uninstall_honour_prefix_and_destdir():
    if shutil.which("make") is None:
        print("SKIP: make is missing")
        return
    d = tmpdir()
    build, prefix = os.path.join(d, "build"), os.path.join(d, "prefix")
    env = clean_env()

    def make(*args):
        r = subprocess.run(["make", "-s", "-j4", "-C", ROOT, "B=" + build] + list(args),
                           capture_output=True, text=True, timeout=240, env=env)
        assert r.returncode == 0, "make %s: %s" % (" ".join(args), (r.stderr or r.stdout)[-3000:])

    make("PREFIX=" + prefix, "install")
    want = ["bin/bulkshim", "lib/bulkshim/libbulkshim.so", "share/man/man1/bulkshim.1",
            "share/man/man5/bulkshim.conf.5", "share/man/man7/libbulkshim.7"]
    for w in want:
        assert os.path.isfile(os.path.join(prefix, w)), "make install did not install %s" % w
    # The man pages name the paths of this install, not /usr/local.
    for w in want[2:]:
        page = open(os.path.join(prefix, w)).read()
        assert "/usr/local/lib/bulkshim" not in page and \
            "/usr/local/share/doc/bulkshim" not in page, "%s names /usr/local" % w
    assert os.path.join(prefix, "lib/bulkshim/libbulkshim.so") in open(
        os.path.join(prefix, want[4])).read(), "libbulkshim(7) does not name the installed library"
    configs = os.listdir(os.path.join(prefix, "share/doc/bulkshim/configs"))
    assert configs and all(c.endswith(".cfg") for c in configs), configs
    # The installed CLI, away from the build tree, finds the installed library.
    cfg = write_file(config_text([{"name": "x", "destinations": ["127.0.0.1:9"],
                                   "max_connections": 1}], new_segment()))
    r = subprocess.run([os.path.join(prefix, "bin/bulkshim"), "run", "-c", cfg, "--", "sh", "-c",
                        'echo "$LD_PRELOAD"'], capture_output=True, text=True, env=env, timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(prefix, "lib/bulkshim/libbulkshim.so"), r.stdout

    make("PREFIX=" + prefix, "uninstall")
    left = [os.path.join(p, f) for p, _, fs in os.walk(prefix) for f in fs]
    assert not left, "make uninstall left %s" % left

    dest = os.path.join(d, "dest")
    make("DESTDIR=" + dest, "PREFIX=/usr", "install")
    for w in want:
        assert os.path.isfile(os.path.join(dest, "usr", w)), "DESTDIR install lacks usr/%s" % w
    with open(os.path.join(dest, "usr/bin/bulkshim"), "rb") as f:
        assert b"/usr/lib/bulkshim" in f.read(), "the CLI does not look in PREFIX/lib/bulkshim"
    make("DESTDIR=" + dest, "PREFIX=/usr", "uninstall")
    left = [os.path.join(p, f) for p, _, fs in os.walk(dest) for f in fs]
    assert not left, "make uninstall left %s" % left


# It builds the whole tree (the library with link-time optimisation, the BPF program) in a
# build folder of its own, as make install does on a fresh checkout: on two busy cores that
# takes longer than the runner's usual minute.
test_make_install_and_uninstall_honour_prefix_and_destdir.time_limit = 240
