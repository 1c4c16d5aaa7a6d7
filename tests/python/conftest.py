"""pytest setup for the Python tests: 8 virtual CPU devices (CI: XLA_FLAGS=--xla_force_host_platform_device_count=8),
set before JAX is imported anywhere. On GPUs: XLA's latency-hiding scheduler on (test_ring.py checks that the ring's
transfers overlap its fused calls, which needs it) and NVLink multicast off (NCCL_NVLS_ENABLE=0, as the multi-GPU
machines require) unless set otherwise."""

import os

for _name, _flag in (("xla_force_host_platform_device_count", "--xla_force_host_platform_device_count=8"),
                     ("xla_gpu_enable_latency_hiding_scheduler", "--xla_gpu_enable_latency_hiding_scheduler=true")):
    if _name not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import math  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402


def enable_x64():
    """Context manager turning on float64 (for the pure-JAX reference only)."""
    cm = getattr(jax, "enable_x64", None)
    if cm is None:
        from jax.experimental import enable_x64 as cm  # older JAX
    return cm(True)


@pytest.fixture(scope="session")
def x64():
    return enable_x64


TINY = 1e-6


def rel_err(x, r):
    """SPEC.md section 5: max|x - ref| / max(max|ref|, tiny) over finite reference entries; NaN never passes and
    infinities (e.g. the LSE of rows that see no key) must sit at the same places."""
    x, r = np.asarray(x, np.float64), np.asarray(r, np.float64)
    assert not np.isnan(x).any(), "NaN in the result"
    assert np.array_equal(np.isinf(x), np.isinf(r)), "infinities differ"
    fin = np.isfinite(r)
    scale = max(np.max(np.abs(r[fin]), initial=0.0), TINY)
    return float(np.max(np.abs(x[fin] - r[fin]), initial=0.0) / scale)


def make_mesh(shape, names):
    """A Mesh of the first prod(shape) devices; skips the test when there are fewer."""
    n = math.prod(shape)
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices")
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)
