"""Pure-JAX reference of SPEC.md (plain jnp ops, any float dtype including float64).

``dot_product_attention`` here has the same signature and output layout as ``sinkattn.jax.dot_product_attention``
and computes the same function (SPEC.md sections 1-2; gradients by JAX autodiff give section 3), materialising
the full [b, h_q, s_q, s_kv] score matrix. It is the ground truth of the tests (run in float64 with
``jax_enable_x64``), the slow path of the examples, and needs no compiled code.

Dropout reproduces the library's keep decision bit for bit: Philox4x32-10 in uint32 arithmetic (no 64-bit
integers needed), keyed by ``rng_seed_offset_words(dropout_rng)``, the same words the op passes to the library.
The argument rules (softmax type, window bounds, default scale) are the op's own (sinkattn/_args.py).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp

from .._args import resolve_softmax_type, resolve_window, softmax_scale as _softmax_scale
from .attention import rng_seed_offset_words

__all__ = [
    "dot_product_attention",
    "philox4x32_10",
    "dropout_keep",
    "dropout_threshold",
    "rng_seed_offset_words",
    "resolve_window",
]

_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # key bumps


def _mulhilo(a, b: int):
    """(hi, lo) 32-bit halves of a * b for uint32 arrays a and a constant b, in 16-bit pieces (no uint64)."""
    a = a.astype(jnp.uint32)
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = jnp.uint32(b & 0xFFFF), jnp.uint32(b >> 16)
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    lo = (p00 & 0xFFFF) | (mid << 16)
    hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16)
    return hi, lo


def philox4x32_10(counter: Sequence, key: Sequence):
    """Philox4x32-10 (Random123): counter = 4 uint32 arrays, key = 2 uint32 arrays; returns 4 uint32 arrays."""
    c0, c1, c2, c3 = (jnp.asarray(c, jnp.uint32) for c in counter)
    k0, k1 = (jnp.asarray(k, jnp.uint32) for k in key)
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + jnp.uint32(_W0)
        k1 = k1 + jnp.uint32(_W1)
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """threshold = min(floor(p * 2^32), 2^32 - 1), p as a double (SPEC.md section 2)."""
    return min(int(math.floor(float(p) * 4294967296.0)), 0xFFFFFFFF)


def _u64_mul_add(hi, lo, mul: Union[int, jax.Array], add):
    """(hi, lo) * mul + add modulo 2^64 for uint32 arrays; mul and add are uint32 (arrays or ints)."""
    mul = jnp.asarray(mul, jnp.uint32)
    # lo * mul: full 64 bits through 16-bit pieces of both factors.
    a0, a1 = lo & 0xFFFF, lo >> 16
    b0, b1 = mul & 0xFFFF, mul >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF)
    new_lo = (p00 & 0xFFFF) | (mid << 16)
    new_hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16) + hi * mul
    add = jnp.asarray(add, jnp.uint32)
    s = new_lo + add
    new_hi = new_hi + (s < new_lo).astype(jnp.uint32)
    return new_hi, s


def dropout_keep(words, n, h, i, j, h_q: int, max_s_q: int, max_s_kv: int, p: float):
    """keep(seed, offset, n, h, i, j) of SPEC.md section 2 (broadcasting over n, h, i, j), as a bool array.

    idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j (uint64); ctr = idx / 4, lane = idx % 4;
    words = Philox4x32_10([lo32(ctr), hi32(ctr), lo32(offset), hi32(offset)], [lo32(seed), hi32(seed)]);
    keep = words[lane] >= min(floor(p * 2^32), 2^32 - 1)."""
    words = jnp.asarray(words, jnp.uint32)
    u = lambda x: jnp.asarray(x).astype(jnp.uint32)
    n, h, i, j = jnp.broadcast_arrays(u(n), u(h), u(i), u(j))
    hi, lo = jnp.zeros_like(n), n
    hi, lo = _u64_mul_add(hi, lo, h_q, h)
    hi, lo = _u64_mul_add(hi, lo, max_s_q, i)
    hi, lo = _u64_mul_add(hi, lo, max_s_kv, j)
    ctr_lo = (lo >> 2) | (hi << 30)
    ctr_hi = hi >> 2
    lane = lo & 3
    r = philox4x32_10((ctr_lo, ctr_hi, jnp.broadcast_to(words[2], lo.shape), jnp.broadcast_to(words[3], lo.shape)),
                      (words[0], words[1]))
    word = jnp.where(lane == 0, r[0], jnp.where(lane == 1, r[1], jnp.where(lane == 2, r[2], r[3])))
    return word >= jnp.uint32(dropout_threshold(p))


_PLAIN = [None]  # plain_low_precision(): the dtype whose rounding the reference emulates (None: exact)


class plain_low_precision:
    """Context manager (for tests): the reference becomes SPEC.md section 5's "plain low-precision implementation"
    of ``dtype``: scores, softmax and dP in the compute dtype (fp32); P and dS rounded to ``dtype`` before their
    products (P V, and dS K / dS^T Q), and every output rounded to it."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.old, _PLAIN[0] = _PLAIN[0], self.dtype

    def __exit__(self, *exc):
        _PLAIN[0] = self.old


def _rounding(dtype):
    """(round_fwd, round_bwd): round_fwd rounds a value to ``dtype`` and passes its cotangent unchanged (P, out);
    round_bwd is the identity whose cotangent is rounded to ``dtype`` (dS, at the scores)."""

    @jax.custom_vjp
    def round_fwd(x):
        return x.astype(dtype).astype(x.dtype)

    round_fwd.defvjp(lambda x: (round_fwd(x), None), lambda _, g: (g,))

    @jax.custom_vjp
    def round_bwd(x):
        return x

    round_bwd.defvjp(lambda x: (x, None), lambda _, g: (g.astype(dtype).astype(g.dtype),))
    return round_fwd, round_bwd


def _runs(seg):
    """Per token of [B, T] segment ids: (global run index, position within the run, run length)."""
    b, t = seg.shape
    start = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    idx = jnp.broadcast_to(jnp.arange(t), (b, t))
    run_start = jax.lax.cummax(jnp.where(start, idx, 0), axis=1)
    end = jnp.concatenate([seg[:, 1:] != seg[:, :-1], jnp.ones((b, 1), bool)], axis=1)
    run_end = jax.lax.cummin(jnp.where(end, idx, t), axis=1, reverse=True)
    run_id = jnp.cumsum(start.reshape(-1)).reshape(b, t) - 1  # runs numbered row-major over the batch
    return run_id, idx - run_start, run_end - run_start + 1


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    sinks=None,
    softmax_type: Optional[str] = None,
    scale: Optional[float] = None,
    is_causal: bool = False,
    local_window_size=None,
    mask_alignment: str = "bottom_right",
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    segment_ids=None,
    cu_seqlens_q=None,
    cu_seqlens_kv=None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    dropout_rate: float = 0.0,
    dropout_rng=None,
    deterministic: bool = False,
    return_lse: bool = False,
    dropout_words=None,
):
    """Reference of ``sinkattn.jax.dot_product_attention`` (see its docstring for the arguments).

    ``dropout_words`` (reference only): the uint32[4] seed/offset words {lo32(seed), hi32(seed), lo32(offset),
    hi32(offset)} in place of ``dropout_rng``, for bindings whose ``rng_seed_offset`` does not come from a JAX key
    (the PyTorch tests)."""
    del deterministic  # a property of the fused backward only
    mask_arg = mask
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    window_left, window_right = resolve_window(is_causal, local_window_size)
    varlen = cu_seqlens_q is not None
    q, k, v = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    if varlen:
        q, k, v = q[None], k[None], v[None]
    elif q.ndim == 3:
        q, k, v = q[None], k[None], v[None]
    b, t, h_q, d = q.shape
    s, h_kv = k.shape[1], k.shape[2]
    g = h_q // h_kv
    dt = q.dtype
    softmax_scale = _softmax_scale(scale, d)

    # Token-level description: sequence number n, position within the sequence, the sequence's actual
    # lengths (SPEC.md section 1), and whether the token takes part at all.
    ti = jnp.broadcast_to(jnp.arange(t), (b, t))
    si = jnp.broadcast_to(jnp.arange(s), (b, s))
    if varlen:
        cu_q = jnp.asarray(cu_seqlens_q, jnp.int32)
        cu_kv = jnp.asarray(cu_seqlens_kv, jnp.int32)
        nq = jnp.searchsorted(cu_q, ti, side="right") - 1
        nk = jnp.searchsorted(cu_kv, si, side="right") - 1
        nseq = cu_q.shape[0] - 1
        nq_c, nk_c = jnp.clip(nq, 0, nseq - 1), jnp.clip(nk, 0, nseq - 1)
        pos_q, pos_k = ti - cu_q[nq_c], si - cu_kv[nk_c]
        lens_q = cu_q[1:] - cu_q[:-1]
        lens_kv = cu_kv[1:] - cu_kv[:-1]
        if key_value_seq_lengths is not None:  # seqused_kv
            lens_kv = jnp.asarray(key_value_seq_lengths, jnp.int32)
        len_q_tok, len_kv_tok = lens_q[nq_c], lens_kv[nk_c]
        valid_q = (ti < cu_q[-1]) & (nq >= 0) & (nq < nseq)
        valid_k = (si < cu_kv[-1]) & (nk >= 0) & (nk < nseq) & (pos_k < len_kv_tok)
        max_s_q = int(max_seqlen_q) if max_seqlen_q is not None else t
        max_s_kv = int(max_seqlen_kv) if max_seqlen_kv is not None else s
        n_q, n_k = nq, nk
    elif segment_ids is not None:
        seg_q, seg_k = segment_ids if isinstance(segment_ids, (tuple, list)) else (segment_ids, segment_ids)
        n_q, pos_q, len_q_tok = _runs(jnp.asarray(seg_q))
        n_k, pos_k, len_kv_tok = _runs(jnp.asarray(seg_k))
        valid_q = jnp.ones((b, t), bool)
        valid_k = jnp.ones((b, s), bool)
        max_s_q, max_s_kv = t, s
    else:
        lq = jnp.full((b,), t, jnp.int32) if query_seq_lengths is None else jnp.asarray(query_seq_lengths, jnp.int32)
        lk = jnp.full((b,), s, jnp.int32) if key_value_seq_lengths is None else jnp.asarray(
            key_value_seq_lengths, jnp.int32)
        n_q = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t))
        n_k = jnp.broadcast_to(jnp.arange(b)[:, None], (b, s))
        pos_q, pos_k = ti, si
        len_q_tok = jnp.broadcast_to(lq[:, None], (b, t))
        len_kv_tok = jnp.broadcast_to(lk[:, None], (b, s))
        valid_q, valid_k = ti < lq[:, None], si < lk[:, None]
        max_s_q, max_s_kv = t, s

    # Mask of SPEC.md section 2: same sequence, real tokens, and the window with off = len_kv - len_q
    # (bottom_right) or 0 (top_left), per sequence.
    pi, pj = pos_q[:, :, None], pos_k[:, None, :]
    off = (len_kv_tok[:, None, :] - len_q_tok[:, :, None]) if mask_alignment == "bottom_right" else 0
    mask = (n_q[:, :, None] == n_k[:, None, :]) & valid_q[:, :, None] & valid_k[:, None, :]
    if window_left >= 0:
        mask &= pj >= pi + off - window_left
    if window_right >= 0:
        mask &= pj <= pi + off + window_right
    mask = mask[:, None, None]  # [b, 1, 1, t, s] against scores [b, h_kv, g, t, s]
    if mask_arg is not None:  # the caller's boolean mask (True = attend), broadcastable to [b, h_q, t, s]
        mu = jnp.asarray(mask_arg, bool)
        mu = mu.reshape((1,) * (4 - mu.ndim) + mu.shape)
        mask = mask & jnp.broadcast_to(mu, (b, h_q, t, s)).reshape(b, h_kv, g, t, s)

    # S_ij = softmax_scale * dot(q_i, k_j) + bias_ij; query head h = kv_head * g + group member.
    qg = q.reshape(b, t, h_kv, g, d)
    ident = lambda x: x  # noqa: E731
    round_fwd, round_bwd = (ident, ident) if _PLAIN[0] is None else _rounding(_PLAIN[0])
    # the cotangent here is dS_ij (before the scale): rounded before dq = scale dS K, dk = scale dS^T Q
    # precision=HIGHEST: fp32 products in IEEE fp32 on every platform (JAX's default on a GPU is TF32, whose 10-bit
    # mantissa would make the plain fp32 evaluation of SPEC.md section 5, and so its tolerances, far too loose).
    hi = jax.lax.Precision.HIGHEST
    scores = round_bwd(jnp.einsum("btkgd,bskd->bkgts", qg, k, precision=hi) * jnp.asarray(softmax_scale, dt))
    if bias is not None:
        bb = jnp.asarray(bias)
        bb = bb.reshape((1,) * (4 - bb.ndim) + bb.shape)
        bb = jnp.broadcast_to(bb, (b, h_q, t, s)).reshape(b, h_kv, g, t, s)
        scores = scores + bb.astype(dt)
    scores = jnp.where(mask, scores, -jnp.inf)

    # sigma = sinks[h] | 0 | -inf; LSE_i = log(exp(sigma) + sum_j exp(S_ij)), computed stably.
    if softmax_type == "learnable":
        if sinks is None:
            raise ValueError("sinkattn reference: softmax_type='learnable' needs sinks")
        sigma = jnp.asarray(sinks).astype(dt).reshape(1, h_kv, g, 1)
    elif softmax_type == "off_by_one":
        sigma = jnp.zeros((1, h_kv, g, 1), dt)
    elif softmax_type == "vanilla":
        sigma = jnp.full((1, h_kv, g, 1), -jnp.inf, dt)
    else:
        raise ValueError(f"sinkattn reference: unknown softmax_type {softmax_type!r}")
    m = jax.lax.stop_gradient(jnp.maximum(jnp.max(scores, axis=-1), sigma))
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(scores - m[..., None])
    z = jnp.exp(sigma - m) + jnp.sum(e, axis=-1)
    nonzero = z > 0
    z_safe = jnp.where(nonzero, z, 1)
    lse = jnp.where(nonzero, m + jnp.log(z_safe), -jnp.inf)
    prob = e / z_safe[..., None]  # P_ij = exp(S_ij - LSE_i); the sink has no value vector

    if dropout_rate > 0.0:
        if dropout_rng is None and dropout_words is None:
            raise ValueError("sinkattn reference: dropout_rate > 0 needs dropout_rng (or dropout_words)")
        words = jnp.asarray(dropout_words, jnp.uint32) if dropout_words is not None else rng_seed_offset_words(dropout_rng)
        hh = (jnp.arange(h_kv)[:, None] * g + jnp.arange(g)[None, :])[None, :, :, None, None]
        nn = jnp.maximum(n_q, 0)[:, None, None, :, None]
        keep = dropout_keep(words, nn, hh, jnp.maximum(pos_q, 0)[:, None, None, :, None],
                            jnp.maximum(pos_k, 0)[:, None, None, None, :], h_q, max_s_q, max_s_kv, dropout_rate)
        prob = jnp.where(keep, prob / (1.0 - dropout_rate), 0)

    out = round_fwd(jnp.einsum("bkgts,bskd->btkgd", round_fwd(prob), v, precision=hi)).reshape(b, t, h_q, v.shape[-1])
    out = jnp.where(valid_q[:, :, None, None], out, 0).astype(dt)  # padding rows: out = 0
    lse = lse.reshape(b, h_q, t)
    if varlen or jnp.asarray(query).ndim == 3:
        out = out[0]
        lse = lse[0]  # varlen: [h_q, total_q]
    return (out, lse) if return_lse else out
