"""scenario.py - the capacity backend, the legacy client and a segment sampler, for the adaptive
preload tests and `make bench-adaptive`."""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "lib"))

import harness  # noqa: E402
from harness_io import read_segment  # noqa: E402

PY = harness.PY


class Backend:
    """capserver.py on an ephemeral loopback port, not under the shim; dist
    "exp" draws exponential service times of mean ms."""

    def __init__(self, cap, ms, dist="fixed"):
        self.p = subprocess.Popen([PY, os.path.join(HERE, "capserver.py"), str(cap), str(ms),
                                   dist],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=harness.clean_env())
        line = self.p.stdout.readline()
        assert line.startswith("port "), "capserver did not start: %r" % line
        self.port = int(line.split()[1])
        harness.defer(self.stop)

    def _get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=10) as r:
            return r.read().decode()

    def set(self, cap, ms):
        self._get("/set?cap=%d&ms=%g" % (cap, ms))

    def stats(self):
        w = self._get("/stats").split()
        return {"served": int(w[1]), "max": int(w[3]), "waiting": int(w[5])}

    def stop(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(5)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


# The benchmark's client: legacy_client.c built (bench/adaptive.mk), when set.
C_CLIENT = os.environ.get("BULKSHIM_ADAPTIVE_CLIENT")


def client(env, port, threads, seconds, pause_ms=50):
    """Starts the legacy client under env (legacy_client.py, or the C one
    when C_CLIENT names it); returns the Popen (stdout: its JSON)."""
    cmd = [C_CLIENT] if C_CLIENT else [PY, os.path.join(HERE, "legacy_client.py")]
    return subprocess.Popen(cmd + [str(port), str(threads), str(seconds), str(pause_ms)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def results(p, timeout):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, "legacy client exited %d: %s" % (p.returncode, err[-2000:])
    return json.loads(out)


def adaptive_of(c):
    """The adaptive state of a compartment read by harness_io: limit, baseline (us), mode."""
    ctl = c["ad"]["ctl"]
    return {"limit": max(1, (ctl & 0xffffff) // 16), "baseline_us": (ctl >> 24) & 0x3ffffff,
            "mode": c["ad"]["mode"], "sample_us": c["ad"]["sample_us"],
            "windows": c["ad"]["windows"]}


class Sampler:
    """Reads a compartment every `every` seconds in a thread: time, adaptive
    limit (or None), in flight, baseline and last sample (us)."""

    def __init__(self, segment, name, every=0.05):
        self.segment, self.name, self.every = segment, name, every
        self.rows = []
        self.stop_ev = threading.Event()
        self.t0 = time.monotonic()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop_ev.is_set():
            try:
                c = read_segment(self.segment).comp(self.name)
            except (AssertionError, OSError):
                c = None
            if c is not None:
                a = adaptive_of(c) if c["ad"]["mode"] else None
                self.rows.append((time.monotonic() - self.t0, a["limit"] if a else None,
                                  c["inflight"], a["baseline_us"] if a else None,
                                  a["sample_us"] if a else None))
            self.stop_ev.wait(self.every)

    def stop(self):
        self.stop_ev.set()
        self.t.join(2)
        return self.rows
