// Printing helpers shared by the subcommands.
#pragma once

#include <string>

#include "capture.hpp"
#include "execute.hpp"

namespace sinkattn::cli {

// One line describing a call: dtype, shapes, softmax type, mask, dropout.
std::string describe_call(const Capture& c);
// Which backend ran (sinkattn_query_backend reports), to stdout.
void print_backend_report(const ExecuteReport& r, bool backward);
// Warns (stderr) about tensors of a capture that are not call inputs.
void warn_unknown_tensors(const Capture& c);

}  // namespace sinkattn::cli
