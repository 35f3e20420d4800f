"""Health, token-identity, GPU inventory and load checks, each runnable as `python -m checks.<name> --json` (data plane)."""
