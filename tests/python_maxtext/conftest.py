"""The MaxText tests run in their own Python 3.12 environment (tools/setup-maxtext.sh, tools/test-maxtext.sh) on
JAX's CPU backend with 8 virtual devices (the context-parallel tests shard over them)."""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))
