//! `allocbench diagnose`: why a job OOMs (or how much headroom it has), whether it is
//! fragmentation or exhaustion, what pins free memory at the peak, and the smallest device it
//! fits on. `advise` (the conf search) lives in `advise.rs`.
//!
//! The analysis returns data ([`diagnose`]: the replay, the waste breakdown, the sites, and the
//! capacity search [`min_capacity`]); text is rendered from it ([`summary`]: the sentences the
//! record keeps for JSON readers, [`describe`]: the whole diagnosis for people).

use crate::error::InputError;
use crate::event::Event;
use crate::gpu::build::{build, DeviceSpec};
use crate::gpu::card::{describe_capacity, Outside};
use crate::gpu::config::AllocatorConfig;
use crate::gpu::replay::{ReplayOptions, StopWhen};
use crate::input::Source;
use crate::results::{DiagnoseResult, GpuPolicy, GpuRunResult, OnOom, OomCause, OomRecord, PinningClass, SegmentWaste, SCHEMA_VERSION};
use crate::units::format_bytes;

/// Materialises a source's events (diagnosis replays them many times).
pub fn load_events(source: &Source) -> anyhow::Result<Vec<Event>> {
    load_at_most(source, MAX_LOADED_EVENTS)
}

fn load_at_most(source: &Source, most: usize) -> anyhow::Result<Vec<Event>> {
    let mut events = Vec::new();
    for event in source.events()? {
        if events.len() == most {
            return Err(InputError::new(
                source.origin(),
                format!(
                    "more than {most} events ({} in memory): this analysis replays them many times from memory; cut the input (fewer steps) or use `allocbench replay`, which streams it",
                    format_bytes((most * std::mem::size_of::<Event>()) as u64)
                ),
            )
            .into());
        }
        events.push(event?);
        // (A workload of 10^8 steps generates for minutes: Ctrl-C and SIGTERM must stop it.)
        if events.len().is_multiple_of(crate::gpu::replay::CHECK_EVERY_EVENTS as usize) && crate::interrupt::interrupted() {
            let read = crate::units::count(events.len() as u64, "event");
            return Err(crate::interrupt::Interrupted(format!("while reading the input ({read} read): nothing analysed")).into());
        }
    }
    Ok(events)
}

/// The most events an analysis holds in memory (4 GiB of them): a trace of a few thousand steps
/// of a large model has millions; a bound keeps a runaway workload from taking the machine.
pub const MAX_LOADED_EVENTS: usize = 1 << 27;

/// Bisection on capacity: the smallest device (2 MiB steps) where the replay has no OOM, with
/// `withheld` bytes of it held outside the allocator.
pub fn min_capacity(events: &[Event], addresses: &[(u64, u64)], conf: &AllocatorConfig, peak_live: u64, withheld: u64) -> anyhow::Result<Option<u64>> {
    min_capacity_until(events, addresses, conf, peak_live, withheld, crate::interrupt::interrupted)
}

/// Whether the replay of `events` on a `capacity` card, `withheld` of it outside the allocator,
/// ends without an OOM.
pub fn fits(events: &[Event], addresses: &[(u64, u64)], conf: &AllocatorConfig, capacity: u64, withheld: u64) -> anyhow::Result<bool> {
    Ok(crate::gpu_run::replay_sim(events, addresses, conf, capacity, withheld, OnOom::Stop)?.0.oom.is_none())
}

/// The smallest card of the table, from `at_least` bytes up, the workload runs on without an OOM.
pub fn smallest_card(
    events: &[Event],
    addresses: &[(u64, u64)],
    conf: &AllocatorConfig,
    at_least: u64,
    withheld: u64,
) -> anyhow::Result<Option<&'static crate::gpu::card::Card>> {
    for card in crate::gpu::card::by_size().into_iter().filter(|c| c.total_memory >= at_least && c.total_memory > withheld) {
        if fits(events, addresses, conf, card.total_memory, withheld)? {
            return Ok(Some(card));
        }
    }
    Ok(None)
}

/// [`min_capacity`], stopped (an [`crate::interrupt::Interrupted`] error) once `stop()` says so.
fn min_capacity_until(
    events: &[Event],
    addresses: &[(u64, u64)],
    conf: &AllocatorConfig,
    peak_live: u64,
    withheld: u64,
    stop: impl Fn() -> bool,
) -> anyhow::Result<Option<u64>> {
    const STEP: u64 = 2 << 20;
    if peak_live > crate::units::MAX_SANE_BYTES {
        // More live bytes than the largest device the bisection tries (a request under 1 EiB).
        return Ok(None);
    }
    let fits = |c: u64| -> anyhow::Result<bool> {
        // Polled between replays (Ctrl-C, SIGTERM): a search of many short replays would not see
        // a replay's own checkpoints.
        if stop() {
            return Err(crate::interrupt::Interrupted("while searching for the smallest device that fits: nothing written".into()).into());
        }
        fits(events, addresses, conf, c, withheld)
    };
    if peak_live == 0 && fits(withheld)? {
        return Ok(Some(withheld)); // nothing reaches the allocator
    }
    // In steps; below the live bytes (and what is held outside) nothing fits.
    let mut lo = (peak_live.saturating_add(withheld) / STEP).max(1);
    let mut hi = lo * 2;
    while !fits(hi * STEP)? {
        hi *= 2;
        if hi * STEP > crate::units::MAX_SANE_BYTES {
            return Ok(None);
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid * STEP)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    // Segments are whole 2 MiB multiples (kRoundLarge, kSmallBuffer, expandable pages), so the
    // 2 MiB step is exact, except under a memory fraction: the cap, fraction × capacity, then
    // crosses a segment boundary anywhere, and the last step is bisected to the byte.
    let mut top = hi * STEP;
    if conf.allowed_bytes(top).is_some() {
        // Neither the step below (or, at the first step, the live peak less a byte) fits.
        let mut bottom = ((hi - 1) * STEP).max((peak_live + withheld).saturating_sub(1));
        while top - bottom > 1 {
            let mid = bottom + (top - bottom) / 2;
            if fits(mid)? {
                top = mid;
            } else {
                bottom = mid;
            }
        }
    }
    Ok(Some(top))
}

/// Replays `source` on a `capacity` card, `outside` of it held outside the allocator, and
/// explains the first OOM (or the headroom): the segment breakdown at that moment, the
/// allocation sites, and the smallest device and card that fit ([`min_capacity`]), when the
/// trace is the whole run. Returns the diagnosis and the replay behind it; the prose in its
/// `summary` is rendered from the data by [`summary`].
pub fn diagnose(source: &Source, conf: &AllocatorConfig, capacity: u64, outside: Outside) -> anyhow::Result<(DiagnoseResult, GpuRunResult)> {
    let events = load_events(source)?;
    let withheld = outside.total();
    let device = DeviceSpec { addresses: source.address_script(), withheld, ..DeviceSpec::sim(capacity) };
    let mut built = build(GpuPolicy::Pytorch, conf, &device)?;
    let opts = ReplayOptions { on_oom: OnOom::Stop, ..Default::default() };
    let run = crate::gpu_run::run_one(
        &mut built,
        conf,
        Box::new(events.iter().copied().map(Ok)),
        source.info()?,
        &opts,
        &mut StopWhen(crate::interrupt::interrupted),
    )?;
    let w = waste(&run);
    let (top_sites, oom_site) = top_sites(source, run.oom.as_ref().map(|o| o.event))?;
    let top_sites_live = live_sites(source, &events, &device, conf, run.oom.is_some())?;
    // The replay stops at an OOM: the whole workload's peak live bytes come from the events.
    let full_peak_live = crate::event::peak_live_bytes(events.iter().copied().map(Ok), |b| b)?;
    // A trace cut short (its capture stopped at an error or its fake card's OOM) is not the
    // whole run: what fits it says nothing of what fits the job.
    let steps = crate::event::step_count(&events);
    let not_whole_run = source.capture_incomplete().map(|why| format!("{why}, after {}", crate::units::count(steps, "complete step")));
    let (min_cap, smallest) = if not_whole_run.is_some() {
        (None, None)
    } else {
        let min_cap = min_capacity(&events, &source.address_script(), conf, full_peak_live, withheld)?;
        let smallest = match min_cap {
            Some(m) => smallest_card(&events, &source.address_script(), conf, m, withheld)?.map(|c| c.name.to_string()),
            None => None,
        };
        (min_cap, smallest)
    };
    let device_free = capacity.saturating_sub(withheld).saturating_sub(run.summary.peak_reserved);
    let mut result = DiagnoseResult {
        schema_version: SCHEMA_VERSION,
        workload: run.workload.clone(),
        capacity,
        conf: conf.source.clone(),
        oom: run.oom.clone(),
        headroom: run.oom.is_none().then(|| conf.allowed_bytes(capacity).map_or(device_free, |a| a.saturating_sub(run.summary.peak_reserved).min(device_free))),
        allowed: conf.allowed_bytes(capacity),
        peak_reserved: run.summary.peak_reserved,
        allocated_at_peak: run.summary.allocated_at_peak_reserved,
        peak_live_bytes: full_peak_live,
        pinned_free_bytes: w.pinned_free,
        cached_free_segments_bytes: w.cached_free,
        pending_free_bytes: w.pending,
        private_pool_bytes: w.private_pool,
        private_pool_free_bytes: w.private_pool_free,
        largest_free_block: w.largest,
        top_segments: w.top,
        pinning_size_classes: w.pinning,
        top_sites,
        top_sites_live,
        oom_site,
        min_capacity: min_cap,
        outside,
        device_total: run.summary.peak_reserved + withheld,
        not_whole_run,
        smallest_card: smallest,
        conflicts: conf.conflicts(),
        summary: Vec::new(),
        ranks: Vec::new(),
        decided_by_rank: None,
    };
    result.summary = summary(&result);
    Ok((result, run))
}

/// A sharded job's verdict from its ranks' diagnoses (`diagnose DIR`, one per trace of the
/// folder): the rank that decides it is the first to run out of memory (the earliest step),
/// else the one nearest the card's end; its diagnosis is returned with every rank's line and a
/// first sentence saying which rank decided and why.
pub fn decide_by_rank(diagnosed: Vec<(crate::trace::ranks::RankTrace, DiagnoseResult)>) -> Option<DiagnoseResult> {
    use crate::results::diagnose::RankVerdict;
    let verdicts: Vec<RankVerdict> = diagnosed
        .iter()
        .map(|(t, d)| RankVerdict {
            ranks: t.ranks(),
            trace: t.path.display().to_string(),
            peak_reserved: d.peak_reserved,
            device_total: d.device_total,
            nccl: d.outside.nccl,
            oom_step: d.oom.as_ref().map(|o| o.step),
            headroom: d.headroom,
            min_capacity: d.min_capacity,
        })
        .collect();
    let worst =
        diagnosed.iter().enumerate().min_by_key(|(_, (_, d))| crate::trace::ranks::worst_first(d.oom.as_ref().map(|o| (o.step, o.event)), d.device_total))?;
    let index = worst.0;
    let trace = diagnosed[index].0.clone();
    let (rank, label, traces) = (trace.rank, trace.label(), diagnosed.len());
    let ranks_in_all: usize = verdicts.iter().map(|v| v.ranks.len()).sum();
    let mut decided = diagnosed.into_iter().nth(index)?.1;
    let why = match &decided.oom {
        Some(o) => format!("the first to run out of memory, at step {}", o.step),
        None => "the least headroom".to_string(),
    };
    let verb = if trace.same_role.is_empty() { "decides" } else { "decide" };
    decided.summary.insert(
        0,
        format!(
            "{}{} {verb} the job's verdict ({why}; {} for {}; each rank's line follows).",
            label[..1].to_uppercase(),
            &label[1..],
            crate::units::count(traces as u64, "trace"),
            crate::units::count(ranks_in_all as u64, "rank")
        ),
    );
    decided.ranks = verdicts;
    decided.decided_by_rank = Some(rank);
    Some(decided)
}

/// Where the free bytes are at the OOM (else at the peak).
struct Waste {
    /// Segments with the most free bytes, pinned ones first (10).
    top: Vec<SegmentWaste>,
    pinned_free: u64,
    cached_free: u64,
    /// In blocks awaiting another stream's events.
    pending: u64,
    /// Reserved in private pools, and free there.
    private_pool: u64,
    private_pool_free: u64,
    largest: u64,
    /// Size classes of the live blocks that pin the most free space (8).
    pinning: Vec<PinningClass>,
}

fn waste(run: &GpuRunResult) -> Waste {
    // At an OOM, the state that failed; otherwise the peak.
    let segs = if run.oom.is_some() { &run.segments_at_oom } else { &run.segments_at_peak };
    let mut top: Vec<SegmentWaste> = segs
        .iter()
        .map(|s| SegmentWaste {
            address: s.address,
            segment_type: s.segment_type,
            total_size: s.total_size,
            free_bytes: s.total_size - s.active(),
            // A block pending its free pins its segment as a live one does.
            live_blocks: s.blocks.iter().filter(|b| b.is_active()).count(),
            free_pieces: s.blocks.iter().filter(|b| !b.is_active()).count(),
        })
        .collect();
    let pinned_free: u64 = top.iter().filter(|s| s.live_blocks > 0).map(|s| s.free_bytes).sum();
    let cached_free: u64 = top.iter().filter(|s| s.live_blocks == 0).map(|s| s.free_bytes).sum();
    let pending: u64 = segs.iter().map(|s| s.active() - s.allocated()).sum();
    let private = || segs.iter().filter(|s| s.private_pool.is_some());
    let private_pool: u64 = private().map(|s| s.total_size).sum();
    let private_pool_free: u64 = private().map(|s| s.total_size - s.active()).sum();
    let largest = segs.iter().flat_map(|s| s.blocks.iter().filter(|b| !b.is_active()).map(|b| b.size)).max().unwrap_or(0);
    top.sort_by_key(|s| (std::cmp::Reverse(if s.live_blocks > 0 { s.free_bytes } else { 0 }), std::cmp::Reverse(s.free_bytes), s.address));
    top.truncate(10);
    let mut classes: std::collections::BTreeMap<u64, PinningClass> = std::collections::BTreeMap::new();
    for s in segs.iter().filter(|s| s.allocated() > 0 && s.active() < s.total_size) {
        let free = s.total_size - s.active();
        let live: Vec<u64> = s.blocks.iter().filter(|b| b.is_allocated()).map(|b| b.size).collect();
        for &b in &live {
            let class = 1u64 << b.max(1).ilog2();
            let c = classes.entry(class).or_insert(PinningClass { size_class: class, live_blocks: 0, live_bytes: 0, pinned_free_bytes: 0 });
            c.live_blocks += 1;
            c.live_bytes += b;
            c.pinned_free_bytes += free / live.len() as u64;
        }
    }
    let mut pinning: Vec<PinningClass> = classes.into_values().collect();
    pinning.sort_by_key(|c| std::cmp::Reverse(c.pinned_free_bytes));
    pinning.truncate(8);
    Waste { top, pinned_free, cached_free, pending, private_pool, private_pool_free, largest, pinning }
}

/// (site, bytes requested there).
type SiteBytes = (String, u64);

/// The bytes each allocation site held at the moment the diagnosis is of (the OOM, else the
/// peak): the requests of the blocks allocated then, by the site of their trace id, largest first
/// (8). What sums over the whole run (a training loop's activations, thousands of times) says
/// little about what filled the card.
fn live_sites(source: &Source, events: &[Event], device: &DeviceSpec, conf: &AllocatorConfig, at_oom: bool) -> anyhow::Result<Vec<SiteBytes>> {
    let Some(sites) = source.sites()? else { return Ok(Vec::new()) };
    let owners = crate::gpu_run::segment_owners(GpuPolicy::Pytorch, conf, device, Box::new(events.iter().copied().map(Ok)), OnOom::Stop)?;
    let (segments, ids) = if at_oom { (&owners.at_oom, &owners.oom_owners) } else { (&owners.at_peak.segments, &owners.at_peak.owners) };
    let mut by_site = vec![0u64; sites.names.len()];
    for (segment, ids) in segments.iter().zip(ids) {
        for (block, id) in segment.blocks.iter().zip(ids) {
            if let Some(&site) = id.filter(|_| block.is_allocated()).and_then(|id| sites.of_id.get(&id)) {
                by_site[site as usize] += block.requested_size;
            }
        }
    }
    let mut v: Vec<SiteBytes> = sites.names.iter().cloned().zip(by_site).filter(|(_, bytes)| *bytes > 0).collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    v.truncate(8);
    Ok(v)
}

/// Bytes requested per allocation site (snapshots with stacks, captures with sites), largest
/// first (8); with an OOM at event `oom`, only the requests up to it (those after never ran), and
/// the failing request's site.
fn top_sites(source: &Source, oom: Option<u64>) -> anyhow::Result<(Vec<SiteBytes>, Option<String>)> {
    let Some(sites) = source.sites()? else { return Ok((Vec::new(), None)) };
    let mut by_site = vec![0u64; sites.names.len()];
    let mut oom_site = None;
    for (index, event) in source.events()?.enumerate() {
        if oom.is_some_and(|o| index as u64 > o) {
            break;
        }
        if let Event::Alloc { id, bytes, .. } = event? {
            if let Some(&s) = sites.of_id.get(&id) {
                by_site[s as usize] += bytes;
                if oom == Some(index as u64) {
                    oom_site = Some(sites.names[s as usize].clone());
                }
            }
        }
    }
    let mut v: Vec<(String, u64)> = sites.names.iter().cloned().zip(by_site).filter(|(_, bytes)| *bytes > 0).collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    v.truncate(8);
    Ok((v, oom_site))
}

/// Why the OOM happened, with the numbers that decide its cause (one cause, see `OomInfo::cause`).
fn cause_sentence(o: &OomRecord) -> String {
    let (cached, largest) = (format_bytes(o.cached_free), format_bytes(o.largest_free_block));
    // Under a memory-fraction cap, what the cap left is what the policy could get.
    let device = format!("{} {}", format_bytes(o.device_free), if o.allowed.is_some() { "below the memory-fraction cap" } else { "on the device" });
    match o.cause {
        OomCause::Fragmentation => format!(
            "Cause: fragmentation. {cached} were free inside the allocator's segments and {device}, together enough for the request, but the largest free block was {largest}: the free pieces sit between live blocks, so no cached block could serve it and no new segment could be made."
        ),
        OomCause::SegmentSize => format!(
            "Cause: segment size. There were {device}, enough for the {} request, but the allocator must create a {} segment for it{}.",
            format_bytes(o.rounded),
            format_bytes(o.alloc_size),
            if o.cached_free > 0 { format!(", and no block among the {cached} free in its segments fits") } else { String::new() }
        ),
        OomCause::FractionLimit => format!(
            "Cause: the memory-fraction limit. per_process_memory_fraction's {} cap left {} while the device itself had {} free: {} allocated plus the {} request exceed what the fraction allows ({cached} free in the cache).",
            o.allowed.map(format_bytes).unwrap_or_else(|| "?".into()),
            format_bytes(o.device_free),
            format_bytes(o.device_free_uncapped.max(o.device_free)),
            format_bytes(o.allocated),
            format_bytes(o.rounded)
        ),
        OomCause::PrivatePools => format!(
            "Cause: private pools. {cached} were free in the allocator's segments and {device}, together enough for the request, but {} of them sit in pools it cannot use (a CUDA graph's or a MemPool's, or the allocator's own for a capture's request); those are given back only after the pool's graphs are reset or deleted and the cache is emptied.",
            format_bytes(o.other_pools_free)
        ),
        OomCause::Rejected => format!(
            "Cause: refused up front. throw_on_cudamalloc_oom rejected the {} segment because the device had {} free, without giving back the {cached} free in the allocator's cache and retrying (as it would without the setting).",
            format_bytes(o.alloc_size),
            format_bytes(o.device_free_uncapped.max(o.device_free))
        ),
        OomCause::Capacity => format!(
            "Cause: real exhaustion. {} allocated plus the {} request exceed what the device can give ({} reserved, {} free on the device): the workload holds more than this device has.",
            format_bytes(o.allocated),
            format_bytes(o.rounded),
            format_bytes(o.reserved),
            // (Results written before the uncapped figure was kept have only the capped one.)
            format_bytes(o.device_free_uncapped.max(o.device_free))
        ),
    }
}

/// The diagnosis in sentences: the OOM and its cause (or the headroom), the breakdown, what pins
/// free space, and the device that fits.
pub fn summary(d: &DiagnoseResult) -> Vec<String> {
    let capacity = d.capacity;
    let mut summary = Vec::new();
    let card = crate::gpu::card::in_sentence(capacity);
    let outside = d.outside.total();
    // "H100-80GB (79.2 GiB; CUDA context 426 MiB of it outside the allocator)"
    let card_outside = format!("{card}{}", d.outside.of_the_card());
    match &d.oom {
        Some(o) => {
            summary.push(format!(
                "OOM at step {} (event {}): a request of {} (rounded {}, a {} device allocation) could not be served on {card_outside}.",
                o.step,
                o.event,
                format_bytes(o.requested),
                format_bytes(o.rounded),
                format_bytes(o.alloc_size),
            ));
            summary.push(cause_sentence(o));
            if let Some(site) = &d.oom_site {
                summary.push(format!("The failing request was made at {site}."));
            }
        }
        None if d.allowed.is_some_and(|cap| d.peak_reserved > cap) => summary.push(format!(
            "No OOM on {card} (per_process_memory_fraction caps the allocator at {}): peak reserved {} is {} over the cap ({}).",
            format_bytes(d.allowed.unwrap_or(0)),
            format_bytes(d.peak_reserved),
            format_bytes(d.peak_reserved - d.allowed.unwrap_or(0)),
            crate::results::gpu::OVER_CAP_WHY
        )),
        None if outside > 0 => summary.push(format!(
            "No OOM on {card}{}: the device total at the peak is {} (the allocator's {} reserved + {} outside it: what nvidia-smi would show), leaving {} of headroom{}.",
            d.allowed.map(|a| format!(" (per_process_memory_fraction caps the allocator at {})", format_bytes(a))).unwrap_or_default(),
            format_bytes(d.device_total),
            format_bytes(d.peak_reserved),
            d.outside.describe(),
            format_bytes(d.headroom.unwrap_or(0)),
            if d.allowed.is_some() { " under the cap" } else { "" }
        )),
        None => summary.push(format!(
            "No OOM on {card}{}: peak reserved {} leaves {} of headroom{}.",
            d.allowed.map(|a| format!(" (per_process_memory_fraction caps the allocator at {})", format_bytes(a))).unwrap_or_default(),
            format_bytes(d.peak_reserved),
            format_bytes(d.headroom.unwrap_or(0)),
            if d.allowed.is_some() { " under the cap" } else { "" }
        )),
    }
    summary.push(format!(
        "At {} {}: {} allocated then; {} free inside segments that hold live blocks (pinned), {} in wholly free cached segments; largest free block {}.",
        if d.oom.is_some() { "the OOM, with reserved at" } else { "peak reserved" },
        format_bytes(d.oom.as_ref().map(|o| o.reserved).unwrap_or(d.peak_reserved)),
        format_bytes(d.oom.as_ref().map(|o| o.allocated).unwrap_or(d.allocated_at_peak)),
        format_bytes(d.pinned_free_bytes),
        format_bytes(d.cached_free_segments_bytes),
        format_bytes(d.largest_free_block)
    ));
    if d.pending_free_bytes > 0 {
        summary.push(format!(
            "{} more were freed but wait for another stream's work (record_stream): not reusable until that stream syncs.",
            format_bytes(d.pending_free_bytes)
        ));
    }
    if d.private_pool_bytes > 0 {
        summary.push(format!(
            "{} of the reserved bytes are in private pools (CUDA graphs, MemPools), {} of them free: only the pool's own allocations can use those, and a pool gives them back only after its graphs are reset or deleted and the cache is emptied.",
            format_bytes(d.private_pool_bytes),
            format_bytes(d.private_pool_free_bytes)
        ));
    }
    if let Some(c) = d.pinning_size_classes.first() {
        summary.push(format!(
            "Blocks of {}..{} pin the most free space ({} next to {} free).",
            format_bytes(c.size_class),
            format_bytes(c.size_class * 2),
            crate::units::count(c.live_blocks, "live block"),
            format_bytes(c.pinned_free_bytes)
        ));
    }
    match (&d.not_whole_run, d.min_capacity) {
        (Some(why), _) => summary.push(format!(
            "This trace is not the whole run (the capture ended: {why}), so no card is named as fitting: what ran peaked at {} live. To see the whole run, capture again without --device-memory (the fake card is unbounded by default); for the largest batch that fits a card, `allocbench fit`.",
            format_bytes(d.peak_live_bytes)
        )),
        (None, Some(m)) => summary.push(format!(
            "It runs without an OOM on a device of {} or more with this configuration ({}the whole workload peaks at {} live: the ideal allocator's need){}.",
            crate::units::format_bytes_apart(m, capacity),
            if outside > 0 { format!("{} outside the allocator included; ", format_bytes(outside)) } else { String::new() },
            format_bytes(d.peak_live_bytes),
            d.smallest_card
                .as_deref()
                .and_then(|name| crate::gpu::card::find(name).ok())
                .map(|c| format!("; the smallest card in the table: {}", describe_capacity(c.total_memory)))
                .unwrap_or_default()
        )),
        (None, None) => summary.push("No device up to 1 PiB runs it without an OOM.".into()),
    }
    summary.extend(d.conflicts.iter().map(|c| format!("Conflict in the conf: {c}.")));
    summary
}

/// The diagnosis for people: the summary, then the segments, size classes and sites behind it.
pub fn describe(d: &DiagnoseResult) -> String {
    let mut s = String::new();
    for line in &d.summary {
        s += &format!("{line}\n");
    }
    if !d.ranks.is_empty() {
        s += &format!("\n{:<26} {:>14} {:>10} {:>13}  {}\n", "ranks", "peak reserved", "NCCL", "device total", "verdict");
        for v in &d.ranks {
            let verdict = match (v.oom_step, v.headroom) {
                (Some(step), _) => format!("OOM at step {step}"),
                (None, Some(h)) => format!("fits, {} headroom", format_bytes(h)),
                (None, None) => "fits".into(),
            };
            s += &format!(
                "{:<26} {:>14} {:>10} {:>13}  {verdict}{}\n",
                crate::trace::ranks::ranges(&v.ranks),
                format_bytes(v.peak_reserved),
                format_bytes(v.nccl),
                format_bytes(v.device_total),
                if Some(v.ranks[0]) == d.decided_by_rank { "  <- decides" } else { "" }
            );
        }
    }
    if !d.top_segments.is_empty() {
        s += "\nsegments with the most free bytes (pinned first):\n";
        for g in d.top_segments.iter().take(5) {
            s += &format!(
                "  {:#x} {:<5} {:>10}: {:>10} free in {}, {}\n",
                g.address,
                g.segment_type,
                format_bytes(g.total_size),
                format_bytes(g.free_bytes),
                crate::units::count(g.free_pieces as u64, "piece"),
                crate::units::count(g.live_blocks as u64, "live block")
            );
        }
    }
    if !d.pinning_size_classes.is_empty() {
        s += "\nsize classes of the live blocks that pin free space:\n";
        for c in &d.pinning_size_classes {
            s += &format!(
                "  {:>10} .. {:<10} {:>13}, {:>10} live, {:>10} free beside them\n",
                format_bytes(c.size_class),
                format_bytes(c.size_class * 2),
                crate::units::count(c.live_blocks, "block"),
                format_bytes(c.live_bytes),
                format_bytes(c.pinned_free_bytes)
            );
        }
    }
    if !d.top_sites_live.is_empty() {
        s += if d.oom.is_some() { "\nallocation sites by bytes live at the OOM:\n" } else { "\nallocation sites by bytes live at the peak:\n" };
        for (site, bytes) in &d.top_sites_live {
            s += &format!("  {:>10}  {site}\n", format_bytes(*bytes));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input past the bound is refused naming it, before its events take the machine; one at
    /// the bound loads whole.
    #[test]
    fn loading_stops_at_the_bound() {
        let path = format!("{}/workloads/scenario-sawtooth.toml", env!("CARGO_MANIFEST_DIR"));
        let source = Source::open(Some(std::path::Path::new(&path))).unwrap();
        let all = load_events(&source).unwrap();
        assert_eq!(load_at_most(&source, all.len()).unwrap(), all);
        let e = load_at_most(&source, all.len() - 1).unwrap_err().to_string();
        assert!(e.starts_with(&path) && e.contains(&format!("more than {} events", all.len() - 1)), "{e}");
    }

    /// The search polls its stop flag between replays: a stop is an interruption, not an answer.
    #[test]
    fn the_capacity_search_stops_between_replays() {
        let events = [Event::Alloc { id: 1, bytes: 5 << 30, stream: 0 }, Event::Free { id: 1 }];
        let replays = std::cell::Cell::new(0);
        let stop_after_three = || {
            replays.set(replays.get() + 1);
            replays.get() > 3
        };
        let err = min_capacity_until(&events, &[], &AllocatorConfig::default(), 5 << 30, 0, stop_after_three).unwrap_err();
        assert!(err.downcast_ref::<crate::interrupt::Interrupted>().is_some(), "{err}");
        assert_eq!(replays.get(), 4, "stopped at the first poll that said so");
    }

    /// The smallest card is exact: to the 2 MiB step segments come in, and to the byte under a
    /// memory fraction (5 GiB at 0.75 needs floor(0.75 × C) ≥ 5 GiB: C = ⌈5 GiB / 0.75⌉).
    #[test]
    fn the_smallest_card_is_exact_under_a_memory_fraction() {
        let events = [Event::Alloc { id: 1, bytes: 5 << 30, stream: 0 }, Event::Free { id: 1 }];
        let plain = AllocatorConfig::default();
        assert_eq!(min_capacity(&events, &[], &plain, 5 << 30, 0).unwrap(), Some(5 << 30));
        let capped = AllocatorConfig::parse("per_process_memory_fraction:0.75").unwrap();
        let min = min_capacity(&events, &[], &capped, 5 << 30, 0).unwrap().unwrap();
        assert_eq!(min, 7_158_278_827);
        let fits = |c: u64| crate::gpu_run::replay_sim(&events, &[], &capped, c, 0, OnOom::Stop).unwrap().0.oom.is_none();
        assert!(fits(min) && !fits(min - 1));
    }

    /// What lives outside the allocator takes its bytes off the card: 426 MiB more card, exactly,
    /// without a fraction; under one the cap still counts from the whole card, so the card need
    /// only leave the allocator its 5 GiB: max(⌈5 GiB / 0.75⌉, 5 GiB + 426 MiB).
    #[test]
    fn the_smallest_card_counts_what_lives_outside_the_allocator() {
        let events = [Event::Alloc { id: 1, bytes: 5 << 30, stream: 0 }, Event::Free { id: 1 }];
        let outside = 426 << 20;
        assert_eq!(min_capacity(&events, &[], &AllocatorConfig::default(), 5 << 30, outside).unwrap(), Some((5 << 30) + outside));
        let capped = AllocatorConfig::parse("per_process_memory_fraction:0.75").unwrap();
        assert_eq!(min_capacity(&events, &[], &capped, 5 << 30, outside).unwrap(), Some(7_158_278_827));
        let small = AllocatorConfig::parse("per_process_memory_fraction:0.95").unwrap();
        let min = min_capacity(&events, &[], &small, 5 << 30, outside).unwrap().unwrap();
        assert!(fits(&events, &[], &small, min, outside).unwrap() && !fits(&events, &[], &small, min - 1, outside).unwrap());
        assert_eq!(min, (5 << 30) + outside, "the device, not the cap (5,651,272,758 B), decides here");
        // The smallest card of the table for 5 GiB and the context: the T4 (14,930 MiB).
        assert_eq!(smallest_card(&events, &[], &AllocatorConfig::default(), (5 << 30) + outside, outside).unwrap().unwrap().name, "T4");
    }
}
