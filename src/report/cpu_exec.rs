//! The CPU allocators' charts and tables with their spread over repetitions: real programs
//! (`cpu_exec` records: RSS of the process tree over time, wall time and peak RSS bars) and the
//! in-process runs' drift (net of live bytes) and drain, each with a one-line verdict per
//! workload. Only runs whose allocator was proven, that finished, and that ended as the
//! command's runs usually do (not a crash under one allocator) are drawn.

use std::fmt::Write as _;
use std::path::Path;

use super::charts::{self, BarGroup, BarOptions, Line};
use super::spread::Spread;
use super::style::slug;
use super::{write_chart, Chart, Section};
use crate::results::ResultRecord;
use crate::results::{CpuExecResult, CpuRunResult};
use crate::units::{format_bytes, format_bytes_signed};

/// The report's section for real-program runs (`cpu_exec`) and the in-process runs' drift and
/// drain: its verdicts are findings.
pub fn section(records: &[ResultRecord], out: &Path) -> anyhow::Result<Option<Section>> {
    let exec: Vec<&CpuExecResult> = records.iter().filter_map(|r| if let ResultRecord::CpuExec(c) = r { Some(c.as_ref()) } else { None }).collect();
    let runs: Vec<&CpuRunResult> = records.iter().filter_map(|r| if let ResultRecord::CpuRun(c) = r { Some(c.as_ref()) } else { None }).collect();
    if exec.is_empty() && runs.is_empty() {
        return Ok(None);
    }
    let mut sec = Section::new("CPU allocators: real programs, drift and drain");
    sec.body = exec_markdown(&exec) + &run_spread_markdown(&runs);
    sec.findings =
        sec.body.lines().filter_map(|l| l.strip_prefix("**Verdict (").and_then(|v| v.split_once(")**: ")).map(|(w, text)| format!("{w}: {text}"))).collect();
    exec_charts(out, &exec, &mut sec.charts)?;
    Ok(Some(sec))
}

/// One program's verified runs by allocator, in the order met.
type ByAllocator<'a> = Vec<(String, Vec<&'a CpuExecResult>)>;

/// One command's comparison: its runs that ended as its runs usually do, by allocator, and the
/// runs set apart (a crash, or an exit code unlike the others').
struct ExecGroup<'a> {
    title: String,
    command: String,
    allocs: ByAllocator<'a>,
    usual_exit: Option<i32>,
    set_apart: Vec<&'a CpuExecResult>,
}

/// The exit code a command's runs usually end with: the most common among runs that ended on
/// their own (not by a signal, not unable to start), 0 first on a tie. A program that always
/// exits 1 is still compared; a run that ends otherwise under one allocator is not a measurement
/// of the same work.
fn usual_exit_code(runs: &[&CpuExecResult]) -> Option<i32> {
    let mut counts: Vec<(i32, usize)> = Vec::new();
    for r in runs.iter().filter(|r| r.error.is_none()) {
        match counts.iter_mut().find(|c| c.0 == r.exit_code) {
            Some(c) => c.1 += 1,
            None => counts.push((r.exit_code, 1)),
        }
    }
    counts.into_iter().max_by_key(|&(code, n)| (n, code == 0, std::cmp::Reverse(code))).map(|c| c.0)
}

/// Verified runs by command (the same program with other arguments is another comparison),
/// then by allocator in the order met. A group is titled by the program's short name, with its
/// command beside it when another group has the same name.
fn exec_groups<'a>(runs: &[&'a CpuExecResult]) -> Vec<ExecGroup<'a>> {
    let verified: Vec<&CpuExecResult> = runs.iter().copied().filter(|r| r.verified()).collect();
    let by_command = super::spread::fold(verified.iter().copied(), |r| r.command.clone());
    let name_of = |group: &[&CpuExecResult]| group.first().map(|r| r.name.clone()).unwrap_or_default();
    let names: Vec<String> = by_command.iter().map(|(_, group)| name_of(group)).collect();
    by_command
        .into_iter()
        .map(|(command, group)| {
            let name = name_of(&group);
            let title = if names.iter().filter(|n| **n == name).count() > 1 { format!("{name} ({})", command.join(" ")) } else { name };
            let usual_exit = usual_exit_code(&group);
            let (usual, set_apart): (Vec<&CpuExecResult>, Vec<&CpuExecResult>) =
                group.into_iter().partition(|r| r.error.is_none() && Some(r.exit_code) == usual_exit);
            ExecGroup { title, command: command.join(" "), allocs: super::spread::fold(usual, |r| r.label()), usual_exit, set_apart }
        })
        .collect()
}

/// RSS over time per allocator (every repetition) and wall time / peak RSS bars with their
/// spread, per program.
pub fn exec_charts(out: &Path, runs: &[&CpuExecResult], charts: &mut Vec<Chart>) -> anyhow::Result<()> {
    let mut used_slugs = std::collections::HashSet::new();
    for (i, group) in exec_groups(runs).into_iter().enumerate() {
        let (program, allocs) = (group.title, group.allocs);
        if allocs.is_empty() {
            continue;
        }
        // Two commands may differ only in what a slug drops (`-n` and `--n`): number the second.
        let mut ps = slug(&program);
        if !used_slugs.insert(ps.clone()) {
            ps = format!("{ps}-{}", i + 1);
            used_slugs.insert(ps.clone());
        }
        let mut lines = Vec::new();
        for (name, reps) in &allocs {
            for (i, r) in reps.iter().enumerate() {
                lines.push(Line {
                    // One legend entry per allocator (lines of one label share it).
                    label: if reps.len() > 1 { format!("{name} ({} runs, the first solid)", reps.len()) } else { name.clone() },
                    color_key: name.clone(),
                    points: r.rss.iter().map(|&(t, b)| (t, b as f64)).collect(),
                    dashed: i > 0,
                });
            }
        }
        let file = format!("cpu-exec-rss-{ps}.svg");
        let title = format!("{program}: RSS of the process tree over time");
        let svg = charts::lines(&title, "time (s)", "RSS", true, &lines, &[], charts::LegendAt::UpperRight);
        charts.push(write_chart(out, file, title, svg)?);

        let bar = |f: &dyn Fn(&CpuExecResult) -> f64| -> Vec<BarGroup> {
            allocs
                .iter()
                .filter_map(|(name, reps)| {
                    let s = Spread::of_some(&reps.iter().map(|r| f(r)).collect::<Vec<_>>())?;
                    Some(BarGroup { category: name.clone(), bars: vec![(name.clone(), name.clone(), s.mean, s.whisker())] })
                })
                .collect()
        };
        let wall = bar(&|r| r.wall_s);
        let peak = bar(&|r| r.peak_rss_bytes as f64);
        let file = format!("cpu-exec-time-peak-{ps}.svg");
        let title = format!("{program}: wall time and peak RSS (mean, whiskers min–max)");
        let (t1, t2) = (format!("{program}: wall time"), "peak RSS of the process tree".to_string());
        let svg = charts::bars_pair(
            (&wall, &BarOptions { title: &t1, y_desc: "seconds", log: false, y_is_bytes: false, reference: None }),
            (&peak, &BarOptions { title: &t2, y_desc: "peak RSS", log: false, y_is_bytes: true, reference: None }),
        );
        charts.push(write_chart(out, file, title, svg)?);
    }
    Ok(())
}

/// The best allocator (lowest mean) against glibc, in one clause; whether the runner-up is
/// within its spread is said. `f` formats a value.
fn verdict_clause(what: &str, spreads: &[(String, Spread)], f: &dyn Fn(f64) -> String) -> Option<String> {
    verdict_clause_by(what, spreads, &|s| s.mean, f)
}

/// [`verdict_clause`] ranking by `key` (lower is better), e.g. the magnitude of a drift.
fn verdict_clause_by(what: &str, spreads: &[(String, Spread)], key: &dyn Fn(&Spread) -> f64, f: &dyn Fn(f64) -> String) -> Option<String> {
    let best = spreads.iter().min_by(|a, b| key(&a.1).total_cmp(&key(&b.1)))?;
    let runner_up = spreads.iter().filter(|s| s.0 != best.0).min_by(|a, b| key(&a.1).total_cmp(&key(&b.1)));
    let base = spreads.iter().find(|s| s.0 == "glibc").filter(|g| g.0 != best.0);
    let vs = base.map(|g| format!(" vs glibc {}", f(g.1.mean))).unwrap_or_default();
    let qualifier = match runner_up {
        None => String::new(),
        Some(r) if best.1.ci95.is_none() && r.1.ci95.is_none() => ", one run each: no spread to judge by".into(),
        // One side without an interval: whether they overlap is not known, in either direction.
        Some(r) if best.1.ci95.is_none() || r.1.ci95.is_none() => {
            format!(", {} has one run: no spread to judge by", if best.1.ci95.is_none() { &best.0 } else { &r.0 })
        }
        Some(r) => {
            // Ranked by key: compare the keys' intervals.
            let (b, o) = (Spread { mean: key(&best.1), ..best.1 }, Spread { mean: key(&r.1), ..r.1 });
            if b.clearly_below(&o) {
                String::new()
            } else {
                format!(", within the spread of {}", r.0)
            }
        }
    };
    Some(format!("{what}: {} ({}{vs}{qualifier})", best.0, f(best.1.mean)))
}

/// Per program: a table of every allocator with spread, and a one-line verdict.
pub fn exec_markdown(runs: &[&CpuExecResult]) -> String {
    let mut s = String::new();
    if runs.is_empty() {
        return s;
    }
    let _ = writeln!(s, "\n### Real programs (`allocbench cpu --exec`)\n");
    let _ = writeln!(
        s,
        "LD_PRELOAD per allocator (glibc: none), repetitions interleaved, RSS summed over the whole process tree. \
         Figures are mean ± 95 % CI (min–max) over the repetitions whose allocator was proven from the process's mappings.\n"
    );
    let unproven = runs.iter().filter(|r| !r.verified()).count();
    if unproven > 0 {
        let _ = writeln!(s, "{unproven} run(s) left out: allocator not proven, or interrupted.\n");
    }
    let secs = |v: f64| format!("{v:.2} s");
    let bytes = |v: f64| format_bytes(v.max(0.0) as u64);
    for group in exec_groups(runs) {
        let (program, allocs) = (&group.title, &group.allocs);
        let _ = writeln!(s, "#### {program}\n\n`{}`\n", group.command);
        if !group.set_apart.is_empty() {
            let usual = group.usual_exit.map(|c| format!(", where this command's other runs exit {c}")).unwrap_or_default();
            let runs: Vec<String> = group
                .set_apart
                .iter()
                .map(|r| format!("{} run {}: exit {}{}", r.label(), r.rep, r.exit_code, r.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()))
                .collect();
            let _ = writeln!(s, "Set apart, not in the figures or the verdict ({} run(s) that ended otherwise{usual}): {}.\n", runs.len(), runs.join("; "));
        }
        // The verdict (and so the findings) says which allocators' runs ended otherwise: a crash
        // under one allocator is news, not only a row left out.
        let mut apart: Vec<String> = Vec::new();
        for r in &group.set_apart {
            let what = format!("{} (exit {}{})", r.label(), r.exit_code, r.error.as_deref().map(|e| format!(", {e}")).unwrap_or_default());
            if !apart.contains(&what) {
                apart.push(what);
            }
        }
        let apart_clause = (!apart.is_empty()).then(|| format!("ended otherwise, set apart: {}", apart.join(", ")));
        if allocs.is_empty() {
            if let Some(clause) = apart_clause {
                let _ = writeln!(s, "\n**Verdict ({program})**: {clause}.\n");
            }
            continue;
        }
        let _ = writeln!(s, "| allocator | runs | wall | user + sys | peak RSS | minor faults | exit codes |\n|---|---|---|---|---|---|---|");
        let mut walls = Vec::new();
        let mut peaks = Vec::new();
        for (name, reps) in allocs {
            let spread = |f: &dyn Fn(&CpuExecResult) -> f64| Spread::of_some(&reps.iter().map(|r| f(r)).collect::<Vec<_>>()).expect("a group has runs");
            let (wall, cpu, peak, faults) =
                (spread(&|r| r.wall_s), spread(&|r| r.user_s + r.sys_s), spread(&|r| r.peak_rss_bytes as f64), spread(&|r| r.minor_faults as f64));
            let mut codes: Vec<i32> = reps.iter().map(|r| r.exit_code).collect();
            codes.dedup();
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                reps.len(),
                wall.show_range(&secs),
                cpu.show_range(&secs),
                peak.show_range(&bytes),
                faults.show_range(&|v| format!("{v:.0}")),
                codes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            );
            walls.push((name.clone(), wall));
            peaks.push((name.clone(), peak));
        }
        let clauses: Vec<String> =
            [verdict_clause("lowest peak RSS", &peaks, &bytes), verdict_clause("fastest", &walls, &secs), apart_clause].into_iter().flatten().collect();
        let _ = writeln!(s, "\n**Verdict ({program})**: {}.\n", clauses.join("; "));
    }
    s
}

/// The in-process runs' drift net of live bytes and their drain, per workload and allocator,
/// with spread and a one-line verdict per workload.
pub fn run_spread_markdown(runs: &[&CpuRunResult]) -> String {
    let mut s = String::new();
    // (Recorded programs replayed at their pace have their own tables: src/report/cpu.rs.)
    let finished: Vec<&CpuRunResult> = runs.iter().copied().filter(|r| !r.interrupted && !r.paced).collect();
    // Only runs with a drain (`--drain`) add to the CPU section's own table.
    if !finished.iter().any(|r| r.drain_s > 0.0) {
        return s;
    }
    let _ = writeln!(s, "\n### Drift and drain over repetitions (in-process runs)\n");
    let _ = writeln!(
        s,
        "Drift is the slope of RSS minus live bytes over the steady part, in MiB per 1,000 iterations (raw RSS beside it); \
         retained is RSS minus RSS before the workload, at 0.1 / 1 / 10 s after the last free and after the allocator's own trim call. \
         Mean ± 95 % CI (min–max) over repetitions.\n"
    );
    let mib = |v: f64| format!("{v:+.2}");
    let signed = |v: f64| format_bytes_signed(v as i128);
    for (workload, group) in super::spread::fold(finished.iter().copied(), |r| r.workload.name.clone()) {
        let _ = writeln!(s, "#### {workload}\n");
        let _ = writeln!(
            s,
            "| allocator | runs | drift (RSS − live) | raw RSS drift | retained 0.1 s | 1 s | 10 s | after trim |\n|---|---|---|---|---|---|---|---|"
        );
        let mut drains = Vec::new();
        let mut drifts = Vec::new();
        // A preloaded allocator and the compiled-in one of the same name are different rows.
        let by_allocator = super::spread::fold(group, |r| (r.label(), r.mode));
        for ((allocator, mode), reps) in &by_allocator {
            let name = if by_allocator.iter().filter(|((a, _), _)| a == allocator).count() > 1 { format!("{allocator} ({mode})") } else { allocator.clone() };
            let spread = |v: Vec<f64>| Spread::of_some(&v);
            let show = |v: Option<Spread>, f: &dyn Fn(f64) -> String| v.map(|x| x.show_range(f)).unwrap_or_else(|| "n/a".into());
            let overhead = spread(reps.iter().filter_map(|r| r.drift_overhead_mib_per_1k).collect());
            let raw = spread(reps.iter().filter_map(|r| r.drift_mib_per_1k_iterations).collect());
            let at = |t: f64| spread(reps.iter().filter_map(|r| r.retained_after_drain.iter().find(|d| d.after_s == t).map(|d| d.retained as f64)).collect());
            let (a01, a1, a10) = (at(0.1), at(1.0), at(10.0));
            let trim = spread(reps.iter().filter_map(|r| r.retained_after_trim.map(|v| v as f64)).collect());
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} | {} | {} | {} |",
                reps.len(),
                show(overhead, &mib),
                show(raw, &mib),
                show(a01, &signed),
                show(a1, &signed),
                show(a10, &signed),
                show(trim, &signed)
            );
            if let Some(last) = a10.or(a1).or(a01) {
                drains.push((name.clone(), last));
            }
            if let Some(d) = overhead {
                drifts.push((name.clone(), d));
            }
        }
        let clauses: Vec<String> = [
            verdict_clause("least retained at the end of the drain", &drains, &signed),
            verdict_clause_by("overhead drift closest to zero (MiB/1k it)", &drifts, &|d| d.mean.abs(), &mib),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !clauses.is_empty() {
            let _ = writeln!(s, "\n**Verdict ({workload})**: {}.\n", clauses.join("; "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_verdict() {
        let s = Spread::of_some(&[1.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.min, s.max, s.n), (1.0, 3.0, 3));
        assert_eq!(s.whisker(), Some((1.0, 3.0)));
        let low = Spread::of_some(&[10.0, 10.1, 9.9]).unwrap();
        let high = Spread::of_some(&[20.0, 20.1, 19.9]).unwrap();
        assert!(low.clearly_below(&high) && !high.clearly_below(&low));
        let v = verdict_clause("fastest", &[("glibc".into(), high), ("mimalloc".into(), low)], &|x| format!("{x:.1}")).unwrap();
        assert_eq!(v, "fastest: mimalloc (10.0 vs glibc 20.0)");
        let v =
            verdict_clause("fastest", &[("glibc".into(), s), ("mimalloc".into(), Spread::of_some(&[1.5, 2.5, 2.0]).unwrap())], &|x| format!("{x:.1}")).unwrap();
        assert!(v.contains("within the spread"), "{v}");
        // A runner-up measured once has no interval: no claim either way.
        let once = Spread::of_some(&[27.7]).unwrap();
        let v = verdict_clause("lowest peak RSS", &[("glibc".into(), Spread::of_some(&[24.0, 24.1, 23.9]).unwrap()), ("mimalloc".into(), once)], &|x| {
            format!("{x:.1}")
        })
        .unwrap();
        assert_eq!(v, "lowest peak RSS: glibc (24.0, mimalloc has one run: no spread to judge by)");
    }
}
