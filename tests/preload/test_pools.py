"""test_pools.py - pools with real programs: guarantees, borrowing up to ceilings, pool_full, live changes."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

from harness import (CLI, Agent, LineProc, Server, clean_env, helper, new_segment, run, run_py,
                     shim_env, shim_lines, status_json, wait_until, write_file)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import pools  # noqa: E402  (the demo's scenario and its witness)


# An agent's code: four threads each try N connects to a port; held and
# refused[0] say what came of them (FLOOD % (N, port)).
FLOOD = """
import threading
held, refused = [], [0]
def flood():
    for _ in range(%d):
        r = attempt(('127.0.0.1', %d))
        if r['ok']:
            held.append(r['fd'])
        else:
            refused[0] += 1
ts = [threading.Thread(target=flood) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
"""


def pool_config(segment, comps, size, reserved=0, extra=""):
    """A config with one pool "db" of size/reserved; comps: (name, port,
    guaranteed, ceiling) or (name, port, None, limit) for one outside it."""
    items = []
    for name, port, guar, ceil in comps:
        pool = '' if guar is None else 'pool = "db"; guaranteed = %d; ' % guar
        items.append('  { name = "%s"; destinations = [ "127.0.0.1:%d" ]; %smax_connections = %d;%s }'
                     % (name, port, pool, ceil, extra))
    return ('segment = "%s";\npools = ( { name = "db"; size = %d; reserved = %d; } );\n'
            'compartments = (\n%s\n);\n' % (segment, size, reserved, ",\n".join(items)))


def comp(st, name):
    return next(c for c in st["compartments"] if c["name"] == name)


def hold(agent, port, n):
    """Opens n connections from agent; returns (fds, refusals, reasons)."""
    fds, refused = [], 0
    for _ in range(n):
        r = agent("attempt(('127.0.0.1', %d))" % port)
        if r["ok"]:
            fds.append(r["fd"])
        else:
            refused += 1
    return fds, refused


def cli(*args, timeout=20):
    return subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


def run_pools_demo(*extra):
    """make demo's stranded capacity, short (pools.py --test and extra): its figures per mode."""
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "pools-%d.json" % os.getpid())
    r = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "pools.py"), "--test",
                        "--build", os.path.join(ROOT, "build"), "--json", out] + list(extra),
                       capture_output=True, text=True, timeout=150)
    try:
        with open(out) as f:
            res = {x["mode"]: x for x in json.load(f)}
    finally:
        if os.path.exists(out):
            os.unlink(out)
    assert r.returncode == 0, "pools.py --test %s failed:\n%s\n%s" % (extra, r.stdout, r.stderr)
    return res


def test_burst_in_turn_static_23_refuses_pool_70_does_not():
    res = run_pools_demo()
    # The figures the closing note quotes, checked here as well.
    assert res["static"]["refused_total"] == 51, res["static"]
    assert res["pool"]["refused_total"] == 0, res["pool"]
    assert res["pool"]["worst_total"] <= 70 and max(res["pool"]["worst"].values()) == 40, res["pool"]
    print("static refused %d, pool refused %d; witness worst total static %d pool %d" % (
        res["static"]["refused_total"], res["pool"]["refused_total"],
        res["static"]["worst_total"], res["pool"]["worst_total"]))


def test_a_slow_dependency_pinned_at_its_ceiling_leaves_the_others_their_guarantees():
    w = pools.Witness(3)
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("slow", w.ports[0], 10, 40), ("b", w.ports[1], 10, 40),
                                       ("c", w.ports[2], 10, 40)], 70))
    env = shim_env(cfg, log="off")
    try:
        # The slow path floods from a process of its own, threads in a fork.
        slow = Agent(env)
        fds, refused = hold(slow, w.ports[0], 45)
        assert len(fds) == 40 and refused == 5, "slow got %d (refused %d), want 40 and 5" % (
            len(fds), refused)
        st = status_json(seg)
        assert comp(st, "slow")["rejected_by"]["full"] == 5, comp(st, "slow")
        # c borrows the rest of the shared part: 10 guaranteed + 10 lent.
        c = Agent(env)
        cfds, crefused = hold(c, w.ports[2], 25)
        assert len(cfds) == 20 and crefused == 5, "c got %d, refused %d, want 20 and 5" % (
            len(cfds), crefused)
        st = status_json(seg)
        assert comp(st, "c")["rejected_by"]["pool_full"] == 5, comp(st, "c")
        # b still has its 10 at once, in another process.
        b = Agent(env)
        t0 = time.monotonic()
        bfds, brefused = hold(b, w.ports[1], 10)
        assert len(bfds) == 10 and brefused == 0, "b got %d of its guaranteed 10" % len(bfds)
        assert time.monotonic() - t0 < 5
        _, more = hold(b, w.ports[1], 1)
        assert more == 1, "b borrowed from an exhausted pool"
        st = status_json(seg)
        p = st["pools"][0]
        assert (p["in_use"], p["borrowed"], p["free"]) == (70, 40, 0), p
        assert comp(st, "slow")["borrowed"] == 30 and comp(st, "b")["borrowed"] == 0
        wait_until(lambda: sum(w.sample()) == 70, 3, what="witness to see 70")
        for a in (slow, b, c):
            assert a.finish() == 0
        wait_until(lambda: status_json(seg)["pools"][0]["in_use"] == 0, 5, what="pool to drain")
        assert w.worst_total <= 70 and max(w.worst) <= 40, (w.worst_total, w.worst)
    finally:
        w.close()


def test_one_damaged_path_cannot_consume_the_capacity_reserved_for_another():
    w = pools.Witness(2)
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("payments", w.ports[0], 30, 50),
                                       ("batch", w.ports[1], 0, 50)], 60, reserved=10))
    env = shim_env(cfg)
    try:
        batch = Agent(env)
        # The damaged path keeps trying to take everything, in a loop.
        got = batch.call(code=FLOOD % (60, w.ports[1]), expr="(len(held), refused[0])")
        assert got == [20, 220], "batch took %r, want 20 held and 220 refused" % (got,)
        payments = Agent(env)
        pfds, prefused = hold(payments, w.ports[0], 30)
        assert len(pfds) == 30 and prefused == 0, "payments got %d of its reserved 30" % len(pfds)
        lines = shim_lines(batch.stderr())
        assert any("pool_full" in l and "pool db" in l for l in lines), lines
        st = status_json(seg)
        assert comp(st, "batch")["rejected_by"]["pool_full"] == 220, comp(st, "batch")
        assert comp(st, "payments")["rejected"] == 0
        assert st["pools"][0]["rejected"] == 220 and st["pools"][0]["reserved"] == 10
        assert w.worst_total <= 50, w.worst_total
        m = cli("metrics", "-s", seg).stdout
        assert re.search(r'bulkshim_rejections_total\{segment="%s",compartment="batch",'
                         r'reason="pool_full"\} 220' % seg, m), m
        assert re.search(r'bulkshim_pool_in_use\{segment="%s",pool="db"\} 50' % seg, m), m
        assert re.search(r'bulkshim_borrowed\{segment="%s",compartment="batch",pool="db"\} 20'
                         % seg, m), m
        watch = cli("watch", "-s", seg, "-i", "0.1", "-n", "1").stdout
        assert re.search(r"^db\s+60\s+10\s+50\s+20\s+0\s+30", watch, re.M), watch
        assert "batch" in watch and "borrowed 20" in watch, watch
        text = cli("status", "-s", seg).stdout
        assert "pool_full 220" in text and re.search(r"^db\s+60", text, re.M), text
        for a in (batch, payments):
            assert a.finish() == 0
    finally:
        w.close()


def test_observe_mode_counts_pool_full_as_would_reject():
    srv = Server()
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("x", srv.port, 1, 5)], 2).replace(
        "max_connections = 5;", "max_connections = 5; enforce = false;"))
    a = Agent(shim_env(cfg, log="off"))
    fds, refused = hold(a, srv.port, 4)
    assert len(fds) == 4 and refused == 0
    c = comp(status_json(seg), "x")
    assert c["would_reject"]["pool_full"] == 2 and c["rejected"] == 0, c
    assert c["in_use"] == 4 and c["over"] == 2, c
    assert a.finish() == 0


def test_a_waiter_wakes_when_another_compartment_frees_the_pool():
    w = pools.Witness(2)
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("a", w.ports[0], 0, 4), ("b", w.ports[1], 0, 4)], 4)
                     .replace("max_connections = 4;", "max_connections = 4; max_wait_ms = 5000;"))
    env = shim_env(cfg, log="off")
    try:
        a, b = Agent(env), Agent(env)
        afds, _ = hold(a, w.ports[0], 4)
        assert len(afds) == 4
        b.send(expr="attempt(('127.0.0.1', %d))" % w.ports[1])
        time.sleep(0.3)
        a.call("close(%d)" % afds[0])
        rep = b._reply(10)
        assert rep["ok"] and rep["value"]["ok"], rep
        assert 0.2 < rep["value"]["dt"] < 2.0, "the waiter took %.2fs" % rep["value"]["dt"]
        for x in (a, b):
            assert x.finish() == 0
    finally:
        w.close()


def test_set_and_reload_change_sizes_and_guarantees_live():
    srv = Server()
    seg = new_segment()
    text = pool_config(seg, [("x", srv.port, 2, 10), ("y", srv.port + 0, None, 3)], 10)
    # y is outside the pool (another port would do; it is never used).
    text = text.replace('"127.0.0.1:%d" ]; max_connections = 3' % srv.port,
                        '"127.0.0.2:%d" ]; max_connections = 3' % srv.port)
    cfg = write_file(text)
    a = Agent(shim_env(cfg, log="off"))
    fds, _ = hold(a, srv.port, 8)
    assert len(fds) == 8
    # Shrinking the pool below what is in use closes nothing and refuses
    # new connects until it drains.
    r = cli("set", "-s", seg, "db", "size", "6")
    assert r.returncode == 0 and "size 10 -> 6" in r.stdout, r.stdout + r.stderr
    _, refused = hold(a, srv.port, 1)
    assert refused == 1 and srv.live == 8, "refused %d, server has %d" % (refused, srv.live)
    assert comp(status_json(seg), "x")["rejected_by"]["pool_full"] == 1
    # 6 in use of 6: 2 on the guarantee, all 4 of the shared part lent.
    a.call("close(%d, %d)" % (fds[0], fds[1]))
    _, refused = hold(a, srv.port, 1)
    assert refused == 1, "admitted with 6 in use of a pool of 6"
    a.call("close(%d)" % fds[2])
    _, refused = hold(a, srv.port, 1)
    assert refused == 0, "still refused after draining to 5 of 6"
    # A guarantee above what the pool leaves is refused, one within it taken.
    r = cli("set", "-s", seg, "x", "guaranteed", "7")
    assert r.returncode == 1 and "guarantees would sum to 7 > 6 - 0" in r.stderr, r.stderr
    r = cli("set", "-s", seg, "x", "guaranteed", "5")
    assert r.returncode == 0, r.stderr
    st = status_json(seg)
    # 6 in use: 4 lent permits moved onto the raised guarantee at once.
    assert comp(st, "x")["guaranteed"] == 5 and st["pools"][0]["lent"] == 1, st
    assert comp(st, "x")["borrowed"] == 1 and st["pools"][0]["shared"] == 1, st
    r = cli("set", "-s", seg, "x", "max_connections", "4")
    assert r.returncode == 1 and "below its guarantee" in r.stderr, r.stderr
    # reload: sizes and guarantees from the file, live.
    with open(cfg, "w") as f:
        f.write(text.replace("size = 10", "size = 20").replace("guaranteed = 2", "guaranteed = 3"))
    r = cli("reload", "-c", cfg)
    assert r.returncode == 0, r.stderr
    st = status_json(seg)
    assert st["pools"][0]["size"] == 20 and comp(st, "x")["guaranteed"] == 3, st
    assert st["pools"][0]["shared"] == 17, st["pools"][0]
    # Moving a compartment out of its pool needs a restart.
    with open(cfg, "w") as f:
        f.write(text.replace('pool = "db"; guaranteed = 2; ', ""))
    r = cli("reload", "-c", cfg)
    assert r.returncode == 1 and "needs a restart" in r.stderr, r.stdout + r.stderr
    assert a.finish() == 0


def test_borrowed_goes_back_to_zero_after_holders_are_killed():
    srv = Server()
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("x", srv.port, 3, 20)], 20))
    env = shim_env(cfg, log="off")
    agents = [Agent(env) for _ in range(3)]
    for a in agents:
        a.call(code="import threading")
        fds, _ = hold(a, srv.port, 4)
        assert len(fds) == 4
    st = status_json(seg)
    assert comp(st, "x")["borrowed"] == 9 and st["pools"][0]["lent"] == 9, st
    for a in agents[:2]:
        os.kill(a.pid, 9)
        a.wait_exit()
    wait_until(lambda: status_json(seg)["pools"][0]["in_use"] == 4, 5, what="reclaim")
    st = status_json(seg)
    # 4 left in use: 3 on the guarantee and 1 lent, whatever order they came in.
    assert comp(st, "x")["borrowed"] == 1 and st["pools"][0]["lent"] == 1, st
    os.kill(agents[2].pid, 9)
    agents[2].wait_exit()
    wait_until(lambda: status_json(seg)["pools"][0]["in_use"] == 0, 5, what="reclaim")
    st = status_json(seg)
    assert st["pools"][0]["lent"] == 0 and st["pools"][0]["borrowed"] == 0, st


def test_the_pool_peak_counts_connections_within_guarantees_and_after_kills():
    # The pool's peak is the most its compartments had in use at once: a
    # pool that has not lent has one too (before, it was noted only when
    # lending, and read 0 here), and a kill and its reclaim do not move it.
    a_srv, b_srv = Server(), Server()
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("a", a_srv.port, 2, 8), ("b", b_srv.port, 2, 8)], 10))
    env = shim_env(cfg, log="off")
    one, two = Agent(env), Agent(env)
    for agent, port in ((one, a_srv.port), (two, b_srv.port)):
        fds, refused = hold(agent, port, 2)
        assert len(fds) == 2 and refused == 0
    st = status_json(seg)
    assert st["pools"][0]["lent"] == 0 and st["pools"][0]["in_use"] == 4, st
    assert st["pools"][0]["peak"] == 4, "peak %d with 4 in use within the guarantees" % (
        st["pools"][0]["peak"])
    os.kill(one.pid, 9)
    one.wait_exit()
    wait_until(lambda: status_json(seg)["pools"][0]["in_use"] == 2, 5, what="reclaim")
    assert status_json(seg)["pools"][0]["peak"] == 4
    # b borrows 4 of the shared 6: 6 in use at once.
    fds, refused = hold(two, b_srv.port, 4)
    assert len(fds) == 4 and refused == 0
    st = status_json(seg)
    assert st["pools"][0]["lent"] == 4 and st["pools"][0]["in_use"] == 6, st
    assert st["pools"][0]["peak"] == 6, st["pools"][0]
    assert two.finish() == 0
    wait_until(lambda: status_json(seg)["pools"][0]["in_use"] == 0, 5, what="the last exit")
    assert status_json(seg)["pools"][0]["peak"] == 6



def test_reset_restarts_each_pool_peak_from_what_is_held_and_zeroes_its_refusals():
    # The pool's peak and pool_full count are statistics like a
    # compartment's: `reset` restarts them too, else status shows the peak
    # and refusals of before the reset. The connections still held when it
    # runs are the new peak, not 0.
    srv = Server()
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("x", srv.port, 1, 6)], 4))
    a = Agent(shim_env(cfg, log="off"))
    fds, refused = hold(a, srv.port, 5)
    assert len(fds) == 4 and refused == 1, "got %d, refused %d, want 4 and 1" % (len(fds), refused)
    p = status_json(seg)["pools"][0]
    assert (p["peak"], p["rejected"]) == (4, 1), p
    a.call("close(%d, %d)" % (fds[0], fds[1]))
    r = cli("reset", "-s", seg)
    assert r.returncode == 0, r.stderr
    p = status_json(seg)["pools"][0]
    assert p["in_use"] == 2 and p["peak"] == 2 and p["rejected"] == 0, p
    assert r.stdout == "%s: reset the counters of 1 compartment and 1 pool\n" % seg, r.stdout
    # The restarted peak rises again from there.
    more, _ = hold(a, srv.port, 1)
    assert len(more) == 1 and status_json(seg)["pools"][0]["peak"] == 3
    assert a.finish() == 0


def test_reset_of_a_pool_name_resets_that_pool_alone():
    db_srv, cache_srv = Server(), Server()
    seg = new_segment()
    cfg = write_file(
        'segment = "%s";\npools = ( { name = "db"; size = 2; reserved = 0; },\n'
        '  { name = "cache"; size = 2; reserved = 0; } );\ncompartments = (\n'
        '  { name = "x"; destinations = [ "127.0.0.1:%d" ]; pool = "db"; guaranteed = 0; '
        'max_connections = 4; },\n'
        '  { name = "y"; destinations = [ "127.0.0.1:%d" ]; pool = "cache"; guaranteed = 0; '
        'max_connections = 4; }\n);\n' % (seg, db_srv.port, cache_srv.port))
    a = Agent(shim_env(cfg, log="off"))
    for port in (db_srv.port, cache_srv.port):
        fds, refused = hold(a, port, 3)
        assert len(fds) == 2 and refused == 1, (port, len(fds), refused)
        a.call("close(%d)" % fds[0])
    r = cli("reset", "-s", seg, "db")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "%s: reset the counters of pool db\n" % seg, r.stdout
    st = status_json(seg)
    db, cache = (next(p for p in st["pools"] if p["name"] == n) for n in ("db", "cache"))
    assert db["in_use"] == 1 and db["peak"] == 1 and db["rejected"] == 0, db
    assert cache["peak"] == 2 and cache["rejected"] == 1, "reset db changed cache: %r" % cache
    # A pool's reset is not its compartments'.
    assert comp(st, "x")["rejected_by"]["pool_full"] == 1, comp(st, "x")
    r = cli("reset", "-s", seg, "nope")
    assert r.returncode == 1 and 'no compartment "nope"' in r.stderr, r.stderr
    assert a.finish() == 0

def test_curl_through_a_pool():
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    slow, web = Server(), Server(mode="http")
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("slow", slow.port, 0, 4), ("web", web.port, 1, 4)], 4))
    env = shim_env(cfg, log="off")
    hog = Agent(env)
    fds, refused = hold(hog, slow.port, 4)
    assert len(fds) == 3 and refused == 1, "slow took %d, want the 3 not guaranteed to web" % len(fds)
    # web's guarantee is there for curl while slow holds all it may.
    for _ in range(3):
        r = run([curl, "-sS", "--max-time", "5", "http://127.0.0.1:%d/" % web.port], env)
        assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr)
    st = status_json(seg)
    assert comp(st, "web")["admitted"] == 3 and comp(st, "web")["rejected"] == 0, st
    assert hog.finish() == 0


def leak_then_connect(w, leak_port, port, env):
    """rawclose leaks two counted sockets to leak_port (closed with the system call
    instruction: no hook sees it), the witness w sees them end, then another process
    connects to port: it must be admitted (reconciled). Returns rawclose's LineProc."""
    p = LineProc([helper("rawclose"), str(leak_port), "2"], env)
    assert p.line(10) == "leaked 2"
    wait_until(lambda: sum(w.sample()) == 0, 2, what="the witness to see the raw closes")
    r = run_py("import socket; s = socket.create_connection(('127.0.0.1', %d)); print('ok')"
               % port, env, timeout=20)
    assert r.stdout.strip() == "ok", "refused after the unseen closes: %r %r" % (r.stdout, r.stderr)
    return p


def test_a_full_pool_reconciles_permits_whose_sockets_another_compartment_lost_unseen():
    """a's two sockets are closed unseen: the pool's shared part stays lent to sockets that
    are gone. A connect to b, another compartment of the pool, finds the pool full,
    reconciles and is admitted."""
    w = pools.Witness(2)
    seg = new_segment()
    cfg = write_file(pool_config(seg, [("a", w.ports[0], 0, 2), ("b", w.ports[1], 0, 2)], 2))
    try:
        p = leak_then_connect(w, w.ports[0], w.ports[1], shim_env(cfg, log="off"))
        st = status_json(seg)
        assert comp(st, "a")["reconciled"] == 2 and comp(st, "a")["in_use"] == 0, comp(st, "a")
        p.send("quit\n")
        p.finish(10)
    finally:
        w.close()
