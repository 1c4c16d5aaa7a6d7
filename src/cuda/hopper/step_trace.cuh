// CUDA backend, Hopper: step timelines of the dK dV kernel (bwd_dkdv_sm90.cuh) for profiling builds. Built with
// -DSINKATTN_STEP_TRACE, lane 0 of each math warp of the first kTraceBlocks blocks (linear block index) stamps
// clock64() at the marked points (TracePoint) of its first kTraceSteps steps, and thread 0 records the block's SM,
// tile and start / end (%globaltimer, ns); after each launch the launcher (launch.cuh) waits for the kernel and
// writes the stamps to $SINKATTN_STEP_TRACE_DIR/dkdv_hd<HD>_bm<BM>_det<0|1>.bin (the last launch of that kernel
// wins); tools/prof/step_trace.py reads them. Without the macro these functions are empty and every
// kernel's SASS is what it is without them (tools/sass_compare.py: identical; a point inside dq_dk or its turn
// callback reordered a few instructions of eight kernels, so the step's second half is one phase). A profiling
// build's timings are not the library's: the stamps are extra instructions and stores on the measured path.
#pragma once

#include <cuda_runtime.h>

#ifdef SINKATTN_STEP_TRACE
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#endif

namespace sinkattn::cuda::sm90 {

// The points of a step, in program order (the header of bwd_dkdv_sm90.cuh has the step's order).
enum TracePoint : int {
  kTrStep = 0,    // top of the step loop
  kTrLoaded,      // the step's loads have landed (cp.async wait, the TMA mbarrier)
  kTrBarrierA,    // past the step's first block barrier
  kTrS,           // S^T waited for (S^T, dP^T issued after the barrier)
  kTrDp,          // P^T computed, dV issued, dP^T waited for
  kTrDs,          // dS^T computed, stored to sdS, packed as dK's A operand
  kTrDqBuffer,    // this step's sdQ buffer free (thread 0's wait for the reduce-adds' reads)
  kTrBarrierB,    // past the barrier before dQ
  kTrDk,          // dQ and dK issued (kDet: the turn passed), dQ staged (or added by atomics), dK waited for
  kTrEnd,         // the next step's LSE2 / D stored
  kTracePoints
};

#ifdef SINKATTN_STEP_TRACE
constexpr int kTraceBlocks = 264, kTraceWarps = 8, kTraceSteps = 64;
// [block][warp][step][point] clock64 stamps; [block][4]: SM id, tile (key block | KV head << 16 | sequence << 32),
// start ns, end ns. One copy per translation unit (static), read by the launcher of the same unit.
static __device__ unsigned long long g_step_trace[kTraceBlocks * kTraceWarps * kTraceSteps * kTracePoints];
static __device__ unsigned long long g_block_trace[kTraceBlocks * 4];

__device__ __forceinline__ int trace_linear_block() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
__device__ __forceinline__ unsigned long long trace_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void trace_mark(int it, TracePoint point) {
  const int b = trace_linear_block();
  if ((threadIdx.x & 31) == 0 && threadIdx.x < 32 * kTraceWarps && b < kTraceBlocks && it < kTraceSteps)
    g_step_trace[((b * kTraceWarps + (threadIdx.x >> 5)) * kTraceSteps + it) * kTracePoints + point] = clock64();
}
// Thread 0: start (end = false: the block's tile) or end of the block.
__device__ __forceinline__ void trace_block(bool end, int key_block, int hk, int n) {
  const int b = trace_linear_block();
  if (threadIdx.x != 0 || b >= kTraceBlocks) return;
  unsigned long long* r = g_block_trace + 4 * b;
  if (end) {
    r[3] = trace_ns();
    return;
  }
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  r[0] = smid;
  r[1] = static_cast<unsigned long long>(key_block) | (static_cast<unsigned long long>(hk) << 16) |
         (static_cast<unsigned long long>(n) << 32);
  r[2] = trace_ns();
}

// Host: before a launch, zero the stamps; after it, wait for the stream and write them out (the file's layout:
// tools/prof/step_trace.py). Errors are reported on stderr and otherwise ignored (a profiling build).
inline void step_trace_clear(cudaStream_t stream) {
  void* a = nullptr;
  void* b = nullptr;
  if (cudaGetSymbolAddress(&a, g_step_trace) == cudaSuccess) cudaMemsetAsync(a, 0, sizeof(g_step_trace), stream);
  if (cudaGetSymbolAddress(&b, g_block_trace) == cudaSuccess) cudaMemsetAsync(b, 0, sizeof(g_block_trace), stream);
}
// The launch's status and grid go to stderr with the counts of recorded blocks and stamps.
inline void step_trace_write(cudaStream_t stream, int hd, int bm, bool det, int group, cudaError_t launched,
                             dim3 grid) {
  const char* dir = std::getenv("SINKATTN_STEP_TRACE_DIR");
  if (dir == nullptr) return;
  const std::string name = "dkdv_hd" + std::to_string(hd) + "_bm" + std::to_string(bm) + "_det" + (det ? "1" : "0");
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (launched != cudaSuccess || synced != cudaSuccess) {
    std::fprintf(stderr, "step trace: %s: launch %s, sync %s\n", name.c_str(), cudaGetErrorString(launched),
                 cudaGetErrorString(synced));
    return;
  }
  std::vector<unsigned long long> steps(sizeof(g_step_trace) / 8), blocks(sizeof(g_block_trace) / 8);
  if (cudaMemcpyFromSymbol(steps.data(), g_step_trace, sizeof(g_step_trace)) != cudaSuccess ||
      cudaMemcpyFromSymbol(blocks.data(), g_block_trace, sizeof(g_block_trace)) != cudaSuccess) {
    std::fprintf(stderr, "step trace: %s: copy failed\n", name.c_str());
    return;
  }
  long recorded = 0, stamped = 0;
  for (int b = 0; b < kTraceBlocks; ++b) recorded += blocks[4 * b + 2] != 0;
  for (unsigned long long v : steps) stamped += v != 0;
  std::fprintf(stderr, "step trace: %s: grid %u x %u x %u, %ld blocks recorded, %ld stamps\n", name.c_str(), grid.x,
               grid.y, grid.z, recorded, stamped);
  const std::string path = std::string(dir) + "/" + name + ".bin";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return;
  const int64_t hdr[9] = {0x53544550, hd, bm, det ? 1 : 0, group, kTraceBlocks, kTraceWarps, kTraceSteps,
                          kTracePoints};
  std::fwrite(hdr, sizeof(hdr), 1, f);
  std::fwrite(blocks.data(), 8, blocks.size(), f);
  std::fwrite(steps.data(), 8, steps.size(), f);
  std::fclose(f);
}
#else
__device__ __forceinline__ void trace_mark(int, TracePoint) {}
__device__ __forceinline__ void trace_block(bool, int, int, int) {}
inline void step_trace_clear(cudaStream_t) {}
inline void step_trace_write(cudaStream_t, int, int, bool, int, cudaError_t, dim3) {}
#endif

}  // namespace sinkattn::cuda::sm90
