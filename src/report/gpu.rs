//! The GPU section (`gpu_replay` records): per workload, which config cuts peak reserved most
//! against PyTorch's defaults and at what cost in device calls, the OOMs; one row per
//! allocator × conf (repetitions folded, with their spread); the charts; and a memory view page
//! per workload.

use std::fmt::Write as _;
use std::path::Path;

use super::charts::{self, BarGroup, BarOptions, Line, Marker, SegmentRow};
use super::spread::{fold, Spread};
use super::style::{self, slug};
use super::{memory_view, percent_change, write_chart, Chart, Section};
use crate::input::Source;
use crate::results::{Backend, GpuPolicy, GpuRunResult, ResultRecord, SegmentSnapshot, TimelinePoint};
use crate::units::format_bytes;

/// A short form of a GPU run's label for axes: the conf's keys abbreviated.
pub fn gpu_short_label(r: &GpuRunResult) -> String {
    if !r.allocator.takes_conf() {
        return r.allocator.to_string();
    }
    if r.conf.is_empty() {
        return "pytorch default".into();
    }
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in r.conf.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    let short: Vec<String> = parts
        .iter()
        .map(|p| {
            let (k, v) = p.split_once(':').unwrap_or((p, ""));
            match k.trim() {
                "expandable_segments" => {
                    if v.trim() == "True" {
                        "expandable".into()
                    } else {
                        "not expandable".into()
                    }
                }
                "max_split_size_mb" => format!("split<{v}M"),
                "roundup_power2_divisions" => "roundup".into(),
                "garbage_collection_threshold" => format!("gc {v}"),
                "per_process_memory_fraction" => format!("cap {v}"),
                "max_non_split_rounding_mb" => format!("nonsplit {v}M"),
                other => other.to_string(),
            }
        })
        .collect();
    short.join(" ")
}

/// The label of a config in findings: the conf string, or what the allocator is.
fn config_name(r: &GpuRunResult) -> String {
    match (r.allocator, r.conf.is_empty()) {
        (GpuPolicy::Pytorch, true) => "PyTorch's defaults".into(),
        (GpuPolicy::Pytorch, false) => format!("`{}`", r.conf),
        (other, _) => format!("`{other}`"),
    }
}

/// Repetitions of one configuration on one workload (same allocator, conf, capacity, backend).
pub struct GpuRow<'a> {
    pub runs: Vec<&'a GpuRunResult>,
    pub peak_reserved: Spread,
    pub device_mallocs: Spread,
    pub overhead: Spread,
    pub fragmentation: Spread,
}

impl<'a> GpuRow<'a> {
    fn new(runs: Vec<&'a GpuRunResult>) -> Self {
        let s = |f: &dyn Fn(&GpuRunResult) -> f64| Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        GpuRow {
            peak_reserved: s(&|r| r.summary.peak_reserved as f64),
            device_mallocs: s(&|r| r.summary.device_mallocs as f64),
            overhead: s(&|r| r.summary.overhead),
            fragmentation: s(&|r| r.summary.fragmentation_at_peak),
            runs,
        }
    }
    fn first(&self) -> &'a GpuRunResult {
        self.runs[0]
    }
    fn ooms(&self) -> usize {
        self.runs.iter().filter(|r| r.oom.is_some()).count()
    }
    /// PyTorch's default config: the baseline of the relative columns.
    fn is_default(&self) -> bool {
        self.first().allocator == GpuPolicy::Pytorch && self.first().conf.is_empty()
    }
}

/// What runs are compared with each other: one workload on one device (capacity and backend).
/// Runs on other capacities are other cases, with their own baseline.
type CaseKey = (String, u64, Backend);

fn case_key(r: &GpuRunResult) -> CaseKey {
    (r.workload.name.clone(), r.capacity, r.backend)
}

/// One case's runs, with its label (the workload's name, and the capacity and the backend where
/// the same workload was run on several) and the slug its files are named by.
pub struct Case<'a> {
    pub label: String,
    pub slug: String,
    pub runs: Vec<&'a GpuRunResult>,
}

/// The runs of each case, in first-seen order.
pub fn runs_by_case<'a>(runs: &[&'a GpuRunResult]) -> Vec<Case<'a>> {
    let cases = fold(runs.iter().copied(), case_key);
    let case = |(name, capacity, backend): &CaseKey, runs: &Vec<&'a GpuRunResult>| {
        let same_name: Vec<&CaseKey> = cases.iter().map(|(k, _)| k).filter(|k| &k.0 == name).collect();
        let mut suffix = String::new();
        if same_name.iter().any(|k| k.1 != *capacity) {
            suffix += &format!(" on {}", format_bytes(*capacity));
        }
        if same_name.iter().any(|k| k.2 != *backend) {
            suffix += &format!(" ({})", if *backend == Backend::Sim { "simulated" } else { "real GPU" });
        }
        // The suffix is slugged apart: a long name's clipping must not cut it off (two cases
        // would write one file).
        let slug = if suffix.is_empty() { slug(name) } else { format!("{}-{}", slug(name), slug(&suffix)) };
        Case { label: format!("{name}{suffix}"), slug, runs: runs.clone() }
    };
    cases.iter().map(|(k, group)| case(k, group)).collect()
}

/// Each case's rows (see [`runs_by_case`]), repetitions folded, in first-seen order.
pub fn rows_by_workload<'a>(runs: &[&'a GpuRunResult]) -> Vec<(String, Vec<GpuRow<'a>>)> {
    runs_by_case(runs)
        .into_iter()
        .map(|case| (case.label, fold(case.runs, |r| (r.allocator, r.conf.clone())).into_iter().map(|(_, reps)| GpuRow::new(reps)).collect()))
        .collect()
}

fn bytes_spread(s: &Spread) -> String {
    match s.ci95 {
        Some(h) => format!("{} ± {}", format_bytes(s.mean as u64), format_bytes(h as u64)),
        None => format_bytes(s.mean as u64),
    }
}

/// The PyTorch configs other than the defaults that ran without an OOM.
fn tuned<'r, 'a>(rows: &'r [GpuRow<'a>]) -> Vec<&'r GpuRow<'a>> {
    rows.iter().filter(|r| r.first().allocator == GpuPolicy::Pytorch && !r.is_default() && r.ooms() == 0).collect()
}

/// The one of `rows` that reserves least (the fewest device mallocs among equals).
fn least_reserved<'r, 'a>(rows: &[&'r GpuRow<'a>]) -> Option<&'r GpuRow<'a>> {
    rows.iter().copied().min_by(|a, b| a.peak_reserved.mean.total_cmp(&b.peak_reserved.mean).then(a.device_mallocs.mean.total_cmp(&b.device_mallocs.mean)))
}

/// The findings of one workload: the config that cuts peak reserved most against the defaults,
/// by how much and at what cost in device calls; and the OOMs.
pub fn findings(workload: &str, rows: &[GpuRow]) -> Vec<String> {
    let mut out = Vec::new();
    let fits = |r: &&GpuRow| r.ooms() == 0;
    let ideal = rows
        .iter()
        .find(|r| r.first().allocator == GpuPolicy::Ideal)
        .map(|r| format!("; the ideal bound (peak live bytes) is {}", format_bytes(r.peak_reserved.mean as u64)));
    // A run that stopped at an OOM has no full peak to compare: the OOM sentence below says it.
    if let Some(base) = rows.iter().find(|r| r.is_default()).filter(|b| b.ooms() == 0) {
        let tried = tuned(rows);
        // Among configs that reserve the same least, the one with the fewest device mallocs is
        // named, and the others beside it: a tie is no ranking.
        match least_reserved(&tried) {
            Some(b) if b.peak_reserved.mean < base.peak_reserved.mean => {
                let tied: Vec<String> = tried
                    .iter()
                    .filter(|r| !std::ptr::eq(**r, b) && r.peak_reserved.mean == b.peak_reserved.mean)
                    .map(|r| format!("{} at {} device mallocs", config_name(r.first()), r.device_mallocs.show(|v| format!("{v:.0}"))))
                    .collect();
                let name = if tied.is_empty() {
                    config_name(b.first())
                } else {
                    format!("{} (tied on peak reserved with {})", config_name(b.first()), tied.join(", "))
                };
                out.push(format!(
                    "{workload}: {name} cuts peak reserved most, {} → {} ({}, {} less) at {} device mallocs instead of {} ({:.2}×){}.",
                    bytes_spread(&base.peak_reserved),
                    bytes_spread(&b.peak_reserved),
                    percent_change(b.peak_reserved.mean, base.peak_reserved.mean),
                    format_bytes((base.peak_reserved.mean - b.peak_reserved.mean) as u64),
                    b.device_mallocs.show(|v| format!("{v:.0}")),
                    base.device_mallocs.show(|v| format!("{v:.0}")),
                    if base.device_mallocs.mean > 0.0 { b.device_mallocs.mean / base.device_mallocs.mean } else { f64::NAN },
                    ideal.clone().unwrap_or_default()
                ));
            }
            _ => out.push(format!(
                "{workload}: no config tried reserves less than PyTorch's defaults ({}){}.",
                bytes_spread(&base.peak_reserved),
                ideal.clone().unwrap_or_default()
            )),
        }
    }
    if !rows.iter().any(|r| r.is_default()) {
        // The ideal policy is the bound, not a choice.
        if let Some(low) =
            rows.iter().filter(fits).filter(|r| r.first().allocator != GpuPolicy::Ideal).min_by(|a, b| a.peak_reserved.mean.total_cmp(&b.peak_reserved.mean))
        {
            out.push(format!(
                "{workload}: no run with PyTorch's defaults to compare against; {} reserves least, {} at {} device mallocs.",
                config_name(low.first()),
                bytes_spread(&low.peak_reserved),
                low.device_mallocs.show(|v| format!("{v:.0}"))
            ));
        }
    }
    let oomed: Vec<String> = rows
        .iter()
        .filter(|r| r.ooms() > 0)
        .map(|r| {
            let o = r.first().oom.as_ref().or_else(|| r.runs.iter().find_map(|x| x.oom.as_ref())).expect("a run with an OOM");
            let reps = if r.runs.len() > 1 { format!(" in {} of {} runs", r.ooms(), r.runs.len()) } else { String::new() };
            format!("{} at step {} ({}, {} requested){reps}", config_name(r.first()), o.step, o.cause, format_bytes(o.requested))
        })
        .collect();
    if !oomed.is_empty() {
        let fit: Vec<String> = rows
            .iter()
            .filter(fits)
            .map(|r| {
                format!(
                    "{} (peak reserved {}, {} device mallocs)",
                    config_name(r.first()),
                    bytes_spread(&r.peak_reserved),
                    r.device_mallocs.show(|v| format!("{v:.0}"))
                )
            })
            .collect();
        // (A case's label names its capacity already where the workload ran on several.)
        let capacity = format!(" on {}", format_bytes(rows[0].first().capacity));
        out.push(format!(
            "{workload}{}: out of memory with {}; {}.",
            if workload.contains(&capacity) { "" } else { capacity.as_str() },
            oomed.join(", "),
            if fit.is_empty() { "no config tried fits".to_string() } else { format!("fits with {}", fit.join(", ")) }
        ));
    }
    out
}

/// The family a workload belongs to, for the page's decisions: its kind, a captured trace
/// counted with the generated workload it was captured as (`NAME-captured` and `NAME`).
fn family(r: &GpuRunResult, all: &[(String, Vec<GpuRow>)]) -> String {
    let kind = if r.workload.kind == "trace" {
        let twin = r.workload.name.trim_end_matches("-captured");
        all.iter().flat_map(|(_, rows)| rows.iter()).map(|row| &row.first().workload).find(|w| w.name == twin && w.kind != "trace").map(|w| w.kind.as_str())
    } else {
        Some(r.workload.kind.as_str())
    };
    match kind {
        Some("transformer") => "Training".into(),
        Some("model_switch") => "Model switching".into(),
        Some("serving") => "Serving".into(),
        Some("scenario") => "Textbook scenarios".into(),
        Some(other) => other.to_string(),
        None => "Captured traces".into(),
    }
}

/// Modelled allocator time per step of a run (when it was priced).
fn ms_per_step(r: &GpuRunResult) -> Option<f64> {
    r.summary.modelled_alloc_time_s.map(|t| t / r.summary.last_step.max(1) as f64 * 1e3)
}

/// What to set, per family of workloads (training, serving, ...): the config that cuts peak
/// reserved most on each, said once for the family when its workloads agree, with the range of
/// what it saves and costs; else each workload's.
pub fn decisions(by_workload: &[(String, Vec<GpuRow>)]) -> Vec<String> {
    struct Pick {
        workload: String,
        conf: String,
        saved: f64,
        percent: f64,
        mallocs: f64,
        extra_ms: Option<f64>,
    }
    let mut families: Vec<(String, Vec<Pick>)> = Vec::new();
    for (workload, rows) in by_workload {
        let Some(base) = rows.iter().find(|r| r.is_default()).filter(|b| b.ooms() == 0) else { continue };
        let best = least_reserved(&tuned(rows)).filter(|b| b.peak_reserved.mean < base.peak_reserved.mean).unwrap_or(base);
        let pick = Pick {
            workload: workload.clone(),
            conf: config_name(best.first()),
            saved: base.peak_reserved.mean - best.peak_reserved.mean,
            percent: 100.0 * (base.peak_reserved.mean - best.peak_reserved.mean) / base.peak_reserved.mean.max(1.0),
            mallocs: if base.device_mallocs.mean > 0.0 { best.device_mallocs.mean / base.device_mallocs.mean } else { f64::NAN },
            extra_ms: ms_per_step(best.first()).zip(ms_per_step(base.first())).map(|(b, d)| b - d),
        };
        let name = family(base.first(), by_workload);
        match families.iter_mut().find(|(f, _)| *f == name) {
            Some((_, picks)) => picks.push(pick),
            None => families.push((name, vec![pick])),
        }
    }
    let range = |v: Vec<f64>, show: &dyn Fn(f64) -> String| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        if (hi - lo).abs() < 1e-12 {
            show(lo)
        } else {
            format!("{} to {}", show(lo), show(hi))
        }
    };
    families
        .into_iter()
        .map(|(family, picks)| {
            let names: Vec<&str> = picks.iter().map(|p| p.workload.as_str()).collect();
            let same = picks.iter().all(|p| p.conf == picks[0].conf);
            if same && picks[0].conf == "PyTorch's defaults" {
                return format!("**{family}** ({}): keep PyTorch's defaults: no config tried reserves less.", names.join(", "));
            }
            if !same {
                let each: Vec<String> = picks.iter().map(|p| format!("{}: {} ({:.1} % lower)", p.workload, p.conf, p.percent)).collect();
                return format!("**{family}**: no one setting for all; the most memory saved by {}.", each.join("; "));
            }
            let time = if picks.iter().all(|p| p.extra_ms.is_some()) {
                format!(
                    ", {} of modelled allocator time",
                    range(picks.iter().filter_map(|p| p.extra_ms).collect(), &|v| format!(
                        "{}{}/step",
                        if v >= 0.0 { "+" } else { "−" },
                        crate::units::format_duration(v.abs() / 1e3)
                    ))
                )
            } else {
                String::new()
            };
            format!(
                "**{family}** ({}): set {}: peak reserved {} lower ({} less) at {}× the cudaMallocs{time}.",
                names.join(", "),
                picks[0].conf,
                range(picks.iter().map(|p| p.percent).collect(), &|v| format!("{v:.1} %")),
                range(picks.iter().map(|p| p.saved).collect(), &|v| format_bytes(v as u64)),
                range(picks.iter().map(|p| p.mallocs).collect(), &|v| format!("{v:.2}")),
            )
        })
        .collect()
}

/// One table per workload: a row per config, relative columns against PyTorch's defaults.
fn table(rows_by_workload: &[(String, Vec<GpuRow>)]) -> String {
    let mut s = String::new();
    for (workload, rows) in rows_by_workload {
        let first = rows[0].first();
        // The workload's peak live bytes: a run stopped by an OOM counts only up to it, so the
        // most any run saw (one that ran the whole workload saw it all).
        let peak_live = rows.iter().map(|r| r.first().work.peak_live_bytes).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "#### {workload}\n\n{} on {}, peak live {}.\n\n| allocator / conf | runs | peak reserved | vs defaults | reserved / live | fragmentation at peak | device mallocs | vs defaults | retries | OOM |\n|---|---|---|---|---|---|---|---|---|---|",
            first.device,
            format_bytes(first.capacity),
            format_bytes(peak_live)
        );
        let base = rows.iter().find(|r| r.is_default());
        for row in rows {
            let r = row.first();
            let oom = match (&r.oom, row.ooms()) {
                (_, 0) => "none".to_string(),
                (Some(o), n) => format!(
                    "step {} ({}; {} requested){}",
                    o.step,
                    o.cause,
                    format_bytes(o.requested),
                    if row.runs.len() > 1 { format!(", {n} of {} runs", row.runs.len()) } else { String::new() }
                ),
                (None, n) => format!("{n} of {} runs", row.runs.len()),
            };
            let (vs_reserved, vs_mallocs) = match base {
                Some(b) if !row.is_default() => (
                    percent_change(row.peak_reserved.mean, b.peak_reserved.mean),
                    if b.device_mallocs.mean > 0.0 { format!("{:.2}×", row.device_mallocs.mean / b.device_mallocs.mean) } else { "n/a".into() },
                ),
                Some(_) => ("baseline".into(), "baseline".into()),
                None => ("n/a".into(), "n/a".into()),
            };
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {vs_reserved} | {} | {} | {} | {vs_mallocs} | {} | {oom} |",
                r.label(),
                row.runs.len(),
                bytes_spread(&row.peak_reserved),
                row.overhead.show(|v| format!("{v:.3}")),
                row.fragmentation.show(|v| format!("{:.1} %", 100.0 * v)),
                row.device_mallocs.show(|v| format!("{v:.0}")),
                r.stats.get("num_alloc_retries").copied().unwrap_or(0),
            );
        }
        s.push('\n');
    }
    s
}

/// The GPU section, from every `gpu_replay` record.
pub fn section(records: &[ResultRecord], out: &Path) -> anyhow::Result<Option<Section>> {
    let runs: Vec<&GpuRunResult> = records.iter().filter_map(|r| if let ResultRecord::GpuReplay(g) = r { Some(g.as_ref()) } else { None }).collect();
    if runs.is_empty() {
        return Ok(None);
    }
    let on_gpu = runs.iter().any(|r| r.backend != Backend::Sim);
    let mut sec = Section::new(if on_gpu { "GPU allocator policies on a real GPU (`--device cuda`)" } else { "GPU allocator policies on a simulated device" });
    let by_workload = rows_by_workload(&runs);
    for (w, rows) in &by_workload {
        sec.findings.extend(findings(w, rows));
    }
    sec.decisions = decisions(&by_workload);
    if !on_gpu && runs.len() == by_workload.iter().map(|(_, rows)| rows.len()).sum::<usize>() {
        sec.body += "Replays on the simulated device are deterministic: one run per config (a repetition gives the same bytes and calls).\n\n";
    }
    sec.body += &table(&by_workload);
    sec.body += "\nInteractive memory views (timeline and segment map at the peak or the OOM, hover for blocks):\n\n";
    for case in runs_by_case(&runs) {
        let input = Source::find_recorded(&case.runs[0].workload);
        let file = memory_view::write_for_runs(out, &case.label, &case.slug, &case.runs, input.as_ref())?;
        let _ = writeln!(sec.body, "- [{}]({file})", case.label);
    }
    sec.charts = charts_for(out, &runs)?;
    sec.key_chart = (!sec.charts.is_empty()).then_some(0);
    Ok(Some(sec))
}

fn charts_for(out: &Path, runs: &[&GpuRunResult]) -> anyhow::Result<Vec<Chart>> {
    let mut charts = Vec::new();
    for Case { label: workload, slug: ws, runs: group } in runs_by_case(runs) {
        // One run per config in the line and segment charts: repetitions replay the same
        // deterministic policy on the simulated device.
        let group: Vec<&GpuRunResult> = fold(group, |r| (r.allocator, r.conf.clone())).into_iter().map(|(_, reps)| reps[0]).collect();
        // Memory over time: reserved per config, and what is allocated.
        let use_steps = group[0].work.steps >= 10;
        let x = |p: &TimelinePoint| if use_steps { p.step as f64 } else { p.event as f64 };
        let mut lines = Vec::new();
        let mut markers = Vec::new();
        for r in &group {
            let label = r.label();
            lines.push(Line {
                label: format!("reserved: {label}"),
                color_key: label.clone(),
                points: r.timeline.iter().map(|p| (x(p), p.reserved_max as f64)).collect(),
                dashed: false,
            });
            if let Some(o) = &r.oom {
                let at_x = if use_steps { o.step as f64 } else { o.event as f64 };
                markers.push(Marker { label: format!("OOM ({}) at step {}: {}", style::clip(&label, 24), o.step, o.cause), at: (at_x, o.reserved as f64) });
            }
        }
        // Allocated bytes are the same for every policy until one stops at an OOM: take the run
        // that went furthest.
        if let Some(first) =
            group.iter().find(|r| r.allocator == GpuPolicy::Ideal).or_else(|| group.iter().max_by_key(|r| (r.work.events, std::cmp::Reverse(r.oom.is_some()))))
        {
            lines.push(Line {
                label: "allocated (live tensors)".into(),
                color_key: "allocated".into(),
                points: first.timeline.iter().map(|p| (x(p), p.allocated_max as f64)).collect(),
                dashed: true,
            });
        }
        let title = format!("{workload}: reserved vs allocated (peak within each step)");
        let svg = charts::lines(&title, if use_steps { "step" } else { "event" }, "memory", true, &lines, &markers, charts::LegendAt::UpperLeft);
        charts.push(write_chart(out, format!("gpu-memory-{ws}.svg"), title, svg)?);

        // Device calls per config (log scale: no-cache makes one per tensor).
        let groups: Vec<BarGroup> = group
            .iter()
            .map(|r| BarGroup {
                category: gpu_short_label(r),
                bars: vec![
                    ("cudaMalloc / map calls".into(), "device malloc".into(), r.summary.device_mallocs as f64, None),
                    ("cudaFree / unmap calls".into(), "device free".into(), r.summary.device_frees as f64, None),
                ],
            })
            .collect();
        let title = format!("{workload}: device allocation calls");
        let svg = charts::bars(&groups, &BarOptions { title: &title, y_desc: "calls (log scale)", log: true, y_is_bytes: false, reference: None });
        charts.push(write_chart(out, format!("gpu-device-calls-{ws}.svg"), title, svg)?);

        // Segment map at peak (or at the OOM) for each caching-allocator config.
        for r in group.iter().filter(|r| r.allocator == GpuPolicy::Pytorch && !r.segments_at_peak.is_empty()) {
            let label = r.label();
            const ROWS: usize = 40;
            let (at, source) = if r.segments_at_oom.is_empty() { ("peak", &r.segments_at_peak) } else { ("the OOM", &r.segments_at_oom) };
            let mut segs: Vec<&SegmentSnapshot> = source.iter().collect();
            let total = segs.len();
            // Segments whose free space is pinned by a live block first (the fragmentation), then
            // wholly free cached segments; most free bytes first within each.
            segs.sort_by_key(|s| (s.allocated() == 0, std::cmp::Reverse(s.total_size - s.allocated()), s.address));
            segs.truncate(ROWS);
            let rows: Vec<SegmentRow> = segs
                .iter()
                .map(|s| SegmentRow {
                    label: format!("{} {} ({} free)", s.segment_type, format_bytes(s.total_size), format_bytes(s.total_size - s.allocated())),
                    blocks: s.blocks.iter().map(|b| (b.size, b.is_allocated())).collect(),
                })
                .collect();
            let pinned = source.iter().filter(|s| s.allocated() > 0).count();
            let title = format!("{workload}: segments at {at}, {} ({} of {total} shown; {pinned} hold live blocks)", gpu_short_label(r), rows.len());
            let mut chart = write_chart(out, format!("gpu-segments-{ws}-{}.svg", slug(&label)), title.clone(), charts::segment_map(&title, &label, &rows))?;
            chart.folded = true;
            charts.push(chart);
        }
    }
    // Overhead: peak reserved ÷ peak live per workload × config, with the spread over repetitions.
    let groups: Vec<BarGroup> = rows_by_workload(runs)
        .into_iter()
        .map(|(w, rows)| BarGroup {
            category: w,
            bars: rows
                .iter()
                .map(|row| (gpu_short_label(row.first()), row.first().label(), row.overhead.mean, row.overhead.ci95.map(|_| row.overhead.bounds())))
                .collect(),
        })
        .collect();
    let title = "Peak reserved / peak live bytes (1.0 = ideal)".to_string();
    // One tiny workload (a segment for a few bytes) can be thousands of times over: a log axis
    // then, so the others' bars stay readable.
    let ratios = || groups.iter().flat_map(|g| g.bars.iter().map(|b| b.2)).filter(|v| *v > 0.0);
    let log = ratios().fold(0f64, f64::max) > 20.0 * ratios().fold(f64::MAX, f64::min);
    let svg = charts::bars(
        &groups,
        &BarOptions {
            title: &title,
            y_desc: if log { "peak reserved / peak live (log scale)" } else { "peak reserved / peak live" },
            log,
            y_is_bytes: false,
            reference: Some((1.0, "ideal = 1.0")),
        },
    );
    charts.push(write_chart(out, "gpu-overhead.svg".into(), title, svg)?);
    Ok(charts)
}
