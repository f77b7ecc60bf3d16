#!/usr/bin/env python3
"""What a capture cannot see, sized on the shipped workloads: prints the blind-spot table of
docs/capture.md, and with --write rewrites it there (numbers are never typed; tests/readme.rs
fails when the two differ).

    python3 scripts/blind_spots.py [--write]

Modelled in the capture: cuBLAS workspaces and FlashAttention-2 backward scratch (the capture
allocates them as PyTorch would). Named only: the rest, with the formula used for its size.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allocbench_capture import flash_backward_scratch  # noqa: E402

BEGIN, END = "<!-- blind-spots:begin (scripts/blind_spots.py) -->", "<!-- blind-spots:end -->"
MIB = 1 << 20
# (workload, batch, max sequence, layers, d_model, heads, attention) of the shipped training workloads.
WORKLOADS = [
    ("gpt3-xl-1.3b (math attention)", 4, 2048, 24, 2048, 16, "math"),
    ("llama2-7b-80g (flash attention)", 2, 4096, 32, 4096, 32, "flash"),
]


def mib(n):
    return f"{n / MIB:,.1f} MiB"


def table():
    """The table's lines."""
    lines = ["| blind spot | in the capture | gpt3-xl-1.3b | llama2-7b-80g | size |", "|---|---|---|---|---|"]
    cols = []
    for _, b, s, layers, d, h, attention in WORKLOADS:
        tokens = b * s
        flash = sum(flash_backward_scratch(b, h, s, s, d // h)) if attention == "flash" else 0
        cols.append(
            {
                "cublas": 32 * MIB,
                "cublaslt": 1 * MIB,
                "flash": flash,
                "efficient": 3 * b * s * h * (d // h) * 4 if attention == "efficient" else 0,
                "embedding": tokens * d * 4 + 6 * tokens * 8,
            }
        )
    rows = [
        ("cuBLAS workspace", "modelled (`CUBLAS_WORKSPACE_CONFIG`, `--cublas-workspace-mib`)", "cublas", "32 MiB (Hopper's default) per cuBLAS call (mm, bmm, gemv, dot), after its output and freed when it returns (torch 2.15); kept per stream with `TORCH_CUBLAS_WORKSPACE_CACHE=1` or an older torch"),
        ("cuBLASLt workspace", "modelled (`CUBLASLT_WORKSPACE_SIZE`)", "cublaslt", "1 MiB per cuBLASLt call (a Linear's fused-bias addmm, `_scaled_mm`), freed when it returns; kept, it shares the stream's cuBLAS workspace (`TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`: its own)"),
        ("FlashAttention-2 backward scratch", "modelled", "flash", "softmax_d B·H·⌈S⌉₁₂₈·4 + dq_accum B·⌈S⌉₁₂₈·H·⌈D⌉₃₂·4 (+ dk, dv expanded to every query head, B·S·H·D each, under grouped-query attention), per layer, transient"),
        ("memory-efficient attention backward", "named", "efficient", "up to 3 fp32 accumulators B·S·H·D·4, transient (0 when the math or flash kernel runs)"),
        ("embedding backward (sort, segments)", "named", "embedding", "≈ B·S·D·4 partial sums + 6·B·S·8 index buffers, transient, once per step"),
    ]
    for name, how, key, formula in rows:
        vals = [mib(c[key]) if c[key] else "—" for c in cols]
        lines.append(f"| {name} | {how} | {vals[0]} | {vals[1]} | {formula} |")
    lines.append("| cuDNN attention (first in SDPA's order in recent torch on sm90/sm100 with cuDNN > 9.15) | named | — | — | the capture runs flash, memory-efficient or math as with `TORCH_CUDNN_SDPA_DEPRIORITIZED=1`; cuDNN's kernel keeps output and log-sum-exp alike but takes a per-call workspace its heuristics size, transient |")
    lines.append("| cuDNN convolution workspace | named (the driver backend: `ALLOCBENCH_CUDNN_WORKSPACE_BYTES` per call, 0 by default) | — | — | per convolution, chosen by the algorithm (with `cudnn.benchmark` the search tries workspaces up to the free memory), transient |")
    lines.append("| channels-last batch norm's staging (PyTorch's kernel, as for bf16 inputs) | named (the driver backend records it) | — | — | 4·C·grid.y fp32 staging and grid.x int32 semaphores per forward statistics and backward reduction when the launch grid splits the reduction, transient (≤ 128 KiB per call on a ResNet-18 at batch 8) |")
    lines.append("| cuFFT workspace | named | — | — | per `torch.fft` call on CUDA, sized by its cuFFT plan, through the caching allocator; complex-to-real transforms also copy their input; transient |")
    lines.append("| padding removal (`nn.TransformerEncoder` in inference with a `src_key_padding_mask`) | named (said at capture) | — | — | a GPU's fast path packs the unpadded tokens into a nested tensor sized by the mask's values; the capture keeps the padded layout, an upper bound by the padding share |")
    lines.append("| sparse gradients (`Embedding(sparse=True)`, `torch.sparse_coo`) | named (said at capture) | — | — | indices and values sized by the data (nnz·(D·itemsize + 8)); not recorded |")
    lines.append("| NCCL buffers | named | — | — | outside the caching allocator (cudaMalloc by NCCL; `NCCL_BUFFSIZE` 4 MiB per channel per peer) |")
    lines.append("| CUDA context | named | — | — | outside the caching allocator: lower `--capacity` by what `nvidia-smi` shows for an idle process |")
    return lines


def main():
    lines = table()
    if "--write" in sys.argv[1:]:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "capture.md")
        text = open(path).read()
        if BEGIN not in text or END not in text:
            sys.exit(f"blind_spots.py: docs/capture.md has no {BEGIN} ... {END} block")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        open(path, "w").write(head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
