"""The names embedders, tests and the cli import to run a server; the composition root that
builds it is scheduler/app/."""

from scheduler.app import GC_THRESHOLDS, RunningServer, StateOptions, serve_forever, start_server
from scheduler.listen import default_advertise

__all__ = [
    "GC_THRESHOLDS",
    "RunningServer",
    "StateOptions",
    "default_advertise",
    "serve_forever",
    "start_server",
]
