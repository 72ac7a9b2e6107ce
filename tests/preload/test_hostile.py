"""test_hostile.py - damaged or hand-made shared segments never crash or hang the host program.

Each test lets the shim create a segment for a compartment "web" (limit 2,
a loopback HTTP server), damages it in place, then runs real programs under
the shim: python making three connections, and curl. Each must finish in
time without a crash, and either
  - the shim is inert: one line on stderr naming the segment and what is
    wrong, "running without limits", and all three connections go through;
  - or the shim repaired what it could and said so: a warning naming the
    segment and the value it changed, and the limit of 2 holds exactly.
"""

import fcntl
import json
import os
import random
import re
import subprocess
import termios
import threading
import time

import harness
from harness import Agent, AgentError, Server, Shim, shim_lines, status_json
from harness_cli import Serve
from harness_hard import Segment, crashed, curl, env_for, layout, probe

LIMIT = 2


def _setup():
    """A server, a config and its segment, created by a run of the shim."""
    srv = Server("http")
    shim = Shim([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": LIMIT}])
    got, r = probe(env_for(shim.config), srv.port, 0)
    assert r.returncode == 0 and not shim_lines(r.stderr), \
        "the shim did not start cleanly on a fresh segment: %r" % r.stderr
    assert os.path.exists("/dev/shm/bulkshim." + shim.segment), "no segment was created"
    return srv, shim


def _run_all(srv, shim):
    """python (three connections) and curl under the shim; both must end
    on their own, without a crash. Returns (results, python stderr lines,
    curl result)."""
    env = env_for(shim.config)
    got, r = probe(env, srv.port, LIMIT + 1)
    assert crashed(r) is None, "python under the shim %s (stderr %r)" % (crashed(r), r.stderr)
    assert r.returncode == 0, "python under the shim exited %d: %r" % (r.returncode, r.stderr)
    c = curl(env, srv.port)
    assert crashed(c) is None, "curl under the shim %s (stderr %r)" % (crashed(c), c.stderr)
    return got, shim_lines(r.stderr), c


def _expect_inert(srv, shim, why):
    """The shim refused the segment with one clear line, and limits nothing."""
    got, lines, c = _run_all(srv, shim)
    path = "/dev/shm/bulkshim." + shim.segment
    assert got == ["ok"] * (LIMIT + 1), \
        "an untrusted segment must leave the program unlimited; connects gave %r" % got
    assert len(lines) == 1, "want one line from the shim, got %r" % lines
    line = lines[0]
    assert path in line and re.search(why, line) and "running without limits" in line, \
        "the line should name %s, say %r and 'running without limits': %r" % (path, why, line)
    assert c.returncode == 0 and c.stdout == "ok\n", "curl: exit %d, %r" % (c.returncode, c.stderr)
    assert any(path in l for l in shim_lines(c.stderr)), "curl's stderr has no line: %r" % c.stderr


def _expect_repaired(srv, shim, *said):
    """The shim ran with sane values, said which it changed, and the limit
    of 2 holds."""
    got, lines, c = _run_all(srv, shim)
    path = "/dev/shm/bulkshim." + shim.segment
    assert got == ["ok"] * LIMIT + ["ECONNREFUSED"], \
        "after repair the limit of %d must hold exactly; connects gave %r (stderr %r)" % (
            LIMIT, got, lines)
    for want in said:
        assert any(path in l and re.search(want, l) for l in lines), \
            "no line naming %s and saying %r in %r" % (path, want, lines)
    assert not any("running without limits" in l for l in lines), lines
    assert c.returncode == 0 and c.stdout == "ok\n", "curl: exit %d, %r" % (c.returncode, c.stderr)
    web = [x for x in status_json(shim.segment)["compartments"] if x["name"] == "web"][0]
    assert web["in_use"] == 0 and web["limit"] == LIMIT, "status after the runs: %r" % web


def _damage(shim, fn):
    seg = Segment(shim.segment)
    try:
        fn(seg)
    finally:
        seg.close()


def _resize(shim, size):
    fd = os.open("/dev/shm/bulkshim." + shim.segment, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


# ---- the shim stays out: the layout cannot be trusted ----

def test_wrong_magic_leaves_the_shim_inert():
    srv, shim = _setup()
    _damage(shim, lambda s: s.hset("magic", 0x4141414141414141))
    _expect_inert(srv, shim, "bad magic")


def test_wrong_version_leaves_the_shim_inert():
    srv, shim = _setup()
    _damage(shim, lambda s: s.hset("version", s.hget("version") + 1))
    _expect_inert(srv, shim, "unsupported layout version")


def test_wrong_size_fields_leave_the_shim_inert():
    for field, value, why in (("header_size", 8, "inconsistent layout"),
                              ("total_size", 1 << 40, "inconsistent layout"),
                              ("off_slots", 64, "inconsistent layout"),
                              ("bitmap_words", 0xffffffff, "inconsistent layout"),
                              ("nslots", 0, "counts out of range"),
                              ("ncomp", 0xffffffff, "counts out of range"),
                              ("nprocs", 1 << 20, "counts out of range")):
        srv, shim = _setup()
        _damage(shim, lambda s: s.hset(field, value))
        try:
            _expect_inert(srv, shim, why)
        except AssertionError as e:
            raise AssertionError("%s = %d: %s" % (field, value, e))


def test_counts_rewritten_under_a_running_program_are_not_believed():
    # The header's counts are checked when a program maps the segment;
    # written over later by someone else, they must not move a bounds check
    # past the mapping: the shim keeps the counts it checked. A refused
    # connect scans every slot for dead holders (and a fork copies the
    # process's row), so huge counts would read far beyond the segment.
    srv, shim = _setup()
    a = Agent(env_for(shim.config))
    held = [a("tcp(%d)" % srv.port)]
    seg = Segment(shim.segment)
    was = {f: seg.hget(f) for f in ("nslots", "ncomp", "nprocs", "bitmap_words")}
    try:
        for f in was:
            seg.hset(f, 0xffffffff)
        held.append(a("tcp(%d)" % srv.port))
        try:
            a("tcp(%d)" % srv.port)
            third = "connected"
        except AgentError as e:
            third = e.errno
        child = a("fork()")
        a.call("close(%s)" % ", ".join(str(fd) for fd in held))
    finally:
        for f, v in was.items():
            seg.hset(f, v)
        seg.close()
    assert third == 111, "the limit of %d must hold with the header rewritten: the third " \
        "connect gave %r" % (LIMIT, third)
    assert child > 0, "fork under the rewritten header gave %r" % child
    assert a.finish() == 0, "the program under the shim did not end well: %r" % a.stderr()[-2000:]
    web = [x for x in status_json(shim.segment)["compartments"] if x["name"] == "web"][0]
    assert web["in_use"] == 0, "status after the run: %r" % web


def _running(shim, srv, held=1):
    """An agent under the shim holding `held` connections, and the segment."""
    a = Agent(env_for(shim.config))
    fds = [a("tcp(%d)" % srv.port) for _ in range(held)]
    return a, fds, Segment(shim.segment)


def _third(a, srv, timeout):
    """A connect of the agent: its errno, or "connected"."""
    try:
        fd = a("tcp(%d)" % srv.port, timeout=timeout)
        a.call("close(%d)" % fd)
        return "connected"
    except AgentError as e:
        return e.errno


def _ended_well(a, shim):
    rc = a.finish()
    assert rc == 0, "the program under the shim ended with %r: %r" % (rc, a.stderr()[-2000:])
    web = [x for x in status_json(shim.segment)["compartments"] if x["name"] == "web"][0]
    assert web["in_use"] == 0, "status after the run: %r" % web


def test_max_wait_ms_rewritten_under_a_running_program_does_not_hang_a_connect():
    # max_wait_ms is checked (at most BS_MAX_WAIT_MS) when a program
    # attaches; written to 49 days later, a blocking connect to the full
    # compartment must not wait that long.
    srv, shim = _setup()
    a, held, seg = _running(shim, srv, LIMIT)
    try:
        seg.cset(0, "max_wait_ms", 0xffffffff)
        t0 = time.monotonic()
        third = _third(a, srv, 5)
        took = time.monotonic() - t0
        a.call("close(%s)" % ", ".join(str(fd) for fd in held))
    finally:
        seg.close()
    assert third == 111, "the full compartment should refuse: %r" % third
    assert took < 5, "the refusal took %.1fs" % took
    _ended_well(a, shim)


def test_config_path_rewritten_to_a_fifo_does_not_hang_a_connect():
    # A reload (the generation moved) reads the file the header's
    # config_path names, inside the program's connect: a FIFO nobody
    # writes, or a device, must be refused, not read.
    srv, shim = _setup()
    a, held, seg = _running(shim, srv)
    fifo = os.path.join(os.path.dirname(shim.config), "bs-fifo-%d" % os.getpid())
    os.mkfifo(fifo)
    try:
        seg.fill(0, "seg_header.config_path", 0)
        off, _ = seg.L["seg_header.config_path"]
        seg.m[off:off + len(fifo)] = fifo.encode()
        seg.hset("generation", seg.hget("generation") + 1)
        got = _third(a, srv, 5)
        a.call("close(%d)" % held[0])
    finally:
        seg.close()
        os.unlink(fifo)
    assert got == "connected", "the connect gave %r" % got
    assert any("reload" in l and fifo in l for l in shim_lines(a.stderr())), \
        "no line saying the reload was refused: %r" % a.stderr()[-2000:]
    _ended_well(a, shim)


def test_holders_words_locked_in_a_running_programs_name_do_not_stall_its_fork():
    # A change of a slot's holders is locked for the few instructions it
    # lasts; one locked by a live process is waited for, up to a second.
    # Every slot's word locked in the name of the program's own record
    # must not make its fork wait a second per slot.
    srv, shim = _setup()
    a, held, seg = _running(shim, srv)
    L = seg.L
    try:
        base = seg.hget("off_procs")
        size = L["sizeof.seg_proc"]
        rec = [i for i in range(seg.hget("nprocs"))
               if seg.get(base + i * size + L["seg_proc.pid"][0], 4) == a.pid and
               seg.get(base + i * size + L["seg_proc.state"][0], 4) == L["PROC_LIVE"]]
        assert len(rec) == 1, "no single record of the agent: %r" % rec
        gen = seg.get(base + rec[0] * size + L["seg_proc.gen"][0], 4)
        tag = 1 << 31 | (gen & 0xfff) << 18 | (rec[0] + 1)
        sbase = seg.hget("off_slots")
        for j in range(seg.hget("nslots")):
            if seg.get(sbase + j * L["sizeof.seg_slot"] + L["seg_slot.state"][0], 4) == 0:
                seg.sset(j, "holders", 0)
                seg.sset(j, "holders_tag", tag)
        t0 = time.monotonic()
        child = a("fork()", timeout=20)
        took = time.monotonic() - t0
        a.call("close(%d)" % held[0])
    finally:
        seg.close()
    assert child > 0, "fork gave %r" % child
    assert took < 5, "the fork took %.1fs" % took
    _ended_well(a, shim)


def test_segment_smaller_than_its_header_leaves_the_shim_inert():
    srv, shim = _setup()
    _resize(shim, 100)
    _expect_inert(srv, shim, r"truncated \(smaller than its header\)")


def test_segment_shorter_than_its_layout_leaves_the_shim_inert():
    srv, shim = _setup()
    seg = Segment(shim.segment)
    total = seg.hget("total_size")
    seg.close()
    _resize(shim, total - 4096)
    _expect_inert(srv, shim, "truncated")


def test_unterminated_compartment_name_leaves_the_shim_inert():
    srv, shim = _setup()
    _damage(shim, lambda s: s.fill(s.comp_base(0), "seg_comp.name", ord("A")))
    _expect_inert(srv, shim, "compartment name is not terminated")


def test_impossible_count_while_a_process_looks_alive_leaves_the_shim_inert():
    # A record that claims this very test process (alive, right start time)
    # keeps the counts from being recomputed: an in_use of 4 billion can
    # then only mean damage.
    srv, shim = _setup()
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])

    def fn(s):
        L = layout()
        s.pset(0, "state", L["PROC_LIVE"])
        s.pset(0, "pid", os.getpid())
        s.pset(0, "start", start)
        s.cset(0, "in_use", 0xfffffff0)
    _damage(shim, fn)
    _expect_inert(srv, shim, r"in_use is 4294967280 while processes use the segment")


def test_ownerless_forking_record_and_impossible_count_leave_the_shim_inert():
    # A record half-made by a fork that never finished, with no owner to
    # ask, counts as in use; so the impossible count cannot be reset.
    srv, shim = _setup()

    def fn(s):
        s.pset(3, "state", layout()["PROC_FORKING"])
        s.pset(3, "owner", 0)
        s.cset(0, "waiting", 0xffffffff)
    _damage(shim, fn)
    _expect_inert(srv, shim, r"waiting is 4294967295 while processes use the segment")


# ---- the shim repairs what it can and says so ----

def test_zero_size_segment_is_initialised():
    # By design: a creator that died before sizing it leaves an empty
    # object, and the next process makes it a segment.
    srv, shim = _setup()
    _resize(shim, 0)
    got, lines, c = _run_all(srv, shim)
    assert got == ["ok"] * LIMIT + ["ECONNREFUSED"], "connects gave %r (%r)" % (got, lines)
    assert not any("running without limits" in l for l in lines), lines
    assert c.returncode == 0


def test_limit_zero_is_replaced_by_the_configured_limit():
    srv, shim = _setup()
    _damage(shim, lambda s: s.cset(0, "limit", 0))
    _expect_repaired(srv, shim, r"compartment web: limit out of range .*configured")


def test_no_limit_in_a_leftover_segment_gives_way_to_the_config():
    # 0xffffffff is how the segment says "no limit"; nobody uses the
    # segment, so the configured limit applies again.
    srv, shim = _setup()
    _damage(shim, lambda s: s.cset(0, "limit", 0xffffffff))
    _expect_repaired(srv, shim)


def test_huge_wait_never_hangs_the_caller():
    srv, shim = _setup()

    def fn(s):
        s.cset(0, "max_wait_ms", 0xffffffff)
        s.cset(0, "limit", 0)
    _damage(shim, fn)
    _expect_repaired(srv, shim, r"compartment web: limit out of range .*max_wait_ms 4294967295")


def test_huge_wait_with_a_live_process_is_clamped_and_refuses_fast():
    # The counts cannot be reset under a (seemingly) live process, but a
    # max_wait_ms no config can give is replaced all the same: a full
    # compartment refuses at once instead of blocking connect for 49 days.
    srv, shim = _setup()
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])

    def fn(s):
        s.pset(0, "state", layout()["PROC_LIVE"])
        s.pset(0, "pid", os.getpid())
        s.pset(0, "start", start)
        s.cset(0, "in_use", LIMIT)
        s.cset(0, "max_wait_ms", 0xffffffff)
    _damage(shim, fn)
    t0 = time.monotonic()
    got, r = probe(env_for(shim.config), srv.port, 1, timeout=30)
    dt = time.monotonic() - t0
    lines = shim_lines(r.stderr)
    assert got == ["ECONNREFUSED"] and dt < 5, \
        "a full compartment should refuse at once: %r after %.1fs (%r)" % (got, dt, lines)
    assert any("max_wait_ms out of range" in l and "max_wait_ms 4294967295" in l for l in lines), \
        "no line about the clamped wait: %r" % lines


def test_huge_in_use_with_no_holder_is_reset():
    srv, shim = _setup()
    _damage(shim, lambda s: s.cset(0, "in_use", 0xfffffff0))
    _expect_repaired(srv, shim, r"compartment web: in_use was 4294967280 with no process "
                                r"holding anything; reset to 0")


def test_huge_waiting_inflight_and_class_counts_are_reset():
    srv, shim = _setup()

    def fn(s):
        s.cset(0, "waiting", 0xffffffff)
        s.cset(0, "inflight", 0x80000000)
        s.cset(0, "over", 7)
        s.class_set(0, 0, "in_use", 0xffffffff)
    _damage(shim, fn)
    _expect_repaired(srv, shim, "waiting was 4294967295", "inflight was 2147483648",
                     "over was 7", "class 0 in_use was 4294967295")


def test_garbage_slots_are_freed():
    srv, shim = _setup()

    def fn(s):
        L = layout()
        rnd = random.Random(7)
        for j in range(s.hget("nslots")):
            s.sset(j, "state", L["SLOT_USED"] if j % 3 else rnd.getrandbits(32))
            s.sset(j, "holders", 0xffffffff)
            s.sset(j, "comp", rnd.choice([0, 1, 5000, 0xffffffff]))
            s.sset(j, "cls", rnd.getrandbits(32))
            s.sset(j, "inode", rnd.getrandbits(64))
            s.sset(j, "mark", rnd.getrandbits(64))
            s.sset(j, "op_pid", rnd.getrandbits(31))
    _damage(shim, fn)
    _expect_repaired(srv, shim, r"socket slots were in use with no process holding them; freed")


def test_process_table_of_nonsense_is_cleaned():
    # Random states, pids, owners and start times (pids beyond pid_max, so
    # none is alive), every bitmap row all ones, counts disturbed.
    srv, shim = _setup()

    def fn(s):
        L = layout()
        rnd = random.Random(11)
        for i in range(s.hget("nprocs")):
            s.pset(i, "state", rnd.choice([1, 2, 3, 4, 7, 0xffffffff, rnd.getrandbits(32)]))
            s.pset(i, "pid", rnd.choice([-1, -0x7fffffff, 0x7fffff00 + i, 0x7ffffff0]))
            s.pset(i, "owner", rnd.choice([0x7fffff00 + i, -5]))
            s.pset(i, "start", rnd.getrandbits(64))
            s.pset(i, "uid", rnd.getrandbits(32))
            s.row_fill(i, 0xff)
        s.cset(0, "in_use", 0xffffffff)
    _damage(shim, fn)
    _expect_repaired(srv, shim, r"process records in no known state; freed",
                     r"in_use was \d+ with no process holding anything")


def test_everything_damaged_at_once_is_repaired():
    srv, shim = _setup()

    def fn(s):
        rnd = random.Random(3)
        off, size = s.L["seg_comp.cls"]
        s.m[s.comp_base(0) + s.L["seg_comp.limit"][0]:s.comp_base(0) + off + size] = \
            bytes(rnd.getrandbits(8) for _ in range(off + size - s.L["seg_comp.limit"][0]))
        s.cset(0, "limit", 0)
        for j in range(s.hget("nslots")):
            s.sset(j, "state", 1)
            s.sset(j, "holders", rnd.getrandbits(32))
        for i in range(s.hget("nprocs")):
            s.pset(i, "state", rnd.getrandbits(32) | 8)
            s.row_fill(i, 0xff)
        s.hset("generation", 0xffffffff)
        s.hset("last_reclaim_ms", 0xffffffffffffffff)
    _damage(shim, fn)
    _expect_repaired(srv, shim, "limit out of range", "process records in no known state",
                     "socket slots were in use")


# ---- the CLI keeps the counts it checked ----

COUNTS = ("ncomp", "nslots", "nprocs", "bitmap_words")


def _many(n):
    """A server and a segment of n compartments c00, c01... (limit 2 each),
    created by a run of the shim."""
    srv = Server("http")
    shim = Shim([{"name": "c%02d" % i, "destinations": ["127.0.%d.1:%d" % (i, srv.port)],
                  "max_connections": LIMIT} for i in range(n)])
    got, r = probe(env_for(shim.config), srv.port, 0)
    assert r.returncode == 0 and not shim_lines(r.stderr), \
        "the shim did not start cleanly on a fresh segment: %r" % r.stderr
    return srv, shim


def _pipe_full(rd, pid):
    """True once the pipe read by rd is full and process pid sleeps."""
    buf = bytearray(4)
    fcntl.ioctl(rd, termios.FIONREAD, buf)
    with open("/proc/%d/stat" % pid) as f:
        state = f.read().rpartition(")")[2].split()[0]
    return int.from_bytes(buf, "little") >= fcntl.fcntl(rd, fcntl.F_GETPIPE_SZ) and state == "S"


def test_counts_rewritten_while_the_cli_prints_are_not_believed():
    # `bulkshim status` checks the header's counts when it maps the segment
    # and must loop over what it checked: here its output pipe is full
    # (one page) while it prints the 32 compartments, the counts are
    # rewritten, and it goes on printing.
    srv, shim = _many(32)
    rd, wr = os.pipe()
    fcntl.fcntl(rd, fcntl.F_SETPIPE_SZ, 4096)
    p = subprocess.Popen([harness.CLI, "status", "-s", shim.segment, "--json"], stdout=wr,
                         stderr=subprocess.PIPE, env=harness.clean_env())
    harness.defer(p.kill)
    os.close(wr)
    out = b""
    seg = Segment(shim.segment)
    was = {f: seg.hget(f) for f in COUNTS}
    try:
        harness.wait_until(lambda: _pipe_full(rd, p.pid), 10, 0.01, "status blocked on its pipe")
        for f in COUNTS:
            seg.hset(f, 0xffffffff)
        # A status printing past its compartments would write without end:
        # the first megabyte is enough to show it.
        while True:
            chunk = os.read(rd, 1 << 16)
            if not chunk:
                break
            if len(out) < 1 << 20:
                out += chunk
        code = p.wait(10)
    finally:
        os.close(rd)
        for f, v in was.items():
            seg.hset(f, v)
        seg.close()
    assert code == 0, "bulkshim status exited %d with the header rewritten: %r" % (
        code, p.stderr.read()[-2000:])
    names = [c["name"] for c in json.loads(out)["compartments"]]
    assert names == ["c%02d" % i for i in range(32)], "status printed %r" % names


def test_serve_refuses_counts_rewritten_while_it_runs_and_recovers():
    # `bulkshim serve` maps the segment again for every request: counts
    # rewritten between two requests are checked and refused, the server
    # stays up, and once they are back it answers as before.
    srv, shim = _many(4)
    s = Serve("-s", shim.segment)
    code, _, body = s.get("/status.json")
    assert code == 200, (code, body)
    before = [c["name"] for c in json.loads(body)["compartments"]]
    seg = Segment(shim.segment)
    was = {f: seg.hget(f) for f in COUNTS}
    try:
        for f in COUNTS:
            seg.hset(f, 0xffffffff)
        refused = [s.get(path) for path in ("/status.json", "/metrics")]
    finally:
        for f, v in was.items():
            seg.hset(f, v)
        seg.close()
    for code, _, body in refused:
        assert code == 503 and "counts out of range" in body, (code, body)
    assert s.p.poll() is None, "bulkshim serve died: %r" % s.p.stderr.read()[-2000:]
    code, _, body = s.get("/status.json")
    assert code == 200, (code, body)
    assert [c["name"] for c in json.loads(body)["compartments"]] == before, body
    code, _, text = s.get("/metrics")
    assert code == 200 and text.count("bulkshim_compartment_in_use{") == len(before), text


def test_serve_survives_counts_flipped_while_it_maps_and_answers():
    # The counts a mapping checked are the ones it keeps: a header whose
    # counts flip between right and 0xffffffff every millisecond, while
    # `bulkshim serve` maps the segment for request after request, must
    # get a 200 or a 503 each time and never the count read after the
    # check (the old code crashed within a few flips).
    srv, shim = _many(32)
    s = Serve("-s", shim.segment)
    seg = Segment(shim.segment)
    was = {f: seg.hget(f) for f in COUNTS}
    answers, stop = {200: 0, 503: 0, "other": 0}, threading.Event()

    def client():
        while not stop.is_set() and s.p.poll() is None:
            try:
                code, _, _ = s.get("/metrics" if sum(answers.values()) % 2 else "/status.json")
            except (OSError, AssertionError):
                code = "other"
            answers[code if code in answers else "other"] += 1

    t = threading.Thread(target=client)
    t.start()
    flips, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 2 and s.p.poll() is None:
            for f in COUNTS:
                seg.hset(f, 0xffffffff)
            time.sleep(0.001)
            for f, v in was.items():
                seg.hset(f, v)
            time.sleep(0.001)
            flips += 1
    finally:
        stop.set()
        t.join(10)
        for f, v in was.items():
            seg.hset(f, v)
        seg.close()
    assert s.p.poll() is None, "bulkshim serve died (%s) after %d flips: %r" % (
        s.p.returncode, flips, answers)
    assert answers[200] > 0 and answers["other"] == 0, "answers %r in %d flips" % (answers, flips)
