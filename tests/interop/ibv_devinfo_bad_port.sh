#!/usr/bin/env bash
# Asking ibv_devinfo for port 2 of a one-port device fails cleanly: ibv_devinfo itself
# compares the port with phys_port_cnt, says so and exits 4 without printing the device.
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"

for args in "-i 2" "-d softverbs0 -i 2"; do
  # shellcheck disable=SC2086 # the options are meant to split
  run "$SOFTVERBS" run -- ibv_devinfo $args
  check "ibv_devinfo $args exits 4" '((rc == 4))'
  check "ibv_devinfo $args does not crash" no_crash
  check "ibv_devinfo $args says why" 'stderr_has "^Invalid port requested for device$"'
  check "ibv_devinfo $args prints no device" '! stdout_has hca_id'
done
finish
