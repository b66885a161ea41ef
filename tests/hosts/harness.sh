#!/usr/bin/env bash
# The two-host harness itself (netns.sh): both namespaces come up with their addresses,
# reach each other over IPv4 and IPv6 and nothing else, faults apply and clear, a link goes
# down and up, and `hosts_down` leaves nothing behind. Exits 77 (skipped) without root.
#   harness.sh SOFTVERBS
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
for tool in ping nft tc; do
  command -v $tool >/dev/null || { echo "FAIL: no $tool (scripts/bootstrap installs it)"; exit 1; }
done
hosts_exit_cleanup
hosts_up || exit 1

# reaches X ADDRESS: one ping from host X gets its answer (half a second at most).
reaches() { in_host "$1" ping -c 1 -W 0.5 "$2" >/dev/null 2>&1; }
# addr_of X: host X's addresses on the veth, "ADDR/LEN" one a line, with flags.
addr_of() { ip -n "$(host_var "$1" NS)" -o addr show dev "$HOSTS_IF"; }

for x in A B; do
  run ip -n "$(host_var $x NS)" -o addr show
  check "host $x: namespace $(host_var $x NS) exists" "[[ -e /run/netns/$(host_var $x NS) ]]"
  check "host $x: lo is up with 127.0.0.1" \
    "[[ \$out =~ lo\ +inet\ 127\.0\.0\.1/8 && \$(ip -n $(host_var $x NS) -o link show lo) == *,UP,* ]]"
  check "host $x: $(host_var $x IP4)/24 on $HOSTS_IF" \
    "grep -q ' inet $(host_var $x IP4)/24 ' <<<\"\$(addr_of $x)\""
  check "host $x: $(host_var $x IP6)/64 on $HOSTS_IF, not tentative" \
    "grep ' inet6 $(host_var $x IP6)/64 ' <<<\"\$(addr_of $x)\" | grep -vq tentative"
  check "host $x: MTU 1500 by default" \
    "[[ \$(ip -n $(host_var $x NS) -o link show $HOSTS_IF) == *' mtu 1500 '* ]]"
  check "host $x: state directory $(host_var $x STATE)" "[[ -d $(host_var $x STATE) ]]"
  run in_host $x printenv SOFTVERBS_STATE_DIR
  check "host $x: in_host exports its SOFTVERBS_STATE_DIR" "[[ \$out == $(host_var $x STATE) ]]"
done
check "the two state directories differ" '[[ $HOST_A_STATE != "$HOST_B_STATE" ]]'
check "the machine's own namespace has none of the addresses" \
  "! ip -o addr show | grep -qE ' ($HOST_A_IP4|$HOST_B_IP4|$HOST_A_IP6|$HOST_B_IP6)/'"

check "A reaches B over IPv4" 'reaches A $HOST_B_IP4'
check "A reaches B over IPv6" 'reaches A $HOST_B_IP6'
check "B reaches A over IPv4" 'reaches B $HOST_A_IP4'
check "B reaches A over IPv6" 'reaches B $HOST_A_IP6'

# Faults. netem where the kernel has it (some VM kernels do not); nftables drops always.
if netem_available; then
  run netem A loss 100%
  check "netem applies" '((rc == 0)) && [[ $(ip netns exec $HOST_A_NS tc qdisc show dev $HOSTS_IF) == *netem*"loss 100%"* ]]'
  check "with netem loss 100% on A, A does not reach B" '! reaches A $HOST_B_IP4'
  run netem A clear
  check "netem clears" '[[ $(ip netns exec $HOST_A_NS tc qdisc show dev $HOSTS_IF) != *netem* ]]'
  check "with netem cleared, A reaches B" 'reaches A $HOST_B_IP4'
else
  echo "note: this kernel has no netem qdisc; checking that netem says so"
  run netem A loss 100%
  check "netem fails loudly without the qdisc" '((rc != 0)) && [[ -n $err ]]'
fi
run drop A 100
check "drop 100% applies" '((rc == 0))'
check "with all of A's packets dropped, A does not reach B" '! reaches A $HOST_B_IP6'
check "with all of A's packets dropped, B does not reach A" '! reaches B $HOST_A_IP4'
drop A clear
check "drop clears: A reaches B" 'reaches A $HOST_B_IP4'
run drop B 100 udp dport 4791
check "a drop rule for RoCE v2 only (udp dport 4791) applies" '((rc == 0))'
check "... and leaves ping alone" 'reaches B $HOST_A_IP4'
drop B clear
check "after drop clear B has no fault table" '! ip netns exec $HOST_B_NS nft list table inet svh_faults >/dev/null 2>&1'

# A link down and up again.
run link A down
check "link A down" '((rc == 0))'
check "with A's link down, B does not reach A" '! reaches B $HOST_A_IP4'
link A up
hosts_wait_carrier
check "with A's link up again, B reaches A over IPv4" 'reaches B $HOST_A_IP4'
check "... and IPv6, the static address kept" 'reaches B $HOST_A_IP6'

# Up again (idempotent) with another MTU.
HOSTS_MTU=9000 hosts_up
check "up again with HOSTS_MTU=9000: both ends at 9000" \
  '[[ $(ip -n $HOST_A_NS -o link show $HOSTS_IF) == *" mtu 9000 "* &&
     $(ip -n $HOST_B_NS -o link show $HOSTS_IF) == *" mtu 9000 "* ]]'
check "... and A reaches B with an 8000-byte unfragmented ping" \
  'in_host A ping -c 1 -W 0.5 -M do -s 8000 $HOST_B_IP4 >/dev/null'

# Teardown: a process left running in A goes too, and nothing is left. The sleeper runs
# detached (no job of ours), so nobody waits for it but init.
(in_host A sleep 60 >/dev/null 2>&1 &)
for ((i = 0; i < 40; i++)); do
  sleeper=$(ip netns pids "$HOST_A_NS")
  [[ -n $sleeper ]] && break
  sleep 0.05
done
check "a process runs in A" '[[ $sleeper =~ ^[0-9]+$ ]]'
hosts_down
gone() { [[ ! -e /proc/$1 ]]; }
for ((i = 0; i < 40; i++)); do
  gone "$sleeper" && break
  sleep 0.05
done
check "down: no namespace of this pair left" \
  '! ip netns list | grep -qE "^($HOST_A_NS|$HOST_B_NS)( |$)"'
check "down: the process in A has ended" 'gone $sleeper'
check "down: no state directory left" '[[ ! -e $hosts_state_root ]]'
check "down: no veth left in the machine's namespace" "! ip -o link show | grep -q ' ${HOSTS_IF}[@:]'"
check "down again succeeds (idempotent)" 'hosts_down'

# The command line, with its own id.
netns_cli=$(dirname "$0")/netns.sh
run bash "$netns_cli" --id "$HOSTS_ID-cli" up
check "netns.sh up exits 0" '((rc == 0))'
check "netns.sh list shows it" "bash $netns_cli list | grep -qx svh-$HOSTS_ID-cli-a"
run bash "$netns_cli" --id "$HOSTS_ID-cli" in_host B ping -c 1 -W 0.5 "$HOST_A_IP6"
check "netns.sh in_host B pings A" '((rc == 0))'
run bash "$netns_cli" --id "$HOSTS_ID-cli" down
check "netns.sh down removes it" "((rc == 0)) && ! bash $netns_cli list | grep -q svh-$HOSTS_ID-cli-"
bash "$netns_cli" --id "$HOSTS_ID-cli" down # whatever failed above
finish
