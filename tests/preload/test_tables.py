"""test_tables.py - the segment's socket and process tables: never full of entries that hold nothing, and named when full."""

import re

import harness
import harness_io
from harness import Agent, LineProc, Server, Shim, helper

# Run inside an agent: n unconnected TCP sockets, kept in SS.
PENDING = "SS = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(%d)]"


def _refusal_line(agent):
    """The shim's refusal line on the agent's standard error (read by a
    thread of the harness, so it may take a moment to arrive)."""
    def line():
        lines = [l for l in agent.stderr().splitlines() if "refused" in l]
        return lines[-1] if lines else None
    try:
        return harness.wait_until(line, 2.0, what="a refusal line")
    except AssertionError:
        raise AssertionError("no refusal line on stderr: %r" % agent.stderr())


def _says_the_table_is_full(agent, table, key, size):
    """The agent's refusal line names the table, its key and size, and a
    larger value to set."""
    line = _refusal_line(agent)
    assert "the %s table" % table in line and "%s = %d" % (key, size) in line, line
    want = re.search(r"set %s = (\d+)" % key, line)
    assert want and int(want.group(1)) > size, "the line suggests no larger %s: %r" % (key, line)


def _refused_for(shim, reason, other):
    """Compartment p of shim's segment, which refused once for reason and
    never for other."""
    c = harness.comp_of(harness.status_json(shim.segment), "p")
    assert c["rejected_by"][reason] == 1 and c["rejected_by"][other] == 0, c
    return c


def _pending_beside_a_client(extra):
    """One process holds 300 unconnected sockets and forks; a client in
    another process must still be admitted. Returns the server, the shim,
    the forking agent and its child's pid."""
    srv = Server()
    shim = Shim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 4}],
                extra)
    a = Agent(shim.env(log="off"))
    a.call(PENDING % 300)
    pid = a("fork()")
    b = Agent(shim.env())
    fds = [b("tcp(%d)" % srv.port) for _ in range(4)]
    srv.wait_live(4)
    c = shim.expect("p", in_use=4)
    assert c["rejected_by"]["no_slot"] == 0, c
    r = b("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "a fifth connect of a compartment of 4 was admitted: %r" % r
    assert "p full (4/4)" in _refusal_line(b), b.stderr()
    b.call("close(%s)" % ", ".join(str(f) for f in fds))
    shim.expect("p", in_use=0, rejected=1)
    assert b.finish() == 0
    return srv, shim, a, pid


def test_pending_sockets_of_a_fork_leave_room_for_another_process():
    srv, shim, a, pid = _pending_beside_a_client("")
    assert a("child_exit(%d)" % pid) == 0
    assert a.finish() == 0
    shim.expect("p", in_use=0)


def test_pending_sockets_beyond_a_small_table_keep_their_permit_while_shared():
    # A table of 8 for a compartment of 4: the fork's pending entries may
    # take only the 4 slots admissions cannot need, so most of the 300
    # sockets are shared with the child without one. Connected by the
    # parent afterwards, such a socket is still one connection in two
    # processes: its permit outlives the parent's close until the child's
    # copy is gone too.
    srv, shim, a, pid = _pending_beside_a_client("max_sockets = 8;")
    a.call("SS[299].connect(('127.0.0.1', %d))" % srv.port)
    srv.wait_live(1)
    shim.expect("p", in_use=1)
    a.call("SS[299].close()")
    # The child still has the connection: the server sees it, and so must
    # the count.
    srv.wait_live(1)
    shim.expect("p", in_use=1)
    more = [a("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(4)]
    assert [m["ok"] for m in more] == [True, True, True, False], \
        "with the child's copy open, want 3 more admitted then a refusal: %r" % more
    srv.wait_live(4)
    a.call("close(%s)" % ", ".join(str(m["fd"]) for m in more[:3]))
    srv.wait_live(1)
    shim.expect("p", in_use=1)
    assert a("child_exit(%d)" % pid) == 0
    srv.wait_live(0)
    shim.wait("p", "in_use", 0, timeout=1.5)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert r["ok"], "the permit is not back after the last copy closed: %r" % r
    assert a.finish() == 0


def test_a_full_process_table_names_the_table_the_key_and_a_value():
    srv = Server()
    shim = harness_io.IoShim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port],
                               "max_connections": 8}], top={"max_processes": 2})
    holders = [Agent(shim.env()) for _ in range(2)]
    for h in holders:
        h("tcp(%d)" % srv.port)
    srv.wait_live(2)
    third = Agent(shim.env())
    r = third("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "a third process was admitted past a process table of 2: %r" % r
    _says_the_table_is_full(third, "process", "max_processes", 2)
    srv.wait_live(2)
    assert _refused_for(shim, "process_table_full", "no_slot")["in_use"] == 2
    for h in holders + [third]:
        assert h.finish() == 0


def test_a_full_socket_table_names_the_table_the_key_and_a_value():
    srv = Server()
    # No max_connections: nothing but the table bounds the sockets.
    shim = harness_io.IoShim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port],
                               "max_inflight": 8}], top={"max_sockets": 2})
    a = Agent(shim.env())
    a("tcp(%d)" % srv.port)
    a("tcp(%d)" % srv.port)
    r = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not r["ok"], "a third socket was counted in a socket table of 2: %r" % r
    _says_the_table_is_full(a, "socket", "max_sockets", 2)
    srv.wait_live(2)
    assert _refused_for(shim, "no_slot", "process_table_full")["in_use"] == 2
    assert a.finish() == 0


def test_default_tables_fit_a_thousand_forked_workers_each_holding_a_socket():
    # A prefork server: a master holding one connection forks 1,000
    # workers, and each connects once more. In observe mode every one of
    # those connections is counted, so each needs a slot of the socket
    # table, and every worker a process record.
    srv = Server()
    shim = harness_io.IoShim([{"name": "p", "destinations": ["127.0.0.1:%d" % srv.port],
                               "max_connections": 4, "enforce": False}])
    p = LineProc([helper("forkhold"), "127.0.0.1", str(srv.port), "1000", "held"], shim.env())
    got = p.line(timeout=60)
    assert got == "ok=1000 failed=0", "the workers said %r (stderr: %r)" % (got, p.err.text()[-500:])
    srv.wait_live(1001, timeout=10)
    st = harness.status_json(shim.segment, timeout=30)
    c = harness.comp_of(st, "p")
    assert c["in_use"] == 1001 and c["over"] == 997, c
    assert c["rejected_by"]["no_slot"] == 0 and c["rejected_by"]["process_table_full"] == 0, c
    assert st["processes"] == 1001, st["processes"]
    assert p.finish(timeout=30) == 0
    srv.wait_live(0, timeout=10)
