// Printing helpers shared by the subcommands.
#pragma once

#include <string>

#include "capture.hpp"
#include "execute.hpp"

namespace sinkattn::cli {

// One line describing a call: dtype, shapes, softmax type, mask, dropout.
std::string describe_call(const Capture& c);
// The kernels the chosen backend named in a sinkattn_query_backend report (the "; kernels: ..." part of its line),
// "" when it named none.
std::string kernels_of(const std::string& report, sinkattn_backend_t chosen);
// Which backend ran (sinkattn_query_backend reports) and its kernels, to stdout.
void print_backend_report(const ExecuteReport& r, bool backward);
// Warns (stderr) about tensors of a capture that are not call inputs.
void warn_unknown_tensors(const Capture& c);

}  // namespace sinkattn::cli
