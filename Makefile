# SPDX-License-Identifier: MIT
# Airlock: the two commands are `make demo` and `make test`; each does its own
# set-up (Debian packages, Go modules, build) through scripts/setup.sh.
.PHONY: all setup build test demo vet clean fuzz docs dist node

# The Go toolchain go.mod names, where scripts/setup.sh had to fetch it
# (a link into the Go module cache; the host's go when it is new enough).
export PATH := $(CURDIR)/bin/toolchain/bin:$(PATH)

all: build

# Each target sets up only what it needs (scripts/setup.sh TARGET).
setup:
	./scripts/setup.sh build

build: setup

vet:
	go vet ./...

test:
	./scripts/setup.sh test
	go vet ./...
	# -p 1: the end-to-end packages load both cores with iperf3; unit tests
	# with timing bounds must not share the machine with them. 45m: the
	# first run of test/bare makes its Debian root and caches (20 minutes
	# on a loaded 2-core machine).
	go test -p 1 -count=1 -timeout 45m ./...

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
fuzz:
	./scripts/setup.sh fuzz
	FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' FUZZFLAGS='$(FUZZFLAGS)' ./scripts/fuzz.sh

# The man pages (docs/man) and the command reference (docs/cli) are made
# from the command definitions in cmd/airlock; a test fails when they are
# stale. Run this after adding or changing a command or flag.
docs:
	go test ./cmd/airlock -run TestGeneratedDocs -update -count=1

# Release artefacts in dist/: static tarball, .deb, .rpm and SHA256SUMS,
# the same bytes for the same commit (docs/install.md).
dist:
	./scripts/setup.sh dist
	./scripts/dist.sh

demo:
	./scripts/setup.sh demo
	./scripts/demo.sh

clean:
	rm -rf bin dist
	$(MAKE) -C preload clean
