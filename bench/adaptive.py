#!/usr/bin/python3
"""adaptive.py - `make bench-adaptive`: every adaptive controller and the best static limit on
one matrix of rows, in one interleaved run, with a PASS/MISS verdict per row for ours.

usage: adaptive.py [--build DIR] [--out bench/adaptive.md] [--results bench/results.md]
                   [--quick] [--rows NAMES] [--controllers NAMES] [--statics C/2,C,2C]
                   [--repeat N] [--long SECONDS] [--note TEXT]
       adaptive.py --rows ROW --trace CONFIGURATION [--build DIR] [--quick]

The rows (bench/adaptive_rows.py): offered load 1.25x to 6x the capacity of
tests/preload/capserver.py (C requests at once, S ms each, the rest queued), a
capacity drop C -> C/4 -> C, a latency step 5 ms -> 2 s -> 5 ms, exponential
service times, and PostgreSQL running a CPU-bound query (bench/adaptive_pg.py),
where every extra query slows all of them. Each configuration of a row runs
the same schedule: 0.75 C client threads below capacity, then the row's
overload on top for its length, then 0.75 C again; the configurations of a
row run in an order that rotates from row to row, then again in the reverse
order (--repeat, 2 by default), and each configuration's columns pool its
runs. Writes the report to
--out, a picture per row to build/adaptive-ROW.png, and replaces the section
between the adaptive markers of --results with the verdicts. With --trace, it
runs one configuration once on one row and prints its time line instead
(bench/adaptive_trace.py), writing nothing.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, "tests", "preload"))
sys.path.insert(0, HERE)

BEGIN = "<!-- adaptive: begin (bench/adaptive.py writes this section) -->"
END = "<!-- adaptive: end -->"
QUICK_ROWS = "load 2x,drop,postgres"


def log(msg):
    print(msg, flush=True)


def args_of():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(HERE, "adaptive.md"))
    ap.add_argument("--results", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--quick", action="store_true",
                    help="short phases, rows %r and static C only, unless --rows or --statics "
                    "say otherwise" % QUICK_ROWS)
    ap.add_argument("--rows", help="comma-separated row names (default: all)")
    ap.add_argument("--controllers", help="comma-separated controllers (default: all)")
    ap.add_argument("--statics", help="comma-separated static limits in multiples of C "
                    "(default C/2,C,2C)")
    ap.add_argument("--repeat", type=int, default=0,
                    help="runs of each configuration per row, pooled (default 2; 1 with --quick)")
    ap.add_argument("--long", type=float, default=0.0,
                    help="seconds of a sustained 6C overload for ours alone (default 0: none)")
    ap.add_argument("--note", default="", help="a line for the report (the machine's load)")
    ap.add_argument("--trace", metavar="CONFIGURATION",
                    help="run this configuration (a controller or \"static N\") once on the "
                    "one row of --rows and print its time line; no report")
    return ap.parse_args()


def drift_of(row, tm, seconds):
    """Ours alone under a long overload: the limit, p99 and goodput per minute."""
    import adaptive_rows
    tm.warm, tm.steady = 0.0, seconds
    s = adaptive_rows.run(row, adaptive_rows.OURS, tm)
    out = []
    for k in range(int(seconds // 60)):
        a, b = s["marks"][0] + 60 * k, s["marks"][0] + 60 * (k + 1)
        lims = [x[1] for x in s["samples"] if a <= x[0] < b and x[1] is not None]
        ok = [r[2] for r in s["reqs"] if a <= r[0] < b and r[1] == "ok"]
        if lims:
            out.append((k + 1, sum(lims) / len(lims), adaptive_rows.pct(ok, 0.99), len(ok) / 60))
    return out


def trace_one(row, name, tm, pgbin, harness):
    """--trace: `name` once on `row`, as a time line."""
    import adaptive_rows
    import adaptive_trace
    if name not in adaptive_rows.CONTROLLERS and not (
            name.startswith("static ") and name[7:].isdigit()):
        sys.exit("bench-adaptive: --trace takes a controller (%s) or \"static N\"" % (
            ", ".join(adaptive_rows.CONTROLLERS)))
    pg = adaptive_rows.pg_for(row, pgbin)
    try:
        adaptive_trace.trace(row, name, tm, log, pg)
    finally:
        if pg:
            pg.stop()
        harness.cleanup()


def main():
    args = args_of()
    build = os.path.abspath(args.build)
    os.environ["BULKSHIM_BUILD"] = build
    cbin = os.path.join(build, "tests", "legacy_client")
    pgbin = os.path.join(build, "bench", "pg_client")
    for b in (cbin, pgbin):
        if not os.access(b, os.X_OK):
            sys.exit("bench-adaptive: %s is not built (make bench-adaptive builds it)" % b)
    os.environ["BULKSHIM_ADAPTIVE_CLIENT"] = cbin
    import harness
    import adaptive_report
    import adaptive_rows

    tm = adaptive_rows.Timing(args.quick)
    repeat = args.repeat if args.repeat > 0 else (1 if args.quick else 2)
    rows = adaptive_rows.rows()
    want = args.rows or (QUICK_ROWS if args.quick else None)
    if want:
        names = [w.strip() for w in want.split(",")]
        bad = [w for w in names if w not in [r.name for r in rows]]
        if bad:
            sys.exit("bench-adaptive: unknown rows %s (rows: %s)" % (
                bad, ", ".join(r.name for r in rows)))
        rows = [r for r in rows if r.name in names]
    if args.trace:
        if len(rows) != 1:
            sys.exit("bench-adaptive: --trace needs one row in --rows")
        trace_one(rows[0], args.trace, tm, pgbin, harness)
        return
    ctls = args.controllers.split(",") if args.controllers else list(adaptive_rows.CONTROLLERS)
    statics = args.statics.split(",") if args.statics else (
        ["C"] if args.quick else list(adaptive_rows.STATICS))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = open("/proc/loadavg").read().split()[:3]
    t_start = time.monotonic()
    matrix, pg = [], None
    try:
        for turn, row in enumerate(rows):
            cfgs = ctls + ["static %d" % n for n in dict.fromkeys(row.statics(statics))]
            log("bench-adaptive: row %s (%s), %s" % (row.name, row.what, ", ".join(cfgs)))
            res, probe = adaptive_rows.run_row(row, cfgs, tm, pgbin, turn, log, repeat)
            pg = probe or pg
            # The report lists the configurations in a fixed order.
            res = {n: res[n] for n in cfgs}
            matrix.append((row, res, adaptive_report.verdict(res)))
            adaptive_report.picture(os.path.join(build, "adaptive-%s.png" %
                                                 adaptive_report.slug(row.name)), row, res)
        drift = drift_of(adaptive_rows.rows()[4], tm, args.long) if args.long > 0 else None
    finally:
        harness.cleanup()
    minutes = (time.monotonic() - t_start) / 60
    load_end = open("/proc/loadavg").read().split()[:3]
    tm_text = "%.1f s below capacity, then the overload (%.1f s warm-up excluded, %s), then " \
              "%.1f s below capacity" % (tm.below, tm.warm, "%.0f s steady" % tm.steady
                                         if tm.steady else "", tm.below)
    head = ["# Adaptive limits: every controller on one matrix", "",
            "`make bench-adaptive` (bench/adaptive.py%s), run %s on the 2-core shared machine, "
            "%.0f minutes; load average %s at the start, %s at the end.%s" % (
                ", --quick" if args.quick else "", started, minutes, " ".join(load),
                " ".join(load_end), (" " + args.note) if args.note else ""),
            "",
            "Each row runs every configuration in turn (the order rotates from row to row)%s: "
            "%s, steps at thirds of a %.0f s overload. Client: tests/preload/legacy_client.c "
            "(bench/pg_client.c for PostgreSQL), a thread per request, no timeouts, a refused "
            "thread pauses 50 ms; 0.75 C threads all along, the row's threads in the overload. "
            "Controllers: min 1, max 4C (the static ceiling), defaults otherwise; aimd and vegas "
            "with timeout_ms = 2 S (at its 5 s default aimd never cuts). Static limits tried, in "
            "multiples of C: %s; the best is the highest goodput, ties (within 2 %%) to the "
            "lower p99." % (
                (", then again in the reverse order (%s); a configuration's columns pool "
                 "its %d runs (goodput and refused/s over their spans together, p50 and p99 over "
                 "all their successes, limit range over all, the slower settle; the picture shows "
                 "the first run), so that one run's luck (the waves 20 clients fall into on 16 "
                 "servers, a busy minute of the machine) decides less" % (
                     "%d runs of each, alternating" % repeat, repeat)) if repeat > 1 else "",
                tm_text, 3 * tm.step, ", ".join(statics)),
            "",
            "Columns: goodput and p50/p99 of successes over the overload after its warm-up; "
            "refused/s in that span; refused below capacity: the 0.75 C threads' refusals before "
            "the overload and from 1 s after it; settle (drop and latency rows): seconds after "
            "each step until the limit is within 30 % of the capacity it sets (C/4 then C; the "
            "latency step keeps C) and stays within 50 % for 1 s, \"never\" if not within the "
            "step; limit range: min..max of the limit sampled every 50 ms after the warm-up. "
            "PostgreSQL: one connection per query, so the limit is max_connections (the "
            "connection is the request); C = 2, the cores."]
    text, summ = adaptive_report.report(matrix, head, pg, drift)
    # The numbers behind the report, for a second look (not committed).
    with open(os.path.join(build, "adaptive.json"), "w") as f:
        json.dump([{"row": row.name, "what": row.what, "configs": {
            n: {k: v for k, v in s.items() if k not in ("samples", "reqs", "ok")}
            for n, s in res.items()}} for row, res, _ in matrix], f, indent=1)
    with open(args.out, "w") as f:
        f.write(text)
    log(text)
    section = "%s\n## Adaptive limits\n\nFrom `make bench-adaptive`, %s; every row, its columns " \
              "and the PostgreSQL query are in [bench/adaptive.md](adaptive.md).\n\n%s\n%s\n" % (
                  BEGIN, started + (" (--quick)" if args.quick else ""), "\n".join(summ), END)
    try:
        with open(args.results) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + section + old[old.index(END) + len(END) + 1:]
    else:
        new = old.rstrip("\n") + "\n\n" + section
    with open(args.results, "w") as f:
        f.write(new)


if __name__ == "__main__":
    main()
