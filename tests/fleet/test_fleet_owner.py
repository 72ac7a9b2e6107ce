"""test_fleet_owner.py - the fleet agent never leaves the service a segment it cannot use.

At boot the agent starts before the service; the service runs as an unprivileged user
(nobody here). The agent runs as root or as the user its unit declares, with the unit's
capabilities. The witness server counts what the service really holds: a segment the
service cannot open makes it run without limits, and the witness sees every thread's
connection. These tests need root (to be other users), as CI runs them.
"""

import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import time

import harness
import harness_fleet as hf
import harness_io
from harness_hard import is_root, nobody, shared_dir

LIMIT, FLOOR, CEILING = 4, 2, 6
THREADS = 12            # twice the ceiling: without limits the witness sees them all
RUN_S = 2.5


def need_root():
    assert is_root(), "these tests run the agent and the service as other users: run as root"


def unit_user():
    """(name, uid, group name, gid, capabilities) that the fleet unit runs the agent as."""
    unit = hf.unit_settings()
    users = unit.get("User", [])
    assert users and users[-1] not in ("", "root", "0"), \
        "%s declares no User=: the agent runs as root" % hf.FLEET_UNIT
    try:
        pw = pwd.getpwnam(users[-1])
    except KeyError:
        raise AssertionError("the fleet unit's user %s does not exist: tests/deps.sh creates it, "
                             "as the package's postinst does" % users[-1])
    group = unit.get("Group", [grp.getgrgid(pw.pw_gid).gr_name])[-1]
    caps = " ".join(unit.get("AmbientCapabilities", [])).split()
    return pw.pw_name, pw.pw_uid, group, grp.getgrnam(group).gr_gid, caps


def setup(top):
    """Redis, the witness, a segment name and a config every user reads."""
    redis = hf.Redis()
    witness = hf.Witness()
    d = shared_dir()
    segment = harness.new_segment()
    config = hf.public_config(d, segment, witness.port, redis.address(), harness.unique("fleet"),
                              LIMIT, FLOOR, CEILING, top)
    return redis, witness, d, segment, config


def load_service(d, config, witness, groups=()):
    """The service as nobody, pressing THREADS connections for RUN_S seconds; returns the most
    connections the witness counted meanwhile."""
    uid, gid = nobody()
    svc = hf.Service(d, config, witness.port, uid, gid, groups, threads=THREADS)
    t0 = time.monotonic()
    svc.set_load(THREADS)
    time.sleep(RUN_S)
    out, err = svc.finish()
    worst = witness.max_between(t0, time.monotonic())
    hf.note("service as nobody, %d threads: witness worst %d; load says %r", THREADS, worst, out)
    assert out.startswith("connected") and int(out.split()[1]) > 0, \
        "the service made no connection: %r %r" % (out, err)
    return worst, err


def perm(segment):
    st = os.stat(harness.SHM_PREFIX + segment)
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def test_root_agent_started_first_leaves_the_segment_to_the_service():
    need_root()
    redis, witness, d, segment, config = setup({})
    agent = hf.Agent(config)
    # Boot order: the agent is up well before the service.
    time.sleep(1.0)
    worst, err = load_service(d, config, witness)
    assert worst <= FLOOR, (
        "the witness counted %d connections from the service, above its limit (its floor %d, "
        "with no lease): it ran without limits (segment %s: %s)" % (
            worst, FLOOR, segment, perm(segment) if os.path.exists(harness.SHM_PREFIX + segment)
            else "none"))
    assert perm(segment)[0] == nobody()[0], "the segment is not the service's: %r" % (perm(segment),)
    # The agent waited, said so, and once the service's segment was there refused it in one
    # line with the fix: it trusts a segment of root, its own user, or the config's owner.
    assert "waiting for it" in agent.text(), agent.text()
    assert agent.wait_exit(10) == 78, agent.text()
    refusal = [l for l in agent.text().splitlines() if 'owner = "nobody";' in l]
    assert len(refusal) == 1 and harness.SHM_PREFIX + segment in refusal[0], agent.text()
    hf.note("root agent before the service: %s", refusal[0])


def test_agent_as_the_units_user_creates_the_segment_for_the_owner():
    need_root()
    name, uid, group, gid, caps = unit_user()
    redis, witness, d, segment, config = setup({"owner": "nobody", "group": group, "mode": "0660"})
    agent = hf.Agent(config, user=(uid, gid, None, caps))
    harness.wait_until(lambda: harness_io.segment_ready(segment), 10, 0.02,
                       "the agent (user %s) to create the segment: %s" % (name, agent.text()))
    assert perm(segment) == (nobody()[0], gid, 0o660), \
        "the agent made the segment %r, not nobody:%s 0660" % (perm(segment), group)
    hf.wait_for(lambda: hf.leased(segment), 10, "the agent to lease (%s)" % agent.text()[-800:])
    worst, err = load_service(d, config, witness)
    assert worst <= LIMIT, "the witness counted %d connections, above fleet_limit %d" % (worst, LIMIT)
    assert worst >= LIMIT - 1, "the service never used its share: the witness saw %d" % worst
    st = harness.status_json(segment)
    assert st["attached"] >= 1 and st["unprotected"] == 0, st
    r = subprocess.run([harness.CLI, "status", "-c", config], capture_output=True, text=True,
                       env=harness.clean_env(), timeout=10)
    assert r.returncode == 0 and "WARNING" not in r.stdout, r.stdout
    assert agent.p.poll() is None, agent.text()
    hf.note("agent as %s (%s) made nobody:%s 0660; the service held at most %d of %d",
            name, " ".join(caps) or "no capabilities", group, worst, LIMIT)


def test_agent_without_chown_waits_for_the_service_to_create_the_segment():
    need_root()
    name, uid, group, gid, _ = unit_user()
    redis, witness, d, segment, config = setup({"owner": "nobody", "group": group, "mode": "0660"})
    agent = hf.Agent(config, user=(uid, gid, None, ()))
    time.sleep(1.0)
    # The service's user is in the agent's group, so that it can give the segment to it.
    worst, err = load_service(d, config, witness, groups=(gid,))
    assert worst <= LIMIT, (
        "the witness counted %d connections, above fleet_limit %d: the service ran without "
        "limits (segment %r; agent: %s; service: %s)" % (worst, LIMIT, perm(segment),
                                                         agent.text()[-800:], err[-800:]))
    assert perm(segment) == (nobody()[0], gid, 0o660), perm(segment)
    assert "cannot give it to nobody without CAP_CHOWN" in agent.text(), agent.text()
    hf.wait_for(lambda: hf.leased(segment), 5, "the agent to lease (%s)" % agent.text()[-800:])
    assert agent.p.poll() is None, agent.text()


def test_agent_refuses_a_segment_it_cannot_write_and_names_the_fix():
    need_root()
    name, uid, group, gid, caps = unit_user()
    redis, witness, d, segment, config = setup({"owner": "nobody", "group": group, "mode": "0660"})
    # The service started first, as nobody outside the agent's group: it cannot give the
    # segment to that group, so the segment is nobody:nogroup.
    worst, _ = load_service(d, config, witness)
    assert worst <= FLOOR, worst
    assert perm(segment)[1] != gid, perm(segment)
    agent = hf.Agent(config, user=(uid, gid, None, caps))
    assert agent.wait_exit(10) == 78, "the agent did not refuse (status %r): %s" % (
        agent.p.returncode, agent.text())
    lines = [l for l in agent.text().splitlines() if "adduser nobody %s" % group in l]
    assert len(lines) == 1 and "bulkshim rm %s" % segment in lines[0], agent.text()
    assert os.path.exists(harness.SHM_PREFIX + segment), "the agent removed the service's segment"


def test_agent_refuses_a_segment_its_owner_cannot_write():
    need_root()
    redis, witness, d, segment, config = setup({"owner": "nobody", "mode": "0600"})
    # A root program made the segment first with a config that names no owner: root:root 0600.
    other = os.path.join(d, "noowner.cfg")
    with open(config) as f, open(other, "w") as g:
        g.write(re.sub(r'^(owner|mode) = .*\n', "", f.read(), flags=re.M))
    r = subprocess.run([harness.PY, "-c", "import socket, sys; "
                        "socket.create_connection(('127.0.0.1', int(sys.argv[1]))).close()",
                        str(witness.port)], env=harness.shim_env(other, strict="1"),
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert perm(segment) == (0, 0, 0o600), perm(segment)
    agent = hf.Agent(config)
    assert agent.wait_exit(10) == 78, "the agent ran on a segment nobody cannot write: %s" % (
        agent.text())
    lines = [l for l in agent.text().splitlines() if "root:root, mode 0600" in l]
    assert len(lines) == 1 and "nobody" in lines[0] and "bulkshim rm %s" % segment in lines[0], \
        agent.text()
    assert perm(segment) == (0, 0, 0o600), "the agent changed the segment"


def test_agent_wait_for_the_segment_is_bounded():
    redis, witness, d, segment, config = setup({})
    t0 = time.monotonic()
    agent = hf.Agent(config, extra=["--wait", "1"])
    rc = agent.wait_exit(10)
    took = time.monotonic() - t0
    assert rc == 75, "status %d, want 75 (EX_TEMPFAIL, which the unit restarts): %s" % (
        rc, agent.text())
    assert 0.9 <= took < 5, "the agent waited %.1fs for --wait 1" % took
    text = agent.text()
    assert "waiting for it, at most 1 s" in text and "no owner" in text, text
    assert "after 1 s" in text, text
    assert not os.path.exists(harness.SHM_PREFIX + segment), "the agent created the segment"


def test_fleet_unit_verifies_and_runs_the_agent_as_a_dedicated_user():
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing (package systemd)"
    unit = hf.unit_settings()
    name, uid, group, gid, caps = unit_user()
    assert caps == ["CAP_CHOWN"], "AmbientCapabilities=%r, want CAP_CHOWN alone" % caps
    assert unit.get("CapabilityBoundingSet") == ["CAP_CHOWN"], unit.get("CapabilityBoundingSet")
    # A dynamic user's IPC objects, and those of RemoveIPC=, go when the unit stops: the
    # segment with them.
    for key in ("DynamicUser", "RemoveIPC", "PrivateUsers"):
        assert unit.get(key, ["no"])[-1] in ("no", "false"), "%s=%s" % (key, unit[key])
    d = os.path.join(harness.tmpdir(), "units")
    os.mkdir(d)
    with open(hf.FLEET_UNIT) as f:
        text = f.read().replace("/usr/bin/bulkshim", harness.CLI)
    path = os.path.join(d, "bulkshim-fleet@shop.service")
    with open(path, "w") as f:
        f.write(text)
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", path], capture_output=True,
                       text=True, timeout=60, env=dict(harness.clean_env(), SYSTEMD_UNIT_PATH=d + ":"))
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == 0 and out == "", "systemd-analyze verify: %s" % out
