#!/usr/bin/env bash
# `softverbs stat` against a program stopped at a known point (stat_target.c): what
# `stat --json` reports must be what the program did. MODE:
#   live     both processes running: types, states, PSNs, peers, MR lengths, CQ fill, arm
#            state, events not acked, channel readable, queue fill, SRQ fill and limit
#   stopped  the receiver SIGSTOPped: stat answers at once and still reads its live fields
#   dead     the sender killed (SIGKILL): its segment stays, shown as dead, nothing live read
#   garbage  segments of garbage beside the live ones: stat neither crashes nor hangs,
#            marks them invalid and still shows the live processes
# Usage: stat.sh PATH/TO/softverbs PATH/TO/stat_target MODE
set -uo pipefail

SOFTVERBS=$1
TARGET=$2
MODE=$3
failures=0
checks=0

SOFTVERBS_STATE_DIR=$(mktemp -d /dev/shm/softverbs-stat-test.XXXXXX)
export SOFTVERBS_STATE_DIR
out_file=$SOFTVERBS_STATE_DIR/target.out
target_pid=
cleanup() {
  [[ -n $target_pid ]] && kill -CONT "$target_pid" 2>/dev/null
  [[ -n ${receiver:-} ]] && kill -CONT "$receiver" 2>/dev/null && kill -KILL "$receiver" 2>/dev/null
  [[ -n ${sender:-} ]] && kill -CONT "$sender" 2>/dev/null && kill -KILL "$sender" 2>/dev/null
  [[ -n $target_pid ]] && kill -KILL "$target_pid" 2>/dev/null
  wait 2>/dev/null
  rm -rf -- "$SOFTVERBS_STATE_DIR"
}
trap cleanup EXIT

check() {  # DESCRIPTION CONDITION
  checks=$((checks + 1))
  if eval "$2"; then
    echo "ok:   $1"
  else
    echo "FAIL: $1    [$2]"
    failures=$((failures + 1))
  fi
}

# stat_json [ARGS]: runs `softverbs stat --json` with a time limit; the JSON in $json.
stat_json() {
  json=$(timeout 10 "$SOFTVERBS" stat --json "$@")
  stat_rc=$?
  printf '\n$ softverbs stat --json %s (exit %d)\n%s\n' "$*" "$stat_rc" "$json"
}

# expect DESCRIPTION EXPR VALUE: the Python EXPR over the last JSON must print VALUE
# (p(pid): that process's object); `evaluate` checks the queued ones in one Python run.
descs=() exprs=() wants=()
expect() {
  descs+=("$1") exprs+=("$2") wants+=("$3")
}
# q1 EXPR: one Python expression over the last JSON, printed.
q1() {
  python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
def p(pid):
    return next(x for x in d["processes"] if x["pid"] == int(pid))
print(eval(sys.argv[1]))' "$1" <<<"$json" 2>&1
}
evaluate() {
  local i got results
  mapfile -t results < <(python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
def p(pid):
    return next(x for x in d["processes"] if x["pid"] == int(pid))
for e in sys.argv[1:]:
    try:
        print(str(eval(e)).replace("\n", " "))
    except Exception as x:
        print("error: %r" % x)' "${exprs[@]}" <<<"$json" 2>&1)
  for i in "${!exprs[@]}"; do
    got=${results[$i]-}
    checks=$((checks + 1))
    if [[ $got == "${wants[$i]}" ]]; then
      echo "ok:   ${descs[$i]}"
    else
      echo "FAIL: ${descs[$i]}    [${exprs[$i]}: got '$got', want '${wants[$i]}']"
      failures=$((failures + 1))
    fi
  done
  descs=() exprs=() wants=()
}

"$SOFTVERBS" run -- "$TARGET" >"$out_file" 2>&1 &
target_pid=$!
for _ in $(seq 100); do
  grep -q '^READY' "$out_file" && break
  kill -0 "$target_pid" 2>/dev/null || break
  sleep 0.1
done
cat "$out_file"
read -r _ receiver sender rqpn sqpn < <(grep '^READY' "$out_file")
if [[ -z ${receiver:-} ]]; then
  echo "FAIL: the target did not get ready"
  exit 1
fi

read -r _ mw_rkey xrcd_file < <(grep '^EXTRA' "$out_file")
R="p($receiver)"
S="p($sender)"
first=$((receiver < sender ? receiver : sender))
second=$((receiver < sender ? sender : receiver))

case $MODE in
  live)
    stat_json
    check "exit code 0" '[[ $stat_rc == 0 ]]'
    expect "both processes listed, running" "[(x['pid'], x['status']) for x in d['processes']]" \
      "[($first, 'running'), ($second, 'running')]"
    expect "live fields readable" "$R['live_fields'] and $S['live_fields']" True
    expect "one context each, softverbs0" "[c['device'] for c in $R['contexts'] + $S['contexts']]" \
      "['softverbs0', 'softverbs0']"
    expect "MR lengths 4096 / 8192" "($R['mrs'][0]['length'], $S['mrs'][0]['length'])" "(4096, 8192)"
    expect "MR access" "$R['mrs'][0]['access']" "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ"
    expect "MR keys published" "$R['mrs'][0]['lkey'] == $R['mrs'][0]['rkey'] > 0" True
    expect "PD of the MR" "$R['mrs'][0]['pd'] == $R['pds'][0]['handle']" True
    expect "QP types RC" "[q['type'] for q in $R['qps'] + $S['qps']]" "['RC', 'RC']"
    expect "QP states RTS" "[q['state'] for q in $R['qps'] + $S['qps']]" "['RTS', 'RTS']"
    expect "QP numbers and destinations" \
      "[(q['qp_num'], q['dest_qp_num']) for q in $R['qps'] + $S['qps']]" "[($rqpn, $sqpn), ($sqpn, $rqpn)]"
    expect "PSNs as set" "($R['qps'][0]['sq_psn'], $R['qps'][0]['rq_psn'], $S['qps'][0]['sq_psn'])" \
      "(1000, 2000, 2000)"
    expect "peer processes" "($R['qps'][0]['peer_pid'], $S['qps'][0]['peer_pid'])" "($sender, $receiver)"
    # stat_target addresses its peer by GID 0: this host's first address (docs/roce.md).
    gid0=$("$SOFTVERBS" run -- ibv_devinfo -v -d softverbs0 |
      sed -nE 's/^[[:space:]]*GID\[ *0\]:[[:space:]]+([^,]+), RoCE v2$/\1/p')
    expect "peer GID" "$R['qps'][0]['dgid']" "$gid0"
    # The sender's third receive is used once it polls; it sleeps in read(2) instead.
    expect "receive queues: 4 posted - 2 used; the sender's 3, one maybe used" \
      "($R['qps'][0]['recv_posted'], $S['qps'][0]['recv_posted'] in (2, 3), $R['qps'][0]['max_recv_wr'])" "(2, True, 8)"
    expect "send queues empty" \
      "($R['qps'][0]['send_queued'], $S['qps'][0]['send_queued'], $S['qps'][0]['max_send_wr'])" "(0, 0, 8)"
    expect "receiver CQ: 3 entries waiting (2 receives, 1 send)" "$R['cqs'][0]['entries']" 3
    expect "receiver CQ armed solicited-only" "$R['cqs'][0]['armed']" solicited
    expect "receiver CQ: 2 events not acked" "$R['cqs'][0]['events_not_acked']" 2
    expect "sender CQ: not armed, all acked (the receiver's message may wait in its window)" \
      "($S['cqs'][0]['entries'] in (0, 1), $S['cqs'][0]['armed'], $S['cqs'][0]['events_not_acked'])" "(True, 'no', 0)"
    expect "CQ depth" "$R['cqs'][0]['cqe'] >= 16" True
    expect "CQ on the channel" "$R['cqs'][0]['channel'] == $R['channels'][0]['handle']" True
    expect "receiver's channel readable, 1 event queued; the sender's neither" \
      "[(c['readable'], c['events_waiting']) for c in $R['channels'] + $S['channels']]" "[(True, 1), (False, 0)]"
    expect "SRQ: 6 of 16 posted, limit 4" \
      "[(s['posted'], s['max_wr'], s['limit'], s['type']) for s in $R['srqs']]" "[(6, 16, 4, 'BASIC')]"
    expect "no async events waiting" "$R['contexts'][0]['async_events_waiting']" 0
    expect "MW: type 1, bound to the second MR, its rkey after the bind" \
      "[(w['type'], w['bound_mr'] == $R['mrs'][1]['handle'], w['rkey'], w['length'], w['access'], w['qp_num']) for w in $R['mws']]" \
      "[(1, True, $mw_rkey, 512, 'REMOTE_READ', None)]"
    expect "MW: the window's address" "int($R['mws'][0]['addr'], 16) - int($R['mrs'][1]['addr'], 16)" 256
    expect "AH: its destination GID, port, SL, hop limit" \
      "[(a['dgid'] == $R['qps'][0]['dgid'], a['port'], a['sl'], a['hop_limit'], a['pd'] == $R['pds'][0]['handle']) for a in $R['ahs']]" \
      "[(True, 1, 3, 9, True)]"
    expect "XRCD: the file it was opened on, no users" \
      "[(x['shared'], x['file'], x['users']) for x in $R['xrcds']]" "[(True, '$xrcd_file', 0)]"
    expect "DM: 4096 bytes, not imported" "[(m['length'], m['imported']) for m in $R['dms']]" "[(4096, False)]"
    expect "the sender has none of them" "($S['mws'], $S['ahs'], $S['xrcds'], $S['dms'])" "([], [], [], [])"
    evaluate
    stat_json "$sender"
    expect "stat PID: only that process" "[x['pid'] for x in d['processes']]" "[$sender]"
    evaluate
    table=$(timeout 10 "$SOFTVERBS" stat)
    printf '\n$ softverbs stat\n%s\n' "$table"
    check "table: the receiver's QP in RTS with its peer" \
      'grep -Eq "^  qp0 +$rqpn +RC +RTS +1000 +2000 +$sqpn .* $sender +0/8 +2/8 " <<<"$table"'
    check "table: the receiver's CQ" 'grep -Eq "^  cq0 +[0-9]+ +3 +solicited +ch0 +2 +no" <<<"$table"'
    check "table: the bound window" \
      'grep -Eq "^  mw0 +1 +pd0 +0x$(printf %x "$mw_rkey") +mr1 +0x[0-9a-f]+ +512 +REMOTE_READ +- *$" <<<"$table"'
    check "table: the AH" 'grep -Eq "^  ah0 +pd0 +::ffff:[0-9.]+ +0 +0 +1 +3 +9 *$" <<<"$table"'
    check "table: the XRCD" 'grep -Eq "^  xrcd0 +$xrcd_file +0 *$" <<<"$table"'
    check "table: the DM" 'grep -Eq "^  dm0 +4096 +[0-9]+ +no *$" <<<"$table"'
    # An async event nobody takes: the port goes down (IBV_EVENT_PORT_ERR in each process).
    "$SOFTVERBS" port down
    for _ in $(seq 50); do
      json=$(timeout 10 "$SOFTVERBS" stat --json)
      [[ $(q1 "$R['contexts'][0]['async_events_waiting']") == 1 ]] && break
      sleep 0.1
    done
    expect "port down: one async event waiting in each process" \
      "[c['async_events_waiting'] for c in $R['contexts'] + $S['contexts']]" "[1, 1]"
    evaluate
    "$SOFTVERBS" port up
    watch=$(timeout 3 "$SOFTVERBS" stat --watch 0.5 "$receiver")
    check "--watch redraws until stopped" '(( $(grep -c "PID $receiver " <<<"$watch") >= 2 ))'
    ;;
  stopped)
    kill -STOP "$receiver"
    stat_json
    check "answers while the receiver is stopped" '[[ $stat_rc == 0 ]]'
    expect "receiver shown stopped" "$R['status']" stopped
    expect "its live fields still read" \
      "($R['qps'][0]['state'], $R['cqs'][0]['events_not_acked'], $R['cqs'][0]['armed'])" "('RTS', 2, 'solicited')"
    expect "sender still running" "$S['status']" running
    evaluate
    kill -CONT "$receiver"
    ;;
  dead)
    kill -KILL "$sender"
    # Gone, or a zombie (its parent, the receiver, does not reap it).
    for _ in $(seq 50); do
      [[ $(awk '{ print $3 }' "/proc/$sender/stat" 2>/dev/null) =~ ^(Z|)$ ]] && break
      sleep 0.1
    done
    check "the sender's segment remains" '[[ -f $SOFTVERBS_STATE_DIR/stat/$sender ]]'
    stat_json
    check "exit code 0" '[[ $stat_rc == 0 ]]'
    expect "sender shown dead" "$S['status']" dead
    expect "its last published objects shown" "($S['qps'][0]['qp_num'], $S['mrs'][0]['length'])" "($sqpn, 8192)"
    expect "nothing live read from it" \
      "($S['qps'][0]['state'], $S['cqs'][0]['entries'], $S['live_fields'])" "(None, None, False)"
    # Its QP goes to ERR once the library sees the peer gone (engine/progress.cpp).
    expect "receiver still fine" "($R['status'], $R['qps'][0]['state'] in ('RTS', 'ERR'))" "('running', True)"
    evaluate
    table=$(timeout 10 "$SOFTVERBS" stat "$sender")
    printf '\n$ softverbs stat %s\n%s\n' "$sender" "$table"
    check "table: dead, unknown state as ?" 'grep -q "dead" <<<"$table" && grep -Eq "^  qp0 +$sqpn +RC +\? " <<<"$table"'
    ;;
  garbage)
    dir=$SOFTVERBS_STATE_DIR/stat
    head -c 70000 /dev/urandom >"$dir/$$"                 # random bytes, named for a live pid
    : >"$dir/999999"                                       # empty
    printf 'SVSTAT01' >"$dir/999998"                       # a magic, nothing more
    mkdir "$dir/12345"                                     # a directory named as a pid
    # The receiver's own segment, its header kept, its records random bytes with even
    # sequence words and every kind: offsets and addresses that mean nothing.
    python3 - "$dir/$receiver" <<'PY'
import os, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    data = bytearray(f.read())
    header_size, record_size, count = struct.unpack_from("<III", data, 12)
    used = 600
    struct.pack_into("<I", data, header_size - 8, count)  # Header::used: every record
    for i in range(used):
        at = header_size + i * record_size
        data[at:at + record_size] = os.urandom(record_size)
        struct.pack_into("<II", data, at, 2 * i, 1 + i % 7)
    f.seek(0)
    f.write(data)
PY
    stat_json
    check "exit code 0" '[[ $stat_rc == 0 ]]'
    expect "random bytes: invalid" "p($$)['status']" invalid
    expect "empty: invalid" "p(999999)['status']" invalid
    expect "magic only: invalid" "p(999998)['status']" invalid
    expect "a directory: invalid" "p(12345)['status']" invalid
    expect "garbage records: the process shown, no live value trusted" \
      "($R['status'], [q['state'] for q in $R['qps']].count('RTS'))" "('running', 0)"
    expect "the sender is unaffected" "($S['status'], $S['qps'][0]['state'])" "('running', 'RTS')"
    evaluate
    table=$(timeout 10 "$SOFTVERBS" stat)
    table_rc=$?
    check "the table too" '[[ $table_rc == 0 ]] && grep -q "invalid" <<<"$table"'
    printf '%s\n' "$table" | head -30
    timeout 2 "$SOFTVERBS" stat --watch 0.2 >/dev/null
    watch_rc=$?
    check "--watch over garbage runs until stopped (124)" '[[ $watch_rc == 124 ]]'
    ;;
  *)
    echo "unknown mode $MODE"
    exit 2
    ;;
esac

echo "$((checks - failures)) passed, $failures failed"
((failures == 0))
