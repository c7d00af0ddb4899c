"""Baseline deciders the comparison runs slotsched against, one documented behaviour per file."""
