//! PyTorch snapshot and RMM log import, diagnose and advise.

use std::path::{Path, PathBuf};

use allocbench::event::Event;
use allocbench::gpu::config::AllocatorConfig;
use allocbench::input::Source;
use allocbench::trace::snapshot::{import_rmm_log, import_snapshot};
use assert_cmd::Command;
use proptest::prelude::*;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

fn counts(events: &[Event]) -> (usize, usize, usize) {
    let a = events.iter().filter(|e| matches!(e, Event::Alloc { .. })).count();
    let f = events.iter().filter(|e| matches!(e, Event::Free { .. })).count();
    let c = events.iter().filter(|e| matches!(e, Event::EmptyCache)).count();
    (a, f, c)
}

#[test]
fn real_snapshot_imports_every_alloc_and_free() {
    // Written by scripts/make_snapshot.py with PyTorch 2.11 on an H100: 549 alloc and 546
    // free_completed entries (pickle protocol 4, shared frame lists through the memo).
    let t = import_snapshot(&fixture("snapshot-small.pickle")).unwrap();
    assert_eq!(counts(&t.events), (549, 546, 0));
    assert!(!t.truncated);
    assert!(t.notes.iter().any(|n| n.contains("3 blocks still allocated")), "{:?}", t.notes);
    // Sites come from the frames: the training script's own lines.
    assert!(t.sites.names.iter().any(|s| s.starts_with("make_snapshot.py:")), "{:?}", t.sites.names);
    assert!(t.events.iter().all(|e| !matches!(e, Event::Alloc { bytes: 0, .. })));
}

/// Replaying the real snapshot (with the cudaMalloc addresses it recorded) under the rules of the
/// release that made it, 2.11, ends with exactly the segments PyTorch had when it was dumped: 27
/// (23 × 2 MiB, 2 × 20 MiB, 2 × 32 MiB), 150 MiB. (Under 2.15's rules, where an older segment
/// wins an equal-size tie, the same history ends with 26.)
#[test]
fn replaying_a_real_snapshot_reproduces_pytorchs_segments() {
    let replay = |torch: &str| {
        let out = Command::cargo_bin("allocbench")
            .unwrap()
            .args(["replay", fixture("snapshot-small.pickle").to_str().unwrap(), "--torch-version", torch, "--json", "-"])
            .output()
            .unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(replay("2.15")["stats"]["segment.all.current"], 26);
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["replay", fixture("snapshot-small.pickle").to_str().unwrap(), "--torch-version", "2.11", "--json", "-"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["segment.all.current"], 27);
    assert_eq!(v["stats"]["reserved_bytes.all.current"], 157_286_400);
    assert_eq!(v["stats"]["segment.small_pool.current"], 23);
    let t = import_snapshot(&fixture("snapshot-small.pickle")).unwrap();
    assert_eq!(t.segment_addresses.len(), 27);
    // advise replays the same addresses: its defaults row is this replay (it used to place the
    // segments itself, and ended with 26 segments, 148 MiB: a saving measured from the wrong base).
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["advise", fixture("snapshot-small.pickle").to_str().unwrap(), "--torch-version", "2.11", "--quiet", "--json", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let defaults = a["configs"].as_array().unwrap().iter().find(|c| c["conf"] == "").unwrap();
    assert_eq!((defaults["peak_reserved"].as_u64(), defaults["device_mallocs"].as_u64()), (Some(157_286_400), Some(27)), "{defaults}");
}

/// A block used by another stream (recordStream): PyTorch records its free_requested at the free
/// and its free_completed only when the stream's event completes, at a later malloc. The import
/// turns that into record_stream on a side stream + free, and a sync of that stream where the
/// free completed; the replay then needs the second segment PyTorch needed, and reuses the block
/// afterwards as PyTorch did.
#[test]
fn a_deferred_free_in_a_snapshot_replays_as_record_stream_and_sync() {
    use allocbench::trace::snapshot::SIDE_STREAM_BASE;
    let t = import_snapshot(&fixture("snapshot-record-stream.pickle")).unwrap();
    let side = SIDE_STREAM_BASE;
    assert_eq!(
        t.events,
        vec![
            Event::Alloc { id: 0, bytes: 20 << 20, stream: 0 },
            Event::RecordStream { id: 0, stream: side },
            Event::Free { id: 0 },
            Event::Alloc { id: 1, bytes: 20 << 20, stream: 0 },
            Event::Free { id: 1 },
            Event::Sync { stream: Some(side) },
            Event::Alloc { id: 2, bytes: 20 << 20, stream: 0 },
        ]
    );
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["replay", fixture("snapshot-record-stream.pickle").to_str().unwrap(), "--json", "-", "-q"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Two segment_alloc entries in the history, two cudaMallocs in the replay.
    assert_eq!(v["stats"]["num_device_alloc"], 2);
    assert_eq!(v["stats"]["reserved_bytes.all.peak"], 40 << 20);
    assert_eq!(t.segment_addresses.len(), 2);
}

#[test]
fn truncated_history_is_detected_and_said() {
    let t = import_snapshot(&fixture("snapshot-truncated.pickle")).unwrap();
    assert!(t.truncated);
    assert!(t.notes.iter().any(|n| n.contains("truncated")), "{:?}", t.notes);
    // The ring buffer kept only frees: their blocks are allocated at the start, as are the 3
    // blocks live at the snapshot that the kept history never touches.
    assert_eq!(counts(&t.events), (131, 128, 0));
    assert!(t.notes.iter().any(|n| n.starts_with("3 blocks (")), "{:?}", t.notes);
    let out = Command::cargo_bin("allocbench").unwrap().args(["replay", fixture("snapshot-truncated.pickle").to_str().unwrap(), "-q"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
}

#[test]
fn snapshot_to_csv_trace_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("s.csv");
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["trace", fixture("snapshot-small.pickle").to_str().unwrap(), "-o", csv.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The addresses have no column: said, not dropped silently.
    assert!(String::from_utf8_lossy(&out.stderr).contains("note: the CSV does not keep the 27 cudaMalloc addresses the input recorded"));
    let back: Vec<Event> = allocbench::trace::read_trace(&csv).unwrap().map(|e| e.unwrap()).collect();
    assert_eq!(back, import_snapshot(&fixture("snapshot-small.pickle")).unwrap().events);
}

#[test]
fn bad_pickles_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let real = std::fs::read(fixture("snapshot-small.pickle")).unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (write("list.pickle", b"\x80\x04]\x94(K\x01K\x02e."), "not a PyTorch memory snapshot: the file holds a 2-item list"),
        (write("dict.pickle", b"\x80\x04}\x94."), "no 'device_traces'"),
        (write("cut.pickle", &real[..real.len() / 2]), "truncated pickle"),
        (write("evil.pickle", b"\x80\x02cos\nsystem\n(S'echo hi'\ntR."), "would import or call code"),
        (write("text.pickle", b"\xff\xfehello"), "unsupported pickle opcode 0xff"),
        (write("empty.pickle", b""), "is empty: not a snapshot"),
        // A truncated history's first free of a 2^70-byte block (python: pickle.dumps of
        // {'device_traces': [[{'action': 'free_completed', 'addr': 1, 'size': 2**70}]]}) once
        // wrapped to an alloc of 0 bytes.
        (write("huge-free.pickle", b"\x80\x04\x95\x53\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x0e\x66\x72\x65\x65\x5f\x63\x6f\x6d\x70\x6c\x65\x74\x65\x64\x94\x8c\x04\x61\x64\x64\x72\x94\x4b\x01\x8c\x04\x73\x69\x7a\x65\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x40\x75\x61\x61\x73\x2e"), "free_completed of a 1180591620717411303424-byte block"),
        // The JSON form: an empty file is no pickle, and 2**70 (digits past 64 bits, which
        // serde_json reads as a float) is an integer too big to allocate.
        (write("empty.json", b" \n"), "is empty: not a snapshot"),
        (
            write("huge.json", br#"{"device_traces": [[{"action": "alloc", "addr": 4096, "size": 1180591620717411303424, "stream": 0}]]}"#),
            "trace entry 0: alloc of 1180591620717411303424 bytes: 1 EiB or more",
        ),
    ];
    for (path, want) in cases {
        let e = import_snapshot(&path).unwrap_err().to_string();
        assert!(e.contains(want) && e.starts_with(&path.display().to_string()), "{e}");
        let out = Command::cargo_bin("allocbench").unwrap().args(["replay", path.to_str().unwrap()]).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Mutated real snapshots (the fixtures are the corpus) never panic: they import or fail.
    #[test]
    fn mutated_snapshots_never_panic(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in any::<prop::sample::Index>(), which in any::<bool>()) {
        let mut bytes = std::fs::read(fixture(if which { "snapshot-small.pickle" } else { "snapshot-truncated.pickle" })).unwrap();
        for (i, b) in flips {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        let keep = bytes.len() - cut.index(bytes.len() / 4 + 1);
        bytes.truncate(keep);
        // Never a panic; whatever imports is a stream a replay accepts (allocs of ids not live,
        // sizes > 0, frees of live ids, sites only for allocated ids), and errors say something.
        match allocbench::trace::pickle::parse(&bytes) {
            Ok(v) => match allocbench::trace::snapshot::from_snapshot_value(&v) {
                Ok(t) => {
                    let mut live = std::collections::HashSet::new();
                    let mut allocated = std::collections::HashSet::new();
                    for ev in &t.events {
                        match *ev {
                            Event::Alloc { id, bytes, .. } => {
                                prop_assert!(bytes > 0);
                                prop_assert!(live.insert(id), "alloc of live id {}", id);
                                allocated.insert(id);
                            }
                            Event::Free { id } => prop_assert!(live.remove(&id), "free of id {} that is not live", id),
                            _ => {}
                        }
                    }
                    prop_assert!(t.sites.of_id.keys().all(|id| allocated.contains(id)));
                    prop_assert!(t.sites.of_id.values().all(|&s| (s as usize) < t.sites.names.len()));
                }
                Err(msg) => prop_assert!(!msg.is_empty() && !msg.contains('\n'), "{:?}", msg),
            },
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}

#[test]
fn rmm_logs_import() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rmm.csv");
    std::fs::write(
        &p,
        "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x7f0000000000,1048576,0x0\n1,0.2,allocate,0x7f0000100000,4096,0x0\n1,0.3,free,0x7f0000000000,1048576,0x0\n1,0.4,allocate failure,0x0,99999999999,0x0\n",
    )
    .unwrap();
    let t = import_rmm_log(&p).unwrap();
    assert_eq!(t.events, vec![Event::Alloc { id: 0, bytes: 1 << 20, stream: 0 }, Event::Alloc { id: 1, bytes: 4096, stream: 0 }, Event::Free { id: 0 }]);
    assert_eq!(t.notes, vec!["1 failed allocation in the log skipped".to_string()]);
    assert!(matches!(Source::open(Some(&p)).unwrap(), Source::Imported(..)));
    std::fs::write(&p, "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0xZZ,10,0x0\n").unwrap();
    assert!(import_rmm_log(&p).unwrap_err().to_string().ends_with("rmm.csv:2: bad pointer '0xZZ'"));
}

fn pinned_trace(dir: &Path) -> PathBuf {
    let p = dir.join("pinned.csv");
    std::fs::write(&p, "op,id,bytes,stream\nstep,1,,\nalloc,1,5242880,0\nalloc,2,5242880,0\nalloc,3,5242880,0\nalloc,4,5242880,0\nstep,2,,\nfree,1,,\nfree,3,,\nalloc,5,8388608,0\n").unwrap();
    p
}

#[test]
fn diagnose_explains_a_fragmentation_oom() {
    let dir = tempfile::tempdir().unwrap();
    let trace = pinned_trace(dir.path());
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["diagnose", trace.to_str().unwrap(), "--capacity", "20MiB", "--cuda-context", "0", "--json", "-"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["type"], "diagnose");
    assert_eq!(v["oom"]["event"], 8);
    assert_eq!(v["oom"]["step"], 2);
    assert_eq!(v["oom"]["requested"], 8u64 << 20);
    assert_eq!(v["oom"]["cause"], "fragmentation");
    // 20 MiB holds the 4 x 5 MiB; the 8 MiB request then needs a second 20 MiB segment.
    assert_eq!(v["min_capacity"], 40u64 << 20);
    assert_eq!(v["pinned_free_bytes"], 10u64 << 20);
    let text = v["summary"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect::<Vec<_>>().join(" ");
    assert!(text.contains("Cause: fragmentation"), "{text}");
    let out = Command::cargo_bin("allocbench").unwrap().args(["diagnose", trace.to_str().unwrap(), "--capacity", "1GiB"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("No OOM on a 1.00 GiB device"));
}

#[test]
fn advise_finds_a_configuration_that_avoids_the_oom() {
    // The 1.3B workload (calibrated against a PyTorch capture: 71.3 GiB live at peak) needs a
    // 74.2 GiB device under the defaults; on a 73 GiB card it OOMs, while expandable segments
    // fit in 71.6 GiB.
    let w = Workload(format!("{}/workloads/gpt3-xl-1.3b.toml", env!("CARGO_MANIFEST_DIR")));
    let source = Source::open(Some(Path::new(&w.0))).unwrap();
    let events = allocbench::diagnose::load_events(&source).unwrap();
    let confs = vec![String::new(), "expandable_segments:True".to_string(), "max_split_size_mb:512".to_string()];
    let info = source.info().unwrap();
    let opts = allocbench::advise::AdviseOptions {
        capacity: 73 << 30,
        threads: 2,
        objective: allocbench::results::Objective::Memory,
        model: allocbench::gpu::devprobe::LatencyModel::h100(),
        addresses: Vec::new(),
        outside: allocbench::gpu::card::Outside::NONE,
        not_whole_run: None,
        step_time_s: None,
        flops: None,
    };
    let r = allocbench::advise::advise(&events, &info, &confs, &opts, None).unwrap();
    assert_eq!(r.configs.len(), 3);
    assert_eq!(r.configs[0].conf, "expandable_segments:True");
    assert_eq!(r.recommended.as_ref().map(|c| c.conf.as_str()), Some("expandable_segments:True"));
    assert!(!r.configs[0].oom && r.configs[0].modelled_alloc_time_s > 0.0);
    assert!(r.configs.iter().find(|c| c.conf.is_empty()).unwrap().oom_step.is_some(), "the defaults OOM on 73 GiB");
    let space = allocbench::advise::search_space();
    assert!(space.len() >= 1000 && space[0].is_empty(), "PyTorch's defaults lead a space of {} settings", space.len());
    assert!(space.iter().all(|c| AllocatorConfig::parse(c).is_ok()));
    let unique: std::collections::HashSet<&String> = space.iter().collect();
    assert_eq!(unique.len(), space.len());
}

struct Workload(String);

/// A snapshot saved as JSON (`json.dump(torch.cuda.memory._snapshot(), f)`; the fixtures are the
/// pickles' dicts dumped so) imports exactly as its pickle does and replays to the same stats;
/// the first byte decides the format, not the name; broken JSON is a one-line error with its place.
#[test]
fn a_snapshot_saved_as_json_imports_as_its_pickle() {
    for name in ["snapshot-truncated", "snapshot-record-stream"] {
        let from_json = import_snapshot(&fixture(&format!("{name}.json"))).unwrap();
        let from_pickle = import_snapshot(&fixture(&format!("{name}.pickle"))).unwrap();
        assert!(!from_json.events.is_empty(), "{name}");
        assert_eq!(from_json.events, from_pickle.events, "{name}");
        assert_eq!(from_json.sites.names, from_pickle.sites.names, "{name}");
        assert_eq!(
            (from_json.truncated, &from_json.notes, &from_json.segment_addresses),
            (from_pickle.truncated, &from_pickle.notes, &from_pickle.segment_addresses),
            "{name}"
        );
        let stats = |file: &str| {
            let out = Command::cargo_bin("allocbench").unwrap().args(["replay", fixture(file).to_str().unwrap(), "--json", "-", "-q"]).output().unwrap();
            assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
            serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["stats"].clone()
        };
        assert_eq!(stats(&format!("{name}.json")), stats(&format!("{name}.pickle")), "{name}");
    }
    let dir = tempfile::tempdir().unwrap();
    // A pickle under a .json name is still read as the pickle it is.
    let renamed = dir.path().join("snap.json");
    std::fs::copy(fixture("snapshot-truncated.pickle"), &renamed).unwrap();
    assert_eq!(import_snapshot(&renamed).unwrap().events, import_snapshot(&fixture("snapshot-truncated.pickle")).unwrap().events);
    let text = std::fs::read_to_string(fixture("snapshot-record-stream.json")).unwrap();
    // Saved with a byte-order mark: JSON all the same.
    let bom = dir.path().join("bom.json");
    std::fs::write(&bom, format!("\u{feff}{text}")).unwrap();
    assert_eq!(import_snapshot(&bom).unwrap().events, import_snapshot(&fixture("snapshot-record-stream.json")).unwrap().events);
    let traces_dict = "{\"segments\": [], \"device_traces\": {\"0\": []}}";
    for (bad, content, says) in [
        ("cut.json", &text[..text.len() / 2], "not readable JSON"),
        ("other.json", "{\"segments\": []}", "no 'device_traces'"),
        ("traces-dict.json", traces_dict, "'device_traces' is a dict, not the list"),
    ] {
        let path = dir.path().join(bad);
        std::fs::write(&path, content).unwrap();
        let out = Command::cargo_bin("allocbench").unwrap().args(["replay", path.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: {err}");
        assert!(err.contains(bad) && err.contains(says), "{bad}: {err}");
    }
    assert!(String::from_utf8_lossy(
        &Command::cargo_bin("allocbench").unwrap().args(["replay", dir.path().join("cut.json").to_str().unwrap()]).output().unwrap().stderr
    )
    .contains("line 1"));
}

/// A snapshot whose segments include a CUDA graph's private pool: the import says that its
/// allocations replay in the allocator's own pools (the history does not say when they were routed).
#[test]
fn snapshots_with_private_pool_segments_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("graph.json");
    let segment = |pool: [u64; 2], size: u64| {
        format!(r#"{{"address": 0, "total_size": {size}, "stream": 0, "segment_type": "large", "segment_pool_id": [{}, {}], "blocks": []}}"#, pool[0], pool[1])
    };
    let trace = r#"[{"action": "alloc", "addr": 1024, "size": 4096, "stream": 0}]"#;
    let text = |segs: Vec<String>| format!(r#"{{"segments": [{}], "device_traces": [{trace}]}}"#, segs.join(", "));
    std::fs::write(&p, text(vec![segment([0, 0], 2 << 20), segment([1, 0], 20 << 20), segment([0, 3], 2 << 20)])).unwrap();
    let t = import_snapshot(&p).unwrap();
    assert!(t.notes.iter().any(|n| n.starts_with("2 segments (23068672 bytes) were in private pools")), "{:?}", t.notes);
    std::fs::write(&p, text(vec![segment([0, 0], 2 << 20)])).unwrap();
    assert!(import_snapshot(&p).unwrap().notes.iter().all(|n| !n.contains("private pools")));
}

/// A JSON snapshot with `trace` as device 0's history and `segments` as its segments.
fn json_snapshot(dir: &Path, name: &str, segments: &str, trace: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!(r#"{{"segments": [{segments}], "device_traces": [[{trace}]]}}"#)).unwrap();
    p
}

fn frames(file: &str, line: u32, name: &str) -> String {
    format!(
        r#"[{{"filename": "{file}", "line": {line}, "name": "{name}"}}, {{"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1736, "name": "_call_impl"}}]"#
    )
}

fn allocbench(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::cargo_bin("allocbench").unwrap().args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Recording usually starts after the model is loaded: the weights are in the snapshot's segments
/// but the history never allocates them. They count from the start (MemoryViz's
/// `initially_allocated`), so a card smaller than the weights does not "fit".
#[test]
fn blocks_allocated_before_the_history_count_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let weights = r#"{"address": 1073741824, "total_size": 2147483648, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
        "blocks": [{"address": 1073741824, "size": 2147483648, "requested_size": 2147483000, "state": "active_allocated", "frames": []}]}"#;
    let act = r#"{"address": 8589934592, "total_size": 20971520, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
        "blocks": [{"address": 8589934592, "size": 20971520, "requested_size": 20971520, "state": "active_allocated", "frames": []}]}"#;
    let f = frames("/home/u/train.py", 52, "forward");
    let trace = format!(
        r#"{{"action": "segment_alloc", "addr": 8589934592, "size": 20971520, "stream": 0, "frames": {f}}},
           {{"action": "alloc", "addr": 8589934592, "size": 20971520, "stream": 0, "frames": {f}}},
           {{"action": "alloc", "addr": 8610906112, "size": 1048576, "stream": 0, "frames": {f}}},
           {{"action": "free_requested", "addr": 8610906112, "size": 1048576, "stream": 0}},
           {{"action": "free_completed", "addr": 8610906112, "size": 1048576, "stream": 0}}"#
    );
    let p = json_snapshot(dir.path(), "weights.json", &format!("{weights}, {act}"), &trace);
    let t = import_snapshot(&p).unwrap();
    assert_eq!(t.events[0], Event::Alloc { id: 0, bytes: 2147483000, stream: 0 }, "{:?}", t.events);
    assert_eq!(counts(&t.events), (3, 1, 0));
    assert!(t.notes.iter().any(|n| n.starts_with("1 block (2147483000 bytes) the snapshot holds was allocated before the history began")), "{:?}", t.notes);
    let (code, stdout, _) = allocbench(&["diagnose", p.to_str().unwrap(), "--capacity", "1GiB"]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("OOM at step 0 (event 0): a request of 2.00 GiB"), "{stdout}");
    // A block the history allocated is not counted twice.
    let (_, stdout, _) = allocbench(&["replay", p.to_str().unwrap(), "--json", "-", "-q"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["work"]["peak_live_bytes"], 2147483000u64 + 20971520 + 1048576);
}

/// PyTorch records a failed malloc only as an `oom` entry (TraceEntry::OOM, with the rounded size
/// and the device's free bytes): the import replays it as a request where it was made, so diagnose
/// on the card it failed on explains it, and names its site.
#[test]
fn a_recorded_out_of_memory_error_is_replayed_where_it_happened() {
    let dir = tempfile::tempdir().unwrap();
    let mut trace: Vec<String> = (0..7u64)
        .map(|i| {
            format!(
                r#"{{"action": "alloc", "addr": {}, "size": 10737418240, "stream": 0, "frames": {}}}"#,
                (i + 1) << 36,
                frames("/home/u/train.py", 40, "main")
            )
        })
        .collect();
    trace.push(format!(
        r#"{{"action": "oom", "addr": 9985798963, "device_free": 9985798963, "size": 12884901888, "stream": 0, "frames": {}}}"#,
        frames("/home/u/model.py", 31, "Attention.forward")
    ));
    trace.push(r#"{"action": "free_requested", "addr": 68719476736, "size": 10737418240, "stream": 0}"#.into());
    trace.push(r#"{"action": "free_completed", "addr": 68719476736, "size": 10737418240, "stream": 0}"#.into());
    let p = json_snapshot(dir.path(), "oom.json", "", &trace.join(", "));
    let t = import_snapshot(&p).unwrap();
    assert_eq!(&t.events[7..9], &[Event::Alloc { id: 7, bytes: 12884901888, stream: 0 }, Event::Free { id: 7 }]);
    assert!(
        t.notes
            .iter()
            .any(|n| n.starts_with("the history ends with an out-of-memory error (trace entry 7: a 12884901888-byte request, with 9985798963 bytes free")),
        "{:?}",
        t.notes
    );
    let (code, stdout, _) = allocbench(&["diagnose", p.to_str().unwrap(), "--capacity", "80GiB"]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("OOM at step 0 (event 7): a request of 12.0 GiB"), "{stdout}");
    assert!(stdout.contains("The failing request was made at model.py:31 in Attention.forward."), "{stdout}");
    // On a card with room, the request is served and freed at once: nothing after it changes.
    let (_, stdout, _) = allocbench(&["replay", p.to_str().unwrap(), "--capacity", "100GiB", "--json", "-", "-q"]);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((v["summary"]["ooms"].as_u64(), v["work"]["live_bytes_end"].as_u64()), (Some(0), Some(6 * 10737418240)));
    // An OOM the script caught (allocations follow it, as in a batch-size search) is said, not
    // replayed: the run went on without it.
    trace.push(format!(r#"{{"action": "alloc", "addr": 1, "size": 1048576, "stream": 0, "frames": {}}}"#, frames("/home/u/train.py", 50, "main")));
    let p = json_snapshot(dir.path(), "caught.json", "", &trace.join(", "));
    let t = import_snapshot(&p).unwrap();
    assert!(!t.events.contains(&Event::Alloc { id: 7, bytes: 12884901888, stream: 0 }), "{:?}", t.events);
    let caught = "1 out-of-memory error the script caught (allocations follow; the first at trace entry 7, a 12884901888-byte request) is not replayed";
    assert!(t.notes.iter().any(|n| n == caught), "{:?}", t.notes);
    assert_eq!(counts(&t.events).2, 0);
    // Its malloc's retry flushed the cache (segment_free with the malloc's frames, then the oom):
    // the flush is kept though the request is not.
    let flush = format!(
        r#"{{"action": "segment_free", "addr": 4096, "size": 2097152, "stream": 0, "frames": {}}}"#,
        frames("/home/u/model.py", 31, "Attention.forward")
    );
    trace.insert(7, flush);
    let p = json_snapshot(dir.path(), "caught-flush.json", "", &trace.join(", "));
    let t = import_snapshot(&p).unwrap();
    assert_eq!(counts(&t.events).2, 1, "{:?}", t.events);
    assert!(!t.events.contains(&Event::Alloc { id: 7, bytes: 12884901888, stream: 0 }));
}

/// A run of segment releases right before a new segment is a malloc's retry path only when it is
/// that malloc's (PyTorch records both with the malloc's context: the same frames); releases with
/// other frames, or under empty_cache, are an explicit torch.cuda.empty_cache().
#[test]
fn an_explicit_empty_cache_is_told_from_a_mallocs_retry() {
    let dir = tempfile::tempdir().unwrap();
    let history = |release_frames: &str, next_frames: &str, free_frames: &str| {
        format!(
            r#"{{"action": "segment_alloc", "addr": 4096000000, "size": 104857600, "stream": 0, "frames": {a}}},
               {{"action": "alloc", "addr": 4096000000, "size": 104857600, "stream": 0, "frames": {a}}},
               {{"action": "free_requested", "addr": 4096000000, "size": 104857600, "stream": 0, "frames": {free_frames}}},
               {{"action": "free_completed", "addr": 4096000000, "size": 104857600, "stream": 0, "frames": {free_frames}}},
               {{"action": "segment_free", "addr": 4096000000, "size": 104857600, "stream": 0, "frames": {release_frames}}},
               {{"action": "segment_alloc", "addr": 8192000000, "size": 157286400, "stream": 0, "frames": {next_frames}}},
               {{"action": "alloc", "addr": 8192000000, "size": 157286400, "stream": 0, "frames": {next_frames}}}"#,
            // A history without frames has none at its first allocation either.
            a = if next_frames == "[]" { "[]".to_string() } else { frames("/home/u/train.py", 52, "forward") }
        )
    };
    let evaluate = frames("/home/u/train.py", 120, "evaluate");
    let bigger = frames("/home/u/train.py", 95, "main");
    let empty_cache = r#"[{"filename": "/usr/lib/python3/site-packages/torch/cuda/memory.py", "line": 222, "name": "empty_cache"}]"#;
    let forward = frames("/home/u/train.py", 52, "forward");
    let all = forward.as_str(); // the first segment's and block's allocation frames
    for (name, release, next, free, explicit) in [
        ("other-frames.json", evaluate.as_str(), bigger.as_str(), evaluate.as_str(), true),
        ("names-empty-cache.json", empty_cache, empty_cache, evaluate.as_str(), true),
        ("retry.json", bigger.as_str(), bigger.as_str(), evaluate.as_str(), false),
        ("no-frames.json", "[]", "[]", "[]", false),
        // context="alloc" (frees carry no frames): empty_cache gathers none either, and c10's
        // release_block records the segment's own allocation frames, whatever the next malloc's.
        ("alloc-context-empty-cache.json", all, all, "[]", true),
        ("alloc-context-retry.json", bigger.as_str(), bigger.as_str(), "[]", false),
        // As PyTorch writes context="alloc": frees carry their block's allocation frames.
        ("alloc-context-frees-as-allocated.json", all, all, all, true),
        ("alloc-context-frees-as-allocated-retry.json", bigger.as_str(), bigger.as_str(), all, false),
    ] {
        let p = json_snapshot(dir.path(), name, "", &history(release, next, free));
        let t = import_snapshot(&p).unwrap();
        assert_eq!(counts(&t.events).2, explicit as usize, "{name}: {:?}", t.events);
        let (_, stdout, _) = allocbench(&["replay", p.to_str().unwrap(), "--json", "-", "-q"]);
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        // After an empty_cache the 100 MiB segment is gone: 150 MiB at most; without, both.
        let peak = if explicit { 157286400u64 } else { 104857600 + 157286400 };
        assert_eq!(v["summary"]["peak_reserved"].as_u64(), Some(peak), "{name}");
    }
    // A smaller next segment: the released 100 MiB block, cached whole, would have served that
    // malloc without any cudaMalloc, so nothing failed and retried; whatever the frames say (or
    // do not), the release was an empty_cache.
    for (name, release, next, free) in
        [("no-frames-smaller.json", "[]", "[]", "[]"), ("same-frames-smaller.json", bigger.as_str(), bigger.as_str(), evaluate.as_str())]
    {
        let p = json_snapshot(dir.path(), name, "", &history(release, next, free).replace("157286400", "62914560"));
        let t = import_snapshot(&p).unwrap();
        assert_eq!(counts(&t.events).2, 1, "{name}: {:?}", t.events);
        let (_, stdout, _) = allocbench(&["replay", p.to_str().unwrap(), "--json", "-", "-q"]);
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!((v["summary"]["peak_reserved"].as_u64(), v["stats"]["reserved_bytes.all.current"].as_u64()), (Some(104857600), Some(62914560)), "{name}");
    }
}

/// Snapshots before torch 2.1 give a block no address and keep its request and frames in
/// `history[0]` (`addr`, `real_size`; _memory_viz._block_extra_legacy): weights allocated before
/// the history count from the start there too (they were dropped). A segment reserved before the
/// history that nothing replayed re-makes is said, not silently left out.
#[test]
fn older_snapshot_layouts_and_earlier_segments_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let (weights, act) = (1u64 << 32, 1u64 << 34);
    let legacy = format!(
        r#"{{"device": 0, "address": {weights}, "total_size": 1073741824, "stream": 0, "segment_type": "large", "blocks": [
            {{"size": 1048576, "state": "inactive"}},
            {{"size": 1072693248, "state": "active_allocated", "history": [{{"addr": {w2}, "real_size": 1072690000, "frames": {f}}}]}}]}},
           {{"device": 0, "address": {act}, "total_size": 104857600, "stream": 0, "segment_type": "large", "blocks": [{{"size": 104857600, "state": "inactive"}}]}}"#,
        w2 = weights + (1 << 20),
        f = frames("/home/u/load.py", 7, "load_weights")
    );
    let trace = format!(
        r#"{{"action": "segment_alloc", "addr": {act}, "size": 104857600, "stream": 0}}, {{"action": "alloc", "addr": {act}, "size": 104857600, "stream": 0}},
           {{"action": "free_requested", "addr": {act}, "size": 104857600, "stream": 0}}, {{"action": "free_completed", "addr": {act}, "size": 104857600, "stream": 0}}"#
    );
    let t = import_snapshot(&json_snapshot(dir.path(), "torch20.json", &legacy, &trace)).unwrap();
    assert!(t.notes.iter().any(|n| n.starts_with("1 block (1072690000 bytes) the snapshot holds was allocated before the history began")), "{:?}", t.notes);
    assert_eq!(t.events[0], Event::Alloc { id: 0, bytes: 1072690000, stream: 0 });
    assert!(t.notes.iter().all(|n| !n.contains("reserved before the history")), "the weights' segment is replayed: {:?}", t.notes);
    // The history allocates inside a segment reserved before it (no segment_alloc, nothing of it
    // allocated at the start): said, with its size.
    let warm = format!(
        r#"{{"device": 0, "address": {weights}, "total_size": 1073741824, "stream": 0, "segment_type": "large", "blocks": [{{"address": {weights}, "size": 1073741824, "state": "inactive"}}]}}"#
    );
    let inside = format!(
        r#"{{"action": "alloc", "addr": {weights}, "size": 629145600, "stream": 0}}, {{"action": "free_requested", "addr": {weights}, "size": 629145600, "stream": 0}}, {{"action": "free_completed", "addr": {weights}, "size": 629145600, "stream": 0}}"#
    );
    let t = import_snapshot(&json_snapshot(dir.path(), "warm.json", &warm, &inside)).unwrap();
    assert!(
        t.notes.iter().any(|n| n.starts_with("1 segment (1073741824 bytes) the snapshot holds was reserved before the history began and is not replayed")),
        "{:?}",
        t.notes
    );
}

/// Which device's history a snapshot of several devices gives is said: the first recorded one.
#[test]
fn the_imported_device_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let history = r#"[{"action": "alloc", "addr": 4096, "size": 1048576, "stream": 0}]"#;
    for (name, traces, says) in [
        ("second.json", format!("[[], {history}]"), "imported device 1's history (the only one recorded)"),
        (
            "both.json",
            format!("[{history}, {history}]"),
            "2 devices have histories: imported device 0's, the first (the others are not replayed; --snapshot-device N picks another)",
        ),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, format!(r#"{{"segments": [], "device_traces": {traces}}}"#)).unwrap();
        let t = import_snapshot(&p).unwrap();
        assert!(t.notes.iter().any(|n| n == says), "{name}: {:?}", t.notes);
    }
}

/// `--snapshot-device N` picks another device's history of a snapshot of several GPUs, in the
/// importer and on the command line; a device without one, or the flag on a trace, is refused
/// with the devices that have one.
#[test]
fn another_device_is_picked_with_snapshot_device() {
    use allocbench::trace::snapshot::import_snapshot_of_device;
    let dir = tempfile::tempdir().unwrap();
    let one = r#"[{"action": "alloc", "addr": 4096, "size": 1048576, "stream": 0}]"#;
    let two = r#"[{"action": "alloc", "addr": 8192, "size": 2097152, "stream": 0}, {"action": "free_completed", "addr": 8192, "size": 2097152, "stream": 0}]"#;
    let both = dir.path().join("both.json");
    // A CUDA graph's segment on device 2 is said for device 2 alone.
    let graph = r#"{"device": 2, "address": 1048576000, "total_size": 2097152, "stream": 0, "segment_type": "large", "segment_pool_id": [1, 0], "blocks": [{"address": 1048576000, "size": 2097152, "state": "inactive"}]}"#;
    std::fs::write(&both, format!(r#"{{"segments": [{graph}], "device_traces": [{one}, [], {two}]}}"#)).unwrap();
    let first = import_snapshot_of_device(&both, None).unwrap();
    assert_eq!(first.events, import_snapshot(&both).unwrap().events);
    assert!(matches!(first.events[..], [Event::Alloc { bytes: 1048576, .. }]), "{:?}", first.events);
    assert!(first.notes.iter().any(|n| n.contains("imported device 0's, the first") && n.contains("--snapshot-device N")), "{:?}", first.notes);
    assert!(first.notes.iter().all(|n| !n.contains("private pools")), "{:?}", first.notes);
    let third = import_snapshot_of_device(&both, Some(2)).unwrap();
    assert!(matches!(third.events[..], [Event::Alloc { bytes: 2097152, .. }, Event::Free { .. }]), "{:?}", third.events);
    assert!(third.notes.iter().any(|n| n == "imported device 2's history (--snapshot-device)"), "{:?}", third.notes);
    assert!(third.notes.iter().any(|n| n.starts_with("1 segments (2097152 bytes) were in private pools")), "{:?}", third.notes);
    for d in [1, 3] {
        let e = import_snapshot_of_device(&both, Some(d)).unwrap_err().to_string();
        assert!(e.contains(&format!("no history for device {d} (devices with one: 0, 2)")), "{e}");
    }

    let csv = dir.path().join("device2.csv");
    let (code, _, err) = allocbench(&["trace", both.to_str().unwrap(), "--snapshot-device", "2", "-o", csv.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.contains(",2097152,") && !text.contains(",1048576,"), "{text}");
    let (code, _, err) = allocbench(&["replay", both.to_str().unwrap(), "--snapshot-device", "1"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no history for device 1") && err.trim().lines().count() == 1, "{err}");
    let (code, _, err) = allocbench(&["replay", csv.to_str().unwrap(), "--snapshot-device", "0"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--snapshot-device") && err.contains("is not a PyTorch memory snapshot"), "{err}");
    // Each device's replay is a workload of its own (a report would take them for repetitions).
    for (device, name) in [(None, "both-device0"), (Some("0"), "both-device0"), (Some("2"), "both-device2")] {
        let mut args = vec!["replay", both.to_str().unwrap(), "--json", "-"];
        args.extend(device.map(|d| ["--snapshot-device", d]).into_iter().flatten());
        let (code, out, err) = allocbench(&args);
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["workload"]["name"], name, "{device:?}");
    }
    let single = dir.path().join("single.json");
    std::fs::write(&single, format!(r#"{{"segments": [], "device_traces": [{one}]}}"#)).unwrap();
    let (_, out, err) = allocbench(&["replay", single.to_str().unwrap(), "--json", "-"]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {err}"))["workload"]["name"], "single");
}

/// A block whose free waited for another stream's work completes inside a malloc's retry
/// (release_cached_blocks synchronizes events first), and its segment is then released: it was
/// not free when the malloc looked, so a smaller next segment does not make that release an
/// empty_cache.
#[test]
fn a_release_after_a_late_completion_is_still_the_mallocs_retry() {
    let dir = tempfile::tempdir().unwrap();
    let e = |action: &str, addr: u64, size: u64| format!(r#"{{"action": "{action}", "addr": {addr}, "size": {size}, "stream": 0}}"#);
    let (x, y, mib) = (4096000000u64, 8192000000u64, 1u64 << 20);
    let w = 2048000000u64;
    let history = [
        e("segment_alloc", w, 2 * mib),
        e("alloc", w, 1024),
        e("segment_alloc", x, 100 * mib),
        e("alloc", x, 100 * mib),
        e("free_requested", x, 100 * mib), // waits for another stream: no free_completed right after
        e("free_requested", w, 1024),
        e("free_completed", w, 1024),
        e("free_completed", x, 100 * mib), // the retry's synchronize_and_free_events
        e("segment_free", x, 100 * mib),
        e("segment_alloc", y, 60 * mib),
        e("alloc", y, 60 * mib),
    ];
    let t = import_snapshot(&json_snapshot(dir.path(), "late.json", "", &history.join(", "))).unwrap();
    assert_eq!(counts(&t.events).2, 0, "a retry, not an empty_cache: {:?}", t.events);
}

/// `_record_memory_history(skip_actions=["free_completed"])` records frees only as requested:
/// each completes there (it used to wait forever on a side stream, and ten reuses of one 20 MiB
/// block needed ten segments). A free whose free_completed is missing completes where its
/// address is allocated again.
#[test]
fn frees_without_their_free_completed_complete() {
    let dir = tempfile::tempdir().unwrap();
    let entry = |action: &str, addr: u64| format!(r#"{{"action": "{action}", "addr": {addr}, "size": 20971520, "stream": 0}}"#);
    let mut skipped = vec![entry("segment_alloc", 1 << 30)];
    for _ in 0..10 {
        skipped.push(entry("alloc", 1 << 30));
        skipped.push(entry("free_requested", 1 << 30));
    }
    let p = json_snapshot(dir.path(), "skipped.json", "", &skipped.join(", "));
    let t = import_snapshot(&p).unwrap();
    assert!(t.notes.iter().any(|n| n.contains("records no free_completed")), "{:?}", t.notes);
    assert!(!t.events.iter().any(|e| matches!(e, Event::RecordStream { .. })), "{:?}", t.events);
    // One waiting free (another stream used the block), its free_completed cut from the history,
    // then the address allocated again: it completed before that.
    let waited = [
        entry("segment_alloc", 1 << 30),
        entry("alloc", 1 << 30),
        entry("free_requested", 1 << 30),
        entry("alloc", (1 << 30) + (40 << 20)),
        entry("alloc", 1 << 30), // still waiting, it would need a third segment
    ];
    let q = json_snapshot(dir.path(), "waited.json", "", &waited.join(", "));
    for (file, segments) in [(&p, 1), (&q, 2)] {
        let (code, stdout, stderr) = allocbench(&["replay", file.to_str().unwrap(), "--json", "-", "-q"]);
        assert_eq!(code, Some(0), "{stderr}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["stats"]["num_device_alloc"].as_u64(), Some(segments), "{}: {stdout}", file.display());
    }
}

/// With `stacks="all"` (the default of _record_memory_history) the allocator's own C++ frames
/// come first: the site is the first Python frame outside torch.
#[test]
fn sites_skip_the_allocators_cpp_frames() {
    let dir = tempfile::tempdir().unwrap();
    let f = r#"[{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"},
                {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1500, "name": "malloc"},
                {"filename": "/usr/lib/python3/site-packages/torch/nn/functional.py", "line": 2100, "name": "linear"},
                {"filename": "/home/u/model.py", "line": 31, "name": "Attention.forward"}]"#;
    let p = json_snapshot(dir.path(), "cpp.json", "", &format!(r#"{{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "frames": {f}}}"#));
    assert_eq!(import_snapshot(&p).unwrap().sites.names, vec!["model.py:31 in Attention.forward".to_string()]);
}

/// Snapshot notes: the allocator settings it was recorded under, markers skipped silently,
/// unknown actions counted once per action; and what is not a snapshot says what it is.
#[test]
fn snapshot_notes_and_refusals_say_what_the_file_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut trace: Vec<String> = (0..300).map(|i| format!(r#"{{"action": "frobnicate", "addr": {i}}}"#)).collect();
    trace.push(r#"{"action": "annotate", "addr": 0}"#.into());
    trace.push(r#"{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}"#.into());
    let p = dir.path().join("settings.json");
    std::fs::write(
        &p,
        format!(
            r#"{{"segments": [], "device_traces": [[{}]], "allocator_settings": {{"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": true, "max_split_size": 536870912, "garbage_collection_threshold": 0.0}}}}"#,
            trace.join(", ")
        ),
    )
    .unwrap();
    let notes = import_snapshot(&p).unwrap().notes;
    assert!(notes.contains(&"the snapshot was recorded under the allocator settings expandable_segments:True,max_split_size_mb:512; replays use PyTorch's defaults unless given --conf 'expandable_segments:True,max_split_size_mb:512'".to_string()), "{notes:?}");
    assert!(notes.contains(&"300 trace entries with the unknown action 'frobnicate' skipped".to_string()), "{notes:?}");
    assert!(!notes.iter().any(|n| n.contains("annotate")), "{notes:?}");
    // The copy of such a history reads back (notes and sites stay within the reader's line limit).
    let csv = dir.path().join("copy.csv");
    assert_eq!(allocbench(&["trace", p.to_str().unwrap(), "-o", csv.to_str().unwrap()]).0, Some(0));
    assert_eq!(allocbench(&["replay", csv.to_str().unwrap(), "-q"]).0, Some(0));

    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let bad_size = json_snapshot(dir.path(), "float.json", "", r#"{"action": "alloc", "addr": 4096, "size": 512.5}"#);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &std::fs::read(fixture("snapshot-small.pickle")).unwrap()).unwrap();
    let gzipped = write("snap.pickle.gz", &gz.finish().unwrap());
    assert_eq!(import_snapshot(&gzipped).unwrap().events, import_snapshot(&fixture("snapshot-small.pickle")).unwrap().events);
    for (path, want) in [
        (bad_size, "trace entry 0 (alloc): 'size' is a float, not an integer"),
        (write("ints.json", b"[1, 2, 3]"), "not a PyTorch memory snapshot: the file holds a 3-item list"),
        (write("saved.pickle", b"PK\x03\x04rest-of-a-zip"), "a zip archive (what torch.save writes)"),
        (write("old.json", br#"[{"total_size": 2097152, "blocks": []}]"#), "an older snapshot layout (a bare list of segments"),
    ] {
        let e = import_snapshot(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()) && e.contains(want), "{e}");
    }
}

/// RMM logs as current RMM writes them: a failed allocation's null pointer printed `(nil)`, a
/// gzip-compressed log; rows that do not match the header, bad streams and absurd sizes are
/// errors naming the line; frees of pointers the log never allocated are counted.
#[test]
fn rmm_logs_written_by_other_hands_and_cut_logs_import() {
    let dir = tempfile::tempdir().unwrap();
    let rows = "1,10:00:00:000001,allocate,0x7f0000000000,1048576,0x0\n1,10:00:00:000002,allocate,(nil),0,0x0\n1,10:00:00:000003,free,(nil),0,0x0\n";
    let want = vec![Event::Alloc { id: 0, bytes: 1 << 20, stream: 0 }];
    // A BOM, spaced or reordered columns: still RMM logs (they used to be read as CSV traces and
    // refused for their header), and a 0-byte allocation's free is no unknown free.
    for (name, text) in [
        ("bom.csv", format!("\u{feff}Thread,Time,Action,Pointer,Size,Stream\n{rows}")),
        ("spaced.csv", format!("Thread, Time, Action, Pointer, Size, Stream\n{}", rows.replace(',', ", "))),
        ("reordered.csv", "Action,Pointer,Size,Stream,Thread,Time\nallocate,0x7f0000000000,1048576,0x0,1,10:00:00:000001\n".to_string()),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        match Source::open(Some(&p)).unwrap() {
            Source::Imported(t, _) => {
                assert_eq!(t.events, want, "{name}");
                assert!(t.notes.iter().all(|n| !n.contains("never allocated")), "{name}: {:?}", t.notes);
            }
            _ => panic!("{name} is an RMM log"),
        }
    }
    // RMM buffers its log: a process that died leaves a row without its end. It is skipped, said.
    let p = dir.path().join("cut.csv");
    for cut in ["1,10:00:00:0000", "1,10:00:00:000004,allocate,0x7f0000200000,1048576,0x", "1,10:00:00:000004,allocate,0x7f0000200000,1048576,0x7f3a"] {
        std::fs::write(&p, format!("Thread,Time,Action,Pointer,Size,Stream\n{rows}{cut}")).unwrap();
        let t = import_rmm_log(&p).unwrap();
        assert_eq!(t.events, want, "{cut}");
        assert!(t.notes.iter().any(|n| n.contains("has no line end (the log was cut): skipped")), "{cut}: {:?}", t.notes);
    }
    // A short row with its line end is still refused.
    std::fs::write(&p, format!("Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00:0000\n{rows}")).unwrap();
    assert!(import_rmm_log(&p).unwrap_err().to_string().contains("cut.csv:2: 2 fields where the header has 6"));
}

#[test]
fn rmm_logs_as_rmm_writes_them_and_bad_rows() {
    let dir = tempfile::tempdir().unwrap();
    let header = "Thread,Time,Action,Pointer,Size,Stream\n";
    let rows = "1,10:00:00:000001,allocate,0x7f0000000000,1048576,0x0\n1,10:00:00:000002,allocate failure,(nil),18446744073709551615,0x0\n1,10:00:00:000003,free,0x7f00000f0000,4096,0x0\n1,10:00:00:000004,free,0x7f0000000000,1048576,0x0\n1,10:00:00:000005,free,0x7f0000000000,1048576,0x0\n";
    let p = dir.path().join("rmm.csv");
    std::fs::write(&p, format!("{header}{rows}")).unwrap();
    let t = import_rmm_log(&p).unwrap();
    assert_eq!(t.events, vec![Event::Alloc { id: 0, bytes: 1 << 20, stream: 0 }, Event::Free { id: 0 }]);
    assert_eq!(
        t.notes,
        vec![
            "1 failed allocation in the log skipped".to_string(),
            "1 free skipped: its pointer was never allocated in the log (allocated before it began)".to_string(),
            "1 free skipped: a second free of a pointer already freed (a double free in the log)".to_string()
        ]
    );
    // Gzip in two members (`gzip -c a >> log.gz`, as logs are appended): all of it is read.
    let gz_path = dir.path().join("rmm.csv.gz");
    let member = |text: &str| {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, text.as_bytes()).unwrap();
        gz.finish().unwrap()
    };
    let (first, rest) = rows.split_at(rows.find("1,10:00:00:000003").unwrap());
    std::fs::write(&gz_path, [member(&format!("{header}{first}")), member(rest)].concat()).unwrap();
    match Source::open(Some(&gz_path)).unwrap() {
        Source::Imported(t2, _) => assert_eq!(t2.events, t.events),
        _ => panic!("a gzip RMM log is an RMM log"),
    }
    for (row, want) in [
        ("1,t,allocate,0x10,64,0x0,extra\n", "rmm.csv:2: 7 fields where the header has 6"),
        ("1,t,allocate,0x10,64\n", "rmm.csv:2: 5 fields where the header has 6"),
        ("1,t,allocate,0x10,64,zz\n", "rmm.csv:2: bad stream 'zz'"),
        ("1,t,allocate,0x10,18446744073709551615,0x0\n", "rmm.csv:2: size 18446744073709551615: 1 EiB or more"),
    ] {
        std::fs::write(&p, format!("{header}{row}")).unwrap();
        let e = import_rmm_log(&p).unwrap_err().to_string();
        assert!(e.ends_with(want) || e.contains(want), "{e}");
        assert_eq!(allocbench(&["replay", p.to_str().unwrap()]).0, Some(2));
    }
    std::fs::write(&p, header).unwrap();
    assert_eq!(import_rmm_log(&p).unwrap().notes, vec!["the log holds no allocations".to_string()]);
    // `allocate` rows with a null pointer hold nothing: two of them are no reuse of one pointer,
    // and the free of a real allocation between them still lands on it.
    let nulls = "1,t,allocate,(nil),4096,0x0\n1,t,allocate,0x7f0000000000,512,0x0\n1,t,allocate,0x0,8192,0x0\n1,t,free,0x7f0000000000,512,0x0\n";
    std::fs::write(&p, format!("{header}{nulls}")).unwrap();
    let t = import_rmm_log(&p).unwrap();
    assert_eq!(t.events, vec![Event::Alloc { id: 0, bytes: 512, stream: 0 }, Event::Free { id: 0 }]);
    assert_eq!(t.notes, vec!["2 allocations with a null pointer skipped (nothing was allocated)".to_string()]);
}

/// A stream that is not a handle is a corrupt entry, not the default stream; an allocation at the
/// address of a live block (its free lost) frees that block first, and says so.
#[test]
fn a_bad_stream_is_refused_and_a_lost_free_is_said() {
    let dir = tempfile::tempdir().unwrap();
    for (stream, want) in
        [(r#""0x7f""#, "trace entry 1 (alloc): 'stream' is a str, not an integer"), ("-3", "trace entry 1 (alloc): 'stream' is -3, not a stream handle")]
    {
        let trace =
            format!(r#"{{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}}, {{"action": "alloc", "addr": 8192, "size": 512, "stream": {stream}}}"#);
        let p = json_snapshot(dir.path(), "bad-stream.json", "", &trace);
        let err = import_snapshot(&p).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        let (code, _, stderr) = allocbench(&["replay", p.to_str().unwrap()]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(want) && stderr.trim_end().lines().count() == 1, "{stderr}");
    }
    let segment = r#"{"address": 4096, "total_size": 2097152, "stream": 1.5, "segment_type": "small", "blocks": []}"#;
    let p = json_snapshot(dir.path(), "bad-segment.json", segment, r#"{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}"#);
    assert!(import_snapshot(&p).unwrap_err().to_string().contains("segment 0: 'stream' is"), "a segment's stream too");
    let twice = r#"{"action": "alloc", "addr": 4096, "size": 512, "stream": 0}, {"action": "alloc", "addr": 4096, "size": 1024, "stream": 0}"#;
    let t = import_snapshot(&json_snapshot(dir.path(), "twice.json", "", twice)).unwrap();
    assert_eq!(t.events, vec![Event::Alloc { id: 0, bytes: 512, stream: 0 }, Event::Free { id: 0 }, Event::Alloc { id: 1, bytes: 1024, stream: 0 }]);
    assert!(t.notes.iter().any(|n| n.starts_with("1 alloc at the address of a live block")), "{:?}", t.notes);
}
