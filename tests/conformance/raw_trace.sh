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
# What the test's raw QPs sent and took: to port 5678 (b's rule) 9 sends + 9 receptions
# (2, 5, 8, 9: b; 4, 5, 9: c ...) at least; the tagged frame to 7777 sent and taken by c.
n5678=$(grep -c '|5678|128$' "$dir/fields.txt" || true)
((n5678 >= 18)) || fail "$n5678 frames to UDP 5678, at least 18 expected"
grep -q '^eth:ethertype:vlan:ethertype:ip:udp.*|291|7777|128$' "$dir/fields.txt" ||
  fail "the 802.1Q frame (VLAN 0x123, UDP 7777) is not there as sent"
! grep -qv '^eth:ethertype:' "$dir/fields.txt" || fail "a frame that is not Ethernet"
tshark -r "$dir/raw.pcap" -n -q -z "expert,error,eth.src == $src" > "$dir/expert.txt" 2>&1
cat "$dir/expert.txt"
! grep -Eq 'Malformed|Errors \([1-9]' "$dir/expert.txt" || fail "tshark finds errors in the frames"
echo "PASS raw_trace"
