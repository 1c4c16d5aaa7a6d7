// See dispatch.hpp. Host-only C++: compiled into the CUDA backend and, alone, into tests/test_cuda_dispatch.cpp.
#include "cuda/dispatch.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/decode/decode_rules.hpp"
#include "cuda/dq_order.hpp"
#include "cuda/scheduler.hpp"
#include "cuda/tiles.hpp"

namespace sinkattn::cuda {

namespace {

std::string tile_str(int a, int b) { return std::to_string(a) + " x " + std::to_string(b); }

// The warp-specialised Hopper forward (measured faster than fwd_sm90 on the H200 at both Hopper tiles, with 3
// consumer warpgroups at head dim 64 and 2 at 128: bench/log/2026-12-01-warp-specialised-forward.md);
// SINKATTN_CUDA_FWD_WS=0 turns it off.
bool ws_on(int tile, const Switches& sw) { return sw.fwd_ws != 0 && tiles::has_sm90_fwd_ws(tile); }
// bias / dropout: the kernel's bias variant (staged by TMA or not), its dropout variant (2 consumers only).
int ws_consumers(int tile, const Switches& sw, bool bias, bool dropout) {
  if (dropout) return tiles::sm90_ws_dropout_consumers(tile);
  if (sw.fwd_ws == 2) return 2;
  if (sw.fwd_ws == 3) return tile == 64 ? 3 : 2;  // 3 x 64 rows at head dim 128 exceed the registers
  return bias ? tiles::sm90_ws_bias_consumers(tile) : tiles::sm90_ws_default_consumers(tile);
}

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

Switches switches_from_env() {
  static const Switches s = [] {
    Switches x;
    x.no_sm90 = env_on("SINKATTN_CUDA_NO_SM90");
    x.no_tma = env_on("SINKATTN_CUDA_NO_TMA");
    x.det_sm80 = env_on("SINKATTN_CUDA_DET_SM80");
    if (const char* v = std::getenv("SINKATTN_CUDA_FWD_WS"); v != nullptr && v[0] != '\0') x.fwd_ws = std::atoi(v);
    x.fwd_ws_short = env_on("SINKATTN_CUDA_FWD_WS_SHORT");
    if (const char* v = std::getenv("SINKATTN_CUDA_FWD_WS_PERSISTENT"); v != nullptr && v[0] != '\0')
      x.fwd_ws_persistent = std::atoi(v) != 0;
    x.no_decode = env_on("SINKATTN_CUDA_NO_DECODE");
    x.dq_atomics = env_on("SINKATTN_CUDA_DQ_ATOMICS");
    x.no_dbias_group_sum = env_on("SINKATTN_CUDA_NO_DBIAS_GROUP_SUM");
    x.no_bias_tma = env_on("SINKATTN_CUDA_NO_BIAS_TMA");
    x.no_pdl = env_on("SINKATTN_CUDA_NO_PDL");
    if (const char* v = std::getenv("SINKATTN_CUDA_FWD_SECTION"); v != nullptr && v[0] != '\0')
      x.fwd_section = std::max(0, std::atoi(v));
    if (const char* v = std::getenv("SINKATTN_CUDA_DKDV_BM"); v != nullptr && v[0] != '\0') x.dkdv_block_m = std::atoi(v);
    return x;
  }();
  return s;
}

int fwd_section_pairs(const Call& c, int64_t mblocks, const DeviceProps& dev, const Switches& sw) {
  const int64_t pairs = c.h_q * c.b;
  int64_t section = sw.fwd_section;
  if (section < 0)
    section = l2_section_pairs(pairs, c.s_kv * (c.d + c.d_v) * 2, dev.l2_bytes / 8 * 5, c.group,
                               mblocks > 0 ? (2 * dev.sms + mblocks - 1) / mblocks : 1);
  return section > 0 && section < pairs ? static_cast<int>(section) : 0;
}

std::string hopper_unavailable(const DeviceProps& dev, const Switches& sw) {
  if (!dev.sm90a_code) return "the library carries no sm_90a code (CMAKE_CUDA_ARCHITECTURES without 90a)";
  if (dev.cc_major != 9 || dev.cc_minor != 0)
    return "compute capability " + std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor) +
           " (the Hopper kernels need 9.0)";
  if (sw.no_sm90) return "SINKATTN_CUDA_NO_SM90 is set";
  return {};
}

KernelChoice choose_kernels(const Call& c, const DeviceProps& dev, const Switches& sw) {
  KernelChoice k;
  if (c.dtype == SINKATTN_F32) {
    k.fp32 = true;
    return k;
  }
  k.tile = tiles::head_dim_tile(c.d, c.d_v);
  const bool bias = c.plan.bias == Use::kRequired, dropout = c.plan.dropout, extra = bias || dropout;
  const int64_t rows_q = c.plan.varlen ? c.total_q : c.s_q, rows_kv = c.plan.varlen ? c.total_kv : c.s_kv;
  // A bias TMA can stage (launch.cuh, make_bias_map): 16-bit, unit key stride, rows of whole 16-byte multiples, at
  // least one 64-key box wide and a block of rows_min query rows tall (bias calls are dense, SPEC 1).
  const auto bias_tma_ok = [&](int64_t rows_min) {
    return bias && !sw.no_tma && !sw.no_bias_tma && c.bias_dtype != SINKATTN_F32 && c.bias.j == 1 &&
           c.bias.i > 0 && c.bias.i % 8 == 0 && c.bias.h % 8 == 0 && c.bias.b % 8 == 0 && c.s_kv >= 64 &&
           c.s_q >= rows_min;
  };

  // Why the Hopper kernels cannot run this call ("" when they can): no90 for the backward, the software-pipelined
  // forward and the warp-specialised forward's bias / dropout variants (tiles 64 and 128); no90_fwd for the forward,
  // whose warp-specialised plain variant also runs tiles 192 and 256 (tiles::has_sm90_fwd_ws).
  const std::string no_hopper = hopper_unavailable(dev, sw);
  std::string no90 = no_hopper;
  if (no90.empty() && !tiles::has_sm90(k.tile))
    no90 = "no Hopper kernel for head-dim tile " + std::to_string(k.tile) + " (tiles 64 and 128)";
  // Bias: the warp-specialised forward and the dK dV kernel have a bias variant
  // (kBias: the dK dV kernel also writes dS for d_bias, so no dq kernel is needed); not with dropout.
  if (no90.empty() && bias && dropout) no90 = "the Hopper kernels have no variant with both bias and dropout";
  k.bias = bias && no90.empty();
  // The backward's Hopper dK dV kernel: where no90 allows it, and at tile 256 the head-dim-split kernel
  // (hopper/bwd_dkdv_sm90_wide.cuh), which has no bias or dropout variant.
  std::string no90_bwd = no90;
  if (no_hopper.empty() && tiles::dkdv_sm90_wide(k.tile))
    no90_bwd = extra ? "the Hopper dK dV kernel of head-dim tile " + std::to_string(k.tile) +
                           " (head dim split between its warpgroups) has no bias / dropout variant"
                     : "";
  std::string no90_fwd = no90;
  if (no_hopper.empty() && !tiles::has_sm90(k.tile) && tiles::has_sm90_fwd_ws(k.tile)) {
    if (extra)
      no90_fwd = std::string("no Hopper ") + (bias ? "bias" : "dropout") + " forward for head-dim tile " +
                 std::to_string(k.tile) + " (the bias / dropout variants: tiles 64 and 128)";
    else if (!ws_on(k.tile, sw))
      no90_fwd = "head-dim tile " + std::to_string(k.tile) +
                 ": only the warp-specialised Hopper forward runs it (SINKATTN_CUDA_FWD_WS=0 is set)";
    else
      no90_fwd.clear();
  }
  // Dropout: the warp-specialised forward and the dK dV kernel have a dropout variant (kDropout). Forward: the
  // consumers draw the keep bits of the first tiles::sm90_ws_dropout_consumer_slices 8-key slices of each key block
  // while S runs, warps 1 .. 3 of the producer warpgroup the rest (fwd_keep_producer); consumers alone were slower
  // than the sm_80 forward (3.32 against 3.07 ms at GPT-OSS full: bench/log/2026-12-01-dropout-and-torch-op.md), the
  // producer alone too (4.8 ms: bench/log/2026-12-02-dropout-forward-hopper.md). dK dV: a keep-bit producer
  // warpgroup at tile 64 (keep_producer), the math warpgroups at tile 128 (tiles::dkdv_sm90_keep_producer).
  k.dropout = dropout;

  // ---- forward ----
  // Decode kernels (decode/decode_rules.hpp): short query chunks, contiguous or paged KV.
  const std::string no_decode = sw.no_decode ? "SINKATTN_CUDA_NO_DECODE is set" : decode_unsupported(c);
  if (no_decode.empty()) {
    k.fwd = FwdKernel::kDecode;
  } else if (c.paged.on) {  // longer paged chunks: the sm_80 forward through the page table (validation refused
                            // bias / dropout); the Hopper forwards' TMA maps describe contiguous rows, not pages
    k.fwd = FwdKernel::kSm80Paged;
    k.fwd_block_m = tiles::fwd_block_m(k.tile);
    k.fwd_block_n = tiles::fwd_block_n(k.tile);
    k.fwd_why = "paged KV: " + no_decode + "; the Hopper forwards read contiguous rows by TMA";
  }
  if (k.fwd == FwdKernel::kDecode || k.fwd == FwdKernel::kSm80Paged) {
    // decided
  } else if (no90_fwd.empty() && dropout && !ws_on(k.tile, sw)) {
    k.fwd_why = "dropout: only the warp-specialised Hopper forward has a dropout variant (SINKATTN_CUDA_FWD_WS=0 is set)";
  } else if (no90_fwd.empty() && bias && !ws_on(k.tile, sw)) {
    k.fwd_why = "bias: only the warp-specialised Hopper forward has a bias variant (SINKATTN_CUDA_FWD_WS=0 is set)";
  } else if (no90_fwd.empty() && c.window_left >= 0 && c.window_right >= 0 &&
             !(sw.fwd_ws_short && ws_on(k.tile, sw))) {
    const int64_t keys = tiles::fwd_sm90_block_m(k.tile) + c.window_left + c.window_right;
    if (keys < tiles::kSm90FwdMinWindowKeys)
      k.fwd_why = "the window spans " + std::to_string(keys) + " keys per " +
                  std::to_string(tiles::fwd_sm90_block_m(k.tile)) + " query rows (fewer than " +
                  std::to_string(tiles::kSm90FwdMinWindowKeys) + ": the sm_80 forward is faster there)";
  }
  if (k.fwd == FwdKernel::kDecode || k.fwd == FwdKernel::kSm80Paged) {
    // decided above
  } else if (no90_fwd.empty() && k.fwd_why.empty()) {
    if (ws_on(k.tile, sw)) {
      k.fwd = FwdKernel::kSm90Ws;
      k.fwd_consumers = ws_consumers(k.tile, sw, k.bias, dropout);
      k.fwd_block_m = 64 * k.fwd_consumers;
      k.fwd_block_n = tiles::sm90_ws_block_n(k.tile);
      k.fwd_persistent = sw.fwd_ws_persistent;
      k.fwd_sms = dev.sms;
      k.fwd_section = fwd_section_pairs(c, (c.s_q + k.fwd_block_m - 1) / k.fwd_block_m, dev, sw);
    } else {
      k.fwd = FwdKernel::kSm90;
      k.fwd_block_m = tiles::fwd_sm90_block_m(k.tile);
      k.fwd_block_n = tiles::fwd_sm90_block_n(k.tile);
    }
    // TMA boxes are 64 columns x one block of rows: both must fit the tensor (launch.cuh, make_rows_map).
    k.fwd_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.fwd_block_m && rows_kv >= k.fwd_block_n;
    k.fwd_bias_tma = k.bias && k.fwd == FwdKernel::kSm90Ws && bias_tma_ok(k.fwd_block_m);
  } else {
    if (k.fwd_why.empty()) k.fwd_why = no90_fwd;
    k.fwd = extra ? FwdKernel::kSm80Extra : FwdKernel::kSm80;
    k.fwd_block_m = tiles::fwd_block_m(k.tile);
    k.fwd_block_n = extra ? tiles::fwd_block_n(k.tile) : tiles::fwd_block_n_lean(k.tile);
  }

  // ---- backward ----
  if (bias && !no90.empty())
    k.dq = DqPath::kDqKernel;  // off Hopper the dq kernel writes dS for d_bias
  else if (c.deterministic)
    k.dq = no90_bwd.empty() && !sw.det_sm80 ? DqPath::kFusedOrdered : DqPath::kDqKernel;
  else
    k.dq = DqPath::kFusedAtomic;
  if (no90_bwd.empty() && k.dq != DqPath::kDqKernel) {
    k.dkdv = DkvKernel::kSm90;
    k.dbias_group_sum = !sw.no_dbias_group_sum && k.bias && !c.bias_per_head && c.group > 1 && k.tile == 64;
    k.dkdv_block_n = tiles::dkdv_sm90_block_n(k.tile);
    const bool plain = !k.bias && !k.dropout;
    k.dkdv_block_m = tiles::dkdv_sm90_block_m(k.tile, plain);
    if (sw.dkdv_block_m == 64) k.dkdv_block_m = 64;  // (A / B runs; 128 exists only where the rule picks it)
    k.dkdv_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.dkdv_block_m;
    k.dkdv_bias_tma = k.bias && bias_tma_ok(k.dkdv_block_m);
    // The dq accumulator's rows are d fp32 (16-byte multiples for the tensor map); its boxes are block_m rows.
    k.dq_tma = !sw.no_tma && !sw.dq_atomics && c.d >= 32 && c.d % 4 == 0 && rows_q >= k.dkdv_block_m;
    k.pdl = !sw.no_pdl && c.b > 0 && c.h_q > 0 && c.s_q > 0;  // (KernelChoice::pdl says why)
  } else {
    k.bwd_why = no90_bwd.empty() ? "SINKATTN_CUDA_DET_SM80 is set" : no90_bwd;
    k.dkdv = extra ? DkvKernel::kSm80Extra : DkvKernel::kSm80;
    k.dkdv_block_n = tiles::dkdv_block_n(k.tile);
    k.dkdv_block_m = tiles::dkdv_block_m(k.tile);
  }
  if (k.dq == DqPath::kDqKernel) {
    k.dq_block_m = tiles::dq_block_m(k.tile);
    k.dq_block_n = tiles::dq_block_n(k.tile);
  }
  return k;
}

std::string KernelChoice::summary(Pass pass) const {
  if (fp32)
    return pass == Pass::kForward ? "fp32 SIMT kernels (one thread per query row)"
                                  : "fp32 SIMT kernels (dq per query row, dK dV per key; no float atomics)";
  std::string s;
  if (pass == Pass::kForward) {
    switch (fwd) {
      case FwdKernel::kSm90: s = "hopper fwd (wgmma)"; break;
      case FwdKernel::kSm90Ws:
        s = "hopper fwd (wgmma, warp-specialised: producer warp + " + std::to_string(fwd_consumers) +
            " consumer warpgroups" + (fwd_persistent ? ", persistent" : "") +
            (bias ? (fwd_bias_tma ? ", bias tiles by TMA" : ", bias") : "") +
            (dropout ? ", dropout, keep bits drawn by the consumers and the producer warpgroup" : "") + ")";
        break;
      case FwdKernel::kSm80: s = "sm80 fwd (mma.sync)"; break;
      case FwdKernel::kSm80Extra: s = "sm80 fwd (mma.sync, bias / dropout variant)"; break;
      case FwdKernel::kSm80Paged: s = "sm80 fwd (mma.sync, paged KV)"; break;
      case FwdKernel::kDecode:
        return "decode (query heads of a KV group packed per tile, split-KV + combine; splits from decode/decode.cu's "
               "plan or num_splits)";
    }
    s += ", tile " + tile_str(fwd_block_m, fwd_block_n);
    if (fwd == FwdKernel::kSm90 || fwd == FwdKernel::kSm90Ws) s += fwd_tma ? ", TMA" : ", cp.async";
    if (fwd_section > 0) s += ", L2 sections of " + std::to_string(fwd_section) + " heads";
    if (!fwd_why.empty()) s += ": " + fwd_why;
    return s;
  }
  if (dq == DqPath::kDqKernel) s = "sm80 dq kernel, tile " + tile_str(dq_block_m, dq_block_n) + " + ";
  switch (dkdv) {
    case DkvKernel::kSm90:
      s += bias ? std::string("hopper dK dV (wgmma, bias") + (dkdv_bias_tma ? " tiles by TMA" : "") +
                      (dbias_group_sum ? "; dS summed over each KV group's heads to the d_bias workspace)"
                                       : "; dS to the d_bias workspace)")
                : dropout ? (tiles::dkdv_sm90_keep_producer(tile)
                                 ? "hopper dK dV (wgmma, dropout, keep-bit producer warpgroup)"
                                 : "hopper dK dV (wgmma, dropout, keep bits drawn by the math warpgroups)")
                  : tiles::dkdv_sm90_wide(tile) ? "hopper dK dV (wgmma, head dim split between the warpgroups)"
                                                : "hopper dK dV (wgmma)";
      break;
    case DkvKernel::kSm80: s += "sm80 dK dV (mma.sync)"; break;
    case DkvKernel::kSm80Extra: s += "sm80 dK dV (mma.sync, bias / dropout variant)"; break;
  }
  s += ", tile " + tile_str(dkdv_block_n, dkdv_block_m);
  if (dkdv == DkvKernel::kSm90) s += dkdv_tma ? ", TMA" : ", cp.async";
  switch (dq) {
    case DqPath::kDqKernel: s += ", no float atomics"; break;
    case DqPath::kFusedAtomic:
      s += dq_tma ? ", dq fused (TMA reduce-add of fp32 tiles; atomics for partial query blocks)"
                  : ", dq fused (fp32 atomics)";
      break;
    case DqPath::kFusedOrdered: {
      // The unit of a turn (dq_order.hpp: the kernel's variant reads the same rule).
      const std::string sems = dq_turn_per_step(bias) ? "per-(query head, query block) semaphores"
                                                      : "per-query-block semaphores";
      s += ", dq fused in a fixed order (" + sems +
           (dq_tma ? ", deterministic; TMA reduce-add of fp32 tiles, atomics for partial query blocks)"
                   : ", deterministic)");
      break;
    }
  }
  if (pdl) s += ", programmatic dependent launch";
  if (!bwd_why.empty()) s += ": " + bwd_why;
  return s;
}

std::string head_dim_tiles_text(const char* sep) {
  std::string s;
  for (int t : tiles::kHeadDimTiles) s += (s.empty() ? "" : sep) + std::to_string(t);
  return s;
}

std::string dispatch_rules() {
  return "kernel choice (src/cuda/dispatch.cpp): fp32 -> SIMT fp32 kernels; fp16 / bf16 -> the smallest head-dim tile "
         ">= max(d, d_v) of " + head_dim_tiles_text(" ") + "; the Hopper (wgmma, TMA) kernels on compute capability 9.0 when the "
         "library carries sm_90a code, for tiles 64 and 128 (the warp-specialised forward without bias or dropout also "
         "for 192 and 256, 64 keys per step there; bias: the warp-specialised forward and the dK dV kernel, "
         "which writes dS for d_bias, not with dropout; dropout: the warp-specialised forward, its keep bits drawn by "
         "the consumers and the producer warpgroup, and the dK dV kernel, its keep bits drawn by a producer warpgroup "
         "at tile 64 and by the math warpgroups at 128; the dK dV kernel takes 128 query rows per step at tile 64 "
         "without bias or dropout, 64 otherwise; at tile 256 a dK dV kernel that splits the head dim between its "
         "warpgroups, 64 keys x 64 query rows per step, without bias or dropout; forward: not for windows spanning fewer than " +
         std::to_string(tiles::kSm90FwdMinWindowKeys) +
         " keys per 128 query rows); backward dq: fused into the dK dV kernel (deterministic = 0: fp32 atomics, on "
         "the Hopper kernel TMA reduce-adds of full query blocks' fp32 tiles), fused in a fixed key-block order "
         "under per-(query head, query block) semaphores (per-query-block ones with a bias) on the Hopper kernel "
         "(deterministic = 1, the same TMA reduce-adds), or "
         "the separate sm_80 dq kernel (deterministic = 1 off Hopper, and with a bias off Hopper); the sm_80 "
         "kernels run "
         "everything else (a bias / dropout variant when either is present). Forward: the decode kernels for up to "
         "16 query rows per sequence "
         "(fp16 / bf16, head dims up to 128, no bias / dropout; contiguous or paged KV: the query heads of a KV "
         "group packed into one tile, split-KV with a combine, the sink counted once), the sm_80 forward through "
         "the page table for longer paged chunks, and on Hopper the warp-specialised forward (producer warp, 3 "
         "consumer warpgroups at tile 64 and 2 at 128 taking turns, persistent blocks). "
         "The Hopper dK dV kernel and the dq convert after it are launched with programmatic dependent launch "
         "(calls with query rows). "
         "Tile order: longest first; the warp-specialised forward's in L2 sections of the heads whose K / V fit 5/8 "
         "of the L2. "
         "Switches: SINKATTN_CUDA_NO_SM90=1, SINKATTN_CUDA_NO_TMA=1, SINKATTN_CUDA_DET_SM80=1, SINKATTN_CUDA_FWD_WS="
         "0|2|3, SINKATTN_CUDA_FWD_WS_SHORT=1, SINKATTN_CUDA_FWD_WS_PERSISTENT=0, SINKATTN_CUDA_NO_DECODE=1, "
         "SINKATTN_CUDA_DQ_ATOMICS=1, SINKATTN_CUDA_NO_DBIAS_GROUP_SUM=1, SINKATTN_CUDA_NO_BIAS_TMA=1, "
         "SINKATTN_CUDA_NO_PDL=1, SINKATTN_CUDA_FWD_SECTION=N, SINKATTN_CUDA_DKDV_BM=64";
}

}  // namespace sinkattn::cuda
