"""Kubernetes adapters of the scheduler (the kubernetes client is imported here only)."""
