//! `allocbench advise` end to end on real inputs (issue 15): the captured 1.3B and 7B training
//! traces (`workloads/captured/`, a prefix of whole steps to keep the test short) and a PyTorch
//! memory snapshot; the JSON contract, the objectives and the time table.

use std::io::{BufRead, Write};

use assert_cmd::Command;
use serde_json::Value;

fn bin() -> Command {
    Command::cargo_bin("allocbench").unwrap()
}

fn root(p: &str) -> String {
    format!("{}/{p}", env!("CARGO_MANIFEST_DIR"))
}

/// The first `steps` steps of a shipped captured trace, as a plain CSV in `dir`.
fn captured_prefix(name: &str, steps: u64, dir: &std::path::Path) -> String {
    let gz = std::fs::File::open(root(&format!("workloads/captured/{name}.csv.gz"))).unwrap();
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(gz));
    let path = dir.join(format!("{name}-{steps}-steps.csv"));
    let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for line in reader.lines() {
        let line = line.unwrap();
        writeln!(out, "{line}").unwrap();
        if line == format!("step,{steps},,") {
            break;
        }
    }
    path.to_str().unwrap().to_string()
}

fn advise_json(input: &str, extra: &[&str]) -> Value {
    let mut args = vec!["advise", input, "--json", "-"];
    args.extend_from_slice(extra);
    let out = bin().args(&args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ns(c: &Value) -> f64 {
    c["modelled_alloc_time_s"].as_f64().unwrap()
}

#[test]
fn advise_on_the_captured_gpt3_trace_prices_every_config_and_picks_by_objective() {
    let dir = tempfile::tempdir().unwrap();
    let trace = captured_prefix("gpt3-xl-1.3b", 6, dir.path());
    let balanced = advise_json(&trace, &["--capacity", "80GiB"]);
    assert_eq!(balanced["type"], "advise");
    assert_eq!(balanced["objective"], "balanced");
    let configs = balanced["configs"].as_array().unwrap();
    assert!(configs.len() >= 1000, "{} configurations", configs.len());
    for c in configs {
        for key in ["conf", "peak_reserved", "device_mallocs", "device_frees", "syncs", "modelled_alloc_time_s", "oom"] {
            assert!(!c[key].is_null(), "{key} missing in {c}");
        }
        assert!(ns(c) > 0.0, "every configuration carries its modelled time: {c}");
    }
    assert!(balanced["replays"].as_u64().unwrap() < configs.len() as u64, "equivalent configurations share a replay");
    let defaults = configs.iter().find(|c| c["conf"] == "").expect("PyTorch's defaults are among the configs");
    assert_eq!(defaults["pruned"], false, "the defaults always run to the end");
    let complete =
        |v: &Value| -> Vec<Value> { v["configs"].as_array().unwrap().iter().filter(|c| c["pruned"] == false && c["oom"] == false).cloned().collect() };
    // Balanced: at most 1 % of the step over the defaults' time, the step estimated from the trace
    // (its bytes allocated a step, written and read once at 3.35 TB/s), and no more memory than them.
    let rec = &balanced["recommended"];
    assert!(rec["conflicts"].as_array().unwrap().is_empty() && rec["pruned"] == false && rec["oom"] == false, "{rec}");
    let allocated: u64 = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("alloc,"))
        .map(|l| l.split(',').nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    let step = 2.0 * allocated as f64 / 6.0 / 3.35e12;
    assert_eq!(balanced["steps"].as_u64(), Some(6));
    assert!((balanced["step_time_estimated_s"].as_f64().unwrap() - step).abs() < 1e-9, "{} vs {step}", balanced["step_time_estimated_s"]);
    let allowance = balanced["step_budget_s"].as_f64().unwrap();
    assert!((allowance - 0.01 * step).abs() < 1e-12);
    assert!(ns(rec) <= ns(defaults) + 6.0 * allowance + 1e-9, "{} s vs the defaults' {} s", ns(rec), ns(defaults));
    assert!(rec["peak_reserved"].as_u64() <= defaults["peak_reserved"].as_u64());
    assert!((balanced["time_budget_s"].as_f64().unwrap() - (ns(defaults) + 6.0 * allowance)).abs() < 1e-6);
    // What the balance turns down is the memory objective's pick, replayed whole.
    assert!(balanced["memory_best"]["peak_reserved"].as_u64().unwrap() <= rec["peak_reserved"].as_u64().unwrap());
    // A given step time sizes the allowance (1 % of it): a 1 µs step allows 10 ns a step, so the
    // pick may cost no more than the defaults (to 60 ns), and the leanest configuration that
    // finished is said as turned down when it is not the pick.
    let tight = advise_json(&trace, &["--capacity", "80GiB", "--step-time", "1us"]);
    assert_eq!(tight["step_time_s"].as_f64(), Some(1e-6));
    let pick = &tight["recommended"];
    let tight_defaults = tight["configs"].as_array().unwrap().iter().find(|c| c["conf"] == "").unwrap().clone();
    assert!(ns(pick) <= ns(&tight_defaults) + 6.0 * 1e-8 + 1e-9, "{pick}");
    let out = bin().args(["advise", &trace, "--capacity", "80GiB", "--step-time", "1us", "-q"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exceeds the reference's by at most 10.0 ns/step (1 % of the 1.00 µs step)"), "{text}");
    let lean = complete(&tight).into_iter().min_by_key(|c| c["peak_reserved"].as_u64().unwrap()).unwrap();
    if lean["conf"] != pick["conf"] && lean["peak_reserved"].as_u64() < pick["peak_reserved"].as_u64() {
        assert!(text.contains(&format!("turned down: {}: -", lean["conf"].as_str().unwrap())) && text.contains("`--objective memory` to prefer it"), "{text}");
    }
    // Memory buys the last bytes whatever they cost; time the fastest; the balanced pick sits between.
    let memory = advise_json(&trace, &["--capacity", "80GiB", "--objective", "memory"]);
    let time = advise_json(&trace, &["--capacity", "80GiB", "--objective", "time"]);
    let (m, t) = (&memory["recommended"], &time["recommended"]);
    assert!(m["peak_reserved"].as_u64().unwrap() <= rec["peak_reserved"].as_u64().unwrap());
    assert!(ns(t) <= ns(rec) && ns(t) <= ns(m) && ns(t) <= ns(defaults));
    // Memory: the least peak of all that finished, exactly (no band: a finished configuration
    // with fewer bytes is never passed over for a faster one).
    assert!(complete(&memory).iter().all(|c| c["peak_reserved"].as_u64().unwrap() >= m["peak_reserved"].as_u64().unwrap()));
    assert!(complete(&time).iter().all(|c| ns(c) >= ns(t)));
}

#[test]
fn advise_on_the_captured_llama_trace_and_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let trace = captured_prefix("llama2-7b-80g", 2, dir.path());
    let v = advise_json(&trace, &[]);
    assert!(v["recommended"]["peak_reserved"].as_u64().unwrap() > 0);
    assert_eq!(v["workload"]["kind"], "trace");
    // A real PyTorch snapshot (torch.cuda.memory._dump_snapshot) goes through the same search.
    let v = advise_json(&root("tests/fixtures/snapshot-small.pickle"), &["--capacity", "1GiB"]);
    assert!(v["configs"].as_array().unwrap().len() >= 1000);
    assert!(!v["recommended"].is_null());
    // The printed table shows memory and time side by side, and the line to export.
    let out = bin().args(["advise", &trace, "-q"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("peak rsvd") && text.contains("alloc s") && text.contains("syncs"), "{text}");
    assert!(text.contains("export PYTORCH_CUDA_ALLOC_CONF="), "{text}");
    assert!(text.contains("conflict"), "conflicting settings are flagged: {text}");
}

#[test]
fn latency_file_reprices_the_search_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trace = captured_prefix("gpt3-xl-1.3b", 4, dir.path());
    // A GPU ten times slower at cudaMalloc/cudaFree than the H100 table.
    let mut probe: Value = serde_json::from_str(&std::fs::read_to_string(root("reports/gpu-h100/data/devprobe.json")).unwrap()).unwrap();
    for key in ["malloc", "free"] {
        for p in probe[key].as_array_mut().unwrap() {
            p["p50_ns"] = (p["p50_ns"].as_u64().unwrap() * 10).into();
        }
    }
    probe["device"] = "slow GPU".into();
    let slow = dir.path().join("slow.json");
    std::fs::write(&slow, probe.to_string()).unwrap();
    let base = advise_json(&trace, &["--threads", "1"]);
    let repriced = advise_json(&trace, &["--threads", "1", "--latency", slow.to_str().unwrap()]);
    assert_eq!(repriced["latency_table"], "slow GPU");
    let defaults = |v: &Value| v["configs"].as_array().unwrap().iter().find(|c| c["conf"] == "").unwrap().clone();
    let (b, s) = (defaults(&base), defaults(&repriced));
    assert_eq!(b["device_mallocs"], s["device_mallocs"], "the table prices the replay, it does not change it");
    assert!(ns(&s) > ns(&b), "{} s vs {} s", ns(&s), ns(&b));
    let out = bin().args(["advise", &trace, "--latency", &trace]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a trace is not a devprobe file");
    // Without warm-pool timings the cached path would cost nothing: refused, naming the file.
    probe["async_pool_alloc_free"] = Value::Array(vec![]);
    let no_pool = dir.path().join("nopool.json");
    std::fs::write(&no_pool, probe.to_string()).unwrap();
    let out = bin().args(["replay", &trace, "-q", "--latency", no_pool.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].starts_with(&format!("error: {}: the devprobe results have no async_pool_alloc_free timings", no_pool.display())), "{stderr}");
}

#[test]
fn replay_reports_modelled_time_per_run_and_per_step() {
    let dir = tempfile::tempdir().unwrap();
    let trace = captured_prefix("gpt3-xl-1.3b", 4, dir.path());
    let out = bin().args(["replay", &trace, "--json", "-"]).output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let total = v["summary"]["modelled_alloc_time_s"].as_f64().unwrap();
    let per_step: f64 = v["timeline"].as_array().unwrap().iter().map(|p| p["modelled_alloc_time_s"].as_f64().unwrap()).sum();
    assert!(total > 0.0 && (total - per_step).abs() < 1e-6, "the timeline's steps add up to the run: {per_step} vs {total}");
    assert!(v["summary"]["device_time_s"].is_null(), "device_time_s stays for --sim-latency");
    // --latency with the same H100 table: the same modelled time, and the device time shown.
    let out = bin().args(["replay", &trace, "--latency", &root("reports/gpu-h100/data/devprobe.json"), "--json", "-"]).output().unwrap();
    let w: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["summary"]["modelled_alloc_time_s"], v["summary"]["modelled_alloc_time_s"]);
    assert!(w["summary"]["device_time_s"].as_f64().unwrap() > 0.0);
    let syncs = v["summary"]["syncs"].as_u64().unwrap();
    assert_eq!(syncs as i64, v["stats"]["num_device_free"].as_i64().unwrap() + v["stats"]["num_sync_all_streams"].as_i64().unwrap());
}

#[test]
fn diagnose_flags_conflicting_settings() {
    let out = bin()
        .args(["diagnose", &root("workloads/scenario-1-2-1-gib.toml"), "--conf", "max_split_size_mb:64,expandable_segments:True", "--json", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let conflicts = v["conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1);
    assert!(conflicts[0].as_str().unwrap().contains("#193400"));
    assert!(v["summary"].as_array().unwrap().iter().any(|s| s.as_str().unwrap().starts_with("Conflict in the conf")));
}
