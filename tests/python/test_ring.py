"""Context-parallel ring attention (sinkattn.jax.ring) == the fused op on one device: values and gradients
(dq, dk, dv, d_sinks, through out and lse), for every softmax type, non-causal, causal (contiguous and zig-zag
layouts) and sliding windows (both layouts: the band schedule), GQA, on meshes of 2, 4 and 8 devices and combined
with batch/head sharding. Random inputs, sinks log(S) and 20, every fused call's outputs pre-filled with NaN
(poison_outputs_for_testing), SPEC.md section 5 error measure and fp32 tolerances (1e-5 out/lse, 1e-4 gradients).
Also: the static schedule (a sliding window skips the ring steps it cannot see, in communication and compute), and
the compiled HLO (no all-gather; the key/value transfers do not wait for the fused calls, and on a GPU they run as
asynchronous collective-permutes around them). Runs on the 8 virtual CPU devices of conftest.py (or the GPUs)."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import sinkattn.jax as sj
from sinkattn.jax import ring
from sinkattn.jax.attention import attention_backward
from conftest import make_mesh
from cp_util import DT, ON_GPU, check, check_float64, hlo_computations, inputs, loss, runs_custom_call


def _ring(mesh, q, k, v, sinks, g, g_lse, layout, batch_axes=None, head_axis=None, **kw):
    p = mesh.shape["cp"]
    perm = (lambda x, ax=1: ring.zigzag_permute(x, p, ax)) if layout == "zigzag" else (lambda x, ax=1: x)
    unperm = (lambda x, ax=1: ring.zigzag_unpermute(x, p, ax)) if layout == "zigzag" else (lambda x, ax=1: x)
    spec = P(batch_axes, "cp", head_axis, None)
    put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
    # the arrays live sequence-sharded, already in the ring's layout order (zig-zag: permuted once, up front)
    qs, ks, vs = (put(perm(jnp.asarray(x)), spec) for x in (q, k, v))
    gs, gls = put(perm(jnp.asarray(g)), spec), put(perm(jnp.asarray(g_lse), 2), P(batch_axes, head_axis, "cp"))
    ss = put(jnp.asarray(sinks), P(head_axis))

    def f(q, k, v, s, g, g_lse):
        out, lse = ring.ring_dot_product_attention(q, k, v, mesh=mesh, seq_axis="cp", batch_axes=batch_axes,
                                                   head_axis=head_axis, sinks=s, layout=layout, return_lse=True,
                                                   **kw)
        return loss(out, lse, g, g_lse), (out, lse)

    step = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))
    with sj.poison_outputs_for_testing():
        (_, (out, lse)), (dq, dk, dv, ds) = step(qs, ks, vs, ss, gs, gls)
    hlo = step.lower(qs, ks, vs, ss, gs, gls).compile().as_text()
    return unperm(out), unperm(lse, 2), (unperm(dq), unperm(dk), unperm(dv), ds), hlo


CASES = [
    # (softmax_type, mask kwargs, layout, cp size); T = 32
    ("learnable", dict(), "contiguous", 4),
    ("learnable", dict(is_causal=True), "contiguous", 4),
    ("learnable", dict(is_causal=True), "zigzag", 4),
    ("off_by_one", dict(is_causal=True), "zigzag", 2),
    ("vanilla", dict(), "contiguous", 2),
    ("vanilla", dict(is_causal=True), "zigzag", 4),
    # sliding windows, local block C = 8: window inside one block, crossing into the previous one, two back
    ("learnable", dict(is_causal=True, local_window_size=(5, 0)), "contiguous", 4),
    ("learnable", dict(is_causal=True, local_window_size=(13, 0)), "contiguous", 4),
    ("off_by_one", dict(is_causal=True, local_window_size=(127, 0)), "contiguous", 4),  # covers all: causal ring
    ("learnable", dict(is_causal=True, local_window_size=(13, 0)), "contiguous", 2),
    ("learnable", dict(is_causal=True), "zigzag", 2),  # with the case above: what a 2-GPU machine runs
    # 8 devices (local block 4)
    ("learnable", dict(), "contiguous", 8),
    ("learnable", dict(is_causal=True), "zigzag", 8),
    ("vanilla", dict(is_causal=True), "contiguous", 8),
    ("learnable", dict(is_causal=True, local_window_size=(5, 0)), "contiguous", 8),  # two blocks back
    # sliding windows in the zig-zag layout (chunks of 16 / 4 / 2 rows): the band of each of the two local chunks
    ("learnable", dict(is_causal=True, local_window_size=(9, 0)), "zigzag", 2),
    ("off_by_one", dict(is_causal=True, local_window_size=(3, 0)), "zigzag", 4),
    ("learnable", dict(is_causal=True, local_window_size=(6, 0)), "zigzag", 8),  # chunks up to 3 back
    ("vanilla", dict(local_window_size=(11, 0)), "zigzag", 4),  # (W, 0) alone is causal too
]


@pytest.mark.parametrize("softmax_type,mask,layout,p", CASES)
def test_ring_matches_single_device(softmax_type, mask, layout, p):
    B, T, N, K, H = 2, 32, 4, 2, 32
    mesh = make_mesh((p,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=zlib.crc32(repr((softmax_type, mask, layout, p)).encode()))
    kw = dict(softmax_type=softmax_type, **mask)
    ringed = _ring(mesh, q, k, v, sinks, g, g_lse, layout, **kw)
    check(q, k, v, sinks, g, g_lse, ringed, **kw)
    hlo = ringed[3]
    assert "collective-permute" in hlo  # the ring is ppermute ...
    assert "all-gather" not in hlo  # ... and nothing gathers the sequence


def test_ring_with_batch_and_head_sharding():
    """data x cp x heads = 2 x 2 x 2 mesh, zig-zag causal, GQA: d_sinks summed over data and cp, sharded by heads."""
    B, T, N, K, H = 4, 32, 4, 2, 32
    mesh = make_mesh((2, 2, 2), ("data", "cp", "model"))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=7)
    kw = dict(softmax_type="learnable", is_causal=True)
    ringed = _ring(mesh, q, k, v, sinks, g, g_lse, "zigzag", batch_axes="data", head_axis="model", **kw)
    check(q, k, v, sinks, g, g_lse, ringed, **kw)
    assert "all-gather" not in ringed[3]


def test_ring_band_with_batch_sharding():
    """data x cp = 2 x 4, sliding window in the zig-zag layout (the band schedule under a batch axis)."""
    B, T, N, K, H = 2, 32, 4, 1, 32
    mesh = make_mesh((2, 4), ("data", "cp"))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=8)
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(5, 0))
    ringed = _ring(mesh, q, k, v, sinks, g, g_lse, "zigzag", batch_axes="data", **kw)
    check(q, k, v, sinks, g, g_lse, ringed, **kw)


def test_window_schedule_skips_steps():
    """GPT-OSS sliding layer (window 127) on 32k tokens over 8 devices: one causal-window call of the local block
    and one 127 x 127 call, 127 key rows received (not 8 ring steps of 4096); zig-zag: the same per local chunk."""
    s = ring.ring_schedule(axis_size=8, local_len=4096, local_window_size=(127, 0))
    assert s["mode"] == "band"
    assert s["calls"] == [(4096, 4096, "causal window"), (127, 127, "band")]
    assert s["ppermutes"] == 1 and s["key_rows_received"] == 127
    z = ring.ring_schedule(axis_size=8, local_len=4096, local_window_size=(127, 0), layout="zigzag")
    assert z["calls"] == [(2048, 2048, "causal window")] * 2 + [(127, 127, "band")] * 2
    assert z["key_rows_received"] == 254
    full = ring.ring_schedule(axis_size=8, local_len=4096, is_causal=True, layout="zigzag")
    assert full["mode"] == "zigzag" and len(full["calls"]) == 1 + 2 * 7  # 2 half-block calls per step
    wide = ring.ring_schedule(axis_size=8, local_len=4096, local_window_size=(5000, 0))  # reaches 2 blocks back
    assert wide["calls"] == [(4096, 4096, "causal window"), (4096, 4096, "band"), (904, 904, "band")]
    assert ring.ring_schedule(axis_size=4, local_len=8, local_window_size=(40, 0))["mode"] == "causal"


def _entry(hlo):
    comps = hlo_computations(hlo)
    return comps, comps[comps["ENTRY"]]


def _ancestors(entry):
    """{instruction: set of opcodes among its transitive operands} within the entry computation."""
    by_name = {ins[0]: ins for ins in entry}
    memo = {}

    def anc(name):
        if name not in memo:
            memo[name] = set()
            ins = by_name.get(name)
            if ins is not None:
                for o in ins[3]:
                    if o in by_name:
                        memo[name] |= {by_name[o][2]} | anc(o)
        return memo[name]

    return {ins[0]: anc(ins[0]) for ins in entry}


def test_band_against_float64_and_its_hlo():
    """A sliding layer (window 5, local block 16, 4 devices) against the pure-JAX float64 reference of SPEC.md
    directly (not only against the fused op), and its compiled forward + backward: 2 fused forward calls and 2
    fused backward calls per device, and every collective-permute carries 5 key rows (the forward's key/value tails
    and the backward's dk/dv of them), none a whole block."""
    B, T, N, K, H = 2, 64, 2, 1, 32
    mesh = make_mesh((4,), ("cp",))
    q, k, v, sinks, g, g_lse = inputs(B, T, N, K, H, seed=3)
    kw = dict(softmax_type="learnable", is_causal=True, local_window_size=(5, 0))
    ringed = _ring(mesh, q, k, v, sinks, g, g_lse, "contiguous", **kw)
    check_float64(q, k, v, sinks, g, g_lse, ringed, **kw)
    comps, entry = _entry(ringed[3])
    fwd, bwd = (ringed[3].count(f'custom_call_target="sinkattn_jax_{d}"') for d in ("forward", "backward"))
    assert fwd == 2 and bwd == 2, (fwd, bwd)
    perms = [i for i in entry if i[2].startswith("collective-permute") and not i[2].endswith("-done")]
    assert perms
    for name, shape, *_ in perms:
        assert "[2,5,1,32]" in shape and "[2,16," not in shape, shape


def test_ring_transfers_overlap_the_fused_calls():
    """The next key/value block's ppermute is issued before, and does not depend on, the current fused call:
    in the compiled forward no collective-permute has a custom call among its ancestors, so XLA may run each
    transfer during a call. On a GPU (latency-hiding scheduler on, conftest.py) the scheduled HLO must actually
    place a sinkattn call between each asynchronous collective-permute start and its done."""
    B, T, N, K, H = 1, 64, 4, 2, 32
    p = 4
    mesh = make_mesh((p,), ("cp",))
    q, k, v, sinks, _, _ = inputs(B, T, N, K, H, seed=4)
    put = lambda x: jax.device_put(x, NamedSharding(mesh, P(None, "cp", None, None)))
    f = jax.jit(lambda q, k, v, s: ring.ring_dot_product_attention(q, k, v, mesh=mesh, seq_axis="cp", sinks=s,
                                                                   is_causal=True, layout="zigzag"))
    hlo = f.lower(put(q), put(k), put(v), jnp.asarray(sinks)).compile().as_text()
    comps, entry = _entry(hlo)
    anc = _ancestors(entry)
    starts = [i for i in entry if i[2] in ("collective-permute", "collective-permute-start")]
    assert len(starts) >= p - 1
    for ins in starts:
        assert "custom-call" not in anc[ins[0]], f"{ins[0]} waits for a fused call"
    if ON_GPU:
        names = [i[0] for i in entry]
        overlapped = 0
        for ins in starts:
            if ins[2] != "collective-permute-start":
                continue
            done = next(j for j, d in enumerate(entry) if d[2] == "collective-permute-done" and ins[0] in d[3])
            if any(runs_custom_call(comps, i, "sinkattn_jax_forward") for i in entry[names.index(ins[0]) + 1:done]):
                overlapped += 1
        assert overlapped >= p - 1, f"{overlapped} of {len(starts)} collective-permutes overlap a fused call"


def test_attention_backward_matches_the_op_vjp():
    """attention_backward (the ring's per-block backward) given the op's own out / lse == the op's VJP (dq, dk, dv,
    d_sinks), bitwise with deterministic=True: the same library backward on the same tensors."""
    q, k, v, sinks, g, g_lse = inputs(2, 24, 4, 2, 32, seed=12)
    sinks, g_lse = jnp.asarray(sinks), jnp.asarray(g_lse)
    kw = dict(is_causal=True, local_window_size=(7, 0), mask_alignment="top_left", deterministic=True)
    f = lambda q, k, v, s: sj.dot_product_attention(q, k, v, sinks=s, return_lse=True, **kw)
    with sj.poison_outputs_for_testing():
        (out, lse), vjp = jax.vjp(f, q, k, v, sinks)
        want = vjp((g, g_lse))
        got = jax.jit(lambda *a: attention_backward(*a, sinks=sinks, **kw))(q, k, v, out, lse, g, g_lse)
    for name, a, b in zip(("dq", "dk", "dv", "d_sinks"), got, want):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)), name
    assert float(jnp.max(jnp.abs(got[3]))) > 0.0


def test_zigzag_permute_roundtrip_and_order():
    x = jnp.arange(2 * 16).reshape(2, 16)
    z = ring.zigzag_permute(x, 4, axis=1)
    # 8 chunks of 2: device r holds chunks r and 7 - r
    assert z[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert np.array_equal(ring.zigzag_unpermute(z, 4, axis=1), x)
    with pytest.raises(ValueError, match="divisible"):
        ring.zigzag_permute(jnp.zeros((1, 12)), 4)


def test_ring_errors():
    mesh = make_mesh((2,), ("cp",))
    q = jnp.ones((1, 8, 2, 32), DT)
    with pytest.raises(NotImplementedError, match="causal sliding windows"):
        ring.ring_dot_product_attention(q, q, q, mesh=mesh, seq_axis="cp", local_window_size=(3, 2))
    with pytest.raises(ValueError, match="sinks"):
        ring.ring_dot_product_attention(q, q, q, mesh=mesh, seq_axis="cp", softmax_type="learnable")
    with pytest.raises(ValueError, match="layout"):
        ring.ring_dot_product_attention(q, q, q, mesh=mesh, seq_axis="cp", layout="striped")


def test_ring_sinks_default_to_learnable():
    """sinks given without softmax_type: learnable, as in dot_product_attention (never silently dropped)."""
    B, T, N, K, H = 1, 16, 4, 2, 32
    mesh = make_mesh((2,), ("cp",))
    q, k, v, sinks, _, _ = inputs(B, T, N, K, H, seed=5)
    sinks = jnp.asarray(sinks, jnp.float32)
    call = lambda **kw: ring.ring_dot_product_attention(q, k, v, mesh=mesh, seq_axis="cp", sinks=sinks,
                                                       is_causal=True, return_lse=True, **kw)
    out_d, lse_d = call()
    out_l, lse_l = call(softmax_type="learnable")
    out_v, _ = call(softmax_type="vanilla")
    assert np.array_equal(np.asarray(out_d, np.float32), np.asarray(out_l, np.float32))
    assert np.array_equal(np.asarray(lse_d), np.asarray(lse_l))
    assert not np.array_equal(np.asarray(out_d, np.float32), np.asarray(out_v, np.float32))
