// fp32 path of the CUDA backend: forward kernels (SPEC.md section 2). The per-thread math is forward_row in
// f32_kernels.cuh (one thread per (n, h, query row)); this file only maps threads to work and launches.
#include "cuda/fp32/f32_launch.hpp"

namespace sinkattn::cuda_f32 {

namespace {

// blockIdx.z = n, blockIdx.y = h, x covers the query rows 0 .. s_q - 1 of the sequence.
template <int HD>
__global__ void __launch_bounds__(kThreads) forward_kernel(const KParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.s_q) return;
  forward_row<HD>(p, blockIdx.z, blockIdx.y, i);
}

__global__ void rng_state_kernel(const KParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) write_rng_state(p);
}

}  // namespace

cudaError_t launch_forward(const KParams& p, int tile, cudaStream_t stream, const char** what) {
  cudaError_t e = cudaSuccess;
  if (p.b > 0 && p.s_q > 0) {
    *what = "fp32 forward kernel";
    const dim3 grid(static_cast<unsigned>((p.s_q + kThreads - 1) / kThreads), static_cast<unsigned>(p.h_q),
                    static_cast<unsigned>(p.b));
    switch (tile) {
      case 64: forward_kernel<64><<<grid, kThreads, 0, stream>>>(p); break;
      case 128: forward_kernel<128><<<grid, kThreads, 0, stream>>>(p); break;
      case 256: forward_kernel<256><<<grid, kThreads, 0, stream>>>(p); break;
      default: return cudaErrorInvalidValue;
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.rng_out != nullptr) {
    *what = "fp32 forward: rng_state";
    rng_state_kernel<<<1, 32, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace sinkattn::cuda_f32
