"""Measurements of a host and its service, driven from the operator's machine: the kernel bench
beside a live service with its GPU guard (`bench`, `gpu_guard`), the interference probe's
counters (`counters`), load (`loadtest`), the service's profile and its shadow (`profile`,
`shadow`), and the pre- and post-flight healthcheck (`healthcheck`).

Runs on the operator's machine and calls data-plane commands on the host (`checks.*`,
`kernels.bench`) through `ops.hosts`; never imports torch, never the CLI.
"""
