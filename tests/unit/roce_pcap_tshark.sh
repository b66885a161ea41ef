#!/usr/bin/env bash
# tshark reads our pcap writer's frames as RoCE v2: every frame of roce_pcap_sample (one
# packet per opcode) must dissect as InfiniBand with its BTH opcode, with no malformed
# packet and no expert error. Wireshark (4.0) shows the ICRC but does not verify it, so the
# ICRCs are checked here too, by an independent python/zlib implementation of the masking.
# Usage: roce_pcap_tshark.sh SAMPLE_PROGRAM, or roce_pcap_tshark.sh --pcap FILE to check a
# capture made elsewhere (`softverbs trace`; tests/hosts/trace.sh). Exit 77 (skip) without
# tshark. Wireshark's RPC-over-RDMA heuristic takes short SEND payloads for RPC and calls
# them malformed whatever the headers: it is switched off (--disable-protocol rpcordma).
set -euo pipefail
command -v tshark >/dev/null || { echo "tshark not installed: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export HOME=$dir  # tshark wants a writable profile directory
fail() { echo "FAIL: $*"; exit 1; }
tshark() { command tshark --disable-protocol rpcordma "$@"; }
if [[ $1 == --pcap ]]; then
  pcap=$2
  frames=$(tshark -r "$pcap" -n 2>/dev/null | wc -l)
  ((frames > 0)) || fail "no frames in $pcap"
else
  pcap=$dir/roce.pcap
  frames=$("$1" "$pcap")
fi

tshark -r "$pcap" -n -T fields -E separator='|' \
  -e frame.number -e frame.protocols -e infiniband.bth.opcode -e _ws.malformed \
  > "$dir/fields.txt" 2> "$dir/stderr.txt" || { cat "$dir/stderr.txt"; fail "tshark failed"; }
cat "$dir/fields.txt"
got=$(wc -l < "$dir/fields.txt")
[[ $got -eq $frames ]] || fail "$got frames read, $frames written"
while IFS='|' read -r number protocols opcode malformed; do
  [[ $protocols == eth:ethertype:ip*:udp:infiniband* ]] || fail "frame $number: $protocols"
  [[ -n $opcode ]] || fail "frame $number: no BTH opcode"
  [[ -z $malformed ]] || fail "frame $number: malformed"
done < "$dir/fields.txt"

tshark -r "$pcap" -n -V > "$dir/verbose.txt" 2>/dev/null
grep -qi malformed "$dir/verbose.txt" && fail "malformed packets"
grep -q 'Invariant CRC' "$dir/verbose.txt" || fail "no ICRC shown"
tshark -r "$pcap" -n -q -z expert,error > "$dir/expert.txt" 2>/dev/null
grep -Eq '^ *Errors? \(' "$dir/expert.txt" && { cat "$dir/expert.txt"; fail "expert errors"; }

if command -v python3 >/dev/null; then
  python3 - "$pcap" <<'PY' || fail "ICRC check"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
at, n = 24, 0
while at < len(data):
    caplen = struct.unpack_from("<I", data, at + 8)[0]
    f = data[at + 16:at + 16 + caplen]
    at += 16 + caplen
    if f[12:14] == b"\x08\x00":
        ip = bytearray(f[14:34]); ip[1] = 0xff; ip[8] = 0xff; ip[10:12] = b"\xff\xff"; rest = f[34:]
    else:
        ip = bytearray(f[14:54]); ip[0] |= 0x0f; ip[1:4] = b"\xff\xff\xff"; ip[7] = 0xff; rest = f[54:]
    udp = bytearray(rest[:8]); udp[6:8] = b"\xff\xff"
    d = bytearray(rest[8:]); stored = d[-4:]; d = d[:-4]; d[4] = 0xff
    want = zlib.crc32(b"\xff" * 8 + bytes(ip) + bytes(udp) + bytes(d)).to_bytes(4, "little")
    if want != stored:
        sys.exit(f"frame {n + 1}: ICRC {stored.hex()}, expected {want.hex()}")
    n += 1
print(f"{n} ICRCs match (python zlib)")
PY
fi
echo "ok: $frames frames dissected as RoCE v2"
