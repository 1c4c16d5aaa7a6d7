"""Memory bounded by the keys a call reads, through the bindings (SPEC.md sections 1 and 4): the decode batch of a
serving engine (b = 256 sequences of GPT-OSS-120B heads: 64 query heads, 8 KV heads, d = 64, bf16) over a page table
of 65,536 pages of 16 per sequence (room for 1,048,576 keys each) of which each sequence uses 1 to 256 keys, through
``sinkattn.torch.flash_attn_with_kvcache`` and ``sinkattn.jax.decode_attention`` on the CPU.

Entries past ``ceil(cache_seqlens / page_size)`` are never read, so what a call allocates follows the keys used: its
peak resident memory (Linux's VmHWM, reset before the call) stays within the stated bound, the CPU backend's K / V
panels of the keys used, 4 bytes x h_kv x (d + d_v) x sum_n (cache_seqlens[n] + 16), plus 64 MiB (outputs, per-thread
tiles, the binding's own buffers), where the table's capacity would be 1.1 TB. The answer is, bit for bit, that of
the same call over a compact table (the pages used), which is judged against the float64 reference. The table is
built from zero pages of which only the entries a sequence uses (and two garbage entries after them) are written."""

import math

import numpy as np
import pytest

from conftest import enable_x64, rel_err

B, H_Q, H_KV, D, PAGE, MAX_PAGES = 256, 64, 8, 64, 16, 65536
MIB = 1 << 20


def _status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def _peak_growth(fn):
    """fn()'s result and the growth of the peak resident set during it (None when /proc cannot reset the peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        can = True
    except OSError:
        can = False
    before = _status_bytes("VmRSS")
    result = fn()
    peak = _status_bytes("VmHWM")
    return result, (max(peak - before, 0) if can and before >= 0 and peak >= 0 else None)


def _batch():
    """(q, k_pool, v_pool, big table [B, MAX_PAGES], compact table, cache_seqlens, sinks) as numpy arrays (q and the
    pools float32 holding bf16 values; NaN in every pool slot no sequence reads)."""
    rng = np.random.default_rng(39)
    lens = rng.integers(1, 257, size=B).astype(np.int32)
    lens[:3] = (1, 256, 17)
    pages = [math.ceil(x / PAGE) for x in lens]
    num_pages = sum(pages) + 5
    order = rng.permutation(num_pages)
    k_pool = np.full((num_pages, PAGE, H_KV, D), np.nan, np.float32)
    v_pool = np.full_like(k_pool, np.nan)
    big = np.zeros((B, MAX_PAGES), np.int32)  # calloc'd zero pages: only the entries written below cost memory
    compact = np.full((B, 256 // PAGE + 2), -1, np.int32)
    nxt = 0
    for n, length in enumerate(lens):
        for pg in range(pages[n]):
            page = order[nxt]
            nxt += 1
            big[n, pg] = compact[n, pg] = page
            rows = min(PAGE, length - pg * PAGE)
            k_pool[page, :rows] = rng.standard_normal((rows, H_KV, D))
            v_pool[page, :rows] = rng.standard_normal((rows, H_KV, D))
        big[n, pages[n]:pages[n] + 2] = (2**31 - 1, -1)  # never read
        compact[n, pages[n]:pages[n] + 2] = (-1, num_pages)
    q = rng.standard_normal((B, 1, H_Q, D)).astype(np.float32)
    sinks = np.concatenate([[math.log(256.0), 20.0], rng.uniform(-1, 3, H_Q - 2)]).astype(np.float32)
    return q, k_pool, v_pool, big, compact, lens, sinks


def _bound(lens):
    return 4 * H_KV * 2 * D * int(np.sum(lens.astype(np.int64) + 16)) + 64 * MIB


def _check_reference(q, k_pool, v_pool, compact, lens, sinks, out, lse):
    """out / lse of the first 16 sequences against the float64 reference by SPEC.md section 5 (bf16: at most 2x the
    plain low-precision evaluation's error + 1e-3). Inputs hold bf16 values (as float32)."""
    import ml_dtypes
    from sinkattn.jax import reference as ref

    m = 16
    gather = lambda pool: np.concatenate(
        [np.concatenate([pool[compact[n, pg]] for pg in range(math.ceil(lens[n] / PAGE))])[:lens[n]] for n in range(m)])
    kw = dict(sinks=sinks, cu_seqlens_q=np.arange(m + 1, dtype=np.int32),
              cu_seqlens_kv=np.concatenate([[0], np.cumsum(lens[:m])]).astype(np.int32), return_lse=True)
    args = (q[:m, 0], gather(k_pool), gather(v_pool))
    with enable_x64():
        r_out, r_lse = (np.asarray(x) for x in ref.dot_product_attention(*(a.astype(np.float64) for a in args),
                                                                           **dict(kw, sinks=sinks.astype(np.float64))))
    with ref.plain_low_precision(ml_dtypes.bfloat16):
        p_out, p_lse = (np.asarray(x, np.float64) for x in ref.dot_product_attention(*args, **kw))
    p_out = np.asarray(p_out.astype(np.float32).astype(ml_dtypes.bfloat16), np.float64)
    out, lse = np.asarray(out, np.float64)[:m, 0], np.asarray(lse, np.float64)[:m, :, 0].T
    assert rel_err(out, r_out) <= 2 * rel_err(p_out, r_out) + 1e-3
    assert rel_err(lse, r_lse) <= 2 * rel_err(p_lse, r_lse) + 1e-3


def _round_bf16(x):
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def test_torch_flash_attn_with_kvcache_large_page_table():
    torch = pytest.importorskip("torch")
    import sinkattn.torch as st

    q, k_pool, v_pool, big, compact, lens, sinks = _batch()
    tq = torch.from_numpy(q).bfloat16()
    tk, tv = torch.from_numpy(k_pool).bfloat16(), torch.from_numpy(v_pool).bfloat16()
    tbig, tcompact = torch.from_numpy(big), torch.from_numpy(compact)
    seq, ts = torch.from_numpy(lens), torch.from_numpy(sinks)
    for splits in (0, 1, 128):
        call = lambda table: st.flash_attn_with_kvcache(tq, tk, tv, cache_seqlens=seq, page_table=table,
                                                        learnable_sink=ts, num_splits=splits,
                                                        return_softmax_lse=True)
        (out, lse), growth = _peak_growth(lambda: call(tbig))
        out_c, lse_c = call(tcompact)
        assert torch.equal(out, out_c) and torch.equal(lse, lse_c), f"num_splits={splits}"
        if growth is not None:
            print(f"torch decode b=256 x 65536 pages, num_splits={splits}: peak resident growth "
                  f"{growth / MIB:.1f} MiB (bound {_bound(lens) / MIB:.1f} MiB)")
            assert growth <= _bound(lens)
    _check_reference(_round_bf16(q), _round_bf16(k_pool), _round_bf16(v_pool), compact, lens, sinks,
                     out.float().numpy(), lse.numpy())


def test_jax_decode_attention_large_page_table():
    import jax
    import jax.numpy as jnp
    import sinkattn.jax as sj

    q, k_pool, v_pool, big, compact, lens, sinks = _batch()
    cpu = jax.devices("cpu")[0]
    jq, jk, jv = (jax.device_put(jnp.asarray(x, jnp.bfloat16), cpu) for x in (q, k_pool, v_pool))
    jbig, jcompact = jax.device_put(big, cpu), jax.device_put(compact, cpu)
    jl, js = jax.device_put(lens, cpu), jax.device_put(sinks, cpu)
    for splits in (0, 128):
        fn = jax.jit(lambda q_, k_, v_, t_, l_, s_: sj.decode_attention(q_, k_, v_, cache_seqlens=l_, page_table=t_,
                                                                        sinks=s_, num_splits=splits,
                                                                        return_lse=True))
        jax.block_until_ready(fn(jq, jk, jv, jbig, jl, js))  # compiles; XLA's buffers for the call are now known
        (out, lse), growth = _peak_growth(lambda: jax.block_until_ready(fn(jq, jk, jv, jbig, jl, js)))
        out_c, lse_c = fn(jq, jk, jv, jcompact, jl, js)
        assert np.array_equal(np.asarray(out, np.float32), np.asarray(out_c, np.float32)), f"num_splits={splits}"
        assert np.array_equal(np.asarray(lse), np.asarray(lse_c)), f"num_splits={splits}"
        if growth is not None:
            print(f"jax decode b=256 x 65536 pages, num_splits={splits}: peak resident growth "
                  f"{growth / MIB:.1f} MiB (bound {_bound(lens) / MIB:.1f} MiB)")
            assert growth <= _bound(lens)
    _check_reference(_round_bf16(q), _round_bf16(k_pool), _round_bf16(v_pool), compact, lens, sinks,
                     np.asarray(out, np.float32), np.asarray(lse))
