#!/usr/bin/env bash
# Kill one side of an unmodified, connected ibv_rc_pingpong pair with SIGKILL at a random
# moment of its traffic; the survivor must neither hang nor crash: its QP goes to the error
# state (the peer's death is seen through its pidfd: IBV_EVENT_QP_FATAL, outstanding work
# flushed, or retries run out), so it reports a failed completion and exits on its own.
# The failed completion must say why as IBA does: IBV_WC_WR_FLUSH_ERR (flushed) or
# IBV_WC_RETRY_EXC_ERR (retries ran out), printed by ibv_wc_status_str.
# Usage: peer_death.sh SOFTVERBS [ROUNDS] [BASE_PORT]
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
rounds=${1:-10}
port=${2:-19100}

SOFTVERBS_STATE_DIR=$(mktemp -d)
export SOFTVERBS_STATE_DIR
logs=$(mktemp -d)
trap 'rm -rf "$SOFTVERBS_STATE_DIR" "$logs"' EXIT

hung=0 crashed=0 silent=0 skipped=0 unexplained=0
why='Failed status (Work Request Flushed Error|transport retry counter exceeded) \((5|12)\)'
for ((i = 0; i < rounds; i++)); do
  victim=$((RANDOM % 2))          # 0: server dies, 1: client dies
  events=$( ((RANDOM % 2)) && printf '%s' -e)
  delay=$(printf '0.%02d' $((RANDOM % 60)))
  p=$((port + i % 50))
  args=(ibv_rc_pingpong -g 0 -n 100000000 -p "$p" $events)
  timeout 20 "$SOFTVERBS" run -- stdbuf -oL "${args[@]}" >"$logs/server" 2>&1 &
  server=$!
  sleep 0.3
  timeout 20 "$SOFTVERBS" run -- stdbuf -oL "${args[@]}" 127.0.0.1 >"$logs/client" 2>&1 &
  client=$!
  # Kill only once both are connected: before that the survivor waits in the pingpong's own
  # TCP exchange, outside verbs, as it would on real hardware.
  connected=0
  for _ in $(seq 200); do
    grep -q 'remote address' "$logs/server" && grep -q 'remote address' "$logs/client" &&
      connected=1 && break
    sleep 0.05
  done
  if ((!connected)); then  # a slow machine: not what this test is about, try again
    echo "skip   round $i: the pair did not connect within 10 s"
    pkill -KILL -P "$server"; pkill -KILL -P "$client"
    { wait "$server"; wait "$client"; } 2>/dev/null
    skipped=$((skipped + 1))
    continue
  fi
  sleep "$delay"
  if ((victim == 0)); then dead=$server survivor=$client log=$logs/client
  else dead=$client survivor=$server log=$logs/server; fi
  # `timeout` runs the program as its child: kill the program itself.
  pkill -KILL -P "$dead" 2>/dev/null || kill -KILL "$dead" 2>/dev/null
  # Give the survivor 15 s (its own timeout is 20 s); if it is still there, show where.
  for _ in $(seq 150); do kill -0 "$survivor" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$survivor" 2>/dev/null && command -v gdb >/dev/null; then
    echo "survivor still running after 15 s; its threads:"
    gdb -p "$(pgrep -P "$survivor" | head -1)" -batch -ex 'thread apply all bt 20' 2>/dev/null |
      grep -E '^(#|Thread)'
  fi
  wait "$survivor"
  rc=$?
  { wait "$dead"; } 2>/dev/null
  what="round $i: $([[ $victim == 0 ]] && echo server || echo client) killed after ${delay}s ${events:-(polling)}"
  if ((rc == 124)); then
    hung=$((hung + 1)); echo "HUNG   $what"; cat "$log"
  elif ((rc >= 128)) || grep -Eq 'Sanitizer|runtime error|Segmentation' "$log"; then
    crashed=$((crashed + 1)); echo "CRASH  $what (exit $rc)"; cat "$log"
  elif ((rc == 0)); then
    silent=$((silent + 1)); echo "EXIT 0 $what"; cat "$log"
  elif ! grep -Eq "$why" "$log"; then
    unexplained=$((unexplained + 1)); echo "WHY?   $what (exit $rc)"; cat "$log"
  else
    echo "ok     $what: survivor exit $rc: $(grep -Eo "$why" "$log" | head -1)"
  fi
done
check "most rounds connected ($skipped of $rounds did not)" '((skipped * 10 <= rounds))'
check "no survivor hung ($hung of $rounds)" '((hung == 0))'
check "no survivor crashed ($crashed of $rounds)" '((crashed == 0))'
check "every survivor noticed (non-zero exit; $silent exited 0)" '((silent == 0))'
check "every survivor's failed completion was WR_FLUSH_ERR or RETRY_EXC_ERR ($unexplained not)" '((unexplained == 0))'
finish
