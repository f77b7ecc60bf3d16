//! Bad input: one clear line naming the file, line and field; never a panic.

use allocbench::workload::Workload;

const GOOD: &str = r#"
name = "t"
seed = 1

[transformer]
steps = 2
batch = 1
seq_len = { dist = "uniform", min = 16, max = 32 }
param_dtype = "fp32"
activation_dtype = "bf16"
optimizer = "adam_foreach"
attention = "math"

[transformer.model]
layers = 2
d_model = 64
heads = 4
ffn = 256
vocab = 100
"#;

fn err(src: &str) -> String {
    Workload::parse(src, "w.toml").expect_err("should be rejected").to_string()
}

#[test]
fn good_workload_parses() {
    let w = Workload::parse(GOOD, "w.toml").unwrap();
    assert!(w.events().count() > 100);
}

#[test]
fn errors_name_file_line_and_field() {
    let mut cases: Vec<(String, &str)> = vec![
        (GOOD.replace("steps = 2", "steps = 2\nstepz = 3"), "w.toml:7: unknown field `stepz`"),
        (GOOD.replace("layers = 2", "layers = 0"), "w.toml:15: field `transformer.model.layers`: must be > 0"),
        (GOOD.replace("batch = 1", "batch = -1"), "w.toml:7: invalid value: integer `-1`"),
        (GOOD.replace("min = 16, max = 32", "min = 64, max = 32"), "w.toml:8: field `transformer.seq_len`: min 64 > max 32"),
        (GOOD.replace("d_model = 64", "d_model = 2000000"), "w.toml:16: field `transformer.model.d_model`: 2000000 is absurdly large"),
        (GOOD.replace("max = 32", "max = 16000000"), "w.toml:8: field `transformer.seq_len`: implies a tensor of"),
        (GOOD.replace("optimizer = \"adam_foreach\"", "optimizer = \"lion\""), "w.toml:11: unknown variant `lion`"),
        (GOOD.replace("[transformer]", "[transformer"), "w.toml:5:"),
        (GOOD[..GOOD.len() / 2].to_string(), "w.toml:"),
        ("name = \"x\"\n".to_string(), "expected exactly one of the tables"),
        (
            "name = \"x\"\n[scenario]\nevents = [{ op = \"alloc\", id = 1, bytes = \"2EiB\" }]\n".to_string(),
            "scenario.events[0]: alloc of 2305843009213693952 bytes is 1 EiB or more",
        ),
        ("name = \"x\"\n[scenario]\nevents = [{ op = \"free\", id = 9 }]\n".to_string(), "scenario.events[0]: free of id 9"),
        ("name = \"x\"\n[scenario]\nevents = [{ op = \"alloc\", id = 1, bytes = \"5 parsecs\" }]\n".to_string(), "unknown unit"),
    ];
    // Comments quoting a key are not where the field is set (the shipped gpt3-xl-1.3b.toml
    // quotes `seq_len = ...` in a comment above its tables; errors pointed at the comment).
    let commented = format!("# seq_len = {{ dist = \"fixed\" }}\n# layers = 3\n{GOOD}");
    cases.push((commented.replace("min = 16, max = 32", "min = 64, max = 32"), "w.toml:10: field `transformer.seq_len`: min 64 > max 32"));
    cases.push((
        GOOD.replace("batch = 1", "batch = 1 # layers = 0\n").replace("layers = 2", "layers = 0"),
        "w.toml:16: field `transformer.model.layers`: must be > 0",
    ));
    for (src, want) in cases {
        let e = err(&src);
        assert!(e.contains(want), "expected {want:?} in {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn non_utf8_workload_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(&p, b"name = \"x\"\n\xff\xfe\n").unwrap();
    let e = Workload::load(&p).unwrap_err().to_string();
    assert!(e.contains("bad.toml:2: not valid UTF-8"), "{e}");
}

/// A serving workload whose model is not Llama-style, or whose explicit arrivals are out of range,
/// is refused in one line naming the field.
#[test]
fn serving_workloads_refuse_a_gelu_model_and_bad_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/serving-llama7b.toml")).unwrap();
    for (edit, field) in [
        (base.replace("ffn_kind = \"swiglu\"", "ffn_kind = \"gelu\""), "serving.model.ffn_kind"),
        (base.replace("[serving.model]", "arrivals = [[0, 10, 10]]\n[serving.model]"), "serving.arrivals"),
        (base.replace("[serving.model]", "arrivals = [[1, 10, 0]]\n[serving.model]"), "serving.arrivals"),
    ] {
        let path = dir.path().join("w.toml");
        std::fs::write(&path, edit).unwrap();
        let out = assert_cmd::Command::cargo_bin("allocbench").unwrap().args(["replay", path.to_str().unwrap()]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(field) && err.trim().lines().count() == 1, "{err}");
    }
}

/// A model-switch schedule (`residencies`, as switch.py --schedule-out writes it) that does not
/// fit its table: one line naming the file, line and residency.
#[test]
fn model_switch_residencies_must_fit_the_table() {
    let good = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/switch-small-math.toml")).unwrap();
    assert!(Workload::parse(&good, "w.toml").is_ok());
    let line = good.lines().position(|l| l.starts_with("residencies = ")).unwrap() + 1;
    let cases = [
        (good.replacen("{ model = 1,", "{ model = 2,", 1), "residency 1: model = 2 is not an index into the 2 models"),
        (good.replacen("seq_lens = [52, 21, 47]", "seq_lens = [52, 21]", 1), "residency 0: needs steps_per_model = 3 sequence lengths"),
        (good.replacen("seq_lens = [52, 21, 47]", "seq_lens = [52, 0, 47]", 1), "residency 0: needs steps_per_model = 3 sequence lengths in 1..=2^24"),
        (good.replace("switches = 4", "switches = 5"), "lists 4 residencies but switches = 5"),
    ];
    for (src, want) in cases {
        let e = err(&src);
        assert!(e.contains(want), "expected {want:?} in {e:?}");
        assert!(e.starts_with(&format!("w.toml:{line}: field `model_switch.residencies`")), "{e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

/// `kv_heads` (grouped-query attention) must divide `heads` and lie in 1..=heads; gpt.py models
/// have none (Llama-style training, serving and model switches do). One line naming the file, the key's line and the field;
/// exit 2 from the CLI.
#[test]
fn kv_heads_must_divide_heads_where_grouped_query_attention_is_modelled() {
    let fixture = |name: &str| std::fs::read_to_string(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let (serving, switch) = (fixture("serve-tiny-gqa-cat.toml"), fixture("switch-tiny-gqa.toml"));
    assert!(Workload::parse(&serving, "w.toml").is_ok() && Workload::parse(&switch, "w.toml").is_ok());
    let line_of = |src: &str| src.lines().position(|l| l.starts_with("kv_heads")).unwrap() + 1;
    let training_llama = GOOD.replace("vocab = 100", "vocab = 100\nffn_kind = \"swiglu\"\nkv_heads = 2");
    assert!(Workload::parse(&training_llama, "w.toml").is_ok(), "Llama-style training models grouped-query attention");
    let cases = [
        (serving.replace("kv_heads = 2", "kv_heads = 3"), "field `serving.model.kv_heads`: 3 must divide heads = 4 (1 ≤ kv_heads ≤ heads)"),
        (serving.replace("kv_heads = 2", "kv_heads = 0"), "field `serving.model.kv_heads`: 0 must divide heads = 4"),
        (serving.replace("kv_heads = 2", "kv_heads = 8"), "field `serving.model.kv_heads`: 8 must divide heads = 4"),
        (switch.replace("kv_heads = 2", "kv_heads = 3"), "field `model_switch.models[0].kv_heads`: 3 must divide heads = 4"),
        (
            GOOD.replace("vocab = 100", "vocab = 100\nkv_heads = 2"),
            "field `transformer.model.kv_heads`: gpt.py (ffn_kind = \"gelu\") has no grouped-query attention",
        ),
        (training_llama.replace("kv_heads = 2", "kv_heads = 3"), "field `transformer.model.kv_heads`: 3 must divide heads = 4"),
    ];
    for (src, want) in cases {
        let e = err(&src);
        assert!(e.starts_with(&format!("w.toml:{}: ", line_of(&src))), "names the kv_heads line: {e}");
        assert!(e.contains(want), "expected {want:?} in {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.toml");
    std::fs::write(&path, serving.replace("kv_heads = 2", "kv_heads = 3")).unwrap();
    let out = assert_cmd::Command::cargo_bin("allocbench").unwrap().args(["replay", path.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("w.toml:") && stderr.contains("serving.model.kv_heads") && stderr.trim().lines().count() == 1, "{stderr}");
}

/// Values that parse but mean nothing are refused with the field's line, instead of changing the
/// result quietly: a DDP bucket that is no size, sequences past a model's learned positions, an
/// empty residency list, keys an `empty_cache` row does not take, more objects kept than made.
#[test]
fn values_that_mean_nothing_are_refused() {
    let ddp = GOOD.replace("[transformer.model]", "[transformer.ddp]\nbucket_cap_mb = BUCKET\n\n[transformer.model]");
    for bucket in ["0", "-25", "nan", "inf"] {
        let e = err(&ddp.replace("BUCKET", bucket));
        assert!(e.contains("field `transformer.ddp.bucket_cap_mb`") && e.contains("is not a bucket size"), "{bucket}: {e}");
    }
    assert!(Workload::parse(&ddp.replace("BUCKET", "25"), "w.toml").is_ok());
    // FSDP: no ranks, FSDP with DDP, with LoRA, with a separate master copy; a misspelt field.
    let fsdp = GOOD.replace("[transformer.model]", "[transformer.fsdp]\nworld_size = RANKS\n\n[transformer.model]");
    assert!(Workload::parse(&fsdp.replace("RANKS", "8"), "w.toml").is_ok());
    let e = err(&fsdp.replace("RANKS", "0"));
    assert!(e.contains("field `transformer.fsdp.world_size`") && e.contains("must be > 0"), "{e}");
    let e = err(&fsdp.replace("RANKS", "8").replace("[transformer.model]", "[transformer.ddp]\n\n[transformer.model]"));
    assert!(e.contains("field `transformer.fsdp`") && e.contains("HSDP"), "{e}");
    let e = err(&fsdp.replace("RANKS", "8").replace("vocab = 100", "vocab = 100\nlora_rank = 8"));
    assert!(e.contains("field `transformer.fsdp`") && e.contains("LoRA"), "{e}");
    let e = err(&fsdp.replace("RANKS", "8").replace("attention = \"math\"", "attention = \"math\"\nmaster_weights = true"));
    assert!(e.contains("master_weights"), "{e}");
    let e = err(&fsdp.replace("RANKS", "8\nreshard_after_froward = false"));
    assert!(e.contains("reshard_after_froward"), "{e}");
    let positions = GOOD.replace("vocab = 100", "vocab = 100\nmax_positions = 20");
    let e = err(&positions);
    assert!(e.contains("field `transformer.model.max_positions`: 20 learned positions, but sequences reach 32 tokens"), "{e}");
    assert!(Workload::parse(&positions.replace("max_positions = 20", "max_positions = 32"), "w.toml").is_ok());

    let switch = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/switch-small-math.toml")).unwrap();
    let listed = switch.lines().find(|l| l.starts_with("residencies = ")).unwrap();
    let e = err(&switch.replace(listed, "residencies = []"));
    assert!(e.contains("field `model_switch.residencies`: lists no residencies"), "{e}");

    let scenario = "name = \"s\"\n[scenario]\nevents = [\n  { op = \"alloc\", id = 1, bytes = 1024 },\n  { op = \"empty_cache\", pool = 3 },\n]\n";
    assert!(err(scenario).contains("unknown field `pool`"), "{}", err(scenario));
    assert!(Workload::parse(&scenario.replace(", pool = 3", ""), "w.toml").is_ok());

    let objects = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/workloads/python-objects.toml")).unwrap();
    let per = objects.lines().find_map(|l| l.strip_prefix("per_iteration = ")).unwrap().trim().parse::<u64>().unwrap();
    let kept = objects.lines().find(|l| l.starts_with("keep = ")).unwrap();
    let e = err(&objects.replace(kept, &format!("keep = {}", per + 1)));
    assert!(e.contains("field `python_objects.keep`"), "{e}");
}
