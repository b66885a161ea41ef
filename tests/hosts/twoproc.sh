#!/usr/bin/env bash
# hosts.twoproc.NAME: a two-process conformance test (tests/conformance/twoproc_NAME.c) across
# two hosts: the test runs on host A, the peers it forks run on host B (sv_fork_peer enters
# B's network namespace and state directory, tests/conformance/common.c), both sides name
# their veth address's GID (SV_GID_INDEX) and trade GIDs with their QPNs. Passes when the
# program exits 0 with "PASS twoproc_NAME" as its last line. Exits 77 (skipped) without root.
#   twoproc.sh SOFTVERBS NAME PROGRAM
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 2)) || { echo "usage: $0 SOFTVERBS NAME PROGRAM"; exit 2; }
name=twoproc_$1 program=$2
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
out=$(mktemp)
hosts_exit_cleanup
trap 'hosts_down; rm -f -- "$out"' EXIT
hosts_up || exit 1

# One index for both sides (the harness has one SV_GID_INDEX): the veth IPv4's, 1 in these
# namespaces (README.md).
a_index=$(gid_index_of "$SOFTVERBS" A "$HOST_A_GID4")
b_index=$(gid_index_of "$SOFTVERBS" B "$HOST_B_GID4")
[[ -n $a_index && $a_index == "$b_index" ]] ||
  { echo "FAIL: the veth GIDs' indices differ or are missing (A '$a_index', B '$b_index')"; exit 1; }

# Counts the RoCE v2 packets host A receives: the test must have crossed the veth (a peer
# left on A's state directory would talk through shared memory and pass unseen).
ip netns exec "$HOST_A_NS" nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table inet svh_twoproc {
  chain in { type filter hook input priority 0; iifname "$HOSTS_IF" udp dport 4791 counter; }
}
NFT

# The program's own watchdog (50 s) names the step that hangs; timeout is the backstop.
in_host A env SV_PEER_NETNS="$HOST_B_NS" SV_PEER_STATE_DIR="$HOST_B_STATE" \
  SV_GID_INDEX="$a_index" timeout -k 2 55 "$SOFTVERBS" run -- "$program" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
if grep -qE "Sanitizer|runtime error:" "$out"; then
  echo "FAIL: a sanitizer report"
  exit 1
fi
last=$(grep -v '^[[:space:]]*$' "$out" | tail -n 1)
# A test whose subject the machine lacks (twoproc_dmabuf without a dma-buf exporter).
if ((rc == 0)) && [[ $last == "SKIP $name"* ]]; then
  echo "skipped: $last"
  exit 77
fi
if ((rc != 0)) || [[ $last != "PASS $name" ]]; then
  echo "FAIL: exit code $rc, last line '$last' (expected 'PASS $name')"
  exit 1
fi
roce=$(ip netns exec "$HOST_A_NS" nft list table inet svh_twoproc |
  sed -nE 's/.*counter packets ([0-9]+) .*/\1/p')
echo "host A received ${roce:-?} RoCE v2 frames from host B (a GSO send crosses the veth as one)"
if ! [[ $roce =~ ^[0-9]+$ ]] || ((roce == 0)); then
  echo "FAIL: no RoCE v2 packet crossed the veth: the peer was not on host B"
  exit 1
fi
