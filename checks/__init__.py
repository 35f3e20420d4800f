"""Data-plane checks (health, token identity, GPU inventory, load), each runnable on a host as
`python -m checks.<name> --json`."""
