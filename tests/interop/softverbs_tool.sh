#!/usr/bin/env bash
# The `softverbs` command itself: subcommand dispatch, the environment `run` gives a program,
# and the installed copy finding the installed library.
# Arguments: PATH/TO/softverbs CMAKE_COMMAND BUILD_DIR LIB_DIR SANITIZE
# shellcheck disable=SC2016,SC2034 # check() evaluates its condition strings later
source "$(dirname "$0")/lib.sh"
cmake_command=$1 build_dir=$2 lib_dir=$(readlink -f "$3") sanitize=${4-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

run "$SOFTVERBS" help
check "help exits 0" '((rc == 0))'
check "help shows usage" 'stdout_has "^Usage: softverbs COMMAND"'
check "help names the library directory" 'grep -Fxq "Library directory: $lib_dir" <<<"$out"'
run "$SOFTVERBS" --help
check "--help exits 0" '((rc == 0))'
run "$SOFTVERBS"
check "no command: usage, exit 2" '((rc == 2)) && stderr_has "^Usage:"'
run "$SOFTVERBS" frobnicate
check "unknown command: exit 2" '((rc == 2))'
check "unknown command: says which" 'stderr_has "unknown command .frobnicate."'
run "$SOFTVERBS" run
check "run without a program: exit 2" '((rc == 2)) && [[ -n $err ]]'
run "$SOFTVERBS" run -- softverbs-no-such-program
check "run of a missing program: exit 127" '((rc == 127))'

run env -u LD_LIBRARY_PATH "$SOFTVERBS" run -- printenv LD_LIBRARY_PATH
check "run puts the library directory on LD_LIBRARY_PATH" '[[ $out == "$lib_dir" ]]'
run env LD_LIBRARY_PATH=/opt/a:/opt/b "$SOFTVERBS" run printenv LD_LIBRARY_PATH
check "run (without --) keeps the old LD_LIBRARY_PATH after ours" \
  '[[ $out == "$lib_dir:/opt/a:/opt/b" ]]'
run "$SOFTVERBS" run -- false
check "run passes the exit code through" '((rc == 1))'
# Run no shell under the wrapper here: gcc 12's preloaded TSan runtime crashes programs that
# call setjmp (bash, dash, python), though not the RDMA programs.
run "$SOFTVERBS" run -- printenv LD_LIBRARY_PATH
run env LD_LIBRARY_PATH="$out" ldd /usr/bin/ibv_devinfo
check "ibv_devinfo resolves libibverbs.so.1 to ours" \
  '[[ $out == *"libibverbs.so.1 => $lib_dir/libibverbs.so.1 "* ]]'

# sanitizer_env VAR: VAR as `softverbs run` sets it when the caller had no sanitizer settings.
sanitizer_env() {
  run env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS "$SOFTVERBS" run -- printenv "$1"
}
case $sanitize in
  address)
    sanitizer_env LD_PRELOAD
    check "ASan build: preloads libasan, then libubsan" \
      '[[ $out =~ ^/[^:]*/libasan\.so[^:]*:/[^:]*/libubsan\.so[^:]*$ ]]'
    sanitizer_env ASAN_OPTIONS
    check "ASan build: no leak checks of foreign programs by default" '[[ $out == *detect_leaks=0* ]]'
    run env ASAN_OPTIONS=detect_leaks=1 "$SOFTVERBS" run -- printenv ASAN_OPTIONS
    check "ASan build: the user's ASAN_OPTIONS come last and so win" '[[ $out == *:detect_leaks=1 ]]'
    ;;
  thread)
    sanitizer_env LD_PRELOAD
    check "TSan build: preloads libtsan" '[[ $out =~ ^/[^:]*/libtsan\.so[^:]*$ ]]'
    ;;
  *)
    for variable in LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS; do
      sanitizer_env $variable
      check "plain build: no $variable" '((rc == 1)) && [[ -z $out ]]'
    done
    ;;
esac

run "$SOFTVERBS" devices
devices_out=$out devices_rc=$rc
run "$SOFTVERBS" run -- ibv_devices
check "devices is run -- ibv_devices" '[[ $out == "$devices_out" && $rc == "$devices_rc" ]]'

# The installed layout: PREFIX/bin/softverbs finds PREFIX/lib/softverbs, also through a link.
run "$cmake_command" --install "$build_dir" --prefix "$scratch/prefix"
check "cmake --install succeeds" '((rc == 0))'
installed_lib=$scratch/prefix/lib/softverbs
check "the library is installed to lib/softverbs" '[[ -e $installed_lib/libibverbs.so.1 ]]'
ln -s "$scratch/prefix/bin/softverbs" "$scratch/softverbs-link"
for tool in "$scratch/prefix/bin/softverbs" "$scratch/softverbs-link"; do
  run env -u LD_LIBRARY_PATH "$tool" run -- printenv LD_LIBRARY_PATH
  check "$(basename "$tool") uses the installed library" '[[ $out == "$installed_lib" ]]'
done
rm "$installed_lib/libibverbs.so.1"
run "$scratch/prefix/bin/softverbs" run -- true
check "run without a built library: exit 1 and says so" \
  '((rc == 1)) && stderr_has "libibverbs\\.so\\.1 not found"'
finish
