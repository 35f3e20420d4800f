"""Integrations of the DDTree kernels into real services: SGLang drop-ins and the import hook.

Runs inside the service's own process on a host (a release's `site/` puts the hook on its
path; `service.env` switches it on). The hook is stdlib only at import; the drop-ins use torch,
numpy, the kernels' C ABI and their own CPython extension (`integration/csrc`, compiled with
g++ on first use by `integration.native`); never `ops`. `integration.counters` is the hook's
stage clock (every call counted and timed per process, in a memory-mapped file read by
`checks.hook_counters`), `integration.shadow` its shadow (a candidate run beside the stock
function, compared and timed, mismatches saved for replay). `integration.fork_style` is the
fork's algorithm in plain Python (a baseline), `integration.percall` measures the per-call cost
(the drop-ins' and the hook's own).
"""
