// CUDA backend: the decode path's plan (which calls, how many splits, workspace), and its launches. See decode.hpp.
#include "cuda/decode/decode.hpp"

#include <algorithm>
#include <cmath>

#include "cuda/decode/decode_combine.cuh"
#include "cuda/decode/decode_kernel.cuh"
#include "cuda/kernels.hpp"

namespace sinkattn::cuda {

// decode_rules.hpp's block-count rule (host-only, so a literal there) is the blocks an SM holds of this kernel.
static_assert(DecodeTraits<64, kDecodeMT[0], kDecodeWN[0]>::kMinBlocks == kDecodeDefaultBlocksPerSm,
              "kDecodeDefaultBlocksPerSm: the default 16-row configuration's blocks an SM at head-dim tile 64");

namespace {

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

template <int HD>
int smem_of(int config) {
  switch (config) {
    case 0: return DecodeTraits<HD, kDecodeMT[0], kDecodeWN[0]>::kSmem;
    case 1: return DecodeTraits<HD, kDecodeMT[1], kDecodeWN[1]>::kSmem;
    case 2: return DecodeTraits<HD, kDecodeMT[2], kDecodeWN[2]>::kSmem;
    case kDecodeShortConfig: {
      constexpr int c = kDecodeShortConfig;
      return DecodeTraits<HD, kDecodeMT[c], kDecodeWN[c], kDecodeQR[c]>::kSmem;
    }
    default: return DecodeTraits<HD, kDecodeMT[3], kDecodeWN[3]>::kSmem;
  }
}

}  // namespace

int decode_smem_bytes(int hd, int config) { return hd <= 64 ? smem_of<64>(config) : smem_of<128>(config); }

DecodePlan plan_decode(const Call& c, const DeviceProps& dev, bool short_keys, bool cluster) {
  DecodePlan d;
  auto no = [&](std::string why) {
    d.why_not = std::move(why);
    return d;
  };
  if (std::string why = decode_unsupported(c); !why.empty()) return no(std::move(why));  // decode_rules.hpp
  const int64_t dmax = std::max(c.d, c.d_v);
  d.hd = dmax <= 64 ? 64 : 128;
  const int64_t packed = std::max<int64_t>(c.s_q, 1) * c.group;  // (query row, head of the group) rows
  d.config = packed <= 16 ? 0 : packed <= 32 ? 1 : packed <= 64 ? 2 : 3;
  if (short_keys && d.hd == 64 && d.config == 0) d.config = kDecodeShortConfig;
  d.block_m = kDecodeBlockM[d.config];
  d.m_blocks = static_cast<int>((packed + d.block_m - 1) / d.block_m);
  d.rows_total_q = c.plan.varlen ? c.total_q : c.b * c.s_q;

  // Keys one block of packed rows can see at most: s_kv (dense extent, varlen max_seqlen_kv, paged capacity), or
  // the window's span when both window bounds are set.
  int64_t kv_bound = c.s_kv;
  if (const int64_t w = decode_window_keys(c, d.block_m); w >= 0) kv_bound = std::min<int64_t>(kv_bound, w + 16);
  const int64_t tiles = (kv_bound + 63) / 64 + 1;  // + 1: the first tile starts at a 16-key boundary below k_lo
  const int sms = dev.sms, smem_sm = dev.smem_per_sm;
  if (c.num_splits > 0) {
    d.num_splits = std::min(c.num_splits, kCombineMaxSplits);
  } else {  // decode_rules.hpp
    const int64_t per_sm = std::clamp<int64_t>(smem_sm / (decode_smem_bytes(d.hd, d.config) + 1024), 1, 4);
    d.num_splits = static_cast<int>(
        decode_heuristic_splits(tiles, c.b * c.h_kv * d.m_blocks, sms, per_sm, cluster));
  }
  if (static_cast<int64_t>(d.m_blocks) * d.num_splits > (int64_t{1} << 31) - 1) return no("grid too large");
  // The splits as one cluster (decode_rules.hpp, decode_cluster_splits).
  d.cluster = cluster && decode_cluster_splits(d.num_splits, c.b * c.h_kv * d.m_blocks, sms);
  if (d.num_splits > 1 && !d.cluster) {
    const size_t rows = static_cast<size_t>(d.num_splits) * c.h_q * d.rows_total_q;
    d.lse_part = align256(rows * c.d_v * sizeof(float));
    d.bytes = align256(d.lse_part + rows * sizeof(float));
  }
  d.use = true;
  return d;
}

void bind_decode(const DecodePlan& plan, void* workspace, Params* p) {
  p->num_splits = plan.num_splits;
  p->splits_div = FastDivmod(static_cast<uint32_t>(plan.num_splits));
  p->decode_cluster = plan.cluster ? 1 : 0;
  p->rows_total_q = plan.rows_total_q;
  char* ws = static_cast<char*>(workspace);
  const bool partials = plan.num_splits > 1 && !plan.cluster;
  p->ws_o_part = partials ? reinterpret_cast<float*>(ws) : nullptr;
  p->ws_lse_part = partials ? reinterpret_cast<float*>(ws + plan.lse_part) : nullptr;
}

template <typename T>
cudaError_t launch_decode(const Params& p, const DecodePlan& plan, bool pdl, cudaStream_t stream) {
  if (p.b == 0 || p.h_kv == 0 || plan.m_blocks == 0) return cudaSuccess;
  cudaError_t e = plan.hd == 64 ? launch_decode_tile<T, 64>(p, plan.config, plan.m_blocks, stream)
                                : launch_decode_tile<T, 128>(p, plan.config, plan.m_blocks, stream);
  if (e != cudaSuccess || plan.num_splits <= 1 || plan.cluster) return e;
  const int64_t pairs = static_cast<int64_t>(std::max(p.s_q, 1)) * p.h_q;
  const dim3 grid(static_cast<unsigned>((pairs + 3) / 4), static_cast<unsigned>(p.b));
  return launch_kernel(decode_combine_kernel<T>, grid, dim3(128), 0, stream, pdl, p);
}

template cudaError_t launch_decode<__half>(const Params&, const DecodePlan&, bool, cudaStream_t);
template cudaError_t launch_decode<__nv_bfloat16>(const Params&, const DecodePlan&, bool, cudaStream_t);

}  // namespace sinkattn::cuda
