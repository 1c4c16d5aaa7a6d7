// fp32 path of the CUDA backend: backward kernels (SPEC.md section 3). The per-thread math is in
// f32_kernels.cuh; this file maps threads to work and launches, in this order on one stream:
//   preprocess   (n, h, i):  D_i - d_lse_i and the row's d_sinks term into the workspace
//   d_sinks      one block per head: fixed-order sum (written, never accumulated into)
//   dq           (n, h, i):  dq_i, and dS_ij into d_bias or its workspace
//   dk dv        (n, kv head, j): loops over the group's query heads and the rows that see key j
//   d_bias       fixed-order sum of dS over the broadcast dims of bias (only when bias broadcasts)
// No float atomics: every output element is produced by one thread in a fixed order, so the backward is
// bitwise deterministic whatever `deterministic` says.
#include "cuda/fp32/f32_launch.hpp"

namespace sinkattn::cuda_f32 {

namespace {

__global__ void __launch_bounds__(kThreads) preprocess_kernel(const KParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.s_q) return;
  preprocess_row(p, blockIdx.z, blockIdx.y, i);
}

// d_sinks[h] = sum_t partial_t (thread order), partial_t = sum of rows t, t + T, ... (double).
__global__ void __launch_bounds__(kReduceThreads) dsinks_kernel(const KParams p) {
  __shared__ double part[kReduceThreads];
  const int64_t h = blockIdx.x;
  part[threadIdx.x] = dsinks_partial(p, h, static_cast<int>(threadIdx.x), kReduceThreads);
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int t = 0; t < kReduceThreads; ++t) s += part[t];
    p.d_sinks[h * p.d_sinks_st] = static_cast<float>(s);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads) dq_kernel(const KParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.s_q) return;
  dq_row<HD>(p, blockIdx.z, blockIdx.y, i);
}

template <int HD>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(const KParams p) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.s_kv) return;
  dkdv_key<HD>(p, blockIdx.z, blockIdx.y, j);
}

__global__ void dbias_kernel(const KParams p) {
  const int64_t total = p.bias_nb * p.bias_nh * p.s_q * p.s_kv;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dbias_reduce(p, e);
}

unsigned stride_blocks(int64_t total) {
  const int64_t b = (total + 255) / 256;
  return static_cast<unsigned>(b < 65536 ? b : 65536);
}

dim3 row_grid(int64_t rows, int64_t heads, int64_t b) {
  return dim3(static_cast<unsigned>((rows + kThreads - 1) / kThreads), static_cast<unsigned>(heads),
              static_cast<unsigned>(b));
}

template <int HD>
void launch_main(const KParams& p, cudaStream_t stream, bool dq) {
  if (dq)
    dq_kernel<HD><<<row_grid(p.s_q, p.h_q, p.b), kThreads, 0, stream>>>(p);
  else
    dkdv_kernel<HD><<<row_grid(p.s_kv, p.h_kv, p.b), kThreads, 0, stream>>>(p);
}

}  // namespace

cudaError_t launch_backward(const KParams& p, int tile, cudaStream_t stream, const char** what) {
  cudaError_t e = cudaSuccess;
  if (tile != 64 && tile != 128 && tile != 256) return cudaErrorInvalidValue;
  const bool rows = p.b > 0 && p.s_q > 0;
  if (rows) {
    *what = "fp32 backward preprocess kernel";
    preprocess_kernel<<<row_grid(p.s_q, p.h_q, p.b), kThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.d_sinks != nullptr && p.h_q > 0) {
    *what = "fp32 backward d_sinks kernel";
    dsinks_kernel<<<static_cast<unsigned>(p.h_q), kReduceThreads, 0, stream>>>(p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (rows) {
    *what = "fp32 backward dq kernel";
    switch (tile) {
      case 64: launch_main<64>(p, stream, true); break;
      case 128: launch_main<128>(p, stream, true); break;
      default: launch_main<256>(p, stream, true); break;
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.b > 0 && p.s_kv > 0) {
    *what = "fp32 backward dk dv kernel";
    switch (tile) {
      case 64: launch_main<64>(p, stream, false); break;
      case 128: launch_main<128>(p, stream, false); break;
      default: launch_main<256>(p, stream, false); break;
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  if (p.d_bias != nullptr && p.ds_dst != p.d_bias) {
    const int64_t total = p.bias_nb * p.bias_nh * p.s_q * p.s_kv;
    if (total > 0) {
      *what = "fp32 backward d_bias reduce kernel";
      dbias_kernel<<<stride_blocks(total), 256, 0, stream>>>(p);
      if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

}  // namespace sinkattn::cuda_f32
