#!/usr/bin/python3
"""fleet.py - `make bench-fleet`: a fleet budget against a static split of it and against one host holding it all.

usage: fleet.py [--build DIR] [--baseline TREE] [--out bench/fleet.md] [--seconds S]
                [--runs N] [--limit L] [--floor F]

Runs tests/fleet/goodput.py's schedule (one host busy, then two, then all
three, then bursts alternating between two hosts every second, then all
three with an agent SIGKILLed and restarted and Redis frozen) N times, S
seconds a phase, on three setups side by side: the fleet (fleet_limit L,
fleet_floor F, each host's ceiling L), a static split (L/3 a host) and one
host allowed L, each with its own witness server and the same clients.
With --baseline TREE (another checkout, built in TREE/build), each run is
made with that tree's agent and library too, one after the other, so that
the two sit side by side; this file and tests/fleet/{goodput,witness,load}.py
are copied into TREE first, so that both run the same clients and witness
with each tree's own reader of its segments. Writes the tables
to --out: goodput (connections each witness accepted), the ratios, the
witness's worst count of the fleet, and each agent's share changes per
minute. Nothing here asserts on time; `make test` (tests/fleet/
test_fleet_share.py) asserts the safety and wide ratios.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def one_run(args):
    """In a child process (harness reads its build at import): one schedule,
    its rows written as JSON to args.json."""
    os.environ["BULKSHIM_BUILD"] = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
    sys.path.insert(0, os.path.join(ROOT, "tests", "fleet"))
    import harness
    import goodput

    try:
        bed = goodput.Bed(args.limit, args.floor)
        rows = goodput.run_schedule(bed, args.seconds)
    finally:
        harness.cleanup()
    text = goodput.table(rows, args.limit)
    print(text, flush=True)
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "table": text}, f)


# What a run needs of this tree, copied into a baseline tree (whose own
# harness reads its own segment layout).
HARNESS = ["bench/fleet.py", "tests/fleet/goodput.py", "tests/fleet/witness.py",
           "tests/fleet/load.py"]


def run_child(args, tree, build):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    argv = [sys.executable, os.path.join(tree, "bench", "fleet.py"), "--child", "--json", path,
            "--build", build,
            "--seconds", str(args.seconds), "--limit", str(args.limit), "--floor",
            str(args.floor)]
    subprocess.run(argv, check=True, timeout=120 + 10 * args.seconds)
    with open(path) as f:
        run = json.load(f)
    os.unlink(path)
    return run


def summary(builds, limit):
    """Median over the runs, per phase, each build's ratios and churn side by side."""
    names = [r["name"] for r in next(iter(builds.values()))[0]["rows"]]
    head = "| phase |"
    rule = "|---|"
    for label in builds:
        head += " fleet / static (%s) | fleet / single (%s) | witness max (%s) | share changes " \
                "per agent per minute (%s) |" % (label, label, label, label)
        rule += "---:|---:|---:|---:|"
    lines = [head, rule]
    for i, name in enumerate(names):
        line = "| %s |" % name
        for label, runs in builds.items():
            rows = [run["rows"][i] for run in runs]
            line += " %.3f | %.3f | %d | %.0f |" % (
                statistics.median(r["vs_static"] for r in rows),
                statistics.median(r["vs_single"] for r in rows),
                max(r["fleet_max"] for r in rows),
                statistics.median(max(r["churn"]) for r in rows))
        lines.append(line)
    return "\n".join(lines)


# What a fleet budget must show, phase by phase, against the medians of this build.
TARGETS = [("one busy", "vs_static", 1.0), ("one busy", "vs_single", 0.9),
           ("two busy", "vs_static", 1.0), ("three busy", "vs_static", 1.0),
           ("bursts alternating every 1 s", "vs_static", 1.0)]
MOST_CHURN = 180    # share changes per agent per minute, the agent of before


def verdicts(builds, limit):
    """This build's medians against the targets, each with its figure."""
    runs = next(iter(builds.values()))
    lines = ["Targets, on the medians of this build:", ""]
    names = [r["name"] for r in runs[0]["rows"]]
    for phase, key, least in TARGETS:
        if phase not in names:
            continue
        i = names.index(phase)
        got = statistics.median(run["rows"][i][key] for run in runs)
        lines.append("- %s: fleet / %s %.3f, target >= %.2f: %s" % (
            phase, key[3:], got, least, "met" if got >= least else "**missed**"))
    worst = max(r["fleet_max"] for run in runs for r in run["rows"])
    lines.append("- witness of the fleet never above fleet_limit %d, faults included: worst %d, "
                 "%s" % (limit, worst, "met" if worst <= limit else "**missed**"))
    churn = max(max(r["churn"]) for run in runs for r in run["rows"])
    lines.append("- share changes per agent per minute below %d in every phase: most %.0f, %s"
                 % (MOST_CHURN, churn, "met" if churn < MOST_CHURN else "**missed**"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--baseline", help="another built tree to run side by side (this tree's "
                    "bench and fleet harness files are copied into it)")
    ap.add_argument("--baseline-note", help="what the baseline tree is, for the text")
    ap.add_argument("--out", default=os.path.join(HERE, "fleet.md"))
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--limit", type=int, default=36)
    ap.add_argument("--floor", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return one_run(args)
    builds = {"this build": (ROOT, args.build)}
    if args.baseline:
        tree = os.path.abspath(args.baseline)
        for f in HARNESS:
            shutil.copy(os.path.join(ROOT, f), os.path.join(tree, f))
        builds["baseline"] = (tree, os.path.join(tree, "build"))
    results = {label: [] for label in builds}
    for i in range(args.runs):
        for label, (tree, build) in builds.items():
            print("run %d of %d, %s (%s):" % (i + 1, args.runs, label, build), flush=True)
            results[label].append(run_child(args, tree, build))
    out = ["# Fleet budget: shares against a static split",
           "",
           "`make bench-fleet` (bench/fleet.py), %s, %d cores, %d runs. Three hosts on one "
           "machine, each a segment, a client program (tests/fleet/load.py: %d threads that "
           "connect, hold the connection 300 ms and close; a refused connect is retried after "
           "50 ms) and, for the fleet, a `bulkshim fleet` agent (lease 1500 ms, renewed every "
           "250 ms) leasing from a real redis-server. Three setups run side by side, each "
           "against a witness server of its own that counts live connections and times every "
           "accept: the **fleet** (fleet_limit %d, fleet_floor %d, max_connections %d a host), "
           "a **static split** (max_connections %d a host, no fleet) and a **single host** "
           "allowed %d, with one host's clients, busy whenever any host is. Goodput is the "
           "service each witness gave during a phase of %g s: the connection-seconds it held "
           "open within the phase, in connections of 300 ms, so that a connection spanning "
           "the start of a phase counts in each phase for its time there (the connections "
           "each witness accepted in the phase are shown beside it). The last phase has every host busy "
           "while host a's agent is SIGKILLed (at 10 %%) and restarted (35 %%) and Redis is "
           "frozen with SIGSTOP from 55 %% to 75 %%; the static split and the single host have "
           "no agent to lose. \"Share changes\" are those each agent logged (`-v`), the "
           "busiest agent's per minute."
           % (time.strftime("%Y-%m-%d"), os.cpu_count() or 0, args.runs, args.limit, args.limit,
              args.floor, args.limit, args.limit // 3, args.limit, args.seconds),
           ""]
    out += ["The clients are threads that hold a connection to a witness server rather than `psql` loops against PostgreSQL: three setups of three hosts side by side, each `psql` a process per query, would spend this machine's two shared cores starting processes, and the ratios would measure the CPU rather than the budget. The witness counts what a database would: live connections, and each one accepted.", ""]
    if args.baseline:
        out += ["The baseline is %s, run with the same clients and witness right after each "
                "run of this build." % (args.baseline_note or args.baseline), ""]
    out += ["## Medians", "", summary(results, args.limit), "", verdicts(results, args.limit), ""]
    for label, runs in results.items():
        for i, run in enumerate(runs):
            out += ["## %s, run %d" % (label.capitalize(), i + 1), "", run["table"], ""]
    with open(args.out, "w") as f:
        f.write("\n".join(out))
    print(summary(results, args.limit))
    print(verdicts(results, args.limit))
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
