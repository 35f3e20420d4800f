"""Releases and deploys, on the operator's machine: package a release from git (`release`), put it
on a host and prove it (`deploy`: send, build, self-test, switch, restart, post-flight,
automatic rollback), the host-side actions and the revert guard as the control plane runs them
(`host_actions`), fleet waves (`fleet`), and the typed options and results they exchange
(`result`).

Runs on the operator's machine. May import `ops.errors`, `ops.files`, `ops.hosts`,
`ops.hostside` (as source text it sends), `ops.service.managers` and `ops.measure.healthcheck`;
never the
CLI.
"""
