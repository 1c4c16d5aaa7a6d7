#!/usr/bin/env python3
"""Anchors for bench/RESULTS.md: torch scaled_dot_product_attention (no sinks, its fastest backend) and
FlexAttention with the sink applied through its LSE (out * sigmoid(lse - sink), torch.compile'd), forward and
forward + backward, bf16, b=2, s=4096, causal, on the shapes of `sinkattn bench --backend cuda`:
GPT-OSS full layer (h_q 64, h_kv 8, d 64, sinks), GPT-OSS sliding layer (window 127), MHA (h 32, d 128), and the
rows issue 12 adds: head dim 256 (h 16) and one sequence of 16384 tokens (b 1) of the GPT-OSS full and MHA layers.
FlexAttention runs on the three layers only (its compilation per shape is the longest part of a run).
Usage: bench_torch.py [NAME-SUBSTRING ...] [--json FILE] [--methods LIST] [--fa4-site DIR] [--timing HOW] (default:
every shape, every method, per-call timing). --json also writes the rows as JSON (the GPU, torch's version, the UTC time, the command, one object
per shape and method; rewritten after every layer), the input of tools/results_dashboard.py, which builds
bench/RESULTS.md. --methods: a comma list of sdpa, flex, sinkattn (its torch API), cabi (its operators against the
C ABI), fa4 (default: all of them). --fa4-site DIR: FlashAttention-4 installed with `pip install --target DIR`
(tools/fa4-install.sh: /tmp/fa4-site), put on sys.path with DIR/nvidia_cutlass_dsl/dsl_packages (the package's .pth
file is not read from a --target folder).
FlashAttention-4 (flash-attn-4: `flash_attn.cute.flash_attn_func(q, k, v, causal=True, window_size=(127, 0) on the
sliding layer, learnable_sink=<fp32 [h_q] sink logits>, deterministic=...)`, which returns (out, lse)) on every
layer, timed as sinkattn's torch API rows are (forward, forward + backward, forward + deterministic backward, through
autograd). Where a call is turned down, its row keeps the reason ("refused: <FA4's message>", or "failed: <error>"
for any other exception; fwd_error / bwd_error / det_error) and the others go on; without the package every "fa4"
row says why ("unavailable").
With the sinkattn PyTorch operators installed (sinkattn.torch), in the same run: sinkattn through its PyTorch API
(flash_attn_func, autograd; the deterministic backward too), and the operators torch.ops.sinkattn.fwd / bwd against
the C ABI calls they wrap (sinkattn_forward / sinkattn_backward through ctypes on the same tensors and stream,
bench/torch_cabi.py): the "op / C ABI" line gives the ratio of their times twice: "pipelined", `reps` calls issued
back to back between two CUDA events (as a training step issues them: the host runs ahead of the GPU, so what the
ratio shows is what the op adds on the GPU: extra kernels, copies, a host cost that outlasts the GPU's), and "after
sync", each call timed alone after a synchronisation (the host time of each call counts: issue 11 bounds it
separately, at 15 us).
FLOPs: forward 4 * b * h_q * d * visible pairs, backward 2.5x (forward + backward = 3.5x).
Times: CUDA events, inputs rotated over 3 sets, after warm-up (FA4 compiles its kernels in the warm-up calls).
--timing per-call (the default): each call timed alone after a synchronisation, the median of `reps` (the host
time of a call counts where it exceeds nothing queued before it: FlashAttention-4's host path costs ~0.2 ms a call);
--timing pipelined: `reps` calls issued back to back between two CUDA events (bench_pipelined), as a training step
issues them, so the rows compare the GPU work of the methods. Forward + backward calls set the inputs' .grad to
None first (no gradient accumulation kernels in the timing). The JSON records which."""
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from bench_util import visible_pairs

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover
    flex_attention = None

SHAPES = [
    ("gpt-oss-full", 2, 4096, 64, 8, 64, -1, True),
    ("gpt-oss-sliding", 2, 4096, 64, 8, 64, 127, True),
    ("mha-d128", 2, 4096, 32, 32, 128, -1, False),
    ("hd256", 2, 4096, 16, 16, 256, -1, False),
    ("gpt-oss-full-16k", 1, 16384, 64, 8, 64, -1, True),
    ("mha-d128-16k", 1, 16384, 32, 32, 128, -1, False),
]
FLEX_SHAPES = ("gpt-oss-full", "gpt-oss-sliding", "mha-d128")
METHODS = ("sdpa", "flex", "sinkattn", "cabi", "fa4")
ROWS = []  # what --json writes: one dict per (shape, method)
TIMING = {"how": "per-call"}  # --timing: which timer the method rows use (timed())


def random_sets(q_shape, kv_shape, dev, n=3):
    """n sets of bf16 (q, k, v, d_out), q / k / v requiring grad, to rotate the inputs of timed calls over."""
    mk = lambda shape, grad: torch.randn(*shape, device=dev, dtype=torch.bfloat16, requires_grad=grad)
    return [(mk(q_shape, True), mk(kv_shape, True), mk(kv_shape, True), mk(q_shape, False)) for _ in range(n)]


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


def timed(fn, sets):
    """ms per call of fn on the rotated sets, by the timer --timing chose."""
    return bench_pipelined(fn, sets) if TIMING["how"] == "pipelined" else bench(fn, sets)


def no_grads(q, k, v):
    """Drop the inputs' gradients before a timed backward (else autograd adds each new one to the old)."""
    q.grad = k.grad = v.grad = None


def bench_pipelined(fn, sets, reps=20, warmup=3):
    """ms per call of `reps` calls issued back to back (inputs rotated) between two CUDA events, after warm-up."""
    for r in range(warmup):
        fn(*sets[r % len(sets)])
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for r in range(reps):
        fn(*sets[r % len(sets)])
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = list(argv)
    json_path = pop_option(argv, "--json")
    methods = (pop_option(argv, "--methods") or ",".join(METHODS)).split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"bench_torch.py: unknown methods {unknown} (known: {', '.join(METHODS)})")
    fa4_site = pop_option(argv, "--fa4-site")
    TIMING["how"] = pop_option(argv, "--timing") or "per-call"
    if TIMING["how"] not in ("per-call", "pipelined"):
        raise SystemExit(f"bench_torch.py: --timing per-call or pipelined, not {TIMING['how']}")
    if fa4_site:
        add_fa4_site(fa4_site)
    dev = "cuda"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print(f"{'shape':16s} {'method':22s} {'fwd ms':>8s} {'fwd TF/s':>9s} {'f+b ms':>8s} {'bwd TF/s':>9s}")
    flex = torch.compile(flex_attention) if flex_attention is not None and "flex" in methods else None
    only = argv
    cmd = [a for i, a in enumerate(command) if a != "--json" and (i == 0 or command[i - 1] != "--json")]

    def write_json():  # after every layer, so that a run stopped by a time limit keeps the rows it measured
        if not json_path:
            return
        with open(json_path, "w") as f:
            json.dump(dict(tool="bench_torch.py", command=" ".join(["python3 bench/bench_torch.py"] + cmd), date=date,
                           gpu=torch.cuda.get_device_name(), torch=torch.__version__, methods=methods,
                           timing=TIMING["how"],
                           versions=package_versions(), rows=ROWS), f, indent=1)
            f.write("\n")

    for name, b, s, hq, hkv, d, win, sinks in SHAPES:
        if only and not any(o in name for o in only):
            continue
        fwd_flop = 4.0 * b * hq * d * visible_pairs(s, win)
        sets = random_sets((b, hq, s, d), (b, hkv, s, d), dev)  # BHSD, as SDPA and FlexAttention take them
        sink = torch.full((hq,), math.log(s), device=dev, dtype=torch.float32, requires_grad=sinks)

        # torch SDPA without sinks (causal; the window cannot be expressed without a dense mask, so the sliding
        # shape runs full causal here and is marked as such). No deterministic pass: SDPA has no such switch.
        if "sdpa" in methods:
            autograd_rows(name, "sdpa (no sink)" + (" causal!" if win >= 0 else ""), "sdpa",
                          lambda q, k, v, det: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                              enable_gqa=hkv != hq),
                          sets, fwd_flop, "no sink" + (", full causal (no window)" if win >= 0 else ""), det=False)

        if flex is None and "flex" in methods:
            print("flex_attention not available")
        if flex is not None and name in FLEX_SHAPES:
            def mask_mod(bb, hh, qi, kj):
                m = qi >= kj
                if win >= 0:
                    m = m & (qi - kj <= win)
                return m

            block_mask = create_block_mask(mask_mod, None, None, s, s, device=dev)

            def flex_sink(q, k, v, det):
                o, lse = flex(q, k, v, block_mask=block_mask, enable_gqa=hkv != hq, return_lse=True)
                # softmax with a sink: out * exp(lse) / (exp(lse) + exp(sink)) = out * sigmoid(lse - sink)
                return o * torch.sigmoid(lse - sink.view(1, hq, 1)).unsqueeze(-1).to(o.dtype)

            autograd_rows(name, "flex + sink via lse", "flex_sink", flex_sink, sets, fwd_flop,
                          "sink through the LSE, torch.compile", det=False)

        if "sinkattn" in methods or "cabi" in methods:
            try:
                sinkattn_rows(name, b, s, hq, hkv, d, win, sinks, fwd_flop, api="sinkattn" in methods,
                              cabi="cabi" in methods)
            except Exception as e:  # noqa: BLE001
                print(f"{name:16s} sinkattn failed: {type(e).__name__}: {e}")
        if "fa4" in methods:
            fa4_rows(name, b, s, hq, hkv, d, win, sinks, fwd_flop)
        write_json()
    write_json()
    return 0


def pop_option(argv, flag):
    """The value of `flag VALUE` in argv (both removed), or None."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"bench_torch.py: {flag} needs a value")
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def add_fa4_site(site):
    """FlashAttention-4 installed with `pip install --target site`: the folder and the CuTe DSL's own package folder
    (which nvidia_cutlass_dsl's .pth file would add in a real site-packages) go first on sys.path."""
    site = os.path.abspath(site)
    for p in (os.path.join(site, "nvidia_cutlass_dsl", "dsl_packages"), site):
        if p not in sys.path:
            sys.path.insert(0, p)


def package_versions():
    """The versions of the packages the rows came from (those installed)."""
    from importlib import metadata

    out = {}
    for name in ("sinkattn", "flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def why(e):
    """An exception as a row records it: "refused: <message>" where the library turned the call down (its argument
    checks raise AssertionError, NotImplementedError, ValueError or TypeError), else "failed: <type>: <message>"."""
    msg = " ".join(str(e).split())[:300] or type(e).__name__
    if isinstance(e, (AssertionError, NotImplementedError, ValueError, TypeError)):
        return f"refused: {msg}"
    return f"failed: {type(e).__name__}: {msg}"


def autograd_rows(name, label, key, call, sets, fwd_flop, note, det=True):
    """One row of a method called through torch autograd: `call(q, k, v, deterministic)` -> out. Forward (no grad),
    forward + backward and (det) forward + deterministic backward, each timed by timed() on `sets`; backward =
    (forward + backward) - forward. A pass that raises leaves its reason in the row (fwd_error, bwd_error, det_error: why()),
    the passes after a failed forward are not run, and the row is kept."""
    row = dict(shape=name, method=key, note=note)
    ROWS.append(row)

    def fwd(q, k, v, g):
        with torch.no_grad():
            return call(q, k, v, False)

    def fb(q, k, v, g):
        no_grads(q, k, v)
        call(q, k, v, False).backward(g)

    def fb_det(q, k, v, g):
        no_grads(q, k, v)
        call(q, k, v, True).backward(g)

    try:
        tf = timed(fwd, sets)
    except Exception as e:  # noqa: BLE001 (recorded in the row; the other methods go on)
        row["fwd_error"] = why(e)
        print(f"{name:16s} {label:22s} {row['fwd_error']}", flush=True)
        return row
    row.update(fwd_ms=tf, fwd_tflops=fwd_flop / tf * 1e-9)
    det_label = f"  {label.split(' ')[0]} det bwd"
    for what, fn, prefix in (("bwd", fb, ""), ("det", fb_det, "det_"))[:2 if det else 1]:
        try:
            tfb = timed(fn, sets)
        except Exception as e:  # noqa: BLE001
            row[f"{what}_error"] = why(e)
            print(f"{name:16s} {label if what == 'bwd' else det_label:22s} {row[f'{what}_error']}", flush=True)
            continue
        tb = max(tfb - tf, 1e-6)
        row.update({f"{prefix}fb_ms": tfb, f"{prefix}bwd_ms": tfb - tf,
                    f"{prefix}bwd_tflops": 2.5 * fwd_flop / tb * 1e-9})
        if what == "bwd":
            print(f"{name:16s} {label:22s} {tf:8.3f} {fwd_flop / tf * 1e-9:9.1f} {tfb:8.3f} "
                  f"{2.5 * fwd_flop / tb * 1e-9:9.1f}", flush=True)
        else:
            print(f"{name:16s} {det_label:22s} {'':8s} {'':9s} {tfb:8.3f} {2.5 * fwd_flop / tb * 1e-9:9.1f}",
                  flush=True)
    if "fb_ms" not in row:  # the forward line was not printed with the backward's
        print(f"{name:16s} {label:22s} {tf:8.3f} {fwd_flop / tf * 1e-9:9.1f}", flush=True)
    return row


def fa4_function():
    """FlashAttention-4's flash_attn_func (flash-attn-4, `flash_attn.cute`) and its version, or (None, why not)."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 (absent, or it does not load here)
        return None, f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    from importlib import metadata

    try:
        version = metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        version = "?"
    return flash_attn_func, version


def fa4_rows(name, b, s, hq, hkv, d, win, use_sinks, fwd_flop, dev="cuda"):
    """FlashAttention-4 through its PyTorch API (BSHD, as sinkattn's rows): the same sink logits (fp32 [h_q], log(s))
    on the layers with sinks, the same window ((127, 0) with causal: keys i - 127 .. i) on the sliding layer."""
    fn, version = fa4_function()
    if fn is None:
        ROWS.append(dict(shape=name, method="fa4", unavailable=version, note=f"not available: {version}"))
        print(f"{name:16s} {'fa4':22s} not available: {version}", flush=True)
        return
    sets = random_sets((b, s, hq, d), (b, s, hkv, d), dev)
    sink = torch.full((hq,), math.log(s), device=dev, dtype=torch.float32, requires_grad=use_sinks)
    sk = sink if use_sinks else None
    window = (win, 0) if win >= 0 else (None, None)

    def call(q, k, v, deterministic):
        out, _ = fn(q, k, v, causal=True, window_size=window, learnable_sink=sk, deterministic=deterministic)
        return out

    autograd_rows(name, "fa4 (flash-attn-4)", "fa4", call, sets, fwd_flop,
                  f"flash-attn-4 {version} flash_attn.cute.flash_attn_func with autograd"
                  + (", learnable_sink = log(s) fp32" if use_sinks else ", no sink (the layer has none)"))


def sinkattn_rows(name, b, s, hq, hkv, d, win, use_sinks, fwd_flop, dev="cuda", api=True, cabi=True):
    """sinkattn through its PyTorch API (BSHD tensors, as gpu_bench; api), then the operators against the C ABI
    (cabi)."""
    try:
        import sinkattn.torch as st
    except ImportError as e:
        print(f"{name:16s} sinkattn.torch not available: {e}")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_cabi

    sets = random_sets((b, s, hq, d), (b, s, hkv, d), dev)  # BSHD, as FlashAttention and gpu_bench
    sink = torch.full((hq,), math.log(s), device=dev, dtype=torch.float32, requires_grad=use_sinks)
    sk = sink if use_sinks else None
    window = (win, 0) if win >= 0 else (-1, -1)

    def call(q, k, v, deterministic):
        return st.flash_attn_func(q, k, v, causal=True, window_size=window, learnable_sink=sk,
                                  deterministic=deterministic)

    if api:
        autograd_rows(name, "sinkattn (torch API)", "sinkattn_torch_api", call, sets, fwd_flop,
                      "flash_attn_func with autograd")
    if not cabi:
        return

    lib = torch_cabi.library()
    st_type = 2 if use_sinks else 0
    ops_sets, c_fwd, c_bwd, keep = [], [], [], []
    for q, k, v, g in sets:
        q, k, v = q.detach(), k.detach(), v.detach()
        fargs = (q, k, v, sk.detach() if use_sinks else None, None, None, None, None, None, None, None, s, s, st_type,
                 None, win, 0, 0, 0.0, None, False, False, 0)
        out, lse, rng = torch.ops.sinkattn.fwd(*fargs)
        bargs = (g, q, k, v, out, lse, None, fargs[3], None, None, None, None, None, None, s, s, st_type, None, win, 0,
                 0, 0.0, rng, False, False)
        ops_sets.append((fargs, bargs))
        tensors = dict(q=q, k=k, v=v, out=torch.empty_like(out), softmax_lse=torch.empty_like(lse))
        if use_sinks:
            tensors["sinks"] = fargs[3]
        pf, kf = torch_cabi.params(lib, causal=True, window_left=win, learnable=use_sinks, **tensors)
        grads = dict(d_out=g, dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
        if use_sinks:
            grads["d_sinks"] = torch.empty_like(fargs[3])
        pb, kb = torch_cabi.params(lib, backward=True, causal=True, window_left=win, learnable=use_sinks,
                                   **dict(tensors, out=out, softmax_lse=lse), **grads)
        c_fwd.append((pf,))
        c_bwd.append((pb,))
        keep += [tensors, grads, kf, kb]
    op_f, c_f = (lambda fa, ba: torch.ops.sinkattn.fwd(*fa)), (lambda p: torch_cabi.call(lib, p))
    op_b, c_b = (lambda fa, ba: torch.ops.sinkattn.bwd(*ba)), (lambda p: torch_cabi.call(lib, p, backward=True))
    for how, timer in (("pipelined", bench_pipelined), ("after sync", bench)):
        # op and C ABI alternate (op, C, op, C; the lower of each pair), so that clock drift hits both alike
        t_op_f, t_c_f = timer(op_f, ops_sets), timer(c_f, c_fwd)
        t_op_f, t_c_f = min(t_op_f, timer(op_f, ops_sets)), min(t_c_f, timer(c_f, c_fwd))
        t_op_b, t_c_b = timer(op_b, ops_sets), timer(c_b, c_bwd)
        t_op_b, t_c_b = min(t_op_b, timer(op_b, ops_sets)), min(t_c_b, timer(c_b, c_bwd))
        ROWS.append(dict(shape=name, method="op_vs_c_abi", timing=how, op_fwd_ms=t_op_f, c_abi_fwd_ms=t_c_f,
                         op_bwd_ms=t_op_b, c_abi_bwd_ms=t_c_b))
        print(f"{name:16s} {'op / C ABI, ' + how:22s} fwd {t_op_f:.3f} / {t_c_f:.3f} ms ({t_op_f / t_c_f:.3f}x, "
              f"{fwd_flop / t_op_f * 1e-9:.1f} / {fwd_flop / t_c_f * 1e-9:.1f} TF/s); bwd {t_op_b:.3f} / {t_c_b:.3f} "
              f"ms ({t_op_b / t_c_b:.3f}x, {2.5 * fwd_flop / t_op_b * 1e-9:.1f} / "
              f"{2.5 * fwd_flop / t_c_b * 1e-9:.1f} TF/s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
