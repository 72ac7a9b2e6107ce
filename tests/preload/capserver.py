#!/usr/bin/env python3
"""capserver.py - a backend of known capacity: it serves at most C requests at once, each for
S ms, and queues the rest (so latency grows with concurrency past C).

usage: capserver.py CAPACITY SERVICE_MS

Listens on an ephemeral loopback port and prints "port N" on stdout once
ready. Speaks just enough HTTP/1.0 for curl and the test clients: GET /
is a request (200 "ok" after its turn and its service time; one request per
connection); GET /set?cap=N&ms=M changes the capacity and the service time
at once, and is answered at once; GET /stats answers "served N max M waiting W"
(the most served at once, and the requests queued for their turn now). Stops
when stdin closes.
"""

import asyncio
import sys


class Capacity:
    """A semaphore whose size can change while requests wait on it."""

    def __init__(self, cap, ms):
        self.cap, self.ms = cap, ms
        self.busy = 0
        self.served = 0
        self.max_busy = 0
        self.waiting = 0
        self.cond = asyncio.Condition()

    async def serve(self):
        async with self.cond:
            self.waiting += 1
            try:
                await self.cond.wait_for(lambda: self.busy < self.cap)
            finally:
                self.waiting -= 1
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)
        try:
            await asyncio.sleep(self.ms / 1000.0)
        finally:
            async with self.cond:
                self.busy -= 1
                self.served += 1
                self.cond.notify_all()

    async def change(self, cap, ms):
        async with self.cond:
            self.cap, self.ms = cap, ms
            self.cond.notify_all()


def reply(w, body, status="200 OK"):
    w.write(("HTTP/1.0 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
             % (status, len(body), body)).encode())


async def handle(cap, r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        w.close()
        return
    path = head.split(b" ", 2)[1].decode() if head.count(b" ") >= 2 else "/"
    try:
        if path.startswith("/set?"):
            q = dict(kv.split("=", 1) for kv in path[5:].split("&") if "=" in kv)
            await cap.change(int(q.get("cap", cap.cap)), float(q.get("ms", cap.ms)))
            reply(w, "cap %d ms %g\n" % (cap.cap, cap.ms))
        elif path.startswith("/stats"):
            reply(w, "served %d max %d waiting %d\n" % (cap.served, cap.max_busy, cap.waiting))
        else:
            await cap.serve()
            reply(w, "ok\n")
        await w.drain()
    except ConnectionError:
        pass
    finally:
        w.close()


async def main():
    cap = Capacity(int(sys.argv[1]), float(sys.argv[2]))
    server = await asyncio.start_server(lambda r, w: handle(cap, r, w), "127.0.0.1", 0,
                                        backlog=4096)
    print("port %d" % server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
