"""torch.multinomial on fake CUDA: the buffers its kernel allocates after its result."""
from __future__ import annotations

from .registry import rule


@rule("scratch", "aten.multinomial.default")
def _multinomial(recorder, func, args, kwargs, out, pending):
    """multinomial's buffers on fake CUDA (a result with elements)."""
    import torch

    if recorder.device_type == "cuda" and recorder.fake and isinstance(out, torch.Tensor) and out.numel():
        _multinomial_buffers(recorder, args, kwargs)


def _multinomial_buffers(recorder, args, kwargs):
    """multinomial_out (Distributions.cpp, shared by CPU and CUDA) after its result: one sample
    or none replaced runs on the device's ops, checking the probabilities (aminmax, the
    compares, row sums) with _assert_async, then q = empty_like(self) for argmax(self / q)
    or topk's values; more samples with replacement run MultinomialKernel.cu, which copies,
    renormalises and prefix-sums the distribution in three buffers. Each freed when it
    goes out of scope (temporaries at the end of their statement, the last made first)."""
    probs, n_sample = args[0], args[1]
    replacement = kwargs.get("replacement", args[2] if len(args) > 2 else False)
    e, whole = probs.element_size(), probs.numel() * probs.element_size()
    rows = probs.shape[0] if probs.dim() == 2 else 1
    alloc = lambda n: (recorder._alloc(n, probs), n)  # noqa: E731
    free = lambda *buffers: [recorder.sink.free(*b) for b in buffers]  # noqa: E731
    if replacement and n_sample > 1:
        dists = [alloc(whole) for _ in range(3)]  # origDist, normDist, prefixSum
        free(*reversed(dists))
        return
    low, high = alloc(e), alloc(e)  # auto [self_min, self_max] = recorder.aminmax()
    at_least_zero, below_inf = alloc(1), alloc(1)  # (the right operand of & first)
    is_valid = alloc(1)
    free(below_inf, at_least_zero)
    if probs.dim() == 1:
        total = alloc(e)
        zero_prob = alloc(1)
        free(total)
    else:
        totals = alloc(rows * e)
        zero_rows = alloc(rows)
        zero_prob = alloc(1)  # .any()
        free(zero_rows, totals)
    free(alloc(1))  # ~zero_prob_condition, for _assert_async
    q = alloc(whole)  # exponential_ and div_out in place
    values = [alloc(rows * n_sample * e)] if n_sample > 1 else []  # topk_out's values
    free(*values, q, zero_prob, is_valid, low, high)
