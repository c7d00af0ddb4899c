"""The composition root: builds a running server from options (root.py), one module per
serving mode saying what it wires (memory.py, one_leader.py, pools.py), and `slotsched serve`'s
run until a signal (forever.py). docs/architecture.md, "The rooms"."""

from scheduler.app.forever import GC_THRESHOLDS, serve_forever
from scheduler.app.options import StateOptions
from scheduler.app.root import MODES, start_server
from scheduler.app.running import RunningServer

__all__ = ["GC_THRESHOLDS", "MODES", "RunningServer", "StateOptions", "serve_forever", "start_server"]
