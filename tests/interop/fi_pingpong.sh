#!/usr/bin/env bash
# libfabric's verbs provider (Debian's libfabric1 1.17, fi_pingpong from libfabric-bin) on
# softverbs0: server and client as two processes on 127.0.0.1, each under `softverbs run`,
# with -p verbs and an endpoint type: msg (FI_EP_MSG: RC QPs connected through rdma_cm, our
# librdmacm), rdm (FI_EP_RDM: the ofi_rxm utility provider over verbs msg endpoints) or
# dgram (FI_EP_DGRAM: UD QPs). -c: both sides check the payload. Exits 77 (skipped)
# without fi_pingpong.
#   fi_pingpong.sh SOFTVERBS PORT LIMIT EP ITERS
# PORT is fi_pingpong's TCP control port (-B on the server, -P on the client).
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/pair.sh"

(($# == 4)) || { echo "usage: $0 SOFTVERBS PORT LIMIT EP ITERS"; exit 2; }
base_port=$1 PAIR_TIMEOUT=$2 ep=$3 iters=$4
command -v fi_pingpong >/dev/null ||
  { echo "skipped: no fi_pingpong (apt-get install libfabric-bin)"; exit 77; }

pair_setup "$base_port"
SOFTVERBS=$(readlink -f -- "$SOFTVERBS")
cd "$pair_tmp" || exit 1 # where a crashing libpsm2 (loaded by libfabric) drops its .btr files
# One message size: the default runs every size up to 8 MiB, minutes here.
options=(-p verbs -e "$ep" -I "$iters" -S 64 -c)
server=("$SOFTVERBS" run -- fi_pingpong "${options[@]}" -B "$port")
client=("$SOFTVERBS" run -- fi_pingpong "${options[@]}" -P "$port" 127.0.0.1)
pair_run
row="^64 +$iters +=$iters +[0-9]"
# ofi_rxm (libfabric 1.17) closes a connection from its CM thread as soon as the peer's
# shutdown arrives, whether or not its data path has read the peer's last message (the
# "fin" of pp_finalize) yet; the survivor then waits for that message forever. The peer
# sends it, sees it completed and leaves, so this needs the survivor's polling thread to
# be off the CPU meanwhile: a loaded machine (docs/libfabric.md). Both sides have printed
# their results by then: run the pair again, twice at most, and say so. Should all three
# hit it, the exit codes are not held against softverbs (the rest is checked as usual).
teardown_race() {
  [[ $ep == rdm ]] && ((srv_rc != 0 || cli_rc != 0)) && side_has srv "$row" && side_has cli "$row"
}
race=0
for attempt in 2 3 last; do
  teardown_race || break
  if [[ $attempt == last ]]; then
    race=1
    echo "ofi_rxm's teardown race three times in a row: exit codes not checked"
  else
    echo "ofi_rxm's teardown race (a side stuck in pp_finalize): running the pair again, attempt $attempt"
    pair_run
  fi
done

# The result table (fabtests' pingpong.c): "bytes #sent #ack total time MB/sec usec/xfer
# Mxfers/sec", then one row per size; "=" before #ack means every message was acknowledged.
for side in srv cli; do
  name=$([[ $side == srv ]] && echo server || echo client)
  check "$name exited 0" "((${side}_rc == 0 || race))"
  check "$name printed the result header" "side_has $side '^bytes +#sent +#ack +total'"
  check "$name sent and got back $iters messages of 64 bytes" "side_has $side '$row'"
  check "$name reported no libfabric error" "! side_has $side '(fi_[a-z_]+\\(\\)|error|Error)'"
done
check "no crash, no sanitizer report" pair_no_crash
finish
