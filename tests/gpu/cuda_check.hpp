// CK(expr): a CUDA runtime call that must succeed in the GPU programs (gpu_bench.cpp, gpu_determinism.cpp); on an
// error it prints the call's place and exits with status 2.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);    \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)
