#!/usr/bin/env python3
"""Prints the fidelity table of a `scripts/gpu_checks.sh OUT` run as Markdown, from the
`fidelity-<workload>-<i>[-<order>].json` files `allocbench fidelity --json` wrote there: one row
per workload x conf x placement (the GPU's own addresses replayed, or the simulator's `lowest` /
`driver` order), and a count line per placement. GPU-CHECKS.md's table comes from this, never by hand.

    python3 scripts/fidelity_table.py OUT_DIR > fidelity.md
"""
import glob
import json
import os
import re
import sys


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows, totals = [], {}
    for path in sorted(glob.glob(os.path.join(sys.argv[1], "fidelity-*.json"))):
        m = re.match(r"fidelity-(.+)-(\d+)(?:-(lowest|driver))?\.json$", os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            r = json.load(f)
        order = r.get("address_order") or m.group(3) or "replay"
        same = not r["mismatches"]
        t = totals.setdefault(order, [0, 0, 0])
        t[0] += 1
        t[1] += same
        t[2] += bool(r["target_identical"])
        rows.append(f"| {m.group(1)} | `{r['conf'] or '(default)'}` | {order} | {r['snapshots_compared']} | "
                    f"{r['addresses_replayed']} / {r['address_misses']} | {len(r['mismatches'])} | {'yes' if r['target_identical'] else '**no**'} |")
    if not rows:
        print(f"no fidelity-*.json in {sys.argv[1]}", file=sys.stderr)
        return 1
    for order, (n, same, target) in sorted(totals.items()):
        print(f"- placement `{order}`: {same} of {n} cases identical on every key at every snapshot; target keys identical at the end in {target} of {n}.")
    print()
    print("| workload | conf | placement | snapshots | addresses replayed / misses | mismatching (key, snapshot) pairs | target keys identical |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
