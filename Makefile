# Airlock: the two commands are `make demo` and `make test`; each does its own
# set-up (Debian packages, Go modules, build) through scripts/setup.sh.
.PHONY: all setup build test demo vet clean

all: build

setup:
	./scripts/setup.sh

build: setup

vet:
	go vet ./...

test: setup
	go vet ./...
	go test -count=1 -timeout 30m ./...

demo: setup
	./scripts/demo.sh

clean:
	rm -rf bin
