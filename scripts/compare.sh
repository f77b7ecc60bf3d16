#!/usr/bin/env bash
# Runs CPU workloads under every LD_PRELOAD allocator that is installed (glibc, jemalloc,
# tcmalloc, mimalloc), several repetitions each, and writes a results folder that
# `allocbench report` renders.
#
#   scripts/compare.sh [--quick] [--reps N] [--out DIR] [--threads N] [--cross-thread]
#                      [--scale F] [--iterations N] [WORKLOAD...]
#
# Defaults: workloads/python-objects.toml and workloads/serving-llama7b.toml (scale 1/64),
# 3 repetitions, results in results/compare-<date>/cpu.jsonl.
# An allocator whose library is missing is skipped with a message. Every run passes
# --expect-malloc, so a run is never labelled with an allocator that did not serve it.
# Exit status is non-zero only on a real failure.
set -euo pipefail
cd "$(dirname "$0")/.."

reps=3
out="results/compare-$(date +%Y%m%d-%H%M%S)"
threads=1
cross=""
scale=""
iterations=""
quick=0
workloads=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --reps) reps="$2"; shift ;;
    --out) out="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --cross-thread) cross="--cross-thread" ;;
    --scale) scale="$2"; shift ;;
    --iterations) iterations="$2"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    *) workloads+=("$1") ;;
  esac
  shift
done
if [ ${#workloads[@]} -eq 0 ]; then
  workloads=(workloads/python-objects.toml workloads/serving-llama7b.toml)
fi
if [ "$quick" = 1 ]; then
  reps=1
  iterations="${iterations:-200}"
fi

bin=target/release/allocbench
if [ ! -x "$bin" ] || [ -n "$(find src Cargo.toml -newer "$bin" -print -quit)" ]; then
  cargo build --release --quiet
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
  for name in glibc jemalloc tcmalloc mimalloc; do
    lib="${libs[$name]}"
    if [ -n "$lib" ] && [ ! -f "$lib" ]; then
      echo "skip: $name ($lib not installed; apt-get install ${packages[$name]})"
      continue
    fi
    for rep in $(seq 1 "$reps"); do
      echo "== $(basename "$w") under $name (repetition $rep/$reps)"
      args=(cpu "$w" --allocator system --expect-malloc "$name" --threads "$threads" --scale "$wscale" --jsonl "$jsonl.part")
      [ -n "$cross" ] && args+=("$cross")
      [ -n "$iterations" ] && args+=(--iterations "$iterations")
      rm -f "$jsonl.part"
      if [ -n "$lib" ]; then
        LD_PRELOAD="$lib" "$bin" "${args[@]}"
      else
        "$bin" "${args[@]}"
      fi
      cat "$jsonl.part" >> "$jsonl"
      rm -f "$jsonl.part"
      ran=$((ran + 1))
    done
  done
done
echo "wrote $ran runs to $jsonl"
echo "render: $bin report $jsonl -o reports/<name>/"
