//! `allocbench fidelity`: the simulator's memory_stats() against PyTorch's on the same trace.

use std::path::PathBuf;

use clap::Args;

use super::output;

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The trace (.csv) that torch_replay.py replayed.
    pub trace: PathBuf,
    /// torch_replay.py's JSON output.
    #[arg(long, required_unless_present = "oracle", conflicts_with = "oracle")]
    pub torch_json: Option<PathBuf>,
    /// Compare with PyTorch's own allocator run here on a fake CUDA runtime (`allocbench
    /// oracle`), every memory_stats() key and the segment map at the end.
    #[arg(long)]
    pub oracle: bool,
    /// With --oracle: the Python whose torch is used (default: $ALLOCBENCH_PYTHON, else python3).
    #[arg(long, requires = "oracle")]
    pub python: Option<String>,
    /// With --oracle: a torch/lib folder holding libc10_cuda.so.
    #[arg(long, requires = "oracle")]
    pub libc10: Option<PathBuf>,
    /// With --oracle, where the two differ: bisect the trace's prefixes for the first event
    /// after which they part (about log2(events) more runs of each side).
    #[arg(long, requires = "oracle")]
    pub bisect: bool,
    /// With --oracle: the card's memory (default: an H100 80 GB's).
    #[arg(long, requires = "oracle", value_parser = super::args::parse_capacity)]
    pub capacity: Option<u64>,
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
    output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[Some(&a.trace), a.torch_json.as_deref()])?;
    let Some(torch_json) = &a.torch_json else { return against_oracle(a) };
    let torch = fidelity::load_torch(torch_json)?;
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
    output::say(a.json.as_deref(), &text);
    if let Some(path) = &a.json {
        output::write_json(path, &r)?;
    }
    if !r.target_identical {
        anyhow::bail!("the simulator disagrees with PyTorch on a target key");
    }
    Ok(())
}

/// `fidelity --oracle`: the simulator against PyTorch's allocator run here, key by key.
fn against_oracle(a: &FidelityArgs) -> anyhow::Result<()> {
    let opts = crate::gpu::oracle::OracleOptions {
        python: a.python.clone(),
        libc10: a.libc10.clone(),
        conf: a.conf.clone().unwrap_or_default(),
        capacity: a.capacity.unwrap_or(crate::gpu::device::H100_CAPACITY_BYTES),
        address_order: a.address_order.unwrap_or_default(),
    };
    let r = crate::gpu::oracle::compare(&a.trace, &opts)?;
    use std::fmt::Write as _;
    let mut text = String::new();
    writeln!(
        text,
        "fidelity of {} against PyTorch {}'s own allocator (oracle, {}) [conf: {}]: {} keys compared, {} differ; segment map at the end: {} ({} vs {} segments)",
        a.trace.display(),
        r.oracle.torch_version,
        r.oracle.device,
        if opts.conf.is_empty() { "default" } else { &opts.conf },
        r.keys_compared,
        r.mismatches.len(),
        if r.segments_equal { "identical" } else { "DIFFERENT" },
        r.sim_segments.len(),
        r.oracle.segments.len()
    )?;
    for m in &r.mismatches {
        writeln!(text, "  {:<40} sim {:>16}  torch {:>16}", m.key, m.sim, m.torch)?;
    }
    output::say(a.json.as_deref(), &text);
    let parting = if a.bisect { crate::gpu::oracle::first_parting(&a.trace, &opts, &r)? } else { None };
    if let Some(p) = &parting {
        let keys: Vec<&str> = p.mismatches.iter().map(|m| m.key.as_str()).collect();
        let segments = if p.segments_equal { "" } else { "the segment map" };
        let sep = if keys.is_empty() || segments.is_empty() { "" } else { " and " };
        let verb = if keys.is_empty() { "differs" } else { "differ" };
        let line = format!("they part at event {} ({}): {}{sep}{segments} {verb} after it\n", p.event, p.what, keys.join(", "));
        output::say(a.json.as_deref(), &line);
    }
    if let Some(path) = &a.json {
        output::write_json(path, &serde_json::json!({ "comparison": r, "parting": parting }))?;
    }
    if !r.identical() {
        anyhow::bail!("the simulator disagrees with PyTorch's allocator");
    }
    Ok(())
}
