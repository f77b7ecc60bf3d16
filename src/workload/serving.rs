//! LLM serving: bursty arrivals, prefill, token-by-token decode with a growing KV cache.
//!
//! Weights are loaded first and stay live. Arrivals are Poisson per decode step with a rate that
//! switches between calm and burst phases (geometric phase lengths). Up to `max_batch` requests
//! run at once; a new one is prefilled (prompt-sized activations, its KV cache), then every step
//! decodes one token for each running request (1-token activations per block; the KV cache grows:
//! `naive_cat` allocates K and V one token larger and frees the old, per block, per token;
//! `paged` adds a page when a page fills; `preallocated` sized for the whole sequence at
//! admission). A finished request frees its cache. After the last step every request still
//! running is finished, so only the weights are live at the end.

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};

use super::model::{forward_block, BlockShape, Emitter, LengthSampler, ParamLayout};
use super::spec::{Attention, KvCache, ServingSpec};
use crate::event::Event;

struct Request {
    prompt: u64,
    output: u64,
    generated: u64,
    /// Per block: K and V tensors (naive/preallocated: one each; paged: one per page).
    kv: Vec<Vec<u64>>,
}

pub struct ServingGen {
    spec: ServingSpec,
    rng: ChaCha8Rng,
    prompt_len: LengthSampler,
    output_len: LengthSampler,
    e: Emitter,
    loaded: bool,
    step: u64,
    burst: bool,
    waiting: VecDeque<(u64, u64)>,
    running: Vec<Request>,
    drained: bool,
}

impl ServingGen {
    pub fn new(spec: &ServingSpec, seed: u64) -> Self {
        ServingGen {
            spec: spec.clone(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            prompt_len: LengthSampler::new(&spec.prompt_len),
            output_len: LengthSampler::new(&spec.output_len),
            e: Emitter::default(),
            loaded: false,
            step: 0,
            burst: false,
            waiting: VecDeque::new(),
            running: Vec::new(),
            drained: false,
        }
    }

    /// Bytes of K (or V) for `tokens` tokens in one block.
    fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens * self.spec.model.d_model * self.spec.dtype.bytes()
    }

    fn pages(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.spec.page_tokens)
    }

    fn admit(&mut self, prompt: u64, output: u64) {
        let m = self.spec.model.clone();
        let dt = self.spec.dtype.bytes();
        let shape = BlockShape { model: &m, batch: 1, seq: prompt, act_bytes: dt, attention: Attention::Flash, dropout: false };
        let mut kv = Vec::with_capacity(m.layers as usize);
        let mut x = self.e.alloc(prompt * m.d_model * dt);
        for _ in 0..m.layers {
            let fwd = forward_block(&mut self.e, shape);
            let tensors = match self.spec.kv_cache {
                KvCache::NaiveCat => vec![self.e.alloc(self.kv_bytes(prompt)), self.e.alloc(self.kv_bytes(prompt))],
                KvCache::Preallocated => {
                    let full = self.kv_bytes(prompt + output);
                    vec![self.e.alloc(full), self.e.alloc(full)]
                }
                KvCache::Paged => {
                    let page = self.kv_bytes(self.spec.page_tokens);
                    (0..2 * self.pages(prompt)).map(|_| self.e.alloc(page)).collect()
                }
            };
            kv.push(tensors);
            self.e.free_all(fwd.saved.iter().map(|&(id, _)| id));
            self.e.free(x);
            x = fwd.output;
        }
        let logits = self.e.alloc(m.vocab * 4); // last position only, fp32 for sampling
        self.e.free(x);
        self.e.free(logits);
        self.running.push(Request { prompt, output, generated: 1, kv });
    }

    fn decode_step(&mut self) {
        let m = self.spec.model.clone();
        let dt = self.spec.dtype.bytes();
        let b = self.running.len() as u64;
        if b == 0 {
            return;
        }
        let d = m.d_model;
        let mut x = self.e.alloc(b * d * dt);
        for layer in 0..m.layers as usize {
            let norm = self.e.alloc(b * d * dt);
            let qkv = self.e.alloc(b * 3 * d * dt);
            // Grow each request's cache by this token.
            for r in 0..self.running.len() {
                let len = self.running[r].prompt + self.running[r].generated;
                match self.spec.kv_cache {
                    KvCache::NaiveCat => {
                        for which in 0..2 {
                            let bigger = self.e.alloc(self.kv_bytes(len + 1));
                            let old = std::mem::replace(&mut self.running[r].kv[layer][which], bigger);
                            self.e.free(old);
                        }
                    }
                    KvCache::Preallocated => {}
                    KvCache::Paged => {
                        if self.pages(len + 1) > self.pages(len) {
                            let page = self.kv_bytes(self.spec.page_tokens);
                            for _ in 0..2 {
                                let id = self.e.alloc(page);
                                self.running[r].kv[layer].push(id);
                            }
                        }
                    }
                }
            }
            let ctx_tokens: u64 = self.running.iter().map(|r| r.prompt + r.generated).sum();
            let scores = self.e.alloc(m.heads * ctx_tokens * dt);
            let attn = self.e.alloc(b * d * dt);
            self.e.free(scores);
            self.e.free(qkv);
            let h = self.e.alloc(b * d * dt);
            self.e.free(attn);
            self.e.free(norm);
            let up = self.e.alloc(b * m.ffn * dt);
            let down = self.e.alloc(b * d * dt);
            self.e.free(up);
            let out = self.e.alloc(b * d * dt);
            self.e.free(down);
            self.e.free(h);
            self.e.free(x);
            x = out;
        }
        let logits = self.e.alloc(b * m.vocab * 4);
        self.e.free(x);
        self.e.free(logits);
        for r in &mut self.running {
            r.generated += 1;
        }
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running).into_iter().partition(|r| r.generated >= r.output);
        self.running = running;
        for r in done {
            self.finish(r);
        }
    }

    fn finish(&mut self, r: Request) {
        for layer in r.kv {
            self.e.free_all(layer);
        }
    }

    fn serve_step(&mut self) {
        self.step += 1;
        self.e.step(self.step);
        // Phase switch: leave the current phase with probability 1/mean_length.
        let mean = if self.burst { self.spec.mean_burst_steps } else { self.spec.mean_calm_steps };
        if self.rng.random_bool((1.0 / mean.max(1.0)).min(1.0)) {
            self.burst = !self.burst;
        }
        let rate = if self.burst { self.spec.burst_rate } else { self.spec.calm_rate };
        let arrivals = if rate > 0.0 { Poisson::new(rate).map(|p| p.sample(&mut self.rng) as u64).unwrap_or(0) } else { 0 };
        for _ in 0..arrivals {
            let p = self.prompt_len.sample(&mut self.rng);
            let o = self.output_len.sample(&mut self.rng);
            self.waiting.push_back((p, o));
        }
        while (self.running.len() as u64) < self.spec.max_batch {
            let Some((p, o)) = self.waiting.pop_front() else {
                break;
            };
            self.admit(p, o);
        }
        self.decode_step();
    }
}

impl Iterator for ServingGen {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.e.pop() {
                return Some(ev);
            }
            if !self.loaded {
                self.loaded = true;
                let dt = self.spec.dtype.bytes();
                for n in ParamLayout::new(&self.spec.model).elems {
                    self.e.alloc(n * dt);
                }
                continue;
            }
            if self.step < self.spec.steps {
                self.serve_step();
                continue;
            }
            if !self.drained {
                self.drained = true;
                for r in std::mem::take(&mut self.running) {
                    self.finish(r);
                }
                continue;
            }
            return None;
        }
    }
}
