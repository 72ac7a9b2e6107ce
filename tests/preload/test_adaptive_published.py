"""test_adaptive_published.py - each published controller (Vegas, Gradient2, AIMD, Envoy) cuts
its limit from max under four times a backend's capacity, as the backend's own queue shows."""

import time

import harness
from harness_io import IoShim

import scenario

CAP, S = 4, 20      # capacity and service time (ms) of the backend
MAX = 16            # the adaptive limit's max: at it, 16 callers queue 12 in the backend
LIGHT, HEAVY = 2, 14  # callers: a light start (the latency without a queue), then 4 x CAP in all


def _run(algorithm, **knobs):
    """2 callers for 2 s, then 16 for 5 s, under `algorithm`; returns the
    shim's limit and the backend's queue, each averaged over the last 2 s,
    and the final status JSON's adaptive object."""
    be = scenario.Backend(CAP, S)
    ad = {"min": 1, "max": MAX, "algorithm": algorithm}
    ad.update(knobs)
    shim = IoShim([{"name": "be", "destinations": ["127.0.0.1:%d" % be.port],
                    "max_inflight": 64, "adaptive": ad}])
    env = shim.env(log="off")
    smp = scenario.Sampler(shim.segment, "be", every=0.1)
    light = scenario.client(env, be.port, LIGHT, 7)
    time.sleep(2.0)
    heavy = scenario.client(env, be.port, HEAVY, 5)
    queue = []
    t_end = time.monotonic() + 5.0
    while time.monotonic() < t_end:
        if t_end - time.monotonic() < 2.0:
            queue.append(be.stats()["waiting"])
        time.sleep(0.1)
    scenario.results(heavy, 60)
    scenario.results(light, 60)
    samples = smp.stop()
    last = [r[1] for r in samples if r[0] >= samples[-1][0] - 2.5 and r[1] is not None]
    st = harness.comp_of(harness.status_json(shim.segment), "be")["adaptive"]
    trace = [(round(r[0], 1), r[1], r[2], r[3]) for r in samples[::5]]
    assert last and queue, "no samples (%r, %r)" % (last, queue)
    return sum(last) / len(last), sum(queue) / len(queue), st, trace


def _check(algorithm, **knobs):
    limit, queue, st, trace = _run(algorithm, **knobs)
    assert st["algorithm"] == algorithm and st["mode"] == "on", st
    # Left at max, 16 callers keep 12 waiting in the backend; the cut must
    # show there, not only in the shim's own number.
    assert limit < MAX - 2, "%s: the limit averaged %.1f over the last 2 s (max %d); trace %r" % (
        algorithm, limit, MAX, trace)
    assert queue < 0.75 * (MAX - CAP), "%s: the backend still queued %.1f on average " \
        "(limit %.1f); trace %r" % (algorithm, queue, limit, trace)


def test_vegas_cuts_the_backend_queue():
    _check("vegas")


def test_gradient2_cuts_the_backend_queue():
    _check("gradient2")


def test_aimd_cuts_the_backend_queue():
    # A window whose mean passes 45 ms is a drop: 16 at once take 80 ms.
    _check("aimd", timeout_ms=45)


def test_envoy_cuts_the_backend_queue():
    _check("envoy")


for _t in (test_vegas_cuts_the_backend_queue, test_gradient2_cuts_the_backend_queue,
           test_aimd_cuts_the_backend_queue, test_envoy_cuts_the_backend_queue):
    _t.time_limit = 40
