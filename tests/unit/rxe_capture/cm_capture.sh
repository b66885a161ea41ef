#!/usr/bin/env bash
# Captures Linux rxe's IB CM frames (MADs to QP1 over RoCE v2) for tests/unit/roce_cm_frames.inc,
# in the guest of shared/tools/rxe-vm. rxe 6.1 receives only in the root network namespace,
# so both ends are rxe devices there, on the two ends of a veth (rxe1 on vrxe 10.9.0.1,
# rxe2 on vsv 10.9.0.2); policy routing sends traffic between the two local addresses
# through the veth instead of lo, so every frame crosses it and cap sees it.
# From the project root:
#   mkdir -p /tmp/cm-cap && cc -O2 -o /tmp/cm-cap/cap tests/unit/rxe_capture/cap.c
#   cc -O2 -o /tmp/cm-cap/cm_peer tests/unit/rxe_capture/cm_peer.c -lrdmacm -libverbs
#   cp tests/unit/rxe_capture/cm_capture.sh /tmp/cm-cap/
#   RXE_VM_LINKS= ../shared/tools/rxe-vm/run.sh -s /tmp/cm-cap -t 400 ./cm_capture.sh
# leaves /tmp/cm-cap/cm.pcap; rxe_capture/cm_to_inc.py turns it into the .inc.
set -ux
ip link add vrxe type veth peer name vsv
ip addr add 10.9.0.1/24 dev vrxe && ip addr add 10.9.0.2/24 dev vsv
ip -6 addr add fd00:9::1/64 dev vrxe nodad && ip -6 addr add fd00:9::2/64 dev vsv nodad
ip link set vrxe up && ip link set vsv up
for k in all default vrxe vsv; do
  sysctl -qw net.ipv4.conf.$k.accept_local=1 net.ipv4.conf.$k.rp_filter=0
done
# Locally generated packets (iif lo) to the other end's address leave by the veth; packets that
# arrive on the veth still find their address in the local table (moved from pref 0 to 100).
for v in -4 -6; do
  ip $v rule add pref 100 lookup local && ip $v rule del pref 0
done
ip rule add pref 50 iif lo to 10.9.0.1 lookup 101
ip rule add pref 50 iif lo to 10.9.0.2 lookup 102
ip route add 10.9.0.1 dev vsv src 10.9.0.2 table 101
ip route add 10.9.0.2 dev vrxe src 10.9.0.1 table 102
ip -6 rule add pref 50 iif lo to fd00:9::1 lookup 101
ip -6 rule add pref 50 iif lo to fd00:9::2 lookup 102
ip -6 route add fd00:9::1 dev vsv src fd00:9::2 table 101
ip -6 route add fd00:9::2 dev vrxe src fd00:9::1 table 102
mac() { cat /sys/class/net/$1/address; }
ip -6 neigh add fd00:9::1 lladdr "$(mac vrxe)" dev vsv nud permanent
ip -6 neigh add fd00:9::2 lladdr "$(mac vsv)" dev vrxe nud permanent
rdma link add rxe1 type rxe netdev vrxe
rdma link add rxe2 type rxe netdev vsv
sleep 1
ibv_devinfo -v | grep -E 'hca_id|GID'
./cap vsv cm.pcap 300 & cap=$!
sleep 1

# 1. RC connection, 3 pings, disconnect: REQ, REP, RTU, DREQ, DREP.
timeout 60 rping -s -a 10.9.0.1 -p 7471 -C 3 & sleep 2
timeout 60 rping -c -a 10.9.0.1 -I 10.9.0.2 -p 7471 -C 3 -v; wait $!
# 2. Nobody listens on the port: REJ.
timeout 20 rping -c -a 10.9.0.1 -I 10.9.0.2 -p 7999 -C 1
# 3. A listener that rejects, with private data both ways: REJ reason 28.
timeout 30 ./cm_peer reject 10.9.0.1 7472 & sleep 2
timeout 30 ./cm_peer connect 10.9.0.2 10.9.0.1 7472; wait $!
# 4. A listener that is slow to accept: the REQ is resent and answered with an MRA.
timeout 120 rping -s -a 10.9.0.1 -p 7473 -C 1 & srv=$!; sleep 2
rping=$(pgrep -P $srv)  # rping itself, not its timeout
kill -STOP $rping
timeout 100 rping -c -a 10.9.0.1 -I 10.9.0.2 -p 7473 -C 1 -v & cli=$!
sleep 12
kill -CONT $rping
wait $cli; wait $srv
# 5. SIDR to a port with no UD listener, then to one: SIDR_REQ, SIDR_REP (status 1, then 0).
timeout 20 udaddy -s 10.9.0.1 -b 10.9.0.2 -C 1
timeout 60 udaddy -b 10.9.0.1 -C 1 & sleep 2
timeout 60 udaddy -s 10.9.0.1 -b 10.9.0.2 -C 1; wait $!
# 6. The same RC connection over IPv6: cma_hdr with IPv6 addresses.
timeout 60 rping -s -a fd00:9::1 -p 7474 -C 1 & sleep 2
timeout 60 rping -c -a fd00:9::1 -I fd00:9::2 -p 7474 -C 1 -v; wait $!
sleep 1
kill $cap; wait $cap
rdma statistic show link rxe1/1 | tr ' ' '\n' | paste - - | grep -v ' 0$'
ls -l cm.pcap
