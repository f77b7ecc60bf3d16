//! The CUDA backend on machines without a GPU: a clear one-line error and exit 2, never a panic,
//! with no driver at all and with stand-in drivers (tests/mock/*.c, compiled here).

mod common;

use assert_cmd::Command;
use std::path::Path;

fn workload() -> String {
    format!("{}/workloads/scenario-1-2-1-gib.toml", env!("CARGO_MANIFEST_DIR"))
}

/// Builds a mock libcuda into `dir` under the names cudarc looks for; None when no C compiler.
fn build_mock(src: &str, dir: &Path) -> Option<()> {
    let so = dir.join("libcuda.so.1");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(format!("{}/tests/mock/{src}", env!("CARGO_MANIFEST_DIR")))
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    std::fs::copy(&so, dir.join("libcuda.so")).ok()?;
    Some(())
}

fn run(args: &[&str], ld_path: Option<&Path>) -> (Option<i32>, String) {
    let mut cmd = Command::cargo_bin("allocbench").unwrap();
    if let Some(p) = ld_path {
        cmd.env("LD_LIBRARY_PATH", p);
    }
    let out = cmd.args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn no_gpu_is_a_clear_error() {
    if Path::new("/dev/nvidia0").exists() {
        common::skip("no-GPU path", "a GPU is present, so the no-GPU path cannot be tested here", "ALLOCBENCH_REQUIRE_NO_GPU");
        return;
    }
    let w = workload();
    for args in [vec!["replay", &w, "--device", "cuda"], vec!["devprobe"], vec!["run", &w, "--device", "cuda", "-q"]] {
        let (code, err) = run(&args, None);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("no CUDA driver found"), "{args:?}: {err}");
        assert!(!err.contains("panicked") && err.trim().lines().count() == 1, "{args:?}: {err}");
    }
    let (code, err) = run(&["replay", &w, "--allocator", "async"], None);
    assert_eq!(code, Some(2));
    assert!(err.contains("needs --device cuda"), "{err}");
}

#[test]
fn stand_in_drivers_are_clear_errors_too() {
    if Path::new("/dev/nvidia0").exists() {
        common::skip("no-GPU path", "a GPU is present, so the no-GPU path cannot be tested here", "ALLOCBENCH_REQUIRE_NO_GPU");
        return;
    }
    let w = workload();
    for (mock, want) in
        [("libcuda_no_device.c", "cuInit returned CUDA_ERROR_NO_DEVICE"), ("libcuda_incomplete.c", "no CUDA driver found: loading the CUDA driver")]
    {
        let dir = tempfile::tempdir().unwrap();
        if build_mock(mock, dir.path()).is_none() {
            common::skip("mock libcuda", "no C compiler (cc) to build the mock libcuda (apt-get install gcc)", "ALLOCBENCH_REQUIRE_PRELOAD");
            return;
        }
        let (code, err) = run(&["replay", &w, "--device", "cuda"], Some(dir.path()));
        assert_eq!(code, Some(2), "{mock}: {err}");
        assert!(err.contains(want), "{mock}: {err}");
        assert!(!err.contains("panicked"), "{mock}: {err}");
    }
}
