"""DDTree kernels (data plane): CUDA C++ with a C ABI, exact CPU references, build and bench.

Runs on a host inside a release: `python -m kernels.build` (nvcc for the target's arch),
`python -m kernels.selftest` (bit-exact against `kernels.reference`) and `python -m
kernels.bench` each print one JSON document. Imports torch and numpy; never `ops`.
"""
