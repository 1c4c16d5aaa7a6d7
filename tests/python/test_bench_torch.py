"""bench/bench_torch.py's FlashAttention-4 rows, on the CPU with the timer and FA4 stood in for: each layer's row
carries FA4's forward, backward and deterministic backward times in the fields tools/results_dashboard.py reads
(run.anchor(shape, "fa4")), the call gets the sink logits and window sinkattn's rows get, and a call FA4 turns down
leaves "refused: <its message>" in the row instead of dropping it; the dashboard says so in the status."""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def bt(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_torch_under_test", ROOT / "bench" / "bench_torch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    times = {"fwd": 1.0, "fb": 3.0, "fb_det": 3.5}

    def fake_bench(fn, sets, reps=20, warmup=3):
        fn(*sets[0])  # the call itself runs (on the CPU), so that what it raises reaches the row
        return times[fn.__name__]

    monkeypatch.setattr(mod, "bench", fake_bench)
    mod.ROWS.clear()
    return mod


class FakeFA4:
    """flash_attn.cute.flash_attn_func as far as the bench uses it: returns (out, lse), refuses head dim 256 (its
    SM90 check is an AssertionError) and, when asked to, the deterministic backward."""

    def __init__(self, refuse_det=False):
        self.calls, self.refuse_det = [], refuse_det

    def __call__(self, q, k, v, causal=False, window_size=(None, None), learnable_sink=None, deterministic=False):
        self.calls.append(dict(causal=causal, window_size=window_size, sink=learnable_sink, det=deterministic))
        if q.shape[-1] > 128:
            raise AssertionError(f"(head_dim, head_dim_v)=({q.shape[-1]}, {v.shape[-1]}) is not supported on SM90.")
        if deterministic and self.refuse_det:
            raise NotImplementedError("deterministic backward not supported here")
        out = q * 1 + (k.float().sum() + v.float().sum()).to(q.dtype) * 0
        if learnable_sink is not None:
            out = out + learnable_sink.sum().to(q.dtype) * 0
        return out, None


def test_fa4_rows_time_every_pass_with_the_sinks_and_window_of_sinkattn(bt, monkeypatch):
    fa4 = FakeFA4()
    monkeypatch.setattr(bt, "fa4_function", lambda: (fa4, "4.0.0b40"))
    bt.fa4_rows("gpt-oss-sliding", 1, 16, 4, 2, 8, 127, True, 1e9, dev="cpu")
    (row,) = bt.ROWS
    assert row["method"] == "fa4" and row["shape"] == "gpt-oss-sliding"
    assert (row["fwd_ms"], row["fb_ms"], row["bwd_ms"], row["det_fb_ms"], row["det_bwd_ms"]) == (1.0, 3.0, 2.0, 3.5,
                                                                                                  2.5)
    assert row["bwd_tflops"] == pytest.approx(2.5 * 1e9 / 2.0 * 1e-9)
    assert not any(k.endswith("_error") for k in row)
    assert {c["det"] for c in fa4.calls} == {False, True}
    for c in fa4.calls:
        assert c["causal"] and c["window_size"] == (127, 0)
        assert c["sink"].dtype == torch.float32 and c["sink"].shape == (4,)
        assert torch.allclose(c["sink"], torch.full((4,), math.log(16)))
    # a layer without a window or sinks: FA4's "no window" and no sink
    fa4.calls.clear()
    bt.fa4_rows("mha-d128", 1, 16, 2, 2, 8, -1, False, 1e9, dev="cpu")
    assert all(c["window_size"] == (None, None) and c["sink"] is None for c in fa4.calls)


def test_a_refused_layer_keeps_its_row_with_fa4s_message(bt, monkeypatch):
    monkeypatch.setattr(bt, "fa4_function", lambda: (FakeFA4(refuse_det=True), "4.0.0b40"))
    bt.fa4_rows("hd256", 1, 16, 2, 2, 256, -1, False, 1e9, dev="cpu")
    bt.fa4_rows("gpt-oss-full", 1, 16, 4, 2, 8, -1, True, 1e9, dev="cpu")
    hd256, full = bt.ROWS
    assert hd256["fwd_error"] == "refused: (head_dim, head_dim_v)=(256, 256) is not supported on SM90."
    assert "fwd_ms" not in hd256 and "bwd_error" not in hd256
    assert full["fwd_ms"] == 1.0 and full["bwd_ms"] == 2.0 and "det_bwd_ms" not in full
    assert full["det_error"] == "refused: deterministic backward not supported here"
    assert bt.why(RuntimeError("CUDA error: out of memory")) == "failed: RuntimeError: CUDA error: out of memory"


def test_without_flash_attn_every_row_says_why(bt, monkeypatch):
    monkeypatch.setattr(bt, "fa4_function", lambda: (None, "ModuleNotFoundError: No module named 'flash_attn'"))
    bt.fa4_rows("gpt-oss-full", 1, 16, 4, 2, 8, -1, True, 1e9, dev="cpu")
    assert bt.ROWS == [dict(shape="gpt-oss-full", method="fa4",
                            unavailable="ModuleNotFoundError: No module named 'flash_attn'",
                            note="not available: ModuleNotFoundError: No module named 'flash_attn'")]


def test_fa4_function_and_site(bt, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    bt.add_fa4_site(str(tmp_path))
    assert sys.path[:2] == [str(tmp_path), str(tmp_path / "nvidia_cutlass_dsl" / "dsl_packages")]
    fn, version = bt.fa4_function()
    if fn is None:  # no FlashAttention-4 here: the reason, as the rows record it
        assert version.split(":")[0].endswith("Error")
    assert bt.pop_option(["a", "--methods", "fa4", "b"], "--methods") == "fa4"


def test_the_dashboard_reads_fa4_rows_and_their_refusals(bt, monkeypatch, tmp_path):
    """Rows of bench_torch.py --json (FA4 refusing head dim 256's forward and GPT-OSS full's deterministic backward)
    beside a sinkattn_gpu_bench run: FA4's times fill the FA4 columns, the refusals reach the status."""
    monkeypatch.setattr(bt, "fa4_function", lambda: (FakeFA4(refuse_det=True), "4.0.0b40"))
    bt.fa4_rows("gpt-oss-full", 1, 16, 4, 2, 8, -1, True, 1e9, dev="cpu")
    bt.fa4_rows("hd256", 1, 16, 2, 2, 256, -1, False, 1e9, dev="cpu")
    gpu = "NVIDIA H200"
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench" / "runs", bench / "runs")
    shutil.copytree(ROOT / "bench" / "log", bench / "log")
    (tmp_path / "gpu_bench.json").write_text(json.dumps({
        "tool": "sinkattn_gpu_bench", "command": "sinkattn_gpu_bench 10 all", "date": "2031-01-02T03:04:05Z",
        "gpu": gpu, "rows": [{"shape": "gpt-oss-full", "fwd_ms": 0.5, "bwd_ms": 2.5, "det_bwd_ms": 2.6},
                             {"shape": "hd256", "fwd_ms": 0.5, "bwd_ms": 2.0}]}))
    (tmp_path / "bench_torch.json").write_text(json.dumps({
        "tool": "bench_torch.py", "command": "python3 bench/bench_torch.py --methods sdpa,sinkattn,fa4",
        "date": "2031-01-02T03:10:00Z", "gpu": gpu, "torch": "9.9", "rows": bt.ROWS + [
            {"shape": "hd256", "method": "sdpa", "fwd_ms": 0.4, "fb_ms": 2.4, "bwd_ms": 2.0, "note": "no sink"}]}))
    out = bench / "RESULTS.md"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "results_dashboard.py"), "--runs-dir", bench / "runs",
                        "--out", out, "add", "--commit", "abc1234", "--log", "bench/log/2026-12-05-fa4-h100.md",
                        tmp_path / "gpu_bench.json", tmp_path / "bench_torch.json"],
                       cwd=ROOT, capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()

    def rows_of(section):
        part = text.split(f"## {section}")[1].split("\n## ")[0]
        return {" | ".join(line.split(" | ")[:3]): line for line in part.splitlines() if line.startswith("| ")}

    rows = {**rows_of("Training layers"), **rows_of("Head dims"), **rows_of("Deterministic backward")}
    # GPT-OSS full: FA4 forward 1.0 ms against sinkattn's 0.5 (2.00x), backward 2.0 against 2.5 (0.80x)
    assert "| 0.500 | 1.000 | — |" in rows["| GPT-OSS full | fwd | H200"]
    assert "| 2.500 | 2.000 | — |" in rows["| GPT-OSS full | bwd | H200"]
    assert "FA4 refused: deterministic backward not supported here" in rows["| GPT-OSS full | H200 | 2.600"]
    hd = rows["| head dim 256 | fwd | H200"]
    assert "against SDPA; FA4 refused: (head_dim, head_dim_v)=(256, 256) is not supported on SM90." in hd


def test_rows_without_a_deterministic_pass_keep_the_fields_of_the_anchor_rows(bt):
    """SDPA and FlexAttention have no deterministic switch: their rows (autograd_rows with det=False) time forward and
    forward + backward only, and a call that raises leaves its reason in the row instead of dropping the row."""
    sets = bt.random_sets((1, 2, 16, 8), (1, 2, 16, 8), "cpu")
    sdpa = lambda q, k, v, det: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    row = bt.autograd_rows("gpt-oss-full", "sdpa (no sink)", "sdpa", sdpa, sets, 1e9, "no sink", det=False)
    assert row == dict(shape="gpt-oss-full", method="sdpa", note="no sink", fwd_ms=1.0, fwd_tflops=1.0, fb_ms=3.0,
                       bwd_ms=2.0, bwd_tflops=2.5 * 1e9 / 2.0 * 1e-9)
    assert bt.ROWS == [row]

    def broken(q, k, v, det):
        raise ValueError("no kernel for this shape")

    row = bt.autograd_rows("hd256", "flex + sink via lse", "flex_sink", broken, sets, 1e9, "sink", det=False)
    assert row["fwd_error"] == "refused: no kernel for this shape" and "fb_ms" not in row
