#!/usr/bin/env bash
# Debian's pingpongs or perftest between the two hosts of netns.sh, as a user runs them on two
# machines: the server on host SERVER, the client on host CLIENT given the server host's veth
# IPv4 address for the TCP exchange. Exits 77 (skipped) without root.
#   pair_hosts.sh SOFTVERBS PORT LIMIT SERVER CLIENT PROG [OPTIONS...]
# SERVER and CLIENT are A or B. "A A" runs both on host A: softverbs' same-host transport
# inside a namespace, with that host's own state directory (hosts.one_host). "A B" is
# between hosts, over RoCE v2: the next step, registered disabled until RoCE lands
# (SOFTVERBS_HOSTS_ROCE_TESTS in CMakeLists.txt). PROG is ibv_{rc,uc,ud,srq}_pingpong or a
# perftest ib_*; OPTIONS must include -n ITERS. LIMIT: the seconds each side may run (pair.sh).
#
# GIDs. Each side names its port's GID by index: the pingpongs with -g INDEX, perftest with
# -x INDEX. Without them the pingpongs send a zero GID and build an AH without GRH (fine on
# one machine, wrong between two); perftest takes the first IPv4-mapped RoCE v2 entry. The
# index of the veth's ::ffff:a.b.c.d is read from that host's `ibv_devinfo -v` (netns.sh,
# gid_index_of): softverbs lists the interfaces' IPv4 addresses first, then 127.0.0.1, then
# IPv6 (src/wire/host.hpp), so in a namespace with only lo and the veth it is 0 on both hosts:
#   GID[0] ::ffff:10.77.1.x   GID[1] ::ffff:127.0.0.1   GID[2] ::1   GID[3] fd00:...::x   GID[4] fe80::...
# The pingpongs print the GIDs they use ("GID ::ffff:10.77.1.1"), perftest as 16 decimal
# bytes ("GID: 00:00:...:255:255:10:77:01:01"); the checks compare both sides' with what
# each host should use.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/../interop/pair.sh"
source "$(dirname "$0")/netns.sh"

(($# >= 6)) || { echo "usage: $0 SOFTVERBS PORT LIMIT SERVER CLIENT PROG [OPTIONS...]"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 srv_host=${3^^} cli_host=${4^^} prog=$5
shift 5
options=("$@")
iters=$(iters_of "${options[@]}")
[[ -n $iters ]] || { echo "give -n ITERS among the options"; exit 2; }
host_var "$srv_host" NS >/dev/null && host_var "$cli_host" NS >/dev/null || exit 2

# PERFTEST_PRELOAD and PERFTEST_API: as in interop/perftest.sh.
[[ -z ${PERFTEST_PRELOAD-} ]] || export LD_PRELOAD=$PERFTEST_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}
why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
pair_setup "$base_port"
hosts_exit_cleanup # after pair_setup: keeps its cleanup too
hosts_up || exit 1
# The server listens in its own namespace: ask `ss` there.
listening() { [[ -n $(in_host "$srv_host" ss -Hltn "sport = :$1") ]]; }

srv_gid=$(host_var "$srv_host" GID4) cli_gid=$(host_var "$cli_host" GID4)
srv_index=$(gid_index_of "$SOFTVERBS" "$srv_host" "$srv_gid")
cli_index=$(gid_index_of "$SOFTVERBS" "$cli_host" "$cli_gid")
echo "server on $srv_host: GID index $srv_index ($srv_gid); client on $cli_host: GID index $cli_index ($cli_gid)"
[[ -n $srv_index && -n $cli_index ]] || { echo "FAIL: a veth address is missing from the GID table"; exit 1; }

perftest=0
[[ $prog == ib_* ]] && perftest=1
gid_option=-g
((perftest)) && gid_option=-x
side_cmd() { # side_cmd HOST INDEX: the command prefix for that side, as an array in $cmd
  local prefix="HOST_$1[@]"
  cmd=("${!prefix}" "$SOFTVERBS" run -- "$prog" -d softverbs0 "$gid_option" "$2" -p "$port" "${options[@]}")
}
side_cmd "$srv_host" "$srv_index"
server=("${cmd[@]}")
side_cmd "$cli_host" "$cli_index"
client=("${cmd[@]}" "$(host_var "$srv_host" IP4)")
pair_run
# perftest may fail its clock calibration on a loaded machine (see interop/perftest.sh).
for attempt in 2 3; do
  ((perftest)) || break
  side_has cli 'Correlation coefficient r\^2' || side_has srv 'Correlation coefficient r\^2' || break
  echo "perftest's clock calibration failed (machine too busy): running the pair again, attempt $attempt"
  pair_run
done

# perftest_gid ::ffff:A.B.C.D: perftest's decimal form of that GID.
perftest_gid() {
  local IFS=.
  # shellcheck disable=SC2086 # split the dotted quad
  set -- ${1#::ffff:}
  printf '00:00:00:00:00:00:00:00:00:00:255:255:%02d:%02d:%02d:%02d' "$1" "$2" "$3" "$4"
}

# perftest_address_gid SIDE local|remote: the GID perftest printed under that side's first
# " local address:" or " remote address:" line (" GID: 00:...:255:255:10:77:01:01").
perftest_address_gid() {
  local out_var=${1}_out
  awk -v which=" $2 address:" 'index($0, which) == 1 { want = 1; next }
    want && /^ GID: / { print $2; exit }' <<<"${!out_var}"
}

for side in srv cli; do
  name=$([[ $side == srv ]] && echo server || echo client)
  own=$([[ $side == srv ]] && echo "$srv_gid" || echo "$cli_gid")
  peer=$([[ $side == srv ]] && echo "$cli_gid" || echo "$srv_gid")
  check "$name exited 0" "((${side}_rc == 0))"
  if [[ $prog == ibv_xsrq_pingpong ]]; then
    # "   local: LID 0000, QPN RECV 004001 SEND 004002, PSN 1a2b3c, SRQN 004001, GID ::ffff:..."
    xaddr='LID 0000, QPN RECV [0-9a-f]{6} SEND [0-9a-f]{6}, PSN [0-9a-f]{6}, SRQN [0-9a-f]{6}, GID'
    check "$name's local address carries its GID $own" "side_has $side '^ +local: $xaddr ${own//./\\.}\$'"
    check "$name learnt the peer's GID $peer" "side_has $side '^ +remote: $xaddr ${peer//./\\.}\$'"
    check "$name reports success" "side_has $side '^success\$'"
  elif ((perftest)); then
    index=$([[ $side == srv ]] && echo "$srv_index" || echo "$cli_index")
    check "$name used GID index $index" "side_has $side '^ GID index +: $index\$'"
    check "$name's local address carries its GID $own" \
      "[[ \$(perftest_address_gid $side local) == $(perftest_gid "$own") ]]"
    check "$name learnt the peer's GID $peer" \
      "[[ \$(perftest_address_gid $side remote) == $(perftest_gid "$peer") ]]"
  else
    check "$name's local address carries its GID $own" \
      "side_has $side '^  local address:  LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ${own//./\\.}\$'"
    check "$name learnt the peer's GID $peer" \
      "side_has $side '^  remote address: LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ${peer//./\\.}\$'"
    check "$name reports $iters iterations" \
      "side_has $side '^$iters iters in [0-9]+\\.[0-9]{2} seconds = [0-9]+\\.[0-9]{2} usec/iter\$'"
    check "$name saw no corrupted payload" "! side_has $side 'invalid data'"
  fi
done
((perftest)) || [[ $prog == ibv_xsrq_pingpong ]] || check_timestamps "${options[@]}"
((perftest)) &&
  check "client reports a result line for $iters iterations" \
    "side_has cli '^[[:space:]]*[0-9]+[[:space:]]+${iters}[[:space:]]+[^[:space:]]'"
((perftest)) && check_perftest_api "${PERFTEST_API-}"
# On one host the QPN alone names the peer's QP, so the two must differ; on two hosts they may not.
[[ $srv_host == "$cli_host" ]] && check "server and client QPs have different numbers" distinct_qpns
check "no crash, no sanitizer report" pair_no_crash
if [[ $srv_host == "$cli_host" ]]; then
  other=$([[ $srv_host == A ]] && echo B || echo A)
  check "softverbs used host $srv_host's state directory" "[[ -e $(host_var "$srv_host" STATE)/registry ]]"
  check "... and not host $other's" "[[ ! -e $(host_var "$other" STATE)/registry ]]"
fi
finish
