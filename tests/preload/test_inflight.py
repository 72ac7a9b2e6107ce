"""test_inflight.py - requests in flight (max_inflight) as keep-alive clients and the send/receive families see them."""

import errno
import shutil
import time

from harness import Agent, Server, free_port, run, run_py
from harness_io import IoShim, SlowHttp, brief, expect, sampled_replies

# One persistent http.client connection per thread, in an agent under the shim.
KEEPALIVE = r"""
import http.client, threading
conns = [http.client.HTTPConnection('127.0.0.1', %d) for _ in range(4)]
results = {}

def get(i, path):
    try:
        conns[i].request('GET', path)
        r = conns[i].getresponse()
        results[(i, path)] = [r.status, r.read().decode()]
    except OSError as e:
        results[(i, path)] = [type(e).__name__, e.errno]

def run_threads(items):
    ts = [threading.Thread(target=get, args=it) for it in items]
    for t in ts:
        t.start()
    return ts

def refused_send(i, path):
    t0 = time.perf_counter()
    try:
        conns[i].request('GET', path)
    except OSError as e:
        return [type(e).__name__, e.errno, time.perf_counter() - t0]
    return ['sent', None, time.perf_counter() - t0]
"""


def test_keepalive_idle_pins_no_inflight_fourth_request_refused():
    be = SlowHttp()
    shim = IoShim([{"name": "api", "destinations": ["127.0.0.1:%d" % be.port],
                    "max_connections": 100, "max_inflight": 3}])
    a = Agent(shim.env(log="off"))
    a.call(KEEPALIVE % be.port)

    # Four threads, four keep-alive connections, one quick request each (one
    # thread after the other: four at once could exceed the budget of 3).
    a.call("for i in range(4):\n    for t in run_threads([(i, '/fast')]): t.join(10)")
    got = a("[results.get((i, '/fast')) for i in range(4)]")
    assert got == [[200, "ok\n"]] * 4, "first requests: %r" % got
    assert be.accepted == 4, "backend accepted %d connections, want 4" % be.accepted
    c = expect(shim.comp("api"), in_use=4, inflight=0, inflight_admitted=4)
    # Reply latency is sampled: the first request of the four stands for
    # REQ_SAMPLE replies.
    assert c["h_reply"]["count"] == sampled_replies(4) and c["h_reply"]["sum_us"] > 0, \
        "h_reply counted %d replies, want %d" % (c["h_reply"]["count"], sampled_replies(4))

    # Three slow requests in flight on three of them: the budget is full.
    a.call("slow = run_threads([(i, '/slow') for i in range(3)])")
    be.wait_stalled(3)
    shim.wait_eq("api", "inflight", 3)

    # The fourth, idle connection's request is refused at its send, sends
    # nothing, and the three in flight are untouched.
    exc, err, dt = a("refused_send(3, '/slow')")
    assert (exc, err) == ("ConnectionRefusedError", errno.ECONNREFUSED), \
        "fourth concurrent request: %s errno %s, want ConnectionRefusedError/ECONNREFUSED" % (exc, err)
    assert dt < 0.1, "the refusal took %.1f ms, want it at once (< 100 ms)" % (dt * 1e3)
    time.sleep(0.05)
    assert len(be.requests) == 7 and be.stalled == 3, \
        "the refused request reached the backend: %r" % be.requests
    expect(shim.comp("api"), inflight=3, inflight_peak=3, rejected_by_inflight_full=1, rejected=1,
           in_use=4)

    # Replies arrive: nothing is in flight any more, and a new request passes.
    be.release()
    a.call("for t in slow: t.join(10)")
    got = a("[results.get((i, '/slow')) for i in range(3)]")
    assert got == [[200, "ok\n"]] * 3, "slow requests: %r" % got
    shim.wait_eq("api", "inflight", 0)
    a.call("conns[3].close()\nget(3, '/fast')")
    assert a("results[(3, '/fast')]") == [200, "ok\n"], "request after the replies: %r" % (
        a("results[(3, '/fast')]"),)
    c = expect(shim.comp("api"), inflight=0, inflight_peak=3, inflight_admitted=8,
               rejected_by_inflight_full=1)
    assert c["h_reply"]["count"] == sampled_replies(8), "h_reply counted %d, want %d (%s)" % (
        c["h_reply"]["count"], sampled_replies(8), brief(c))
    assert a.finish() == 0
    expect(shim.comp("api"), in_use=0, inflight=0)


# Each style is a (send, receive) pair run in an agent: Apache's and
# OpenSSL's read/write/writev, curl's send/recv, and the rest of the two
# families. Three rounds each on one socket: after each send the request must
# be in flight, after each reply it must not, and the latency of the sampled
# ones (the first of every REQ_SAMPLE, with that weight) is recorded.
STYLES = {
    "write/read": ("os.write(fd, b'ping %d\\n')", "os.read(fd, 100)"),
    "writev/readv": ("os.writev(fd, [b'ping ', b'%d', b'\\n'])",
                     "(lambda b: b[:os.readv(fd, [b])])(bytearray(100))"),
    "send/recv": ("s.send(b'ping %d\\n')", "s.recv(100)"),
    "sendmsg/recvmsg": ("s.sendmsg([b'ping %d\\n'])", "s.recvmsg(100)[0]"),
    "sendfile/recv_into": ("tf.seek(0)\ntf.write(b'ping %d\\n')\ntf.flush()\nos.sendfile(fd, tf.fileno(), 0, 7)",
                           "(lambda b: b[:s.recv_into(b)])(bytearray(100))"),
}


def test_send_and_receive_families_each_counted_per_request():
    echo = Server("echo")
    shim = IoShim([{"name": "echo", "destinations": ["127.0.0.1:%d" % echo.port],
                    "max_connections": 4, "max_inflight": 4}])
    a = Agent(shim.env(log="off"))
    a.call("import tempfile\ntf = tempfile.TemporaryFile()\n"
           "s = socket.create_connection(('127.0.0.1', %d))\nfd = s.fileno()" % echo.port)
    rounds = 0
    for style, (send, recv) in STYLES.items():
        for i in range(3):
            a.call(send % i)
            c = shim.comp("echo")
            assert c["inflight"] == 1 and c["inflight_admitted"] == rounds + 1, \
                "%s round %d: after the send inflight %d, inflight_admitted %d; want 1, %d (%s)" % (
                    style, i, c["inflight"], c["inflight_admitted"], rounds + 1, brief(c))
            reply = a.call(expr="bytes(%s).decode()" % recv)
            assert reply == "ping %d\n" % i, "%s round %d: reply %r" % (style, i, reply)
            rounds += 1
            c = shim.comp("echo")
            assert c["inflight"] == 0 and c["h_reply"]["count"] == sampled_replies(rounds), \
                "%s round %d: after the reply inflight %d, h_reply count %d; want 0, %d (%s)" % (
                    style, i, c["inflight"], c["h_reply"]["count"], sampled_replies(rounds), brief(c))
    a.call("s.close()")
    expect(shim.comp("echo"), in_use=0, inflight=0, inflight_admitted=3 * len(STYLES), inflight_peak=1,
           rejected=0)
    assert a.finish() == 0


def test_curl_request_counted_once():
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    srv = Server("http")
    shim = IoShim([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 2, "max_inflight": 2}])
    for n in (1, 2):
        r = run([curl, "-sS", "--max-time", "5", "http://127.0.0.1:%d/" % srv.port], shim.env(),
                timeout=15)
        assert r.returncode == 0 and r.stdout == "ok\n", "curl #%d: exit %d, out %r, err %r" % (
            n, r.returncode, r.stdout, r.stderr)
        c = expect(shim.comp("web"), admitted=n, in_use=0, inflight=0, inflight_admitted=n, rejected=0)
        assert c["h_reply"]["count"] == sampled_replies(n), \
            "after %d curl requests h_reply counted %d, want %d (%s)" % (
                n, c["h_reply"]["count"], sampled_replies(n), brief(c))


def test_curl_nonblocking_connect_time_recorded():
    # curl connects without blocking (EINPROGRESS, then poll): the connect
    # histogram must still get its connect time, like a blocking connect's.
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    srv = Server("http")
    shim = IoShim([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 2}])
    a = Agent(shim.env(log="off"))
    a.call("close(tcp(%d))" % srv.port)
    c = shim.comp("web")
    assert c["h_connect"]["count"] == 1, "a blocking connect: h_connect counted %d, want 1 (%s)" % (
        c["h_connect"]["count"], brief(c))
    r = run([curl, "-sS", "--max-time", "5", "http://127.0.0.1:%d/" % srv.port], shim.env(),
            timeout=15)
    assert r.returncode == 0 and r.stdout == "ok\n", "curl: exit %d, out %r, err %r" % (
        r.returncode, r.stdout, r.stderr)
    c = expect(shim.comp("web"), admitted=2, in_use=0)
    assert c["h_connect"]["count"] == 2, \
        "curl's non-blocking connect was not recorded: h_connect count %d after one blocking " \
        "connect and one curl request, want 2" % c["h_connect"]["count"]
    assert a.finish() == 0


# A connect loop under the shim, against a listener of its own (accepted at
# once, so that the backlog never fills).
CONNECT_LOOP = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', port))
l.listen(64)
for i in range(n):
    s = socket.create_connection(('127.0.0.1', port))
    c, _ = l.accept()
    c.close()
    s.close()
"""

CONNECT_EXACT = 16 * 4	# shim.h: every connect is timed up to 64 a second
CONNECT_LOOPS = 2008	# not a multiple of 16: a second of them all is told from exact


def test_busy_compartment_samples_connect_times():
    # Beyond CONNECT_EXACT admissions of a compartment in one second, one
    # connect in 16 is timed and counts for 16 (as replies are), so each
    # second adds its admissions to h_connect exactly up to 64 and rounded
    # down to a multiple of 16 above. The seconds are read back from the
    # compartment's per-second rate ring, so the count is known exactly.
    port = free_port()
    shim = IoShim([{"name": "busy", "destinations": ["127.0.0.1:%d" % port],
                    "max_connections": 4}])
    r = run_py(CONNECT_LOOP, shim.env(log="off"), timeout=120,
               args=(str(port), str(CONNECT_LOOPS)))
    assert r.returncode == 0, "connect loop: exit %d, err %r" % (r.returncode, r.stderr[-2000:])
    c = expect(shim.comp("busy"), admitted=CONNECT_LOOPS, in_use=0, rejected=0)
    per_second = [e & 0xffffffff for e in c["rate"] if e & 0xffffffff]
    assert sum(per_second) == CONNECT_LOOPS, "rate ring %r, want %d admissions" % (
        per_second, CONNECT_LOOPS)
    assert max(per_second) > CONNECT_EXACT, \
        "no second had more than %d connects (%r): nothing was sampled" % (CONNECT_EXACT, per_second)
    want = sum(n if n <= CONNECT_EXACT else n // 16 * 16 for n in per_second)
    assert want < CONNECT_LOOPS, "seconds of %r admissions: sampled or not, all would count" % (
        per_second,)
    h = c["h_connect"]
    assert h["count"] == want and sum(h["bucket"]) == want, \
        "h_connect counted %d (buckets %d) for seconds of %r admissions, want %d" % (
            h["count"], sum(h["bucket"]), per_second, want)
    assert h["sum_us"] > 0, "sampled connects recorded no time: %r" % h


def test_quiet_compartment_times_every_connect():
    # Up to CONNECT_EXACT a second, every connect counts once.
    port = free_port()
    shim = IoShim([{"name": "quiet", "destinations": ["127.0.0.1:%d" % port],
                    "max_connections": 4}])
    r = run_py(CONNECT_LOOP, shim.env(log="off"), timeout=60, args=(str(port), "40"))
    assert r.returncode == 0, "connect loop: exit %d, err %r" % (r.returncode, r.stderr[-2000:])
    c = expect(shim.comp("quiet"), admitted=40, in_use=0)
    assert c["h_connect"]["count"] == 40, "h_connect counted %d of 40 connects (%s)" % (
        c["h_connect"]["count"], brief(c))
