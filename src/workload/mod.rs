//! Workload definitions (`workloads/*.toml`) and their seeded, streaming generators.
//!
//! Families: `transformer` (training steps), `model_switch`, `serving`, `scenario` (explicit
//! event lists) and `python_objects` (the CPU literature's Python-like mix). Every generator is
//! deterministic for a given `seed` and yields events lazily: memory is bounded by one phase
//! (a training step, a model load), never by the workload's length.

pub mod fsdp;
pub mod inference;
pub mod model;
pub mod model_switch;
pub mod python_objects;
pub mod scenario;
pub mod serving;
pub mod spec;
pub mod transformer;

use std::path::Path;

use rustc_hash::FxHashSet;

use crate::error::InputError;
use crate::event::Event;
pub use spec::WorkloadFile;
use spec::{toml_error, Attention, ScenarioEvent, Validator};

/// A parsed and validated workload, with the text it came from (hashed into results).
#[derive(Debug, Clone)]
pub struct Workload {
    pub file: WorkloadFile,
    pub source: String,
    pub origin: String,
}

impl Workload {
    pub fn load(path: &Path) -> Result<Self, InputError> {
        let source = spec::read_source(path)?;
        Self::parse(&source, &path.display().to_string())
    }

    pub fn parse(source: &str, origin: &str) -> Result<Self, InputError> {
        let file: WorkloadFile = toml::from_str(source).map_err(|e| toml_error(origin, source, &e))?;
        let w = Workload { file, source: source.to_string(), origin: origin.to_string() };
        w.validate()?;
        Ok(w)
    }

    pub fn kind(&self) -> &'static str {
        let f = &self.file;
        if f.transformer.is_some() {
            "transformer"
        } else if f.model_switch.is_some() {
            "model_switch"
        } else if f.serving.is_some() {
            "serving"
        } else if f.python_objects.is_some() {
            "python_objects"
        } else {
            "scenario"
        }
    }

    fn validate(&self) -> Result<(), InputError> {
        let v = Validator { file: &self.origin, source: &self.source };
        let f = &self.file;
        let present = [f.transformer.is_some(), f.model_switch.is_some(), f.serving.is_some(), f.scenario.is_some(), f.python_objects.is_some()]
            .iter()
            .filter(|&&p| p)
            .count();
        if present != 1 {
            return Err(InputError::new(
                &self.origin,
                format!("expected exactly one of the tables [transformer], [model_switch], [serving], [scenario], [python_objects]; found {present}"),
            ));
        }
        if let Some(t) = &f.transformer {
            v.model("transformer.model", &t.model)?;
            v.positive("transformer.steps", t.steps, 100_000_000)?;
            v.positive("transformer.batch", t.batch, 1 << 20)?;
            v.length("transformer.seq_len", &t.seq_len)?;
            v.positions("transformer.model.max_positions", &t.model, t.seq_len.max_value())?;
            if let Some(ddp) = &t.ddp {
                if !(ddp.bucket_cap_mb.is_finite() && ddp.bucket_cap_mb > 0.0 && ddp.bucket_cap_mb <= 1e6) {
                    return Err(v.fail("transformer.ddp.bucket_cap_mb", format!("{} is not a bucket size: MiB in (0, 1e6]", ddp.bucket_cap_mb)));
                }
            }
            if let Some(fsdp) = &t.fsdp {
                v.positive("transformer.fsdp.world_size", fsdp.world_size, 1 << 20)?;
                if t.ddp.is_some() {
                    return Err(
                        v.fail("transformer.fsdp", "FSDP and DDP together (HSDP) are not modelled: keep one of [transformer.fsdp] and [transformer.ddp]")
                    );
                }
                if t.model.lora_rank > 0 {
                    return Err(v.fail("transformer.fsdp", "FSDP over LoRA adapters (frozen sharded base weights) is not modelled"));
                }
                if t.master_weights || t.grad_dtype.is_some() {
                    return Err(v.fail(
                        "transformer.fsdp",
                        "under FSDP the sharded parameters (param_dtype) are the master weights and gradients are gathered in activation_dtype: leave out master_weights and grad_dtype (reduce_dtype sets the reduce-scatter's)",
                    ));
                }
            }
            if !(0.0..1.0).contains(&t.attention_dropout) {
                return Err(v.fail("transformer.attention_dropout", "must be in [0, 1)"));
            }
            let s = t.seq_len.max_value() as u128;
            let b = t.batch as u128;
            let m = &t.model;
            v.size("transformer.batch", b * s * m.vocab as u128 * 4)?;
            if t.attention == Attention::Math {
                v.size("transformer.seq_len", b * m.heads as u128 * s * s * 4)?;
            }
            v.size("transformer.batch", b * s * m.ffn as u128 * 4)?;
        }
        if let Some(ms) = &f.model_switch {
            if ms.models.is_empty() {
                return Err(v.fail("model_switch.models", "needs at least one model"));
            }
            let residencies = ms.residencies.as_deref().unwrap_or_default();
            if ms.residencies.as_ref().is_some_and(|r| r.is_empty()) {
                return Err(v.fail("model_switch.residencies", "lists no residencies: leave it out for the seeded schedule"));
            }
            for (i, m) in ms.models.iter().enumerate() {
                v.model(&format!("model_switch.models[{i}]"), m)?;
                let listed = residencies.iter().flat_map(|r| r.seq_lens.iter().copied()).max().unwrap_or(0);
                // The seeded schedule draws from seq_len; a listed one uses its own lengths.
                let longest = if residencies.is_empty() {
                    ms.seq_len.max_value()
                } else {
                    residencies.iter().filter(|r| r.model == i).flat_map(|r| r.seq_lens.iter().copied()).max().unwrap_or(0)
                };
                v.positions(&format!("model_switch.models[{i}].max_positions"), m, longest)?;
                let s = ms.seq_len.max_value().max(listed) as u128;
                v.size("model_switch.batch", ms.batch as u128 * s * m.vocab as u128 * 4)?;
                v.size("model_switch.seq_len", ms.batch as u128 * m.heads as u128 * s * s * 4)?;
            }
            v.positive("model_switch.switches", ms.switches, 100_000_000)?;
            v.positive("model_switch.steps_per_model", ms.steps_per_model, 100_000_000)?;
            v.positive("model_switch.batch", ms.batch, 1 << 20)?;
            v.length("model_switch.seq_len", &ms.seq_len)?;
            if !residencies.is_empty() && residencies.len() as u64 != ms.switches {
                return Err(v.fail("model_switch.residencies", format!("lists {} residencies but switches = {}", residencies.len(), ms.switches)));
            }
            for (i, r) in residencies.iter().enumerate() {
                if r.model >= ms.models.len() {
                    return Err(
                        v.fail("model_switch.residencies", format!("residency {i}: model = {} is not an index into the {} models", r.model, ms.models.len()))
                    );
                }
                if r.seq_lens.len() as u64 != ms.steps_per_model || r.seq_lens.iter().any(|&s| s == 0 || s > 1 << 24) {
                    return Err(v.fail(
                        "model_switch.residencies",
                        format!("residency {i}: needs steps_per_model = {} sequence lengths in 1..=2^24", ms.steps_per_model),
                    ));
                }
            }
        }
        if let Some(s) = &f.serving {
            v.model("serving.model", &s.model)?;
            v.positive("serving.steps", s.steps, 100_000_000)?;
            v.positive("serving.max_batch", s.max_batch, 1 << 16)?;
            v.positive("serving.page_tokens", s.page_tokens, 1 << 16)?;
            v.length("serving.prompt_len", &s.prompt_len)?;
            v.length("serving.output_len", &s.output_len)?;
            for (name, rate) in [("serving.calm_rate", s.calm_rate), ("serving.burst_rate", s.burst_rate)] {
                if !(rate.is_finite() && (0.0..=10_000.0).contains(&rate)) {
                    return Err(v.fail(name, "must be a rate in [0, 10000] arrivals per step"));
                }
            }
            for (name, len) in [("serving.mean_calm_steps", s.mean_calm_steps), ("serving.mean_burst_steps", s.mean_burst_steps)] {
                if !(len.is_finite() && len >= 1.0) {
                    return Err(v.fail(name, "must be ≥ 1 step"));
                }
            }
            if s.model.ffn_kind != spec::FfnKind::Swiglu {
                return Err(v.fail("serving.model.ffn_kind", "the serving generator follows llama.py (RMSNorm, rotary, SwiGLU): use ffn_kind = \"swiglu\""));
            }
            if let Some(a) = s.arrivals.iter().find(|a| a[0] == 0 || a[0] > s.steps || a[1] == 0 || a[1] > 1 << 20 || a[2] == 0 || a[2] > 1 << 20) {
                return Err(v.fail("serving.arrivals", format!("{a:?}: each is [step 1..=steps, prompt 1..=2^20 tokens, output 1..=2^20 tokens]")));
            }
            let max_tokens = (s.prompt_len.max_value() + s.output_len.max_value()) as u128;
            v.size("serving.max_batch", max_tokens * s.model.d_model as u128 * 4)?;
        }
        if let Some(p) = &f.python_objects {
            if p.sizes.is_empty() {
                return Err(v.fail("python_objects.sizes", "needs at least one size"));
            }
            for b in &p.sizes {
                v.positive("python_objects.sizes", b.0, crate::units::MAX_SANE_BYTES)?;
            }
            v.positive("python_objects.iterations", p.iterations, 1_000_000_000)?;
            v.positive("python_objects.per_iteration", p.per_iteration, 1 << 24)?;
            if p.keep > p.per_iteration {
                return Err(v.fail("python_objects.keep", format!("keeps {} of the {} objects an iteration makes", p.keep, p.per_iteration)));
            }
            if p.trim_to > p.trim_above {
                return Err(v.fail("python_objects.trim_to", "must be ≤ trim_above"));
            }
        }
        if let Some(sc) = &f.scenario {
            let mut live = FxHashSet::default();
            let mut last_step: Option<u64> = None;
            for (i, ev) in sc.events.iter().enumerate() {
                match ev {
                    ScenarioEvent::Alloc { id, bytes, .. } => {
                        // The rules of a CSV trace's alloc row.
                        crate::units::check_request_bytes(bytes.0).map_err(|m| InputError::new(&self.origin, format!("scenario.events[{i}]: {m}")))?;
                        if !live.insert(*id) {
                            return Err(InputError::new(&self.origin, format!("scenario.events[{i}]: alloc of id {id}, which is still live")));
                        }
                    }
                    ScenarioEvent::Free { id } if !live.remove(id) => {
                        return Err(InputError::new(&self.origin, format!("scenario.events[{i}]: free of id {id}, which is not live")));
                    }
                    ScenarioEvent::Step { n } => {
                        crate::event::check_step_order(last_step, *n).map_err(|m| InputError::new(&self.origin, format!("scenario.events[{i}]: {m}")))?;
                        last_step = Some(*n);
                    }
                    _ => {}
                }
            }
        }
        if let Some(b) = f.sized_for {
            v.positive("sized_for", b.0, crate::units::MAX_SANE_BYTES)?;
        }
        Ok(())
    }

    /// The math the device does over the whole run, as `torch.utils.flop_counter` counts it, for
    /// the families that model it (transformer training); `None` for the others.
    pub fn flops(&self) -> Option<f64> {
        let t = self.file.transformer.as_ref()?;
        let mut generator = transformer::TransformerGen::new(t, self.file.seed);
        generator.by_ref().for_each(drop);
        Some(generator.flops()).filter(|&f| f > 0.0)
    }

    /// NCCL's buffers for one rank of a sharded workload (`[transformer.fsdp]`: one
    /// communicator over its `world_size` ranks, NCCL's defaults); `None` for one process.
    pub fn nccl_budget(&self) -> Option<crate::results::NcclBudget> {
        let fsdp = self.file.transformer.as_ref()?.fsdp.as_ref()?;
        (fsdp.world_size > 1).then(|| crate::results::NcclBudget::with_defaults(vec![(fsdp.world_size.min(u32::MAX as u64) as u32, 0)]))
    }

    /// The workload's events, generated lazily.
    pub fn events(&self) -> Box<dyn Iterator<Item = Event> + '_> {
        let f = &self.file;
        let seed = f.seed;
        if let Some(t) = &f.transformer {
            Box::new(transformer::TransformerGen::new(t, seed))
        } else if let Some(m) = &f.model_switch {
            Box::new(model_switch::ModelSwitchGen::new(m, seed))
        } else if let Some(s) = &f.serving {
            Box::new(serving::ServingGen::new(s, seed))
        } else if let Some(p) = &f.python_objects {
            Box::new(python_objects::PythonObjectsGen::new(p, seed))
        } else {
            Box::new(scenario::events(f.scenario.as_ref().expect("validated: one family present")))
        }
    }
}
