"""test_isolation.py - the bulkhead: a stalled backend cannot drain a thread-pool server."""

import signal
import socket
import threading
import time

from harness import LineProc, Server, Shim, clean_env, helper, status_json, wait_until

WORKERS = 16
SLOW = 40
FAST = 20
TIMEOUT = 2.0


def _request(port, req, results, i):
    """One client: a request line, a reply line, TIMEOUT seconds in all."""
    t0 = time.monotonic()
    s = None
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.sendall(req)
        data = b""
        while not data.endswith(b"\n"):
            left = TIMEOUT - (time.monotonic() - t0)
            if left <= 0:
                raise socket.timeout()
            s.settimeout(left)
            chunk = s.recv(64)
            if not chunk:
                break
            data += chunk
        results[i] = (data.decode().strip() or "eof", time.monotonic() - t0)
    except socket.timeout:
        results[i] = ("timeout", time.monotonic() - t0)
    except OSError as e:
        results[i] = ("error %s" % e.errno, time.monotonic() - t0)
    finally:
        if s:
            s.close()


def _fire(port, req, n):
    results = [None] * n
    threads = [threading.Thread(target=_request, args=(port, req, results, i), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    return threads, results


def _join(threads, timeout):
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "clients still running after %.1fs" % timeout


def _start_pool(stalled, healthy, env):
    p = LineProc([helper("poolserver"), str(stalled.port), str(healthy.port), str(WORKERS)], env,
                 stdin=False)
    line = p.line(5)
    assert line.startswith("port "), "poolserver said %r" % line
    return p, int(line.split()[1])


def test_without_shim_stalled_backend_drains_the_pool():
    stalled, healthy = Server("hold"), Server("echo")
    pool, port = _start_pool(stalled, healthy, clean_env())
    slow_t, slow_r = _fire(port, b"slow\n", SLOW)
    stalled.wait_live(WORKERS, timeout=3)
    fast_t, fast_r = _fire(port, b"fast\n", FAST)
    _join(fast_t, TIMEOUT + 2)
    ok = [r for r in fast_r if r[0] == "ok"]
    assert not ok, "with every worker parked, %d fast requests still succeeded: the test " \
        "does not reproduce the problem" % len(ok)
    assert stalled.max_live == WORKERS
    pool.kill()
    _join(slow_t, TIMEOUT + 2)


def test_compartment_keeps_pool_free_for_healthy_backend():
    stalled, healthy = Server("hold"), Server("echo")
    shim = Shim([{"name": "stalled", "destinations": ["127.0.0.1:%d" % stalled.port],
                  "max_connections": 4, "errno": "ECONNREFUSED"}])
    pool, port = _start_pool(stalled, healthy, shim.env(log="off"))

    # Watch the segment during the whole run, not only at the end.
    seen = {"max": 0, "polls": 0}
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                st = status_json(shim.segment)
                for c in st["compartments"]:
                    if c["name"] == "stalled":
                        seen["max"] = max(seen["max"], c["in_use"])
                seen["polls"] += 1
            except AssertionError:
                pass  # the segment may not exist before the first connect
            stop.wait(0.02)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        slow_t, slow_r = _fire(port, b"slow\n", SLOW)
        wait_until(lambda: sum(1 for r in slow_r if r and r[0] == "err") >= SLOW - 4, 3,
                   what="%d slow requests answered err" % (SLOW - 4))
        stalled.wait_live(4)
        fast_t, fast_r = _fire(port, b"fast\n", FAST)
        _join(fast_t, TIMEOUT + 2)
        _join(slow_t, TIMEOUT + 2)
    finally:
        stop.set()
        poller.join(5)
    bad = [r for r in fast_r if r[0] != "ok"]
    assert not bad, "%d of %d fast requests failed: %r" % (len(bad), FAST, bad[:5])
    slowest = max(r[1] for r in fast_r)
    assert slowest < 0.5, "the slowest fast request took %.3fs, want < 0.5 s" % slowest
    kinds = sorted(r[0] for r in slow_r)
    assert kinds.count("err") == SLOW - 4 and kinds.count("timeout") == 4, \
        "slow requests: want %d err and 4 parked, got %r" % (SLOW - 4, {k: kinds.count(k) for k in set(kinds)})
    assert seen["polls"] > 0, "status was never read during the run"
    assert seen["max"] <= 4, "status showed %d in use in the stalled compartment" % seen["max"]
    assert stalled.max_live <= 4, "the stalled backend saw %d live connections" % stalled.max_live
    shim.expect("stalled", in_use=4, peak=4, admitted=4, rejected=SLOW - 4)
    pool.kill()
    assert pool.p.wait(5) == -signal.SIGKILL
