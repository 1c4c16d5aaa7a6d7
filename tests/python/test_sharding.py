"""Sharded sink attention (sinkattn.jax.sharding) under jax.jit with a Mesh and NamedSharding: batch-sharded (data
parallel), head-sharded (tensor parallel) and both, == the unsharded fused op (values and gradients dq, dk, dv,
d_sinks, d_bias, through out and lse), and the compiled HLO gathers nothing (no all-gather; d_sinks is summed over
the batch axes by an all-reduce). Random inputs, sinks log(S) and 20, outputs pre-filled with NaN
(poison_outputs_for_testing), SPEC.md section 5 error measure, fp32 tolerances. 8 virtual CPU devices (conftest.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import sinkattn.jax as sj
from sinkattn.jax.sharding import sharded_dot_product_attention
from conftest import make_mesh, rel_err

TOL = {"out": 1e-5, "lse": 1e-5, "grad": 1e-4}  # SPEC.md section 5, fp32




def _case(B, T, S, N, K, H, bias_shape=None, seed=0):
    rng = np.random.default_rng(seed)
    x = dict(q=rng.standard_normal((B, T, N, H)), k=rng.standard_normal((B, S, K, H)),
             v=rng.standard_normal((B, S, K, H)),
             sinks=np.array([math.log(S), 20.0] + list(rng.uniform(-1, 3, N - 2)))[:N])
    x["bias"] = None if bias_shape is None else rng.standard_normal(bias_shape)
    x = {k: None if v is None else v.astype(np.float32) for k, v in x.items()}
    g = rng.standard_normal((B, T, N, H)).astype(np.float32)
    g_lse = rng.standard_normal((B, N, T)).astype(np.float32)
    return x, g, g_lse


def _loss(out, lse, g, g_lse):
    return jnp.sum(out * g) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * g_lse)


def _run(mesh, batch_axes, head_axis, x, g, g_lse, **kw):
    """(unsharded results, sharded results, compiled HLO text of the sharded forward + backward)."""
    b = batch_axes if not isinstance(batch_axes, list) else tuple(batch_axes)
    h = head_axis
    has_bias = x["bias"] is not None

    def loss(attn, q, k, v, s, bias, g, g_lse):
        out, lse = attn(q, k, v, sinks=s, bias=bias, return_lse=True, **kw)
        return _loss(out, lse, g, g_lse), (out, lse)

    argnums = (0, 1, 2, 3, 4) if has_bias else (0, 1, 2, 3)
    plain = jax.jit(jax.value_and_grad(partial_loss(loss, sj.dot_product_attention), argnums=argnums, has_aux=True))
    sharded_attn = lambda *a, **k: sharded_dot_product_attention(*a, mesh=mesh, batch_axes=b, head_axis=h, **k)
    shard = jax.jit(jax.value_and_grad(partial_loss(loss, sharded_attn), argnums=argnums, has_aux=True))

    put = lambda a, *spec: jax.device_put(a, NamedSharding(mesh, P(*spec)))
    bias = x["bias"]
    if has_bias:
        bias = put(bias, b if bias.shape[0] > 1 else None, h if bias.shape[1] > 1 else None, None, None)
    args = (put(x["q"], b, None, h, None), put(x["k"], b, None, h, None), put(x["v"], b, None, h, None),
            put(x["sinks"], h), bias, put(g, b, None, h, None), put(g_lse, b, h, None))
    with sj.poison_outputs_for_testing():
        r_plain = plain(x["q"], x["k"], x["v"], x["sinks"], x["bias"], g, g_lse)
        r_shard = shard(*args)
    hlo = shard.lower(*args).compile().as_text()
    return r_plain, r_shard, hlo


def partial_loss(loss, attn):
    return lambda *a: loss(attn, *a)


def _check(r_plain, r_shard, softmax_type):
    (_, (o1, l1)), g1 = r_plain
    (_, (o2, l2)), g2 = r_shard
    errs = {"out": rel_err(o2, o1), "lse": rel_err(l2, l1)}
    for name, a, c in zip(("dq", "dk", "dv", "d_sinks", "d_bias"), g2, g1):
        if name == "d_sinks" and softmax_type != "learnable":
            assert np.all(np.asarray(a) == 0.0)
            continue
        errs[name] = rel_err(a, c)
    for name, e in errs.items():
        tol = TOL.get(name, TOL["grad"])
        assert e <= tol, f"{name}: err {e:.3e} > {tol:.0e} ({errs})"


def _no_gather(hlo):
    assert "all-gather" not in hlo, "XLA gathers an input of the sharded attention"


def test_data_and_tensor_parallel_gqa_window_bias_lse():
    mesh = make_mesh((4, 2), ("data", "model"))
    x, g, g_lse = _case(B=4, T=16, S=24, N=4, K=2, H=32, bias_shape=(1, 4, 16, 24), seed=1)
    kv_len = jnp.array([24, 5, 0, 17], jnp.int32)  # includes a batch element with no key at all
    r_plain, r_shard, hlo = _run(mesh, "data", "model", x, g, g_lse, softmax_type="learnable", is_causal=True,
                                 local_window_size=(3, 0), key_value_seq_lengths=kv_len)
    _check(r_plain, r_shard, "learnable")
    _no_gather(hlo)
    assert "all-reduce" in hlo  # d_sinks (and the batch-broadcast d_bias) summed over the data axis


@pytest.mark.parametrize("batch_axis,head_axis", [("data", None), (None, "model")])
def test_two_devices(batch_axis, head_axis):
    """Meshes of 2 devices, so that a 2-GPU machine runs sharding over real devices (NCCL) too: data parallel
    (d_sinks, d_bias all-reduced) or tensor parallel (sinks and bias sharded with the heads)."""
    mesh = make_mesh((2,), (batch_axis or head_axis,))
    x, g, g_lse = _case(B=2, T=16, S=20, N=4, K=2, H=32, bias_shape=(2, 4, 16, 20), seed=9)
    r_plain, r_shard, hlo = _run(mesh, batch_axis, head_axis, x, g, g_lse, softmax_type="learnable", is_causal=True,
                                 local_window_size=(7, 0))
    _check(r_plain, r_shard, "learnable")
    _no_gather(hlo)


def test_data_parallel_only_segment_ids_off_by_one():
    mesh = make_mesh((8,), ("data",))
    x, g, g_lse = _case(B=8, T=16, S=16, N=2, K=1, H=32, seed=2)  # (the op refuses bias with segment_ids)
    seg = np.repeat(np.arange(4), 4)[None].repeat(8, 0)
    seg[::2, 6:] += 1  # different packings in different batch elements
    r_plain, r_shard, hlo = _run(mesh, "data", None, x, g, g_lse, softmax_type="off_by_one",
                                 segment_ids=jnp.asarray(seg, jnp.int32))
    _check(r_plain, r_shard, "off_by_one")
    _no_gather(hlo)


def test_tensor_parallel_only_causal_query_lengths():
    mesh = make_mesh((4,), ("model",))
    x, g, g_lse = _case(B=2, T=16, S=16, N=8, K=4, H=32, bias_shape=(2, 8, 16, 16), seed=3)
    r_plain, r_shard, hlo = _run(mesh, None, "model", x, g, g_lse, softmax_type="learnable", is_causal=True,
                                 query_seq_lengths=jnp.array([16, 9], jnp.int32))
    # padding rows (i >= query_seq_lengths) have unspecified LSE (SPEC.md section 2): compare valid rows only
    (_, (o1, l1)), g1 = r_plain
    (_, (o2, l2)), g2 = r_shard
    l1, l2 = np.asarray(l1).copy(), np.asarray(l2).copy()
    l1[1, :, 9:] = l2[1, :, 9:] = 0.0
    _check(((0, (o1, l1)), g1), ((0, (o2, l2)), g2), "learnable")
    _no_gather(hlo)


def test_batch_over_two_mesh_axes_vanilla():
    mesh = make_mesh((2, 4), ("replica", "data"))
    x, g, g_lse = _case(B=8, T=8, S=8, N=2, K=2, H=32, seed=4)
    r_plain, r_shard, hlo = _run(mesh, ["replica", "data"], None, x, g, g_lse, softmax_type="vanilla",
                                 is_causal=True)
    _check(r_plain, r_shard, "vanilla")
    _no_gather(hlo)


def test_dropout_each_shard_folds_its_index():
    """Sharded dropout == the op on each shard with fold_in(dropout_rng, linear shard index)."""
    mesh = make_mesh((2, 2), ("data", "model"))
    x, _, _ = _case(B=4, T=8, S=8, N=4, K=2, H=32, seed=5)
    rng = jax.random.PRNGKey(42)
    kw = dict(softmax_type="learnable", dropout_rate=0.3, dropout_rng=rng)
    out = jax.jit(lambda q, k, v, s: sharded_dot_product_attention(q, k, v, mesh=mesh, batch_axes="data",
                                                                   head_axis="model", sinks=s, **kw))(
        x["q"], x["k"], x["v"], x["sinks"])
    out = np.asarray(out)
    assert np.isfinite(out).all()
    for bi in range(2):
        for hi in range(2):
            sl_b, sl_q, sl_k = slice(2 * bi, 2 * bi + 2), slice(2 * hi, 2 * hi + 2), slice(hi, hi + 1)
            want = sj.dot_product_attention(x["q"][sl_b, :, sl_q], x["k"][sl_b, :, sl_k], x["v"][sl_b, :, sl_k],
                                            sinks=x["sinks"][sl_q], softmax_type="learnable", dropout_rate=0.3,
                                            dropout_rng=jax.random.fold_in(rng, bi * 2 + hi))
            np.testing.assert_array_equal(out[sl_b, :, sl_q], np.asarray(want))
    no_drop = sj.dot_product_attention(x["q"], x["k"], x["v"], sinks=x["sinks"], softmax_type="learnable")
    assert not np.allclose(out, np.asarray(no_drop))


def test_errors():
    mesh = make_mesh((4,), ("model",))
    q = jnp.ones((2, 8, 4, 8), jnp.float32)
    kv = jnp.ones((2, 8, 2, 8), jnp.float32)  # K = 2 heads cannot be split over 4 devices
    with pytest.raises(ValueError, match="KV heads"):
        sharded_dot_product_attention(q, kv, kv, mesh=mesh, head_axis="model")
    with pytest.raises(ValueError, match="batch"):
        sharded_dot_product_attention(q, q, q, mesh=mesh, batch_axes="model")
    with pytest.raises(ValueError, match="no axis"):
        sharded_dot_product_attention(q, q, q, mesh=mesh, batch_axes="data")
    with pytest.raises(ValueError, match="do not know"):
        sharded_dot_product_attention(q, q, q, mesh=mesh, head_axis="model", mystery=jnp.ones(3))


def test_user_shard_map_checked_dropout_gradients():
    """The op inside a user's shard_map(check_vma=True): dropout (rng varying per shard), replicated sinks and a
    replicated cu_seqlens (varlen); values and gradients == the op on each shard. Under check_vma the gradient of
    the replicated (invariant) sinks is already summed over the shards inside the body: the transpose of the op's
    cast of sinks to 'varying' is that psum (SPEC.md section 3: d_sinks summed over the batch)."""
    from sinkattn.jax.attention import vma_typing_supported

    assert vma_typing_supported()  # so sharding.py / ring.py run their shard_maps checked (check_vma=True) here
    mesh = make_mesh((4,), ("data",))
    p, T, N, K, H = 4, 12, 4, 2, 32
    x, _, _ = _case(B=p, T=T, S=T, N=N, K=K, H=H, seed=6)
    q, k, v = (x[n].reshape(p * T, x[n].shape[2], H) for n in ("q", "k", "v"))  # packed, T rows per shard
    g = np.random.default_rng(7).standard_normal((p * T, N, H)).astype(np.float32)
    cu = jnp.array([0, 5, 5, 12], jnp.int32)  # per shard: sequences of 5, 0 and 7 rows
    rng = jax.random.PRNGKey(3)
    kw = dict(softmax_type="learnable", is_causal=True, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7,
              max_seqlen_kv=7, dropout_rate=0.25)

    def local_loss(q, k, v, s, g, key):
        out = sj.dot_product_attention(q, k, v, sinks=s, dropout_rng=key, **kw)
        return jnp.sum(out * g)

    def body(q, k, v, s, g, key):
        key = jax.random.fold_in(key, jax.lax.axis_index("data"))
        loss, grads = jax.value_and_grad(local_loss, argnums=(0, 1, 2, 3))(q, k, v, s, g, key)
        return loss[None], grads[0], grads[1], grads[2], grads[3]  # grads[3]: invariant, already the psum

    row = P("data", None, None)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(row, row, row, P(), row, P()),
                              out_specs=(P("data"), row, row, row, P()), check_vma=True))
    with sj.poison_outputs_for_testing():
        loss, dq, dk, dv, d_sinks = f(q, k, v, x["sinks"], g, rng)
        want_ds = 0.0
        for r in range(p):
            sl = slice(r * T, (r + 1) * T)
            l_r, (dq_r, dk_r, dv_r, ds_r) = jax.value_and_grad(local_loss, argnums=(0, 1, 2, 3))(
                q[sl], k[sl], v[sl], x["sinks"], g[sl], jax.random.fold_in(rng, r))
            assert rel_err(loss[r], l_r) <= TOL["out"]
            for name, a, c in (("dq", dq[sl], dq_r), ("dk", dk[sl], dk_r), ("dv", dv[sl], dv_r)):
                assert rel_err(a, c) <= TOL["grad"], name
            want_ds = want_ds + np.asarray(ds_r, np.float64)
    assert np.abs(want_ds).max() > 0.0
    assert rel_err(d_sinks, want_ds) <= TOL["grad"]
