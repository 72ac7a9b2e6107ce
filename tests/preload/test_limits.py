"""test_limits.py - admission and refusal as CPython's socket module sees them."""

import errno
import os
import re
import socket

from harness import Agent, Server, Shim, agent_with_hosts, free_udp_port, shim_lines, unix_path


def test_fourth_connect_refused_fast_others_unaffected():
    slow, other, unmatched = Server(), Server(), Server()
    shim = Shim([{"name": "slow", "destinations": ["127.0.0.1:%d" % slow.port], "max_connections": 3},
                 {"name": "other", "destinations": ["127.0.0.1:%d" % other.port], "max_connections": 2}])
    a = Agent(shim.env())
    held = [a("tcp(%d)" % slow.port) for _ in range(3)]
    slow.wait_live(3)

    tries = [a("attempt(('127.0.0.1', %d))" % slow.port) for _ in range(5)]
    for t in tries:
        assert not t["ok"], "connect #4 to a full compartment succeeded: %r" % t
        assert t["exc"] == "ConnectionRefusedError" and t["errno"] == errno.ECONNREFUSED, \
            "refused with %s errno %s, want ConnectionRefusedError/ECONNREFUSED" % (t["exc"], t["errno"])
    fastest = min(t["dt"] for t in tries)
    assert fastest < 0.001, "refusal took %.3f ms (fastest of 5), want < 1 ms" % (fastest * 1e3)
    u = a("attempt(('127.0.0.1', %d))" % unmatched.port)
    assert u["ok"], "unmatched destination refused: %r" % u
    o = a("attempt(('127.0.0.1', %d))" % other.port)
    assert o["ok"], "another compartment refused while slow was full: %r" % o

    shim.expect("slow", in_use=3, peak=3, admitted=3, rejected=5, limit=3)
    shim.expect("other", in_use=1, peak=1, admitted=1, rejected=0, limit=2)
    assert slow.live == 3 and slow.accepted == 3, \
        "server saw %d live / %d accepted, want 3 / 3" % (slow.live, slow.accepted)

    a.call("close(%d)" % held[0])
    again = a("attempt(('127.0.0.1', %d))" % slow.port)
    assert again["ok"], "connect after a close was refused: %r" % again
    shim.expect("slow", in_use=3, peak=3, admitted=4, rejected=5)

    lines = shim_lines(a.stderr())
    pat = re.compile(r"^bulkshim\[%d\]: slow full \(3/3\): connect to 127\.0\.0\.1:%d refused"
                     % (a.pid, slow.port))
    assert lines and pat.match(lines[0]), "want a rejection line like %r, stderr had %r" % (
        pat.pattern, a.stderr())
    assert len(lines) <= 2, "5 rejections within a second gave %d lines, want them rate-limited: %r" % (
        len(lines), lines)
    assert a.finish() == 0


def test_rejection_uses_configured_errno():
    srv = Server()
    shim = Shim([{"name": "fast", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 1, "errno": "EAGAIN"}])
    a = Agent(shim.env(log="off"))
    first = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert first["ok"], "first connect failed: %r" % first
    second = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not second["ok"] and second["errno"] == errno.EAGAIN, \
        "want EAGAIN from a full compartment with errno = \"EAGAIN\", got %r" % second
    c = shim.expect("fast", in_use=1, rejected=1)
    if "errno" in c:
        assert c["errno"] in ("EAGAIN", errno.EAGAIN), "status shows errno %r, want EAGAIN" % c["errno"]
    assert a.stderr() == "", "BULKSHIM_LOG=off still wrote: %r" % a.stderr()
    assert a.finish() == 0


def test_nonblocking_connect_counts_once():
    srv = Server()
    shim = Shim([{"name": "nb", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    a = Agent(shim.env())
    code = """
s = socket.socket()
s.setblocking(False)
codes = [s.connect_ex(('127.0.0.1', %d))]
deadline = time.monotonic() + 2
while time.monotonic() < deadline:
    select.select([], [s], [], 0.05)
    codes.append(s.connect_ex(('127.0.0.1', %d)))
    if codes[-1] == errno.EISCONN and len(codes) >= 4:
        break
nbfd = s.detach()
""" % (srv.port, srv.port)
    codes = a.call(code, "codes")
    assert codes[0] in (errno.EINPROGRESS, 0), "first non-blocking connect gave %s" % codes[0]
    allowed = {0, errno.EINPROGRESS, errno.EALREADY, errno.EISCONN}
    assert set(codes) <= allowed, \
        "a retried connect on the admitted socket was refused: errnos %r" % codes
    assert codes[-1] == errno.EISCONN, "never reached EISCONN: %r" % codes
    shim.expect("nb", in_use=1, admitted=1, rejected=0)
    srv.wait_live(1)
    other = a("attempt(('127.0.0.1', %d))" % srv.port)
    assert not other["ok"] and other["errno"] == errno.ECONNREFUSED, \
        "a second socket got in beside the non-blocking one: %r" % other
    a.call("close(nbfd)")
    shim.expect("nb", in_use=0)
    assert a("attempt(('127.0.0.1', %d))" % srv.port)["ok"], "permit not back after close"
    assert a.finish() == 0


def test_unix_stream_counted_datagram_never():
    path = unix_path()
    srv = Server(path=path)
    udp, uport = free_udp_port()
    shim = Shim([{"name": "sock", "destinations": ["unix:" + path], "max_connections": 2},
                 {"name": "dgram", "destinations": ["127.0.0.1:%d" % uport], "max_connections": 1}])
    a = Agent(shim.env(log="off"))
    fds = [a("unix(%r)" % path) for _ in range(2)]
    third = a("attempt(%r, socket.AF_UNIX)" % path)
    assert not third["ok"] and third["errno"] == errno.ECONNREFUSED, \
        "third unix connect to a compartment of 2: %r" % third
    srv.wait_live(2)
    shim.expect("sock", in_use=2, admitted=2, rejected=1)
    a.call("close(%d)" % fds[0])
    shim.expect("sock", in_use=1)

    code = """
udps = []
for i in range(3):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.connect(('127.0.0.1', %d))
    u.send(b'x')
    u.sendto(b'y', ('127.0.0.1', %d))
    udps.append(u.detach())
""" % (uport, uport)
    a.call(code)
    shim.expect("dgram", in_use=0, admitted=0, rejected=0)
    udp.settimeout(2)
    got = [udp.recv(16) for _ in range(6)]
    assert sorted(got) == [b"x"] * 3 + [b"y"] * 3, got
    assert a.finish() == 0


def test_hostname_rule_matches_after_getaddrinfo():
    srv = Server()
    shim = Shim([{"name": "byname", "destinations": ["localhost:%d" % srv.port], "max_connections": 1}])
    # 127.0.0.2 is loopback too but is not what localhost resolves to.
    try:
        other = Server(host="127.0.0.2", port=srv.port)
    except OSError:
        other = None
    a = Agent(shim.env(log="off"))
    code = """
ai = socket.getaddrinfo('localhost', %d, socket.AF_INET, socket.SOCK_STREAM)
addr = ai[0][4]
""" % srv.port
    addr = a.call(code, "addr")
    assert addr == ["127.0.0.1", srv.port], "localhost resolved to %r" % addr
    first = a("attempt(tuple(addr))")
    assert first["ok"], "first connect to localhost failed: %r" % first
    second = a("attempt(tuple(addr))")
    assert not second["ok"] and second["errno"] == errno.ECONNREFUSED, \
        "rule localhost:%d did not limit 127.0.0.1:%d: %r" % (srv.port, srv.port, second)
    shim.expect("byname", in_use=1, admitted=1, rejected=1)
    if other is not None:
        for _ in range(2):
            r = a("attempt(('127.0.0.2', %d))" % srv.port)
            assert r["ok"], "127.0.0.2 is not localhost but was refused: %r" % r
        shim.expect("byname", in_use=1, admitted=1, rejected=1)
    assert a.finish() == 0


def test_connect_failing_at_once_gives_permit_back():
    # A bound socket that does not listen yet: connects to it are refused by
    # the kernel, not by the shim.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    port = lsock.getsockname()[1]
    try:
        shim = Shim([{"name": "down", "destinations": ["127.0.0.1:%d" % port], "max_connections": 1}])
        a = Agent(shim.env(log="off"))
        a.call("failed = []")
        for i in range(3):
            # The failed socket stays open: only the failure may give the permit back.
            code = "s = socket.socket(); failed.append(s); e = s.connect_ex(('127.0.0.1', %d))" % port
            assert a.call(code, "e") == errno.ECONNREFUSED
            c = shim.comp("down")
            assert c["in_use"] == 0 and c["rejected"] == 0, \
                "attempt %d: a connect the kernel refused kept its permit: %s" % (i, c)
        assert shim_lines(a.stderr()) == [], "the shim logged kernel refusals: %r" % a.stderr()
        lsock.listen(4)
        r = a("attempt(('127.0.0.1', %d))" % port)
        assert r["ok"], "the permit never came back: %r" % r
        shim.expect("down", in_use=1, rejected=0)
        r = a("attempt(('127.0.0.1', %d))" % port)
        assert not r["ok"], "the rule did not limit the port: %r" % r
        shim.expect("down", in_use=1, rejected=1)
        assert a.finish() == 0
    finally:
        lsock.close()


def test_hostname_rule_follows_a_changed_resolution():
    # The program runs in a mount namespace whose /etc/hosts is a file of
    # this test, so the name can move to another address while it runs.
    srv = Server()
    shim = Shim([{"name": "moving", "destinations": ["bs-moving-host:%d" % srv.port],
                  "max_connections": 1}])
    a, hosts = agent_with_hosts(shim.env(log="off"),
                                "127.0.0.1 localhost\n127.0.0.2 bs-moving-host\n")
    # At load the name means 127.0.0.2: 127.0.0.1 is nobody's.
    before = [a("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(2)]
    assert all(r["ok"] for r in before), "127.0.0.1 limited before the name moved: %r" % before
    with open(hosts, "w") as f:  # same inode, so the bind mount shows it
        f.write("127.0.0.1 localhost\n127.0.0.1 bs-moving-host\n")
    code = "ai = socket.getaddrinfo('bs-moving-host', %d, socket.AF_INET, socket.SOCK_STREAM)" % srv.port
    assert a.call(code, "ai[0][4]") == ["127.0.0.1", srv.port], "the name did not move"
    after = [a("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(2)]
    assert after[0]["ok"], after
    assert not after[1]["ok"] and after[1]["errno"] == errno.ECONNREFUSED, \
        "after the program resolved bs-moving-host to 127.0.0.1 the rule did not follow: %r" % after
    shim.expect("moving", in_use=1, admitted=1, rejected=1)
    assert a.finish() == 0


def test_tcp_fast_open_send_takes_a_permit():
    srv = Server()
    shim = Shim([{"name": "tfo", "destinations": ["127.0.0.1:%d" % srv.port], "max_connections": 1}])
    a = Agent(shim.env(log="off"))
    # sendto and sendmsg with MSG_FASTOPEN connect an unconnected TCP socket.
    for call in ("s.sendto(b'hi', socket.MSG_FASTOPEN, ('127.0.0.1', %d))" % srv.port,
                 "s.sendmsg([b'hi'], [], socket.MSG_FASTOPEN, ('127.0.0.1', %d))" % srv.port):
        code = "s = socket.socket()\ntry:\n    n = %s\nexcept OSError as e:\n    n = -e.errno" % call
        n = a.call(code, "n")
        assert n == 2, "%s: %s" % (call, n)
        a.call("held = s.detach()")
        shim.expect("tfo", in_use=1)
        n = a.call(code, "n")
        assert n == -errno.ECONNREFUSED, "%s on a full compartment gave %r, want -ECONNREFUSED" % (call, n)
        a.call("s.close()")
        shim.expect("tfo", in_use=1, rejected=1 if "sendto" in call else 2)
        a.call("close(held)")
        shim.expect("tfo", in_use=0)
    assert a.finish() == 0
