//! `allocbench advise`: replays a space of `PYTORCH_CUDA_ALLOC_CONF` settings on every core and
//! picks one for an objective (memory, time, or least memory at about the defaults' time), every
//! configuration priced in modelled allocator time ([`LatencyModel`]); [`describe`] renders it.
//!
//! Speed: configurations that replay identically on the trace are replayed once
//! ([`behaviour_key`]; a memory fraction or GC that never bites shares its base's replay:
//! [`same_as_base`]), and a replay stops as soon as a finished configuration beats it for the
//! objective ([`Pruner`]). Which configurations stop early can depend on which finished first
//! (two threads); the recommendation cannot (exact ties aside): nothing is stopped by a worse one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use crate::event::Event;
use crate::gpu::build::{build, pytorch_on_sim, DeviceSpec};
use crate::gpu::caching::{allocation_size, round_size};
use crate::gpu::config::AllocatorConfig;
use crate::gpu::devprobe::{syncs, LatencyModel};
use crate::gpu::replay::{next_multiple_above, replay_observed, At, Observer, Peak, ReplayOptions, StopWhen, CHECK_EVERY_EVENTS};
use crate::gpu::stats::DeviceStats;
use crate::gpu::{GpuAllocator, OomInfo};
use crate::gpu_run::run_one;
use crate::results::{AdviseResult, Candidate, GpuPolicy, GpuRunResult, Objective, OnOom, WorkloadInfo, SCHEMA_VERSION};
use crate::units::format_bytes;

/// The balanced objective accepts extra modelled allocator time over the reference (the
/// defaults', or the fastest configuration's when the defaults OOM) up to this share of a
/// step's time, when the step time is known (`--step-time`)...
pub const STEP_TIME_SHARE: f64 = 0.01;
/// ... and else up to this much per step: 1 % of a 100 ms step (a training step takes tens to
/// thousands of milliseconds; an allocator cost means something only against the step it slows).
pub const DEFAULT_STEP_BUDGET_S: f64 = 0.001;

/// HBM bandwidth of the H100 SXM the time table prices (NVIDIA's H100 datasheet: 3.35 TB/s),
/// what a step's estimate is read at.
pub const H100_HBM_BYTES_PER_S: f64 = 3.35e12;
/// The H100 SXM's dense BF16 tensor-core peak (NVIDIA's H100 datasheet: 1,979 TFLOPS with
/// sparsity, half that dense): the fastest the step's math can run.
pub const H100_BF16_DENSE_FLOPS_PER_S: f64 = 989.4e12;

/// A floor of a step's time from the work the input shows, the larger of two: every byte it
/// allocates in a step written and read once at the card's memory bandwidth, and the step's
/// math (`flops` over the whole input: a capture's count, a transformer workload's model) at
/// the card's dense BF16 peak. A real step takes longer (kernels run below peak, the weights are
/// read, the host adds its part). `None` without allocations or math.
pub fn estimated_step_time_s(events: &[Event], steps: u64, flops: Option<f64>) -> Option<f64> {
    let bytes: u64 = events.iter().map(|e| if let Event::Alloc { bytes, .. } = e { *bytes } else { 0 }).sum();
    let traffic = 2.0 * bytes as f64 / steps.max(1) as f64 / H100_HBM_BYTES_PER_S;
    let math = flops.unwrap_or(0.0) / steps.max(1) as f64 / H100_BF16_DENSE_FLOPS_PER_S;
    let floor = traffic.max(math);
    (floor > 0.0).then_some(floor)
}

/// What decided a step's estimated floor `t` ([`estimated_step_time_s`]): the step's math at the
/// dense BF16 peak, or its allocated bytes moved once each way.
fn step_floor_basis(step_flops: Option<f64>, t: f64) -> String {
    match step_flops {
        Some(f) if (f / H100_BF16_DENSE_FLOPS_PER_S - t).abs() <= 1e-12 * t.max(1.0) => {
            format!("the step's {:.1} TFLOP of matmuls and attention at H100's dense BF16 peak, 989 TFLOP/s", f / 1e12)
        }
        _ => "the bytes allocated a step written and read once at 3.35 TB/s".to_string(),
    }
}

/// The balanced objective's allowance per step: [`STEP_TIME_SHARE`] of `step_time_s`, else
/// [`DEFAULT_STEP_BUDGET_S`].
pub fn step_budget_s(step_time_s: Option<f64>) -> f64 {
    step_time_s.map_or(DEFAULT_STEP_BUDGET_S, |t| t * STEP_TIME_SHARE)
}

/// The space `advise` searches (1,216 settings): expandable segments × roundup_power2_divisions
/// (scalar and per-interval lists) × max_split_size_mb (with max_non_split_rounding_mb) × garbage
/// collection / memory fraction. PyTorch's defaults ("") come first.
pub fn search_space() -> Vec<String> {
    let expandable = ["", "expandable_segments:True"];
    let roundup = [
        "",
        "roundup_power2_divisions:2",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:8",
        "roundup_power2_divisions:16",
        "roundup_power2_divisions:[256:1,512:2,>:4]",
        "roundup_power2_divisions:[64:8,256:4,1024:2,>:1]",
        "roundup_power2_divisions:[128:2,>:8]",
    ];
    let mut split = vec![String::new()];
    for mb in [32, 64, 128, 256, 512, 1024] {
        for rounding in ["", ",max_non_split_rounding_mb:64", ",max_non_split_rounding_mb:256"] {
            split.push(format!("max_split_size_mb:{mb}{rounding}"));
        }
    }
    let gc = [
        "",
        "per_process_memory_fraction:0.99",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99",
        "garbage_collection_threshold:0.8,per_process_memory_fraction:0.99",
    ];
    let mut out = Vec::new();
    for e in expandable {
        for s in &split {
            for r in roundup {
                for g in gc {
                    let parts: Vec<&str> = [s.as_str(), r, g, e].into_iter().filter(|p| !p.is_empty()).collect();
                    out.push(parts.join(","));
                }
            }
        }
    }
    out
}

/// What decides a replay on this trace: configurations with equal keys make identical replays.
/// The policy sees a request only through its rounded size (`round_size`; pool, segment size and
/// fit all follow from it), so the roundup setting counts by the rounded sizes of the trace's
/// request sizes (`rounding` indexes the distinct vectors); max_non_split_rounding_mb acts only
/// on oversize blocks, which exist only with max_split_size_mb; the GC runs only under a memory
/// fraction and frees only non-expandable segments (garbage_collect_cached_blocks).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BehaviourKey {
    rounding: usize,
    expandable: bool,
    max_split_size: u64,
    max_non_split_rounding: u64,
    gc_threshold_bits: u64,
    fraction_bits: u64,
    large_segment_size: u64,
}

/// Groups `configs` by [`BehaviourKey`] on a trace whose distinct request sizes are `sizes`.
/// Returns, per configuration, the index of its group's representative: the shortest conf
/// string (the fewest settings that give this behaviour), the first of those.
fn behaviour_key(configs: &[AllocatorConfig], sizes: &[u64]) -> (Vec<usize>, Vec<BehaviourKey>) {
    let mut roundings: Vec<Vec<u64>> = Vec::new();
    let mut by_divisions: HashMap<[u64; crate::gpu::config::ROUNDUP_INTERVALS], usize> = HashMap::new();
    let mut groups: HashMap<BehaviourKey, usize> = HashMap::new();
    let mut keys = Vec::with_capacity(configs.len());
    for (i, c) in configs.iter().enumerate() {
        let rounding = *by_divisions.entry(c.roundup_power2_divisions).or_insert_with(|| {
            let v: Vec<u64> = sizes.iter().map(|&n| round_size(c, n)).collect();
            roundings.iter().position(|r| *r == v).unwrap_or_else(|| {
                roundings.push(v);
                roundings.len() - 1
            })
        });
        let split = c.max_split_size != u64::MAX;
        let key = BehaviourKey {
            rounding,
            expandable: c.expandable_segments,
            max_split_size: c.max_split_size,
            max_non_split_rounding: if split { c.max_non_split_rounding_size } else { 0 },
            gc_threshold_bits: if c.gc_enabled() && !c.expandable_segments { c.garbage_collection_threshold.to_bits() } else { 0 },
            fraction_bits: c.per_process_memory_fraction.to_bits(),
            large_segment_size: c.large_segment_size,
        };
        let r = groups.entry(key.clone()).or_insert(i);
        if (c.source.len(), i) < (configs[*r].source.len(), *r) {
            *r = i;
        }
        keys.push(key);
    }
    (keys.iter().map(|k| groups[k]).collect(), keys)
}

/// Whether a replay of `cfg` (a memory fraction, maybe a GC) is the replay of its base (the same
/// settings without them) that ended with `base_peak` reserved (`reserved_bytes.all.peak`): the
/// fraction refuses a segment only when reserved + alloc_size > allowed (alloc_block), and the GC
/// frees only when reserved > threshold × allowed (garbage_collect_cached_blocks); if the base
/// never came near either line, the two replays are the same up to the last event.
fn same_as_base(cfg: &AllocatorConfig, capacity: u64, sizes: &[u64], base_peak: u64) -> bool {
    let allowed = (cfg.per_process_memory_fraction * capacity as f64).floor() as u64;
    let largest_segment = sizes.iter().map(|&n| allocation_size(cfg, round_size(cfg, n))).max().unwrap_or(0);
    let fraction_idle = base_peak.saturating_add(largest_segment) <= allowed;
    let gc_idle = !cfg.gc_enabled() || cfg.expandable_segments || base_peak <= (cfg.garbage_collection_threshold * allowed as f64) as u64;
    fraction_idle && gc_idle
}

/// A finished, OOM-free replay: what later replays are measured against.
#[derive(Debug, Clone, Copy)]
struct Finished {
    peak_reserved: u64,
    time_ns: u64,
}

/// What the running replays share: the finished ones, and the balanced objective's budget.
struct Board {
    objective: Objective,
    finished: RwLock<Vec<Finished>>,
    /// The balanced budget, known once the defaults finished without an OOM.
    budget_ns: RwLock<Option<u64>>,
}

impl Board {
    /// Whether a replay at `peak` reserved and `time_ns` so far can no longer be the pick (nor
    /// on the memory-time front): a finished configuration is at least as good on both; or, for
    /// the objective, strictly better on its measure (memory: less peak; time: less time;
    /// balanced: within the budget and less peak, or this one is over the budget already).
    /// Peak reserved and time only grow as a replay goes on, so the verdict is final.
    fn beaten(&self, peak: u64, time_ns: u64) -> bool {
        let budget = *self.budget_ns.read().expect("advise board lock");
        if self.objective == Objective::Balanced && budget.is_some_and(|b| time_ns > b) {
            return true;
        }
        self.finished.read().expect("advise board lock").iter().any(|f| {
            (f.peak_reserved <= peak && f.time_ns <= time_ns)
                || match self.objective {
                    Objective::Memory => f.peak_reserved < peak,
                    Objective::Time => f.time_ns < time_ns,
                    Objective::Balanced => budget.is_some_and(|b| f.time_ns <= b) && f.peak_reserved < peak,
                }
        })
    }
}

/// Watches one advise replay: its peak reserved, its first OOM, and whether [`Board::beaten`]
/// stops it (checked every `CHECK_EVERY_EVENTS` events).
struct Pruner<'a> {
    board: &'a Board,
    model: &'a LatencyModel,
    /// Never stop this one (the defaults: the reference every answer is compared with).
    keep: bool,
    stop: bool,
    peak: Peak,
    /// The first OOM's (step, event).
    oom: Option<(u64, u64)>,
}

impl<A: GpuAllocator + ?Sized> Observer<A> for Pruner<'_> {
    #[inline]
    fn allocated(&mut self, alloc: &A, stats: &DeviceStats, at: At, bytes: u64) {
        Observer::<A>::allocated(&mut self.peak, alloc, stats, at, bytes);
    }

    fn out_of_memory(&mut self, _alloc: &A, at: At, _bytes: u64, _info: &OomInfo) {
        self.oom.get_or_insert((at.step, at.index));
    }

    #[inline]
    fn after_event(&mut self, alloc: &A, at: At) {
        if !self.keep && at.index.is_multiple_of(CHECK_EVERY_EVENTS) {
            let s = alloc.stats();
            let time_ns = self.model.alloc_time_ns(alloc.device_time_ns().unwrap_or(0), s);
            self.stop = self.board.beaten(s.all().reserved_bytes.peak as u64, time_ns);
        }
    }

    #[inline]
    fn after_event_due(&self, events: u64) -> u64 {
        if self.keep {
            u64::MAX
        } else {
            next_multiple_above(events, CHECK_EVERY_EVENTS)
        }
    }

    fn checkpoint(&mut self, _events: u64) -> bool {
        self.stop || crate::interrupt::interrupted()
    }
}

/// A representative's outcome: its candidate, its `reserved_bytes.all.peak` (for
/// [`same_as_base`]), and the base whose replay it shares, if it does.
type Settled = (Candidate, u64, Option<usize>);

/// How `advise` searches.
pub struct AdviseOptions {
    pub capacity: u64,
    pub threads: usize,
    pub objective: Objective,
    pub model: LatencyModel,
    /// The cudaMalloc addresses the input recorded (a snapshot's), replayed by every
    /// configuration as `replay` does (empty: the device places them).
    pub addresses: Vec<(u64, u64)>,
    /// Why the trace is not the whole run (`Source::capture_incomplete`), if it is not.
    pub not_whole_run: Option<String>,
    /// The job's step time (`--step-time`), which sizes the balanced objective's allowance.
    pub step_time_s: Option<f64>,
    /// The device's math over the whole input (`Source::flops`), which the step's estimate
    /// reads when no step time is given.
    pub flops: Option<f64>,
    /// What the job holds on the card outside the allocator (withheld from every replay).
    pub outside: crate::gpu::card::Outside,
}

/// Replays every configuration (once per behaviour) on `threads` threads and returns them all,
/// best first for the objective, with the recommendation. `done` is called as each configuration
/// is settled (the command's progress bar).
pub fn advise(events: &[Event], info: &WorkloadInfo, confs: &[String], o: &AdviseOptions, done: Option<&(dyn Fn(u64) + Sync)>) -> anyhow::Result<AdviseResult> {
    let start = std::time::Instant::now();
    let parsed: Vec<AllocatorConfig> = confs.iter().map(|c| AllocatorConfig::parse(c)).collect::<Result<_, _>>()?;
    // (A trace without step rows is one step: a request, an inference.)
    let steps = crate::event::step_count(events).max(1);
    // The step time: given, else estimated from the work the trace shows.
    let estimated = if o.step_time_s.is_none() { estimated_step_time_s(events, steps, o.flops) } else { None };
    let step_time = o.step_time_s.or(estimated);
    let allowance_ns = (step_budget_s(step_time) * steps as f64 * 1e9).round() as u64;
    let mut sizes: Vec<u64> = events.iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { (*bytes > 0).then_some(*bytes) } else { None }).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let (rep, keys) = behaviour_key(&parsed, &sizes);
    let mut members: HashMap<usize, u64> = HashMap::new();
    for &r in &rep {
        *members.entry(r).or_default() += 1;
    }
    // A configuration with a memory fraction (and maybe a GC) may share the replay of its base,
    // the same settings without them (`same_as_base`): bases run first.
    let rep_of_key: HashMap<&BehaviourKey, usize> = keys.iter().zip(&rep).map(|(k, &r)| (k, r)).collect();
    let base_of = |i: usize| -> Option<usize> {
        (parsed[i].per_process_memory_fraction < 1.0)
            .then(|| rep_of_key.get(&BehaviourKey { fraction_bits: 1f64.to_bits(), gc_threshold_bits: 0, ..keys[i].clone() }).copied())
            .flatten()
    };
    // The defaults first: the balanced budget and every comparison start from them.
    let (mut first, second): (Vec<usize>, Vec<usize>) = (0..parsed.len()).filter(|&i| rep[i] == i).partition(|&i| base_of(i).is_none());
    first.sort_by_key(|&i| !parsed[i].source.is_empty());
    let board = Board { objective: o.objective, finished: RwLock::new(Vec::new()), budget_ns: RwLock::new(None) };
    let settled: Mutex<HashMap<usize, Settled>> = Mutex::new(HashMap::new());
    for work in [&first, &second] {
        let next = AtomicUsize::new(0);
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..o.threads.max(1))
                .map(|_| {
                    s.spawn(|| -> anyhow::Result<()> {
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            if k >= work.len() || crate::interrupt::interrupted() {
                                return Ok(());
                            }
                            let i = work[k];
                            let shared = base_of(i).and_then(|b| {
                                let settled = settled.lock().expect("advise results lock");
                                let (c, peak, _) = settled.get(&b)?;
                                (!c.oom && !c.pruned && same_as_base(&parsed[i], o.capacity, &sizes, *peak)).then(|| (c.clone(), *peak, Some(b)))
                            });
                            let (c, peak, base) = match shared {
                                Some(s) => s,
                                None => {
                                    let is_default = parsed[i].source.is_empty();
                                    let (c, peak) = replay_one(events, &parsed[i], o, &board, is_default)?;
                                    if !c.oom && !c.pruned {
                                        let time_ns = (c.modelled_alloc_time_s * 1e9).round() as u64;
                                        board.finished.write().expect("advise board lock").push(Finished { peak_reserved: c.peak_reserved, time_ns });
                                        if is_default {
                                            *board.budget_ns.write().expect("advise board lock") = Some(time_ns + allowance_ns);
                                        }
                                    }
                                    (c, peak, None)
                                }
                            };
                            settled.lock().expect("advise results lock").insert(i, (c, peak, base));
                            if let Some(done) = done {
                                done(members[&i]);
                            }
                        }
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("an advise worker panicked")))).collect()
        });
        results.into_iter().collect::<anyhow::Result<()>>()?;
    }
    let settled = settled.into_inner().expect("advise results lock");
    let replays = settled.values().filter(|(_, _, base)| base.is_none()).count();
    let mut all: Vec<Candidate> = (0..parsed.len())
        .filter_map(|i| {
            let (c, _, base) = settled.get(&rep[i])?;
            let same = if rep[i] != i { Some(rep[i]) } else { *base };
            Some(Candidate { conf: confs[i].clone(), equivalent_to: same.map(|r| confs[r].clone()), conflicts: parsed[i].conflicts(), ..c.clone() })
        })
        .collect();
    let budget_ns = time_budget_ns(&all, allowance_ns);
    rank(&mut all, o.objective, budget_ns);
    let recommended = recommend(&all);
    // Nothing fits this card: how large a card the best one needs, and the smallest of the table.
    let (fits_from, smallest_card) = match recommended.as_ref().filter(|c| c.oom && o.not_whole_run.is_none()) {
        Some(best) => {
            let cfg = AllocatorConfig::parse(&best.conf)?;
            let peak_live = crate::event::peak_live_bytes(events.iter().copied().map(Ok), |b| b)?;
            let withheld = o.outside.total();
            let from = crate::diagnose::min_capacity(events, &o.addresses, &cfg, peak_live, withheld)?;
            let card = match from {
                Some(m) => crate::diagnose::smallest_card(events, &o.addresses, &cfg, m, withheld)?.map(|c| c.name.to_string()),
                None => None,
            };
            (from, card)
        }
        None => (None, None),
    };
    // What the balance turns down: the least memory, whatever its time (a search of its own: the
    // balanced one stops early the replays that go over its time budget).
    let memory_best = if o.objective == Objective::Balanced {
        let memory = AdviseOptions {
            capacity: o.capacity,
            threads: o.threads,
            objective: Objective::Memory,
            model: o.model.clone(),
            addresses: o.addresses.clone(),
            outside: o.outside,
            not_whole_run: o.not_whole_run.clone(),
            step_time_s: o.step_time_s,
            flops: o.flops,
        };
        advise(events, info, confs, &memory, None)?.recommended.filter(|c| !c.oom)
    } else {
        None
    };
    Ok(AdviseResult {
        schema_version: SCHEMA_VERSION,
        workload: info.clone(),
        capacity: o.capacity,
        objective: o.objective,
        latency_table: o.model.device.clone(),
        time_budget_s: (o.objective == Objective::Balanced).then(|| budget_ns.map(|b| b as f64 / 1e9)).flatten(),
        replays,
        elapsed_s: start.elapsed().as_secs_f64(),
        threads: o.threads.max(1),
        recommended,
        configs: all,
        outside: o.outside,
        fits_from,
        smallest_card,
        not_whole_run: o.not_whole_run.clone(),
        steps,
        step_time_s: o.step_time_s,
        step_budget_s: step_budget_s(step_time),
        step_time_estimated_s: estimated,
        step_flops: o.flops.map(|f| f / steps as f64),
        memory_best,
    })
}

/// The pick among ranked candidates: the first that conflicts with nothing, ran to its end (or to
/// an OOM) and that no other such candidate beats on every column (peak reserved, cudaMallocs,
/// modelled time, retries, where the OOM came) and on one strictly.
fn recommend(ranked: &[Candidate]) -> Option<Candidate> {
    let eligible: Vec<&Candidate> = ranked.iter().filter(|c| c.conflicts.is_empty() && !c.pruned).collect();
    let key = |c: &Candidate| (c.oom, c.oom_event.map(std::cmp::Reverse));
    let dominates = |a: &Candidate, b: &Candidate| {
        let columns = |c: &Candidate| [c.peak_reserved as f64, c.device_mallocs as f64, c.modelled_alloc_time_s, c.retries as f64];
        let (x, y) = (columns(a), columns(b));
        key(a) <= key(b) && x.iter().zip(&y).all(|(p, q)| p <= q) && (key(a) < key(b) || x.iter().zip(&y).any(|(p, q)| p < q))
    };
    eligible.iter().find(|c| !eligible.iter().any(|other| dominates(other, c))).map(|c| (*c).clone())
}

/// One configuration's replay on a priced simulated device, pruned by the board.
/// Returns the candidate and `reserved_bytes.all.peak` (for [`same_as_base`]).
fn replay_one(events: &[Event], cfg: &AllocatorConfig, o: &AdviseOptions, board: &Board, keep: bool) -> anyhow::Result<(Candidate, u64)> {
    let mut a = pytorch_on_sim(cfg, o.capacity, o.outside.total(), &o.model, &o.addresses);
    let mut w = Pruner { board, model: &o.model, keep, stop: false, peak: Peak::default(), oom: None };
    let out = replay_observed(&mut a, events.iter().copied().map(Ok), OnOom::Stop, &mut w)?;
    let st = a.stats();
    let candidate = Candidate {
        conf: cfg.source.clone(),
        peak_reserved: w.peak.reserved,
        overhead: if out.peak_live_bytes == 0 { 0.0 } else { w.peak.reserved as f64 / out.peak_live_bytes as f64 },
        device_mallocs: st.num_device_alloc,
        device_frees: st.num_device_free,
        syncs: syncs(st),
        modelled_alloc_time_s: o.model.alloc_time_ns(a.device_time_ns().unwrap_or(0), st) as f64 / 1e9,
        retries: st.num_alloc_retries,
        oom: w.oom.is_some(),
        oom_step: w.oom.map(|(step, _)| step),
        oom_event: w.oom.map(|(_, event)| event),
        pruned: w.stop && out.interrupted,
        equivalent_to: None,
        conflicts: Vec::new(),
    };
    Ok((candidate, st.all().reserved_bytes.peak as u64))
}

/// The balanced objective's limit: the defaults' modelled time plus `allowance_ns` (the steps ×
/// the per-step allowance), or the fastest complete configuration's when the defaults OOM.
fn time_budget_ns(all: &[Candidate], allowance_ns: u64) -> Option<u64> {
    Some(ns_of(reference(all)?) + allowance_ns)
}

/// What the balanced objective measures against: the defaults, or the fastest complete one.
fn reference(all: &[Candidate]) -> Option<&Candidate> {
    let complete = |c: &&Candidate| !c.oom && !c.pruned;
    all.iter().filter(complete).find(|c| c.conf.is_empty()).or_else(|| all.iter().filter(complete).min_by_key(|c| ns_of(c)))
}

fn ns_of(c: &Candidate) -> u64 {
    (c.modelled_alloc_time_s * 1e9).round() as u64
}

/// Sorts best first for `objective`. Complete, OOM-free, conflict-free configurations lead; then
/// memory: least peak reserved (the faster one first among equals), whatever the time;
/// time: least modelled time; balanced: within the budget first, then least peak reserved. OOMs
/// go last, the latest OOM first.
fn rank(all: &mut [Candidate], objective: Objective, budget_ns: Option<u64>) {
    let ns = |c: &Candidate| (c.modelled_alloc_time_s * 1e9).round() as u64;
    let over_budget = |c: &Candidate| objective == Objective::Balanced && budget_ns.is_some_and(|b| ns(c) > b);
    all.sort_by(|a, b| {
        // Configurations that OOM rank by how far they get (their peak and time are those of a
        // shorter replay, so they say nothing); among those that fail at the same event, the
        // fewest settings first.
        let class = |c: &Candidate| (c.oom, c.pruned, !c.conflicts.is_empty(), std::cmp::Reverse((c.oom_event, c.oom_step)));
        // (Among configurations that fail at the same event, the objective's measure of the
        // replay up to it, then the fewest cudaMallocs.)
        // (Ties on the measure go to fewer cudaMallocs, then fewer retries: the pick is never
        // one another equals on the measure and beats on a column.)
        let mallocs = |c: &Candidate| c.device_mallocs.max(0) as u64;
        let retries = |c: &Candidate| c.retries.max(0) as u64;
        let measure = |c: &Candidate| match objective {
            Objective::Memory => (c.peak_reserved, ns(c), mallocs(c), retries(c)),
            Objective::Time => (ns(c), c.peak_reserved, mallocs(c), retries(c)),
            Objective::Balanced if c.oom => (c.peak_reserved, ns(c), mallocs(c), retries(c)),
            Objective::Balanced => (over_budget(c) as u64, c.peak_reserved, ns(c), mallocs(c) * 1024 + retries(c).min(1023)),
        };
        (class(a), measure(a), setting_count(&a.conf), a.conf.len(), &a.conf).cmp(&(class(b), measure(b), setting_count(&b.conf), b.conf.len(), &b.conf))
    });
}

/// The settings a conf string makes (`key:value` pairs; commas inside a bracketed
/// roundup_power2_divisions list do not separate settings).
fn setting_count(conf: &str) -> usize {
    let mut depth = 0i32;
    let separators = conf.chars().filter(|&c| {
        depth += (c == '[') as i32 - (c == ']') as i32;
        c == ',' && depth == 0
    });
    if conf.trim().is_empty() {
        0
    } else {
        separators.count() + 1
    }
}

/// A search made of candidates measured elsewhere (a merged sweep's rows): ranked for
/// `objective` as [`advise`] ranks its own, with the same recommendation rule.
pub fn from_candidates(
    info: &WorkloadInfo,
    capacity: u64,
    objective: Objective,
    latency_table: &str,
    steps: u64,
    step_time_s: Option<f64>,
    mut all: Vec<Candidate>,
) -> AdviseResult {
    let steps = steps.max(1);
    let budget_ns = time_budget_ns(&all, (step_budget_s(step_time_s) * steps as f64 * 1e9).round() as u64);
    rank(&mut all, objective, budget_ns);
    let recommended = recommend(&all);
    AdviseResult {
        schema_version: SCHEMA_VERSION,
        workload: info.clone(),
        capacity,
        objective,
        latency_table: latency_table.to_string(),
        time_budget_s: (objective == Objective::Balanced).then(|| budget_ns.map(|b| b as f64 / 1e9)).flatten(),
        replays: all.len(),
        elapsed_s: 0.0,
        threads: 1,
        recommended,
        configs: all,
        outside: crate::gpu::card::Outside::NONE, // (a sweep's rows replay the allocator alone)
        fits_from: None,
        smallest_card: None,
        not_whole_run: None,
        steps,
        step_time_s,
        step_budget_s: step_budget_s(step_time_s),
        step_time_estimated_s: None,
        step_flops: None,
        memory_best: None,
    }
}

/// The full results of the default configuration and of the recommended one (once when they
/// are the same), each handed to `each` as it finishes: what `advise --jsonl` writes for the
/// report.
pub fn full_runs(
    events: &[Event],
    info: &WorkloadInfo,
    o: &AdviseOptions,
    best: &Candidate,
    mut each: impl FnMut(GpuRunResult) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    for conf in ["", best.conf.as_str()] {
        let cfg = AllocatorConfig::parse(conf)?;
        let spec = DeviceSpec { latency: Some(o.model.clone()), addresses: o.addresses.clone(), withheld: o.outside.total(), ..DeviceSpec::sim(o.capacity) };
        let mut built = build(GpuPolicy::Pytorch, &cfg, &spec)?;
        let opts = ReplayOptions { on_oom: OnOom::Stop, ..Default::default() };
        let run = run_one(&mut built, &cfg, Box::new(events.iter().copied().map(Ok)), info.clone(), &opts, &mut StopWhen(crate::interrupt::interrupted))?;
        each(run)?;
        if best.conf.is_empty() {
            break;
        }
    }
    Ok(())
}

/// The search for people: the defaults, the best `top` with memory and time side by side, the
/// conflicts, and the line to `export`.
pub fn describe(r: &AdviseResult, top: usize) -> String {
    let pruned = r.configs.iter().filter(|c| c.pruned).count();
    let mut s = String::new();
    // What matters most first: a trace that is not the whole run, or a card nothing fits.
    if let Some(why) = &r.not_whole_run {
        s += &format!(
            "This trace is not the whole run (the capture ended: {why}): the ranking covers what ran, and no card is named as fitting. Capture again without --device-memory (unbounded by default), or find the largest batch that fits with `allocbench fit`.\n\n"
        );
    } else if let Some(best) = r.recommended.as_ref().filter(|b| b.oom) {
        let name = if best.conf.is_empty() { "PyTorch's defaults".to_string() } else { format!("`{}`", best.conf) };
        s += &format!("Nothing fits on {}: every configuration runs out of memory{}.", crate::gpu::card::in_sentence(r.capacity), r.outside.of_the_card());
        match r.fits_from {
            Some(m) => {
                s += &format!(" With {name}, which gets furthest, it needs a device of {} or more", format_bytes(m));
                s += &match r.smallest_card.as_deref().and_then(|n| crate::gpu::card::find(n).ok()) {
                    Some(c) => format!("; the smallest card in the table: {}.", crate::gpu::card::describe_capacity(c.total_memory)),
                    None => "; no card in the table is that large.".to_string(),
                };
            }
            None => s += " No device up to 1 PiB runs it.",
        }
        s += &format!(
            " To fit this card, find the largest batch size or sequence length that does: `allocbench fit --param NAME=LO..HI {} -- SCRIPT.py ARGS...` with {{NAME}} in the script's arguments.\n\n",
            crate::gpu::card::flag_for(r.capacity)
        );
    }
    s += &format!(
        "{} ({}): {} configurations ({} distinct replays, {} stopped early) on {}{} in {:.1} s ({}); time priced with {}\n",
        r.workload.name,
        r.workload.kind,
        r.configs.len(),
        r.replays,
        pruned,
        crate::gpu::card::in_sentence(r.capacity),
        r.outside.of_the_card(),
        r.elapsed_s,
        crate::units::count(r.threads as u64, "thread"),
        r.latency_table
    );
    let steps = r.steps.max(1) as f64;
    let ms_per_step = |c: &Candidate| c.modelled_alloc_time_s / steps * 1e3;
    let row = |c: &Candidate| {
        format!(
            "{:>10} {:>9.3} {:>8} {:>8} {:>7} {:>10.3} {:>8.3} {:>7} {:>16}",
            format_bytes(c.peak_reserved),
            c.overhead,
            c.device_mallocs,
            c.device_frees,
            c.syncs,
            c.modelled_alloc_time_s,
            ms_per_step(c),
            c.retries,
            match (c.oom_step, c.oom_event) {
                (Some(s), Some(e)) => format!("step {s} @{e}"),
                (Some(s), None) => format!("step {s}"),
                _ => "-".into(),
            }
        )
    };
    s += &format!(
        "{:<4} {:>10} {:>9} {:>8} {:>8} {:>7} {:>10} {:>8} {:>7} {:>16}  conf\n",
        "rank", "peak rsvd", "rsvd/live", "mallocs", "frees", "syncs", "alloc s", "ms/step", "retries", "OOM @event"
    );
    let label = |c: &Candidate| {
        let mut l = if c.conf.is_empty() { "(defaults)".to_string() } else { c.conf.clone() };
        if c.pruned {
            l += "  [stopped early: beaten]";
        }
        if !c.conflicts.is_empty() {
            l += "  [conflict]";
        }
        l
    };
    if let Some(d) = r.configs.iter().find(|c| c.conf.is_empty()) {
        s += &format!("{:<4} {}  (PyTorch defaults)\n", "base", row(d));
    }
    let mut shown = 0;
    for c in r.configs.iter().filter(|c| c.equivalent_to.is_none()) {
        if shown == top {
            break;
        }
        shown += 1;
        s += &format!("{:<4} {}  {}\n", shown, row(c), label(c));
    }
    s += &format!(
        "(peak rsvd: reserved_bytes.all.peak; rsvd/live: that over the live bytes' peak; mallocs, frees: cudaMalloc/cudaFree calls; \
         alloc s: modelled allocator time over the {} (ms/step: per step); retries: num_alloc_retries)\n",
        crate::units::count(r.steps.max(1), "step")
    );
    let allowance = match (r.step_time_s, r.step_time_estimated_s) {
        (Some(t), _) => format!("{}/step (1 % of the {} step)", crate::units::format_duration(r.step_budget_s), crate::units::format_duration(t)),
        (None, Some(t)) => format!(
            "{}/step (1 % of a step of at least {}: {}; --step-time to give yours)",
            crate::units::format_duration(r.step_budget_s),
            crate::units::format_duration(t),
            step_floor_basis(r.step_flops, t)
        ),
        (None, None) => format!("{}/step (1 % of a 100 ms step; --step-time to give yours)", crate::units::format_duration(r.step_budget_s)),
    };
    match r.time_budget_s {
        Some(_) => s += &format!("\nobjective balanced: the least memory whose modelled allocator time exceeds the reference's by at most {allowance}\n"),
        None => s += &format!("\nobjective {}\n", r.objective),
    }
    // What the objective turned down: the least memory among the configurations that finished.
    let finished = |c: &&Candidate| !c.oom && !c.pruned && c.conflicts.is_empty();
    let leanest = r.memory_best.as_ref().or_else(|| r.configs.iter().filter(finished).min_by_key(|c| (c.peak_reserved, ns_of(c))));
    if let (Some(best), Some(lean)) = (&r.recommended, leanest) {
        if !best.oom && lean.peak_reserved < best.peak_reserved {
            let extra = ms_per_step(lean) - ms_per_step(best);
            let why = if r.objective == Objective::Balanced { format!(", over the allowance of {allowance}") } else { String::new() };
            s += &format!(
                "turned down: {}: {}, {}{}/step{why}; `--objective memory` to prefer it\n",
                lean.conf,
                crate::units::format_bytes_signed(lean.peak_reserved as i128 - best.peak_reserved as i128),
                if extra >= 0.0 { "+" } else { "" },
                crate::units::format_duration(extra / 1e3)
            );
        }
    }
    // Every conflicting configuration, as the JSON lists them (equivalent ones included).
    let flagged: Vec<&Candidate> = r.configs.iter().filter(|c| !c.conflicts.is_empty()).collect();
    if !flagged.is_empty() {
        let verb = if flagged.len() == 1 { "conflicts and is" } else { "conflict and are" };
        s += &format!(
            "{} {verb} never recommended, e.g. {}: {}\n",
            crate::units::count(flagged.len() as u64, "configuration"),
            flagged[0].conf,
            flagged[0].conflicts[0]
        );
    }
    match &r.recommended {
        Some(best) => {
            if best.oom {
                s += &format!(
                    "No configuration avoids the OOM on this device; the recommended one gets furthest (to event {}{}).\n",
                    best.oom_event.map(|e| e.to_string()).unwrap_or_else(|| "?".into()),
                    best.oom_step.map(|st| format!(", step {st}")).unwrap_or_default()
                );
            }
            s += &format!("\nexport PYTORCH_CUDA_ALLOC_CONF={}\n", if best.conf.is_empty() { "''".to_string() } else { format!("'{}'", best.conf) });
            if let Some(note) = conf_compatibility_note(&best.conf) {
                s += &format!("({note})\n");
            }
        }
        None => s += "\nNothing was replayed (interrupted).\n",
    }
    s
}

/// What an older torch does not read in `conf`. The keys are read as torch 2.15's
/// AllocatorConfig does; `per_process_memory_fraction` came into the variable with pytorch PR
/// #161035 (2025), and a torch from before refuses the whole variable at its first allocation.
pub fn conf_compatibility_note(conf: &str) -> Option<String> {
    let fraction = conf.split(',').find_map(|kv| kv.trim().strip_prefix("per_process_memory_fraction:"))?;
    Some(format!(
        "per_process_memory_fraction is a key of the variable since pytorch PR #161035 (2025), and a torch from before refuses it: \
         there, leave it out of the variable and call torch.cuda.set_per_process_memory_fraction({}) in the script",
        fraction.trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    #[test]
    fn a_steps_estimate_is_the_larger_of_its_traffic_and_its_math() {
        let events = vec![Event::Alloc { id: 0, bytes: 1 << 30, stream: 0 }, Event::Step { n: 1 }, Event::Alloc { id: 1, bytes: 1 << 30, stream: 0 }];
        let traffic = 2.0 * (2u64 << 30) as f64 / 2.0 / H100_HBM_BYTES_PER_S;
        assert_eq!(estimated_step_time_s(&events, 2, None), Some(traffic));
        // A little math leaves the traffic floor; a lot of it decides the step.
        assert_eq!(estimated_step_time_s(&events, 2, Some(1e9)), Some(traffic));
        let math = 4e14 / 2.0 / H100_BF16_DENSE_FLOPS_PER_S;
        assert!(math > traffic);
        assert_eq!(estimated_step_time_s(&events, 2, Some(4e14)), Some(math));
        assert!(step_floor_basis(Some(2e14), math).contains("200.0 TFLOP"), "{}", step_floor_basis(Some(2e14), math));
        assert!(step_floor_basis(Some(1e9), traffic).contains("3.35 TB/s"));
        assert_eq!(estimated_step_time_s(&[], 1, None), None);
    }

    #[test]
    fn a_memory_fraction_in_the_advice_says_how_older_torch_gets_it() {
        let note = conf_compatibility_note("max_split_size_mb:32,garbage_collection_threshold:0.6,per_process_memory_fraction:0.99").unwrap();
        assert!(note.contains("torch.cuda.set_per_process_memory_fraction(0.99)"), "{note}");
        assert_eq!(conf_compatibility_note("expandable_segments:True"), None);
        assert_eq!(conf_compatibility_note(""), None);
    }

    fn events(file: &str) -> Vec<Event> {
        let path = format!("{}/workloads/{file}", env!("CARGO_MANIFEST_DIR"));
        Workload::load(std::path::Path::new(&path)).unwrap().events().collect()
    }

    /// Configurations `behaviour_key` puts together really replay identically: every
    /// `memory_stats()` counter but max_split_size (the setting itself) agrees at the end.
    #[test]
    fn configurations_collapsed_as_equivalent_replay_identically() {
        let events = events("model-switch.toml");
        let confs = search_space();
        let parsed: Vec<AllocatorConfig> = confs.iter().map(|c| AllocatorConfig::parse(c).unwrap()).collect();
        let mut sizes: Vec<u64> = events.iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { Some(*bytes) } else { None }).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let (rep, _) = behaviour_key(&parsed, &sizes);
        let collapsed: Vec<usize> = (0..confs.len()).filter(|&i| rep[i] != i).collect();
        assert!(collapsed.len() > 100, "GC without effect, max_non_split_rounding without max_split and unused roundup buckets collapse");
        assert!(rep.iter().all(|&r| rep[r] == r), "a representative stands for itself");
        let model = LatencyModel::h100();
        let stats = |i: usize| {
            let mut a = pytorch_on_sim(&parsed[i], 24 << 30, 0, &model, &[]);
            crate::gpu::replay::replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap();
            let mut m = a.stats().to_torch_map();
            m.remove("max_split_size");
            (m, a.device_time_ns())
        };
        // A spread of the collapsed ones (every 7th), each against its representative.
        for &i in collapsed.iter().step_by(7) {
            assert!(confs[rep[i]].len() <= confs[i].len(), "the representative is the shortest conf");
            assert_eq!(stats(i), stats(rep[i]), "{} replays unlike {}", confs[i], confs[rep[i]]);
        }
        // And configurations it keeps apart can differ: the defaults and expandable segments.
        assert_ne!(rep[0], rep[confs.iter().position(|c| c == "expandable_segments:True").unwrap()]);
    }

    /// A configuration `same_as_base` says shares its base's replay really replays like it; and
    /// on a small card, where the fraction bites, it says no.
    #[test]
    fn a_fraction_that_never_bites_shares_the_base_replay() {
        let events = events("model-switch.toml");
        let mut sizes: Vec<u64> = events.iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { Some(*bytes) } else { None }).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let model = LatencyModel::h100();
        let run = |conf: &str, capacity: u64| {
            let cfg = AllocatorConfig::parse(conf).unwrap();
            let mut a = pytorch_on_sim(&cfg, capacity, 0, &model, &[]);
            let out = crate::gpu::replay::replay(&mut a, events.iter().copied().map(Ok), &ReplayOptions::default()).unwrap();
            let mut m = a.stats().to_torch_map();
            m.remove("max_split_size");
            (m, a.device_time_ns(), out.oom.is_some(), a.stats().all().reserved_bytes.peak as u64)
        };
        // max_split_size_mb:64 caches an unsplittable block per logits size: about 55 GiB reserved
        // at its peak (`allocbench replay workloads/model-switch.toml --conf max_split_size_mb:64`),
        // under the GC threshold (0.6 of the fraction) of a 141 GiB card.
        let roomy = 141 << 30;
        let (base, base_time, base_oom, base_peak) = run("max_split_size_mb:64", roomy);
        assert!(!base_oom);
        for derived in
            ["max_split_size_mb:64,per_process_memory_fraction:0.99", "max_split_size_mb:64,garbage_collection_threshold:0.6,per_process_memory_fraction:0.99"]
        {
            let cfg = AllocatorConfig::parse(derived).unwrap();
            assert!(same_as_base(&cfg, roomy, &sizes, base_peak), "{derived} on 141 GiB never nears its limits");
            let (stats, time, _, _) = run(derived, roomy);
            assert_eq!((stats, time), (base.clone(), base_time), "{derived}");
        }
        // On a card just above the base's peak the GC threshold and the fraction are in reach.
        let tight = base_peak + (base_peak >> 4);
        let gc = AllocatorConfig::parse("max_split_size_mb:64,garbage_collection_threshold:0.6,per_process_memory_fraction:0.99").unwrap();
        assert!(!same_as_base(&gc, tight, &sizes, base_peak));
    }

    /// When every configuration OOMs, the pick is the one that gets furthest: a memory fraction
    /// that fails sooner has a smaller peak only because its replay stopped earlier. Among those
    /// failing at the same event, the fewest settings win, and the text and JSON agree on the
    /// number of conflicting configurations.
    #[test]
    fn when_everything_ooms_the_pick_gets_furthest() {
        let mib40 = 40u64 << 20;
        let events: Vec<Event> = (0..3).map(|id| Event::Alloc { id, bytes: mib40, stream: 0 }).collect();
        let info =
            WorkloadInfo { name: "t".into(), kind: "trace".into(), origin: "t.csv".into(), sha256: String::new(), seed: None, description: String::new() };
        // The last two conflict (max_split_size_mb with expandable segments) and replay alike
        // (40 MiB rounds to itself with 4 divisions): the text counts both, as the JSON lists them.
        let confs: Vec<String> = [
            "per_process_memory_fraction:0.5",
            "max_split_size_mb:512",
            "",
            "max_split_size_mb:64,expandable_segments:True",
            "max_split_size_mb:64,roundup_power2_divisions:4,expandable_segments:True",
        ]
        .map(String::from)
        .to_vec();
        for objective in [Objective::Balanced, Objective::Memory, Objective::Time] {
            let o = AdviseOptions {
                capacity: 100 << 20,
                threads: 1,
                objective,
                model: LatencyModel::h100(),
                addresses: Vec::new(),
                outside: crate::gpu::card::Outside::NONE,
                not_whole_run: None,
                step_time_s: None,
                flops: None,
            };
            let r = advise(&events, &info, &confs, &o, None).unwrap();
            let at = |conf: &str| r.configs.iter().find(|c| c.conf == conf).unwrap().oom_event;
            // 100 MiB hold two 40 MiB blocks; the fraction's 50 MiB hold one.
            assert_eq!((at(""), at("max_split_size_mb:512"), at("per_process_memory_fraction:0.5")), (Some(2), Some(2), Some(1)));
            let best = r.recommended.as_ref().unwrap();
            assert_eq!((best.conf.as_str(), best.oom_event), ("", Some(2)), "{objective}");
            let text = describe(&r, 5);
            assert!(text.contains("the recommended one gets furthest (to event 2, step 0)"), "{text}");
            let conflicting: Vec<&Candidate> = r.configs.iter().filter(|c| !c.conflicts.is_empty()).collect();
            assert_eq!((conflicting.len(), conflicting.iter().filter(|c| c.equivalent_to.is_some()).count()), (2, 1));
            assert!(text.contains("2 configurations conflict and are never recommended"), "{text}");
        }
    }

    fn candidate(conf: &str, peak: u64, mallocs: i64, time_s: f64, oom_event: Option<u64>) -> Candidate {
        Candidate {
            conf: conf.into(),
            peak_reserved: peak,
            overhead: 1.0,
            device_mallocs: mallocs,
            device_frees: 0,
            syncs: 0,
            modelled_alloc_time_s: time_s,
            retries: 1,
            oom: oom_event.is_some(),
            oom_step: oom_event.map(|_| 9),
            oom_event,
            pruned: false,
            equivalent_to: None,
            conflicts: Vec::new(),
        }
    }

    /// When every configuration OOMs at the same event, the one recommended is not beaten on
    /// every column by another (the GPT-3 XL case at 60 GiB: max_split_size_mb:32 at 60.0 GiB,
    /// 1,749 cudaMallocs, 0.37 s, against expandable_segments:True at 59.1 GiB, 386, 0.19 s).
    #[test]
    fn the_recommendation_is_never_beaten_on_every_column() {
        for objective in [Objective::Balanced, Objective::Memory, Objective::Time] {
            let mut all = vec![
                candidate("max_split_size_mb:32", 60 << 30, 1749, 0.37, Some(41895)),
                candidate("expandable_segments:True", 59 << 30, 386, 0.19, Some(41895)),
                candidate("", 61 << 30, 450, 0.10, Some(41857)),
            ];
            let budget = time_budget_ns(&all, 0);
            rank(&mut all, objective, budget);
            let best = recommend(&all).unwrap();
            assert_eq!(best.conf, "expandable_segments:True", "{objective}");
            let text = describe(
                &AdviseResult {
                    schema_version: SCHEMA_VERSION,
                    workload: WorkloadInfo {
                        name: "t".into(),
                        kind: "trace".into(),
                        origin: "t.csv".into(),
                        sha256: String::new(),
                        seed: None,
                        description: String::new(),
                    },
                    capacity: 60 << 30,
                    objective,
                    latency_table: "t".into(),
                    time_budget_s: None,
                    replays: 3,
                    elapsed_s: 0.0,
                    threads: 1,
                    recommended: Some(best),
                    configs: all,
                    outside: crate::gpu::card::Outside::default(),
                    fits_from: Some(72 << 30),
                    smallest_card: Some("A100-80GB-PCIe".into()),
                    not_whole_run: None,
                    steps: 9,
                    step_time_s: None,
                    step_budget_s: DEFAULT_STEP_BUDGET_S,
                    memory_best: None,
                    step_time_estimated_s: None,
                    step_flops: None,
                },
                5,
            );
            assert!(text.starts_with("Nothing fits on a 60.0 GiB device: every configuration runs out of memory (426 MiB of it outside the allocator: CUDA context 426 MiB). With `expandable_segments:True`, which gets furthest, it needs a device of 72.0 GiB or more; the smallest card in the table: A100-80GB-PCIe (79.1 GiB). To fit this card"), "{text}");
            assert!(text.contains("allocbench fit --param NAME=LO..HI --capacity 61440MiB"), "{text}");
        }
        // A candidate that gets further is not beaten by one that fails sooner with less.
        let mut all = vec![candidate("a", 50 << 30, 10, 0.1, Some(5)), candidate("b", 60 << 30, 20, 0.2, Some(9))];
        rank(&mut all, Objective::Memory, None);
        assert_eq!(recommend(&all).unwrap().conf, "b");
    }

    /// The balanced pick is weighed against the step: with a 350 ms step, 1 % is 3.5 ms a step;
    /// a leaner configuration over that is said as turned down, with what it saves and costs.
    #[test]
    fn the_balanced_pick_weighs_allocator_time_against_the_step() {
        let steps = 20.0;
        let mut all = vec![
            candidate("", 14 << 30, 400, 0.053, None),
            candidate("expandable_segments:True", 10 << 30, 300, 0.053 + 0.0005 * steps, None),
            candidate("max_split_size_mb:64", 12 << 30, 900, 0.053 + 0.001 * steps, None),
        ];
        let allowance = (step_budget_s(Some(0.35)) * steps * 1e9) as u64;
        assert_eq!(allowance, 70_000_000, "3.5 ms a step over 20 steps");
        let budget = time_budget_ns(&all, allowance);
        rank(&mut all, Objective::Balanced, budget);
        assert_eq!(recommend(&all).unwrap().conf, "expandable_segments:True", "+0.5 ms/step is within 3.5 ms/step");
        // With a 20 ms step (0.2 ms a step allowed) it is over; the defaults stay, and the table says why.
        let mut all = vec![candidate("", 14 << 30, 400, 0.053, None), candidate("expandable_segments:True", 10 << 30, 300, 0.053 + 0.0005 * steps, None)];
        let budget = time_budget_ns(&all, (step_budget_s(Some(0.02)) * steps * 1e9) as u64);
        rank(&mut all, Objective::Balanced, budget);
        let best = recommend(&all).unwrap();
        assert_eq!(best.conf, "");
        let info =
            WorkloadInfo { name: "t".into(), kind: "trace".into(), origin: "t.csv".into(), sha256: String::new(), seed: None, description: String::new() };
        let text = describe(
            &AdviseResult {
                schema_version: SCHEMA_VERSION,
                workload: info,
                capacity: 80 << 30,
                objective: Objective::Balanced,
                latency_table: "t".into(),
                time_budget_s: budget.map(|b| b as f64 / 1e9),
                replays: 2,
                elapsed_s: 0.0,
                threads: 1,
                recommended: Some(best),
                configs: all,
                outside: crate::gpu::card::Outside::NONE,
                fits_from: None,
                smallest_card: None,
                not_whole_run: None,
                steps: 20,
                step_time_s: Some(0.02),
                step_budget_s: step_budget_s(Some(0.02)),
                memory_best: None,
                step_time_estimated_s: None,
                step_flops: None,
            },
            5,
        );
        assert!(text.contains("exceeds the reference's by at most 200 µs/step (1 % of the 20.0 ms step)"), "{text}");
        assert!(
            text.contains("turned down: expandable_segments:True: -4.00 GiB, +500 µs/step, over the allowance of 200 µs/step (1 % of the 20.0 ms step); `--objective memory` to prefer it"),
            "{text}"
        );
    }

    #[test]
    fn settings_are_counted_as_pytorch_parses_them() {
        assert_eq!(setting_count(""), 0);
        assert_eq!(setting_count("expandable_segments:True"), 1);
        assert_eq!(setting_count("roundup_power2_divisions:[64:8,256:4,>:1],max_split_size_mb:64"), 2);
    }
}
