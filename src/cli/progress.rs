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
