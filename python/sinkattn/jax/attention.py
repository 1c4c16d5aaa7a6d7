"""``sinkattn.jax.dot_product_attention``: fused attention with softmax sinks as XLA FFI custom calls.

Forward and backward are one XLA custom call each (typed FFI API, handlers in python/ffi/ffi_handlers.cpp) on the
CPU and, when the library has its CUDA backend and JAX a GPU, on CUDA (XLA's stream, no allocation inside:
CUDA-graph compatible; the only host synchronisation is the library's check of varlen / padding length tensors,
b + 1 int32 read back per call, skipped while XLA captures the call into a CUDA graph). ``jax.custom_vjp`` connects them, so ``jax.grad`` gives dq, dk, dv,
d_sinks and d_bias; ``jit``, ``vmap`` (sequential over the mapped axis) and ``grad`` compose. The library's scratch
memory is an extra XLA output sized at trace time by the library's own size query (SPEC.md section 4).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import _args
from .._errors import with_argument_names
from . import _ffi

__all__ = ["dot_product_attention", "attention_backward", "poison_outputs_for_testing", "rng_seed_offset_words"]

_POISON = [False]


@contextlib.contextmanager
def poison_outputs_for_testing(enabled: bool = True):
    """Test hook: calls traced inside this context start with every output buffer filled with NaN (the NaN arrays
    are aliased to the custom calls' outputs), so a library that skips writing some output element is caught."""
    old = _POISON[0]
    _POISON[0] = enabled
    try:
        yield
    finally:
        _POISON[0] = old


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static options of one call (hashable: a nondiff argument of the custom_vjp)."""

    softmax_type: int
    softmax_scale: Optional[float]  # None: 1/sqrt(d)
    window_left: int
    window_right: int
    mask_alignment: int
    dropout_p: float
    deterministic: bool
    varlen: bool
    max_seqlen_q: int
    max_seqlen_kv: int
    return_lse: bool
    poison: bool

    def attrs(self, operands: int) -> dict:
        return dict(
            softmax_type=np.int32(self.softmax_type),
            softmax_scale=np.float32(np.nan if self.softmax_scale is None else self.softmax_scale),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            mask_alignment=np.int32(self.mask_alignment),
            dropout_p=np.float64(self.dropout_p),
            deterministic=np.int32(1 if self.deterministic else 0),
            max_seqlen_q=np.int64(self.max_seqlen_q),
            max_seqlen_kv=np.int64(self.max_seqlen_kv),
            operands=np.int32(operands),
        )

    def options(self) -> dict:
        """Option fields of sinkattn_params_t for the size queries."""
        return dict(
            softmax_type=self.softmax_type,
            softmax_scale=float("nan") if self.softmax_scale is None else float(self.softmax_scale),
            window_left=self.window_left,
            window_right=self.window_right,
            mask_alignment=self.mask_alignment,
            dropout_p=self.dropout_p,
            deterministic=1 if self.deterministic else 0,
            max_seqlen_q=self.max_seqlen_q,
            max_seqlen_kv=self.max_seqlen_kv,
        )


def _sd(x):
    return (tuple(x.shape), x.dtype)


def _operands(*entries):
    """(bitmask, operand list, {param field: array}) of the present optional operands, in the order of `entries` (the
    handler's protocol order, python/ffi/ffi_handlers.cpp). Each entry is (bit, ((field or None, array), ...)); it is
    absent when its first array is None. A field of None is an operand without a sinkattn_params_t field here."""
    bits, ops, fields = 0, [], {}
    for bit, items in entries:
        if items[0][1] is None:
            continue
        bits |= bit
        for name, x in items:
            ops.append(x)
            if name is not None:
                fields[name] = x
    return bits, ops, fields


def _optional_operands(sinks, bias, d_lse, batch, rng):
    """(bitmask, operand list, {param field: array}) of the optional operands, in protocol order."""
    cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv = batch
    return _operands((_ffi.OP_SINKS, (("sinks", sinks),)), (_ffi.OP_BIAS, (("bias", bias),)),
                     (_ffi.OP_D_LSE, (("d_lse", d_lse),)),
                     (_ffi.OP_CU_SEQLENS, (("cu_seqlens_q", cu_q), ("cu_seqlens_kv", cu_kv))),
                     (_ffi.OP_SEQUSED_KV, (("seqused_kv", seqused_kv),)), (_ffi.OP_SEQLENS_Q, (("seqlens_q", seqlens_q),)),
                     (_ffi.OP_SEQLENS_KV, (("seqlens_kv", seqlens_kv),)), (_ffi.OP_RNG, ((None, rng),)))


def _workspace(backward: bool, platform: str, tensors: dict, options: dict) -> int:
    """Bytes of the workspace buffer XLA allocates for the call: the library's size query (raises SinkattnError with
    its message) on CUDA; 0 on the CPU, whose handler takes the workspace from the host heap, sized with the call's
    batch tensors (the CPU backend's workspace follows the keys each sequence reads, which shapes cannot tell:
    python/ffi/ffi_handlers.cpp), after the same query validated the call here. For a platform other than JAX's
    default one (a branch of lax.platform_dependent that runs only if the user places the call there), an invalid
    call is not raised at trace time: the library re-validates when that branch runs and raises the same message
    then. ``options``: option fields of sinkattn_params_t (_Config.options(), plus num_splits for decode)."""
    try:
        size = _ffi.workspace_size(backward, platform, tensors, options)
    except _ffi.SinkattnError:
        if platform == _ffi.default_platform() or len(_ffi.platforms()) == 1:
            raise
        return 0
    return 0 if platform == "cpu" else size


def _call_on_platforms(fn, *args):
    """fn(platform, *args) lowered per platform (lax.platform_dependent when the op can run on several)."""
    plats = _ffi.platforms()
    if len(plats) == 1:
        return fn(plats[0], *args)
    return jax.lax.platform_dependent(*args, **{p: (lambda *a, _p=p: fn(_p, *a)) for p in plats})


def _ffi_call(target, results, operands, attrs, poison_shapes):
    """jax.ffi.ffi_call with the test-only NaN output poisoning (extra operands aliased to the outputs)."""
    aliases = None
    if poison_shapes:
        vma = _union_vma(*operands)  # the same shard_map type as the other operands (see _vma)
        extra = [_vary_to(jnp.full(shape, jnp.nan if jnp.issubdtype(dtype, jnp.floating) else 0xAB, dtype), vma)
                 for shape, dtype in poison_shapes]
        aliases = {len(operands) + i: i for i in range(len(extra))}
        operands = list(operands) + extra
    call = jax.ffi.ffi_call(target, results, vmap_method="sequential", input_output_aliases=aliases)
    return call(*operands, **attrs)


def _forward(cfg: _Config, q, k, v, sinks, bias, batch, rng):
    """out, softmax_lse, rng_state (u32[4] or None) of SPEC.md section 2."""
    bits, opt, fields = _optional_operands(sinks, bias, None, batch, rng)
    if cfg.varlen:
        out_shape, lse_shape = (q.shape[0], q.shape[1], v.shape[2]), (q.shape[1], q.shape[0])
    else:
        out_shape, lse_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), (q.shape[0], q.shape[2], q.shape[1])
    tensors = {name: _sd(x) for name, x in fields.items()}
    tensors.update(q=_sd(q), k=_sd(k), v=_sd(v), out=(out_shape, q.dtype), softmax_lse=(lse_shape, np.float32))
    if rng is not None:
        tensors["rng_seed_offset"] = ((4,), np.uint32)
        tensors["rng_state"] = ((4,), np.uint32)

    def run(platform, *operands):
        ws = _workspace(False, platform, tensors, cfg.options())
        results = [jax.ShapeDtypeStruct(out_shape, q.dtype), jax.ShapeDtypeStruct(lse_shape, jnp.float32),
                   jax.ShapeDtypeStruct((max(ws, 1),), jnp.uint8)]
        if cfg.dropout_p > 0.0:
            results.append(jax.ShapeDtypeStruct((4,), jnp.uint32))
        poison = [(out_shape, q.dtype), (lse_shape, jnp.float32)] if cfg.poison else None
        res = _ffi_call(_ffi.FORWARD_TARGET, results, operands, cfg.attrs(bits), poison)
        return res[0], res[1], (res[3] if cfg.dropout_p > 0.0 else None)

    return _call_on_platforms(run, q, k, v, *opt)


def _backward(cfg: _Config, q, k, v, sinks, bias, batch, out, lse, rng_state, d_out, d_lse):
    """dq, dk, dv, d_sinks (learnable, else None), d_bias (with bias, else None) of SPEC.md section 3."""
    bits, opt, fields = _optional_operands(sinks, bias, d_lse, batch, rng_state)
    learnable = cfg.softmax_type == _args.SOFTMAX_TYPES["learnable"]
    tensors = {name: _sd(x) for name, x in fields.items()}
    tensors.update(q=_sd(q), k=_sd(k), v=_sd(v), out=_sd(out), softmax_lse=_sd(lse), d_out=_sd(d_out),
                   dq=_sd(q), dk=_sd(k), dv=_sd(v))
    if learnable:
        tensors["d_sinks"] = _sd(sinks)
    if bias is not None:
        tensors["d_bias"] = _sd(bias)
    if rng_state is not None:
        tensors["rng_state"] = ((4,), np.uint32)
    outs = [_sd(q), _sd(k), _sd(v)]
    extra = ([_sd(sinks)] if learnable else []) + ([_sd(bias)] if bias is not None else [])

    def run(platform, *operands):
        ws = _workspace(True, platform, tensors, cfg.options())
        results = [jax.ShapeDtypeStruct(s, d) for s, d in outs]
        results.append(jax.ShapeDtypeStruct((max(ws, 1),), jnp.uint8))
        results += [jax.ShapeDtypeStruct(s, d) for s, d in extra]
        poison = None
        if cfg.poison:  # NaN in dq, dk, dv, d_sinks, d_bias (and zeros in the scratch workspace)
            poison = outs + [((max(ws, 1),), jnp.uint8)] + extra
        res = _ffi_call(_ffi.BACKWARD_TARGET, results, operands, cfg.attrs(bits), poison)
        return tuple(res[:3]) + tuple(res[4:])

    res = _call_on_platforms(run, q, k, v, out, lse, d_out, *opt)
    dq, dk, dv = res[:3]
    rest = list(res[3:])
    d_sinks = rest.pop(0) if learnable else None
    d_bias = rest.pop(0) if bias is not None else None
    return dq, dk, dv, d_sinks, d_bias


# ----------------------------------------------------------------------------------------------------------------
# shard_map(check_vma=True) typing. Inside shard_map every value carries the set of manual mesh axes it varies over
# ("vma"). An FFI call's results do not derive it from the operands (jax 0.10: always empty), and a custom_vjp
# backward must return cotangents of exactly its primal inputs' types. So the op (1) casts all its operands to the
# union V of their varying axes before the custom_vjp (lax.pcast(..., to="varying"), whose transpose is a psum over
# the newly varying axes: that is how d_sinks of sinks replicated over a batch axis gets summed over the batch,
# SPEC.md section 3), and (2) casts every FFI result, forward outputs and backward cotangents, to V. Outside
# shard_map V is empty and all of this is a no-op.
# ----------------------------------------------------------------------------------------------------------------
def _vma(x) -> frozenset:
    """The manual mesh axes x varies over inside shard_map (empty outside shard_map or with check_vma=False)."""
    if x is None:
        return frozenset()
    t = jax.typeof(x)
    vma = getattr(t, "vma", None)  # jax 0.6 .. 0.9 spelling
    if vma is not None:
        return frozenset(vma)
    mat = getattr(t, "manual_axis_type", None)  # jax >= 0.10 spelling
    return frozenset(getattr(mat, "varying", None) or ())


def vma_typing_supported() -> bool:
    """Whether this jax exposes the varying-axes type (``.vma`` or ``.manual_axis_type``) and a cast to
    'varying' (lax.pcast or lax.pvary), i.e. whether the op can type its results for shard_map(check_vma=True).
    sharding.py and ring.py use check_vma=True when it does and check_vma=False otherwise (a future jax that
    renames these again would otherwise make the custom_vjp reject the op's cotangents)."""
    t = jax.typeof(np.zeros((), np.float32))
    has_type = hasattr(t, "vma") or hasattr(getattr(t, "manual_axis_type", None), "varying")
    return has_type and (hasattr(jax.lax, "pcast") or hasattr(jax.lax, "pvary"))


def _vary_to(x, axes: frozenset):
    """x typed as varying over (at least) ``axes``; no-op for None, float0 and when nothing is missing."""
    if x is None or getattr(x, "dtype", None) == jax.dtypes.float0:
        return x
    missing = axes - _vma(x)
    if not missing:
        return x
    names = tuple(sorted(missing))
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, names, to="varying")
    return jax.lax.pvary(x, names)  # jax < 0.8


def _union_vma(*xs) -> frozenset:
    return frozenset().union(*[_vma(x) for x in jax.tree_util.tree_leaves(xs)])


def _attention_fwd_impl(cfg, q, k, v, sinks, bias, batch, rng):
    out, lse, rng_state = _forward(cfg, q, k, v, sinks, bias, batch, rng)
    vma = _vma(q)  # every operand has this type (dot_product_attention cast them), see _vma above
    # Varlen rows after the last sequence come back as out = 0, lse = -inf: the FFI handler fills them through
    # sinkattn_clear_unowned_rows (SPEC.md section 1), as every binding does.
    out, lse, rng_state = _vary_to(out, vma), _vary_to(lse, vma), _vary_to(rng_state, vma)
    return out, lse, rng_state


def _make_core():
    def core(cfg, q, k, v, sinks, bias, batch, rng):
        out, lse, _ = _attention_fwd_impl(cfg, q, k, v, sinks, bias, batch, rng)
        return (out, lse) if cfg.return_lse else out

    def fwd(cfg, q, k, v, sinks, bias, batch, rng):
        out, lse, rng_state = _attention_fwd_impl(cfg, q, k, v, sinks, bias, batch, rng)
        res = (q, k, v, sinks, bias, batch, out, lse, rng_state, rng)
        return ((out, lse) if cfg.return_lse else out), res

    def bwd(cfg, res, g):
        q, k, v, sinks, bias, batch, out, lse, rng_state, rng = res
        d_out, d_lse = (g if cfg.return_lse else (g, None))
        if d_lse is not None:
            d_lse = d_lse.astype(jnp.float32)
        dq, dk, dv, d_sinks, d_bias = _backward(cfg, q, k, v, sinks, bias, batch, out, lse, rng_state,
                                                d_out.astype(q.dtype), d_lse)
        # varlen rows outside every sequence: dq = dk = dv = 0, filled by the FFI handler (SPEC.md section 1)
        # cotangents of the same shard_map type as the primal inputs (custom_vjp requires it), see _vma above
        vma = _vma(q)
        dq, dk, dv, d_sinks, d_bias = (_vary_to(x, vma) for x in (dq, dk, dv, d_sinks, d_bias))
        batch_ct = tuple(None if x is None else np.zeros(x.shape, jax.dtypes.float0) for x in batch)
        rng_ct = None if rng is None else np.zeros(rng.shape, jax.dtypes.float0)
        return dq, dk, dv, d_sinks, d_bias, batch_ct, rng_ct

    f = jax.custom_vjp(core, nondiff_argnums=(0,))
    f.defvjp(fwd, bwd)
    return f


_core = _make_core()


def _check(cond: bool, msg: str, exc=ValueError):
    if not cond:
        raise exc(f"sinkattn: {msg}")


def rng_seed_offset_words(dropout_rng) -> jax.Array:
    """uint32[4] = {lo32(seed), hi32(seed), lo32(offset), hi32(offset)} drawn from a JAX PRNG key: the dropout key of
    a call, the byte image of the library's ``rng_seed_offset`` I64[2] {seed, offset} (SPEC.md section 2;
    sinkattn._args.seed_offset_words packs the same words from integers)."""
    return jax.random.bits(dropout_rng, (4,), jnp.uint32)


def _as_int32(x, name):
    x = jnp.asarray(x)
    _check(jnp.issubdtype(x.dtype, jnp.integer), f"{name} must be an integer array, got {x.dtype}", TypeError)
    return x.astype(jnp.int32)


def _resolve_options(softmax_type, sinks, mask_alignment, is_causal, local_window_size):
    """(softmax_type, window_left, window_right) of a call, checked (loads the library, registers the FFI targets).
    Shared by dot_product_attention and decode_attention."""
    _ffi.library()
    softmax_type = _args.resolve_options(softmax_type, sinks, mask_alignment)
    return (softmax_type,) + _args.resolve_window(is_causal, local_window_size)


def _float_inputs(**named):
    """The arrays, each float32, float16 or bfloat16 (TypeError naming the argument otherwise)."""
    out = []
    for name, x in named.items():
        x = jnp.asarray(x)
        _check(x.dtype in (jnp.float32, jnp.float16, jnp.bfloat16),
               f"{name} must be float32, float16 or bfloat16, got {x.dtype}", TypeError)
        out.append(x)
    return out


def _sinks_operand(sinks, softmax_type):
    """sinks as the library's float32 [N] operand, or None unless learnable (SPEC.md section 2: sinks are ignored
    then, their gradient is 0); the cast is differentiated by JAX (d_sinks back in sinks' dtype)."""
    if softmax_type != "learnable" or sinks is None:
        return None
    sinks = jnp.asarray(sinks)
    _check(jnp.issubdtype(sinks.dtype, jnp.floating), f"sinks must be a float array, got {sinks.dtype}", TypeError)
    return sinks.astype(jnp.float32)


def _cu_seqlens_from_segments(seg):
    """cu_seqlens [B*T + 1] of the runs of equal ids in [B, T] (row-major), padded with zero-length sequences."""
    b, t = seg.shape
    start = jnp.concatenate([jnp.ones((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1).reshape(-1)
    (starts,) = jnp.nonzero(start, size=b * t, fill_value=b * t)
    return jnp.concatenate([starts.astype(jnp.int32), jnp.array([b * t], jnp.int32)])


# Library (sinkattn_params_t) names -> this function's arguments, for its error messages (sinkattn/_errors.py).
_NAMES = dict(q="query", k="key", v="value", softmax_scale="scale", dropout_p="dropout_rate",
              seqlens_q="query_seq_lengths", seqlens_kv="key_value_seq_lengths", seqused_kv="key_value_seq_lengths",
              window_left="local_window_size", window_right="local_window_size")


@with_argument_names(**_NAMES)
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
):
    """Fused scaled dot-product attention with softmax sinks (SPEC.md sections 1-3).

    Per query head h and query row i, over the visible keys j of the same sequence::

        S_ij = scale * q_i . k_j + bias_ij
        sigma = sinks[h] (learnable) | 0 (off_by_one) | -inf (vanilla)     -- never multiplied by scale
        lse_i = log(exp(sigma) + sum_j exp(S_ij));  out_i = sum_j exp(S_ij - lse_i) v_j

    Layout and shapes (jax.nn.dot_product_attention's BTNH names; B batch, T query length, S key length,
    N query heads, K key/value heads with N % K == 0 (MHA, GQA, MQA), H head dim, Hv value head dim):
      query ``[B, T, N, H]``, key ``[B, S, K, H]``, value ``[B, S, K, Hv]``; float32, float16 or bfloat16 (one
      dtype; float16/bfloat16 need a backend that supports them, the CPU one does). ``[T, N, H]`` without a batch
      dimension is accepted too. Varlen (``cu_seqlens_q`` given): query ``[total_q, N, H]``, key/value
      ``[total_kv, K, H|Hv]`` packed.
      Returns ``out`` ``[B, T, N, Hv]`` (``[total_q, N, Hv]`` varlen) of query's dtype, and with ``return_lse=True``
      ``(out, lse)``, lse float32 ``[B, N, T]`` (``[N, total_q]`` varlen), natural log, including the sink.
      ``lse`` is differentiable (its cotangent is the library's ``d_lse``), which ring attention uses.

    Args:
      bias: optional post-scale additive bias, broadcastable to ``[B, N, T, S]`` (up to 4 dims, right-aligned),
        float32 or query's dtype (others are cast to float32); ``jax.grad`` gives its gradient in its own shape.
        Not with varlen or segment_ids. Accuracy (SPEC.md sections 3, 5) holds for logits and sinks with
        ``|S_ij|, |sigma| <= 1e4``: exclude keys with ``mask`` (or ``-inf`` in the bias, a window, lengths), never
        with a huge finite value such as ``jnp.finfo(jnp.float32).min``, whose LSE a float32 lse cannot carry.
      mask: optional boolean mask broadcastable to ``[B, N, T, S]`` (as jax.nn.dot_product_attention): True =
        attend. Turned into a ``-inf`` bias (never a large finite value), added to ``bias``; a row it masks
        entirely sees no key (out = 0, lse = sigma). Not with varlen or segment_ids.
      sinks: ``[N]`` sink logits per query head (float32; other float dtypes are upcast, d_sinks cast back).
      softmax_type: ``"vanilla"``, ``"off_by_one"`` or ``"learnable"``; default ``"learnable"`` when sinks are
        given, else ``"vanilla"``. ``"learnable"`` without sinks is an error.
      scale: ``softmax_scale``, default ``1/sqrt(H)``.
      is_causal: causal mask (``window_right = 0``); it caps a right bound of ``local_window_size`` at 0 (as
        FlashAttention does: ``is_causal=True, local_window_size=(127, 5)`` is ``(127, 0)``).
      local_window_size: ``(left, right)`` or an int (symmetric): key j is visible to query i iff
        ``i + off - left <= j <= i + off + right`` (a negative bound is unbounded). GPT-OSS sliding window:
        ``(127, 0)``.
      mask_alignment: ``"bottom_right"`` (default; ``off = len_kv - len_q`` per sequence, FlashAttention's
        convention) or ``"top_left"`` (``off = 0``; what jax.nn's ``is_causal`` does when T != S).
      query_seq_lengths, key_value_seq_lengths: int32 ``[B]`` actual lengths of a padded dense batch (library
        ``seqlens_q`` / ``seqlens_kv``): rows ``i >= len_q`` are padding (out = 0, no gradient; their lse is
        unspecified), keys ``j >= len_kv`` are masked. With varlen, ``key_value_seq_lengths`` is ``seqused_kv``.
      segment_ids: int ``[B, T]`` (self-attention, T == S) or a pair ``(q_segment_ids [B, T], kv_segment_ids
        [B, S])``: packed sequences; each run of equal consecutive ids is one sequence, and the r-th query run of
        the batch attends to the r-th key run (masks apply within the run, positions counted from its start).
        Implemented as varlen over the flattened batch with up to ``B*T`` sequences; dropout's ``n`` is the run
        index and ``max_s_q, max_s_kv = T, S``.
      cu_seqlens_q, cu_seqlens_kv: int32 ``[num_seqs + 1]`` varlen offsets (non-decreasing, from 0), with optional
        ``max_seqlen_q`` / ``max_seqlen_kv`` (static ints, upper bounds; default: total_q / total_kv).
      dropout_rate: probability p of dropping each ``P_ij`` (never the sink); needs ``dropout_rng`` (a JAX PRNG
        key, traced under jit). Seed and offset are ``rng_seed_offset_words(dropout_rng)``; the keep decision is
        the library's Philox function of SPEC.md section 2.
      deterministic: bitwise reproducible backward (SPEC.md section 3). Not "no dropout".
      return_lse: also return lse.

    Raises:
      sinkattn.jax.SinkattnError (a ValueError) with the library's message for invalid calls (checked at trace
      time through the library's shape-only workspace query: shapes, dtypes, h_q % h_kv, windows, p range,
      missing sinks, unsupported head dims), naming the arguments as this function spells them (``query``,
      ``key_value_seq_lengths``, ...); data-dependent errors (e.g. non-monotonic cu_seqlens) are raised by XLA at run
      time carrying the library's message (its names). TypeError for dtypes the library cannot describe.
    """
    softmax_type, window_left, window_right = _resolve_options(softmax_type, sinks, mask_alignment, is_causal,
                                                               local_window_size)
    dropout_rate = float(dropout_rate)
    q, k, v = _float_inputs(query=query, key=key, value=value)

    varlen = cu_seqlens_q is not None or cu_seqlens_kv is not None
    unbatched = False
    seqused_kv = seqlens_q = seqlens_kv = cu_q = cu_kv = None
    seg_shape = None
    if varlen:
        _check(cu_seqlens_q is not None and cu_seqlens_kv is not None,
               "cu_seqlens_q and cu_seqlens_kv must be given together")
        _check(segment_ids is None, "segment_ids and cu_seqlens are exclusive")
        _check(query_seq_lengths is None, "query_seq_lengths is not defined with cu_seqlens (use cu_seqlens_q)")
        _check(bias is None, "bias is not defined for varlen (cu_seqlens) inputs (SPEC.md section 1)")
        cu_q, cu_kv = _as_int32(cu_seqlens_q, "cu_seqlens_q"), _as_int32(cu_seqlens_kv, "cu_seqlens_kv")
        if key_value_seq_lengths is not None:
            seqused_kv = _as_int32(key_value_seq_lengths, "key_value_seq_lengths")
        mq = int(max_seqlen_q) if max_seqlen_q is not None else int(q.shape[0])
        mk = int(max_seqlen_kv) if max_seqlen_kv is not None else int(k.shape[0])
    elif segment_ids is not None:
        _check(q.ndim == 4, "segment_ids needs [B, T, N, H] inputs")
        _check(query_seq_lengths is None and key_value_seq_lengths is None,
               "segment_ids and query/key_value_seq_lengths are exclusive (give padding its own segment)")
        _check(bias is None, "bias is not supported with segment_ids (they run as varlen, SPEC.md section 1)")
        seg_q, seg_k = (segment_ids if isinstance(segment_ids, (tuple, list)) else (segment_ids, segment_ids))
        seg_q, seg_k = _as_int32(seg_q, "segment_ids"), _as_int32(seg_k, "segment_ids")
        b, t, s = q.shape[0], q.shape[1], k.shape[1]
        _check(seg_q.shape == (b, t) and seg_k.shape == (b, s),
               f"segment_ids must be [B, T] = {(b, t)} (and [B, S] = {(b, s)} for keys), got "
               f"{seg_q.shape} and {seg_k.shape}")
        _check(b * t == b * s or isinstance(segment_ids, (tuple, list)),
               "one segment_ids array needs T == S; pass (q_segment_ids, kv_segment_ids)")
        cu_q, cu_kv = _cu_seqlens_from_segments(seg_q), _cu_seqlens_from_segments(seg_k)
        if cu_kv.shape[0] != cu_q.shape[0]:  # the same number of (possibly empty) sequences on both sides
            n = max(cu_q.shape[0], cu_kv.shape[0])
            cu_q = jnp.concatenate([cu_q, jnp.full((n - cu_q.shape[0],), b * t, jnp.int32)])
            cu_kv = jnp.concatenate([cu_kv, jnp.full((n - cu_kv.shape[0],), b * s, jnp.int32)])
        seg_shape = (b, t, s)
        q = q.reshape((b * t,) + q.shape[2:])
        k = k.reshape((b * s,) + k.shape[2:])
        v = v.reshape((b * s,) + v.shape[2:])
        varlen = True
        mq, mk = t, s
    else:
        if q.ndim == 3 and k.ndim == 3 and v.ndim == 3:
            unbatched = True
            q, k, v = q[None], k[None], v[None]
        _check(q.ndim == 4 and k.ndim == 4 and v.ndim == 4,
               f"query, key, value must be [B, T, N, H] (or [T, N, H]), got ranks {q.ndim}, {k.ndim}, {v.ndim}")
        if query_seq_lengths is not None:
            seqlens_q = _as_int32(query_seq_lengths, "query_seq_lengths")
        if key_value_seq_lengths is not None:
            seqlens_kv = _as_int32(key_value_seq_lengths, "key_value_seq_lengths")
        mq, mk = int(q.shape[1]), int(k.shape[1])

    # sinks: float32 [N] in the library; the cast is differentiated by JAX (d_sinks back in sinks' dtype).
    sinks = _sinks_operand(sinks, softmax_type)
    if mask is not None:
        _check(not varlen, "mask is not supported with varlen inputs or segment_ids (SPEC.md section 1: no bias "
               "there); use cu_seqlens / segment_ids / lengths to exclude keys")
        mask = jnp.asarray(mask)
        _check(mask.dtype == jnp.bool_, f"mask must be boolean (True = attend), got {mask.dtype}", TypeError)
        _check(mask.ndim <= 4, f"mask must have at most 4 dims (broadcastable to [B, N, T, S]), got {mask.shape}")
        # -inf, never a large finite value (SPEC.md section 3, "Logit range")
        mask_bias = jnp.where(mask, jnp.float32(0.0), jnp.float32(-jnp.inf))
        if bias is None:
            bias = mask_bias
        else:
            bias = jnp.asarray(bias)
            bias = bias.astype(jnp.float32) + mask_bias
    if bias is not None and not varlen:
        bias = jnp.asarray(bias)
        if bias.dtype not in (jnp.float32, q.dtype):
            bias = bias.astype(jnp.float32)
        _check(bias.ndim <= 4, f"bias must have at most 4 dims (broadcastable to [B, N, T, S]), got {bias.shape}")
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
        b, t, n, s = q.shape[0], q.shape[1], q.shape[2], k.shape[1]
        if bias.shape[2] != t or bias.shape[3] != s:  # the library broadcasts only B and N
            try:
                bias = jnp.broadcast_to(bias, bias.shape[:2] + (t, s))
            except ValueError:
                _check(False, f"bias of shape {bias.shape} is not broadcastable to [B, N, T, S] = {(b, n, t, s)}")

    rng = None
    if dropout_rate > 0.0:
        _check(dropout_rng is not None, "dropout_rate > 0 needs dropout_rng (a JAX PRNG key)")
        rng = rng_seed_offset_words(dropout_rng)
    elif dropout_rate < 0.0:
        rng = None  # the library rejects p out of [0, 1) with its message at the size query

    cfg = _Config(
        softmax_type=_args.SOFTMAX_TYPES[softmax_type],
        softmax_scale=None if scale is None else float(scale),
        window_left=window_left,
        window_right=window_right,
        mask_alignment=_args.ALIGNMENTS[mask_alignment],
        dropout_p=dropout_rate,
        deterministic=bool(deterministic),
        varlen=varlen,
        max_seqlen_q=mq,
        max_seqlen_kv=mk,
        return_lse=bool(return_lse),
        poison=_POISON[0],
    )
    batch = (cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv)
    vma = _union_vma(q, k, v, sinks, bias, batch, rng)  # inside shard_map: one varying type for every operand
    if vma:
        q, k, v, sinks, bias, rng = (_vary_to(x, vma) for x in (q, k, v, sinks, bias, rng))
        batch = tuple(_vary_to(x, vma) for x in batch)
    res = _core(cfg, q, k, v, sinks, bias, batch, rng)
    out, lse = res if return_lse else (res, None)

    if seg_shape is not None:  # back from the flattened varlen layout
        b, t, s = seg_shape
        out = out.reshape(b, t, out.shape[1], out.shape[2])
        if lse is not None:
            lse = lse.reshape(lse.shape[0], b, t).transpose(1, 0, 2)
    elif unbatched:
        out = out[0]
        if lse is not None:
            lse = lse[0]
    return (out, lse) if return_lse else out


def attention_backward(query, key, value, out, lse, d_out, d_lse=None, *, sinks=None, softmax_type=None,
                       scale: Optional[float] = None, is_causal: bool = False, local_window_size=None,
                       mask_alignment: str = "bottom_right", deterministic: bool = False):
    """The fused backward alone (SPEC.md section 3) for dense ``[B, T, N, H]`` inputs, given ``out`` and ``lse``.

    The library computes ``P_ij = exp(S_ij - lse_i)`` and ``D_i = dot(d_out_i, out_i)`` from the ``out`` / ``lse``
    passed here, so they need not come from a forward of these same keys: ring attention passes the merged (global)
    out and LSE of all key blocks together with one block's keys, and gets that block's exact share of dq and its
    dk, dv without recomputing the block's forward. Not differentiable itself (it is a VJP); no bias, dropout,
    padding lengths or varlen (use ``jax.grad`` of ``dot_product_attention`` for those).

    Shapes: query ``[B, T, N, H]``, key ``[B, S, K, H]``, value ``[B, S, K, Hv]`` (one float dtype), out and
    d_out ``[B, T, N, Hv]`` (cast to query's dtype), lse and d_lse ``[B, N, T]`` float32 (d_lse optional).
    Returns ``(dq, dk, dv, d_sinks)`` in the inputs' dtypes; ``d_sinks`` float32 ``[N]`` for ``learnable``,
    else None. Options as in :func:`dot_product_attention`. Raises SinkattnError with the library's message.
    Inside ``shard_map`` the results are typed like the operands (varying over the union of their axes)."""
    softmax_type, window_left, window_right = _resolve_options(softmax_type, sinks, mask_alignment, is_causal,
                                                               local_window_size)
    q, k, v = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    _check(q.ndim == 4 and k.ndim == 4 and v.ndim == 4, "attention_backward needs dense [B, T, N, H] inputs")
    out, d_out = jnp.asarray(out).astype(q.dtype), jnp.asarray(d_out).astype(q.dtype)
    lse = jnp.asarray(lse).astype(jnp.float32)
    d_lse = None if d_lse is None else jnp.asarray(d_lse).astype(jnp.float32)
    if softmax_type != "learnable":
        sinks = None
    elif sinks is not None:
        sinks = jnp.asarray(sinks).astype(jnp.float32)
    cfg = _Config(softmax_type=_args.SOFTMAX_TYPES[softmax_type], softmax_scale=None if scale is None else float(scale),
                  window_left=window_left, window_right=window_right, mask_alignment=_args.ALIGNMENTS[mask_alignment],
                  dropout_p=0.0, deterministic=bool(deterministic), varlen=False, max_seqlen_q=int(q.shape[1]),
                  max_seqlen_kv=int(k.shape[1]), return_lse=True, poison=_POISON[0])
    vma = _union_vma(q, k, v, out, lse, d_out, d_lse, sinks)
    q, k, v, out, lse, d_out, d_lse, sinks = (_vary_to(x, vma) for x in (q, k, v, out, lse, d_out, d_lse, sinks))
    batch = (None,) * 5
    dq, dk, dv, d_sinks, _ = _backward(cfg, q, k, v, sinks, None, batch, out, lse, None, d_out, d_lse)
    return tuple(_vary_to(x, vma) for x in (dq, dk, dv)) + (_vary_to(d_sinks, vma),)
