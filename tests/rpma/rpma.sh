#!/usr/bin/env bash
# Debian's librpma (librpma0) over softverbs: our rpma_pair program, built against librpma.h,
# as server and client on 127.0.0.1, each under `softverbs run`. rpma_pair checks every step
# itself and prints a "PASS <side>: ..." line for each; here we check the exit codes and that
# the key steps were reported on both sides.
#   rpma.sh SOFTVERBS PORT LIMIT RPMA_PAIR [both|plain|shared]
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"

(($# == 3 || $# == 4)) || { echo "usage: $0 SOFTVERBS PORT LIMIT RPMA_PAIR [both|plain|shared]"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 prog=$3 mode=${4:-both}
pair_setup "$base_port"
# The server listens through rdma_cm (rpma_ep_listen).
PAIR_READY=cm-tcp
# rpma_pair's own watchdog, below the pair's limits, so that a hang is reported by rpma_pair.
export RPMA_PAIR_TIMEOUT=$((PAIR_TIMEOUT > 5 ? PAIR_TIMEOUT - 2 : PAIR_TIMEOUT))
server=("$SOFTVERBS" run -- "$prog" server 127.0.0.1 "$port" "$mode")
client=("$SOFTVERBS" run -- "$prog" client 127.0.0.1 "$port" "$mode")
pair_run

check "server exited 0" '((srv_rc == 0))'
check "client exited 0" '((cli_rc == 0))'
check "no FAIL line on either side" "! side_has srv '^FAIL' && ! side_has cli '^FAIL'"
for s in srv cli; do
  check "$s: librpma found the softverbs device" \
    "side_has $s '^PASS [a-z]+: rpma_utils_get_ibv_context\\(.*\\): device softverbs'"
  check "$s: rpma_peer_new and rpma_mr_reg" \
    "side_has $s '^PASS [a-z]+: rpma_peer_new\$' && side_has $s '^PASS [a-z]+: rpma_mr_reg '"
  check "$s: rpma_mr_dereg and rpma_peer_delete" \
    "side_has $s '^PASS [a-z]+: rpma_mr_dereg\$' && side_has $s '^PASS [a-z]+: rpma_peer_delete\$'"
done
check "server: rpma_ep_listen and rpma_ep_shutdown" \
  "side_has srv '^PASS server: rpma_ep_listen on ' && side_has srv '^PASS server: rpma_ep_shutdown\$'"

if [[ $mode == both || $mode == plain ]]; then
  for s in srv cli; do
    check "$s [plain]: connection established" "side_has $s '^PASS [a-z]+: \\[plain\\] connection established'"
    check "$s [plain]: MR descriptor from the peer's private data" \
      "side_has $s '^PASS [a-z]+: MR descriptor from the (client|server).s private data'"
    check "$s [plain]: rpma_send completion" "side_has $s '^PASS [a-z]+: \\[plain\\] rpma_send .*wc opcode 0, status SUCCESS'"
    check "$s [plain]: rpma_recv completion" "side_has $s '^PASS [a-z]+: \\[plain\\] rpma_recv .*wc opcode 128, status SUCCESS, byte_len 24'"
    check "$s [plain]: rpma_cq_wait used" "side_has $s '^PASS [a-z]+: \\[plain\\] rpma_cq_wait returned 0 [1-9][0-9]* time'"
    check "$s [plain]: RPMA_CONN_CLOSED" "side_has $s '^PASS [a-z]+: \\[plain\\] RPMA_CONN_CLOSED'"
    check "$s [plain]: rpma_conn_disconnect" "side_has $s '^PASS [a-z]+: \\[plain\\] rpma_conn_disconnect\$'"
  done
  check "client [plain]: rpma_read of the server's memory" \
    "side_has cli '^PASS client: \\[plain\\] rpma_read brought the server.s 256-byte pattern'"
  check "client [plain]: rpma_write, read back" \
    "side_has cli '^PASS client: \\[plain\\] rpma_write then rpma_read: the server.s memory holds our 256 bytes'"
  check "server [plain]: the client's write landed" \
    "side_has srv '^PASS server: \\[plain\\] the client.s rpma_write of 256 bytes is in the server.s memory'"
  check "server [plain]: rpma_read of the client's memory" \
    "side_has srv '^PASS server: \\[plain\\] rpma_read brought the client.s 256-byte pattern'"
fi

if [[ $mode == both || $mode == shared ]]; then
  for s in srv cli; do
    check "$s [shared]: connection established" "side_has $s '^PASS [a-z]+: \\[shared\\] connection established'"
    check "$s [shared]: rpma_cq_wait returns RPMA_E_SHARED_CHANNEL" \
      "side_has $s '^PASS [a-z]+: shared completion channel .*rpma_cq_wait on the CQ and on the RCQ returns RPMA_E_SHARED_CHANNEL'"
    check "$s [shared]: rpma_recv completion on the receive CQ" \
      "side_has $s '^PASS [a-z]+: \\[shared\\] rpma_recv .*wc opcode 128, status SUCCESS, byte_len 33, on the receive CQ'"
    check "$s [shared]: rpma_conn_wait used, also for the receive CQ" \
      "side_has $s '^PASS [a-z]+: \\[shared\\] rpma_conn_wait returned 0 [1-9][0-9]* time\\(s\\), [1-9][0-9]* for the receive CQ'"
    check "$s [shared]: RPMA_CONN_CLOSED" "side_has $s '^PASS [a-z]+: \\[shared\\] RPMA_CONN_CLOSED'"
  done
  check "client [shared]: rpma_write, read back" \
    "side_has cli '^PASS client: \\[shared\\] rpma_write then rpma_read: the server.s memory holds our 256 bytes'"
fi

check "both sides finished" "side_has srv '^PASS server: server done\$' && side_has cli '^PASS client: client done\$'"
check "no crash, no sanitizer report" pair_no_crash
finish
