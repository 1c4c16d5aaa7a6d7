// CUDA backend: decode kernels for head-dim tile 128 (head dims 72 .. 128), fp16 and bf16.
#include "cuda/decode/decode_tile.cuh"

namespace sinkattn::cuda {
SINKATTN_CUDA_DECODE_INSTANTIATE(128)
}  // namespace sinkattn::cuda
