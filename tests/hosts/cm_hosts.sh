#!/usr/bin/env bash
# Debian's rdma_cm programs between the two hosts of netns.sh: the server on host B, the
# client on host A given B's veth address, connecting with the IB CM over RoCE v2 (MADs to
# QP1, docs/roce-cm.md) and moving their data over RoCE v2. Exits 77 (skipped) without root.
#   cm_hosts.sh SOFTVERBS PORT LIMIT CASE
# CASE: rping, rping-q (the application makes its own QP), ucmatose (4 connections),
# udaddy (UD: SIDR), no-listener (B runs a listener on another port: the REQ is answered
# with REJ reason 8 at once), trace (rping with `softverbs trace` on A: the CM's MADs on
# the wire, dissected by tshark), forwarded (rping while an ibv_ud_pingpong pair, which
# runs no CM, holds UDP 4791 with the lowest slot on both hosts: QP1's datagrams reach the
# rdma_cm process through it, decision 0007).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/netns.sh"

(($# == 3)) || { echo "usage: $0 SOFTVERBS PORT LIMIT CASE"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 case_name=$3

why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
pair_setup "$base_port"
hosts_exit_cleanup # after pair_setup: keeps its cleanup too
hosts_up || exit 1

# The listener's abstract name lives in B's namespace and B's state directory.
PAIR_READY=cm-b
cm_ps=106
pair_ready() { SOFTVERBS_STATE_DIR=$HOST_B_STATE in_host B bash -c "$(declare -f cm_listening); cm_listening $1 $cm_ps"; }

sv_b=("${HOST_B[@]}" "$SOFTVERBS" run --)
sv_a=("${HOST_A[@]}" "$SOFTVERBS" run --)
b=$HOST_B_IP4
count=10

case $case_name in
  rping | rping-q | trace | forwarded)
    q=()
    [[ $case_name == rping-q ]] && q=(-q)
    server=("${sv_b[@]}" rping -s "${q[@]}" -a "$b" -p "$port" -v -V -C "$count")
    client=("${sv_a[@]}" rping -c "${q[@]}" -a "$b" -p "$port" -v -V -C "$count")
    if [[ $case_name == trace ]]; then
      pcap=$pair_tmp/a.pcap
      client=("${HOST_A[@]}" "$SOFTVERBS" trace -w "$pcap" -- rping -c -a "$b" -p "$port" -v -V -C "$count")
    fi
    ;;
  ucmatose)
    server=("${sv_b[@]}" ucmatose -p "$port" -c 4 -C "$count")
    client=("${sv_a[@]}" ucmatose -s "$b" -p "$port" -c 4 -C "$count")
    ;;
  udaddy)
    # udaddy has no port option: always 7174, in the UDP port space.
    cm_ps=111
    port=7174
    server=("${sv_b[@]}" udaddy -C "$count")
    client=("${sv_a[@]}" udaddy -s "$b" -C "$count")
    ;;
  no-listener)
    # A process on B runs the CM (a listener on another port): our REQ must be rejected.
    server=("${sv_b[@]}" rping -s -a "$b" -p "$port" -C 1)
    client=("${sv_a[@]}" timeout 10 rping -c -a "$b" -p $((port + 1000)) -C 1)
    PAIR_GRACE=1
    ;;
  *)
    echo "unknown case $case_name"
    exit 2
    ;;
esac

if [[ $case_name == forwarded ]]; then
  # The pingpongs first: their processes take the lowest registry slots and join 4791 first.
  ud_port=$((port + 2000))
  "${sv_b[@]}" ibv_ud_pingpong -g 1 -p "$ud_port" -n 1000000 >/dev/null 2>&1 &
  ud_b=$!
  sleep 0.5
  "${sv_a[@]}" ibv_ud_pingpong -g 1 -p "$ud_port" -n 1000000 "$b" >/dev/null 2>&1 &
  ud_a=$!
  for ((i = 0; i < 40; i++)); do
    [[ $(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]] && break
    sleep 0.05
  done
  check "a process without CM holds UDP 4791 on B first" \
    "[[ \$(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]]"
fi
start=$(now_ms)
pair_run
ms=$(($(now_ms) - start))
if [[ $case_name == forwarded ]]; then
  kill "$ud_a" "$ud_b" 2>/dev/null
  wait "$ud_a" "$ud_b" 2>/dev/null
fi

case $case_name in
  rping | rping-q | trace | forwarded)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "client got all $count pings back" \
      "(($(grep -cE '^ping data: rdma-ping-[0-9]+: [A-Za-z]' <<<"$cli_out") == count))"
    check "server saw all $count pings" \
      "(($(grep -cE '^server ping data: rdma-ping-[0-9]+: ' <<<"$srv_out") == count))"
    check "client saw no data mismatch" "! side_has cli 'data mismatch|error|fail'"
    if [[ $case_name == trace ]]; then
      if command -v tshark >/dev/null; then
        run tshark --disable-protocol rpcordma -r "$pcap" -Y infiniband.mad -T fields -e infiniband.mad.attributeid
        check "tshark read the capture" '((rc == 0))'
        check "A sent a REQ (0x0010), got a REP (0x0013), sent an RTU (0x0014) and a DREQ (0x0015)" \
          '[[ $out == *0x0010* && $out == *0x0013* && $out == *0x0014* && $out == *0x0015* ]]'
        # Wireshark does not check ICRCs: garbage.py computes each one itself.
        run python3 "$(dirname "$0")/garbage.py" --self-test "$pcap"
        check "every captured ICRC is right (garbage.py --self-test)" '((rc == 0))'
      else
        echo "note: no tshark, the capture is not dissected"
      fi
    fi
    ;;
  ucmatose | udaddy)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    for side in srv cli; do
      check "$side: data transfers complete" "side_has $side '^data transfers complete'"
      check "$side: return status 0" "side_has $side '^return status 0'"
    done
    ;;
  no-listener)
    check "rping failed" '((cli_rc != 0 && cli_rc != 124))'
    check "the connect was rejected with IB CM reason 8 (invalid service ID)" \
      "side_has cli 'RDMA_CM_EVENT_REJECTED, error 8'"
    check "within 3 s of the server being ready (took ${ms} ms in all)" '((ms < 6000))'
    ;;
esac
if [[ $case_name == no-listener ]]; then
  cli_rc=0  # rping's own failure (255) is the expected outcome, checked above
  srv_rc=0  # stopped: it waits for a client forever
fi
check "no crash, no sanitizer report" pair_no_crash
finish
