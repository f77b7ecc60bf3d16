//! `allocbench fidelity`: the simulator's `memory_stats()` against PyTorch's real allocator on
//! the same trace, key by key (the PyTorch side comes from `scripts/torch_replay.py`).

use std::collections::BTreeMap;
use std::path::Path;

use super::caching::CachingAllocator;
use super::config::AllocatorConfig;
use super::device::address_replay::AddressReplay;
use super::device::withheld::Withheld;
use super::device::{AddressOrder, SimDevice};
#[cfg(test)]
use super::replay::replay_with_hook;
use super::replay::{replay_watched, AtStep, OnOom, ReplayOptions, StopWhen};
use crate::error::InputError;
use crate::input::Source;
#[cfg(test)]
use crate::results::TorchStep;
use crate::results::{FidelityReport, Mismatch, TorchReplay};

/// The keys the fidelity target is stated on.
pub const TARGET_KEYS: [&str; 4] = ["reserved_bytes.all.peak", "segment.all.allocated", "num_alloc_retries", "num_ooms"];

pub fn load_torch(path: &Path) -> Result<TorchReplay, InputError> {
    let name = path.display().to_string();
    // One memory_stats() per step: a few MiB for a long trace.
    let text = crate::files::read_text_at_most(path, 256 << 20, "a torch_replay.py output")?;
    let t: TorchReplay = serde_json::from_str(&text).map_err(|e| InputError::new(&name, format!("not a torch_replay.py output: {e}")))?;
    if t.format != "allocbench-torch-replay-v1" {
        return Err(InputError::new(&name, format!("unknown format '{}' (expected allocbench-torch-replay-v1)", t.format)));
    }
    crate::units::check_capacity(t.total_memory).map_err(|m| InputError::new(&name, format!("total_memory {}: {m}", t.total_memory)))?;
    // Without the target keys at the end there is nothing to judge the simulator by.
    if let Some(missing) = TARGET_KEYS.iter().find(|k| !t.r#final.contains_key(**k)) {
        return Err(InputError::new(&name, format!("its final memory_stats() lack '{missing}' (not a torch_replay.py output?)")));
    }
    Ok(TorchReplay { path: name, ..t })
}

/// Compares `sim` with `torch` on every key both have, appending the differences at `at`; returns
/// how many keys were compared.
pub(crate) fn compare_stats(at: &str, sim: &BTreeMap<String, i64>, torch: &BTreeMap<String, i64>, out: &mut Vec<Mismatch>) -> usize {
    let mut n = 0;
    for (k, &t) in torch {
        // Keys our model does not have (or a newer torch added) are not compared.
        if let Some(&s) = sim.get(k) {
            n += 1;
            if s != t {
                out.push(Mismatch { at: at.to_string(), key: k.clone(), sim: s, torch: t });
            }
        }
    }
    n
}

/// Replays `trace` on the simulator with PyTorch's capacity and conf and compares. Segments are
/// placed at the addresses the GPU returned, or with `address_order` by the simulator's own
/// placement (what the default path does without a history to replay).
pub fn check(trace: &Path, torch: &TorchReplay, conf_override: Option<&str>, address_order: Option<AddressOrder>) -> anyhow::Result<FidelityReport> {
    let conf = match conf_override {
        Some(c) => AllocatorConfig::parse(c)?,
        // The conf PyTorch ran with is the JSON's: a bad one is that file's fault.
        None => AllocatorConfig::parse(&torch.conf).map_err(|e| InputError::new(&torch.path, format!("its conf '{}': {}", torch.conf, e.message)))?,
    };
    let source = Source::open(Some(trace))?;
    let unavailable = torch.free_memory_at_start.map(|f| torch.total_memory.saturating_sub(f)).unwrap_or(0);
    // Best fit breaks ties by address: replay the addresses the GPU handed out. (Composed here
    // rather than by `gpu::build`, to read the address misses back.)
    let script = if address_order.is_none() { torch.segment_addresses.clone() } else { Vec::new() };
    let sim = SimDevice::new(torch.total_memory).with_address_order(address_order.unwrap_or_default());
    let device = Withheld::new(AddressReplay::new(sim, script), unavailable);
    let mut alloc = CachingAllocator::new(conf.clone(), device);
    let mut snapshots: Vec<(u64, BTreeMap<String, i64>)> = Vec::new();
    let opts = ReplayOptions { on_oom: OnOom::Stop, ..Default::default() };
    let mut watch = (AtStep(|n, _, stats: &crate::gpu::stats::DeviceStats| snapshots.push((n, stats.to_torch_map()))), StopWhen(crate::interrupt::interrupted));
    let outcome = replay_watched(&mut alloc, source.events()?, &opts, &mut watch)?;
    if outcome.interrupted {
        return Err(crate::interrupt::Interrupted(format!("at event {} of {}: nothing compared", outcome.events, trace.display())).into());
    }
    // Neither side stopped early: both replayed every row, so a different count is another trace.
    if torch.oom.is_none() && outcome.oom.is_none() && torch.events != outcome.events {
        return Err(InputError::new(
            &torch.path,
            format!("PyTorch replayed {} events but {} has {}: this JSON is from another trace", torch.events, trace.display(), outcome.events),
        )
        .into());
    }
    let final_sim = snapshots.pop().map(|s| s.1).unwrap_or_default();
    let mut mismatches = Vec::new();
    let mut keys = 0;
    let mut compared = 0;
    for (i, ts) in torch.steps.iter().enumerate() {
        if let Some((n, sim)) = snapshots.get(i) {
            keys = keys.max(compare_stats(&format!("step {n}"), sim, &ts.stats, &mut mismatches));
            compared += 1;
        }
    }
    keys = keys.max(compare_stats("final", &final_sim, &torch.r#final, &mut mismatches));
    compared += 1;
    // Identical means compared and equal: load_torch saw each target key in PyTorch's final stats.
    let target_identical = TARGET_KEYS.iter().all(|k| final_sim.contains_key(*k) && !mismatches.iter().any(|m| m.at == "final" && m.key == *k));
    let address_misses = alloc.device().inner().script_misses;
    Ok(FidelityReport {
        address_order: match address_order {
            None => "replay".into(),
            Some(AddressOrder::Lowest) => "lowest".into(),
            Some(AddressOrder::Driver) => "driver".into(),
        },
        addresses_replayed: if address_order.is_none() { torch.segment_addresses.len() } else { 0 },
        address_misses,
        conf: conf.source.clone(),
        torch_version: torch.torch_version.clone(),
        device: torch.device.clone(),
        keys_compared: keys,
        snapshots_compared: compared,
        mismatches,
        target_identical,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_stats_give_no_mismatch_and_a_difference_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let trace = dir.path().join("t.csv");
        std::fs::write(&trace, "op,id,bytes,stream\nstep,1,,\nalloc,1,5242880,0\nstep,2,,\nfree,1,,\n").unwrap();
        // Build the "torch" side from the simulator itself, then perturb one key.
        let mut a = CachingAllocator::new(AllocatorConfig::default(), SimDevice::new(80 << 30));
        let mut snaps = Vec::new();
        let src = Source::open(Some(&trace)).unwrap();
        replay_with_hook(&mut a, src.events().unwrap(), &ReplayOptions::default(), &mut |n, e, s| snaps.push((n, e, s.to_torch_map()))).unwrap();
        let fin = snaps.pop().unwrap().2;
        let mut torch = TorchReplay {
            format: "allocbench-torch-replay-v1".into(),
            torch_version: "test".into(),
            device: "sim".into(),
            total_memory: 80 << 30,
            free_memory_at_start: None,
            segment_addresses: Vec::new(),
            conf: String::new(),
            events: 4,
            oom: None,
            steps: snaps.into_iter().map(|(n, e, stats)| TorchStep { step: n, event: e, stats }).collect(),
            r#final: fin,
            path: "torch.json".into(),
        };
        let r = check(&trace, &torch, None, None).unwrap();
        assert!(r.mismatches.is_empty() && r.target_identical && r.keys_compared == 123 && r.snapshots_compared == 3, "{r:?}");
        assert_eq!(r.address_order, "replay");
        let r = check(&trace, &torch, None, Some(AddressOrder::Driver)).unwrap();
        assert!(r.mismatches.is_empty() && r.address_order == "driver" && r.addresses_replayed == 0, "{r:?}");
        torch.r#final.insert("segment.all.allocated".into(), 2);
        let r = check(&trace, &torch, None, None).unwrap();
        assert_eq!(r.mismatches, vec![Mismatch { at: "final".into(), key: "segment.all.allocated".into(), sim: 1, torch: 2 }]);
        assert!(!r.target_identical);
    }
}
