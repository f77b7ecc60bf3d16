//! `allocbench` / `allocbench demo`: the embedded 1.3B training trace (captured from PyTorch) under several configs.

use std::path::PathBuf;

use clap::Args;

use super::args::DeviceArgs;
use crate::gpu::replay::OnOom;
use crate::input::Source;
use crate::results::{Backend, GpuPolicy};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where to write the results (JSON Lines).
    #[arg(long, default_value = "results/demo.jsonl")]
    pub jsonl: PathBuf,
}

pub fn main(a: &DemoArgs) -> anyhow::Result<()> {
    let source = Source::open(None)?;
    let confs = vec![
        String::new(),
        "expandable_segments:True".to_string(),
        "max_split_size_mb:512,roundup_power2_divisions:[256:1,512:2,>:4]".to_string(),
        "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95".to_string(),
    ];
    println!("allocbench demo: {} (embedded default workload)\n", Source::open(None)?.info()?.description);
    let dev = DeviceArgs {
        capacity: None,
        on_oom: OnOom::Stop,
        sample_every: None,
        quiet: false,
        device: Backend::Sim,
        sim_latency: None,
        address_order: Default::default(),
    };
    super::run::compare(&source, &[GpuPolicy::Pytorch, GpuPolicy::Nocache, GpuPolicy::Ideal], &confs, &dev, Some(&a.jsonl))?;
    println!(
        "\nNext: `allocbench capture -o trace.csv -- train.py` then `allocbench diagnose trace.csv --card A100-80GB` for your own job, \
         `allocbench fit --param batch=1..64 --card A100-80GB -- train.py --batch {{batch}}` for the largest batch that fits, \
         `allocbench replay workloads/<name>.toml --conf ...` for one run in detail, `allocbench --help` for the rest."
    );
    Ok(())
}
