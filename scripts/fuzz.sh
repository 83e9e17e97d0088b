#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs every native Go fuzzer of a decoder that takes outside input, one
# after another, each for FUZZTIME (default 60s), and prints one summary
# line per fuzzer: name, package, time, executions, result.
#
#   FUZZTIME=10m FUZZFLAGS='-parallel 1' nice -n 19 scripts/fuzz.sh
#
# FUZZ limits the run to the fuzzers whose names match it (grep -E).
# Exits non-zero if any fuzzer failed; a failing input is left in the
# package's testdata/fuzz/NAME/ (commit it as a seed once fixed).
set -u
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-60s}
FUZZFLAGS=${FUZZFLAGS:-}
FUZZ=${FUZZ:-.}
LOG=${FUZZLOG:-$(mktemp -d /tmp/airlock-fuzz.XXXXXX)}
mkdir -p "$LOG"

# package:fuzzer — what each decodes, and who sends it:
FUZZERS="
./internal/control:FuzzControlRequest
./internal/control:FuzzDecodeJoinRequest
./internal/control:FuzzDecodeLeaseRef
./internal/control:FuzzDecodeSessionRequest
./internal/control:FuzzDecodeLease
./internal/tunnel:FuzzFrameReader
./internal/tunnel:FuzzParseHandshakes
./internal/config:FuzzParse
./internal/flows:FuzzParseBulkRule
./internal/proxy:FuzzReadRequest
./internal/proxy:FuzzSOCKSConn
./internal/proxy:FuzzParseUDPDatagram
./internal/proxy:FuzzHTTPProxy
./internal/admin:FuzzAdminRequest
./internal/seccompnotify:FuzzParseSockaddr
./internal/forward/netstack:FuzzWrite
./internal/munge:FuzzDecodeResponse
./internal/attest:FuzzParsePayload
./internal/bearer:FuzzVerify
./internal/flows:FuzzReportBypass
"
# Every fuzzer in the tree runs, listed above or not: one added without a
# line here is found and run too, with a warning to list it.
for f in $(grep -rl --include='*_test.go' '^func Fuzz' internal cmd test 2>/dev/null | sort); do
	pkg=./$(dirname "$f")
	for name in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
		case "$FUZZERS
" in
		*"
$pkg:$name
"*) ;;
		*)
			echo "fuzz.sh: $pkg $name is not in the list in scripts/fuzz.sh; running it anyway" >&2
			FUZZERS="$FUZZERS
$pkg:$name"
			;;
		esac
	done
done
# control: the gateway's control port (anyone on the network, then token
# and lease holders); tunnel: TCP transport frames (lease holders) and the
# WireGuard UAPI text; config: the site's config file; flows: --bulk
# rules; proxy: the fallback proxies (local users, then the job);
# admin: the admin socket (the gateway's user); seccompnotify: a job's
# connect() arguments; netstack: packets from jobs; munge: munged's
# answers about joins' credentials; attest: credential payloads (made by
# a job's user or root on a node); flows: a lease holder's bypass
# reports; bearer: the bearer tokens jobs present.

fail=0
printf '%-22s %-28s %8s %12s %s\n' FUZZER PACKAGE SECONDS EXECS RESULT
for f in $FUZZERS; do
	pkg=${f%%:*}
	name=${f##*:}
	echo "$name" | grep -Eq -- "$FUZZ" || continue
	start=$(date +%s)
	corpus=$pkg/testdata/fuzz/$name
	before=$(ls "$corpus" 2>/dev/null | wc -l)
	# -timeout: go test's default (10m) would end a 10-minute run just as
	# it finishes. FUZZTIMEOUT bounds the whole run instead.
	# shellcheck disable=SC2086 # FUZZFLAGS is a list of flags
	go test -run '^$' -fuzz "^$name\$" -fuzztime "$FUZZTIME" -timeout "${FUZZTIMEOUT:-24h}" $FUZZFLAGS "$pkg" >"$LOG/$name.log" 2>&1
	rc=$?
	secs=$(($(date +%s) - start))
	execs=$(grep -o 'execs: [0-9]*' "$LOG/$name.log" | tail -1 | cut -d' ' -f2)
	result=ok
	if [ $rc -ne 0 ]; then
		after=$(ls "$corpus" 2>/dev/null | wc -l)
		if [ "$after" -eq "$before" ] && grep -q '^    context deadline exceeded$' "$LOG/$name.log" && ! grep -q 'Failing input written' "$LOG/$name.log"; then
			# Go's fuzz coordinator can report its own -fuzztime
			# deadline as a failure (go.dev/issue/75804, fixed in
			# Go 1.27): no input failed, none was written.
			result="ok (go#75804: the coordinator's deadline reported as a failure; no failing input)"
		else
			result="FAIL (see $LOG/$name.log)"
			fail=1
		fi
	fi
	printf '%-22s %-28s %8s %12s %s\n' "$name" "$pkg" "$secs" "${execs:-?}" "$result"
done
exit $fail
