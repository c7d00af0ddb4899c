"""The gRPC shell around the policy core.

The core decides; this package only carries its decisions over the wire. One asyncio event loop
owns the core (`loop.SchedulerLoop`), servicers translate proto <-> domain, `errors` maps every
refusal to a status, `auth` names the caller (a tenant, or the admin or worker role), `metrics`
exports what was decided, and `app` assembles the gRPC server (scheduler/app/ wires it to
the state store and the autoscaler; this package never imports scheduler/state/). Nothing here
makes a scheduling decision.
"""
