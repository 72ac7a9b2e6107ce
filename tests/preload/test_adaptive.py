"""test_adaptive.py - adaptive limits against a backend of known capacity, with CPython threads and curl."""

import re
import shutil
import subprocess
import threading
import time

import harness
from harness_io import IoShim

import scenario

C, S = 8, 20        # capacity and service time (ms) of the test backend


def _shim(be, **extra):
    comp = {"name": "be", "destinations": ["127.0.0.1:%d" % be.port], "max_inflight": 64,
            "adaptive": {"min": 1, "max": 64}}
    comp.update(extra)
    return IoShim([comp])


def _served(rows):
    ok = sorted(r[2] for r in rows if r[1] == "ok")
    return ok, sum(1 for r in rows if r[1] == "refused")


def _cli(*args):
    r = subprocess.run([harness.CLI] + list(args), capture_output=True, text=True, timeout=20,
                       env=harness.clean_env())
    return r


def test_python_threads_limit_settles_near_capacity_and_cuts_the_queue():
    """32 CPython threads, one request each at a time, against capacity 8: the
    limit settles near 8, the backend queue goes, latency follows."""
    be = scenario.Backend(C, S)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, 32, 8)
    time.sleep(1.0)
    smp = scenario.Sampler(shim.segment, "be")
    rows = scenario.results(p, 60)
    samples = smp.stop()
    ok, refused = _served(rows)
    tail = [r[1] for r in samples if r[0] >= 3.0]
    assert tail, "no samples of the segment after 4 s"
    mean = sum(tail) / len(tail)
    # Generous bounds: the machine is shared; the benchmark measures closely.
    assert 0.5 * C <= mean <= 2.0 * C, "adaptive limit averaged %.1f after 4 s, want near %d " \
        "(samples %r)" % (mean, C, tail[::10])
    assert refused > 0, "32 threads against a limit near 8 refused nothing"
    p50 = ok[len(ok) // 2]
    assert p50 < 3 * S, "p50 of served requests %.1f ms: the queue of 32/8 was not cut" % p50
    st = harness.status_json(shim.segment)
    ad = harness.comp_of(st, "be")["adaptive"]
    assert ad["mode"] == "on" and ad["applies_to"] == "inflight", ad
    assert ad["windows"] > 10 and ad["changes"] > 0, ad
    assert S * 1000 * 0.8 <= ad["baseline_us"] <= S * 1000 * 2.5, \
        "baseline %d us for a %d ms backend" % (ad["baseline_us"], S)
    assert ad["min"] == 1 and ad["max"] == 64, ad


def test_below_capacity_nothing_is_refused_from_the_first_instant():
    """Offered concurrency 6 < C = 8 for 6 s on a fresh segment with the
    defaults (open at max, baseline from the first completions): adaptation
    refuses nothing, not even in the first second."""
    be = scenario.Backend(C, S)
    shim = _shim(be)
    smp = scenario.Sampler(shim.segment, "be")
    rows = scenario.results(scenario.client(shim.env(log="off"), be.port, 6, 6), 60)
    samples = smp.stop()
    bad = [r for r in rows if r[1] != "ok"]
    assert not bad, "%d of %d requests refused or failed (first: %r)" % (len(bad), len(rows),
                                                                       bad[:3])
    assert len(rows) > 500, "only %d requests in 6 s" % len(rows)
    low = min((r[1] for r in samples if r[1] is not None), default=None)
    assert low is not None and low >= 6, "the limit went down to %r below an offered 6" % low
    ad = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]
    assert ad["baseline_us"] > 0 and ad["windows"] > 10, ad


def test_latency_step_is_seen_before_the_slow_replies():
    """The backend's latency goes from 5 ms to 2 s at the same capacity (4): the
    limit is cut to C/4 (+30 %) within 2 s of the step (4 s allowed here, the
    benchmark measures), before any 2 s reply could close a window: the ages
    of the requests in flight show the stall."""
    cap = 4      # 24 threads on 4: a queue the Python client surely builds at 5 ms
    be = scenario.Backend(cap, 5)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, 24, 9)
    smp = scenario.Sampler(shim.segment, "be")
    time.sleep(3)
    be.set(cap, 2000)
    t_step = time.monotonic() - smp.t0
    time.sleep(4.5)
    scenario.results(p, 60)
    rows = smp.stop()
    after = [r for r in rows if r[0] >= t_step]
    reached = next((r[0] - t_step for r in after if r[1] is not None and r[1] <= 1.3 * cap / 4),
                   None)
    assert reached is not None and reached <= 4.0, \
        "after the step to 2 s the limit went %r" % [r[1] for r in after][::5]
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["adaptive"]["sample_us"] >= 100000, c["adaptive"]


def test_pooled_compartment_adapts_between_guarantee_and_ceiling():
    """In a pool, the guarantee (4) is the floor and the ceiling (16) the top
    by default: a backend of capacity 2 under 16 threads pulls the limit
    down to the guarantee and no further."""
    be = scenario.Backend(2, S)
    shim = IoShim([{"name": "be", "destinations": ["127.0.0.1:%d" % be.port],
                    "pool": "p", "guaranteed": 4, "max_connections": 16, "adaptive": True}])
    with open(shim.config, "w") as f:     # a list of groups: not in config_text's reach
        f.write(shim.text.replace("compartments = (",
                                  'pools = ( { name = "p"; size = 20; } );\ncompartments = (', 1))
    smp = scenario.Sampler(shim.segment, "be")
    rows = scenario.results(scenario.client(shim.env(log="off"), be.port, 16, 5), 60)
    samples = [r[1] for r in smp.stop() if r[1] is not None]
    assert samples and min(samples) >= 4 and max(samples) <= 16, \
        "limit went %d..%d, bounds 4..16" % (min(samples), max(samples))
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    ad = c["adaptive"]
    assert ad["min"] == 4 and ad["max"] == 16 and ad["applies_to"] == "connections", ad
    assert ad["limit"] <= 6, "capacity 2 under 16 threads: limit %r, want near the guarantee" % ad
    assert sum(1 for r in rows if r[1] == "refused") > 0
    assert c["peak"] <= 16, c


def test_capacity_step_down_and_back():
    """C drops from 8 to 2: the limit follows within 2 s; C comes back: the
    limit recovers within 10 s (generous here; the benchmark measures)."""
    be = scenario.Backend(C, S)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, 24, 14)
    smp = scenario.Sampler(shim.segment, "be")
    time.sleep(4)
    before = [r[1] for r in smp.rows if r[0] >= 2]
    be.set(2, S)
    t_down = time.monotonic() - smp.t0
    time.sleep(4)
    be.set(C, S)
    t_up = time.monotonic() - smp.t0
    scenario.results(p, 60)
    rows = smp.stop()
    down = [r for r in rows if t_down <= r[0] < t_up]
    reached = next((r[0] - t_down for r in down if r[1] <= 4), None)
    assert reached is not None and reached <= 2.0, \
        "after the drop to 2 the limit went %r (from %r)" % ([r[1] for r in down][::5], before[::10])
    up = [r for r in rows if r[0] >= t_up]
    back = next((r[0] - t_up for r in up if r[1] >= 0.7 * C), None)
    # On failure, what the controller saw: (s, limit, in flight,
    # baseline ms, last window's mean ms), and its state at the end.
    seen = [(round(r[0], 2), r[1], r[2], r[3] and r[3] / 1000, r[4] and r[4] / 1000)
            for r in rows[::10]]
    assert back is not None and back <= 10.0, \
        "after C came back the limit went %r; samples %r; at the end %r" % (
            [r[1] for r in up][::5], seen,
            harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"])


def test_a_backend_slower_at_the_floor_lets_the_limit_climb_again():
    """C drops to 1, so the limit goes to its floor of 1; then C comes back
    but every reply takes 3.5 x as long, past twice the tolerated latency.
    At a limit of 1 few replies come per window, and the request in flight
    is overdue before a window can close on them: the windows are the
    stall check's. The replies in them still show a slower backend, so it
    becomes the baseline and the limit climbs again (within 3 s here; it
    sat at 1 for about 6 s before the floor counted such windows)."""
    be = scenario.Backend(C, S)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, 24, 12)
    smp = scenario.Sampler(shim.segment, "be")
    time.sleep(3)
    be.set(1, S)
    time.sleep(3)
    floor = [r[1] for r in smp.rows if r[0] >= smp.rows[-1][0] - 1.0]
    be.set(C, 3.5 * S)
    t_slow = time.monotonic() - smp.t0
    scenario.results(p, 60)
    rows = smp.stop()
    after = [r for r in rows if r[0] >= t_slow]
    seen = [(round(r[0], 2), r[1], r[3] and r[3] / 1000, r[4] and r[4] / 1000)
            for r in rows[::10]]
    assert min(floor) <= 2, "capacity 1 did not bring the limit down: %r" % floor
    climbed = next((r[0] - t_slow for r in after if r[1] >= 4), None)
    assert climbed is not None and climbed <= 3.0, \
        "the limit stayed low after the backend got slower: %r; samples %r" % (
            [r[1] for r in after][::5], seen)
    base = [r[3] for r in after if r[0] - t_slow >= climbed]
    assert base and base[-1] >= 2.5 * S * 1000, "the baseline stayed at %r" % base[-1:]


def test_set_adaptive_off_pins_and_number_pins_and_on_resumes():
    be = scenario.Backend(C, S)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, 24, 5)
    time.sleep(3)
    r = _cli("set", "-s", shim.segment, "be", "adaptive=off")
    assert r.returncode == 0, r.stderr
    assert "adaptive on -> off (pinned at" in r.stdout, r.stdout
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["adaptive"]["mode"] == "off" and c["adaptive"]["last_change_reason"] == "pinned", c
    pinned = c["inflight_limit"]
    assert 1 <= pinned < 64, "pinned limit %r" % pinned
    time.sleep(0.5)
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["inflight_limit"] == pinned and c["inflight_peak"] <= 64, c
    r = _cli("set", "-s", shim.segment, "be", "adaptive", "on")
    assert r.returncode == 0 and "-> on" in r.stdout, r.stdout + r.stderr
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["adaptive"]["mode"] == "on" and c["inflight_limit"] == 64, c
    r = _cli("set", "-s", shim.segment, "be", "max_inflight", "5")
    assert r.returncode == 0 and "adaptive limit off: pinned at 5" in r.stdout, r.stdout
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["adaptive"]["mode"] == "off" and c["inflight_limit"] == 5, c
    scenario.results(p, 30)
    text = _cli("status", "-s", shim.segment).stdout
    assert "ADAPTIVE" in text and "pinned" in text, text
    m = _cli("metrics", "-s", shim.segment).stdout
    # Stable labels: the mode and the reason are values, never labels of the limit's series.
    assert re.search(r'^bulkshim_adaptive_limit\{segment="%s",compartment="be"\} \d+$'
                     % shim.segment, m, re.M), m
    assert 'bulkshim_adaptive_on{segment="%s",compartment="be"} 0' % shim.segment in m, m
    assert 'bulkshim_adaptive_last_change_reason{segment="%s",compartment="be",reason="pinned"} 1' \
        % shim.segment in m, m
    assert len(re.findall(r'^bulkshim_adaptive_last_change_reason\{.*\} 1$', m, re.M)) == 1, m
    assert not re.search(r'^bulkshim_adaptive_(limit|last_change_timestamp_seconds)\{[^}]*'
                         r'(mode|reason)=', m, re.M), m
    assert "bulkshim_adaptive_baseline_seconds{" in m, m
    r = _cli("set", "-s", shim.segment, "be", "adaptive", "sideways")
    assert r.returncode != 0


def test_observe_mode_reports_what_the_adaptive_limit_would_refuse():
    """enforce = false: nothing is refused; a light phase teaches the baseline,
    then under 24 threads the limit says what it would admit (near C) and
    would_reject counts the rest."""
    be = scenario.Backend(C, S)
    shim = _shim(be, enforce=False)
    env = shim.env(log="off")
    scenario.results(scenario.client(env, be.port, 2, 1.5), 30)
    rows = scenario.results(scenario.client(env, be.port, 24, 4), 60)
    ok, refused = _served(rows)
    assert refused == 0 and len(ok) == len(rows), "observe mode refused %d" % refused
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    assert c["would_reject"]["inflight_full"] > 0, c
    assert c["adaptive"]["limit"] <= 2 * C, "the limit stayed at %r under a queue of 24 on %d" % (
        c["adaptive"], C)


def test_connection_compartment_adapts_on_connection_lifetime():
    """Without max_inflight a connection's lifetime is the request."""
    be = scenario.Backend(C, S)
    shim = IoShim([{"name": "be", "destinations": ["127.0.0.1:%d" % be.port],
                    "max_connections": 64, "adaptive": {"min": 1, "max": 64}}])
    p = scenario.client(shim.env(log="off"), be.port, 32, 5)
    rows = scenario.results(p, 60)
    c = harness.comp_of(harness.status_json(shim.segment), "be")
    ad = c["adaptive"]
    assert ad["applies_to"] == "connections" and ad["windows"] > 5, ad
    assert ad["limit"] <= 3 * C, "connection limit %r against capacity %d" % (ad, C)
    assert c["rejected_by"]["full"] > 0, c
    assert sum(1 for r in rows if r[1] == "ok") > 100


def test_curl_processes_all_count_in_one_window():
    """Eight shell loops of curl, each request its own process: every
    process's samples count in the shared windows."""
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    be = scenario.Backend(64, S)
    shim = _shim(be, adaptive={"min": 8, "max": 64})   # from 8: the 8 loops are never refused
    env = harness.curl_env(shim.env(log="off"))   # the shells run only curl
    url = "http://127.0.0.1:%d/" % be.port
    loops = [subprocess.Popen(["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do %s -sS "
                               "--max-time 5 -o /dev/null %s || exit 1; done" % (curl, url)],
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(8)]
    for lp in loops:
        _, err = lp.communicate(timeout=60)
        assert lp.returncode == 0, "a curl failed: %s" % err
    st = be.stats()
    assert st["served"] == 96, st
    seg = shim.comp("be")
    assert seg["inflight_admitted"] == 96 and seg["h_reply"]["count"] == 96, seg
    ad = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]
    assert ad["windows"] >= 1 and ad["baseline_us"] >= S * 1000 * 0.8, ad


def test_reset_clears_the_adaptive_statistics():
    be = scenario.Backend(C, S)
    shim = _shim(be)
    scenario.results(scenario.client(shim.env(log="off"), be.port, 16, 2), 30)
    ad = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]
    assert ad["windows"] > 0 and ad["changes"] > 0, ad
    r = _cli("reset", "-s", shim.segment, "be")
    assert r.returncode == 0, r.stderr
    after = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]
    assert after["windows"] == 0 and after["changes"] == 0 and after["last_change_ms"] == 0, after
    assert after["limit"] == ad["limit"] and after["baseline_us"] == ad["baseline_us"], after


def test_watch_draws_in_flight_against_the_adaptive_limit():
    """watch's in-flight count and bar are against the limit admission
    enforces: the adaptive one, not max_inflight = 64."""
    be = scenario.Backend(2, S)
    shim = _shim(be)
    scenario.results(scenario.client(shim.env(log="off"), be.port, 16, 2), 30)
    lim = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]["limit"]
    assert lim < 32, "16 threads on capacity 2 left the limit at %d" % lim
    r = _cli("watch", "-s", shim.segment, "-n", "1")
    assert r.returncode == 0, r.stderr
    row = [ln for ln in r.stdout.splitlines() if ln.startswith("be ")]
    assert row and "0/%d " % lim in row[0] and "/64" not in row[0], r.stdout
