"""The op rules, one module per op family, each registering its rules by op (registry.py).

Importing this package registers them all: blas (cuBLAS workspaces, mixed dtypes), ctc, sdpa
(fused attention), losses, composites (composite kernels run on fake CUDA), sampling
(multinomial), pinned (host memory), convolution; meta_kernels adds Meta kernels for ops that
have none. Known values' rules (reads of values) are in known_values.py."""
from . import blas, composites, convolution, ctc, losses, meta_kernels, normalization, pinned, sampling, sdpa  # noqa: F401
