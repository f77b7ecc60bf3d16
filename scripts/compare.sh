#!/usr/bin/env bash
# Runs the CPU workloads under every LD_PRELOAD allocator that is installed (glibc, jemalloc,
# tcmalloc, mimalloc), repetitions interleaved (glibc, jemalloc, tcmalloc, mimalloc, glibc, ...),
# and writes a results folder that `allocbench report` renders:
#   - in-process workloads (.toml): `allocbench cpu W --allocator system` under LD_PRELOAD, each
#     run in its own process, with a drain after the last free (retained at 0.1 / 1 / 10 s, then
#     the allocator's own trim);
#   - real programs (.py, plain python3): `allocbench cpu --exec --allocator all -- python3 X.py`;
#   - recorded programs (.abt, .abt.gz from `allocbench cpu --record`): `allocbench cpu TRACE
#     --allocator all --grid --pace recorded`: each allocator's defaults and the usual settings,
#     replayed at the recorded pace, with the drain.
#
#   scripts/compare.sh [--quick] [--reps N] [--drain S] [--out DIR] [--threads N] [--cross-thread]
#                      [--scale F] [--iterations N] [WORKLOAD.toml|TRACE.csv|PROGRAM.py|REC.abt[.gz] ...]
#                      [-- PROGRAM [ARGS...]]
#
# After `--`, the rest is one more program with its arguments: a .py runs under python3, anything
# else as a command (a path, or a name found on PATH). Relative paths are the caller's.
# ALLOCBENCH names the binary (else it is built). Every input is checked before the first run.
# A run that fails (a workload refused, a program exiting non-zero under some allocator) is kept
# with its exit code where allocbench recorded it, and the comparison goes on; the script then
# exits 1 naming the failures. Ctrl-C keeps every finished run in cpu.jsonl and exits 130.
# Defaults: workloads/python-objects.toml, workloads/serving-llama7b.toml (scale 1/64),
# workloads/python/*.py and workloads/recorded/*.abt.gz; 5 repetitions, a 12 s drain; results in results/compare-<date>/cpu.jsonl.
# --quick: 1 repetition, 200 iterations, a 1 s drain and short programs (a smoke test).
# An allocator whose library is missing is skipped with a message. Every in-process run passes
# --expect-malloc and every program run is proven from its mappings, so no run is labelled with
# an allocator that did not serve it. Exit status is non-zero only on a real failure.
set -euo pipefail
caller="$PWD"
repo="$(cd "$(dirname "$0")/.." && pwd)"

usage_error() { echo "compare.sh: $1 (see --help)" >&2; exit 2; }
# A path as the caller meant it: relative to the directory compare.sh was started in.
from_caller() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$caller/$1" ;; esac; }
# The value of option $1, which must be there ($2 = how many words are left, $3 = the value).
value_of() {
  if [ "$2" -lt 2 ] || [ -z "$3" ]; then usage_error "$1 needs a value"; fi
  printf '%s' "$3"
}
positive_integer() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage_error "$1 must be a whole number of at least 1, not '$2'"; }

reps=5
drain=12
out="results/compare-$(date +%Y%m%d-%H%M%S)"
threads=1
cross=""
scale=""
iterations=""
quick=0
workloads=()
programs=()
recorded=()
# The program after `--`, with its arguments.
command_after=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --reps) reps=$(value_of "$1" $# "${2:-}"); positive_integer --reps "$reps"; shift ;;
    --drain) drain=$(value_of "$1" $# "${2:-}"); shift
      [[ "$drain" =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage_error "--drain must be a number of seconds, not '$drain'" ;;
    --out) out=$(value_of "$1" $# "${2:-}"); out=$(from_caller "$out"); shift ;;
    --threads) threads=$(value_of "$1" $# "${2:-}"); positive_integer --threads "$threads"; shift ;;
    --cross-thread) cross="--cross-thread" ;;
    --scale) scale=$(value_of "$1" $# "${2:-}"); shift
      # A number or a fraction (1/64) in (0, 1], as `allocbench cpu --scale` takes it.
      [[ "$scale" =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)(/([0-9]+(\.[0-9]*)?|\.[0-9]+))?$ ]] \
        && awk -v s="$scale" 'BEGIN { n = split(s, p, "/"); v = (n == 2) ? (p[2] > 0 ? p[1] / p[2] : 0) : p[1]; exit !(v > 0 && v <= 1) }' \
        || usage_error "--scale must be a number or fraction in (0, 1], such as 1/64, not '$scale'" ;;
    --iterations) iterations=$(value_of "$1" $# "${2:-}"); positive_integer --iterations "$iterations"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift
      [ $# -gt 0 ] || usage_error "-- needs a program after it"
      command_after=("$@")
      case "$1" in
        */*|*.py) command_after[0]=$(from_caller "$1") ;;
      esac
      break ;;
    -*) usage_error "unknown option $1" ;;
    *.py) programs+=("$(from_caller "$1")") ;;
    *.toml|*.csv|*.csv.gz) workloads+=("$(from_caller "$1")") ;;
    *.abt|*.abt.gz) recorded+=("$(from_caller "$1")") ;;
    *) usage_error "$1 is neither a workload (.toml), a trace (.csv), a recorded program (.abt) nor a program (.py); a program of another kind goes after --" ;;
  esac
  shift
done
if [ -n "$cross" ] && [ "$threads" -lt 2 ]; then
  usage_error "--cross-thread needs --threads 2 or more"
fi
cd "$repo"
if [ ${#workloads[@]} -eq 0 ] && [ ${#programs[@]} -eq 0 ] && [ ${#recorded[@]} -eq 0 ] && [ ${#command_after[@]} -eq 0 ]; then
  workloads=("$repo/workloads/python-objects.toml" "$repo/workloads/serving-llama7b.toml")
  programs=("$repo"/workloads/python/*.py)
  recorded=("$repo"/workloads/recorded/*.abt.gz)
fi
# Every input, before anything is built or run.
for w in "${workloads[@]}" "${recorded[@]}"; do
  [ -f "$w" ] && [ -r "$w" ] || usage_error "no such workload: $w"
done
for p in "${programs[@]}" "${command_after[@]:0:1}"; do
  case "$p" in
    *.py) [ -f "$p" ] && [ -r "$p" ] || usage_error "no such program: $p" ;;
    */*) [ -f "$p" ] && [ -x "$p" ] || usage_error "$p is not an executable file" ;;
    *) command -v "$p" > /dev/null || usage_error "$p: no such command on PATH" ;;
  esac
done
if [ "$quick" = 1 ]; then
  reps=1
  drain=1
  iterations="${iterations:-200}"
fi

# The binary: $ALLOCBENCH if set (as in scripts/slurm/), else built wherever cargo puts it
# (CARGO_TARGET_DIR, a workspace's target/, ...).
if [ -n "${ALLOCBENCH:-}" ]; then
  case "$ALLOCBENCH" in */*) bin=$(from_caller "$ALLOCBENCH") ;; *) bin="$ALLOCBENCH" ;; esac
else
  cargo build --release --quiet
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  bin="$target_dir/release/allocbench"
fi
mkdir -p "$out"
jsonl="$out/cpu.jsonl"
: > "$jsonl"

libdir=/usr/lib/x86_64-linux-gnu
declare -A libs=(
  [glibc]=""
  [jemalloc]="$libdir/libjemalloc.so.2"
  [tcmalloc]="$libdir/libtcmalloc_minimal.so.4"
  [mimalloc]="$libdir/libmimalloc.so.2"
)
declare -A packages=([jemalloc]=libjemalloc2 [tcmalloc]=libtcmalloc-minimal4 [mimalloc]=libmimalloc2.0)
installed=()
for name in glibc jemalloc tcmalloc mimalloc; do
  lib="${libs[$name]}"
  if [ -n "$lib" ] && [ ! -f "$lib" ]; then
    echo "skip: $name ($lib not installed; apt-get install ${packages[$name]})"
  else
    installed+=("$name")
  fi
done

# Ctrl-C reaches the running allocbench too (same process group), which stops and writes what it
# measured: keep that, then stop here instead of going on to the next run. Any other failure is
# remembered and the comparison goes on.
interrupted=0
trap 'interrupted=1' INT
failures=()
ran=0
# Moves a run's results into cpu.jsonl, counting them.
keep_part() {
  if [ -f "$jsonl.part" ]; then
    ran=$((ran + $(grep -c . "$jsonl.part" || true)))
    cat "$jsonl.part" >> "$jsonl"
  fi
  rm -f "$jsonl.part"
}
after_run() {
  local code="$1" what="$2"
  if [ "$interrupted" = 1 ] || [ "$code" = 130 ]; then
    echo "compare.sh: stopped (exit 130); the finished runs are in $jsonl" >&2
    exit 130
  fi
  if [ "$code" != 0 ]; then
    echo "compare.sh: $what failed (exit $code); going on" >&2
    failures+=("$what (exit $code)")
  fi
}

for w in "${workloads[@]}"; do
  wscale="$scale"
  if [ -z "$wscale" ]; then
    case "$(basename "$w")" in
      python-*) wscale=1 ;;
      *) wscale=1/64 ;;
    esac
  fi
  for rep in $(seq 1 "$reps"); do
    for name in "${installed[@]}"; do
      lib="${libs[$name]}"
      echo "== $(basename "$w") under $name (repetition $rep/$reps, drain ${drain} s)"
      args=(cpu "$w" --allocator system --expect-malloc "$name" --threads "$threads" --scale "$wscale" --drain "$drain" --jsonl "$jsonl.part")
      [ -n "$cross" ] && args+=("$cross")
      [ -n "$iterations" ] && args+=(--iterations "$iterations")
      rm -f "$jsonl.part"
      rc=0
      if [ -n "$lib" ]; then
        LD_PRELOAD="$lib" "$bin" "${args[@]}" || rc=$?
      else
        env -u LD_PRELOAD "$bin" "${args[@]}" || rc=$?
      fi
      keep_part
      after_run "$rc" "$(basename "$w") under $name (repetition $rep)"
    done
  done
done

allocators=$(IFS=,; echo "${installed[*]}")
# The interpreter itself, not a wrapper (pyenv's shim is a shell script whose own processes would be
# preloaded too and counted in the program's RSS).
python=""
if [ "${#programs[@]}" -gt 0 ] || [[ "${command_after[0]:-}" == *.py ]]; then
  python=$(python3 -c 'import sys; print(sys.executable)') || { echo "compare.sh: the programs need python3, which did not run" >&2; exit 2; }
fi
# One program (a .py under python3, else a command) with its arguments, under every allocator.
run_program() {
  local name
  name=$(basename "$1")
  local command=("$@")
  case "$name" in *.py) command=("$python" "${command[@]}") ;; esac
  if [ "$reps" = 1 ]; then echo "== $name under $allocators"; else echo "== $name under $allocators ($reps repetitions, interleaved)"; fi
  rm -f "$jsonl.part"
  local rc=0
  "$bin" cpu --exec --allocator "$allocators" --reps "$reps" --jsonl "$jsonl.part" -- "${command[@]}" || rc=$?
  keep_part
  after_run "$rc" "$name"
}
for p in "${programs[@]}"; do
  # Short runs for a smoke test; the programs' defaults otherwise.
  short=()
  if [ "$quick" = 1 ]; then
    case "$(basename "$p")" in
      object_churn.py) short=(--steps 300 --drain 0.3) ;;
      tokenizer_loader.py) short=(--batches 20) ;;
      serving_loop.py) short=(--bursts 3) ;;
    esac
  fi
  run_program "$p" "${short[@]}"
done
if [ ${#command_after[@]} -gt 0 ]; then
  run_program "${command_after[@]}"
fi
for t in "${recorded[@]}"; do
  echo "== $(basename "$t") replayed under $allocators and the usual settings ($reps repetitions, interleaved, drain ${drain} s)"
  rm -f "$jsonl.part"
  rc=0
  "$bin" cpu "$t" --allocator "$allocators" --grid --pace recorded --reps "$reps" --drain "$drain" --jsonl "$jsonl.part" > /dev/null || rc=$?
  keep_part
  after_run "$rc" "$(basename "$t")"
done
echo "wrote $ran runs to $jsonl"
echo "render: $bin report $jsonl -o reports/<name>/"
if [ ${#failures[@]} -gt 0 ]; then
  echo "compare.sh: ${#failures[@]} failed: $(IFS=';'; echo "${failures[*]}" | sed 's/;/; /g'); their runs, where allocbench kept them, are in $jsonl" >&2
  exit 1
fi
