#!/usr/bin/env python3
"""pools.py - stranded capacity: three dependencies bursting in turn, as static compartments of 23 and as one pool of 70.

usage: pools.py [--test] [--build DIR] [--out DIR] [--png FILE] [--json FILE]
                [--hold S] [--mode static|pool|both] [--level pool|class]

Three compartments a, b and c reach one resource of 70 connections. Each of
them bursts to 40 connections in turn while the other two stay at 10, so the
resource never sees more than 60 at once. The same clients run twice under
bulkshim: first with static compartments of 23 each (3 x 23 = 69 <= 70),
then with one pool of 70 in which each compartment is guaranteed 10 and may
borrow up to a ceiling of 40. Clients are CPython programs: compartment a
and c open their connections from threads, b from forked processes (up to five
connections each). A witness, three listening sockets served by one thread of this
program, counts the connections it has open, per compartment and in all,
independently of bulkshim.

Prints a table (refusals, worst total and worst per compartment as the
witness saw them), writes the per-compartment timeline as CSV into OUT and,
with gnuplot, draws it against guarantee and ceiling into PNG. --test runs
a short version and exits 1 unless: the pool refused nothing, the static
split refused, the witness never saw more than 70 in all or a compartment
above its ceiling, and every count of the segment went back to 0.

--level class plays the same one level down: a, b and c are the classes of
one compartment of 70 (each client's BULKSHIM_CLASS names its class), capped
at 23 each (class_limits), then sharing it with class_guaranteed 10 and a
ceiling of 40 each. The compartment lists the three witness ports, one per
class, so the witness still counts each class apart. Refusals are then
class_full (static) and class_shared_full (shared).
"""

import argparse
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("a", "b", "c")
POOL_SIZE, GUARANTEE, CEILING, STATIC = 70, 10, 40, 23
BASE, BURST = 10, 40

# The client each compartment runs under the shim: it reads a target count
# per line and answers {"held": N, "refused": R} once there.
CLIENT = r'''
import json, os, socket, sys
from concurrent.futures import ThreadPoolExecutor

mode, port = sys.argv[1], int(sys.argv[2])
held, refused = [], 0
PER_CHILD = 5

def one():
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None

def child(n):
    """A forked process holding up to n connections until its pipe closes;
    it ends with a normal exit. Returns (pid, pipe, count)."""
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        for _, other, _ in held:
            os.close(other)
        os.close(r)
        os.close(w2)
        mine = [s for s in (one() for _ in range(n)) if s is not None]
        os.write(w, b"%d" % len(mine))
        os.close(w)
        os.read(r2, 1)
        sys.exit(0)
    os.close(w)
    os.close(r2)
    got = int(os.read(r, 16) or b"0")
    os.close(r)
    return pid, w2, got

def count():
    return len(held) if mode == "threads" else sum(h[2] for h in held)

for line in sys.stdin:
    want = int(line)
    if count() < want:
        n = want - count()
        if mode == "threads":
            with ThreadPoolExecutor(max_workers=n) as ex:
                got = list(ex.map(lambda _: one(), range(n)))
            for s in got:
                if s is None:
                    refused += 1
                else:
                    held.append(s)
        else:
            # Forked processes of up to PER_CHILD connections each.
            while n > 0:
                h = child(min(n, PER_CHILD))
                refused += min(n, PER_CHILD) - h[2]
                n -= min(n, PER_CHILD)
                held.append(h)
    while count() > want:
        h = held.pop()
        if mode == "threads":
            h.close()
        else:
            os.close(h[1])
            os.waitpid(h[0], 0)
    print(json.dumps({"held": count(), "refused": refused}), flush=True)
'''


class Witness:
    """Three listening sockets served by one thread: open connections per
    port and in all, and the worst of each."""

    def __init__(self, n=len(NAMES)):
        self.socks = []
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(256)
            s.setblocking(False)
            self.socks.append(s)
        self.ports = [s.getsockname()[1] for s in self.socks]
        self.live = [0] * n
        self.worst = [0] * n
        self.worst_total = 0
        self.lock = threading.Lock()
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        sel = selectors.DefaultSelector()
        for i, s in enumerate(self.socks):
            sel.register(s, selectors.EVENT_READ, ("listen", i))
        while not self.stop:
            events = sel.select(0.1)
            # Ends before starts: a close followed by a new connect must
            # not be seen as both at once.
            events.sort(key=lambda e: e[0].data[0] == "listen")
            for key, _ in events:
                kind, i = key.data
                if kind == "listen":
                    while True:
                        try:
                            c, _ = key.fileobj.accept()
                        except (BlockingIOError, InterruptedError, OSError):
                            break
                        c.setblocking(False)
                        sel.register(c, selectors.EVENT_READ, ("conn", i))
                        with self.lock:
                            self.live[i] += 1
                            self.worst[i] = max(self.worst[i], self.live[i])
                            self.worst_total = max(self.worst_total, sum(self.live))
                    continue
                try:
                    data = key.fileobj.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                    with self.lock:
                        self.live[i] -= 1
        for key in list(sel.get_map().values()):
            key.fileobj.close()

    def sample(self):
        with self.lock:
            return list(self.live)

    def close(self):
        self.stop = True
        self.t.join(2)


def write_class_config(path, mode, segment, ports):
    """One compartment of POOL_SIZE whose classes a, b and c are capped at
    STATIC each, or share it (guarantee and ceiling), one witness port each."""
    each = lambda v: "{ %s }" % " ".join("%s = %d;" % (n, v) for n in NAMES)
    limits = ("class_limits = %s;" % each(STATIC) if mode == "static" else
              "class_limits = %s;\n    class_guaranteed = %s;" % (each(CEILING), each(GUARANTEE)))
    with open(path, "w") as f:
        f.write('segment = "%s";\n' % segment)
        # Patterns no program has: each client names its class (BULKSHIM_CLASS).
        f.write("classes = { %s };\n" % " ".join('%s = [ "pools-demo-%s" ];' % (n, n)
                                                  for n in NAMES))
        f.write('compartments = (\n  { name = "db"; destinations = [ %s ];\n'
                '    max_connections = %d;\n    %s }\n);\n'
                % (", ".join('"127.0.0.1:%d"' % port for port in ports), POOL_SIZE, limits))


def write_config(path, mode, segment, ports, level="pool"):
    """The static split (three compartments of STATIC) or the pool."""
    if level == "class":
        write_class_config(path, mode, segment, ports)
        return
    lines, items = ['segment = "%s";' % segment], []
    if mode == "pool":
        lines.append('pools = ( { name = "db"; size = %d; reserved = 0; } );' % POOL_SIZE)
    lines.append("compartments = (")
    for name, port in zip(NAMES, ports):
        if mode == "pool":
            limits = 'pool = "db"; guaranteed = %d; max_connections = %d;' % (GUARANTEE, CEILING)
        else:
            limits = "max_connections = %d;" % STATIC
        items.append('  { name = "%s"; destinations = [ "127.0.0.1:%d" ]; %s }'
                     % (name, port, limits))
    lines.append(",\n".join(items))
    lines.append(");")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class Client:
    def __init__(self, env, mode, port, workdir):
        path = os.path.join(workdir, "client.py")
        with open(path, "w") as f:
            f.write(CLIENT)
        self.p = subprocess.Popen([sys.executable, path, mode, str(port)], env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                  start_new_session=True)
        self.state = {"held": 0, "refused": 0}

    def send(self, n):
        self.p.stdin.write("%d\n" % n)
        self.p.stdin.flush()

    def recv(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("a client died")
        self.state = json.loads(line)
        return self.state

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def status(cli, segment):
    r = subprocess.run([cli, "status", "-s", segment, "--json"], capture_output=True, text=True,
                       timeout=10)
    return json.loads(r.stdout) if r.returncode == 0 else None


def run(mode, args, workdir):
    """One run: returns its figures and timeline."""
    segment = "pooldemo%d%s%s" % (os.getpid(), args.level, mode)
    w = Witness()
    cfg = os.path.join(workdir, mode + ".cfg")
    write_config(cfg, mode, segment, w.ports, args.level)
    env = dict(os.environ, LD_PRELOAD=os.path.join(args.build, "libbulkshim.so"),
               BULKSHIM_CONFIG=cfg, BULKSHIM_LOG="off")
    clients = [Client(dict(env, BULKSHIM_CLASS=n) if args.level == "class" else env,
                      "procs" if i == 1 else "threads", port, workdir)
               for i, (n, port) in enumerate(zip(NAMES, w.ports))]
    timeline, t0, done = [], time.monotonic(), threading.Event()

    def sampler():
        while not done.is_set():
            timeline.append((time.monotonic() - t0, w.sample()))
            time.sleep(0.02)
    st = threading.Thread(target=sampler, daemon=True)
    st.start()

    def step(targets):
        for c, n in zip(clients, targets):
            c.send(n)
        for c in clients:
            c.recv()
        time.sleep(args.hold)
    try:
        step([BASE] * 3)
        for k in range(3):
            step([BURST if i == k else BASE for i in range(3)])
            step([BASE] * 3)
        step([0] * 3)
        peak_status = status(os.path.join(args.build, "bulkshim"), segment)
    finally:
        for c in clients:
            c.close()
        done.set()
        st.join(1)
    time.sleep(0.3)
    after = status(os.path.join(args.build, "bulkshim"), segment)
    w.close()
    try:
        os.unlink("/dev/shm/bulkshim." + segment)
    except OSError:
        pass
    leftover = None
    if after is not None:
        leftover = sum(c["in_use"] + c.get("class_lent", 0) for c in after["compartments"])
        leftover += sum(k["in_use"] for c in after["compartments"] for k in c.get("classes", []))
        leftover += sum(p["in_use"] + p["lent"] for p in after.get("pools", []))
    return {
        "mode": mode,
        "refused": {n: c.state["refused"] for n, c in zip(NAMES, clients)},
        "refused_total": sum(c.state["refused"] for c in clients),
        "worst_total": w.worst_total,
        "worst": dict(zip(NAMES, w.worst)),
        "leftover": leftover,
        "pool_full": sum(c["rejected_by"].get(shared_full(args.level), 0)
                         for c in (peak_status or {}).get("compartments", [])),
        "timeline": timeline,
    }


def shared_full(level):
    """The reason a refusal for lack of shared capacity has at this level."""
    return "class_shared_full" if level == "class" else "pool_full"


def titles(level, mode):
    """What a run is called in the table and in the picture."""
    if level == "class":
        return ("classes capped at %d" % STATIC if mode == "static" else
                "classes sharing %d" % POOL_SIZE)
    return "static 3 x %d" % STATIC if mode == "static" else "pool %d" % POOL_SIZE


def plot(results, out, png, level="pool"):
    if shutil.which("gnuplot") is None:
        print("pools: gnuplot is not installed, so no %s (apt-get install gnuplot-nox)" % png)
        return
    gp = os.path.join(out, "pools.gp")
    plots = []
    for r in results:
        csv = os.path.join(out, "%s-%s.csv" % ("classes" if level == "class" else "pools",
                                               r["mode"]))
        with open(csv, "w") as f:
            f.write("t,a,b,c,total\n")
            for t, live in r["timeline"]:
                f.write("%.3f,%d,%d,%d,%d\n" % (t, live[0], live[1], live[2], sum(live)))
        plots.append((r, csv))
    with open(gp, "w") as f:
        f.write('set terminal png size 1100,700\nset output "%s"\n' % png)
        f.write('set datafile separator ","\nset multiplot layout 2,1\n')
        f.write('set key outside right\nset yrange [0:75]\nset xlabel "seconds"\n'
                'set ylabel "connections open (witness)"\n')
        for r, csv in plots:
            what = "classes of one compartment" if level == "class" else "compartments"
            title = ("static: 3 %s capped at %d, %d refused" % (what, STATIC, r["refused_total"])
                     if r["mode"] == "static" else
                     "%s sharing %d: guarantee %d, ceiling %d each, %d refused"
                     % (what, POOL_SIZE, GUARANTEE, CEILING, r["refused_total"]))
            f.write('set title "%s"\n' % title)
            lines = ['"%s" using 1:%d with steps lw 2 title "%s"' % (csv, i + 2, n)
                     for i, n in enumerate(NAMES)]
            lines.append('"%s" using 1:5 with steps lw 1 dt 2 title "total"' % csv)
            if r["mode"] == "static":
                lines.append("%d with lines lc rgb 'red' title 'limit %d'" % (STATIC, STATIC))
            else:
                lines.append("%d with lines lc rgb 'gray' title 'guarantee'" % GUARANTEE)
                lines.append("%d with lines lc rgb 'red' title 'ceiling'" % CEILING)
            lines.append("%d with lines lc rgb 'black' title 'resource (%d)'"
                         % (POOL_SIZE, POOL_SIZE))
            f.write("plot " + ", ".join(lines) + "\n")
        f.write("unset multiplot\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode == 0:
        print("pools: chart in %s" % png)
    else:
        print("pools: gnuplot failed: %s" % r.stderr.strip()[:300], file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--test", action="store_true")
    ap.add_argument("--build", default=os.environ.get("BULKSHIM_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--out")
    ap.add_argument("--png")
    ap.add_argument("--json")
    ap.add_argument("--hold", type=float)
    ap.add_argument("--mode", choices=("static", "pool", "both"), default="both")
    ap.add_argument("--level", choices=("pool", "class"), default="pool")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.hold is None:
        args.hold = 0.2 if args.test else 1.0
    args.out = args.out or os.path.join(args.build, "demo", "out")
    args.png = args.png or os.path.join(args.build, "demo-%s.png" % (
        "classes" if args.level == "class" else "pools"))
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="bulkshim-pools-")
    try:
        modes = ("static", "pool") if args.mode == "both" else (args.mode,)
        results = [run(m, args, workdir) for m in modes]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\nstranded capacity%s: a, b and c burst to %d in turn, the others at %d; "
          "the resource holds %d" % (" (classes of one compartment)" if args.level == "class"
                                     else "", BURST, BASE, POOL_SIZE))
    print("%-34s %22s %22s" % ("", *[titles(args.level, r["mode"]) for r in results])
          if len(results) == 2 else "")
    for label, key in (("connects refused", "refused_total"),
                       ("worst total open (witness)", "worst_total"),
                       ("worst compartment (witness)", None),
                       ("refused as " + shared_full(args.level), "pool_full"),
                       ("in use after the clients exit", "leftover")):
        vals = [max(r["worst"].values()) if key is None else r[key] for r in results]
        print("%-34s %22s %22s" % (label, *[str(v) for v in vals]) if len(vals) == 2
              else "%-34s %22s" % (label, vals[0]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "timeline"} for r in results], f)
    if not args.test:
        plot(results, args.out, args.png, args.level)
        return 0
    bad = []
    for r in results:
        if r["worst_total"] > POOL_SIZE:
            bad.append("%s: the witness saw %d open in all" % (r["mode"], r["worst_total"]))
        if r["leftover"] != 0:
            bad.append("%s: %r still in use after every client exited" % (r["mode"], r["leftover"]))
        if r["mode"] == "pool":
            if r["refused_total"] != 0:
                bad.append("pool: %d connects refused, want 0" % r["refused_total"])
            if max(r["worst"].values()) > CEILING:
                bad.append("pool: a compartment above its ceiling: %r" % r["worst"])
            if max(r["worst"].values()) != BURST:
                bad.append("pool: no compartment reached %d: %r" % (BURST, r["worst"]))
        else:
            if r["refused_total"] != 3 * (BURST - STATIC):
                bad.append("static: %d refused, want %d" % (r["refused_total"], 3 * (BURST - STATIC)))
            if max(r["worst"].values()) > STATIC:
                bad.append("static: a compartment above %d: %r" % (STATIC, r["worst"]))
    for b in bad:
        print("pools: FAIL: " + b, file=sys.stderr)
    print("pools: %s" % ("FAILED" if bad else "all checks passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
