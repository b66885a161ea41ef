#!/usr/bin/env bash
# hosts.integrity.*: our integrity program (integrity.c) with the server on host A and the
# client on host B (README.md). Exits 77 (skipped) without root.
#   integrity.sh SOFTVERBS MODE INTEGRITY PORT
# MODE:
#   rc, uc, ud            clean: every message arrives, every byte and atomic checked
#   rc.faults             SOFTVERBS_FAULTS=drop=1,reorder=5,dup=1 on both hosts
#   rc.faults_nft         the same plus nftables dropping 1 % of each host's UDP 4791
#   uc.faults, ud.faults  SOFTVERBS_FAULTS: losses allowed, whatever arrives intact
#   wire                  rc clean, captured with tshark on A's veth: every UDP 4791 packet
#                         must dissect as InfiniBand with no malformed or expert error
#   vanish.link_down      traffic flows, A's veth goes down: the client gets RETRY_EXC_ERR
#   vanish.sigkill        traffic flows, the server is SIGKILLed: the same
#   garbage               garbage.py sends from B to A's UDP 4791 during the traffic
# shellcheck disable=SC2016 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"
here=$(dirname "$0")

(($# == 3)) || { echo "usage: $0 SOFTVERBS MODE INTEGRITY PORT"; exit 2; }
mode=$1 integrity=$2 port=$3
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
tmp=$(mktemp -d)
cleanup_tmp() { rm -rf -- "$tmp"; }
hosts_exit_cleanup
trap 'hosts_down; cleanup_tmp' EXIT
hosts_up || exit 1

a_index=$(gid_index_of "$SOFTVERBS" A "$HOST_A_GID4")
b_index=$(gid_index_of "$SOFTVERBS" B "$HOST_B_GID4")
[[ -n $a_index && -n $b_index ]] || { echo "FAIL: a veth address is missing from the GID table"; exit 1; }

faults=() extra_env=() srv_opts=() cli_opts=() limit=40
transport=${mode%%.*}
[[ $transport == rc || $transport == uc || $transport == ud ]] || transport=rc
common=(-t "$transport" -s 7 -w $((limit - 5)))
case $mode in
  rc) common+=(-n 2000) ;;
  # The payload gathered by sendmsg from registered memory, not copied into the batch.
  rc.gather) common+=(-n 2000) extra_env=(SOFTVERBS_GATHER=1) ;;
  ud.gather) common+=(-n 1000) extra_env=(SOFTVERBS_GATHER=1) ;;
  uc | ud) common+=(-n 1000) ;;
  rc.faults | rc.faults_nft)
    # A shorter ack timeout (16 ms) so that losses cost less time.
    faults=(SOFTVERBS_FAULTS=drop=1,reorder=5,dup=1,seed=42)
    common+=(-n 600 -T 12) ;;
  uc.faults | ud.faults)
    # A lost batch tail costs 300 ms of quiet (integrity.c): fewer messages.
    faults=(SOFTVERBS_FAULTS=drop=1,reorder=5,dup=1,seed=42)
    common+=(-n 500 -l) ;;
  # One datagram per send: a UDP GSO send (how softverbs sends a message's packets) crosses
  # the veth uncut, so a capture there holds several RoCE packets in one frame, which
  # tshark shows as one packet and whose ICRCs garbage.py cannot check one by one.
  wire) common+=(-n 300) extra_env=(SOFTVERBS_NO_GSO=1) ;;
  vanish.*)
    # Budget: (3 + 1) x 4.096 us x 2^16 = 1074 ms.
    cli_opts=(-v -T 16 -R 3) srv_opts=(-v) ;;
  garbage) common+=(-n 3000) srv_opts=(-i "$tmp/info") cli_opts=(-H "$tmp/garbage.done") ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
if [[ $mode == rc.faults_nft ]]; then
  drop A 1 udp dport 4791 && drop B 1 udp dport 4791 || { echo "FAIL: nft drop"; exit 1; }
fi

# side HOST NAME ARGS...: runs the program on HOST in the background, output in $tmp/NAME.
side() {
  local host=$1 name=$2
  shift 2
  in_host "$host" env "${faults[@]}" "${extra_env[@]}" timeout -k 2 "$limit" stdbuf -oL -eL \
    "$SOFTVERBS" run -- "$integrity" "$@" >"$tmp/$name.out" 2>&1 &
}
show() { printf '\n--- %s:\n%s\n--- exit code %s\n' "$1" "$(<"$tmp/$1.out")" "$2"; }
wait_for() { # wait_for SECONDS CONDITION: polls the bash CONDITION every 50 ms
  local i
  for ((i = 0; i < $1 * 20; i++)); do
    eval "$2" && return 0
    sleep 0.05
  done
  return 1
}

if [[ $mode == wire ]]; then
  ip netns exec "$HOST_A_NS" tshark -q -i "$HOSTS_IF" -f "udp port 4791" -F pcap -w "$tmp/wire.pcap" \
    >"$tmp/tshark.out" 2>&1 &
  tshark_pid=$!
  wait_for 10 '[[ -s $tmp/wire.pcap ]]' || { echo "FAIL: tshark did not start"; cat "$tmp/tshark.out"; exit 1; }
fi

side A server "${common[@]}" -g "$a_index" "${srv_opts[@]}" server "$port"
srv_pid=$!
wait_for 10 '[[ -n $(in_host A ss -Hltn "sport = :$port") ]]' || echo "server not listening"
side B client "${common[@]}" -g "$b_index" "${cli_opts[@]}" client "$HOST_A_IP4" "$port"
cli_pid=$!

case $mode in
  vanish.*)
    if wait_for 20 'grep -q "traffic flowing" "$tmp/client.out"'; then
      if [[ $mode == vanish.link_down ]]; then
        link A down
        echo "A's veth down"
      else
        # The process itself, not `timeout` or `softverbs run` around it.
        victim=$(ip netns pids "$HOST_A_NS" | while read -r p; do
          [[ $(readlink "/proc/$p/exe") == "$(readlink -f "$integrity")" ]] && echo "$p"; done)
        echo "SIGKILL to the server, pid $victim"
        [[ -n $victim ]] && kill -KILL "$victim"
      fi
    fi ;;
  garbage)
    if wait_for 20 '[[ -s $tmp/info ]]'; then
      echo "server: $(<"$tmp/info")"
      run in_host B python3 "$here/garbage.py" --seed 4791 --count 300 "$tmp/info" \
        "$HOST_A_IP4" "$HOST_B_IP4"
      garbage_rc=$rc
      alive_after_garbage=0
      kill -0 "$cli_pid" 2>/dev/null && alive_after_garbage=1
    fi
    touch "$tmp/garbage.done" ;;  # the client may end now (it waits for this: -H)
esac

wait "$cli_pid"
cli_rc=$?
[[ $mode == vanish.* ]] && { sleep 0.2; kill -TERM "$srv_pid" 2>/dev/null; }
wait "$srv_pid"
srv_rc=$?
show server "$srv_rc"
show client "$cli_rc"

cli_out=$(<"$tmp/client.out") srv_out=$(<"$tmp/server.out")
has() { grep -Eq -- "$2" <<<"$1"; }
no_crash_in() { ! has "$1" 'AddressSanitizer|LeakSanitizer|runtime error:|Segmentation fault|Aborted|terminate called'; }

check "client passed" '((cli_rc == 0)) && has "$cli_out" "^PASS integrity$"'
check "no crash or sanitizer report" 'no_crash_in "$cli_out" && no_crash_in "$srv_out"'
case $mode in
  vanish.*)
    check "the first error was RETRY_EXC_ERR" 'has "$cli_out" "^first error RETRY_EXC_ERR"' ;;
  *)
    check "server passed" '((srv_rc == 0)) && has "$srv_out" "^PASS integrity$"' ;;
esac
case $mode in
  rc | rc.* | wire | garbage)
    check "every message arrived" 'has "$srv_out" "^received [0-9]+ messages, 0 lost$"' ;;
esac
if ((${#faults[@]})); then
  check "faults were injected on both hosts" \
    '[[ $(grep -c "^softverbs faults .*[1-9][0-9]* dropped" <<<"$cli_out$srv_out") -ge 1 ]]'
fi
if [[ $mode == garbage ]]; then
  check "garbage.py ran" '((garbage_rc == 0))'
  check "the garbage came while the client still ran" '((alive_after_garbage))'
fi
if [[ $mode == wire ]]; then
  sleep 0.5
  kill -INT "$tshark_pid" 2>/dev/null
  wait "$tshark_pid"
  # Wireshark's RPC-over-RDMA heuristic takes short SEND payloads for RPC and calls them
  # malformed: it is disabled (--disable-protocol rpcrdma).
  ts=(tshark -n -r "$tmp/wire.pcap" --disable-protocol rpcrdma)
  total=$("${ts[@]}" -Y 'udp.dstport == 4791' 2>/dev/null | wc -l)
  ib=$("${ts[@]}" -Y 'udp.dstport == 4791 && infiniband' 2>/dev/null | wc -l)
  bad=$("${ts[@]}" -Y 'udp.dstport == 4791 && (_ws.malformed || _ws.expert.severity >= 6291456 || !infiniband)')
  bad_rc=$? # 6291456: PI_WARN (0x600000); notes and chats are fine
  with_rpcrdma=$(tshark -n -r "$tmp/wire.pcap" -Y '_ws.malformed' 2>/dev/null | wc -l)
  echo "(with Wireshark's rpcrdma heuristic left on, $with_rpcrdma packets would show as malformed)"
  echo "captured $total UDP 4791 packets on A's veth; $ib dissect as InfiniBand"
  "${ts[@]}" -T fields -e infiniband.bth.opcode -Y infiniband 2>/dev/null | sort | uniq -c | sort -rn | head -20
  check "packets were captured" '((total > 1000))'
  check "every UDP 4791 packet dissects as InfiniBand" '((ib == total))'
  check "none malformed or with an expert warning or error" \
    '((bad_rc == 0)) && { [[ -z $bad ]] || { head -5 <<<"$bad"; false; }; }'
  # Wireshark shows the ICRC but does not check it: garbage.py computes each one itself.
  run python3 "$here/garbage.py" --self-test "$tmp/wire.pcap"
  check "every captured ICRC is right (garbage.py --self-test)" '((rc == 0))'
fi
finish
