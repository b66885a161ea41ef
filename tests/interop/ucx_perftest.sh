#!/usr/bin/env bash
# UCX's ucx_perftest (Debian's ucx-utils 1.13) on softverbs0: server and client as two
# processes on 127.0.0.1, each under `softverbs run`, with UCX_TLS=TLS and no other UCX
# setting. Exits 77 (skipped) without ucx-utils.
#   ucx_perftest.sh SOFTVERBS PORT LIMIT TLS TEST ITERS [unprivileged|sleep]
# TEST: tag_lat, tag_bw, ucp_put_bw, ucp_get, ... (ucx_perftest -t). LIMIT: the seconds each
# side may run (pair.sh). "unprivileged": both sides run as user nobody (as root, through
# setpriv), so `softverbs run` gives each its own user and mount namespace; skipped where
# that cannot be (not root, the build tree closed to nobody, no user namespaces).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"
source "$(dirname "$0")/ucx_lib.sh"

(($# == 5 || $# == 6)) || { echo "usage: $0 SOFTVERBS PORT LIMIT TLS TEST ITERS [unprivileged|sleep]"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 tls=$3 test=$4 iters=$5 mode=${6-}
ucx_require

as=()
if [[ $mode == unprivileged ]]; then
  ((EUID == 0)) || { echo "skipped: not root, cannot become nobody"; exit 77; }
  as=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
  "${as[@]}" "$SOFTVERBS" version >/dev/null 2>&1 ||
    { echo "skipped: user nobody cannot run $SOFTVERBS (the build tree is closed to it)"; exit 77; }
  "${as[@]}" unshare -Urm true 2>/dev/null ||
    { echo "skipped: user nobody may not make a user namespace here"; exit 77; }
fi

pair_setup "$base_port"
[[ $mode == unprivileged ]] && chown nobody:nogroup "$SOFTVERBS_STATE_DIR"
server=(env "UCX_TLS=$tls" "${as[@]}" "$SOFTVERBS" run -- ucx_perftest -p "$port")
client=(env "UCX_TLS=$tls" "${as[@]}" "$SOFTVERBS" run -- ucx_perftest 127.0.0.1 -p "$port"
  -t "$test" -n "$iters")
if [[ $mode == sleep ]]; then client+=(-E sleep); fi
pair_run
ucx_perftest_checks "$test" "$iters"
finish
