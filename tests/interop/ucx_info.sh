#!/usr/bin/env bash
# UCX (Debian's ucx-utils 1.13) sees softverbs0: `softverbs run -- ucx_info -d` lists the
# rc_verbs and ud_verbs transports on softverbs0:1, and with --no-dev-node (no
# /dev/infiniband/uverbs-softverbs0, docs/ucx.md) nothing of softverbs0 at all: the node is
# what UCX needs. Exits 77 (skipped) without ucx-utils.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/ucx_lib.sh"
ucx_require

# transports_on DEVICE: the transports ucx_info -d printed for DEVICE, one a line. It prints
# "#      Transport: NAME" followed by "#         Device: DEVICE".
transports_on() {
  awk -v dev="$1" '/^# +Transport: / { tl = $3 } /^# +Device: / && $3 == dev { print tl }' <<<"$out"
}

run "$SOFTVERBS" run -- ucx_info -d
check "ucx_info -d exits 0" '((rc == 0))'
check "softverbs0 is a memory domain" 'stdout_has "^# +Memory domain: softverbs0$"'
check "rc_verbs on softverbs0:1" 'transports_on softverbs0:1 | grep -qx rc_verbs'
check "ud_verbs on softverbs0:1" 'transports_on softverbs0:1 | grep -qx ud_verbs'
check "UCX printed no warning or error" '! grep -Eq "UCX +(WARN|ERROR)" <<<"$out$err"'
check "no crash, no sanitizer report" no_crash

if [[ -c /dev/infiniband/uverbs-softverbs0 ]]; then
  echo "this host has /dev/infiniband/uverbs-softverbs0 itself: --no-dev-node changes nothing here"
else
  run "$SOFTVERBS" run --no-dev-node -- ucx_info -d
  check "--no-dev-node: ucx_info -d exits 0" '((rc == 0))'
  check "--no-dev-node: no softverbs0 in ucx_info -d" '! stdout_has softverbs0'
fi
finish
