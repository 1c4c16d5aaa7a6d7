// CUDA backend: the two warp-level tensor-core products every kernel is made of (sm_80 mma.sync path).
// A Hopper (wgmma) mainloop replaces these and the loads around them; masks, sinks, dropout and the
// epilogue do not change.
//   gemm_abt: acc(16 x N) += A(16 x K) * B(N x K)^T   (S = Q K^T, S^T = K Q^T, dP = dO V^T, dP^T = V dO^T)
//   gemm_pb:  acc(16 x N) += P(16 x K) * B(K x N)     (O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q)
// A and B are row-major tiles in shared memory with row stride LD (elements); P comes from fp32 C fragments
// and is rounded to the input dtype (as FlashAttention does), or carried as two terms of it (gemm_pb_split).
#pragma once

#include "cuda/common.cuh"

namespace sinkattn::cuda {

template <typename T, int NT, int KD, int LD>
__device__ __forceinline__ void gemm_abt(float (&acc)[NT][4], const T* sA, const T* sB, int lane) {
  static_assert(NT % 2 == 0 && KD % 16 == 0, "tile shape");
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, sA + (lane % 16) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, sB + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
      ElemTraits<T>::mma(acc[2 * np], a, b[0], b[1]);
      ElemTraits<T>::mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

template <typename T, int NK, int NO, int LD>
__device__ __forceinline__ void gemm_pb(float (&acc)[NO][4], const float (&p)[NK][4], const T* sB, int lane) {
  static_assert(NK % 2 == 0 && NO % 2 == 0, "tile shape");
#pragma unroll
  for (int kc = 0; kc < NK / 2; ++kc) {
    uint32_t a[4];
    a[0] = ElemTraits<T>::pack(p[2 * kc][0], p[2 * kc][1]);
    a[1] = ElemTraits<T>::pack(p[2 * kc][2], p[2 * kc][3]);
    a[2] = ElemTraits<T>::pack(p[2 * kc + 1][0], p[2 * kc + 1][1]);
    a[3] = ElemTraits<T>::pack(p[2 * kc + 1][2], p[2 * kc + 1][3]);
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sB + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + np * 16 + (lane / 16) * 8);
      ElemTraits<T>::mma(acc[2 * np], a, b[0], b[1]);
      ElemTraits<T>::mma(acc[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// x0, x1 as two terms of T each: hi = the pair rounded to T, lo = (x - hi) rounded to T, so that hi + lo holds x to
// about twice T's precision (bf16: 16 bits instead of 8). A value whose rounding to T overflows keeps lo = 0 (an
// infinite hi stays what the one rounding gives, never inf - inf).
template <typename T>
__device__ __forceinline__ void pack_split(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = ElemTraits<T>::pack(x0, x1);
  T h[2];
  memcpy(h, &hi, sizeof(hi));
  const float h0 = ElemTraits<T>::to_float(h[0]), h1 = ElemTraits<T>::to_float(h[1]);
  lo = ElemTraits<T>::pack(isfinite(h0) ? x0 - h0 : 0.f, isfinite(h1) ? x1 - h1 : 0.f);
}

// gemm_pb with P as two terms of T (pack_split): acc += hi B + lo B, the two products sharing each B fragment. For the
// products whose one rounding of P to T would dominate their error (tiles::bwd_split_ds).
template <typename T, int NK, int NO, int LD>
__device__ __forceinline__ void gemm_pb_split(float (&acc)[NO][4], const float (&p)[NK][4], const T* sB, int lane) {
  static_assert(NK % 2 == 0 && NO % 2 == 0, "tile shape");
#pragma unroll
  for (int kc = 0; kc < NK / 2; ++kc) {
    uint32_t hi[4], lo[4];
    pack_split<T>(p[2 * kc][0], p[2 * kc][1], hi[0], lo[0]);
    pack_split<T>(p[2 * kc][2], p[2 * kc][3], hi[1], lo[1]);
    pack_split<T>(p[2 * kc + 1][0], p[2 * kc + 1][1], hi[2], lo[2]);
    pack_split<T>(p[2 * kc + 1][2], p[2 * kc + 1][3], hi[3], lo[3]);
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sB + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + np * 16 + (lane / 16) * 8);
      ElemTraits<T>::mma(acc[2 * np], hi, b[0], b[1]);
      ElemTraits<T>::mma(acc[2 * np + 1], hi, b[2], b[3]);
      ElemTraits<T>::mma(acc[2 * np], lo, b[0], b[1]);
      ElemTraits<T>::mma(acc[2 * np + 1], lo, b[2], b[3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

}  // namespace sinkattn::cuda

namespace sinkattn::cuda {

// Multi-m-tile variants: a warp owns MT x 16 rows, so every K / V fragment read from shared memory (ldmatrix)
// feeds MT tensor-core products instead of one (halves shared-memory traffic per FLOP at MT = 2).
//   gemm_abt_m: acc[mt](16 x N) += A[mt](16 x K) * B(N x K)^T,  A rows mt * 16 .. mt * 16 + 15 of sA
//   gemm_pb_m:  acc[mt](16 x N) += P[mt](16 x K) * B(K x N)
// One k-step (kk) of gemm_abt_m: the B fragments of sB's 16 columns kk * 16 .. + 15, times the A fragments a[mt].
template <typename T, int MT, int NT, int LD>
__device__ __forceinline__ void abt_kstep_m(float (&acc)[MT][NT][4], const uint32_t (&a)[MT][4], const T* sB, int kk,
                                            int lane) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    uint32_t b[4];
    ldmatrix_x4(b, sB + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      ElemTraits<T>::mma(acc[mt][2 * np], a[mt], b[0], b[1]);
      ElemTraits<T>::mma(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
    }
  }
}
template <typename T, int MT, int NT, int KD, int LD>
__device__ __forceinline__ void gemm_abt_m(float (&acc)[MT][NT][4], const T* sA, const T* sB, int lane) {
  static_assert(NT % 2 == 0 && KD % 16 == 0, "tile shape");
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(a[mt], sA + (mt * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
    abt_kstep_m<T, MT, NT, LD>(acc, a, sB, kk, lane);
  }
}

// A held in registers instead (a kernel that reads the same A for every key tile, as the decode kernel's Q):
//   load_a_m:       a[kk][mt] = the A fragments of rows mt * 16 .. mt * 16 + 15, k-step kk, of sA
//   gemm_abt_m_reg: gemm_abt_m with those fragments
template <int MT, int KD, int LD, typename T>
__device__ __forceinline__ void load_a_m(uint32_t (&a)[KD / 16][MT][4], const T* sA, int lane) {
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(a[kk][mt], sA + (mt * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8);
}
template <typename T, int MT, int NT, int KD, int LD>
__device__ __forceinline__ void gemm_abt_m_reg(float (&acc)[MT][NT][4], const uint32_t (&a)[KD / 16][MT][4],
                                               const T* sB, int lane) {
  static_assert(NT % 2 == 0 && KD % 16 == 0, "tile shape");
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk) abt_kstep_m<T, MT, NT, LD>(acc, a[kk], sB, kk, lane);
}

template <typename T, int MT, int NK, int NO, int LD>
__device__ __forceinline__ void gemm_pb_m(float (&acc)[MT][NO][4], const float (&p)[MT][NK][4], const T* sB,
                                          int lane) {
  static_assert(NK % 2 == 0 && NO % 2 == 0, "tile shape");
#pragma unroll
  for (int kc = 0; kc < NK / 2; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = ElemTraits<T>::pack(p[mt][2 * kc][0], p[mt][2 * kc][1]);
      a[mt][1] = ElemTraits<T>::pack(p[mt][2 * kc][2], p[mt][2 * kc][3]);
      a[mt][2] = ElemTraits<T>::pack(p[mt][2 * kc + 1][0], p[mt][2 * kc + 1][1]);
      a[mt][3] = ElemTraits<T>::pack(p[mt][2 * kc + 1][2], p[mt][2 * kc + 1][3]);
    }
#pragma unroll
    for (int np = 0; np < NO / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sB + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + np * 16 + (lane / 16) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ElemTraits<T>::mma(acc[mt][2 * np], a[mt], b[0], b[1]);
        ElemTraits<T>::mma(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc(16 x NC * 8) += A(16 x KD) * B(KD x NC * 8) with A stored TRANSPOSED in shared memory (sAt[k][m], row
// stride LDA; sAt points at the tile's first m column) and B row-major (sB[k][n], row stride LDB; sB points at
// the tile's first n column). Used for dQ += dS K in the fused backward, dS^T being held per key row.
// ldmatrix .trans of the stored [k][m] 8x8 blocks gives thread (g, t) A(m = g, k = 2t, 2t + 1): the A layout.
// The k-steps alternate between two accumulator sets (summed at the end): NC * 2 independent products in flight
// instead of NC, since a long k-loop with few columns is otherwise one dependent chain per accumulator.
template <typename T, int NC, int KD, int LDA, int LDB>
__device__ __forceinline__ void gemm_atb(float (&acc)[NC][4], const T* sAt, const T* sB, int lane) {
  static_assert(NC % 2 == 0 && KD % 32 == 0, "tile shape");
  float acc2[NC][4];
  zero_acc(acc2);
#pragma unroll
  for (int kc = 0; kc < KD / 16; ++kc) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, sAt + (kc * 16 + (lane / 16) * 8 + (lane % 8)) * LDA + ((lane / 8) % 2) * 8);
#pragma unroll
    for (int np = 0; np < NC / 2; ++np) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, sB + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LDB + np * 16 + (lane / 16) * 8);
      float(&c)[NC][4] = (kc % 2 == 0) ? acc : acc2;
      ElemTraits<T>::mma(c[2 * np], a, b[0], b[1]);
      ElemTraits<T>::mma(c[2 * np + 1], a, b[2], b[3]);
    }
  }
#pragma unroll
  for (int i = 0; i < NC; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] += acc2[i][e];
}

}  // namespace sinkattn::cuda
