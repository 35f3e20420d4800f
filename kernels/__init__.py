"""DDTree kernels (data plane): CUDA C++ with a C ABI, exact CPU references, build and bench."""
