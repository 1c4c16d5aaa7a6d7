"""SPEC.md rules on sink values, key-less rows and masks, through sinkattn.jax.dot_product_attention.

- ``mask`` (boolean, as jax.nn.dot_product_attention) becomes a ``-inf`` bias, never a large finite value
  (SPEC.md section 3, "Logit range"): a masked key is exactly absent, and a row masked entirely sees no key.
- A ``-inf`` sink makes its head vanilla; each key-less row of it adds ``d_lse_i`` to ``d_sinks[h]``
  (SPEC.md section 3, "Sink values"); ``-1e30`` gives the same.
Float32, against the float64 pure-JAX reference; outputs poisoned with NaN before every call.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sinkattn.jax as sj
from sinkattn.jax import reference as ref
from conftest import enable_x64, rel_err


def _inputs(seed, b=2, t=6, s=9, n=4, kh=2, d=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, t, n, d)).astype(np.float32)
    k = rng.standard_normal((b, s, kh, d)).astype(np.float32)
    v = rng.standard_normal((b, s, kh, d)).astype(np.float32)
    sinks = np.asarray([np.log(s), 20.0, -0.5, 1.5][:n], np.float32)
    return q, k, v, sinks


def _loss(fn, **kw):
    def loss(q, k, v, sinks, g, gl):
        out, lse = fn(q, k, v, sinks=sinks, return_lse=True, **kw)
        return jnp.sum(out * g) + jnp.sum(lse * gl)
    return loss


def test_mask_is_minus_infinity_bias_and_matches_reference():
    q, k, v, sinks = _inputs(1)
    rng = np.random.default_rng(2)
    mask = rng.random((2, 4, 6, 9)) < 0.6
    mask[0, 1, 2, :] = False  # a row that sees no key
    mask[1, :, 0, :] = False  # a row of every head that sees no key
    with sj.poison_outputs_for_testing():
        out, lse = jax.jit(lambda *a: sj.dot_product_attention(*a[:3], mask=a[3], sinks=a[4], return_lse=True))(
            q, k, v, mask, sinks)
    with enable_x64():
        r_out, r_lse = ref.dot_product_attention(*(x.astype(np.float64) for x in (q, k, v)), mask=mask,
                                                 sinks=sinks.astype(np.float64), return_lse=True)
    assert rel_err(out, r_out) <= 1e-5
    assert rel_err(lse, r_lse) <= 1e-5
    # the fully masked rows: out = 0, lse = sigma exactly (SPEC.md section 2)
    np.testing.assert_array_equal(np.asarray(out)[0, 2, 1], 0.0)
    assert float(lse[0, 1, 2]) == float(sinks[1])
    np.testing.assert_array_equal(np.asarray(out)[1, 0], 0.0)
    np.testing.assert_array_equal(np.asarray(lse)[1, :, 0], sinks)
    # the same as an explicit -inf bias, bit for bit
    bias = np.where(mask, 0.0, -np.inf).astype(np.float32)
    out_b, lse_b = sj.dot_product_attention(q, k, v, bias, sinks=sinks, return_lse=True)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out_b))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_b))


def test_mask_gradients_match_reference_and_stay_finite():
    q, k, v, sinks = _inputs(3)
    rng = np.random.default_rng(4)
    mask = rng.random((1, 1, 6, 9)) < 0.5  # broadcast over batch and heads
    mask[..., 3, :] = False
    g = rng.standard_normal((2, 6, 4, 16)).astype(np.float32)
    gl = rng.standard_normal((2, 4, 6)).astype(np.float32)
    bias = rng.standard_normal((2, 1, 6, 9)).astype(np.float32)
    args = (q, k, v, sinks, g, gl)
    grads = jax.grad(_loss(lambda *a, **kw: sj.dot_product_attention(*a, bias, mask, **kw)), argnums=(0, 1, 2, 3))(
        *args)
    with enable_x64():
        r = jax.grad(_loss(lambda *a, **kw: ref.dot_product_attention(*a, bias.astype(np.float64), mask, **kw)),
                     argnums=(0, 1, 2, 3))(*(x.astype(np.float64) for x in args))
    for name, x, y in zip(("dq", "dk", "dv", "d_sinks"), grads, r):
        assert np.isfinite(np.asarray(x)).all(), name
        assert rel_err(x, y) <= 1e-4, name
    np.testing.assert_array_equal(np.asarray(grads[0])[:, 3], 0.0)  # the key-less row: dq = 0


def test_mask_must_be_boolean():
    q, k, v, sinks = _inputs(5)
    with pytest.raises(TypeError, match="mask must be boolean"):
        sj.dot_product_attention(q, k, v, mask=np.zeros((6, 9), np.float32), sinks=sinks)


@pytest.mark.parametrize("low", [-np.inf, -1e30])
def test_minus_infinity_sink_keyless_rows_add_d_lse(low):
    # s_q > s_kv bottom-right causal: the first t - s rows of every sequence see no key.
    q, k, v, _ = _inputs(6, t=9, s=5)
    sinks = np.asarray([low, 1.0, low, 20.0], np.float32)
    rng = np.random.default_rng(7)
    g = rng.standard_normal((2, 9, 4, 16)).astype(np.float32)
    gl = rng.standard_normal((2, 4, 9)).astype(np.float32)

    def loss(sinks):
        out, lse = sj.dot_product_attention(q, k, v, sinks=sinks, is_causal=True, return_lse=True)
        # with a -inf sink the key-less rows' lse is -inf (the loss value is then infinite); its cotangent d_lse = gl
        # flows all the same, and is what d_sinks collects there
        return jnp.sum(out * g) + jnp.sum(lse * gl), (out, lse)

    with sj.poison_outputs_for_testing():
        (_, (out, lse)), ds = jax.value_and_grad(loss, has_aux=True)(sinks)
    ds = np.asarray(ds)
    assert np.isfinite(ds).all()
    keyless = 4  # rows 0..3 of 9 see no key (off = 5 - 9)
    for h in (0, 2):
        np.testing.assert_allclose(ds[h], gl[:, h, :keyless].sum(), rtol=1e-5, atol=1e-5)
        want_lse = -np.inf if low == -np.inf else np.float32(low)
        np.testing.assert_array_equal(np.asarray(lse)[:, h, :keyless], want_lse)
        np.testing.assert_array_equal(np.asarray(out)[:, :keyless, h], 0.0)
