"""adaptive_report.py - the tables, the verdicts and the pictures of `make bench-adaptive`."""

import os

from adaptive_rows import OURS, pct

GOODPUT_MIN, P99_MAX = 0.95, 1.2     # ours against the best of the others, per row


def best_static(res):
    """The static limit an operator would keep: the highest goodput, and of
    those within 2 % of it the lowest p99."""
    st = [s for n, s in res.items() if n.startswith("static ")]
    if not st:
        return None
    top = max(s["goodput"] for s in st)
    return min((s for s in st if s["goodput"] >= 0.98 * top), key=lambda s: s["p99"])


def verdict(res):
    """PASS or MISS for a row, from its numbers, with the reasons: ours
    against the best goodput and the best p99 of the other controllers and
    the best static limit, and its refusals below capacity."""
    ours = res.get(OURS)
    if ours is None:
        return None
    bs = best_static(res)
    others = [s for n, s in res.items() if n != OURS and not n.startswith("static ")]
    others += [bs] if bs else []
    if not others:
        return None
    g = max(others, key=lambda s: s["goodput"])
    p = min(others, key=lambda s: s["p99"])
    why = []
    if ours["goodput"] < GOODPUT_MIN * g["goodput"]:
        why.append("goodput %.1f/s < %.2f x %s's %.1f/s (%s: p99 %.1f ms, limit %s; ours: "
                   "limit %s, %.0f refused/s)" % (
                       ours["goodput"], GOODPUT_MIN, g["name"], g["goodput"], g["name"],
                       g["p99"], fmt_limit(g), fmt_limit(ours), ours["refused_s"]))
    if ours["p99"] > P99_MAX * p["p99"]:
        why.append("p99 %.1f ms > %.1f x %s's %.1f ms (%s: %.1f/s, limit %s; ours: limit %s)" % (
            ours["p99"], P99_MAX, p["name"], p["p99"], p["name"], p["goodput"], fmt_limit(p),
            fmt_limit(ours)))
    if ours["under"]:
        why.append("refused %d of %d requests below capacity (its lowest limit %s)" % (
            ours["under"], ours["under_n"], ours["under_lim"]))
    if why and not ours["under"]:
        why.append(both_bars(res, g, p))
    return {"pass": not why, "why": why, "g": g, "p": p, "best_static": bs,
            "g_ratio": ours["goodput"] / g["goodput"] if g["goodput"] else float("inf"),
            "p_ratio": ours["p99"] / p["p99"] if p["p99"] else float("inf")}


def both_bars(res, g, p):
    """Whether any configuration of the row, ours aside and every static
    limit included, met both bars that ours missed: where none did, the
    best goodput was bought with latency and the best p99 with goodput,
    and no single limit of this run had both."""
    met = [s["name"] for n, s in res.items() if n != OURS
           and s["goodput"] >= GOODPUT_MIN * g["goodput"] and s["p99"] <= P99_MAX * p["p99"]]
    if met:
        return "%s met both bars" % ", ".join(met)
    return ("no other configuration met both bars either: %s's p99 was %.1f x the lowest, "
            "%s's goodput %.2f x the best" % (
                g["name"], g["p99"] / p["p99"] if p["p99"] else float("inf"),
                p["name"], p["goodput"] / g["goodput"] if g["goodput"] else 0.0))


def fmt_settle(st):
    if st is None:
        return "-"
    return " / ".join("never" if v is None else "%.1f s" % v for v in st)


def fmt_limit(s):
    if s["limit"] is None:
        return s["name"].split()[1] if s["name"].startswith("static ") else "-"
    lo, hi = s["limit"]
    return "%d" % lo if lo == hi else "%d..%d" % (lo, hi)


def row_table(row, res, v):
    """The per-configuration table of one row: the controllers, then the
    best static limit (the others tried are listed below it)."""
    out = ["| configuration | goodput/s | p50 ms | p99 ms | refused/s in overload | "
           "refused below capacity | settle | limit range |",
           "|---|---:|---:|---:|---:|---:|---|---|"]
    names = [n for n in res if not n.startswith("static ")]
    bs = v["best_static"] if v else best_static(res)
    for n in names + ([bs["name"]] if bs else []):
        s = res[n]
        label = n if n != OURS else "**%s** (ours)" % n
        if bs and n == bs["name"]:
            label = "best static: %s" % n
        out.append("| %s | %.1f | %.1f | %.1f | %.1f | %d of %d | %s | %s |" % (
            label, s["goodput"], s["p50"], s["p99"], s["refused_s"], s["under"], s["under_n"],
            fmt_settle(s["settle"]), fmt_limit(s)))
    rest = [res[n] for n in res if n.startswith("static ") and not (bs and n == bs["name"])]
    if rest:
        out.append("")
        out.append("Other static limits: " + "; ".join(
            "%s: %.1f/s, p99 %.1f ms" % (s["name"], s["goodput"], s["p99"]) for s in rest) + ".")
    return out


def summary_table(matrix):
    """One line per row: the verdict and the ratios it is computed from."""
    out = ["| row | verdict | goodput: ours / best other | p99: ours / best other | "
           "refused below capacity (ours) | best static | why |",
           "|---|---|---:|---:|---:|---|---|"]
    for row, res, v in matrix:
        if v is None:
            continue
        ours = res[OURS]
        out.append("| %s | %s | %.1f / %.1f (%s) = %.2f | %.1f / %.1f (%s) = %.2f | %d of %d | %s "
                   "| %s |" % (
                       row.name, "PASS" if v["pass"] else "MISS", ours["goodput"],
                       v["g"]["goodput"], v["g"]["name"], v["g_ratio"], ours["p99"],
                       v["p"]["p99"], v["p"]["name"], v["p_ratio"], ours["under"],
                       ours["under_n"], v["best_static"]["name"] if v["best_static"] else "-",
                       "; ".join(v["why"]) if v["why"] else "-"))
    return out


def picture(path, row, res):
    """Limit and in-flight over time (top) and the p99 of served requests per
    0.5 s (bottom), every configuration of the row on the same axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for n, s in res.items():
        t = [x[0] for x in s["samples"]]
        if s["limit"] is not None:
            a1.plot(t, [x[1] for x in s["samples"]], label=n, lw=2 if n == OURS else 1)
        elif n.startswith("static "):
            a1.plot([t[0], t[-1]] if t else [], [int(n.split()[1])] * (2 if t else 0), ":",
                    label=n, lw=1)
        pts = []
        end = int(s["t_end"] * 2) + 6
        for k in range(end):
            xs = [r[2] for r in s["reqs"] if k / 2 <= r[0] < k / 2 + 0.5 and r[1] == "ok"]
            if xs:
                pts.append((k / 2 + 0.25, pct(xs, 0.99)))
        a2.plot([x for x, _ in pts], [y for _, y in pts], label=n, lw=2 if n == OURS else 1)
    any_s = next(iter(res.values()))
    for x in any_s["marks"] + [any_s["t_end"]]:
        for ax in (a1, a2):
            ax.axvline(x, color="grey", lw=0.5)
    a1.set_ylabel("limit (connections or requests)")
    a1.set_title("%s: %s" % (row.name, row.what))
    a1.legend(loc="upper right", fontsize=7)
    a2.set_yscale("log")
    a2.set_ylabel("p99 ms of served requests (per 0.5 s)")
    a2.set_xlabel("seconds (grey: overload start, steps, overload end)")
    a2.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def slug(name):
    return name.replace(" ", "-")


def report(matrix, head, pg, drift):
    """The Markdown of bench/adaptive.md; returns (text, summary lines)."""
    lines = list(head)
    lines += ["", "## Verdicts", "",
              "Ours (`bulkshim`) passes a row when its goodput is at least %.2f x the best "
              "goodput of the others (the four published controllers and the best static "
              "limit), its p99 at most %.1f x the best (lowest) p99 of the others, and it "
              "refused nothing in the below-capacity phases. Computed from the numbers below "
              "at each run. Where ours misses, the last reason says whether any other "
              "configuration of the row met both bars." % (GOODPUT_MIN, P99_MAX), ""]
    summ = summary_table(matrix)
    lines += summ
    n_pass = sum(1 for _, _, v in matrix if v and v["pass"])
    lines += ["", "%d of %d rows pass." % (n_pass, sum(1 for _, _, v in matrix if v))]
    for row, res, v in matrix:
        lines += ["", "## %s: %s" % (row.name, row.what), ""]
        lines += row_table(row, res, v)
        if row.pg and pg:
            probe, sql, ms = pg
            lines += ["", "Query: `%s`, %.1f ms alone (server time). Without the shim: %s." % (
                sql, ms, ", ".join("%d at once %.0f/s, median %.0f ms" % p for p in probe))]
        lines += ["", "Picture: build/adaptive-%s.png." % slug(row.name)]
    if drift:
        lines += ["", "## Sustained overload (--long)", "",
                  "| minute | mean limit | p99 ms | goodput/s |", "|---:|---:|---:|---:|"]
        lines += ["| %d | %.1f | %.1f | %.0f |" % d for d in drift]
    return "\n".join(lines) + "\n", summ
