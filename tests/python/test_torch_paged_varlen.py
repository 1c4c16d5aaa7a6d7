"""sinkattn.torch.flash_attn_varlen_func over a paged KV cache (``block_table`` with ``seqused_k``), called as vLLM's
FlashAttention backend calls it: a serving engine's mixed batch (decode rows, chunked prefills after a cached prefix,
prefills from scratch, a sequence with no new rows) in one call.

The batch: pages of 16 keys in a pool of 23 (shuffled, a prefix page pair shared by two sequences as prefix caching
shares them), NaN in every slot no sequence uses and out-of-range block-table entries past each sequence's pages,
GQA (h_q 8, h_kv 2), large sinks (log(s_kv) and 20), causal and a sliding window, float32 / float16 / bfloat16 on the
CPU backend (and on CUDA where present). Judged against the dense call (the same function with the keys gathered into
packed k / v and ``cu_seqlens_k``), against the float64 reference (SPEC.md section 5), and against one call per
sequence; ``out=`` is NaN-poisoned before the call. The arguments the library cannot honour are refused with a
message naming them."""

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sinkattn.torch as st  # noqa: E402
from sinkattn.jax import reference as ref  # noqa: E402
from conftest import enable_x64  # noqa: E402
from test_jax_op import rel_err  # noqa: E402
from torch_util import DEVICES  # noqa: E402

H_Q, H_KV, D, PAGE = 8, 2, 32, 16
# (new query rows, keys) per sequence: decode over 37 keys, a prefill from scratch, decode over one key, two chunked
# prefills after cached prefixes (sequence 4 shares sequence 3's first two pages), decode over exactly one page, a
# short prefill, and a sequence with no new rows this step.
MIXED = [(1, 37), (24, 24), (1, 1), (13, 50), (20, 83), (1, 16), (7, 7), (0, 5)]
SHARED = (3, 4, 2)  # sequence 4's first 2 pages are sequence 3's
SINKS = [math.log(83), 20.0, -1.0, 0.5, 2.0, -3.0, 1.0, 4.0]
_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: ml_dtypes.bfloat16}


def _mixed_batch(seed, dtype, device, batch=MIXED, extra_q_rows=0, max_blocks=8, spare_pages=6):
    """q [total_q + extra_q_rows, H_Q, D] (NaN in the extra rows), page pools [num_pages, PAGE, H_KV, D] (NaN where no
    sequence reads), block table int32 [b, max_blocks] (out-of-range entries past each sequence's pages), seqused_k,
    cu_seqlens_q, and the dense inputs: packed k / v of every sequence's keys, cu_seqlens_k."""
    rng = np.random.default_rng(seed)
    b = len(batch)
    pages = [math.ceil(n_k / PAGE) for _, n_k in batch]
    a, c, n_shared = SHARED if batch is MIXED else (0, 0, 0)
    num_pages = sum(pages) - n_shared + spare_pages
    order = list(rng.permutation(num_pages))
    table = np.full((b, max_blocks), 10**6, np.int32)  # out of range: never read
    for n in range(b):
        for p in range(pages[n]):
            table[n, p] = table[a, p] if (n == c and p < n_shared) else order.pop()
    k_pool = np.full((num_pages, PAGE, H_KV, D), np.nan, np.float32)
    v_pool = np.full((num_pages, PAGE, H_KV, D), np.nan, np.float32)
    for n, (_, n_k) in enumerate(batch):
        for j in range(n_k):
            page, row = table[n, j // PAGE], j % PAGE
            if np.isnan(k_pool[page, row]).all():  # a shared page is written once
                k_pool[page, row] = rng.standard_normal((H_KV, D))
                v_pool[page, row] = rng.standard_normal((H_KV, D))
    lens_q = [n_q for n_q, _ in batch]
    total_q = sum(lens_q)
    q = rng.standard_normal((total_q + extra_q_rows, H_Q, D)).astype(np.float32)
    q[total_q:] = np.nan  # rows of no sequence: never read
    t = lambda x, dt=dtype: torch.as_tensor(x).to(device=device, dtype=dt)  # noqa: E731
    kp, vp = t(k_pool), t(v_pool)
    # the dense call's inputs: each sequence's keys gathered from its pages (already rounded to dtype)
    idx = [(int(table[n, j // PAGE]), j % PAGE) for n, (_, n_k) in enumerate(batch) for j in range(n_k)]
    k_dense = torch.stack([kp[p, r] for p, r in idx]) if idx else kp.new_zeros((0, H_KV, D))
    v_dense = torch.stack([vp[p, r] for p, r in idx]) if idx else vp.new_zeros((0, H_KV, D))
    return dict(
        q=t(q), k=kp, v=vp, block_table=t(table, torch.int32),
        seqused_k=t(np.asarray([n_k for _, n_k in batch], np.int32), torch.int32),
        cu_seqlens_q=t(np.cumsum([0] + lens_q), torch.int32), max_seqlen_q=max(lens_q), max_seqlen_k=max(
            n_k for _, n_k in batch),
        k_dense=k_dense, v_dense=v_dense, cu_seqlens_k=t(np.cumsum([0] + [n_k for _, n_k in batch]), torch.int32))


def _reference(x, sinks, causal, window, plain=None):
    """out [total_q, H_Q, D] and lse [H_Q, total_q] of the batch's sequences: float64, or (plain = a dtype) SPEC.md
    section 5's plain low-precision implementation of that dtype on the same rounded inputs."""
    total_q = int(x["cu_seqlens_q"][-1])
    f = np.float64 if plain is None else np.float32
    arr = lambda t: t.detach().cpu().double().numpy().astype(f)  # noqa: E731
    with enable_x64():
        if plain is not None:
            ctx = ref.plain_low_precision(plain)
            ctx.__enter__()
        try:
            out, lse = ref.dot_product_attention(
                arr(x["q"][:total_q]), arr(x["k_dense"]), arr(x["v_dense"]), sinks=np.asarray(sinks, f),
                is_causal=causal, local_window_size=window, cu_seqlens_q=x["cu_seqlens_q"].cpu().numpy(),
                cu_seqlens_kv=x["cu_seqlens_k"].cpu().numpy(), return_lse=True)
        finally:
            if plain is not None:
                ctx.__exit__(None, None, None)
    out = np.asarray(out, np.float64)
    if plain is not None:
        out = np.asarray(out.astype(np.float32).astype(plain), np.float64)
    return out, np.asarray(lse, np.float64)


def _vllm_call(x, out, sinks, causal, window, **kw):
    """flash_attn_varlen_func with the keyword arguments of vLLM's FlashAttention backend (v1, FlashAttention 3):
    every argument by name, descales of its layers (1.0 expanded to [num_seqs, h_kv]), the window as a list (None
    without one)."""
    num_seqs = x["cu_seqlens_q"].shape[0] - 1
    one = torch.ones((), dtype=torch.float32, device=x["q"].device)
    total_q = out.shape[0]
    args = dict(
        q=x["q"][:total_q], k=x["k"], v=x["v"], out=out, cu_seqlens_q=x["cu_seqlens_q"],
        max_seqlen_q=x["max_seqlen_q"], seqused_k=x["seqused_k"], max_seqlen_k=x["max_seqlen_k"],
        softmax_scale=D ** -0.5, causal=causal, alibi_slopes=None,
        window_size=list(window) if window is not None else None, block_table=x["block_table"], softcap=0.0,
        scheduler_metadata=None, fa_version=3, q_descale=one.expand(num_seqs, H_KV),
        k_descale=one.expand(num_seqs, H_KV), v_descale=one.expand(num_seqs, H_KV), num_splits=0, s_aux=sinks)
    args.update(kw)
    return st.flash_attn_varlen_func(**args)


_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_MASKS = [(True, None), (True, (7, 0)), (False, (20, 3))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("causal,window", _MASKS, ids=["causal", "causal-window7", "window20-3"])
def test_mixed_batch_one_call_matches_dense_call_and_reference(device, dtype, causal, window):
    x = _mixed_batch(seed=len(str(dtype)) + (7 if window else 0), dtype=dtype, device=device)
    sinks = torch.tensor(SINKS, device=device)
    total_q = int(x["cu_seqlens_q"][-1])
    buf = torch.full((total_q + 5, H_Q, D), float("nan"), dtype=dtype, device=device)  # vLLM's padded output buffer
    with torch.inference_mode():
        res, lse = _vllm_call(x, buf[:total_q], sinks, causal, window, return_softmax_lse=True)
        dense, dense_lse = st.flash_attn_varlen_func(
            x["q"][:total_q], x["k_dense"], x["v_dense"], x["cu_seqlens_q"], x["cu_seqlens_k"], x["max_seqlen_q"],
            x["max_seqlen_k"], softmax_scale=D ** -0.5, causal=causal, window_size=window, learnable_sink=sinks,
            return_lse=True)
    # out= is written and returned; the buffer's rows past the call are untouched
    assert res.data_ptr() == buf.data_ptr() and res.shape == (total_q, H_Q, D) and res.dtype == dtype
    assert not torch.isnan(buf[:total_q]).any() and torch.isnan(buf[total_q:]).all()
    assert lse.shape == (H_Q, total_q) and lse.dtype == torch.float32
    # the paged call is the dense call over the same keys
    o, d = res.cpu().double().numpy(), dense.cpu().double().numpy()
    assert rel_err(o, d) <= (1e-6 if dtype == torch.float32 else 1e-2), rel_err(o, d)
    assert rel_err(lse.cpu().numpy(), dense_lse.cpu().numpy()) <= 1e-5
    # and both are within SPEC.md section 5 of the float64 reference
    r_out, r_lse = _reference(x, SINKS, causal, window)
    if dtype == torch.float32:
        tol_out = tol_lse = 1e-5
    else:
        p_out, p_lse = _reference(x, SINKS, causal, window, plain=_NP[dtype])
        tol_out, tol_lse = 2 * rel_err(p_out, r_out) + 1e-3, 2 * rel_err(p_lse, r_lse) + 1e-3
    for name, got in (("paged", o), ("dense", d)):
        assert rel_err(got, r_out) <= tol_out, (name, rel_err(got, r_out), tol_out)
    assert rel_err(lse.cpu().numpy(), r_lse) <= tol_lse, (rel_err(lse.cpu().numpy(), r_lse), tol_lse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_mixed_batch_one_call_equals_one_call_per_sequence(device, dtype):
    x = _mixed_batch(seed=5, dtype=dtype, device=device)
    sinks = torch.tensor(SINKS, device=device, dtype=torch.bfloat16)  # any float dtype
    cu = x["cu_seqlens_q"].tolist()
    with torch.no_grad():
        out, lse = st.flash_attn_varlen_func(
            x["q"][:cu[-1]], x["k"], x["v"], x["cu_seqlens_q"], None, x["max_seqlen_q"], x["max_seqlen_k"],
            causal=True, window_size=(31, 0), s_aux=sinks, block_table=x["block_table"], seqused_k=x["seqused_k"],
            return_lse=True)
        for n in range(len(MIXED)):
            a, e = cu[n], cu[n + 1]
            o, lv = st.flash_attn_varlen_func(
                x["q"][a:e], x["k"], x["v"], torch.tensor([0, e - a], dtype=torch.int32, device=device),
                max_seqlen_q=max(e - a, 1), max_seqlen_k=MIXED[n][1], causal=True, window_size=(31, 0), s_aux=sinks,
                page_table=x["block_table"][n:n + 1], seqused_k=x["seqused_k"][n:n + 1], return_lse=True)
            torch.testing.assert_close(o, out[a:e], rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-6)
            torch.testing.assert_close(lv, lse[:, a:e], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_split_counts_page_table_alias_and_rows_after_the_last_sequence(device):
    """num_splits is honoured (every count gives the result within fp32 rounding), page_table is block_table's alias,
    q rows after cu_seqlens_q[-1] (NaN) are never read and their out rows are left as they were."""
    x = _mixed_batch(seed=9, dtype=torch.float32, device=device, extra_q_rows=3)
    sinks = torch.tensor(SINKS, device=device)
    total_q = int(x["cu_seqlens_q"][-1])
    r_out, r_lse = _reference(x, SINKS, True, (7, 0))
    for splits in (0, 1, 2, 3, 16):
        for table_kw in ("block_table", "page_table"):
            out = torch.full_like(x["q"], float("nan"))
            out[total_q:] = 7.0  # rows of no sequence: must stay as they are
            with torch.inference_mode():
                res, lse = st.flash_attn_varlen_func(
                    x["q"], x["k"], x["v"], x["cu_seqlens_q"], causal=True, window_size=(7, 0), s_aux=sinks,
                    seqused_k=x["seqused_k"], num_splits=splits, out=out, return_attn_probs=True,
                    **{table_kw: x["block_table"]})
            assert res is out
            assert torch.all(out[total_q:] == 7.0)
            assert torch.all(lse[:, total_q:] == float("-inf"))
            o, lv = out[:total_q].cpu().double().numpy(), lse[:, :total_q].cpu().double().numpy()
            assert rel_err(o, r_out) <= 1e-5, (splits, table_kw, rel_err(o, r_out))
            assert rel_err(lv, r_lse) <= 1e-5, (splits, table_kw, rel_err(lv, r_lse))


@pytest.mark.parametrize("device", DEVICES)
def test_out_argument_without_a_block_table(device):
    """out= of the packed-key call (vLLM's encoder path): written, returned, rows of no sequence untouched."""
    x = _mixed_batch(seed=2, dtype=torch.float32, device=device, extra_q_rows=2)
    total_q = int(x["cu_seqlens_q"][-1])
    out = torch.full_like(x["q"], float("nan"))
    out[total_q:] = -3.0
    res = st.flash_attn_varlen_func(
        q=x["q"], k=x["k_dense"], v=x["v_dense"], out=out, cu_seqlens_q=x["cu_seqlens_q"],
        cu_seqlens_k=x["cu_seqlens_k"], max_seqlen_q=x["max_seqlen_q"], max_seqlen_k=x["max_seqlen_k"],
        causal=False, fa_version=3, q_descale=torch.ones(8, H_KV, device=device), s_aux=torch.tensor(SINKS, device=device))
    assert res is out and torch.all(out[total_q:] == -3.0)
    r_out, _ = _reference(x, SINKS, False, None)
    assert rel_err(out[:total_q].detach().cpu().double().numpy(), r_out) <= 1e-5


def test_paged_call_compiles_in_one_graph():
    """torch.compile(fullgraph=True) traces the vLLM call, out= included (aot_eager: no C++ code generated)."""
    x = _mixed_batch(seed=8, dtype=torch.float32, device="cpu")
    sinks = torch.tensor(SINKS)
    total_q = int(x["cu_seqlens_q"][-1])

    def call(q, k, v, out, cu_q, used, table):
        return _vllm_call(dict(x, q=q, k=k, v=v, cu_seqlens_q=cu_q, seqused_k=used, block_table=table), out, sinks,
                          True, (7, 0))

    args = [x[n] for n in ("q", "k", "v")]
    batch = [x[n] for n in ("cu_seqlens_q", "seqused_k", "block_table")]
    with torch.inference_mode():
        eager = call(*args, torch.empty(total_q, H_Q, D), *batch)
        out = torch.full((total_q, H_Q, D), float("nan"))
        torch.compile(call, fullgraph=True, backend="aot_eager")(*args, out, *batch)
    assert torch.equal(out, eager)


def test_paged_call_is_forward_only():
    x = _mixed_batch(seed=4, dtype=torch.float32, device="cpu")
    sinks = torch.tensor(SINKS, requires_grad=True)
    kw = dict(block_table=x["block_table"], seqused_k=x["seqused_k"], causal=True, s_aux=sinks)
    q = x["q"].clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="block_table: paged KV is forward only .*torch.no_grad"):
        st.flash_attn_varlen_func(q, x["k"], x["v"], x["cu_seqlens_q"], **kw)
    with pytest.raises(RuntimeError, match="block_table: paged KV is forward only"):
        st.flash_attn_varlen_func(x["q"], x["k"], x["v"], x["cu_seqlens_q"], **kw)  # the sinks require a gradient
    with torch.no_grad():
        out = st.flash_attn_varlen_func(q, x["k"], x["v"], x["cu_seqlens_q"], **kw)
    assert not out.requires_grad and not torch.isnan(out).any()


def test_refusals_name_the_argument():
    x = _mixed_batch(seed=6, dtype=torch.float32, device="cpu", batch=[(1, 20), (3, 3)], max_blocks=2)
    q, k, v, cu, bt, used = x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["block_table"], x["seqused_k"]
    ok = dict(block_table=bt, seqused_k=used)

    def refused(exc, match, *args, **kw):
        with pytest.raises(exc, match=match):
            st.flash_attn_varlen_func(*(args or (q, k, v, cu)), **kw)

    refused(ValueError, "^sinkattn: scheduler_metadata is not supported: it is FlashAttention 3's precomputed",
            scheduler_metadata=torch.zeros(3, dtype=torch.int32), **ok)
    refused(ValueError, "^sinkattn: give page_table or its alias block_table, not both", page_table=bt, **ok)
    refused(ValueError, "^sinkattn: seqused_k is required with block_table", block_table=bt)
    refused(ValueError, "^sinkattn: seqused_k is required with page_table", page_table=bt)
    refused(ValueError, r"^sinkattn: cu_seqlens_k must be None with block_table: .*seqused_k = cu_seqlens_k\[1:\]",
            q, k, v, cu, x["cu_seqlens_k"], **ok)
    refused(ValueError, "^sinkattn: cu_seqlens_k is required .*block_table", seqused_k=used)
    refused(ValueError, "^sinkattn: dropout_p must be 0 with block_table", dropout_p=0.1, **ok)
    refused(ValueError, "^sinkattn: fa_version must be None, 2, 3 or 4", fa_version=1, **ok)
    refused(TypeError, "^sinkattn: k_descale must be None or a float tensor", k_descale=1.0, **ok)
    refused(ValueError, "^sinkattn: softcap is not supported", softcap=30.0, **ok)
    refused(ValueError, "^sinkattn: alibi_slopes are not supported", alibi_slopes=torch.ones(H_Q), **ok)
    # out=: q's dtype, the result's shape and device, checked before anything is written
    out = torch.full((4, H_Q, D), float("nan"), dtype=torch.bfloat16)
    refused(TypeError, r"^sinkattn: out: dtype must be q's \(float32\), got bfloat16", out=out, **ok)
    assert torch.isnan(out.float()).all()
    refused(ValueError, r"^sinkattn: out: shape must be \[total_q, h_q, d_v\] = \[4, 8, 32\], got \[4, 8, 16\]",
            out=torch.zeros(4, H_Q, 16), **ok)
    # an FP8 KV cache (vLLM's kv_cache_dtype="fp8"): no float8 attention here, whatever the descales
    if hasattr(torch, "float8_e4m3fn"):
        refused(TypeError, "^sinkattn: k must be a float32, float16 or bfloat16 tensor, got torch.float8_e4m3fn",
                q, k.to(torch.float8_e4m3fn), v, cu, k_descale=torch.ones(2, H_KV), **ok)
    # the library's own checks speak the caller's names
    refused(RuntimeError, "^sinkattn: seqused_k: shape must be", block_table=bt, seqused_k=used[:1])
    refused(RuntimeError, "^sinkattn: page_table: shape must be", page_table=bt[:1], seqused_k=used)
