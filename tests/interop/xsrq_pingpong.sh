#!/usr/bin/env bash
# Debian's ibv_xsrq_pingpong (XRC: an XRC domain on /tmp/xrc_domain, XRC SRQs, a send (INI)
# and a receive (TGT) QP per client), server and client as two processes on 127.0.0.1.
#   xsrq_pingpong.sh SOFTVERBS PORT LIMIT [OPTIONS...]
# Both sides get `-d softverbs0 -g 0 -p PORT OPTIONS` (GID 0: the first interface IPv4 address,
# or ::ffff:127.0.0.1 with only lo up); OPTIONS must include -n ITERS. Both
# open the domain on the same file, so they share one XRC domain (ibv_open_xrcd(3)).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"

base_port=$1 limit=$2
shift 2
pair_program -d softverbs0 -g 0 -- "$base_port" "$limit" ibv_xsrq_pingpong "$@"

gid=$(regex_quote "$(host_gid 0)")
addr="LID 0000, QPN RECV [0-9a-f]{6} SEND [0-9a-f]{6}, PSN [0-9a-f]{6}, SRQN [0-9a-f]{6}, GID $gid"
for side in srv cli; do
  name=$([[ $side == srv ]] && echo server || echo client)
  check "$name exited 0" "((${side}_rc == 0))"
  check "$name printed its own address (QPNs, SRQ number, GID 0)" "side_has $side '^ +local: $addr\$'"
  check "$name learnt the peer's address" "side_has $side '^ +remote: $addr\$'"
  check "$name reports success" "side_has $side '^success\$'"
done
check "the two sides' XRC SRQs have different numbers" \
  '[[ $(grep -Eo "local: .*SRQN [0-9a-f]+" <<<"$srv_out" | grep -Eo "[0-9a-f]+\$") != $(grep -Eo "local: .*SRQN [0-9a-f]+" <<<"$cli_out" | grep -Eo "[0-9a-f]+\$") ]]'
check "no crash, no sanitizer report" pair_no_crash
finish
