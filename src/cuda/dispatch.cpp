// See dispatch.hpp. Host-only C++: compiled into the CUDA backend and, alone, into tests/test_cuda_dispatch.cpp.
#include "cuda/dispatch.hpp"

#include <cstdlib>
#include <cstring>

#include "cuda/tiles.hpp"

namespace sinkattn::cuda {

namespace {

std::string tile_str(int a, int b) { return std::to_string(a) + " x " + std::to_string(b); }

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
    return x;
  }();
  return s;
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

  // Why the Hopper kernels cannot run this call ("" when they can).
  std::string no90 = hopper_unavailable(dev, sw);
  if (no90.empty() && !tiles::has_sm90(k.tile))
    no90 = "no Hopper kernel for head-dim tile " + std::to_string(k.tile) + " (tiles 64 and 128)";
  if (no90.empty() && extra)
    no90 = std::string("the Hopper kernels have no ") +
           (bias && dropout ? "bias or dropout" : bias ? "bias" : "dropout");

  // ---- forward ----
  if (no90.empty() && c.window_left >= 0 && c.window_right >= 0) {
    const int64_t keys = tiles::fwd_sm90_block_m(k.tile) + c.window_left + c.window_right;
    if (keys < tiles::kSm90FwdMinWindowKeys)
      k.fwd_why = "the window spans " + std::to_string(keys) + " keys per " +
                  std::to_string(tiles::fwd_sm90_block_m(k.tile)) + " query rows (fewer than " +
                  std::to_string(tiles::kSm90FwdMinWindowKeys) + ": the sm_80 forward is faster there)";
  }
  if (no90.empty() && k.fwd_why.empty()) {
    k.fwd = FwdKernel::kSm90;
    k.fwd_block_m = tiles::fwd_sm90_block_m(k.tile);
    k.fwd_block_n = tiles::fwd_sm90_block_n(k.tile);
    // TMA boxes are 64 columns x one block of rows: both must fit the tensor (launch.cuh, make_rows_map).
    k.fwd_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.fwd_block_m && rows_kv >= k.fwd_block_n;
  } else {
    if (k.fwd_why.empty()) k.fwd_why = no90;
    k.fwd = extra ? FwdKernel::kSm80Extra : FwdKernel::kSm80;
    k.fwd_block_m = tiles::fwd_block_m(k.tile);
    k.fwd_block_n = extra ? tiles::fwd_block_n(k.tile) : tiles::fwd_block_n_lean(k.tile);
  }

  // ---- backward ----
  if (bias)
    k.dq = DqPath::kDqKernel;  // the dq kernel writes dS for d_bias
  else if (c.deterministic)
    k.dq = no90.empty() && !sw.det_sm80 ? DqPath::kFusedOrdered : DqPath::kDqKernel;
  else
    k.dq = DqPath::kFusedAtomic;
  if (no90.empty() && k.dq != DqPath::kDqKernel) {
    k.dkdv = DkvKernel::kSm90;
    k.dkdv_block_n = tiles::dkdv_sm90_block_n(k.tile);
    k.dkdv_block_m = tiles::dkdv_sm90_block_m(k.tile);
    k.dkdv_tma = !sw.no_tma && c.d >= 64 && c.d_v >= 64 && rows_q >= k.dkdv_block_m;
  } else {
    k.bwd_why = no90.empty() ? "SINKATTN_CUDA_DET_SM80 is set" : no90;
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
      case FwdKernel::kSm80: s = "sm80 fwd (mma.sync)"; break;
      case FwdKernel::kSm80Extra: s = "sm80 fwd (mma.sync, bias / dropout variant)"; break;
    }
    s += ", tile " + tile_str(fwd_block_m, fwd_block_n);
    if (fwd == FwdKernel::kSm90) s += fwd_tma ? ", TMA" : ", cp.async";
    if (!fwd_why.empty()) s += ": " + fwd_why;
    return s;
  }
  if (dq == DqPath::kDqKernel) s = "sm80 dq kernel, tile " + tile_str(dq_block_m, dq_block_n) + " + ";
  switch (dkdv) {
    case DkvKernel::kSm90: s += "hopper dK dV (wgmma)"; break;
    case DkvKernel::kSm80: s += "sm80 dK dV (mma.sync)"; break;
    case DkvKernel::kSm80Extra: s += "sm80 dK dV (mma.sync, bias / dropout variant)"; break;
  }
  s += ", tile " + tile_str(dkdv_block_n, dkdv_block_m);
  if (dkdv == DkvKernel::kSm90) s += dkdv_tma ? ", TMA" : ", cp.async";
  switch (dq) {
    case DqPath::kDqKernel: s += ", no float atomics"; break;
    case DqPath::kFusedAtomic: s += ", dq fused (fp32 atomics)"; break;
    case DqPath::kFusedOrdered: s += ", dq fused in a fixed order (per-query-block semaphores, deterministic)"; break;
  }
  if (!bwd_why.empty()) s += ": " + bwd_why;
  return s;
}

std::string dispatch_rules() {
  return "kernel choice (src/cuda/dispatch.cpp): fp32 -> SIMT fp32 kernels; fp16 / bf16 -> the smallest head-dim tile "
         ">= max(d, d_v) of 32 64 96 128 192 256; the Hopper (wgmma, TMA) kernels on compute capability 9.0 when the "
         "library carries sm_90a code, for tiles 64 and 128 without bias or dropout (forward: not for windows "
         "spanning fewer than " +
         std::to_string(tiles::kSm90FwdMinWindowKeys) +
         " keys per 128 query rows); backward dq: fused into the dK dV kernel with fp32 atomics (deterministic = 0), "
         "fused in a fixed key-block order under per-query-block semaphores on the Hopper kernel (deterministic = "
         "1), or the separate sm_80 dq kernel (deterministic = 1 off Hopper, and with a bias); the sm_80 kernels "
         "run everything else (a bias / dropout variant when either is present). Switches: SINKATTN_CUDA_NO_SM90=1, "
         "SINKATTN_CUDA_NO_TMA=1, SINKATTN_CUDA_DET_SM80=1";
}

}  // namespace sinkattn::cuda
