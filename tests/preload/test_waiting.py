"""test_waiting.py - bounded waiting for a connection permit (max_wait_ms, max_waiting) across processes."""

import errno

from harness import Agent, Server, wait_until
from harness_io import IoShim, brief, collect, expect

# In an agent: a blocking connect that reports when it started and ended.
TIMED_CONNECT = """
t0 = time.monotonic()
try:
    fd = tcp(%d)
    res = {'ok': True, 'fd': fd}
except OSError as e:
    res = {'ok': False, 'errno': e.errno}
res['t0'] = t0
res['t1'] = time.monotonic()
"""

# In an agent: closes fd, reporting the moment just before the close.
TIMED_CLOSE = "time.sleep(0.2)\nt_rel = time.monotonic()\nos.close(%d)"


def _setup(**keys):
    srv = Server()
    comp = {"name": "db", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1,
            "max_wait_ms": 3000}
    comp.update(keys)
    return srv, IoShim([comp])


def test_waiter_in_other_process_woken_at_release():
    # Three rounds, the two processes swapping roles: a wake-up that came
    # from polling rather than from the release would miss 50 ms by chance.
    srv, shim = _setup()
    holder, waiter = Agent(shim.env(log="off")), Agent(shim.env(log="off"))
    fd = holder("tcp(%d)" % srv.port)
    for rnd in range(3):
        waiter.send(TIMED_CONNECT % srv.port, "res")
        shim.wait_eq("db", "waiting", 1)
        holder.call(TIMED_CLOSE % fd)
        t_rel = holder("t_rel")
        res = collect(waiter)
        assert res["ok"], "round %d: the waiter was refused (errno %s) although a permit was " \
            "released" % (rnd, res.get("errno"))
        woke = res["t1"] - t_rel
        print("round %d: connected %.2f ms after the release" % (rnd, woke * 1e3))
        assert 0 <= woke < 0.05, "round %d: the waiter connected %.1f ms after the release in " \
            "another process, want < 50 ms" % (rnd, woke * 1e3)
        assert res["t1"] - res["t0"] >= 0.15, "round %d: the waiter got in after %.0f ms, " \
            "before the release" % (rnd, (res["t1"] - res["t0"]) * 1e3)
        holder, waiter, fd = waiter, holder, res["fd"]
    c = expect(shim.comp("db"), in_use=1, waiting=0, admitted=4, rejected=0)
    assert c["h_wait"]["count"] == 3, "h_wait counted %d waits, want 3 (%s)" % (c["h_wait"]["count"], brief(c))
    waited_ms = c["h_wait"]["sum_us"] / 1e3 / 3
    assert 150 <= waited_ms < 1000, "h_wait recorded %.0f ms a wait, want about 200" % waited_ms
    # The witness accepts in a thread of its own: on a loaded machine its
    # count may lag the connect that already returned (bounded wait).
    wait_until(lambda: srv.accepted >= 4, 5, what="the server's 4th accept")
    assert srv.accepted == 4, "the server accepted %d connections, want 4" % srv.accepted
    assert waiter.finish() == 0 and holder.finish() == 0


def test_waiters_beyond_max_waiting_refused_at_once():
    srv, shim = _setup(max_waiting=1)
    holder, waiter = Agent(shim.env(log="off")), Agent(shim.env(log="off"))
    fd = holder("tcp(%d)" % srv.port)
    waiter.send(TIMED_CONNECT % srv.port, "res")
    shim.wait_eq("db", "waiting", 1)

    # A second waiter (in the holder's process) finds the one place taken.
    second = holder("attempt(('127.0.0.1', %d))" % srv.port)
    assert not second["ok"] and second["errno"] == errno.ECONNREFUSED, \
        "second concurrent waiter with max_waiting = 1: %r" % second
    assert second["dt"] < 0.05, "the second waiter was refused after %.0f ms, want at once" % (
        second["dt"] * 1e3)
    expect(shim.comp("db"), waiting=1, rejected=1, rejected_by_too_many_waiting=1, in_use=1)

    holder.call("os.close(%d)" % fd)
    res = collect(waiter)
    assert res["ok"], "the first waiter was refused (errno %s)" % res.get("errno")
    c = expect(shim.comp("db"), in_use=1, waiting=0, rejected=1, rejected_by_too_many_waiting=1,
               rejected_by_wait_timeout=0)
    assert c["h_wait"]["count"] == 1, "h_wait counted %d waits, want 1 (the refused one never " \
        "waited) (%s)" % (c["h_wait"]["count"], brief(c))
    assert waiter.finish() == 0 and holder.finish() == 0


def test_nonblocking_connect_never_waits():
    srv, shim = _setup()
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    code = """
s = socket.socket()
s.setblocking(False)
t0 = time.perf_counter()
rc = s.connect_ex(('127.0.0.1', %d))
dt = time.perf_counter() - t0
s.close()
""" % srv.port
    rc, dt = a.call(code, "[rc, dt]")
    assert rc == errno.ECONNREFUSED, "non-blocking connect to a full compartment gave errno %s, " \
        "want ECONNREFUSED at once" % rc
    assert dt < 0.05, "the non-blocking connect took %.0f ms, want at once" % (dt * 1e3)
    c = expect(shim.comp("db"), in_use=1, waiting=0, rejected=1, rejected_by_full=1)
    assert c["h_wait"]["count"] == 0, "a non-blocking connect waited (h_wait %d)" % c["h_wait"]["count"]
    assert a.finish() == 0


def test_wait_times_out_after_max_wait_ms():
    srv, shim = _setup(max_wait_ms=300)
    a = Agent(shim.env(log="off"))
    a("tcp(%d)" % srv.port)
    res = a.call(TIMED_CONNECT % srv.port, "res")
    waited = res["t1"] - res["t0"]
    assert not res["ok"] and res["errno"] == errno.ECONNREFUSED, \
        "a connect waiting for a permit nobody releases: %r" % res
    assert 0.28 <= waited < 1.0, "refused after %.0f ms, want about max_wait_ms = 300" % (waited * 1e3)
    c = expect(shim.comp("db"), in_use=1, waiting=0, rejected=1, rejected_by_wait_timeout=1,
               rejected_by_full=0)
    assert c["h_wait"]["count"] == 1, "h_wait counted %d waits, want 1" % c["h_wait"]["count"]
    assert 280 <= c["h_wait"]["sum_us"] / 1e3 < 1000, "h_wait recorded %.0f ms, want about 300" % (
        c["h_wait"]["sum_us"] / 1e3)
    assert srv.accepted == 1, "the timed-out connect reached the server"
    assert a.finish() == 0
