#!/usr/bin/env python3
"""Rewrites the benchmark block of docs/benchmarks.md from criterion's results (numbers are never typed).

    cargo bench --bench gpu_policy -- 'captured_1.3b|shredded|advise'
    python3 scripts/bench_readme.py

Reads target/criterion/<group>/<bench>/new/estimates.json (the mean, ns per iteration) and
benchmark.json (the throughput: events or configurations per iteration) for the issue-15 targets,
and writes a table between the bench markers of docs/benchmarks.md. A missing benchmark is an error.
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
    ("sim_policy_replay", "shredded_small_pool/pytorch[default]", "default policy, a small pool shredded into 50,000 free 512-byte holes (one size class)", "events", None),
]
ADVISE_GROUP = "advise"


def load(folder):
    """(mean ns per iteration, elements per iteration) of one criterion benchmark folder."""
    mean, elements = load_interval(folder)
    return mean[0], elements


def load_interval(folder):
    """((mean, lower, upper) ns per iteration: the mean and its 95% confidence bounds, elements
    per iteration) of one criterion benchmark folder."""
    est = os.path.join(folder, "new", "estimates.json")
    if not os.path.exists(est):
        sys.exit(f"bench_readme.py: no criterion results in {folder} (run `cargo bench --bench gpu_policy` first)")
    mean = json.load(open(est))["mean"]
    interval = mean["confidence_interval"]
    meta = json.load(open(os.path.join(folder, "new", "benchmark.json")))
    return (mean["point_estimate"], interval["lower_bound"], interval["upper_bound"]), (meta.get("throughput") or {}).get("Elements")


def bench_dir(root, group, bench):
    # criterion writes an id's '/' as '_' in its folder name.
    return os.path.join(root, "target", "criterion", group, bench.replace("/", "_"))


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lines = [
        "| benchmark | measured | target |",
        "|---|---|---|",
    ]
    for group, bench, what, _unit, target in ROWS:
        (mean_ns, lower_ns, upper_ns), elements = load_interval(bench_dir(root, group, bench))
        rate = elements / (mean_ns / 1e9)
        goal = "-"
        if target:
            op, value, unit = target
            met = rate >= value
            goal = f"{op} {value / 1e6:.0f} M {unit} ({'met' if met else f'missed: {rate / value:.0%} of it'})"
        lines.append(
            f"| {what} | {rate / 1e6:.1f} M events/s ({mean_ns / 1e6:.0f} ms for {elements:,} events; "
            f"95% interval {lower_ns / 1e6:.0f}–{upper_ns / 1e6:.0f} ms) | {goal} |"
        )
    adv = os.path.join(root, "target", "criterion", ADVISE_GROUP)
    benches = sorted(b for b in os.listdir(adv) if b != "report" and b.startswith("captured")) if os.path.isdir(adv) else []
    if not benches:
        sys.exit("bench_readme.py: no criterion results for the advise group")
    for b in benches:
        mean_ns, elements = load(os.path.join(adv, b))
        secs = mean_ns / 1e9
        goal = f"< 60 s for ≥ 1,000 configurations ({'met' if secs < 60 and elements >= 1000 else 'missed'})"
        lines.append(f"| `advise`: {elements:,} configurations, captured 1.3B trace, 80 GiB card, 2 threads | {secs:.1f} s | {goal} |")
    policy, _ = load(bench_dir(root, "captured_1.3b", "policy/pytorch[default]"))
    ideal, _ = load(bench_dir(root, "captured_1.3b", "policy/ideal"))
    cpu = platform.processor() or platform.machine()
    load1, _, load15 = os.getloadavg()
    lines.append("")
    lines.append(
        f"Criterion means on this machine ({os.cpu_count()} cores, {cpu}; load average "
        f"{load1:.1f} over 1 min, {load15:.1f} over 15 min when this table was written{', shared with other builds' if load15 >= 1.5 else ''}): "
        "wall-clock figures scale with the load; "
        f"the default policy takes {policy / ideal:.1f}× the time of the bookkeeping-only replay under the same load."
    )
    block = "\n".join(lines)
    path = os.path.join(root, "docs", "benchmarks.md")
    text = open(path).read()
    if BEGIN not in text or END not in text:
        sys.exit("bench_readme.py: docs/benchmarks.md has no bench markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    open(path, "w").write(f"{head}{BEGIN}\n{block}\n{END}{tail}")
    print(block)


if __name__ == "__main__":
    main()
