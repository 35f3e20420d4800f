"""Reference MLA+MoE DDTree engine and its OpenAI-compatible server (data plane).

Runs on a host as the `local` target's service (`python -m engine`, started as a process by
ops's process manager, never imported by `ops/`), with its stage clock and shadow behind
`/get_server_info`. Imports `kernels` (the tree build, accept and attention backends);
never `ops`.
"""
