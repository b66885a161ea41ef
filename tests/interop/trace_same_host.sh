#!/usr/bin/env bash
# shellcheck disable=SC2016 # the awk conditions given to count() are meant literally
# `softverbs trace -w FILE` of same-host traffic: the RoCE v2 packets a NIC would have sent
# for work requests that went through shared memory. Each capture must dissect in tshark as
# InfiniBand over UDP 4791 with no malformed packet, no expert error and valid ICRCs
# (tests/unit/roce_pcap_tshark.sh --pcap), and hold the opcodes its program used:
#   - twoproc_semantics (SEND/WRITE multi-packet, SEND with IMM, READ, atomics, errors);
#   - Debian's ibv_rc_pingpong (SEND + ACK) and ibv_ud_pingpong (UD SEND ONLY, DETH), as a
#     server and a client each traced to its own file;
#   - twoproc_inject (RNR NAKs, lost requests resent with the same PSN, a duplicate ACKed
#     twice, a NAK for the injected REM_ACCESS_ERR).
#   - twoproc_qp_ex (the post-send API: IBA 1.5's ATOMIC WRITE and FLUSH, each answered by
#     an empty RDMA READ RESPONSE ONLY; Wireshark 4.0 names their opcodes "Unknown").
#   - mcast_ud (UD to a multicast group of this host: each send one UD SEND ONLY to the
#     group's address and DestQP 0xFFFFFF, as a NIC would put it on the wire).
#   trace_same_host.sh SOFTVERBS PORT SEMANTICS_TEST INJECT_TEST QP_EX_TEST MCAST_TEST. Exit
#   77 without tshark.
set -euo pipefail
here=$(dirname "$0")
softverbs=$1 port=$2 semantics=$3 inject=$4 qp_ex=$5 mcast=$6
command -v tshark >/dev/null || { echo "skipped: no tshark"; exit 77; }
dir=$(mktemp -d)
export SOFTVERBS_STATE_DIR=$dir/state HOME=$dir
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/fields"
fail() { echo "FAIL: $*"; exit 1; }

# check_pcap FILE OPCODE...: holds each BTH opcode (decimal); its frames' opcode, AETH
# syndrome and DETH Q_Key go to fields/FILE for count. The dissection itself is checked
# once, on all captures merged (tshark takes a second to start).
check_pcap() {
  local pcap=$1 seen op
  shift
  tshark -r "$pcap" -n -T fields -E separator='|' -e infiniband.bth.opcode \
    -e infiniband.aeth.syndrome -e infiniband.deth.q_key >"$dir/fields/$(basename "$pcap")" 2>/dev/null
  seen=" $(cut -d'|' -f1 "$dir/fields/$(basename "$pcap")" | sort -un | tr '\n' ' ')"
  echo "$(basename "$pcap"): $(wc -l <"$dir/fields/$(basename "$pcap")") frames, opcodes$seen"
  for op in "$@"; do
    [[ $seen == *" $op "* ]] || fail "$pcap: no packet with opcode $op"
  done
}

# count PCAP AWK_CONDITION: frames whose fields ($1 opcode, $2 syndrome, $3 Q_Key) match.
count() { awk -F'|' "$2 { n++ } END { print n + 0 }" "$dir/fields/$(basename "$1")"; }

echo "== twoproc_semantics"
"$softverbs" trace -w "$dir/sem.pcap" -- "$semantics" >"$dir/sem.log" 2>&1 ||
  { cat "$dir/sem.log"; fail "twoproc_semantics"; }
# SEND FIRST/MIDDLE/LAST/ONLY/ONLY IMM, WRITE FIRST/MIDDLE/LAST/ONLY, READ request and
# responses (FIRST, MIDDLE, LAST), ACK, ATOMIC ACK, CMP_SWAP, FETCH_ADD.
check_pcap "$dir/sem.pcap" 0 1 2 4 5 6 7 8 10 12 13 14 15 17 18 19 20
(($(count "$dir/sem.pcap" '$2 != "" && $2 >= 96') > 0)) || fail "no NAK for the errors"
# The peer (FILE.PID) answered as a responder only: a valid capture, if an empty one.
for f in "$dir"/sem.pcap.*; do
  [[ $(head -c4 "$f" | od -An -tx4 | tr -d ' ') == a1b23c4d ]] || fail "$f: no pcap header"
done

for prog in ibv_rc_pingpong ibv_ud_pingpong; do
  echo "== $prog"
  p=$((port + RANDOM % 500))
  timeout 20 "$softverbs" trace -w "$dir/$prog-srv.pcap" -- "$prog" -g 0 -n 5 -s 1500 -p "$p" \
    >"$dir/srv.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do [[ -n $(ss -Hltn "sport = :$p") ]] && break; sleep 0.05; done
  timeout 20 "$softverbs" trace -w "$dir/$prog-cli.pcap" -- "$prog" -g 0 -n 5 -s 1500 -p "$p" 127.0.0.1 \
    >"$dir/cli.log" 2>&1 || { cat "$dir/srv.log" "$dir/cli.log"; fail "$prog client"; }
  wait "$server" || { cat "$dir/srv.log"; fail "$prog server"; }
  for side in srv cli; do
    if [[ $prog == ibv_rc_pingpong ]]; then
      check_pcap "$dir/$prog-$side.pcap" 0 2 17  # SEND FIRST, LAST (1500 B, MTU 1024), ACK
    else
      check_pcap "$dir/$prog-$side.pcap" 100  # UD SEND ONLY
      (($(count "$dir/$prog-$side.pcap" '$3 != ""') == 5)) || fail "$prog: not 5 DETHs"
    fi
  done
  if [[ $prog == ibv_rc_pingpong ]]; then
    # Both ends traced, merged: each packet once, written by the process that posted it
    # (docs/trace.md says why the receiving side writes none): 5 messages each way, each
    # SEND FIRST + LAST, and no (opcode, destination QP, PSN) twice.
    mergecap -F pcap -w "$dir/rc-both.merged" "$dir/$prog-srv.pcap" "$dir/$prog-cli.pcap"
    tshark -r "$dir/rc-both.merged" -n -T fields -E separator='|' -e infiniband.bth.opcode \
      -e infiniband.bth.destqp -e infiniband.bth.psn >"$dir/rc-both.fields" 2>/dev/null
    sends=$(awk -F'|' '$1 == 0 || $1 == 2 { n++ } END { print n + 0 }' "$dir/rc-both.fields")
    dups=$(sort "$dir/rc-both.fields" | uniq -d | wc -l)
    echo "both ends merged: $sends SEND packets, $dups duplicated"
    ((sends == 20 && dups == 0)) || fail "merged two-process trace: $sends SEND packets (want 20), $dups duplicates"
  fi
done

echo "== twoproc_inject"
SV_SOFTVERBS=$softverbs "$softverbs" trace -w "$dir/inject.pcap" -- "$inject" >"$dir/inject.log" 2>&1 ||
  { cat "$dir/inject.log"; fail "twoproc_inject"; }
check_pcap "$dir/inject.pcap" 4 17
rnr=$(count "$dir/inject.pcap" '$2 != "" && $2 >= 32 && $2 < 64')
# rnr -n 2 (then ACK) and rnr -n 3 (RNR_RETRY_EXC_ERR): five RNR NAKs.
((rnr == 5)) || fail "$rnr RNR NAKs, not 5"
nak=$(count "$dir/inject.pcap" '$2 == 98')  # NAK, remote access error
((nak == 1)) || fail "$nak remote access NAKs, not 1"
echo "== twoproc_qp_ex"
"$softverbs" trace -w "$dir/qp_ex.pcap" -- "$qp_ex" >"$dir/qp_ex.log" 2>&1 ||
  { cat "$dir/qp_ex.log"; fail "twoproc_qp_ex"; }
# FLUSH (28), ATOMIC WRITE (29), their READ RESPONSE ONLY (16).
check_pcap "$dir/qp_ex.pcap" 16 28 29
flushes=$(count "$dir/qp_ex.pcap" '$1 == 28') awrites=$(count "$dir/qp_ex.pcap" '$1 == 29')
# Two FLUSHes and one ATOMIC WRITE that succeed, one of each refused (REM_ACCESS_ERR).
((flushes == 3 && awrites == 2)) || fail "$flushes FLUSH and $awrites ATOMIC WRITE requests, not 3 and 2"
echo "== mcast_ud"
"$softverbs" trace -w "$dir/mcast.pcap" -- "$mcast" >"$dir/mcast.log" 2>&1 ||
  { cat "$dir/mcast.log"; fail "mcast_ud"; }
check_pcap "$dir/mcast.pcap" 100
# Its three sends to the group (230.0.0.7), one datagram each, whatever the members.
groups=$(tshark -r "$dir/mcast.pcap" -n -T fields -e infiniband.bth.destqp -e ip.dst 2>/dev/null |
  awk '$1 == "0xffffff" && $2 == "230.0.0.7" { n++ } END { print n + 0 }')
((groups == 3)) || fail "$groups datagrams to the group, not 3"
echo "== every capture, merged"
mergecap -F pcap -w "$dir/all.pcap" "$dir"/*.pcap
bash "$here/../unit/roce_pcap_tshark.sh" --pcap "$dir/all.pcap" | tail -2
echo "ok: same-host traces dissect as RoCE v2 ($rnr RNR NAKs, $nak access NAK)"
