#!/usr/bin/env bash
# ibv_asyncwatch opens the device and blocks waiting for async events until killed.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"

run timeout 3 "$SOFTVERBS" run -- ibv_asyncwatch
check "still waiting after 3 s (killed by timeout: exit 124)" '((rc == 124))'
check "no crash, no sanitizer report" no_crash
check "nothing on stderr" '[[ -z $err ]]'
check "names the device and its async fd" \
  "stdout_has '^softverbs0: async event FD [0-9]+\$'"
finish
