// CUDA backend: decode kernels for head-dim tile 64 (head dims up to 64), fp16 and bf16.
#include "cuda/decode/decode_tile.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_DECODE_INSTANTIATE(64)
}  // namespace sinkattn::cuda
