#!/usr/bin/env bash
# hosts.check.NAME: a case of tests/check/mistakes.c whose peer process runs on another host
# (sv_fork_peer enters B's network namespace), so that its QPs talk RoCE v2: run_case.sh
# runs it under SOFTVERBS_CHECK=1 on host A and compares the reports with the same expected
# file as the same-host run (the checker must say the same on both paths). Exits 77 without
# root.   check_peer.sh SOFTVERBS CASE MISTAKES EXPECTED_DIR
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 3)) || { echo "usage: $0 SOFTVERBS CASE MISTAKES EXPECTED_DIR"; exit 2; }
name=$1 program=$2 expected=$3
here=$(dirname -- "$(readlink -f -- "$0")")
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
hosts_exit_cleanup
trap 'hosts_down' EXIT
hosts_up || exit 1

a_index=$(gid_index_of "$SOFTVERBS" A "$HOST_A_GID4")
b_index=$(gid_index_of "$SOFTVERBS" B "$HOST_B_GID4")
[[ -n $a_index && $a_index == "$b_index" ]] ||
  { echo "FAIL: the veth GIDs' indices differ or are missing (A '$a_index', B '$b_index')"; exit 1; }

# The peer must really be on host B: count the RoCE v2 packets host A receives.
ip netns exec "$HOST_A_NS" nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table inet svh_check {
  chain in { type filter hook input priority 0; iifname "$HOSTS_IF" udp dport 4791 counter; }
}
NFT

in_host A env SV_PEER_NETNS="$HOST_B_NS" SV_PEER_STATE_DIR="$HOST_B_STATE" \
  SV_GID_INDEX="$a_index" bash "$here/../check/run_case.sh" "$SOFTVERBS" "$program" "$name" "$expected"
rc=$?
roce=$(ip netns exec "$HOST_A_NS" nft list table inet svh_check |
  sed -nE 's/.*counter packets ([0-9]+) .*/\1/p')
echo "host A received ${roce:-?} RoCE v2 frames from host B"
((rc == 0)) || exit 1
if ! [[ $roce =~ ^[0-9]+$ ]] || ((roce == 0)); then
  echo "FAIL: no RoCE v2 packet crossed the veth: the peer was not on host B"
  exit 1
fi
echo "PASS hosts.check.$name"
