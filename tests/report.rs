//! Reports: SVGs are XML with the expected series, rendering is deterministic, and results of
//! another schema version are refused with a clear error.

use std::path::{Path, PathBuf};

use allocbench::report;

fn fixture() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/results-small.jsonl"))
}

fn render(dir: &Path) -> Vec<String> {
    let records = report::load(&[fixture()]).unwrap();
    report::render(&records, dir, "fixture report").unwrap().into_iter().map(|c| c.file).collect()
}

#[test]
fn svgs_parse_and_name_their_series() {
    let dir = tempfile::tempdir().unwrap();
    let files = render(dir.path());
    for want in [
        "gpu-memory-model-switch.svg",
        "gpu-overhead.svg",
        "gpu-device-calls-model-switch.svg",
        "cpu-rss-python-objects.svg",
        "cpu-throughput-python-objects.svg",
        "cpu-drift-retained-python-objects.svg",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} missing from {files:?}");
    }
    assert!(files.iter().any(|f| f.starts_with("gpu-segments-model-switch-pytorch")), "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(dir.path().join(f)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{f} is not XML: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<String> = doc.descendants().filter(|n| n.has_tag_name("text")).filter_map(|n| n.text().map(str::to_string)).collect();
        assert!(!texts.is_empty(), "{f} has no text");
        let has = |s: &str| texts.iter().any(|t| t.contains(s));
        match f.as_str() {
            "gpu-memory-model-switch.svg" => {
                assert!(has("reserved: pytorch") && has("reserved: pytorch expandable_segments:True") && has("reserved: ideal"), "{texts:?}");
                assert!(has("allocated (live tensors)") && has("memory (GiB)") && has("step"), "{texts:?}");
            }
            "gpu-memory-pinned.svg" => assert!(has("OOM"), "the OOM point is marked: {texts:?}"),
            "cpu-rss-python-objects.svg" => assert!(has("glibc") && has("mimalloc") && has("time (s)") && has("RSS (MiB)"), "{texts:?}"),
            "cpu-throughput-python-objects.svg" => {
                assert!(has("M ops/s") && has("ns"), "{texts:?}")
            }
            "gpu-overhead.svg" => assert!(has("ideal = 1.0") && has("pytorch default") && has("expandable"), "{texts:?}"),
            _ => {}
        }
    }
    let index = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
    for f in &files {
        assert!(index.contains(&format!("]({f})")), "index embeds {f}");
    }
    assert!(index.contains("| model-switch | `pytorch expandable_segments:True` |"), "{index}");
    assert!(index.contains("/lib/x86_64-linux-gnu/libc.so.6") || index.contains("libc.so"), "the live malloc is named");
    roxmltree::Document::parse(&std::fs::read_to_string(dir.path().join("index.html")).unwrap().replace("<!DOCTYPE html>", ""))
        .expect("index.html is well-formed");
}

#[test]
fn rendering_is_byte_identical_twice() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = render(a.path());
    assert_eq!(files, render(b.path()));
    for f in files.iter().map(String::as_str).chain(["README.md", "index.html"]) {
        assert_eq!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap(), "{f} differs");
    }
}

#[test]
fn other_schema_versions_and_broken_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture()).unwrap();
    let old = dir.path().join("old.jsonl");
    std::fs::write(&old, text.replacen("\"schema_version\":1", "\"schema_version\":0", 1)).unwrap();
    let e = report::load(&[old]).unwrap_err().to_string();
    assert!(e.contains("old.jsonl:1: results schema version 0"), "{e}");
    let broken = dir.path().join("broken.jsonl");
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = "{\"schema_version\": 1, \"type\": \"gpu_replay\"";
    std::fs::write(&broken, lines.join("\n")).unwrap();
    let e = report::load(&[broken]).unwrap_err().to_string();
    assert!(e.contains("broken.jsonl:2"), "{e}");
    let foreign = dir.path().join("foreign.json");
    std::fs::write(&foreign, "{\"hello\": 1}").unwrap();
    assert!(report::load(&[foreign]).unwrap_err().to_string().contains("not an allocbench results record"));
    let out = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["report", dir.path().join("old.jsonl").to_str().unwrap(), "-o", dir.path().join("r").to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Real-program runs render RSS-over-time and time/peak charts, a table with the spread over
/// repetitions and a verdict; in-process runs with a drain get their drift and drain table.
#[test]
fn cpu_exec_and_drain_runs_render_with_spread_and_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    let exec = dir.path().join("exec.jsonl");
    let script = format!("{}/workloads/python/serving_loop.py", env!("CARGO_MANIFEST_DIR"));
    let allocators = if Path::new("/usr/lib/x86_64-linux-gnu/libmimalloc.so.2").exists() { "glibc,mimalloc" } else { "glibc" };
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["cpu", "--exec", "--allocator", allocators, "--reps", "2", "--jsonl", exec.to_str().unwrap(), "--", "python3", &script, "--bursts", "1"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let inproc = dir.path().join("cpu.jsonl");
    let w = format!("{}/workloads/python-objects.toml", env!("CARGO_MANIFEST_DIR"));
    let run = assert_cmd::Command::cargo_bin("allocbench")
        .unwrap()
        .args(["cpu", &w, "--allocator", "system", "--reps", "2", "--iterations", "50", "--drain", "0.2", "--jsonl", inproc.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let out = dir.path().join("report");
    let records: Vec<_> = [&exec, &inproc].iter().flat_map(|p| allocbench::results::read_results(p).unwrap()).collect();
    report::render(&records, &out, "t").unwrap();
    for f in ["cpu-exec-rss-serving-loop-py.svg", "cpu-exec-time-peak-serving-loop-py.svg"] {
        let svg = std::fs::read_to_string(out.join(f)).unwrap();
        roxmltree::Document::parse(&svg).unwrap();
    }
    let md = std::fs::read_to_string(out.join("README.md")).unwrap();
    assert!(md.contains("**Verdict (serving_loop.py)**: lowest peak RSS: "), "{md}");
    assert!(md.contains("**Verdict (python-objects)**: least retained at the end of the drain: glibc"), "{md}");
    // Two repetitions: every figure has its CI and its min–max.
    let row = md.lines().find(|l| l.starts_with("| glibc | 2 | ") && l.contains(" s ± ")).expect("the glibc exec row");
    assert!(row.contains('–'), "{row}");
    let drain_row = md.lines().find(|l| l.starts_with("| glibc | 2 | ") && l.contains("MiB") && !l.contains(" s ± ")).expect("the drain row");
    assert_eq!(drain_row.matches("n/a").count(), 2, "retained at 1 s and 10 s are past a 0.2 s drain: {drain_row}");
}
