#!/usr/bin/env python3
"""Context-parallel scaling of sinkattn.torch.distributed on the GPUs of one host: all-to-all (``ulysses_attention``)
and ring (``ring_attention``, zig-zag layout) over torch.distributed (NCCL), forward + backward of a
GPT-OSS-20B-like attention layer (h_q 64, h_kv 8, d 64, learnable sinks, bf16, batch 1) at total contexts 32k,
128k and 512k split over N GPUs, full causal and sliding (window 127) layers: the layer and sizes of
bench/bench_context_parallel.py (the JAX version), so the two tables compare.

Definitions (printed with the table):
- t_N: median wall time of one step (forward + backward: dq, dk, dv, d_sinks all-reduced) of the whole layer over
  N ranks (one process per GPU), the inputs already sequence-sharded (the ring's in zig-zag order); the slowest
  rank's time (max over the ranks, each step between two barriers).
- t_1(1/N): the same step of the fused op (sinkattn.torch.dot_product_attention) on ONE GPU doing exactly 1/N of
  the layer's work: full context, h_q/N query and h_kv/N KV heads (the same GQA ratio), no communication.
- efficiency = t_1(1/N) / t_N (100% = perfect scaling); strong efficiency (contexts <= --strong-max-context) =
  t_1(whole layer) / (N * t_N).
- TFLOP/s per GPU = 3.5 * 4 * b * h_q * d * visible pairs / N / t_N (forward 4 b h d pairs, backward 2.5x).

The script starts its own processes (torch.multiprocessing, one per GPU, NCCL over a localhost TCP port) for each N;
no torchrun needed. On one GPU (N = 1) both modes run on a group of one (no communication) next to the
single-device baseline. NVLink multicast stays off (NCCL_NVLS_ENABLE=0, set here before NCCL starts).

    python3 bench/bench_context_parallel_torch.py                         # N = 2, 4, ... up to the GPUs present
    python3 bench/bench_context_parallel_torch.py --devices 1 --contexts 32k    # one GPU: the baseline
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

from bench_util import context_label, parse_context, visible_pairs

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (the device machines require it), before NCCL starts


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="auto",
                    help="comma list of GPU counts N (default: 2, 4, 8 up to the GPUs present; 1 if one GPU)")
    ap.add_argument("--contexts", default="32k,128k,512k", help="total context lengths (k = 1024)")
    ap.add_argument("--layers", default="full,sliding", help="full (causal) and/or sliding")
    ap.add_argument("--modes", default="ulysses,ring")
    ap.add_argument("--ring-layout", default="zigzag", choices=("zigzag", "contiguous"))
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--window", type=int, default=127)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5, help="timed steps at most (at least 2)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=10.0, help="stop timing one configuration after this")
    ap.add_argument("--strong-max-context", type=int, default=131072,
                    help="also time the whole layer on one GPU up to this context (0: never)")
    ap.add_argument("--no-verify", action="store_true", help="skip the output check against one GPU")
    ap.add_argument("--json", default=None, help="also write one JSON object per measurement to this file")
    return ap.parse_args(argv)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _window(layer, w):
    return (w, 0) if layer == "sliding" else (-1, -1)


def _worker(rank, world, port, args, rows_out):
    import torch
    import torch.distributed as dist

    import sinkattn.torch as st
    import sinkattn.torch.distributed as scp

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)
    group = dist.group.WORLD
    B, HQ, HKV, D, W = args.batch, args.heads, args.kv_heads, args.head_dim, args.window
    contexts = [parse_context(c) for c in args.contexts.split(",")]
    ref_cache = {}

    def timed(step):
        """(median max-over-ranks seconds, iterations) of step() between barriers."""
        for _ in range(args.warmup + 1):
            step()
        torch.cuda.synchronize()
        times, start = [], time.perf_counter()
        while len(times) < max(2, args.iters):
            dist.barrier(group=group, device_ids=[rank])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            t = torch.tensor([time.perf_counter() - t0], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            times.append(float(t))
            if len(times) >= 2 and time.perf_counter() - start > args.budget_s:
                break
        return statistics.median(times), len(times)

    def randn(shape, seed):
        g = torch.Generator(device=dev).manual_seed(seed)
        return torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16)

    def reference(L, layer, hq, hkv):
        """One GPU (rank 0): the fused op's step with hq / hkv heads at context L."""
        key = (L, layer, hq, hkv)
        if key not in ref_cache:
            q = randn((B, L, hq, D), 1).requires_grad_()
            k = randn((B, L, hkv, D), 2).requires_grad_()
            v = randn((B, L, hkv, D), 3).requires_grad_()
            s = torch.rand(hq, device=dev).mul_(4).requires_grad_()
            g = randn((B, L, hq, D), 4)

            def step():
                out = st.flash_attn_func(q, k, v, causal=True, window_size=_window(layer, W), learnable_sink=s)
                torch.autograd.grad(out, (q, k, v, s), g)

            for _ in range(args.warmup + 1):
                step()
            torch.cuda.synchronize()
            times, start = [], time.perf_counter()
            while len(times) < max(2, args.iters):
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                if len(times) >= 2 and time.perf_counter() - start > args.budget_s:
                    break
            ref_cache[key] = statistics.median(times)
            del q, k, v, s, g
            torch.cuda.empty_cache()
        return ref_cache[key]

    rows = []
    for L in contexts:
        if L % (2 * world):
            if rank == 0:
                print(f"skip context {L}: not divisible by 2N = {2 * world}", flush=True)
            continue
        for layer in args.layers.split(","):
            flop = 3.5 * 4.0 * B * HQ * D * visible_pairs(L, W if layer == "sliding" else -1)
            hq_ref, hkv_ref = HQ // world, max(1, HKV // world)
            t_ref = t_strong = None
            if rank == 0:
                t_ref = reference(L, layer, hq_ref, hkv_ref)
                if world > 1 and L <= args.strong_max_context:
                    t_strong = reference(L, layer, HQ, HKV)
            dist.barrier(group=group, device_ids=[rank])
            for mode in args.modes.split(","):
                layout = args.ring_layout if mode == "ring" else "contiguous"
                fn = scp.ring_attention if mode == "ring" else scp.ulysses_attention
                # this rank's block of the global tensors (the same seeds on every rank), in the mode's layout
                shard = lambda x: scp.shard_sequence(x, group, dim=1, layout=layout).clone()  # frees the global
                q = shard(randn((B, L, HQ, D), 11)).requires_grad_()
                k = shard(randn((B, L, HKV, D), 12)).requires_grad_()
                v = shard(randn((B, L, HKV, D), 13)).requires_grad_()
                g = shard(randn((B, L, HQ, D), 14))
                torch.cuda.empty_cache()
                s = torch.linspace(0.0, 4.0, HQ, device=dev).requires_grad_()
                kw = dict(group=group, learnable_sink=s, causal=True, window_size=_window(layer, W), layout=layout)

                def step(q=q, k=k, v=v, g=g):  # bound now: the names are deleted below to free the blocks
                    out = fn(q, k, v, **kw)
                    torch.autograd.grad(out, (q, k, v, s), g)

                t, n_it = timed(step)
                err = None
                if not args.no_verify and L == contexts[0]:
                    with torch.no_grad():
                        got = scp.gather_sequence(fn(q, k, v, **kw), group, dim=1, layout=layout)
                        if rank == 0:
                            qf, kf, vf = randn((B, L, HQ, D), 11), randn((B, L, HKV, D), 12), randn((B, L, HKV, D), 13)
                            want = st.flash_attn_func(qf, kf, vf, causal=True, window_size=_window(layer, W),
                                                      learnable_sink=s)
                            err = float((got.float() - want.float()).abs().max() / want.float().abs().max())
                            del qf, kf, vf, want
                        del got
                del q, k, v, g, step
                torch.cuda.empty_cache()
                if rank == 0:
                    row = dict(N=world, context=L, layer=layer, mode=mode, t_ms=t * 1e3,
                               tflops_per_device=flop / world / t / 1e12, t_ref_ms=t_ref * 1e3, efficiency=t_ref / t,
                               strong_efficiency=None if t_strong is None else t_strong / (world * t), iters=n_it,
                               out_rel_err=err, ref_heads=(hq_ref, hkv_ref))
                    rows.append(row)
                    print(f"N={world} L={L} {layer:7s} {mode:7s} t={t * 1e3:9.2f} ms  t_1(1/N)={t_ref * 1e3:9.2f} ms"
                          f"  eff={100 * t_ref / t:5.1f}%  iters {n_it}"
                          + ("" if err is None else f"  out err vs 1 GPU {err:.2e}"), flush=True)
    if rank == 0:
        with open(rows_out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    args = _parse_args()
    import torch
    import torch.multiprocessing as mp

    n_dev = torch.cuda.device_count()
    if n_dev == 0:
        raise SystemExit("bench_context_parallel_torch: needs CUDA GPUs")
    if args.devices == "auto":
        counts = [n for n in (2, 4, 8, 16) if n <= n_dev] or [1]
    else:
        counts = [int(x) for x in args.devices.split(",") if int(x) <= n_dev]
    print(f"torch {torch.__version__}, {n_dev} x {torch.cuda.get_device_name(0)}; NCCL_NVLS_ENABLE="
          f"{os.environ['NCCL_NVLS_ENABLE']}; layer: b={args.batch} h_q={args.heads} h_kv={args.kv_heads} "
          f"d={args.head_dim} learnable sinks, bf16, causal / sliding window {args.window}; N in {counts}, contexts "
          f"{args.contexts}; ring layout {args.ring_layout}", flush=True)
    rows = []
    out_json = open(args.json, "w") if args.json else None
    for N in counts:
        tmp = f"/tmp/bench_cp_torch_{os.getpid()}_{N}.json"
        mp.start_processes(_worker, args=(N, _free_port(), args, tmp), nprocs=N, start_method="spawn")
        with open(tmp) as f:
            got = json.load(f)
        os.remove(tmp)
        rows += got
        if out_json:
            for r in got:
                out_json.write(json.dumps(r) + "\n")
            out_json.flush()
    print()
    print("| N | context | layer | mode | fwd+bwd ms | TFLOP/s per GPU | t_1(1/N) ms | efficiency | strong eff. |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        se = "" if r["strong_efficiency"] is None else f"{100 * r['strong_efficiency']:.1f}%"
        print(f"| {r['N']} | {context_label(r['context'])} | {r['layer']} | {r['mode']} | {r['t_ms']:.2f} | "
              f"{r['tflops_per_device']:.1f} | {r['t_ref_ms']:.2f} | {100 * r['efficiency']:.1f}% | {se} |")
    print()
    print("t_1(1/N): one GPU, the same layer with h_q/N and h_kv/N heads (1/N of the work), no communication; "
          "efficiency = t_1(1/N) / t_N; strong eff. = t_1(whole layer) / (N t_N).")
    if out_json:
        out_json.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
