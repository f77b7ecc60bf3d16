//! Training steps of a decoder-only transformer, op by op as eager PyTorch allocates them.
//!
//! Calibrated against captures of real PyTorch (`allocbench capture` of
//! `scripts/models/train.py`: fake CUDA tensors through real autograd and CUDA autocast; see
//! WORKLOADS.md). Every size derives from the model shape and the dtypes; the order of
//! allocations and frees follows the capture (Python reference lifetimes, autograd's saved
//! tensors, the autocast cast cache, the engine's in-place gradient sums).
//!
//! Before step 1 the parameters are allocated one tensor each, in state-dict order. Each step:
//! token ids and targets (the previous step's are freed when Python rebinds the names), the
//! forward (under autocast: weight casts saved until their layer's backward, bias casts cached
//! until autocast exits, the fp32 residual stream cast to the compute dtype before each linear,
//! softmax in fp32), the loss, backward in reverse (each saved tensor freed by its last
//! backward; `.grad` created or accumulated), gradient clipping, the optimizer step (state on its
//! first step; foreach temporaries), then `zero_grad`. The cuBLAS workspace is allocated at the
//! first matmul and kept. Grouped-query attention (`kv_heads`) narrows the k/v projections and
//! k's rotary embedding, repeats k and v to all heads before SDPA and sums them back in backward.
//! At the end, parameters, optimizer state, the workspace (and grads
//! when not set to None) stay live; every other allocation has been freed.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::fsdp::FsdpLayout;
use super::model::{BlockParams, Emitter, LengthSampler, Linear, Norm, ParamLayout};
use super::spec::{Attention, DdpSpec, FfnKind, Optimizer, TransformerSpec};
use crate::event::Event;

/// Element sizes fixed by PyTorch whatever the model: token ids and positions are int64, masks
/// bool; norm statistics, fp32 casts and scalar losses are fp32.
const INT64: u64 = 8;
const BOOL: u64 = 1;
const FP32: u64 = 4;
/// The cuBLAS workspace of a stream (CUBLAS_WORKSPACE_CONFIG's default on Hopper).
pub const DEFAULT_CUBLAS_WORKSPACE: u64 = 32 << 20;
/// A cuBLASLt call's workspace (`CUBLASLT_WORKSPACE_SIZE`'s default, 1,024 KiB).
pub const DEFAULT_CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// Sizes of one step.
#[derive(Clone, Copy)]
struct Dims {
    b: u64,
    s: u64,
    /// Tokens, B·S.
    t: u64,
    d: u64,
    f: u64,
    h: u64,
    /// k and v projection width: kv_heads · head_dim (D without grouped-query attention).
    kv: u64,
    v: u64,
    /// Compute (activation) dtype bytes.
    a: u64,
    /// Parameter dtype bytes: embeddings, the residual stream and norms run in it.
    p: u64,
    /// Gradient dtype bytes.
    g: u64,
    /// Autocast: parameters in a wider dtype than the compute dtype.
    autocast: bool,
    /// Softmax dtype bytes (fp32 under autocast).
    sm: u64,
    dropout: bool,
}

impl Dims {
    /// One B·H·S·S score tensor's elements.
    fn scores(&self) -> u64 {
        self.b * self.h * self.s * self.s
    }
}

/// What a Linear keeps for backward: its input (a cast owned by it, or the raw activation when
/// this linear is its last user) and, under autocast, the weight cast.
#[derive(Default, Clone, Copy)]
struct LinSaved {
    input: Option<u64>,
    weight: Option<u64>,
}

/// A norm's saved state: input (or its fp32 copy), statistics, and for RMSNorm the normalised
/// value the weight multiplies.
#[derive(Default, Clone)]
struct NormSaved {
    /// Freed by the norm's backward (the block input / residual, or RMSNorm's fp32 copy).
    input: Option<u64>,
    stats: Vec<u64>,
    normed: Option<u64>,
}

enum AttnSaved {
    Math {
        q: u64,
        k: u64,
        v: u64,
        probs: u64,
        probs_mm: Option<u64>,
        dropped: Option<u64>,
        drop_mask: Option<u64>,
    },
    /// `rope`: q's and k's rotary tables as cast for them (none when no cast was made).
    Flash {
        q: u64,
        k: u64,
        v: u64,
        qkv: Option<u64>,
        out: u64,
        lse: u64,
        rng: Vec<u64>,
        rope: [Option<[u64; 2]>; 2],
    },
}

/// One block's saved tensors (owned ids) and output.
struct BlockSaved {
    n1: NormSaved,
    qkv: Vec<LinSaved>,
    attn: AttnSaved,
    proj: LinSaved,
    n2: NormSaved,
    up: Vec<LinSaved>,
    /// GELU: [fc output, gelu]; SwiGLU: [gate, silu(gate), up, product].
    mlp: Vec<u64>,
    down: LinSaved,
    /// The block's output (none from a checkpoint's recomputation).
    output: Option<u64>,
}

/// References the training loop keeps from one step to the next (Python names rebound later).
#[derive(Default)]
struct Carried {
    idx: Option<u64>,
    targets: Option<u64>,
    logits: Option<u64>,
    loss: Option<u64>,
}

pub struct TransformerGen {
    spec: TransformerSpec,
    layout: ParamLayout,
    rng: ChaCha8Rng,
    seq: LengthSampler,
    e: Emitter,
    params: Vec<u64>,
    grads: Vec<Option<u64>>,
    optimizer_state: Vec<u64>,
    workspace: Option<u64>,
    carried: Carried,
    /// Autocast's cast cache of this forward: bias casts (and weight casts nobody saved), freed
    /// when the autocast region exits.
    cast_cache: Vec<u64>,
    /// The residual gradient's cast to the compute dtype, made before a checkpointed block's
    /// recomputation (it is its own autograd node, run before the first unpack).
    early_grad_cast: Option<u64>,
    /// The next linear backward's input gradient, when cast, is summed in place into an
    /// earlier one (shared inputs under autocast).
    merge_input_grad: bool,
    /// A checkpointed block's arguments (its input, rotary tables), released inside its first
    /// norm's backward.
    checkpoint_args: Vec<u64>,
    ddp: Option<DdpState>,
    fsdp: Option<FsdpState>,
    /// FSDP's casts of the rotary tables for the block about to run without checkpointing: q's
    /// rotary embedding saves them (its backward, the later one, frees them).
    block_rope_casts: Option<[u64; 2]>,
    /// The next batch, already copied on the prefetch stream: (token ids, targets).
    prefetched: Option<(u64, u64)>,
    /// The next step's sequence length, drawn when its batch was prefetched.
    next_len: Option<u64>,
    next_step: u64,
    started: bool,
    finished: bool,
    /// The math of the steps generated so far ([`training_step_flops`]).
    flops: f64,
}

/// The stream DDP's collectives run on (ProcessGroupNCCL's NCCL stream).
pub const DDP_COMM_STREAM: u64 = 1;
/// The side stream a data prefetcher copies batches on.
pub const PREFETCH_STREAM: u64 = 2;
/// DDP's `broadcast_bucket_size` (250 MiB): its parameters are broadcast at construction in flat
/// chunks of at most this (`_broadcast_coalesced`).
const DDP_BROADCAST_BUCKET_BYTES: u64 = 250 << 20;
/// `dist._DEFAULT_FIRST_BUCKET_BYTES`.
const DDP_FIRST_BUCKET_BYTES: u64 = 1 << 20;

/// The stream FSDP2's all-gathers run on (its `all_gather_stream`; outputs allocated there).
pub const FSDP_ALL_GATHER_STREAM: u64 = 3;
/// The stream FSDP2's reduce-scatters run on (the reduced shards allocated there).
pub const FSDP_REDUCE_SCATTER_STREAM: u64 = 4;

/// FSDP2's state over a step (`_fsdp_param_group.py`, `_fsdp_collectives.py`).
struct FsdpState {
    layout: FsdpLayout,
    /// Each group's gathered parameters while unsharded (module order).
    unsharded: Vec<Option<Vec<u64>>>,
    /// All-gathers issued and not yet copied out: each group's output.
    pending: Vec<Option<u64>>,
    /// A forward all-gather's output, kept (`comm_ctx.all_gather_state`) until the next
    /// all-gather is issued or the root's forward ends, so that no record_stream is needed.
    held_output: Option<u64>,
    /// The last reduce-scatter's input, kept (`reduce_scatter_state`) until the next one
    /// starts or backward ends.
    reduce_input: Option<u64>,
    /// Each group's sharded gradient (the reduced shard) until `zero_grad`.
    sharded_grads: Vec<Option<u64>>,
    /// Forward (all-gather outputs held) or backward (freed once copied out).
    in_forward: bool,
}

/// DDP's buckets: which bucket each parameter is in, and what each still waits for this step.
struct DdpState {
    bucket_of: Vec<usize>,
    bucket_elems: Vec<u64>,
    bucket_params: Vec<usize>,
    remaining: Vec<usize>,
    ready: Vec<bool>,
    fp16_compress_hook: bool,
}

impl DdpState {
    /// `_compute_bucket_assignment_by_size` over the parameters in reverse order: a bucket
    /// closes once it holds at least its cap (1 MiB for the first, then `bucket_cap_mb`).
    fn new(elems: &[u64], grad_bytes: u64, spec: &DdpSpec) -> Self {
        let cap = (spec.bucket_cap_mb * (1u64 << 20) as f64) as u64;
        let mut bucket_of = vec![0; elems.len()];
        let (mut bucket_elems, mut bucket_params) = (vec![0u64], vec![0usize]);
        for i in (0..elems.len()).rev() {
            let b = bucket_elems.len() - 1;
            let limit = if b == 0 { DDP_FIRST_BUCKET_BYTES } else { cap };
            bucket_of[i] = b;
            bucket_elems[b] += elems[i];
            bucket_params[b] += 1;
            if bucket_elems[b] * grad_bytes >= limit && i > 0 {
                bucket_elems.push(0);
                bucket_params.push(0);
            }
        }
        let remaining = bucket_params.clone();
        DdpState { bucket_of, bucket_elems, bucket_params, remaining, ready: vec![false; elems.len()], fp16_compress_hook: spec.fp16_compress_hook }
    }
}

impl TransformerGen {
    pub fn new(spec: &TransformerSpec, seed: u64) -> Self {
        let layout = ParamLayout::new(&spec.model);
        let n = layout.elems.len();
        let fsdp = spec.fsdp.as_ref().map(|f| {
            let layout = FsdpLayout::new(&layout, f.world_size);
            let groups = layout.groups.len();
            FsdpState {
                layout,
                unsharded: vec![None; groups],
                pending: vec![None; groups],
                held_output: None,
                reduce_input: None,
                sharded_grads: vec![None; groups],
                in_forward: true,
            }
        });
        TransformerGen {
            seq: LengthSampler::new(&spec.seq_len),
            spec: spec.clone(),
            layout,
            rng: ChaCha8Rng::seed_from_u64(seed),
            e: Emitter::default(),
            params: Vec::with_capacity(n),
            grads: vec![None; n],
            optimizer_state: Vec::new(),
            workspace: None,
            carried: Carried::default(),
            cast_cache: Vec::new(),
            early_grad_cast: None,
            merge_input_grad: false,
            checkpoint_args: Vec::new(),
            ddp: None,
            fsdp,
            block_rope_casts: None,
            prefetched: None,
            next_len: None,
            next_step: 1,
            started: false,
            finished: false,
            flops: 0.0,
        }
    }

    fn alloc(&mut self, bytes: u64) -> u64 {
        self.e.alloc(bytes)
    }

    fn free(&mut self, id: u64) {
        self.e.free(id)
    }

    fn free_opt(&mut self, id: Option<u64>) {
        if let Some(id) = id {
            self.e.free(id)
        }
    }

    /// A matmul: the first one of the run allocates the stream's cuBLAS workspace, or each one
    /// takes its own after its output and frees it as it returns (torch 2.15's default).
    fn matmul(&mut self, bytes: u64) -> u64 {
        let ws = self.spec.cublas_workspace.map(|b| b.0).unwrap_or(DEFAULT_CUBLAS_WORKSPACE);
        if self.spec.cublas_workspace_per_call {
            let out = self.e.alloc(bytes);
            if ws > 0 {
                let w = self.e.alloc(ws);
                self.e.free(w);
            }
            return out;
        }
        if self.workspace.is_none() && ws > 0 {
            self.workspace = Some(self.e.alloc(ws));
        }
        self.e.alloc(bytes)
    }

    /// A cuBLASLt matmul (a Linear's fused-bias addmm): with per-call workspaces it takes
    /// `CUBLASLT_WORKSPACE_SIZE` (1 MiB) after its output; a kept workspace is the stream's
    /// cuBLAS one (`TORCH_CUBLASLT_UNIFIED_WORKSPACE`).
    fn matmul_lt(&mut self, bytes: u64) -> u64 {
        if !self.spec.cublas_workspace_per_call {
            return self.matmul(bytes);
        }
        let out = self.e.alloc(bytes);
        let w = self.e.alloc(DEFAULT_CUBLASLT_WORKSPACE);
        self.e.free(w);
        out
    }

    /// Hands a gradient of parameter `i` (`tmp`, elements of `tmp_bytes`) to AccumulateGrad: cast
    /// to the gradient dtype when it differs, stolen as `.grad` when there is none yet, else
    /// added in place and freed.
    fn accumulate(&mut self, dm: Dims, i: usize, tmp: u64, tmp_bytes: u64) {
        let mut g = tmp;
        if tmp_bytes != dm.g {
            g = self.alloc(self.layout.elems[i] * dm.g);
            self.free(tmp);
        }
        match self.grads[i] {
            None => self.grads[i] = Some(g),
            Some(_) => self.free(g),
        }
        self.ddp_grad_ready(i);
    }

    /// DDP's autograd hook: the gradient is copied into its bucket (a view of the persistent
    /// buffer); the bucket's last gradient launches its all-reduce on the NCCL stream. With the
    /// fp16 compression hook the bucket is cast (a new tensor on the default stream) and the
    /// collective records its use (recordStream), so its free waits for the NCCL stream.
    fn ddp_grad_ready(&mut self, i: usize) {
        let Some(ddp) = self.ddp.as_mut() else { return };
        if std::mem::replace(&mut ddp.ready[i], true) {
            return;
        }
        let b = ddp.bucket_of[i];
        ddp.remaining[b] -= 1;
        if ddp.remaining[b] == 0 && ddp.fp16_compress_hook {
            let compressed = self.e.alloc(ddp.bucket_elems[b] * 2);
            self.e.record_stream(compressed, DDP_COMM_STREAM);
            self.e.free(compressed);
        }
    }

    /// DDP's construction: a persistent buffer per bucket, and the parameters broadcast from
    /// rank 0 in flat chunks (`_broadcast_coalesced`: flatten, broadcast on the NCCL stream,
    /// copy back, free), whose frees wait for the NCCL stream.
    fn ddp_init(&mut self, spec: &DdpSpec) {
        let grad_bytes = self.spec.grad_dtype.unwrap_or(self.spec.param_dtype).bytes();
        let pb = self.spec.param_dtype.bytes();
        let ddp = DdpState::new(&self.layout.elems, grad_bytes, spec);
        let mut chunk = 0u64;
        for e in self.layout.elems.clone() {
            if chunk > 0 && chunk + e * pb > DDP_BROADCAST_BUCKET_BYTES {
                self.ddp_broadcast(chunk);
                chunk = 0;
            }
            chunk += e * pb;
        }
        self.ddp_broadcast(chunk);
        for b in 0..ddp.bucket_elems.len() {
            self.e.alloc(ddp.bucket_elems[b] * grad_bytes);
        }
        self.e.sync(Some(DDP_COMM_STREAM));
        self.ddp = Some(ddp);
    }

    fn ddp_broadcast(&mut self, bytes: u64) {
        let flat = self.e.alloc(bytes);
        self.e.record_stream(flat, DDP_COMM_STREAM);
        self.e.free(flat);
    }

    /// Issues group `g`'s all-gather unless it is unsharded or already issued: the output for
    /// every rank on the all-gather stream; when the shards are cast to the gathered dtype (`a`
    /// bytes), their cast is one flat input before it, dying once copied in (without a cast
    /// the shards are copied into the output's own slice).
    fn fsdp_unshard(&mut self, g: usize, a: u64) {
        let cast = self.spec.param_dtype.bytes() != a;
        let Some(f) = self.fsdp.as_mut() else { return };
        if f.unsharded[g].is_some() || f.pending[g].is_some() {
            return;
        }
        let shard = f.layout.groups[g].shard_total() * a;
        let input = cast.then(|| self.e.alloc_on(shard, FSDP_ALL_GATHER_STREAM));
        let output = self.e.alloc_on(shard * f.layout.world, FSDP_ALL_GATHER_STREAM);
        if let Some(input) = input {
            self.e.free(input);
        }
        f.pending[g] = Some(output);
    }

    /// Waits for group `g`'s all-gather and copies it out (`wait_for_unshard`): in forward the
    /// previous group's held output released first; one unsharded tensor per parameter
    /// (`alloc_storage`, padded size), the copy's metadata; in backward the output dies at
    /// once, in forward it is held until the next group's wait.
    fn fsdp_copy_out(&mut self, g: usize, a: u64) {
        self.fsdp_unshard(g, a);
        let Some(f) = self.fsdp.as_mut() else { return };
        let Some(output) = f.pending[g].take() else { return };
        if f.in_forward {
            if let Some(held) = f.held_output.take() {
                self.e.free(held);
            }
        }
        let world = f.layout.world;
        let group = &f.layout.groups[g];
        let params: Vec<u64> = group.shard_elems.iter().map(|&e| self.e.alloc(e * world * a)).collect();
        let meta = self.e.alloc(group.copy_out_metadata_bytes(world, a));
        self.e.free(meta);
        if f.in_forward {
            if let Some(old) = f.held_output.replace(output) {
                self.e.free(old);
            }
        } else {
            self.e.free(output);
        }
        f.unsharded[g] = Some(params);
    }

    /// Frees group `g`'s gathered parameters, in module order.
    fn fsdp_reshard(&mut self, g: usize) {
        let Some(f) = self.fsdp.as_mut() else { return };
        if let Some(params) = f.unsharded[g].take() {
            self.e.free_all(params);
        }
    }

    /// A group's pre-forward hook: gathered and copied out, then the next
    /// `forward_prefetch` blocks' all-gathers issued.
    fn fsdp_pre_forward(&mut self, g: usize, a: u64) {
        let Some(f) = self.fsdp.as_mut() else { return };
        if g == 0 {
            f.in_forward = true;
        }
        let ahead = self.spec.fsdp.as_ref().map_or(0, |s| s.forward_prefetch as usize);
        let groups = f.layout.groups.len();
        self.fsdp_copy_out(g, a);
        if g > 0 {
            for next in (g + 1..groups).take(ahead) {
                self.fsdp_unshard(next, a);
            }
        }
    }

    /// A block's post-forward hook: resharded unless `reshard_after_forward` is off.
    fn fsdp_post_forward(&mut self, g: usize) {
        if self.spec.fsdp.as_ref().is_some_and(|f| f.reshard_after_forward) {
            self.fsdp_reshard(g);
        }
    }

    /// The root's post-forward: resharded like the blocks (torch 2.15 honours the root's
    /// `reshard_after_forward`), and the last held all-gather output released.
    fn fsdp_root_post_forward(&mut self) {
        self.fsdp_post_forward(0);
        if let Some(held) = self.fsdp.as_mut().and_then(|f| f.held_output.take()) {
            self.e.free(held);
        }
    }

    /// A group's pre-backward hook: gathered again (unless kept from forward), then the next
    /// `backward_prefetch` blocks in backward order issued (the root's implicit prefetch: the
    /// last block, whatever the blocks' setting).
    fn fsdp_pre_backward(&mut self, g: usize, a: u64) {
        let Some(f) = self.fsdp.as_mut() else { return };
        f.in_forward = false;
        let ahead = if g == 0 { 1 } else { self.spec.fsdp.as_ref().map_or(0, |s| s.backward_prefetch as usize) };
        let blocks = f.layout.groups.len() - 1;
        self.fsdp_copy_out(g, a);
        let first = if g == 0 { blocks } else { g - 1 };
        for next in (1..=first).rev().take(ahead) {
            self.fsdp_unshard(next, a);
        }
    }

    /// A group's post-backward (`foreach_reduce`): resharded; the previous reduce-scatter's
    /// input released; its gradients concatenated in the reduce dtype (`_chunk_cat`, padded to
    /// every rank's shard) and freed (a list dies from its end: reverse module order); the
    /// reduced shard allocated on the reduce-scatter stream and cast to the parameters' dtype
    /// when the reduce dtype differs. It is the sharded `.grad` until `zero_grad`.
    fn fsdp_post_backward(&mut self, g: usize, reduce: u64, param: u64) {
        if self.fsdp.is_none() {
            return;
        }
        self.fsdp_reshard(g);
        let Some(f) = self.fsdp.as_mut() else { return };
        if let Some(input) = f.reduce_input.take() {
            self.e.free(input);
        }
        let group = &f.layout.groups[g];
        let shard = group.shard_total();
        let input = self.e.alloc(shard * f.layout.world * reduce);
        let meta = self.e.alloc(group.chunk_cat_metadata_bytes(reduce));
        self.e.free(meta);
        for &i in group.params.iter().rev() {
            if let Some(grad) = self.grads[i].take() {
                self.e.free(grad);
            }
        }
        let mut reduced = self.e.alloc_on(shard * reduce, FSDP_REDUCE_SCATTER_STREAM);
        if reduce != param {
            let cast = self.e.alloc_on(shard * param, FSDP_REDUCE_SCATTER_STREAM);
            self.e.free(reduced);
            reduced = cast;
        }
        // Without zero_grad since the last step the reduced shard is added in place.
        if f.sharded_grads[g].is_some() {
            self.e.free(reduced);
        } else {
            f.sharded_grads[g] = Some(reduced);
        }
        f.reduce_input = Some(input);
    }

    /// The reduce-scatter's dtype and the sharded parameters' (bytes).
    fn fsdp_dtypes(&self) -> (u64, u64) {
        let reduce = self.spec.fsdp.as_ref().and_then(|f| f.reduce_dtype).unwrap_or(self.spec.activation_dtype);
        (reduce.bytes(), self.spec.param_dtype.bytes())
    }

    /// The tensors the optimizer steps, in `model.parameters()` order, by elements: under FSDP
    /// each parameter's padded shard, in module order.
    fn optimizer_tensors(&self) -> Vec<u64> {
        match &self.fsdp {
            Some(f) => f.layout.module_order().into_iter().map(|(_, e)| e).collect(),
            None => self.layout.elems.clone(),
        }
    }

    /// Backward's final callback: the last reduce-scatter's input released.
    fn fsdp_end_backward(&mut self) {
        if let Some(input) = self.fsdp.as_mut().and_then(|f| f.reduce_input.take()) {
            self.e.free(input);
        }
    }

    /// The batch copied to the GPU on the prefetch stream.
    fn prefetch_batch(&mut self, tokens: u64) -> (u64, u64) {
        (self.e.alloc_on(tokens * INT64, PREFETCH_STREAM), self.e.alloc_on(tokens * INT64, PREFETCH_STREAM))
    }

    /// `F.linear` on `tokens` rows of an input of `x_bytes` elements. Under autocast the bias and
    /// weight are cast (the bias cast only lives in autocast's cache) and a wider input is cast.
    /// `raw` is the input to keep when no cast is made and this linear frees it in backward.
    fn linear_fwd(&mut self, dm: Dims, lin: Linear, x_bytes: u64, tokens: u64, raw: Option<u64>) -> (u64, LinSaved) {
        let mut saved = LinSaved { input: raw, weight: None };
        if dm.autocast {
            if lin.bias.is_some() {
                let c = self.alloc(lin.out * dm.a);
                self.cast_cache.push(c);
            }
            saved.weight = Some(self.alloc(lin.out * lin.inp * dm.a));
            if x_bytes != dm.a {
                saved.input = Some(self.alloc(tokens * lin.inp * dm.a));
            }
        }
        // A biased Linear is one fused addmm through cuBLASLt.
        let out = if lin.bias.is_some() { self.matmul_lt(tokens * lin.out * dm.a) } else { self.matmul(tokens * lin.out * dm.a) };
        (out, saved)
    }

    /// Backward of a linear given the output gradient `g` (elements of `g_bytes`; freed here when
    /// `g_owned`). Returns the input gradient in the input's dtype `x_bytes`.
    #[allow(clippy::too_many_arguments)]
    fn linear_bwd(&mut self, dm: Dims, lin: Linear, saved: LinSaved, g: u64, g_bytes: u64, g_owned: bool, tokens: u64, x_bytes: u64) -> u64 {
        let a = dm.a;
        let early = self.early_grad_cast.take();
        let g_cast = (g_bytes != a).then(|| early.unwrap_or_else(|| self.alloc(tokens * lin.out * a)));
        // addmm computes the input gradient first; a bias-less matmul the weight gradient first.
        let (gi, gw, gb) = if lin.bias.is_some() {
            let gi = self.matmul(tokens * lin.inp * a);
            let gw = self.matmul(lin.out * lin.inp * a);
            let gb = self.alloc(lin.out * a);
            (gi, gw, Some(gb))
        } else {
            let gw = self.matmul(lin.out * lin.inp * a);
            let gi = self.matmul(tokens * lin.inp * a);
            (gi, gw, None)
        };
        self.free_opt(g_cast);
        if g_owned {
            self.free(g);
        }
        if lin.bias.is_some() {
            self.free_opt(saved.input);
            self.free_opt(saved.weight);
        } else {
            self.free_opt(saved.weight);
            self.free_opt(saved.input);
        }
        let mut gi = gi;
        let merge = std::mem::take(&mut self.merge_input_grad);
        if x_bytes != a {
            let c = self.alloc(tokens * lin.inp * x_bytes);
            self.free(gi);
            gi = c;
            if merge {
                // Added in place into the input's gradient buffer (a fresh cast can be).
                self.free(gi);
            }
        }
        self.accumulate(dm, lin.weight, gw, a);
        if let (Some(bi), Some(gb)) = (lin.bias, gb) {
            self.accumulate(dm, bi, gb, a);
        }
        gi
    }

    /// LayerNorm (GELU models) or the Llama RMSNorm, on the residual stream `x` (param dtype).
    /// Returns the output and what backward needs: a LayerNorm keeps `x`, an RMSNorm its fp32
    /// copy (`x` itself when that is fp32 already).
    fn norm_fwd(&mut self, dm: Dims, x: u64) -> (u64, NormSaved) {
        let (t, d) = (dm.t, dm.d);
        match self.spec.model.ffn_kind {
            FfnKind::Gelu => {
                let out = self.alloc(t * d * dm.p);
                let mean = self.alloc(t * FP32);
                let rstd = self.alloc(t * FP32);
                (out, NormSaved { input: Some(x), stats: vec![mean, rstd], normed: None })
            }
            FfnKind::Swiglu => {
                // h = x.float(); h * rsqrt(h.pow(2).mean(-1) + eps), type_as(x), * weight.
                let (h32, rs) = self.rms_stats(dm);
                let mut normed = self.alloc(t * d * FP32);
                if dm.p != FP32 {
                    let c = self.alloc(t * d * dm.p);
                    self.free(normed);
                    normed = c;
                }
                let out = self.alloc(t * d * dm.p);
                (out, NormSaved { input: h32.or(Some(x)), stats: vec![rs], normed: Some(normed) })
            }
        }
    }

    /// Backward of a norm given `g` (owned, param dtype); frees what the norm saved. Returns the
    /// input gradient, or none when `into_residual`: the engine adds it in place into the
    /// residual stream's gradient buffer and frees it.
    fn norm_bwd(&mut self, dm: Dims, norm: Norm, saved: NormSaved, g: u64, into_residual: bool) -> Option<u64> {
        let (t, d, p) = (dm.t, dm.d, dm.p);
        match self.spec.model.ffn_kind {
            FfnKind::Gelu => {
                let gx = self.alloc(t * d * p);
                let gw = self.alloc(d * p);
                let gb = norm.bias.map(|_| self.alloc(d * p));
                self.free(g);
                self.free_opt(saved.input);
                self.free_all(saved.stats);
                self.accumulate(dm, norm.weight, gw, p);
                if let (Some(bi), Some(gb)) = (norm.bias, gb) {
                    self.accumulate(dm, bi, gb, p);
                }
                if into_residual {
                    self.free(gx);
                    return None;
                }
                Some(gx)
            }
            FfnKind::Swiglu => {
                // out = normed * weight
                let gwp = self.alloc(t * d * p);
                let gn = self.alloc(t * d * p);
                let gw = self.alloc(d * p);
                // The weight's gradient sums gwp over the tokens: a reduction split across
                // blocks stages partial sums in global memory (kernel scratch).
                if self.spec.kernel_scratch {
                    if let Some((staging, semaphores)) = outer_sum_scratch(d, t) {
                        let staging = self.alloc(staging);
                        let semaphores = self.alloc(semaphores);
                        self.free(semaphores);
                        self.free(staging);
                    }
                }
                self.free(gwp);
                self.free(g);
                self.free_opt(saved.normed);
                self.accumulate(dm, norm.weight, gw, p);
                let mut gn = gn;
                if p != FP32 {
                    let c = self.alloc(t * d * FP32);
                    self.free(gn);
                    gn = c;
                }
                // normed = h * rs
                let ghr = self.alloc(t * d * FP32);
                let gh = self.alloc(t * d * FP32);
                let grs = self.alloc(t * FP32);
                self.free(ghr);
                self.free(gn);
                // An fp32 RMSNorm's input is the residual itself: its gradient parts go straight
                // into the residual's buffer.
                let direct = p == FP32 && into_residual;
                if direct {
                    self.free(gh);
                }
                // rs = rsqrt(mean + eps)
                let pw = self.alloc(t * FP32);
                let ms = self.alloc(t * FP32);
                let gm = self.alloc(t * FP32);
                self.free(ms);
                self.free(pw);
                self.free(grs);
                self.free_all(saved.stats);
                // mean(h²)
                let gdiv = self.alloc(t * d * FP32);
                self.free(gm);
                let pw2 = self.alloc(t * d * FP32);
                let ms2 = self.alloc(t * d * FP32);
                let gh2 = self.alloc(t * d * FP32);
                self.free(ms2);
                self.free(pw2);
                self.free(gdiv);
                self.free_opt(saved.input);
                // A checkpoint lets go of its arguments with the last saved tensor it hands out.
                let args = std::mem::take(&mut self.checkpoint_args);
                self.free_all(args);
                self.free(gh2);
                if direct {
                    return None;
                }
                let mut gx = gh;
                if p != FP32 {
                    gx = self.alloc(t * d * p);
                    self.free(gh);
                }
                if into_residual {
                    self.free(gx);
                    return None;
                }
                Some(gx)
            }
        }
    }

    fn free_all(&mut self, ids: impl IntoIterator<Item = u64>) {
        self.e.free_all(ids)
    }

    /// Flash attention's RNG state on the device (`philox_seed`, `philox_offset`: 16 and 8
    /// bytes, made whatever the dropout), kept with the logsumexp; only with `kernel_scratch`.
    fn flash_rng_state(&mut self) -> Vec<u64> {
        if self.spec.kernel_scratch {
            vec![self.alloc(16), self.alloc(8)]
        } else {
            Vec::new()
        }
    }

    /// SDPA's forward on `elems` = B·S·D outputs: flash keeps the output, a B·H·S fp32
    /// logsumexp and its RNG state; the math path the output and the B·H·S² probabilities.
    fn sdpa_fwd(&mut self, dm: Dims, elems: u64) -> (u64, u64, Vec<u64>) {
        let a = dm.a;
        match self.spec.attention {
            Attention::Flash => {
                let out = self.alloc(elems * a);
                let lse = self.alloc(dm.b * dm.h * dm.s * FP32);
                (out, lse, self.flash_rng_state())
            }
            Attention::Math => {
                let scores = self.matmul(dm.scores() * a);
                let probs = self.alloc(dm.scores() * a);
                self.free(scores);
                (self.matmul(elems * a), probs, Vec::new())
            }
        }
    }

    /// Rotary embedding of q or k (`elems` = B·S·D): `cat(x1·cos − x2·sin, x2·cos + x1·sin)`
    /// with cos/sin cast to the compute dtype each call (saved until backward). Under FSDP the
    /// block's inputs arrive cast already (MixedPrecisionPolicy's `cast_forward_inputs`): the
    /// casts are no-ops.
    fn rope_fwd(&mut self, dm: Dims, elems: u64) -> (u64, Option<[u64; 2]>) {
        let a = dm.a;
        let half_dim = self.spec.model.d_model / self.spec.model.heads / 2;
        // (The tables are fp32: in fp32 the casts are no-ops too.)
        let tables = (self.spec.fsdp.is_none() && a != FP32).then(|| [self.alloc(dm.s * half_dim * a), self.alloc(dm.s * half_dim * a)]);
        let half = elems / 2 * a;
        let m1 = self.alloc(half);
        let m2 = self.alloc(half);
        let sub = self.alloc(half);
        self.free(m1);
        self.free(m2);
        let m3 = self.alloc(half);
        let m4 = self.alloc(half);
        let add = self.alloc(half);
        self.free(m3);
        self.free(m4);
        let out = self.alloc(elems * a);
        self.free(add);
        self.free(sub);
        (out, tables)
    }

    /// Grouped-query attention's `k.repeat_interleave(heads // kv_heads, dim=1)`, then v's: each
    /// a new (B, H, S, d) tensor, the narrower one dying as Python rebinds the name (SDPA saves
    /// the repeated ones). Without it, k and v are what SDPA gets.
    fn repeat_kv(&mut self, dm: Dims, k: u64, v: u64) -> (u64, u64) {
        if dm.kv == dm.d {
            return (k, v);
        }
        let k_rep = self.alloc(dm.t * dm.d * dm.a);
        self.free(k);
        let v_rep = self.alloc(dm.t * dm.d * dm.a);
        self.free(v);
        (k_rep, v_rep)
    }

    /// Backward of [`Self::rope_fwd`] given `g` (owned); returns the gradient of the input.
    fn rope_bwd(&mut self, dm: Dims, elems: u64, tables: Option<[u64; 2]>, g: u64) -> u64 {
        let half = elems / 2 * dm.a;
        let a1 = self.alloc(half);
        let b1 = self.alloc(half);
        let neg = self.alloc(half);
        let c1 = self.alloc(half);
        self.free(neg);
        self.free_opt(tables.map(|t| t[1]));
        self.free(c1);
        let e1 = self.alloc(half);
        self.free(g);
        self.free_opt(tables.map(|t| t[0]));
        self.free(e1);
        let s1 = self.alloc(elems * dm.a);
        self.free(b1);
        let s2 = self.alloc(elems * dm.a);
        self.free(a1);
        self.free(s2);
        s1
    }

    /// GPT's explicit attention on the fused QKV output: `softmax((q @ kᵀ) * scale
    /// .masked_fill(mask)) @ v` with the contiguous copies bmm needs. Returns what backward
    /// keeps, the output `y` (B, S, D) and the module's locals that die at its return.
    fn math_attention(&mut self, dm: Dims) -> (AttnSaved, u64, Vec<u64>) {
        let (t, d, a, sm) = (dm.t, dm.d, dm.a, dm.sm);
        let n = dm.scores();
        let q = self.alloc(t * d * a);
        let k = self.alloc(t * d * a);
        let sc = self.matmul(n * a);
        let scaled = self.alloc(n * a);
        self.free(sc);
        let masked = self.alloc(n * a);
        let up = dm.autocast.then(|| self.alloc(n * FP32));
        let probs = self.alloc(n * sm);
        self.free_opt(up);
        self.free(masked);
        self.free(scaled);
        let mut locals = Vec::new();
        let (mut dropped, mut drop_mask) = (None, None);
        if dm.dropout {
            // native_dropout: output and bool mask.
            let out = self.alloc(n * sm);
            drop_mask = Some(self.alloc(n * BOOL));
            if dm.autocast {
                locals.push(out);
            } else {
                dropped = Some(out);
            }
        }
        let probs_mm = dm.autocast.then(|| self.alloc(n * a));
        let v = self.alloc(t * d * a);
        let ybmm = self.matmul(t * d * a);
        let y = self.alloc(t * d * a);
        locals.push(ybmm);
        (AttnSaved::Math { q, k, v, probs, probs_mm, dropped, drop_mask }, y, locals)
    }

    /// One block's forward on the residual stream `x` (param dtype). `recompute`: a checkpoint's
    /// recomputation in backward (no output; the input stays with the checkpoint).
    fn block_fwd(&mut self, dm: Dims, bp: &BlockParams, x: u64, recompute: bool) -> BlockSaved {
        let (t, d, a, p) = (dm.t, dm.d, dm.a, dm.p);
        let gelu = self.spec.model.ffn_kind == FfnKind::Gelu;
        let (n1_out, n1) = self.norm_fwd(dm, x);
        // Without autocast the projections keep the norm output itself (the last one to run
        // backward frees it); under autocast they keep its cast and the output dies here.
        let keep = !dm.autocast;
        let mut qkv_saved = Vec::new();
        let (attn, y, y_owned) = if gelu {
            let (qkv, s) = self.linear_fwd(dm, bp.qkv[0], p, t, keep.then_some(n1_out));
            qkv_saved.push(s);
            match self.spec.attention {
                Attention::Math => {
                    let (attn, y, locals) = self.math_attention(dm);
                    // Dies with the module's locals: the QKV output (only views were used),
                    // then the rest.
                    let mut dying = vec![qkv];
                    dying.extend(locals);
                    (attn, y, Some(dying))
                }
                Attention::Flash => {
                    // SDPA takes the strided q, k, v views and writes (B, S, H, d) directly.
                    let out = self.alloc(t * d * a);
                    let lse = self.alloc(dm.b * dm.h * dm.s * FP32);
                    let rng = self.flash_rng_state();
                    (AttnSaved::Flash { q: qkv, k: qkv, v: qkv, qkv: Some(qkv), out, lse, rng, rope: [None, None] }, out, None)
                }
            }
        } else {
            let mut outs = Vec::new();
            for (j, lin) in bp.qkv.iter().enumerate() {
                let (o, s) = self.linear_fwd(dm, *lin, p, t, (keep && j == 0).then_some(n1_out));
                qkv_saved.push(s);
                outs.push(o);
            }
            let (q_rot, qt) = self.rope_fwd(dm, t * d);
            let qt = qt.or(self.block_rope_casts.take());
            let (k_rot, kt) = self.rope_fwd(dm, t * dm.kv);
            self.free(outs[1]);
            self.free(outs[0]);
            let (k, v) = self.repeat_kv(dm, k_rot, outs[2]);
            let (out, lse, rng) = self.sdpa_fwd(dm, t * d);
            // (B, H, S, d) output transposed back to (B, S, D): a copy.
            let y = self.alloc(t * d * a);
            (AttnSaved::Flash { q: q_rot, k, v, qkv: None, out, lse, rng, rope: [qt, kt] }, y, Some(Vec::new()))
        };
        let (proj, proj_saved) = self.linear_fwd(dm, bp.attn_out, a, t, y_owned.is_some().then_some(y));
        self.free_all(y_owned.unwrap_or_default());
        if !keep {
            self.free(n1_out);
        }
        let x1 = self.alloc(t * d * p);
        self.free(proj);

        let (n2_out, n2) = self.norm_fwd(dm, x1);
        let mut up_saved = Vec::new();
        let mut mlp = Vec::new();
        if gelu {
            let (hpre, s) = self.linear_fwd(dm, bp.up[0], p, t, keep.then_some(n2_out));
            up_saved.push(s);
            let act = self.alloc(t * dm.f * a);
            mlp.extend([hpre, act]);
        } else {
            let (gate, s) = self.linear_fwd(dm, bp.up[0], p, t, keep.then_some(n2_out));
            up_saved.push(s);
            let silu = self.alloc(t * dm.f * a);
            let (up, s) = self.linear_fwd(dm, bp.up[1], p, t, None);
            up_saved.push(s);
            let prod = self.alloc(t * dm.f * a);
            mlp.extend([gate, silu, up, prod]);
        }
        let down_in = *mlp.last().expect("an MLP has an activation");
        let (down_saved, output) = if recompute {
            // Checkpoint recomputation stops early, once every tensor backward needs exists:
            // the down projection's matmul and the residual add do not run again.
            let mut sv = LinSaved { input: Some(down_in), weight: None };
            if dm.autocast {
                if bp.down.bias.is_some() {
                    let c = self.alloc(bp.down.out * a);
                    self.cast_cache.push(c);
                }
                sv.weight = Some(self.alloc(bp.down.out * bp.down.inp * a));
            }
            if !keep {
                self.free(n2_out);
            }
            (sv, None)
        } else {
            let (down, sv) = self.linear_fwd(dm, bp.down, a, t, Some(down_in));
            if !keep {
                self.free(n2_out);
            }
            let output = self.alloc(t * d * p);
            self.free(down);
            (sv, Some(output))
        };
        if !gelu && p != FP32 {
            // The block's locals die: the attention residual and the input (RMSNorm kept fp32
            // copies of them).
            self.free(x1);
            if !recompute {
                self.free(x);
            }
        }
        BlockSaved { n1, qkv: qkv_saved, attn, proj: proj_saved, n2, up: up_saved, mlp, down: down_saved, output }
    }

    /// A checkpointed SwiGLU block's forward: nothing is saved, so every tensor dies where Python
    /// drops its last reference (norm statistics at once, temporaries after their consumer, the
    /// block's locals at its return). The input stays with the checkpoint. Returns the output.
    fn swiglu_block_fwd_unsaved(&mut self, dm: Dims, bp: &BlockParams, x: u64) -> u64 {
        let (t, d, a, p) = (dm.t, dm.d, dm.a, dm.p);
        let n1_out = self.rms_norm_unsaved(dm, x);
        let mut outs = Vec::new();
        for lin in &bp.qkv {
            let (o, s) = self.linear_fwd(dm, *lin, p, t, None);
            self.drop_saved(s);
            outs.push(o);
        }
        let (q_rot, tables) = self.rope_fwd(dm, t * d);
        self.free_all(tables.into_iter().flatten());
        let (k_rot, tables) = self.rope_fwd(dm, t * dm.kv);
        self.free_all(tables.into_iter().flatten());
        self.free(outs[1]);
        self.free(outs[0]);
        let (k, v) = self.repeat_kv(dm, k_rot, outs[2]);
        let (out, lse, rng) = self.sdpa_fwd(dm, t * d);
        self.free(lse);
        self.free_all(rng);
        let y = self.alloc(t * d * a);
        let (proj, s) = self.linear_fwd(dm, bp.attn_out, a, t, None);
        self.drop_saved(s);
        self.free(y);
        self.free_all([q_rot, k, v, out, n1_out]);
        let x1 = self.alloc(t * d * p);
        self.free(proj);
        let n2_out = self.rms_norm_unsaved(dm, x1);
        let (gate, s) = self.linear_fwd(dm, bp.up[0], p, t, None);
        self.drop_saved(s);
        let silu = self.alloc(t * dm.f * a);
        self.free(gate);
        let (up, s) = self.linear_fwd(dm, bp.up[1], p, t, None);
        self.drop_saved(s);
        let prod = self.alloc(t * dm.f * a);
        self.free(silu);
        self.free(up);
        let (down, s) = self.linear_fwd(dm, bp.down, a, t, None);
        self.drop_saved(s);
        self.free(prod);
        let output = self.alloc(t * d * p);
        self.free(down);
        self.free(x1);
        self.free(n2_out);
        output
    }

    /// A checkpointed GELU block's forward: nothing is saved (see
    /// [`Self::swiglu_block_fwd_unsaved`]). Returns the output.
    fn gelu_block_fwd_unsaved(&mut self, dm: Dims, bp: &BlockParams, x: u64) -> u64 {
        let (t, d, a, p) = (dm.t, dm.d, dm.a, dm.p);
        let ln1 = self.layer_norm_unsaved(dm);
        let (qkv, s) = self.linear_fwd(dm, bp.qkv[0], p, t, None);
        self.drop_saved(s);
        let mut dying = vec![qkv];
        let y = match self.spec.attention {
            Attention::Math => {
                let n = dm.scores();
                let q = self.alloc(t * d * a);
                let k = self.alloc(t * d * a);
                let sc = self.matmul(n * a);
                self.free(k);
                self.free(q);
                let scaled = self.alloc(n * a);
                self.free(sc);
                let masked = self.alloc(n * a);
                let up = dm.autocast.then(|| self.alloc(n * FP32));
                let mut att = self.alloc(n * dm.sm);
                self.free_opt(up);
                self.free(masked);
                self.free(scaled);
                if dm.dropout {
                    let dropped = self.alloc(n * dm.sm);
                    let mask = self.alloc(n * BOOL);
                    self.free(mask);
                    dying.push(att);
                    att = dropped;
                }
                let att_mm = dm.autocast.then(|| self.alloc(n * a));
                let v = self.alloc(t * d * a);
                let ybmm = self.matmul(t * d * a);
                self.free(v);
                self.free_opt(att_mm);
                dying.extend([ybmm, att]);
                self.alloc(t * d * a)
            }
            Attention::Flash => {
                let out = self.alloc(t * d * a);
                let lse = self.alloc(dm.b * dm.h * dm.s * FP32);
                let rng = self.flash_rng_state();
                self.free(lse);
                self.free_all(rng);
                dying.push(out);
                out
            }
        };
        let (proj, s) = self.linear_fwd(dm, bp.attn_out, a, t, None);
        self.drop_saved(s);
        if self.spec.attention == Attention::Math {
            self.free(y);
        }
        self.free_all(dying);
        self.free(ln1);
        let x1 = self.alloc(t * d * p);
        self.free(proj);
        let ln2 = self.layer_norm_unsaved(dm);
        let (h, s) = self.linear_fwd(dm, bp.up[0], p, t, None);
        self.drop_saved(s);
        let act = self.alloc(t * dm.f * a);
        self.free(h);
        let (o, s) = self.linear_fwd(dm, bp.down, a, t, None);
        self.drop_saved(s);
        self.free(act);
        self.free(ln2);
        let output = self.alloc(t * d * p);
        self.free(o);
        self.free(x1);
        let _ = x;
        output
    }

    /// LayerNorm with nothing saved: the statistics die at once. Returns the output.
    fn layer_norm_unsaved(&mut self, dm: Dims) -> u64 {
        let out = self.alloc(dm.t * dm.d * dm.p);
        let mean = self.alloc(dm.t * FP32);
        let rstd = self.alloc(dm.t * FP32);
        self.free(mean);
        self.free(rstd);
        out
    }

    /// RMSNorm's statistics: the fp32 copy of x (when x is not fp32), then pow, mean and the eps
    /// add, each freed once the next exists; returns the copy and rsqrt's [B·S] output.
    fn rms_stats(&mut self, dm: Dims) -> (Option<u64>, u64) {
        let (t, d) = (dm.t, dm.d);
        let h32 = (dm.p != FP32).then(|| self.alloc(t * d * FP32));
        let pw = self.alloc(t * d * FP32);
        let mean = self.alloc(t * FP32);
        self.free(pw);
        let add = self.alloc(t * FP32);
        self.free(mean);
        let rs = self.alloc(t * FP32);
        self.free(add);
        (h32, rs)
    }

    /// Llama's RMSNorm with nothing saved; returns the output.
    fn rms_norm_unsaved(&mut self, dm: Dims, x: u64) -> u64 {
        let (t, d, p) = (dm.t, dm.d, dm.p);
        let (h32, rs) = self.rms_stats(dm);
        let normed = self.alloc(t * d * FP32);
        self.free(rs);
        let mut last = normed;
        if p != FP32 {
            last = self.alloc(t * d * p);
            self.free(normed);
        }
        let out = self.alloc(t * d * p);
        self.free(last);
        self.free_opt(h32);
        let _ = x;
        out
    }

    /// What a linear would save, dropped: a weight cast stays in autocast's cache, an input
    /// cast dies.
    fn drop_saved(&mut self, s: LinSaved) {
        if let Some(w) = s.weight {
            self.cast_cache.push(w);
        }
        self.free_opt(s.input);
    }

    /// A block's backward given the residual gradient `g_res` (param dtype, not owned: the
    /// branches' input gradients are summed into it in place). `mask`: math attention's causal
    /// mask, freed by the block that uses it last (block 0).
    fn block_bwd(&mut self, dm: Dims, bp: &BlockParams, sv: BlockSaved, g_res: u64, mask: Option<u64>, checkpoint_args: Vec<u64>) {
        let (t, d, a, p) = (dm.t, dm.d, dm.a, dm.p);
        let gelu = self.spec.model.ffn_kind == FfnKind::Gelu;
        let BlockSaved { n1, qkv, attn, proj, n2, up, mlp, down, .. } = sv;
        // MLP.
        let gi = self.linear_bwd(dm, bp.down, down, g_res, p, false, t, a);
        let g_n2 = if gelu {
            let gg = self.alloc(t * dm.f * a);
            self.free(gi);
            self.free(mlp[0]);
            self.linear_bwd(dm, bp.up[0], up[0], gg, a, true, t, p)
        } else {
            // prod = silu(gate) * up
            let g_up = self.alloc(t * dm.f * a);
            let g_silu = self.alloc(t * dm.f * a);
            self.free(gi);
            self.free(mlp[2]);
            self.free(mlp[1]);
            let gi_up = self.linear_bwd(dm, bp.up[1], up[1], g_up, a, true, t, p);
            let g_gate = self.alloc(t * dm.f * a);
            self.free(g_silu);
            self.free(mlp[0]);
            // Two input gradients of the shared norm output: fresh fp32 casts are summed in
            // place; bare matmul outputs (views) into a new tensor.
            self.merge_input_grad = p != a;
            let gi_gate = self.linear_bwd(dm, bp.up[0], up[0], g_gate, a, true, t, p);
            if p != a {
                gi_up
            } else {
                let sum = self.alloc(t * d * p);
                self.free(gi_up);
                self.free(gi_gate);
                sum
            }
        };
        self.norm_bwd(dm, bp.norm2, n2, g_n2, true);
        // Attention.
        let gi = self.linear_bwd(dm, bp.attn_out, proj, g_res, p, false, t, a);
        let g_n1 = match attn {
            AttnSaved::Math { q, k, v, probs, probs_mm, dropped, drop_mask } => {
                let n = dm.scores();
                let gy = self.alloc(t * d * a);
                self.free(gi);
                let gv = self.matmul(t * d * a);
                let gp = self.matmul(n * a);
                self.free(gy);
                self.free(v);
                self.free_opt(probs_mm);
                self.free_opt(dropped);
                let mut gc = gp;
                if dm.autocast {
                    let c = self.alloc(n * FP32);
                    self.free(gc);
                    gc = c;
                }
                if let Some(m) = drop_mask {
                    let c = self.alloc(n * dm.sm);
                    self.free(gc);
                    self.free(m);
                    gc = c;
                }
                let mut gs = self.alloc(n * dm.sm);
                self.free(gc);
                self.free(probs);
                if dm.autocast {
                    let c = self.alloc(n * a);
                    self.free(gs);
                    gs = c;
                }
                let gm = self.alloc(n * a);
                self.free(gs);
                self.free_opt(mask);
                let gsc = self.alloc(n * a);
                self.free(gm);
                let gq = self.matmul(t * d * a);
                let gk = self.matmul(t * d * a);
                self.free(gsc);
                self.free(k);
                self.free(q);
                let gvc = self.alloc(t * d * a);
                self.free(gv);
                let gkc = self.alloc(t * d * a);
                self.free(gk);
                let gqkv = self.alloc(t * 3 * d * a);
                self.free(gkc);
                self.free(gq);
                self.free(gvc);
                self.linear_bwd(dm, bp.qkv[0], qkv[0], gqkv, a, true, t, p)
            }
            AttnSaved::Flash { q, k, v, qkv: fused, out, lse, rng, rope } => {
                let flash = self.spec.attention == Attention::Flash;
                // One B·S·D transient the kernel makes for its inputs' layout (kernel scratch;
                // seen on PyTorch's own CUDA path, torch 2.15, for Llama's attention, whose q
                // and k the rotary embedding made contiguous, and not for GPT's, views of the
                // fused projection).
                let grad_copy = (flash && self.spec.kernel_scratch && fused.is_none()).then(|| self.alloc(t * d * a));
                let grads = [self.alloc(t * d * a), self.alloc(t * d * a), self.alloc(t * d * a)];
                if flash {
                    let scratch: Vec<u64> = flash_backward_scratch(dm.b, dm.h, dm.s, d / dm.h).into_iter().filter(|&n| n > 0).map(|n| self.alloc(n)).collect();
                    self.free_all(scratch.into_iter().rev());
                }
                self.free_opt(grad_copy);
                self.free_all(rng.into_iter().rev());
                self.free(gi);
                match fused {
                    Some(x) => self.free(x),
                    None => {
                        self.free(k);
                        self.free(q);
                        self.free(v);
                    }
                }
                self.free(lse);
                self.free(out);
                if gelu {
                    let gqkv = self.alloc(t * 3 * d * a);
                    self.free_all(grads);
                    self.linear_bwd(dm, bp.qkv[0], qkv[0], gqkv, a, true, t, p)
                } else {
                    // With grouped-query attention, repeat_interleave's backward sums each
                    // group of heads: dv, then dk (B·S·kv each).
                    let (gv, gk) = if dm.kv != d {
                        let gv = self.alloc(t * dm.kv * a);
                        self.free(grads[2]);
                        let gk = self.alloc(t * dm.kv * a);
                        self.free(grads[1]);
                        (gv, gk)
                    } else {
                        (grads[2], grads[1])
                    };
                    let gk = self.rope_bwd(dm, t * dm.kv, rope[1], gk);
                    let gq = self.rope_bwd(dm, t * d, rope[0], grads[0]);
                    // v, k then q projections; the first two input gradients are summed into a
                    // new tensor, the third in place.
                    let mut qkv = qkv;
                    // dv comes out of the kernel in the projection's layout (a grouped sum is
                    // copied contiguous); dk and dq, sliced through the rotary backward, are
                    // copied contiguous.
                    let gv = if dm.kv != d {
                        let c = self.alloc(t * dm.kv * a);
                        self.free(gv);
                        c
                    } else {
                        gv
                    };
                    let gi_v = self.linear_bwd(dm, bp.qkv[2], qkv.pop().unwrap_or_default(), gv, a, true, t, p);
                    let gk_c = self.alloc(t * dm.kv * a);
                    self.free(gk);
                    self.merge_input_grad = p != a;
                    let gi_k = self.linear_bwd(dm, bp.qkv[1], qkv.pop().unwrap_or_default(), gk_c, a, true, t, p);
                    let sum = if p != a {
                        gi_v
                    } else {
                        let sum = self.alloc(t * d * p);
                        self.free(gi_v);
                        self.free(gi_k);
                        sum
                    };
                    let gq_c = self.alloc(t * d * a);
                    self.free(gq);
                    self.merge_input_grad = p != a;
                    let gi_q = self.linear_bwd(dm, bp.qkv[0], qkv.pop().unwrap_or_default(), gq_c, a, true, t, p);
                    if p == a {
                        self.free(gi_q);
                    }
                    sum
                }
            }
        };
        self.checkpoint_args = checkpoint_args;
        self.norm_bwd(dm, bp.norm1, n1, g_n1, true);
        let left = std::mem::take(&mut self.checkpoint_args);
        self.free_all(left);
        for &i in &bp.adapters {
            let g = self.alloc(self.layout.elems[i] * dm.g);
            self.accumulate(dm, i, g, dm.g);
        }
    }

    fn dims(&self, s: u64) -> Dims {
        let spec = &self.spec;
        let m = &spec.model;
        let a = spec.activation_dtype.bytes();
        // Under FSDP the gathered parameters are in the compute dtype: no autocast.
        let p = if spec.fsdp.is_some() { a } else { spec.param_dtype.bytes() };
        let autocast = p != a;
        Dims {
            b: spec.batch,
            s,
            t: spec.batch * s,
            d: m.d_model,
            f: m.ffn,
            h: m.heads,
            kv: m.kv_heads() * m.head_dim(),
            v: m.vocab,
            a,
            p,
            g: if spec.fsdp.is_some() { a } else { spec.grad_dtype.unwrap_or(spec.param_dtype).bytes() },
            autocast,
            sm: if autocast { FP32 } else { a },
            dropout: spec.attention_dropout > 0.0,
        }
    }

    fn train_step(&mut self, n: u64) {
        self.e.step(n);
        let s = match self.next_len.take() {
            Some(s) => s,
            None => self.seq.sample(&mut self.rng),
        };
        self.flops += training_step_flops(&self.spec, s);
        let dm = self.dims(s);
        let (t, d, v, a, p) = (dm.t, dm.d, dm.v, dm.a, dm.p);
        let named = self.layout.named.clone();
        let gelu = self.spec.model.ffn_kind == FfnKind::Gelu;
        let math_mask = gelu && self.spec.attention == Attention::Math;

        if self.spec.prefetch_stream {
            // prefetcher.next(): the default stream waits for the copy and records its use of
            // the batch; the next batch is copied at once; the previous one dies when the loop
            // rebinds its names, its free waiting for the default stream.
            let (idx, targets) = match self.prefetched.take() {
                Some(b) => b,
                None => self.prefetch_batch(t),
            };
            self.e.record_stream(idx, 0);
            self.e.record_stream(targets, 0);
            if n < self.spec.steps {
                let s_next = self.seq.sample(&mut self.rng);
                self.next_len = Some(s_next);
                let t_next = self.dims(s_next).t;
                self.prefetched = Some(self.prefetch_batch(t_next));
            }
            let old = [self.carried.idx.replace(idx), self.carried.targets.replace(targets)];
            self.free_all(old.into_iter().flatten());
        } else {
            // The batch: token ids and targets (Python rebinds the previous step's names).
            let idx = self.alloc(t * INT64);
            let old = self.carried.idx.replace(idx);
            self.free_opt(old);
            let targets = self.alloc(t * INT64);
            let old = self.carried.targets.replace(targets);
            self.free_opt(old);
        }

        // FSDP: the root's parameters gathered before its forward.
        self.fsdp_pre_forward(0, a);
        let fsdp = self.fsdp.is_some();
        // Embeddings (not autocast: param dtype), positions or rotary tables, the causal mask.
        let mut rope_tables = Vec::new();
        let pos_ids = named.pos_embed.map(|_| self.alloc(s * INT64));
        if !gelu {
            // inv_freq = 1 / theta^(arange(half) / half); angles = outer(arange(S), inv_freq).
            let half = d / dm.h / 2;
            let ar = self.alloc(half * FP32);
            let dv = self.alloc(half * FP32);
            self.free(ar);
            let pw = self.alloc(half * FP32);
            self.free(dv);
            let rc = self.alloc(half * FP32);
            let inv = self.alloc(half * FP32);
            self.free(rc);
            self.free(pw);
            let pos = self.alloc(s * FP32);
            let ang = self.alloc(s * half * FP32);
            self.free(pos);
            rope_tables = vec![self.alloc(s * half * FP32), self.alloc(s * half * FP32)];
            self.free(inv);
            self.free(ang);
        }
        let mut x = self.alloc(t * d * p);
        if named.pos_embed.is_some() {
            let pos = self.alloc(s * d * p);
            let sum = self.alloc(t * d * p);
            self.free(x);
            self.free(pos);
            x = sum;
        }
        let mask = math_mask.then(|| {
            let ones = self.alloc(s * s * BOOL);
            let m = self.alloc(s * s * BOOL);
            self.free(ones);
            m
        });

        // Blocks.
        let layers = named.blocks.len();
        let mut saved: Vec<Option<BlockSaved>> = Vec::with_capacity(layers);
        let mut inputs = Vec::with_capacity(layers);
        // FSDP's MixedPrecisionPolicy casts a block's floating-point inputs to the compute
        // dtype before its pre-forward hook gathers it: Llama's fp32 rotary tables, once per
        // block (held by its checkpoint until its backward, or saved by q's rotary embedding).
        let mut block_casts: Vec<Vec<u64>> = Vec::with_capacity(layers);
        for (l, bp) in named.blocks.iter().enumerate() {
            let cast_inputs = fsdp && self.spec.param_dtype.bytes() != a && !gelu;
            let table = s * (d / dm.h / 2) * a;
            let casts = if cast_inputs { vec![self.alloc(table), self.alloc(table)] } else { Vec::new() };
            if let ([cos, sin], false) = (&casts[..], self.spec.checkpointing) {
                self.block_rope_casts = Some([*cos, *sin]);
                block_casts.push(Vec::new());
            } else {
                block_casts.push(casts);
            }
            self.fsdp_pre_forward(l + 1, a);
            let out = if self.spec.checkpointing {
                saved.push(None);
                if gelu {
                    self.gelu_block_fwd_unsaved(dm, bp, x)
                } else {
                    self.swiglu_block_fwd_unsaved(dm, bp, x)
                }
            } else {
                let sv = self.block_fwd(dm, bp, x, false);
                let out = sv.output.expect("a forward block has an output");
                saved.push(Some(sv));
                out
            };
            self.fsdp_post_forward(l + 1);
            inputs.push(x);
            x = out;
        }

        // Head and loss.
        let (nf_out, nf) = self.norm_fwd(dm, x);
        let keep = !dm.autocast;
        let (logits, head_saved) = self.linear_fwd(dm, named.lm_head, p, t, keep.then_some(nf_out));
        if !keep {
            self.free(nf_out);
        }
        let lf = (self.spec.logits_fp32 && a != FP32).then(|| self.alloc(t * v * FP32));
        let ce = if lf.is_some() { FP32 } else { a };
        let lsm = self.alloc(t * v * ce);
        // Under autocast nll_loss runs in fp32 and upcasts a narrower input.
        let up = (dm.autocast && ce != FP32).then(|| self.alloc(t * v * FP32));
        let nll = if up.is_some() { FP32 } else { ce };
        let loss = self.alloc(nll);
        let total_weight = self.alloc(nll);
        self.free_opt(lf);
        if !gelu {
            // Llama.forward returns: rotary tables and (fp32 copies saved instead) the last
            // hidden state die.
            // (Checkpointed blocks hold the tables, unless FSDP gave each block its own cast.)
            if !self.spec.checkpointing || fsdp {
                self.free_all(rope_tables.iter().copied());
            }
            if p != FP32 {
                self.free(x);
            }
        }
        self.fsdp_root_post_forward();
        let old = self.carried.logits.replace(logits);
        self.free_opt(old);
        let old = self.carried.loss.replace(loss);
        self.free_opt(old);
        // Autocast exits: its cache (bias casts, unsaved weight casts) is released.
        let cache = std::mem::take(&mut self.cast_cache);
        self.free_all(cache);

        // Backward: (loss / accum).backward().
        let scaled = self.alloc(nll);
        let seed = self.alloc(nll);
        let g_div = self.alloc(nll);
        // FSDP: the root's pre-backward hook (on the loss's inputs) gathers it again and
        // prefetches the last block.
        self.fsdp_pre_backward(0, a);
        let mut g = self.alloc(t * v * nll);
        self.free(g_div);
        self.free_opt(up);
        self.free(total_weight);
        if up.is_some() {
            let c = self.alloc(t * v * ce);
            self.free(g);
            g = c;
        }
        let g_lsm = self.alloc(t * v * ce);
        self.free(g);
        self.free(lsm);
        let mut g_logits = g_lsm;
        if lf.is_some() {
            g_logits = self.alloc(t * v * a);
            self.free(g_lsm);
        }
        let gi = self.linear_bwd(dm, named.lm_head, head_saved, g_logits, a, true, t, p);
        let g_res = self.norm_bwd(dm, named.final_norm, nf, gi, false).expect("the final norm's gradient starts the residual buffer");
        let (reduce, stored) = self.fsdp_dtypes();
        for l in (0..layers).rev() {
            let bp = &named.blocks[l];
            self.fsdp_pre_backward(l + 1, a);
            let sv = match saved[l].take() {
                Some(sv) => sv,
                None => {
                    // Recompute the block under the forward's autocast state; its output is
                    // dropped, its casts live until the recomputation's autocast exits unless
                    // saved.
                    if p != a {
                        self.early_grad_cast = Some(self.alloc(t * d * a));
                    }
                    let sv = self.block_fwd(dm, bp, inputs[l], true);
                    let cache = std::mem::take(&mut self.cast_cache);
                    self.free_all(cache);
                    sv
                }
            };
            // A checkpointed Llama block holds its input (unless an fp32 RMSNorm saved it) and
            // the rotary tables; the last block to run backward releases the tables.
            let mut args = Vec::new();
            let casts = std::mem::take(&mut block_casts[l]);
            if self.spec.checkpointing && !gelu {
                if fsdp {
                    args.extend(casts.iter().rev().copied());
                } else if l == 0 {
                    args.extend(rope_tables.iter().rev().copied());
                }
                if p != FP32 {
                    args.push(inputs[l]);
                }
            }
            self.block_bwd(dm, bp, sv, g_res, if l == 0 { mask } else { None }, args);
            self.fsdp_post_backward(l + 1, reduce, stored);
        }
        // Embedding backward: positions (summed over the batch), then tokens.
        if let Some(pe) = named.pos_embed {
            let sum = self.alloc(s * d * p);
            let gpe = self.alloc(self.layout.elems[pe] * p);
            self.free(sum);
            self.free_opt(pos_ids);
            self.accumulate(dm, pe, gpe, p);
        }
        let gte = self.alloc(self.layout.elems[named.tok_embed] * p);
        self.free(g_res);
        self.accumulate(dm, named.tok_embed, gte, p);
        self.fsdp_post_backward(0, reduce, stored);
        self.fsdp_end_backward();
        self.free(seed);
        self.free(scaled);
        if let Some(ddp) = self.ddp.as_mut() {
            // The reducer's finalize waits for the last all-reduce: by the optimizer step the
            // NCCL stream's work is done; the next step's gradients start a new round.
            ddp.remaining.clone_from(&ddp.bucket_params);
            ddp.ready.fill(false);
            self.e.sync(Some(DDP_COMM_STREAM));
        }

        if self.spec.clip_grad_norm {
            self.clip_grad_norm(dm);
        }
        self.optimizer_step();
        if self.spec.prefetch_stream {
            // The loop reads the loss (`loss.item()`): the default stream completes.
            self.e.sync(Some(0));
        }
    }

    /// `clip_grad_norm_(foreach=True)`: a norm per gradient, stacked, the total norm, the clip
    /// coefficient (scalars in the gradient dtype); the multiply is in place.
    fn clip_grad_norm(&mut self, dm: Dims) {
        // Under FSDP every parameter has a sharded gradient in its own dtype.
        let (g, n) = match &self.fsdp {
            Some(f) => (self.spec.param_dtype.bytes(), f.layout.groups.iter().map(|g| g.params.len() as u64).sum()),
            None => (dm.g, self.grads.iter().filter(|x| x.is_some()).count() as u64),
        };
        let norms: Vec<u64> = (0..n).map(|_| self.alloc(g)).collect();
        let stack = self.alloc(n * g);
        let total = self.alloc(g);
        self.free(stack);
        self.free_all(norms.into_iter().rev());
        let add = self.alloc(g);
        let rec = self.alloc(g);
        let mul = self.alloc(g);
        self.free(rec);
        self.free(add);
        let clamp = self.alloc(g);
        self.free(mul);
        self.free(clamp);
        self.free(total);
    }

    fn optimizer_step(&mut self) {
        let st = self.spec.optimizer_state_dtype.bytes();
        let tensors = self.optimizer_tensors();
        if self.optimizer_state.is_empty() {
            for &elems in &tensors {
                match self.spec.optimizer {
                    Optimizer::AdamForeach => {
                        // exp_avg, exp_avg_sq (the step count stays on the CPU).
                        for _ in 0..2 {
                            let id = self.alloc(elems * st);
                            self.optimizer_state.push(id);
                        }
                    }
                    Optimizer::AdamFused => {
                        // The fused kernel keeps the step count on the device: an fp32 scalar.
                        let step = self.alloc(FP32);
                        self.optimizer_state.push(step);
                        for _ in 0..2 {
                            let id = self.alloc(elems * st);
                            self.optimizer_state.push(id);
                        }
                    }
                    Optimizer::SgdMomentum => {
                        let id = self.alloc(elems * st);
                        self.optimizer_state.push(id);
                    }
                }
                if self.spec.master_weights {
                    let id = self.alloc(elems * FP32);
                    self.optimizer_state.push(id);
                }
            }
        }
        if self.spec.optimizer == Optimizer::AdamForeach {
            // _foreach_sqrt(exp_avg_sq): one parameter-shaped temporary each, freed in reverse
            // when the step returns (the other foreach ops are in place).
            let tmps: Vec<u64> = tensors.iter().map(|&e| self.alloc(e * st)).collect();
            self.free_all(tmps.into_iter().rev());
        }
        if self.spec.grads_set_to_none {
            let mut grads: Vec<u64> = self.grads.iter_mut().filter_map(Option::take).collect();
            if let Some(f) = self.fsdp.as_mut() {
                // A group's reduced shard dies with the last of its gradients' views: the
                // blocks in order, then the root (its head comes last).
                let mut order: Vec<usize> = (1..f.sharded_grads.len()).collect();
                order.push(0);
                grads.extend(order.into_iter().filter_map(|g| f.sharded_grads[g].take()));
            }
            self.free_all(grads);
        }
    }
}

/// Bytes FlashAttention-2's backward allocates through the caching allocator besides its outputs
/// (mha_bwd, flash_api.cpp): softmax_d [B, H, S rounded to 128] fp32 and the dq accumulator [B, S
/// rounded, H, d rounded to 32 (64 past 128)] fp32, always (`bool loop = true`). (k and v reach
/// SDPA repeated to every head here, as llama.py does, so the kernel's grouped-query expansion of
/// dk and dv never runs.)
pub fn flash_backward_scratch(batch: u64, heads: u64, seq: u64, head_dim: u64) -> [u64; 2] {
    const BLOCK: u64 = 128;
    let s_rounded = seq.div_ceil(BLOCK) * BLOCK;
    let d_round = if head_dim <= 128 { 32 } else { 64 };
    let d_rounded = head_dim.div_ceil(d_round) * d_round;
    let softmax_d = batch * heads * s_rounded * FP32;
    let dq_accum = batch * s_rounded * heads * d_rounded * FP32;
    [softmax_d, dq_accum]
}

/// The scratch of a CUDA sum over the outer dimension of a contiguous [`inputs_per_output`,
/// `outputs`] tensor of a 16- or 32-bit type (the gradient of a weight broadcast over tokens),
/// as `aten/src/ATen/native/cuda/Reduce.cuh`'s `setReduceConfig` sizes it on an H100 (132
/// multiprocessors of 2,048 threads): when it splits the inputs across blocks
/// (`ctas_per_output` > 1), a global staging buffer of fp32 partial sums and a semaphore per
/// output block, in bytes. (An input past 2 GiB, which PyTorch splits into 32-bit-indexable
/// pieces reduced one by one, is taken as one.)
pub fn outer_sum_scratch(outputs: u64, inputs_per_output: u64) -> Option<(u64, u64)> {
    const MAX_NUM_THREADS: u64 = 512;
    const WARP: u64 = 32;
    const ACCUMULATOR: u64 = 4;
    const MULTIPROCESSORS: u64 = 132;
    const THREADS_PER_MULTIPROCESSOR: u64 = 2048;
    if outputs == 0 || inputs_per_output == 0 {
        return None;
    }
    // Vectorised along the outputs (`get_output_vec_size`): 4, 2 or 1 as the count divides.
    let vec = [4, 2, 1].into_iter().find(|v| outputs.is_multiple_of(*v)).unwrap_or(1);
    let max_threads = MAX_NUM_THREADS / vec;
    let pow2 = |x: u64| if x < max_threads { 1u64 << (63 - x.leading_zeros()) } else { max_threads };
    let (dim0, dim1) = (pow2(outputs / vec), pow2(inputs_per_output));
    let height = dim1.min(max_threads / dim0.min(WARP));
    let width = dim0.min(max_threads / height);
    let threads = width * height;
    // Lanes take outputs; warps take inputs if that leaves each thread 16 or more.
    let mut step_output = width;
    let split_warps = inputs_per_output >= height * 16 || inputs_per_output >= 256;
    let step_input = if split_warps { height } else { 1 };
    if !split_warps {
        step_output *= height;
    }
    let grid = (outputs / vec).div_ceil(step_output);
    let target_grid = MULTIPROCESSORS * (THREADS_PER_MULTIPROCESSOR / threads);
    let values = inputs_per_output.div_ceil(step_input);
    if !(split_warps && values >= 256 && grid <= target_grid) {
        return None;
    }
    let ctas = target_grid.div_ceil(grid).min(values.div_ceil(16)).max(values.div_ceil(256));
    (ctas > 1).then_some((ACCUMULATOR * outputs * ctas * width * vec, 4 * grid))
}

impl TransformerGen {
    /// The math of the steps generated so far, as `torch.utils.flop_counter` counts it.
    pub fn flops(&self) -> f64 {
        self.flops
    }
}

/// The math of one training step at sequence length `s`, counted as `torch.utils.flop_counter`
/// counts it (what a capture's `# flops:` line holds): a matmul of (m×k)(k×n) is 2mkn; its
/// backward twice that (input and weight gradients; a frozen LoRA base only the input's);
/// attention forward 4·b·s²·D (scores and their product with V), backward 2.5 × that fused (the
/// scores recomputed, then four products) and 2 × on the math path; a checkpointed block runs its forward again up to its
/// down projection. Checked against a capture's count (tests/capture.rs).
pub fn training_step_flops(spec: &TransformerSpec, s: u64) -> f64 {
    let m = &spec.model;
    let (b, d, f, v) = (spec.batch as f64, m.d_model as f64, m.ffn as f64, m.vocab as f64);
    let tokens = b * s as f64;
    let kv = (m.kv_heads() * m.head_dim()) as f64;
    let ffn_mats = if m.ffn_kind == FfnKind::Swiglu { 3.0 } else { 2.0 };
    // Each block's weight matrices (in × out): q and o D×D, k and v D×kv, the MLP's D×F ones.
    let block_weights = 2.0 * d * d + 2.0 * d * kv + ffn_mats * d * f;
    let adapters = if m.lora_rank > 0 { m.lora_rank as f64 * (2.0 * (d + d) + 2.0 * (d + kv) + ffn_mats * (d + f)) } else { 0.0 };
    let block_forward = 2.0 * tokens * (block_weights + adapters) + 4.0 * b * (s as f64).powi(2) * d;
    let base_backward = if m.lora_rank > 0 { 1.0 } else { 2.0 };
    // Fused attention's backward recomputes the scores (2.5 × its forward); the math path's
    // two batched matmuls take two each (2 ×).
    let attention_backward = if spec.attention == Attention::Math { 8.0 } else { 10.0 };
    let block_backward = 2.0 * tokens * (base_backward * block_weights + 2.0 * adapters) + attention_backward * b * (s as f64).powi(2) * d;
    let head_forward = 2.0 * tokens * d * v;
    // Checkpoint recomputation stops once every saved tensor is back: the down projection's
    // product (and its adapter's) is never recomputed.
    let down_projection = 2.0 * tokens * (d * f + m.lora_rank as f64 * (d + f));
    let recompute = if spec.checkpointing { block_forward - down_projection } else { 0.0 };
    m.layers as f64 * (block_forward + block_backward + recompute) + (1.0 + base_backward) * head_forward
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
                match &self.fsdp {
                    // `to_empty` after `fully_shard`: each rank's padded shards, in module order.
                    Some(f) => {
                        for (_, elems) in f.layout.module_order() {
                            let id = self.e.alloc(elems * pb);
                            self.params.push(id);
                        }
                        // A tied output projection is materialised again at its place, the
                        // embedding's first shard dropped.
                        let named = &self.layout.named;
                        if named.lm_head.weight == named.tok_embed {
                            let again = self.e.alloc(f.layout.groups[0].shard_elems[0] * pb);
                            self.e.free(std::mem::replace(&mut self.params[0], again));
                        }
                    }
                    None => {
                        for i in 0..self.layout.elems.len() {
                            let id = self.e.alloc(self.layout.elems[i] * pb);
                            self.params.push(id);
                        }
                    }
                }
                if let Some(ddp) = self.spec.ddp.clone() {
                    self.ddp_init(&ddp);
                }
                continue;
            }
            if self.next_step > self.spec.steps {
                if self.finished {
                    return None;
                }
                // The loop's last references die with the script.
                self.finished = true;
                let c = std::mem::take(&mut self.carried);
                self.free_all([c.idx, c.targets, c.logits, c.loss].into_iter().flatten());
                continue;
            }
            let n = self.next_step;
            self.next_step += 1;
            self.train_step(n);
        }
    }
}
