//! Shared pieces of the model-shaped generators: the event emitter, parameter layouts in
//! state-dict order and sequence-length sampling.

use std::collections::VecDeque;
use std::ops::Range;

use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal};

use super::spec::{FfnKind, LengthDist, ModelSpec};
use crate::event::Event;

/// Buffers the events of one phase (a step, a load) so generators stay lazy: memory is bounded
/// by one phase, never by the workload's length. Ids are handed out in increasing order.
#[derive(Default)]
pub struct Emitter {
    pub queue: VecDeque<Event>,
    next_id: u64,
}

impl Emitter {
    pub fn alloc(&mut self, bytes: u64) -> u64 {
        self.alloc_on(bytes, 0)
    }

    pub fn alloc_on(&mut self, bytes: u64, stream: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Event::Alloc { id, bytes: bytes.max(1), stream });
        id
    }

    pub fn free(&mut self, id: u64) {
        self.queue.push_back(Event::Free { id });
    }

    pub fn free_all(&mut self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            self.free(id);
        }
    }

    pub fn step(&mut self, n: u64) {
        self.queue.push_back(Event::Step { n });
    }

    pub fn empty_cache(&mut self) {
        self.queue.push_back(Event::EmptyCache);
    }

    pub fn record_stream(&mut self, id: u64, stream: u64) {
        self.queue.push_back(Event::RecordStream { id, stream });
    }

    pub fn sync(&mut self, stream: Option<u64>) {
        self.queue.push_back(Event::Sync { stream });
    }

    pub fn pop(&mut self) -> Option<Event> {
        self.queue.pop_front()
    }
}

/// Parameter tensors (element counts) in state-dict order, grouped by where they live.
pub struct ParamLayout {
    pub elems: Vec<u64>,
    /// Each tensor's first dimension (what FSDP shards and pads).
    pub dim0: Vec<u64>,
    /// Token (and position) embeddings.
    pub embed: Range<usize>,
    /// One range per transformer block.
    pub layers: Vec<Range<usize>>,
    /// Final norm and (untied) output projection.
    pub head: Range<usize>,
    /// Which tensors are matrices that autocast casts to the compute dtype in forward.
    pub is_matrix: Vec<bool>,
    /// Where each named parameter sits in `elems`, for generators that follow ops one by one.
    pub named: NamedParams,
}

/// A Linear layer's parameters: indices into [`ParamLayout::elems`] and its shape.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub weight: usize,
    pub bias: Option<usize>,
    pub out: u64,
    pub inp: u64,
}

/// A LayerNorm (weight and bias) or RMSNorm (weight only).
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    pub weight: usize,
    pub bias: Option<usize>,
}

/// One block's parameters by role. GELU blocks have one fused QKV projection and one up
/// projection; SwiGLU blocks have separate q, k, v and gate, up.
#[derive(Debug, Clone)]
pub struct BlockParams {
    pub norm1: Norm,
    pub qkv: Vec<Linear>,
    pub attn_out: Linear,
    pub norm2: Norm,
    pub up: Vec<Linear>,
    pub down: Linear,
    /// LoRA adapter tensors of this block (trainable, tiny).
    pub adapters: Vec<usize>,
}

impl Linear {
    fn tensors(&self) -> impl Iterator<Item = usize> {
        std::iter::once(self.weight).chain(self.bias)
    }
}

impl Norm {
    fn tensors(&self) -> impl Iterator<Item = usize> {
        std::iter::once(self.weight).chain(self.bias)
    }
}

impl BlockParams {
    /// The block's tensors in the order its module registers them (scripts/models/gpt.py and
    /// llama.py: the first norm, the attention's projections, the second norm, the MLP), which
    /// is the order FSDP2 gathers, copies out and frees them.
    pub fn module_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = self.norm1.tensors().collect();
        for lin in self.qkv.iter().chain([&self.attn_out]) {
            order.extend(lin.tensors());
        }
        order.extend(self.norm2.tensors());
        for lin in self.up.iter().chain([&self.down]) {
            order.extend(lin.tensors());
        }
        order.extend(&self.adapters);
        order
    }
}

#[derive(Debug, Clone)]
pub struct NamedParams {
    pub tok_embed: usize,
    pub pos_embed: Option<usize>,
    pub blocks: Vec<BlockParams>,
    pub final_norm: Norm,
    /// The output projection; its weight is the token embedding when tied.
    pub lm_head: Linear,
}

impl ParamLayout {
    pub fn new(m: &ModelSpec) -> Self {
        let (d, f, v) = (m.d_model, m.ffn, m.vocab);
        let mut t = Tensors { elems: Vec::new(), dim0: Vec::new(), is_matrix: Vec::new(), lora_rank: m.lora_rank, adapters: Vec::new() };
        let tok_embed = t.push(v, d, true);
        let pos_embed = (m.max_positions > 0).then(|| t.push(m.max_positions, d, false));
        let embed = 0..t.elems.len();
        let mut layers = Vec::with_capacity(m.layers as usize);
        let mut blocks = Vec::with_capacity(m.layers as usize);
        for _ in 0..m.layers {
            let start = t.elems.len();
            let block = match m.ffn_kind {
                FfnKind::Gelu => {
                    // GPT-2 names: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj.
                    let norm1 = t.norm(d, true);
                    let qkv = vec![t.linear(3 * d, d, true)];
                    let attn_out = t.linear(d, d, true);
                    let norm2 = t.norm(d, true);
                    let up = vec![t.linear(f, d, true)];
                    let down = t.linear(d, f, true);
                    BlockParams { norm1, qkv, attn_out, norm2, up, down, adapters: std::mem::take(&mut t.adapters) }
                }
                FfnKind::Swiglu => {
                    // Llama names: q/k/v/o_proj (k and v: kv_heads heads), gate/up/down_proj,
                    // two RMSNorm weights.
                    let kv = m.kv_heads() * m.head_dim();
                    let qkv = vec![t.linear(d, d, false), t.linear(kv, d, false), t.linear(kv, d, false)];
                    let attn_out = t.linear(d, d, false);
                    let up = vec![t.linear(f, d, false), t.linear(f, d, false)];
                    let down = t.linear(d, f, false);
                    let norm1 = t.norm(d, false);
                    let norm2 = t.norm(d, false);
                    BlockParams { norm1, qkv, attn_out, norm2, up, down, adapters: std::mem::take(&mut t.adapters) }
                }
            };
            blocks.push(block);
            layers.push(start..t.elems.len());
        }
        let head_start = t.elems.len();
        let final_norm = t.norm(d, m.ffn_kind == FfnKind::Gelu);
        let lm_head = if m.tied_embeddings {
            Linear { weight: tok_embed, bias: None, out: v, inp: d }
        } else {
            Linear { weight: t.push(v, d, true), bias: None, out: v, inp: d }
        };
        let head = head_start..t.elems.len();
        let named = NamedParams { tok_embed, pos_embed, blocks, final_norm, lm_head };
        ParamLayout { elems: t.elems, dim0: t.dim0, embed, layers, head, is_matrix: t.is_matrix, named }
    }

    pub fn total_elems(&self) -> u64 {
        self.elems.iter().sum()
    }
}

struct Tensors {
    elems: Vec<u64>,
    dim0: Vec<u64>,
    is_matrix: Vec<bool>,
    lora_rank: u64,
    adapters: Vec<usize>,
}

impl Tensors {
    /// A tensor of `rows` × `cols` elements (a vector: `cols` = 1).
    fn push(&mut self, rows: u64, cols: u64, matrix: bool) -> usize {
        self.elems.push(rows * cols);
        self.dim0.push(rows);
        self.is_matrix.push(matrix);
        self.elems.len() - 1
    }

    fn norm(&mut self, d: u64, bias: bool) -> Norm {
        let weight = self.push(d, 1, false);
        let bias = bias.then(|| self.push(d, 1, false));
        Norm { weight, bias }
    }

    /// A Linear layer, with LoRA adapters A (r × in) and B (out × r) as PEFT adds them.
    fn linear(&mut self, out: u64, inp: u64, bias: bool) -> Linear {
        let weight = self.push(out, inp, true);
        let bias = bias.then(|| self.push(out, 1, false));
        if self.lora_rank > 0 {
            let a = self.push(self.lora_rank, inp, true);
            let b = self.push(out, self.lora_rank, true);
            self.adapters.extend([a, b]);
        }
        Linear { weight, bias, out, inp }
    }
}

/// Draws sequence lengths; deterministic for a seeded rng.
pub struct LengthSampler {
    dist: LengthDist,
    lognormal: Option<LogNormal<f64>>,
    cursor: usize,
}

impl LengthSampler {
    pub fn new(dist: &LengthDist) -> Self {
        let lognormal = match dist {
            LengthDist::Lognormal { median, sigma, .. } => LogNormal::new(median.ln(), *sigma).ok(),
            _ => None,
        };
        LengthSampler { dist: dist.clone(), lognormal, cursor: 0 }
    }

    pub fn sample(&mut self, rng: &mut ChaCha8Rng) -> u64 {
        match &self.dist {
            LengthDist::Uniform { min, max } => rng.random_range(*min..=*max),
            LengthDist::Lognormal { min, max, .. } => {
                let x = self.lognormal.as_ref().map(|d| d.sample(rng)).unwrap_or(*min as f64);
                (x.round() as u64).clamp(*min, *max)
            }
            LengthDist::List { values } => {
                let v = values[self.cursor % values.len()];
                self.cursor += 1;
                v
            }
            LengthDist::Fixed { value } => *value,
        }
    }
}
