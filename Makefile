# Targets: test, lint, fuzz, bench, demo, instr, wall, shared.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

GO ?= go
# pg_query_go (SQL parsing) needs cgo; so does the race detector.
export CGO_ENABLED := 1

TESTTIMEOUT ?= 30m
FUZZTIME ?= 30s
FUZZPKGS ?= ./...
BENCHTIME ?= 1s
BENCHCOUNT ?= 1
BENCHPKGS ?= ./...

.PHONY: test lint fuzz bench demo instr wall shared

# Integration tests start their own throwaway PostgreSQL (internal/pgtest), or use the server
# named by PGTRAFFIC_TEST_DSN.
test:
	$(GO) test -race -count=1 -timeout $(TESTTIMEOUT) ./...

lint:
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# Each Fuzz function in FUZZPKGS for FUZZTIME.
fuzz:
	FUZZTIME='$(FUZZTIME)' FUZZPKGS='$(FUZZPKGS)' integration/scripts/fuzz.sh

# Every Go benchmark, then the interleaved wall-time rounds of every driver mode (integration/scripts/wall.sh).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count $(BENCHCOUNT) $(BENCHPKGS) | tee bench.out
	integration/scripts/wall.sh | tee -a bench.out

# The walkthrough, then the protection experiment (about 70 s; its chart goes to noisy-neighbor.png).
demo:
	$(GO) run ./examples/demo
	$(GO) run ./examples/noisy-neighbor -out noisy-neighbor.png

# Instructions per query for each driver mode, measured with callgrind (WORKLOAD=update: an Exec).
instr:
	integration/scripts/instr.sh

# Wall time per statement of each driver mode against raw pgx, client and server pinned to
# different CPUs, in five processes (about 3 minutes; PROCS, ROUNDS and K: see integration/scripts/wall.sh).
wall:
	integration/scripts/wall.sh

# The shared-budget experiment of issue 16: 8 processes share one budget through one
# redis-server (equal and 10:1 demand, max_concurrent, and chaos runs; about 15 minutes).
shared:
	cd examples/shared-budget && $(GO) run . -runs 5
