"""Allocation sites: the frame of the user's code each allocation is made at (``#site``/``#at``)."""
from __future__ import annotations

import linecache
import os
import sys
import sysconfig

from . import state

_SITE, _LIBRARY, _OURS = 0, 1, 2


class _Sites:
    """Allocation sites: the innermost Python frame outside torch, the standard library and this
    module. Cheap enough for a million allocs: whether a code object is skipped is decided once,
    and each (code object, line) becomes a site index once."""

    def __init__(self, torch, root):
        self.root = os.path.abspath(root) + os.sep
        paths = sysconfig.get_paths()
        self.libraries = tuple({os.path.abspath(paths[k]) + os.sep for k in ("purelib", "platlib")})
        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.stdlib_dir = os.path.abspath(paths["stdlib"]) + os.sep
        self.here = state.HERE  # (the package's folder: every file under it is the capture's)
        self.kind = {}  # code object -> _SITE, _LIBRARY or _OURS
        self.index = {}  # (code object, line) -> site index
        self.count = 0

    def _kind(self, filename):
        """SITE for a user's frame, LIBRARY for torch's and the standard library's, OURS for the capture package's."""
        name = os.path.abspath(filename)
        if name.startswith(self.here):
            return _OURS
        if filename.startswith("<frozen") or name.startswith(self.torch_dir):
            return _LIBRARY  # the frozen standard library (runpy, importlib), torch
        # Third-party libraries may live under the standard library's directory (on Debian, say).
        if name.startswith(self.stdlib_dir) and not name.startswith(self.libraries):
            return _LIBRARY
        if os.path.basename(name) == "typing_extensions.py":
            return _LIBRARY  # the standard library's backport: @deprecated wraps torch's own calls
        return _SITE

    def _file_line(self, code, line):
        """FILE:LINE, the file relative to the script's folder or its library folder."""
        name = os.path.abspath(code.co_filename)
        if name.startswith(self.root):
            name = name[len(self.root):]
        else:
            under = next((lib for lib in self.libraries if name.startswith(lib)), None)
            name = name[len(under):] if under else code.co_filename
        return f"{name}:{line}"

    def _name(self, code, line):
        return f"{self._file_line(code, line)} {getattr(code, 'co_qualname', code.co_name)}"

    def here_frame(self):
        """(site index, its '#site' text when new, else None) of the caller's allocation."""
        frame = self._site_frame(sys._getframe(1))
        if frame is None:
            return None
        key = (frame.f_code, frame.f_lineno)
        index = self.index.get(key)
        if index is not None:
            return index, None
        index = self.index[key] = self.count
        self.count += 1
        return index, self._name(*key)

    def here_name(self):
        """"FILE:LINE FUNCTION" of the caller's site as PyTorch's own stacks name it (the code's
        name, not its qualified name), or None (the driver backend's sites)."""
        frame = self._site_frame(sys._getframe(1))
        return None if frame is None else f"{self._file_line(frame.f_code, frame.f_lineno)} {frame.f_code.co_name}"

    def here_line(self):
        """"FILE:LINE `code`" of the caller's site (the frame here_frame names), or None."""
        frame = self._site_frame(sys._getframe(1))
        if frame is None:
            return None
        name = self._file_line(frame.f_code, frame.f_lineno)
        code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if len(code) > 60:
            code = code[:59] + "…"
        return f"{name} `{code}`" if code else name

    def _site_frame(self, frame):
        """The innermost user frame from ``frame`` out (else the innermost library one), or None."""
        fallback = None
        kinds = self.kind
        while frame is not None:
            code = frame.f_code
            kind = kinds.get(code)
            if kind is None:
                kind = kinds[code] = self._kind(code.co_filename)
            if kind == _SITE:
                break
            if fallback is None and kind == _LIBRARY:
                fallback = frame  # no user frame at all: the innermost one, as a snapshot's site
            frame = frame.f_back
        return frame or fallback


