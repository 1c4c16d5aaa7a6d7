// CUDA backend: the small memory-bound kernels around the main backward kernels (SPEC.md section 3), and the
// forward's rng_state writer.
//   preprocess: per row  D_i = dot(d_out_i, out_i) (fp32, from the out passed to the backward),
//               LSE2_i = LSE_i * log2(e) (+inf when LSE_i = -inf or the row is padding: P = 0 there),
//               Dp_i = D_i - d_lse_i, and the fused d_sinks partial of the block:
//               sum over valid rows i of P_sink_i * (d_lse_i - D_i), P_sink_i = exp(sigma_h - LSE_i)
//               (common/sink.hpp: 1 for a key-less row under a -inf sink); and the rows of the fused dq's fp32
//               accumulator ws_dq are zeroed here (one pass over the rows instead of a memset of its own), but for
//               the rows the dK dV kernel's first key block of their query block stores (dq_row_stored).
//   d_sinks:    d_sinks[h] = fixed-order sum of the partials over (n, block) (no atomics: deterministic);
//               written, never accumulated into. Done by the dq convert kernel when it runs (dq_convert_runs),
//               else by a kernel of its own.
//   dq convert: dq = softmax_scale * ws_dq (the fp32 accumulator of the fused dq, either mode); launched with
//               programmatic dependent launch after the Hopper dK dV kernel (KernelChoice::pdl): it waits in pdl_wait
//               before its first read.
//   d_bias:     d_bias[nb, hb, i, j] = sum over the broadcast dims of dS[n, h, i, j] (fixed order).
#include "cuda/kernels.hpp"

#include "common/sink.hpp"
#include "cuda/common.cuh"
#include "cuda/dq_order.hpp"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

namespace {

constexpr int kPreThreads = 128;

// 8 rows per warp, 4 lanes per row (kPreRows = 32 rows per block of 4 warps): every row of the block is in
// flight at once (no serial loop over rows, whose load latencies would add up). A lane reads 16-byte pieces
// (8 elements; d_v is a multiple of 8 on this backend, at most 256) of out and d_out when both rows are 16-byte
// aligned, else elements. kPieces: the most pieces a lane reads (2, 4 or 8: d_v up to 64, 128, 256; the launch picks
// the smallest that covers d_v, so that the registers holding the pieces do not cut the blocks per SM for the
// common head dims), all issued before the first is used.
static_assert(kPreRows == (kPreThreads / 32) * 8, "8 rows per warp");

// The two elements of a 32-bit word as floats (low half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t w);
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return __half22float2(h);
}

// dot of two 16-byte pieces of 8 elements, taken by value: the pieces are loaded as one 128-bit load each (a
// reinterpret of the row pointer read element by element let the compiler split the piece into 8 16-bit loads).
template <typename T>
__device__ __forceinline__ float dot8(const uint4 a, const uint4 b) {
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x = unpack2<T>(wa[e]), y = unpack2<T>(wb[e]);
    s = fmaf(x.x, y.x, s);
    s = fmaf(x.y, y.y, s);
  }
  return s;
}

// Params::dq_store_block_m > 0 (KernelChoice::dq_first_store): row i of the sequence lies in a query block whose
// first key block (turn 0) stores the block's dq tile before any add (dq_order.hpp, dq_block_stored), so the
// preprocess leaves the row alone. Rows of a block that sees no key (dq = 0) and padding rows are zeroed as without it.
__device__ __forceinline__ bool dq_row_stored(const Params& p, const SeqInfo& sq, int i) {
  const int bm = p.dq_store_block_m;
  if (bm == 0 || i >= sq.len_q) return false;
  const int i0 = i / bm * bm;
  return dq_block_stored(Mask(p, sq), i0, min(i0 + bm, sq.len_q));
}

template <typename T, int kPieces>
__global__ void __launch_bounds__(kPreThreads) bwd_preprocess_kernel(const Params p) {
  __shared__ float warp_sums[kPreThreads / 32];
  // The dK dV kernel after this one, when launched with programmatic dependent launch, may start its blocks once
  // every block of this grid has started (they wait in pdl_wait for this grid to finish).
  pdl_launch_dependents();
  const int h = blockIdx.y, n = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 3;
  const SeqInfo sq = seq_info(p, n);
  const float sigma = sink_value(p, h);
  const int i = blockIdx.x * kPreRows + warp * 8 + (lane >> 2);
  const bool real = i < sq.len_q;  // rows [len_q, rows_q) are padding: they contribute nothing (SPEC 3)
  float dsum = 0.f;
  if (real) {
    const T* o = row_ptr<const T>(p.out, p.out_st, n, sq.q_start + i, h);
    const T* go = row_ptr<const T>(p.d_out, p.dout_st, n, sq.q_start + i, h);
    if (((reinterpret_cast<uintptr_t>(o) | reinterpret_cast<uintptr_t>(go)) & 15) == 0) {
      uint4 a[kPieces], g[kPieces];
#pragma unroll
      for (int k = 0; k < kPieces; ++k) {
        const int c = sub * 8 + k * 32;
        if (c < p.d_v) {
          a[k] = __ldg(reinterpret_cast<const uint4*>(o + c));
          g[k] = __ldg(reinterpret_cast<const uint4*>(go + c));
        }
      }
#pragma unroll
      for (int k = 0; k < kPieces; ++k)
        if (sub * 8 + k * 32 < p.d_v) dsum += dot8<T>(a[k], g[k]);
    } else {
      for (int c = sub; c < p.d_v; c += 4) dsum += ElemTraits<T>::to_float(o[c]) * ElemTraits<T>::to_float(go[c]);
    }
  }
  if (p.ws_dq != nullptr && i < sq.rows_q && !dq_row_stored(p, sq, i)) {  // zero this row of the dq accumulator
    float* acc = ws_dq_row(p, sq, n, h, i);
    for (int c = sub * 4; c < p.d; c += 16) *reinterpret_cast<float4*>(acc + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
  dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
  float part = 0.f;
  if (sub == 0 && i < sq.rows_q) {
    const int64_t wr = h * p.rows_total_q + ws_row(p, sq, n, i);
    if (!real) {
      p.ws_lse2[wr] = INFINITY;
      p.ws_dp[wr] = 0.f;
    } else {
      const float lse = p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + i)];
      const float dlse = p.d_lse ? p.d_lse[lse_offset(p.dlse_b, p.dlse_h, p.dlse_s, n, h, sq.q_start + i)] : 0.f;
      p.ws_lse2[wr] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      p.ws_dp[wr] = dsum - dlse;
      if (p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) part = sink_probability(sigma, lse) * (dlse - dsum);
    }
  }
  // fixed-order (deterministic) reduction: warp tree, then the 4 warps in order
  if (p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) part += __shfl_xor_sync(0xffffffffu, part, m);
    if (lane == 0) warp_sums[warp] = part;
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = 0.f;
      for (int w = 0; w < kPreThreads / 32; ++w) s += warp_sums[w];
      p.ws_dsink[(static_cast<int64_t>(h) * p.b + n) * p.n_pre_blocks + blockIdx.x] = s;
    }
  }
}

// d_sinks[h] = the sum of head h's preprocess partials ws_dsink[h][n][block] over (n, block), by one warp in a fixed
// order (lane l: the partials l, l + 32, .. in order, in double; then the lanes' sums by a butterfly, lane 0's result
// written): the same bits on every run.
__device__ __forceinline__ void dsinks_reduce_warp(const Params& p, int h, int lane) {
  const int64_t count = static_cast<int64_t>(p.b) * p.n_pre_blocks;
  const float* part = p.ws_dsink + h * count;
  double s = 0.0;
  for (int64_t k = lane; k < count; k += 32) s += part[k];
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
  if (lane == 0) p.d_sinks[h] = static_cast<float>(s);
}

// dq = softmax_scale * ws_dq (SPEC 3, dq_i = softmax_scale * sum_j dS_ij k_j), in the dtype; padding rows of a
// dense batch (i >= len_q) get dq = 0. The block's kPreRows x d elements as pieces of 4 columns (d is a multiple
// of 8), consecutive threads on consecutive pieces of a row (each warp instruction covers contiguous row
// segments): a float4 load of the accumulator, one 8-byte store of the row; unrolled, so that several loads of a
// thread are in flight at once. Also d_sinks (dsinks_reduce_warp): wherever this kernel runs (dq_convert_runs).
template <typename T>
__global__ void __launch_bounds__(kPreThreads) dq_convert_kernel(const Params p) {
  const int h = blockIdx.y, n = blockIdx.z;
  pdl_wait();  // the dK dV kernel's adds to ws_dq (KernelChoice::pdl)
  // d_sinks (dq_convert_runs): the first row block of sequence 0, one per head, its first warp.
  if (p.d_sinks != nullptr && blockIdx.x == 0 && n == 0 && threadIdx.x < 32) dsinks_reduce_warp(p, h, threadIdx.x);
  const SeqInfo sq = seq_info(p, n);
  const int pieces = p.d / 4, i0 = blockIdx.x * kPreRows;
  const int total = min(kPreRows, sq.rows_q - i0) * pieces;
#pragma unroll 4
  for (int e = threadIdx.x; e < total; e += kPreThreads) {
    const int i = i0 + e / pieces, c = (e - (e / pieces) * pieces) * 4;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < sq.len_q)
      a = *reinterpret_cast<const float4*>(ws_dq_row(p, sq, n, h, i) + c);
    // 4 elements, 8 bytes: rows are 16-byte aligned (the backend's tensor checks) and c a multiple of 4
    *reinterpret_cast<uint2*>(row_ptr<T>(p.dq, p.dq_st, n, sq.q_start + i, h) + c) =
        make_uint2(ElemTraits<T>::pack(a.x * p.softmax_scale, a.y * p.softmax_scale),
                   ElemTraits<T>::pack(a.z * p.softmax_scale, a.w * p.softmax_scale));
  }
}

__global__ void dsinks_finalize_kernel(const Params p) { dsinks_reduce_warp(p, blockIdx.x, threadIdx.x); }

// d_bias[nb][hb][i][j] = the sum, over the batches / heads the bias broadcasts over, of dS_{n,h}[i][j] (ws_dbias),
// each term only where (i, j) is visible in sequence n (SPEC 2; 0 elsewhere). The main kernels write dS for every
// in-sequence element of each tile they visit and visit every tile with a visible element, so the workspace needs
// no clearing: an element they did not write is never read. Grid: x over keys j, y over query rows i, z over the
// (nb, hb) slices (rows and slices in grid-stride loops).
template <typename B>
__global__ void dbias_reduce_kernel(const Params p) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= p.s_kv) return;
  const int slices = p.bias_shape_b * p.bias_shape_h;
  const int64_t plane = static_cast<int64_t>(p.s_q) * p.s_kv;
  for (int nh = blockIdx.z; nh < slices; nh += gridDim.z) {
    const int hb = nh % p.bias_shape_h, nb = nh / p.bias_shape_h;
    const int n0 = p.bias_shape_b == 1 ? 0 : nb, n1 = p.bias_shape_b == 1 ? p.b : nb + 1;
    // Heads of the workspace: h_q, or h_kv when the dK dV kernel summed each KV group (only for a bias broadcast
    // over the heads).
    const int h0 = p.bias_shape_h == 1 ? 0 : hb, h1 = p.bias_shape_h == 1 ? p.ws_dbias_heads : hb + 1;
    for (int i = blockIdx.y; i < p.s_q; i += gridDim.y) {
      float s = 0.f;
      for (int n = n0; n < n1; ++n) {
        const SeqInfo sq = seq_info(p, n);
        if (i >= sq.len_q || !Mask(p, sq).visible(i, j)) continue;
        const float* ws = p.ws_dbias + static_cast<int64_t>(i) * p.s_kv + j;
        for (int h = h0; h < h1; ++h) s += ws[(static_cast<int64_t>(n) * p.ws_dbias_heads + h) * plane];
      }
      B* dst = static_cast<B*>(p.d_bias) + nb * p.dbias_b + hb * p.dbias_h + i * p.dbias_i + j * p.dbias_j;
      if constexpr (sizeof(B) == 4) {
        *dst = s;
      } else {
        *dst = ElemTraits<B>::from_float(s);
      }
    }
  }
}

__global__ void rng_state_kernel(const uint64_t* rng_in, int64_t in_stride, uint64_t seed, uint64_t offset,
                                 uint64_t* rng_state, int64_t out_stride) {
  if (rng_in) {
    seed = rng_in[0];
    offset = rng_in[in_stride];
  }
  rng_state[0] = seed;
  rng_state[out_stride] = offset;
}

}  // namespace

bool dq_convert_runs(const Params& p) { return p.ws_dq != nullptr && p.b > 0 && p.h_q > 0 && p.n_pre_blocks > 0; }

template <typename T>
cudaError_t launch_bwd_small(const Params& p, int which, cudaStream_t stream, bool pdl) {
  switch (which) {
    case kSmallPreprocess: {
      if (p.b == 0 || p.h_q == 0 || p.n_pre_blocks == 0) return cudaSuccess;
      const dim3 grid(p.n_pre_blocks, p.h_q, p.b);
      if (p.d_v <= 64)
        bwd_preprocess_kernel<T, 2><<<grid, kPreThreads, 0, stream>>>(p);
      else if (p.d_v <= 128)
        bwd_preprocess_kernel<T, 4><<<grid, kPreThreads, 0, stream>>>(p);
      else
        bwd_preprocess_kernel<T, 8><<<grid, kPreThreads, 0, stream>>>(p);
      break;
    }
    case kSmallDSinks:
      if (p.h_q == 0) return cudaSuccess;
      dsinks_finalize_kernel<<<p.h_q, 32, 0, stream>>>(p);
      break;
    case kSmallDBias: {
      const int64_t slices = static_cast<int64_t>(p.bias_shape_b) * p.bias_shape_h;
      if (slices == 0 || p.s_q == 0 || p.s_kv == 0) return cudaSuccess;
      const dim3 grid(static_cast<unsigned>((p.s_kv + 255) / 256), static_cast<unsigned>(std::min(p.s_q, 65535)),
                      static_cast<unsigned>(std::min<int64_t>(slices, 65535)));
      if (p.bias_f32)
        dbias_reduce_kernel<float><<<grid, 256, 0, stream>>>(p);
      else
        dbias_reduce_kernel<T><<<grid, 256, 0, stream>>>(p);
      break;
    }
    case kSmallDqConvert: {
      if (!dq_convert_runs(p)) return cudaSuccess;
      return launch_kernel(dq_convert_kernel<T>, dim3(p.n_pre_blocks, p.h_q, p.b), dim3(kPreThreads), 0, stream, pdl,
                           p);
    }
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template cudaError_t launch_bwd_small<__half>(const Params&, int, cudaStream_t, bool);
template cudaError_t launch_bwd_small<__nv_bfloat16>(const Params&, int, cudaStream_t, bool);

cudaError_t launch_rng_state(const uint64_t* rng_in, int64_t in_stride, uint64_t seed, uint64_t offset,
                             uint64_t* rng_state, int64_t out_stride, cudaStream_t stream) {
  rng_state_kernel<<<1, 1, 0, stream>>>(rng_in, in_stride, seed, offset, rng_state, out_stride);
  return cudaGetLastError();
}

}  // namespace sinkattn::cuda
