// CUDA backend: the decode path (decode_kernel.cuh, decode_combine.cuh) seen from the dispatcher: which forward
// calls it runs, with how many key splits, and the workspace of the split partials (SPEC.md section 4: the size
// query and the run compute the same plan from shapes alone). No host synchronisation and no allocation: the
// launches are CUDA-graph capturable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/call.hpp"
#include "cuda/decode/decode_rules.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

struct DecodePlan {
  bool use = false;     // the decode kernels run this forward
  std::string why_not;  // why not, when !use
  int hd = 0;           // head-dim tile: 64 or 128
  int config = 0;       // index into the compiled tile configurations (decode_kernel.cuh)
  int block_m = 0;      // packed (query row, head of the group) rows per CTA
  int m_blocks = 0;     // CTAs along the packed rows of one (sequence, KV head)
  int num_splits = 1;   // key splits (1: no split, no combine, no workspace)
  bool cluster = false; // the splits as one thread-block cluster, combined in its shared memory (no workspace)
  int64_t rows_total_q = 0;
  size_t lse_part = 0, bytes = 0;  // workspace: o partials at 0, lse partials at lse_part, `bytes` in all
};

// Decode kernels: forward, fp16 / bf16, no bias or dropout, at most kDecodeMaxQueries query rows per sequence
// (dense s_q or varlen max_seqlen_q), head dims up to 128; contiguous or paged KV. num_splits: c.num_splits when
// given (at most kCombineMaxSplits), else decode_rules.hpp's decode_heuristic_splits from the batch, the KV heads,
// the packed rows, the keys a row can see and the device's SM count and shared memory per SM (`dev`, the dispatch's
// DeviceProps).
// short_keys: the short-range configuration (KernelChoice::decode_short, decode_rules.hpp's decode_short_keys).
// cluster: 2 to kDecodeClusterMaxSplits splits run as one cluster and need no workspace (KernelChoice::decode_cluster;
// decode_cluster_splits on dev.sms).
DecodePlan plan_decode(const Call& c, const DeviceProps& dev, bool short_keys, bool cluster);

// Points p at the plan's split buffers in `workspace` (num_splits, ws_o_part, ws_lse_part, rows_total_q,
// decode_cluster).
void bind_decode(const DecodePlan& plan, void* workspace, Params* p);

// The decode kernel, and the combine when the plan splits outside a cluster, on `stream`; pdl: the combine with
// programmatic dependent launch (KernelChoice::decode_pdl).
template <typename T>
cudaError_t launch_decode(const Params& p, const DecodePlan& plan, bool pdl, cudaStream_t stream);

// One head-dim tile's decode kernel (decode_hd64.cu, decode_hd128.cu) and its shared-memory bytes.
template <typename T, int HD>
cudaError_t launch_decode_tile(const Params& p, int config, int m_blocks, cudaStream_t stream);
int decode_smem_bytes(int hd, int config);

}  // namespace sinkattn::cuda
