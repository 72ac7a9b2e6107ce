"""test_hostile_web.py - what `bulkshim serve` and its page show of a segment somebody wrote into:
a forged name as a config could have given it (never as markup), impossible values as damaged."""

import json

from harness import new_segment, wait_until, write_file
from harness_cli import Serve, create_segment, sample
from harness_hard import Segment
from test_web import _bar, _browser, _cell, _console_errors

# Markup and a terminal escape in a compartment name.
FORGED = b"<img src=x onerror=\"document.title='owned'\">\x1b[31m"
HUGE = 2340651807


def _shown(raw):
    """raw as the snapshot shows a name: each character a config does not
    accept in a name replaced by '?'."""
    return "".join(chr(c) if chr(c).isalnum() or chr(c) in "_.-" else "?" for c in raw)


def _damaged_segment():
    seg = new_segment()
    create_segment(write_file(
        'segment = "%s";\ncompartments = (\n'
        '  { name = "web"; destinations = [ "127.0.0.1:9" ]; max_connections = 4; },\n'
        '  { name = "ok"; destinations = [ "127.0.0.1:10" ]; max_connections = 3; }\n);\n' % seg))
    s = Segment(seg)
    try:
        off, size = s.L["seg_comp.name"]
        s.write_text(s.comp_base(0) + off, size, FORGED)
        s.cset(0, "in_use", HUGE)
        s.cset(0, "waiting", 0xffffffff)
    finally:
        s.close()
    return seg


def test_serve_answers_sanitised_names_and_damaged_values():
    seg = _damaged_segment()
    name = _shown(FORGED)
    s = Serve("-s", seg)
    code, _, body = s.get("/status.json")
    assert code == 200 and "<img" not in body and "\\u001b" not in body, body
    st = json.loads(body)
    web, ok = st["compartments"]
    assert web["name"] == name and web["in_use"] is None and web["waiting"] is None, web
    assert web["damaged"] == ["name", "in_use", "waiting"] and st["damaged_total"] == 3, web
    assert ok["in_use"] == 0 and ok["damaged"] == [], ok
    code, _, text = s.get("/metrics")
    assert code == 200 and str(HUGE) not in text and "4294967295" not in text, text
    assert sample(text, "bulkshim_segment_damaged", segment=seg) == 3
    assert sample(text, "bulkshim_compartment_in_use", segment=seg, compartment="ok") == 0


def test_page_in_chromium_shows_a_forged_name_as_text_and_damaged_values_as_damaged():
    seg = _damaged_segment()
    name = _shown(FORGED)
    s = Serve("-s", seg)
    b = _browser()
    b.get(s.url + "/")
    wait_until(lambda: _bar(b, seg, name), 10, 0.05, "the row of the forged compartment")
    used, limit, pct, cls, text = _bar(b, seg, name)
    assert (used, limit) == ("damaged", "damaged") and "damaged" in cls.split(), (used, cls)
    assert text == "connections damaged", text
    assert _cell(b, seg, name, "waiting") == "damaged"
    assert _cell(b, seg, name, "peak") == "0"
    assert _bar(b, seg, "ok")[:2] == ["0", "3"]
    warning = b.execute_script(
        "var p = document.querySelector('section[data-segment=\"' + arguments[0] + '\"] "
        "p.damaged'); return p ? p.textContent : null;", seg)
    assert warning and "Segment %s is damaged: 3 values cannot be true" % seg in warning and \
        "compartment %s: name, in_use, waiting" % name in warning, warning
    injected = b.execute_script("return [document.querySelectorAll('img').length, "
                                "document.title];")
    assert injected == [0, "bulkshim"], "the name became markup: %r" % injected
    errors = _console_errors(b)
    assert not errors, "console errors: %s" % json.dumps(errors)
