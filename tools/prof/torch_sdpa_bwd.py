# Profiling helper (ncu target): torch SDPA forward + backward (its fastest backend; on the H200 that is cuDNN's
# wgmma kernels, not FlashAttention-2) on the GPT-OSS full-layer shape without sinks (bf16, b 2, s 4096, h_q 64,
# h_kv 8, d 64, causal), or the MHA shape with `mha`. Example:
#   ncu --clock-control none -k regex:bprop --launch-count 1 python3 tools/prof/torch_sdpa_bwd.py
import sys

import torch
import torch.nn.functional as F

mha = len(sys.argv) > 1 and sys.argv[1] == "mha"
b, s, hq, hkv, d = (2, 4096, 32, 32, 128) if mha else (2, 4096, 64, 8, 64)
q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for _ in range(2):
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != hq)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
