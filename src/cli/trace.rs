//! `allocbench trace`: a workload's (or trace's) events as a CSV trace.

use std::path::PathBuf;

use clap::Args;

use super::output;
use crate::input::Source;
use crate::trace::TraceWriter;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// A workload (.toml) or trace (.csv).
    pub input: PathBuf,
    /// Output CSV file ('-' = standard output).
    #[arg(short, long, default_value = "-")]
    pub output: String,
}

pub fn main(a: &TraceArgs) -> anyhow::Result<()> {
    let source = Source::open(Some(&a.input))?;
    let info = source.info()?;
    let comments = vec![
        "allocbench trace v1".to_string(),
        format!("source: {} ({}), sha256 {}", info.origin, info.kind, info.sha256),
        format!("workload: {}{}", info.name, if info.description.is_empty() { String::new() } else { format!(" - {}", info.description) }),
    ];
    let mut w = TraceWriter::new(output::open(&a.output)?, &comments)?;
    let mut n = 0u64;
    for ev in source.events()? {
        w.write(&ev?)?;
        n += 1;
    }
    w.finish()?;
    if a.output != "-" {
        eprintln!("wrote {n} events to {}", a.output);
    }
    Ok(())
}
