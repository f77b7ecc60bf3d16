"""nn modules whose CUDA paths need the driver or data (cuDNN's RNNs, TransformerEncoder's
nested-tensor fast path): the path a fake capture runs instead, said once."""
from __future__ import annotations

import functools
import threading

def _rnns_without_cudnn(torch, patches, recorder, on_fake_cuda=None):
    """nn.RNN/LSTM/GRU on fake CUDA run PyTorch's non-cuDNN kernels (cuDNN's RNN needs the
    driver; the driver backend's fake cuDNN has no RNN), as under ``torch.backends.cudnn.enabled
    = False``, said once: their allocations are those kernels' (per-layer gate buffers), not
    cuDNN's workspace and reserve. Convolutions keep cuDNN's path. ``on_fake_cuda(weight)``: is
    this module's weight on the fake card (default: a CUDA fake tensor)."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    if on_fake_cuda is None:
        on_fake_cuda = lambda w: isinstance(w, fake_type) and w.device.type == "cuda"  # noqa: E731
    # The flag is the process's: RNNs running at once (on threads) turn it off once, and the
    # last to finish restores what it was.
    lock, running, before = threading.Lock(), [0], [True]

    for cls in (torch.nn.RNN, torch.nn.LSTM, torch.nn.GRU):

        def forward(self, *args, _original=cls.forward, **kwargs):
            weight = next(iter(self._flat_weights), None) if getattr(self, "_flat_weights", None) else None
            if weight is None or not on_fake_cuda(weight):
                return _original(self, *args, **kwargs)
            recorder.say_once("RNNs", "run PyTorch's non-cuDNN kernels on fake CUDA (no fake of cuDNN's RNN): their buffers are those kernels'",
                              trace_note="PyTorch's non-cuDNN kernels (no fake of cuDNN's RNN)")
            with lock:
                if not running[0]:
                    before[0] = torch.backends.cudnn.enabled
                    torch.backends.cudnn.enabled = False
                running[0] += 1
            try:
                return _original(self, *args, **kwargs)
            finally:
                with lock:
                    running[0] -= 1
                    if not running[0]:
                        torch.backends.cudnn.enabled = before[0]

        patches.set(cls, "forward", forward)


def _padding_kept(torch, patches, recorder):
    """nn.TransformerEncoder in inference with a src_key_padding_mask drops the padded tokens on
    a GPU (its fast path packs the rest into a nested tensor, whose size depends on the mask's
    values); the capture runs the unfused path (fast path off), which keeps them: said once, as
    the trace's activations are then an upper bound."""
    fake_type = torch._subclasses.fake_tensor.FakeTensor
    original = torch.nn.TransformerEncoder.forward

    def forward(self, src, *args, **kwargs):
        padding_mask = kwargs.get("src_key_padding_mask", args[1] if len(args) > 1 else None)
        if (padding_mask is not None and not self.training and not torch.is_grad_enabled() and getattr(self, "use_nested_tensor", False)
                and isinstance(src, fake_type) and src.device.type == "cuda"):
            recorder.say_once("nn.TransformerEncoder", "keeps padded tokens on fake CUDA: with a src_key_padding_mask in inference a GPU run "
                              "drops them (nested tensors sized by the mask's values), so the trace's activations are an upper bound",
                              "padded tokens kept (a GPU's inference fast path drops them)")
        return original(self, src, *args, **kwargs)

    functools.update_wrapper(forward, original)
    patches.set(torch.nn.TransformerEncoder, "forward", forward)

