#!/usr/bin/env python3
"""legacy_client.py - a legacy-style client: a thread per request, no timeouts of its own.

usage: legacy_client.py PORT THREADS SECONDS [PAUSE_MS]

THREADS threads each send one request at a time (a new connection per
request, as the plain HTTP/1.0 clients of old do) for SECONDS; a request
refused by the shim is counted, and its thread pauses PAUSE_MS (default
50) before the next, as a caller that gives up and comes back later. At the
end prints one JSON line: every request's end time (seconds since start),
outcome ("ok", "refused" or the error's name) and latency in ms.
Run it under the shim; it knows nothing of it.
"""

import json
import socket
import sys
import threading
import time

REQ = b"GET / HTTP/1.0\r\nHost: backend\r\n\r\n"


def one(port):
    """One request: (outcome, latency in s)."""
    t0 = time.monotonic()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(REQ)
        data = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            data += b
        return ("ok" if data.startswith(b"HTTP/1.0 200") else "bad", time.monotonic() - t0)
    except ConnectionRefusedError:
        return ("refused", time.monotonic() - t0)
    except OSError as e:
        return (type(e).__name__, time.monotonic() - t0)
    finally:
        s.close()


def main():
    port, threads, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    pause = (float(sys.argv[4]) if len(sys.argv) > 4 else 50.0) / 1000.0
    start = time.monotonic()
    end = start + seconds
    out = []
    lock = threading.Lock()

    def worker():
        mine = []
        while time.monotonic() < end:
            what, lat = one(port)
            mine.append((round(time.monotonic() - start, 4), what, round(lat * 1000, 2)))
            if what != "ok":
                time.sleep(pause)
        with lock:
            out.extend(mine)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.sort()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
