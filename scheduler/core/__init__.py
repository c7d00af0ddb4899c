"""The policy core: a pure, deterministic state machine (events in, decisions out).

It reads no clock, does no I/O and draws no random numbers: time and ids are passed in, so the
server (real time) and the simulator (virtual time) run exactly the same decisions.
"""
