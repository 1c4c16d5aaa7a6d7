"""The spawned side of test_torch_context_parallel.py: one process per rank of a torch.distributed group (gloo on
CPU tensors, NCCL on CUDA tensors), initialised once through a file, that runs every case of ``cases(world, device)``
and the HF GPT-OSS checks on that one group and writes, on rank 0, one torch.save file of results for the pytest
process to judge (which holds the float64 reference; this module imports only torch, sinkattn.torch and, for the HF
checks, transformers).

Per case: the global inputs (random, sinks log(S), 20, -inf, then uniform(-1, 3)), the unsharded op in one process
(out, lse and every gradient of loss = sum(out * g) + sum(lse * g_lse)), and the sharded run (each rank its block in
the case's layout, the same loss on its block, outputs and gradients gathered back to the global order, d_sinks of
every rank)."""

import datetime
import math
import os
import time
import traceback
import zlib

import torch
import torch.distributed as dist

import sinkattn.torch as st
import sinkattn.torch.distributed as scp


def cases(world, device):
    """{name: case} for a group of ``world`` ranks. A case: mode (ring / ulysses), softmax type, mask (causal,
    window_size), layout, shapes (b, s, h_q, h_kv, d), optional THD cu_seqlens, dtype."""
    out = {}

    def add(name, mode, **kw):
        c = dict(mode=mode, softmax_type="learnable", causal=False, window_size=(-1, -1), layout="contiguous",
                 b=2, s=16 * world, h=4, h_kv=2, d=32, cu=None, dtype=torch.float32, reduce_d_sinks=True)
        c.update(kw)
        out[name] = c

    # ring: every schedule (full, causal contiguous, zig-zag, band), softmax types, GQA / MQA, THD
    add("ring-full", "ring")
    add("ring-causal", "ring", causal=True)
    add("ring-causal-zigzag", "ring", causal=True, layout="zigzag")
    add("ring-off_by_one-zigzag", "ring", softmax_type="off_by_one", causal=True, layout="zigzag")
    add("ring-vanilla", "ring", softmax_type="vanilla", causal=True)
    # GPT-OSS's window 127 at block edges: contiguous blocks of 128 rows (the band piece of 127 rows against keys
    # [1, 128) of the previous block), zig-zag chunks of 64 (a whole chunk back, then 63 rows against keys [1, 64))
    add("ring-window127", "ring", causal=True, window_size=(127, 0), b=1, s=128 * world, h=2, h_kv=1, d=16)
    add("ring-window127-zigzag", "ring", causal=True, window_size=(127, 0), layout="zigzag", b=1, s=128 * world,
        h=2, h_kv=1, d=16)
    add("ring-window5-zigzag", "ring", causal=True, window_size=(5, 0), layout="zigzag")
    add("ring-window11", "ring", causal=True, window_size=(11, 0))
    add("ring-gqa8-zigzag", "ring", causal=True, layout="zigzag", h=16, h_kv=2, d=16)
    add("ring-mqa-window", "ring", causal=True, window_size=(9, 0), h=8, h_kv=1, d=16)
    add("ring-d_sinks-local", "ring", causal=True, layout="zigzag", reduce_d_sinks=False)
    # THD: sequences of 16, 0, 32 and 16 rows, every length divisible by 2p for p <= 4 ... and 8 (p = 1, 2, 4)
    cu = [0, 16, 16, 48, 64] if world <= 4 else None
    if cu is not None:
        add("ring-thd-causal-zigzag", "ring", causal=True, layout="zigzag", cu=cu)
        add("ring-thd-full", "ring", cu=cu)
        add("ring-thd-full-zigzag", "ring", cu=cu, layout="zigzag", softmax_type="off_by_one")
        add("ring-thd-causal", "ring", causal=True, cu=cu, softmax_type="off_by_one")
    # all-to-all: masks the ring cannot do, GQA 8 / MQA with fewer KV heads than ranks, THD, the zig-zag layout
    add("ulysses-causal", "ulysses", causal=True, h=8)
    add("ulysses-window127-zigzag", "ulysses", causal=True, window_size=(127, 0), layout="zigzag", b=1,
        s=128 * world, h=4, h_kv=1, d=16)
    add("ulysses-two-sided", "ulysses", window_size=(3, 2), h=8)
    add("ulysses-gqa8", "ulysses", causal=True, h=16, h_kv=2, d=16)
    add("ulysses-mqa", "ulysses", causal=True, window_size=(5, 0), h=8, h_kv=1, d=16, softmax_type="off_by_one")
    add("ulysses-vanilla-full", "ulysses", softmax_type="vanilla", h=8)
    total = 32 if world <= 2 else 16 * world  # divisible by p; the sequences cross the ranks' row blocks
    add("ulysses-thd", "ulysses", causal=True, h=8, cu=[0, 5, 17, 17, 30, total])
    add("ulysses-thd-window", "ulysses", causal=True, window_size=(4, 0), h=8, h_kv=1, cu=[0, 3, 11, 11, 27, total])
    if device == "cuda":  # bf16 on the tensor-core kernels (judged by SPEC.md section 5 against float64)
        for name in ("ring-causal-zigzag", "ring-window127-zigzag", "ulysses-gqa8", "ulysses-thd"):
            out[name + "-bf16"] = dict(out[name], dtype=torch.bfloat16)
    return out


def inputs(name, c):
    """Global inputs of a case (CPU, float32; the run casts): q, k, v, sinks, g, g_lse."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    if c["cu"] is None:
        lead_q, lead_lse = (c["b"], c["s"]), lambda h: (c["b"], h, c["s"])
    else:
        lead_q, lead_lse = (c["cu"][-1],), lambda h: (h, c["cu"][-1])
    q = torch.randn(*lead_q, c["h"], c["d"], generator=g)
    k = torch.randn(*lead_q, c["h_kv"], c["d"], generator=g)
    v = torch.randn(*lead_q, c["h_kv"], c["d"], generator=g)
    s_kv = c["s"] if c["cu"] is None else max(b - a for a, b in zip(c["cu"][:-1], c["cu"][1:]))
    rest = (torch.rand(max(c["h"] - 3, 0), generator=g) * 4 - 1).tolist()
    sinks = torch.tensor([math.log(s_kv), 20.0, -math.inf] + rest, dtype=torch.float32)[:c["h"]]
    go = torch.randn(*lead_q, c["h"], c["d"], generator=g)
    gl = torch.randn(*lead_lse(c["h"]), generator=g)
    return dict(q=q, k=k, v=v, sinks=sinks, g=go, g_lse=gl)


def _op_kwargs(c):
    kw = dict(softmax_type=c["softmax_type"], causal=c["causal"], window_size=c["window_size"])
    return kw


def single(c, x, device):
    """The unsharded op in this process: out, lse, dq, dk, dv, d_sinks (CPU float32/float64-comparable)."""
    dt = c["dtype"]
    t = {n: x[n].to(device=device, dtype=dt if n in ("q", "k", "v") else torch.float32).clone() for n in x}
    leaves = [t[n].requires_grad_() for n in ("q", "k", "v", "sinks")]
    kw = _op_kwargs(c)
    if c["cu"] is not None:
        cu = torch.tensor(c["cu"], dtype=torch.int32, device=device)
        mx = max(b - a for a, b in zip(c["cu"][:-1], c["cu"][1:]))
        kw.update(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=mx, max_seqlen_kv=mx)
    out, lse = st.dot_product_attention(*leaves[:3], sinks=leaves[3], mask_alignment="top_left", return_lse=True,
                                        **kw)
    gl = torch.where(torch.isfinite(lse), t["g_lse"], 0.0)
    torch.autograd.backward([out, lse], [t["g"].to(out.dtype), gl])
    grads = [z.grad if z.grad is not None else torch.zeros_like(z) for z in leaves]
    return [y.detach().float().cpu() for y in [out, lse] + grads]


def sharded(c, x, device, group):
    """The case on the group: each rank its block; results gathered back to the global order (rank 0 keeps them)."""
    p = dist.get_world_size(group)
    dt = c["dtype"]
    layout, cu = c["layout"], c["cu"]
    thd = cu is not None
    row_dim, lse_dim = (0, 1) if thd else (1, 2)
    if c["mode"] == "ring":
        cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
        shard = lambda y, dim: scp.shard_sequence(y, group, dim=dim, layout=layout, cu_seqlens=cu_t)
        gather = lambda y, dim: scp.gather_sequence(y, group, dim=dim, layout=layout, cu_seqlens=cu_t)
    else:  # ulysses: THD rows in plain blocks of the packed buffers
        shard = lambda y, dim: scp.shard_sequence(y, group, dim=dim, layout=layout)
        gather = lambda y, dim: scp.gather_sequence(y, group, dim=dim, layout=layout)
    loc = {n: shard(x[n], row_dim).to(device=device, dtype=dt).clone() for n in ("q", "k", "v", "g")}
    loc["g_lse"] = shard(x["g_lse"], lse_dim).to(device).clone()
    leaves = [loc[n].requires_grad_() for n in ("q", "k", "v")]
    sinks = x["sinks"].to(device).clone().requires_grad_()
    kw = _op_kwargs(c)
    kw.update(group=group, learnable_sink=sinks, layout=layout, return_lse=True, reduce_d_sinks=c["reduce_d_sinks"])
    if thd:
        cu_d = torch.tensor(cu, dtype=torch.int32, device=device)
        mx = max(b - a for a, b in zip(cu[:-1], cu[1:]))
        if c["mode"] == "ring":
            kw.update(cu_seqlens=cu_d, max_seqlen=mx)
        else:
            kw.update(cu_seqlens_q=cu_d, cu_seqlens_kv=cu_d, max_seqlen_q=mx, max_seqlen_kv=mx)
    fn = scp.ring_attention if c["mode"] == "ring" else scp.ulysses_attention
    out, lse = fn(*leaves, **kw)
    gl = torch.where(torch.isfinite(lse), loc["g_lse"], 0.0)
    torch.autograd.backward([out, lse], [loc["g"].to(out.dtype), gl])
    grads = [z.grad for z in leaves]
    d_sinks = sinks.grad if sinks.grad is not None else torch.zeros_like(sinks)
    every = [torch.empty_like(d_sinks) for _ in range(p)]
    dist.all_gather(every, d_sinks.contiguous(), group=group)
    res = [gather(out.detach().float().contiguous(), row_dim), gather(lse.detach().contiguous(), lse_dim)]
    res += [gather(z.float().contiguous(), row_dim) for z in grads]
    res = [y.cpu() for y in res]
    every = torch.stack(every).cpu()
    return res, every


def errors(group):
    """What the modes refuse, before any communication: [(what, exception type name, message)]."""
    q = torch.randn(1, 8, 4, 16)
    kv = torch.randn(1, 8, 2, 16)
    checks = [
        ("ring bias", lambda: scp.ring_attention(q, kv, kv, group=group, bias=torch.zeros(1, 4, 8, 8))),
        ("ring dropout", lambda: scp.ring_attention(q, kv, kv, group=group, dropout_p=0.1)),
        ("ring two-sided window", lambda: scp.ring_attention(q, kv, kv, group=group, window_size=(3, 2))),
        ("ring window without causal", lambda: scp.ring_attention(q, kv, kv, group=group, window_size=(3, -1))),
        ("ring THD window", lambda: scp.ring_attention(q[0], kv[0], kv[0], group=group, causal=True,
                                                       window_size=(3, 0), cu_seqlens=torch.tensor([0, 8]))),
        ("ring learnable without sinks", lambda: scp.ring_attention(q, kv, kv, group=group,
                                                                    softmax_type="learnable")),
        ("ulysses bias", lambda: scp.ulysses_attention(q, kv, kv, group=group, bias=torch.zeros(1, 4, 8, 8))),
        ("ulysses dropout", lambda: scp.ulysses_attention(q, kv, kv, group=group, dropout_p=0.1)),
        ("ulysses heads", lambda: scp.ulysses_attention(torch.randn(1, 8, 3, 16), torch.randn(1, 8, 1, 16),
                                                        torch.randn(1, 8, 1, 16), group=group)),
    ]
    got = []
    for what, fn in checks:
        try:
            fn()
            got.append((what, None, ""))
        except Exception as e:  # noqa: BLE001 - the test judges the type
            got.append((what, type(e).__name__, str(e)))
    return got


def overlap_events(group, device):
    """The order of the ring's transfers and fused calls (causal, zig-zag) on this rank, forward and backward:
    [("issue", tags) | ("fwd",) | ("bwd",) | ("wait",)]: the double buffer is a transfer issued before the step's
    calls and waited for after them."""
    events = []
    ex, fwd, bwd, wait = scp._RingCall.exchange, scp._RingCall.fwd, scp._RingCall.bwd, scp._wait
    scp._RingCall.exchange = lambda self, items: events.append(("issue", tuple(i[0] for i in items))) or ex(self, items)
    scp._RingCall.fwd = lambda self, *a: events.append(("fwd",)) or fwd(self, *a)
    scp._RingCall.bwd = lambda self, *a: events.append(("bwd",)) or bwd(self, *a)
    scp._wait = lambda works: (events.append(("wait",)) if works else None) or wait(works)
    try:
        p = dist.get_world_size(group)
        q, k, v = (torch.randn(1, 4 * p, 2, 16, device=device).requires_grad_() for _ in range(3))
        out = scp.ring_attention(q, k, v, group=group, causal=True, layout="zigzag",
                                 learnable_sink=torch.zeros(2, device=device))
        events.append(("backward",))
        out.sum().backward()
    finally:
        scp._RingCall.exchange, scp._RingCall.fwd, scp._RingCall.bwd, scp._wait = ex, fwd, bwd, wait
    return events


def autocast_dtypes(group, device):
    """Under torch.autocast (bf16), float32 q / k with a bf16 v (what GPT-OSS's rotary embedding hands a bf16
    layer): both modes run in bf16; returns {mode: (out dtype, grad dtype of q)}."""
    p = dist.get_world_size(group)
    got = {}
    for name, fn in (("ring", scp.ring_attention), ("ulysses", scp.ulysses_attention)):
        q, k = (torch.randn(1, 4 * p, 2 * p, 16, device=device).requires_grad_() for _ in range(2))
        v = torch.randn(1, 4 * p, 2 * p, 16, device=device).to(torch.bfloat16).requires_grad_()
        with torch.autocast(device, dtype=torch.bfloat16):
            out = fn(q, k, v, group=group, causal=True, learnable_sink=torch.zeros(2 * p, device=device))
        out.float().sum().backward()
        got[name] = (out.dtype, q.grad.dtype)
    return got


def hf_checks(group, device):
    """HF GPT-OSS (test_torch_hf's tiny config: a sliding layer and a full layer) with its sequence split over the
    group, both modes, against the unsharded model with attn_implementation="sinkattn": {mode: (loss, reference
    loss, {parameter: relative error of its gradient}, max |d_sinks| of the reference)}."""
    from transformers import AutoModelForCausalLM

    import sinkattn.torch.hf as sthf
    from test_torch_hf import tiny_config

    p = dist.get_world_size(group)
    sthf.register()
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation="sinkattn", dtype=torch.float32)
    with torch.no_grad():
        for layer in base.model.layers:
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 3.0, layer.self_attn.sinks.numel()))
    base = base.to(device).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (2, 8 * p if p > 1 else 16), generator=g).to(device)
    base.zero_grad(set_to_none=True)
    ref_loss = base(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    ref = {n: prm.grad.detach().double().cpu() for n, prm in base.named_parameters() if prm.grad is not None}
    res = {}
    for mode, layout in (("ring", "zigzag"), ("ulysses", "zigzag"), ("ring", "contiguous")):
        name = sthf.register_context_parallel(group, mode=mode, layout=layout, name=f"sinkattn_cp_{mode}_{layout}")
        m = AutoModelForCausalLM.from_config(tiny_config(), attn_implementation=name, dtype=torch.float32)
        m.load_state_dict(base.state_dict())
        m = m.to(device).train()
        assert m.config._attn_implementation == name
        ids_r, pos_r, lab_r = sthf.cp_inputs(ids, group, layout=layout)
        n_items = torch.tensor(ids.shape[0] * (ids.shape[1] - 1), device=device)
        loss = m(input_ids=ids_r, position_ids=pos_r, labels=lab_r, shift_labels=lab_r,
                 num_items_in_batch=n_items).loss
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total, group=group)
        errs = {}
        for n, prm in m.named_parameters():
            if prm.grad is None:
                continue
            gsum = prm.grad.detach().clone()
            dist.all_reduce(gsum, group=group)  # what DDP / FSDP over the group does (as a sum)
            r = ref[n]
            errs[n] = float((gsum.double().cpu() - r).abs().max() / max(float(r.abs().max()), 1e-6))
        res[f"{mode}-{layout}"] = (float(total), float(ref_loss), errs, set(ref) - set(errs))
    return res


def run(rank, world, init_file, out_file, device, with_hf):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # localhost, whatever the host name resolves to
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    group = dist.group.WORLD
    results = {}
    try:
        for name, c in cases(world, device).items():
            t0 = time.perf_counter()
            try:
                x = inputs(name, c)
                one = single(c, x, device) if rank == 0 else None
                got, every = sharded(c, x, device, group)
                results[name] = dict(case=c, inputs=x, single=one, sharded=got, d_sinks_ranks=every, error=None)
            except Exception:  # noqa: BLE001 - reported by the test of this case
                results[name] = dict(case=c, error=traceback.format_exc())
            if os.environ.get("SINKATTN_CP_TEST_TIMES"):
                print(f"rank {rank}: {name} {time.perf_counter() - t0:.2f} s", flush=True)
        results["__errors__"] = errors(group)
        results["__overlap__"] = overlap_events(group, device)
        results["__autocast__"] = autocast_dtypes(group, device)
        if with_hf:
            t0 = time.perf_counter()
            try:
                results["__hf__"] = hf_checks(group, device)
            except Exception:  # noqa: BLE001
                results["__hf__"] = traceback.format_exc()
            if os.environ.get("SINKATTN_CP_TEST_TIMES"):
                print(f"rank {rank}: HF {time.perf_counter() - t0:.2f} s", flush=True)
        if rank == 0:
            torch.save(results, out_file + ".tmp")
            os.replace(out_file + ".tmp", out_file)
    finally:
        dist.destroy_process_group()
