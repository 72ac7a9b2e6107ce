"""test_web.py - the live page of `bulkshim serve` in a real browser: Debian's chromium, headless,
driven by python3-selenium through chromium-driver; and what serve answers: metrics, status and
the page, for one segment or several, to curl and to garbage."""

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import harness
from harness import Agent, Server, Shim, Skip, tmpdir, wait_until
from harness_cli import Serve, config_text, need_tool, sample

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1400,520"]
# Where the screenshot of each run goes; docs/webview.png in the README is one of them.
SHOT = os.path.join(harness.BUILD, "webview.png")


def _selenium():
    """The selenium package: the interpreter's own, else Debian's python3-selenium (the tests
    may run under another python3 than /usr/bin/python3)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        sys.path.append("/usr/lib/python3/dist-packages")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise Skip("python3-selenium is not installed (tests/deps.sh installs it)")
    return webdriver, Service


def _browser():
    """A headless chromium with a fresh profile, closed at the test's end."""
    chromium = need_tool("chromium", "chromium", budget=120)
    driver = need_tool("chromedriver", "chromium-driver", budget=120)
    if chromium is None or driver is None:
        raise Skip("chromium or chromium-driver is missing (tests/deps.sh installs them)")
    webdriver, Service = _selenium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    profile = os.path.join(tmpdir(), "chromium-profile")
    os.makedirs(profile, exist_ok=True)
    for a in CHROME_FLAGS + ["--user-data-dir=" + profile]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    b = webdriver.Chrome(service=Service(driver), options=opts)
    harness.defer(b.quit)
    b.set_page_load_timeout(20)
    return b


def _shim(compartments, top=None):
    """A Shim whose config may use any key (max_inflight, budget, ...): made
    with the keys harness.config_text writes, then written whole."""
    s = Shim([{k: v for k, v in c.items() if k in harness.CONFIG_KEYS} for c in compartments])
    with open(s.config, "w") as f:
        f.write(config_text(compartments, s.segment, top))
    return s


def _bar(b, segment, comp, kind="conn"):
    """(used, limit, percent) of a compartment's bar as the page shows it, or None."""
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"] .bar.' + arguments[2]);"
        "return r ? [r.dataset.used, r.dataset.limit, r.dataset.percent, r.className,"
        " r.textContent] : null;", segment, comp, kind)


def _pool(b, segment):
    """(used, limit, label) of a segment's budget bar, or None."""
    return b.execute_script(
        "var r = document.querySelector('section[data-segment=\"' + arguments[0] + '\"]"
        " .budget .bar');"
        "return r ? [r.dataset.used, r.dataset.limit, r.textContent] : null;", segment)


def _cell(b, segment, comp, cls):
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"] td.' + arguments[2]);"
        "return r ? r.textContent : null;", segment, comp, cls)


def _console_errors(b):
    return [e for e in b.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]


def test_page_in_chromium_shows_the_numbers_and_follows_a_preloaded_program():
    srv = Server()
    other = Server()
    shop = _shim([{"name": "payments", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 3},
                 {"name": "recommendations", "destinations": ["127.0.0.1:%d" % other.port],
                  "max_connections": 8, "max_inflight": 4, "class_limits": {"batch": 2}}],
                 {"budget": {"pool": 20, "reserved": 4}, "classes": {"batch": ["report-*"]}})
    batch = Shim([{"name": "reports", "destinations": ["127.0.0.1:%d" % other.port],
                   "max_connections": 2}])
    # payments full (3/3) with two refusals; reports' segment exists, empty.
    a = Agent(shop.env(log="off"))
    for _ in range(3):
        a("tcp(%d)" % srv.port)
    for _ in range(2):
        t = a("attempt(('127.0.0.1', %d))" % srv.port)
        assert not t["ok"], t
    idle = Agent(batch.env(log="off"))
    s = Serve("-s", shop.segment, "-s", batch.segment)
    b = _browser()
    b.get(s.url + "/")
    wait_until(lambda: _bar(b, shop.segment, "payments"), 10, 0.05, "the payments bar")
    used, limit, pct, cls, text = _bar(b, shop.segment, "payments")
    assert (used, limit, pct) == ("3", "3", "100.0"), (used, limit, pct, text)
    assert "hot" in cls.split(), "a full compartment is not shown hot: %r" % cls
    assert _cell(b, shop.segment, "payments", "rejected") == "2"
    assert _cell(b, shop.segment, "payments", "admitted") == "3"
    assert _bar(b, shop.segment, "recommendations", "inflight")[:2] == ["0", "4"]
    assert _cell(b, shop.segment, "recommendations", "classes") == "batch 0/2"
    assert _bar(b, batch.segment, "reports")[:2] == ["0", "2"], "the second segment is missing"
    # The pool the compartments share: 3 of 20 - 4, the limits 3 + 8.
    used, limit, text = _pool(b, shop.segment)
    assert (used, limit) == ("3", "16") and "limits 11 of pool 20" in text, (used, limit, text)
    assert _pool(b, batch.segment) is None, "a budget shown for a config without one"
    # A preloaded program opens connections: the bar follows within 2 s.
    t0 = time.monotonic()
    a("[tcp(%d) for _ in range(5)] and 0" % other.port)
    opened = time.monotonic()
    wait_until(lambda: _bar(b, shop.segment, "recommendations")[0] == "5", 5, 0.02,
               "the recommendations bar at 5")
    seen = time.monotonic()
    assert seen - opened <= 2.0, "the bar took %.2f s to follow" % (seen - opened)
    used, limit, pct, cls, _ = _bar(b, shop.segment, "recommendations")
    assert (used, limit, pct) == ("5", "8", "62.5") and "warm" in cls.split(), (used, pct, cls)
    assert _pool(b, shop.segment)[:2] == ["8", "16"]
    # Refusals per second show while a program keeps being refused.
    for _ in range(6):
        assert not a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    wait_until(lambda: float(_cell(b, shop.segment, "payments", "rate")) > 0, 4, 0.05,
               "refusals per second above 0")
    # A few seconds of traffic (bounded: 12 rounds), so the charts have a history.
    for i in range(12):
        a("[attempt(('127.0.0.1', %d)) for _ in range(%d)] and 0" % (srv.port, 1 + i % 4))
        if i == 6:
            a("tcp(%d) and 0" % other.port)
        time.sleep(0.25)
    wait_until(lambda: _bar(b, shop.segment, "recommendations")[0] == "6", 3, 0.05,
               "the recommendations bar at 6")
    b.save_screenshot(SHOT)
    errors = _console_errors(b)
    assert not errors, "console errors: %s" % json.dumps(errors)
    print("page: payments 3/3 hot, 2 refused; recommendations 0 -> 5/8 seen %.2f s after the "
          "connects (%.2f s after asking); screenshot %s; console errors: none" % (
              seen - opened, seen - t0, SHOT))
    assert a.finish() == 0 and idle.finish() == 0


def test_serve_several_segments_status_metrics_and_read_only():
    srv = Server()
    one = Shim([{"name": "a", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 2}])
    two = Shim([{"name": "b", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 5}])
    a1, a2 = Agent(one.env(log="off")), Agent(two.env(log="off"))
    a1("tcp(%d)" % srv.port)
    a2("[tcp(%d) for _ in range(3)] and 0" % srv.port)
    gone = harness.new_segment()
    s = Serve("-s", one.segment, "-s", two.segment, "-s", gone)
    code, ctype, body = s.get("/")
    assert code == 200 and ctype == "text/html; charset=utf-8", (code, ctype)
    assert "<script>" in body and "status.json" in body, "not the page"
    assert "src=\"http" not in body and "href=\"http" not in body, "the page loads from elsewhere"
    code, ctype, body = s.get("/status.json")
    assert code == 200 and ctype == "application/json", (code, ctype)
    segs = {x["segment"]: x for x in json.loads(body)["segments"]}
    assert harness.comp_of(segs[one.segment], "a")["in_use"] == 1
    assert harness.comp_of(segs[two.segment], "b")["in_use"] == 3
    assert "error" in segs[gone] and "No such file" in segs[gone]["error"], segs[gone]
    assert segs[one.segment]["budget"] is None
    one_budget = _shim([{"name": "a2", "destinations": ["127.0.0.1:%d" % srv.port],
                         "max_connections": 2}], {"budget": {"pool": 10, "reserved": 1}})
    Agent(one_budget.env(log="off")).finish()
    single = Serve("-c", one_budget.config)
    st = json.loads(single.get("/status.json")[2])
    assert st["segment"] == one_budget.segment and st["budget"] == {
        "pool": 10, "reserved": 1, "config": one_budget.config}, st
    code, _, text = s.get("/metrics")
    assert code == 200
    helps = [l for l in text.splitlines() if l.startswith("# HELP ")]
    assert len(helps) == len(set(helps)), "a family's HELP repeats in the merged exposition"
    for seg, comp, n in ((one.segment, "a", 1), (two.segment, "b", 3)):
        line = 'bulkshim_compartment_in_use{segment="%s",compartment="%s"} %d' % (seg, comp, n)
        assert line in text, line
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, "promtool check metrics: %s%s" % (r.stdout, r.stderr)
    # Read-only: nothing but GET and HEAD, and no path that changes a segment.
    for method in ("POST", "PUT", "DELETE"):
        assert s.get("/status.json", method=method)[0] == 405
    assert s.get("/set")[0] == 404
    # --all: every readable segment, including one created after the start.
    every = Serve("--all")
    three = Shim([{"name": "c", "destinations": ["127.0.0.1:%d" % srv.port],
                   "max_connections": 1}])
    a3 = Agent(three.env(log="off"))
    names = [x["segment"] for x in json.loads(every.get("/status.json")[2])["segments"]]
    assert {one.segment, two.segment, three.segment} <= set(names), names
    for a in (a1, a2, a3):
        assert a.finish() == 0


def test_serve_answers_curl_and_garbage_and_stops_on_sigterm():
    srv = Server()
    shim = Shim([{"name": "x", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 2}])
    a = Agent(shim.env(log="off"))
    for _ in range(2):
        a("tcp(%d)" % srv.port)
    for _ in range(3):
        t = a("attempt(('127.0.0.1', %d))" % srv.port)
        assert not t["ok"] and t["errno"] == errno.ECONNREFUSED, t
    s = Serve("-s", shim.segment)
    code, ctype, body = s.get("/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4"), (code, ctype)
    assert sample(body, "bulkshim_rejections_total", segment=shim.segment, compartment="x",
                   reason="full") == 3
    code, ctype, body = s.get("/status.json")
    assert code == 200 and ctype == "application/json", (code, ctype)
    assert harness.comp_of(json.loads(body), "x")["in_use"] == 2
    assert s.get("/nope")[0] == 404
    assert s.get("/")[0] == 200  # the web page
    assert s.get("/metrics", method="POST")[0] == 405
    for junk in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET\r\n\r\n", b"A" * 20000,
                 b"GET /metrics HTTP/1.0 extra words\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
            try:
                c.sendall(junk)
                reply = c.recv(100)
            except ConnectionResetError:
                reply = b""
        assert reply == b"" or re.match(rb"HTTP/1\.0 4\d\d ", reply), reply
    with socket.create_connection(("127.0.0.1", s.port), timeout=5):
        pass  # a client that says nothing and leaves
    code, _, body = s.get("/metrics")
    assert code == 200 and s.p.poll() is None, "serve died on garbage"
    assert s.stop(signal.SIGTERM) == 0
    assert a.finish() == 0


def _ask(port, path, timeout=5):
    """(status code, seconds) of one GET on a fresh connection."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(b"GET %s HTTP/1.0\r\n\r\n" % path.encode())
        data = b""
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            data += chunk
    m = re.match(rb"HTTP/1\.0 (\d+) ", data)
    return (int(m.group(1)) if m else 0), time.monotonic() - t0


def test_serve_answers_every_request_while_a_thousand_idle_connections_are_open():
    srv = Server()
    shim = Shim([{"name": "x", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 2}])
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    s = Serve("-s", shim.segment)
    idle = []
    try:
        # Clients that connect and say nothing: scrapers that hung, a port scan, a slowloris.
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
        took = []
        for path in ("/metrics", "/status.json", "/") * 10:
            code, secs = _ask(s.port, path)
            assert code == 200, "%s answered %d with 1000 idle connections open" % (path, code)
            took.append(secs)
        # The idle connections were not all cut off to make room: the table holds them.
        alive = 0
        for c in idle:
            c.setblocking(False)
            try:
                alive += c.recv(1) != b""
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        assert alive >= 990, "only %d of the 1000 idle connections were kept" % alive
        # More than the table holds: new connections take the place of the longest silent.
        more = []
        try:
            for _ in range(300):
                more.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
            for path in ("/metrics", "/status.json"):
                code, secs = _ask(s.port, path)
                assert code == 200, (path, code)
                took.append(secs)
        finally:
            for c in more:
                c.close()
    finally:
        for c in idle:
            c.close()
    took.sort()
    print("serve with 1000 idle connections (then 1300): %d requests answered, median %.1f ms, "
          "slowest %.1f ms" % (len(took), 1000 * took[len(took) // 2], 1000 * took[-1]))
    assert s.p.poll() is None
    assert a.finish() == 0
