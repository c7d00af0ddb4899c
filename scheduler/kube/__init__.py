"""Kubernetes adapters of the scheduler (the kubernetes client is imported here only, and only
with the `kubernetes` extra installed: `pip install 'slotsched[kubernetes]'`)."""
