// CUDA backend (sm_80+): the Backend interface (src/core/backend.hpp), workspace, launch sequence.
// The kernels live in one translation unit per head-dim tile (inst_hd*.cu); which of them run is decided by the
// dispatch unit alone (dispatch.cpp: choose_kernels, from the call, the device's properties and the environment
// switches). This file resolves a Call into kernel Params (params.cuh), checks what the kernels support (SPEC.md
// section 4: anything they do not support is rejected with the reason, never silently dropped), lays out the
// workspace from the kernel choice (same code path for the size query and the run), and launches:
//   forward:  the decode kernels [+ split combine] (decode/decode.hpp) or the forward kernel [+ rng_state]
//   backward: [zero the ordered dq's semaphores ->] preprocess (D, LSE2, d_sinks partials; zeroes the fp32 dq
//             accumulator of a fused dq) ->
//             dq kernel:           d_sinks finalize -> dq kernel -> dK dV kernel
//             fused dq (atomics):  dK dV kernel with fused dQ -> dq convert (+ d_sinks finalize)
//             fused dq (ordered):  Hopper dK dV kernel, fixed order -> dq convert (+ d_sinks finalize)
//             [-> d_bias reduce over broadcast dims]
//             The Hopper dK dV kernel and the convert after it with programmatic dependent launch (KernelChoice::pdl).
#include <cuda_runtime.h>

#include <cmath>
#include <iterator>
#include <mutex>
#include <string>
#include <utility>

#include "core/backend.hpp"
#include "core/philox.hpp"
#include "cuda/decode/decode.hpp"
#include "cuda/dispatch.hpp"
#include "cuda/dq_order.hpp"
#include "cuda/fp32/f32.hpp"
#include "cuda/kernels.hpp"
#include "cuda/tiles.hpp"

namespace sinkattn {

namespace {

using cuda::Params;

Status device_error(const char* what, cudaError_t e) {
  return Status{SINKATTN_ERR_DEVICE, std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" +
                                         cudaGetErrorString(e) + ")"};
}

#define SINKATTN_CUDA_CHECK(what, expr)                    \
  do {                                                     \
    cudaError_t _e = (expr);                               \
    if (_e != cudaSuccess) return device_error(what, _e);  \
  } while (0)

using cuda::tiles::head_dim_tile;

// The properties choose_kernels needs, of the current device.
// The properties of device `dev` (cc 0.0 when they cannot be read).
cuda::DeviceProps read_device_props(int dev) {
  cuda::DeviceProps d;
#ifdef SINKATTN_CUDA_SM90A
  d.sm90a_code = true;
#endif
  if (cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.cc_minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    d.cc_major = d.cc_minor = 0;
  }
  int l2 = 0;
  if (d.cc_major > 0) {
    if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess) {
      d.l2_bytes = l2;
    } else {
      cudaGetLastError();
      d.sms = d.smem_per_sm = 0;
    }
  }
  return d;
}

// The current device's properties, read once per device and process (they do not change while it runs; every call
// asks the dispatch, so the attribute queries stay off the per-call path). No current device: cc 0.0, not cached.
cuda::DeviceProps current_device_props() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return read_device_props(-1);
  }
  constexpr int kCached = 64;
  if (dev < 0 || dev >= kCached) return read_device_props(dev);
  static std::once_flag once[kCached];
  static cuda::DeviceProps props[kCached];
  std::call_once(once[dev], [dev] { props[dev] = read_device_props(dev); });
  return props[dev];
}

cuda::KernelChoice kernel_choice(const Call& c, const cuda::DeviceProps& dev) {
  return cuda::choose_kernels(c, dev, cuda::switches_from_env());
}

const char* dtype_str(sinkattn_dtype_t t) {
  switch (t) {
    case SINKATTN_F32: return "fp32";
    case SINKATTN_F16: return "fp16";
    case SINKATTN_BF16: return "bf16";
    default: return "non-float";
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Every q/k/v-like tensor is read or written in 16-byte (8-element) rows chunks: base pointer 16-byte
// aligned and batch/row/head strides multiples of 8 elements.
Status check_rows(const char* name, const sinkattn_tensor_t& t, const RowStrides& st, bool shape_only) {
  if (!shape_only && t.data != nullptr && !aligned16(t.data))
    return unsupported(std::string(name) + ": data pointer must be 16-byte aligned");
  if (st.b % 8 != 0 || st.s % 8 != 0 || st.h % 8 != 0)
    return unsupported(std::string(name) +
                       ": batch, row and head strides must be multiples of 8 elements (16-byte rows), got b=" +
                       std::to_string(st.b) + " s=" + std::to_string(st.s) + " h=" + std::to_string(st.h));
  return Status::ok();
}

// Workspace layout (backward): offsets in bytes, each region 256-byte aligned.
struct Workspace {
  size_t lse2 = 0, dp = 0, dsink = 0, dbias = 0, dq = 0, dq_sem = 0, total = 0;
  bool has_dq = false, has_dq_sem = false;
  int n_pre_blocks = 0;
  int64_t rows_total_q = 0;
  int64_t n_dq_sem = 0;  // unsigned counters of the ordered dq (dq_order.hpp)
  int64_t dbias_heads = 0;  // heads of the d_bias workspace (KernelChoice::dbias_ws_heads)
};

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

Workspace workspace_layout(const Call& c, const cuda::KernelChoice& kc) {
  Workspace w;
  if (c.pass != Pass::kBackward) return w;
  w.rows_total_q = c.plan.varlen ? c.total_q : c.b * c.s_q;
  w.n_pre_blocks = static_cast<int>((c.s_q + cuda::kPreRows - 1) / cuda::kPreRows);
  size_t off = 0;
  w.lse2 = off;
  off = align256(off + sizeof(float) * c.h_q * w.rows_total_q);
  w.dp = off;
  off = align256(off + sizeof(float) * c.h_q * w.rows_total_q);
  w.dsink = off;
  off = align256(off + sizeof(float) * c.h_q * c.b * w.n_pre_blocks);
  if (c.plan.bias == Use::kRequired) {
    w.dbias = off;
    w.dbias_heads = kc.dbias_ws_heads(c);
    off = align256(off + sizeof(float) * c.b * w.dbias_heads * c.s_q * c.s_kv);
  }
  // fp32 dq accumulator of the fused dq (the dK dV kernel adds to it; the dq kernel, the dispatch's choice with a
  // bias or for deterministic = 1 off Hopper, needs none), and the ordered dq's ticket and semaphores.
  if (kc.dq != cuda::DqPath::kDqKernel) {
    w.has_dq = true;
    w.dq = off;
    off = align256(off + sizeof(float) * c.h_q * w.rows_total_q * c.d);
  }
  if (kc.dq == cuda::DqPath::kFusedOrdered) {
    w.has_dq_sem = true;
    // h_q head slots per query block of the kernel's step (KernelChoice::dkdv_block_m, what the kernel indexes by):
    // a turn's slot is its query head, or its KV head for the bias variants' one-turn-per-query-block unit
    // (dq_order.hpp, DqTurns).
    w.n_dq_sem = cuda::dq_sem_count(c.b, c.h_q, (c.s_q + kc.dkdv_block_m - 1) / kc.dkdv_block_m);
    w.dq_sem = off;
    off = align256(off + sizeof(unsigned) * w.n_dq_sem);
  }
  w.total = off;
  return w;
}

cuda::RowStrides3 rs(const RowStrides& r) { return {r.b, r.s, r.h}; }

Params make_params(const Call& c, const Workspace& w) {
  const sinkattn_params_t& p = *c.p;
  Params k{};  // every field zero (null pointers, no bias / dropout / paging) until set below
  const bool bwd = c.pass == Pass::kBackward;
  k.q = p.q.data;
  k.k = p.k.data;
  k.v = p.v.data;
  k.out = p.out.data;
  k.softmax_lse = static_cast<float*>(p.softmax_lse.data);
  k.q_st = rs(c.q);
  k.k_st = rs(c.k);
  k.v_st = rs(c.v);
  k.out_st = rs(c.out);
  k.lse_b = c.lse.b;
  k.lse_h = c.lse.h;
  k.lse_s = c.lse.s;
  if (c.plan.sinks == Use::kRequired) {
    k.sinks = static_cast<const float*>(p.sinks.data);
    k.sinks_stride = p.sinks.strides[0];
  }
  if (c.plan.bias == Use::kRequired) {
    k.bias = p.bias.data;
    k.bias_b = c.bias.b;
    k.bias_h = c.bias.h;
    k.bias_i = c.bias.i;
    k.bias_j = c.bias.j;
    k.bias_f32 = c.bias_dtype == SINKATTN_F32;
    k.bias_shape_b = static_cast<int>(p.bias.shape[0]);
    k.bias_shape_h = static_cast<int>(p.bias.shape[1]);
  }
  // Batch tensors (device pointers; common/seq.hpp's BatchTensors, whose members Params repeats).
  const BatchTensors bt = batch_tensors(c);
  k.cu_seqlens_q = bt.cu_seqlens_q;
  k.cu_seqlens_kv = bt.cu_seqlens_kv;
  k.seqused_kv = bt.seqused_kv;
  k.seqlens_q = bt.seqlens_q;
  k.seqlens_kv = bt.seqlens_kv;
  k.cu_q_st = bt.cu_q_st;
  k.cu_kv_st = bt.cu_kv_st;
  k.seqused_st = bt.seqused_st;
  k.seqlens_q_st = bt.seqlens_q_st;
  k.seqlens_kv_st = bt.seqlens_kv_st;
  k.varlen = bt.varlen;
  if (c.paged.on) {  // paged KV (SPEC 1): seqused_kv is required, cu_seqlens_kv absent
    k.page_table = bt.page_table;
    k.pt_st_n = c.paged.pt_n;
    k.pt_st_p = c.paged.pt_p;
    k.page_size = static_cast<int>(c.paged.page_size);
    k.page_div = FastDivmod(static_cast<uint32_t>(c.paged.page_size));
  }
  k.num_splits = 1;
  k.b = static_cast<int>(c.b);
  k.s_q = static_cast<int>(c.s_q);
  k.s_kv = static_cast<int>(c.s_kv);
  k.h_q = static_cast<int>(c.h_q);
  k.h_kv = static_cast<int>(c.h_kv);
  k.group = static_cast<int>(c.group);
  k.group_div = FastDivmod(static_cast<uint32_t>(c.group));
  k.d = static_cast<int>(c.d);
  k.d_v = static_cast<int>(c.d_v);
  k.rows_total_q = w.rows_total_q;
  k.rows_total_kv = c.plan.varlen ? c.total_kv : c.b * c.s_kv;
  k.softmax_type = c.softmax_type;
  k.softmax_scale = c.softmax_scale;
  k.scale_log2 = c.softmax_scale * 1.4426950408889634f;  // log2(e)
  // -1 or clamped to s_q + s_kv < 2^30 by resolve_call (common/mask.hpp): fits the kernels' 32-bit mask arithmetic.
  k.window_left = static_cast<int>(c.window_left);
  k.window_right = static_cast<int>(c.window_right);
  k.align_bottom_right = c.alignment == SINKATTN_ALIGN_BOTTOM_RIGHT;
  k.dropout = c.plan.dropout;
  k.dropout_threshold = c.dropout_threshold;
  k.dropout_rscale = static_cast<float>(1.0 / (1.0 - c.dropout_p));
  k.dropout_log2_rscale = static_cast<float>(std::log2(static_cast<double>(k.dropout_rscale)));
  k.seed = p.seed;
  k.offset = p.offset;
  if (bwd) {
    if (c.plan.rng_state == Use::kRequired) {
      k.rng_in = static_cast<const uint64_t*>(p.rng_state.data);
      k.rng_in_stride = p.rng_state.strides[0];
    }
    k.d_out = p.d_out.data;
    k.dout_st = rs(c.d_out);
    k.dq = p.dq.data;
    k.dk = p.dk.data;
    k.dv = p.dv.data;
    k.dq_st = rs(c.dq);
    k.dk_st = rs(c.dk);
    k.dv_st = rs(c.dv);
    if (c.plan.d_lse == Use::kRequired) {
      k.d_lse = static_cast<const float*>(p.d_lse.data);
      k.dlse_b = c.d_lse.b;
      k.dlse_h = c.d_lse.h;
      k.dlse_s = c.d_lse.s;
    }
    if (c.plan.d_sinks == Use::kRequired) k.d_sinks = static_cast<float*>(p.d_sinks.data);
    if (c.plan.d_bias == Use::kRequired) {
      k.d_bias = p.d_bias.data;
      k.dbias_b = c.d_bias.b;
      k.dbias_h = c.d_bias.h;
      k.dbias_i = c.d_bias.i;
      k.dbias_j = c.d_bias.j;
    }
    char* ws = static_cast<char*>(p.workspace);
    k.ws_lse2 = reinterpret_cast<float*>(ws + w.lse2);
    k.ws_dp = reinterpret_cast<float*>(ws + w.dp);
    k.ws_dsink = reinterpret_cast<float*>(ws + w.dsink);
    k.ws_dbias = c.plan.bias == Use::kRequired ? reinterpret_cast<float*>(ws + w.dbias) : nullptr;
    k.ws_dbias_heads = static_cast<int>(w.dbias_heads);
    k.ws_dq = w.has_dq ? reinterpret_cast<float*>(ws + w.dq) : nullptr;
    k.ws_dq_sem = w.has_dq_sem ? reinterpret_cast<unsigned*>(ws + w.dq_sem) : nullptr;
    k.n_pre_blocks = w.n_pre_blocks;
  } else if (p.rng_seed_offset.rank > 0 && p.rng_seed_offset.data != nullptr) {
    k.rng_in = static_cast<const uint64_t*>(p.rng_seed_offset.data);
    k.rng_in_stride = p.rng_seed_offset.strides[0];
  }
  return k;
}

template <typename T, int HD>
cudaError_t run_tile(const Params& k, const cuda::KernelChoice& kc, bool backward, cudaStream_t st) {
  if (!backward) return cuda::launch_fwd<T, HD>(k, kc, st);
  if (kc.dq == cuda::DqPath::kDqKernel) {  // separate dq kernel, no float atomics
    cudaError_t e = cuda::launch_bwd_dq<T, HD>(k, kc, st);
    if (e != cudaSuccess) return e;
  }
  return cuda::launch_bwd_dkdv<T, HD>(k, kc, st);
}

// The launchers of kc.tile, one instantiation (inst_hd<tile>.cu) per entry of tiles::kHeadDimTiles, the one list of
// the compiled tiles: a tile added there without its inst_hd<tile>.cu fails to link.
template <typename T, size_t... I>
cudaError_t run_main_tiles(const cuda::KernelChoice& kc, const Params& k, bool backward, cudaStream_t st,
                           std::index_sequence<I...>) {
  cudaError_t e = cudaErrorInvalidValue;
  (void)((kc.tile == cuda::tiles::kHeadDimTiles[I] &&
          (e = run_tile<T, cuda::tiles::kHeadDimTiles[I]>(k, kc, backward, st), true)) ||
         ...);
  return e;
}

template <typename T>
cudaError_t run_main(const cuda::KernelChoice& kc, const Params& k, bool backward, cudaStream_t st) {
  return run_main_tiles<T>(kc, k, backward, st, std::make_index_sequence<std::size(cuda::tiles::kHeadDimTiles)>{});
}

template <typename T>
Status run_typed(const Call& c, const cuda::KernelChoice& kc, const Workspace& w, const Params& k, cudaStream_t st) {
  const sinkattn_params_t& p = *c.p;
  if (c.pass == Pass::kForward) {
    SINKATTN_CUDA_CHECK("forward kernel", run_main<T>(kc, k, false, st));
    if (p.rng_state.rank > 0 && p.rng_state.data != nullptr)
      SINKATTN_CUDA_CHECK("rng_state kernel",
                          cuda::launch_rng_state(k.rng_in, k.rng_in_stride, k.seed, k.offset,
                                                 static_cast<uint64_t*>(p.rng_state.data), p.rng_state.strides[0],
                                                 st));
    return Status::ok();
  }
  // The d_bias workspace is not cleared: the d_bias kernel reads only the elements the main kernels wrote
  // (bwd_small.cu, dbias_reduce_kernel).
  // The deterministic dq's semaphores are zeroed before the preprocess: the Hopper dK dV kernel, launched with
  // programmatic dependent launch (KernelChoice::pdl), takes its ticket before it waits for the preprocess.
  if (k.ws_dq_sem != nullptr)
    SINKATTN_CUDA_CHECK("dq semaphore memset", cudaMemsetAsync(k.ws_dq_sem, 0, sizeof(unsigned) * w.n_dq_sem, st));
  SINKATTN_CUDA_CHECK("backward preprocess kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallPreprocess, st));
  if (k.d_sinks != nullptr && !cuda::dq_convert_runs(k))
    SINKATTN_CUDA_CHECK("d_sinks kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallDSinks, st));
  // The dq accumulator (ws_dq) is zeroed by the preprocess kernel (every row a sequence owns: the only rows the main
  // kernels add to and the dq convert reads), but for the rows the deterministic dq writer's first turn stores
  // (KernelChoice::dq_first_store).
  SINKATTN_CUDA_CHECK("backward main kernels", run_main<T>(kc, k, true, st));
  // The convert also writes d_sinks; with kc.pdl it starts during the dK dV kernel's last wave.
  if (cuda::dq_convert_runs(k))
    SINKATTN_CUDA_CHECK("dq convert kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallDqConvert, st, kc.pdl));
  if (k.d_bias != nullptr)
    SINKATTN_CUDA_CHECK("d_bias kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallDBias, st));
  return Status::ok();
}

class CudaBackend final : public Backend {
 public:
  sinkattn_backend_t id() const override { return SINKATTN_BACKEND_CUDA; }
  const char* name() const override { return "cuda"; }

  Status supports(const Call& c) const override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      return unsupported("no CUDA device found");
    }
    if (c.memory != Memory::kDevice)
      return unsupported("tensors are in host memory (the CUDA backend needs device memory)");
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major < 8) return unsupported("needs compute capability 8.0 or newer, found " + std::to_string(major) + ".x");
    if (c.dtype == SINKATTN_F32) return cuda_f32::supports(c);  // plain fp32 SIMT path (src/cuda/fp32)
    if (c.dtype != SINKATTN_F16 && c.dtype != SINKATTN_BF16)
      return unsupported(std::string("q: dtype ") + dtype_str(c.dtype) + " not supported");
    if (c.d % 8 != 0 || c.d_v % 8 != 0 || head_dim_tile(c.d, c.d_v) == 0)
      return unsupported("q: head dims d = " + std::to_string(c.d) + ", d_v = " + std::to_string(c.d_v) +
                         " not supported (multiples of 8 up to 256; tiles " +
                         cuda::head_dim_tiles_text(", ") + ")");
    if (c.b > 65535 || c.h_q > 65535)
      return unsupported("q: b and h_q must be <= 65535 (grid dimensions)");
    if (c.s_q + c.s_kv >= (int64_t{1} << 30))
      return unsupported("s_q + s_kv (max_seqlen_q + max_seqlen_kv for varlen) must be below 2^30 "
                         "(32-bit mask arithmetic, common/mask.hpp)");
    if (c.pass == Pass::kBackward && c.plan.bias == Use::kRequired &&
        static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv * 4.0 > 64.0 * (1ull << 30))
      return unsupported("d_bias: needs an fp32 workspace of b*h_q*s_q*s_kv floats, over 64 GiB here");
    const sinkattn_params_t& p = *c.p;
    const bool shape_only = p.q.data == nullptr;
    SINKATTN_RETURN_IF_ERROR(check_rows("q", p.q, c.q, shape_only));
    SINKATTN_RETURN_IF_ERROR(check_rows("k", p.k, c.k, shape_only));
    SINKATTN_RETURN_IF_ERROR(check_rows("v", p.v, c.v, shape_only));
    if (c.pass == Pass::kBackward) {
      SINKATTN_RETURN_IF_ERROR(check_rows("d_out", p.d_out, c.d_out, shape_only));
      SINKATTN_RETURN_IF_ERROR(check_rows("dq", p.dq, c.dq, shape_only));
      SINKATTN_RETURN_IF_ERROR(check_rows("dk", p.dk, c.dk, shape_only));
      SINKATTN_RETURN_IF_ERROR(check_rows("dv", p.dv, c.dv, shape_only));
      // out is read element-wise in the backward: any strides.
    } else {
      SINKATTN_RETURN_IF_ERROR(check_rows("out", p.out, c.out, shape_only));
    }
    if (c.paged.on) {  // the kernels index the page table with 32-bit integers
      const int64_t span = c.b * c.paged.pt_n + c.paged.max_pages * c.paged.pt_p;
      if (span >= (int64_t{1} << 31) || c.paged.page_size >= (int64_t{1} << 30))
        return unsupported("page_table: spans 2^31 or more entries (or page_size >= 2^30)");
    }
    return Status::ok();
  }

  Status workspace_size(const Call& c, size_t* bytes) const override {
    if (c.dtype == SINKATTN_F32) return cuda_f32::workspace_size(c, bytes);
    const cuda::DeviceProps dev = current_device_props();
    const cuda::KernelChoice kc = kernel_choice(c, dev);
    *bytes = workspace_layout(c, kc).total;
    if (c.pass == Pass::kForward && kc.fwd == cuda::FwdKernel::kDecode)
      *bytes = cuda::plan_decode(c, dev, kc.decode_short, kc.decode_cluster).bytes;  // the split partials, if any
    return Status::ok();
  }

  // The kernels' summary; a decode forward adds its plan's key splits and where they are combined.
  std::string kernel_report(const Call& c) const override {
    const cuda::DeviceProps dev = current_device_props();
    const cuda::KernelChoice kc = kernel_choice(c, dev);
    std::string s = kc.summary(c.pass);
    if (c.pass == Pass::kForward && kc.fwd == cuda::FwdKernel::kDecode && c.dtype != SINKATTN_F32) {
      const cuda::DecodePlan dp = cuda::plan_decode(c, dev, kc.decode_short, kc.decode_cluster);
      if (dp.use)
        s += "; " + std::to_string(dp.num_splits) + (dp.num_splits == 1 ? " key split"
                                                      : dp.cluster ? " key splits, one cluster"
                                                                   : " key splits + the combine kernel");
    }
    return s;
  }

  Status run(const Call& c) const override {
    if (c.dtype == SINKATTN_F32) return cuda_f32::run(c);
    const cuda::DeviceProps dev = current_device_props();
    const cuda::KernelChoice kc = kernel_choice(c, dev);
    const Workspace w = workspace_layout(c, kc);
    if (c.pass == Pass::kBackward && c.p->workspace_bytes < w.total)
      return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL, "workspace: the cuda backend got " +
                                                          std::to_string(c.p->workspace_bytes) + " bytes, needs " +
                                                          std::to_string(w.total)};
    if (c.pass == Pass::kBackward && w.total > 0 && c.p->workspace == nullptr)
      return invalid("workspace: NULL but the CUDA backward needs " + std::to_string(w.total) + " bytes");
    Params k = make_params(c, w);
    k.fwd_section = kc.fwd_section;
    k.dq_store_block_m = kc.dq_first_store ? kc.dkdv_block_m : 0;
    cudaStream_t st = static_cast<cudaStream_t>(c.p->stream);
    cudaGetLastError();  // clear any stale error of the caller
    if (c.pass == Pass::kForward && kc.fwd == cuda::FwdKernel::kDecode) {
      const cuda::DecodePlan dp = cuda::plan_decode(c, dev, kc.decode_short, kc.decode_cluster);
      if (!dp.use) return internal_error("cuda backend: the dispatch chose the decode kernels, their plan refused: " +
                                         dp.why_not);
      return run_decode(c, dp, kc.decode_pdl, k, st);
    }
    if (c.dtype == SINKATTN_F16) return run_typed<__half>(c, kc, w, k, st);
    return run_typed<__nv_bfloat16>(c, kc, w, k, st);
  }

  // Forward on the decode kernels (decode/decode.hpp) [+ rng_state].
  static Status run_decode(const Call& c, const cuda::DecodePlan& dp, bool pdl, Params& k, cudaStream_t st) {
    if (c.p->workspace_bytes < dp.bytes || (dp.bytes > 0 && c.p->workspace == nullptr))
      return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL, "workspace: the cuda backend got " +
                                                          std::to_string(c.p->workspace_bytes) +
                                                          " bytes, the decode forward needs " + std::to_string(dp.bytes)};
    cuda::bind_decode(dp, c.p->workspace, &k);
    SINKATTN_CUDA_CHECK("decode kernels", c.dtype == SINKATTN_F16
                                              ? cuda::launch_decode<__half>(k, dp, pdl, st)
                                              : cuda::launch_decode<__nv_bfloat16>(k, dp, pdl, st));
    const sinkattn_params_t& p = *c.p;
    if (p.rng_state.rank > 0 && p.rng_state.data != nullptr)
      SINKATTN_CUDA_CHECK("rng_state kernel",
                          cuda::launch_rng_state(k.rng_in, k.rng_in_stride, k.seed, k.offset,
                                                 static_cast<uint64_t*>(p.rng_state.data), p.rng_state.strides[0], st));
    return Status::ok();
  }

  std::string describe() const override {
#ifdef SINKATTN_CUDA_SM90A
    std::string s = "cuda: sm_80+ kernels (mma.sync, cp.async) and Hopper sm_90a kernels (wgmma, TMA)\n";
#else
    std::string s = "cuda: sm_80+ kernels (mma.sync, cp.async); Hopper kernels not built (CMAKE_CUDA_ARCHITECTURES "
                    "without 90a)\n";
#endif
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    if (count == 0) s += "  devices: none found\n";
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop;
      if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
      cuda::DeviceProps dp = current_device_props();
      dp.cc_major = prop.major;
      dp.cc_minor = prop.minor;
      const std::string no90 = cuda::hopper_unavailable(dp, cuda::switches_from_env());
      s += "  device " + std::to_string(i) + ": " + prop.name + ", sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
           std::to_string(prop.totalGlobalMem >> 30) + " GiB; Hopper kernels: " +
           (no90.empty() ? std::string("yes") : "no, " + no90) + "\n";
    }
    s += "  dtypes: fp16, bf16 (tensor cores); fp32 (SIMT kernels: deterministic, slow)\n";
    s += "  head dims: up to 256, d and d_v may differ; fp16 / bf16: multiples of 8, on the kernels of the smallest "
         "tile >= max(d, d_v) of " + cuda::head_dim_tiles_text(" ") + "\n";
    s += "  features: vanilla / off_by_one / learnable sinks; dense, padded and varlen batches (seqused_kv); "
         "strided layouts; GQA / MQA; windows and causal (both alignments); bias and d_bias; dropout (Philox, "
         "bit-identical to the CPU backend); d_lse; paged KV; split-KV decode\n";
    return s;
  }

  const sinkattn_kernel_family_t* kernel_families(int* count) const override {
    return cuda::kernel_families(count);
  }

  const sinkattn_switch_t* switches(int* count) const override { return cuda::switch_docs(count); }
};

}  // namespace

const Backend* cuda_backend() {
  static const CudaBackend backend;
  return &backend;
}

Memory cuda_pointer_memory(const void* ptr) {
  if (ptr == nullptr) return Memory::kHost;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return Memory::kHost;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) ? Memory::kDevice : Memory::kHost;
}

bool cuda_device_to_host(const void* src, void* dst, size_t bytes, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &capture) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;
  if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st) != cudaSuccess ||
      cudaStreamSynchronize(st) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

}  // namespace sinkattn
