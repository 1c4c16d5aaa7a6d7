// CUDA backend: the launcher of one head-dim tile's decode kernels (included by decode_hd64.cu, decode_hd128.cu,
// one translation unit per tile so the build parallelises).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>

#include "cuda/decode/decode.hpp"
#include "cuda/decode/decode_kernel.cuh"

namespace sinkattn::cuda {

template <typename T, int HD, int MT, int WN, bool QR = false>
cudaError_t launch_decode_config(const Params& p, int m_blocks, cudaStream_t stream) {
  using Tr = DecodeTraits<HD, MT, WN, QR>;
  // The dynamic shared-memory limit is raised once per device (a host-side attribute, no synchronisation).
  static std::atomic<unsigned long long> prepared{0};
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = 1ull << (dev & 63);
  if (Tr::kSmem > 48 * 1024 && !(prepared.load() & bit)) {
    e = cudaFuncSetAttribute(decode_kernel<T, HD, MT, WN, QR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Tr::kSmem);
    if (e != cudaSuccess) return e;
    prepared.fetch_or(bit);
  }
  const dim3 grid(static_cast<unsigned>(m_blocks * p.num_splits), static_cast<unsigned>(p.h_kv),
                  static_cast<unsigned>(p.b));
  if (p.decode_cluster == 0) {
    decode_kernel<T, HD, MT, WN, QR><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
    return cudaGetLastError();
  }
  // the num_splits blocks of one (block of rows, KV head, sequence): consecutive along x, one cluster
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(Tr::kThreads);
  cfg.dynamicSmemBytes = Tr::kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(p.num_splits);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, decode_kernel<T, HD, MT, WN, QR>, p);
}

template <typename T, int HD>
cudaError_t launch_decode_tile(const Params& p, int config, int m_blocks, cudaStream_t stream) {
  switch (config) {
    case 0: return launch_decode_config<T, HD, kDecodeMT[0], kDecodeWN[0]>(p, m_blocks, stream);
    case 1: return launch_decode_config<T, HD, kDecodeMT[1], kDecodeWN[1]>(p, m_blocks, stream);
    case 2: return launch_decode_config<T, HD, kDecodeMT[2], kDecodeWN[2]>(p, m_blocks, stream);
    case 3: return launch_decode_config<T, HD, kDecodeMT[3], kDecodeWN[3]>(p, m_blocks, stream);
    case kDecodeShortConfig:
      if constexpr (HD == 64) {
        constexpr int c = kDecodeShortConfig;
        return launch_decode_config<T, HD, kDecodeMT[c], kDecodeWN[c], kDecodeQR[c]>(p, m_blocks, stream);
      }
      return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
  }
}

#define SINKATTN_CUDA_DECODE_INSTANTIATE(HD)                                                              \
  template cudaError_t launch_decode_tile<__half, HD>(const Params&, int, int, cudaStream_t);            \
  template cudaError_t launch_decode_tile<__nv_bfloat16, HD>(const Params&, int, int, cudaStream_t);

}  // namespace sinkattn::cuda
