"""Token budgets in the simulator: the LLM calls of real agent sessions against a provider's rate
limit, under slotsched's budget core and the limiters platforms run today (docs/platform-teams.md,
"Token budgets in the simulator")."""
