#!/usr/bin/env python3
"""Context-parallel scaling of sinkattn.jax on the GPUs of one host: all-to-all (Ulysses,
``sinkattn.jax.ulysses``) and ring (``sinkattn.jax.ring``) attention, forward + backward of a GPT-OSS-20B-like
attention layer (h_q 64, h_kv 8, d 64, learnable sinks, bf16, batch 1) at total contexts 32k, 128k and 512k split
over N devices (a 1-D mesh of the first N GPUs), full causal and sliding (window 127) layers.

Definitions (printed with the table):
- t_N: median wall time of one jitted step (forward + backward: dq, dk, dv, d_sinks) of the whole layer over N
  devices, the inputs already sequence-sharded (the ring's inputs in zig-zag order, --ring-layout).
- t_1(1/N): the same step of the fused op on ONE device doing exactly 1/N of the layer's work: full context, h_q/N
  query and h_kv/N KV heads (the same GQA ratio), no communication.
- efficiency = t_1(1/N) / t_N (100% = perfect scaling: N devices take as long as one device takes for its share).
- strong efficiency (contexts <= --strong-max-context) = t_1(whole layer) / (N * t_N).
- TFLOP/s per device = 3.5 * 4 * b * h_q * d * visible pairs / N / t_N (forward 4 b h d pairs, backward 2.5x).

Runs on any number of GPUs; on one GPU (N = 1) it is a smoke test of both modes. NVLink multicast stays off
(NCCL_NVLS_ENABLE=0, set here before JAX starts); XLA's latency-hiding scheduler is switched on
(--xla_gpu_enable_latency_hiding_scheduler=true, unless --no-lhs) so that the ring's transfers overlap its calls.
JAX's GPU backend does the communication through NCCL (all-to-all, collective-permute).

    python3 bench/bench_context_parallel.py                       # N = 2, 4, ... up to the GPUs present
    python3 bench/bench_context_parallel.py --devices 1 --contexts 32k   # one-GPU smoke test
"""

import argparse
import json
import os
import statistics
import sys
import time

from bench_util import context_label, parse_context, visible_pairs

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (the device machines require it), before JAX/NCCL


def _parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", default="auto",
                    help="comma list of device counts N (default: 2, 4, 8 up to the GPUs present; 1 if one GPU)")
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
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed steps after the compile run (none when that run took over budget-s / 2)")
    ap.add_argument("--budget-s", type=float, default=10.0, help="stop timing one configuration after this")
    ap.add_argument("--strong-max-context", type=int, default=131072,
                    help="also time the whole layer on one device up to this context (0: never)")
    ap.add_argument("--no-verify", action="store_true", help="skip the output check against one device")
    ap.add_argument("--no-lhs", action="store_true", help="leave XLA's latency-hiding scheduler at its default")
    ap.add_argument("--json", default=None, help="also write one JSON object per measurement to this file")
    return ap.parse_args(argv)


ARGS = _parse_args()
if not ARGS.no_lhs and "xla_gpu_enable_latency_hiding_scheduler" not in os.environ.get("XLA_FLAGS", ""):
    _lhs = "--xla_gpu_enable_latency_hiding_scheduler=true"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _lhs).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding  # noqa: E402

import sinkattn.jax as sj  # noqa: E402
from sinkattn.jax import ring  # noqa: E402
from sinkattn.jax.ulysses import ulysses_dot_product_attention  # noqa: E402


def _mask(layer, window):
    return dict(is_causal=True, local_window_size=(window, 0)) if layer == "sliding" else dict(is_causal=True)


def _inputs(shape_q, shape_kv, n_heads, sharding_qkv, sharding_s, seed):
    key = jax.random.PRNGKey(seed)
    kq, kk, kv, kg, ks = jax.random.split(key, 5)
    normal = lambda k, shape, sh: jax.jit(lambda k: jax.random.normal(k, shape, jnp.bfloat16), out_shardings=sh)(k)
    q = normal(kq, shape_q, sharding_qkv)
    k = normal(kk, shape_kv, sharding_qkv)
    v = normal(kv, shape_kv, sharding_qkv)
    g = normal(kg, shape_q, sharding_qkv)
    s = jax.jit(lambda k: jax.random.uniform(k, (n_heads,), jnp.float32, 0.0, 4.0), out_shardings=sharding_s)(ks)
    return q, k, v, s, g


def _step(attn):
    """jit(forward + backward): the loss reads out through the cotangent g; returns dq, dk, dv, d_sinks."""

    def loss(q, k, v, s, g):
        return jnp.sum(attn(q, k, v, s).astype(jnp.float32) * g.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))


def _time(fn, args):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))  # compile + first run
    compile_s = time.perf_counter() - t0
    # warm-up runs (the compile run above already ran once with NCCL set up: skipped for long configurations)
    for _ in range(ARGS.warmup if compile_s < ARGS.budget_s / 2 else 0):
        jax.block_until_ready(fn(*args))
    times, start = [], time.perf_counter()
    while len(times) < max(2, ARGS.iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        if len(times) >= 2 and time.perf_counter() - start > ARGS.budget_s:
            break
    return statistics.median(times), compile_s, len(times)


def _rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-6))


def main():
    devs = jax.devices()
    n_dev = len(devs)
    if ARGS.devices == "auto":
        counts = [n for n in (2, 4, 8, 16) if n <= n_dev] or [1]
    else:
        counts = [int(x) for x in ARGS.devices.split(",")]
    counts = [n for n in counts if n <= n_dev]
    contexts = [parse_context(c) for c in ARGS.contexts.split(",")]
    layers = ARGS.layers.split(",")
    modes = ARGS.modes.split(",")
    B, HQ, HKV, D, W = ARGS.batch, ARGS.heads, ARGS.kv_heads, ARGS.head_dim, ARGS.window
    print(f"jax {jax.__version__}, {n_dev} x {devs[0].device_kind}; NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"layer: b={B} h_q={HQ} h_kv={HKV} d={D} learnable sinks, bf16, causal / sliding window {W}; "
          f"N in {counts}, contexts {contexts}; ring layout {ARGS.ring_layout}")
    out_json = open(ARGS.json, "w") if ARGS.json else None
    rows = []
    single = SingleDeviceSharding(devs[0])
    ref_cache = {}

    def reference(L, layer, hq, hkv):
        """(t, compile s, iters) of the fused op on device 0 with hq / hkv heads at context L."""
        key = (L, layer, hq, hkv)
        if key not in ref_cache:
            q, k, v, s, g = _inputs((B, L, hq, D), (B, L, hkv, D), hq, single, single, seed=1)
            fn = _step(lambda q, k, v, s: sj.dot_product_attention(q, k, v, sinks=s, **_mask(layer, W)))
            ref_cache[key] = _time(fn, (q, k, v, s, g))
            del q, k, v, s, g
        return ref_cache[key]

    for N in counts:
        mesh = Mesh(np.array(devs[:N]), ("cp",))
        row_sh = NamedSharding(mesh, P(None, "cp", None, None))
        rep_sh = NamedSharding(mesh, P())
        for L in contexts:
            if L % (2 * N):
                print(f"skip context {L}: not divisible by 2N = {2 * N}")
                continue
            q, k, v, s, g = _inputs((B, L, HQ, D), (B, L, HKV, D), HQ, row_sh, rep_sh, seed=0)
            for layer in layers:
                mask = _mask(layer, W)
                flop = 3.5 * 4.0 * B * HQ * D * visible_pairs(L, W if layer == "sliding" else -1)
                hq_ref, hkv_ref = HQ // N, max(1, HKV // N)
                t_ref, c_ref, _ = reference(L, layer, hq_ref, hkv_ref)
                t_strong = None
                if N > 1 and L <= ARGS.strong_max_context:
                    t_strong = reference(L, layer, HQ, HKV)[0]
                for mode in modes:
                    if mode == "ulysses":
                        attn = lambda q, k, v, s: ulysses_dot_product_attention(
                            q, k, v, mesh=mesh, seq_axis="cp", sinks=s, **mask)
                        args = (q, k, v, s, g)
                    elif mode == "ring":
                        lay = ARGS.ring_layout
                        attn = lambda q, k, v, s: ring.ring_dot_product_attention(
                            q, k, v, mesh=mesh, seq_axis="cp", sinks=s, layout=lay, **mask)
                        # the model keeps its activations in the ring's order: permute once, outside the timing
                        perm = jax.jit(lambda x: ring.zigzag_permute(x, N, 1) if lay == "zigzag" else x,
                                       out_shardings=row_sh)
                        args = (perm(q), perm(k), perm(v), s, perm(g))
                    else:
                        raise SystemExit(f"unknown mode {mode!r}")
                    fn = _step(attn)
                    t, c, n_it = _time(fn, args)
                    err = None
                    if not ARGS.no_verify and L == contexts[0]:
                        # forward output against the fused op on one device (bf16: expect ~1e-2 at most)
                        want = jax.jit(lambda q, k, v, s: sj.dot_product_attention(q, k, v, sinks=s, **mask))(
                            *(jax.device_put(x, single) for x in (q, k, v, s)))
                        got = jax.jit(attn)(*args[:4])
                        if mode == "ring" and ARGS.ring_layout == "zigzag":
                            got = ring.zigzag_unpermute(jax.device_put(got, single), N, 1)
                        err = _rel(jax.device_put(got, single), want)
                        del want, got
                    row = dict(N=N, context=L, layer=layer, mode=mode, t_ms=t * 1e3, tflops_per_device=flop / N / t
                               / 1e12, t_ref_ms=t_ref * 1e3, efficiency=t_ref / t,
                               strong_efficiency=None if t_strong is None else t_strong / (N * t),
                               compile_s=c, iters=n_it, out_rel_err=err, ref_heads=(hq_ref, hkv_ref))
                    rows.append(row)
                    if out_json:
                        out_json.write(json.dumps(row) + "\n")
                        out_json.flush()
                    print(f"N={N} L={L} {layer:7s} {mode:7s} t={t * 1e3:9.2f} ms  t_1(1/N)={t_ref * 1e3:9.2f} ms  "
                          f"eff={100 * t_ref / t:5.1f}%  compile {c:.1f} s  iters {n_it}"
                          + ("" if err is None else f"  out err vs 1 device {err:.2e}"), flush=True)
                    del args, fn
            del q, k, v, s, g

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
    faster = {}
    for r in rows:
        faster.setdefault((r["N"], r["context"], r["layer"]), []).append((r["t_ms"], r["mode"]))
    for (n, L, layer), ts in faster.items():
        if len(ts) > 1:
            ts.sort()
            print(f"N={n} {context_label(L)} {layer}: {ts[0][1]} faster ({ts[0][0]:.2f} vs {ts[1][0]:.2f} ms)")
    if out_json:
        out_json.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
