"""adaptive_rows.py - the rows of `make bench-adaptive` and running one configuration (a
controller or a static limit) on one row."""

import time

import scenario
from harness_io import IoShim

import adaptive_pg

CONTROLLERS = ("bulkshim", "vegas", "gradient2", "aimd", "envoy")
OURS = "bulkshim"
STATICS = ("C/2", "C", "2C")        # the static limits tried per row, in multiples of C
BELOW = 0.75                        # offered load of the below-capacity phases, x C


class Timing:
    """Phase lengths in seconds: below capacity before and after (`below`),
    the warm-up excluded from the statistics (`warm`), the steady part of a
    steady row (`steady`) and each step of a stepped row (`step`)."""

    def __init__(self, quick=False):
        self.below, self.warm, self.steady, self.step = (
            (1.5, 1.5, 4.0, 4.0) if quick else (2.5, 2.0, 8.0, 6.0))


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


class Row:
    """One row of the matrix: a backend of capacity C (requests served at
    once; for PostgreSQL, the processor's cores), its service time S ms,
    the client threads of the overload, and the steps of the overload as
    (fraction of the overload, capacity, ms) after its start."""

    def __init__(self, name, what, cap, ms, threads, dist="fixed", steps=(), pg=False):
        self.name, self.what, self.C, self.S = name, what, cap, ms
        self.threads, self.dist, self.steps, self.pg = threads, dist, steps, pg

    def overload(self, tm):
        """Seconds of the overload: warm-up and steady, or three steps."""
        return 3 * tm.step if self.steps else tm.warm + tm.steady

    def statics(self, which):
        return [max(1, int(round(self.C * (0.5 if w == "C/2" else float(w[:-1] or 1)))))
                for w in which]


C, S = 16, 40


def rows():
    """The matrix, in its order in the report."""
    out = [Row("load %gx" % k, "%d threads on C = %d, %d ms" % (round(k * C), C, S), C, S,
               int(round(k * C))) for k in (1.25, 1.5, 2, 4, 6)]
    out.append(Row("drop", "capacity %d -> %d -> %d, %d ms, %d threads" % (C, C // 4, C, S, 4 * C),
                   C, S, 4 * C, steps=((1 / 3, C // 4, S), (2 / 3, C, S))))
    # At 5 ms a Python backend of capacity 16 is bound by its own processor
    # (3200 requests/s), not by C: the latency step runs at capacity 4.
    out.append(Row("latency", "5 ms -> 2 s -> 5 ms at C = 4, 16 threads", 4, 5, 16,
                   steps=((1 / 3, 4, 2000), (2 / 3, 4, 5))))
    out.append(Row("exp", "exponential service times, mean %d ms, C = %d, %d threads"
                   % (S, C, 4 * C), C, S, 4 * C, dist="exp"))
    out.append(Row("postgres", "PostgreSQL, CPU-bound query, 2 cores, 8 threads", 2, 30, 8,
                   pg=True))
    return out


def config(row, name):
    """The compartment settings of a configuration: "static N" or a
    controller. Controllers get max 4C as their ceiling; aimd and vegas a
    timeout_ms of twice the unloaded service time (the latency accepted:
    at its default of 5 s aimd never cuts)."""
    key = "max_connections" if row.pg else "max_inflight"
    if name.startswith("static "):
        return {key: int(name.split()[1])}
    ad = {"min": 1, "max": 4 * row.C, "algorithm": name}
    if name in ("aimd", "vegas"):
        ad["timeout_ms"] = 2 * row.S
    return {key: 4 * row.C, "adaptive": ad}


class PgBackend:
    """The PostgreSQL row's backend: one cluster for all its configurations."""

    def __init__(self, cbin):
        self.cl = adaptive_pg.Cluster()
        self.sql, self.ms = adaptive_pg.calibrate(self.cl)
        self.cbin = cbin
        self.probe = adaptive_pg.capacity_probe(cbin, self.cl, self.sql)
        self.port = self.cl.port

    def client(self, env, threads, seconds):
        return adaptive_pg.client(self.cbin, env, self.cl, self.sql, threads, seconds)

    def stop(self):
        self.cl.stop()


def run(row, name, tm, pg=None):
    """Runs configuration `name` on `row`: below-capacity threads for the
    whole run, the overload's extra threads after the first below phase for
    the overload's length, and the row's steps. Returns its summary and the
    series for the picture."""
    be = pg if row.pg else scenario.Backend(row.C, row.S, row.dist)
    extra = config(row, name)
    shim = IoShim([dict(name="be", destinations=["127.0.0.1:%d" % be.port], **extra)])
    env = shim.env(log="off")
    below = max(1, int(BELOW * row.C))
    over = row.overload(tm)
    total = 2 * tm.below + over

    def start(threads, seconds):
        t = time.monotonic() - smp.t0
        if row.pg:
            return t, pg.client(env, threads, seconds)
        return t, scenario.client(env, be.port, threads, seconds)

    smp = scenario.Sampler(shim.segment, "be")
    base = start(below, total)
    time.sleep(max(0, tm.below - (time.monotonic() - smp.t0)))
    more = start(row.threads - below, over)
    t_over = more[0]
    marks = [t_over]
    for frac, cap, ms in row.steps:
        time.sleep(max(0, t_over + frac * over - (time.monotonic() - smp.t0)))
        be.set(cap, ms)
        marks.append(time.monotonic() - smp.t0)
    reqs_base = [(r[0] + base[0], r[1], r[2]) for r in scenario.results(base[1], total + 120)]
    reqs_more = [(r[0] + more[0], r[1], r[2]) for r in scenario.results(more[1], total + 120)]
    samples = smp.stop()
    if not row.pg:
        be.stop()
    reqs = sorted(reqs_base + reqs_more)
    return summarize(row, name, tm, reqs, reqs_base, samples, marks, t_over + over)


def summarize(row, name, tm, reqs, reqs_base, samples, marks, t_end):
    """The row's columns for one configuration."""
    t0 = marks[0] + tm.warm
    span = t_end - t0
    steady = [r for r in reqs if t0 <= r[0] < t_end]
    ok = [r[2] for r in steady if r[1] == "ok"]
    # Below capacity: the base threads' refusals before the overload, and
    # after it once its last requests are answered (1 s). The clients' clocks
    # start when their processes do, a few ms after ours read the time: the
    # margin keeps the overload's first refusals out of the phase before it.
    under = [r for r in reqs_base if r[0] < marks[0] - 0.25 or r[0] >= t_end + 1.0]
    lims = [s[1] for s in samples if s[0] >= t0 and s[1] is not None]
    lims_under = [s[1] for s in samples if s[1] is not None and (
        s[0] < marks[0] or s[0] >= t_end + 1.0)]
    refused = sum(1 for r in steady if r[1] == "refused")
    s = {"name": name, "goodput": len(ok) / span, "p50": pct(ok, 0.50), "p99": pct(ok, 0.99),
         "refused_s": refused / span, "ok": ok, "span": span, "refused": refused,
         "errors": sum(1 for r in reqs if r[1] not in ("ok", "refused")),
         "under": sum(1 for r in under if r[1] == "refused"), "under_n": len(under),
         "under_lim": min(lims_under) if lims_under else None,
         "limit": (min(lims), max(lims)) if lims else None,
         "settle": None, "samples": samples, "reqs": reqs, "marks": marks, "t_end": t_end}
    if row.steps and lims:
        # Settle: after each step, towards the capacity it sets (the latency
        # step keeps C: the backend still serves C at once, only slower).
        s["settle"] = [settle(samples, marks[i + 1], marks[i + 2] if i + 2 < len(marks)
                              else t_end, row.steps[i][1]) for i in range(len(row.steps))]
    return s


def pool(runs):
    """One configuration's columns over its runs on a row: goodput and
    refusals per second over their spans together, p50 and p99 over all
    their successes, the refusals below capacity summed, the limit range
    over all, and per step the slower settle (never if one never settled).
    The series for the picture are the first run's."""
    if len(runs) == 1:
        return runs[0]
    s = dict(runs[0])
    ok = [x for r in runs for x in r["ok"]]
    span = sum(r["span"] for r in runs)
    refused = sum(r["refused"] for r in runs)
    lims = [r["limit"] for r in runs if r["limit"] is not None]
    s.update(goodput=len(ok) / span, p50=pct(ok, 0.50), p99=pct(ok, 0.99), ok=ok, span=span,
             refused=refused, refused_s=refused / span,
             errors=sum(r["errors"] for r in runs), under=sum(r["under"] for r in runs),
             under_n=sum(r["under_n"] for r in runs),
             under_lim=min((r["under_lim"] for r in runs if r["under_lim"] is not None),
                           default=None),
             limit=(min(lo for lo, _ in lims), max(hi for _, hi in lims)) if lims else None,
             runs=[{k: r[k] for k in ("goodput", "p50", "p99", "refused_s", "limit", "settle")}
                   for r in runs])
    if runs[0]["settle"] is not None:
        s["settle"] = [None if any(r["settle"] is None or r["settle"][i] is None for r in runs)
                       else max(r["settle"][i] for r in runs)
                       for i in range(len(runs[0]["settle"]))]
    return s


def pg_for(row, cbin_pg):
    """The PostgreSQL row's backend, started, with the row's S its query's
    time alone; None for the other rows."""
    if not row.pg:
        return None
    pg = PgBackend(cbin_pg)
    row.S = int(round(pg.ms))
    return pg


def run_row(row, names, tm, cbin_pg, turn, log, repeat=1):
    """Every configuration on one row, `repeat` times: in an order rotated
    by `turn` so that no configuration always runs first, then in the
    reverse of that order, and so on (each configuration's runs sit at the
    same mean place in the row, so a machine that slows during the row
    slows all alike); returns {name: pooled summary} and the PostgreSQL
    probe (or None)."""
    pg = pg_for(row, cbin_pg)
    if pg:
        log("  postgres: %s, alone %.1f ms; capacity probe %s" % (
            pg.sql, pg.ms, ", ".join("%d at once %.0f/s %.0f ms" % p for p in pg.probe)))
    k = turn % len(names)
    order = names[k:] + names[:k]
    runs = {n: [] for n in names}
    try:
        for rep in range(repeat):
            for name in (order if rep % 2 == 0 else order[::-1]):
                s = run(row, name, tm, pg)
                runs[name].append(s)
                log("  %-10s goodput %6.1f/s p50 %7.1f p99 %7.1f refused/s %6.1f under %d/%d "
                    "limit %s settle %s" % (name, s["goodput"], s["p50"], s["p99"],
                                            s["refused_s"], s["under"], s["under_n"],
                                            s["limit"], s["settle"]))
    finally:
        # The segments and config files go at the end of the run
        # (harness.cleanup, in adaptive.py): it also removes what every row
        # shares.
        if pg:
            pg.stop()
    return {n: pool(runs[n]) for n in names}, (pg.probe, pg.sql, pg.ms) if pg else None
