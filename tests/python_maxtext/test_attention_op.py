"""MaxText's AttentionOp with attention_kernel='sinkattn' against attention_kernel='dot_product', op by op, and
what the route refuses.

The op-level comparison covers what the tiny model does not: heads sharded over MaxText's tensor axis together
with the context axis, MaxText's 'full' (unmasked) layers, layers without sinks (vanilla softmax), and the
contiguous (not load-balanced) sequence order, for both context-parallel modes.
"""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import sinkattn.jax.maxtext as sinkattn_maxtext

from gpt_oss_tiny import HEAD_DIM, HEADS, KV_HEADS, SEQ, WINDOW, Model, make_batch, make_config


@pytest.fixture(scope="module", autouse=True)
def installed():
    sinkattn_maxtext.install()
    yield
    sinkattn_maxtext.install(context_parallel="auto")


def _op(config, mesh, kernel, attention_type="global", **kw):
    from maxtext.common.common_types import AttentionType
    from maxtext.layers.attention_op import AttentionOp

    return AttentionOp(config=config, mesh=mesh, attention_kernel=kernel, max_target_length=SEQ,
                       num_query_heads=HEADS, num_kv_heads=KV_HEADS, attention_type=AttentionType(attention_type),
                       sliding_window_size=WINDOW, dtype=jnp.float32, **kw)


def _inputs(seed=0, batch=2):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, SEQ, HEADS, HEAD_DIM)).astype(np.float32) * 0.5
    k = rng.standard_normal((batch, SEQ, KV_HEADS, HEAD_DIM)).astype(np.float32) * 0.5
    v = rng.standard_normal((batch, SEQ, KV_HEADS, HEAD_DIM)).astype(np.float32)
    sinks = np.array([0.5, -1.0, np.log(SEQ), 20.0, 2.0, -3.0, 1.5, 0.25], np.float32)
    d_out = rng.standard_normal((batch, SEQ, HEADS, HEAD_DIM)).astype(np.float32)
    return q, k, v, sinks, d_out


def _out_and_grads(config, mesh, kernel, attention_type, with_sinks, segment_ids, positions, rows):
    """out and (dq, dk, dv, d_sinks) of sum(out * d_out) with d_out zero outside ``rows`` [b, t]."""
    op = _op(config, mesh, kernel, attention_type)
    q, k, v, sinks, d_out = _inputs()
    d_out = d_out * rows[:, :, None, None]

    def loss(q, k, v, sinks):
        out = op(q, k, v, segment_ids, positions, "train", sinks=sinks if with_sinks else None)
        return jnp.sum(out * d_out), out

    model = Model.__new__(Model)  # only for its mesh + logical axis rules context
    model.config, model.mesh = config, mesh
    with model.context():
        (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, sinks)
    return np.asarray(out), [np.asarray(g) for g in grads]


@pytest.fixture(scope="module")
def tensor_context_config():
    """8 devices: heads over tensor (2), sequence over context (4), natural (contiguous) order."""
    return make_config("sinkattn", num_devices=8, ici_fsdp_parallelism=1, ici_tensor_parallelism=2,
                       ici_context_parallelism=4, context_parallel_load_balance=False, packing=False)


@pytest.mark.parametrize("mode,attention_type,with_sinks,packed", [
    ("all_to_all", "local_sliding", True, True),
    ("all_to_all", "full", True, True),
    ("all_to_all", "global", False, True),
    ("ring", "local_sliding", True, False),
    ("ring", "global", True, False),
    ("ring", "global", False, False),
])
def test_op_matches_dot_product_tensor_and_context_parallel(tensor_context_config, mode, attention_type, with_sinks,
                                                             packed):
    from maxtext.utils import maxtext_utils

    cfg = tensor_context_config
    mesh = maxtext_utils.get_mesh_from_config(cfg, devices=jax.devices()[:8])
    assert mesh.shape["tensor"] == 2 and mesh.shape["context"] == 4
    batch = make_batch(packed)
    seg, pos = batch["inputs_segmentation"], batch["inputs_position"]
    if not packed:  # MaxText's unpacked rows: ids 1 then padding 0; positions count the whole row
        pos = np.broadcast_to(np.arange(SEQ, dtype=np.int32), seg.shape).copy()
    # The ring attends unpacked rows without their ids: padding rows' own outputs differ (sinkattn.jax.maxtext),
    # and, as in training, where no loss term reads them their cotangent is 0. The all-to-all is exact everywhere.
    rows = (seg != 0) if mode == "ring" else np.ones(seg.shape, bool)
    sinkattn_maxtext.install(context_parallel=mode)
    out, grads = _out_and_grads(cfg, mesh, "sinkattn", attention_type, with_sinks, seg, pos, rows)
    ref_out, ref_grads = _out_and_grads(cfg, mesh, "dot_product", attention_type, with_sinks, seg, pos, rows)
    rows = rows[:, :, None, None]
    np.testing.assert_allclose(np.where(rows, out, 0), np.where(rows, ref_out, 0), rtol=1e-5, atol=1e-5)
    names = ("dq", "dk", "dv", "d_sinks")
    for name, g, r in zip(names, grads, ref_grads):
        if name == "d_sinks" and not with_sinks:
            continue
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * np.abs(r).max(), err_msg=name)
    if with_sinks:
        assert np.abs(grads[3]).max() > 1e-3


# ------------------------------------------------------------------------------------------------------------------
# what the route refuses
# ------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_device():
    from maxtext.utils import maxtext_utils

    cfg = make_config("sinkattn")
    return cfg, maxtext_utils.get_mesh_from_config(cfg, devices=jax.devices()[:1])


def _trace(op, config, mesh, model_mode="train", segment_ids=None, **call):
    q, k, v, sinks, _ = _inputs()
    model = Model.__new__(Model)
    model.config, model.mesh = config, mesh
    with model.context():
        return jax.eval_shape(lambda q, k, v, s: op.apply_attention(
            query=q, key=k, value=v, decoder_segment_ids=segment_ids, segment_positions=None, lengths=None,
            model_mode=model_mode, sinks=s, qk_product_einsum=jnp.einsum, wv_product_einsum=jnp.einsum, **call),
            q, k, v, sinks)


def test_sinkattn_path_traces(one_device):
    cfg, mesh = one_device
    out, _, _ = _trace(_op(cfg, mesh, "sinkattn", "local_sliding"), cfg, mesh)
    assert out.shape == (2, SEQ, HEADS, HEAD_DIM) and out.dtype == jnp.float32


def test_prefill_matches_dot_product(one_device):
    """model_mode='prefill' (a prompt's forward) through sinkattn equals MaxText's dot_product prefill."""
    cfg, mesh = one_device
    seg = make_batch(True)["inputs_segmentation"]
    q, k, v, sinks, _ = _inputs()
    model = Model.__new__(Model)
    model.config, model.mesh = cfg, mesh
    outs = {}
    for kernel in ("sinkattn", "dot_product"):
        op = _op(cfg, mesh, kernel, "local_sliding")
        with model.context():
            out, _, local_sum = jax.jit(lambda q, k, v, s, op=op: op.apply_attention(
                query=q, key=k, value=v, decoder_segment_ids=seg, segment_positions=None, lengths=None,
                model_mode="prefill", sinks=s, qk_product_einsum=jnp.einsum, wv_product_einsum=jnp.einsum))(
                    q, k, v, sinks)
        outs[kernel] = np.asarray(out if local_sum is None else out / local_sum)
    np.testing.assert_allclose(outs["sinkattn"], outs["dot_product"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_kw,call_kw,match", [
    (dict(attn_logits_soft_cap=30.0), {}, "soft-capping"),
    (dict(attention_type="chunk", chunk_attn_window_size=8), {}, "attention_type='chunk'"),
    ({}, dict(model_mode="autoregressive"), "autoregressive"),
    ({}, dict(record_max_logits=True), "record_max_logits"),
    ({}, dict(bidirectional_mask=np.ones((2, SEQ), bool)), "bidirectional"),
    ({}, dict(use_ragged_attention=True), "ragged"),
])
def test_unsupported_features_raise(one_device, op_kw, call_kw, match):
    cfg, mesh = one_device
    op_kw = dict(op_kw)
    attention_type = op_kw.pop("attention_type", "global")
    op = _op(cfg, mesh, "sinkattn", attention_type, **op_kw)
    with pytest.raises(NotImplementedError, match=match):
        _trace(op, cfg, mesh, **call_kw)


@pytest.mark.parametrize("packing,attention_type,match", [(True, "global", "packing"), (False, "full", "full")])
def test_ring_refuses_what_it_cannot_mask(packing, attention_type, match):
    from maxtext.utils import maxtext_utils

    cfg = make_config("sinkattn", num_devices=8, ici_fsdp_parallelism=2, ici_context_parallelism=4,
                      packing=packing, context_parallel_load_balance=False)
    mesh = maxtext_utils.get_mesh_from_config(cfg, devices=jax.devices()[:8])
    sinkattn_maxtext.install(context_parallel="ring")
    seg = make_batch(packing)["inputs_segmentation"]
    with pytest.raises(NotImplementedError, match=match):
        _trace(_op(cfg, mesh, "sinkattn", attention_type), cfg, mesh, segment_ids=seg)


def test_install_refuses_an_untested_maxtext(monkeypatch):
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.2.4" if name == "maxtext" else real(name))
    with pytest.raises(RuntimeError, match=r"MaxText 0\.2\.4 is installed.*tested with MaxText 0\.2\.5"):
        sinkattn_maxtext.install()


def test_install_arguments_and_uninstall(one_device):
    cfg, mesh = one_device
    with pytest.raises(ValueError, match="context_parallel"):
        sinkattn_maxtext.install(context_parallel="usp")
    assert sinkattn_maxtext.installed()
    sinkattn_maxtext.uninstall()
    try:
        assert not sinkattn_maxtext.installed()
        with pytest.raises(ValueError, match="Unexpected attention kernel"):
            _trace(_op(cfg, mesh, "sinkattn"), cfg, mesh)
    finally:
        sinkattn_maxtext.install()
    _trace(_op(cfg, mesh, "sinkattn"), cfg, mesh)
