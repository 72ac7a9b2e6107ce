"""test_timeouts.py - connect_timeout_ms and io_timeout_ms for binaries that set no timeouts of their own."""

import errno

from harness import Agent, Server
from harness_io import IoShim, brief, collect, expect, unanswered_port

# In an agent: one blocking connect, timed; the socket stays open on success.
CONNECT = """
s = socket.socket()
t0 = time.monotonic()
try:
    s.connect(('127.0.0.1', %d))
    res = {'ok': True}
except OSError as e:
    res = {'ok': False, 'errno': e.errno, 'exc': type(e).__name__}
res['dt'] = time.monotonic() - t0
res['nonblock'] = bool(fcntl.fcntl(s.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK)
"""

# In an agent: a request sent on a connected socket, then a blocking recv, timed.
RECV = """
s = socket.create_connection(('127.0.0.1', %d))
s.settimeout(None)
%s
s.send(b'request')
t0 = time.monotonic()
try:
    data = s.recv(100)
    res = {'ok': True, 'data': data.decode()}
except OSError as e:
    res = {'ok': False, 'errno': e.errno, 'exc': type(e).__name__}
res['dt'] = time.monotonic() - t0
"""

OWN_RCVTIMEO = "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack('ll', 0, %d))"


def _syn_sent_from(port):
    """True if the kernel has a TCP socket from local port `port` still
    trying to connect (state SYN_SENT in /proc/net/tcp)."""
    if port == 0:
        return False
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port and fields[3] == "02":
                return True
    return False


def test_connect_timeout_to_unanswering_address():
    port = unanswered_port()
    shim = IoShim([{"name": "dead", "destinations": ["127.0.0.1:%d" % port],
                    "max_connections": 1, "connect_timeout_ms": 300}])
    a = Agent(shim.env(log="off"))
    a.call("import fcntl")
    a.send(CONNECT % port, "res")
    # While the connect hangs it holds a permit.
    shim.wait_eq("dead", "in_use", 1)
    res = collect(a)
    assert not res["ok"] and res["errno"] == errno.ETIMEDOUT, \
        "a connect that never completes: %r, want ETIMEDOUT (TimeoutError)" % res
    assert 0.25 <= res["dt"] < 2.0, "gave up after %.0f ms, want about connect_timeout_ms = 300" % (
        res["dt"] * 1e3)
    assert not res["nonblock"], "the shim left the program's blocking socket non-blocking"
    # The attempt was aborted, not left to connect later without its permit.
    port_here = a("s.getsockname()[1]")
    assert not _syn_sent_from(port_here), \
        "the timed-out connect from port %d is still under way in the kernel" % port_here
    c = expect(shim.comp("dead"), in_use=0, connect_timeouts=1, admitted=1, rejected=0)
    assert c["h_connect"]["count"] == 1, "h_connect counted %d, want 1 (%s)" % (
        c["h_connect"]["count"], brief(c))
    # The permit is back: with max_connections = 1 a second attempt would be
    # refused at once if the first had kept it.
    res = a.call("s.close()\n" + CONNECT % port, "res")
    assert res["errno"] == errno.ETIMEDOUT and res["dt"] >= 0.25, "second attempt: %r" % res
    expect(shim.comp("dead"), in_use=0, connect_timeouts=2, admitted=2, rejected=0)
    assert a.finish() == 0


def test_io_timeout_on_silent_backend():
    srv = Server("hold")
    shim = IoShim([{"name": "slow", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 2, "max_inflight": 2, "io_timeout_ms": 300}])
    a = Agent(shim.env(log="off"))
    a.send(RECV % (srv.port, ""), "res")
    shim.wait_eq("slow", "inflight", 1)
    res = collect(a)
    assert not res["ok"] and res["errno"] == errno.ETIMEDOUT and res["exc"] == "TimeoutError", \
        "a recv the backend never answers: %r, want TimeoutError / ETIMEDOUT" % res
    assert 0.25 <= res["dt"] < 2.0, "the recv gave up after %.0f ms, want about io_timeout_ms = 300" % (
        res["dt"] * 1e3)
    c = expect(shim.comp("slow"), io_timeouts=1, inflight=0, in_use=1, rejected=0)
    # The connection is still usable: the program may send again.
    a.call("s.send(b'again')")
    expect(shim.comp("slow"), inflight=1, inflight_admitted=c["inflight_admitted"] + 1)
    a.call("s.close()")
    expect(shim.comp("slow"), inflight=0, in_use=0)
    assert a.finish() == 0


def test_shorter_own_rcvtimeo_wins():
    srv = Server("hold")
    shim = IoShim([{"name": "slow", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 2, "max_inflight": 2, "io_timeout_ms": 300}])
    a = Agent(shim.env(log="off"))
    a.call("import struct")
    res = a.call(RECV % (srv.port, OWN_RCVTIMEO % 100000), "res")
    assert not res["ok"] and res["errno"] in (errno.EAGAIN, errno.EWOULDBLOCK), \
        "with the program's SO_RCVTIMEO of 100 ms: %r, want EAGAIN from its own timeout" % res
    assert 0.08 <= res["dt"] < 0.25, "the recv gave up after %.0f ms, want about 100 (the " \
        "program's own timeout, shorter than io_timeout_ms = 300)" % (res["dt"] * 1e3)
    expect(shim.comp("slow"), io_timeouts=0)
    a.call("s.close()")
    expect(shim.comp("slow"), inflight=0, in_use=0)
    assert a.finish() == 0


def test_longer_own_rcvtimeo_loses_to_io_timeout():
    srv = Server("hold")
    shim = IoShim([{"name": "slow", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 2, "max_inflight": 2, "io_timeout_ms": 300}])
    a = Agent(shim.env(log="off"))
    a.call("import struct")
    res = a.call(RECV % (srv.port, "s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, "
                         "struct.pack('ll', 2, 0))"), "res")
    assert not res["ok"] and res["errno"] == errno.ETIMEDOUT, \
        "with the program's SO_RCVTIMEO of 2 s: %r, want ETIMEDOUT from io_timeout_ms = 300" % res
    assert 0.25 <= res["dt"] < 2.0, "the recv gave up after %.0f ms, want about 300" % (res["dt"] * 1e3)
    expect(shim.comp("slow"), io_timeouts=1, inflight=0)
    assert a.finish() == 0
