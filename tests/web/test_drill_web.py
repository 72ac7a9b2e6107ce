"""test_drill_web.py - the live page shows a running drill on its compartment's card (the DRILL tag and
a line with its faults, time left and calls touched) and drops it when the drill ends."""

import json
import subprocess
import time

import harness
from harness import Server, new_segment, status_json, wait_until
from harness_cli import Serve, config_file, hold_connections
from test_web import _browser, _console_errors


def _drill_card(b, segment, comp):
    """(the tag's text, the drill line's text) of a compartment's row; None for each missing."""
    return b.execute_script(
        "var r = document.querySelector('tr[data-segment=\"' + arguments[0] + '\"]"
        "[data-compartment=\"' + arguments[1] + '\"]');"
        "if (!r) return null;"
        "var t = r.querySelector('.tag.drill'), d = r.querySelector('div[data-kind=\"drill\"]');"
        "return [t ? t.textContent : null, d ? d.textContent : null];", segment, comp)


def test_page_shows_a_running_drill_and_drops_it_when_it_ends():
    srv = Server("hold")
    seg = new_segment()
    cfg = config_file(seg, [{"name": "dep", "destinations": ["127.0.0.1:%d" % srv.port],
                             "max_connections": 4}], top={"drills": True})
    if subprocess.run([harness.CLI, "check", "-q", cfg], capture_output=True).returncode != 0:
        raise harness.Skip("the config loader does not take `drills` in this tree")
    hold_connections(cfg, srv.port, 1)
    s = Serve("-s", seg)
    b = _browser()
    b.get(s.url + "/")
    wait_until(lambda: _drill_card(b, seg, "dep"), 10, 0.05, "the dep row")
    assert _drill_card(b, seg, "dep") == [None, None], "a drill shown before any runs"
    p = subprocess.Popen([harness.CLI, "drill", "-c", cfg, "dep", "--delay", "1500ms",
                          "--fraction", "50%", "--for", "5s", "--baseline", "0", "--after", "0"],
                         env=harness.clean_env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    harness.defer(lambda: p.poll() is None and p.kill())
    wait_until(lambda: (_drill_card(b, seg, "dep") or [None])[0], 4, 0.05, "the DRILL tag")
    tag, line = _drill_card(b, seg, "dep")
    assert tag == "DRILL", tag
    assert "delay 1.5 s on 50% of connections" in line and "s left" in line and \
        "started by pid %d" % p.pid in line, line
    assert p.wait(15) == 0
    t0 = time.monotonic()
    wait_until(lambda: _drill_card(b, seg, "dep") == [None, None], 4, 0.05,
               "the drill gone from the page")
    assert status_json(seg)["compartments"][0]["drill"] is None
    errors = _console_errors(b)
    assert not errors, "console errors: %s" % json.dumps(errors)
    print("page: DRILL shown while it ran, gone %.2f s after the drill's end" % (
        time.monotonic() - t0))
test_page_shows_a_running_drill_and_drops_it_when_it_ends.time_limit = 120
