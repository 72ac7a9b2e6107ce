"""test_fleet_agree.py - the parts of a fleet that must agree: host names, leases that end, limits.

Each host is a segment, a `bulkshim fleet` agent and a client program under
the shim on this machine, leasing from a real redis-server; the witness
server counts what the whole fleet really holds. Each test is one way two
parts of a fleet can disagree, and the witness says whether the fleet's
limit held all the same.
"""

import os
import re
import subprocess
import time

import harness
import harness_fleet as hf

LEASE_MS = 1500
LEASE = LEASE_MS / 1000.0


def start(redis, witness, specs, lease_ms=LEASE_MS, **kw):
    """Hosts of one fleet from (name, limit, floor, ceiling) specs, with their
    agents leasing."""
    fleet_name = harness.unique("fleet")
    hosts = [hf.Host(name, fleet_name, redis.address(), witness.port, limit, floor, ceiling,
                     lease_ms, **kw) for name, limit, floor, ceiling in specs]
    for h in hosts:
        h.start_agent()
    hf.wait_for(lambda: all(h.leased() for h in hosts), 10, "every agent to hold a lease")
    return hosts


def check_witness(witness, t0, t1, limit, what, at_least):
    worst = witness.max_between(t0, t1)
    hf.note("%s: witness worst fleet total %d (limit %d)", what, worst, limit)
    assert worst <= limit, "%s: the witness counted %d connections, above %d: %s" % (
        what, worst, limit, witness.over(t0, t1, limit))
    # The load did press against the limit, or the bound proves nothing.
    assert worst >= at_least, "%s: the witness saw only %d connections" % (what, worst)


def test_fleet_three_agents_with_default_host_names_on_one_machine():
    """Three services on one machine, each with its own segment and agent, none
    naming its fleet host: they lease as three hosts, not one."""
    limit, floor, ceiling = 6, 1, 6
    redis, witness = hf.Redis(), hf.Witness()
    hosts = start(redis, witness, [(n, limit, floor, ceiling) for n in "abc"], host=None)
    t0 = time.monotonic()
    for h in hosts:
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 2)
        h.set_load(ceiling + 2)
    time.sleep(4 * LEASE)
    for h in hosts:
        h.set_load(0)
    t1 = time.monotonic()
    check_witness(witness, t0, t1, limit, "three default host names", at_least=limit - 1)
    fs = hosts[0].fleet_status()
    names = sorted(x["host"] for x in fs["hosts"])
    hf.note("three default host names: %s", names)
    assert len(names) == 3 and len(set(names)) == 3, fs
    for h in hosts:
        assert any(n.endswith("/" + h.segment) for n in names), (h.segment, names)
    for h in hosts:
        assert "stale call" not in h.agent_log(), h.agent_log()[-1500:]


def test_fleet_second_agent_claiming_a_live_host_name_is_refused():
    """Two segments whose configs give the same fleet host: the second agent is
    refused with one line naming both agents, and its host stays on its floor."""
    limit, floor, ceiling = 8, 1, 8
    redis, witness = hf.Redis(), hf.Witness()
    fleet_name = harness.unique("fleet")
    a, b = [hf.Host(n, fleet_name, redis.address(), witness.port, limit, floor, ceiling,
                    LEASE_MS, host="web1") for n in "ab"]
    a.start_agent()
    hf.wait_for(a.leased, 10, "the first agent's lease")
    b.start_agent()
    t0 = time.monotonic()
    for h in (a, b):
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 2)
        h.set_load(ceiling + 2)
    time.sleep(3 * LEASE)
    for h in (a, b):
        h.set_load(0)
    check_witness(witness, t0, time.monotonic(), limit, "two agents of host web1",
                  at_least=limit - 1)
    assert a.leased(), "the first agent lost its lease"
    assert b.live_limit() == floor and b.comp()["peak"] <= floor, b.comp()
    words = "held by another live agent"
    lines = [ln for ln in b.agent_log().splitlines() if words in ln]
    assert lines, "the second agent did not say %r: %s" % (words, b.agent_log()[-1500:])
    hf.note("second agent of host web1: %s", lines[0])
    assert len(lines) == 1, lines
    assert "pid %d " % a.agent.pid in lines[0] and "pid %d " % b.agent.pid in lines[0], lines[0]
    assert "web1" in lines[0] and "floor" in lines[0], lines[0]
    assert b.status()["fleet_redis"] == "refused", b.status()
    assert b.agent.poll() is None and "stale call" not in b.agent_log(), b.agent_log()[-1500:]


def test_fleet_agent_killed_while_its_host_holds_long_lived_connections():
    """A connection pool keeps its connections open: the agent's death ends the
    lease, not the connections, and Redis keeps counting them."""
    limit, floor, ceiling, pooled = 10, 1, 10, 8
    redis, witness = hf.Redis(), hf.Witness()
    a, b, c = start(redis, witness, [(n, limit, floor, ceiling) for n in "abc"])
    t0 = time.monotonic()
    # Host a opens its pool: eight connections held for a minute.
    a.start_load(witness.port, hold_ms=60000, threads=pooled)
    a.set_load(pooled)
    hf.wait_for(lambda: a.comp()["in_use"] == pooled, 8,
                "host a's pool to open (in use %d)" % a.comp()["in_use"])
    held = lambda: [x for x in a.fleet_status()["hosts"] if x["host"] == "a"][0]["held"]
    hf.wait_for(lambda: held() == pooled, 3, "host a to report its pool to Redis")
    a.kill_agent()
    hf.wait_for(lambda: a.live_limit() == floor, LEASE + 1, "host a to fall to its floor")
    assert a.comp()["in_use"] == pooled, a.comp()
    # The others want more than the rest, for three leases.
    for h in (b, c):
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 2)
        h.set_load(ceiling + 2)
    time.sleep(3 * LEASE)
    for h in (b, c):
        h.set_load(0)
    check_witness(witness, t0, time.monotonic(), limit, "agent killed under a pool",
                  at_least=limit - 1)
    fs = a.fleet_status()
    entry = [x for x in fs["hosts"] if x["host"] == "a"][0]
    hf.note("host a silent: fleet --status says %s", entry)
    assert not entry["live"] and entry["held"] == pooled, entry
    assert entry["reserved"] >= pooled, entry
    assert fs["reserved"] <= limit, fs
    assert b.live_limit() + c.live_limit() <= limit - pooled, (b.live_limit(), c.live_limit())


def test_fleet_agent_stopped_tells_redis_what_its_host_keeps():
    """An agent stopped with SIGTERM while its host keeps a pool open: it tells
    Redis what the host holds, which stays counted, and the rest goes on."""
    limit, floor, ceiling, pooled = 10, 1, 10, 3
    redis, witness = hf.Redis(), hf.Witness()
    a, b, c = start(redis, witness, [(n, limit, floor, ceiling) for n in "abc"])
    t0 = time.monotonic()
    a.start_load(witness.port, hold_ms=60000, threads=pooled)
    a.set_load(pooled)
    hf.wait_for(lambda: a.comp()["in_use"] == pooled, 8,
                "host a's pool to open (in use %d)" % a.comp()["in_use"])
    a.agent.terminate()
    a.agent.wait(10)
    assert a.live_limit() == floor and a.comp()["in_use"] == pooled, a.comp()
    for h in (b, c):
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 2)
        h.set_load(ceiling + 2)
    took = hf.wait_for(lambda: b.live_limit() + c.live_limit() >= limit - pooled, 6,
                       "hosts b and c to share all but host a's pool (shares %d and %d)" % (
                           b.live_limit(), c.live_limit()))
    hf.note("host a's agent stopped holding %d: b and c share %d and %d after %.2fs", pooled,
            b.live_limit(), c.live_limit(), took)
    time.sleep(2 * LEASE)
    shares = [b.live_limit(), c.live_limit()]
    for h in (b, c):
        h.set_load(0)
    check_witness(witness, t0, time.monotonic(), limit, "agent stopped under a pool",
                  at_least=limit - 1)
    assert sum(shares) == limit - pooled, shares
    assert "told Redis what this host holds (%d connections)" % pooled in a.agent_log(), \
        a.agent_log()[-1500:]
    fs = a.fleet_status()
    entry = [x for x in fs["hosts"] if x["host"] == "a"][0]
    assert not entry["live"] and entry["held"] == pooled and entry["reserved"] == pooled, entry


def test_fleet_hosts_with_different_fleet_limits_keep_to_the_lower():
    """The host with the higher fleet_limit reaches Redis first; the other says
    less: the fleet keeps to the lower, and both keep leasing."""
    low, high, floor, ceiling = 6, 12, 1, 12
    redis, witness = hf.Redis(), hf.Witness()
    fleet_name = harness.unique("fleet")
    hi = hf.Host("hi", fleet_name, redis.address(), witness.port, high, floor, ceiling, LEASE_MS)
    lo = hf.Host("lo", fleet_name, redis.address(), witness.port, low, floor, ceiling, LEASE_MS)
    hi.start_agent()
    hf.wait_for(hi.leased, 10, "the first host's lease")
    lo.start_agent()
    t0 = time.monotonic()
    for h in (hi, lo):
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 2)
        h.set_load(ceiling + 2)
    time.sleep(4 * LEASE)
    shares = [hi.live_limit(), lo.live_limit()]
    for h in (hi, lo):
        h.set_load(0)
    check_witness(witness, t0, time.monotonic(), low, "fleet_limit %d and %d" % (high, low),
                  at_least=low - 1)
    hf.note("fleet_limit %d and %d: shares %s", high, low, shares)
    assert hi.leased() and lo.leased(), (hi.agent_log()[-1500:], lo.agent_log()[-1500:])
    assert min(shares) > floor, shares
    assert "fleet_limit %d here, but %d on host lo" % (high, low) in hi.agent_log(), \
        hi.agent_log()[-1500:]


def test_fleet_rolling_change_of_fleet_limit_keeps_the_shares():
    """fleet_limit raised from 24 to 30 one host after the other (reload): no
    host is put on its floor meanwhile, the fleet keeps to 24 until every host
    has 30, and then shares grow."""
    old, new, floor, ceiling = 24, 30, 2, 20
    redis, witness = hf.Redis(), hf.Witness()
    # A lease of 3 s renewed every 250 ms: a share lost to a busy machine
    # (eight renewals missed in a row) is not mistaken for a refusal.
    hosts = start(redis, witness, [(n, old, floor, ceiling) for n in "abc"], lease_ms=3000,
                  interval_ms=250)
    t0 = time.monotonic()
    for h in hosts:
        h.start_load(witness.port, hold_ms=100, threads=ceiling + 4)
        h.set_load(ceiling + 4)
    hf.wait_for(lambda: min(h.live_limit() for h in hosts) >= old // 3 - 1, 6,
                "a fair split (shares %s)" % [h.live_limit() for h in hosts])
    lowest = {h.name: old for h in hosts}
    for h in hosts:
        t_last = time.monotonic()
        h.reload_limit(new)
        # Samples 50 ms apart for two seconds at least (40 of them): a refused
        # host is on its floor within one renewal.
        for _ in range(40):
            for x in hosts:
                lowest[x.name] = min(lowest[x.name], x.live_limit())
            time.sleep(0.05)
        hf.note("fleet_limit %d on host %s: the lowest shares so far %s", new, h.name, lowest)
    assert min(lowest.values()) > floor, "a host was put on its floor: lowest shares %s" % lowest
    hf.wait_for(lambda: min(h.live_limit() for h in hosts) >= new // 3 - 1, 6,
                "shares to grow under fleet_limit %d (shares %s)" % (
                    new, [h.live_limit() for h in hosts]))
    hf.note("every host at fleet_limit %d: shares %s", new, [h.live_limit() for h in hosts])
    time.sleep(1.0)
    for h in hosts:
        h.set_load(0)
    t_end = time.monotonic()
    check_witness(witness, t0, t_last, old, "before the last host changed",
                  at_least=old - 4)
    check_witness(witness, t_last, t_end, new, "every host at fleet_limit %d" % new,
                  at_least=old + 1)


def test_fleet_check_warns_when_the_floors_pass_the_limit():
    """`check` says when hosts x fleet_floor is more than fleet_limit: hosts on
    their floors alone could then pass the limit."""
    def config(floor):
        return harness.write_file(
            "fleet = { redis = \"127.0.0.1:6379\"; name = \"f\"; hosts = 4; };\n"
            "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
            "  max_connections = 5;\n  fleet_limit = 10; fleet_floor = %d; } );\n" % floor)

    path = config(3)
    r = subprocess.run([harness.CLI, "check", path], capture_output=True, text=True,
                       env=harness.clean_env(), timeout=10)
    hf.note("check: %s", r.stderr.strip())
    assert r.returncode == 0, r.stderr
    assert re.search(r"warning: %s:2: .*hosts 4 x fleet_floor 3 = 12, more than fleet_limit 10"
                     % re.escape(path), r.stderr), r.stderr
    r = subprocess.run([harness.CLI, "check", config(2)], capture_output=True, text=True,
                       env=harness.clean_env(), timeout=10)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
