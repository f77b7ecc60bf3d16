#!/usr/bin/env python3
"""Rewrites the benchmark block of README.md from criterion's results (numbers are never typed).

    cargo bench --bench gpu_policy -- 'captured_1.3b|advise'
    python3 scripts/bench_readme.py

Reads target/criterion/<group>/<bench>/new/estimates.json (the mean, ns per iteration) and
benchmark.json (the throughput: events or configurations per iteration) for the issue-15 targets,
and writes a table between the README's bench markers. A missing benchmark is an error.
"""
import json
import os
import platform
import sys

BEGIN, END = "<!-- bench:begin (scripts/bench_readme.py) -->", "<!-- bench:end -->"

# (criterion group, bench id, what it measures, unit of the throughput, target per second or seconds)
ROWS = [
    ("captured_1.3b", "policy/pytorch[default]", "default policy replay, 1.3B captured trace, one core", "events", ("≥", 20e6, "events/s")),
    ("captured_1.3b", "policy/ideal", "bookkeeping only (`ideal` policy), same trace", "events", None),
    ("captured_1.3b", "replay_cli_end_to_end", "`allocbench replay` of the CSV end to end (parse, replay, JSON)", "events", ("≥", 10e6, "events/s")),
]
ADVISE_GROUP = "advise"


def load(root, group, bench):
    d = os.path.join(root, "target", "criterion", group, bench.replace("/", "_").replace("[", "_").replace("]", "_"))
    # criterion keeps the id's characters in the folder name on Linux except '/', which nests.
    candidates = [os.path.join(root, "target", "criterion", group, *bench.split("/")), d]
    for c in candidates:
        est = os.path.join(c, "new", "estimates.json")
        if os.path.exists(est):
            mean_ns = json.load(open(est))["mean"]["point_estimate"]
            meta = json.load(open(os.path.join(c, "new", "benchmark.json")))
            elements = (meta.get("throughput") or {}).get("Elements")
            return mean_ns, elements
    sys.exit(f"bench_readme.py: no criterion results for {group}/{bench} (run `cargo bench --bench gpu_policy` first)")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lines = [
        "| benchmark | measured | target |",
        "|---|---|---|",
    ]
    for group, bench, what, _unit, target in ROWS:
        mean_ns, elements = load(root, group, bench)
        rate = elements / (mean_ns / 1e9)
        goal = "-"
        if target:
            op, value, unit = target
            met = rate >= value
            goal = f"{op} {value / 1e6:.0f} M {unit} ({'met' if met else f'missed: {rate / value:.0%} of it'})"
        lines.append(f"| {what} | {rate / 1e6:.1f} M events/s ({mean_ns / 1e6:.0f} ms for {elements:,} events) | {goal} |")
    adv = os.path.join(root, "target", "criterion", ADVISE_GROUP)
    benches = sorted(b for b in os.listdir(adv) if b != "report") if os.path.isdir(adv) else []
    if not benches:
        sys.exit("bench_readme.py: no criterion results for the advise group")
    for b in benches:
        sub = os.path.join(adv, b)
        inner = [x for x in os.listdir(sub) if os.path.isdir(os.path.join(sub, x)) and x != "report" and x != "new" and x != "base"]
        bench = b + ("/" + "/".join([inner[0]] + sorted(os.listdir(os.path.join(sub, inner[0])))[:0]) if inner else "")
        mean_ns, elements = load_nested(sub)
        s = mean_ns / 1e9
        goal = f"< 60 s for ≥ 1,000 configurations ({'met' if s < 60 and elements >= 1000 else 'missed'})"
        lines.append(f"| `advise`: {elements:,} configurations, captured 1.3B trace, 80 GiB, 2 threads ({b}) | {s:.1f} s | {goal} |")
    cpu = platform.processor() or platform.machine()
    lines.append("")
    lines.append(f"Criterion means on this machine ({os.cpu_count()} cores, {cpu}), other builds sharing it: wall-clock figures vary with the load.")
    block = "\n".join(lines)
    path = os.path.join(root, "README.md")
    text = open(path).read()
    if BEGIN not in text or END not in text:
        sys.exit("bench_readme.py: README.md has no bench markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    open(path, "w").write(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    print(block)


def load_nested(folder):
    """The one estimates.json under `folder` (criterion nests ids with '/')."""
    for dirpath, _dirs, files in os.walk(folder):
        if os.path.basename(dirpath) == "new" and "estimates.json" in files:
            mean_ns = json.load(open(os.path.join(dirpath, "estimates.json")))["mean"]["point_estimate"]
            meta = json.load(open(os.path.join(dirpath, "benchmark.json")))
            return mean_ns, (meta.get("throughput") or {}).get("Elements")
    sys.exit(f"bench_readme.py: no estimates under {folder}")


if __name__ == "__main__":
    main()
