"""goodput.py - one fleet budget against a static split and against one host holding it all, on the same clients.

Three setups run side by side on this machine, each with a witness server of
its own (tests/fleet/witness.py, which counts live connections and times
every accept):

- fleet: three hosts (a segment, a `bulkshim fleet` agent, a client program
  under the shim each) sharing fleet_limit, leased from a real redis-server;
- static: the same three hosts' clients with max_connections = limit / 3
  each and no fleet: the budget split once and for all;
- single: one host allowed the whole limit, with the clients of one host.

Every client program is tests/fleet/load.py: threads that connect, hold the
connection HOLD_MS and close, a refused connect retried after RETRY_MS. A
phase says which hosts are busy (all their threads working) over time; the
fleet's and the static split's hosts get the same load at the same moment,
and the single host works whenever any host does. Goodput is the service
each witness gave during the phase: the connection-seconds it held open
within the phase, in connections of HOLD_MS (a connection that spans the
start of a phase counts in each phase for the time it spent there, so a
host that gives back what it opened before a phase is not charged with it,
nor a setup whose connections all start with the phase credited with them);
the connections each witness accepted during the phase are reported beside
it. Churn is the share changes each agent logged (`-v`), per minute.
"""

import os
import re
import time

import harness
import harness_io
import harness_fleet as hf

NAMES = "abc"
SHARE_LINE = re.compile(r": share \d+ -> \d+ ")


def served_between(timeline, t0, t1):
    """Connection-seconds a witness held open between t0 and t1: the integral
    of its count of live connections ([[t, n], ...]) over the span."""
    total = 0.0
    for i, (t, n) in enumerate(timeline):
        nxt = timeline[i + 1][0] if i + 1 < len(timeline) else t1
        lo, hi = max(t, t0), min(nxt, t1)
        if hi > lo:
            total += n * (hi - lo)
    return total


class Plain:
    """A host without a fleet: its segment allows `limit`, and its client program."""

    def __init__(self, name, port, limit, hold_ms, threads, retry_ms, max_seconds):
        self.name = name
        self.segment = harness.new_segment()
        self.config = harness.write_file(harness_io.config_text(
            [{"name": hf.COMP, "destinations": ["127.0.0.1:%d" % port],
              "max_connections": limit}], self.segment, {"owner": os.geteuid()}))
        self.ctl = harness.write_file("0", suffix=".ctl")
        self.load = hf.start_load([harness.PY, os.path.join(hf.FLEET_DIR, "load.py"), str(port),
                                   self.ctl, str(hold_ms), str(threads), str(max_seconds),
                                   str(retry_ms)],
                                  harness.shim_env(self.config, strict="1"), self.ctl)

    def set_load(self, n):
        hf.set_control(self.ctl, n)


class Bed:
    """The three setups, their witnesses and one Redis; phases run on all at once."""

    def __init__(self, limit, floor, hold_ms=300, threads=None, retry_ms=50, lease_ms=1500,
                 max_seconds=300):
        self.limit, self.floor, self.hold_ms = limit, floor, hold_ms
        self.threads = threads or limit
        self.redis = hf.Redis()
        self.w = {k: hf.Witness(max_seconds) for k in ("fleet", "static", "single")}
        name = harness.unique("fleet")
        self.fleet = [hf.Host(n, name, self.redis.address(), self.w["fleet"].port, limit, floor,
                              limit, lease_ms) for n in NAMES]
        for h in self.fleet:
            h.start_agent()
        hf.wait_for(lambda: all(h.leased() for h in self.fleet), 10,
                    "every agent to hold a lease")
        t_leased = time.monotonic()
        load = [harness.PY, os.path.join(hf.FLEET_DIR, "load.py")]
        for h in self.fleet:
            h.load = hf.start_load(load + [str(self.w["fleet"].port), h.ctl, str(hold_ms),
                                           str(self.threads), str(max_seconds), str(retry_ms)],
                                   harness.shim_env(h.config, strict="1"), h.ctl)
        self.static = [Plain(n, self.w["static"].port, limit // len(NAMES), hold_ms,
                             self.threads, retry_ms, max_seconds) for n in NAMES]
        self.single = Plain("one", self.w["single"].port, limit, hold_ms, self.threads, retry_ms,
                            max_seconds)
        # A fleet Redis has no state for gives out floors only for its
        # first lease (its quiet start, once per Redis restart): the phases
        # measure a fleet past it, as the other setups have no such start.
        left = t_leased + lease_ms / 1000.0 - time.monotonic()
        if left > 0:
            time.sleep(left)
        self.phases = []

    def busy(self, names):
        """Makes the hosts in names busy and the others idle, in every setup."""
        for h in self.fleet + self.static:
            h.set_load(self.threads if h.name in names else 0)
        self.single.set_load(self.threads if names else 0)

    def changes(self):
        """Share changes each agent has logged so far."""
        return [len(SHARE_LINE.findall(h.agent_log())) for h in self.fleet]

    def phase(self, name, steps, seconds, faults=None):
        """Runs one phase: steps is [(offset_s, busy names)], faults is
        [(offset_s, fn)] run during the phase (agent kills, Redis frozen)."""
        events = sorted([(t, "load", b) for t, b in steps] + [(t, "fault", f)
                                                                  for t, f in (faults or [])],
                        key=lambda e: e[0])
        c0 = self.changes()
        t0 = time.monotonic()
        for at, kind, what in events:
            left = t0 + at - time.monotonic()
            if left > 0:
                time.sleep(left)
            if kind == "load":
                self.busy(what)
            else:
                what(self)
        left = t0 + seconds - time.monotonic()
        if left > 0:
            time.sleep(left)
        t1 = time.monotonic()
        c1 = self.changes()
        self.phases.append({"name": name, "t0": t0, "t1": t1,
                            "changes": [y - x for x, y in zip(c0, c1)]})

    def results(self):
        """Stops the witnesses; per phase: goodput and worst count of each setup,
        ratios, and the agents' share changes per minute."""
        self.busy(())
        out = {k: w.finish() for k, w in self.w.items()}
        rows = []
        for p in self.phases:
            r = dict(p)
            secs = p["t1"] - p["t0"]
            for k in self.w:
                r[k] = served_between(out[k]["timeline"], p["t0"], p["t1"]) * 1000.0 / self.hold_ms
                r[k + "_accepted"] = sum(1 for t in out[k]["accepts"] if p["t0"] <= t < p["t1"])
                r[k + "_max"] = self.w[k].max_between(p["t0"], p["t1"])
            r["vs_static"] = r["fleet"] / r["static"] if r["static"] else float("inf")
            r["vs_single"] = r["fleet"] / r["single"] if r["single"] else float("inf")
            r["churn"] = [c * 60.0 / secs for c in p["changes"]]
            rows.append(r)
        return rows


# ---- the schedule ----

def alternate(seconds, names=("a", "b"), every=1.0):
    """Steps that make one host of names busy after the other, every `every` s."""
    steps, t, i = [], 0.0, 0
    while t < seconds:
        steps.append((t, (names[i % len(names)],)))
        t += every
        i += 1
    return steps


def kill_agent(name):
    def fn(bed):
        h = [x for x in bed.fleet if x.name == name][0]
        h.kill_agent()
    return fn


def restart_agent(name):
    def fn(bed):
        h = [x for x in bed.fleet if x.name == name][0]
        h.start_agent()
    return fn


def freeze_redis(bed):
    bed.redis.freeze()


def thaw_redis(bed):
    bed.redis.thaw()


def run_schedule(bed, seconds, faults=True):
    """The phases of the comparison, each `seconds` long; with faults, one more
    phase (all busy) in which an agent is SIGKILLed and restarted and Redis is
    frozen for a fifth of it."""
    bed.phase("one busy", [(0, ("a",))], seconds)
    bed.phase("two busy", [(0, ("a", "b"))], seconds)
    bed.phase("three busy", [(0, ("a", "b", "c"))], seconds)
    bed.phase("bursts alternating every 1 s", alternate(seconds), seconds)
    if faults:
        s = seconds
        bed.phase("three busy, agent SIGKILLed, Redis frozen", [(0, ("a", "b", "c"))], s,
                  [(0.1 * s, kill_agent("a")), (0.35 * s, restart_agent("a")),
                   (0.55 * s, freeze_redis), (0.75 * s, thaw_redis)])
    return bed.results()


def table(rows, limit):
    """The rows as a Markdown table."""
    lines = ["| phase | fleet | static split | single host | fleet / static | fleet / single "
             "| accepted: fleet / static / single | witness max (fleet, limit %d) "
             "| share changes per agent per minute |" % limit,
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append("| %s | %.0f | %.0f | %.0f | %.3f | %.3f | %d / %d / %d | %d | %s |" % (
            r["name"], r["fleet"], r["static"], r["single"], r["vs_static"], r["vs_single"],
            r["fleet_accepted"], r["static_accepted"], r["single_accepted"],
            r["fleet_max"], " / ".join("%.0f" % c for c in r["churn"])))
    return "\n".join(lines)
