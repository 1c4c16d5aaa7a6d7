// SIMD building blocks of the CPU backend (AVX + FMA + F16C; no AVX2 / AVX-512 instructions are used, so the
// kernels run on every x86-64 server of the last decade; see SINKATTN_CPU_FLAGS in the top-level CMakeLists).
//
//   - dtype conversion of rows to / from fp32 (fp16 via F16C, bf16 by bit shifts, round-to-nearest-even),
//   - a vectorised exp for x <= 0 (exp(-inf) = 0 exactly),
//   - gemm_tile: C[m][n] (+)= sum_k A[m * a_rs + k * a_ks] * B[k * ldb + n], the one register-blocked
//     micro-kernel every product of the forward and backward goes through (Q K^T, P V, dO V^T, dS K, dS^T Q,
//     P^T dO). N is a multiple of 8 (tiles are zero-padded), M and K are arbitrary.
//
// Everything here is deterministic: a fixed operation order that does not depend on the thread count.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "sinkattn/sinkattn.h"

namespace sinkattn::cpu {

// ---------------------------------------------------------------------------------------------------------------
// Scalar conversions.

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), inf stays inf.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

inline float load_scalar(const void* base, int64_t idx, sinkattn_dtype_t dt) {
  switch (dt) {
    case SINKATTN_F16: return f16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    case SINKATTN_BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[idx]);
    default: return static_cast<const float*>(base)[idx];
  }
}

inline void store_scalar(void* base, int64_t idx, sinkattn_dtype_t dt, float x) {
  switch (dt) {
    case SINKATTN_F16: static_cast<uint16_t*>(base)[idx] = f32_to_f16(x); break;
    case SINKATTN_BF16: static_cast<uint16_t*>(base)[idx] = f32_to_bf16(x); break;
    default: static_cast<float*>(base)[idx] = x; break;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Row conversions: `n` contiguous elements of dtype `dt` <-> fp32. load_row zero-fills dst[n .. n_pad).

inline void load_row(const void* src, sinkattn_dtype_t dt, int64_t n, float* dst, int64_t n_pad) {
  int64_t c = 0;
  switch (dt) {
    case SINKATTN_F32: {
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      c = n;
      break;
    }
    case SINKATTN_F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c))));
      for (; c < n; ++c) dst[c] = f16_to_f32(s[c]);
      break;
    }
    case SINKATTN_BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      const __m128i zero = _mm_setzero_si128();
      for (; c + 8 <= n; c += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c));
        const __m128i lo = _mm_unpacklo_epi16(zero, h);  // bf16 in the high half of each 32-bit lane
        const __m128i hi = _mm_unpackhi_epi16(zero, h);
        _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(lo), hi, 1)));
      }
      for (; c < n; ++c) dst[c] = bf16_to_f32(s[c]);
      break;
    }
    default: break;
  }
  for (; c < n_pad; ++c) dst[c] = 0.f;
}

inline void store_row(const float* src, int64_t n, void* dst, sinkattn_dtype_t dt) {
  int64_t c = 0;
  switch (dt) {
    case SINKATTN_F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); break;
    case SINKATTN_F16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (; c + 8 <= n; c += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + c),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + c), _MM_FROUND_TO_NEAREST_INT));
      for (; c < n; ++c) d[c] = f32_to_f16(src[c]);
      break;
    }
    case SINKATTN_BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (; c < n; ++c) d[c] = f32_to_bf16(src[c]);
      break;
    }
    default: break;
  }
}

// Writes n zeros of dtype dt.
inline void zero_row(void* dst, sinkattn_dtype_t dt, int64_t n) {
  std::memset(dst, 0, static_cast<size_t>(n) * (dt == SINKATTN_F32 ? 4 : 2));
}

// Same as store_row with every element multiplied by `scale` first (dq, dk: softmax_scale; out: 1 / l).
inline void store_row_scaled(const float* src, int64_t n, float scale, void* dst, sinkattn_dtype_t dt, float* tmp) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) _mm256_storeu_ps(tmp + c, _mm256_mul_ps(_mm256_loadu_ps(src + c), s));
  for (; c < n; ++c) tmp[c] = src[c] * scale;
  store_row(tmp, n, dst, dt);
}

// ---------------------------------------------------------------------------------------------------------------
// exp(x), vectorised. The softmax only produces x = s - m <= 0 (forward) or x = s - LSE ~<= 0 (backward).
// Cephes' expf polynomial after range reduction x = n ln2 + r, |r| <= ln2 / 2; about 1 ulp. Arguments below
// -87.3 (including -inf) give exactly 0, so masked scores (-inf) contribute exactly nothing; arguments are
// clamped at 88 above.

inline __m256 exp_ps(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^n with SSE2 integer ops on the two halves (n in [-126, 127]).
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m128i bias = _mm_set1_epi32(127);
  const __m128i lo = _mm_slli_epi32(_mm_add_epi32(_mm256_castsi256_si128(ni), bias), 23);
  const __m128i hi = _mm_slli_epi32(_mm_add_epi32(_mm256_extractf128_si256(ni, 1), bias), 23);
  const __m256 pow2 = _mm256_castsi256_ps(_mm256_insertf128_si256(_mm256_castsi128_si256(lo), hi, 1));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2));
}

// Horizontal sum / max of 8 lanes (fixed order).
inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline float hmax_ps(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Lane mask of positions base + 0..7 inside [a, e).
inline __m256 range_mask(int64_t base, int64_t a, int64_t e) {
  const __m256 idx = _mm256_add_ps(_mm256_set1_ps(static_cast<float>(base)),
                                   _mm256_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f));
  return _mm256_and_ps(_mm256_cmp_ps(idx, _mm256_set1_ps(static_cast<float>(a)), _CMP_GE_OQ),
                       _mm256_cmp_ps(idx, _mm256_set1_ps(static_cast<float>(e)), _CMP_LT_OQ));
}

// Dot product of two contiguous fp32 rows accumulated in double (4 partial lanes, fixed order): D_i of the
// backward, whose difference with dP_ij cancels where a row sees one key beside the sink (cpu_backward.cpp).
inline double dot_f64(const float* a, const float* b, int64_t n) {
  __m256d acc = _mm256_setzero_pd();
  int64_t c = 0;
  for (; c + 4 <= n; c += 4)
    acc = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + c)), _mm256_cvtps_pd(_mm_loadu_ps(b + c)), acc);
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, acc);
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; c < n; ++c) s += static_cast<double>(a[c]) * b[c];
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// gemm micro-kernel. MR (<= 6) rows of C times NV (<= 2) * 8 columns, accumulators in named registers over the
// whole K loop (an array of __m256 makes GCC spill the accumulators to the stack on every iteration).

template <int MR, int NV, bool kAccumulate>
inline void gemm_block(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_ks, const float* B,
                       int64_t ldb, int64_t K) {
  static_assert(MR >= 1 && MR <= 6 && NV >= 1 && NV <= 2, "micro-kernel shape");
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define SINKATTN_ACC_LOAD(r, v, reg) \
  if constexpr (kAccumulate && MR > r && NV > v) reg = _mm256_loadu_ps(C + r * ldc + v * 8);
  SINKATTN_ACC_LOAD(0, 0, c00) SINKATTN_ACC_LOAD(0, 1, c01) SINKATTN_ACC_LOAD(1, 0, c10) SINKATTN_ACC_LOAD(1, 1, c11)
  SINKATTN_ACC_LOAD(2, 0, c20) SINKATTN_ACC_LOAD(2, 1, c21) SINKATTN_ACC_LOAD(3, 0, c30) SINKATTN_ACC_LOAD(3, 1, c31)
  SINKATTN_ACC_LOAD(4, 0, c40) SINKATTN_ACC_LOAD(4, 1, c41) SINKATTN_ACC_LOAD(5, 0, c50) SINKATTN_ACC_LOAD(5, 1, c51)
#undef SINKATTN_ACC_LOAD
  const float* a0 = A;
  const float* a1 = A + a_rs;
  const float* a2 = A + 2 * a_rs;
  const float* a3 = A + 3 * a_rs;
  const float* a4 = A + 4 * a_rs;
  const float* a5 = A + 5 * a_rs;
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    const int64_t ak = k * a_ks;
    const __m256 b0 = _mm256_loadu_ps(b);
    const __m256 b1 = NV > 1 ? _mm256_loadu_ps(b + 8) : b0;
    __m256 av;
#define SINKATTN_ROW(r, ap, r0, r1)                                  \
  if constexpr (MR > r) {                                            \
    av = _mm256_broadcast_ss(ap + ak);                               \
    r0 = _mm256_fmadd_ps(av, b0, r0);                                \
    if constexpr (NV > 1) r1 = _mm256_fmadd_ps(av, b1, r1);          \
  }
    SINKATTN_ROW(0, a0, c00, c01)
    SINKATTN_ROW(1, a1, c10, c11)
    SINKATTN_ROW(2, a2, c20, c21)
    SINKATTN_ROW(3, a3, c30, c31)
    SINKATTN_ROW(4, a4, c40, c41)
    SINKATTN_ROW(5, a5, c50, c51)
#undef SINKATTN_ROW
  }
#define SINKATTN_ACC_STORE(r, v, reg) \
  if constexpr (MR > r && NV > v) _mm256_storeu_ps(C + r * ldc + v * 8, reg);
  SINKATTN_ACC_STORE(0, 0, c00) SINKATTN_ACC_STORE(0, 1, c01) SINKATTN_ACC_STORE(1, 0, c10)
  SINKATTN_ACC_STORE(1, 1, c11) SINKATTN_ACC_STORE(2, 0, c20) SINKATTN_ACC_STORE(2, 1, c21)
  SINKATTN_ACC_STORE(3, 0, c30) SINKATTN_ACC_STORE(3, 1, c31) SINKATTN_ACC_STORE(4, 0, c40)
  SINKATTN_ACC_STORE(4, 1, c41) SINKATTN_ACC_STORE(5, 0, c50) SINKATTN_ACC_STORE(5, 1, c51)
#undef SINKATTN_ACC_STORE
}

template <int NV, bool kAccumulate>
inline void gemm_rows(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_ks, const float* B, int64_t ldb,
                      int64_t M, int64_t K) {
  constexpr int kMR = 6;
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR) gemm_block<kMR, NV, kAccumulate>(C + m * ldc, ldc, A + m * a_rs, a_rs, a_ks, B, ldb, K);
  float* c = C + m * ldc;
  const float* a = A + m * a_rs;
  switch (M - m) {
    case 5: gemm_block<5, NV, kAccumulate>(c, ldc, a, a_rs, a_ks, B, ldb, K); break;
    case 4: gemm_block<4, NV, kAccumulate>(c, ldc, a, a_rs, a_ks, B, ldb, K); break;
    case 3: gemm_block<3, NV, kAccumulate>(c, ldc, a, a_rs, a_ks, B, ldb, K); break;
    case 2: gemm_block<2, NV, kAccumulate>(c, ldc, a, a_rs, a_ks, B, ldb, K); break;
    case 1: gemm_block<1, NV, kAccumulate>(c, ldc, a, a_rs, a_ks, B, ldb, K); break;
    default: break;
  }
}

// C[m][n] (kAccumulate ? += : =) sum_{k < K} A[m * a_rs + k * a_ks] * B[k * ldb + n], for m < M, n < N.
// N must be a multiple of 8. With K == 0 and !kAccumulate, C is zeroed.
template <bool kAccumulate>
inline void gemm_tile(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_ks, const float* B, int64_t ldb,
                      int64_t M, int64_t N, int64_t K) {
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) gemm_rows<2, kAccumulate>(C + n, ldc, A, a_rs, a_ks, B + n, ldb, M, K);
  for (; n + 8 <= N; n += 8) gemm_rows<1, kAccumulate>(C + n, ldc, A, a_rs, a_ks, B + n, ldb, M, K);
}

// Exact variant for tiles that hold a non-finite value: row m of C accumulates only k in range(m) = [lo, hi), the
// pairs that are visible, so a NaN or inf in a row of B that row m cannot see never meets a zero weight
// (0 * NaN = NaN). C[m][n] += sum_{lo <= k < hi} A[m * a_rs + k * a_ks] * B[k * ldb + n]; N a multiple of 8.
template <typename RangeFn>
inline void gemm_tile_ranged(float* C, int64_t ldc, const float* A, int64_t a_rs, int64_t a_ks, const float* B,
                             int64_t ldb, int64_t M, int64_t N, RangeFn range) {
  for (int64_t m = 0; m < M; ++m) {
    int64_t lo, hi;
    range(m, &lo, &hi);
    if (lo >= hi) continue;
    float* c = C + m * ldc;
    for (int64_t n = 0; n < N; n += 8) {
      __m256 acc = _mm256_loadu_ps(c + n);
      for (int64_t k = lo; k < hi; ++k)
        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(A + m * a_rs + k * a_ks), _mm256_loadu_ps(B + k * ldb + n), acc);
      _mm256_storeu_ps(c + n, acc);
    }
  }
}

// c[0 .. n) += a * x[0 .. n), n a multiple of 8.
inline void axpy8(float* c, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(c + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(c + i)));
}

// Are all n elements finite (no NaN, no inf)? x - x is 0 exactly for finite x and NaN otherwise.
inline bool row_finite(const float* x, int64_t n) {
  __m256 bad = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  bool ok = _mm256_movemask_ps(bad) == 0;
  for (; c < n; ++c) ok = ok && std::isfinite(x[c]);
  return ok;
}

// Are flags[0 .. n) all nonzero?
inline bool all_set(const uint8_t* flags, int64_t n) {
  uint8_t a = 1;
  for (int64_t i = 0; i < n; ++i) a &= flags[i];
  return a != 0;
}

inline int64_t round_up8(int64_t x) { return (x + 7) & ~int64_t(7); }

}  // namespace sinkattn::cpu
