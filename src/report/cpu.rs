//! The CPU section (`cpu_run` records): per workload, the fastest allocator and the one that
//! retains least at the end of the drain, with their spread; one row per allocator (repetitions folded,
//! mean ± 95 % CI, relative to glibc); the charts.

use std::fmt::Write as _;
use std::path::Path;

use super::charts::{self, BarGroup, BarOptions, Line};
use super::spread::{fold, Spread};
use super::style::slug;
use super::{percent_change, write_chart, Chart, Section};
use crate::results::{CpuRunResult, ResultRecord};
use crate::units::format_bytes_signed;

/// Repetitions of one allocator on one workload (same mode, threads, cross-thread frees and
/// scale: a preloaded jemalloc is not the compiled-in one).
pub struct CpuRow<'a> {
    pub runs: Vec<&'a CpuRunResult>,
    pub ops_per_s: Spread,
    pub peak_rss: Spread,
    pub retained: Spread,
    pub drift: Spread,
    pub alloc_p99: Spread,
}

impl<'a> CpuRow<'a> {
    fn new(runs: Vec<&'a CpuRunResult>) -> Self {
        let s = |f: &dyn Fn(&CpuRunResult) -> f64| Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        CpuRow {
            ops_per_s: s(&|r| r.ops_per_s),
            peak_rss: s(&|r| r.peak_rss as f64),
            retained: s(&|r| r.retained_at_drain_end() as f64),
            // The drift of RSS net of live bytes (the allocator's own), else the raw RSS slope.
            drift: s(&|r| r.drift_overhead_mib_per_1k.or(r.drift_mib_per_1k_iterations).unwrap_or(0.0)),
            alloc_p99: s(&|r| r.alloc_ns.p99 as f64),
            runs,
        }
    }
    fn allocator(&self) -> String {
        self.runs[0].label()
    }
    /// The relative columns' baseline: glibc (`system` when nothing was preloaded).
    fn is_baseline(&self) -> bool {
        matches!(self.runs[0].allocator.as_str(), "glibc" | "system") && self.runs[0].settings.is_empty()
    }
}

/// One workload's rows (one per allocator and thread setup), repetitions folded.
pub fn rows_by_workload<'a>(runs: &[&'a CpuRunResult]) -> Vec<(String, Vec<CpuRow<'a>>)> {
    // Two workloads of one name (an edited copy) are told apart by their contents.
    let groups = fold(runs.iter().copied(), |r| (r.workload.name.clone(), r.workload.sha256.clone()));
    let label = |name: &str, sha: &str| {
        if groups.iter().filter(|((n, _), _)| n == name).count() > 1 {
            format!("{name} (sha256 {})", &sha[..sha.len().min(12)])
        } else {
            name.to_string()
        }
    };
    groups
        .iter()
        .map(|((name, sha), group)| {
            let rows = fold(group.iter().copied(), |r| (r.label(), r.mode, r.threads, r.cross_thread, r.touch, r.scale.to_bits()))
                .into_iter()
                .map(|(_, reps)| CpuRow::new(reps))
                .collect();
            (label(name, sha), rows)
        })
        .collect()
}

fn mops(s: &Spread) -> String {
    s.show(|v| format!("{:.2}", v / 1e6))
}

fn bytes(s: &Spread) -> String {
    match s.ci95 {
        Some(h) => format!("{} ± {}", format_bytes_signed(s.mean as i128), crate::units::format_bytes(h as u64)),
        None => format_bytes_signed(s.mean as i128),
    }
}

fn runs_note(s: &Spread) -> String {
    if s.n > 1 {
        format!("95 % CI over {} runs", s.n)
    } else {
        "one run, no spread".into()
    }
}

/// The findings of one workload: the fastest allocator and the one that retains least at the end
/// of the drain, each against glibc and the runner-up, with the spread.
pub fn findings(workload: &str, rows: &[CpuRow]) -> Vec<String> {
    let mut out = Vec::new();
    let base = rows.iter().find(|r| r.is_baseline());
    let mut by_speed: Vec<&CpuRow> = rows.iter().collect();
    by_speed.sort_by(|a, b| b.ops_per_s.mean.total_cmp(&a.ops_per_s.mean));
    if let Some(best) = by_speed.first() {
        let mut s = format!("{workload}: {} is fastest, {} M ops/s ({})", best.allocator(), mops(&best.ops_per_s), runs_note(&best.ops_per_s));
        if let Some(b) = base.filter(|_| !best.is_baseline()) {
            let _ = write!(s, ", {:.2}× glibc ({} M ops/s)", best.ops_per_s.mean / b.ops_per_s.mean, mops(&b.ops_per_s));
        }
        if let Some(second) = by_speed.get(1) {
            let _ = write!(
                s,
                "; {} next at {} M ops/s{}",
                second.allocator(),
                mops(&second.ops_per_s),
                if best.ops_per_s.overlaps(&second.ops_per_s) { ", within the spread (the difference is not shown by these runs)" } else { "" }
            );
        }
        out.push(s + ".");
    }
    let mut by_retained: Vec<&CpuRow> = rows.iter().collect();
    by_retained.sort_by(|a, b| a.retained.mean.total_cmp(&b.retained.mean));
    if let Some(least) = by_retained.first() {
        let mut s =
            format!("{workload}: {} retains least at the end of the drain, {} ({})", least.allocator(), bytes(&least.retained), runs_note(&least.retained));
        if let Some(b) = base.filter(|_| !least.is_baseline()) {
            let _ = write!(s, ", against {} for glibc", bytes(&b.retained));
        }
        if let Some(worst) = by_retained.last().filter(|w| w.allocator() != least.allocator()) {
            let _ = write!(s, "; {} retains most, {}", worst.allocator(), bytes(&worst.retained));
        }
        out.push(s + ".");
    }
    out
}

/// One table per workload: a row per allocator, relative columns against glibc.
fn table(by_workload: &[(String, Vec<CpuRow>)]) -> String {
    let mut s = String::new();
    for (workload, rows) in by_workload {
        let _ = writeln!(
            s,
            "#### {workload}\n\n| allocator | served by | threads | scale | runs | M ops/s | vs glibc | malloc p50 / p99 ns | free p50 / p99 ns | peak RSS | vs glibc | drift of RSS − live, MiB/1k it | retained at the drain's end | retained after trim |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let base = rows.iter().find(|r| r.is_baseline());
        for row in rows {
            let r = row.runs[0];
            // Latency over the runs that sampled any operation (a very short run samples none).
            let latency = |f: &dyn Fn(&CpuRunResult) -> &crate::results::Latency| {
                let sampled: Vec<&crate::results::Latency> = row.runs.iter().map(|r| f(r)).filter(|l| l.count > 0).collect();
                if sampled.is_empty() {
                    return "n/a".to_string();
                }
                let avg = |g: &dyn Fn(&crate::results::Latency) -> u64| (sampled.iter().map(|l| g(l) as f64).sum::<f64>() / sampled.len() as f64).round();
                format!("{} / {}", avg(&|l| l.p50), avg(&|l| l.p99))
            };
            let rel = |v: f64, b: f64| -> String {
                if row.is_baseline() {
                    "baseline".into()
                } else if base.is_some() {
                    percent_change(v, b)
                } else {
                    "n/a".into()
                }
            };
            let trims: Vec<f64> = row.runs.iter().filter_map(|r| r.retained_after_trim.map(|t| t as f64)).collect();
            let _ = writeln!(
                s,
                "| {} | `{}` ({}) | {}{}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.label(),
                r.live_malloc.library,
                r.mode,
                r.threads,
                if r.cross_thread { " cross" } else { "" },
                if r.touch { "" } else { " no-touch" },
                r.scale,
                row.runs.len(),
                mops(&row.ops_per_s),
                rel(row.ops_per_s.mean, base.map(|b| b.ops_per_s.mean).unwrap_or(0.0)),
                latency(&|r| &r.alloc_ns),
                latency(&|r| &r.free_ns),
                bytes(&row.peak_rss),
                rel(row.peak_rss.mean, base.map(|b| b.peak_rss.mean).unwrap_or(0.0)),
                if row.runs.iter().any(|r| r.drift_overhead_mib_per_1k.or(r.drift_mib_per_1k_iterations).is_some()) {
                    row.drift.show(|v| format!("{v:+.2}"))
                } else {
                    "n/a".into()
                },
                bytes(&row.retained),
                if trims.len() == row.runs.len() { bytes(&Spread::of(&trims)) } else { "n/a".into() },
            );
        }
        s.push('\n');
    }
    s
}

/// The CPU section, from every `cpu_run` record.
pub fn section(records: &[ResultRecord], out: &Path) -> anyhow::Result<Option<Section>> {
    let all: Vec<&CpuRunResult> = records.iter().filter_map(|r| if let ResultRecord::CpuRun(c) = r { Some(c.as_ref()) } else { None }).collect();
    if all.is_empty() {
        return Ok(None);
    }
    // A run stopped by Ctrl-C covers only part of the workload: not a repetition of the others.
    let kept: Vec<&CpuRunResult> = all.iter().copied().filter(|r| !r.interrupted).collect();
    // Recorded programs replayed at their pace are compared by the memory they hold over time.
    let (paced, runs): (Vec<&CpuRunResult>, Vec<&CpuRunResult>) = kept.iter().copied().partition(|r| r.paced);
    let mut sec = Section::new("CPU allocators");
    let by_workload = rows_by_workload(&runs);
    for (w, rows) in &by_workload {
        sec.findings.extend(findings(w, rows));
    }
    let left_out = all.len() - kept.len();
    sec.body = if left_out > 0 { format!("{left_out} interrupted run(s) left out.\n\n") } else { String::new() } + &table(&by_workload);
    sec.charts = charts_for(out, &by_workload)?;
    // A recording is named by its file (`redis-server.abt.gz`: redis-server), not by the program
    // it ran (`run_benchmark.py` says little).
    let recorded: Vec<(String, Vec<CpuRow>)> =
        rows_by_workload(&paced).into_iter().map(|(w, rows)| (rows.first().map_or(w.clone(), |r| recording_name(r.runs[0], &w)), rows)).collect();
    if !recorded.is_empty() {
        sec.body += &recorded_tables(&recorded, &mut sec.findings);
        sec.charts.extend(recorded_charts(out, &recorded)?);
    }
    Ok(Some(sec))
}

/// The file name of a recorded trace without `.gz` and `.abt`; `fallback` for any other input.
fn recording_name(r: &CpuRunResult, fallback: &str) -> String {
    let file = Path::new(&r.workload.origin).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = file.strip_suffix(".gz").unwrap_or(&file);
    match stem.strip_suffix(".abt") {
        Some(s) if r.workload.kind == "recorded" && !s.is_empty() => s.to_string(),
        _ => fallback.to_string(),
    }
}

/// Recorded programs replayed at their recorded pace (`cpu TRACE --pace recorded`, as
/// `scripts/compare.sh` runs them with every allocator and the usual settings): per program, a row
/// per allocator × settings with steady RSS, peak, retained and CPU time over the repetitions
/// (mean ± 95 % CI, min–max), and as the finding what `cpu advise` recommends from the same runs.
fn recorded_tables(by_workload: &[(String, Vec<CpuRow>)], findings: &mut Vec<String>) -> String {
    use crate::cpu::advise::{rank, Measured};
    let mut s = String::from(
        "### Recorded programs, replayed at their recorded pace\n\nEach program was recorded once (`allocbench cpu --record`) and replayed under every allocator and the usual settings, each run in its own process, repetitions interleaved. Steady RSS is the time-weighted mean RSS above the replay's start while it ran; CPU time is user + system of the replay (idle time between paced calls not counted).\n\n",
    );
    for (workload, all_rows) in by_workload {
        // Runs with different thread counts (`--threads N` copies) are ranked apart.
        let mut counts: Vec<usize> = all_rows.iter().map(|r| r.runs[0].threads).collect();
        counts.sort_unstable();
        counts.dedup();
        for &threads in &counts {
            let rows: Vec<&CpuRow> = all_rows.iter().filter(|r| r.runs[0].threads == threads).collect();
            let workload = if counts.len() > 1 { format!("{workload}, {threads} replay threads") } else { workload.clone() };
            let measured: Vec<Measured> = rows.iter().flat_map(|r| r.runs.iter().map(|x| Measured::of_replay(x))).collect();
            let advice = rank(&measured, "balanced", &workload);
            let calls = rows.first().map_or(0, |r| r.runs[0].work.events);
            findings.push(format!("{workload} (recorded, {calls} calls, replayed at its pace): {}; `{}`.", advice.reason, advice.line));
            let _ = writeln!(s, "#### {workload} (recorded)\n\n| allocator and settings | runs | steady RSS | peak RSS | retained at the drain's end | CPU s | CPU vs glibc (medians) | |\n|---|---|---|---|---|---|---|---|");
            for c in &advice.candidates {
                let reps: Vec<&Measured> = measured.iter().filter(|m| m.label == c.label).collect();
                let spread = |f: &dyn Fn(&Measured) -> f64| Spread::of(&reps.iter().map(|m| f(m)).collect::<Vec<_>>());
                let b = |v: f64| crate::units::format_bytes(v.max(0.0) as u64);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {} | {:+.1} % | {} |",
                    c.label,
                    c.runs,
                    spread(&|m| m.steady).show_range(&b),
                    spread(&|m| m.peak).show_range(&b),
                    spread(&|m| m.retained.unwrap_or(0.0)).show_range(&|v| format_bytes_signed(v as i128)),
                    spread(&|m| m.cpu_s).show_range(&|v| format!("{v:.3}")),
                    c.time_cost * 100.0,
                    if c.label == advice.candidates[0].label {
                        "recommended (balanced)".to_string()
                    } else {
                        c.dominated_by.as_deref().map(|d| format!("beaten on every column by {d}")).unwrap_or_default()
                    }
                );
            }
            s.push('\n');
        }
    }
    s
}

/// Per recorded program: RSS over time (every repetition) and the steady RSS and CPU time bars.
fn recorded_charts(out: &Path, by_workload: &[(String, Vec<CpuRow>)]) -> anyhow::Result<Vec<Chart>> {
    use crate::cpu::advise::Measured;
    let mut charts = Vec::new();
    for (workload, rows) in by_workload {
        let ws = slug(workload);
        let title = format!("{workload} (recorded, at its pace): RSS over time");
        let svg = charts::lines(&title, "time (s)", "RSS", true, &rss_lines(rows), &[], charts::LegendAt::UpperRight);
        charts.push(write_chart(out, format!("cpu-recorded-rss-{ws}.svg"), title, svg)?);
        let of_runs = |f: fn(&Measured) -> f64| move |row: &CpuRow| Spread::of(&row.runs.iter().map(|r| f(&Measured::of_replay(r))).collect::<Vec<_>>());
        let (steady, cpu) = (spread_bars(rows, &of_runs(|m| m.steady), 1.0), spread_bars(rows, &of_runs(|m| m.cpu_s), 1.0));
        let title = format!("{workload} (recorded): steady RSS and CPU time (mean, 95 % CI)");
        let (t1, t2) = ("steady RSS above the replay's start".to_string(), "CPU time of the replay".to_string());
        let svg = charts::bars_pair(
            (&steady, &BarOptions { title: &t1, y_desc: "RSS", log: false, y_is_bytes: true, reference: None }),
            (&cpu, &BarOptions { title: &t2, y_desc: "s", log: false, y_is_bytes: false, reference: None }),
        );
        charts.push(write_chart(out, format!("cpu-recorded-steady-cpu-{ws}.svg"), title, svg)?);
    }
    Ok(charts)
}

/// A bar per row: the mean of `f`'s spread over its repetitions ÷ `scale`, whiskers its 95 % CI.
fn spread_bars(rows: &[CpuRow], f: &dyn Fn(&CpuRow) -> Spread, scale: f64) -> Vec<BarGroup> {
    rows.iter()
        .map(|row| {
            let s = f(row);
            let (lo, hi) = s.bounds();
            let name = row.allocator();
            BarGroup { category: name.clone(), bars: vec![(name.clone(), name, s.mean / scale, s.ci95.map(|_| (lo / scale, hi / scale)))] }
        })
        .collect()
}

/// RSS over time: every repetition, one colour (and one legend entry) per row, the first run solid.
fn rss_lines(rows: &[CpuRow]) -> Vec<Line> {
    let mut lines = Vec::new();
    for row in rows {
        let name = row.allocator();
        for (i, r) in row.runs.iter().enumerate() {
            lines.push(Line {
                label: if row.runs.len() > 1 { format!("{name} ({} runs, the first solid)", row.runs.len()) } else { name.to_string() },
                color_key: name.to_string(),
                points: r.rss_timeline.iter().map(|s| (s.t_s, s.rss as f64)).collect(),
                dashed: i > 0,
            });
        }
    }
    lines
}

fn charts_for(out: &Path, by_workload: &[(String, Vec<CpuRow>)]) -> anyhow::Result<Vec<Chart>> {
    let mut charts = Vec::new();
    for (workload, rows) in by_workload {
        let ws = slug(workload);
        let title = format!("{workload}: RSS over time");
        let svg = charts::lines(&title, "time (s)", "RSS", true, &rss_lines(rows), &[], charts::LegendAt::UpperRight);
        charts.push(write_chart(out, format!("cpu-rss-{ws}.svg"), title, svg)?);

        // Bars are the mean, whiskers the 95 % confidence interval.
        let bar = |f: &dyn Fn(&CpuRow) -> Spread, scale: f64| spread_bars(rows, f, scale);
        let thr = bar(&|r| r.ops_per_s, 1e6);
        let p99 = bar(&|r| r.alloc_p99, 1.0);
        let title = format!("{workload}: throughput and malloc p99 (mean, 95 % CI)");
        let (t1, t2) = (format!("{workload}: throughput (wall)"), "malloc latency p99".to_string());
        let svg = charts::bars_pair(
            (&thr, &BarOptions { title: &t1, y_desc: "M ops/s", log: false, y_is_bytes: false, reference: None }),
            (&p99, &BarOptions { title: &t2, y_desc: "ns", log: false, y_is_bytes: false, reference: None }),
        );
        charts.push(write_chart(out, format!("cpu-throughput-{ws}.svg"), title, svg)?);

        let drift = bar(&|r| r.drift, 1.0);
        let retained = bar(&|r| r.retained, 1.0);
        let title = format!("{workload}: RSS drift and retained memory (mean, 95 % CI)");
        let (t1, t2) = ("drift of RSS − live bytes (steady state)".to_string(), "retained at the end of the drain".to_string());
        let svg = charts::bars_pair(
            (&drift, &BarOptions { title: &t1, y_desc: "MiB per 1,000 iterations", log: false, y_is_bytes: false, reference: None }),
            (&retained, &BarOptions { title: &t2, y_desc: "retained", log: false, y_is_bytes: true, reference: None }),
        );
        charts.push(write_chart(out, format!("cpu-drift-retained-{ws}.svg"), title, svg)?);
    }
    Ok(charts)
}
