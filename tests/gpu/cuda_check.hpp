// CUDA runtime error check for the GPU test and benchmark programs: prints the error and the call, exits with 2.
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
