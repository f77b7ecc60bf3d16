//! The device-latency section (`devprobe` records): allocation latency by size on a real GPU.

use std::fmt::Write as _;
use std::path::Path;

use super::charts::{self, Line};
use super::{write_chart, Section};
use crate::results::{DevprobeResult, GpuPolicy, ResultRecord, SizeLatency};
use crate::units::format_bytes;

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1e3)
}

/// The sizes' row where latency is largest.
fn slowest(v: &[SizeLatency]) -> Option<&SizeLatency> {
    v.iter().max_by_key(|s| s.p50_ns)
}

pub fn section(records: &[ResultRecord], out: &Path) -> anyhow::Result<Option<Section>> {
    let probes: Vec<&DevprobeResult> = records.iter().filter_map(|r| if let ResultRecord::Devprobe(p) = r { Some(p.as_ref()) } else { None }).collect();
    if probes.is_empty() {
        return Ok(None);
    }
    let mut sec = Section::new(match probes.as_slice() {
        [one] => format!("Device allocation latency ({})", one.device),
        _ => "Device allocation latency".to_string(),
    });
    for (i, p) in probes.iter().enumerate() {
        if let (Some(m), Some(a)) = (slowest(&p.malloc), p.async_pool_alloc_free.iter().map(|a| a.p50_ns).max()) {
            let smallest = p.malloc.first().map(|s| format!("{} at {}", us(s.p50_ns), format_bytes(s.bytes))).unwrap_or_default();
            sec.findings.push(format!(
                "{}: cuMemAlloc (cudaMalloc) takes {smallest} and up to {} at {} (p50); a warm cuMemAllocAsync pool's alloc + free takes at most {} (p50) at any size.",
                p.device,
                us(m.p50_ns),
                format_bytes(m.bytes),
                us(a)
            ));
        }
        if probes.len() > 1 {
            let _ = writeln!(sec.body, "#### {}\n", p.device);
        }
        let _ = writeln!(sec.body, "| size | cuMemAlloc p50 / p99 | cuMemFree p50 / p99 | async pool alloc+free p50 / p99 |\n|---|---|---|---|");
        for (j, m) in p.malloc.iter().enumerate() {
            let f = p.free.get(j);
            let a = p.async_pool_alloc_free.get(j);
            let _ = writeln!(
                sec.body,
                "| {} | {} / {} | {} | {} |",
                format_bytes(m.bytes),
                us(m.p50_ns),
                us(m.p99_ns),
                f.map(|f| format!("{} / {}", us(f.p50_ns), us(f.p99_ns))).unwrap_or_default(),
                a.map(|a| format!("{} / {}", us(a.p50_ns), us(a.p99_ns))).unwrap_or_default()
            );
        }
        sec.body.push('\n');
        // Log-log: sizes span 512 B to 8 GiB, latencies 1 µs to milliseconds.
        let line = |label: &str, key: &str, v: &[SizeLatency]| Line {
            label: label.to_string(),
            color_key: key.to_string(),
            points: v.iter().map(|s| ((s.bytes as f64).log2(), (s.p50_ns.max(1) as f64 / 1e3).log10())).collect(),
            dashed: false,
        };
        let lines = vec![
            line("cuMemAlloc (cudaMalloc) p50", GpuPolicy::Nocache.name(), &p.malloc),
            line("cuMemFree (cudaFree) p50", GpuPolicy::Pytorch.name(), &p.free),
            line("cuMemAllocAsync + cuMemFreeAsync, warm pool, p50", GpuPolicy::Async.name(), &p.async_pool_alloc_free),
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
        );
        sec.charts.push(write_chart(out, file, title, svg)?);
    }
    Ok(Some(sec))
}
