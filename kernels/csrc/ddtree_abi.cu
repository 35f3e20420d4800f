// ddtree_abi.cu: ABI version and error strings of the DDTree kernel library.
#include "ddtree_kernels.h"

#include <cuda_runtime.h>

extern "C" int ddtree_abi_version(void) { return DDTREE_ABI_VERSION; }

extern "C" const char* ddtree_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
