//! The stop flag long runs poll: the commands set it on Ctrl-C (the CLI installs the handler),
//! and a run that sees it stops and still writes the results gathered so far. Replays see it only
//! through a `StopWhen` observer the caller adds; analyses that run many replays (advise, the
//! capacity search) and the CPU driver poll it between units of work.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Asks every long run to stop.
pub fn request() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

#[inline]
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}
