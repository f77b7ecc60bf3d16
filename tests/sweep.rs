//! `allocbench sweep plan|run|merge`: shards (the flag, Slurm's and Kubernetes' environment)
//! merge to the unsharded run row for row, killed shards resume without duplicates, bad input
//! exits 2, and a 4-task job array on a real one-node Slurm (skipped where slurm-wlm is not
//! installed, unless ALLOCBENCH_REQUIRE_SLURM is set, as CI does).

mod common;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

const SCHEDULER_VARS: [&str; 7] = [
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_CPUS_PER_TASK",
    "JOB_COMPLETION_INDEX",
];

/// The binary with no scheduler in its environment.
fn bin() -> Command {
    let mut c = Command::cargo_bin("allocbench").unwrap();
    for v in SCHEDULER_VARS {
        c.env_remove(v);
    }
    c
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{:?} failed: {}", c, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Runs `c`, expecting exit `code`; returns its standard error.
fn fails(c: &mut Command, code: i32) -> String {
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "{c:?}: {err}");
    err
}

/// Three small inputs (a captured trace, a real snapshot, a workload) × 3 confs (+ ideal) × 2
/// capacities = 24 rows, copied into `dir` so that tests may change or remove them.
fn small_plan(dir: &Path) -> PathBuf {
    for f in ["tests/fixtures/gpt3-xl-captured-4-steps.csv.gz", "tests/fixtures/snapshot-small.pickle", "workloads/scenario-sawtooth.toml"] {
        std::fs::copy(repo(f), dir.join(Path::new(f).file_name().unwrap())).unwrap();
    }
    let confs = dir.join("confs.txt");
    std::fs::write(&confs, "# the defaults, and two others\ndefault\nexpandable_segments:True\n\nmax_split_size_mb:256,roundup_power2_divisions:4\n").unwrap();
    let plan = dir.join("plan.jsonl");
    ok(bin().args(["sweep", "plan"]).args(["gpt3-xl-captured-4-steps.csv.gz", "snapshot-small.pickle", "scenario-sawtooth.toml"].map(|f| dir.join(f))).args([
        "--confs",
        s(&confs),
        "--capacities",
        "40GiB,80GiB",
        "--allocators",
        "pytorch,ideal",
        "-o",
        s(&plan),
    ]));
    plan
}

fn lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A merged file's rows without what differs between two runs of the same replay (the machine
/// and the clock).
fn comparable(p: &Path) -> Vec<Value> {
    lines(p)
        .into_iter()
        .map(|mut v| {
            if let Some(r) = v.get_mut("result").and_then(|r| r.as_object_mut()) {
                r.remove("machine");
                let summary = r.get_mut("summary").unwrap().as_object_mut().unwrap();
                summary.remove("elapsed_s");
                summary.remove("events_per_s");
            }
            v
        })
        .collect()
}

fn merge(dir: &Path) -> PathBuf {
    let out = dir.with_extension("merged.jsonl");
    ok(bin().args(["sweep", "merge", s(dir), "-o", s(&out)]));
    out
}

fn run(plan: &Path, out: &Path) -> Command {
    let mut c = bin();
    c.args(["sweep", "run", s(plan), "--out", s(out), "--quiet"]);
    c
}

#[test]
fn plan_rows_are_inputs_by_capacities_by_allocator_confs_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let plan = small_plan(dir.path());
    let rows = lines(&plan);
    assert_eq!(rows.len(), 3 * 2 * (3 + 1));
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["index"], i as u64);
        assert_eq!(r["schema_version"], 1);
        assert_eq!(r["sha256"].as_str().unwrap().len(), 64);
    }
    let key = |r: &Value| {
        format!("{} {} {} {}", Path::new(r["input"].as_str().unwrap()).file_name().unwrap().to_str().unwrap(), r["capacity"], r["allocator"], r["conf"])
    };
    assert_eq!(key(&rows[0]), "gpt3-xl-captured-4-steps.csv.gz 42949672960 \"pytorch\" \"\"");
    assert_eq!(key(&rows[1]), "gpt3-xl-captured-4-steps.csv.gz 42949672960 \"pytorch\" \"expandable_segments:True\"");
    assert_eq!(key(&rows[3]), "gpt3-xl-captured-4-steps.csv.gz 42949672960 \"ideal\" \"\"");
    assert_eq!(key(&rows[4]), "gpt3-xl-captured-4-steps.csv.gz 85899345920 \"pytorch\" \"\"");
    assert_eq!(key(&rows[8]), "snapshot-small.pickle 42949672960 \"pytorch\" \"\"");
    // The same request, the same plan (byte for byte).
    let again = dir.path().join("again.jsonl");
    let text = std::fs::read_to_string(&plan).unwrap();
    let mut c = bin();
    c.args(["sweep", "plan"]).args(["gpt3-xl-captured-4-steps.csv.gz", "snapshot-small.pickle", "scenario-sawtooth.toml"].map(|f| dir.path().join(f)));
    ok(c.args(["--confs", s(&dir.path().join("confs.txt")), "--capacities", "40GiB,80GiB", "--allocators", "pytorch,ideal", "-o", s(&again)]));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
}

/// A PyTorch snapshot of several GPUs gives rows for each recorded device, replayed as workloads
/// of their own (a sweep of it replayed device 0 alone); `--snapshot-device N` keeps one.
#[test]
fn each_device_of_a_multi_gpu_snapshot_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let one = r#"[{"action": "alloc", "addr": 4096, "size": 1048576, "stream": 0}]"#;
    let two = r#"[{"action": "alloc", "addr": 8192, "size": 3145728, "stream": 0}, {"action": "free_completed", "addr": 8192, "size": 3145728, "stream": 0}]"#;
    let snapshot = dir.path().join("ranks.json");
    std::fs::write(&snapshot, format!(r#"{{"segments": [], "device_traces": [{one}, [], {two}]}}"#)).unwrap();
    let plan = dir.path().join("plan.jsonl");
    let said = ok(bin().args(["sweep", "plan", s(&snapshot), "--capacities", "40GiB", "--allocators", "pytorch,ideal", "-o", s(&plan)]));
    assert!(said.contains("4 rows (1 input, 2 workloads with each GPU of a snapshot's × 1 capacities × 2 allocator/conf pairs)"), "{said}");
    let devices: Vec<Value> = lines(&plan).iter().map(|r| r["snapshot_device"].clone()).collect();
    assert_eq!(devices, [0, 0, 2, 2]);
    let out = dir.path().join("out");
    ok(&mut run(&plan, &out));
    let merged = lines(&merge(&out));
    let seen: Vec<(String, u64)> = merged
        .iter()
        .map(|r| (r["result"]["workload"]["name"].as_str().unwrap().to_string(), r["result"]["work"]["peak_live_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [("ranks-device0".into(), 1 << 20), ("ranks-device0".into(), 1 << 20), ("ranks-device2".into(), 3 << 20), ("ranks-device2".into(), 3 << 20)]
    );
    // One device on request; a device without a history is refused with those that have one.
    let only = dir.path().join("only.jsonl");
    ok(bin().args(["sweep", "plan", s(&snapshot), "--snapshot-device", "2", "-o", s(&only)]));
    assert_eq!(lines(&only).iter().map(|r| r["snapshot_device"].clone()).collect::<Vec<_>>(), [2]);
    let err = fails(bin().args(["sweep", "plan", s(&snapshot), "--snapshot-device", "1", "-o", s(&only)]), 2);
    assert!(err.contains("no history for device 1 (devices with one: 0, 2)"), "{err}");
    // A one-device input's rows carry no device.
    let plain = dir.path().join("plain.jsonl");
    ok(bin().args(["sweep", "plan", s(&repo("workloads/scenario-sawtooth.toml")), "-o", s(&plain)]));
    assert!(lines(&plain).iter().all(|r| r.get("snapshot_device").is_none()));
}

#[test]
fn shards_from_the_flag_slurm_and_kubernetes_merge_to_the_unsharded_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    ok(&mut run(&plan, &d.join("whole")));
    assert!(d.join("whole/shard-0-of-1.jsonl").exists());
    for i in 0..4 {
        ok(run(&plan, &d.join("flag")).args(["--shard", &format!("{i}/4")]));
        // A Slurm array --array=3-6: the shard is TASK_ID - TASK_MIN of TASK_COUNT.
        ok(run(&plan, &d.join("slurm")).env("SLURM_ARRAY_TASK_ID", (i + 3).to_string()).env("SLURM_ARRAY_TASK_MIN", "3").env("SLURM_ARRAY_TASK_COUNT", "4"));
        ok(run(&plan, &d.join("k8s")).env("JOB_COMPLETION_INDEX", i.to_string()).args(["--shards", "4"]));
    }
    let whole = comparable(&merge(&d.join("whole")));
    assert_eq!(whole.len(), 24);
    assert!(whole.iter().all(|r| r["status"] == "ok" && r["type"] == "sweep_row"));
    for how in ["flag", "slurm", "k8s"] {
        for i in 0..4 {
            let rows = lines(&d.join(how).join(format!("shard-{i}-of-4.jsonl")));
            assert_eq!(rows.len(), 6, "{how}: shard {i} takes the rows i ≡ {i} (mod 4)");
            assert!(rows.iter().all(|r| r["row"]["index"].as_u64().unwrap() % 4 == i), "{how}");
        }
        assert_eq!(comparable(&merge(&d.join(how))), whole, "{how}: the merge differs from the unsharded run");
    }
    // The replay inside a row is `replay`'s, headline for headline.
    let row = whole.iter().find(|r| r["row"]["conf"] == "expandable_segments:True" && r["row"]["capacity"] == 85899345920u64).unwrap();
    let input = row["row"]["input"].as_str().unwrap();
    let out = ok(bin().args(["replay", input, "--conf", "expandable_segments:True", "--capacity", "80GiB", "--json", "-"]));
    let replay: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(row["result"]["stats"], replay["stats"]);
    assert_eq!(row["result"]["summary"]["peak_reserved"], replay["summary"]["peak_reserved"]);
    assert_eq!(row["result"]["work"], replay["work"]);
}

#[test]
fn advise_and_report_read_the_merged_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = repo("tests/fixtures/gpt3-xl-captured-4-steps.csv.gz");
    let plan = d.join("plan.jsonl");
    ok(bin().args(["sweep", "plan", s(&input), "--confs", "advise", "--capacities", "80GiB", "-o", s(&plan)]));
    ok(run(&plan, &d.join("out")).args(["--shard", "0/2"]));
    ok(run(&plan, &d.join("out")).args(["--shard", "1/2"]));
    let merged = merge(&d.join("out"));
    let from_sweep = ok(bin().args(["advise", s(&merged), "--top", "3", "--jsonl", s(&d.join("best.jsonl"))]));
    let direct = ok(bin().args(["advise", s(&input), "--capacity", "80GiB", "--top", "3", "--quiet"]));
    // advise's own space, all of it: the same count and the same answer. (The direct search
    // replays configurations equivalent on the trace once and lists them once; a sweep replays
    // each, so its table may list equivalent ones side by side.)
    let count = |t: &str| t.lines().next().unwrap().split(": ").nth(1).unwrap().split(' ').next().unwrap().to_string();
    assert_eq!(count(&from_sweep), count(&direct));
    assert_eq!(lines(&plan).len().to_string(), count(&direct));
    let export = |t: &str| t.lines().find(|l| l.starts_with("export PYTORCH_CUDA_ALLOC_CONF=")).map(str::to_string);
    assert_eq!(export(&from_sweep), export(&direct));
    let first_ranked = |t: &str| t.lines().find(|l| l.starts_with("1 ")).map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    assert_eq!(first_ranked(&from_sweep), first_ranked(&direct), "the same best peak");
    assert!(from_sweep.contains("export PYTORCH_CUDA_ALLOC_CONF="));
    // The search (as `advise --jsonl` writes it), then the defaults' and the pick's full rows.
    let best = lines(&d.join("best.jsonl"));
    assert_eq!(best[0]["type"], "advise");
    assert!(best.len() > 1 && best[1..].iter().all(|r| r["type"] == "gpu_replay"));
    assert_eq!(best[1]["conf"], "");
    // Only the rows of the capacity asked for.
    fails(bin().args(["advise", s(&merged), "--capacity", "40GiB"]), 2);

    let report = d.join("report");
    ok(bin().args(["report", s(&merged), "-o", s(&report)]));
    assert!(report.join("gpu-memory-gpt3-xl-captured-4-steps.svg").exists());
    assert!(std::fs::read_to_string(report.join("README.md")).unwrap().contains("expandable"));
}

#[test]
fn a_torn_or_killed_shard_resumes_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    let out = d.join("out");
    ok(&mut run(&plan, &out));
    let file = out.join("shard-0-of-1.jsonl");
    let full = std::fs::read_to_string(&file).unwrap();
    // Killed mid-write: two rows lost and a third cut in half.
    let kept: Vec<&str> = full.lines().collect();
    let torn = format!("{}\n{}", kept[..21].join("\n"), &kept[21][..kept[21].len() / 2]);
    std::fs::write(&file, torn).unwrap();
    let again = ok(&mut run(&plan, &out));
    assert!(again.contains("21 already done, 3 replayed"), "{again}");
    let rows = lines(&file);
    let mut indices: Vec<u64> = rows.iter().map(|r| r["row"]["index"].as_u64().unwrap()).collect();
    indices.sort();
    assert_eq!(indices, (0..24).collect::<Vec<_>>(), "every row once, the torn line gone");
    let merged = d.join("merged.jsonl");
    let stdout = ok(bin().args(["sweep", "merge", s(&out), "-o", s(&merged)]));
    assert!(stdout.contains("0 duplicates dropped"), "{stdout}");

    // A real kill: one thread over advise's space, killed once some rows are written.
    let plan2 = d.join("plan2.jsonl");
    ok(bin().args(["sweep", "plan", s(&repo("tests/fixtures/llama2-7b-captured-4-steps.csv.gz")), "--confs", "advise", "-o", s(&plan2)]));
    let out2 = d.join("out2");
    let file2 = out2.join("shard-0-of-1.jsonl");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["sweep", "run", s(&plan2), "--out", s(&out2), "--threads", "1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&file2).map(|t| t.lines().count()).unwrap_or(0) < 5 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let again = ok(bin().args(["sweep", "run", s(&plan2), "--out", s(&out2), "--quiet"]));
    let done: usize = again.split(" already done").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(done >= 5, "the rows written before the kill are kept: {again}");
    let rows = lines(&plan2).len();
    assert!(again.contains(&format!("{} replayed", rows - done)), "{again}");
    let mut indices: Vec<u64> = lines(&file2).iter().map(|r| r["row"]["index"].as_u64().unwrap()).collect();
    indices.sort();
    assert_eq!(indices, (0..rows as u64).collect::<Vec<_>>(), "every row once after the resume");

    // Ctrl-C (SIGINT): the rows written stay, the exit code says the shard is incomplete.
    let out3 = d.join("out3");
    let file3 = out3.join("shard-0-of-1.jsonl");
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["sweep", "run", s(&plan2), "--out", s(&out3), "--threads", "1", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&file3).map(|t| t.lines().count()).unwrap_or(0) < 3 && start.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // SAFETY: kill(2) takes two integers and touches no memory of ours; the pid is our child, not yet waited for.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let done = child.wait_with_output().unwrap();
    let written = std::fs::read_to_string(&file3).unwrap();
    if written.lines().count() < lines(&plan2).len() {
        assert_eq!(done.status.code(), Some(1), "{}", String::from_utf8_lossy(&done.stderr));
        assert!(String::from_utf8_lossy(&done.stderr).contains("interrupted: run the same command again"));
    }
    assert!(written.ends_with('\n') && lines(&file3).iter().all(|r| r["status"] == "ok"), "only whole, finished rows");
    ok(bin().args(["sweep", "run", s(&plan2), "--out", s(&out3), "--quiet"]));
    assert_eq!(lines(&file3).len(), lines(&plan2).len());
}

#[test]
fn a_missing_input_is_a_failed_row_that_merge_reports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    std::fs::remove_file(d.join("snapshot-small.pickle")).unwrap();
    let out = d.join("out");
    let c = run(&plan, &out).output().unwrap();
    assert!(c.status.success(), "the shard goes on: {}", String::from_utf8_lossy(&c.stderr));
    assert!(String::from_utf8_lossy(&c.stdout).contains("24 replayed (8 failed)"));
    let merged = d.join("merged.jsonl");
    let m = bin().args(["sweep", "merge", s(&out), "-o", s(&merged)]).output().unwrap();
    // Written, but failed rows are not a complete sweep: exit 1, as for missing rows.
    assert_eq!(m.status.code(), Some(1));
    let err = String::from_utf8_lossy(&m.stderr);
    assert!(err.contains("8 of 24 plan rows failed (listed above)"), "{err}");
    // advise on it says the failed rows and the inputs without a defaults row are not ranked.
    let adv = bin().args(["advise", s(&merged)]).output().unwrap();
    assert!(String::from_utf8_lossy(&adv.stderr).contains("warning: 8 of the sweep's 24 rows failed"), "{}", String::from_utf8_lossy(&adv.stderr));
    let without_defaults: Vec<String> =
        lines(&merged).iter().filter(|r| !(r["row"]["allocator"] == "pytorch" && r["row"]["conf"] == "")).map(|r| r.to_string()).collect();
    let partial = d.join("no-defaults.jsonl");
    std::fs::write(&partial, without_defaults.join("\n") + "\n").unwrap();
    let adv = bin().args(["advise", s(&partial)]).output().unwrap();
    assert!(String::from_utf8_lossy(&adv.stderr).contains("no result with PyTorch's defaults"), "{}", String::from_utf8_lossy(&adv.stderr));
    // Merge's own inputs are never its output.
    for own in ["plan.jsonl", "shard-0-of-1.jsonl"] {
        let before = std::fs::read(out.join(own)).unwrap();
        let e = fails(bin().args(["sweep", "merge", s(&out), "-o", s(&out.join(own))]), 2);
        assert!(e.contains("is the input"), "{own}: {e}");
        assert_eq!(std::fs::read(out.join(own)).unwrap(), before, "{own} kept");
    }
    assert_eq!(err.lines().filter(|l| l.starts_with("failed row") && l.contains("input missing on this node")).count(), 8, "{err}");
    let rows = lines(&merged);
    assert_eq!(rows.len(), 24);
    let failed: Vec<&Value> = rows.iter().filter(|r| r["status"] == "failed").collect();
    assert_eq!(failed.len(), 8);
    assert!(failed.iter().all(|r| r["row"]["input"].as_str().unwrap().ends_with("snapshot-small.pickle") && r["result"].is_null()));

    // The input comes back: a re-run replays only the failed rows, and merge keeps the replays.
    std::fs::copy(repo("tests/fixtures/snapshot-small.pickle"), d.join("snapshot-small.pickle")).unwrap();
    let again = ok(&mut run(&plan, &out));
    assert!(again.contains("16 already done, 8 replayed (0 failed)"), "{again}");
    let stdout = ok(bin().args(["sweep", "merge", s(&out), "-o", s(&merged)]));
    assert!(stdout.contains("24 of 24 plan rows (0 failed)") && stdout.contains("8 duplicates dropped"), "{stdout}");
}

#[test]
fn a_changed_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    let toml = d.join("scenario-sawtooth.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(&toml, format!("{text}\n# edited after the plan\n")).unwrap();
    let err = fails(&mut run(&plan, &d.join("out")), 2);
    assert!(err.contains("scenario-sawtooth.toml") && err.contains("changed since the plan"), "{err}");
    assert_eq!(err.lines().count(), 1);
    assert!(!d.join("out/shard-0-of-1.jsonl").exists() || std::fs::read_to_string(d.join("out/shard-0-of-1.jsonl")).unwrap().is_empty());
}

#[test]
fn bad_shards_plans_and_folders_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    let out = d.join("out");
    let one_line = |e: String| {
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    assert!(one_line(fails(run(&plan, &out).args(["--shard", "4/4"]), 2)).contains("out of range"));
    assert!(one_line(fails(run(&plan, &out).env("SLURM_ARRAY_TASK_ID", "4").env("SLURM_ARRAY_TASK_COUNT", "4"), 2)).contains("out of range"));
    assert!(one_line(fails(run(&plan, &out).env("JOB_COMPLETION_INDEX", "1"), 2)).contains("--shards"));
    assert!(one_line(fails(run(&plan, &out).args(["--shards", "4"]), 2)).contains("JOB_COMPLETION_INDEX"));

    // A capacity given twice.
    let twice = d.join("twice.jsonl");
    let e = one_line(fails(bin().args(["sweep", "plan", s(&d.join("scenario-sawtooth.toml")), "--capacities", "1GiB,24GiB,1GiB", "-o", s(&twice)]), 2));
    assert!(e.contains("--capacities") && e.contains("1.00 GiB (entry 3) given twice"), "{e}");
    // An allocator given twice: the same replays twice.
    let e = one_line(fails(bin().args(["sweep", "plan", s(&d.join("scenario-sawtooth.toml")), "--allocators", "pytorch,ideal,pytorch", "-o", s(&twice)]), 2));
    assert!(e.contains("--allocators") && e.contains("'pytorch' (entry 3) given twice"), "{e}");

    // A plan from another schema version.
    let other = d.join("other-version.jsonl");
    std::fs::write(&other, std::fs::read_to_string(&plan).unwrap().replacen("\"schema_version\":1", "\"schema_version\":2", 1)).unwrap();
    let e = one_line(fails(&mut run(&other, &d.join("o2")), 2));
    assert!(e.contains("other-version.jsonl:1") && e.contains("schema version 2"), "{e}");

    // An output folder holding another plan's shards.
    ok(run(&plan, &out).args(["--shard", "0/2"]));
    let plan_b = d.join("plan-b.jsonl");
    ok(bin().args(["sweep", "plan", s(&d.join("scenario-sawtooth.toml")), "-o", s(&plan_b)]));
    assert!(one_line(fails(run(&plan_b, &out).args(["--shard", "1/2"]), 2)).contains("another plan"));
    // ... even when its plan.jsonl is gone (and the refused run leaves none of its own).
    std::fs::remove_file(out.join("plan.jsonl")).unwrap();
    assert!(one_line(fails(run(&plan_b, &out).args(["--shard", "1/2"]), 2)).contains("another plan"));
    assert!(!out.join("plan.jsonl").exists());

    // A shard file of another schema version.
    let shard0 = out.join("shard-0-of-2.jsonl");
    let text = std::fs::read_to_string(&shard0).unwrap();
    std::fs::write(&shard0, text.replacen("{\"type\":\"sweep_row\",\"schema_version\":1", "{\"type\":\"sweep_row\",\"schema_version\":7", 1)).unwrap();
    std::fs::write(out.join("plan.jsonl"), std::fs::read(&plan).unwrap()).unwrap();
    let e = one_line(fails(bin().args(["sweep", "merge", s(&out), "-o", s(&d.join("m.jsonl"))]), 2));
    assert!(e.contains("shard-0-of-2.jsonl:1") && e.contains("schema version 7"), "{e}");
    std::fs::write(&shard0, text).unwrap();

    // A second run of a shard while the first still writes it (a requeued task).
    let held = std::fs::OpenOptions::new().append(true).open(&shard0).unwrap();
    // SAFETY: flock(2) on the descriptor of `held`, a file this test owns and keeps open; no memory
    // is involved.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    assert!(one_line(fails(run(&plan, &out).args(["--shard", "0/2"]), 2)).contains("another `sweep run` of this shard"));
    drop(held);
    ok(run(&plan, &out).args(["--shard", "0/2"]));

    // Bad plans and conf files. A hand-edited capacity of 0 once reached the simulated device
    // and panicked in the expandable-segment pages.
    let zero = d.join("zero-capacity.jsonl");
    let plan_text = std::fs::read_to_string(&plan).unwrap();
    let second = plan_text.lines().nth(1).unwrap();
    let edited = second.replace(&format!("\"capacity\":{}", lines(&plan)[1]["capacity"]), "\"capacity\":0");
    assert_ne!(edited, second);
    std::fs::write(&zero, plan_text.replacen(second, &edited, 1)).unwrap();
    let e = one_line(fails(&mut run(&zero, &d.join("o-zero")), 2));
    assert!(e.contains("zero-capacity.jsonl:2") && e.contains("capacity must be > 0"), "{e}");
    // A row no replay could run is the plan's error before any replay, not a failed row.
    let row1 = lines(&plan)[1].clone();
    assert_eq!((row1["allocator"].as_str(), row1["index"].as_u64()), (Some("pytorch"), Some(1)));
    for (field, value, want) in [
        ("allocator", "tlsf", "plan row 1: unknown GPU allocator 'tlsf'"),
        ("allocator", "async", "plan row 1: allocator 'async' runs only on a real GPU"),
        ("conf", "max_split_size_mb:oops", "plan row 1: conf 'max_split_size_mb:oops'"),
    ] {
        let mut edited = row1.clone();
        edited[field] = value.into();
        let p = d.join(format!("bad-{value}.jsonl").replace(':', "-"));
        std::fs::write(&p, plan_text.replacen(second, &edited.to_string(), 1)).unwrap();
        let e = one_line(fails(&mut run(&p, &d.join("o-bad")), 2));
        assert!(e.contains(":2: ") && e.contains(want), "{e}");
        assert!(!d.join("o-bad").join("shard-0-of-1.jsonl").exists(), "nothing replayed");
    }
    let mut ideal_with_conf = row1.clone();
    ideal_with_conf["allocator"] = "ideal".into();
    ideal_with_conf["conf"] = "expandable_segments:True".into();
    let p = d.join("ideal-conf.jsonl");
    std::fs::write(&p, plan_text.replacen(second, &ideal_with_conf.to_string(), 1)).unwrap();
    assert!(one_line(fails(&mut run(&p, &d.join("o-bad")), 2)).contains("conf 'expandable_segments:True' for allocator 'ideal', which takes none"));
    let bad = d.join("bad-confs.txt");
    std::fs::write(&bad, "expandable_segments:True\nmax_split_size_mb:oops\n").unwrap();
    let e = one_line(fails(bin().args(["sweep", "plan", s(&d.join("scenario-sawtooth.toml")), "--confs", s(&bad), "-o", s(&d.join("p.jsonl"))]), 2));
    assert!(e.contains("bad-confs.txt:2"), "{e}");
    fails(bin().args(["sweep", "plan", s(&d.join("no-such.toml")), "-o", s(&d.join("p.jsonl"))]), 2);
    fails(bin().args(["sweep", "plan", s(&d.join("scenario-sawtooth.toml")), "--allocators", "pytorch,tlsf", "-o", s(&d.join("p.jsonl"))]), 2);
    fails(bin().args(["sweep", "merge", s(&d.join("no-such-dir")), "-o", s(&d.join("m.jsonl"))]), 2);
}

#[test]
fn merge_lists_missing_rows_exits_1_and_drops_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let plan = small_plan(d);
    let out = d.join("out");
    ok(run(&plan, &out).args(["--shard", "0/2"]));
    let merged = d.join("merged.jsonl");
    let m = bin().args(["sweep", "merge", s(&out), "-o", s(&merged)]).output().unwrap();
    assert_eq!(m.status.code(), Some(1));
    let err = String::from_utf8_lossy(&m.stderr);
    let missing: Vec<&str> = err.lines().filter(|l| l.starts_with("missing row")).collect();
    assert_eq!(missing.len(), 12, "{err}");
    assert!(missing[0].starts_with("missing row 1 (") && err.contains("12 of 24 plan rows are missing"), "{err}");
    assert_eq!(lines(&merged).len(), 12, "what is there is still merged");
    // The whole plan run again into the same folder (another shard count): each row once.
    ok(&mut run(&plan, &out));
    let stdout = ok(bin().args(["sweep", "merge", s(&out), "-o", s(&merged)]));
    assert!(stdout.contains("24 of 24 plan rows") && stdout.contains("12 duplicates dropped"), "{stdout}");
    let mut indices: Vec<u64> = lines(&merged).iter().map(|r| r["row"]["index"].as_u64().unwrap()).collect();
    let sorted = indices.clone();
    indices.sort();
    assert_eq!(indices, sorted, "merged rows are in plan order");
    assert_eq!(indices, (0..24).collect::<Vec<_>>());
}

#[test]
fn bundle_copies_the_inputs_beside_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shared = d.join("shared");
    let plan = shared.join("plan.jsonl");
    let inputs = [repo("tests/fixtures/snapshot-small.pickle"), repo("workloads/scenario-sawtooth.toml")];
    ok(bin().args(["sweep", "plan"]).args(&inputs).args(["--bundle", s(&shared.join("inputs")), "-o", s(&plan)]));
    let rows = lines(&plan);
    assert_eq!(rows[0]["input"], "inputs/snapshot-small.pickle");
    assert_eq!(rows[1]["input"], "inputs/scenario-sawtooth.toml");
    // The shared folder mounted elsewhere on a node: inputs are found beside the plan.
    let moved = d.join("mounted-elsewhere");
    std::fs::rename(&shared, &moved).unwrap();
    let stdout = ok(&mut run(&moved.join("plan.jsonl"), &moved.join("out")));
    assert!(stdout.contains("2 replayed (0 failed)"), "{stdout}");
    // A second plan bundling another file of the same name into the same folder: it goes under
    // its hash, and the first plan still runs (its input was overwritten, and then refused).
    let (a, b) = (d.join("a"), d.join("b"));
    for (folder, text) in [(&a, "first"), (&b, "second")] {
        std::fs::create_dir_all(folder).unwrap();
        let w = std::fs::read_to_string(repo("workloads/scenario-sawtooth.toml")).unwrap().replacen("name = ", &format!("# {text}\nname = "), 1);
        std::fs::write(folder.join("x.toml"), w).unwrap();
    }
    let bundle = d.join("bundle");
    ok(bin().args(["sweep", "plan", s(&a.join("x.toml")), "--bundle", s(&bundle), "-o", s(&d.join("plan-a.jsonl"))]));
    ok(bin().args(["sweep", "plan", s(&b.join("x.toml")), "--bundle", s(&bundle), "-o", s(&d.join("plan-b.jsonl"))]));
    assert!(lines(&d.join("plan-b.jsonl"))[0]["input"].as_str().unwrap().ends_with("-x.toml"), "hashed name");
    for p in ["plan-a.jsonl", "plan-b.jsonl"] {
        let stdout = ok(&mut run(&d.join(p), &d.join(format!("out-{p}"))));
        assert!(stdout.contains("1 replayed (0 failed)"), "{p}: {stdout}");
    }
}

/// Stops the local cluster however the test ends.
struct Cluster(PathBuf);

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash").arg(repo("scripts/slurm/local-cluster.sh")).arg("stop").arg(&self.0).status();
    }
}

#[test]
fn a_four_task_slurm_array_merges_to_the_unsharded_run() {
    let have = |tool: &str| std::process::Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
    let present = ["sbatch", "squeue", "slurmctld", "slurmd", "munged"].iter().all(|t| have(t) || Path::new("/usr/sbin").join(t).exists());
    if !present {
        common::skip("slurm", "slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)", "ALLOCBENCH_REQUIRE_SLURM");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cluster = d.join("cluster");
    let path = format!("/usr/sbin:/sbin:{}", std::env::var("PATH").unwrap_or_default());
    let guard = Cluster(cluster.clone());
    let up = std::process::Command::new("bash").arg(repo("scripts/slurm/local-cluster.sh")).arg("start").arg(&cluster).env("PATH", &path).output().unwrap();
    assert!(up.status.success(), "the local cluster did not start: {}", String::from_utf8_lossy(&up.stderr));
    let conf = cluster.join("slurm.conf");

    let plan = small_plan(d);
    ok(&mut run(&plan, &d.join("whole")));
    let whole = comparable(&merge(&d.join("whole")));

    let sweep = d.join("sweep");
    let mut submit = std::process::Command::new("bash");
    submit.arg(repo("scripts/slurm/sweep.sbatch")).args([s(&plan), s(&sweep), "4", "4"]).env("SLURM_CONF", &conf).env("PATH", &path);
    submit.env("ALLOCBENCH", assert_cmd::cargo::cargo_bin("allocbench"));
    for v in SCHEDULER_VARS {
        submit.env_remove(v);
    }
    let out = submit.output().unwrap();
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let ids = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(ids.split_whitespace().count(), 2, "prints the array's and the merge's job ids: {ids}");
    // `sbatch --wait` polls slowly (2 s, 8 s, then 32 s): poll squeue instead.
    let start = std::time::Instant::now();
    loop {
        let q = std::process::Command::new("squeue").args(["-h", "-o", "%i"]).env("SLURM_CONF", &conf).env("PATH", &path).output().unwrap();
        if q.status.success() && q.stdout.iter().all(u8::is_ascii_whitespace) {
            break;
        }
        assert!(start.elapsed().as_secs() < 180, "the array did not finish in 3 minutes: {}", String::from_utf8_lossy(&q.stdout));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for i in 0..4 {
        assert_eq!(lines(&sweep.join(format!("shard-{i}-of-4.jsonl"))).len(), 6, "task {i} ran its shard");
    }
    let results = sweep.join("RESULTS.jsonl");
    assert!(results.exists(), "the merge job wrote RESULTS.jsonl");
    assert_eq!(comparable(&results), whole, "the array's merge differs from the unsharded run");
    // One task resubmitted by hand (its shard lost) runs that shard again, not the whole plan as
    // a shard 0 of 1 (Slurm's task count is the resubmission's).
    std::fs::remove_file(sweep.join("shard-2-of-4.jsonl")).unwrap();
    let again = std::process::Command::new("sbatch")
        .args(["--parsable", "--array=2", &format!("--chdir={}", s(&sweep))])
        .arg(repo("scripts/slurm/sweep.sbatch"))
        .args([s(&plan), s(&sweep)])
        .env("SLURM_CONF", &conf)
        .env("PATH", &path)
        .env("ALLOCBENCH", assert_cmd::cargo::cargo_bin("allocbench"))
        .output()
        .unwrap();
    assert!(again.status.success(), "sbatch: {}", String::from_utf8_lossy(&again.stderr));
    let start = std::time::Instant::now();
    while !sweep.join("shard-2-of-4.jsonl").exists()
        || std::process::Command::new("squeue")
            .args(["-h", "-o", "%i"])
            .env("SLURM_CONF", &conf)
            .env("PATH", &path)
            .output()
            .is_ok_and(|q| !q.stdout.iter().all(u8::is_ascii_whitespace))
    {
        assert!(start.elapsed().as_secs() < 120, "the resubmitted task did not finish in 2 minutes");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(lines(&sweep.join("shard-2-of-4.jsonl")).len(), 6, "the resubmitted task ran its shard");
    assert!(!sweep.join("shard-0-of-1.jsonl").exists(), "not the whole plan");
    drop(guard);
}

/// The `command` of the container named `name` in the Kubernetes file, /sweep mapped to `root`.
fn k8s_command(yaml: &str, name: &str, root: &Path) -> Vec<String> {
    let after = yaml.split(&format!("- name: {name}\n")).nth(1).unwrap();
    let line = after.lines().find(|l| l.trim_start().starts_with("command:")).unwrap();
    let list: Vec<String> = serde_json::from_str(line.trim_start().trim_start_matches("command:").trim()).unwrap();
    list.into_iter().map(|a| a.replace("/sweep", s(root))).collect()
}

#[test]
fn the_kubernetes_indexed_job_runs_every_shard_then_merges() {
    let yaml = std::fs::read_to_string(repo("scripts/k8s/sweep-job.yaml")).unwrap();
    let field = |k: &str| yaml.lines().find_map(|l| l.trim().strip_prefix(&format!("{k}: "))).unwrap().to_string();
    assert_eq!(field("completionMode"), "Indexed");
    let completions: u64 = field("completions").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // small_plan writes d/plan.jsonl: the path the Job's command names under /sweep.
    assert_eq!(small_plan(d), d.join("plan.jsonl"));
    let shard = k8s_command(&yaml, "shard", d);
    assert_eq!(shard[0], "allocbench");
    let at = shard.iter().position(|a| a == "--shards").unwrap();
    assert_eq!(shard[at + 1].parse::<u64>().unwrap(), completions, "--shards must equal the Job's completions");
    // Each pod: the same command, its index in JOB_COMPLETION_INDEX.
    for i in 0..completions {
        ok(bin().args(&shard[1..]).env("JOB_COMPLETION_INDEX", i.to_string()));
    }
    let merge_cmd = k8s_command(&yaml, "merge", d);
    ok(bin().args(&merge_cmd[1..]));
    ok(&mut run(&d.join("plan.jsonl"), &d.join("whole")));
    assert_eq!(comparable(&d.join("out/RESULTS.jsonl")), comparable(&merge(&d.join("whole"))));
}
