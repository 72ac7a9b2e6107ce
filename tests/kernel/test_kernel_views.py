"""test_kernel_views.py - the kernel engine's numbers in status, metrics and watch, during and after a run.

The engine counts connections the library cannot see. These tests check
that every view says so truthfully: the peak of a compartment that both
engines count is what both held at once, the engine's counts stay in the
segment after `run --kernel` ends, a killed run leaves nothing that
`detach` or the next run cannot clean, and metrics and watch mark the
compartments the engine counts. Connections are counted against a loopback
server's own live count (the witness).
"""

import os
import re
import shutil
import signal
import subprocess
import time

import harness as h
from test_kernel import Client, helper, kshim, need_kernel
from test_joint import attach, cgroup, in_cgroup

ECONNREFUSED = 111


def cgroup2():
    return [l.split()[1] for l in open("/proc/self/mounts") if l.split()[2] == "cgroup2"][0]


def pin_dir(s):
    return os.path.join("/sys/fs/bpf/bulkshim", s.segment.replace(".", "+"))


def observe(s):
    """Switches every compartment of s's config to observe mode."""
    with open(s.config) as f:
        text = f.read()
    with open(s.config, "w") as f:
        f.write(re.sub(r"max_connections = (\d+);", r"max_connections = \1; enforce = false;",
                       text))


def metrics(s):
    r = subprocess.run([h.CLI, "metrics", "-s", s.segment], capture_output=True, text=True,
                       env=h.clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def sample(text, name, **labels):
    """The value of the one sample of family name with these labels, or None."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()) and len(got) == len(labels):
            return line.rsplit(" ", 1)[1]
    return None


def test_views_peak_is_what_both_engines_held_at_once():
    """Observe mode, max_connections = 1: a program in the engine's cgroup
    holds 2 (one let past the limit) and a preloaded program outside holds 2
    more (both let past): 4 are open at once, as the witness says, and the
    peak says 4, not the larger of the two engines' own peaks."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 1}])
    observe(s)
    cg = cgroup()
    attach(s, cg)
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "2"]))
    assert k.until_held() == (2, []), k.lines
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "2"], env=s.env())
    assert p.until_held() == (2, []), p.lines
    srv.wait_live(4, timeout=5)
    assert srv.max_live == 4, srv.max_live
    s.expect("db", in_use=4, peak=4)
    assert sample(metrics(s), "bulkshim_compartment_peak", segment=s.segment,
                  compartment="db") == "4"
    # A reset starts the peak again from what both hold now.
    r = subprocess.run([h.CLI, "reset", "-c", s.config], capture_output=True, text=True,
                       env=h.clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    s.expect("db", in_use=4, peak=4, admitted=0)
    k.finish()
    p.finish()
    srv.wait_live(0, timeout=5)
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", peak=4)


def test_views_peak_counts_what_the_library_let_past_before_the_engine():
    """Observe mode, max_connections = 1: the preloaded program holds 2 first
    (one past the limit), then the program in the engine's cgroup connects
    2 more: the peak is 4."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 1}])
    observe(s)
    cg = cgroup()
    attach(s, cg)
    p = Client([helper("kclient"), "127.0.0.1", str(srv.port), "2"], env=s.env())
    assert p.until_held() == (2, []), p.lines
    k = Client(in_cgroup(cg, [helper("kclient_static"), "127.0.0.1", str(srv.port), "2"]))
    assert k.until_held() == (2, []), k.lines
    srv.wait_live(4, timeout=5)
    assert srv.max_live == 4, srv.max_live
    s.expect("db", in_use=4, peak=4)
    k.finish()
    p.finish()
    s.wait("db", "in_use", 0, timeout=5)


def test_views_engine_counts_outlive_run_kernel():
    """max_connections = 2, 4 tries under run --kernel: after the run has
    ended and the engine is unloaded, status and metrics still say 2
    admitted, 2 refused (full) and a peak of 2."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 2}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient_static"),
                "127.0.0.1", str(srv.port), "4"])
    ok, errs = c.until_held()
    assert ok == 2 and [e for e, _ in errs] == [ECONNREFUSED] * 2, c.lines
    srv.wait_live(2)
    rc, err = c.finish()
    assert rc == 0, err
    srv.wait_live(0, timeout=5)
    assert not os.path.exists(pin_dir(s)), "the engine is still loaded after the run"
    comp = s.expect("db", in_use=0, admitted=2, rejected=2, peak=2, kernel=False)
    assert comp["rejected_by"]["full"] == 2, comp
    assert comp["last_rejection_ms"] > 0, comp
    m = metrics(s)
    assert sample(m, "bulkshim_admitted_total", segment=s.segment, compartment="db") == "2", m
    assert sample(m, "bulkshim_rejections_total", segment=s.segment, compartment="db",
                  reason="full") == "2", m
    # A second run adds to them, and nothing is counted twice.
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient_static"),
                "127.0.0.1", str(srv.port), "3"])
    ok, errs = c.until_held()
    assert ok == 2 and len(errs) == 1, c.lines
    s.expect("db", admitted=4, rejected=3, peak=2, kernel=True)
    c.finish()
    s.wait("db", "in_use", 0, timeout=5)
    s.expect("db", admitted=4, rejected=3, peak=2, kernel=False)
    assert srv.max_live == 2


def killed_run(s, srv):
    """A run --kernel killed with SIGKILL while its client holds one
    connection; the client then ends by itself. Returns the cgroup the run
    made."""
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient_static"),
                "127.0.0.1", str(srv.port), "1"])
    assert c.until_held() == (1, []), c.lines
    cg = os.path.join(cgroup2(), "bulkshim.%s.%d" % (s.segment, c.p.pid))
    assert os.path.isdir(cg), cg
    h.defer(lambda: os.path.isdir(cg) and os.rmdir(cg))
    c.p.send_signal(signal.SIGKILL)
    c.p.wait(10)
    c.p.stdin.close()  # the client reads end of file, closes and exits
    h.wait_until(lambda: not open(os.path.join(cg, "cgroup.procs")).read().strip(), 10, 0.05,
                 "the client to leave the killed run's cgroup")
    srv.wait_live(0, timeout=5)
    assert os.path.isdir(cg) and os.path.exists(pin_dir(s))
    return cg


def test_views_detach_removes_what_a_killed_run_left():
    """run --kernel killed with SIGKILL: detach removes the empty cgroup it
    made and the engine's pins, and says so."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 2}])
    cg = killed_run(s, srv)
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True,
                       env=h.clean_env(), timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "removed cgroup %s" % cg in r.stdout, r.stdout
    assert not os.path.exists(cg), "the killed run's cgroup is still there"
    assert not os.path.exists(pin_dir(s)), os.listdir(pin_dir(s))
    s.expect("db", admitted=1, kernel=False)


def test_views_detach_keeps_a_killed_runs_cgroup_that_has_processes():
    """run --kernel killed while its client still runs: detach leaves the
    cgroup (a process is in it) and says so."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 2}])
    c = Client([h.CLI, "run", "--kernel", "-c", s.config, "--", helper("kclient_static"),
                "127.0.0.1", str(srv.port), "1"])
    assert c.until_held() == (1, []), c.lines
    cg = os.path.join(cgroup2(), "bulkshim.%s.%d" % (s.segment, c.p.pid))
    h.defer(lambda: os.path.isdir(cg) and os.rmdir(cg))
    c.p.send_signal(signal.SIGKILL)
    c.p.wait(10)
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True,
                       env=h.clean_env(), timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "still has processes: it is kept" in r.stdout, r.stdout
    assert os.path.isdir(cg)
    c.p.stdin.close()
    h.wait_until(lambda: not open(os.path.join(cg, "cgroup.procs")).read().strip(), 10, 0.05,
                 "the client to end")


def test_views_next_run_removes_what_a_killed_run_left():
    """run --kernel killed with SIGKILL: the next run --kernel of the same
    segment removes the cgroup and links it left, says so, and when it ends
    the engine is unloaded."""
    need_kernel()
    srv = h.Server()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:%d" % srv.port],
                "max_connections": 2}])
    cg = killed_run(s, srv)
    r = subprocess.run([h.CLI, "run", "--kernel", "-c", s.config, "--", "true"],
                       capture_output=True, text=True, env=h.clean_env(), timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "removed cgroup %s" % cg in r.stderr, r.stderr
    assert not os.path.exists(cg), "the killed run's cgroup is still there"
    assert not os.path.exists(pin_dir(s)), os.listdir(pin_dir(s))
    s.expect("db", admitted=1, in_use=0, kernel=False)


def test_views_next_run_removes_links_to_a_cgroup_that_is_gone():
    """The engine attached to a cgroup that is then removed: its pinned
    links keep the engine loaded; the next run --kernel removes them, says
    so, and unloads the engine when it ends."""
    need_kernel()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:1"], "max_connections": 2}])
    cg = os.path.join(cgroup2(), h.unique("bs-gone-"))
    os.mkdir(cg)
    attach(s, cg)
    os.rmdir(cg)
    # The kernel lets go of a removed cgroup's links a moment later.
    link = [os.path.join(pin_dir(s), f) for f in os.listdir(pin_dir(s))
            if f.endswith("_connect4")][0]
    bpftool = shutil.which("bpftool")
    if bpftool is None:
        raise h.Skip("bpftool is needed to see the kernel let go of the link")
    h.wait_until(lambda: "cgroup_id 0 " in subprocess.run(
        [bpftool, "link", "show", "pinned", link], capture_output=True, text=True).stdout,
        15, 0.1, "the kernel to let go of the removed cgroup's link")
    r = subprocess.run([h.CLI, "run", "--kernel", "-c", s.config, "--", "true"],
                       capture_output=True, text=True, env=h.clean_env(), timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "which no longer exists" in r.stderr, r.stderr
    assert not os.path.exists(pin_dir(s)), os.listdir(pin_dir(s))


def test_views_watch_marks_the_engine():
    """watch marks the row of a compartment the engine counts (krn), and
    not the one it does not, within 80 columns."""
    need_kernel()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:1"], "max_connections": 2}])
    cg = cgroup()
    attach(s, cg)
    w = subprocess.run([h.CLI, "watch", "-s", s.segment, "-n", "1"], capture_output=True,
                       text=True, env=dict(h.clean_env(), TERM="dumb"), timeout=30)
    assert w.returncode == 0, w.stderr
    rows = [l for l in w.stdout.splitlines() if l.startswith("db ")]
    assert rows and rows[0].split()[1] == "krn", w.stdout
    assert all(len(l) <= 80 for l in w.stdout.splitlines()), w.stdout
    subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, env=h.clean_env(),
                   timeout=30)
    w = subprocess.run([h.CLI, "watch", "-s", s.segment, "-n", "1"], capture_output=True,
                       text=True, env=dict(h.clean_env(), TERM="dumb"), timeout=30)
    assert "krn" not in w.stdout, w.stdout


def test_views_metrics_mark_the_engine():
    """With the engine attached (and no preloaded process at all), metrics
    say bulkshim_kernel_attached 1 and mark the compartment the engine
    counts; status --json says kernel. Detached, all of it goes back to 0."""
    need_kernel()
    s = kshim([{"name": "db", "destinations": ["127.0.0.1:1"], "max_connections": 2}])
    cg = cgroup()
    attach(s, cg)
    m = metrics(s)
    assert sample(m, "bulkshim_processes", segment=s.segment) == "0", m
    assert sample(m, "bulkshim_kernel_attached", segment=s.segment) == "1", m
    assert sample(m, "bulkshim_compartment_kernel", segment=s.segment,
                  compartment="db") == "1", m
    s.expect("db", kernel=True)
    r = subprocess.run([h.CLI, "detach", "-c", s.config], capture_output=True, text=True,
                       env=h.clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    m = metrics(s)
    assert sample(m, "bulkshim_kernel_attached", segment=s.segment) == "0", m
    assert sample(m, "bulkshim_compartment_kernel", segment=s.segment,
                  compartment="db") == "0", m
    s.expect("db", kernel=False)
