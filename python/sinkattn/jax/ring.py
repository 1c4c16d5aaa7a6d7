"""Context-parallel ring attention with softmax sinks.

The sequence axis of query/key/value is sharded over one mesh axis (``seq_axis``, size ``p``). Each device keeps
its query block and passes its key/value block around the ring with ``lax.ppermute``; at every step it makes ONE
fused call of ``sinkattn.jax.dot_product_attention`` (``softmax_type="vanilla"``, ``return_lse=True``) of its
query block against the visiting key/value block, and merges the partial results (SPEC.md section 2):

    lse = logsumexp_k(lse_k)                  out = sum_k exp(lse_k - lse) * out_k

The sink is counted exactly once, as a final merge with a zero-value term of logit sigma
(sigma = sinks[h] for ``learnable``, 0 for ``off_by_one``):

    LSE = logaddexp(lse, sigma)               OUT = exp(lse - LSE) * out

which is SPEC.md's LSE_i = log(exp(sigma) + sum_j exp(S_ij)) and out_i = sum_j P_ij v_j.

Backward (SPEC.md section 3, the d_lse path): a ``jax.custom_vjp`` around the vanilla ring. The backward sends
key/value around the ring again together with their dk/dv accumulators; at each step it recomputes that step's
(out_k, lse_k) with the fused forward and calls the fused op's VJP with the cotangents of the merge

    w_k = exp(lse_k - lse),   d_out_k = w_k * d_out,   d_lse_k = w_k * (d_lse + dot(d_out, out_k - out))

so that the op's dS = P_k (dP_k - D_k + d_lse_k) equals the single-call P (dP - D + d_lse). Memory stays O(local
block) (no per-step residuals are kept). d_sinks comes from autodiff of the final sink merge:
d_sinks[h] = sum_i exp(sigma - LSE_i) (d_LSE_i - dot(d_OUT_i, OUT_i)), summed over the ring/batch axes by the
transpose of ``shard_map`` (sinks are replicated over them).

Masks: non-causal, causal, and causal sliding window ``local_window_size=(window_left, 0)`` (GPT-OSS: 127).
The mask is the top-left aligned one of SPEC.md with T == S (self-attention).

Load balancing (causal): with ``layout="zigzag"`` the global sequence is cut in 2p chunks and device r holds
chunks r and 2p-1-r (permute once at the model input with :func:`zigzag_permute`, undo with
:func:`zigzag_unpermute`). Then every ring step costs every device the same: step 0 is a causal call on the
local 2C x 2C block, every other step is one unmasked C x 2C call (either the whole local query block against
the visiting block's first chunk, or the local second chunk against the whole visiting block).
With a sliding window (window_left < S/p) the contiguous layout is already balanced (each query row sees at most
window_left + 1 keys) and the ring stops after 1 + ceil(window_left / C) steps, so zig-zag is not used
there (``layout="zigzag"`` with a window raises).
Not supported here (raise): bias, segment ids / sequence lengths, dropout.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

# shard_map(check_vma=True) typing helpers of the fused op
from .attention import _union_vma, _vary_to, vma_typing_supported
from .reference import resolve_softmax_type

__all__ = [
    "ring_dot_product_attention",
    "ring_attention_shard",
    "zigzag_permute",
    "zigzag_unpermute",
    "zigzag_order",
]

_NEG_INF = -jnp.inf
_BIG = 1 << 30  # a window bound wider than any sequence (SPEC.md: same as no window)


def _default_attention():
    from .attention import dot_product_attention  # the fused op (other module of this package)

    return dot_product_attention


# ----------------------------------------------------------------------------------------------------------------
# zig-zag layout helpers
# ----------------------------------------------------------------------------------------------------------------
def zigzag_order(num_shards: int):
    """Chunk order of the zig-zag layout: device r holds chunks r and 2p-1-r, i.e. [0, 2p-1, 1, 2p-2, ...]."""
    order = []
    for r in range(num_shards):
        order += [r, 2 * num_shards - 1 - r]
    return order


def zigzag_permute(x, num_shards: int, axis: int = 1):
    """Natural sequence order -> zig-zag order along ``axis`` (length must be divisible by 2 * num_shards)."""
    n = x.shape[axis]
    if n % (2 * num_shards):
        raise ValueError(f"zigzag: sequence length {n} not divisible by 2 * num_shards = {2 * num_shards}")
    chunks = jnp.split(x, 2 * num_shards, axis=axis)
    return jnp.concatenate([chunks[c] for c in zigzag_order(num_shards)], axis=axis)


def zigzag_unpermute(x, num_shards: int, axis: int = 1):
    """Inverse of :func:`zigzag_permute`."""
    n = x.shape[axis]
    if n % (2 * num_shards):
        raise ValueError(f"zigzag: sequence length {n} not divisible by 2 * num_shards = {2 * num_shards}")
    chunks = jnp.split(x, 2 * num_shards, axis=axis)
    order = zigzag_order(num_shards)
    inv = [0] * len(order)
    for pos, c in enumerate(order):
        inv[c] = pos
    return jnp.concatenate([chunks[inv[c]] for c in range(2 * num_shards)], axis=axis)


# ----------------------------------------------------------------------------------------------------------------
# merging partial results
# ----------------------------------------------------------------------------------------------------------------
def _lse_to_btn1(lse):
    """[B, N, T] -> [B, T, N, 1] to broadcast against out [B, T, N, H]."""
    return jnp.transpose(lse, (0, 2, 1))[..., None]


def _merge(out_a, lse_a, out_b, lse_b):
    """lse = logaddexp(lse_a, lse_b); out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b (fp32, -inf safe).
    Only used in the forward of the custom_vjp (never differentiated)."""
    lse = jnp.logaddexp(lse_a, lse_b)
    fin = jnp.isfinite(lse)
    safe = jnp.where(fin, lse, 0.0)
    wa = jnp.where(fin, jnp.exp(lse_a - safe), 0.0)
    wb = jnp.where(fin, jnp.exp(lse_b - safe), 0.0)
    out = _lse_to_btn1(wa) * out_a + _lse_to_btn1(wb) * out_b
    return out, lse


def _merge_sink(out, lse, sigma):
    """Final merge with the sink (a zero-value term of logit sigma [N]); differentiable (gives d_sinks).
    LSE = logaddexp(lse, sigma), OUT = exp(lse - LSE) * out. sigma is finite, so LSE is finite."""
    sig = sigma.astype(jnp.float32)[None, :, None]
    lse_f = jnp.logaddexp(lse, sig)
    w = jnp.exp(lse - lse_f)  # lse = -inf (row saw no key) -> w = 0, gradient 0
    return _lse_to_btn1(w) * out, lse_f


# ----------------------------------------------------------------------------------------------------------------
# one ring step: the local query block against the key/value block of device `src`
# ----------------------------------------------------------------------------------------------------------------
class _Plan:
    """Static description of the ring (everything known at trace time)."""

    def __init__(self, *, p, t_loc, s_loc, is_causal, window_left, layout, scale, attention_fn):
        self.p = p
        self.t_loc = t_loc
        self.s_loc = s_loc
        self.is_causal = is_causal
        self.window_left = window_left  # None = unbounded
        self.layout = layout
        self.scale = scale
        self.attn = attention_fn
        if not is_causal:
            self.n_steps = p
        elif layout == "zigzag":
            self.n_steps = p
        else:
            C = t_loc
            if window_left is None:
                self.n_steps = p
            else:
                # step t (key block t blocks back) is visible iff t*C - window_left <= C - 1
                self.n_steps = min(p, (window_left + C - 1) // C + 1)


def _call(plan, q, k, v, **mask):
    out, lse = plan.attn(q, k, v, softmax_type="vanilla", scale=plan.scale, return_lse=True,
                         mask_alignment="top_left", **mask)
    return out, lse.astype(jnp.float32)


def _vary_like(x, *refs):
    """Mark x as varying over the manual mesh axes the refs vary over (shard_map check_vma typing)."""
    return _vary_to(x, _union_vma(*refs))


def _empty(plan, q, v, rows=None):
    """Result of a block no local query sees: out = 0, lse = -inf (SPEC.md section 2, row with no key)."""
    B, T, N, _ = q.shape
    T = T if rows is None else rows
    out = jnp.zeros((B, T, N, v.shape[-1]), q.dtype)
    lse = jnp.full((B, N, T), _NEG_INF, jnp.float32)
    return _vary_like(out, q, v), _vary_like(lse, q, v)


def _step(plan, t, r, q, k, v):
    """(out_t [B,T,N,Hv] in q.dtype, lse_t [B,N,T] fp32) of the local queries against the block that left
    device (r - t) mod p t steps ago. t is static, r = axis_index is traced."""
    if not plan.is_causal:
        return _call(plan, q, k, v)
    if plan.layout == "zigzag":
        if t == 0:
            return _call(plan, q, k, v, is_causal=True)
        C = plan.t_loc // 2

        def src_before(q, k, v):  # source chunks s < r < 2p-1-r < 2p-1-s: all queries see chunk s only
            return _call(plan, q, k[:, :C], v[:, :C])

        def src_after(q, k, v):  # r < s < 2p-1-s < 2p-1-r: only query chunk 2p-1-r sees both key chunks
            o2, l2 = _call(plan, q[:, C:], k, v)
            o1, l1 = _empty(plan, q, v, rows=C)
            return jnp.concatenate([o1, o2], axis=1), jnp.concatenate([l1, l2], axis=2)

        return jax.lax.cond(r >= t, src_before, src_after, q, k, v)

    # contiguous layout; the visiting block starts d = t*C keys before the local query block (when r >= t)
    C = plan.t_loc
    W = plan.window_left
    if t == 0:
        win = None if W is None else (W, 0)
        return _call(plan, q, k, v, is_causal=True, local_window_size=win)
    e = -_BIG if W is None else t * C - W  # visible iff j >= i + e (j <= i + d always holds for t >= 1)

    def visible(q, k, v):
        if e <= -(C - 1):
            return _call(plan, q, k, v)
        if e <= 0:
            return _call(plan, q, k, v, local_window_size=(-e, _BIG))
        # 0 < e < C: rows [0, C-e) see keys [i+e, C) -> slice, then "j' >= i" = window (0, unbounded right)
        o, l = _call(plan, q[:, : C - e], k[:, e:], v[:, e:], local_window_size=(0, _BIG))
        o0, l0 = _empty(plan, q, v, rows=e)
        return jnp.concatenate([o, o0], axis=1), jnp.concatenate([l, l0], axis=2)

    def hidden(q, k, v):  # the block is in the future of every local query
        return _empty(plan, q, v)

    return jax.lax.cond(r >= t, visible, hidden, q, k, v)


# ----------------------------------------------------------------------------------------------------------------
# the vanilla ring (custom_vjp) and the sink merge
# ----------------------------------------------------------------------------------------------------------------
def _shift(x, axis_name, p, by):
    by %= p
    if by == 0:
        return x
    return jax.lax.ppermute(x, axis_name, [(i, (i + by) % p) for i in range(p)])


def _ring_forward(plan, axis_name, q, k, v):
    r = jax.lax.axis_index(axis_name)
    out = lse = None
    kt, vt = k, v
    for t in range(plan.n_steps):
        if t + 1 < plan.n_steps:  # start the transfer of the next block before computing this one
            k_next, v_next = _shift((kt, vt), axis_name, plan.p, 1)
        o, l = _step(plan, t, r, q, kt, vt)
        o = o.astype(jnp.float32)
        out, lse = (o, l) if out is None else _merge(out, lse, o, l)
        if t + 1 < plan.n_steps:
            kt, vt = k_next, v_next
    return out, lse


def _make_ring(plan, axis_name):
    @jax.custom_vjp
    def ring(q, k, v):
        return _ring_forward(plan, axis_name, q, k, v)

    def fwd(q, k, v):
        out, lse = _ring_forward(plan, axis_name, q, k, v)
        return (out, lse), (q, k, v, out, lse)

    def bwd(res, cts):
        q, k, v, out, lse = res
        d_out, d_lse = cts
        d_out = d_out.astype(jnp.float32)
        d_lse = d_lse.astype(jnp.float32)
        r = jax.lax.axis_index(axis_name)
        fin = jnp.isfinite(lse)
        lse_safe = jnp.where(fin, lse, 0.0)
        dq = jnp.zeros(q.shape, jnp.float32)
        kt, vt = k, v
        dk = jnp.zeros(k.shape, jnp.float32)
        dv = jnp.zeros(v.shape, jnp.float32)
        for t in range(plan.n_steps):
            (o_t, l_t), vjp = jax.vjp(partial(_step, plan, t, r), q, kt, vt)
            w = jnp.where(fin, jnp.exp(l_t - lse_safe), 0.0)  # [B, N, T]
            wb = _lse_to_btn1(w)
            d_o_t = (wb * d_out).astype(o_t.dtype)
            d_l_t = w * (d_lse + jnp.transpose(jnp.sum(d_out * (o_t.astype(jnp.float32) - out), -1), (0, 2, 1)))
            dq_t, dk_t, dv_t = vjp((d_o_t, d_l_t.astype(l_t.dtype)))
            dq = dq + dq_t.astype(jnp.float32)
            dk = dk + dk_t.astype(jnp.float32)
            dv = dv + dv_t.astype(jnp.float32)
            if t + 1 < plan.n_steps:
                kt, vt, dk, dv = _shift((kt, vt, dk, dv), axis_name, plan.p, 1)
        # the accumulators travelled n_steps - 1 hops: send them home
        dk, dv = _shift((dk, dv), axis_name, plan.p, -(plan.n_steps - 1))
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    ring.defvjp(fwd, bwd)
    return ring


def ring_attention_shard(query, key, value, *, axis_name, axis_size, sinks=None, softmax_type=None,
                         is_causal=False, local_window_size=None, scale=None, layout="contiguous",
                         return_lse=False, attention_fn=None):
    """Ring attention on the local blocks, to be called inside ``shard_map`` over ``axis_name``.

    query [B, T/p, N, H], key/value [B, S/p, K, H(_v)] (this device's blocks, in ``layout`` order), sinks [N]
    (this device's heads); softmax_type as in ``dot_product_attention`` (default "learnable" when sinks are given,
    else "vanilla"). Returns out [B, T/p, N, H_v] (and lse [B, N, T/p] fp32 including the sink)."""
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    if softmax_type not in ("vanilla", "off_by_one", "learnable"):
        raise ValueError(f"softmax_type must be vanilla, off_by_one or learnable, got {softmax_type!r}")
    if softmax_type == "learnable" and sinks is None:
        raise ValueError("softmax_type='learnable' needs sinks [N] (SPEC.md section 4)")
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    window_left = None
    if local_window_size is not None:
        wl, wr = (local_window_size, local_window_size) if isinstance(local_window_size, int) else local_window_size
        if not is_causal and wr != 0:
            raise NotImplementedError("ring attention supports causal sliding windows (window_left, 0) only")
        window_left = None if wl is None or wl < 0 else int(wl)
        is_causal = True
    t_loc, s_loc = query.shape[1], key.shape[1]
    if is_causal and t_loc != s_loc:
        raise ValueError(f"causal ring attention needs T == S, got local blocks {t_loc} and {s_loc}")
    if layout == "zigzag":
        if not is_causal:
            layout = "contiguous"  # nothing to balance
        elif window_left is not None:
            raise NotImplementedError("ring attention: zig-zag layout with a sliding window is not supported; "
                                      "use layout='contiguous' (already balanced under a window)")
        elif t_loc % 2:
            raise ValueError("zig-zag layout needs an even local block length")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    plan = _Plan(p=axis_size, t_loc=t_loc, s_loc=s_loc, is_causal=is_causal, window_left=window_left,
                 layout=layout, scale=scale, attention_fn=attention_fn or _default_attention())
    out, lse = _make_ring(plan, axis_name)(query, key, value)
    if softmax_type == "learnable":
        out, lse = _merge_sink(out, lse, sinks)
    elif softmax_type == "off_by_one":
        out, lse = _merge_sink(out, lse, jnp.zeros((query.shape[2],), jnp.float32))
    out = out.astype(query.dtype)
    return (out, lse) if return_lse else out


def _spec_axis(a):
    if a is None:
        return None
    if isinstance(a, (tuple, list)):
        return tuple(a) if len(a) > 1 else (a[0] if a else None)
    return a


def ring_dot_product_attention(query, key, value, *, mesh, seq_axis, batch_axes=None, head_axis=None, sinks=None,
                               softmax_type=None, is_causal=False, local_window_size=None, scale=None,
                               layout="contiguous", return_lse=False, attention_fn=None):
    """Context-parallel attention of global arrays sharded along the sequence over ``mesh`` axis ``seq_axis``.

    query [B, T, N, H], key/value [B, S, K, H(_v)] (BTNH, in ``layout`` order: pass ``zigzag_permute``d arrays
    with ``layout="zigzag"``), optionally also sharded over ``batch_axes`` (batch) and ``head_axis`` (heads;
    sinks [N] sharded with them). Returns out [B, T, N, H_v] (and lse [B, N, T] fp32 when return_lse), with
    the same sharding. Differentiable w.r.t. query, key, value and sinks. softmax_type as in
    ``dot_product_attention``: default "learnable" when sinks are given, else "vanilla"."""
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    if softmax_type == "learnable" and sinks is None:
        raise ValueError("softmax_type='learnable' needs sinks [N] (SPEC.md section 4)")
    if seq_axis not in mesh.shape:
        raise ValueError(f"ring_dot_product_attention: mesh has no axis {seq_axis!r} (axes: {tuple(mesh.shape)})")
    p = mesh.shape[seq_axis]
    b, h = _spec_axis(batch_axes), _spec_axis(head_axis)
    qspec = P(b, seq_axis, h, None)
    lspec = P(b, h, seq_axis)
    if sinks is None:
        sinks_arr, sspec = jnp.zeros((query.shape[2],), jnp.float32), P(h)
    else:
        sinks_arr, sspec = jnp.asarray(sinks, jnp.float32), P(h)

    def body(q, k, v, s):
        return ring_attention_shard(q, k, v, axis_name=seq_axis, axis_size=p, sinks=s, softmax_type=softmax_type,
                                    is_causal=is_causal, local_window_size=local_window_size, scale=scale,
                                    layout=layout, return_lse=return_lse, attention_fn=attention_fn)

    out_specs = (qspec, lspec) if return_lse else qspec
    # check_vma=True where jax has the varying-axes type (attention.vma_typing_supported): the fused op types its
    # results and cotangents like its inputs (attention.py, _vma), and the ring's own zero blocks are cast with
    # _vary_like. The transpose sums the cotangent of the sinks, replicated over the sequence (and batch) axes,
    # over those axes (tests/python/test_ring.py checks d_sinks).
    f = jax.shard_map(body, mesh=mesh, in_specs=(qspec, qspec, qspec, sspec), out_specs=out_specs,
                      check_vma=vma_typing_supported())
    return f(query, key, value, sinks_arr)
