"""harness_drill.py - a drill written straight into a segment, as `bulkshim drill` writes it.

The library's side of drills is tested on its own here: the words of struct
seg_drill (seg_layout.h) are written into the compartment the way the CLI
writes them (admit/drill.c: `id` a sequence lock, odd while the words change),
so a test controls each fault, its deadline and its end without the CLI.
"""

import mmap
import os
import struct
import time

import harness
from harness_io import COMP, DRILL, read_segment

DELAY, STALL, REFUSE, RESET, CONNECT_DELAY = 1, 2, 4, 8, 16
PPM = 1000000


def now_ms():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000)


class Drill:
    """Writes compartment `name`'s drill words in segment `segment`."""

    def __init__(self, segment, name):
        seg = read_segment(segment)
        idx = [c["name"] for c in seg.comps].index(name)
        self.base = seg.header["off_comp"] + idx * COMP.size + COMP.offset("drill")
        fd = os.open(harness.SHM_PREFIX + segment, os.O_RDWR)
        try:
            self.m = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        harness.defer(self.m.close)

    def _at(self, field):
        return self.base + DRILL.offset(field)

    def get(self, field):
        kind = "i" if field == "by_pid" else "Q" if field in (
            "id", "start_ms", "deadline_ms", "start_realtime_ms", "touched", "spared") else "I"
        return struct.unpack_from(kind, self.m, self._at(field))[0]

    def put(self, field, v):
        kind = "i" if field == "by_pid" else "Q" if field in (
            "id", "start_ms", "deadline_ms", "start_realtime_ms", "touched", "spared") else "I"
        struct.pack_into(kind, self.m, self._at(field), v)

    def start(self, faults, for_ms, delay_ms=0, connect_delay_ms=0, fraction_ppm=0):
        seq = self.get("id")
        assert seq % 2 == 0, "drill words of this compartment are being written (id %d)" % seq
        self.put("id", seq + 1)
        self.put("faults", 0)
        self.put("delay_ms", delay_ms)
        self.put("connect_delay_ms", connect_delay_ms)
        self.put("fraction_ppm", fraction_ppm)
        self.put("by_pid", os.getpid())
        t = now_ms()
        self.put("start_ms", t)
        self.put("start_realtime_ms", int(time.time() * 1000))
        self.put("touched", 0)
        self.put("spared", 0)
        self.put("deadline_ms", t + for_ms)
        self.put("faults", faults)
        self.put("id", seq + 2)
        self.settings_changed()
        return t + for_ms

    def stop(self):
        seq = self.get("id")
        self.put("id", seq + 1)
        self.put("faults", 0)
        self.put("deadline_ms", 0)
        self.put("id", seq + 2)
        self.settings_changed()

    def settings_changed(self):
        """Bumps the header's settings_seq, as the CLI does after a start or stop."""
        from harness_io import HEADER
        at = HEADER.offset("settings_seq")
        v = struct.unpack_from("I", self.m, at)[0]
        struct.pack_into("I", self.m, at, (v + 1) & 0xffffffff)
