"""Durable state: the Redis journal, state snapshots, recovery and leader election (`--state redis://`).

The default (`--state memory`) keeps everything in the process and imports none of this.
"""
