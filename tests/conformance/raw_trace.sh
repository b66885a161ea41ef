#!/usr/bin/env bash
# `softverbs trace` of raw packet QPs (docs/raw-packet.md): the pcap holds every frame a raw
# QP of the program sent or took, as it was, and tshark reads them with no malformed
# packet or expert error. Runs conformance.raw_packet's one-process part on lo.
# Usage: raw_trace.sh SOFTVERBS RAW_PACKET_TEST. Exit 77 (skip) without tshark.
set -euo pipefail
command -v tshark >/dev/null || { echo "tshark not installed: skipped"; exit 77; }
softverbs=$1 test=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export HOME=$dir  # tshark wants a writable profile directory
fail() { echo "FAIL raw_trace: $*"; exit 1; }

out=$(SOFTVERBS_RAW_NETDEV=lo SV_RAW_ONE_PROCESS=1 "$softverbs" trace -w "$dir/raw.pcap" -- "$test" 2>&1) ||
  { echo "$out"; fail "the traced test failed"; }
grep -q '^SKIP' <<<"$out" && { echo "$out"; echo "no CAP_NET_RAW: skipped"; exit 77; }
grep -q '^PASS raw_packet' <<<"$out" || { echo "$out"; fail "the traced test did not pass"; }

# Only the test's own frames: its catch-all rules also take other programs' frames on lo
# (ctest runs tests side by side), which are recorded too and are not ours to judge.
src=$(sed -n 's/^-- frames from \([0-9a-f:]*\)$/\1/p' <<<"$out")
[[ -n $src ]] || fail "the test did not say its MAC"
tshark -r "$dir/raw.pcap" -n -Y "eth.src == $src" -T fields -E separator='|' \
  -e frame.protocols -e vlan.id -e udp.dstport -e frame.len > "$dir/fields.txt"
sort "$dir/fields.txt" | uniq -c
# What the one-process run sends and takes, each frame once per direction: to UDP 5678, 7
# sent (tags 1, 2, 4, 5, 6, 8, 9) + 16 RSS frames = 23, and taken: 2, 4, 5, 8, 9 (5 and 9 by
# two QPs: recorded once) + the 16 RSS ones = 21, so 44; to 4444 one sent, one taken (c's
# MC_DEFAULT); to 9999 one sent, none taken; the tagged frame to 7777 sent and taken by c.
count() { grep -c "$1" "$dir/fields.txt" || true; }
n=$(count '|5678|128$'); ((n == 44)) || fail "$n frames to UDP 5678, 44 expected (23 sent, 21 taken)"
n=$(count '|4444|128$'); ((n == 2)) || fail "$n frames to UDP 4444, 2 expected (sent, taken)"
n=$(count '|9999|128$'); ((n == 1)) || fail "$n frames to UDP 9999, 1 expected (sent only)"
n=$(count '^eth:ethertype:vlan:ethertype:ip:udp.*|291|7777|128$')
((n == 2)) || fail "$n 802.1Q frames (VLAN 0x123, UDP 7777) as sent, 2 expected (sent, taken)"
! grep -qv '^eth:ethertype:' "$dir/fields.txt" || fail "a frame that is not Ethernet"
tshark -r "$dir/raw.pcap" -n -q -z "expert,error,eth.src == $src" > "$dir/expert.txt" 2>&1
cat "$dir/expert.txt"
! grep -Eq 'Malformed|Errors \([1-9]' "$dir/expert.txt" || fail "tshark finds errors in the frames"
echo "PASS raw_trace"
