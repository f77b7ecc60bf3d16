//! Several models loaded, run for K inference steps, and unloaded, in a schedule.
//!
//! Loading allocates every parameter tensor in state-dict order; each inference step runs the
//! blocks under `no_grad` (a block's activations die when the block ends; its output when the next
//! block has consumed it), then the logits; unloading frees the parameters in order. Nothing is
//! live at the end.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::model::{forward_block, BlockShape, Emitter, LengthSampler, ParamLayout};
use super::spec::{ModelSwitchSpec, Schedule};
use crate::event::Event;

pub struct ModelSwitchGen {
    spec: ModelSwitchSpec,
    layouts: Vec<ParamLayout>,
    rng: ChaCha8Rng,
    seq: LengthSampler,
    e: Emitter,
    residency: u64,
    step: u64,
}

impl ModelSwitchGen {
    pub fn new(spec: &ModelSwitchSpec, seed: u64) -> Self {
        ModelSwitchGen {
            layouts: spec.models.iter().map(ParamLayout::new).collect(),
            spec: spec.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            seq: LengthSampler::new(&spec.seq_len),
            e: Emitter::default(),
            residency: 0,
            step: 0,
        }
    }

    fn run_residency(&mut self) {
        let which = match self.spec.schedule {
            Schedule::RoundRobin => (self.residency % self.spec.models.len() as u64) as usize,
            Schedule::Random => self.rng.random_range(0..self.spec.models.len()),
        };
        let model = self.spec.models[which].clone();
        let dt = self.spec.dtype.bytes();
        let params: Vec<u64> = self.layouts[which].elems.iter().map(|&n| self.e.alloc(n * dt)).collect();
        for _ in 0..self.spec.steps_per_model {
            self.step += 1;
            self.e.step(self.step);
            let s = self.seq.sample(&mut self.rng);
            let b = self.spec.batch;
            let shape = BlockShape { model: &model, batch: b, seq: s, act_bytes: dt, attention: self.spec.attention, dropout: false };
            let mut x = self.e.alloc(b * s * model.d_model * dt);
            for _ in 0..model.layers {
                let fwd = forward_block(&mut self.e, shape);
                self.e.free_all(fwd.saved.iter().map(|&(id, _)| id));
                self.e.free(x);
                x = fwd.output;
            }
            let norm = self.e.alloc(b * s * model.d_model * dt);
            self.e.free(x);
            let logits = self.e.alloc(b * s * model.vocab * dt);
            self.e.free(norm);
            self.e.free(logits);
        }
        self.e.free_all(params);
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
            if self.residency >= self.spec.switches {
                return None;
            }
            self.run_residency();
        }
    }
}
