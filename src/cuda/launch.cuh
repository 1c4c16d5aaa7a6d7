// CUDA backend: definitions of the per-tile launchers (included by inst_hd*.cu, one head-dim tile each).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdlib>
#include <type_traits>

#include "cuda/bwd_kernel.cuh"
#include "cuda/fwd_kernel.cuh"
#include "cuda/hopper/bwd_dkdv_sm90.cuh"
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

// The Hopper dK dV kernel (hopper/bwd_dkdv_sm90.cuh) runs when the library carries sm_90a code (CMake defines
// SINKATTN_CUDA_SM90A when CMAKE_CUDA_ARCHITECTURES lists 90a), the device is compute capability 9.0, the tile is
// 64 or 128, the call has neither bias nor dropout and dQ is fused (deterministic = 0); SINKATTN_CUDA_NO_SM90=1 in
// the environment turns it off (for comparisons).
inline bool use_sm90_dkdv(const Params& p, int hd) {
#ifdef SINKATTN_CUDA_SM90A
  if ((hd != 64 && hd != 128) || p.bias != nullptr || p.dropout || p.ws_dq == nullptr) return false;
  static const bool off = std::getenv("SINKATTN_CUDA_NO_SM90") != nullptr;
  if (off) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
#else
  (void)p, (void)hd;
  return false;
#endif
}

// Tensor maps for the Hopper kernel's TMA loads of q and d_out (bwd_dkdv_sm90.cuh, Sm90Tma): 4-d (d, rows, h_q, b),
// box 8 x 64 x 1 x 1, out-of-bounds elements read as zeros. The driver's encoder is looked up once through the
// runtime (no link against libcuda). Returns false, leaving the kernel on cp.async loads, where a map cannot be
// made (encoder missing, a stride of 0, or the driver refusing the description); SINKATTN_CUDA_NO_TMA=1 in the
// environment does the same (for comparisons).
template <typename T>
inline bool make_sm90_tma(const Params& p, sm90::Sm90Tma& tma) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    if (std::getenv("SINKATTN_CUDA_NO_TMA") != nullptr) return nullptr;
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult res{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &res) !=
            cudaSuccess ||
        res != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  const CUtensorMapDataType dt =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  auto one = [&](CUtensorMap& map, const void* ptr, int cols, const RowStrides3& st) {
    const int64_t rows = p.varlen ? p.rows_total_q : p.s_q, nb = p.varlen ? 1 : p.b;
    const int64_t sb = nb > 1 ? st.b : st.s;  // the batch stride only matters when there are several batches
    if (st.s <= 0 || st.h <= 0 || sb <= 0) return false;
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                                static_cast<cuuint64_t>(p.h_q), static_cast<cuuint64_t>(nb)};
    const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st.s) * sizeof(T), static_cast<cuuint64_t>(st.h) * sizeof(T),
                                   static_cast<cuuint64_t>(sb) * sizeof(T)};
    const cuuint32_t box[4] = {8, 64, 1, 1}, elem[4] = {1, 1, 1, 1};
    return encode(&map, dt, 4, const_cast<void*>(ptr), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  return one(tma.q, p.q, p.d, p.q_st) && one(tma.d_out, p.d_out, p.d_v, p.dout_st);
}

template <typename T, int HD>
cudaError_t launch_bwd_dkdv(const Params& p, cudaStream_t stream) {
  using Tr = DkvTraits<HD>;
  const int nblocks = (p.s_kv + Tr::kBlockN - 1) / Tr::kBlockN;
  if (nblocks == 0 || p.h_kv == 0 || p.b == 0) return cudaSuccess;
  const dim3 grid(nblocks, p.h_kv, p.b);
  if constexpr (HD == 64 || HD == 128) {
    if (use_sm90_dkdv(p, HD)) {
      using Tr90 = sm90::DkvSm90Traits<HD>;
      static_assert(Tr90::kBlockN == Tr::kBlockN && Tr90::kBlockM == 64, "same grid; TMA box of 64 rows");
      cudaError_t e = prepare_smem(sm90::bwd_dkdv_sm90_kernel<T, HD>, Tr90::kSmem);
      if (e != cudaSuccess) return e;
      sm90::Sm90Tma tma{};
      tma.ok = make_sm90_tma<T>(p, tma) ? 1 : 0;
      sm90::bwd_dkdv_sm90_kernel<T, HD><<<grid, Tr90::kThreads, Tr90::kSmem, stream>>>(p, tma);
      return cudaGetLastError();
    }
  }
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
