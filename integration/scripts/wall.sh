#!/usr/bin/env bash
# wall.sh measures the wall time per statement of each driver mode against its base (raw pgx
# for the database/sql modes, raw pgxpool for the pgx-native ones), with the client and the
# server on different CPUs.
#
# It runs TestOverheadRounds (integration/instr/overhead_test.go: every mode in interleaved rounds, so
# that drift of a shared machine cancels) against a throwaway PostgreSQL started by
# internal/pgtest/cmd/pgtest, unless PGTRAFFIC_TEST_DSN names one.
#
# Why pin: on a 2-core machine, an unpinned client, server and scheduler share both cores, and
# where the kernel happens to run each process moves the ratios by more than the differences being judged.
# Here the server (postmaster and every backend, which inherit its affinity) runs on the last CPU
# and the client, with GOMAXPROCS=1, on CPU 0, so the client's own work is what differs between
# modes. A round trip between two CPUs is slower than on one, so absolute times are higher than
# unpinned ones; the ratios are the figure. An external server (PGTRAFFIC_TEST_DSN) is not pinned.
#
# Without taskset or a second CPU it runs unpinned.
#
# Why several processes: each test process lays out its heap (and the engine's state) anew, and
# that layout moves one mode's ratio for the whole process, which no number
# of rounds within it averages out. The test runs in PROCS processes, one after another, and the
# summary at the end gives, per workload and mode, the median over the processes of each
# process's ratios (mean: of total times; median: of the per-round ratios), with the range of
# the processes' median ratios. The modes control and poolcontrol are the bases again, each on a
# connection of its own: the spread of their ratios around 1 is the run's own noise, the margin
# by which a mode's ratio must differ from another's to mean anything.
#
# Environment: PROCS (default 5), ROUNDS (rounds per process, default 200), K (statements per
# mode per round, default 100), MODES (default every mode of integration/instr; each mode's base
# must be among them).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=integration/scripts/pgserver.sh
source integration/scripts/pgserver.sh

PROCS="${PROCS:-5}"
ROUNDS="${ROUNDS:-200}"
K="${K:-100}"
MODES="${MODES:-}"
GO="${GO:-go}"
export CGO_ENABLED=1

if ! [[ "$PROCS" =~ ^[1-9][0-9]*$ ]]; then
	echo "wall: PROCS=$PROCS: want a positive integer" >&2
	exit 1
fi

ncpu="$(nproc)"
server_pin=() client_pin=()
if command -v taskset >/dev/null && ((ncpu >= 2)); then
	server_pin=(taskset -c $((ncpu - 1)))
	client_pin=(taskset -c 0)
else
	echo "wall: not pinning (needs taskset and 2 CPUs; $ncpu here): expect noisier ratios" >&2
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
	stop_pgserver
	rm -rf "$work"
}
trap cleanup EXIT

# integration/instr is a module of its own (it compares with XSAM/otelsql, which the library
# does not require).
"$GO" test -C integration/instr -c -o "$work/integration.test" .

dsn="${PGTRAFFIC_TEST_DSN:-}"
if [[ -z "$dsn" ]]; then
	start_pgserver "$work" "${server_pin[@]}"
	((${#server_pin[@]})) && echo "wall: server on CPU $((ncpu - 1)), client on CPU 0" >&2
fi

# The test binary runs with the package directory as its working directory, as go test does.
cd integration/instr
for proc in $(seq "$PROCS"); do
	echo "wall: process $proc/$PROCS" >&2
	PGTRAFFIC_TEST_DSN="$dsn" PGTRAFFIC_OVERHEAD=1 PGTRAFFIC_OVERHEAD_ROUNDS="$ROUNDS" PGTRAFFIC_OVERHEAD_K="$K" \
		PGTRAFFIC_OVERHEAD_MODES="$MODES" \
		GOMAXPROCS=1 "${client_pin[@]}" "$work/integration.test" -test.run '^TestOverheadRounds$' -test.v -test.count=1 |
		tee "$work/proc.$proc"
done

# The summary: in each process's tables, a workload header ("select (1 statement(s) ...") is
# followed by a column header and one line per mode: mode, mean ns/st, median ns/st, mean ratio,
# median ratio, cpu ns/st, allocs/st.
cat "$work"/proc.* | awk -v procs="$PROCS" '
	function sorted(list, a,    n, i, j, t) {
		n = split(list, a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] + 0 < a[j-1] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		return n
	}
	function median(list,    a, n) {
		n = sorted(list, a)
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	function spread(list,    a, n) {
		n = sorted(list, a)
		return sprintf("%.3f-%.3f", a[1], a[n])
	}
	$2 ~ /^\(/ && $3 ~ /statement/ { w = $1; if (!(w in seenw)) { seenw[w] = 1; ws[++nw] = w }; next }
	w != "" && NF == 7 && $4 ~ /^[0-9.]+$/ {
		k = w SUBSEP $1
		if (!(k in seen)) { seen[k] = 1; modes[w] = modes[w] " " $1 }
		mean[k] = mean[k] " " $4; med[k] = med[k] " " $5; cpu[k] = cpu[k] " " $6
	}
	END {
		printf "\nwall: median over %d processes of each process'"'"'s ratios to the mode'"'"'s base (pgx; pgxpool for the pgx-native modes)\n", procs
		for (i = 1; i <= nw; i++) {
			w = ws[i]
			printf "\n%s\n%-12s %12s %12s %14s %14s\n", w, "mode", "mean ratio", "median ratio", "(range)", "cpu ns/st"
			n = split(modes[w], ms, " ")
			for (j = 1; j <= n; j++) {
				k = w SUBSEP ms[j]
				printf "%-12s %12.3f %12.3f %14s %14.0f\n", ms[j], median(mean[k]), median(med[k]), spread(med[k]), median(cpu[k])
			}
		}
	}'

