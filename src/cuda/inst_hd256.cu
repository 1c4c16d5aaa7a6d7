// CUDA backend: kernels for head-dim tile 256 (head dims up to 256), fp16 and bf16.
#include "cuda/launch.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_INSTANTIATE(256)
}  // namespace sinkattn::cuda
