#!/usr/bin/env python3
"""Host time that torch.ops.sinkattn.fwd / bwd (and the Python API around them) add to the C ABI call they wrap.

Tiny shapes (b=1, s=1, h=1, d=8, learnable sinks, causal), so that the work itself is negligible; per-call host time
(time.perf_counter_ns around each call, mean after warm-up, no device synchronisation inside the timed calls) of:
  ctypes no-op        a ctypes call of sinkattn_params_size (the cost of calling C from Python at all)
  C ABI               size query + sinkattn_forward / sinkattn_backward through ctypes on prepared tensors
  op                  torch.ops.sinkattn.fwd / bwd (dispatcher, argument boxing, output and workspace allocation)
  flash_attn_func     the Python API (argument checks, sink upcast), without and with autograd (forward + backward)
  op .default ...     the op's time split: without the packet's overload resolution, below the autograd kernel, the
                      CPU / CUDA kernel alone (dispatcher, boxing, the C++ body), and three allocations
  custom_op + ctypes  the other binding route, for the record: a torch.library.custom_op in Python whose body fills
                      sinkattn_params_t through ctypes and makes the same C ABI call (forward only, no fake kernel)
The op's overhead is  op - (C ABI - 2 x ctypes no-op)  (the C ABI line pays two ctypes calls).
Usage: bench_torch_overhead.py [--device cpu|cuda] [--iters N]"""
import argparse
import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sinkattn.torch as st  # noqa: E402
import torch_cabi  # noqa: E402


def timed(fn, iters, warmup=200):
    for _ in range(warmup):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    total = 0
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        total += time.perf_counter_ns() - t0
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return total / iters / 1000.0  # us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=5000)
    a = ap.parse_args()
    dev, n = a.device, a.iters
    lib = torch_cabi.library()
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    q = torch.randn(1, 1, 1, 8, device=dev, dtype=dt)
    k, v = torch.randn_like(q), torch.randn_like(q)
    sinks = torch.zeros(1, device=dev)
    out, lse = torch.empty_like(q), torch.empty(1, 1, 1, device=dev)
    d_out = torch.randn_like(q)
    dq, dk, dv, ds = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(sinks)
    pf, keep_f = torch_cabi.params(lib, q=q, k=k, v=v, sinks=sinks, out=out, softmax_lse=lse)
    pb, keep_b = torch_cabi.params(lib, backward=True, q=q, k=k, v=v, sinks=sinks, out=out, softmax_lse=lse,
                                   d_out=d_out, dq=dq, dk=dk, dv=dv, d_sinks=ds)
    fwd_args = (q, k, v, sinks, None, None, None, None, None, None, None, 1, 1, 2, None, -1, 0, 0, 0.0, None, False,
                False, 0)
    o, l, r = torch.ops.sinkattn.fwd(*fwd_args)
    bwd_args = (d_out, q, k, v, o, l, None, sinks, None, None, None, None, None, None, 1, 1, 2, None, -1, 0, 0, 0.0, r,
                False, False)
    qg, kg, vg, sg = (x.clone().requires_grad_(True) for x in (q, k, v, sinks))

    def fb():
        st.flash_attn_func(qg, kg, vg, causal=True, learnable_sink=sg).backward(d_out)

    @torch.library.custom_op("sinkattn_route_probe::fwd", mutates_args=())
    def probe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = q.new_empty(q.shape)
        l = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        pp, keep = torch_cabi.params(lib, q=q, k=k, v=v, sinks=sinks, out=o, softmax_lse=l)
        torch_cabi.call(lib, pp)
        return o, l

    fwd_default = torch.ops.sinkattn.fwd.default
    backend_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA if dev == "cuda" else torch._C.DispatchKey.CPU)

    def below_autograd(*args):
        with torch._C._AutoDispatchBelowAutograd():
            return fwd_default(*args)

    rows = [
        ("ctypes no-op", timed(lambda: lib.sinkattn_params_size(), n)),
        ("C ABI forward", timed(lambda: torch_cabi.call(lib, pf), n)),
        ("op forward", timed(lambda: torch.ops.sinkattn.fwd(*fwd_args), n)),
        # where the op's time goes: the overload without the packet's resolution, the same below the autograd
        # kernel (what the API calls without grad), the backend kernel alone (dispatcher + boxing + the C++ body),
        # and the output allocations the body makes (out, lse, workspace-sized)
        ("  op .default", timed(lambda: fwd_default(*fwd_args), n)),
        ("  op .default below autograd", timed(lambda: below_autograd(*fwd_args), n)),
        ("  op backend kernel only", timed(lambda: fwd_default.redispatch(backend_keys, *fwd_args), n)),
        ("  3 x torch.empty", timed(lambda: (torch.empty_like(q), torch.empty_like(lse), torch.empty(256, device=dev)), n)),
        ("flash_attn_func (no grad)", timed(lambda: st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks), n)),
        ("custom_op + ctypes forward", timed(lambda: probe(q, k, v, sinks), n)),
        ("C ABI backward", timed(lambda: torch_cabi.call(lib, pb, backward=True), n)),
        ("op backward", timed(lambda: torch.ops.sinkattn.bwd(*bwd_args), n)),
        ("flash_attn_func fwd+bwd (autograd)", timed(fb, n // 4)),
    ]
    print(f"torch {torch.__version__}, device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), "
          f"{torch.get_num_threads()} threads, {n} calls, mean host time per call")
    for name, us in rows:
        print(f"  {name:36s} {us:8.2f} us")
    t = dict(rows)
    noop = t["ctypes no-op"]
    for pas in ("forward", "backward"):
        over = t[f"op {pas}"] - (t[f"C ABI {pas}"] - 2 * noop)
        print(f"  op {pas} overhead over the C ABI call: {over:6.2f} us (limit 15)")
    print(f"  flash_attn_func (no grad) over the C ABI forward: {t['flash_attn_func (no grad)'] - (t['C ABI forward'] - 2 * noop):6.2f} us")
    del keep_f, keep_b


if __name__ == "__main__":
    main()
