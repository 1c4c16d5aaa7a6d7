"""The README's quick starts run as written: every ```python block of README.md runs in a fresh Python process on the
CPU (JAX_PLATFORMS=cpu, no CUDA device visible) and must exit 0 with no NaN in what it prints; a block that imports a
package this environment lacks (torch, transformers) is skipped, naming it. The ```c block must be
examples/quickstart.c, which the CTest `example_quickstart_c` compiles against the library and runs."""

import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")


def _blocks(lang):
    """(label, code) of each ```lang block: label is the last **bold** text before the block."""
    text = open(README, encoding="utf-8").read()
    out = []
    for m in re.finditer(r"^```" + lang + r"\n(.*?)^```$", text, flags=re.S | re.M):
        labels = re.findall(r"\*\*([^*]+)\*\*", text[:m.start()])
        out.append((labels[-1] if labels else f"block at offset {m.start()}", m.group(1)))
    return out


def _missing_modules(code):
    """Top-level modules the block imports that cannot be found here."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


PYTHON_BLOCKS = _blocks("python")


def test_readme_has_quick_starts():
    labels = [label for label, _ in PYTHON_BLOCKS]
    for want in ("JAX", "PyTorch", "HF transformers, GPT-OSS", "Decode over a KV cache", "Context parallelism"):
        assert any(label.startswith(want) for label in labels), f"no ```python block after **{want}** in README.md"


@pytest.mark.parametrize("label,code", PYTHON_BLOCKS, ids=[label for label, _ in PYTHON_BLOCKS])
def test_python_quick_start_runs(label, code):
    missing = _missing_modules(code)
    if missing:
        pytest.skip(f"README block '{label}' needs {', '.join(missing)}, not installed here")
    env = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    env.pop("XLA_FLAGS", None)  # the block runs as a user would run it, with JAX's defaults
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"README block '{label}' failed:\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip(), f"README block '{label}' printed nothing"
    assert "nan" not in proc.stdout.lower(), f"README block '{label}' printed NaN:\n{proc.stdout}"


def test_c_quick_start_is_the_example_file():
    blocks = _blocks("c")
    assert len(blocks) == 1, f"README.md has {len(blocks)} ```c blocks, expected the one quick start"
    with open(os.path.join(ROOT, "examples", "quickstart.c"), encoding="utf-8") as f:
        assert blocks[0][1] == f.read(), "README.md's C quick start differs from examples/quickstart.c"
