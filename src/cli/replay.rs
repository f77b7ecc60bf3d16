//! `allocbench replay`: one replay, a printed summary and size histogram, and the results as JSON.

use std::path::PathBuf;

use clap::Args;

use super::args::{print_notes, DeviceArgs};
use super::{output, progress};
use crate::gpu::build::{build, DeviceSpec};
use crate::gpu::config::AllocatorConfig;
use crate::gpu_run;
use crate::input::Source;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A trace (.csv) or workload (.toml).
    pub input: PathBuf,
    /// GPU allocator policy: pytorch, nocache, ideal, or async (CUDA's pool; --device cuda).
    #[arg(long, default_value = "pytorch")]
    pub allocator: String,
    /// PYTORCH_CUDA_ALLOC_CONF string (default: the environment variable, else PyTorch's defaults).
    #[arg(long)]
    pub conf: Option<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Write the results as JSON to this file ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

pub fn main(a: &ReplayArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    print_notes(&source);
    let conf = AllocatorConfig::from_arg(a.conf.as_deref())?;
    let spec = DeviceSpec { addresses: source.address_script(), ..a.device.spec()? };
    let mut built = build(&a.allocator, &conf, &spec)?;
    let pb = progress::events(a.device.quiet || a.json.as_deref() == Some("-"), &format!("replaying through {}", a.allocator));
    let result = gpu_run::run_one(&mut built, &conf, source.events()?, source.info()?, &a.device.replay_options(), &mut progress::watch(&pb))?;
    progress::finish(pb);
    let json = a.json.as_deref();
    if let Some(path) = json {
        output::write_json(path, &ResultRecord::GpuReplay(Box::new(result.clone())))?;
    }
    if json != Some("-") {
        print!("{}", gpu_run::describe(&result));
        print_histogram(&result.size_histogram);
    }
    if let Some(path) = json.filter(|p| *p != "-") {
        eprintln!("results written to {path}");
    }
    Ok(())
}

fn print_histogram(h: &[(u64, u64)]) {
    let total: u64 = h.iter().map(|(_, c)| c).sum();
    if total == 0 {
        return;
    }
    println!("allocation sizes (log2 buckets):");
    let max = h.iter().map(|(_, c)| *c).max().unwrap_or(1);
    for (lo, c) in h {
        let bar = "#".repeat(((*c as f64 / max as f64) * 40.0).ceil() as usize);
        println!("  >= {:>10} {:>10} {:>5.1}% {bar}", crate::units::format_bytes(*lo), c, 100.0 * *c as f64 / total as f64);
    }
}
