"""The PyTorch API of sinkattn: ``dot_product_attention`` (all of SPEC.md) and the FlashAttention-style
``flash_attn_func`` / ``flash_attn_varlen_func``, over ``torch.ops.sinkattn.fwd`` / ``bwd`` (see _ops.py).

Everything here is shape bookkeeping in Python that torch.compile traces (no host read of a device tensor, no
data-dependent branch): the work is one operator call forward and one backward.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .. import _args
from .._errors import argument_names
from . import _ops

__all__ = ["dot_product_attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _check(cond: bool, msg, exc=ValueError):
    """Raises exc("sinkattn: msg") unless cond; msg may be a callable (messages are formatted only on failure)."""
    if not cond:
        raise exc(f"sinkattn: {msg() if callable(msg) else msg}")


def _check_floats(**tensors):
    """TypeError unless each named argument is a float32, float16 or bfloat16 tensor (what the library computes in)."""
    for name, x in tensors.items():
        _check(isinstance(x, torch.Tensor) and x.dtype in _FLOATS,
               lambda: f"{name} must be a float32, float16 or bfloat16 tensor, got "
               f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}", TypeError)


def _int32(x: Optional[torch.Tensor], name: str) -> Optional[torch.Tensor]:
    if x is None:
        return None
    _check(isinstance(x, torch.Tensor) and not x.is_floating_point() and not x.is_complex(),
           lambda: f"{name} must be an integer tensor", TypeError)
    return x if x.dtype == torch.int32 else x.to(torch.int32)


def _autocast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Under torch.autocast for q's device, q, k and v in the autocast dtype (differentiably), as autocast does for
    scaled_dot_product_attention; bias and sinks keep their dtypes (the library reads them in float32). Outside
    autocast the tensors are returned as they are."""
    dev = q.device.type
    if not torch.is_autocast_enabled(dev):
        return q, k, v
    dt = torch.get_autocast_dtype(dev)
    return tuple(x if x.dtype == dt else x.to(dt) for x in (q, k, v))


def _rng_seed_offset(q: torch.Tensor, rng_seed_offset, generator) -> torch.Tensor:
    """int64 [2] {seed, offset} of SPEC.md section 2 on q's device: as given, or drawn from PyTorch's RNG (the
    default generator of q's device, or `generator`) without a host round trip, so it is CUDA-graph capturable."""
    if rng_seed_offset is not None:
        _check(isinstance(rng_seed_offset, torch.Tensor) and rng_seed_offset.dtype == torch.int64
               and tuple(rng_seed_offset.shape) == (2,), "rng_seed_offset must be an int64 tensor [2] = {seed, offset}",
               TypeError)
        return rng_seed_offset.to(q.device)
    return torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=q.device, generator=generator)


def dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    sinks: Optional[torch.Tensor] = None,
    softmax_type: Optional[str] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Optional[Sequence[Optional[int]]] = (-1, -1),
    mask_alignment: str = "bottom_right",
    seqlens_q: Optional[torch.Tensor] = None,
    seqlens_kv: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    seqused_kv: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    dropout_p: float = 0.0,
    rng_seed_offset: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    return_rng_state: bool = False,
    trust_device_batch_tensors: bool = False,
    num_splits: int = 0,
):
    """Fused scaled dot-product attention with softmax sinks, forward and backward (all of SPEC.md sections 1-3).

    Per query head h and row i, over the visible keys j of the same sequence::

        S_ij = softmax_scale * q_i . k_j + bias_ij
        sigma = sinks[h] (learnable) | 0 (off_by_one) | -inf (vanilla)      -- never multiplied by softmax_scale
        lse_i = log(exp(sigma) + sum_j exp(S_ij));   out_i = sum_j exp(S_ij - lse_i) v_j

    Shapes (FlashAttention's layouts, any strides with a contiguous last dimension, so HF's transposed views need
    no copy): dense ``q [b, s_q, h_q, d]``, ``k [b, s_kv, h_kv, d]``, ``v [b, s_kv, h_kv, d_v]``; varlen
    (``cu_seqlens_q`` given) ``q [total_q, h_q, d]``, ``k / v [total_kv, h_kv, d | d_v]``. ``h_q % h_kv == 0`` (MHA,
    GQA, MQA). Dtypes float32, float16 or bfloat16, the same for q, k, v (CPU: all three; CUDA: all three, fp32
    on a SIMT path, far slower than the tensor-core fp16 / bf16 kernels). Under ``torch.autocast`` for their device,
    q, k and v are cast to the autocast dtype first (as autocast does for ``scaled_dot_product_attention``), and
    ``out`` has that dtype. CPU tensors run on the library's CPU backend, CUDA tensors on its CUDA backend on PyTorch's
    current stream.

    Returns ``out`` (q's dtype; ``[b, s_q, h_q, d_v]`` or ``[total_q, h_q, d_v]``), or a tuple ``(out, lse)``
    (``return_lse``), ``(out, rng_state)`` (``return_rng_state``) or ``(out, lse, rng_state)``. ``lse`` is float32,
    natural log, includes the sink, ``[b, h_q, s_q]`` or ``[h_q, total_q]``, and differentiable (its gradient is the
    library's ``d_lse``). ``rng_state`` is int64 ``[2]`` = {seed, offset} of the dropout mask (an empty ``[0]`` tensor without dropout). Rows of a varlen
    buffer after ``cu_seqlens_q[-1]`` get ``out = 0`` and ``lse = -inf``; their gradients (and those of k / v rows
    after ``cu_seqlens_kv[-1]``) are 0.

    Args:
      bias: post-scale additive bias broadcastable to ``[b, h_q, s_q, s_kv]`` (at most 4 dims, right-aligned),
        float32 or q's dtype (other float dtypes are cast to float32); its gradient comes back in its own shape and
        dtype. Dense only. A boolean mask belongs here as ``-inf`` where masked (SPEC.md section 3), never as a large
        finite negative number.
      sinks: ``[h_q]`` sink logits (float32, bfloat16 or float16: upcast inside, gradient in their own dtype).
      softmax_type: ``"vanilla"``, ``"off_by_one"`` or ``"learnable"``; default ``"learnable"`` with sinks, else
        ``"vanilla"``. Sinks are ignored (zero gradient) unless learnable.
      softmax_scale: default ``1/sqrt(d)``.
      causal, window_size: FlashAttention's mask: ``window_size = (left, right)``, a pair of ints, inclusive, -1
        unbounded; key j is visible to query i iff ``i + off - left <= j <= i + off + right``; causal is
        ``right = 0``, and with ``causal=True`` the right bound is 0 whatever ``window_size`` gives (FlashAttention's
        rule: ``causal=True, window_size=(127, 5)`` is ``(127, 0)``). GPT-OSS sliding layers: ``causal=True,
        window_size=(127, 0)``.
      mask_alignment: ``"bottom_right"`` (FlashAttention's; ``off = len_kv - len_q`` per sequence) or
        ``"top_left"`` (``off = 0``).
      seqlens_q, seqlens_kv: int ``[b]`` actual lengths of a right-padded dense batch: rows ``i >= seqlens_q[n]`` are
        padding (out = 0, no gradient, lse unspecified), keys ``j >= seqlens_kv[n]`` are masked.
      cu_seqlens_q, cu_seqlens_kv: int ``[num_seqs + 1]`` varlen offsets (non-decreasing, from 0), with
        ``max_seqlen_q`` / ``max_seqlen_kv`` (Python ints, upper bounds; default the packed lengths, which is valid
        but slower than the true maxima) and optional ``seqused_kv`` int ``[num_seqs]`` (keys used per sequence).
        int64 batch tensors are converted to int32.
      dropout_p: probability of dropping each ``P_ij`` (never the sink). The keep decision is SPEC.md's Philox
        function of ``rng_seed_offset`` (int64 ``[2]``, e.g. a returned ``rng_state`` to reproduce a mask), drawn
        from PyTorch's RNG (``generator``) when not given.
      deterministic: bitwise reproducible backward (SPEC.md section 3). Not "no dropout".
      trust_device_batch_tensors: skip the library's check of the contents of CUDA batch tensors (a synchronising
        read-back of ``b + 1`` entries per call; always skipped while a CUDA graph is being captured). Set it on the
        hot path when the lengths are known to be valid.
      num_splits: forward key splits (0: the backend's choice, 1: none).

    Raises:
      ValueError / TypeError for arguments this layer cannot map onto the library (ranks, dtypes, shapes of bias,
      exclusive options), and RuntimeError ``"sinkattn: <library message>"`` for every rule of SPEC.md section 4 that
      the library enforces (shapes, ``h_q % h_kv``, windows, ``p`` range, missing sinks, unsupported head dims,
      non-monotonic ``cu_seqlens``; under torch.compile at run time).
    """
    _check_floats(q=q, k=k, v=v)
    softmax_type = _args.resolve_options(softmax_type, sinks, mask_alignment)
    window_left, window_right = _args.window_size_bounds(causal, window_size)
    q, k, v = _autocast(q, k, v)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))

    varlen = cu_seqlens_q is not None or cu_seqlens_kv is not None
    if varlen:
        _check(cu_seqlens_q is not None and cu_seqlens_kv is not None,
               "cu_seqlens_q and cu_seqlens_kv must be given together")
        _check(seqlens_q is None and seqlens_kv is None,
               "seqlens_q / seqlens_kv describe a padded dense batch; varlen uses cu_seqlens (and seqused_kv)")
        _check(bias is None, "bias is not defined for varlen (cu_seqlens) inputs (SPEC.md section 1)")
        _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
               lambda: f"varlen q, k, v must be [total, h, d], got ranks {q.dim()}, {k.dim()}, {v.dim()}")
        max_seqlen_q = int(q.shape[0]) if max_seqlen_q is None else max_seqlen_q
        max_seqlen_kv = int(k.shape[0]) if max_seqlen_kv is None else max_seqlen_kv
    else:
        _check(seqused_kv is None, "seqused_kv is a varlen option (dense batches use seqlens_kv)")
        _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
               lambda: f"q, k, v must be [b, s, h, d] (or [total, h, d] with cu_seqlens), got ranks {q.dim()}, {k.dim()}, "
               f"{v.dim()}")
        max_seqlen_q, max_seqlen_kv = int(q.shape[1]), int(k.shape[1])

    if softmax_type != "learnable":
        sinks = None  # SPEC.md section 2: ignored unless learnable
    if sinks is not None:
        _check(isinstance(sinks, torch.Tensor) and sinks.is_floating_point(), "sinks must be a float tensor [h_q]",
               TypeError)
        if sinks.dtype != torch.float32:
            sinks = sinks.to(torch.float32)  # differentiable: d_sinks comes back in the sinks' own dtype
    if bias is not None:
        _check(isinstance(bias, torch.Tensor) and bias.is_floating_point(), "bias must be a float tensor", TypeError)
        _check(bias.dim() <= 4, lambda: f"bias must have at most 4 dims (broadcastable to [b, h_q, s_q, s_kv]), got "
               f"{tuple(bias.shape)}")
        if bias.dtype not in (torch.float32, q.dtype):
            bias = bias.to(torch.float32)
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        s_q, s_kv = q.shape[1], k.shape[1]
        if tuple(bias.shape[2:]) != (s_q, s_kv):  # the library broadcasts b and h only (stride 0)
            try:
                bias = bias.expand(bias.shape[0], bias.shape[1], s_q, s_kv)
            except RuntimeError:
                _check(False, lambda: f"bias of shape {tuple(bias.shape)} is not broadcastable to [b, h_q, s_q, s_kv] = "
                       f"{(q.shape[0], q.shape[2], s_q, s_kv)}")
        if bias.stride(-1) != 1:
            bias = bias.contiguous()
    dropout_p = float(dropout_p)
    rng_in = _rng_seed_offset(q, rng_seed_offset, generator) if dropout_p > 0.0 else None

    out, lse, rng_state = _ops.attention(
        q, k, v, sinks, bias, _int32(cu_seqlens_q, "cu_seqlens_q"), _int32(cu_seqlens_kv, "cu_seqlens_kv"),
        _int32(seqused_kv, "seqused_kv"), _int32(seqlens_q, "seqlens_q"), _int32(seqlens_kv, "seqlens_kv"), None,
        int(max_seqlen_q), int(max_seqlen_kv), _ops.SOFTMAX_TYPES[softmax_type],
        None if softmax_scale is None else float(softmax_scale), window_left, window_right,
        _ops.ALIGNMENTS[mask_alignment], dropout_p, rng_in, bool(deterministic), bool(trust_device_batch_tensors),
        int(num_splits))
    res = (out,) + ((lse,) if return_lse else ()) + ((rng_state,) if return_rng_state else ())
    return res[0] if len(res) == 1 else res


def _sink_argument(learnable_sink, s_aux):
    _check(learnable_sink is None or s_aux is None, "give learnable_sink or its alias s_aux, not both")
    return learnable_sink if learnable_sink is not None else s_aux


def _sink_name(s_aux) -> str:
    """The name the caller gave the sinks (FlashAttention's learnable_sink, or its alias s_aux), for messages."""
    return "s_aux" if s_aux is not None else "learnable_sink"


def _unsupported_fa_options(softcap, alibi_slopes):
    _check(not softcap, "softcap is not supported (SPEC.md has no logit soft-capping)")
    _check(alibi_slopes is None, "alibi_slopes are not supported; pass an ALiBi bias to "
           "sinkattn.torch.dot_product_attention(bias=...) instead")


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[Optional[int]] = (-1, -1),
    learnable_sink: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    return_attn_probs: bool = False,
    s_aux: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
):
    """FlashAttention's ``flash_attn_func`` with a learnable sink: dense ``q [b, s_q, h_q, d]``,
    ``k [b, s_kv, h_kv, d]``, ``v [b, s_kv, h_kv, d_v]`` (any strides, last dimension contiguous), float32, float16
    or bfloat16; ``h_q % h_kv == 0``.

    - ``window_size = (left, right)``: a pair of ints, inclusive, -1 unbounded; ``causal`` is ``right = 0``, aligned
      to the bottom right when ``s_q != s_kv`` (FlashAttention 2.1+), and sets the right bound to 0 whatever
      ``window_size`` gives, as FlashAttention does; ``softmax_scale`` defaults to ``1/sqrt(d)``.
    - ``learnable_sink`` (alias ``s_aux``, the kernels-hub / vLLM name): ``[h_q]`` float32, bfloat16 or float16 sink
      logits (upcast inside; their gradient in their own dtype). Without it the softmax is vanilla.
    - ``dropout_p``: dropout of the attention probabilities (never the sink), Philox keyed by PyTorch's RNG
      (``generator``); ``deterministic``: bitwise reproducible backward.
    - Returns ``out [b, s_q, h_q, d_v]`` (q's dtype), or ``(out, softmax_lse)`` with ``return_lse`` or
      ``return_attn_probs`` (the probabilities are never materialised: as in FlashAttention 3, the LSE stands in
      for them). ``softmax_lse`` float32 ``[b, h_q, s_q]``, natural log, includes the sink, differentiable.
    - ``softcap`` and ``alibi_slopes`` are not supported (ValueError, never silently ignored).
    Errors: see ``dot_product_attention``; messages name the arguments as this function spells them.
    """
    _unsupported_fa_options(softcap, alibi_slopes)
    with argument_names(sinks=_sink_name(s_aux)):
        return dot_product_attention(
            q, k, v, sinks=_sink_argument(learnable_sink, s_aux), softmax_scale=softmax_scale, causal=causal,
            window_size=window_size, dropout_p=dropout_p, generator=generator, deterministic=deterministic,
            return_lse=bool(return_lse or return_attn_probs))


def _page_table_argument(page_table, block_table):
    """The page table given as FlashAttention 3's ``page_table`` or FlashAttention 2's / vLLM's ``block_table``."""
    _check(page_table is None or block_table is None, "give page_table or its alias block_table, not both")
    return page_table if page_table is not None else block_table


def _flash_attn_3_options(scheduler_metadata, fa_version, q_descale, k_descale, v_descale):
    """The FlashAttention 3 (vLLM) arguments of flash_attn_varlen_func that select or schedule FlashAttention's own
    kernels: accepted where they leave the result as it is here, refused otherwise (never ignored)."""
    _check(scheduler_metadata is None, "scheduler_metadata is not supported: it is FlashAttention 3's precomputed "
           "tile schedule (get_scheduler_metadata), which only its kernels can read; this library schedules each call "
           "itself (num_splits bounds its key splits): pass scheduler_metadata=None")
    _check(fa_version is None or (isinstance(fa_version, int) and not isinstance(fa_version, bool)
                                  and fa_version in (2, 3, 4)),
           lambda: f"fa_version must be None, 2, 3 or 4 (the FlashAttention version whose kernels the caller would "
           f"pick; this library computes the same attention for each), got {fa_version!r}")
    for name, x in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        # FlashAttention 3 reads the descales of float8 inputs only; float8 q / k / v are refused here (dtype check),
        # so a descale never scales anything, exactly as FlashAttention 3 does not read it for 16-bit inputs.
        _check(x is None or (isinstance(x, torch.Tensor) and x.is_floating_point()),
               lambda: f"{name} must be None or a float tensor (a dequantisation scale of float8 inputs), got "
               f"{type(x).__name__}", TypeError)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _write_out(out: torch.Tensor, res: torch.Tensor, cu_seqlens_q: torch.Tensor) -> torch.Tensor:
    """FlashAttention's ``out=``: the result ``res [total_q, h_q, d_v]`` written into the caller's tensor, which is
    returned. As in FlashAttention, rows after ``cu_seqlens_q[-1]`` (no sequence's) are left as they were; the check
    of that bound is a device-side select (no host read)."""
    _check(isinstance(out, torch.Tensor), lambda: f"out must be a tensor, got {type(out).__name__}", TypeError)
    _check(out.dtype == res.dtype,
           lambda: f"out: dtype must be q's ({_dtype_name(res.dtype)}), got {_dtype_name(out.dtype)}", TypeError)
    _check(tuple(out.shape) == tuple(res.shape),
           lambda: f"out: shape must be [total_q, h_q, d_v] = {list(res.shape)}, got {list(out.shape)}")
    _check(out.device == res.device, lambda: f"out: must be on q's device ({res.device}), got {out.device}")
    rows = torch.arange(res.shape[0], device=res.device) < cu_seqlens_q[-1].to(res.device)
    out.copy_(torch.where(rows[:, None, None], res, out))
    return out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_k: Optional[int] = None,
    dropout_p: float = 0.0,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Optional[Sequence[Optional[int]]] = (-1, -1),
    learnable_sink: Optional[torch.Tensor] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    seqused_k: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    return_attn_probs: bool = False,
    return_softmax_lse: bool = False,
    s_aux: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
    trust_device_batch_tensors: bool = False,
    num_splits: int = 0,
    scheduler_metadata: Optional[torch.Tensor] = None,
    fa_version: Optional[int] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
):
    """FlashAttention's ``flash_attn_varlen_func`` with a learnable sink, over packed keys or a paged KV cache.

    Packed keys: ``q [total_q, h_q, d]``, ``k [total_k, h_kv, d]``, ``v [total_k, h_kv, d_v]``; ``cu_seqlens_q`` /
    ``cu_seqlens_k`` int32 (int64 is converted) ``[num_seqs + 1]``; optional ``seqused_k`` int ``[num_seqs]`` (keys
    used per sequence). Differentiable, with dropout (``dropout_p``, ``generator``) and ``deterministic`` as
    ``flash_attn_func``.

    Paged KV cache (vLLM's FlashAttention backend makes a serving engine's mixed prefill + decode batch this one call):
    ``block_table`` (FlashAttention 2's and vLLM's name; ``page_table``, FlashAttention 3's, is accepted too, not both)
    int32 ``[num_seqs, max_blocks]`` with ``k`` / ``v`` page pools ``[num_blocks, block_size, h_kv, d | d_v]`` (vLLM's
    ``key_cache`` / ``value_cache``) and ``seqused_k`` int32 ``[num_seqs]`` (required): sequence ``n`` has
    ``seqused_k[n]`` keys, its cached prefix and its new tokens, key ``j`` being row ``j % block_size`` of block
    ``block_table[n, j // block_size]``; entries past its last block are never read, blocks may be shared. Its
    ``cu_seqlens_q[n+1] - cu_seqlens_q[n]`` query rows are its last positions (decode: 1 row; chunked prefill: a
    chunk after a cached prefix; prefill: all of it), so masks are aligned to the bottom right per sequence.
    ``cu_seqlens_k`` must then be None (as in vLLM's FlashAttention, which takes one or the other: with a block table
    the offsets index nothing; key counts given as ``cu_seqlens_k`` are ``seqused_k = cu_seqlens_k.diff()``).
    Forward only (SPEC.md section 1): a call with a block table refuses q, k, v or sinks that require a gradient
    while grad mode is on (run it under ``torch.no_grad()`` / ``torch.inference_mode()``), and ``dropout_p`` must be
    0. ``max_seqlen_k`` defaults to the table's capacity ``max_blocks * block_size``.

    - ``max_seqlen_q`` / ``max_seqlen_k``: Python ints, upper bounds of the sequence lengths (never read from the
      device); default ``total_q`` and ``total_k`` (or the table's capacity): valid, but slower than the true maxima.
    - Masks (``causal``, ``window_size = (left, right)``: a pair or list of ints, -1 or None unbounded; None for the
      pair is unbounded), sinks (``learnable_sink`` / ``s_aux``: ``[h_q]``, any float dtype) as ``flash_attn_func``,
      per sequence, aligned to the bottom right. Under ``torch.autocast`` q, k and v are cast to the autocast dtype.
    - Returns ``out [total_q, h_q, d_v]`` (q's dtype), or ``(out, softmax_lse)`` with ``return_lse``,
      ``return_softmax_lse`` (vLLM's name) or ``return_attn_probs``: ``softmax_lse`` float32 ``[h_q, total_q]``,
      natural log, including the sink. Rows after ``cu_seqlens_q[-1]`` get ``out = 0`` and ``lse = -inf``.
    - ``out``: a tensor of q's dtype and the result's shape ``[total_q, h_q, d_v]`` (any strides, e.g. vLLM's
      ``output[:num_actual_tokens]``) to write the result into, as FlashAttention does; it is returned (rows after
      ``cu_seqlens_q[-1]`` are left as they were). Wrong dtype: TypeError; shape or device: ValueError.
    - ``num_splits``: at most this many key splits per row in the forward (0: the library's heuristic, 1: none;
      a performance setting, as in FlashAttention 3).
    - ``fa_version`` (None, 2, 3 or 4: which FlashAttention's kernels the caller would run) is accepted: the
      attention computed is the same. ``q_descale`` / ``k_descale`` / ``v_descale``: FlashAttention 3 reads these
      dequantisation scales only for float8 q / k / v; this library takes no float8 inputs (a float8 q, k or v, e.g. an
      FP8 KV cache, is refused with a TypeError), so, as FlashAttention 3 does for 16-bit inputs, they are not read
      (vLLM passes its layers' scales, 1.0, on every call).
    - Refused with a ValueError, never ignored: ``scheduler_metadata`` other than None (FlashAttention 3's
      precomputed schedule, which only its kernels read), ``softcap``, ``alibi_slopes``.
    - ``trust_device_batch_tensors=True`` skips the library's synchronising check of CUDA ``cu_seqlens`` /
      ``seqused_k`` / block tables (as FlashAttention, which never checks them): set it on the hot path and for
      CUDA-graph capture outside ``torch.cuda.graph`` (inside, the check is skipped anyway).
    """
    _unsupported_fa_options(softcap, alibi_slopes)
    _flash_attn_3_options(scheduler_metadata, fa_version, q_descale, k_descale, v_descale)
    table = _page_table_argument(page_table, block_table)
    with_lse = bool(return_lse or return_attn_probs or return_softmax_lse)
    if table is None:
        _check(cu_seqlens_k is not None, "cu_seqlens_k is required (int32 [num_seqs + 1], the offsets of the "
               "sequences in k / v); a paged KV cache takes block_table (or page_table) with seqused_k instead")
        with argument_names(sinks=_sink_name(s_aux), cu_seqlens_kv="cu_seqlens_k", seqused_kv="seqused_k",
                            max_seqlen_kv="max_seqlen_k"):
            res = dot_product_attention(
                q, k, v, sinks=_sink_argument(learnable_sink, s_aux), softmax_scale=softmax_scale, causal=causal,
                window_size=window_size, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_k, seqused_kv=seqused_k,
                max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_k, dropout_p=dropout_p, generator=generator,
                deterministic=deterministic, return_lse=with_lse, trust_device_batch_tensors=trust_device_batch_tensors,
                num_splits=num_splits)
        o, lse = res if with_lse else (res, None)
    else:
        table_name = "page_table" if page_table is not None else "block_table"
        with argument_names(sinks=_sink_name(s_aux), seqused_kv="seqused_k", page_table=table_name,
                            max_seqlen_kv="max_seqlen_k"):
            o, lse = _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                   softmax_scale, causal, window_size, _sink_argument(learnable_sink, s_aux), seqused_k,
                                   table, table_name, trust_device_batch_tensors, num_splits)
    if out is not None:
        o = _write_out(out, o, cu_seqlens_q)
    return (o, lse) if with_lse else o


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                  window_size, sinks, seqused_k, table, table_name, trust_device_batch_tensors, num_splits):
    """flash_attn_varlen_func over a paged KV cache: varlen queries, k / v page pools, forward only."""
    _check(cu_seqlens_k is None, lambda: f"cu_seqlens_k must be None with {table_name}: k and v are page pools "
           "[num_blocks, block_size, h_kv, d] and each sequence's key count is seqused_k (vLLM's FlashAttention takes "
           "one or the other); key counts given as cu_seqlens_k are seqused_k = cu_seqlens_k[1:] - cu_seqlens_k[:-1]")
    _check(seqused_k is not None, lambda: f"seqused_k is required with {table_name} (int32 [num_seqs]: the keys of "
           "each sequence, its cached prefix and its new tokens)")
    _check(float(dropout_p) == 0.0, lambda: f"dropout_p must be 0 with {table_name}: paged KV is forward only "
           f"(SPEC.md section 1), got {dropout_p}")
    _check_floats(q=q, k=k, v=v)
    _check(not (torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                                for x in (q, k, v, sinks))),
           lambda: f"{table_name}: paged KV is forward only (SPEC.md section 1), and q, k, v or the sinks require a "
           "gradient: call it under torch.no_grad() or torch.inference_mode(), or detach them", RuntimeError)
    q, k, v = _autocast(q, k, v)
    window_left, window_right = _args.window_size_bounds(causal, window_size)
    table = _int32(table, "page_table")
    max_q = int(q.shape[0]) if max_seqlen_q is None else int(max_seqlen_q)
    max_kv = int(table.shape[-1]) * int(k.shape[1]) if max_seqlen_k is None else int(max_seqlen_k)
    return _forward_only(q, k, v, sinks, _int32(cu_seqlens_q, "cu_seqlens_q"), None, _int32(seqused_k, "seqused_k"),
                         table, max_q, max_kv, softmax_scale, window_left, window_right, trust_device_batch_tensors,
                         num_splits)


def _forward_only(q, k, v, sinks, cu_q, cu_kv, seqused_kv, page_table, max_q, max_kv, softmax_scale, window_left,
                  window_right, trust_device_batch_tensors, num_splits):
    """(out, lse) of one forward-only library call over a KV cache (paged, or contiguous as varlen keys; SPEC.md
    section 1): learnable softmax when sinks are given (any float dtype), else vanilla; masks aligned to the bottom
    right; no dropout; no autograd. What flash_attn_with_kvcache and the paged flash_attn_varlen_func run."""
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    if sinks is not None and sinks.dtype != torch.float32:
        sinks = sinks.to(torch.float32)
    softmax_type = _ops.SOFTMAX_TYPES["learnable" if sinks is not None else "vanilla"]
    with torch.no_grad():
        out, lse, _ = torch.ops.sinkattn.fwd(
            q, k, v, sinks, None, cu_q, cu_kv, seqused_kv, None, None, page_table, int(max_q), int(max_kv),
            softmax_type, None if softmax_scale is None else float(softmax_scale), window_left, window_right,
            _ops.ALIGNMENTS["bottom_right"], 0.0, None, False, bool(trust_device_batch_tensors), int(num_splits))
    return out, lse


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[Optional[int]] = (-1, -1),
    learnable_sink: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    block_table: Optional[torch.Tensor] = None,
    s_aux: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    trust_device_batch_tensors: bool = False,
):
    """FlashAttention's ``flash_attn_with_kvcache`` with a learnable sink: attention of new queries over a KV cache
    (decode, speculative decoding, chunked prefill; SPEC.md section 1), forward only.

    - ``q``: ``[b, s_q, h_q, d]`` (decode: ``s_q = 1``), or varlen ``[total_q, h_q, d]`` with ``cu_seqlens_q`` int32
      ``[b + 1]`` and ``max_seqlen_q``.
    - Contiguous cache: ``k_cache [b, s_cache, h_kv, d]``, ``v_cache [b, s_cache, h_kv, d_v]``. Paged cache
      (``page_table``, FlashAttention 3's name; ``block_table``, FlashAttention 2's, is accepted too): page pools
      ``[num_pages, page_size, h_kv, d | d_v]`` and ``page_table`` int32 ``[b, max_pages]``: key j of sequence n is
      row ``j % page_size`` of page ``page_table[n, j // page_size]``; entries past the last page a sequence uses are
      never read, pages may be shared.
    - ``cache_seqlens``: int32 ``[b]`` (or one int) keys of each sequence in the cache; required with a page table,
      default the whole cache otherwise. Masks (``causal``, ``window_size``) are aligned to the bottom right: the
      queries are the last ``s_q`` positions of each sequence.
    - ``learnable_sink`` / ``s_aux``: ``[h_q]`` sink logits (any float dtype); counted exactly once however the keys
      are split. ``num_splits``: key splits of the decode kernel (0: the library's heuristic, 1: none).
    - Returns ``out`` (q's shape with ``d_v``), or ``(out, softmax_lse)`` with ``return_softmax_lse`` (float32
      ``[b, h_q, s_q]`` or ``[h_q, total_q]``, natural log, including the sink).
    - ``causal`` sets the right bound of ``window_size`` (a pair of ints) to 0, as FlashAttention does.
    - Not supported, refused with a ValueError (never ignored): appending ``k`` / ``v`` to the cache (write them
      into the cache and raise ``cache_seqlens`` first), rotary embedding, ``cache_batch_idx``, ``cache_leftpad``,
      ``softcap``, ``alibi_slopes``. No host synchronisation and no allocation beyond the outputs and the library's
      workspace (with ``trust_device_batch_tensors=True`` not even the check of the batch tensors): CUDA-graph
      capturable.
    """
    with argument_names(q="q", k="k_cache", v="v_cache", sinks=_sink_name(s_aux), seqused_kv="cache_seqlens",
                        seqlens_kv="cache_seqlens", page_table="page_table" if block_table is None else "block_table",
                        max_seqlen_q="max_seqlen_q"):
        return _flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                        cache_batch_idx, cache_leftpad, page_table, softmax_scale, causal, window_size,
                                        learnable_sink, softcap, alibi_slopes, num_splits, return_softmax_lse,
                                        block_table, s_aux, cu_seqlens_q, max_seqlen_q, trust_device_batch_tensors)


def _flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                             cache_leftpad, page_table, softmax_scale, causal, window_size, learnable_sink, softcap,
                             alibi_slopes, num_splits, return_softmax_lse, block_table, s_aux, cu_seqlens_q,
                             max_seqlen_q, trust_device_batch_tensors):
    _unsupported_fa_options(softcap, alibi_slopes)
    _check(k is None and v is None, "appending k / v to the cache is not supported: write the new keys and values into "
           "k_cache / v_cache (their pages) and pass the increased cache_seqlens")
    _check(rotary_cos is None and rotary_sin is None, "rotary embedding is not supported: rotate q and the cached keys "
           "before the call")
    _check(cache_batch_idx is None, "cache_batch_idx is not supported (index the caches, or use a page_table)")
    _check(cache_leftpad is None, "cache_leftpad is not supported (left-padded caches: use a page_table)")
    page_table = _page_table_argument(page_table, block_table)
    sinks = _sink_argument(learnable_sink, s_aux)
    _check_floats(q=q, k_cache=k_cache, v_cache=v_cache)
    varlen = cu_seqlens_q is not None
    b = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((b,), cache_seqlens, dtype=torch.int32, device=q.device)
    if page_table is None and cache_seqlens is None:  # the whole contiguous cache
        cache_seqlens = torch.full((b,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    _check(cache_seqlens is not None, "cache_seqlens is required with a page table")
    window_left, window_right = _args.window_size_bounds(causal, window_size)
    cache_seqlens = _int32(cache_seqlens, "cache_seqlens")
    if page_table is not None:
        page_table = _int32(page_table, "page_table")
        cu_kv = None
        max_kv = int(page_table.shape[1]) * int(k_cache.shape[1])
        kc, vc = k_cache, v_cache
    else:  # a contiguous cache is the same call with each sequence's rows as its keys: varlen keys over [b * s]
        s_cache = int(k_cache.shape[1])
        cu_kv = torch.arange(0, (b + 1) * s_cache, s_cache, dtype=torch.int32, device=q.device)
        max_kv = s_cache
        kc = k_cache.reshape((b * s_cache,) + tuple(k_cache.shape[2:]))
        vc = v_cache.reshape((b * s_cache,) + tuple(v_cache.shape[2:]))
    if not varlen and page_table is None:  # keys as varlen need varlen queries: dense q rows per sequence
        s_q = int(q.shape[1])
        q_rows = q.reshape((b * s_q,) + tuple(q.shape[2:]))
        cu_q = torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=q.device)
        max_q = s_q
    else:
        q_rows, cu_q = q, (_int32(cu_seqlens_q, "cu_seqlens_q") if varlen else None)
        max_q = int(max_seqlen_q if max_seqlen_q is not None else q.shape[0]) if varlen else int(q.shape[1])
    out, lse = _forward_only(q_rows, kc, vc, sinks, cu_q, cu_kv, cache_seqlens, page_table, max_q, max_kv,
                             softmax_scale, window_left, window_right, trust_device_batch_tensors, num_splits)
    if not varlen and page_table is None:  # back to [b, s_q, ...]
        out = out.reshape((b, q.shape[1]) + tuple(out.shape[1:]))
        lse = lse.reshape(lse.shape[0], b, q.shape[1]).transpose(0, 1)
    return (out, lse) if return_softmax_lse else out
