"""The simulator: the same policy core, driven in virtual time."""
