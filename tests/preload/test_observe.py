"""test_observe.py - observe mode (enforce = false): nothing refused, would_reject equals what enforcing refuses."""

from harness import Agent, Server
from harness_io import REASONS, IoShim, brief, expect

# A deterministic workload, run in an agent under the shim: 5 concurrent
# connections to a compartment of 3, the oldest 2 closed, 2 more opened;
# then 4 requests at once to a stalled backend with max_inflight = 2.
# Counts what the program saw refused.
WORKLOAD = """
refused = {'connect': 0, 'send': 0}
def connect(port):
    s = socket.socket()
    try:
        s.connect(('127.0.0.1', port))
        return s
    except OSError as e:
        s.close()
        if e.errno != errno.ECONNREFUSED:
            raise
        refused['connect'] += 1
        return None
held = [s for s in [connect(%(conns)d) for _ in range(5)] if s]
for s in held[:2]:
    s.close()
held = held[2:] + [s for s in [connect(%(conns)d) for _ in range(2)] if s]
reqs = [connect(%(reqs)d) for _ in range(4)]
for s in reqs:
    try:
        s.send(b'request')
    except OSError as e:
        if e.errno != errno.ECONNREFUSED:
            raise
        refused['send'] += 1
result = {'refused': refused, 'held': len(held), 'reqs': len([s for s in reqs if s])}
"""


def _run(top, reqs_keys=None):
    """Runs the workload under a config with these top-level settings;
    returns (what the program saw, the two compartments while it still
    holds everything, the two compartments after it exited)."""
    conns, reqs = Server(), Server()
    r = {"name": "reqs", "destinations": ["127.0.0.1:%d" % reqs.port], "max_inflight": 2}
    r.update(reqs_keys or {})
    shim = IoShim([{"name": "conns", "destinations": ["127.0.0.1:%d" % conns.port],
                    "max_connections": 3}, r], top)
    a = Agent(shim.env(log="off"))
    result = a.call(WORKLOAD % {"conns": conns.port, "reqs": reqs.port}, "result")
    seg = shim.seg()
    during = (seg.comp("conns"), seg.comp("reqs"))
    assert a.finish() == 0
    seg = shim.seg()
    after = (seg.comp("conns"), seg.comp("reqs"))
    for c in after:
        expect(c, in_use=0, over=0, inflight=0, inflight_over=0)
    return result, during, after


def test_observe_refuses_nothing_and_would_reject_what_enforce_refuses():
    enf, (e_conns, e_reqs), (e_conns2, e_reqs2) = _run({"enforce": True})
    assert enf["refused"] == {"connect": 2, "send": 2}, \
        "enforce mode: the program saw %r refused, want 2 connects and 2 sends" % enf["refused"]
    expect(e_conns, enforce=1, in_use=3, over=0, rejected_by_full=2, rejected=2)
    expect(e_reqs, enforce=1, inflight=2, inflight_over=0, rejected_by_inflight_full=2, rejected=2)
    for c in (e_conns2, e_reqs2):
        assert not any(c["would_reject"].values()), \
            "enforce mode counted would_reject in %s: %s" % (c["name"], brief(c))

    obs, (o_conns, o_reqs), (o_conns2, o_reqs2) = _run({"enforce": False})
    assert obs["refused"] == {"connect": 0, "send": 0}, \
        "observe mode refused calls in the program: %r" % obs["refused"]
    assert obs["held"] == 5 and obs["reqs"] == 4, "observe mode: %r" % obs
    # Everything let through is counted, the permits proper never above the limits.
    expect(o_conns, enforce=0, in_use=3, over=2, rejected=0)
    expect(o_reqs, enforce=0, inflight=2, inflight_over=2, rejected=0)

    # Per reason, what observe mode would have refused is what enforce refused.
    for e, o in ((e_conns2, o_conns2), (e_reqs2, o_reqs2)):
        diff = {r: (o["would_reject"][r], e["rejected_by"][r]) for r in REASONS
                if o["would_reject"][r] != e["rejected_by"][r]}
        assert not diff, "%s: would_reject differs from enforce's rejected_by: %s" % (
            e["name"], ", ".join("%s observed %d, enforced %d" % (r, w, x) for r, (w, x) in diff.items()))
        assert o["rejected"] == 0, "observe mode counted rejections in %s: %s" % (o["name"], brief(o))


def test_compartment_enforce_overrides_global():
    res, (conns, reqs), _ = _run({"enforce": False}, {"enforce": True})
    assert res["refused"] == {"connect": 0, "send": 2}, \
        "global enforce = false, reqs enforce = true: the program saw %r refused" % res["refused"]
    expect(conns, enforce=0, rejected=0, would_reject_full=2)
    expect(reqs, enforce=1, rejected_by_inflight_full=2, would_reject_inflight_full=0)
