#!/usr/bin/env bash
# The checks that need a GPU, in one go (run it on a machine with an NVIDIA GPU and PyTorch):
#   1. allocbench devprobe                      device allocation latency by size
#   2. --device cuda replays                    caching vs no-cache vs CUDA's async pool
#   3. compute-sanitizer memcheck --leak-check  the CUDA backend frees everything
#   4. fidelity                                 torch_replay.py vs the simulator, per workload x conf
#   5. make_snapshot.py                         real memory snapshots for the test fixtures
#   6. the CUDA benchmark group
# Usage: scripts/gpu_checks.sh OUT_DIR [PART...]  (parts: probe cuda sanitizer fidelity snapshot bench;
# default all; FIDELITY_WORKLOADS="a b" limits the fidelity part). ALLOCBENCH=path/to/allocbench and CUDA_BENCH=path/to/cuda_backend bench binary
# may point at prebuilt binaries (the GPU machine may have no Rust toolchain).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/gpu_checks.sh OUT_DIR [PART...]}"
shift
parts="${*:-probe cuda sanitizer fidelity snapshot bench}"
bin="${ALLOCBENCH:-target/release/allocbench}"
mkdir -p "$out"
has() { [[ " $parts " == *" $1 "* ]]; }
fail=0
run() { echo "+ $*"; "$@" || { echo "FAILED ($?): $*"; fail=1; }; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" || true

if has probe; then
  run "$bin" devprobe --reps 30 --json "$out/devprobe.json"
fi
if has cuda; then
  for w in scenario-1-2-1-gib model-switch gpt3-xl-1.3b; do
    run "$bin" run "workloads/$w.toml" --device cuda --allocators pytorch,nocache,async --conf "" --conf expandable_segments:True --jsonl "$out/cuda-$w.jsonl" -q
  done
  if [ -f "$out/devprobe.json" ]; then
    run "$bin" run workloads/model-switch.toml --allocators pytorch,nocache --sim-latency "$out/devprobe.json" --jsonl "$out/sim-latency-model-switch.jsonl" -q
  fi
fi
if has sanitizer; then
  if command -v compute-sanitizer >/dev/null; then
    for conf in "" "expandable_segments:True"; do
      run compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 "$bin" replay workloads/model-switch.toml --device cuda --conf "$conf" -q
    done
  else
    echo "skipped: compute-sanitizer not found"
  fi
fi
if has fidelity; then
  confs=("" "expandable_segments:True" "max_split_size_mb:512" "roundup_power2_divisions:[256:1,512:2,>:4]" "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95")
  for w in ${FIDELITY_WORKLOADS:-scenario-1-2-1-gib scenario-sawtooth model-switch gpt3-xl-1.3b gpt3-xl-1.3b-ddp llama2-7b-80g serving-llama7b}; do
    "$bin" trace "workloads/$w.toml" -o "$out/$w.csv"
    for i in "${!confs[@]}"; do
      python3 scripts/torch_replay.py "$out/$w.csv" --conf "${confs[$i]}" -o "$out/torch-$w-$i.json" || { echo "FAILED: torch_replay $w ${confs[$i]}"; fail=1; continue; }
      run "$bin" fidelity "$out/$w.csv" --torch-json "$out/torch-$w-$i.json" --json "$out/fidelity-$w-$i.json"
      # The default path (no history to replay): the simulator's own placement, each order.
      for order in lowest driver; do
        "$bin" fidelity "$out/$w.csv" --torch-json "$out/torch-$w-$i.json" --address-order "$order" --json "$out/fidelity-$w-$i-$order.json" > /dev/null || true
      done
    done
    rm -f "$out/$w.csv"
  done
  # The table GPU-CHECKS.md shows, from the JSON just written (commit the JSON with it).
  python3 scripts/fidelity_table.py "$out" > "$out/fidelity.md" || fail=1
fi
if has snapshot; then
  run python3 scripts/make_snapshot.py "$out/snapshots"
fi
if has bench; then
  if [ -n "${CUDA_BENCH:-}" ]; then
    run "$CUDA_BENCH" --bench --quick
  else
    run cargo bench --bench cuda_backend -- --quick
  fi
fi
exit $fail
