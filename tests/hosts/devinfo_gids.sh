#!/usr/bin/env bash
# `softverbs run -- ibv_devinfo -v` on each of the two hosts (netns.sh) lists that host's own
# addresses as RoCE v2 GIDs (its veth's IPv4 as ::ffff:a.b.c.d and its IPv6 ULA) and
# neither the other host's nor the machine's, in a NIC's order: the veth IPv4 as GID 0 (what
# UCX and perftest take with no setting), ::ffff:127.0.0.1 after it, IPv6 last. Exits 77
# (skipped) without root.
#   devinfo_gids.sh SOFTVERBS
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/../interop/lib.sh"
source "$(dirname "$0")/netns.sh"

why=$(hosts_supported) || { echo "skipped: $why"; exit 77; }
hosts_exit_cleanup
hosts_up || exit 1

# ibv_devinfo prints each GID as "\t\t\tGID[%3d]:\t\t<address>, <type>" (rdma-core 44,
# devinfo.c); IPv4-mapped GIDs as ::ffff:a.b.c.d.
tab=$'\t'
gid_line() { printf '^%s%s%sGID\\[ *%s\\]:%s%s%s, RoCE v2$' "$tab" "$tab" "$tab" "$1" "$tab" "$tab" "$2"; }
gid_count() { grep -cE -- "$(gid_line '[0-9]+' "$1")" <<<"$out"; }
# The machine's own (not loopback) addresses, which no host may show.
mapfile -t machine_addrs < <(ip -o addr show | awk '$2 != "lo" { sub(/\/.*/, "", $4); print $4 }')

for x in A B; do
  y=$([[ $x == A ]] && echo B || echo A)
  own4=$(host_var $x GID4) own6=$(host_var $x IP6) peer4=$(host_var "$y" GID4) peer6=$(host_var "$y" IP6)
  run in_host $x "$SOFTVERBS" run -- ibv_devinfo -v
  check "host $x: exits 0" '((rc == 0))'
  check "host $x: no crash, no sanitizer report" no_crash
  check "host $x: link_layer Ethernet" '[[ $(field link_layer) == Ethernet ]]'
  check "host $x: every GID line has the format" \
    '(($(grep -c "GID\[" <<<"$out") == $(gid_count "[^,]+") && $(gid_count "[^,]+") > 0))'
  check "host $x: GID[0] is its veth IPv4 $own4 (the first IPv4 GID reaches other hosts)" \
    "stdout_has '$(gid_line 0 "${own4//./\\.}")'"
  check "host $x: ::ffff:127.0.0.1 once (same-host programs that name it)" \
    "((\$(gid_count '::ffff:127\.0\.0\.1') == 1))"
  lo_index=$(gid_index_of "$SOFTVERBS" $x ::ffff:127.0.0.1)
  first6=$(host_gids "$SOFTVERBS" $x | awk '$2 !~ /^::ffff:/ { print $1; exit }')
  check "host $x: loopback (GID $lo_index) after the veth IPv4, before IPv6 (first: $first6)" \
    '[[ $lo_index =~ ^[1-9][0-9]*$ ]] && { [[ -z $first6 ]] || ((lo_index < first6)); }'
  check "host $x: its veth IPv4 address once, as $own4" "((\$(gid_count '${own4//./\\.}') == 1))"
  check "host $x: its IPv6 ULA once, as $own6" "((\$(gid_count '$own6') == 1))"
  check "host $x: not host $y's IPv4 address ($peer4)" "((\$(gid_count '${peer4//./\\.}') == 0))"
  check "host $x: not host $y's IPv6 address ($peer6)" "((\$(gid_count '$peer6') == 0))"
  for addr in "${machine_addrs[@]}"; do
    [[ $addr == *:* ]] || addr=::ffff:$addr
    check "host $x: not the machine's $addr" "((\$(gid_count '${addr//./\\.}') == 0))"
  done
  check "host $x: gid_tbl_len covers the listed GIDs" \
    '(($(field gid_tbl_len) >= $(gid_count "[^,]+")))'
  index=$(gid_index_of "$SOFTVERBS" $x "$own4")
  check "host $x: gid_index_of finds $own4 (index '$index')" '[[ $index =~ ^[0-9]+$ ]]'
  echo "host $x: GID index of $own4 is $index (-g $index for the pingpongs, -x $index for perftest)"
done
finish
