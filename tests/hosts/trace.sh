#!/usr/bin/env bash
# `softverbs trace -w FILE` between the two hosts: the server on A and the client on B each
# write their RoCE v2 packets (ibv_rc_pingpong with multi-packet SENDs, ib_read_lat,
# ib_atomic_lat) to a pcap file, which must hold the packets of both directions, each one
# dissected by tshark as InfiniBand over UDP 4791 with no malformed packet and no expert
# error, and with a valid ICRC (tests/unit/roce_pcap_tshark.sh --pcap).
# With INJECT_TEST (twoproc_inject, its peer on B): the datagrams `softverbs inject drop`
# loses on the wire are in the sender's trace too, so a lost request shows once per copy sent.
#   trace.sh SOFTVERBS [INJECT_TEST]. Exit 77 (skipped) without root or tshark.
set -euo pipefail
here=$(dirname "$0")
source "$here/netns.sh"
softverbs=$1 inject=${2-}
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
if [[ -n $inject ]]; then
  # drop -n 2 and drop -n 3 on the RoCE QP: the request goes 3 and 4 times, 2 and 3 of the
  # copies lost after the trace wrote them: at least 5 requests repeat a (QP, PSN).
  in_host A env SV_PEER_NETNS="$HOST_B_NS" SV_PEER_STATE_DIR="$HOST_B_STATE" SV_GID_INDEX="$index" \
    SV_SOFTVERBS="$softverbs" timeout 60 "$softverbs" trace -w "$dir/inject.pcap" -- "$inject" \
    >"$dir/inject.log" 2>&1 || { cat "$dir/inject.log"; echo "FAIL: twoproc_inject"; exit 1; }
  bash "$here/../unit/roce_pcap_tshark.sh" --pcap "$dir/inject.pcap" | tail -2
  repeats=$(HOME=$dir tshark -r "$dir/inject.pcap" -n -Y "ip.src == $a && infiniband" -T fields \
    -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn 2>/dev/null |
    awk '$1 != 17' | sort | uniq -c | awk '$1 > 1 { n += $1 - 1 } END { print n + 0 }')
  echo "inject: $repeats request copies repeat a (QP, PSN) in the sender's trace"
  ((repeats >= 5)) || { echo "FAIL: the dropped datagrams are not in the trace"; exit 1; }
fi
echo "ok: traces of both hosts dissect as RoCE v2"
