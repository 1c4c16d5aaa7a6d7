// CUDA backend, Hopper (sm_90a) building blocks: warpgroup MMA (wgmma) shared-memory descriptors and fences, register
// A operands packed from accumulators, and cp.async tile loads into the layout the descriptors describe. PTX ISA,
// "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": section "Matrix Descriptor" and the canonical layouts.
// One layout for every 16-bit tile of the Hopper kernels: the 128-byte-swizzled row panels further down (the tiles
// TMA loads, and those loaded by cp.async into the same layout). The core-matrix layout (no swizzle) that the dK dV
// kernel's K, V and dS^T had until 2026-12-01 measured within 1% of it (bench/log/2026-12-01-dq-tma-reduce-add.md,
// 25b4f5e).
#pragma once

#include <cstdint>

#include "cuda/common.cuh"

namespace sinkattn::cuda::sm90 {

// Matrix descriptor (base offset 0; the swizzle mode is or-ed in by make_desc_sw128): bits 0-13 start address >> 4,
// 16-29 LBO >> 4, 32-45 SBO >> 4.
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = smem_addr(smem);
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32);
}


__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the async proxy that
// wgmma reads through; followed by a barrier before the wgmma.
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Orders this thread's generic-proxy global-memory accesses against its async-proxy ones (TMA reduce-adds): after
// an acquire, before the reduce-adds it guards; after their completion (bulk_wait), before the release.
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// Tensor-core accumulators must not be touched by ordinary instructions while a wgmma on them is in flight; the
// compiler is told so by passing them through an empty asm after the wait.
template <int NT>
__device__ __forceinline__ void fence_acc(float (&a)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(a[i][e])::"memory");
}

// fp32 accumulator fragments of a warp's 16 x (8 NT) rows (the mma.sync C layout) rounded to T as the register A
// operand of NT / 2 m64nNk16 wgmmas (rs): k-step kc = columns 16 kc .. 16 kc + 15 = n-tiles 2 kc and 2 kc + 1 (the
// mma.sync A layout). P of the forward's O += P V, P^T of the dK dV kernel's dV += P^T dO.
template <typename T, int NT, int KC>
__device__ __forceinline__ void pack_a_frags(const float (&c)[NT][4], uint32_t (&a)[KC][4]) {
  static_assert(NT == 2 * KC, "two n-tiles per k-step");
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
    a[kc][0] = ElemTraits<T>::pack(c[2 * kc][0], c[2 * kc][1]);
    a[kc][1] = ElemTraits<T>::pack(c[2 * kc][2], c[2 * kc][3]);
    a[kc][2] = ElemTraits<T>::pack(c[2 * kc + 1][0], c[2 * kc + 1][1]);
    a[kc][3] = ElemTraits<T>::pack(c[2 * kc + 1][2], c[2 * kc + 1][3]);
  }
}

// ---- 128-byte-swizzled row panels (Q, K, V of the forward; Q, dO, K, V, dS^T of the dK dV kernel): a ROWS x COLS
// tile of 16-bit elements is cut into COLS / 64 panels of ROWS rows x 128 bytes, one after another; in every row
// the 16-byte chunk j is stored at chunk position j ^ (row % 8):
//   elem(r, c) at byte (c / 64) * ROWS * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16 + (c % 8) * 2
// which is what one TMA box of 64 columns x ROWS rows with CU_TENSOR_MAP_SWIZZLE_128B writes (each global row
// read as 128-byte pieces; boxes of 8 columns into the no-swizzle layout, tried first, read 16-byte pieces and
// doubled the L2 traffic). The tile base must be 1024-byte
// aligned (the swizzle repeats every 8 rows = 1024 bytes). PTX ISA, "Shared Memory Matrix Layout", 128B swizzling:
//   K-major (rows = M or N, cols = K): SBO = 1024 B (next 8 rows), LBO unused; the 16-wide k-step kk starts
//     kk % 4 * 32 bytes into its panel's rows (the hardware applies the XOR to the address);
//   MN-major (rows = K, cols = M or N): SBO = 1024 B (next 8 rows along K), LBO = ROWS * 128 B (next 64 columns
//     along M / N); the 16-deep k-step kk starts at row 16 kk.
__device__ __forceinline__ uint64_t make_desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return make_desc(smem, lbo_bytes, sbo_bytes) | (1ull << 62);
}
// Element offset of (r, c) in the swizzled row panels of a ROWS-row tile of 16-bit elements (the formula above).
template <int ROWS>
__device__ __forceinline__ int sw_offset(int r, int c) {
  return (c >> 6) * (ROWS * 64) + r * 64 + ((((c & 63) >> 3) ^ (r & 7)) << 3) + (c & 7);
}
template <int ROWS, typename T>
__device__ __forceinline__ uint64_t desc_kmajor_sw(const T* tile, int kk) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(tile);
  return make_desc_sw128(b + (kk / 4) * ROWS * 128 + (kk % 4) * 32, 16, 1024);
}
template <int ROWS, typename T>
__device__ __forceinline__ uint64_t desc_mnmajor_sw(const T* tile, int kk) {
  const unsigned char* b = reinterpret_cast<const unsigned char*>(tile);
  return make_desc_sw128(b + kk * 16 * 128, ROWS * 128, 1024);
}
// cp.async copy of a ROWS x COLS tile (row stride `ld` elements) into the swizzled row-panel layout: consecutive
// threads read consecutive 16-byte chunks of a row; rows >= rows_valid and columns >= cols_valid are zero-filled
// unread.
template <int ROWS, int COLS, int NTHREADS, typename T>
__device__ __forceinline__ void load_tile_sw(T* smem, const T* gmem, int64_t ld, int rows_valid, int cols_valid,
                                             int tid) {
  constexpr int kChunks = COLS / 8, kTotal = ROWS * kChunks;
  static_assert(kTotal % NTHREADS == 0 && COLS % 64 == 0, "whole passes, whole panels");
  unsigned char* base = reinterpret_cast<unsigned char*>(smem);
#pragma unroll
  for (int k = 0; k < kTotal / NTHREADS; ++k) {
    const int idx = tid + k * NTHREADS;
    const int r = idx / kChunks, cc = idx % kChunks;
    const bool valid = r < rows_valid && cc * 8 < cols_valid;
    cp_async16(base + (cc / 8) * ROWS * 128 + r * 128 + (((cc % 8) ^ (r % 8)) * 16),
               valid ? gmem + r * ld + cc * 8 : gmem, valid);
  }
}

// The same copy as a rolled loop over the chunks (few registers): for a lone loading warp whose register budget
// was given away (the warp-specialised forward's producer), on the rare partial blocks.
template <int ROWS, int COLS, typename T>
__device__ __forceinline__ void load_tile_sw_rolled(T* smem, const T* gmem, int64_t ld, int rows_valid,
                                                    int cols_valid, int tid, int nthreads) {
  constexpr int kChunks = COLS / 8, kTotal = ROWS * kChunks;
  static_assert(COLS % 64 == 0, "whole panels");
  unsigned char* base = reinterpret_cast<unsigned char*>(smem);
#pragma unroll 1
  for (int idx = tid; idx < kTotal; idx += nthreads) {
    const int r = idx / kChunks, cc = idx % kChunks;
    const bool valid = r < rows_valid && cc * 8 < cols_valid;
    cp_async16(base + (cc / 8) * ROWS * 128 + r * 128 + (((cc % 8) ^ (r % 8)) * 16),
               valid ? gmem + r * ld + cc * 8 : gmem, valid);
  }
}

// One plain arrival (no transaction count) on an mbarrier.
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}

// Named barriers (bar.sync / bar.arrive with a thread count; 0 is __syncthreads) and the warpgroup register
// reallocation of warp-specialised kernels (setmaxnreg: the count is a multiple of 8 in 24 .. 256).
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// ---- mbarrier and TMA (cp.async.bulk.tensor) ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// One arrival that also expects `bytes` of asynchronous (TMA) writes before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// Expects `bytes` more of asynchronous (TMA) writes in the current phase, without an arrival (the issuing thread
// arrives later, once its own stores that the phase also covers are done).
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits until the phase with parity `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}
// TMA load of one box of a 4-d tensor map (coordinates innermost first) into shared memory; completion is
// counted in bytes on `bar`. `tmap` is the address of a __grid_constant__ kernel parameter.
__device__ __forceinline__ void tma_load_4d(void* dst, const void* tmap, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
#endif
}

// TMA reduce-add of one box of a 3-d fp32 tensor map (coordinates innermost first) from shared memory into global
// memory: element-wise atomic adds (as red.global.add.f32), clipped to the tensor's extent. Completion through the
// bulk group of the issuing thread: bulk_commit() closes a group, bulk_wait_read<N>() waits until at most N groups
// still read their shared memory (the source may then be overwritten), bulk_wait<N>() until at most N are pending.
__device__ __forceinline__ void tma_reduce_add_3d(const void* tmap, const void* src, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}
// The same box stored (overwriting) instead of added.
__device__ __forceinline__ void tma_store_3d(const void* tmap, const void* src, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Byte offset of fp32 element (r, c) in the shared-memory image of the 128-byte-swizzled TMA boxes of 32 columns x
// ROWS rows that cover a ROWS x n tile (box c / 32 after box c / 32 - 1): 16-byte chunk (c % 32) / 4 of row r sits at
// chunk ((c % 32) / 4) ^ (r % 8). A warp storing float2 pairs of an mma.sync C fragment (rows g, columns 2 t) hits
// every bank twice: two wavefronts for 256 bytes, the minimum.
template <int ROWS>
__device__ __forceinline__ int sw128_f32_offset(int r, int c) {
  return (c >> 5) * (ROWS * 128) + r * 128 + ((((c & 31) >> 2) ^ (r & 7)) << 4) + ((c & 3) << 2);
}

// TMA load of a ROWS x HD tile of 16-bit elements at (col0, row, head, batch) of a 4-d tensor map (box 64 columns x
// ROWS rows, 128-byte swizzle) into the swizzled row-panel layout: one box per panel, completing on `bar`, which is
// armed for the tile's bytes (one arrival). col0: the tile's first column (0 for q / k / v rows; the first key of a
// bias tile).
template <int ROWS, int HD, typename T>
__device__ __forceinline__ void tma_load_tile_sw(T* dst, const void* tmap, int row, int head, int batch, uint64_t* bar,
                                                 int col0 = 0) {
  mbar_arrive_expect_tx(bar, ROWS * HD * sizeof(T));
#pragma unroll
  for (int c = 0; c < HD / 64; ++c) tma_load_4d(dst + c * ROWS * 64, tmap, col0 + c * 64, row, head, batch, bar);
}


}  // namespace sinkattn::cuda::sm90
