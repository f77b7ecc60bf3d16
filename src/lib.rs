//! # allocbench
//!
//! Benchmarks CPU and GPU memory allocators on the allocation patterns of real ML jobs, and
//! explains fragmentation.
//!
//! The flow is one-way: workloads (`workloads/*.toml`), traces (CSV) → events → an allocator
//! (GPU policy over a device, or a CPU malloc) → results (versioned JSON) → reports.
//!
//! ## The map (layers; each imports only those below it)
//! The one map of the code: `tests/layers.rs` reads it and fails on an import of a higher layer
//! or on files that import each other in a circle.
//! 1. [`event`], [`ids`], [`units`], [`error`], [`interrupt`], [`files`], [`confidence`], [`hint`]:
//!    events, id maps, sizes, input errors, the stop flag, bounded file reads and hashes (and
//!    the native helpers' cache and g++ run), 95 % intervals, the prefetch hint.
//! 2. [`results`]: the schema, every serialised type, and the names parsed into it
//!    ([`results::GpuPolicy`]).
//! 3. [`trace`], [`workload`], [`input`]: where events come from.
//! 4. [`gpu`]: policies over the [`gpu::device::Device`] seam (adaptors wrap it, `cuda.rs` alone
//!    calls the driver), built in one place ([`gpu::build`]) and replayed by a small loop that
//!    observers measure ([`gpu::replay`]). [`cpu`]: real mallocs, a per-worker driver with a clock.
//! 5. [`gpu_run`], [`diagnose`], [`advise`], [`sweep`], [`report`], [`capture`], [`fit`]: runs and
//!    analyses that return data (text is rendered separately), the capture of a PyTorch script,
//!    and the search for the largest batch that fits.
//! 6. [`cli`]: one module per command; progress bars and Ctrl-C live there.
//!
//! ## Glossary (one meaning per word)
//! - **request**: the user's byte count. **rounded size**: after the policy's rounding.
//! - **block**: a piece of a segment. **segment**: one device allocation (or one mapped range of
//!   an expandable segment). **pool**: small (≤ 1 MiB) or large. **stream**: a CUDA stream id.
//! - **allocated**: bytes in live blocks. **active**: allocated + freed-but-pending.
//!   **reserved**: bytes in segments. **requested**: sum of user byte counts.
//!   **live bytes**: what the workload holds (independent of any allocator).
//! - **fragmentation** (at time t) = 1 − allocated/reserved, reported at peak reserved.
//!   **utilization** = peak allocated ÷ peak reserved. **overhead** = peak reserved ÷ peak live.
//! - **pinned free**: free bytes inside segments that hold a live block (`inactive_split_bytes`).

pub mod advise;
pub mod capture;
pub mod cli;
pub mod confidence;
pub mod cpu;
pub mod diagnose;
pub mod error;
pub mod event;
pub mod files;
pub mod fit;
pub mod gpu;
pub mod gpu_run;
pub mod hint;
pub mod ids;
pub mod input;
pub mod interrupt;
pub mod report;
pub mod results;
pub mod sweep;
pub mod trace;
pub mod units;
pub mod workload;
