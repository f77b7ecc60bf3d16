"""The fake card's memory: what it holds, what it refuses, and what its statistics answer.

The CUDA caching allocator's statistics (torch.cuda.memory_stats) as the allocations alone give
them; the card's capacity and per_process_memory_fraction cap, and the
torch.cuda.OutOfMemoryError a request past them raises (``_FakeCard``, the trace sink's part that
checks each request); the allocator settings (PYTORCH_CUDA_ALLOC_CONF) that cap the card and that
a script sets for itself."""
from __future__ import annotations

import os
import sys

# The fake card's memory unless --device-memory says otherwise: an H100 80 GB's total_memory
# (allocbench cards: H100-80GB, read on this project's GPU run).
FAKE_TOTAL_MEMORY = 85017493504

# CUDACachingAllocator.cpp: kMinBlockSize (every block a multiple of 512 B) and kSmallSize
# (requests up to 1 MiB, rounded, are served from the small pool).
_MIN_BLOCK_SIZE = 512
_SMALL_SIZE = 1 << 20
_STAT_POOLS = ("all", "small_pool", "large_pool")


def _format_bytes(n):
    """As PyTorch's OOM message writes sizes (format_size in CUDACachingAllocator.cpp)."""
    if n <= 1024:
        return f"{n} bytes"
    for unit, size, top in (("KiB", 1 << 10, 1 << 20), ("MiB", 1 << 20, 1 << 30)):
        if n <= top:
            return f"{n / size:.2f} {unit}"
    return f"{n / (1 << 30):.2f} GiB"


def _block_bytes(nbytes):
    """The bytes a request holds in allocated_bytes: rounded up to 512 (round_size, small requests)."""
    return max(_MIN_BLOCK_SIZE, (nbytes + _MIN_BLOCK_SIZE - 1) // _MIN_BLOCK_SIZE * _MIN_BLOCK_SIZE)


class _MemoryStats:
    """What ``torch.cuda.memory_stats()`` would count from the allocations alone, with its key
    names: ``allocation`` (blocks), ``allocated_bytes`` (each request rounded as round_size does by
    default: up to a multiple of 512 B), ``requested_bytes`` (the bytes asked for), per pool (small:
    rounded size up to 1 MiB). Segments, cached and split blocks need the allocator itself, which
    the capture does not run: ``reserved_bytes`` and ``segment`` answer as an allocator without a
    cache would (equal to the allocated ones); replay the trace for the real caching figures."""

    KINDS = ("allocation", "allocated_bytes", "requested_bytes")

    def __init__(self):
        # kind -> pool -> [current, peak, allocated, freed], as c10::CachingAllocator::Stat
        self.stats = {kind: {pool: [0, 0, 0, 0] for pool in _STAT_POOLS} for kind in self.KINDS}
        self.num_ooms = 0

    def _update(self, nbytes, sign):
        rounded = _block_bytes(nbytes)
        pool = "small_pool" if rounded <= _SMALL_SIZE else "large_pool"
        for kind, amount in (("allocation", 1), ("allocated_bytes", rounded), ("requested_bytes", nbytes)):
            for stat in (self.stats[kind]["all"], self.stats[kind][pool]):
                stat[0] += sign * amount
                if sign > 0:
                    stat[2] += amount
                    stat[1] = max(stat[1], stat[0])
                else:
                    stat[3] += amount

    def alloc(self, nbytes):
        self._update(nbytes, 1)

    def free(self, nbytes):
        self._update(nbytes, -1)

    def current(self, kind="allocated_bytes"):
        return self.stats[kind]["all"][0]

    def peak(self, kind="allocated_bytes"):
        return self.stats[kind]["all"][1]

    def reset_peak(self):
        for pools in self.stats.values():
            for stat in pools.values():
                stat[1] = stat[0]

    def reset_accumulated(self):
        for pools in self.stats.values():
            for stat in pools.values():
                stat[2] = stat[3] = 0

    def nested(self):
        """The nested dict ``torch._C._cuda_memoryStats`` returns (memory_stats() flattens it)."""
        as_dict = lambda pools: {  # noqa: E731
            pool: dict(zip(("current", "peak", "allocated", "freed"), stat)) for pool, stat in pools.items()
        }
        zero = {pool: dict(current=0, peak=0, allocated=0, freed=0) for pool in _STAT_POOLS}
        allocation, allocated = as_dict(self.stats["allocation"]), as_dict(self.stats["allocated_bytes"])
        return {
            "num_alloc_retries": 0, "num_ooms": self.num_ooms, "num_sync_all_streams": 0,
            "num_device_alloc": self.stats["allocation"]["all"][2], "num_device_free": self.stats["allocation"]["all"][3],
            "max_split_size": -1,
            "allocation": allocation, "active": allocation, "segment": allocation,
            "allocated_bytes": allocated, "active_bytes": allocated, "reserved_bytes": allocated,
            "requested_bytes": as_dict(self.stats["requested_bytes"]),
            "inactive_split": zero, "inactive_split_bytes": zero,
            "oversize_allocations": dict(current=0, peak=0, allocated=0, freed=0),
            "oversize_segments": dict(current=0, peak=0, allocated=0, freed=0),
        }


class _FakeCard:
    """The trace sink's check of each request against the fake card (``capacity`` bytes, None for
    real tensors, whose own allocator raises; ``fraction``: per_process_memory_fraction;
    ``oom_error``: torch.cuda.OutOfMemoryError; ``refused``: the last request refused)."""

    def limit(self):
        """What the fake card lets the process hold: its memory, or under
        per_process_memory_fraction its allowed_memory_maximum (floor(fraction × total))."""
        if self.fraction < 1:
            return int(self.fraction * self.capacity)
        return self.capacity

    def check_fits(self, trace_id, nbytes, stream, site):
        """Live tensors past the fake card's limit: torch.cuda.OutOfMemoryError, as any allocator
        would raise (the caching allocator may fail sooner: the replay tells when). The request
        is not a row; a comment at its site marks it, so a script that catches it (a batch-size
        search) leaves a trace that says so, and one that does not ends on it (``refused``)."""
        in_use, limit = self.memory_stats.current(), self.limit()
        if in_use + _block_bytes(nbytes) <= limit:
            return
        self.memory_stats.num_ooms += 1
        self._at_site(site)
        self.file.write(f"# OutOfMemoryError: {nbytes} bytes requested with {in_use} allocated on the fake card's {limit} bytes\n")
        capped = f" (per_process_memory_fraction {self.fraction:g} allows {_format_bytes(limit)})" if limit < self.capacity else ""
        message = (
            f"CUDA out of memory. Tried to allocate {_format_bytes(_block_bytes(nbytes))}. GPU 0 has a total capacity of "
            f"{_format_bytes(self.capacity)} of which {_format_bytes(max(0, self.capacity - in_use))} is free{capped}. "
            f"Of the allocated memory {_format_bytes(in_use)} is allocated by PyTorch. (allocbench capture: live "
            "tensors would pass the fake card's memory; --device-memory sets it)"
        )
        # The message, not the error: an error held here (even in a local) would, through its
        # traceback, keep the op's tensors alive after the script let go of them.
        self.refused = (trace_id, nbytes, stream, site[0] if site else None, message)
        raise self.oom_error(message)

    def end_on_refused(self, error):
        """The script stopped on the fake card's OOM ``error``: its request ends the trace as a row,
        so a replay on that card fails where the script did, at its site."""
        if self.refused is None or not isinstance(error, self.oom_error) or str(error) != self.refused[4]:
            return
        trace_id, nbytes, stream, site, _ = self.refused
        self.comment("the request the script stopped on (torch.cuda.OutOfMemoryError, uncaught)")
        self._at_site(None if site is None else (site, None))
        self.file.write(f"alloc,{trace_id},{nbytes},{stream}\n")
        self.allocs += 1
        self.rows += 1


def _round_up(x, m):
    return (x + m - 1) // m * m


# The variables PyTorch reads its allocator settings from, in priority order: torch 2.15 reads
# every key from the first one set (CUDAAllocatorConfig::instance() in c10/cuda/CUDAAllocatorConfig.h).
_ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _conf_fraction(items):
    """per_process_memory_fraction among allocator settings (at most 1), else None (unset or not a number)."""
    value = dict(items).get("per_process_memory_fraction")
    try:
        return None if value is None else min(1.0, float(value))
    except ValueError:
        return None


def _alloc_conf_items(conf):
    """``key:value`` pairs of a PYTORCH_CUDA_ALLOC_CONF string, in order (commas inside the
    brackets of roundup_power2_divisions:[256:1,512:2] do not separate pairs)."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(conf + ","):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            key, _, value = conf[start:i].strip().partition(":")
            if key:
                items.append((key.strip(), value.strip()))
            start = i + 1
    return items


def _note_script_conf(sink, script_conf, conf_before):
    """Allocator settings the script made itself (PYTORCH_CUDA_ALLOC_CONF set in os.environ,
    set_per_process_memory_fraction, _set_allocator_settings) shape what a GPU would do, yet the
    replay takes its settings from --conf: say them in the trace and on the terminal."""
    settings = {}
    read = next((name for name in _ALLOC_CONF_VARS if name in os.environ), None)
    if read is not None and os.environ[read] != conf_before.get(read):
        settings.update(_alloc_conf_items(os.environ[read]))
    settings.update(script_conf)
    if not settings:
        return
    conf = ",".join(f"{k}:{v}" for k, v in settings.items())
    sink.comment(f"allocator settings made by the script: {conf}")
    print(f"allocbench capture: the script set the allocator's settings; replay with --conf '{conf}' to apply them", file=sys.stderr)
