"""test_live_limit.py - every view shows the limit admission enforces now and the level that binds
it (adaptive, fleet floor, pool, class), HOT means the next connect would be refused, and the
refusal line names what binds; a server's own count witnesses what was let through."""

import os
import subprocess

import harness
from harness import PY, Server, new_segment, shim_env, status_json, write_file
from harness_cli import cli, cli_ok, config_file, sample, web_comp


class Holder:
    """A process under config that tries n connections to port, keeps those
    that succeed until stop(), and says how many did; its stderr holds the
    library's refusal lines."""

    def __init__(self, config, port, n, extra=None):
        code = ("import socket,sys\nh=[]\nfor _ in range(%d):\n"
                "    try:\n        h.append(socket.create_connection(('127.0.0.1',%d),timeout=10))\n"
                "    except OSError: pass\nprint(len(h),flush=True)\nsys.stdin.read()\n" % (n, port))
        self.p = subprocess.Popen([PY, "-c", code], env=shim_env(config, extra=extra), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        harness.defer(self._kill)
        line = self.p.stdout.readline().strip()
        assert line.isdigit(), "holder said %r: %s" % (line, self._kill())
        self.held = int(line)

    def _kill(self):
        if self.p.poll() is None:
            self.p.kill()
        try:
            return self.p.communicate(timeout=10)[1]
        except (ValueError, subprocess.TimeoutExpired):
            return ""

    def stop(self):
        """Closes its connections; returns its stderr."""
        self.p.stdin.close()
        try:
            err = self.p.stderr.read()
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise AssertionError("holder did not exit within 10 s")
        return err


def _row(text, name):
    """The words of the first row of status text that starts with name."""
    rows = [l for l in text.splitlines() if l.split()[:1] == [name]]
    assert rows, "no row %s in:\n%s" % (name, text)
    return rows[0]


def _metrics(segment):
    return cli_ok("metrics", "-s", segment, "--no-histograms")


def _watch(segment):
    r = cli("watch", "-s", segment, "-i", "0.2", "-n", "1",
            env=dict(harness.clean_env(), TERM="dumb"))
    assert r.returncode == 0, r.stderr
    return r.stdout


# ---- an adaptive compartment cut below its static limit ----


def test_adaptive_cut_is_the_live_limit_everywhere_and_in_the_refusal_line():
    """max_connections 8 with an adaptive limit at 2: status (text, JSON), watch and
    metrics say 2 and "adaptive", HOT at 2 of 2, and the third connect's refusal says
    what binds; the server saw 2."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [web_comp(srv.port, 8, adaptive={"min": 1, "max": 8, "initial": 2})])
    h = Holder(cfg, srv.port, 3)
    srv.wait_live(2, timeout=10)
    assert h.held == 2 and srv.max_live == 2, (h.held, srv.max_live)
    row = _row(cli_ok("status", "-s", seg), "web")
    assert "2 adaptive" in row and "HOT" in row, row
    c = harness.comp_of(status_json(seg), "web")
    assert c["limit"] == 8 and c["adaptive"]["limit"] == 2, c
    assert c["live_limit"] == 2 and c["live_limit_by"] == "adaptive", c
    assert c["hot"] is True, c
    m = _metrics(seg)
    assert sample(m, "bulkshim_compartment_live_limit", compartment="web") == 2, m
    assert sample(m, "bulkshim_compartment_live_limit_by", compartment="web",
                  by="adaptive") == 1
    assert sample(m, "bulkshim_compartment_live_limit_by", compartment="web", by="static") == 0
    assert sample(m, "bulkshim_compartment_hot", compartment="web") == 1
    w = _watch(seg)
    assert "live limit 2 (adaptive)" in w and "HOT" in _row(w, "web"), w
    err = h.stop()
    assert "web full (2/2, adaptive limit; static 8): connect to 127.0.0.1:%d refused" \
        % srv.port in err, err


def test_adaptive_inflight_cut_is_the_inflight_live_limit():
    """max_inflight 64 with an adaptive limit at 6: status's IN FLIGHT table says
    "6 adaptive", JSON and metrics carry the in-flight live limit."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [web_comp(srv.port, 8, max_inflight=64,
                                     adaptive={"min": 1, "max": 64, "initial": 6})])
    h = Holder(cfg, srv.port, 1)
    text = cli_ok("status", "-s", seg)
    table = text[text.index("IN FLIGHT"):]
    assert "6 adaptive" in _row(table, "web"), text
    c = harness.comp_of(status_json(seg), "web")
    assert c["inflight_limit"] == 64, c
    assert c["inflight_live_limit"] == 6 and c["inflight_live_limit_by"] == "adaptive", c
    assert c["live_limit"] == 8 and c["live_limit_by"] == "static", c
    m = _metrics(seg)
    assert sample(m, "bulkshim_compartment_inflight_live_limit", compartment="web") == 6, m
    assert sample(m, "bulkshim_compartment_inflight_live_limit_by", compartment="web",
                  by="adaptive") == 1
    h.stop()


# ---- a fleet host on its floor ----


def test_fleet_host_on_its_floor_shows_the_floor_and_refuses_past_it():
    """A fleet budget with no agent running: the host holds its floor of 1, not its
    max_connections of 8, and every view and the refusal line say so."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [web_comp(srv.port, 8, fleet_limit=20, fleet_floor=1)],
                      top={"fleet": {"redis": "127.0.0.1:1", "name": harness.unique("f"),
                                     "host": "h1", "lease_ms": 1500}})
    h = Holder(cfg, srv.port, 2)
    srv.wait_live(1, timeout=10)
    assert h.held == 1 and srv.max_live == 1, (h.held, srv.max_live)
    row = _row(cli_ok("status", "-s", seg), "web")
    assert "1 fleet floor" in row and "HOT" in row, row
    c = harness.comp_of(status_json(seg), "web")
    assert c["limit"] == 8 and c["live_limit"] == 1 and c["live_limit_by"] == "fleet floor", c
    assert c["hot"] is True, c
    m = _metrics(seg)
    assert sample(m, "bulkshim_compartment_live_limit", compartment="web") == 1, m
    assert sample(m, "bulkshim_compartment_live_limit_by", compartment="web",
                  by="fleet_floor") == 1
    err = h.stop()
    assert "web full (1/1, fleet floor; static 8): connect to" in err, err


# ---- no limit ----


def test_unlimited_compartment_reads_null_not_zero():
    """A compartment with max_inflight only has no connection limit: live_limit is
    null (and "unlimited" true), never 0; metrics say +Inf and "none"."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [{"name": "flights", "destinations": ["127.0.0.1:%d" % srv.port],
                             "max_inflight": 4}])
    h = Holder(cfg, srv.port, 2)
    assert h.held == 2
    c = harness.comp_of(status_json(seg), "flights")
    assert c["unlimited"] is True and c["live_limit"] is None, c
    assert c["live_limit_by"] is None and c["inflight_live_limit"] == 4, c
    assert c["inflight_live_limit_by"] == "static" and c["hot"] is False, c
    m = _metrics(seg)
    assert "bulkshim_compartment_live_limit{segment=\"%s\",compartment=\"flights\"} +Inf" \
        % seg in m, m
    assert sample(m, "bulkshim_compartment_live_limit_by", compartment="flights",
                  by="none") == 1
    h.stop()


# ---- an exhausted pool ----


def _pool_config(seg, port_a, port_b):
    text = ('segment = "%s";\npools = ( { name = "db"; size = 8; } );\ncompartments = (\n'
            '  { name = "checkout"; destinations = [ "127.0.0.1:%d" ]; pool = "db"; '
            'guaranteed = 2; max_connections = 6; },\n'
            '  { name = "reports"; destinations = [ "127.0.0.1:%d" ]; pool = "db"; '
            'guaranteed = 2; max_connections = 8; }\n);\n' % (seg, port_a, port_b))
    return write_file(text)


def test_exhausted_pool_is_hot_everywhere():
    """Pool db (8; guarantees 2 + 2, shared 4) lent out: checkout holds 3 of its
    ceiling 6, reports 5 of 8. Both are HOT with the pool named as what binds
    (status text and JSON, watch, metrics), and a fourth checkout is refused
    pool_full; the servers saw 3 and 5."""
    a, b = Server(), Server()
    seg = new_segment()
    cfg = _pool_config(seg, a.port, b.port)
    hb = Holder(cfg, b.port, 5)
    ha = Holder(cfg, a.port, 3)
    a.wait_live(3, timeout=10)
    b.wait_live(5, timeout=10)
    assert (ha.held, hb.held) == (3, 5), (ha.held, hb.held)
    st = status_json(seg)
    assert st["pools"][0]["free"] == 0, st["pools"]
    for name, held, ceiling in (("checkout", 3, 6), ("reports", 5, 8)):
        c = harness.comp_of(st, name)
        assert c["in_use"] == held and c["limit"] == ceiling, c
        assert c["hot"] is True, c
        assert c["live_limit"] == held and c["live_limit_by"] == "pool", c
        assert c["pool_full"] is True, c
    text = cli_ok("status", "-s", seg)
    for name, held in (("checkout", 3), ("reports", 5)):
        row = _row(text, name)
        assert "%d pool" % held in row and "HOT" in row, row
    m = _metrics(seg)
    for name, held in (("checkout", 3), ("reports", 5)):
        assert sample(m, "bulkshim_compartment_hot", compartment=name) == 1, m
        assert sample(m, "bulkshim_compartment_live_limit", compartment=name) == held
        assert sample(m, "bulkshim_compartment_live_limit_by", compartment=name, by="pool") == 1
    w = _watch(seg)
    for name in ("checkout", "reports"):
        assert "HOT" in _row(w, name), w
    assert "pool has no room" in w, w
    more = Holder(cfg, a.port, 1)
    assert more.held == 0 and a.max_live == 3, (more.held, a.max_live)
    assert "pool db has lent all 4 of its shared permits" in more.stop()
    # Once reports lets go, the pool has room again: nothing is hot.
    hb.stop()
    b.wait_live(0, timeout=10)
    c = harness.comp_of(status_json(seg), "checkout")
    assert c["live_limit"] == 6 and c["live_limit_by"] == "static" and c["hot"] is False, c
    ha.stop()


# ---- a class at its limit ----


def test_class_at_its_limit_is_hot_and_named():
    """A class "batch" with a limit of 2 holding 2 in a compartment of 10: its busiest
    class is full, so the compartment is HOT with the class named as what binds; once
    the default class holds more, batch binds nothing and the compartment is not hot."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [web_comp(srv.port, 10, class_limits={"batch": 2})],
                      top={"classes": {"batch": ["report-*"]}})
    h = Holder(cfg, srv.port, 3, extra={"BULKSHIM_CLASS": "batch"})
    srv.wait_live(2, timeout=10)
    assert h.held == 2 and srv.max_live == 2, (h.held, srv.max_live)
    c = harness.comp_of(status_json(seg), "web")
    assert c["limit"] == 10 and c["hot"] is True, c
    assert c["class_full"] is True, c
    assert c["live_limit"] == 2 and c["live_limit_by"] == "class batch", c
    row = _row(cli_ok("status", "-s", seg), "web")
    assert "2 class batch" in row and "HOT" in row, row
    assert sample(_metrics(seg), "bulkshim_compartment_live_limit_by", compartment="web",
                  by="class") == 1
    more = Holder(cfg, srv.port, 3)
    srv.wait_live(5, timeout=10)
    c = harness.comp_of(status_json(seg), "web")
    assert c["in_use"] == 5 and c["hot"] is False and c["class_full"] is False, c
    assert c["live_limit"] == 10 and c["live_limit_by"] == "static", c
    more.stop()
    assert "class batch at its limit of 2" in h.stop()


def test_inflight_refusal_line_names_the_adaptive_limit():
    """max_inflight 64 with an adaptive limit at 1: a second request while the first
    waits for its reply is refused, and the line says the adaptive limit binds."""
    srv = Server()
    seg = new_segment()
    cfg = config_file(seg, [web_comp(srv.port, 8, max_inflight=64,
                                     adaptive={"min": 1, "max": 64, "initial": 1})])
    code = ("import socket\na=socket.create_connection(('127.0.0.1',%d))\n"
            "b=socket.create_connection(('127.0.0.1',%d))\na.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
            "try:\n    b.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print('sent')\n"
            "except OSError as e: print('refused', e.errno)\n" % (srv.port, srv.port))
    r = harness.run([PY, "-c", code], shim_env(cfg))
    assert r.stdout.startswith("refused"), (r.stdout, r.stderr)
    assert "web: 1/1 requests in flight (adaptive limit; static 64): send to " in r.stderr, \
        r.stderr
