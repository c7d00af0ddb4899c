"""What following a pool costs against leading it, side by side: two `serve --leadership pool`
replicas on one Redis, load (acquire+release pairs, or renewals) on the pools the first leads,
and each replica's CPU seconds per operation by process (its idle share included).

Small and quick (6 pools, 10 s), so two builds can be alternated on a loaded machine: run it
from each build's root in turn (`cd BUILD && PYTHONPATH=. python bench/follow_cost.py`); the
replicas run the build the script is in. `--profile r1` runs the second replica (the follower)
under cProfile and writes `--profile-out` when it stops.

Usage: `python bench/follow_cost.py [--kind pairs|renew] [--seconds S] [--profile r0|r1]
[--profile-out FILE]`. Progress on stderr; the last line is `key=value` pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pools_procs import Net, Replica, pools_policy, settled  # noqa: E402
from bench.procs import free_port, start_redis, stop_all  # noqa: E402
from bench.scaleout import cpu_of, run_load  # noqa: E402


async def main(args: argparse.Namespace) -> dict[str, int | float]:
    root = tempfile.mkdtemp(prefix="slotsched-follow-")
    pools = [f"p{i}" for i in range(args.pools)]
    policy, keys = os.path.join(root, "policy.yaml"), os.path.join(root, "grant-keys")
    Path(policy).write_text(pools_policy(pools))
    Path(keys).write_text(f"bench:{base64.b64encode(os.urandom(32)).decode()}\n")
    port = free_port()
    redis = start_redis(port, root)
    state = f"redis://127.0.0.1:{port}/0"
    reps = [Replica(f"r{i}", root, policy, state, keys, prefix="follow") for i in range(2)]
    for r in reps:
        if r.name == args.profile:
            r.args = [r.args[0], "-m", "cProfile", "-o", args.profile_out, *r.args[1:]]
        r.spawn()
    try:
        await asyncio.gather(*(r.wait_listening() for r in reps))
        net = Net([r.target for r in reps])
        owner = await settled(net, reps, pools, timeout_s=60)
        await net.close()
        await asyncio.sleep(2.0)  # past the start-up's loads
        mine = {p: a for p, a in owner.items() if a == reps[0].target}
        pids = {r.name: r.proc.pid for r in reps if r.proc is not None}
        before = {k: cpu_of(pid) for k, pid in pids.items()}
        res = run_load(args.kind, mine, args.seconds, 50, "f")
        after = {k: cpu_of(pid) for k, pid in pids.items()}
    finally:
        for r in reps:
            if r.proc is not None:
                r.proc.send_signal(signal.SIGTERM)  # a profiled replica writes its profile
        for r in reps:
            if r.proc is not None:
                r.proc.wait(timeout=30)
        stop_all([redis])
    ops = max(1, int(res["ops"]))
    lead, follow = ((after[k] - before[k]) / ops * 1e6 for k in ("r0", "r1"))
    print(f"[follow_cost] {ops} {args.kind} on {len(mine)} pools; logs in {root}", file=sys.stderr)
    ratio = follow / lead
    return {"ops": ops, "lead_us_per_op": lead, "follow_us_per_op": follow, "follow_lead_ratio": ratio}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("pairs", "renew"), default="pairs")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--pools", type=int, default=6, help="pools in the policy (half led by each)")
    ap.add_argument("--profile", choices=("r0", "r1"), default=None)
    ap.add_argument("--profile-out", default="follow.prof")
    fig = asyncio.run(main(ap.parse_args()))
    print(" ".join(f"{k}={v}" if isinstance(v, int) else f"{k}={v:.3g}" for k, v in fig.items()))
