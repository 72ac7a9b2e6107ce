#!/usr/bin/env python3
"""run.py - runs the integration tests, each in its own process group with a time limit.

usage: run.py [-v] [-t SECONDS] [FOLDER...] [FILTER...]

Discovers test_*.py in each subject folder of tests/ (preload, cli,
kernel, fleet, web, docs) and runs every function named test_* in each, in
folder, file and definition order. A FOLDER argument (a path to one of
those folders, such as tests/cli) limits the run to the folders named;
FILTERs keep the tests whose "module.function" name contains one of them.
Module names are unique across the folders, so a name says which file a
test is in. Each test runs in a child process of its own (so a hang, a
stray thread or a crash stays there), with its own folder and tests/lib on
its import path; the child's process group is killed when the test ends or
overruns its limit (default 60 s, or BULKSHIM_TEST_TIMEOUT; a test whose
function has a time_limit attribute gets that many seconds if more). Prints
"ok NAME (0.12s)" or "FAIL NAME: reason" per test ("skip NAME: why" for a
test that raised harness.Skip), then "N passed, M failed"; exits 1 if any
failed, and 2 for an argument that looks like a folder but is none.
"""

import glob
import importlib
import inspect
import os
import signal
import subprocess
import sys
import time
import traceback

LIB = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(LIB)
SUBJECTS = ("preload", "cli", "kernel", "fleet", "web", "docs")
REASON = "@@reason "
SKIP = "@@skip "
SKIPPED = 77  # the child's exit status for a skipped test


def folder_of(arg):
    """The subject folder an argument names (tests/cli, tests/cli/, or an
    absolute path to it), or None when it is a name filter."""
    path = os.path.realpath(arg)
    for s in SUBJECTS:
        if path == os.path.realpath(os.path.join(TESTS, s)):
            return s
    return None


def discover(subjects=SUBJECTS):
    """[(folder, module, function, time limit or None)] in folder, file, then definition order,
    and [(module, error)] for the modules that cannot be imported or whose
    name another folder uses too."""
    sys.path.insert(0, LIB)
    found, broken, seen = [], [], {}
    for s in SUBJECTS:
        for path in sorted(glob.glob(os.path.join(TESTS, s, "test_*.py"))):
            name = os.path.splitext(os.path.basename(path))[0]
            if name in seen:
                broken.append((name, "tests/%s/%s.py has the name of tests/%s/%s.py" % (
                    s, name, seen[name], name)))
                continue
            seen[name] = s
            if s not in subjects:
                continue
            sys.path.insert(0, os.path.join(TESTS, s))
            try:
                mod = importlib.import_module(name)
            except Exception as e:
                broken.append((name, "cannot import: %s: %s" % (type(e).__name__, e)))
                continue
            finally:
                sys.path.remove(os.path.join(TESTS, s))
            fns = [(f.__code__.co_firstlineno, n, getattr(f, "time_limit", None))
                   for n, f in vars(mod).items()
                   if n.startswith("test_") and inspect.isfunction(f) and f.__module__ == name]
            found += [(s, name, n, t) for _, n, t in sorted(fns)]
    return found, broken


def run_one(subject, module, func):
    """Child mode: runs one test and its cleanups; exit status 0 = passed."""
    sys.path[:0] = [os.path.join(TESTS, subject), LIB]
    import harness
    ok = False
    try:
        fn = getattr(importlib.import_module(module), func)
        fn()
        ok = True
    except harness.Skip as e:
        harness.cleanup()
        print(SKIP + str(e), flush=True)
        os._exit(SKIPPED)
    except BaseException as e:
        traceback.print_exc()
        msg = str(e).strip().replace("\n", " | ") or type(e).__name__
        reason = "%s: %s" % (type(e).__name__, msg) if not isinstance(e, AssertionError) else msg
    finally:
        harness.cleanup()
    sys.stdout.flush()
    sys.stderr.flush()
    if not ok:
        print(REASON + reason[:400], flush=True)
    os._exit(0 if ok else 1)


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def leftovers(pid):
    """Removes what a killed test could not clean: its segments and temp files."""
    tag = "t%d_" % pid
    for path in glob.glob("/dev/shm/bulkshim." + tag + "*") + glob.glob("/tmp/bs-" + tag + "*"):
        try:
            os.unlink(path)
        except OSError:
            pass
    for path in glob.glob("/tmp/bulkshim-t%d-*" % pid):
        subprocess.run(["rm", "-rf", path])


def main(argv):
    verbose = False
    limit = float(os.environ.get("BULKSHIM_TEST_TIMEOUT", "60"))
    filters, subjects = [], []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--one":
            run_one(args[0], args[1], args[2])
        elif a == "-v":
            verbose = True
        elif a == "-t":
            limit = float(args.pop(0))
        elif folder_of(a):
            subjects.append(folder_of(a))
        elif os.sep in a:
            print("run.py: %s is not a folder of tests (%s)" % (a, ", ".join(
                "tests/" + s for s in SUBJECTS)), file=sys.stderr)
            return 2
        else:
            filters.append(a)
    found, broken = discover(subjects or SUBJECTS)
    tests = [(s, m, f, t) for s, m, f, t in found
             if not filters or any(x in "%s.%s" % (m, f) for x in filters)]
    passed = failed = skipped = 0
    for module, why in broken:
        if not filters or any(x in module for x in filters):
            failed += 1
            print("FAIL %s: %s" % (module, why), flush=True)
    for subject, module, func, own in tests:
        name = "%s.%s" % (module, func)
        t0 = time.monotonic()
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--one", subject, module,
                              func],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, errors="replace")
        try:
            out, _ = p.communicate(timeout=max(limit, own or 0))
            reason = None
            if p.returncode == SKIPPED:
                lines = [l for l in out.splitlines() if l.startswith(SKIP)]
                skipped += 1
                print("skip %s: %s" % (name, lines[-1][len(SKIP):] if lines else "?"), flush=True)
                kill_group(p.pid)
                leftovers(p.pid)
                continue
            if p.returncode != 0:
                lines = [l for l in out.splitlines() if l.startswith(REASON)]
                reason = lines[-1][len(REASON):] if lines else "exit status %d" % p.returncode
        except subprocess.TimeoutExpired:
            kill_group(p.pid)
            out, _ = p.communicate()
            reason = "timed out after %gs" % max(limit, own or 0)
        kill_group(p.pid)
        leftovers(p.pid)
        dt = time.monotonic() - t0
        if reason is None:
            passed += 1
            print("ok %s (%.2fs)" % (name, dt), flush=True)
            shown = out if verbose else ""
        else:
            failed += 1
            print("FAIL %s: %s" % (name, reason), flush=True)
            shown = out
        body = [l for l in shown.splitlines() if not l.startswith(REASON)]
        if len(body) > 60:
            body = body[:10] + ["..."] + body[-49:]
        for l in body:
            print("    " + l)
        sys.stdout.flush()
    if skipped:
        print("%d skipped" % skipped)
    print("%d passed, %d failed" % (passed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
