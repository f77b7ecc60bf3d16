//! `allocbench capture` against real PyTorch (CPU only: CI installs a pinned torch and sets
//! ALLOCBENCH_PYTHON and ALLOCBENCH_REQUIRE_TORCH; elsewhere these tests skip without torch).
//!
//! What is checked: fake and real tensors give the same alloc/free sequence; a fake capture is
//! what torch.profiler records for an untraced real run (CPU-only scratch aside); a user's script
//! with .cuda(), AMP, AdamW, clipping and accumulation captures unedited on fake CUDA; storage
//! semantics (views, in-place, resize, zero bytes, empty_cache); bad input.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

use allocbench::event::{Event, PoolOp};
use allocbench::trace::read_trace;
use assert_cmd::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixture(name: &str) -> String {
    root().join("tests/fixtures/capture").join(name).display().to_string()
}

fn model_script(name: &str) -> String {
    root().join("scripts").join(name).display().to_string()
}

fn python() -> String {
    allocbench::capture::python_for(None)
}

/// False (and the test returns early, counted as skipped) when the Python has no torch, unless
/// CI requires it.
fn have_torch() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    let ok = *HAVE.get_or_init(|| std::process::Command::new(python()).args(["-c", "import torch"]).output().map(|o| o.status.success()).unwrap_or(false));
    if !ok {
        common::skip("capture", &format!("{} cannot import torch (set ALLOCBENCH_PYTHON to a Python with torch)", python()), "ALLOCBENCH_REQUIRE_TORCH");
    }
    ok
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Runs `allocbench capture FLAGS -o DIR/NAME -- SCRIPT ARGS`; returns the output and the trace path.
/// (With a timeout: a capture that regresses into an endless loop fails instead of hanging CI.)
fn capture(dir: &Path, name: &str, flags: &[&str], script_and_args: &[&str]) -> (Output, PathBuf) {
    capture_with_env(dir, name, flags, script_and_args, &[])
}

/// [`capture`] with these environment variables set for the script. (The fake-tensor backend
/// unless the flags name one: most tests here are of its rules; the default, `auto`, has its own.)
fn capture_with_env(dir: &Path, name: &str, flags: &[&str], script_and_args: &[&str], env: &[(&str, &str)]) -> (Output, PathBuf) {
    let trace = dir.join(name);
    let backend: &[&str] = if flags.contains(&"--backend") { &[] } else { &["--backend", "fake-tensors"] };
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .envs(env.iter().copied())
        .arg("capture")
        .args(backend)
        .args(flags)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .args(script_and_args)
        .timeout(std::time::Duration::from_secs(600))
        .output()
        .unwrap();
    (out, trace)
}

fn events(trace: &Path) -> Vec<Event> {
    read_trace(trace).unwrap().map(|e| e.unwrap_or_else(|err| panic!("{err}"))).collect()
}

/// The trace as signed sizes (+bytes an alloc, -bytes a free), steps dropped; ids do not matter.
fn signed_sizes(evs: &[Event]) -> Vec<i64> {
    let mut live = std::collections::HashMap::new();
    let mut out = Vec::new();
    for ev in evs {
        match *ev {
            Event::Alloc { id, bytes, .. } => {
                live.insert(id, bytes as i64);
                out.push(bytes as i64);
            }
            Event::Free { id } => out.push(-live.remove(&id).expect("free of a live id")),
            _ => {}
        }
    }
    out
}

/// How many `workspace`-byte blocks were taken and freed at once (a BLAS call's workspace in
/// torch 2.15's eager mode); every one of that size must be freed.
fn per_call_workspaces(sizes: &[i64], workspace: i64) -> usize {
    let taken = sizes.iter().filter(|&&b| b == workspace).count();
    assert_eq!(taken, sizes.iter().filter(|&&b| b == -workspace).count(), "a {workspace} B workspace was kept");
    sizes.windows(2).filter(|w| w[0] == workspace && w[1] == -workspace).count()
}

/// Signed sizes per phase between step markers (frees may name allocations of earlier phases).
fn phases(evs: &[Event]) -> Vec<Vec<i64>> {
    let mut live = std::collections::HashMap::new();
    let mut out = vec![Vec::new()];
    for ev in evs {
        match *ev {
            Event::Alloc { id, bytes, .. } => {
                live.insert(id, bytes as i64);
                out.last_mut().unwrap().push(bytes as i64);
            }
            Event::Free { id } => out.last_mut().unwrap().push(-live.remove(&id).expect("free of a live id")),
            Event::Step { .. } => out.push(Vec::new()),
            Event::EmptyCache => out.last_mut().unwrap().push(0),
            Event::RecordStream { .. } | Event::Sync { .. } | Event::Pool(_) => {}
        }
    }
    out
}

fn steps(evs: &[Event]) -> Vec<u64> {
    evs.iter().filter_map(|e| if let Event::Step { n } = e { Some(*n) } else { None }).collect()
}

/// How the capture package's own files show in a path (a traceback's frames).
const CAPTURE_FILES: &str = "allocbench_capture/";

/// Every `.py` file of the capture package is embedded in the binary (src/capture.rs's
/// CAPTURE_PACKAGE) as it is on disk, and nothing else is listed: a module left out would be
/// missing where `allocbench capture` runs the package, though the package works from scripts/.
#[test]
fn the_binary_embeds_every_file_of_the_capture_package() {
    let package = root().join("scripts/allocbench_capture");
    let mut on_disk = Vec::new();
    let mut folders = vec![package.clone()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "py" || e == "cpp" || e == "h") {
                let relative = path.strip_prefix(&package).unwrap().iter().map(|p| p.to_str().unwrap()).collect::<Vec<_>>().join("/");
                on_disk.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    // The driver backend's copies of the oracle's fake runtime and NVML (src/gpu/oracle/).
    for (name, oracle) in [("fake_cudart.cpp", "fake_cudart.cpp"), ("fake_nvml.cpp", "fake_nvml.cpp")] {
        on_disk.push((format!("driver/{name}"), std::fs::read_to_string(root().join("src/gpu/oracle").join(oracle)).unwrap()));
    }
    on_disk.sort();
    let mut embedded: Vec<(String, String)> = allocbench::capture::CAPTURE_PACKAGE.iter().map(|(p, t)| (p.to_string(), t.to_string())).collect();
    embedded.sort();
    let names = |files: &[(String, String)]| files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>();
    assert_eq!(names(&embedded), names(&on_disk), "src/capture.rs's CAPTURE_PACKAGE must list every .py, .cpp and .h file of scripts/allocbench_capture/");
    for ((path, text), (_, disk)) in embedded.iter().zip(&on_disk) {
        assert!(text == disk, "{path}: the embedded text is not the file's");
    }
    assert!(on_disk.iter().any(|(p, _)| p == "__main__.py") && on_disk.iter().any(|(p, _)| p == "__init__.py"));
}

const TINY_TRAIN: [&str; 10] = ["--steps", "3", "--seq-len", "16..48", "--batch", "2", "--device", "cpu", "--amp", "none"];

#[test]
fn fake_and_real_cpu_tensors_capture_the_same_sequence() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny-gpt", "tiny-llama"] {
        let mut args = vec![model_script("models/train.py").leak() as &str, "--model", model, "--accum", "2"];
        args.extend(TINY_TRAIN);
        let (fake_out, fake) = capture(dir.path(), &format!("{model}-fake.csv"), &["--device", "cpu"], &args);
        assert!(fake_out.status.success(), "{}", stderr(&fake_out));
        let (real_out, real) = capture(dir.path(), &format!("{model}-real.csv"), &["--device", "cpu", "--real"], &args);
        assert!(real_out.status.success(), "{}", stderr(&real_out));
        let (fake, real) = (events(&fake), events(&real));
        assert_eq!(steps(&fake), vec![1, 2, 3], "{model}: a step after every optimizer.step()");
        assert!(signed_sizes(&fake).len() > 300, "{model}: a training step allocates");
        assert_eq!(signed_sizes(&fake), signed_sizes(&real), "{model}: fake tensors must allocate as real ones do");
        assert_eq!(steps(&fake), steps(&real));
    }
}

#[test]
fn the_capture_counts_the_math_the_transformer_generator_models() {
    if !have_torch() {
        return;
    }
    // The capture's `# flops:` line (torch.utils.flop_counter's formulas over the ops it saw)
    // and the transformer generator's model of the same run, which `advise` estimates a
    // step's time from: equal to the FLOP, with and without checkpointing's recomputation.
    let dir = tempfile::tempdir().unwrap();
    // Llama (SwiGLU, grouped K/V, fused attention) and GPT (GELU, tied, the math path).
    let llama =
        "attention = \"flash\"\n[transformer.model]\nlayers = 2\nd_model = 64\nheads = 4\nkv_heads = 2\nffn = 172\nvocab = 512\nffn_kind = \"swiglu\"\n";
    let gpt = "attention = \"math\"\n[transformer.model]\nlayers = 2\nd_model = 64\nheads = 4\nffn = 256\nvocab = 512\nffn_kind = \"gelu\"\nmax_positions = 128\ntied_embeddings = true\n";
    for (model, attention, shape, checkpointing) in
        [("tiny-llama", "sdpa", llama, false), ("tiny-llama", "sdpa", llama, true), ("tiny-gpt", "math", gpt, false)]
    {
        let mut args = vec![model_script("models/train.py").leak() as &str, "--model", model, "--steps", "2", "--seq-len", "48"];
        args.extend(["--batch", "2", "--amp", "none", "--attention", attention]);
        if checkpointing {
            args.push("--checkpointing");
        }
        let (out, trace) = capture(dir.path(), &format!("flops-{model}-{checkpointing}.csv"), &[], &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let counted = allocbench::input::Source::open(Some(&trace)).unwrap().flops().expect("a capture of matmuls counts FLOPs");
        // PyTorch's own CUDA path counts the same (a checkpoint's recomputation stops inside
        // the op whose inputs it needs last: that op did no work).
        let (out, trace) = capture(dir.path(), &format!("flops-{model}-{checkpointing}-driver.csv"), &["--backend", "driver"], &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let on_driver = allocbench::input::Source::open(Some(&trace)).unwrap().flops();
        assert_eq!(on_driver, Some(counted), "{model}, checkpointing {checkpointing}: FLOPs on the driver");
        let toml = format!(
            "name = \"tiny\"\nseed = 1\n[transformer]\nsteps = 2\nbatch = 2\nseq_len = {{ dist = \"fixed\", value = 48 }}\n\
             param_dtype = \"fp32\"\nactivation_dtype = \"fp32\"\noptimizer = \"adam_foreach\"\ncheckpointing = {checkpointing}\n{shape}"
        );
        let modelled = allocbench::workload::Workload::parse(&toml, "tiny.toml").unwrap().flops().unwrap();
        assert_eq!(counted, modelled, "{model}, checkpointing {checkpointing}");
    }
}

#[test]
fn inference_mode_captures_what_no_grad_does_op_by_op() {
    if !have_torch() {
        return;
    }
    // Under inference_mode the Autograd keys are skipped, so composite ops (linear, layer_norm)
    // reach the recorder whole; a GPU still runs their parts (addmm and its cuBLAS workspace,
    // native_layer_norm's mean and rstd). Inference tensors skip version counters, not storages.
    let dir = tempfile::tempdir().unwrap();
    let forward = fixture("forward.py");
    for model in ["tiny-gpt", "tiny-llama"] {
        let mut by_mode = Vec::new();
        for mode in ["inference_mode", "no_grad"] {
            let (out, trace) = capture(dir.path(), &format!("{model}-{mode}.csv"), &[], &[&forward, mode, model]);
            assert!(out.status.success(), "{model} {mode}: {}", stderr(&out));
            by_mode.push(phases(&events(&trace)));
        }
        let (inference, no_grad) = (&by_mode[0], &by_mode[1]);
        assert_eq!(inference.len(), 3, "{model}: two forwards, a step after each");
        assert!(no_grad[1].len() > 40, "{model}: a forward allocates");
        assert_eq!(inference, no_grad, "{model}: inference_mode must allocate what no_grad does, op by op");
        assert!(per_call_workspaces(&inference.concat(), 32 << 20) > 0, "{model}: the cuBLAS workspaces of the matmuls under inference_mode");
    }
    // Real CPU tensors under inference_mode: the recorder sees the same parts as on fake ones.
    let (fake_out, fake) = capture(dir.path(), "cpu-fake.csv", &["--device", "cpu"], &[&forward, "inference_mode", "tiny-gpt", "cpu"]);
    assert!(fake_out.status.success(), "{}", stderr(&fake_out));
    let (real_out, real) = capture(dir.path(), "cpu-real.csv", &["--device", "cpu", "--real"], &[&forward, "inference_mode", "tiny-gpt", "cpu"]);
    assert!(real_out.status.success(), "{}", stderr(&real_out));
    let (no_grad_out, no_grad) = capture(dir.path(), "cpu-no-grad.csv", &["--device", "cpu", "--real"], &[&forward, "no_grad", "tiny-gpt", "cpu"]);
    assert!(no_grad_out.status.success(), "{}", stderr(&no_grad_out));
    assert_eq!(signed_sizes(&events(&fake)), signed_sizes(&events(&real)), "fake tensors must allocate as real ones do");
    assert_eq!(signed_sizes(&events(&real)), signed_sizes(&events(&no_grad)), "real CPU: inference_mode as no_grad");
}

/// Captures `args` on fake CPU tensors and runs them untraced under the profiler: every captured
/// alloc and free must appear in the profiler's sequence, in order (up to the last step: the order
/// in which Python tears a model down at exit is its own). Returns (bytes the untraced run
/// allocated in between, bytes captured): CPU-kernel scratch and the CPU scalars Python numbers become.
fn captured_in_untraced_profile(dir: &Path, label: &str, args: &[&str]) -> (i64, i64) {
    let (out, trace) = capture(dir, &format!("{label}.csv"), &["--device", "cpu"], args);
    assert!(out.status.success(), "{}", stderr(&out));
    let reference = dir.join(format!("{label}-profile.txt"));
    let prof = std::process::Command::new(python()).arg(model_script("validate/profile_allocs.py")).arg(&reference).arg("--").args(args).output().unwrap();
    assert!(prof.status.success(), "{}", stderr(&prof));
    let profiled: Vec<i64> = std::fs::read_to_string(&reference).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    let evs = events(&trace);
    let last_step = evs.iter().rposition(|e| matches!(e, Event::Step { .. })).unwrap();
    let captured = signed_sizes(&evs[..last_step]);
    let mut matched = 0;
    let mut extra_bytes = 0i64;
    for &p in &profiled {
        if matched < captured.len() && p == captured[matched] {
            matched += 1;
        } else if p > 0 && matched < captured.len() {
            extra_bytes += p;
        }
    }
    assert_eq!(matched, captured.len(), "{label}: capture event {matched} ({}) is not in the profiler's sequence", captured.get(matched).copied().unwrap_or(0));
    (extra_bytes, captured.iter().filter(|&&b| b > 0).sum())
}

#[test]
fn fake_capture_is_what_the_profiler_records_for_an_untraced_run() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny-gpt", "tiny-llama"] {
        let mut args = vec![model_script("models/train.py").leak() as &str, "--model", model];
        args.extend(TINY_TRAIN);
        let (extra_bytes, captured_bytes) = captured_in_untraced_profile(dir.path(), model, &args);
        assert!(extra_bytes * 100 < captured_bytes, "{model}: {extra_bytes} B allocated by the untraced run and not captured (of {captured_bytes} B)");
    }
}

#[test]
fn a_users_amp_script_captures_unedited_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "user.csv", &[], &[&fixture("user_train.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("trained on NVIDIA H100"), "the script ran to its end");
    assert!(stderr(&out).contains("captured"), "{}", stderr(&out));
    let evs = events(&trace);
    assert_eq!(steps(&evs), vec![1, 2, 3]);
    let sizes = signed_sizes(&evs);
    // .cuda() copies the parameters in state-dict order (fp32).
    let params: Vec<i64> = [256 * 512, 512, 512 * 256, 256, 256, 256, 256 * 10, 10].iter().map(|n| n * 4).collect();
    let first: Vec<i64> = sizes.iter().copied().filter(|&b| b > 0).take(params.len()).collect();
    assert_eq!(first, params);
    // CUDA autocast casts the weights to fp16 (half their fp32 size) for the matmuls.
    assert!(sizes.contains(&(256 * 512 * 2)), "an fp16 copy of the first weight");
    // The modelled cuBLAS workspaces: 32 MiB, taken by each matmul of the backward and freed when
    // it returns (torch 2.15); autocast's fp16 linears take cuBLASLt's 1 MiB likewise.
    assert!(per_call_workspaces(&sizes, 32 << 20) > 0);
    assert!(per_call_workspaces(&sizes, 1 << 20) > 0);
    // Kept (TORCH_CUBLAS_WORKSPACE_CACHE=1): one per cuBLAS handle and stream, never freed: the
    // script's (cuBLASLt's fp16 linears share it) and the backward's, on autograd's device thread.
    let (kept_out, kept) = capture_with_env(dir.path(), "user-kept.csv", &[], &[&fixture("user_train.py")], &[("TORCH_CUBLAS_WORKSPACE_CACHE", "1")]);
    assert!(kept_out.status.success(), "{}", stderr(&kept_out));
    let kept_sizes = signed_sizes(&events(&kept));
    assert_eq!(kept_sizes.iter().filter(|&&b| b == 32 << 20).count(), 2, "{kept_sizes:?}");
    assert!(!kept_sizes.contains(&-(32 << 20)) && !kept_sizes.contains(&(1 << 20)));
    // AdamW's state appears at the first step: exp_avg and exp_avg_sq for every parameter.
    let first_step = evs.iter().position(|e| matches!(e, Event::Step { n: 1 })).unwrap();
    let before: Vec<i64> = signed_sizes(&evs[..first_step]);
    assert!(before.iter().filter(|&&b| b == 256 * 512 * 4).count() >= 3, "param, grad or optimizer state copies of the first weight");
    // The trace replays.
    let replay = Command::cargo_bin("allocbench").unwrap().args(["replay", trace.to_str().unwrap(), "-q"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
}

#[test]
fn storages_views_resizes_zero_bytes_and_empty_cache() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "s.csv", &["--cublas-workspace-mib", "0"], &[&fixture("storages.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let phases = phases(&events(&trace));
    assert_eq!(phases[0], vec![4000], "a view and an in-place op allocate nothing");
    assert_eq!(phases[1], vec![40, 8000, -40], "resize_: the new block, then the old one freed");
    assert_eq!(phases[2], vec![4000, -4000], "zero bytes: no allocation");
    assert_eq!(phases[3][0], 0, "torch.cuda.empty_cache() is recorded (0 here)");
    assert!(phases[3].iter().all(|&b| b != 20), "CPU tensors are not recorded");
}

/// The 1-based line of `sites.py` (or its helper) marked `# site: MARK`.
fn marked_line(file: &str, mark: &str) -> usize {
    let text = std::fs::read_to_string(fixture(file)).unwrap();
    1 + text.lines().position(|l| l.ends_with(&format!("# site: {mark}"))).unwrap_or_else(|| panic!("{file} has no '# site: {mark}'"))
}

/// Each alloc's size and the site the reader gives it.
fn allocs_with_sites(trace: &Path) -> Vec<(u64, Option<String>)> {
    let mut reader = read_trace(trace).unwrap();
    let mut out = Vec::new();
    while let Some(event) = reader.next() {
        if let Event::Alloc { bytes, .. } = event.unwrap() {
            out.push((bytes, reader.site().map(|s| reader.site_names()[s as usize].clone())));
        }
    }
    out
}

/// The trace's rows and its `#site`/`#at` lines: everything but the `# ` comments, whose header
/// names the torch and Python versions.
fn rows_and_sites(trace: &Path) -> Vec<String> {
    std::fs::read_to_string(trace).unwrap().lines().filter(|l| !l.starts_with("# ")).map(str::to_string).collect()
}

#[test]
fn sites_name_the_users_own_lines() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "sites.csv", &[], &[&fixture("sites.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Relative to the script's folder (not the working directory); torch's frames skipped.
    let at = |mark: &str, function: &str| Some(format!("sites.py:{} in {function}", marked_line("sites.py", mark)));
    let workspace = 32 << 20;
    assert_eq!(
        allocs_with_sites(&trace),
        vec![
            (1024, at("module", "<module>")),
            (2048, at("twice-first", "twice")),
            (4096, at("twice-second", "twice")),
            (4096, Some(format!("sites_lib/blocks.py:{} in make", marked_line("sites_lib/blocks.py", "make")))),
            (256, at("linear", "<module>")),
            (128, at("forward", "<module>")),
            (128, at("forward", "<module>")),
            (workspace, at("forward", "<module>")),
            (64, at("twice-first", "twice")),
            (128, at("twice-second", "twice")),
        ]
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("\n#at 1\nalloc,9,64,0\n"), "a site seen before is referred to by its number:\n{text}");
    // The committed fixture (the browser test's input) is this capture.
    assert_eq!(rows_and_sites(&trace), rows_and_sites(Path::new(&fixture("sites.csv"))), "re-capture tests/fixtures/capture/sites.csv");

    // --no-sites: the same rows without the site lines.
    let (out, plain) = capture(dir.path(), "plain.csv", &["--no-sites"], &[&fixture("sites.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let without_sites: Vec<String> = rows_and_sites(&trace).into_iter().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows_and_sites(&plain), without_sites);
    assert!(allocs_with_sites(&plain).iter().all(|(_, site)| site.is_none()));

    // The memory view of the capture names the sites.
    let page = dir.path().join("memory.html");
    let out = Command::cargo_bin("allocbench").unwrap().args(["replay", "-q", "--html"]).arg(&page).arg(&trace).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains(&at("twice-first", "twice").unwrap()) && html.contains("sites_lib/blocks.py:"), "the page carries the sites");
}

#[test]
fn a_deprecated_torch_call_is_sited_at_the_users_line() {
    if !have_torch() {
        return;
    }
    // nn.utils.weight_norm is wrapped by typing_extensions' @deprecated: its frame is a library's.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("wn.py");
    std::fs::write(&script, "import torch\nlin = torch.nn.Linear(8, 8).cuda()\nlin = torch.nn.utils.weight_norm(lin)\n").unwrap();
    let (out, trace) = capture(dir.path(), "wn.csv", &[], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sites: Vec<Option<String>> = allocs_with_sites(&trace).into_iter().map(|(_, site)| site).collect();
    assert!(sites.len() > 2, "{sites:?}");
    assert!(sites[2..].iter().all(|s| s.as_deref() == Some("wn.py:3 in <module>")), "{sites:?}");
}

#[test]
fn loops_without_an_optimizer_mark_steps_and_steps_flag_stops() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "serve.csv", &[], &[&fixture("serve_loop.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(steps(&events(&trace)), vec![1, 2, 3, 4, 5]);

    let (out, trace) = capture(dir.path(), "serve2.csv", &["--steps", "2"], &[&fixture("serve_loop.py")]);
    assert!(out.status.success(), "--steps stops the script cleanly: {}", stderr(&out));
    assert_eq!(steps(&events(&trace)), vec![1, 2], "the N steps --steps N lets run are in the trace");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture complete: stopped after 2 steps"));

    // A loop with no step at all runs to its end: --steps says it stopped nothing.
    let script = dir.path().join("no_steps.py");
    std::fs::write(&script, "import torch\nfor _ in range(3):\n    x = torch.empty(1024, device='cuda')\n").unwrap();
    let (out, _) = capture(dir.path(), "none.csv", &["--steps", "2"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("--steps 2 stopped nothing: no optimizer.step() ran"), "{}", stderr(&out));
}

#[test]
fn a_script_that_raises_passes_its_traceback_and_status_through() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "r.csv", &[], &[&fixture("raises.py")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("Traceback") && err.contains("ValueError: boom at step two"), "{err}");
    assert!(err.contains("raises.py:9"), "names the script line: {err}");
    // The frames begin with the script's own, as `python raises.py` prints them: not runpy's
    // (`<frozen runpy>`) nor the capture's that ran it.
    let frames: Vec<&str> = err.lines().filter(|l| l.trim_start().starts_with("File \"")).collect();
    assert!(frames.first().is_some_and(|f| f.contains("raises.py\", line 9, in <module>")), "{err}");
    assert!(!err.contains("<frozen") && !err.contains(CAPTURE_FILES), "{err}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.trim_end().ends_with("# capture incomplete: ValueError"), "{text}");
    assert_eq!(steps(&events(&trace)), vec![1, 2], "the trace so far is kept and readable");

    let (out, trace) = capture(dir.path(), "e.csv", &[], &[&fixture("exits.py")]);
    assert_eq!(out.status.code(), Some(3), "sys.exit(3) passes through");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture incomplete: exit status 3"));
    assert_eq!(signed_sizes(&events(&trace)), vec![4096], "what ran before the exit is kept");

    // A shape error in an op, once caught and once not: on a GPU the op fails in C++, so the
    // traceback ends at the module that called it, and nothing is logged for the caught one.
    let script = dir.path().join("shapes.py");
    let text =
        "import torch\nlin = torch.nn.Linear(64, 64).cuda()\ntry:\n    lin(torch.randn(2, 32, device='cuda'))\nexcept RuntimeError:\n    print('caught')\n\
                lin(torch.randn(2, 16, device='cuda'))\n";
    std::fs::write(&script, text).unwrap();
    let (out, _) = capture(dir.path(), "s.csv", &[], &[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "caught\n");
    let err = stderr(&out);
    let frames: Vec<&str> = err.lines().filter(|l| l.trim_start().starts_with("File \"")).collect();
    assert!(frames.first().is_some_and(|f| f.contains("shapes.py\", line 7, in <module>")), "{err}");
    assert!(frames.last().is_some_and(|f| f.contains("torch/nn/modules/linear.py")), "ends where the op was called: {err}");
    assert!(!err.contains("fake_tensor") && !err.contains("failed while attempting to run meta"), "{err}");
}

#[test]
fn os_exit_closes_the_trace_with_its_rows_and_status() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "x.csv", &[], &[&fixture("hard_exit.py")]);
    assert_eq!(out.status.code(), Some(7), "os._exit(7) passes through: {}", stderr(&out));
    assert!(stderr(&out).contains("(5 allocs, 0 frees"), "the status counts the rows: {}", stderr(&out));
    assert_eq!(signed_sizes(&events(&trace)), vec![4000; 5], "the buffered rows are written");
    assert!(std::fs::read_to_string(&trace).unwrap().trim_end().ends_with("# capture incomplete: exit status 7 (os._exit)"));
}

#[test]
fn a_value_read_in_a_dataloader_worker_stops_the_capture_in_one_line() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "w.csv", &["--strict-values"], &[&fixture("worker_read.py")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("worker_read.py:") && err.contains("needs real tensor data"), "{err}");
    // Named at the worker's own line (the Dataset's __getitem__), the main process's as context.
    assert!(err.contains("worker_read.py:13: `if img.max() > 1:` needs real tensor data"), "{err}");
    assert!(err.contains("(in DataLoader worker process ") && err.contains("the main process was at "), "{err}");
    assert!(err.contains("worker_read.py:19 `for x, _ in"), "{err}");
    assert!(err.contains("the tensor is on the CPU but fake"), "what the worker knew of the read rides along: {err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture incomplete: FakeValueNeeded"));
}

/// TorchScript functions (not modules) making tensors with torch.tensor: called in a loop, one
/// runs unfused (TorchScript's GPU fuser would have the driver compile a kernel from its third
/// call: said once); a value read inside one, which TorchScript re-raises as a RuntimeError with an
/// empty message, is the one-line read error at the scripted line, not a read caught and gone on from.
#[test]
fn torchscript_functions_run_unfused_and_a_read_inside_one_is_named() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("jit_function.py");
    let (out, trace) = capture(dir.path(), "j.csv", &[], &[&script]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "scaled torch.Size([4]) cuda:0\n");
    assert!(err.contains("torch.jit.script runs unfused on fake CUDA"), "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# torch.jit.script: GPU fusion off"));
    let sizes = signed_sizes(&events(&trace));
    assert!(sizes.len() > 4 && sizes.iter().all(|&b| b.abs() == 16), "{sizes:?}");

    let (out, trace) = capture(dir.path(), "r.csv", &["--strict-values"], &[&script, "read"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let read = marked_line("jit_function.py", "scripted read");
    let call = marked_line("jit_function.py", "scripted call");
    let line = err.lines().find(|l| l.contains("needs real tensor data")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(&format!("jit_function.py:{read}: `norm = float(x.norm())")), "{line}");
    assert!(line.contains(&format!("(in the TorchScript function norm_of; called at tests/fixtures/capture/jit_function.py:{call} `norm_of(x)")), "{line}");
    assert!(line.contains("--strict-values"), "{line}");
    assert!(!err.contains("The following operation failed") && !err.contains("caught"), "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture incomplete: RuntimeError"));
    let (out, _) = capture(dir.path(), "v.csv", &["--scalar-value", "2"], &[&script, "read"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// Pinned host memory answers is_pinned() as on a GPU machine: factories with pin_memory=True
/// (torch.tensor's too, pinned in C++ below the dispatcher), pin_memory() and a DataLoader's
/// pinned batches, their views too; host memory is not recorded.
#[test]
fn pinned_host_memory_answers_is_pinned_as_on_a_gpu_machine() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "p.csv", &[], &[&fixture("pinned.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "empty=True zeros=True full=True empty_strided=True arange=True tensor=True pin_memory()=True large=True\n\
         view True clone False unpinned False\nloader True\ndone cuda:0\n"
    );
    assert_eq!(signed_sizes(&events(&trace)), vec![16, -16]);
}

/// The CUDA generator's state is CUDA's (seed and Philox offset, 16 bytes), through
/// torch.cuda.get_rng_state, default_generators and torch.Generator(device="cuda"); it follows
/// the seeding calls and set_rng_state round-trips it (fork_rng restores it).
#[test]
fn the_cuda_generator_state_is_a_seed_and_an_offset_and_round_trips() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "r.csv", &[], &[&fixture("cuda_rng.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "state torch.uint8 cpu 16 True\nnew generator 67280421310721\nsizes 16 16 1\nseeded 1234 1234\nreseeded 7 99\nrestored 1234 True\n\
         generator restored 1234 True\nfork_rng 1234\ncpu state: RNG state is wrong size\ndone\n"
    );
    assert_eq!(signed_sizes(&events(&trace)), vec![4000, -4000]);
}

#[test]
fn torchscript_default_device_saves_caught_reads_and_blocked_threads() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("script_idioms.py");
    let (out, trace) = capture(dir.path(), "s.csv", &["--steps", "1", "--strict-values"], &[&script]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let line = marked_line("script_idioms.py", "caught read");
    assert!(err.contains("3 reads of fake tensor values (the first at ") && err.contains(&format!("script_idioms.py:{line} ")), "{err}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("# 3 reads of fake tensor values") && text.contains("may be missing from this trace"), "the trace says so too");
    assert!(text.contains("# torch.jit.trace: its check_trace skipped"), "{text}");
    // The producer thread, blocked on its full queue, does not keep the process from ending.
    assert!(text.trim_end().ends_with("# capture complete: stopped after 1 steps (--steps)"), "{text}");
    assert_eq!(steps(&events(&trace)), vec![1]);

    // torch.compile as a decorator, with options, and on a module: eager, said once.
    let script = dir.path().join("compiled.py");
    let text = "import torch\n@torch.compile\ndef f(x):\n    return x * 2\n@torch.compile(mode='reduce-overhead')\ndef g(x):\n    return x + 1\n\
                m = torch.nn.Linear(8, 8).cuda()\nm.compile()\nprint(tuple(g(f(m(torch.ones(2, 8, device='cuda')))).shape))\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "c.csv", &[], &[script.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "(2, 8)\n");
    assert_eq!(err.matches("torch.compile is ignored on fake CUDA").count(), 1, "{err}");
    assert_eq!(std::fs::read_to_string(&trace).unwrap().matches("# torch.compile: ignored").count(), 1);
}

#[test]
fn reading_a_fake_value_is_one_line_with_the_script_line_and_the_fix() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "i.csv", &["--strict-values", "--steps", "2"], &[&fixture("item.py")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("stopped nothing"), "a script stopped by an error says nothing of its steps: {err}");
    assert!(err.contains("item.py:5") && err.contains("loss.item()") && err.contains("--strict-values"), "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture incomplete"));

    let (out, trace) = capture(dir.path(), "i2.csv", &["--scalar-value", "0.5"], &[&fixture("item.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(signed_sizes(&events(&trace)).contains(&1024), "the script ran on after .item()");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "loss 0.5\n");
    // By default a read gets the stand-in 0 and the capture goes on; the site and its count are in
    // the summary and the trace.
    let (out, trace) = capture(dir.path(), "i3.csv", &[], &[&fixture("item.py")]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "loss 0.0\n");
    assert!(err.contains("1 value made up (answered 0;") && err.contains("item.py:5 `print(\"loss\", loss.item())` .item() ×1"), "{err}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("# value made up: .item() ×1 at item.py:5 `print(\"loss\", loss.item())` (answered 0)\n"), "{text}");
    assert!(signed_sizes(&events(&trace)).contains(&1024));
    // A read in a loop is one site with its count.
    let looped = dir.path().join("looped.py");
    std::fs::write(&looped, "import torch\nx = torch.randn(3, device='cuda')\nfor _ in range(4):\n    if x.sum() > 2:\n        pass\n").unwrap();
    let (out, trace) = capture(dir.path(), "l.csv", &[], &[looped.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    assert_eq!(
        text.lines().filter(|l| l.starts_with("# value made up:")).collect::<Vec<_>>(),
        ["# value made up: .item() ×4 at looped.py:4 `if x.sum() > 2:` (answered 0)"]
    );

    let (out, _) = capture(dir.path(), "n.csv", &[], &[&fixture("nonzero.py")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("nonzero.py:4") && err.contains("nonzero") && err.contains("--real"), "{err}");
}

#[test]
fn known_values_answer_reads_without_scalar_value() {
    if !have_torch() {
        return;
    }
    // Trainer's NaN-loss filter, clip_grad_norm_(error_if_nonfinite=True), NaN/Inf tests combined,
    // counted and negated, filled tensors, a token id tensor, and a generation loop whose end test
    // (an isin) finds nothing: each reads as a real healthy run would, and the capture says so once.
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("known_values.py");
    let (out, trace) = capture(dir.path(), "f.csv", &[], &[&script]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "known 5\n", "the loop ran to its max length");
    assert_eq!(err.matches("known values answer reads").count(), 1, "{err}");
    assert_eq!(steps(&events(&trace)), [1, 2, 3, 4, 5, 6, 7]);
    // Overwritten with an unknown value, or written through a view or another alias of its
    // storage, a tensor is unknown again:
    // reading it is the usual error, naming its line.
    let source = std::fs::read_to_string(&script).unwrap();
    for case in ["overwrite", "through_view", "alias", "data"] {
        let (out, _) = capture(dir.path(), &format!("{case}.csv"), &["--strict-values"], &[&script, case]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        let line = 1 + source.lines().position(|l| l.ends_with(&format!("# mark: {case}"))).unwrap();
        assert!(err.contains(&format!("known_values.py:{line}:")) && err.contains("--strict-values"), "{case}: {err}");
    }
}

#[test]
fn generate_runs_to_max_new_tokens_whatever_the_scalar_value() {
    if !have_torch() {
        return;
    }
    // transformers' generate() stops when every sequence has met an end-of-sequence token (an
    // isin) or its max length. Reads of unknown values used to steer it: 0 never stopped, 1 stopped
    // after one token. With the end test known to find nothing, it runs its 16 new tokens.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("generate.py");
    std::fs::write(
        &script,
        "import torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\n\
         cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=500)\n\
         model = LlamaForCausalLM(cfg).cuda().eval()\n\
         ids = torch.randint(1, 500, (2, 8), device='cuda')\n\
         with torch.inference_mode():\n    out = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)\n\
         print(tuple(out.shape))\n",
    )
    .unwrap();
    for value in ["0", "1"] {
        let (out, trace) = capture(dir.path(), &format!("g{value}.csv"), &["--scalar-value", value], &[script.to_str().unwrap()]);
        assert!(out.status.success(), "--scalar-value {value}: {}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "(2, 24)\n", "--scalar-value {value}");
        assert!(!events(&trace).is_empty());
    }
}

#[test]
fn an_encoder_decoder_generates_from_cpu_token_ids_without_a_scalar_value() {
    if !have_torch() {
        return;
    }
    // T5's generate() tests the encoder's input ids (`(encoder_input_ids < 0).any()`), token ids
    // a tokenizer made on the CPU: followed whole, they read as they are, and no --scalar-value
    // is needed.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("t5.py");
    std::fs::write(
        &script,
        "import torch\nfrom transformers import T5Config, T5ForConditionalGeneration\n\
         cfg = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)\n\
         model = T5ForConditionalGeneration(cfg).cuda().eval()\n\
         ids = torch.randint(2, 128, (2, 10)).cuda()\n\
         out = model.generate(ids, max_new_tokens=6)\n\
         print(tuple(out.shape))\n",
    )
    .unwrap();
    let (out, trace) = capture(dir.path(), "t5.csv", &[], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "(2, 7)\n", "the start token and six new ones");
    assert!(!events(&trace).is_empty());
}

#[test]
fn sequence_indices_and_deep_copies_capture_as_on_a_gpu() {
    if !have_torch() {
        return;
    }
    // `x[[0, 2]]`, `x[:, range(3)]`, `x[0, [1, 2]] = 0`, nanoGPT's `v[:, [-1]]`: each list becomes
    // one small CUDA index tensor, where it used to reach the driver. `copy.deepcopy` of a state
    // dict three times over keeps one copy live, not three (the fake mode's cache kept them).
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "i.csv", &[], &[&fixture("indexing_copies.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "(2, 1000) (4, 3)");
    let weights = 256 * 256 * 4 + 1024;
    let allocated: Vec<u64> = lines[1..].iter().map(|l| l.parse().unwrap()).collect();
    assert_eq!(allocated.len(), 4, "{stdout}");
    assert!(allocated[..3].iter().all(|&a| a == allocated[0]) && allocated[0] - allocated[3] == weights, "{allocated:?}");
    let sizes = signed_sizes(&events(&trace));
    // The index tensors: [0, 2] and [1, 2] (16 bytes), range(3) (24), [-1] (8), each freed.
    for bytes in [16, 24, 8] {
        assert!(sizes.contains(&bytes) && sizes.contains(&-bytes), "{bytes}: {sizes:?}");
    }
    assert!(sizes.contains(&8000) && sizes.contains(&(4 * 3 * 4)), "rows and columns: {sizes:?}");
}

#[test]
fn a_deep_copy_of_a_trained_model_copies_its_parameters_not_their_grads() {
    if !have_torch() {
        return;
    }
    // "Keep the best model" after backward: nn.Parameter.__deepcopy__ clones the data alone, so a
    // GPU run gains the weights (two 64 KiB matrices, two 512 B biases), not their gradients.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("best.py");
    let text = "import copy, torch\nm = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)).cuda()\n\
                m(torch.randn(4, 128, device='cuda')).sum().backward()\nbefore = torch.cuda.memory_allocated()\nbest = copy.deepcopy(m)\n\
                print(torch.cuda.memory_allocated() - before, best[0].weight.grad is None, isinstance(best[0].weight, torch.nn.Parameter))\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "best.csv", &["--cublas-workspace-mib", "0"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let weights = 2 * (128 * 128 * 4 + 512);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("{weights} True True"));
    // The copy is the trace's last allocations (the frees at exit follow).
    let sizes = signed_sizes(&events(&trace));
    let last_alloc = sizes.iter().rposition(|&s| s > 0).unwrap();
    assert_eq!(sizes[last_alloc - 3..=last_alloc], [128 * 128 * 4, 512, 128 * 128 * 4, 512], "one clone per parameter and nothing else: {sizes:?}");
}

#[test]
fn the_device_generic_accelerator_api_answers_as_torch_cuda_does() {
    if !have_torch() {
        return;
    }
    // torch.accelerator: the device is CUDA, the memory figures are torch.cuda's, and its
    // empty_cache is the trace's empty_cache.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("acc.py");
    let text = "import torch\nacc = torch.accelerator\na = torch.empty(1 << 20, device=acc.current_accelerator())\n\
                print(acc.current_accelerator().type, acc.memory_allocated() == torch.cuda.memory_allocated() == 4 << 20)\n\
                print(acc.memory_stats()['allocated_bytes.all.current'], acc.get_memory_info()[1] == torch.cuda.mem_get_info()[1])\n\
                del a\nacc.empty_cache()\nprint(acc.max_memory_allocated(), acc.memory_allocated())\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "acc.csv", &[], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "cuda True\n4194304 True\n4194304 0\n");
    assert_eq!(events(&trace).iter().filter(|e| matches!(e, Event::EmptyCache)).count(), 1);
}

#[test]
fn fsdp2_on_a_fake_process_group_shards_and_trains() {
    if !have_torch() {
        return;
    }
    // fully_shard over 4 ranks of torch's fake process group: FSDP2 reads its streams' device
    // (torch.Stream's device_type, device_index) in backward. Each rank holds a quarter of the
    // weights: 256x256 fp32 sharded four ways is 64 KiB.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fsdp.py");
    let text = "import torch, torch.distributed as dist\nfrom torch.testing._internal.distributed.fake_pg import FakeStore\n\
                dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=4)\n\
                from torch.distributed.fsdp import fully_shard\nfrom torch.distributed.device_mesh import init_device_mesh\n\
                model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)).cuda()\n\
                for layer in model:\n    fully_shard(layer, mesh=init_device_mesh('cuda', (4,)))\n\
                opt = torch.optim.AdamW(model.parameters())\nfor _ in range(2):\n\
                \x20   model(torch.randn(8, 256, device='cuda')).sum().backward()\n    opt.step()\n    opt.zero_grad()\n\
                print(tuple(model[0].weight.to_local().shape))\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "fsdp.csv", &[], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "(64, 256)\n");
    let evs = events(&trace);
    assert_eq!(steps(&evs), vec![1, 2]);
    assert!(signed_sizes(&evs).contains(&(64 * 256 * 4)), "a rank's shard of a weight");
}

#[test]
fn a_resumed_run_reads_its_checkpoints_step_counts_and_keeps_the_file() {
    if !have_torch() {
        return;
    }
    // A checkpoint written by a real (CPU) run, loaded with map_location="cuda": Adam reads each
    // step count (`.item()`), now a small CUDA tensor whose values the load knows. The run then
    // saves back onto the file, which predates the capture: it is left as it was (a capture's
    // save holds zeros for CUDA tensors).
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("last.pt");
    let script = fixture("resume.py");
    let real = std::process::Command::new(python()).arg(&script).arg(&checkpoint).output().unwrap();
    assert!(real.status.success(), "{}", stderr(&real));
    let before = std::fs::read(&checkpoint).unwrap();
    let (out, trace) = capture(dir.path(), "r.csv", &[], &[&script, checkpoint.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "epoch 1\n");
    assert_eq!(steps(&events(&trace)), [1, 2]);
    assert!(err.contains(&format!("left {} as it was", checkpoint.display())), "{err}");
    assert!(std::fs::read(&checkpoint).unwrap() == before, "the user's checkpoint was overwritten");
    // Saved as a whole module inside a dict, the file is kept too, and no file is left beside it.
    let (out, _) = capture(dir.path(), "w.csv", &[], &[&script, checkpoint.to_str().unwrap(), "whole"]);
    assert!(out.status.success() && stderr(&out).contains("as it was"), "{}", stderr(&out));
    assert!(std::fs::read(&checkpoint).unwrap() == before, "a module inside a dict overwrote the checkpoint");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".tmp")).count(), 0);
    // Saved beside it and renamed onto it (an atomic save): kept too, and the file beside it gone.
    let (out, _) = capture(dir.path(), "a.csv", &[], &[&script, checkpoint.to_str().unwrap(), "atomic"]);
    assert!(out.status.success() && stderr(&out).contains(&format!("left {} as it was", checkpoint.display())), "{}", stderr(&out));
    assert!(std::fs::read(&checkpoint).unwrap() == before, "the rename onto the checkpoint overwrote it");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains(".tmp")).count(), 0);
    // A file the capture made itself is written as before.
    let fresh = dir.path().join("fresh.pt");
    let (out, _) = capture(dir.path(), "f.csv", &[], &[&script, fresh.to_str().unwrap()]);
    assert!(out.status.success() && fresh.exists(), "{}", stderr(&out));
}

#[test]
fn a_transformers_trainer_fine_tunes_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("hf_trainer.py");
    let (out, trace) = capture(dir.path(), "t.csv", &["--scalar-value", "0"], &[&script]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("trained\n"));
    let evs = events(&trace);
    // max_steps=4 with two micro-batches each: four optimizer steps, not eight.
    assert_eq!(steps(&evs), [1, 2, 3, 4]);
    // The word embeddings (3000 × 128 fp32): the weight moved to CUDA, AdamW's two moments, and
    // per optimizer step two gradients (the first micro-batch's becomes .grad, the second's is
    // summed into it; zero_grad sets it to None).
    let embedding = 3000 * 128 * 4;
    assert_eq!(signed_sizes(&evs).iter().filter(|&&n| n == embedding).count(), 1 + 2 + 4 * 2);
    // The loss logging reads values inside the Trainer: by default they are made up, counted by
    // site in the summary and the trace; with --strict-values the first stops the capture.
    let (out, trace) = capture(dir.path(), "u.csv", &[], &[&script]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("values made up (answered 0;") && err.contains("transformers/trainer.py:"), "{err}");
    let text = std::fs::read_to_string(&trace).unwrap();
    let made_up: Vec<&str> = text.lines().filter(|l| l.starts_with("# value made up: .item() ×")).collect();
    assert!(!made_up.is_empty() && made_up.iter().all(|l| l.contains(" at transformers/trainer.py:")), "{made_up:?}");
    let (out, _) = capture(dir.path(), "s.csv", &["--strict-values"], &[&script]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("(the read is in transformers/trainer.py") && err.contains("--strict-values"), "{err}");
    // On PyTorch's own CUDA path (the driver backend) the Trainer runs unedited too: the same
    // optimizer steps and the same embedding buffers.
    let (out, trace) = capture(dir.path(), "d.csv", &["--backend", "driver"], &[&script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    assert_eq!(steps(&evs), [1, 2, 3, 4]);
    assert_eq!(signed_sizes(&evs).iter().filter(|&&n| n == embedding).count(), 1 + 2 + 4 * 2);
}

#[test]
fn pack_padded_sequence_reads_its_cpu_lengths_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "p.csv", &[], &[&fixture("packed_rnn.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "(7, 2) [3, 2, 1, 1]\n(3, 4, 8) [4, 2, 1] (3, 4, 2)\n");
    // _pack_padded_sequence (PackedSequence.cpp) on x [3, 4, 2] fp32 (96 B), lengths [4, 2, 1],
    // batch first: per new batch size a slice of the transposed input made contiguous (3 rows:
    // 24 B, 2 rows: 16 B; the last, one sequence wide, is contiguous already), concatenated into
    // the 7 packed rows (56 B); the copies die with the kernel, the packed data at `del`. The
    // batch sizes stay on the CPU.
    assert_eq!(signed_sizes(&events(&trace))[..7], [96, 24, 16, 56, -24, -16, -56]);
}

#[test]
fn torch_cuda_memory_stats_snapshots_streams_and_settings_answer_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "api.csv", &["--cublas-workspace-mib", "0"], &[&fixture("cuda_api.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    // memory_stats() keys as PyTorch names them: blocks rounded to 512 B, the pool by rounded size.
    let (small, large) = (4096, 3 << 20);
    assert!(stdout.contains(&format!("stats {} {} 2 {small} {large} 0\n", small + large, 4000 + large)), "{stdout}");
    assert!(stdout.contains(&format!("allocated {0} {0}\n", small + large)), "{stdout}");
    assert!(stdout.contains(&format!("peak after reset {small}\n")), "reset_peak_memory_stats: {stdout}");
    assert!(stdout.contains("summary True\nfraction 0.5\n") && stdout.contains("done"), "{stdout}");
    assert!(stdout.contains("stream cuda:0 cuda:0 (0, -5)\n"), "streams name their device: {stdout}");
    // The settings the script made shape a GPU run: the trace and the terminal say them.
    let text = std::fs::read_to_string(&trace).unwrap();
    let settings = "expandable_segments:True,per_process_memory_fraction:0.5";
    assert!(text.contains(&format!("# allocator settings made by the script: {settings}\n")), "{text}");
    assert!(stderr(&out).contains(&format!("replay with --conf '{settings}'")), "{}", stderr(&out));
    assert!(stderr(&out).contains("_record_memory_history is skipped on fake CUDA"), "{}", stderr(&out));
    assert_eq!(signed_sizes(&events(&trace)), vec![4000, large, -large, 40, -4000, -40]);

    // .numpy() of a fake tensor is the one-line fake-data error, not a RuntimeError about subclasses.
    let (out, _) = capture(dir.path(), "n.csv", &["--strict-values"], &[&fixture("numpy_read.py")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("numpy_read.py:4") && err.contains("Tensor.numpy()") && err.contains("--real"), "{err}");
    // --scalar-value answers it as it answers .item().
    let (out, _) = capture(dir.path(), "n2.csv", &["--scalar-value", "2.5"], &[&fixture("numpy_read.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "2.5\n");
    // A large CPU tensor is fake too (Note [Real CPU, fake CUDA]): the error says why.
    let cpu_read = dir.path().join("cpu_read.py");
    std::fs::write(&cpu_read, "import torch\nX = torch.randn(1000, 600)\nprint(float(X.mean()))\n").unwrap();
    let (out, _) = capture(dir.path(), "c.csv", &["--strict-values"], &[cpu_read.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cpu_read.py:3") && err.contains("the tensor is on the CPU but fake") && err.contains("over 1 MiB"), "{err}");
    // Data the script holds stays real however large: built from NumPy (8 MB), computed from it,
    // and per-sample weights drawn from by a WeightedRandomSampler (1.2 MB of float32).
    let data_read = dir.path().join("data_read.py");
    let text = "import numpy as np, torch\nfrom torch.utils.data import WeightedRandomSampler\na = np.ones((1000, 1000))\n\
                print(torch.tensor(a).sum().item(), (torch.from_numpy(a) * 2).sum().item())\n\
                y = torch.arange(300_000) % 4\nw = (1.0 / torch.bincount(y).float())[y]\n\
                print(len(list(WeightedRandomSampler(w, num_samples=8))))\n";
    std::fs::write(&data_read, text).unwrap();
    let (out, _) = capture(dir.path(), "d.csv", &[], &[data_read.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1000000.0 2000000.0\n8\n");
}

/// Side streams on fake CUDA: each allocation is made on the current stream, record_stream of
/// another stream defers the block's reuse, and the script's synchronize (of the stream, or of an
/// event on it) lets the replay reuse it; a use on the block's own stream and a sync nothing waits
/// for write no row.
#[test]
fn side_streams_record_stream_and_synchronize_are_captured() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "streams.csv", &["--cublas-workspace-mib", "0"], &[&fixture("side_streams.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "inside True\nafter True\ndone\n");
    let mib20 = 20u64 << 20;
    let alloc = |id, bytes, stream| Event::Alloc { id, bytes, stream };
    let want = vec![
        alloc(1, mib20, 0),
        alloc(2, mib20, 1),
        Event::RecordStream { id: 1, stream: 1 },
        Event::Free { id: 1 },
        alloc(3, mib20, 0),
        Event::Sync { stream: Some(1) },
        alloc(4, mib20, 0),
        alloc(5, 1 << 20, 1),
        Event::RecordStream { id: 5, stream: 0 },
        Event::Free { id: 5 },
        Event::Sync { stream: Some(0) },
    ];
    let got = events(&trace);
    assert_eq!(got[..want.len()], want[..], "{got:?}");
    assert!(got[want.len()..].iter().all(|e| matches!(e, Event::Free { .. })), "only the exit's frees follow: {got:?}");
    // Replayed: id 3 cannot take id 1's waiting block (a segment of its own); id 4 takes it after
    // the sync. Segments: ids 1, 2, 3 and id 5's small-pool one.
    let out = Command::cargo_bin("allocbench").unwrap().args(["replay", trace.to_str().unwrap(), "--json", "-", "-q"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stats"]["num_device_alloc"], 4);
}

/// A CUDA generator draws (on the CPU) and still says it is CUDA's; caching_allocator_alloc and
/// _delete are rows (on the stream asked for). A CUDA graph's capture runs eagerly once, after an
/// empty_cache, on a side stream, with its allocations in the graph's private pool (pool rows:
/// Note [Private pools]); a graph sharing the pool adds a use, reset and deletion release them,
/// and a MemPool is a pool of its own. The replay keeps each pool's blocks apart.
#[test]
fn generators_raw_blocks_cuda_graphs_and_mem_pools_run_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "g.csv", &["--cublas-workspace-mib", "0"], &[&fixture("generators_graphs.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "generator cuda:0 True cpu\ncapturing True False\nCUDA graphs must be captured on a non-default stream\ndone\n"
    );
    let evs = events(&trace);
    assert_eq!(signed_sizes(&evs), vec![4000, 1 << 20, 3 << 20, -(1 << 20), 4000, 4000, -4000, 4000, -4000, -4000, 1024, -1024, -(3 << 20), -4000]);
    assert!(evs.contains(&Event::Alloc { id: 3, bytes: 3 << 20, stream: 1 }), "{evs:?}");
    assert!(evs.contains(&Event::Alloc { id: 5, bytes: 4000, stream: 2 }), "captured on the graph's stream: {evs:?}");
    let pools: Vec<Event> = evs.iter().copied().filter(|e| !matches!(e, Event::Alloc { .. } | Event::Free { .. })).collect();
    use Event::{EmptyCache, Pool};
    assert_eq!(
        pools,
        [
            EmptyCache,
            Pool(PoolOp::Begin { pool: 1, stream: Some(2) }),
            Pool(PoolOp::End { pool: 1 }),
            EmptyCache,
            Pool(PoolOp::Begin { pool: 1, stream: Some(2) }),
            Pool(PoolOp::End { pool: 1 }),
            Pool(PoolOp::Release { pool: 1 }),
            Pool(PoolOp::Release { pool: 1 }),
            Pool(PoolOp::Begin { pool: 2, stream: None }),
            Pool(PoolOp::End { pool: 2 }),
            Pool(PoolOp::Begin { pool: 2, stream: None }),
            Pool(PoolOp::End { pool: 2 }),
            Pool(PoolOp::Release { pool: 2 }),
            Pool(PoolOp::Release { pool: 2 }),
            Pool(PoolOp::EmptyCache { pool: 2 }),
        ]
    );
    // Segments: x and raw share one small segment, `side` a large one on its stream, the graph
    // pool a small one on the capture stream, and the MemPool one more (without pools, w would
    // have gone into x's segment).
    let replay = Command::new(env!("CARGO_BIN_EXE_allocbench")).args(["replay", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
    let v: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(v["stats"]["num_device_alloc"], 4);
}

/// Checkpoints on fake CUDA: torch.load onto CUDA (map_location, or the device it was saved
/// from) is one allocation per storage, a CPU load none; torch.save of fake tensors works and
/// loads back onto CUDA as a real checkpoint would.
#[test]
fn checkpoints_save_and_load_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pretrained = dir.path().join("pretrained.pt");
    let made = std::process::Command::new(python())
        .args(["-c", "import sys, torch; torch.manual_seed(0); torch.save(torch.nn.Linear(64, 32).state_dict(), sys.argv[1])"])
        .arg(&pretrained)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let (out, trace) = capture(dir.path(), "ck.csv", &["--cublas-workspace-mib", "0"], &[&fixture("checkpoints.py"), pretrained.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "pretrained cuda:0 (32, 64)\ncpu cpu\nback cuda:0 3\nbig cuda:0 300000\ndone\n");
    let (w, b, big) = (64 * 32 * 4, 32 * 4, 300_000 * 4);
    assert_eq!(signed_sizes(&events(&trace)), vec![w, b, w, b, -w, -b, w, b, -w, -b, big, big, -big, -big, -w, -b]);
}

/// What fake CUDA cannot run ends in one line naming the script's line, where the call went and
/// the fix: NCCL (which would abort the interpreter), a value read
/// inside a library (with --scalar-value's caveat); distributions sample without validating
/// their arguments (the validation reads values); a syntax error names its line.
#[test]
fn what_fake_cuda_cannot_run_is_one_line_naming_where() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("fake_limits.py");
    let source = std::fs::read_to_string(&script).unwrap();
    let line = |mark: &str| 1 + source.lines().position(|l| l.ends_with(&format!("# mark: {mark}"))).unwrap();
    for (case, says) in [
        ("nccl", vec!["starts NCCL", "capture one rank without the process group"]),
        ("library_read", vec!["(the read is in torch/optim/lr_scheduler.py", "--scalar-value V", "steers its control flow"]),
        ("gloo_ddp", vec!["DistributedDataParallel exchanges the parameters' values", "capture one rank without DDP"]),
        ("spawn", vec!["torch.multiprocessing.spawn starts worker processes, which the capture does not follow", "fix: call the worker"]),
        // The fake machine has one GPU, as device_count() says: a second is refused as CUDA does.
        ("second_gpu", vec!["invalid device ordinal (cuda:1: the fake machine has one GPU", "capture one device's share on cuda:0"]),
        ("set_device", vec!["invalid device ordinal (cuda:1", "--real"]),
    ] {
        let (out, trace) = capture(dir.path(), &format!("{case}.csv"), &["--strict-values"], &[&script, case]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{case}: one line: {err}");
        assert!(err.contains(&format!("fake_limits.py:{}:", line(case))), "{case}: names the script's line: {err}");
        for s in says {
            assert!(err.contains(s), "{case}: {s:?} in {err}");
        }
        assert!(std::fs::read_to_string(&trace).unwrap().contains("op,id,bytes,stream\n"), "{case}: a readable trace is kept");
    }
    // An LSTM runs PyTorch's non-cuDNN kernels (cuDNN's RNN needs the driver), said once and in
    // the trace: per time step its gate buffers (5 steps of 2 × 64 floats at least).
    let (out, trace) = capture(dir.path(), "lstm.csv", &[], &[&script, "lstm"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(err.matches("RNNs run PyTorch's non-cuDNN kernels").count(), 1, "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# RNNs: PyTorch's non-cuDNN kernels"));
    assert!(signed_sizes(&events(&trace)).iter().filter(|&&b| b == 2 * 64 * 4).count() >= 5);
    // A TransformerEncoder in inference with a padding mask drops the padded tokens on a GPU: the
    // capture keeps them (the mask's values are unknown), said once and in the trace.
    let (out, trace) = capture(dir.path(), "encoder.csv", &[], &[&script, "encoder_padding"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "encoded (4, 32, 64)\n");
    assert_eq!(err.matches("nn.TransformerEncoder keeps padded tokens on fake CUDA").count(), 1, "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# nn.TransformerEncoder: padded tokens kept"));
    // A thread's uncaught exception prints as on a GPU: threading's frames and the script's, none
    // of the capture's; the main thread goes on.
    let (out, _) = capture(dir.path(), "thread.csv", &[], &[&script, "thread_raises"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "main continues\n");
    assert!(err.contains(&format!("fake_limits.py\", line {}, in work", line("thread_raises"))) && err.contains("ValueError: boom in thread"), "{err}");
    assert!(err.contains("threading.py") && !err.contains(CAPTURE_FILES), "{err}");
    let (out, _) = capture(dir.path(), "d.csv", &[], &[&script, "distributions"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "sampled (1000,)\n");
    let broken = dir.path().join("broken.py");
    std::fs::write(&broken, "import torch\nx = torch.zeros((2,\n").unwrap();
    let (out, _) = capture(dir.path(), "s.csv", &[], &[broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("SyntaxError at") && stderr(&out).contains("broken.py:2"), "{}", stderr(&out));
}

#[test]
fn linear_adds_its_bias_in_place_as_an_untraced_run_does() {
    if !have_torch() {
        return;
    }
    // at::linear on a non-contiguous 3-D input (MultiheadAttention with batch_first) adds the bias
    // in place; under a dispatch mode it would add out of place, one output-sized tensor more.
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("linear_bias.py");
    captured_in_untraced_profile(dir.path(), "linear", &[&script, "cpu"]);
}

#[test]
fn no_python_no_torch_and_no_script_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = capture(dir.path(), "x.csv", &["--python", "/nonexistent/python3"], &[&fixture("exits.py")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no Python interpreter '/nonexistent/python3'"), "{}", stderr(&out));

    let (out, _) = capture(dir.path(), "x.csv", &[], &["/nonexistent/train.py"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/train.py: no such script"), "{}", stderr(&out));

    // A Python without torch: a fresh virtual environment.
    let venv = dir.path().join("venv");
    let made = std::process::Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv).output();
    if made.map(|o| o.status.success()).unwrap_or(false) {
        let py = venv.join("bin/python").display().to_string();
        let (out, _) = capture(dir.path(), "x.csv", &["--python", &py], &[&fixture("exits.py")]);
        assert_eq!(out.status.code(), Some(2));
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains("no torch in") && err.contains("--python"), "{err}");
    }
}

#[test]
fn sdpa_on_fake_cuda_runs_flash_attention_with_its_backward_scratch() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // tiny-llama: 4 heads of 16, bf16 autocast, batch 2, S = 200 (rounded to 256 in the kernel).
    let args = [model_script("models/train.py").leak() as &str, "--model", "tiny-llama", "--steps", "1", "--seq-len", "200", "--batch", "2"];
    let (out, trace) = capture(dir.path(), "flash.csv", &["--cublas-workspace-mib", "0"], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let sizes = signed_sizes(&events(&trace));
    let (b, h, s, d) = (2i64, 4i64, 200i64, 16i64);
    assert!(!sizes.contains(&(b * h * s * s * 2)) && !sizes.contains(&(b * h * s * s * 4)), "no B·H·S² scores: the fused kernel runs");
    assert!(sizes.contains(&(b * s * h * d * 2)), "the bf16 attention output");
    let softmax_d = b * h * 256 * 4;
    let dq_accum = b * 256 * h * 32 * 4;
    let scratch = sizes.windows(4).filter(|w| w == &[softmax_d, dq_accum, -dq_accum, -softmax_d]).count();
    assert_eq!(scratch, 2, "one FlashAttention-2 backward scratch pair per layer");

    // 16 causal queries against 1,024 keys (chunked prefill): flash refuses a causal call whose
    // lengths differ (check_flash_causal_non_square_seqlens); memory-efficient attention runs,
    // its log-sum-exp padded to 32 queries.
    let script = dir.path().join("prefill.py");
    let text = "import torch, torch.nn.functional as F\nq = torch.randn(2, 16, 16, 128, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n\
                k = torch.randn(2, 16, 1024, 128, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n\
                F.scaled_dot_product_attention(q, k, k, is_causal=True).sum().backward()\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "prefill.csv", &["--cublas-workspace-mib", "0"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sizes = signed_sizes(&events(&trace));
    assert!(sizes.contains(&(2 * 16 * 32 * 4)) && !sizes.contains(&(2 * 16 * 16 * 4)), "memory-efficient attention's log-sum-exp, not flash's: {sizes:?}");

    // A boolean mask (flash takes none: memory-efficient attention runs): scaled_dot_product_attention
    // makes it additive in the query's dtype (where(mask, 0, -inf), both scalars on the device) and
    // pads its 100 columns to 104 (preprocess_mask: a multiple of 8), expanded, not copied, to B·H·L·S.
    let script = dir.path().join("mask.py");
    let text = "import torch, torch.nn.functional as F\nq = torch.randn(2, 4, 100, 64, device='cuda', dtype=torch.bfloat16)\n\
                mask = torch.ones(100, 100, dtype=torch.bool, device='cuda').tril()\n\
                out = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "mask.csv", &["--cublas-workspace-mib", "0"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sizes = signed_sizes(&events(&trace));
    let (additive, padded, output) = (100 * 100 * 2, 100 * 104 * 2, 2 * 4 * 100 * 64 * 2);
    assert_eq!(sizes[4..], [2, 2, additive, -2, -2, padded, -additive, output, -padded, -(2 * 4 * 100 * 64 * 2), -10000, -output], "{sizes:?}");

    // Grouped-query attention as transformers calls it (enable_gqa, 4 query heads on 2 key heads),
    // 64 tokens: the backward's dq accumulator even for one block of keys, and dk, dv expanded to
    // every query head, freed in reverse (mha_bwd).
    let script = dir.path().join("gqa.py");
    let text = "import torch, torch.nn.functional as F\nq = torch.randn(2, 4, 64, 16, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n\
                k = torch.randn(2, 2, 64, 16, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n\
                F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True).sum().backward()\n";
    std::fs::write(&script, text).unwrap();
    let (out, trace) = capture(dir.path(), "gqa.csv", &["--cublas-workspace-mib", "0"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sizes = signed_sizes(&events(&trace));
    let (softmax_d, dq_accum, expanded) = (2 * 4 * 128 * 4, 2 * 128 * 4 * 32 * 4, 2 * 64 * 4 * 16 * 2);
    let scratch = [softmax_d, dq_accum, expanded, expanded, -expanded, -expanded, -dq_accum, -softmax_d];
    assert_eq!(sizes.windows(8).filter(|w| w == &scratch).count(), 1, "{sizes:?}");
}

#[test]
fn a_transformers_model_captures_from_its_config_alone() {
    if !have_torch() {
        return;
    }
    let has_transformers = std::process::Command::new(python()).args(["-c", "import transformers"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !has_transformers {
        common::skip("transformers capture", &format!("{} cannot import transformers (pip install transformers)", python()), "ALLOCBENCH_REQUIRE_TORCH");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = "hf:llama,num_hidden_layers=2,hidden_size=64,num_attention_heads=4,num_key_value_heads=2,intermediate_size=128,vocab_size=512,bos_token_id=0,eos_token_id=0";
    let args = [model_script("models/train.py").leak() as &str, "--model", model, "--steps", "2", "--seq-len", "32..64", "--batch", "2"];
    let (out, trace) = capture(dir.path(), "hf.csv", &[], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    assert_eq!(steps(&evs), vec![1, 2]);
    let sizes = signed_sizes(&evs);
    assert!(sizes.contains(&(512 * 64 * 4)), "the fp32 token embedding, copied to the device");
    assert!(sizes.contains(&(512 * 64 * 2)), "its bf16 autocast copy for the untied head");
}

#[test]
fn shipped_captures_are_complete_and_the_demo_replays_one() {
    let dir = root().join("workloads/captured");
    let (mut seen, mut with_sites) = (0, 0);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".csv.gz") {
            continue;
        }
        seen += 1;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(std::fs::File::open(&path).unwrap()), &mut text).unwrap();
        assert!(
            ["train.py", "serve.py", "switch.py"].iter().any(|s| text.contains(&format!("# script: scripts/models/{s}"))),
            "{}: says how it was made",
            path.display()
        );
        assert!(text.trim_end().lines().last().unwrap().starts_with("# capture complete"), "{}: a complete capture", path.display());
        let evs = events(&path);
        assert!(steps(&evs).len() >= 30, "{}: many steps", path.display());
        if text.contains("\n#site ") {
            // Every alloc names a line of the model scripts (relative to scripts/models/).
            with_sites += 1;
            let sites = read_trace(&path).unwrap().read_sites().unwrap();
            let allocs = evs.iter().filter(|e| matches!(e, Event::Alloc { .. })).count();
            assert_eq!(sites.of_id.len(), allocs, "{}: every alloc has a site", path.display());
            let model_files = ["train.py:", "serve.py:", "switch.py:", "gpt.py:", "llama.py:"];
            assert!(sites.names.iter().all(|n| model_files.iter().any(|f| n.starts_with(f))), "{}: {:?}", path.display(), sites.names);
        }
    }
    assert!(seen >= 1, "workloads/captured holds the flagship captures");
    assert!(with_sites >= 2, "the re-made captures carry their allocation sites");

    // `allocbench run` with no input replays the embedded capture of GPT-3 XL.
    let out_dir = tempfile::tempdir().unwrap();
    let jsonl = out_dir.path().join("r.jsonl");
    let out = Command::cargo_bin("allocbench").unwrap().args(["run", "--allocators", "ideal", "--quiet", "--jsonl", jsonl.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let rec: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&jsonl).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(rec["workload"]["origin"], "(embedded) workloads/captured/gpt3-xl-1.3b.csv.gz");
    assert!(rec["workload"]["description"].as_str().unwrap().starts_with("captured from torch "), "{}", rec["workload"]);
    let shipped = events(&dir.join("gpt3-xl-1.3b.csv.gz"));
    assert_eq!(rec["work"]["events"], shipped.len() as u64, "the embedded trace is the shipped one");
}

#[test]
fn a_killed_interpreter_leaves_a_readable_trace_marked_incomplete() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for name in ["k.csv", "k.csv.gz"] {
        let (out, trace) = capture(dir.path(), name, &[], &[&fixture("killed.py")]);
        assert_eq!(out.status.code(), Some(128 + 9), "{}", stderr(&out));
        assert!(stderr(&out).contains("ended without finishing the capture (signal 9)"), "{}", stderr(&out));
        let evs = events(&trace);
        assert_eq!(steps(&evs), vec![1], "{name}: what was flushed is kept and reads cleanly");
        assert!(signed_sizes(&evs).iter().filter(|&&b| b == 4000).count() == 20);
        let mut text = String::new();
        let file = std::fs::File::open(&trace).unwrap();
        if name.ends_with(".gz") {
            std::io::Read::read_to_string(&mut flate2::read::MultiGzDecoder::new(file), &mut text).unwrap();
        } else {
            std::io::Read::read_to_string(&mut { file }, &mut text).unwrap();
        }
        assert!(text.trim_end().ends_with("# capture incomplete: signal 9"), "{name}");
    }
}

/// make_graphed_callables runs as PyTorch's own over the fake graphs: warmup iterations on its
/// side stream, then the forward and the backward graph captured into one shared pool (after an
/// empty_cache each); the training steps after it allocate no hidden activation (32 × 2048
/// fp32, 256 KiB), which only the warmup and the captures do.
#[test]
fn make_graphed_callables_captures_into_one_shared_pool() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "mgc.csv", &["--cublas-workspace-mib", "0"], &[&fixture("graphed_callables.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "graphed (32, 512)\n");
    let evs = events(&trace);
    let pool_rows: Vec<Event> = evs.iter().copied().filter(|e| matches!(e, Event::Pool(PoolOp::Begin { .. } | PoolOp::End { .. }))).collect();
    assert_eq!(
        pool_rows,
        [
            Event::Pool(PoolOp::Begin { pool: 1, stream: Some(1) }),
            Event::Pool(PoolOp::End { pool: 1 }),
            Event::Pool(PoolOp::Begin { pool: 1, stream: Some(1) }),
            Event::Pool(PoolOp::End { pool: 1 })
        ]
    );
    let hidden = 32 * 2048 * 4;
    let is_hidden = |e: &Event| matches!(e, Event::Alloc { bytes, .. } if *bytes == hidden);
    let first_capture = evs.iter().position(|e| matches!(e, Event::Pool(PoolOp::Begin { .. }))).unwrap();
    let last_end = evs.iter().rposition(|e| matches!(e, Event::Pool(PoolOp::End { .. }))).unwrap();
    assert!(evs[..first_capture].iter().filter(|e| is_hidden(e)).count() >= 3, "the warmup runs eagerly");
    assert!(evs[first_capture..last_end].iter().any(is_hidden), "the forward graph's activation is captured");
    assert!(!evs[last_end..].iter().any(is_hidden), "the graphed steps replay: no activation of their own");
    assert_eq!(steps(&evs), [1, 2, 3]);
    let replay = Command::new(env!("CARGO_BIN_EXE_allocbench")).args(["replay", trace.to_str().unwrap(), "-q"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
}

/// cuBLAS and cuBLASLt workspaces as the torch running the capture takes them
/// (CublasHandlePool.cpp, CUDABlas.cpp): a Linear with a bias runs addmm's fused-bias cuBLASLt path
/// (1 MiB, CUBLASLT_WORKSPACE_SIZE), a plain matmul cuBLAS (32 MiB, CUBLAS_WORKSPACE_CONFIG), each
/// after the op's output. torch 2.15 takes them per call; TORCH_CUBLAS_WORKSPACE_CACHE=1 keeps one
/// per stream, which cuBLASLt shares unless TORCH_CUBLASLT_UNIFIED_WORKSPACE=0. Deterministic
/// algorithms without a deterministic CUBLAS_WORKSPACE_CONFIG raise PyTorch's error, as a GPU does.
#[test]
fn blas_workspaces_follow_the_torch_settings() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("blas_workspaces.py");
    let (weight, bias, x, y) = (64 * 32 * 4, 32 * 4, 16 * 64 * 4, 16 * 32 * 4);
    let run_with = |label: &str, flags: &[&str], env: &[(&str, &str)], arg: &[&str]| {
        let (out, trace) = capture_with_env(dir.path(), &format!("{label}.csv"), flags, &[&[script.as_str()], arg].concat(), env);
        assert!(out.status.success(), "{label}: {}", stderr(&out));
        let sizes = signed_sizes(&events(&trace));
        // The script's own tensors first; its end frees them (the order is the interpreter's).
        assert_eq!(sizes[..3], [weight, bias, x], "{label}: {sizes:?}");
        sizes[3..].iter().copied().take_while(|&b| b != -bias).collect::<Vec<i64>>()
    };
    let run = |label: &str, flags: &[&str], env: &[(&str, &str)]| run_with(label, flags, env, &[]);
    let (mib, lt) = (1 << 20, 1 << 20);
    assert_eq!(run("per-call", &[], &[]), [y, lt, -lt, y, 32 * mib, -32 * mib]);
    assert_eq!(
        run("sized", &[], &[("CUBLAS_WORKSPACE_CONFIG", ":16:8"), ("CUBLASLT_WORKSPACE_SIZE", "4096")]),
        [y, 4 * mib, -4 * mib, y, 128 << 10, -(128 << 10)]
    );
    assert_eq!(run("flag", &["--cublas-workspace-mib", "8"], &[("CUBLAS_WORKSPACE_CONFIG", ":16:8")]), [y, lt, -lt, y, 8 * mib, -8 * mib]);
    assert_eq!(run("no-lt", &[], &[("DISABLE_ADDMM_CUDA_LT", "1")]), [y, 32 * mib, -32 * mib, y, 32 * mib, -32 * mib]);
    assert_eq!(run("kept", &[], &[("TORCH_CUBLAS_WORKSPACE_CACHE", "1")]), [y, 32 * mib, y], "unified: Lt's call takes the stream's one");
    let header = |label: &str| std::fs::read_to_string(dir.path().join(format!("{label}.csv"))).unwrap().lines().nth(2).unwrap().to_string();
    assert!(header("kept").contains("kept (TORCH_CUBLAS_WORKSPACE_CACHE=1)"), "{}", header("kept"));
    assert!(header("per-call").contains("per call, freed when it returns"), "{}", header("per-call"));
    let separate = [("TORCH_CUBLAS_WORKSPACE_CACHE", "1"), ("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")];
    assert_eq!(run("kept-separate", &[], &separate), [y, lt, y, 32 * mib]);
    assert_eq!(run("none", &["--cublas-workspace-mib", "0"], &[]), [y, y]);
    assert_eq!(run_with("lt", &[], &[], &["lt"]), [y, lt, -lt, y, lt, -lt], "cuBLASLt preferred: the matmul's gemm goes there too");
    // A configuration PyTorch cannot parse: its warning, and the default size.
    let (out, trace) = capture_with_env(dir.path(), "bad.csv", &[], &[&script], &[("CUBLAS_WORKSPACE_CONFIG", "4096x8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("Could not parse CUBLAS_WORKSPACE_CONFIG, using default workspace size of 33554432 bytes."), "{}", stderr(&out));
    assert!(signed_sizes(&events(&trace)).contains(&(32 * mib)));

    // Deterministic algorithms: torch 2.15 no longer asks for a deterministic CUBLAS_WORKSPACE_CONFIG
    // (PR #161749; builds whose use_deterministic_algorithms documents the variable raise there).
    assert_eq!(run_with("det", &[], &[], &["det"]), [y, lt, -lt, y, 32 * mib, -32 * mib]);
    // A one-row input (decoding) still takes cuBLASLt's fused bias: 2.15 checks only mat2's sizes.
    let (out, trace) = capture(dir.path(), "one.csv", &[], &[&script, "one"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(signed_sizes(&events(&trace))[..7], [weight, bias, 64 * 4, 32 * 4, lt, -lt, 32 * 4]);

    // Sizes the script sets (torch.backends.cuda.cublas_workspace_size, cublaslt_workspace_size),
    // which a query on fake CUDA answers; kept, a larger size replaces the stream's workspace.
    let sized = fixture("blas_workspace_sizes.py");
    let (a, lin_bias) = (64 * 64 * 4, 64 * 4);
    let (out, trace) = capture(dir.path(), "set.csv", &[], &[&sized]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "default 33554432\nset 8388608\nlt 2097152\ncleared\n");
    let sizes = signed_sizes(&events(&trace));
    assert_eq!(sizes[..12], [a, a, 8 * mib, -8 * mib, a, 64 * mib, -64 * mib, a, lin_bias, a, 2 * mib, -2 * mib]);
    let (out, trace) = capture_with_env(dir.path(), "set-kept.csv", &[], &[&sized], &[("TORCH_CUBLAS_WORKSPACE_CACHE", "1")]);
    assert!(out.status.success(), "{}", stderr(&out));
    // torch._C._cuda_clearCublasWorkspaces at the end frees the kept one.
    assert_eq!(signed_sizes(&events(&trace))[..10], [a, a, 8 * mib, a, 64 * mib, -8 * mib, a, lin_bias, a, -64 * mib]);
}

/// F.ctc_loss on fake CUDA runs as PyTorch's CUDA kernels allocate (aten/src/ATen/native/cuda/
/// LossCTC.cu): the lengths and batch offsets on the device, log_alpha (B, T, 2·max target + 1)
/// and the loss; the backward's lengths, log_beta, the gradient and, with many frames ("large"),
/// the blank gradient's log-sum-exp buffers, freed at the kernel's return.
#[test]
fn ctc_loss_captures_as_its_cuda_kernels_allocate() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "ctc.csv", &[], &[&fixture("ctc.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "(300, 4, 20)");
    let sizes = signed_sizes(&events(&trace));
    let (t, b, c, s) = (300i64, 4i64, 20i64, 9i64);
    let (lengths, log_alpha, grad) = (b * 8, b * t * (2 * s + 1) * 4, t * b * c * 4);
    let forward = [lengths, lengths, lengths, log_alpha, b * 4, -lengths, -lengths, -lengths];
    assert_eq!(sizes.windows(8).filter(|w| w == &forward).count(), 1, "{sizes:?}");
    let (pair, row) = (b * t * (s + 1) * 4, b * t * 4);
    let backward = [
        lengths,
        lengths,
        lengths,
        log_alpha,
        grad,
        pair,
        row,
        row,
        b * t,
        -(b * t),
        -row,
        pair,
        row,
        -pair,
        -row,
        -row,
        -pair,
        -log_alpha,
        -lengths,
        -lengths,
        -lengths,
    ];
    assert_eq!(sizes.windows(backward.len()).filter(|w| w == &backward).count(), 1, "{sizes:?}");
}

/// torch.profiler with CUDA activity on fake CUDA: the CPU side only (no kernel runs; PyTorch's
/// CUDA activity would warn at every op that it cannot record an event), said once, and the
/// loop's allocations are recorded as without the profiler.
#[test]
fn a_profiled_loop_captures_quietly_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "p.csv", &[], &[&fixture("profiled.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(!err.contains("Failed to record CUDA event"), "{err}");
    assert_eq!(err.matches("allocbench capture: torch.profiler records CPU activity only on fake CUDA").count(), 1, "{err}");
    assert!(err.lines().count() < 20, "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Self CPU"), "the profiler's table printed");
    let evs = events(&trace);
    assert_eq!(evs.iter().filter(|e| matches!(e, Event::Alloc { .. })).count(), evs.iter().filter(|e| matches!(e, Event::Free { .. })).count());
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# torch.profiler: the profiler's CUDA activity off"));
}

/// CUDA graph edge cases: reset() of a capture left open ends it before releasing the pool; a
/// matmul captured on a fresh stream with workspaces kept (TORCH_CUBLAS_WORKSPACE_CACHE=1) puts
/// its cuBLAS workspace in the graph's pool and reset frees it (clearCublasWorkspacesForStream),
/// so the pool can go; use_mem_pool inside a capture routes to the MemPool, which the graph keeps
/// until its reset. The replay ends with only the eager segment cached: every private segment was
/// given back. With torch 2.15's per-call workspaces the matmul frees its own at once.
#[test]
fn cuda_graph_resets_workspaces_and_mem_pools_inside_captures() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, per_call) = capture(dir.path(), "per-call.csv", &[], &[&fixture("graph_edges.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(per_call_workspaces(&signed_sizes(&events(&per_call)), 32 << 20), 1, "the captured matmul's workspace, taken and freed");
    let (out, trace) = capture_with_env(dir.path(), "e.csv", &[], &[&fixture("graph_edges.py")], &[("TORCH_CUBLAS_WORKSPACE_CACHE", "1")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    use Event::{Alloc, EmptyCache, Free, Pool};
    let workspace = 32 << 20;
    assert_eq!(
        evs,
        [
            Alloc { id: 1, bytes: 16384, stream: 0 },
            Pool(PoolOp::Begin { pool: 1, stream: Some(1) }),
            Alloc { id: 2, bytes: 16384, stream: 1 },
            Pool(PoolOp::End { pool: 1 }),
            Pool(PoolOp::Release { pool: 1 }),
            Free { id: 2 },
            Pool(PoolOp::Begin { pool: 2, stream: None }),
            Pool(PoolOp::End { pool: 2 }),
            EmptyCache,
            Pool(PoolOp::Begin { pool: 3, stream: Some(2) }),
            Alloc { id: 3, bytes: 16384, stream: 2 },
            Alloc { id: 4, bytes: workspace, stream: 2 },
            Pool(PoolOp::Begin { pool: 2, stream: None }),
            Alloc { id: 5, bytes: 16384, stream: 2 },
            Pool(PoolOp::End { pool: 2 }),
            Pool(PoolOp::Begin { pool: 2, stream: None }),
            Pool(PoolOp::End { pool: 2 }),
            Pool(PoolOp::Release { pool: 2 }),
            Pool(PoolOp::End { pool: 3 }),
            Pool(PoolOp::Release { pool: 2 }),
            Pool(PoolOp::EmptyCache { pool: 2 }),
            Free { id: 3 },
            Free { id: 5 },
            Free { id: 4 },
            Pool(PoolOp::Release { pool: 3 }),
            Pool(PoolOp::Release { pool: 2 }),
            EmptyCache,
            Free { id: 1 },
        ]
    );
    let replay = Command::new(env!("CARGO_BIN_EXE_allocbench")).args(["replay", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
    let v: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let stats = &v["stats"];
    assert_eq!((stats["num_device_alloc"].as_i64(), stats["num_device_free"].as_i64()), (Some(5), Some(4)));
    assert_eq!(stats["reserved_bytes.all.current"], 2 << 20);
}

/// A side stream that waits on the capture stream joins the capture (CUDA's fork): a
/// `pool_join` row, and its allocation lands in the graph's pool; it leaves at capture_end.
#[test]
fn a_stream_forked_from_a_capture_allocates_in_its_pool() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "f.csv", &["--cublas-workspace-mib", "0"], &[&fixture("graph_fork_join.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "capturing after False\n");
    let evs = events(&trace);
    let kb256 = 256 << 10;
    assert_eq!(
        evs[..8],
        [
            Event::Alloc { id: 1, bytes: kb256, stream: 0 },
            Event::EmptyCache,
            Event::Pool(PoolOp::Begin { pool: 1, stream: Some(2) }),
            Event::Alloc { id: 2, bytes: kb256, stream: 2 },
            Event::Pool(PoolOp::Join { pool: 1, stream: 1 }),
            Event::Alloc { id: 3, bytes: kb256, stream: 1 },
            Event::Alloc { id: 4, bytes: kb256, stream: 2 },
            Event::Pool(PoolOp::End { pool: 1 }),
        ]
    );
    // In the replay, `b` (stream 1) is in the graph's pool: its segment is private.
    let replay = Command::new(env!("CARGO_BIN_EXE_allocbench")).args(["diagnose", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
    let v: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(v["private_pool_bytes"], 4 << 20, "two 2 MiB small segments, streams 2 and 1");
}

/// Live tensors past the fake card's memory raise torch.cuda.OutOfMemoryError, so a script's
/// OOM handling (a batch-size search) takes the path it would on that card; the trace marks each
/// failed request and keeps only what was allocated.
/// Without --device-memory the fake card raises no OOM (the replay decides on which card the run
/// fits) yet answers as an H100 80 GB; the summary splits the time between the capture's op
/// dispatch and the script's own work, and the two add up to the whole.
#[test]
fn the_default_fake_card_is_unbounded_and_the_summary_splits_the_time() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("huge.py");
    std::fs::write(
        &script,
        "import torch, time\nxs = [torch.empty(40 << 30, dtype=torch.uint8, device='cuda') for _ in range(3)]\n\
        print(torch.cuda.get_device_properties(0).total_memory, torch.cuda.mem_get_info()[0])\ntime.sleep(0.3)\n",
    )
    .unwrap();
    let (out, trace) = capture(dir.path(), "h.csv", &[], &[script.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "85017493504 0\n", "an H100's total; nothing free past it");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("# fake card memory: unbounded"), "{text}");
    assert_eq!(signed_sizes(&events(&trace)).iter().filter(|&&b| b == 40 << 30).count(), 3);
    // --card: the unbounded fake card reports that card's memory (a script sized by it).
    let (out, _) = capture(dir.path(), "a.csv", &["--card", "A100-40GB"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42298834944 0\n");
    let (out, _) = capture(dir.path(), "b.csv", &["--card", "H300"], &[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no card 'H300' in the table"), "{}", stderr(&out));
    let time = err.lines().find(|l| l.starts_with("time: ")).unwrap_or_else(|| panic!("{err}"));
    let numbers: Vec<f64> = time.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert_eq!(numbers.len(), 3, "{time}");
    assert!((numbers[1] + numbers[2] - numbers[0]).abs() <= 0.11, "the parts add up to the whole: {time}");
    assert!(numbers[2] >= 0.3, "the script's sleep is its own time: {time}");
}

#[test]
fn the_fake_card_runs_out_of_memory_at_its_size() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "t.csv", &["--device-memory", "300MiB", "--cublas-workspace-mib", "0"], &[&fixture("batch_size_search.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    // 4 MiB of weights + 2 × 256 MiB fail; 4 + 2 × 128 = 260 MiB fit in 300 MiB. The first OOM
    // is the input (4 + 256 = 260 fits; the output's 256 more do not).
    assert!(printed.contains(&format!("total {} free {}", 300u64 << 20, (300u64 - 4) << 20)), "{printed}");
    assert!(printed.contains("oom 65536 CUDA out of memory") && printed.contains("fits 32768") && printed.contains("num_ooms 1"), "{printed}");
    assert!(printed.contains("capped at half"), "{printed}");
    assert!(
        stderr(&out).contains("2 torch.cuda.OutOfMemoryErrors raised: live tensors passed what the fake card (300 MiB, --device-memory) allows"),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.contains(&format!(
            "# OutOfMemoryError: {} bytes requested with {} allocated on the fake card's {} bytes",
            256u64 << 20,
            260u64 << 20,
            300u64 << 20
        )),
        "{text}"
    );
    let sizes: Vec<i64> = signed_sizes(&events(&trace)).into_iter().filter(|&s| s > 0).collect();
    assert_eq!(sizes, [4 << 20, 256 << 20, 128 << 20, 128 << 20], "the failed request is not in the trace");
    // A folder is not a script.
    let (out, _) = capture(dir.path(), "d.csv", &[], &[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is a directory, not a script"), "{}", stderr(&out));
}

/// The fake card's limit follows the script's memory fraction; an OOM the script does not catch
/// ends the trace with the request it stopped on, so diagnose (on the capture's card by default)
/// fails there and names the line.
#[test]
fn an_uncaught_fake_oom_ends_the_trace_where_the_script_stopped() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("uncaught_oom.py");
    let (out, trace) = capture(dir.path(), "t.csv", &["--device-memory", "100MiB"], &[&script]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("capped"), "the 0.5 fraction caps the card at 50 MiB");
    assert!(stderr(&out).contains("the script raised OutOfMemoryError at"), "{}", stderr(&out));
    let sizes: Vec<i64> = signed_sizes(&events(&trace)).into_iter().filter(|&s| s > 0).collect();
    assert_eq!(sizes, [40 << 20, 80 << 20], "the caught request is not a row; the uncaught one ends the trace");
    // (The default CUDA context, 426 MiB, would not fit a 100 MiB card: the allocator alone.)
    let diagnosed = Command::cargo_bin("allocbench").unwrap().args(["diagnose", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert_eq!(diagnosed.status.code(), Some(2));
    assert!(stderr(&diagnosed).contains("leaves nothing of the 100 MiB card: give a larger card, or --cuda-context 0"), "{}", stderr(&diagnosed));
    let diagnosed =
        Command::cargo_bin("allocbench").unwrap().args(["diagnose", trace.to_str().unwrap(), "--cuda-context", "0", "--json", "-"]).output().unwrap();
    assert!(diagnosed.status.success(), "{}", stderr(&diagnosed));
    assert!(stderr(&diagnosed).contains("note: capacity 100 MiB: the fake card the capture ran on"), "{}", stderr(&diagnosed));
    let d: serde_json::Value = serde_json::from_slice(&diagnosed.stdout).unwrap();
    let line = marked_line("uncaught_oom.py", "uncaught");
    assert_eq!((d["capacity"].as_u64(), d["oom"]["requested"].as_u64()), (Some(100 << 20), Some(80 << 20)));
    assert_eq!(d["oom_site"], format!("uncaught_oom.py:{line} in <module>"));
    // The fake card sizes fake tensors only.
    let (out, _) = capture(dir.path(), "cpu.csv", &["--device-memory", "1GiB", "--device", "cpu"], &[&script]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--device-memory sizes the fake card: it has no effect with --real or --device cpu"), "{}", stderr(&out));
}

/// Autocast's cast cache is an unordered map of casts: leaving the region frees them in an
/// address-dependent order. The capture writes those frees in allocation order, so the same
/// script gives the same trace every run.
#[test]
fn the_autocast_cache_frees_in_allocation_order() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "t.csv", &["--cublas-workspace-mib", "0"], &[&fixture("autocast_cache.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    // The bf16 copies of the 16 weights: 256 × 256 × 2 bytes each.
    let casts: Vec<u64> = evs
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { id, bytes: 131_072, .. } => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(casts.len(), 16);
    let freed: Vec<u64> = evs
        .iter()
        .filter_map(|e| match *e {
            Event::Free { id } if casts.contains(&id) => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(freed, casts, "freed in the order they were made");
    // Together, when the region ends (the cache was their only owner), not one by one later.
    let first = evs.iter().position(|e| matches!(*e, Event::Free { id } if id == casts[0])).unwrap();
    assert!(evs[first..first + 16].iter().all(|e| matches!(*e, Event::Free { id } if casts.contains(&id))), "{:?}", &evs[first..first + 16]);
}

/// Ordinary things scripts do besides ops (`everyday.py`), each once a stopped capture or a
/// wrong trace: numpy through as_tensor (DataLoader's collate) and as_tensor of a CUDA tensor (no
/// copy), torch.set_default_device("cuda") for torch.tensor, new_tensor and asarray (one
/// allocation each), a data pointer per allocation, f"{loss:.2f}", event timing, storage
/// resize_ (a free at 0, an alloc at the new size), a thread's tensor, torch.save of a module;
/// a sparse gradient (its size is data) is said, not silently empty.
#[test]
fn everyday_script_idioms_capture_as_pytorch_allocates_them() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "e.csv", &["--cublas-workspace-mib", "0"], &[&fixture("everyday.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "as_tensor shares True cpu",
        "default device cuda:0 cuda:0",
        "new_tensor torch.float32 cuda:0 asarray torch.int64 cuda:0",
        "distinct pointers 4",
        "loss 4.00",
        "elapsed True",
        "thread cuda:0",
        "module cuda:0 True",
        "seed True",
        "trunc_normal torch.Size([1, 64, 32])",
        "pinned True False",
    ] {
        assert!(printed.lines().any(|l| l == line), "{line:?} in {printed}");
    }
    assert!(stderr(&out).contains("torch.cuda.Event.elapsed_time is not measured on fake CUDA: it answers 1.0 ms"), "{}", stderr(&out));
    assert!(stderr(&out).contains("torch.sparse_coo tensors have data-dependent sizes on fake CUDA"), "{}", stderr(&out));
    assert!(stderr(&out).contains("nn.init.trunc_normal_ takes every sample as accepted on its first draw"), "{}", stderr(&out));
    let sizes = signed_sizes(&events(&trace));
    #[rustfmt::skip]
    let want: Vec<i64> = vec![
        256 << 10, 12, 8, 24,          // as_tensor (and none for as_tensor of it), tensor, new_tensor, asarray
        16, 4, -16,                    // ones(4).sum()
        1 << 20, -(1 << 20), 2 << 20,  // resize_(0) frees, resize_(2 MiB) allocates
        256 << 10, -(256 << 10),       // the thread's tensor, dead once printed
        1024, 1024,                    // the module, and its copy loaded back
    ];
    assert_eq!(&sizes[..want.len()], &want[..]);
    assert_eq!(sizes.iter().sum::<i64>(), 0, "everything is freed at the end");
}

/// torch.cuda.FloatTensor and its kin copy data to the device inside C++, below the dispatcher:
/// without stand-ins an older script stopped at its first `LongTensor(labels)` or `.type(Tensor)`.
#[test]
fn legacy_typed_constructors_capture_as_pytorch_allocates_them() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "l.csv", &["--cublas-workspace-mib", "0"], &[&fixture("legacy_types.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in ["types True False True True torch.cuda.HalfTensor torch.int64 torch.float32", "default cuda:0"] {
        assert!(printed.lines().any(|l| l == line), "{line:?} in {printed}");
    }
    let sizes = signed_sizes(&events(&trace));
    let want: Vec<i64> = vec![32, 512, 64, 32, -64, 64, 12, 1024];
    assert_eq!(&sizes[..want.len()], &want[..]);
    assert_eq!(sizes.iter().sum::<i64>(), 0, "everything is freed at the end");
}

/// `.half()` frees each old parameter as soon as it is converted (`param.data = new` on a GPU),
/// and `to_empty` from meta unties tied weights: one storage each, as PyTorch on a device.
#[test]
fn module_conversions_free_and_untie_as_on_a_device() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "m.csv", &["--cublas-workspace-mib", "0"], &[&fixture("module_conversions.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in ["half 10 torch.float16 True", "to_empty False 2", "tiny True 1 True", "held cuda:0 cpu tensor-parallel torch.float16"] {
        assert!(printed.lines().any(|l| l == line), "{line:?} in {printed}");
    }
    let (mib4, mib2, mib1) = (4 << 20, 2 << 20, 1 << 20);
    #[rustfmt::skip]
    let want = vec![
        mib4, mib4, mib2, -mib4, mib2, -mib4,  // .half(): each old weight freed as soon as it is converted
        mib1, mib1,                            // to_empty: untied
        6400,                                  // the tiny tied model: one storage
        64, 16,                                // the Linear whose weight a view holds
        mib4, 4096, mib2, -mib4, 2048, -4096,  // the flagged Linear, .cuda() then .half()
    ];
    assert_eq!(signed_sizes(&events(&trace)), want);
}

/// Lazy modules moved to CUDA (or made there) allocate nothing until their first forward, then
/// each parameter and buffer once, in the inferred shape and the dtype they were converted to.
#[test]
fn lazy_modules_materialize_on_the_device_at_their_first_forward() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "lazy.csv", &["--cublas-workspace-mib", "0"], &[&fixture("lazy_modules.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in ["before 512", "after True (256, 1024) cuda:0 True", "made_here torch.float16 cuda:0 (64, 32)", "copied cuda:0"] {
        assert!(printed.lines().any(|l| l == line), "{line:?} in {printed}");
    }
    let allocs: Vec<i64> = signed_sizes(&events(&trace)).into_iter().filter(|&b| b > 0).collect();
    #[rustfmt::skip]
    let want = vec![
        8, 32768,                     // BatchNorm's num_batches_tracked (not lazy), the input
        1 << 20, 1024, 8192,          // the Linear at its first forward: weight, bias, output
        1024, 1024, 1024, 1024, 8192, // BatchNorm's weight, bias, running mean and var, output
        1024, 1024,                   // its saved mean and inverse std
        128, 4096, 128, 256,          // the half Linear made on CUDA: input, weight, bias, output
        64, 512, 64, 128,             // a deep copy of a lazy Linear moved to CUDA, at its forward
    ];
    assert_eq!(allocs, want);
}

/// `timeout` (or a scheduler) sends SIGTERM: the script stops as on Ctrl-C, and the rows so far
/// are written, marked incomplete.
#[test]
fn a_terminated_capture_keeps_its_rows() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("sleeps.py");
    std::fs::write(&script, "import time, torch\nw = torch.empty(1 << 20, device='cuda')\nprint('allocated', flush=True)\ntime.sleep(60)\n").unwrap();
    let trace = dir.path().join("t.csv");
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
        .args(["capture", "-o", trace.to_str().unwrap(), "--", script.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "allocated");
    // The interpreter (allocbench's child) gets SIGTERM, as `timeout` signals the whole group.
    let parent_of = |pid: &str| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let interpreters: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|pid| parent_of(pid) == Some(child.id()))
        .filter_map(|pid| pid.parse().ok())
        .collect();
    assert_eq!(interpreters.len(), 1, "{interpreters:?}");
    // SAFETY: kill(2) on a pid this test's child started.
    assert_eq!(unsafe { libc::kill(interpreters[0], libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "stopped as an interrupt");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("alloc,1,4194304,0") && text.contains("# capture incomplete: KeyboardInterrupt"), "{text}");
}

/// A fake value read in a thread the script started stops the capture with that line, instead
/// of leaving the main thread waiting forever for the thread that died.
#[test]
fn a_value_read_in_a_thread_stops_the_capture_with_its_line() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("thread_read.py");
    let (out, trace) = capture(dir.path(), "t.csv", &["--strict-values"], &[&script]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains("thread_read.py:13: `results.put(x.sum().item())") && err.contains("--strict-values"), "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().ends_with("# capture incomplete: FakeValueNeeded\n"));
}

/// What a CUDA kernel refuses, though a fake op's meta kernel lets it through, is refused as on
/// a GPU: a matmul or a convolution of mixed dtypes (a half model fed fp32) and cross_entropy with
/// int32 targets.
#[test]
fn what_cuda_kernels_refuse_is_refused() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("dtypes.py");
    std::fs::write(
        &script,
        "import sys, torch\ncase = sys.argv[1]\n\
         if case == 'half_model':\n    torch.nn.Linear(16, 16).cuda().half()(torch.randn(2, 16, device='cuda'))\n\
         if case == 'half_conv':\n    torch.nn.Conv2d(3, 8, 3, bias=False).cuda().half()(torch.randn(2, 3, 8, 8, device='cuda'))\n\
         if case == 'int_target':\n    torch.nn.functional.cross_entropy(torch.randn(8, 10, device='cuda'), torch.randint(0, 10, (8,), device='cuda').int())\n\
         if case == 'fine':\n    m = torch.nn.Linear(16, 16).cuda()\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n        y = m(torch.randn(2, 16, device='cuda'))\n        \
         torch.nn.Conv2d(3, 8, 3).cuda()(torch.randn(2, 3, 8, 8, device='cuda'))\n    \
         torch.nn.functional.cross_entropy(y.float(), torch.randint(0, 10, (2,), device='cuda'))\n    print('fine', y.dtype)\n",
    )
    .unwrap();
    let script = script.to_str().unwrap();
    for (case, says) in [
        ("half_model", "dtypes.py:4: expected mat1 and mat2 to have the same dtype, but got: float != c10::Half"),
        ("half_conv", "dtypes.py:6: Input type (torch.cuda.FloatTensor) and weight type (torch.cuda.HalfTensor) should be the same"),
        ("int_target", "dtypes.py:8: \"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Int'"),
    ] {
        let (out, _) = capture(dir.path(), &format!("{case}.csv"), &[], &[script, case]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        assert!(err.contains(says), "{case}: {err}");
    }
    let (out, _) = capture(dir.path(), "fine.csv", &[], &[script, "fine"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine torch.bfloat16\n");
}

/// A GPU run's answers, on fake CUDA: every device property (an H100's), torch.compile's
/// OptimizedModule (`_orig_mod`, its state_dict keys), the fused optimizers whose in-place steps
/// have no Meta kernel (SGD, Adagrad, Adam with a tensor lr), anomaly detection's NaN check of
/// every gradient, and NaN checks by count_nonzero and mean (known values: no NaN, no Inf).
#[test]
fn a_scripts_gpu_answers_on_fake_cuda() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kept_after_first_step = Vec::new();
    for which in ["sgd-plain", "sgd", "adagrad", "adam-tensor-lr"] {
        let (out, trace) = capture(dir.path(), &format!("{which}.csv"), &["--no-sites"], &[&fixture("gpu_answers.py"), which]);
        assert!(out.status.success(), "{which}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("props 9 0 1024 232448 65536 5120 True 36 True"), "{stdout}");
        assert!(stdout.contains("compiled OptimizedModule Linear ['_orig_mod.bias', '_orig_mod.weight']"), "{stdout}");
        assert!(stdout.contains("checks False 0 1.0 True"), "{stdout}");
        assert!(stdout.contains("deterministic True"), "{stdout}");
        assert!(stdout.contains("kernels (32, 4) (8, 64) (8, 3, 16, 16) (8, 10) (5, 7, 4) (5, 4)"), "{stdout}");
        assert!(stdout.contains("compared True False"), "{stdout}");
        assert_eq!(stderr(&out).matches("torch.use_deterministic_algorithms(True) is not enforced on fake CUDA").count(), 1, "{}", stderr(&out));
        let evs = events(&trace);
        assert_eq!(steps(&evs), vec![1, 2, 3], "{which}: a step after each optimizer.step()");
        // The iterations after the first allocate and free alike: the optimizer's state came
        // with the first.
        let by_step = phases(&evs);
        assert_eq!(by_step[1], by_step[2], "{which}");
        assert_eq!(by_step[1].iter().sum::<i64>(), 0, "{which}");
        kept_after_first_step.push(by_step[0].iter().sum::<i64>());
    }
    // The state each optimizer keeps, over plain SGD's (none): SGD's momentum buffers, Adagrad's
    // sums and step counts (float32 scalars on the device when fused), Adam's two moments and steps.
    let params = (64 * 64 + 64) * 4;
    let state: Vec<i64> = kept_after_first_step.iter().map(|k| k - kept_after_first_step[0]).collect();
    assert_eq!(state, vec![0, params, params + 2 * 4, 2 * params + 2 * 4]);
}

/// Kernels whose memory their outputs do not show, as a GPU runs them (Loss.cpp, Loss.cu,
/// ReduceOps.cpp, Distributions.cpp, MultinomialKernel.cu), one per phase of
/// kernel_buffers.py: x and t are 16 KiB, `row` 1 KiB. mse_loss and smooth_l1_loss keep their
/// elementwise storage behind the 0-dim loss and reduce a temporary; huber_loss reduces a
/// temporary into a fresh loss; binary_cross_entropy and soft_margin_loss keep theirs and reduce
/// into a 0-dim temporary; the composites (BCE with logits, logsumexp) record their parts;
/// multinomial checks its probabilities and divides by an exponential sample (or copies and
/// prefix-sums the distribution, with replacement). On the CPU, fake tensors keep the storages a
/// real run keeps.
#[test]
fn kernel_buffers_are_recorded_as_a_gpu_allocates_them() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "kb.csv", &["--no-sites"], &[&fixture("kernel_buffers.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let storages: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        storages,
        [
            "mse 16384",
            "mse-sum 16384",
            "mse-none 16384",
            "mse-broadcast 16384",
            "smooth_l1 16384",
            "huber 4",
            "huber-none 16384",
            "bce 16384",
            "bce-weight 16384",
            "soft_margin 16384",
            "bce_logits 4",
            "bce_logits-pos 4",
            "logsumexp 64",
            "multinomial 128",
            "multinomial-1d 8",
            "multinomial-topk 384",
            "multinomial-replaced 384"
        ]
    );
    let (e, r) = (16384, 1024);
    let reduced_into_temporary = vec![e, e, -e, -e];
    let reduced_into_scalar = vec![e, 4, -4, -e];
    let multinomial_checks = |sums: Vec<i64>| [vec![4, 4, 1, 1, 1, -1, -1], sums, vec![1, -1]].concat();
    let expected: Vec<Vec<i64>> = vec![
        [vec![e, e, r], reduced_into_temporary.clone()].concat(),
        reduced_into_temporary.clone(),
        vec![e, -e],
        reduced_into_temporary.clone(),
        reduced_into_temporary,
        vec![e, 4, -e, -4],
        vec![e, -e],
        reduced_into_scalar.clone(),
        reduced_into_scalar.clone(),
        reduced_into_scalar,
        vec![e, e, 4, -e, -e, -4],
        vec![e, r, e, -r, -e, e, 4, -e, -e, -4],
        vec![64, 64, 16, -16, -64, e, 64, -e, -64, -64],
        [vec![128], multinomial_checks(vec![64, 16, 1, -16, -64]), vec![e, -e, -1, -1, -4, -4, -128]].concat(),
        [vec![8], multinomial_checks(vec![4, 1, -4]), vec![r, -r, -1, -1, -4, -4, -8]].concat(),
        [vec![384], multinomial_checks(vec![64, 16, 1, -16, -64]), vec![e, 192, -192, -e, -1, -1, -4, -4, -384]].concat(),
        vec![384, e, e, e, -e, -e, -e, -384],
        vec![],
    ];
    assert_eq!(phases(&events(&trace)), expected);
    // CPU: the kernels are the same code, so the loss storages a real run keeps are the fake run's.
    let (fake_out, fake) = capture(dir.path(), "cpu-fake.csv", &["--device", "cpu", "--no-sites"], &[&fixture("kernel_buffers.py"), "cpu"]);
    assert!(fake_out.status.success(), "{}", stderr(&fake_out));
    let (real_out, real) = capture(dir.path(), "cpu-real.csv", &["--device", "cpu", "--real", "--no-sites"], &[&fixture("kernel_buffers.py"), "cpu"]);
    assert!(real_out.status.success(), "{}", stderr(&real_out));
    assert_eq!(fake_out.stdout, real_out.stdout);
    assert_eq!(signed_sizes(&events(&fake)), signed_sizes(&events(&real)));
}

/// Note [Out-of-place backward formulas]: under a dispatch mode these backward formulas take
/// their out-of-place branch; the capture records the one gradient buffer an untraced run makes
/// (new_zeros then scatter_add_/scatter_/index_put_/index_add_ in place; BCE with logits'
/// sigmoid().sub_(target).mul_(grad)), not a second and third of the same size.
#[test]
fn backward_formulas_record_one_buffer_where_an_untraced_run_writes_in_place() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "bw.csv", &["--no-sites"], &[&fixture("backward_formulas.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let g = 256 * 256 * 4;
    let by_phase = phases(&events(&trace));
    let expected: Vec<Vec<i64>> = vec![
        vec![g, 16384, g, 512],
        vec![8192, 4, -8192, 4, g, -4, -4, -g],
        vec![8192, 16384, 4, -8192, 4, g, -16384, -4, -4, -g],
        vec![g, g, 4, -g, -g, 4, g, -4, -4, -g],
        vec![65536, 4, -65536, 4, g, -4, -4, -g],
        vec![65536, 4, -65536, 4, g, -4, -4, -g],
        vec![g, 2 * g, 4, -g, 4, g, -2 * g, -4, -4, -g],
        vec![1024, 2048, 4, -1024, 4, g, -2048, -4, -4, -g],
        vec![],
    ];
    assert_eq!(by_phase, expected);
}

/// torch.equal and torch.allclose read values: known contents are compared as torch compares them;
/// unknown ones stop the capture naming the read, or with --scalar-value every element holds
/// that value (equal when the shapes are).
#[test]
fn value_comparisons_read_known_values_or_the_scalar_value() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = capture(dir.path(), "stop.csv", &["--no-sites", "--strict-values"], &[&fixture("value_comparisons.py")]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("known True False"));
    let err = stderr(&out);
    assert!(
        err.contains("value_comparisons.py:8") && err.contains("aten.allclose.default (torch.equal, torch.allclose: a bool read from the values)"),
        "{err}"
    );
    let (out, _) = capture(dir.path(), "answered.csv", &["--no-sites", "--scalar-value", "1"], &[&fixture("value_comparisons.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("unknown True True False"));
}

/// A periodic window of N points is computed as N + 1 and narrowed (TensorFactories.cpp): its
/// storage keeps N + 1 at every call, not only at the first (FakeTensor's dispatch cache rebuilds
/// a cached result from its view's size), as the composite kernel a GPU runs makes it.
#[test]
fn periodic_windows_keep_their_extra_point_at_every_call() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "w.csv", &["--no-sites"], &[&fixture("windows.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, ["hann_window 1028 (256,) 1024", "hann_window 1028 (256,) 1024", "hamming_window 1028 (256,) 1024", "bartlett_window 1028 (256,) 1024"]);
    let allocs: Vec<u64> = events(&trace).iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { Some(*bytes) } else { None }).collect();
    assert_eq!(allocs, [1028, 1024].repeat(4));
}

/// `torch.cuda.MemPool(use_on_oom=True)` writes `pool_use_on_oom` right after the pool is made,
/// and the replay reads it (setUseOnOOM: docs/trace-format.md).
#[test]
fn a_mem_pool_used_on_oom_says_so_in_the_trace() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "oom-pool.csv", &[], &[&fixture("mempool_use_on_oom.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    use Event::Pool;
    let at = evs.iter().position(|e| *e == Pool(PoolOp::UseOnOom { pool: 1 })).unwrap_or_else(|| panic!("{evs:?}"));
    assert_eq!(&evs[at - 2..at], &[Pool(PoolOp::Begin { pool: 1, stream: None }), Pool(PoolOp::End { pool: 1 })]);
    let replay = Command::new(env!("CARGO_BIN_EXE_allocbench")).args(["replay", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(replay.status.success(), "{}", String::from_utf8_lossy(&replay.stderr));
}

/// `--device cpu` without `--real` makes every CPU tensor fake: a value read names that cause and
/// the flag that records real CPU tensors (not the 1 MiB CPU-factory rule of a CUDA capture).
#[test]
fn a_value_read_on_a_fake_cpu_capture_names_real_cpu_as_the_fix() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = capture(dir.path(), "cpu.csv", &["--device", "cpu", "--strict-values"], &[&fixture("cpu_value_read.py")]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("with --device cpu and no --real every CPU tensor is fake"), "{err}");
    assert!(err.contains("capture with --real --device cpu to record real CPU tensors"), "{err}");
    assert!(!err.contains("made by a CPU factory"), "{err}");
    let (out, _) = capture(dir.path(), "real.csv", &["--device", "cpu", "--real"], &[&fixture("cpu_value_read.py")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The entries of `a` and of `b` left out of their longest common subsequence.
fn unmatched(a: &[i64], b: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[at(i, j)] = if a[i] == b[j] { lcs[at(i + 1, j + 1)] + 1 } else { lcs[at(i + 1, j)].max(lcs[at(i, j + 1)]) };
        }
    }
    let (mut i, mut j, mut only_a, mut only_b) = (0, 0, Vec::new(), Vec::new());
    while i < n && j < m {
        if a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
        } else if lcs[at(i + 1, j)] >= lcs[at(i, j + 1)] {
            only_a.push(a[i]);
            i += 1;
        } else {
            only_b.push(b[j]);
            j += 1;
        }
    }
    only_a.extend(&a[i..]);
    only_b.extend(&b[j..]);
    (only_a, only_b)
}

fn peak_live(sizes: &[i64]) -> i64 {
    sizes.iter().scan(0i64, |live, s| Some(*live + s).inspect(|v| *live = *v)).max().unwrap_or(0)
}

#[test]
fn the_driver_backend_records_pytorchs_own_allocator_and_agrees_with_fake_tensors() {
    if !have_torch() {
        return;
    }
    // The same training script on both backends: PyTorch's real CUDA path over the fake CUDA
    // runtime (its caching allocator's own ALLOC/FREE_REQUESTED events) and the fake-tensor
    // capture. They agree allocation for allocation but for the kernel-internal scratch the
    // fake-tensor backend names as not seen (small buffers a kernel takes and frees: the
    // gradient-norm and loss reductions' partials), and frees of one burst in another order.
    let dir = tempfile::tempdir().unwrap();
    for model in ["tiny-gpt", "tiny-llama"] {
        let args = [model_script("models/train.py").leak() as &str, "--model", model, "--steps", "3", "--seq-len", "16..48", "--batch", "2"];
        let (out, driver) = capture(dir.path(), &format!("{model}-driver.csv"), &["--backend", "driver"], &args);
        assert!(out.status.success(), "{}", stderr(&out));
        // No Python dispatch to split the time by: the summary says where it went.
        assert!(stderr(&out).lines().any(|l| l.starts_with("time: ") && l.contains("on PyTorch's own CUDA path")), "{}", stderr(&out));
        let (out, fake) = capture(dir.path(), &format!("{model}-fake.csv"), &[], &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let header = std::fs::read_to_string(&driver).unwrap();
        assert!(header.starts_with("# allocbench capture v1") && header.contains("# backend: driver"), "the trace says which backend wrote it");
        assert!(std::fs::read_to_string(&fake).unwrap().contains("# backend: fake-tensors"));
        // Allocation sites: every allocation of PyTorch's has one (backward's at the backward()
        // call, as on fake tensors), and they are the fake-tensor capture's lines of the script.
        let file_lines = |path: &Path| -> Vec<String> {
            let sites = read_trace(path).unwrap().read_sites().unwrap();
            sites.of_id.values().map(|&i| sites.names[i as usize].split(' ').next().unwrap().to_string()).collect()
        };
        let (driver_sites, fake_sites) = (file_lines(&driver), file_lines(&fake));
        // The device's math, as torch.utils.flop_counter counts it, is the same FLOP for FLOP
        // (the driver's from the ATen ops PyTorch's CUDA path runs).
        let flops = |path: &Path| allocbench::input::Source::open(Some(path)).unwrap().flops();
        assert!(flops(&driver).is_some(), "{model}: the driver's trace says its FLOPs");
        assert_eq!(flops(&driver), flops(&fake), "{model}: FLOPs on the driver and on fake tensors");
        let allocs = events(&driver).iter().filter(|e| matches!(e, Event::Alloc { .. })).count();
        assert_eq!(driver_sites.len(), allocs, "{model}: every allocation has a site");
        let known: std::collections::HashSet<&String> = fake_sites.iter().collect();
        let agreeing = driver_sites.iter().filter(|s| known.contains(s)).count();
        assert!(agreeing * 100 >= driver_sites.len() * 95, "{model}: {agreeing} of {} driver sites are the fake-tensor capture's", driver_sites.len());
        let (driver, fake) = (events(&driver), events(&fake));
        assert_eq!(steps(&driver), vec![1, 2, 3], "{model}: a step after every optimizer.step()");
        let (d, f) = (signed_sizes(&driver), signed_sizes(&fake));
        assert!(f.len() > 300 && d.len() >= f.len(), "{model}: {} rows on the driver, {} on fake tensors", d.len(), f.len());
        let (only_fake, only_driver) = unmatched(&f, &d);
        assert!(only_fake.iter().all(|&s| s < 0), "{model}: every allocation of the fake-tensor capture is PyTorch's too: {only_fake:?}");
        assert!(only_driver.iter().all(|&s| s <= 64 << 10), "{model}: what only PyTorch allocates is kernel scratch of at most 64 KiB: {only_driver:?}");
        assert!(only_driver.len() * 20 < d.len(), "{model}: {} of {} rows differ", only_driver.len(), d.len());
        let (pd, pf) = (peak_live(&d), peak_live(&f));
        assert!(pd >= pf && pd - pf <= 1 << 20, "{model}: peak live {pd} B on the driver, {pf} B on fake tensors");
        // The trace replays like any other.
        let replay = Command::cargo_bin("allocbench")
            .unwrap()
            .args(["replay", dir.path().join(format!("{model}-driver.csv")).to_str().unwrap(), "-q"])
            .output()
            .unwrap();
        assert!(replay.status.success(), "{}", stderr(&replay));
    }
}

/// False (the test skipped, visibly) when the Python has no torchvision, unless CI requires it.
fn have_torchvision() -> bool {
    let ok = std::process::Command::new(python()).args(["-c", "import torchvision"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        common::skip("torchvision", &format!("{} cannot import torchvision (pip install torchvision)", python()), "ALLOCBENCH_REQUIRE_TORCH");
    }
    ok
}

/// The allocation sizes of a trace in order (frees left out: a driver trace ends with the
/// process's live tensors unfreed, a fake-tensor one frees them).
fn alloc_sizes(evs: &[Event]) -> Vec<i64> {
    evs.iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { Some(*bytes as i64) } else { None }).collect()
}

#[test]
fn convolutions_take_cudnns_path_on_the_driver_backend_as_on_fake_tensors() {
    if !have_torch() {
        return;
    }
    // NVIDIA's cuDNN cannot start on the fake driver; the driver backend's fake cuDNN answers the
    // graph API's heuristics and plans and the legacy batch-norm calls, so convolutions and batch
    // norm take cuDNN's path as on a GPU: their allocations are the outputs and workspaces
    // PyTorch asks its allocator for, the fake-tensor capture's (it models cuDNN's path too), not
    // the column buffers of PyTorch's own convolution kernels. An LSTM runs PyTorch's kernels on
    // both backends (no fake of cuDNN's RNN), said once.
    let dir = tempfile::tempdir().unwrap();
    let script = fixture("conv_rnn.py");
    let (out, driver) = capture(dir.path(), "driver.csv", &["--backend", "driver"], &[&script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&driver).unwrap();
    assert!(text.lines().any(|l| l.starts_with("# cuDNN: allocbench's fake") && l.contains("0 here")), "the header says cuDNN is faked: {text:.800}");
    assert!(!text.contains("not seen: cuDNN"));
    assert_eq!(stderr(&out).matches("RNNs run PyTorch's non-cuDNN kernels").count(), 1, "{}", stderr(&out));
    assert!(text.contains("# RNNs: PyTorch's non-cuDNN kernels"));
    let (out, fake) = capture(dir.path(), "fake.csv", &[], &[&script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (d, f) = (alloc_sizes(&events(&driver)), alloc_sizes(&events(&fake)));
    assert_eq!(d.len(), f.len(), "as many allocations on both backends");
    let (only_fake, only_driver) = unmatched(&f, &d);
    // (The LSTM's gate buffers come in another order: its non-cuDNN kernels, not cuDNN's.)
    assert!(only_driver.len() <= 9 && only_fake.len() == only_driver.len(), "{only_fake:?} / {only_driver:?}");
    let (pd, pf) = (peak_live(&signed_sizes(&events(&driver))), peak_live(&signed_sizes(&events(&fake))));
    assert_eq!(pd, pf, "peak live bytes");

    // Each cuDNN call asks for the workspace the fake is told; PyTorch takes it from its
    // allocator and frees it when the call returns: per step two convolution forwards, the first
    // one's weight gradient (its input needs none), the second's data and weight gradients, and
    // two batch norms' forward and backward.
    let workspace = 1_234_567;
    let (out, with_workspace) =
        capture_with_env(dir.path(), "ws.csv", &["--backend", "driver"], &[&script], &[("ALLOCBENCH_CUDNN_WORKSPACE_BYTES", "1234567")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read_to_string(&with_workspace).unwrap().contains("1234567 here"));
    let sizes = signed_sizes(&events(&with_workspace));
    assert_eq!(per_call_workspaces(&sizes, workspace), 3 * 9, "workspaces taken and freed per call");
    assert_eq!(alloc_sizes(&events(&with_workspace)).len(), d.len() + 27);

    // A torchvision ResNet in fp32: every convolution and batch norm on cuDNN's path; the same
    // allocations in the same order as the fake-tensor capture, the same peak.
    if !have_torchvision() {
        return;
    }
    let args = [fixture("resnet_train.py").leak() as &str, "resnet18", "8", "2"];
    let (out, driver) = capture(dir.path(), "resnet-driver.csv", &["--backend", "driver"], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let (out, fake) = capture(dir.path(), "resnet-fake.csv", &[], &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let (de, fe) = (events(&driver), events(&fake));
    assert_eq!(steps(&de), vec![1, 2]);
    assert_eq!(alloc_sizes(&de), alloc_sizes(&fe), "ResNet-18's allocations, in order");
    assert_eq!(peak_live(&signed_sizes(&de)), peak_live(&signed_sizes(&fe)));
    let flops = |path: &Path| allocbench::input::Source::open(Some(path)).unwrap().flops();
    assert_eq!(flops(&driver), flops(&fake), "convolution FLOPs alike");

    // The ImageNet recipe's bf16 autocast and channels-last: cuDNN's layout on both backends (on
    // fake tensors by the rule of ops/convolution.py: FakeTensor alone picks PyTorch's slow
    // kernel for bf16 and contiguous gradients, which AccumulateGrad then copies into each
    // channels-last weight's layout, one copy per 3x3 and 7x7 weight a step). Every allocation of
    // the fake-tensor capture is PyTorch's, in order; what only PyTorch allocates is its
    // channels-last batch norm's staging and semaphores (Normalization.cuh, sized by its launch
    // grid: the fake-tensor backend's named blind spot), at most 128 KiB each.
    let amp = [fixture("resnet_train.py").leak() as &str, "resnet18", "8", "2", "amp"];
    let (out, driver) = capture(dir.path(), "amp-driver.csv", &["--backend", "driver"], &amp);
    assert!(out.status.success(), "{}", stderr(&out));
    let (out, fake) = capture(dir.path(), "amp-fake.csv", &[], &amp);
    assert!(out.status.success(), "{}", stderr(&out));
    let (de, fe) = (events(&driver), events(&fake));
    let (only_fake, only_driver) = unmatched(&alloc_sizes(&fe), &alloc_sizes(&de));
    assert!(only_fake.is_empty(), "every fake-tensor allocation is PyTorch's: {only_fake:?}");
    assert!(!only_driver.is_empty() && only_driver.iter().all(|&b| b <= 128 << 10), "{only_driver:?}");
    assert_eq!(peak_live(&signed_sizes(&de)), peak_live(&signed_sizes(&fe)));
}

#[test]
fn inductors_memory_estimate_and_the_compiled_trace() {
    if !have_torch() {
        return;
    }
    // With ALLOCBENCH_INDUCTOR_WINDOWS=1 the driver capture marks each graph Inductor compiles
    // with its own estimate of the graph's peak (torch/_inductor/memory.py over the final node
    // order; and that timeline with the buffer reuse Inductor's wrapper planned) and each run of
    // it; scripts/validate/inductor_peak.py compares the trace's peak of each run (its
    // allocations, plus the inputs it frees; not the matmuls' workspaces). A compiled GPT's
    // forward and backward agree with Inductor's reuse-aware estimate within 2 %; memory.py's
    // own number is above the trace, by the buffers the wrapper hands on at a last use (it
    // counts both at that step).
    let dir = tempfile::tempdir().unwrap();
    let args =
        [model_script("models/train.py").leak() as &str, "--model", "tiny-gpt", "--steps", "3", "--seq-len", "64", "--batch", "4", "--compile", "default"];
    let env = [("ALLOCBENCH_INDUCTOR_WINDOWS", "1"), ("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")];
    let (out, trace) = capture_with_env(dir.path(), "compiled.csv", &["--backend", "driver"], &args, &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let check = std::process::Command::new(python()).arg(model_script("validate/inductor_peak.py")).arg(&trace).output().unwrap();
    let table = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(check.status.success(), "every graph within 2 %: {table}{}", stderr(&check));
    // graph, kind, runs, trace, with reuse, ratio, memory.py, ratio, ...
    let graphs: Vec<Vec<String>> = table.lines().skip(1).map(|l| l.split_whitespace().map(String::from).collect()).collect();
    assert_eq!(graphs.iter().map(|g| g[1].as_str()).collect::<Vec<_>>(), ["forward", "backward"], "{table}");
    for g in &graphs {
        assert_eq!(g[2], "3", "each graph ran once a step: {table}");
        let (with_reuse, memory_py): (f64, f64) = (g[5].parse().unwrap(), g[7].parse().unwrap());
        assert!((with_reuse - 1.0).abs() <= 0.02, "{table}");
        assert!(memory_py <= 1.0, "memory.py's estimate is an upper bound: {table}");
    }
    let backward: f64 = graphs[1][7].parse().unwrap();
    assert!(backward < 0.95, "the backward's reuse makes memory.py's estimate high: {table}");
}

#[test]
fn the_default_backend_is_pytorchs_own_cuda_path_where_it_builds() {
    if !have_torch() {
        return;
    }
    // `--backend auto`, the default: the driver backend where the torch in use is a CUDA build
    // and the fake stack builds; the fake-tensor backend for its own options, and where the stack
    // cannot be built (here: a fresh cache and no g++ or nm on PATH), said in one line.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.py");
    std::fs::write(&script, "import torch\nx = torch.ones(1024, device='cuda')\n").unwrap();
    let run = |name: &str, flags: &[&str], env: &[(&str, &str)]| {
        let trace = dir.path().join(name);
        let out = Command::cargo_bin("allocbench")
            .unwrap()
            .envs(env.iter().copied())
            .arg("capture")
            .args(flags)
            .arg("-o")
            .arg(&trace)
            .arg("--")
            .arg(&script)
            .timeout(std::time::Duration::from_secs(600))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let header = std::fs::read_to_string(&trace).unwrap();
        (header.lines().find(|l| l.starts_with("# backend: ")).unwrap_or("").to_string(), stderr(&out))
    };
    let (backend, _) = run("default.csv", &[], &[]);
    assert!(backend.starts_with("# backend: driver"), "{backend}");
    let (backend, _) = run("cpu.csv", &["--device", "cpu"], &[]);
    assert!(backend.starts_with("# backend: fake-tensors"), "{backend}");
    let (backend, _) = run("ws.csv", &["--cublas-workspace-mib", "8"], &[]);
    assert!(backend.starts_with("# backend: fake-tensors"), "{backend}");
    // PATH without `nm` (every other tool of /usr/bin linked) and a fresh cache: the fake stack
    // cannot be built; the fake-tensor backend's shim can.
    let cache = tempfile::tempdir().unwrap();
    let bin = cache.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for entry in std::fs::read_dir("/usr/bin").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().ends_with("nm") {
            std::os::unix::fs::symlink(entry.path(), bin.join(&name)).unwrap();
        }
    }
    let (backend, err) = run("fallback.csv", &[], &[("XDG_CACHE_HOME", cache.path().to_str().unwrap()), ("PATH", bin.to_str().unwrap())]);
    assert!(backend.starts_with("# backend: fake-tensors"), "{backend}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("the driver backend cannot run here")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("nm not found"), "{err}");
}

#[test]
fn the_driver_backend_refuses_the_fake_tensor_options_in_one_line() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.py");
    std::fs::write(&script, "print('ran')\n").unwrap();
    for flag in [&["--device", "cpu"][..], &["--cublas-workspace-mib", "8"]] {
        let mut flags = vec!["--backend", "driver"];
        flags.extend(flag);
        let (out, _) = capture(dir.path(), "refused.csv", &flags, &[script.to_str().unwrap()]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(flag[0]) && err.contains("--backend fake-tensors"), "{err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"), "the script does not run");
    }
}

#[test]
fn torch_compile_runs_compiled_on_the_driver_backend() {
    if !have_torch() {
        return;
    }
    // Inductor generates Triton kernels, the triton wheel's ptxas compiles them on the host for
    // the fake card (sm_90), and their launches do nothing: the trace is the compiled program's
    // (Inductor's own buffers and its autotuning's), not the eager one a fake-tensor capture sees.
    let dir = tempfile::tempdir().unwrap();
    let body = |compiled: bool| {
        format!(
            "import torch, torch.nn as nn\nm = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()\n\
             run = torch.compile(m) if {compiled} else m\nopt = torch.optim.AdamW(m.parameters())\nfor _ in range(3):\n\
             \x20   loss = run(torch.randn(64, 256, device='cuda')).square().mean()\n\x20   loss.backward(); opt.step(); opt.zero_grad()\nprint('done')\n",
            compiled = if compiled { "True" } else { "False" }
        )
    };
    let (mut traces, mut flops) = (Vec::new(), Vec::new());
    for compiled in [true, false] {
        let script = dir.path().join(format!("mlp-{compiled}.py"));
        std::fs::write(&script, body(compiled)).unwrap();
        let cache = dir.path().join("triton-cache");
        let (out, trace) = capture_with_env(
            dir.path(),
            &format!("mlp-{compiled}.csv"),
            &["--backend", "driver"],
            &[script.to_str().unwrap()],
            &[("TRITON_CACHE_DIR", cache.to_str().unwrap()), ("TORCHINDUCTOR_CACHE_DIR", dir.path().join("inductor").to_str().unwrap())],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(String::from_utf8_lossy(&out.stdout).contains("done"));
        let evs = events(&trace);
        assert_eq!(steps(&evs), vec![1, 2, 3]);
        if compiled {
            assert!(std::fs::read_dir(&cache).map(|d| d.count() > 0).unwrap_or(false), "Triton compiled kernels for the fake card");
        }
        traces.push(signed_sizes(&evs));
        flops.push(allocbench::input::Source::open(Some(&trace)).unwrap().flops());
    }
    let (compiled, eager) = (&traces[0], &traces[1]);
    assert_ne!(compiled, eager, "the compiled program allocates as Inductor decides, not as eager does");
    // Its matmuls are Inductor's extern cuBLAS calls: the same math as eager's.
    assert!(flops[0].is_some() && flops[0] == flops[1], "FLOPs compiled {:?}, eager {:?}", flops[0], flops[1]);
    // The parameters and AdamW's state are the same tensors either way.
    let persistent = |t: &[i64]| t.iter().filter(|&&s| s == 1024 * 256 * 4).count();
    assert_eq!(persistent(compiled), persistent(eager));
}

#[test]
fn reads_on_the_driver_backend_get_the_stand_in_and_are_counted_at_the_scripts_line() {
    if !have_torch() {
        return;
    }
    // The fake device holds no values: Python's reads (.item(), bool(), a copy to the host) are
    // answered with --scalar-value and counted per line, as the fake-tensor capture does.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("reads.py");
    std::fs::write(
        &script,
        "import torch\nx = torch.ones(4, device='cuda')\nfor _ in range(3):\n    v = x.sum().item()\n\
         print('item', v)\nprint('branch', bool(x.sum() > 2))\nprint('host', x.cpu().tolist())\nprint('mask', x[x > 5].shape)\n",
    )
    .unwrap();
    let (out, trace) = capture(dir.path(), "reads.csv", &["--backend", "driver", "--scalar-value", "3"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("item 3.0") && stdout.contains("branch True") && stdout.contains("host [3.0, 3.0, 3.0, 3.0]"), "{stdout}");
    let text = std::fs::read_to_string(&trace).unwrap();
    for line in [
        "# value made up: .item() ×3 at reads.py:4 `v = x.sum().item()` (answered 3)",
        "# value made up: bool() ×1 at reads.py:6",
        "# value made up: .cpu() ×1 at reads.py:7",
        // PyTorch's own read of the mask's count, in C++: zeros, counted without a line (the
        // copy `.cpu()` made is not counted twice).
        "# value made up: a copy to the host PyTorch made in C++ (a data-dependent shape: nonzero, a boolean mask, unique) ×1 at PyTorch's C++ code",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
    assert!(stdout.contains("mask torch.Size([0])"), "{stdout}");
    assert!(stderr(&out).contains("6 values made up (answered 3"), "{}", stderr(&out));
    // --strict-values stops at the first, naming its line.
    let (out, trace) = capture(dir.path(), "strict.csv", &["--backend", "driver", "--strict-values"], &[script.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("reads.py:4") && err.contains("--strict-values") && !String::from_utf8_lossy(&out.stdout).contains("item"), "{err}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains("# capture incomplete"));
}

#[test]
fn several_fake_gpus_on_the_driver_backend_give_one_trace_each() {
    if !have_torch() {
        return;
    }
    // A model split over two devices (as device_map="auto" or a pipeline splits it): each
    // device's allocations in its own trace, every trace with the steps.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("two.py");
    std::fs::write(
        &script,
        "import torch, torch.nn as nn\nassert torch.cuda.device_count() == 2\n\
         a = nn.Linear(256, 512).to('cuda:0'); b = nn.Linear(512, 10).to('cuda:1')\n\
         opt = torch.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)\nfor _ in range(2):\n\
         \x20   loss = b(a(torch.randn(32, 256, device='cuda:0')).to('cuda:1')).sum()\n\x20   loss.backward(); opt.step(); opt.zero_grad()\n",
    )
    .unwrap();
    let (out, trace) = capture(dir.path(), "two.csv", &["--backend", "driver", "--gpus", "2"], &[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let second = dir.path().join("two.cuda1.csv");
    assert!(stderr(&out).contains(second.to_str().unwrap()), "the summary names the other device's trace: {}", stderr(&out));
    let (first, second) = (events(&trace), events(&second));
    assert_eq!(steps(&first), vec![1, 2]);
    assert_eq!(steps(&second), vec![1, 2]);
    let (first, second) = (signed_sizes(&first), signed_sizes(&second));
    assert!(first.contains(&(256 * 512 * 4)) && !first.contains(&(512 * 10 * 4)), "cuda:0 holds a's weight: {first:?}");
    assert!(second.contains(&(512 * 10 * 4)) && !second.contains(&(256 * 512 * 4)), "cuda:1 holds b's weight: {second:?}");
    // One fake GPU is what the fake-tensor backend has.
    let (out, _) = capture(dir.path(), "refused.csv", &["--gpus", "2"], &[script.to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("--backend driver"), "{}", stderr(&out));
}

#[test]
fn a_cuda_call_the_driver_backend_cannot_answer_is_named_in_one_line() {
    if !have_torch() {
        return;
    }
    // Sharing a CUDA tensor with another process (torch.multiprocessing's reduction asks for a
    // CUDA IPC handle) is not faked: the script stops at it with the call named and the way
    // out, and the rows before it are kept.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("ipc.py");
    std::fs::write(
        &script,
        "import torch\nfrom torch.multiprocessing.reductions import reduce_tensor\nx = torch.ones(1024, device='cuda')\nreduce_tensor(x)\n",
    )
    .unwrap();
    let (out, trace) = capture(dir.path(), "ipc.csv", &["--backend", "driver"], &[script.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let last = err.trim().lines().last().unwrap_or("");
    assert!(last.contains("cudaIpcGetMemHandle") && last.contains("--backend fake-tensors") && last.contains("ipc.py:4"), "{err}");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.contains("alloc,1,4096,0") && text.contains("# capture incomplete"), "{text}");
}

/// The statistics a fixture printed (`stats RESERVED_PEAK ALLOCATED_PEAK DEVICE_MALLOCS`) and
/// those of its trace replayed by allocbench's simulator.
fn real_and_replayed_stats(out: &Output, trace: &Path) -> ([u64; 3], [u64; 3]) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("stats ")).unwrap_or_else(|| panic!("no stats line: {stdout}"));
    let real: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    let replay = Command::cargo_bin("allocbench").unwrap().args(["replay", trace.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(replay.status.success(), "{}", stderr(&replay));
    let json: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let stat = |key: &str| json["stats"][key].as_u64().unwrap_or_else(|| panic!("no {key} in the replay's stats"));
    ([real[0], real[1], real[2]], [stat("reserved_bytes.all.peak"), stat("allocated_bytes.all.peak"), stat("num_device_alloc")])
}

#[test]
fn cuda_graphs_and_reduce_overhead_capture_on_the_driver_backend_with_their_pools() {
    if !have_torch() {
        return;
    }
    // A CUDA graph's capture runs on the fake runtime (the stream capturing until it ends, what
    // was captured already run); PyTorch's allocator routes the capture's allocations to the
    // graph's private pool, and the trace says so where PyTorch does: pool_begin on the capture
    // stream, pool_join when a side stream waits on it (and so joins the capture), pool_end at
    // its end, pool_release when the graph dies; a MemPool made, used and deleted; empty_cache
    // as torch.cuda.graph calls it. Replayed by the simulator, the trace
    // gives what PyTorch's own allocator counted in the process: peak reserved, peak allocated,
    // device mallocs.
    let dir = tempfile::tempdir().unwrap();
    let (out, trace) = capture(dir.path(), "graph.csv", &["--backend", "driver"], &[&fixture("graph_pools.py"), "graph"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&trace).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("alloc") && !l.starts_with("free")).skip(1).collect();
    assert_eq!(
        rows,
        [
            "sync,,,",
            "empty_cache,,,",
            "pool_begin,1,,1",
            "pool_join,1,,2",
            "pool_end,1,,",
            "sync,,,",
            "empty_cache,,,",
            "pool_begin,1,,1",
            "pool_end,1,,",
            "pool_release,1,,",
            "pool_release,1,,",
            "pool_begin,2,,",
            "pool_end,2,,",
            "pool_begin,2,,",
            "pool_end,2,,",
            "pool_release,2,,",
            "pool_release,2,,",
            "empty_cache,2,,"
        ],
        "{text}"
    );
    let (real, replayed) = real_and_replayed_stats(&out, &trace);
    assert_eq!(real, replayed, "PyTorch's allocator and the replay: peak reserved, peak allocated, device mallocs");

    // torch.compile(mode="reduce-overhead"): Inductor's CUDA graph trees warm up in the pool
    // (a thread's allocations routed), record the forward and the backward, then replay.
    let (out, trace) = capture(dir.path(), "ro.csv", &["--backend", "driver"], &[&fixture("graph_pools.py"), "reduce-overhead"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let evs = events(&trace);
    assert_eq!(steps(&evs), vec![1, 2, 3, 4, 5]);
    assert!(evs.iter().filter(|e| matches!(e, Event::Pool(_))).count() >= 4, "the graph trees' pool rows");
    let (real, replayed) = real_and_replayed_stats(&out, &trace);
    assert_eq!(real, replayed, "reduce-overhead: PyTorch's allocator and the replay");
}

#[test]
fn nproc_per_node_captures_each_rank_of_an_unedited_fsdp2_script() {
    if !have_torch() {
        return;
    }
    // A script written for torchrun (init_process_group("nccl"), set_device(LOCAL_RANK), a
    // DeviceMesh over the world): each rank runs in its own process on the fake process group,
    // and its trace holds its own device's allocations, a quarter of each weight.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fsdp.py");
    std::fs::write(
        &script,
        "import os, torch, torch.nn as nn, torch.distributed as dist\nfrom torch.distributed.fsdp import fully_shard\n\
         from torch.distributed.device_mesh import init_device_mesh\ndist.init_process_group('nccl')\n\
         torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\nmesh = init_device_mesh('cuda', (dist.get_world_size(),))\n\
         model = nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256)).cuda()\nfor layer in model:\n    fully_shard(layer, mesh=mesh)\n\
         opt = torch.optim.AdamW(model.parameters())\nfor _ in range(2):\n\
         \x20   model(torch.randn(8, 256, device='cuda')).sum().backward(); opt.step(); opt.zero_grad()\n\
         print('rank', dist.get_rank(), torch.cuda.current_device(), tuple(model[0].weight.to_local().shape))\n",
    )
    .unwrap();
    let folder = dir.path().join("ranks");
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["capture", "--backend", "driver", "--nproc-per-node", "4", "--ranks", "0,3", "-o", folder.to_str().unwrap(), "--", script.to_str().unwrap()])
        .timeout(std::time::Duration::from_secs(600))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("rank 0 0 (64, 256)") && stdout.contains("rank 3 3 (64, 256)") && !stdout.contains("rank 1"), "{stdout}");
    let mut names: Vec<String> = std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["rank-0.csv", "rank-3.csv", "ranks.json"], "one trace per captured rank, each its own device's");
    for rank in ["rank-0.csv", "rank-3.csv"] {
        let evs = events(&folder.join(rank));
        assert_eq!(steps(&evs), vec![1, 2]);
        assert!(signed_sizes(&evs).contains(&(64 * 256 * 4)), "{rank}: its shard of a weight");
    }
    // Bad input: one line each.
    for (flags, says) in [
        (&["--backend", "driver", "--nproc-per-node", "2", "--ranks", "5"][..], "rank 5 is not in a job of 2"),
        (&["--backend", "driver", "--nproc-per-node", "2", "--ranks", "0,x"], "'x' is not a rank"),
        (&["--backend", "fake-tensors", "--nproc-per-node", "2"], "add --backend driver"),
    ] {
        let out = Command::cargo_bin("allocbench")
            .unwrap()
            .arg("capture")
            .args(flags)
            .args(["-o", folder.to_str().unwrap(), "--", script.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success() && stderr(&out).trim().lines().count() == 1 && stderr(&out).contains(says), "{}", stderr(&out));
    }
}

#[test]
fn ddp_fsdp2_and_tensor_parallel_scripts_capture_unedited_for_eight_ranks() {
    if !have_torch() {
        return;
    }
    // One torchrun script (tests/fixtures/capture/sharded.py), four ways to shard a model of four
    // 512x2048 blocks. Uniform SPMD jobs: rank 0's trace stands for all eight (--ranks distinct);
    // the pipeline's stages differ.
    let dir = tempfile::tempdir().unwrap();
    let capture = |kind: &str| {
        let folder = dir.path().join(kind);
        let out = Command::cargo_bin("allocbench")
            .unwrap()
            .args([
                "capture",
                "--backend",
                "driver",
                "--nproc-per-node",
                "8",
                "--ranks",
                "distinct",
                "-o",
                folder.to_str().unwrap(),
                "--",
                &fixture("sharded.py"),
                kind,
            ])
            .timeout(std::time::Duration::from_secs(900))
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind}: {}", stderr(&out));
        let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(folder.join("ranks.json")).unwrap()).unwrap();
        (folder, manifest, stderr(&out))
    };
    let weight = 512 * 2048 * 4;
    let mut peaks = std::collections::HashMap::new();
    for kind in ["ddp", "fsdp2", "tp"] {
        let (folder, manifest, err) = capture(kind);
        let ranks = manifest["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 8, "{kind}");
        assert!(ranks[1..].iter().all(|r| r["same_as"] == 0 && r["trace"].is_null()), "{kind}: {manifest}");
        assert!(err.contains("rank 7: the same allocations and communicators as rank 0 through step 1"), "{kind}: {err}");
        let evs = events(&folder.join("rank-0.csv"));
        assert_eq!(steps(&evs), vec![1, 2, 3], "{kind}");
        let sizes = signed_sizes(&evs);
        match kind {
            // Replicated: each weight whole, and its gradient's copy in a 1 MiB bucket or more.
            "ddp" => assert!(sizes.contains(&weight), "ddp: a whole weight"),
            // Sharded over eight: an eighth of each weight.
            _ => assert!(sizes.contains(&(weight / 8)), "{kind}: an eighth of a weight"),
        }
        let tail = std::fs::read_to_string(folder.join("rank-0.csv")).unwrap();
        assert!(tail.contains("# nccl communicator: ranks=8 p2p_peers=0"), "{kind}");
        peaks.insert(kind, peak_live(&sizes));
    }
    // DDP keeps the whole model, its gradients, their buckets and AdamW's two states per rank;
    // FSDP2 and TP an eighth of them (FSDP2's peak holds the model as built, before sharding).
    assert!(peaks["ddp"] > 2 * peaks["fsdp2"] && peaks["ddp"] > 2 * peaks["tp"], "{peaks:?}");
    // The pipeline: 10 blocks over 8 ranks, ranks 3 and 7 hold two; rank 0 sends to one peer,
    // the middle stages reach two, the last receives from one.
    let (folder, manifest, _) = capture("pipeline");
    let traced: Vec<u64> = manifest["ranks"].as_array().unwrap().iter().filter(|r| !r["trace"].is_null()).map(|r| r["rank"].as_u64().unwrap()).collect();
    assert_eq!(traced, [0, 1, 3, 7], "{manifest}");
    let same: Vec<u64> = manifest["ranks"].as_array().unwrap().iter().filter(|r| r["same_as"] == 1).map(|r| r["rank"].as_u64().unwrap()).collect();
    assert_eq!(same, [2, 4, 5, 6]);
    assert!(peak_live(&signed_sizes(&events(&folder.join("rank-3.csv")))) > peak_live(&signed_sizes(&events(&folder.join("rank-0.csv")))));
    let out = Command::cargo_bin("allocbench").unwrap().args(["diagnose", folder.to_str().unwrap(), "--json", "-"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["decided_by_rank"], 3, "the middle stage of two blocks and two peers");
    let nccl: Vec<u64> = d["ranks"].as_array().unwrap().iter().map(|r| r["nccl"].as_u64().unwrap()).collect();
    let connection = (4 << 20) + 4_915_200 + 524_288u64;
    assert_eq!(nccl, [3, 4, 4, 3].map(|peers| peers * 32 * connection), "ring 2 + point-to-point peers, x 32 channels x a connection's buffers");
}

#[test]
fn bytes_copied_to_the_fake_device_read_back_until_a_kernel_runs() {
    if !have_torch() {
        return;
    }
    // DDP sends its bucket layout through the device and reads it back (Reducer::
    // sync_bucket_indices); the fake device keeps such bytes until a kernel runs, after which
    // what a skipped kernel would have written reads as zeros.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("round_trip.py");
    std::fs::write(
        &script,
        "import torch\nt = torch.tensor([7, 8, 9], dtype=torch.int32)\nd = torch.empty(3, dtype=torch.int32, device='cuda')\n\
         d.copy_(t, non_blocking=True)\nback = torch.empty(3, dtype=torch.int32)\nback.copy_(d)\nprint('back', back.tolist())\n\
         e = d + 1\nback.copy_(d)\nprint('after', back.tolist())\n",
    )
    .unwrap();
    let out = Command::cargo_bin("allocbench")
        .unwrap()
        .args(["capture", "--backend", "driver", "-o", dir.path().join("t.csv").to_str().unwrap(), "--", script.to_str().unwrap()])
        .timeout(std::time::Duration::from_secs(300))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("back [7, 8, 9]") && stdout.contains("after [0, 0, 0]"), "{stdout}");
}

/// The fake process group against real collectives, on the CPU: tests/fixtures/capture/sharded.py
/// with gloo, two processes started as torchrun would (real all-reduces, all-gathers,
/// reduce-scatters), each recording its real CPU tensors, against `capture --real --device cpu
/// --nproc-per-node 2` (the same ranks on the fake group). Rank by rank the allocations are the
/// same sizes in the same order, save gloo's own: its reduce-scatter copies its input first
/// (FSDP2's 8 MiB unsharded gradient of each block, freed at once), which NCCL's does not.
#[test]
fn the_fake_process_group_allocates_as_real_collectives_do_on_the_cpu() {
    if !have_torch() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let allocs = |evs: &[Event]| -> Vec<u64> { evs.iter().filter_map(|e| if let Event::Alloc { bytes, .. } = e { Some(*bytes) } else { None }).collect() };
    // The allocation sizes other than `bytes`, and how many of `bytes` there were.
    let without = |evs: &[Event], bytes: u64| -> (Vec<u64>, usize) {
        let all = allocs(evs);
        let n = all.iter().filter(|&&b| b == bytes).count();
        (all.into_iter().filter(|&b| b != bytes).collect(), n)
    };
    for kind in ["ddp", "fsdp2", "tp"] {
        let real = dir.path().join(format!("real-{kind}"));
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                std::process::Command::new(assert_cmd::cargo::cargo_bin("allocbench"))
                    .args([
                        "capture",
                        "--quiet",
                        "--real",
                        "--device",
                        "cpu",
                        "-o",
                        real.join(format!("rank-{rank}.csv")).to_str().unwrap(),
                        "--",
                        &fixture("sharded.py"),
                        kind,
                        "cpu",
                    ])
                    .envs([
                        ("RANK", rank.to_string()),
                        ("LOCAL_RANK", rank.to_string()),
                        ("WORLD_SIZE", "2".into()),
                        ("MASTER_ADDR", "127.0.0.1".into()),
                        ("MASTER_PORT", port.clone()),
                    ])
                    .stdout(std::process::Stdio::null())
                    // (A file, not a pipe: a rank blocked on a full pipe would hang its peer's collective.)
                    .stderr(std::fs::File::create(dir.path().join(format!("real-{kind}-{rank}.log"))).unwrap())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for (rank, mut child) in ranks.into_iter().enumerate() {
            let status = child.wait().unwrap();
            let log = std::fs::read_to_string(dir.path().join(format!("real-{kind}-{rank}.log"))).unwrap_or_default();
            assert!(status.success(), "{kind}, real gloo, rank {rank}: {log}");
        }
        let fake = dir.path().join(format!("fake-{kind}"));
        let out = Command::cargo_bin("allocbench")
            .unwrap()
            .args(["capture", "--real", "--device", "cpu", "--nproc-per-node", "2", "-o", fake.to_str().unwrap(), "--", &fixture("sharded.py"), kind, "cpu"])
            .timeout(std::time::Duration::from_secs(600))
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind}, fake group: {}", stderr(&out));
        for rank in ["rank-0.csv", "rank-1.csv"] {
            let (real_evs, fake_evs) = (events(&real.join(rank)), events(&fake.join(rank)));
            let (mut real_allocs, mut fake_allocs) = (allocs(&real_evs), allocs(&fake_evs));
            // Gloo frees some tensors on its worker thread, whenever it gets there: those frees
            // (and the peak, by their bytes) move a little from run to run.
            let mut slack = 64 << 10;
            if kind == "fsdp2" {
                // Four blocks of 512x2048 + 2048 and 2048x512 + 512 fp32 parameters, three steps:
                // gloo's copy of each reduce-scatter's input (FSDP2's own reduce-scatter input,
                // the same size, is in both runs).
                let unsharded_gradient = (2 * 512 * 2048 + 2048 + 512) * 4;
                let (real_kept, real_n) = without(&real_evs, unsharded_gradient);
                let (fake_kept, fake_n) = without(&fake_evs, unsharded_gradient);
                assert_eq!(real_n - fake_n, 12, "{kind} {rank}: one copy per block and step, in the real run only");
                (real_allocs, fake_allocs) = (real_kept, fake_kept);
                slack += unsharded_gradient as i64;
            }
            assert_eq!(real_allocs, fake_allocs, "{kind} {rank}: the same allocations in the same order");
            assert_eq!(steps(&real_evs), steps(&fake_evs), "{kind} {rank}");
            let (real_peak, fake_peak) = (peak_live(&signed_sizes(&real_evs)), peak_live(&signed_sizes(&fake_evs)));
            assert!((real_peak - fake_peak).abs() <= slack, "{kind} {rank}: peaks {real_peak} B real, {fake_peak} B on the fake group");
        }
    }
}

#[test]
fn inductors_autotuning_runs_on_the_driver_backend_and_is_said() {
    if !have_torch() {
        return;
    }
    // max-autotune times each choice of a matmul by CUDA events: on the fake card every interval
    // takes the same 1 ms (no kernel runs; Inductor divides by the timings, so never 0), the
    // first choice is kept, and the trace and the summary say how many benchmarks ran.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("tuned.py");
    std::fs::write(
        &script,
        "import torch\nmm = torch.compile(lambda a, b: a @ b, mode='max-autotune-no-cudagraphs')\n\
         a, b = torch.randn(256, 256, device='cuda'), torch.randn(256, 256, device='cuda')\nprint(mm(a, b).shape)\n",
    )
    .unwrap();
    let (out, trace) = capture_with_env(
        dir.path(),
        "tuned.csv",
        &["--backend", "driver"],
        &[script.to_str().unwrap()],
        &[("TRITON_CACHE_DIR", dir.path().join("triton").to_str().unwrap()), ("TORCHINDUCTOR_CACHE_DIR", dir.path().join("inductor").to_str().unwrap())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("torch.Size([256, 256])"));
    let said = stderr(&out);
    let line = said.lines().find(|l| l.starts_with("autotuning: ")).unwrap_or_else(|| panic!("{said}"));
    let benchmarks: u64 = line["autotuning: ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(benchmarks > 0 && line.contains("kept its first (default) choice"), "{line}");
    assert!(std::fs::read_to_string(&trace).unwrap().contains(&format!("# autotuning: {benchmarks} GPU benchmarks")));
    // The math is the one matmul the program does, not the runs that timed its choices.
    let flops = allocbench::input::Source::open(Some(&trace)).unwrap().flops();
    assert_eq!(flops, Some((2 * 256 * 256 * 256) as f64), "FLOPs of a 256³ matmul");
}
