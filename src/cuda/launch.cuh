// CUDA backend: definitions of the per-tile launchers (included by inst_hd*.cu, one head-dim tile each).
#pragma once

#include "cuda/bwd_kernel.cuh"
#include "cuda/fwd_kernel.cuh"
#include "cuda/kernels.hpp"

namespace sinkattn::cuda {

template <typename Kernel>
inline cudaError_t prepare_smem(Kernel kernel, int smem) {
  if (smem > 48 * 1024) return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return cudaSuccess;
}

template <typename T, int HD>
cudaError_t launch_fwd(const Params& p, cudaStream_t stream) {
  using Tr = FwdTraits<HD>;
  const int mblocks = (p.s_q + Tr::kBlockM - 1) / Tr::kBlockM;
  if (mblocks == 0 || p.h_q == 0 || p.b == 0) return cudaSuccess;
  const dim3 grid(mblocks, p.h_q, p.b);
  if (p.bias != nullptr || p.dropout) {  // bias / dropout variant: at most 2 blocks per SM (fewer spills)
    constexpr int kMinB = Tr::kMinBlocks < 2 ? Tr::kMinBlocks : 2;
    cudaError_t e = prepare_smem(fwd_kernel<T, HD, true, kMinB>, Tr::kSmem);
    if (e != cudaSuccess) return e;
    fwd_kernel<T, HD, true, kMinB><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
  } else if constexpr (HD == 128) {
    // Head dim 128 without bias / dropout: 64 keys per step (measured 277 vs 257 TFLOP/s on the MHA bench
    // shape, bench/RESULTS.md); the bias / dropout variant keeps FwdTraits' 32 (fewer spills).
    constexpr int smem = (Tr::kBlockM + 4 * 64) * Tr::kStride * 2;
    cudaError_t e = prepare_smem(fwd_kernel<T, HD, false, Tr::kMinBlocks, 64>, smem);
    if (e != cudaSuccess) return e;
    fwd_kernel<T, HD, false, Tr::kMinBlocks, 64><<<grid, Tr::kThreads, smem, stream>>>(p);
  } else {
    cudaError_t e = prepare_smem(fwd_kernel<T, HD, false>, Tr::kSmem);
    if (e != cudaSuccess) return e;
    fwd_kernel<T, HD, false><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, int HD>
cudaError_t launch_bwd_dq(const Params& p, cudaStream_t stream) {
  using Tr = DqTraits<HD>;
  const int mblocks = (p.s_q + Tr::kBlockM - 1) / Tr::kBlockM;
  if (mblocks == 0 || p.h_q == 0 || p.b == 0) return cudaSuccess;
  cudaError_t e = prepare_smem(bwd_dq_kernel<T, HD>, Tr::kSmem);
  if (e != cudaSuccess) return e;
  bwd_dq_kernel<T, HD><<<dim3(mblocks, p.h_q, p.b), Tr::kThreads, Tr::kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int HD>
cudaError_t launch_bwd_dkdv(const Params& p, cudaStream_t stream) {
  using Tr = DkvTraits<HD>;
  const int nblocks = (p.s_kv + Tr::kBlockN - 1) / Tr::kBlockN;
  if (nblocks == 0 || p.h_kv == 0 || p.b == 0) return cudaSuccess;
  const dim3 grid(nblocks, p.h_kv, p.b);
  if (p.bias != nullptr || p.dropout) {
    cudaError_t e = prepare_smem(bwd_dkdv_kernel<T, HD, true>, Tr::kSmem);
    if (e != cudaSuccess) return e;
    bwd_dkdv_kernel<T, HD, true><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
  } else {
    cudaError_t e = prepare_smem(bwd_dkdv_kernel<T, HD, false>, Tr::kSmem);
    if (e != cudaSuccess) return e;
    bwd_dkdv_kernel<T, HD, false><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
  }
  return cudaGetLastError();
}

#define SINKATTN_CUDA_INSTANTIATE(HD)                                                       \
  template cudaError_t launch_fwd<__half, HD>(const Params&, cudaStream_t);               \
  template cudaError_t launch_fwd<__nv_bfloat16, HD>(const Params&, cudaStream_t);        \
  template cudaError_t launch_bwd_dq<__half, HD>(const Params&, cudaStream_t);            \
  template cudaError_t launch_bwd_dq<__nv_bfloat16, HD>(const Params&, cudaStream_t);     \
  template cudaError_t launch_bwd_dkdv<__half, HD>(const Params&, cudaStream_t);          \
  template cudaError_t launch_bwd_dkdv<__nv_bfloat16, HD>(const Params&, cudaStream_t);

}  // namespace sinkattn::cuda
