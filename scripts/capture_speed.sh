#!/usr/bin/env bash
# The capture's speed on both backends (issue #49's measure: GPT-2-small rows per second), a
# timed script rather than a test: scripts/models/train.py --model gpt2-small, STEPS steps
# (default 10), batch 4, sequence 256..512, captured with --backend fake-tensors and driver.
# Rows per second count the trace's rows over the script's time after start-up (the summary's
# "time:"), so the interpreter's and torch's import are left out; a second line per backend
# gives the wall time of the whole command.
# Then the script's CPU-side work: scripts/models/data_loading.py (a DataLoader with per-sample
# transforms) counts its own seconds producing batches, untraced (--device cpu, no capture) and
# captured on each backend; the issue asks for the driver's within 1.5x of untraced. A ResNet-50
# row per backend follows the GPT-2 rows when torchvision is installed.
#   scripts/capture_speed.sh [STEPS]      (a Python with torch: $ALLOCBENCH_PYTHON or python3)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
bin=$(cargo build --release --message-format=json-render-diagnostics 2>/dev/null | sed -n 's/.*"executable":"\([^"]*allocbench\)".*/\1/p' | tail -1)
bin=${bin:-target/release/allocbench}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-13s %8s %10s %10s %10s\n' backend rows "script s" "rows/s" "wall s"
for backend in fake-tensors driver; do
  start=$(date +%s.%N)
  "$bin" capture --backend "$backend" -o "$tmp/$backend.csv" -- scripts/models/train.py --model gpt2-small \
    --steps "$steps" --batch 4 --seq-len 256..512 > "$tmp/$backend.out" 2> "$tmp/$backend.err"
  end=$(date +%s.%N)
  rows=$(grep -cv '^#' "$tmp/$backend.csv")
  script_s=$(sed -n 's/^time: \([0-9.]*\) s.*/\1/p' "$tmp/$backend.err")
  awk -v b="$backend" -v r="$rows" -v s="$script_s" -v w="$(echo "$end - $start" | bc)" 'BEGIN { printf "%-13s %8d %10.1f %10.0f %10.1f\n", b, r, s, r / s, w }'
done
python=${ALLOCBENCH_PYTHON:-python3}
# A torchvision ResNet-50 (batch 32, bf16 channels-last; cuDNN's convolutions on the driver
# backend's fake cuDNN), when torchvision is there.
if "$python" -c "import torchvision" 2>/dev/null; then
  for backend in fake-tensors driver; do
    "$bin" capture --backend "$backend" -o "$tmp/resnet-$backend.csv" -- tests/fixtures/capture/resnet_train.py resnet50 32 "$steps" amp \
      > /dev/null 2> "$tmp/resnet-$backend.err"
    rows=$(grep -cv '^#' "$tmp/resnet-$backend.csv")
    script_s=$(sed -n 's/^time: \([0-9.]*\) s.*/\1/p' "$tmp/resnet-$backend.err")
    awk -v b="resnet50 $backend" -v r="$rows" -v s="$script_s" 'BEGIN { printf "%-22s %8d %10.1f %10.0f\n", b, r, s, r / s }'
  done
fi
untraced=$("$python" scripts/models/data_loading.py --device cpu | sed -n 's/^loading: \([0-9.]*\) s/\1/p')
printf '\n%-18s %10s %10s\n' "data loading" "loading s" "x untraced"
printf '%-18s %10.2f %10.2f\n' untraced "$untraced" 1
# (--no-sites: the allocator keeps no stack per live block, which Python's collector walks.)
for run in fake-tensors driver "driver --no-sites"; do
  read -r backend flag <<< "$run"
  traced=$("$bin" capture --quiet --backend "$backend" $flag -o "$tmp/loading.csv" -- scripts/models/data_loading.py 2>/dev/null | sed -n 's/^loading: \([0-9.]*\) s/\1/p')
  awk -v b="$run" -v t="$traced" -v u="$untraced" 'BEGIN { printf "%-18s %10.2f %10.2f\n", b, t, t / u }'
done
