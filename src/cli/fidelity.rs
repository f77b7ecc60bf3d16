//! `allocbench fidelity`: the simulator's memory_stats() against PyTorch's on the same trace.

use std::path::PathBuf;

use clap::Args;

use super::output;

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The trace (.csv) that torch_replay.py replayed.
    pub trace: PathBuf,
    /// torch_replay.py's JSON output.
    #[arg(long)]
    pub torch_json: PathBuf,
    /// Override the conf (default: the one PyTorch ran with).
    #[arg(long)]
    pub conf: Option<String>,
    /// Place segments by the simulator's own order (`lowest`, `driver`) instead of replaying the
    /// addresses the GPU returned: what the default path does for a trace without a history.
    #[arg(long, value_enum)]
    pub address_order: Option<crate::gpu::device::AddressOrder>,
    /// Write the comparison as JSON ('-' = standard output).
    #[arg(long)]
    pub json: Option<String>,
}

pub fn main(a: &FidelityArgs) -> anyhow::Result<()> {
    use crate::gpu::fidelity;
    output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[Some(&a.trace), Some(&a.torch_json)])?;
    let torch = fidelity::load_torch(&a.torch_json)?;
    let r = fidelity::check(&a.trace, &torch, a.conf.as_deref(), a.address_order)?;
    // With the JSON on standard output, the summary goes to standard error.
    let mut text = String::new();
    use std::fmt::Write as _;
    writeln!(
        text,
        "fidelity of {} against PyTorch {} on {} [conf: {}]: {} snapshots x {} keys compared, {} mismatches",
        a.trace.display(),
        r.torch_version,
        r.device,
        if r.conf.is_empty() { "default" } else { &r.conf },
        r.snapshots_compared,
        r.keys_compared,
        r.mismatches.len()
    )?;
    for m in &r.mismatches {
        writeln!(text, "  {:<10} {:<40} sim {:>16}  torch {:>16}", m.at, m.key, m.sim, m.torch)?;
    }
    writeln!(text, "target keys ({}) at the end: {}", fidelity::TARGET_KEYS.join(", "), if r.target_identical { "identical" } else { "DIFFERENT" })?;
    if a.json.as_deref() == Some("-") {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(path) = &a.json {
        output::write_json(path, &r)?;
    }
    if !r.target_identical {
        anyhow::bail!("the simulator disagrees with PyTorch on a target key");
    }
    Ok(())
}
