"""JAX bindings of sinkattn: fused attention with softmax sinks (XLA FFI custom calls, CPU and CUDA).

    from sinkattn.jax import dot_product_attention
    out = dot_product_attention(q, k, v, sinks=sinks, is_causal=True)          # BTNH, like jax.nn
    out = decode_attention(q, k_cache, v_cache, cache_seqlens=lens, page_table=pages, sinks=sinks)  # KV cache

``sinkattn.jax.reference.dot_product_attention`` is the same function in plain jnp (float64-capable), the
ground truth of the tests. The C++ library is loaded (and its FFI targets registered) on first use.
Distributed (modules of this package): ``sharding`` (batch / head sharding), ``ring`` and ``ulysses`` (context
parallelism: ring attention and all-to-all).
"""

from ._ffi import SinkattnError, has_cuda, platforms
from .attention import dot_product_attention, poison_outputs_for_testing
from .decode import decode_attention
from . import reference

__all__ = ["dot_product_attention", "decode_attention", "SinkattnError", "has_cuda", "platforms", "reference",
           "poison_outputs_for_testing"]
