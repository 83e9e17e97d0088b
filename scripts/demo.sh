#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Airlock demo: builds a throwaway compute-node / DMZ / outside topology out
# of network namespaces, starts an unprivileged gateway in the DMZ, runs a
# sample job through it as an unprivileged user on the compute node, shows
# what the job reached, and removes everything again.
#
#   cn   (compute node: 198.51.100.2, no route out)
#    |
#   dmz  (gateway host: inside 198.51.100.1, outside 203.0.113.1 with the
#    |   default route; no forwarding; the gateway listens inside only)
#    |
#   inet (outside: 203.0.113.2, HTTP + DNS + iperf3 servers)
#
# Needs root (to build namespaces); the gateway and the job run as the
# unprivileged user 'airlockdemo', created if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if [ "$(id -u)" -ne 0 ]; then
	echo "demo: run as root (it creates network namespaces); airlock itself runs unprivileged inside" >&2
	exit 1
fi

suffix=$$
CN=al-demo-cn-$suffix DMZ=al-demo-dmz-$suffix INET=al-demo-inet-$suffix
work=$(mktemp -d /tmp/airlock-demo.XXXXXX)
chmod 0755 "$work"
pids=()

cleanup() {
	set +e
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
	for ns in "$CN" "$DMZ" "$INET"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "/etc/netns/$DMZ" "$work"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "building peers"
CGO_ENABLED=0 go build -o "$work/airlock-testpeer" ./test/topology/cmd/airlock-testpeer
cp bin/airlock bin/libairlock-preload.so "$work/"

id airlockdemo >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin airlockdemo
U=$(id -u airlockdemo) G=$(id -g airlockdemo)

# Most distributions ship /dev/net/tun 0666 (creating a TUN still needs
# CAP_NET_ADMIN in a namespace the user owns). Rather than chmod the
# host's device, the demo's user commands see a 0666 node of the same
# device, bind-mounted over /dev/net/tun in their own mount namespace
# (ip netns exec makes one): the host's device never changes.
tun_mode=$(stat -c %a /dev/net/tun)
mkdir -m 0700 "$work/dev" && mknod -m 0666 "$work/dev/tun" c 10 200
[ "$tun_mode" = 666 ] || echo "/dev/net/tun is mode $tun_mode here (most distributions ship 0666); the demo's user commands get a 0666 node of it in a private mount namespace"
# ip netns exec NS "${as_demo[@]}" CMD...: run CMD as airlockdemo (every
# step execs the next, so $! is CMD's PID).
as_demo=(sh -c 'mount --bind "$0" /dev/net/tun && exec "$@"' "$work/dev/tun"
	setpriv --reuid="$U" --regid="$G" --clear-groups --)

step "building namespaces $CN / $DMZ / $INET"
for ns in "$CN" "$DMZ" "$INET"; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
ip link add cn0 netns "$CN" type veth peer name dmz0 netns "$DMZ"
ip link add dmz1 netns "$DMZ" type veth peer name inet0 netns "$INET"
ip -n "$CN" addr add 198.51.100.2/24 dev cn0 && ip -n "$CN" link set cn0 up
ip -n "$DMZ" addr add 198.51.100.1/24 dev dmz0 && ip -n "$DMZ" link set dmz0 up
ip -n "$DMZ" addr add 203.0.113.1/24 dev dmz1 && ip -n "$DMZ" link set dmz1 up
ip -n "$INET" addr add 203.0.113.2/24 dev inet0 && ip -n "$INET" link set inet0 up
# Two-homed like a real DMZ host: the default route leads outside, so the
# gateway finds its public (egress) address, 203.0.113.1, by itself.
ip -n "$DMZ" route add default via 203.0.113.2

step "starting outside servers in $INET: HTTP :8080, DNS :53 (zone demo.test), iperf3 :5201"
mkdir -p "$work/www"
head -c $((20 << 20)) /dev/urandom >"$work/www/data.bin"
echo '{"files.demo.test.": "203.0.113.2"}' >"$work/zone.json"
ip netns exec "$INET" "$work/airlock-testpeer" http "$work/www" 203.0.113.2:8080 >/dev/null 2>&1 & pids+=($!)
ip netns exec "$INET" "$work/airlock-testpeer" dns 203.0.113.2:53 "$work/zone.json" >/dev/null 2>&1 & pids+=($!)
ip netns exec "$INET" iperf3 -s -B 203.0.113.2 >/dev/null 2>&1 & pids+=($!)

step "without airlock, the compute node cannot reach the outside"
if ip netns exec "$CN" curl -sS --max-time 2 -o /dev/null http://203.0.113.2:8080/data.bin 2>&1; then
	echo "unexpected: direct access worked" >&2; exit 1
fi

step "starting the gateway in $DMZ as user airlockdemo (unprivileged, user mode: jobs' TCP in the kernel of its own user namespace)"
mkdir -p "/etc/netns/$DMZ" && echo "nameserver 203.0.113.2" >"/etc/netns/$DMZ/resolv.conf"
# Let the unprivileged gateway relay jobs' pings through ping sockets.
ip netns exec "$DMZ" sysctl -qw net.ipv4.ping_group_range="0 2147483647"
mkdir -p "$work/gw" && chown "$U:$G" "$work/gw"
ip netns exec "$DMZ" "${as_demo[@]}" \
	"$work/airlock" gateway --state "$work/gw/state" --listen 198.51.100.1:8443 2>"$work/gateway.log" & pids+=($!)
for _ in $(seq 100); do [ -f "$work/gw/state/join.env" ] && break; sleep 0.1; done
[ -f "$work/gw/state/join.env" ] || { cat "$work/gateway.log"; exit 1; }
cat "$work/gw/state/join.env"
TOKEN=$(ip netns exec "$DMZ" "${as_demo[@]}" "$work/airlock" token create --state "$work/gw/state" --name demo)
echo "AIRLOCK_TOKEN=${TOKEN:0:12}… (made with: airlock token create --state DIR --name demo)"

step "running a job on $CN as airlockdemo: airlock run -- sh job.sh"
cat >"$work/job.sh" <<'JOB'
echo "uid inside: $(id -u)"
ip -4 -o addr show tun0 | awk '{print "interface:", $2, $4}'
echo "resolver:  $(grep nameserver /etc/resolv.conf)"
echo "DNS:       $(getent hosts files.demo.test)"
curl -sS -o /dev/null -w 'HTTP:      %{size_download} bytes in %{time_total}s\n' http://files.demo.test:8080/data.bin
iperf3 -c files.demo.test -t 2 -f m | awk '/sender|receiver/ {print "iperf3:   ", $7, $8, $NF}'
ping -c 2 -W 2 files.demo.test | awk -F'[ =/]+' '/rtt/ {print "ping:      avg", $8, "ms"}'
exit 7
JOB
chmod 0644 "$work/job.sh"
set +e
during=$(date -u -d '+1 sec' +%Y-%m-%dT%H:%M:%SZ)
# shellcheck disable=SC1090
(set -a; . "$work/gw/state/join.env"; export AIRLOCK_TOKEN="$TOKEN" AIRLOCK_JOB_ID=demo-42
	ip netns exec "$CN" "${as_demo[@]}" "$work/airlock" run -- sh "$work/job.sh")
rc=$?
set -e
echo "job exit status: $rc (the job exits 7; airlock returns it unchanged)"

step "the same node without user namespaces: airlock run --mode seccomp / preload (user-space stack in airlock run)"
cat >"$work/fallback.sh" <<'JOB'
echo "interfaces: $(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')(the node's own; no tun0)"
curl -sS --noproxy '*' -o /dev/null -w "HTTP:       %{size_download} bytes by name in %{time_total}s\n" http://files.demo.test:8080/data.bin
iperf3 -c files.demo.test -t 2 -f m | awk '/receiver/ {print "iperf3:    ", $7, $8}'
JOB
chmod 0644 "$work/fallback.sh"
for mode in seccomp preload; do
	(set -a; . "$work/gw/state/join.env"; export AIRLOCK_TOKEN="$TOKEN" AIRLOCK_JOB_ID=demo-$mode
		ip netns exec "$CN" "${as_demo[@]}" "$work/airlock" run --mode "$mode" -- sh "$work/fallback.sh")
done

step "gateway log"
grep -E 'egress address|egress started|gateway ready|job joined|job left' "$work/gateway.log" | cut -c1-220

step "attribution: which job held a source port seen outside? (airlock whois, from the state db alone)"
port=$(grep -o 'ports=[0-9]*' "$work/gateway.log" | head -1 | cut -d= -f2)
ip netns exec "$DMZ" "${as_demo[@]}" \
	"$work/airlock" whois --state "$work/gw/state" --at "$during" "203.0.113.1:$((port + 5))" || true
[ "$rc" -eq 7 ] || exit 1
step "done; cleaning up"
