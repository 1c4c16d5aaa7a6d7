// CUDA backend (sm_80+): dispatch, workspace, and the Backend interface (src/core/backend.hpp).
// The kernels live in one translation unit per head-dim tile (inst_hd*.cu); this file resolves a Call into
// kernel Params (params.cuh), checks what the kernels support (SPEC.md section 4: anything they do not support
// is rejected with the reason, never silently dropped), lays out the workspace (same code path for the size
// query and the run), and launches:
//   forward:  decode kernels when decode/decode.hpp's plan applies (up to 16 query rows per sequence: decode
//             kernel [+ split combine]), else fwd_kernel (paged KV: its page-table variant) [+ rng_state]
//   backward: preprocess (D, LSE2, d_sinks partials) -> d_sinks finalize ->
//             deterministic:     dq kernel -> dK dV kernel
//             non-deterministic: zero fp32 dq accumulator -> dK dV kernel with fused dQ (atomics) -> dq convert
//             [-> d_bias reduce over broadcast dims]
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/backend.hpp"
#include "core/philox.hpp"
#include "cuda/decode/decode.hpp"
#include "cuda/fp32/f32.hpp"
#include "cuda/kernels.hpp"

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

int head_dim_tile(int64_t d, int64_t d_v) {
  const int64_t m = std::max(d, d_v);
  for (int t : cuda::kHeadDimTiles)
    if (m <= t) return t;
  return 0;
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
    return unsupported(std::string("cuda backend: ") + name + ": data pointer must be 16-byte aligned");
  if (st.b % 8 != 0 || st.s % 8 != 0 || st.h % 8 != 0)
    return unsupported(std::string("cuda backend: ") + name +
                       ": batch, row and head strides must be multiples of 8 elements (16-byte rows), got b=" +
                       std::to_string(st.b) + " s=" + std::to_string(st.s) + " h=" + std::to_string(st.h));
  return Status::ok();
}

// Workspace layout (backward): offsets in bytes, each region 256-byte aligned.
struct Workspace {
  size_t lse2 = 0, dp = 0, dsink = 0, dbias = 0, dq = 0, total = 0;
  bool has_dq = false;
  int n_pre_blocks = 0;
  int64_t rows_total_q = 0;
};

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

Workspace workspace_layout(const Call& c) {
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
    off = align256(off + sizeof(float) * c.b * c.h_q * c.s_q * c.s_kv);
  }
  // fp32 dq accumulator of the fused backward (atomics). With a bias the dq kernel runs instead: it is the one
  // that writes dS to the d_bias workspace.
  if (!c.deterministic && c.plan.bias != Use::kRequired) {
    w.has_dq = true;
    w.dq = off;
    off = align256(off + sizeof(float) * c.h_q * w.rows_total_q * c.d);
  }
  w.total = off;
  return w;
}

RowStrides empty_rows() { return RowStrides{}; }
cuda::RowStrides3 rs(const RowStrides& r) { return {r.b, r.s, r.h}; }

Params make_params(const Call& c, const Workspace& w) {
  const sinkattn_params_t& p = *c.p;
  Params k;
  std::memset(&k, 0, sizeof(k));
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
  if (c.plan.varlen) {
    k.varlen = 1;
    k.cu_seqlens_q = static_cast<const int*>(p.cu_seqlens_q.data);
    k.cu_seqlens_kv = static_cast<const int*>(p.cu_seqlens_kv.data);
    k.cu_q_st = p.cu_seqlens_q.strides[0];
    k.cu_kv_st = p.cu_seqlens_kv.strides[0];
    if (c.plan.seqused_kv) {
      k.seqused_kv = static_cast<const int*>(p.seqused_kv.data);
      k.seqused_st = p.seqused_kv.strides[0];
    }
  } else {
    if (c.plan.seqlens_q) {
      k.seqlens_q = static_cast<const int*>(p.seqlens_q.data);
      k.seqlens_q_st = p.seqlens_q.strides[0];
    }
    if (c.plan.seqlens_kv) {
      k.seqlens_kv = static_cast<const int*>(p.seqlens_kv.data);
      k.seqlens_kv_st = p.seqlens_kv.strides[0];
    }
  }
  if (c.paged.on) {  // paged KV (SPEC 1): seqused_kv is required, cu_seqlens_kv absent
    k.page_table = static_cast<const int*>(p.page_table.data);
    k.pt_st_n = c.paged.pt_n;
    k.pt_st_p = c.paged.pt_p;
    k.page_size = static_cast<int>(c.paged.page_size);
    k.seqused_kv = static_cast<const int*>(p.seqused_kv.data);
    k.seqused_st = p.seqused_kv.strides[0];
  }
  k.num_splits = 1;
  k.b = static_cast<int>(c.b);
  k.s_q = static_cast<int>(c.s_q);
  k.s_kv = static_cast<int>(c.s_kv);
  k.h_q = static_cast<int>(c.h_q);
  k.h_kv = static_cast<int>(c.h_kv);
  k.group = static_cast<int>(c.group);
  k.d = static_cast<int>(c.d);
  k.d_v = static_cast<int>(c.d_v);
  k.rows_total_q = w.rows_total_q;
  k.rows_total_kv = c.plan.varlen ? c.total_kv : c.b * c.s_kv;
  k.softmax_type = c.softmax_type;
  k.softmax_scale = c.softmax_scale;
  k.scale_log2 = c.softmax_scale * 1.4426950408889634f;  // log2(e)
  k.window_left = static_cast<int>(std::min<int64_t>(c.window_left, 1 << 30));
  k.window_right = static_cast<int>(std::min<int64_t>(c.window_right, 1 << 30));
  k.align_bottom_right = c.alignment == SINKATTN_ALIGN_BOTTOM_RIGHT;
  k.dropout = c.plan.dropout;
  k.dropout_threshold = c.dropout_threshold;
  k.dropout_rscale = static_cast<float>(1.0 / (1.0 - c.dropout_p));
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
    k.ws_dq = w.has_dq ? reinterpret_cast<float*>(ws + w.dq) : nullptr;
    k.n_pre_blocks = w.n_pre_blocks;
  } else if (p.rng_seed_offset.rank > 0 && p.rng_seed_offset.data != nullptr) {
    k.rng_in = static_cast<const uint64_t*>(p.rng_seed_offset.data);
    k.rng_in_stride = p.rng_seed_offset.strides[0];
  }
  return k;
}

template <typename T, int HD>
cudaError_t run_tile(const Params& k, bool backward, cudaStream_t st) {
  if (!backward) return cuda::launch_fwd<T, HD>(k, st);
  if (k.ws_dq == nullptr) {  // deterministic: separate dq kernel, no float atomics
    cudaError_t e = cuda::launch_bwd_dq<T, HD>(k, st);
    if (e != cudaSuccess) return e;
  }
  return cuda::launch_bwd_dkdv<T, HD>(k, st);
}

template <typename T>
cudaError_t run_main(int tile, const Params& k, bool backward, cudaStream_t st) {
  switch (tile) {
    case 32: return run_tile<T, 32>(k, backward, st);
    case 64: return run_tile<T, 64>(k, backward, st);
    case 96: return run_tile<T, 96>(k, backward, st);
    case 128: return run_tile<T, 128>(k, backward, st);
    case 192: return run_tile<T, 192>(k, backward, st);
    case 256: return run_tile<T, 256>(k, backward, st);
    default: return cudaErrorInvalidValue;
  }
}

template <typename T>
Status run_typed(const Call& c, const Params& k, cudaStream_t st) {
  const int tile = head_dim_tile(c.d, c.d_v);
  const sinkattn_params_t& p = *c.p;
  if (c.pass == Pass::kForward) {
    SINKATTN_CUDA_CHECK("forward kernel", run_main<T>(tile, k, false, st));
    if (p.rng_state.rank > 0 && p.rng_state.data != nullptr)
      SINKATTN_CUDA_CHECK("rng_state kernel",
                          cuda::launch_rng_state(k.rng_in, k.rng_in_stride, k.seed, k.offset,
                                                 static_cast<uint64_t*>(p.rng_state.data), p.rng_state.strides[0],
                                                 st));
    return Status::ok();
  }
  if (k.ws_dbias != nullptr)
    SINKATTN_CUDA_CHECK("d_bias workspace memset",
                        cudaMemsetAsync(k.ws_dbias, 0, sizeof(float) * c.b * c.h_q * c.s_q * c.s_kv, st));
  SINKATTN_CUDA_CHECK("backward preprocess kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallPreprocess, st));
  if (k.d_sinks != nullptr)
    SINKATTN_CUDA_CHECK("d_sinks kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallDSinks, st));
  if (k.ws_dq != nullptr)
    SINKATTN_CUDA_CHECK("dq accumulator memset",
                        cudaMemsetAsync(k.ws_dq, 0, sizeof(float) * c.h_q * k.rows_total_q * c.d, st));
  SINKATTN_CUDA_CHECK("backward main kernels", run_main<T>(tile, k, true, st));
  if (k.ws_dq != nullptr)
    SINKATTN_CUDA_CHECK("dq convert kernel", cuda::launch_bwd_small<T>(k, cuda::kSmallDqConvert, st));
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
      return unsupported("cuda backend: no CUDA device found");
    }
    if (c.memory != Memory::kDevice)
      return unsupported("cuda backend: tensors are in host memory (the CUDA backend needs device memory)");
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major < 8) return unsupported("cuda backend: needs compute capability 8.0 or newer, found " + std::to_string(major) + ".x");
    if (c.dtype == SINKATTN_F32) return cuda_f32::supports(c);  // plain fp32 SIMT path (src/cuda/fp32)
    if (c.dtype != SINKATTN_F16 && c.dtype != SINKATTN_BF16)
      return unsupported(std::string("cuda backend: dtype ") + dtype_str(c.dtype) + " not supported");
    if (c.d % 8 != 0 || c.d_v % 8 != 0 || head_dim_tile(c.d, c.d_v) == 0)
      return unsupported("cuda backend: head dims d = " + std::to_string(c.d) + ", d_v = " + std::to_string(c.d_v) +
                         " not supported (multiples of 8 up to 256; tiles 32, 64, 96, 128, 192, 256)");
    if (c.b > 65535 || c.h_q > 65535)
      return unsupported("cuda backend: b and h_q must be <= 65535 (grid dimensions)");
    if (c.s_q > (1 << 30) || c.s_kv > (1 << 30))
      return unsupported("cuda backend: sequence lengths above 2^30 are not supported");
    if (c.pass == Pass::kBackward && c.plan.bias == Use::kRequired &&
        static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv * 4.0 > 64.0 * (1ull << 30))
      return unsupported("cuda backend: d_bias needs an fp32 workspace of b*h_q*s_q*s_kv floats, over 64 GiB here");
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
        return unsupported("cuda backend: page_table spans 2^31 or more entries (or page_size >= 2^30)");
    }
    (void)empty_rows;
    return Status::ok();
  }

  Status workspace_size(const Call& c, size_t* bytes) const override {
    if (c.dtype == SINKATTN_F32) return cuda_f32::workspace_size(c, bytes);
    *bytes = workspace_layout(c).total;
    if (c.pass == Pass::kForward) {
      const cuda::DecodePlan dp = cuda::plan_decode(c);
      if (dp.use) *bytes = dp.bytes;  // the split partials (none without splits)
    }
    return Status::ok();
  }

  Status run(const Call& c) const override {
    if (c.dtype == SINKATTN_F32) return cuda_f32::run(c);
    const Workspace w = workspace_layout(c);
    if (c.pass == Pass::kBackward && c.p->workspace_bytes < w.total)
      return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL, "cuda backend: workspace of " +
                                                          std::to_string(c.p->workspace_bytes) + " bytes, needs " +
                                                          std::to_string(w.total)};
    if (c.pass == Pass::kBackward && w.total > 0 && c.p->workspace == nullptr)
      return invalid("workspace: NULL but the CUDA backward needs " + std::to_string(w.total) + " bytes");
    Params k = make_params(c, w);
    cudaStream_t st = static_cast<cudaStream_t>(c.p->stream);
    cudaGetLastError();  // clear any stale error of the caller
    if (c.pass == Pass::kForward) {
      const cuda::DecodePlan dp = cuda::plan_decode(c);
      if (dp.use) return run_decode(c, dp, k, st);
    }
    if (c.dtype == SINKATTN_F16) return run_typed<__half>(c, k, st);
    return run_typed<__nv_bfloat16>(c, k, st);
  }

  // Forward on the decode kernels (decode/decode.hpp) [+ rng_state].
  static Status run_decode(const Call& c, const cuda::DecodePlan& dp, Params& k, cudaStream_t st) {
    if (c.p->workspace_bytes < dp.bytes || (dp.bytes > 0 && c.p->workspace == nullptr))
      return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL, "cuda backend: workspace of " +
                                                          std::to_string(c.p->workspace_bytes) +
                                                          " bytes, the decode forward needs " + std::to_string(dp.bytes)};
    cuda::bind_decode(dp, c.p->workspace, &k);
    SINKATTN_CUDA_CHECK("decode kernels", c.dtype == SINKATTN_F16 ? cuda::launch_decode<__half>(k, dp, st)
                                                                   : cuda::launch_decode<__nv_bfloat16>(k, dp, st));
    const sinkattn_params_t& p = *c.p;
    if (p.rng_state.rank > 0 && p.rng_state.data != nullptr)
      SINKATTN_CUDA_CHECK("rng_state kernel",
                          cuda::launch_rng_state(k.rng_in, k.rng_in_stride, k.seed, k.offset,
                                                 static_cast<uint64_t*>(p.rng_state.data), p.rng_state.strides[0], st));
    return Status::ok();
  }

  std::string describe() const override {
    std::string s = "cuda: sm_80+ FlashAttention-2-style kernels (mma.sync m16n8k16, fp32 accumulation, cp.async)\n";
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    if (count == 0) s += "  devices: none found\n";
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop;
      if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
      s += "  device " + std::to_string(i) + ": " + prop.name + ", sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
           std::to_string(prop.totalGlobalMem >> 20) + " MiB\n";
    }
    s += "  dtypes: fp16, bf16 (tensor cores); fp32 (plain SIMT fp32 kernels, deterministic, slow)\n";
    s += "  head dims: multiples of 8 up to 256 (d and d_v may differ), tiles 32 64 96 128 192 256\n";
    s += "  kernels: forward; backward = preprocess (D, fused d_sinks) + dK/dV (GQA summed in registers) "
         "[+ d_bias reduce]; deterministic = 0 fuses dq into the dK/dV kernel (fp32 atomics), "
         "deterministic = 1 uses a separate dq kernel (no float atomics)\n";
#ifdef SINKATTN_CUDA_SM90A
    s += "  hopper (sm_90a, compute capability 9.0): forward and dK/dV + fused dq on warpgroup MMA (wgmma), tiles by "
         "TMA, for head-dim tiles 64 and 128, fp16 / bf16, without bias or dropout (forward: not for windows spanning "
         "fewer than 512 keys per 128 query rows; dK/dV: deterministic = 0) "
         "(SINKATTN_CUDA_NO_SM90=1 turns it off; SINKATTN_CUDA_NO_TMA=1 loads every tile through cp.async)\n";
#else
    s += "  hopper: not built (CMAKE_CUDA_ARCHITECTURES without 90a)\n";
#endif
    s += "  decode (forward, up to 16 query rows per sequence, fp16 / bf16, head dims up to 128, no bias / dropout; "
         "contiguous or paged KV): the query heads of a KV group packed into one tile, split-KV (flash-decoding; "
         "num_splits 0 = heuristic from batch, KV heads, keys and SMs, N = at most N <= 128) with a combine kernel, "
         "windows read only their pages; no host synchronisation or allocation (graph-capturable)\n";
    s += "  paged KV (page_table, forward only, any page_size): decode kernels as above, longer query chunks on the "
         "sm_80 forward kernel reading K / V rows through the page table (the Hopper forward is off for paged calls: "
         "its TMA tensor maps describe contiguous rows)\n";
    s += "  features: vanilla / off_by_one / learnable sinks, dense / padded / varlen (seqused_kv), strided "
         "layouts, GQA/MQA, windows + causal (both alignments, band-limited block iteration), bias + d_bias, "
         "dropout (Philox, bit-identical to CPU), d_lse\n";
    return s;
  }
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
