//! LLM serving as eager PyTorch does it (`scripts/models/serve.py` over `scripts/models/llama.py`,
//! under `torch.inference_mode()`), op by op: requests arrive in Poisson bursts, each is prefilled
//! on its prompt, then decoded one token per step, one forward per request, with its own KV cache.
//!
//! Weights load first (llama.py's parameter order) and stay live. Arrivals are Poisson per step
//! with a rate that switches between calm and burst phases (geometric phase lengths); up to
//! `max_batch` requests run at once. Every forward follows llama.py: the rotary tables of the
//! whole prefix, the embedding, per block RMSNorm (an fp32 upcast and its statistics), q/k/v
//! projections (k and v of `kv_heads` heads), rotary on q and k (casts of the table slices,
//! four products, two sums, a cat), the cache update, with grouped-query attention the
//! `repeat_interleave` of K and V to all heads, fused SDPA (flash on fp16/bf16: its log-sum-exp dies at once), the head
//! reshape (a copy only when more than one token), the output projection, the residual sums and
//! the SwiGLU MLP; then the final norm and fp16 logits for every position. KV caches:
//! `naive_cat` (torch.cat one token longer per layer per token, the old freed), `preallocated`
//! (a max-length K and V buffer per layer, taken at the first update), `paged` (pages of
//! `page_tokens` added as the sequence grows, gathered into contiguous K and V for attention).
//!
//! Python's own lifetimes are kept: the loop's names `idx`, `logits`, `token`, `caches` and `r`
//! hold their last values until rebound (the previous prompt's ids and logits live through the
//! next forward; a finished request's cache lives until `caches` and `r` move on), and a list
//! frees its items from the last to the first. After the last step everything but the weights
//! (and the cuBLAS workspace of the first matmul) is freed.

use std::collections::VecDeque;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Poisson};

use super::inference::{llama_param_elems, CublasWorkspace, Forward, INT64};
use super::model::{Emitter, LengthSampler};
use super::spec::{KvCache, ServingSpec};
use super::transformer::DEFAULT_CUBLAS_WORKSPACE;
use crate::event::Event;

/// One layer's cache: K and V tensors (naive: the whole prefix; preallocated: the buffers;
/// paged: one tensor per page each) and the tokens in it.
#[derive(Default)]
struct LayerKv {
    k: Vec<u64>,
    v: Vec<u64>,
    len: u64,
}

/// What a layer's cache update needs of the serving setup.
#[derive(Clone, Copy)]
struct CacheLayout {
    kind: KvCache,
    page_tokens: u64,
    /// One token's K (or V) of one layer.
    token_bytes: u64,
}

struct Request {
    kv: Vec<LayerKv>,
    /// `r[1]`: the position of the next token.
    pos: u64,
    /// `r[2]`: tokens still to generate.
    remaining: i64,
    /// `r[3]`: the last sampled token ([1, 1] int64).
    token: u64,
    /// Prompt plus output: the preallocated cache's length.
    max_len: u64,
    in_running: bool,
    caches_freed: bool,
}

pub struct ServingGen {
    spec: ServingSpec,
    rng: ChaCha8Rng,
    prompt_len: LengthSampler,
    output_len: LengthSampler,
    e: Emitter,
    /// Taken at the first forward's first matmul and kept, as the weights are.
    cublas: CublasWorkspace,
    loaded: bool,
    step: u64,
    burst: bool,
    waiting: VecDeque<(u64, u64)>,
    requests: Vec<Request>,
    /// Indices into `requests` of `running`, in order.
    running: Vec<usize>,
    // serve.py's loop names and what they hold.
    idx: Option<u64>,
    logits: Option<u64>,
    /// The `token` name: the tensor and the request it came from.
    token: Option<(u64, usize)>,
    caches: Option<usize>,
    r: Option<usize>,
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
            cublas: CublasWorkspace::new(spec.cublas_workspace.map(|b| b.0).unwrap_or(DEFAULT_CUBLAS_WORKSPACE)),
            loaded: false,
            step: 0,
            burst: false,
            waiting: VecDeque::new(),
            requests: Vec::new(),
            running: Vec::new(),
            idx: None,
            logits: None,
            token: None,
            caches: None,
            r: None,
            drained: false,
        }
    }

    fn dt(&self) -> u64 {
        self.spec.dtype.bytes()
    }

    fn load_weights(&mut self) {
        let dt = self.dt();
        for n in llama_param_elems(&self.spec.model) {
            self.e.alloc(n * dt);
        }
    }

    /// `Llama.forward(idx, caches=..., start=start)` on `s` tokens of request `ri`; returns the
    /// logits ([1, s, vocab] in the model's dtype).
    fn forward(&mut self, ri: usize, s: u64, start: u64) -> u64 {
        let dt = self.dt();
        // One token's K (or V) of one layer: kv_heads heads (llama.py's k_proj/v_proj width).
        let token_bytes = self.spec.model.kv_heads() * self.spec.model.head_dim() * dt;
        let layout = CacheLayout { kind: self.spec.kv_cache, page_tokens: self.spec.page_tokens, token_bytes };
        let request = &mut self.requests[ri];
        let mut f = Forward { e: &mut self.e, model: &self.spec.model, dt, cublas: &mut self.cublas };
        f.llama(1, s, start, &mut |e, layer, kr, val| cache_update(e, request, layout, layer, kr, val, s))
    }

    /// Frees what a request's list held once nothing names it: `r[3]` (unless the `token` name
    /// still holds it), then its caches (unless the `caches` name holds them), layers from the
    /// last, K before V.
    fn release(&mut self, ri: usize) {
        let req = &self.requests[ri];
        if req.in_running || self.r == Some(ri) {
            return;
        }
        if self.token.map(|(t, _)| t) != Some(req.token) && req.token != u64::MAX {
            let t = req.token;
            self.requests[ri].token = u64::MAX;
            self.e.free(t);
        }
        if self.caches != Some(ri) && !self.requests[ri].caches_freed {
            self.requests[ri].caches_freed = true;
            let kv = std::mem::take(&mut self.requests[ri].kv);
            for layer in kv.into_iter().rev() {
                self.e.free_all(layer.k);
                self.e.free_all(layer.v);
            }
        }
    }

    /// Rebinds the `token` name to request `owner`'s `new` token: the old tensor dies unless its
    /// request is alive and still holds it as `r[3]`.
    fn rebind_token(&mut self, new: u64, owner: usize) {
        if let Some((old, from)) = self.token.replace((new, owner)) {
            let q = &self.requests[from];
            let held = q.token == old && (q.in_running || self.r == Some(from));
            if !held && old != new {
                self.e.free(old);
                if q.token == old {
                    self.requests[from].token = u64::MAX;
                }
            }
        }
    }

    fn rebind_caches(&mut self, ri: usize) {
        if let Some(old) = self.caches.replace(ri) {
            if old != ri {
                self.release(old);
            }
        }
    }

    fn rebind_r(&mut self, ri: usize) {
        if let Some(old) = self.r.replace(ri) {
            if old != ri {
                self.release(old);
            }
        }
    }

    /// `logits = model(...)`: the old logits die once the call returns.
    fn rebind_logits(&mut self, new: u64) {
        if let Some(old) = self.logits.replace(new) {
            self.e.free(old);
        }
    }

    fn admit(&mut self, prompt: u64, output: u64) {
        let layers = self.spec.model.layers as usize;
        let ri = self.requests.len();
        self.requests.push(Request {
            kv: (0..layers).map(|_| LayerKv::default()).collect(),
            pos: prompt,
            remaining: output as i64 - 1,
            token: u64::MAX,
            max_len: prompt + output,
            in_running: false,
            caches_freed: false,
        });
        self.rebind_caches(ri);
        let idx = self.e.alloc(prompt * INT64); // torch.randint(0, vocab, (1, prompt))
        if let Some(old) = self.idx.replace(idx) {
            self.e.free(old);
        }
        let logits = self.forward(ri, prompt, 0);
        self.rebind_logits(logits);
        let token = self.e.alloc(INT64); // logits[:, -1:].argmax(-1)
        self.requests[ri].token = token;
        self.rebind_token(token, ri);
        self.requests[ri].in_running = true;
        self.running.push(ri);
    }

    fn decode(&mut self) {
        for ri in self.running.clone() {
            // caches, pos, _, token = r
            self.rebind_r(ri);
            self.rebind_caches(ri);
            let token = self.requests[ri].token;
            self.rebind_token(token, ri);
            let pos = self.requests[ri].pos;
            let logits = self.forward(ri, 1, pos);
            self.rebind_logits(logits);
            // r[1], r[2], r[3] = pos + 1, r[2] - 1, logits[:, -1:].argmax(-1)
            let next = self.e.alloc(INT64);
            let req = &mut self.requests[ri];
            req.pos += 1;
            req.remaining -= 1;
            req.token = next;
        }
        // running = [r for r in running if r[2] > 0]: the old list frees its items last first.
        let old = std::mem::take(&mut self.running);
        for &ri in &old {
            if self.requests[ri].remaining > 0 {
                self.running.push(ri);
            }
        }
        for &ri in old.iter().rev() {
            if self.requests[ri].remaining <= 0 {
                self.requests[ri].in_running = false;
                self.release(ri);
            }
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
        if self.spec.arrivals.is_empty() {
            let rate = if self.burst { self.spec.burst_rate } else { self.spec.calm_rate };
            let arrivals = if rate > 0.0 { Poisson::new(rate).map(|p| p.sample(&mut self.rng) as u64).unwrap_or(0) } else { 0 };
            for _ in 0..arrivals {
                let p = self.prompt_len.sample(&mut self.rng);
                let o = self.output_len.sample(&mut self.rng);
                self.waiting.push_back((p, o));
            }
        } else {
            // An explicit schedule (a capture's own arrivals): [step, prompt, output] rows.
            for a in self.spec.arrivals.iter().filter(|a| a[0] == self.step) {
                self.waiting.push_back((a[1], a[2]));
            }
        }
        while (self.running.len() as u64) < self.spec.max_batch {
            let Some((p, o)) = self.waiting.pop_front() else {
                break;
            };
            self.admit(p, o);
        }
        self.decode();
    }

    /// The script ends: every name and request is dropped; only the weights stay.
    fn drain(&mut self) {
        for ri in std::mem::take(&mut self.running) {
            self.requests[ri].in_running = false;
        }
        self.r = None;
        self.caches = None;
        if let Some((t, owner)) = self.token.take() {
            // Freed here unless its request still holds it (then `release` frees it).
            if self.requests[owner].token != t {
                self.e.free(t);
            }
        }
        for ri in 0..self.requests.len() {
            self.release(ri);
        }
        let names = [self.idx.take(), self.logits.take()];
        self.e.free_all(names.into_iter().flatten());
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
                self.load_weights();
                continue;
            }
            if self.step < self.spec.steps {
                self.serve_step();
                continue;
            }
            if !self.drained {
                self.drained = true;
                self.drain();
                continue;
            }
            return None;
        }
    }
}

/// `k, v = cache.update(k, v)` for `s` new tokens (`kr` the rotated keys, `val` the values);
/// returns the temporaries attention reads and then frees (paged: the gathered K and V).
fn cache_update(e: &mut Emitter, req: &mut Request, c: CacheLayout, layer: usize, kr: u64, val: u64, s: u64) -> Option<[u64; 2]> {
    let (page, per_token) = (c.page_tokens, c.token_bytes);
    let len = req.kv[layer].len;
    let new_len = len + s;
    req.kv[layer].len = new_len;
    match c.kind {
        KvCache::NaiveCat => {
            if len == 0 {
                // self.k = k: the cache keeps the tensors themselves.
                let kv = &mut req.kv[layer];
                kv.k = vec![kr];
                kv.v = vec![val];
            } else {
                let nk = e.alloc(new_len * per_token);
                let old = std::mem::replace(&mut req.kv[layer].k, vec![nk]);
                e.free_all(old);
                let nv = e.alloc(new_len * per_token);
                let old = std::mem::replace(&mut req.kv[layer].v, vec![nv]);
                e.free_all(old);
                e.free(kr);
                e.free(val);
            }
            None
        }
        KvCache::Preallocated => {
            if req.kv[layer].k.is_empty() {
                let full = req.max_len * per_token;
                let (bk, bv) = (e.alloc(full), e.alloc(full));
                let kv = &mut req.kv[layer];
                kv.k = vec![bk];
                kv.v = vec![bv];
            }
            e.free(kr);
            e.free(val);
            None
        }
        KvCache::Paged => {
            let have = len.div_ceil(page);
            for _ in have..new_len.div_ceil(page) {
                let (pk, pv) = (e.alloc(page * per_token), e.alloc(page * per_token));
                let kv = &mut req.kv[layer];
                kv.k.push(pk);
                kv.v.push(pv);
            }
            let gathered = [e.alloc(new_len * per_token), e.alloc(new_len * per_token)];
            e.free(kr);
            e.free(val);
            Some(gathered)
        }
    }
}
