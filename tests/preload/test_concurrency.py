"""test_concurrency.py - admission is exact across threads and processes."""

import errno
import re
import time

from harness import Agent, LineProc, Server, Shim, helper


def _parse(line):
    m = re.match(r"ok=(\d+) refused=(\d+) other=(\d+)", line)
    assert m, "racer printed %r" % line
    return tuple(int(x) for x in m.groups())


def test_threads_racing_for_three_permits_get_exactly_three():
    srv = Server()
    shim = Shim([{"name": "race", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 3}])
    racer = helper("racer")
    rounds = 5
    for i in range(rounds):
        p = LineProc([racer, "127.0.0.1", str(srv.port), "32"], shim.env(log="off"))
        ok, refused, other = _parse(p.line(10))
        assert (ok, refused, other) == (3, 29, 0), \
            "round %d: 32 threads got ok=%d refused=%d other=%d, want 3/29/0" % (i, ok, refused, other)
        srv.wait_live(3)
        shim.expect("race", in_use=3, peak=3, admitted=3 * (i + 1), rejected=29 * (i + 1))
        assert p.finish() == 0
        shim.wait("race", "in_use", 0)
        srv.wait_live(0)
    assert srv.max_live == 3, "the witness server saw %d live connections at once, want at most 3" % (
        srv.max_live)
    assert srv.accepted == 3 * rounds


def test_processes_racing_for_permits_get_exactly_the_limit():
    srv = Server()
    shim = Shim([{"name": "race", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 5}])
    racer = helper("racer")
    start = int(time.time() * 1000) + 700  # every racer's barrier opens at this instant
    procs = [LineProc([racer, "127.0.0.1", str(srv.port), "8", str(start)], shim.env(log="off"))
             for _ in range(4)]
    totals = [0, 0, 0]
    for p in procs:
        for k, v in enumerate(_parse(p.line(10))):
            totals[k] += v
    assert totals == [5, 27, 0], "4 processes x 8 threads got ok=%d refused=%d other=%d, want 5/27/0" % (
        tuple(totals))
    srv.wait_live(5)
    shim.expect("race", in_use=5, peak=5, admitted=5, rejected=27)
    for p in procs:
        assert p.finish() == 0
    shim.wait("race", "in_use", 0)
    assert srv.max_live == 5, "the witness server saw %d live at once, want 5" % srv.max_live


def test_two_processes_share_one_compartment():
    srv = Server()
    shim = Shim([{"name": "shared", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 3}])
    a = Agent(shim.env(log="off"))
    b = Agent(shim.env(log="off"))
    held_a = [a("tcp(%d)" % srv.port) for _ in range(2)]
    got = b("attempt(('127.0.0.1', %d))" % srv.port)
    assert got["ok"], "process B could not get the third permit: %r" % got
    nxt = b("attempt(('127.0.0.1', %d))" % srv.port)
    assert not nxt["ok"] and nxt["errno"] == errno.ECONNREFUSED, \
        "process B got a fourth connection past the limit of 3: %r" % nxt
    by_a = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not by_a["ok"], "process A got a fourth connection: %r" % by_a
    # The server holds the three connections, two of A's and one of B's:
    # status, read now, must count both processes as attached.
    srv.wait_live(3)
    st = shim.status()
    c = [x for x in st["compartments"] if x["name"] == "shared"][0]
    assert (c["in_use"], c["admitted"], c["rejected"]) == (3, 3, 2), c
    assert "processes" in st, "status --json has no processes count: %r" % sorted(st)
    assert st["processes"] == 2, "status counts %r processes, want 2 (A and B, each holding " \
        "connections)" % st["processes"]
    a.call("close(%d)" % held_a[0])
    again = b("attempt(('127.0.0.1', %d))" % srv.port)
    assert again["ok"], "B refused after A gave one back: %r" % again
    shim.expect("shared", in_use=3)
    assert a.finish() == 0
    srv.wait_live(2)
    st = shim.status()
    assert st["processes"] == 1, "A exited, B holds 2: status counts %r processes, want 1" % (
        st["processes"])
    shim.expect("shared", in_use=2)
    assert b.finish() == 0
    srv.wait_live(0)
    assert shim.status()["processes"] == 0, "both exited, yet status counts processes"
    shim.expect("shared", in_use=0, reclaimed=0)
