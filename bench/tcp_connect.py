#!/usr/bin/env python3
"""TCP connect latency, the floor bench/hosts holds rdma_cm's connect against.

  tcp_connect.py serve PORT [BIND_ADDR]        accept and close connections until killed
  tcp_connect.py connect ADDR PORT [-n COUNT]  COUNT connects, one after another; prints
                                               "tcp_connect MEDIAN_US us (min .. max, n COUNT)"

Each connect is a new socket: connect() returns once the SYN/SYN-ACK exchange is done (the
kernel's handshake, as rdma_cm's REQ/REP), then the socket is closed. Timed with
time.perf_counter_ns around connect() alone.
"""
import socket
import statistics
import sys
import time


def serve(port, bind_addr):
    with socket.create_server((bind_addr, port), backlog=1024, reuse_port=False) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        while True:
            conn, _ = srv.accept()
            conn.close()


def connect(addr, port, count):
    times = []
    for _ in range(count):
        s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
        start = time.perf_counter_ns()
        s.connect((addr, port))
        times.append((time.perf_counter_ns() - start) / 1000)
        s.close()
    print(f"tcp_connect {statistics.median(times):.1f} us "
          f"(min {min(times):.1f} .. max {max(times):.1f}, n {count})")


def main(argv):
    if len(argv) >= 2 and argv[0] == "serve":
        serve(int(argv[1]), argv[2] if len(argv) > 2 else "")
    elif len(argv) >= 3 and argv[0] == "connect":
        count = int(argv[argv.index("-n") + 1]) if "-n" in argv else 200
        connect(argv[1], int(argv[2]), count)
    else:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
