"""test_incident.py - the web page as the incident view: a segment with a pool lent out, an
adaptive limit cut by a slow backend, a fleet host on its floor and (where the machine can load
it) the kernel engine, each loaded by real programs; headless Chromium shows what refuses and
against which limit, and the screenshot it takes is the one in docs/incident.png."""

import os
import shutil
import subprocess
import sys
import time

import harness
from harness import Agent, Server, wait_until
from test_web import _bar, _browser, _cell, _console_errors
from harness_cli import Serve, config_file, poke

sys.path.insert(0, os.path.join(harness.ROOT, "tests", "preload"))
import scenario  # noqa: E402  (the capacity backend and the legacy client)

SHOT = os.path.join(harness.BUILD, "incident.png")
DOCS_SHOT = os.path.join(harness.ROOT, "docs", "incident.png")
C, S = 8, 20        # the slow backend: capacity 8, 20 ms a request


def _config(segment, a, b, backend, pay):
    return harness.write_file(
        'segment = "%s";\n'
        'pools = ( { name = "db"; size = 6; reserved = 0; } );\n'
        # No agent runs: payments has no lease, and sits on its floor.
        'fleet = { redis = "127.0.0.1:9"; name = "incident"; lease_ms = 1500; };\n'
        'compartments = (\n'
        '  { name = "checkout"; destinations = [ "127.0.0.1:%d" ]; pool = "db";\n'
        '    guaranteed = 2; max_connections = 6; },\n'
        '  { name = "reports"; destinations = [ "127.0.0.1:%d" ]; pool = "db";\n'
        '    guaranteed = 2; max_connections = 6; },\n'
        '  { name = "search"; destinations = [ "127.0.0.1:%d" ]; max_inflight = 64;\n'
        '    adaptive = { min = 1; max = 64; }; },\n'
        '  { name = "payments"; destinations = [ "127.0.0.1:%d" ]; max_connections = 8;\n'
        '    fleet_limit = 10; fleet_floor = 1; }\n'
        ');\n' % (segment, a, b, backend, pay))


def _detail(b, segment, comp, kind):
    """The text of a compartment's pool, adaptive, fleet or kernel line, or None."""
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"] td.detail div[data-kind=\"' + arguments[2]"
        " + '\"]');"
        "return r ? r.textContent : null;", segment, comp, kind)


def _limit(b, segment, comp, kind="conn"):
    """(limit, what binds it) as the Limit column shows them, or None."""
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"] td.limit .lim-' + arguments[2]);"
        "return r ? [r.dataset.limit, r.dataset.by || null] : null;", segment, comp, kind)


def _reasons(b, segment, comp):
    """{reason: refusals per second} as the By reason column shows them."""
    return b.execute_script(
        "var o = {}; document.querySelectorAll('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"] td.reasons div').forEach(function (d) {"
        " o[d.dataset.reason] = parseFloat(d.dataset.rate); }); return o;", segment, comp)


def _hot(b, segment, comp):
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"]');"
        "return r ? r.classList.contains('hot') : null;", segment, comp)


def test_page_shows_the_incident_what_refuses_and_against_which_limit():
    """checkout and reports share a pool of 6 that is lent out (checkout 4,
    reports 2) and checkout keeps being refused pool_full; search's adaptive
    limit is cut to near the slow backend's capacity of 8 while 24 threads
    press; payments has no fleet lease and sits on its floor of 1, refusing.
    The page names each binding level, the refusal reasons per second, the
    pool's room, the adaptive limit and baseline and the fleet state, marks
    the three HOT, renders within a second of load, and its screenshot is
    the one in docs/."""
    a_srv, b_srv, pay_srv = Server(), Server(), Server()
    be = scenario.Backend(C, S)
    segment = harness.new_segment()
    config = _config(segment, a_srv.port, b_srv.port, be.port, pay_srv.port)
    env = harness.shim_env(config, log="off", strict="1")
    # The pool lent out: checkout holds 4 (2 borrowed), reports 2.
    a = Agent(env)
    for _ in range(4):
        a("tcp(%d)" % a_srv.port)
    for _ in range(2):
        a("tcp(%d)" % b_srv.port)
    t = a("attempt(('127.0.0.1', %d))" % a_srv.port)
    assert not t["ok"], "a connect past the pool's size was admitted: %s" % t
    # payments on its floor of 1: one held, the next refused.
    a("tcp(%d)" % pay_srv.port)
    assert not a("attempt(('127.0.0.1', %d))" % pay_srv.port)["ok"]
    # search: 24 threads against capacity 8, for 30 s at most (stopped at the end).
    load = scenario.client(env, be.port, 24, 30)
    harness.defer(lambda: load.poll() is None and load.kill())
    wait_until(lambda: (harness.comp_of(harness.status_json(segment), "search")["adaptive"]
                        ["limit"] <= 2 * C), 20, 0.2, "the adaptive limit to be cut")
    # The witnesses: what the servers hold is what the page says is held.
    a_srv.wait_live(4)
    b_srv.wait_live(2)
    pay_srv.wait_live(1)

    s = Serve("-s", segment)
    b = _browser()
    b.set_window_size(1500, 560)
    b.get(s.url + "/")
    wait_until(lambda: _bar(b, segment, "checkout"), 10, 0.05, "the checkout bar")
    first_ms = int(b.execute_script("return document.body.dataset.firstRenderMs"))

    # Refusals keep coming for a few seconds (bounded), so the rates show.
    for i in range(10):
        for _ in range(3):
            assert not a("attempt(('127.0.0.1', %d))" % a_srv.port)["ok"]
        assert not a("attempt(('127.0.0.1', %d))" % pay_srv.port)["ok"]
        time.sleep(0.3)
        if i >= 4 and _reasons(b, segment, "checkout").get("pool_full", 0) > 0 and \
                _reasons(b, segment, "payments").get("full", 0) > 0 and \
                _reasons(b, segment, "search"):
            break

    # checkout: 4 in use against the live limit 4 (the pool's room), HOT, pool_full.
    used, limit, pct, cls, text = _bar(b, segment, "checkout")
    assert (used, limit) == ("4", "4"), (used, limit, text)
    assert _limit(b, segment, "checkout") == ["4", "pool"], _limit(b, segment, "checkout")
    assert _hot(b, segment, "checkout"), "checkout with its pool lent out is not HOT"
    pool = _detail(b, segment, "checkout", "pool")
    assert pool and "0 free of 6" in pool and "FULL" in pool and "borrowed 2" in pool, pool
    assert _reasons(b, segment, "checkout").get("pool_full", 0) > 0, _reasons(b, segment,
                                                                               "checkout")
    assert float(_cell(b, segment, "checkout", "rate")) > 0
    # reports: 2 of its live limit 2, also bound by the pool.
    assert _bar(b, segment, "reports")[:2] == ["2", "2"], _bar(b, segment, "reports")
    assert _hot(b, segment, "reports"), "reports with its pool lent out is not HOT"
    # search: requests in flight against the adaptive limit, not 64.
    ad = _detail(b, segment, "search", "adaptive")
    lim, by = _limit(b, segment, "search", "inflight")
    assert by == "adaptive" and 1 <= int(lim) < 64, (lim, by)
    fl = _bar(b, segment, "search", "inflight")
    assert fl[1] != "64", "the in-flight bar is against the static 64: %s" % (fl,)
    assert ad and "of 1–64" in ad and "baseline" in ad, ad
    assert _reasons(b, segment, "search"), "search's refusals per second are not shown"
    # payments: the fleet floor binds, and the page says there is no lease.
    assert _limit(b, segment, "payments") == ["1", "fleet floor"], _limit(b, segment,
                                                                          "payments")
    assert _bar(b, segment, "payments")[:2] == ["1", "1"], _bar(b, segment, "payments")
    fleet = _detail(b, segment, "payments", "fleet")
    assert fleet and "ON ITS FLOOR 1 of 10" in fleet and "no lease" in fleet, fleet
    assert _hot(b, segment, "payments"), "payments on its floor, full, is not HOT"
    assert _reasons(b, segment, "payments").get("full", 0) > 0

    # A sound segment: nothing is shown damaged (no limit is none, not damaged).
    damaged = b.execute_script("return Array.from(document.querySelectorAll('.damaged'))"
                               ".map(function (e) { return e.textContent; });")
    assert not damaged, "a sound segment shown damaged: %s" % damaged
    b.save_screenshot(SHOT)
    if os.environ.get("BULKSHIM_UPDATE_DOCS"):
        shutil.copyfile(SHOT, DOCS_SHOT)
    errors = _console_errors(b)
    assert not errors, "console errors: %s" % errors
    print("incident page: first render %d ms after load; checkout 4/4 (pool) HOT, pool_full "
          "%.1f/s; search in flight limit %s (adaptive); payments 1/1 (fleet floor); "
          "screenshot %s" % (first_ms, _reasons(b, segment, "checkout").get("pool_full", 0),
                             lim, SHOT))
    # Within a second of load (the page's own clock: navigation start to the first frame).
    assert first_ms < 1000, "the page rendered %d ms after load" % first_ms
    load.kill()
    load.wait()
    assert a.finish() == 0


def test_page_names_the_knee_an_adaptive_limit_holds_at():
    """An adaptive limit held at a knee (PostgreSQL on its cores: one permit more cost latency
    and served less than a quarter more) says so on its line, as `status` does: "knee 2 (under
    test)" while the step above is tried, "knee 2" once it is sure; and one held under an edge
    says "edge N". The knee is written where the controller keeps it (alg[3]: the knee in bits
    32-35, sure in bit 63)."""
    srv = Server()
    segment = harness.new_segment()
    config = config_file(segment, [{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                                    "max_inflight": 16, "adaptive": {"min": 1, "max": 16}}])
    assert subprocess.run([harness.PY, "-c", "pass"],
                          env=harness.shim_env(config)).returncode == 0
    poke(segment, "db", **{"ad.alg[3]": 2 << 32})
    s = Serve("-s", segment)
    b = _browser()
    b.get(s.url + "/")
    wait_until(lambda: "knee 2 (under test)" in (_detail(b, segment, "db", "adaptive") or ""),
               10, 0.1, "the knee under test on the page")
    poke(segment, "db", **{"ad.alg[3]": 2 << 32 | 1 << 63})
    wait_until(lambda: (_detail(b, segment, "db", "adaptive") or "").endswith("knee 2"), 10, 0.1,
               "the sure knee on the page")
    # An edge (the least limit whose replies showed a queue: alg[1] bits 24-39) is on the
    # same line.
    poke(segment, "db", **{"ad.alg[3]": 0, "ad.alg[1]": 12 << 24})
    wait_until(lambda: (_detail(b, segment, "db", "adaptive") or "").endswith("edge 12"), 10,
               0.1, "the edge on the page")
    assert not _console_errors(b), _console_errors(b)
