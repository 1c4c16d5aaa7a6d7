// See execute.hpp.
#include "execute.hpp"

#include <memory>
#include <vector>

#include "device.hpp"

namespace sinkattn::cli {

const char* status_name(sinkattn_status_t st) {
  switch (st) {
    case SINKATTN_OK: return "OK";
    case SINKATTN_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SINKATTN_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case SINKATTN_ERR_WORKSPACE_TOO_SMALL: return "WORKSPACE_TOO_SMALL";
    case SINKATTN_ERR_DEVICE: return "DEVICE";
    case SINKATTN_ERR_INTERNAL: return "INTERNAL";
  }
  return "UNKNOWN";
}

void check_status(sinkattn_status_t st, const std::string& what) {
  if (st == SINKATTN_OK) return;
  throw LibraryError(what + " failed: " + status_name(st) + ": " + sinkattn_last_error());
}

const char* backend_name(sinkattn_backend_t b) {
  switch (b) {
    case SINKATTN_BACKEND_AUTO: return "auto";
    case SINKATTN_BACKEND_CPU: return "cpu";
    case SINKATTN_BACKEND_CUDA: return "cuda";
  }
  return "?";
}

sinkattn_backend_t parse_backend(const std::string& s) {
  if (s == "auto") return SINKATTN_BACKEND_AUTO;
  if (s == "cpu") return SINKATTN_BACKEND_CPU;
  if (s == "cuda") return SINKATTN_BACKEND_CUDA;
  throw std::invalid_argument("--backend must be auto, cpu or cuda, not '" + s + "'");
}

namespace {

// sinkattn_query_backend for one pass; returns the status, fills chosen and report.
sinkattn_status_t query(const sinkattn_params_t& p, bool backward, sinkattn_backend_t* chosen, std::string* report) {
  char buf[4096] = {0};
  const sinkattn_status_t st = sinkattn_query_backend(&p, backward ? 1 : 0, chosen, buf, sizeof buf);
  *report = buf;
  while (!report->empty() && report->back() == '\n') report->pop_back();
  return st;
}

// Workspace query + allocation + run of one pass on params `p` (host or device pointers).
void run_pass(sinkattn_params_t& p, bool backward, bool device) {
  size_t bytes = 0;
  const char* name = backward ? "sinkattn_backward" : "sinkattn_forward";
  check_status(backward ? sinkattn_backward_workspace_size(&p, &bytes) : sinkattn_forward_workspace_size(&p, &bytes),
               std::string(name) + "_workspace_size");
  Workspace ws(bytes, device);
  p.workspace = ws.data();
  p.workspace_bytes = ws.bytes();
  check_status(backward ? sinkattn_backward(&p) : sinkattn_forward(&p), name);
  if (device) device_synchronize();  // the workspace is freed when this function returns
  p.workspace = nullptr;
  p.workspace_bytes = 0;
}

}  // namespace

ExecuteReport execute(HostCall& call, sinkattn_backend_t backend) {
  ExecuteReport rep;
  call.params.backend = backend;
  std::unique_ptr<DeviceMirror> mirror;

  if (backend == SINKATTN_BACKEND_CUDA) {
    if (!cli_built_with_cuda())
      throw DeviceError("--backend cuda: this sinkattn command was built without CUDA support");
    if (cuda_device_count() == 0) throw DeviceError("--backend cuda: no CUDA device found");
    mirror = std::make_unique<DeviceMirror>(call.params);
  } else if (backend == SINKATTN_BACKEND_AUTO && cli_built_with_cuda() && cuda_device_count() > 0 &&
             sinkattn_backend_available(SINKATTN_BACKEND_CUDA)) {
    auto m = std::make_unique<DeviceMirror>(call.params);
    sinkattn_backend_t chosen = SINKATTN_BACKEND_AUTO;
    std::string text;
    bool ok = query(m->params(), false, &chosen, &text) == SINKATTN_OK && chosen == SINKATTN_BACKEND_CUDA;
    if (ok && call.backward)
      ok = query(m->params(), true, &chosen, &text) == SINKATTN_OK && chosen == SINKATTN_BACKEND_CUDA;
    if (ok) mirror = std::move(m);
    else rep.note = "auto: the CUDA backend would not run this call in device memory (" + text + "); using host memory";
  }
  rep.on_device = mirror != nullptr;
  sinkattn_params_t& p = mirror ? mirror->params() : call.params;

  check_status(query(p, false, &rep.forward_backend, &rep.forward_report), "sinkattn_query_backend (forward)");
  run_pass(p, false, rep.on_device);
  if (call.backward) {
    check_status(query(p, true, &rep.backward_backend, &rep.backward_report), "sinkattn_query_backend (backward)");
    run_pass(p, true, rep.on_device);
  }
  if (mirror) {
    std::vector<std::string> names;
    for (auto& [name, t] : call.outputs) names.push_back(name);
    mirror->copy_back(call.params, names);
  }
  return rep;
}

}  // namespace sinkattn::cli
