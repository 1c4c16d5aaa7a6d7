// CUDA backend: host-side launchers of the kernels (one translation unit per head-dim tile, inst_hd*.cu,
// so the build parallelises; bwd_small.cu for the dtype-only kernels).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

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

// A kernel launch; pdl: with programmatic dependent launch (KernelChoice::pdl: the kernel may start before the one
// launched before it on the stream has finished, so it must call pdl_wait (common.cuh) in every thread before it
// touches what that one writes or reads).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                          Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The small kernels of the backward (bwd_small.cu). pdl: kSmallDqConvert only (it waits for the main kernels in
// pdl_wait).
enum SmallKernel { kSmallPreprocess = 0, kSmallDSinks = 1, kSmallDBias = 2, kSmallDqConvert = 3 };
template <typename T>
cudaError_t launch_bwd_small(const Params& p, int which, cudaStream_t stream, bool pdl = false);
// Whether the dq convert kernel runs (a fused dq's accumulator, b, h_q and s_q above 0; kSmallDqConvert launches
// nothing otherwise). Where it runs it also reduces d_sinks (the blocks of its first row block and sequence 0, one
// per query head) and the separate d_sinks kernel is not launched; that kernel runs otherwise.
bool dq_convert_runs(const Params& p);

cudaError_t launch_rng_state(const uint64_t* rng_in, int64_t in_stride, uint64_t seed, uint64_t offset,
                             uint64_t* rng_state, int64_t out_stride, cudaStream_t stream);

}  // namespace sinkattn::cuda
