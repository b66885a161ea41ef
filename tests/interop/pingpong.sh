#!/usr/bin/env bash
# Debian's ibv_{rc,uc,ud,srq}_pingpong, server and client as two processes on 127.0.0.1.
#   pingpong.sh SOFTVERBS PORT LIMIT PROG [OPTIONS...]
# LIMIT: the seconds each side may run (pair.sh).
# Both sides get `-d softverbs0 -g INDEX -p PORT OPTIONS`. RoCE needs -g: without it the
# pingpongs send a zero GID and an AH without GRH. INDEX is 0 (the first interface IPv4 address,
# or ::ffff:127.0.0.1 with only lo up: any GID of this host takes the shared-memory path), or
# with PINGPONG_GID=loopback the index of ::ffff:127.0.0.1, as a user who names it would pass.
# OPTIONS must include -n ITERS, which the checks compare against; with -c the server also
# compares the payload it received with what the client wrote ("invalid data in page N").
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"

gid_index=0
[[ ${PINGPONG_GID-} == loopback ]] && gid_index=$(host_gid_index ::ffff:127.0.0.1)
gid=$(regex_quote "$(host_gid "$gid_index")")
echo "GID $gid_index: $gid"
pair_program -d softverbs0 -g "$gid_index" -- "$@"

# The formats of rdma-core 44's examples; ibv_ud_pingpong prints "PSN 0x...: GID" for itself.
for side in srv cli; do
  name=$([[ $side == srv ]] && echo server || echo client)
  check "$name exited 0" "((${side}_rc == 0))"
  check "$name's local address carries GID $gid_index" \
    "side_has $side '^  local address:  LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID $gid\$'"
  check "$name learnt the peer's address" \
    "side_has $side '^  remote address: LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID $gid\$'"
  check "$name reports the bandwidth" \
    "side_has $side '^[0-9]+ bytes in [0-9]+\\.[0-9]{2} seconds = [0-9]+\\.[0-9]{2} Mbit/sec\$'"
  check "$name reports $iters iterations" \
    "side_has $side '^$iters iters in [0-9]+\\.[0-9]{2} seconds = [0-9]+\\.[0-9]{2} usec/iter\$'"
  check "$name saw no corrupted payload" "! side_has $side 'invalid data'"
done
check_timestamps "${args[@]}"
check "server and client QPs have different numbers" distinct_qpns
check "no crash, no sanitizer report" pair_no_crash
finish
