#!/usr/bin/env bash
# Regenerates the published report in reports/comparison/ with the project's own commands:
#   1. GPU: the transformer (1.3B, 7B), model-switching and serving workloads replayed through
#      PyTorch's caching-allocator policy under its default config, tuned configs and expandable
#      segments, plus the no-cache baseline and the ideal bound, on a simulated 80 GB H100.
#   2. CPU: glibc, jemalloc, tcmalloc and mimalloc (LD_PRELOAD, via scripts/compare.sh) on the
#      Python-like and serving workloads (5 repetitions, a 12 s drain) and on the real Python
#      programs in workloads/python/.
#   3. allocbench report renders the charts and the index.
#   4. allocbench diagnose and advise on the 1.3B workload on a 73 GiB card (reports/diagnose-gpt3-73g/).
#   5. README.md's demo block (scripts/readme_demo.py).
# Usage: scripts/publish.sh [--quick]   (--quick: compare.sh --quick, for a smoke test)
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
cargo build --release --quiet
# The binary wherever cargo puts it (CARGO_TARGET_DIR included).
bin="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/allocbench"
work=results/publish
rm -rf "$work"
mkdir -p "$work"

confs=(
  --conf ""
  --conf "expandable_segments:True"
  --conf "max_split_size_mb:512"
  --conf "roundup_power2_divisions:[256:1,512:2,>:4]"
  --conf "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95"
)
for w in gpt3-xl-1.3b llama2-7b-80g model-switch serving-llama7b; do
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
cat "$work"/gpu-*.jsonl > "$work/gpu.jsonl"

cpu_args=()
[ "$quick" = 1 ] && cpu_args=(--quick)
scripts/compare.sh "${cpu_args[@]}" --out "$work/cpu" workloads/python-objects.toml workloads/serving-llama7b.toml workloads/python/*.py

rm -rf reports/comparison
"$bin" report "$work/gpu.jsonl" "$work/cpu/cpu.jsonl" -o reports/comparison \
  --title "allocbench: PyTorch caching allocator configs and CPU allocators on ML workloads"

# 4. Diagnose and advise: the 1.3B workload (71.3 GiB live) on a 73 GiB card, where the defaults OOM
#    and expandable segments fit.
"$bin" diagnose workloads/gpt3-xl-1.3b.toml --capacity 73GiB --jsonl "$work/diagnose.jsonl" > "$work/diagnose.txt"
"$bin" advise workloads/gpt3-xl-1.3b.toml --capacity 73GiB --quiet --jsonl "$work/advise.jsonl" > "$work/advise.txt"
rm -rf reports/diagnose-gpt3-73g
grep '"type":"diagnose"' "$work/diagnose.jsonl" > "$work/diagnosis-only.jsonl"
"$bin" report "$work/diagnosis-only.jsonl" "$work/advise.jsonl" -o reports/diagnose-gpt3-73g \
  --title "allocbench diagnose + advise: GPT-3 XL (1.3B) training on a 73 GiB card"
{ echo; echo '## `allocbench advise` output'; echo; echo '```'; cat "$work/advise.txt"; echo '```'; } >> reports/diagnose-gpt3-73g/README.md
# 5. README's demo block, from a demo run.
python3 scripts/readme_demo.py "$bin" > /dev/null
echo "published reports/comparison/ and reports/diagnose-gpt3-73g/, README demo block"
