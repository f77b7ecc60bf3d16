//! Progress bars for the commands (the library never draws one).

use indicatif::{ProgressBar, ProgressStyle};

use crate::gpu::replay::{Observer, StopWhen};
use crate::gpu::GpuAllocator;

/// A spinner counting replayed events, or nothing when `quiet`.
pub fn events(quiet: bool, label: &str) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} {pos} events ({per_sec}) {elapsed}").expect("valid template"));
    pb.set_message(label.to_string());
    Some(pb)
}

/// A bar over `n` configurations, or nothing when `quiet`.
pub fn configurations(quiet: bool, n: usize) -> Option<ProgressBar> {
    (!quiet).then(|| {
        let pb = ProgressBar::new(n as u64);
        pb.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} configurations ({per_sec}, eta {eta})").expect("valid template"));
        pb
    })
}

/// A bar over a sweep shard's rows (its length set once known), or nothing when `quiet`.
pub fn rows(quiet: bool) -> Option<ProgressBar> {
    (!quiet).then(|| {
        let pb = ProgressBar::new(0);
        pb.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} rows ({per_sec}, eta {eta})").expect("valid template"));
        pb
    })
}

/// A bar over `n` fuzz cases, or nothing when `quiet`.
pub fn cases(quiet: bool, n: u64) -> Option<ProgressBar> {
    (!quiet).then(|| {
        let pb = ProgressBar::new(n);
        pb.set_style(ProgressStyle::with_template("{bar:40} {pos}/{len} cases ({per_sec}, eta {eta})").expect("valid template"));
        pb
    })
}

/// Clears a finished bar.
pub fn finish(pb: Option<ProgressBar>) {
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
}

/// Moves an events spinner along a replay.
pub struct Position(pub Option<ProgressBar>);

impl<A: GpuAllocator + ?Sized> Observer<A> for Position {
    fn checkpoint(&mut self, events: u64) -> bool {
        if let Some(pb) = &self.0 {
            pb.set_position(events);
        }
        false
    }
}

/// What a command watches a replay with: its spinner, and Ctrl-C.
pub fn watch(pb: &Option<ProgressBar>) -> (Position, StopWhen<fn() -> bool>) {
    (Position(pb.clone()), StopWhen(crate::interrupt::interrupted as fn() -> bool))
}

/// The capture's one line: what it is doing, its counts and speed (message set by [`capture_message`]).
pub fn capture() -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("valid template"));
    pb.set_message("starting Python, torch and the script's imports");
    pb
}

/// Rows per second over the last few seconds, and how long the row count has stood still.
#[derive(Default)]
pub struct RowRate {
    /// (when, rows) samples, oldest first, over about 5 s.
    samples: std::collections::VecDeque<(std::time::Duration, u64)>,
    /// When the row count last changed.
    changed: std::time::Duration,
}

impl RowRate {
    /// (rows/s, seconds without a new row) after `rows` were seen at `now`.
    fn update(&mut self, now: std::time::Duration, rows: u64) -> (f64, f64) {
        if self.samples.back().is_none_or(|&(_, r)| r != rows) {
            self.changed = now;
        }
        self.samples.push_back((now, rows));
        while self.samples.len() > 2 && now - self.samples[0].0 > std::time::Duration::from_secs(5) {
            self.samples.pop_front();
        }
        let (t0, r0) = self.samples[0];
        let span = (now - t0).as_secs_f64();
        let rate = if span > 0.0 { rows.saturating_sub(r0) as f64 / span } else { 0.0 };
        (rate, (now - self.changed).as_secs_f64())
    }
}

/// "step 3 · 1,234,567 rows · 9,300/s · live 4.5 GiB (peak 6.1 GiB) · 2 values made up".
pub fn capture_message(p: Option<&crate::capture::CaptureProgress>, elapsed: std::time::Duration, rate: &mut RowRate) -> String {
    let Some(p) = p else { return "starting Python, torch and the script's imports".into() };
    let phase = match p.phase.as_str() {
        "first_step" => "before the first optimizer step".to_string(),
        "steps" => format!("step {}", p.steps + 1),
        "no_grad" if p.steps == 0 => "no-grad work (evaluation, inference)".to_string(),
        "no_grad" => format!("no-grad work (evaluation, inference) after step {}", p.steps),
        "closing" => "writing the trace".to_string(),
        other => other.to_string(),
    };
    let (per_second, still) = rate.update(elapsed, p.rows);
    let mut line = format!(
        "{phase} · {} rows · {}/s · live {} (peak {})",
        indicatif::HumanCount(p.rows),
        indicatif::HumanCount(per_second.round() as u64),
        crate::units::format_bytes(p.live_bytes),
        crate::units::format_bytes(p.peak_live_bytes)
    );
    if p.values_made_up > 0 {
        line += &format!(" · {} made up", crate::units::count(p.values_made_up, "value"));
    }
    if still >= 10.0 {
        line += &format!(" · no new row for {still:.0} s (the script's own work: data loading, I/O, a wait)");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::CaptureProgress;
    use std::time::Duration;

    fn at(phase: &str, steps: u64, rows: u64) -> CaptureProgress {
        CaptureProgress { phase: phase.into(), steps, rows, live_bytes: 3 << 30, peak_live_bytes: 5 << 30, ..Default::default() }
    }

    #[test]
    fn the_capture_line_says_the_phase_the_rate_and_a_stall() {
        let mut rate = RowRate::default();
        assert_eq!(capture_message(None, Duration::ZERO, &mut rate), "starting Python, torch and the script's imports");
        let first = capture_message(Some(&at("first_step", 0, 1000)), Duration::from_secs(1), &mut rate);
        assert!(first.starts_with("before the first optimizer step · 1,000 rows · 0/s · live 3.00 GiB (peak 5.00 GiB)"), "{first}");
        let line = capture_message(Some(&at("steps", 2, 21_000)), Duration::from_secs(3), &mut rate);
        assert!(line.starts_with("step 3 · 21,000 rows · 10,000/s"), "rows over the last seconds: {line}");
        let eval = capture_message(Some(&at("no_grad", 2, 21_000)), Duration::from_secs(9), &mut rate);
        assert!(eval.starts_with("no-grad work (evaluation, inference) after step 2"), "{eval}");
        assert!(!eval.contains("no new row"), "6 s is not a stall yet: {eval}");
        let stalled = capture_message(Some(&at("no_grad", 2, 21_000)), Duration::from_secs(15), &mut rate);
        assert!(stalled.contains("0/s") && stalled.ends_with("no new row for 12 s (the script's own work: data loading, I/O, a wait)"), "{stalled}");
        let mut made_up = at("steps", 3, 22_000);
        made_up.values_made_up = 2;
        assert!(capture_message(Some(&made_up), Duration::from_secs(16), &mut rate).contains(" · 2 values made up"));
    }
}
