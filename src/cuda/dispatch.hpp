// CUDA backend: the one place that decides which kernels run a call (SPEC.md section 4: a backend declares what it
// runs and why). choose_kernels is a pure function of the resolved call, the device's properties and the
// environment switches; every launch (cuda_backend.cu, launch.cuh), the workspace layout, the report line of
// sinkattn_query_backend (and so the CLI's "forward ran on:" line) and `sinkattn info` read its KernelChoice.
// Host-only C++ (no CUDA headers): tests/test_cuda_dispatch.cpp checks the decisions on machines without a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "core/call.hpp"

namespace sinkattn::cuda {

// What the decision needs to know about the device (current_device_props() in cuda_backend.cu reads it).
struct DeviceProps {
  int cc_major = 0, cc_minor = 0;  // compute capability
  bool sm90a_code = false;         // the library carries sm_90a code (CMAKE_CUDA_ARCHITECTURES lists 90a)
  int64_t l2_bytes = 0;            // L2 cache size (0: unknown; the tile order then has no L2 sections)
  int sms = 0;                     // multiprocessors (the sections' two-wave minimum; 0: none)
};

// Environment switches that turn kernels off, for A/B runs (switches_from_env() reads them once per process):
//   SINKATTN_CUDA_NO_SM90=1   no Hopper (wgmma) kernel: everything on the sm_80 kernels
//   SINKATTN_CUDA_NO_TMA=1    the Hopper kernels load every tile through cp.async
//   SINKATTN_CUDA_DET_SM80=1  deterministic backward on the sm_80 kernels (dq kernel + dK dV kernel) instead of the
//                             Hopper dK dV kernel with its fused dq in a fixed order
//   SINKATTN_CUDA_FWD_WS=0|2|3 the warp-specialised Hopper forward (hopper/fwd_sm90_ws.cuh): 0 off (fwd_sm90.cuh
//                             instead), 2 / 3 consumer warpgroups (3: head-dim tile 64 only); unset: on, with
//                             tiles::sm90_ws_default_consumers
//   SINKATTN_CUDA_FWD_WS_SHORT=1 the warp-specialised forward takes the short windows the sm_80 forward gets
//   SINKATTN_CUDA_FWD_WS_PERSISTENT=0 the warp-specialised forward with one block per tile (default: one per SM)
//   SINKATTN_CUDA_NO_DECODE=1 no decode kernel: short query chunks on the prefill kernels
//   SINKATTN_CUDA_DQ_ATOMICS=1 the Hopper dK dV kernel adds its fused dq with per-thread fp32 atomics instead of
//                             TMA reduce-adds of shared-memory tiles
//   SINKATTN_CUDA_NO_DBIAS_GROUP_SUM=1 the Hopper dK dV kernel writes every query head's dS to the d_bias workspace
//   SINKATTN_CUDA_NO_BIAS_TMA=1 the Hopper kernels' bias variants load each thread's bias fragment from global memory
//                             instead of staging the bias tiles in shared memory by TMA
//   SINKATTN_CUDA_NO_PDL=1    the backward's kernels launched one after the other without programmatic dependent
//                             launch (KernelChoice::pdl)
//   SINKATTN_CUDA_FWD_SECTION=N the warp-specialised forward's tiles in L2 sections of N (head, sequence) pairs
//                             (scheduler.hpp); 0: no sections (the plain longest-first order); unset: the pairs whose
//                             K / V fit 5/8 of the device's L2 (fwd_section_pairs)
struct Switches {
  bool no_sm90 = false;
  bool no_tma = false;
  bool det_sm80 = false;
  int fwd_ws = -1;  // -1: default rule
  bool fwd_ws_short = false;
  bool fwd_ws_persistent = true;
  bool no_decode = false;
  bool dq_atomics = false;
  bool no_dbias_group_sum = false;
  bool no_bias_tma = false;
  bool no_pdl = false;
  int fwd_section = -1;  // -1: the L2 rule
  int dkdv_block_m = 0;  // Hopper dK dV query rows per step: 0 the rule (tiles::dkdv_sm90_block_m), 64 always 64
};
Switches switches_from_env();

// Pairs per L2 section of the warp-specialised forward's tile order (scheduler.hpp; 0: one section): the switch, else
// the query heads of as many KV heads as have their K / V within 5/8 of the device's L2 (about FlashAttention-3's
// 32 MiB on an H100 / H200's 50 MiB: the rest holds the tiles' Q, O and other traffic), at least two waves of tiles
// per section. mblocks: the call's query blocks per (head, sequence).
int fwd_section_pairs(const Call& c, int64_t mblocks, const DeviceProps& dev, const Switches& sw);

// Extra: the variant with bias / dropout compiled in; Paged: K / V read through a page table (SPEC 1);
// Sm90Ws: the warp-specialised Hopper forward; Decode: decode/ (up to 16 query rows per sequence, split-KV).
enum class FwdKernel { kSm80, kSm80Extra, kSm80Paged, kSm90, kSm90Ws, kDecode };
enum class DkvKernel { kSm80, kSm80Extra, kSm90 };
// How the backward forms dq:
//   kDqKernel:     the separate sm_80 dq kernel (no float atomics; the one that writes dS for d_bias)
//   kFusedAtomic:  in the dK dV kernel, fp32 atomics into a workspace accumulator (deterministic = 0)
//   kFusedOrdered: in the Hopper dK dV kernel, the same accumulator updated by the key blocks of each query block in
//                  ascending order, enforced by per-(sequence, KV head, query block) semaphores (deterministic = 1)
enum class DqPath { kDqKernel, kFusedAtomic, kFusedOrdered };

struct KernelChoice {
  bool fp32 = false;  // the SIMT fp32 path (src/cuda/fp32): one kernel family, no tiles
  int tile = 0;       // head-dim tile (tiles.hpp)
  FwdKernel fwd = FwdKernel::kSm80;
  int fwd_block_m = 0, fwd_block_n = 0;
  bool fwd_tma = false;  // the Hopper forward tries TMA (the launcher falls back to cp.async if the driver refuses)
  bool dropout = false;          // DkvKernel::kSm90: its dropout variant (kDropout)
  bool bias = false;             // kSm90Ws / DkvKernel::kSm90: their bias variants (kBias)
  // DkvKernel::kSm90 with a bias broadcast over the heads, tile 64, a KV group of several query heads: the kernel sums
  // dS over the group's heads before the d_bias workspace, which then has h_kv heads instead of h_q (dbias_ws_heads).
  bool dbias_group_sum = false;
  int64_t dbias_ws_heads(const Call& c) const { return dbias_group_sum ? c.h_kv : c.h_q; }
  // kSm90Ws / DkvKernel::kSm90 with a 16-bit bias of unit key stride: the bias tiles are staged in
  // shared memory by TMA, a ring beside K / V (forward), with each step's Q / dO (dK dV, tile 64) or one buffer
  // loaded a step ahead (dK dV, tile 128); the launcher falls back to per-thread loads from global memory if the
  // driver refuses the description or the address is not a 16-byte multiple.
  bool fwd_bias_tma = false, dkdv_bias_tma = false;
  int fwd_consumers = 0;         // kSm90Ws: consumer warpgroups (2 or 3)
  bool fwd_persistent = false;   // kSm90Ws: persistent blocks (one per SM) over the tiles
  int fwd_sms = 0;               // kSm90Ws persistent: the device's SMs (DeviceProps::sms; 0: the launcher asks)
  // kSm90Ws: (head, sequence) pairs per L2 section of the tile order (scheduler.hpp, fwd_section_pairs; 0: one
  // section, the plain longest-first order).
  int fwd_section = 0;
  DkvKernel dkdv = DkvKernel::kSm80;
  int dkdv_block_n = 0, dkdv_block_m = 0;
  bool dkdv_tma = false;
  DqPath dq = DqPath::kDqKernel;
  bool dq_tma = false;  // kFusedAtomic / kFusedOrdered on kSm90: full query blocks add their dq tile by TMA reduce-add
  // DkvKernel::kSm90 with query rows (b, h_q, s_q > 0: the preprocess runs right before it): it and the dq convert
  // after it are launched with programmatic dependent launch (each may start while the kernel before it finishes:
  // launch latency and the block start-up overlap that kernel's last wave; each waits in pdl_wait, common.cuh,
  // before it touches that kernel's outputs; the dK dV kernel reads K / V before: inputs the preprocess's own launch
  // waited for, hence the preprocess as its predecessor). The convert's pdl_wait waits for the dK dV grid alone, so
  // every dK dV block waits, also one past its sequence's keys (varlen) that has nothing to do.
  // SINKATTN_CUDA_NO_PDL=1 turns it off.
  bool pdl = false;
  int dq_block_m = 0, dq_block_n = 0;  // dq kernel tile (kDqKernel)
  std::string fwd_why, bwd_why;        // why not the fastest kernel, when that is not what runs ("" otherwise)

  // One line: the kernels of the forward or the backward pass and the reason, e.g.
  //   "hopper fwd (wgmma), tile 128 x 64, TMA"
  //   "sm80 fwd (mma.sync, bias / dropout variant), tile 128 x 32: the Hopper kernels have no variant with both bias
  //    and dropout"
  std::string summary(Pass pass) const;
};

// Why the Hopper kernels cannot run on this device / build / environment at all ("" when they can).
std::string hopper_unavailable(const DeviceProps& dev, const Switches& sw);

// The decision for a resolved call (Call::p is not read: shape-only queries work).
KernelChoice choose_kernels(const Call& c, const DeviceProps& dev, const Switches& sw);

// The rules choose_kernels applies, as text (for `sinkattn info`).
std::string dispatch_rules();

// tiles::kHeadDimTiles as text, the entries joined by `sep` ("32 64 96 128 192 256"), for messages and reports.
std::string head_dim_tiles_text(const char* sep);

}  // namespace sinkattn::cuda
