#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces A and B joined by a veth pair, each with its
# own softverbs state directory. Sourced by the `hosts` tests and bench/hosts; also a command
# for setting them up by hand (`tests/hosts/netns.sh help`). Needs root.
#
#   HOSTS_ID   names this pair (default "dev"); everything is called svh-<ID>-...: the
#              namespaces svh-<ID>-a and svh-<ID>-b, the state directories
#              /dev/shm/softverbs-hosts-<ID>/{a,b}. Tests pass one per build tree and test,
#              so parallel ctest runs and other build trees never meet.
#   HOSTS_MTU  the veth MTU (default 1500)
#   HOSTS_NET4 first three octets of the IPv4 /24 (default 10.77.1): A is .1, B is .2
#   HOSTS_NET6 the IPv6 ULA /64 prefix (default fd00:5376:77:1): A is ::1, B is ::2
# The pair is isolated from the machine and from other pairs, so every pair may use the same
# addresses. The veth end is called svh0 in both namespaces (interface names are per
# namespace); nothing is ever created in the machine's own namespace.
#
# Why a state directory per host: softverbs keeps its host registry, port state and multicast
# groups in $SOFTVERBS_STATE_DIR (default /dev/shm/softverbs-<uid>; src/common/state_dir.hpp)
# and reaches other processes through abstract Unix sockets named after that directory
# (src/wire/registry.cpp, src/cm/service.cpp). /dev/shm is shared by all namespaces of the
# machine but abstract sockets belong to one network namespace: two namespaces sharing a
# directory would find each other's processes in the registry and fail to reach them. With
# SOFTVERBS_STATE_DIR set per host nothing else of softverbs lives in /dev/shm (memory moves
# in anonymous memfds), so no private /dev/shm mount is needed.
#
# After hosts_up (or hosts_names), for X in A and B:
#   HOST_X          command prefix (array) running a command on host X:
#                   ip netns exec svh-ID-x env SOFTVERBS_STATE_DIR=DIR
#   HOST_X_NS, HOST_X_STATE, HOST_X_IP4, HOST_X_IP6, HOST_X_GID4 (::ffff:IPv4), HOSTS_IF
# Functions: hosts_supported, hosts_up, hosts_down, in_host, netem, drop, link, host_gids,
# gid_index_of (each described where it is defined).

# shellcheck shell=bash
# shellcheck disable=SC2034 # HOST_* are for the scripts that source this file
HOSTS_ID=${HOSTS_ID:-dev}
HOSTS_MTU=${HOSTS_MTU:-1500}
HOSTS_NET4=${HOSTS_NET4:-10.77.1}
HOSTS_NET6=${HOSTS_NET6:-fd00:5376:77:1}
HOSTS_IF=svh0
hosts_fault_table=svh_faults # the nftables table `drop` adds its rules to

# hosts_names: (re)computes every name and address from HOSTS_ID and the settings above.
hosts_names() {
  [[ $HOSTS_ID =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || { echo "bad HOSTS_ID '$HOSTS_ID'" >&2; return 2; }
  hosts_state_root=/dev/shm/softverbs-hosts-$HOSTS_ID
  HOST_A_NS=svh-$HOSTS_ID-a HOST_B_NS=svh-$HOSTS_ID-b
  HOST_A_STATE=$hosts_state_root/a HOST_B_STATE=$hosts_state_root/b
  HOST_A_IP4=$HOSTS_NET4.1 HOST_B_IP4=$HOSTS_NET4.2
  HOST_A_IP6=$HOSTS_NET6::1 HOST_B_IP6=$HOSTS_NET6::2
  HOST_A_GID4=::ffff:$HOST_A_IP4 HOST_B_GID4=::ffff:$HOST_B_IP4
  HOST_A=(ip netns exec "$HOST_A_NS" env "SOFTVERBS_STATE_DIR=$HOST_A_STATE")
  HOST_B=(ip netns exec "$HOST_B_NS" env "SOFTVERBS_STATE_DIR=$HOST_B_STATE")
}

# host_var X NAME: the value of HOST_<X>_<NAME> for X = A or B (either case).
host_var() {
  local x=${1^^}
  [[ $x == A || $x == B ]] || { echo "host is A or B, not '$1'" >&2; return 2; }
  local name=HOST_${x}_$2
  echo "${!name}"
}

# hosts_supported: says why not and returns 1 unless we can make namespaces: root, `ip netns`
# working (a probe namespace is added and deleted), and the veth driver.
hosts_supported() {
  if ((EUID != 0)); then
    echo "not root: network namespaces need root"
    return 1
  fi
  command -v ip >/dev/null || { echo "no ip command (iproute2)"; return 1; }
  local probe=svh-probe-$$
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "ip netns add fails here (no CAP_SYS_ADMIN, or no network namespaces)"
    return 1
  fi
  if ! ip link add svh-probe netns "$probe" type veth peer name svh-peer netns "$probe" 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    echo "no veth driver"
    return 1
  fi
  ip netns del "$probe"
}

# hosts_down: removes this pair's namespaces (ending the processes still in them; deleting a
# namespace takes its veth end, and so the pair, with it) and state directories. Idempotent.
hosts_down() {
  hosts_names || return
  local ns pids
  for ns in "$HOST_A_NS" "$HOST_B_NS"; do
    [[ -e /run/netns/$ns ]] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [[ -n $pids ]]; then
      # shellcheck disable=SC2086 # one pid per word
      kill -TERM $pids 2>/dev/null
      sleep 0.2
      pids=$(ip netns pids "$ns" 2>/dev/null)
      # shellcheck disable=SC2086
      [[ -z $pids ]] || kill -KILL $pids 2>/dev/null
    fi
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf -- "$hosts_state_root"
  return 0
}

# hosts_sysctl NS KEY=VALUE...: sysctls inside namespace NS.
hosts_sysctl() {
  local ns=$1
  shift
  ip netns exec "$ns" sysctl -qw "$@" >/dev/null
}

# hosts_up: hosts_down first (a leftover of a killed run goes), then both namespaces with lo
# up, the veth pair, the addresses (IPv6 without duplicate address detection, so it can be
# used at once), and the state directories. Returns non-zero, having cleaned up, on failure.
hosts_up() {
  hosts_down
  if ! [[ $HOSTS_MTU =~ ^[0-9]+$ ]] || ((HOSTS_MTU < 1280 || HOSTS_MTU > 65535)); then
    echo "HOSTS_MTU must be 1280..65535 (IPv6 needs 1280), not '$HOSTS_MTU'" >&2
    return 2
  fi
  local x ns
  {
    for x in A B; do
      ns=$(host_var $x NS)
      ip netns add "$ns" || return 1
      ip -n "$ns" link set lo up || return 1
      # No DAD anywhere (link-local included), and static IPv6 addresses kept when the link
      # goes down, so `link X down`/`up` gives back the same GID table.
      hosts_sysctl "$ns" net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
        net.ipv6.conf.all.keep_addr_on_down=1 net.ipv6.conf.default.keep_addr_on_down=1 || return 1
    done
    ip link add "$HOSTS_IF" netns "$HOST_A_NS" mtu "$HOSTS_MTU" type veth \
      peer name "$HOSTS_IF" netns "$HOST_B_NS" mtu "$HOSTS_MTU" || return 1
    for x in A B; do
      ns=$(host_var $x NS)
      ip -n "$ns" addr add "$(host_var $x IP4)/24" dev "$HOSTS_IF" || return 1
      ip -n "$ns" addr add "$(host_var $x IP6)/64" dev "$HOSTS_IF" nodad || return 1
      ip -n "$ns" link set "$HOSTS_IF" up || return 1
      # IPv4 multicast goes out of the veth (as on a host whose default route is its LAN):
      # rdma_cm picks a multicast group's source address from the route (mckey without -b).
      # IPv6 has its ff00::/8 route per interface already.
      ip -n "$ns" route add 224.0.0.0/4 dev "$HOSTS_IF" || return 1
      mkdir -p "$(host_var $x STATE)" && chmod 0700 "$(host_var $x STATE)" || return 1
    done
    hosts_wait_carrier || return 1
  } || { echo "hosts_up failed; removing what was made" >&2; hosts_down; return 1; }
}

# hosts_wait_carrier: both veth ends operationally up; the kernel reports the carrier a
# moment after `link set up`, and a packet sent before that is lost. Gives up after 3 s.
hosts_wait_carrier() {
  local i
  for ((i = 0; i < 60; i++)); do
    [[ $(ip -n "$HOST_A_NS" -br link show "$HOSTS_IF") == *" UP "* &&
      $(ip -n "$HOST_B_NS" -br link show "$HOSTS_IF") == *" UP "* ]] && return 0
    sleep 0.05
  done
  echo "the veth pair has no carrier after 3 s" >&2
  return 1
}

# hosts_exit_cleanup: hosts_up's caller may call this to take the pair down when the script
# exits, however it exits; it keeps pair.sh's cleanup too if that is loaded.
hosts_exit_cleanup() {
  trap 'hosts_down; [[ $(type -t pair_cleanup) != function ]] || pair_cleanup' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# in_host A|B CMD [ARGS...]: runs CMD on that host, with its SOFTVERBS_STATE_DIR.
in_host() {
  local x=${1^^}
  shift
  case $x in
    A) "${HOST_A[@]}" "$@" ;;
    B) "${HOST_B[@]}" "$@" ;;
    *) echo "in_host: host is A or B" >&2; return 2 ;;
  esac
}

# netem_available: this kernel has the netem qdisc (some VM kernels are built without it;
# `drop` below needs only nftables).
netem_available() {
  local probe=svh-netem-$$ ok=1
  ip netns add "$probe" 2>/dev/null || return 1
  ip -n "$probe" link set lo up
  ip netns exec "$probe" tc qdisc replace dev lo root netem delay 1ms 2>/dev/null || ok=0
  ip netns del "$probe"
  ((ok))
}

# netem A|B ARGS...: `tc qdisc replace dev svh0 root netem ARGS` on that host's end (what it
# sends); `netem A clear` removes it (no error if there was none).
netem() {
  local ns
  ns=$(host_var "$1" NS) || return
  shift
  if [[ ${1-} == clear ]]; then
    ip netns exec "$ns" tc qdisc del dev "$HOSTS_IF" root 2>/dev/null
    return 0
  fi
  ip netns exec "$ns" tc qdisc replace dev "$HOSTS_IF" root netem "$@"
}

# drop A|B PERCENT [MATCH...]: drops PERCENT % (1..100) of the packets that host sends on the
# veth, chosen at random, with nftables: works where netem does not. MATCH narrows it with
# nft match words, e.g. `drop A 5 udp dport 4791` for RoCE v2 only. Rules add up;
# `drop A clear` removes them all.
drop() {
  local ns percent
  ns=$(host_var "$1" NS) || return
  percent=${2:?drop A|B PERCENT [MATCH...] | drop A|B clear}
  shift 2
  if [[ $percent == clear ]]; then
    ip netns exec "$ns" nft delete table inet "$hosts_fault_table" 2>/dev/null
    return 0
  fi
  if ! [[ $percent =~ ^[0-9]+$ ]] || ((percent < 1 || percent > 100)); then
    echo "drop: PERCENT is 1..100" >&2
    return 2
  fi
  local chance=()
  ((percent < 100)) && chance=(numgen random mod 100 '<' "$percent")
  ip netns exec "$ns" nft add table inet "$hosts_fault_table" &&
    ip netns exec "$ns" nft add chain inet "$hosts_fault_table" out \
      '{ type filter hook output priority 0; }' &&
    ip netns exec "$ns" nft add rule inet "$hosts_fault_table" out \
      oifname "$HOSTS_IF" "$@" "${chance[@]}" drop
}

# link A|B up|down: that host's veth end up or down (the other end then has no carrier).
link() {
  local ns
  ns=$(host_var "$1" NS) || return
  [[ ${2-} == up || ${2-} == down ]] || { echo "link A|B up|down" >&2; return 2; }
  ip -n "$ns" link set "$HOSTS_IF" "$2"
}

# host_gids SOFTVERBS A|B: that host's GID table as softverbs shows it, one "INDEX GID" line
# per entry, from `ibv_devinfo -v` ("\t\t\tGID[  1]:\t\t::ffff:10.77.1.1, RoCE v2").
host_gids() {
  in_host "$2" "$1" run -- ibv_devinfo -v |
    sed -nE 's/^[[:space:]]*GID\[ *([0-9]+)\]:[[:space:]]+([^,]+), RoCE v2$/\1 \2/p'
}

# gid_index_of SOFTVERBS A|B GID: the index of GID in that host's table; fails if absent.
# The pingpongs take it as -g INDEX, perftest as -x INDEX.
gid_index_of() {
  host_gids "$1" "$2" | awk -v gid="$3" '$2 == gid { print $1; found = 1; exit } END { exit !found }'
}

hosts_names

# ---------------------------------------------------------------- command line
hosts_usage() {
  cat <<EOF
Usage: tests/hosts/netns.sh [--id ID] [--mtu BYTES] COMMAND [ARGS...]   (as root)

Two network namespaces ("hosts" A and B) joined by a veth pair, for softverbs between hosts.

Commands:
  up                    create them (after removing any left from the same ID)
  down                  remove them, their processes and state directories
  status                addresses, qdiscs and fault rules of both, or "down"
  env                   the names and addresses as shell assignments (for eval)
  list                  every softverbs host pair on this machine (svh-* namespaces)
  in_host A|B CMD...    run CMD on host A or B with its SOFTVERBS_STATE_DIR
  netem A|B ARGS...     tc netem on that host's sending side (ARGS e.g. "delay 1ms loss 1%");
                        "netem A clear" removes it. Needs a kernel with sch_netem.
  drop A|B PERCENT [MATCH...]
                        drop PERCENT % of what the host sends (nftables), e.g.
                        "drop A 5 udp dport 4791"; "drop A clear" removes the rules
  link A|B up|down      that host's veth end up or down

ID: --id or \$HOSTS_ID (now $HOSTS_ID). Host A is $HOST_A_IP4 / $HOST_A_IP6 in namespace
$HOST_A_NS, B is $HOST_B_IP4 / $HOST_B_IP6 in $HOST_B_NS; MTU --mtu or \$HOSTS_MTU
(now $HOSTS_MTU).
EOF
}

hosts_status() {
  local x ns
  for x in A B; do
    ns=$(host_var $x NS)
    if [[ ! -e /run/netns/$ns ]]; then
      echo "host $x ($ns): down"
      continue
    fi
    echo "host $x ($ns), SOFTVERBS_STATE_DIR=$(host_var $x STATE)"
    ip -n "$ns" -br addr show
    ip netns exec "$ns" tc qdisc show dev "$HOSTS_IF" | sed 's/^/  qdisc: /'
    ip netns exec "$ns" nft list table inet "$hosts_fault_table" 2>/dev/null | grep -E ' drop$' |
      sed 's/^[[:space:]]*/  fault: /'
  done
  return 0
}

hosts_main() {
  while (($# > 0)); do
    case $1 in
      --id) HOSTS_ID=${2:?--id ID}; shift 2 ;;
      --mtu) HOSTS_MTU=${2:?--mtu BYTES}; shift 2 ;;
      *) break ;;
    esac
  done
  hosts_names || exit 2
  local command=${1:-help}
  (($# > 0)) && shift
  case $command in
    up) hosts_supported || exit 1; hosts_up && hosts_status ;;
    down) hosts_down ;;
    status) hosts_status ;;
    env)
      local name
      for name in HOSTS_ID HOSTS_IF HOSTS_MTU HOST_A_NS HOST_B_NS HOST_A_STATE HOST_B_STATE \
        HOST_A_IP4 HOST_B_IP4 HOST_A_IP6 HOST_B_IP6 HOST_A_GID4 HOST_B_GID4; do
        printf '%s=%q\n' "$name" "${!name}"
      done ;;
    list) ip netns list | awk '$1 ~ /^svh-/ { print $1 }' ;;
    in_host | netem | drop | link) "$command" "$@" ;;
    help | -h | --help) hosts_usage ;;
    *) hosts_usage >&2; exit 2 ;;
  esac
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -uo pipefail
  hosts_main "$@"
fi
