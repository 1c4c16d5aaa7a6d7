"""pytest setup for the Python tests: 8 virtual CPU devices (CI: XLA_FLAGS=--xla_force_host_platform_device_count=8),
set before JAX is imported anywhere."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import jax  # noqa: E402
import pytest  # noqa: E402


def enable_x64():
    """Context manager turning on float64 (for the pure-JAX reference only)."""
    cm = getattr(jax, "enable_x64", None)
    if cm is None:
        from jax.experimental import enable_x64 as cm  # older JAX
    return cm(True)


@pytest.fixture(scope="session")
def x64():
    return enable_x64
