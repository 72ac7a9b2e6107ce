"""test_runtimes.py - real runtimes under the shim: Node, PHP extensions, nginx, Ruby, Perl,
OpenJDK, CPython asyncio and wrk, each against a witness that counts the connections it holds,
and the kernel reconcile (a leak made on purpose, a socket inherited by an unpreloaded child).

Every program gets a compartment smaller than its concurrency, and must see at most the limit
connect, the rest refused at once, and `in_use` back at 0 within 1 s of closing its sockets
while it still runs. The numbers each test measures are printed (run.py shows them with -v).
"""

import errno
import heapq
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time

import harness
from harness import LineProc, Shim, defer, free_port, helper, tmpdir, wait_until, write_file
from harness_io import IoShim

RETURN_S = 1.0		# in_use back at 0 within this long of the program closing


def need_deepbind():
    """PHP loads extensions with RTLD_DEEPBIND, which the sanitizer runtime refuses
    (google/sanitizers#611): under `make check-sanitize` the PHP rows cannot run."""
    if os.environ.get("BULKSHIM_PRELOAD_PREFIX"):
        raise harness.Skip("PHP's RTLD_DEEPBIND loads cannot run with a sanitizer runtime")


def need(*progs):
    for p in progs:
        if shutil.which(p) is None:
            raise AssertionError("%s is not installed (tests/deps.sh installs it)" % p)


def report(what, **figures):
    print("matrix %s: %s" % (what, " ".join("%s=%s" % kv for kv in figures.items())),
          file=sys.stderr)


class Witness:
    """An HTTP/1.1 server on a free loopback port that counts the connections it holds
    (live, max_live, accepted). Each request is answered `delay` seconds after it arrived
    (never, when delay is None: a stalled backend), with keep-alive unless the client asks
    to close. It is the independent count the shim's figures are checked against."""

    def __init__(self, delay=0.0):
        self.delay = delay
        self.live = self.max_live = self.accepted = self.requests = 0
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(512)
        self.lsock.setblocking(False)
        self.port = self.lsock.getsockname()[1]
        self._buf = {}
        self._due = []
        self._stop = False
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()
        defer(self.stop)

    def _drop(self, sel, c):
        if c in self._buf:
            sel.unregister(c)
            del self._buf[c]
            c.close()
            with self._lock:
                self.live -= 1

    def _loop(self):
        sel = selectors.DefaultSelector()
        sel.register(self.lsock, selectors.EVENT_READ, "l")
        while not self._stop:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, _, c, close = heapq.heappop(self._due)
                if c not in self._buf:
                    continue
                try:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n" +
                              (b"Connection: close\r\n" if close else b"") + b"\r\nok\n")
                except OSError:
                    close = True
                if close:
                    self._drop(sel, c)
            wait = 0.05 if not self._due else max(0.0, min(0.05, self._due[0][0] - now))
            events = sel.select(wait)
            # Ends before starts: a client that closed and reconnected is one.
            events.sort(key=lambda e: e[0].data == "l")
            for key, _ in events:
                if key.data == "l":
                    # One accept per round: draining the queue here would
                    # count a connection made after another's close before
                    # that close's EOF (readable by then, but not in this
                    # round's events) is seen.
                    try:
                        c, _ = self.lsock.accept()
                    except OSError:
                        continue
                    c.setblocking(False)
                    self._buf[c] = b""
                    sel.register(c, selectors.EVENT_READ, "c")
                    with self._lock:
                        self.accepted += 1
                        self.live += 1
                        self.max_live = max(self.max_live, self.live)
                    continue
                c = key.fileobj
                try:
                    data = c.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._drop(sel, c)
                    continue
                self._buf[c] += data
                while b"\r\n\r\n" in self._buf[c]:
                    head, _, rest = self._buf[c].partition(b"\r\n\r\n")
                    self._buf[c] = rest
                    self.requests += 1
                    if self.delay is not None:
                        close = b"connection: close" in head.lower() or b"HTTP/1.0" in head
                        heapq.heappush(self._due, (time.monotonic() + self.delay, id(c), c, close))
        sel.close()

    def stop(self):
        if not self._stop:
            self._stop = True
            self._t.join(5)
            for c in list(self._buf):
                c.close()
            self.lsock.close()


def comp_now(shim):
    return shim.comp("dep")


def returns_to_zero(shim, what, witness=None):
    """Waits for in_use 0 (the status read also reconciles); returns the seconds it took."""
    t0 = time.monotonic()
    shim.wait("dep", "in_use", 0, timeout=RETURN_S)
    dt = time.monotonic() - t0
    if witness is not None:
        wait_until(lambda: witness.live == 0, 2.0, 0.01, "the witness to see every close")
    return dt


def check_fail_fast(prog, limit, total, witness, shim, what, lines):
    """The program's "result OK REFUSED SLOWEST_REFUSAL_MS" line, checked."""
    words = lines.split()
    assert words[0] == "result", "%s printed %r, want a result line" % (what, lines)
    ok, refused, slowest = int(words[1]), int(words[2]), float(words[3])
    c = comp_now(shim)
    assert witness.max_live <= limit, "%s: the witness held %d connections at once, limit %d" % (
        what, witness.max_live, limit)
    assert ok == limit and refused == total - limit, \
        "%s: %d connected and %d refused, want %d and %d (compartment %s)" % (
            what, ok, refused, limit, total - limit, c)
    assert slowest < 500, "%s: a refusal took %.0f ms, want it at once" % (what, slowest)
    assert c["rejected"] >= total - limit, "%s: rejected %d, want >= %d" % (
        what, c["rejected"], total - limit)
    return ok, refused, slowest


def run_matrix_program(argv, env, limit, total, witness, shim, what, start_timeout=30):
    """Runs a program that connects `total` times at once, prints its result line, closes
    everything, prints "closed" and waits for a line on stdin before it exits."""
    p = LineProc(argv, env)
    ok, refused, slowest = check_fail_fast(p, limit, total, witness, shim, what,
                                           p.line(start_timeout))
    assert p.line(15) == "closed", "%s did not report closing its sockets" % what
    dt = returns_to_zero(shim, what, witness)
    assert p.p.poll() is None, "%s exited before in_use was checked" % what
    p.send("exit\n")
    p.finish(15)
    report(what, limit=limit, attempts=total, connected=ok, refused=refused,
           slowest_refusal_ms="%.1f" % slowest, witness_max=witness.max_live,
           back_to_zero_s="%.3f" % dt)


def shim_for(port, limit, extra=""):
    return Shim([{"name": "dep", "destinations": ["127.0.0.1:%d" % port],
                  "max_connections": limit}], extra=extra)


def matrix(what, prog, source, suffix, delay=None, limit=3, total=6, env=None,
           start_timeout=30, name=None):
    """One row of the matrix: `prog SOURCE PORT TOTAL` against a witness answering after
    `delay` (None: never), with a compartment of `limit`. Returns the Shim."""
    need(prog)
    w = Witness(delay=delay)
    shim = shim_for(w.port, limit)
    src = write_file(source, name=name, suffix=suffix)
    run_matrix_program([shutil.which(prog) or prog, src, str(w.port), str(total)],
                       dict(shim.env(log="off"), **(env or {})), limit, total, w, shim, what,
                       start_timeout)
    return shim


# ---- Node.js (libuv closes with syscall(SYS_close, fd)) ----

# What the Node rows share: a refusal's time, and the end of a round (result line, then
# "closed" once `close` has run, then exit at the first line on stdin).
NODE_TALLY = r"""
const rl = require('readline');
const [port, n] = process.argv.slice(2).map(Number);
let ok = 0, refused = 0, slowest = 0, pending = n;
function failed(t0, e) {
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (e.code === 'ECONNREFUSED') { refused++; slowest = Math.max(slowest, ms); }
}
function done(close) {
  if (--pending) return;
  console.log(`result ${ok} ${refused} ${slowest.toFixed(1)}`);
  close();
  setTimeout(() => console.log('closed'), 100);
  rl.createInterface({input: process.stdin}).on('line', () => process.exit(0));
}
"""

NODE_NET = NODE_TALLY + r"""
const net = require('net'), socks = [];
const closeAll = () => { for (const s of socks) s.destroy(); };
for (let i = 0; i < n; i++) {
  const t0 = process.hrtime.bigint();
  const s = net.connect(port, '127.0.0.1');
  socks.push(s);
  s.on('connect', () => { ok++; done(closeAll); });
  s.on('error', (e) => { failed(t0, e); done(closeAll); });
}
"""


def test_node_net_limits_and_returns_permits_on_destroy():
    matrix("node net", "node", NODE_NET, ".js")


NODE_LOCKOUT = r"""
const net = require('net'), fs = require('fs');
const port = Number(process.argv[2]);
function conn() {
  return new Promise((res) => {
    const s = net.connect(port, '127.0.0.1');
    s.on('connect', () => res([s, 'ok'])); s.on('error', (e) => res([s, e.code]));
  });
}
(async () => {
  const socks = [];
  for (let i = 0; i < 4; i++) { const [s, r] = await conn(); if (r !== 'ok') throw r; socks.push(s); }
  for (const s of socks) s.destroy();
  await new Promise((r) => setTimeout(r, 100));
  const files = [];
  for (let i = 0; i < 4; i++) files.push(fs.openSync('/dev/null', 'r'));
  const [s, r] = await conn();
  console.log('after ' + r);
  s.destroy();
  await new Promise((r) => setTimeout(r, 100));
  console.log('closed');
  process.stdin.once('data', () => process.exit(0));
})();
"""


def test_node_destroy_then_open_files_does_not_lock_out():
    """Limit 4, net.connect x4, destroy() all, open 4 files (which take the freed
    numbers), connect: it must be admitted, and in_use must be 0 after."""
    need("node")
    w = Witness(delay=None)
    shim = shim_for(w.port, 4)
    src = write_file(NODE_LOCKOUT, suffix=".js")
    p = LineProc(["node", src, str(w.port)], shim.env(log="off"))
    r = p.line(30)
    assert r == "after ok", "node after destroy() and 4 open files: %r (compartment %s)" % (
        r, comp_now(shim))
    assert p.line(10) == "closed"
    dt = returns_to_zero(shim, "node lock-out", w)
    c = comp_now(shim)
    assert c["admitted"] == 5 and c["rejected"] == 0, c
    p.send("x\n")
    p.finish(10)
    report("node destroy+files", admitted=c["admitted"], rejected=c["rejected"],
           back_to_zero_s="%.3f" % dt)


NODE_HTTP = NODE_TALLY + r"""
const http = require('http');
const agent = new http.Agent({keepAlive: false, maxSockets: Infinity});
const nothing = () => {};
for (let i = 0; i < n; i++) {
  const t0 = process.hrtime.bigint();
  http.get({host: '127.0.0.1', port, path: '/', agent}, (res) => {
    res.resume(); res.on('end', () => { if (res.statusCode === 200) ok++; done(nothing); });
  }).on('error', (e) => { failed(t0, e); done(nothing); });
}
"""


def test_node_http_limits_and_returns_permits():
    matrix("node http", "node", NODE_HTTP, ".js", delay=0.8)


# ---- PHP: extensions loaded with RTLD_DEEPBIND ----

PHP_CURL_MULTI = r"""<?php
[$_, $port, $n] = $argv;
$mh = curl_multi_init(); $hs = [];
for ($i = 0; $i < $n; $i++) {
    $h = curl_init("http://127.0.0.1:$port/");
    curl_setopt($h, CURLOPT_RETURNTRANSFER, 1);
    curl_setopt($h, CURLOPT_FORBID_REUSE, 1);
    curl_setopt($h, CURLOPT_TIMEOUT, 10);
    curl_multi_add_handle($mh, $h); $hs[] = $h;
}
do { $st = curl_multi_exec($mh, $run); if ($run) curl_multi_select($mh, 0.1); }
while ($run && $st == CURLM_OK);
$ok = 0; $refused = 0; $slowest = 0.0;
foreach ($hs as $h) {
    if (curl_getinfo($h, CURLINFO_HTTP_CODE) == 200) $ok++;
    else { $refused++; $slowest = max($slowest, curl_getinfo($h, CURLINFO_TOTAL_TIME) * 1000); }
    curl_multi_remove_handle($mh, $h); curl_close($h);
}
curl_multi_close($mh);
printf("result %d %d %.1f\n", $ok, $refused, $slowest);
echo "closed\n";
fgets(STDIN);
"""


def test_php_curl_multi_is_limited():
    """php-curl's libcurl is loaded with RTLD_DEEPBIND: without the shim's dlopen it opened
    all 8 connections and admitted stayed 0."""
    need_deepbind()
    shim = matrix("php curl_multi", "php", PHP_CURL_MULTI, ".php", delay=0.8, total=8)
    assert comp_now(shim)["admitted"] == 3


class Postgres:
    """A throw-away PostgreSQL cluster on a free loopback port, run as the postgres user
    when the test runs as root (initdb refuses root)."""

    def __init__(self):
        bindir = None
        for d in sorted(os.listdir("/usr/lib/postgresql"), reverse=True) \
                if os.path.isdir("/usr/lib/postgresql") else []:
            if os.path.exists("/usr/lib/postgresql/%s/bin/initdb" % d):
                bindir = "/usr/lib/postgresql/%s/bin" % d
                break
        assert bindir, "PostgreSQL is not installed (tests/deps.sh installs postgresql)"
        self.bindir = bindir
        self.dir = os.path.join(tmpdir(), "pg")
        os.makedirs(self.dir)
        self.port = free_port()
        self.as_user = []
        if os.geteuid() == 0:
            os.chmod(tmpdir(), 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        env = harness.clean_env()
        r = subprocess.run(self.as_user + [bindir + "/initdb", "-D", self.dir + "/data",
                                           "-U", "postgres", "-A", "trust", "--no-sync"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, "initdb: %s" % r.stderr[-2000:]
        r = subprocess.run(self.as_user + [bindir + "/pg_ctl", "-D", self.dir + "/data", "-w",
                                           "-l", self.dir + "/log", "-o",
                                           "-p %d -k %s -c listen_addresses=127.0.0.1 "
                                           "-c fsync=off" % (self.port, self.dir), "start"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, "pg_ctl start: %s %s" % (r.stdout, r.stderr)
        defer(self.stop)

    def backends(self):
        """Client connections the server holds now, from pg_stat_activity (the witness)."""
        r = subprocess.run([self.bindir + "/psql", "-h", self.dir, "-p", str(self.port), "-U",
                            "postgres", "-Atc",
                            "select count(*) from pg_stat_activity where backend_type = "
                            "'client backend' and pid <> pg_backend_pid()"],
                           capture_output=True, text=True, timeout=20, env=harness.clean_env())
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip())

    def stop(self):
        subprocess.run(self.as_user + [self.bindir + "/pg_ctl", "-D", self.dir + "/data", "-m",
                                       "immediate", "stop"], capture_output=True, timeout=60,
                       env=harness.clean_env())


PHP_PG = r"""<?php
[$_, $port, $n] = $argv;
$conns = []; $ok = 0; $refused = 0; $slowest = 0.0; $sum = 0;
for ($i = 0; $i < $n; $i++) {
    $t0 = microtime(true);
    $c = @pg_connect("host=127.0.0.1 port=$port user=postgres dbname=postgres connect_timeout=5",
                     PGSQL_CONNECT_FORCE_NEW);
    if ($c === false) { $refused++; $slowest = max($slowest, (microtime(true) - $t0) * 1000); continue; }
    $r = pg_query($c, "select $i + 1"); $sum += (int)pg_fetch_result($r, 0, 0);
    $ok++; $conns[] = $c;
}
printf("result %d %d %.1f %d\n", $ok, $refused, $slowest, $sum);
fgets(STDIN);
foreach ($conns as $c) pg_close($c);
echo "closed\n";
fgets(STDIN);
"""


def test_php_pg_connect_is_limited():
    need("php")
    need_deepbind()
    pg = Postgres()
    shim = shim_for(pg.port, 2)
    src = write_file(PHP_PG, suffix=".php")
    p = LineProc(["php", src, str(pg.port), "5"], shim.env(log="off"))
    words = p.line(60).split()
    assert words[0] == "result", words
    ok, refused, slowest, total = int(words[1]), int(words[2]), float(words[3]), int(words[4])
    held = pg.backends()
    c = comp_now(shim)
    assert ok == 2 and refused == 3, "pg_connect x5, limit 2: %d connected, %d refused (%s)" % (
        ok, refused, c)
    assert total == 1 + 2, "the admitted connections' queries returned %d" % total
    assert held == 2 and c["in_use"] == 2, "server holds %d, in_use %d, want 2" % (held, c["in_use"])
    assert slowest < 500, "a refused pg_connect took %.0f ms" % slowest
    p.send("close\n")
    assert p.line(15) == "closed"
    dt = returns_to_zero(shim, "php pg_connect")
    wait_until(lambda: pg.backends() == 0, 5, 0.1, "the server to see the closes")
    p.send("exit\n")
    p.finish(15)
    report("php pg_connect", limit=2, attempts=5, connected=ok, refused=refused,
           slowest_refusal_ms="%.1f" % slowest, witness_held=held, back_to_zero_s="%.3f" % dt)


# ---- nginx reverse proxy: permits shared by its workers ----

NGINX_CONF = """
worker_processes %(workers)d;
pid %(dir)s/nginx.pid;
error_log %(dir)s/error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %(dir)s/body;
    proxy_temp_path %(dir)s/proxy;
    fastcgi_temp_path %(dir)s/fastcgi;
    uwsgi_temp_path %(dir)s/uwsgi;
    scgi_temp_path %(dir)s/scgi;
    upstream dep {
        server 127.0.0.1:%(up)d max_fails=0;
        %(keepalive)s
    }
    server {
        listen 127.0.0.1:%(port)d;
        location / {
            proxy_pass http://dep;
            proxy_next_upstream off;
            proxy_http_version 1.1;
            proxy_set_header Connection "%(conn)s";
        }
    }
}
"""


def nginx_run(keepalive):
    need("nginx")
    w = Witness(delay=0.8)
    shim = shim_for(w.port, 2, extra='mode = "0666";')
    d = os.path.join(tmpdir(), "nginx")
    os.makedirs(d)
    os.chmod(tmpdir(), 0o755)
    os.chmod(d, 0o777)
    port = free_port()
    conf = write_file(NGINX_CONF % {
        "dir": d, "up": w.port, "port": port,
        # With keepalive, one worker: a worker reuses only its own idle upstream
        # connections, and with two the second round's requests may all land on
        # the worker that holds none (six 502s). Two workers share permits in
        # the test without keepalive.
        "workers": 1 if keepalive else 2,
        "keepalive": "keepalive 4; keepalive_timeout 2s;" if keepalive else "",
        "conn": "" if keepalive else "close"}, suffix=".conf")
    p = subprocess.Popen(["nginx", "-p", d, "-c", conf, "-g", "daemon off;"],
                         env=shim.env(log="off"), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)

    def stop():
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    defer(stop)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False
    wait_until(up, 10, 0.05, "nginx to listen")
    codes = []
    times = []

    def get():
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), 10) as s:
                s.sendall(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                data = b""
                while True:
                    b = s.recv(4096)
                    if not b:
                        break
                    data += b
            codes.append(int(data.split()[1]))
        except OSError:
            codes.append(0)
        times.append((codes[-1], time.monotonic() - t0))
    rounds = []
    for _ in range(2):
        ts = [threading.Thread(target=get) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(20)
        rounds.append(list(codes))
        codes.clear()
    return p, w, shim, rounds, times


def check_nginx(keepalive):
    p, w, shim, rounds, times = nginx_run(keepalive)
    what = "nginx keepalive" if keepalive else "nginx"
    for codes in rounds:
        assert codes.count(200) == 2 and codes.count(502) == 4, \
            "%s, 6 requests, upstream limit 2: codes %r (compartment %s)" % (
                what, sorted(codes), comp_now(shim))
    slowest = max(t for code, t in times if code == 502)
    assert slowest < 0.5, "%s: a refused upstream answered 502 after %.2f s" % (what, slowest)
    assert w.max_live <= 2, "%s: the upstream held %d connections at once" % (what, w.max_live)
    c = comp_now(shim)
    if keepalive:
        # Idle pooled connections hold their permits: in_use is what the upstream sees.
        wait_until(lambda: comp_now(shim)["in_use"] == w.live, 2, 0.05,
                   "in_use to equal the upstream's idle connections")
        idle = w.live
        assert idle >= 1, "no idle keepalive connection was kept"
        # keepalive_timeout 2s closes them; in_use follows within 1 s.
        wait_until(lambda: w.live == 0, 6, 0.01, "nginx to close its idle upstream connections")
        t0 = time.monotonic()
        shim.wait("dep", "in_use", 0, timeout=RETURN_S)
        dt = time.monotonic() - t0
    else:
        idle = 0
        wait_until(lambda: w.live == 0, 3, 0.01, "the upstream to see every close")
        t0 = time.monotonic()
        shim.wait("dep", "in_use", 0, timeout=RETURN_S)
        dt = time.monotonic() - t0
    assert p.poll() is None, "nginx exited: %s" % p.stderr.read()[-2000:]
    report(what, limit=2, requests=12, ok=2 * 2, bad_gateway=4 * 2,
           slowest_502_ms="%.1f" % (slowest * 1000), witness_max=w.max_live, idle_kept=idle,
           admitted=c["admitted"], rejected=c["rejected"], back_to_zero_s="%.3f" % dt)


def test_nginx_reverse_proxy_shares_permits_across_workers():
    check_nginx(False)


def test_nginx_upstream_keepalive_holds_permits_while_idle():
    check_nginx(True)


# ---- Ruby, Perl, OpenJDK, CPython asyncio ----

RUBY_THREADS = r"""
require 'net/http'
port, n = ARGV.map(&:to_i)
ok = 0; refused = 0; slowest = 0.0; m = Mutex.new; https = []
threads = (1..n).map do
  Thread.new do
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    begin
      h = Net::HTTP.new('127.0.0.1', port); h.open_timeout = 5; h.read_timeout = 10
      h.start
      r = h.get('/')
      m.synchronize { ok += 1 if r.code == '200'; https << h }
    rescue Errno::ECONNREFUSED
      ms = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0) * 1000
      m.synchronize { refused += 1; slowest = [slowest, ms].max }
    end
  end
end
threads.each(&:join)
puts format('result %d %d %.1f', ok, refused, slowest)
https.each(&:finish)
puts 'closed'
$stdout.flush
$stdin.gets
"""


def test_ruby_net_http_threads_are_limited():
    matrix("ruby net/http", "ruby", RUBY_THREADS, ".rb", delay=0.8)


PERL_FORKS = r"""
use strict; use warnings; use IO::Socket::INET; use Time::HiRes qw(time sleep);
$| = 1;
my ($port, $n) = @ARGV;
my @kids;
pipe(my $r, my $w) or die;
for my $i (1..$n) {
    my $pid = fork() // die;
    if ($pid == 0) {
        close $r;
        my $t0 = time;
        my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Proto => 'tcp');
        my $line = $s ? "ok 0\n" : sprintf("%s %.1f\n", ($!{ECONNREFUSED} ? 'refused' : 'other'),
                                           (time - $t0) * 1000);
        syswrite($w, $line);
        sleep 1.5;
        close $s if $s;
        syswrite($w, "closed\n");
        sleep 30;
        exit 0;
    }
    push @kids, $pid;
}
close $w;
my ($ok, $refused, $slowest, $closed, $printed) = (0, 0, 0, 0, 0);
while (my $l = <$r>) {
    if ($l =~ /^ok/) { $ok++ }
    elsif ($l =~ /^refused (\S+)/) { $refused++; $slowest = $1 if $1 > $slowest }
    elsif ($l =~ /^closed/) { $closed++ }
    if ($ok + $refused == $n && !$printed) { printf "result %d %d %.1f\n", $ok, $refused, $slowest; $printed = 1 }
    last if $closed == $n;
}
print "closed\n";
<STDIN>;
kill 'TERM', @kids;
waitpid($_, 0) for @kids;
"""


def test_perl_forks_are_limited():
    matrix("perl forks", "perl", PERL_FORKS, ".pl")


JAVA_CLIENT = r"""
import java.io.*; import java.net.*; import java.util.*; import java.util.concurrent.*;
public class Client {
  public static void main(String[] a) throws Exception {
    int port = Integer.parseInt(a[0]), n = Integer.parseInt(a[1]);
    List<Socket> socks = Collections.synchronizedList(new ArrayList<>());
    int[] ok = {0}, refused = {0}; double[] slowest = {0};
    Thread[] ts = new Thread[n];
    for (int i = 0; i < n; i++) {
      ts[i] = new Thread(() -> {
        long t0 = System.nanoTime();
        try { Socket s = new Socket("127.0.0.1", port); socks.add(s); synchronized (ok) { ok[0]++; } }
        catch (ConnectException e) {
          double ms = (System.nanoTime() - t0) / 1e6;
          synchronized (ok) { refused[0]++; slowest[0] = Math.max(slowest[0], ms); }
        } catch (IOException e) { }
      });
      ts[i].start();
    }
    for (Thread t : ts) t.join();
    System.out.printf("result %d %d %.1f%n", ok[0], refused[0], slowest[0]);
    for (Socket s : socks) s.close();
    System.out.println("closed");
    System.out.flush();
    new BufferedReader(new InputStreamReader(System.in)).readLine();
  }
}
"""


def test_openjdk_threads_are_limited():
    matrix("openjdk", "java", JAVA_CLIENT, "", name="Client.java", start_timeout=90,
           env={"JAVA_TOOL_OPTIONS": "-Xshare:auto -XX:TieredStopAtLevel=1 -Xmx64m"})


PY_ASYNCIO = r"""
import asyncio, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
async def one():
    t0 = time.monotonic()
    try:
        r, w = await asyncio.open_connection('127.0.0.1', port)
        return ('ok', w, 0)
    except ConnectionRefusedError:
        return ('refused', None, (time.monotonic() - t0) * 1000)
async def main():
    res = await asyncio.gather(*[one() for _ in range(n)])
    ok = sum(1 for r in res if r[0] == 'ok')
    refused = sum(1 for r in res if r[0] == 'refused')
    print('result %d %d %.1f' % (ok, refused, max(r[2] for r in res)), flush=True)
    for r in res:
        if r[1]:
            r[1].close()
            await r[1].wait_closed()
    print('closed', flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
asyncio.run(main())
"""


def test_cpython_asyncio_is_limited():
    matrix("cpython asyncio", harness.PY, PY_ASYNCIO, ".py")


def test_wrk_is_limited_and_returns_to_zero():
    need("wrk")
    w = Witness(delay=0.02)
    shim = shim_for(w.port, 3)
    t0 = time.monotonic()
    r = harness.run(["wrk", "-t2", "-c8", "-d2s", "--timeout", "5s",
                     "http://127.0.0.1:%d/" % w.port], shim.env(log="off"), timeout=30)
    assert r.returncode == 0, r.stderr
    took = time.monotonic() - t0
    c = comp_now(shim)
    assert w.max_live <= 3, "wrk: the witness held %d connections at once, limit 3" % w.max_live
    assert c["admitted"] >= 3 and c["rejected"] >= 1, "wrk: %s" % c
    assert "connect" in r.stdout, "wrk reported no connect errors:\n%s" % r.stdout
    assert w.requests > 0, "wrk made no request through the permits it got"
    dt = returns_to_zero(shim, "wrk", w)
    report("wrk", limit=3, connections=8, witness_max=w.max_live, requests=w.requests,
           rejected=c["rejected"], run_s="%.1f" % took, back_to_zero_s="%.3f" % dt)


# ---- the kernel reconcile ----

def leak_then_connect_elsewhere(w, shim):
    """rawclose leaks its two counted sockets to the witness w (closed with the system call
    instruction); then another preloaded process connects, which must be admitted: its
    connect reconciles rawclose's holds via /proc. Returns rawclose's LineProc and the
    seconds that connect took."""
    p = LineProc([helper("rawclose"), str(w.port), "2"], shim.env(log="off"))
    assert p.line(10) == "leaked 2"
    wait_until(lambda: w.live == 0, 2, 0.01, "the witness to see the raw closes")
    t0 = time.monotonic()
    r = harness.run_py("import socket,sys; s=socket.create_connection(('127.0.0.1', %d)); "
                       "print('ok')" % w.port, shim.env(log="off"), timeout=20)
    took = time.monotonic() - t0
    assert r.stdout.strip() == "ok", "another process was refused after the leak: %r %r (%s)" % (
        r.stdout, r.stderr, comp_now(shim))
    return p, took


def test_reconcile_recovers_a_raw_close_leak_within_1s():
    """rawclose closes two counted sockets with the system call instruction (no hook sees
    it) and fills their numbers with files. The next connect, in the same process or in
    another, finds the compartment full, reconciles and is admitted at once."""
    w = Witness(delay=None)
    shim = shim_for(w.port, 2)
    p, other = leak_then_connect_elsewhere(w, shim)
    c = comp_now(shim)
    assert c["reconciled"] == 2 and c["in_use"] == 0, c
    # The leaking process itself: leak again, and its own connect recovers.
    p2 = LineProc([helper("rawclose"), str(w.port), "2"], shim.env(log="off"))
    assert p2.line(10) == "leaked 2"
    t0 = time.monotonic()
    r2 = p2.cmd("try", 10)
    own = time.monotonic() - t0
    assert r2.startswith("ok"), "the leaking process was refused: %r (%s)" % (r2, comp_now(shim))
    assert other < 1.0 + 1.0 and own < 1.0, "reconcile took %.2f s (other) / %.2f s (own)" % (
        other, own)
    c = comp_now(shim)
    assert c["reconciled"] == 4 and c["in_use"] == 1, c
    p2.cmd("close")
    shim.wait("dep", "in_use", 0, timeout=RETURN_S)
    for q in (p, p2):
        q.send("quit\n")
        q.finish(10)
    report("reconcile raw close", leaked=4, reconciled=c["reconciled"],
           own_connect_s="%.3f" % own, other_process_connect_s="%.3f" % other)


def test_reconcile_runs_before_a_connect_would_wait():
    """With max_wait_ms, a connect that finds the compartment full of a raw-close leak is
    admitted at once: the reconcile comes before the wait, not after it runs out."""
    w = Witness(delay=None)
    shim = IoShim([{"name": "dep", "destinations": ["127.0.0.1:%d" % w.port],
                    "max_connections": 2, "max_wait_ms": 4000}])
    p, took = leak_then_connect_elsewhere(w, shim)
    assert took < 2.0, "the connect waited %.2f s for a leak the reconcile frees" % took
    c = comp_now(shim)
    assert c["reconciled"] == 2 and c["in_use"] == 0 and c["max_wait_ms"] == 4000, c
    p.send("quit\n")
    p.finish(10)
    report("reconcile before a wait", leaked=2, max_wait_ms=4000, connect_s="%.3f" % took)


def test_reconcile_recovers_a_leak_when_status_reads():
    """Nobody connects: `bulkshim status` itself reconciles, so the figures are true."""
    w = Witness(delay=None)
    shim = shim_for(w.port, 3)
    p = LineProc([helper("rawclose"), str(w.port), "3"], shim.env(log="off"))
    assert p.line(10) == "leaked 3"
    t0 = time.monotonic()
    shim.wait("dep", "in_use", 0, timeout=RETURN_S)
    dt = time.monotonic() - t0
    assert comp_now(shim)["reconciled"] == 3
    p.send("quit\n")
    p.finish(10)
    report("reconcile on status", leaked=3, back_to_zero_s="%.3f" % dt)


def test_a_socket_on_a_number_closed_unseen_gives_the_hold_back_and_keeps_errno():
    """rawclose closes two counted sockets with the system call instruction and leaves their
    numbers free; its next socket() gets one of them, finds the stale table entry and gives
    that socket's hold back at once (no reconcile needed: `reconciled` stays 0), and a
    successful socket() leaves errno as it was, also on that path."""
    w = Witness(delay=None)
    shim = shim_for(w.port, 2)
    p = LineProc([helper("rawclose"), str(w.port), "2", "free"], shim.env(log="off"))
    words = p.line(10).split()
    assert words[:2] == ["leaked", "2"], words
    leaked = {int(x) for x in words[2:]}
    for _ in range(2):
        r = p.cmd("socket", 10).split()
        assert r[0] == "socket" and int(r[1]) in leaked, \
            "socket() did not reuse a number closed unseen: %r (leaked %s)" % (r, leaked)
        assert int(r[3]) == errno.EDOM, "socket() changed errno from EDOM to %s" % r[3]
    c = comp_now(shim)
    assert c["in_use"] == 0 and c["reconciled"] == 0, \
        "the stale holds were not given back by socket() itself: %s" % c
    r = p.cmd("socket", 10).split()
    assert int(r[1]) not in leaked and int(r[3]) == errno.EDOM, r
    p.send("quit\n")
    p.finish(10)


INHERIT_PARENT = r"""
import os, socket, sys, time
port, flag, py = int(sys.argv[1]), sys.argv[2], sys.argv[3]
s = socket.create_connection(('127.0.0.1', port))
fd = s.fileno()
os.set_inheritable(fd, True)
pid = os.fork()
if pid == 0:
    env = {k: v for k, v in os.environ.items() if k not in ('LD_PRELOAD', 'BULKSHIM_CONFIG')}
    child = ('import os, sys, time\n'
             'fd, flag = int(sys.argv[1]), sys.argv[2]\n'
             'print("child holds", flush=True)\n'
             'while not os.path.exists(flag): time.sleep(0.01)\n'
             'os.close(fd)\n'
             'print("child closed", flush=True)\n'
             'time.sleep(30)\n')
    os.execve(py, [py, '-c', child, str(fd), flag], env)
s.close()
print('parent closed', flush=True)
sys.stdin.readline()
os.kill(pid, 15)
os.waitpid(pid, 0)
"""


def test_socket_inherited_by_unpreloaded_child_keeps_its_permit():
    """fork + exec of a program without the shim: after the parent closes its copy, the
    permit stays as long as the child has the socket open (the kernel says so through
    /proc/PID/fd), and goes back within 1 s of the child closing it, the child still alive."""
    w = Witness(delay=None)
    shim = shim_for(w.port, 1)
    flag = os.path.join(tmpdir(), "close-now")
    src = write_file(INHERIT_PARENT, suffix=".py")
    p = LineProc([harness.PY, src, str(w.port), flag, harness.PY], shim.env(log="off"))
    got = {p.line(20), p.line(20)}
    assert got == {"child holds", "parent closed"}, got
    # Held by the unpreloaded child alone: status reads (and reconciles) for 1.5 s, and
    # every other connect is refused, since the connection is still open.
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        c = comp_now(shim)
        assert c["in_use"] == 1 and w.live == 1, \
            "the child's socket lost its permit: in_use %d, witness live %d" % (c["in_use"], w.live)
    r = harness.run_py("import socket\ntry:\n socket.create_connection(('127.0.0.1', %d))\n"
                       " print('ok')\nexcept ConnectionRefusedError:\n print('refused')" % w.port,
                       shim.env(log="off"))
    assert r.stdout.strip() == "refused", "a second connection got in: %r" % r.stdout
    assert comp_now(shim)["reconciled"] == 0
    open(flag, "w").close()
    assert p.line(10) == "child closed"
    t0 = time.monotonic()
    shim.wait("dep", "in_use", 0, timeout=RETURN_S)
    dt = time.monotonic() - t0
    c = comp_now(shim)
    assert c["reconciled"] == 1, c
    p.send("\n")
    p.finish(10)
    report("inherited by unpreloaded child", kept_while_open_s=1.5, back_to_zero_s="%.3f" % dt,
           reconciled=c["reconciled"])
