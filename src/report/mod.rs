//! `allocbench report`: reads results files only and renders a report into a folder: SVG charts,
//! an index (`README.md` and `index.html`, findings first) and interactive memory views
//! (`memory-<workload>.html`). Output is deterministic for the same input.
//!
//! The index is made of [`Section`]s, one per kind of record, each built by a function of
//! [`SECTIONS`] from all the records: its findings (sentences with their numbers, listed together
//! at the top of the index), its tables and its charts (files, and inline in the HTML). A new kind
//! of record gets its own file here and one entry in [`SECTIONS`].

pub mod charts;
pub mod cpu;
pub mod cpu_exec;
pub mod devprobe;
pub mod diagnose;
pub mod front;
pub mod gpu;
pub mod html;
pub mod memory_view;
pub mod spread;
pub mod style;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::InputError;
use crate::results::{read_results, MachineInfo, ResultRecord, WorkloadInfo};
use crate::units::format_bytes;

pub use gpu::gpu_short_label;

/// A chart written into the report: its file, its title, and its SVG markup (inlined in the HTML).
pub struct Chart {
    pub file: String,
    pub title: String,
    pub svg: String,
    /// Shown folded (`<details>`) in the HTML: the many per-config segment maps.
    pub folded: bool,
}

/// One kind of record's part of the report.
pub struct Section {
    /// The `##` heading.
    pub heading: String,
    /// Sentences with their numbers, computed from the records (the findings list).
    pub findings: Vec<String>,
    /// Markdown shown before the charts: tables (`|` rows), `- ` lists, paragraphs, `###`/`####`.
    pub body: String,
    pub charts: Vec<Chart>,
    /// The decisions the section leads the page with ("what to set", once per family of
    /// workloads that agree), and the chart shown beside them (an index into `charts`).
    pub decisions: Vec<String>,
    pub key_chart: Option<usize>,
}

impl Section {
    pub fn new(heading: impl Into<String>) -> Self {
        Section { heading: heading.into(), findings: Vec::new(), body: String::new(), charts: Vec::new(), decisions: Vec::new(), key_chart: None }
    }
}

/// Every section's decisions, in order.
pub fn decisions(sections: &[Section]) -> Vec<&str> {
    sections.iter().flat_map(|s| s.decisions.iter().map(String::as_str)).collect()
}

/// The chart the decisions are read beside: the first section's that names one.
pub fn key_chart(sections: &[Section]) -> Option<&Chart> {
    sections.iter().find_map(|s| s.charts.get(s.key_chart?))
}

/// Builds one section from every record of the report (`None` when it has none of its kind);
/// charts and extra pages are written into the folder given.
pub type SectionFn = fn(&[ResultRecord], &Path) -> anyhow::Result<Option<Section>>;

/// The sections, in the order the index shows them.
pub const SECTIONS: &[SectionFn] = &[gpu::section, cpu::section, cpu_exec::section, devprobe::section, diagnose::section, front::section];

/// Loads every results file (errors name the file and line).
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Vec<ResultRecord>> {
    let mut all = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        // A file named twice (a glob and its own name) would count its runs twice.
        if let Some(first) = paths[..i].iter().find(|q| crate::files::same_file(q, p)) {
            eprintln!("note: {} is the same file as {}: read once", p.display(), first.display());
            continue;
        }
        // A merged sweep's rows are replays (its failed rows have nothing to draw).
        all.extend(read_results(p)?.into_iter().filter_map(|r| match r {
            ResultRecord::SweepRow(s) => s.result.map(|g| ResultRecord::GpuReplay(Box::new(g))),
            other => Some(other),
        }));
    }
    if all.is_empty() {
        return Err(InputError::new("report", "no results records in the given files").into());
    }
    Ok(all)
}

/// Writes a chart's SVG into the folder and returns it as a [`Chart`].
pub fn write_chart(out: &Path, file: String, title: String, svg: Result<String, String>) -> anyhow::Result<Chart> {
    let svg = svg.map_err(|m| anyhow::anyhow!(m))?;
    write_file(out, &file, &svg)?;
    Ok(Chart { file, title, svg, folded: false })
}

/// Writes a file of the report (errors name it).
pub fn write_file(out: &Path, file: &str, text: &str) -> anyhow::Result<()> {
    std::fs::write(out.join(file), text).map_err(|e| InputError::new(out.join(file).display().to_string(), format!("cannot write: {e}")))?;
    Ok(())
}

/// Renders the report for `records` into `out`; returns the charts written.
pub fn render(records: &[ResultRecord], out: &Path, title: &str) -> anyhow::Result<Vec<Chart>> {
    std::fs::create_dir_all(out).map_err(|e| InputError::new(out.display().to_string(), format!("cannot create the report folder: {e}")))?;
    let mut sections = Vec::new();
    for build in SECTIONS {
        if let Some(s) = build(records, out)? {
            sections.push(s);
        }
    }
    let preamble = preamble(records);
    write_file(out, "README.md", &index_markdown(title, &preamble, &sections))?;
    write_file(out, "index.html", &html::index(title, &preamble, &sections))?;
    Ok(sections.into_iter().flat_map(|s| s.charts).collect())
}

/// What every record carries, whatever its kind: (machine, workload).
fn common(r: &ResultRecord) -> (Option<&MachineInfo>, Option<&WorkloadInfo>) {
    match r {
        ResultRecord::GpuReplay(g) => (Some(&g.machine), Some(&g.workload)),
        ResultRecord::CpuRun(c) => (Some(&c.machine), Some(&c.workload)),
        ResultRecord::Devprobe(p) => (Some(&p.machine), None),
        ResultRecord::Diagnose(d) => (None, Some(&d.workload)),
        ResultRecord::CpuExec(c) => (Some(&c.machine), None),
        ResultRecord::Advise(a) => (None, Some(&a.workload)),
        ResultRecord::CpuAdvise(_) => (None, None),
        // `load` turns sweep rows into replays; one read otherwise holds its replay.
        ResultRecord::SweepRow(s) => s.result.as_ref().map_or((None, None), |g| (Some(&g.machine), Some(&g.workload))),
    }
}

/// The runs' provenance (machine, date, versions) and the workloads table, as Markdown.
fn preamble(records: &[ResultRecord]) -> String {
    let mut s = String::new();
    let machines: Vec<&MachineInfo> = records.iter().filter_map(|r| common(r).0).collect();
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
    for w in records.iter().filter_map(|r| common(r).1) {
        workloads.insert(&w.name, (&w.kind, &w.description, &w.sha256));
    }
    if !workloads.is_empty() {
        let _ = writeln!(s, "## Workloads\n\n| workload | kind | description | sha256 |\n|---|---|---|---|");
        for (name, (kind, desc, sha)) in &workloads {
            let _ = writeln!(s, "| {name} | {kind} | {desc} | `{}` |", &sha[..sha.len().min(12)]);
        }
    }
    s
}

const DEFINITIONS: &str = "Definitions: fragmentation = 1 − allocated/reserved at peak reserved; reserved / live = peak reserved ÷ peak live bytes (1.0 is the ideal); drift = slope of RSS over the steady-state part of the run; retained = RSS after everything was freed minus RSS before the workload; ± is the half-width of the 95 % confidence interval of the mean over the repetitions (Student's t), shown when a configuration ran more than once.";

fn index_markdown(title: &str, preamble: &str, sections: &[Section]) -> String {
    let mut s = format!("# {title}\n\n");
    let lead = decisions(sections);
    if !lead.is_empty() {
        s += "## What to set\n\n";
        for d in lead {
            let _ = writeln!(s, "- {d}");
        }
        if let Some(c) = key_chart(sections) {
            let _ = writeln!(s, "\n![{}]({})", c.title, c.file);
        }
        s += "\n";
    }
    s += "## Findings\n\n";
    for f in findings(sections) {
        let _ = writeln!(s, "- {f}");
    }
    let _ = writeln!(s, "\n{preamble}");
    for sec in sections {
        let _ = writeln!(s, "\n## {}\n\n{}", sec.heading, sec.body);
        for c in &sec.charts {
            let _ = writeln!(s, "### {}\n\n![{}]({})\n", c.title, c.title, c.file);
        }
    }
    let _ = writeln!(s, "\n{DEFINITIONS}");
    s
}

/// Every section's findings, in order (one line saying so when there are none).
pub fn findings(sections: &[Section]) -> Vec<&str> {
    let all: Vec<&str> = sections.iter().flat_map(|s| s.findings.iter().map(String::as_str)).collect();
    if all.is_empty() {
        vec!["(the results hold nothing to compare)"]
    } else {
        all
    }
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

/// A relative change as people write it: `−7.9 %`, `+3.0 %`.
pub fn percent_change(value: f64, baseline: f64) -> String {
    if baseline == 0.0 {
        return "n/a".into();
    }
    let p = 100.0 * (value - baseline) / baseline;
    if p < 0.0 {
        format!("−{:.1} %", -p)
    } else {
        format!("+{p:.1} %")
    }
}
