#!/usr/bin/env python3
"""Smoke test of the stable-ABI claim: run it with a torch other than the one the operators were compiled against,
e.g. PYTHONPATH=<site built against torch 2.15> <python with torch 2.11> tools/torch_abi_smoke.py (CPU only, no
JAX needed). Checks values and gradients of a GQA sliding-window call with sinks against a float64 evaluation,
torch.library.opcheck of the forward operator and torch.compile(fullgraph=True)."""
import math
import torch
import sinkattn.torch as st
import sinkattn.torch._ops as ops
print("torch", torch.__version__, "op library", ops.library_path())
g = torch.Generator().manual_seed(0)
q = torch.randn(2, 33, 4, 16, generator=g, dtype=torch.float64)
k = torch.randn(2, 40, 2, 16, generator=g, dtype=torch.float64)
v = torch.randn(2, 40, 2, 16, generator=g, dtype=torch.float64)
s = torch.tensor([math.log(40), 20.0, -1.0, 0.5], dtype=torch.float64)
def ref(q, k, v, s, left):
    kk, vv = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    sc = torch.einsum("bihd,bjhd->bhij", q, kk) / 4.0
    i, j = torch.arange(33)[:, None] + 7, torch.arange(40)[None]
    sc = sc.masked_fill(~((j <= i) & (j >= i - left)), float("-inf"))
    lse = torch.logsumexp(torch.cat([sc, s.view(1, 4, 1, 1).expand(2, 4, 33, 1)], -1), -1)
    return torch.einsum("bhij,bjhd->bihd", torch.exp(sc - lse[..., None]), vv), lse
xs = [x.float().requires_grad_(True) for x in (q, k, v, s)]
out, lse = st.flash_attn_func(*xs[:3], causal=True, window_size=(5, 0), learnable_sink=xs[3], return_lse=True)
w = torch.randn(out.shape, generator=g)
gr = torch.autograd.grad((out * w).sum() + lse.sum(), xs)
xr = [x.clone().requires_grad_(True) for x in (q, k, v, s)]
ro, rl = ref(*xr, 5)
grr = torch.autograd.grad((ro * w.double()).sum() + rl.sum(), xr)
err = lambda a, b: float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max())
print("out", err(out, ro), "lse", err(lse, rl), "grads", [round(err(a, b), 9) for a, b in zip(gr, grr)])
assert err(out, ro) < 1e-5 and all(err(a, b) < 1e-4 for a, b in zip(gr, grr))
args = (xs[0].detach().requires_grad_(True), xs[1].detach(), xs[2].detach(), xs[3].detach(), None, None, None, None, None,
        None, None, 33, 40, 2, None, 5, 0, 0, 0.0, None, False, False, 0)
torch.library.opcheck(torch.ops.sinkattn.fwd.default, args)
f = torch.compile(lambda a, b, c, d: st.flash_attn_func(a, b, c, causal=True, learnable_sink=d), fullgraph=True, backend="aot_eager")
torch.testing.assert_close(f(*xs), st.flash_attn_func(*xs[:3], causal=True, learnable_sink=xs[3]))
print("opcheck and torch.compile(fullgraph=True) pass")
