"""Token budgets: the provider's rate limit as a scheduled resource (docs/design.md, "Token
budgets"). `Budgets` (core.py) is what the shell drives; `types` its vocabulary; `book` one
budget's buckets and order of service; `shares` a tenant's share of one; `buckets` the token
bucket that may owe. Pure: time passed in, no I/O."""
