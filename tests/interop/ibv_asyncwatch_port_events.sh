#!/usr/bin/env bash
# `softverbs port down/up` and `softverbs inject device-fatal` reach a running, unmodified
# ibv_asyncwatch as IBV_EVENT_PORT_ERR, IBV_EVENT_PORT_ACTIVE and IBV_EVENT_DEVICE_FATAL.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"

# A private state directory: toggling the port must not disturb tests running beside us.
SOFTVERBS_STATE_DIR=$(mktemp -d)
export SOFTVERBS_STATE_DIR
trap 'rm -rf "$SOFTVERBS_STATE_DIR"' EXIT

log=$(mktemp)
timeout 10 "$SOFTVERBS" run -- ibv_asyncwatch >"$log" 2>&1 &
watcher=$!
# Wait until it is up and blocked on its async fd.
for _ in $(seq 100); do grep -q 'async event FD' "$log" && break; sleep 0.05; done
wait_for() {
  for _ in $(seq 100); do grep -q "$1" "$log" && return 0; sleep 0.05; done
  return 1
}
run "$SOFTVERBS" port down
wait_for IBV_EVENT_PORT_ERR
run "$SOFTVERBS" port status
check "port status says down" "stdout_has '^port 1: down\$'"
run "$SOFTVERBS" port up
wait_for IBV_EVENT_PORT_ACTIVE
run "$SOFTVERBS" inject device-fatal
wait_for IBV_EVENT_DEVICE_FATAL
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
out=$(<"$log")
rm -f "$log"
printf '%s\n' "--- ibv_asyncwatch output:" "$out"
check "PORT_ERR for port 1" "stdout_has 'event_type IBV_EVENT_PORT_ERR \\(10\\), port 1'"
check "then PORT_ACTIVE for port 1" "stdout_has 'event_type IBV_EVENT_PORT_ACTIVE \\(9\\), port 1'"
check "then DEVICE_FATAL" "stdout_has 'event_type IBV_EVENT_DEVICE_FATAL \\(8\\)'"
check "events in order" \
  '[[ $(grep -o "IBV_EVENT_[A-Z_]*" <<<"$out" | tr "\n" " ") == "IBV_EVENT_PORT_ERR IBV_EVENT_PORT_ACTIVE IBV_EVENT_DEVICE_FATAL " ]]'
check "no crash, no sanitizer report" no_crash
finish
