// fp32 path of the CUDA backend (SPEC.md sections 1-3 for fp32 q / k / v on the GPU): fp32 math and
// accumulation, plain SIMT kernels, bitwise deterministic backward (no float atomics). The CUDA backend
// (src/cuda/cuda_backend.cu) forwards calls with dtype == SINKATTN_F32 here.
#pragma once

#include <cstddef>

#include "core/call.hpp"
#include "core/status.hpp"

namespace sinkattn::cuda_f32 {

// What the fp32 path can run; an error Status says why not (SPEC.md section 4). Touches no tensor data.
Status supports(const Call& c);

// Bytes of workspace `c` needs (0 for the forward). Same code path as run().
Status workspace_size(const Call& c, size_t* bytes);

// Runs c.pass (forward or backward) on c.p->stream. Refuses a workspace smaller than workspace_size().
Status run(const Call& c);

}  // namespace sinkattn::cuda_f32
