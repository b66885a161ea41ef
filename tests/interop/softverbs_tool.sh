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

# /dev/infiniband/uverbs-softverbs0 for UCX (docs/ucx.md): a 0:0 character device, mode 0666,
# in the program's own mount namespace; the host's /dev stays as it was, /dev/null still works.
node=/dev/infiniband/uverbs-softverbs0
node_stat=(stat -c '%F %t:%T %a' "$node")
if [[ -e $node ]]; then
  echo "this host has $node itself: the dev-node checks do not apply"
else
  run "$SOFTVERBS" run -- "${node_stat[@]}"
  check "run: the program sees $node, a 0:0 character device with mode 666" \
    '((rc == 0)) && [[ $out == "character special file 0:0 666" ]]'
  check "run: not on the host" '[[ ! -e $node ]]'
  # Device files open (a tmpfs made in a user namespace is nodev; the bound originals are not).
  run "$SOFTVERBS" run -- cat /dev/null
  check "run: /dev/null still opens" '((rc == 0))'
  run "$SOFTVERBS" run -- head -c 3 /dev/urandom
  check "run: /dev/urandom still reads" '((rc == 0))'
  run "$SOFTVERBS" run -- pwd -P
  check "run: the program starts in our working directory" '[[ $out == "$(pwd -P)" ]]'
  run "$SOFTVERBS" run --no-dev-node -- "${node_stat[@]}"
  check "run --no-dev-node: no node" '((rc != 0))'
  run env SOFTVERBS_DEV_NODE=0 "$SOFTVERBS" run -- "${node_stat[@]}"
  check "SOFTVERBS_DEV_NODE=0: no node" '((rc != 0))'
  # Not root: a user namespace too, and the program still runs as its own user.
  as_nobody=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)
  if ((EUID == 0)) && "${as_nobody[@]}" "$SOFTVERBS" version >/dev/null 2>&1 &&
    "${as_nobody[@]}" unshare -Ur true 2>/dev/null; then
    run "${as_nobody[@]}" "$SOFTVERBS" run -- "${node_stat[@]}"
    check "as nobody: the node is there" '[[ $out == "character special file 0:0 666" ]]'
    run "${as_nobody[@]}" "$SOFTVERBS" run -- cat /dev/null
    check "as nobody: /dev/null still opens" '((rc == 0))'
    run "${as_nobody[@]}" "$SOFTVERBS" run -- id -u
    check "as nobody: the program runs as nobody, not as a namespace's root" \
      '[[ $out == "$(id -u nobody)" ]]'
  else
    echo "not root, or nobody cannot run $SOFTVERBS or make user namespaces: skipping the nobody checks"
  fi
  # Where no namespace may be made (here: a user namespace that allows no more of them, and no
  # capabilities), one line says so and the program runs all the same.
  if unshare -Ur true 2>/dev/null; then
    run unshare -Ur bash -c 'echo 0 >/proc/sys/user/max_user_namespaces &&
      exec setpriv --bounding-set -all --inh-caps -all -- "$0" run -- printenv LD_LIBRARY_PATH' \
      "$SOFTVERBS"
    check "no namespaces: the program still runs, with our library" '((rc == 0)) && [[ $out == "$lib_dir"* ]]'
    check "no namespaces: one line says why and how to skip it" \
      '[[ $(wc -l <<<"$err") == 1 ]] && stderr_has "no private /dev here .*--no-dev-node"'
  fi
fi

# The installed layout: PREFIX/bin/softverbs finds PREFIX/lib/softverbs, also through a link.
run "$cmake_command" --install "$build_dir" --prefix "$scratch/prefix"
check "cmake --install succeeds" '((rc == 0))'
installed_lib=$scratch/prefix/lib/softverbs
check "the library is installed to lib/softverbs" '[[ -e $installed_lib/libibverbs.so.1 ]]'
check "softverbs-dev-node is installed beside it" '[[ -x $installed_lib/softverbs-dev-node ]]'
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
