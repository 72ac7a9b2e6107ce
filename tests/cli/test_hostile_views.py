"""test_hostile_views.py - what status, watch and metrics print of a segment somebody wrote into.

Names in the segment are shown as a config could have given them and other
text without its control characters; values that cannot be true (above the
socket table, settings no config gives, counters beyond 2^53) are shown as
damaged instead of as numbers: "damaged" in the text views with a WARNING
line, null and a "damaged" list in --json, no sample but the
bulkshim_segment_damaged gauge in metrics.
"""

import json
import random
import re
import subprocess

from harness import CLI, clean_env, new_segment, write_file
from harness_cli import cli_json, cli_ok, create_segment, need_tool, poke, sample
from harness_hard import Segment

FORGED = b"a\nbulkshim[1]: FORGED\x1b[31m\x07"
SHOWN = "a?bulkshim?1???FORGED??31m?"
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")    # all but the newline
HUGE = 2340651807            # a class IN USE seen in the wild
COUNTER = 1 << 62


def _segment():
    """A segment of two compartments, "web" (a class "batch") and "db" in a
    pool "shared", created as the shim does, nobody attached."""
    seg = new_segment()
    config = write_file(
        'segment = "%s";\nclasses = { batch = [ "report-*" ]; };\n'
        'pools = ( { name = "shared"; size = 6; } );\ncompartments = (\n'
        '  { name = "web"; destinations = [ "127.0.0.1:9" ]; max_connections = 4; '
        'class_limits = { batch = 2; }; },\n'
        '  { name = "db"; destinations = [ "127.0.0.1:10" ]; max_connections = 3; '
        'pool = "shared"; guaranteed = 1; }\n);\n' % seg)
    create_segment(config)
    return seg


def _write(segment, fn):
    s = Segment(segment)
    try:
        fn(s)
    finally:
        s.close()


def _forge_names(s):
    L = s.L
    off, size = L["seg_comp.name"]
    s.write_text(s.comp_base(0) + off, size, FORGED)
    off, size = L["seg_header.class_name"]
    s.write_text(off + size // 8, size // 8, FORGED)     # class 1, "batch"
    off, size = L["seg_pool.name"]
    s.write_text(L["seg_header.pools"][0] + off, size, FORGED)
    off, size = L["seg_header.name"]
    s.write_text(off, size, b"seg\x1b]0;owned\x07")
    s.hset("unprotected", 1)
    off, size = L["seg_header.unprotected_why"]
    s.write_text(off, size, b"pid 1: evil\n\x1b[2Jcleared")


def _views(segment):
    """status, status --json, metrics and one plain frame of watch."""
    return (cli_ok("status", "-s", segment), cli_json("status", "-s", segment, "--json"),
            cli_ok("metrics", "-s", segment),
            cli_ok("watch", "-s", segment, "-n", "1", env=dict(clean_env(), TERM="dumb")))


def _printable(what, text):
    m = CONTROL.search(text)
    assert m is None, "%s prints the control character %r: %r" % (what, m.group(0), text[:3000])


def _promtool(text):
    promtool = need_tool("promtool", "prometheus")
    if promtool is None:
        return
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=30)
    # promtool lints (a counter without _total...) exit 1 too; syntax errors
    # are what matter here.
    assert "error" not in (r.stdout + r.stderr).lower(), "promtool: %s%s" % (r.stdout, r.stderr)


def test_forged_names_and_texts_are_shown_sanitised_by_every_view():
    seg = _segment()
    _write(seg, _forge_names)
    text, js, metrics, watch = _views(seg)
    for what, out in (("status", text), ("metrics", metrics), ("watch", watch),
                      ("status --json", json.dumps(js, ensure_ascii=False))):
        _printable(what, out)
        assert "bulkshim[1]: FORGED" not in out, "%s prints the forged name raw" % what
    for line in text.splitlines():
        assert not line.startswith("bulkshim[1]"), "status prints a forged line: %r" % text
    assert "%s " % SHOWN in text and "class %s:" % SHOWN in text and "\n%s " % SHOWN in text, text
    assert "evil??[2Jcleared" in text, text
    assert "seg??0?owned?" in text, text
    web, db = js["compartments"]
    assert web["name"] == SHOWN and "name" in web["damaged"], web
    assert web["classes"][0]["name"] == SHOWN and "name" in web["classes"][0]["damaged"], web
    assert db["pool"] == SHOWN and "name" in db["damaged"], db
    assert js["pools"][0]["name"] == SHOWN and "name" in js["pools"][0]["damaged"], js["pools"]
    assert js["segment"] == "seg??0?owned?" and js["damaged"] == ["segment"], js
    assert js["unprotected_last"] == "pid 1: evil??[2Jcleared", js
    assert sample(metrics, "bulkshim_compartment_limit", compartment=SHOWN) == 4
    for line in metrics.splitlines():
        assert line.startswith("#") or re.fullmatch(
            r'[a-z_]+\{(\w+="[A-Za-z0-9_.+?-]*",?)+\} [-+0-9.Inf]+', line), \
            "not a valid sample: %r" % line
    _promtool(metrics)


def test_impossible_values_are_shown_as_damaged_not_as_numbers():
    seg = _segment()
    poke(seg, "web", admitted=COUNTER, **{"rejected_by[0]": COUNTER})
    poke(seg, "db", limit=0)

    def fn(s):
        s.cset(0, "in_use", HUGE)
        s.cset(0, "waiting", 0xffffffff)
        s.class_set(0, 1, "in_use", HUGE)
        s.pool_set(0, "lent", HUGE)
    _write(seg, fn)
    text, js, metrics, watch = _views(seg)
    for what, out in (("status", text), ("metrics", metrics), ("watch", watch)):
        assert str(HUGE) not in out and "2,340,651,807" not in out and str(COUNTER) not in out \
            and "4294967295" not in out, "%s prints an impossible number:\n%s" % (what, out)
    # status may also warn that no program attached to the segment (it was
    # made by the test's writer): that line is not this test's.
    warn = [l for l in text.splitlines() if l.startswith("WARNING:") and "damaged" in l]
    assert len(warn) == 1 and "segment %s (/dev/shm/bulkshim.%s) is damaged" % (seg, seg) in \
        warn[0], text
    for field in ("compartment web: in_use, waiting, admitted, rejected_by",
                  "compartment web class batch: in_use", "compartment db: limit, live_limit",
                  "pool shared: lent"):
        assert field in warn[0], "the WARNING does not name %r: %r" % (field, warn[0])
    row = [l.split() for l in text.splitlines() if l.startswith("web ")][0]
    assert row[1:5] == ["damaged", "4", "0", "damaged"], row
    assert [l.split()[2] for l in text.splitlines() if l.startswith("db ")] == ["damaged"], text
    assert "web class batch: damaged/2 in use" in text and "web rejected: damaged" in text, text

    web, db = js["compartments"]
    assert web["in_use"] is None and web["waiting"] is None and web["admitted"] is None, web
    assert web["rejected_by"] is None and web["limit"] == 4, web
    assert web["damaged"] == ["in_use", "waiting", "admitted", "rejected_by"], web
    assert web["classes"][0]["in_use"] is None and web["classes"][0]["damaged"] == ["in_use"]
    assert db["limit"] is None and db["unlimited"] is None and db["ceiling"] is None, db
    assert db["damaged"] == ["limit", "live_limit"], db
    assert js["pools"][0]["lent"] is None and js["pools"][0]["damaged"] == ["lent"], js["pools"]
    assert js["damaged"] == [] and js["damaged_total"] == 8, js

    lab = {"segment": seg, "compartment": "web"}
    assert sample(metrics, "bulkshim_segment_damaged", segment=seg) == 8
    assert sample(metrics, "bulkshim_compartment_damaged", **lab) == 5
    assert sample(metrics, "bulkshim_compartment_damaged", segment=seg, compartment="db") == 2
    for family in ("bulkshim_compartment_in_use", "bulkshim_compartment_waiting",
                   "bulkshim_admitted_total", "bulkshim_rejections_total"):
        assert not [l for l in metrics.splitlines() if l.startswith(family + "{") and
                    'compartment="web"' in l], "%s has a sample of web:\n%s" % (family, metrics)
    assert sample(metrics, "bulkshim_compartment_limit", **lab) == 4
    assert sample(metrics, "bulkshim_compartment_in_use", segment=seg, compartment="db") == 0
    assert not [l for l in metrics.splitlines() if l.startswith("bulkshim_compartment_limit{") and
                'compartment="db"' in l], metrics
    _promtool(metrics)
    frame = [l for l in watch.splitlines() if l.startswith("web ")]
    assert frame and "damaged" in frame[0] and "[????" in frame[0], watch
    assert "WARNING: segment %s" % seg in watch, watch


def test_a_sound_segment_shows_nothing_damaged():
    seg = _segment()
    text, js, metrics, watch = _views(seg)
    assert "damaged" not in text and "damaged" not in watch, text
    assert js["damaged"] == [] and js["damaged_total"] == 0, js
    for c in js["compartments"]:
        assert c["damaged"] == [] and all(k["damaged"] == [] for k in c["classes"]), c
        assert c["in_use"] == 0 and c["waiting"] == 0, c
    assert js["pools"][0]["damaged"] == [], js
    assert sample(metrics, "bulkshim_segment_damaged", segment=seg) == 0
    assert sample(metrics, "bulkshim_compartment_in_use", segment=seg, compartment="web") == 0


def test_fuzzed_compartments_never_show_a_count_the_tables_cannot_hold():
    # Random bytes over every field of both compartments but their names:
    # whatever the views print is either damaged or possible.
    seg = _segment()
    nslots = [0]
    for seed in range(8):
        rnd = random.Random(seed)

        def fn(s):
            L = s.L
            nslots[0] = s.hget("nslots")
            start = L["seg_comp.limit"][0]
            for i in range(2):
                base = s.comp_base(i)
                s.m[base + start:base + L["sizeof.seg_comp"]] = bytes(
                    rnd.getrandbits(8) for _ in range(L["sizeof.seg_comp"] - start))
        _write(seg, fn)
        text, js, metrics, watch = _views(seg)
        n = nslots[0]
        assert js["damaged_total"] > 0, "seed %d: nothing damaged in random bytes" % seed
        for c in js["compartments"]:
            for key, most in (("in_use", n), ("over", n), ("waiting", n), ("inflight", 2 * n),
                              ("peak", 2 * n), ("inflight_peak", n), ("limit", 1000000),
                              ("inflight_limit", 1000000), ("admitted", 2 ** 53),
                              ("rejected", 2 ** 53), ("reclaimed", 2 ** 53)):
                v = c[key]
                assert (v is None) == (key in c["damaged"]), \
                    "seed %d: %s %s is %r, damaged %r" % (seed, c["name"], key, v, c["damaged"])
                assert v is None or 0 <= v <= most, "seed %d: %s %s = %r" % (seed, c["name"], key, v)
            for k in c["classes"]:
                assert k["in_use"] is None or k["in_use"] <= n, (seed, k)
            for key in ("adaptive", "fleet_limit"):
                assert key not in c["damaged"] or c[key] is None, (seed, key, c)
        # Whatever is not damaged is a count a 32-bit word of the segment
        # can hold: no table (adaptive, fleet, pools) shows more.
        for what, out in (("status", text), ("watch", watch)):
            big = [int(x) for x in re.findall(r"\d+", out) if int(x) >= 1 << 32]
            assert not big, "seed %d: %s prints %r:\n%s" % (seed, what, big, out)
        lines = text.splitlines()
        head = [i for i, l in enumerate(lines) if l.startswith("COMPARTMENT") and "IN USE" in l]
        for line in lines[head[0] + 1:head[0] + 3]:
            cell = line.split()[1]
            assert cell == "damaged" or int(cell) <= n, "seed %d: %r" % (seed, line)
        for family in ("bulkshim_compartment_in_use", "bulkshim_compartment_waiting"):
            for line in metrics.splitlines():
                if line.startswith(family + "{"):
                    assert float(line.rsplit(" ", 1)[1]) <= n, "seed %d: %r" % (seed, line)
        assert sample(metrics, "bulkshim_segment_damaged", segment=seg) == js["damaged_total"]


def test_set_and_reset_print_forged_names_as_a_config_could_have_given_them():
    """set (every compartment, and an unknown one: the list of those there are) and reset
    print the segment's names without their control characters."""
    seg = _segment()
    _write(seg, _forge_names)
    outs = [subprocess.run([CLI] + args, capture_output=True, text=True,
                           timeout=20, env=clean_env())
            for args in (["set", "-s", seg, "--all", "max_connections", "3"],
                         ["set", "-s", seg, "nosuch", "max_connections", "3"],
                         ["reset", "-s", seg])]
    text = "".join(r.stdout + r.stderr for r in outs)
    _printable("set/reset", text)
    assert SHOWN in text and "FORGED\x1b" not in text, text
