#!/usr/bin/python3
"""adaptive.py - `make bench-adaptive`: static limits against the adaptive one, on a backend of
known capacity, driven by a legacy thread-per-request client.

usage: adaptive.py [--build DIR] [--out bench/adaptive.md] [--png build/adaptive.png]
                   [--long SECONDS] [--quick] [--client c|py]

The backend (tests/preload/capserver.py) serves at most C requests at once
for S ms each and queues the rest. The client (legacy_client.c, or the
preload tests' legacy_client.py with --client py; under the shim) runs N
threads, one request per connection at a time, no timeouts;
a refused request's thread pauses 50 ms. Each configuration runs the same
schedule: capacity C for STEADY s, then C/4 for DOWN s, then C again for UP
s. Then: the adaptive limit with offered concurrency below C (defaults, and
a ramp from initial = 1 for comparison), the latency step (5 ms -> 2 s at
capacity C, and back; static C and adaptive), and a long sustained overload
(--long, default 300 s) for baseline drift. Writes a
Markdown report and a picture (limit, in flight and latency over time
through the steps), and replaces the section between the adaptive markers
of bench/results.md with a pointer and the main table.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "preload"))

C, S = 16, 40               # capacity, service time in ms
N = 6 * C                   # offered concurrency (client threads)
STEADY, DOWN, UP = 20.0, 10.0, 15.0
WARM = 5.0                  # steady statistics start after this
BEGIN = "<!-- adaptive: begin (bench/adaptive.py writes this section) -->"
END = "<!-- adaptive: end -->"


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


def settle(rows, t0, t1, target):
    """Seconds after t0 until the sampled limit is within +-30 % of target
    and stays within +-50 % for the next second; None if never before t1."""
    pts = [(t, lim) for t, lim, *_ in rows if t0 <= t < t1 and lim is not None]
    for i, (t, lim) in enumerate(pts):
        if abs(lim - target) <= 0.3 * target:
            after = [l2 for t2, l2 in pts[i:] if t2 <= t + 1.0]
            if all(abs(l2 - target) <= 0.5 * target for l2 in after):
                return t - t0
    return None


def run_config(scenario, harness, IoShim, name, comp_extra, schedule=True, threads=N,
               seconds=None):
    """One configuration through the schedule; returns (summary, rows, requests)."""
    be = scenario.Backend(C, S)
    comp = {"name": "be", "destinations": ["127.0.0.1:%d" % be.port]}
    comp.update(comp_extra)
    shim = IoShim([comp]) if comp_extra else None
    env = shim.env(log="off") if shim else harness.clean_env()
    total = seconds or (STEADY + DOWN + UP)
    p = scenario.client(env, be.port, threads, total)
    smp = scenario.Sampler(shim.segment, "be") if shim else None
    t_start = time.monotonic()
    if schedule:
        time.sleep(max(0, STEADY - (time.monotonic() - t_start)))
        be.set(C // 4, S)
        time.sleep(max(0, STEADY + DOWN - (time.monotonic() - t_start)))
        be.set(C, S)
    reqs = scenario.results(p, total + 120)
    rows = smp.stop() if smp else []
    # The client's clock starts slightly after ours: its times are within
    # a few ms of the sampler's.
    steady = [r for r in reqs if WARM <= r[0] < STEADY]
    ok = [r[2] for r in steady if r[1] == "ok"]
    span = STEADY - WARM
    lims = [r[1] for r in rows if WARM <= r[0] < STEADY and r[1] is not None]
    static = comp_extra.get("max_inflight") if "adaptive" not in comp_extra else None
    summ = {
        "name": name,
        "goodput": len(ok) / span,
        "refusals": sum(1 for r in steady if r[1] == "refused") / span,
        "errors": sum(1 for r in reqs if r[1] not in ("ok", "refused")),
        "p50": pct(ok, 0.50), "p99": pct(ok, 0.99),
        "limit": (sum(lims) / len(lims), min(lims), max(lims)) if lims else
                 ((static, static, static) if static else None),
        "down_p99": pct([r[2] for r in reqs if STEADY + 2 <= r[0] < STEADY + DOWN
                         and r[1] == "ok"], 0.99),
        "settle_down": settle(rows, STEADY, STEADY + DOWN, C / 4) if lims else None,
        "settle_up": settle(rows, STEADY + DOWN, STEADY + DOWN + UP, C) if lims else None,
        "served_max": be.stats()["max"],
    }
    be.stop()
    return summ, rows, reqs


LAT_FAST, LAT_SLOW = 5, 2000      # ms: the latency step, at the same capacity LAT_C
# At 5 ms a Python backend of capacity 16 would be bound by its own CPU (3200
# requests/s), not by its capacity: the latency step runs at capacity 4.
LAT_C = 4
LAT_N = 6 * LAT_C
LAT_BEFORE, LAT_STALL, LAT_AFTER = 10.0, 10.0, 10.0


def run_latency_step(scenario, IoShim, name, comp_extra):
    """Latency LAT_FAST -> LAT_SLOW ms at capacity LAT_C, then back. Returns
    a summary: when the limit first is within C/4 + 30 % after the step (the
    cut a stall calls for, seen from the ages of requests in flight, before
    any slow reply), in flight during the stall, and when it is back above
    0.7 C after the return."""
    be = scenario.Backend(LAT_C, LAT_FAST)
    comp = {"name": "be", "destinations": ["127.0.0.1:%d" % be.port]}
    comp.update(comp_extra)
    shim = IoShim([comp])
    total = LAT_BEFORE + LAT_STALL + LAT_AFTER
    p = scenario.client(shim.env(log="off"), be.port, LAT_N, total)
    smp = scenario.Sampler(shim.segment, "be")
    t_start = time.monotonic()
    time.sleep(max(0, LAT_BEFORE - (time.monotonic() - t_start)))
    be.set(LAT_C, LAT_SLOW)
    t_step = time.monotonic() - smp.t0
    time.sleep(max(0, LAT_BEFORE + LAT_STALL - (time.monotonic() - t_start)))
    be.set(LAT_C, LAT_FAST)
    t_back = time.monotonic() - smp.t0
    reqs = scenario.results(p, total + 120)
    rows = smp.stop()
    be.stop()
    adaptive = "adaptive" in comp_extra
    stall = [r for r in rows if t_step <= r[0] < t_back]
    shed = next((r[0] - t_step for r in stall if r[1] is not None and
                 r[1] <= 1.3 * LAT_C / 4), None) if adaptive else None
    back = next((r[0] - t_back for r in rows if r[0] >= t_back and r[1] is not None and
                 r[1] >= 0.7 * LAT_C), None) if adaptive else None
    inflight = [r[2] for r in stall if r[0] >= t_step + 2]
    lims = [r[1] for r in stall if r[1] is not None]
    in_stall = [r for r in reqs if LAT_BEFORE <= r[0] < LAT_BEFORE + LAT_STALL]
    return {"name": name, "shed": shed, "back": back,
            "inflight": sum(inflight) / len(inflight) if inflight else float("nan"),
            "limit": (min(lims), max(lims)) if lims else None,
            "refusals": sum(1 for r in in_stall if r[1] == "refused") / LAT_STALL,
            "served": sum(1 for r in in_stall if r[1] == "ok"),
            "p99_after": pct([r[2] for r in reqs if r[0] >= LAT_BEFORE + LAT_STALL + 3
                              and r[1] == "ok"], 0.99)}


def fmt_limit(lim):
    if lim is None:
        return "-"
    mean, lo, hi = lim
    if lo == hi:
        return "%d" % lo
    return "%.1f (%d..%d)" % (mean, lo, hi)


def fmt_s(v):
    return "-" if v is None else "%.1f s" % v


def picture(path, rows, reqs, static_reqs):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    t = [r[0] for r in rows]
    a1.plot(t, [r[1] for r in rows], label="adaptive limit", color="tab:blue")
    a1.plot(t, [r[2] for r in rows], label="in flight", color="tab:orange", alpha=0.6, lw=0.8)
    cap = [(0, C), (STEADY, C), (STEADY, C // 4), (STEADY + DOWN, C // 4), (STEADY + DOWN, C),
           (STEADY + DOWN + UP, C)]
    a1.plot([x for x, _ in cap], [y for _, y in cap], "k--", label="backend capacity C", lw=1)
    a1.set_ylabel("requests")
    a1.legend(loc="upper right")
    a1.set_title("Adaptive limit against a backend of capacity %d (%d ms per request), "
                 "%d client threads" % (C, S, N))

    def rolling(rs, q):
        out = []
        for k in range(int(STEADY + DOWN + UP) * 2):
            lo, hi = k / 2, k / 2 + 0.5
            xs = [r[2] for r in rs if lo <= r[0] < hi and r[1] == "ok"]
            if xs:
                out.append((lo + 0.25, pct(xs, q)))
        return out

    for rs, lab, col in ((reqs, "adaptive p99", "tab:blue"),
                         (static_reqs, "static 4C p99", "tab:red")):
        pts = rolling(rs, 0.99)
        a2.plot([x for x, _ in pts], [y for _, y in pts], label=lab, color=col)
    a2.set_yscale("log")
    a2.set_ylabel("latency of served requests, ms (per 0.5 s)")
    a2.set_xlabel("seconds")
    a2.legend(loc="upper right")
    for ax in (a1, a2):
        for x in (STEADY, STEADY + DOWN):
            ax.axvline(x, color="grey", lw=0.5)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=90)


def main():
    global STEADY, DOWN, UP, LAT_BEFORE, LAT_STALL, LAT_AFTER
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(HERE, "adaptive.md"))
    ap.add_argument("--png", default=os.path.join(ROOT, "build", "adaptive.png"))
    ap.add_argument("--results", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--long", type=float, default=300.0)
    ap.add_argument("--quick", action="store_true", help="short phases, for a try")
    ap.add_argument("--client", choices=("c", "py"), default="c",
                    help="legacy client: tests/preload/legacy_client.c (default) or .py")
    args = ap.parse_args()
    os.environ["BULKSHIM_BUILD"] = os.path.abspath(args.build)
    cbin = os.path.join(os.path.abspath(args.build), "tests", "legacy_client")
    if args.client == "c":
        if not os.access(cbin, os.X_OK):
            sys.exit("bench-adaptive: %s is not built (make %s)" % (cbin, cbin))
        os.environ["BULKSHIM_ADAPTIVE_CLIENT"] = cbin
    if args.quick:
        STEADY, DOWN, UP = 10.0, 6.0, 10.0
        LAT_BEFORE, LAT_STALL, LAT_AFTER = 5.0, 6.0, 5.0
    import scenario
    import harness
    from harness_io import IoShim

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    adaptive = {"max_inflight": 4 * C, "adaptive": {"min": 1, "max": 4 * C}}
    configs = [("no limit", {}), ("static C/4 = %d" % (C // 4), {"max_inflight": C // 4}),
               ("static C = %d" % C, {"max_inflight": C}),
               ("static 4C = %d" % (4 * C), {"max_inflight": 4 * C}),
               ("adaptive, tolerance_pct 110", {"max_inflight": 4 * C, "adaptive": {
                   "min": 1, "max": 4 * C, "tolerance_pct": 110}}),
               ("adaptive (min 1, max 4C, defaults)", adaptive)]
    res = {}
    for name, extra in configs:
        print("bench-adaptive: %s ..." % name, flush=True)
        res[name] = run_config(scenario, harness, IoShim, name, extra)
        s = res[name][0]
        print("  goodput %.0f/s refusals %.0f/s p50 %.1f p99 %.1f limit %s settle %s / %s" % (
            s["goodput"], s["refusals"], s["p50"], s["p99"], fmt_limit(s["limit"]),
            fmt_s(s["settle_down"]), fmt_s(s["settle_up"])), flush=True)

    # Offered concurrency below C: what does adaptation refuse?
    below = {}
    for initial in (None, 1):
        ad = {"min": 1, "max": 4 * C}
        if initial:
            ad["initial"] = initial
        print("bench-adaptive: below capacity, initial %s ..." % (initial or "max (default)"),
              flush=True)
        s, rows, reqs = run_config(scenario, harness, IoShim, "below", {
            "max_inflight": 4 * C, "adaptive": ad}, schedule=False, threads=3 * C // 4,
            seconds=20)
        below[initial] = {"total": len(reqs),
                          "refused": sum(1 for r in reqs if r[1] == "refused"),
                          "refused_after_1s": sum(1 for r in reqs if r[1] == "refused" and
                                                  r[0] >= 1.0),
                          "limit_min_after_1s": min((r[1] for r in rows if r[0] >= 1.0),
                                                    default=None)}
        print("  %r" % below[initial], flush=True)

    # The latency step: 5 ms -> 2 s at the same capacity, and back.
    lat = []
    for name, extra in (("static C = %d" % LAT_C, {"max_inflight": LAT_C}),
                        ("adaptive (min 1, max 4C = %d, defaults)" % (4 * LAT_C),
                         {"max_inflight": 4 * LAT_C, "adaptive": {"min": 1, "max": 4 * LAT_C}})):
        print("bench-adaptive: latency step, %s ..." % name, flush=True)
        lat.append(run_latency_step(scenario, IoShim, name, extra))
        print("  %r" % lat[-1], flush=True)

    # A long sustained overload: does the baseline ratchet up?
    drift = None
    if args.long > 0:
        print("bench-adaptive: %d s sustained overload ..." % args.long, flush=True)
        s, rows, reqs = run_config(scenario, harness, IoShim, "long", adaptive, schedule=False,
                                   seconds=args.long)
        mins = []
        for k in range(int(args.long // 60)):
            part = [r for r in rows if 60 * k <= r[0] < 60 * (k + 1) and r[1] is not None]
            served = [r[2] for r in reqs if 60 * k <= r[0] < 60 * (k + 1) and r[1] == "ok"]
            if part:
                mins.append((k + 1, sum(r[1] for r in part) / len(part),
                             sum(r[3] for r in part) / len(part) / 1000.0,
                             pct(served, 0.99), len(served) / 60.0))
        drift = mins

    harness.cleanup()
    picture(args.png, res[configs[-1][0]][1], res[configs[-1][0]][2], res[configs[3][0]][2])

    # The best static limit is the one an operator who knew C would set:
    # C itself (4C serves as much, with four times the queue).
    best = res[configs[2][0]][0]
    top = max((res[n][0] for n, e in configs if "adaptive" not in e and e),
              key=lambda s: s["goodput"])
    ad = res[configs[-1][0]][0]
    four = res[configs[3][0]][0]
    lines = []
    lines.append("# Adaptive limits: benchmark")
    lines.append("")
    lines.append("`make bench-adaptive` (bench/adaptive.py), run %s on the 2-core shared "
                 "machine." % started)
    lines.append("Backend: capacity C = %d requests at once, %d ms each, the rest queued "
                 "(tests/preload/capserver.py). Client: %s, %d threads (%dC), one request per "
                 "connection at a time, no timeouts; a refused thread pauses 50 ms. Schedule per "
                 "row: C for %.0f s (statistics from %.0f s to %.0f s), then C/4 for %.0f s, then "
                 "C for %.0f s." % (C, S, "tests/preload/legacy_client.c" if args.client == "c"
                                    else "tests/preload/legacy_client.py", N, N // C, STEADY,
                                    WARM, STEADY, DOWN, UP))
    lines.append("")
    lines.append("| configuration | goodput/s | refusals/s | p50 ms | p99 ms | limit reached "
                 "(mean, min..max) | p99 ms after the drop | settle after drop to C/4 | "
                 "settle after return to C |")
    lines.append("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for name, _ in configs:
        s = res[name][0]
        lines.append("| %s | %.0f | %.0f | %.1f | %.1f | %s | %.0f | %s | %s |" % (
            name, s["goodput"], s["refusals"], s["p50"], s["p99"], fmt_limit(s["limit"]),
            s["down_p99"], fmt_s(s["settle_down"]), fmt_s(s["settle_up"])))
    lines.append("")
    lines.append("Settle: seconds until the sampled limit is within 30 % of the new capacity "
                 "and stays within 50 % for the next second (sampled every 50 ms).")
    lines.append("")
    lines.append("## Against the targets")
    lines.append("")
    lim = ad["limit"]
    lines.append("- Target 1, steady: limit mean %.1f (%.0f %% of C; range %d..%d); goodput "
                 "%.0f %% of the best static limit's (%s; %.0f %% of the highest static "
                 "goodput, %s); p99 %.1f ms = %.2f x the best static's %.1f ms; static 4C's "
                 "p99 %.1f ms is %.1f x the adaptive's." % (
                     lim[0], 100 * lim[0] / C, lim[1], lim[2], 100 * ad["goodput"] /
                     best["goodput"], best["name"], 100 * ad["goodput"] / top["goodput"],
                     top["name"], ad["p99"], ad["p99"] / best["p99"], best["p99"], four["p99"],
                     four["p99"] / ad["p99"]))
    for initial, b in below.items():
        lines.append("- Target 2, offered %d < C for 20 s, initial %s: %d requests, %d refused "
                     "(%d after the first second); lowest limit after 1 s: %s." % (
                         3 * C // 4, "max (default)" if initial is None else
                         "%d (a ramp from min)" % initial, b["total"], b["refused"],
                         b["refused_after_1s"], b["limit_min_after_1s"]))
    lines.append("- Target 3, steps: drop to C/4 settled in %s (target 2 s); return to C in %s "
                 "(target 10 s)." % (fmt_s(ad["settle_down"]), fmt_s(ad["settle_up"])))
    la = lat[-1]
    lines.append("- Target 3, latency step %d ms -> %d s at capacity C = %d: the adaptive limit "
                 "was within C/4 + 30 %% (<= %.1f) %s after the step (target 2 s); back above "
                 "0.7 C %s after the latency returned." % (
                     LAT_FAST, LAT_SLOW // 1000, LAT_C, 1.3 * LAT_C / 4, fmt_s(la["shed"]),
                     fmt_s(la["back"])))
    lines.append("")
    lines.append("Latency step: %d threads, capacity C = %d throughout (at 5 ms a Python backend "
                 "of capacity 16 would be bound by its CPU, not by C); %d ms for %.0f s, %d ms "
                 "for %.0f s, %d ms for %.0f s." % (LAT_N, LAT_C, LAT_FAST, LAT_BEFORE, LAT_SLOW,
                                                   LAT_STALL, LAT_FAST, LAT_AFTER))
    lines.append("")
    lines.append("| configuration | limit during the stall (min..max) | in flight during the stall "
                 "(mean, from 2 s) | refusals/s in the stall | served in the stall | settle after "
                 "the step (<= 1.3 C/4) | recovery after it (>= 0.7 C) | p99 ms after |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in lat:
        lines.append("| %s | %s | %.1f | %.0f | %d | %s | %s | %.1f |" % (
            r["name"], "%d..%d" % r["limit"] if r["limit"] else "%d" % LAT_C, r["inflight"],
            r["refusals"], r["served"], fmt_s(r["shed"]), fmt_s(r["back"]), r["p99_after"]))
    if drift:
        lines.append("")
        lines.append("Sustained overload, %d s, adaptive, %d threads on capacity %d:" % (
            args.long, N, C))
        lines.append("")
        lines.append("| minute | mean limit | mean baseline ms | p99 ms | goodput/s |")
        lines.append("|---:|---:|---:|---:|---:|")
        for k, l, b, p99, g in drift:
            lines.append("| %d | %.1f | %.1f | %.1f | %.0f |" % (k, l, b, p99, g))
    lines.append("")
    lines.append("Picture: build/adaptive.png (limit, in flight and p99 latency through the "
                 "steps, static 4C's p99 for comparison).")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    # The section of results.md: a pointer and the main table.
    table = text[text.index("| configuration"):text.index("Settle:")]
    table += "\n" + text[text.index("Latency step:"):text.index("| configuration", text.index(
        "Latency step:"))] + text[text.index("| configuration", text.index("Latency step:")):]
    table = table[:table.index("Sustained overload") if "Sustained overload" in table else
                  table.index("Picture:")]
    section = "%s\n## Adaptive limits\n\nFrom `make bench-adaptive`; the full report with the " \
              "targets, the below-capacity runs and the sustained overload is " \
              "[bench/adaptive.md](adaptive.md).\n\n%s%s\n" % (BEGIN, table, END)
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
