//! # allocbench
//!
//! Benchmarks CPU and GPU memory allocators on the allocation patterns of real ML jobs, and
//! explains fragmentation.
//!
//! The flow is one-way: workloads (`workloads/*.toml`), traces (CSV) → events → an allocator
//! (GPU policy over a device, or a CPU malloc) → results (versioned JSON) → reports.
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
pub mod cli;
pub mod cpu;
pub mod diagnose;
pub mod error;
pub mod event;
pub mod gpu;
pub mod gpu_run;
pub mod input;
pub mod interrupt;
pub mod report;
pub mod results;
pub mod trace;
pub mod units;
pub mod workload;
