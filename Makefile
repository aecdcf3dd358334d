# Targets: test, unit, lint, fuzz, bench, demo, instr, wall, shared, deps.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
# pg_query_go (SQL parsing) needs cgo; so does the race detector.
export CGO_ENABLED := 1

TESTTIMEOUT ?= 30m
# RACE= (empty) runs the tests without the race detector.
RACE ?= -race
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 5s
FUZZPKGS ?= ./...
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCHPKGS ?= ./...
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOCYCLO ?= github.com/fzipp/gocyclo/cmd/gocyclo@v0.6.0
# The most decision paths a library function may have (cyclomatic complexity): a function past
# it does more than one thing. Tests and examples are not library code.
MAXCYCLO ?= 25

# Modules nested in the repository, each with a replace directive to the library: they need
# what the library does not (XSAM/otelsql and exaring/otelpgx for the comparison, gonum/plot for
# the chart).
NESTED := integration/instr examples/noisy-neighbor examples/shared-budget

.PHONY: test unit lint fuzz bench demo instr wall shared deps

# Installs PostgreSQL's server, redis-server, make and a C compiler from Debian's packages
# when they are missing (as root; otherwise it prints the command to run).
deps:
	.ci/install-deps

# Every test. Integration tests start their own throwaway PostgreSQL (internal/pgtest), or use
# the server named by PGTRAFFIC_TEST_DSN; under CI=true a missing server fails them. They
# include pgx's own database/sql suite run through pgtraffic (integration/TestPgxStdlibSuite).
test: deps
	$(GO) test $(RACE) -count=1 -timeout $(TESTTIMEOUT) ./...
	for m in $(NESTED); do $(GO) test -C $$m $(RACE) -count=1 -timeout $(TESTTIMEOUT) ./...; done

# The tests that need no server (go test -short: internal/pgtest skips the others).
unit:
	$(GO) test -short $(RACE) -count=1 ./...

lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	for m in $(NESTED); do $(GO) vet -C $$m ./...; done
	$(GO) run $(STATICCHECK) ./...
	for m in $(NESTED); do (cd $$m && $(GO) run $(STATICCHECK) ./...); done
	@out="$$($(GO) run $(GOCYCLO) -over $(MAXCYCLO) -ignore '_test\.go$$|^examples/' . 2>&1)" && exit 0; \
	echo "gocyclo: these functions are above complexity $(MAXCYCLO) (split them by concept), or gocyclo failed:"; echo "$$out"; exit 1

# Each Fuzz function in FUZZPKGS for FUZZTIME (FUZZMINIMIZETIME bounds the shrinking of each new input).
fuzz:
	FUZZTIME='$(FUZZTIME)' FUZZMINIMIZETIME='$(FUZZMINIMIZETIME)' FUZZPKGS='$(FUZZPKGS)' integration/scripts/fuzz.sh

# Every Go benchmark (the driver-mode comparison with otelsql included), then the interleaved
# wall-time rounds of every driver mode (integration/scripts/wall.sh).
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) $(BENCHPKGS) | tee bench.out
	$(GO) test -C integration/instr -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) ./... | tee -a bench.out
	integration/scripts/wall.sh | tee -a bench.out

# The walkthrough, then the protection experiment (about 2 minutes; its chart goes to noisy-neighbor.png).
demo: deps
	$(GO) run ./examples/demo
	$(GO) run -C examples/noisy-neighbor . -out "$(CURDIR)/noisy-neighbor.png"

# Instructions per query, and the code each query runs, for each driver mode, database/sql and
# pgx-native, measured with callgrind (WORKLOAD=update: an Exec; MODES, ROUNDS, and
# CODE_BY_FUNCTION=N for the functions that grew that code most: see integration/scripts/instr.sh).
# integration/instr is a module of its own, built here for the script.
instr:
	work="$$(mktemp -d)"; trap 'rm -rf "$$work"' EXIT; \
	$(GO) build -C integration/instr -o "$$work/instr" . && INSTR_BIN="$$work/instr" integration/scripts/instr.sh

# Wall time per statement of each driver mode against raw pgx (raw pgxpool for the pgx-native
# modes), client and server pinned to different CPUs, in five processes (about 4 minutes;
# PROCS, ROUNDS, K and MODES: see integration/scripts/wall.sh). The modes control and
# poolcontrol are the bases again: how far their ratios stray from 1 is the run's own noise.
wall:
	integration/scripts/wall.sh

# The shared-budget experiment: 8 processes share one budget through one
# redis-server (equal and 10:1 demand, max_concurrent, chaos runs, then an election, a ramp
# and 100,000 tenants; 5 runs of each, about 25 minutes).
shared:
	cd examples/shared-budget && $(GO) run . -runs 5
