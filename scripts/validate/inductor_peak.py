#!/usr/bin/env python3
"""Each compiled graph's peak in a driver trace against Inductor's own estimate for it, from the
markers `capture --backend driver` writes with ALLOCBENCH_INDUCTOR_WINDOWS=1:
  # inductor graph N (KIND): estimate E B, with its wrapper's buffer reuse R B, freeable inputs F B
  # inductor graph N: call   ...   # inductor graph N: return      (around each run)
E is torch/_inductor/memory.py's estimate_peak_memory over the graph's final node order: its
buffers from the step that makes them to the one after their last use, plus the inputs it takes
for freeable (saved activations), held from the start until their last use. R is the same
timeline with the reuse Inductor's wrapper planned afterwards (a `# reuse` line hands a buffer's
memory to the new one at the step that makes it, where E counts both): what the compiled program
holds, and what is checked. The trace's counterpart of a run: the bytes it allocated and still
holds, plus the inputs it really frees (storages live at its call and freed before its return),
each counted until its free row. The BLAS workspaces a matmul takes and gives back (32 MiB
cuBLAS, 1 MiB cuBLASLt in torch 2.15) are left out, as memory.py has no kernel workspaces. The
last run of each graph is used (its first may autotune).
  scripts/validate/inductor_peak.py TRACE [--tolerance 0.02]   (exit 1 when a graph is outside)"""
import argparse
import re
import sys

WORKSPACES = {32 << 20, 1 << 20}
MARK = re.compile(r"# inductor graph (\d+) \((\w+)\): estimate (\d+) B, with its wrapper's buffer reuse (\d+|-) B, freeable inputs (\d+) B")


def runs_of(path):
    """{graph: (kind, estimate, with reuse or None, freeable)}, {graph: [(peak, inputs freed) of each run]}."""
    graphs, runs, live, open_runs = {}, {}, {}, {}
    rows = [line.rstrip("\n") for line in open(path)]
    for i, line in enumerate(rows):
        if line.startswith("#"):
            m = MARK.match(line)
            if m:
                graphs[int(m[1])] = (m[2], int(m[3]), None if m[4] == "-" else int(m[4]), int(m[5]))
            m = re.match(r"# inductor graph (\d+): (call|return)$", line)
            if m and m[2] == "call":
                # ids allocated in the run, their live bytes, and after each row: (those bytes,
                # the bytes of earlier storages the run has freed so far), the storages live at the call
                open_runs[int(m[1])] = [set(), 0, [(0, 0)], set(live)]
            elif m and int(m[1]) in open_runs:
                _, _, series, _ = open_runs.pop(int(m[1]))
                inputs_freed = series[-1][1]
                runs.setdefault(int(m[1]), []).append((max(own + inputs_freed - freed for own, freed in series), inputs_freed))
            continue
        f = line.split(",")
        if f[0] == "alloc":
            size = int(f[2])
            following = rows[i + 1].split(",") if i + 1 < len(rows) else []
            if size in WORKSPACES and following[:2] == ["free", f[1]]:
                continue  # a matmul's workspace, taken and given back
            live[f[1]] = size
            for run in open_runs.values():
                run[0].add(f[1])
                run[1] += size
                run[2].append((run[1], run[2][-1][1]))
        elif f[0] == "free":
            size = live.pop(f[1], 0)
            for run in open_runs.values():
                if f[1] in run[0]:
                    run[0].discard(f[1])
                    run[1] -= size
                    run[2].append((run[1], run[2][-1][1]))
                elif f[1] in run[3]:
                    run[2].append((run[1], run[2][-1][1] + size))
    return graphs, runs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--tolerance", type=float, default=0.02)
    a = p.parse_args()
    graphs, runs = runs_of(a.trace)
    if not graphs:
        sys.exit(f"{a.trace}: no `# inductor graph` markers (capture --backend driver with ALLOCBENCH_INDUCTOR_WINDOWS=1)")
    outside = 0
    print(f"{'graph':>5} {'kind':<9} {'runs':>4} {'trace B':>14} {'reuse B':>14} {'ratio':>7} {'memory.py B':>14} {'ratio':>7} "
          f"{'inputs B':>12} {'freed B':>12}")
    for n, (kind, estimate, reused, freeable) in sorted(graphs.items()):
        seen = runs.get(n)
        if not seen or reused is None:
            print(f"{n:>5} {kind:<9} {len(seen or []):>4} {'-':>14} {reused if reused is not None else '-':>14}")
            outside += 1
            continue
        peak, inputs_freed = seen[-1]
        ratio = peak / reused if reused else float("inf")
        outside += abs(ratio - 1) > a.tolerance
        print(f"{n:>5} {kind:<9} {len(seen):>4} {peak:>14,} {reused:>14,} {ratio:>7.4f} {estimate:>14,} {peak / estimate:>7.4f} "
              f"{freeable:>12,} {inputs_freed:>12,}")
    sys.exit(1 if outside else 0)


if __name__ == "__main__":
    main()
