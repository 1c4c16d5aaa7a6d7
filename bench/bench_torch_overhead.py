#!/usr/bin/env python3
"""Host time that torch.ops.sinkattn.fwd / bwd (and the Python API around them) add to the C ABI call they wrap.

Tiny shapes (b=1, s=1, h=1, d=8, learnable sinks, causal), so that the work itself is negligible; per-call host time
(time.perf_counter_ns around batches of calls after warm-up, no device synchronisation inside the timed calls; the
rows are interleaved batch by batch, and each prints the median and the minimum over its batches, so that a busy
machine shifts all rows alike) of:
  ctypes no-op        a ctypes call of sinkattn_params_size (the cost of calling C from Python at all)
  C ABI               size query + sinkattn_forward / sinkattn_backward through ctypes on prepared tensors
  op                  torch.ops.sinkattn.fwd / bwd (dispatcher, argument boxing, output and workspace allocation)
  flash_attn_func     the Python API (argument checks, sink upcast), without and with autograd (forward + backward)
  op .default ...     the op's time split: without the packet's overload resolution, below the autograd kernel (the
                      dispatcher from Python), the CPU / CUDA kernel alone (redispatched from Python: argument
                      conversion, stable-ABI boxing, the C++ body), and three allocations. The autograd kernel is
                      the formula registered from Python (torch.library.register_autograd, python/sinkattn/torch/_ops.py)
  custom_op + ctypes  the other binding route, for the record: a torch.library.custom_op in Python whose body fills
                      sinkattn_params_t through ctypes and makes the same C ABI call (forward only, no fake kernel)
  floor op ...        with --floor: torch.ops.sinkattn_floor.fwd / bwd (bench/torch_dispatch_floor.cpp, compiled at start
                      against this PyTorch): operators of the same schemas on PyTorch's C++ API whose kernels only
                      allocate the outputs: what PyTorch charges such an operator before any work
The op's overhead is  op - (C ABI - 2 x ctypes no-op)  (the C ABI line pays two ctypes calls), from the medians and
from the minima.
Usage: bench_torch_overhead.py [--device cpu|cuda] [--iters N] [--threads N (CPU backend threads, default torch's)]
                               [--floor]"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sinkattn.torch as st  # noqa: E402
import torch_cabi  # noqa: E402


def timed_rows(rows, iters, batches=20, warmup=200):
    """{name: (median, min)} us per call of each (name, fn, calls) row: `batches` rounds, each timing one batch of
    calls / batches calls of every row in turn (interleaved, so that load on the machine hits all rows alike)."""
    for _, fn, _ in rows:
        for _ in range(warmup):
            fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    per = {name: [] for name, _, _ in rows}
    for _ in range(batches):
        for name, fn, calls in rows:
            m = max(1, calls // batches)
            t0 = time.perf_counter_ns()
            for _ in range(m):
                fn()
            per[name].append((time.perf_counter_ns() - t0) / m / 1000.0)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {name: (statistics.median(v), min(v)) for name, v in per.items()}


def load_floor(dev):
    """Compiles and loads bench/torch_dispatch_floor.cpp against this PyTorch (torch.utils.cpp_extension)."""
    from torch.utils import cpp_extension
    cuda = dev == "cuda"
    build = os.environ.get("SINKATTN_FLOOR_BUILD", "/tmp/sinkattn_dispatch_floor")
    os.makedirs(build, exist_ok=True)
    cpp_extension.load(name="sinkattn_dispatch_floor",
                       sources=[os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_dispatch_floor.cpp")],
                       extra_cflags=["-O2"] + (["-DSINKATTN_FLOOR_CUDA"] if cuda else []), with_cuda=cuda,
                       is_python_module=False, build_directory=build, verbose=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--floor", action="store_true", help="also time bench/torch_dispatch_floor.cpp's operators")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
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

    fwd_handle = fwd_default._handle
    bwd_handle = torch.ops.sinkattn.bwd.default._handle
    rows = [
        ("ctypes no-op", lambda: lib.sinkattn_params_size(), n),
        ("C ABI forward", lambda: torch_cabi.call(lib, pf), n),
        ("op forward", lambda: torch.ops.sinkattn.fwd(*fwd_args), n),
        # where the op's time goes: the overload without the packet's resolution, the same below the autograd
        # kernel (the dispatcher from Python), the backend kernel alone (redispatched from Python: conversion of the
        # arguments, boxing through the stable ABI, the C++ body), and three output allocations from Python
        ("  op .default", lambda: fwd_default(*fwd_args), n),
        ("  op .default below autograd", lambda: below_autograd(*fwd_args), n),
        ("  op backend kernel only", lambda: fwd_handle.redispatch_boxed(backend_keys, *fwd_args), n),
        ("  3 x torch.empty", lambda: (torch.empty_like(q), torch.empty_like(lse), torch.empty(256, device=dev)), n),
        ("flash_attn_func (no grad)", lambda: st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks), n),
        ("custom_op + ctypes forward", lambda: probe(q, k, v, sinks), n // 4),
        ("C ABI backward", lambda: torch_cabi.call(lib, pb, backward=True), n),
        ("op backward", lambda: torch.ops.sinkattn.bwd(*bwd_args), n),
        ("  op backward backend kernel only", lambda: bwd_handle.redispatch_boxed(backend_keys, *bwd_args), n),
        ("flash_attn_func fwd+bwd (autograd)", fb, n // 4),
    ]
    if a.floor:
        load_floor(dev)
        rows += [("floor op forward (no work)", lambda: torch.ops.sinkattn_floor.fwd(*fwd_args), n),
                 ("floor op backward (no work)", lambda: torch.ops.sinkattn_floor.bwd(*bwd_args), n)]
    t = timed_rows(rows, n)
    print(f"torch {torch.__version__}, device {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}), "
          f"{torch.get_num_threads()} threads, {n} calls per row; host time per "
          "call, median / min over 20 batches")
    for name, _, _ in rows:
        med, mn = t[name]
        print(f"  {name:36s} {med:8.2f} {mn:8.2f} us")
    for i, stat in enumerate(("median", "min")):
        noop = t["ctypes no-op"][i]
        for pas in ("forward", "backward"):
            over = t[f"op {pas}"][i] - (t[f"C ABI {pas}"][i] - 2 * noop)
            print(f"  op {pas} overhead over the C ABI call ({stat}): {over:6.2f} us (limit 15)")
        api = t["flash_attn_func (no grad)"][i] - (t["C ABI forward"][i] - 2 * noop)
        print(f"  flash_attn_func (no grad) over the C ABI forward ({stat}): {api:6.2f} us")
        if a.floor:
            for pas in ("forward", "backward"):
                print(f"  op {pas} above the floor op ({stat}): {t[f'op {pas}'][i] - t[f'floor op {pas} (no work)'][i]:6.2f}"
                      " us")
    del keep_f, keep_b


if __name__ == "__main__":
    main()
