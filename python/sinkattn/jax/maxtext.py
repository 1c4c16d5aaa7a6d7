"""``sinkattn.jax.maxtext``: MaxText's attention op through sinkattn's fused attention with sinks.

    import sinkattn.jax.maxtext
    sinkattn.jax.maxtext.install()              # before the first train step is traced
    # MaxText config: attention=sinkattn  (e.g. model_name=gpt-oss-20b attention=sinkattn)

:func:`install` registers the attention kernel name ``"sinkattn"`` with MaxText's ``AttentionOp``: a layer built
with ``attention=sinkattn`` runs its training (and prefill) attention as ONE fused call of
:func:`sinkattn.jax.dot_product_attention` per layer instead of MaxText's ``dot_product`` path, which materialises
the ``[b, n, t, s + 1]`` logits with the sink column appended. Every other kernel name (``dot_product``,
``cudnn_flash_te``, ...) is left exactly as MaxText runs it, so both can be compared in one process.

What a layer computes is MaxText's ``dot_product`` attention (SPEC.md section 2):

- the query arrives already scaled by MaxText (``query_pre_attn_scalar`` or its depth scaling): softmax_scale = 1;
- ``sinks`` (``attention_sink: true``, the layer's ``[num_query_heads]`` parameter): ``softmax_type="learnable"``,
  d_sinks flows back to the parameter (SPEC.md section 3); without sinks the softmax is vanilla;
- ``attention_type``: ``global`` is causal, ``local_sliding`` is causal with ``window_left =
  sliding_window_size - 1`` (MaxText's ``col > row - w``; GPT-OSS: 128 -> 127), ``full`` is unmasked;
- GQA/MQA: ``num_query_heads % num_kv_heads == 0`` (SPEC.md section 1);
- ``decoder_segment_ids`` [b, t]: packed sequences. Each run of equal consecutive ids is one sequence (padding, id
  0, is one more), which is MaxText's ``q_id == kv_id`` mask for the contiguous segments its packing produces.

Mesh and sharding: the call is a ``jax.shard_map`` over the layer's own mesh with the partition specs MaxText's
logical axis rules give its attention activations (``activation_kv_batch``, ``activation_length_attn``,
``activation_kv_heads``), so XLA never gathers query/key/value: batch and heads are split as MaxText splits them
(d_sinks is summed over the batch and sequence axes by shard_map's transpose, never over heads). When the
sequence is sharded (``ici_context_parallelism`` > 1, context parallelism) the attention runs as

- ``context_parallel="all_to_all"``: :mod:`sinkattn.jax.ulysses` (all-to-all from sequence to heads, one fused
  call on the whole sequence; exact for every mask above, packing included; needs the query heads per device to
  divide by the context-parallel size), or
- ``context_parallel="ring"``: :mod:`sinkattn.jax.ring` (key/value blocks travel a ring; a sliding-window layer only
  fetches the window's rows). The ring has no segment ids: it runs only unpacked data (``packing: false``) on
  causal layers. There MaxText's rows are one sequence followed by padding (id 0), and under a causal mask no
  token of the sequence can see a padding key, so the loss and every gradient are those of MaxText's mask (only
  the padding rows' own outputs, which no loss term reads, differ). Packed data or ``full`` layers raise.
- ``"auto"`` (default): the ring when MaxText's ``context_parallel_strategy`` is ``ring``, else the all-to-all
  (MaxText's ``all_gather`` default has no sinkattn counterpart; the all-to-all is exact for it).

With ``context_parallel_load_balance`` (MaxText's default) the input pipeline reorders each row by
DUAL_CHUNK_SWAP for the context-parallel size, which is sinkattn's zig-zag layout (``ring.zigzag_order``): both
modes then run with ``layout="zigzag"``. The STRIPED reorder raises.

Raises NotImplementedError (naming the feature, and ``attention=dot_product`` as the way to keep it) for what
MaxText's path supports and this one does not: autoregressive decoding and chunked prefill, quantized KV caches,
ragged attention, attention logit soft-capping, chunk / MLA / compressed / block-diffusion attention types,
bidirectional (multimodal) masks, sparse indexer masks, MoBA, QK-Clip statistics, separate key segment ids,
``shard_mode: explicit``, the USP (two-axis) context parallelism and the STRIPED reorder. Attention-probability
dropout: none, as in MaxText's ``dot_product`` path. :func:`install` refuses a MaxText version other than those
in :data:`TESTED_MAXTEXT_VERSIONS` (the op's internals it hooks are version specific).
"""

from __future__ import annotations

import importlib.metadata
import inspect

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .attention import dot_product_attention, vma_typing_supported
from .ring import ring_attention_shard
from .ulysses import ulysses_attention_shard

__all__ = ["install", "uninstall", "installed", "KERNEL", "TESTED_MAXTEXT_VERSIONS", "CONTEXT_PARALLEL_MODES"]

KERNEL = "sinkattn"
"""The value of MaxText's ``attention`` config key that selects sinkattn."""

TESTED_MAXTEXT_VERSIONS = ("0.2.5",)
"""MaxText versions this module was tested with (tests/python_maxtext); :func:`install` refuses others."""

CONTEXT_PARALLEL_MODES = ("auto", "all_to_all", "ring")

_state = {"original": None, "context_parallel": "auto", "signature": None}


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _state["original"] is not None


def _maxtext_version() -> str:
    """The installed distribution's version, else (a source tree on sys.path) maxtext/version.py's."""
    try:
        return importlib.metadata.version("maxtext")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        from maxtext.version import __version__  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError("sinkattn.jax.maxtext: MaxText is not installed (pip install maxtext=="
                          f"{TESTED_MAXTEXT_VERSIONS[-1]})") from e
    return __version__


def install(*, context_parallel: str = "auto") -> None:
    """Register ``attention=sinkattn`` with MaxText's attention op (module docstring). Idempotent; a second call
    only changes ``context_parallel``.

    Args:
      context_parallel: how a sequence sharded over the context axis is attended: ``"auto"`` (the ring when
        MaxText's ``context_parallel_strategy`` is ``ring``, else the all-to-all), ``"all_to_all"`` or ``"ring"``.
    Raises:
      ImportError without MaxText; RuntimeError for a MaxText version not in TESTED_MAXTEXT_VERSIONS; ValueError
      for an unknown ``context_parallel``.
    """
    if context_parallel not in CONTEXT_PARALLEL_MODES:
        raise ValueError(f"sinkattn.jax.maxtext.install: context_parallel must be one of {CONTEXT_PARALLEL_MODES}, "
                         f"got {context_parallel!r}")
    version = _maxtext_version()
    if version not in TESTED_MAXTEXT_VERSIONS:
        raise RuntimeError(
            f"sinkattn.jax.maxtext: MaxText {version} is installed, but this sinkattn was tested with MaxText "
            f"{', '.join(TESTED_MAXTEXT_VERSIONS)} only; it hooks the internals of MaxText's AttentionOp, which "
            f"change between releases. Install maxtext=={TESTED_MAXTEXT_VERSIONS[-1]} or a sinkattn tested with "
            f"{version}.")
    from maxtext.layers import attention_op  # pylint: disable=import-outside-toplevel

    _state["context_parallel"] = context_parallel
    if _state["original"] is not None:
        return
    original = attention_op.AttentionOp.apply_attention
    signature = inspect.signature(original)

    def apply_attention(self, *args, **kwargs):
        if self.attention_kernel != KERNEL:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return _apply_attention(self, bound.arguments)

    apply_attention.__doc__ = original.__doc__
    apply_attention.__wrapped__ = original
    _state["original"], _state["signature"] = original, signature
    attention_op.AttentionOp.apply_attention = apply_attention


def uninstall() -> None:
    """Undo :func:`install` (MaxText's own ``apply_attention`` is restored; ``attention=sinkattn`` then raises
    MaxText's 'Unexpected attention kernel')."""
    if _state["original"] is None:
        return
    from maxtext.layers import attention_op  # pylint: disable=import-outside-toplevel

    attention_op.AttentionOp.apply_attention = _state["original"]
    _state["original"] = _state["signature"] = None


def _unsupported(what: str):
    raise NotImplementedError(f"sinkattn.jax.maxtext (attention={KERNEL}): {what} is not supported; use "
                              "attention=dot_product for it")


def _axes_tuple(entry) -> tuple:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)


def _entry(axes: tuple):
    if not axes:
        return None
    return axes if len(axes) > 1 else axes[0]


def _check_call(op, a) -> None:
    """Raise for every input of MaxText's apply_attention this kernel does not compute (module docstring)."""
    from maxtext.common.common_types import (  # pylint: disable=import-outside-toplevel
        AttentionType, MODEL_MODE_PREFILL, MODEL_MODE_TRAIN, ShardMode)
    from maxtext.inference.kvcache import KVTensor  # pylint: disable=import-outside-toplevel

    cfg = op.config
    if a["model_mode"] not in (MODEL_MODE_TRAIN, MODEL_MODE_PREFILL):
        _unsupported(f"model_mode={a['model_mode']!r} (autoregressive decoding)")
    if a.get("previous_chunk") is not None:
        _unsupported("chunked prefill (previous_chunk)")
    if isinstance(a["key"], KVTensor) or isinstance(a["value"], KVTensor) or op.kv_quant:
        _unsupported("a quantized KV cache")
    if a.get("use_ragged_attention"):
        _unsupported("ragged attention")
    if a.get("bidirectional_mask") is not None:
        _unsupported("a bidirectional (multimodal) mask")
    if a.get("indexer_mask") is not None:
        _unsupported("a sparse indexer mask")
    if a.get("compressed_mask") is not None or a.get("compress_ratio") or a.get("pad_kv_total"):
        _unsupported("compressed attention")
    if a.get("record_max_logits"):
        _unsupported("record_max_logits (QK-Clip statistics)")
    if a.get("decoder_segment_ids_kv") is not None:
        _unsupported("separate key segment ids (decoder_segment_ids_kv)")
    if op.attn_logits_soft_cap:
        _unsupported(f"attention logit soft-capping (attn_logits_soft_cap={op.attn_logits_soft_cap})")
    if op.attention_type not in (AttentionType.GLOBAL, AttentionType.LOCAL_SLIDING, AttentionType.FULL):
        _unsupported(f"attention_type={op.attention_type.value!r}")
    if getattr(cfg, "moba", False):
        _unsupported("MoBA")
    if cfg.shard_mode == ShardMode.EXPLICIT:
        _unsupported("shard_mode=explicit")
    q, k = a["query"], a["key"]
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0]:
        _unsupported(f"query {q.shape} / key {k.shape} (needs [b, t, n, d] and [b, s, n_kv, d] of one batch)")


def _masks(op) -> dict:
    from maxtext.common.common_types import AttentionType  # pylint: disable=import-outside-toplevel

    if op.attention_type == AttentionType.FULL:
        return dict(is_causal=False)
    if op.attention_type == AttentionType.LOCAL_SLIDING:
        w = op.sliding_window_size
        if not w or w <= 0:
            raise ValueError("sinkattn.jax.maxtext: local_sliding attention needs sliding_window_size > 0")
        # MaxText's sliding mask is (col > row - w) & (col <= row): keys row - (w - 1) .. row (SPEC.md section 2)
        return dict(is_causal=True, local_window_size=(w - 1, 0))
    return dict(is_causal=True)


def _mesh_layout(op):
    """(batch axes, sequence axes, head axes) of MaxText's attention activations on the op's mesh (size-1 axes
    dropped, as MaxText's own logical_to_mesh_axes does)."""
    from maxtext.common.common_types import (  # pylint: disable=import-outside-toplevel
        ATTN_LENGTH, KV_BATCH, KV_HEAD, KV_HEAD_DIM)

    spec = op._logical_to_mesh_axes((KV_BATCH, ATTN_LENGTH, KV_HEAD, KV_HEAD_DIM))  # pylint: disable=protected-access
    batch, seq, heads, head_dim = (_axes_tuple(e) for e in tuple(spec) + (None,) * (4 - len(tuple(spec))))
    if head_dim:
        _unsupported(f"a head dimension sharded over mesh axes {head_dim}")
    return batch, seq, heads


def _reorder_is_striped(cfg) -> bool:
    """Whether MaxText's load-balancing reorder of this config is STRIPED (utils/train_utils.py resolves AUTO)."""
    from maxtext.common.common_types import ReorderStrategy  # pylint: disable=import-outside-toplevel

    strategy = cfg.context_parallel_reorder_strategy
    if strategy == ReorderStrategy.AUTO:
        return bool(cfg.packing and cfg.context_parallel_strategy == "ring"
                    and cfg.hardware in ("gpu", "gpu_multiprocess"))
    return strategy == ReorderStrategy.STRIPED


def _context_parallel_mode(cfg) -> str:
    mode = _state["context_parallel"]
    if mode == "auto":
        return "ring" if cfg.context_parallel_strategy == "ring" else "all_to_all"
    return mode


def _apply_attention(op, a: dict):
    """apply_attention of attention=sinkattn: (out [b, t, n, d] normalised, None, None)."""
    from maxtext.common.common_types import AttentionType  # pylint: disable=import-outside-toplevel
    from jax.ad_checkpoint import checkpoint_name  # pylint: disable=import-outside-toplevel

    _check_call(op, a)
    cfg, mesh = op.config, op.mesh
    query, key, value = a["query"], a["key"], a["value"]
    segment_ids = a["decoder_segment_ids"]
    sinks = a["sinks"]
    if sinks is not None:
        sinks = jnp.asarray(sinks[...] if hasattr(sinks, "get_value") else sinks)
    masks = _masks(op)
    options = dict(softmax_type="learnable" if sinks is not None else "vanilla", scale=1.0, **masks)

    batch_axes, seq_axes, head_axes = _mesh_layout(op)
    n_q, n_kv = query.shape[2], key.shape[2]
    t_heads = 1
    for ax in head_axes:
        t_heads *= mesh.shape[ax]
    if n_q % t_heads or n_kv % t_heads:
        raise ValueError(f"sinkattn.jax.maxtext: query heads {n_q} and KV heads {n_kv} must both divide by the "
                         f"{t_heads} devices of the head mesh axes {head_axes} (GQA groups stay on one device)")
    cp_axis, cp, mode, layout = None, 1, None, "contiguous"
    if seq_axes:
        if len(seq_axes) > 1:
            _unsupported(f"a sequence sharded over several mesh axes {seq_axes} (USP context parallelism)")
        cp_axis = seq_axes[0]
        cp = mesh.shape[cp_axis]
        mode = _context_parallel_mode(cfg)
        if op._load_balanced_context_parallel():  # pylint: disable=protected-access
            if cp_axis != cfg.context_sharding:
                _unsupported(f"load-balanced context parallelism over mesh axis {cp_axis!r} (reordered for "
                             f"{cfg.context_sharding!r})")
            if _reorder_is_striped(cfg):
                _unsupported("the STRIPED load-balancing reorder (context_parallel_reorder_strategy)")
            layout = "zigzag"
        if mode == "ring" and segment_ids is not None:
            if cfg.packing:
                raise NotImplementedError(
                    "sinkattn.jax.maxtext: ring context parallelism has no segment ids, so it cannot run packed "
                    "sequences (packing: true); install(context_parallel='all_to_all') runs them exactly")
            if op.attention_type == AttentionType.FULL:
                raise NotImplementedError(
                    "sinkattn.jax.maxtext: ring context parallelism has no segment ids, so an unmasked ('full') "
                    "layer would let tokens see the padding; install(context_parallel='all_to_all') runs it exactly")
            # unpacked rows are one sequence then padding: under the causal mask no sequence token sees a padding
            # key, so the loss and its gradients are unchanged without the ids (module docstring)
            segment_ids = None
    b, s = _entry(batch_axes), _entry((cp_axis,) if cp_axis else ())
    h = _entry(head_axes)
    qspec = P(b, s, h, None)

    extra, extra_specs = {}, {}  # optional operands (None is no operand of shard_map)
    if sinks is not None:
        extra["sinks"], extra_specs["sinks"] = sinks, P(h)  # replicated over batch and sequence: d_sinks summed
    if segment_ids is not None:
        extra["segment_ids"], extra_specs["segment_ids"] = segment_ids, P(b, s)

    def body(q, k, v, ex):
        snk, seg = ex.get("sinks"), ex.get("segment_ids")
        if cp_axis is None:
            return dot_product_attention(q, k, v, sinks=snk, segment_ids=seg, **options)
        if mode == "ring":
            return ring_attention_shard(q, k, v, axis_name=cp_axis, axis_size=cp, sinks=snk,
                                        softmax_type=options["softmax_type"], is_causal=masks["is_causal"],
                                        local_window_size=masks.get("local_window_size"), scale=1.0, layout=layout)
        return ulysses_attention_shard(q, k, v, axis_name=cp_axis, axis_size=cp, sinks=snk, segment_ids=seg,
                                       layout=layout, **options)

    f = jax.shard_map(body, mesh=mesh, in_specs=(qspec, qspec, qspec, extra_specs), out_specs=qspec,
                      check_vma=vma_typing_supported())
    out = f(query, key, value, extra)
    return checkpoint_name(out, "context"), None, None
