"""All-to-all ("Ulysses", DeepSpeed-Ulysses) context parallelism with softmax sinks.

The sequence axis of query/key/value is sharded over one mesh axis (``seq_axis``, size ``p``). Inside
``shard_map`` each device re-shards its sequence block to a head block with one ``lax.all_to_all`` per tensor
(split the heads into p groups, send group j to device j, concatenate what arrives along the sequence), so that
device j holds query heads [j N/p, (j+1) N/p) for the WHOLE sequence. It makes ONE fused call of
``sinkattn.jax.dot_product_attention`` with those heads' sinks (``sinks[j N/p : (j+1) N/p]``), and the inverse
all-to-all returns out (and lse) to the sequence sharding. Every device sees the full sequence, so causal masks,
sliding windows (either side), both mask alignments, ``segment_ids``, padding lengths and varlen ``cu_seqlens``
are exact: the op itself applies them (SPEC.md sections 1-2).

Backward: plain JAX differentiation. The transpose of an all-to-all is the inverse all-to-all, the fused call's
custom_vjp gives dq, dk, dv and d_sinks of the device's heads (SPEC.md section 3), the transpose of taking the
device's slice of the replicated sinks [N] is the sum over the sequence axis (an all-reduce of N floats), and over
``batch_axes`` d_sinks is summed by ``shard_map``'s transpose like in :mod:`sinkattn.jax.sharding`.

GQA (K key/value heads, N query heads, N % K == 0): query head h reads KV head h // (N / K) (SPEC.md section 1).
The rule: N must be divisible by p (each device gets N / p query heads). K need not be: when p does not divide K
the KV heads are replicated ``rep = p / gcd(K, p)`` times before the all-to-all (each device then receives the
KV heads its query heads read, lcm(K, p) / p of them, no more), and the transpose of that replication sums the dk/dv
of the replicas back into each KV head. Example: GPT-OSS-20B (N 64, K 8) on 16 devices replicates each KV head
twice; on 2, 4 or 8 devices nothing is replicated.

Communication per device and layer: forward (p-1)/p of q, k, v and out (plus lse [B, N, T/p] when returned);
backward the same again (d_out in, dq/dk/dv out). Per step it is not overlapped with the fused call (the call needs
all of it), which is cheap next to the attention itself at long context; the ring (:mod:`sinkattn.jax.ring`) moves
only key/value blocks but needs p steps (or the band's few pieces under a sliding window).

Layout: ``layout="contiguous"`` (device r holds rows [r T/p, (r+1) T/p)) or ``"zigzag"`` (the ring's load-balanced
order, :func:`sinkattn.jax.ring.zigzag_permute`), so that one model can mix both modes without re-permuting its
activations; each device undoes the zig-zag order locally after the all-to-all and redoes it before the inverse.
Not supported (raise): bias (a [T, S] tensor per head has no place in long-context training), dropout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .._context_parallel import ulysses_kv_replication
from .attention import dot_product_attention, vma_typing_supported
from .ring import zigzag_permute, zigzag_unpermute
from .sharding import _axes, _axis_size, _spec_entry

__all__ = ["ulysses_dot_product_attention", "ulysses_attention_shard", "ulysses_kv_replication"]

_DENSE_VECTORS = ("query_seq_lengths", "key_value_seq_lengths")
_REPLICATED = ("cu_seqlens_q", "cu_seqlens_kv")
_UNSUPPORTED = ("bias", "dropout_rng")


def _check_unsupported(kwargs):
    for name in _UNSUPPORTED:
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"ulysses attention: {name} is not supported")
    if float(kwargs.get("dropout_rate", 0.0)) != 0.0:
        raise NotImplementedError("ulysses attention: dropout is not supported")


def ulysses_attention_shard(query, key, value, *, axis_name, axis_size, sinks=None, segment_ids=None,
                            layout="contiguous", return_lse=False, **kwargs):
    """All-to-all attention on the local blocks, to be called inside ``shard_map`` over ``axis_name``.

    query [B, T/p, N, H] and key/value [B, S/p, K, H(_v)] (this device's sequence block, in ``layout`` order), or
    packed varlen [total/p, N, H] with replicated ``cu_seqlens_q/kv``; sinks [N] (all of this device's heads,
    replicated over ``axis_name``); segment_ids [B, T/p] (or a pair with [B, S/p]) sharded like the sequence;
    query_seq_lengths / key_value_seq_lengths [B] replicated over ``axis_name``. Every other keyword goes to
    ``dot_product_attention`` unchanged (softmax_type, scale, is_causal, local_window_size, mask_alignment,
    max_seqlen_q/kv, deterministic). Returns out like query (and lse [B, N, T/p], or [N, total/p] packed)."""
    _check_unsupported(kwargs)
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    p = axis_size
    packed = query.ndim == 3
    if packed and layout == "zigzag":
        raise ValueError("ulysses attention: the zig-zag layout is for dense [B, T, N, H] inputs")
    seq_ax, head_ax = (0, 1) if packed else (1, 2)
    n_q, n_kv = query.shape[head_ax], key.shape[head_ax]
    rep = ulysses_kv_replication(n_q, n_kv, p)
    if rep > 1:  # the transpose of the repeat sums the replicas' dk/dv (GQA)
        key = jnp.repeat(key, rep, axis=head_ax)
        value = jnp.repeat(value, rep, axis=head_ax)

    def to_heads(x):  # [.., T/p, N, ..] -> [.., T, N/p, ..]
        x = jax.lax.all_to_all(x, axis_name, split_axis=head_ax, concat_axis=seq_ax, tiled=True)
        return zigzag_unpermute(x, p, axis=1) if layout == "zigzag" else x

    def to_rows(x, s_ax, h_ax):  # the inverse
        if layout == "zigzag":
            x = zigzag_permute(x, p, axis=s_ax)
        return jax.lax.all_to_all(x, axis_name, split_axis=s_ax, concat_axis=h_ax, tiled=True)

    q, k, v = to_heads(query), to_heads(key), to_heads(value)
    if sinks is not None:
        n_loc = n_q // p
        sinks = jax.lax.dynamic_slice_in_dim(jnp.asarray(sinks), jax.lax.axis_index(axis_name) * n_loc, n_loc)
    if segment_ids is not None:
        def gather(ids):
            ids = jax.lax.all_gather(jnp.asarray(ids), axis_name, axis=1, tiled=True)
            return zigzag_unpermute(ids, p, axis=1) if layout == "zigzag" else ids

        segment_ids = (tuple(gather(s) for s in segment_ids) if isinstance(segment_ids, (tuple, list))
                       else gather(segment_ids))
        kwargs["segment_ids"] = segment_ids
    res = dot_product_attention(q, k, v, sinks=sinks, return_lse=return_lse, **kwargs)
    out, lse = res if return_lse else (res, None)
    out = to_rows(out, seq_ax, head_ax)
    if lse is None:
        return out
    lse = to_rows(lse, 1, 0) if packed else to_rows(lse, 2, 1)
    return out, lse


def ulysses_dot_product_attention(query, key, value, *, mesh, seq_axis, batch_axes=None, head_axis=None,
                                  sinks=None, segment_ids=None, layout="contiguous", return_lse=False, **kwargs):
    """Context-parallel attention of global arrays sharded along the sequence over ``mesh`` axis ``seq_axis``, by
    all-to-all re-sharding to heads (module docstring).

    Args:
      query: [B, T, N, H]; key/value: [B, S, K, H(_v)] (BTNH, in ``layout`` order), T and S divisible by p (2p
        for zig-zag); or packed varlen [total_q, N, H] / [total_kv, K, H] with ``cu_seqlens_q`` /
        ``cu_seqlens_kv`` (replicated; totals divisible by p; no batch_axes).
      mesh, seq_axis: the mesh and the axis name the sequence is sharded over (size p).
      batch_axes: mesh axis name(s) the batch is sharded over (data parallel); d_sinks is summed over them.
      head_axis: mesh axis name(s) the heads are also sharded over (tensor parallel): N must be divisible by
        (head_axis size) * p and K by the head_axis size; Ulysses then splits each device's N / t heads.
      sinks: [N] fp32 (sharded with head_axis, replicated over seq_axis and batch_axes).
      segment_ids: [B, T] int (or a pair for [B, T] / [B, S]), sharded like the sequence (packed documents).
      layout: "contiguous" or "zigzag" (see module docstring).
      return_lse: also return lse [B, N, T] fp32 (including the sink), sharded like query's rows.
      **kwargs: the op's other arguments: softmax_type, scale, is_causal, local_window_size, mask_alignment,
        query_seq_lengths / key_value_seq_lengths ([B], sharded with the batch; packed: key_value_seq_lengths
        is seqused_kv, replicated), cu_seqlens_q / cu_seqlens_kv, max_seqlen_q / max_seqlen_kv, deterministic.
    Returns out [B, T, N, H_v] (and lse) sharded like query. Differentiable w.r.t. query, key, value, sinks.
    Raises ValueError for head counts the rule above excludes (the message names the rule), NotImplementedError
    for bias and dropout.
    """
    _check_unsupported(kwargs)
    if seq_axis not in mesh.shape:
        raise ValueError(f"ulysses_dot_product_attention: mesh has no axis {seq_axis!r} (axes: {tuple(mesh.shape)})")
    baxes, haxes = _axes(batch_axes), _axes(head_axis)
    for a in baxes + haxes:
        if a not in mesh.shape:
            raise ValueError(f"ulysses_dot_product_attention: mesh has no axis {a!r} (axes: {tuple(mesh.shape)})")
    if seq_axis in baxes + haxes or set(baxes) & set(haxes):
        raise ValueError("ulysses_dot_product_attention: seq_axis, batch_axes and head_axis must be different axes")
    p, th, tb = mesh.shape[seq_axis], _axis_size(mesh, haxes), _axis_size(mesh, baxes)
    packed = query.ndim == 3
    n_q, n_kv = query.shape[-2], key.shape[-2]
    if n_q % th or n_kv % th:
        raise ValueError(f"ulysses_dot_product_attention: query heads N={n_q} and KV heads K={n_kv} must be "
                         f"divisible by the {th} devices of head_axis {haxes} (GQA groups stay on one device)")
    ulysses_kv_replication(n_q // th, n_kv // th, p)  # raises with the rule
    seq = (query.shape[0], key.shape[0]) if packed else (query.shape[1], key.shape[1])
    unit = 2 * p if layout == "zigzag" else p
    if seq[0] % unit or seq[1] % unit:
        raise ValueError(f"ulysses_dot_product_attention: sequence lengths {seq} must be divisible by "
                         f"{unit} ({'2 * ' if layout == 'zigzag' else ''}the {p} devices of seq_axis {seq_axis!r})")
    if packed and baxes:
        raise ValueError("ulysses_dot_product_attention: batch_axes cannot shard packed (varlen, 3-D) inputs")
    if not packed and query.shape[0] % tb:
        raise ValueError(f"ulysses_dot_product_attention: batch {query.shape[0]} not divisible by the {tb} devices "
                         f"of batch_axes {baxes}")

    b, h = _spec_entry(baxes), _spec_entry(haxes)
    qspec, lspec = (P(seq_axis, h, None), P(h, seq_axis)) if packed else (P(b, seq_axis, h, None), P(b, h, seq_axis))
    arrays, specs = {}, {}
    for name, x in kwargs.items():
        if x is None or not hasattr(x, "shape"):
            continue
        if name in _DENSE_VECTORS:
            specs[name] = P() if packed else P(b)
        elif name in _REPLICATED:
            specs[name] = P()
        else:
            raise ValueError(f"ulysses_dot_product_attention: do not know how to shard array argument {name!r}")
        arrays[name] = x
    statics = {k: v for k, v in kwargs.items() if k not in arrays}
    if sinks is not None:
        arrays["sinks"], specs["sinks"] = jnp.asarray(sinks, jnp.float32), P(h)
    pair = isinstance(segment_ids, (tuple, list))
    if segment_ids is not None:
        seg = tuple(segment_ids) if pair else (segment_ids,)
        for i, s in enumerate(seg):
            arrays[f"segment_ids_{i}"], specs[f"segment_ids_{i}"] = jnp.asarray(s), P(b, seq_axis)
    names = list(arrays)

    def body(q, k, v, *rest):
        extra = dict(zip(names, rest))
        seg_local = [extra.pop(n) for n in list(extra) if n.startswith("segment_ids_")]
        seg_arg = None if not seg_local else (tuple(seg_local) if pair else seg_local[0])
        return ulysses_attention_shard(q, k, v, axis_name=seq_axis, axis_size=p, segment_ids=seg_arg,
                                       layout=layout, return_lse=return_lse, **extra, **statics)

    out_specs = (qspec, lspec) if return_lse else qspec
    # check_vma=True where jax has the varying-axes type (as in sharding.py and ring.py): the fused op types its
    # results and cotangents like its inputs; the all-to-alls' results vary over seq_axis.
    f = jax.shard_map(body, mesh=mesh, in_specs=(qspec, qspec, qspec, *[specs[n] for n in names]),
                      out_specs=out_specs, check_vma=vma_typing_supported())
    return f(query, key, value, *[arrays[n] for n in names])
