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
# that counts depend on the work done rather than on timing; the program waits for each answer
# before reading it (no read parks) and warms up long (see integration/instr). What timing still
# moves, the scheduler, timers and sysmon, is left out of the "busy" columns (see idle).
#
# Output, per mode: instructions per query from the totals, "busy" per query without the idle
# part (see idle), and the KB of code a query runs (see footprint), each also relative to the
# mode's base (the program's -list: raw pgx for the database/sql modes, raw pgxpool for the
# pgx-native ones; n/a when the base is not in MODES). The modes are measured in ROUNDS rounds
# (each round every mode once, in order), and each figure is the median over the rounds, the
# instruction counts with their range: the idle part of one run moves the total by hundreds of
# instructions, the busy figure by tens. integration/PERFORMANCE.md
# describes the method and how steady it is.
#
# Environment: MODES (default every mode the program lists, in its order: pgx pgtraffic budget
# trace otelsql pgxpool pool poolbudget pooltrace otelpgx; not the wall-time controls, whose
# instructions are their bases'), N1 (2000), N2 (12000),
# ROUNDS (3), WORKLOAD (select, the default: the single-row select; update: an Exec of a
# one-row update, like TPC-B's statements), INSTR_BIN (a prebuilt program to measure instead of
# building ./integration/instr), CODE_BY_FUNCTION (0; N: after the table, the N functions whose
# code a query runs grew the most over each mode's base's).
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=integration/scripts/pgserver.sh
source integration/scripts/pgserver.sh

N1="${N1:-2000}"
N2="${N2:-12000}"
ROUNDS="${ROUNDS:-3}"
CODE_BY_FUNCTION="${CODE_BY_FUNCTION:-0}"
WORKLOAD="${WORKLOAD:-select}"
GO="${GO:-go}"
export CGO_ENABLED=1

for v in N1 N2 ROUNDS CODE_BY_FUNCTION; do
	if ! [[ "${!v}" =~ ^[0-9]+$ ]]; then
		echo "instr: $v=${!v}: want a whole number" >&2
		exit 1
	fi
done
if ((ROUNDS < 1)); then
	echo "instr: ROUNDS=$ROUNDS: want at least 1" >&2
	exit 1
fi

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
	"$GO" build -C integration/instr -o "$bin" . # a module of its own
fi

# Each mode and its base, one a line.
bases="$("$bin" -list)"
MODES="${MODES:-$(cut -d' ' -f1 <<<"$bases" | tr '\n' ' ')}"

dsn="${PGTRAFFIC_TEST_DSN:-}"
if [[ -z "$dsn" ]]; then
	start_pgserver "$work"
fi

# idle FILE prints the instructions a callgrind file spends in the Go scheduler, the network
# poller, timers, system-call bookkeeping and the runtime's monitor thread (sysmon): their self
# counts, and the clock reads they make. How often these run depends on timing (how long each
# system call took, when sysmon woke) rather than on the work the client does, and they moved
# the total by hundreds of instructions per query between runs. No driver mode calls them
# itself. (With callgrind's caller tree: each block lists a function's callers, "<", then the
# function, "*"; recursion levels are named func'N.)
idle() {
	callgrind_annotate --threshold=100 --tree=caller --auto=no "$1" 2>/dev/null | awk '
		function name(line,    f) {
			f = line; sub(/ \[[^]]*\]$/, "", f); sub(/ \([0-9,]+x\)$/, "", f); sub(/^.*[<*] +/, "", f)
			sub(/^[^:]*:/, "", f); sub(/\047[0-9]+$/, "", f)
			return f
		}
		function count(line,    n) { n = line; sub(/^ +/, "", n); sub(/ .*/, "", n); gsub(",", "", n); return n + 0 }
		function isidle(f) {
			return f ~ /^runtime\.(netpoll.*|findRunnable|stealWork|schedule|execute|park_m|gopark|goready|ready|wakep|pidle(get|put)|runq(get|put|grab|steal)|sysmon|retake|preemptone|casgstatus|castogscanstatus|casfrom_Gscanstatus|mcall|procyield.*|osyield.*|usleep.*|futex.*|note(sleep|wakeup)|notetsleep.*|sema(sleep|wakeup)|startm|stopm|handoffp|mPark|acquirep.*|releasep.*|wirep|check(RunqsNoP|TimersNoP|IdleGCNoP|dead)|incidlelocked|resetspinning|injectglist|setBlockOnExitSyscall|lock2|unlock2|reentersyscall|entersyscall|exitsyscall.*|gcTrigger\.test)$/ ||
				f ~ /^runtime\.\((\*timers?|\*limiterEvent|\*m)\)\./ || f ~ /^runtime\.\(\*gcControllerState\)\.(releaseNextGCMarkWorker|findRunnableGCWorker)$/ ||
				f ~ /^internal\/poll\.(runtime_pollWait|\(\*pollDesc\)\.)/
		}
		/^ *[0-9,]+ \(.*\)  < / { if (isidle(name($0))) fromidle += count($0); next }
		/^ *[0-9,]+ \(.*\)  \* / {
			f = name($0)
			if (isidle(f)) s += count($0)
			else if (f ~ /^runtime\.nanotime1/) s += fromidle
			fromidle = 0
			next
		}
		/^$/ { fromidle = 0 }
		END { print s + 0 }'
}

# footprint FILE1 FILE2 [byfunction] prints the code a query runs, in 64-byte lines: those
# holding an instruction that the run of N2 queries (FILE2) executed at least 0.9 times per
# extra query more than the run of N1 (FILE1). A statement's path runs mostly straight through,
# each instruction about once, so this is the code every statement brings into the CPU's
# caches; where other work evicts it between round trips (a busy host), what it costs in wall
# time follows this rather than the instruction count. With byfunction it prints, instead of
# the total, each function's lines ("LINES NAME", a line shared by two functions counted in
# each). Callgrind's files name each instruction's address (--dump-instr=yes): absolute in hex,
# or relative to the previous line's; the line after a call's "calls=" line holds the call's
# inclusive cost, not the instruction's own. They name a function once in full, "fn=(ID) NAME"
# or "cfn=(ID) NAME", and by "(ID)" after that; recursion levels are NAME'N.
footprint() {
	awk -v per=$((N2 - N1)) -v byfn="${3:-}" '
		function hex(s,    i, v) {
			v = 0; s = tolower(s)
			for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
			return v
		}
		function num(s) { return s ~ /^0x/ ? hex(substr(s, 3)) : s + 0 }
		function fname(s,    id, c) {
			if (s !~ /^\(/) return s
			c = index(s, ")")
			id = substr(s, 2, c - 2)
			if (length(s) > c + 1) names[run, id] = substr(s, c + 2)
			return names[run, id]
		}
		FNR == 1 { run++; addr = 0; call = 0 }
		/^fn=/ { fn = fname(substr($0, 4)); sub(/\047[0-9]+$/, "", fn); next }
		/^cfn=/ { fname(substr($0, 5)); next }
		/^calls=/ { call = 1; next }
		/^(0x|[+*-])/ {
			if ($1 ~ /^0x/) addr = hex(substr($1, 3))
			else if ($1 ~ /^\+/) addr += num(substr($1, 2))
			else if ($1 ~ /^-/) addr -= num(substr($1, 2))
			if (call) { call = 0; next }
			if (NF >= 3) {
				count[run, addr] += $3
				if (run == 2) at[addr] = fn
			}
			next
		}
		END {
			for (k in count) {
				split(k, ka, SUBSEP)
				if (ka[1] != 2 || count[2, ka[2]] - count[1, ka[2]] < 0.9 * per) continue
				l = int(ka[2] / 64)
				line[l] = 1
				if (!((at[ka[2]], l) in infn)) { infn[at[ka[2]], l] = 1; fnlines[at[ka[2]]]++ }
			}
			if (byfn != "") {
				for (f in fnlines) print fnlines[f], f
				exit
			}
			for (l in line) lines++
			print lines + 0
		}' "$1" "$2"
}

# instructions MODE N prints, for one run of N queries, the total instruction count and its
# idle part (see idle).
instructions() {
	local mode=$1 n=$2 out="$work/callgrind.$1.$2"
	# cpu.rdtscp=off: where valgrind's CPUID advertises RDTSCP, the runtime's cputicks would use
	# it and valgrind dies with SIGILL on the unhandled instruction; RDTSC works.
	if ! GODEBUG="${GODEBUG:+$GODEBUG,}asyncpreemptoff=1,cpu.rdtscp=off" GOMAXPROCS=1 GOGC=off \
		valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out" \
		"$bin" -dsn "$dsn" -mode "$mode" -n "$n" -workload "$WORKLOAD" >"$work/run.log" 2>&1; then
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
	echo "$total $(idle "$out")"
}

results=""
for round in $(seq "$ROUNDS"); do
	for mode in $MODES; do
		echo "instr: round $round/$ROUNDS: $mode: callgrind with $N1 and $N2 queries..." >&2
		r1="$(instructions "$mode" "$N1")"
		r2="$(instructions "$mode" "$N2")"
		results+="$mode $r1 $r2 $(footprint "$work/callgrind.$mode.$N1" "$work/callgrind.$mode.$N2")"$'\n'
	done
done

# Per run: instructions per query from the totals (the headline figure) and from the totals less
# the idle part ("busy", steadier), and the code per query (see footprint), in KB; per mode the
# median over the rounds (the lower middle for an even count) and the range of the first two;
# each again relative to the medians of the mode's base.
{
	printf '%s\n' "$bases" | sed 's/^/base /'
	printf '%s' "$results"
} | awk -v n1="$N1" -v n2="$N2" '
	function median(list,    a, n, i, j, t) {
		n = split(list, a, " ")
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j] + 0 < a[j-1] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		lo = a[1]; hi = a[n]
		return a[int((n + 1) / 2)]
	}
	$1 == "base" { base[$2] = $3; next }
	{
		if (!($1 in per)) order[++nm] = $1
		per[$1] = per[$1] " " ($4 - $2) / (n2 - n1)
		busy[$1] = busy[$1] " " (($4 - $5) - ($2 - $3)) / (n2 - n1)
		code[$1] = code[$1] " " $6 * 64 / 1024
	}
	END {
		for (i = 1; i <= nm; i++) {
			m = order[i]
			mp[m] = median(per[m]); rp[m] = sprintf("%.0f-%.0f", lo, hi)
			mb[m] = median(busy[m]); rb[m] = sprintf("%.0f-%.0f", lo, hi)
			mc[m] = median(code[m])
		}
		printf "%-10s %12s %13s %10s %12s %13s %12s %8s %8s  %s\n", "mode", "instr/query", "(range)", "vs base",
			"busy/query", "(range)", "busy vs base", "code KB", "vs base", "base"
		for (i = 1; i <= nm; i++) {
			m = order[i]; b = base[m]
			hasbase = (b in mp)
			d = hasbase ? sprintf("%+.0f", mp[m] - mp[b]) : "n/a"
			db = hasbase ? sprintf("%+.0f", mb[m] - mb[b]) : "n/a"
			dc = hasbase ? sprintf("%+.1f", mc[m] - mc[b]) : "n/a"
			printf "%-10s %12.0f %13s %10s %12.0f %13s %12s %8.1f %8s  %s\n", m, mp[m], rp[m], d, mb[m], rb[m], db, mc[m], dc, b
		}
	}'

# CODE_BY_FUNCTION=N: after the table, for each mode whose base was measured, the N functions
# whose code a query runs grew the most over the base's, in 64-byte lines (see footprint), from
# the last round's runs.
if ((CODE_BY_FUNCTION > 0)); then
	for mode in $MODES; do
		footprint "$work/callgrind.$mode.$N1" "$work/callgrind.$mode.$N2" byfunction >"$work/code.$mode"
	done
	for mode in $MODES; do
		base="$(awk -v m="$mode" '$1 == m { print $2 }' <<<"$bases")"
		[[ "$base" != "$mode" && -f "$work/code.$base" ]] || continue
		printf '\ncode a query runs by function, %s over %s (64-byte lines; the last round):\n' "$mode" "$base"
		awk 'NR == FNR { n = $1; sub(/^[0-9]+ /, ""); base[$0] = n; next }
			{ n = $1; sub(/^[0-9]+ /, ""); if (n - base[$0] > 0) printf "%+5d %5d  %s\n", n - base[$0], n, $0 }' \
			"$work/code.$base" "$work/code.$mode" | sort -rn | head -n "$CODE_BY_FUNCTION"
	done
fi
