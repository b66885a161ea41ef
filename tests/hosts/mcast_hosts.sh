#!/usr/bin/env bash
# UD multicast between the two hosts of netns.sh (decision 0008). Exits 77 without root.
#   mcast_hosts.sh SOFTVERBS CASE [MCAST]
# CASE:
#   ibv4, ibv6   mcast.c at the verbs level, an IPv4 (239.7.7.7) or IPv6 (ff0e::7:7:7) group:
#                two members on B and one on A; A sends (both of B's get every datagram
#                exactly once, A's through shared memory), then B sends; one of B's detaches
#                (nothing more reaches it; the kernel's membership count drops); the other is
#                killed with SIGKILL (the kernel leaves the group: `ip maddr` no longer shows
#                it); the detached one attaches again and receives.
#   mckey-ab, mckey-ba
#                rdmacm-utils' mckey with the arguments of tests/interop/cm.sh (the group
#                230.1.2.3, no bind address: the route picks the veth's), the sender on the
#                first host, two receivers on the second: both get all 10 messages.
# MCAST: the mcast.c binary (ibv cases).
# shellcheck disable=SC2016 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

(($# >= 1)) || { echo "usage: $0 SOFTVERBS CASE [MCAST]"; exit 2; }
case_name=$1 mcast=${2-}
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
tmp=$(mktemp -d)
hosts_exit_cleanup
trap 'hosts_down; rm -rf -- "$tmp"' EXIT
trap '' PIPE # a command to a member that died fails, instead of ending the script
hosts_up || exit 1

# ---- members of mcast.c, driven through FIFOs -------------------------------------------
declare -A member_in member_out member_pid

# member_start NAME HOST GROUP: an mcast.c member on HOST; waits for its "ready".
member_start() {
  local name=$1 host=$2 group=$3 fd_in fd_out line
  local -n prefix=HOST_$host
  mkfifo "$tmp/$name.in" "$tmp/$name.out"
  # A simple command, not a function: $! is the member itself (ip, env and `softverbs run`
  # exec into it), which the test kills.
  "${prefix[@]}" "$SOFTVERBS" run -- "$mcast" member "$group" \
    <"$tmp/$name.in" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  member_pid[$name]=$!
  exec {fd_in}>"$tmp/$name.in" {fd_out}<"$tmp/$name.out"
  member_in[$name]=$fd_in member_out[$name]=$fd_out
  read -r -t 10 line <&"$fd_out"
  echo "$name: $line"
  [[ $line == ready* ]]
}

# member NAME COMMAND: sends COMMAND, prints and returns (in $reply) its one-line answer.
member() {
  reply=
  echo "$2" >&"${member_in[$1]}" 2>/dev/null || return 1
  read -r -t 10 reply <&"${member_out[$1]}" || return 1
  echo "$1 <- $2: $reply"
}

# received NAME TAG WANT: waits (3 s at most) until NAME has WANT datagrams from TAG, then
# true if exactly WANT arrived, none twice.
received() {
  local i
  for ((i = 0; i < 60; i++)); do
    member "$1" "count $2" >/dev/null || return 1
    [[ $reply == "count $2 $3 dup 0" ]] && { echo "$1: $reply"; return 0; }
    [[ $reply =~ ^count\ $2\ ([0-9]+) ]] && ((BASH_REMATCH[1] > $3)) && break
    sleep 0.05
  done
  echo "$1: $reply (wanted $3, none twice)"
  return 1
}

# send HOST TAG COUNT: mcast.c sends COUNT datagrams from that host's veth address.
send() {
  local src
  if [[ $family == 4 ]]; then src=$(host_var "$1" IP4); else src=$(host_var "$1" IP6); fi
  run in_host "$1" "$SOFTVERBS" run -- "$mcast" send "$group" "$src" "$3" "$2"
  check "$1 sent $3 datagrams tagged $2" "((rc == 0)) && stdout_has '^sent $3\$'"
}

# joins HOST: the kernel's count of sockets joined to the group on that host's veth (0
# when it does not list the group).
joins() {
  ip -n "$(host_var "$1" NS)" maddr show dev "$HOSTS_IF" |
    awk -v g="$group" '($1 == "inet" || $1 == "inet6") && $2 == g {
      n = 1; for (i = 3; i < NF; i++) if ($i == "users") n = $(i + 1) } END { print n + 0 }'
}

# wait_joins HOST N [SECONDS]: waits (2 s unless told) until joins HOST is N.
wait_joins() {
  local i
  for ((i = 0; i < ${3:-2} * 20; i++)); do
    (($(joins "$1") == $2)) && return 0
    sleep 0.05
  done
  return 1
}

case $case_name in
  ibv4 | ibv6)
    [[ -x $mcast ]] || { echo "usage: $0 SOFTVERBS $case_name MCAST"; exit 2; }
    if [[ $case_name == ibv4 ]]; then family=4 group=239.7.7.7; else family=6 group=ff0e::7:7:7; fi
    member_start b1 B "$group" && member_start b2 B "$group" && member_start a1 A "$group" ||
      { echo "FAIL: a member did not start"; cat "$tmp"/*.err; exit 1; }
    for m in b1 b2 a1; do
      member "$m" attach
      check "$m attached" '[[ $reply == attached ]]'
    done
    check "B's kernel has the group joined by 2 sockets (one per process)" 'wait_joins B 2'
    check "A's kernel has it joined by 1" 'wait_joins A 1'

    send A a 20
    for m in b1 b2 a1; do check "$m got A's 20 datagrams, each once" "received $m a 20"; done
    send B b 20
    for m in b1 b2 a1; do check "$m got B's 20 datagrams, each once" "received $m b 20"; done

    member b1 detach
    check "b1 detached" '[[ $reply == detached ]]'
    check "B's kernel: 1 socket joined" 'wait_joins B 1'
    send A c 20
    check "b2 got 20 more" 'received b2 c 20'
    sleep 0.2
    check "b1, detached, got none of them" 'received b1 c 0'

    kill -KILL "${member_pid[b2]}"
    wait "${member_pid[b2]}" 2>/dev/null
    check "b2 killed: B's kernel left the group" 'wait_joins B 0'
    member b1 attach
    check "b1 attached again" '[[ $reply == attached ]] && wait_joins B 1'
    send A d 10
    check "b1 got the next 10" 'received b1 d 10'

    for m in b1 a1; do
      member "$m" quit
      check "$m quit" '[[ $reply == bye ]] && wait "${member_pid[$m]}"'
    done
    check "A's kernel left the group when its last member went" 'wait_joins A 0'
    for m in b1 b2 a1; do
      check "$m: no crash, no sanitizer report" \
        "! grep -Eq 'Sanitizer|runtime error:|FAIL' '$tmp/$m.err'"
    done
    ;;
  mckey-ab | mckey-ba)
    group=230.1.2.3 count=10
    if [[ $case_name == mckey-ab ]]; then from=A to=B; else from=B to=A; fi
    # The receivers first: each is ready once its QP is attached (mckey then waits 3 s
    # before it polls, and so does the sender before it sends).
    for r in 1 2; do
      in_host "$to" "$SOFTVERBS" run -- timeout 20 mckey -m "$group" -C "$count" \
        >"$tmp/r$r.out" 2>&1 &
      eval "r${r}_pid=\$!"
    done
    check "both receivers joined: $to's kernel has the group joined by 2 sockets" "wait_joins $to 2 10"
    run in_host "$from" "$SOFTVERBS" run -- timeout 20 mckey -m "$group" -s -C "$count"
    check "sender exited 0" '((rc == 0))'
    check "sender: joined the group's GID" 'stdout_has "^mckey: joined dgid: ::ffff:230\.1\.2\.3 "'
    check "sender: data transfers complete" 'stdout_has "^data transfers complete"'
    check "sender: no crash, no sanitizer report" no_crash
    for r in 1 2; do
      pid_var=r${r}_pid
      wait "${!pid_var}"
      r_rc=$?
      cat "$tmp/r$r.out"
      check "receiver $r on $to exited 0" "((r_rc == 0))"
      check "receiver $r joined the group's GID" "grep -q '^mckey: joined dgid: ::ffff:230\.1\.2\.3 ' '$tmp/r$r.out'"
      check "receiver $r got all $count messages" \
        "grep -q '^data transfers complete' '$tmp/r$r.out' && grep -q '^return status 0' '$tmp/r$r.out'"
      check "receiver $r: no sanitizer report" "! grep -Eq 'Sanitizer|runtime error:' '$tmp/r$r.out'"
    done
    check "$to's kernel left the group" "wait_joins $to 0"
    ;;
  *)
    echo "unknown case $case_name"
    exit 2
    ;;
esac
if ((failures > 0)); then
  for f in "$tmp"/*.err; do
    [[ -s $f ]] && { echo "--- ${f##*/}:"; cat "$f"; }
  done
fi
finish
