#!/usr/bin/env bash
# The malloc recorder's overhead (issue #52's measure: at most 2x the program's own run time), a
# timed script rather than a test: each shipped program (workloads/python/*.py, or the programs
# given) runs REPS times plain and REPS times under `allocbench cpu --record`, interleaved; the
# median wall times and their ratio are printed, with the calls recorded and the trace's bytes a
# call.
#   scripts/record_overhead.sh [--reps N] [--python PY] [PROGRAM.py [ARGS...] ...]
# Each PROGRAM.py may be followed by its arguments (up to the next .py); the environment is passed
# on (PYTHONMALLOC=malloc, say). PY: the interpreter (default python3 on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=5
python=$(command -v python3)
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    *) break ;;
  esac
done
# One entry per program: the script and its arguments, tab-separated.
programs=()
for a in "$@"; do
  case "$a" in
    *.py) programs+=("$a") ;;
    *) [ ${#programs[@]} -gt 0 ] || { echo "record_overhead.sh: $a before any PROGRAM.py" >&2; exit 2; }
       programs[-1]+=$'\t'"$a" ;;
  esac
done
[ ${#programs[@]} -gt 0 ] || programs=(workloads/python/*.py)
bin=$(cargo build --release --message-format=json-render-diagnostics 2>/dev/null | sed -n 's/.*"executable":"\([^"]*allocbench\)".*/\1/p' | tail -1)
bin=${bin:-target/release/allocbench}
# The interpreter itself, not a wrapper script (pyenv's shim would be recorded too).
python=$("$python" -c 'import sys; print(sys.executable)')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# "recorded s" is the program's own wall time under the recorder (what the summary says it ran);
# "command s" adds allocbench's turning the spool into the trace after the program exits.
printf '%-22s %10s %12s %7s %11s %7s %12s %12s\n' program "plain s" "recorded s" ratio "command s" ratio calls "bytes/call"
for entry in "${programs[@]}"; do
  IFS=$'\t' read -r -a argv <<< "$entry"
  p=${argv[0]}
  : > "$tmp/plain"; : > "$tmp/rec"; : > "$tmp/prog"
  for _ in $(seq "$reps"); do
    t0=$(now); "$python" "${argv[@]}" > /dev/null 2>&1; t1=$(now)
    echo "$t1 - $t0" | bc >> "$tmp/plain"
    t0=$(now); "$bin" cpu --record -o "$tmp/t.abt" -- "$python" "${argv[@]}" > "$tmp/out" 2>&1; t1=$(now)
    echo "$t1 - $t0" | bc >> "$tmp/rec"
    sed -n 's/^recorded .* over \([0-9.]*\) s,.*/\1/p' "$tmp/out" >> "$tmp/prog"
  done
  plain=$(median < "$tmp/plain"); rec=$(median < "$tmp/rec"); prog=$(median < "$tmp/prog")
  calls=$(sed -n 's/^recorded \([0-9]*\) calls.*/\1/p' "$tmp/out")
  bpc=$(sed -n 's/.*, \([0-9.]*\) bytes a call).*/\1/p' "$tmp/out")
  awk -v n="$(basename "$p")" -v a="$plain" -v p="$prog" -v b="$rec" -v c="$calls" -v d="$bpc" 'BEGIN { printf "%-22s %10.2f %12.2f %7.2f %11.2f %7.2f %12d %12s\n", n, a, p, p / a, b, b / a, c, d }'
done
