"""test_status_owner.py - `status` warns when the segment is owned so that its programs cannot use it.

A program that cannot open its segment runs without limits and cannot even count itself as
unprotected there, so `status` alone can say it: one WARNING line with the segment's owner
and mode and the fix, instead of a quiet "0 attached".
"""

import json
import os
import re
import signal
import subprocess

import harness
import harness_io
from harness import CLI, PY, SHM_PREFIX, Server, clean_env, new_segment, shim_env, unique


def _status(*args):
    r = subprocess.run([CLI, "status"] + list(args), capture_output=True, text=True,
                       env=clean_env(), timeout=15)
    assert r.returncode == 0, "status %s: %s" % (" ".join(args), r.stderr)
    return r


def _warnings(text):
    return [l for l in text.splitlines() if l.startswith("WARNING: segment")]


def _config(segment, port, top=None):
    text = harness_io.config_text([{"name": "web", "destinations": ["127.0.0.1:%d" % port],
                                    "max_connections": 2}], segment, top)
    return harness.write_file(text)


def _attach_once(config):
    """A program under the shim, as root: it creates the segment (root:root 0600 unless the
    config says otherwise) and attaches."""
    r = subprocess.run([PY, "-c", "pass"], env=shim_env(config, strict="1"), capture_output=True,
                       text=True, timeout=20)
    assert r.returncode == 0, r.stderr


def test_status_warns_when_the_configs_owner_cannot_write_the_segment():
    assert os.geteuid() == 0, "run as root: the segment must belong to root"
    srv = Server()
    segment = new_segment()
    _attach_once(_config(segment, srv.port))
    assert os.stat(SHM_PREFIX + segment).st_uid == 0
    config = _config(segment, srv.port, {"owner": "nobody", "mode": "0600"})
    r = _status("-c", config)
    lines = _warnings(r.stdout)
    assert len(lines) == 1, "want one WARNING line about the segment: %r" % r.stdout
    for words in ("root:root, mode 0600", "nobody", "WITHOUT LIMITS", "bulkshim rm %s" % segment):
        assert words in lines[0], "the warning does not say %r: %r" % (words, lines[0])
    # --json keeps standard output one object and says it on standard error.
    r = _status("-c", config, "--json")
    json.loads(r.stdout)
    assert len(_warnings(r.stderr)) == 1, r.stderr
    # With the config's owner able to use it, or no owner and a program attached, not a word.
    os.chown(SHM_PREFIX + segment, 65534, -1)
    assert _warnings(_status("-c", config).stdout) == []
    os.chown(SHM_PREFIX + segment, 0, -1)
    assert _warnings(_status("-c", _config(segment, srv.port)).stdout) == []


def test_status_warns_about_a_segment_no_program_could_attach_to():
    assert os.geteuid() == 0, "run as root: the segment must belong to root"
    srv = Server()
    segment = new_segment()
    # An agent started first, for root, makes the segment root:root 0600 and attaches nothing.
    fleet = {"redis": "127.0.0.1:%d" % harness.free_port(), "name": unique("f"), "host": "h"}
    text = harness_io.config_text([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                                    "max_connections": 2, "fleet_limit": 4}], segment,
                                  {"owner": 0, "fleet": fleet})
    agent = subprocess.Popen([CLI, "fleet", "-c", harness.write_file(text)], env=clean_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    harness._track(agent)
    harness.defer(lambda: agent.poll() is None and agent.send_signal(signal.SIGTERM))
    harness.wait_until(lambda: harness_io.segment_ready(segment), 10, 0.02, "the agent's segment")
    r = _status("-s", segment)
    assert re.search(r"\b0 attached\b", r.stdout), r.stdout
    lines = _warnings(r.stdout)
    assert len(lines) == 1, "want one WARNING line about the segment: %r" % r.stdout
    for words in ("root:root, mode 0600", "no program has attached", "WITHOUT LIMITS",
                  'owner = "USER";', "bulkshim rm %s" % segment):
        assert words in lines[0], "the warning does not say %r: %r" % (words, lines[0])
    # Once a program (root's) attached, the segment is evidently usable by its programs.
    _attach_once(_config(segment, srv.port))
    assert _warnings(_status("-s", segment).stdout) == []
