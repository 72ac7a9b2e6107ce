"""test_fleet.py - fleet budgets: one limit across hosts, leased from a real Redis.

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
            # The idle host's lease renews at its floor plus a headroom of
            # one, once its demand over the last lease has gone (a lease and
            # a few renewals; more on a busy machine).
            idle = hf.wait_for(lambda: prev.live_limit() <= FLOOR + 1, 6,
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
    # The demand is the most a host needed over the last lease: the idle host
    # gives its share back a lease after its load stopped.
    assert max(follow) <= LEASE + 1.5, "shares took %s s to follow the load (more than %g s)" % (
        follow, LEASE + 1.5)


def test_fleet_agent_sigkilled_host_falls_to_floor():
    redis, witness, (a, b, c) = fleet(3)
    t_start = time.monotonic()
    a.set_load(CEILING + 4)
    b.set_load(CEILING + 4)
    hf.wait_for(lambda: min(a.live_limit(), b.live_limit()) >= (LIMIT - 3 * FLOOR) // 2, 6,
                "hosts a and b to share the budget (shares %s)" % shares((a, b, c)))
    time.sleep(0.5)
    t_kill = time.monotonic()
    a.kill_agent()
    # Its own clock ends the lease: the shim drops to the floor unaided.
    took = hf.wait_for(lambda: a.live_limit() == FLOOR, LEASE + 1,
                       "host a (agent killed) to fall to its floor")
    hf.note("agent of host a SIGKILLed: host a on its floor after %.2fs (lease %.1fs)", took, LEASE)
    st = a.status()
    assert st["fleet_redis"] == "no agent" and not st["fleet_lease"], st
    hf.wait_for(lambda: a.comp()["in_use"] <= FLOOR, 3, "host a's connections to drain to its floor")
    # Redis cannot know that they drained: what host a may hold stays
    # counted, past the end of its lease there, until it reports again.
    time.sleep(LEASE + 0.5)
    fs = a.fleet_status()
    entry = [x for x in fs["hosts"] if x["host"] == "a"][0]
    assert not entry["live"] and entry["reserved"] >= (LIMIT - 3 * FLOOR) // 2, fs
    assert fs["reserved"] <= LIMIT, fs
    assert b.live_limit() <= LIMIT - entry["reserved"] - FLOOR, (shares((a, b, c)), fs)
    # Host a's service goes quiet, then its agent is back: it reports the
    # drained host, and b gets the rest. (Were a still busy, the two would
    # split the budget again, and b would reach the rest only for the one
    # round in which the new agent has seen no refusal yet.)
    a.set_load(0)
    hf.wait_for(lambda: a.comp()["in_use"] == 0, 3, "host a's connections to close")
    a.start_agent()
    took = hf.wait_for(lambda: b.live_limit() >= LIMIT - 3 * FLOOR - 1, 15,
                       "host b to get host a's share (shares %s)" % shares((a, b, c)))
    hf.note("agent of host a SIGKILLed and restarted: host b's share reached %d %.2fs after "
            "the restart, %.2fs after the kill", b.live_limit(), took, time.monotonic() - t_kill)
    time.sleep(1.0)
    b.set_load(0)
    check_witness(witness, t_start, time.monotonic(), "agent SIGKILLed", at_least=LIMIT - 6)


def test_fleet_redis_stopped_and_restarted():
    redis, witness, (a, b, c) = fleet(3)
    t_start = time.monotonic()
    for h, n in ((a, CEILING + 4), (b, CEILING + 4), (c, 4)):
        h.set_load(n)
    hf.wait_for(lambda: sum(shares((a, b, c))) >= LIMIT - 2, 6,
                "the budget to be handed out (shares %s)" % shares((a, b, c)))
    time.sleep(0.5)
    redis.stop()
    t_down = time.monotonic()
    took = hf.wait_for(lambda: shares((a, b, c)) == [FLOOR] * 3, LEASE + 1,
                       "every host to fall to its floor with Redis down")
    hf.note("Redis stopped: every host on its floor after %.2fs", took)
    st = a.status()
    assert st["fleet_redis"] == "unreachable" and st["fleet_redis_reachable"] is False, st
    assert "cannot connect to Redis" in a.agent_log(), a.agent_log()[-2000:]
    time.sleep(1.0)
    t_back = time.monotonic()
    redis.start()
    took = hf.wait_for(lambda: a.live_limit() >= 6 and b.live_limit() >= 6, 5,
                       "shares to return with Redis back (shares %s)" % shares((a, b, c)))
    hf.note("Redis restarted empty after %.1fs down: shares back (%s) %.2fs after it started",
            t_back - t_down, shares((a, b, c)), took)
    time.sleep(1.0)
    for h in (a, b, c):
        h.set_load(0)
    check_witness(witness, t_start, time.monotonic(), "Redis stopped and restarted",
                  at_least=LIMIT - 6)
    assert took <= 2.0, "shares took %.2fs to return after Redis came back" % took


def test_fleet_redis_frozen_with_sigstop():
    redis, witness, (a, b, c) = fleet(3)
    t_start = time.monotonic()
    for h in (a, b, c):
        h.set_load(CEILING + 4)
    hf.wait_for(lambda: min(shares((a, b, c))) >= LIMIT // 3 - 1, 6,
                "a fair split (shares %s)" % shares((a, b, c)))
    redis.freeze()
    t_freeze = time.monotonic()
    took = hf.wait_for(lambda: shares((a, b, c)) == [FLOOR] * 3, LEASE + 1,
                       "every host to fall to its floor with Redis frozen")
    hf.note("Redis frozen (SIGSTOP): every host on its floor after %.2fs", took)
    # Load moves while Redis sleeps: calls pile up in its sockets.
    b.set_load(0)
    c.set_load(0)
    time.sleep(1.5)
    redis.thaw()
    took = hf.wait_for(lambda: a.live_limit() >= LIMIT - 3 * FLOOR - 1, 6,
                       "host a's share to return after SIGCONT (shares %s)" % shares((a, b, c)))
    hf.note("Redis thawed after %.1fs frozen: host a's share back to %d in %.2fs",
            time.monotonic() - took - t_freeze, a.live_limit(), took)
    time.sleep(1.0)
    assert sum(shares((a, b, c))) <= LIMIT, shares((a, b, c))
    a.set_load(0)
    check_witness(witness, t_start, time.monotonic(), "Redis frozen with SIGSTOP",
                  at_least=LIMIT - 6)


class FakeRedis:
    """A server that speaks RESP but answers the fleet script with nonsense:
    AUTH and SCRIPT LOAD succeed, EVALSHA gets an array of the wrong shape."""

    def __init__(self):
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.port = self.ls.getsockname()[1]
        self.stop = False
        threading.Thread(target=self._serve, daemon=True).start()
        harness.defer(self.close)

    def close(self):
        self.stop = True
        self.ls.close()

    @staticmethod
    def _commands(buf):
        """Whole commands (lists of words) at the start of buf, and the rest."""
        out = []
        while buf.startswith(b"*") and b"\r\n" in buf:
            head, rest = buf.split(b"\r\n", 1)
            words = []
            for _ in range(int(head[1:])):
                if b"\r\n" not in rest:
                    return out, buf
                ln, rest2 = rest.split(b"\r\n", 1)
                n = int(ln[1:])
                if len(rest2) < n + 2:
                    return out, buf
                words.append(rest2[:n].decode(errors="replace"))
                rest = rest2[n + 2:]
            out.append(words)
            buf = rest
        return out, buf

    def _client(self, s):
        buf = b""
        while not self.stop:
            try:
                data = s.recv(65536)
            except OSError:
                break
            if not data:
                break
            cmds, buf = self._commands(buf + data)
            for w in cmds:
                verb = w[0].upper()
                if verb == "SCRIPT":
                    s.sendall(b"$40\r\n" + b"0" * 40 + b"\r\n")
                elif verb == "EVALSHA":
                    s.sendall(b"*2\r\n$3\r\nlol\r\n:7\r\n")
                else:
                    s.sendall(b"+OK\r\n")
        s.close()

    def _serve(self):
        while not self.stop:
            try:
                s, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(s,), daemon=True).start()


def test_fleet_bad_redis_keeps_hosts_on_floor():
    redis = hf.Redis(password="s3cret-pass")
    witness = hf.Witness()
    name = harness.unique("fleet")
    good_pw = harness.write_file("s3cret-pass\n", suffix=".pass")
    bad_pw = harness.write_file("guess\n", suffix=".pass")
    fake = FakeRedis()
    hosts = {
        "good": hf.Host("good", name, redis.address(), witness.port, LIMIT, FLOOR, CEILING,
                        LEASE_MS, password_file=good_pw, max_hosts=6),
        "wrongpass": hf.Host("wrongpass", name, redis.address(), witness.port, LIMIT, FLOOR,
                             CEILING, LEASE_MS, password_file=bad_pw, max_hosts=6),
        "nopassfile": hf.Host("nopassfile", name, redis.address(), witness.port, LIMIT, FLOOR,
                              CEILING, LEASE_MS, password_file="/nonexistent/redis.pass", max_hosts=6),
        "unreachable": hf.Host("unreachable", name, "127.0.0.1:%d" % harness.free_port(),
                               witness.port, LIMIT, FLOOR, CEILING, LEASE_MS, max_hosts=6),
        "malformed": hf.Host("malformed", name, "127.0.0.1:%d" % fake.port, witness.port, LIMIT,
                             FLOOR, CEILING, LEASE_MS, max_hosts=6),
    }
    # The good host holds the fleet's record of the limit first.
    hosts["good"].start_agent()
    hf.wait_for(hosts["good"].leased, 10, "the good host's lease")
    for k, h in hosts.items():
        if k != "good":
            h.start_agent()
    want = {
        "wrongpass": ("refused", "refused the password"),
        "nopassfile": ("refused", "cannot read password_file"),
        "unreachable": ("unreachable", "cannot connect to Redis"),
        "malformed": ("refused", "malformed reply from Redis"),
    }
    for k, (state, words) in want.items():
        h = hosts[k]
        hf.wait_for(lambda: words in h.agent_log(), 5, "host %s's agent to say %r" % (k, words))
        hf.wait_for(lambda: h.status().get("fleet_redis") == state, 3,
                    "host %s's status to say %s (it says %s)" % (k, state, h.status()))
    # Loaded, each bad host stays on its floor; the good one gets the rest
    # but the floors of five others, which Redis holds back (hosts = 6)
    # though it never heard from any of them.
    for h in hosts.values():
        h.start_load(witness.port, HOLD_MS, threads=CEILING + 4)
        h.set_load(CEILING + 4)
    t0 = time.monotonic()
    room = LIMIT - 5 * FLOOR
    hf.wait_for(lambda: hosts["good"].live_limit() == room, 5,
                "the good host's share to grow to all but five floors, %d" % room)
    time.sleep(1.5)
    for k, h in hosts.items():
        assert h.agent.poll() is None, "host %s's agent exited: %s" % (k, h.agent_log()[-1500:])
        if k == "good":
            continue
        assert h.live_limit() == FLOOR, "host %s: live limit %d, not its floor" % (k, h.live_limit())
        assert h.comp()["peak"] <= FLOOR, "host %s held %d > floor" % (k, h.comp()["peak"])
        assert not h.status()["fleet_lease"]
    for h in hosts.values():
        h.set_load(0)
    check_witness(witness, t0, time.monotonic(), "bad Redis input (4 hosts on floors, 1 leasing)",
                  at_least=LIMIT - 2)


def test_fleet_config_errors_name_file_and_line():
    cases = [
        ("compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5; fleet_limit = 10; } );\n", ":1:", "no fleet"),
        ("fleet = { redis = \"127.0.0.1:6379\"; name = \"f\"; };\n"
         "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5; } );\n", ":1:", "no compartment sets fleet_limit"),
        ("fleet = { redis = \"127.0.0.1\"; name = \"f\"; };\n"
         "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5; fleet_limit = 10; } );\n", ":1:", "neither host:port"),
        ("fleet = { redis = \"127.0.0.1:6379\"; name = \"f\"; };\n"
         "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5;\n  fleet_limit = 10; fleet_floor = 6; } );\n", ":4:",
         "above its max_connections"),
        ("fleet = { redis = \"127.0.0.1:6379\"; name = \"f\"; lease_ms = 10; };\n"
         "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5; fleet_limit = 10; } );\n", ":1:", "lease_ms"),
        ("fleet = { redis = \"127.0.0.1:6379\"; nmae = \"f\"; };\n"
         "compartments = ( { name = \"db\"; destinations = [ \"127.0.0.1:9\" ];\n"
         "  max_connections = 5; fleet_limit = 10; } );\n", ":1:", "nmae"),
    ]
    for text, line, words in cases:
        path = harness.write_file(text)
        r = subprocess.run([harness.CLI, "check", path], capture_output=True, text=True,
                           env=harness.clean_env(), timeout=10)
        assert r.returncode == 1, "check accepted %r: %s" % (text, r.stdout)
        assert path + line in r.stderr and words in r.stderr, (text, r.stderr)
        r = subprocess.run([harness.CLI, "fleet", "-c", path], capture_output=True, text=True,
                           env=harness.clean_env(), timeout=10)
        assert r.returncode == 78 and words in r.stderr, (text, r.returncode, r.stderr)
