# Helpers shared by bench/run and bench/hosts; sourced.
# shellcheck shell=bash

# idle_percent: percentage of CPU time idle over one second, from /proc/stat's "cpu" line
# (user nice system idle iowait irq softirq steal ...).
idle_percent() {
  local a b total=0 i
  read -r -a a </proc/stat
  sleep 1
  read -r -a b </proc/stat
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  ((total > 0)) || total=1
  echo $((100 * (b[4] + b[5] - a[4] - a[5]) / total))
}

# median: the median of the numbers on stdin, one a line, to 3 decimals.
median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# print_table: "cell|cell|..." rows on stdin (the first the header), printed in aligned columns.
print_table() {
  awk -F'|' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NF }
    END { for (r = 1; r <= NR; r++) { line = ""
            for (i = 1; i <= n; i++) line = line sprintf(i < n ? "%-" w[i] "s  " : "%s", cell[r, i])
            print line } }'
}

# trim TEXT: TEXT without leading and trailing blanks.
trim() {
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  echo "${s%"${s##*[![:space:]]}"}"
}

# Any TCP socket (listening, connected or in TIME_WAIT) on local port $1?
port_busy() {
  [[ -n $(ss -Htan "( sport = :$1 )" 2>/dev/null) ]]
}

port_listening() {
  [[ -n $(ss -Hltn "( sport = :$1 )" 2>/dev/null) ]]
}

# Sets $port to the next port from $next_port on that nothing uses.
take_port() {
  while port_busy "$next_port"; do next_port=$((next_port + 1)); done
  port=$next_port
  next_port=$((next_port + 1))
}

# perftest's result from a client log: the column named $2 of the line under the header.
# Columns are named by header words up to one starting with '#' or ending in ']'
# ("BW average[MB/sec]", "99% percentile[usec]"), so names with spaces survive.
perftest_column() {
  awk -v want="$2" '
    /#bytes/ {
      n = 0; name = ""
      for (i = 1; i <= NF; i++) {
        name = name == "" ? $i : name " " $i
        if ($i ~ /^#/ || $i ~ /\]$/) { col[++n] = name; name = "" }
      }
      header = 1; next
    }
    header && $1 ~ /^[0-9]+$/ {
      for (i = 1; i <= n; i++) if (col[i] == want) { print $i; found = 1; exit }
    }
    END { exit !found }' "$1"
}
