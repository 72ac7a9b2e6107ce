#!/usr/bin/env python3
"""witness.py - the independent witness of a fleet test: counts the live TCP connections of all hosts.

usage: witness.py PORTFILE OUTFILE [MAX_SECONDS]

Listens on a free loopback port (written to PORTFILE), accepts every
connection and counts those still open; it closes its side of a connection
as soon as it reads the client's end of file. Its clients (load.py) shut
their side down, wait for that close and only then close, which releases
their permit: a connection is counted gone before the permit that made room
for its successor is free, however long the kernel takes to deliver a close
on a busy machine, and the witness never counts a connection and its
successor at once. A count is recorded after every end of file already
readable has been taken. On SIGTERM, or after
MAX_SECONDS (default 300), it writes {"max": M, "timeline": [[t, n], ...],
"accepts": [t, ...]} to OUTFILE, t being CLOCK_MONOTONIC seconds, which the
test shares: the timeline of live connections and the time of every accept
(the fleet's goodput, as the server saw it).
"""

import json
import os
import select
import signal
import socket
import sys
import time

stop = False


def on_term(sig, frame):
    global stop
    stop = True


def main():
    portfile, outfile = sys.argv[1], sys.argv[2]
    limit_s = float(sys.argv[3]) if len(sys.argv) > 3 else 300.0
    signal.signal(signal.SIGTERM, on_term)
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    ls.setblocking(False)
    with open(portfile + ".tmp", "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    os.rename(portfile + ".tmp", portfile)
    ep = select.epoll()
    ep.register(ls.fileno(), select.EPOLLIN)
    conns = {}
    timeline = [[time.monotonic(), 0]]
    accepts = []
    peak = 0
    end = time.monotonic() + limit_s

    def drain(timeout):
        """Takes every end of file readable within timeout seconds."""
        accept = False
        for fd, ev in ep.poll(timeout):
            if fd == ls.fileno():
                accept = True
                continue
            c = conns.get(fd)
            if c is None:
                continue
            try:
                data = c.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data == b"" or ev & (select.EPOLLHUP | select.EPOLLERR):
                ep.unregister(fd)
                c.close()
                del conns[fd]
        return accept

    while not stop and time.monotonic() < end:
        try:
            accept = drain(0.2)
        except InterruptedError:
            continue
        while accept and not stop:
            try:
                c, _ = ls.accept()
            except BlockingIOError:
                break
            c.setblocking(False)
            accepts.append(round(time.monotonic(), 4))
            conns[c.fileno()] = c
            ep.register(c.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
            # The closes that made room for this one are readable now.
            drain(0)
            n = len(conns)
            if n != timeline[-1][1]:
                timeline.append([time.monotonic(), n])
            peak = max(peak, n)
        n = len(conns)
        if n != timeline[-1][1]:
            timeline.append([time.monotonic(), n])
    with open(outfile + ".tmp", "w") as f:
        json.dump({"max": peak, "timeline": timeline, "accepts": accepts}, f)
    os.rename(outfile + ".tmp", outfile)


if __name__ == "__main__":
    main()
