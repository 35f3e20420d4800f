"""DDTree kernels: CUDA C++ sources with a C ABI, exact CPU references, build and bench (data plane)."""
