"""test_docs.py - the documentation keeps up with the code: config keys, example configs, the
usage text against bulkshim(1), the README's commands, how bulkshim.conf(5) says to change a
limit."""

import glob
import os
import re

from harness import CLI, ROOT, clean_env, need_built, new_segment, run
from harness_cli import cli, cli_fails, config_file, create_segment

KEY_ARRAY = re.compile(r"static const char \*const (\w+_keys)\[\] = \{(.*?)\};", re.S)


def parser_keys():
    """Every key the config parser accepts, read from its known-key lists."""
    keys = {}
    for path in glob.glob(os.path.join(ROOT, "shim", "config", "config*.c")):
        with open(path) as f:
            for name, body in KEY_ARRAY.findall(f.read()):
                for k in re.findall(r'"([A-Za-z_]+)"', body):
                    keys[k] = "%s (%s)" % (name, os.path.basename(path))
    return keys


def test_every_config_key_the_parser_accepts_is_in_bulkshim_conf_5():
    keys = parser_keys()
    # The lists the parser checks unknown keys against: top level, budget,
    # compartment. If they move or are renamed this test must follow.
    assert {"compartments", "pool", "max_inflight", "class_limits"} <= set(keys), \
        "found only these parser keys: %s" % sorted(keys)
    with open(os.path.join(ROOT, "man", "bulkshim.conf.5")) as f:
        page = f.read()
    missing = sorted(k for k in keys if not re.search(r"(?<![A-Za-z_])%s(?![A-Za-z_])" % k, page))
    assert not missing, "config keys missing from man/bulkshim.conf.5: %s" % ", ".join(
        "%s from %s" % (k, keys[k]) for k in missing)


def test_every_example_config_is_valid():
    need_built(CLI)
    cfgs = sorted(glob.glob(os.path.join(ROOT, "configs", "*.cfg")))
    assert len(cfgs) >= 3, "want the example configs in configs/, found %r" % cfgs
    for path in cfgs:
        r = run([CLI, "check", "-q", path], clean_env(), timeout=30)
        assert r.returncode == 0, "%s does not pass `bulkshim check`: %s" % (
            os.path.basename(path), (r.stderr or r.stdout).strip())


def _man_synopsis():
    """The SYNOPSIS lines of man/bulkshim.1 as plain text."""
    text = open(os.path.join(ROOT, "man", "bulkshim.1")).read()
    body = text.split(".SH SYNOPSIS\n", 1)[1].split("\n.SH ", 1)[0]
    body = body.split(".nf\n", 1)[1].split("\n.fi", 1)[0]
    lines = []
    for l in body.splitlines():
        l = re.sub(r"\\f[BIRP]", "", l).replace("\\-", "-").replace("\\&", "").replace("\\e", "\\")
        lines.append(l.strip())
    return lines


def test_usage_matches_man_synopsis_and_every_command_has_help():
    r = cli("--help")
    assert r.returncode == 0, "bulkshim --help exited %d" % r.returncode
    usage = [l.strip() for l in re.sub(r"^usage:", "", r.stdout).splitlines()]
    man = _man_synopsis()
    assert usage == man, "usage() and the SYNOPSIS of bulkshim(1) differ:\nusage: %r\nman:   %r" % (
        usage, man)
    commands = [l.split()[1] for l in usage if not l.startswith("bulkshim --")]
    assert set(commands) >= {"run", "status", "watch", "metrics", "serve", "check", "set", "reload",
                             "reset", "size", "suggest", "list"}, commands
    for cmd in commands:
        h = cli(cmd, "--help")
        assert h.returncode == 0, "bulkshim %s --help exited %d: %r" % (cmd, h.returncode, h.stderr)
        first = h.stdout.splitlines()[0].replace("usage: ", "")
        assert first in usage, "bulkshim %s --help says %r, not a usage line" % (cmd, first)
    cli_fails(status=2, want=r"usage: bulkshim run")
    cli_fails("frobnicate", status=2, want=r"unknown command \"frobnicate\"")
    cli_fails("status", "--bogus", status=2, want=r"usage: bulkshim status")
    err = cli_fails("status", "-s", new_segment(), status=1, want=r"cannot open segment")
    assert "usage" not in err


def test_readme_set_and_reload_examples_run():
    """Each `set ...`/`reload ...` the README shows parses (against a live segment)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    spans = sorted(set(re.findall(r"`((?:set|reset|reload|status|suggest|metrics|rm|prune) "
                                  r"[^`]*)`", text)))
    assert any(s.startswith("set ") for s in spans), spans
    seg = new_segment()
    config = config_file(seg, [{"name": n, "destinations": ["127.0.0.%d:1" % (i + 2)],
                         "max_connections": 30} for i, n in enumerate(
                             ("payments", "recommendations", "COMPARTMENT"))])
    create_segment(config)
    for span in spans:
        if span.startswith(("rm ", "prune ")) or "FILE" in span and "-c FILE" not in span:
            continue
        words = span.replace("-s shop", "-s " + seg).replace("-c FILE", "-c " + config).split()
        if words[0] in ("set", "reset", "status", "suggest", "metrics") and "-s" not in words \
                and "-c" not in words:
            words.insert(1, "-s")
            words.insert(2, seg)
        if words[0] == "reload" and "-c" not in words:
            continue
        words = [w.replace("on|off", "on") for w in words]
        if "KEY" in words or "SEGMENT" in words:
            continue
        r = cli(*words)
        assert r.returncode != 2, "the README's `%s` is a usage error: %s" % (span, r.stderr)


def test_conf5_says_how_to_change_a_limit_live():
    """bulkshim.conf(5) points at reload and set, not only at a restart."""
    page = open(os.path.join(ROOT, "man", "bulkshim.conf.5")).read()
    files = page.split(".SH FILES", 1)[1].split("\n.SH ", 1)[0]
    assert "change the file and restart" not in page.replace("\n", " ")
    assert "bulkshim reload" in files and "bulkshim set" in files, files
    seg = page.split("\n.B segment\n", 1)[1].split("\n.TP", 1)[0]
    assert "/etc/a/bulkshim.cfg" in seg and "warns" in seg, "the naming rule is not documented"
