"""test_verdicts.py - I/O verdicts cached per descriptor: limits set or removed live reach open sockets."""

import errno
import os

from harness import Agent, Server, run, tmpdir
from harness_cli import cli_ok
from harness_io import IoShim, brief, config_text, expect, sampled_replies

# Two connections to the echo server and a send that reports a refusal.
OPEN = r"""
s1 = socket.create_connection(('127.0.0.1', %d))
s2 = socket.create_connection(('127.0.0.1', %d))
def try_send(s, data):
    try:
        s.send(data)
        return 'sent'
    except OSError as e:
        return e.errno
def round_trip(s, data):
    s.send(data)
    got = b''
    while len(got) < len(data):
        got += s.recv(100)
    return got.decode()
"""


def _open(**limits):
    """An agent under the shim with two connections, s1 and s2, to an echo
    server in compartment "echo" with these limits."""
    echo = Server("echo")
    comps = [dict({"name": "echo", "destinations": ["127.0.0.1:%d" % echo.port]}, **limits)]
    shim = IoShim(comps)
    a = Agent(shim.env(log="off"))
    a.call(OPEN % (echo.port, echo.port))
    return comps, shim, a


def _ping(a, sock, n):
    for i in range(n):
        assert a("round_trip(%s, b'ping %d\\n')" % (sock, i)) == "ping %d\n" % i


def test_a_limit_set_live_counts_the_next_request_of_an_open_socket():
    _, shim, a = _open(max_connections=4)
    # No in-flight limit: requests go straight to libc, nothing is counted
    # in flight (and nothing is left in flight).
    _ping(a, "s1", 5)
    _ping(a, "s2", 5)
    expect(shim.comp("echo"), in_use=2, inflight=0, inflight_admitted=0, rejected=0)

    cli_ok("set", "-s", shim.segment, "echo", "max_inflight", "1")
    # The next request of an already open socket is counted...
    assert a("try_send(s1, b'one\\n')") == "sent"
    expect(shim.comp("echo"), in_use=2, inflight=1, inflight_admitted=1)
    # ...and limits the other open socket.
    assert a("try_send(s2, b'two\\n')") == errno.ECONNREFUSED
    c = expect(shim.comp("echo"), inflight=1, rejected_by_inflight_full=1)
    assert a("s1.recv(100).decode()") == "one\n"
    c = shim.wait_eq("echo", "inflight", 0)
    assert c["h_reply"]["count"] == sampled_replies(1), "reply latency recorded %d times, want %d (%s)" % (
        c["h_reply"]["count"], sampled_replies(1), brief(c))
    assert a("round_trip(s2, b'two\\n')") == "two\n"
    expect(shim.comp("echo"), in_use=2, inflight=0, inflight_admitted=2)
    a.call("s1.close(); s2.close()")
    expect(shim.comp("echo"), in_use=0, inflight=0)
    assert a.finish() == 0


def test_a_limit_removed_by_reload_lets_the_request_in_flight_end_and_counts_no_more():
    limited, shim, a = _open(max_connections=4, max_inflight=1)
    assert a("try_send(s1, b'one\\n')") == "sent"
    expect(shim.comp("echo"), inflight=1, inflight_admitted=1)

    path = os.path.join(tmpdir(), "unlimited.cfg")
    unlimited = [dict(limited[0])]
    del unlimited[0]["max_inflight"]
    with open(path, "w") as f:
        f.write(config_text(unlimited, shim.segment))
    cli_ok("reload", "-c", path)
    # The request in flight when the limit went ends normally: nothing is
    # left counted.
    assert a("s1.recv(100).decode()") == "one\n"
    expect(shim.comp("echo"), inflight=0, inflight_admitted=1)
    # From now on nothing is counted in flight, nothing is refused.
    assert a("try_send(s1, b'a\\n')") == "sent"
    assert a("try_send(s2, b'b\\n')") == "sent"
    expect(shim.comp("echo"), inflight=0, inflight_admitted=1, rejected=0)
    assert a("(s1.recv(100) + s2.recv(100)).decode()") == "a\nb\n"

    # Reloaded with the limit again: the open sockets are limited again.
    with open(path, "w") as f:
        f.write(config_text(limited, shim.segment))
    cli_ok("reload", "-c", path)
    assert a("try_send(s1, b'c\\n')") == "sent"
    assert a("try_send(s2, b'd\\n')") == errno.ECONNREFUSED
    expect(shim.comp("echo"), in_use=2, inflight=1, inflight_admitted=2, rejected_by_inflight_full=1)
    assert a("s1.recv(100).decode()") == "c\n"
    shim.wait_eq("echo", "inflight", 0)
    a.call("s1.close(); s2.close()")
    expect(shim.comp("echo"), in_use=0, inflight=0)
    assert a.finish() == 0


def test_sampled_reply_latency_of_an_unlimited_compartment_is_weighted():
    _, shim, a = _open(max_connections=4)
    # One send in 64 of a thread is timed and stands for 64 replies.
    a.call("for i in range(640): round_trip(s1, b'x')")
    c = shim.comp("echo")
    assert c["h_reply"]["count"] in (576, 640, 704), \
        "640 requests, sampled reply latency count %d (%s)" % (c["h_reply"]["count"], brief(c))
    expect(c, in_use=2, inflight=0, rejected=0)
    a.call("s1.close(); s2.close()")
    assert a.finish() == 0


if __name__ == "__main__":
    run(globals())
