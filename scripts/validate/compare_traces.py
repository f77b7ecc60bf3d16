#!/usr/bin/env python3
"""Compares two v1 traces (.csv or .csv.gz) the way generator calibration is judged: allocations
per step, peak live bytes, and the dominant size classes (log2 buckets by bytes allocated).

    python3 compare_traces.py CAPTURED.csv.gz GENERATED.csv
"""
import gzip
import statistics
import sys
from collections import Counter


def read(path):
    """Steps 2.. (the first also holds initialisation): a capture writes `step,k` after step k's
    optimizer step, a generator at step k's start."""
    opener = gzip.open if path.endswith(".gz") else open
    live, size = 0, {}
    peak = 0
    per_step, current = [], 0
    classes = Counter()
    capture = False
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith("# allocbench capture"):
                capture = True
            if line.startswith("#") or line.startswith("op,"):
                continue
            op, i, b, _ = (line.rstrip("\n").split(",") + ["", "", ""])[:4]
            if op == "alloc":
                n = int(b)
                size[i] = n
                live += n
                peak = max(peak, live)
                current += 1
                classes[n.bit_length() - 1] += n
            elif op == "free":
                live -= size.pop(i)
            elif op == "step":
                per_step.append(current)
                current = 0
    per_step.append(current)
    later = per_step[1:-1] if capture else per_step[2:]
    return {"peak": peak, "per_step": later or per_step, "classes": classes}


def main():
    a, b = read(sys.argv[1]), read(sys.argv[2])
    gib = 1 << 30
    print(f"{'':28}{'first':>16}{'second':>16}{'second/first':>14}")
    ma, mb = statistics.median(a["per_step"]), statistics.median(b["per_step"])
    print(f"{'allocs per step (median)':28}{ma:>16,.0f}{mb:>16,.0f}{mb / ma:>14.3f}")
    print(f"{'peak live (GiB)':28}{a['peak'] / gib:>16.2f}{b['peak'] / gib:>16.2f}{b['peak'] / a['peak']:>14.3f}")
    for name, t in (("first", a), ("second", b)):
        total = sum(t["classes"].values())
        top = ", ".join(f"2^{c}: {100 * v / total:.0f}%" for c, v in t["classes"].most_common(5))
        print(f"dominant size classes ({name}, by bytes): {top}")


if __name__ == "__main__":
    main()
