#!/usr/bin/env bash
# UCX's ucx_perftest between the two hosts of netns.sh: server on host A, client on host B
# given A's veth IPv4 address, each under `softverbs run` with UCX_TLS=TLS. Exits 77
# (skipped) without root or without ucx-utils.
#   ucx_hosts.sh SOFTVERBS PORT LIMIT TLS TEST ITERS [sleep]
# sleep: the client runs with -E sleep (UCX's event-driven progress: it arms its CQs and
# sleeps in its own poll on the channel fds, docs/ucx.md).
# No UCX setting besides UCX_TLS (any UCX_* of the caller's environment is dropped). UCX picks
# the first IPv4 GID that ibv_create_ah accepts (uct_ib_device_select_gid); softverbs lists
# the interfaces' IPv4 addresses before ::ffff:127.0.0.1, as a NIC lists its netdev's, so
# that is the veth's (docs/ucx.md, section 6). An nftables counter on A shows that RoCE v2
# crossed the veth.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/../interop/ucx_lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 5 || $# == 6)) || { echo "usage: $0 SOFTVERBS PORT LIMIT TLS TEST ITERS [sleep]"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 tls=$3 test=$4 iters=$5 mode=${6-}
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
ucx_require
pair_setup "$base_port"
hosts_exit_cleanup # after pair_setup: keeps its cleanup too
hosts_up || exit 1
listening() { [[ -n $(in_host A ss -Hltn "sport = :$1") ]]; }

unset "${!UCX_@}"
echo "GID 0: A $(host_gids "$SOFTVERBS" A | awk '$1 == 0 { print $2 }')," \
  "B $(host_gids "$SOFTVERBS" B | awk '$1 == 0 { print $2 }') (UCX's choice; no UCX_IB_GID_INDEX)"
in_host A nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table inet svh_ucx {
  chain in { type filter hook input priority 0; iifname "$HOSTS_IF" udp dport 4791 counter; }
}
NFT

server=("${HOST_A[@]}" "UCX_TLS=$tls" "$SOFTVERBS" run -- ucx_perftest -p "$port")
client=("${HOST_B[@]}" "UCX_TLS=$tls" "$SOFTVERBS" run --
  ucx_perftest "$HOST_A_IP4" -p "$port" -t "$test" -n "$iters")
if [[ $mode == sleep ]]; then client+=(-E sleep); fi
pair_run
ucx_perftest_checks "$test" "$iters"
roce=$(in_host A nft list table inet svh_ucx | sed -nE 's/.*counter packets ([0-9]+) .*/\1/p')
echo "host A received ${roce:-?} RoCE v2 frames on its veth"
check "RoCE v2 crossed the veth" '[[ $roce =~ ^[0-9]+$ ]] && ((roce > 0))'
finish
