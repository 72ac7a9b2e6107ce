"""test_hostile_text.py - text written into a segment never reaches the shim's logs raw.

Anybody who may write a segment may write its names. A compartment, class
or pool name rewritten under a running program (or left in a segment that
a program then attaches to) must be logged as a config could have given
it, each other character replaced by '?', and no line the shim writes, as
text or as JSON, may hold a control character or start a line of its own.
"""

import json
import re
import time

from harness import Agent, Server, Shim
from harness_cli import config_text
from harness_hard import Segment, env_for, probe

# What an attacker wrote (short enough for a class name): a newline that
# starts a forged line of the shim's own form, a terminal escape, a bell.
FORGED = b"a\nbulkshim[1]: FORGED\x1b[31m\x07"
# The same as a config could have given it.
SHOWN = "a?bulkshim?1???FORGED??31m?"
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _assert_clean(text):
    """Every line of text is one line of printable text, and none is the
    forged one."""
    assert text.endswith("\n"), "the shim's stderr does not end a line: %r" % text
    for line in text[:-1].split("\n"):
        assert not CONTROL.search(line), "a control character in a log line: %r" % line
        assert not line.startswith("bulkshim[1]:"), "a forged line in the log: %r" % line
    assert "bulkshim[1]: FORGED" not in text, "the forged name reached the log raw: %r" % text


def _json_lines(text):
    """The shim's stderr as JSON objects, one a line; their strings hold no
    control character either once decoded."""
    _assert_clean(text)
    out = []
    for line in text.splitlines():
        obj = json.loads(line)
        for k, v in obj.items():
            assert not (isinstance(v, str) and CONTROL.search(v)), \
                "%s of a JSON line decodes to a control character: %r" % (k, v)
        out.append(obj)
    return out


def _forge(segment, where):
    """Writes FORGED into the name field where ("comp", "class" or "pool")
    of the first compartment, class 1 or the first pool."""
    seg = Segment(segment)
    L = seg.L
    try:
        if where == "comp":
            off, size = L["seg_comp.name"]
            seg.write_text(seg.comp_base(0) + off, size, FORGED)
        elif where == "class":
            off, size = L["seg_header.class_name"]
            each = size // 8    # BS_MAX_CLASSES names of BS_CLASS_NAME_MAX bytes
            seg.write_text(off + each, each, FORGED)
        else:
            off, size = L["seg_pool.name"]
            seg.write_text(L["seg_header.pools"][0] + off, size, FORGED)
    finally:
        seg.close()


def _refused_after_forging(shim, port, where, env_extra=None):
    """Two agents under the shim, one logging text and one JSON, each
    refused once after the name was forged (the first holds the one
    permit); returns their stderr."""
    extra = dict(env_extra or {})
    text = Agent(env_for(shim.config, log="warn", extra=extra))
    js = Agent(env_for(shim.config, log="warn", extra=dict(extra, BULKSHIM_LOG_FORMAT="json")))
    fd = text("tcp(%d)" % port)
    _forge(shim.segment, where)
    for a in (text, js):
        if a is js:
            # Refusal lines are once a second per compartment across the
            # segment's processes: the second agent's comes a second later.
            time.sleep(1.1)
        got = a("attempt(('127.0.0.1', %d))" % port)
        assert not got["ok"], "the full compartment admitted a connect: %r" % got
    text.call("close(%d)" % fd)
    assert text.finish() == 0 and js.finish() == 0
    return text.stderr(), js.stderr()


def _shim(srv, text=None, **keys):
    """A Shim for compartment "web" (max_connections 4 unless keys say
    otherwise) whose config is text (a format of the segment and the port)
    when given."""
    comp = dict({"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                 "max_connections": 4}, **keys)
    shim = Shim([comp])
    if text is not None:
        with open(shim.config, "w") as f:
            f.write(text % (shim.segment, srv.port))
    return shim


def _logged_sanitised(logs, reason, said):
    """Both logs of _refused_after_forging (text, JSON) say `said`, which
    names SHOWN, for one refusal of reason, and nothing raw."""
    text, js = logs
    _assert_clean(text)
    assert said in text, "the text log does not say %r: %r" % (said, text)
    objs = _json_lines(js)
    assert len(objs) == 1 and objs[0]["reason"] == reason, objs
    assert said in objs[0]["message"], objs
    return objs[0]


def test_a_compartment_name_forged_under_a_running_program_is_logged_sanitised():
    srv = Server()
    shim = _shim(srv, max_connections=1)
    obj = _logged_sanitised(_refused_after_forging(shim, srv.port, "comp"), "full",
                            "%s full (1/1): connect to 127.0.0.1:%d refused" % (SHOWN, srv.port))
    assert obj["compartment"] == SHOWN, obj


def test_a_class_name_forged_under_a_running_program_is_logged_sanitised():
    srv = Server()
    shim = _shim(srv, config_text([{"name": "web", "destinations": ["127.0.0.1:%d"],
                                    "max_connections": 4, "class_limits": {"batch": 1}}],
                                  "%s", {"classes": {"batch": ["report-*"]}}))
    _logged_sanitised(_refused_after_forging(shim, srv.port, "class", {"BULKSHIM_CLASS": "batch"}),
                      "class_full", "web: class %s at its limit of 1" % SHOWN)


def test_a_pool_name_forged_under_a_running_program_is_logged_sanitised():
    srv = Server()
    shim = _shim(srv, 'segment = "%s";\npools = ( { name = "db"; size = 1; } );\n'
                 'compartments = ( { name = "web"; destinations = [ "127.0.0.1:%d" ]; '
                 'max_connections = 4; pool = "db"; } );\n')
    _logged_sanitised(_refused_after_forging(shim, srv.port, "pool"), "pool_full",
                      "web: pool %s has lent all 1 of its shared permits" % SHOWN)


def test_a_forged_name_in_a_leftover_segment_is_logged_sanitised_at_attach():
    # Nobody holds the segment: the attach resets its counts and says so,
    # naming the compartment as the segment has it, before it finds that
    # the names are not the file's and makes the segment anew.
    srv = Server("http")
    shim = Shim([{"name": "web", "destinations": ["127.0.0.1:%d" % srv.port],
                  "max_connections": 2}])
    got, r = probe(env_for(shim.config), srv.port, 0)
    assert r.returncode == 0, r.stderr
    _forge(shim.segment, "comp")
    seg = Segment(shim.segment)
    seg.cset(0, "in_use", 5)
    seg.close()
    for fmt in ("text", "json"):
        got, r = probe(env_for(shim.config, log="info", extra={"BULKSHIM_LOG_FORMAT": fmt}),
                       srv.port, 1)
        assert got == ["ok"], (got, r.stderr)
        if fmt == "text":
            _assert_clean(r.stderr)
            assert "compartment %s: in_use was 5 with no process holding anything" % SHOWN \
                in r.stderr, r.stderr
        else:
            msgs = [o["message"] for o in _json_lines(r.stderr)]
            assert any("compartment %s: in_use was 5" % SHOWN in m for m in msgs), msgs
        _forge(shim.segment, "comp")
        seg = Segment(shim.segment)
        seg.cset(0, "in_use", 5)
        seg.close()
