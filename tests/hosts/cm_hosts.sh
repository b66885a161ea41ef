#!/usr/bin/env bash
# Debian's rdma_cm programs between the two hosts of netns.sh: the server on host B, the
# client on host A given B's veth address, connecting with the IB CM over RoCE v2 (MADs to
# QP1, docs/roce-cm.md) and moving their data over RoCE v2. Exits 77 (skipped) without root.
#   cm_hosts.sh SOFTVERBS PORT LIMIT CASE [ARGS...]
# CASE: rping, rping-q (the application makes its own QP), ucmatose (4 connections),
# udaddy (UD: SIDR), no-listener (B runs a listener on another port: the REQ is answered
# with REJ reason 8 at once), trace (rping with `softverbs trace` on A: the CM's MADs on
# the wire, dissected by tshark), forwarded (rping while an ibv_ud_pingpong pair, which
# runs no CM, holds UDP 4791 with the lowest slot on both hosts: QP1's datagrams reach the
# rdma_cm process through it, decision 0007), rdma_server, rdma_xserver (its RC mode and,
# as rdma_xserver-xrc, its XRC mode),
# cmtime COUNT (COUNT connections at once), rstream [OPTIONS] (rsockets: kernel TCP, see
# docs/rdma-cm.md), perftest PROG [OPTIONS] (PROG -R OPTIONS), rpma RPMA_PAIR
# (tests/rpma), pyverbs (rdma-core's test_rdmacm, the passive side of each test on B:
# tests/pyverbs/run-suite --peer-netns), one-host (rdma_server and rdma_client both on A).
# The client side runs under `softverbs trace -w` (tests/hosts/roce_count.py counts the
# capture): a connection between hosts must carry its data in RoCE v2 packets to a QP
# other than QP1, a same-host one (one-host) none at all (shared memory).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/netns.sh"

(($# >= 3)) || { echo "usage: $0 SOFTVERBS PORT LIMIT CASE [ARGS...]"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 case_name=$3
shift 3
case_args=("$@")
here=$(cd "$(dirname "$0")" && pwd)

why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
pair_setup "$base_port"
hosts_exit_cleanup # after pair_setup: keeps its cleanup too
hosts_up || exit 1

# The listener's abstract name lives in B's namespace and B's state directory.
PAIR_READY=cm-b
cm_ps=106
pair_ready() {
  case $PAIR_READY in
    cm-b-ib) SOFTVERBS_STATE_DIR=$HOST_B_STATE in_host B bash -c "$(declare -f cm_listening); cm_listening $1 13f" ;;
    cm-b) SOFTVERBS_STATE_DIR=$HOST_B_STATE in_host B bash -c "$(declare -f cm_listening); cm_listening $1 $cm_ps" ;;
    cm-a) SOFTVERBS_STATE_DIR=$HOST_A_STATE in_host A bash -c "$(declare -f cm_listening); cm_listening $1 $cm_ps" ;;
    tcp-b) [[ -n $(in_host B ss -Hltn "sport = :$1") ]] ;;
  esac
}

sv_b=("${HOST_B[@]}" "$SOFTVERBS" run --)
sv_a=("${HOST_A[@]}" "$SOFTVERBS" run --)
# The client traced: every RoCE v2 packet it sends and receives goes to $pcap (and to
# $pcap.PID for the processes it starts).
pcap=$pair_tmp/a.pcap
# Only what crossed the wire: the checks below count RoCE v2 packets to tell the wire from
# shared memory, which a trace also shows as packets by default (docs/trace.md).
export SOFTVERBS_TRACE_SAME_HOST=0
tr_a=("${HOST_A[@]}" "$SOFTVERBS" trace -w "$pcap" --)
b=$HOST_B_IP4
count=10
# roce_packets: "gmp N data M" over the client's captures (roce_count.py).
roce_packets() {
  local f gmp=0 data=0 g d
  for f in "$pcap" "$pcap".*; do
    [[ -e $f ]] || continue
    read -r _ g _ d < <(python3 "$here/roce_count.py" "$f")
    gmp=$((gmp + g)) data=$((data + d))
  done
  echo "gmp $gmp data $data"
}

case $case_name in
  rping | rping-q | trace | forwarded)
    q=()
    [[ $case_name == rping-q ]] && q=(-q)
    server=("${sv_b[@]}" rping -s "${q[@]}" -a "$b" -p "$port" -v -V -C "$count")
    client=("${tr_a[@]}" rping -c "${q[@]}" -a "$b" -p "$port" -v -V -C "$count")
    ;;
  ucmatose)
    server=("${sv_b[@]}" ucmatose -p "$port" -c 4 -C "$count")
    client=("${tr_a[@]}" ucmatose -s "$b" -p "$port" -c 4 -C "$count")
    ;;
  udaddy)
    # udaddy has no port option: always 7174, in the UDP port space.
    cm_ps=111
    port=7174
    server=("${sv_b[@]}" udaddy -C "$count")
    client=("${tr_a[@]}" udaddy -s "$b" -C "$count")
    ;;
  rdma_server | rdma_xserver)
    # rdma_xserver's default is RC (-c r); rdma_xserver-xrc is its XRC mode (-c x).
    server=("${sv_b[@]}" "$case_name" -p "$port")
    client=("${tr_a[@]}" "${case_name/server/client}" -s "$b" -p "$port")
    ;;
  rdma_xserver-xrc)
    # XRC: the REQ says transport type 3 (extended) with extended type 1, port space IB.
    PAIR_READY=cm-b-ib
    server=("${sv_b[@]}" rdma_xserver -c x -p "$port")
    client=("${tr_a[@]}" rdma_xclient -c x -s "$b" -p "$port")
    ;;
  one-host)
    # Both on A, through A's veth address: the same-host path (shared memory), no RoCE.
    PAIR_READY=cm-a
    server=("${sv_a[@]}" rdma_server -p "$port")
    client=("${tr_a[@]}" rdma_client -s "$HOST_A_IP4" -p "$port")
    ;;
  cmtime)
    # COUNT connections at once; the server serves until stopped (rdma-core 44).
    conns=${case_args[0]:?cmtime COUNT}
    PAIR_GRACE=2
    server=("${sv_b[@]}" cmtime -p "$port")
    client=("${tr_a[@]}" cmtime -s "$b" -p "$port" -c "$conns")
    ;;
  rstream)
    # rsockets are kernel sockets (docs/rdma-cm.md): a TCP listener, data over TCP.
    PAIR_READY=tcp-b
    server=("${sv_b[@]}" rstream -p "$port" "${case_args[@]}")
    client=("${tr_a[@]}" rstream -s "$b" -p "$port" "${case_args[@]}")
    ;;
  perftest)
    prog=${case_args[0]:?perftest PROG [OPTIONS]}
    server=("${sv_b[@]}" "$prog" -d softverbs0 -R -p "$port" "${case_args[@]:1}")
    client=("${tr_a[@]}" "$prog" -d softverbs0 -R -p "$port" "${case_args[@]:1}" "$b")
    ;;
  rpma)
    rpma_pair=${case_args[0]:?rpma RPMA_PAIR}
    export RPMA_PAIR_TIMEOUT=$((PAIR_TIMEOUT - 2))
    server=("${sv_b[@]}" "$rpma_pair" server "$b" "$port" both)
    client=("${tr_a[@]}" "$rpma_pair" client "$b" "$port" both)
    ;;
  pyverbs) ;;
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
  # -g 0: each host's veth IPv4, the first GID as on a NIC (hosts.devinfo_gids checks it).
  ud_port=$((port + 2000))
  "${sv_b[@]}" ibv_ud_pingpong -g 0 -p "$ud_port" -n 1000000 >/dev/null 2>&1 &
  ud_b=$!
  sleep 0.5
  "${sv_a[@]}" ibv_ud_pingpong -g 0 -p "$ud_port" -n 1000000 "$b" >/dev/null 2>&1 &
  ud_a=$!
  for ((i = 0; i < 40; i++)); do
    [[ $(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]] && break
    sleep 0.05
  done
  check "a process without CM holds UDP 4791 on B first" \
    "[[ \$(in_host B ss -Hulpn 'sport = :4791') == *ibv_ud_pingpong* ]]"
fi
if [[ $case_name == pyverbs ]]; then
  # run-suite calls `SOFTVERBS run -- python3 ...`: this wrapper traces it instead.
  wrapper=$pair_tmp/softverbs-traced
  printf '#!/bin/sh\n[ "$1" = run ] && shift && [ "$1" = -- ] && shift\nexec %q trace -w %q -- "$@"\n' \
    "$SOFTVERBS" "$pcap" >"$wrapper"
  chmod +x "$wrapper"
  run "${HOST_A[@]}" timeout "$PAIR_TIMEOUT" "$here/../pyverbs/run-suite" --softverbs "$wrapper" \
    --seed 4791 --cm-addr "$b" --cm-active-addr "$HOST_A_IP4" \
    --peer-netns "$HOST_B_NS" --peer-state-dir "$HOST_B_STATE" -- test_rdmacm
  check "run-suite passed" '((rc == 0))'
  check "all 10 rdma_cm tests passed, the 3 multicast ones too" "stdout_has '^pyverbs suite: ran 10: 10 passed, 0 failures, 0 errors, 0 skipped'"
  read -r _ gmp _ data < <(roce_packets)
  echo "RoCE v2 packets in the active side's captures: $gmp to QP1 (the CM), $data of data"
  check "the CM spoke over RoCE v2 (MADs to QP1)" '((gmp > 0))'
  check "the data went over RoCE v2" '((data > 0))'
  check "no crash, no sanitizer report" no_crash
  finish
  exit 0
fi
start=$(now_ms)
pair_run
ms=$(($(now_ms) - start))
# perftest 4.5-0.17 (Debian 12) connects its data QPs right after the exchange on its first
# connection; a REQ that comes before the server listens again is rejected (8), as on any
# host, and perftest's retry then reuses the ids it has just destroyed and crashes (fixed
# upstream: rdma_cm_client_connection reallocates its nodes on retry). Run the pair again.
# So too when perftest's clock calibration failed on a loaded machine (its latencies are
# then "inf": pair_hosts.sh).
for attempt in 2 3 4 5; do
  [[ $case_name == perftest ]] || break
  if side_has cli 'RDMA_CM_EVENT_REJECTED; error: 8'; then
    echo "perftest's data connection was rejected (its server was not listening again yet): running the pair again, attempt $attempt"
  elif side_has cli 'Correlation coefficient r\^2' || side_has srv 'Correlation coefficient r\^2'; then
    echo "perftest's clock calibration failed (machine too busy): running the pair again, attempt $attempt"
  else
    break
  fi
  rm -f -- "$pcap" "$pcap".*
  pair_run
done
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
  rdma_server | rdma_xserver | rdma_xserver-xrc | one-host)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "server ended with 0" "side_has srv ': end 0\$'"
    check "client ended with 0" "side_has cli ': end 0\$'"
    if [[ $case_name == rdma_xserver-xrc ]] && command -v tshark >/dev/null; then
      # The wire (IBA 9.x, rxe_hdr.h): the client's message is an XRC SEND ONLY (0xA4) whose
      # first 4 bytes after the BTH are the XRCETH: 8 reserved zero bits and the server's
      # XRC SRQ number; the server answers with an XRC ACKNOWLEDGE (0xB1). Wireshark 4.0
      # names the XRC opcodes but shows the XRCETH as the start of "unknown" data.
      run tshark --disable-protocol rpcordma -r "$pcap" -Y 'infiniband.bth.opcode == 164' \
        -T fields -e infiniband.vendor
      check "A sent an XRC SEND ONLY whose XRCETH names an SRQ (00 + 24 bits, not 0)" \
        '[[ $out =~ ^00([0-9a-f]{6}) && ${BASH_REMATCH[1]} != 000000 ]]'
      run tshark --disable-protocol rpcordma -r "$pcap" -Y 'infiniband.bth.opcode == 177' -T fields -e frame.number
      check "B answered with an XRC ACKNOWLEDGE" '[[ -n $out ]]'
      run tshark --disable-protocol rpcordma -r "$pcap" -Y 'infiniband.bth.opcode == 164' -V
      check "tshark names it: Extended Reliable Connection (XRC) - SEND Only" \
        "[[ \$out == *'Extended Reliable Connection (XRC) - SEND Only'* ]]"
      run python3 "$(dirname "$0")/garbage.py" --self-test "$pcap"
      check "every captured ICRC is right (garbage.py --self-test)" '((rc == 0))'
    fi
    ;;
  cmtime)
    check "client exited 0" '((cli_rc == 0))'
    check "no connection failed" "! side_has cli '^event: '"
    for step in 'create id' 'resolve addr' 'resolve route' 'create qp' connect disconnect destroy; do
      check "client timed '$step'" "side_has cli '^$step *: +[0-9.]+ +[0-9.]+'"
    done
    # A REQ or REP lost in the burst comes back only with the CM's resend, 6.4 s later.
    connect_ms=$(awk '/^connect *:/ { print int($3) }' <<<"$cli_out")
    check "no handshake waited for the 6.4 s resend (all $conns connected in ${connect_ms:-?} ms)" \
      '[[ -n $connect_ms ]] && ((connect_ms < 6000))'
    check "server was serving until stopped" '((srv_rc == 124 || srv_rc == 143))'
    ;;
  rstream)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "client measured a transfer" "side_has cli '^(custom|[0-9]+[km]?_(lat|bw)) +[0-9]'"
    ;;
  perftest)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "client printed a result line" "side_has cli '^ *[0-9]+ +[0-9]+ +[0-9.]+'"
    # The GIDs perftest prints are those of its -x index (by default the first IPv4 GID, the
    # veth's), not the ones rdma_cm resolved: the trace below is what shows the path.
    # Its data connection's REQ must not overtake the ACK of the server's last parameter
    # SEND (docs/roce.md, "ACKs held back"): in the client's trace, every RC request from B
    # before A's second REQ is acknowledged by A before it.
    if command -v tshark >/dev/null; then
      unacked=$(tshark -r "$pcap" -T fields -e ip.src -e infiniband.bth.opcode -e infiniband.mad.attributeid 2>/dev/null |
        awk -v a="$HOST_A_IP4" -v b="$b" '
          $1 == b && $2 < 64 && $2 != 17 { pending = 1 }
          $1 == a && $2 == 17 { pending = 0 }
          $1 == a && $3 == "0x0010" && ++reqs == 2 { print pending; exit }')
      check "the data connection's REQ left after the ACK of B's last SEND (${unacked:-no second REQ})" \
        '[[ $unacked == 0 ]]'
    fi
    ;;
  rpma)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "no FAIL line on either side" "! side_has srv '^FAIL' && ! side_has cli '^FAIL'"
    check "both sides finished" "side_has srv '^PASS server: server done\$' && side_has cli '^PASS client: client done\$'"
    check "client: rpma_write then rpma_read over the connection" \
      "side_has cli '^PASS client: \\[plain\\] rpma_write then rpma_read'"
    ;;
  no-listener)
    check "rping failed" '((cli_rc != 0 && cli_rc != 124))'
    check "the connect was rejected with IB CM reason 8 (invalid service ID)" \
      "side_has cli 'RDMA_CM_EVENT_REJECTED, error 8'"
    check "within 3 s of the server being ready (took ${ms} ms in all)" '((ms < 6000))'
    ;;
esac
read -r _ gmp _ data < <(roce_packets)
echo "RoCE v2 packets the client sent and received: $gmp to QP1 (the CM), $data of data"
case $case_name in
  one-host)
    check "same host: no RoCE v2 packet at all (shared memory)" '((gmp == 0 && data == 0))' ;;
  rstream)
    check "rsockets: no RoCE v2 packet (kernel TCP)" '((gmp == 0 && data == 0))' ;;
  cmtime)
    check "the CM spoke over RoCE v2: REQ, REP and RTU at least for each of $conns" '((gmp >= 3 * conns))' ;;
  no-listener) ;;
  *)
    check "the CM spoke over RoCE v2 (MADs to QP1)" '((gmp > 0))'
    check "the data went over RoCE v2 (packets to other QPs)" '((data > 0))' ;;
esac
if [[ $case_name == no-listener || $case_name == cmtime ]]; then
  cli_rc=0  # no-listener: rping's own failure (255) is the expected outcome, checked above
  srv_rc=0  # stopped: it waits for a client forever
fi
# no-listener: rping's two threads may both call exit() (lib.sh, without_rping_exit_race).
[[ $case_name != no-listener ]] || cli_err=$(without_rping_exit_race "$cli_err")
check "no crash, no sanitizer report" pair_no_crash
finish
