"""Integrations of the DDTree kernels into real services: SGLang drop-ins and the import hook.

Runs inside the service's own process on a host (a release's `site/` puts the hook on its
path; `service.env` switches it on). The hook is stdlib only at import; the drop-ins use torch,
numpy, the kernels' C ABI and their own CPython extension (`integration/csrc`, compiled with
g++ on first use by `integration.native`); never `ops`. `integration.fork_style` is the fork's
algorithm in plain Python (a baseline), `integration.percall` measures the per-call cost.
"""
