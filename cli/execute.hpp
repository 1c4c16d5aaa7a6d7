// Runs one call (forward, and backward when the call has d_out) through the C ABI on the requested backend,
// in host or device memory, with the workspace the size queries report (SPEC.md section 4).
#pragma once

#include <stdexcept>
#include <string>

#include "capture.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

// A library call that returned an error; the message includes sinkattn_last_error().
class LibraryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws LibraryError "<what>: <status name>: <sinkattn_last_error()>" unless st == SINKATTN_OK.
void check_status(sinkattn_status_t st, const std::string& what);
const char* status_name(sinkattn_status_t st);
const char* backend_name(sinkattn_backend_t b);
// "auto" | "cpu" | "cuda" -> backend; throws std::invalid_argument otherwise.
sinkattn_backend_t parse_backend(const std::string& s);

struct ExecuteReport {
  bool on_device = false;           // tensors were placed in device memory
  sinkattn_backend_t forward_backend = SINKATTN_BACKEND_AUTO;
  sinkattn_backend_t backward_backend = SINKATTN_BACKEND_AUTO;
  std::string forward_report, backward_report;  // sinkattn_query_backend texts
  std::string note;                 // e.g. why AUTO stayed in host memory
};

// Runs the call. Placement: CPU -> host memory; CUDA -> device memory (error when the command has no CUDA);
// AUTO -> device memory when a CUDA device and the CUDA backend are available and the library says the CUDA
// backend would run the call there, else host memory. Outputs end up in call.outputs (host) either way.
ExecuteReport execute(HostCall& call, sinkattn_backend_t backend);

}  // namespace sinkattn::cli
