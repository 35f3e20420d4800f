"""Integrations of the DDTree kernels into real services: SGLang drop-ins and the import hook.

Runs inside the service's own process on a host (a release's `site/` puts the hook on its
path; `service.env` switches it on). Stdlib and the kernels' C ABI only on the import path;
never `ops`.
"""
