"""Loading of the sinkattn PyTorch operators, their fake (meta) kernels and their autograd formula.

``torch.ops.sinkattn.fwd`` and ``torch.ops.sinkattn.bwd`` are C++ operators on PyTorch's stable ABI
(python/torch/torch_ops.cpp, in ``sinkattn/lib/libsinkattn_torch.so``), thin over the C ABI of
include/sinkattn/sinkattn.h; the CPU and CUDA dispatch keys run the same kernel function (the tensors' memory picks
the library's backend). This module registers, from Python, what PyTorch's subsystems need beyond the kernels:
fake kernels (output shapes, dtypes and strides for FakeTensor / torch.compile / torch.export) and the autograd
formula of ``fwd`` (through ``bwd``: dq, dk, dv, d_sinks, d_bias, and the gradient flowing into softmax_lse). The
stable ABI has no autograd API, so the formula lives here, once (_setup_context, _backward), for every PyTorch the
operators load into: registered at the operator's Autograd key (torch.library.register_autograd, for callers of
``torch.ops.sinkattn.fwd``) and wrapped in an autograd.Function (``attention``, what the API calls).

Search order for the operator library: ``$SINKATTN_TORCH_LIBRARY`` (a path, for development builds), then the
installed package (``sinkattn/lib*/libsinkattn_torch.so``: in every wheel of tools/build-wheel.sh and every source
install but those built with ``SINKATTN_BUILD_TORCH=OFF``).
"""

from __future__ import annotations

import functools
import glob
import os

import torch

from .._args import ALIGNMENTS, SOFTMAX_TYPES

__all__ = ["load", "library_path", "attention", "SOFTMAX_TYPES", "ALIGNMENTS"]

_LEARNABLE = SOFTMAX_TYPES["learnable"]


def library_path() -> str:
    env = os.environ.get("SINKATTN_TORCH_LIBRARY")
    if env:
        return env
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../sinkattn
    for sub in ("lib", "lib64", "lib/*"):
        found = sorted(glob.glob(os.path.join(pkg, sub, "libsinkattn_torch.so")))
        if found:
            return found[0]
    raise ImportError(
        "sinkattn: libsinkattn_torch.so not found: this sinkattn package was built without its PyTorch operators "
        "(SINKATTN_BUILD_TORCH=OFF). Install the wheel of tools/build-wheel.sh (`pip install dist/sinkattn-*.whl`), "
        "rebuild from source without SINKATTN_BUILD_TORCH=OFF, or point SINKATTN_TORCH_LIBRARY at a build of "
        "python/torch.")


@functools.lru_cache(maxsize=None)
def load() -> None:
    """Loads the operator library (once) and registers the fake kernels and the autograd formula."""
    torch.ops.load_library(library_path())
    _register_fake()
    _register_autograd()


def _register_fake() -> None:
    @torch.library.register_fake("sinkattn::fwd")
    def _fwd_fake(q, k, v, sinks, bias, cu_seqlens_q, cu_seqlens_kv, seqused_kv, seqlens_q, seqlens_kv, page_table,
                  max_seqlen_q, max_seqlen_kv, softmax_type, softmax_scale, window_left, window_right, mask_alignment,
                  dropout_p, rng_seed_offset, deterministic, trust_device_batch_tensors, num_splits):
        d_v = v.shape[-1]
        if cu_seqlens_q is not None:  # varlen: out [total_q, h_q, d_v], lse [h_q, total_q]
            out = q.new_empty((q.shape[0], q.shape[1], d_v))
            lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
        else:  # dense: out [b, s_q, h_q, d_v], lse [b, h_q, s_q]
            out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], d_v))
            lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
        return out, lse, q.new_empty((2 if dropout_p > 0.0 else 0,), dtype=torch.int64)  # [0] without dropout

    @torch.library.register_fake("sinkattn::bwd")
    def _bwd_fake(d_out, q, k, v, out, softmax_lse, d_lse, sinks, bias, cu_seqlens_q, cu_seqlens_kv, seqused_kv,
                  seqlens_q, seqlens_kv, max_seqlen_q, max_seqlen_kv, softmax_type, softmax_scale, window_left,
                  window_right, mask_alignment, dropout_p, rng_state, deterministic, trust_device_batch_tensors):
        learnable = softmax_type == _LEARNABLE and sinks is not None
        d_sinks = q.new_empty(sinks.shape if learnable else (0,), dtype=torch.float32)
        d_bias = q.new_empty(bias.shape, dtype=bias.dtype) if bias is not None else q.new_empty((0,), dtype=torch.float32)
        return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape), d_sinks, d_bias


def _last_dim_contiguous(x):
    """The library takes any strides but a contiguous last dimension (autograd's cotangents may be expanded)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _setup_context(ctx, inputs, output):
    (q, k, v, sinks, bias, cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv, _page_table, max_q, max_kv, softmax_type,
     softmax_scale, window_left, window_right, mask_alignment, dropout_p, _rng_in, deterministic, trust,
     _num_splits) = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, sinks, bias, cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv)
    ctx.options = (max_q, max_kv, softmax_type, softmax_scale, window_left, window_right, mask_alignment, dropout_p)
    ctx.deterministic = deterministic
    ctx.trust = trust
    ctx.mark_non_differentiable(rng_state)


def _backward(ctx, d_out, d_lse, _d_rng):
    """dq, dk, dv, d_sinks, d_bias of SPEC.md section 3 (d_lse: the gradient flowing into the returned lse)."""
    q, k, v, out, lse, rng_state, sinks, bias, cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv = ctx.saved_tensors
    d_out = torch.zeros_like(out) if d_out is None else _last_dim_contiguous(d_out.to(out.dtype))
    if d_lse is not None:
        d_lse = _last_dim_contiguous(d_lse.to(torch.float32))
    max_q, max_kv, softmax_type, softmax_scale, wl, wr, align, dropout_p = ctx.options
    dq, dk, dv, d_sinks, d_bias = torch.ops.sinkattn.bwd.default(
        d_out, q, k, v, out, lse, d_lse, sinks, bias, cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv, max_q, max_kv,
        softmax_type, softmax_scale, wl, wr, align, dropout_p, rng_state, ctx.deterministic, ctx.trust)
    learnable = softmax_type == _LEARNABLE and sinks is not None
    return (dq, dk, dv, d_sinks if learnable else None, d_bias if bias is not None else None) + (None,) * 18


def _register_autograd() -> None:
    # For callers of torch.ops.sinkattn.fwd itself (and torch.library.opcheck). The API functions take the cheaper
    # path of `attention` below: the same formula (_setup_context, _backward) without torch.library's per-call
    # argument rebinding.
    torch.library.register_autograd("sinkattn::fwd", _backward, setup_context=_setup_context)


class _Attention(torch.autograd.Function):
    """torch.ops.sinkattn.fwd with the autograd formula of _backward, as a plain autograd.Function: what the API
    calls. torch.library's registered autograd path rebinds every argument against the schema on each call
    (torch._library.utils.fill_defaults), which costs far more host time than the library call for this 23-argument
    operator; this class saves and differentiates exactly the same tensors (the same functions do it)."""

    # forward(ctx, ...) without a separate setup_context: autograd.Function.apply then skips binding the arguments
    # to forward's signature (inspect) on every call.
    @staticmethod
    def forward(ctx, *args):
        if torch.compiler.is_compiling():
            output = torch.ops.sinkattn.fwd.default(*args)
        else:
            with torch._C._AutoDispatchBelowAutograd():  # straight to the CPU / CUDA kernel
                output = torch.ops.sinkattn.fwd.default(*args)
        _setup_context(ctx, args, output)
        return output

    backward = staticmethod(_backward)


def attention(*args):
    """(out, softmax_lse, rng_state) of torch.ops.sinkattn.fwd.default(*args), differentiable: _Attention when a
    gradient may be needed, else the CPU / CUDA kernel straight below autograd (no autograd bookkeeping)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args[:5])):
        return _Attention.apply(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.sinkattn.fwd.default(*args)
