// CUDA backend: definitions of the per-tile launchers (included by inst_hd*.cu, one head-dim tile each).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <type_traits>

#include "cuda/bwd_kernel.cuh"
#include "cuda/fwd_kernel.cuh"
#include "cuda/hopper/bwd_dkdv_sm90.cuh"
#include "cuda/hopper/bwd_dkdv_sm90_wide.cuh"
#include "cuda/hopper/fwd_sm90_ws.cuh"
#include "cuda/kernels.hpp"

namespace sinkattn::cuda {

template <typename Kernel>
inline cudaError_t prepare_smem(Kernel kernel, int smem) {
  if (smem > 48 * 1024) return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return cudaSuccess;
}

// Tensor map of a q / k / v-like tensor for the Hopper kernels' TMA loads: 4-d (cols, rows, heads, nb) of 16-bit
// elements with the row / head / batch strides of `st`, box 64 x box_rows x 1 x 1 with 128-byte swizzle (the
// row-panel layout of sm90_common.cuh), out-of-bounds elements read as zeros; dense: rows = the per-batch extent,
// nb = b; varlen: rows = the packed total, nb = 1. The driver's encoder is looked up once through the runtime (no
// link against libcuda). Returns false where a map cannot be made (encoder missing, a stride of 0, or the driver
// refusing the description); the kernels then load through cp.async. Whether to try at all is the dispatch's
// (KernelChoice::fwd_tma / dkdv_tma; SINKATTN_CUDA_NO_TMA=1 turns it off, dispatch.hpp).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult res{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &res) !=
            cudaSuccess ||
        res != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

template <typename T>
inline bool make_rows_map(CUtensorMap& map, const void* ptr, int cols, int64_t rows, int heads, int64_t nb,
                          const RowStrides3& st, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const CUtensorMapDataType dt =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const int64_t sb = nb > 1 ? st.b : st.s;  // the batch stride only matters when there are several batches
  if (st.s <= 0 || st.h <= 0 || sb <= 0) return false;
  // Descriptions the encoder may refuse are not passed to it (a refused call is a CUDA error that compute-sanitizer
  // reports): a base address or a stride in bytes that is not a multiple of 16 (the encoder's documented
  // requirements), and a box larger than the tensor (fewer rows than one block, a head dim below 64: seen on the
  // H200, CUDA_ERROR_INVALID_VALUE for a varlen call of 11 rows in all with 128-row boxes); such calls load
  // through cp.async (with fewer rows than a block, every block is partial anyway).
  const auto mis16 = [](int64_t bytes) { return bytes % 16 != 0; };
  if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || mis16(st.s * int64_t{sizeof(T)}) ||
      mis16(st.h * int64_t{sizeof(T)}) || mis16(sb * int64_t{sizeof(T)}) || rows < box_rows || cols < 64)
    return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(nb)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st.s) * sizeof(T), static_cast<cuuint64_t>(st.h) * sizeof(T),
                                 static_cast<cuuint64_t>(sb) * sizeof(T)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  return encode(&map, dt, 4, const_cast<void*>(ptr), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Tensor map of the fused dq's fp32 accumulator p.ws_dq ([h_q][rows_total_q][d], params.cuh) for the Hopper dK dV
// kernel's TMA reduce-adds: 3-d (d, rows_total_q, h_q), box 32 columns (128 bytes) x box_rows rows x 1 with 128-byte
// swizzle (sm90::sw128_f32_offset is the matching shared-memory image). False where the encoder refuses or a
// coordinate would not fit its int32 (the kernel then adds with atomics).
inline bool make_dq_map(CUtensorMap& map, float* ws_dq, int d, int64_t rows_total, int heads, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr || ws_dq == nullptr) return false;
  if (reinterpret_cast<uintptr_t>(ws_dq) % 16 != 0 || (int64_t{d} * 4) % 16 != 0 || d < 32 || rows_total < box_rows ||
      rows_total > INT32_MAX)
    return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(rows_total),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * 4, static_cast<cuuint64_t>(rows_total * d) * 4};
  const cuuint32_t box[3] = {32, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem[3] = {1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, ws_dq, dims, strides, box, elem,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Tensor map of a 16-bit bias [b|1, h_q|1, s_q, s_kv] for the Hopper kernels' staged bias tiles: 4-d (s_kv, s_q,
// bias heads, bias batches), box 64 keys x box_rows queries, 128-byte swizzle, zeros outside the tensor (make_rows_map;
// a broadcast dimension has extent 1, its stride is only a placeholder). False for an fp32 bias, keys of non-unit
// stride or a row stride of 0 (broadcast over the queries), and wherever make_rows_map refuses; the kernels then load
// each thread's bias fragment from global memory.
template <typename T>
inline bool make_bias_map(CUtensorMap& map, const Params& p, int box_rows) {
  if (p.bias == nullptr || p.bias_f32 || p.bias_j != 1 || p.bias_i <= 0) return false;
  RowStrides3 st;
  st.s = p.bias_i;
  st.h = p.bias_shape_h > 1 ? p.bias_h : p.bias_i * p.s_q;
  st.b = p.bias_shape_b > 1 ? p.bias_b : st.h * p.bias_shape_h;
  return make_rows_map<T>(map, p.bias, p.s_kv, p.s_q, p.bias_shape_h, p.bias_shape_b, st, box_rows);
}

// The launchers run the kernel the dispatch chose (dispatch.cpp: KernelChoice); a choice this tile has no kernel
// for is an internal error (cudaErrorInvalidValue).

// The TMA descriptors of a Hopper forward's Q, K and V tiles (block_m query rows, block_n key rows per box); ok =
// false (the kernels load by cp.async) when the dispatch turned TMA off or the encoder refuses a description.
template <typename T>
sm90::Sm90FwdTma fwd_tma_maps(const Params& p, const KernelChoice& kc, int block_m, int block_n) {
  sm90::Sm90FwdTma tma{};
  const int64_t rq = p.varlen ? p.rows_total_q : p.s_q, rk = p.varlen ? p.rows_total_kv : p.s_kv;
  const int64_t nb = p.varlen ? 1 : p.b;
  tma.ok = kc.fwd_tma && make_rows_map<T>(tma.q, p.q, p.d, rq, p.h_q, nb, p.q_st, block_m);
  if (kc.fwd_paged) {  // the pools: (d, rows in a page, h_kv, pages), boxes of one page chunk (paged_kv_sm90.cuh)
    tma.page_rows = kc.fwd_page_rows;
    tma.ok = tma.ok && tma.page_rows >= 8 && block_n % tma.page_rows == 0 && p.page_size % tma.page_rows == 0 &&
             make_rows_map<T>(tma.k, p.k, p.d, p.page_size, p.h_kv, kc.fwd_kv_pages, p.k_st, tma.page_rows) &&
             make_rows_map<T>(tma.v, p.v, p.d_v, p.page_size, p.h_kv, kc.fwd_kv_pages, p.v_st, tma.page_rows);
  } else {
    tma.ok = tma.ok && make_rows_map<T>(tma.k, p.k, p.d, rk, p.h_kv, nb, p.k_st, block_n) &&
             make_rows_map<T>(tma.v, p.v, p.d_v, rk, p.h_kv, nb, p.v_st, block_n);
  }
  tma.bias_ok = kc.fwd_bias_tma && make_bias_map<T>(tma.bias, p, block_m);
  return tma;
}

// The warp-specialised Hopper forward with NC consumer warpgroups (hopper/fwd_sm90_ws.cuh); kPaged: K / V through
// the page table; QS: Q buffers (2: the short-window variant).
template <typename T, int HD, int NC, bool kBias = false, bool kDropout = false, bool kPaged = false, int QS = 1>
cudaError_t launch_fwd_ws(const Params& p, const KernelChoice& kc, cudaStream_t stream) {
  using TrW = sm90::FwdWsTraits<HD, NC, kBias, kDropout, QS>;
  const auto kernel = sm90::fwd_sm90_ws_kernel<T, HD, NC, kBias, kDropout, kPaged, QS>;
  cudaError_t e = prepare_smem(kernel, TrW::kSmem);
  if (e != cudaSuccess) return e;
  const sm90::Sm90FwdTma tma = fwd_tma_maps<T>(p, kc, TrW::kBlockM, TrW::kBlockN);
  // Persistent blocks (one per SM, at most one per tile) walk the tiles in longest-first order.
  const int64_t tiles = static_cast<int64_t>((p.s_q + TrW::kBlockM - 1) / TrW::kBlockM) * p.h_q * p.b;
  if (tiles == 0) return cudaSuccess;
  int sms = kc.fwd_sms;  // the dispatch's cached device properties; asked here only when they had none
  if (sms <= 0) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return cudaGetLastError();
  }
  const int64_t blocks = std::min<int64_t>(tiles, sms);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), TrW::kThreads, TrW::kSmem, stream>>>(p, tma, static_cast<int>(tiles));
  return cudaGetLastError();
}

template <typename T, int HD>
cudaError_t launch_fwd(const Params& p, const KernelChoice& kc, cudaStream_t stream) {
  using Tr = FwdTraits<HD>;
  const int mblocks = (p.s_q + Tr::kBlockM - 1) / Tr::kBlockM;
  if (mblocks == 0 || p.h_q == 0 || p.b == 0) return cudaSuccess;
  const dim3 grid(mblocks, p.h_q, p.b);
  switch (kc.fwd) {
    case FwdKernel::kSm90Ws:
      // One consumer count per variant (tiles::sm90_ws_*_consumers; dispatch.cpp, ws_consumers): the plain variant
      // at every tile of tiles::has_sm90_fwd_ws, the dropout and bias variants (not both) at tiles 64 and 128, the
      // short-window variant (plain, Q in 2 buffers) at tiles::sm90_ws_window.
      if constexpr (tiles::has_sm90_fwd_ws(HD)) {
        if (kc.fwd_q_stages != 1) {
          if constexpr (tiles::sm90_ws_window(HD)) {
            constexpr int kNC = tiles::kSm90WsWindowConsumers, kQS = tiles::kSm90WsWindowQStages;
            if (kc.bias || kc.dropout || kc.fwd_paged || kc.fwd_consumers != kNC || kc.fwd_q_stages != kQS)
              return cudaErrorInvalidValue;
            return launch_fwd_ws<T, HD, kNC, false, false, false, kQS>(p, kc, stream);
          }
          return cudaErrorInvalidValue;
        }
        if (kc.fwd_paged) {  // paged KV: the plain variant (validation refuses bias / dropout with a page table)
          constexpr int kNC = tiles::sm90_ws_default_consumers(HD);
          if (kc.bias || kc.dropout || kc.fwd_consumers != kNC) return cudaErrorInvalidValue;
          return launch_fwd_ws<T, HD, kNC, false, false, true>(p, kc, stream);
        }
        if (kc.dropout) {
          if constexpr (tiles::has_sm90(HD)) {
            constexpr int kNC = tiles::sm90_ws_dropout_consumers(HD);
            if (kc.bias || kc.fwd_consumers != kNC) return cudaErrorInvalidValue;
            return launch_fwd_ws<T, HD, kNC, false, true>(p, kc, stream);
          }
          return cudaErrorInvalidValue;
        }
        if (kc.bias) {
          if constexpr (tiles::has_sm90(HD)) {
            constexpr int kNC = tiles::sm90_ws_bias_consumers(HD);
            if (kc.fwd_consumers != kNC) return cudaErrorInvalidValue;
            return launch_fwd_ws<T, HD, kNC, true>(p, kc, stream);
          }
          return cudaErrorInvalidValue;
        }
        constexpr int kNC = tiles::sm90_ws_default_consumers(HD);
        if (kc.fwd_consumers != kNC) return cudaErrorInvalidValue;
        return launch_fwd_ws<T, HD, kNC>(p, kc, stream);
      }
      return cudaErrorInvalidValue;
    case FwdKernel::kSm80Paged: {
      // Paged KV (SPEC 1; validation refuses bias and dropout with a page table): the sm_80 kernel reading K / V rows
      // through the page table. At most 2 blocks per SM: the per-row page lookups need registers (fewer spills).
      constexpr int kMinB = Tr::kMinBlocks < 2 ? Tr::kMinBlocks : 2;
      cudaError_t e = prepare_smem(fwd_kernel<T, HD, false, kMinB, Tr::kBlockN, true>, Tr::kSmem);
      if (e != cudaSuccess) return e;
      fwd_kernel<T, HD, false, kMinB, Tr::kBlockN, true><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
      return cudaGetLastError();
    }
    case FwdKernel::kDecode:
      return cudaErrorInvalidValue;  // cuda_backend.cu runs the decode kernels (decode/decode.hpp)
    case FwdKernel::kSm80Extra: {  // bias / dropout variant: at most 2 blocks per SM (fewer spills)
      constexpr int kMinB = Tr::kMinBlocks < 2 ? Tr::kMinBlocks : 2;
      cudaError_t e = prepare_smem(fwd_kernel<T, HD, true, kMinB>, Tr::kSmem);
      if (e != cudaSuccess) return e;
      fwd_kernel<T, HD, true, kMinB><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
      return cudaGetLastError();
    }
    case FwdKernel::kSm80: {
      constexpr int kBN = tiles::fwd_block_n_lean(HD);
      constexpr int smem = (Tr::kBlockM + 4 * kBN) * Tr::kStride * 2;
      cudaError_t e = prepare_smem(fwd_kernel<T, HD, false, Tr::kMinBlocks, kBN>, smem);
      if (e != cudaSuccess) return e;
      fwd_kernel<T, HD, false, Tr::kMinBlocks, kBN><<<grid, Tr::kThreads, smem, stream>>>(p);
      return cudaGetLastError();
    }
  }
  return cudaErrorInvalidValue;
}

template <typename T, int HD>
cudaError_t launch_bwd_dq(const Params& p, const KernelChoice& kc, cudaStream_t stream) {
  (void)kc;
  using Tr = DqTraits<HD>;
  const int mblocks = (p.s_q + Tr::kBlockM - 1) / Tr::kBlockM;
  if (mblocks == 0 || p.h_q == 0 || p.b == 0) return cudaSuccess;
  cudaError_t e = prepare_smem(bwd_dq_kernel<T, HD>, Tr::kSmem);
  if (e != cudaSuccess) return e;
  bwd_dq_kernel<T, HD><<<dim3(mblocks, p.h_q, p.b), Tr::kThreads, Tr::kSmem, stream>>>(p);
  return cudaGetLastError();
}

// What both Hopper dK dV kernels need of the workspace: the fused dq's accumulator, and the ordered dq's semaphores.
// No query row at all (varlen with every seqlens_q 0, or s_q = 0): the dq accumulator has no bytes (a NULL workspace
// may then hold it) and the kernels only write dK = dV = 0.
inline bool dkdv_sm90_workspace_ok(const Params& p, const KernelChoice& kc) {
  return !(p.ws_dq == nullptr && p.rows_total_q > 0) && !(kc.dq == DqPath::kFusedOrdered && p.ws_dq_sem == nullptr);
}

// The tensor maps of the Hopper dK dV kernels (Sm90Tma): q and d_out in boxes of block_m rows (a kernel's TMA blocks
// are whole query blocks), the dq accumulator, and a staged bias (kc.dkdv_bias_tma); each ok flag false where the
// dispatch turned it off or the encoder refuses the description.
template <typename T>
sm90::Sm90Tma dkdv_tma_maps(const Params& p, const KernelChoice& kc, int block_m) {
  sm90::Sm90Tma tma{};
  const int64_t rows = p.varlen ? p.rows_total_q : p.s_q, nb = p.varlen ? 1 : p.b;
  tma.ok = kc.dkdv_tma && make_rows_map<T>(tma.q, p.q, p.d, rows, p.h_q, nb, p.q_st, block_m) &&
           make_rows_map<T>(tma.d_out, p.d_out, p.d_v, rows, p.h_q, nb, p.dout_st, block_m);
  tma.dq_ok = kc.dq_tma && make_dq_map(tma.dq, p.ws_dq, p.d, p.rows_total_q, p.h_q, block_m);
  tma.bias_ok = kc.dkdv_bias_tma && make_bias_map<T>(tma.bias, p, block_m);
  return tma;
}

// The Hopper dK dV kernel with BM query rows per step (KernelChoice::dkdv_block_m) and the variant kc names. Only the
// heights the rule gives are compiled (tiles::dkdv_sm90_block_m): the plain variant at its height for HD, the bias
// and dropout variants at 64 rows.
template <typename T, int HD, int BM>
cudaError_t launch_bwd_dkdv_sm90(const Params& p, const KernelChoice& kc, dim3 grid, cudaStream_t stream) {
  constexpr bool kPlain = tiles::dkdv_sm90_block_m(HD, true) == BM;
  constexpr bool kExtra = tiles::dkdv_sm90_block_m(HD, false) == BM;
  static_assert(!kExtra || BM == 64, "the bias / dropout variants' staging and keep bits are laid out for 64 rows");
  using Tr90 = sm90::DkvSm90Traits<HD, false, false, BM>;
  using Tr90Det = sm90::DkvSm90Traits<HD, false, false, BM, true>;  // (its dq writer: DkvSm90Traits::kDqWriter)
  static_assert(Tr90::kBlockN == DkvTraits<HD>::kBlockN, "same grid as the sm_80 dK dV kernel");
  if (!dkdv_sm90_workspace_ok(p, kc)) return cudaErrorInvalidValue;
  const bool det = kc.dq == DqPath::kFusedOrdered;
  if (kc.bias && (kc.dropout || p.ws_dbias == nullptr)) return cudaErrorInvalidValue;
  // The group sum of dS for d_bias needs its shared-memory accumulator (tile 64 only: dispatch.cpp).
  if (kc.dbias_group_sum && (!kc.bias || HD != 64 || p.ws_dbias_heads != p.h_kv)) return cudaErrorInvalidValue;
  if (kc.dkdv_bias_tma && !kc.bias) return cudaErrorInvalidValue;
  void (*kernel)(const Params, const sm90::Sm90Tma) = nullptr;
  int smem = det ? Tr90Det::kSmem : Tr90::kSmem, threads = det ? Tr90Det::kThreads : Tr90::kThreads;
  if (kc.bias || kc.dropout) {
    if constexpr (kExtra) {
      // The bias variants' shared memory has room for the staged bias tiles (used when tma.bias_ok).
      using Tr90B = sm90::DkvSm90Traits<HD, true>;
      // The dropout variants' threads and shared memory: a third warpgroup and its keep buffers where
      // tiles::dkdv_sm90_keep_producer (keep_producers.cuh, keep_producer); the plain kernel's otherwise.
      using Tr90D = sm90::DkvSm90Traits<HD, false, true>;
      if (kc.bias) {
        kernel = det ? sm90::bwd_dkdv_sm90_kernel<T, HD, true, false, true>
                     : sm90::bwd_dkdv_sm90_kernel<T, HD, false, false, true>;
        smem = kc.dbias_group_sum ? Tr90B::kSmemDbiasSum : Tr90B::kSmem;
        threads = Tr90B::kThreads;  // (the plain variant has a producer warpgroup, the bias variants none)
      } else {
        kernel = det ? sm90::bwd_dkdv_sm90_kernel<T, HD, true, true> : sm90::bwd_dkdv_sm90_kernel<T, HD, false, true>;
        smem = Tr90D::kSmem;
        threads = Tr90D::kThreads;
      }
    }
  } else if constexpr (kPlain) {
    kernel = det ? sm90::bwd_dkdv_sm90_kernel<T, HD, true, false, false, BM>
                 : sm90::bwd_dkdv_sm90_kernel<T, HD, false, false, false, BM>;
  }
  if (kernel == nullptr) return cudaErrorInvalidValue;  // a height the rule does not give this variant
  cudaError_t e = prepare_smem(kernel, smem);
  if (e != cudaSuccess) return e;
  sm90::step_trace_clear(stream);  // (profiling builds only: hopper/step_trace.cuh)
  e = launch_kernel(kernel, grid, dim3(threads), smem, stream, kc.pdl, p, dkdv_tma_maps<T>(p, kc, BM));
  sm90::step_trace_write(stream, HD, BM, det, p.group, e, grid);
  return e;
}

// The Hopper dK dV kernel of tile 256 (the head dim split between the warpgroups; plain: no bias, no dropout).
template <typename T, int HD>
cudaError_t launch_bwd_dkdv_sm90_wide(const Params& p, const KernelChoice& kc, dim3 grid, cudaStream_t stream) {
  using TrW = sm90::DkvSm90WideTraits<HD>;
  static_assert(TrW::kBlockN == DkvTraits<HD>::kBlockN, "same grid as the sm_80 dK dV kernel");
  if (!dkdv_sm90_workspace_ok(p, kc) || kc.bias || kc.dropout || kc.dkdv_bias_tma || kc.dkdv_block_m != TrW::kBlockM)
    return cudaErrorInvalidValue;
  const bool det = kc.dq == DqPath::kFusedOrdered;
  auto kernel = det ? sm90::bwd_dkdv_sm90_wide_kernel<T, HD, true> : sm90::bwd_dkdv_sm90_wide_kernel<T, HD, false>;
  cudaError_t e = prepare_smem(kernel, TrW::kSmem);
  if (e != cudaSuccess) return e;
  return launch_kernel(kernel, grid, dim3(TrW::kThreads), TrW::kSmem, stream, kc.pdl, p,
                       dkdv_tma_maps<T>(p, kc, TrW::kBlockM));
}

template <typename T, int HD>
cudaError_t launch_bwd_dkdv(const Params& p, const KernelChoice& kc, cudaStream_t stream) {
  using Tr = DkvTraits<HD>;
  const int nblocks = (p.s_kv + Tr::kBlockN - 1) / Tr::kBlockN;
  if (nblocks == 0 || p.h_kv == 0 || p.b == 0) return cudaSuccess;
  const dim3 grid(nblocks, p.h_kv, p.b);
  switch (kc.dkdv) {
    case DkvKernel::kSm90:
      if constexpr (tiles::has_sm90(HD)) {
        if (kc.dkdv_block_m == 64) return launch_bwd_dkdv_sm90<T, HD, 64>(p, kc, grid, stream);
        if constexpr (HD == 64) {  // 128 query rows per step (tiles::dkdv_sm90_block_m)
          if (kc.dkdv_block_m == 128) return launch_bwd_dkdv_sm90<T, HD, 128>(p, kc, grid, stream);
        }
      } else if constexpr (tiles::dkdv_sm90_wide(HD)) {
        return launch_bwd_dkdv_sm90_wide<T, HD>(p, kc, grid, stream);
      }
      return cudaErrorInvalidValue;
    case DkvKernel::kSm80Extra: {
      cudaError_t e = prepare_smem(bwd_dkdv_kernel<T, HD, true>, Tr::kSmem);
      if (e != cudaSuccess) return e;
      bwd_dkdv_kernel<T, HD, true><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
      return cudaGetLastError();
    }
    case DkvKernel::kSm80: {
      cudaError_t e = prepare_smem(bwd_dkdv_kernel<T, HD, false>, Tr::kSmem);
      if (e != cudaSuccess) return e;
      bwd_dkdv_kernel<T, HD, false><<<grid, Tr::kThreads, Tr::kSmem, stream>>>(p);
      return cudaGetLastError();
    }
  }
  return cudaErrorInvalidValue;
}

#define SINKATTN_CUDA_INSTANTIATE(HD)                                                                      \
  template cudaError_t launch_fwd<__half, HD>(const Params&, const KernelChoice&, cudaStream_t);           \
  template cudaError_t launch_fwd<__nv_bfloat16, HD>(const Params&, const KernelChoice&, cudaStream_t);    \
  template cudaError_t launch_bwd_dq<__half, HD>(const Params&, const KernelChoice&, cudaStream_t);        \
  template cudaError_t launch_bwd_dq<__nv_bfloat16, HD>(const Params&, const KernelChoice&, cudaStream_t); \
  template cudaError_t launch_bwd_dkdv<__half, HD>(const Params&, const KernelChoice&, cudaStream_t);      \
  template cudaError_t launch_bwd_dkdv<__nv_bfloat16, HD>(const Params&, const KernelChoice&, cudaStream_t);

}  // namespace sinkattn::cuda
