"""``python -m allocbench_capture -o TRACE [flags] -- SCRIPT [ARGS...]``, or this file run by its
path (what ``allocbench capture`` runs): starts the package's ``main``. Nothing else is here, so
the script's own ``import allocbench_capture`` (step() markers, fake()) finds the package already
imported, and with it the capture in progress: there is no second copy of any module."""
import os
import sys

if not __package__:
    # Run by its path, Python put this folder first on sys.path, where the package's modules would
    # shadow the script's imports (`import trace` would find trace.py here). The folder holding the
    # package takes its place, first as the capture's own folder always was (not the working
    # directory, which `-m` puts there, and where a copy of the module may lie).
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import allocbench_capture  # noqa: E402

sys.exit(allocbench_capture.main())
