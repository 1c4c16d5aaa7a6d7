// CUDA backend: kernels for head-dim tile 96 (head dims up to 96), fp16 and bf16.
#include "cuda/launch.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_INSTANTIATE(96)
}  // namespace sinkattn::cuda
