#!/usr/bin/env python3
"""Field-by-field comparison of IB CM frames (MADs to QP1 over RoCE v2): for each CM message
type, what rxe sent to rxe (the reference capture, tests/unit/rxe_capture/cm.pcap) beside
what softverbs and rxe sent each other (rxe_interop.sh --capture pcaps). Reads tshark's
dissection (tshark -V), so it needs tshark on the host.
  cm_compare.py REFERENCE.pcap INTEROP.pcap... > notes.md
Prints a markdown table per message type: field | rxe -> rxe | rxe's | softverbs's, a field's
values joined by "/" when frames differ; '*' marks rows where softverbs differs from rxe in
a field that is not per-connection by nature (IDs, PSNs, QPNs, GUIDs, addresses).
tshark (Debian 12's 4.0) misplaces the REQ path's flow label and packet rate: it shows the
flow label's high 12 bits and takes the packet rate from the flow label's low bits, so rxe's
random flow labels look like random packet rates (our codec, checked on the same bytes by
unit.RoceCmFramesTest, reads packet rate 0)."""
import re
import subprocess
import sys
from collections import OrderedDict

# Fields that differ per connection or per host whatever the implementation.
VOLATILE = re.compile(r"Communication ID|Transaction ID|PSN|Packet Sequence|QPN|Q_Key \(|GUID|"
                      r"GID|Address|Identification|Checksum|Invariant CRC|Payload|PrivateData|"
                      r"Source Port|IP CM|Service ID|Destination Port \(|Total Length|Flow Label|"
                      r"Stream index|Time ", re.I)
SKIP = re.compile(r"^\[|^Frame|^Ethernet|^Destination:|^Source:|^Type:|^Header Checksum|^Arrival Time|"
                  r"^Epoch Time|^Capture Length|^Frame Length|^Encapsulation|^Address:|^LG bit|"
                  r"^IG bit|^Internet Protocol|^User Datagram|^MAD Data Payload|^Invariant CRC")
SOFTVERBS_GID = "10.9.0.2"  # the softverbs end of rxe_interop.sh's veth


def frames(path):
    out = subprocess.run(["tshark", "-r", path, "-V"], capture_output=True, text=True).stdout
    for block in out.split("\n\n"):
        lines = [l.strip() for l in block.splitlines()]
        kind = next((l[3:] for l in lines if l.startswith("CM ") and "CM" == l[:2]), None)
        if not kind:
            continue
        src = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("Source Address:")), "")
        fields = OrderedDict()
        for l in lines:
            if ":" not in l or SKIP.search(l):
                continue
            name, value = (s.strip() for s in l.split(":", 1))
            name = re.sub(r"^[.01 ]+= ", "", name)  # bit-field masks
            if name in ("Source Address", "Destination Address"):
                continue
            fields.setdefault(name, value)
        yield kind, src, fields


def collect(paths, who):
    table = OrderedDict()
    for p in paths:
        for kind, src, fields in frames(p):
            side = who(src)
            for name, value in fields.items():
                row = table.setdefault(kind, OrderedDict()).setdefault(name, {})
                vals = row.setdefault(side, [])
                if value not in vals:
                    vals.append(value)
    return table


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    ref, interop = sys.argv[1], sys.argv[2:]
    reference = collect([ref], lambda src: "ref")
    mixed = collect(interop, lambda src: "sv" if src == SOFTVERBS_GID else "rxe")
    for kind in OrderedDict.fromkeys(list(reference) + list(mixed)):
        print(f"\n### {kind}\n")
        print("| field | rxe -> rxe | rxe -> softverbs | softverbs -> rxe |")
        print("|---|---|---|---|")
        names = OrderedDict.fromkeys(list(reference.get(kind, {})) + list(mixed.get(kind, {})))
        for name in names:
            r = "/".join(reference.get(kind, {}).get(name, {}).get("ref", []))
            x = "/".join(mixed.get(kind, {}).get(name, {}).get("rxe", []))
            s = "/".join(mixed.get(kind, {}).get(name, {}).get("sv", []))
            if len(r) > 40 or len(s) > 40 or len(x) > 40:
                r, x, s = (v if len(v) <= 40 else v[:37] + "..." for v in (r, x, s))
            mark = ""
            if s and (r or x) and not VOLATILE.search(name) and s not in (r, x) and \
                    not set(s.split("/")) & set((r + "/" + x).split("/")):
                mark = " *"
            print(f"| {name}{mark} | {r} | {x} | {s} |")


main()
