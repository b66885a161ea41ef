#!/usr/bin/env bash
# Captures real rxe RoCE v2 frames for the ICRC and decode tests (tests/unit/roce_rxe_frames.inc),
# in the guest of shared/tools/rxe-vm: rxe on one end of a veth pair (root namespace,
# 10.9.0.1), our prober and the capture on the other end (namespace sv, 10.9.0.2).
# From the project root, after building roce_rxe_prober in build-roce-packet:
#   cc -O2 -o /tmp/rxe-cap/cap tests/unit/rxe_capture/cap.c
#   cc -O2 -o /tmp/rxe-cap/rxe_side tests/unit/rxe_capture/rxe_side.c -libverbs
#   cp build-roce-packet/tests/unit/roce_rxe_prober /tmp/rxe-cap/
#   cp tests/unit/rxe_capture/capture.sh /tmp/rxe-cap/
#   RXE_VM_LINKS= ../shared/tools/rxe-vm/run.sh -s /tmp/rxe-cap -t 300 ./capture.sh
# leaves /tmp/rxe-cap/rxe.pcap; tests/unit/rxe_capture/to_inc.py turns it into the .inc.
set -ux
ip netns add sv
ip link add vrxe type veth peer name vsv
ip link set vsv netns sv
ip addr add 10.9.0.1/24 dev vrxe && ip link set vrxe up
ip -n sv addr add 10.9.0.2/24 dev vsv && ip -n sv link set vsv up && ip -n sv link set lo up
rdma link add rxe1 type rxe netdev vrxe
sleep 1
ip netns exec sv ./cap vsv rxe.pcap 14 &
sleep 1
./rxe_side rxe1 10.9.0.1 10.9.0.2 info.txt 10 &
sleep 2
ip netns exec sv ./roce_rxe_prober info.txt 10.9.0.2 10.9.0.1
wait
rdma statistic show link rxe1/1 2>/dev/null | tr ' ' '\n' | paste - - | grep -v ' 0$'
ls -l rxe.pcap
