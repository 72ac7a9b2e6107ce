"""test_class_shares.py - classes with guarantees split one destination as pools split destinations, with real programs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from harness import (CLI, Agent, Server, clean_env, new_segment, run, shim_env, shim_lines,
                     status_json, wait_until, write_file)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import pools  # noqa: E402  (its witness: a server counting open connections)
from test_pools import FLOOD, leak_then_connect, run_pools_demo  # noqa: E402


def class_config(segment, port, limit=20, guaranteed="web = 12;", limits="batch = 15;"):
    """One compartment "pg" (one destination) split by classes web and batch."""
    return ('segment = "%s";\nclasses = { web = [ "web-*" ]; batch = [ "nightly" ]; };\n'
            'compartments = ( { name = "pg"; destinations = [ "127.0.0.1:%d" ];\n'
            '  max_connections = %d;\n  class_limits = { %s };\n'
            '  class_guaranteed = { %s }; } );\n' % (segment, port, limit, limits, guaranteed))


def cli(*args, timeout=20):
    return subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


def cls(st, name):
    c = next(c for c in st["compartments"] if c["name"] == "pg")
    return next(k for k in c["classes"] if k["name"] == name)




def test_a_critical_class_keeps_its_guarantee_while_a_batch_class_floods_the_same_destination():
    w = pools.Witness(1)
    seg = new_segment()
    cfg = write_file(class_config(seg, w.ports[0]))
    batch_env = shim_env(cfg, extra={"BULKSHIM_CLASS": "batch"})
    web_env = shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"})
    try:
        # The batch class floods from two processes of four threads each:
        # it may borrow the 8 permits not guaranteed to web, and no more,
        # though its ceiling is 15 and the compartment's limit 20.
        b1, b2 = Agent(batch_env), Agent(batch_env)
        b1.send(code=FLOOD % (30, w.ports[0]), expr="(len(held), refused[0])")
        b2.send(code=FLOOD % (30, w.ports[0]), expr="(len(held), refused[0])")
        got = [b1._reply(60)["value"], b2._reply(60)["value"]]
        held = sum(g[0] for g in got)
        refused = sum(g[1] for g in got)
        assert held == 8 and refused == 240 - 8, "batch held %d, refused %d; want 8 and 232" % (
            held, refused)
        # web opens its 12 at once, in a process of its own, while batch
        # keeps trying.
        b1.send(code=FLOOD % (20, w.ports[0]), expr="(len(held), refused[0])")
        web = Agent(web_env)
        t0 = time.monotonic()
        wfds = [web("attempt(('127.0.0.1', %d))" % w.ports[0]) for _ in range(12)]
        assert all(r["ok"] for r in wfds), "web got %d of its guaranteed 12" % sum(
            r["ok"] for r in wfds)
        assert time.monotonic() - t0 < 10
        more = b1._reply(60)["value"]
        assert more == [0, 80], "batch borrowed beyond the unguaranteed part: %r" % (more,)
        # Beyond its guarantee web must borrow too, and nothing is left.
        extra = web("attempt(('127.0.0.1', %d))" % w.ports[0])
        assert not extra["ok"], extra
        wait_until(lambda: w.sample()[0] == 20, 5, what="the witness to see 20 open")
        st = status_json(seg)
        b, wb = cls(st, "batch"), cls(st, "web")
        assert (wb["in_use"], wb["guaranteed"], wb["ceiling"], wb["borrowed"]) == (12, 12, 20, 0), wb
        assert (b["in_use"], b["guaranteed"], b["ceiling"], b["borrowed"]) == (8, 0, 15, 8), b
        c = next(c for c in st["compartments"] if c["name"] == "pg")
        assert c["rejected_by"]["class_shared_full"] == 232 + 80 + 1, c["rejected_by"]
        assert c["rejected_by"]["full"] == 0 and c["rejected_by"]["class_full"] == 0, c
        # One line a second for the compartment across both batch processes:
        # either may have printed it.
        lines = shim_lines(b1.stderr()) + shim_lines(b2.stderr())
        assert any("class_shared_full" in l and "class batch" in l for l in lines), lines[:3]
        m = cli("metrics", "-s", seg).stdout
        assert re.search(r'bulkshim_class_guaranteed\{segment="%s",compartment="pg",class="web"\} 12'
                         % seg, m), m
        assert re.search(r'bulkshim_class_borrowed\{segment="%s",compartment="pg",class="batch"\} 8'
                         % seg, m), m
        assert re.search(r'bulkshim_rejections_total\{segment="%s",compartment="pg",'
                         r'reason="class_shared_full"\} 313' % seg, m), m
        text = cli("status", "-s", seg).stdout
        assert re.search(r"^pg\s+default\s+0\s+20\s+0\s+0", text, re.M), text
        assert re.search(r"^\s+web\s+12\s+20\s+12\s+0", text, re.M), text
        assert re.search(r"^\s+batch\s+8\s+15\s+0\s+8", text, re.M), text
        watch = cli("watch", "-s", seg, "-i", "0.1", "-n", "1").stdout
        assert "CLASSES SHARING" in watch and re.search(r"batch\s+8\s+15\s+0\s+8", watch), watch
        for a in (b1, b2, web):
            assert a.finish() == 0
        wait_until(lambda: cls(status_json(seg), "batch")["in_use"] == 0, 5, what="drain")
        assert w.worst_total <= 20, w.worst_total
    finally:
        w.close()


def test_a_freed_web_guarantee_goes_to_a_web_borrower_and_batch_may_borrow_it():
    w = pools.Witness(1)
    seg = new_segment()
    cfg = write_file(class_config(seg, w.ports[0], limit=5, guaranteed="web = 3;",
                                  limits="batch = 5;"))
    web = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"}))
    batch = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
    try:
        fds = [web("tcp(%d)" % w.ports[0]) for _ in range(5)]    # 3 guaranteed + 2 borrowed
        assert not batch("attempt(('127.0.0.1', %d))" % w.ports[0])["ok"]
        web.call("close(%d)" % fds[0])                           # a guaranteed one goes
        st = status_json(seg)
        assert cls(st, "web")["borrowed"] == 1, cls(st, "web")
        # The borrower moved onto the guarantee: one shared permit is free.
        r = batch("attempt(('127.0.0.1', %d))" % w.ports[0])
        assert r["ok"], r
        assert not batch("attempt(('127.0.0.1', %d))" % w.ports[0])["ok"]
        for a in (web, batch):
            assert a.finish() == 0
        assert w.worst_total <= 5, w.worst_total
    finally:
        w.close()


def _batch_borrowing_four():
    """pg of 10 with web guaranteed 6; batch (no guarantee) opens 5: the
    unguaranteed 4 are lent to it, the fifth is refused."""
    srv = Server()
    seg = new_segment()
    cfg = write_file(class_config(seg, srv.port, limit=10, guaranteed="web = 6;",
                                  limits="batch = 10;"))
    batch = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
    fds = [batch("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(5)]
    assert [f["ok"] for f in fds] == [True] * 4 + [False]
    return srv, seg, cfg, batch


def test_set_changes_a_class_guarantee_live():
    srv, seg, cfg, batch = _batch_borrowing_four()
    # Raised live: two of batch's borrowed permits move onto its guarantee.
    r = cli("set", "-s", seg, "pg", "guaranteed.batch", "2")
    assert r.returncode == 0 and "guaranteed.batch 0 -> 2" in r.stdout, (r.stdout, r.stderr)
    b = cls(status_json(seg), "batch")
    assert (b["guaranteed"], b["borrowed"]) == (2, 2), b
    # The sum may not pass the compartment's limit, nor a guarantee its ceiling.
    r = cli("set", "-s", seg, "pg", "guaranteed.batch", "5")
    assert r.returncode == 1 and "would sum to 11 > max_connections 10" in r.stderr, r.stderr
    r = cli("set", "-s", seg, "pg", "guaranteed.nosuch", "1")
    assert r.returncode == 1 and "no class" in r.stderr, r.stderr
    # Lowered again: batch's 4 are all lent once more, the whole
    # unguaranteed part, and web still has its 6.
    r = cli("set", "-s", seg, "pg", "guaranteed.batch", "0")
    assert r.returncode == 0, r.stderr
    b = cls(status_json(seg), "batch")
    assert (b["guaranteed"], b["borrowed"]) == (0, 4), b
    assert not batch("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    web = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"}))
    assert all(web("attempt(('127.0.0.1', %d))" % srv.port)["ok"] for _ in range(6))
    assert web.finish() == 0
    assert batch.finish() == 0


def test_curl_of_the_critical_class_gets_through_while_batch_holds_all_it_may():
    curl = shutil.which("curl")
    assert curl, "curl is not installed (tests/deps.sh installs it)"
    web = Server(mode="http")
    seg = new_segment()
    cfg = write_file(class_config(seg, web.port, limit=4, guaranteed="web = 1;",
                                  limits="batch = 4;"))
    batch = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
    fds = [batch("attempt(('127.0.0.1', %d))" % web.port) for _ in range(4)]
    assert [f["ok"] for f in fds] == [True, True, True, False], fds
    url = "http://127.0.0.1:%d/" % web.port
    for _ in range(3):
        r = run([curl, "-sS", "--max-time", "5", url],
                shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"}))
        assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr)
    # curl of the batch class is refused: class_shared_full, connection refused (7).
    r = run([curl, "-sS", "--max-time", "5", url], shim_env(cfg, extra={"BULKSHIM_CLASS": "batch"}))
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert "class_shared_full" in r.stderr, r.stderr
    st = status_json(seg)
    assert cls(st, "web")["admitted"] == 3 and cls(st, "web")["rejected"] == 0, st
    assert batch.finish() == 0


def test_a_full_unguaranteed_part_reconciles_permits_whose_sockets_are_gone():
    """rawclose, of class batch, closes its two borrowed sockets unseen: the unguaranteed
    part stays lent though the compartment is not full. The next batch connect reconciles."""
    w = pools.Witness(1)
    seg = new_segment()
    cfg = write_file(class_config(seg, w.ports[0], limit=4, guaranteed="web = 2;",
                                  limits="batch = 4;"))
    try:
        p = leak_then_connect(w, w.ports[0], w.ports[0],
                              shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
        c = next(c for c in status_json(seg)["compartments"] if c["name"] == "pg")
        assert c["reconciled"] == 2, c
        p.send("quit\n")
        p.finish(10)
    finally:
        w.close()


def test_burst_in_turn_classes_capped_at_23_refuse_classes_sharing_70_do_not():
    """make demo's stranded capacity one level down: the classes of one compartment."""
    res = run_pools_demo("--level", "class")
    assert res["static"]["refused_total"] == 51, res["static"]
    assert res["pool"]["refused_total"] == 0, res["pool"]
    assert res["pool"]["worst_total"] <= 70 and max(res["pool"]["worst"].values()) == 40, res["pool"]


def capped_class_config(segment, port):
    """Compartment "pg" of 10 whose class batch is capped at 2, without class guarantees:
    a batch connect at the cap is refused class_full while the compartment is far from full."""
    return ('segment = "%s";\nclasses = { web = [ "web-*" ]; batch = [ "nightly" ]; };\n'
            'compartments = ( { name = "pg"; destinations = [ "127.0.0.1:%d" ];\n'
            '  max_connections = 10;\n  class_limits = { batch = 2; }; } );\n' % (segment, port))


def test_a_full_class_cap_reconciles_permits_whose_sockets_are_gone():
    """rawclose, of class batch, closes its two sockets unseen: the class stays at its cap of
    2 though nothing is open. The next batch connect reconciles and is admitted."""
    w = pools.Witness(1)
    seg = new_segment()
    cfg = write_file(capped_class_config(seg, w.ports[0]))
    try:
        p = leak_then_connect(w, w.ports[0], w.ports[0],
                              shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
        c = next(c for c in status_json(seg)["compartments"] if c["name"] == "pg")
        assert c["reconciled"] == 2, c
        b = next(k for k in c["classes"] if k["name"] == "batch")
        assert b["rejected"] == 0, b
        p.send("quit\n")
        p.finish(10)
    finally:
        w.close()


def test_a_full_class_cap_takes_back_a_sigkilled_holders_permits():
    """A batch process holding its class's 2 permits is SIGKILLed: the next batch connect,
    in another process, finds the class at its cap, takes the dead holder's permits back and
    is admitted at once (no `status` ran in between to reclaim them)."""
    srv = Server()
    seg = new_segment()
    cfg = write_file(capped_class_config(seg, srv.port))
    env = shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"})
    holder = Agent(env)
    for _ in range(2):
        holder("tcp(%d)" % srv.port)
    other = Agent(env)
    full = other("attempt(('127.0.0.1', %d))" % srv.port)
    assert not full["ok"], "class batch not at its cap with 2 held: %r" % full
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait_exit(5)
    # The reclaim is throttled to once in 100 ms per segment: the refusal
    # above may just have run one.
    time.sleep(0.15)
    got = [other("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(3)]
    assert [g["ok"] for g in got] == [True, True, False], got
    c = next(c for c in status_json(seg)["compartments"] if c["name"] == "pg")
    assert c["reclaimed"] == 2, c
    b = next(k for k in c["classes"] if k["name"] == "batch")
    assert b["in_use"] == 2 and b["rejected"] == 2, b
    assert other.finish() == 0


def test_reload_changes_class_guarantees_as_set_does():
    """A reload that raises a class guarantee moves that class's borrowed
    permits onto it, and one that lowers it lends them again, as `set`
    does. The file lists its classes in another order than the segment
    keeps them, so a guarantee must follow its class's name."""
    srv, seg, cfg, batch = _batch_borrowing_four()

    def reload_with(web, batch_g):
        text = ('segment = "%s";\nclasses = { batch = [ "nightly" ]; web = [ "web-*" ]; };\n'
                'compartments = ( { name = "pg"; destinations = [ "127.0.0.1:%d" ];\n'
                '  max_connections = 10;\n  class_limits = { batch = 10; };\n'
                '  class_guaranteed = { web = %d; batch = %d; }; } );\n'
                % (seg, srv.port, web, batch_g))
        with open(cfg, "w") as f:
            f.write(text)
        r = cli("reload", "-c", cfg)
        assert r.returncode == 0, (r.stdout, r.stderr)

    reload_with(6, 2)
    st = status_json(seg)
    b, w = cls(st, "batch"), cls(st, "web")
    assert (b["guaranteed"], b["borrowed"]) == (2, 2), b
    assert w["guaranteed"] == 6, w
    # The unguaranteed part is now 10 - 8 = 2, both lent to batch: full.
    assert not batch("attempt(('127.0.0.1', %d))" % srv.port)["ok"]
    reload_with(6, 0)
    b = cls(status_json(seg), "batch")
    assert (b["guaranteed"], b["borrowed"]) == (0, 4), b
    # web's 6 are still its own.
    web = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"}))
    assert all(web("attempt(('127.0.0.1', %d))" % srv.port)["ok"] for _ in range(6))
    assert web.finish() == 0
    assert batch.finish() == 0


def test_suggest_proposes_class_guarantees_and_ceilings_from_their_peaks():
    """suggest proposes per class a guarantee from its peak (the peaks
    scaled down together when they would sum past max_connections) and
    the compartment's limit as ceiling for a class refused at its own."""
    srv = Server()
    seg = new_segment()
    cfg = write_file(class_config(seg, srv.port, limit=10, guaranteed="web = 6;",
                                  limits="batch = 4;"))
    web = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "web"}))
    batch = Agent(shim_env(cfg, log="off", extra={"BULKSHIM_CLASS": "batch"}))
    fds = [web("attempt(('127.0.0.1', %d))" % srv.port) for _ in range(10)]
    assert all(f["ok"] for f in fds), fds         # 6 guaranteed + 4 borrowed
    for f in fds:
        web.call("close(%d)" % f["fd"])
    got = [batch("attempt(('127.0.0.1', %d))" % srv.port)["ok"] for _ in range(5)]
    assert got == [True] * 4 + [False], got       # refused at its ceiling of 4
    r = cli("suggest", "--json", "-s", seg)
    assert r.returncode == 0, r.stderr
    comp = next(c for c in json.loads(r.stdout)["compartments"] if c["name"] == "pg")
    by = {k["name"]: k for k in comp["classes"]}
    # Peaks 10 + 4 = 14 > 10: guarantees 10 x 10/14 = 7 and 4 x 10/14 = 2.
    assert (by["web"]["peak"], by["web"]["suggested_guaranteed"]) == (10, 7), by["web"]
    assert (by["batch"]["peak"], by["batch"]["suggested_guaranteed"]) == (4, 2), by["batch"]
    assert by["web"]["suggested_ceiling"] == by["web"]["ceiling"] == 10, by["web"]
    assert (by["batch"]["ceiling"], by["batch"]["suggested_ceiling"]) == (4, 10), by["batch"]
    text = cli("suggest", "-s", seg).stdout
    assert re.search(r"class batch +guaranteed 0, propose 2 \(its peak 4, peaks scaled to the "
                     r"limit\); ceiling 4, propose 10 \(refused at its ceiling\)", text), text
    assert web.finish() == 0 and batch.finish() == 0
