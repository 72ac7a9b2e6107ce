#!/usr/bin/env python3
"""load.py - one host's client program in a fleet test: threads that connect, hold and close.

usage: load.py PORT CONTROLFILE HOLD_MS THREADS MAX_SECONDS [RETRY_MS]

Thread i works while i is below the number in CONTROLFILE (read every 50
ms): it connects to 127.0.0.1:PORT, holds the connection HOLD_MS and closes
it; a refused connect (the shim's ECONNREFUSED) is retried after RETRY_MS
(default 20). To close, a thread shuts its side down and waits (at most 2 s)
for the server to close its own: the server has counted the connection gone
before the close releases its permit, so a close still on its way through
the kernel's queues never shows the witness a connection and its successor
at once (the permit is held a round trip longer, never shorter).
Runs under libbulkshim.so; stops after MAX_SECONDS or when CONTROLFILE
holds "stop". Prints "connected N refused M" at the end.
"""

import errno
import socket
import sys
import threading
import time

port, ctl = int(sys.argv[1]), sys.argv[2]
hold, nthreads, max_s = float(sys.argv[3]) / 1000, int(sys.argv[4]), float(sys.argv[5])
retry = float(sys.argv[6]) / 1000 if len(sys.argv) > 6 else 0.02
want = [0]
done = threading.Event()
counts = {"connected": 0, "refused": 0, "other": 0}
lock = threading.Lock()


def control():
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        try:
            with open(ctl) as f:
                text = f.read().strip()
        except OSError:
            text = "0"
        if text == "stop":
            break
        try:
            want[0] = int(text or "0")
        except ValueError:
            pass
        time.sleep(0.05)
    done.set()


def worker(i):
    while not done.is_set():
        if i >= want[0]:
            time.sleep(0.05)
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            s.close()
            with lock:
                counts["refused" if e.errno == errno.ECONNREFUSED else "other"] += 1
            time.sleep(retry)
            continue
        with lock:
            counts["connected"] += 1
        time.sleep(hold)
        try:
            s.shutdown(socket.SHUT_WR)
            s.settimeout(2.0)
            while s.recv(4096):
                pass
        except OSError:
            pass
        s.close()


threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(nthreads)]
for t in threads:
    t.start()
control()
for t in threads:
    t.join(hold + 2)
print("connected %(connected)d refused %(refused)d other %(other)d" % counts, flush=True)
