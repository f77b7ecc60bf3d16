//! The CPU driver under each in-process allocator, and the LD_PRELOAD allocators' detection.

mod common;

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
        drain: Duration::ZERO,
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
            // One op in LATENCY_SAMPLE_EVERY is timed on average (random gaps of 1 ..= 127: the
            // count's standard deviation is about 1.3 % here), frees handed to another thread
            // included.
            let every = allocbench::cpu::driver::LATENCY_SAMPLE_EVERY as f64;
            let expected = (r.work.allocs + r.work.frees) as f64 / every;
            let timed = (r.alloc_ns.count + r.free_ns.count) as f64;
            assert!((timed / expected - 1.0).abs() < 0.1, "{name}: {timed} timed ops, {expected} expected");
            let timed_frees = r.free_ns.count as f64;
            assert!((timed_frees / (r.work.frees as f64 / every) - 1.0).abs() < 0.15, "{name}: {timed_frees} timed frees of {}", r.work.frees);
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
    // ... but all of that growth is live data the workload holds: the allocator's own drift
    // (RSS minus live bytes) is about zero.
    let overhead = leak.drift_overhead_mib_per_1k.expect("enough samples");
    assert!(overhead.abs() < 10.0, "growth-only workload: overhead drift {overhead} MiB/1k iterations while RSS grows {d}");
    // Steady: the kept set is trimmed to a fixed size; stated tolerance ±10 MiB per 1,000 iterations.
    // (Long enough for the 10 samples a drift needs: 1,500 iterations of small objects took a few ms.)
    let steady = cpu::run(&python_like("steady", 10, 200, 100, 30_000), CpuAllocator::by_name("mimalloc").unwrap(), &opts(1, false)).unwrap();
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
    for (name, path, package) in allocbench::cpu::preload::PRELOAD_LIBRARIES {
        if !std::path::Path::new(path).exists() {
            common::skip(&format!("{name} preload"), &format!("{path} is not installed (apt-get install {package})"), "ALLOCBENCH_REQUIRE_PRELOAD");
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
        // The preloaded allocator's own purge call, found with dlsym.
        let want = match *name {
            "jemalloc" => "mallctl(arena.<ALL>.purge)",
            "tcmalloc" => "MallocExtension_ReleaseFreeMemory()",
            _ => "mi_collect(true)",
        };
        assert_eq!(r["trim_call"], want, "{name}");
        assert!(r["retained_after_trim"].is_i64());
        let wrong = if *name == "jemalloc" { "tcmalloc" } else { "jemalloc" };
        let out = bin().env("LD_PRELOAD", path).args(["cpu", &w, "--allocator", "system", "--iterations", "5", "--expect-malloc", wrong]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("refusing to label this run {wrong}")));
    }
    // A name no allocator has is a usage error naming the choices, not a mismatch.
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let out = bin().args(["cpu", &w, "--allocator", "system", "--expect-malloc", "foo"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'foo' for '--expect-malloc") && err.contains("glibc, jemalloc, tcmalloc, mimalloc"), "{err}");
}

#[test]
fn cpu_bad_input_exits_2() {
    let w = |f: &str| format!("{}/workloads/{f}", env!("CARGO_MANIFEST_DIR"));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["cpu".into(), w("python-objects.toml"), "--allocator".into(), "hoard".into()], "unknown CPU allocator 'hoard'"),
        (vec!["cpu".into(), w("python-objects.toml"), "--preload".into(), "/no/such/libfoo.so".into()], "not found"),
        (vec!["cpu".into(), w("python-objects.toml"), "--preload".into(), "/usr/lib/x86_64-linux-gnu/libm.so.6".into()], "is not an allocator"),
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
    // Found by the first allocator's own process (the trace is read there): its one line is all,
    // not followed by the parent's account of a failed run.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "op,id,bytes,stream\nalloc,1,4096,0\nfree,2,,\n").unwrap();
    let out = bin().args(["cpu", bad.to_str().unwrap(), "--allocator", "all", "--iterations", "1"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.csv:3: free of id 2, which is not live"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

/// Ctrl-C (SIGINT) stops a long run, which still writes the results it gathered, and exits 130
/// (scripts/compare.sh stops on it, as on an interrupted `--exec` run). So does SIGTERM sent to
/// allocbench alone (`kill`, a scheduler's time limit), which passes it on to the child process
/// measuring an allocator.
#[test]
fn interrupted_run_still_writes_its_results() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    for (signal, allocators) in [(libc::SIGINT, "mimalloc"), (libc::SIGTERM, "mimalloc"), (libc::SIGTERM, "system,mimalloc")] {
        let out = dir.path().join(format!("r{signal}-{allocators}.jsonl"));
        let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
            .args(["cpu", &w, "--allocator", allocators, "--duration", "60", "--jsonl", out.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: kill(2) takes two integers and touches no memory of ours; the pid is our child, not yet waited for.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "signal {signal}, {allocators}: {status:?}");
        let recs = allocbench::results::read_results(&out).unwrap();
        match &recs[..] {
            [allocbench::results::ResultRecord::CpuRun(r)] => {
                assert!(r.interrupted, "signal {signal}, {allocators}");
                assert!(r.wall_s < 30.0 && r.work.allocs > 0 && r.bytes_allocated == r.bytes_freed);
            }
            other => panic!("signal {signal}, {allocators}: expected one CPU run, got {}", other.len()),
        }
    }
}

/// `--iterations N` runs exactly N iterations on every thread: python-objects allocates 500 per
/// iteration (its step event starts an iteration, so stopping at the N-th step lost one).
#[test]
fn iterations_are_exact_on_every_thread() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let w = Source::open(Some(std::path::Path::new(&format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"))))).unwrap();
    for (threads, cross) in [(1, false), (2, false), (2, true)] {
        let mut o = opts(threads, cross);
        o.driver.iterations = Some(40);
        o.driver.touch = false;
        let r = cpu::run(&w, CpuAllocator::by_name("system").unwrap(), &o).unwrap();
        assert_eq!(r.work.allocs, 40 * 500 * threads as u64, "{threads} thread(s), cross {cross}");
        assert_eq!(r.iterations, 40);
        assert_eq!(r.work.frees, r.work.allocs);
    }
}

/// What an allocator retains is read while its threads live: a worker's exit would hand its
/// caches back (jemalloc purges a dying thread's pages), which a long-lived serving thread never
/// does. jemalloc keeps freed pages for its 10 s decay, so right after the last free most of the
/// run's growth is still resident; its purge gives it back. The run's wall time ends at the last
/// free, not after the drain.
#[test]
fn retained_is_read_while_the_workers_live() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let w = Source::open(Some(std::path::Path::new(&format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"))))).unwrap();
    let mut o = opts(1, false);
    o.driver.iterations = Some(100);
    o.drain = Duration::from_millis(1200);
    let r = cpu::run(&w, CpuAllocator::by_name("jemalloc").unwrap(), &o).unwrap();
    let growth = r.peak_rss as f64 - r.rss_before as f64;
    assert!(growth > 20.0 * 1048576.0, "the run grew RSS by {growth} B");
    assert!(r.retained as f64 > 0.5 * growth, "retained {} of a {growth} B growth: read after the workers exited?", r.retained);
    assert!(r.retained_after_drain.iter().all(|d| d.retained as f64 > 0.5 * growth), "{:?}", r.retained_after_drain);
    assert!(r.retained_after_trim.unwrap() < r.retained / 2, "the purge gives the pages back: {:?} of {}", r.retained_after_trim, r.retained);
    assert!(r.wall_s < 1.0 && r.drain_s >= 1.2, "wall {} s excludes the {} s drain", r.wall_s, r.drain_s);
}

/// The trim runs on the worker threads that allocated, not only on the main thread: mimalloc's
/// `mi_collect` frees the calling thread's heap alone, so a preloaded mimalloc trimmed from the
/// main thread gave back nothing of the worker's memory.
#[test]
fn the_trim_runs_on_the_threads_that_allocated() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_, path, package)) = allocbench::cpu::preload::PRELOAD_LIBRARIES.iter().find(|(n, _, _)| *n == "mimalloc") else { panic!("mimalloc is listed") };
    if !std::path::Path::new(path).exists() {
        common::skip("mimalloc preload", &format!("{path} is not installed (apt-get install {package})"), "ALLOCBENCH_REQUIRE_PRELOAD");
        return;
    }
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    for threads in ["1", "2"] {
        let out = bin()
            .env("LD_PRELOAD", path)
            .args(["cpu", &w, "--allocator", "system", "--iterations", "100", "--threads", threads, "--json", "-"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["trim_call"], "mi_collect(true)", "{threads} thread(s)");
        let (retained, after) = (v["retained"].as_f64().unwrap(), v["retained_after_trim"].as_f64().unwrap());
        assert!(retained > 20.0 * 1048576.0 && after < 0.8 * retained, "{threads} thread(s): retained {retained} B, after the trim {after} B");
    }
}

/// The drain keeps sampling after the last free, reads retained at 0.1 and 1 s, then trims.
#[test]
fn drain_reads_retained_at_checkpoints_then_trims() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let mut o = opts(1, false);
    o.drain = Duration::from_millis(1200);
    let r = cpu::run(&python_like("drain", 10, 400, 200, 300), CpuAllocator::by_name("system").unwrap(), &o).unwrap();
    let at: Vec<f64> = r.retained_after_drain.iter().map(|d| d.after_s).collect();
    assert_eq!(at, vec![0.1, 1.0], "checkpoints the 1.2 s drain reaches");
    assert!(r.drain_s >= 1.2, "drained {} s", r.drain_s);
    let last = r.rss_timeline.last().unwrap().t_s;
    assert!(last >= r.wall_s + 1.0, "sampling went on into the drain: last sample at {last} s, run {} s", r.wall_s);
    assert_eq!(r.trim_call.as_deref(), Some("malloc_trim(0)"));
    assert!(r.retained_after_trim.is_some());
}

fn python_script(name: &str) -> String {
    format!("{}/workloads/python/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Every shipped Python program runs under all four allocators with proof of which malloc served
/// it and an RSS timeline; repetitions interleave.
#[test]
fn exec_runs_the_python_workloads_under_every_allocator() {
    let missing: Vec<&str> =
        allocbench::cpu::preload::PRELOAD_LIBRARIES.iter().filter(|(_, p, _)| !std::path::Path::new(p).exists()).map(|(n, _, _)| *n).collect();
    if !missing.is_empty() {
        common::skip(
            "exec under every allocator",
            &format!("{missing:?} not installed (apt-get install libjemalloc2 libtcmalloc-minimal4 libmimalloc2.0)"),
            "ALLOCBENCH_REQUIRE_PRELOAD",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (script, args) in [
        ("object_churn.py", vec!["--steps", "300", "--drain", "0.3"]),
        ("tokenizer_loader.py", vec!["--batches", "20"]),
        ("serving_loop.py", vec!["--bursts", "3"]),
    ] {
        let out = dir.path().join(format!("{script}.jsonl"));
        let reps = if script == "object_churn.py" { "2" } else { "1" };
        let mut cmd = bin();
        cmd.args([
            "cpu",
            "--exec",
            "--allocator",
            "all",
            "--reps",
            reps,
            "--sample-ms",
            "5",
            "--jsonl",
            out.to_str().unwrap(),
            "--",
            "python3",
            &python_script(script),
        ]);
        let run = cmd.args(&args).output().unwrap();
        assert!(run.status.success(), "{script}: {}", String::from_utf8_lossy(&run.stderr));
        let recs = allocbench::results::read_results(&out).unwrap();
        let runs: Vec<_> = recs.iter().map(|r| if let allocbench::results::ResultRecord::CpuExec(e) = r { e } else { panic!("not cpu_exec") }).collect();
        let order: Vec<&str> = runs.iter().map(|r| r.allocator.as_str()).collect();
        let expected: Vec<&str> = std::iter::repeat_n(["glibc", "jemalloc", "tcmalloc", "mimalloc"], reps.parse().unwrap()).flatten().collect();
        assert_eq!(order, expected, "{script}: interleaved repetitions");
        for r in runs {
            assert!(r.verified(), "{script} under {}: served by {:?}", r.allocator, r.served_by);
            assert_eq!(r.exit_code, 0);
            match r.allocator.as_str() {
                "glibc" => assert!(r.served_by_library.as_deref().unwrap().contains("libc.so"), "{:?}", r.served_by_library),
                other => assert!(r.served_by_library.as_deref().unwrap().contains(other), "{:?}", r.served_by_library),
            }
            assert!(r.rss.len() >= 5, "{script}: {} RSS samples", r.rss.len());
            assert!(r.rss.windows(2).all(|w| w[0].0 < w[1].0), "time goes forward");
            let sampled_peak = r.rss.iter().map(|s| s.1).max().unwrap();
            assert!(r.peak_rss_bytes >= sampled_peak && sampled_peak > 4 << 20, "{script}: peak {} sampled {sampled_peak}", r.peak_rss_bytes);
            assert!(r.user_s + r.sys_s > 0.0 && r.minor_faults > 0 && r.wall_s > 0.0);
        }
    }
}

/// The RSS of the whole process tree is summed: a shell whose two children each hold memory
/// shows more than any one process.
#[test]
fn exec_samples_the_whole_process_tree() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tree.jsonl");
    let hold = "b = bytearray(48 << 20); b[::4096] = b'\\x01' * len(b[::4096]); import time; time.sleep(0.6)";
    let script = format!("python3 -c \"{hold}\" & python3 -c \"{hold}\" & wait");
    let run = bin().args(["cpu", "--exec", "--allocator", "glibc", "--jsonl", out.to_str().unwrap(), "--", "sh", "-c", &script]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let recs = allocbench::results::read_results(&out).unwrap();
    let allocbench::results::ResultRecord::CpuExec(r) = &recs[0] else { panic!() };
    assert!(r.max_processes >= 3, "sh and two pythons: {}", r.max_processes);
    assert!(r.peak_rss_bytes > 96 << 20, "two children holding 48 MiB each: peak {}", r.peak_rss_bytes);
    assert_eq!(r.served_by.as_deref(), Some("glibc"));
}

/// A command that cannot start is one line and exit 2, before any run; one that fails is
/// recorded with its exit code, the others still run, and the exit status says so (1); a .so
/// that is not an allocator or does not load is one line and exit 2.
#[test]
fn exec_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bad.jsonl");
    let not_executable = dir.path().join("script.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    for (program, want) in [
        ("/no/such/program".to_string(), "error: /no/such/program: no such program".to_string()),
        ("no-such-program-on-path".into(), "error: no-such-program-on-path: no such program on PATH".into()),
        (dir.path().display().to_string(), format!("error: {}: is a directory, not a program", dir.path().display())),
        (not_executable.display().to_string(), format!("error: {}: is not executable", not_executable.display())),
    ] {
        let run = bin().args(["cpu", "--exec", "--allocator", "glibc", "--jsonl", out.to_str().unwrap(), "--", &program]).output().unwrap();
        let said = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{said}");
        assert!(said.trim().starts_with(&want) && said.trim().lines().count() == 1, "{said}");
        assert!(!out.exists() || std::fs::read_to_string(&out).unwrap().is_empty(), "nothing ran");
    }
    // On PATH but not executable: said where; PATH unset: /bin:/usr/bin, as execvp searches.
    let on_path = tempfile::tempdir().unwrap();
    std::fs::write(on_path.path().join("myprog"), "#!/bin/sh\n").unwrap();
    let run = bin().env("PATH", on_path.path()).args(["cpu", "--exec", "--allocator", "glibc", "--", "myprog"]).output().unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{said}");
    assert!(said.contains(&format!("error: myprog: found at {}, which is not executable", on_path.path().join("myprog").display())), "{said}");
    let run = bin().env_remove("PATH").args(["cpu", "--exec", "--allocator", "glibc", "--", "sh", "-c", "exit 0"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run =
        bin().args(["cpu", "--exec", "--allocator", "glibc", "--reps", "2", "--jsonl", out.to_str().unwrap(), "--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(run.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("2 of 2 runs exited with a non-zero status (the first: exit 3 under glibc)"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let recs = allocbench::results::read_results(&out).unwrap();
    assert_eq!(recs.len(), 2, "every repetition still ran and was kept");
    let allocbench::results::ResultRecord::CpuExec(r) = &recs[0] else { panic!() };
    assert_eq!(r.exit_code, 3);

    let not_elf = dir.path().join("libnot.so");
    std::fs::write(&not_elf, "not a library").unwrap();
    let libm = "/usr/lib/x86_64-linux-gnu/libm.so.6";
    let mut cases: Vec<(String, &str)> =
        vec![(not_elf.display().to_string(), "fails to load"), ("/no/such/lib.so".into(), "cannot preload it"), ("hoard".into(), "unknown allocator 'hoard'")];
    if std::path::Path::new(libm).exists() {
        cases.push((libm.into(), "is not an allocator"));
    }
    for (alloc, want) in cases {
        let run = bin().args(["cpu", "--exec", "--allocator", &alloc, "--", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{alloc}: {err}");
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{alloc}: {err}");
    }
    let run = bin().args(["cpu", "--exec"]).output().unwrap();
    assert_eq!(run.status.code(), Some(2), "--exec without a command");
}

/// Ctrl-C stops the running program and keeps every finished run.
#[test]
fn exec_interrupted_keeps_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("int.jsonl");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args([
            "cpu",
            "--exec",
            "--allocator",
            "glibc",
            "--reps",
            "5",
            "--jsonl",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "sleep 0.3 && [ ! -e STOP ] || sleep 30",
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Two quick runs finish; then every later run sleeps 30 s and is stopped by Ctrl-C.
    std::thread::sleep(Duration::from_millis(900));
    std::fs::write(dir.path().join("STOP"), "").unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let t = std::time::Instant::now();
    // SAFETY: kill(2) takes two integers and touches no memory of ours; the pid is our child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "the program was stopped");
    assert_eq!(status.code(), Some(130));
    let recs = allocbench::results::read_results(&out).unwrap();
    assert!(!recs.is_empty() && recs.len() < 5, "{} finished runs", recs.len());
    for r in &recs {
        let allocbench::results::ResultRecord::CpuExec(r) = r else { panic!() };
        assert_eq!(r.exit_code, 0);
        assert!(!r.interrupted);
    }
}

/// Every in-process allocator of `--allocator all` runs in its own process, and `--reps`
/// interleaves them.
#[test]
fn in_process_allocators_run_in_their_own_processes() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all.jsonl");
    let run = bin().args(["cpu", &w, "--allocator", "all", "--reps", "2", "--iterations", "20", "--jsonl", out.to_str().unwrap()]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let recs = allocbench::results::read_results(&out).unwrap();
    let runs: Vec<_> = recs.iter().map(|r| if let allocbench::results::ResultRecord::CpuRun(c) = r { c } else { panic!() }).collect();
    let order: Vec<&str> = runs.iter().map(|r| r.allocator.as_str()).collect();
    assert_eq!(order, ["glibc", "jemalloc", "mimalloc", "glibc", "jemalloc", "mimalloc"]);
    let mut pids: Vec<u32> = runs.iter().map(|r| r.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 6, "one process per run");
    assert!(String::from_utf8_lossy(&run.stdout).contains("95 % CI"));
}

/// A child of a multi-allocator run killed by a signal (the OOM killer's SIGKILL) is named with its
/// signal; the runs that finished are written to `--json` and `--jsonl`, the next allocator still
/// runs, and the exit status says how the child died (128 + 9).
#[test]
fn a_killed_allocator_run_is_named_and_the_others_kept() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let (json, jsonl) = (dir.path().join("r.json"), dir.path().join("r.jsonl"));
    let parent = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["cpu", &w, "--allocator", "system,system", "--duration", "2", "--drain", "0"])
        .args(["--json", json.to_str().unwrap(), "--jsonl", jsonl.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let children = |pid: u32| -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok()?.parse::<i32>().ok())
            .filter(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok()) == Some(pid)
            })
            .collect()
    };
    let t = std::time::Instant::now();
    let first = loop {
        if let Some(&c) = children(parent.id()).first() {
            break c;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no child started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // SAFETY: kill(2) on the child process this test's child started.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    let out = parent.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + 9), "{err}");
    assert!(err.contains("the system run was killed by signal 9: the kernel's OOM killer sends it; its result is missing"), "{err}");
    for file in [&json, &jsonl] {
        let recs = allocbench::results::read_results(file).unwrap();
        assert_eq!(recs.len(), 1, "the second run, finished: {}", file.display());
        assert!(matches!(&recs[0], allocbench::results::ResultRecord::CpuRun(r) if !r.interrupted && r.pid != first as u32));
    }
}

/// Run bounds a run cannot meet are refused in one line with exit 2, never a panic or a run that
/// never ends: a duration that is not a positive number of seconds, zero iterations or sampling
/// period, and iterations on an input without step events (passes would repeat forever).
#[test]
fn impossible_run_bounds_are_refused() {
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let no_steps = dir.path().join("no-steps.toml");
    std::fs::write(&no_steps, "name = \"no-steps\"\n[scenario]\nevents = [{ op = \"alloc\", id = 1, bytes = \"1MiB\" }, { op = \"free\", id = 1 }]\n").unwrap();
    let no_steps = no_steps.to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (&[&w, "--duration", "nan"], "bad duration 'nan'"),
        (&[&w, "--duration=-1"], "bad duration '-1'"),
        (&[&w, "--duration", "inf"], "bad duration 'inf'"),
        (&[&w, "--duration", "0"], "bad duration '0'"),
        (&[&w, "--iterations", "0"], "--iterations"),
        (&[&w, "--sample-ms", "0"], "--sample-ms"),
        (&[&w, "--cross-thread", "--iterations", "3"], "--cross-thread: needs --threads 2 or more"),
        (&[no_steps, "--allocator", "system", "--iterations", "3"], "no step events"),
        (&[no_steps, "--allocator", "system,mimalloc", "--iterations", "3", "--threads", "2", "--cross-thread"], "use --duration"),
    ];
    for (args, want) in cases {
        let out = bin().arg("cpu").args(args).timeout(Duration::from_secs(60)).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// With `--json -` stdout carries only the records: the program's own output, the per-run lines
/// and the drift summary go to stderr.
#[test]
fn json_to_stdout_holds_only_records() {
    let _serial = RSS_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let runs: [(&[&str], usize); 2] = [
        (&["cpu", "--exec", "--allocator", "glibc", "--reps", "2", "--json", "-", "--", "sh", "-c", "echo program output; echo more"], 2),
        (&["cpu", &w, "--allocator", "system,mimalloc", "--iterations", "5", "--json", "-"], 2),
    ];
    for (args, n) in runs {
        let out = bin().args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), n, "{args:?}: {stdout}");
        for l in lines {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{args:?}: not a record ({e}): {l}"));
            assert!(v["type"] == "cpu_exec" || v["type"] == "cpu_run", "{l}");
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("program output") || stderr.contains("drift"), "{args:?}: what stdout would have held is on stderr: {stderr}");
    }
}

/// A statically linked program cannot be preloaded: that is said up front and for every run
/// (Debian's ldconfig is static-pie), and its runs are kept unproven.
#[test]
fn exec_says_a_static_program_cannot_be_preloaded() {
    let ldconfig = "/sbin/ldconfig";
    let linked = std::process::Command::new("file").arg("-L").arg(ldconfig).output().map(|o| String::from_utf8_lossy(&o.stdout).contains("static"));
    if !matches!(linked, Ok(true)) {
        common::skip("static program", &format!("{ldconfig} is not a static binary here (or `file` is missing)"), "ALLOCBENCH_REQUIRE_STATIC_PROGRAM");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("static.jsonl");
    let run = bin().args(["cpu", "--exec", "--allocator", "glibc", "--jsonl", out.to_str().unwrap(), "--", ldconfig, "-p"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains(&format!("{ldconfig} is statically linked: LD_PRELOAD cannot")), "{err}");
    assert!(err.contains(&format!("not labelled glibc: {ldconfig} is statically linked")), "{err}");
    let recs = allocbench::results::read_results(&out).unwrap();
    let allocbench::results::ResultRecord::CpuExec(r) = &recs[0] else { panic!() };
    assert_eq!(r.served_by, None);
    // A dynamic program is not called static.
    let run = bin().args(["cpu", "--exec", "--allocator", "glibc", "--", "sh", "-c", "sleep 0.2"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&run.stderr).contains("statically linked"), "{}", String::from_utf8_lossy(&run.stderr));
}

/// Ctrl-C in `scripts/compare.sh` (to its whole process group, as a terminal sends it) keeps the
/// runs that finished in `cpu.jsonl` and stops with 130 instead of going on to the next program.
#[test]
fn compare_script_keeps_finished_runs_on_ctrl_c() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    // Quick the first time (one run finishes), then slow: Ctrl-C lands in the second run.
    let prog = dir.path().join("slow_second.py");
    std::fs::write(
        &prog,
        "import os, time\nflag = os.path.join(os.path.dirname(__file__), 'ran')\nif os.path.exists(flag):\n    time.sleep(30)\nopen(flag, 'w').close()\n",
    )
    .unwrap();
    let other = dir.path().join("never.py");
    std::fs::write(&other, "print('should not run')\n").unwrap();
    let out = dir.path().join("out");
    let child = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/compare.sh"))
        .args(["--reps", "2", "--out", out.to_str().unwrap(), prog.to_str().unwrap(), other.to_str().unwrap()])
        .env("ALLOCBENCH", assert_cmd::cargo::cargo_bin("allocbench"))
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while !dir.path().join("ran").exists() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) takes two integers and touches no memory of ours; the negative pid is the process group our child leads (`process_group(0)`),
    // not yet waited for.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{err}");
    assert!(err.contains("finished runs are in"), "{err}");
    let recs = allocbench::results::read_results(&out.join("cpu.jsonl")).unwrap();
    assert!(!recs.is_empty(), "the finished run was kept");
    for r in &recs {
        let allocbench::results::ResultRecord::CpuExec(r) = r else { panic!() };
        assert_eq!(r.name, "slow_second.py", "the next program did not start");
    }
    assert!(!out.join("cpu.jsonl.part").exists());
}

/// `scripts/compare.sh` takes paths as the caller gave them (relative to where it was started,
/// not to the repository), passes a program after `--` its arguments, and goes on after a program
/// that fails under one allocator: the failed run is kept with its exit code, the next program
/// still runs, and the script exits 1 naming the failure. Bad arguments stop it before any run.
#[test]
fn compare_script_goes_on_after_a_failure_with_the_callers_paths_and_arguments() {
    let dir = tempfile::tempdir().unwrap();
    // Fails under glibc alone (its run has no LD_PRELOAD).
    std::fs::write(dir.path().join("fails_under_glibc.py"), "import os, sys\nsys.exit(0 if os.environ.get('LD_PRELOAD') else 3)\n").unwrap();
    std::fs::write(
        dir.path().join("args.py"),
        "import json, os, sys\nwith open(os.path.join(os.path.dirname(__file__), 'seen'), 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n",
    )
    .unwrap();
    let compare = |args: &[&str]| {
        std::process::Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/compare.sh"))
            .args(args)
            .current_dir(dir.path())
            .env("ALLOCBENCH", assert_cmd::cargo::cargo_bin("allocbench"))
            .output()
            .unwrap()
    };
    let run = compare(&["--reps", "1", "--out", "out", "fails_under_glibc.py", "--", "args.py", "two words", "--flag"]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("fails_under_glibc.py (exit 1)") && err.contains("1 failed"), "{err}");
    let recs = allocbench::results::read_results(&dir.path().join("out/cpu.jsonl")).unwrap();
    let runs: Vec<_> = recs.iter().map(|r| if let allocbench::results::ResultRecord::CpuExec(r) = r { r } else { panic!("an exec run") }).collect();
    let of = |name: &str| runs.iter().filter(|r| r.name == name).collect::<Vec<_>>();
    let (failing, with_args) = (of("fails_under_glibc.py"), of("args.py"));
    assert!(!failing.is_empty() && failing.len() == with_args.len(), "every allocator ran both programs: {} and {}", failing.len(), with_args.len());
    for r in failing {
        assert_eq!(r.exit_code, if r.allocator == "glibc" { 3 } else { 0 }, "{}", r.allocator);
    }
    assert!(with_args.iter().all(|r| r.exit_code == 0));
    let seen = std::fs::read_to_string(dir.path().join("seen")).unwrap();
    assert_eq!(seen.lines().count(), with_args.len(), "{seen}");
    assert!(seen.lines().all(|l| l == r#"["two words", "--flag"]"#), "{seen}");
    // Bad arguments: refused before anything runs (no results folder is made).
    for (args, want) in [
        (&["--reps", "abc", "args.py"][..], "--reps must be a whole number"),
        (&["--reps"][..], "--reps needs a value"),
        (&["--scale", "3", "args.py"][..], "--scale must be"),
        (&["--out", "never", "args.py", "missing.py"][..], "no such program: "),
        (&["--out", "never", "--", "no-such-command-here"][..], "no such command on PATH"),
        (&["notes.txt"][..], "neither a workload"),
    ] {
        let run = compare(args);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want) && err.lines().count() == 1, "{args:?}: {err}");
    }
    assert!(!dir.path().join("never").exists());
}

/// A program that dies of SIGINT (Ctrl-C reaches the whole process group, and the program may die
/// before allocbench sees it) is a stopped run, not a result: nothing more runs, exit 130.
#[test]
fn a_program_stopped_by_ctrl_c_is_not_a_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("int.jsonl");
    let run = bin()
        .args(["cpu", "--exec", "--allocator", "glibc", "--reps", "3", "--jsonl", out.to_str().unwrap(), "--", "sh", "-c", "kill -INT $$"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(130), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(String::from_utf8_lossy(&run.stderr).contains("interrupted: 0 finished run(s) kept"));
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default(), "", "the stopped run is not written");
}
