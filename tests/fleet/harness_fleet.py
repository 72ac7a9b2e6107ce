"""harness_fleet.py - what the fleet tests share: a real redis-server, the witness, hosts.

A "host" is one segment, one `bulkshim fleet` agent and one client program
(tests/fleet/load.py under libbulkshim.so) on this machine; the witness
(tests/fleet/witness.py) is the server every host's clients connect to, and
counts the fleet's connections on its own.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time

import harness
import harness_io

FLEET_DIR = os.path.join(harness.ROOT, "tests", "fleet")
COMP = "db"


def need_redis():
    """redis-server is a test dependency (tests/deps.sh installs it)."""
    assert shutil.which("redis-server"), "redis-server is missing: apt-get install redis-server"


def _stop(p, sig=signal.SIGTERM, timeout=5):
    if p is None or p.poll() is not None:
        return
    try:
        os.kill(p.pid, signal.SIGCONT)
        p.send_signal(sig)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def resp(port, *words, timeout=2.0):
    """Sends one command to a RESP server and returns the first reply line."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        out = "*%d\r\n" % len(words) + "".join("$%d\r\n%s\r\n" % (len(w.encode()), w) for w in words)
        s.sendall(out.encode())
        return s.recv(65536).decode(errors="replace")
    finally:
        s.close()


class Redis:
    """Debian's redis-server on a free loopback port, without persistence:
    a restart loses every lease, the hard case."""

    def __init__(self, password=None):
        need_redis()
        self.port = harness.free_port()
        self.password = password
        self.dir = os.path.join(harness.tmpdir(), harness.unique("redis"))
        os.mkdir(self.dir)
        self.p = None
        self.start()
        harness.defer(self.stop)

    def start(self):
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no",
                "--logfile", os.path.join(self.dir, "redis.log")]
        if self.password:
            argv += ["--requirepass", self.password]
        self.p = subprocess.Popen(argv, env=harness.clean_env(), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)

        def up():
            try:
                return "PONG" in resp(self.port, "PING") or "NOAUTH" in resp(self.port, "PING")
            except OSError:
                return False
        harness.wait_until(up, 10, 0.02, "redis-server on port %d" % self.port)

    def stop(self):
        _stop(self.p)

    def freeze(self):
        os.kill(self.p.pid, signal.SIGSTOP)

    def thaw(self):
        os.kill(self.p.pid, signal.SIGCONT)

    def address(self):
        return "127.0.0.1:%d" % self.port


class Witness:
    """The independent count of the fleet's connections."""

    def __init__(self, max_seconds=120):
        d = harness.tmpdir()
        self.portfile = os.path.join(d, harness.unique("wport"))
        self.outfile = os.path.join(d, harness.unique("wout"))
        self.p = subprocess.Popen([harness.PY, os.path.join(FLEET_DIR, "witness.py"), self.portfile,
                                   self.outfile, str(max_seconds)], env=harness.clean_env())
        harness._track(self.p)
        harness.wait_until(lambda: os.path.exists(self.portfile), 10, 0.02, "the witness")
        with open(self.portfile) as f:
            self.port = int(f.read())
        self.result = None

    def finish(self):
        """Stops the witness; returns its timeline [[t, n], ...] and max."""
        if self.result is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(10)
            with open(self.outfile) as f:
                self.result = json.load(f)
        return self.result

    def max_between(self, t0, t1):
        """The most connections the witness counted between t0 and t1
        (CLOCK_MONOTONIC seconds)."""
        tl = self.finish()["timeline"]
        worst = 0
        for i, (t, n) in enumerate(tl):
            nxt = tl[i + 1][0] if i + 1 < len(tl) else float("inf")
            if nxt >= t0 and t <= t1:
                worst = max(worst, n)
        return worst


class Host:
    """One host of the fleet: config, segment, agent, client program."""

    def __init__(self, name, fleet, redis_addr, witness_port, limit, floor, ceiling, lease_ms=1500,
                 password_file=None, max_hosts=None):
        self.name = name
        self.segment = harness.new_segment()
        block = {"redis": redis_addr, "name": fleet, "host": name, "lease_ms": lease_ms}
        if password_file:
            block["password_file"] = password_file
        if max_hosts:
            block["hosts"] = max_hosts
        self.text = harness_io.config_text(
            [{"name": COMP, "destinations": ["127.0.0.1:%d" % witness_port],
              "max_connections": ceiling, "fleet_limit": limit, "fleet_floor": floor}],
            self.segment, {"fleet": block})
        self.config = harness.write_file(self.text)
        self.ctl = harness.write_file("0", suffix=".ctl")
        self.log = harness.write_file("", suffix=".log")
        self.agent = None
        self.load = None
        self.floor = floor

    def start_agent(self):
        with open(self.log, "a") as f:
            self.agent = subprocess.Popen([harness.CLI, "fleet", "-c", self.config, "-v"],
                                          env=harness.clean_env(), stdout=f, stderr=f)
        harness._track(self.agent)
        harness.wait_until(lambda: harness_io.segment_ready(self.segment), 10, 0.02,
                           "host %s's segment, set up" % self.name)

    def kill_agent(self):
        self.agent.kill()
        self.agent.wait(5)

    def agent_log(self):
        with open(self.log) as f:
            return f.read()

    def start_load(self, port, hold_ms=100, threads=24, max_seconds=90):
        env = harness.shim_env(self.config, strict="1")
        self.load = subprocess.Popen([harness.PY, os.path.join(FLEET_DIR, "load.py"), str(port),
                                      self.ctl, str(hold_ms), str(threads), str(max_seconds)],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        harness._track(self.load)
        harness.defer(self.set_load, "stop")

    def set_load(self, n):
        with open(self.ctl + ".tmp", "w") as f:
            f.write("%s\n" % n)
        os.rename(self.ctl + ".tmp", self.ctl)

    def comp(self):
        return harness_io.read_segment(self.segment).comp(COMP)

    def live_limit(self, c=None):
        """What admission enforces now, computed as limit_conn does."""
        c = c or self.comp()
        if time.monotonic() * 1000 < c["fleet_expiry_ms"]:
            share = c["fleet_share"]
        else:
            share = c["fleet_floor"]
        return min(share, c["limit"])

    def leased(self):
        c = self.comp()
        return time.monotonic() * 1000 < c["fleet_expiry_ms"] and c["fleet_redis_ok"] == 1

    def status(self):
        return harness.comp_of(harness.status_json(self.segment), COMP)


def wait_for(pred, timeout, what):
    """Polls pred every 20 ms; returns the seconds it took. Fails after timeout."""
    t0 = time.monotonic()
    harness.wait_until(pred, timeout, 0.02, what)
    return time.monotonic() - t0


def note(fmt, *args):
    """A measurement, printed for the closing note (run.py -v shows it)."""
    print("fleet: " + (fmt % args if args else fmt), flush=True)
