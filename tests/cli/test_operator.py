"""test_operator.py - the CLI leaves operators no silent surprises: status counts who runs
without limits, `run` refuses what the shim could not limit, reloads say what they change,
numbers are read whole, check reports every error, and the rough edges of set, rm, prune,
metrics, watch and suggest."""

import json
import os
import re
import signal
import subprocess
import time

import harness
from harness import (CLI, PY, Server, clean_env, new_segment, run, shim_env, shim_lines,
                     status_json, tmpdir, unique, write_file)
from harness_cli import (attach, cli, cli_fails, cli_json, cli_ok, config_file, connect_py,
                         create_segment, hold_connections, poke, web_comp)
from harness_hard import is_root


# ---- processes attached and unprotected ----



def test_status_counts_attached_and_unprotected_processes():
    """status shows how many attached and how many ran without limits, and why."""
    srv = Server()
    seg = new_segment()
    good = config_file(seg, [web_comp(srv.port)])
    for _ in range(3):
        assert attach(good).returncode == 0
    st = status_json(seg)
    assert st["attached"] == 3 and st["unprotected"] == 0, st
    # The same segment from a file with a typo: the process runs inert and says so there.
    bad = write_file(open(good).read().replace("max_connections", "max_conections"))
    r = attach(bad)
    assert "running without limits" in r.stderr
    st = status_json(seg)
    assert st["unprotected"] == 1 and "max_conections" in st["unprotected_last"], st
    text = cli_ok("status", "-s", seg)
    assert "1 process tried to attach and ran WITHOUT LIMITS" in text, text
    assert "3 attached" in text, text


# ---- `bulkshim run` refuses what would run unprotected ----

CONNECT_C = r'''
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[1])) };
	int ok = 0;
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	for (int i = 0; i < 8; i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		ok += connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	}
	printf("%d of 8 connected\n", ok);
	return 0;
}
'''


def _compile(name, *flags):
    src = os.path.join(tmpdir(), "connect8.c")
    with open(src, "w") as f:
        f.write(CONNECT_C)
    out = os.path.join(tmpdir(), name)
    r = subprocess.run(["cc", "-O0", "-o", out, src] + list(flags), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_run_refuses_an_invalid_config():
    """`run -c typo.cfg` does not start the program: it exits 78 naming the error."""
    srv = Server()
    seg = new_segment()
    good = config_file(seg, [web_comp(srv.port, 4)])
    typo = write_file(open(good).read().replace("max_connections", "max_conection"))
    marker = os.path.join(tmpdir(), "ran")
    r = cli("run", "-c", typo, "--", "touch", marker)
    assert r.returncode == 78, "run with a bad config exited %d: %r" % (r.returncode, r.stderr)
    assert "max_conection" in r.stderr and "not started" in r.stderr, r.stderr
    assert not os.path.exists(marker), "the program ran with a bad config"
    # No -c, BULKSHIM_CONFIG naming a broken file: the same.
    r = cli("run", "--", "touch", marker, env=dict(clean_env(), BULKSHIM_CONFIG=typo))
    assert r.returncode == 78 and not os.path.exists(marker), r.stderr
    # A config that is not there: not started either, and the same status as a missing
    # default config.
    missing = os.path.join(tmpdir(), "missing.cfg")
    r = cli("run", "-c", missing, "--", "touch", marker)
    assert r.returncode == 78 and not os.path.exists(marker), (r.returncode, r.stderr)
    assert missing in r.stderr and "not started" in r.stderr, r.stderr
    prog = _compile("dyn")
    r = cli("run", "-c", good, "--", prog, srv.port)
    assert r.returncode == 0 and "4 of 8 connected" in r.stdout, (r.stdout, r.stderr)


def _blind(prog, want, port, config):
    r = cli("run", "-c", config, "--", prog, port)
    assert r.returncode == 78, "%s: run exited %d: %r %r" % (want, r.returncode, r.stdout, r.stderr)
    assert want in r.stderr and "--force" in r.stderr and r.stdout == "", r.stderr
    # The way to run it with limits is named first: the kernel engine sees every connect.
    assert "bulkshim run --kernel" in r.stderr, r.stderr
    r = cli("run", "-c", config, "--force", "--", prog, port)
    assert r.returncode == 0 and "WITHOUT LIMITS" in r.stderr, (want, r.stderr)


def test_run_refuses_programs_the_shim_cannot_see():
    """static, Go, setuid, setgid and file-capability programs exit 78 unless --force."""
    assert is_root(), "this test makes setuid files owned by nobody: run it as root"
    srv = Server()
    config = config_file(new_segment(), [web_comp(srv.port, 4)])
    _blind(_compile("static", "-static"), "statically linked", srv.port, config)
    # Found through PATH, too.
    r = cli("run", "-c", config, "--", "static", srv.port,
            env=dict(clean_env(), PATH=tmpdir() + ":" + os.environ["PATH"]))
    assert r.returncode == 78 and "statically linked" in r.stderr, r.stderr
    # Go: marked by its build-info section (the real toolchain below, when present).
    fake_go = _compile("fakego")
    note = os.path.join(tmpdir(), "buildinfo")
    with open(note, "wb") as f:
        f.write(b"\xff Go buildinf:")
    subprocess.run(["objcopy", "--add-section", ".go.buildinfo=" + note, fake_go], check=True)
    _blind(fake_go, "a Go program", srv.port, config)
    uid = __import__("pwd").getpwnam("nobody").pw_uid
    gid = __import__("grp").getgrnam("nogroup").gr_gid
    suid = _compile("suid")
    os.chown(suid, uid, -1)
    os.chmod(suid, 0o4755)
    _blind(suid, "setuid", srv.port, config)
    sgid = _compile("sgid")
    os.chown(sgid, -1, gid)
    os.chmod(sgid, 0o2755)
    _blind(sgid, "setgid", srv.port, config)
    caps = _compile("caps")
    # struct vfs_cap_data, revision 2, effective: cap_net_bind_service permitted.
    os.setxattr(caps, "security.capability",
                (0x02000001).to_bytes(4, "little") + (1 << 10).to_bytes(4, "little") +
                bytes(12))
    _blind(caps, "file capabilities", srv.port, config)
    # A script is judged by its interpreter.
    script = write_file("#!%s\n" % _compile("static2", "-static"), suffix=".sh")
    os.chmod(script, 0o755)
    r = cli("run", "-c", config, "--", script, srv.port)
    assert r.returncode == 78 and "interpreter" in r.stderr, r.stderr
    # What the shim sees runs, limited.
    r = cli("run", "-c", config, "--", _compile("dyn"), srv.port)
    assert r.returncode == 0 and "4 of 8 connected" in r.stdout, (r.stdout, r.stderr)


def test_run_refuses_a_real_go_program():
    """A program built by the Go toolchain (skipped where there is none)."""
    go = __import__("shutil").which("go")
    if go is None:
        raise harness.Skip("no Go toolchain (golang-go)")
    d = tmpdir()
    with open(os.path.join(d, "main.go"), "w") as f:
        f.write('package main\nimport "net"\nfunc main() { net.Dial("tcp", "127.0.0.1:9") }\n')
    env = dict(clean_env(), GOCACHE=os.path.join(d, "gocache"), GOPATH=os.path.join(d, "gopath"),
               GO111MODULE="off", GOFLAGS="")
    r = subprocess.run([go, "build", "-o", os.path.join(d, "gonet"), "main.go"], cwd=d, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    config = config_file(new_segment(), [web_comp(9, 4)])
    r = cli("run", "-c", config, "--", os.path.join(d, "gonet"))
    assert r.returncode == 78 and "a Go program" in r.stderr, r.stderr


# ---- EAGAIN cannot turn fail-fast into a spin ----

def test_eagain_with_max_inflight_is_refused_everywhere():
    """errno EAGAIN with max_inflight is refused by check (and so run and reload) and by set."""
    srv = Server()
    seg = new_segment()
    bad = config_file(seg, [web_comp(srv.port, 4, max_inflight=2, errno="EAGAIN")])
    cli_fails("check", bad, want=r":\d+: errno EAGAIN cannot go with max_inflight.*busy loop")
    r = cli("run", "-c", bad, "--", "true")
    assert r.returncode == 78, r.stderr
    good = config_file(seg, [web_comp(srv.port, 4, max_inflight=2),
                      {"name": "conn", "destinations": ["127.0.0.2:1"], "max_connections": 2,
                       "errno": "EAGAIN"}])
    cli_ok("check", "-q", good)
    assert attach(good).returncode == 0
    cli_fails("set", "-s", seg, "web", "errno", "EAGAIN", want=r"EAGAIN cannot go with max_inflight")
    cli_fails("set", "-s", seg, "conn", "max_inflight", "3", want=r"EAGAIN cannot go with")
    cli_fails("reload", "-c", bad, "-s", seg, want=r"EAGAIN cannot go with max_inflight")
    st = status_json(seg)
    web = [c for c in st["compartments"] if c["name"] == "web"][0]
    assert web["errno"] == "ECONNREFUSED", web


# ---- reload says everything it changes, and which live sets it undoes ----

def test_reload_prints_every_change_and_the_live_sets_it_reverts():
    """set errno/enforce/max_wait_ms, then reload: every setting, --dry-run first."""
    srv, other = Server(), Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, 4),
                        {"name": "slow", "destinations": ["127.0.0.1:%d" % other.port],
                         "max_connections": 3}])
    assert attach(config).returncode == 0
    cli_ok("set", "-s", seg, "slow", "errno", "EAGAIN")
    cli_ok("set", "-s", seg, "slow", "enforce", "off")
    cli_ok("set", "-s", seg, "slow", "max_wait_ms", "100")
    # The file changes web's limit; nobody `set` that.
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("max_connections = 4;", "max_connections = 6;"))
    dry = cli_ok("reload", "-c", config, "--dry-run")
    for want in (r"slow errno EAGAIN -> ECONNREFUSED +\(reverts a live `bulkshim set`\)",
                 r"slow enforce off \(observe\) -> on +\(reverts a live `bulkshim set`\)",
                 r"slow max_wait_ms 100 -> 0 +\(reverts a live `bulkshim set`\)",
                 r"web max_connections 4 -> 6\n"):
        assert re.search(want, dry), "reload --dry-run lacks %r:\n%s" % (want, dry)
    assert "dry run: nothing changed" in dry, dry
    slow = [c for c in status_json(seg)["compartments"] if c["name"] == "slow"][0]
    assert slow["enforce"] is False and slow["errno"] == "EAGAIN", "dry run changed it: %r" % slow
    out = cli_ok("reload", "-c", config)
    assert out.count("reverts a live") == 3 and "web max_connections 4 -> 6" in out, out
    slow = [c for c in status_json(seg)["compartments"] if c["name"] == "slow"][0]
    assert slow["enforce"] is True and slow["errno"] == "ECONNREFUSED" and \
        slow["max_wait_ms"] == 0, slow
    again = cli_ok("reload", "-c", config)
    assert "no setting changes" in again and "reverts" not in again, again


# ---- integers are read whole ----

def test_integers_above_2_to_the_31_are_range_checked_not_wrapped():
    """4294967297 is not 1, 4294967306 is not 10, 99999999999 is itself."""
    srv = Server()
    seg = new_segment()
    for value, want in (("4294967297", r":4: max_connections of \"web\" is 4294967297"),
                        ("99999999999", r"is 99999999999, which is absurd"),
                        ("99999999999999999999", r":4: \"max_connections\" is too large"),
                        ("0x100000002", r"is 4294967298")):
        path = write_file('segment = "%s";\ncompartments = (\n  { name = "web"; destinations = '
                          '[ "127.0.0.1:%d" ];\nmax_connections = %s; }\n);\n' % (seg, srv.port, value))
        cli_fails("check", path, want=want)
    path = config_file(seg, [web_comp(srv.port, 4)], top={"budget": {"pool": 4294967306}})
    cli_fails("check", path, want=r":2: budget pool must be between 1 and 4294967295, not 4294967306")
    path = config_file(seg, [web_comp(srv.port, 4)], top={"max_processes": 4294967297})
    cli_fails("check", path, want=r"\"max_processes\" must be between 1 and 65536, not 4294967297")


# ---- check finds what fails at run time, and every error ----

def test_check_reports_every_error_max_sockets_and_unresolvable_hosts():
    """All errors in one run; max_sockets below the limits; a name resolving to nothing."""
    srv = Server()
    seg = new_segment()
    path = write_file(
        'segment = "%s";\nmax_sockets = 10;\ncompartments = (\n'
        '  { name = "a"; destinations = [ "127.0.0.1:%d" ]; max_connections = 8; bogus = 1; },\n'
        '  { name = "b"; destinations = [ "127.0.0.2:1" ]; max_connections = 8; max_wait_ms = -1; },\n'
        '  { name = "c"; destinations = [ "127.0.0.3:1" ]; max_inflight = 0; }\n);\n' % (seg, srv.port))
    err = cli_fails("check", path)
    lines = [l for l in err.splitlines() if l.startswith("bulkshim: ")]
    assert len(lines) == 4, "want four errors, one per line: %r" % err
    assert ':4: unknown key "bogus"' in lines[0], lines
    assert ":5: " in lines[1] and "max_wait_ms" in lines[1], lines
    assert ":6: " in lines[2] and "max_inflight" in lines[2], lines
    assert ":2: max_sockets = 10 is below the 16 connections" in lines[3] and "no_slot" in lines[3]
    # The library still says one thing: the first error.
    r = attach(path)
    inert = [l for l in shim_lines(r.stderr) if "running without limits" in l]
    assert len(inert) == 1 and "bogus" in inert[0], r.stderr
    # Host names: what they resolve to, and an error for one that resolves to nothing.
    hosts = config_file(seg, [{"name": "db", "destinations": ["localhost:%d" % srv.port],
                        "max_connections": 2}])
    out = cli_ok("check", hosts)
    assert re.search(r"host localhost:%d \(db\) -> .*127\.0\.0\.1" % srv.port, out), out
    nowhere = config_file(seg, [{"name": "db", "destinations": ["nowhere.invalid:80"],
                          "max_connections": 2}])
    cli_fails("check", nowhere, want=r':\d+: host "nowhere.invalid" of compartment "db" '
              r'resolves to nothing')
    assert attach(hosts).returncode == 0
    st = status_json(seg)
    assert st["hosts"] and st["hosts"][0]["host"] == "localhost" and \
        "127.0.0.1" in st["hosts"][0]["addresses"] and st["hosts"][0]["error"] is None, st["hosts"]


def test_syntax_errors_get_a_hint_for_common_causes():
    """libconfig's bare "syntax error" names a trailing comma, a missing comma or "="."""
    cases = [
        ('segment = "x";\ncompartments = (\n { name = "a"; destinations = [ "127.0.0.1:1" ];'
         ' max_connections = 1; },\n);\n', r":4: syntax error: a comma before \"\)\""),
        ('segment = "x";\ncompartments = ( { name = "a"; destinations = [ "127.0.0.1:1", ];'
         ' max_connections = 1; } );\n', r":2: syntax error: a comma before \"\]\""),
        ('compartments = ( { name = "a"; max_connections = 1; }\n { name = "b"; } );\n',
         r":2: syntax error: a missing comma between two groups"),
        ('max_sockets 10;\n', r":1: syntax error: a missing \"=\""),
        ('max_sockets = 10 20;\n', r":1: syntax error: a missing semicolon"),
        ('compartments = ( { name = "a";\n', r"syntax error: \"\{\" opened on line 1 is never closed"),
    ]
    for text, want in cases:
        cli_fails("check", write_file(text), want=want)


# ---- the kill switch ----

def test_set_all_enforce_off_and_on():
    """`set --all enforce off` turns every compartment to observe mode, and back."""
    srv = Server()
    seg = new_segment()
    keep = Server()
    comps = [web_comp(srv.port, 1)] + [{"name": "c%d" % i, "destinations": ["127.0.0.%d:1" % (i + 2)],
                                     "max_connections": 1} for i in range(4)] + [
        {"name": "keep", "destinations": ["127.0.0.1:%d" % keep.port], "max_connections": 5}]
    config = config_file(seg, comps)
    # A process stays attached holding a permit, so that the segment is live
    # (a segment nobody holds takes its file's settings from the next start).
    holder = hold_connections(config, keep.port)
    r = run([PY, "-c", connect_py(srv.port, 3)], shim_env(config))
    assert r.stdout.strip() == "1", (r.stdout, r.stderr)
    out = cli_ok("set", "-s", seg, "--all", "enforce", "off")
    assert out.count("enforce on -> off") == 6, out
    assert all(not c["enforce"] for c in status_json(seg)["compartments"])
    r = run([PY, "-c", connect_py(srv.port, 3)], shim_env(config))
    assert r.stdout.strip() == "3", "observe mode refused: %r" % r.stdout
    cli_ok("set", "-s", seg, "--all", "enforce", "on")
    assert all(c["enforce"] for c in status_json(seg)["compartments"])
    r = run([PY, "-c", connect_py(srv.port, 3)], shim_env(config))
    assert r.stdout.strip() == "1", r.stdout
    cli_fails("set", "-s", seg, "--all", "web", "enforce", "on", status=2)
    holder.stdin.close()
    holder.wait(10)


# ---- an unknown compartment names the closest one ----

def _thousand_compartments():
    """A new segment of 1,000 compartments svc0000..svc0999, nobody attached."""
    seg = new_segment()
    comps = [{"name": "svc%04d" % i, "destinations": ["127.1.%d.%d:1" % (i // 250, i % 250 + 1)],
              "max_connections": 1} for i in range(1000)]
    create_segment(config_file(seg, comps))
    return seg


def test_unknown_compartment_names_the_closest_match():
    """With 1,000 compartments the error names one, not all."""
    seg = _thousand_compartments()
    err = cli_fails("set", "-s", seg, "svc0O42", "max_connections", "2",
                    want=r'no compartment "svc0O42" in segment \S+ \(did you mean "svc0042"\?\)')
    assert len(err) < 300, err
    err = cli_fails("reset", "-s", seg, "zzz", want=r'no compartment "zzz".*it has 1000')
    assert len(err) < 300, err


# ---- cleaning up ----

def _shm(seg):
    return "/dev/shm/bulkshim." + seg


def test_rm_removes_idle_and_damaged_segments_and_keeps_one_in_use():
    """`bulkshim rm` refuses a segment in use without --force; removes a damaged one."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, 2)])
    holder = hold_connections(config, srv.port)
    err = cli_fails("rm", seg, want=r"in use by 1 process holding permits; not removed")
    assert os.path.exists(_shm(seg)), err
    holder.stdin.close()
    holder.wait(10)
    # Still held by the dead holder's record until a reclaim; status reclaims.
    status_json(seg)
    out = cli_ok("rm", seg)
    assert "removed segment %s" % seg in out and not os.path.exists(_shm(seg)), out
    # A damaged segment makes programs run without limits; rm takes it away.
    with open(_shm(seg), "wb") as f:
        f.write(b"\0" * 8192)
    r = run([PY, "-c", connect_py(srv.port, 4)], shim_env(config))
    assert r.stdout.strip() == "4" and "running without limits" in r.stderr, (r.stdout, r.stderr)
    out = cli_ok("rm", seg)
    assert "damaged" in out and not os.path.exists(_shm(seg)), out
    r = run([PY, "-c", connect_py(srv.port, 4)], shim_env(config))
    assert r.stdout.strip() == "2", (r.stdout, r.stderr)
    # In use, with --force.
    holder = hold_connections(config, srv.port)
    out = cli_ok("rm", "--force", seg)
    assert "in use: --force" in out and not os.path.exists(_shm(seg)), out
    holder.stdin.close()
    holder.wait(10)
    cli_fails("rm", seg, want=r"no segment")
    cli_fails("rm", "../etc", want=r"not a segment name")


def test_prune_removes_stale_segments_only():
    """`bulkshim prune` removes what no live process holds, older than the age given."""
    srv = Server()
    tag = unique("prune")
    segs = []
    for i in range(3):
        seg = "%s_%d" % (tag, i)
        harness.defer(lambda p=_shm(seg): os.path.exists(p) and os.unlink(p))
        segs.append(seg)
    idle = config_file(segs[0], [web_comp(srv.port, 2)])
    create_segment(idle)
    busy = config_file(segs[1], [web_comp(srv.port, 2)])
    holder = hold_connections(busy, srv.port)
    with open(_shm(segs[2]), "wb") as f:
        f.write(b"junk")
    pattern = tag + "_*"
    out = cli_ok("prune", "--older-than", "1h", pattern)
    assert "removed 0 segments; kept 3" in out, out
    out = cli_ok("prune", "--older-than", "0", "--dry-run", pattern)
    assert "would remove segment %s" % segs[0] in out and "would remove segment %s" % segs[2] in out
    assert all(os.path.exists(_shm(s)) for s in segs), out
    out = cli_ok("prune", "--older-than", "0s", pattern)
    assert not os.path.exists(_shm(segs[0])) and not os.path.exists(_shm(segs[2])), out
    assert os.path.exists(_shm(segs[1])) and "kept 1" in out, out
    cli_fails("prune", "--older-than", "soon", status=2, want=r"duration")
    holder.stdin.close()
    holder.wait(10)


# ---- many compartments ----

def test_metrics_filters_and_list_stays_one_line_with_1000_compartments():
    """metrics without histograms or for some compartments; list rows fit."""
    seg = _thousand_compartments()
    full = cli_ok("metrics", "-s", seg)
    slim = cli_ok("metrics", "-s", seg, "--no-histograms")
    assert "bulkshim_reply_seconds_bucket" in full and "_bucket" not in slim, slim[:300]
    assert len(slim.splitlines()) * 3 < len(full.splitlines()), (len(slim.splitlines()),
                                                                  len(full.splitlines()))
    assert 'bulkshim_admitted_total{segment="%s",compartment="svc0999"}' % seg in slim
    some = cli_ok("metrics", "-s", seg, "--compartment", "svc000*", "--compartment", "svc0500")
    names = set(re.findall(r'compartment="([^"]+)"', some))
    assert names == {"svc%04d" % i for i in range(10)} | {"svc0500"}, sorted(names)[:20]
    row = [l for l in cli_ok("list").splitlines() if l.startswith(seg + " ")]
    assert len(row) == 1 and len(row[0]) <= 120 and "(1000)" in row[0], row
    js = cli_json("list", "--json")
    mine = [x for x in js["segments"] if x["name"] == seg][0]
    assert len(mine["compartments"]) == 1000


# ---- watch fits 80x24, busiest first, and scrolls ----

def test_watch_fits_80_columns_sorts_busiest_first_and_scrolls():
    """No wrapped rows at 80x24; 1,000 compartments keep the header, busiest first."""
    from harness_cli import Tmux, need_tool
    tmux = need_tool("tmux", "tmux")
    assert tmux, "tmux is needed (tests/deps.sh installs it)"
    srv = Server()
    seg = new_segment()
    comps = [{"name": "a-rather-long-compartment-name-%04d" % i,
              "destinations": ["127.1.%d.%d:1" % (i // 250, i % 250 + 1)],
              "max_connections": 100, "max_inflight": 50} for i in range(999)]
    comps.append({"name": "the-busy-one", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 4})
    config = config_file(seg, comps)
    holder = hold_connections(config, srv.port, 3)
    poke(seg, "a-rather-long-compartment-name-0500", peak=1)
    t = Tmux(tmux)
    t.start("%s watch -s %s -i 0.3" % (CLI, seg), width=80, height=24)
    screen = t.wait_screen(lambda s: "the-busy-one" in s and "rows 1-" in s, 8, "the first page")
    lines = screen.splitlines()
    assert lines[0].startswith("bulkshim watch"), screen
    assert lines[1].startswith("segment %s" % seg) and "holding permits" in lines[1], screen
    assert lines[2].startswith("COMPARTMENT"), screen
    assert lines[3].startswith("the-busy-one"), "the busiest is not first:\n%s" % screen
    assert "3/4" in lines[3], lines[3]
    assert all(len(l) <= 80 for l in lines), max(lines, key=len)
    # Each compartment on one line: 20 rows of compartments under 3 header lines.
    rows = [l for l in lines if l.startswith("a-rather") or l.startswith("the-busy")]
    assert len(rows) == 20, "want 20 rows on a 24-line screen:\n%s" % screen
    assert "rows 1-20 of 1000, busiest first" in screen, screen
    t("send-keys", " ")
    screen = t.wait_screen(lambda s: "rows 21-40 of 1000" in s, 5, "the second page")
    assert screen.splitlines()[2].startswith("COMPARTMENT"), "the header scrolled away:\n" + screen
    t("send-keys", "g")
    t.wait_screen(lambda s: "rows 1-20 of 1000" in s, 5, "back to the top")
    t("send-keys", "q")
    harness.wait_until(lambda: not t.alive(), 5, 0.05, "watch to quit")
    holder.stdin.close()
    holder.wait(10)


def test_watch_at_80x24_fits_every_table_and_keeps_long_names_apart():
    """30 compartments whose names differ only at their end, a pool, an adaptive compartment:
    no line wraps at 80x24, the header stays, and every row's name is different."""
    from harness_cli import Tmux, need_tool
    tmux = need_tool("tmux", "tmux")
    assert tmux, "tmux is needed (tests/deps.sh installs it)"
    srv = Server()
    seg = new_segment()
    comps = [{"name": "svc-with-a-rather-long-name-%02d" % i,
              "destinations": ["127.2.0.%d:1" % (i + 1)], "max_connections": 8}
             for i in range(30)]
    for i in range(3):
        comps[i].update({"pool": "a-pool-with-a-long-name-too", "guaranteed": 2})
    comps[3].update({"max_inflight": 64, "adaptive": {"min": 1, "max": 64}})
    comps.append({"name": "the-busy-one", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 4})
    config = config_file(seg, comps)
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text.replace("compartments = (", 'pools = ( { name = "a-pool-with-a-long-name-too"; '
                             'size = 12; reserved = 2; } );\ncompartments = (', 1))
    assert cli("check", config).returncode == 0, cli("check", config).stderr
    holder = hold_connections(config, srv.port, 3)
    t = Tmux(tmux)
    t.start("%s watch -s %s -i 0.3" % (CLI, seg), width=80, height=24)
    screen = t.wait_screen(lambda s: "the-busy-one" in s and "POOL" in s, 8, "rows and the pool")
    lines = screen.splitlines()
    assert lines[0].startswith("bulkshim watch"), "the header scrolled away:\n" + screen
    assert lines[2].startswith("COMPARTMENT"), screen
    assert len(lines) <= 24 and all(len(l) <= 80 for l in lines), screen
    rows = [l.split()[0] for l in lines[3:] if l.startswith("svc-")]
    assert len(rows) >= 5 and len(set(rows)) == len(rows), "names not kept apart:\n" + screen
    # Each shown name ends as the compartment's does: the number survives.
    assert all(re.search(r"-\d\d$", r) for r in rows), rows
    # The pool's table, narrowed: its name abbreviated, its numbers all there.
    assert re.search(r"^a-pool-\S*~\S+ +12 +2 +0 +0 +10 +6 +0 \[", screen, re.M), screen
    assert "rows 1-" in screen, screen
    t("send-keys", " ")
    screen = t.wait_screen(lambda s: re.search(r"rows (\d+)-", s) and
                           re.search(r"rows (\d+)-", s).group(1) != "1", 5, "the second page")
    lines = screen.splitlines()
    assert lines[0].startswith("bulkshim watch") and len(lines) <= 24, screen
    t("send-keys", "q")
    harness.wait_until(lambda: not t.alive(), 5, 0.05, "watch to quit")
    holder.stdin.close()
    holder.wait(10)


def test_watch_waits_for_a_segment_that_does_not_exist_yet():
    """`watch -s X` waits for X like `serve` does, instead of exiting."""
    srv = Server()
    seg = new_segment()
    config = config_file(seg, [web_comp(srv.port, 2)])
    p = subprocess.Popen([CLI, "watch", "-s", seg, "-i", "0.2", "-n", "30"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=clean_env())
    harness.defer(p.kill)
    time.sleep(1.0)
    assert p.poll() is None, "watch exited: %r" % (p.communicate(),)
    assert attach(config).returncode == 0
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "waiting for segment %s" % seg in out and re.search(r"\nweb +", out), out[-800:]
    cli_fails("watch", "-s", "bad/name", want=r"segment")


# ---- suggest sizes max_inflight from requests, against a known answer ----

SLOW_SERVER = r'''
import socket, sys, threading, time
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(64)
print(ls.getsockname()[1], flush=True)
def serve(c):
    while True:
        b = c.recv(64)
        if not b:
            return
        time.sleep(0.1)
        c.sendall(b"ok\n")
while True:
    c, _ = ls.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

# N threads, each on its own connection, each keeping one request in flight
# (a refused send waits 0.1 s and tries again), for `seconds`.
CLIENTS = r'''
import socket, sys, threading, time
port, n, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
end = time.monotonic() + seconds
def work():
    s = socket.create_connection(("127.0.0.1", port))
    while time.monotonic() < end:
        try:
            s.sendall(b"q\n")
        except ConnectionRefusedError:
            time.sleep(0.1)
            continue
        s.recv(64)
ts = [threading.Thread(target=work) for _ in range(n)]
for t in ts: t.start()
for t in ts: t.join()
'''


def _start_workload(enforce, seconds):
    """The known workload: 6 clients, each with a request in flight on a server that answers
    in 0.1 s, for `seconds`, under a max_inflight of 2. Returns its segment and the clients."""
    srv = subprocess.Popen([PY, "-c", SLOW_SERVER], stdout=subprocess.PIPE, text=True,
                           env=clean_env())
    harness.defer(srv.kill)
    port = int(srv.stdout.readline())
    seg = new_segment()
    config = config_file(seg, [{"name": "api", "destinations": ["127.0.0.1:%d" % port],
                         "max_inflight": 2, "enforce": enforce}])
    load = subprocess.Popen([PY, "-c", CLIENTS, str(port), "6", str(seconds)],
                            env=shim_env(config), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    harness.defer(load.kill)
    return seg, load


def _known_workload(enforce):
    seg, load = _start_workload(enforce, 8)
    time.sleep(1.0)
    j = cli_json("suggest", "-s", seg, "--window", "3", "--json", timeout=30)
    # The text over 3 s as well, while the load lasts: the six replies of each 0.1 s come
    # together, so a window of 1 s counts 10 or 11 of those bursts (6 or 7 in flight).
    text = cli_ok("suggest", "-s", seg, "--window", "3")
    load.communicate(timeout=30)
    return j["compartments"][0], text


def test_suggest_max_inflight_from_a_workload_with_a_known_answer():
    """6 threads each with a request in flight, 0.1 s replies: the answer is 6."""
    for enforce in (False, True):
        api, text = _known_workload(enforce)
        inf = api["inflight"]
        assert api["limit_key"] == "max_inflight" and api["limit"] == 2, api
        assert api["suggested"] == 6 and api["verdict"] == "too small", (enforce, api)
        assert 0.09 <= inf["mean_reply_s"] <= 0.2, inf
        assert 25 <= inf["rate"] <= 62, inf
        assert inf["little"] in (5, 6), inf
        if not enforce:
            assert inf["peak"] == 6, inf
        assert "too small: raise max_inflight to 6" in text, text


def test_suggest_rates_are_over_the_time_that_passed():
    """`suggest --window 1` stopped from 0.3 s to 1.5 s into its window (a busy machine, at
    worst) ends it at 1.5 s: the window it reports lasted that long, and the rate of the known
    workload (6 requests in flight, 0.1 s replies: at most 60/s) is over that time, where over
    the second asked for it would read 90/s."""
    seg, load = _start_workload(False, 6)
    time.sleep(1.0)
    s = subprocess.Popen([CLI, "suggest", "-s", seg, "--window", "1", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=clean_env())
    harness.defer(s.kill)
    time.sleep(0.3)
    s.send_signal(signal.SIGSTOP)
    time.sleep(1.2)
    s.send_signal(signal.SIGCONT)
    out, err = s.communicate(timeout=30)
    assert s.returncode == 0, err
    inf = json.loads(out)["compartments"][0]["inflight"]
    assert inf["window_s"] >= 1.4, inf
    assert 45 <= inf["rate"] <= 70, inf
    load.communicate(timeout=30)
