#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# fresh-test.sh: run the CI test command (.ci/run, i.e. `make test`) the
# way a new machine would, N times in a row, and report each run's time.
#
#   scripts/fresh-test.sh [-n N] [-r REF] [-k] [-o DIR] [-d]
#
#   -n N    runs (default 1); each starts from a reset machine and a fresh clone
#   -r REF  commit or branch to test (default: this checkout's branch)
#   -k      keep the clones and Go caches of passing runs (failing ones are kept)
#   -o DIR  where logs and the summary go (default /tmp/fresh-test-DATE)
#   -d      dry run: say what the reset would do; change and run nothing
#
# Before each run, as root and holding the heavy lock (/tmp/airlock-heavy.lock,
# taken here unless a parent process already holds it), it resets what earlier
# runs leave on a machine, in steps that are safe while other people's light
# unit tests run:
#   - /dev/net/tun and /dev/fuse back to mode 0600, as a fresh Debian
#     machine has them (the test harness never changes them; see
#     test/topology/tun.go);
#   - the test users (airlocktest, airlocktest2, airlockdemo) deleted, each
#     only if no process runs as it, under the harness's useradd lock;
#   - leftover network namespaces deleted: only those named like the
#     harness's (see harness_netns), with no process in them, made more than
#     LEFTOVER_AGE (default 10) minutes ago; others are listed, not touched;
#   - a fresh clone (git clone of this repository, then checkout REF) with
#     empty Go build and module caches of its own (GOCACHE, GOMODCACHE), so
#     no earlier build or download helps.
# Then it runs `CI=true .ci/run` in the clone with no stdin, like CI, and
# afterwards checks that the run left /dev/net/tun and /dev/fuse at 0600, no process of a
# test user and no new namespace behind. Debian packages stay installed:
# other people use them (scripts/setup.sh installs what is missing).
#
# Exit status: 0 if every run passed and left nothing behind.
set -euo pipefail

runs=1 ref="" keep=0 out="" dry=0
while getopts n:r:ko:d opt; do
	case $opt in
	n) runs=$OPTARG ;;
	r) ref=$OPTARG ;;
	k) keep=1 ;;
	o) out=$OPTARG ;;
	d) dry=1 ;;
	*) sed -n '/^# fresh-test.sh:/,/^#   -d/p' "$0" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "fresh-test: run as root (make test needs it)" >&2; exit 2; }
src=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
[ -n "$ref" ] || ref=$(git -C "$src" rev-parse --abbrev-ref HEAD)
commit=$(git -C "$src" rev-parse --verify "$ref^{commit}")
out=${out:-/tmp/fresh-test-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
summary=$out/summary.txt
lock=/tmp/airlock-heavy.lock
test_users=(airlocktest airlocktest2 airlockdemo)
leftover_age=${LEFTOVER_AGE:-10}
# Names of test/topology's namespaces (PREFIX PID HEX-ROLE, the prefixes
# of topology.WithPrefix in use) and of scripts/demo.sh's.
harness_netns='^((al|sc|bn|fb|sg|bs)[0-9]+[0-9a-f]{6}-[a-z0-9]+|al-demo-[a-z]+-[0-9]+)$'

log() { echo "fresh-test: $*" | tee -a "$summary"; }

# act CMD...: run CMD, or in a dry run only say so.
act() {
	if [ $dry -eq 1 ]; then
		log "dry run: would run: $*"
		return 0
	fi
	"$@"
}

# holds_lock reports whether this process or an ancestor holds an flock on
# the heavy lock (e.g. `flock /tmp/airlock-heavy.lock scripts/fresh-test.sh`),
# from /proc/locks.
holds_lock() {
	[ -e "$lock" ] || return 1
	local ino holders p h
	ino=$(stat -c %i "$lock")
	holders=$(awk -v ino="$ino" '$2 == "FLOCK" { n = split($6, a, ":"); if (a[n] == ino) print $5 }' /proc/locks)
	p=$$
	while [ "$p" -gt 1 ]; do
		for h in $holders; do [ "$h" = "$p" ] && return 0; done
		p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status")
	done
	return 1
}
if [ $dry -eq 0 ] && [ -z "${FRESH_TEST_LOCKED:-}" ] && ! holds_lock; then
	echo "fresh-test: waiting for $lock" >&2
	exec env FRESH_TEST_LOCKED=1 flock "$lock" "$0" "$@"
fi

# pids_in_netns INODE: the PIDs whose network namespace is INODE.
pids_in_netns() {
	local ino=$1 f
	for f in /proc/[0-9]*/ns/net; do
		[ "$(stat -L -c %i "$f" 2>/dev/null)" = "$ino" ] && { f=${f#/proc/}; echo "${f%%/*}"; }
	done
	return 0
}

reset_machine() {
	local dev
	for dev in /dev/net/tun /dev/fuse; do
		[ -e "$dev" ] || continue
		log "reset: $dev is $(stat -c %a "$dev"); set to 600"
		act chmod 0600 "$dev"
	done
	# The harness's useradd lock: no EnsureUser creates a user meanwhile.
	exec 9>/run/airlock-test-useradd.lock
	flock 9
	local tries
	for u in "${test_users[@]}"; do
		id "$u" >/dev/null 2>&1 || continue
		# A light unit test of someone else may run as the user for a
		# moment; give it 10 s.
		tries=0
		while pgrep -u "$u" >/dev/null && [ $tries -lt 10 ]; do
			sleep 1
			tries=$((tries + 1))
		done
		if pgrep -u "$u" >/dev/null; then
			log "reset: NOT deleting user $u: processes $(pgrep -d, -u "$u") run as it"
			continue
		fi
		log "reset: deleting user $u"
		act userdel "$u"
	done
	flock -u 9
	exec 9>&-
	local ns ino age
	for ns in $(ip netns list | awk '{ print $1 }'); do
		if ! [[ $ns =~ $harness_netns ]]; then
			log "reset: leaving namespace $ns (not named like the harness's)"
			continue
		fi
		ino=$(stat -c %i "/run/netns/$ns" 2>/dev/null) || continue
		age=$((($(date +%s) - $(stat -c %Y "/run/netns/$ns")) / 60))
		if [ -n "$(pids_in_netns "$ino")" ] || [ "$age" -lt "$leftover_age" ]; then
			log "reset: leaving namespace $ns (in use or made $age min ago)"
			continue
		fi
		log "reset: deleting namespace $ns (made $age min ago, no process in it)"
		act ip netns del "$ns"
		act rm -rf "/etc/netns/$ns"
	done
}

# check_after: what a passing run must not leave behind.
check_after() {
	local bad=0 u ns
	local dev
	for dev in /dev/net/tun /dev/fuse; do
		if [ -e "$dev" ] && [ "$(stat -c %a "$dev")" != 600 ]; then
			log "after: $dev is $(stat -c %a "$dev"), want 600"
			bad=1
		fi
	done
	for u in "${test_users[@]}"; do
		if id "$u" >/dev/null 2>&1 && pgrep -u "$u" >/dev/null; then
			log "after: processes of $u left: $(pgrep -a -u "$u" | head -5 | tr '\n' ';')"
			bad=1
		fi
	done
	for ns in $(ip netns list | awk '{ print $1 }'); do
		if ! grep -qx "$ns" "$1"; then
			log "after: namespace $ns appeared during the run and is still there"
			bad=1
		fi
	done
	return $bad
}

log "testing $ref ($commit) from $src, $runs run(s); logs in $out"
if [ $dry -eq 1 ]; then
	reset_machine
	exit 0
fi
failed=0
for i in $(seq "$runs"); do
	reset_machine
	dir=$(mktemp -d /tmp/fresh-airlock.XXXXXX)
	chmod 0755 "$dir" # like a CI checkout: the test user reads what the tests build there
	git clone -q "$src" "$dir/src"
	git -C "$dir/src" checkout -q "$commit"
	ip netns list | awk '{ print $1 }' >"$dir/netns-before"
	log "run $i: $(uptime)"
	start=$(date +%s)
	set +e
	(cd "$dir/src" && env CI=true GOCACHE="$dir/gocache" GOMODCACHE="$dir/gomod" GOFLAGS=-modcacherw \
		./.ci/run </dev/null >"$out/run$i.log" 2>&1)
	rc=$?
	set -e
	secs=$(($(date +%s) - start))
	took=$(printf '%dm%02ds' $((secs / 60)) $((secs % 60)))
	if [ $rc -eq 0 ]; then
		log "run $i: PASS in $took (.ci/run exit 0)"
	else
		log "run $i: FAIL in $took (.ci/run exit $rc); see $out/run$i.log:"
		grep -E '^(--- FAIL|FAIL|panic:)' "$out/run$i.log" | head -20 | tee -a "$summary"
		failed=1
	fi
	if ! check_after "$dir/netns-before"; then
		failed=1
	fi
	if [ $rc -eq 0 ] && [ $keep -eq 0 ]; then
		rm -rf "$dir"
	else
		log "run $i: kept $dir"
	fi
done
# Leave the machine as fresh as it was found (the runs recreate users).
reset_machine
[ $failed -eq 0 ] && log "all $runs run(s) passed" || log "some run failed"
exit $failed
