#!/usr/bin/env bash
# Debian's perftest (ib_{send,write,read,atomic}_{lat,bw}), server and client as two processes
# on 127.0.0.1.
#   perftest.sh SOFTVERBS PORT LIMIT PROG [OPTIONS...]
# LIMIT: the seconds each side may run (pair.sh).
# Both sides get `-d softverbs0 -p PORT OPTIONS`, no GID option: on an Ethernet port perftest
# starts from GID index 0 and prefers IPv4-mapped, then RoCE v2 entries (get_best_gid_index),
# which is what `softverbs run -- ib_send_lat` does for a user. OPTIONS must include -n ITERS,
# which the result lines are compared against; with -a the client must report every size
# from 2 to 2^23 bytes.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"

# PERFTEST_PRELOAD=SHIM: both sides preload SHIM (perftest_part_id.c, the .wr_api tests).
# PERFTEST_API=ON|OFF: the post-send API perftest must say it uses; without it, each side's
# work requests must only have gone through the API it names (check_perftest_api, pair.sh).
[[ -z ${PERFTEST_PRELOAD-} ]] || export LD_PRELOAD=$PERFTEST_PRELOAD${LD_PRELOAD:+:$LD_PRELOAD}
# -R: the connection goes through rdma_cm, and the server listens there, not on TCP.
for arg in "$@"; do [[ $arg == -R ]] && PAIR_READY=cm-tcp; done
pair_program -d softverbs0 -- "$@"
# Before each report perftest calibrates its cycle counter against gettimeofday and gives up
# ("Correlation coefficient r^2: ... < 0.9", exit 1) when the machine is too loaded for the
# fit, as a 2-vCPU CI runner under the sanitizers can be (an -a sweep calibrates 23 times).
# That says nothing about softverbs: run the pair again, twice at most, and say so.
# With -R, perftest 4.5-0.17 connects its data QPs right after the exchange on its first
# connection; a REQ that comes before the server listens again is rejected (8), as on any
# host, and perftest's retry then reuses the ids it has just destroyed and crashes (the same
# race tests/hosts/cm_hosts.sh reruns). Run the pair again for that too, four times at most.
for attempt in 2 3 4 5; do
  if side_has cli 'Correlation coefficient r\^2' || side_has srv 'Correlation coefficient r\^2'; then
    ((attempt <= 3)) || break
    echo "perftest's clock calibration failed (machine too busy): running the pair again, attempt $attempt"
  elif [[ ${PAIR_READY-} == cm-tcp ]] && side_has cli 'RDMA_CM_EVENT_REJECTED; error: 8'; then
    echo "perftest's data connection was rejected (its server was not listening again yet): running the pair again, attempt $attempt"
  else
    break
  fi
  pair_run
done
sweep=0 mcast=0
for arg in "${args[@]}"; do
  [[ $arg == -a ]] && sweep=1
  [[ $arg == -g ]] && mcast=1 # perftest then prints the group's GID, not the port's
done

# perftest's formats (src/perftest_parameters.h, 4.5-0.17): RESULT_FMT / RESULT_FMT_LAT head the
# table; REPORT_FMT* lines start with the size and the iteration count, padded with spaces
# and tabs. The figures after them are not checked: perftest prints "inf" or "-nan" when its
# CPU-clock estimate fails, as it can in a loaded VM. Addresses print as BASIC_ADDR_FMT, then
# the GID as 16 decimal bytes (PERF_GID_FMT).
header='^ #bytes +#iterations +(BW peak|t_min)'
row() { printf '^[[:space:]]*%s[[:space:]]+%s[[:space:]]+[^[:space:]]' "$1" "$iters"; }
hex='(0x)?[0-9a-f]+' # "%#04x" drops the 0x for zero: "LID 0000"
ipv4_gid='GID: 00:00:00:00:00:00:00:00:00:00:255:255:[0-9]{2,3}:[0-9]{2,3}:[0-9]{2,3}:[0-9]{2,3}$'

check "server exited 0" '((srv_rc == 0))'
check "client exited 0" '((cli_rc == 0))'
check "server waited for the client" "side_has srv 'Waiting for client to connect'"
for side in srv cli; do
  name=$([[ $side == srv ]] && echo server || echo client)
  check "$name printed its local address" \
    "side_has $side '^ local address: LID $hex QPN $hex PSN $hex'"
  check "$name learnt the peer's address" \
    "side_has $side '^ remote address: LID $hex QPN $hex PSN $hex'"
  if ((mcast)); then
    check "$name sent to a multicast group" "side_has $side '^ MGID: 255:'"
  else
    check "$name used an IPv4-mapped GID" "side_has $side ' $ipv4_gid'"
  fi
done
check "client printed the result table header" "side_has cli '$header'"
if ((sweep)); then
  for size in 2 4096 8388608; do
    check "client reports $size bytes x $iters iterations" "side_has cli '$(row "$size")'"
  done
  check "client reports all 23 sizes" \
    '(($(grep -cE "$(row "[0-9]+")" <<<"$cli_out") == 23))'
else
  check "client reports a result line for $iters iterations" "side_has cli '$(row '[0-9]+')'"
fi
# The read and atomic latency servers only serve: they print no table (read_lat.c, atomic_lat.c).
if [[ $prog != ib_read_lat && $prog != ib_atomic_lat ]]; then
  check "server printed the result table header" "side_has srv '$header'"
fi
# With -g both print the multicast QPN (0xffffff) for their address.
((mcast)) || check "server and client QPs have different numbers" distinct_qpns
check_perftest_api "${PERFTEST_API-}"
check "no crash, no sanitizer report" pair_no_crash
finish
