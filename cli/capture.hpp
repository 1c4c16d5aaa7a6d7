// Call capture files (SPEC.md section 6): one attention call, inputs and options, in one safetensors file,
// and the result files `sinkattn run` writes.
//
// safetensors layout: 8-byte little-endian header length N, N bytes of JSON header
//   { "<name>": {"dtype": "F32"|"F16"|"BF16"|"I32"|"I64", "shape": [..], "data_offsets": [begin, end]}, ...,
//     "__metadata__": {"<key>": "<string value>", ...} }
// then the data section; offsets are relative to its start, tensors are row-major contiguous.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

// Any problem with a capture file: unreadable, malformed header, inconsistent tensors or options.
// The message names the file part (tensor or metadata key) and the rule broken.
class CaptureError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A host tensor: dtype, shape and row-major contiguous raw bytes (little-endian, as in the file).
struct HostTensor {
  sinkattn_dtype_t dtype = SINKATTN_F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(sinkattn_dtype_t t, std::vector<int64_t> s);  // allocates numel * element size bytes (zeroed)

  int64_t numel() const;
  // A contiguous view for the library. The data pointer is never NULL (zero-size tensors get a valid
  // pointer too, since the library treats rank > 0 with NULL data as an error).
  sinkattn_tensor_t view();
  sinkattn_tensor_t view() const;  // same, for inputs (the library does not write them)
  void fill_nan();                 // poison a float output (I64 outputs get a sentinel pattern)
  template <class T>
  T* as() { return reinterpret_cast<T*>(bytes.data()); }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(bytes.data()); }
};

// Options of SPEC.md section 6 (`__metadata__`); a missing key takes the SPEC default.
struct CaptureOptions {
  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_VANILLA;
  std::optional<float> softmax_scale;  // absent: 1/sqrt(d)
  int64_t window_left = -1, window_right = -1;
  sinkattn_mask_alignment_t mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  double dropout_p = 0.0;
  uint64_t seed = 0, offset = 0;
  bool deterministic = false;
  std::optional<int64_t> max_seqlen_q, max_seqlen_kv;  // absent: the longest sequence (varlen only)
};

// Input tensor names of SPEC.md section 6, in file order.
extern const std::vector<std::string> kInputNames;

struct Capture {
  std::map<std::string, HostTensor> tensors;          // every tensor of the file (known or not)
  std::map<std::string, std::string> metadata;        // raw `__metadata__`
  CaptureOptions options;

  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  const HostTensor& at(const std::string& name) const;  // throws CaptureError when absent
  bool varlen() const { return has("q") && at("q").shape.size() == 3; }
  bool paged() const { return has("page_table"); }  // k, v are page pools (SPEC.md section 1)
  bool backward() const { return has("d_out"); }
};

// ---- safetensors container ----

// Parses a safetensors image: header length, JSON header, every tensor's dtype/shape/offsets (in range,
// size consistent with dtype and shape, no overlaps), `__metadata__` (strings only). No semantic checks.
// Throws CaptureError.
Capture parse_safetensors(const std::vector<uint8_t>& file, const std::string& what = "capture");

// Serialises tensors (in the given order) and string metadata into a safetensors image.
std::vector<uint8_t> serialize_safetensors(const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                                           const std::map<std::string, std::string>& metadata);

std::vector<uint8_t> read_file(const std::string& path);   // throws CaptureError
void write_file(const std::string& path, const std::vector<uint8_t>& bytes);  // throws CaptureError

// ---- call captures (SPEC.md section 6) ----

// Reads a capture file: parse_safetensors + parse_options + validate_capture.
Capture read_capture(const std::string& path);

// Parses `__metadata__` into options (strict: whole-string numbers, known enum spellings). Throws CaptureError.
CaptureOptions parse_options(const std::map<std::string, std::string>& metadata);
// The `__metadata__` a capture with these options has (every key written explicitly).
std::map<std::string, std::string> format_options(const CaptureOptions& o);

// Checks what the command needs to build a call (the library validates the rest, SPEC.md section 4):
// q, k, v present with a float dtype shared by k, v, d_out; q rank 4 (dense) or 3 (varlen, with
// cu_seqlens_q and cu_seqlens_kv); sequence tensors I32 of rank 1; sinks a float [h_q]; d_lse F32. With
// page_table (I32 [b, max_pages]): k, v are page pools of rank 4, seqused_kv is given, cu_seqlens_kv is not
// (varlen queries give cu_seqlens_q only).
void validate_capture(const Capture& c);

// Writes a capture (inputs in kInputNames order, then options) to `path`.
void write_capture(const std::string& path, const Capture& c);

// ---- one call built from a capture ----

// Host buffers of one call: the inputs (views of the capture, sinks upcast to F32 when stored as F16/BF16),
// the outputs (allocated with the SPEC.md section 1 shapes and poisoned with NaN), and the sinkattn_params_t
// pointing at them. Forward outputs: out, softmax_lse (+ rng_state I64 [2] with dropout). With d_out in the
// capture, backward outputs d_q, d_k, d_v (+ d_sinks when learnable, d_bias with bias).
struct HostCall {
  sinkattn_params_t params{};
  bool backward = false;
  std::map<std::string, HostTensor> outputs;  // keyed by result-file name: out, softmax_lse, d_q, ...
  HostTensor sinks_f32;                       // used when the capture's sinks are not F32
};

// `c` must outlive the HostCall (input views point into it). Throws CaptureError.
HostCall make_host_call(const Capture& c);

// Result-file names in SPEC.md section 6 order.
extern const std::vector<std::string> kResultNames;

// The sinkattn_params_t field a capture input name ("q", "cu_seqlens_q", ...) or result name ("out", "d_q",
// "rng_state", ...) binds to; nullptr for an unknown name.
sinkattn_tensor_t sinkattn_params_t::*params_field(const std::string& name);

// Writes the outputs of a call (the ones present) to a safetensors result file with the options as metadata.
void write_results(const std::string& path, const HostCall& call, const CaptureOptions& options);

}  // namespace sinkattn::cli
