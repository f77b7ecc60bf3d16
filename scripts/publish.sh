#!/usr/bin/env bash
# Regenerates the published reports under reports/ with the project's own commands. Every report
# is rendered only from the results files committed beside it, in reports/<name>/data/, so the
# pages can be re-rendered (and checked) from exactly the numbers they show:
#   1. measure (skipped with --render-only), writing reports/<name>/data/:
#      a. comparison/data/gpu.jsonl.gz: the transformer (1.3B, 1.3B under DDP with a prefetch stream, 7B), model-switching and serving
#         workloads, and the captured 1.3B/7B traces, replayed through PyTorch's caching-allocator
#         policy under its default config, tuned configs and expandable segments, plus the
#         no-cache baseline and the ideal bound, on the default card (H100-80GB, 79.2 GiB: allocbench cards);
#      b. comparison/data/cpu.jsonl.gz: glibc, jemalloc, tcmalloc and mimalloc (LD_PRELOAD, via
#         scripts/compare.sh: repetitions interleaved, 5 each, a 12 s drain) on the Python-like and
#         serving workloads in process, on the real Python programs in workloads/python/, and
#         on the recorded programs in workloads/recorded/ (replayed at their recorded pace with
#         each allocator's defaults and the usual settings);
#      c. diagnose-gpt3-73g/data/: allocbench diagnose and advise on the 1.3B workload on a
#         73 GiB card (diagnose.jsonl.gz, advise.jsonl.gz, advise.txt);
#      d. README.md's demo block (scripts/readme_demo.py) and quick-start block
#         (scripts/readme_quickstart.py: diagnose on the shipped GPT-3 XL capture).
#   2. render: allocbench report re-renders comparison/, diagnose-gpt3-73g/ and gpu-h100/ (whose
#      data/ holds the --device cuda runs and devprobe of scripts/gpu_checks.sh on an H100) from
#      their data/, keeping data/ and gpu-h100/GPU-CHECKS.md.
# Usage: scripts/publish.sh [--quick] [--render-only] [--keep-cpu]
#   --quick: compare.sh --quick: one CPU repetition, 200 iterations, short programs (a smoke test;
#            do not commit its results)
#   --render-only: no measuring; re-render every report from its committed data/
#   --keep-cpu: measure everything but the CPU comparison (1b), whose committed cpu.jsonl.gz stays
#            (for a change that touches only the GPU side: the CPU runs take the longest)
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
measure=1
keep_cpu=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --render-only) measure=0 ;;
    --keep-cpu) keep_cpu=1 ;;
    *) echo "publish.sh: unknown option $arg (use --quick, --render-only or --keep-cpu)" >&2; exit 2 ;;
  esac
done
cargo build --release --quiet
# The binary wherever cargo puts it (CARGO_TARGET_DIR included).
bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/allocbench"

if [ "$measure" = 1 ]; then
  work=results/publish
  rm -rf "$work"
  mkdir -p "$work"
  cmp_data=reports/comparison/data
  diag_data=reports/diagnose-gpt3-73g/data
  if [ "$keep_cpu" = 1 ]; then
    [ -f "$cmp_data/cpu.jsonl.gz" ] || { echo "publish.sh: --keep-cpu, but $cmp_data/cpu.jsonl.gz is missing" >&2; exit 2; }
    rm -f "$cmp_data/gpu.jsonl.gz"
    rm -rf "$diag_data"
  else
    rm -rf "$cmp_data" "$diag_data"
  fi
  mkdir -p "$cmp_data" "$diag_data"

  confs=(
    --conf ""
    --conf "expandable_segments:True"
    --conf "max_split_size_mb:512"
    --conf "roundup_power2_divisions:[256:1,512:2,>:4]"
    --conf "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95"
  )
  for w in gpt3-xl-1.3b gpt3-xl-1.3b-ddp llama2-7b-80g model-switch serving-llama7b; do
    echo "== GPU: $w"
    "$bin" run "workloads/$w.toml" --allocators pytorch,nocache,ideal "${confs[@]}" --jsonl "$work/gpu-$w.jsonl" --quiet
  done
  # The same jobs captured from real PyTorch (scripts/capture_workloads.sh).
  # Named <workload>-captured in the report, beside the generator's runs.
  for t in workloads/captured/*.csv.gz; do
    w=$(basename "$t" .csv.gz)-captured
    cp "$t" "$work/$w.csv.gz"
    echo "== GPU: $w"
    "$bin" run "$work/$w.csv.gz" --allocators pytorch,nocache,ideal "${confs[@]}" --jsonl "$work/gpu-$w.jsonl" --quiet
  done
  cat "$work"/gpu-*.jsonl | gzip -n -9 > "$cmp_data/gpu.jsonl.gz"

  if [ "$keep_cpu" = 0 ]; then
    cpu_args=()
    [ "$quick" = 1 ] && cpu_args=(--quick)
    scripts/compare.sh "${cpu_args[@]}" --out "$work/cpu" workloads/python-objects.toml workloads/serving-llama7b.toml workloads/python/*.py workloads/recorded/*.abt.gz
    gzip -n -9 < "$work/cpu/cpu.jsonl" > "$cmp_data/cpu.jsonl.gz"
  fi

  # Diagnose and advise: the 1.3B workload (71.3 GiB live) on a 73 GiB card, where the defaults
  # OOM and expandable segments fit.
  "$bin" diagnose workloads/gpt3-xl-1.3b.toml --capacity 73GiB --jsonl "$work/diagnose.jsonl" > "$work/diagnose.txt"
  grep '"type":"diagnose"' "$work/diagnose.jsonl" | gzip -n -9 > "$diag_data/diagnose.jsonl.gz"
  "$bin" advise workloads/gpt3-xl-1.3b.toml --capacity 73GiB --quiet --jsonl "$work/advise.jsonl" > "$diag_data/advise.txt"
  gzip -n -9 < "$work/advise.jsonl" > "$diag_data/advise.jsonl.gz"

  # README's demo block, from a demo run, and its quick-start block, from a diagnose run.
  python3 scripts/readme_demo.py "$bin" > /dev/null
  python3 scripts/readme_quickstart.py "$bin" > /dev/null
fi

# Removes everything in a report folder but its data/ and the files named after it.
clear_report() {
  local dir=$1
  shift
  mkdir -p "$dir"
  local keep=(! -name data)
  for k in "$@"; do keep+=(! -name "$k"); done
  find "$dir" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf {} +
}
# Every results file of a report's data/ (JSON Lines or JSON, gzip-compressed or not).
data_files() {
  find "$1/data" -maxdepth 1 \( -name '*.jsonl' -o -name '*.json' -o -name '*.jsonl.gz' \) | sort
}

clear_report reports/comparison first-screen.png
mapfile -t files < <(data_files reports/comparison)
"$bin" report "${files[@]}" -o reports/comparison \
  --title "allocbench: PyTorch caching allocator configs and CPU allocators on ML workloads"
# The comparison's first screen at 1,400 px (tests/browser.rs checks it and that nothing scrolls sideways).
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$browser" ]; then
  profile=$(mktemp -d)
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,900 --user-data-dir="$profile" \
    --screenshot="$PWD/reports/comparison/first-screen.png" "file://$PWD/reports/comparison/index.html" >/dev/null 2>&1
  rm -rf "$profile"
else
  echo "publish.sh: no chromium: reports/comparison/first-screen.png not taken" >&2
fi

clear_report reports/diagnose-gpt3-73g
mapfile -t files < <(data_files reports/diagnose-gpt3-73g)
"$bin" report "${files[@]}" -o reports/diagnose-gpt3-73g \
  --title "allocbench diagnose + advise: GPT-3 XL (1.3B) training on a 73 GiB card"
{ echo; echo '## `allocbench advise` output'; echo; echo '```'; cat reports/diagnose-gpt3-73g/data/advise.txt; echo '```'; } >> reports/diagnose-gpt3-73g/README.md

clear_report reports/gpu-h100 GPU-CHECKS.md
mapfile -t files < <(data_files reports/gpu-h100)
"$bin" report "${files[@]}" -o reports/gpu-h100 \
  --title "allocbench on a real NVIDIA H100: CUDA backend, device latency"

# README.md's findings block: the comparison's findings, as rendered.
python3 scripts/readme_findings.py
echo "published reports/comparison/, reports/diagnose-gpt3-73g/ and reports/gpu-h100/ from their data/$([ "$measure" = 1 ] && echo ', README demo and quick-start blocks')"
