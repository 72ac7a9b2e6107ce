"""test_drill_faults.py - a drill's faults as a preloaded program meets them: refuse, delay, stall, reset, connect delay.

The drill is written into the segment as `bulkshim drill` writes it
(harness_drill); the program is a real CPython process under the library
with blocking sockets, and its peers are servers of this test that see
for themselves what reached them (accepts, bytes, a reset).
"""

import errno
import socket
import threading
import time

from harness import Agent, Server, wait_until
from harness_drill import CONNECT_DELAY, DELAY, PPM, REFUSE, RESET, STALL, Drill
from harness_io import IoShim, collect

# In an agent: a request on a new blocking connection, its reply timed.
ROUND = """
def round_trip(port, msg=b'ping'):
    s = socket.create_connection(('127.0.0.1', port))
    s.settimeout(None)
    try:
        t0 = time.monotonic()
        s.sendall(msg)
        got = b''
        while len(got) < len(msg):
            d = s.recv(len(msg) - len(got))
            if not d:
                break
            got += d
        return {'dt': time.monotonic() - t0, 'data': got.decode()}
    finally:
        s.close()
"""


def shim_for(port, drills=True, **comp):
    c = {"name": "dep", "destinations": ["127.0.0.1:%d" % port], "max_connections": 8}
    c.update(comp)
    return IoShim([c], top={"drills": drills})


def logged(a, text):
    """Waits (bounded) for a line of the agent's stderr holding text: the
    thread that reads it may not have it yet when the call that logged it
    has returned."""
    wait_until(lambda: text in a.stderr(), 3, 0.02,
               "%r on the agent's stderr (it has %r)" % (text, a.stderr()[-2000:]))


def agent(shim):
    a = Agent(shim.env(log="warn"), timeout=15)
    a.call(ROUND)
    return a


def test_refuse_fails_connects_as_a_service_down_and_gives_the_permit_back():
    srv, other = Server("echo"), Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)	# attaches; the compartment exists
    d = Drill(shim.segment, "dep")
    d.start(REFUSE, 5000)
    before = srv.accepted
    res = a.call("r = attempt(('127.0.0.1', %d))" % srv.port, "r")
    assert not res["ok"] and res["errno"] == errno.ECONNREFUSED, \
        "connect during a refuse drill: %r, want ECONNREFUSED" % res
    assert srv.accepted == before, "the server accepted a connection the drill refused"
    # The permit of the refused connect went back.
    shim.wait_eq("dep", "in_use", 0)
    assert shim.comp("dep")["drill"]["touched"] >= 1
    # A destination the config does not name is not touched.
    assert a.call(expr="round_trip(%d)" % other.port)["data"] == "ping"
    d.stop()
    assert a.call(expr="round_trip(%d)" % srv.port)["data"] == "ping", \
        "after the drill stopped, the connect still fails"
    logged(a, "drill on compartment dep: refuse")
    assert a.finish() == 0


def test_delay_makes_each_reply_later_by_the_delay_and_leaves_other_connections_alone():
    srv, other = Server("echo"), Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    base = a.call(expr="round_trip(%d)" % srv.port)
    assert base["dt"] < 0.3, "baseline round trip %.3f s" % base["dt"]
    d = Drill(shim.segment, "dep")
    d.start(DELAY, 20000, delay_ms=600)
    msg = "x" * 3000
    res = a.call(expr="round_trip(%d, b'%s')" % (srv.port, msg))
    assert res["data"] == msg, "the delayed reply differs from what was sent"
    assert 0.58 <= res["dt"] < 1.5, "reply took %.3f s under a 600 ms delay" % res["dt"]
    # One delay per reply, not one per receive call: several requests on one
    # connection each wait once.
    three = a.call("""
s = socket.create_connection(('127.0.0.1', %d)); s.settimeout(None)
t0 = time.monotonic()
for i in range(3):
    s.sendall(b'abc'); assert s.recv(3) == b'abc'
dt = time.monotonic() - t0; s.close()""" % srv.port, "dt")
    assert 1.75 <= three < 3.0, "3 requests took %.3f s, want about 3 x 600 ms" % three
    res = a.call(expr="round_trip(%d)" % other.port)
    assert res["dt"] < 0.3, "an unmatched connection waited %.3f s during the drill" % res["dt"]
    assert shim.comp("dep")["drill"]["touched"] >= 4
    d.stop()
    res = a.call(expr="round_trip(%d)" % srv.port)
    assert res["dt"] < 0.3, "after the stop a reply still took %.3f s" % res["dt"]
    logged(a, "drill on compartment dep: reply delay 600 ms")
    assert a.finish() == 0


def test_stall_is_released_at_the_deadline():
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    t0 = time.monotonic()
    d.start(STALL, 1500)
    res = a.call(expr="round_trip(%d)" % srv.port)
    waited = time.monotonic() - t0
    assert res["data"] == "ping", "the stalled reply came back changed: %r" % res
    assert 1.4 <= waited < 2.5, "the stall ended %.2f s after the start, deadline 1.5 s" % waited
    assert a.finish() == 0


def test_stop_releases_a_stall_at_once():
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(STALL, 60000)
    a.send(expr="round_trip(%d)" % srv.port)
    time.sleep(0.5)
    t0 = time.monotonic()
    d.stop()
    res = collect(a, timeout=5)
    assert time.monotonic() - t0 < 0.5, "the stall went on %.2f s after the stop" % (
        time.monotonic() - t0)
    assert res["data"] == "ping"
    logged(a, "drill on compartment dep ended")
    assert a.finish() == 0


def test_own_receive_timeout_still_ends_a_stalled_receive():
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(STALL, 20000)
    res = a.call("""
import struct
s = socket.create_connection(('127.0.0.1', %d)); s.settimeout(None)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack('ll', 0, 300000))
s.sendall(b'ping'); t0 = time.monotonic()
try:
    s.recv(4); r = {'ok': True}
except OSError as e:
    r = {'ok': False, 'errno': e.errno}
r['dt'] = time.monotonic() - t0; s.close()""" % srv.port, "r")
    assert not res["ok"] and res["errno"] == errno.EAGAIN, \
        "a receive with SO_RCVTIMEO 300 ms under a stall: %r, want EAGAIN" % res
    assert 0.28 <= res["dt"] < 1.0, "it ended after %.3f s, want about 300 ms" % res["dt"]
    d.stop()
    assert a.finish() == 0


def test_a_signal_during_a_delay_does_not_make_it_longer():
    """Python retries a receive interrupted by a handler (EINTR): the retry
    waits only what was left of the delay."""
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(DELAY, 20000, delay_ms=800)
    res = a.call("""
import signal
hits = []
signal.signal(signal.SIGALRM, lambda *x: hits.append(1))
signal.siginterrupt(signal.SIGALRM, True)
signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
r = round_trip(%d)
signal.setitimer(signal.ITIMER_REAL, 0)
r['hits'] = len(hits)""" % srv.port, "r")
    assert res["hits"] >= 2, "no signal arrived during the delay: %r" % res
    assert res["data"] == "ping"
    assert 0.78 <= res["dt"] < 1.4, "interrupted delay of 800 ms took %.3f s" % res["dt"]
    d.stop()
    assert a.finish() == 0


def test_reset_is_seen_by_both_ends():
    # A peer that records how its connection ended.
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    port = ls.getsockname()[1]
    ended = []

    def serve():
        c, _ = ls.accept()
        try:
            c.sendall(c.recv(4))
            ended.append(("data", c.recv(4)))
        except ConnectionResetError:
            ended.append(("reset", None))
        c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    shim = shim_for(port)
    a = agent(shim)
    assert a.call("""
s = socket.create_connection(('127.0.0.1', %d)); s.settimeout(None)
s.sendall(b'ping')""" % port, "s.recv(4).decode()") == "ping"
    d = Drill(shim.segment, "dep")
    d.start(RESET, 5000)
    res = a.call("""
try:
    s.recv(4); r = {'ok': True}
except OSError as e:
    r = {'ok': False, 'errno': e.errno}""", "r")
    assert not res["ok"] and res["errno"] == errno.ECONNRESET, \
        "a receive on an established connection under a reset drill: %r" % res
    t.join(5)
    ls.close()
    assert ended == [("reset", None)], "the peer saw %r, want a reset" % ended
    assert a.call("s.close()", "1") == 1
    shim.wait_eq("dep", "in_use", 0)
    d.stop()
    assert a.finish() == 0


def test_connect_delay_and_connect_timeout():
    srv = Server("echo")
    shim = shim_for(srv.port, connect_timeout_ms=400)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(CONNECT_DELAY, 20000, connect_delay_ms=250)
    res = a.call("t0 = time.monotonic(); r = attempt(('127.0.0.1', %d)); "
                 "r['dt'] = time.monotonic() - t0" % srv.port, "r")
    assert res["ok"] and 0.24 <= res["dt"] < 0.8, "a 250 ms connect delay: %r" % res
    a.call("os.close(r['fd'])")
    d.stop()
    d.start(CONNECT_DELAY, 20000, connect_delay_ms=3000)
    res = a.call("t0 = time.monotonic(); r = attempt(('127.0.0.1', %d)); "
                 "r['dt'] = time.monotonic() - t0" % srv.port, "r")
    assert not res["ok"] and res["errno"] == errno.ETIMEDOUT and 0.38 <= res["dt"] < 1.2, \
        "a 3 s connect delay with connect_timeout_ms 400: %r, want ETIMEDOUT at 400 ms" % res
    shim.wait_eq("dep", "in_use", 0)
    assert shim.comp("dep")["connect_timeouts"] == 1
    d.stop()
    assert a.finish() == 0


def test_fraction_touches_about_that_share_of_connections():
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(DELAY, 30000, delay_ms=150, fraction_ppm=PPM // 2)
    n = a.call(expr="sum(round_trip(%d)['dt'] >= 0.14 for i in range(40))" % srv.port,
               timeout=30)
    assert 8 <= n <= 32, "%d of 40 connections delayed under fraction 0.5" % n
    d.stop()
    assert a.finish() == 0


def test_non_blocking_sockets_are_spared_and_counted():
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(STALL, 20000)
    # CPython with a timeout makes the socket non-blocking and polls.
    dt = a.call("""
s = socket.create_connection(('127.0.0.1', %d)); s.settimeout(5)
t0 = time.monotonic(); s.sendall(b'ping'); assert s.recv(4) == b'ping'
dt = time.monotonic() - t0; s.close()""" % srv.port, "dt")
    assert dt < 0.5, "a non-blocking socket waited %.2f s under a stall" % dt
    assert shim.comp("dep")["drill"]["spared"] >= 1
    d.stop()
    assert a.finish() == 0


def test_a_drill_not_allowed_by_the_config_does_nothing():
    """Words written into a compartment whose config says no drills (an old
    CLI, a hand-edited segment) are ignored by the library."""
    srv = Server("echo")
    shim = shim_for(srv.port, drills=False)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    assert shim.comp("dep")["drill"]["allowed"] == 0
    d = Drill(shim.segment, "dep")
    d.start(REFUSE | DELAY, 20000, delay_ms=500)
    res = a.call(expr="round_trip(%d)" % srv.port)
    assert res["data"] == "ping" and res["dt"] < 0.3, res
    d.stop()
    assert "drill" not in a.stderr()
    assert a.finish() == 0


def test_a_drill_whose_writer_died_ends_at_its_deadline():
    """No stop comes (the CLI was killed): the deadline in the segment ends
    the drill, and the process logs its end."""
    srv = Server("echo")
    shim = shim_for(srv.port)
    a = agent(shim)
    a.call(expr="round_trip(%d)" % srv.port)
    d = Drill(shim.segment, "dep")
    d.start(DELAY, 700, delay_ms=300)
    assert a.call(expr="round_trip(%d)" % srv.port)["dt"] >= 0.29
    wait_until(lambda: time.monotonic() * 1000 > d.get("deadline_ms") + 50, 3, what="deadline")
    res = a.call(expr="round_trip(%d)" % srv.port)
    assert res["dt"] < 0.25, "a reply after the deadline took %.3f s" % res["dt"]
    logged(a, "drill on compartment dep ended")
    assert a.finish() == 0


def test_a_connection_opened_before_the_drill_is_delayed_from_its_next_request():
    """Its verdict "nothing to do on I/O" was cached before the drill; the
    drill's start makes it stale at once."""
    srv = Server("echo")
    for comp in ({}, {"max_inflight": 4}):
        shim = shim_for(srv.port, **comp)
        a = agent(shim)
        a.call("""
s = socket.create_connection(('127.0.0.1', %d)); s.settimeout(None)
for i in range(3):
    s.sendall(b'abc'); assert s.recv(3) == b'abc'
def one():
    t0 = time.monotonic(); s.sendall(b'abc'); assert s.recv(3) == b'abc'
    return time.monotonic() - t0""" % srv.port)
        assert a.call(expr="one()") < 0.2
        d = Drill(shim.segment, "dep")
        d.start(DELAY, 20000, delay_ms=400)
        a.send(expr="one()")
        if comp:
            # The request is in flight while its reply is held back.
            shim.wait_eq("dep", "inflight", 1)
        dt = collect(a)
        assert 0.39 <= dt < 1.0, "%r: the open connection's request took %.3f s" % (comp, dt)
        d.stop()
        assert a.call(expr="one()") < 0.2
        if comp:
            shim.wait_eq("dep", "inflight", 0)
        assert a.finish() == 0


def test_curl_meets_refuse_and_reset_as_the_errors_it_already_handles():
    """curl (libcurl, non-blocking sockets): a refused connect is its exit 7
    "Failed to connect", a reset its exit 55/56 "Connection reset by peer",
    with the server's own count as the witness; after the drill it works."""
    import shutil
    from harness import run
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    srv = Server("http")
    shim = shim_for(srv.port)
    url = "http://127.0.0.1:%d/" % srv.port
    get = [curl, "-sS", "--max-time", "5", url]
    r = run(get, shim.env(log="warn"))
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr)
    d = Drill(shim.segment, "dep")
    d.start(REFUSE, 20000)
    before = srv.accepted
    r = run(get, shim.env(log="warn"))
    assert r.returncode == 7, "curl under a refuse drill: exit %d (%r)" % (r.returncode, r.stderr)
    assert srv.accepted == before, "the server accepted a refused connection"
    d.stop()
    d.start(RESET, 20000)
    r = run(get, shim.env(log="warn"))
    assert r.returncode in (55, 56) and "reset" in r.stderr.lower(), \
        "curl under a reset drill: exit %d (%r)" % (r.returncode, r.stderr)
    d.stop()
    r = run(get, shim.env(log="warn"))
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr)
    shim.wait_eq("dep", "in_use", 0)
