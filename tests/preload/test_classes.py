"""test_classes.py - priority classes: a capped class never holds more than its share, the rest stays for others."""

import errno
import os

from harness import Agent, LineProc, Server, helper, status_json, tmpdir
from harness_io import IoShim, expect

TOP = {"classes": {"batch": ["report-*"]}}


def _setup():
    srv = Server()
    shim = IoShim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                    "max_connections": 5, "class_limits": {"batch": 2}}], TOP)
    return srv, shim


def _batch(c):
    for cl in c["cls"]:
        if cl["name"] == "batch":
            return cl
    raise AssertionError("the segment has no class batch: %r" % [cl["name"] for cl in c["cls"]])


def test_batch_capped_at_class_limit_interactive_gets_the_rest():
    srv, shim = _setup()
    batch = Agent(shim.env(log="off", extra={"BULKSHIM_CLASS": "batch"}))
    inter = Agent(shim.env(log="off"))
    port = srv.port

    held = [batch("tcp(%d)" % port) for _ in range(2)]
    third = batch("attempt(('127.0.0.1', %d))" % port)
    assert not third["ok"] and third["errno"] == errno.ECONNREFUSED, \
        "a third batch connection with class_limits = { batch = 2; }: %r" % third
    c = expect(shim.comp("db"), in_use=2, rejected=1, rejected_by_class_full=1)
    b = _batch(c)
    assert (b["limit"], b["in_use"], b["peak"], b["rejected"]) == (2, 2, 2, 1), \
        "class batch: limit %d, in_use %d, peak %d, rejected %d; want 2, 2, 2, 1" % (
            b["limit"], b["in_use"], b["peak"], b["rejected"])

    # The default class gets every permit batch leaves: 3 of 5, then no more.
    mine = [inter("attempt(('127.0.0.1', %d))" % port) for _ in range(4)]
    assert [m["ok"] for m in mine] == [True, True, True, False], \
        "default-class connects next to 2 batch ones in a compartment of 5: %r" % mine
    assert mine[3]["errno"] == errno.ECONNREFUSED
    c = expect(shim.comp("db"), in_use=5, rejected=2, rejected_by_class_full=1, rejected_by_full=1)
    assert _batch(c)["in_use"] == 2
    srv.wait_live(5)

    # Batch gives one back and may take one again; never a third.
    batch.call("close(%d)" % held[0])
    assert _batch(shim.comp("db"))["in_use"] == 1
    again = [batch("attempt(('127.0.0.1', %d))" % port) for _ in range(2)]
    assert [x["ok"] for x in again] == [True, False], "batch after giving one back: %r" % again
    c = expect(shim.comp("db"), in_use=5, rejected_by_class_full=2)
    b = _batch(c)
    assert b["in_use"] == 2 and b["peak"] == 2, "class batch in_use %d peak %d, want 2, 2" % (
        b["in_use"], b["peak"])
    assert batch.finish() == 0 and inter.finish() == 0
    # A normal exit hands its permits back once the process is dead (at
    # the next reclaim, which `bulkshim status` runs), never before.
    status_json(shim.segment)
    c = expect(shim.comp("db"), in_use=0)
    assert _batch(c)["in_use"] == 0, "class permits left after both exited: %d" % _batch(c)["in_use"]


def test_program_name_pattern_gives_class():
    srv, shim = _setup()
    link = os.path.join(tmpdir(), "report-daily")
    os.symlink(helper("fdops"), link)
    report = LineProc([link], shim.env(log="off"))
    got = [report.cmd("tcp 127.0.0.1 %d" % srv.port) for _ in range(3)]
    assert [g.split()[0] for g in got] == ["ok", "ok", "err"] and got[2] == "err %d" % errno.ECONNREFUSED, \
        "report-daily (class batch by the pattern report-*) connecting 3 times: %r" % got
    c = expect(shim.comp("db"), in_use=2, rejected_by_class_full=1)
    assert _batch(c)["in_use"] == 2, "class batch in_use %d, want 2" % _batch(c)["in_use"]

    # The same program under its own name is in the default class.
    plain = LineProc([helper("fdops")], shim.env(log="off"))
    got = [plain.cmd("tcp 127.0.0.1 %d" % srv.port) for _ in range(3)]
    assert all(g.startswith("ok ") for g in got), "fdops (default class) connecting 3 times: %r" % got
    c = expect(shim.comp("db"), in_use=5, rejected_by_class_full=1)
    assert _batch(c)["in_use"] == 2
    assert report.finish() == 0 and plain.finish() == 0
