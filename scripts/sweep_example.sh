#!/usr/bin/env bash
# Rewrites the sweep example block of docs/sweeps.md from a real sweep (numbers are never typed): the
# short shipped inputs (the 4-step captured GPT-3 XL and Llama-2-7B traces, a real PyTorch
# snapshot, the model-switching workload and the textbook scenarios) × advise's whole conf space
# (plus nocache and ideal) × 40, 80 and 141 GiB, timed as one shard and as four shards run at
# once on this machine, then checked row for row and ranked by `allocbench advise`.
#
#   scripts/sweep_example.sh [path/to/allocbench]     # about a minute on 2 cores
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${1:-$root/target/release/allocbench}
[ -x "$exe" ] || (cd "$root" && cargo build --release -q)
exe=$(realpath "$exe")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$root"

inputs=(tests/fixtures/gpt3-xl-captured-4-steps.csv.gz tests/fixtures/llama2-7b-captured-4-steps.csv.gz
  tests/fixtures/snapshot-small.pickle workloads/model-switch.toml workloads/scenario-1-2-1-gib.toml workloads/scenario-sawtooth.toml)
"$exe" sweep plan "${inputs[@]}" --confs advise --capacities 40GiB,80GiB,141GiB --allocators pytorch,nocache,ideal \
  -o "$tmp/plan.jsonl" >/dev/null

# Wall and CPU seconds of each phase (bash's `time`: real, user, system of the children).
TIMEFORMAT='%R %U %S'
{ time "$exe" sweep run "$tmp/plan.jsonl" --out "$tmp/one" --shard 0/1 --quiet >/dev/null; } 2>"$tmp/time-one"
four() {
  local pids=() i p
  for i in 0 1 2 3; do
    "$exe" sweep run "$tmp/plan.jsonl" --out "$tmp/four" --shard "$i/4" --quiet >/dev/null &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
}
{ time four; } 2>"$tmp/time-four"
"$exe" sweep merge "$tmp/one" -o "$tmp/one.jsonl" >/dev/null
"$exe" sweep merge "$tmp/four" -o "$tmp/four.jsonl" >/dev/null
"$exe" advise "$tmp/four.jsonl" --top 1 --jsonl "$tmp/best.jsonl" >/dev/null

python3 - "$tmp" "${#inputs[@]}" <<'EOF'
import json, os, sys

tmp, n_inputs = sys.argv[1], int(sys.argv[2])


def timed(name):
    real, user, system = (float(x) for x in open(os.path.join(tmp, name)).read().split()[-3:])
    return real, user + system


(wall1, cpu1), (wall4, cpu4) = timed("time-one"), timed("time-four")
GIB = 1 << 30


def rows(name):
    out = []
    for line in open(os.path.join(tmp, name)):
        r = json.loads(line)
        if r.get("result"):
            r["result"].pop("machine")
            for k in ("elapsed_s", "events_per_s"):
                r["result"]["summary"].pop(k)
        out.append(r)
    return out


one, four = rows("one.jsonl"), rows("four.jsonl")
if one != four:
    sys.exit("the four shards' merge differs from the one-shard run")
if any(r["status"] != "ok" for r in one):
    sys.exit("a row failed")
plan = [json.loads(line) for line in open(os.path.join(tmp, "plan.jsonl"))]
caps = sorted({r["capacity"] for r in plan})
confs = len({r["conf"] for r in plan if r["allocator"] == "pytorch"})

# advise --jsonl writes, per input and capacity, its search, then the defaults' row and the
# recommended one's (once when the defaults are the pick).
best = [r for r in map(json.loads, open(os.path.join(tmp, "best.jsonl"))) if r["type"] == "gpu_replay"]
groups = {}
for r in best:
    groups.setdefault((r["workload"]["name"], r["capacity"]), []).append(r)


def fate(r):
    s = r["summary"]["peak_reserved"] / GIB
    return f"OOM (step {r['oom']['step']})" if r["oom"] else f"{s:.2f} GiB"


table = ["| input | capacity | PyTorch defaults | best conf (`advise`) | best |", "|---|---|---|---|---|"]
for (name, cap), rs in groups.items():
    default, top = rs[0], rs[-1]
    conf = f"`{top['conf']}`" if top["conf"] else "(the defaults)"
    table.append(f"| {name} | {cap / GIB:.0f} GiB | {fate(default)} | {conf} | {fate(top)} |")

text = (
    f"{len(plan)} replays ({n_inputs} inputs × {len(caps)} capacities × ({confs} confs + nocache + ideal)), "
    f"on this {os.cpu_count()}-core machine: **{wall1:.1f} s as one shard** ({cpu1:.1f} CPU s), "
    f"**{wall4:.1f} s as four shards** run at once ({cpu4:.1f} CPU s; they share the same {os.cpu_count()} cores, "
    f"so four shards pay off only across machines, and wall time above CPU time ÷ {os.cpu_count()} is other work on the machine); "
    f"the two merges are equal row for row. `allocbench advise RESULTS.jsonl --top 1` on the merge:\n\n"
    + "\n".join(table)
)
readme = os.path.join(os.getcwd(), "docs", "sweeps.md")
src = open(readme).read()
begin, end = "<!-- sweep:begin (scripts/sweep_example.sh) -->", "<!-- sweep:end -->"
a, b = src.index(begin) + len(begin), src.index(end)
open(readme, "w").write(src[:a] + "\n" + text + "\n" + src[b:])
print(text)
EOF
