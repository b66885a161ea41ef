#!/usr/bin/env python3
"""Counts the RoCE v2 packets of a `softverbs trace -w` capture (tests/hosts/cm_hosts.sh).

  roce_count.py PCAP

Prints one line, "gmp N data M": N datagrams to QP1 (the IB CM's MADs, BTH DestQP 1), M
to any other QP (the connection's data, ACKs and READ responses). A missing or empty file
counts as no packets: softverbs writes the file only once it sees RoCE v2 traffic, and a
same-host connection has none. Frames that are not Ethernet/IPv4-or-IPv6/UDP to or from
port 4791, or too short for a BTH, are not counted.
"""
import struct
import sys

ROCE_PORT = 4791
BTH_BYTES = 12


def udp_payload(frame):
    """The UDP payload of an Ethernet frame to or from port 4791, or None."""
    if len(frame) < 14:
        return None
    ethertype = frame[12:14]
    if ethertype == b"\x08\x00" and len(frame) >= 34 and frame[23] == 17:
        at = 14 + (frame[14] & 15) * 4
    elif ethertype == b"\x86\xdd" and len(frame) >= 54 and frame[20] == 17:
        at = 54
    else:
        return None
    if len(frame) < at + 8:
        return None
    sport, dport, length = struct.unpack(">HHH", frame[at:at + 6])
    if ROCE_PORT not in (sport, dport) or length < 8:
        return None
    return frame[at + 8:at + length]


def count(path):
    try:
        data = open(path, "rb").read()
    except FileNotFoundError:
        return 0, 0
    if len(data) < 24:
        return 0, 0
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    gmp = other = 0
    at = 24
    while at + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[at + 8:at + 12])[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        payload = udp_payload(frame)
        if payload is None or len(payload) < BTH_BYTES:
            continue
        dest_qp = struct.unpack(">I", payload[4:8])[0] & 0xFFFFFF
        if dest_qp == 1:
            gmp += 1
        else:
            other += 1
    return gmp, other


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    gmp, other = count(sys.argv[1])
    print(f"gmp {gmp} data {other}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
