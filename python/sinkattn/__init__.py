"""sinkattn: fused scaled-dot-product attention with softmax sinks (SPEC.md).

The Python package ships the compiled C++ library (``lib/libsinkattn.so``: CPU and CUDA backends), its XLA FFI
handlers (``lib/libsinkattn_jax_ffi.so``), the PyTorch stable-ABI operators (``lib/libsinkattn_torch.so``) and the
``sinkattn`` command (``bin/sinkattn``, run by the ``sinkattn`` console script). The JAX op is
``sinkattn.jax.dot_product_attention`` (import ``sinkattn.jax``); PyTorch: ``sinkattn.torch``; HF transformers:
``sinkattn.torch.hf``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
