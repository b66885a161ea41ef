#!/usr/bin/env bash
# Polled ping-pong between the hosts: a plain ACK waits for the QP's next packet and leaves in
# the same UDP GSO send (docs/roce.md, "ACKs held back for the next packet"), so each
# message costs one skb on the veth, not two (the request, then its own ACK). PROGRAM -n N
# (ib_send_lat, or ib_write_lat: a one-sided ping-pong polls memory, not its CQ, and the
# port's thread holds the first ACK for the reply, "One-sided ping-pongs"), server on A,
# the two pinned to CPUs of their own (two pollers sharing one CPU take turns of a time
# slice each, and their sockets go back to the port threads): A's veth must send fewer
# than 1.5 x N packets (2 x N when every ACK leaves alone; a few do, while a poller is not
# parked) and at least N (every request went).  ack_coalescing.sh SOFTVERBS [PROGRAM].
# Exit 77 (skipped) without root or two CPUs.
set -euo pipefail
here=$(dirname "$0")
source "$here/netns.sh"
softverbs=$1
prog=${2:-ib_send_lat}
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
hosts_exit_cleanup
hosts_up || exit 1
dir=$(mktemp -d)
trap 'hosts_down; rm -rf "$dir"' EXIT
a=$(host_var A IP4)
index=$(gid_index_of "$softverbs" A "$(host_var A GID4)")
n=2000
port=18190
tx_packets() { in_host A cat "/sys/class/net/$HOSTS_IF/statistics/tx_packets"; }
mapfile -t cpus < <(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)), sep="\n")')
((${#cpus[@]} >= 2)) || { echo "skipped: one CPU"; exit 77; }

# On by default (SOFTVERBS_ACK_HOLD=0 turns it off): this test is about it. The hold's time
# bound (100 µs) and the socket's return to the port thread after 1 ms without a poll are
# about a slow or busy program, not about the rule checked here: under ASan on a loaded CI
# machine a pinned poller is descheduled for longer than either, and its ACKs left alone
# (3457 packets for 2000 messages). Both are raised so that only the rule is measured.
unset SOFTVERBS_ACK_HOLD
export SOFTVERBS_ACK_HOLD_US=5000 SOFTVERBS_POLL_PARK=20000
before=$(tx_packets)
in_host A timeout 60 taskset -c "${cpus[0]}" "$softverbs" run -- "$prog" -s 8 -x "$index" -p "$port" -n "$n" \
  >"$dir/a.log" 2>&1 &
server=$!
for ((i = 0; i < 100; i++)); do
  [[ -n $(in_host A ss -Hltn "sport = :$port") ]] && break
  sleep 0.05
done
if ! in_host B timeout 60 taskset -c "${cpus[1]}" "$softverbs" run -- "$prog" -s 8 -x "$index" -p "$port" -n "$n" "$a" \
  >"$dir/b.log" 2>&1; then
  cat "$dir/a.log" "$dir/b.log"
  echo "FAIL: client"
  exit 1
fi
wait "$server" || { cat "$dir/a.log"; echo "FAIL: server"; exit 1; }
after=$(tx_packets)
sent=$((after - before))
echo "$prog -s 8 -n $n: host A's veth sent $sent packets"
((sent >= n)) || { echo "FAIL: fewer packets than requests"; exit 1; }
((sent * 2 < n * 3)) || { echo "FAIL: $sent packets for $n messages: ACKs leave alone"; exit 1; }
echo "ok: ACKs ride with the next request"
