"""test_exports.py - the library exports exactly the libc names it interposes."""

import os
import re
import shutil
import subprocess
import tempfile

from harness import LIB, ROOT, need_built



def names_h():
    with open(os.path.join(ROOT, "shim", "interpose", "names.h")) as f:
        return f.read()


def interposed():
    """The names the library exports, from the one list of them: shim/interpose/names.h's
    BS_NAMES (the symbol of each X(...) line) and, for this machine, BS_NAMES_ONLY."""
    text = names_h()
    names = set(re.findall(r"X\((?:TRAMP|HAND),\s*\w+,\s*(\w+),", text))
    machine = os.uname().machine
    only = re.search(r"#if defined\(__x86_64__\)\n#define BS_NAMES_ONLY\(Y\)\s*(.*)\n#elif defined"
                     r"\(__aarch64__\)\n#define BS_NAMES_ONLY\(Y\)\s*(.*)\n", text)
    assert only, "names.h: BS_NAMES_ONLY not found where the test looks for it"
    only = only.group(1 if machine == "x86_64" else 2) if machine in ("x86_64", "aarch64") else ""
    names |= set(re.findall(r"Y\((\w+)\)", only))
    assert {"connect", "close", "__recv_chk", "syscall"} <= names, "names.h gives only %s" % sorted(names)
    return names


INTERPOSED = interposed()
# Symbols the linker adds on its own.
LINKER = {"_init", "_fini", "_edata", "_end", "__bss_start"}


def test_library_exports_only_interposed_names():
    need_built(LIB)
    r = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, "nm failed: %s" % r.stderr
    names = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            names[parts[2].split("@")[0]] = parts[1]
    extra = sorted(set(names) - INTERPOSED - LINKER)
    assert not extra, "exported beyond the interposed names: %s" % ", ".join(
        "%s (%s)" % (n, names[n]) for n in extra)
    missing = sorted(INTERPOSED - set(names))
    assert not missing, "interposed names not exported: %s" % ", ".join(missing)
    notfunc = sorted(n for n in INTERPOSED if names[n] not in ("T", "W", "i"))
    assert not notfunc, "exported but not as functions: %s" % ", ".join(
        "%s (%s)" % (n, names[n]) for n in notfunc)


def test_man_page_lists_exactly_the_interposed_names():
    """libbulkshim(7)'s "Interposed functions" names what names.h lists, on any machine."""
    text = names_h()
    every = set(re.findall(r"X\((?:TRAMP|HAND),\s*\w+,\s*(\w+),", text))
    for line in re.findall(r"#define BS_NAMES_ONLY\(Y\)(.*)", text):
        every |= set(re.findall(r"Y\((\w+)\)", line))
    with open(os.path.join(ROOT, "man", "libbulkshim.7")) as f:
        page = f.read()
    section = re.search(r"^\.SS Interposed functions\n(.*?)^\.S[HS] ", page, re.S | re.M)
    assert section, "libbulkshim.7: no .SS Interposed functions section"
    listed = set(re.findall(r"^\.BR? (\w+)", section.group(1), re.M))
    assert listed == every, "libbulkshim.7 lists %s more and %s fewer than names.h" % (
        sorted(listed - every), sorted(every - listed))


def test_cflags_given_on_the_command_line_still_build_the_library_cleanly():
    """`make CFLAGS=...` replaces the Makefile's CFLAGS: what the code needs (-D_GNU_SOURCE,
    -fPIC, the warnings) is added to it all the same, and the library builds without a
    warning and exports the same names."""
    out = tempfile.mkdtemp(prefix="bs-cflags-")
    try:
        lib = os.path.join(out, "libbulkshim.so")
        r = subprocess.run(["make", "-s", "-C", ROOT, "B=" + out, "CFLAGS=-O1 -g", lib],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, "make CFLAGS=-O1 failed:\n%s" % r.stderr[-3000:]
        assert "warning:" not in r.stderr, "make CFLAGS=-O1 warned:\n%s" % r.stderr[-3000:]
        nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                            timeout=30)
        names = {line.split()[2].split("@")[0] for line in nm.stdout.splitlines()
                 if len(line.split()) >= 3}
        assert names - LINKER == INTERPOSED, "exports differ: %s" % sorted(names ^ INTERPOSED)
    finally:
        shutil.rmtree(out, ignore_errors=True)
