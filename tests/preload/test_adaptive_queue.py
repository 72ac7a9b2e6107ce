"""test_adaptive_queue.py - the adaptive limit finds the backend's no-queue latency under a moderate
overload from a fresh segment, and again after a slow episode."""

import time

import harness

import scenario
from test_adaptive import _shim

CAP, S = 4, 20      # capacity and service time (ms) of the backend
CALLERS = 8         # twice its capacity: every request queues one service time if nothing is cut


def _no_queue_ms(be):
    """The latency a caller sees without a queue, with the client's own
    overheads: the median of 2 threads against the backend, without the shim."""
    rows = scenario.results(scenario.client(harness.clean_env(), be.port, 2, 1.5), 30)
    ok = sorted(r[2] for r in rows if r[1] == "ok")
    assert len(ok) > 20, "only %d requests without a queue" % len(ok)
    return ok[len(ok) // 2]


def _trace(rows, t0=0.0):
    """(s, limit, in flight, baseline ms) every half second, for a failure's message."""
    return [(round(r[0] - t0, 1), r[1], r[2], r[3] and round(r[3] / 1000, 1)) for r in rows[::10]]


def test_twice_the_capacity_cuts_the_queue_from_a_fresh_segment():
    """8 callers on capacity 4 from a fresh segment: within 5 s the limit is
    within 1.5 x capacity and the median latency within 1.3 x the no-queue
    latency (a limit that grows past what is in flight keeps the queue and
    takes it for the baseline)."""
    be = scenario.Backend(CAP, S)
    nq = _no_queue_ms(be)
    shim = _shim(be)
    smp = scenario.Sampler(shim.segment, "be")
    rows = scenario.results(scenario.client(shim.env(log="off"), be.port, CALLERS, 9), 60)
    samples = smp.stop()
    late = [r for r in samples if r[0] >= 5.0 and r[1] is not None]
    assert late, "no samples of the segment after 5 s"
    over = [r[1] for r in late if r[1] > 1.5 * CAP]
    assert not over, "after 5 s the limit went above %g in %d of %d samples; trace %r" % (
        1.5 * CAP, len(over), len(late), _trace(samples))
    ok = sorted(r[2] for r in rows if r[1] == "ok" and r[0] >= 5.0)
    assert len(ok) > 100, "only %d requests served after 5 s" % len(ok)
    p50 = ok[len(ok) // 2]
    assert p50 <= 1.3 * nq, "p50 after 5 s %.1f ms, no-queue latency %.1f ms; trace %r" % (
        p50, nq, _trace(samples))


test_twice_the_capacity_cuts_the_queue_from_a_fresh_segment.time_limit = 90


def test_the_baseline_comes_back_after_a_slow_episode():
    """8 callers on capacity 4; the service time goes from 20 ms to 100 ms
    for 3 s and back: within 10 s of the episode's end the baseline is back
    within 1.3 x the no-queue latency, and stays there."""
    be = scenario.Backend(CAP, S)
    nq = _no_queue_ms(be)
    shim = _shim(be)
    p = scenario.client(shim.env(log="off"), be.port, CALLERS, 19)
    smp = scenario.Sampler(shim.segment, "be")
    time.sleep(3)
    be.set(CAP, 5 * S)
    time.sleep(3)
    be.set(CAP, S)
    t_end = time.monotonic() - smp.t0
    scenario.results(p, 60)
    samples = smp.stop()
    after = [r for r in samples if r[0] >= t_end + 10.0 and r[3]]
    assert after, "no samples 10 s after the episode"
    high = [r[3] for r in after if r[3] > 1.3 * nq * 1000]
    assert not high, "10 s after the episode the baseline was above %.1f ms in %d of %d samples " \
        "(no-queue latency %.1f ms); trace from the episode's end %r" % (
            1.3 * nq, len(high), len(after), nq,
            _trace([r for r in samples if r[0] >= t_end - 3.5], t_end))


test_the_baseline_comes_back_after_a_slow_episode.time_limit = 90
