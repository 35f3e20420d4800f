"""Targets and how to reach them, on the operator's machine: the inventory (`inventory`), one
`Host` for `local` (subprocess) and SSH targets (fabric) that differ only in their primitives
(`remote`, `local`, `ssh`), a host's facts (`facts`), data-plane calls that print one JSON
document (`dataplane`), and run records (`records`).

`open_host` is this package's face. Runs on the operator's machine; imports only `ops.errors`,
`ops.files` and the standard checks helpers; never torch, never the CLI.
"""
