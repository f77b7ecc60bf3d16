//! `allocbench devprobe`: cuMemAlloc/cuMemFree latency by size on a real GPU.

use clap::Args;

use super::output;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct DevprobeArgs {
    /// Timings per size (fewer for sizes of 1 GiB and more).
    #[arg(long, default_value_t = 50)]
    pub reps: usize,
    /// Write the results as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

pub fn main(a: &DevprobeArgs) -> anyhow::Result<()> {
    output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[])?;
    let device = crate::gpu::cuda::CudaDevice::open(0)?;
    eprintln!("probing {} ...", crate::gpu::device::Device::describe(&device));
    let r = crate::gpu::devprobe::probe(device, a.reps.max(3)).map_err(|e| anyhow::anyhow!("devprobe failed: {e}"))?;
    println!("{:>10} {:>12} {:>12} {:>12} {:>12} {:>14}", "size", "malloc p50", "malloc p99", "free p50", "free p99", "async pool p50");
    for (i, m) in r.malloc.iter().enumerate() {
        let f = &r.free[i];
        let p = r.async_pool_alloc_free.get(i).map(|s| s.p50_ns).unwrap_or(0);
        println!(
            "{:>10} {:>10.1}us {:>10.1}us {:>10.1}us {:>10.1}us {:>12.2}us",
            crate::units::format_bytes(m.bytes),
            m.p50_ns as f64 / 1e3,
            m.p99_ns as f64 / 1e3,
            f.p50_ns as f64 / 1e3,
            f.p99_ns as f64 / 1e3,
            p as f64 / 1e3
        );
    }
    if let Some(path) = &a.json {
        output::write_json(path, &ResultRecord::Devprobe(Box::new(r)))?;
    }
    Ok(())
}
