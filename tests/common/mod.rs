//! What every integration test shares: a visible skip.
//!
//! A test that cannot run here (no torch, no Chromium, no Slurm, a missing LD_PRELOAD allocator)
//! returns early, and libtest would print `ok` for it. [`skip`] records it instead; when the test
//! binary exits, one line per skipped group goes to the terminal (past libtest's output capture),
//! naming how many tests did not run, why, and what makes them run. Where the group's
//! `ALLOCBENCH_REQUIRE_*` variable is set (CI sets them all), a skip is a failure.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Mutex;

/// Skipped tests by group: (why, the tests' names).
static SKIPPED: Mutex<BTreeMap<String, (String, Vec<String>)>> = Mutex::new(BTreeMap::new());

/// Records that the calling test of `group` did not run because of `why` (which names the fix),
/// or fails it when `require` (an `ALLOCBENCH_REQUIRE_*` variable) is set.
pub fn skip(group: &str, why: &str, require: &str) {
    assert!(std::env::var_os(require).is_none(), "{require} is set, but {why}");
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let mut skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if skipped.is_empty() {
        // SAFETY: `report_skips` is an `extern "C" fn()` that never unwinds (it catches nothing
        // and only locks, formats and writes); registering it has no other precondition.
        unsafe { libc::atexit(report_skips) };
    }
    skipped.entry(group.to_string()).or_insert_with(|| (why.to_string(), Vec::new())).1.push(test);
}

/// The summary, at exit: written to the process's stderr directly, which libtest does not capture.
extern "C" fn report_skips() {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let mut err = std::io::stderr().lock();
    for (group, (why, tests)) in skipped.iter() {
        let shown: Vec<&str> = tests.iter().take(3).map(String::as_str).collect();
        let more = if tests.len() > shown.len() { format!(", +{} more", tests.len() - shown.len()) } else { String::new() };
        let _ = writeln!(err, "SKIPPED {} {group} test{} ({}{more}): {why}", tests.len(), if tests.len() == 1 { "" } else { "s" }, shown.join(", "));
    }
}
