# Two-process helpers, sourced after lib.sh: a server and a client, each with its own timeout,
# meeting on 127.0.0.1 the way a user runs them in two shells.
#
#   pair_setup BASE_PORT    private SOFTVERBS_STATE_DIR; picks a free TCP port into $port
#   server=(CMD ...)        the two command lines (arrays), usually "$SOFTVERBS" run -- PROG
#   client=(CMD ...)
#   pair_run                server in the background; once it listens on $port, the client.
#                           Leaves srv_out srv_err srv_rc and cli_out cli_err cli_rc.
#   pair_program ...        all of the above for a program script (see below)
#   side_has srv|cli REGEX  an extended regular expression matches a line of that side's
#                           stdout+stderr
#   pair_no_crash           neither side died of a signal or printed a sanitizer report
#   distinct_qpns           the two sides' first local QPNs were printed and differ
#   api_count SIDE post_send|wr   work requests that side posted through ibv_post_send or
#                           the ibv_wr_* API, as softverbs counted them (SOFTVERBS_API_COUNTS)
#   check_perftest_api [ON|OFF]   each perftest side used the post-send API it says it did
#   host_gid INDEX          softverbs0's GID INDEX as the pingpongs print it (inet_ntop form)
#   host_gid_index GID      the index of GID (text) in softverbs0's table
#   regex_quote TEXT        TEXT as an extended regular expression matching it literally
#
# Time limits (seconds), from the environment or set before pair_run:
#   PAIR_TIMEOUT      the client's limit; the server gets PAIR_TIMEOUT + 5, as it starts first
#   PAIR_LISTEN_WAIT  how long the server may take to listen before we give up on it (10)
#   PAIR_GRACE        once one side has exited, how long the other may still run (5)
# Whatever happens, pair_run returns within PAIR_TIMEOUT + max(PAIR_LISTEN_WAIT, 5) + 2 s (the
# later of the two sides' own limits, plus `timeout -k 2`; the grace only shortens that), and
# every process it started has ended: each side runs under `timeout` as the leader of its own
# process group, which is signalled as a whole.
#
# Outputs are line-buffered (stdbuf -oL): a side killed by its timeout still shows how far it
# got, where a block-buffered stdout would be lost with the process.

# shellcheck shell=bash
# shellcheck disable=SC2034,SC2154 # results are for the sourcing script; it sets server/client
PAIR_TIMEOUT=${PAIR_TIMEOUT:-20}
PAIR_LISTEN_WAIT=${PAIR_LISTEN_WAIT:-10}
PAIR_GRACE=${PAIR_GRACE:-5}
pair_tmp=

# now_ms: milliseconds since the epoch (bash's own clock, no process started).
now_ms() {
  local t=${EPOCHREALTIME/[.,]/}
  echo $((t / 1000))
}

pair_cleanup() {
  [[ -z $pair_tmp ]] || rm -rf -- "$pair_tmp"
  [[ -z ${SOFTVERBS_STATE_DIR-} ]] || rm -rf -- "$SOFTVERBS_STATE_DIR"
}

# listening PORT: some socket listens on TCP PORT. We ask `ss` rather than connecting: the
# pingpong servers accept exactly one connection, so a probe would be taken for the client.
listening() {
  [[ -n $(ss -Hltn "sport = :$1") ]]
}

# cm_listening PORT PS: a softverbs rdma_cm listener holds PORT in port space PS (106 TCP,
# 111 UDP, 13f IB, in hex as in the name): an abstract unix socket "@softverbs-cm-HOST-PS-PORT",
# where HOST is the FNV-1a hash of the state directory (src/common/cm_port_name.cpp).
cm_listening() {
  local host
  host=$(python3 -c 'import sys
h = 1469598103934665603
for b in sys.argv[1].encode():
    h = ((h ^ b) * 1099511628211) % (1 << 64)
print(f"{h:016x}")' "$SOFTVERBS_STATE_DIR")
  ss -Hxl 2>/dev/null | grep -Eq -- "@softverbs-cm-$host-$2-$1( |$)"
}

# pair_ready PORT: the server is ready for its client. PAIR_READY says how to tell: tcp (a
# TCP listener, the default), cm-tcp, cm-udp or cm-ib (an rdma_cm listener in that port space),
# mcast (some QP of this state directory is attached to a multicast group).
PAIR_READY=${PAIR_READY:-tcp}
pair_ready() {
  case $PAIR_READY in
    cm-tcp) cm_listening "$1" 106 ;;
    cm-udp) cm_listening "$1" 111 ;;
    cm-ib) cm_listening "$1" 13f ;;
    mcast) compgen -G "$SOFTVERBS_STATE_DIR/mcast/*.??????" >/dev/null ;;
    *) listening "$1" ;;
  esac
}

pair_setup() {
  local base=${1:?pair_setup BASE_PORT}
  # A private state directory: the host registry and port state of parallel tests stay apart.
  SOFTVERBS_STATE_DIR=$(mktemp -d)
  export SOFTVERBS_STATE_DIR
  pair_tmp=$(mktemp -d)
  trap pair_cleanup EXIT
  # Each test has its own base port (CMakeLists.txt), so `ctest -j` is safe. The lock, held
  # until we exit, keeps out the same test run from another build tree; a port somebody else
  # listens on sends us 1000 further.
  local candidate
  for candidate in "$base" $((base + 1000)) $((base + 2000)) $((base + 3000)); do
    if exec {pair_lock_fd}>"${TMPDIR:-/tmp}/softverbs-twoproc-$candidate.lock"; then
      if flock -n "$pair_lock_fd" && ! listening "$candidate"; then
        port=$candidate
        echo "TCP port $port, SOFTVERBS_STATE_DIR=$SOFTVERBS_STATE_DIR"
        return 0
      fi
      exec {pair_lock_fd}>&-
    fi
  done 2>/dev/null
  echo "no free TCP port among $base, $((base + 1000)), $((base + 2000)), $((base + 3000))"
  exit 1
}

# pair_start SIDE LIMIT CMD...: runs CMD in the background under `timeout LIMIT`, which makes
# itself the leader of a new process group; its pid goes to ${SIDE}_pid.
pair_start() {
  local side=$1 limit=$2
  shift 2
  # Each side's processes append what they posted through each send API to SIDE.api.
  SOFTVERBS_API_COUNTS=$pair_tmp/$side.api \
    timeout -k 2 "$limit" stdbuf -oL -eL "$@" >"$pair_tmp/$side.out" 2>"$pair_tmp/$side.err" &
  printf -v "${side}_pid" %d $!
  printf -v "${side}_start" %d "$(now_ms)"
  echo "started $side (limit ${limit}s): $*"
}

# alive PID: the process has not exited (a zombie awaiting `wait` counts as exited). Reads
# /proc rather than running ps: we ask every 50 ms.
alive() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) } # the state follows the command name in parentheses
  [[ ${stat:0:1} != Z ]]
}

# pair_stop PID: ends the process group of a side that overstayed: TERM, 2 s later KILL.
pair_stop() {
  local deadline=$(($(now_ms) + 2000))
  kill -TERM -- "-$1" 2>/dev/null
  while (($(now_ms) < deadline)); do
    alive "$1" || return 0
    sleep 0.05
  done
  kill -KILL -- "-$1" 2>/dev/null
}

# pair_collect SIDE: waits for the side and fills ${SIDE}_out, _err, _rc and _ms (its run time,
# up to when we first saw it exited, if we watched it).
pair_collect() {
  local side=$1 pid_var=${1}_pid start_var=${1}_start end_var=${1}_end code
  wait "${!pid_var}"
  code=$?
  printf -v "${side}_rc" %d "$code"
  printf -v "${side}_ms" %d $((${!end_var:-$(now_ms)} - ${!start_var}))
  printf -v "${side}_out" %s "$(<"$pair_tmp/$side.out")"
  printf -v "${side}_err" %s "$(<"$pair_tmp/$side.err")"
}

pair_run() {
  : "${port:?pair_setup first}"
  local deadline srv_done=0 cli_done=0 started_client=0
  srv_pid='' cli_pid='' srv_end='' cli_end='' srv_rc='' cli_rc='' srv_ms=0 cli_ms=0
  srv_out='' cli_out='' srv_err='' cli_err=''
  rm -f -- "$pair_tmp/srv.api" "$pair_tmp/cli.api"
  pair_start srv $((PAIR_TIMEOUT + 5)) "${server[@]}"

  deadline=$(($(now_ms) + PAIR_LISTEN_WAIT * 1000))
  until pair_ready "$port"; do
    if ! alive "$srv_pid"; then
      echo "server exited before listening on port $port; client not started"
      break
    fi
    if (($(now_ms) >= deadline)); then
      echo "server not listening on port $port after ${PAIR_LISTEN_WAIT}s; stopping it"
      pair_stop "$srv_pid"
      break
    fi
    sleep 0.05
  done
  if alive "$srv_pid"; then
    pair_start cli "$PAIR_TIMEOUT" "${client[@]}"
    started_client=1
  fi

  # Both sides run; once one has exited, the other has PAIR_GRACE seconds left.
  if ((started_client)); then
    deadline=
    while :; do
      ((srv_done)) || alive "$srv_pid" || { srv_done=1 srv_end=$(now_ms); }
      ((cli_done)) || alive "$cli_pid" || { cli_done=1 cli_end=$(now_ms); }
      ((srv_done && cli_done)) && break
      if ((srv_done || cli_done)); then
        [[ -n $deadline ]] || deadline=$(($(now_ms) + PAIR_GRACE * 1000))
        if (($(now_ms) >= deadline)); then
          if ((srv_done)); then
            echo "client still running ${PAIR_GRACE}s after the server exited; stopping it"
            pair_stop "$cli_pid"
          else
            echo "server still running ${PAIR_GRACE}s after the client exited; stopping it"
            pair_stop "$srv_pid"
          fi
          deadline=$(($(now_ms) + 3600 * 1000))
        fi
      fi
      sleep 0.05
    done
    pair_collect cli
  fi
  pair_collect srv

  pair_show server srv
  if ((started_client)); then
    pair_show client cli
  else
    cli_rc=-1
  fi
}

# iters_of ARGS...: the value that follows -n among ARGS (nothing if there is none).
iters_of() {
  local i args=("$@")
  for ((i = 0; i < ${#args[@]} - 1; i++)); do
    [[ ${args[i]} == -n ]] && { echo "${args[i + 1]}"; return; }
  done
}

# pair_program OPTIONS... -- PORT LIMIT PROG [ARGS...]: the whole run of a program script:
# PROG OPTIONS -p PORT ARGS as server, the same plus 127.0.0.1 as client, each under
# `softverbs run` and LIMIT seconds. Sets prog, args and iters (the -n value ARGS must give).
# PAIR_WITHOUT_SOFTVERBS=1 runs both on the real rdma-core instead, to see the checks fail.
pair_program() {
  local options=() wrapper=("$SOFTVERBS" run --)
  while (($# > 0)) && [[ $1 != -- ]]; do
    options+=("$1")
    shift
  done
  shift
  (($# >= 3)) || { echo "usage: $0 SOFTVERBS PORT LIMIT PROG [ARGS...]"; exit 2; }
  local base_port=$1
  PAIR_TIMEOUT=$2 prog=$3
  shift 3
  args=("$@")
  iters=$(iters_of "${args[@]}")
  [[ -n $iters ]] || { echo "give -n ITERS among the arguments"; exit 2; }

  pair_setup "$base_port"
  [[ ${PAIR_WITHOUT_SOFTVERBS-} == 1 ]] && wrapper=()
  server=("${wrapper[@]}" "$prog" "${options[@]}" -p "$port" "${args[@]}")
  client=("${server[@]}" 127.0.0.1)
  pair_run
}

# pair_show NAME SIDE: the side's output and exit code in the test log.
pair_show() {
  local name=$1 out_var=${2}_out err_var=${2}_err rc_var=${2}_rc ms_var=${2}_ms
  printf '\n--- %s stdout:\n%s\n' "$name" "${!out_var}"
  [[ -z ${!err_var} ]] || printf -- '--- %s stderr:\n%s\n' "$name" "${!err_var}"
  printf -- '--- %s exit code %d after %d ms%s\n' "$name" "${!rc_var}" "${!ms_var}" \
    "$( ((${!rc_var} == 124 || ${!rc_var} == 137)) && echo ' (timed out)')"
}

# softverbs0's GID table, one "INDEX GID" line per entry, from `ibv_devinfo -v`. Which
# address is GID 0 depends on the machine's interfaces (src/wire/host.hpp): the first
# interface IPv4 address, or ::ffff:127.0.0.1 when only lo is up.
host_gid_table() {
  "$SOFTVERBS" run -- ibv_devinfo -v -d softverbs0 |
    sed -nE 's/^[[:space:]]*GID\[ *([0-9]+)\]:[[:space:]]+([^,]+), RoCE v2$/\1 \2/p'
}
host_gid() { host_gid_table | awk -v i="$1" '$1 == i { print $2; exit }'; }
host_gid_index() { host_gid_table | awk -v gid="$1" '$2 == gid { print $1; exit }'; }
regex_quote() { sed -E 's/[][\.*^$+?(){}|/]/\\&/g' <<<"$1"; }

side_has() {
  local out_var=${1}_out err_var=${1}_err
  grep -Eq -- "$2" <<<"${!out_var}
${!err_var}"
}

# local_qpn SIDE: the QP number on the side's first "local address:" line (the pingpongs and
# perftest both print one). On one host the two sides' QPNs must differ: the peer's QPN is
# all that names its QP.
local_qpn() {
  local out_var=${1}_out
  grep -m1 -oE '^ *local address: +LID [^ ]+ QPN [0-9a-fx]+' <<<"${!out_var}" | awk '{print $NF}'
}

distinct_qpns() {
  local srv_qpn cli_qpn
  srv_qpn=$(local_qpn srv)
  cli_qpn=$(local_qpn cli)
  [[ -n $srv_qpn && -n $cli_qpn && $srv_qpn != "$cli_qpn" ]]
}

pair_no_crash() {
  local side out_var err_var rc_var
  for side in srv cli; do
    out_var=${side}_out err_var=${side}_err rc_var=${side}_rc
    ((${!rc_var} < 128 || ${!rc_var} == 137 || ${!rc_var} == 143)) || return 1
    ! grep -Eq 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|Segmentation fault|Aborted' \
      <<<"${!out_var}${!err_var}" || return 1
  done
}

# check_timestamps OPTIONS...: with -t among them (ibv_rc_pingpong: receives on an extended
# CQ with completion timestamps, read with ibv_start_poll/ibv_next_poll), checks that each
# side printed the spread of its receive timestamps, and that none stepped back: the program
# prints the 64-bit gaps with %u, so a step back would show as about 2^32 (10 digits).
check_timestamps() {
  [[ " $* " == *" -t "* ]] || return 0
  local side name what
  for side in srv cli; do
    name=$([[ $side == srv ]] && echo server || echo client)
    for what in Max Min; do
      check "$name reports the $what gap between receive timestamps" \
        "side_has $side '^$what receive completion clock cycles = [0-9]+\$'"
    done
    check "$name reports the average gap" \
      "side_has $side '^Average receive completion clock cycles = [0-9]+\\.[0-9]+\$'"
    check "$name's timestamps move forward (no gap of 1 s or more)" \
      "! side_has $side '^Max receive completion clock cycles = [0-9]{10,}\$'"
  done
}

# api_count SIDE post_send|wr: the work requests the side's processes posted through
# ibv_post_send or through the ibv_wr_* API, summed over the lines softverbs appended at exit
# ("PID PROGRAM ibv_post_send N ibv_wr M", src/verbs/send_api_tally.cpp); empty if none wrote.
api_count() {
  local field=4
  [[ $2 == wr ]] && field=6
  [[ -s $pair_tmp/$1.api ]] || return 0
  awk -v f="$field" '{ n += $f } END { print n + 0 }' "$pair_tmp/$1.api"
}

# perftest_api SIDE: ON or OFF, what the side's perftest printed as "ibv_wr* API : ..." (it
# uses the ibv_wr_* API unless --use_old_post_send or its device check forces the old one).
perftest_api() {
  local out_var=${1}_out
  grep -m1 -oE '^ ibv_wr\* API +: (ON|OFF)' <<<"${!out_var}" | awk '{print $NF}'
}

# check_perftest_api [ON|OFF]: each side's work requests went through the API its perftest
# named, none through the other, and the client posted some; with an argument, perftest
# must have named that API.
check_perftest_api() {
  local want=${1-} side name used other
  for side in srv cli; do
    name=$([[ $side == srv ]] && echo server || echo client)
    echo "$name: ibv_wr* API $(perftest_api $side); softverbs counted: $(cat "$pair_tmp/$side.api" 2>/dev/null)"
    check "$name named its post-send API (ibv_wr* API : ON|OFF)" "[[ -n \$(perftest_api $side) ]]"
    [[ -z $want ]] || check "$name uses ibv_wr* API $want" "[[ \$(perftest_api $side) == $want ]]"
    used=post_send other=wr
    [[ $(perftest_api $side) == ON ]] && used=wr other=post_send
    check "softverbs counted $name's work requests (SOFTVERBS_API_COUNTS)" \
      "[[ -n \$(api_count $side $used) ]]"
    check "$name posted none through the other API ($other)" "((\$(api_count $side $other) == 0))"
  done
  check "client posted its work requests through the API it named" \
    "((\$(api_count cli $used) > 0))"
}
