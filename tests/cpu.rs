//! The CPU driver under each in-process allocator, and the LD_PRELOAD allocators' detection.

use std::time::Duration;

use allocbench::cpu::allocators::{CpuAllocator, CPU_ALLOCATORS};
use allocbench::cpu::driver::DriverOptions;
use allocbench::cpu::{self, CpuRunOptions};
use allocbench::input::Source;
use allocbench::workload::Workload;
use assert_cmd::Command;

/// RSS is per process: runs that measure it must not overlap with each other.
static RSS_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn python_like(name: &str, keep: u64, trim_above: u64, trim_to: u64, iterations: u64) -> Source {
    let src = format!(
        "name = \"{name}\"\nseed = 3\n[python_objects]\nsizes = [\"4KiB\", \"16KiB\", \"64KiB\"]\niterations = {iterations}\nper_iteration = 40\nkeep = {keep}\ntrim_above = {trim_above}\ntrim_to = {trim_to}\n"
    );
    Source::Workload(Box::new(Workload::parse(&src, name).unwrap()))
}

fn opts(threads: usize, cross_thread: bool) -> CpuRunOptions {
    CpuRunOptions {
        driver: DriverOptions { threads, cross_thread, scale: 1.0, iterations: None, duration: None, touch: true },
        sample_interval: Duration::from_millis(1),
    }
}

#[test]
fn accounting_holds_under_every_in_process_allocator() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let source = python_like("steady", 10, 400, 200, 600);
    for (name, _) in CPU_ALLOCATORS {
        for (threads, cross) in [(1, false), (2, true)] {
            let r = cpu::run(&source, CpuAllocator::by_name(name).unwrap(), &opts(threads, cross)).unwrap();
            assert_eq!(r.bytes_allocated, r.bytes_freed, "{name}: every byte allocated is freed at the end");
            assert_eq!(r.work.allocs, r.work.frees, "{name}");
            assert_eq!(r.work.allocs, 600 * 40 * threads as u64, "{name}: every worker replays the whole workload");
            assert!(r.rss_timeline.len() >= 3, "{name}: RSS sampled {} times", r.rss_timeline.len());
            // One op in LATENCY_SAMPLE_EVERY is timed.
            let every = allocbench::cpu::driver::LATENCY_SAMPLE_EVERY;
            let timed = r.alloc_ns.count + r.free_ns.count;
            assert!((timed * every).abs_diff(r.work.allocs + r.work.frees) <= every * threads as u64, "{name}: {timed} timed ops");
            assert!(r.alloc_ns.p50 > 0 && r.alloc_ns.p99 >= r.alloc_ns.p50 && r.alloc_ns.p999 >= r.alloc_ns.p99, "{name}: {:?}", r.alloc_ns);
            assert!(r.peak_rss > r.rss_before, "{name}: pages were touched");
            if *name == "jemalloc" {
                assert!(r.native_stats.contains_key("jemalloc.stats.resident"), "{:?}", r.native_stats);
            }
        }
    }
}

#[test]
fn drift_is_positive_for_a_leak_and_near_zero_when_steady() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Leak: 10 objects of ~28 KiB average kept per iteration, never trimmed: ~0.27 MiB per
    // iteration, ~270 MiB per 1,000 iterations.
    let leak = cpu::run(&python_like("leak", 10, 1_000_000, 1_000_000, 1500), CpuAllocator::by_name("system").unwrap(), &opts(1, false)).unwrap();
    let d = leak.drift_mib_per_1k_iterations.expect("enough samples");
    assert!(d > 100.0, "leaking workload drift {d} MiB/1k iterations");
    // Steady: the kept set is trimmed to a fixed size; stated tolerance ±10 MiB per 1,000 iterations.
    let steady = cpu::run(&python_like("steady", 10, 200, 100, 1500), CpuAllocator::by_name("mimalloc").unwrap(), &opts(1, false)).unwrap();
    let d = steady.drift_mib_per_1k_iterations.expect("enough samples");
    assert!(d.abs() < 10.0, "steady workload drift {d} MiB/1k iterations");
}

fn bin() -> Command {
    Command::cargo_bin("allocbench").unwrap()
}

/// Under LD_PRELOAD of each Debian allocator, detection names it. Skipped (one line) when the
/// library is missing, unless ALLOCBENCH_REQUIRE_PRELOAD is set (CI sets it).
#[test]
fn preload_detection_names_the_live_allocator() {
    let require = std::env::var_os("ALLOCBENCH_REQUIRE_PRELOAD").is_some();
    for (name, path, package) in allocbench::cpu::preload::PRELOAD_LIBRARIES {
        if !std::path::Path::new(path).exists() {
            assert!(!require, "{path} is missing: install {package} (ALLOCBENCH_REQUIRE_PRELOAD is set)");
            println!("skipped: {name} preload test, {path} not installed (apt-get install {package})");
            continue;
        }
        let out = bin().env("LD_PRELOAD", path).arg("malloc-info").output().unwrap();
        assert!(out.status.success());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["name"], *name, "{v}");
        assert_eq!(v["library"], *path);
        // The whole driver labels the run by what served it, and --expect-malloc guards it.
        let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
        let out = bin().args(["cpu", &w, "--allocator", "system", "--iterations", "20", "--preload", name, "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["allocator"], *name);
        assert_eq!(r["mode"], "preload");
        let wrong = if *name == "jemalloc" { "tcmalloc" } else { "jemalloc" };
        let out = bin().env("LD_PRELOAD", path).args(["cpu", &w, "--allocator", "system", "--iterations", "5", "--expect-malloc", wrong]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("refusing to label this run {wrong}")));
    }
}

#[test]
fn cpu_bad_input_exits_2() {
    let w = |f: &str| format!("{}/workloads/{f}", env!("CARGO_MANIFEST_DIR"));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["cpu".into(), w("python-objects.toml"), "--allocator".into(), "hoard".into()], "unknown CPU allocator 'hoard'"),
        (vec!["cpu".into(), w("python-objects.toml"), "--preload".into(), "/no/such/libfoo.so".into()], "not found"),
        (vec!["cpu".into(), w("llama2-7b-80g.toml"), "--allocator".into(), "system".into()], "try --scale 1/"),
        (vec!["cpu".into(), w("python-objects.toml"), "--scale".into(), "3".into()], "must be in (0, 1]"),
        (vec!["cpu".into(), w("python-objects.toml"), "--expect-malloc".into(), "tcmalloc".into(), "--allocator".into(), "system".into()], "refusing"),
    ];
    for (args, want) in cases {
        let out = bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Ctrl-C (SIGINT) stops a long run, which still writes the results it gathered.
#[test]
fn interrupted_run_still_writes_its_results() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.jsonl");
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["cpu", &w, "--allocator", "mimalloc", "--duration", "60", "--jsonl", out.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let recs = allocbench::results::read_results(&out).unwrap();
    match &recs[..] {
        [allocbench::results::ResultRecord::CpuRun(r)] => {
            assert!(r.interrupted);
            assert!(r.wall_s < 30.0 && r.work.allocs > 0 && r.bytes_allocated == r.bytes_freed);
        }
        other => panic!("expected one CPU run, got {}", other.len()),
    }
}
