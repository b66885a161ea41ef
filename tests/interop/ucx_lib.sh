# Helpers for the UCX tests (ucx_info.sh, ucx_perftest.sh, ../hosts/ucx_hosts.sh); sourced
# after lib.sh and pair.sh.
# shellcheck shell=bash
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later

# ucx_require: exits 77 (skipped) where Debian's ucx-utils is not installed.
ucx_require() {
  local tool
  for tool in ucx_info ucx_perftest; do
    command -v "$tool" >/dev/null || { echo "skipped: no $tool (apt-get install ucx-utils)"; exit 77; }
  done
}

# ucx_perftest_checks TEST ITERS: what a good ucx_perftest pair printed. The client reports
# a "Final:" line for ITERS iterations; neither side printed a UCX warning or error (UD's
# "RoCE packet does not contain GRH", a failed address resolution, a timeout).
ucx_perftest_checks() {
  local test=$1 iters=$2 side name
  for side in srv cli; do
    name=$([[ $side == srv ]] && echo server || echo client)
    check "$name exited 0" "((${side}_rc == 0))"
    check "$name printed no UCX warning or error" "! side_has $side 'UCX +(WARN|ERROR)'"
  done
  check "server accepted the client" "side_has srv '^Accepted connection from '"
  check "client ran $test: a Final line for $iters iterations" \
    "side_has cli '^Final: +$iters +[0-9]'"
  check "no crash, no sanitizer report" pair_no_crash
}
