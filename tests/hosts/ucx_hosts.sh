#!/usr/bin/env bash
# UCX's ucx_perftest between the two hosts of netns.sh: server on host A, client on host B
# given A's veth IPv4 address, each under `softverbs run` with UCX_TLS=TLS. Exits 77
# (skipped) without root or without ucx-utils.
#   ucx_hosts.sh SOFTVERBS PORT LIMIT TLS TEST ITERS
# One UCX setting besides UCX_TLS: UCX_IB_GID_INDEX, the index of the host's veth
# ::ffff:a.b.c.d (1 here, read from `ibv_devinfo -v`). UCX picks the first IPv4 GID that
# ibv_create_ah accepts (uct_ib_device_select_gid), and softverbs lists ::ffff:127.0.0.1
# first: right on one host, useless to the other (docs/ucx.md). An nftables counter on A
# shows that RoCE v2 crossed the veth.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/../interop/ucx_lib.sh"
source "$(dirname "$0")/netns.sh"

(($# == 5)) || { echo "usage: $0 SOFTVERBS PORT LIMIT TLS TEST ITERS"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 tls=$3 test=$4 iters=$5
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
ucx_require
pair_setup "$base_port"
hosts_exit_cleanup # after pair_setup: keeps its cleanup too
hosts_up || exit 1
listening() { [[ -n $(in_host A ss -Hltn "sport = :$1") ]]; }

a_index=$(gid_index_of "$SOFTVERBS" A "$HOST_A_GID4")
b_index=$(gid_index_of "$SOFTVERBS" B "$HOST_B_GID4")
echo "GID index of the veth address: A $a_index ($HOST_A_GID4), B $b_index ($HOST_B_GID4)"
[[ -n $a_index && -n $b_index ]] || { echo "FAIL: a veth address is missing from the GID table"; exit 1; }
in_host A nft -f - <<NFT || { echo "FAIL: nft"; exit 1; }
table inet svh_ucx {
  chain in { type filter hook input priority 0; iifname "$HOSTS_IF" udp dport 4791 counter; }
}
NFT

server=("${HOST_A[@]}" "UCX_TLS=$tls" "UCX_IB_GID_INDEX=$a_index" "$SOFTVERBS" run --
  ucx_perftest -p "$port")
client=("${HOST_B[@]}" "UCX_TLS=$tls" "UCX_IB_GID_INDEX=$b_index" "$SOFTVERBS" run --
  ucx_perftest "$HOST_A_IP4" -p "$port" -t "$test" -n "$iters")
pair_run
ucx_perftest_checks "$test" "$iters"
roce=$(in_host A nft list table inet svh_ucx | sed -nE 's/.*counter packets ([0-9]+) .*/\1/p')
echo "host A received ${roce:-?} RoCE v2 frames on its veth"
check "RoCE v2 crossed the veth" '[[ $roce =~ ^[0-9]+$ ]] && ((roce > 0))'
finish
