"""PyTorch context parallelism (sinkattn.torch.distributed) over torch.distributed: sharded == one process.

Groups of 2 and 4 spawned processes on the CPU (gloo; one group per size, every case run inside it, see
torch_cp_worker.py), and on a GPU machine also one CUDA process (NCCL, world size 1: the same code paths on CUDA
tensors, bf16 cases too). For each case the sharded run (each rank its block of the sequence, in the case's
layout) gathered back to the global order must equal the unsharded op in one process: out, lse and every gradient
(dq, dk, dv, d_sinks of loss = sum(out * g) + sum(lse * g_lse)) within SPEC.md section 5's fp32 tolerances, d_sinks
identical on every rank (all-reduced over the group) or, with reduce_d_sinks=False, summing to it over the ranks.
A few cases (and every bf16 case, by SPEC.md section 5's low-precision rule) are also judged against the float64
reference of SPEC.md directly. Cases: ring (non-causal, causal, zig-zag, off_by_one, vanilla, sliding window 127 at
block edges and small windows in both layouts, GQA 8, MQA, THD), all-to-all (causal, window 127 zig-zag,
two-sided window, GQA 8 and MQA with fewer KV heads than ranks, THD with sequences across the ranks' blocks),
sinks log(S), 20 and -inf; the errors of what a mode cannot do; and HF GPT-OSS (a sliding and a full layer) trained
with its sequence split over the group (ring zig-zag, all-to-all, ring contiguous): loss and every parameter's
gradient summed over the ranks equal the unsharded model's."""

import os
import tempfile
import time

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import cp_util
import torch_cp_worker as W

CONFIGS = [("cpu", 2), ("cpu", 4)] + ([("cuda", 1)] if torch.cuda.is_available() else [])
# also against float64 (one JAX evaluation each, seconds on the CPU): a band schedule, a THD ring and a THD
# all-to-all, in the group of 2; every bf16 case
FLOAT64 = {("cpu", 2, "ring-window5-zigzag"), ("cpu", 2, "ring-thd-causal-zigzag"), ("cpu", 2, "ulysses-thd"),
           ("cuda", 1, "ring-causal-zigzag"), ("cuda", 1, "ulysses-thd")}
_RESULTS = {}


def results(device, world):
    """Runs every case of (device, world) once in one spawned group (cached for the module's tests)."""
    key = (device, world)
    if key not in _RESULTS:
        with tempfile.TemporaryDirectory() as tmp:
            init, out = os.path.join(tmp, "init"), os.path.join(tmp, "results.pt")
            ctx = mp.start_processes(W.run, args=(world, init, out, device, True), nprocs=world, join=False,
                                     start_method="spawn")
            deadline = time.time() + 900
            while not ctx.join(timeout=2):
                if time.time() > deadline:
                    for proc in ctx.processes:
                        proc.kill()
                    raise TimeoutError(f"context-parallel group {key} did not finish in 900 s")
            _RESULTS[key] = torch.load(out, weights_only=False)
    return _RESULTS[key]


def _params():
    out = []
    for device, world in CONFIGS:
        for name in W.cases(world, device):
            out.append(pytest.param(device, world, name, id=f"{device}-{world}-{name}"))
    return out


def _as_batch(r, thd):
    """THD results [total, ...] / lse [h, total] -> a batch of one, as the dense reference takes them."""
    if not thd:
        return r
    out, lse, dq, dk, dv, ds = r
    return [out[None], lse[None], dq[None], dk[None], dv[None], ds]


def _jax_kwargs(c):
    wl, wr = c["window_size"]
    kw = dict(softmax_type=c["softmax_type"], is_causal=c["causal"])
    if wl >= 0 or wr >= 0:
        kw["local_window_size"] = (wl, wr)
    if c["cu"] is not None:
        cu = np.asarray(c["cu"])
        seg = np.searchsorted(cu[1:], np.arange(cu[-1]), side="right")[None]
        kw["segment_ids"] = jnp.asarray(seg, jnp.int32)
    return kw


def _float64_check(c, x, got):
    """The sharded results against the float64 reference of SPEC.md (fp32: fp32 tolerances; bf16: SPEC.md
    section 5's rule against the plain low-precision implementation)."""
    thd = c["cu"] is not None
    low = c["dtype"] == torch.bfloat16
    rnd = (lambda t: t.to(torch.bfloat16).float()) if low else (lambda t: t)
    arr = lambda t: (t[None] if thd else t).numpy()
    q, k, v, g = (arr(rnd(x[n])) for n in ("q", "k", "v", "g"))
    g_lse = (x["g_lse"][None] if thd else x["g_lse"]).numpy()
    sinks = x["sinks"].numpy()
    kw = _jax_kwargs(c)
    shard = _as_batch(got, thd)
    sharded = (shard[0].numpy(), shard[1].numpy(), [t.numpy() for t in shard[2:]])
    ref64 = cp_util.float64(q, k, v, sinks, g, g_lse, **kw)
    if not low:
        return cp_util.compare(ref64, sharded, c["softmax_type"])
    seg = kw.get("segment_ids")
    vis = cp_util.visibility(q.shape[0], q.shape[1], k.shape[1], c["causal"], kw.get("local_window_size"),
                             segment_ids=None if seg is None else np.asarray(seg))
    bf = lambda a: jnp.asarray(a, jnp.bfloat16)
    plain = cp_util.plain_low_precision(bf(q), bf(k), bf(v), jnp.asarray(sinks), bf(g), jnp.asarray(g_lse),
                                        c["softmax_type"], vis)
    cp_util.compare_low_precision(ref64, plain, sharded, c["softmax_type"])


@pytest.mark.parametrize("device,world,name", _params())
def test_sharded_matches_one_process(device, world, name):
    res = results(device, world)[name]
    assert res["error"] is None, res["error"]
    c, x = res["case"], res["inputs"]
    got = list(res["sharded"])
    every = res["d_sinks_ranks"]
    if c["reduce_d_sinks"]:  # the all-reduce leaves one d_sinks on every rank
        for r in range(1, every.shape[0]):
            assert torch.equal(every[r], every[0]), f"d_sinks differs between rank 0 and rank {r}"
        d_sinks = every[0]
    else:  # each rank's share; the framework's sum over the ranks is the gradient
        d_sinks = every.double().sum(0).float()
        if world > 1:
            assert not torch.equal(every[0], every[1]), "reduce_d_sinks=False: the ranks' shares should differ"
    got.append(d_sinks)
    for t in got:
        assert not torch.isnan(t).any(), "NaN in a result"
    if c["dtype"] == torch.float32:
        one = res["single"]
        thd = c["cu"] is not None
        a, b = _as_batch(one, thd), _as_batch(got, thd)
        errs = cp_util.compare((a[0].numpy(), a[1].numpy(), [t.numpy() for t in a[2:]]),
                               (b[0].numpy(), b[1].numpy(), [t.numpy() for t in b[2:]]), c["softmax_type"])
        assert errs
    if (device, world, name) in FLOAT64 or c["dtype"] != torch.float32:
        _float64_check(c, x, got)


@pytest.mark.parametrize("device,world", CONFIGS)
def test_what_a_mode_cannot_do_raises(device, world):
    got = {what: (typ, msg) for what, typ, msg in results(device, world)["__errors__"]}
    want = {"ring bias": ("NotImplementedError", "bias"), "ring dropout": ("NotImplementedError", "dropout"),
            "ring two-sided window": ("NotImplementedError", "causal sliding windows"),
            "ring window without causal": ("NotImplementedError", "causal sliding windows"),
            "ring THD window": ("NotImplementedError", "ulysses_attention"),
            "ring learnable without sinks": ("ValueError", "sinks"),
            "ulysses bias": ("NotImplementedError", "bias"), "ulysses dropout": ("NotImplementedError", "dropout"),
            "ulysses heads": ("ValueError", "divisible by the")}
    if world == 1:
        want.pop("ulysses heads")  # 3 heads split over 1 rank is fine
    for what, (typ, text) in want.items():
        assert got[what][0] == typ and text in got[what][1], (what, got[what])


@pytest.mark.parametrize("device,world", CONFIGS)
def test_ring_transfers_overlap_the_fused_calls(device, world):
    """Double buffer (the same structure on CPU and CUDA; on CUDA the transfers run on the NCCL stream): each step's
    K/V transfer (tag 0) is issued before the step's fused calls and waited for after them; in the backward the dk/dv
    accumulator (tag 1) of the previous step travels during the current step's calls, and a last hop takes it home."""
    ev = results(device, world)["__overlap__"]
    ev = [e for i, e in enumerate(ev) if i == 0 or e != ev[i - 1] or e[0] == "issue"]  # a step's calls as one
    cut = ev.index(("backward",))
    fwd, bwd = ev[:cut], ev[cut + 1:]
    issue = lambda *tags: ("issue", tags)
    p = world
    assert fwd == [issue(0), ("fwd",), ("wait",)] * (p - 1) + [("fwd",)], fwd
    if p == 1:
        assert bwd == [("bwd",)], bwd
    else:
        want = [issue(0), ("bwd",), ("wait",)] + [issue(0, 1), ("bwd",), ("wait",)] * (p - 2)
        want += [issue(1), ("bwd",), ("wait",), issue(1), ("wait",)]
        assert bwd == want, bwd


@pytest.mark.parametrize("device,world", CONFIGS)
def test_autocast_runs_in_the_autocast_dtype(device, world):
    got = results(device, world)["__autocast__"]
    assert got == {"ring": (torch.bfloat16, torch.float32), "ulysses": (torch.bfloat16, torch.float32)}, got


@pytest.mark.parametrize("device,world", CONFIGS)
def test_hf_gpt_oss_context_parallel_matches_unsharded(device, world):
    hf = results(device, world)["__hf__"]
    assert not isinstance(hf, str), hf
    assert set(hf) == {"ring-zigzag", "ulysses-zigzag", "ring-contiguous"}
    for route, (loss, ref_loss, errs, missing) in hf.items():
        assert not missing, (route, missing)
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), (route, loss, ref_loss)
        assert any(n.endswith("self_attn.sinks") for n in errs)
        for n, e in errs.items():
            assert e <= 1e-4, (route, n, e)


def test_schedule_and_layout_helpers():
    """The ring's static schedule is the one sinkattn.jax.ring uses (shared module), and the zig-zag helpers invert
    each other (no process group needed)."""
    import sinkattn.torch.distributed as scp
    from sinkattn.jax import ring as jring

    kw = dict(axis_size=8, local_len=4096, local_window_size=(127, 0))
    s = scp.ring_schedule(**kw)
    assert s == jring.ring_schedule(**kw)
    assert s["calls"] == [(4096, 4096, "causal window"), (127, 127, "band")] and s["key_rows_received"] == 127
    x = torch.arange(2 * 16).reshape(2, 16)
    z = scp.zigzag_permute(x, 4, dim=1)
    assert z[0].tolist() == [0, 1, 14, 15, 2, 3, 12, 13, 4, 5, 10, 11, 6, 7, 8, 9]
    assert torch.equal(scp.zigzag_unpermute(z, 4, dim=1), x)
    assert np.array_equal(np.asarray(jring.zigzag_permute(jnp.asarray(x.numpy()), 4, 1)), z.numpy())
    with pytest.raises(ValueError, match="divisible"):
        scp.zigzag_permute(torch.zeros(1, 12), 4)
