#!/usr/bin/env bash
# Debian's rdma_cm programs (rdmacm-utils), server and client as two processes on 127.0.0.1,
# connecting through our librdmacm.so.1.
#   cm.sh SOFTVERBS PORT LIMIT CASE
# CASE: rping, rping-q (the application makes its own QP), ucmatose (4 connections),
# ucmatose-migrate (rdma_migrate_id to a new channel, TOS and ACK timeout options), udaddy,
# rdma_server, rdma_xserver (RC), rdma_xserver-xrc (-c x: XRC INI and TGT QPs, an XRC SRQ,
# port space IB), cmtime, cmtime-2000 (2,000 connections at once: more than a listener's
# socket backlog, so some connects wait and are retried), rstream, mckey (a multicast
# receiver and a sender), or
# no-listener (a client alone: REJECTED fast).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"

(($# == 3)) || { echo "usage: $0 SOFTVERBS PORT LIMIT CASE"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 case_name=$3
pair_setup "$base_port"
sv=("$SOFTVERBS" run --)
PAIR_READY=cm-tcp
count=10

case $case_name in
  rping | rping-q)
    q=()
    [[ $case_name == rping-q ]] && q=(-q)
    server=("${sv[@]}" rping -s "${q[@]}" -a 127.0.0.1 -p "$port" -v -V -C "$count")
    client=("${sv[@]}" rping -c "${q[@]}" -a 127.0.0.1 -p "$port" -v -V -C "$count")
    ;;
  ucmatose)
    server=("${sv[@]}" ucmatose -p "$port" -c 4 -C "$count")
    client=("${sv[@]}" ucmatose -s 127.0.0.1 -p "$port" -c 4 -C "$count")
    ;;
  ucmatose-migrate)
    server=("${sv[@]}" ucmatose -p "$port" -c 2 -C "$count" -m -t 32 -a 16)
    client=("${sv[@]}" ucmatose -s 127.0.0.1 -p "$port" -c 2 -C "$count" -m -t 32 -a 16)
    ;;
  udaddy)
    # udaddy has no port option (its -p is the port space): always 7174, which is ours
    # alone, as the port space belongs to this test's own state directory.
    PAIR_READY=cm-udp port=7174
    server=("${sv[@]}" udaddy -C "$count")
    client=("${sv[@]}" udaddy -s 127.0.0.1 -C "$count")
    ;;
  rdma_server | rdma_xserver)
    cli_prog=${case_name/server/client}
    server=("${sv[@]}" "$case_name" -p "$port")
    client=("${sv[@]}" "$cli_prog" -s 127.0.0.1 -p "$port")
    ;;
  rdma_xserver-xrc)
    PAIR_READY=cm-ib
    server=("${sv[@]}" rdma_xserver -c x -p "$port")
    client=("${sv[@]}" rdma_xclient -c x -s 127.0.0.1 -p "$port")
    ;;
  cmtime | cmtime-2000)
    # The server serves forever (rdma-core 44): it is stopped once the client is done.
    PAIR_GRACE=2
    server=("${sv[@]}" cmtime -p "$port")
    client=("${sv[@]}" cmtime -s 127.0.0.1 -p "$port" -c "$([[ $case_name == cmtime ]] && echo 50 || echo 2000)")
    ;;
  rstream)
    PAIR_READY=tcp  # rsockets are kernel sockets (docs/rdma-cm.md)
    # Blocking calls and data verification: rstream's default busy-polls with MSG_DONTWAIT,
    # which crawls on a loaded 2-CPU machine.
    server=("${sv[@]}" rstream -p "$port" -T b -T v)
    client=("${sv[@]}" rstream -s 127.0.0.1 -p "$port" -T b -T v)
    ;;
  mckey)
    # The receiver joins 230.1.2.3 first (it is ready once attached); the sender joins as a
    # full member too, with a QP that blocks its own multicast loopback (mckey's default).
    PAIR_READY=mcast
    server=("${sv[@]}" mckey -m 230.1.2.3 -C "$count")
    client=("${sv[@]}" mckey -m 230.1.2.3 -s -C "$count")
    ;;
  no-listener) ;;
  *)
    echo "unknown case $case_name"
    exit 2
    ;;
esac

if [[ $case_name == no-listener ]]; then
  # Nobody listens on the port: the remote CM's REJ comes at once (IB CM reason 8, invalid
  # service ID), where a missing answer would take rping's whole timeout.
  start=$(now_ms)
  run timeout 10 "${sv[@]}" rping -c -a 127.0.0.1 -p "$port" -C 1
  ms=$(($(now_ms) - start))
  # rping's two threads may both call exit() (lib.sh, without_rping_exit_race).
  err=$(without_rping_exit_race "$err")
  check "rping failed" '((rc != 0 && rc != 124))'
  check "the connect was rejected with IB CM reason 8" \
    "stdout_has 'RDMA_CM_EVENT_REJECTED, error 8' || stderr_has 'RDMA_CM_EVENT_REJECTED, error 8'"
  check "within 3 s (took ${ms} ms)" '((ms < 3000))'
  check "no crash, no sanitizer report" \
    "((rc != 124 && (rc < 128 || rc == 255))) && ! grep -Eq 'Sanitizer|runtime error:' <<<\"\$out\$err\""
  finish
fi

pair_run

case $case_name in
  rping | rping-q)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "client got all $count pings back" \
      "(($(grep -cE '^ping data: rdma-ping-[0-9]+: [A-Za-z]' <<<"$cli_out") == count))"
    check "server saw all $count pings" \
      "(($(grep -cE '^server ping data: rdma-ping-[0-9]+: ' <<<"$srv_out") == count))"
    check "client saw no data mismatch" "! side_has cli 'data mismatch|error|fail'"
    ;;
  ucmatose | ucmatose-migrate | udaddy)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    for side in srv cli; do
      check "$side: data transfers complete" "side_has $side '^data transfers complete'"
      check "$side: return status 0" "side_has $side '^return status 0'"
    done
    if [[ $case_name == ucmatose-migrate ]]; then
      check "both sides migrated their ids" \
        "side_has srv '^migrating to new event channel' && side_has cli '^migrating to new event channel'"
    fi
    ;;
  rdma_server | rdma_xserver | rdma_xserver-xrc)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    check "server ended with 0" "side_has srv ': end 0\$'"
    check "client ended with 0" "side_has cli ': end 0\$'"
    ;;
  mckey)
    check "receiver exited 0" '((srv_rc == 0))'
    check "sender exited 0" '((cli_rc == 0))'
    for side in srv cli; do
      check "$side: joined the group's GID" "side_has $side '^mckey: joined dgid: ::ffff:230\.1\.2\.3 '"
      check "$side: return status 0" "side_has $side '^return status 0'"
    done
    check "receiver got all $count messages" \
      "side_has srv '^receiving data transfers' && side_has srv '^data transfers complete'"
    ;;
  cmtime | cmtime-2000)
    check "client exited 0" '((cli_rc == 0))'
    # cmtime prints "event: ..., error: ..." for each connection that failed.
    check "every connection connected" "! side_has cli '^event: '"
    check "server saw no failure" "! side_has srv '^event: '"
    for step in 'create id' 'resolve addr' 'resolve route' 'create qp' connect disconnect destroy; do
      check "client timed '$step'" "side_has cli '^$step *: +[0-9.]+ +[0-9.]+'"
    done
    check "server was serving until stopped" '((srv_rc == 124 || srv_rc == 143))'
    ;;
  rstream)
    check "server exited 0" '((srv_rc == 0))'
    check "client exited 0" '((cli_rc == 0))'
    for test in 64_lat 4k_lat 64k_lat 1m_lat 64_bw 4k_bw 64k_bw 1m_bw; do
      check "client measured $test" "side_has cli '^$test +[0-9]'"
    done
    ;;
esac
check "no crash, no sanitizer report" pair_no_crash
finish
