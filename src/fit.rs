//! `allocbench fit`: the largest value of a script argument (a batch size, a sequence length)
//! whose run fits a card, with PyTorch's defaults and with the configuration `advise` picks. Each
//! value tried is a short capture (`--steps`, fake CUDA) replayed on the card with what lives
//! outside the allocator withheld; the search is a bisection that assumes a larger value never
//! needs less memory, and says so when a value tried contradicts it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::capture::CaptureOptions;
use crate::error::InputError;
use crate::gpu::card::Outside;
use crate::gpu::config::AllocatorConfig;
use crate::input::Source;
use crate::results::{Objective, OnOom, SCHEMA_VERSION};

/// `--param NAME=LO..HI`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitParam {
    pub name: String,
    pub lo: u64,
    pub hi: u64,
}

impl std::str::FromStr for FitParam {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("'{s}': write NAME=LO..HI, e.g. batch=1..64");
        let (name, range) = s.split_once('=').ok_or_else(usage)?;
        let (lo, hi) = range.split_once("..").ok_or_else(usage)?;
        let name = name.trim();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("'{name}': a parameter name is letters, digits, '_' or '-' (it is written {{{name}}} in the script's arguments)"));
        }
        let number = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("'{}' in {s}: not a whole number", t.trim()));
        let (lo, hi) = (number(lo)?, number(hi)?);
        if lo > hi {
            return Err(format!("{s}: the range is empty ({lo} > {hi})"));
        }
        Ok(FitParam { name: name.to_string(), lo, hi })
    }
}

/// How `fit` searches.
pub struct FitOptions {
    pub param: FitParam,
    /// The capture of one value: its `args` hold `{NAME}` where the value goes.
    pub capture: CaptureOptions,
    pub capacity: u64,
    pub outside: Outside,
    pub objective: Objective,
    pub threads: usize,
    /// Keep each value's trace here (`NAME-VALUE.csv`, or a sharded job's `NAME-VALUE/`); else
    /// they go with a temporary folder.
    pub keep: Option<PathBuf>,
    /// A sharded job (`--nproc-per-node`): each value captures its ranks (driver backend); the
    /// value fits when every rank does, and the worst rank's numbers are the row's.
    pub job: Option<crate::capture::RankJob>,
    /// Add each rank's NCCL buffers, from its capture's communicators (no `--nccl` given).
    pub nccl_from_capture: bool,
}

/// One value tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tried {
    pub value: u64,
    /// Whether the run fits with PyTorch's defaults.
    pub fits: bool,
    /// `reserved_bytes.all.peak` with the defaults (up to the OOM when it does not fit).
    pub peak_reserved: u64,
    /// The device total then: peak reserved + what lives outside the allocator.
    pub device_total: u64,
    /// The step of the defaults' OOM.
    pub oom_step: Option<u64>,
    /// The live bytes' peak: what no allocator setting can go below.
    pub peak_live: u64,
    /// Steps captured.
    pub steps: u64,
    /// A sharded job's rank whose numbers these are (the first to OOM, else the most on the
    /// card), and the ranks its trace stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The configuration `advise` picks for this value (advised on that rank, checked on every
    /// rank), whether it fits and its peak reserved (`None` where the advice was not needed: the
    /// defaults fit, or a smaller value failed).
    pub advised_conf: Option<String>,
    pub fits_advised: Option<bool>,
    pub peak_reserved_advised: Option<u64>,
}

/// What `fit` found (its `--json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FitResult {
    pub schema_version: u32,
    pub param: String,
    pub lo: u64,
    pub hi: u64,
    pub script: String,
    /// The card's memory and name (when it is one of the table's).
    pub capacity: u64,
    pub card: Option<String>,
    pub outside: Outside,
    pub steps: Option<u64>,
    /// The largest value that fits with PyTorch's defaults, and with the advised configuration.
    pub largest_defaults: Option<u64>,
    pub largest_advised: Option<u64>,
    /// The advised configuration at `largest_advised`.
    pub advised_conf: Option<String>,
    /// Every value tried, in increasing order.
    pub tried: Vec<Tried>,
    /// Values where a larger one fitted and a smaller did not (the search assumes none).
    pub non_monotonic: Vec<u64>,
    /// The range's top fits (with the advice, if not with the defaults): a larger value may fit
    /// too; the search did not look past HI.
    pub top_of_range_fits: bool,
    /// A sharded job's ranks (`--nproc-per-node` × `--nnodes`): each row is its worst rank's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

/// The placeholder of `param` in the script's arguments.
pub fn placeholder(param: &FitParam) -> String {
    format!("{{{}}}", param.name)
}

/// Runs the search; `tried` is told of each value as it is settled (the command's progress).
pub fn fit(o: &FitOptions, tried: &mut dyn FnMut(&Tried)) -> anyhow::Result<FitResult> {
    let mark = placeholder(&o.param);
    if !o.capture.args.iter().any(|a| a.to_string_lossy().contains(&mark)) {
        return Err(InputError::new(
            "--param",
            format!("the script's arguments hold no {mark}: write it where the value goes, e.g. -- train.py --batch-size {mark}"),
        )
        .into());
    }
    let work = tempfile::Builder::new().prefix("allocbench-fit-").tempdir()?;
    let folder = o.keep.clone().unwrap_or_else(|| work.path().to_path_buf());
    std::fs::create_dir_all(&folder).map_err(|e| InputError::new(folder.display().to_string(), format!("cannot create it: {e}")))?;
    let mut search = Search { o, folder: &folder, tried: Vec::new(), told: tried, ranks: Default::default() };
    let defaults = AllocatorConfig::parse("")?;
    // The largest value that fits with the defaults: LO first (nothing fits if it does not).
    let largest_defaults = search.largest(o.param.lo, o.param.hi, &mut |s, v| Ok(s.at(v, &defaults)?.fits))?;
    // The advice never does worse than the defaults, so its search starts where theirs ended.
    let from = largest_defaults.map_or(o.param.lo, |v| v + 1);
    let largest_advised = if from > o.param.hi { largest_defaults } else { search.largest(from, o.param.hi, &mut |s, v| s.advised(v))?.or(largest_defaults) };
    let advised_conf = match largest_advised {
        Some(v) => Some(search.advice_at(v)?),
        None => None,
    };
    let mut tried = search.tried;
    tried.sort_by_key(|t| t.value);
    let non_monotonic = tried.windows(2).filter(|w| !w[0].fits && w[1].fits).map(|w| w[0].value).collect();
    Ok(FitResult {
        schema_version: SCHEMA_VERSION,
        param: o.param.name.clone(),
        lo: o.param.lo,
        hi: o.param.hi,
        script: std::iter::once(o.capture.script.display().to_string())
            .chain(o.capture.args.iter().map(|a| a.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(" "),
        capacity: o.capacity,
        card: crate::gpu::card::with_memory(o.capacity).map(|c| c.name.to_string()),
        outside: o.outside,
        steps: o.capture.steps,
        largest_defaults,
        largest_advised,
        advised_conf,
        tried,
        non_monotonic,
        top_of_range_fits: largest_advised == Some(o.param.hi),
        world_size: o.job.as_ref().map(|j| j.world()),
    })
}

struct Search<'a> {
    o: &'a FitOptions,
    folder: &'a Path,
    tried: Vec<Tried>,
    told: &'a mut dyn FnMut(&Tried),
    /// A sharded job's value -> its ranks' traces with what each holds outside the allocator,
    /// the worst first.
    ranks: std::collections::HashMap<u64, Vec<(PathBuf, Outside)>>,
}

impl Search<'_> {
    /// The largest value in `lo..=hi` for which `fits` holds, by bisection (`None`: not even `lo`).
    fn largest(&mut self, lo: u64, hi: u64, fits: &mut dyn FnMut(&mut Self, u64) -> anyhow::Result<bool>) -> anyhow::Result<Option<u64>> {
        if !fits(self, lo)? {
            return Ok(None);
        }
        // The top next: when it fits, it is the answer (and the output says the range's top fit).
        if hi == lo || fits(self, hi)? {
            return Ok(Some(hi));
        }
        let (mut good, mut bad) = (lo, hi); // fits at `good`, not at `bad`
        while bad - good > 1 {
            let mid = good + (bad - good) / 2;
            if fits(self, mid)? {
                good = mid;
            } else {
                bad = mid;
            }
        }
        Ok(Some(good))
    }

    /// The value's row, capturing and replaying it with the defaults the first time.
    fn at(&mut self, value: u64, defaults: &AllocatorConfig) -> anyhow::Result<Tried> {
        if let Some(t) = self.tried.iter().find(|t| t.value == value) {
            return Ok(t.clone());
        }
        let traces = self.capture(value)?;
        // Each rank replayed; the first to OOM (the earliest step), else the most on the card, is the row.
        let mut rows = Vec::new();
        for (rank, path, outside) in &traces {
            let events = crate::diagnose::load_events(&Source::open(Some(path))?)?;
            let withheld = outside.total();
            let (out, _) = crate::gpu_run::replay_sim(&events, &[], defaults, self.o.capacity, withheld, OnOom::Stop)?;
            let t = Tried {
                value,
                fits: out.oom.is_none(),
                peak_reserved: out.peak_reserved,
                device_total: out.peak_reserved + withheld,
                oom_step: out.oom.as_ref().map(|o| o.step),
                peak_live: crate::event::peak_live_bytes(events.iter().copied().map(Ok), |b| b)?,
                steps: crate::event::step_count(&events),
                rank: *rank,
                advised_conf: None,
                fits_advised: None,
                peak_reserved_advised: None,
            };
            rows.push((t, path.clone(), *outside, out.oom.map(|o| o.event)));
        }
        rows.sort_by_key(|(t, _, _, event)| crate::trace::ranks::worst_first(t.oom_step.zip(*event), t.device_total));
        let t = rows[0].0.clone();
        self.ranks.insert(value, rows.into_iter().map(|(_, path, outside, _)| (path, outside)).collect());
        (self.told)(&t);
        self.tried.push(t.clone());
        Ok(t)
    }

    /// Whether the value fits with the configuration `advise` picks for it.
    fn advised(&mut self, value: u64) -> anyhow::Result<bool> {
        let defaults = AllocatorConfig::parse("")?;
        let row = self.at(value, &defaults)?;
        if row.fits_advised.is_none() {
            self.advise(value)?;
        }
        Ok(self.tried.iter().find(|t| t.value == value).and_then(|t| t.fits_advised).unwrap_or(false))
    }

    /// The advised configuration at a value (the defaults, "", where they fit and nothing was advised).
    fn advice_at(&mut self, value: u64) -> anyhow::Result<String> {
        let row = self.tried.iter().find(|t| t.value == value).cloned();
        match row {
            Some(t) if t.advised_conf.is_some() => Ok(t.advised_conf.unwrap_or_default()),
            _ => {
                self.advise(value)?;
                Ok(self.tried.iter().find(|t| t.value == value).and_then(|t| t.advised_conf.clone()).unwrap_or_default())
            }
        }
    }

    fn advise(&mut self, value: u64) -> anyhow::Result<()> {
        let traces = self.ranks.get(&value).cloned().unwrap_or_default();
        let Some((worst, outside)) = traces.first().cloned() else { return Ok(()) };
        let source = Source::open(Some(&worst))?;
        let events = crate::diagnose::load_events(&source)?;
        let opts = crate::advise::AdviseOptions {
            capacity: self.o.capacity,
            threads: self.o.threads,
            objective: self.o.objective,
            model: crate::gpu::devprobe::LatencyModel::h100(),
            addresses: Vec::new(),
            outside,
            not_whole_run: None,
            step_time_s: None,
            flops: source.flops(),
        };
        let result = crate::advise::advise(&events, &source.info()?, &crate::advise::search_space(), &opts, None)?;
        let best = result.recommended.ok_or_else(|| crate::interrupt::Interrupted("while advising: nothing replayed".into()))?;
        // A sharded job fits with the pick only where every rank does.
        let mut fits = !best.oom;
        if fits && traces.len() > 1 {
            let conf = AllocatorConfig::parse(&best.conf)?;
            for (path, outside) in &traces[1..] {
                let events = crate::diagnose::load_events(&Source::open(Some(path))?)?;
                let (out, _) = crate::gpu_run::replay_sim(&events, &[], &conf, self.o.capacity, outside.total(), OnOom::Stop)?;
                fits &= out.oom.is_none();
            }
        }
        if let Some(t) = self.tried.iter_mut().find(|t| t.value == value) {
            t.advised_conf = Some(best.conf.clone());
            t.fits_advised = Some(fits);
            t.peak_reserved_advised = Some(best.peak_reserved);
            (self.told)(t);
        }
        Ok(())
    }

    fn trace(&self, value: u64) -> PathBuf {
        let name = format!("{}-{value}", self.o.param.name);
        self.folder.join(if self.o.job.is_some() { name } else { name + ".csv" })
    }

    /// Captures the script with the value in its arguments: its trace (a sharded job: each
    /// rank's, with its rank) and what each holds outside the allocator; a capture that does not
    /// complete stops the search (its message names the value).
    fn capture(&mut self, value: u64) -> anyhow::Result<Vec<(Option<u32>, PathBuf, Outside)>> {
        let mark = placeholder(&self.o.param);
        let mut opts = self.o.capture.clone();
        opts.output = self.trace(value);
        opts.args = opts.args.iter().map(|a| a.to_string_lossy().replace(&mark, &value.to_string()).into()).collect();
        let Some(job) = &self.o.job else {
            // The script's own output (a config dump per value) goes to a log beside the trace.
            let log = self.trace(value).with_extension("log");
            opts.script_output = Some(log.clone());
            let outcome = crate::capture::run(&opts)?;
            self.check(value, &outcome, &log, &opts.output)?;
            return Ok(vec![(None, opts.output, self.o.outside)]);
        };
        let dir = self.trace(value);
        let mut failed: Option<anyhow::Error> = None;
        let mut run = |one: &CaptureOptions| {
            let mut one = one.clone();
            let log = one.output.with_extension("log");
            one.script_output = Some(log.clone());
            let outcome = match crate::capture::run(&one) {
                Ok(o) => o,
                Err(e) => {
                    failed.get_or_insert(e);
                    return (1, None);
                }
            };
            if let Err(e) = self.check(value, &outcome, &log, &one.output) {
                failed.get_or_insert(e);
            }
            (outcome.exit_code, Some(outcome))
        };
        crate::capture::capture_ranks(&opts, job, &dir, &mut run, &mut |_| {})?;
        if let Some(e) = failed {
            return Err(e);
        }
        let mut traces = Vec::new();
        for t in crate::trace::ranks::read_folder(&dir)? {
            let mut outside = self.o.outside;
            if self.o.nccl_from_capture {
                outside.nccl = Source::open(Some(&t.path))?.nccl_budget().map_or(0, |b| b.bytes());
            }
            traces.push((Some(t.rank), t.path, outside));
        }
        Ok(traces)
    }

    /// A capture that did not complete stops the search, naming the value (and the rank).
    fn check(&self, value: u64, outcome: &crate::capture::CaptureOutcome, log: &Path, trace: &Path) -> anyhow::Result<()> {
        if outcome.complete() {
            return Ok(());
        }
        let what = if outcome.state == "setup_error" { "could not start".to_string() } else { format!("did not complete: {}", outcome.message) };
        let kept = if self.o.keep.is_some() {
            format!(" (the script's output: {}; the trace so far: {})", log.display(), trace.display())
        } else {
            let last = std::fs::read_to_string(log).ok().and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string));
            last.map(|l| format!(" (the script's last line: {}; --keep DIR keeps its output)", l.trim())).unwrap_or_default()
        };
        let rank = self.o.job.as_ref().map(|_| format!(" (rank of {})", trace.display())).unwrap_or_default();
        Err(InputError::new(format!("{}={value}{rank}", self.o.param.name), format!("the capture {what}{kept}")).into())
    }
}

/// The search for people: one row per value tried, then the answer.
pub fn describe(r: &FitResult) -> String {
    use crate::units::format_bytes;
    let card = crate::gpu::card::in_sentence(r.capacity);
    let ranks = r.world_size.map(|n| format!(" of its {n} ranks (each row the worst rank's; its NCCL buffers outside the allocator too)")).unwrap_or_default();
    let mut s = format!("{}={}..{} on {card}{}, each value a capture{ranks} of {}:\n", r.param, r.lo, r.hi, r.outside.of_the_card(), r.script);
    s += &format!(
        "{:>8} {:>10} {:>12} {:>12} {:>8}  {:>12} {:>8}  advised conf\n",
        r.param, "peak live", "peak rsvd", "device total", "fits", "advised rsvd", "fits"
    );
    for t in &r.tried {
        s += &format!(
            "{:>8} {:>10} {:>12} {:>12} {:>8}  {:>12} {:>8}  {}\n",
            t.value,
            format_bytes(t.peak_live),
            format_bytes(t.peak_reserved),
            format_bytes(t.device_total),
            if t.fits { "yes".to_string() } else { format!("OOM@{}", t.oom_step.unwrap_or(0)) },
            t.peak_reserved_advised.map(format_bytes).unwrap_or_else(|| "-".into()),
            t.fits_advised.map(|f| if f { "yes" } else { "no" }).unwrap_or("-"),
            match &t.advised_conf {
                Some(c) if c.is_empty() => "(defaults)".to_string(),
                Some(c) => c.clone(),
                None => "-".into(),
            }
        );
    }
    if r.tried.iter().any(|t| !t.fits) {
        s += "(a row that does not fit shows peak reserved up to its OOM; peak live is the whole capture's)\n";
    }
    s += "\n";
    if r.top_of_range_fits {
        s += &format!(
            "{}={} fits{}: the top of the range, so a larger value may fit too; widen --param {}={}..N to find the largest.\n",
            r.param,
            r.hi,
            if r.largest_defaults == Some(r.hi) { " with PyTorch's defaults" } else { " with the advised configuration" },
            r.param,
            r.lo
        );
        if let Some(c) = r.advised_conf.as_ref().filter(|c| !c.is_empty() && r.largest_defaults != Some(r.hi)) {
            s += &format!("\nexport PYTORCH_CUDA_ALLOC_CONF='{c}'\n");
        }
        return s;
    }
    match r.largest_defaults {
        Some(v) => s += &format!("Largest {} that fits with PyTorch's defaults: {v}.\n", r.param),
        None => s += &format!("No {} from {} fits with PyTorch's defaults.\n", r.param, r.lo),
    }
    match (r.largest_advised, &r.advised_conf) {
        (Some(v), Some(c)) if Some(v) != r.largest_defaults && !c.is_empty() => {
            s += &format!("Largest with the advised configuration: {v}, with\n\nexport PYTORCH_CUDA_ALLOC_CONF='{c}'\n");
        }
        (Some(_), _) => s += "No allocator setting lets a larger value fit.\n",
        (None, _) => s += &format!("No allocator setting makes {}={} fit: a larger card, or less per step.\n", r.param, r.lo),
    }
    if !r.non_monotonic.is_empty() {
        s += &format!(
            "note: a larger {} fitted where a smaller did not (at {:?}): the bisection assumes memory grows with the value; check the values between.\n",
            r.param, r.non_monotonic
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_parse_and_bad_ones_say_the_form() {
        assert_eq!("batch=1..64".parse::<FitParam>().unwrap(), FitParam { name: "batch".into(), lo: 1, hi: 64 });
        assert_eq!("seq_len = 128..4096".parse::<FitParam>().unwrap().hi, 4096);
        for (bad, says) in
            [("batch", "NAME=LO..HI"), ("batch=1-64", "NAME=LO..HI"), ("b=8..4", "empty"), ("b=x..4", "not a whole number"), ("b c=1..2", "letters")]
        {
            let err = bad.parse::<FitParam>().unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
