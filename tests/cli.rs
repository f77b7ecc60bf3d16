//! The command line: contracts (flags, JSON keys, exit codes) that scripts rely on.

use assert_cmd::Command;

fn bin() -> Command {
    Command::cargo_bin("allocbench").unwrap()
}

fn workload(name: &str) -> String {
    format!("{}/workloads/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn replay_json_has_torch_stats_and_oom() {
    let out = bin().args(["replay", &workload("scenario-1-2-1-gib.toml"), "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stats = v["stats"].as_object().unwrap();
    assert_eq!(stats.len(), 123);
    assert_eq!(stats["reserved_bytes.all.current"], 7i64 << 30);
    assert_eq!(stats["allocated_bytes.all.current"], 5i64 << 30);
    assert_eq!(stats["num_device_alloc"], 4);
    assert!(v["oom"].is_null());
    assert_eq!(v["type"], "gpu_replay");
    assert_eq!(v["schema_version"], 1);
}

#[test]
fn oom_object_names_event_step_request_and_cause() {
    // Four 5 MiB blocks share one 20 MiB segment; two are freed but stay pinned between live
    // neighbours, so an 8 MiB request on a full 20 MiB device is a fragmentation OOM.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("pinned.csv");
    std::fs::write(&csv, "# pinned free space\nop,id,bytes,stream\nstep,1,,\nalloc,1,5242880,0\nalloc,2,5242880,0\nalloc,3,5242880,0\nalloc,4,5242880,0\nstep,2,,\nfree,1,,\nfree,3,,\nalloc,5,8388608,0\nfree,2,,\n").unwrap();
    let out = bin().args(["replay", csv.to_str().unwrap(), "--capacity", "20MiB", "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "an OOM is a result, not a failure: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let oom = &v["oom"];
    assert_eq!(oom["event"], 8, "0-based index of the data row");
    assert_eq!(oom["step"], 2);
    assert_eq!(oom["requested"], 8u64 << 20);
    assert_eq!(oom["cause"], "fragmentation");
    assert_eq!(oom["cached_free"], 10u64 << 20);
    assert_eq!(oom["largest_free_block"], 5u64 << 20);
    assert_eq!(v["stats"]["num_ooms"], 1);
    assert_eq!(v["work"]["events"], 9, "--on-oom stop stops at the OOM");
    // --on-oom continue replays the rest, skipping the failed allocation.
    let out = bin().args(["replay", csv.to_str().unwrap(), "--capacity", "20MiB", "--on-oom", "continue", "--json", "-"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["work"]["events"], 10);
    assert_eq!(v["oom"]["event"], 8);
}

#[test]
fn capacity_limit_on_the_1_2_1_scenario_retries_instead_of_ooming() {
    let out = bin().args(["replay", &workload("scenario-1-2-1-gib.toml"), "--capacity", "6GiB", "--json", "-"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["num_alloc_retries"], 1);
    assert_eq!(v["stats"]["reserved_bytes.all.current"], 5i64 << 30);
    assert!(v["oom"].is_null());
}

#[test]
fn conf_comes_from_the_environment_too() {
    // A replay with exactly these allocator variables set (the caller's own are removed).
    let replay_with = |vars: &[(&str, &str)]| {
        let mut cmd = bin();
        cmd.env_remove("PYTORCH_CUDA_ALLOC_CONF").env_remove("PYTORCH_ALLOC_CONF");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd.args(["replay", &workload("scenario-1-2-1-gib.toml"), "--json", "-"]).output().unwrap()
    };
    let out = replay_with(&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["conf"], "expandable_segments:True");
    assert_eq!(v["stats"]["segment.all.current"], 0);
    // With both variables set torch 2.15 reads PYTORCH_CUDA_ALLOC_CONF alone (its libc10 says so).
    let out = replay_with(&[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("PYTORCH_ALLOC_CONF", "max_split_size_mb:32")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["conf"], "expandable_segments:True");
    assert_eq!(v["stats"]["max_split_size"], -1);
    let out = replay_with(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:1")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PYTORCH_ALLOC_CONF"), "the error names the variable");
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad_trace = dir.path().join("bad.csv");
    std::fs::write(&bad_trace, "op,id,bytes,stream\nalloc,1,100,0\nfree,2,,\n").unwrap();
    let bad = bad_trace.to_str().unwrap().to_string();
    let plain_gz = dir.path().join("plain.csv.gz");
    std::fs::write(&plain_gz, "op,id,bytes,stream\nalloc,1,100,0\n").unwrap();
    // Steps that go back in a scenario.
    let steps_back = dir.path().join("back.toml");
    std::fs::write(
        &steps_back,
        "name = \"back\"\n[scenario]\nevents = [{ op = \"step\", n = 3 }, { op = \"alloc\", id = 1, bytes = \"1MiB\" }, { op = \"step\", n = 1 }]\n",
    )
    .unwrap();
    // A torch_replay.py output naming a device of 0 bytes once panicked in the expandable segments.
    let zero_device = dir.path().join("torch.json");
    let torch = r#"{"format":"allocbench-torch-replay-v1","torch_version":"2.15","device":"x","total_memory":0,"conf":"expandable_segments:True","events":2,"oom":null,"steps":[],"final":{}}"#;
    std::fs::write(&zero_device, torch).unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["fidelity".into(), bad.clone(), "--torch-json".into(), zero_device.to_str().unwrap().into()], "torch.json: total_memory 0: capacity must be > 0"),
        (vec!["replay".into(), workload("scenario-1-2-1-gib.toml"), "--allocator".into(), "tlsf".into()], "unknown GPU allocator 'tlsf'"),
        (vec!["replay".into(), workload("scenario-1-2-1-gib.toml"), "--conf".into(), "max_split_size_mb:5".into()], "max_split_size_mb too small"),
        (vec!["replay".into(), workload("scenario-1-2-1-gib.toml"), "--capacity".into(), "lots".into()], "lots"),
        (vec!["replay".into(), workload("scenario-1-2-1-gib.toml"), "--capacity".into(), "80".into()], "write it with its unit, e.g. 80GiB"),
        (vec!["replay".into(), bad.clone()], "bad.csv:3: free of id 2, which is not live"),
        (vec!["replay".into(), plain_gz.to_str().unwrap().into()], "plain.csv.gz:1: not gzip-compressed data: name it without .gz"),
        (vec!["replay".into(), steps_back.to_str().unwrap().into()], "back.toml: scenario.events[2]: step 1 after step 3: step numbers must increase"),
        (
            vec!["trace".into(), steps_back.to_str().unwrap().into(), "-o".into(), dir.path().join("back.csv").to_str().unwrap().into()],
            "scenario.events[2]: step 1 after step 3",
        ),
        (vec!["replay".into(), "/nonexistent/w.toml".into()], "no such file"),
        (vec!["trace".into(), "/nonexistent/w.toml".into()], "no such file"),
        (vec!["run".into(), workload("scenario-1-2-1-gib.toml"), "--allocators".into(), "pytorch,bogus".into()], "unknown GPU allocator 'bogus'"),
        (vec!["replay".into(), workload("scenario-1-2-1-gib.toml"), "--capacity".into(), "0.5B".into()], "size '0.5B' is not a whole number of bytes"),
        (
            vec![
                "replay".into(),
                workload("scenario-1-2-1-gib.toml"),
                "--allocator".into(),
                "nocache".into(),
                "--conf".into(),
                "expandable_segments:True".into(),
            ],
            "--conf: sets PyTorch's caching allocator, which --allocator nocache is not",
        ),
        (vec!["replay".into()], "error: the following required arguments were not provided: <INPUT>; usage: allocbench replay <INPUT> (see --help)"),
        (vec!["advise".into(), bad.clone(), "--objective".into(), "fastest".into()], "invalid value 'fastest' for '--objective"),
        (vec!["advise".into(), workload("scenario-1-2-1-gib.toml"), "--step-time".into(), "0ms".into()], "a step takes some time (more than 0)"),
        (vec!["advise".into(), workload("scenario-1-2-1-gib.toml"), "--step-time".into(), "3 fortnights".into()], "unknown unit 'fortnights'"),
        (vec!["diagnose".into(), workload("scenario-1-2-1-gib.toml"), "--card".into(), "H300".into()], "--card: no card 'H300' in the table"),
        (
            vec!["diagnose".into(), workload("scenario-1-2-1-gib.toml"), "--card".into(), "T4".into(), "--capacity".into(), "1GiB".into()],
            "the argument '--card <CARD>' cannot be used with '--capacity <CAPACITY>'",
        ),
        (
            vec!["diagnose".into(), workload("scenario-1-2-1-gib.toml"), "--cuda-context".into(), "20GiB".into(), "--card".into(), "T4".into()],
            "leaves nothing of the",
        ),
    ];
    for (args, want) in cases {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
}

/// A torch_replay.py output is judged only when it can be: its target keys are there, its conf is
/// its own to get wrong, and it replayed the trace it is compared with.
#[test]
fn fidelity_judges_only_a_matching_torch_json() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, "op,id,bytes,stream\nalloc,1,5242880,0\nalloc,2,1000,0\nfree,1,,\n").unwrap();
    let trace = trace.to_str().unwrap();
    let replayed: serde_json::Value =
        serde_json::from_slice(&bin().args(["replay", trace, "--capacity", "80GiB", "--json", "-"]).output().unwrap().stdout).unwrap();
    let torch = |conf: &str, events: u64, final_stats: &serde_json::Value| {
        let path = dir.path().join("torch.json");
        let v = serde_json::json!({"format": "allocbench-torch-replay-v1", "torch_version": "2.15", "device": "x", "total_memory": 80u64 << 30,
                                   "conf": conf, "events": events, "oom": null, "steps": [], "final": final_stats});
        std::fs::write(&path, v.to_string()).unwrap();
        bin().args(["fidelity", trace, "--torch-json", path.to_str().unwrap(), "--json", "-"]).output().unwrap()
    };
    // The same stats: identical, and with --json - the standard output is the JSON alone.
    let out = torch("", 3, &replayed["stats"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON alone");
    assert_eq!((r["keys_compared"].as_u64(), r["target_identical"].as_bool()), (Some(123), Some(true)));
    assert!(stderr(&out).contains("identical"), "the summary goes to stderr: {}", stderr(&out));
    let only = |keys: &[&str]| serde_json::Value::Object(keys.iter().map(|k| (k.to_string(), replayed["stats"][*k].clone())).collect());
    let cases = [
        // No target key: nothing to judge by (this once passed with 0 keys compared).
        (torch("", 3, &serde_json::json!({"something.else": 1})), "its final memory_stats() lack 'reserved_bytes.all.peak'"),
        (torch("", 3, &only(&["reserved_bytes.all.peak", "segment.all.allocated", "num_alloc_retries"])), "lack 'num_ooms'"),
        // The JSON's own conf is that file's fault, not --conf's.
        (
            torch("max_split_size_mb:5", 3, &replayed["stats"]),
            "torch.json: its conf 'max_split_size_mb:5': CachingAllocator option max_split_size_mb too small",
        ),
        (torch("", 7, &replayed["stats"]), "torch.json: PyTorch replayed 7 events but"),
    ];
    for (out, want) in cases {
        assert_eq!(out.status.code(), Some(2), "{want}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{want}: {}", stderr(&out));
        assert_eq!(stderr(&out).trim().lines().count(), 1, "{}", stderr(&out));
    }
    // The four target keys alone are a judgement on them.
    let out = torch("", 3, &only(&["reserved_bytes.all.peak", "segment.all.allocated", "num_alloc_retries", "num_ooms"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success() && r["keys_compared"] == 4 && r["target_identical"] == true, "{r}");
}

/// The fake card a capture's header names sizes the device; a header naming no device is an
/// error naming the file, unless --capacity overrides it.
#[test]
fn a_captures_fake_card_sizes_the_device_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trace = |memory: &str| {
        let p = dir.path().join("t.csv");
        std::fs::write(&p, format!("# allocbench capture v1: test\n# fake card memory: {memory}\nop,id,bytes,stream\nalloc,1,5242880,0\n")).unwrap();
        p.to_str().unwrap().to_string()
    };
    let t = trace("314572800 bytes (torch.cuda.OutOfMemoryError past it)");
    let out = bin().args(["replay", &t, "--json", "-"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["capacity"], 300u64 << 20, "{}", stderr(&out));
    for (memory, want) in [("0 bytes", "capacity must be > 0"), ("lots bytes", "not a number of bytes"), ("2251799813685248 bytes", "capacity over 1 PiB")] {
        let t = trace(memory);
        for cmd in ["replay", "diagnose", "advise"] {
            let out = bin().args([cmd, &t]).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{cmd} {memory}: {}", stderr(&out));
            assert!(stderr(&out).contains(&format!("t.csv: its header '# fake card memory: {memory}': {want}")), "{cmd}: {}", stderr(&out));
        }
        assert!(bin().args(["replay", &t, "--capacity", "80GiB", "-q"]).output().unwrap().status.success(), "--capacity overrides the header");
    }
}

/// A full disk names the output it could not write, in one line, whichever output it was.
#[test]
fn a_full_disk_names_the_output() {
    let w = workload("scenario-sawtooth.toml");
    let cases: [(&[&str], &str); 5] = [
        (&["replay", &w, "--json", "/dev/full"], "/dev/full: cannot write"),
        (&["run", &w, "--jsonl", "/dev/full", "-q"], "/dev/full: cannot write"),
        (&["trace", &w, "-o", "/dev/full"], "/dev/full: cannot write"),
        (&["diagnose", &w], "standard output: cannot write"),
        (&["replay", &w, "--json", "-"], "standard output: cannot write"),
    ];
    for (args, want) in cases {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench")).args(args).stdout(full).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(want) && err.contains("No space left on device") && !err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// A workload of 10^8 steps is read into memory by diagnose and advise: SIGTERM (a scheduler's
/// time limit) stops the reading, says so and exits 130, instead of being ignored until the
/// machine runs out of memory.
#[test]
fn sigterm_stops_an_analysis_while_it_reads_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.toml");
    let text = std::fs::read_to_string(workload("gpt3-xl-1.3b.toml")).unwrap();
    std::fs::write(&huge, text.replacen("steps = 200", "steps = 100000000", 1)).unwrap();
    for cmd in ["diagnose", "advise"] {
        let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
            .args([cmd, huge.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        // SAFETY: kill(2) takes two integers and touches no memory of ours; the pid is our child, not yet waited for.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let started = std::time::Instant::now();
        let out = child.wait_with_output().unwrap();
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{cmd} took {:?} to stop", started.elapsed());
        assert_eq!(out.status.code(), Some(130), "{cmd}: {}", stderr(&out));
        assert!(stderr(&out).contains("interrupted: while reading the input"), "{cmd}: {}", stderr(&out));
    }
}

#[test]
fn trace_then_replay_of_the_trace_matches_the_workload() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("t.csv");
    let w = workload("model-switch.toml");
    let out = bin().args(["trace", &w, "-o", csv.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let from_toml: serde_json::Value = serde_json::from_slice(&bin().args(["replay", &w, "--json", "-"]).output().unwrap().stdout).unwrap();
    let from_csv: serde_json::Value = serde_json::from_slice(&bin().args(["replay", csv.to_str().unwrap(), "--json", "-"]).output().unwrap().stdout).unwrap();
    assert_eq!(from_toml["stats"], from_csv["stats"]);
    assert_eq!(from_toml["work"], from_csv["work"]);
}

#[test]
fn run_compares_allocators_and_writes_jsonl() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("r.jsonl");
    let out = bin()
        .args(["run", &workload("scenario-sawtooth.toml"), "--conf", "", "--conf", "expandable_segments:True", "--jsonl", jsonl.to_str().unwrap(), "-q"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("expandable_segments:True") && table.contains("ideal") && table.contains("nocache"), "{table}");
    let recs = allocbench::results::read_results(&jsonl).unwrap();
    assert_eq!(recs.len(), 4, "pytorch x 2 confs, nocache, ideal");
    // "Append every run's results": a second run adds its own, the first run's stay.
    let again = bin().args(["run", &workload("scenario-1-2-1-gib.toml"), "--allocators", "ideal", "--jsonl", jsonl.to_str().unwrap(), "-q"]).output().unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    let names: Vec<String> = allocbench::results::read_results(&jsonl)
        .unwrap()
        .iter()
        .map(|r| serde_json::to_value(r).unwrap()["workload"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names[..4].iter().all(|n| n.contains("sawtooth")) && names[4].contains("1-2-1"), "{names:?}");
}

/// An output that is the input (by any name) is refused before anything is written: creating it
/// would have emptied the trace before it was read, or replaced it with results.
#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    let text = "op,id,bytes,stream\nalloc,1,1000,0\nfree,1,,\n";
    std::fs::write(&trace, text).unwrap();
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let (t, l) = (trace.to_str().unwrap(), link.to_str().unwrap());
    for args in [
        vec!["trace", t, "-o", t],
        vec!["run", t, "-q", "--jsonl", l],
        vec!["replay", l, "--json", t],
        vec!["diagnose", t, "--jsonl", l],
        vec!["advise", t, "--json", t],
        vec!["capture", "-o", t, "--", t],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("writing it would destroy the input; name another file"), "{args:?}: {}", stderr(&out));
        assert_eq!(std::fs::read_to_string(&trace).unwrap(), text, "{args:?}");
    }
}

/// An output that cannot be written is refused before the work, not found after it (a long `cpu`
/// or `advise` run lost its results that way), and nothing is left behind by the check.
#[test]
fn an_unwritable_output_is_refused_before_the_work() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let under_a_file = file.join("out/r.json");
    let (u, d) = (under_a_file.to_str().unwrap(), dir.path().to_str().unwrap());
    let w = workload("python-objects.toml");
    for (args, want) in [
        (vec!["cpu", &w, "--allocator", "system", "--duration", "30", "--json", u], "is not a folder"),
        (vec!["cpu", &w, "--allocator", "system", "--duration", "30", "--jsonl", d], "is a folder"),
        (vec!["replay", &w, "--json", u], "is not a folder"),
        (vec!["advise", &w, "--json", d], "is a folder"),
        (vec!["diagnose", &w, "--jsonl", u], "is not a folder"),
        (vec!["run", &w, "-q", "--jsonl", u], "is not a folder"),
    ] {
        let t = std::time::Instant::now();
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want) && stderr(&out).trim().lines().count() == 1, "{args:?}: {}", stderr(&out));
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "{args:?} ran before refusing");
    }
    // A new file in a new folder is fine, and the check leaves nothing there.
    let fresh = dir.path().join("new/folder/r.json");
    let out = bin().args(["replay", &workload("model-switch.toml"), "--json", fresh.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(fresh.parent().unwrap()).unwrap().count(), 1);
    let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["file", "new"]);
}

/// Hostile inputs get one line and exit 2, without reading them whole: a file of gigabytes of NUL
/// bytes as a trace or a workload (its sniffers read the first "line" whole, and aborted), two
/// outputs in one file, and thread counts no machine has (a panic).
#[test]
fn huge_files_shared_outputs_and_absurd_thread_counts_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = |name: &str| {
        let p = dir.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(3 << 30).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (csv, toml, json) = (sparse("zeros.csv"), sparse("zeros.toml"), sparse("zeros.json"));
    let same = dir.path().join("same").to_str().unwrap().to_string();
    let w = workload("scenario-sawtooth.toml");
    for (args, want) in [
        (vec!["replay", &csv], "line longer than 4096 bytes"),
        (vec!["replay", &toml], "larger than 16.0 MiB: not a workload definition"),
        // Files read whole are read up to their bound only.
        (vec!["replay", &w, "--latency", &json], "zeros.json: larger than 64.0 MiB: not a results file"),
        (vec!["fidelity", &csv, "--torch-json", &json], "zeros.json: larger than 256 MiB: not a torch_replay.py output"),
        (vec!["replay", &w, "--json", &same, "--html", &same], "is also the file of another output"),
        (vec!["advise", &w, "--json", &same, "--jsonl", &same], "is also the file of another output"),
        (vec!["advise", &w, "--threads", "100000"], "not in 1..=1024"),
        (vec!["advise", &w, "--threads", "0"], "not in 1..=1024"),
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want) && !stderr(&out).contains("panicked"), "{args:?}: {}", stderr(&out));
    }
}

/// A replay stopped by SIGTERM (a scheduler's time limit) keeps its results and exits 130: it
/// exited 0, reading as a finished replay.
#[test]
fn an_interrupted_replay_keeps_its_results_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join("long.toml");
    let text = std::fs::read_to_string(workload("gpt3-xl-1.3b.toml")).unwrap().replace("steps = 200", "steps = 1000000");
    std::fs::write(&long, text).unwrap();
    let json = dir.path().join("r.json");
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["replay", long.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: kill(2) takes two integers and touches no memory of ours; the pid is our child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted: the results cover the"), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["summary"]["interrupted"], true);
    assert!(v["work"]["events"].as_u64().unwrap() > 0);
}

/// `--sim-latency` accounts simulated device time with latencies measured on a real H100
/// (`allocbench devprobe`, fixture from reports/gpu-h100): no caching spends far more of it.
#[test]
fn sim_latency_accounts_device_time() {
    let probe = format!("{}/tests/fixtures/devprobe-h100.json", env!("CARGO_MANIFEST_DIR"));
    let time = |alloc: &str| -> f64 {
        let out = bin().args(["replay", &workload("model-switch.toml"), "--allocator", alloc, "--sim-latency", &probe, "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["summary"]["device_time_s"].as_f64().expect("device time is reported")
    };
    let (cached, uncached) = (time("pytorch"), time("nocache"));
    assert!(cached > 0.0 && uncached > 20.0 * cached, "pytorch {cached} s vs nocache {uncached} s");
    // The ideal bound makes no device calls: 0 s beside the others, not an absent figure.
    assert_eq!(time("ideal"), 0.0);
    let out = bin().args(["replay", &workload("model-switch.toml"), "--sim-latency", &workload("model-switch.toml")]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a workload file is not a devprobe results file");
}

#[test]
fn report_renders_devprobe_results() {
    let dir = tempfile::tempdir().unwrap();
    let probe = format!("{}/tests/fixtures/devprobe-h100.json", env!("CARGO_MANIFEST_DIR"));
    let out = bin().args(["report", &probe, "-o", dir.path().to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let index = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
    assert!(index.contains("## Device allocation latency (NVIDIA H100 80GB HBM3"), "{index}");
    assert!(index.contains("| 8.00 GiB |"), "{index}");
    assert!(std::fs::read_to_string(dir.path().join("devprobe.svg")).unwrap().contains("cuMemAlloc (cudaMalloc) p50"));
}

#[test]
fn diagnose_names_segment_size_when_nothing_is_pinned() {
    // Issue 13.2: a 5 MiB request on an empty 15 MiB device fits, but its segment (20 MiB) does not.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("seg.csv");
    std::fs::write(&csv, "op,id,bytes,stream\nalloc,1,5242880,0\n").unwrap();
    let out = bin().args(["diagnose", csv.to_str().unwrap(), "--capacity", "15MiB", "--cuda-context", "0", "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["oom"]["cause"], "segment_size");
    let cause = v["summary"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).find(|s| s.starts_with("Cause:")).unwrap();
    assert!(cause.contains("20.0 MiB segment") && !cause.contains("pinned") && !cause.contains("between live blocks"), "{cause}");
}

/// A trace with record_stream and sync (issue 13.4): the block another stream used stays out of
/// reach until that stream syncs; diagnose accounts for it at the peak (allocated + pending +
/// pinned free + cached free = reserved), and a record_stream of a dead id is a one-line error.
#[test]
fn record_stream_traces_replay_and_diagnose_their_pending_frees() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("streams.csv");
    let mib20 = 20u64 << 20;
    std::fs::write(
        &path,
        format!("op,id,bytes,stream\nalloc,1,{mib20},0\nrecord_stream,1,,5\nfree,1,,\nalloc,2,{mib20},0\nsync,,,5\nalloc,3,{mib20},0\nfree,2,,\nfree,3,,\n"),
    )
    .unwrap();
    let out = bin().args(["replay", path.to_str().unwrap(), "--json", "-", "-q"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Id 2 cannot take id 1's pending block; id 3 takes it once stream 5 synced.
    assert_eq!(v["stats"]["num_device_alloc"], 2);
    assert_eq!(v["stats"]["active_bytes.all.peak"], 2 * mib20);

    let out = bin().args(["diagnose", path.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["peak_reserved"], 2 * mib20);
    assert_eq!(d["allocated_at_peak"], 2 * mib20, "at the peak (after id 3) both blocks are allocated");
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "op,id,bytes,stream\nalloc,1,100,0\nfree,1,,\nrecord_stream,1,,5\n").unwrap();
    let out = bin().args(["replay", bad.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("bad.csv:4") && stderr(&out).contains("not live"), "{}", stderr(&out));
    assert_eq!(stderr(&out).trim().lines().count(), 1);

    // Pending at the peak: a third block while id 1 still waits.
    let pend = dir.path().join("pending.csv");
    std::fs::write(&pend, format!("op,id,bytes,stream\nalloc,1,{mib20},0\nrecord_stream,1,,5\nfree,1,,\nalloc,2,{mib20},0\n")).unwrap();
    let out = bin().args(["diagnose", pend.to_str().unwrap(), "--json", "-"]).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((d["peak_reserved"].as_u64(), d["allocated_at_peak"].as_u64(), d["pending_free_bytes"].as_u64()), (Some(2 * mib20), Some(mib20), Some(mib20)));
    let out = bin().args(["diagnose", pend.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("another stream's work (record_stream)"), "{}", String::from_utf8_lossy(&out.stdout));
}

/// `--address-order driver` (issue 13.5) places segments as the H100's driver did; the default
/// stays `lowest`, and the results say which placement ran.
#[test]
fn address_order_is_a_replay_flag_and_recorded() {
    let run = |extra: &[&str]| {
        let w = workload("scenario-sawtooth.toml");
        let mut args = vec!["replay", w.as_str(), "--json", "-", "-q"];
        args.extend_from_slice(extra);
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let default = run(&[]);
    let lowest = run(&["--address-order", "lowest"]);
    let driver = run(&["--address-order", "driver"]);
    assert_eq!(default["device"], lowest["device"]);
    assert!(driver["device"].as_str().unwrap().contains("driver address order"), "{}", driver["device"]);
    assert!(!lowest["device"].as_str().unwrap().contains("driver"));
    let out = bin().args(["replay", &workload("scenario-sawtooth.toml"), "--address-order", "highest"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A capture's `#site` lines reach `diagnose` (bytes live per site at the peak) and a malformed
/// one is one line naming the file and line, exit 2.
#[test]
fn diagnose_ranks_a_captures_allocation_sites_and_bad_site_lines_exit_2() {
    let out = bin().args(["diagnose", "tests/fixtures/capture/sites.csv"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let sites: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("allocation sites by bytes live at the peak:")).skip(1).collect();
    // sites.py:17 holds the matmul (and the modelled 32 MiB cuBLAS workspace), the most bytes.
    assert!(sites.first().is_some_and(|l| l.trim_start().starts_with("32.0 MiB") && l.ends_with("sites.py:17 in <module>")), "{text}");
    assert!(sites.iter().any(|l| l.ends_with("sites_lib/blocks.py:6 in make")), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "op,id,bytes,stream\n#site 0 a.py:1 f\nalloc,1,8,0\n#at 3\nalloc,2,8,0\n").unwrap();
    let out = bin().arg("replay").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("bad.csv:4: '#at 3' names a site not defined yet"), "{err}");
}

/// `allocbench trace IN -o OUT` keeps the allocation sites IN records (a capture's `#site`/`#at`
/// lines, a snapshot's frames): OUT names the same site for every allocation, plain or gzipped.
#[test]
fn trace_keeps_the_allocation_sites_of_captures_and_snapshots() {
    use allocbench::input::Source;
    let dir = tempfile::tempdir().unwrap();
    for (input, out_name) in [("tests/fixtures/capture/sites.csv", "sites.csv"), ("tests/fixtures/snapshot-small.pickle", "snapshot.csv.gz")] {
        let out_path = dir.path().join(out_name);
        let out = bin().args(["trace", input, "-o", out_path.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let (src, copy) = (Source::open(Some(std::path::Path::new(input))).unwrap(), Source::open(Some(&out_path)).unwrap());
        let want = src.sites().unwrap().expect("the input records sites").into_owned();
        let got = copy.sites().unwrap().expect("the trace keeps them").into_owned();
        // Sites are numbered anew in order of first use: compare each allocation's site by name.
        let by_id =
            |s: &allocbench::trace::Sites| s.of_id.iter().map(|(id, &i)| (*id, s.names[i as usize].clone())).collect::<std::collections::BTreeMap<_, _>>();
        let (got, want) = (by_id(&got), by_id(&want));
        assert!(!want.is_empty(), "{input}");
        let differ: Vec<_> = want
            .iter()
            .filter(|(id, site)| got.get(id) != Some(site))
            .map(|(id, _)| *id)
            .chain(got.keys().filter(|id| !want.contains_key(id)).copied())
            .collect();
        assert!(differ.is_empty(), "{input}: {} allocations name another site than the input's, first id {:?}", differ.len(), differ.first());
        let events = |s: &Source| s.events().unwrap().map(|e| e.unwrap()).collect::<Vec<_>>();
        assert_eq!(events(&copy), events(&src), "{input}");
    }
}

#[test]
fn replay_records_the_traces_sha256_and_its_failures_name_the_trace() {
    // The hash is computed while the events replay: it must still be the file's, byte for byte,
    // and a trace that goes bad mid-way still fails with its line.
    let dir = std::env::temp_dir().join(format!("allocbench-sha-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.csv");
    let mut text = String::from("# allocbench trace v1\nop,id,bytes,stream\n");
    for i in 0..5000 {
        text += &format!("alloc,{i},{},0\n", 512 * (1 + i % 97));
        if i % 3 == 0 {
            text += &format!("free,{i}\n");
        }
    }
    std::fs::write(&good, &text).unwrap();
    let out = bin().args(["replay", good.to_str().unwrap(), "--json", "-", "-q"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: String = <sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(v["workload"]["sha256"], want);
    assert_eq!(v["workload"]["kind"], "trace");
    assert_eq!(v["work"]["events"], 5000 + 1667);

    let bad = dir.join("bad.csv");
    std::fs::write(&bad, format!("{text}free,999999\n")).unwrap();
    let out = bin().args(["replay", bad.to_str().unwrap(), "--json", "-", "-q"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("999999"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_incomplete_capture_is_said_when_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let body = "# allocbench capture v1: one alloc per new storage, free when it dies, step after optimizer.step()\n\
                # script: train.py\nop,id,bytes,stream\nalloc,1,4096,0\nstep,1,,\nalloc,2,8192,0\n";
    let incomplete = format!("{body}# capture incomplete: ValueError\n");
    let plain = dir.path().join("t.csv");
    std::fs::write(&plain, &incomplete).unwrap();
    let gz = dir.path().join("t.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut enc, incomplete.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    for trace in [&plain, &gz] {
        for cmd in ["replay", "diagnose", "advise"] {
            let out = bin().arg(cmd).arg(trace).output().unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            let err = stderr(&out);
            assert!(err.contains("is an incomplete capture (ValueError): its numbers cover only what ran"), "{cmd} {}: {err}", trace.display());
        }
    }
    // A complete capture, and a trace that merely has such a comment without being a capture, say nothing.
    std::fs::write(&plain, format!("{body}# capture complete: 1 steps\n")).unwrap();
    let not_capture = dir.path().join("n.csv");
    std::fs::write(&not_capture, "op,id,bytes,stream\nalloc,1,4096,0\n# capture incomplete: ValueError\n").unwrap();
    for trace in [&plain, &not_capture] {
        let out = bin().arg("replay").arg(trace).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!stderr(&out).contains("incomplete"), "{}", stderr(&out));
    }
}

/// A trace cut short at its fake card's OOM (or any stop) is not the whole run: diagnose and
/// advise name no card it fits on and say what to do; a complete one gets the device total (the
/// allocator's peak + the CUDA context), which reconciles, and the smallest card of the table.
#[test]
fn verdicts_come_from_whole_runs_and_count_what_lives_outside_the_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let body = "# allocbench capture v1: one alloc per new storage, free when it dies, step after optimizer.step()\n\
                # fake card memory: 40000000000 bytes (torch.cuda.OutOfMemoryError past it)\n\
                # script: train.py\nop,id,bytes,stream\nalloc,1,30000000000,0\nalloc,2,9000000000,0\n";
    let cut = dir.path().join("cut.csv");
    std::fs::write(&cut, format!("{body}# capture incomplete: OutOfMemoryError\n")).unwrap();
    let out = bin().args(["diagnose", cut.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((d["min_capacity"].as_u64(), d["smallest_card"].as_str()), (None, None), "{d}");
    assert_eq!(d["not_whole_run"], "OutOfMemoryError, after 0 complete steps");
    let text = d["summary"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect::<Vec<_>>().join("\n");
    assert!(!text.contains("runs without an OOM on a device of"), "{text}");
    assert!(
        text.contains("This trace is not the whole run (the capture ended: OutOfMemoryError, after 0 complete steps), so no card is named as fitting")
            && text.contains("`allocbench fit`"),
        "{text}"
    );
    let out = bin().args(["advise", cut.to_str().unwrap(), "-q"]).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.starts_with("This trace is not the whole run (the capture ended: OutOfMemoryError"), "{printed}");

    let whole = dir.path().join("whole.csv");
    std::fs::write(&whole, format!("{body}free,1,,\nfree,2,,\n# capture complete: 0 steps\n")).unwrap();
    let out = bin().args(["diagnose", whole.to_str().unwrap(), "--card", "A100-40GB", "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (reserved, context) = (d["peak_reserved"].as_u64().unwrap(), d["outside"]["cuda_context"].as_u64().unwrap());
    assert_eq!(context, 426 << 20);
    assert_eq!(d["device_total"].as_u64().unwrap(), reserved + context, "allocator + outside = device total");
    assert_eq!(d["headroom"].as_u64().unwrap(), 42_298_834_944 - reserved - context, "{d}");
    assert!(d["summary"][0].as_str().unwrap().starts_with("No OOM on A100-40GB (39.4 GiB): the device total at the peak is"), "{d}");
    assert_eq!(d["min_capacity"].as_u64().unwrap(), reserved + context, "{d}");
    assert_eq!(d["smallest_card"], "A100-40GB-PCIe", "39,000,000,000 B + 426 MiB fit the PCIe card's 42,284,875,776 B");
    // --cuda-context 0: the allocator alone.
    let out = bin().args(["diagnose", whole.to_str().unwrap(), "--card", "A100-40GB", "--cuda-context", "0", "--json", "-"]).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["device_total"], d["peak_reserved"]);
}

/// A CUDA graph capture in a trace: the capture's allocations live in the graph's private pool,
/// so memory freed inside the graph cannot serve the eager allocations after it; the same trace
/// without the pool rows reuses it. A pool row PyTorch refuses is an error naming its line.
#[test]
fn replay_keeps_a_graph_pool_apart_until_it_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let mib20 = 20u64 << 20;
    let body = |pools: bool| {
        let (begin, end, release) = if pools { ("pool_begin,1,,7\n", "pool_end,1,,\n", "pool_release,1,,\n") } else { ("", "", "") };
        format!("op,id,bytes,stream\n{begin}alloc,1,{mib20},7\nfree,1,,\n{end}alloc,2,{mib20},7\nfree,2,,\n{release}empty_cache,,,\n")
    };
    let run = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = bin().args(["replay", path.to_str().unwrap(), "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let graph = run("graph.csv", body(true));
    let eager = run("eager.csv", body(false));
    assert_eq!(graph["stats"]["reserved_bytes.all.peak"], 2 * mib20);
    assert_eq!(eager["stats"]["reserved_bytes.all.peak"], mib20);
    // Released and emptied: nothing stays reserved.
    assert_eq!(graph["stats"]["reserved_bytes.all.current"], 0);
    let path = dir.path().join("bad.csv");
    std::fs::write(&path, "op,id,bytes,stream\npool_end,1,,\n").unwrap();
    let out = bin().args(["replay", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("bad.csv:2: pool_end of pool 1, which is not being allocated to"), "{}", stderr(&out));
}

/// A graph that still holds its pool: the eager request after the capture cannot use the 40 MiB
/// free inside the pool, and the OOM path cannot free them (the pool has a user), so a 60 MiB
/// device runs out; diagnose says how much the private pools hold. Released first, the OOM path
/// gives the pool's segment back and the request fits.
#[test]
fn diagnose_counts_what_private_pools_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mib40 = 40u64 << 20;
    let run = |name: &str, release: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("op,id,bytes,stream\npool_begin,1,,7\nalloc,1,{mib40},7\nfree,1,,\npool_end,1,,\n{release}alloc,2,{mib40},7\n")).unwrap();
        let out = bin().args(["diagnose", path.to_str().unwrap(), "--capacity", "60MiB", "--cuda-context", "0", "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let held = run("held.csv", "");
    assert_eq!(held["oom"]["event"], 4);
    // The 40 MiB free are in the graph's pool: not fragmentation, a pool the request cannot use.
    assert_eq!(
        (held["oom"]["cause"].as_str(), held["oom"]["other_pools_free"].as_u64(), held["oom"]["largest_free_block"].as_u64()),
        (Some("private_pools"), Some(mib40), Some(0))
    );
    assert_eq!((held["private_pool_bytes"].as_u64(), held["private_pool_free_bytes"].as_u64()), (Some(mib40), Some(mib40)));
    let text = held["summary"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect::<Vec<_>>().join("\n");
    assert!(text.contains("40.0 MiB of the reserved bytes are in private pools (CUDA graphs, MemPools), 40.0 MiB of them free"), "{text}");
    assert!(text.contains("Cause: private pools. 40.0 MiB were free in the allocator's segments and 20.0 MiB on the device, together enough for the request, but 40.0 MiB of them sit in pools it cannot use"), "{text}");
    let released = run("released.csv", "pool_release,1,,\n");
    assert!(released["oom"].is_null(), "{released}");
    assert_eq!(released["peak_reserved"], mib40);
}

#[test]
fn diagnose_measures_headroom_and_free_memory_under_a_memory_fraction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let mib30 = 30u64 << 20;
    std::fs::write(&path, format!("op,id,bytes,stream\nalloc,1,{mib30},0\nalloc,2,{mib30},0\nalloc,3,{mib30},0\n")).unwrap();
    let diagnose = |conf: &str| {
        let out =
            bin().args(["diagnose", path.to_str().unwrap(), "--capacity", "200MiB", "--cuda-context", "0", "--conf", conf, "--json", "-"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // A 0.5 fraction of 200 MiB caps the allocator at 100 MiB: 90 MiB reserved leave 10 MiB.
    let capped = diagnose("per_process_memory_fraction:0.5");
    assert_eq!((capped["headroom"].as_u64(), capped["allowed"].as_u64()), (Some(10 << 20), Some(100 << 20)));
    assert!(
        capped["summary"][0].as_str().unwrap().contains("caps the allocator at 100 MiB): peak reserved 90.0 MiB leaves 10.0 MiB of headroom under the cap"),
        "{capped}"
    );
    let uncapped = diagnose("");
    assert_eq!((uncapped["headroom"].as_u64(), uncapped.get("allowed")), (Some(110 << 20), Some(&serde_json::Value::Null)));
    // At 0.4 (80 MiB) the third request fails on the cap while the device has 140 MiB free.
    let failed = diagnose("per_process_memory_fraction:0.4");
    assert_eq!((failed["oom"]["cause"].as_str(), failed["oom"]["allowed"].as_u64()), (Some("fraction_limit"), Some(80 << 20)));
    assert_eq!((failed["oom"]["device_free"].as_u64(), failed["oom"]["device_free_uncapped"].as_u64()), (Some(20 << 20), Some(140 << 20)));
    let cause = failed["summary"][1].as_str().unwrap();
    assert!(cause.contains("per_process_memory_fraction's 80.0 MiB cap left 20.0 MiB while the device itself had 140 MiB free"), "{cause}");
    // Expandable segments map whole 20 MiB pages once the 22 MiB allocation size passed the 25 MiB
    // cap: 40 MiB reserved, said as 15 MiB over the cap, not as 0 B of headroom.
    std::fs::write(&path, format!("op,id,bytes,stream\nalloc,1,{},0\n", 21 << 20)).unwrap();
    let conf = "per_process_memory_fraction:0.25,expandable_segments:True";
    let out = bin().args(["diagnose", path.to_str().unwrap(), "--capacity", "100MiB", "--cuda-context", "0", "--conf", conf, "--json", "-"]).output().unwrap();
    let over: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((over["peak_reserved"].as_u64(), over["allowed"].as_u64()), (Some(40 << 20), Some(25 << 20)));
    assert!(over["summary"][0].as_str().unwrap().contains("peak reserved 40.0 MiB is 15.0 MiB over the cap"), "{over}");
    let out = bin().args(["replay", path.to_str().unwrap(), "--capacity", "100MiB", "--conf", conf]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("peak reserved is 15.0 MiB over the 25.0 MiB cap"), "{}", String::from_utf8_lossy(&out.stdout));
}

/// A capture cut short (no closing line), a trace whose last row has no line end, and a copy made
/// by `allocbench trace` that keeps what the capture said about itself.
#[test]
fn cut_traces_are_flagged_and_trace_copies_keep_a_captures_notes() {
    let dir = tempfile::tempdir().unwrap();
    let header = "# allocbench capture v1: one alloc per new storage, free when it dies, step after optimizer.step()\n\
                  # torch 2.15.0, fake cuda tensors, python 3.11\n# script: train.py\nop,id,bytes,stream\nalloc,1,4096,0\nstep,1,,\n";
    let replay_stderr = |path: &std::path::Path| {
        let out = bin().arg("replay").arg(path).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stderr(&out)
    };
    let cut = dir.path().join("cut.csv");
    std::fs::write(&cut, format!("{header}alloc,2,81")).unwrap();
    let said = replay_stderr(&cut);
    assert!(said.contains("is an incomplete capture (cut short: no closing line"), "{said}");
    assert!(said.contains("cut.csv: the last row has no line end"), "{said}");
    // Its copy keeps both facts in its closing line (the copy's own last row is whole).
    let cut_copy = dir.path().join("cut-copy.csv");
    assert!(bin().args(["trace", cut.to_str().unwrap(), "-o", cut_copy.to_str().unwrap()]).output().unwrap().status.success());
    assert!(
        replay_stderr(&cut_copy)
            .contains("incomplete capture (cut short: no closing line, so it was truncated or copied while the capture ran; its last row was cut)"),
        "{}",
        replay_stderr(&cut_copy)
    );
    // A header with no row and no line end has nothing to cut.
    let header_only = dir.path().join("h.csv");
    std::fs::write(&header_only, "op,id,bytes,stream").unwrap();
    assert_eq!(replay_stderr(&header_only), "");
    let plain = dir.path().join("plain.csv");
    std::fs::write(&plain, "op,id,bytes,stream\nalloc,1,4096,0\nalloc,2,81").unwrap();
    assert!(replay_stderr(&plain).contains("plain.csv: the last row has no line end"), "{}", replay_stderr(&plain));
    std::fs::write(&plain, "op,id,bytes,stream\nalloc,1,4096,0\nalloc,2,8192,0\n").unwrap();
    assert_eq!(replay_stderr(&plain), "");
    // The copy of an incomplete capture that set its own allocator settings says both, as the original.
    let original = dir.path().join("orig.csv");
    std::fs::write(
        &original,
        format!("{header}free,1,,\n# allocator settings made by the script: expandable_segments:True\n# capture incomplete: ValueError\n"),
    )
    .unwrap();
    for copy in ["copy.csv", "copy.csv.gz"] {
        let copy = dir.path().join(copy);
        let out = bin().args(["trace", original.to_str().unwrap(), "-o", copy.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let said = replay_stderr(&copy);
        assert!(said.contains("is an incomplete capture (ValueError)"), "{said}");
        assert!(said.contains("the captured script set the allocator's settings (expandable_segments:True)"), "{said}");
        let out = bin().args(["replay", copy.to_str().unwrap(), "--json", "-"]).output().unwrap();
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["workload"]["description"], "captured from torch 2.15.0: train.py");
    }
}

/// At an OOM, diagnose names the failing request's site, ranks the sites by what was requested up
/// to the OOM only (the requests after it never ran), and by what each held at the OOM.
#[test]
fn diagnose_names_the_site_of_the_failing_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let mib = 1u64 << 20;
    std::fs::write(
        &path,
        format!(
            "op,id,bytes,stream\n#site 0 train.py:10 <module>\nalloc,1,{},0\n#site 1 model.py:62 backward\nalloc,2,{},0\n#site 2 train.py:99 <module>\nfree,1,,\nfree,2,,\nalloc,3,{},0\n",
            30 * mib,
            40 * mib,
            500 * mib
        ),
    )
    .unwrap();
    let out = bin().args(["diagnose", path.to_str().unwrap(), "--capacity", "60MiB", "--cuda-context", "0", "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((d["oom"]["event"].as_u64(), d["oom_site"].as_str()), (Some(1), Some("model.py:62 in backward")));
    // train.py:99's 500 MiB come after the OOM: not counted.
    assert_eq!(d["top_sites"], serde_json::json!([["model.py:62 in backward", 40 * mib], ["train.py:10 in <module>", 30 * mib]]));
    assert!(d["summary"].as_array().unwrap().iter().any(|l| l == "The failing request was made at model.py:62 in backward."), "{d}");
    // The breakdown is of the failing moment: it adds up to what was reserved then.
    let sum: u64 = ["pending_free_bytes", "pinned_free_bytes", "cached_free_segments_bytes"].iter().map(|k| d[k].as_u64().unwrap()).sum();
    assert_eq!(d["oom"]["allocated"].as_u64().unwrap() + sum, d["oom"]["reserved"].as_u64().unwrap(), "{d}");
    let text = bin().args(["diagnose", path.to_str().unwrap(), "--capacity", "60MiB", "--cuda-context", "0"]).output().unwrap();
    // What each site held when the request failed: train.py:10's 30 MiB (model.py:62's request
    // is the one that failed, so it holds nothing).
    assert_eq!(d["top_sites_live"], serde_json::json!([["train.py:10 in <module>", 30 * mib]]));
    assert!(String::from_utf8_lossy(&text.stdout).contains("allocation sites by bytes live at the OOM:\n"));
}

/// `replay --json`'s segment map is the one at the peak moment its summary describes: its blocks
/// add up to `allocated_at_peak_reserved` and its segments to `peak_reserved`. (The replay thins
/// its snapshots; without a second pass to the peak the map was the one at the next step.)
#[test]
fn replay_json_segment_map_is_the_one_at_the_peak() {
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("t.csv");
    std::fs::write(
        &small,
        "op,id,bytes,stream\nstep,1,,\nalloc,1,1000,0\nalloc,2,600000,0\nalloc,3,1048577,0\nfree,2,,\nalloc,4,500000,0\nstep,2,,\nalloc,5,11000000,0\nfree,1,,\nfree,3,,\nfree,4,,\nfree,5,,\n",
    )
    .unwrap();
    let captured = format!("{}/workloads/captured/model-switch.csv.gz", env!("CARGO_MANIFEST_DIR"));
    let html = dir.path().join("v.html");
    // With --html the memory view's own replay gives the map, also past OOMs (--on-oom continue).
    let with_view = ["--capacity", "10GiB", "--on-oom", "continue", "--html", html.to_str().unwrap()];
    for (input, extra) in [(small.to_str().unwrap(), &[][..]), (&captured, &[][..]), (&captured, &with_view[..])] {
        let out = bin().args(["replay", input, "--json", "-"]).args(extra).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let segments = r["segments_at_peak"].as_array().unwrap();
        let reserved: u64 = segments.iter().map(|s| s["total_size"].as_u64().unwrap()).sum();
        let allocated: u64 = segments
            .iter()
            .flat_map(|s| s["blocks"].as_array().unwrap())
            .filter(|b| b["state"] == "active_allocated")
            .map(|b| b["size"].as_u64().unwrap())
            .sum();
        assert_eq!(reserved, r["summary"]["peak_reserved"].as_u64().unwrap(), "{input} {extra:?}");
        assert_eq!(allocated, r["summary"]["allocated_at_peak_reserved"].as_u64().unwrap(), "{input} {extra:?}");
        assert!(extra.is_empty() || r["oom"].is_object(), "the view's case runs out of memory");
    }
}

/// `run`'s header names the input's events and the device the policies ran on, whatever the
/// first row was; a --conf no allocator takes is said.
#[test]
fn run_header_counts_the_inputs_events_and_names_the_device() {
    let w = workload("scenario-sawtooth.toml");
    let out = bin().args(["run", &w, "--allocators", "ideal,pytorch", "-q"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let header = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_string();
    assert_eq!(header, "scenario-sawtooth (scenario), 49 events, simulated H100-80GB (79.2 GiB)");
    let out = bin().args(["run", &w, "--capacity", "1GiB", "-q"]).output().unwrap();
    let header = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_string();
    assert!(header.contains("events replayed before every run stopped"), "{header}");
    // With --on-oom continue every run goes on to the end: the header counts all the events.
    let out = bin().args(["run", &w, "--capacity", "1GiB", "--on-oom", "continue", "-q"]).output().unwrap();
    let header = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().to_string();
    assert!(header.starts_with("scenario-sawtooth (scenario), 49 events, "), "{header}");
    let out = bin().args(["run", &w, "--allocators", "nocache", "--conf", "expandable_segments:True", "-q"]).output().unwrap();
    assert!(out.status.success());
    assert!(stderr(&out).contains("warning: --conf applies to the pytorch allocator only"), "{}", stderr(&out));
}

/// A sharded job's folder (`capture --nproc-per-node -o DIR`): replay, diagnose, advise and
/// sweep plan read every rank's trace; the rank that runs out of memory first decides the job,
/// each rank has its line, and a rank's communicators bring NCCL's buffers into its total.
#[test]
fn a_folder_of_ranks_traces_is_judged_by_its_worst_rank() {
    let dir = tempfile::tempdir().unwrap();
    let ranks = dir.path().join("job");
    std::fs::create_dir(&ranks).unwrap();
    let trace = |gib: u64, communicator: &str| {
        format!(
            "# allocbench capture v1\nop,id,bytes,stream\nalloc,1,{},0\nalloc,2,1048576,0\nstep,1,,\nfree,2,,\nfree,1,,\nstep,2,,\n# nccl communicator: {communicator}\n# capture complete: 2 steps\n",
            gib << 30
        )
    };
    // Rank 0 (standing for ranks 0-2) holds 10 GiB; rank 3, the pipeline's last stage, 20 GiB
    // and talks to a peer point to point besides its ring.
    std::fs::write(ranks.join("rank-0.csv"), trace(10, "ranks=4 p2p_peers=0")).unwrap();
    std::fs::write(ranks.join("rank-3.csv"), trace(20, "ranks=4 p2p_peers=1")).unwrap();
    let manifest = r#"{"world_size": 4, "nproc_per_node": 4, "nnodes": 1, "ranks_asked": "distinct", "ranks": [
        {"rank": 0, "trace": "rank-0.csv", "state": "complete"}, {"rank": 1, "same_as": 0, "state": "complete"},
        {"rank": 2, "same_as": 0, "state": "complete"}, {"rank": 3, "trace": "rank-3.csv", "state": "complete"}]}"#;
    std::fs::write(ranks.join("ranks.json"), manifest).unwrap();
    let folder = ranks.to_str().unwrap();
    let json = dir.path().join("d.json");
    let out = bin().args(["diagnose", folder, "--capacity", "16GiB", "--json", json.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Rank 3 decides the job's verdict (the first to run out of memory, at step 0; 2 traces for 4 ranks"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("0-2 ") && l.contains("fits")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("3 ") && l.contains("OOM at step 0") && l.contains("<- decides")), "{text}");
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(d["decided_by_rank"], 3);
    assert_eq!(d["ranks"][0]["ranks"], serde_json::json!([0, 1, 2]));
    // NCCL: 32 channels × a connection's buffers (4 MiB + 4.69 MiB + 512 KiB) × peers: rank 0's
    // ring of 4 has two neighbours, rank 3 one more.
    let connection = (4 << 20) + 4_915_200 + 524_288u64;
    assert_eq!(d["ranks"][0]["nccl"], 32 * connection * 2);
    assert_eq!(d["ranks"][1]["nccl"], 32 * connection * 3);
    // With room for both, the one nearest the card's end decides.
    let out = bin().args(["diagnose", folder]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("Rank 3 decides the job's verdict (the least headroom;"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // --nccl overrides the capture's communicators.
    let out = bin().args(["diagnose", folder, "--nccl", "0", "--json", "-"]).output().unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["ranks"][1]["nccl"], 0);
    // replay: a summary per trace, one line a trace, and the worst named.
    let out = bin().args(["replay", folder, "--capacity", "16GiB"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("== ranks 0-2 (one role)") && text.contains("== rank 3 ("), "{text}");
    assert!(text.contains("the job's worst: rank 3 (the first OOM)"), "{text}");
    // advise: on the worst rank.
    let out = bin().args(["advise", folder, "-q"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("advising on rank 3, the job's worst"), "{}", stderr(&out));
    // sweep plan: each rank's trace an input.
    let plan = dir.path().join("plan.jsonl");
    let out = bin().args(["sweep", "plan", folder, "-o", plan.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&plan).unwrap().lines().count(), 2);
    // A manifest naming a missing trace, and an empty folder: one line each.
    std::fs::remove_file(ranks.join("rank-3.csv")).unwrap();
    let out = bin().args(["diagnose", folder]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).trim().lines().count() == 1 && stderr(&out).contains("rank 3's trace"), "{}", stderr(&out));
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = bin().args(["replay", empty.to_str().unwrap()]).output().unwrap();
    assert!(out.status.code() == Some(2) && stderr(&out).contains("no rank-R traces"), "{}", stderr(&out));
}
