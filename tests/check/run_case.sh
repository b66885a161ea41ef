#!/usr/bin/env bash
# One case of mistakes.c under SOFTVERBS_CHECK=1: it must pass (it recovers from its own
# mistake) and its reports, with what changes from run to run masked (normalise.sed), must be
# expected/CASE.txt exactly. SOFTVERBS_CHECK_UPDATE=1 writes the file instead.
# usage: run_case.sh SOFTVERBS MISTAKES CASE EXPECTED_DIR
set -u
softverbs=$1 prog=$2 name=$3 expected=$4/$3.txt
here=$(dirname -- "$(readlink -f -- "$0")")
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
SOFTVERBS_CHECK=1 SOFTVERBS_CHECK_FILE=$tmp/report timeout 40 "$softverbs" run -- "$prog" "$name" \
  >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
if [[ $rc -ne 0 ]] || ! grep -qx "PASS $name" "$tmp/out"; then
  echo "FAIL: $prog $name exited $rc"
  exit 1
fi
sed -E -f "$here/normalise.sed" "$tmp/report" >"$tmp/got"
echo "---- reports (normalised)"
cat "$tmp/got"
if [[ ${SOFTVERBS_CHECK_UPDATE-} = 1 ]]; then
  cp -- "$tmp/got" "$expected"
  exit 0
fi
if ! diff -u -- "$expected" "$tmp/got"; then
  echo "FAIL: the reports differ from $expected"
  exit 1
fi
echo "PASS check.$name"
