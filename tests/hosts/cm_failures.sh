#!/usr/bin/env bash
# rdma_cm between the hosts of netns.sh, the cases a plain server/client pair does not show:
# several listening processes on one host, a host with no CM process, lost MADs, a peer that
# is gone or refuses, garbage to QP1. Exits 77 (skipped) without root.
#   cm_failures.sh SOFTVERBS CM_PEER PORT CASE
# CM_PEER is tests/hosts/cm_peer.c built. CASE:
#   listeners    two rping servers on B in two processes (ports PORT, PORT+1), after a third
#                process that runs a CM and holds B's lowest registry slot (so QP1's datagrams
#                reach it first); a client from A to each: every REQ must reach its listener
#   no-cm        B runs softverbs on UDP 4791 (ibv_ud_pingpong) but no CM: REJECTED 8 at once
#   unreachable  A's datagrams to 4791 all dropped: UNREACHABLE after the CM's retries, with
#                short timers (SOFTVERBS_CM_*), not sooner than they say
#   lossy        30% of the handshake's MADs (REQ, MRA, REP, RTU) dropped both ways, three
#                rping runs: each connects (REQ/REP/RTU resent, duplicates answered), moves
#                its data and disconnects
#   reject       the listener calls rdma_reject with private data: REJECTED, reason 28, data
#   peer-killed  the server on B is SIGKILLed once connected; the client on A keeps sending:
#                its sends fail after the QP's retries, then rdma_disconnect ends in
#                DISCONNECTED (DREP from B's other CM process for the dead one's comm ID)
#   killed-silent the server on B is SIGKILLed once connected while another CM process runs
#                on B; the client on A never sends, yet gets DISCONNECTED: B's other CM
#                process finds the dead one's published connections and sends the DREQ its
#                kernel would have
#   garbage      garbage.py --cm (fixed seed) sends malformed and stray MADs to B's QP1 while
#                rping connects and runs: nothing breaks
#   resolve      rdma_resolve_addr from A as the kernel's ib_addr: B resolves (ARP) at once;
#                an address on the veth's subnet nobody owns gives ADDR_ERROR -ETIMEDOUT
#                after the caller's timeout_ms; an address with no route makes
#                rdma_resolve_addr itself fail with ENETUNREACH
#   notify       every RTU from A dropped: the server on B, in REP_SENT, sees the client's
#                first SEND arrive and calls rdma_notify(COMM_EST): 0, ESTABLISHED, and
#                EISCONN when called again
# shellcheck disable=SC2016 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/netns.sh"

(($# == 3)) || { echo "usage: $0 SOFTVERBS CM_PEER PORT CASE"; exit 2; }
cm_peer=$1 port=$2 case_name=$3

why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  hosts_down
  rm -rf -- "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
hosts_up || exit 1

b=$HOST_B_IP4
# Short CM timers: a resend every 2 x 16.8 ms + 67 ms = 100.7 ms, 3 resends.
fast=(SOFTVERBS_CM_RESPONSE_TIMEOUT=14 SOFTVERBS_CM_PACKET_LIFETIME=12 SOFTVERBS_CM_RETRIES=3)
fast_interval_us=$((2 * 4096 * (1 << 12) / 1000 + 4096 * (1 << 14) / 1000))

# start NAME HOST LIMIT CMD...: CMD under softverbs on HOST in the background, output in
# $tmp/NAME, killed after LIMIT seconds; its pid in pid_NAME.
start() {
  local name=$1 host=$2 limit=$3
  shift 3
  in_host "$host" "${fast[@]}" timeout -k 2 "$limit" "$SOFTVERBS" run -- "$@" >"$tmp/$name" 2>&1 &
  printf -v "pid_$name" %s $!
  pids+=($!)
}
# finish_side NAME: waits for it; its exit code in rc_NAME, its output shown.
finish_side() {
  local pid_var=pid_$1
  wait "${!pid_var}"
  printf -v "rc_$1" %s $?
  echo "--- $1 (exit $(eval echo "\$rc_$1")):"
  cat "$tmp/$1"
}
# wait_cm HOST PORT [PS]: a listener holds the rdma_cm port on HOST (10 s at most).
wait_cm() {
  local i
  for ((i = 0; i < 200; i++)); do
    SOFTVERBS_STATE_DIR=$(host_var "$1" STATE) in_host "$1" bash -c \
      "$(declare -f cm_listening); cm_listening $2 ${3:-106}" && return 0
    sleep 0.05
  done
  echo "nobody listens on $2 on host $1"
  return 1
}
# wait_line NAME REGEX SECONDS
wait_line() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    grep -Eq -- "$2" "$tmp/$1" && return 0
    sleep 0.05
  done
  return 1
}
# descendant PID COMM: the pid of PID's descendant (or PID itself) running COMM.
descendant() {
  local p c
  [[ $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]] && { echo "$1"; return 0; }
  for p in $(pgrep -P "$1"); do
    c=$(descendant "$p" "$2") && { echo "$c"; return 0; }
  done
  return 1
}
# errno_of NAME: the number of errno NAME on this system.
errno_of() { python3 -c "import errno; print(errno.$1)"; }
pings() { grep -cE "^${2-}ping data: rdma-ping-[0-9]+: " "$tmp/$1"; }

count=5
case $case_name in
  listeners)
    # The third process first: it takes B's lowest slot and runs a CM (a listener elsewhere).
    start third B 30 rping -s -a "$b" -p $((port + 2)) -C 1
    wait_cm B $((port + 2)) || exit 1
    start srv1 B 30 rping -s -a "$b" -p "$port" -v -C $count
    start srv2 B 30 rping -s -a "$b" -p $((port + 1)) -v -C $count
    wait_cm B "$port" && wait_cm B $((port + 1)) || exit 1
    start cli1 A 20 rping -c -a "$b" -p "$port" -v -C $count
    start cli2 A 20 rping -c -a "$b" -p $((port + 1)) -v -C $count
    for s in cli1 cli2 srv1 srv2; do finish_side $s; done
    for i in 1 2; do
      check "client $i exited 0" "((rc_cli$i == 0))"
      check "server $i exited 0" "((rc_srv$i == 0))"
      check "client $i got its $count pings back" "(($(pings cli$i) == count))"
      check "server $i saw $count pings" "(($(pings srv$i 'server ') == count))"
    done
    kill "$pid_third" 2>/dev/null
    ;;
  no-cm)
    # A UD QP comes to RTR (and joins 4791) once the pingpong pair has met: its client on A.
    # -g 0: each host's veth IPv4 (hosts.devinfo_gids).
    start ud B 30 ibv_ud_pingpong -g 0 -p $((port + 2000)) -n 1000000
    sleep 0.5
    start uda A 30 ibv_ud_pingpong -g 0 -p $((port + 2000)) -n 1000000 "$b"
    for ((i = 0; i < 100; i++)); do
      [[ $(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]] && break
      sleep 0.05
    done
    check "a process without a CM holds UDP 4791 on B" \
      "[[ \$(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]]"
    t0=$(now_ms)
    start cli A 10 "$cm_peer" client "$b" "$port"
    finish_side cli
    ms=$(($(now_ms) - t0))
    check "REJECTED with reason 8 (invalid service ID)" "grep -q '^rejected status 8 ' $tmp/cli"
    check "at once, not after the CM's retries (${ms} ms)" "((ms < 3000))"
    kill "$pid_ud" "$pid_uda" 2>/dev/null
    ;;
  unreachable)
    start srv B 30 "$cm_peer" server "$b" "$port" accept
    wait_cm B "$port" || exit 1
    drop A 100 udp dport 4791
    start cli A 20 "$cm_peer" client "$b" "$port"
    finish_side cli
    want_ms=$((4 * fast_interval_us / 1000))  # the REQ and its 3 resends, each waited for
    ms=$(sed -nE 's/^unreachable status -?[0-9]+ after ([0-9]+) ms$/\1/p' "$tmp/cli")
    check "UNREACHABLE with -ETIMEDOUT (-110)" "grep -q '^unreachable status -110 ' $tmp/cli"
    check "after the 4 waits of ${fast_interval_us} us (${want_ms} ms): took ${ms:-?} ms" \
      "((${ms:-0} >= want_ms && ${ms:-0} < want_ms + 5000))"
    ;;
  lossy)
    # Only the handshake's MADs: BTH DestQP 1 (13 bytes into the UDP header) and the MAD's
    # attribute ID (44 bytes in) REQ, MRA, REP or RTU. The data path's retries are
    # hosts.integrity.*.faults'; a lost DREQ is not resent once rping has destroyed its id
    # (the kernel's CM stops resending then too), which would leave the server waiting.
    # The kernel's 15 resends (at 100 ms): a REP and its RTU both get through with
    # probability 0.49 per round, so 4 rounds (3 resends) would fail one run in 15.
    fast[2]=SOFTVERBS_CM_RETRIES=15
    handshake=(udp dport 4791 @th,104,24 1 @th,352,16 '{ 0x10, 0x11, 0x13, 0x14 }')
    drop A 30 "${handshake[@]}"
    drop B 30 "${handshake[@]}"
    for round in 1 2 3; do
      start srv$round B 30 rping -s -a "$b" -p "$port" -v -C $count
      wait_cm B "$port" || exit 1
      start cli$round A 25 rping -c -a "$b" -p "$port" -v -C $count
      finish_side cli$round
      finish_side srv$round
      check "round $round: both exited 0" "((rc_cli$round == 0 && rc_srv$round == 0))"
      check "round $round: the client got its $count pings back" "(($(pings cli$round) == count))"
    done
    in_host A nft list table inet "$hosts_fault_table" | grep -E 'packets [0-9]+' | sed 's/^/A drops: /'
    in_host B nft list table inet "$hosts_fault_table" | grep -E 'packets [0-9]+' | sed 's/^/B drops: /'
    ;;
  reject)
    start srv B 20 "$cm_peer" server "$b" "$port" reject
    wait_cm B "$port" || exit 1
    start cli A 10 "$cm_peer" client "$b" "$port"
    finish_side cli
    finish_side srv
    check "REJECTED, reason 28 (consumer defined), with the listener's private data" \
      "grep -q '^rejected status 28 private_len 148 data softverbs-reject-data$' $tmp/cli"
    check "the server rejected and exited 0" "((rc_srv == 0))"
    ;;
  peer-killed)
    # Another CM process on B: it gets the DREQ for the dead process's comm ID.
    start other B 30 rping -s -a "$b" -p $((port + 2)) -C 1
    wait_cm B $((port + 2)) || exit 1
    start srv B 30 "$cm_peer" server "$b" "$port" accept
    wait_cm B "$port" || exit 1
    start cli A 20 "$cm_peer" client "$b" "$port" send
    wait_line cli '^20 sends done' 10
    check "connected and sending" "grep -q '^20 sends done' $tmp/cli"
    victim=$(descendant "$pid_srv" cm_peer)
    check "found the server's process" "[[ -n '$victim' ]]"
    kill -KILL "$victim"
    finish_side cli
    check "the sends failed once the QP's retries were spent" \
      "grep -qE '^send error (transport retry counter exceeded|.*retry.*)' $tmp/cli"
    ms=$(sed -nE 's/^disconnected after ([0-9]+) ms$/\1/p' "$tmp/cli")
    check "DISCONNECTED came after rdma_disconnect (${ms:-never} ms)" "[[ -n '$ms' ]] && ((rc_cli == 0))"
    check "from B's DREP, before a DREQ resend (${fast_interval_us} us)" \
      "((${ms:-99999} * 1000 < fast_interval_us))"
    kill "$pid_other" 2>/dev/null
    ;;
  killed-silent)
    # The other CM process first: it holds B's lowest slot with an agent (the host's CM).
    start other B 30 rping -s -a "$b" -p $((port + 2)) -C 1
    wait_cm B $((port + 2)) || exit 1
    start srv B 30 "$cm_peer" server "$b" "$port" accept
    wait_cm B "$port" || exit 1
    start cli A 20 "$cm_peer" client "$b" "$port" wait
    wait_line cli '^established' 10
    victim=$(descendant "$pid_srv" cm_peer)
    check "found the server's process" "[[ -n '$victim' ]]"
    published=$HOST_B_STATE/cm-established-$victim
    for ((i = 0; i < 100; i++)); do [[ -e $published ]] && break; sleep 0.02; done
    check "the server published its connection ($published)" "[[ -e '$published' ]]"
    t0=$(now_ms)
    kill -KILL "$victim"
    wait_line cli '^disconnected while waiting' 10
    ms=$(($(now_ms) - t0))
    finish_side cli
    check "the client, which never sends, got DISCONNECTED (${ms} ms after the kill)" \
      "grep -q '^disconnected while waiting' $tmp/cli && ((rc_cli == 0))"
    check "within the host CM's scan (1 s) and a DREQ's round trip" "((ms < 3000))"
    check "the dead server's file was taken" "[[ ! -e '$published' ]]"
    kill "$pid_other" 2>/dev/null
    ;;
  garbage)
    start srv B 30 rping -s -a "$b" -p "$port" -v -C 50
    wait_cm B "$port" || exit 1
    in_host A python3 "$(dirname "$0")/garbage.py" --cm "$b" "$HOST_A_IP4" --seed 4791 --count 400 \
      --live-port "$port" >"$tmp/garbage" 2>&1 &
    garbage_pid=$!
    pids+=("$garbage_pid")
    sleep 0.2
    start cli A 20 rping -c -a "$b" -p "$port" -v -C 50
    wait "$garbage_pid"
    check "garbage.py sent its MADs" "grep -q '^sent random' $tmp/garbage"
    cat "$tmp/garbage"
    finish_side cli
    finish_side srv
    check "both exited 0" "((rc_cli == 0 && rc_srv == 0))"
    check "the client got its 50 pings back" "(($(pings cli) == 50))"
    ;;
  resolve)
    start ok A 10 "$cm_peer" resolve "$b" 2000
    finish_side ok
    ms=$(sed -nE 's/^addr_resolved after ([0-9]+) ms$/\1/p' "$tmp/ok")
    check "B's address resolves, not after the timeout (${ms:-never} ms)" "((${ms:-99999} < 1000))"
    # .77 is on the veth's subnet, and nobody answers its ARP requests.
    start nobody A 10 "$cm_peer" resolve "$HOSTS_NET4.77" 1500
    finish_side nobody
    ms=$(sed -nE 's/^addr_error status -110 after ([0-9]+) ms$/\1/p' "$tmp/nobody")
    check "an address nobody owns: ADDR_ERROR -ETIMEDOUT (-110) after the 1500 ms asked (${ms:-never} ms)" \
      "((${ms:-0} >= 1500 && ${ms:-0} < 4000))"
    in_host A ip neigh show "$HOSTS_NET4.77" | sed 's/^/A neighbour: /'
    # TEST-NET-3: the namespaces have no default route.
    start noroute A 10 "$cm_peer" resolve 203.0.113.1 2000
    finish_side noroute
    check "no route: rdma_resolve_addr fails with ENETUNREACH ($(grep -c . "$tmp/noroute") line)" \
      "grep -qx 'resolve_addr failed errno $(errno_of ENETUNREACH)' $tmp/noroute"
    ;;
  notify)
    rtu=(udp dport 4791 @th,104,24 1 @th,352,16 0x14)
    drop A 100 "${rtu[@]}"
    start srv B 20 "$cm_peer" server "$b" "$port" notify
    wait_cm B "$port" || exit 1
    start cli A 20 "$cm_peer" client "$b" "$port" send
    wait_line srv '^established' 10
    wait_line cli '^20 sends done' 10
    kill "$pid_cli" "$pid_srv" 2>/dev/null
    finish_side cli
    finish_side srv
    check "the client got ESTABLISHED (its RTU is dropped)" "grep -q '^established' $tmp/cli"
    check "the server's rdma_notify(COMM_EST) returned 0" "grep -qx 'notify returned 0' $tmp/srv"
    check "then ESTABLISHED on the server, once" "(($(grep -c '^established' "$tmp/srv") == 1))"
    check "a second rdma_notify: EISCONN" "grep -qx 'notify again returned -$(errno_of EISCONN)' $tmp/srv"
    check "the client's sends went on" "grep -q '^20 sends done' $tmp/cli"
    ;;
  *)
    echo "unknown case $case_name"
    exit 2
    ;;
esac
check "no crash, no sanitizer report" \
  "! grep -qE 'AddressSanitizer|UndefinedBehaviorSanitizer|runtime error|Segmentation|core dumped' $tmp/*"
finish
