"""The sinkattn C ABI called directly from Python on PyTorch tensors (ctypes over the sinkattn_params_t mirror of
sinkattn.jax._ffi), for benchmarks that compare torch.ops.sinkattn.* with the library call it wraps: the same
library file the operators link (sinkattn/lib/libsinkattn.so.0), the same tensors, the same stream."""
import ctypes
import glob
import math
import os

import torch

from sinkattn.jax._ffi import BF16, F16, F32, I32, I64, Params, Tensor  # the checked ctypes mirror (no JAX needed)

_CODES = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16, torch.int32: I32, torch.int64: I64}


def library() -> ctypes.CDLL:
    import sinkattn.torch._ops as ops

    lib_dir = os.path.dirname(ops.library_path())
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libsinkattn.so.0")))[0])
    p = ctypes.POINTER(Params)
    lib.sinkattn_params_init.argtypes = [p]
    lib.sinkattn_params_init.restype = None
    for name in ("sinkattn_forward", "sinkattn_backward"):
        getattr(lib, name).argtypes = [p]
        getattr(lib, name).restype = ctypes.c_int
    for name in ("sinkattn_forward_workspace_size", "sinkattn_backward_workspace_size"):
        getattr(lib, name).argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
        getattr(lib, name).restype = ctypes.c_int
    lib.sinkattn_params_size.argtypes = []
    lib.sinkattn_params_size.restype = ctypes.c_size_t
    lib.sinkattn_last_error.restype = ctypes.c_char_p
    assert lib.sinkattn_params_size() == ctypes.sizeof(Params), "ctypes mirror of sinkattn_params_t is stale"
    return lib


def view(t: torch.Tensor) -> Tensor:
    v = Tensor()
    v.data = t.data_ptr()
    v.dtype = _CODES[t.dtype]
    v.rank = t.dim()
    for i in range(t.dim()):
        v.shape[i] = t.shape[i]
        v.strides[i] = t.stride(i)
    return v


def params(lib, *, backward=False, causal=True, window_left=-1, learnable=True, **tensors) -> tuple:
    """(Params, keep-alive list) for one call on `tensors` (sinkattn_params_t field names), with its workspace
    allocated from PyTorch's allocator and the current stream of q's device."""
    p = Params()
    lib.sinkattn_params_init(ctypes.byref(p))
    for name, t in tensors.items():
        setattr(p, name, view(t))
    q = tensors["q"]
    p.softmax_type = 2 if learnable else 0
    p.window_left = window_left
    p.window_right = 0 if causal else -1
    if q.is_cuda:
        p.backend = 2
        p.stream = torch.cuda.current_stream(q.device).cuda_stream
    else:
        p.backend = 1
        p.num_threads = torch.get_num_threads()
    size = ctypes.c_size_t(0)
    fn = lib.sinkattn_backward_workspace_size if backward else lib.sinkattn_forward_workspace_size
    assert fn(ctypes.byref(p), ctypes.byref(size)) == 0, lib.sinkattn_last_error()
    ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
    p.workspace = ws.data_ptr()
    p.workspace_bytes = size.value
    return p, [ws]


def call(lib, p, backward=False) -> None:
    """What a C caller does per call: the size query, then the run (the workspace is already big enough)."""
    size = ctypes.c_size_t(0)
    ref = ctypes.byref(p)
    if backward:
        lib.sinkattn_backward_workspace_size(ref, ctypes.byref(size))
        st = lib.sinkattn_backward(ref)
    else:
        lib.sinkattn_forward_workspace_size(ref, ctypes.byref(size))
        st = lib.sinkattn_forward(ref)
    if st != 0:
        raise RuntimeError(lib.sinkattn_last_error().decode())


def scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
