"""harness_cli.py - what the CLI tests share: running bulkshim, configs with any key, a segment
writer compiled against the shim's headers, tools that may need installing, tmux, and `bulkshim serve`.

Built on harness.py (cleanup, temporary files, children). The segment writer
("poke") is a small C program compiled once per test against shim/admit/admit.h and
the shim's own objects in build/cli, so it creates segments exactly as the
shim does (cfg_load + seg_attach) and writes counters by field name with
offsetof: no layout is copied here.
"""

import glob
import json
import os
import re
import select
import shutil
import subprocess
import time

import harness

POKE_SRC = r'''
/* poke.c - creates a segment as the shim does, and writes counters into it, for the CLI tests. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "admit/admit.h"
#include "log.h"

#define M(f) ((struct seg_comp *)0)->f
#define SCALAR(n, f) { n, offsetof(struct seg_comp, f), sizeof(M(f)), 1 }
#define ARRAY(n, f) { n, offsetof(struct seg_comp, f), sizeof(M(f)[0]), \
	sizeof(M(f)) / sizeof(M(f)[0]) }

static const struct field { const char *name; size_t off, size, n; } fields[] = {
	SCALAR("limit", limit), SCALAR("peak", peak), SCALAR("enforce", enforce),
	SCALAR("inflight_limit", inflight_limit), SCALAR("admitted", admitted),
	SCALAR("rejected", rejected), SCALAR("last_rejection_ms", last_rejection_ms),
	SCALAR("reclaimed", reclaimed), SCALAR("connect_timeouts", connect_timeouts),
	SCALAR("io_timeouts", io_timeouts), SCALAR("peak_rate", peak_rate),
	ARRAY("rejected_by", rejected_by), ARRAY("would_reject", would_reject),
	ARRAY("rate", rate),
	ARRAY("h_connect.bucket", h_connect.bucket), SCALAR("h_connect.count", h_connect.count),
	SCALAR("h_connect.sum_us", h_connect.sum_us),
	ARRAY("h_reply.bucket", h_reply.bucket), SCALAR("h_reply.count", h_reply.count),
	SCALAR("h_reply.sum_us", h_reply.sum_us),
	ARRAY("h_wait.bucket", h_wait.bucket), SCALAR("h_wait.count", h_wait.count),
	SCALAR("h_wait.sum_us", h_wait.sum_us),
	ARRAY("ad.alg", ad.alg),
};

static void
store(void *p, size_t size, unsigned long long v)
{
	if (size == 8)
		atomic_store((_Atomic uint64_t *)p, (uint64_t)v);
	else
		atomic_store((_Atomic uint32_t *)p, (uint32_t)v);
}

/* FIELD[IDX]=VALUE, or rate_ago[K]=COUNT: COUNT admissions K seconds ago. */
static int
poke(struct seg_comp *c, const char *arg)
{
	char name[64];
	unsigned long long idx = 0, v;
	const char *eq = strchr(arg, '='), *br = strchr(arg, '[');
	size_t n = (size_t)((br && br < eq ? br : eq) - arg);

	if (eq == NULL || n >= sizeof(name))
		return -1;
	memcpy(name, arg, n);
	name[n] = '\0';
	if (br && br < eq)
		idx = strtoull(br + 1, NULL, 10);
	v = strtoull(eq + 1, NULL, 10);
	if (strcmp(name, "rate_ago") == 0) {
		uint64_t sec = now_mono_ms() / 1000 - idx;

		atomic_store(&c->rate[sec % BS_RATE_SECONDS], ((sec & 0xffffffff) << 32) | v);
		return 0;
	}
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		if (strcmp(fields[i].name, name) != 0)
			continue;
		if (idx >= fields[i].n)
			return -1;
		store((char *)c + fields[i].off + idx * fields[i].size, fields[i].size, v);
		return 0;
	}
	return -1;
}

int
main(int argc, char **argv)
{
	char err[BS_ERRLEN];
	struct bs_config cfg;
	struct seg *s;

	if (argc == 3 && strcmp(argv[1], "create") == 0) {
		if (cfg_load(argv[2], &cfg, false, err, sizeof(err)) < 0 ||
		    seg_attach(&cfg, &s, err, sizeof(err)) < 0) {
			fprintf(stderr, "poke: %s\n", err);
			return 1;
		}
		seg_close(s);
		cfg_free(&cfg);
		return 0;
	}
	if (argc < 4 || strcmp(argv[1], "set") != 0) {
		fprintf(stderr, "usage: poke create CONFIG | poke set SEGMENT COMP FIELD[IDX]=V...\n");
		return 2;
	}
	if (seg_open(argv[2], true, &s, err, sizeof(err)) < 0) {
		fprintf(stderr, "poke: %s\n", err);
		return 1;
	}
	for (uint32_t i = 0; i < seg_header(s)->ncomp; i++) {
		struct seg_comp *c = seg_comp(s, i);
		int r = 0;

		if (strcmp(c->name, argv[3]) != 0)
			continue;
		for (int a = 4; a < argc && r == 0; a++) {
			if ((r = poke(c, argv[a])) < 0)
				fprintf(stderr, "poke: cannot set %s\n", argv[a]);
		}
		seg_close(s);
		return r < 0;
	}
	fprintf(stderr, "poke: no compartment %s\n", argv[3]);
	seg_close(s);
	return 1;
}
'''

_poke = None


def poke_path():
    """Compiles the segment writer once per test against admit/admit.h and the
    shim's objects in build/cli (those built from tools/ hold a main())."""
    global _poke
    if _poke is not None:
        return _poke
    src = os.path.join(harness.tmpdir(), "poke.c")
    out = os.path.join(harness.tmpdir(), "poke")
    with open(src, "w") as f:
        f.write(POKE_SRC)
    tools = {os.path.splitext(os.path.basename(p))[0]
             for p in glob.glob(os.path.join(harness.ROOT, "tools", "*.c"))}
    objs = [p for p in sorted(glob.glob(os.path.join(harness.BUILD, "cli", "*.o")))
            if os.path.splitext(os.path.basename(p))[0] not in tools]
    assert objs, "no shim objects in %s/cli: build first" % harness.BUILD
    libs = subprocess.run(["pkg-config", "--libs", "libconfig"], capture_output=True,
                          text=True).stdout.split() or ["-lconfig"]
    r = subprocess.run(["cc", "-std=gnu11", "-D_GNU_SOURCE", "-I", os.path.join(harness.ROOT, "shim"),
                        "-o", out, src] + objs + libs + ["-lpthread"]
                       + os.environ.get("BULKSHIM_SAN_LDFLAGS", "").split(),
                       capture_output=True, text=True)
    assert r.returncode == 0, "cannot compile the segment writer: %s" % r.stderr[-2000:]
    _poke = out
    return out


def create_segment(config):
    """Creates the segment that config names, as the shim would, with no
    process attached."""
    r = subprocess.run([poke_path(), "create", config], capture_output=True, text=True,
                       env=harness.clean_env())
    assert r.returncode == 0, "poke create %s: %s" % (config, r.stderr)


def poke(segment, comp, **fields):
    """Writes fields of compartment comp: poke(seg, "a", peak_rate=5,
    **{"h_reply.bucket[15]": 90, "rate_ago[3]": 45})."""
    args = ["%s=%d" % (k, v) for k, v in fields.items()]
    r = subprocess.run([poke_path(), "set", segment, comp] + args, capture_output=True, text=True)
    assert r.returncode == 0, "poke %s %s %s: %s" % (segment, comp, args, r.stderr)


# ---- running the CLI ----

def cli(*args, env=None, timeout=20, input=None):
    """Runs build/bulkshim with args; returns the CompletedProcess."""
    harness.need_built(harness.CLI)
    return harness.run([harness.CLI] + [str(a) for a in args], env or harness.clean_env(),
                       timeout, input)


def cli_ok(*args, **kw):
    """Runs the CLI and fails the test unless it exits 0; returns stdout."""
    r = cli(*args, **kw)
    assert r.returncode == 0, "bulkshim %s exited %d: %s" % (
        " ".join(str(a) for a in args), r.returncode, (r.stderr or r.stdout).strip())
    return r.stdout


def cli_fails(*args, status=1, want=None, **kw):
    """Runs the CLI, asserts it exits with status, nothing on stdout when it
    is an error, and want (a regex) on stderr; returns stderr."""
    r = cli(*args, **kw)
    cmd = "bulkshim " + " ".join(str(a) for a in args)
    assert r.returncode == status, "%s exited %d, want %d (stdout %r, stderr %r)" % (
        cmd, r.returncode, status, r.stdout, r.stderr)
    if want is not None:
        assert re.search(want, r.stderr), "%s: stderr %r does not match %r" % (cmd, r.stderr, want)
    return r.stderr


def cli_json(*args, **kw):
    out = cli_ok(*args, **kw)
    try:
        return json.loads(out)
    except ValueError as e:
        raise AssertionError("bulkshim %s printed no JSON (%s): %r" % (
            " ".join(str(a) for a in args), e, out[:500]))


# ---- configs with any key ----

def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict):
        return "{ %s }" % " ".join("%s = %s;" % (k, _value(x)) for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[ %s ]" % ", ".join(_value(x) for x in v)
    return json.dumps(str(v))


def config_text(compartments, segment, top=None):
    """libconfig text: top-level keys from top (in order), then the
    compartments, each a dict of keys written as given."""
    lines = ["segment = %s;" % json.dumps(segment)]
    for k, v in (top or {}).items():
        lines.append("%s = %s;" % (k, _value(v)))
    lines.append("compartments = (")
    lines.append(",\n".join("  { %s }" % " ".join("%s = %s;" % (k, _value(v)) for k, v in c.items())
                            for c in compartments))
    lines.append(");")
    return "\n".join(lines) + "\n"


def config_file(segment, comps, top=None, name=None, where=None):
    """A config file of config_text(comps, segment, top), named name (or a
    unique name), in where (readable by all) or the test's directory."""
    text = config_text(comps, segment, top)
    if where is None:
        return harness.write_file(text, name)
    path = os.path.join(where, name or harness.unique("cfg") + ".cfg")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


def hold_connections(config, port, n=1):
    """A process under config that holds n connections to port until its
    stdin closes (killed at the test's end)."""
    p = subprocess.Popen([harness.PY, "-c", "import socket,sys; h=[socket.create_connection("
                          "('127.0.0.1',%d)) for _ in range(%d)]; print('up',flush=True); "
                          "sys.stdin.read()" % (port, n)],
                         env=harness.shim_env(config), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    harness.defer(p.kill)
    assert p.stdout.readline().strip() == "up"
    return p


def attach(config, extra=None):
    """Runs one python that does nothing under the shim with config, so that
    it attaches; returns the CompletedProcess."""
    return harness.run([harness.PY, "-c", "pass"], harness.shim_env(config, extra=extra))


# ---- tools that may have to be installed ----

def need_tool(tool, package, budget=40):
    """The path of tool; installs Debian's package when root, waiting at most
    budget seconds (an install still running then goes on in the background,
    in its own session, so that dpkg is never interrupted). Returns None, after
    printing why, when the tool cannot be had now: the caller skips."""
    path = shutil.which(tool)
    if path:
        return path
    if os.geteuid() != 0:
        print("SKIP: %s is missing and this is not root: apt-get install %s" % (tool, package))
        return None
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    quiet = "apt-get install -y -qq --no-install-recommends %s >/dev/null 2>&1" % package
    p = subprocess.Popen(["sh", "-c", "%s || { apt-get update -qq >/dev/null 2>&1 && %s; }" % (
        quiet, quiet)], env=env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        p.wait(budget)
    except subprocess.TimeoutExpired:
        print("SKIP: apt-get install %s is still running (pid %d); tests/deps.sh should "
              "install it" % (package, p.pid))
        return None
    path = shutil.which(tool)
    if not path:
        print("SKIP: could not install %s (package %s)" % (tool, package))
    return path


# ---- tmux ----

class Tmux:
    """A private tmux server (its own socket) for one test, killed at its end."""

    def __init__(self, tmux):
        self.tmux = tmux
        self.sock = "bs-" + harness.unique()
        harness.defer(self._kill)

    def _kill(self):
        subprocess.run([self.tmux, "-L", self.sock, "kill-server"], capture_output=True)

    def __call__(self, *args, check=True):
        r = subprocess.run([self.tmux, "-L", self.sock] + list(args), capture_output=True,
                           text=True, env=harness.clean_env(), timeout=10)
        if check:
            assert r.returncode == 0, "tmux %s: %s" % (" ".join(args), r.stderr.strip())
        return r

    def start(self, command, width=120, height=30):
        # A server whose last session just ended may still be exiting: a new session asked of
        # it then fails with "server exited unexpectedly", and the next one starts a new server.
        for _ in range(20):
            r = self("new-session", "-d", "-x", str(width), "-y", str(height), command,
                     check=False)
            if r.returncode == 0 or "server exited unexpectedly" not in r.stderr:
                break
            time.sleep(0.1)
        assert r.returncode == 0, "tmux new-session %s: %s" % (command, r.stderr.strip())

    def screen(self):
        return self("capture-pane", "-p").stdout

    def alive(self):
        return self("has-session", check=False).returncode == 0

    def wait_screen(self, pred, timeout=5, what="the screen"):
        """Polls capture-pane until pred(text) is true; returns the text."""
        seen = [""]

        def ok():
            if not self.alive():
                return None
            seen[0] = self.screen()
            return seen[0] if pred(seen[0]) else None
        try:
            return harness.wait_until(ok, timeout, 0.1, what)
        except AssertionError:
            raise AssertionError("tmux pane never showed %s; it showed:\n%s" % (what, seen[0]))


# ---- metrics ----

def sample(text, name, **labels):
    """The value of the first sample of metric name whose labels include
    labels, in the text exposition format; AssertionError if none."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no sample %s%r in:\n%s" % (name, labels, text[:2000]))


# ---- serve ----

class Serve:
    """`bulkshim serve` on a free loopback port; the port is read from the
    line it prints on stderr."""

    def __init__(self, *args):
        harness.need_built(harness.CLI)
        self.p = subprocess.Popen([harness.CLI, "serve", "--listen", "127.0.0.1:0"] + list(args),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=harness.clean_env())
        harness.defer(self._reap)
        ready, _, _ = select.select([self.p.stderr], [], [], 10)
        assert ready, "bulkshim serve printed nothing within 10 s"
        line = self.p.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
        assert m, "bulkshim serve did not say where it listens: %r" % line
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port

    def _reap(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(5)

    def get(self, path, method="GET"):
        """curl's (status, content type, body) for path."""
        r = subprocess.run(["curl", "-s", "-m", "10", "-X", method, "-o", "-", "-w",
                            "\n@@%{http_code} %{content_type}", self.url + path],
                           capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, "curl %s%s failed (%d): %s" % (self.url, path, r.returncode,
                                                                  r.stderr)
        body, _, tail = r.stdout.rpartition("\n@@")
        code, _, ctype = tail.partition(" ")
        return int(code), ctype, body

    def stop(self, sig, timeout=5):
        """Sends sig; returns the exit status."""
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("bulkshim serve did not exit within %ss of signal %d" % (
                timeout, sig))


def wait_gone(p, timeout=5):
    """Waits for a Popen to exit; returns its status."""
    deadline = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return p.poll()


def web_comp(port, limit=2, **more):
    """A compartment "web" for 127.0.0.1:port, with max_connections limit and more keys."""
    c = {"name": "web", "destinations": ["127.0.0.1:%d" % port], "max_connections": limit}
    c.update(more)
    return c


def connect_py(port, n):
    """Python that makes n connections to port, prints how many succeeded."""
    return ("import socket\nok=0\nh=[]\nfor _ in range(%d):\n"
            "    try:\n        h.append(socket.create_connection(('127.0.0.1',%d))); ok+=1\n"
            "    except OSError: pass\nprint(ok)\n" % (n, port))
