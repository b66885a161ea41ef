#!/usr/bin/env bash
# softverbs against the kernel's Soft-RoCE (Linux rxe) on the wire, by hand (not CI): boots the
# rxe guest of shared/tools/rxe-vm once, with rxe1 on one end of a veth pair (root namespace,
# 10.9.0.1) and softverbs in namespace `sv` on the other (10.9.0.2), runs every pingpong and
# perftest program, then the rdma_cm programs (the IB CM in MADs to QP1: rping, ucmatose,
# udaddy, perftest -R, rejections, a slow acceptor), in both directions (softverbs server /
# rxe client, rxe server / softverbs client) and prints a table: program x direction ->
# pass/FAIL with the client's numbers.
#   tests/hosts/rxe_interop.sh [-n ITERS] [--capture] [--only REGEX]   # from the project root
# Needs a build in build/ (scripts/build), or the one SOFTVERBS_BUILD names (a directory under
# the project root). RXE_VM (default ../shared/tools/rxe-vm/run.sh)
# names run.sh; RXE_INTEROP_CPUS the guest's CPUs (2); RXE_INTEROP_RMEM_MAX sets the guest's
# net.core.rmem_max (default: the kernel's, 208 KiB). Each run's logs go to build/rxe-interop/NAME.{srv,cli}.log, with --capture
# also NAME.pcap (both sides' RoCE frames, seen on the softverbs end of the veth).
# Inside the guest the script runs itself with --guest.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
iters=100 capture=0 only=. guest=0 rmem_max= build=${SOFTVERBS_BUILD:-build}
while (($#)); do
  case $1 in
    -n) iters=$2; shift 2 ;;
    --capture) capture=1; shift ;;
    --only) only=$2; shift 2 ;;
    --guest) guest=1; shift ;;
    --rmem-max) rmem_max=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [-n ITERS] [--capture] [--only REGEX]" >&2; exit 2 ;;
  esac
done

if ((!guest)); then
  rxe_vm=${RXE_VM:-$root/../shared/tools/rxe-vm/run.sh}
  [[ -x $root/$build/tools/softverbs ]] || { echo "build softverbs first (scripts/build)" >&2; exit 2; }
  [[ -x $rxe_vm ]] || rxe_vm=/work/shared/tools/rxe-vm/run.sh
  mkdir -p "$root/$build/rxe-interop"
  rm -f "$root/$build"/rxe-interop/*
  if ((capture)); then
    cc -O2 -o "$root/$build/rxe-interop/cap" "$root/tests/unit/rxe_capture/cap.c" || exit 1
  fi
  # The rdma_cm cases' own program (a slow acceptor, a rejecting listener), run on both sides.
  cc -O2 -o "$root/$build/rxe-interop/cm_peer" "$root/tests/unit/rxe_capture/cm_peer.c" -lrdmacm -libverbs || exit 1
  extra=(-n "$iters" --only "$only" --rmem-max "${RXE_INTEROP_RMEM_MAX:-}" --build "$build")
  ((capture)) && extra+=(--capture)
  RXE_VM_LINKS='' exec "$rxe_vm" -s "$root" -t "${RXE_INTEROP_VM_LIMIT:-1500}" -c "${RXE_INTEROP_CPUS:-2}" \
    "bash tests/hosts/rxe_interop.sh --guest ${extra[*]@Q}"
fi

# ---- in the guest (cwd: the project root, shared at /mnt/host) ----
out=$build/rxe-interop
sv() { ip netns exec sv "$@"; }
ip netns add sv
ip link add vrxe type veth peer name vsv
ip link set vsv netns sv
ip addr add 10.9.0.1/24 dev vrxe && ip link set vrxe up
sv ip addr add 10.9.0.2/24 dev vsv && sv ip link set vsv up && sv ip link set lo up
rdma link add rxe1 type rxe netdev vrxe
# softverbs asks for a 4 MiB receive buffer, which the kernel caps at rmem_max (208 KiB here).
[[ -n $rmem_max ]] && sysctl -qw net.core.rmem_max="$rmem_max"
sleep 1

# gid_index DEVINFO_OUTPUT ADDRESS: the index of ADDRESS's RoCE v2 GID.
gid_index() { sed -nE "s/^[[:space:]]*GID\[ *([0-9]+)\]:[[:space:]]+$2, RoCE v2$/\1/p" <<<"$1" | head -1; }
rxe_info=$(ibv_devinfo -d rxe1 -v)
sv_info=$(sv $build/tools/softverbs run -- ibv_devinfo -v)
rxe_gid=$(gid_index "$rxe_info" '::ffff:10\.9\.0\.1')
sv_gid=$(gid_index "$sv_info" '::ffff:10\.9\.0\.2')
echo "rxe1 GID index $rxe_gid (::ffff:10.9.0.1), softverbs0 GID index $sv_gid (::ffff:10.9.0.2)"
grep -E 'active_mtu|GID\[' <<<"$rxe_info" | sed 's/^/  rxe1: /'
grep -E 'active_mtu|GID\[' <<<"$sv_info" | sed 's/^/  softverbs0: /'
[[ -n $rxe_gid && -n $sv_gid ]] || { echo "a GID is missing"; exit 1; }

declare -A options=(
  [ibv_rc_pingpong]="-n $iters" [ibv_rc_pingpong.e]="-n $iters -e"
  [ibv_uc_pingpong]="-n $iters" [ibv_ud_pingpong]="-n $iters -s 512"
  [ibv_srq_pingpong]="-n $iters"
)
programs=(ibv_rc_pingpong ibv_rc_pingpong.e ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong
  ib_send_lat ib_send_bw ib_write_lat ib_write_bw ib_read_lat ib_read_bw ib_atomic_lat ib_atomic_bw)
port=18600

# result CLIENT_LOG: the client's numbers, as its program prints them.
result() {
  local line
  if line=$(grep -E '^[0-9]+ iters in ' "$1" | tail -1) && [[ -n $line ]]; then
    sed -E 's/.* = ([0-9.]+ usec\/iter)/\1/' <<<"$line"
  elif grep -q 't_avg\[usec\]' "$1"; then # perftest latency: #bytes #iters t_min t_max t_typical t_avg ...
    awk '/t_avg\[usec\]/ { want = 1; next } want && NF >= 6 { printf "%s B: t_typ %s t_avg %s usec", $1, $5, $6; exit }' "$1"
  elif grep -q 'BW average' "$1"; then # perftest bandwidth: #bytes #iters peak average msgrate
    awk '/BW average/ { want = 1; next } want && NF >= 5 { printf "%s B: %s MB/s, %s Mpps", $1, $4, $5; exit }' "$1"
  fi
}

# counters FILE: rxe1's counters and the sv namespace's UDP receive-buffer drops, one
# "name value" a line.
counters() {
  { rdma statistic show link rxe1/1 | tr ' ' '\n' | awk 'prev != "" && /^[0-9]+$/ { print prev, $1 } { prev = $1 }'
    sv awk '/^Udp:/ { if (n++) print "sv_udp_rcvbuf_errors", $6; if (n == 2) print "sv_udp_noports", $3 }' /proc/net/snmp
  } >"$1" 2>/dev/null
}
# counter_changes BEFORE AFTER: "name +delta" for each counter that moved, but the packet counts.
counter_changes() {
  awk 'NR == FNR { was[$1] = $2; next } $2 != was[$1] && $1 !~ /^(sent_pkts|rcvd_pkts|rdma_sends|rdma_recvs)$/ { printf "%s +%d ", $1, $2 - was[$1] }' "$1" "$2"
}

# pair_once: one server + client run of $srv / $cli into $log.{srv,cli}.log; sets srv_rc, cli_rc.
pair_once() {
  echo "$ $srv" >"$log.srv.log"
  echo "$ $cli" >"$log.cli.log"
  timeout 90 $srv >>"$log.srv.log" 2>&1 &
  local srv_pid=$!
  sleep 2
  timeout 80 $cli >>"$log.cli.log" 2>&1
  cli_rc=$?
  wait $srv_pid
  srv_rc=$?
  echo "exit $srv_rc" >>"$log.srv.log"
  echo "exit $cli_rc" >>"$log.cli.log"
}

# run_pair NAME PROG OPTS SERVER_SIDE: SERVER_SIDE is sv (softverbs server, rxe client) or rxe.
run_pair() {
  local name=$1 prog=$2 opts=$3 srv_side=$4 gopt=-g srv cli log srv_rc cli_rc
  [[ $prog == ib_* ]] && gopt=-x
  local rxe_cmd="$prog -d rxe1 $gopt $rxe_gid $opts"
  local sv_cmd="ip netns exec sv $build/tools/softverbs run -- $prog -d softverbs0 $gopt $sv_gid $opts"
  log=$out/$name.$srv_side-server
  local cap_pid=
  if ((capture)); then
    ip netns exec sv "$out/cap" vsv "$log.pcap" 600 2>/dev/null &
    cap_pid=$!
  fi
  counters "$log.before"
  local attempt
  for attempt in 1 2 3; do
    if [[ $srv_side == sv ]]; then
      srv="$sv_cmd -p $port" cli="$rxe_cmd -p $port 10.9.0.2"
    else
      srv="$rxe_cmd -p $port" cli="$sv_cmd -p $port 10.9.0.1"
    fi
    port=$((port + 1))
    pair_once
    # perftest's clock calibration fails when the emulated CPUs are busy: run it again.
    grep -q 'Correlation coefficient r^2' "$log".{srv,cli}.log || break
  done
  counters "$log.after"
  [[ -n $cap_pid ]] && kill "$cap_pid" 2>/dev/null && wait "$cap_pid" 2>/dev/null
  local verdict=pass numbers notes
  numbers=$(result "$log.cli.log")
  notes=$(counter_changes "$log.before" "$log.after")
  ((attempt > 1)) && notes="runs $attempt (clock calibration) $notes"
  if ((srv_rc != 0 || cli_rc != 0)) || [[ -z $numbers ]] || grep -qi 'invalid data' "$log".{srv,cli}.log; then
    verdict="FAIL (server $srv_rc, client $cli_rc)"
    echo "---- $name, $srv_side server: FAIL; tails:"
    tail -5 "$log.srv.log" | sed 's/^/  srv| /'
    tail -5 "$log.cli.log" | sed 's/^/  cli| /'
    dmesg | tail -3 | sed 's/^/  dmesg| /'
  fi
  printf '| %-17s | %-23s | %-4s | %s | %s |\n' "$name" \
    "$([[ $srv_side == sv ]] && echo 'softverbs srv, rxe cli' || echo 'rxe srv, softverbs cli')" \
    "$verdict" "${numbers:-}" "${notes% }" >>"$out/table.md"
}

: >"$out/table.md"
for name in "${programs[@]}"; do
  [[ $name =~ $only ]] || continue
  prog=${name%.e}
  opts=${options[$name]:-"-n $iters"}
  for side in sv rxe; do
    run_pair "$name" "$prog" "$opts" "$side"
  done
done
# ---- rdma_cm between the hosts: the IB CM in MADs to QP1 (issue 12) ----
# Each case: a server and a client command with @S (the server's address), @C (the client's),
# @P (the port), @Q (a port nobody listens on), @D (the side's device for perftest); what the
# client's log must show; and whether the server is stopped once the client is done.
cm_cases=(rping ucmatose udaddy ib_send_lat.R ib_write_bw.R ib_read_lat.R reject.28 noport.8
  slow_accept.mra)
declare -A cm_srv=(
  [rping]="rping -s -a @S -p @P -C 10 -v"
  [ucmatose]="ucmatose -b @S -p @P -c 4 -C 10"
  [udaddy]="udaddy -b @S -c 2 -C 10"
  [ib_send_lat.R]="ib_send_lat -R @D -p @P -n $iters"
  [ib_write_bw.R]="ib_write_bw -R @D -p @P -n $iters"
  [ib_read_lat.R]="ib_read_lat -R @D -p @P -n $iters"
  [reject.28]="$out/cm_peer reject @S @P"
  [noport.8]="rping -s -a @S -p @P -C 1"
  [slow_accept.mra]="$out/cm_peer accept @S @P 9"
)
declare -A cm_cli=(
  [rping]="rping -c -a @S -I @C -p @P -C 10 -v"
  [ucmatose]="ucmatose -s @S -b @C -p @P -c 4 -C 10"
  [udaddy]="udaddy -s @S -b @C -c 2 -C 10"
  [ib_send_lat.R]="ib_send_lat -R @D -p @P -n $iters @S"
  [ib_write_bw.R]="ib_write_bw -R @D -p @P -n $iters @S"
  [ib_read_lat.R]="ib_read_lat -R @D -p @P -n $iters @S"
  [reject.28]="$out/cm_peer connect @C @S @P REJECTED"
  [noport.8]="rping -c -a @S -I @C -p @Q -C 1"
  [slow_accept.mra]="$out/cm_peer connect @C @S @P ESTABLISHED"
)
# What the client prints when the case went as it should (a regex, grep -E).
declare -A cm_expect=(
  [rping]='^ping data: ' [ucmatose]='^data transfers complete' [udaddy]='^data transfers complete'
  [reject.28]='REJECTED status 28 private data [0-9]+ bytes "softverbs: rejected by cm_peer"'
  [noport.8]='RDMA_CM_EVENT_REJECTED, error 8'
  [slow_accept.mra]='ESTABLISHED status 0 private data [0-9]+ bytes "softverbs: REP private data'
)
declare -A cm_srv_stopped=([noport.8]=1)  # the server only runs a CM; stopped afterwards
declare -A cm_cli_fails=([noport.8]=1)    # the client exits non-zero when rejected

# cm_result CASE CLIENT_LOG: the client's numbers, or what it saw.
cm_result() {
  case $1 in
    rping) echo "$(grep -c '^ping data: ' "$2") pings" ;;
    ucmatose) echo "4 connections, 10 messages each" ;;
    udaddy) echo "2 SIDR resolutions, 10 datagrams each" ;;
    reject.28) echo "REJECTED 28 with the listener's private data" ;;
    noport.8) echo "REJECTED 8 (invalid service ID)" ;;
    slow_accept.mra) echo "ESTABLISHED after the REQ's resend; the acceptor disconnects" ;;
    *) result "$2" ;;
  esac
}

# run_cm NAME SERVER_SIDE: as run_pair, for rdma_cm programs (addresses instead of GIDs).
run_cm() {
  local name=$1 srv_side=$2 srv cli srv_rc cli_rc srv_addr cli_addr
  local log=$out/$name.$srv_side-server
  local sv_run="ip netns exec sv $build/tools/softverbs run --"
  if [[ $srv_side == sv ]]; then
    srv_addr=10.9.0.2 cli_addr=10.9.0.1
  else
    srv_addr=10.9.0.1 cli_addr=10.9.0.2
  fi
  # fill TEMPLATE SIDE: the command line for SIDE (sv or rxe).
  fill() {
    local t=$1 dev=rxe1 pre=
    [[ $2 == sv ]] && dev=softverbs0 pre="$sv_run "
    t=${t//@S/$srv_addr} t=${t//@C/$cli_addr} t=${t//@P/$port} t=${t//@Q/$((port + 1))}
    echo "$pre${t//@D/-d $dev}"
  }
  local cap_pid=
  if ((capture)); then
    ip netns exec sv "$out/cap" vsv "$log.pcap" 600 2>/dev/null &
    cap_pid=$!
  fi
  counters "$log.before"
  local attempt cli_side=rxe
  [[ $srv_side == rxe ]] && cli_side=sv
  for attempt in 1 2 3; do
    srv=$(fill "${cm_srv[$name]}" "$srv_side") cli=$(fill "${cm_cli[$name]}" "$cli_side")
    port=$((port + 2))
    echo "$ $srv" >"$log.srv.log"
    echo "$ $cli" >"$log.cli.log"
    timeout 90 $srv >>"$log.srv.log" 2>&1 &
    local srv_pid=$!
    sleep 2
    timeout 120 $cli >>"$log.cli.log" 2>&1
    cli_rc=$?
    if [[ -n ${cm_srv_stopped[$name]:-} ]]; then
      kill "$srv_pid" 2>/dev/null
      wait "$srv_pid"
      srv_rc=0
    else
      wait "$srv_pid"
      srv_rc=$?
    fi
    echo "exit $srv_rc" >>"$log.srv.log"
    echo "exit $cli_rc" >>"$log.cli.log"
    grep -q 'Correlation coefficient r^2' "$log".{srv,cli}.log || break
  done
  counters "$log.after"
  [[ -n $cap_pid ]] && kill "$cap_pid" 2>/dev/null && wait "$cap_pid" 2>/dev/null
  local verdict=pass numbers notes ok=1
  numbers=$(cm_result "$name" "$log.cli.log")
  notes=$(counter_changes "$log.before" "$log.after")
  ((attempt > 1)) && notes="runs $attempt (clock calibration) $notes"
  ((srv_rc == 0)) || ok=0
  if [[ -n ${cm_cli_fails[$name]:-} ]]; then ((cli_rc != 0)) || ok=0; else ((cli_rc == 0)) || ok=0; fi
  if [[ -n ${cm_expect[$name]:-} ]]; then
    grep -qE "${cm_expect[$name]}" "$log.cli.log" || ok=0
  else
    [[ -n $numbers ]] || ok=0
  fi
  if ((!ok)); then
    verdict="FAIL (server $srv_rc, client $cli_rc)"
    echo "---- $name, $srv_side server: FAIL; tails:"
    tail -5 "$log.srv.log" | sed 's/^/  srv| /'
    tail -5 "$log.cli.log" | sed 's/^/  cli| /'
    dmesg | tail -3 | sed 's/^/  dmesg| /'
  fi
  printf '| %-17s | %-23s | %-4s | %s | %s |\n' "$name" \
    "$([[ $srv_side == sv ]] && echo 'softverbs srv, rxe cli' || echo 'rxe srv, softverbs cli')" \
    "$verdict" "${numbers:-}" "${notes% }" >>"$out/table.md"
}

for name in "${cm_cases[@]}"; do
  [[ $name =~ $only ]] || continue
  for side in sv rxe; do
    run_cm "$name" "$side"
  done
done

echo
echo "| program           | direction               | result | client's numbers | counters that moved (rxe1; sv's UDP drops) |"
echo "|-------------------|-------------------------|--------|------------------|--------------------------------------------|"
cat "$out/table.md"
! grep -q FAIL "$out/table.md"
