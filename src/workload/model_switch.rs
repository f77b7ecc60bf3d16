//! Several models served from one GPU in turn, as `scripts/models/switch.py` runs them in eager
//! PyTorch, op by op: each residency builds a model (gpt.py for GELU models, llama.py for SwiGLU)
//! and moves it to the GPU (one allocation per parameter, in registration order), runs
//! `steps_per_model` batched forwards under `torch.no_grad()` (see [`super::inference`]), and is
//! unloaded (`del model, idx, logits`: the parameters in order, a tied embedding last, then the
//! last ids and logits),
//! optionally followed by `torch.cuda.empty_cache()`. Python's names keep their values until
//! rebound: a step's new ids are allocated before the old ones die, its logits outlive the next
//! forward. The cuBLAS workspace is taken at the first matmul of the run and kept across models;
//! it is freed after the last residency (process exit), so nothing is live at the end.
//!
//! Which model each residency loads (uniform or round-robin) and the sequence lengths are drawn
//! from the seed, or taken from `residencies` (a capture's own schedule).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::inference::{param_elems, CublasWorkspace, Forward, INT64};
use super::model::{Emitter, LengthSampler};
use super::spec::{FfnKind, ModelSwitchSpec, Schedule};
use super::transformer::DEFAULT_CUBLAS_WORKSPACE;
use crate::event::Event;

pub struct ModelSwitchGen {
    spec: ModelSwitchSpec,
    /// Parameter element counts per model, in load order.
    params: Vec<Vec<u64>>,
    rng: ChaCha8Rng,
    seq: LengthSampler,
    e: Emitter,
    cublas: CublasWorkspace,
    residency: u64,
    step: u64,
    finished: bool,
}

impl ModelSwitchGen {
    pub fn new(spec: &ModelSwitchSpec, seed: u64) -> Self {
        let workspace = spec.cublas_workspace.map(|b| b.0).unwrap_or(DEFAULT_CUBLAS_WORKSPACE);
        ModelSwitchGen {
            params: spec.models.iter().map(param_elems).collect(),
            spec: spec.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            seq: LengthSampler::new(&spec.seq_len),
            e: Emitter::default(),
            cublas: CublasWorkspace::new(workspace),
            residency: 0,
            step: 0,
            finished: false,
        }
    }

    /// The model and the sequence lengths of the next residency.
    fn plan(&mut self) -> (usize, Vec<u64>) {
        if let Some(r) = self.spec.residencies.as_deref().unwrap_or_default().get(self.residency as usize) {
            return (r.model, r.seq_lens.clone());
        }
        let n = self.spec.models.len();
        let which = match self.spec.schedule {
            Schedule::RoundRobin => (self.residency % n as u64) as usize,
            Schedule::Random => self.rng.random_range(0..n),
        };
        let lens = (0..self.spec.steps_per_model).map(|_| self.seq.sample(&mut self.rng)).collect();
        (which, lens)
    }

    fn run_residency(&mut self) {
        let (which, seq_lens) = self.plan();
        let dt = self.spec.dtype.bytes();
        let params: Vec<u64> = self.params[which].iter().map(|&n| self.e.alloc(n * dt)).collect();
        let model = &self.spec.models[which];
        let (mut idx, mut logits): (Option<u64>, Option<u64>) = (None, None);
        for s in seq_lens {
            let b = self.spec.batch;
            // idx = torch.randint(0, vocab, (batch, s)): the old ids die on rebinding.
            if let Some(old) = idx.replace(self.e.alloc(b * s * INT64)) {
                self.e.free(old);
            }
            let mut f = Forward { e: &mut self.e, model, dt, cublas: &mut self.cublas };
            let out = match model.ffn_kind {
                FfnKind::Gelu => f.gpt(b, s, self.spec.attention),
                // llama.py always attends with SDPA; no cache: k and v die with attention's locals.
                FfnKind::Swiglu => f.llama(b, s, 0, &mut |_, _, k, v| Some([k, v])),
            };
            if let Some(old) = logits.replace(out) {
                self.e.free(old);
            }
            self.step += 1;
            self.e.step(self.step);
        }
        // del model, idx, logits: the modules die in registration order, each with its
        // parameters, but a tied token embedding (the first parameter) lives on in `lm_head`,
        // the last module.
        let mut params = params;
        if model.tied_embeddings {
            params.rotate_left(1);
        }
        self.e.free_all(params);
        self.e.free_all(idx.into_iter().chain(logits));
        if self.spec.empty_cache {
            self.e.empty_cache();
        }
        self.residency += 1;
    }
}

impl Iterator for ModelSwitchGen {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.e.pop() {
                return Some(ev);
            }
            if self.residency < self.spec.switches {
                self.run_residency();
                continue;
            }
            if !self.finished {
                self.finished = true;
                self.cublas.release(&mut self.e);
                continue;
            }
            return None;
        }
    }
}
