"""Public agent traces → simulator workloads: the conversion (`convert`) and a policy sized to the
result (`policy`), for `slotsched trace import`."""
