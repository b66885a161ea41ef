#!/usr/bin/env bash
# The two-process harness (pair.sh) itself: it gives up on a server that never listens, stops a
# side that outlives its peer or its limit together with its children, and the pingpong and
# perftest checks do fail when the programs fail. Needs no working transport, so it runs while
# the interop.twoproc.* tests are disabled.
#   twoproc_harness.sh SOFTVERBS PORT
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"
here=$(dirname "$0")
base_port=${1:?usage: $0 SOFTVERBS PORT}

pair_setup "$base_port"

# elapsed_below SECONDS: the last pair_run took less than that (started at $t0).
elapsed_below() { (($(now_ms) - t0 < $1 * 1000)); }
# group_gone PID: no process of the process group that side's `timeout` led still runs (an
# orphan may linger as a zombie until its new parent reaps it: it has ended all the same).
group_gone() {
  local pid
  [[ -n $1 ]] || return 1
  for pid in $(pgrep -g "$1"); do
    alive "$pid" && ps -o pid=,stat=,args= -p "$pid" && return 1
  done
  return 0
}

echo "=== a server that dies before listening: the client is not started"
PAIR_TIMEOUT=5
server=(sh -c 'echo "no device" >&2; exit 1')
client=(sleep 60)
t0=$(now_ms)
pair_run
check "server's exit code and message kept" '((srv_rc == 1)) && side_has srv "^no device$"'
check "client not started" '((cli_rc == -1))'
check "done at once" 'elapsed_below 5'

echo "=== a server that never listens: given up after PAIR_LISTEN_WAIT"
PAIR_LISTEN_WAIT=1
server=(sleep 60)
t0=$(now_ms)
pair_run
check "server stopped by us" '((srv_rc == 143 || srv_rc == 137))'
check "server's process group is gone" 'group_gone "$srv_pid"'
check "client not started" '((cli_rc == -1))'
check "done within the listen wait and the stop" 'elapsed_below 6'
PAIR_LISTEN_WAIT=10

echo "=== a client that hangs: its timeout, then the server's grace"
PAIR_TIMEOUT=2 PAIR_GRACE=1
# Listens on our port and then waits forever, as a server whose client never comes.
server=(perl -MIO::Socket::INET -e
  '$| = 1; my $socket = IO::Socket::INET->new(LocalAddr => "127.0.0.1",
     LocalPort => $ARGV[0], Listen => 1, ReuseAddr => 1) or die "listen: $!";
   print "listening\n"; sleep 600' "$port")
# A hanging child of the client shows that the whole process group ends, not just its leader.
client=(bash -c 'sleep 600 & echo "client up"; wait')
t0=$(now_ms)
pair_run
check "client timed out (124)" '((cli_rc == 124))'
check "client's output before the hang kept (line-buffered)" 'side_has cli "^client up$"'
check "server stopped after the grace or by its limit" '((srv_rc == 143 || srv_rc == 137))'
check "server's output before the hang kept" 'side_has srv "^listening$"'
check "client's process group is gone, its child included" 'group_gone "$cli_pid"'
check "server's process group is gone" 'group_gone "$srv_pid"'
check "done within the server's limit and its kill-after" 'elapsed_below 12'
check "timeouts are not crashes" pair_no_crash
PAIR_TIMEOUT=20 PAIR_GRACE=5

# The real checks against the real rdma-core, which finds no device here: both scripts must
# fail, show why, and end long before their limit. They take our port: release its lock.
exec {pair_lock_fd}>&-
if [[ -n $(ibv_devices 2>/dev/null | tail -n +3) ]]; then
  echo "=== rdma-core finds a real device on this host: the failing-check cases are skipped"
else
  echo "=== pingpong.sh on the real rdma-core (no softverbs run) must fail"
  t0=$(now_ms)
  PAIR_WITHOUT_SOFTVERBS=1 run bash "$here/pingpong.sh" "$SOFTVERBS" "$port" 30 ibv_rc_pingpong -n 10 -c
  check "the test fails" '((rc == 1))'
  check "it shows the server's error" 'stdout_has "Failed to get IB devices list: Function not implemented"'
  check "it fails the exit-code check" 'stdout_has "^FAIL: server exited 0"'
  check "it fails the result checks" 'stdout_has "^FAIL: client reports 10 iterations"'
  check "done long before the limit" 'elapsed_below 15'

  echo "=== perftest.sh on the real rdma-core (no softverbs run) must fail"
  t0=$(now_ms)
  PAIR_WITHOUT_SOFTVERBS=1 run bash "$here/perftest.sh" "$SOFTVERBS" "$port" 30 ib_send_lat -n 10
  check "the test fails" '((rc == 1))'
  check "it shows the server's error" 'stdout_has "Unable to find the Infiniband/RoCE device"'
  check "it fails the result checks" 'stdout_has "^FAIL: client printed the result table header"'
  check "done long before the limit" 'elapsed_below 15'
fi
finish
