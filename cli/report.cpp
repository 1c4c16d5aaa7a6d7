// See report.hpp.
#include "report.hpp"

#include <algorithm>
#include <cstdio>

#include "dtype.hpp"

namespace sinkattn::cli {

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}
void print_indented(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::printf("    %s\n", text.substr(pos, nl - pos).c_str());
    pos = nl + 1;
  }
}
}  // namespace

std::string describe_call(const Capture& c) {
  const CaptureOptions& o = c.options;
  std::string s = std::string(dtype_name(c.at("q").dtype)) + (c.varlen() ? " varlen" : " dense") +
                  " q" + shape_str(c.at("q").shape) + " k" + shape_str(c.at("k").shape) + " v" +
                  shape_str(c.at("v").shape);
  s += o.softmax_type == SINKATTN_SOFTMAX_LEARNABLE    ? " learnable-sinks"
       : o.softmax_type == SINKATTN_SOFTMAX_OFF_BY_ONE ? " off-by-one"
                                                       : " vanilla";
  s += " window=(" + std::to_string(o.window_left) + "," + std::to_string(o.window_right) + ")";
  s += o.mask_alignment == SINKATTN_ALIGN_TOP_LEFT ? " top_left" : " bottom_right";
  if (o.softmax_scale) s += " scale=" + std::to_string(*o.softmax_scale);
  if (o.dropout_p > 0) s += " dropout=" + std::to_string(o.dropout_p) + " seed=" + std::to_string(o.seed) +
                            " offset=" + std::to_string(o.offset);
  for (const char* n : {"bias", "d_lse", "seqlens_q", "seqlens_kv", "seqused_kv"})
    if (c.has(n)) s += std::string(" +") + n;
  if (c.paged())
    s += " +page_table" + shape_str(c.at("page_table").shape) + " (page_size " + std::to_string(c.at("k").shape[1]) +
         ")";
  s += c.backward() ? " (forward+backward)" : " (forward)";
  return s;
}

// The "; kernels: ..." part of the chosen backend's line of a sinkattn_query_backend report ("" when absent).
std::string kernels_of(const std::string& report, sinkattn_backend_t chosen) {
  const std::string head = std::string(backend_name(chosen)) + ": chosen";
  size_t pos = 0;
  while (pos < report.size()) {
    size_t nl = report.find('\n', pos);
    if (nl == std::string::npos) nl = report.size();
    const std::string line = report.substr(pos, nl - pos);
    if (line.rfind(head, 0) == 0) {
      const size_t k = line.find("; kernels: ");
      return k == std::string::npos ? std::string() : line.substr(k + 11);
    }
    pos = nl + 1;
  }
  return {};
}

void print_backend_report(const ExecuteReport& r, bool backward) {
  if (!r.note.empty()) std::printf("note: %s\n", r.note.c_str());
  const auto ran_on = [&](const char* pass, sinkattn_backend_t b, const std::string& report) {
    const std::string k = kernels_of(report, b);
    std::printf("%s ran on: %s (%s memory)%s%s\n", pass, backend_name(b), r.on_device ? "device" : "host",
                k.empty() ? "" : ": ", k.c_str());
    print_indented(report);
  };
  ran_on("forward", r.forward_backend, r.forward_report);
  if (backward) ran_on("backward", r.backward_backend, r.backward_report);
}

void warn_unknown_tensors(const Capture& c) {
  for (const auto& [name, t] : c.tensors)
    if (std::find(kInputNames.begin(), kInputNames.end(), name) == kInputNames.end())
      std::fprintf(stderr, "sinkattn: note: ignoring tensor '%s' (not a call input of SPEC.md section 6)\n", name.c_str());
}

}  // namespace sinkattn::cli
