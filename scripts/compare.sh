#!/usr/bin/env bash
# Runs the CPU workloads under every LD_PRELOAD allocator that is installed (glibc, jemalloc,
# tcmalloc, mimalloc), repetitions interleaved (glibc, jemalloc, tcmalloc, mimalloc, glibc, ...),
# and writes a results folder that `allocbench report` renders:
#   - in-process workloads (.toml): `allocbench cpu W --allocator system` under LD_PRELOAD, each
#     run in its own process, with a drain after the last free (retained at 0.1 / 1 / 10 s, then
#     the allocator's own trim);
#   - real programs (.py, plain python3): `allocbench cpu --exec --allocator all -- python3 X.py`.
#
#   scripts/compare.sh [--quick] [--reps N] [--drain S] [--out DIR] [--threads N] [--cross-thread]
#                      [--scale F] [--iterations N] [WORKLOAD.toml|PROGRAM.py ...]
#
# ALLOCBENCH names the binary (else it is built). Ctrl-C keeps every finished run in cpu.jsonl
# and exits 130.
# Defaults: workloads/python-objects.toml, workloads/serving-llama7b.toml (scale 1/64) and
# workloads/python/*.py; 5 repetitions, a 12 s drain; results in results/compare-<date>/cpu.jsonl.
# --quick: 1 repetition, 200 iterations, a 1 s drain and short programs (a smoke test).
# An allocator whose library is missing is skipped with a message. Every in-process run passes
# --expect-malloc and every program run is proven from its mappings, so no run is labelled with
# an allocator that did not serve it. Exit status is non-zero only on a real failure.
set -euo pipefail
cd "$(dirname "$0")/.."

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
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --reps) reps="$2"; shift ;;
    --drain) drain="$2"; shift ;;
    --out) out="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --cross-thread) cross="--cross-thread" ;;
    --scale) scale="$2"; shift ;;
    --iterations) iterations="$2"; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    *.py) programs+=("$1") ;;
    *) workloads+=("$1") ;;
  esac
  shift
done
if [ -n "$cross" ] && ! [ "$threads" -ge 2 ] 2>/dev/null; then
  echo "compare.sh: --cross-thread needs --threads 2 or more" >&2
  exit 2
fi
if [ ${#workloads[@]} -eq 0 ] && [ ${#programs[@]} -eq 0 ]; then
  workloads=(workloads/python-objects.toml workloads/serving-llama7b.toml)
  programs=(workloads/python/*.py)
fi
if [ "$quick" = 1 ]; then
  reps=1
  drain=1
  iterations="${iterations:-200}"
fi

# The binary: $ALLOCBENCH if set (as in scripts/slurm/), else built wherever cargo puts it
# (CARGO_TARGET_DIR, a workspace's target/, ...).
if [ -n "${ALLOCBENCH:-}" ]; then
  bin="$ALLOCBENCH"
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
# measured: keep that, then stop here instead of going on to the next run.
interrupted=0
trap 'interrupted=1' INT
stop_if_interrupted() {
  if [ "$interrupted" = 1 ] || [ "$1" != 0 ]; then
    local code="$1"
    if [ "$code" = 0 ]; then code=130; fi
    echo "compare.sh: stopped (exit $code); the finished runs are in $jsonl" >&2
    exit "$code"
  fi
}

ran=0
for w in "${workloads[@]}"; do
  if [ ! -f "$w" ]; then echo "compare.sh: no such workload: $w" >&2; exit 2; fi
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
      if [ -f "$jsonl.part" ]; then cat "$jsonl.part" >> "$jsonl"; fi
      rm -f "$jsonl.part"
      stop_if_interrupted "$rc"
      ran=$((ran + 1))
    done
  done
done

allocators=$(IFS=,; echo "${installed[*]}")
# The interpreter itself, not a wrapper (pyenv's shim is a shell script whose own processes would be
# preloaded too and counted in the program's RSS).
python=""
if [ "${#programs[@]}" -gt 0 ]; then
  python=$(python3 -c 'import sys; print(sys.executable)') || { echo "compare.sh: the programs need python3, which did not run" >&2; exit 2; }
fi
for p in "${programs[@]}"; do
  if [ ! -f "$p" ]; then echo "compare.sh: no such program: $p" >&2; exit 2; fi
  # Short runs for a smoke test; the programs' defaults otherwise.
  short=()
  if [ "$quick" = 1 ]; then
    case "$(basename "$p")" in
      object_churn.py) short=(--steps 300 --drain 0.3) ;;
      tokenizer_loader.py) short=(--batches 20) ;;
      serving_loop.py) short=(--bursts 3) ;;
    esac
  fi
  echo "== $(basename "$p") under $allocators ($reps repetitions, interleaved)"
  rm -f "$jsonl.part"
  rc=0
  "$bin" cpu --exec --allocator "$allocators" --reps "$reps" --jsonl "$jsonl.part" -- "$python" "$p" "${short[@]}" || rc=$?
  if [ -f "$jsonl.part" ]; then cat "$jsonl.part" >> "$jsonl"; fi
  rm -f "$jsonl.part"
  stop_if_interrupted "$rc"
  ran=$((ran + reps * ${#installed[@]}))
done
echo "wrote $ran runs to $jsonl"
echo "render: $bin report $jsonl -o reports/<name>/"
