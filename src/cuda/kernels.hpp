// CUDA backend: host-side launchers of the kernels (one translation unit per head-dim tile, inst_hd*.cu,
// so the build parallelises; bwd_small.cu for the dtype-only kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/params.cuh"

namespace sinkattn::cuda {

// Head-dim tiles compiled: a call with head dims (d, d_v) runs on the smallest tile >= max(d, d_v).
constexpr int kHeadDimTiles[] = {32, 64, 96, 128, 192, 256};
constexpr int kPreRows = 32;  // query rows per preprocess block

// Forward (out, softmax_lse) for tile HD and element type T.
template <typename T, int HD>
cudaError_t launch_fwd(const Params& p, cudaStream_t stream);
// Backward main kernels: dq (+ dS for d_bias) and dK dV.
template <typename T, int HD>
cudaError_t launch_bwd_dq(const Params& p, cudaStream_t stream);
template <typename T, int HD>
cudaError_t launch_bwd_dkdv(const Params& p, cudaStream_t stream);

enum SmallKernel { kSmallPreprocess = 0, kSmallDSinks = 1, kSmallDBias = 2, kSmallDqConvert = 3 };
template <typename T>
cudaError_t launch_bwd_small(const Params& p, int which, cudaStream_t stream);

cudaError_t launch_rng_state(const uint64_t* rng_in, int64_t in_stride, uint64_t seed, uint64_t offset,
                             uint64_t* rng_state, int64_t out_stride, cudaStream_t stream);

// Shared-memory bytes of each main kernel for a tile (for supports() / describe()).
int fwd_smem_bytes(int hd);
int bwd_dq_smem_bytes(int hd);
int bwd_dkdv_smem_bytes(int hd);

}  // namespace sinkattn::cuda
