// CUDA backend: kernels for head-dim tile 128 (head dims up to 128), fp16 and bf16.
#include "cuda/launch.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_INSTANTIATE(128)
}  // namespace sinkattn::cuda
