//! `allocbench diagnose`: the first OOM (or the headroom) explained in plain words.

use std::path::{Path, PathBuf};

use clap::Args;

use super::args::print_notes;
use super::output::{self, Jsonl};
use crate::gpu::config::AllocatorConfig;
use crate::results::ResultRecord;

#[derive(Args, Debug)]
pub struct DiagnoseArgs {
    #[command(flatten)]
    pub torch: super::args::TorchVersionArg,
    /// A trace (.csv), RMM log (.csv), PyTorch snapshot (.pickle or .json), workload (.toml), or
    /// a sharded job's folder of per-rank traces (`capture --nproc-per-node -o DIR`).
    pub input: PathBuf,
    #[command(flatten)]
    pub snapshot: super::args::SnapshotDeviceArg,
    #[command(flatten)]
    pub card: super::args::CardArgs,
    /// PYTORCH_CUDA_ALLOC_CONF string (default: the environment variable, else PyTorch's defaults).
    #[arg(long)]
    pub conf: Option<String>,
    /// Write the diagnosis as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
    /// Also write the replay's results (JSON Lines) for `allocbench report`.
    #[arg(long)]
    pub jsonl: Option<PathBuf>,
}

pub fn main(a: &DiagnoseArgs) -> anyhow::Result<()> {
    output::check_outputs(&[a.json.as_deref().map(Path::new), a.jsonl.as_deref()], &[Some(&a.input)])?;
    let conf = AllocatorConfig::from_arg(a.conf.as_deref())?;
    let (d, runs) = if a.input.is_dir() {
        // A sharded job: each rank's trace on its own card; the worst rank decides.
        let mut diagnosed = Vec::new();
        let mut runs = Vec::new();
        for trace in crate::trace::ranks::read_folder(&a.input)? {
            let source = crate::input::Source::open(Some(&trace.path))?;
            print_notes(&source);
            let target = a.card.target(&source)?;
            let (d, run) = crate::diagnose::diagnose(&source, &conf, target.capacity, target.outside)?;
            diagnosed.push((trace, d));
            runs.push(run);
        }
        (crate::diagnose::decide_by_rank(diagnosed).expect("a folder has a trace"), runs)
    } else {
        let source = a.snapshot.open(&a.input)?;
        print_notes(&source);
        let target = a.card.target(&source)?;
        let (d, run) = crate::diagnose::diagnose(&source, &conf, target.capacity, target.outside)?;
        (d, vec![run])
    };
    if a.json.as_deref() != Some("-") {
        print!("{}", crate::diagnose::describe(&d));
    }
    if let Some(path) = &a.json {
        output::write_json(path, &ResultRecord::Diagnose(Box::new(d.clone())))?;
    }
    if a.jsonl.is_some() {
        let mut out = Jsonl::open(a.jsonl.as_deref())?;
        for run in runs {
            out.write(&ResultRecord::GpuReplay(Box::new(run)))?;
        }
        out.write(&ResultRecord::Diagnose(Box::new(d)))?;
    }
    Ok(())
}
