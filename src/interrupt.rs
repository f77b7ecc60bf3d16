//! The stop flag long runs poll: the commands set it on Ctrl-C or SIGTERM (the CLI installs the handler),
//! and a run that sees it stops and still writes the results gathered so far. Replays see it only
//! through a `StopWhen` observer the caller adds; analyses that run many replays (advise, the
//! capacity search) and the CPU driver poll it between units of work.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Why a command stopped on an interrupt before it had results to keep: the CLI says it and
/// exits 130, as [`exit_interrupted`] does after keeping them.
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for Interrupted {}

/// Says what an interrupted command kept (`interrupted: {kept}`) and exits 130, the status of a
/// process stopped by SIGINT: a scheduler's time limit must not read as a finished run.
pub fn exit_interrupted(kept: &str) -> ! {
    eprintln!("interrupted: {kept}");
    std::process::exit(130)
}

/// Asks every long run to stop.
pub fn request() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

#[inline]
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Waits for `child`, passing an interrupt of this process on to it as `signal` once `grace` has
/// passed with the child still running. A SIGTERM sent to allocbench alone (`kill`, a scheduler's
/// time limit) reaches no child; a Ctrl-C at a terminal reaches them all, and `grace` lets a child
/// that stops on its own finish undisturbed.
pub fn wait_passing_on(child: std::process::Child, signal: i32, grace: std::time::Duration) -> std::io::Result<std::process::ExitStatus> {
    wait_passing_on_ticking(child, signal, grace, &mut || {})
}

/// [`wait_passing_on`], calling `tick` about every 10 ms while the child runs (a progress line).
pub fn wait_passing_on_ticking(
    mut child: std::process::Child,
    signal: i32,
    grace: std::time::Duration,
    tick: &mut dyn FnMut(),
) -> std::io::Result<std::process::ExitStatus> {
    let mut since: Option<std::time::Instant> = None;
    let mut passed = false;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        tick();
        if interrupted() && !passed {
            let at = *since.get_or_insert_with(std::time::Instant::now);
            if at.elapsed() >= grace {
                // SAFETY: kill(2) on the pid of a child this process has not reaped.
                unsafe { libc::kill(child.id() as i32, signal) };
                passed = true;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
