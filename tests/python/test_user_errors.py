"""Errors in the user's words, through every Python entry point (SPEC.md section 4): the mistakes a new user makes
(q, k, v of mixed dtypes, sinks of the wrong length, a window given as an int, a head dim no backend runs, lengths
of the wrong size), each refused with a message that starts with the argument's name as the caller spelled it
(FlashAttention's ``learnable_sink`` / ``s_aux`` / ``k_cache`` / ``cu_seqlens_k``, HF's ``query`` / ``s_aux``,
jax.nn's ``query`` / ``key_value_seq_lengths``) and names the backend once; and ``causal=True`` with a right window
bound, which follows FlashAttention's rule (the right bound is 0). The C ABI's and the command's counterparts:
tests/test_user_errors.cpp, tests/cli/test_capture.cpp."""

import re

import numpy as np
import pytest


def _message(fn, exc):
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    assert "cpu: cpu:" not in msg and "cuda: cuda" not in msg, msg
    return msg


def _starts(msg, name, rest=""):
    """The message names `name` first (after the backend, for a call no backend runs), then says `rest`."""
    m = re.match(r"sinkattn: (?:no backend can run this call: \w+: )?([A-Za-z_0-9]+)[: ]", msg)
    assert m is not None and m.group(1) == name, f"wanted the message to name {name!r} first: {msg}"
    assert rest in msg, f"wanted {rest!r} in: {msg}"


# ---------------------------------------------------------------- PyTorch
torch = pytest.importorskip("torch")
import sinkattn.torch as st  # noqa: E402


def _t(*shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g).to(dtype)


def test_torch_mixed_dtypes():
    q, k, v = _t(1, 4, 2, 64), _t(1, 4, 2, 64), _t(1, 4, 2, 64, dtype=torch.bfloat16)
    for fn in (lambda: st.flash_attn_func(q, k, v), lambda: st.dot_product_attention(q, k, v)):
        _starts(_message(fn, RuntimeError), "v", "dtype must match q's (fp32), got bf16")
    qv, kv, vv = _t(6, 2, 64), _t(6, 2, 64), _t(6, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_varlen_func(qv, kv, vv, cu, cu, 6, 6), RuntimeError), "v",
            "must match q's (fp32)")
    kc, vc = _t(1, 8, 2, 64), _t(1, 8, 2, 64, dtype=torch.bfloat16)
    lens = torch.tensor([8], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_with_kvcache(q[:, :1], kc, vc, cache_seqlens=lens), RuntimeError),
            "v_cache", "must match q's (fp32)")


def test_torch_sinks_of_the_wrong_length_name_the_argument_passed():
    q = _t(1, 4, 2, 64)
    s3 = torch.zeros(3)
    _starts(_message(lambda: st.flash_attn_func(q, q, q, learnable_sink=s3), RuntimeError), "learnable_sink",
            "shape must be [2], got [3]")
    _starts(_message(lambda: st.flash_attn_func(q, q, q, s_aux=s3), RuntimeError), "s_aux", "shape must be [2]")
    _starts(_message(lambda: st.dot_product_attention(q, q, q, sinks=s3), RuntimeError), "sinks", "shape must be [2]")
    qv = _t(6, 2, 64)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_varlen_func(qv, qv, qv, cu, cu, 6, 6, learnable_sink=s3), RuntimeError),
            "learnable_sink", "shape must be [2]")
    kc = _t(1, 8, 2, 64)
    lens = torch.tensor([8], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=lens, s_aux=s3),
                     RuntimeError), "s_aux", "shape must be [2]")
    # a sink tensor of the wrong kind, named too
    _starts(_message(lambda: st.flash_attn_func(q, q, q, learnable_sink=torch.zeros(2, dtype=torch.int32)),
                     TypeError), "learnable_sink", "must be a float tensor")


def test_torch_window_size_as_an_int():
    q = _t(1, 4, 2, 64)
    for fn in (lambda: st.flash_attn_func(q, q, q, window_size=127),
               lambda: st.dot_product_attention(q, q, q, window_size=127),
               lambda: st.flash_attn_func(q, q, q, window_size=(127,)),
               lambda: st.flash_attn_func(q, q, q, window_size=(127.0, 0))):
        _starts(_message(fn, TypeError), "window_size", "a pair (left, right) of ints")
    kc = _t(1, 8, 2, 64)
    lens = torch.tensor([8], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=lens, window_size=127),
                     TypeError), "window_size", "a pair (left, right) of ints")


def test_torch_unsupported_head_dim_names_the_backend_once():
    q = _t(1, 4, 2, 600)
    for fn in (lambda: st.flash_attn_func(q, q, q), lambda: st.dot_product_attention(q, q, q)):
        _starts(_message(fn, RuntimeError), "q", "cpu: q: head dim d = 600 not supported")
    kc = _t(1, 8, 2, 600)
    lens = torch.tensor([8], dtype=torch.int32)
    _starts(_message(lambda: st.flash_attn_with_kvcache(q[:, :1], kc, kc, cache_seqlens=lens), RuntimeError), "q",
            "head dim d = 600")


def test_torch_lengths_of_the_wrong_size_name_the_argument_passed():
    q = _t(1, 1, 2, 64)
    kc = _t(1, 8, 2, 64)
    _starts(_message(lambda: st.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.tensor([8, 8], dtype=torch.int32),
                                                        page_table=torch.zeros(1, 1, dtype=torch.int32)),
                     RuntimeError), "cache_seqlens", "shape must be [1]")
    _starts(_message(lambda: st.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.tensor([8], dtype=torch.int32),
                                                        block_table=torch.zeros(2, 1, dtype=torch.int32)),
                     RuntimeError), "block_table", "shape must be [b, max_pages]")
    qv = _t(6, 2, 64)
    _starts(_message(lambda: st.flash_attn_varlen_func(qv, qv, qv, torch.tensor([0, 6], dtype=torch.int32),
                                                       torch.tensor([0, 3, 6], dtype=torch.int32), 6, 6),
                     RuntimeError), "cu_seqlens_k", "shape must be [2]")
    _starts(_message(lambda: st.flash_attn_varlen_func(qv, qv, qv, torch.tensor([0, 6], dtype=torch.int32),
                                                       torch.tensor([0, 6], dtype=torch.int32), 6, 6,
                                                       seqused_k=torch.tensor([1, 1], dtype=torch.int32)),
                     RuntimeError), "seqused_k", "shape must be [1]")


def test_torch_causal_with_a_right_window_bound_is_flash_attention_s_rule():
    """FlashAttention sets the right bound to 0 under causal: (127, 5) with causal is (127, 0), bit for bit."""
    q, k, v = _t(1, 40, 2, 32), _t(1, 40, 2, 32), _t(1, 40, 2, 32)
    a = st.flash_attn_func(q, k, v, causal=True, window_size=(7, 5))
    b = st.flash_attn_func(q, k, v, causal=True, window_size=(7, 0))
    c = st.flash_attn_func(q, k, v, causal=False, window_size=(7, 5))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_hf_attention_forward_names_hf_arguments():
    pytest.importorskip("transformers")
    from sinkattn.torch import hf

    module = torch.nn.Linear(4, 4)  # float32 weights: q, k, v stay float32
    query, key = _t(1, 2, 4, 64), _t(1, 2, 4, 64)
    _starts(_message(lambda: hf.attention_forward(module, query, key, key, None, s_aux=torch.zeros(3)), RuntimeError),
            "s_aux", "shape must be [2]")
    big = _t(1, 2, 4, 600)
    _starts(_message(lambda: hf.attention_forward(module, big, big, big, None), RuntimeError), "query",
            "cpu: query: head dim d = 600")
    _starts(_message(lambda: hf.attention_forward(module, query, _t(1, 3, 4, 64), _t(1, 3, 4, 64), None),
                     RuntimeError), "key", "h_q % h_kv")


# ---------------------------------------------------------------- JAX
def test_jax_messages_name_jax_arguments():
    import jax.numpy as jnp
    import sinkattn.jax as sj

    q = jnp.asarray(np.random.default_rng(1).standard_normal((1, 4, 2, 64)), jnp.float32)
    v16 = q.astype(jnp.bfloat16)
    _starts(_message(lambda: sj.dot_product_attention(q, q, v16), sj.SinkattnError), "value",
            "dtype must match query's (fp32), got bf16")
    _starts(_message(lambda: sj.dot_product_attention(q, q, q, sinks=jnp.zeros(3)), sj.SinkattnError), "sinks",
            "shape must be [2], got [3]")
    _starts(_message(lambda: sj.dot_product_attention(q, q, q, local_window_size="127"), TypeError),
            "local_window_size", "an int or a pair (left, right) of ints")
    _starts(_message(lambda: sj.dot_product_attention(q, q, q, local_window_size=(1, 2, 3)), TypeError),
            "local_window_size")
    big = jnp.zeros((1, 4, 2, 600), jnp.float32)
    msg = _message(lambda: sj.dot_product_attention(big, big, big), sj.SinkattnError)
    _starts(msg, "query")  # from the backend of JAX's default device: cpu, or cuda (whose wording names d_v too)
    assert re.search(r"(cpu|cuda): query: head dims? d = 600\b.* not supported", msg), msg
    _starts(_message(lambda: sj.dot_product_attention(q, q, q, key_value_seq_lengths=jnp.array([4, 4], jnp.int32)),
                     sj.SinkattnError), "key_value_seq_lengths", "shape must be [1]")
    _starts(_message(lambda: sj.dot_product_attention(q, q, q, dropout_rate=1.5, dropout_rng=jnp.zeros(2, jnp.uint32)),
                     sj.SinkattnError), "dropout_rate", "must be in [0, 1)")
    # decode_attention: FlashAttention's cache names
    lens = jnp.array([4], jnp.int32)
    _starts(_message(lambda: sj.decode_attention(q, q, v16, cache_seqlens=lens), sj.SinkattnError), "v_cache",
            "must match q's (fp32)")
    _starts(_message(lambda: sj.decode_attention(q, q, q, cache_seqlens=jnp.array([4, 4], jnp.int32)),
                     sj.SinkattnError), "cache_seqlens", "shape must be [1]")
    _starts(_message(lambda: sj.decode_attention(q, q, q, cache_seqlens=lens, sinks=jnp.zeros(5)), sj.SinkattnError),
            "sinks", "shape must be [2]")


def test_jax_causal_with_a_right_window_bound_is_flash_attention_s_rule():
    import jax.numpy as jnp
    import sinkattn.jax as sj

    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, 40, 2, 32)), jnp.float32)
    a = sj.dot_product_attention(x, x, x, is_causal=True, local_window_size=(7, 5))
    b = sj.dot_product_attention(x, x, x, is_causal=True, local_window_size=(7, 0))
    assert np.array_equal(np.asarray(a), np.asarray(b))
