//! `allocbench fit` end to end on a script whose answer is arithmetic (tests/fixtures/capture/
//! fit_batch.py: peak reserved = 128 MiB + batch × 32 MiB). Needs a Python with torch (skipped,
//! visibly, without one unless ALLOCBENCH_REQUIRE_TORCH is set, as CI does).

mod common;

use std::path::PathBuf;

use assert_cmd::Command;

fn have_torch() -> bool {
    let python = allocbench::capture::python_for(None);
    let ok = std::process::Command::new(&python).args(["-c", "import torch"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        common::skip("fit", &format!("{python} cannot import torch (set ALLOCBENCH_PYTHON to a Python with torch)"), "ALLOCBENCH_REQUIRE_TORCH");
    }
    ok
}

fn fixture() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/capture/fit_batch.py").display().to_string()
}

fn fit(flags: &[&str]) -> (std::process::Output, serde_json::Value) {
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .arg("fit")
        .args(flags)
        .args(["--json", "-", "--threads", "2", "--", &fixture(), "--batch", "{batch}"])
        .timeout(std::time::Duration::from_secs(900))
        .output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out, json)
}

const MIB: u64 = 1 << 20;

/// On 1 GiB with nothing outside the allocator: 128 + 32 × batch ≤ 1024 MiB, so 28; with the
/// default CUDA context (426 MiB) withheld, 128 + 32 × batch ≤ 598 MiB, so 14. No allocator
/// setting goes below the live bytes, so the advice fits no more.
#[test]
fn fit_finds_the_largest_batch_the_arithmetic_gives() {
    if !have_torch() {
        return;
    }
    let (out, json) = fit(&["--param", "batch=1..64", "--capacity", "1GiB", "--cuda-context", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json["param"], "batch");
    assert_eq!(json["largest_defaults"], 28, "{json}");
    assert_eq!(json["largest_advised"], 28, "{json}");
    assert!(json["advised_conf"].is_string(), "{json}");
    let tried = json["tried"].as_array().unwrap();
    assert!(tried.len() <= 10, "a bisection, not a scan: {}", tried.len());
    for t in tried {
        let batch = t["value"].as_u64().unwrap();
        let need = (128 + 32 * batch) * MIB;
        assert_eq!(t["peak_live"].as_u64().unwrap(), need, "batch {batch}");
        assert_eq!(t["fits"].as_bool().unwrap(), need <= 1024 * MIB, "batch {batch}");
        if t["fits"].as_bool().unwrap() {
            assert_eq!(t["peak_reserved"].as_u64().unwrap(), need, "batch {batch}: the segments of step 1 serve the rest");
        }
    }
    assert!(tried.iter().any(|t| t["value"] == 28) && tried.iter().any(|t| t["value"] == 29), "both sides of the answer were tried");

    // A range whose top fits says so (the answer may lie past it), not that nothing larger fits.
    let (out, json) = fit(&["--param", "batch=1..4", "--capacity", "1GiB", "--cuda-context", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!((json["largest_defaults"].as_u64(), json["top_of_range_fits"].as_bool()), (Some(4), Some(true)), "{json}");

    let (out, json) = fit(&["--param", "batch=1..64", "--capacity", "1GiB"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json["largest_defaults"], 14, "426 MiB of CUDA context withheld: {json}");
    assert_eq!(json["outside"]["cuda_context"], 426 * MIB);
    for t in json["tried"].as_array().unwrap() {
        assert_eq!(t["device_total"].as_u64().unwrap(), t["peak_reserved"].as_u64().unwrap() + 426 * MIB, "allocator + outside = device total");
    }
}

/// Bad input: no {NAME} in the arguments, a bad range, and a script that raises, each one line.
#[test]
fn fit_refuses_bad_input_in_one_line() {
    let run = |args: &[&str]| Command::cargo_bin("allocbench").unwrap().arg("fit").args(args).output().unwrap();
    let out = run(&["--param", "batch=1..4", "--", "x.py", "--batch", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("the script's arguments hold no {batch}") && err.trim_end().lines().count() == 1, "{err}");
    let out = run(&["--param", "batch=8..4", "--", "x.py", "{batch}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the range is empty (8 > 4)"));
    let out = run(&["--param", "batch=1..4", "--card", "H300", "--", "x.py", "{batch}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no card 'H300' in the table"));
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("raises.py");
    std::fs::write(&script, "import sys, torch\nif int(sys.argv[1]) > 2:\n    raise ValueError('too big')\nx = torch.empty(10, device='cuda')\n").unwrap();
    let out = run(&["--param", "n=1..8", "--capacity", "1GiB", "--", script.to_str().unwrap(), "{n}"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.trim_end().lines().last().unwrap();
    assert!(last.starts_with("error: n=8: the capture did not complete: the script raised ValueError"), "{err}");
}

/// A sharded job (`--nproc-per-node 2`, tests/fixtures/capture/fit_sharded.py): each rank holds
/// 128 MiB + batch × 32 MiB, the last 64 MiB more, and each has NCCL's buffers for its ring of
/// two (32 channels × 9.19 MiB × one peer = 294 MiB). On 1 GiB with no CUDA context the last
/// rank decides: 192 + 32 × batch + 294 ≤ 1024 MiB, so 16 (rank 0 alone would take 18).
#[test]
fn fit_over_a_sharded_job_is_decided_by_its_worst_rank() {
    if !have_torch() {
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/capture/fit_sharded.py");
    let keep = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["fit", "--nproc-per-node", "2", "--param", "batch=1..64", "--capacity", "1GiB", "--cuda-context", "0", "--json", "-", "--threads", "2"])
        .args(["--keep", keep.path().to_str().unwrap(), "--", script.to_str().unwrap(), "--batch", "{batch}"])
        .timeout(std::time::Duration::from_secs(900))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["world_size"], 2);
    assert_eq!(json["largest_defaults"], 16, "{json}");
    let nccl = 32 * ((4 << 20) + 4_915_200 + 524_288);
    for t in json["tried"].as_array().unwrap() {
        let batch = t["value"].as_u64().unwrap();
        // (Where both run out of memory, the one that does so first in its step stands.)
        if t["fits"] == true {
            assert_eq!(t["rank"], 1, "batch {batch}: the last rank holds the most");
        }
        assert_eq!(t["device_total"].as_u64().unwrap(), t["peak_reserved"].as_u64().unwrap() + nccl, "batch {batch}: its NCCL buffers");
        let held = if t["rank"] == 1 { 192 } else { 128 };
        assert_eq!(t["peak_live"].as_u64().unwrap(), (held + 32 * batch) * MIB, "batch {batch}: rank {}", t["rank"]);
    }
    // Each value's ranks kept as a capture folder: the two ranks differ (rank 1's extra stage).
    let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(keep.path().join("batch-16/ranks.json")).unwrap()).unwrap();
    assert!(manifest["ranks"].as_array().unwrap().iter().all(|r| r["trace"].is_string()), "{manifest}");
}
