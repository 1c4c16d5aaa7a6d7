// CUDA backend: kernels for head-dim tile 32 (head dims up to 32), fp16 and bf16.
#include "cuda/launch.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_INSTANTIATE(32)
}  // namespace sinkattn::cuda
