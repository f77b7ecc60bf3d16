//! Training steps of a decoder-only transformer, as eager PyTorch with AdamW allocates them.
//!
//! Before step 1 the parameters are allocated one tensor each, in state-dict order. Each step:
//! forward (autocast weight casts when the parameter dtype differs from the compute dtype, block
//! activations, the loss-time logits peak), backward in reverse (each saved activation freed
//! right after its gradient; `.grad` tensors created or accumulated), the optimizer step (state on
//! its first step; foreach temporaries), then `zero_grad`.
//! At the end, parameters, optimizer state (and grads when not set to None) stay live; every
//! other allocation has been freed.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::model::{forward_block, BlockShape, Emitter, LayerForward, LengthSampler, ParamLayout};
use super::spec::{Optimizer, TransformerSpec};
use crate::event::Event;

pub struct TransformerGen {
    spec: TransformerSpec,
    layout: ParamLayout,
    rng: ChaCha8Rng,
    seq: LengthSampler,
    e: Emitter,
    params: Vec<u64>,
    grads: Vec<Option<u64>>,
    optimizer_state: Vec<u64>,
    next_step: u64,
    started: bool,
}

impl TransformerGen {
    pub fn new(spec: &TransformerSpec, seed: u64) -> Self {
        let layout = ParamLayout::new(&spec.model);
        let n = layout.elems.len();
        TransformerGen {
            seq: LengthSampler::new(&spec.seq_len),
            spec: spec.clone(),
            layout,
            rng: ChaCha8Rng::seed_from_u64(seed),
            e: Emitter::default(),
            params: Vec::with_capacity(n),
            grads: vec![None; n],
            optimizer_state: Vec::new(),
            next_step: 1,
            started: false,
        }
    }

    fn grad_bytes(&self) -> u64 {
        self.spec.grad_dtype.unwrap_or(self.spec.param_dtype).bytes()
    }

    /// `.grad` of parameter `i`: created by the first backward (or every backward when grads are
    /// set to None); otherwise computed into a temporary and accumulated, as AccumulateGrad does.
    fn weight_grad(&mut self, i: usize) {
        let bytes = self.layout.elems[i] * self.grad_bytes();
        match self.grads[i] {
            None => self.grads[i] = Some(self.e.alloc(bytes)),
            Some(_) => {
                let tmp = self.e.alloc(bytes);
                self.e.free(tmp);
            }
        }
    }

    fn autocast_casts(&mut self, range: std::ops::Range<usize>) -> Vec<u64> {
        if self.spec.param_dtype == self.spec.activation_dtype {
            return Vec::new();
        }
        let act = self.spec.activation_dtype.bytes();
        range.filter(|&i| self.layout.is_matrix[i]).map(|i| self.e.alloc(self.layout.elems[i] * act)).collect()
    }

    /// Walks saved activations in reverse: a gradient the size of each is allocated, the previous
    /// gradient and the activation are freed; the block's weight grads are interleaved.
    fn backward_through(&mut self, saved: &[(u64, u64)], params: std::ops::Range<usize>, grad_in: u64) -> u64 {
        let mut grad = grad_in;
        let mut params: Vec<usize> = params.rev().collect();
        let per = params.len().div_ceil(saved.len().max(1)).max(1);
        for &(id, bytes) in saved.iter().rev() {
            let g = self.e.alloc(bytes);
            self.e.free(grad);
            self.e.free(id);
            grad = g;
            for i in params.drain(..per.min(params.len())) {
                self.weight_grad(i);
            }
        }
        for i in params {
            self.weight_grad(i);
        }
        grad
    }

    fn train_step(&mut self, n: u64) {
        let spec = self.spec.clone();
        let m = &spec.model;
        self.e.step(n);
        let s = self.seq.sample(&mut self.rng);
        let b = spec.batch;
        let t = b * s;
        let act = spec.activation_dtype.bytes();
        let (d, v) = (m.d_model, m.vocab);
        let shape = BlockShape { model: m, batch: b, seq: s, act_bytes: act, attention: spec.attention, dropout: spec.attention_dropout > 0.0 };

        // Forward. Autocast caches weight casts until the autocast region exits.
        let mut casts = self.autocast_casts(self.layout.embed.clone());
        let mut x = self.e.alloc(t * d * act);
        if m.max_positions > 0 {
            let pos = self.e.alloc(s * d * act);
            let sum = self.e.alloc(t * d * act);
            self.e.free(x);
            self.e.free(pos);
            x = sum;
        }
        let mut inputs = Vec::with_capacity(m.layers as usize);
        let mut saved = Vec::with_capacity(m.layers as usize);
        for l in 0..m.layers as usize {
            let c = self.autocast_casts(self.layout.layers[l].clone());
            casts.extend(c);
            let LayerForward { saved: keep, output } = forward_block(&mut self.e, shape);
            if spec.checkpointing {
                self.e.free_all(keep.iter().map(|&(id, _)| id));
                saved.push(Vec::new());
            } else {
                saved.push(keep);
            }
            inputs.push(x);
            x = output;
        }
        let head_casts = self.autocast_casts(self.layout.head.clone());
        casts.extend(head_casts);
        let norm_out = self.e.alloc(t * d * act);
        let norm_stats = self.e.alloc(t * 4);
        let logits = self.e.alloc(t * v * act);
        let logits_f32 = spec.logits_fp32.then(|| self.e.alloc(t * v * 4));
        let log_probs = self.e.alloc(t * v * 4);
        let loss = self.e.alloc(4);
        self.e.free_all(casts);

        // Backward: cross-entropy, output projection, final norm, then blocks in reverse.
        let g_lp = self.e.alloc(t * v * 4);
        let mut g = self.e.alloc(t * v * 4);
        self.e.free(g_lp);
        self.e.free(log_probs);
        if let Some(lf) = logits_f32 {
            let g_low = self.e.alloc(t * v * act);
            self.e.free(g);
            self.e.free(lf);
            g = g_low;
        }
        let head = self.layout.head.clone();
        let g_x = self.e.alloc(t * d * act);
        self.e.free(g);
        self.e.free(logits);
        let g_norm = self.backward_through(&[(norm_out, t * d * act), (norm_stats, t * 4)], head, g_x);
        let g_res = self.e.alloc(t * d * act);
        self.e.free(g_norm);
        self.e.free(x);
        let mut grad = g_res;
        for l in (0..m.layers as usize).rev() {
            let layer_saved = if spec.checkpointing {
                // Recompute under autocast: casts live for the recomputed forward only.
                let casts = self.autocast_casts(self.layout.layers[l].clone());
                let fwd = forward_block(&mut self.e, shape);
                self.e.free(fwd.output);
                self.e.free_all(casts);
                fwd.saved
            } else {
                std::mem::take(&mut saved[l])
            };
            grad = self.backward_through(&layer_saved, self.layout.layers[l].clone(), grad);
            let g_in = self.e.alloc(t * d * act); // residual branch sum
            self.e.free(grad);
            self.e.free(inputs[l]);
            grad = g_in;
        }
        for i in self.layout.embed.clone().rev() {
            self.weight_grad(i);
        }
        self.e.free(grad);
        self.e.free(loss);

        self.optimizer_step();
    }

    fn optimizer_step(&mut self) {
        let st = self.spec.optimizer_state_dtype.bytes();
        if self.optimizer_state.is_empty() {
            let per_param = match self.spec.optimizer {
                Optimizer::AdamForeach | Optimizer::AdamFused => 2,
                Optimizer::SgdMomentum => 1,
            };
            for i in 0..self.layout.elems.len() {
                for _ in 0..per_param {
                    let id = self.e.alloc(self.layout.elems[i] * st);
                    self.optimizer_state.push(id);
                }
                if self.spec.master_weights {
                    let id = self.e.alloc(self.layout.elems[i] * 4);
                    self.optimizer_state.push(id);
                }
            }
        }
        if self.spec.optimizer == Optimizer::AdamForeach {
            // _foreach_sqrt(exp_avg_sq) and the bias-corrected denominators: one list of
            // parameter-shaped temporaries, freed when the step returns.
            let tmps: Vec<u64> = (0..self.layout.elems.len()).map(|i| self.e.alloc(self.layout.elems[i] * st)).collect();
            self.e.free_all(tmps);
        }
        if self.spec.grads_set_to_none {
            let grads: Vec<u64> = self.grads.iter_mut().filter_map(Option::take).collect();
            self.e.free_all(grads);
        }
    }
}

impl Iterator for TransformerGen {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.e.pop() {
                return Some(ev);
            }
            if !self.started {
                self.started = true;
                let pb = self.spec.param_dtype.bytes();
                for i in 0..self.layout.elems.len() {
                    let id = self.e.alloc(self.layout.elems[i] * pb);
                    self.params.push(id);
                }
                continue;
            }
            if self.next_step > self.spec.steps {
                return None;
            }
            let n = self.next_step;
            self.next_step += 1;
            self.train_step(n);
        }
    }
}
