"""examples/finetune_gpt_oss_hf.py in a tiny configuration: HF GPT-OSS with attn_implementation="sinkattn" trains
(the held-out loss goes down, the sinks move), its first steps equal the same steps with "eager", and --benchmark
runs every attention implementation it lists."""

import importlib.util
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("finetune_gpt_oss_hf",
                                                  os.path.join(ROOT, "examples", "finetune_gpt_oss_hf.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not os.path.isdir("/usr/share/common-licenses"):
        pytest.skip("/usr/share/common-licenses not present")
    return mod


TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--experts", "2",
        "--sliding-window", "16", "--context", "64", "--batch", "2", "--lr", "1e-2", "--warmup", "5"]


def test_training_run(example, tmp_path):
    out = tmp_path / "res.json"
    lines = []
    rc = example.main(TINY + ["--steps", "40", "--check-steps", "2", "--eval-every", "20", "--log-every", "20",
                              "--json", str(out)], log=lines.append)
    assert rc == 0, "\n".join(lines)
    import json

    res = json.loads(out.read_text())
    assert res["check"]["ok"] and res["check"]["max_rel_diff"] <= 1e-4
    assert res["evals"][-1][1] < res["evals"][0][1] - 0.5
    assert any("sinks" in line for line in lines)


def test_benchmark_runs(example):
    lines = []
    # head dim 16: the smallest FlexAttention's GPU lowering (Inductor) accepts
    tiny = TINY[:TINY.index("--head-dim") + 1] + ["16"] + TINY[TINY.index("--head-dim") + 2:]
    assert example.main(tiny + ["--benchmark", "--bench-steps", "1", "--bench-warmup", "1"], log=lines.append) == 0
    text = "\n".join(lines)
    assert "sinkattn" in text and "eager" in text and "failed" not in text, text


def test_benchmark_says_when_flash_attention_4_is_not_there(example, tmp_path):
    """attn_implementation="flash_attention_4" beside "sinkattn": where FlashAttention-4 cannot run (here: no GPU) the
    benchmark says why, records it in the JSON, and still measures the others."""
    import json

    lines = []
    out = tmp_path / "bench.json"
    assert example.main(TINY + ["--benchmark", "--bench-steps", "1", "--bench-warmup", "1", "--impls",
                                "sinkattn,flash_attention_4", "--json", str(out)], log=lines.append) == 0
    res = json.loads(out.read_text())
    why = example.fa4_unavailable(res["config"]["device"])
    if why is None:
        pytest.skip("FlashAttention-4 runs here: the GPU tests cover it")
    text = "\n".join(lines)
    assert f"flash_attention_4 not available: {why}" in text, text
    assert res["benchmark"]["flash_attention_4"] is None and res["unavailable"] == {"flash_attention_4": why}
    assert res["benchmark"]["sinkattn"] > 0 and "failed" not in text
