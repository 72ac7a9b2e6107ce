#!/usr/bin/env python3
"""test_package.py - the Debian package end to end, as root: lintian, apt-get install, a preloaded
curl limited, the systemd units verified and their command line run, then apt-get purge.

usage: test_package.py DEB   (make deb-test builds the package first)

Installs into the running system, so it refuses to run where bulkshim is already installed.
Every server it starts listens on a free loopback port; every wait is bounded.
"""

import glob
import http.server
import json
import os
import pwd
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

DEB = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
APT_LOCK = os.environ.get("BULKSHIM_APT_LOCK", "/tmp/apt.lock")
TAG = "pkg%d" % os.getpid()
TMP = tempfile.mkdtemp(prefix="bulkshim-pkg-")
os.chmod(TMP, 0o755)
cleanups = []


def say(msg):
    print(msg, flush=True)


def run(argv, timeout=120, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (" ".join(argv), r.returncode,
                                                       r.stdout[-3000:], r.stderr[-3000:]))
    return r


def apt(*args):
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return run(["flock", "-w", "600", APT_LOCK, "apt-get", "-y", "-q",
                "-o", "DPkg::Lock::Timeout=300"] + list(args), timeout=900, env=env)


def installed():
    r = run(["dpkg-query", "-W", "-f=${Status}", "bulkshim"], check=False)
    return "ok installed" in r.stdout


class SlowHandler(http.server.BaseHTTPRequestHandler):
    """Answers every GET after 1.5 s, so that two parallel requests overlap."""

    def do_GET(self):
        time.sleep(1.5)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def free_port():
    """A loopback port nothing listens on (for a Redis that is not there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slow_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowHandler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    cleanups.append(srv.shutdown)
    return srv.server_address[1]


def test_lintian():
    changes = glob.glob(os.path.join(os.path.dirname(DEB), "bulkshim_*.changes"))
    r = run(["lintian", "--info"] + (changes[:1] or [DEB]), timeout=600, check=False)
    tags = [l for l in r.stdout.splitlines() if re.match(r"^[EWIPX]: ", l)]
    errors = [l for l in tags if l.startswith("E: ")]
    say("lintian: %d errors, %d warnings, %d other tags" % (
        len(errors), sum(1 for l in tags if l.startswith("W: ")), len(tags) - len(errors)))
    for l in tags:
        say("  " + l)
    assert not errors, "lintian reports errors"


def pkg_file(path):
    """path as installed, or as the package holds it when dpkg's path-exclude (minimal and
    container images drop /usr/share/doc and /usr/share/man) left it out."""
    if os.path.exists(path):
        return path
    x = os.path.join(TMP, "deb-x")
    if not os.path.isdir(x):
        run(["dpkg-deb", "-x", DEB, x])
    return x + path


def test_install_layout():
    apt("install", DEB)
    assert installed()
    ma = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
    lib = "/usr/lib/%s/bulkshim/libbulkshim.so" % ma
    listed = set(run(["dpkg", "-L", "bulkshim"]).stdout.split())
    for path in ("/usr/bin/bulkshim", lib, "/usr/share/man/man1/bulkshim.1.gz",
                 "/usr/share/man/man5/bulkshim.conf.5.gz", "/usr/share/man/man7/libbulkshim.7.gz",
                 "/usr/share/doc/bulkshim/examples/example.cfg",
                 "/usr/share/doc/bulkshim/examples/grafana/bulkshim.json",
                 "/usr/share/doc/bulkshim/examples/prometheus/bulkshim-rules.yml",
                 "/usr/share/doc/bulkshim/examples/systemd/preload.conf",
                 "/lib/systemd/system/bulkshim-serve@.service",
                 "/lib/systemd/system/bulkshim-fleet@.service"):
        assert path in listed and os.path.exists(pkg_file(path)), \
            "the package did not install %s" % path
    assert os.path.isdir("/etc/bulkshim"), "no /etc/bulkshim"
    pwd.getpwnam("bulkshim")
    # The drop-in names the installed library.
    dropin = open(pkg_file("/usr/share/doc/bulkshim/examples/systemd/preload.conf")).read()
    assert "Environment=LD_PRELOAD=%s\n" % lib in dropin, dropin
    say("installed: /usr/bin/bulkshim, %s, man pages, examples, unit, user bulkshim" % lib)
    return lib


def write_config(path, segment, port, limit):
    with open(path, "w") as f:
        f.write('segment = "%s";\ngroup = "bulkshim";\nmode = "0640";\n'
                'compartments = ( { name = "slow"; destinations = [ "127.0.0.1:%d" ]; '
                'max_connections = %d; } );\n' % (segment, port, limit))
    os.chmod(path, 0o644)
    cleanups.append(lambda: os.path.exists(path) and os.unlink(path))
    cleanups.append(lambda: os.path.exists("/dev/shm/bulkshim." + segment) and
                    os.unlink("/dev/shm/bulkshim." + segment))


def status(cfg):
    return json.loads(run(["/usr/bin/bulkshim", "status", "-c", cfg, "--json"]).stdout)


def limited_curl(argv_prefix, cfg, port):
    """Two parallel requests through a compartment of 1: one answered, one refused."""
    url = "http://127.0.0.1:%d/" % port
    r = run(argv_prefix + ["curl", "-s", "--parallel", "--parallel-immediate", "--parallel-max",
                           "2", "-o", "/dev/null", "-w", "%{http_code}\n", url, url],
            check=False, timeout=60, env=dict(os.environ, BULKSHIM_CONFIG=cfg))
    codes = sorted(r.stdout.split())
    assert codes == ["000", "200"], "curl under bulkshim: codes %r, exit %d, stderr %r" % (
        codes, r.returncode, r.stderr)
    c = status(cfg)["compartments"][0]
    return c


def test_preloaded_curl_is_limited(lib):
    port = slow_server()
    cfg = os.path.join(TMP, "curl.cfg")
    write_config(cfg, TAG + "_curl", port, 1)
    c = limited_curl(["/usr/bin/bulkshim", "run", "-c", cfg, "--"], cfg, port)
    assert (c["admitted"], c["rejected"], c["in_use"]) == (1, 1, 0), c
    c = limited_curl(["env", "LD_PRELOAD=" + lib], cfg, port)
    assert (c["admitted"], c["rejected"]) == (2, 2), c
    st = os.stat("/dev/shm/bulkshim.%s_curl" % TAG)
    assert st.st_mode & 0o777 == 0o640 and st.st_gid == pwd.getpwnam("bulkshim").pw_gid, oct(
        st.st_mode)
    say("curl: `bulkshim run` and LD_PRELOAD=%s each let 1 of 2 parallel requests through "
        "(admitted %d, rejected %d)" % (lib, c["admitted"], c["rejected"]))


def verify(unit_path, unit_dir):
    # Documentation=man:bulkshim(1) is checked when the page is really on disk.
    man = [] if os.path.exists("/usr/share/man/man1/bulkshim.1.gz") and shutil.which("man") \
        else ["--man=no"]
    r = run(["systemd-analyze", "verify"] + man + [unit_path], check=False, timeout=60,
            env=dict(os.environ, SYSTEMD_UNIT_PATH=unit_dir + ":"))
    return r.returncode, (r.stdout + r.stderr).strip()


def test_units_verify():
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing (package systemd)"
    d = os.path.join(TMP, "units")
    os.makedirs(d)
    shutil.copy("/lib/systemd/system/bulkshim-serve@.service", d)
    shutil.copy("/lib/systemd/system/bulkshim-serve@.service",
                os.path.join(d, "bulkshim-serve@shop.service"))
    rc, out = verify(os.path.join(d, "bulkshim-serve@shop.service"), d)
    assert rc == 0 and out == "", "systemd-analyze verify bulkshim-serve@shop: %s" % out
    shutil.copy("/lib/systemd/system/bulkshim-fleet@.service",
                os.path.join(d, "bulkshim-fleet@shop.service"))
    rc, out = verify(os.path.join(d, "bulkshim-fleet@shop.service"), d)
    assert rc == 0 and out == "", "systemd-analyze verify bulkshim-fleet@shop: %s" % out
    # A service with the preload drop-in, as `systemctl edit myservice` makes it.
    with open(os.path.join(d, "myservice.service"), "w") as f:
        f.write("[Unit]\nDescription=a legacy service\n[Service]\nExecStart=/bin/sleep 60\n")
    os.makedirs(os.path.join(d, "myservice.service.d"))
    dropin = os.path.join(d, "myservice.service.d", "override.conf")
    shutil.copy(pkg_file("/usr/share/doc/bulkshim/examples/systemd/preload.conf"), dropin)
    rc, out = verify(os.path.join(d, "myservice.service"), d)
    assert rc == 0 and out == "", "systemd-analyze verify with the drop-in: %s" % out
    # ... and the drop-in is really read: a broken line in it is reported.
    with open(dropin, "a") as f:
        f.write("Environment=NOT AN ASSIGNMENT\n")
    rc, out = verify(os.path.join(d, "myservice.service"), d)
    assert "override.conf" in out, "systemd-analyze did not read the drop-in: %r" % out
    say("systemd-analyze verify: bulkshim-serve@shop.service, bulkshim-fleet@shop.service and a "
        "service with the preload drop-in: no findings")


def exec_start(instance, listen, unit="bulkshim-serve@.service"):
    """The unit's user, ExecStart (with %i and ${BULKSHIM_LISTEN} as systemd would expand them)
    and ambient capabilities."""
    text = open("/lib/systemd/system/" + unit).read()
    line = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    user = re.search(r"^User=(.*)$", text, re.M).group(1)
    caps = re.findall(r"^AmbientCapabilities=(.*)$", text, re.M)
    return (user, line.replace("%i", instance).replace("${BULKSHIM_LISTEN}", listen).split(),
            " ".join(caps).split())


def curl(url):
    r = run(["curl", "-s", "-m", "10", "-w", "\n@@%{http_code}", url], timeout=20)
    body, _, code = r.stdout.rpartition("\n@@")
    return int(code), body


def test_unit_command_line_serves(lib):
    port = slow_server()
    inst = TAG + "_unit"
    cfg = "/etc/bulkshim/%s.cfg" % inst
    write_config(cfg, inst, port, 3)
    # A preloaded program (as root, like a service) makes the segment, group bulkshim, 0640.
    holder = subprocess.Popen(
        ["/usr/bin/python3", "-c", "import socket, sys, time\n"
         "s = [socket.create_connection(('127.0.0.1', %d)) for _ in range(2)]\n"
         "print('up', flush=True); sys.stdin.read()" % port],
        env=dict(os.environ, LD_PRELOAD=lib, BULKSHIM_CONFIG=cfg), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    cleanups.append(lambda: holder.kill())
    assert select.select([holder.stdout], [], [], 20)[0] and holder.stdout.readline() == "up\n"
    user, argv, _ = exec_start(inst, "127.0.0.1:0")
    # As the unit's user, exec'd like systemd does (setpriv, not a login shell).
    p = subprocess.Popen(["setpriv", "--reuid", user, "--regid", user, "--init-groups"] + argv,
                         stderr=subprocess.PIPE, text=True)
    cleanups.append(lambda: p.poll() is None and p.kill())
    assert select.select([p.stderr], [], [], 20)[0], "serve printed nothing"
    line = p.stderr.readline()
    m = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", line)
    assert m, "serve as %s: %r %s" % (user, line, p.stderr.read() if p.poll() is not None else "")
    code, body = curl("http://%s/status.json" % m.group(1))
    c = json.loads(body)["compartments"][0]
    assert code == 200 and (c["in_use"], c["limit"]) == (2, 3), (code, body)
    code, body = curl("http://%s/" % m.group(1))
    assert code == 200 and "<title>bulkshim</title>" in body, (code, body[:200])
    p.terminate()
    assert p.wait(10) == 0, "serve did not stop cleanly on SIGTERM"
    holder.stdin.close()
    holder.wait(10)
    say("unit command line as user %s: %s -> /status.json in_use 2/3, / the page" % (
        user, " ".join(argv)))


def test_fleet_unit_command_line_creates_the_segment_for_the_owner(lib):
    """The fleet unit's command line, as its user with its capabilities and before the service:
    the agent gives the segment to the config's owner and group, and the service, as nobody,
    attaches to it and is limited."""
    port = slow_server()
    inst = TAG + "_fleet"
    cfg = "/etc/bulkshim/%s.cfg" % inst
    with open(cfg, "w") as f:
        f.write('segment = "%s";\nowner = "nobody";\ngroup = "bulkshim";\nmode = "0660";\n'
                'fleet = { redis = "127.0.0.1:%d"; name = "%s"; host = "h"; };\n'
                'compartments = ( { name = "slow"; destinations = [ "127.0.0.1:%d" ]; '
                'max_connections = 1; fleet_limit = 4; fleet_floor = 1; } );\n' % (
                    inst, free_port(), inst, port))
    os.chmod(cfg, 0o644)
    cleanups.append(lambda: os.path.exists(cfg) and os.unlink(cfg))
    cleanups.append(lambda: os.path.exists("/dev/shm/bulkshim." + inst) and
                    os.unlink("/dev/shm/bulkshim." + inst))
    user, argv, caps = exec_start(inst, "", "bulkshim-fleet@.service")
    assert user == "bulkshim" and caps == ["CAP_CHOWN"], (user, caps)
    names = ",".join("+" + c.lower().replace("cap_", "", 1) for c in caps)
    p = subprocess.Popen(["setpriv", "--reuid", user, "--regid", user, "--init-groups",
                          "--inh-caps=" + names, "--ambient-caps=" + names] + argv,
                         stderr=subprocess.PIPE, text=True)
    cleanups.append(lambda: p.poll() is None and p.kill())
    shm = "/dev/shm/bulkshim." + inst
    deadline = time.monotonic() + 20
    while not (os.path.exists(shm) and os.stat(shm).st_size > 0) and time.monotonic() < deadline:
        assert p.poll() is None, "the agent exited %d: %s" % (p.returncode, p.stderr.read())
        time.sleep(0.05)
    st = os.stat(shm)
    want = (pwd.getpwnam("nobody").pw_uid, pwd.getpwnam(user).pw_gid, 0o660)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == want, (st, want)
    # The service as nobody: one of two parallel requests through its compartment of 1.
    c = limited_curl(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                      "env", "LD_PRELOAD=" + lib, "BULKSHIM_CONFIG=" + cfg], cfg, port)
    assert (c["admitted"], c["rejected"]) == (1, 1), c
    p.terminate()
    assert p.wait(10) == 0, "the agent did not stop cleanly on SIGTERM: %s" % p.stderr.read()
    say("fleet unit command line as user %s with %s: segment nobody:bulkshim 0660 made before "
        "the service, which was limited as nobody" % (user, " ".join(caps)))


def test_purge():
    apt("purge", "bulkshim")
    assert not installed()
    for path in ("/usr/bin/bulkshim", "/lib/systemd/system/bulkshim-serve@.service",
                 "/lib/systemd/system/bulkshim-fleet@.service", "/usr/share/doc/bulkshim",
                 "/etc/bulkshim"):
        assert not os.path.exists(path), "%s is left after purge" % path
    say("purge: bulkshim removed, /etc/bulkshim gone")


def main():
    if os.geteuid() != 0:
        say("SKIP: the package test installs into the system and needs root")
        return 0
    if not DEB or not os.path.exists(DEB):
        say("usage: test_package.py DEB")
        return 2
    if installed():
        say("SKIP: bulkshim is already installed here; the test would remove it")
        return 0
    t0 = time.monotonic()
    ok = False
    try:
        test_lintian()
        lib = test_install_layout()
        test_preloaded_curl_is_limited(lib)
        test_units_verify()
        test_unit_command_line_serves(lib)
        test_fleet_unit_command_line_creates_the_segment_for_the_owner(lib)
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:
                pass
        cleanups.clear()
        test_purge()
        ok = True
    finally:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:
                pass
        if installed():
            apt("purge", "bulkshim")
        shutil.rmtree(TMP, ignore_errors=True)
    say("package test %s in %.0f s" % ("passed" if ok else "FAILED", time.monotonic() - t0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
