"""test_docs.py - the documentation keeps up with the code: config keys, example configs."""

import glob
import os
import re

from harness import CLI, ROOT, clean_env, need_built, run

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
