#!/usr/bin/env bash
# A listener whose backlog is full loses no connection (issue 14): cmtime's server is
# stopped (SIGSTOP) while its client connects 5,000 ids at once, more than the listener's
# socket can queue (SOMAXCONN, 4,096); once resumed, every connection must be made: the
# connects that found the backlog full are retried, as the IB CM resends a REQ.
#   cm_backlog.sh SOFTVERBS PORT [LIMIT]   (LIMIT: seconds the client may take, 60)
set -uo pipefail
(($# == 2 || $# == 3)) || { echo "usage: $0 SOFTVERBS PORT [LIMIT]"; exit 2; }
softverbs=$1 port=$2 limit=${3:-60} count=5000
# Both processes hold a socket per connection.
ulimit -n "$(ulimit -Hn)" 2>/dev/null
if (($(ulimit -n) < 2 * count + 100)); then
  echo "SKIP: RLIMIT_NOFILE $(ulimit -n) is below $((2 * count + 100))"
  exit 77
fi
tmp=$(mktemp -d)
export SOFTVERBS_STATE_DIR=$tmp/state
mkdir -p "$SOFTVERBS_STATE_DIR"
server=
cleanup() {
  [[ -n $server ]] && kill -CONT "$server" 2>/dev/null && kill "$server" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# `softverbs run` execs: $! is cmtime's pid.
"$softverbs" run -- cmtime -p "$port" >"$tmp/srv" 2>&1 &
server=$!
listener() { ss -Hxl | grep -- "-106-$port "; }
for ((i = 0; i < 200; i++)); do
  [[ -n $(listener) ]] && break
  sleep 0.05
done
[[ -n $(listener) ]] || { echo "FAIL: the server does not listen"; exit 1; }
kill -STOP "$server"
timeout "$limit" "$softverbs" run -- cmtime -s 127.0.0.1 -p "$port" -c "$count" >"$tmp/cli" 2>&1 &
client=$!
full=0
for ((i = 0; i < 400; i++)); do
  # A listener's Recv-Q is its queue of connections; full is one more than the backlog.
  queued=$(listener | awk '{ print $3 }')
  if ((${queued:-0} > $(listener | awk '{ print $4 }'))); then full=1; break; fi
  sleep 0.05
done
kill -CONT "$server"
wait "$client"
rc=$?
failed=$(grep -c '^event: ' "$tmp/cli")
fails=0
check() {
  if eval "$2"; then echo "ok:   $1"; else echo "FAIL: $1"; fails=$((fails + 1)); fi
}
check "the listener's backlog filled while its process was stopped" '((full))'
check "the client exited 0" '((rc == 0))'
check "every one of the $count connections was made ($failed failed)" '((failed == 0))'
check "the client timed its connect step" "grep -q '^connect *: *[0-9]' '$tmp/cli'"
((fails == 0)) || { tail -n 5 "$tmp/cli"; exit 1; }
echo "PASS cm_backlog"
