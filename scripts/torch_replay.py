#!/usr/bin/env python3
"""Replays an allocbench CSV trace (v1) through PyTorch's real CUDA caching allocator.

Every `alloc` becomes torch.empty(bytes, dtype=torch.uint8, device="cuda") on the trace's stream
(0 = the default stream, others get a torch.cuda.Stream each), every `free` drops the tensor,
`empty_cache` calls torch.cuda.empty_cache(), `record_stream,ID,,S` calls
tensor.record_stream(stream S) and keeps S busy (torch.cuda._sleep) so that its events complete
only at the trace's `sync,,,S` (S.synchronize(); `sync,,,` is torch.cuda.synchronize()), as the
simulator models it, `pool_begin`/`pool_end`/`pool_release` call the allocator's
beginAllocateToPool/endAllocateToPool/releasePool (torch._C bindings, without a real capture: the
allocator's capture-only rules, no process_events and no cache flush, are not exercised here), and at
every `step` row (before it) and at the end
torch.cuda.memory_stats() is recorded. The output is JSON that `allocbench fidelity TRACE
--torch-json FILE` compares with the simulator key by key.

  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 scripts/torch_replay.py trace.csv -o torch.json
  python3 scripts/torch_replay.py trace.csv --conf max_split_size_mb:512 -o torch.json
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="allocbench CSV trace (allocbench trace WORKLOAD.toml -o trace.csv)")
    ap.add_argument("-o", "--out", required=True, help="JSON output for allocbench fidelity")
    ap.add_argument("--conf", default=None, help="PYTORCH_CUDA_ALLOC_CONF to run with (default: the environment's)")
    ap.add_argument("--on-oom", choices=["stop", "continue"], default="stop")
    ap.add_argument("--busy-ms", type=float, default=2000.0,
                    help="how long a stream named by record_stream stays busy before its sync (its events must not complete earlier)")
    ap.add_argument("--no-addresses", action="store_true",
                    help="do not record cudaMalloc addresses (they let the simulator break best-fit ties as the GPU did)")
    args = ap.parse_args()
    if args.conf is not None:
        # Read once, at CUDA initialisation: set before torch touches the GPU.
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = args.conf
        os.environ.pop("PYTORCH_ALLOC_CONF", None)
    # torch reads every key from the first of these that is set (c10/cuda/CUDAAllocatorConfig.h).
    conf = next((os.environ[v] for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if v in os.environ), "")

    import torch

    if not torch.cuda.is_available():
        print("torch_replay.py: no CUDA device available", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    # What the device can give this process (the CUDA context and other processes hold the rest).
    free_at_start, _ = torch.cuda.mem_get_info(dev)
    if not args.no_addresses:
        # Only to learn the addresses cudaMalloc returns; no stacks are recorded.
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=sys.maxsize)
    streams = {}
    # Streams kept busy since their last sync (one _sleep per stream and sync).
    busy = set()
    # torch.cuda._sleep counts GPU cycles: about 2 GHz on an H100.
    busy_cycles = int(args.busy_ms * 2e6)

    def stream_of(s):
        st = streams.get(s)
        if st is None:
            st = streams[s] = torch.cuda.Stream(device=dev) if s != 0 else torch.cuda.default_stream(dev)
        return st

    def mempool_id(pool):
        # A trace's pool P as a MempoolId_t: (0, P + 1), never the default pool (0, 0).
        return (0, int(pool) + 1)

    live = {}
    failed = set()
    steps = []
    oom = None
    event = 0
    header = False
    with open(args.trace) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if not header:
                if line.replace(" ", "") != "op,id,bytes,stream":
                    print(f"{args.trace}:{lineno}: expected the header op,id,bytes,stream", file=sys.stderr)
                    return 2
                header = True
                continue
            fields = (line.split(",") + ["", "", ""])[:4]
            op, ident, nbytes, stream = (x.strip() for x in fields)
            if op == "alloc":
                s = int(stream) if stream else 0
                try:
                    # No local name may keep a tensor alive past its `free` row.
                    if s == 0:
                        live[ident] = torch.empty(int(nbytes), dtype=torch.uint8, device=dev)
                    else:
                        with torch.cuda.stream(stream_of(s)):
                            live[ident] = torch.empty(int(nbytes), dtype=torch.uint8, device=dev)
                except torch.cuda.OutOfMemoryError as e:
                    if oom is None:
                        oom = {"event": event, "message": str(e).splitlines()[0]}
                    if args.on_oom == "stop":
                        event += 1
                        break
                    failed.add(ident)
            elif op == "free":
                if live.pop(ident, None) is None:
                    failed.discard(ident)
            elif op == "step":
                steps.append({"step": int(ident), "event": event, "stats": dict(torch.cuda.memory_stats(dev))})
            elif op == "empty_cache" and ident:
                # emptyCache(mempool_id) has no Python binding: a pool's cache stays until the next
                # empty_cache (the simulator frees it here).
                pass
            elif op == "empty_cache":
                torch.cuda.empty_cache()
            elif op == "record_stream":
                s = int(stream)
                t = live.get(ident)
                if t is not None:
                    st = stream_of(s)
                    if s not in busy:
                        with torch.cuda.stream(st):
                            torch.cuda._sleep(busy_cycles)
                        busy.add(s)
                    t.record_stream(st)
                    del t
            elif op == "sync":
                if stream:
                    stream_of(int(stream)).synchronize()
                    busy.discard(int(stream))
                else:
                    torch.cuda.synchronize()
                    busy.clear()
            elif op == "pool_begin":
                # beginAllocateToPool: the stream's allocations (every stream's when the row names
                # none, or the default stream, which no capture may run on) go to a private pool.
                s = int(stream) if stream else 0
                if s == 0:
                    torch._C._cuda_beginAllocateToPool(dev.index, mempool_id(ident))
                else:
                    with torch.cuda.stream(stream_of(s)):
                        torch._C._cuda_beginAllocateCurrentStreamToPool(dev.index, mempool_id(ident))
            elif op == "pool_join":
                # No binding routes one more stream to a pool being allocated to (beginAllocateToPool
                # refuses a second begin): the joined stream's allocations stay in the default pool.
                pass
            elif op == "pool_end":
                torch._C._cuda_endAllocateToPool(dev.index, mempool_id(ident))
            elif op == "pool_release":
                torch._C._cuda_releasePool(dev.index, mempool_id(ident))
            else:
                print(f"{args.trace}:{lineno}: unknown op {op!r}", file=sys.stderr)
                return 2
            event += 1
    torch.cuda.synchronize()
    final = dict(torch.cuda.memory_stats(dev))
    segment_addresses = []
    if not args.no_addresses:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        for e in snap["device_traces"][dev.index or 0]:
            if e["action"] == "segment_alloc":
                segment_addresses.append([e["addr"], e["size"]])
        del snap
    props = torch.cuda.get_device_properties(dev)
    out = {
        "format": "allocbench-torch-replay-v1",
        "torch_version": torch.__version__,
        "device": props.name,
        "total_memory": props.total_memory,
        "free_memory_at_start": free_at_start,
        "segment_addresses": segment_addresses,
        "conf": conf,
        "events": event,
        "oom": oom,
        "steps": steps,
        "final": final,
    }
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"replayed {event} events of {args.trace} on {props.name} (torch {torch.__version__}, conf {conf or 'default'}): "
          f"reserved peak {final.get('reserved_bytes.all.peak', 0)}, cudaMallocs {final.get('segment.all.allocated', 0)}, "
          f"retries {final.get('num_alloc_retries', 0)}, OOMs {final.get('num_ooms', 0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
