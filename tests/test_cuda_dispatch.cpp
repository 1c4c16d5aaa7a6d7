// The CUDA backend's kernel choice (src/cuda/dispatch.cpp), a pure function of the resolved call, the device's
// properties and the environment switches: checked on the CPU with the device properties passed in (an H200, an
// A100, a build without sm_90a code), for the layers of bench/RESULTS.md and the rules' edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cuda/decode/decode_rules.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/tiles.hpp"

namespace sinkattn::cuda {
namespace {

const DeviceProps kH200{9, 0, true};
const DeviceProps kA100{8, 0, true};
const DeviceProps kH200NoSm90a{9, 0, false};

// A resolved call as resolve_call leaves it (only what the decision reads).
Call make_call(sinkattn_dtype_t dt, int64_t d, int64_t s, int64_t h_q, int64_t h_kv, int64_t wl, int64_t wr,
               bool backward = false) {
  Call c;
  c.pass = backward ? Pass::kBackward : Pass::kForward;
  c.memory = Memory::kDevice;
  c.dtype = dt;
  c.b = 2;
  c.s_q = c.s_kv = s;
  c.h_q = h_q;
  c.h_kv = h_kv;
  c.group = h_q / h_kv;
  c.d = c.d_v = d;
  c.window_left = wl;
  c.window_right = wr;
  return c;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CudaDispatch, GptOssFullOnHopper) {
  const Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  const KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_FALSE(k.fp32);
  EXPECT_EQ(k.tile, 64);
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 3);
  EXPECT_EQ(k.fwd_block_m, 192);
  EXPECT_EQ(k.fwd_block_n, 128);
  EXPECT_EQ(k.fwd_sms, 0);  // kH200 gives no SM count: the launcher asks the device
  DeviceProps h200_sms = kH200;
  h200_sms.sms = 132;
  EXPECT_EQ(choose_kernels(c, h200_sms, Switches{}).fwd_sms, 132);
  EXPECT_TRUE(k.fwd_tma);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dkdv_block_n, 128);
  EXPECT_EQ(k.dkdv_block_m, 128);  // 128 query rows per step at tile 64 without bias / dropout
  EXPECT_TRUE(k.dkdv_tma);
  EXPECT_EQ(k.dq, DqPath::kFusedAtomic);
  EXPECT_EQ(k.summary(Pass::kForward),
            "hopper fwd (wgmma, warp-specialised: producer warp + 3 consumer warpgroups, persistent), tile 192 x 128, "
            "TMA");
  EXPECT_TRUE(k.dq_tma);
  EXPECT_EQ(k.summary(Pass::kBackward),
            "hopper dK dV (wgmma), tile 128 x 128, TMA, dq fused (TMA reduce-add of fp32 tiles; atomics for partial "
            "query blocks), programmatic dependent launch");
  EXPECT_TRUE(k.pdl);
}

// Programmatic dependent launch of the Hopper dK dV kernel and the dq convert (KernelChoice::pdl): with the Hopper dK
// dV kernel only (the sm_80 kernels do not wait in pdl_wait), and off under SINKATTN_CUDA_NO_PDL.
TEST(CudaDispatch, ProgrammaticDependentLaunchAndItsSwitch) {
  Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, 127, 0, true);
  EXPECT_TRUE(choose_kernels(c, kH200, Switches{}).pdl);
  Switches off;
  off.no_pdl = true;
  const KernelChoice k = choose_kernels(c, kH200, off);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_FALSE(k.pdl);
  EXPECT_FALSE(has(k.summary(Pass::kBackward), "programmatic"));
  EXPECT_FALSE(choose_kernels(c, kA100, Switches{}).pdl);  // sm_80 dK dV kernel
  Switches sm80;
  sm80.no_sm90 = true;
  EXPECT_FALSE(choose_kernels(c, kH200, sm80).pdl);
  c.deterministic = true;
  EXPECT_TRUE(choose_kernels(c, kH200, Switches{}).pdl);  // the fused ordered dq: the same kernel
  Switches det80;
  det80.det_sm80 = true;
  EXPECT_FALSE(choose_kernels(c, kH200, det80).pdl);
  c.deterministic = false;
  Call none = c;  // no query rows: no preprocess before the dK dV kernel, so no programmatic launch after it
  none.s_q = 0;
  EXPECT_EQ(choose_kernels(none, kH200, Switches{}).dkdv, DkvKernel::kSm90);
  EXPECT_FALSE(choose_kernels(none, kH200, Switches{}).pdl);
  Call packed = c;  // varlen: every dK dV block waits, also those past their sequences' keys (dispatch.hpp)
  packed.plan.varlen = true;
  EXPECT_EQ(choose_kernels(packed, kH200, Switches{}).dkdv, DkvKernel::kSm90);
  EXPECT_TRUE(choose_kernels(packed, kH200, Switches{}).pdl);
  c.d = c.d_v = 256;  // head dim 256: the Hopper dK dV kernel that splits the head dim (it waits too)
  EXPECT_TRUE(choose_kernels(c, kH200, Switches{}).pdl);
  c.d = c.d_v = 192;  // tile 192: the sm_80 backward, which does not wait
  EXPECT_FALSE(choose_kernels(c, kH200, Switches{}).pdl);
}

// Tile 256's backward: the Hopper dK dV kernel that splits the head dim between its warpgroups (64 keys x 64 query
// rows per step, dq by TMA reduce-adds of full query blocks), deterministic or not; with a bias or dropout, and off
// Hopper, the sm_80 kernels, saying why.
TEST(CudaDispatch, WideTileBackwardOnHopper) {
  for (int64_t d : {200, 256}) {
    Call c = make_call(SINKATTN_BF16, d, 4096, 16, 16, -1, 0, true);
    KernelChoice k = choose_kernels(c, kH200, Switches{});
    EXPECT_EQ(k.tile, 256) << d;
    EXPECT_EQ(k.dkdv, DkvKernel::kSm90) << d;
    EXPECT_EQ(k.dq, DqPath::kFusedAtomic) << d;
    EXPECT_EQ(k.dkdv_block_n, 64) << d;
    EXPECT_EQ(k.dkdv_block_m, 64) << d;
    EXPECT_TRUE(k.dkdv_tma) << d;
    EXPECT_TRUE(k.dq_tma) << d;
    EXPECT_EQ(k.summary(Pass::kBackward),
              "hopper dK dV (wgmma, head dim split between the warpgroups), tile 64 x 64, TMA, dq fused (TMA "
              "reduce-add of fp32 tiles; atomics for partial query blocks), programmatic dependent launch");
    c.deterministic = true;
    k = choose_kernels(c, kH200, Switches{});
    EXPECT_EQ(k.dkdv, DkvKernel::kSm90) << d;
    EXPECT_EQ(k.dq, DqPath::kFusedOrdered) << d;
    EXPECT_EQ(k.dkdv_block_m, 64) << d;  // the semaphores' query blocks (cuda_backend.cu sizes them by it)
    Switches det80;
    det80.det_sm80 = true;
    EXPECT_EQ(choose_kernels(c, kH200, det80).dkdv, DkvKernel::kSm80) << d;
    c.deterministic = false;
    EXPECT_EQ(choose_kernels(c, kA100, Switches{}).dkdv, DkvKernel::kSm80) << d;
    Switches no90;
    no90.no_sm90 = true;
    EXPECT_EQ(choose_kernels(c, kH200, no90).dkdv, DkvKernel::kSm80) << d;
    for (int extra = 0; extra < 2; ++extra) {
      Call x = c;
      if (extra == 0) x.plan.bias = Use::kRequired;
      else x.plan.dropout = true;
      k = choose_kernels(x, kH200, Switches{});
      EXPECT_EQ(k.dkdv, DkvKernel::kSm80Extra) << d;
      EXPECT_TRUE(has(k.summary(Pass::kBackward), "has no bias / dropout variant")) << k.summary(Pass::kBackward);
      EXPECT_FALSE(k.pdl) << d;
    }
  }
}

// The Hopper dK dV kernel's query rows per step (tiles::dkdv_sm90_block_m): 128 at tile 64 without bias or dropout
// (deterministic or not), 64 at tile 128 and for the bias / dropout variants.
TEST(CudaDispatch, DkvQueryRowsPerStep) {
  Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, 127, 0, true);
  EXPECT_EQ(choose_kernels(c, kH200, Switches{}).dkdv_block_m, 128);
  c.deterministic = true;
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.dq, DqPath::kFusedOrdered);
  EXPECT_EQ(k.dkdv_block_m, 128);
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "hopper dK dV (wgmma), tile 128 x 128, TMA"));
  Call b = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  b.plan.bias = Use::kRequired;
  k = choose_kernels(b, kH200, Switches{});
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dkdv_block_m, 64);
  Call d = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  d.plan.dropout = true;
  k = choose_kernels(d, kH200, Switches{});
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dkdv_block_m, 64);
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 128, 4096, 32, 32, -1, 0, true), kH200, Switches{}).dkdv_block_m,
            64);
}

TEST(CudaDispatch, DqReduceAddAndNoTma) {
  const Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.dq, DqPath::kFusedAtomic);
  EXPECT_TRUE(k.dq_tma);
  EXPECT_EQ(k.summary(Pass::kBackward),
            "hopper dK dV (wgmma), tile 128 x 128, TMA, dq fused (TMA reduce-add of fp32 tiles; atomics for partial "
            "query blocks), programmatic dependent launch");
  Switches sw;
  sw.no_tma = true;  // no TMA at all: no reduce-adds either
  k = choose_kernels(c, kH200, sw);
  EXPECT_FALSE(k.dq_tma);
  EXPECT_EQ(k.summary(Pass::kBackward),
            "hopper dK dV (wgmma), tile 128 x 128, cp.async, dq fused (fp32 atomics), programmatic dependent launch");
  Call det = c;  // the deterministic dq adds in a fixed order, by the same reduce-adds
  det.deterministic = true;
  const KernelChoice kd = choose_kernels(det, kH200, Switches{});
  EXPECT_EQ(kd.dq, DqPath::kFusedOrdered);
  EXPECT_TRUE(kd.dq_tma);
  EXPECT_TRUE(kd.dq_first_store);  // the writer variant: turn 0 stores, no zeroing pass (dq_order.hpp)
  EXPECT_FALSE(k.dq_first_store);  // any order: every block adds to a zeroed accumulator
  EXPECT_EQ(kd.summary(Pass::kBackward),
            "hopper dK dV (wgmma), tile 128 x 128, TMA, dq fused in a fixed order (per-(query head, query block) "
            "semaphores, deterministic; TMA reduce-add of fp32 tiles, atomics for partial query blocks; a query "
            "block's first key block stores its tile, no zeroing pass), programmatic dependent launch");
  const KernelChoice kda = choose_kernels(det, kH200, sw);
  EXPECT_FALSE(kda.dq_tma);
  EXPECT_EQ(kda.summary(Pass::kBackward),
            "hopper dK dV (wgmma), tile 128 x 128, cp.async, dq fused in a fixed order (per-(query head, query block) "
            "semaphores, deterministic; a query block's first key block stores its tile, no zeroing pass), "
            "programmatic dependent launch");
  Call few = c;  // fewer rows than one 64-row box
  few.s_q = 40;
  EXPECT_FALSE(choose_kernels(few, kH200, Switches{}).dq_tma);
}

TEST(CudaDispatch, DeterministicOnHopperAndItsSwitch) {
  Call c = make_call(SINKATTN_BF16, 128, 4096, 32, 32, -1, 0, true);
  c.deterministic = true;
  const KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dq, DqPath::kFusedOrdered);
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "fixed order"));
  EXPECT_TRUE(k.dq_first_store);  // tile 128, 64 rows a step: the deterministic variant has the dq writer
  Call wide = c;  // the tile-256 kernel has no writer: its accumulator is zeroed
  wide.d = wide.d_v = 256;
  EXPECT_FALSE(choose_kernels(wide, kH200, Switches{}).dq_first_store);
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 2);
  EXPECT_EQ(k.fwd_block_m, 128);
  EXPECT_EQ(k.fwd_block_n, 128);
  Switches sw;
  sw.det_sm80 = true;
  const KernelChoice s = choose_kernels(c, kH200, sw);
  EXPECT_EQ(s.dq, DqPath::kDqKernel);
  EXPECT_EQ(s.dkdv, DkvKernel::kSm80);
  EXPECT_EQ(s.dq_block_m, 64);
  EXPECT_EQ(s.dq_block_n, 64);
  EXPECT_EQ(s.fwd, FwdKernel::kSm90Ws);  // the switch is about the deterministic backward only
  EXPECT_TRUE(has(s.summary(Pass::kBackward), "SINKATTN_CUDA_DET_SM80"));
  EXPECT_FALSE(s.dq_first_store);  // the preprocess zeroes the accumulator for every path but the writer's turns
  // Off Hopper, deterministic = 1 is the dq kernel.
  const KernelChoice a = choose_kernels(c, kA100, Switches{});
  EXPECT_FALSE(a.dq_first_store);
  EXPECT_EQ(a.dq, DqPath::kDqKernel);
  EXPECT_EQ(a.dkdv, DkvKernel::kSm80);
  EXPECT_TRUE(has(a.summary(Pass::kBackward), "compute capability 8.0"));
}

// Short sliding windows (tiles.hpp, kSm90FwdWindowKeys): the Hopper forward's short-window variant at tile 128, and at
// tile 64 from 512 keys per 128 rows; the sm_80 forward below that at tile 64 (GPT-OSS's 127-key window).
TEST(CudaDispatch, ShortWindowForward) {
  const Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, 127, 0, true);
  const KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm80);
  EXPECT_EQ(k.fwd_block_m, 128);
  EXPECT_EQ(k.fwd_block_n, 64);
  EXPECT_EQ(k.fwd_q_stages, 1);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "255 keys per 128 query rows")) << k.summary(Pass::kForward);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "tile 64 from 512 keys")) << k.summary(Pass::kForward);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);  // the backward has no such rule
  // 128 + 383 = 511 < 512 stays; 128 + 384 = 512 runs the short-window variant.
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 8, 8, 383, 0), kH200, Switches{}).fwd, FwdKernel::kSm80);
  const KernelChoice k384 = choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 64, 8, 384, 0), kH200, Switches{});
  EXPECT_EQ(k384.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k384.fwd_consumers, tiles::kSm90WsWindowConsumers);
  EXPECT_EQ(k384.fwd_q_stages, 2);
  EXPECT_EQ(k384.fwd_block_m, 128);
  EXPECT_EQ(k384.fwd_block_n, 128);
  EXPECT_EQ(k384.summary(Pass::kForward),
            "hopper fwd (wgmma, warp-specialised: producer warp + 2 consumer warpgroups, persistent, short-window "
            "variant: Q in 2 buffers), tile 128 x 128, TMA");
  // Tile 128: from the shortest window; 128 + 895 = 1023 < 1024 is short; 128 + 896 = 1024 runs the default variant.
  const KernelChoice k128 = choose_kernels(make_call(SINKATTN_BF16, 128, 4096, 8, 8, 127, 0), kH200, Switches{});
  EXPECT_EQ(k128.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k128.fwd_q_stages, 2);
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 128, 4096, 8, 8, 0, 0), kH200, Switches{}).fwd_q_stages, 2);
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 8, 8, 895, 0), kH200, Switches{}).fwd_q_stages, 2);
  const KernelChoice wide = choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 8, 8, 896, 0), kH200, Switches{});
  EXPECT_EQ(wide.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(wide.fwd_q_stages, 1);
  EXPECT_EQ(wide.fwd_consumers, 3);
  // A window on one side only is not short.
  const KernelChoice left = choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 8, 8, 10, -1), kH200, Switches{});
  EXPECT_EQ(left.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(left.fwd_q_stages, 1);
  // No window variant with bias or dropout: the sm_80 forward, which says why.
  Call cb = make_call(SINKATTN_BF16, 128, 4096, 32, 32, 127, 0, true);
  cb.plan.bias = Use::kRequired;
  const KernelChoice kb = choose_kernels(cb, kH200, Switches{});
  EXPECT_EQ(kb.fwd, FwdKernel::kSm80Extra);
  EXPECT_TRUE(has(kb.summary(Pass::kForward), "255 keys per 128 query rows")) << kb.summary(Pass::kForward);
  EXPECT_TRUE(has(kb.summary(Pass::kForward), "without bias, dropout or paged KV")) << kb.summary(Pass::kForward);
  Call cd = cb;
  cd.plan.bias = Use::kAbsent;
  cd.plan.dropout = true;
  EXPECT_EQ(choose_kernels(cd, kH200, Switches{}).fwd, FwdKernel::kSm80Extra);
  // Those keep the default variants from kSm90FwdMinWindowKeys keys: 128 + 383 = 511 < 512 stays on sm_80, 512 not.
  cb.window_left = 383;
  EXPECT_EQ(choose_kernels(cb, kH200, Switches{}).fwd, FwdKernel::kSm80Extra);
  cb.window_left = 384;
  const KernelChoice kb384 = choose_kernels(cb, kH200, Switches{});
  EXPECT_EQ(kb384.fwd, FwdKernel::kSm90Ws);
  EXPECT_TRUE(kb384.bias);
  EXPECT_EQ(kb384.fwd_q_stages, 1);
  // SINKATTN_CUDA_NO_WINDOW_VARIANT: the kernels of the other windows.
  Switches off;
  off.no_window_variant = true;
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 128, 4096, 8, 8, 127, 0), kH200, off).fwd, FwdKernel::kSm80);
  const KernelChoice off895 = choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 8, 8, 895, 0), kH200, off);
  EXPECT_EQ(off895.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(off895.fwd_q_stages, 1);
  EXPECT_EQ(off895.fwd_consumers, 3);
  // Off Hopper the sm_80 forward, as for every call.
  EXPECT_EQ(choose_kernels(c, kA100, Switches{}).fwd, FwdKernel::kSm80);
  EXPECT_EQ(choose_kernels(c, kA100, Switches{}).fwd_q_stages, 1);
}

// The warp-specialised forward's consumer warpgroups, one count per variant (tiles::sm90_ws_*_consumers; launch.cuh
// compiles no other): 3 at tile 64 and 2 at 128 / 192 / 256 for the plain variant, 2 for bias and for dropout.
TEST(CudaDispatch, WarpSpecialisedForwardConsumers) {
  const Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0);
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 3);
  EXPECT_EQ(k.fwd_block_m, 192);
  EXPECT_EQ(k.summary(Pass::kForward),
            "hopper fwd (wgmma, warp-specialised: producer warp + 3 consumer warpgroups, persistent), tile 192 x 128, "
            "TMA");
  for (int64_t d : {128, 192, 256})
    EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, d, 4096, 8, 8, -1, 0), kH200, Switches{}).fwd_consumers, 2) << d;
  for (int64_t d : {64, 128}) {
    Call b = make_call(SINKATTN_BF16, d, 4096, 8, 8, -1, 0);
    b.plan.bias = Use::kRequired;
    EXPECT_EQ(choose_kernels(b, kH200, Switches{}).fwd_consumers, 2) << d;
    Call dr = make_call(SINKATTN_BF16, d, 4096, 8, 8, -1, 0);
    dr.plan.dropout = true;
    EXPECT_EQ(choose_kernels(dr, kH200, Switches{}).fwd_consumers, 2) << d;
  }
  // Fewer query rows than a 192-row TMA box: cp.async.
  EXPECT_FALSE(choose_kernels(make_call(SINKATTN_BF16, 64, 100, 8, 8, -1, 0), kH200, Switches{}).fwd_tma);
}

// The decode splits combined in their thread-block cluster (KernelChoice::decode_cluster): on compute capability 9.0
// and above unless SINKATTN_CUDA_NO_DECODE_CLUSTER is set; the summary says where the splits are combined.
TEST(CudaDispatch, DecodeCluster) {
  Call c = make_call(SINKATTN_BF16, 64, 1, 64, 8, -1, 0);
  c.s_kv = 1024;
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  ASSERT_EQ(k.fwd, FwdKernel::kDecode);
  EXPECT_TRUE(k.decode_cluster);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "combine in the cluster's shared memory (2 splits"));
  EXPECT_FALSE(choose_kernels(c, kA100, Switches{}).decode_cluster);  // no clusters before sm_90
  EXPECT_FALSE(has(choose_kernels(c, kA100, Switches{}).summary(Pass::kForward), "cluster"));
  Switches off;
  off.no_decode_cluster = true;
  EXPECT_FALSE(choose_kernels(c, kH200, off).decode_cluster);
  EXPECT_EQ(kDecodeClusterMaxSplits, 8);  // the portable cluster size, as the switch's text says
  // Which calls cluster their splits: 2 splits at any grid; 3 .. 8 on at most one block an SM; never 1 or over 8.
  EXPECT_TRUE(decode_cluster_splits(2, 4096, 132));
  EXPECT_TRUE(decode_cluster_splits(2, 4096, 0));
  EXPECT_TRUE(decode_cluster_splits(6, 8, 132));     // batch 1, 8 KV heads: 48 blocks
  EXPECT_FALSE(decode_cluster_splits(6, 64, 132));   // batch 8: 384 blocks
  EXPECT_TRUE(decode_cluster_splits(8, 16, 132));    // 128 blocks
  EXPECT_FALSE(decode_cluster_splits(8, 17, 132));   // 136
  EXPECT_FALSE(decode_cluster_splits(6, 8, 0));      // the SM count unknown
  EXPECT_FALSE(decode_cluster_splits(1, 8, 132));
  EXPECT_FALSE(decode_cluster_splits(9, 1, 132));
}

// The decode plan's split heuristic (decode_rules.hpp, decode_heuristic_splits) at GPT-OSS-120B's decode shapes
// (8 KV heads, one 16-row block each, 3 blocks an SM) on 132 SMs: the rows of a context of k keys read
// k / 64 + 2 tiles (the + 1 of a 16-key boundary below the first key).
TEST(CudaDispatch, DecodeHeuristicSplits) {
  // batch 1 (8 blocks): one block an SM, 16 splits, fewer where the tiles cover with fewer (129 tiles: 9 each)
  EXPECT_EQ(decode_heuristic_splits(129, 8, 132, 3, true), 15);     // 8k keys
  EXPECT_EQ(decode_heuristic_splits(513, 8, 132, 3, true), 16);     // 32k keys (33 tiles each)
  EXPECT_EQ(decode_heuristic_splits(2049, 8, 132, 3, false), 16);   // 128k keys (129 tiles each)
  // 1k keys (17 tiles): at most 8 splits of 2 tiles, which cover with 6 of 3; in a cluster 8 (2 empty)
  EXPECT_EQ(decode_heuristic_splits(17, 8, 132, 3, false), 6);
  EXPECT_EQ(decode_heuristic_splits(17, 8, 132, 3, true), 8);
  // a cluster's count rounds up only while blocks x splits stay within the SMs: 16 blocks x 8 = 128 <= 132
  EXPECT_EQ(decode_heuristic_splits(14, 16, 132, 3, true), 8);
  EXPECT_EQ(decode_heuristic_splits(14, 16, 132, 3, false), 7);
  // batch 8 (64 blocks, above an eighth of the SMs): the wave rule, 6 splits, past the cluster's one block an SM
  EXPECT_EQ(decode_heuristic_splits(17, 64, 132, 3, true), 6);
  EXPECT_EQ(decode_heuristic_splits(129, 64, 132, 3, true), 6);
  // batch 64 (512 blocks): 2 splits; batch 256 (2048 blocks, over 4 waves of 396 slots): none
  EXPECT_EQ(decode_heuristic_splits(129, 512, 132, 3, true), 2);
  EXPECT_EQ(decode_heuristic_splits(129, 2048, 132, 3, true), 1);
  // a sliding window (3 tiles): never split, at any batch
  EXPECT_EQ(decode_heuristic_splits(3, 8, 132, 4, true), 1);
  EXPECT_EQ(decode_heuristic_splits(7, 8, 132, 4, true), 1);
  // the SM count unknown: the wave rule over one slot, no cluster rounding
  EXPECT_EQ(decode_heuristic_splits(129, 8, 0, 1, true), 1);
  // never more than the combine's kCombineMaxSplits, never more than half the tiles
  EXPECT_LE(decode_heuristic_splits(100000, 1, 1000, 4, false), kCombineMaxSplits);
  EXPECT_EQ(decode_heuristic_splits(8, 1, 132, 3, false), 4);
}

// The decode kernels' short-range configuration (decode_rules.hpp, decode_short_keys): one 16-row block of packed
// rows at head dims up to 64 whose windows span at most 3 tiles of 64 keys (with the 15 keys below a 16-key
// boundary), over more blocks than the default configuration's 3 an SM hold: GPT-OSS's sliding layer at 1 or 2
// query rows a sequence from batch 50 on 132 SMs.
TEST(CudaDispatch, DecodeShortKeys) {
  DeviceProps h200 = kH200;
  h200.sms = 132;
  Call c = make_call(SINKATTN_BF16, 64, 1, 64, 8, 127, 0);
  c.s_kv = 8192;
  c.b = 64;  // 512 blocks of the 8 KV heads: more than 3 an SM hold
  KernelChoice k = choose_kernels(c, h200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kDecode);
  EXPECT_TRUE(k.decode_short);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "short key range: Q in registers, 3 stages"));
  EXPECT_EQ(decode_window_keys(c, 16), 129);  // 127 + 0 + 2 query rows of the 8-head group
  EXPECT_EQ(decode_max_tiles(c, 16), 3);      // 129 + 15 = 144 keys
  DeviceProps a100 = kA100;  // the sm_80 path's kernel, on every GPU
  a100.sms = 108;
  EXPECT_TRUE(choose_kernels(c, a100, Switches{}).decode_short);
  EXPECT_FALSE(choose_kernels(c, kH200, Switches{}).decode_short);  // the SM count unknown
  Switches off;
  off.no_decode_short = true;
  EXPECT_FALSE(choose_kernels(c, h200, off).decode_short);
  EXPECT_FALSE(has(choose_kernels(c, h200, off).summary(Pass::kForward), "short key range"));
  // The blocks: b x h_kv above 3 x 132 = 396.
  c.b = 49;
  EXPECT_FALSE(choose_kernels(c, h200, Switches{}).decode_short);
  c.b = 50;
  EXPECT_TRUE(choose_kernels(c, h200, Switches{}).decode_short);
  c.b = 64;
  c.s_q = 2;  // 16 packed rows: still one block
  EXPECT_TRUE(choose_kernels(c, h200, Switches{}).decode_short);
  c.s_q = 3;  // 24 packed rows: the 32-row configuration
  EXPECT_FALSE(choose_kernels(c, h200, Switches{}).decode_short);
  c.s_q = 1;
  c.window_left = 175;  // 175 + 2 + 15 = 192 keys: 3 tiles
  EXPECT_TRUE(choose_kernels(c, h200, Switches{}).decode_short);
  c.window_left = 176;  // 193: 4 tiles
  EXPECT_FALSE(choose_kernels(c, h200, Switches{}).decode_short);
  EXPECT_EQ(decode_max_tiles(c, 16), 4);
  c.window_left = -1;  // the full layer: every key
  EXPECT_EQ(decode_window_keys(c, 16), -1);
  EXPECT_FALSE(choose_kernels(c, h200, Switches{}).decode_short);
  c.s_kv = 192;  // unless there are only 3 tiles of them
  EXPECT_TRUE(choose_kernels(c, h200, Switches{}).decode_short);
  c.s_kv = 193;
  EXPECT_FALSE(choose_kernels(c, h200, Switches{}).decode_short);
  c.s_kv = 8192;
  c.window_left = 127;
  Call wide = c;  // head-dim tile 128: its 16-row kernel keeps Q in shared memory
  wide.d = wide.d_v = 80;
  EXPECT_FALSE(choose_kernels(wide, h200, Switches{}).decode_short);
  Call mha = c;  // group 1: 16 query rows of one head a block, a span of 127 + 16 + 15 keys
  mha.h_kv = mha.h_q;
  mha.group = 1;
  mha.s_q = 16;
  mha.b = 7;  // 448 blocks
  EXPECT_TRUE(choose_kernels(mha, h200, Switches{}).decode_short);
  mha.window_left = 161;  // 161 + 16 + 15 = 192
  EXPECT_TRUE(choose_kernels(mha, h200, Switches{}).decode_short);
  mha.window_left = 162;
  EXPECT_FALSE(choose_kernels(mha, h200, Switches{}).decode_short);
}

TEST(CudaDispatch, DecodeAndPagedKv) {
  // Short query chunks (decode, speculative decoding): the decode kernels, fp16 / bf16, head dims up to 128.
  Call c = make_call(SINKATTN_BF16, 64, 1, 64, 8, -1, 0);
  c.s_kv = 8192;
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kDecode);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "decode"));
  EXPECT_EQ(choose_kernels(c, kA100, Switches{}).fwd, FwdKernel::kDecode);  // not a Hopper kernel
  // The split combine by programmatic dependent launch: compute capability 9.0 and above, off under
  // SINKATTN_CUDA_NO_PDL, decided apart from the backward's (KernelChoice::pdl) for the same call.
  EXPECT_TRUE(k.decode_pdl);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "combine kernel by programmatic dependent launch"));
  EXPECT_FALSE(choose_kernels(c, kA100, Switches{}).decode_pdl);
  Switches no_pdl;
  no_pdl.no_pdl = true;
  EXPECT_FALSE(choose_kernels(c, kH200, no_pdl).decode_pdl);
  EXPECT_FALSE(has(choose_kernels(c, kH200, no_pdl).summary(Pass::kForward), "programmatic"));
  Switches no_sm90;  // the backward on the sm_80 kernels (no programmatic launch there); the decode combine keeps it
  no_sm90.no_sm90 = true;
  EXPECT_FALSE(choose_kernels(c, kH200, no_sm90).pdl);
  EXPECT_TRUE(choose_kernels(c, kH200, no_sm90).decode_pdl);
  Call empty = c;  // no sequences: the backward's rule says no; the decode's does not depend on the sizes
  empty.b = 0;
  EXPECT_FALSE(choose_kernels(empty, kH200, Switches{}).pdl);
  EXPECT_TRUE(choose_kernels(empty, kH200, Switches{}).decode_pdl);
  c.s_q = 16;
  EXPECT_EQ(choose_kernels(c, kH200, Switches{}).fwd, FwdKernel::kDecode);
  c.s_q = 17;
  EXPECT_NE(choose_kernels(c, kH200, Switches{}).fwd, FwdKernel::kDecode);
  c.s_q = 1;
  Switches off;
  off.no_decode = true;
  EXPECT_NE(choose_kernels(c, kH200, off).fwd, FwdKernel::kDecode);
  Call wide = c;
  wide.d = wide.d_v = 256;
  EXPECT_NE(choose_kernels(wide, kH200, Switches{}).fwd, FwdKernel::kDecode);
  Call f32 = c;
  f32.dtype = SINKATTN_F32;
  EXPECT_TRUE(choose_kernels(f32, kH200, Switches{}).fp32);
  // A paged prefill chunk on Hopper: the warp-specialised forward through the page table, TMA boxes of
  // gcd(page_size, 128 keys per step) rows.
  Call paged = make_call(SINKATTN_F16, 128, 512, 8, 8, -1, 0);
  paged.paged.on = true;
  paged.paged.num_pages = 300;
  for (const auto& [ps, rows] : std::vector<std::pair<int64_t, int>>{{8, 8}, {16, 16}, {48, 16}, {128, 128},
                                                                       {256, 128}, {1024, 128}, {24, 8}}) {
    paged.paged.page_size = ps;
    k = choose_kernels(paged, kH200, Switches{});
    EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws) << ps;
    EXPECT_TRUE(k.fwd_paged && k.fwd_tma) << ps;
    EXPECT_EQ(k.fwd_page_rows, rows) << ps;
    EXPECT_EQ(k.fwd_kv_pages, 300) << ps;
    EXPECT_TRUE(has(k.summary(Pass::kForward), "paged KV by TMA, boxes of " + std::to_string(rows) + " rows")) << ps;
    EXPECT_TRUE(has(k.summary(Pass::kForward), "two loading warps")) << ps;
    EXPECT_TRUE(k.fwd_why.empty()) << k.fwd_why;
  }
  // Head dim 256: 64 keys per step, boxes of up to 64 rows.
  Call paged256 = paged;
  paged256.d = paged256.d_v = 256;
  paged256.paged.page_size = 256;
  k = choose_kernels(paged256, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_page_rows, 64);
  // No TMA (switch): the same kernel, a page lookup per row by cp.async.
  Switches no_tma;
  no_tma.no_tma = true;
  paged.paged.page_size = 16;
  k = choose_kernels(paged, kH200, no_tma);
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_FALSE(k.fwd_tma);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "paged KV by cp.async"));
  // The sm_80 forward through the page table, with the reason: a page size that is not a multiple of 8, a GPU
  // without the Hopper kernels, a short sliding window, head-dim tile 96.
  paged.paged.page_size = 12;
  k = choose_kernels(paged, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Paged);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "not a multiple of 8")) << k.summary(Pass::kForward);
  paged.paged.page_size = 16;
  k = choose_kernels(paged, kA100, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Paged);
  EXPECT_FALSE(k.fwd_paged);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "paged KV")) << k.summary(Pass::kForward);
  Call sliding = paged;
  sliding.window_left = 8;
  sliding.window_right = 0;
  k = choose_kernels(sliding, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Paged);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "window spans")) << k.summary(Pass::kForward);
  Call d96 = paged;
  d96.d = d96.d_v = 96;
  EXPECT_EQ(choose_kernels(d96, kH200, Switches{}).fwd, FwdKernel::kSm80Paged);
}

TEST(CudaDispatch, BiasAndDropoutVariants) {
  Call c = make_call(SINKATTN_F16, 128, 1024, 8, 8, -1, -1, true);
  c.plan.bias = Use::kRequired;
  // Bias on Hopper: the bias variants of the warp-specialised forward (2 consumers at both tiles, staged or not,
  // unless the switch asks for 3 at tile 64) and of the dK dV kernel, which writes dS for d_bias; dq fused as without
  // a bias.
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_TRUE(k.bias);
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 2);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dq, DqPath::kFusedAtomic);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "consumer warpgroups, persistent, bias)"));
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "hopper dK dV (wgmma, bias; dS to the d_bias workspace)"));
  Call cb = c;
  cb.deterministic = true;
  EXPECT_EQ(choose_kernels(cb, kH200, Switches{}).dq, DqPath::kFusedOrdered);
  // The deterministic bias variants keep one turn per query block (dq_order.hpp, dq_turn_per_step); without a bias,
  // one per (query head, query block).
  EXPECT_TRUE(has(choose_kernels(cb, kH200, Switches{}).summary(Pass::kBackward),
                  "dq fused in a fixed order (per-query-block semaphores, deterministic"));
  // Only the variants with the dq writer store turn 0's tile (tiles::dkdv_sm90_dq_writer): not the bias ones.
  EXPECT_FALSE(choose_kernels(cb, kH200, Switches{}).dq_first_store);
  Call cp = cb;
  cp.plan.bias = Use::kAbsent;
  EXPECT_TRUE(has(choose_kernels(cp, kH200, Switches{}).summary(Pass::kBackward),
                  "dq fused in a fixed order (per-(query head, query block) semaphores, deterministic"));
  Call c64 = make_call(SINKATTN_BF16, 64, 1024, 8, 8, -1, 0, true);
  c64.plan.bias = Use::kRequired;
  k = choose_kernels(c64, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 2);  // fp32 bias, loaded per thread: the registers for its prefetch
  EXPECT_FALSE(k.dbias_group_sum);  // a group of one head
  // GQA with a bias broadcast over the heads at tile 64: the dK dV kernel sums dS over each KV group; the d_bias
  // workspace has h_kv heads. Not with a per-head bias, nor at tile 128 (no shared memory left for the sums).
  Call gqa = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  gqa.plan.bias = Use::kRequired;
  k = choose_kernels(gqa, kH200, Switches{});
  EXPECT_TRUE(k.dbias_group_sum);
  EXPECT_EQ(k.dbias_ws_heads(gqa), 8);
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "dS summed over each KV group's heads"));
  gqa.bias_per_head = true;
  k = choose_kernels(gqa, kH200, Switches{});
  EXPECT_FALSE(k.dbias_group_sum);
  EXPECT_EQ(k.dbias_ws_heads(gqa), 64);
  gqa.bias_per_head = false;
  gqa.d = gqa.d_v = 128;
  EXPECT_FALSE(choose_kernels(gqa, kH200, Switches{}).dbias_group_sum);
  EXPECT_FALSE(choose_kernels(gqa, kA100, Switches{}).dbias_group_sum);
  // Bias tiles staged by TMA: a 16-bit bias of unit key stride and 16-byte rows (both passes, both tiles); an fp32
  // bias, strided keys, rows of odd length, SINKATTN_CUDA_NO_TMA: per-thread loads.
  Call tb = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  tb.plan.bias = Use::kRequired;
  tb.bias_dtype = SINKATTN_BF16;
  tb.bias = BiasStrides{0, 0, 4096, 1};
  k = choose_kernels(tb, kH200, Switches{});
  EXPECT_TRUE(k.fwd_bias_tma);
  EXPECT_EQ(k.fwd_consumers, 2);  // staged: the tile's words read into registers (ldmatrix) after S is issued
  EXPECT_EQ(k.fwd_block_m, 128);
  EXPECT_TRUE(k.dkdv_bias_tma);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "persistent, bias tiles by TMA)"));
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "hopper dK dV (wgmma, bias tiles by TMA; dS summed over each KV group"));
  Switches no_tma;
  no_tma.no_tma = true;
  EXPECT_FALSE(choose_kernels(tb, kH200, no_tma).fwd_bias_tma);
  EXPECT_FALSE(choose_kernels(tb, kH200, no_tma).dkdv_bias_tma);
  EXPECT_TRUE(has(choose_kernels(tb, kH200, no_tma).summary(Pass::kForward), "persistent, bias)"));
  EXPECT_FALSE(choose_kernels(tb, kA100, Switches{}).fwd_bias_tma);
  EXPECT_FALSE(choose_kernels(tb, kA100, Switches{}).dkdv_bias_tma);
  Call tb_other = tb;
  tb_other.bias_dtype = SINKATTN_F32;
  EXPECT_FALSE(choose_kernels(tb_other, kH200, Switches{}).fwd_bias_tma);
  tb_other = tb;
  tb_other.bias = BiasStrides{0, 0, 1, 4096};  // keys of stride s_q (a transposed view)
  EXPECT_FALSE(choose_kernels(tb_other, kH200, Switches{}).dkdv_bias_tma);
  tb_other = tb;
  tb_other.bias = BiasStrides{0, 0, 4095, 1};  // rows not a 16-byte multiple
  EXPECT_FALSE(choose_kernels(tb_other, kH200, Switches{}).fwd_bias_tma);
  tb_other = tb;
  tb_other.bias = BiasStrides{0, 0, 0, 1};  // broadcast over the queries
  EXPECT_FALSE(choose_kernels(tb_other, kH200, Switches{}).fwd_bias_tma);
  tb_other = tb;
  tb_other.d = tb_other.d_v = 128;  // tile 128: the dK dV kernel's one bias buffer
  EXPECT_TRUE(choose_kernels(tb_other, kH200, Switches{}).fwd_bias_tma);
  EXPECT_TRUE(choose_kernels(tb_other, kH200, Switches{}).dkdv_bias_tma);
  EXPECT_TRUE(has(choose_kernels(tb_other, kH200, Switches{}).summary(Pass::kBackward),
                  "hopper dK dV (wgmma, bias tiles by TMA; dS to the d_bias workspace)"));
  // Off Hopper (or at a tile without Hopper kernels): the sm_80 variants, and the dq kernel writes dS.
  k = choose_kernels(c, kA100, Switches{});
  EXPECT_FALSE(k.bias);
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Extra);
  EXPECT_EQ(k.fwd_block_n, 32);  // the bias / dropout variant keeps 32 keys at head dim 128
  EXPECT_EQ(k.dq, DqPath::kDqKernel);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm80Extra);
  Call c256 = make_call(SINKATTN_F16, 256, 1024, 8, 8, -1, -1, true);
  c256.plan.bias = Use::kRequired;
  k = choose_kernels(c256, kH200, Switches{});
  EXPECT_FALSE(k.bias);
  EXPECT_EQ(k.dq, DqPath::kDqKernel);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm80Extra);
  // Bias and dropout: no Hopper variant has both.
  c.plan.dropout = true;
  k = choose_kernels(c, kH200, Switches{});
  EXPECT_FALSE(k.bias);
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Extra);
  EXPECT_EQ(k.dq, DqPath::kDqKernel);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm80Extra);
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "no variant with both bias and dropout"));
  c.plan.bias = Use::kAbsent;
  // Dropout alone on Hopper: the warp-specialised forward's dropout variant (2 consumers; the keep bits from the
  // consumers and the producer warpgroup), the Hopper dK dV kernel's dropout variant; dq fused (atomics, or the
  // fixed order when deterministic).
  k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(k.fwd_consumers, 2);
  EXPECT_EQ(k.fwd_block_m, 128);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "dropout, keep bits drawn by the consumers and the producer warpgroup"));
  EXPECT_TRUE(k.dropout);
  Call c64f = c;
  c64f.d = c64f.d_v = 64;
  EXPECT_EQ(choose_kernels(c64f, kH200, Switches{}).fwd_consumers, 2);
  c64f.plan.dropout = false;
  EXPECT_EQ(choose_kernels(c64f, kH200, Switches{}).fwd_consumers, 3);  // the plain variant: 3 at tile 64
  EXPECT_EQ(k.dkdv, DkvKernel::kSm90);
  EXPECT_EQ(k.dq, DqPath::kFusedAtomic);
  // Tile 128 (this call): its math warpgroups draw the keep bits; tile 64: a producer warpgroup does
  // (tiles::dkdv_sm90_keep_producer).
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "hopper dK dV (wgmma, dropout, keep bits drawn by the math warpgroups)"));
  Call c64d = c;
  c64d.d = c64d.d_v = 64;
  const KernelChoice k64 = choose_kernels(c64d, kH200, Switches{});
  EXPECT_EQ(k64.dkdv, DkvKernel::kSm90);
  EXPECT_TRUE(has(k64.summary(Pass::kBackward), "hopper dK dV (wgmma, dropout, keep-bit producer warpgroup)"));
  Call cd = c;
  cd.deterministic = true;
  EXPECT_EQ(choose_kernels(cd, kH200, Switches{}).dq, DqPath::kFusedOrdered);
  // Off Hopper: the sm_80 variants; dq fused into the sm_80 dK dV kernel, the dq kernel when deterministic.
  k = choose_kernels(c, kA100, Switches{});
  EXPECT_EQ(k.fwd, FwdKernel::kSm80Extra);
  EXPECT_EQ(k.dq, DqPath::kFusedAtomic);
  EXPECT_EQ(k.dkdv, DkvKernel::kSm80Extra);
  EXPECT_EQ(choose_kernels(cd, kA100, Switches{}).dq, DqPath::kDqKernel);
  // Without either: the lean sm_80 forward at head dim 128 takes 64 keys per step.
  const KernelChoice lean = choose_kernels(make_call(SINKATTN_F16, 128, 1024, 8, 8, -1, -1), kA100, Switches{});
  EXPECT_EQ(lean.fwd, FwdKernel::kSm80);
  EXPECT_EQ(lean.fwd_block_n, 64);
}

TEST(CudaDispatch, TilesWithoutHopperKernels) {
  for (int64_t d : {32, 96}) {
    const KernelChoice k = choose_kernels(make_call(SINKATTN_BF16, d, 512, 4, 4, -1, 0, true), kH200, Switches{});
    EXPECT_EQ(k.fwd, FwdKernel::kSm80) << d;
    EXPECT_EQ(k.dkdv, DkvKernel::kSm80) << d;
    EXPECT_EQ(k.fwd_block_m, tiles::fwd_block_m(k.tile)) << d;
    EXPECT_TRUE(has(k.summary(Pass::kForward), "no Hopper kernel for head-dim tile")) << d;
  }
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 96, 512, 4, 4, -1, 0), kH200, Switches{}).tile, 96);
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 104, 512, 4, 4, -1, 0), kH200, Switches{}).tile, 128);
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 256, 512, 4, 4, -1, 0), kA100, Switches{}).fwd_block_m, 64);
  // d != d_v: the tile of the larger.
  Call c = make_call(SINKATTN_BF16, 64, 512, 4, 4, -1, 0);
  c.d_v = 72;
  EXPECT_EQ(choose_kernels(c, kH200, Switches{}).tile, 96);
  c.d_v = 136;
  EXPECT_EQ(choose_kernels(c, kH200, Switches{}).tile, 192);
}

// Tiles 192 and 256: the warp-specialised forward's plain variant (128 query rows x 64 keys per step); the backward
// at tile 192 (tile 256's: WideTileBackwardOnHopper), and the forward of a call with a bias or dropout, on the sm_80
// kernels, each saying why.
TEST(CudaDispatch, WideTilesForwardOnHopper) {
  for (int64_t d : {160, 192, 200, 256}) {
    const Call c = make_call(SINKATTN_BF16, d, 4096, 16, 16, -1, 0, true);
    const KernelChoice k = choose_kernels(c, kH200, Switches{});
    EXPECT_EQ(k.tile, d <= 192 ? 192 : 256) << d;
    EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws) << d;
    EXPECT_EQ(k.fwd_consumers, 2) << d;
    EXPECT_EQ(k.fwd_block_m, 128) << d;
    EXPECT_EQ(k.fwd_block_n, 64) << d;
    EXPECT_TRUE(k.fwd_tma) << d;
    EXPECT_TRUE(has(k.summary(Pass::kForward), "tile 128 x 64, TMA")) << k.summary(Pass::kForward);
    EXPECT_EQ(k.dkdv, d <= 192 ? DkvKernel::kSm80 : DkvKernel::kSm90) << d;
    if (d <= 192) {
      EXPECT_TRUE(has(k.summary(Pass::kBackward), "no Hopper kernel for head-dim tile")) << k.summary(Pass::kBackward);
    }
    // DeepSeek-style d 192, d_v 128: the tile of the larger.
    Call mla = c;
    mla.d = 192;
    mla.d_v = 128;
    EXPECT_EQ(choose_kernels(mla, kH200, Switches{}).fwd, FwdKernel::kSm90Ws);
    // Off Hopper: the sm_80 forward.
    EXPECT_EQ(choose_kernels(c, kA100, Switches{}).fwd, FwdKernel::kSm80) << d;
    // Bias or dropout: no Hopper variant at these tiles, so the sm_80 variant runs the forward (never the plain
    // kernel with the bias or dropout dropped) and the backward.
    Call cb = c;
    cb.plan.bias = Use::kRequired;
    const KernelChoice kb = choose_kernels(cb, kH200, Switches{});
    EXPECT_EQ(kb.fwd, FwdKernel::kSm80Extra) << d;
    EXPECT_FALSE(kb.bias) << d;
    EXPECT_EQ(kb.dkdv, DkvKernel::kSm80Extra) << d;
    EXPECT_TRUE(has(kb.summary(Pass::kForward), "no Hopper bias forward for head-dim tile")) << d;
    Call cd = c;
    cd.plan.dropout = true;
    const KernelChoice kd = choose_kernels(cd, kH200, Switches{});
    EXPECT_EQ(kd.fwd, FwdKernel::kSm80Extra) << d;
    EXPECT_EQ(kd.dkdv, DkvKernel::kSm80Extra) << d;
    EXPECT_TRUE(has(kd.summary(Pass::kForward), "no Hopper dropout forward for head-dim tile")) << d;
    // A short window: the sm_80 forward below 512 keys per 128 rows (the short-window variant is compiled at tiles
    // 64 and 128 only), the default variant from there.
    const KernelChoice kw = choose_kernels(make_call(SINKATTN_BF16, d, 4096, 16, 16, 127, 0), kH200, Switches{});
    EXPECT_EQ(kw.fwd, FwdKernel::kSm80) << d;
    EXPECT_TRUE(has(kw.summary(Pass::kForward), "255 keys per 128 query rows")) << d;
    const KernelChoice kw384 = choose_kernels(make_call(SINKATTN_BF16, d, 4096, 16, 16, 384, 0), kH200, Switches{});
    EXPECT_EQ(kw384.fwd, FwdKernel::kSm90Ws) << d;
    EXPECT_EQ(kw384.fwd_q_stages, 1) << d;
  }
}

TEST(CudaDispatch, DeviceAndBuildAndSwitches) {
  const Call c = make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true);
  const KernelChoice a = choose_kernels(c, kA100, Switches{});
  EXPECT_EQ(a.fwd, FwdKernel::kSm80);
  EXPECT_EQ(a.dkdv, DkvKernel::kSm80);
  EXPECT_EQ(a.dq, DqPath::kFusedAtomic);
  EXPECT_TRUE(has(a.summary(Pass::kForward), "compute capability 8.0"));
  EXPECT_TRUE(has(choose_kernels(c, kH200NoSm90a, Switches{}).summary(Pass::kForward), "no sm_90a code"));
  EXPECT_EQ(choose_kernels(c, DeviceProps{9, 0, true}, Switches{}).fwd, FwdKernel::kSm90Ws);
  EXPECT_EQ(choose_kernels(c, DeviceProps{10, 0, true}, Switches{}).fwd, FwdKernel::kSm80);  // sm_90a code is 9.0 only
  Switches no90;
  no90.no_sm90 = true;
  const KernelChoice n = choose_kernels(c, kH200, no90);
  EXPECT_EQ(n.fwd, FwdKernel::kSm80);
  EXPECT_TRUE(has(n.summary(Pass::kBackward), "SINKATTN_CUDA_NO_SM90"));
  Switches notma;
  notma.no_tma = true;
  const KernelChoice t = choose_kernels(c, kH200, notma);
  EXPECT_EQ(t.fwd, FwdKernel::kSm90Ws);
  EXPECT_FALSE(t.fwd_tma);
  EXPECT_FALSE(t.dkdv_tma);
  EXPECT_EQ(t.summary(Pass::kForward),
            "hopper fwd (wgmma, warp-specialised: producer warp + 3 consumer warpgroups, persistent), tile 192 x 128, "
            "cp.async");
}

TEST(CudaDispatch, TmaNeedsWholeBoxes) {
  // Head dims below 64 columns (tile 64 with d = 40) or fewer rows than one box: cp.async.
  Call c = make_call(SINKATTN_BF16, 40, 4096, 8, 8, -1, 0, true);
  KernelChoice k = choose_kernels(c, kH200, Switches{});
  EXPECT_EQ(k.tile, 64);
  EXPECT_EQ(k.fwd, FwdKernel::kSm90Ws);
  EXPECT_FALSE(k.fwd_tma);
  EXPECT_FALSE(k.dkdv_tma);
  c = make_call(SINKATTN_BF16, 64, 100, 8, 8, -1, 0, true);  // 100 rows: < 192 (forward box), < 128 (dK dV box)
  k = choose_kernels(c, kH200, Switches{});
  EXPECT_FALSE(k.fwd_tma);
  EXPECT_EQ(k.dkdv_block_m, 128);
  EXPECT_FALSE(k.dkdv_tma);
  EXPECT_FALSE(k.dq_tma);
  Call cd = c;  // the dropout variant's 64-row steps: 100 rows hold a 64-row box
  cd.plan.dropout = true;
  k = choose_kernels(cd, kH200, Switches{});
  EXPECT_EQ(k.dkdv_block_m, 64);
  EXPECT_TRUE(k.dkdv_tma);
  EXPECT_TRUE(k.dq_tma);
  Call c128 = make_call(SINKATTN_BF16, 128, 100, 8, 8, -1, 0, true);  // tile 128: 64-row steps and boxes
  k = choose_kernels(c128, kH200, Switches{});
  EXPECT_EQ(k.dkdv_block_m, 64);
  EXPECT_TRUE(k.dkdv_tma);
  // Varlen: the packed totals count.
  c.plan.varlen = true;
  c.s_q = c.s_kv = 100;
  c.total_q = c.total_kv = 300;
  EXPECT_TRUE(choose_kernels(c, kH200, Switches{}).fwd_tma);
}

TEST(CudaDispatch, TileOrderL2Sections) {
  // An H200 as the runtime reports it: 50 MiB of L2, 132 SMs; the K / V budget is 5/8 of it (32768000 bytes).
  const DeviceProps h200{9, 0, true, 50 << 20, 132};
  // MHA (64 pairs, 32 query blocks each): 2 MiB of K / V per head -> 15 heads fit (above two waves' 9), evened out
  // to 5 sections of 13.
  const Call mha = make_call(SINKATTN_BF16, 128, 4096, 32, 32, -1, 0, true);
  const KernelChoice m = choose_kernels(mha, h200, Switches{});
  EXPECT_EQ(m.fwd_section, 13);
  EXPECT_EQ(m.summary(Pass::kForward),
            "hopper fwd (wgmma, warp-specialised: producer warp + 2 consumer warpgroups, persistent), tile 128 x 128, "
            "TMA, L2 sections of 13 heads");
  EXPECT_FALSE(has(m.summary(Pass::kBackward), "L2"));  // the dK dV kernel keeps the plain order
  // MHA at s 16384 (b 1, 32 pairs): 8 MiB per head -> 3, below two waves' 3 (128 query blocks: ceil(264 / 128) = 3).
  Call mha16k = make_call(SINKATTN_BF16, 128, 16384, 32, 32, -1, 0);
  mha16k.b = 1;
  EXPECT_EQ(choose_kernels(mha16k, h200, Switches{}).fwd_section, 3);
  // s 1024: 0.5 MiB of K / V per head, 62 of 64 fit -> 2 sections of 32.
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 128, 1024, 32, 32, -1, 0), h200, Switches{}).fwd_section, 32);
  Call wide = make_call(SINKATTN_BF16, 128, 1024, 32, 32, -1, 0);
  wide.s_kv = 16384;  // 8 MiB of K / V per head: 3 fit, but 8 query blocks ask for 33 pairs -> 2 sections of 32
  EXPECT_EQ(choose_kernels(wide, h200, Switches{}).fwd_section, 32);
  // Everything fits: one section.
  EXPECT_EQ(choose_kernels(make_call(SINKATTN_BF16, 128, 512, 32, 32, -1, 0), h200, Switches{}).fwd_section, 0);
  // GPT-OSS: the K / V of all 16 KV heads fit (one section).
  const KernelChoice g = choose_kernels(make_call(SINKATTN_BF16, 64, 4096, 64, 8, -1, 0, true), h200, Switches{});
  EXPECT_EQ(g.fwd_section, 0);
  EXPECT_FALSE(has(g.summary(Pass::kForward), "L2 sections"));
  // GQA at s 32768: 8 MiB per KV head -> 3 KV heads = 24 query heads per section (whole groups).
  Call gqa = make_call(SINKATTN_BF16, 64, 32768, 64, 8, -1, 0);
  gqa.b = 1;
  EXPECT_EQ(choose_kernels(gqa, h200, Switches{}).fwd_section, 24);
  // The switch: pairs per section (0: none); an unknown L2 (the other tests' devices): no sections.
  Switches sw;
  sw.fwd_section = 0;
  EXPECT_EQ(choose_kernels(mha, h200, sw).fwd_section, 0);
  sw.fwd_section = 9;
  EXPECT_EQ(choose_kernels(mha, h200, sw).fwd_section, 9);
  sw.fwd_section = 64;  // every pair: one section
  EXPECT_EQ(choose_kernels(mha, h200, sw).fwd_section, 0);
  EXPECT_EQ(choose_kernels(mha, kH200, Switches{}).fwd_section, 0);
  // Off Hopper (the sm_80 kernels keep the plain order).
  EXPECT_EQ(choose_kernels(mha, DeviceProps{8, 0, true, 40 << 20, 108}, Switches{}).fwd_section, 0);
}

TEST(CudaDispatch, Fp32Path) {
  const KernelChoice k = choose_kernels(make_call(SINKATTN_F32, 64, 512, 4, 4, -1, 0, true), kH200, Switches{});
  EXPECT_TRUE(k.fp32);
  EXPECT_TRUE(has(k.summary(Pass::kForward), "fp32 SIMT"));
  EXPECT_TRUE(has(k.summary(Pass::kBackward), "no float atomics"));
}

// The switch table is the one definition of the switches: every row sets something (no row without an effect), its
// value "0" leaves a flag off, and the table's rows are the C ABI's rows, in order.
TEST(CudaDispatch, SwitchTable) {
  int n = 0;
  const SwitchDef* table = switch_table(&n);
  ASSERT_GE(n, 1);
  int n_docs = 0;
  const sinkattn_switch_t* docs = switch_docs(&n_docs);
  ASSERT_EQ(n_docs, n);
  const auto same = [](const Switches& a, const Switches& b) {
    return a.no_sm90 == b.no_sm90 && a.no_tma == b.no_tma && a.det_sm80 == b.det_sm80 && a.no_decode == b.no_decode &&
           a.no_pdl == b.no_pdl && a.no_window_variant == b.no_window_variant &&
           a.no_decode_short == b.no_decode_short && a.no_decode_cluster == b.no_decode_cluster &&
           a.fwd_section == b.fwd_section;
  };
  static std::string name, value;  // the one variable the lookup below sets
  const auto env = [](const char* v) -> const char* { return v == name ? value.c_str() : nullptr; };
  name.clear();
  EXPECT_TRUE(same(switches_from(env), Switches{}));
  for (int i = 0; i < n; ++i) {
    const sinkattn_switch_t& d = table[i].doc;
    SCOPED_TRACE(d.name);
    EXPECT_STREQ(docs[i].name, d.name);
    EXPECT_EQ(std::string(d.name).rfind("SINKATTN_CUDA_", 0), 0u);
    for (const char* text : {d.values, d.effect, d.use}) EXPECT_GT(std::string(text).size(), 0u);
    name = d.name;
    value = "1";
    EXPECT_FALSE(same(switches_from(env), Switches{}));
    value = "";  // set but empty: unset
    EXPECT_TRUE(same(switches_from(env), Switches{}));
    for (int j = 0; j < i; ++j) EXPECT_STRNE(table[j].doc.name, d.name);
  }
  name = "SINKATTN_CUDA_NO_SM90";
  value = "0";
  EXPECT_FALSE(switches_from(env).no_sm90);
  name = "SINKATTN_CUDA_FWD_SECTION";
  value = "0";
  EXPECT_EQ(switches_from(env).fwd_section, 0);
  value = "12";
  EXPECT_EQ(switches_from(env).fwd_section, 12);
}

// Every kernel family has its texts; the rules name the switches that change them and the window rule's numbers.
TEST(CudaDispatch, KernelFamilies) {
  int n = 0;
  const sinkattn_kernel_family_t* f = kernel_families(&n);
  ASSERT_GE(n, 1);
  std::string all;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(f[i].name);
    for (const char* text : {f[i].name, f[i].sources, f[i].runs_when, f[i].rule}) EXPECT_GT(std::string(text).size(), 0u);
    EXPECT_LE(std::string(f[i].runs_when).size(), 140u);  // one short line (`sinkattn info` wraps it)
    all += std::string(f[i].sources) + " " + f[i].runs_when + " " + f[i].rule + "\n";
  }
  int ns = 0;
  const SwitchDef* table = switch_table(&ns);
  for (int i = 0; i < ns; ++i) EXPECT_TRUE(has(all, table[i].doc.name)) << table[i].doc.name;
  for (const std::string s : {"src/cuda/hopper/fwd_sm90_ws.cuh", "src/cuda/hopper/bwd_dkdv_sm90.cuh",
                              "src/cuda/hopper/bwd_dkdv_sm90_wide.cuh", "src/cuda/decode/", "src/cuda/fp32/"})
    EXPECT_TRUE(has(all, s)) << s;
  EXPECT_TRUE(has(all, std::to_string(tiles::kSm90FwdWindowKeys) + " keys per"));
  EXPECT_TRUE(has(all, std::to_string(tiles::kSm90FwdMinWindowKeys) + " keys per"));
}

// The compiled head-dim tiles are one list (tiles::kHeadDimTiles): the tile text (which the backend's description and
// its unsupported-head-dim message print) names each, and each tile is where its own head dim lands.
TEST(CudaDispatch, TileTextFollowsTheTileList) {
  const std::string t = head_dim_tiles_text(" ");
  for (int tile : tiles::kHeadDimTiles) {
    EXPECT_TRUE(has(t, std::to_string(tile))) << tile;
    EXPECT_EQ(tiles::head_dim_tile(tile, tile), tile);
  }
  EXPECT_EQ(std::count(t.begin(), t.end(), ' ') + 1, static_cast<long>(std::size(tiles::kHeadDimTiles)));
}

}  // namespace
}  // namespace sinkattn::cuda
