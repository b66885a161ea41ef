#!/usr/bin/env bash
# ibv_devinfo -v shows one RoCE v2-style port, active at MTU 4096, with sane device limits.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"

run "$SOFTVERBS" run -- ibv_devinfo -v
check "exits 0" '((rc == 0))'
check "no crash, no sanitizer report" no_crash
check "nothing on stderr" '[[ -z $err ]]'
check "hca_id softverbs0" '[[ $(field hca_id) == softverbs0 ]]'
check "transport InfiniBand (0)" '[[ $(field transport) == "InfiniBand (0)" ]]'
check "vendor_id is set and not Mellanox (0x02c9) or Amazon (0x1d0f)" \
  '[[ $(field vendor_id) =~ ^0x[0-9a-f]{4}$ && ! $(field vendor_id) =~ ^0x(02c9|1d0f)$ ]]'
check "phys_port_cnt 1" '[[ $(field phys_port_cnt) == 1 ]]'
for limit in max_mr_size max_qp max_qp_wr max_sge max_cqe; do
  check "$limit is non-zero" "nonzero $limit"
done
check "max_qp_rd_atom >= 1" 'at_least max_qp_rd_atom 1'
check "num_comp_vectors >= 1" 'at_least num_comp_vectors 1'
check "port 1 is listed" '[[ $(field port) == 1 ]]'
check "port state PORT_ACTIVE (4)" '[[ $(field state) == "PORT_ACTIVE (4)" ]]'
check "max_mtu 4096 (5)" '[[ $(field max_mtu) == "4096 (5)" ]]'
check "active_mtu 4096 (5)" '[[ $(field active_mtu) == "4096 (5)" ]]'
check "link_layer Ethernet" '[[ $(field link_layer) == Ethernet ]]'
check "a RoCE v2 GID for 127.0.0.1" \
  "stdout_has '^[[:space:]]*GID\\[ *[0-9]+\\]:[[:space:]]+::ffff:127\\.0\\.0\\.1, RoCE v2\$'"
finish
