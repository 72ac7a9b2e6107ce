"""harness_io.py - what the in-flight, waiting, timeout, class and observe tests share.

Built on harness.py (cleanup, temporary files, children, servers): a reader
of the shared segment that decodes every counter of struct seg_comp straight
from /dev/shm (the CLI prints only some of them), configs with any key
(max_inflight, waits, timeouts, classes, enforce), a slow keep-alive HTTP
backend whose replies the test releases, and an address whose connects never
complete.
"""

import json
import mmap
import os
import select
import socket
import struct
import threading

import harness

# ---- the segment's layout, as shim/shim.h declares it (x86_64) ----

# Must match shim.h: SEG_MAGIC, SEG_VERSION, BS_NAME_MAX, PATH_MAX,
# BS_MAX_CLASSES, BS_CLASS_NAME_MAX, REASON_MAX, BS_HIST_BUCKETS, BS_RATE_SECONDS.
SEG_MAGIC = 0x314d48534b4c5542
SEG_VERSION = 10
NAME_MAX = 64
PATH_MAX = 4096
MAX_CLASSES = 8
CLASS_NAME_MAX = 32
HIST_BUCKETS = 32
RATE_SECONDS = 64
# enum bs_reason, in order.
REASONS = ["full", "inflight_full", "wait_timeout", "too_many_waiting", "class_full", "no_slot"]
# Reasons added in layout version 3, counted in arrays at the end of seg_comp.
REASONS_MORE = ["pool_full"]
# Reasons added in layout version 4, in the arrays after those of version 3
# (and in version 7, process_table_full).
REASONS_V4 = ["class_shared_full", "process_table_full"]
MAX_POOLS = 16

_SCALARS = {"Q": 8, "q": 8, "I": 4, "i": 4}


class Layout:
    """A C struct with natural alignment: fields are (name, kind[, count]),
    kind a struct format letter (Q q I i), "s" (a char array of count
    bytes, read as a NUL-terminated string) or another Layout. Padding goes
    where the C compiler puts it on x86_64: each field at a multiple of its
    alignment, the size rounded up to the largest alignment."""

    def __init__(self, name, fields):
        self.name = name
        self.fields = []
        off = 0
        self.align = 1
        for f in fields:
            fname, kind = f[0], f[1]
            count = f[2] if len(f) > 2 else None
            if kind == "s":
                size, align = 1, 1
            elif isinstance(kind, Layout):
                size, align = kind.size, kind.align
            else:
                size = align = _SCALARS[kind]
            off = (off + align - 1) // align * align
            self.fields.append((fname, kind, count, off))
            off += size * (count or 1)
            self.align = max(self.align, align)
        self.size = (off + self.align - 1) // self.align * self.align

    def offset(self, fname):
        for n, _, _, off in self.fields:
            if n == fname:
                return off
        raise KeyError(fname)

    def decode(self, buf, base=0):
        """The struct at buf[base:] as a dict (arrays as lists)."""
        out = {}
        for fname, kind, count, off in self.fields:
            at = base + off
            if kind == "s":
                raw = bytes(buf[at:at + count])
                out[fname] = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif isinstance(kind, Layout):
                items = [kind.decode(buf, at + i * kind.size) for i in range(count or 1)]
                out[fname] = items if count else items[0]
            else:
                n = count or 1
                vals = struct.unpack_from("<%d%s" % (n, kind), buf, at)
                out[fname] = list(vals) if count else vals[0]
        return out


POOL = Layout("seg_pool", [
    ("name", "s", NAME_MAX), ("size", "I"), ("reserved", "I"), ("shared", "I"), ("sleepers", "I"),
    ("lent", "I"), ("lent_tag", "I"), ("peak", "I"), ("in_use_stat", "I"), ("rejected", "Q"),
])

HEADER = Layout("seg_header", [
    ("magic", "Q"), ("version", "I"), ("header_size", "I"), ("total_size", "Q"),
    ("ncomp", "I"), ("nslots", "I"), ("nprocs", "I"), ("bitmap_words", "I"),
    ("off_comp", "Q"), ("off_slots", "Q"), ("off_procs", "Q"), ("off_bitmaps", "Q"),
    ("generation", "I"), ("creator_uid", "I"), ("created_ms", "Q"), ("last_reclaim_ms", "Q"),
    ("name", "s", NAME_MAX), ("config_path", "s", PATH_MAX),
    ("class_name", "s", MAX_CLASSES * CLASS_NAME_MAX), ("nclass", "I"), ("settings_seq", "I"),
    ("npools", "I"), ("pools", POOL, MAX_POOLS),
    ("attaches", "Q"), ("unprotected", "Q"), ("unprotected_ms", "Q"),
    ("unprotected_why", "s", 256), ("config_dev", "Q"), ("config_ino", "Q"),
    ("live_set", "s", 2048),
])

HIST = Layout("seg_hist", [("bucket", "Q", HIST_BUCKETS), ("count", "Q"), ("sum_us", "Q")])

CLASS = Layout("seg_class", [
    ("limit", "I"), ("peak", "I"), ("in_use", "I"), ("in_use_tag", "I"),
    ("admitted", "Q"), ("rejected", "Q"),
])

AD = Layout("seg_adaptive", [
    ("mode", "I"), ("kind", "I"), ("min", "I"), ("max", "I"), ("window_ms", "I"),
    ("tolerance_pct", "I"), ("static_limit", "I"), ("last_reason", "I"),
    ("ctl", "Q"), ("acc", "Q"), ("win_start_us", "Q"), ("sample_us", "Q"), ("sample_conc16", "Q"),
    ("windows", "Q"), ("changes", "Q"), ("last_change_ms", "Q"), ("last_from", "I"),
    ("last_to", "I"), ("algorithm", "I"), ("timeout_ms", "I"), ("backoff_pct", "I"),
    ("min_rtt_interval_ms", "I"), ("min_concurrency", "I"), ("win_min_us", "I"), ("alg", "Q", 4),
])

DRILL = Layout("seg_drill", [
    ("allowed", "I"), ("faults", "I"), ("delay_ms", "I"), ("connect_delay_ms", "I"),
    ("fraction_ppm", "I"), ("by_pid", "i"), ("id", "Q"), ("start_ms", "Q"), ("deadline_ms", "Q"),
    ("start_realtime_ms", "Q"), ("touched", "Q"), ("spared", "Q"),
])

COMP = Layout("seg_comp", [
    ("name", "s", NAME_MAX),
    ("limit", "I"), ("peak", "I"), ("in_use", "I"), ("in_use_tag", "I"),
    ("inflight", "I"), ("inflight_tag", "I"), ("over", "I"), ("over_tag", "I"),
    ("inflight_over", "I"), ("inflight_over_tag", "I"), ("waiting", "I"), ("reject_errno", "i"),
    ("enforce", "I"), ("inflight_limit", "I"), ("inflight_peak", "I"),
    ("max_wait_ms", "I"), ("max_waiting", "I"), ("connect_timeout_ms", "I"),
    ("io_timeout_ms", "I"), ("kernel", "I"),
    ("admitted", "Q"), ("rejected", "Q"), ("last_rejection_ms", "Q"), ("reclaimed", "Q"),
    ("inflight_admitted", "Q"), ("connect_timeouts", "Q"), ("io_timeouts", "Q"),
    ("peak_rate", "Q"),
    ("rejected_by", "Q", len(REASONS)), ("would_reject", "Q", len(REASONS)),
    ("rate", "Q", RATE_SECONDS),
    ("h_connect", HIST), ("h_reply", HIST), ("h_wait", HIST),
    ("cls", CLASS, MAX_CLASSES),
    ("pool", "I"), ("guaranteed", "I"), ("guar_in_use", "I"), ("guar_in_use_tag", "I"),
    ("rejected_by_more", "Q", len(REASONS_MORE)), ("would_reject_more", "Q", len(REASONS_MORE)),
    ("lent_hint", "I"), ("pad2", "I"),
    ("ad", AD),
    ("reconciled", "Q"),
    ("fleet_limit", "I"), ("fleet_floor", "I"), ("fleet_share", "I"), ("fleet_redis_ok", "I"),
    ("fleet_expiry_ms", "Q"), ("fleet_renewed_ms", "Q"), ("fleet_agent_pid", "i"),
    ("fleet_hosts", "I"),
    ("cls_guaranteed", "I", MAX_CLASSES), ("cls_shared", "I"), ("cls_shares", "I"),
    ("cls_lent", "I"), ("cls_lent_tag", "I"),
    ("rejected_by_v4", "Q", len(REASONS_V4)), ("would_reject_v4", "Q", len(REASONS_V4)),
    ("fleet_demand", "I"), ("fleet_churn_c", "I"), ("log_gate", "Q"),
    ("drill", DRILL),
])

SLOT = Layout("seg_slot", [
    ("state", "I"), ("comp", "I"), ("holders", "I"), ("holders_tag", "I"), ("cls", "I"),
    ("op_pid", "i"), ("inode", "Q"), ("mark", "Q"), ("sent_us", "Q"), ("connect_us", "Q"),
    ("admit_us", "Q"),
])

PROC = Layout("seg_proc", [
    ("state", "I"), ("owner", "i"), ("pid", "i"), ("gen", "I"), ("uid", "I"), ("fork_locked", "I"),
    ("start", "Q"), ("since_ms", "Q"),
])


def _align_up(v, a):
    return (v + a - 1) // a * a


class Segment:
    """One snapshot of a segment: header (dict), comps (list of dicts).
    Each compartment dict also carries rejected_by / would_reject as
    {reason: count} and cls[k]["name"]."""

    def __init__(self, header, comps):
        self.header = header
        self.comps = comps

    def comp(self, name):
        for c in self.comps:
            if c["name"] == name:
                return c
        raise AssertionError("segment %s has no compartment %r (it has %r)" % (
            self.header["name"], name, [c["name"] for c in self.comps]))


def segment_ready(segment):
    """True once /dev/shm/bulkshim.SEGMENT exists and its creator has
    finished it: the magic is written last, after ftruncate and the layout,
    so a file that merely exists may still read as zeros."""
    try:
        with open(harness.SHM_PREFIX + segment, "rb") as f:
            raw = f.read(HEADER.size)
    except FileNotFoundError:
        return False
    return len(raw) == HEADER.size and HEADER.decode(raw)["magic"] == SEG_MAGIC


def read_segment(segment):
    """Maps /dev/shm/bulkshim.SEGMENT read-only and decodes its header and
    compartments. Fails the test on a segment that is missing or whose
    layout is not the one this module knows (magic, version, offsets)."""
    path = harness.SHM_PREFIX + segment
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise AssertionError("segment %s does not exist (no process under the shim attached yet?)"
                             % path)
    try:
        size = os.fstat(fd).st_size
        assert size >= HEADER.size, "segment %s is %d bytes, smaller than its header" % (path, size)
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        h = HEADER.decode(m)
        assert h["magic"] == SEG_MAGIC, "segment %s: magic %#x, want %#x" % (path, h["magic"], SEG_MAGIC)
        assert h["version"] == SEG_VERSION, "segment %s: layout version %d, this reader knows %d" % (
            path, h["version"], SEG_VERSION)
        # The layout segment.c computes, from the sizes this module derives:
        # any disagreement means shim.h changed and this reader is stale.
        want = {"header_size": HEADER.size, "off_comp": _align_up(HEADER.size, 64)}
        want["off_slots"] = _align_up(h["off_comp"] + h["ncomp"] * COMP.size, 64)
        want["off_procs"] = _align_up(h["off_slots"] + h["nslots"] * SLOT.size, 64)
        want["off_bitmaps"] = _align_up(h["off_procs"] + h["nprocs"] * PROC.size, 64)
        bad = {k: (h[k], v) for k, v in want.items() if h[k] != v}
        assert not bad, "segment %s: layout differs from shim.h as this reader knows it: %s" % (
            path, ", ".join("%s is %d, want %d" % (k, g, w) for k, (g, w) in bad.items()))
        assert h["total_size"] <= size, "segment %s is truncated" % path
        # class_name is char[8][32]: the generic decoder stopped at the
        # first NUL, so each name is read from its own 32 bytes.
        at = HEADER.offset("class_name")
        names = [bytes(m[at + k * CLASS_NAME_MAX:at + (k + 1) * CLASS_NAME_MAX]).split(b"\0", 1)[0]
                 .decode() for k in range(MAX_CLASSES)]
        h["class_name"] = names
        comps = []
        for i in range(h["ncomp"]):
            c = COMP.decode(m, h["off_comp"] + i * COMP.size)
            c["rejected_by"] = dict(zip(REASONS + REASONS_MORE + REASONS_V4,
                                        c["rejected_by"] + c.pop("rejected_by_more") +
                                        c.pop("rejected_by_v4")))
            c["would_reject"] = dict(zip(REASONS + REASONS_MORE + REASONS_V4,
                                         c["would_reject"] + c.pop("would_reject_more") +
                                         c.pop("would_reject_v4")))
            for k, cl in enumerate(c["cls"]):
                cl["name"] = names[k]
            comps.append(c)
    finally:
        m.close()
    return Segment(h, comps)


# shim.h REQ_SAMPLE: one request in this many of a compartment with
# max_inflight has its reply latency timed, recorded with this weight (all
# of them while its adaptive limit is on).
REQ_SAMPLE = 16


def sampled_replies(n):
    """h_reply's count after the first n requests of a compartment (its
    requests 0, REQ_SAMPLE, 2 REQ_SAMPLE... timed) all got their replies."""
    return REQ_SAMPLE * ((n + REQ_SAMPLE - 1) // REQ_SAMPLE)


def brief(c):
    """The counters of a compartment dict that matter in a failure message."""
    keys = ["limit", "in_use", "peak", "waiting", "enforce", "inflight_limit", "inflight",
            "inflight_peak", "over", "inflight_over", "admitted", "rejected", "inflight_admitted",
            "connect_timeouts", "io_timeouts", "rejected_by", "would_reject"]
    d = {k: c[k] for k in keys}
    for h in ("h_connect", "h_reply", "h_wait"):
        d[h] = {"count": c[h]["count"], "sum_us": c[h]["sum_us"]}
    d["cls"] = [{k: cl[k] for k in ("name", "limit", "in_use", "peak", "admitted", "rejected")}
                for cl in c["cls"] if cl["name"]]
    return json.dumps(d)


# ---- configs with any key ----

def _value(v):
    """A libconfig value for a python one."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return "%d" % v
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[ %s ]" % ", ".join(_value(x) for x in v)
    if isinstance(v, dict):
        return "{ %s }" % " ".join("%s = %s;" % (k, _value(x)) for k, x in v.items())
    raise TypeError("no libconfig form for %r" % (v,))


def config_text(compartments, segment, top=None):
    """libconfig text: top is a dict of top-level settings (enforce,
    classes, ...); each compartment a dict whose keys are written as they
    are (name and destinations first)."""
    lines = ["segment = %s;" % json.dumps(segment)]
    for k, v in (top or {}).items():
        lines.append("%s = %s;" % (k, _value(v)))
    items = []
    for c in compartments:
        keys = ["name", "destinations"] + [k for k in c if k not in ("name", "destinations")]
        items.append("  { " + " ".join("%s = %s;" % (k, _value(c[k])) for k in keys) + " }")
    lines.append("compartments = (\n" + ",\n".join(items) + "\n);")
    return "\n".join(lines) + "\n"


class IoShim:
    """A config naming a fresh segment, and readers of that segment.

    Children run with BULKSHIM_STRICT=1 unless told otherwise, so that a
    config the shim rejects ends them (exit 78) instead of letting them run
    without limits and fail the test for the wrong reason.
    """

    def __init__(self, compartments, top=None):
        self.segment = harness.new_segment()
        self.text = config_text(compartments, self.segment, top)
        self.config = harness.write_file(self.text)

    def env(self, strict="1", **kw):
        return harness.shim_env(self.config, strict=strict, **kw)

    def seg(self):
        return read_segment(self.segment)

    def comp(self, name):
        return self.seg().comp(name)

    def wait(self, name, pred, timeout=2.0, what=None):
        """Polls the segment until pred(compartment) is true; returns the
        compartment. Fails with the last counters seen."""
        seen = [None]

        def ok():
            c = self.comp(name)
            seen[0] = c
            return c if pred(c) else None
        try:
            return harness.wait_until(ok, timeout, 0.005, what or "a condition on %s" % name)
        except AssertionError:
            raise AssertionError("%s: %s did not happen within %.1fs (counters: %s)" % (
                name, what or "the condition", timeout, brief(seen[0]) if seen[0] else None))

    def wait_eq(self, name, key, value, timeout=2.0):
        return self.wait(name, lambda c: c[key] == value, timeout, "%s == %r" % (key, value))


def expect(c, **want):
    """Asserts some counters of a compartment dict (rejected_by_REASON and
    would_reject_REASON name one reason's count)."""
    bad = []
    for k, w in want.items():
        if k.startswith("rejected_by_"):
            g = c["rejected_by"][k[len("rejected_by_"):]]
        elif k.startswith("would_reject_"):
            g = c["would_reject"][k[len("would_reject_"):]]
        else:
            g = c[k]
        if g != w:
            bad.append("%s is %r, want %r" % (k, g, w))
    assert not bad, "compartment %s: %s (counters: %s)" % (c["name"], "; ".join(bad), brief(c))
    return c


# ---- backends ----

class SlowHttp:
    """An HTTP/1.1 keep-alive backend on 127.0.0.1, one thread per
    connection: GET /fast is answered at once, GET /slow when the test calls
    release() (or after 10 s, so that nothing hangs). Counts the requests it
    read, so a test knows what reached it."""

    REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n"

    def __init__(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.1)
        self.port = self.lsock.getsockname()[1]
        self.cond = threading.Condition()
        self.gate = threading.Event()
        self.requests = []	# paths, in arrival order
        self.stalled = 0	# /slow requests waiting for release()
        self.accepted = 0
        self._conns = []
        self._stop = False
        self._threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self._threads[0].start()
        harness.defer(self.stop)

    def _accept_loop(self):
        while not self._stop:
            try:
                conn, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self.cond:
                self.accepted += 1
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn):
        buf = b""
        while not self._stop:
            while b"\r\n\r\n" not in buf:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            path = head.split(b"\r\n", 1)[0].split(b" ")[1].decode() if b" " in head else "?"
            gate = self.gate
            with self.cond:
                self.requests.append(path)
                if path.startswith("/slow"):
                    self.stalled += 1
                self.cond.notify_all()
            if path.startswith("/slow"):
                gate.wait(10)
                with self.cond:
                    self.stalled -= 1
            try:
                conn.sendall(self.REPLY)
            except OSError:
                return

    def wait_stalled(self, n, timeout=3.0):
        """Waits until exactly n /slow requests wait for release()."""
        with self.cond:
            ok = self.cond.wait_for(lambda: self.stalled == n, timeout)
            assert ok, "backend: %d slow requests stalled, want %d (requests %r)" % (
                self.stalled, n, self.requests)

    def release(self):
        """Answers every /slow request stalled now; later ones stall anew."""
        gate, self.gate = self.gate, threading.Event()
        gate.set()

    def stop(self):
        if self._stop:
            return
        self._stop = True
        self.gate.set()
        self.lsock.close()
        with self.cond:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in self._threads:
            t.join(2)


def unanswered_port():
    """A 127.0.0.1 port whose connects never complete: a listener with
    listen(0) that never accepts, its accept queue filled by connects from
    this process. Linux drops SYNs to a listener whose accept queue is full,
    so a further connect hangs in SYN_SENT. Returns the port; everything is
    closed at test end."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    harness.defer(ls.close)
    addr = ls.getsockname()
    for _ in range(16):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        harness.defer(s.close)
        s.connect_ex(addr)
        _, w, _ = select.select([], [s], [], 0.3)
        if not w:
            return addr[1]
    raise AssertionError("16 connects to a listen(0) socket all completed: cannot make "
                         "an address that never answers here")


def collect(agent, timeout=5):
    """The value of the request sent earlier with agent.send(); raises
    harness.AgentError if it raised in the agent."""
    rep = agent._reply(timeout)
    if not rep["ok"]:
        raise harness.AgentError(rep)
    return rep["value"]
