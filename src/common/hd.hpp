// Host + device qualifiers for the definitions every path shares (src/common/*, src/core/philox.hpp): written once,
// compiled into the CPU backend, the CUDA kernels and their host-side emulations alike.
#pragma once

#if defined(__CUDACC__)
#define SINKATTN_HD __host__ __device__ __forceinline__
#else
#define SINKATTN_HD inline
#endif
