"""Helpers of the PyTorch tests: numpy <-> torch, the op with NaN-poisoned outputs, forward + backward in one call.

The float64 ground truth is the pure-JAX reference of SPEC.md (python/sinkattn/jax/reference.py), one reference for
both bindings: cases are described in the JAX op's keyword arguments (test_jax_op.build) and mapped onto the torch
API here (``torch_kwargs``)."""

import contextlib

import ml_dtypes
import numpy as np
import pytest
import torch

import sinkattn.torch as st
from sinkattn._args import words_seed_offset

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                np.dtype(ml_dtypes.bfloat16): torch.bfloat16}


def to_torch(x, device, dtype=None):
    """numpy (float32 / float16 / bfloat16 / int) -> torch on `device`, bit-exact."""
    if x is None:
        return None
    x = np.asarray(x)
    if x.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    return t if dtype is None else t.to(dtype)


def to_numpy(t):
    return None if t is None else t.detach().to("cpu", torch.float64).numpy()


@contextlib.contextmanager
def poisoned_outputs():
    """Every tensor PyTorch allocates uninitialised (the op's outputs and the library's workspace among them) starts
    as NaN (integers: their largest value): torch.use_deterministic_algorithms + fill_uninitialized_memory."""
    old_det, old_fill = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.utils.deterministic.fill_uninitialized_memory = old_fill


def words_to_rng(words, device):
    """uint32[4] {lo32(seed), hi32(seed), lo32(offset), hi32(offset)} -> the int64 [2] {seed, offset} tensor."""
    return torch.tensor(words_seed_offset(np.asarray(words, np.uint32)), dtype=torch.int64, device=device)


def torch_kwargs(kw, device):
    """test_jax_op's JAX keyword arguments -> sinkattn.torch.dot_product_attention keyword arguments."""
    from sinkattn.jax import reference as ref

    kw = dict(kw)
    if "segment_ids" in kw:
        pytest.skip("segment_ids is an argument of the JAX API only (the torch API takes cu_seqlens)")
    out = dict(softmax_type=kw.pop("softmax_type"), causal=kw.pop("is_causal", False),
               mask_alignment=kw.pop("mask_alignment", "bottom_right"), return_lse=kw.pop("return_lse", False),
               softmax_scale=kw.pop("scale", None))
    w = kw.pop("local_window_size", None)
    out["window_size"] = (-1, -1) if w is None else (tuple(w) if isinstance(w, (tuple, list)) else (w, w))
    varlen = "cu_seqlens_q" in kw
    if varlen:
        out["cu_seqlens_q"] = to_torch(kw.pop("cu_seqlens_q"), device)
        out["cu_seqlens_kv"] = to_torch(kw.pop("cu_seqlens_kv"), device)
        out["max_seqlen_q"], out["max_seqlen_kv"] = kw.pop("max_seqlen_q"), kw.pop("max_seqlen_kv")
        if "key_value_seq_lengths" in kw:
            out["seqused_kv"] = to_torch(kw.pop("key_value_seq_lengths"), device)
    else:
        if "query_seq_lengths" in kw:
            out["seqlens_q"] = to_torch(kw.pop("query_seq_lengths"), device)
        if "key_value_seq_lengths" in kw:
            out["seqlens_kv"] = to_torch(kw.pop("key_value_seq_lengths"), device)
    if kw.get("dropout_rate", 0.0) > 0.0:
        out["dropout_p"] = kw.pop("dropout_rate")
        out["rng_seed_offset"] = words_to_rng(ref.rng_seed_offset_words(kw.pop("dropout_rng")), device)
    kw.pop("dropout_rate", None)
    kw.pop("dropout_rng", None)
    if "deterministic" in kw:
        out["deterministic"] = kw.pop("deterministic")
    assert not kw, f"unmapped arguments {sorted(kw)}"
    return out


def run_torch(tkw, inputs, cts, device, names):
    """Forward + backward of sinkattn.torch.dot_product_attention with poisoned outputs.

    inputs: numpy q, k, v, sinks, bias; cts: (g_out, g_lse) numpy cotangents (g_lse used with return_lse).
    Returns (out, lse or None, {name: grad}) as float64 numpy arrays (out / grads in their dtype first)."""
    t = {n: to_torch(x, device) for n, x in inputs.items()}
    for n in names:
        t[n].requires_grad_(True)
    with poisoned_outputs():
        res = st.dot_product_attention(t["q"], t["k"], t["v"], t["bias"], sinks=t["sinks"], **tkw)
        out, lse = res if tkw.get("return_lse") else (res, None)
        outs, grads_in = [out], [to_torch(cts[0], device, out.dtype)]
        if lse is not None:
            outs.append(lse)
            grads_in.append(to_torch(cts[1], device, torch.float32))
        grads = torch.autograd.grad(outs, [t[n] for n in names], grads_in)
    for n, g in zip(names, grads):
        assert g.dtype == t[n].dtype, (n, g.dtype, t[n].dtype)
    return out, lse, dict(zip(names, grads))
