//! `allocbench cpu advise`: ranks allocator × settings runs of one program (replays of a recorded
//! trace, or `--exec` runs) by the memory they hold — steady RSS, peak, retained after the drain —
//! at a throughput cost, and picks one for an objective, never one another run beats on every
//! column. Analysis only: the runs are made by the command (`cli/cpu.rs`).

use crate::results::{CpuAdviseResult, CpuCandidate, CpuExecResult, CpuRunResult};

/// The settings tried besides each allocator's defaults, when installed: the usual fixes for a
/// process whose RSS outgrows its data.
/// - glibc `arena_max=2`: caps the arenas glibc adds per thread (up to 8 × cores), what
///   `MALLOC_ARENA_MAX` sets;
/// - glibc fixed `mmap_threshold` / `trim_threshold` (128 KiB): glibc raises its mmap threshold up
///   to 32 MiB as large blocks are freed, moving them into arenas that fragment;
/// - jemalloc `dirty_decay_ms=1000,muzzy_decay_ms=0` (and with `background_thread`): gives unused
///   pages back within a second instead of 10 s;
/// - tcmalloc `aggressive_decommit`: releases free spans at once;
/// - mimalloc `purge_delay=0` (`reset_delay` before 2.1): purges freed pages at once.
pub const GRID: &[&str] = &[
    "glibc:arena_max=2",
    "glibc:mmap_threshold=131072,trim_threshold=131072",
    "jemalloc:dirty_decay_ms=1000,muzzy_decay_ms=0",
    "jemalloc:background_thread=true,dirty_decay_ms=1000,muzzy_decay_ms=0",
    "tcmalloc:aggressive_decommit=true",
    "mimalloc:purge_delay=0",
];

/// The objectives (as `advise`'s for the GPU).
pub const OBJECTIVES: [&str; 3] = ["memory", "balanced", "time"];

/// Under `balanced`, how much more CPU time than the baseline (glibc's defaults) a pick may use.
pub const BALANCED_TIME_ALLOWANCE: f64 = 0.10;

/// Mean of `points` (t, value) weighted by the time each value held, up to `end_s`.
fn time_weighted_mean(points: &[(f64, f64)], end_s: f64) -> Option<f64> {
    let pts: Vec<(f64, f64)> = points.iter().copied().filter(|&(t, _)| t <= end_s).collect();
    if pts.len() < 2 {
        return pts.first().map(|&(_, v)| v);
    }
    let (mut area, mut span) = (0.0, 0.0);
    for w in pts.windows(2) {
        let dt = (w[1].0 - w[0].0).max(0.0);
        area += w[0].1 * dt;
        span += dt;
    }
    if span > 0.0 {
        Some(area / span)
    } else {
        pts.last().map(|&(_, v)| v)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One measured run, reduced to what advise compares.
#[derive(Debug, Clone)]
pub struct Measured {
    pub label: String,
    pub allocator: String,
    pub settings: Vec<String>,
    pub ld_preload: Option<String>,
    /// Time-weighted mean RSS while it ran, its peak, what it kept after the drain (bytes above
    /// the replay's start; a program's whole RSS for `--exec`).
    pub steady: f64,
    pub peak: f64,
    pub retained: Option<f64>,
    /// CPU seconds the run used: the replay process's (its idle time, paced, not counted), or
    /// the program tree's.
    pub cpu_s: f64,
}

impl Measured {
    pub fn of_replay(r: &CpuRunResult) -> Self {
        let before = r.rss_before as f64;
        let pts: Vec<(f64, f64)> = r.rss_timeline.iter().map(|s| (s.t_s, s.rss as f64 - before)).collect();
        let peak = r.peak_rss as f64 - before;
        Measured {
            label: r.label(),
            allocator: r.allocator.clone(),
            settings: r.settings.clone(),
            ld_preload: r.live_malloc.ld_preload.clone(),
            steady: time_weighted_mean(&pts, r.wall_s).unwrap_or(peak),
            peak,
            retained: Some(r.retained_after_drain.last().map_or(r.retained, |d| d.retained) as f64),
            cpu_s: r.cpu_s.unwrap_or(r.wall_s),
        }
    }

    pub fn of_exec(r: &CpuExecResult) -> Self {
        let pts: Vec<(f64, f64)> = r.rss.iter().map(|&(t, b)| (t, b as f64)).collect();
        Measured {
            label: r.label(),
            allocator: r.allocator.clone(),
            settings: r.settings.clone(),
            ld_preload: r.ld_preload.clone(),
            steady: time_weighted_mean(&pts, r.wall_s).unwrap_or(r.peak_rss_bytes as f64),
            peak: r.peak_rss_bytes as f64,
            retained: None,
            cpu_s: r.user_s + r.sys_s,
        }
    }
}

/// The line to paste: the preload and the settings' environment.
pub fn paste_line(ld_preload: Option<&str>, settings: &[String]) -> String {
    let parts: Vec<String> = ld_preload.map(|l| format!("LD_PRELOAD={l}")).into_iter().chain(settings.iter().cloned()).collect();
    if parts.is_empty() {
        "nothing to set: glibc's defaults".to_string()
    } else {
        parts.join(" ")
    }
}

/// Folds repetitions (runs of one label) to their medians, ranks them for `objective` and picks
/// the first that no other beats on every column.
pub fn rank(runs: &[Measured], objective: &str, input: &str) -> CpuAdviseResult {
    let mut labels: Vec<&str> = Vec::new();
    for r in runs {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    let mut cands: Vec<CpuCandidate> = labels
        .iter()
        .map(|l| {
            let reps: Vec<&Measured> = runs.iter().filter(|r| r.label == *l).collect();
            let retained: Vec<f64> = reps.iter().filter_map(|r| r.retained).collect();
            CpuCandidate {
                label: l.to_string(),
                allocator: reps[0].allocator.clone(),
                settings: reps[0].settings.clone(),
                line: paste_line(reps[0].ld_preload.as_deref(), &reps[0].settings),
                runs: reps.len() as u32,
                steady_rss_bytes: median(reps.iter().map(|r| r.steady).collect()),
                peak_rss_bytes: median(reps.iter().map(|r| r.peak).collect()),
                retained_bytes: (!retained.is_empty()).then(|| median(retained)),
                cpu_s: median(reps.iter().map(|r| r.cpu_s).collect()),
                time_cost: 0.0,
                dominated_by: None,
            }
        })
        .collect();
    // The baseline: glibc's defaults (what a process has without doing anything), else the first.
    let base = cands.iter().position(|c| c.allocator == "glibc" && c.settings.is_empty()).unwrap_or(0);
    let base_cpu = cands.get(base).map_or(0.0, |c| c.cpu_s);
    for c in &mut cands {
        c.time_cost = if base_cpu > 0.0 { c.cpu_s / base_cpu - 1.0 } else { 0.0 };
    }
    // Dominated: another is no worse on steady, peak, retained and CPU time, and better on one.
    let snapshot = cands.clone();
    for c in &mut cands {
        c.dominated_by = snapshot
            .iter()
            .find(|o| {
                let ret_le = match (o.retained_bytes, c.retained_bytes) {
                    (Some(a), Some(b)) => a <= b,
                    _ => true,
                };
                let ret_lt = matches!((o.retained_bytes, c.retained_bytes), (Some(a), Some(b)) if a < b);
                o.label != c.label
                    && o.steady_rss_bytes <= c.steady_rss_bytes
                    && o.peak_rss_bytes <= c.peak_rss_bytes
                    && ret_le
                    && o.cpu_s <= c.cpu_s
                    && (o.steady_rss_bytes < c.steady_rss_bytes || o.peak_rss_bytes < c.peak_rss_bytes || ret_lt || o.cpu_s < c.cpu_s)
            })
            .map(|o| o.label.clone());
    }
    let memory_key = |c: &CpuCandidate| (c.steady_rss_bytes, c.peak_rss_bytes, c.retained_bytes.unwrap_or(0.0));
    match objective {
        "time" => cands.sort_by(|a, b| a.cpu_s.total_cmp(&b.cpu_s)),
        "memory" => cands.sort_by(|a, b| memory_key(a).partial_cmp(&memory_key(b)).unwrap_or(std::cmp::Ordering::Equal)),
        _ => cands.sort_by(|a, b| {
            let (fa, fb) = (a.time_cost <= BALANCED_TIME_ALLOWANCE, b.time_cost <= BALANCED_TIME_ALLOWANCE);
            fb.cmp(&fa).then(memory_key(a).partial_cmp(&memory_key(b)).unwrap_or(std::cmp::Ordering::Equal))
        }),
    }
    let pick = cands.iter().position(|c| c.dominated_by.is_none()).unwrap_or(0);
    let (line, reason) = match cands.get(pick) {
        Some(c) => {
            let b = &snapshot[base];
            let pct = |a: f64, b: f64| if b > 0.0 { (a / b - 1.0) * 100.0 } else { 0.0 };
            let why = match objective {
                "time" => "the least CPU time".to_string(),
                "memory" => "the least steady RSS".to_string(),
                _ => format!("the least steady RSS at most {:.0} % more CPU time than {}", BALANCED_TIME_ALLOWANCE * 100.0, b.label),
            };
            let reason = format!(
                "{}: {why}: steady RSS {} ({:+.0} % against {}), peak {} ({:+.0} %), {}CPU time {:+.1} %",
                c.label,
                crate::units::format_bytes(c.steady_rss_bytes.max(0.0) as u64),
                pct(c.steady_rss_bytes, b.steady_rss_bytes),
                b.label,
                crate::units::format_bytes(c.peak_rss_bytes.max(0.0) as u64),
                pct(c.peak_rss_bytes, b.peak_rss_bytes),
                match (c.retained_bytes, b.retained_bytes) {
                    (Some(r), Some(_)) => format!("retained after the drain {}, ", crate::units::format_bytes_signed(r as i128)),
                    _ => String::new(),
                },
                pct(c.cpu_s, b.cpu_s)
            );
            (c.line.clone(), reason)
        }
        None => (String::new(), "no run finished".to_string()),
    };
    if pick > 0 {
        // The recommendation first; the ranking otherwise stands.
        let c = cands.remove(pick);
        cands.insert(0, c);
    }
    CpuAdviseResult {
        schema_version: crate::results::SCHEMA_VERSION,
        input: input.to_string(),
        objective: objective.to_string(),
        candidates: cands,
        line,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tp`: throughput, turned into CPU seconds for a fixed amount of work (100 / tp).
    fn m(label: &str, allocator: &str, steady: f64, peak: f64, retained: f64, tp: f64) -> Measured {
        Measured {
            label: label.into(),
            allocator: allocator.into(),
            settings: if label.contains(' ') { vec![label.split_once(' ').unwrap().1.to_string()] } else { vec![] },
            ld_preload: (allocator != "glibc").then(|| format!("/lib/lib{allocator}.so")),
            steady,
            peak,
            retained: Some(retained),
            cpu_s: 100.0 / tp,
        }
    }

    #[test]
    fn balanced_picks_the_least_memory_within_the_time_allowance() {
        let runs = vec![
            m("glibc", "glibc", 100.0, 150.0, 50.0, 10.0),
            m("jemalloc", "jemalloc", 80.0, 140.0, 40.0, 12.0),
            // Least memory, but 25 % slower than glibc: balanced passes it over, memory takes it.
            m("mimalloc MIMALLOC_RESET_DELAY=0", "mimalloc", 60.0, 130.0, 5.0, 8.0),
            m("tcmalloc", "tcmalloc", 90.0, 145.0, 45.0, 9.5),
        ];
        let r = rank(&runs, "balanced", "t");
        assert_eq!(r.candidates[0].label, "jemalloc");
        assert_eq!(r.line, "LD_PRELOAD=/lib/libjemalloc.so");
        assert!(r.reason.contains("-20 % against glibc"), "{}", r.reason);
        let r = rank(&runs, "memory", "t");
        assert_eq!(r.candidates[0].label, "mimalloc MIMALLOC_RESET_DELAY=0");
        assert_eq!(r.line, "LD_PRELOAD=/lib/libmimalloc.so MIMALLOC_RESET_DELAY=0");
        let r = rank(&runs, "time", "t");
        assert_eq!(r.candidates[0].label, "jemalloc");
        // tcmalloc is beaten by jemalloc on every column.
        assert_eq!(r.candidates.iter().find(|c| c.label == "tcmalloc").unwrap().dominated_by.as_deref(), Some("jemalloc"));
        let glibc = r.candidates.iter().find(|c| c.label == "glibc").unwrap();
        assert_eq!(glibc.time_cost, 0.0);
        assert_eq!(paste_line(None, &[]), "nothing to set: glibc's defaults");
    }

    #[test]
    fn repetitions_fold_to_medians_and_a_dominated_pick_is_skipped() {
        let runs = vec![
            m("glibc", "glibc", 100.0, 150.0, 50.0, 10.0),
            m("glibc", "glibc", 110.0, 160.0, 50.0, 10.0),
            m("glibc", "glibc", 300.0, 400.0, 50.0, 10.0),
            // Lowest steady memory under balanced, but worse peak and retained than nothing.
            m("jemalloc", "jemalloc", 90.0, 170.0, 60.0, 10.0),
        ];
        let r = rank(&runs, "balanced", "t");
        let glibc = r.candidates.iter().find(|c| c.label == "glibc").unwrap();
        assert_eq!((glibc.runs, glibc.steady_rss_bytes, glibc.peak_rss_bytes), (3, 110.0, 160.0));
        assert_eq!(r.candidates[0].label, "jemalloc", "not dominated: it holds less steady RSS");
        assert!((time_weighted_mean(&[(0.0, 10.0), (1.0, 20.0), (3.0, 0.0)], 10.0).unwrap() - (10.0 + 40.0) / 3.0).abs() < 1e-9);
    }
}
