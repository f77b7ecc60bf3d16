//! Sweeps sharded over a scheduler's array (a Slurm job array, a Kubernetes Indexed Job):
//! [`make_plan`] writes one row per replay (input × capacity × allocator × conf, in a stable
//! order), [`run_shard`] replays the rows i ≡ I (mod N) of a plan on every core and appends each
//! finished row to `DIR/shard-I-of-N.jsonl` (resuming where a killed task stopped), and [`merge`]
//! gathers every plan row exactly once. [`advice`] ranks a merged sweep's confs per input and
//! capacity with `advise`'s own rule. Static sharding: no scheduler of our own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::InputError;
use crate::event::Event;
use crate::files::{sha256_file, sha256_hex};
use crate::gpu::build::{build, DeviceSpec};
use crate::gpu::config::AllocatorConfig;
use crate::gpu::replay::{OnOom, ReplayOptions, StopWhen};
use crate::gpu::torch_version::TorchVersion;
use crate::gpu_run::run_one;
use crate::input::Source;
use crate::results::{versioned_lines, Candidate, GpuPolicy, PlanRow, RowStatus, SweepRow, WorkloadInfo, SCHEMA_VERSION};

/// The copy of the plan that `sweep run` keeps in its output folder: it ties the shards to their
/// plan, and `sweep merge` reads it.
pub const PLAN_IN_DIR: &str = "plan.jsonl";

/// Which rows of a plan one task replays: index ≡ `index` (mod `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u64,
    pub count: u64,
}

impl Shard {
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// `I/N`, as `--shard` takes it.
    pub fn parse(s: &str) -> Result<Shard, String> {
        let (i, n) = s.split_once('/').ok_or_else(|| format!("'{s}' is not I/N (e.g. 0/4)"))?;
        let num = |v: &str| v.trim().parse::<u64>().map_err(|_| format!("'{s}' is not I/N with whole numbers (e.g. 0/4)"));
        let shard = Shard { index: num(i)?, count: num(n)? };
        shard.check("--shard").map_err(|e| e.message)?;
        Ok(shard)
    }

    fn check(self, from: &str) -> Result<Shard, InputError> {
        if self.count == 0 {
            return Err(InputError::new(from, "the shard count must be at least 1"));
        }
        if self.index >= self.count {
            return Err(InputError::new(from, format!("shard index {} is out of range for {} shards (0..={})", self.index, self.count, self.count - 1)));
        }
        Ok(self)
    }

    /// The shard from `--shard I/N`, else from the scheduler's environment: `JOB_COMPLETION_INDEX`
    /// (a Kubernetes Indexed Job) with `--shards N`, or `SLURM_ARRAY_TASK_ID` −
    /// `SLURM_ARRAY_TASK_MIN` (÷ `SLURM_ARRAY_TASK_STEP`) of `SLURM_ARRAY_TASK_COUNT` (`--shards`
    /// overrides the count); with none of them, the whole plan.
    pub fn resolve(shard: Option<Shard>, shards: Option<u64>, env: &dyn Fn(&str) -> Option<String>) -> Result<Shard, InputError> {
        if let Some(s) = shard {
            return s.check("--shard");
        }
        let var = |name: &str| -> Result<Option<u64>, InputError> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| InputError::new(name, format!("'{v}' is not a whole number"))),
            }
        };
        if let Some(index) = var("JOB_COMPLETION_INDEX")? {
            let count = shards
                .ok_or_else(|| InputError::new("JOB_COMPLETION_INDEX", "is set (a Kubernetes Indexed Job): give the Job's `completions` as --shards N"))?;
            return Shard { index, count }.check("JOB_COMPLETION_INDEX");
        }
        if let Some(id) = var("SLURM_ARRAY_TASK_ID")? {
            let min = var("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let step = var("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            let count = match shards {
                Some(n) => n,
                None => var("SLURM_ARRAY_TASK_COUNT")?
                    .ok_or_else(|| InputError::new("SLURM_ARRAY_TASK_COUNT", "is not set while SLURM_ARRAY_TASK_ID is: give --shards N"))?,
            };
            let offset = id.checked_sub(min).ok_or_else(|| InputError::new("SLURM_ARRAY_TASK_ID", format!("{id} is below SLURM_ARRAY_TASK_MIN {min}")))?;
            return Shard { index: offset / step, count }.check("SLURM_ARRAY_TASK_ID");
        }
        if let Some(n) = shards {
            return Err(InputError::new(
                "--shards",
                format!("--shards {n} needs JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) or SLURM_ARRAY_TASK_ID in the environment; elsewhere give --shard I/{n}"),
            ));
        }
        Ok(Shard::WHOLE)
    }

    pub fn takes(self, index: u64) -> bool {
        index % self.count == self.index
    }

    /// `shard-I-of-N.jsonl`.
    pub fn file_name(self) -> String {
        format!("shard-{}-of-{}.jsonl", self.index, self.count)
    }
}

/// A plan as read from its file: its rows, and the sha256 of its bytes (the sweep's identity).
pub struct Plan {
    pub rows: Vec<PlanRow>,
    pub id: String,
    pub bytes: Vec<u8>,
    /// Relative inputs are relative to this folder.
    pub dir: PathBuf,
}

impl Plan {
    pub fn read(path: &Path) -> anyhow::Result<Plan> {
        let name = path.display().to_string();
        let text = crate::files::read_text_at_most(path, crate::results::MAX_RESULTS_BYTES, "a sweep plan")?;
        let mut rows = Vec::new();
        for (loc, row) in versioned_lines::<PlanRow>(&name, &text, "sweep plan", "make the plan again with this allocbench")? {
            if row.index != rows.len() as u64 {
                return Err(InputError::new(
                    &loc,
                    format!("plan row index {} where {} was expected: rows must be numbered 0, 1, 2, ... in order", row.index, rows.len()),
                )
                .into());
            }
            // A hand-edited capacity of 0 would reach the simulated device (and panic there).
            crate::units::check_capacity(row.capacity).map_err(|m| InputError::new(&loc, format!("plan row {}: {m}", row.index)))?;
            // An allocator or conf no row could replay is the plan's error, found before any
            // replay (as a failed row it would pass for a run that went wrong on its node).
            let bad = |m: String| InputError::new(&loc, format!("plan row {}: {m}", row.index));
            if sweep_allocator(&row.allocator).map_err(bad)?.takes_conf() {
                AllocatorConfig::parse(&row.conf).map_err(|e| bad(format!("conf '{}': {}", row.conf, e.message)))?;
            } else if !row.conf.is_empty() {
                return Err(bad(format!("conf '{}' for allocator '{}', which takes none", row.conf, row.allocator)).into());
            }
            rows.push(row);
        }
        if rows.is_empty() {
            return Err(InputError::new(&name, "the plan has no rows").into());
        }
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf();
        Ok(Plan { rows, id: sha256_hex(text.as_bytes()), bytes: text.into_bytes(), dir })
    }

    /// Where a row's input is on this node.
    pub fn input_path(&self, row: &PlanRow) -> PathBuf {
        let p = Path::new(&row.input);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }
}

/// Whether a sweep can replay `allocator`: a registered policy that runs on the simulated device
/// (the one check of `sweep plan`'s `--allocators` and of a plan's rows).
fn sweep_allocator(allocator: &str) -> Result<GpuPolicy, String> {
    match GpuPolicy::parse(allocator) {
        Ok(GpuPolicy::Async) => Err(format!("allocator '{allocator}' runs only on a real GPU; a sweep replays on the simulated device")),
        Ok(policy) => Ok(policy),
        Err(e) => Err(e.message),
    }
}

/// What `sweep plan` is asked for.
pub struct PlanRequest<'a> {
    pub inputs: &'a [PathBuf],
    pub allocators: &'a [String],
    /// PYTORCH_CUDA_ALLOC_CONF strings for the pytorch allocator ("" = defaults).
    pub confs: &'a [String],
    pub capacities: &'a [u64],
    /// Where the plan will be written (bundled inputs are recorded relative to its folder).
    pub plan_path: &'a Path,
    /// Copy the inputs into this folder, for a shared filesystem.
    pub bundle: Option<&'a Path>,
    /// A PyTorch snapshot of several GPUs: replay this device's history only (`None`: each
    /// recorded device's, as a workload of its own).
    pub snapshot_device: Option<usize>,
}

/// The rows of a plan: input (× device, for a snapshot of several GPUs) × capacity × allocator ×
/// conf, in that order (inputs as given; the conf only varies for pytorch). Every input is opened
/// first, so a bad one fails before any row.
pub fn make_plan(req: &PlanRequest) -> anyhow::Result<Vec<PlanRow>> {
    if req.capacities.is_empty() {
        return Err(InputError::new("--capacities", "no capacity given").into());
    }
    // Like an input given twice: the same replays twice would be rows no merge can tell apart.
    if let Some((i, &c)) = req.capacities.iter().enumerate().find(|&(i, c)| req.capacities[..i].contains(c)) {
        return Err(InputError::new("--capacities", format!("{} (entry {}) given twice", crate::units::format_bytes(c), i + 1)).into());
    }
    if let Some((i, a)) = req.allocators.iter().enumerate().find(|&(i, a)| req.allocators[..i].contains(a)) {
        return Err(InputError::new("--allocators", format!("'{a}' (entry {}) given twice", i + 1)).into());
    }
    let policies = req.allocators.iter().map(|a| sweep_allocator(a)).collect::<Result<Vec<_>, _>>().map_err(|why| InputError::new("--allocators", why))?;
    let parsed: Vec<AllocatorConfig> = req.confs.iter().map(|c| AllocatorConfig::parse(c)).collect::<Result<_, _>>()?;
    let planned = crate::gpu_run::plan(&policies, &parsed);
    let mut seen = HashSet::new();
    let mut inputs = Vec::new();
    for path in req.inputs {
        let devices: Vec<Option<usize>> = match Source::open_snapshot_device(Some(path), req.snapshot_device)? {
            _ if req.snapshot_device.is_some() => vec![req.snapshot_device],
            Source::Imported(t, _) if t.recorded_devices.len() > 1 => t.recorded_devices.iter().map(|&d| Some(d)).collect(),
            _ => vec![None],
        };
        let canonical = path.canonicalize().map_err(|e| InputError::new(path.display().to_string(), e.to_string()))?;
        if !seen.insert(canonical.clone()) {
            return Err(InputError::new(path.display().to_string(), "given twice").into());
        }
        inputs.push((canonical, sha256_file(path)?, devices));
    }
    let recorded: Vec<String> = match req.bundle {
        Some(dir) => bundle(&inputs, dir, req.plan_path)?,
        None => inputs.iter().map(|(p, _, _)| p.display().to_string()).collect(),
    };
    let mut rows = Vec::new();
    for ((_, sha256, devices), input) in inputs.iter().zip(&recorded) {
        for &snapshot_device in devices {
            for &capacity in req.capacities {
                for p in &planned {
                    rows.push(PlanRow {
                        schema_version: SCHEMA_VERSION,
                        index: rows.len() as u64,
                        input: input.clone(),
                        sha256: sha256.clone(),
                        allocator: p.allocator.name().to_string(),
                        conf: if p.allocator.takes_conf() { p.conf.source.clone() } else { String::new() },
                        capacity,
                        snapshot_device,
                        torch_version: TorchVersion::chosen().map(|v| v.to_string()),
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// Copies the inputs into `dir` (a name taken by another file gets its sha256 prefix) and
/// returns their paths as the plan records them: relative to the plan's folder when `dir` is
/// inside it, else absolute.
fn bundle(inputs: &[(PathBuf, String, Vec<Option<usize>>)], dir: &Path, plan_path: &Path) -> anyhow::Result<Vec<String>> {
    let dir_name = dir.display().to_string();
    std::fs::create_dir_all(dir).map_err(|e| InputError::new(&dir_name, format!("cannot create the bundle folder: {e}")))?;
    let dir = dir.canonicalize().map_err(|e| InputError::new(&dir_name, e.to_string()))?;
    let plan_dir = plan_path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(plan_dir).map_err(|e| InputError::new(plan_dir.display().to_string(), format!("cannot create folder: {e}")))?;
    let plan_dir = plan_dir.canonicalize()?;
    let mut taken: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for (src, sha, _) in inputs {
        let file = src.file_name().and_then(|n| n.to_str()).unwrap_or("input").to_string();
        let holds_other = |name: &str| {
            let dest = dir.join(name);
            taken.get(name).is_some_and(|other| other != sha) || (dest.exists() && sha256_file(&dest).map(|d| &d != sha).unwrap_or(true))
        };
        // A name another input of this plan, or another plan's bundle in the same folder, holds
        // with other contents: this one goes under its hash (never over theirs).
        let name = if holds_other(&file) { format!("{}-{file}", &sha[..12]) } else { file };
        if holds_other(&name) {
            return Err(InputError::new(
                dir.join(&name).display().to_string(),
                "holds other contents under this input's hashed name: give another --bundle folder",
            )
            .into());
        }
        taken.insert(name.clone(), sha.clone());
        let dest = dir.join(&name);
        let same = dest.exists() && sha256_file(&dest).map(|d| &d == sha).unwrap_or(false);
        if !same {
            std::fs::copy(src, &dest).map_err(|e| InputError::new(dest.display().to_string(), format!("cannot copy {}: {e}", src.display())))?;
        }
        out.push(match dest.strip_prefix(&plan_dir) {
            Ok(rel) => rel.display().to_string(),
            Err(_) => dest.display().to_string(),
        });
    }
    Ok(out)
}

/// Writes plan rows as JSON Lines.
pub fn write_plan(out: &mut dyn Write, rows: &[PlanRow]) -> anyhow::Result<()> {
    for r in rows {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    }
    out.flush()?;
    Ok(())
}

/// Reads a shard file's finished rows, checked against the plan. A last line without its newline
/// (a task killed mid-write) is ignored and, with `repair`, cut off so appending can go on.
fn read_shard_file(path: &Path, plan: &Plan, repair: bool) -> anyhow::Result<Vec<SweepRow>> {
    let name = path.display().to_string();
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(InputError::new(&name, format!("cannot read: {e}")).into()),
    };
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if repair && complete < bytes.len() {
        let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| InputError::new(&name, format!("cannot repair the torn last line: {e}")))?;
        f.set_len(complete as u64)?;
    }
    let text = String::from_utf8_lossy(&bytes[..complete]);
    let mut rows = Vec::new();
    for (loc, row) in versioned_lines::<SweepRow>(&name, &text, "sweep row", "run the sweep again with this allocbench into a new --out folder")? {
        if row.plan != plan.id {
            return Err(another_plan(&loc).into());
        }
        if plan.rows.get(row.row.index as usize) != Some(&row.row) {
            return Err(InputError::new(&loc, format!("row {} does not match the plan's row {}", row.row.index, row.row.index)).into());
        }
        rows.push(row);
    }
    Ok(rows)
}

fn another_plan(loc: &str) -> InputError {
    InputError::new(loc, "holds the shards of another plan: give a new --out folder (or remove the old one)")
}

/// The shard files in `dir`, in name order.
fn shard_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| InputError::new(dir.display().to_string(), format!("cannot read the folder: {e}")))?;
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("shard-") && n.contains("-of-") && n.ends_with(".jsonl")))
        .collect();
    out.sort();
    Ok(out)
}

/// Puts the plan into `dir` (atomically: the tasks of an array start together), or checks that
/// the one already there is the same plan.
fn adopt_plan(dir: &Path, plan: &Plan) -> anyhow::Result<()> {
    let dest = dir.join(PLAN_IN_DIR);
    let same = |dest: &Path| -> anyhow::Result<()> {
        let there = std::fs::read(dest).map_err(|e| InputError::new(dest.display().to_string(), format!("cannot read: {e}")))?;
        if sha256_hex(&there) != plan.id {
            return Err(InputError::new(
                dir.display().to_string(),
                format!("holds the shards of another plan ({PLAN_IN_DIR} differs): give a new --out folder (or remove the old one)"),
            )
            .into());
        }
        Ok(())
    };
    if dest.exists() {
        return same(&dest);
    }
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| InputError::new(dir.display().to_string(), format!("cannot write: {e}")))?;
    tmp.write_all(&plan.bytes)?;
    tmp.flush()?;
    // Readable by everyone, like the shard files (a temporary file starts private).
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    match tmp.persist_noclobber(&dest) {
        Ok(_) => Ok(()),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => same(&dest),
        Err(e) => Err(InputError::new(dest.display().to_string(), format!("cannot write: {}", e.error)).into()),
    }
}

/// One input's events, loaded once per shard and shared by the threads replaying its rows.
struct Loaded {
    events: Vec<Event>,
    info: WorkloadInfo,
    addresses: Vec<(u64, u64)>,
}

/// An input of the shard (a file, and the device of a snapshot of several): loaded when a thread
/// first needs it, dropped after its last row.
struct InputSlot {
    path: PathBuf,
    snapshot_device: Option<usize>,
    loaded: Mutex<Option<Result<Arc<Loaded>, String>>>,
    rows_left: AtomicUsize,
}

impl InputSlot {
    fn get(&self) -> Result<Arc<Loaded>, String> {
        let mut slot = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert_with(|| load(&self.path, self.snapshot_device).map(Arc::new).map_err(|e| format!("{e:#}"))).clone()
    }

    fn done_with_row(&self) {
        if self.rows_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.loaded.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
}

fn load(path: &Path, snapshot_device: Option<usize>) -> anyhow::Result<Loaded> {
    let source = Source::open_snapshot_device(Some(path), snapshot_device)?;
    Ok(Loaded { events: crate::diagnose::load_events(&source)?, info: source.info()?, addresses: source.address_script() })
}

/// Replays one plan row; `None` when Ctrl-C cut the replay short (nothing is recorded then).
fn replay_row(row: &PlanRow, loaded: Result<Arc<Loaded>, String>, plan_id: &str) -> Option<SweepRow> {
    let outcome = loaded.and_then(|l| {
        let torch = match &row.torch_version {
            Some(v) => TorchVersion::parse(v).map_err(|e| e.to_string())?,
            None => TorchVersion::selected(),
        };
        let cfg = AllocatorConfig::parse_for(&row.conf, torch).map_err(|e| e.to_string())?;
        let spec = DeviceSpec { addresses: l.addresses.clone(), ..DeviceSpec::sim(row.capacity) };
        let policy = sweep_allocator(&row.allocator)?;
        let mut built = build(policy, &cfg, &spec).map_err(|e| format!("{e:#}"))?;
        let opts = ReplayOptions { on_oom: OnOom::Stop, ..Default::default() };
        run_one(&mut built, &cfg, Box::new(l.events.iter().copied().map(Ok)), l.info.clone(), &opts, &mut StopWhen(crate::interrupt::interrupted))
            .map_err(|e| format!("{e:#}"))
    });
    let (status, error, result) = match outcome {
        Ok(r) if r.summary.interrupted => return None,
        Ok(mut r) => {
            // The headline numbers and stats stay; the per-event detail would make a fleet's
            // sweep gigabytes (`allocbench replay` on the row gives it).
            r.timeline.clear();
            r.segments_at_peak.clear();
            r.segments_at_oom.clear();
            (RowStatus::Ok, None, Some(r))
        }
        Err(e) => (RowStatus::Failed, Some(e), None),
    };
    Some(SweepRow { schema_version: SCHEMA_VERSION, plan: plan_id.to_string(), row: row.clone(), status, error, result })
}

/// What one `sweep run` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSummary {
    pub shard: Shard,
    pub file: PathBuf,
    /// The plan rows this shard takes.
    pub rows: usize,
    /// Already in the shard file (replayed by an earlier run of this shard).
    pub already_done: usize,
    /// Replayed now (failed ones included).
    pub replayed: usize,
    pub failed: usize,
    pub interrupted: bool,
}

/// Replays the rows of `shard` not yet in `DIR/shard-I-of-N.jsonl` on `threads` threads,
/// appending each finished row (flushed). Rows recorded as failed are tried again. `todo` is
/// told how many rows are to be replayed; `each` sees every row as it is written.
pub fn run_shard(
    plan: &Plan,
    dir: &Path,
    shard: Shard,
    threads: usize,
    todo: &mut dyn FnMut(usize),
    each: &mut dyn FnMut(&SweepRow),
) -> anyhow::Result<ShardSummary> {
    let dir_name = dir.display().to_string();
    std::fs::create_dir_all(dir).map_err(|e| InputError::new(&dir_name, format!("cannot create the output folder: {e}")))?;
    let file = dir.join(shard.file_name());
    // The shards already there first, so that a refused run leaves the folder as it was.
    for other in shard_files(dir)?.iter().filter(|p| **p != file) {
        check_first_row(other, plan)?;
    }
    adopt_plan(dir, plan)?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .map_err(|e| InputError::new(file.display().to_string(), format!("cannot open for appending: {e}")))?;
    // One writer per shard file: a task requeued while its old run still writes must not
    // interleave rows with it (the lock goes with the file descriptor when the process ends).
    // SAFETY: flock on a file descriptor this function owns; no memory is involved.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&out), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(InputError::new(file.display().to_string(), "another `sweep run` of this shard is writing it: wait for it to end, or stop it").into());
    }
    let done: HashSet<u64> = read_shard_file(&file, plan, true)?.into_iter().filter(|r| r.status == RowStatus::Ok).map(|r| r.row.index).collect();
    let mine: Vec<&PlanRow> = plan.rows.iter().filter(|r| shard.takes(r.index)).collect();
    let rows: Vec<&PlanRow> = mine.iter().copied().filter(|r| !done.contains(&r.index)).collect();

    // Every input is checked before any replay: a plan whose inputs changed is refused whole.
    let mut slots: BTreeMap<(&str, Option<usize>), InputSlot> = BTreeMap::new();
    for row in &rows {
        if let Some(slot) = slots.get(&(row.input.as_str(), row.snapshot_device)) {
            slot.rows_left.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let path = plan.input_path(row);
        let loaded = if path.exists() {
            let sha = sha256_file(&path)?;
            if sha != row.sha256 {
                return Err(InputError::new(
                    path.display().to_string(),
                    format!("changed since the plan was made (sha256 {sha}, the plan has {}): make the plan again", row.sha256),
                )
                .into());
            }
            None
        } else {
            Some(Err(format!("input missing on this node: {}", path.display())))
        };
        slots.insert(
            (&row.input, row.snapshot_device),
            InputSlot { path, snapshot_device: row.snapshot_device, loaded: Mutex::new(loaded), rows_left: AtomicUsize::new(1) },
        );
    }
    todo(rows.len());

    let mut summary =
        ShardSummary { shard, file: file.clone(), rows: mine.len(), already_done: mine.len() - rows.len(), replayed: 0, failed: 0, interrupted: false };
    let next = AtomicUsize::new(0);
    let (tx, rx) = std::sync::mpsc::channel::<SweepRow>();
    std::thread::scope(|s| -> anyhow::Result<()> {
        for _ in 0..threads.max(1) {
            let tx = tx.clone();
            let (next, rows, slots) = (&next, &rows, &slots);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= rows.len() || crate::interrupt::interrupted() {
                    return;
                }
                let slot = &slots[&(rows[i].input.as_str(), rows[i].snapshot_device)];
                let finished = replay_row(rows[i], slot.get(), &plan.id);
                slot.done_with_row();
                let sent = finished.is_some_and(|r| tx.send(r).is_ok());
                if !sent {
                    return;
                }
            });
        }
        drop(tx);
        // One writer: each row is one whole line, written and flushed as it arrives.
        for row in rx {
            let line = format!("{}\n", serde_json::to_string(&crate::results::ResultRecord::SweepRow(Box::new(row.clone())))?);
            out.write_all(line.as_bytes()).and_then(|_| out.flush()).map_err(|e| InputError::new(file.display().to_string(), format!("cannot write: {e}")))?;
            summary.replayed += 1;
            summary.failed += usize::from(row.status == RowStatus::Failed);
            each(&row);
        }
        Ok(())
    })?;
    summary.interrupted = crate::interrupt::interrupted();
    Ok(summary)
}

/// Refuses a shard file of another plan (its first complete row says which plan it belongs to).
fn check_first_row(path: &Path, plan: &Plan) -> anyhow::Result<()> {
    // The first line only: other shards' files may be large, and every task checks them.
    let f = std::fs::File::open(path).map_err(|e| InputError::new(path.display().to_string(), format!("cannot read: {e}")))?;
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(f), &mut first)?;
    if !first.ends_with('\n') {
        return Ok(()); // empty, or its first row still being written
    }
    let v: serde_json::Value = serde_json::from_str(&first).map_err(|e| InputError::new(format!("{}:1", path.display()), format!("not JSON: {e}")))?;
    if v.get("plan").and_then(|p| p.as_str()) != Some(plan.id.as_str()) {
        return Err(another_plan(&format!("{}:1", path.display())).into());
    }
    Ok(())
}

/// A sweep gathered from its shard files: one row per plan row found, in plan order.
pub struct Merged {
    pub rows: Vec<SweepRow>,
    /// Plan rows no shard file holds.
    pub missing: Vec<PlanRow>,
    /// Rows found more than once (re-runs, a changed shard count) and dropped.
    pub duplicates: usize,
    pub shard_files: usize,
    pub plan_rows: usize,
}

/// The files [`merge`] reads: the plan's copy and the shard files.
pub fn merge_inputs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = vec![dir.join(PLAN_IN_DIR)];
    if dir.is_dir() {
        files.extend(shard_files(dir)?);
    }
    Ok(files)
}

/// Reads `DIR/plan.jsonl` and every `DIR/shard-*-of-*.jsonl`: each plan row once (a replayed row
/// over a failed one, else the first), schema and plan checked.
pub fn merge(dir: &Path) -> anyhow::Result<Merged> {
    let plan_path = dir.join(PLAN_IN_DIR);
    if !plan_path.exists() {
        return Err(InputError::new(plan_path.display().to_string(), "no such file: not a `sweep run` output folder").into());
    }
    let plan = Plan::read(&plan_path)?;
    let files = shard_files(dir)?;
    let mut found: Vec<Option<SweepRow>> = vec![None; plan.rows.len()];
    let mut duplicates = 0;
    for f in &files {
        for row in read_shard_file(f, &plan, false)? {
            let slot = &mut found[row.row.index as usize];
            match slot {
                None => *slot = Some(row),
                Some(kept) => {
                    duplicates += 1;
                    if kept.status == RowStatus::Failed && row.status == RowStatus::Ok {
                        *kept = row;
                    }
                }
            }
        }
    }
    let missing = plan.rows.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(r, _)| r.clone()).collect();
    Ok(Merged { rows: found.into_iter().flatten().collect(), missing, duplicates, shard_files: files.len(), plan_rows: plan.rows.len() })
}

/// `advise`'s ranking of one input on one capacity, from a merged sweep's pytorch rows.
pub struct Advice {
    pub workload: WorkloadInfo,
    pub capacity: u64,
    /// Steps the replays ran (the most any row reached).
    pub steps: u64,
    pub candidates: Vec<Candidate>,
}

/// The confs of every input × capacity in `rows` (first-seen order), as advise candidates.
pub fn advice(rows: &[SweepRow]) -> Vec<Advice> {
    // (input, its sha256, the snapshot's device, capacity) → the candidates replayed on it.
    type Key = (String, String, Option<usize>, u64);
    let mut groups: Vec<(Key, Advice)> = Vec::new();
    for r in rows {
        let Some(result) = r.result.as_ref().filter(|g| g.allocator == GpuPolicy::Pytorch) else { continue };
        let key = (r.row.input.clone(), r.row.sha256.clone(), r.row.snapshot_device, r.row.capacity);
        let mut candidate = Candidate::from_run(result);
        candidate.conflicts = crate::gpu::config::AllocatorConfig::parse(&result.conf).map(|c| c.conflicts()).unwrap_or_default();
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, a)) => {
                a.steps = a.steps.max(result.summary.last_step);
                a.candidates.push(candidate)
            }
            None => groups.push((
                key,
                Advice { workload: result.workload.clone(), capacity: r.row.capacity, steps: result.summary.last_step, candidates: vec![candidate] },
            )),
        }
    }
    groups.into_iter().map(|(_, a)| a).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn shard_comes_from_the_flag_then_kubernetes_then_slurm() {
        let none = env(&[]);
        assert_eq!(Shard::resolve(None, None, &none).unwrap(), Shard::WHOLE);
        assert_eq!(Shard::resolve(Some(Shard { index: 2, count: 3 }), None, &none).unwrap(), Shard { index: 2, count: 3 });
        let k8s = env(&[("JOB_COMPLETION_INDEX", "3")]);
        assert_eq!(Shard::resolve(None, Some(4), &k8s).unwrap(), Shard { index: 3, count: 4 });
        assert!(Shard::resolve(None, None, &k8s).unwrap_err().message.contains("--shards"));
        assert!(Shard::resolve(None, Some(3), &k8s).unwrap_err().message.contains("out of range"));
        let slurm = env(&[("SLURM_ARRAY_TASK_ID", "7"), ("SLURM_ARRAY_TASK_MIN", "5"), ("SLURM_ARRAY_TASK_COUNT", "4")]);
        assert_eq!(Shard::resolve(None, None, &slurm).unwrap(), Shard { index: 2, count: 4 });
        let stepped = env(&[("SLURM_ARRAY_TASK_ID", "6"), ("SLURM_ARRAY_TASK_STEP", "2"), ("SLURM_ARRAY_TASK_COUNT", "4")]);
        assert_eq!(Shard::resolve(None, None, &stepped).unwrap(), Shard { index: 3, count: 4 });
        let no_count = env(&[("SLURM_ARRAY_TASK_ID", "1")]);
        assert_eq!(Shard::resolve(None, None, &no_count).unwrap_err().location, "SLURM_ARRAY_TASK_COUNT");
        assert_eq!(Shard::resolve(None, Some(2), &no_count).unwrap(), Shard { index: 1, count: 2 });
        let beyond = env(&[("SLURM_ARRAY_TASK_ID", "4"), ("SLURM_ARRAY_TASK_COUNT", "4")]);
        assert!(Shard::resolve(None, None, &beyond).unwrap_err().message.contains("out of range"));
        assert!(Shard::resolve(None, Some(2), &none).is_err());
        assert!(Shard::resolve(None, None, &env(&[("SLURM_ARRAY_TASK_ID", "x")])).is_err());
    }

    #[test]
    fn shard_flag_parses_and_refuses_out_of_range() {
        assert_eq!(Shard::parse("1/4").unwrap(), Shard { index: 1, count: 4 });
        assert!(Shard::parse("4/4").unwrap_err().contains("out of range"));
        assert!(Shard::parse("0/0").is_err());
        assert!(Shard::parse("1").is_err());
        assert!(Shard::parse("a/b").is_err());
        let s = Shard { index: 1, count: 4 };
        assert_eq!(s.file_name(), "shard-1-of-4.jsonl");
        assert_eq!((0..12).filter(|&i| s.takes(i)).collect::<Vec<_>>(), vec![1, 5, 9]);
    }
}
