"""PyTorch bindings of sinkattn: fused attention with softmax sinks, forward and backward, CPU and CUDA.

    import sinkattn.torch as st
    out = st.flash_attn_func(q, k, v, causal=True, window_size=(127, 0), learnable_sink=sinks)   # FlashAttention API
    out = st.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, causal=True, s_aux=sinks)
    out, lse = st.dot_product_attention(q, k, v, bias, sinks=sinks, return_lse=True)           # all of SPEC.md
    out = st.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=lens, page_table=table, learnable_sink=sinks)
    out = st.flash_attn_varlen_func(q=q, k=k_pages, v=v_pages, out=out, cu_seqlens_q=cu_q, max_seqlen_q=max_q,  # vLLM
                                    seqused_k=lens, max_seqlen_k=max_k, causal=True, block_table=table, s_aux=sinks)
    import sinkattn.torch.hf; sinkattn.torch.hf.register()       # attn_implementation="sinkattn" in transformers

The work is done by ``torch.ops.sinkattn.fwd`` / ``torch.ops.sinkattn.bwd``: C++ operators on PyTorch's stable ABI,
thin over the sinkattn C ABI, with fake kernels and autograd registered from Python (torch.compile(fullgraph=True)
traces them, torch.library.opcheck passes). This module is also usable as a kernels-hub style attention module: it
exports ``flash_attn_func`` and ``flash_attn_varlen_func`` with ``s_aux`` accepted as an alias of ``learnable_sink``.
"""

from . import _ops
from .attention import dot_product_attention, flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

_ops.load()

__all__ = ["dot_product_attention", "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"]
