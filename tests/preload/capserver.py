#!/usr/bin/env python3
"""capserver.py - a backend of known capacity: it serves at most C requests at once, each for
S ms, and queues the rest (so latency grows with concurrency past C).

usage: capserver.py CAPACITY SERVICE_MS [fixed|exp]

Listens on an ephemeral loopback port and prints "port N" on stdout once
ready. Speaks just enough HTTP/1.0 for curl and the test clients: GET /
is a request (200 "ok" after its turn and its service time; one request per
connection); GET /set?cap=N&ms=M changes the capacity and the service time
at once, and is answered at once (&dist=fixed or &dist=exp also switches the
service time); GET /stats answers "served N max M waiting W"
(the most served at once, and the requests queued for their turn now). Stops
when stdin closes.

With "exp" each request's service time is drawn from an exponential
distribution of mean S ms (a seeded generator: the same run draws the same
times); "fixed" (the default) serves every request in exactly S ms.
"""

import asyncio
import random
import sys


class Capacity:
    """A semaphore whose size can change while requests wait on it."""

    def __init__(self, cap, ms, dist="fixed"):
        self.cap, self.ms, self.dist = cap, ms, dist
        self.rng = random.Random(1)
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
            ms = self.rng.expovariate(1.0 / self.ms) if self.dist == "exp" and self.ms > 0 \
                else self.ms
            await asyncio.sleep(ms / 1000.0)
        finally:
            async with self.cond:
                self.busy -= 1
                self.served += 1
                self.cond.notify_all()

    async def change(self, cap, ms, dist):
        async with self.cond:
            self.cap, self.ms, self.dist = cap, ms, dist
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
            dist = q.get("dist", cap.dist)
            if dist not in ("fixed", "exp"):
                reply(w, "dist is fixed or exp\n", "400 Bad Request")
            else:
                await cap.change(int(q.get("cap", cap.cap)), float(q.get("ms", cap.ms)), dist)
                reply(w, "cap %d ms %g dist %s\n" % (cap.cap, cap.ms, cap.dist))
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
    dist = sys.argv[3] if len(sys.argv) > 3 else "fixed"
    if dist not in ("fixed", "exp"):
        sys.exit("usage: capserver.py CAPACITY SERVICE_MS [fixed|exp]")
    cap = Capacity(int(sys.argv[1]), float(sys.argv[2]), dist)
    server = await asyncio.start_server(lambda r, w: handle(cap, r, w), "127.0.0.1", 0,
                                        backlog=4096)
    print("port %d" % server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
