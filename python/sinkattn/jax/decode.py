"""``sinkattn.jax.decode_attention``: attention of new query tokens over a KV cache (decode, speculative decoding,
chunked prefill), contiguous or paged (SPEC.md section 1, "Paged KV"), with softmax sinks, as one XLA FFI custom
call (CPU and CUDA; on CUDA the library's decode kernels: the query heads of a KV group packed into one tile,
split-KV with a combine in which the sink is counted once, no allocation and no host synchronisation, so the call
can be captured in a CUDA graph under ``jit``). Forward only (a page table has no backward, SPEC.md section 1).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import _args
from .._errors import with_argument_names
from . import _ffi
from .attention import (_POISON, _Config, _as_int32, _call_on_platforms, _check, _ffi_call,
                        _float_inputs, _operands, _resolve_options, _sd, _sinks_operand, _workspace)

__all__ = ["decode_attention"]


@with_argument_names(k="k_cache", v="v_cache", seqused_kv="cache_seqlens", seqlens_kv="cache_seqlens",
                     softmax_scale="scale", window_left="local_window_size", window_right="local_window_size")
def decode_attention(
    q,
    k_cache,
    v_cache,
    *,
    cache_seqlens,
    page_table=None,
    sinks=None,
    softmax_type: Optional[str] = None,
    scale: Optional[float] = None,
    is_causal: bool = False,
    local_window_size=None,
    mask_alignment: str = "bottom_right",
    cu_seqlens_q=None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    num_splits: int = 0,
    return_lse: bool = False,
):
    """Attention of ``q`` over a KV cache with softmax sinks (SPEC.md sections 1-2), FlashAttention's
    ``flash_attn_with_kvcache`` semantics (without appending to the cache).

    Per query head h and query row i of sequence n, over the cache's keys ``j < cache_seqlens[n]``::

        S_ij = scale * q_i . k_j;   sigma = sinks[h] | 0 | -inf;   lse_i = log(exp(sigma) + sum_j exp(S_ij))
        out_i = sum_j exp(S_ij - lse_i) v_j

    Shapes (B sequences, T new tokens per sequence, N query heads, K KV heads with N % K == 0, H / Hv head dims):
      q ``[B, T, N, H]`` (decode: T = 1), or varlen ``[total_q, N, H]`` with ``cu_seqlens_q``.
      Contiguous cache (``page_table=None``): k_cache ``[B, S, K, H]``, v_cache ``[B, S, K, Hv]``.
      Paged cache: k_cache ``[num_pages, page_size, K, H]``, v_cache ``[num_pages, page_size, K, Hv]`` page pools and
      ``page_table`` int32 ``[B, max_pages]``: key j of sequence n is row ``j % page_size`` of page
      ``page_table[n, j // page_size]``; entries past ``ceil(cache_seqlens[n] / page_size)`` are never read, pages
      may be shared between sequences.
      Returns ``out`` ``[B, T, N, Hv]`` (``[total_q, N, Hv]``) in q's dtype, with ``return_lse=True`` also ``lse``
      float32 ``[B, N, T]`` (``[N, total_q]``), natural log, sink included.

    Args:
      cache_seqlens: int32 ``[B]``, the keys of each sequence (the library's ``seqused_kv`` with a page table,
        ``seqlens_kv`` for a contiguous cache), new tokens included: FlashAttention's bottom-right alignment puts
        query row i at key position ``cache_seqlens[n] - T_n + i``.
      sinks, softmax_type, scale, is_causal, local_window_size, mask_alignment: as in ``dot_product_attention``
        (GPT-OSS sliding layers: ``local_window_size=(127, 0)``; ``is_causal`` caps the right bound at 0).
      cu_seqlens_q, max_seqlen_q: varlen queries (int32 ``[B + 1]``; static upper bound, default total_q). With a
        contiguous cache the cache is passed as a page pool of B pages (one per sequence).
      max_seqlen_kv: varlen only, static upper bound of ``cache_seqlens`` (default: the cache's capacity).
      num_splits: key splits per row (split-KV): 0 the library's heuristic, 1 none, N at most N (static).
      return_lse: also return lse.

    Raises:
      sinkattn.jax.SinkattnError with the library's message for invalid calls (checked at trace time through the
      library's shape-only workspace query); page-table and length contents are checked when the call runs
      (outside CUDA-graph capture).
    """
    softmax_type, window_left, window_right = _resolve_options(softmax_type, sinks, mask_alignment, is_causal,
                                                               local_window_size)
    q, k, v = _float_inputs(q=q, k_cache=k_cache, v_cache=v_cache)
    _check(k.ndim == 4 and v.ndim == 4, f"k_cache, v_cache must have rank 4, got {k.ndim}, {v.ndim}")
    seqlens = _as_int32(cache_seqlens, "cache_seqlens")
    varlen = cu_seqlens_q is not None
    cu_q = None
    if page_table is not None:
        page_table = _as_int32(page_table, "page_table")
    if varlen:
        cu_q = _as_int32(cu_seqlens_q, "cu_seqlens_q")
        _check(q.ndim == 3, f"varlen q (cu_seqlens_q given) must be [total_q, N, H], got rank {q.ndim}")
        if page_table is None:  # a contiguous cache [B, S, K, H] is the pool of B pages of S rows
            page_table = jnp.arange(k.shape[0], dtype=jnp.int32)[:, None]
        mq = int(max_seqlen_q) if max_seqlen_q is not None else int(q.shape[0])
        mk = int(max_seqlen_kv) if max_seqlen_kv is not None else int(page_table.shape[1] * k.shape[1])
    else:
        _check(q.ndim == 4, f"q must be [B, T, N, H] (or varlen with cu_seqlens_q), got rank {q.ndim}")
        mq, mk = int(q.shape[1]), int(k.shape[1])
    sinks = _sinks_operand(sinks, softmax_type)

    cfg = _Config(
        softmax_type=_args.SOFTMAX_TYPES[softmax_type],
        softmax_scale=None if scale is None else float(scale),
        window_left=window_left,
        window_right=window_right,
        mask_alignment=_args.ALIGNMENTS[mask_alignment],
        dropout_p=0.0,
        deterministic=False,
        varlen=varlen,
        max_seqlen_q=mq,
        max_seqlen_kv=mk,
        return_lse=bool(return_lse),
        poison=_POISON[0],
    )
    # Optional operands in the handler's protocol order (python/ffi/ffi_handlers.cpp): sinks, cu_seqlens_q,
    # seqused_kv | seqlens_kv, page_table.
    # The cache lengths: seqused_kv of a page pool, else seqlens_kv of the contiguous cache.
    lengths = (_ffi.OP_SEQUSED_KV, "seqused_kv") if page_table is not None else (_ffi.OP_SEQLENS_KV, "seqlens_kv")
    bits, ops, fields = _operands((_ffi.OP_SINKS, (("sinks", sinks),)),
                                  (_ffi.OP_CU_SEQLENS_Q_ONLY, (("cu_seqlens_q", cu_q),)),
                                  (lengths[0], ((lengths[1], seqlens),)),
                                  (_ffi.OP_PAGE_TABLE, (("page_table", page_table),)))

    if varlen:
        out_shape, lse_shape = (q.shape[0], q.shape[1], v.shape[3]), (q.shape[1], q.shape[0])
    else:
        out_shape, lse_shape = (q.shape[0], q.shape[1], q.shape[2], v.shape[3]), (q.shape[0], q.shape[2], q.shape[1])
    tensors = {name: _sd(x) for name, x in fields.items()}
    tensors.update(q=_sd(q), k=_sd(k), v=_sd(v), out=(out_shape, q.dtype), softmax_lse=(lse_shape, np.float32))
    splits = int(num_splits)

    def run(platform, *operands):
        ws = _workspace(False, platform, tensors, dict(cfg.options(), num_splits=splits))
        results = [jax.ShapeDtypeStruct(out_shape, q.dtype), jax.ShapeDtypeStruct(lse_shape, jnp.float32),
                   jax.ShapeDtypeStruct((max(ws, 1),), jnp.uint8)]
        poison = [(out_shape, q.dtype), (lse_shape, jnp.float32)] if cfg.poison else None
        attrs = dict(cfg.attrs(bits), num_splits=np.int32(splits))
        res = _ffi_call(_ffi.DECODE_TARGET, results, operands, attrs, poison)
        return res[0], res[1]

    # varlen rows after the last sequence come back as out = 0, lse = -inf: the FFI handler fills them through
    # sinkattn_clear_unowned_rows (SPEC.md section 1)
    out, lse = _call_on_platforms(run, q, k, v, *ops)
    return (out, lse) if return_lse else out
