# pgserver.sh is sourced by the measuring scripts (instr.sh, wall.sh): start_pgserver starts a
# throwaway PostgreSQL (internal/pgtest/cmd/pgtest) and stop_pgserver stops it.
#
# start_pgserver WORK [COMMAND PREFIX...] builds the server program into WORK and runs it (after
# the prefix, e.g. "taskset -c 1"), then sets dsn and server_pid. The server stops when its stdin
# closes: the calling script holds the only write end (fd 3), so it is stopped even if the script
# is killed; stop_pgserver closes it and waits.

start_pgserver() {
	local work=$1
	shift
	"${GO:-go}" build -o "$work/pgserver" ./internal/pgtest/cmd/pgtest
	mkfifo "$work/hold"
	"$@" "$work/pgserver" -stdin <"$work/hold" >"$work/dsn" 2>"$work/pgserver.err" &
	server_pid=$!
	exec 3>"$work/hold"
	for _ in $(seq 1200); do # up to 120 s: initdb on a busy machine
		[[ -s "$work/dsn" ]] && break
		if ! kill -0 "$server_pid" 2>/dev/null; then
			echo "$(basename "$0"): PostgreSQL did not start:" >&2
			cat "$work/pgserver.err" >&2
			return 1
		fi
		sleep 0.1
	done
	if [[ ! -s "$work/dsn" ]]; then
		echo "$(basename "$0"): PostgreSQL did not start within 120 s" >&2
		return 1
	fi
	dsn="$(head -n 1 "$work/dsn")"
}

stop_pgserver() {
	if [[ -n "${server_pid:-}" ]]; then
		exec 3>&-
		wait "$server_pid" 2>/dev/null || true
	fi
}
