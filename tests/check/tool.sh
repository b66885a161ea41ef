#!/usr/bin/env bash
# `softverbs check -- CMD` (tools/softverbs.in): reports go to stderr by default, to the file
# of -o (with "%p" as the pid), and --stack adds the caller's backtrace.
#   tool.sh SOFTVERBS MISTAKES
set -u
softverbs=$1 prog=$2
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
failed=0
expect() {  # expect WHAT FILE PATTERN
  if grep -qE -- "$3" "$2"; then echo "ok: $1"; else echo "FAIL: $1"; cat "$2"; failed=1; fi
}
timeout 30 "$softverbs" check -- "$prog" post_state >"$tmp/out" 2>"$tmp/err"
expect "exit 0 and PASS" "$tmp/out" '^PASS post_state$'
expect "the report on stderr" "$tmp/err" '^softverbs check: \[post-send-state\] ibv_post_send: QP 0x[0-9a-f]+ wr_id 8 at mistake_post_state\+0x[0-9a-f]+ \(mistakes\)$'
expect "the summary on stderr" "$tmp/err" '^  post-send-state +1  mistake_post_state'
timeout 30 "$softverbs" check --stack -o "$tmp/report.%p" -- "$prog" post_state >"$tmp/out2" 2>"$tmp/err2"
shopt -s nullglob
files=("$tmp"/report.*)
if ((${#files[@]} == 1)); then
  expect "-o: the report in the file" "${files[0]}" '^softverbs check: \[post-recv-state\]'
  expect "--stack: a backtrace naming main" "${files[0]}" '^    #[0-9]+ main\+0x[0-9a-f]+ \(mistakes\)$'
else
  echo "FAIL: -o wrote ${#files[@]} files"; failed=1
fi
if grep -q 'softverbs check' "$tmp/err2"; then echo "FAIL: -o still wrote to stderr"; failed=1; fi
timeout 30 "$softverbs" check -- "$prog" correct >/dev/null 2>"$tmp/err3"
expect "a correct program: no misuse" "$tmp/err3" '^softverbs check: pid [0-9]+: no misuse found \([0-9]+ verbs calls checked\)$'
((failed)) && exit 1
echo "PASS check.tool"
