#!/usr/bin/env python3
"""Rewrites the demo block of README.md from a run of `allocbench demo` (numbers are never typed):
the table exactly as the demo prints it, and the sentence under it from the demo's JSON Lines.

    python3 scripts/readme_demo.py [path/to/allocbench]

tests/readme.rs fails when the README's table differs from what `allocbench demo` prints.
"""
import json
import os
import subprocess
import sys
import tempfile

BEGIN, END = "<!-- demo:begin (scripts/readme_demo.py) -->", "<!-- demo:end -->"
GIB = 1 << 30


def demo_table(stdout):
    """The lines between the first and the second blank line of the demo's output."""
    blocks = stdout.split("\n\n")
    return blocks[1].strip("\n")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(root, "target", "release", "allocbench")
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = os.path.join(tmp, "demo.jsonl")
        out = subprocess.run([exe, "demo", "--jsonl", jsonl], capture_output=True, text=True, check=True, cwd=tmp)
        rows = [json.loads(line) for line in open(jsonl)]
    table = demo_table(out.stdout)
    by_conf = {(r["allocator"], r["conf"]): r for r in rows}
    default, expandable = by_conf[("pytorch", "")], by_conf[("pytorch", "expandable_segments:True")]
    live = default["work"]["peak_live_bytes"] / GIB
    cap = default["capacity"] / GIB

    def fate(r):
        if r["oom"]:
            return f"an OOM at step {r['oom']['step']}"
        return f"{(r['capacity'] - r['summary']['peak_reserved']) / GIB:.1f} GiB from an OOM on the {cap:.1f} GiB card"

    sentence = (
        f"PyTorch's default caching allocator reserves {default['summary']['overhead']:.2f} × what the job holds "
        f"({default['summary']['peak_reserved'] / GIB:.1f} GiB for {live:.1f} GiB live, {default['summary']['device_mallocs']} cudaMallocs, "
        f"{default['stats']['num_alloc_retries']} retries: {fate(default)}); `expandable_segments:True` brings it to "
        f"{expandable['summary']['overhead']:.2f} × ({fate(expandable)})."
    )
    block = f"{BEGIN}\n```\n{table}\n```\n\n{sentence}\n{END}"
    readme = os.path.join(root, "README.md")
    text = open(readme).read()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    open(readme, "w").write(text[:start] + block + text[end:])
    print(block)


if __name__ == "__main__":
    main()
