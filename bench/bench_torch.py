#!/usr/bin/env python3
"""Baselines for bench/RESULTS.md: torch scaled_dot_product_attention (no sinks, its fastest backend) and
FlexAttention with the sink applied through its LSE (out * sigmoid(lse - sink), torch.compile'd), forward and
forward + backward, bf16, b=2, s=4096, causal, on the shapes of `sinkattn bench --backend cuda`:
GPT-OSS full layer (h_q 64, h_kv 8, d 64, sinks), GPT-OSS sliding layer (window 127), MHA (h 32, d 128).
FLOPs: forward 4 * b * h_q * d * visible pairs, backward 2.5x (forward + backward = 3.5x).
Times: CUDA events, median of `reps` after warm-up, inputs rotated over 3 sets."""
import math
import sys

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover
    flex_attention = None

SHAPES = [
    ("gpt-oss-full", 2, 4096, 64, 8, 64, -1, True),
    ("gpt-oss-sliding", 2, 4096, 64, 8, 64, 127, True),
    ("mha-d128", 2, 4096, 32, 32, 128, -1, False),
]


def visible_pairs(s, window):
    return sum(min(i + 1, window + 1) if window >= 0 else i + 1 for i in range(s))


def bench(fn, sets, reps=20, warmup=3):
    times = []
    for r in range(warmup + reps):
        args = sets[r % len(sets)]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(*args)
        e1.record()
        e1.synchronize()
        if r >= warmup:
            times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def main():
    dev = "cuda"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'shape':16s} {'method':22s} {'fwd ms':>8s} {'fwd TF/s':>9s} {'f+b ms':>8s} {'bwd TF/s':>9s}")
    flex = torch.compile(flex_attention) if flex_attention is not None else None
    for name, b, s, hq, hkv, d, win, sinks in SHAPES:
        fwd_flop = 4.0 * b * hq * d * visible_pairs(s, win)
        sets = []
        for _ in range(3):
            q = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(b, hq, s, d, device=dev, dtype=torch.bfloat16)
            sets.append((q, k, v, g))
        sink = torch.full((hq,), math.log(s), device=dev, dtype=torch.float32, requires_grad=sinks)

        def report(method, f_fwd, f_fb):
            tf = bench(f_fwd, sets)
            tfb = bench(f_fb, sets)
            tb = max(tfb - tf, 1e-6)
            print(f"{name:16s} {method:22s} {tf:8.3f} {fwd_flop / tf * 1e-9:9.1f} {tfb:8.3f} "
                  f"{2.5 * fwd_flop / tb * 1e-9:9.1f}", flush=True)

        # torch SDPA without sinks (causal; the window cannot be expressed without a dense mask, so the sliding
        # shape runs full causal here and is marked as such).
        def sdpa_fwd(q, k, v, g):
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)

        def sdpa_fb(q, k, v, g):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)
            o.backward(g)

        try:
            report("sdpa (no sink)" + (" causal!" if win >= 0 else ""), sdpa_fwd, sdpa_fb)
        except Exception as e:  # noqa: BLE001
            print(f"{name:16s} sdpa failed: {e}")

        if flex is None:
            print("flex_attention not available")
            continue

        def mask_mod(bb, hh, qi, kj):
            m = qi >= kj
            if win >= 0:
                m = m & (qi - kj <= win)
            return m

        block_mask = create_block_mask(mask_mod, None, None, s, s, device=dev)

        def flex_sink(q, k, v):
            o, lse = flex(q, k, v, block_mask=block_mask, enable_gqa=hkv != hq, return_lse=True)
            # softmax with a sink: out * exp(lse) / (exp(lse) + exp(sink)) = out * sigmoid(lse - sink)
            return o * torch.sigmoid(lse - sink.view(1, hq, 1)).unsqueeze(-1).to(o.dtype)

        def flex_fwd(q, k, v, g):
            with torch.no_grad():
                return flex_sink(q, k, v)

        def flex_fb(q, k, v, g):
            flex_sink(q, k, v).backward(g)

        try:
            report("flex + sink via lse", flex_fwd, flex_fb)
        except Exception as e:  # noqa: BLE001
            print(f"{name:16s} flex failed: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
