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


def set_control(path, n):
    """Tells load.py how many threads work ("stop" ends it): written whole, readable by all."""
    with open(path + ".tmp", "w") as f:
        f.write("%s\n" % n)
    os.chmod(path + ".tmp", 0o644)
    os.rename(path + ".tmp", path)


def start_load(argv, env, ctl):
    """Starts a load.py command line, stopped through its control file ctl at test end."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    harness._track(p)
    harness.defer(set_control, ctl, "stop")
    return p


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

    def over(self, t0, t1, limit):
        """The moments between t0 and t1 the witness counted more than limit,
        each with the accepts of the 50 ms before it: what a failure shows."""
        res = self.finish()
        out = []
        for t, n in res["timeline"]:
            if t0 <= t <= t1 and n > limit:
                near = [round(a - t, 4) for a in res["accepts"] if t - 0.05 <= a <= t]
                out.append("t=%.4f n=%d accepts at %s" % (t, n, near))
        return out[:10]


class Host:
    """One host of the fleet: config, segment, agent, client program."""

    def __init__(self, name, fleet, redis_addr, witness_port, limit, floor, ceiling, lease_ms=1500,
                 password_file=None, max_hosts=None, host=True, forget_s=None, interval_ms=None):
        """host: the fleet host name in the config: True for name, a string for
        that one, None for none (the default identity)."""
        self.name = name
        self.segment = harness.new_segment()
        self.block = {"redis": redis_addr, "name": fleet, "lease_ms": lease_ms}
        if host is not None:
            self.block["host"] = name if host is True else host
        if password_file:
            self.block["password_file"] = password_file
        if max_hosts:
            self.block["hosts"] = max_hosts
        if forget_s:
            self.block["forget_s"] = forget_s
        if interval_ms:
            self.block["interval_ms"] = interval_ms
        self.witness_port, self.ceiling, self.limit = witness_port, ceiling, limit
        self.text = self.config_text(limit, floor)
        self.config = harness.write_file(self.text)
        self.ctl = harness.write_file("0", suffix=".ctl")
        self.log = harness.write_file("", suffix=".log")
        self.agent = None
        self.load = None
        self.floor = floor

    def config_text(self, limit, floor):
        # The agent creates the segment for the user the clients run as,
        # this one: without an owner in the config it would wait for them.
        return harness_io.config_text(
            [{"name": COMP, "destinations": ["127.0.0.1:%d" % self.witness_port],
              "max_connections": self.ceiling, "fleet_limit": limit, "fleet_floor": floor}],
            self.segment, {"owner": os.geteuid(), "fleet": self.block})

    def reload_limit(self, limit):
        """Edits the config to another fleet_limit and applies it with `bulkshim reload`."""
        self.limit = limit
        self.text = self.config_text(limit, self.floor)
        with open(self.config, "w") as f:
            f.write(self.text)
        r = subprocess.run([harness.CLI, "reload", "-c", self.config], capture_output=True,
                           text=True, env=harness.clean_env(), timeout=10)
        assert r.returncode == 0, "reload of host %s: %s" % (self.name, r.stderr or r.stdout)

    def fleet_status(self):
        """`bulkshim fleet --status --json` through this host's config."""
        r = subprocess.run([harness.CLI, "fleet", "--status", "--json", "-c", self.config],
                           capture_output=True, text=True, env=harness.clean_env(), timeout=10)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["compartments"][0]

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
        self.load = start_load([harness.PY, os.path.join(FLEET_DIR, "load.py"), str(port),
                                self.ctl, str(hold_ms), str(threads), str(max_seconds)],
                               harness.shim_env(self.config, strict="1"), self.ctl)

    def set_load(self, n):
        set_control(self.ctl, n)

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
        return leased(self.segment)

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


# ---- the agent, the service and their users, as a host runs them ----

FLEET_UNIT = os.path.join(harness.ROOT, "configs", "systemd", "bulkshim-fleet@.service")


def unit_settings(path=FLEET_UNIT):
    """The [Service] settings of a unit file: {key: [values, in order]}."""
    out, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line:
                k, v = line.split("=", 1)
                out.setdefault(k.strip(), []).append(v.strip())
    return out


def as_user(argv, env, uid, gid, groups=None, caps=()):
    """(argv, env) that run argv as uid:gid, with the user's own supplementary groups
    (groups None, as systemd's User= gives them) or exactly those given, and the ambient
    capabilities caps (names like CAP_CHOWN, as AmbientCapabilities= gives them). The
    shim's variables are handed over by env(1) after the change, so that setpriv itself,
    still root, never runs under the shim."""
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run as another user"
    cmd = [setpriv, "--reuid=%d" % uid, "--regid=%d" % gid]
    if groups is None:
        cmd.append("--init-groups")
    elif groups:
        cmd.append("--groups=" + ",".join(str(g) for g in groups))
    else:
        cmd.append("--clear-groups")
    if caps:
        names = ",".join("+" + c.lower().replace("cap_", "", 1) for c in caps)
        cmd += ["--inh-caps=" + names, "--ambient-caps=" + names]
    inner = ["%s=%s" % (k, v) for k, v in sorted((env or {}).items())
             if k.startswith("BULKSHIM_") or k == "LD_PRELOAD" or k.startswith("ASAN_")]
    return cmd + ["--", "/usr/bin/env"] + inner + list(argv), harness.clean_env()


def public_config(directory, segment, port, redis_addr, fleet_name, limit, floor, ceiling,
                  top=None, lease_ms=1500):
    """A one-compartment fleet config (compartment COMP -> 127.0.0.1:port) in directory,
    which every user can read; top adds top-level settings (owner, group, mode)."""
    settings = dict(top or {})
    settings["fleet"] = {"redis": redis_addr, "name": fleet_name, "host": "h1",
                         "lease_ms": lease_ms}
    text = harness_io.config_text(
        [{"name": COMP, "destinations": ["127.0.0.1:%d" % port], "max_connections": ceiling,
          "fleet_limit": limit, "fleet_floor": floor}], segment, settings)
    path = os.path.join(directory, harness.unique("cfg") + ".cfg")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


class Agent:
    """`bulkshim fleet -c CONFIG -v`, as root or as user (uid, gid, groups, caps: as_user's)."""

    def __init__(self, config, user=None, extra=()):
        self.log = harness.write_file("", suffix=".log")
        argv, env = [harness.CLI, "fleet", "-c", config, "-v"] + list(extra), harness.clean_env()
        if user is not None:
            argv, env = as_user(argv, None, *user)
        with open(self.log, "a") as f:
            self.p = subprocess.Popen(argv, env=env, stdout=f, stderr=f)
        harness._track(self.p)
        harness.defer(_stop, self.p)

    def text(self):
        with open(self.log) as f:
            return f.read()

    def wait_log(self, words, timeout, what=None):
        harness.wait_until(lambda: words in self.text(), timeout, 0.02,
                           what or "the agent to say %r (it said %r)" % (words, self.text()[-1500:]))

    def wait_exit(self, timeout):
        """The agent's exit status; fails the test when it is still running after timeout."""
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the agent still runs after %gs: %s" % (timeout, self.text()[-1500:]))


class Service:
    """The service: tests/fleet/load.py under the shim as another user, not strict, as a
    service runs by default (a process that cannot attach runs without limits)."""

    def __init__(self, directory, config, port, uid, gid, groups=(), threads=12, hold_ms=100,
                 max_seconds=60):
        self.ctl = os.path.join(directory, harness.unique("ctl"))
        self.set_load(0)
        load = os.path.join(directory, "load.py")
        if not os.path.exists(load):
            shutil.copy(os.path.join(FLEET_DIR, "load.py"), load)
            os.chmod(load, 0o644)
        argv, env = as_user([harness.PY, load, str(port), self.ctl, str(hold_ms), str(threads),
                             str(max_seconds)], harness.shim_env(config), uid, gid, groups)
        self.p = start_load(argv, env, self.ctl)

    def set_load(self, n):
        set_control(self.ctl, n)

    def finish(self):
        """Stops the load; returns (its last line, its standard error)."""
        self.set_load("stop")
        out, err = self.p.communicate(timeout=15)
        return out.strip(), err


def leased(segment):
    """True while this host's lease of COMP is valid and Redis answered."""
    c = harness_io.read_segment(segment).comp(COMP)
    return time.monotonic() * 1000 < c["fleet_expiry_ms"] and c["fleet_redis_ok"] == 1
