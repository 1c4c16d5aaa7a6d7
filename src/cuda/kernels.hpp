// CUDA backend: host-side launchers of the kernels (one translation unit per head-dim tile, inst_hd*.cu,
// so the build parallelises; bwd_small.cu for the dtype-only kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/dispatch.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

constexpr int kPreRows = 32;  // query rows per preprocess block

// The main kernels of tile HD and element type T, the variant the dispatch chose (dispatch.hpp, KernelChoice).
// Forward (out, softmax_lse):
template <typename T, int HD>
cudaError_t launch_fwd(const Params& p, const KernelChoice& kc, cudaStream_t stream);
// Backward: the dq kernel (+ dS for d_bias; kc.dq == DqPath::kDqKernel) and the dK dV kernel (with the fused dq
// otherwise).
template <typename T, int HD>
cudaError_t launch_bwd_dq(const Params& p, const KernelChoice& kc, cudaStream_t stream);
template <typename T, int HD>
cudaError_t launch_bwd_dkdv(const Params& p, const KernelChoice& kc, cudaStream_t stream);

enum SmallKernel { kSmallPreprocess = 0, kSmallDSinks = 1, kSmallDBias = 2, kSmallDqConvert = 3 };
template <typename T>
cudaError_t launch_bwd_small(const Params& p, int which, cudaStream_t stream);

cudaError_t launch_rng_state(const uint64_t* rng_in, int64_t in_stride, uint64_t seed, uint64_t offset,
                             uint64_t* rng_state, int64_t out_stride, cudaStream_t stream);

}  // namespace sinkattn::cuda
