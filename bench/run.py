#!/usr/bin/env python3
"""run.py - `make bench`: what the shim costs per call, at scale and against an HAProxy hop.

Runs every measurement in one go (about four minutes on two cores)
and writes bench/results.md. Programs (built by bench/bench.mk into
build/bench/):
  client       the measured program, run with and without the shim preloaded;
  backend      loopback servers (accept-and-close, echo, HTTP), never preloaded;
  permits      permit_acquire/slot_drop in a loop, linked with the segment code;
  libstubconnect.so  a connect() that returns 0 at once, preloaded after the
               shim to time the shim's connect path without a real handshake.
Targets are reported ("met"/"missed"), never asserted: the exit status is 0
whenever the suite ran.
"""

import argparse
import datetime
import ipaddress
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# How much of everything; --quick divides for a smoke run.
ROUNDS = 13           # interleaved A/B/control rounds per wall-time case
PP_BATCHES, PP_PER = 40, 50         # ping-pong: 40 batches of 50 round trips
CONN_BATCHES, CONN_PER = 20, 50     # real connect: 20 batches of 50
STUB_BATCHES, STUB_PER = 10, 2000   # stubbed connect: 10 batches of 2000
CG_PP, CG_CONN, CG_STUB = 2000, 500, 2000   # iterations under callgrind
SCALE_ROUNDS = 9
# The unix socket a stubbed connect names (nothing is created there): the
# path PostgreSQL listens on, as a configuration for it would name it.
UNIX_PATH = "/run/postgresql/.s.PGSQL.5432"
PERMIT_MS = 300
THREAD_MS = 400
WRK_SECONDS = 2
WRK_ROUNDS = 5
LIMIT = 64            # max_connections of the shim and HAProxy's per-server maxconn
INFLIGHT = 32
MSG = 64              # ping-pong message size


class BenchError(Exception):
    pass


def log(msg):
    print("bench: " + msg, flush=True)


def parse_kv(text):
    out = {}
    for tok in text.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


NICE = -10            # every measured process, when allowed (root)


def pin(cpu):
    """What a measured child does before exec: raise its priority, so that
    the other work of a shared machine preempts it less (a no-op without
    the privilege), and run on one CPU if asked."""
    def setup():
        try:
            os.setpriority(os.PRIO_PROCESS, 0, NICE)
        except OSError:
            pass
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return setup


class Bench:
    def __init__(self, build, quick, today=None, today_rev=None, nolto=None, floor=None):
        self.today = os.path.abspath(today) if today else None
        self.nolto = os.path.abspath(nolto) if nolto else None
        # The floor library, or why there is none (bench.mk's "failed").
        self.floor, self.floor_missing = None, None
        if floor and os.path.exists(floor):
            self.floor = os.path.abspath(floor)
        elif floor:
            why = os.path.join(os.path.dirname(floor), "failed")
            self.floor_missing = (open(why).read().strip() if os.path.exists(why)
                                  else "%s was not built" % floor)
        self.today_rev = today_rev or "?"
        self.build = os.path.abspath(build)
        self.bin = os.path.join(self.build, "bench")
        self.shim = os.path.join(self.build, "libbulkshim.so")
        self.stub = os.path.join(self.bin, "libstubconnect.so")
        self.quick = quick
        self.tmp = tempfile.mkdtemp(prefix="bulkshim-bench.")
        self.tag = "bench%d" % os.getpid()
        self.servers = []
        self.ncpu = len(os.sched_getaffinity(0))
        self.client_cpu = 1 if self.ncpu > 1 else 0
        env = {k: v for k, v in os.environ.items()
               if k != "LD_PRELOAD" and not k.startswith("BULKSHIM_")}
        env["BULKSHIM_LOG"] = "error"
        self.env = env
        self.md = []          # results.md, section by section
        self.targets = []     # (target, value text, met)
        self.t0 = time.monotonic()
        self.load_start = os.getloadavg()[0]

    # ---- plumbing ----

    def path(self, name):
        return os.path.join(self.tmp, name)

    def shim_env(self, cfg, extra=None, lib=None):
        env = dict(self.env)
        env["LD_PRELOAD"] = (lib or self.shim) + ((" " + extra) if extra else "")
        env["BULKSHIM_CONFIG"] = cfg
        return env

    def stub_env(self):
        env = dict(self.env)
        env["LD_PRELOAD"] = self.stub
        return env

    def run(self, cmd, env=None, cpu=None, timeout=120):
        p = subprocess.run(cmd, env=env or self.env, capture_output=True, text=True,
                           timeout=timeout, preexec_fn=pin(cpu))
        if p.returncode != 0:
            raise BenchError("%s failed (%d): %s%s" % (" ".join(cmd), p.returncode,
                                                       p.stdout[-500:], p.stderr[-1500:]))
        return p.stdout

    def client(self, args, env=None, cpu=None):
        return parse_kv(self.run([os.path.join(self.bin, "client")] + [str(a) for a in args],
                                 env=env, cpu=cpu))

    def server(self, mode, cpu=None):
        p = subprocess.Popen([os.path.join(self.bin, "backend"), mode], env=self.env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             preexec_fn=pin(cpu))
        line = p.stdout.readline().split()
        if len(line) != 2 or line[0] != "port":
            p.kill()
            raise BenchError("backend %s did not start" % mode)
        self.servers.append(p)
        return int(line[1])

    def config(self, name, comps, extra=""):
        """comps: list of (name, [destinations], max_connections, max_inflight or None);
        extra: more settings for each of them."""
        lines = ['segment = "%s-%s";' % (self.tag, name), "compartments = ("]
        for i, (cname, dests, mc, mi) in enumerate(comps):
            body = ", ".join('"%s"' % d for d in dests)
            lim = "max_connections = %d;" % mc
            if mi:
                lim += " max_inflight = %d;" % mi
            if extra:
                lim += " " + extra
            lines.append('  { name = "%s"; destinations = [ %s ]; %s }%s'
                         % (cname, body, lim, "," if i + 1 < len(comps) else ""))
        lines.append(");")
        path = self.path(name + ".cfg")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def pool_config(self, name, target, guaranteed):
        """One compartment, ceiling LIMIT, in a pool of LIMIT with a guarantee
        of `guaranteed` (LIMIT: every connect within it; 0: every one borrowed),
        beside two other compartments of the pool."""
        lines = ['segment = "%s-%s";' % (self.tag, name),
                 'pools = ( { name = "p"; size = %d; reserved = 0; } );' % (LIMIT + 2),
                 "compartments = (",
                 '  { name = "b"; destinations = [ "%s" ]; max_connections = %d; pool = "p"; '
                 'guaranteed = %d; },' % (target, LIMIT, guaranteed),
                 '  { name = "o1"; destinations = [ "10.9.9.1" ]; pool = "p"; guaranteed = 1; },',
                 '  { name = "o2"; destinations = [ "10.9.9.2" ]; pool = "p"; guaranteed = 1; }',
                 ");"]
        path = self.path(name + ".cfg")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def check_config(self, path):
        """The in-flight key is recent: wait (bounded) for a library that takes it."""
        for attempt in range(10):
            try:
                p = subprocess.run([os.path.join(self.build, "bulkshim"), "check", "-q", path],
                                   capture_output=True, text=True, env=self.env)
            except OSError as e:
                raise BenchError("cannot run %s/bulkshim: %s" % (self.build, e))
            if p.returncode == 0:
                return
            if "max_inflight" not in p.stdout + p.stderr or attempt == 9:
                raise BenchError("config %s rejected: %s%s" % (path, p.stdout, p.stderr))
            log("max_inflight not accepted yet; retrying in 30 s")
            time.sleep(30)

    def admitted(self, key):
        """Connections the shim admitted in the segment of config `key`, so that
        a matched case is known to have been counted."""
        seg = "%s-%s" % (self.tag, os.path.basename(self.cfg[key])[:-4])
        p = subprocess.run([os.path.join(self.build, "bulkshim"), "status", "-s", seg,
                            "--json"], capture_output=True, text=True, env=self.env)
        try:
            return sum(c["admitted"] for c in json.loads(p.stdout)["compartments"])
        except (ValueError, KeyError, TypeError):
            return 0

    def must_count(self, key):
        if self.admitted(key) == 0:
            raise BenchError("the shim counted nothing with %s: is it working?" % self.cfg[key])

    def elapsed(self):
        return time.monotonic() - self.t0

    def target(self, what, value, met):
        self.targets.append((what, value, met))
        log("target %s: %s -> %s" % (what, value, "met" if met else "missed"))

    def cleanup(self):
        for p in self.servers:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
        for name in os.listdir("/dev/shm"):
            if name.startswith("bulkshim.%s-" % self.tag):
                try:
                    os.unlink(os.path.join("/dev/shm", name))
                except OSError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ---- configs ----

    def make_configs(self):
        cp, ep, self.hp = self.close_port, self.echo_port, self.http_port
        mk = self.config
        self.cfg = {
            "connect": mk("connect", [("b", ["127.0.0.1:%d" % cp], LIMIT, None)]),
            # The same, in a compartment that a connect waits for when it is
            # full: whether the socket blocks is asked only then.
            "connect_wait": mk("connwait", [("b", ["127.0.0.1:%d" % cp], LIMIT, None)],
                               extra="max_wait_ms = 1000;"),
            "pp_conn": mk("ppconn", [("b", ["127.0.0.1:%d" % ep], LIMIT, None)]),
            "pp_inflight": mk("ppinfl", [("b", ["127.0.0.1:%d" % ep], LIMIT, INFLIGHT)]),
            # Loaded and active, but the echo port is nobody's destination.
            "pp_unmatched": mk("ppun", [("b", ["127.0.0.1:%d" % (ep ^ 1)], LIMIT, None)]),
            "http": mk("http", [("b", ["127.0.0.1:%d" % self.hp], LIMIT, None)]),
            "permits": mk("permits", [("b", ["127.0.0.1:1"], LIMIT, None)]),
        }
        # The stubbed connect goes to 127.0.0.1:1; the matched rule is among others.
        target = "127.0.0.1:1"
        self.cfg["d1"] = mk("d1", [("b", [target], LIMIT, None)])
        self.cfg["d100"] = mk("d100", [("b", many_destinations(100, target), LIMIT, None)])
        self.cfg["d10000"] = mk("d10000", [("b", many_destinations(10000, target), LIMIT,
                                                None)])
        comps = [("c%d" % i, many_destinations(16, None, seed=i), LIMIT, None)
                 for i in range(63)]
        comps.append(("c63", [target] + many_destinations(15, None, seed=63), LIMIT, None))
        self.cfg["c64"] = mk("c64", comps)
        # The same stubbed connect in a compartment in a pool.
        self.cfg["pool_guar"] = self.pool_config("poolguar", target, LIMIT)
        self.cfg["pool_lent"] = self.pool_config("poollent", target, 0)
        # 10,000 rules and the connect matches none of them: every prefix
        # length in use is looked up.
        self.cfg["d10000_miss"] = mk("d10000miss", [("b", many_destinations(
            10000, None, seed=99), LIMIT, None)])
        # A unix socket's path name: its own lookup (match_table.c's unix_find).
        self.cfg["unix1"] = mk("unix1", [("b", ["unix:" + UNIX_PATH], LIMIT, None)])
        for path in self.cfg.values():
            self.check_config(path)
        # The library without LTO measures the same stubbed connects, and
        # the library of the "today" column (an older segment layout) the
        # per-call target loops, each on segments of its own.
        self.cfg_nolto = self.renamed(("d1", "pool_lent"), "nolto")
        self.cfg_floor = self.renamed(("connect", "d1"), "floor")
        self.cfg_today = self.renamed(("connect", "pp_conn", "pp_inflight", "pp_unmatched",
                                       "d10000_miss"), "today")

    def renamed(self, keys, suffix):
        """Copies of the configs of keys whose segment names end in -suffix."""
        out = {}
        for key in keys:
            with open(self.cfg[key]) as f:
                text = f.read()
            path = self.cfg[key][:-4] + "-%s.cfg" % suffix
            with open(path, "w") as f:
                f.write(text.replace('";', '-%s";' % suffix, 1))
            out[key] = path
        return out

    # ---- 1. per call ----

    def ab(self, args, shim_cfg, cpu=None, rounds=ROUNDS, pause=0.0, base_env=None,
           extra=None, today_cfg=None):
        """Interleaved A (no shim), B (shim), C (no shim again: the control),
        and, given today_cfg, T (the "today" library), rotating the order each
        round. Returns {side: [min_ns of each run]}."""
        base_env = base_env or self.env
        envs = {"none": base_env, "shim": self.shim_env(shim_cfg, extra),
                "control": base_env}
        order = ["none", "shim", "control"]
        if today_cfg and self.today:
            envs["today"] = self.shim_env(today_cfg, extra, lib=self.today)
            order.append("today")
        out = {k: [] for k in order}
        for r in range(rounds):
            for side in order[r % len(order):] + order[:r % len(order)]:
                res = self.client(args, env=envs[side], cpu=cpu)
                if res.get("errors", 0):
                    raise BenchError("client %s: %d errors" % (args, res["errors"]))
                out[side].append(res["min_ns"])
                if pause:
                    time.sleep(pause)
        return out

    def per_call(self):
        log("1. per call, wall time (A/B/control interleaved, %d rounds)" % ROUNDS)
        rows = []
        same = 0
        cross = 1 if self.ncpu > 1 else None
        placements = [("same CPU", same, same)]
        if cross is not None:
            placements.append(("two CPUs", cross, same))
        cases = []
        cp, ep = self.close_port, self.echo_port
        cases.append(("connect + close, matched", "connect", ["connect", cp, CONN_BATCHES,
                                                              CONN_PER], cross, 0.05))
        for label, key in (("ping-pong, matched, max_connections", "pp_conn"),
                           ("ping-pong, matched, + max_inflight", "pp_inflight"),
                           ("ping-pong, unmatched socket", "pp_unmatched")):
            for pname, ccpu, _ in placements:
                cases.append(("%s (%s)" % (label, pname), key,
                              ["pingpong", ep, PP_BATCHES, PP_PER, MSG], ccpu, 0.0))
        for label, key, args, cpu, pause in cases:
            today = self.cfg_today.get(key) if key == "pp_conn" and cpu == same else None
            d = self.ab(args, self.cfg[key], cpu=cpu, pause=pause, today_cfg=today)
            rows.append((label, key, d))
            log("   %-55s none %8.0f  shim %8.0f  control %8.0f ns (min)" % (
                label, min(d["none"]), min(d["shim"]), min(d["control"])))
        self.per_call_rows = rows
        for key in ("connect", "pp_conn", "pp_inflight"):
            self.must_count(key)
        if self.admitted("pp_unmatched"):
            raise BenchError("the unmatched ping-pong was counted")

        md = ["## 1. Per call: wall time, with and without the shim", "",
              "Each run is one process timing %d batches of its loop; a run's figure is "
              "its fastest batch. A (no shim), B (shim) and C (no shim again, the "
              "control) run interleaved, the order rotating each round, %d rounds. "
              "Ratios are throughput with ÷ without (1.000 = no cost; below 1 = slower): "
              "the median over rounds of each round's A ÷ B, so that a slow or a lucky "
              "moment of the machine falls on both sides of a pair; in brackets, the "
              "ratio of the two sides' minimums. Added ns is the median of the rounds' "
              "B − A. The control is the same between A and C, both without the shim: a "
              "ratio says something only where it is further from 1 than its control." % (
                  PP_BATCHES, ROUNDS), "",
              "The echo server is pinned to CPU 0. *same CPU*: the client runs there too "
              "(a round trip is two context switches); *two CPUs*: the client runs on CPU 1 "
              "(each message is a cross-CPU wake-up: a round trip takes tens of microseconds on "
              "these VMs). "
              "The connect loop runs on CPU 1 against an accept-and-close server; runs "
              "are %.0f ms apart so the accept queue (backlog 4096) never fills." % (
                  cases[0][4] * 1000), "",
              "| Case | no shim, ns (min / median) | shim, ns (min / median) | added ns "
              "| ratio shim ÷ none | control ratio |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for label, key, d in rows:
            n, s, c = d["none"], d["shim"], d["control"]
            md.append("| %s | %.0f / %.0f | %.0f / %.0f | %+.0f | %.3f (%.3f) | %.3f (%.3f) |" % (
                label, min(n), statistics.median(n), min(s), statistics.median(s),
                paired_diff(s, n), paired_ratio(n, s), min(n) / min(s),
                paired_ratio(n, c), min(n) / min(c)))
        self.md.append("\n".join(md))
        # Judged on one CPU, where a round trip is shortest and steadiest; on
        # two CPUs the control shows the noise is larger than the target.
        for label, key, d in rows:
            if key.startswith("pp_") and "same CPU" in label:
                ratio = paired_ratio(d["none"], d["shim"])
                self.target("ping-pong throughput ≥ 0.98 × (%s)" % label.replace(
                    " (same CPU)", ", one CPU"), "%.3f (control %.3f)" % (
                        ratio, paired_ratio(d["none"], d["control"])), ratio >= 0.98)

    # ---- callgrind ----

    def callgrind(self, name, args, env):
        out = self.path("cg.%s" % name)
        cmd = ["valgrind", "--tool=callgrind", "--collect-systime=yes", "--instr-atstart=no",
               "--toggle-collect=bench_*", "--callgrind-out-file=" + out,
               os.path.join(self.bin, "client")] + [str(a) for a in args]
        self.run(cmd, env=env, timeout=300)
        incl = annotate(out, inclusive=True)
        excl = annotate(out, inclusive=False)
        return {"incl": incl, "excl": excl, "file": out}

    def instructions(self):
        log("1b. instructions per call under callgrind")
        cp, ep = self.close_port, self.echo_port
        stubbed = lambda cfg: self.shim_env(cfg, self.stub)
        jobs = {
            "connect/none": (["connect", cp, 1, CG_CONN], self.env),
            "connect/shim": (["connect", cp, 1, CG_CONN], self.shim_env(self.cfg["connect"])),
            "connect_wait/shim": (["connect", cp, 1, CG_CONN],
                                  self.shim_env(self.cfg["connect_wait"])),
            "pp/none": (["pingpong", ep, 1, CG_PP, MSG], self.env),
            "pp_conn/shim": (["pingpong", ep, 1, CG_PP, MSG], self.shim_env(self.cfg["pp_conn"])),
            "pp_inflight/shim": (["pingpong", ep, 1, CG_PP, MSG],
                                 self.shim_env(self.cfg["pp_inflight"])),
            "pp_unmatched/shim": (["pingpong", ep, 1, CG_PP, MSG],
                                  self.shim_env(self.cfg["pp_unmatched"])),
            "stub/none": (["connect", 1, 1, CG_STUB], self.stub_env()),
        }
        for k in ("d1", "d100", "d10000", "c64", "d10000_miss", "pool_guar", "pool_lent"):
            jobs["stub/" + k] = (["connect", 1, 1, CG_STUB], stubbed(self.cfg[k]))
        jobs["stub/unix_none"] = (["connect", UNIX_PATH, 1, CG_STUB], self.stub_env())
        jobs["stub/unix1"] = (["connect", UNIX_PATH, 1, CG_STUB], stubbed(self.cfg["unix1"]))
        if self.today:
            t = self.cfg_today
            jobs["connect/today"] = (["connect", cp, 1, CG_CONN],
                                     self.shim_env(t["connect"], lib=self.today))
            for k in ("pp_conn", "pp_inflight", "pp_unmatched"):
                jobs[k + "/today"] = (["pingpong", ep, 1, CG_PP, MSG],
                                      self.shim_env(t[k], lib=self.today))
            jobs["stub/d10000_miss/today"] = (["connect", 1, 1, CG_STUB],
                                              self.shim_env(t["d10000_miss"], self.stub,
                                                            lib=self.today))
        if self.floor:
            jobs["connect/floor"] = (["connect", cp, 1, CG_CONN],
                                     self.shim_env(self.cfg_floor["connect"], lib=self.floor))
            jobs["stub/d1/floor"] = (["connect", 1, 1, CG_STUB],
                                     self.shim_env(self.cfg_floor["d1"], self.stub,
                                                   lib=self.floor))
        if self.nolto:
            for k in ("d1", "pool_lent"):
                jobs["stub/%s/nolto" % k] = (["connect", 1, 1, CG_STUB],
                                             self.shim_env(self.cfg_nolto[k], self.stub,
                                                           lib=self.nolto))
        with ThreadPoolExecutor(max_workers=max(1, self.ncpu)) as ex:
            futs = {k: ex.submit(self.callgrind, k.replace("/", "-"), a, e)
                    for k, (a, e) in jobs.items()}
            self.cg = {k: f.result() for k, f in futs.items()}

        def per(key, fn, n):
            row = find_fn(self.cg[key]["incl"], fn)
            return (row[0] / n, row[1] / n) if row else (0.0, 0.0)

        rows = []
        cn, _ = per("connect/none", "bench_connect_close", CG_CONN)
        cs, _ = per("connect/shim", "bench_connect_close", CG_CONN)
        rows.append(("connect + close, matched (socket, connect, close)", cn, cs))
        cw, _ = per("connect_wait/shim", "bench_connect_close", CG_CONN)
        rows.append(("connect + close, matched, compartment with `max_wait_ms`", cn, cw))
        sn, _ = per("pp/none", "bench_send", CG_PP)
        rn, _ = per("pp/none", "bench_recv", CG_PP)
        self.extra_io = {}
        for key, label in (("pp_conn", "matched, max_connections"),
                           ("pp_inflight", "matched, + max_inflight"),
                           ("pp_unmatched", "unmatched socket")):
            ss, _ = per(key + "/shim", "bench_send", CG_PP)
            rs, _ = per(key + "/shim", "bench_recv", CG_PP)
            rows.append(("send, %s" % label, sn, ss))
            rows.append(("recv, %s" % label, rn, rs))
            self.extra_io[key] = (ss - sn, rs - rn)
        md = ["## 1b. Per call: instructions (callgrind)", "",
              "`valgrind --tool=callgrind --toggle-collect='bench_*'`: user-space "
              "instructions (Ir) inside the client's `bench_connect_close`, `bench_send` and "
              "`bench_recv`, inclusive of libc and the shim, divided by the calls "
              "(%d connects, %d round trips). Repeatable to the instruction; system "
              "calls cost kernel time that Ir does not count, so their number is listed "
              "apart below." % (CG_CONN, CG_PP), "",
              "| Call | Ir without shim | Ir with shim | extra Ir |",
              "| --- | ---: | ---: | ---: |"]
        for label, a, b in rows:
            md.append("| %s | %.0f | %.0f | %+.0f |" % (label, a, b, b - a))
        md += ["", "System calls per call that the shim adds (callgrind's sysCount, by the "
               "libc function that made them; under valgrind `clock_gettime` is a real "
               "system call, natively it is a vDSO call of about 20 ns):", ""]
        md += self.syscall_table([("connect + close (real)", "connect/none", "connect/shim",
                                   CG_CONN),
                                  ("connect + close (real), `max_wait_ms`", "connect/none",
                                   "connect_wait/shim", CG_CONN),
                                  ("ping-pong round trip, + max_inflight", "pp/none",
                                   "pp_inflight/shim", CG_PP)])
        self.md.append("\n".join(md))

        def calls(key):
            return sum(v for f, v in syscalls_by_fn(self.cg[key]["excl"]).items()
                       if f != "clock_gettime") / CG_CONN
        self.target("connect + close with max_wait_ms: no system call more than without",
                    "%.2f, without %.2f" % (calls("connect_wait/shim"), calls("connect/shim")),
                    calls("connect_wait/shim") <= calls("connect/shim") + 0.001)
        for key in ("pp_conn", "pp_inflight"):
            es, er = self.extra_io[key]
            self.target("< 100 extra instructions per send/recv, matched (%s)" % (
                "max_connections" if key == "pp_conn" else "+ max_inflight"),
                "send %+.0f, recv %+.0f" % (es, er), es < 100 and er < 100)

    def per_call_targets(self):
        """The table of the per-call targets: each target row with the base
        library (BENCH_BASE, the tree before the per-call work) and this
        tree's, side by side with no shim. Goes first in results.md."""
        if not self.today:
            return

        def incl(key, fn, n):
            row = find_fn(self.cg[key]["incl"], fn)
            return row[0] / n if row else 0.0

        def rt(key):
            return incl(key, "bench_send", CG_PP) + incl(key, "bench_recv", CG_PP)

        def calls(key, n):
            sc = syscalls_by_fn(self.cg[key]["excl"])
            return sum(v for f, v in sc.items() if f != "clock_gettime") / n

        base_rt = rt("pp/none")
        base_cc = incl("connect/none", "bench_connect_close", CG_CONN)
        base_st = incl("stub/none", "bench_connect_close", CG_STUB)
        base_sys = calls("connect/none", CG_CONN)
        rows = []
        for key, label, target in (
                ("pp_conn", "send+recv round trip, compartment with `max_connections` only", 50),
                ("pp_unmatched", "send+recv round trip, descriptor not counted", 20),
                ("pp_inflight", "send+recv round trip, compartment with `max_inflight`", 300)):
            t, n = rt(key + "/today") - base_rt, rt(key + "/shim") - base_rt
            rows.append((label, "%+.0f" % t, "%+.0f" % n, "≤ %d" % target, n <= target))
        t = incl("connect/today", "bench_connect_close", CG_CONN) - base_cc
        n = incl("connect/shim", "bench_connect_close", CG_CONN) - base_cc
        ts = calls("connect/today", CG_CONN) - base_sys
        ns = calls("connect/shim", CG_CONN) - base_sys
        # The floor's connect + close, real and stubbed, and the stubbed
        # one of the library make builds, each over no shim.
        floor = None
        if self.floor:
            floor = (n, incl("connect/floor", "bench_connect_close", CG_CONN) - base_cc,
                     incl("stub/d1/floor", "bench_connect_close", CG_STUB) - base_st,
                     incl("stub/d1", "bench_connect_close", CG_STUB) - base_st)
        rows.append(("connect+close, counted destination", "%+.0f, system calls %+.0f" % (t, ts),
                     "%+.0f, system calls %+.0f" % (n, ns), "≤ 500, ≤ 1 extra syscall",
                     n <= 500 and ns <= 1.001))
        t = incl("stub/d10000_miss/today", "bench_connect_close", CG_STUB) - base_st
        n = incl("stub/d10000_miss", "bench_connect_close", CG_STUB) - base_st
        rows.append(("connect to a destination that matches none of 10,000 rules",
                     "%+.0f" % t, "%+.0f" % n, "≤ 400", n <= 400))
        pp = [d for label, key, d in self.per_call_rows
              if key == "pp_conn" and "same CPU" in label][0]
        rt_new, rt_today = paired_ratio(pp["none"], pp["shim"]), paired_ratio(pp["none"], pp["today"])
        ctl = paired_ratio(pp["none"], pp["control"])
        rows.append(("one-CPU ping-pong throughput, shim / none, counted socket",
                     "%.3f" % rt_today, "%.3f (control %.3f)" % (rt_new, ctl), "≥ 0.99",
                     rt_new >= 0.99))
        md = ["## The cost per call, then and now", "",
              "Extra user-space instructions (callgrind Ir, as in 1b) over the same loop "
              "without the shim, per iteration. *Today* is the library built from commit "
              "`%s` (the tree before the per-call work, `BENCH_BASE` in bench/bench.mk), run in this "
              "same bench on segments of its own; *new* is this tree's. Extra system calls "
              "leave out `clock_gettime`, a vDSO call natively (under valgrind a system "
              "call). Throughput is the one-CPU ping-pong of table 1, both libraries in the "
              "same interleaved rounds." % self.today_rev, "",
              "| path | today | new | target | met? |", "| --- | ---: | ---: | ---: | --- |"]
        for label, t, n, target, met in rows:
            md.append("| %s | %s | %s | %s | %s |" % (label, t, n, target,
                                                     "**met**" if met else "**missed**"))
            self.target("per call: %s %s" % (label, target), "today %s, new %s" % (t, n), met)
        md += ["", self.floor_paragraph(floor)]
        self.md.insert(0, "\n".join(md))

    def floor_paragraph(self, floor):
        """What the connect + close of this design costs at the least (the
        floor library: bench/floor.patch), beside what the tree's costs:
        floor is (tree, floor, floor stubbed, tree stubbed), Ir over no shim."""
        if floor is None:
            return ("**The floor of this design** (bench/floor.patch) is not measured in this "
                    "run: %s." % (self.floor_missing or "no --floor library given"))
        new, f, fs, st = floor
        self.floor_stub = fs
        return ("**The floor of this design.** The same connect + close with this tree's "
                "library cut down by bench/floor.patch to the record that keeps the count "
                "exact under SIGKILL, fork and exec (the wrappers, the rule lookup, `fstat`, "
                "the descriptor table, the fork gate, the slot's claim and sole hold, the "
                "tagged take and the release of the connection permit), without the checks "
                "of any other level (classes, pools, observe mode, the adaptive and fleet "
                "limits, waiting, the connect timeout) and without statistics: %+.0f Ir "
                "(stubbed connect %+.0f, against %+.0f for the library make builds). The "
                "target of 500 is below what this design costs with everything else taken "
                "out. The difference, %+.0f Ir (%+.0f stubbed), is those checks and the "
                "statistics. The cut-down build passes the chaos run's plain mode with "
                "overshoot 0 and drift 0 (the patch's header)." % (
                    f, fs, st, new - f, st - fs))

    def syscall_table(self, pairs):
        md = ["| Loop | libc function | calls without shim | calls with shim |",
              "| --- | --- | ---: | ---: |"]
        for label, a, b, n in pairs:
            ca, cb = syscalls_by_fn(self.cg[a]["excl"]), syscalls_by_fn(self.cg[b]["excl"])
            for fn in sorted(set(ca) | set(cb), key=lambda f: -cb.get(f, 0)):
                md.append("| %s | `%s` | %.2f | %.2f |" % (label, fn, ca.get(fn, 0) / n,
                                                          cb.get(fn, 0) / n))
        return md

    # ---- 2. scale ----

    def scale(self):
        log("2. scale: stubbed connect with 1 to 10,000 destinations, 1 and 64 compartments")
        variants = [("none", None), ("d1", "1 destination, 1 compartment"),
                    ("d100", "100 destinations"), ("d10000", "10,000 destinations"),
                    ("c64", "64 compartments (16 destinations each)"),
                    ("d10000_miss", "10,000 destinations, connect matches none"),
                    ("pool_guar", "1 destination, compartment in a pool, within its guarantee"),
                    ("pool_lent", "1 destination, compartment in a pool, every permit borrowed"),
                    ("unix_none", None),
                    ("unix1", "1 unix socket path (`unix:%s`), 1 compartment" % UNIX_PATH)]
        # The unix rows against a baseline of their own: the kernel makes a
        # unix socket at another cost than an inet one.
        base_of = {k: "unix_none" if k.startswith("unix") else "none" for k, _ in variants}
        res = {k: [] for k, _ in variants}
        start = {k: [] for k, _ in variants}
        cpu = 1 if self.ncpu > 1 else 0
        for r in range(SCALE_ROUNDS):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for k, _ in order:
                env = (self.stub_env() if base_of[k] == k else
                       self.shim_env(self.cfg[k], self.stub))
                args = ["connect", UNIX_PATH if base_of[k] == "unix_none" else 1,
                        STUB_BATCHES, STUB_PER]
                t = time.monotonic()
                out = self.client(args, env=env, cpu=cpu)
                wall = time.monotonic() - t
                res[k].append(out["min_ns"])
                # What the process spent outside its loop: exec, loading the
                # configuration, attaching the segment, exit.
                start[k].append((wall - out["mean_ns"] * out["ops"] / 1e9) * 1000)
        ir_of = {k: find_fn(self.cg["stub/" + k]["incl"], "bench_connect_close")[0] / CG_STUB
                 for k, _ in variants}
        md = ["## 2. Scale", "", "### Connect cost against the number of rules", "",
              "The shim's own connect path, without the handshake: the client loops "
              "socket + connect + close with `libstubconnect.so` preloaded after the shim, "
              "so the \"real\" connect the shim calls returns 0 at once. The baseline "
              "preloads the stub alone. %d interleaved rounds of one run per config, a run's "
              "figure being its fastest of %d batches of %d; added ns is the median over "
              "rounds of the difference to the baseline of the same round; "
              "Ir from callgrind as in 1b. The matched rule (`127.0.0.1:1`) sits among "
              "exact addresses, networks of every prefix length from /8 to /30 and port "
              "ranges. The unix rows connect a unix socket to a path (nothing listens "
              "there: the connect is stubbed) that is their compartment's destination, "
              "against a baseline of their own." % (SCALE_ROUNDS, STUB_BATCHES, STUB_PER), "",
              "| Config | ns per connect + close (min / median) | added ns | Ir | extra Ir "
              "| process start-up + exit, ms (median) |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
        self.scale_added = {}
        for k, label in variants:
            ir, b = ir_of[k], base_of[k]
            added = paired_diff(res[k], res[b])
            self.scale_added[k] = (added, ir - ir_of[b])
            md.append("| %s | %.0f / %.0f | %s | %.0f | %s | %.1f |" % (
                label or ("no shim (stub only)" if k == "none" else
                          "no shim (stub only), to the unix socket"),
                min(res[k]), statistics.median(res[k]),
                "%+.0f" % added if k != b else "", ir,
                "%+.0f" % (ir - ir_of[b]) if k != b else "", statistics.median(start[k])))
        self.startup_ms = {k: statistics.median(v) for k, v in start.items()}
        self.md.append("\n".join(md))
        a1, i1 = self.scale_added["d1"]
        a10k, i10k = self.scale_added["d10000"]
        self.target("connect overhead ≤ 150 ns (1 destination)", "%+.0f ns" % a1, a1 <= 150)
        flat = i10k <= i1 * 1.10 + 10 and a10k <= a1 * 1.25 + 50
        self.target("connect overhead flat from 1 to 10,000 destinations",
                    "%+.0f ns / %+.0f Ir (1) vs %+.0f ns / %+.0f Ir (10,000)" % (
                        a1, i1, a10k, i10k), flat)
        # A connect in a pool costs at most a few tens of
        # instructions more than one outside. Within the guarantee that is
        # one mark flag (share.c); a borrowed permit also takes and gives a
        # permit of the pool's shared part (a second tally).
        for k, label in (("pool_guar", "within its guarantee"), ("pool_lent", "borrowed")):
            ap, ip = self.scale_added[k]
            self.target("connect + close in a pool (%s) ≤ 90 Ir more than without" % label,
                        "%+.0f Ir, %+.0f ns" % (ip - i1, ap - a1), ip - i1 <= 90)

    def permits(self):
        log("2b. acquire/release throughput: threads and processes")
        prog = os.path.join(self.bin, "permits")
        def best(mode, n):
            runs = [parse_kv(self.run([prog, self.cfg["permits"], mode, str(n),
                                       str(PERMIT_MS)])) for _ in range(2)]
            return max(runs, key=lambda r: r["pairs_per_s"])

        rows = [("%d thread%s" % (n, "s" if n > 1 else ""), best("threads", n))
                for n in (1, 2, 4, 8, 16)]
        rows.append(("4 processes", best("procs", 4)))
        md = ["### Acquire and release on one compartment", "",
              "`build/bench/permits` is linked with the shim's segment code "
              "(`build/cli/segment.o permit.o ...`) and calls `permit_acquire` then `slot_drop` "
              "in a loop for %d ms on one compartment (limit %d): the permit alone, "
              "without system calls or the descriptor table. ns per pair is wall time over "
              "all pairs of all workers; %d CPUs; best of two runs." % (
                  PERMIT_MS, LIMIT, self.ncpu), "",
              "| Workers | pairs per second | ns per pair | refused |",
              "| --- | ---: | ---: | ---: |"]
        for label, r in rows:
            md.append("| %s | %.0f | %.1f | %d |" % (label, r["pairs_per_s"], r["ns_per_pair"],
                                                  r["refused"]))
        self.permit_rows = rows
        log("   1 thread: %.0f pairs/s" % rows[0][1]["pairs_per_s"])

        log("2c. connect + close throughput with threads, real loopback")
        trows = []
        for n in (1, 4, 16):
            d = {"none": 0, "shim": 0}
            for order in (("none", "shim"), ("shim", "none")):
                for side in order:
                    env = self.env if side == "none" else self.shim_env(self.cfg["connect"])
                    r = self.client(["threads", self.close_port, n, THREAD_MS], env=env)
                    d[side] = max(d[side], r["ops_per_s"])
                    time.sleep(0.1)
            trows.append((n, d))
        md += ["", "### Connect + close throughput with threads", "",
               "`client threads`: N threads loop socket + connect + close against the "
               "accept-and-close server for %d ms (real loopback handshakes, so this is "
               "dominated by the kernel and by whatever else the machine runs); best of two "
               "runs each, in both orders." % THREAD_MS, "",
               "| Threads | connects/s, no shim | connects/s, shim | ratio |",
               "| --- | ---: | ---: | ---: |"]
        for n, d in trows:
            md.append("| %d | %.0f | %.0f | %.3f |" % (n, d["none"], d["shim"],
                                                     d["shim"] / d["none"]))
        self.md.append("\n".join(md))

    # ---- 3. against a proxy ----

    def wrk(self, url, threads, conns, env):
        out = self.run(["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % WRK_SECONDS,
                        "--latency", url], env=env, cpu=self.client_cpu,
                       timeout=WRK_SECONDS + 60)
        return parse_wrk(out)

    def proxy(self):
        log("3. against a proxy: HAProxy vs the shim, with wrk")
        fport = free_port()
        hcfg = self.path("haproxy.cfg")
        with open(hcfg, "w") as f:
            f.write(HAPROXY_CFG % {"fport": fport, "bport": self.hp, "limit": LIMIT})
        herr = open(self.path("haproxy.log"), "w")
        hp = subprocess.Popen(["haproxy", "-db", "-f", hcfg], env=self.env,
                              stdout=herr, stderr=subprocess.STDOUT, preexec_fn=pin(0))
        self.servers.append(hp)
        wait_port(fport, hp)
        direct = "http://127.0.0.1:%d/" % self.hp
        proxied = "http://127.0.0.1:%d/" % fport
        variants = [("direct", direct, self.env),
                    ("shim", direct, self.shim_env(self.cfg["http"])),
                    ("haproxy", proxied, self.env),
                    ("control", direct, self.env)]
        loads = [("1 connection", 1, 1), ("32 connections", 1, 32)]
        res = {}
        for lname, t, c in loads:
            for r in range(WRK_ROUNDS):
                order = variants if r % 2 == 0 else variants[::-1]
                for vname, url, env in order:
                    w = self.wrk(url, t, c, env)
                    if w["errors"]:
                        raise BenchError("wrk %s %s: %d errors" % (vname, lname, w["errors"]))
                    res.setdefault((lname, vname), []).append(w)
                    log("   %-15s %-8s %9.0f req/s  p50 %7.1f µs  p99 %7.1f µs" % (
                        lname, vname, w["rps"], w["p50"], w["p99"]))
        hp.terminate()
        hp.wait(timeout=10)
        herr.close()
        self.wrk_admitted = self.admitted("http")
        if self.wrk_admitted == 0:
            raise BenchError("wrk under the shim was not counted")

        def best(lname, vname):
            ws = res[(lname, vname)]
            return {k: statistics.median(w[k] for w in ws) for k in ("rps", "p50", "p99")}

        md = ["## 3. Against a proxy", "",
              "The same client (%s, one thread, pinned to CPU 1) and backend (`backend "
              "http`: keep-alive HTTP/1.1, a 13-byte body, epoll, pinned to CPU 0) on "
              "loopback: direct without the shim; direct with wrk "
              "itself preloaded with the shim and a config whose compartment is the "
              "backend (`max_connections = %d`); through HAProxy %s (`server b "
              "127.0.0.1:PORT maxconn %d`, mode http, `nbthread 1`, pinned to CPU 0 beside "
              "the backend, run in the foreground with `-db`); "
              "and direct again without the shim (the control). %d s per run, %d rounds "
              "in alternating order; the median of the rounds. Added latency is relative to direct without the shim. "
              "The shim admitted %d connections of wrk in all (its compartment's "
              "`admitted`), so it did count them." % (
                  tool_version(["wrk", "-v"]), LIMIT, tool_version(["haproxy", "-v"]), LIMIT,
                  WRK_SECONDS, WRK_ROUNDS, self.wrk_admitted), "",
              "| Load | Path | req/s | p50 µs | p99 µs | added p50 µs | added p99 µs |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        names = {"direct": "direct, no shim", "shim": "direct, wrk under the shim",
                 "haproxy": "through HAProxy", "control": "direct, no shim (control)"}
        self.proxy_best = {}
        for lname, _, _ in loads:
            d = best(lname, "direct")
            for vname, _, _ in variants:
                b = best(lname, vname)
                self.proxy_best[(lname, vname)] = b
                md.append("| %s | %s | %.0f | %.1f | %.1f | %s | %s |" % (
                    lname, names[vname], b["rps"], b["p50"], b["p99"],
                    "" if vname == "direct" else "%+.1f" % (b["p50"] - d["p50"]),
                    "" if vname == "direct" else "%+.1f" % (b["p99"] - d["p99"])))
        self.md.append("\n".join(md))
        d, s, h, c = (best("1 connection", v) for v in ("direct", "shim", "haproxy",
                                                          "control"))
        sa, ha, noise = s["p50"] - d["p50"], h["p50"] - d["p50"], abs(c["p50"] - d["p50"])
        # wrk reports whole microseconds; below the control's own spread the
        # shim is invisible to it, and the one-CPU ping-pong (section 1),
        # which times the same per-request work to the nanosecond, says
        # how much it adds.
        pp = [dd for label, key, dd in self.per_call_rows
              if key == "pp_conn" and "same CPU" in label][0]
        pp_added = paired_diff(pp["shim"], pp["none"]) / 1000
        if abs(sa) <= noise:
            used, how = max(pp_added, 0.0), ("wrk: %+.1f µs, within the control's %.1f µs; "
                                              "ping-pong: %+.2f µs" % (sa, noise, pp_added))
        else:
            used, how = sa, "wrk: %+.1f µs (control %+.1f µs)" % (sa, c["p50"] - d["p50"])
        self.proxy_added = (sa, ha, noise, pp_added)
        self.target("shim's added latency ≥ 10 × smaller than HAProxy's (p50, 1 connection)",
                    "shim %s; HAProxy %+.1f µs" % (how, ha), ha > 0 and used * 10 <= ha)

    # ---- profile, header, write ----

    def profile(self):
        md = ["## Where the instructions go", "",
              "Top functions by exclusive Ir inside the measured calls (callgrind_annotate), "
              "under the shim:"]
        for key, label, n in (("pp_inflight/shim", "ping-pong, + max_inflight, per round trip "
                               "(one send and one recv)", CG_PP),
                              ("stub/d1", "stubbed connect + close, 1 destination, per "
                               "iteration", CG_STUB)):
            md += ["", "**%s**" % label, "", "| Ir per call | function |", "| ---: | --- |"]
            for ir, fn in top_exclusive(self.cg[key]["excl"], 14):
                md.append("| %.1f | `%s` |" % (ir / n, fn))
        md += ["", "Extra system calls of the stubbed connect + close:", ""]
        md += self.syscall_table([("stubbed connect + close", "stub/none", "stub/d1", CG_STUB)])
        self.md.append("\n".join(md))
        if self.nolto:
            self.md.append("\n".join(self.connect_steps()))

    def connect_steps(self):
        """The stubbed connect + close step by step, from the library built
        without link-time optimisation (each function its own in callgrind;
        code a function inlined counts with it)."""
        base = find_fn(self.cg["stub/none"]["incl"], "bench_connect_close")[0] / CG_STUB
        cols = [("stub/d1/nolto", "1 destination"),
                ("stub/pool_lent/nolto", "in a pool, every permit borrowed")]
        per = {}
        for key, _ in cols:
            steps = {}
            for nums, fn in self.cg[key]["excl"]["rows"]:
                label = connect_step(fn)
                steps[label] = steps.get(label, 0.0) + nums[0] / CG_STUB
            per[key] = steps
        self.steps = per
        md = ["### Where a connect + close goes, step by step", "",
              "The stubbed connect + close of table 2 under callgrind, with this tree's "
              "library built without link-time optimisation (`make SHIM_LTO=`, "
              "`%s`), so that each function of the path is one of its own; code that a "
              "function inlined counts with it. Ir per iteration. The library `make` "
              "builds (with LTO) runs the same steps in fewer instructions: the totals of "
              "both are in the last rows." % os.path.relpath(self.nolto, self.build), "",
              "| step | %s | %s | borrowed − 1 destination |" % (cols[0][1], cols[1][1]),
              "| --- | ---: | ---: | ---: |"]
        a, b = per[cols[0][0]], per[cols[1][0]]
        for label, _ in CONNECT_STEPS + [(STEP_OTHER, None), (STEP_LOOP, None)]:
            if label not in a and label not in b:
                continue
            md.append("| %s | %.0f | %.0f | %+.0f |" % (label, a.get(label, 0),
                                                      b.get(label, 0),
                                                      b.get(label, 0) - a.get(label, 0)))
        ta, tb = sum(a.values()), sum(b.values())
        md.append("| **all, without LTO** (over no shim: %+.0f / %+.0f) | %.0f | %.0f | %+.0f |"
                  % (ta - base, tb - base, ta, tb, tb - ta))
        la, lb = (find_fn(self.cg[k]["incl"], "bench_connect_close")[0] / CG_STUB
                  for k in ("stub/d1", "stub/pool_lent"))
        md.append("| **all, the library make builds** (over no shim: %+.0f / %+.0f) | %.0f | "
                  "%.0f | %+.0f |" % (la - base, lb - base, la, lb, lb - la))
        return md

    def syscall_costs(self):
        r = self.client(["syscalls", 10, 20000], cpu=1 if self.ncpu > 1 else 0)
        self.sys_ns = r
        return r

    def write(self, out, command):
        cpu = "unknown"
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        rev = tree_rev() or "unknown"
        sc = self.sys_ns
        head = ["# bulkshim benchmarks", "",
                "Written by `%s` (bench/run.py); regenerate rather than edit." % command, "",
                "| | |", "| --- | --- |",
                "| Date | %s |" % datetime.datetime.now(datetime.timezone.utc).strftime(
                    "%Y-%m-%d %H:%M UTC"),
                "| Command | `%s` |" % command,
                "| Machine | %d CPUs (nproc), %s, Linux %s |" % (os.cpu_count(), cpu,
                                                              platform.release()),
                "| Tree | %s, `CFLAGS` of the Makefile (-O2 -g) |" % rev,
                "| Tools | %s; %s; %s; %s |" % (
                    tool_version(["haproxy", "-v"]), tool_version(["wrk", "-v"]),
                    tool_version(["valgrind", "--version"]), tool_version(["cc", "--version"])),
                "| One system call here | getpid %.0f ns, fstat %.0f ns, getsockopt %.0f ns; "
                "clock_gettime (vDSO) %.0f ns |" % (sc["getpid_ns"], sc["fstat_ns"],
                                                    sc["getsockopt_ns"],
                                                    sc["clock_gettime_ns"]),
                "| Load average | %.1f at the start, %.1f at the end (other work on the "
                "machine shows here, and in the noise of every wall-time figure; every "
                "measured process runs at nice %d%s) |" % (
                    self.load_start, os.getloadavg()[0], NICE,
                    "" if os.geteuid() == 0 else " if allowed, which it was not"),
                "| Run time | %.0f s |" % self.elapsed(), "",
                "## Targets", "", "Reported, not asserted.", "",
                "| Target | measured | |", "| --- | --- | --- |"]
        for what, value, met in self.targets:
            head.append("| %s | %s | **%s** |" % (what, value, "met" if met else "missed"))
        text = "\n".join(head) + "\n\n" + "\n\n".join(self.md) + "\n\n" + self.notes() + "\n"
        # The section `make bench-adaptive` writes between its markers stays.
        try:
            with open(out) as f:
                old = f.read()
            a, b = old.index("<!-- adaptive: begin"), old.index("<!-- adaptive: end -->")
            text += "\n" + old[a:b + len("<!-- adaptive: end -->")] + "\n"
        except (OSError, ValueError):
            pass
        with open(out, "w") as f:
            f.write(text)

    def notes(self):
        """Why the missed targets are missed and what would close the gaps, from
        this run's figures and profiles (each suggestion only where the profile
        still shows its cause)."""
        sc = self.sys_ns
        n_pp, n_st = CG_PP, CG_STUB
        es, er = self.extra_io["pp_inflight"]
        cs, cr = self.extra_io["pp_conn"]
        us, ur = self.extra_io["pp_unmatched"]
        a1, i1 = self.scale_added["d1"]
        am, im = self.scale_added["d10000_miss"]
        st = self.cg["stub/d1"]["excl"]
        pp = self.cg["pp_conn/shim"]["excl"]
        ppi = self.cg["pp_inflight/shim"]["excl"]
        sys_st = syscalls_by_fn(st)
        sys_pp = syscalls_by_fn(pp)
        getpid = sys_st.get("syscall", 0) / n_st
        fstat = (sys_st.get("fstatat", 0) + sys_st.get("fstat", 0)) / n_st
        gso = sys_st.get("getsockopt", 0) / n_st
        clk_conn = sys_st.get("clock_gettime", 0) / n_st
        clk_pp = sys_pp.get("clock_gettime", 0) / n_pp
        sys_cost = getpid * sc["getpid_ns"] + fstat * sc["fstat_ns"] + gso * sc["getsockopt_ns"]
        mf = excl_ir(st, "match_find") / n_st
        sa, ha, noise, pp_added = self.proxy_added
        rev = tree_rev() or "this tree"
        L = ["## Notes: why targets miss, and what would close the gaps", "",
             "Read from this run's figures and profiles (tree %s)." % rev, "",
             "- **Descriptors the shim does not count** pay %+.0f Ir per send and %+.0f per "
             "recv: the wrapper, one table lookup and an indirect call; the one-CPU "
             "ping-pong cannot tell it from no shim." % (us, ur),
             "- **send/recv on a counted socket** pay %+.0f / %+.0f Ir with "
             "`max_connections` only: the first I/O caches the verdict \"nothing to do\" in "
             "the descriptor's table entry, checked against the segment's settings sequence, "
             "and one send in 64 per thread is sampled for the reply-time histogram. With "
             "`max_inflight` they pay %+.0f / %+.0f: every request takes and gives back an "
             "in-flight permit, one tagged compare-and-swap of the count each (the tag "
             "names the slot and is the announcement: tally.c, safe against a thread "
             "killed at any instruction), adds to the shared admitted count, and one "
             "request in 16 reads the clock for the reply-time histogram, weighted by 16 "
             "(%.2f clock reads per round trip here). "
             "Natively, the one-CPU ping-pong %s %.0f ns per round trip with "
             "`max_connections` only." % (
                 cs, cr, es, er, clk_pp, "loses" if pp_added >= 0 else "gains",
                 abs(pp_added * 1000)),
             "- **connect** costs %+.0f ns and %+.0f Ir per connect + close over a stubbed "
             "connect, against a target of 150 ns. System calls alone make most of "
             "it: %.1f `getpid`, %.1f `fstat` and %.1f `getsockopt` per iteration, at "
             "%.0f, %.0f and %.0f ns each here, about %.0f ns before any instruction of "
             "the shim runs. It reads the clock %.2f times per connect: the coarse clock "
             "once at admission (the rate), and the precise clock at admission and at the "
             "end for a connect that is timed, which beyond 64 connects of a compartment "
             "in a second is one in 16.%s" % (
                 a1, i1, getpid, fstat, gso, sc["getpid_ns"], sc["fstat_ns"],
                 sc["getsockopt_ns"], sys_cost, clk_conn, self.steps_sentence() +
                 self.floor_sentence()),
             "- **The number of rules** does not change a matched connect (hash tables), "
             "but a connect that matches no rule looks up every prefix length in use: "
             "with 10,000 rules over 23 prefix lengths that is %+.0f Ir (%+.0f ns), "
             "paid by every unmatched connect of the program." % (im, am),
             "- **Start-up** with 10,000 rules takes %.0f ms against %.0f ms with one "
             "(table 2), in every process that loads the shim." % (
                 self.startup_ms["d10000"], self.startup_ms["d1"]),
             "- **Against HAProxy**: with one connection HAProxy adds %+.0f µs to the "
             "median; the shim adds %+.1f µs by wrk, whose control moves %.1f µs between "
             "identical runs, and %.2f µs by the one-CPU ping-pong." % (
                 ha, sa, noise, pp_added),
             "- **Wall time on two CPUs** swings by more than the shim costs: each message "
             "is a cross-CPU wake-up of tens of microseconds on these VMs, and the machine "
             "is shared (see the load average). Compare each ratio with its control.",
             "", "What would close the gaps, by function:", ""]
        fixes = []
        if getpid >= 1:
            fixes.append(
                "`shim_foreign` (procid.c) "
                "makes a getpid system call on every counted connect and close, and on "
                "every socket(): keep the "
                "pid in a `__thread` variable refreshed by the fork wrapper and a "
                "`pthread_atfork` child handler, and ask the kernel only on the rare paths "
                "that could run in a vfork child. Up to %.0f system calls (%.0f ns) less "
                "per connect + close." % (getpid, getpid * sc["getpid_ns"]))
        if fstat > 0 and gso > 0:
            fixes.append(
                "`shim_admit` (connect.c) makes an `fstat` (for the inode) and a "
                "`getsockopt(SO_TYPE)`. `getsockopt` alone fails with ENOTSOCK on a "
                "non-socket, and `SO_COOKIE` names a socket uniquely host-wide like "
                "`st_ino`: keyed by cookie, the segment would need one system call here "
                "(%.0f ns less)." % sc["fstat_ns"])
        if mf > 60:
            fixes.append(
                "`match_find`/`find_ip` (match_table.c): %.0f Ir for one rule, most of it the "
                "sockaddr decoding and uthash's bucket walk; a flat open-addressing table "
                "of 16-byte keys would halve it." % mf)
        if excl_ir(ppi, "wait_ready") > 0:
            fixes.append(
                "`wait_ready` (io.c), %.0f Ir per round trip: test a process-wide flag "
                "\"some compartment has io_timeout_ms\", set at start-up, before "
                "`comp_of`." % (excl_ir(ppi, "wait_ready") / n_pp))
        cross = sum(excl_ir(ppi, f) for f in ("seg_slot", "seg_comp", "fdt_get")) / n_pp
        if cross > 0:
            fixes.append(
                "`seg_slot`, `seg_comp`, `fdt_get` (admit.h, fdtable.c) are calls "
                "across files on every send and recv (%.0f Ir per round trip with their "
                "call overhead): this build did not inline them, which a build with "
                "link-time optimisation does." % cross)
        if clk_pp >= 1:
            fixes.append(
                "`permit_inflight_begin`/`inflight_finish` (permit.c, tally.c), with "
                "`max_inflight`: keep `inflight_admitted` and the reply histogram in "
                "per-process rows summed by the CLI instead of shared counters, and let the "
                "next changer of the tally finish the third step of a take or give (it "
                "already does for a dead thread) instead of a third compare-and-swap. "
                "The %.0f clock reads per round trip stay: the tests count every reply's "
                "latency in such compartments." % clk_pp)
        if clk_conn >= 3:
            fixes.append(
                "`connect` (connect.c) reads the clock %.0f times per connect (the "
                "admission rate in `note_rate` and the connect-time histogram): one read "
                "can serve them all." % clk_conn)
        L += ["%d. %s" % (k + 1, f) for k, f in enumerate(fixes)]
        if not fixes:
            L.append("None of the causes the earlier suggestions named (a getpid per call, "
                     "a getsockopt per connect, uthash on every connect, calls across files "
                     "on every send, three compare-and-swaps per permit) shows in this "
                     "profile any more. What is left of a connect + close is spread over "
                     "the steps of the table \"Where a connect + close goes\"%s." % (
                         self.largest_step()))
        return "\n".join(L)

    def shim_steps(self):
        """The shim's steps of one destination's connect + close (without
        LTO), largest first: [(Ir, step)]; [] without the table."""
        steps = getattr(self, "steps", {}).get("stub/d1/nolto", {})
        return sorted(((v, k) for k, v in steps.items() if k != STEP_LOOP), reverse=True)

    def largest_step(self):
        """', the largest of them N % of the shim's part', from the table."""
        mine = self.shim_steps()
        if not mine:
            return ""
        return ", the largest of them (%s) %.0f %% of the shim's part" % (
            mine[0][1], 100.0 * mine[0][0] / sum(v for v, _ in mine))

    def floor_sentence(self):
        """The floor of the stubbed connect + close, if measured."""
        if getattr(self, "floor_stub", None) is None:
            return ""
        return (" Cut down to the record that keeps the count exact (bench/floor.patch), the "
                "same stubbed connect + close costs %+.0f Ir: the floor of this design, "
                "above the per-call target of 500." % self.floor_stub)

    def steps_sentence(self):
        """The three largest steps of the connect + close (without LTO)."""
        mine = self.shim_steps()
        if not mine:
            return ""
        return (" Of the shim's %.0f Ir in a build without LTO (table \"Where a connect + "
                "close goes\"), the largest steps are %s." % (
                    sum(v for v, _ in mine), "; ".join("%s, %.0f" % (k, v) for v, k in mine[:3])))


HAPROXY_CFG = """global
    maxconn 4096
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:%(fport)d
    default_backend be
backend be
    server b 127.0.0.1:%(bport)d maxconn %(limit)d
"""


def many_destinations(n, include, seed=0):
    """n distinct destination rules, `include` among them (in the middle):
    exact addresses with a port, networks of every prefix length from /8 to
    /30 (any port or a port range), and bare addresses."""
    out, seen = [], set()
    want = n - (1 if include else 0)
    i = 0
    while len(out) < want:
        k = i % 10
        a = ((seed * 7919 + i * 2654435761) & 0xffffff)
        if k < 7:
            text = "10.%d.%d.%d:%d" % ((a >> 16) & 255, (a >> 8) & 255, a & 255,
                                      1024 + (i % 5000))
            key = text
        elif k < 9:
            p = 8 + (i // 10) % 23
            net = ipaddress.ip_network("%d.%d.%d.0/%d" % (11 + (a & 63), (a >> 8) & 255,
                                                          (a >> 16) & 255, p), strict=False)
            port = "" if k == 7 else ":%d-%d" % (8000 + (i % 7) * 100, 8099 + (i % 7) * 100)
            text = "%s%s" % (net, port)
            key = text
        else:
            text = "172.%d.%d.%d" % (16 + (a & 15), (a >> 8) & 255, (a >> 16) & 255)
            key = text
        i += 1
        if key in seen:
            continue
        seen.add(key)
        out.append(text)
    if include:
        out.insert(len(out) // 2, include)
    return out


def paired_ratio(a, b):
    """The median over rounds of a[i] / b[i]: runs of one round are neighbours
    in time, so what the machine does meanwhile weighs on both."""
    return statistics.median(x / y for x, y in zip(a, b))


def paired_diff(a, b):
    return statistics.median(x - y for x, y in zip(a, b))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, proc):
    for _ in range(200):
        if proc.poll() is not None:
            raise BenchError("haproxy exited with %d" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise BenchError("haproxy does not listen on %d" % port)


def tool_version(cmd):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except OSError:
        return "%s (missing)" % cmd[0]
    text = (p.stdout + p.stderr).strip().splitlines()
    line = text[0] if text else cmd[0]
    m = re.search(r"(\d+\.\d+[.\d]*[-+~\w.]*)", line)
    name = os.path.basename(cmd[0])
    if name == "valgrind":
        return line.strip()
    return "%s %s" % (name if name != "cc" else "cc", m.group(1) if m else line)


def parse_wrk(text):
    def us(v):
        m = re.match(r"([\d.]+)(us|ms|s)$", v)
        if not m:
            raise BenchError("wrk: cannot read %r" % v)
        return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]

    out = {"errors": 0}
    for line in text.splitlines():
        t = line.split()
        if len(t) == 2 and t[0] in ("50%", "99%"):
            out["p" + t[0][:-1]] = us(t[1])
        elif line.startswith("Requests/sec:"):
            out["rps"] = float(t[1])
        elif "Socket errors" in line:
            out["errors"] += sum(int(x) for x in re.findall(r"\d+", line))
        elif "Non-2xx" in line:
            out["errors"] += int(t[-1])
    if "rps" not in out or "p50" not in out:
        raise BenchError("wrk output not understood:\n" + text)
    return out


def annotate(path, inclusive):
    """callgrind_annotate rows: [(values..., function)], with the event names."""
    cmd = ["callgrind_annotate", "--threshold=100"]
    if inclusive:
        cmd.append("--inclusive=yes")
    p = subprocess.run(cmd + [path], capture_output=True, text=True)
    if p.returncode != 0:
        raise BenchError("callgrind_annotate %s: %s" % (path, p.stderr))
    events, rows, body = [], [], False
    for line in p.stdout.splitlines():
        if line.startswith("Events shown:"):
            events = line.split(":", 1)[1].split()
        elif "file:function" in line:
            body = True
        elif body:
            if line.startswith("--") and rows:
                break
            clean = re.sub(r"\(\s*[\d.]+%\)", " ", line).split()
            if len(clean) <= len(events):
                continue
            vals = clean[:len(events)]
            fn = " ".join(clean[len(events):])
            try:
                nums = [0.0 if v == "." else float(v.replace(",", "")) for v in vals]
            except ValueError:
                continue
            rows.append((nums, fn))
    return {"events": events, "rows": rows}


def fn_name(fn):
    """'/path/io.c:send [/path/lib.so]' -> 'io.c:send' (libc: 'send')."""
    name = fn.split(" [")[0]
    f, _, func = name.rpartition(":")
    func = func.split("@@")[0]
    base = os.path.basename(f)
    if "/work/" in fn or ROOT in fn:
        return "%s:%s" % (base, func)
    return func


def find_fn(ann, func):
    for nums, fn in ann["rows"]:
        if fn.split(" [")[0].endswith(":" + func):
            ir = nums[0]
            sysc = nums[ann["events"].index("sysCount")] if "sysCount" in ann["events"] else 0
            return (ir, sysc)
    return None


def excl_ir(ann, func):
    r = find_fn(ann, func)
    return r[0] if r else 0.0


def syscalls_by_fn(ann):
    if "sysCount" not in ann["events"]:
        return {}
    i = ann["events"].index("sysCount")
    out = {}
    for nums, fn in ann["rows"]:
        if nums[i] > 0:
            out[fn_name(fn)] = out.get(fn_name(fn), 0) + nums[i]
    return out


# The steps of a connect + close (bench/results.md), by the functions that
# make them up (a function's name without GCC's .isra/.part suffixes).
CONNECT_STEPS = [
    ("the wrappers: socket, connect and close (errno kept, the real call made)",
     {"socket", "connect", "close", "fresh_fd", "shim_maybe_reload", "shim_settle",
      "shim_active", "shim_foreign", "connect_began", "__errno_location"}),
    ("the rule lookup (match_table.c)", {"match_find", "match_inet_key"}),
    ("the socket's identity: fstat, the descriptor table (fdtable.c)",
     {"fstat", "fstatat", "fstat64", "fstatat64", "fdt_get", "fdt_set", "fdt_take",
      "fdt_valid", "fdt_mark_fresh", "fdt_clear_fresh", "fdt_unclaim", "fdt_entry",
      "fdt_entry_valid", "fdt_set_valid", "fdt_take_counted", "fdt_raise_high"}),
    ("the fork gate (socket and slot claim)", {"proc_gate_enter", "proc_gate_leave"}),
    ("the slot's claim: a free slot, a new generation, the sole hold",
     {"slot_alloc", "slot_claim", "hold_first", "proc_record", "claim_slot"}),
    ("the permits' takes (tally.c): the compartment's, and a borrowed permit's from a tally "
     "another slot tagged",
     {"tally_take_conn", "tally_take_lent", "tally_take", "take_loop", "reflect", "take_at"}),
    ("admission: the own code of shim_admit and permit_admit and what they inline (the "
     "class, pool, adaptive, fleet and observe checks, a borrowed permit's take from an "
     "untagged tally; peak, admitted, rate)", {"shim_admit", "admit_or_await",
                        "take_permits", "permit_admit", "take_step", "share_pool_full",
                        "share_classes_full", "note_rate", "raise_peak", "pool_note_use",
                        "pool_take", "tick", "permit_tick", "admit_class", "admit_refused",
                        "limit_conn", "limit_now", "ad_limit", "tally_mark_change"}),
    ("the clock and the connect-time histogram",
     {"now_mono_us", "now_mono_s", "clock_gettime", "stat_connect_done_in", "stat_connect_time",
      "stat_hist_add", "stat_hist_add_n"}),
    ("the hold's drop at close (slot.c)", {"slot_drop", "slot_drop_hold"}),
    ("the release: every permit given back, the slot freed",
     {"slot_release", "release_claimed", "tally_release", "release_all", "give_at",
      "give_own", "give_kind", "give_loop", "release_kind", "adaptive_conn_done", "pool_wake",
      "pool_note_release", "share_released", "untag"}),
]
STEP_OTHER = "other functions of the shim"
STEP_LOOP = "the loop itself and libc's socket, setsockopt, close (as without the shim)"
# libc functions only the shim calls on this path.
SHIM_LIBC = {"fstat", "fstatat", "fstat64", "fstatat64", "clock_gettime", "__errno_location"}
STEP_FILES = {"match_table.c": "the rule lookup (match_table.c)",
              "fdtable.c": "the socket's identity: fstat, the descriptor table (fdtable.c)"}


def connect_step(fn):
    """The step of CONNECT_STEPS that callgrind's function `fn` ('file:func
    [object]', the object left out for inlined code) is part of."""
    f, _, func = fn.split(" [")[0].rpartition(":")
    func = func.split("@@")[0].split(".")[0]
    base = os.path.basename(f)
    if "shim/" not in f and func not in SHIM_LIBC:
        return STEP_LOOP
    if base in STEP_FILES:
        return STEP_FILES[base]
    for label, funcs in CONNECT_STEPS:
        if func in funcs:
            return label
    return STEP_OTHER


def top_exclusive(ann, n):
    rows = sorted(ann["rows"], key=lambda r: -r[0][0])[:n]
    return [(nums[0], fn_name(fn)) for nums, fn in rows]


def tree_rev():
    """The commit measured, -dirty if a tracked file other than the results this
    bench writes differs from it ("" outside git)."""
    rev = subprocess.run(["git", "-C", ROOT, "describe", "--always"],
                         capture_output=True, text=True).stdout.strip()
    changed = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no",
                              "--", ".", ":(exclude)bench/results.md",
                              ":(exclude)bench/results-kernel.md"],
                             capture_output=True, text=True).stdout.strip()
    return rev + "-dirty" if rev and changed else rev


def main():
    ap = argparse.ArgumentParser(description="bulkshim benchmarks (make bench)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results.md"))
    ap.add_argument("--quick", action="store_true", help="a smoke run, fewer rounds")
    ap.add_argument("--command", default="make bench")
    ap.add_argument("--today", help="the library to measure as \"today\" (the per-call table)")
    ap.add_argument("--today-rev", help="the commit that library was built from")
    ap.add_argument("--nolto", help="this tree's library built without link-time "
                    "optimisation, for the per-step profile of a connect")
    ap.add_argument("--floor", help="this tree's library cut down by bench/floor.patch "
                    "(the floor of a connect + close); reported as missing if absent")
    opts = ap.parse_args()
    global ROUNDS, SCALE_ROUNDS, WRK_SECONDS, WRK_ROUNDS
    if opts.quick:
        ROUNDS, SCALE_ROUNDS, WRK_SECONDS, WRK_ROUNDS = 3, 3, 1, 1
    for tool in ("valgrind", "callgrind_annotate", "haproxy", "wrk"):
        if shutil.which(tool) is None:
            sys.exit("bench: %s is missing (make bench installs it: see bench/bench.mk)" % tool)
    b = Bench(opts.build, opts.quick, opts.today, opts.today_rev, opts.nolto, opts.floor)
    try:
        run_all(b, opts)
    except (BenchError, subprocess.TimeoutExpired) as e:
        sys.exit("bench: %s" % e)
    finally:
        b.cleanup()


def run_all(b, opts):
    cpu0 = 0
    b.close_port = b.server("close", cpu=cpu0)
    b.echo_port = b.server("echo", cpu=cpu0)
    b.http_port = b.server("http", cpu=cpu0)
    b.make_configs()
    b.syscall_costs()
    b.per_call()
    log("   %.0f s so far" % b.elapsed())
    b.scale_ready = False
    b.instructions()
    log("   %.0f s so far" % b.elapsed())
    b.scale()
    b.permits()
    log("   %.0f s so far" % b.elapsed())
    b.proxy()
    b.profile()
    b.per_call_targets()
    b.write(opts.out, opts.command)
    log("wrote %s in %.0f s" % (opts.out, b.elapsed()))
    for what, value, met in b.targets:
        print("  %-7s %s: %s" % ("met" if met else "MISSED", what, value))


if __name__ == "__main__":
    main()
