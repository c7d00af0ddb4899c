"""The built-in policy of `slotsched serve` when no policy file is given."""

from __future__ import annotations

import functools
from typing import Final

from scheduler.policy.model import Policy
from scheduler.policy.yaml_io import parse_policy

DEFAULT_POLICY_YAML: Final = """\
# The built-in policy of `slotsched serve` when no policy file is given.
apiVersion: slotsched.dev/v1alpha1
kind: SchedulingPolicy
metadata:
  name: default
spec:
  pool:
    slotsPerWorker: 2
    workers: 4          # 8 slots
    minWorkers: 1
    maxWorkers: 8
    floor: 2            # reserved for Guaranteed work, lent out while idle
  tenants:
    - name: sre         # incident responders: may hold the whole floor
      weight: 1
      guaranteed: 2
      burstable: {nominal: 1, limit: 4}
    - name: product     # interactive product work
      weight: 2
      guaranteed: 0
      burstable: {nominal: 2, limit: 6}
    - name: batch       # batch jobs: BestEffort only, no cap
      weight: 1
      guaranteed: 0
      burstable: {nominal: 0, limit: 0}
"""


@functools.cache
def default_policy() -> Policy:
    """The built-in policy (DEFAULT_POLICY_YAML), parsed once."""
    policy, _ = parse_policy(DEFAULT_POLICY_YAML)
    return policy
