"""Attribute replacements (``_Patches``), undone in reverse order when the capture ends; a
replaced function TorchScript knows stays mapped to its aten op."""
from __future__ import annotations

class _Patches:
    """Attribute replacements undone in reverse order when the capture ends."""

    def __init__(self):
        self.saved = []

    def set(self, obj, name, value):
        # A class's own attribute as stored (a staticmethod stays one), or none: an inherited
        # one is restored by deleting the override.
        old = vars(obj).get(name, _MISSING) if isinstance(obj, type) else getattr(obj, name, _MISSING)
        op = _builtin_op(old)  # (asked before the replacement is in place: torch builds its table lazily)
        self.saved.append((obj, name, old))
        setattr(obj, name, value)
        if op is not None:
            _script_as_builtin(value, op)

    def undo(self):
        for obj, name, old in reversed(self.saved):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
        self.saved.clear()


_MISSING = object()
_KEPT_FOR_BUILTIN_IDS = []


# TorchScript compiles a call to F.linear, torch.tensor... as the aten op it maps the original
# function to; a replacement it does not know it would try to compile from its Python source
# (torch.jit.script of any module with an nn.Linear failed on the wrapper's `try`). A replacement
# is mapped to the original's op: scripted code calls the op, as it does without a capture.
def _builtin_op(original):
    """The aten op TorchScript maps `original` to, or None."""
    if original is _MISSING or not callable(original):
        return None
    try:
        from torch.jit._builtins import _find_builtin

        return _find_builtin(original)
    except Exception:  # noqa: BLE001 - a torch without these internals: scripting is as before
        return None


def _script_as_builtin(replacement, op):
    try:
        from torch.jit._builtins import _register_builtin

        _register_builtin(replacement, op)
        _KEPT_FOR_BUILTIN_IDS.append(replacement)  # (the table goes by id: never freed and reused)
    except Exception:  # noqa: BLE001 - as in _builtin_op
        pass
