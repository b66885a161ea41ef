#!/usr/bin/env bash
# ibv_devices lists the soft device with a non-zero 64-bit node GUID.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"

run "$SOFTVERBS" run -- ibv_devices
check "exits 0" '((rc == 0))'
check "no crash, no sanitizer report" no_crash
check "nothing on stderr" '[[ -z $err ]]'
check "lists softverbs0 with a 16-hex-digit GUID" \
  "stdout_has '^[[:space:]]*softverbs0[[:space:]]+[0-9a-f]{16}\$'"
guid=$(awk '$1 == "softverbs0" { print $2 }' <<<"$out")
check "the GUID is not zero" '[[ -n $guid && ! $guid =~ ^0+$ ]]'
finish
