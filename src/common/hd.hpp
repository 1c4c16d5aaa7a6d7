// Host + device qualifiers for the definitions every path shares (src/common/*, src/core/philox.hpp): written once,
// compiled into the CPU backend, the CUDA kernels and their host-side emulations alike.
#pragma once

#if defined(__CUDACC__)
#define SINKATTN_HD __host__ __device__ __forceinline__
#else
#define SINKATTN_HD inline
#endif

namespace sinkattn {

// min / max of two integers: CUDA's min / max in device code (the instructions the kernels always had), a plain
// comparison on the host.
template <typename I>
SINKATTN_HD I hd_min(I a, I b) {
#if defined(__CUDA_ARCH__)
  return min(a, b);
#else
  return b < a ? b : a;
#endif
}
template <typename I>
SINKATTN_HD I hd_max(I a, I b) {
#if defined(__CUDA_ARCH__)
  return max(a, b);
#else
  return a < b ? b : a;
#endif
}

}  // namespace sinkattn
