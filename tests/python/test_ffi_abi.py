"""The ctypes side of the JAX binding (python/sinkattn/jax/_ffi.py) against the C ABI (include/sinkattn/sinkattn.h):

- every field of the ctypes mirrors of sinkattn_tensor_t / sinkattn_params_t has the C offset and size (compiled
  with the C compiler from the header; the load-time check sinkattn_jax_params_layout covers 9 values only);
- the C ABI functions the Python side calls come from the package's own libsinkattn, even with another
  libsinkattn first on LD_LIBRARY_PATH (under both names: libsinkattn.so, the wheel's SONAME, and libsinkattn.so.0,
  a CMake build tree's);
- the shape-only size query's error path (SPEC.md section 4) gives the message, repeatedly, without a crash.
"""

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest

import sinkattn.jax as sj
from sinkattn.jax import _ffi

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _header_dir():
    for d in (os.path.join(REPO, "include"),
              os.path.join(os.path.dirname(os.path.dirname(_ffi.__file__)), "include")):
        if os.path.isfile(os.path.join(d, "sinkattn", "sinkattn.h")):
            return d
    pytest.skip("sinkattn.h not found")


def _c_layout(tmp_path, struct, fields):
    # $CC first: tools/test-wheel.sh runs the suite with no compiler on PATH and names one for this probe only.
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lines = [f'  printf("sizeof %zu\\n", sizeof({struct}));']
    for f in fields:
        lines.append(f'  printf("{f} %zu %zu\\n", offsetof({struct}, {f}), sizeof((({struct}*)0)->{f}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include \"sinkattn/sinkattn.h\"\nint main(void) {\n" +
                   "\n".join(lines) + "\n  return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", _header_dir(), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    res = {}
    for line in out:
        if line:
            name, *vals = line.split()
            res[name] = tuple(int(x) for x in vals)
    return res


@pytest.mark.parametrize("mirror,struct", [(_ffi.Tensor, "sinkattn_tensor_t"), (_ffi.Params, "sinkattn_params_t")])
def test_ctypes_mirror_matches_every_c_field(tmp_path, mirror, struct):
    names = [f[0] for f in mirror._fields_]
    c = _c_layout(tmp_path, struct, names)
    assert c["sizeof"] == (ctypes.sizeof(mirror),)
    for name in names:
        field = getattr(mirror, name)
        assert c[name] == (field.offset, field.size), f"{struct}.{name}: C (offset, size) {c[name]}, " \
                                                      f"ctypes {(field.offset, field.size)}"


def test_c_abi_resolves_to_the_package_library_despite_ld_library_path(tmp_path):
    """A copy of the library first on LD_LIBRARY_PATH must not be the one the binding calls."""
    _ffi.library()
    handler = _ffi._candidates()[0]
    core = _ffi._core_library_next_to(handler)
    if core is None:
        pytest.skip("no libsinkattn next to the handler library")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for name in ("libsinkattn.so", "libsinkattn.so.0"):
        shutil.copy(core, decoy / name)
    code = textwrap.dedent("""
        from sinkattn.jax import _ffi
        lib = _ffi.library()
        print(_ffi._file_defining(lib.sinkattn_forward_workspace_size))
    """)
    env = dict(os.environ, LD_LIBRARY_PATH=str(decoy) + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
               JAX_PLATFORMS="cpu", XLA_FLAGS="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == core


def test_shape_only_query_errors_repeatedly():
    """The trace-time size query with NULL data pointers and a wrong sinks shape (the message is built with
    std::ostringstream in the library) raises with the library's message, on every platform the op lowers for,
    many times in a row (the thread-local last-error string is copied at once)."""
    q = jnp.asarray(jnp.arange(2 * 8 * 4 * 16, dtype=jnp.float32).reshape(2, 8, 4, 16) / 100.0)
    for _ in range(50):
        with pytest.raises(sj.SinkattnError, match=r"sinks: shape must be \[4\], got \[3\]"):
            sj.dot_product_attention(q, q, q, sinks=jnp.full((3,), 20.0))
    for platform in _ffi.platforms():
        tensors = {"q": ((2, 8, 4, 16), jnp.float32), "k": ((2, 8, 4, 16), jnp.float32),
                   "v": ((2, 8, 4, 16), jnp.float32), "sinks": ((3,), jnp.float32),
                   "out": ((2, 8, 4, 16), jnp.float32), "softmax_lse": ((2, 4, 8), jnp.float32)}
        for backward in (False, True):
            with pytest.raises(sj.SinkattnError, match="sinks"):
                _ffi.workspace_size(backward, platform, tensors, {"softmax_type": 2})
    with pytest.raises(sj.SinkattnError, match="rank"):
        _ffi.workspace_size(False, "cpu", {"q": ((1, 1, 1, 1, 8), jnp.float32)}, {})
