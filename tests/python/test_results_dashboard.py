"""bench/RESULTS.md is what tools/results_dashboard.py builds from bench/runs/*.json (so the page cannot drift from
the runs), and the script takes the benchmark programs' --json output in: a new run's numbers replace the older
run's on its GPU, with its anchors and statuses."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "results_dashboard.py"


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def test_results_md_is_the_dashboard_of_the_runs():
    r = run("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_check_fails_on_a_stale_page(tmp_path):
    out = tmp_path / "bench" / "RESULTS.md"
    out.parent.mkdir()
    shutil.copytree(ROOT / "bench" / "log", tmp_path / "bench" / "log")
    out.write_text((ROOT / "bench" / "RESULTS.md").read_text().replace("| 2.037 |", "| 1.999 |", 1))
    r = run("--check", "--runs-dir", ROOT / "bench" / "runs", "--out", out)
    assert r.returncode == 1
    assert "not what" in r.stderr


def test_a_new_run_from_benchmark_json_replaces_the_older_one(tmp_path):
    bench = tmp_path / "bench"
    shutil.copytree(ROOT / "bench" / "runs", bench / "runs")
    shutil.copytree(ROOT / "bench" / "log", bench / "log")
    out = bench / "RESULTS.md"
    gpu = "NVIDIA H200"
    # The shape of sinkattn_gpu_bench --json and bench/bench_torch.py --json (tests/gpu/gpu_bench.cpp,
    # bench/bench_torch.py), with made-up times: sinkattn faster than SDPA forward, slower backward.
    (tmp_path / "gpu_bench.json").write_text(json.dumps({
        "tool": "sinkattn_gpu_bench", "command": "sinkattn_gpu_bench 10 all --json gpu_bench.json",
        "date": "2031-01-02T03:04:05Z", "gpu": gpu, "reps": 10, "dtype": "bf16",
        "rows": [{"shape": "gpt-oss-full", "fwd_ms": 0.5, "fwd_tflops": 549.8, "bwd_ms": 2.5, "bwd_tflops": 274.9,
                  "det_bwd_ms": 2.6},
                 {"shape": "gpt-oss-sliding", "fwd_ms": 0.1, "bwd_ms": 0.3, "det_bwd_ms": 0.32}]}))
    (tmp_path / "bench_torch.json").write_text(json.dumps({
        "tool": "bench_torch.py", "command": "python3 bench/bench_torch.py --json bench_torch.json",
        "date": "2031-01-02T03:10:00Z", "gpu": gpu, "torch": "9.9",
        "rows": [{"shape": "gpt-oss-full", "method": "sdpa", "fwd_ms": 0.6, "fb_ms": 2.6, "bwd_ms": 2.0,
                  "note": "no sink"}]}))
    r = run("--runs-dir", bench / "runs", "--out", out, "add", "--commit", "abc1234", "--log",
            "bench/log/2026-11-30-hopper-forward.md", tmp_path / "gpu_bench.json", tmp_path / "bench_torch.json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (bench / "runs" / "2031-01-02-h200-abc1234.json").exists()
    text = out.read_text()
    layers = text.split("## Training layers")[1].split("\n## ")[0]
    rows = {" | ".join(line.split(" | ")[:3]): line for line in layers.splitlines() if line.startswith("| GPT-OSS")}
    fwd = rows["| GPT-OSS full | fwd | H200"]
    assert "| 0.500 | — | 0.600 |" in fwd and "| 1.20x |" in fwd and "2031-01-02 abc1234 H200" in fwd
    assert "met (against SDPA; no FA4 in this run)" in fwd
    bwd = rows["| GPT-OSS full | bwd | H200"]
    assert "| 2.500 | — | 2.000 |" in bwd and "| 0.80x |" in bwd and "**missed**" in bwd
    # the sliding target on the H200 is 0.45 ms forward + backward: 0.4 meets it
    assert "| 0.400 |" in rows["| GPT-OSS sliding | fwd + bwd | H200"]
    assert "| met |" in rows["| GPT-OSS sliding | fwd + bwd | H200"]
    # the H100 rows keep their own runs; the new run's command is listed without its --json argument
    assert "e2da915 H100" in rows["| GPT-OSS full | fwd | H100"]
    assert ("| abc1234 | `sinkattn_gpu_bench 10 all`; `python3 bench/bench_torch.py` | "
            "[2026-11-30-hopper-forward.md](log/2026-11-30-hopper-forward.md) |") in text
    # and the page it wrote is what --check expects
    assert run("--check", "--runs-dir", bench / "runs", "--out", out).returncode == 0
