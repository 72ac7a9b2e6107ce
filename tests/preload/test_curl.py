"""test_curl.py - curl (libcurl, non-blocking connect, both address families) under the shim."""

import shutil
import time

from harness import Agent, Shim, dual_stack, run, shim_lines


def _curl(url, env, *opts):
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    t0 = time.monotonic()
    r = run([curl, "-sS", "--max-time", "5"] + list(opts) + [url], env, timeout=15)
    return r, time.monotonic() - t0


def test_curl_refused_fast_when_full_and_leaks_nothing():
    v4, v6 = dual_stack("http")
    port = v4.port
    dests = ["127.0.0.1:%d" % port] + (["[::1]:%d" % port] if v6 else [])
    shim = Shim([{"name": "web", "destinations": dests, "max_connections": 2}])
    holder = Agent(shim.env(log="off"))
    held = [holder("tcp(%d)" % port) for _ in range(2)]
    v4.wait_live(2)
    url = "http://localhost:%d/" % port

    # Full, held by another process: curl gets "Couldn't connect" at once.
    r, dt = _curl(url, shim.env())
    assert r.returncode == 7, "curl with the compartment full: exit %d, want 7 (stderr %r)" % (
        r.returncode, r.stderr)
    assert "Couldn't connect" in r.stderr or "Failed to connect" in r.stderr, r.stderr
    assert dt < 1.0, "curl took %.2fs to fail, want well under 1 s" % dt
    lines = shim_lines(r.stderr)
    assert any("web full (2/2)" in l for l in lines), "no rejection line in %r" % r.stderr
    c = shim.expect("web", in_use=2)
    assert c["rejected"] == len(dests), "curl's attempts on %d families gave rejected %r" % (
        len(dests), c["rejected"])
    assert v4.accepted == 2 and (v6 is None or v6.accepted == 0), \
        "a connection got through to the server: v4 %d, v6 %s" % (v4.accepted, v6 and v6.accepted)
    if v6:
        r, _ = _curl("http://[::1]:%d/" % port, shim.env(log="off"), "-g")
        assert r.returncode == 7, "curl to [::1] with the compartment full: exit %d" % r.returncode

    # One permit free: curl succeeds, and gives it back when it exits.
    holder.call("close(%d)" % held[0])
    shim.expect("web", in_use=1)
    r, _ = _curl(url, shim.env())
    assert r.returncode == 0 and r.stdout == "ok\n", "curl with room: exit %d, out %r, err %r" % (
        r.returncode, r.stdout, r.stderr)
    shim.expect("web", in_use=1)

    # Everything free: repeated requests on both families leave in_use at 0.
    holder.call("close(%d)" % held[1])
    shim.expect("web", in_use=0)
    urls = [url, "http://127.0.0.1:%d/" % port] + (["http://[::1]:%d/" % port] if v6 else [])
    for u in urls * 2:
        r, _ = _curl(u, shim.env(), "-g")
        assert r.returncode == 0 and r.stdout == "ok\n", "curl %s: exit %d, err %r" % (
            u, r.returncode, r.stderr)
        shim.expect("web", in_use=0)
    c = shim.expect("web", in_use=0)
    assert c["admitted"] == 3 + 2 * len(urls), "admitted %r, want %d" % (c["admitted"], 3 + 2 * len(urls))
    assert c["peak"] == 2
    if v6:
        assert v6.accepted >= 2, "no curl request reached ::1 (%d)" % v6.accepted
    assert holder.finish() == 0
