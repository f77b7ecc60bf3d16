//! `allocbench oracle`: a trace through PyTorch's own caching allocator on a fake CUDA runtime.

use std::path::PathBuf;

use clap::Args;

use super::output;

#[derive(Args, Debug, Clone)]
pub struct OracleArgs {
    /// The trace (.csv, .csv.gz) to run.
    pub trace: PathBuf,
    /// The Python whose torch is used (default: $ALLOCBENCH_PYTHON, else python3).
    #[arg(long)]
    pub python: Option<String>,
    /// A torch/lib folder holding libc10_cuda.so (instead of asking Python).
    #[arg(long, conflicts_with = "torch_version")]
    pub libc10: Option<PathBuf>,
    /// A torch release (e.g. 2.11.0) whose allocator to run: its c10 libraries and headers are
    /// fetched from the package index once and cached (instead of asking Python).
    #[arg(long)]
    pub torch_version: Option<String>,
    /// PYTORCH_CUDA_ALLOC_CONF for the real allocator.
    #[arg(long, default_value = "")]
    pub conf: String,
    /// The fake card's memory (default: the H100-80GB card's, `allocbench cards`).
    #[arg(long, value_parser = super::args::parse_capacity, default_value = "85017493504B")]
    pub capacity: u64,
    /// Where the fake runtime places segments, as the simulator's `--address-order` does.
    #[arg(long, value_enum, default_value = "lowest")]
    pub address_order: crate::gpu::device::AddressOrder,
    /// Write the result as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

impl OracleArgs {
    pub fn options(&self) -> crate::gpu::oracle::OracleOptions {
        crate::gpu::oracle::OracleOptions {
            python: self.python.clone(),
            libc10: self.libc10.clone(),
            torch_version: self.torch_version.clone(),
            conf: self.conf.clone(),
            capacity: self.capacity,
            address_order: self.address_order,
            simulate: None,
        }
    }
}

pub fn main(a: &OracleArgs) -> anyhow::Result<()> {
    use crate::units::format_bytes;
    output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[Some(&a.trace)])?;
    let (r, _) = crate::gpu::oracle::run_trace(&a.trace, &a.options(), usize::MAX, false)?;
    let stat = |k: &str| r.stats.get(k).copied().unwrap_or(0).max(0) as u64;
    let mut text = format!(
        "PyTorch {} caching allocator ({}) on {} [conf: {}]: {} events; peak allocated {}, peak reserved {}, {} cudaMalloc, {} retries, {} OOMs, {} segments at the end\n",
        r.torch_version,
        r.torch_lib,
        r.device,
        if r.conf.is_empty() { "default" } else { &r.conf },
        r.events,
        format_bytes(stat("allocated_bytes.all.peak")),
        format_bytes(stat("reserved_bytes.all.peak")),
        stat("num_device_alloc"),
        stat("num_alloc_retries"),
        stat("num_ooms"),
        r.segments.len()
    );
    if let Some(p) = r.peak_event {
        text += &format!("peak at event {p}: {} segments then (the map at the peak and at the end are in --json)\n", r.segments_at_peak.len());
    }
    if let Some(o) = &r.oom {
        text += &format!("OOM at event {} ({} on stream {}): {}\n", o.event, format_bytes(o.bytes), o.stream, o.message);
    }
    output::say(a.json.as_deref(), &text);
    if let Some(path) = &a.json {
        output::write_json(path, &r)?;
    }
    Ok(())
}
