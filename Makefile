# SPDX-License-Identifier: MIT
# Airlock: the two commands are `make demo` and `make test`; each does its own
# set-up (Debian packages, Go modules, build) through scripts/setup.sh.
.PHONY: all setup build test demo vet clean fuzz docs dist node

all: build

setup:
	./scripts/setup.sh

build: setup

vet:
	go vet ./...

test: setup
	go vet ./...
	# -p 1: the end-to-end packages load both cores with iperf3; unit tests
	# with timing bounds must not share the machine with them.
	go test -p 1 -count=1 -timeout 30m ./...

# The node build: airlock run and version only, without the gateway's and
# the fleet's packages, for compute nodes (docs/install.md, "The node
# binary").
node: setup
	CGO_ENABLED=0 go build -tags airlock_node -o bin/airlock-node ./cmd/airlock

# Every fuzzer of outside input, FUZZTIME each (default 60s); see
# docs/fuzzing.md. FUZZ=REGEX picks some, FUZZFLAGS='-parallel 1' etc.
FUZZTIME ?= 60s
FUZZ ?= .
FUZZFLAGS ?=
fuzz: setup
	FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' FUZZFLAGS='$(FUZZFLAGS)' ./scripts/fuzz.sh

# The man pages (docs/man) and the command reference (docs/cli) are made
# from the command definitions in cmd/airlock; a test fails when they are
# stale. Run this after adding or changing a command or flag.
docs:
	go test ./cmd/airlock -run TestGeneratedDocs -update -count=1

# Release artefacts in dist/: static tarball, .deb, .rpm and SHA256SUMS,
# the same bytes for the same commit (docs/install.md).
dist: setup
	./scripts/dist.sh

demo: setup
	./scripts/demo.sh

clean:
	rm -rf bin dist
	$(MAKE) -C preload clean
