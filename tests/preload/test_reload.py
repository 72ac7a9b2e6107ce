"""test_reload.py - a running program takes a changed config at its next connect: new
destinations counted, on any thread, in a child forked meanwhile, without growing, and with the
addresses its host names resolved to kept."""

import errno
import json
import os
import re

import harness
from harness import Agent, Server, new_segment, tmpdir
from harness_cli import cli_ok, config_text


def _refused(t):
    return not t["ok"] and t["errno"] == errno.ECONNREFUSED


def test_reload_changes_a_destination_of_a_running_process():
    p1, p2 = Server(), Server()
    seg = new_segment()
    path = os.path.join(tmpdir(), "reload.cfg")
    with open(path, "w") as f:
        f.write(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p1.port],
                              "max_connections": 1}], seg))
    a = Agent(harness.shim_env(path, log="off"))
    fd = a("tcp(%d)" % p1.port)
    assert _refused(a("attempt(('127.0.0.1', %d))" % p1.port)), "P1 is not counted before reload"
    a.call("close(%d)" % fd)
    assert all(a("attempt(('127.0.0.1', %d))" % p2.port)["ok"] for _ in range(2)), \
        "P2 is limited before reload"
    before = harness.comp_of(harness.status_json(seg), "x")

    with open(path, "w") as f:
        f.write(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p2.port],
                              "max_connections": 1}], seg))
    out = cli_ok("reload", "-c", path)
    assert "generation 1" in out, out
    st = harness.status_json(seg)
    assert st["generation"] == 1, st

    first = a("attempt(('127.0.0.1', %d))" % p2.port)
    second = a("attempt(('127.0.0.1', %d))" % p2.port)
    assert first["ok"] and _refused(second), \
        "after reload, P2 should be counted with limit 1: got %r then %r" % (first, second)
    assert all(a("attempt(('127.0.0.1', %d))" % p1.port)["ok"] for _ in range(3)), \
        "after reload, P1 is still limited"
    x = harness.comp_of(harness.status_json(seg), "x")
    assert x["admitted"] == before["admitted"] + 1 and x["rejected"] == before["rejected"] + 1, \
        "before %s, after %s" % (json.dumps(before), json.dumps(x))
    assert a.finish() == 0


def test_a_reload_on_a_thread_with_a_small_stack_does_not_crash_it():
    """A reload runs on whichever thread of the program connects next. Here
    that is a thread with a 64 KiB stack, and the new config includes files
    ten deep: the reload applies, the thread's connect is counted by it, and
    the program lives (the config it loads is 43 KB, which the reload once
    kept on that stack beside libconfig's parser)."""
    p1, p2 = Server(), Server()
    seg = new_segment()
    d = tmpdir()
    path = os.path.join(d, "small-stack.cfg")
    with open(path, "w") as f:
        f.write(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p1.port],
                              "max_connections": 4}], seg))
    a = Agent(harness.shim_env(path, log="off"))
    a.call("import threading")
    assert a("attempt(('127.0.0.1', %d))" % p1.port)["ok"]

    for i in range(9):
        with open(os.path.join(d, "inc%d.cfg" % i), "w") as f:
            f.write('@include "inc%d.cfg"\n' % (i + 1))
    with open(os.path.join(d, "inc9.cfg"), "w") as f:
        f.write(harness.config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p2.port],
                                      "max_connections": 4}]))
    with open(path, "w") as f:
        f.write('segment = "%s";\n@include "inc0.cfg"\n' % seg)
    cli_ok("reload", "-c", path)
    before = harness.comp_of(harness.status_json(seg), "x")["admitted"]
    got = a.call("out = []\n"
                 "threading.stack_size(64 << 10)\n"
                 "t = threading.Thread(target=lambda: out.append("
                 "attempt(('127.0.0.1', %d))))\n"
                 "t.start()\n"
                 "t.join()\n"
                 "threading.stack_size(0)" % p2.port, "out")
    assert got and got[0]["ok"], "the small thread's connect: %r" % got
    after = harness.comp_of(harness.status_json(seg), "x")["admitted"]
    assert after == before + 1, "P2 is not counted after the reload: %d then %d" % (before, after)
    assert a("attempt(('127.0.0.1', %d))" % p1.port)["ok"]
    assert harness.comp_of(harness.status_json(seg), "x")["admitted"] == after, \
        "P1 is still counted after the reload"
    assert a.finish() == 0


def test_a_fork_during_a_reload_leaves_the_child_able_to_reload():
    """A thread's connect reloads (a 15 MiB file, so it takes a while) while
    the main thread forks. The child has no thread reloading, and must
    reload itself at its next connect: once a fork in that window left the
    child's reload flag raised for good, and it kept the old destinations."""
    p1, p2 = Server(), Server()
    seg = new_segment()
    path = os.path.join(tmpdir(), "slow-reload.cfg")
    pad = "# " + "p" * 77 + "\n"
    for round_ in range(4):
        with open(path, "w") as f:
            f.write(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p1.port],
                                  "max_connections": 50}], seg))
        a = Agent(harness.shim_env(path, log="off"), timeout=30)
        a.call("import threading, time")
        with open(path, "w") as f:
            f.write(config_text([{"name": "x", "destinations": ["127.0.0.1:%d" % p2.port],
                                  "max_connections": 50}], seg))
            f.write(pad * ((15 << 20) // len(pad)))
        cli_ok("reload", "-c", path)
        pid = a.call("t = threading.Thread(target=attempt, args=(('127.0.0.1', %d),))\n"
                     "t.start()\n"
                     "time.sleep(0.02 * %d)\n"
                     "pid = fork()\n"
                     "t.join()" % (p1.port, round_ + 1), "pid")
        before = harness.comp_of(harness.status_json(seg), "x")["admitted"]
        got = a("child(%d, expr=\"attempt(('127.0.0.1', %d))\")" % (pid, p2.port), timeout=30)
        after = harness.comp_of(harness.status_json(seg), "x")["admitted"]
        assert got["ok"], got
        assert after == before + 1, \
            "round %d: the child forked during the reload does not count the new " \
            "destination (admitted %d then %d)" % (round_, before, after)
        a("child_exit(%d)" % pid)
        assert a.finish() == 0


def test_reloads_that_change_only_limits_keep_the_rules_and_their_memory():
    """Sixty reloads of a 2,001-destination file that change only the limit.
    An old set of rules is never freed (another thread may be reading it),
    so each rebuild stayed allocated: 22.7 MB of RSS in this test before.
    Unchanged destinations are now kept as they are."""
    srv = Server()
    seg = new_segment()
    path = os.path.join(tmpdir(), "limits-only.cfg")
    dests = ["127.0.0.1:%d" % srv.port] + \
        ["10.%d.%d.%d:80" % (i // 65536, (i // 256) % 256, i % 256) for i in range(2000)]

    def write(limit):
        with open(path, "w") as f:
            f.write(config_text([{"name": "x", "destinations": dests,
                                  "max_connections": limit}], seg))

    def rss_kb():
        with open("/proc/%d/status" % a.pid) as f:
            return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))

    write(10)
    a = Agent(harness.shim_env(path, log="info"))
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    before = rss_kb()
    for i in range(60):
        write(11 + i % 2)
        cli_ok("reload", "-c", path)
        a("close(attempt(('127.0.0.1', %d))['fd'])" % srv.port)
    grown = rss_kb() - before
    # A sanitizer's quarantine keeps freed memory: RSS says nothing there.
    if not os.environ.get("BULKSHIM_PRELOAD_PREFIX"):
        assert grown < 6 << 10, "60 limit-only reloads grew RSS by %d KB" % grown
    def unchanged():
        return [l for l in a.stderr().splitlines()
                if "destinations in %s are unchanged" % path in l]
    # The agent's standard error is read by a thread of this test: the last line written may
    # still be on its way.
    try:
        harness.wait_until(lambda: len(unchanged()) >= 60, 5, 0.05, "60 'unchanged' lines")
    except AssertionError:
        pass
    assert len(unchanged()) == 60, "want 60 'unchanged' lines, got %d" % len(unchanged())
    # The rules still count, with the last limit (12), one socket held.
    assert harness.comp_of(harness.status_json(seg), "x")["limit"] == 12
    fds = [a("tcp(%d)" % srv.port) for _ in range(11)]
    assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port)), "the 13th was not refused"
    a.call("close(*%r)" % fds)
    assert a.finish() == 0


def _host_cfg(path, seg, host, port, limit, more=()):
    with open(path, "w") as f:
        f.write(config_text([{"name": "byname", "destinations": ["%s:%d" % (host, port)] +
                              list(more), "max_connections": limit}], seg))


def _admitted(seg):
    return harness.comp_of(harness.status_json(seg), "byname")["admitted"]


def test_a_reload_keeps_counting_the_addresses_a_host_name_resolved_to():
    """A reload that changes the destinations rebuilds the rules without
    resolving anything. The addresses a kept host name resolved to at
    start-up stay counted, though the program does not look the name up
    again (as a pool that reconnects to the address it has does)."""
    srv = Server()
    seg = new_segment()
    path = os.path.join(tmpdir(), "byname.cfg")
    _host_cfg(path, seg, "localhost", srv.port, 2)
    a = Agent(harness.shim_env(path, log="off"))
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert _admitted(seg) == 1, "localhost:%d does not count 127.0.0.1 at start" % srv.port
    _host_cfg(path, seg, "localhost", srv.port, 3, ["127.0.0.9:9"])
    cli_ok("reload", "-c", path)
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert _admitted(seg) == 2, "after a reload 127.0.0.1 is no longer counted"
    # Two held (attempt keeps its socket): the third is the last.
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert _refused(a("attempt(('127.0.0.1', %d))" % srv.port)), \
        "the reloaded limit of 3 does not hold for localhost's address"
    assert a.finish() == 0


def test_a_reload_keeps_counting_the_addresses_the_program_looked_up():
    """What the program's own getaddrinfo found for a name since start-up is
    kept across a reload too, as is what start-up found."""
    srv = Server()
    seg = new_segment()
    path = os.path.join(tmpdir(), "moving.cfg")
    _host_cfg(path, seg, "bs-moving-host", srv.port, 4)
    a, hosts = harness.agent_with_hosts(harness.shim_env(path, log="off"),
                                        "127.0.0.1 localhost\n127.0.0.2 bs-moving-host\n")
    with open(hosts, "w") as f:  # same inode, so the bind mount shows it
        f.write("127.0.0.1 localhost\n127.0.0.1 bs-moving-host\n")
    code = "ai = socket.getaddrinfo('bs-moving-host', %d, socket.AF_INET, socket.SOCK_STREAM)" \
        % srv.port
    assert a.call(code, "ai[0][4]") == ["127.0.0.1", srv.port], "the name did not move"
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert _admitted(seg) == 1, "the address the program looked up is not counted"
    _host_cfg(path, seg, "bs-moving-host", srv.port, 5, ["127.0.0.9:9"])
    cli_ok("reload", "-c", path)
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    assert _admitted(seg) == 2, "after a reload the looked-up 127.0.0.1 is no longer counted"
    # 127.0.0.2, found at start-up, still counts: nobody listens there.
    a("attempt(('127.0.0.2', %d))" % srv.port)
    assert _admitted(seg) == 3, "after a reload 127.0.0.2 (found at start) is no longer counted"
    assert a.finish() == 0
