//! `allocbench report`: reads results files only and renders SVG charts plus an index
//! (`README.md` and `index.html`) into a folder. Output is deterministic for the same input.

pub mod charts;
pub mod front;
pub mod style;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use charts::{BarGroup, BarOptions, Line, Marker, SegmentRow};
use style::slug;

use crate::error::InputError;
use crate::results::CpuRunResult;
use crate::results::{read_results, GpuRunResult, ResultRecord};
use crate::units::format_bytes;

/// The label of a GPU run: allocator, plus the conf for the pytorch policy.
pub fn gpu_label(r: &GpuRunResult) -> String {
    if r.allocator == "pytorch" && !r.conf.is_empty() {
        format!("pytorch {}", r.conf)
    } else {
        r.allocator.clone()
    }
}

/// A short form of a GPU run's label for axes: the conf's keys abbreviated.
pub fn gpu_short_label(r: &GpuRunResult) -> String {
    if r.allocator != "pytorch" {
        return r.allocator.clone();
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

/// A chart written into the report.
pub struct Chart {
    pub file: String,
    pub title: String,
}

/// Loads every results file (errors name the file and line).
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Vec<ResultRecord>> {
    let mut all = Vec::new();
    for p in paths {
        all.extend(read_results(p)?);
    }
    if all.is_empty() {
        return Err(InputError::new("report", "no results records in the given files").into());
    }
    Ok(all)
}

/// Groups by workload name, keeping first-seen order.
fn by_workload<'a, T>(items: impl Iterator<Item = &'a T>, name: impl Fn(&T) -> &str) -> Vec<(String, Vec<&'a T>)>
where
    T: 'a,
{
    let mut out: Vec<(String, Vec<&T>)> = Vec::new();
    for it in items {
        let n = name(it).to_string();
        match out.iter_mut().find(|(k, _)| *k == n) {
            Some((_, v)) => v.push(it),
            None => out.push((n, vec![it])),
        }
    }
    out
}

fn write(out: &Path, file: &str, svg: String) -> anyhow::Result<()> {
    std::fs::write(out.join(file), svg).map_err(|e| InputError::new(out.join(file).display().to_string(), format!("cannot write: {e}")))?;
    Ok(())
}

fn gpu_charts(out: &Path, runs: &[&GpuRunResult], charts: &mut Vec<Chart>) -> anyhow::Result<()> {
    let e = |m: String| anyhow::anyhow!(m);
    for (workload, group) in by_workload(runs.iter().copied(), |r| &r.workload.name) {
        let ws = slug(&workload);
        // Memory over time: reserved per config, and what is allocated.
        let use_steps = group[0].work.steps >= 10;
        let x = |p: &crate::results::TimelinePoint| {
            if use_steps {
                p.step as f64
            } else {
                p.event as f64
            }
        };
        let mut lines = Vec::new();
        let mut markers = Vec::new();
        for r in &group {
            let label = gpu_label(r);
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
            group.iter().find(|r| r.allocator == "ideal").or_else(|| group.iter().max_by_key(|r| (r.work.events, std::cmp::Reverse(r.oom.is_some()))))
        {
            lines.push(Line {
                label: "allocated (live tensors)".into(),
                color_key: "allocated".into(),
                points: first.timeline.iter().map(|p| (x(p), p.allocated_max as f64)).collect(),
                dashed: true,
            });
        }
        let file = format!("gpu-memory-{ws}.svg");
        let title = format!("{workload}: reserved vs allocated (peak within each step)");
        write(
            out,
            &file,
            charts::lines(&title, if use_steps { "step" } else { "event" }, "memory", true, &lines, &markers, charts::LegendAt::UpperLeft).map_err(e)?,
        )?;
        charts.push(Chart { file, title });

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
        let file = format!("gpu-device-calls-{ws}.svg");
        let title = format!("{workload}: device allocation calls");
        write(
            out,
            &file,
            charts::bars(&groups, &BarOptions { title: &title, y_desc: "calls (log scale)", log: true, y_is_bytes: false, reference: None }).map_err(e)?,
        )?;
        charts.push(Chart { file, title });

        // Segment map at peak for each caching-allocator config.
        for r in group.iter().filter(|r| r.allocator == "pytorch" && !r.segments_at_peak.is_empty()) {
            let label = gpu_label(r);
            const ROWS: usize = 40;
            // At an OOM, the map that failed; otherwise the peak.
            let (at, source) = if r.segments_at_oom.is_empty() { ("peak", &r.segments_at_peak) } else { ("the OOM", &r.segments_at_oom) };
            let mut segs: Vec<&crate::results::SegmentSnapshot> = source.iter().collect();
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
            let file = format!("gpu-segments-{ws}-{}.svg", slug(&label));
            let pinned = source.iter().filter(|s| s.allocated() > 0).count();
            let title = format!("{workload}: segments at {at}, {} ({} of {total} shown; {pinned} hold live blocks)", gpu_short_label(r), rows.len());
            write(out, &file, charts::segment_map(&title, &label, &rows).map_err(e)?)?;
            charts.push(Chart { file, title });
        }
    }
    // Overhead: peak reserved ÷ peak live per workload × config.
    let groups: Vec<BarGroup> = by_workload(runs.iter().copied(), |r| &r.workload.name)
        .into_iter()
        .map(|(w, rs)| BarGroup { category: w, bars: rs.iter().map(|r| (gpu_short_label(r), gpu_label(r), r.summary.overhead, None)).collect() })
        .collect();
    let title = "Peak reserved / peak live bytes (1.0 = ideal)".to_string();
    write(
        out,
        "gpu-overhead.svg",
        charts::bars(
            &groups,
            &BarOptions { title: &title, y_desc: "peak reserved / peak live", log: false, y_is_bytes: false, reference: Some((1.0, "ideal = 1.0")) },
        )
        .map_err(e)?,
    )?;
    charts.push(Chart { file: "gpu-overhead.svg".into(), title });
    Ok(())
}

/// Mean and (min, max) over repetitions.
fn stats(v: &[f64]) -> (f64, Option<(f64, f64)>) {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let lo = v.iter().copied().fold(f64::MAX, f64::min);
    let hi = v.iter().copied().fold(f64::MIN, f64::max);
    (mean, (v.len() > 1).then_some((lo, hi)))
}

fn by_allocator<'a>(runs: &[&'a CpuRunResult]) -> Vec<(String, Vec<&'a CpuRunResult>)> {
    by_workload(runs.iter().copied(), |r| &r.allocator)
}

fn cpu_charts(out: &Path, runs: &[&CpuRunResult], charts: &mut Vec<Chart>) -> anyhow::Result<()> {
    let e = |m: String| anyhow::anyhow!(m);
    for (workload, group) in by_workload(runs.iter().copied(), |r| &r.workload.name) {
        let ws = slug(&workload);
        let allocs = by_allocator(&group);
        // RSS over time: every repetition, one colour per allocator.
        let mut lines = Vec::new();
        for (name, reps) in &allocs {
            for (i, r) in reps.iter().enumerate() {
                lines.push(Line {
                    label: if reps.len() > 1 { format!("{name} (run {})", i + 1) } else { name.clone() },
                    color_key: name.clone(),
                    points: r.rss_timeline.iter().map(|s| (s.t_s, s.rss as f64)).collect(),
                    dashed: i > 0,
                });
            }
        }
        let file = format!("cpu-rss-{ws}.svg");
        let title = format!("{workload}: RSS over time");
        write(out, &file, charts::lines(&title, "time (s)", "RSS", true, &lines, &[], charts::LegendAt::UpperRight).map_err(e)?)?;
        charts.push(Chart { file, title });

        let bar = |f: &dyn Fn(&CpuRunResult) -> f64| -> Vec<BarGroup> {
            allocs
                .iter()
                .map(|(name, reps)| {
                    let (m, w) = stats(&reps.iter().map(|r| f(r)).collect::<Vec<_>>());
                    BarGroup { category: name.clone(), bars: vec![(name.clone(), name.clone(), m, w)] }
                })
                .collect()
        };
        let thr = bar(&|r| r.ops_per_s / 1e6);
        let p99 = bar(&|r| r.alloc_ns.p99 as f64);
        let file = format!("cpu-throughput-{ws}.svg");
        let title = format!("{workload}: throughput and malloc p99");
        let t1 = format!("{workload}: throughput (wall)");
        let t2 = "malloc latency p99".to_string();
        write(
            out,
            &file,
            charts::bars_pair(
                (&thr, &BarOptions { title: &t1, y_desc: "M ops/s", log: false, y_is_bytes: false, reference: None }),
                (&p99, &BarOptions { title: &t2, y_desc: "ns", log: false, y_is_bytes: false, reference: None }),
            )
            .map_err(e)?,
        )?;
        charts.push(Chart { file, title });

        let drift = bar(&|r| r.drift_mib_per_1k_iterations.unwrap_or(0.0));
        let retained = bar(&|r| r.retained as f64);
        let file = format!("cpu-drift-retained-{ws}.svg");
        let title = format!("{workload}: RSS drift and retained memory");
        let t1 = "RSS drift (steady state)".to_string();
        let t2 = "retained after everything is freed".to_string();
        write(
            out,
            &file,
            charts::bars_pair(
                (&drift, &BarOptions { title: &t1, y_desc: "MiB per 1,000 iterations", log: false, y_is_bytes: false, reference: None }),
                (&retained, &BarOptions { title: &t2, y_desc: "retained", log: false, y_is_bytes: true, reference: None }),
            )
            .map_err(e)?,
        )?;
        charts.push(Chart { file, title });
    }
    Ok(())
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's algorithm).
fn civil_date(unix: u64) -> String {
    let z = (unix / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

fn devprobe_charts(out: &Path, probes: &[&crate::results::DevprobeResult], charts: &mut Vec<Chart>) -> anyhow::Result<()> {
    for (i, p) in probes.iter().enumerate() {
        // Log-log: sizes span 512 B to 8 GiB, latencies 1 µs to milliseconds.
        let line = |label: &str, key: &str, v: &[crate::results::SizeLatency]| Line {
            label: label.to_string(),
            color_key: key.to_string(),
            points: v.iter().map(|s| ((s.bytes as f64).log2(), (s.p50_ns.max(1) as f64 / 1e3).log10())).collect(),
            dashed: false,
        };
        let lines = vec![
            line("cuMemAlloc (cudaMalloc) p50", "nocache", &p.malloc),
            line("cuMemFree (cudaFree) p50", "pytorch", &p.free),
            line("cuMemAllocAsync + cuMemFreeAsync, warm pool, p50", "async", &p.async_pool_alloc_free),
        ];
        let file = if probes.len() == 1 { "devprobe.svg".to_string() } else { format!("devprobe-{i}.svg") };
        let title = format!("Device allocation latency by size: {}", p.device);
        let svg = charts::lines(
            &title,
            "allocation size (log2 bytes: 10 = 1 KiB, 20 = 1 MiB, 30 = 1 GiB)",
            "log10 latency (µs)",
            false,
            &lines,
            &[],
            charts::LegendAt::UpperLeft,
        )
        .map_err(|m| anyhow::anyhow!(m))?;
        write(out, &file, svg)?;
        charts.push(Chart { file, title });
    }
    Ok(())
}

/// Renders the report for `records` into `out`; returns the charts written.
pub fn render(records: &[ResultRecord], out: &Path, title: &str) -> anyhow::Result<Vec<Chart>> {
    std::fs::create_dir_all(out).map_err(|e| InputError::new(out.display().to_string(), format!("cannot create the report folder: {e}")))?;
    let gpu: Vec<&GpuRunResult> = records.iter().filter_map(|r| if let ResultRecord::GpuReplay(g) = r { Some(g.as_ref()) } else { None }).collect();
    let cpu: Vec<&CpuRunResult> = records.iter().filter_map(|r| if let ResultRecord::CpuRun(c) = r { Some(c.as_ref()) } else { None }).collect();
    let mut charts = Vec::new();
    if !gpu.is_empty() {
        gpu_charts(out, &gpu, &mut charts)?;
    }
    if !cpu.is_empty() {
        cpu_charts(out, &cpu, &mut charts)?;
    }
    let probes: Vec<&crate::results::DevprobeResult> =
        records.iter().filter_map(|r| if let ResultRecord::Devprobe(p) = r { Some(p.as_ref()) } else { None }).collect();
    devprobe_charts(out, &probes, &mut charts)?;
    let searches: Vec<_> = records.iter().filter_map(|r| if let ResultRecord::Advise(a) = r { Some(a.as_ref()) } else { None }).collect();
    front::charts(out, &searches, &mut charts)?;
    let mut md = index_markdown(title, &gpu, &cpu, &probes, &charts);
    for r in records {
        if let ResultRecord::Diagnose(d) = r {
            let _ = writeln!(
                md,
                "\n## Diagnosis: {} on {} [{}]\n",
                d.workload.name,
                format_bytes(d.capacity),
                if d.conf.is_empty() { "default conf" } else { &d.conf }
            );
            for line in &d.summary {
                let _ = writeln!(md, "- {line}");
            }
        }
    }
    std::fs::write(out.join("README.md"), &md)?;
    std::fs::write(out.join("index.html"), index_html(title, &md, &charts))?;
    Ok(charts)
}

fn index_markdown(title: &str, gpu: &[&GpuRunResult], cpu: &[&CpuRunResult], probes: &[&crate::results::DevprobeResult], charts: &[Chart]) -> String {
    let mut s = format!("# {title}\n\n");
    let machines: Vec<&crate::results::MachineInfo> =
        gpu.iter().map(|r| &r.machine).chain(cpu.iter().map(|r| &r.machine)).chain(probes.iter().map(|p| &p.machine)).collect();
    if let Some(m) = machines.iter().max_by_key(|m| m.unix_time) {
        let _ = writeln!(
            s,
            "Generated by allocbench {} (git {}, {}) from its results files.\n",
            m.allocbench_version,
            if m.git_rev.is_empty() { "unknown" } else { &m.git_rev },
            m.rustc
        );
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(s, "| date of the runs | {} (UTC) |", civil_date(m.unix_time));
        let _ = writeln!(s, "| machine | {} ({} cores, {} RAM), Linux {} |", m.cpu, m.cores, format_bytes(m.memory_bytes), m.kernel);
        // LD_PRELOAD differs per run and is shown per row ("served by"); the other knobs here.
        let envs: BTreeMap<&String, &String> = machines.iter().flat_map(|m| m.env.iter()).filter(|(k, _)| k.as_str() != "LD_PRELOAD").collect();
        if !envs.is_empty() {
            let _ = writeln!(s, "| allocator environment | {} |", envs.iter().map(|(k, v)| format!("`{k}={v}`")).collect::<Vec<_>>().join(", "));
        }
        s.push('\n');
    }
    let mut workloads: BTreeMap<&str, (&str, &str, &str)> = BTreeMap::new();
    for w in gpu.iter().map(|r| &r.workload).chain(cpu.iter().map(|r| &r.workload)) {
        workloads.insert(&w.name, (&w.kind, &w.description, &w.sha256));
    }
    let _ = writeln!(s, "## Workloads\n\n| workload | kind | description | sha256 |\n|---|---|---|---|");
    for (name, (kind, desc, sha)) in &workloads {
        let _ = writeln!(s, "| {name} | {kind} | {desc} | `{}` |", &sha[..sha.len().min(12)]);
    }
    if !gpu.is_empty() {
        let on_gpu = gpu.iter().any(|r| r.backend != crate::results::Backend::Sim);
        let _ = writeln!(s, "\n## GPU allocator policies {}\n", if on_gpu { "on a real GPU (`--device cuda`)" } else { "on a simulated device" });
        let _ = writeln!(
            s,
            "| workload | allocator / conf | capacity | peak live | peak reserved | reserved / live | fragmentation at peak | device mallocs | retries | OOM |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in gpu {
            let oom = match &r.oom {
                Some(o) => format!("step {} ({}; {} requested)", o.step, o.cause, format_bytes(o.requested)),
                None => "none".into(),
            };
            let _ = writeln!(
                s,
                "| {} | `{}` | {} | {} | {} | {:.3} | {:.1} % | {} | {} | {} |",
                r.workload.name,
                gpu_label(r),
                format_bytes(r.capacity),
                format_bytes(r.work.peak_live_bytes),
                format_bytes(r.summary.peak_reserved),
                r.summary.overhead,
                100.0 * r.summary.fragmentation_at_peak,
                r.summary.device_mallocs,
                r.stats.get("num_alloc_retries").copied().unwrap_or(0),
                oom
            );
        }
    }
    if !cpu.is_empty() {
        let _ = writeln!(s, "\n## CPU allocators\n");
        let _ = writeln!(
            s,
            "| workload | allocator | served by | threads | scale | M ops/s | malloc p50 / p99 ns | free p50 / p99 ns | peak RSS | drift MiB/1k it | retained | retained after trim |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in cpu {
            let _ = writeln!(
                s,
                "| {} | {} | `{}` ({}) | {}{} | {} | {:.2} | {} / {} | {} / {} | {} | {} | {} | {} |",
                r.workload.name,
                r.allocator,
                r.live_malloc.library,
                r.mode,
                r.threads,
                if r.cross_thread { " cross" } else { "" },
                r.scale,
                r.ops_per_s / 1e6,
                r.alloc_ns.p50,
                r.alloc_ns.p99,
                r.free_ns.p50,
                r.free_ns.p99,
                format_bytes(r.peak_rss),
                r.drift_mib_per_1k_iterations.map(|d| format!("{d:+.2}")).unwrap_or_else(|| "n/a".into()),
                crate::units::format_bytes_signed(r.retained as i128),
                r.retained_after_trim.map(|t| crate::units::format_bytes_signed(t as i128)).unwrap_or_else(|| "n/a".into()),
            );
        }
    }
    for p in probes {
        let _ = writeln!(s, "\n## Device allocation latency ({})\n", p.device);
        let _ = writeln!(s, "| size | cuMemAlloc p50 / p99 | cuMemFree p50 / p99 | async pool alloc+free p50 / p99 |\n|---|---|---|---|");
        for (i, m) in p.malloc.iter().enumerate() {
            let f = &p.free[i];
            let a = p.async_pool_alloc_free.get(i);
            let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1e3);
            let _ = writeln!(
                s,
                "| {} | {} / {} | {} / {} | {} |",
                format_bytes(m.bytes),
                us(m.p50_ns),
                us(m.p99_ns),
                us(f.p50_ns),
                us(f.p99_ns),
                a.map(|a| format!("{} / {}", us(a.p50_ns), us(a.p99_ns))).unwrap_or_default()
            );
        }
    }
    let _ = writeln!(s, "\n## Charts\n");
    for c in charts {
        let _ = writeln!(s, "### {}\n\n![{}]({})\n", c.title, c.title, c.file);
    }
    let _ = writeln!(
        s,
        "Definitions: fragmentation = 1 − allocated/reserved at peak reserved; reserved / live = peak reserved ÷ peak live bytes (1.0 is the ideal); drift = slope of RSS over the steady-state part of the run; retained = RSS after everything was freed minus RSS before the workload."
    );
    s
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A self-contained page: the Markdown tables as HTML tables, charts as <img>.
fn index_html(title: &str, md: &str, charts: &[Chart]) -> String {
    let mut body = String::new();
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            if line.starts_with("|---") {
                continue;
            }
            let cells: Vec<String> = line.trim_matches('|').split(" | ").map(|c| html_escape(c.trim()).replace('`', "")).collect();
            if !in_table {
                body += "<table>\n";
                in_table = true;
                body += &format!("<tr>{}</tr>\n", cells.iter().map(|c| format!("<th>{c}</th>")).collect::<String>());
            } else {
                body += &format!("<tr>{}</tr>\n", cells.iter().map(|c| format!("<td>{c}</td>")).collect::<String>());
            }
            continue;
        }
        if in_table {
            body += "</table>\n";
            in_table = false;
        }
        if let Some(h) = line.strip_prefix("### ") {
            if !charts.iter().any(|c| c.title == h) {
                body += &format!("<h3>{}</h3>\n", html_escape(h));
            }
        } else if let Some(h) = line.strip_prefix("## ") {
            body += &format!("<h2>{}</h2>\n", html_escape(h));
        } else if line.starts_with("# ") {
        } else if let Some(rest) = line.strip_prefix("![") {
            if let Some((alt, file)) = rest.split_once("](") {
                body += &format!(
                    "<figure><img src=\"{}\" alt=\"{}\" /><figcaption>{}</figcaption></figure>\n",
                    file.trim_end_matches(')'),
                    html_escape(alt),
                    html_escape(alt)
                );
            }
        } else if !line.trim().is_empty() {
            body += &format!("<p>{}</p>\n", html_escape(line).replace('`', ""));
        }
    }
    if in_table {
        body += "</table>\n";
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\" /><title>{t}</title>\n<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}}table{{border-collapse:collapse;font-size:13px;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}th{{background:#f3f3f3}}img{{max-width:100%;border:1px solid #eee}}figure{{margin:1.5em 0}}figcaption{{font-size:13px;color:#555}}</style></head>\n<body><h1>{t}</h1>\n{body}</body></html>\n",
        t = html_escape(title)
    )
}
