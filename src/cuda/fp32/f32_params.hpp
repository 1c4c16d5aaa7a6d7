// fp32 path of the CUDA backend: host-side resolution of a Call into the kernels' KParams and the backward's
// workspace layout (one function, used by both workspace_size and run: SPEC.md section 4). Host-only code.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/call.hpp"
#include "cuda/fp32/f32_kernels.cuh"

namespace sinkattn::cuda_f32 {

// Backward workspace, byte offsets (each region 256-byte aligned):
//   dm     [h_q][b * s_q] doubles: D_i - d_lse_i
//   dsink  [h_q][b * s_q] floats: the d_sinks term of each row (learnable only)
//   dbias  [b][h_q][s_q][s_kv] floats: dS, reduced over the broadcast dims of bias (only when bias broadcasts)
// The forward needs none.
struct Layout {
  size_t dm = 0, dsink = 0, dbias = 0, total = 0;
  bool has_dsink = false, has_dbias_ws = false;
};

inline size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

inline bool bias_broadcasts(const Call& c) {
  return c.plan.bias == Use::kRequired && (c.p->bias.shape[0] != c.b || c.p->bias.shape[1] != c.h_q);
}

inline Layout layout_of(const Call& c) {
  Layout w;
  if (c.pass != Pass::kBackward) return w;
  const size_t rows = static_cast<size_t>(c.b) * static_cast<size_t>(c.s_q);
  size_t off = 0;
  w.dm = off;
  off = align256(off + sizeof(double) * static_cast<size_t>(c.h_q) * rows);
  if (c.plan.d_sinks == Use::kRequired) {
    w.has_dsink = true;
    w.dsink = off;
    off = align256(off + sizeof(float) * static_cast<size_t>(c.h_q) * rows);
  }
  if (c.plan.d_bias == Use::kRequired && bias_broadcasts(c)) {
    w.has_dbias_ws = true;
    w.dbias = off;
    off = align256(off + sizeof(float) * static_cast<size_t>(c.b) * static_cast<size_t>(c.h_q) *
                             static_cast<size_t>(c.s_q) * static_cast<size_t>(c.s_kv));
  }
  w.total = off;
  return w;
}

inline Rows rows_of(const RowStrides& r) { return r; }

// Call -> KParams. `workspace` is the caller's workspace (backward), laid out by layout_of(c).
inline KParams make_kparams(const Call& c, const Layout& w, void* workspace) {
  const sinkattn_params_t& p = *c.p;
  const bool bwd = c.pass == Pass::kBackward;
  KParams k;
  k.q = static_cast<const float*>(p.q.data);
  k.k = static_cast<const float*>(p.k.data);
  k.v = static_cast<const float*>(p.v.data);
  k.out = static_cast<float*>(p.out.data);
  k.lse = static_cast<float*>(p.softmax_lse.data);
  k.q_st = rows_of(c.q);
  k.k_st = rows_of(c.k);
  k.v_st = rows_of(c.v);
  k.out_st = rows_of(c.out);
  k.lse_b = c.lse.b;
  k.lse_h = c.lse.h;
  k.lse_s = c.lse.s;
  if (c.plan.sinks == Use::kRequired) {
    k.sinks = static_cast<const float*>(p.sinks.data);
    k.sinks_st = p.sinks.strides[0];
  }
  if (c.plan.bias == Use::kRequired) {
    k.bias = static_cast<const float*>(p.bias.data);
    k.bias_b = c.bias.b;
    k.bias_h = c.bias.h;
    k.bias_i = c.bias.i;
    k.bias_j = c.bias.j;
    k.bias_nb = p.bias.shape[0];
    k.bias_nh = p.bias.shape[1];
  }
  static_cast<BatchTensors&>(k) = batch_tensors(c);  // batch tensors (device pointers) and extents
  if (c.paged.on) {  // paged KV (forward only): k_st / v_st hold the page, row-in-page and head strides
    k.pt_n = c.paged.pt_n;
    k.pt_p = c.paged.pt_p;
    k.page_size = c.paged.page_size;
  }
  k.b = c.b;
  k.h_q = c.h_q;
  k.h_kv = c.h_kv;
  k.group = c.group;
  k.d = c.d;
  k.d_v = c.d_v;
  k.total_q = c.total_q;
  k.total_kv = c.total_kv;
  k.softmax_type = c.softmax_type;
  k.scale = c.softmax_scale;
  k.wl = c.window_left;  // -1 or clamped to s_q + s_kv by resolve_call (common/mask.hpp)
  k.wr = c.window_right;
  k.align_br = c.alignment == SINKATTN_ALIGN_BOTTOM_RIGHT ? 1 : 0;
  k.dropout = c.plan.dropout ? 1 : 0;
  k.threshold = c.dropout_threshold;
  k.rdrop = static_cast<float>(1.0 / (1.0 - c.dropout_p));
  k.seed = p.seed;
  k.offset = p.offset;
  if (!bwd) {
    // SPEC.md 2, dropout: seed / offset from rng_seed_offset when given; rng_state = {seed, offset} when given.
    if (p.rng_seed_offset.rank > 0 && p.rng_seed_offset.data != nullptr) {
      k.rng_in = static_cast<const int64_t*>(p.rng_seed_offset.data);
      k.rng_in_st = p.rng_seed_offset.strides[0];
    }
    if (c.plan.rng_state == Use::kRequired && p.rng_state.data != nullptr) {
      k.rng_out = static_cast<int64_t*>(p.rng_state.data);
      k.rng_out_st = p.rng_state.strides[0];
    }
    return k;
  }
  // Backward: the dropout mask of the forward comes from rng_state.
  if (c.plan.rng_state == Use::kRequired && p.rng_state.data != nullptr) {
    k.rng_in = static_cast<const int64_t*>(p.rng_state.data);
    k.rng_in_st = p.rng_state.strides[0];
  }
  k.d_out = static_cast<const float*>(p.d_out.data);
  k.dout_st = rows_of(c.d_out);
  k.dq = static_cast<float*>(p.dq.data);
  k.dk = static_cast<float*>(p.dk.data);
  k.dv = static_cast<float*>(p.dv.data);
  k.dq_st = rows_of(c.dq);
  k.dk_st = rows_of(c.dk);
  k.dv_st = rows_of(c.dv);
  if (c.plan.d_lse == Use::kRequired) {
    k.d_lse = static_cast<const float*>(p.d_lse.data);
    k.dlse_b = c.d_lse.b;
    k.dlse_h = c.d_lse.h;
    k.dlse_s = c.d_lse.s;
  }
  if (c.plan.d_sinks == Use::kRequired) {
    k.d_sinks = static_cast<float*>(p.d_sinks.data);
    k.d_sinks_st = p.d_sinks.strides[0];
  }
  char* ws = static_cast<char*>(workspace);
  k.ws_dm = reinterpret_cast<double*>(ws + w.dm);
  if (w.has_dsink) k.ws_dsink = reinterpret_cast<float*>(ws + w.dsink);
  if (c.plan.d_bias == Use::kRequired) {
    k.d_bias = static_cast<float*>(p.d_bias.data);
    k.dbias_b = c.d_bias.b;
    k.dbias_h = c.d_bias.h;
    k.dbias_i = c.d_bias.i;
    k.dbias_j = c.d_bias.j;
    if (w.has_dbias_ws) {  // dS into the workspace [b][h_q][s_q][s_kv], then reduced over the broadcast dims
      k.ds_dst = reinterpret_cast<float*>(ws + w.dbias);
      k.ds_j = 1;
      k.ds_i = c.s_kv;
      k.ds_h = c.s_q * c.s_kv;
      k.ds_b = c.h_q * c.s_q * c.s_kv;
    } else {  // no broadcast dim: dS is d_bias itself
      k.ds_dst = k.d_bias;
      k.ds_b = c.d_bias.b;
      k.ds_h = c.d_bias.h;
      k.ds_i = c.d_bias.i;
      k.ds_j = c.d_bias.j;
    }
  }
  return k;
}

}  // namespace sinkattn::cuda_f32
