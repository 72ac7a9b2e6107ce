"""test_drill.py - `bulkshim drill`: a delay on one compartment of the demo's shop is contained with
limits and leaks without them (the shop's own endpoints as witnesses), a stall ends at its deadline
even when the CLI is SIGKILLed, `drill stop` ends one at once, the refusals (no `drills = true;`,
--for past the maximum, no attached process), --json and --plot, and status and metrics while a
drill runs and after.

The faults are the library's: the tests that need them skip, saying so, in a tree whose config
loader does not take the `drills` key yet.
"""

import json
import os
import re
import select
import signal
import subprocess
import time

import harness
from harness import PY, Server, new_segment, shim_env, status_json, wait_until
from harness_cli import (cli, cli_fails, cli_ok, config_file, create_segment, hold_connections,
                         need_tool, sample)


# ---- what the tests share ----

def _need_drills():
    """Skips the test unless the config loader takes `drills = true;` (the
    library's half of drills, which does the faults)."""
    seg = new_segment()
    cfg = config_file(seg, [{"name": "a", "destinations": ["127.0.0.1:9"], "max_connections": 1}],
                      top={"drills": True})
    r = cli("check", "-q", cfg)
    if r.returncode != 0:
        raise harness.Skip("the library side of drills is not in this tree (check: %s)" %
                           (r.stderr or r.stdout).strip()[:200])


def _dep_config(port, drills=True, **comp):
    """A config whose compartment dep matches 127.0.0.1:port; returns (segment, path)."""
    seg = new_segment()
    c = {"name": "dep", "destinations": ["127.0.0.1:%d" % port], "max_connections": 4}
    c.update(comp)
    return seg, config_file(seg, [c], top={"drills": True} if drills else None)


def _demo(name):
    """The demo's program name (BUILD/demo/NAME), built if missing: in the
    build folder the tests use (build/asan under check-sanitize)."""
    path = os.path.join(harness.BUILD, "demo", name)
    if not os.access(path, os.X_OK):
        r = subprocess.run(["make", "-s", "B=" + os.path.abspath(harness.BUILD), path],
                           cwd=harness.ROOT, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, "make demo-bin: %s" % r.stderr[-1000:]
    return path


def _kill(p):
    if p.poll() is None:
        p.kill()
    p.wait(10)


def _spawn(argv, env=None, port_file=None):
    """Starts argv (output to a file of the test's directory); with
    port_file, waits for the port it writes there and returns (p, port)."""
    log = open(os.path.join(harness.tmpdir(), harness.unique("log") + ".txt"), "w")
    p = subprocess.Popen(argv, env=env or harness.clean_env(), stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log)
    log.close()
    harness.defer(_kill, p)
    if port_file is None:
        return p, None
    wait_until(lambda: os.path.exists(port_file) or p.poll() is not None, 10,
               what="%s to listen" % os.path.basename(argv[0]))
    assert p.poll() is None, "%s exited %s" % (argv[0], p.returncode)
    return p, int(open(port_file).read())


class Shop:
    """The demo's shop (8 workers) preloaded with a config: payments for
    /checkout and recommendations (max_connections 2, enforce as given) for
    /home, each a demo backend answering in 5 ms."""

    def __init__(self, enforce=True):
        d = harness.tmpdir()
        ports = {}
        for name in ("payments", "recommendations"):
            pf = os.path.join(d, harness.unique(name) + ".port")
            ports[name] = _spawn([_demo("backend"), "-n", name, "-d", "5", "-p", pf],
                                 port_file=pf)[1]
        self.segment = new_segment()
        self.config = config_file(self.segment, [
            {"name": "payments", "destinations": ["127.0.0.1:%d" % ports["payments"]],
             "max_connections": 16},
            {"name": "recommendations",
             "destinations": ["127.0.0.1:%d" % ports["recommendations"]],
             "max_connections": 2, "enforce": enforce}], top={"drills": True})
        pf = os.path.join(d, harness.unique("shop") + ".port")
        self.p, self.port = _spawn([_demo("shop"), "--payments", "127.0.0.1:%d" % ports["payments"],
                                    "--recommendations", "127.0.0.1:%d" % ports["recommendations"],
                                    "-w", "8", "-p", pf], env=shim_env(self.config), port_file=pf)
        self.url = "http://127.0.0.1:%d" % self.port

    def load(self, home_rate, seconds):
        """The demo's open-loop load on /home, for a bounded time."""
        return _spawn([_demo("load"), "-t", "127.0.0.1:%d" % self.port, "-r", str(home_rate),
                       "-c", "0", "-d", str(seconds), "-T", "5", "-o", os.devnull])[0]


class Client:
    """A preloaded client connected to port: on go() it sends one byte and
    blocks in recv; result() is (seconds in recv, CLOCK_REALTIME ms when it
    returned, the bytes)."""

    CODE = ("import json,socket,sys,time\n"
            "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
            "print('up',flush=True)\nsys.stdin.readline()\n"
            "s.sendall(b'x');t0=time.monotonic();d=s.recv(1)\n"
            "print(json.dumps({'waited':time.monotonic()-t0,'at_ms':time.time()*1000,"
            "'data':d.decode()}),flush=True)\nsys.stdin.read()\n")

    def __init__(self, config, port):
        self.p = subprocess.Popen([PY, "-c", self.CODE, str(port)], env=shim_env(config),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        harness.defer(_kill, self.p)
        assert self.p.stdout.readline().strip() == "up"

    def go(self):
        self.p.stdin.write("go\n")
        self.p.stdin.flush()

    def result(self, timeout):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "the client's recv did not return within %ss" % timeout
        return json.loads(self.p.stdout.readline())


def _drill_bg(*args):
    """bulkshim drill ARGS in the background; stdout and stderr in files."""
    d = harness.tmpdir()
    out, err = (os.path.join(d, harness.unique(n) + ".txt") for n in ("out", "err"))
    with open(out, "w") as o, open(err, "w") as e:
        p = subprocess.Popen([harness.CLI, "drill"] + [str(a) for a in args],
                             env=harness.clean_env(), stdout=o, stderr=e)
    harness.defer(_kill, p)
    p.out, p.err = out, err
    return p


def _running_drill(segment, comp, timeout=5):
    """Waits for status --json to show a drill on comp; returns its object."""
    return wait_until(lambda: harness.comp_of(status_json(segment), comp).get("drill"), timeout,
                      0.05, "a drill on %s in status --json" % comp)


# ---- refused or not run: these need nothing of the library ----

def test_drill_without_the_drills_key_is_refused_and_changes_nothing():
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port, drills=False)
    hold_connections(cfg, srv.port, 1)
    before = status_json(seg)
    err = cli_fails("drill", "-c", cfg, "dep", "--delay", "1s", "--for", "2s", status=2,
                    want=r"drills are not allowed in compartment dep: add `drills = true;` to ")
    assert cfg in err, "the refusal does not name %s: %r" % (cfg, err)
    after = status_json(seg)
    assert harness.comp_of(after, "dep").get("drill", "missing") is None, after
    assert [c.get("drill") for c in before["compartments"]] == \
        [c.get("drill") for c in after["compartments"]]
    assert after["generation"] == before["generation"]
    metrics = cli_ok("metrics", "-s", seg, "--no-histograms")
    assert sample(metrics, "bulkshim_drill_active", compartment="dep") == 0


def test_drill_for_past_ten_minutes_and_without_a_fault_are_usage_errors():
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port, drills=False)
    create_segment(cfg)
    cli_fails("drill", "-c", cfg, "dep", "--delay", "1s", "--for", "11m", status=2,
              want=r"--for 11m: a drill lasts 10m at most")
    cli_fails("drill", "-c", cfg, "dep", "--for", "5s", status=2, want=r"no fault")
    cli_fails("drill", "-c", cfg, "dep", "--delay", "soon", status=2, want=r"not a delay")
    cli_fails("drill", "-c", cfg, "dep", "--stall", "--fraction", "0", status=2,
              want=r"not a fraction")
    cli_fails("drill", "-c", cfg, "nosuch", "--stall", status=2, want=r"no compartment \"nosuch\"")


def test_drill_on_a_segment_with_no_process_is_not_run():
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port, drills=False)
    create_segment(cfg)
    cli_fails("drill", "-c", cfg, "dep", "--stall", "--for", "2s", status=3,
              want=r"no process is attached to segment %s.*--force" % re.escape(seg))
    assert harness.comp_of(status_json(seg), "dep").get("drill", "missing") is None


# ---- with the library's faults ----

def test_force_drills_a_segment_with_no_process():
    _need_drills()
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port)
    create_segment(cfg)
    r = cli("drill", "-c", cfg, "dep", "--refuse", "--for", "1s", "--baseline", "0",
            "--after", "0", "--force", timeout=20)
    assert r.returncode == 0, "exit %d: %s %s" % (r.returncode, r.stdout, r.stderr)
    assert "verdict: contained" in r.stdout, r.stdout
    assert "--force" in r.stderr, r.stderr


def test_stall_ends_at_its_deadline_when_the_cli_is_killed():
    _need_drills()
    srv = Server("echo")
    seg, cfg = _dep_config(srv.port)
    client = Client(cfg, srv.port)
    p = _drill_bg("-c", cfg, "dep", "--stall", "--for", "3s", "--baseline", "0", "--after", "0")
    d = _running_drill(seg, "dep")
    assert d["faults"] == ["stall"] and d["by_pid"] == p.pid, d
    deadline_ms = d["started_ms"] + 3000
    client.go()
    time.sleep(1)
    p.send_signal(signal.SIGKILL)
    p.wait(5)
    res = client.result(10)
    assert res["data"] == "x", res
    # Stalled (not answered at once), and released at the deadline, not later.
    assert res["at_ms"] >= deadline_ms - 250, "recv returned %.0f ms before the deadline: %s" % (
        deadline_ms - res["at_ms"], res)
    assert res["at_ms"] <= deadline_ms + 1000, "recv returned %.0f ms after the deadline: %s" % (
        res["at_ms"] - deadline_ms, res)
    assert harness.comp_of(status_json(seg), "dep")["drill"] is None
    metrics = cli_ok("metrics", "-s", seg, "--no-histograms")
    assert sample(metrics, "bulkshim_drill_active", compartment="dep") == 0


def test_drill_stop_ends_a_stall_at_once():
    _need_drills()
    srv = Server("echo")
    seg, cfg = _dep_config(srv.port)
    client = Client(cfg, srv.port)
    p = _drill_bg("-c", cfg, "dep", "--stall", "--for", "60s", "--baseline", "0", "--after", "0")
    _running_drill(seg, "dep")
    client.go()
    time.sleep(1)
    t0 = time.monotonic()
    out = cli_ok("drill", "stop", "-c", cfg, "dep")
    assert re.search(r"stopped the drill on dep \(started by pid %d" % p.pid, out), out
    res = client.result(5)
    assert res["data"] == "x" and time.monotonic() - t0 < 1.5, res
    assert 0.8 < res["waited"] < 3, "the recv was not stalled until the stop: %s" % res
    # The drill's own CLI sees the stop and ends with its verdict.
    p.wait(10)
    assert "ended early" in open(p.out).read(), open(p.out).read()
    assert harness.comp_of(status_json(seg), "dep")["drill"] is None
    assert "no drill runs on dep" in cli_ok("drill", "stop", "-c", cfg, "dep")
test_drill_stop_ends_a_stall_at_once.time_limit = 90


def test_status_and_metrics_show_a_drill_while_it_runs_and_not_after():
    _need_drills()
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port)
    hold_connections(cfg, srv.port, 1)
    p = _drill_bg("-c", cfg, "dep", "--delay", "1s", "--for", "4s", "--baseline", "0",
                  "--after", "0")
    d = _running_drill(seg, "dep")
    assert d["faults"] == ["delay"] and d["delay_ms"] == 1000 and d["by_pid"] == p.pid, d
    assert 0 < d["remaining_seconds"] <= 4, d
    assert {"touched", "spared", "started_ms"} <= set(d), d
    text = cli_ok("status", "-s", seg)
    row = [l for l in text.splitlines() if l.startswith("dep ")]
    assert row and row[0].rstrip().endswith("DRILL"), text
    metrics = cli_ok("metrics", "-s", seg, "--no-histograms")
    assert sample(metrics, "bulkshim_drill_active", compartment="dep") == 1
    assert 0 < sample(metrics, "bulkshim_drill_remaining_seconds", compartment="dep") <= 4
    assert sample(metrics, "bulkshim_drill_touched_total", compartment="dep") >= 0
    assert p.wait(15) == 0, open(p.err).read()
    assert harness.comp_of(status_json(seg), "dep")["drill"] is None
    assert "DRILL" not in cli_ok("status", "-s", seg)
    metrics = cli_ok("metrics", "-s", seg, "--no-histograms")
    assert sample(metrics, "bulkshim_drill_active", compartment="dep") == 0
    assert "bulkshim_drill_touched_total{" not in metrics, metrics


def test_json_has_the_verdict_and_plot_draws_a_png():
    _need_drills()
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port)
    hold_connections(cfg, srv.port, 1)
    args = ["drill", "-c", cfg, "dep", "--refuse", "--for", "1s", "--baseline", "1s",
            "--after", "1s", "--probe", "true"]
    r = cli(*(args + ["--json"]), timeout=30)
    assert r.returncode == 0, "exit %d: %s %s" % (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert {"verdict", "compartment", "faults", "phases", "compartments", "probes", "leaks"} <= set(j)
    assert j["verdict"] == "contained" and j["compartment"] == "dep" and j["faults"] == ["refuse"]
    assert j["leaks"] == [] and set(j["phases"]) == {"baseline", "drill", "after"}
    w = j["probes"][0]["windows"]["drill"]
    assert j["probes"][0]["probe"] == "true" and w["attempts"] >= 3 and w["ok"] == w["attempts"], j
    # Without gnuplot: said, and the verdict stands.
    env = dict(harness.clean_env(), PATH="/nonexistent")
    png = os.path.join(harness.tmpdir(), "drill.png")
    r = cli(*(args[:-2] + ["--plot", png]), env=env, timeout=30)
    assert r.returncode == 0 and "gnuplot not installed: no plot" in r.stderr, r.stderr
    assert not os.path.exists(png)
    if need_tool("gnuplot", "gnuplot-nox") is None:
        return
    r = cli(*(args + ["--plot", png]), timeout=30)
    assert r.returncode == 0, r.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "no PNG in %s" % png
test_json_has_the_verdict_and_plot_draws_a_png.time_limit = 120


def test_delay_on_the_shop_is_contained_with_limits_and_leaks_without():
    """The demo's shop under load: a 2 s delay on recommendations parks at
    most 2 of its 8 workers with the limit, and checkout stays up; in observe
    mode every worker parks and checkout's probe says so."""
    _need_drills()
    # The probe is the feature beside the drilled one (/home is the drilled
    # feature itself: its requests that get a permit wait the delay by
    # design), judged with the default tolerance.
    drill = ["drill", "recommendations", "--delay", "2s", "--for", "6s"]
    for enforce in (True, False):
        shop = Shop(enforce=enforce)
        load = shop.load(40, 25)
        r = cli(*(drill[:1] + ["-c", shop.config] + drill[1:] +
                  ["--probe", shop.url + "/checkout"]), timeout=60)
        load.kill()
        if enforce:
            assert r.returncode == 0, "with limits: exit %d:\n%s%s" % (r.returncode, r.stdout,
                                                                       r.stderr)
            assert "verdict: contained" in r.stdout, r.stdout
        else:
            assert r.returncode == 1, "without limits: exit %d:\n%s%s" % (r.returncode, r.stdout,
                                                                          r.stderr)
            assert re.search(r"LEAKED: probe %s/checkout: (success|p99)" % re.escape(shop.url),
                             r.stdout), r.stdout
            assert "LEAKED: compartment recommendations" in r.stdout, r.stdout
test_delay_on_the_shop_is_contained_with_limits_and_leaks_without.time_limit = 180


def test_a_probe_that_fails_during_the_drill_is_a_leaked_wall():
    """The verdict from the probes alone: a command probe made to fail while
    the drill runs (a file the test creates then) and to succeed again after."""
    _need_drills()
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port)
    hold_connections(cfg, srv.port, 1)
    flag = os.path.join(harness.tmpdir(), "down")
    p = _drill_bg("-c", cfg, "dep", "--refuse", "--for", "3s", "--baseline", "2s", "--after",
                  "2s", "--probe", "test ! -e %s" % flag, "--probe-rate", "10")
    _running_drill(seg, "dep")
    open(flag, "w").close()
    wait_until(lambda: harness.comp_of(status_json(seg), "dep")["drill"] is None, 6, 0.05,
               "the drill's end")
    os.unlink(flag)
    assert p.wait(10) == 1, "exit %s: %s" % (p.returncode, open(p.out).read())
    out = open(p.out).read()
    assert re.search(r"LEAKED: probe test ! -e \S+: success \d+% during the drill, 100% before",
                     out), out
    assert "verdict: leaked: 1 wall leaked" in out, out


def test_sigterm_stops_the_drill_at_once_and_judges_what_was_measured():
    _need_drills()
    srv = Server("echo")
    seg, cfg = _dep_config(srv.port)
    client = Client(cfg, srv.port)
    p = _drill_bg("-c", cfg, "dep", "--stall", "--for", "60s", "--baseline", "0", "--json")
    _running_drill(seg, "dep")
    client.go()
    time.sleep(1)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    res = client.result(5)
    assert res["data"] == "x" and time.monotonic() - t0 < 1.5, res
    assert p.wait(10) == 0, open(p.err).read()
    j = json.loads(open(p.out).read())
    assert j["verdict"] == "contained" and j["interrupted"] is True, j
    # Judged on what was measured: about a second of drill, no after window.
    assert 500 <= j["phases"]["drill"]["ms"] < 5000 and j["phases"]["after"]["ms"] == 0, j
    assert harness.comp_of(status_json(seg), "dep")["drill"] is None


def test_sigint_during_the_baseline_runs_no_drill():
    _need_drills()
    srv = Server("hold")
    seg, cfg = _dep_config(srv.port)
    hold_connections(cfg, srv.port, 1)
    p = _drill_bg("-c", cfg, "dep", "--refuse", "--for", "5s", "--baseline", "5s")
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    assert p.wait(10) == 3, open(p.err).read()
    assert "verdict: not run" in open(p.out).read(), open(p.out).read()
    assert "refuse on dep" not in open(p.err).read(), "the drill started: %s" % open(p.err).read()
