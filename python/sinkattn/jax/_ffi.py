"""Loading of the sinkattn libraries, FFI target registration and trace-time workspace queries.

The FFI handlers live in ``libsinkattn_jax_ffi.so`` (python/ffi/), which links ``libsinkattn.so`` (the C ABI of
include/sinkattn/sinkattn.h). The libsinkattn next to the handler library (``libsinkattn.so`` in the wheel,
``libsinkattn.so.0`` in a CMake build tree) is opened first, by absolute path (see library() for why), then the
handler library; the C ABI functions are looked up through the handler's handle
(``dlsym`` searches a library's dependencies too), so one copy of the library (one thread-local
``sinkattn_last_error``, one CUDA context user) serves both the handlers and the Python side.

Search order for the handler library:
  1. ``$SINKATTN_JAX_FFI_LIBRARY`` (a path to libsinkattn_jax_ffi.so), for development builds;
  2. the installed package: ``sinkattn/lib*/libsinkattn_jax_ffi.so`` (in the wheel, and what ``pip install .``
     puts there).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Sequence

import numpy as np

__all__ = [
    "SinkattnError",
    "library",
    "has_cuda",
    "platforms",
    "workspace_size",
    "FORWARD_TARGET",
    "BACKWARD_TARGET",
]

FORWARD_TARGET = "sinkattn_jax_forward"
BACKWARD_TARGET = "sinkattn_jax_backward"
DECODE_TARGET = "sinkattn_jax_decode"  # the forward with num_splits (sinkattn.jax.decode_attention)

# Enum values of include/sinkattn/sinkattn.h (softmax_type and mask_alignment: sinkattn/_args.py).
F32, F16, BF16, I32, I64 = 0, 1, 2, 3, 4
BACKEND_CPU, BACKEND_CUDA = 1, 2
MAX_RANK = 4

# Operand bits of the handler protocol (python/ffi/ffi_handlers.cpp).
OP_SINKS, OP_BIAS, OP_D_LSE, OP_CU_SEQLENS = 1 << 0, 1 << 1, 1 << 2, 1 << 3
OP_SEQUSED_KV, OP_SEQLENS_Q, OP_SEQLENS_KV, OP_RNG = 1 << 4, 1 << 5, 1 << 6, 1 << 7
OP_PAGE_TABLE, OP_CU_SEQLENS_Q_ONLY = 1 << 8, 1 << 9


class SinkattnError(ValueError):
    """An invalid call, with the message of the sinkattn library (SPEC.md section 4)."""


class Tensor(ctypes.Structure):
    """Mirror of sinkattn_tensor_t."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("strides", ctypes.c_int64 * MAX_RANK),
    ]


class Params(ctypes.Structure):
    """Mirror of sinkattn_params_t (checked against the C layout by sinkattn_jax_params_layout at load)."""

    _fields_ = [
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("sinks", Tensor), ("bias", Tensor),
        ("cu_seqlens_q", Tensor), ("cu_seqlens_kv", Tensor), ("seqused_kv", Tensor),
        ("seqlens_q", Tensor), ("seqlens_kv", Tensor),
        ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_kv", ctypes.c_int64),
        ("page_table", Tensor), ("trust_device_batch_tensors", ctypes.c_int32),
        ("out", Tensor), ("softmax_lse", Tensor),
        ("d_out", Tensor), ("d_lse", Tensor), ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
        ("d_sinks", Tensor), ("d_bias", Tensor),
        ("softmax_type", ctypes.c_int), ("softmax_scale", ctypes.c_float),
        ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
        ("mask_alignment", ctypes.c_int),
        ("dropout_p", ctypes.c_double), ("seed", ctypes.c_uint64), ("offset", ctypes.c_uint64),
        ("rng_seed_offset", Tensor), ("rng_state", Tensor),
        ("deterministic", ctypes.c_int32), ("num_splits", ctypes.c_int32), ("backend", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("num_threads", ctypes.c_int32),
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
    ]


def _candidates() -> list[str]:
    env = os.environ.get("SINKATTN_JAX_FFI_LIBRARY")
    if env:
        return [env]
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../sinkattn
    found = []
    for sub in ("lib", "lib64", "lib/*", ""):
        found += sorted(glob.glob(os.path.join(pkg, sub, "libsinkattn_jax_ffi.so")))
    return found


def _core_library_next_to(handler: str) -> str | None:
    """The libsinkattn that belongs to this handler library: the one in its directory (installed package:
    libsinkattn.so, SONAME libsinkattn.so) or in the build directory above it (a development build:
    <build>/python/ffi/libsinkattn_jax_ffi.so beside <build>/libsinkattn.so.0)."""
    d = os.path.dirname(os.path.abspath(handler))
    for cand in (d, os.path.dirname(os.path.dirname(d))):
        for name in ("libsinkattn.so.0", "libsinkattn.so"):
            path = os.path.join(cand, name)
            if os.path.isfile(path):
                return os.path.realpath(path)
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_defining(fn) -> str | None:
    """Path of the loaded object that defines the ctypes function ``fn`` (dladdr), or None if unknown."""
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.path.realpath(info.dli_fname.decode("utf-8", "replace"))


# Handles kept for the life of the process (never dlclose'd: XLA holds pointers to the handlers).
_HANDLES: list = []


@functools.lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """The loaded handler library (with the C ABI reachable through it); FFI targets registered.

    Loading rules, each against a way the process could end up with a library that crashes or misreads the
    ctypes mirror of sinkattn_params_t:
    - JAX's backends (e.g. the CUDA PJRT plugin) are initialised first, so the plugin owns CUDA before the
      library's static cudart runs any initialiser.
    - RTLD_LOCAL (not RTLD_GLOBAL): nothing of ours (static cudart, C++ symbols) can interpose on symbols of other
      libraries loaded later. (The library is also linked with --exclude-libs,ALL, so it exports no cudart.)
    - The package's own libsinkattn is opened by absolute path before the handler library, so that a
      libsinkattn of some other build on LD_LIBRARY_PATH (with another sinkattn_params_t) is never used. After loading, dladdr checks which file
      defines the C ABI functions the Python side calls, and sinkattn_jax_params_layout (compiled with the
      handler) checks the ctypes mirror.
    """
    paths = _candidates()
    if not paths:
        raise ImportError(
            "sinkattn: libsinkattn_jax_ffi.so not found. Install the wheel (`pip install dist/sinkattn-*.whl`, "
            "built by tools/build-wheel.sh) or point SINKATTN_JAX_FFI_LIBRARY at a build of python/ffi.")
    import jax

    jax.devices()
    core = _core_library_next_to(paths[0])
    if core is not None:
        _HANDLES.append(ctypes.CDLL(core, mode=ctypes.RTLD_LOCAL))
    lib = ctypes.CDLL(paths[0], mode=ctypes.RTLD_LOCAL)
    _HANDLES.append(lib)
    _declare(lib)
    if core is not None:
        used = _file_defining(lib.sinkattn_forward_workspace_size)
        if used is not None and used != core:
            raise ImportError(
                f"sinkattn: the handler library {paths[0]} resolved the C ABI from {used}, not from its own "
                f"{core} (a libsinkattn on LD_LIBRARY_PATH or already loaded?); remove it from "
                f"LD_LIBRARY_PATH or set SINKATTN_JAX_FFI_LIBRARY to a matching build")
    _check_layout(lib)
    _register(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    p = ctypes.POINTER(Params)
    lib.sinkattn_params_init.argtypes = [p]
    lib.sinkattn_params_init.restype = None
    for name in ("sinkattn_forward_workspace_size", "sinkattn_backward_workspace_size"):
        fn = getattr(lib, name)
        fn.argtypes = [p, ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = ctypes.c_int
    lib.sinkattn_last_error.argtypes = []
    lib.sinkattn_last_error.restype = ctypes.c_void_p  # read with ctypes.string_at (NULL-safe), see last_error()
    lib.sinkattn_version.argtypes = []
    lib.sinkattn_version.restype = ctypes.c_char_p
    lib.sinkattn_backend_available.argtypes = [ctypes.c_int]
    lib.sinkattn_backend_available.restype = ctypes.c_int32
    lib.sinkattn_philox4x32_10.argtypes = [ctypes.POINTER(ctypes.c_uint32)] * 3
    lib.sinkattn_philox4x32_10.restype = None
    lib.sinkattn_dropout_keep.argtypes = [ctypes.c_uint64, ctypes.c_uint64] + [ctypes.c_int64] * 7 + [
        ctypes.c_double]
    lib.sinkattn_dropout_keep.restype = ctypes.c_int32
    lib.sinkattn_jax_params_layout.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int32]
    lib.sinkattn_jax_params_layout.restype = ctypes.c_int32
    lib.sinkattn_params_size.argtypes = []
    lib.sinkattn_params_size.restype = ctypes.c_size_t


def _check_layout(lib: ctypes.CDLL) -> None:
    # The library that reads the struct reports its size itself; the handler reports the field offsets.
    if lib.sinkattn_params_size() != ctypes.sizeof(Params):
        raise ImportError(f"sinkattn: sizeof(sinkattn_params_t) is {lib.sinkattn_params_size()} in the loaded "
                          f"library but {ctypes.sizeof(Params)} in the ctypes mirror; update python/sinkattn/jax/_ffi.py")
    buf = (ctypes.c_int64 * 16)()
    n = lib.sinkattn_jax_params_layout(buf, 16)
    mine = [ctypes.sizeof(Params), ctypes.sizeof(Tensor), Params.max_seqlen_q.offset, Params.out.offset,
            Params.softmax_type.offset, Params.dropout_p.offset, Params.rng_state.offset,
            Params.deterministic.offset, Params.workspace_bytes.offset, Params.page_table.offset,
            Params.trust_device_batch_tensors.offset, Params.num_splits.offset]
    if list(buf[:n]) != mine[:n] or n != len(mine):
        raise ImportError(f"sinkattn: the ctypes mirror of sinkattn_params_t does not match the library "
                          f"(C: {list(buf[:n])}, Python: {mine}); update python/sinkattn/jax/_ffi.py")


def has_cuda() -> bool:
    """Whether the loaded library was built with its CUDA backend."""
    return bool(library().sinkattn_backend_available(BACKEND_CUDA))


def _register(lib: ctypes.CDLL) -> None:
    import jax.ffi

    jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_forward_cpu), platform="cpu")
    jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_backward_cpu), platform="cpu")
    jax.ffi.register_ffi_target(DECODE_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_decode_cpu), platform="cpu")
    if lib.sinkattn_backend_available(BACKEND_CUDA):
        jax.ffi.register_ffi_target(DECODE_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_decode_cuda),
                                    platform="CUDA")
        jax.ffi.register_ffi_target(FORWARD_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_forward_cuda),
                                    platform="CUDA")
        jax.ffi.register_ffi_target(BACKWARD_TARGET, jax.ffi.pycapsule(lib.sinkattn_jax_backward_cuda),
                                    platform="CUDA")


@functools.lru_cache(maxsize=None)
def platforms() -> tuple[str, ...]:
    """Lowering platforms the op emits a call for: always "cpu"; "cuda" when the library has CUDA and JAX a GPU."""
    import jax

    out = ["cpu"]
    if has_cuda():
        try:
            if jax.devices("gpu"):
                out.append("cuda")
        except RuntimeError:
            pass
    return tuple(out)


def default_platform() -> str:
    """JAX's default backend as a lowering platform name ("cpu" or "cuda")."""
    import jax

    return "cuda" if jax.default_backend() == "gpu" else jax.default_backend()


_DTYPES = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32,
           np.dtype(np.int64): I64, np.dtype(np.uint32): I64}


def dtype_code(dtype) -> int:
    import ml_dtypes

    dtype = np.dtype(dtype)
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return BF16
    if dtype not in _DTYPES:
        raise TypeError(f"sinkattn: unsupported dtype {dtype}")
    return _DTYPES[dtype]


def _shape_tensor(t: Tensor, shape: Sequence[int], dtype) -> None:
    """A shape-only view (data NULL, row-major strides) for the size queries."""
    dtype = np.dtype(dtype)
    if dtype == np.dtype(np.uint32):  # u32[4] seed/offset words = the library's I64[2]
        shape = (2,)
    if not 1 <= len(shape) <= MAX_RANK:
        raise SinkattnError(f"sinkattn: tensors have rank 1..{MAX_RANK}, got shape {tuple(shape)}")
    t.data = None
    t.dtype = dtype_code(dtype)
    t.rank = len(shape)
    stride = 1
    for i in reversed(range(len(shape))):
        t.shape[i] = int(shape[i])
        t.strides[i] = stride
        stride *= int(shape[i])


def workspace_size(backward: bool, platform: str, tensors: dict, options: dict) -> int:
    """Bytes of scratch the call needs (sinkattn_{forward,backward}_workspace_size with NULL data pointers).

    ``tensors`` maps sinkattn_params_t field names to (shape, dtype); ``options`` maps option fields to values.
    Raises SinkattnError with the library's message when the call is invalid (SPEC.md section 4).
    """
    lib = library()
    p = Params()
    lib.sinkattn_params_init(ctypes.byref(p))
    for name, (shape, dtype) in tensors.items():
        _shape_tensor(getattr(p, name), shape, dtype)
    for name, value in options.items():
        setattr(p, name, value)
    p.backend = BACKEND_CUDA if platform == "cuda" else BACKEND_CPU
    size = ctypes.c_size_t(0)
    fn = lib.sinkattn_backward_workspace_size if backward else lib.sinkattn_forward_workspace_size
    status = fn(ctypes.byref(p), ctypes.byref(size))  # p and size outlive the call (locals of this frame)
    if status != 0:
        # The message is thread-local in the library; this is the same thread (ctypes calls run on the caller's).
        raise SinkattnError(f"sinkattn: {last_error(lib)} (status {status})")
    return int(size.value)


def last_error(lib: ctypes.CDLL | None = None) -> str:
    """sinkattn_last_error() of this thread, copied into a Python string at once (valid until the next call)."""
    lib = lib or library()
    ptr = lib.sinkattn_last_error()
    if not ptr:
        return "error without message"
    return ctypes.string_at(ptr).decode("utf-8", "replace")


def philox4x32_10(counter: Sequence[int], key: Sequence[int]) -> list[int]:
    """The library's Philox4x32-10 (SPEC.md section 2), for cross-checking Python implementations."""
    lib = library()
    c = (ctypes.c_uint32 * 4)(*[int(x) & 0xFFFFFFFF for x in counter])
    k = (ctypes.c_uint32 * 2)(*[int(x) & 0xFFFFFFFF for x in key])
    o = (ctypes.c_uint32 * 4)()
    lib.sinkattn_philox4x32_10(c, k, o)
    return list(o)
