// CUDA runtime error check for the GPU test and benchmark programs (gpu_suite.cpp, gpu_bench.cpp,
// gpu_determinism.cpp, gpu_decode.cpp, gpu_bench_decode.cu, gpu_bench_philox.cu): prints the error and the call, exits with status 2.
// CK(expr) is the short name.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define SINKATTN_TEST_CUDA_OK(expr)                                                                           \
  do {                                                                                                        \
    cudaError_t _e = (expr);                                                                                  \
    if (_e != cudaSuccess) {                                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(_e), __FILE__, __LINE__, #expr); \
      std::exit(2);                                                                                           \
    }                                                                                                         \
  } while (0)

#define CK(expr) SINKATTN_TEST_CUDA_OK(expr)
