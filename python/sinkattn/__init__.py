"""sinkattn: fused scaled-dot-product attention with softmax sinks (SPEC.md).

The Python package ships the compiled C++ library (``lib/libsinkattn.so``) and its XLA FFI handlers
(``lib/libsinkattn_jax_ffi.so``). The JAX op is ``sinkattn.jax.dot_product_attention`` (import ``sinkattn.jax``).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
