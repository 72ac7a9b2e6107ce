#!/bin/sh
# can_load.sh - exits 0 if this machine can load the kernel engine, else prints why and exits 1.
if [ "$(id -u)" != 0 ]; then
	echo "the kernel engine needs root (or CAP_BPF + CAP_NET_ADMIN)"; exit 1
fi
if ! awk '$3 == "cgroup2" { found = 1 } END { exit !found }' /proc/self/mounts; then
	echo "no cgroup v2 hierarchy is mounted"; exit 1
fi
v=$(uname -r | cut -d. -f1,2)
if [ "$(printf '%s\n5.9\n' "$v" | sort -V | head -n 1)" != 5.9 ]; then
	echo "Linux $v has no cgroup/sock_release (5.9)"; exit 1
fi
if [ ! -e /sys/kernel/btf/vmlinux ]; then
	echo "the kernel has no BTF (/sys/kernel/btf/vmlinux)"; exit 1
fi
exit 0
