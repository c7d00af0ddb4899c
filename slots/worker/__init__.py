"""The reference worker: actors with real, growing state in slots, checkpointed to a snapshot store.

Why a reference worker ships with the scheduler: checkpoint-and-yield is a contract between three
parties (scheduler, lease holder, worker) and a snapshot store. This package is the worker side
done right — fenced by epoch, verified on resume, never losing work silently — and the SDK's
`scheduler.client.worker_runtime` gives a lease holder the callbacks that drive it (runtime-side
code, so it lives beside the SDK), so the whole yield path can be run and measured end to end
(`slotsched worker`, `slotsched demo`, `bench/yield.py`).

Modules: `actor` (the simulated agent and its state format), `host` (actors in slots), `service`
(the slotsched.v1.Worker servicer), `leases` (is a Start backed by a lease the scheduler granted
on this worker?), `agent` (Register/Heartbeat/Drain/Deregister; keeps the scheduler's view of our
leases), `main` (`start_worker`, `run_worker`), `metrics`.
"""
