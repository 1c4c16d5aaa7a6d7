"""Context-parallel ring attention with softmax sinks.

The sequence axis of query/key/value is sharded over one mesh axis (``seq_axis``, size ``p``). Each device keeps
its query block; key/value blocks travel between devices with ``lax.ppermute``; every piece of work is ONE fused
call of ``sinkattn.jax.dot_product_attention`` (``softmax_type="vanilla"``, ``return_lse=True``) of (part of) the
local query block against (part of) a visiting key/value block, and the partial results are merged (SPEC.md
section 2):

    lse = logsumexp_k(lse_k)                  out = sum_k exp(lse_k - lse) * out_k

The sink is counted exactly once, as a final merge with a zero-value term of logit sigma
(sigma = sinks[h] for ``learnable``, 0 for ``off_by_one``):

    LSE = logaddexp(lse, sigma)               OUT = exp(lse - LSE) * out

which is SPEC.md's LSE_i = log(exp(sigma) + sum_j exp(S_ij)) and out_i = sum_j P_ij v_j.

Backward (SPEC.md section 3): a ``jax.custom_vjp`` around the vanilla ring. The fused backward computes
P_ij = exp(S_ij - lse_i) and D_i = dot(d_out_i, out_i) from the out / lse it is given, so each piece calls
:func:`sinkattn.jax.attention.attention_backward` with the MERGED out and lse (and the merge's d_out, d_lse) and
one block's keys: dS = P (dP - D + d_lse) is then exactly that block's share of the single-call gradient, with no
per-piece forward recomputed. Key/value blocks travel the ring again with their fp32 dk/dv accumulators. d_sinks
comes from autodiff of the final sink merge, d_sinks[h] = sum_i exp(sigma - LSE_i) (d_LSE_i - dot(d_OUT_i, OUT_i)),
summed over the ring/batch axes by the transpose of ``shard_map`` (sinks are replicated over them).

Masks: non-causal, causal, and causal sliding windows ``local_window_size=(window_left, 0)`` (GPT-OSS: 127),
top-left aligned with T == S (self-attention).

Schedules (all static, decided at trace time from p, the layout and the window; no ``lax.cond``: on the GPU an XLA
conditional copies its predicate to the host and waits for it, so work a device does not need is computed on its
(zero or stale) inputs and dropped with ``where``, which costs nothing in wall time because another device does
real work in that step):

- non-causal and causal without a window: ``p`` steps. At step t the device holds the block that started on device
  (r - t) mod p. The transfer of the next block (``ppermute`` by one) is issued before the step's fused call and
  does not depend on it, so XLA can run it as an asynchronous collective-permute during the call (double
  buffering; with ``--xla_gpu_enable_latency_hiding_scheduler=true`` on the GPU, which the benchmark sets). In the
  backward the dk/dv accumulator of step t is sent while step t + 1 computes.
- causal, ``layout="zigzag"`` (load balance): the sequence is cut in 2p chunks and device r holds chunks r and
  2p-1-r (permute once at the model input with :func:`zigzag_permute`, undo with :func:`zigzag_unpermute`). Step 0
  is a causal call on the local 2c x 2c block; every other step is two unmasked c x c calls on every device: the
  local second chunk against the visiting first chunk, plus either (visiting block from an earlier device) the
  local first chunk against the visiting first chunk or (from a later device) the local second chunk against
  the visiting second chunk. The choice is a ``where`` on the inputs, so both devices and steps cost the same.
- causal sliding window (either layout): only the chunk pairs the band reaches are computed. A query chunk a
  needs the keys of chunks a - delta for delta = 0 .. ceil(window_left / c) (c the chunk length), and of the chunk
  a - delta only its last ``window_left - (delta - 1) c`` keys. Delta 0 is local (one causal-window call per local
  chunk); for delta >= 1 exactly those key rows are sent straight from the chunk's device with one
  ``ppermute`` per (local chunk, delta) (no hops through the ring), and only the query rows the band reaches are
  computed. Window 127 on 32k tokens over 8 devices (contiguous, c = 4096): one 4096-row causal-window call plus
  one 127 x 127 call per device, and 127 key rows sent, instead of 8 ring steps. The fetched rows are kept for the
  backward, which sends their dk/dv straight back. Memory: O(window_left + c) key rows per device.

Not supported here (raise): bias, segment ids / sequence lengths, dropout, non-causal windows.

The static schedule (zig-zag order, band pieces and their transfers, the mask rules) is framework-free and shared
with the PyTorch ring (``sinkattn.torch.distributed``): ``sinkattn/_context_parallel.py``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from .._args import SOFTMAX_TYPES, resolve_softmax_type, softmax_scale
from .._context_parallel import RingPlan, resolve_ring_masks as _resolve_masks, ring_schedule, zigzag_order
from .attention import attention_backward, dot_product_attention, vma_typing_supported
from .sharding import _axes, _spec_entry

__all__ = [
    "ring_dot_product_attention",
    "ring_attention_shard",
    "ring_schedule",
    "zigzag_permute",
    "zigzag_unpermute",
    "zigzag_order",
]

_NEG_INF = -jnp.inf
_BIG = 1 << 30  # a window bound wider than any sequence (SPEC.md: same as no window)


# ----------------------------------------------------------------------------------------------------------------
# zig-zag layout helpers
# ----------------------------------------------------------------------------------------------------------------
def _zigzag_chunks(x, num_shards, axis):
    n = x.shape[axis]
    if n % (2 * num_shards):
        raise ValueError(f"zigzag: sequence length {n} not divisible by 2 * num_shards = {2 * num_shards}")
    return jnp.split(x, 2 * num_shards, axis=axis)


def zigzag_permute(x, num_shards: int, axis: int = 1):
    """Natural sequence order -> zig-zag order along ``axis`` (length must be divisible by 2 * num_shards)."""
    chunks = _zigzag_chunks(x, num_shards, axis)
    return jnp.concatenate([chunks[c] for c in zigzag_order(num_shards)], axis=axis)


def zigzag_unpermute(x, num_shards: int, axis: int = 1):
    """Inverse of :func:`zigzag_permute`."""
    chunks = _zigzag_chunks(x, num_shards, axis)
    inv = np.argsort(zigzag_order(num_shards))
    return jnp.concatenate([chunks[int(inv[c])] for c in range(2 * num_shards)], axis=axis)


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
    out = _lse_to_btn1(wa) * out_a + _lse_to_btn1(wb) * out_b.astype(jnp.float32)
    return out, lse


def _merge_sink(out, lse, sigma):
    """Final merge with the sink (a zero-value term of logit sigma [N]); differentiable (gives d_sinks).
    LSE = logaddexp(lse, sigma), OUT = exp(lse - LSE) * out. sigma is finite, so LSE is finite."""
    sig = sigma.astype(jnp.float32)[None, :, None]
    lse_f = jnp.logaddexp(lse, sig)
    w = jnp.exp(lse - lse_f)  # lse = -inf (row saw no key) -> w = 0, gradient 0
    return _lse_to_btn1(w) * out, lse_f


# ----------------------------------------------------------------------------------------------------------------
# the static schedule (sinkattn._context_parallel, shared with the PyTorch ring)
# ----------------------------------------------------------------------------------------------------------------
class _Plan(RingPlan):
    """The shared static plan plus the softmax scale of the fused calls."""

    def __init__(self, *, p, t_loc, is_causal, window_left, layout, scale):
        super().__init__(p=p, t_loc=t_loc, is_causal=is_causal, window_left=window_left, layout=layout)
        self.scale = scale


def _piece_mask(piece):
    """The JAX op's mask arguments of a band piece (top-left window, right side unbounded)."""
    return {} if piece.window_left is None else dict(local_window_size=(piece.window_left, _BIG))


# ----------------------------------------------------------------------------------------------------------------
# fused calls and traced helpers
# ----------------------------------------------------------------------------------------------------------------
def _fwd(plan, q, k, v, mask):
    out, lse = dot_product_attention(q, k, v, softmax_type="vanilla", scale=plan.scale, return_lse=True,
                                     mask_alignment="top_left", **mask)
    return out, lse.astype(jnp.float32)


def _bwd(plan, q, k, v, out, lse, d_out, d_lse, mask):
    dq, dk, dv, _ = attention_backward(q, k, v, out, lse, d_out, d_lse, softmax_type="vanilla", scale=plan.scale,
                                       mask_alignment="top_left", **mask)
    return dq.astype(jnp.float32), dk.astype(jnp.float32), dv.astype(jnp.float32)


def _flag(table, r, where=None):
    """table[r] for a static per-device table: a Python bool when it is the same on every device considered
    (``where``: the devices it matters for), else a traced bool."""
    t = np.asarray(table, bool)
    vals = set(t[where].tolist()) if where is not None else set(t.tolist())
    if len(vals) <= 1:
        return bool(vals.pop()) if vals else False
    return jnp.asarray(t)[r]


def _sel(flag, a, b):
    """where(flag, a, b) over pytrees; a static flag picks without computing."""
    if flag is True:
        return a
    if flag is False:
        return b
    return jax.tree_util.tree_map(lambda x, y: jnp.where(flag, x, y), a, b)


def _shift(x, axis_name, p, by=1):
    by %= p
    if by == 0:
        return x
    return jax.lax.ppermute(x, axis_name, [(i, (i + by) % p) for i in range(p)])


def _slots(x, layout, axis=1):
    return [x] if layout.slots == 1 else jnp.split(x, layout.slots, axis=axis)


def _unslots(xs, axis=1):
    return xs[0] if len(xs) == 1 else jnp.concatenate(xs, axis=axis)


def _rows(x, n, axis=1):
    """The first n rows along axis (the lse layout [B, N, T] has its rows on axis 2)."""
    return jax.lax.slice_in_dim(x, 0, n, axis=axis)


def _set_rows(acc, n, new, axis=1):
    if n == acc.shape[axis]:
        return new
    return jnp.concatenate([new, jax.lax.slice_in_dim(acc, n, acc.shape[axis], axis=axis)], axis=axis)


def _mask_lse(flag, lse):
    return _sel(flag, lse, jnp.full_like(lse, _NEG_INF))


def _mask_zero(flag, x):
    return _sel(flag, x, jnp.zeros_like(x))


# ----------------------------------------------------------------------------------------------------------------
# sliding window: the band pieces
# ----------------------------------------------------------------------------------------------------------------
def _fetch(plan, piece, r, axis_name, kv_slots):
    """The key/value rows [e, c) of chunk a - delta, from wherever they live (one ppermute per transfer)."""
    tails = [jax.tree_util.tree_map(lambda x: x[:, piece.e:], kv) for kv in kv_slots]
    got = None
    for tr in piece.transfers:
        slot1 = _flag(tr.send_slot == 1, r, tr.sender)
        send = tails[0] if len(tails) == 1 else _sel(slot1, tails[1], tails[0])
        recv = jax.lax.ppermute(send, axis_name, tr.pairs)  # devices that are no destination receive zeros
        got = recv if got is None else _sel(_flag(tr.receiver, r), recv, got)
    if piece.local.any():
        mine = _sel(_flag(piece.local_slot == 1, r, piece.local), tails[-1], tails[0])
        got = mine if got is None else _sel(_flag(piece.local, r), mine, got)
    return got


def _band_forward(plan, axis_name, q, k, v):
    L, W = plan.layout, plan.window_left
    r = jax.lax.axis_index(axis_name)
    qs, kv_slots = _slots(q, L), list(zip(_slots(k, L), _slots(v, L)))
    # every transfer first: none depends on a fused call, so they run while the local chunks compute
    fetched = [_fetch(plan, pc, r, axis_name, kv_slots) for pc in plan.pieces]
    accs = []
    for u in range(L.slots):
        o, l = _fwd(plan, qs[u], *kv_slots[u], dict(is_causal=True, local_window_size=(W, 0)))
        accs.append((o.astype(jnp.float32), l))
    for pc, (kb, vb) in zip(plan.pieces, fetched):
        o, l = _fwd(plan, _rows(qs[pc.u], pc.rows), kb, vb, _piece_mask(pc))
        l = _mask_lse(_flag(pc.valid, r), l)
        out_u, lse_u = accs[pc.u]
        mo, ml = _merge(_rows(out_u, pc.rows), _rows(lse_u, pc.rows, 2), o, l)
        accs[pc.u] = (_set_rows(out_u, pc.rows, mo), _set_rows(lse_u, pc.rows, ml, 2))
    return _unslots([a[0] for a in accs]), _unslots([a[1] for a in accs], 2), fetched


def _band_backward(plan, axis_name, q, k, v, fetched, out, lse, d_out, d_lse):
    L, W = plan.layout, plan.window_left
    r = jax.lax.axis_index(axis_name)
    qs, ks, vs = _slots(q, L), _slots(k, L), _slots(v, L)
    os_, ls_, dos, dls = _slots(out, L), _slots(lse, L, 2), _slots(d_out, L), _slots(d_lse, L, 2)
    dq, dk, dv = [], [], []
    for u in range(L.slots):
        dq_u, dk_u, dv_u = _bwd(plan, qs[u], ks[u], vs[u], os_[u], ls_[u], dos[u], dls[u],
                                dict(is_causal=True, local_window_size=(W, 0)))
        dq.append(dq_u)
        dk.append(dk_u)
        dv.append(dv_u)
    for pc, (kb, vb) in zip(plan.pieces, fetched):
        n, u = pc.rows, pc.u
        dqp, dkp, dvp = _bwd(plan, _rows(qs[u], n), kb, vb, _rows(os_[u], n), _rows(ls_[u], n, 2),
                             _rows(dos[u], n), _rows(dls[u], n, 2), _piece_mask(pc))
        dq[u] = _set_rows(dq[u], n, _rows(dq[u], n) + _mask_zero(_flag(pc.valid, r), dqp))
        # dk/dv of the fetched rows go straight back to the chunk's device, into the slot they came from
        back = []
        for tr in pc.transfers:
            got = jax.lax.ppermute((dkp, dvp), axis_name, [(b, a) for a, b in tr.pairs])
            back.append((got, tr.sender, tr.send_slot))
        if pc.local.any():
            back.append(((dkp, dvp), pc.local, pc.local_slot))
        for (gk, gv), owner, slot in back:
            for s in range(L.slots):
                flag = _flag(owner & (slot == s), r)
                if flag is False:
                    continue
                dk[s] = dk[s].at[:, pc.e:].add(_mask_zero(flag, gk))
                dv[s] = dv[s].at[:, pc.e:].add(_mask_zero(flag, gv))
    return _unslots(dq), _unslots(dk), _unslots(dv)


# ----------------------------------------------------------------------------------------------------------------
# full / causal / zig-zag: the ring of p steps
# ----------------------------------------------------------------------------------------------------------------
def _chain_step_forward(plan, t, r, q, kt, vt):
    """[(local query slot or None for the whole block, out, lse)] of step t (the block from device r - t)."""
    if plan.mode == "full":
        return [(None, *_fwd(plan, q, kt, vt, {}))]
    if t == 0:
        return [(None, *_fwd(plan, q, kt, vt, dict(is_causal=True)))]
    if plan.mode == "causal":  # the block is in the past iff it left an earlier device (r >= t)
        o, l = _fwd(plan, q, kt, vt, {})
        return [(None, o, _mask_lse(r >= t, l))]
    # zig-zag: earlier = the visiting block's chunks (s, 2p-1-s) precede the local (r, 2p-1-r) as s < r
    earlier = r >= t
    (q0, q1), (k0, k1), (v0, v1) = _slots(q, plan.layout), _slots(kt, plan.layout), _slots(vt, plan.layout)
    ox, lx = _fwd(plan, q1, k0, v0, {})  # the local second chunk sees the visiting first chunk either way
    oy, ly = _fwd(plan, _sel(earlier, q0, q1), _sel(earlier, k0, k1), _sel(earlier, v0, v1), {})
    return [(1, ox, lx), (0, oy, _mask_lse(earlier, ly)), (1, oy, _mask_lse(~earlier, ly))]


def _chain_forward(plan, axis_name, q, k, v):
    r = jax.lax.axis_index(axis_name)
    accs = None
    kv = (k, v)
    for t in range(plan.p):
        nxt = _shift(kv, axis_name, plan.p) if t + 1 < plan.p else None  # issued before this step's calls
        for slot, o, l in _chain_step_forward(plan, t, r, q, *kv):
            if accs is None:  # step 0 covers every local query row
                accs = list(zip(_slots(o.astype(jnp.float32), plan.layout), _slots(l, plan.layout, 2)))
                continue
            u = 0 if slot is None else slot
            accs[u] = _merge(*accs[u], o, l)
        kv = nxt
    return _unslots([a[0] for a in accs]), _unslots([a[1] for a in accs], 2)


def _chain_step_backward(plan, t, r, q, kt, vt, out, lse, d_out, d_lse):
    """(dq contribution, dk, dv of the visiting block), fp32, of step t."""
    g = (q, kt, vt, out, lse, d_out, d_lse)
    if plan.mode == "full":
        return _bwd(plan, *g, {})
    if t == 0:
        return _bwd(plan, *g, dict(is_causal=True))
    if plan.mode == "causal":
        return tuple(_mask_zero(r >= t, x) for x in _bwd(plan, *g, {}))
    earlier = r >= t
    L = plan.layout
    (q0, q1), (k0, k1), (v0, v1) = _slots(q, L), _slots(kt, L), _slots(vt, L)
    (o0, o1), (l0, l1) = _slots(out, L), _slots(lse, L, 2)
    (do0, do1), (dl0, dl1) = _slots(d_out, L), _slots(d_lse, L, 2)
    dqx, dkx, dvx = _bwd(plan, q1, k0, v0, o1, l1, do1, dl1, {})
    pick = partial(_sel, earlier)
    dqy, dky, dvy = _bwd(plan, pick(q0, q1), pick(k0, k1), pick(v0, v1), pick(o0, o1), pick(l0, l1),
                         pick(do0, do1), pick(dl0, dl1), {})
    dq = jnp.concatenate([_mask_zero(earlier, dqy), dqx + _mask_zero(~earlier, dqy)], axis=1)
    dk = jnp.concatenate([dkx + _mask_zero(earlier, dky), _mask_zero(~earlier, dky)], axis=1)
    dv = jnp.concatenate([dvx + _mask_zero(earlier, dvy), _mask_zero(~earlier, dvy)], axis=1)
    return dq, dk, dv


def _chain_backward(plan, axis_name, q, k, v, out, lse, d_out, d_lse):
    r = jax.lax.axis_index(axis_name)
    kv = (k, v)
    dq = acc = arriving = None
    for t in range(plan.p):
        nxt = _shift(kv, axis_name, plan.p) if t + 1 < plan.p else None  # issued before this step's calls
        dq_t, dk_t, dv_t = _chain_step_backward(plan, t, r, q, *kv, out, lse, d_out, d_lse)
        dq = dq_t if dq is None else dq + dq_t
        # the accumulator of the visiting block arrived from device r - 1 (sent after its step t - 1)
        acc = (dk_t, dv_t) if arriving is None else (arriving[0] + dk_t, arriving[1] + dv_t)
        if t + 1 < plan.p:
            arriving = _shift(acc, axis_name, plan.p)  # overlaps the calls of step t + 1
        kv = nxt
    dk, dv = _shift(acc, axis_name, plan.p)  # after p - 1 hops the accumulator is one device short of home
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------
# the vanilla ring (custom_vjp) and the sink merge
# ----------------------------------------------------------------------------------------------------------------
def _make_ring(plan, axis_name):
    band = plan.mode == "band"

    def forward(q, k, v):
        if band:
            return _band_forward(plan, axis_name, q, k, v)
        return _chain_forward(plan, axis_name, q, k, v) + (None,)

    @jax.custom_vjp
    def ring(q, k, v):
        out, lse, _ = forward(q, k, v)
        return out, lse

    def fwd(q, k, v):
        out, lse, fetched = forward(q, k, v)
        # the backward reads out in the inputs' dtype (SPEC.md section 3: D from the stored, rounded out)
        return (out, lse), (q, k, v, fetched, out.astype(q.dtype), lse)

    def bwd(res, cts):
        q, k, v, fetched, out, lse = res
        d_out, d_lse = cts
        d_out = d_out.astype(q.dtype)  # what every fused backward reads (cast once, not per call)
        d_lse = d_lse.astype(jnp.float32)
        if band:
            dq, dk, dv = _band_backward(plan, axis_name, q, k, v, fetched, out, lse, d_out, d_lse)
        else:
            dq, dk, dv = _chain_backward(plan, axis_name, q, k, v, out, lse, d_out, d_lse)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    ring.defvjp(fwd, bwd)
    return ring


def ring_attention_shard(query, key, value, *, axis_name, axis_size, sinks=None, softmax_type=None,
                         is_causal=False, local_window_size=None, scale=None, layout="contiguous",
                         return_lse=False):
    """Ring attention on the local blocks, to be called inside ``shard_map`` over ``axis_name``.

    query [B, T/p, N, H], key/value [B, S/p, K, H(_v)] (this device's blocks, in ``layout`` order), sinks [N]
    (this device's heads); softmax_type as in ``dot_product_attention`` (default "learnable" when sinks are given,
    else "vanilla"). Returns out [B, T/p, N, H_v] (and lse [B, N, T/p] fp32 including the sink)."""
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    if softmax_type not in SOFTMAX_TYPES:
        raise ValueError(f"softmax_type must be vanilla, off_by_one or learnable, got {softmax_type!r}")
    if softmax_type == "learnable" and sinks is None:
        raise ValueError("softmax_type='learnable' needs sinks [N] (SPEC.md section 4)")
    t_loc, s_loc = query.shape[1], key.shape[1]
    is_causal, window_left, layout = _resolve_masks(is_causal, local_window_size, layout, t_loc)
    if is_causal and t_loc != s_loc:
        raise ValueError(f"causal ring attention needs T == S, got local blocks {t_loc} and {s_loc}")
    scale = softmax_scale(scale, query.shape[-1])
    plan = _Plan(p=axis_size, t_loc=t_loc, is_causal=is_causal, window_left=window_left, layout=layout, scale=scale)
    out, lse = _make_ring(plan, axis_name)(query, key, value)
    if softmax_type == "learnable":
        out, lse = _merge_sink(out, lse, sinks)
    elif softmax_type == "off_by_one":
        out, lse = _merge_sink(out, lse, jnp.zeros((query.shape[2],), jnp.float32))
    out = out.astype(query.dtype)
    return (out, lse) if return_lse else out


def ring_dot_product_attention(query, key, value, *, mesh, seq_axis, batch_axes=None, head_axis=None, sinks=None,
                               softmax_type=None, is_causal=False, local_window_size=None, scale=None,
                               layout="contiguous", return_lse=False):
    """Context-parallel attention of global arrays sharded along the sequence over ``mesh`` axis ``seq_axis``.

    query [B, T, N, H], key/value [B, S, K, H(_v)] (BTNH, in ``layout`` order: pass ``zigzag_permute``d arrays
    with ``layout="zigzag"``), optionally also sharded over ``batch_axes`` (batch) and ``head_axis`` (heads;
    sinks [N] sharded with them). Returns out [B, T, N, H_v] (and lse [B, N, T] fp32 when return_lse), with
    the same sharding. Differentiable w.r.t. query, key, value and sinks. softmax_type as in
    ``dot_product_attention``: default "learnable" when sinks are given, else "vanilla". The schedule (steps,
    transfers, skipped work under a window) is in the module docstring and :func:`ring_schedule`."""
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    if softmax_type == "learnable" and sinks is None:
        raise ValueError("softmax_type='learnable' needs sinks [N] (SPEC.md section 4)")
    if seq_axis not in mesh.shape:
        raise ValueError(f"ring_dot_product_attention: mesh has no axis {seq_axis!r} (axes: {tuple(mesh.shape)})")
    p = mesh.shape[seq_axis]
    b, h = _spec_entry(_axes(batch_axes)), _spec_entry(_axes(head_axis))
    qspec = P(b, seq_axis, h, None)
    lspec = P(b, h, seq_axis)
    sinks_arr = jnp.zeros((query.shape[2],), jnp.float32) if sinks is None else jnp.asarray(sinks, jnp.float32)

    def body(q, k, v, s):
        return ring_attention_shard(q, k, v, axis_name=seq_axis, axis_size=p, sinks=s, softmax_type=softmax_type,
                                    is_causal=is_causal, local_window_size=local_window_size, scale=scale,
                                    layout=layout, return_lse=return_lse)

    out_specs = (qspec, lspec) if return_lse else qspec
    # check_vma=True where jax has the varying-axes type (attention.vma_typing_supported): the fused op types its
    # results and cotangents like its inputs (attention.py, _vma), and the ring's own zero blocks are cast with
    # _vary_to. The transpose sums the cotangent of the sinks, replicated over the sequence (and batch) axes,
    # over those axes (tests/python/test_ring.py checks d_sinks).
    f = jax.shard_map(body, mesh=mesh, in_specs=(qspec, qspec, qspec, P(h)), out_specs=out_specs,
                      check_vma=vma_typing_supported())
    return f(query, key, value, sinks_arr)
