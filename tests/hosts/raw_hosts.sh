#!/usr/bin/env bash
# Raw packet QPs between the two hosts of netns.sh (docs/raw-packet.md): a raw QP on B with
# a steering rule (destination MAC and UDP port) gets every frame a raw QP on A sends it,
# once and whole, and none of those to another port. Exits 77 without root.
#   raw_hosts.sh SOFTVERBS CASE RAW_FRAMES
# CASE: unicast (to B's veth MAC) or group (to a multicast MAC).
# shellcheck disable=SC2016 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 2)) || { echo "usage: $0 SOFTVERBS CASE RAW_FRAMES"; exit 2; }
case_name=$1 raw_frames=$2
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
tmp=$(mktemp -d)
hosts_exit_cleanup
trap 'hosts_down; rm -rf -- "$tmp"' EXIT
hosts_up || exit 1

count=200 port=5678
case $case_name in
  unicast) dst=self ;;
  group) dst=01:00:5e:00:00:42 ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac

in_host B env SOFTVERBS_RAW_NETDEV="$HOSTS_IF" "$SOFTVERBS" run -- "$raw_frames" recv $count $port $dst \
  >"$tmp/recv.out" 2>"$tmp/recv.err" &
receiver=$!
for ((i = 0; i < 100; i++)); do
  grep -q '^ready ' "$tmp/recv.out" 2>/dev/null && break
  sleep 0.05
done
check "B's receiver is ready" "grep -q '^ready ' '$tmp/recv.out'"
mac=$(sed -n 's/^ready //p' "$tmp/recv.out")
run in_host A env SOFTVERBS_RAW_NETDEV="$HOSTS_IF" "$SOFTVERBS" run -- "$raw_frames" send $count $port "$mac"
check "A sent $count frames to $mac, port $port (and $count to another port)" \
  "((rc == 0)) && stdout_has '^sent $count\$'"
wait "$receiver"
r_rc=$?
cat "$tmp/recv.out"
check "B received all $count, none twice, none bad, none of the other port's" \
  "((r_rc == 0)) && grep -q '^received $count dup 0 bad 0\$' '$tmp/recv.out'"
check "B: no sanitizer report" "! grep -Eq 'Sanitizer|runtime error:' '$tmp/recv.out' '$tmp/recv.err'"
((failures == 0)) || cat "$tmp/recv.err"
finish
