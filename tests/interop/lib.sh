# Helpers for the interop checks; sourced by each check script, whose first argument is the
# path of the `softverbs` command. A script runs programs with `run`, states what it expects
# with `check`, and ends with `finish`, which fails the test if any check failed.
set -uo pipefail

# shellcheck disable=SC2034 # used by the scripts that source this file
SOFTVERBS=${1:?usage: $0 PATH/TO/softverbs [ARGS...]}
shift
failures=0

# run CMD [ARGS...]: runs CMD; leaves its stdout in $out, its stderr in $err and its exit code
# in $rc, and shows all three in the test log.
run() {
  local out_file err_file
  out_file=$(mktemp)
  err_file=$(mktemp)
  "$@" >"$out_file" 2>"$err_file"
  rc=$?
  out=$(<"$out_file")
  err=$(<"$err_file")
  rm -f "$out_file" "$err_file"
  printf '\n$ %s\n%s\n' "$*" "$out"
  [[ -z $err ]] || printf -- '--- stderr:\n%s\n' "$err"
  printf -- '--- exit code %d\n\n' "$rc"
}

# check DESCRIPTION CONDITION: evaluates the bash CONDITION and reports it.
check() {
  if eval "$2"; then
    echo "ok:   $1"
  else
    echo "FAIL: $1    [$2]"
    failures=$((failures + 1))
  fi
}

# stdout_has REGEX / stderr_has REGEX: an extended regular expression matches a line.
stdout_has() { grep -Eq -- "$1" <<<"$out"; }
stderr_has() { grep -Eq -- "$1" <<<"$err"; }

# No crash and no sanitizer report: neither a fatal signal nor the runtimes' error banners.
no_crash() {
  ((rc < 128 || rc == 124)) &&
    ! grep -Eq 'AddressSanitizer|LeakSanitizer|ThreadSanitizer|runtime error:|Segmentation fault|Aborted' \
      <<<"$out$err"
}

# field NAME: the value of the first "NAME:<tabs>VALUE" line of stdout (ibv_devinfo style).
field() {
  awk -v name="$1:" '{ sub(/^[ \t]+/, ""); n = split($0, f, /\t+/) }
                     n >= 2 && f[1] == name { print f[2]; exit }' <<<"$out"
}

# at_least NAME MIN: field NAME is a decimal number >= MIN.
at_least() {
  local value
  value=$(field "$1")
  [[ $value =~ ^[0-9]+$ ]] && ((10#$value >= $2))
}

# nonzero NAME: field NAME is a non-zero decimal or 0x-hex number (of any width).
nonzero() {
  local value
  value=$(field "$1")
  [[ $value =~ ^(0x[0-9a-fA-F]+|[0-9]+)$ && ! $value =~ ^(0x)?0+$ ]]
}

finish() {
  if ((failures > 0)); then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
}

# without_rping_exit_race TEXT: TEXT less an AddressSanitizer report of rping's own race, which
# is not ours: Debian's rping, on a rejected connect, calls exit() from its CM thread while
# its main thread returns from main, and two threads in glibc 2.36's exit() free its list of
# exit handlers twice. Only a double free whose free and earlier free are both in
# __run_exit_handlers, with no frame of ours (libibverbs, librdmacm, softverbs) in the
# report, is taken out; any other report stays. Prints a note when it takes one out.
without_rping_exit_race() {
  awk '
    /ERROR: AddressSanitizer: attempting double-free/ { inblock = 1; n = 0 }
    inblock { block[++n] = $0
      if ($0 ~ /ABORTING/) {
        exits = 0; ours = 0
        for (i = 1; i <= n; i++) {
          if (block[i] ~ /in __run_exit_handlers/) exits++
          if (block[i] ~ /libibverbs|librdmacm|softverbs/) ours = 1
        }
        if (exits >= 2 && !ours) print "(rping called exit() from two threads: its own race, ASan report left out)"
        else for (i = 1; i <= n; i++) print block[i]
        inblock = 0
      }
      next }
    { print }
    END { if (inblock) for (i = 1; i <= n; i++) print block[i] }' <<<"$1"
}
