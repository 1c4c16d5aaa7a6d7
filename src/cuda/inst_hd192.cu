// CUDA backend: kernels for head-dim tile 192 (head dims up to 192), fp16 and bf16.
#include "cuda/launch.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_INSTANTIATE(192)
}  // namespace sinkattn::cuda
