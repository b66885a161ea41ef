#!/usr/bin/env bash
# hosts.stat.roce: `softverbs stat` on a QP that talks RoCE v2 (Debian's ibv_rc_pingpong,
# server on host A, client on host B): its PSNs are the link's, live (they move while the
# pair runs, and are not the PSN the program gave ibv_modify_qp), and its send queue counts
# what the link holds in flight. Exits 77 (skipped) without root.
#   stat_roce.sh SOFTVERBS PORT
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 1)) || { echo "usage: $0 SOFTVERBS PORT"; exit 2; }
port=$1
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
hosts_exit_cleanup
hosts_up || exit 1
a_index=$(gid_index_of "$SOFTVERBS" A "$HOST_A_GID4")
b_index=$(gid_index_of "$SOFTVERBS" B "$HOST_B_GID4")
[[ -n $a_index && -n $b_index ]] || { echo "FAIL: a veth address is missing from the GID table"; exit 1; }

srv_out=$(mktemp) cli_out=$(mktemp)
trap 'kill $srv $cli 2>/dev/null; wait 2>/dev/null; hosts_down; rm -f -- "$srv_out" "$cli_out"' EXIT
in_host A timeout 60 "$SOFTVERBS" run -- stdbuf -oL ibv_rc_pingpong -d softverbs0 -g "$a_index" -p "$port" \
  -n 100000000 >"$srv_out" 2>&1 &
srv=$!
for _ in $(seq 100); do
  [[ -n $(in_host A ss -Hltn "sport = :$port") ]] && break
  sleep 0.1
done
in_host B timeout 60 "$SOFTVERBS" run -- stdbuf -oL ibv_rc_pingpong -d softverbs0 -g "$b_index" -p "$port" \
  -n 100000000 "$HOST_A_IP4" >"$cli_out" 2>&1 &
cli=$!
# The server's PSN as it gave it to ibv_modify_qp ("local address: ... PSN 0x0a1b2c ...").
for _ in $(seq 100); do
  grep -q "remote address" "$srv_out" && break
  sleep 0.1
done
sleep 0.5
cat "$srv_out"
psn=$(sed -nE 's/.*local address: .*PSN (0x[0-9a-f]+).*/\1/p' "$srv_out")
[[ -n $psn ]] || { echo "FAIL: the server did not start"; exit 1; }

failures=0
snapshot() {  # snapshot: the server QP's "psn_source sq_psn rq_psn send_in_flight send_queued"
  in_host A timeout 10 "$SOFTVERBS" stat --json "$srv_pid" | python3 -c '
import json, sys
q = json.load(sys.stdin)["processes"][0]["qps"][0]
print(q["psn_source"], q["sq_psn"], q["rq_psn"], q["send_in_flight"], q["send_queued"], q["max_send_wr"], q["peer_pid"])'
}
srv_pid=$(in_host A ls "$HOST_A_STATE/stat" | head -n 1)
read -r source1 sq1 rq1 flight1 queued1 max1 peer1 < <(snapshot)
sleep 0.3
read -r source2 sq2 rq2 flight2 queued2 max2 peer2 < <(snapshot)
echo "server $srv_pid, PSN given to ibv_modify_qp $((psn)); stat: $source1 sq $sq1 rq $rq1 in flight $flight1 ($queued1/$max1), then $source2 sq $sq2 rq $rq2 in flight $flight2"
table=$(in_host A timeout 10 "$SOFTVERBS" stat "$srv_pid")
printf '$ softverbs stat %s\n%s\n' "$srv_pid" "$table"
expect_true() { if eval "$2"; then echo "ok:   $1"; else echo "FAIL: $1 [$2]"; failures=$((failures + 1)); fi; }
expect_true "the PSNs are the RoCE link's" '[[ $source1 == roce_link && $source2 == roce_link ]]'
expect_true "the send PSN moved past the one set" '[[ $sq1 =~ ^[0-9]+$ ]] && ((sq1 != psn))'
expect_true "it moves while the pair runs" '[[ $sq2 =~ ^[0-9]+$ ]] && ((sq2 != sq1)) && ((rq2 != rq1))'
expect_true "no peer process on this host" '[[ $peer1 == None ]]'
expect_true "WQEs in flight counted in the send queue" \
  '[[ $flight1 =~ ^[0-9]+$ && $queued1 =~ ^[0-9]+$ ]] && ((flight1 <= queued1 && queued1 <= max1))'
((failures == 0)) || exit 1
echo "PASS hosts.stat.roce"
