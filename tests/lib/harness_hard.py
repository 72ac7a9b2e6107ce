"""harness_hard.py - helpers of the hardening tests: segment layout, hostile segments, other users.

The layout of the shared segment is taken from shim/seg_layout.h itself, the
header that describes it and nothing else: a small C program compiled
against it prints every size and offset these tests write
at, so a change to the header cannot leave the tests writing at stale
offsets. Segments are made by the shim (so their layout is right) and then
damaged in place with mmap.
"""

import hashlib
import json
import mmap
import os
import pwd
import shutil
import struct
import subprocess
import tempfile

import harness
from harness import ROOT, SHM_PREFIX, clean_env, run

# ---- preloading ----


def preload(lib=None):
    """The LD_PRELOAD value for the shim: BULKSHIM_PRELOAD_PREFIX (a sanitizer
    runtime, which must come first) and then the library."""
    prefix = os.environ.get("BULKSHIM_PRELOAD_PREFIX", "").strip()
    lib = lib or harness.LIB
    return (prefix + " " + lib) if prefix else lib


def env_for(config, **kw):
    """harness.shim_env with the preload prefix honoured."""
    return harness.shim_env(config, preload=preload(), **kw)


# ---- the segment layout, from seg_layout.h ----

_LAYOUT_SRC = r'''
#include <stddef.h>
#include <stdio.h>
#include "seg_layout.h"
#define F(S, f) printf("\"%s.%s\": [%zu, %zu],\n", #S, #f, offsetof(struct S, f), sizeof(((struct S *)0)->f))
int main(void) {
	printf("{\n");
	F(seg_header, magic); F(seg_header, version); F(seg_header, header_size);
	F(seg_header, total_size); F(seg_header, ncomp); F(seg_header, nslots);
	F(seg_header, nprocs); F(seg_header, bitmap_words); F(seg_header, off_comp);
	F(seg_header, off_slots); F(seg_header, off_procs); F(seg_header, off_bitmaps);
	F(seg_header, generation); F(seg_header, name); F(seg_header, config_path);
	F(seg_header, class_name); F(seg_header, nclass); F(seg_header, last_reclaim_ms);
	F(seg_header, npools); F(seg_header, pools); F(seg_header, attaches);
	F(seg_header, unprotected); F(seg_header, unprotected_why);
	F(seg_pool, name); F(seg_pool, size); F(seg_pool, lent); F(seg_pool, peak);
	F(seg_comp, name); F(seg_comp, limit); F(seg_comp, in_use); F(seg_comp, peak);
	F(seg_comp, waiting); F(seg_comp, reject_errno); F(seg_comp, enforce);
	F(seg_comp, inflight_limit); F(seg_comp, inflight); F(seg_comp, max_wait_ms);
	F(seg_comp, max_waiting); F(seg_comp, connect_timeout_ms); F(seg_comp, io_timeout_ms);
	F(seg_comp, over); F(seg_comp, inflight_over); F(seg_comp, cls);
	F(seg_class, limit); F(seg_class, in_use);
	F(seg_slot, state); F(seg_slot, holders); F(seg_slot, comp); F(seg_slot, cls);
	F(seg_slot, inode); F(seg_slot, mark); F(seg_slot, op_pid); F(seg_slot, holders_tag);
	F(seg_proc, state); F(seg_proc, pid); F(seg_proc, owner); F(seg_proc, uid);
	F(seg_proc, start); F(seg_proc, since_ms); F(seg_proc, gen);
	printf("\"sizeof.seg_header\": %zu, \"sizeof.seg_comp\": %zu, \"sizeof.seg_class\": %zu,\n",
	    sizeof(struct seg_header), sizeof(struct seg_comp), sizeof(struct seg_class));
	printf("\"sizeof.seg_slot\": %zu, \"sizeof.seg_proc\": %zu, \"sizeof.seg_pool\": %zu,\n",
	    sizeof(struct seg_slot), sizeof(struct seg_proc), sizeof(struct seg_pool));
	printf("\"SEG_MAGIC\": %llu, \"SEG_VERSION\": %d, \"PROC_LIVE\": %d, \"PROC_FORKING\": %d,\n",
	    (unsigned long long)SEG_MAGIC, SEG_VERSION, PROC_LIVE, PROC_FORKING);
	printf("\"SLOT_USED\": %d, \"BS_MAX_LIMIT\": %d, \"BS_MAX_COMPARTMENTS\": %d\n}\n",
	    SLOT_USED, BS_MAX_LIMIT, BS_MAX_COMPARTMENTS);
	return 0;
}
'''

_layout = None


def layout():
    """Offsets and sizes of the segment's fields, as a dict "struct.field" ->
    [offset, size], plus "sizeof.*" and a few constants. Compiled once per
    version of seg_layout.h and kept in /tmp."""
    global _layout
    if _layout is not None:
        return _layout
    header = os.path.join(ROOT, "shim", "seg_layout.h")
    with open(header, "rb") as f:
        tag = hashlib.sha256(f.read() + _LAYOUT_SRC.encode()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), "bulkshim-seglayout-%s.json" % tag)
    if not os.path.exists(cache):
        d = tempfile.mkdtemp(prefix="bulkshim-seglayout-")
        try:
            src = os.path.join(d, "layout.c")
            exe = os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write(_LAYOUT_SRC)
            cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
            pc = subprocess.run(["pkg-config", "--cflags", "libconfig"], capture_output=True,
                                text=True).stdout.split()
            r = subprocess.run([cc, "-std=gnu11", "-D_GNU_SOURCE", "-I", os.path.join(ROOT, "shim")] +
                               pc + ["-o", exe, src], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, "cannot compile the layout probe: %s" % r.stderr[-2000:]
            out = subprocess.run([exe], capture_output=True, text=True, timeout=10).stdout
            tmp = cache + ".%d" % os.getpid()
            with open(tmp, "w") as f:
                f.write(out)
            os.rename(tmp, cache)
        finally:
            shutil.rmtree(d, True)
    with open(cache) as f:
        _layout = json.load(f)
    return _layout


_FMT = {1: "B", 2: "H", 4: "I", 8: "Q"}


class Segment:
    """A mapped /dev/shm/bulkshim.NAME, read and written field by field."""

    def __init__(self, name):
        self.name = name
        self.path = SHM_PREFIX + name
        self.L = layout()
        self.fd = os.open(self.path, os.O_RDWR)
        size = os.fstat(self.fd).st_size
        self.m = mmap.mmap(self.fd, size)

    def close(self):
        self.m.close()
        os.close(self.fd)

    # raw access
    def get(self, off, size):
        return struct.unpack_from("<" + _FMT[size], self.m, off)[0]

    def put(self, off, size, value):
        struct.pack_into("<" + _FMT[size], self.m, off, value & ((1 << (8 * size)) - 1))

    def _field(self, base, key):
        off, size = self.L[key]
        return base + off, size

    # the header
    def hget(self, field):
        return self.get(*self._field(0, "seg_header." + field))

    def hset(self, field, value):
        off, size = self._field(0, "seg_header." + field)
        self.put(off, size, value)

    # compartments, slots, process records, bitmap rows
    def comp_base(self, i):
        return self.hget("off_comp") + i * self.L["sizeof.seg_comp"]

    def cget(self, i, field):
        return self.get(*self._field(self.comp_base(i), "seg_comp." + field))

    def cset(self, i, field, value):
        off, size = self._field(self.comp_base(i), "seg_comp." + field)
        self.put(off, size, value)

    def class_set(self, i, k, field, value):
        base = self.comp_base(i) + self.L["seg_comp.cls"][0] + k * self.L["sizeof.seg_class"]
        off, size = self._field(base, "seg_class." + field)
        self.put(off, size, value)

    def pool_set(self, p, field, value):
        base = self.L["seg_header.pools"][0] + p * self.L["sizeof.seg_pool"]
        off, size = self._field(base, "seg_pool." + field)
        self.put(off, size, value)

    def write_text(self, off, size, text):
        """Writes the bytes text at off, NUL-padded to size bytes."""
        assert len(text) < size, "%r does not fit %d bytes" % (text, size)
        self.m[off:off + size] = text + b"\0" * (size - len(text))

    def comp_name(self, i):
        off, size = self._field(self.comp_base(i), "seg_comp.name")
        return self.m[off:off + size].split(b"\0")[0].decode()

    def sset(self, j, field, value):
        base = self.hget("off_slots") + j * self.L["sizeof.seg_slot"]
        off, size = self._field(base, "seg_slot." + field)
        self.put(off, size, value)

    def pset(self, i, field, value):
        base = self.hget("off_procs") + i * self.L["sizeof.seg_proc"]
        off, size = self._field(base, "seg_proc." + field)
        self.put(off, size, value)

    def row_fill(self, i, byte):
        words = self.hget("bitmap_words")
        off = self.hget("off_bitmaps") + i * words * 8
        self.m[off:off + words * 8] = bytes([byte]) * (words * 8)

    def fill(self, key_base, key, byte):
        off, size = self._field(key_base, key)
        self.m[off:off + size] = bytes([byte]) * size


# ---- other users ----

def nobody():
    """(uid, gid) of the unprivileged user the permission tests run as."""
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def as_nobody(argv, env=None):
    """(argv, env) that run argv as nobody:nogroup without supplementary
    groups. The shim's variables are handed over by env(1) after the user
    change, so that setpriv itself, still root, never runs under the shim."""
    uid, gid = nobody()
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run as another user"
    outer = clean_env()
    inner = ["%s=%s" % (k, v) for k, v in sorted((env or {}).items())
             if k.startswith("BULKSHIM_") or k == "LD_PRELOAD" or k.startswith("ASAN_")]
    return ([setpriv, "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--",
             "/usr/bin/env"] + inner + list(argv), outer)


def is_root():
    return os.geteuid() == 0


def shared_dir():
    """A directory every user can read and enter, for configs other users
    load; removed at test end."""
    d = tempfile.mkdtemp(prefix="bulkshim-%s-pub-" % harness.TAG)
    os.chmod(d, 0o755)
    harness.defer(shutil.rmtree, d, True)
    return d


def readable_by_all(path):
    """True if every directory above path can be entered by anybody and
    path itself read: what a process of another user needs to load it."""
    return harness.readable_by_all(path)


# ---- probes: a real program under the shim ----

PROBE = r'''
import errno, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
held, res = [], []
for _ in range(n):
    s = socket.socket()    # blocking: a shim that made it wait would show
    try:
        s.connect(("127.0.0.1", port))
        held.append(s)
        res.append("ok")
    except OSError as e:
        res.append(errno.errorcode.get(e.errno, str(e.errno)))
        s.close()
print(" ".join(res))
'''


def probe(env, port, n, timeout=15):
    """Runs python under env making n connections to 127.0.0.1:port and
    holding them; returns (results list, CompletedProcess)."""
    path = os.path.join(harness.tmpdir(), "probe.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(PROBE)
        os.chmod(path, 0o644)
    r = run([harness.PY, path, str(port), str(n)], env, timeout=timeout)
    return r.stdout.split(), r


def curl(env, port, timeout=15):
    """curl http://127.0.0.1:port/ under env; CompletedProcess. curl gets the
    library alone, without BULKSHIM_PRELOAD_PREFIX: Debian's curl hangs at
    start-up with GCC's ASan runtime preloaded, shim or no shim."""
    exe = shutil.which("curl")
    assert exe, "curl is not installed (tests/deps.sh installs it)"
    env = dict(env)
    if "LD_PRELOAD" in env:
        env["LD_PRELOAD"] = harness.LIB
    return run([exe, "-sS", "--max-time", "5", "http://127.0.0.1:%d/" % port], env,
               timeout=timeout)


def crashed(r):
    """A description if the process died of a signal, else None."""
    if r.returncode < 0:
        return "killed by signal %d" % -r.returncode
    return None


def c_program(source, name, extra=()):
    """Compiles C source into this test's temporary directory; returns the
    executable's path."""
    d = harness.tmpdir()
    src = os.path.join(d, name + ".c")
    exe = os.path.join(d, name)
    with open(src, "w") as f:
        f.write(source)
    cc = os.environ.get("CC") or shutil.which("cc") or "gcc"
    r = subprocess.run([cc, "-O1", "-o", exe, src] + list(extra), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, "cannot compile %s: %s" % (name, r.stderr[-2000:])
    return exe

