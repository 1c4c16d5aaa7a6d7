// See dispatch.hpp. Host-only C++: compiled into the CUDA backend and, alone, into tests/test_cuda_dispatch.cpp.
#include "cuda/dispatch.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <vector>

#include "cuda/decode/decode_rules.hpp"
#include "cuda/dq_order.hpp"
#include "cuda/scheduler.hpp"
#include "cuda/tiles.hpp"

namespace sinkattn::cuda {

namespace {

std::string tile_str(int a, int b) { return std::to_string(a) + " x " + std::to_string(b); }

// Consumer warpgroups of the warp-specialised Hopper forward (measured faster than the software-pipelined Hopper
// forward it replaced, with 3 consumers at head dim 64 and 2 at 128: bench/log/2026-12-01-warp-specialised-forward.md): its bias and
// dropout variants take their own counts.
int ws_consumers(int tile, bool bias, bool dropout) {
  if (dropout) return tiles::sm90_ws_dropout_consumers(tile);
  return bias ? tiles::sm90_ws_bias_consumers(tile) : tiles::sm90_ws_default_consumers(tile);
}

bool flag(const char* v) { return std::strcmp(v, "0") != 0; }

// The one list of the environment switches (dispatch.hpp, Switches). A switch stays only where a user or an A/B run
// needs it: a fallback off a kernel family or a feature (for a suspected fault, a driver or tool that refuses it,
// or the A/B that measures it), or a check that reaches code the GPU suite's shapes do not.
constexpr SwitchDef kSwitches[] = {
    {{"SINKATTN_CUDA_NO_SM90", "1",
      "No Hopper (wgmma) kernel: every fp16 / bf16 call runs on the sm_80 kernels, as on other GPUs.",
      "A result or a fault suspected of the Hopper kernels; A/B of the Hopper kernels against the sm_80 ones."},
     [](Switches& s, const char* v) { s.no_sm90 = flag(v); }},
    {{"SINKATTN_CUDA_NO_TMA", "1",
      "The Hopper kernels load every tile (Q, K, V, dO, bias) by cp.async and add the fused dq by fp32 atomics, "
      "instead of TMA copies and TMA reduce-adds.",
      "A fault suspected of the tensor memory accelerator or a driver that refuses a tensor map; the cp.async "
      "path's A/B and coverage (it is also what partial tiles and small calls take)."},
     [](Switches& s, const char* v) { s.no_tma = flag(v); }},
    {{"SINKATTN_CUDA_DET_SM80", "1",
      "deterministic = 1 on Hopper runs the sm_80 dq kernel + dK dV kernel (no float atomics) instead of the "
      "Hopper dK dV kernel with its dq fused in a fixed order.",
      "A check of the Hopper deterministic backward against the other deterministic path; its A/B (GPU check: "
      "bench_det_sm80.log)."},
     [](Switches& s, const char* v) { s.det_sm80 = flag(v); }},
    {{"SINKATTN_CUDA_NO_DECODE", "1",
      "No decode kernel: forward calls of up to 16 query rows per sequence run on the prefill kernels.",
      "A result or a fault suspected of the decode kernels (split-KV, paged KV); A/B of decode against prefill."},
     [](Switches& s, const char* v) { s.no_decode = flag(v); }},
    {{"SINKATTN_CUDA_NO_PDL", "1",
      "The backward's Hopper dK dV kernel and the dq convert after it, and the decode kernel and its split combine, "
      "are launched one after the other, without programmatic dependent launch.",
      "A profiler or driver that mishandles programmatic dependent launch, a fault suspected of its waits; its A/B."},
     [](Switches& s, const char* v) { s.no_pdl = flag(v); }},
    {{"SINKATTN_CUDA_NO_WINDOW_VARIANT", "1",
      "Short sliding windows do not run the warp-specialised forward's short-window variant: the sm_80 forward "
      "below 512 keys per 128 query rows, the default Hopper variant above.",
      "A fault suspected of the short-window variant; its A/B against those kernels."},
     [](Switches& s, const char* v) { s.no_window_variant = flag(v); }},
    {{"SINKATTN_CUDA_NO_DECODE_SHORT", "1",
      "Decode calls whose rows read at most 3 key tiles (a short sliding window, many sequences) run the default "
      "16-row decode kernel (Q in shared memory beside a 4-stage ring: 3 blocks an SM) instead of its short-range "
      "configuration (Q in registers, 3 stages: 4 blocks an SM).",
      "A fault suspected of the short-range configuration; its A/B."},
     [](Switches& s, const char* v) { s.no_decode_short = flag(v); }},
    {{"SINKATTN_CUDA_NO_DECODE_CLUSTER", "1",
      "Decode calls of 2 key splits, or of up to 8 on at most one block an SM, write each split's partial to the "
      "workspace and merge them in the split combine kernel, instead of launching the splits as one thread-block "
      "cluster that merges them in its shared memory (Hopper).",
      "A fault suspected of the cluster combine; its A/B against the combine kernel."},
     [](Switches& s, const char* v) { s.no_decode_cluster = flag(v); }},
    {{"SINKATTN_CUDA_FWD_SECTION", "N",
      "The warp-specialised Hopper forward walks its tiles in L2 sections of N (head, sequence) pairs; 0: no "
      "sections (the plain longest-first order). Unset: the pairs whose K / V fit 5/8 of the L2.",
      "Coverage of the sectioned tile order on small shapes (the GPU check runs the edge cases with N = 1); A/B "
      "of the L2 rule (N = 0)."},
     [](Switches& s, const char* v) { s.fwd_section = std::max(0, std::atoi(v)); }},
};

}  // namespace

const SwitchDef* switch_table(int* count) {
  *count = static_cast<int>(std::size(kSwitches));
  return kSwitches;
}

const sinkattn_switch_t* switch_docs(int* count) {
  static const std::vector<sinkattn_switch_t> docs = [] {
    std::vector<sinkattn_switch_t> d;
    for (const SwitchDef& s : kSwitches) d.push_back(s.doc);
    return d;
  }();
  *count = static_cast<int>(docs.size());
  return docs.data();
}

Switches switches_from(const char* (*env)(const char* name)) {
  Switches s;
  for (const SwitchDef& d : kSwitches) {
    const char* v = env(d.doc.name);
    if (v != nullptr && v[0] != '\0') d.set(s, v);
  }
  return s;
}

Switches switches_from_env() {
  static const Switches s = switches_from([](const char* name) -> const char* { return std::getenv(name); });
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
    return bias && !sw.no_tma && c.bias_dtype != SINKATTN_F32 && c.bias.j == 1 &&
           c.bias.i > 0 && c.bias.i % 8 == 0 && c.bias.h % 8 == 0 && c.bias.b % 8 == 0 && c.s_kv >= 64 &&
           c.s_q >= rows_min;
  };

  // Why the Hopper kernels cannot run this call ("" when they can): no90 for the backward and the warp-specialised
  // forward's bias / dropout variants (tiles 64 and 128); no90_fwd for the forward, whose plain variant also runs
  // tiles 192 and 256 (tiles::has_sm90_fwd_ws).
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
  // Longer paged chunks (prefill with a page table; validation refused bias / dropout): the Hopper forward's kPaged
  // variant, whose TMA boxes are chunks of gcd(page_size, block_n) rows of one page (hopper/paged_kv_sm90.cuh), where
  // the page size is a multiple of 8 (a box's 128-byte swizzle starts on a whole 8-row atom); else the sm_80
  // forward through the page table.
  const auto sm80_paged = [&](const std::string& why) {
    k.fwd = FwdKernel::kSm80Paged;
    k.fwd_block_m = tiles::fwd_block_m(k.tile);
    k.fwd_block_n = tiles::fwd_block_n(k.tile);
    k.fwd_why = "paged KV: " + no_decode + "; " + why;
  };
  if (no_decode.empty()) {
    k.fwd = FwdKernel::kDecode;
    k.decode_pdl = !sw.no_pdl && dev.cc_major >= 9;  // the split combine after the decode kernel
    k.decode_short = !sw.no_decode_short && decode_short_keys(c, dev.sms);
    k.decode_cluster = !sw.no_decode_cluster && dev.cc_major >= 9;
  } else if (c.paged.on && !no90_fwd.empty()) {
    sm80_paged(no90_fwd);
  } else if (c.paged.on && c.paged.page_size % 8 != 0) {
    sm80_paged("page_size " + std::to_string(c.paged.page_size) +
               " is not a multiple of 8 (the Hopper forward's paged TMA boxes are whole 8-row swizzle atoms)");
  }
  if (k.fwd == FwdKernel::kDecode || k.fwd == FwdKernel::kSm80Paged) {
    // decided
  } else if (no90_fwd.empty() && c.window_left >= 0 && c.window_right >= 0) {
    // A short sliding window: the warp-specialised forward's short-window variant where it exists; else the sm_80
    // forward below kSm90FwdMinWindowKeys keys per kSm90FwdWindowRows query rows (tiles.hpp says why).
    const int64_t keys = tiles::kSm90FwdWindowRows + c.window_left + c.window_right;
    const bool window_variant = tiles::sm90_ws_window(k.tile) && !extra && !c.paged.on && !sw.no_window_variant &&
                                keys >= tiles::sm90_ws_window_min_keys(k.tile);
    if (window_variant && keys < tiles::kSm90FwdWindowKeys)
      k.fwd_q_stages = tiles::kSm90WsWindowQStages;
    else if (!window_variant && keys < tiles::kSm90FwdMinWindowKeys)
      k.fwd_why = "the window spans " + std::to_string(keys) + " keys per " +
                  std::to_string(tiles::kSm90FwdWindowRows) + " query rows (fewer than " +
                  std::to_string(tiles::kSm90FwdMinWindowKeys) +
                  ": the sm_80 forward is faster there; the short-window Hopper variant: tile 64 from " +
                  std::to_string(tiles::sm90_ws_window_min_keys(64)) +
                  " keys, tile 128, without bias, dropout or paged KV)";
  }
  if (k.fwd == FwdKernel::kDecode || k.fwd == FwdKernel::kSm80Paged) {
    // decided above
  } else if (no90_fwd.empty() && k.fwd_why.empty()) {
    k.fwd = FwdKernel::kSm90Ws;
    k.fwd_consumers = k.fwd_q_stages > 1 ? tiles::kSm90WsWindowConsumers : ws_consumers(k.tile, k.bias, dropout);
    k.fwd_block_m = 64 * k.fwd_consumers;
    k.fwd_block_n = tiles::sm90_ws_block_n(k.tile);
    k.fwd_sms = dev.sms;
    k.fwd_section = fwd_section_pairs(c, (c.s_q + k.fwd_block_m - 1) / k.fwd_block_m, dev, sw);
    // TMA boxes are 64 columns x one block of rows: both must fit the tensor (launch.cuh, make_rows_map); paged KV:
    // K / V boxes of one page chunk, which fit every page.
    k.fwd_paged = c.paged.on;
    if (k.fwd_paged) {
      k.fwd_page_rows = static_cast<int>(std::gcd<int64_t>(c.paged.page_size, k.fwd_block_n));
      k.fwd_kv_pages = c.paged.num_pages;
    }
    k.fwd_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.fwd_block_m &&
                (k.fwd_paged || rows_kv >= k.fwd_block_n);
    k.fwd_bias_tma = k.bias && bias_tma_ok(k.fwd_block_m);
  } else if (c.paged.on) {
    sm80_paged(k.fwd_why.empty() ? no90_fwd : k.fwd_why);
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
    k.dbias_group_sum = k.bias && !c.bias_per_head && c.group > 1 && k.tile == 64;
    k.dkdv_block_n = tiles::dkdv_sm90_block_n(k.tile);
    const bool plain = !k.bias && !k.dropout;
    k.dkdv_block_m = tiles::dkdv_sm90_block_m(k.tile, plain);
    k.dkdv_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.dkdv_block_m;
    k.dkdv_bias_tma = k.bias && bias_tma_ok(k.dkdv_block_m);
    // The dq accumulator's rows are d fp32 (16-byte multiples for the tensor map); its boxes are block_m rows.
    k.dq_tma = !sw.no_tma && c.d >= 32 && c.d % 4 == 0 && rows_q >= k.dkdv_block_m;
    k.pdl = !sw.no_pdl && c.b > 0 && c.h_q > 0 && c.s_q > 0;  // (KernelChoice::pdl says why)
    k.dq_first_store = k.dq == DqPath::kFusedOrdered &&
                       tiles::dkdv_sm90_dq_writer(k.tile, k.bias, k.dropout, true, k.dkdv_block_m);
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
      case FwdKernel::kSm90Ws:
        s = "hopper fwd (wgmma, warp-specialised: producer warp + " + std::to_string(fwd_consumers) +
            " consumer warpgroups, persistent" + (fwd_q_stages > 1 ? ", short-window variant: Q in 2 buffers" : "") +
            (bias ? (fwd_bias_tma ? ", bias tiles by TMA" : ", bias") : "") +
            (dropout ? ", dropout, keep bits drawn by the consumers and the producer warpgroup" : "") + ")";
        break;
      case FwdKernel::kSm80: s = "sm80 fwd (mma.sync)"; break;
      case FwdKernel::kSm80Extra: s = "sm80 fwd (mma.sync, bias / dropout variant)"; break;
      case FwdKernel::kSm80Paged: s = "sm80 fwd (mma.sync, paged KV)"; break;
      case FwdKernel::kDecode:
        return std::string("decode (query heads of a KV group packed per tile, split-KV + combine") +
               (decode_cluster ? " in the cluster's shared memory (2 splits, or up to " +
                                     std::to_string(kDecodeClusterMaxSplits) +
                                     " on at most one block an SM), else the combine kernel"
                               : std::string()) +
               (decode_pdl ? " by programmatic dependent launch" : "") +
               (decode_short ? "; short key range: Q in registers, 3 stages" : "") +
               "; splits from decode/decode.cu's plan or num_splits)";
    }
    s += ", tile " + tile_str(fwd_block_m, fwd_block_n);
    if (fwd == FwdKernel::kSm90Ws && fwd_paged)
      s += ", paged KV " +
           (fwd_tma ? "by TMA, boxes of " + std::to_string(fwd_page_rows) + " rows of a page"
                    : std::string("by cp.async, a page lookup per row")) +
           " (two loading warps: Q and K, V)";
    else if (fwd == FwdKernel::kSm90Ws)
      s += fwd_tma ? ", TMA" : ", cp.async";
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
           (dq_tma ? ", deterministic; TMA reduce-add of fp32 tiles, atomics for partial query blocks"
                   : ", deterministic") +
           (dq_first_store ? "; a query block's first key block stores its tile, no zeroing pass)" : ")");
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

const sinkattn_kernel_family_t* kernel_families(int* count) {
  using std::to_string;
  // The texts, kept for the process's lifetime (the C ABI hands out pointers into them).
  struct Family {
    std::string name, sources, runs_when, rule;
  };
  static const std::vector<Family> families = {
      {"fp32", "src/cuda/fp32/", "fp32 inputs (forward and backward)",
       "Plain SIMT fp32 kernels: the forward one thread per query row; the backward dq per query row and dK dV per "
       "key, no float atomics (deterministic either way). Slow: for checking, not for speed."},
      {"decode", "src/cuda/decode/",
       "forward of up to " + to_string(kDecodeMaxQueries) +
           " query rows per sequence, fp16 / bf16, head dims up to 128, no bias / dropout",
       "Split-KV decode kernels on every GPU: the query heads of a KV group packed into one tile, the keys split "
       "over blocks (decode/decode.cu's plan, or num_splits), the splits merged with the sink counted once: on "
       "compute capability 9.0 and above 2 splits, or up to " + to_string(kDecodeClusterMaxSplits) + " on at most "
       "one block an SM, as one thread-block cluster that merges them in its shared memory "
       "(SINKATTN_CUDA_NO_DECODE_CLUSTER=1: the combine kernel), others by a combine kernel launched with "
       "programmatic dependent launch (SINKATTN_CUDA_NO_PDL=1: without); contiguous or paged KV (page_table). For "
       "forward calls with at most " +
           to_string(kDecodeMaxQueries) +
           " query rows per sequence (dense s_q or varlen max_seqlen_q), fp16 / bf16, head dims up to 128, no "
           "bias or dropout, b and h_kv up to 65535. SINKATTN_CUDA_NO_DECODE=1 sends them to the prefill "
           "kernels. A short key range (one 16-row block of packed rows at head dims up to 64 whose rows read at "
           "most 3 tiles of 64 keys: a sliding window of up to about 176 keys) over more blocks than 3 an SM hold "
           "runs the 16-row kernel with Q in registers and 3 stages, 4 blocks an SM "
           "(SINKATTN_CUDA_NO_DECODE_SHORT=1: Q in shared memory, 4 stages, 3 blocks an SM)."},
      {"hopper fwd", "src/cuda/hopper/fwd_sm90_ws.cuh",
       "forward on compute capability 9.0, tiles 64 to 256 (bias / dropout, short sliding windows: 64, 128)",
       "The warp-specialised forward on warpgroup MMA (wgmma): a producer warp loads Q and K / V into a two-stage "
       "ring (by TMA where a block lies in the sequence, by cp.async past its end, where a tensor map does not fit "
       "the call and with SINKATTN_CUDA_NO_TMA=1; paged KV: TMA boxes of gcd(page_size, keys per step) rows of one "
       "page, a page lookup per chunk), consumer warpgroups of 64 query "
       "rows (3 at tile 64, 2 otherwise) take turns at the tensor cores; 128 keys per step up to tile 128, 64 at "
       "tiles 192 and 256. Persistent blocks (one per SM) walk the tiles longest first, in L2 sections of the "
       "(head, sequence) pairs whose K / V fit 5/8 of the L2 (SINKATTN_CUDA_FWD_SECTION=N: N pairs). Bias "
       "variant (tiles 64 and 128, 2 consumers): a 16-bit bias of unit key stride staged by TMA, any other bias "
       "loaded per thread. Dropout variant (tiles 64 and 128, 2 consumers): the keep bits drawn by the consumers "
       "and the producer warpgroup. Needs the library's sm_90a code (SINKATTN_CUDA_NO_SM90=1 turns every Hopper "
       "kernel off); not with both bias and dropout, not for paged KV with a page size that is not a multiple of "
       "8. A window bounded on both sides (a sliding window) that spans fewer than " +
           to_string(tiles::kSm90FwdWindowKeys) + " keys per " + to_string(tiles::kSm90FwdWindowRows) +
           " query rows runs the short-window variant (2 consumers, Q in 2 buffers, so that the next tile's Q loads "
           "while the consumers finish the current one) at tile 64 from " +
           to_string(tiles::sm90_ws_window_min_keys(64)) +
           " keys and at tile 128, without bias, dropout or paged KV; any other that spans fewer than " +
           to_string(tiles::kSm90FwdMinWindowKeys) + " keys per " + to_string(tiles::kSm90FwdWindowRows) +
           " query rows runs the sm_80 forward, which is faster there (SINKATTN_CUDA_NO_WINDOW_VARIANT=1: this rule "
           "for every short window)."},
      {"sm80 fwd", "src/cuda/fwd_kernel.cuh",
       "every other fp16 / bf16 forward: other GPUs, tiles 32 and 96, bias with dropout, other short "
       "windows, paged KV, pages not a multiple of 8",
       "FlashAttention-2-style forward on mma.sync m16n8k16 with cp.async tile loads, 4 warps, 128 query rows "
       "per block (64 at tiles 192 and 256). Variants: lean (no bias, no dropout; 64 keys per step at tile 128), "
       "bias / dropout, and paged KV (K / V rows read through the page table)."},
      {"hopper dK dV", "src/cuda/hopper/bwd_dkdv_sm90.cuh",
       "backward on compute capability 9.0: tiles 64 and 128 (bias or dropout, not both)",
       "dK and dV on wgmma with the dq fused, 128 keys per block; 128 query rows per step at tile 64 without bias "
       "or dropout, 64 otherwise; Q / dO tiles by TMA (cp.async for partial blocks). The fused dq goes to an fp32 "
       "accumulator by TMA reduce-adds of full query blocks' tiles (fp32 atomics for partial blocks and with "
       "SINKATTN_CUDA_NO_TMA=1); deterministic = 1: the same updates in ascending key-block order under "
       "per-(query head, query block) semaphores (per query block with a bias). Bias variant: writes dS to the "
       "d_bias workspace (summed over a KV group's heads at tile 64 when the bias is broadcast over the heads), "
       "bias tiles staged by TMA where the forward's are. Dropout variant: keep bits from a producer warpgroup at "
       "tile 64, from the math warpgroups at 128. It and the dq convert after it are launched with programmatic "
       "dependent launch (calls with query rows; SINKATTN_CUDA_NO_PDL=1: without)."},
      {"hopper dK dV wide", "src/cuda/hopper/bwd_dkdv_sm90_wide.cuh",
       "backward on compute capability 9.0: tile 256, no bias / dropout",
       "The head dim split between the two warpgroups: 64 keys per block, 64 query rows per step, the products "
       "from shared memory; the dq fused as in hopper dK dV (full query blocks by TMA reduce-adds, partial ones "
       "by float4 atomics), deterministic = 1 by the same per-step turns. Tile 192's backward stays on the sm_80 "
       "kernels."},
      {"sm80 dK dV + dq", "src/cuda/bwd_kernel.cuh",
       "every other fp16 / bf16 backward: other GPUs, tiles 32, 96 and 192, bias with dropout",
       "FlashAttention-2-style dK dV kernel on mma.sync (one warp per 16 keys), lean or bias / dropout variant. "
       "dq: fused into it by fp32 atomics (deterministic = 0), or the separate dq kernel, no float atomics "
       "(deterministic = 1; with a bias off Hopper too: it writes dS for d_bias). SINKATTN_CUDA_DET_SM80=1 "
       "sends deterministic = 1 here on Hopper as well."},
      {"bwd small", "src/cuda/bwd_small.cu", "every fp16 / bf16 backward, around the kernels above",
       "Memory-bound kernels: the preprocess (D = rowsum(dO * O), the d_sinks partials, the dq accumulator "
       "zeroed), the d_sinks reduction (fixed order), the dq convert (fp32 accumulator to dq) and the d_bias "
       "reduction over broadcast dimensions."},
  };
  static const std::vector<sinkattn_kernel_family_t> rows = [] {
    std::vector<sinkattn_kernel_family_t> r;
    for (const Family& f : families)
      r.push_back({f.name.c_str(), f.sources.c_str(), f.runs_when.c_str(), f.rule.c_str()});
    return r;
  }();
  *count = static_cast<int>(rows.size());
  return rows.data();
}

}  // namespace sinkattn::cuda
