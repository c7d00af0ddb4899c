"""Defaults shared by the worker and its CLI, in a module that imports nothing heavy (no gRPC), so
`slotsched --help` can show them."""

from __future__ import annotations

import os
import tempfile

#: Overrides the default store (the deploy manifests set it; the tests point it at a directory of
#: their own, so no run leaves checkpoints in the shared temporary directory).
SNAPSHOTS_ENV = "SLOTSCHED_SNAPSHOTS"
#: The default without $SLOTSCHED_SNAPSHOTS: a directory under the system's temporary one.
FALLBACK_SNAPSHOTS = os.path.join(tempfile.gettempdir(), "slotsched-snapshots")
#: Where a worker keeps actor checkpoints when no --snapshots store is given.
DEFAULT_SNAPSHOTS = os.environ.get(SNAPSHOTS_ENV) or FALLBACK_SNAPSHOTS
