#!/usr/bin/env python3
"""kernel.py - `make bench-kernel`: connect + close with the kernel engine, against none and the preloaded library.

usage: kernel.py --build DIR [--out FILE] [--rounds N]

Runs bench/client's connect mode (socket + connect + close to a loopback
accept-and-close backend, timed per batch) three ways, alternating so that
machine noise falls on all sides alike: plain; under `bulkshim run --kernel`
with the backend's port as a compartment's destination; and under
`bulkshim run` (the preloaded library) with the same config. Reports the
median over rounds of each side's fastest-batch time per connect, and the
ratios. Needs root and a machine that can load BPF programs; says why and
exits 0 without a table elsewhere.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCHES, PER = 20, 50
LIMIT = 100000


def kv(text):
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    why = subprocess.run(["sh", os.path.join(ROOT, "tests/kernel/can_load.sh")],
                         capture_output=True, text=True)
    if why.returncode != 0:
        print("bench-kernel: skipped: %s" % why.stdout.strip())
        return 0
    build = os.path.abspath(a.build)
    cli, client = os.path.join(build, "bulkshim"), os.path.join(build, "bench", "client")
    backend = subprocess.Popen([os.path.join(build, "bench", "backend"), "close"],
                               stdout=subprocess.PIPE, text=True)
    tmp = tempfile.mkdtemp(prefix="bs-benchk-")
    cfg = os.path.join(tmp, "k.cfg")
    seg = "benchk%d" % os.getpid()
    try:
        port = int(backend.stdout.readline().split()[1])
        with open(cfg, "w") as f:
            f.write('segment = "%s";\ncompartments = ( { name = "b"; destinations = '
                    '[ "127.0.0.1:%d" ]; max_connections = %d; } );\n' % (seg, port, LIMIT))
        args = [client, "connect", str(port), str(BATCHES), str(PER)]
        sides = {"none": args, "kernel": [cli, "run", "--kernel", "-c", cfg, "--"] + args,
                 "preload": [cli, "run", "-c", cfg, "--"] + args}
        got = {k: [] for k in sides}
        for _ in range(a.rounds):
            for name, argv in sides.items():
                r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    raise SystemExit("bench-kernel: %s failed: %s" % (name, r.stderr))
                res = kv(r.stdout)
                if int(res.get("errors", "0")) != 0:
                    raise SystemExit("bench-kernel: %s: %s errors" % (name, res["errors"]))
                got[name].append(float(res["min_ns"]))
        med = {k: statistics.median(v) for k, v in got.items()}
        lines = ["### Connect + close: kernel engine, preloaded library, none", "",
                 "`python3 bench/kernel.py` (in `make bench`): socket + connect + close to a "
                 "loopback accept-and-close server, %d batches of %d per run, median over %d "
                 "alternating runs of each run's fastest batch. The destination is a compartment "
                 "with a limit never reached." % (BATCHES, PER, a.rounds), "",
                 "| engine | ns per connect + close | vs none |", "|---|---:|---:|"]
        for k in ("none", "kernel", "preload"):
            lines.append("| %s | %.0f | %.2fx |" % (k, med[k], med[k] / med["none"]))
        text = "\n".join(lines) + "\n"
        print(text)
        if a.out:
            with open(a.out, "w") as f:
                f.write(text)
    finally:
        backend.kill()
        backend.wait()
        subprocess.run([cli, "detach", "-c", cfg], capture_output=True)
        for p in (cfg,):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(tmp)
        if os.path.exists("/dev/shm/bulkshim." + seg):
            os.unlink("/dev/shm/bulkshim." + seg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
