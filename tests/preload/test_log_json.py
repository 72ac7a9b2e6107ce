"""test_log_json.py - BULKSHIM_LOG_FORMAT=json and log_format = "json": every shim line one JSON
object with its fields, still rate-limited, async-signal-safe by construction; text stays the default."""

import datetime
import json
import os
import subprocess
import time

import harness
from harness import Agent, Server, Shim, shim_lines, write_file
from harness_cli import cli, config_text

FIELDS = {"time", "pid", "program", "level", "compartment", "reason", "operation", "destination",
          "in_use", "limit", "suppressed", "message"}


def _full(config_extra=None):
    srv = Server()
    comps = [{"name": "pay", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}]
    shim = Shim(comps)
    if config_extra:
        with open(shim.config, "w") as f:
            f.write(config_text(comps, shim.segment, config_extra))
    return srv, shim


def _refuse(a, port, n):
    for _ in range(n):
        assert not a("attempt(('127.0.0.1', %d))" % port)["ok"]


def _objects(text):
    """Each line of the shim's stderr parsed as JSON (a line that is not JSON fails)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            raise AssertionError("a log line is not JSON: %r" % line)
    return out


def test_env_json_lines_carry_the_fields_and_stay_rate_limited():
    srv, shim = _full()
    a = Agent(shim.env(log="warn", extra={"BULKSHIM_LOG_FORMAT": "json"}))
    a("tcp(%d)" % srv.port)
    before = datetime.datetime.now(datetime.timezone.utc)
    _refuse(a, srv.port, 5)
    time.sleep(1.1)
    _refuse(a, srv.port, 1)
    assert a.finish() == 0
    objs = _objects(a.stderr())
    assert len(objs) == 2, "want 2 lines (5 refusals in a second, then 1), got %r" % objs
    first, second = objs
    assert set(first) == FIELDS, sorted(first)
    assert first["pid"] == a.pid and first["program"] == os.path.basename(harness.PY)
    assert (first["compartment"], first["reason"], first["operation"]) == ("pay", "full", "connect")
    assert first["destination"] == "127.0.0.1:%d" % srv.port
    assert (first["in_use"], first["limit"], first["level"]) == (1, 1, "warn")
    assert first["message"] == "pay full (1/1): connect to 127.0.0.1:%d refused" % srv.port
    t = datetime.datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=datetime.timezone.utc)
    assert abs((t - before).total_seconds()) < 5, (first["time"], before)
    assert (first["suppressed"], second["suppressed"]) == (0, 4), objs


def test_config_key_json_and_env_text_wins_and_default_is_the_human_line():
    srv, shim = _full({"log_format": "json"})
    a = Agent(shim.env(log="warn"))
    a("tcp(%d)" % srv.port)
    _refuse(a, srv.port, 1)
    assert a.finish() == 0
    objs = _objects(a.stderr())
    assert len(objs) == 1 and objs[0]["reason"] == "full", objs
    b = Agent(shim.env(log="warn", extra={"BULKSHIM_LOG_FORMAT": "text"}))
    b("tcp(%d)" % srv.port)
    # Refusal lines are once a second per compartment across the segment's
    # processes: b's comes a second after a's.
    time.sleep(1.1)
    _refuse(b, srv.port, 1)
    assert b.finish() == 0
    assert shim_lines(b.stderr()) == [
        "bulkshim[%d]: pay full (1/1): connect to 127.0.0.1:%d refused" % (b.pid, srv.port)], \
        b.stderr()
    srv2, plain = _full()
    c = Agent(plain.env(log="warn"))
    c("tcp(%d)" % srv2.port)
    _refuse(c, srv2.port, 1)
    assert c.finish() == 0
    assert c.stderr().startswith("bulkshim[%d]: pay full (1/1)" % c.pid), c.stderr()


def test_other_messages_are_json_too_and_bad_values_are_named():
    cfg = write_file("compartments = ( { name = \"x\"; destinations = [ \"127.0.0.1:1\" ];\n"
                     "  max_connections = 1; } );\nlog_format = \"xml\";\n")
    r = cli("check", cfg)
    assert r.returncode != 0 and "%s:3" % cfg in r.stderr and "log_format" in r.stderr, r.stderr
    env = harness.shim_env("/nonexistent/bulkshim.cfg", log="warn",
                           extra={"BULKSHIM_LOG_FORMAT": "json"})
    p = harness.run([harness.PY, "-c", "pass"], env)
    objs = _objects(p.stderr)
    assert len(objs) == 1 and objs[0]["level"] == "warn" and \
        "no config file /nonexistent/bulkshim.cfg" in objs[0]["message"], objs
    env["BULKSHIM_LOG_FORMAT"] = "xml"
    p = harness.run([harness.PY, "-c", "pass"], env)
    assert "BULKSHIM_LOG_FORMAT=xml is not text or json; using text" in p.stderr, p.stderr


def _undefined(name):
    obj = os.path.join(harness.BUILD, "shim", name)
    harness.need_built(obj)
    r = subprocess.run(["nm", "-u", obj], capture_output=True, text=True, timeout=30)
    used = {l.split()[-1] for l in r.stdout.splitlines() if l.strip()}
    return {u for u in used if not u.startswith(("__asan", "__ubsan", "__tsan", "__sanitizer"))}


def test_the_logger_calls_nothing_that_is_not_async_signal_safe():
    """log.c writes its JSON without stdio, malloc, locale or gmtime: its object file references
    only these (clock_gettime, the errno location, and sys.c's raw system calls are
    async-signal-safe), and sys.c in turn only the system call itself, kill and string
    functions."""
    allowed = {"__errno_location", "clock_gettime", "strcmp", "syscall", "memcpy",
               "__stack_chk_fail", "_GLOBAL_OFFSET_TABLE_", "sys_call", "sys_getpid"}
    used = _undefined("log.o")
    assert used and used <= allowed, "log.o calls %s" % sorted(used - allowed)
    sys_allowed = {"__errno_location", "syscall", "kill", "strrchr", "memcpy",
                   "__stack_chk_fail", "_GLOBAL_OFFSET_TABLE_"}
    used = _undefined("sys.o")
    assert used <= sys_allowed, "sys.o calls %s" % sorted(used - sys_allowed)
