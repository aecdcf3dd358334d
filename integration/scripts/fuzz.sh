#!/usr/bin/env bash
# fuzz.sh runs every Fuzz function in FUZZPKGS (default ./..., the whole module) for FUZZTIME
# (default 30s) each, one at a time: go test -fuzz takes a single target in a single package.
# The targets are discovered with go test -list, so new fuzz tests need no edit here.
# Failing inputs are written under the package's testdata/fuzz/ by go test, as usual.
# FUZZMINIMIZETIME (default 5s) bounds the shrinking of each new input: go test's default, 60s,
# is spent on one input of a slow target (rules.FuzzParse shrinking a full rules file), so that
# a run of FUZZTIME would mutate almost nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."

FUZZTIME="${FUZZTIME:-30s}"
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-5s}"
read -r -a pkgs <<<"${FUZZPKGS:-./...}"
GO="${GO:-go}"
export CGO_ENABLED=1

# go test -list prints the matching names of a package, then its "ok <package> <time>" line.
targets="$("$GO" test -list '^Fuzz' "${pkgs[@]}" | awk '
	/^Fuzz/ { names[n++] = $1; next }
	/^ok /  { for (i = 0; i < n; i++) print $2, names[i]; n = 0 }
')"

if [[ -z "$targets" ]]; then
	echo "fuzz: no Fuzz functions found"
	exit 0
fi

failed=()
while read -r pkg name; do
	echo "=== fuzz $pkg $name for $FUZZTIME"
	if ! "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg"; then
		failed+=("$pkg $name")
	fi
done <<<"$targets"

if ((${#failed[@]} > 0)); then
	echo "fuzz: failed:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "fuzz: $(wc -l <<<"$targets") targets passed"
