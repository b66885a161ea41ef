#!/usr/bin/env python3
"""Garbage for UDP port 4791 (tests/hosts/README.md, hosts.integrity.garbage).

  garbage.py INFO_FILE DST_IP SRC_IP [--seed N] [--count N]   send, print what was sent
  garbage.py --cm DST_IP SRC_IP [--seed N] [--count N]        MADs to QP1 (below)
  garbage.py --self-test PCAP                                  our ICRC against captured frames

INFO_FILE is what `integrity -i` wrote on the server: its QPN, the PSN it expects first,
its canary MR's rkey and address (an MR no legitimate request touches). Sent from SRC_IP (the
client's host, so a connected QP's source check passes) to DST_IP:4791, in rounds of:
  random     random bytes, 0..1472 of them (the veth MTU less IPv4 and UDP)
  truncated  a well-formed request cut short (0 .. length-1 bytes)
  bad_icrc   well-formed requests to the server's QP and canary (WRITE, SEND, FETCH_ADD,
             CMP_SWAP, READ) at PSNs where the live traffic is, with an ICRC that is wrong
             in one bit or wholly random: none may execute
  wrong_qpn  a correct ICRC, a WRITE to the canary, the right rkey, PSNs of the live traffic,
             another QPN
  wrong_psn  a correct ICRC and QPN, WRITE/FETCH_ADD/CMP_SWAP to the canary with its rkey, at
             PSNs far behind (duplicates) or far ahead of the expected one
  wrong_rkey the same with rkeys that are not the canary's
  bad_seq    a correct ICRC and QPN, PSNs far behind or ahead, opcodes out of sequence
             (MIDDLE/LAST without FIRST), of other transports (UC, UD, RD, CNP), reserved,
             responses (ACK, NAK, READ response, ATOMIC ACK) to a QP with nothing outstanding
With --cm (hosts.cm.garbage), rounds of datagrams to QP1 (the host's CM, decision 0007):
  random     random bytes, as above
  gmp_short  a GMP (BTH + DETH to QP1, Q_Key 0x80010000, correct ICRC) whose MAD is cut short
  gmp_random a GMP with 256 random bytes for a MAD
  bad_qkey   a CM MAD to QP1 with another Q_Key
  bad_attr   a CM MAD header (class 7, version 2, Send) with an attribute ID the CM has not
  bad_header a CM MAD with a wrong base version, class version or method
  bad_field  a REJ with an ARI length over 72, a SIDR_REP with additional information over 72
  dead_comm  MRA, REJ, REP, RTU, DREQ, DREP with random bodies naming comm IDs of random
             registry slots (live or dead, any low bits): the receiver finds no connection
  no_service REQ and SIDR_REQ for service IDs nobody listens on (never the live port, which
             would be a legitimate request), with random bodies
Answers (REJ 8, DREP, SIDR_REP) go back to SRC_IP's port 4791, whose CM drops them.

A correct ICRC with the right QPN and the expected PSN would be a legitimate request (RoCE
has no authentication), so those PSNs stay at least 2^22 away from the live ones.

The ICRC (src/wire/roce/icrc.hpp): zlib.crc32 over 8 bytes of 0xff, the IPv4 header with
TOS, TTL and checksum set to ones, the UDP header with its checksum set to ones, the BTH with
byte 4 set to ones, and the rest up to the ICRC; stored least significant byte first. Our
socket sets IP_PMTUDISC_DO, so the kernel sends IPv4 ID 0 with DF, as softverbs does.
"""
import argparse
import random
import socket
import struct
import sys
import zlib

ROCE_PORT = 4791
SRC_PORT = 47910  # fixed, so the ICRCs (which cover it) are the same every run
MASK24 = 0xFFFFFF

# Opcodes (IBA): transport in the top 3 bits.
RC, UC, UD = 0x00, 0x20, 0x60
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM = range(6)
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = range(6, 12)
READ_REQ, READ_RESP_FIRST, READ_RESP_MIDDLE, READ_RESP_LAST, READ_RESP_ONLY = range(12, 17)
ACK, ATOMIC_ACK, CMP_SWAP, FETCH_ADD = 0x11, 0x12, 0x13, 0x14


def bth(opcode, qpn, psn, pad=0, ack_req=True):
    flags = (pad & 3) << 4  # SE 0, M 0, PadCnt, TVer 0
    return struct.pack(">BBHII", opcode, flags, 0xFFFF, qpn & MASK24,
                       (0x80000000 if ack_req else 0) | (psn & MASK24))


def reth(va, rkey, length):
    return struct.pack(">QII", va, rkey, length)


def atomic_eth(va, rkey, swap_add, compare):
    return struct.pack(">QIQQ", va, rkey, swap_add, compare)


def aeth(syndrome, msn):
    return struct.pack(">I", (syndrome << 24) | (msn & MASK24))


def request(opcode, qpn, psn, va=0, rkey=0, payload=b""):
    """A request datagram without its ICRC."""
    op = opcode & 0x1F
    pad = (4 - len(payload) % 4) % 4
    head = bth(opcode, qpn, psn, pad)
    if op in (WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM, READ_REQ):
        head += reth(va, rkey, len(payload) if op != READ_REQ else 64)
    elif op in (CMP_SWAP, FETCH_ADD):
        head += atomic_eth(va, rkey, 1, 0)
    elif op in (ACK, READ_RESP_FIRST, READ_RESP_LAST, READ_RESP_ONLY):
        head += aeth(0x1F, psn)
    elif op == ATOMIC_ACK:
        head += aeth(0x1F, psn) + struct.pack(">Q", 7)
    if op in (SEND_LAST_IMM, SEND_ONLY_IMM, WRITE_LAST_IMM):
        head += b"\0\0\0\x2a"
    if (opcode & 0xE0) == UD:
        head += struct.pack(">II", 0x11111111, 3)  # DETH
    return head + payload + b"\0" * pad


def icrc(src_ip, dst_ip, src_port, body, ip_id=0, df=True):
    """The ICRC of body (the datagram without its ICRC) sent from src_ip:src_port over IPv4."""
    total = len(body) + 4
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xFF, 20 + 8 + total, ip_id, 0x4000 if df else 0,
                     0xFF, 17, 0xFFFF, socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    udp = struct.pack(">HHHH", src_port, ROCE_PORT, 8 + total, 0xFFFF)
    masked = body[:4] + b"\xff" + body[5:]
    return zlib.crc32(b"\xff" * 8 + ip + udp + masked) & 0xFFFFFFFF


def with_icrc(body, src_ip, dst_ip, src_port=SRC_PORT, flip=0):
    return body + struct.pack("<I", icrc(src_ip, dst_ip, src_port, body) ^ flip)


GSI_QKEY = 0x80010000


def gmp(mad, qkey=GSI_QKEY):
    """A GMP datagram without its ICRC: UD SEND_ONLY to QP1 from QP1."""
    return bth(UD | SEND_ONLY, 1, 0) + struct.pack(">II", qkey, 1) + mad


def cm_mad(rng, attr, body=None, base=1, version=2, method=3):
    header = struct.pack(">BBBBHHQHHI", base, 7, version, method, 0, 0, rng.getrandbits(64),
                         attr, 0, 0)
    if body is None:
        body = bytes(rng.getrandbits(8) for _ in range(232))
    return header + body[:232].ljust(232, b"\0")


def cm_garbage(a):
    """Garbage MADs to QP1 (--cm)."""
    rng = random.Random(a.seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_PMTUDISC_DO: DF, ID 0
    sock.bind((a.src, SRC_PORT))
    sent = {}
    cm_attrs = list(range(0x10, 0x1B)) + [0x01]

    def send(kind, body, signed=True):
        sock.sendto(with_icrc(body, a.src, a.dst) if signed else body, (a.dst, ROCE_PORT))
        sent[kind] = sent.get(kind, 0) + 1

    def rand(n):
        return bytes(rng.getrandbits(8) for _ in range(n))

    for _ in range(a.count):
        send("random", rand(rng.randrange(0, 1473)), signed=False)
        send("gmp_short", gmp(cm_mad(rng, rng.choice(cm_attrs))[:rng.randrange(0, 256)]))
        send("gmp_random", gmp(rand(256)))
        send("bad_qkey", gmp(cm_mad(rng, 0x15), qkey=rng.choice([0, 0x80010001, rng.getrandbits(32)])))
        attr = rng.choice([a for a in range(0, 0x40) if a not in cm_attrs] + [0xFFFF, 0x8010])
        send("bad_attr", gmp(cm_mad(rng, attr)))
        bad = rng.choice([dict(base=rng.choice([0, 2, 0x81])), dict(version=rng.choice([0, 1, 3])),
                          dict(method=rng.choice([0x01, 0x02, 0x81, 0x83, 0x7F]))])
        send("bad_header", gmp(cm_mad(rng, rng.choice(cm_attrs), **bad)))
        body = bytearray(rand(232))
        if rng.random() < 0.5:
            body[9] = 0x80 | rng.randrange(73, 128) << 1 & 0xFE | (body[9] & 1)  # REJ ARI length
            send("bad_field", gmp(cm_mad(rng, 0x12, bytes(body))))
        else:
            body[5] = rng.randrange(73, 256)  # SIDR_REP additional information length
            send("bad_field", gmp(cm_mad(rng, 0x18, bytes(body))))
        body = bytearray(rand(232))
        named = (rng.randrange(1, 1024) << 22 | rng.getrandbits(22)).to_bytes(4, "big")
        attr = rng.choice([0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x18])
        at = 0 if attr == 0x18 else 4  # SIDR_REP's request ID, else the remote comm ID
        body[at:at + 4] = named
        send("dead_comm", gmp(cm_mad(rng, attr, bytes(body))))
        body = bytearray(rand(232))
        port = rng.randrange(1, 65536)
        while port in a.live_port:
            port = rng.randrange(1, 65536)
        ps = rng.choice([0x0106, 0x0111, 0x013F, 0x0002])
        body[8:16] = (ps << 16 | port).to_bytes(8, "big")
        send("no_service", gmp(cm_mad(rng, rng.choice([0x10, 0x17]), bytes(body))))
    print("sent " + ", ".join(f"{k} {v}" for k, v in sent.items()) +
          f" to {a.dst}:{ROCE_PORT} QP1 from {a.src}:{SRC_PORT}, seed {a.seed}")
    return 0


def self_test(pcap):
    """Our ICRC against every RoCE v2 frame (Ethernet, IPv4, UDP 4791) of a capture."""
    data = open(pcap, "rb").read()
    endian = "<" if data[:4] == b"\xd4\xc3\xb2\xa1" else ">"
    at, checked = 24, 0
    while at + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[at + 8:at + 12])[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        if len(frame) < 42 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
            continue
        ihl = (frame[14] & 15) * 4
        ip = frame[14:14 + ihl]
        udp = frame[14 + ihl:22 + ihl]
        if struct.unpack(">H", udp[2:4])[0] != ROCE_PORT:
            continue
        ulen = struct.unpack(">H", udp[4:6])[0]
        dgram = frame[22 + ihl:14 + ihl + ulen]
        ip_id, frag = struct.unpack(">HH", ip[4:8])
        want = struct.unpack("<I", dgram[-4:])[0]
        got = icrc(socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20]),
                   struct.unpack(">H", udp[0:2])[0], dgram[:-4], ip_id, bool(frag & 0x4000))
        if got != want:
            print(f"frame at {at}: ICRC {got:08x}, captured {want:08x}")
            return 1
        checked += 1
    print(f"ICRC matches in all {checked} captured RoCE v2 frames")
    return 0 if checked else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("info", nargs="?")
    ap.add_argument("dst", nargs="?")
    ap.add_argument("src", nargs="?")
    ap.add_argument("--seed", type=int, default=4791)
    ap.add_argument("--count", type=int, default=300, help="datagrams of each kind")
    ap.add_argument("--self-test", metavar="PCAP")
    ap.add_argument("--cm", action="store_true", help="MADs to QP1: DST SRC")
    ap.add_argument("--live-port", type=int, action="append", default=[],
                    help="--cm: an rdma_cm port in use, never asked for")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.self_test)
    if a.cm:
        a.src, a.dst = a.dst, a.info  # positional: DST SRC
        return cm_garbage(a)
    info = dict(kv.split("=") for kv in open(a.info).read().split())
    info = {k: int(v) for k, v in info.items()}
    qpn, psn0 = info["qpn"], info["psn"]
    rkey, va = info["canary_rkey"], info["canary_addr"]
    rng = random.Random(a.seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO: DF, ID 0
    sock.bind((a.src, SRC_PORT))
    sent = {}

    def send(kind, dgram):
        sock.sendto(dgram, (a.dst, ROCE_PORT))
        sent[kind] = sent.get(kind, 0) + 1

    def live_psn():  # where the live traffic's PSNs are
        return (psn0 + rng.randrange(0, 60000)) & MASK24

    def far_psn():  # at least 2^22 behind or ahead of any live PSN
        off = rng.randrange(1 << 22, (1 << 23) - 60000)
        return (psn0 - off if rng.random() < 0.5 else psn0 + 60000 + off) & MASK24

    def canary_request(psn, op=None, key=None, dest=qpn):
        op = op if op is not None else rng.choice([WRITE_ONLY, WRITE_ONLY_IMM, WRITE_FIRST,
                                                   SEND_ONLY, FETCH_ADD, CMP_SWAP, READ_REQ])
        length = rng.choice([0, 1, 8, 64, 1024]) if op in (WRITE_ONLY, WRITE_ONLY_IMM,
                                                           SEND_ONLY) else 0
        if op == WRITE_FIRST:
            length = 1024
        off = rng.randrange(0, 65536 - 1024) & ~7
        payload = bytes(rng.getrandbits(8) for _ in range(length))
        return request(RC | op, dest, psn, va + off, rkey if key is None else key, payload)

    for _ in range(a.count):
        send("random", bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 1473))))  # 1500 - IP - UDP
        good = with_icrc(canary_request(live_psn()), a.src, a.dst)
        send("truncated", good[:rng.randrange(0, len(good))])
        flip = 1 << rng.randrange(32) if rng.random() < 0.5 else rng.getrandbits(32) | 1
        send("bad_icrc", with_icrc(canary_request(live_psn()), a.src, a.dst, flip=flip))
        other = qpn
        while other == qpn:
            other = rng.choice([rng.randrange(2, 1 << 24), qpn ^ (1 << rng.randrange(24)), 1])
        send("wrong_qpn", with_icrc(canary_request(live_psn(), WRITE_ONLY, dest=other),
                                    a.src, a.dst))
        send("wrong_psn", with_icrc(canary_request(far_psn()), a.src, a.dst))
        key = rkey
        while key == rkey:
            key = rng.choice([rng.getrandbits(32), rkey ^ (1 << rng.randrange(32)),
                              info["region_rkey"]])
        send("wrong_rkey", with_icrc(canary_request(far_psn(), key=key), a.src, a.dst))
        op = rng.choice([RC | SEND_MIDDLE, RC | SEND_LAST, RC | WRITE_MIDDLE, RC | WRITE_LAST,
                         UC | SEND_ONLY, UC | WRITE_ONLY, UC | SEND_MIDDLE, UD | SEND_ONLY,
                         0x40 | SEND_ONLY, 0x81, 0x15, 0x1F, RC | ACK, RC | ATOMIC_ACK,
                         RC | READ_RESP_ONLY, RC | READ_RESP_MIDDLE])
        body = request(op, qpn, far_psn(), va, rkey, b"\x55" * rng.choice([0, 4, 1024]))
        send("bad_seq", with_icrc(body, a.src, a.dst))
    print("sent " + ", ".join(f"{k} {v}" for k, v in sent.items()) +
          f" to {a.dst}:{ROCE_PORT} (QPN {qpn:#x}) from {a.src}:{SRC_PORT}, seed {a.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
