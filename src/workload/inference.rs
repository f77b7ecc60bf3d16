//! Forward passes of `scripts/models/gpt.py` and `scripts/models/llama.py` as eager PyTorch
//! allocates them without autograd (`torch.no_grad()` / `torch.inference_mode()`), op by op: what
//! the serving and model-switch generators run. Nothing is saved for backward, so every
//! temporary dies as soon as Python drops its last name (a chained expression's intermediates when
//! the statement ends, a function's locals when it returns, in the order the locals were named).

use super::model::{Emitter, ParamLayout};
use super::spec::{Attention, FfnKind, ModelSpec};

pub const FP32: u64 = 4;
pub const INT64: u64 = 8;
const BOOL: u64 = 1;

/// The cuBLAS workspace of the default stream: PyTorch takes it from the caching allocator at the
/// stream's first matmul and keeps it for the handle's life (aten/src/ATen/cuda/CublasHandlePool.cpp,
/// `getCUDABlasLtWorkspace`). Zero bytes: not modelled.
pub struct CublasWorkspace {
    bytes: u64,
    id: Option<u64>,
}

impl CublasWorkspace {
    pub fn new(bytes: u64) -> Self {
        CublasWorkspace { bytes, id: None }
    }

    /// A matmul producing `out_bytes`: the first one allocates the workspace before its output.
    pub fn matmul(&mut self, e: &mut Emitter, out_bytes: u64) -> u64 {
        if self.id.is_none() && self.bytes > 0 {
            self.id = Some(e.alloc(self.bytes));
        }
        e.alloc(out_bytes)
    }

    /// The process ends: the workspace goes with its handle.
    pub fn release(&mut self, e: &mut Emitter) {
        if let Some(id) = self.id.take() {
            e.free(id);
        }
    }
}

/// llama.py's parameters in registration order (what `model.to(device, dtype)` converts one by
/// one and `del model` frees in the same order): embedding, per block the input norm, q, k, v
/// (k and v: `kv_heads` heads), o, the post-attention norm, gate, up, down; the final norm and
/// the output projection.
pub fn llama_param_elems(m: &ModelSpec) -> Vec<u64> {
    let (d, f, v) = (m.d_model, m.ffn, m.vocab);
    let kv = m.kv_heads() * m.head_dim();
    let mut elems = vec![v * d];
    for _ in 0..m.layers {
        elems.extend([d, d * d, kv * d, kv * d, d * d, d, f * d, f * d, d * f]);
    }
    elems.push(d);
    if !m.tied_embeddings {
        elems.push(v * d);
    }
    elems
}

/// The parameters of the script's model for `m` (GELU: gpt.py, whose order is the state dict's;
/// SwiGLU: llama.py), in load order.
pub fn param_elems(m: &ModelSpec) -> Vec<u64> {
    match m.ffn_kind {
        FfnKind::Gelu => ParamLayout::new(m).elems,
        FfnKind::Swiglu => llama_param_elems(m),
    }
}

/// An attention layer's `k, v = cache.update(k, v)`: `(emitter, layer, rotated keys, values)`
/// to the K and V attention reads when they are its own temporaries (see [`Forward::llama`]).
pub type CacheUpdate<'a> = dyn FnMut(&mut Emitter, usize, u64, u64) -> Option<[u64; 2]> + 'a;

/// One forward's context: the emitter, the model, the weights' and activations' element size.
pub struct Forward<'a> {
    pub e: &'a mut Emitter,
    pub model: &'a ModelSpec,
    pub dt: u64,
    pub cublas: &'a mut CublasWorkspace,
}

impl Forward<'_> {
    fn matmul(&mut self, bytes: u64) -> u64 {
        self.cublas.matmul(self.e, bytes)
    }

    /// `nn.LayerNorm` on `t` tokens under no_grad: native_layer_norm's output and its fp32 mean
    /// and rstd, which nobody keeps.
    fn layer_norm(&mut self, t: u64) -> u64 {
        let out = self.e.alloc(t * self.model.d_model * self.dt);
        let (mean, rstd) = (self.e.alloc(t * FP32), self.e.alloc(t * FP32));
        self.e.free(mean);
        self.e.free(rstd);
        out
    }

    /// RMSNorm.forward on `t` tokens: `x.float()`, `pow(2).mean(-1, keepdim)`, `+ eps`, `rsqrt`,
    /// the product, `.type_as(x)`, `* weight`.
    pub fn rms_norm(&mut self, t: u64) -> u64 {
        let (d, dt) = (self.model.d_model, self.dt);
        let upcast = dt != FP32;
        let h = upcast.then(|| self.e.alloc(t * d * FP32));
        let sq = self.e.alloc(t * d * FP32);
        let mean = self.e.alloc(t * FP32);
        self.e.free(sq);
        let eps = self.e.alloc(t * FP32);
        self.e.free(mean);
        let r = self.e.alloc(t * FP32);
        self.e.free(eps);
        let hr = self.e.alloc(t * d * FP32);
        self.e.free(r);
        let cast = if upcast {
            let c = self.e.alloc(t * d * dt);
            self.e.free(hr);
            c
        } else {
            hr
        };
        let out = self.e.alloc(t * d * dt);
        self.e.free(cast);
        if let Some(h) = h {
            self.e.free(h);
        }
        out
    }

    /// apply_rope on `b` sequences of `s` tokens and `heads` heads: the table slices cast to the
    /// dtype, x1·cos − x2·sin and x2·cos + x1·sin, and their cat.
    fn rope(&mut self, b: u64, s: u64, heads: u64) -> u64 {
        let hd = self.model.head_dim();
        let half = hd / 2;
        let dt = self.dt;
        let casts = (dt != FP32).then(|| [self.e.alloc(s * half * dt), self.e.alloc(s * half * dt)]);
        let piece = b * s * heads * half * dt;
        let (x, y) = (self.e.alloc(piece), self.e.alloc(piece));
        let first = self.e.alloc(piece);
        self.e.free(x);
        self.e.free(y);
        let (x, y) = (self.e.alloc(piece), self.e.alloc(piece));
        let second = self.e.alloc(piece);
        self.e.free(x);
        self.e.free(y);
        let out = self.e.alloc(b * s * heads * hd * dt);
        self.e.free(second);
        self.e.free(first);
        if let Some(c) = casts {
            self.e.free_all(c);
        }
        out
    }

    /// `Llama.forward(idx, caches=..., start=start)` on `b` sequences of `s` tokens; returns the
    /// logits ([b, s, vocab] in the model's dtype). `cache(e, layer, k, v)` is the attention's
    /// `cache.update(k, v)` on the rotated keys and the values: it keeps or frees them and
    /// returns the K and V attention reads if they are its own temporaries, which its locals
    /// `k` and `v` drop (without a cache: `k` and `v` themselves), or nothing when the cache
    /// holds them.
    pub fn llama(&mut self, b: u64, s: u64, start: u64, cache: &mut CacheUpdate) -> u64 {
        let m = self.model;
        let (d, f, v, dt) = (m.d_model, m.ffn, m.vocab, self.dt);
        let kv_width = m.kv_heads() * m.head_dim();
        let half = m.head_dim() / 2;
        let t = b * s;
        let total = start + s;
        // rope_tables(start + s): arange / half, theta ** that, 1 / that (reciprocal then ·1.0),
        // the positions, their outer product, cos and sin.
        let x = self.e.alloc(half * FP32);
        let y = self.e.alloc(half * FP32);
        self.e.free(x);
        let p = self.e.alloc(half * FP32);
        self.e.free(y);
        let recip = self.e.alloc(half * FP32);
        let inv = self.e.alloc(half * FP32);
        self.e.free(recip);
        self.e.free(p);
        let positions = self.e.alloc(total * FP32);
        let angles = self.e.alloc(total * half * FP32);
        self.e.free(positions);
        let (cos, sin) = (self.e.alloc(total * half * FP32), self.e.alloc(total * half * FP32));
        self.e.free(inv);
        self.e.free(angles);

        let mut x = self.e.alloc(t * d * dt); // embed_tokens
        for layer in 0..m.layers as usize {
            let n = self.rms_norm(t);
            let q = self.matmul(t * d * dt);
            let k = self.matmul(t * kv_width * dt);
            let val = self.matmul(t * kv_width * dt);
            let qr = self.rope(b, s, m.heads);
            let kr = self.rope(b, s, m.kv_heads());
            self.e.free(k);
            self.e.free(q);
            let mut read = cache(self.e, layer, kr, val);
            if m.kv_heads() != m.heads {
                // k = k.repeat_interleave(heads // kv_heads, dim=1), then v: one contiguous
                // [b, heads, start + s, head_dim] tensor each (as captured); rebinding the
                // name frees a K or V that was attention's own (the cache keeps its tensors).
                let repeated = b * total * d * dt;
                let rk = self.e.alloc(repeated);
                if let Some([k, _]) = read {
                    self.e.free(k);
                }
                let rv = self.e.alloc(repeated);
                if let Some([_, v]) = read {
                    self.e.free(v);
                }
                read = Some([rk, rv]);
            }
            // SDPA: flash on fp16/bf16 returns the output and a log-sum-exp nobody keeps;
            // memory-efficient on fp32 computes none without grad.
            let y = self.e.alloc(t * d * dt);
            if dt != FP32 {
                let lse = self.e.alloc(m.heads * t * FP32);
                self.e.free(lse);
            }
            // y.transpose(1, 2).reshape(b, s, -1) copies unless s == 1.
            let reshaped = (s > 1).then(|| self.e.alloc(t * d * dt));
            let o = self.matmul(t * d * dt);
            if let Some(r) = reshaped {
                self.e.free(r);
            }
            self.e.free(qr);
            self.e.free_all(read.into_iter().flatten());
            self.e.free(y);
            self.e.free(n);
            let x2 = self.e.alloc(t * d * dt);
            self.e.free(o);
            let h = self.rms_norm(t);
            let gate = self.matmul(t * f * dt);
            let silu = self.e.alloc(t * f * dt);
            self.e.free(gate);
            let up = self.matmul(t * f * dt);
            let prod = self.e.alloc(t * f * dt);
            self.e.free(silu);
            self.e.free(up);
            let down = self.matmul(t * d * dt);
            self.e.free(prod);
            let x3 = self.e.alloc(t * d * dt);
            self.e.free(down);
            self.e.free(x2);
            self.e.free(h);
            self.e.free(x);
            x = x3;
        }
        let n = self.rms_norm(t);
        let logits = self.matmul(t * v * dt);
        self.e.free(n);
        self.e.free(cos);
        self.e.free(sin);
        self.e.free(x);
        logits
    }

    /// `GPT.forward(idx)` on `b` sequences of `s` tokens; returns the logits ([b, s, vocab]).
    /// Flash (`attention = "sdpa"` in gpt.py): SDPA's output (laid out so that the head merge
    /// needs no copy) and its log-sum-exp. Math: the causal mask, contiguous copies of q and kᵀ
    /// for the batched matmul, the scaled, masked and softmaxed scores, a copy of v, the context
    /// and its head-merging copy.
    pub fn gpt(&mut self, b: u64, s: u64, attention: Attention) -> u64 {
        let m = self.model;
        let (d, f, v, h, dt) = (m.d_model, m.ffn, m.vocab, m.heads, self.dt);
        let t = b * s;
        let act = t * d * dt;
        let pos = self.e.alloc(s * INT64); // torch.arange(s)
        let tok = self.e.alloc(act); // wte(idx)
        let pe = self.e.alloc(s * d * dt); // wpe(pos)
        let mut x = self.e.alloc(act);
        self.e.free(tok);
        self.e.free(pe);
        // torch.ones(s, s, dtype=bool).triu(1), made once per forward.
        let mask = (attention == Attention::Math).then(|| {
            let ones = self.e.alloc(s * s * BOOL);
            let mask = self.e.alloc(s * s * BOOL);
            self.e.free(ones);
            mask
        });
        for _ in 0..m.layers {
            let n1 = self.layer_norm(t);
            let qkv = self.matmul(3 * act);
            // The attention's locals (q, k, v views of qkv, then y, then att) die at its return.
            let (y, att, merged) = match attention {
                Attention::Flash => {
                    let y = self.e.alloc(act);
                    let lse = self.e.alloc(b * h * s * FP32);
                    self.e.free(lse);
                    (y, None, None)
                }
                Attention::Math => {
                    let scores_bytes = b * h * s * s * dt;
                    let (qc, kc) = (self.e.alloc(act), self.e.alloc(act));
                    let scores = self.matmul(scores_bytes);
                    self.e.free(kc);
                    self.e.free(qc);
                    let scaled = self.e.alloc(scores_bytes);
                    self.e.free(scores);
                    let masked = self.e.alloc(scores_bytes);
                    let att = self.e.alloc(scores_bytes); // softmax
                    self.e.free(masked);
                    self.e.free(scaled);
                    let vc = self.e.alloc(act);
                    let y = self.matmul(act);
                    self.e.free(vc);
                    let merged = self.e.alloc(act); // y.transpose(1, 2).contiguous()
                    (y, Some(att), Some(merged))
                }
            };
            let proj = self.matmul(act);
            if let Some(c) = merged {
                self.e.free(c);
            }
            self.e.free(qkv);
            self.e.free(y);
            if let Some(a) = att {
                self.e.free(a);
            }
            self.e.free(n1);
            let x2 = self.e.alloc(act);
            self.e.free(proj);
            let n2 = self.layer_norm(t);
            let up = self.matmul(t * f * dt);
            let gelu = self.e.alloc(t * f * dt);
            self.e.free(up);
            let down = self.matmul(act);
            self.e.free(gelu);
            self.e.free(n2);
            let x3 = self.e.alloc(act);
            self.e.free(down);
            self.e.free(x2);
            self.e.free(x);
            x = x3;
        }
        let n = self.layer_norm(t);
        let logits = self.matmul(t * v * dt);
        self.e.free(n);
        // GPT.forward's locals: pos, x, mask.
        self.e.free(pos);
        self.e.free(x);
        if let Some(mask) = mask {
            self.e.free(mask);
        }
        logits
    }
}
