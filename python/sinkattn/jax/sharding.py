"""Data- and tensor-parallel sink attention under ``jax.jit`` with a ``Mesh``.

:func:`sharded_dot_product_attention` runs the fused op on each device's shard through ``jax.shard_map``, so XLA
never all-gathers query/key/value:

- batch sharded over ``batch_axes`` (data parallel): query/key/value/bias/sequence lengths/segment ids are split
  along the batch; sinks are replicated over those axes, so the transpose of ``shard_map`` sums d_sinks over
  them with an all-reduce (SPEC.md section 3: d_sinks[h] is summed over the batch);
- heads sharded over ``head_axis`` (tensor parallel): query heads N and KV heads K are split by the same factor,
  which keeps every GQA group on one device (query head h reads KV head h // (N / K), SPEC.md section 1), so it
  needs N % t == 0 and K % t == 0; sinks [N] are sharded with the query heads (d_sinks is never summed over heads).

Everything else of the op (softmax_type, masks, windows, scale, return_lse, ...) is passed through unchanged.
Dropout: each shard folds its linear shard index into ``dropout_rng`` so shards draw independent masks; the mask
is therefore a valid dropout mask but not the one an unsharded call would draw (the SPEC.md Philox index uses the
local batch/head numbers).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .attention import vma_typing_supported

__all__ = ["sharded_dot_product_attention", "attention_partition_specs"]


def _default_attention():
    from .attention import dot_product_attention  # the fused op (other module of this package)

    return dot_product_attention


def _axes(a):
    if a is None:
        return ()
    if isinstance(a, (tuple, list)):
        return tuple(a)
    return (a,)


def _spec_entry(axes):
    if not axes:
        return None
    return axes if len(axes) > 1 else axes[0]


def _axis_size(mesh, axes):
    return math.prod(mesh.shape[a] for a in axes)


_BATCH_VECTORS = ("query_seq_lengths", "key_value_seq_lengths")
_REPLICATED = ("cu_seqlens_q", "cu_seqlens_kv", "cu_seqlens", "seqused_kv")


def attention_partition_specs(query, key, *, batch_axes=None, head_axis=None, bias=None, return_lse=False,
                              **arrays):
    """The PartitionSpecs :func:`sharded_dot_product_attention` uses: (in-specs dict, out-spec).

    Dense BTNH: query/key/value P(batch, None, head, None); lse P(batch, head, None). Packed varlen
    ([total, N, H], 3-D): P(None, head, None); lse P(head, None); batch sharding is refused there."""
    b = _spec_entry(_axes(batch_axes))
    h = _spec_entry(_axes(head_axis))
    packed = query.ndim == 3
    if packed:
        if b is not None:
            raise ValueError("sharded_dot_product_attention: batch_axes cannot shard packed (varlen, 3-D) inputs; "
                             "shard heads only")
        qspec, lspec = P(None, h, None), P(h, None)
    else:
        qspec, lspec = P(b, None, h, None), P(b, h, None)
    specs = {"query": qspec, "key": qspec, "value": qspec}
    if bias is not None:
        if bias.ndim != 4:
            raise ValueError(f"bias must be 4-D [B or 1, N or 1, T, S], got shape {bias.shape}")
        specs["bias"] = P(b if bias.shape[0] != 1 else None, h if bias.shape[1] != 1 else None, None, None)
    for name, x in arrays.items():
        if x is None:
            continue
        if name == "sinks":
            specs[name] = P(h)
        elif name in _BATCH_VECTORS or name.endswith("segment_ids"):
            specs[name] = P(b, *([None] * (x.ndim - 1)))
        elif name in _REPLICATED or name == "dropout_rng":
            specs[name] = P()
        else:
            raise ValueError(f"sharded_dot_product_attention: do not know how to shard array argument {name!r}")
    out_spec = (qspec, lspec) if return_lse else qspec
    return specs, out_spec


def sharded_dot_product_attention(query, key, value, *, mesh, batch_axes=None, head_axis=None, sinks=None,
                                  bias=None, return_lse=False, attention_fn=None, **kwargs):
    """``sinkattn.jax.dot_product_attention`` on arrays sharded over ``mesh``, without gathering them.

    Args:
      query: [B, T, N, H] (or packed [total_q, N, H]); key/value: [B, S, K, H(_v)].
      mesh: the ``jax.sharding.Mesh``.
      batch_axes: mesh axis name (or tuple of names) the batch is sharded over; None: not sharded.
      head_axis: mesh axis name (or tuple) the heads are sharded over (N and K must divide by its size).
      sinks: [N] fp32 (sharded with the heads); bias: [B or 1, N or 1, T, S].
      return_lse: also return lse [B, N, T] fp32 (including the sink, SPEC.md section 2).
      attention_fn: the per-shard op (default ``sinkattn.jax.dot_product_attention``).
      **kwargs: every other argument of the op; arrays among them (query_seq_lengths, key_value_seq_lengths,
        *segment_ids, cu_seqlens*, dropout_rng) get their specs from :func:`attention_partition_specs`.
    Returns out [B, T, N, H_v] (and lse) sharded like query. Differentiable w.r.t. query, key, value, sinks, bias.
    """
    fn = attention_fn or _default_attention()
    baxes, haxes = _axes(batch_axes), _axes(head_axis)
    for a in baxes + haxes:
        if a not in mesh.shape:
            raise ValueError(f"sharded_dot_product_attention: mesh has no axis {a!r} (axes: {tuple(mesh.shape)})")
    if set(baxes) & set(haxes):
        raise ValueError("sharded_dot_product_attention: batch_axes and head_axis must be different mesh axes")
    packed = query.ndim == 3
    tb, th = _axis_size(mesh, baxes), _axis_size(mesh, haxes)
    n_q, n_kv = query.shape[-2], key.shape[-2]
    if not packed and query.shape[0] % tb:
        raise ValueError(f"sharded_dot_product_attention: batch {query.shape[0]} not divisible by the "
                         f"{tb} devices of batch_axes {baxes}")
    if n_q % th or n_kv % th:
        raise ValueError(f"sharded_dot_product_attention: query heads N={n_q} and KV heads K={n_kv} must both be "
                         f"divisible by the {th} devices of head_axis {haxes} (GQA groups stay on one device)")

    arrays = {k: v for k, v in kwargs.items() if isinstance(v, (jax.Array, jnp.ndarray)) or hasattr(v, "shape")}
    statics = {k: v for k, v in kwargs.items() if k not in arrays}
    if sinks is not None:
        arrays["sinks"] = jnp.asarray(sinks)
    specs, out_spec = attention_partition_specs(query, key, batch_axes=batch_axes, head_axis=head_axis, bias=bias,
                                                return_lse=return_lse, **arrays)
    names = list(arrays)
    dropout = "dropout_rng" in arrays and statics.get("dropout_rate", 0.0) > 0.0
    shard_axes = baxes + haxes

    def body(q, k, v, bias_l, *rest):
        extra = dict(zip(names, rest))
        if dropout and shard_axes:
            idx = 0
            for a in shard_axes:  # linear shard index over the sharded axes
                idx = idx * mesh.shape[a] + jax.lax.axis_index(a)
            extra["dropout_rng"] = jax.random.fold_in(extra["dropout_rng"], idx)
        if bias_l is not None:
            extra["bias"] = bias_l
        return fn(q, k, v, return_lse=return_lse, **extra, **statics)

    in_specs = (specs["query"], specs["key"], specs["value"], specs.get("bias"), *[specs[n] for n in names])
    # check_vma=True where jax has the varying-axes type (attention.vma_typing_supported): the fused op types its
    # results and cotangents like its inputs (attention.py, _vma). The transpose sums the cotangents of inputs
    # replicated over an axis (sinks over the batch axes, a broadcast bias) over that axis (all-reduce, SPEC.md
    # section 3).
    f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                      check_vma=vma_typing_supported())
    return f(query, key, value, bias, *[arrays[n] for n in names])
