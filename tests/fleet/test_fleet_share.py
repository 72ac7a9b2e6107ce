"""test_fleet_share.py - a fleet budget earns its keep: it serves at least a static split of it, calmly, and never passes it.

The short version of `make bench-fleet` (bench/fleet.py): three hosts of a
fleet, the same three hosts' clients under a static split of the same
budget, and one host allowed the whole budget, side by side on this
machine, each setup counted by a witness server of its own
(tests/fleet/goodput.py). The load moves: one host busy, two, all three,
then bursts alternating between two hosts every second; then all three
busy while an agent is SIGKILLed and restarted and Redis is frozen with
SIGSTOP. The witness of the fleet must never count more than fleet_limit;
the goodput ratios are asserted with wide margins (the bench has the
figures), the share changes as counts.
"""

import harness_fleet as hf
import goodput

LIMIT, FLOOR = 24, 1
PHASE = 4.0          # seconds a phase
ALTERNATE = 6.0      # the alternating bursts, long enough to count changes
# Share changes an agent may make in the alternating phase: its share moves
# once or twice as the load settles (in two steps when other hosts lower
# theirs later); an agent that follows every burst changes it at every
# switch (six here, eight or nine counted).
MOST_CHANGES = 4


def test_fleet_shares_beat_a_static_split_and_keep_the_limit():
    bed = goodput.Bed(LIMIT, FLOOR, hold_ms=300, retry_ms=50, max_seconds=120)
    bed.phase("one busy", [(0, ("a",))], PHASE)
    bed.phase("two busy", [(0, ("a", "b"))], PHASE)
    bed.phase("three busy", [(0, ("a", "b", "c"))], PHASE)
    bed.phase("alternating", goodput.alternate(ALTERNATE), ALTERNATE)
    s = 2 * PHASE
    bed.phase("faults", [(0, ("a", "b", "c"))], s,
              [(0.1 * s, goodput.kill_agent("a")), (0.35 * s, goodput.restart_agent("a")),
               (0.5 * s, goodput.freeze_redis), (0.75 * s, goodput.thaw_redis)])
    fs = bed.fleet[0].fleet_status()
    st = bed.fleet[1].status()
    rows = bed.results()
    hf.note("\n" + goodput.table(rows, LIMIT))
    by = {r["name"]: r for r in rows}
    # Safety first: the fleet's witness never above the limit, faults included.
    for r in rows:
        assert r["fleet_max"] <= LIMIT, "%s: the witness counted %d connections, above %d" % (
            r["name"], r["fleet_max"], LIMIT)
    assert by["three busy"]["fleet_max"] >= LIMIT - 2, by["three busy"]
    # Goodput: what one host leaves idle is lent to the others.
    assert by["one busy"]["vs_static"] >= 1.6, by["one busy"]
    assert by["one busy"]["vs_single"] >= 0.6, by["one busy"]
    assert by["two busy"]["vs_static"] >= 1.15, by["two busy"]
    assert by["three busy"]["vs_static"] >= 0.85, by["three busy"]
    assert by["alternating"]["vs_static"] >= 1.0, by["alternating"]
    # Calm: a bursty host keeps its share between bursts.
    changes = by["alternating"]["changes"]
    assert max(changes) <= MOST_CHANGES, "share changes per agent in %gs of alternating " \
        "bursts: %s" % (ALTERNATE, changes)
    # fleet --status shows each host's demand, share and churn, and so does
    # each host's status (the page's data) for itself.
    for x in fs["hosts"]:
        for k in ("want", "share", "churn_per_min"):
            assert k in x, "fleet --status lacks %s: %s" % (k, x)
        assert x["churn_per_min"] < 30, fs
    for k in ("fleet_share", "fleet_demand", "fleet_churn_per_min"):
        assert k in st, "status --json lacks %s: %s" % (k, st)
    assert 1 <= st["fleet_demand"] <= LIMIT and st["fleet_churn_per_min"] < 30, st
