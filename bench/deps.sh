#!/bin/sh
# deps.sh - installs what `make bench` needs on a fresh Debian machine (apt-get as root).
pkgs=""
need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" || pkgs="$pkgs $1"; }
for p in gcc make pkg-config libconfig-dev haproxy wrk valgrind; do
	need "$p"
done
command -v python3 >/dev/null 2>&1 || need python3
[ -z "$pkgs" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "bulkshim bench: missing packages:$pkgs" >&2
	echo "bulkshim bench: run: sudo apt-get update && sudo apt-get install -y$pkgs" >&2
	exit 1
fi
echo "bulkshim bench: installing$pkgs"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs >/dev/null || {
	echo "bulkshim bench: apt-get install$pkgs failed" >&2; exit 1; }
