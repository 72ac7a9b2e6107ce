"""test_exports.py - the library exports exactly the libc names it interposes."""

import subprocess

from harness import LIB, need_built

INTERPOSED = {"connect", "close", "dup", "dup2", "dup3", "fcntl", "fcntl64", "close_range",
              "closefrom", "fclose", "fork", "vfork", "_Fork", "clone", "socket", "accept", "accept4", "sendto", "sendmsg",
              "getaddrinfo",
              # The send and receive families, for requests in flight.
              "send", "write", "writev", "sendmmsg", "sendfile", "sendfile64", "recv", "recvfrom",
              "recvmsg", "recvmmsg", "read", "readv", "__recv_chk", "__recvfrom_chk", "__read_chk",
              # libuv closes through syscall(); RTLD_DEEPBIND loads are bound back.
              "syscall", "dlopen", "dlmopen"}
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
