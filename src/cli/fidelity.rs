//! `allocbench fidelity`: the simulator's memory_stats() against PyTorch's on the same trace.

use std::path::PathBuf;

use clap::Args;

use super::output;

#[derive(Args, Debug)]
pub struct FidelityArgs {
    /// The trace (.csv) that torch_replay.py replayed (or, with --oracle, any trace).
    #[arg(required_unless_present = "fuzz")]
    pub trace: Option<PathBuf>,
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
    #[arg(long, requires = "oracle", conflicts_with = "torch_version")]
    pub libc10: Option<PathBuf>,
    /// With --oracle: a torch release whose allocator to run (fetched once and cached); the
    /// simulator follows that version's rules.
    #[arg(long, requires = "oracle")]
    pub torch_version: Option<String>,
    /// With --oracle: instead of a trace, N random traces (the differential fuzz: streams,
    /// record_stream and syncs, private pools, empty_cache, every knob the torch has, small
    /// cards), each compared key by key and segment by segment.
    #[arg(long, requires = "oracle", value_name = "N")]
    pub fuzz: Option<u64>,
    /// With --fuzz: the first case's seed (case i is seed + i, the same on every machine).
    #[arg(long, requires = "fuzz", default_value_t = 0)]
    pub seed: u64,
    /// With --fuzz: write each case on which the two differ to DIR (for --bisect).
    #[arg(long, requires = "fuzz", value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// With --oracle, where the two differ: bisect the trace's prefixes for the first event
    /// after which they part (about log2(events) more runs of each side).
    #[arg(long, requires = "oracle")]
    pub bisect: bool,
    /// With --oracle: follow this release's rules in the simulator instead of the oracle's
    /// (where do 2.15's rules part from 2.11's allocator on my trace?).
    #[arg(long, requires = "oracle", value_name = "V")]
    pub simulate_version: Option<String>,
    /// With --oracle: the card's memory (default: the H100-80GB card's, `allocbench cards`).
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
    output::check_outputs(&[a.json.as_deref().map(std::path::Path::new)], &[a.trace.as_deref(), a.torch_json.as_deref()])?;
    if let Some(cases) = a.fuzz {
        return fuzz(a, cases);
    }
    let trace = a.trace.as_deref().expect("clap requires a trace without --fuzz");
    let Some(torch_json) = &a.torch_json else { return against_oracle(a, trace) };
    let torch = fidelity::load_torch(torch_json)?;
    let r = fidelity::check(trace, &torch, a.conf.as_deref(), a.address_order)?;
    // With the JSON on standard output, the summary goes to standard error.
    let mut text = String::new();
    use std::fmt::Write as _;
    writeln!(
        text,
        "fidelity of {} against PyTorch {} on {} [conf: {}]: {} snapshots x {} keys compared, {} mismatches",
        trace.display(),
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
fn against_oracle(a: &FidelityArgs, trace: &std::path::Path) -> anyhow::Result<()> {
    let mut opts = oracle_options(a);
    opts.simulate = a.simulate_version.as_deref().map(crate::gpu::torch_version::TorchVersion::parse).transpose()?;
    let r = crate::gpu::oracle::compare(trace, &opts)?;
    use std::fmt::Write as _;
    let mut text = String::new();
    writeln!(
        text,
        "fidelity of {} against PyTorch {}'s own allocator (oracle, {}) [conf: {}]: {} keys compared, {} differ; segment maps at the peak and the end: {} ({} vs {} segments at the end); state after every event: {}",
        trace.display(),
        r.oracle.torch_version,
        r.oracle.device,
        if opts.conf.is_empty() { "default" } else { &opts.conf },
        r.keys_compared,
        r.mismatches.len(),
        if r.segments_equal { "identical" } else { "DIFFERENT" },
        r.sim_segments.len(),
        r.oracle.segments.len(),
        if r.first_parting.is_none() { "identical" } else { "DIFFERENT" }
    )?;
    for m in &r.mismatches {
        writeln!(text, "  {:<40} sim {:>16}  torch {:>16}", m.key, m.sim, m.torch)?;
    }
    if let Some(k) = r.first_parting {
        let what: Vec<String> = r.parting_state.iter().map(|m| format!("{} (sim {:#x}, torch {:#x})", m.key, m.sim, m.torch)).collect();
        writeln!(text, "first parting at event {k}: {}{}", what.join(", "), if a.bisect { "" } else { " (--bisect: every key and the maps there)" })?;
    }
    output::say(a.json.as_deref(), &text);
    let parting = if a.bisect { crate::gpu::oracle::first_parting(trace, &opts, &r)? } else { None };
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

fn oracle_options(a: &FidelityArgs) -> crate::gpu::oracle::OracleOptions {
    crate::gpu::oracle::OracleOptions {
        python: a.python.clone(),
        libc10: a.libc10.clone(),
        torch_version: a.torch_version.clone(),
        conf: a.conf.clone().unwrap_or_default(),
        capacity: a.capacity.unwrap_or(crate::gpu::device::H100_CAPACITY_BYTES),
        address_order: a.address_order.unwrap_or_default(),
        simulate: None,
    }
}

/// `fidelity --oracle --fuzz N`: the differential fuzz against the torch of the options.
fn fuzz(a: &FidelityArgs, cases: u64) -> anyhow::Result<()> {
    if a.trace.is_some() || a.bisect || a.conf.is_some() || a.capacity.is_some() {
        return Err(crate::error::InputError::new(
            "--fuzz",
            "each fuzz case brings its own trace, conf and card: leave out TRACE, --conf, --capacity and --bisect",
        )
        .into());
    }
    let opts = oracle_options(a);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pb = super::progress::cases(a.json.as_deref() == Some("-"), cases);
    let step = || {
        if let Some(pb) = &pb {
            pb.inc(1);
        }
    };
    let r = crate::gpu::oracle::fuzz::run(&opts, a.seed, cases, workers, a.keep.as_deref(), &step)?;
    super::progress::finish(pb);
    let mut text = format!(
        "differential fuzz against PyTorch {}'s own allocator: {} cases (seeds {}..{}), {} events, {} ending at an OOM on both sides ({} refused up front); {} differ\n",
        r.torch_version,
        r.cases,
        a.seed,
        a.seed + r.cases,
        r.events,
        r.ooms,
        r.rejections,
        r.differences.len()
    );
    for d in r.differences.iter().take(20) {
        let what = if d.keys.is_empty() { "the segment map".to_string() } else { d.keys.join(", ") };
        let kept = d.trace.as_ref().map(|t| format!(" (kept: {})", t.display())).unwrap_or_default();
        text += &format!("  seed {} [conf: {}, capacity {}]: {what}{kept}\n", d.seed, d.conf, crate::units::format_bytes(d.capacity));
    }
    output::say(a.json.as_deref(), &text);
    if let Some(path) = &a.json {
        output::write_json(path, &r)?;
    }
    if crate::interrupt::interrupted() {
        crate::interrupt::exit_interrupted("the cases compared so far are above");
    }
    if !r.differences.is_empty() {
        anyhow::bail!("the simulator disagrees with PyTorch's allocator on {} of {} cases", r.differences.len(), r.cases);
    }
    Ok(())
}
