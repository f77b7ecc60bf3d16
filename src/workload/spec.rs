//! The TOML workload format: serde types, loading, and validation with `file:line` errors.

use std::path::Path;

use serde::Deserialize;

use crate::error::InputError;
use crate::units::{Bytes, MAX_SANE_BYTES};

/// A workload definition file (`workloads/*.toml`). Exactly one family table must be present.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub seed: u64,
    /// The device this workload is sized for; generators keep peak live bytes under 90 % of it.
    pub sized_for: Option<Bytes>,
    pub transformer: Option<TransformerSpec>,
    pub model_switch: Option<ModelSwitchSpec>,
    pub serving: Option<ServingSpec>,
    pub scenario: Option<ScenarioSpec>,
    pub python_objects: Option<PythonObjectsSpec>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
    Fp16,
    Int8,
}

impl Dtype {
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Int8 => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FfnKind {
    /// GPT-style: up (F×D), GELU, down (D×F), with biases and LayerNorm.
    Gelu,
    /// Llama-style: gate and up (F×D), SiLU, down (D×F), no biases, RMSNorm, RoPE.
    Swiglu,
}

/// A decoder-only transformer's shape (public configurations; see WORKLOADS.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    #[serde(default)]
    pub name: String,
    pub layers: u64,
    pub d_model: u64,
    pub heads: u64,
    /// Grouped-query attention (llama.py's `kv_heads`): the K/V heads, each shared by
    /// `heads / kv_heads` query heads; absent: as many as `heads` (multi-head attention).
    #[serde(default)]
    pub kv_heads: Option<u64>,
    pub ffn: u64,
    pub vocab: u64,
    #[serde(default = "default_ffn_kind")]
    pub ffn_kind: FfnKind,
    /// Learned position embeddings (GPT); 0 for rotary (Llama).
    #[serde(default)]
    pub max_positions: u64,
    /// Output projection shares the token embedding (GPT-2/3) or has its own (Llama).
    #[serde(default)]
    pub tied_embeddings: bool,
    /// LoRA rank: adds A (r×D) and B (D×r) adapter tensors to every attention/MLP matrix.
    #[serde(default)]
    pub lora_rank: u64,
}

impl ModelSpec {
    /// The K/V heads: `kv_heads`, or `heads` when the file does not give it.
    pub fn kv_heads(&self) -> u64 {
        self.kv_heads.unwrap_or(self.heads)
    }

    pub fn head_dim(&self) -> u64 {
        self.d_model / self.heads
    }
}

fn default_ffn_kind() -> FfnKind {
    FfnKind::Gelu
}

/// A sequence-length (or token-count) distribution.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum LengthDist {
    Uniform {
        min: u64,
        max: u64,
    },
    /// Lognormal with the given median and log-space sigma, clamped to [min, max].
    Lognormal {
        median: f64,
        sigma: f64,
        min: u64,
        max: u64,
    },
    /// Cycles through the list.
    List {
        values: Vec<u64>,
    },
    Fixed {
        value: u64,
    },
}

impl LengthDist {
    pub fn max_value(&self) -> u64 {
        match self {
            LengthDist::Uniform { max, .. } | LengthDist::Lognormal { max, .. } => *max,
            LengthDist::List { values } => values.iter().copied().max().unwrap_or(0),
            LengthDist::Fixed { value } => *value,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Eager math path: scores and softmax of B·H·S·S are materialised and kept.
    Math,
    /// Fused SDPA / flash attention: only the output and a B·H·S logsumexp are kept.
    Flash,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// torch.optim.AdamW(foreach=True): exp_avg/exp_avg_sq plus per-step temporaries.
    AdamForeach,
    /// torch.optim.AdamW(fused=True): state only, no temporaries.
    AdamFused,
    /// SGD with momentum: one buffer per parameter.
    SgdMomentum,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpec {
    pub model: ModelSpec,
    pub steps: u64,
    pub batch: u64,
    pub seq_len: LengthDist,
    /// Storage dtype of parameters (fp32 under AMP autocast; bf16 for pure-bf16 training).
    pub param_dtype: Dtype,
    /// Dtype of activations (autocast's compute dtype).
    pub activation_dtype: Dtype,
    /// Dtype of gradients; defaults to the parameter dtype.
    pub grad_dtype: Option<Dtype>,
    pub optimizer: Optimizer,
    /// Dtype of optimizer state (exp_avg, exp_avg_sq, momentum).
    #[serde(default = "fp32")]
    pub optimizer_state_dtype: Dtype,
    /// fp32 master copy of each parameter (classic mixed precision with low-precision params).
    #[serde(default)]
    pub master_weights: bool,
    pub attention: Attention,
    /// Attention dropout probability > 0 keeps a bool mask and the dropped probabilities.
    #[serde(default)]
    pub attention_dropout: f64,
    /// Activation checkpointing: keep each layer's input, recompute in backward.
    #[serde(default)]
    pub checkpointing: bool,
    /// `zero_grad(set_to_none=True)` (the default since torch 2.0): grads are freed after every
    /// optimizer step and re-created by the next backward.
    #[serde(default = "yes")]
    pub grads_set_to_none: bool,
    /// The model upcasts its logits (`logits.float()`) before the cross-entropy, as Llama code
    /// does; without it the log-softmax runs in the activation dtype (under autocast `nll_loss`
    /// then upcasts its input to fp32, which the generator models either way).
    #[serde(default = "yes")]
    pub logits_fp32: bool,
    /// `torch.nn.utils.clip_grad_norm_` (foreach) before the optimizer step: one norm per
    /// parameter, a stack and a handful of scalars.
    #[serde(default = "yes")]
    pub clip_grad_norm: bool,
    /// The cuBLAS workspace PyTorch allocates through the caching allocator at the first matmul
    /// of a stream and keeps, as with `TORCH_CUBLAS_WORKSPACE_CACHE=1` (torch 2.15's default
    /// takes one per call instead) (default 32 MiB, the Hopper `CUBLAS_WORKSPACE_CONFIG`); 0: none.
    pub cublas_workspace: Option<Bytes>,
    /// torch 2.15's default (`aten/src/ATen/cuda/CublasHandlePool.cpp` without
    /// `TORCH_CUBLAS_WORKSPACE_CACHE=1`): each matmul takes its cuBLAS workspace right after its
    /// output and frees it when it returns, instead of one kept per stream.
    #[serde(default)]
    pub cublas_workspace_per_call: bool,
    /// Allocations CUDA kernels make inside an op, which PyTorch's own CUDA path shows
    /// (`capture --backend driver`) and fake tensors do not: flash attention's RNG state,
    /// the global scratch of a reduction split across blocks (a norm weight's gradient), the
    /// embedding backward's sort and segment buffers. Default: as fake-tensor captures see.
    #[serde(default)]
    pub kernel_scratch: bool,
    /// `DistributedDataParallel`: gradients reduced in buckets on a communication stream.
    #[serde(default)]
    pub ddp: Option<DdpSpec>,
    /// FSDP2 (`fully_shard` on each block, then the root): parameters sharded over the ranks,
    /// all-gathered per block, gradients reduce-scattered.
    #[serde(default)]
    pub fsdp: Option<FsdpSpec>,
    /// A data prefetcher (apex's `data_prefetcher` pattern): each batch is copied to the GPU on a
    /// side stream (its own pool of segments), used on the default stream after
    /// `record_stream`, so its free waits for the default stream; the loop syncs the default
    /// stream once a step (`loss.item()`).
    #[serde(default)]
    pub prefetch_stream: bool,
}

/// DDP's reducer (`torch/nn/parallel/distributed.py`, `reducer.cpp`): one persistent flat buffer
/// per bucket, buckets filled in reverse parameter order (the first capped at 1 MiB,
/// `dist._DEFAULT_FIRST_BUCKET_BYTES`, the others at `bucket_cap_mb`), each reduced on the NCCL
/// stream once its last gradient is ready.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DdpSpec {
    #[serde(default = "ddp_bucket_cap_mb")]
    pub bucket_cap_mb: f64,
    /// `fp16_compress_hook`: each bucket is cast to fp16 on the default stream, all-reduced on the
    /// NCCL stream (which records its use), and freed, its free waiting for the NCCL stream.
    #[serde(default)]
    pub fp16_compress_hook: bool,
}

/// FSDP2 as `torch/distributed/fsdp/_fully_shard` runs it (torch 2.15), one rank's view: each
/// block and the root are a parameter group. `param_dtype` is the sharded parameters' dtype,
/// `activation_dtype` the MixedPrecisionPolicy's `param_dtype` (what is gathered and computed
/// in; no autocast), `reduce_dtype` the gradients' reduce-scatter dtype.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsdpSpec {
    /// Ranks the parameters are sharded over: dim 0 of each is padded to a multiple of it.
    pub world_size: u64,
    /// Free a block's gathered parameters after its forward and gather them again for its
    /// backward (FSDP2's default); false keeps them from forward to backward.
    #[serde(default = "yes")]
    pub reshard_after_forward: bool,
    /// Blocks all-gathered ahead in forward (`set_modules_to_forward_prefetch`; FSDP2's default:
    /// none, each block gathers at its own pre-forward).
    #[serde(default)]
    pub forward_prefetch: u64,
    /// Blocks each block all-gathers ahead in backward (`set_modules_to_backward_prefetch`;
    /// FSDP2's implicit default: the next one). The root always prefetches the last block.
    #[serde(default = "one")]
    pub backward_prefetch: u64,
    /// `MixedPrecisionPolicy.reduce_dtype`; default: the gathered (compute) dtype, the reduced
    /// shard then cast to the parameters' dtype.
    pub reduce_dtype: Option<Dtype>,
}

fn one() -> u64 {
    1
}

fn ddp_bucket_cap_mb() -> f64 {
    25.0
}

fn fp32() -> Dtype {
    Dtype::Fp32
}
fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    RoundRobin,
    Random,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSwitchSpec {
    pub models: Vec<ModelSpec>,
    pub schedule: Schedule,
    /// How many times a model is loaded (one residency each).
    pub switches: u64,
    /// Inference steps per residency.
    pub steps_per_model: u64,
    pub batch: u64,
    pub seq_len: LengthDist,
    pub dtype: Dtype,
    pub attention: Attention,
    /// `torch.cuda.empty_cache()` after each unload: the cached segments go back to the driver.
    #[serde(default)]
    pub empty_cache: bool,
    /// The cuBLAS workspace taken at the first matmul and kept (default 32 MiB); 0: none.
    pub cublas_workspace: Option<Bytes>,
    /// An explicit schedule instead of the seeded draws (a capture's own: `switch.py
    /// --schedule-out`): which model each residency loads and its steps' sequence lengths.
    #[serde(default)]
    pub residencies: Option<Vec<Residency>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Residency {
    /// An index into `models`.
    pub model: usize,
    /// One sequence length per inference step.
    pub seq_lens: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCache {
    /// `torch.cat` of the past K/V per layer per token: allocate one token larger, free the old.
    NaiveCat,
    /// One max-length K and V buffer per layer per request, allocated at admission.
    Preallocated,
    /// Fixed pages of `page_tokens` tokens per layer, allocated as the sequence grows.
    Paged,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingSpec {
    pub model: ModelSpec,
    pub dtype: Dtype,
    /// Decode iterations to simulate; each is one `step`.
    pub steps: u64,
    pub max_batch: u64,
    /// Mean arrivals per decode step in the calm and burst phases (Poisson).
    pub calm_rate: f64,
    pub burst_rate: f64,
    /// Mean phase lengths in steps (geometric switching between calm and burst).
    pub mean_calm_steps: f64,
    pub mean_burst_steps: f64,
    pub prompt_len: LengthDist,
    pub output_len: LengthDist,
    pub kv_cache: KvCache,
    #[serde(default = "sixteen")]
    pub page_tokens: u64,
    /// An explicit arrival schedule, `[[step, prompt_tokens, output_tokens], ...]`, instead of
    /// the Poisson process (a capture's own arrivals: `serve.py --schedule-out`).
    #[serde(default)]
    pub arrivals: Vec<[u64; 3]>,
    /// The cuBLAS workspace taken at the first matmul and kept (default 32 MiB); 0: none.
    pub cublas_workspace: Option<Bytes>,
}

fn sixteen() -> u64 {
    16
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    pub events: Vec<ScenarioEvent>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScenarioEvent {
    Alloc {
        id: u64,
        bytes: Bytes,
        #[serde(default)]
        stream: u64,
    },
    Free {
        id: u64,
    },
    /// (A struct variant: a unit one would let unknown keys through.)
    EmptyCache {},
    Step {
        n: u64,
    },
}

/// The Python-serving-like CPU workload from the allocator literature: many objects of a few
/// size classes; each iteration allocates `per_iteration`, keeps `keep`, and trims the kept set
/// to the most recent `trim_to` once it passes `trim_above`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonObjectsSpec {
    pub sizes: Vec<Bytes>,
    pub iterations: u64,
    pub per_iteration: u64,
    pub keep: u64,
    pub trim_above: u64,
    pub trim_to: u64,
}

/// Where a field (`transformer.model.layers`) is set in the source, for error messages: the
/// first line that assigns its key inside its table (`[transformer.model]`), else anywhere;
/// comments never count (the shipped workloads quote keys in them).
pub fn locate_field(source: &str, field: &str) -> Option<usize> {
    let (table, key) = field.rsplit_once('.').unwrap_or(("", field));
    // Lines without their comments (a '#' inside a string is rare in workload files).
    let lines: Vec<&str> = source.lines().map(|l| l.split('#').next().unwrap_or("").trim()).collect();
    let assigns = |t: &str| {
        t.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('=')) || t.contains(&format!("{key} =")) || t.contains(&format!("{key}="))
    };
    let is_header = |t: &str| t.starts_with('[') && t.ends_with(']') && !t.contains(',');
    let in_table = lines
        .iter()
        .position(|t| *t == format!("[{table}]"))
        .and_then(|start| lines[start + 1..].iter().take_while(|t| !is_header(t)).position(|t| assigns(t)).map(|i| start + 1 + i));
    in_table.or_else(|| lines.iter().position(|t| assigns(t))).map(|i| i + 1)
}

/// Turns a toml error into one line `file:line: message`.
pub fn toml_error(file: &str, source: &str, err: &toml::de::Error) -> InputError {
    let line = err.span().map(|s| source[..s.start.min(source.len())].matches('\n').count() + 1);
    let msg = err.message().replace('\n', " ");
    match line {
        Some(l) => InputError::new(format!("{file}:{l}"), msg),
        None => InputError::new(file, msg),
    }
}

pub(crate) struct Validator<'a> {
    pub file: &'a str,
    pub source: &'a str,
}

impl Validator<'_> {
    pub fn fail(&self, field: &str, msg: impl std::fmt::Display) -> InputError {
        let loc = match locate_field(self.source, field) {
            Some(l) => format!("{}:{l}", self.file),
            None => self.file.to_string(),
        };
        InputError::new(loc, format!("field `{field}`: {msg}"))
    }

    pub fn positive(&self, field: &str, v: u64, max: u64) -> Result<(), InputError> {
        if v == 0 {
            return Err(self.fail(field, "must be > 0"));
        }
        if v > max {
            return Err(self.fail(field, format!("{v} is absurdly large (limit {max})")));
        }
        Ok(())
    }

    pub fn size(&self, field: &str, bytes: u128) -> Result<(), InputError> {
        if bytes > MAX_SANE_BYTES as u128 {
            return Err(self.fail(field, format!("implies a tensor of {bytes} bytes, over 1 PiB")));
        }
        Ok(())
    }

    pub fn length(&self, field: &str, d: &LengthDist) -> Result<(), InputError> {
        const LIMIT: u64 = 1 << 24;
        match d {
            LengthDist::Uniform { min, max } => {
                self.positive(field, *min, LIMIT)?;
                self.positive(field, *max, LIMIT)?;
                if min > max {
                    return Err(self.fail(field, format!("min {min} > max {max}")));
                }
            }
            LengthDist::Lognormal { median, sigma, min, max } => {
                self.positive(field, *min, LIMIT)?;
                self.positive(field, *max, LIMIT)?;
                if min > max {
                    return Err(self.fail(field, format!("min {min} > max {max}")));
                }
                if !(median.is_finite() && *median > 0.0 && sigma.is_finite() && *sigma >= 0.0) {
                    return Err(self.fail(field, "lognormal needs median > 0 and sigma >= 0"));
                }
            }
            LengthDist::List { values } => {
                if values.is_empty() {
                    return Err(self.fail(field, "list needs at least one value"));
                }
                for v in values {
                    self.positive(field, *v, LIMIT)?;
                }
            }
            LengthDist::Fixed { value } => self.positive(field, *value, LIMIT)?,
        }
        Ok(())
    }

    /// A model with learned positions (`max_positions` > 0: gpt.py's wpe) embeds at most that many:
    /// a longer sequence would index past its table.
    pub fn positions(&self, field: &str, m: &ModelSpec, longest: u64) -> Result<(), InputError> {
        if m.max_positions > 0 && longest > m.max_positions {
            return Err(self.fail(field, format!("{} learned positions, but sequences reach {longest} tokens", m.max_positions)));
        }
        Ok(())
    }

    pub fn model(&self, prefix: &str, m: &ModelSpec) -> Result<(), InputError> {
        self.positive(&format!("{prefix}.layers"), m.layers, 10_000)?;
        self.positive(&format!("{prefix}.d_model"), m.d_model, 1 << 20)?;
        self.positive(&format!("{prefix}.heads"), m.heads, 1 << 14)?;
        self.positive(&format!("{prefix}.ffn"), m.ffn, 1 << 22)?;
        self.positive(&format!("{prefix}.vocab"), m.vocab, 1 << 24)?;
        if !m.d_model.is_multiple_of(m.heads) {
            return Err(self.fail(&format!("{prefix}.heads"), format!("d_model {} is not divisible by {} heads", m.d_model, m.heads)));
        }
        if let Some(kv) = m.kv_heads {
            if kv == 0 || kv > m.heads || !m.heads.is_multiple_of(kv) {
                return Err(self.fail(&format!("{prefix}.kv_heads"), format!("{kv} must divide heads = {} (1 ≤ kv_heads ≤ heads)", m.heads)));
            }
            if kv != m.heads && m.ffn_kind == FfnKind::Gelu {
                return Err(self.fail(&format!("{prefix}.kv_heads"), "gpt.py (ffn_kind = \"gelu\") has no grouped-query attention: leave kv_heads out"));
            }
        }
        if m.max_positions > 1 << 24 || m.lora_rank > m.d_model {
            return Err(self.fail(&format!("{prefix}.max_positions"), "max_positions ≤ 2^24 and lora_rank ≤ d_model"));
        }
        self.size(&format!("{prefix}.vocab"), m.vocab as u128 * m.d_model as u128 * 4)?;
        self.size(&format!("{prefix}.ffn"), m.ffn as u128 * m.d_model as u128 * 4)
    }
}

/// Reads a workload file from disk.
pub fn read_source(path: &Path) -> Result<String, InputError> {
    // A workload is a page of TOML: a file of gigabytes (a sparse file of NUL bytes) is not
    // read whole to find out.
    crate::files::read_text_at_most(path, 16 << 20, "a workload definition (a trace goes in a .csv)")
}
