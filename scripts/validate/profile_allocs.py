#!/usr/bin/env python3
"""Runs a script on real CPU tensors under torch.profiler(profile_memory=True), with no dispatch
mode, and writes the CPU allocator's calls as a signed-size list: `+N` an allocation of N bytes,
`-N` a free. The untraced reference a fake-tensor capture is checked against (CPU kernel scratch
shows up here and not in a capture).

    python3 profile_allocs.py OUT.txt -- script.py [ARGS...]
"""
import runpy
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    out, rest = sys.argv[1], sys.argv[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    sys.argv = rest
    torch.autograd.set_multithreading_enabled(False)  # the capture runs backward on the calling thread too
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        runpy.run_path(rest[0], run_name="__main__")
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    with open(out, "w") as f:
        for e in events:
            if e.nbytes():
                f.write(f"{e.nbytes():+d}\n")


if __name__ == "__main__":
    main()
