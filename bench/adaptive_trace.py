"""adaptive_trace.py - one configuration on one row of bench-adaptive, once, as a time line:
what `bench/adaptive.py --rows ROW --trace CFG` prints instead of the report.

For looking into a row: its columns, the goodput of each phase of the overload (the warm-up
aside) and of the first second after each step, then every 50 ms sample of the compartment
(the limit, what is in flight, the baseline and the last window's mean latency) with the
replies of those 50 ms, from just before the overload to just after it. Writes no file.
"""

from bisect import bisect_left

import adaptive_rows


def replies(ok, a, b):
    """Successes (their sorted end times, ok) in [a, b)."""
    return bisect_left(ok, b) - bisect_left(ok, a)


def phases(s, ok, start):
    """Goodput per phase of the overload from `start` (after its warm-up),
    and the replies in the first second after each step."""
    marks = s["marks"]
    edges = [start] + marks[1:] + [s["t_end"]]
    out = ["%.0f/s" % (replies(ok, a, b) / (b - a)) for a, b in zip(edges, edges[1:]) if b > a]
    out += ["%d in 1 s after the step at %.1f s" % (replies(ok, m, m + 1), m - marks[0])
            for m in marks[1:]]
    return out


def trace(row, name, tm, log, pg=None):
    """Runs `name` on `row` once and logs its time line."""
    s = adaptive_rows.run(row, name, tm, pg)
    ok = sorted(r[0] for r in s["reqs"] if r[1] == "ok")
    log("%s on %s: goodput %.1f/s p50 %.1f ms p99 %.1f ms refused/s %.1f limit %s settle %s" % (
        name, row.name, s["goodput"], s["p50"], s["p99"], s["refused_s"], s["limit"],
        s["settle"]))
    t0 = s["marks"][0]
    log("phases (after the warm-up): " + ", ".join(phases(s, ok, t0 + tm.warm)))
    log("   t s  limit  inflight  baseline_us  sample_us  replies/50ms   (t from the overload)")
    for t, lim, inf, base, smp in s["samples"]:
        if t0 - 0.2 <= t <= s["t_end"] + 0.2:
            log("%6.2f  %5s  %8s  %11s  %9s  %12d" % (t - t0, lim, inf, base, smp,
                                                          replies(ok, t - 0.05, t)))
