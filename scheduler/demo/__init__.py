"""`slotsched demo`: scheduler, reference workers and a multi-tenant workload in one command.

Why a demo package: the design's promises (Guaranteed within the grace period, nominals honoured,
batch soaking up the rest, preemption by checkpoint rather than kill, nothing lost silently) are
claims about a running system; `run.py` runs one and measures them, `workload.py` says what it
asks of it.
"""
