#!/usr/bin/env bash
# wall.sh measures the wall time per statement of each driver mode against raw pgx, with the
# client and the server on different CPUs.
#
# It runs TestOverheadRounds (integration/overhead_test.go: every mode in interleaved rounds, so
# that drift of a shared machine cancels) against a throwaway PostgreSQL started by
# internal/pgtest/cmd/pgtest, unless PGTRAFFIC_TEST_DSN names one.
#
# Why pin: on a 2-core machine, an unpinned client, server and scheduler share both cores, and
# where the kernel happens to run each process moves the ratios by more than the 3% being judged.
# Here the server (postmaster and every backend, which inherit its affinity) runs on the last CPU
# and the client, with GOMAXPROCS=1, on CPU 0, so the client's own work is what differs between
# modes. A round trip between two CPUs is slower than on one, so absolute times are higher than
# unpinned ones; the ratios are the figure. An external server (PGTRAFFIC_TEST_DSN) is not pinned.
#
# Without taskset or a second CPU it runs unpinned.
#
# Environment: ROUNDS (default 300), K (statements per mode per round, default 100).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/pgserver.sh
source scripts/pgserver.sh

ROUNDS="${ROUNDS:-300}"
K="${K:-100}"
GO="${GO:-go}"
export CGO_ENABLED=1

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

"$GO" test -c -o "$work/integration.test" ./integration

dsn="${PGTRAFFIC_TEST_DSN:-}"
if [[ -z "$dsn" ]]; then
	start_pgserver "$work" "${server_pin[@]}"
	((${#server_pin[@]})) && echo "wall: server on CPU $((ncpu - 1)), client on CPU 0" >&2
fi

# The test binary runs with the package directory as its working directory, as go test does.
cd integration
PGTRAFFIC_TEST_DSN="$dsn" PGTRAFFIC_OVERHEAD=1 PGTRAFFIC_OVERHEAD_ROUNDS="$ROUNDS" PGTRAFFIC_OVERHEAD_K="$K" \
	GOMAXPROCS=1 "${client_pin[@]}" "$work/integration.test" -test.run '^TestOverheadRounds$' -test.v -test.count=1
