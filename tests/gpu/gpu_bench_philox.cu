// The RNG floor of dropout (issue 12's dropout target): the time of the Philox4x32-10 blocks alone that SPEC.md
// section 2's keep decision needs for one forward of a causal layer (one block per 4 consecutive keys of one query
// row, src/core/philox.hpp: the function every backend calls), with nothing else in the kernel. A fused dropout
// forward computes at least these blocks (the backward regenerates them), so this time, against the plain
// forward's, bounds how close to the plain kernel a dropout kernel can get under SPEC.md's 32-bit keep words.
// Usage: sinkattn_gpu_bench_philox [reps]   (GPT-OSS full: b 2, h_q 64, s 4096; MHA: b 2, h 32, s 4096)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/philox.hpp"
#include "cuda_check.hpp"

namespace {

// One thread per query row (n, h, i); it draws the blocks of keys 0 .. i (causal), counts the kept words and adds
// the count to *kept (so that nothing is optimised away).
__global__ void philox_rows(int bh, int s, uint64_t seed, uint64_t offset, uint32_t threshold,
                            unsigned long long* kept) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= static_cast<int64_t>(bh) * s) return;
  const int i = static_cast<int>(row % s);
  const uint64_t base = static_cast<uint64_t>(row) * static_cast<uint64_t>(s);  // ((n h_q + h) s_q + i) s_kv
  unsigned int count = 0;
  for (int j = 0; j <= i; j += 4) {
    const sinkattn::Philox4 r = sinkattn::dropout_block(seed, offset, base + j);
    count += (r.w[0] >= threshold) + (r.w[1] >= threshold) + (r.w[2] >= threshold) + (r.w[3] >= threshold);
  }
  atomicAdd(kept, static_cast<unsigned long long>(count));
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  unsigned long long* kept;
  CK(cudaMalloc(&kept, sizeof *kept));
  std::printf("gpu_bench_philox on %s: Philox4x32-10 blocks of one causal forward's keep words, %d reps (median)\n",
              prop.name, reps);
  struct Shape {
    const char* name;
    int b, h, s;
  };
  for (const Shape& sh : {Shape{"gpt-oss-full", 2, 64, 4096}, Shape{"mha-d128", 2, 32, 4096}}) {
    const int bh = sh.b * sh.h;
    const int64_t rows = static_cast<int64_t>(bh) * sh.s;
    double blocks = 0;
    for (int i = 0; i < sh.s; ++i) blocks += i / 4 + 1;
    blocks *= bh;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < reps + 3; ++r) {
      CK(cudaMemset(kept, 0, sizeof *kept));
      CK(cudaEventRecord(e0));
      philox_rows<<<static_cast<unsigned>((rows + 127) / 128), 128>>>(bh, sh.s, 1234, 0,
                                                                      sinkattn::dropout_threshold(0.1), kept);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 3) ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    unsigned long long k = 0;
    CK(cudaMemcpy(&k, kept, sizeof k, cudaMemcpyDeviceToHost));
    std::printf("%-14s %.0fM blocks in %.3f ms (%.1f G blocks/s); kept %.4f of the words (p = 0.1)\n", sh.name,
                blocks * 1e-6, ts[ts.size() / 2], blocks / ts[ts.size() / 2] * 1e-6, k / (4.0 * blocks));
  }
  cudaFree(kept);
  return 0;
}
