//! `allocbench report`: SVG charts and an index from results files.

use std::path::PathBuf;

use clap::Args;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Results files (JSON or JSON Lines) written by replay, run, demo or cpu.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Output folder, e.g. reports/NAME/.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Title of the report.
    #[arg(long, default_value = "allocbench report")]
    pub title: String,
}

pub fn main(a: &ReportArgs) -> anyhow::Result<()> {
    let records = crate::report::load(&a.results)?;
    let charts = crate::report::render(&records, &a.output, &a.title)?;
    println!("wrote {} charts, README.md and index.html to {}", charts.len(), a.output.display());
    Ok(())
}
