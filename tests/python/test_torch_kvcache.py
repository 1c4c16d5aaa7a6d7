"""sinkattn.torch.flash_attn_with_kvcache (decode over a KV cache, SPEC.md section 1) against the float64 reference.

Paged caches with shuffled and shared pages, ragged lengths (empty sequences, lengths ending mid-page), page sizes
16 and 64, the unused page slots and the page-table entries past each sequence's last page poisoned (NaN values,
out-of-range indices), large sinks, causal and sliding windows, every split count; contiguous caches; and the
FlashAttention options the library does not implement, which must be refused. Runs on every device present."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sinkattn.torch as st  # noqa: E402
from sinkattn.jax import reference as ref  # noqa: E402
from conftest import enable_x64  # noqa: E402
from test_jax_op import rel_err  # noqa: E402
from torch_util import DEVICES  # noqa: E402


def _cache(rng, lens, page_size, h_kv, d, spare_pages=3):
    """Page pools with the keys of every sequence scattered over shuffled pages (sequence 0's first page shared with
    the last sequence), NaN in every slot no sequence uses, garbage page-table entries past each sequence's pages.
    Returns (k_pool, v_pool, page_table, keys per sequence as float64 [len, h_kv, d] arrays)."""
    b = len(lens)
    max_pages = max(1, max(math.ceil(x / page_size) for x in lens))
    pages_needed = sum(math.ceil(x / page_size) for x in lens) + spare_pages
    order = rng.permutation(pages_needed)
    k_pool = np.full((pages_needed, page_size, h_kv, d), np.nan, np.float32)
    v_pool = np.full((pages_needed, page_size, h_kv, d), np.nan, np.float32)
    table = np.full((b, max_pages), 10**6, np.int32)  # out of range: must never be read
    keys, vals, nxt = [], [], 0
    for n, length in enumerate(lens):
        kk = rng.standard_normal((length, h_kv, d)).astype(np.float32)
        vv = rng.standard_normal((length, h_kv, d)).astype(np.float32)
        for pg in range(math.ceil(length / page_size)):
            page = order[nxt]
            nxt += 1
            table[n, pg] = page
            rows = slice(pg * page_size, min((pg + 1) * page_size, length))
            k_pool[page, :rows.stop - rows.start] = kk[rows]
            v_pool[page, :rows.stop - rows.start] = vv[rows]
        keys.append(kk)
        vals.append(vv)
    return k_pool, v_pool, table, keys, vals


def _reference(q, keys, vals, sinks, causal, window):
    """float64 out / lse of dense q [b, s_q, h_q, d] over each sequence's keys (bottom-right aligned), through the
    pure-JAX reference as a varlen call."""
    b, s_q = q.shape[0], q.shape[1]
    cu_q = np.arange(0, (b + 1) * s_q, s_q, dtype=np.int32)
    cu_k = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.int32)
    kk = np.concatenate(keys) if keys else np.zeros((0,) + q.shape[2:])
    vv = np.concatenate(vals) if vals else np.zeros((0,) + q.shape[2:])
    with enable_x64():
        out, lse = ref.dot_product_attention(
            q.reshape((b * s_q,) + q.shape[2:]).astype(np.float64), kk.astype(np.float64), vv.astype(np.float64),
            sinks=sinks.astype(np.float64), is_causal=causal, local_window_size=window, cu_seqlens_q=cu_q,
            cu_seqlens_kv=cu_k, return_lse=True)
    out = np.asarray(out).reshape((b, s_q) + out.shape[1:])
    lse = np.asarray(lse).reshape(lse.shape[0], b, s_q).transpose(1, 0, 2)
    return out, lse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("s_q,causal,window", [(1, False, None), (1, True, (5, 0)), (4, True, None),
                                                (3, True, (20, 0))])
def test_paged_matches_reference_for_every_split_count(device, page_size, s_q, causal, window):
    rng = np.random.default_rng(page_size + 7 * s_q + (3 if window else 0))
    lens = [37, 0, 16, 130, 1]  # ragged, an empty sequence, exactly one page, several pages, mid-page ends
    h_q, h_kv, d = 8, 2, 32
    k_pool, v_pool, table, keys, vals = _cache(rng, lens, page_size, h_kv, d)
    q = rng.standard_normal((len(lens), s_q, h_q, d)).astype(np.float32)
    sinks = np.asarray([math.log(130), 20.0, -1.0, 0.5, 2.0, -3.0, 1.0, 4.0], np.float32)
    r_out, r_lse = _reference(q, keys, vals, sinks, causal, window)
    t = lambda x: torch.as_tensor(x, device=device)  # noqa: E731
    for splits in (0, 1, 2, 3, 7):
        out, lse = st.flash_attn_with_kvcache(
            t(q), t(k_pool), t(v_pool), cache_seqlens=t(np.asarray(lens, np.int32)), page_table=t(table),
            causal=causal, window_size=window if window else (-1, -1), learnable_sink=t(sinks), num_splits=splits,
            return_softmax_lse=True)
        o, l = out.cpu().double().numpy(), lse.cpu().double().numpy()
        assert o.shape == r_out.shape and l.shape == r_lse.shape
        assert rel_err(o, r_out) <= 1e-5, ("out", splits, rel_err(o, r_out))
        assert rel_err(l, r_lse) <= 1e-5, ("lse", splits, rel_err(l, r_lse))
        # the empty sequence: out = 0, lse = its sink exactly (counted once, whatever the split)
        np.testing.assert_array_equal(o[1], 0.0)
        np.testing.assert_array_equal(l[1], np.broadcast_to(sinks[:, None], (h_q, s_q)))


@pytest.mark.parametrize("device", DEVICES)
def test_contiguous_cache_and_block_table_alias(device):
    rng = np.random.default_rng(11)
    b, s_cache, h_q, h_kv, d = 3, 40, 4, 4, 16
    lens = np.asarray([40, 17, 0], np.int32)
    kc = rng.standard_normal((b, s_cache, h_kv, d)).astype(np.float32)
    vc = rng.standard_normal((b, s_cache, h_kv, d)).astype(np.float32)
    for n, length in enumerate(lens):
        kc[n, length:] = np.nan  # never read
        vc[n, length:] = np.nan
    q = rng.standard_normal((b, 2, h_q, d)).astype(np.float32)
    sinks = np.asarray([3.0, 20.0, -2.0, 0.0], np.float32)
    r_out, r_lse = _reference(q, [kc[n, :x] for n, x in enumerate(lens)], [vc[n, :x] for n, x in enumerate(lens)],
                              sinks, True, None)
    t = lambda x: torch.as_tensor(x, device=device)  # noqa: E731
    out, lse = st.flash_attn_with_kvcache(t(q), t(kc), t(vc), cache_seqlens=t(lens), causal=True,
                                          learnable_sink=t(sinks), return_softmax_lse=True)
    assert rel_err(out.cpu().double().numpy(), r_out) <= 1e-5
    assert rel_err(lse.cpu().double().numpy(), r_lse) <= 1e-5
    # the same keys as a paged cache through FlashAttention 2's name for the table
    k_pool, v_pool, table, keys, vals = _cache(rng, [40, 17, 0], 16, h_kv, d)
    out2 = st.flash_attn_with_kvcache(t(q), t(k_pool), t(v_pool), cache_seqlens=t(lens), block_table=t(table),
                                      causal=True, learnable_sink=t(sinks))
    r2, _ = _reference(q, keys, vals, sinks, True, None)
    assert rel_err(out2.cpu().double().numpy(), r2) <= 1e-5


def test_refuses_what_it_does_not_implement():
    q = torch.randn(1, 1, 2, 16)
    kc = torch.randn(1, 8, 2, 16)
    lens = torch.tensor([8], dtype=torch.int32)
    for kw, msg in [(dict(k=torch.randn(1, 1, 2, 16), v=torch.randn(1, 1, 2, 16)), "appending k / v"),
                    (dict(rotary_cos=torch.randn(8, 8), rotary_sin=torch.randn(8, 8)), "rotary"),
                    (dict(cache_batch_idx=torch.tensor([0])), "cache_batch_idx"),
                    (dict(cache_leftpad=torch.tensor([0])), "cache_leftpad"),
                    (dict(softcap=30.0), "softcap"),
                    (dict(alibi_slopes=torch.ones(2)), "alibi")]:
        with pytest.raises(ValueError, match=msg):
            st.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, **kw)
    with pytest.raises(ValueError, match="cache_seqlens is required"):
        st.flash_attn_with_kvcache(q, kc, kc, page_table=torch.zeros(1, 1, dtype=torch.int32))
    # an index inside the pages a sequence uses that is out of range: the library's message
    with pytest.raises(RuntimeError, match="page_table"):
        st.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=lens, page_table=torch.tensor([[5]], dtype=torch.int32))
