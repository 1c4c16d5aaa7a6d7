// Boundary validation (SPEC.md section 4): sinkattn_params_t -> Call.
#pragma once

#include "core/call.hpp"
#include "core/status.hpp"

namespace sinkattn {

// The one function that decides which optional tensors a call has and uses; both passes use it.
TensorPlan decide_tensors(const sinkattn_params_t& p, Pass pass);

// Checks every rule of SPEC.md section 4 for `pass` and fills *out. With `shape_only` (workspace-size queries),
// NULL data pointers are accepted and the memory kind comes from p->backend when q has no data.
Status resolve_call(const sinkattn_params_t* p, Pass pass, bool shape_only, Call* out);

}  // namespace sinkattn
