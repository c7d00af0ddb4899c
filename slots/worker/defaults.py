"""Defaults shared by the worker and its CLI, in a module that imports nothing heavy (no gRPC), so
`slotsched --help` can show them."""

from __future__ import annotations

import os
import tempfile

#: Where a worker keeps actor checkpoints when no --snapshots store is given.
DEFAULT_SNAPSHOTS = os.path.join(tempfile.gettempdir(), "slotsched-snapshots")
