#!/bin/sh
# deps.sh - installs Debian packages a target needs (apt-get as root): those
# named as arguments, or by default what `make test` needs.
pkgs=""
user=""
need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" || pkgs="$pkgs $1"; }
if [ $# -eq 0 ]; then
	# tests/fleet/test_fleet_owner.py runs the agent as the fleet unit's user, which the
	# package's postinst creates: the same system user and group here.
	getent passwd bulkshim >/dev/null || user=bulkshim
	set -- gcc make pkg-config libconfig-dev uthash-dev libcmocka-dev libhiredis-dev redis-server \
		python3 curl libcurl4-openssl-dev util-linux gnuplot-nox \
		procps tmux prometheus
	# tests/preload/test_runtimes.py: the real-program matrix.
	set -- "$@" nodejs php-cli php-curl php-pgsql postgresql nginx ruby perl wrk \
		default-jdk-headless
	# make deb-test and tests/web/test_web.py: packaging and the browser.
	set -- "$@" build-essential dpkg-dev debhelper lintian adduser systemd chromium chromium-driver \
		python3-selenium
	# tests/kernel/test_kernel.py and chaos -k: the kernel engine and its clients.
	set -- "$@" clang libbpf-dev bpftool golang-go liburing-dev
fi
for p in "$@"; do
	need "$p"
done
[ -z "$pkgs" ] && [ -z "$user" ] && exit 0
mkuser="addgroup --system --quiet bulkshim; adduser --system --quiet --ingroup bulkshim"
mkuser="$mkuser --no-create-home --home /nonexistent bulkshim"
if [ "$(id -u)" != 0 ]; then
	[ -n "$pkgs" ] && echo "bulkshim: missing packages:$pkgs" >&2 &&
		echo "bulkshim: run: sudo apt-get update && sudo apt-get install -y$pkgs" >&2
	[ -n "$user" ] && echo "bulkshim: missing the system user bulkshim; run: sudo sh -c '$mkuser'" >&2
	exit 1
fi
if [ -n "$pkgs" ]; then
	echo "bulkshim: installing$pkgs"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs >/dev/null || {
		echo "bulkshim: apt-get install$pkgs failed" >&2; exit 1; }
fi
if [ -n "$user" ]; then
	echo "bulkshim: adding the system user bulkshim"
	getent group bulkshim >/dev/null || addgroup --system --quiet bulkshim || exit 1
	adduser --system --quiet --ingroup bulkshim --no-create-home --home /nonexistent bulkshim ||
		exit 1
fi
