"""adaptive_pg.py - the PostgreSQL row of `make bench-adaptive`: a throw-away cluster and a
CPU-bound query that every extra query slows (the processor is shared, nothing queues)."""

import os
import shutil
import subprocess
import time

import harness

TARGET_MS = 30          # what one query alone should take


class Cluster:
    """initdb and pg_ctl in a temporary directory, on a free loopback port;
    as the postgres user when run as root (initdb refuses root). Stopped by
    stop() or by harness.cleanup()."""

    def __init__(self):
        base = "/usr/lib/postgresql"
        vers = sorted(os.listdir(base), reverse=True) if os.path.isdir(base) else []
        self.bindir = next((base + "/%s/bin" % v for v in vers
                            if os.path.exists(base + "/%s/bin/initdb" % v)), None)
        if self.bindir is None:
            raise RuntimeError("PostgreSQL is not installed (tests/deps.sh postgresql)")
        self.dir = os.path.join(harness.tmpdir(), "pg")
        os.makedirs(self.dir)
        self.port = harness.free_port()
        self.as_user = []
        if os.geteuid() == 0:
            os.chmod(harness.tmpdir(), 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", self.dir + "/data", "-U", "postgres", "-A", "trust",
                  "--no-sync")
        # max_connections above the client's threads; no parallel workers,
        # so one query is one process on one core.
        self._run("pg_ctl", "-D", self.dir + "/data", "-w", "-l", self.dir + "/log", "-o",
                  "-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c max_connections=200 -c max_parallel_workers_per_gather=0"
                  % (self.port, self.dir), "start")
        self.running = True
        harness.defer(self.stop)

    def _run(self, prog, *args):
        r = subprocess.run(self.as_user + [os.path.join(self.bindir, prog)] + list(args),
                           capture_output=True, text=True, timeout=120, env=harness.clean_env())
        if r.returncode != 0:
            raise RuntimeError("%s: %s %s" % (prog, r.stdout[-1000:], r.stderr[-1000:]))
        return r.stdout

    def conninfo(self):
        """TCP to the loopback port (the shim counts sockets to destinations,
        not the Unix socket), without SSL negotiation."""
        return "host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable " \
               "connect_timeout=30" % self.port

    def psql(self, sql):
        return subprocess.run([os.path.join(self.bindir, "psql"), "-h", "127.0.0.1", "-p",
                               str(self.port), "-U", "postgres", "-Atc", sql],
                              capture_output=True, text=True, timeout=60,
                              env=harness.clean_env()).stdout.strip()

    def stop(self):
        if self.running:
            self.running = False
            subprocess.run(self.as_user + [os.path.join(self.bindir, "pg_ctl"), "-D",
                                           self.dir + "/data", "-m", "immediate", "stop"],
                           capture_output=True, timeout=60, env=harness.clean_env())


def query(n):
    return "select sum(i) from generate_series(1, %d) as i" % n


def calibrate(cl):
    """A generate_series size whose sum takes about TARGET_MS alone (the
    median of a few runs, timed by the server); returns (query, ms)."""
    n = 200000
    for _ in range(4):
        ms = []
        for _ in range(5):
            out = cl.psql("explain (analyze, timing off, summary on) " + query(n))
            line = [x for x in out.splitlines() if x.startswith("Execution Time")]
            if line:
                ms.append(float(line[0].split()[2]))
        ms.sort()
        med = ms[len(ms) // 2] if ms else TARGET_MS
        if abs(med - TARGET_MS) < 0.15 * TARGET_MS:
            return query(n), med
        n = max(10000, int(n * TARGET_MS / max(med, 0.5)))
    return query(n), med


def client(cbin, env, cl, sql, threads, seconds, pause_ms=50):
    """bench/pg_client under env; a Popen whose stdout is its JSON, read with
    scenario.results."""
    return subprocess.Popen([cbin, cl.conninfo(), sql, str(threads), str(seconds),
                             str(pause_ms)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def capacity_probe(cbin, cl, sql, seconds=2.0):
    """Queries per second at 1, 2 and 4 at once without the shim, to report
    where the processor saturates; (threads, goodput, median ms) each."""
    import scenario
    out = []
    for n in (1, 2, 4):
        p = client(cbin, harness.clean_env(), cl, sql, n, seconds)
        reqs = scenario.results(p, seconds + 60)
        ok = sorted(r[2] for r in reqs if r[1] == "ok")
        out.append((n, len(ok) / seconds, ok[len(ok) // 2] if ok else float("nan")))
        time.sleep(0.2)
    return out
