#!/usr/bin/env bash
# demo.sh - replays the incident as a drill: a dependency made slow drains a legacy service without limits, not under them.
#
# Builds nothing (make demo does). Everything runs on 127.0.0.1 with ports the
# kernel picks. Every process it starts gets its own process group, and all of
# them are stopped on exit, Ctrl-C or SIGTERM. See demo/DEMO.md.

set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
	cat <<EOF
usage: demo.sh [--test] [--OPTION VALUE | --OPTION=VALUE ...]

Runs the same load twice against the same shop binary under "bulkshim
run": first without limits (enforce = false: the library counts and refuses
nothing), then with them. In both runs recommendations is made slow by a
drill ("bulkshim drill --delay") against a healthy backend, and each run
ends with the drill's verdict. Prints one table comparing the two, and draws
the checkout latency of both runs into a PNG (when gnuplot is installed).

  --duration S          seconds of load in each run               (DEMO_DURATION, 20)
  --slow-at S           when the drill makes recommendations slow,
                        seconds into each run (at least 1: the
                        drill's baseline window)                  (DEMO_SLOW_AT, 3)
  --slow-ms MS          the drill's delay of each recommendations
                        reply                                     (DEMO_SLOW_MS, 8000)
  --recs-ms MS          recommendations latency before that       (DEMO_RECS_MS, 20)
  --payments-ms MS      payments latency                          (DEMO_PAYMENTS_MS, 5)
  --workers N           shop worker threads                       (DEMO_WORKERS, 32)
  --home-rate R         requests per second on /home              (DEMO_HOME_RATE, 100)
  --checkout-rate R     requests per second on /checkout          (DEMO_CHECKOUT_RATE, 20)
  --recs-limit N        recommendations compartment               (DEMO_RECS_LIMIT, 8)
  --payments-limit N    payments compartment                      (DEMO_PAYMENTS_LIMIT, 16)
  --timeout S           client timeout of each request            (DEMO_TIMEOUT, 10)
  --build DIR           where make put bulkshim, libbulkshim.so
                        and demo/{shop,backend,load}              (BULKSHIM_BUILD, build)
  --png FILE            the chart                                 (DEMO_PNG, BUILD/demo.png)
  --out DIR             CSVs, logs, config and status samples     (DEMO_OUT, BUILD/demo/out)
  --test                a short run (4 s each way, slow at 1 s, 5000 ms slow,
                        6 s timeout, no chart) that exits 1 when a check fails
  -h, --help            this text

The environment variables in parentheses set the same parameters; options
win over them. The demo ends with checks of what it must show: with limits
every checkout succeeded, the compartment never held more than its limit
(by the segment's count and by the kernel's count of the shop's sockets to
recommendations), the shim refused connects and /home fell back, and the
drill's verdict was "contained"; without limits checkout degraded and the
verdict was "leaked".
EOF
}

# --test first: it changes the defaults that the other options override.
TEST=0
for a in "$@"; do
	case $a in
	--test) TEST=1 ;;
	-h|--help) usage; exit 0 ;;
	esac
done
if [ "$TEST" = 1 ]; then
	: "${DEMO_DURATION:=4}" "${DEMO_SLOW_AT:=1}" "${DEMO_SLOW_MS:=5000}" "${DEMO_TIMEOUT:=6}"
fi
DURATION=${DEMO_DURATION:-20}
SLOW_AT=${DEMO_SLOW_AT:-3}
SLOW_MS=${DEMO_SLOW_MS:-8000}
RECS_MS=${DEMO_RECS_MS:-20}
PAYMENTS_MS=${DEMO_PAYMENTS_MS:-5}
WORKERS=${DEMO_WORKERS:-32}
HOME_RATE=${DEMO_HOME_RATE:-100}
CHECKOUT_RATE=${DEMO_CHECKOUT_RATE:-20}
RECS_LIMIT=${DEMO_RECS_LIMIT:-8}
PAYMENTS_LIMIT=${DEMO_PAYMENTS_LIMIT:-16}
TIMEOUT=${DEMO_TIMEOUT:-10}
BUILD=${BULKSHIM_BUILD:-$ROOT/build}
PNG=${DEMO_PNG:-}
OUT=${DEMO_OUT:-}

die() { echo "demo: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
	opt=$1 val=
	case $opt in
	--test) shift; continue ;;
	--*=*) val=${opt#*=}; opt=${opt%%=*} ;;
	--duration|--slow-at|--slow-ms|--recs-ms|--payments-ms|--workers|--home-rate|\
	--checkout-rate|--recs-limit|--payments-limit|--timeout|--build|--png|--out)
		[ $# -ge 2 ] || die "$opt needs a value (try --help)"
		val=$2
		shift ;;
	*) die "unknown argument \"$opt\" (try --help)" ;;
	esac
	shift
	case $opt in
	--duration) DURATION=$val ;;
	--slow-at) SLOW_AT=$val ;;
	--slow-ms) SLOW_MS=$val ;;
	--recs-ms) RECS_MS=$val ;;
	--payments-ms) PAYMENTS_MS=$val ;;
	--workers) WORKERS=$val ;;
	--home-rate) HOME_RATE=$val ;;
	--checkout-rate) CHECKOUT_RATE=$val ;;
	--recs-limit) RECS_LIMIT=$val ;;
	--payments-limit) PAYMENTS_LIMIT=$val ;;
	--timeout) TIMEOUT=$val ;;
	--build) BUILD=$val ;;
	--png) PNG=$val ;;
	--out) OUT=$val ;;
	*) die "unknown option $opt (try --help)" ;;
	esac
done
: "${PNG:=$BUILD/demo.png}" "${OUT:=$BUILD/demo/out}"

is_int() { [[ $1 =~ ^[0-9]+$ ]]; }
is_num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
# The option of variable v: SLOW_AT is --slow-at.
optname() { local o=${1,,}; echo "--${o//_/-}"; }
for v in SLOW_MS RECS_MS PAYMENTS_MS WORKERS RECS_LIMIT PAYMENTS_LIMIT; do
	is_int "${!v}" || die "$(optname $v) must be a whole number, not \"${!v}\""
done
for v in DURATION SLOW_AT HOME_RATE CHECKOUT_RATE TIMEOUT; do
	is_num "${!v}" || die "$(optname $v) must be a number, not \"${!v}\""
done
[ "$WORKERS" -ge 1 ] && [ "$RECS_LIMIT" -ge 1 ] && [ "$PAYMENTS_LIMIT" -ge 1 ] ||
	die "workers and limits must be at least 1"
awk -v d="$DURATION" -v t="$TIMEOUT" 'BEGIN { exit !(d > 0 && d <= 600 && t > 0 && t <= 120) }' ||
	die "duration must be in (0, 600] and timeout in (0, 120] seconds"
awk -v s="$SLOW_AT" -v d="$DURATION" 'BEGIN { exit !(s >= 1 && s < d) }' ||
	die "--slow-at must be at least 1 s (the drill's baseline) and below --duration"

CLI=$BUILD/bulkshim
BIN=$BUILD/demo
for f in "$CLI" "$BUILD/libbulkshim.so" "$BIN/shop" "$BIN/backend" "$BIN/load"; do
	[ -e "$f" ] || die "$f is missing; run \"make demo\" (or make B=$BUILD all demo-bin)"
done
command -v setsid >/dev/null || die "setsid (util-linux) is missing"
mkdir -p "$OUT" || die "cannot create $OUT"

SEG=demo-$$
SHM=/dev/shm/bulkshim.$SEG
GROUPS_STARTED=()
NAP=

# ---- processes ----

# True while pid exists and is not a zombie.
alive() {
	local st
	st=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
	[ "${st%% *}" != Z ]
}

# spawn LOG CMD...: starts CMD in a new session (so in its own process
# group), with its output in LOG; the pid, which is also the process group,
# is left in SPAWNED. Bash does not make its background jobs group leaders,
# so setsid runs CMD in place instead of forking.
spawn() {
	local log=$1
	shift
	setsid "$@" >"$log" 2>&1 </dev/null &
	SPAWNED=$!
	GROUPS_STARTED+=("$SPAWNED")
}

# Stops process group g: SIGTERM, up to 2 s of grace, then SIGKILL.
stop_group() {
	local g=$1 i
	kill -TERM -- "-$g" 2>/dev/null || kill -TERM "$g" 2>/dev/null
	for ((i = 0; i < 40; i++)); do
		alive "$g" || break
		sleep 0.05
	done
	kill -KILL -- "-$g" 2>/dev/null
	wait "$g" 2>/dev/null
	forget "$g"
}

# Takes process group g off the list of those to stop.
forget() {
	local i rest=()
	for i in "${GROUPS_STARTED[@]}"; do
		[ "$i" = "$1" ] || rest+=("$i")
	done
	GROUPS_STARTED=("${rest[@]}")
}

cleanup() {
	local g
	trap - EXIT INT TERM HUP
	[ -n "$NAP" ] && kill "$NAP" 2>/dev/null
	for g in "${GROUPS_STARTED[@]}"; do
		kill -TERM -- "-$g" 2>/dev/null
	done
	for g in "${GROUPS_STARTED[@]}"; do
		stop_group "$g"
	done
	rm -f "$SHM"
}
trap 'cleanup; echo "demo: interrupted" >&2; exit 130' INT
trap 'cleanup; echo "demo: terminated" >&2; exit 143' TERM
trap 'cleanup; exit 129' HUP
trap cleanup EXIT

# A sleep that a trapped signal interrupts at once.
nap() {
	sleep "$1" &
	NAP=$!
	wait "$NAP"
	NAP=
}

# wait_port FILE PID NAME: the port a program wrote into FILE, within 5 s.
wait_port() {
	local i
	for ((i = 0; i < 100; i++)); do
		if [ -s "$1" ]; then
			cat "$1"
			return 0
		fi
		alive "$2" || break
		sleep 0.05
	done
	echo "demo: $3 did not start; its output:" >&2
	sed 's/^/  /' "$4" >&2
	return 1
}

# kv FILE KEY: the value of KEY=VALUE in FILE, or nothing.
kv() { sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n 1; }

# json_field COMPARTMENT FIELD: one value per line of "bulkshim status
# --json" output on standard input.
json_field() {
	awk -v c="$1" -v f="$2" '{
		n = split($0, part, /\{/)
		for (i = 1; i <= n; i++) {
			if (part[i] !~ "\"name\": *\"" c "\"")
				continue
			if (match(part[i], "\"" f "\": *[0-9]+")) {
				s = substr(part[i], RSTART, RLENGTH)
				sub(/.*: */, "", s)
				print s
			}
		}
	}'
}

# ---- one run ----

# The sampler's loop: the segment and the kernel's count of the shop's
# connections to recommendations (those open at the client's end:
# established, or closed by the server and not yet by the client), five
# times a second, N times. Arguments: CLI SEGMENT SAMPLES N HELD PORT.
SAMPLER='held_to() {
	awk -v p="$(printf "%04X" "$1")" "FNR > 1 {
		split(\$3, r, \":\"); if (r[2] == p && (\$4 == \"01\" || \$4 == \"08\")) n++
	} END { print n + 0 }" /proc/net/tcp
}
for ((i = 0; i < $3; i++)); do
	"$0" status -s "$1" --json >>"$2" 2>/dev/null
	held_to "$5" >>"$4"
	sleep 0.2
done'

# run MODE: MODE is "plain" (no limits: enforce = false) or "shim". Leaves
# MODE.cfg, MODE.csv, MODE.t0, MODE.drill (the drill's verdict), MODE.drill.rc,
# MODE.drill_at (when its faults began, ms since the epoch), MODE.held (the
# kernel's count, sampled), MODE.samples and MODE.status in OUT.
run() {
	local mode=$1 pay_pid recs_pid shop_pid load_pid drill_pid sampler_pid pport rport sport n
	local enforce=true for_ms base_ms

	[ "$mode" = plain ] && enforce=false
	rm -f "$OUT/$mode".*
	spawn "$OUT/$mode.payments.log" "$BIN/backend" -n payments -d "$PAYMENTS_MS" \
		-p "$OUT/$mode.payments.port" -o "$OUT/$mode.payments.stats"
	pay_pid=$SPAWNED
	spawn "$OUT/$mode.recs.log" "$BIN/backend" -n recommendations -d "$RECS_MS" \
		-p "$OUT/$mode.recs.port" -o "$OUT/$mode.recs.stats"
	recs_pid=$SPAWNED
	pport=$(wait_port "$OUT/$mode.payments.port" "$pay_pid" payments "$OUT/$mode.payments.log") &&
		rport=$(wait_port "$OUT/$mode.recs.port" "$recs_pid" recommendations "$OUT/$mode.recs.log") ||
		return 1

	{
		echo "# $mode.cfg - written by demo/demo.sh for one run; the ports are the ones the kernel picked."
		echo "segment = \"$SEG\";"
		echo "drills = true;      # bulkshim drill may put faults on these connections"
		[ "$enforce" = false ] && echo "enforce = false;    # count, refuse nothing: no limits"
		echo "compartments = ("
		echo "  { name = \"recommendations\"; destinations = [ \"127.0.0.1:$rport\" ]; max_connections = $RECS_LIMIT; },"
		echo "  { name = \"payments\";        destinations = [ \"127.0.0.1:$pport\" ]; max_connections = $PAYMENTS_LIMIT; }"
		echo ");"
	} >"$OUT/$mode.cfg"
	rm -f "$SHM"
	spawn "$OUT/$mode.shop.log" "$CLI" run -c "$OUT/$mode.cfg" -- "$BIN/shop" \
		--payments "127.0.0.1:$pport" --recommendations "127.0.0.1:$rport" \
		-w "$WORKERS" -p "$OUT/$mode.shop.port"
	shop_pid=$SPAWNED
	sport=$(wait_port "$OUT/$mode.shop.port" "$shop_pid" shop "$OUT/$mode.shop.log") || return 1
	if [ ! -e "$SHM" ]; then
		echo "demo: the shop runs, but no segment $SHM appeared: is the shim inert? Its output:" >&2
		sed 's/^/  /' "$OUT/$mode.shop.log" >&2
		return 1
	fi

	: >"$OUT/$mode.samples"
	: >"$OUT/$mode.held"
	n=$(awk -v d="$DURATION" -v t="$TIMEOUT" 'BEGIN { printf "%d", (d + t + 10) * 5 }')
	spawn /dev/null bash -c "$SAMPLER" "$CLI" "$SEG" "$OUT/$mode.samples" "$n" \
		"$OUT/$mode.held" "$rport"
	sampler_pid=$SPAWNED

	spawn "$OUT/$mode.load.log" "$BIN/load" -t "127.0.0.1:$sport" -r "$HOME_RATE" \
		-c "$CHECKOUT_RATE" -d "$DURATION" -T "$TIMEOUT" -o "$OUT/$mode.csv" -z "$OUT/$mode.t0"
	load_pid=$SPAWNED
	# The drill: a baseline window until SLOW_AT, recommendations' replies
	# SLOW_MS late until the load ends, then a window after; checkout is its
	# probe. The backend itself stays healthy all along.
	base_ms=$(awk -v s="$SLOW_AT" 'BEGIN { printf "%d", s * 1000 }')
	for_ms=$(awk -v s="$SLOW_AT" -v d="$DURATION" 'BEGIN { printf "%d", (d - s) * 1000 }')
	echo $(($(date +%s%3N) + base_ms)) >"$OUT/$mode.drill_at"
	spawn "$OUT/$mode.drill" "$CLI" drill -c "$OUT/$mode.cfg" recommendations \
		--delay "${SLOW_MS}ms" --baseline "${base_ms}ms" --for "${for_ms}ms" --after 2s \
		--probe "http://127.0.0.1:$sport/checkout"
	drill_pid=$SPAWNED
	wait "$load_pid"
	n=$?
	# Stop whatever the load generator's group may have left.
	kill -KILL -- "-$load_pid" 2>/dev/null
	forget "$load_pid"
	if [ "$n" != 0 ] || [ ! -s "$OUT/$mode.csv" ]; then
		echo "demo: the load generator failed:" >&2
		sed 's/^/  /' "$OUT/$mode.load.log" >&2
		return 1
	fi
	# The drill ends by its own deadline, then its window after.
	wait "$drill_pid"
	echo $? >"$OUT/$mode.drill.rc"
	forget "$drill_pid"
	stop_group "$sampler_pid"
	# Before the shop stops: its exit would take back what it holds.
	"$CLI" status -s "$SEG" --json >"$OUT/$mode.status" 2>>"$OUT/$mode.shop.log"
	# The shop first, so that the backends count every connection it made.
	stop_group "$shop_pid"
	stop_group "$recs_pid"
	stop_group "$pay_pid"
	rm -f "$SHM"
	return 0
}

# ---- figures ----

# counts CSV: "checkout_n checkout_ok checkout_failed checkout_timeout
# home_n home_ok home_fallback home_failed home_timeout"
counts() {
	awk -F, 'NR > 1 { n[$2]++; c[$2 "," $4]++ }
	END {
		printf "%d %d %d %d %d %d %d %d %d\n", n["checkout"], c["checkout,ok"],
		    c["checkout,failed"], c["checkout,timeout"], n["home"], c["home,ok"],
		    c["home,fallback"], c["home,failed"], c["home,timeout"]
	}' "$1"
}

# pctl CSV PATH OUTCOME-REGEX PERCENT: that percentile (nearest rank) of the
# latencies in ms, or "-" when no request qualifies.
pctl() {
	awk -F, -v p="$2" -v o="$3" 'NR > 1 && $2 == p && $4 ~ o { print $3 }' "$1" | sort -g |
		awk -v q="$4" '{ v[NR] = $1 }
		END {
			if (NR == 0) { print "-"; exit }
			k = int((q * NR + 99) / 100); if (k < 1) k = 1; if (k > NR) k = NR
			print v[k]
		}'
}

# ms VALUE: a latency in ms made readable.
ms() {
	awk -v v="$1" 'BEGIN {
		if (v == "-") print "-"
		else if (v >= 1000) printf "%.2f s\n", v / 1000
		else if (v >= 10) printf "%.0f ms\n", v
		else printf "%.2f ms\n", v
	}'
}

# share PART TOTAL: "PART (xx.x%)".
share() {
	awk -v p="$1" -v t="$2" 'BEGIN { if (t > 0) printf "%d (%.1f%%)\n", p, 100 * p / t; else print "-" }'
}

# slow_moment MODE: seconds from the start of the load to the moment the
# drill made recommendations slow (the end of its baseline window).
slow_moment() {
	local at t0
	at=$(cat "$OUT/$1.drill_at" 2>/dev/null)
	t0=$(cat "$OUT/$1.t0" 2>/dev/null)
	awk -v a="${at:-0}" -v t="${t0:-0}" 'BEGIN {
		if (a == 0 || t == 0) { print "-"; exit }
		s = (a - t) / 1000; if (s < 0) s = 0; printf "%.2f\n", s
	}'
}

row() { printf '%-44s %-24s %s\n' "$1" "$2" "$3"; }

chart() {
	local s_plain s_shim slow_s to_ms term
	if ! command -v gnuplot >/dev/null; then
		echo "demo: gnuplot is not installed, so no $PNG (apt-get install gnuplot-nox)"
		return 0
	fi
	s_plain=$(slow_moment plain)
	s_shim=$(slow_moment shim)
	slow_s=$(awk -v m="$SLOW_MS" 'BEGIN { printf "%g", m / 1000 }')
	to_ms=$(awk -v t="$TIMEOUT" 'BEGIN { print t * 1000 }')
	term="pngcairo size 1100,620 font 'sans,11'"
	gnuplot -e "set terminal" 2>&1 | grep -q pngcairo || term="png size 1100,620"
	mkdir -p "$(dirname "$PNG")"
	{
		echo "set terminal $term"
		echo "set output '$PNG'"
		echo "set datafile separator ','"
		echo "set title \"Checkout latency, $WORKERS-worker shop: /home $HOME_RATE req/s calls recommendations, /checkout $CHECKOUT_RATE req/s calls payments\""
		echo "set xlabel 'seconds since the load started (request start time)'"
		echo "set ylabel 'checkout latency (log scale)'"
		echo "set logscale y"
		echo "set ytics ('1 ms' 1, '10 ms' 10, '100 ms' 100, '1 s' 1000, '10 s' 10000, '100 s' 100000)"
		echo "set yrange [0.5:$to_ms * 3]"
		echo "set xrange [0:*]"
		echo "set grid"
		echo "set key outside below horizontal"
		echo "set arrow from graph 0, first $to_ms to graph 1, first $to_ms nohead dt 3 lc rgb 'gray40'"
		echo "set label 'client timeout ($TIMEOUT s)' at graph 0.99, first $to_ms * 1.4 right tc rgb 'gray30'"
		if [ "$s_plain" != - ]; then
			echo "set arrow from $s_plain, graph 0 to $s_plain, graph 1 nohead lw 2 dt 2 lc rgb 'black'"
			echo "set label \"the drill delays recommendations ($slow_s s per reply)\" at $s_plain, graph 0.06 offset 0.6,0"
		fi
		if [ "$s_shim" != - ] && [ "$s_shim" != "$s_plain" ]; then
			echo "set arrow from $s_shim, graph 0 to $s_shim, graph 1 nohead lw 1 dt 2 lc rgb '#1f77b4'"
		fi
		echo "ok(x) = (strcol(2) eq 'checkout' && strcol(4) eq 'ok') ? x : 1/0"
		echo "bad(x) = (strcol(2) eq 'checkout' && strcol(4) ne 'ok') ? x : 1/0"
		echo "plot '$OUT/plain.csv' skip 1 using (\$1/1000):(ok(\$3)) with points pt 7 ps 0.5 lc rgb '#d62728' title 'without limits: paid', \\"
		echo "     '' skip 1 using (\$1/1000):(bad(\$3)) with points pt 2 ps 0.8 lc rgb '#d62728' title 'without limits: failed or timed out', \\"
		echo "     '$OUT/shim.csv' skip 1 using (\$1/1000):(ok(\$3)) with points pt 7 ps 0.5 lc rgb '#1f77b4' title 'with limits: paid', \\"
		echo "     '' skip 1 using (\$1/1000):(bad(\$3)) with points pt 2 ps 0.8 lc rgb '#1f77b4' title 'with limits: failed or timed out'"
	} >"$OUT/demo.gp"
	if gnuplot "$OUT/demo.gp" 2>"$OUT/gnuplot.log"; then
		echo "chart: $PNG"
	else
		echo "demo: gnuplot failed; see $OUT/gnuplot.log and $OUT/demo.gp" >&2
	fi
}

# ---- main ----

# verdict MODE: the drill's verdict line of a run, as `bulkshim drill` printed it.
verdict() { sed -n 's/^verdict: \([a-z ]*\).*/\1/p' "$OUT/$1.drill" 2>/dev/null | head -n 1; }
# held_max MODE: the most connections to recommendations the kernel saw the
# shop hold at once, of the samples.
held_max() { sort -n "$OUT/$1.held" 2>/dev/null | tail -n 1; }

total=$(awk -v d="$DURATION" -v t="$TIMEOUT" 'BEGIN { printf "%.0f", 2 * (d + t + 3) + 3 }')
echo "demo: shop with $WORKERS workers; /home $HOME_RATE req/s -> recommendations" \
	"($RECS_MS ms; a drill delays each reply $SLOW_MS ms from ${SLOW_AT} s in); /checkout" \
	"$CHECKOUT_RATE req/s -> payments ($PAYMENTS_MS ms); client timeout $TIMEOUT s"
echo "demo: two runs of $DURATION s each, at most about $total s in all; files in $OUT"
echo "demo: run 1, without limits (bulkshim run with enforce = false) ..."
run plain || exit 1
echo "demo: run 2, with limits (recommendations=$RECS_LIMIT, payments=$PAYMENTS_LIMIT) ..."
run shim || exit 1

read -r pc_n pc_ok pc_fail pc_to ph_n ph_ok ph_fb ph_fail ph_to <<<"$(counts "$OUT/plain.csv")"
read -r sc_n sc_ok sc_fail sc_to sh_n sh_ok sh_fb sh_fail sh_to <<<"$(counts "$OUT/shim.csv")"
p_p50=$(pctl "$OUT/plain.csv" checkout . 50)
p_p99=$(pctl "$OUT/plain.csv" checkout . 99)
s_p50=$(pctl "$OUT/shim.csv" checkout . 50)
s_p99=$(pctl "$OUT/shim.csv" checkout . 99)
p_fb50=$(pctl "$OUT/plain.csv" home '^fallback$' 50)
s_fb50=$(pctl "$OUT/shim.csv" home '^fallback$' 50)
p_held=$(held_max plain)
s_held=$(held_max shim)
p_peak=$(json_field recommendations peak <"$OUT/plain.status")
seg_limit=$(json_field recommendations limit <"$OUT/shim.status")
seg_peak=$(json_field recommendations peak <"$OUT/shim.status")
seg_rej=$(json_field recommendations rejected <"$OUT/shim.status")
seg_adm=$(json_field recommendations admitted <"$OUT/shim.status")
pay_peak=$(json_field payments peak <"$OUT/shim.status")
pay_limit=$(json_field payments limit <"$OUT/shim.status")
pay_rej=$(json_field payments rejected <"$OUT/shim.status")
sampled=$(json_field recommendations in_use <"$OUT/shim.samples" | sort -n | tail -n 1)
s_slow=$(slow_moment shim)
p_slow=$(slow_moment plain)
p_rc=$(cat "$OUT/plain.drill.rc" 2>/dev/null)
s_rc=$(cat "$OUT/shim.drill.rc" 2>/dev/null)

echo
row "" "without limits" "with limits"
row "checkout: paid" "$(share "$pc_ok" "$pc_n") of $pc_n" "$(share "$sc_ok" "$sc_n") of $sc_n"
row "checkout: failed (503) / timed out" "$pc_fail / $pc_to" "$sc_fail / $sc_to"
row "checkout latency p50 / p99" "$(ms "$p_p50") / $(ms "$p_p99")" "$(ms "$s_p50") / $(ms "$s_p99")"
row "home: real recommendations" "$(share "$ph_ok" "$ph_n")" "$(share "$sh_ok" "$sh_n")"
row "home: cached fallback" "$(share "$ph_fb" "$ph_n")" "$(share "$sh_fb" "$sh_n")"
row "home: failed or timed out" "$(share $((ph_fail + ph_to)) "$ph_n")" "$(share $((sh_fail + sh_to)) "$sh_n")"
row "home: fallback latency p50 (a shed call)" "$(ms "$p_fb50")" "$(ms "$s_fb50")"
row "recommendations: held at once (kernel)" "${p_held:-?}" "${s_held:-?}"
row "recommendations: compartment peak / limit" "${p_peak:-?} / none (observe)" "${seg_peak:-?} / ${seg_limit:-?} (sampled in use: max ${sampled:-?})"
row "recommendations: connects admitted / refused" "- / 0" "${seg_adm:-?} / ${seg_rej:-?}"
row "payments: compartment peak / limit, refused" "-" "${pay_peak:-?} / ${pay_limit:-?}, ${pay_rej:-?}"
row "the drill made recommendations slow at" "${p_slow} s" "${s_slow} s"
row "the drill's verdict" "$(verdict plain) (exit ${p_rc:-?})" "$(verdict shim) (exit ${s_rc:-?})"
echo
line=$(grep -m 1 'full' "$OUT/shim.shop.log" 2>/dev/null)
[ -n "$line" ] && echo "the shim, on the shop's stderr: $line"
echo "the drill without limits:"
sed 's/^/  /' "$OUT/plain.drill"
echo "the drill with limits:"
sed 's/^/  /' "$OUT/shim.drill"
echo "every request: $OUT/plain.csv and $OUT/shim.csv (start_ms,path,latency_ms,outcome,detail)"

[ "$TEST" = 1 ] || chart

# ---- verdict: what the scenario must show ----
passed=0 failed=0
check() {
	if [ "$1" = 0 ]; then
		passed=$((passed + 1))
		echo "ok:   $2"
	else
		failed=$((failed + 1))
		echo "FAIL: $2"
	fi
}
echo
[ "${sc_n:-0}" -gt 0 ] && [ "$sc_ok" = "$sc_n" ]
check $? "with limits every checkout succeeded ($sc_ok of $sc_n)"
is_int "${seg_peak:-x}" && is_int "${sampled:-x}" && [ "$seg_limit" = "$RECS_LIMIT" ] &&
	[ "$seg_peak" -le "$RECS_LIMIT" ] && [ "$sampled" -le "$RECS_LIMIT" ]
check $? "the segment never counted more than $RECS_LIMIT recommendations connections (peak ${seg_peak:-?}, sampled ${sampled:-?})"
is_int "${s_held:-x}" && [ "$s_held" -le "$RECS_LIMIT" ]
check $? "the kernel never saw the shop hold more than $RECS_LIMIT connections to recommendations with limits (sampled max ${s_held:-?})"
is_int "${seg_rej:-x}" && [ "$seg_rej" -gt 0 ] && [ "${sh_fb:-0}" -gt 0 ]
check $? "with limits the shim refused recommendations connects (${seg_rej:-?}) and /home fell back ($sh_fb)"
degraded=$(awk -v ok="$pc_ok" -v n="$pc_n" -v p99="$p_p99" \
	'BEGIN { print (n > 0 && (ok < n || (p99 != "-" && p99 >= 1000))) ? 0 : 1 }')
check "$degraded" "without limits checkout degraded ($pc_ok of $pc_n paid, p99 $(ms "$p_p99"))"
[ "$p_rc" = 1 ] && [ "$s_rc" = 0 ]
check $? "the drill's verdict: leaked without limits (exit ${p_rc:-?}), contained with them (exit ${s_rc:-?})"
echo "demo: $passed passed, $failed failed"
# A demo run with other parameters may show a compartment that protects
# nothing; only the test fails on that.
[ "$TEST" = 0 ] || [ "$failed" = 0 ]
