// Naive float64 reference of SPEC.md sections 2-3, independent of the library's backends and validation.
// Used by the GoogleTest suites and by `sinkattn check`.
//
// The reference reads a sinkattn_params_t whose tensors live in host memory (any dtype, any strides) and
// evaluates the formulas of SPEC.md directly, one (sequence, head, row) at a time, in float64 (or, with
// Precision::kPlainLowPrecision, the "plain low-precision implementation" of SPEC.md section 5 that sets the
// budget of a low-precision backend: scores, softmax and dP in fp32; P and dS rounded to the input dtype before
// their products; every output rounded to its dtype; D from its own rounded out, or from the out the backward
// was given, see DFrom).
//
// It includes nothing from src/ and calls no library function: Philox4x32-10 and the fp16/bf16 conversions
// are written out here again, on purpose, so that the library is checked against an independent copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sinkattn/sinkattn.h"

namespace sinkattn::ref {

enum class Precision { kFloat64, kPlainLowPrecision };

// Which `out` the backward's D_i = dot(d_out_i, out_i) reads (SPEC.md sections 3 and 5).
enum class DFrom {
  kOwnOut,    // the evaluation's own out, rounded to the dtype of q: a standalone evaluation of the call
  kGivenOut,  // p.out, the out tensor the backward under test was given (a backend's forward output): how a
              // backward is judged (SPEC.md section 5, "with D_i from the out the backward was given")
};

struct Options {
  Precision precision = Precision::kFloat64;
  DFrom d_from = DFrom::kOwnOut;
};

// A dense row-major array with the logical shape of the library tensor it stands for
// (for example out: [b, s_q, h_q, d_v] dense or [total_q, h_q, d_v] varlen; softmax_lse [b, h_q, s_q] or
// [h_q, total_q]; d_sinks [h_q]; d_bias the shape of bias). Empty when the output does not apply.
// A NaN in a reference array means "unspecified by SPEC.md" (the LSE of dense padding rows, rows/keys of a
// varlen buffer that belong to no sequence): relative_error only requires the actual value there to be
// finite or -inf (never NaN, never +inf).
struct Array {
  std::vector<int64_t> shape;
  std::vector<double> data;
  bool empty() const { return data.empty() && shape.empty(); }
  int64_t numel() const;
};

struct Result {
  Array out, softmax_lse;                      // forward
  Array dq, dk, dv, d_sinks, d_bias;           // backward (when requested)
};

// Evaluates the forward (and, if `backward`, the backward with p.d_out and optional p.d_lse) for the call
// described by `p`. Uses p.softmax_type, softmax_scale (NaN = 1/sqrt(d)), windows, alignment, bias, batch
// tensors, dropout (keep mask from SPEC.md's Philox function, seed/offset from p.seed / p.offset), exactly as
// SPEC.md says. Output pointers in `p` are ignored, except p.out with DFrom::kGivenOut (then read, host memory,
// rows that belong to a sequence only). Throws std::invalid_argument on inputs it cannot read.
// Backward: D_i = dot(d_out_i, out_i) in the evaluation's arithmetic, with out from options.d_from (kOwnOut:
// the evaluation's own out rounded to the dtype of q, SPEC.md section 3's "stored, rounded output").
// Sinks (SPEC.md section 3, "Sink values"): a -inf sink is vanilla in the forward; in the backward a row of that
// head that sees no key has P_sink = 1 and adds d_lse_i to d_sinks[h]. NaN / +inf sinks give NaN for that head.
Result evaluate(const sinkattn_params_t& p, bool backward, const Options& options);
inline Result evaluate(const sinkattn_params_t& p, bool backward, Precision precision = Precision::kFloat64) {
  return evaluate(p, backward, Options{precision, DFrom::kOwnOut});
}

// The evaluations SPEC.md section 5 judges a backend's results by (the two run concurrently):
//   ref64: float64, gradients with D from `d_from` (kGivenOut: the out the judged backward was fed);
//   lowp:  the plain implementation of the input dtype (Precision::kPlainLowPrecision: for fp16 / bf16 the plain
//          low-precision implementation, for fp32 the same formulas evaluated in fp32), with D from its own rounded
//          out whatever `d_from` says, as SPEC.md section 5 defines it: a standalone evaluation of the call. (Its D
//          from the judged backend's out would make it the backend's own arithmetic, a budget that a backend as
//          inaccurate as the plain implementation always meets, so that a miss like 1.02x the budget passes.)
struct References {
  Result ref64, lowp;
};
References references(const sinkattn_params_t& p, bool backward, DFrom d_from);

// Reads a strided host tensor (any dtype) into a dense float64 array of its logical shape.
Array read_tensor(const sinkattn_tensor_t& t);

// Writes a dense array of the tensor's logical shape into a strided host tensor, rounding to its dtype
// (round to nearest even for fp16/bf16). Used by the tests to fill inputs.
void write_tensor(const sinkattn_tensor_t& t, const Array& a);

// SPEC.md section 5: err = max|x - ref| / max(max|ref|, tiny) (max|ref| over finite reference values),
// skipping nothing; NaN in x gives +inf. Positions where both are -inf (or both +inf) count as equal.
// A NaN reference value ("unspecified") accepts any finite or -inf x. Throws on a shape mismatch.
double relative_error(const Array& actual, const Array& ref, double tiny = 1e-6);

// One line of SPEC.md section 5's error table.
struct ErrorRow {
  std::string name;      // "out", "softmax_lse", "dq", ...
  double err = 0;        // backend vs float64
  double lowp_err = 0;   // the plain implementation vs float64 (fp16 / bf16: plain low precision; fp32: plain fp32;
                         // 0 for fp32 when no plain evaluation was given)
  double tolerance = 0;  // fp16 / bf16: 2 * lowp_err + 1e-3; fp32: max(1e-5 (out, lse) / 1e-4 (grads), 2 * lowp_err)
  bool pass = false;
};

// Builds the error table for every output present in `actual` (outputs of the backend, read with
// read_tensor), against `ref64` (Precision::kFloat64) and `lowp` (Precision::kPlainLowPrecision, D from its own out:
// references()). `dtype` is the input dtype of q. fp32 (SPEC.md section 5): the fixed bounds, or twice the plain fp32
// evaluation's error where that is larger (long rows, ill-conditioned dS at large head dims put the formulas' own
// fp32 error above the fixed bounds); without a plain evaluation (`lowp` empty) the fixed bounds alone. Positions the
// float64 reference leaves unspecified (NaN) are skipped in lowp_err (the plain evaluation leaves them unspecified
// too).
std::vector<ErrorRow> error_table(const Result& actual, const Result& ref64, const Result& lowp, sinkattn_dtype_t dtype);
inline std::vector<ErrorRow> error_table(const Result& actual, const References& refs, sinkattn_dtype_t dtype) {
  return error_table(actual, refs.ref64, refs.lowp, dtype);
}

// SPEC.md section 2's mask for query row i of a sequence with len_q rows and len_kv keys: the visible keys are
// [lo, hi) (lo >= hi: the row sees no key). window_left / window_right < 0: unbounded.
struct KeyRange {
  int64_t lo = 0, hi = 0;
  bool empty() const { return lo >= hi; }
};
KeyRange visible_keys(int64_t i, int64_t len_q, int64_t len_kv, int64_t window_left, int64_t window_right,
                      bool bottom_right);

// ---- independent building blocks (exposed for the tests) ----

// IEEE binary16 and bfloat16 conversions, round to nearest even.
double half_to_double(uint16_t bits);
uint16_t double_to_half(double x);
double bf16_to_double(uint16_t bits);
uint16_t double_to_bf16(double x);
// x rounded to the precision of `dtype` (F32: float, F16: half, BF16: bfloat16; integers: unchanged).
double round_to(sinkattn_dtype_t dtype, double x);

// Philox4x32-10 (Random123), SPEC.md section 2.
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
// threshold = min(floor(p * 2^32), 2^32 - 1).
uint32_t dropout_threshold(double p);
// keep(seed, offset, n, h, i, j) of SPEC.md section 2.
bool dropout_keep(uint64_t seed, uint64_t offset, int64_t n, int64_t h, int64_t i, int64_t j, int64_t h_q,
                  int64_t max_s_q, int64_t max_s_kv, double p);

}  // namespace sinkattn::ref
