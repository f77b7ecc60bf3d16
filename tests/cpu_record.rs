//! `allocbench cpu --record` and the replay of what it recorded: a program of known calls
//! (threads, a free on another thread, realloc, calloc, aligned blocks, a forked child, an exec)
//! is recorded and its trace checked call by call; a killed program's trace is kept and marked;
//! damaged traces are refused naming the offset; the replay makes the recorded calls.

use std::path::{Path, PathBuf};

use allocbench::cpu::recorded::{Call, RecordedTrace};
use assert_cmd::Command;

fn bin() -> Command {
    Command::cargo_bin("allocbench").unwrap()
}

/// A program whose calls are known: compiled with g++ into `dir`.
const PROGRAM: &str = r#"
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <unistd.h>
#include <sys/wait.h>
#include <csignal>

static void *blocks[1000];
static void *made(void *) {
    for (int i = 0; i < 1000; i++) { blocks[i] = malloc(777); memset(blocks[i], 1, 777); }
    return nullptr;
}
int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == 'k') { void *p = malloc(4242); (void)p; raise(SIGKILL); }
    pthread_t t;
    pthread_create(&t, nullptr, made, nullptr);
    pthread_join(t, nullptr);
    for (int i = 0; i < 1000; i++) free(blocks[i]);     // freed on another thread than made
    void *c = calloc(10, 1234);                          // 12340 bytes, zeroed
    void *a = nullptr;
    posix_memalign(&a, 4096, 5000);
    void *r = malloc(100);
    r = realloc(r, 200000);
    r = realloc(r, 300);
    free(c); free(a); free(r);
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 10; i++) free(malloc(333));
        _exit(0);
    }
    waitpid(pid, nullptr, 0);
    if (fork() == 0) { execlp("true", "true", (char *)nullptr); _exit(1); }
    wait(nullptr);
    return 0;
}
"#;

fn build_program(dir: &Path) -> PathBuf {
    let src = dir.join("prog.cpp");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("prog");
    let out = std::process::Command::new("g++").args(["-O0", "-fno-builtin", "-pthread"]).arg(&src).arg("-o").arg(&exe).output().expect("g++ runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// The program of known calls, built, and recorded into `dir/prog.abt`.
fn recorded_program(dir: &Path) -> (PathBuf, PathBuf) {
    let exe = build_program(dir);
    let trace = dir.join("prog.abt");
    let out = bin().args(["cpu", "--record", "-o"]).arg(&trace).arg("--").arg(&exe).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (exe, trace)
}

/// The JSON Lines a command printed, after checking that it succeeded.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_recording_holds_every_call_with_its_thread_and_block() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let trace = dir.path().join("prog.abt");
    let out = bin().args(["cpu", "--record", "-o"]).arg(&trace).arg("--").arg(&exe).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("recorded"), "{stdout}");
    let t = RecordedTrace::read(&trace).unwrap();
    assert_eq!(t.info.exit_code, 0);
    assert!(t.info.incomplete.is_none());
    assert!(!t.info.rss.is_empty(), "the tree's RSS over time");
    // The program, its forked child (which frees what it made) and nothing else with calls
    // (`true` allocates nothing, or little).
    let main = &t.calls[0];
    assert_eq!(t.info.processes[0].cmdline, vec![exe.display().to_string()]);
    assert_eq!(t.info.processes[0].threads, 2);
    let made: Vec<_> = main.iter().enumerate().filter(|(_, c)| c.call == Call::Malloc { bytes: 777 }).collect();
    assert_eq!(made.len(), 1000);
    // Ids are implicit: the n-th creating call makes block n.
    let mut id_of_index = std::collections::HashMap::new();
    let mut next = 0u64;
    for (i, c) in main.iter().enumerate() {
        if c.call.creates() {
            id_of_index.insert(i, next);
            next += 1;
        }
    }
    let maker = made[0].1.thread;
    assert!(made.iter().all(|(_, c)| c.thread == maker));
    for (i, _) in &made {
        let id = id_of_index[i];
        let free = main.iter().find(|c| c.call == Call::Free { id }).expect("each block is freed");
        assert_ne!(free.thread, maker, "freed on the main thread, not the maker");
    }
    assert!(main.iter().any(|c| c.call == Call::Calloc { bytes: 12340 }));
    assert!(main.iter().any(|c| c.call == Call::Aligned { align_log2: 12, bytes: 5000 }));
    // realloc(malloc(100), 200000) then to 300: each gives back the block before.
    let m100 = main.iter().position(|c| c.call == Call::Malloc { bytes: 100 }).unwrap();
    let r1 = main.iter().position(|c| c.call == Call::Realloc { old: Some(id_of_index[&m100]), bytes: 200000 }).expect("the first realloc");
    assert!(main.iter().any(|c| c.call == Call::Realloc { old: Some(id_of_index[&r1]), bytes: 300 }), "the second realloc");
    // Times never run backwards on one thread.
    for th in 0..2 {
        let ts: Vec<u64> = main.iter().filter(|c| c.thread == th).map(|c| c.t_ns).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    }
    let child = t.info.processes.iter().position(|p| {
        p.ppid == t.info.processes[0].pid
            && t.calls[t.info.processes.iter().position(|q| q == p).unwrap()].iter().any(|c| c.call == Call::Malloc { bytes: 333 })
    });
    let child = child.expect("the forked child is recorded as its own process");
    let c333: Vec<_> = t.calls[child].iter().filter(|c| c.call == Call::Malloc { bytes: 333 }).collect();
    assert_eq!(c333.len(), 10);
    assert_eq!(
        t.calls[child].iter().filter(|c| matches!(c.call, Call::Free { .. })).count(),
        10,
        "the child's frees of blocks it made; the parent's inherited ones are not its"
    );
}

#[test]
fn a_killed_programs_trace_is_kept_and_marked() {
    let dir = tempfile::tempdir().unwrap();
    let exe = build_program(dir.path());
    let trace = dir.path().join("killed.abt");
    let out = bin().args(["cpu", "--record", "-o"]).arg(&trace).arg("--").arg(&exe).arg("kill").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("marked incomplete"), "{stderr}");
    let t = RecordedTrace::read(&trace).unwrap();
    assert_eq!(t.info.exit_code, 128 + 9);
    assert!(t.info.incomplete.as_deref().unwrap().contains("signal 9"), "{:?}", t.info.incomplete);
}

#[test]
fn the_replay_makes_the_recorded_calls_under_each_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trace) = recorded_program(dir.path());
    let t = RecordedTrace::read(&trace).unwrap();
    let creates: u64 = t.calls.iter().flatten().filter(|c| c.call.creates()).count() as u64;
    let gives: u64 = t.calls.iter().flatten().filter(|c| matches!(c.call, Call::Free { .. } | Call::Realloc { old: Some(_), .. })).count() as u64;
    let allocators = if Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").exists() { "glibc,jemalloc" } else { "glibc" };
    let out = bin().args(["cpu"]).arg(&trace).args(["--allocator", allocators, "--json", "-"]).output().unwrap();
    let runs = json_lines(&out);
    assert_eq!(runs.len(), allocators.split(',').count());
    for (r, name) in runs.iter().zip(allocators.split(',')) {
        assert_eq!(r["allocator"], name, "labelled by what served it");
        assert_eq!(r["workload"]["kind"], "recorded");
        assert_eq!(r["work"]["allocs"], creates);
        // Every block is freed: given back as recorded, or what was left at the end.
        assert_eq!(r["work"]["frees"].as_u64().unwrap(), creates, "{gives} given back in the trace, the rest at the end");
        assert_eq!(r["cross_thread"], true);
        assert!(r["peak_rss"].as_u64().unwrap() >= r["rss_before"].as_u64().unwrap() + 700 * 1000);
    }
}

#[test]
fn damaged_traces_are_one_line_naming_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trace) = recorded_program(dir.path());
    let good = std::fs::read(&trace).unwrap();
    let cut = dir.path().join("cut.abt");
    std::fs::write(&cut, &good[..good.len() - 100]).unwrap();
    let out = bin().args(["cpu"]).arg(&cut).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("cut.abt") && e.contains("truncated") && e.contains("at byte"), "{e}");
    let bad = dir.path().join("bad.abt");
    let mut b = good.clone();
    let n = b.len();
    b[n - 10] ^= 0xff;
    std::fs::write(&bad, &b).unwrap();
    let out = bin().args(["cpu"]).arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("checksum") && e.contains("at byte"), "{e}");
    // Flags that make no sense for a recording are refused.
    let out = bin().args(["cpu"]).arg(&trace).args(["--scale", "1/4"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not with a recorded trace"));
}

#[test]
fn settings_are_configs_recorded_with_each_run_and_typos_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, trace) = recorded_program(dir.path());
    // A replay: the default and the config, each labelled with what was in force.
    let out = bin().args(["cpu"]).arg(&trace).args(["--allocator", "glibc", "--settings", "glibc:arena_max=1,tcache_count=0", "--json", "-"]).output().unwrap();
    let runs = json_lines(&out);
    assert_eq!(runs.len(), 2);
    assert!(runs[0].get("settings").is_none());
    assert_eq!(runs[1]["settings"], serde_json::json!(["GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0", "MALLOC_ARENA_MAX=1"]));
    // The same for a program run with --exec, whose environment had it.
    let out =
        bin().args(["cpu", "--exec", "--allocator", "glibc", "--settings", "glibc:mmap_threshold=65536", "--json", "-", "--"]).arg(&exe).output().unwrap();
    let runs = json_lines(&out);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1]["settings"], serde_json::json!(["GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536"]));
    // A typo is refused with the names there are, before anything runs.
    let out = bin().args(["cpu"]).arg(&trace).args(["--settings", "glibc:arena_maks=1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("'arena_maks'") && e.contains("arena_max"), "{e}");
    if Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2").exists() {
        let out = bin().args(["cpu"]).arg(&trace).args(["--settings", "jemalloc:dirty_decay=0"]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("dirty_decay_ms"));
    } else {
        eprintln!("SKIPPED the jemalloc half: libjemalloc2 is not installed (CI installs it)");
    }
}

#[test]
fn a_long_run_replays_the_trace_pass_after_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trace) = recorded_program(dir.path());
    let t = RecordedTrace::read(&trace).unwrap();
    let creates = t.calls.iter().flatten().filter(|c| c.call.creates()).count() as u64;
    let out = bin().args(["cpu"]).arg(&trace).args(["--allocator", "glibc", "--duration", "0.3", "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let passes = r["passes"].as_u64().unwrap();
    assert!(passes >= 2, "{passes} passes in 0.3 s");
    assert_eq!(r["iterations"].as_u64().unwrap(), passes);
    assert_eq!(r["work"]["allocs"].as_u64().unwrap(), passes * creates, "every pass makes every call");
    assert_eq!(r["work"]["frees"], r["work"]["allocs"], "what a pass leaves is freed before the next");
}

#[test]
fn cpu_advise_ranks_configs_and_prints_the_line_to_use() {
    let dir = tempfile::tempdir().unwrap();
    let (exe, trace) = recorded_program(dir.path());
    let runs = dir.path().join("runs.jsonl");
    let out = bin()
        .args(["cpu", "advise"])
        .arg(&trace)
        .args([
            "--allocator",
            "glibc",
            "--no-grid",
            "--settings",
            "glibc:arena_max=1",
            "--reps",
            "2",
            "--drain",
            "0",
            "--objective",
            "memory",
            "--json",
            "-",
            "--jsonl",
        ])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "cpu_advise");
    let c = v["candidates"].as_array().unwrap();
    assert_eq!(c.len(), 2, "glibc's defaults and the one config");
    assert!(c.iter().all(|c| c["runs"] == 2));
    let labels: Vec<&str> = c.iter().map(|c| c["label"].as_str().unwrap()).collect();
    assert!(labels.contains(&"glibc") && labels.contains(&"glibc GLIBC_TUNABLES=glibc.malloc.arena_max=1 MALLOC_ARENA_MAX=1"), "{labels:?}");
    // Memory: the recommendation holds no more steady RSS than the other, and is first.
    assert!(c[0]["steady_rss_bytes"].as_f64().unwrap() <= c[1]["steady_rss_bytes"].as_f64().unwrap());
    assert_eq!(v["line"], c[0]["line"]);
    let line = v["line"].as_str().unwrap();
    assert!(line == "nothing to set: glibc's defaults" || line == "GLIBC_TUNABLES=glibc.malloc.arena_max=1 MALLOC_ARENA_MAX=1", "{line}");
    // Every run was written as it finished, then the ranking.
    let lines = std::fs::read_to_string(&runs).unwrap();
    assert_eq!(lines.lines().count(), 5);
    assert!(lines.lines().take(4).all(|l| l.contains("\"type\":\"cpu_run\"") && l.contains("\"paced\":true")));
    // A program, run rather than replayed.
    let out = bin().args(["cpu", "advise", "--allocator", "glibc", "--no-grid", "--reps", "1", "--json", "-", "--"]).arg(&exe).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["candidates"].as_array().unwrap().len(), 1);
    assert_eq!(v["line"], "nothing to set: glibc's defaults");
    assert!(v["candidates"][0]["retained_bytes"].is_null(), "a program's retained memory is not measured");
    // Neither a trace nor a program.
    let out = bin().args(["cpu", "advise"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_report_shows_each_recorded_program_by_allocator_and_setting_with_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trace) = recorded_program(dir.path());
    let runs = dir.path().join("runs.jsonl");
    let out = bin()
        .args(["cpu"])
        .arg(&trace)
        .args(["--allocator", "glibc", "--settings", "glibc:arena_max=1", "--pace", "recorded", "--reps", "2", "--jsonl"])
        .arg(&runs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = dir.path().join("report");
    let out = bin().args(["report"]).arg(&runs).arg("-o").arg(&report).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(report.join("README.md")).unwrap();
    assert!(md.contains("Recorded programs, replayed at their recorded pace"), "{md}");
    assert!(md.contains("| glibc GLIBC_TUNABLES=glibc.malloc.arena_max=1 MALLOC_ARENA_MAX=1 | 2 |"), "{md}");
    assert!(md.contains("(recorded, ") && md.contains("replayed at its pace): "), "a finding per program: {md}");
    assert!(
        report.join("cpu-recorded-rss-prog.svg").exists()
            || std::fs::read_dir(&report).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().starts_with("cpu-recorded-rss-"))
    );
}

#[test]
fn a_program_linked_with_its_own_allocator_keeps_it_under_the_recorder() {
    // Debian's redis-server links jemalloc and asks it malloc_usable_size of what malloc gave: the
    // recorder must pass the calls on to that allocator, not to glibc's.
    let jemalloc = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    if !jemalloc.exists() {
        eprintln!("SKIPPED: libjemalloc2 is not installed (CI installs it)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("linked.cpp");
    std::fs::write(
        &src,
        r#"#include <cstdlib>
#include <cstdio>
extern "C" size_t malloc_usable_size(void *);
extern "C" int mallctl(const char *, void *, size_t *, void *, size_t);
int main() {
    size_t total = 0;
    for (int i = 0; i < 1000; i++) { void *p = malloc(100 + i); total += malloc_usable_size(p); free(p); }
    const char *version; size_t len = sizeof version;
    if (mallctl("version", &version, &len, nullptr, 0) != 0) return 3;
    printf("usable %zu jemalloc %s\n", total, version);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("linked");
    let out = std::process::Command::new("g++").arg("-O0").arg(&src).arg("-o").arg(&exe).arg(jemalloc).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = dir.path().join("linked.abt");
    let out = bin().args(["cpu", "--record", "-o"]).arg(&trace).arg("--").arg(&exe).output().unwrap();
    assert!(out.status.success(), "the program must not crash under the recorder: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("jemalloc 5."));
    let t = RecordedTrace::read(&trace).unwrap();
    let sized: Vec<u64> =
        t.calls[0].iter().filter_map(|c| if let Call::Malloc { bytes } = c.call { Some(bytes) } else { None }).filter(|b| (100..1100).contains(b)).collect();
    assert!(sized.len() >= 1000, "{} of the 1,000 mallocs", sized.len());
}

#[test]
fn the_shipped_recordings_read_and_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/recorded");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".abt.gz") {
            continue;
        }
        let t = RecordedTrace::read(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.info.exit_code, 0, "{}", path.display());
        assert!(t.total_calls() > 100_000, "{}: {} calls", path.display(), t.total_calls());
        let creates = t.calls.iter().flatten().filter(|c| c.call.creates()).count() as u64;
        let out = bin().args(["cpu"]).arg(&path).args(["--allocator", "glibc", "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["work"]["allocs"].as_u64().unwrap(), creates, "{}", path.display());
        assert_eq!(r["work"]["frees"], r["work"]["allocs"]);
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
    }
    names.sort();
    assert_eq!(names, ["http-serving.abt.gz", "pyperformance-xml_etree.abt.gz", "redis-server.abt.gz", "tokenizers-bpe.abt.gz"]);
}

#[test]
fn threads_replay_copies_of_the_recording_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let (_, trace) = recorded_program(dir.path());
    let run = |threads: &str| -> serde_json::Value {
        let out = bin().args(["cpu"]).arg(&trace).args(["--allocator", "glibc", "--threads", threads, "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let (one, three) = (run("1"), run("3"));
    assert_eq!(three["work"]["allocs"].as_u64().unwrap(), 3 * one["work"]["allocs"].as_u64().unwrap());
    assert_eq!(three["threads"].as_u64().unwrap(), 3 * one["threads"].as_u64().unwrap());
    assert_eq!(three["work"]["peak_live_bytes"].as_u64().unwrap(), 3 * one["work"]["peak_live_bytes"].as_u64().unwrap(), "copies start together");
    let out = bin().args(["cpu"]).arg(&trace).args(["--threads", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_subprocess_started_with_vfork_loses_none_of_the_parents_calls() {
    // CPython's subprocess starts children with vfork: the child shares the parent's memory (its
    // buffers) until it execs, after closing the descriptors it does not pass on (the spool's).
    let python = match std::process::Command::new("python3").args(["-c", "import sys; print(sys.executable)"]).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            eprintln!("SKIPPED: no python3");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("py.abt");
    let script = "keep = [bytearray(777) for _ in range(300)]\nimport subprocess\nfor _ in range(3): subprocess.run(['true'])\nmore = [bytearray(779) for _ in range(300)]\n";
    let out = bin().args(["cpu", "--record", "-o"]).arg(&trace).args(["--", &python, "-c", script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = RecordedTrace::read(&trace).unwrap();
    let count = |n: u64| t.calls[0].iter().filter(|c| c.call == Call::Malloc { bytes: n }).count();
    // bytearray(n) asks for n + 1 bytes.
    // (The interpreter may ask for one of these sizes itself too.)
    assert!(count(778) >= 300, "the calls before the subprocesses: {}", count(778));
    assert!(count(780) >= 300, "the calls after them: {}", count(780));
}
