"""sinkattn.jax.decode_attention (KV cache, contiguous or paged; SPEC.md sections 1, 2 and 5) against the float64
pure-JAX reference on the same keys, under jit, with every output buffer pre-filled with NaN
(sinkattn.jax.poison_outputs_for_testing), NaN in every cache slot no sequence reads and garbage in every page-table
entry past a sequence's pages, sinks with large values (log(len) and 20), every split count. Runs unchanged on a GPU
machine (the call lowers to the CUDA decode kernels when JAX's default backend is a GPU).
"""

import math

import jax
import ml_dtypes
import numpy as np
import pytest

import sinkattn.jax as sj
from sinkattn.jax import reference as ref
from conftest import enable_x64, rel_err

TOL32 = 1e-5  # SPEC.md section 5, fp32 out and lse


def make_cache(rng, lens, page_size, kh, d, dv, share_prefix=True, extra_pages=3, extra_cols=2):
    """Page pools (NaN in unread slots), a shuffled page table (garbage past each sequence's pages; with
    share_prefix sequence 1 starts with sequence 0's whole pages) and the dense gathered keys [B, cap, K, H]."""
    b = len(lens)
    pages_of = [(n + page_size - 1) // page_size for n in lens]
    max_pages = max(pages_of + [1]) + extra_cols
    shared = min(lens[0], lens[1]) // page_size if share_prefix and b >= 2 else 0
    num_pages = sum(pages_of) - shared + extra_pages
    perm = rng.permutation(num_pages)
    table = np.empty((b, max_pages), np.int32)
    garbage = np.array([-1, 2**31 - 1, num_pages, -(2**31) + 5, 1 << 28], np.int64)
    nxt = 0
    for i in range(b):
        for pg in range(max_pages):
            if pg < pages_of[i]:
                if i == 1 and pg < shared:
                    table[i, pg] = table[0, pg]
                else:
                    table[i, pg] = perm[nxt]
                    nxt += 1
            else:
                table[i, pg] = garbage[(i + pg) % len(garbage)]
    kp = np.full((num_pages, page_size, kh, d), np.nan, np.float32)
    vp = np.full((num_pages, page_size, kh, dv), np.nan, np.float32)
    for i in range(b):
        for j in range(lens[i]):
            pg, r = table[i, j // page_size], j % page_size
            if np.isnan(kp[pg, r, 0, 0]):
                kp[pg, r] = rng.standard_normal((kh, d))
                vp[pg, r] = rng.standard_normal((kh, dv))
    cap = max_pages * page_size
    kd = np.zeros((b, cap, kh, d), np.float32)
    vd = np.zeros((b, cap, kh, dv), np.float32)
    for i in range(b):
        for j in range(lens[i]):
            kd[i, j] = kp[table[i, j // page_size], j % page_size]
            vd[i, j] = vp[table[i, j // page_size], j % page_size]
    return kp, vp, table, kd, vd


def sinks_for(rng, n, lens):
    vals = [math.log(max(max(lens), 2)), 20.0] + list(rng.uniform(-1.0, 3.0, size=max(n - 2, 0)))
    return np.asarray(vals[:n], np.float32)


def decode(q, k, v, static, arrays):
    """decode_attention under jit (array arguments traced) with NaN-poisoned outputs: (out, lse) as numpy."""
    names = sorted(arrays)

    def f(q, k, v, *a):
        return sj.decode_attention(q, k, v, return_lse=True, **static, **dict(zip(names, a)))

    with sj.poison_outputs_for_testing():
        out, lse = jax.jit(f)(q, k, v, *[arrays[n] for n in names])
    return np.asarray(out, np.float64), np.asarray(lse, np.float64)


def reference(q, kd, vd, lens, sinks, dtype=np.float64, **kw):
    """The float64 reference of the same keys (dense cache with key_value_seq_lengths)."""
    with enable_x64():
        out, lse = ref.dot_product_attention(np.asarray(q, np.float64).astype(dtype), np.asarray(kd, np.float64).astype(dtype),
                                             np.asarray(vd, np.float64).astype(dtype),
                                             sinks=None if sinks is None else np.asarray(sinks, np.float64),
                                             key_value_seq_lengths=np.asarray(lens, np.int32), return_lse=True, **kw)
        return np.asarray(out, np.float64), np.asarray(lse, np.float64)


CASES = {
    # name: (t new tokens, lens, page_size, n, kh, d, window, causal, softmax_type)
    "decode-gqa8-learnable": (1, [70, 17, 0, 1, 129], 16, 16, 2, 32, None, False, "learnable"),
    "decode-sliding-page-edges": (1, [143, 144, 145, 16], 16, 8, 2, 32, (127, 0), False, "learnable"),
    "spec-4-causal-off_by_one": (4, [40, 64, 4], 32, 8, 1, 32, None, True, "off_by_one"),
    "decode-vanilla-empty": (1, [0, 33, 200], 64, 4, 4, 16, None, False, "vanilla"),
    "chunk-16-window": (16, [300, 16, 31], 128, 4, 2, 32, (20, 0), True, "learnable"),
    "decode-page256": (1, [600, 255, 256], 256, 8, 2, 64, None, False, "learnable"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("num_splits", [1, 0, 3, 16])
def test_paged_against_reference(name, num_splits):
    t, lens, ps, n, kh, d, window, causal, st = CASES[name]
    rng = np.random.default_rng(len(name) + num_splits)
    kp, vp, table, kd, vd = make_cache(rng, lens, ps, kh, d, d)
    q = rng.standard_normal((len(lens), t, n, d)).astype(np.float32)
    sinks = sinks_for(rng, n, lens) if st == "learnable" else None
    static = dict(softmax_type=st, is_causal=causal, local_window_size=window, num_splits=num_splits)
    arrays = dict(cache_seqlens=np.asarray(lens, np.int32), page_table=table)
    if sinks is not None:
        arrays["sinks"] = sinks
    out, lse = decode(q, kp, vp, static, arrays)
    r_out, r_lse = reference(q, kd, vd, lens, sinks, softmax_type=st, is_causal=causal, local_window_size=window)
    assert rel_err(out, r_out) <= TOL32, ("out", rel_err(out, r_out))
    assert rel_err(lse, r_lse) <= TOL32, ("lse", rel_err(lse, r_lse))
    # The same keys as a contiguous cache: bit for bit the same result.
    arrays_c = dict(arrays, cache_seqlens=np.asarray(lens, np.int32))
    del arrays_c["page_table"]
    out_c, lse_c = decode(q, kd, vd, static, arrays_c)
    np.testing.assert_array_equal(out_c, out)
    np.testing.assert_array_equal(lse_c, lse)


def test_varlen_queries_paged_and_contiguous():
    """Varlen new tokens (chunked prefill with a cache): paged, and a contiguous cache (passed as B pages)."""
    rng = np.random.default_rng(5)
    lens, lq = [50, 9, 0, 130], [3, 1, 0, 5]
    n, kh, d = 8, 2, 32
    kp, vp, table, kd, vd = make_cache(rng, lens, 16, kh, d, d)
    cu = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]), n, d)).astype(np.float32)
    sinks = sinks_for(rng, n, lens)
    # float64 reference per sequence: dense query rows of its length
    r_out = np.zeros((q.shape[0], n, d))
    r_lse = np.zeros((n, q.shape[0]))
    for i in range(len(lens)):
        if lq[i] == 0:
            continue
        o, l = reference(q[None, cu[i]:cu[i + 1]], kd[i:i + 1], vd[i:i + 1], [lens[i]], sinks, is_causal=True)
        r_out[cu[i]:cu[i + 1]] = o[0]
        r_lse[:, cu[i]:cu[i + 1]] = l[0]
    for splits in (1, 4):
        static = dict(is_causal=True, num_splits=splits, max_seqlen_q=5)
        out, lse = decode(q, kp, vp, static, dict(cache_seqlens=np.asarray(lens, np.int32), page_table=table,
                                                  cu_seqlens_q=cu, sinks=sinks))
        assert rel_err(out, r_out) <= TOL32 and rel_err(lse, r_lse) <= TOL32
        out_c, lse_c = decode(q, kd, vd, static, dict(cache_seqlens=np.asarray(lens, np.int32), cu_seqlens_q=cu,
                                                      sinks=sinks))
        np.testing.assert_array_equal(out_c, out)
        np.testing.assert_array_equal(lse_c, lse)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_spec5(dtype):
    """bf16 / fp16 cache: SPEC.md section 5, at most 2x the plain low-precision error + 1e-3."""
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    rng = np.random.default_rng(11)
    lens = [300, 70, 1]
    n, kh, d = 16, 2, 64
    kp, vp, table, kd, vd = make_cache(rng, lens, 16, kh, d, d)
    q = rng.standard_normal((3, 2, n, d)).astype(np.float32)
    sinks = sinks_for(rng, n, lens)
    q, kp, vp, kd, vd = (x.astype(dt) for x in (q, kp, vp, kd, vd))
    out, lse = decode(q, kp, vp, dict(is_causal=True), dict(cache_seqlens=np.asarray(lens, np.int32),
                                                          page_table=table, sinks=sinks))
    r_out, r_lse = reference(q, kd, vd, lens, sinks, is_causal=True)
    with ref.plain_low_precision(dt):
        p_out, p_lse = reference(q, kd, vd, lens, sinks, dtype=np.float32, is_causal=True)
    p_out = np.asarray(np.asarray(p_out, np.float32).astype(dt), np.float64)
    assert rel_err(out, r_out) <= 2 * rel_err(p_out, r_out) + 1e-3
    assert rel_err(lse, r_lse) <= 2 * rel_err(p_lse, r_lse) + 1e-3


def test_sink_counted_once():
    """With sink 20 far above every score, LSE is 20 + log(1 + sum exp(S - 20)): a double count would add log 2.
    Every split count, sequences without keys (LSE = sigma exactly, out = 0)."""
    rng = np.random.default_rng(3)
    lens = [0, 5, 70, 1]
    n, kh, d = 4, 1, 16
    kp, vp, table, kd, vd = make_cache(rng, lens, 16, kh, d, d)
    q = (0.1 * rng.standard_normal((4, 1, n, d))).astype(np.float32)
    sinks = np.asarray([20.0, 20.0, 5.0, -1.0], np.float32)
    r_out, r_lse = reference(q, kd, vd, lens, sinks)
    for splits in (1, 2, 5, 64, 128):
        out, lse = decode(q, kp, vp, dict(num_splits=splits), dict(cache_seqlens=np.asarray(lens, np.int32),
                                                                 page_table=table, sinks=sinks))
        assert rel_err(lse, r_lse) <= TOL32 and rel_err(out, r_out) <= TOL32, splits
        np.testing.assert_array_equal(lse[0, :, 0], sinks)  # no key: LSE = sigma, out = 0
        np.testing.assert_array_equal(out[0], 0.0)
        assert np.all(np.abs(lse[1:, :2, 0] - 20.0) < 1e-3)  # not 20 + log 2


def test_errors():
    rng = np.random.default_rng(0)
    kp, vp, table, kd, vd = make_cache(rng, [20, 4], 16, 1, 16, 16)
    q = rng.standard_normal((2, 1, 2, 16)).astype(np.float32)
    lens = np.asarray([20, 4], np.int32)
    with pytest.raises(sj.SinkattnError, match="page_table"):  # trace time: shape
        sj.decode_attention(q, kp, vp, cache_seqlens=lens, page_table=table[:1])
    with pytest.raises(sj.SinkattnError, match="num_splits"):
        sj.decode_attention(q, kp, vp, cache_seqlens=lens, page_table=table, num_splits=-2)
    with pytest.raises(Exception, match="seqused_kv"):  # run time: contents
        np.asarray(jax.jit(lambda l: sj.decode_attention(q, kp, vp, cache_seqlens=l, page_table=table))(
            np.asarray([20, 10_000], np.int32)))
    bad = table.copy()
    bad[0, 0] = kp.shape[0] + 3
    with pytest.raises(Exception, match="page_table"):
        np.asarray(sj.decode_attention(q, kp, vp, cache_seqlens=lens, page_table=bad))
