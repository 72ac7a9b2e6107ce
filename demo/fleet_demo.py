#!/usr/bin/env python3
"""fleet_demo.py - `make demo-fleet`: per-host limits overrun a database; a fleet budget never does.

usage: fleet_demo.py [--build DIR] [--out DIR] [--quick]

Five "hosts" on this machine (a segment, a client program under the shim and,
in the second run, a `bulkshim fleet` agent each) talk to one "database": the
witness (tests/fleet/witness.py), which counts the connections the whole fleet
holds. The database takes 50. Each host is allowed 24, which is harmless on
one host and 120 on five. First run: per-host limits only. Second run: the
same hosts with fleet_limit = 50, leased from a real redis-server (on a Unix
socket); the load
moves from host to host, and one agent is killed. Prints a table and draws
OUT/fleet.png (shares over time) with gnuplot when it is installed.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TESTS = os.path.join(ROOT, "tests", "fleet")
HOSTS, DB_LIMIT, PER_HOST, FLOOR, LEASE_MS, HOLD_MS = 5, 50, 24, 2, 1500, 150

procs = []


def start(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    procs.append(p)
    return p


def stop_all():
    for p in reversed(procs):
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGCONT)
                p.terminate()
                p.wait(5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                p.kill()


class Host:
    def __init__(self, i, args, tmp, tag, witness_port, redis_sock):
        self.name = "host%d" % (i + 1)
        self.segment = "%s_%s" % (tag, self.name)
        self.ctl = os.path.join(tmp, self.name + ".ctl")
        self.set_load(0)
        fleet = ""
        comp = "max_connections = %d;" % PER_HOST
        if redis_sock:
            # owner: the agent, started first, creates the segment for the clients' user.
            fleet = ('owner = %d;\nfleet = { redis = "unix:%s"; name = "%s"; host = "%s"; '
                     'hosts = %d; lease_ms = %d; };\n' % (os.geteuid(), redis_sock, tag,
                                                           self.name, HOSTS, LEASE_MS))
            comp += " fleet_limit = %d; fleet_floor = %d;" % (DB_LIMIT, FLOOR)
        self.config = os.path.join(tmp, self.name + ".cfg")
        with open(self.config, "w") as f:
            f.write('segment = "%s";\n%scompartments = ( { name = "db"; destinations = '
                    '[ "127.0.0.1:%d" ]; %s } );\n' % (self.segment, fleet, witness_port, comp))
        self.args = args
        self.agent = None
        env = dict(os.environ, LD_PRELOAD=os.path.join(args.build, "libbulkshim.so"),
                   BULKSHIM_CONFIG=self.config, BULKSHIM_STRICT="1", BULKSHIM_LOG="error")
        if redis_sock:
            self.agent = start([os.path.join(args.build, "bulkshim"), "fleet", "-c", self.config],
                               stderr=open(os.path.join(tmp, self.name + ".agent.log"), "w"))
            wait(lambda: os.path.exists("/dev/shm/bulkshim." + self.segment), 10)
        self.load = start([sys.executable, os.path.join(TESTS, "load.py"), str(witness_port),
                           self.ctl, str(HOLD_MS), str(PER_HOST + 4), "300"], env=env,
                          stdout=subprocess.DEVNULL)

    def set_load(self, n):
        with open(self.ctl + ".tmp", "w") as f:
            f.write("%d\n" % n)
        os.rename(self.ctl + ".tmp", self.ctl)

    def status(self):
        r = subprocess.run([os.path.join(self.args.build, "bulkshim"), "status", "-s",
                            self.segment, "--json"], capture_output=True, text=True, timeout=10)
        try:
            return json.loads(r.stdout)["compartments"][0]
        except (ValueError, KeyError, IndexError):
            return {}

    def cleanup(self):
        try:
            os.unlink("/dev/shm/bulkshim." + self.segment)
        except FileNotFoundError:
            pass


def wait(pred, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def run_phases(hosts, phases, samples, t0):
    """Runs each (title, busy hosts, seconds, action) and samples every host's
    live limit and connections in use; returns per-phase rows."""
    rows = []
    for title, busy, secs, action, *watch in phases:
        # Whose shares must follow: the busy hosts whose agent runs.
        watch = watch[0] if watch else list(busy)
        for i, h in enumerate(hosts):
            h.set_load(PER_HOST + 4 if i in busy else 0)
        if action:
            action()
        start_t = time.monotonic()
        follow = None
        while time.monotonic() - start_t < secs:
            t = time.monotonic()
            st = [h.status() for h in hosts]
            lim = [s.get("live_limit", 0) for s in st]
            use = [s.get("in_use", 0) for s in st]
            samples.append([t - t0] + lim + use)
            # Followed: each watched host has (nearly) its fair share of
            # what the others leave: all but their floors.
            fair = (DB_LIMIT - FLOOR * (HOSTS - len(watch))) // max(1, len(watch))
            target = min(PER_HOST, fair) - 2
            if follow is None and watch and all(lim[i] >= target for i in watch):
                follow = t - start_t
            time.sleep(0.2)
        rows.append((title, start_t - t0, time.monotonic() - t0, follow,
                     [h.status().get("live_limit", 0) for h in hosts]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    out = os.path.abspath(args.out or os.path.join(args.build, "demo-fleet"))
    os.makedirs(out, exist_ok=True)
    if not shutil.which("redis-server"):
        sys.exit("demo-fleet: redis-server is not installed (apt-get install redis-server)")
    tmp = tempfile.mkdtemp(prefix="bulkshim-demo-fleet-")
    tag = "demofleet%d" % os.getpid()
    secs = 3 if args.quick else 5
    hosts = []
    try:
        # ---- run 1: per-host limits only ----
        wfile = os.path.join(tmp, "w1")
        w1 = start([sys.executable, os.path.join(TESTS, "witness.py"), wfile + ".port",
                    wfile + ".json", "300"])
        wait(lambda: os.path.exists(wfile + ".port"), 10)
        wport = int(open(wfile + ".port").read())
        hosts = [Host(i, args, tmp, tag + "a", wport, None) for i in range(HOSTS)]
        print("run 1: %d hosts, each limited to %d connections, no fleet budget (%ds)"
              % (HOSTS, PER_HOST, secs), flush=True)
        samples1 = []
        t0 = time.monotonic()
        run_phases(hosts, [("all five busy", range(HOSTS), secs, None)], samples1, t0)
        for h in hosts:
            h.set_load(0)
        w1.terminate()
        w1.wait(10)
        peak1 = json.load(open(wfile + ".json"))["max"]
        for h in hosts:
            h.load.terminate()
            h.cleanup()

        # ---- run 2: the same hosts with one fleet budget ----
        rsock = os.path.join(tmp, "redis.sock")
        start(["redis-server", "--port", "0", "--unixsocket", rsock, "--save", "",
               "--appendonly", "no", "--dir", tmp, "--logfile", os.path.join(tmp, "redis.log")],
              stdout=subprocess.DEVNULL)
        wait(lambda: os.path.exists(rsock), 10)
        wfile = os.path.join(tmp, "w2")
        w2 = start([sys.executable, os.path.join(TESTS, "witness.py"), wfile + ".port",
                    wfile + ".json", "300"])
        wait(lambda: os.path.exists(wfile + ".port"), 10)
        wport = int(open(wfile + ".port").read())
        time.sleep(0.3)
        hosts = [Host(i, args, tmp, tag + "b", wport, rsock) for i in range(HOSTS)]
        wait(lambda: all(h.status().get("fleet_lease") for h in hosts), 10)
        print("run 2: the same %d hosts with fleet_limit = %d leased from Redis, floor %d, "
              "lease %d ms" % (HOSTS, DB_LIMIT, FLOOR, LEASE_MS), flush=True)
        samples = []
        t0 = time.monotonic()
        phases = [
            ("all five busy", range(HOSTS), secs, None),
            ("load moves to hosts 1-2", [0, 1], secs, None),
            ("load moves to host 5", [4], secs, None),
            ("hosts 3-4 busy, host 3's agent killed", [2, 3], secs + 1,
             lambda: hosts[2].agent.kill(), [3]),
            ("all five busy again (host 3 on its floor)", range(HOSTS), secs, None, [0, 1, 3, 4]),
        ]
        rows = run_phases(hosts, phases, samples, t0)
        for h in hosts:
            h.set_load(0)
        w2.terminate()
        w2.wait(10)
        wit = json.load(open(wfile + ".json"))
    finally:
        stop_all()
        for h in hosts:
            h.cleanup()

    tl = [[t - t0, n] for t, n in wit["timeline"]]

    def peak(a, b):
        worst = 0
        for i, (t, n) in enumerate(tl):
            nxt = tl[i + 1][0] if i + 1 < len(tl) else 1e9
            if nxt >= a and t <= b:
                worst = max(worst, n)
        return worst

    print()
    print("The database takes %d connections. %d hosts x %d allowed each = %d."
          % (DB_LIMIT, HOSTS, PER_HOST, HOSTS * PER_HOST))
    print()
    print("%-50s %9s %14s  %s" % ("PHASE", "DB PEAK", "SHARES FOLLOW", "LIVE LIMITS AT END"))
    print("%-50s %5d/%-3d %14s  %s" % ("per-host limits only, all five busy", peak1, DB_LIMIT,
                                     "-", "%d each" % PER_HOST))
    for title, a, b, follow, lims in rows:
        print("%-50s %5d/%-3d %14s  %s" % ("fleet: " + title, peak(a, b), DB_LIMIT,
                                         "%.2f s" % follow if follow is not None else "-",
                                         " ".join("%2d" % x for x in lims)))
    worst = max(n for _, n in tl)
    print()
    print("without a fleet budget the database saw %d connections (%s its %d);"
          % (peak1, "over" if peak1 > DB_LIMIT else "within", DB_LIMIT))
    print("with one it saw at most %d, and shares followed the load." % worst)

    data = os.path.join(out, "fleet.dat")
    with open(data, "w") as f:
        f.write("# t " + " ".join("limit_%s" % h.name for h in hosts) + " " +
                " ".join("in_use_%s" % h.name for h in hosts) + "\n")
        for row in samples:
            f.write(" ".join("%.3f" % x if isinstance(x, float) else str(x) for x in row) + "\n")
    wdata = os.path.join(out, "witness.dat")
    with open(wdata, "w") as f:
        for t, n in tl:
            if t >= 0:
                f.write("%.3f %d\n" % (t, n))
    png = os.path.join(out, "fleet.png")
    if shutil.which("gnuplot"):
        marks = "".join("set arrow from %.2f, graph 0 to %.2f, graph 1 nohead dt 3 lc rgb '#999999'\n"
                        "set label \"%s\" at %.2f, graph %.2f font ',8'\n"
                        % (a, a, title, a + 0.1, 0.97 - 0.04 * (k % 2))
                        for k, (title, a, _, _, _) in enumerate(rows))
        plots = ", ".join("'%s' using 1:%d with steps lw 2 title 'share of %s'" % (data, i + 2, h.name)
                          for i, h in enumerate(hosts))
        gp = ("set terminal pngcairo size 1200,640 noenhanced\nset output '%s'\n"
              "set title 'Fleet budget: %d hosts x %d allowed each, database takes %d "
              "(without the budget it saw %d)'\n"
              "set xlabel 'seconds'\nset ylabel 'connections'\nset key outside right\n"
              "set yrange [0:%d]\n%s"
              "plot %s, '%s' using 1:2 with steps lw 2 lc rgb 'black' title 'database (witness)', "
              "%d with lines dt 2 lw 2 lc rgb 'red' title 'fleet_limit'\n"
              % (png, HOSTS, PER_HOST, DB_LIMIT, peak1, DB_LIMIT + 15, marks, plots, wdata, DB_LIMIT))
        with open(os.path.join(out, "fleet.gp"), "w") as f:
            f.write(gp)
        r = subprocess.run(["gnuplot", os.path.join(out, "fleet.gp")], capture_output=True, text=True)
        print("picture: %s" % png if r.returncode == 0 else "gnuplot failed: %s" % r.stderr)
    else:
        print("no picture: gnuplot is not installed (apt-get install gnuplot-nox); data in %s" % data)
    shutil.rmtree(tmp, True)
    return 0 if worst <= DB_LIMIT and peak1 > DB_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
