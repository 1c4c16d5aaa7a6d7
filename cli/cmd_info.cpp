// `sinkattn info`: version, backends compiled in, devices found, what each backend supports.
#include <cstdio>

#include "commands.hpp"
#include "device.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

int cmd_info() {
  std::printf("sinkattn %s (C ABI %d.%d.%d)\n", sinkattn_version(), SINKATTN_VERSION_MAJOR, SINKATTN_VERSION_MINOR,
              SINKATTN_VERSION_PATCH);
  std::printf("command built %s CUDA\n", cli_built_with_cuda() ? "with" : "without");
  std::printf("devices:\n  cpu\n");
  for (const auto& line : cuda_device_lines()) std::printf("  %s\n", line.c_str());
  if (cli_built_with_cuda() && cuda_device_count() == 0) std::printf("  (no CUDA device found)\n");
  std::printf("backends:\n");
  const struct {
    sinkattn_backend_t b;
    const char* name;
  } backends[] = {{SINKATTN_BACKEND_CPU, "cpu"}, {SINKATTN_BACKEND_CUDA, "cuda"}};
  for (const auto& be : backends) {
    const bool avail = sinkattn_backend_available(be.b) != 0;
    std::printf("  %s: %s\n", be.name, avail ? "compiled in" : "not compiled in");
    if (!avail) continue;
    char buf[4096] = {0};
    sinkattn_backend_describe(be.b, buf, sizeof buf);
    std::string text(buf);
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      if (nl > pos) std::printf("    %s\n", text.substr(pos, nl - pos).c_str());
      pos = nl + 1;
    }
  }
  return 0;
}

}  // namespace sinkattn::cli
