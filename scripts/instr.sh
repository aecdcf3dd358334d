#!/usr/bin/env bash
# instr.sh measures the CPU instructions each driver mode spends per query, with callgrind.
#
# It builds ./integration/instr (flags -dsn, -mode, -n: run n queries of "select $1::int + 1"
# after a warm-up), starts a throwaway PostgreSQL (internal/pgtest/cmd/pgtest) unless
# PGTRAFFIC_TEST_DSN names one, and runs the program under callgrind for N1 and N2 queries per
# mode. The difference (I(N2) - I(N1)) / (N2 - N1) cancels start-up, warm-up and shutdown and
# leaves the client-side instructions per query.
#
# Only the client is measured: the server is a separate process that valgrind does not trace.
# The Go runtime runs with one P (GOMAXPROCS=1), without GC and without async preemption, so
# that counts depend on the work done rather than on timing. Some timing noise remains (a few
# per cent of the totals between runs); the "busy" columns remove most of it.
#
# Output, per mode: instructions per query from the totals, and "busy" per query without the
# idle scheduler and sysmon instructions (see instructions below), each also relative to pgx.
#
# Environment: MODES (default "pgx pgtraffic budget trace otelsql"), N1 (2000), N2 (12000),
# INSTR_BIN (a prebuilt program to measure instead of building ./integration/instr).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pgserver.sh
source scripts/pgserver.sh

MODES="${MODES:-pgx pgtraffic budget trace otelsql}"
N1="${N1:-2000}"
N2="${N2:-12000}"
GO="${GO:-go}"
export CGO_ENABLED=1

if ! command -v valgrind >/dev/null; then
	echo "instr: valgrind not found; install it (Debian: apt-get install -y valgrind)" >&2
	exit 1
fi
if ((N2 <= N1)); then
	echo "instr: N2 ($N2) must be greater than N1 ($N1)" >&2
	exit 1
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
	stop_pgserver
	rm -rf "$work"
}
trap cleanup EXIT

bin="${INSTR_BIN:-}"
if [[ -z "$bin" ]]; then
	bin="$work/instr"
	"$GO" build -o "$bin" ./integration/instr
fi

dsn="${PGTRAFFIC_TEST_DSN:-}"
if [[ -z "$dsn" ]]; then
	start_pgserver "$work"
fi

# inclusive FILE FUNC prints the inclusive instruction count of a function in a callgrind file.
inclusive() {
	callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
		awk -v fn=":$2 [" 'index($0, fn) { gsub(",", "", $1); print $1; found = 1; exit }
			END { if (!found) print 0 }'
}

# instructions MODE N prints, for one run of N queries, the total instruction count and the
# part spent idle: in the scheduler while the goroutine is parked waiting for the server
# (runtime.park_m) and in the runtime's background monitor (runtime.sysmon). Both depend on
# timing rather than on the work done, and are most of the run-to-run noise of the total.
instructions() {
	local mode=$1 n=$2 out="$work/callgrind.$1.$2"
	if ! GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 GOGC=off \
		valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$bin" -dsn "$dsn" -mode "$mode" -n "$n" >"$work/run.log" 2>&1; then
		echo "instr: $mode -n $n failed:" >&2
		tail -n 40 "$work/run.log" >&2
		return 1
	fi
	# "summary:" in current callgrind output, "totals:" in older versions.
	local total
	total="$(awk '/^(summary|totals):/ { print $2; exit }' "$out")"
	if [[ -z "$total" ]]; then
		echo "instr: no instruction total in $out" >&2
		return 1
	fi
	local parked sysmon
	parked="$(inclusive "$out" runtime.park_m)"
	sysmon="$(inclusive "$out" runtime.sysmon)"
	echo "$total $((parked + sysmon))"
}

results=""
for mode in $MODES; do
	echo "instr: $mode: callgrind with $N1 and $N2 queries..." >&2
	r1="$(instructions "$mode" "$N1")"
	r2="$(instructions "$mode" "$N2")"
	results+="$mode $r1 $r2"$'\n'
done

# Columns: total instructions of each run; per query from the totals (the headline figure) and
# from the totals less the idle part ("busy", steadier); both again relative to the pgx mode.
printf '%s' "$results" | awk -v n1="$N1" -v n2="$N2" '
	{
		mode[NR] = $1; t1[NR] = $2; t2[NR] = $4
		per[NR] = ($4 - $2) / (n2 - n1)
		busy[NR] = (($4 - $5) - ($2 - $3)) / (n2 - n1)
		if ($1 == "pgx") { base = per[NR]; basebusy = busy[NR]; hasbase = 1 }
	}
	END {
		printf "%-12s %14s %14s %12s %12s %10s %12s\n", "mode", "I(" n1 ")", "I(" n2 ")",
			"instr/query", "busy/query", "vs pgx", "busy vs pgx"
		for (r = 1; r <= NR; r++) {
			d = hasbase ? sprintf("%+.0f", per[r] - base) : "n/a"
			db = hasbase ? sprintf("%+.0f", busy[r] - basebusy) : "n/a"
			printf "%-12s %14.0f %14.0f %12.0f %12.0f %10s %12s\n", mode[r], t1[r], t2[r], per[r], busy[r], d, db
		}
	}'
