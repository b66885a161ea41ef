#!/usr/bin/env bash
# No false positives: Debian's unmodified tools (and rpma_pair on Debian's librpma) run their
# interop tests with SOFTVERBS_CHECK=1, each process writing its reports to a file of its own;
# any report fails the test, and so does a process that wrote nothing (the checker was off).
#   interop_clean.sh SOFTVERBS INTEROP_DIR BASE_PORT [RPMA_PAIR]
set -u
softverbs=$1 interop=$2 port=$3 rpma_pair=${4-}
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
export SOFTVERBS_CHECK=1

cases=(
  "pingpong ibv_rc_pingpong -n 200 -c"
  "pingpong ibv_rc_pingpong -n 200 -c -e"
  # The extended API: -N posts through ibv_wr_*, -t polls an ibv_cq_ex through ibv_start_poll.
  "pingpong ibv_rc_pingpong -n 200 -c -N"
  "pingpong ibv_rc_pingpong -n 200 -c -N -e"
  "pingpong ibv_rc_pingpong -n 200 -c -t"
  "pingpong ibv_rc_pingpong -n 200 -c -N -t -e"
  "pingpong ibv_ud_pingpong -n 200 -c"
  "pingpong ibv_ud_pingpong -n 200 -c -e"
  "pingpong ibv_srq_pingpong -n 200 -c"
  "pingpong ibv_srq_pingpong -n 200 -c -e"
  "perftest ib_send_lat -n 200"
  "perftest ib_send_lat -n 200 -e"
  "perftest ib_write_bw -n 200"
  "perftest ib_send_bw -n 200 -e"
  "perftest ib_write_lat -n 200"
  "perftest ib_read_lat -n 200"
  # A true report: perftest's ib_atomic_lat server returns from main() without destroying
  # its PD, MR, CQ and QP (atomic_lat.c, "Only Client post read request"); that one leak
  # report is expected, nothing else.
  "perftest ib_atomic_lat -n 200 |leak"
  "cm rping"
)
failed=0
n=0
allow=  # the one report kind a case expects (see the cases), or empty
run_case() {
  local dir=$1 script=$2
  shift 2
  n=$((n + 1))
  local reports=$tmp/$n
  mkdir -p "$reports"
  echo "==== $script $*"
  if ! SOFTVERBS_CHECK_FILE=$reports/check.%p bash "$dir/$script.sh" "$softverbs" "$((port + n))" 30 "$@" \
    >"$tmp/log.$n" 2>&1; then
    tail -20 "$tmp/log.$n"
    echo "FAIL: $script $* failed by itself"
    failed=1
    return
  fi
  local files
  files=$(find "$reports" -type f | wc -l)
  if ((files < 2)); then
    echo "FAIL: $script $*: $files process(es) checked, expected both sides"
    failed=1
  fi
  local kinds
  kinds=$(grep -h '^softverbs check: \[' "$reports"/* 2>/dev/null | sed -E 's/^softverbs check: \[([a-z-]+)\].*/\1/' | sort | tr '\n' ' ')
  if [[ -n $allow ]]; then
    if [[ $kinds != "$allow " ]]; then
      cat "$reports"/*
      echo "FAIL: $script $*: expected exactly one [$allow] report, got: ${kinds:-none}"
      failed=1
    else
      echo "the expected [$allow] report"
    fi
  elif [[ -n $kinds ]]; then
    cat "$reports"/*
    echo "FAIL: $script $*: reports on a correct program"
    failed=1
  else
    grep -h 'no misuse found' "$reports"/*
  fi
}
for c in "${cases[@]}"; do
  allow=
  [[ $c == *'|'* ]] && allow=${c#*|} c=${c%|*}
  read -ra words <<<"$c"
  run_case "$interop" "${words[@]}"
done
# librpma: rpma_pair (tests/rpma), when built.
[[ -n $rpma_pair && -x $rpma_pair ]] && run_case "$interop/../rpma" rpma "$rpma_pair" plain
if ((failed)); then
  echo "FAIL check.interop_clean"
  exit 1
fi
echo "PASS check.interop_clean ($n runs)"
