#!/usr/bin/env bash
# `softverbs trace -w FILE` between the two hosts: the server on A and the client on B each
# write their RoCE v2 packets (ibv_rc_pingpong with multi-packet SENDs, ib_read_lat,
# ib_atomic_lat) to a pcap file, which must hold the packets of both directions, each one
# dissected by tshark as InfiniBand over UDP 4791 with no malformed packet and no expert
# error, and with a valid ICRC (tests/unit/roce_pcap_tshark.sh --pcap).
#   trace.sh SOFTVERBS. Exit 77 (skipped) without root or tshark.
set -euo pipefail
here=$(dirname "$0")
source "$here/netns.sh"
softverbs=$1
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
command -v tshark >/dev/null || { echo "skipped: no tshark"; exit 77; }
hosts_exit_cleanup
hosts_up || exit 1
dir=$(mktemp -d)
trap 'hosts_down; rm -rf "$dir"' EXIT
a=$(host_var A IP4)
index=$(gid_index_of "$softverbs" A "$(host_var A GID4)")

# run_pair NAME PROGRAM ARGS...: the server traced on A, the client traced on B.
run_pair() {
  local name=$1 prog=$2
  shift 2
  local gid_opt=-g
  [[ $prog == ib_* ]] && gid_opt=-x
  in_host A timeout 30 "$softverbs" trace -w "$dir/$name-a.pcap" -- "$prog" "$gid_opt" "$index" "$@" \
    >"$dir/$name-a.log" 2>&1 &
  local server=$!
  sleep 0.5
  if ! in_host B timeout 30 "$softverbs" trace -w "$dir/$name-b.pcap" -- "$prog" "$gid_opt" "$index" "$@" "$a" \
    >"$dir/$name-b.log" 2>&1; then
    cat "$dir/$name-a.log" "$dir/$name-b.log"
    echo "FAIL: $name client"
    exit 1
  fi
  wait "$server" || { cat "$dir/$name-a.log"; echo "FAIL: $name server"; exit 1; }
  local side
  for side in a b; do
    local pcap=$dir/$name-$side.pcap
    [[ -s $pcap ]] || { echo "FAIL: no trace $pcap"; exit 1; }
    bash "$here/../unit/roce_pcap_tshark.sh" --pcap "$pcap" | tail -2
    # Both directions: packets from A and from B.
    local from_a from_b
    from_a=$(HOME=$dir tshark -r "$pcap" -n -Y "ip.src == $a && infiniband" 2>/dev/null | wc -l)
    from_b=$(HOME=$dir tshark -r "$pcap" -n -Y "ip.src != $a && infiniband" 2>/dev/null | wc -l)
    ((from_a > 0 && from_b > 0)) || { echo "FAIL: $pcap: $from_a packets from A, $from_b from B"; exit 1; }
    echo "$name-$side: $from_a packets from A, $from_b from B"
  done
}

run_pair rc_pingpong ibv_rc_pingpong -n 20 -s 3000
run_pair read_lat ib_read_lat -n 50
run_pair atomic_lat ib_atomic_lat -n 50
echo "ok: traces of both hosts dissect as RoCE v2"
