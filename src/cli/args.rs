//! Flags and helpers several commands share.

use std::path::PathBuf;

use clap::Args;

use crate::gpu::build::DeviceSpec;
use crate::gpu::device::AddressOrder;
use crate::gpu::replay::{OnOom, ReplayOptions};
use crate::input::Source;
use crate::results::Backend;
use crate::units::parse_bytes;

/// Which PyTorch release's caching allocator the simulator follows (`--torch-version V`).
#[derive(Args, Debug, Clone, Default)]
pub struct TorchVersionArg {
    /// The PyTorch release whose caching allocator to follow, 2.9 to 2.15 (default: the newest,
    /// 2.15): its conf keys and its allocator's rules where releases differ (docs/oracle.md).
    #[arg(long, value_name = "V")]
    pub torch_version: Option<String>,
}

impl TorchVersionArg {
    /// Selects the release for every allocator config of this process.
    pub fn select(&self) -> Result<(), crate::error::InputError> {
        if let Some(v) = &self.torch_version {
            crate::gpu::torch_version::TorchVersion::parse(v)?.select();
        }
        Ok(())
    }
}

/// Which GPU's history a PyTorch snapshot of several gives (`--snapshot-device N`).
#[derive(Args, Debug, Clone, Default)]
pub struct SnapshotDeviceArg {
    /// A PyTorch snapshot of several GPUs: replay device N's history (default: the first recorded).
    #[arg(long, value_name = "N")]
    pub snapshot_device: Option<usize>,
}

impl SnapshotDeviceArg {
    /// Opens `input` (see [`Source::open_snapshot_device`]).
    pub fn open(&self, input: &std::path::Path) -> anyhow::Result<Source> {
        Source::open_snapshot_device(Some(input), self.snapshot_device)
    }
}

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Device memory, e.g. 80GiB, 24GB, 81079MiB (default: the H100-80GB card's 85,017,493,504
    /// bytes, as torch reports them; `allocbench cards`). The allocator alone: no CUDA context.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// What to do at an out-of-memory: stop the replay, or skip the allocation and continue.
    #[arg(long, value_enum, default_value = "stop")]
    pub on_oom: OnOom,
    /// Also sample the memory timeline every N events (it is always sampled at every step; past
    /// 4,000 points, neighbouring points merge and the strides double).
    #[arg(long)]
    pub sample_every: Option<u64>,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Where device memory comes from: the simulated device, or a real GPU (CUDA driver).
    #[arg(long, value_enum, default_value = "sim")]
    pub device: Backend,
    /// Price the simulated device's calls with latencies measured by `allocbench devprobe` (its
    /// results file; default: the embedded H100 table) and report them as device time.
    #[arg(long, visible_alias = "latency")]
    pub sim_latency: Option<PathBuf>,
    /// Where the simulated device places cudaMallocs: `lowest` (first fit, the default) or
    /// `driver` (as an H100's driver did: large ones top-down, freed ranges not reused at once).
    /// The default stays `lowest` until fidelity data from a GPU shows `driver` matches better.
    #[arg(long, value_enum, default_value = "lowest")]
    pub address_order: AddressOrder,
}

impl DeviceArgs {
    /// The device these flags name (`--sim-latency` read now).
    pub fn spec(&self) -> anyhow::Result<DeviceSpec> {
        let latency = self.sim_latency.as_deref().map(crate::gpu::devprobe::LatencyModel::load).transpose()?;
        Ok(DeviceSpec { backend: self.device, capacity: self.capacity, addresses: Vec::new(), latency, address_order: self.address_order, withheld: 0 })
    }

    pub fn replay_options(&self) -> ReplayOptions {
        ReplayOptions { on_oom: self.on_oom, sample_every_events: self.sample_every, ..Default::default() }
    }
}

pub fn parse_capacity(s: &str) -> Result<u64, String> {
    let bytes = crate::units::check_capacity(parse_bytes(s)?)?;
    // A bare number is bytes: `--capacity 80` is 80 bytes, not a card. Under 1 MiB no segment
    // fits (the smallest is 2 MiB), so a unit was surely forgotten.
    let unitless = s.trim().chars().all(|c| c.is_ascii_digit() || c == '.' || c == '_');
    if unitless && bytes < crate::units::MIB {
        return Err(format!("'{}' is {bytes} bytes (a size without a unit is bytes): write it with its unit, e.g. {}GiB", s.trim(), s.trim()));
    }
    Ok(bytes)
}

/// A size that may be nothing (`0`, or with a unit: `426MiB`); a bare number above 0 needs its unit.
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_capacity(s)
}

/// The card a verdict is for: a named one or a raw size, and what the job holds on it outside
/// PyTorch's caching allocator (the verdicts of diagnose, advise and fit count both).
#[derive(Args, Debug, Clone, Default)]
pub struct CardArgs {
    /// The card, by name (`allocbench cards` lists them): its memory as
    /// torch.cuda.get_device_properties().total_memory reports it [default: H100-80GB].
    #[arg(long, conflicts_with = "capacity")]
    pub card: Option<String>,
    /// The device's memory as a size instead (e.g. 24GiB, 81079MiB), said as given.
    #[arg(long, value_parser = parse_capacity)]
    pub capacity: Option<u64>,
    /// The CUDA context the process holds outside the allocator [default: 426MiB, docs/cards.md].
    #[arg(long, value_parser = parse_size_or_zero, value_name = "SIZE")]
    pub cuda_context: Option<u64>,
    /// NCCL's buffers outside the allocator [default: a sharded capture's communicators'
    /// (channels x NCCL_BUFFSIZE x peers), else 0, one process].
    #[arg(long, value_parser = parse_size_or_zero, value_name = "SIZE")]
    pub nccl: Option<u64>,
}

/// What [`CardArgs`] resolve to.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The card's memory.
    pub capacity: u64,
    pub outside: crate::gpu::card::Outside,
}

impl CardArgs {
    /// The card for `source`: `--card`, `--capacity`, the fake card a capture was bounded by,
    /// else the default card.
    pub fn target(&self, source: &Source) -> Result<Target, crate::error::InputError> {
        let capacity = match &self.card {
            Some(name) => crate::gpu::card::find(name).map_err(|m| crate::error::InputError::new("--card", m))?.total_memory,
            None => capacity_for(self.capacity, source)?.unwrap_or_else(|| crate::gpu::card::default_card().total_memory),
        };
        let defaults = crate::gpu::card::Outside::default();
        // A rank of a sharded capture or workload brings its communicators' buffers (said
        // once, on stderr).
        let nccl = self.nccl.or_else(|| {
            let budget = source.nccl_budget()?;
            let whose = if matches!(source, Source::Workload(_)) { "the workload's [transformer.fsdp]" } else { "the capture's communicators" };
            eprintln!("note: NCCL {} outside the allocator: {} ({whose}; --nccl overrides)", crate::units::format_bytes(budget.bytes()), budget.describe());
            Some(budget.bytes())
        });
        let outside = crate::gpu::card::Outside { cuda_context: self.cuda_context.unwrap_or(defaults.cuda_context), nccl: nccl.unwrap_or(defaults.nccl) };
        if outside.total() >= capacity {
            return Err(crate::error::InputError::new(
                if self.card.is_some() { "--card" } else { "--capacity" },
                format!(
                    "{} outside the allocator leaves nothing of the {} card: give a larger card, or --cuda-context 0 for the allocator alone",
                    outside.describe(),
                    crate::units::format_bytes(capacity)
                ),
            ));
        }
        Ok(Target { capacity, outside })
    }
}

/// The capacity a run on the simulated device uses: `--capacity`, else the fake card a capture
/// ran on when it was not the default H100's (its script's OOM handling was sized for that card;
/// said on standard error), else `None` (the default).
pub fn capacity_for(flag: Option<u64>, source: &Source) -> Result<Option<u64>, crate::error::InputError> {
    if flag.is_some() {
        return Ok(flag);
    }
    let Some(card) = source.capture_device_memory()?.filter(|&bytes| bytes != crate::gpu::device::H100_CAPACITY_BYTES) else {
        return Ok(None);
    };
    eprintln!("note: capacity {}: the fake card the capture ran on (capture --device-memory); --capacity overrides", crate::units::format_bytes(card));
    Ok(Some(card))
}

/// Says what an imported trace left out (on standard error).
pub fn print_notes(source: &Source) {
    for note in source.notes() {
        eprintln!("{note}");
    }
}
