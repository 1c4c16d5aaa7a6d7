"""All-to-all (Ulysses) context parallelism (sinkattn.jax.ulysses) == the fused op on one device: values and
gradients (dq, dk, dv, d_sinks, through out and lse) on meshes of 2, 4 and 8 devices, causal, sliding and two-sided
windows, bottom-right alignment with padding lengths, segment ids, packed varlen (cu_seqlens), GQA with fewer KV
heads than devices (replicated KV heads, dk/dv summed back), the zig-zag layout, and composed with batch and head
sharding. Random inputs, sinks log(S) and 20, every fused call's outputs pre-filled with NaN, SPEC.md section 5
error measure and fp32 tolerances; bf16 on a GPU by SPEC.md section 5's low-precision rule against float64.
The compiled HLO moves q/k/v/out by all-to-all and gathers nothing but the int32 segment ids."""

import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import sinkattn.jax as sj
from sinkattn.jax import ring
from sinkattn.jax.ulysses import ulysses_dot_product_attention, ulysses_kv_replication
from conftest import make_mesh
from cp_util import DT, check, check_float64, inputs, loss, visibility


def _ulysses(mesh, q, k, v, sinks, g, g_lse, batch_axes=None, head_axis=None, layout="contiguous", seg=None,
             **kw):
    """Forward + backward of the all-to-all attention on sequence-sharded arrays: out, lse, grads, compiled HLO."""
    p = mesh.shape["cp"]
    zz = layout == "zigzag"
    perm = (lambda x, ax=1: ring.zigzag_permute(x, p, ax)) if zz else (lambda x, ax=1: x)
    unperm = (lambda x, ax=1: ring.zigzag_unpermute(x, p, ax)) if zz else (lambda x, ax=1: x)
    spec = P(batch_axes, "cp", head_axis, None)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    qs, ks, vs = (put(perm(jnp.asarray(x)), spec) for x in (q, k, v))
    gs, gls = put(perm(jnp.asarray(g)), spec), put(perm(jnp.asarray(g_lse), 2), P(batch_axes, head_axis, "cp"))
    ss = put(jnp.asarray(sinks), P(head_axis))
    segs = None if seg is None else put(perm(jnp.asarray(seg)), P(batch_axes, "cp"))

    def f(q, k, v, s, g, g_lse, seg):
        out, lse = ulysses_dot_product_attention(q, k, v, mesh=mesh, seq_axis="cp", batch_axes=batch_axes,
                                                 head_axis=head_axis, sinks=s, layout=layout, segment_ids=seg,
                                                 return_lse=True, **kw)
        return loss(out, lse, g, g_lse), (out, lse)

    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))
    with sj.poison_outputs_for_testing():
        (_, (out, lse)), (dq, dk, dv, ds) = step(qs, ks, vs, ss, gs, gls, segs)
    hlo = step.lower(qs, ks, vs, ss, gs, gls, segs).compile().as_text()
    return unperm(out), unperm(lse, 2), (unperm(dq), unperm(dk), unperm(dv), ds), hlo


def _no_sequence_gather(hlo):
    """q/k/v/out travel by all-to-all; an all-gather may only carry int32 (segment ids)."""
    assert "all-to-all" in hlo
    for line in hlo.splitlines():
        if re.search(r"\sall-gather(-start)?\(", line):
            assert re.search(r"=\s*\(?s32\[", line), f"all-gather of non-integer data: {line.strip()[:160]}"


CASES = [
    # (softmax_type, mask kwargs, cp size p, KV heads K); N = 8 query heads, T = 32
    ("learnable", dict(is_causal=True), 2, 2),
    ("learnable", dict(is_causal=True), 4, 2),  # K < p: each KV head replicated twice
    ("learnable", dict(is_causal=True, local_window_size=(13, 0)), 8, 2),  # replicated 4 times
    ("learnable", dict(is_causal=True, local_window_size=(127, 0)), 8, 8),
    ("off_by_one", dict(), 4, 4),
    ("vanilla", dict(is_causal=True), 8, 1),  # MQA over 8 devices
    ("learnable", dict(local_window_size=(3, 2)), 4, 2),  # two-sided window
    ("learnable", dict(is_causal=True, mask_alignment="bottom_right"), 2, 8),  # K > p: no replication
]


@pytest.mark.parametrize("softmax_type,mask,p,K", CASES)
def test_ulysses_matches_single_device(softmax_type, mask, p, K):
    B, T, N, H = 2, 32, 8, 32
    mesh = make_mesh((p,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=zlib.crc32(repr((softmax_type, mask, p, K)).encode()))
    kw = dict(softmax_type=softmax_type, **mask)
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, **kw)
    check(q, k, v, sinks, g, g_lse, res, **kw)
    _no_sequence_gather(res[3])


def test_ulysses_zigzag_layout():
    """Inputs in the ring's zig-zag order (one model, both modes): the same results as the contiguous layout."""
    B, T, N, K, H = 2, 32, 8, 2, 32
    mesh = make_mesh((4,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=21)
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(5, 0))
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, layout="zigzag", **kw)
    check(q, k, v, sinks, g, g_lse, res, **kw)


def test_ulysses_segment_ids():
    """Packed documents (segment ids sharded like the sequence): masks apply within each run, on every device."""
    B, T, N, K, H = 2, 32, 8, 2, 32
    mesh = make_mesh((4,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=22)
    seg = np.repeat(np.arange(4), 8)[None].repeat(B, 0)
    seg[0, 5:19] = 7  # runs that cross device boundaries (8 rows per device)
    seg[1, 20:] = 9
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(6, 0))
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, seg=jnp.asarray(seg, jnp.int32), **kw)
    check(q, k, v, sinks, g, g_lse, res, segment_ids=jnp.asarray(seg, jnp.int32),
          vis=visibility(B, T, T, True, (6, 0), segment_ids=seg), **kw)
    _no_sequence_gather(res[3])
    assert "all-gather" in res[3]  # the ids themselves are gathered (int32, [B, T])


def test_ulysses_padding_bottom_right():
    """Padded keys (key_value_seq_lengths, replicated over the sequence axis) with the bottom-right causal mask."""
    B, T, N, K, H = 2, 32, 8, 2, 32
    mesh = make_mesh((2,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=23)
    lens = jnp.array([32, 19], jnp.int32)
    kw = dict(softmax_type="learnable", is_causal=True, mask_alignment="bottom_right", key_value_seq_lengths=lens)
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, **kw)
    check(q, k, v, sinks, g, g_lse, res, vis=visibility(B, T, T, True, None, "bottom_right",
                                                        key_value_seq_lengths=np.asarray(lens)), **kw)


def test_ulysses_packed_varlen():
    """Packed varlen [total, N, H] with cu_seqlens (replicated), the rows sharded over 4 devices."""
    total, N, K, H = 32, 8, 2, 32
    mesh = make_mesh((4,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(1, total, N, K, H, seed=24)
    cu = jnp.array([0, 5, 17, 17, 30, 32], jnp.int32)  # incl. an empty sequence; runs cross device boundaries
    kw = dict(softmax_type="learnable", is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=13,
              max_seqlen_kv=13)
    row = P("cp", None, None)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    args = [put(x[0], row) for x in (q, k, v)] + [jnp.asarray(sinks), put(g[0], row),
                                                  put(jnp.asarray(g_lse)[0], P(None, "cp"))]

    def f(attn, q, k, v, s, g, g_lse):
        out, lse = attn(q, k, v, sinks=s, return_lse=True, **kw)
        return loss(out, lse, g, g_lse), (out, lse)

    ul = lambda *a, **k: ulysses_dot_product_attention(*a, mesh=mesh, seq_axis="cp", **k)
    step = jax.jit(jax.value_and_grad(lambda *a: f(ul, *a), argnums=(0, 1, 2, 3), has_aux=True))
    with sj.poison_outputs_for_testing():
        (_, (out, lse)), grads = step(*args)
    # the same packed call on one device is equivalent to one batch row of segment ids: that is what check() runs
    seg = np.searchsorted(np.asarray(cu)[1:], np.arange(total), side="right")[None]
    res = (out[None], lse[None], tuple(x[None] for x in grads[:3]) + (grads[3],))
    dense = dict(softmax_type="learnable", is_causal=True)
    check(q, k, v, sinks, g, g_lse, res, segment_ids=jnp.asarray(seg, jnp.int32),
          vis=visibility(1, total, total, True, None, segment_ids=seg), **dense)
    _no_sequence_gather(step.lower(*args).compile().as_text())


def test_ulysses_with_batch_and_head_sharding():
    """data x cp x heads = 2 x 2 x 2: 8 query heads -> 4 per head shard -> 2 per device after the all-to-all;
    KV heads 2 -> 1 per head shard, replicated twice. d_sinks summed over data (and cp), sharded by heads."""
    B, T, N, K, H = 4, 32, 8, 2, 32
    mesh = make_mesh((2, 2, 2), ("data", "cp", "model"))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=25)
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(9, 0))
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, batch_axes="data", head_axis="model", **kw)
    check(q, k, v, sinks, g, g_lse, res, **kw)
    _no_sequence_gather(res[3])
    assert "all-reduce" in res[3]  # d_sinks over the replicated axes


def test_ulysses_matches_float64_reference():
    """One case against the pure-JAX float64 reference of SPEC.md directly (8 devices, MQA, sliding)."""
    B, T, N, K, H = 1, 32, 8, 1, 32
    mesh = make_mesh((8,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=26)
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(7, 0))
    res = _ulysses(mesh, q, k, v, sinks, g, g_lse, **kw)
    check_float64(q, k, v, sinks, g, g_lse, res, **kw)


def test_kv_replication_rule():
    assert ulysses_kv_replication(64, 8, 8) == 1  # GPT-OSS-20B on 2, 4, 8 devices: nothing replicated
    assert ulysses_kv_replication(64, 8, 16) == 2
    assert ulysses_kv_replication(8, 2, 8) == 4
    assert ulysses_kv_replication(12, 4, 6) == 3  # lcm(4, 6) = 12 replicated heads, 2 per device
    with pytest.raises(ValueError, match="divisible by the 3 devices"):
        ulysses_kv_replication(8, 2, 3)


def test_ulysses_errors():
    mesh = make_mesh((4,), ("cp",))
    q = jnp.ones((1, 16, 6, 32), DT)  # 6 query heads cannot be split over 4 devices
    kv = jnp.ones((1, 16, 2, 32), DT)
    with pytest.raises(ValueError, match="N=6 must be divisible by the 4 devices"):
        ulysses_dot_product_attention(q, kv, kv, mesh=mesh, seq_axis="cp")
    q, kv12 = jnp.ones((1, 12, 8, 32), DT), jnp.ones((1, 12, 2, 32), DT)
    with pytest.raises(ValueError, match="divisible by 8"):  # zig-zag: 2p chunks
        ulysses_dot_product_attention(q, kv12, kv12, mesh=mesh, seq_axis="cp", layout="zigzag")
    q = jnp.ones((1, 16, 8, 32), DT)
    with pytest.raises(NotImplementedError, match="bias"):
        ulysses_dot_product_attention(q, kv, kv, mesh=mesh, seq_axis="cp", bias=jnp.ones((1, 8, 16, 16)))
    with pytest.raises(NotImplementedError, match="dropout"):
        ulysses_dot_product_attention(q, kv, kv, mesh=mesh, seq_axis="cp", dropout_rate=0.1)
    with pytest.raises(ValueError, match="no axis"):
        ulysses_dot_product_attention(q, kv, kv, mesh=mesh, seq_axis="sp")
