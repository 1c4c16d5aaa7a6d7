// The CPU forward and backward passes (SPEC.md sections 2 and 3). Host memory, fp32 / fp16 / bf16 inputs, fp32
// accumulation, deterministic (fixed decomposition, fixed reduction order, no atomics).
#pragma once

#include <cstddef>
#include <string>

#include "core/call.hpp"
#include "core/status.hpp"

namespace sinkattn::cpu {

// Workspace bytes. Forward: fp32 panels of K^T and V (for the keys each sequence reads: cpu_panels.hpp), the split
// partials. Backward: D per row, an fp32 d_bias accumulator when d_bias is not fp32, fp32 panels of K^T, K and V^T,
// fp32 copies of q and d_out rows, and finiteness flags. With the batch tensors' data the exact bytes the run uses;
// a shape-only query (NULL data) gets a bound from shapes.
size_t forward_workspace_bytes(const Call& c);
size_t backward_workspace_bytes(const Call& c);
// What that workspace holds, in words and bytes (for the messages of a workspace that is too small or could not be
// allocated).
std::string forward_workspace_report(const Call& c);
std::string backward_workspace_report(const Call& c);

Status run_forward(const Call& c);
Status run_backward(const Call& c);

}  // namespace sinkattn::cpu
