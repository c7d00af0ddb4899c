"""Prometheus metrics of a worker: what its actors cost and, above all, what they lost.

Why these and not more: checkpoint-and-yield promises that preemption loses nothing; when it does
lose something (a checkpoint that failed or came late, a corrupt snapshot, a fenced actor), the
loss must be visible, never silent. So every loss increments
`slotsched_worker_work_lost_slot_seconds_total{reason}`, every resume either
`slotsched_worker_resumes_verified_total` or `slotsched_worker_resume_failures_total{reason}`,
and checkpoints are timed and sized. A Start the scheduler's leases do not back (leases.py) is
refused and counted in `slotsched_worker_starts_refused_total{reason}` (unknown_lease,
tenant_mismatch, stale_epoch, snapshot_mismatch, ..., unverified: the scheduler could not be
asked), so probing for other tenants' sessions shows up. Each worker gets its own
CollectorRegistry, so a process can host several (the demo, tests) without their series
colliding.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from slots.worker import vitals

CHECKPOINT_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BYTES_BUCKETS = tuple(float(1 << n) for n in range(10, 34, 2))  # 1 KiB .. 8 GiB

#: Why work was lost (label `reason` of the work-lost counter).
LOST_FENCED = "fenced"  # the actor's lease ended without a checkpoint covering its latest work
LOST_WORKER_EXIT = "worker_exit"  # the worker stopped with the actor still running
LOST_SNAPSHOT_REFUSED = "snapshot_refused"  # a resume fell back to an older snapshot (or none)

#: Why a resume failed (label `reason` of the resume-failures counter).
RESUME_CORRUPT = "corrupt"  # checksum mismatch or inconsistent state
RESUME_MISSING = "missing"  # the snapshot does not exist (any more)
RESUME_UNAVAILABLE = "unavailable"  # the store could not be reached
RESUME_REFUSED = "refused"  # the ref lies outside the tenant's prefix


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.work_lost = Counter(
            "slotsched_worker_work_lost_slot_seconds",
            "Slot-seconds of actor work no snapshot saved (lost on fencing, exit or a refused snapshot).",
            ["reason"],
            registry=r,
        )
        self.resume_failures = Counter(
            "slotsched_worker_resume_failures",
            "Snapshots a resume could not use (each one refused counts once).",
            ["reason"],
            registry=r,
        )
        self.resumes_verified = Counter(
            "slotsched_worker_resumes_verified",
            "Actors restored from a snapshot whose sha256 and internal consistency were verified.",
            registry=r,
        )
        self.checkpoints = Counter(
            "slotsched_worker_checkpoints", "Checkpoints by outcome (ok, failed).", ["outcome"], registry=r
        )
        self.checkpoint_seconds = Histogram(
            "slotsched_worker_checkpoint_seconds",
            "Time to serialise an actor and write it to the snapshot store.",
            buckets=CHECKPOINT_SECONDS_BUCKETS,
            registry=r,
        )
        self.checkpoint_bytes = Histogram(
            "slotsched_worker_checkpoint_bytes",
            "Size of written snapshots.",
            buckets=CHECKPOINT_BYTES_BUCKETS,
            registry=r,
        )
        self.starts_refused = Counter(
            "slotsched_worker_starts_refused",
            "Starts refused because no lease the scheduler granted on this worker matched, by reason.",
            ["reason"],
            registry=r,
        )
        self.actors = Gauge("slotsched_worker_actors", "Actors running on this worker.", registry=r)
        self.slots = Gauge("slotsched_worker_slots", "Slots this worker offers.", registry=r)
        # Read at each scrape; the same numbers go to the scheduler with every heartbeat (recycling).
        Gauge(
            "slotsched_worker_rss_bytes", "Resident memory of the worker process, in bytes.", registry=r
        ).set_function(vitals.rss_bytes)
        Gauge(
            "slotsched_worker_uptime_seconds", "Seconds since the worker process started.", registry=r
        ).set_function(vitals.uptime_s)

    # Totals, for the demo and tests (summed over labels).

    def _total(self, name: str) -> float:
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name:
                    total += sample.value
        return total

    def work_lost_total(self) -> float:
        return self._total("slotsched_worker_work_lost_slot_seconds_total")

    def resume_failures_total(self) -> int:
        return int(self._total("slotsched_worker_resume_failures_total"))

    def starts_refused_total(self) -> int:
        return int(self._total("slotsched_worker_starts_refused_total"))

    def resumes_verified_total(self) -> int:
        return int(self._total("slotsched_worker_resumes_verified_total"))
