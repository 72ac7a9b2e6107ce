"""test_fleet.py - fleet budgets: one limit across hosts, leased from a real Redis (issue 16).

Three or more hosts on this machine (a segment, a `bulkshim fleet` agent and
a client program under the shim each) share fleet_limit; the witness server
counts what the whole fleet really holds. Each host alone would allow
CEILING, so without the fleet budget three hosts could hold 3 x CEILING.
"""

import json
import os
import socket
import subprocess
import threading
import time

import harness
import harness_fleet as hf

LIMIT, FLOOR, CEILING, LEASE_MS = 24, 2, 20, 1500
LEASE = LEASE_MS / 1000.0
HOLD_MS = 100


def fleet(n, names="abcdef", **kw):
    """Redis, the witness and n hosts with their agents leasing."""
    redis = hf.Redis()
    witness = hf.Witness()
    fleet_name = harness.unique("fleet")
    hosts = [hf.Host(names[i], fleet_name, redis.address(), witness.port, LIMIT, FLOOR, CEILING,
                     LEASE_MS, **kw) for i in range(n)]
    for h in hosts:
        h.start_agent()
    hf.wait_for(lambda: all(h.leased() for h in hosts), 10, "every agent to hold a lease")
    for h in hosts:
        h.start_load(witness.port, HOLD_MS)
    return redis, witness, hosts


def shares(hosts):
    return [h.live_limit() for h in hosts]


def check_witness(witness, t0, t1, what, at_least=None):
    worst = witness.max_between(t0, t1)
    hf.note("%s: witness worst fleet total %d (limit %d)", what, worst, LIMIT)
    assert worst <= LIMIT, "%s: the witness counted %d connections, above fleet_limit %d" % (
        what, worst, LIMIT)
    if at_least is not None:
        # The load did press against the limit, or the bound proves nothing.
        assert worst >= at_least, "%s: the witness saw only %d connections" % (what, worst)
    return worst


def test_fleet_shares_follow_the_load():
    redis, witness, (a, b, c) = fleet(3)
    t_start = time.monotonic()
    follow = []
    prev = None
    for h in (a, b, c):
        for x in (a, b, c):
            x.set_load(CEILING + 4 if x is h else 0)
        t0 = time.monotonic()
        # Everything the others do not need: the fleet minus two floors.
        took = hf.wait_for(lambda: h.live_limit() >= LIMIT - 2 * FLOOR - 2, 6,
                           "host %s's share to follow its load (shares %s)" % (h.name, shares((a, b, c))))
        follow.append(took)
        hf.note("load moved to host %s: its share reached %d in %.2fs", h.name, h.live_limit(), took)
        hf.wait_for(lambda: h.comp()["in_use"] >= LIMIT - 2 * FLOOR - 2, 5,
                    "host %s's clients to use its share" % h.name)
        if prev is not None:
            # The idle host's lease renews at its floor plus a headroom of one.
            idle = hf.wait_for(lambda: prev.live_limit() <= FLOOR + 1, 3,
                               "idle host %s to fall back to its floor" % prev.name)
            hf.note("host %s idle: back to %d within %.2fs", prev.name, prev.live_limit(), idle)
        prev = h
        time.sleep(0.5)
    # All three want everything: a fair split, the sum still the limit.
    for h in (a, b, c):
        h.set_load(CEILING + 4)
    hf.wait_for(lambda: min(shares((a, b, c))) >= LIMIT // 3 - 1, 6,
                "a fair split (shares %s)" % shares((a, b, c)))
    hf.note("all hosts loaded: shares %s", shares((a, b, c)))
    time.sleep(1.0)
    assert sum(shares((a, b, c))) <= LIMIT, "shares %s add up past %d" % (shares((a, b, c)), LIMIT)

    # Visible: status --json, metrics and fleet --status.
    st = a.status()
    for k in ("fleet_limit", "fleet_share", "fleet_floor", "fleet_lease_age_ms", "fleet_redis",
              "fleet_redis_reachable", "live_limit", "limit"):
        assert k in st, "status --json lacks %s: %s" % (k, st)
    assert st["fleet_limit"] == LIMIT and st["fleet_redis"] == "ok" and st["limit"] == CEILING
    m = subprocess.run([harness.CLI, "metrics", "-s", a.segment], capture_output=True, text=True,
                       env=harness.clean_env(), timeout=10).stdout
    for fam in ("bulkshim_fleet_share", "bulkshim_fleet_limit", "bulkshim_fleet_lease_age_seconds",
                "bulkshim_fleet_redis_up", "bulkshim_compartment_live_limit"):
        assert fam + "{" in m, "metrics lack %s" % fam
    r = subprocess.run([harness.CLI, "fleet", "--status", "--json", "-c", a.config],
                       capture_output=True, text=True, env=harness.clean_env(), timeout=10)
    assert r.returncode == 0, r.stderr
    fs = json.loads(r.stdout)["compartments"][0]
    assert sorted(x["host"] for x in fs["hosts"]) == ["a", "b", "c"], fs
    assert fs["live_share"] <= LIMIT, fs
    for h in (a, b, c):
        h.set_load(0)
    t_end = time.monotonic()
    check_witness(witness, t_start, t_end, "load moving between 3 hosts", at_least=LIMIT - 6)
    assert max(follow) <= 2.0, "shares took %s s to follow the load (more than 2 s)" % follow
