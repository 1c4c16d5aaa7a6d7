#!/usr/bin/env python3
"""bench/RESULTS.md, the results dashboard, built from the benchmark runs in bench/runs/*.json.

A run file is one sitting on one machine: its date, device, the commit of the library, the bench/log file that says
what it changed and what it means, and "outputs": the JSON the benchmark programs write (sinkattn_gpu_bench --json,
bench/bench_torch.py --json, sinkattn_gpu_bench_decode --json, sinkattn_gpu_bench_paged_prefill --json,
examples/finetune_gpt_oss_hf.py --benchmark --json,
examples/train_sink_lm.py --benchmark --json), or the same fields transcribed from a run that predates --json.

    tools/results_dashboard.py            write bench/RESULTS.md
    tools/results_dashboard.py --check    exit 1 if bench/RESULTS.md is not what the runs give
    tools/results_dashboard.py add --commit SHA --log bench/log/DATE-TOPIC.md OUT.json [OUT.json ...]
                                          one run file from benchmark output (a file of the same name is replaced),
                                          then write bench/RESULTS.md

Each table row is the newest run on its device that measured the row; its anchors (FlashAttention-4, torch SDPA,
FlexAttention, eager, the reference) come from that same run, or the cell stays empty. The targets and the one
sentence that says why a missed target is missed live in TARGETS and REASONS below, each reason with the log file
that holds its measurement. Standard library only."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The shapes of sinkattn_gpu_bench / bench_torch.py: (b, s, h_q, d, window_left); FLOPs as the programs count them
# (forward 4 * b * h_q * d * visible pairs, backward 2.5x), to turn an anchor's TFLOP/s into ms.
SHAPES = {
    "gpt-oss-full": (2, 4096, 64, 64, -1),
    "gpt-oss-sliding": (2, 4096, 64, 64, 127),
    "mha-d128": (2, 4096, 32, 128, -1),
    "hd256": (2, 4096, 16, 256, -1),
    "gpt-oss-full-16k": (1, 16384, 64, 64, -1),
    "mha-d128-16k": (1, 16384, 32, 128, -1),
}
LAYERS = {
    "gpt-oss-full": "GPT-OSS full",
    "gpt-oss-sliding": "GPT-OSS sliding",
    "mha-d128": "MHA d128",
    "hd256": "head dim 256",
    "gpt-oss-full-16k": "GPT-OSS full, s 16384",
    "mha-d128-16k": "MHA d128, s 16384",
    "gpt-oss-chunk1k-ctx8k": "GPT-OSS prefill chunk of 1024 queries over 8192 keys",
}

# Targets (the project's open issues). Sliding: forward + backward in ms, per GPU.
TARGET_SPEED = 1.0  # sinkattn's speed against each anchor: the anchor's time / sinkattn's
TARGET_SLIDING_MS = {"H200": 0.45, "H100": 0.60}
TARGET_DET_X = 0.9  # deterministic backward / default backward speed, and faster than FlashAttention-4's
TARGET_X_PLAIN = 0.75  # bias and dropout: the plain layer's time / the time with them
TARGET_DECODE_READ = 0.90  # K/V of 64 MB or more: share of a streaming-read kernel's bandwidth
TARGET_DECODE_SLIDING = 0.80  # the sliding layer at batch 256: the same share
TARGET_DECODE_FLOOR_X = 2.0  # K/V under 4 MB: time per call over the launch floor, in a CUDA graph
TARGET_PAGED_X = 0.9  # paged prefill: the contiguous call's time / the paged call's, same keys, same run

# Why a target is missed, in one sentence, and the log that measured it. Shown only where the status is "missed".
REASONS = {
    ("fwd", "gpt-oss-full"): (
        "FlashAttention-4's forward is faster in the same run and not yet profiled beside it; the last ncu "
        "profile of this kernel showed 51% of issue slots busy with 0.92 eligible warps per scheduler. Its "
        "persistent blocks take the tiles in a fixed stride, which gives the busiest SM 1.03x the mean key blocks "
        "(a model, not measured: docs/design/hopper-forward.md).",
        "2026-12-06-named-parts-fa4-decode.md"),
    ("bwd", "gpt-oss-full"): (
        "One block barrier a step (862de92: the producer warpgroup loads the steps and adds the dq tiles, dS^T in two "
        "stages, no spills in the math) took the C ABI backward from 2.04 to 1.81-1.86 ms (H100, 2026-12-07): 1.2x "
        "FlashAttention-4's through autograd in the same run (cb21d0d); not profiled since: both warpgroups still "
        "meet at the one barrier each step and do their softmax at once (step timelines of 8e7c6ee's kernel). Storing "
        "each query block's first dq tile instead of zeroing the accumulator made it 7% slower (inferred, not "
        "profiled: the key blocks then add to one tile at once).",
        "2026-12-07-dq-first-store-default.md"),
    ("fwd", "mha-d128"): (
        "Two consumer warpgroups are the most the registers allow at head dim 128, and they leave 62% of cycles "
        "with no eligible warp (ncu). The persistent blocks take the tiles in a fixed stride, which gives the "
        "busiest SM 1.10x the mean key blocks (a model, not measured: docs/design/hopper-forward.md).",
        "2026-12-05-pdl-dsinks.md"),
    ("bwd", "mha-d128"): (
        "The dK dV kernel takes 254 registers at 64 query rows per step, so neither a 128-row step nor a third "
        "warpgroup fits; 68% of cycles have no eligible warp (ncu, 2026-12-05); without the dq reduce-adds (a probe, "
        "8e7c6ee's kernels, H100, 2026-12-07) the backward took 1.63 ms against 1.91.",
        "2026-12-07-backward-step-trace.md"),
    ("fb", "gpt-oss-sliding"): (
        "Through the C ABI forward + backward is 0.587-0.592 ms on the H100 (three runs of cb21d0d's kernels, "
        "2026-12-07), under 0.60; through torch autograd 0.647, the op and autograd adding about 55 us. Of the "
        "kernels' time the backward's preprocess (96 us) and dq convert (67 us) run at memory speed (H100, 13faacb), "
        "the dK dV kernel's 128 x 128 tiles see the 127-key band twice over, and the forward stays on the sm_80 "
        "kernel (the Hopper short-window variant measured 15% slower, H200).",
        "2026-12-07-h100-cb21d0d-fa4.md"),
    ("fwd", "hd256"): (
        "The warp-specialised forward takes 64 keys per step at head dim 256 (192 KiB of shared memory); 80 keys "
        "measured 4% faster but failed two edge cases. The persistent blocks take the tiles in a fixed stride, "
        "which gives the busiest SM 1.12x the mean key blocks (a model, not measured: "
        "docs/design/hopper-forward.md).",
        "2026-12-03-forward-head-dim-256.md"),
    ("bwd", "hd256"): (
        "Each 64-key step adds a 64 x 256 fp32 dq tile (4.4 GB a backward): the kernel takes 1.94 ms without "
        "those adds and 2.26 ms with them (H200).",
        "2026-12-05-dkdv-head-dim-256.md"),
    ("fwd", "gpt-oss-full-16k"): ("Not profiled at s 16384.", "2026-12-05-fa4-h100.md"),
    ("bwd", "gpt-oss-full-16k"): (
        "Not profiled at s 16384; at s 4096 (step timelines, H100, 2026-12-07) warpgroup 0 starts its S^T 530 cycles "
        "after the other, behind thread 0's reduce-adds and loads, and both warpgroups do their softmax at once.",
        "2026-12-07-backward-step-trace.md"),
    ("fwd", "mha-d128-16k"): (
        "Not profiled at s 16384 beyond the forward's L2 sections (3 heads a section, 5.6% faster than none).",
        "2026-12-03-forward-l2-sections.md"),
    ("bwd", "mha-d128-16k"): (
        "Not profiled at s 16384; at s 4096 the dK dV kernel is bound by its registers (254, no 128-row step).",
        "2026-12-05-pdl-dsinks.md"),
    ("det", "*"): (
        "With the dq writer (f146020) and turn 0's stores (0f9af51: no zeroing pass) the deterministic backward is "
        "as fast as the default at head dim 64 (H100, 2026-12-07); FlashAttention-4's is faster because its default "
        "backward is (1.33x at GPT-OSS full in the same run), determinism costing it 15%. Rows of runs before those "
        "commits predate them.",
        "2026-12-07-dq-first-store.md"),
    ("det", "mha-d128"): (
        "The default head-dim-128 variant keeps thread 0 issuing the adds (the dq writer made it 11% slower: its "
        "math spills at 240 registers) while the deterministic one has the writer and turn 0's stores: 0.90x of the "
        "default on the H100 (2026-12-07); FlashAttention-4's deterministic backward is faster because its default "
        "backward is (1.51x in the same run).",
        "2026-12-07-dq-first-store.md"),
    ("det", "hd256"): (
        "Per-step turns over 64-key blocks: twice the blocks in each query block's order.",
        "2026-12-05-dkdv-head-dim-256.md"),
    ("fwd", "+bias"): (
        "The bias's own work per element (unpacking, an extra FMA, the visible-column compares) beside the exp2; "
        "not profiled on the current kernels.",
        "2026-12-02-bias-tma.md"),
    ("bwd", "+bias"): (
        "The d_bias reduction reads back the fp32 dS workspace the dK dV kernel writes (2.1 GB and 530 us at MHA; "
        "0.54 GB at GPT-OSS after the group sum).",
        "2026-12-02-bias-ldmatrix.md"),
    ("fwd", "+dropout"): (
        "The Philox blocks of SPEC.md's keep words alone take 1.30 ms at GPT-OSS full, 1.9x the plain forward.",
        "2026-12-01-dropout-and-torch-op.md"),
    ("bwd", "+dropout"): (
        "The kernels are bound by the latency of their Philox chains: no pipe above 50% busy, under one eligible "
        "warp per scheduler (ncu).",
        "2026-12-02-dropout-forward-hopper.md"),
    ("decode", "small"): (
        "A one-split call is one warp per scheduler issuing its instructions at 5.9 cycles each (ncu, 8 blocks: about "
        "2,000 per warp before the page split by a precomputed divisor, which took 10% of the kernel's SASS), behind "
        "the chain sequence length, page table, then K / V: 5.3-6.5 us (H100, 2026-12-06). A key loop of 325 "
        "instead of 485 instructions a tile (each warp copying its own keys' lines) took them 9% faster (c2b23ac "
        "against bea352a, H100, 2026-12-07, `tools/gpu-ab.sh run 20 2` with the decode bench); 400a01e's decode kernels, no "
        "division before the first key load, 10% more, and the splits combined in their cluster 13% more at batch 1 "
        "(against c2b23ac's, H200, 2026-12-07, the same command): 4.4 us for one split, 6.6x the floor. At batch 1 and "
        "1k keys, 8 splits in clusters of 8 instead of 6 in clusters of 6 (de04f7b's split rule against c3a0d54, "
        "H100, 2026-12-07, the same command): 8.08 -> 7.12 us; one split still takes 4.3 us "
        "on the H100, 4.6x its 0.94 us floor.",
        "2026-12-07-decode-split-rule.md"),
    ("decode", "read"): (
        "At small batches each block streams a long key range with few warps an SM: under ncu (cc14058's decode "
        "kernels, H100, 2026-12-06, `ncu -k regex:decode_kernel -c 1`) batch 1 at 32k keys ran 344 blocks, 10.5 "
        "warps per SM, 6.9 cycles per issued instruction, DRAM 62% busy. Forced split counts "
        "(`sinkattn_gpu_bench_decode 20 b8 0 --sweep-splits`, c3a0d54, H100, 2026-12-07) put the rule's count at "
        "batch 8 within 5% of the best in 14 of 16 configurations (the others 1.07x and 1.23x). Each warp copying "
        "its own keys' whole lines (no block barrier a tile) took the configurations of 64 MB and more 2% faster "
        "(c2b23ac against bea352a, H100, 2026-12-07, `tools/gpu-ab.sh run 20 2` with the decode bench); at batch 1, "
        "16 splits (one block an SM) instead of the 33-43 that filled every resident slot took 32k keys from 58% to "
        "64-70% of the read and 128k keys with pages of 64 from 75% to 86% (de04f7b against c3a0d54, H100, "
        "2026-12-07, the same command).",
        "2026-12-07-decode-split-rule.md"),
    ("decode", "sliding"): (
        "A block reads 2-3 tiles and exits, so each block's chain sequence length -> page table -> K / V is what the "
        "SM waits on: 4 blocks an SM (the short-range configuration, Q in registers) instead of 3 took batch 256 "
        "from 36-46% to 41-53% of the streaming read on the H200 (A/B, 2026-12-06); each warp copying its own keys "
        "(no block barrier a tile) took batch 256 on the H100 from 61-71% to 65-78% (c2b23ac against bea352a, "
        "2026-12-07, `tools/gpu-ab.sh run 20 2` with the decode bench); not profiled since.",
        "2026-12-07-decode-warp-lines.md"),
}

INTRO = """\
# Benchmark results

<!-- Generated by tools/results_dashboard.py from bench/runs/*.json: edit those (or the script), then run it. -->

Where sinkattn stands against each target: for every benchmark, the newest run on each device, beside the anchors
measured in that same run. Times in ms (CUDA events, inputs rotated over 3 sets): the median of calls timed alone, or
with `bench_torch.py --timing pipelined` the mean of calls issued back to back (the run's command says which); "x" is
the anchor's time over sinkattn's (above 1.00x sinkattn is faster). Where a run timed sinkattn's torch API as it timed
the anchors (bench_torch.py), the training-layer and deterministic tables compare that; else sinkattn_gpu_bench's C
ABI time. Each row names its run (date, commit of the library, GPU); the
[runs](#runs) table gives the commands and the log of each. `bench/log/` holds the dated runs: what changed, the
tables, what they mean.

Shapes (sinkattn_gpu_bench, bench/bench_torch.py): bf16, b 2, s 4096, causal (bottom-right). GPT-OSS full: h_q 64,
h_kv 8, d 64, learnable sinks (log s); sliding: the same with window_left 127; MHA d128: h 32, d 128, no sinks; head
dim 256: h 16, no sinks; s 16384: b 1. Anchors: FlashAttention-4 (FA4, with `learnable_sink`), torch SDPA (no sink:
cuDNN; it has no window, so no sliding row), FlexAttention (the sink through its LSE, compiled). An anchor's backward
is its forward + backward through autograd minus its forward."""


def short_device(name: str) -> str:
    m = re.search(r"\b([A-Z]\d{2,3})\b", name)
    return m.group(1) if name.startswith("NVIDIA") and m else name


def fmt_ms(v):
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def fmt_x(v):
    return "—" if v is None else f"{v:.2f}x"


def fmt_tps(v, unit=None):
    if v is None:
        return "—"
    return f"{v / 1e6:.2f}M" if unit == 1e6 or v >= 1e6 else f"{v:,.0f}"


def model_text(cfg):
    """The training examples' model and step, from their --json "config"."""
    parts = [f"{cfg['layers']} layers" if "layers" in cfg else None,
             f"{cfg['heads']}/{cfg['kv_heads']} heads of {cfg['head_dim']}" if "heads" in cfg else None,
             f"context {cfg['context']}" if "context" in cfg else None,
             f"batch {cfg['batch']}" if "batch" in cfg else None,
             {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(cfg.get("dtype"), cfg.get("dtype"))]
    return ", ".join(p for p in parts if p) or "configuration not recorded"


def fwd_flop(shape):
    b, s, hq, d, win = SHAPES[shape]
    pairs = sum(min(i + 1, win + 1) if win >= 0 else i + 1 for i in range(s))
    return 4.0 * b * hq * d * pairs


class Run:
    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data
        self.id = path.stem
        self.date = data["date"][:10]
        t = re.search(r"\d\d:\d\d", data.get("time_utc", "") or data["date"][10:])
        self.sort_key = (self.date, t.group(0) if t else "", self.id)
        self.device = data["device"]
        self.short = short_device(self.device)
        self.commit = data["commit"]
        self.log = data["log"]
        self.outputs = data["outputs"]
        self.label = None  # "R3", given once the runs are sorted

    def rows(self, tool=None):
        for o in self.outputs:
            if tool is None or o["tool"] == tool:
                yield from o.get("rows", [])

    def bench(self, shape):
        """The sinkattn_gpu_bench row of `shape`, or None."""
        return next((r for r in self.rows("sinkattn_gpu_bench") if r["shape"] == shape), None)

    def compared(self, shape):
        """The sinkattn row of `shape` that this run's anchors are compared with: bench_torch.py's torch API row
        ("sinkattn_torch_api", timed through autograd as its FA4 / SDPA rows are) where the run has one with those
        times, else the sinkattn_gpu_bench row (the C ABI's own timing; runs without the torch API rows)."""
        api = self.anchor(shape, "sinkattn_torch_api")
        if api is not None and api.get("fwd_ms") is not None and api.get("bwd_ms") is not None:
            return api
        return self.bench(shape)

    def anchor(self, shape, method):
        return next((r for r in self.rows() if r.get("method") == method and r.get("shape") == shape), None)

    def tool(self, tool):
        return next((o for o in self.outputs if o["tool"] == tool), None)

    def cell(self):
        return f"[{self.label}](#runs) {self.date} {self.commit} {self.short}"


def sinkattn_value(row, what):
    if row is None:
        return None
    if what == "fb":
        f, b = row.get("fwd_ms"), row.get("bwd_ms")
        return None if f is None or b is None else f + b
    return row.get({"fwd": "fwd_ms", "bwd": "bwd_ms", "det": "det_bwd_ms"}[what])


def anchor_value(row, shape, what):
    """ms of an anchor row: its own ms, else from its TFLOP/s (bench_torch.py prints both)."""
    if row is None:
        return None
    f = row.get("fwd_ms")
    if f is None and row.get("fwd_tflops"):
        f = fwd_flop(shape) / row["fwd_tflops"] * 1e-9
    b = row.get("bwd_ms")
    if b is None and row.get("fb_ms") is not None and f is not None:
        b = row["fb_ms"] - f
    if b is None and row.get("bwd_tflops"):
        b = 2.5 * fwd_flop(shape) / row["bwd_tflops"] * 1e-9
    if what == "fwd":
        return f
    if what == "bwd":
        return b
    if what == "det":
        return row.get("det_bwd_ms")
    return row.get("fb_ms") if row.get("fb_ms") is not None else (None if f is None or b is None else f + b)


def anchor_absent(row, what, name="FA4"):
    """Why an anchor row gives no time for `what` ("fwd", "bwd", "fb", "det"): the reason the row records
    (bench_torch.py: "unavailable", or fwd_error / bwd_error / det_error: "refused: <the library's message>" or
    "failed: <error>"), else that the run has none."""
    if row is not None:
        keys = ["unavailable", "fwd_error"] + {"bwd": ["bwd_error"], "fb": ["bwd_error"], "det": ["det_error"]}.get(
            what, [])
        for key in keys:
            if row.get(key):
                text = ("not available: " if key == "unavailable" else "") + " ".join(str(row[key]).split())
                text = text.replace("|", "/")
                return f"{name} {text[:120] + ('...' if len(text) > 120 else '')}"
    return f"no {name} in this run"


class Dashboard:
    def __init__(self, runs):
        self.runs = sorted(runs, key=lambda r: r.sort_key)
        self.used = set()

    def latest(self, probe):
        """For each device, the newest run for which probe(run) is not None: [(run, value)], sorted by device."""
        best = {}
        for run in self.runs:
            v = probe(run)
            if v is not None:
                best[run.short] = (run, v)
        out = [best[k] for k in sorted(best)]
        for run, _ in out:
            self.used.add(run.id)
        return out

    def latest_judged(self, probe, anchored):
        """For each device, the newest run for which probe(run) is not None and anchored(run) holds (the row's
        anchors measured in that run), followed by the newest run of all where that is a later one without them
        (sinkattn's newer time, not judged against an older run's anchors): [(run, value)], sorted by device."""
        newest = {r.short: (r, v) for r, v in self.latest(probe)}
        judged = {r.short: (r, v) for r, v in self.latest(lambda r: probe(r) if anchored(r) else None)}
        out = []
        for dev in sorted(set(newest) | set(judged)):
            if dev in judged:
                out.append(judged[dev])
            if dev not in judged or newest[dev][0] is not judged[dev][0]:
                out.append(newest[dev])
        return out

    @staticmethod
    def missed(key_what, key_shape, text=None):
        reason = REASONS.get((key_what, key_shape)) or REASONS.get((key_what, "*"))
        if reason is None:
            return "**missed**" + (f" ({text})" if text else "")
        sentence, log = reason
        return "**missed**" + (f" ({text})" if text else "") + f": {sentence} ([log](log/{log}))"

    # ---- sections ----
    def speed_section(self, title, rows, flex=False):
        head = ["layer", "pass", "GPU", "sinkattn", "FA4", "SDPA"] + (["Flex"] if flex else []) + [
            "x FA4", "x SDPA", "target", "status", "run"]
        out = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for shape, what in rows:
            def anchored(r, s=shape, w=what):
                return w == "fb" or any(r.anchor(s, m) is not None for m in ("fa4", "sdpa", "flex_sink"))
            for run, v in self.latest_judged(lambda r, s=shape, w=what: sinkattn_value(r.compared(s), w), anchored):
                fa4 = anchor_value(run.anchor(shape, "fa4"), shape, what)
                sdpa = anchor_value(run.anchor(shape, "sdpa"), shape, what)
                flx = anchor_value(run.anchor(shape, "flex_sink"), shape, what)
                x_fa4 = fa4 / v if fa4 else None
                x_sdpa = sdpa / v if sdpa else None
                if what == "fb":
                    limit = TARGET_SLIDING_MS.get(run.short)
                    target = f"<= {limit:.2f} ms on {run.short}" if limit else "—"
                    status = "—" if limit is None else "met" if v <= limit else self.missed("fb", shape)
                else:
                    present = [x for x in (x_fa4, x_sdpa) if x is not None]
                    if what == "fwd":
                        target = f">= {TARGET_SPEED:.1f}x the faster of FA4 and SDPA"
                        judged = min(present) if present else None
                    else:
                        target = f">= {TARGET_SPEED:.1f}x FA4 and SDPA"
                        judged = min(present) if present else None
                    if judged is None:
                        status = "not judged: no anchor in this run"
                    else:
                        alone = "" if x_fa4 is not None and x_sdpa is not None else (
                            "against SDPA; " + anchor_absent(run.anchor(shape, "fa4"), what) if x_fa4 is None
                            else "against FA4; SDPA has no such call")
                        status = ("met" + (f" ({alone})" if alone else "")) if judged >= TARGET_SPEED else \
                            self.missed(what, shape, alone or None)
                cells = [LAYERS[shape], {"fwd": "fwd", "bwd": "bwd", "fb": "fwd + bwd"}[what], run.short, fmt_ms(v),
                         fmt_ms(fa4), fmt_ms(sdpa)] + ([fmt_ms(flx)] if flex else []) + [
                    fmt_x(x_fa4), fmt_x(x_sdpa), target, status, run.cell()]
                out.append("| " + " | ".join(cells) + " |")
        return out

    def det_section(self):
        head = ["layer", "GPU", "det bwd", "default bwd", "x default", "FA4 det bwd", "x FA4 det", "target",
                "status", "run"]
        out = ["## Deterministic backward", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        absent = []  # (layer, device, the newest run that did measure it)
        for shape in SHAPES:
            for run, row in self.latest_judged(lambda r, s=shape: r.compared(s),
                                               lambda r, s=shape: r.anchor(s, "fa4") is not None):
                det = sinkattn_value(row, "det")
                if det is None:
                    older = [r for r in self.runs if r.short == run.short and sinkattn_value(r.compared(shape), "det")]
                    absent.append(f"{LAYERS[shape]} on the {run.short}" + (
                        f" (last measured by {older[-1].label}, {older[-1].date} {older[-1].commit})" if older else ""))
                    continue
                default = sinkattn_value(row, "bwd")
                fa4 = anchor_value(run.anchor(shape, "fa4"), shape, "det")
                x_def = default / det if default else None
                x_fa4 = fa4 / det if fa4 else None
                ok = x_def is not None and x_def >= TARGET_DET_X and (x_fa4 is None or x_fa4 >= TARGET_SPEED)
                alone = None if x_fa4 is not None else anchor_absent(run.anchor(shape, "fa4"), "det")
                status = ("met" + (f" ({alone})" if alone else "")) if ok else self.missed(
                    "det", shape if ("det", shape) in REASONS else "*", alone)
                cells = [LAYERS[shape], run.short, fmt_ms(det), fmt_ms(default), fmt_x(x_def), fmt_ms(fa4),
                         fmt_x(x_fa4), f">= {TARGET_DET_X:.1f}x default, faster than FA4's", status, run.cell()]
                out.append("| " + " | ".join(cells) + " |")
        if absent:
            out += ["", "Not in the newest run that measured the layer: " + "; ".join(absent) + "."]
        return out

    def extra_section(self, title, suffix, word):
        head = ["layer", "pass", "GPU", "plain", f"with {word}", "x plain", "target", "status", "run"]
        out = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for layer in ("gpt-oss-full", "mha-d128"):
            shape = layer + suffix
            for what in ("fwd", "bwd"):
                def probe(r, s=shape, w=what):
                    row = r.bench(s)
                    if row is None:
                        return None
                    return row.get(f"x_plain_{w}") or row.get(f"{w}_ms")
                for run, _ in self.latest(probe):
                    row, plain_row = run.bench(shape), run.bench(layer)
                    plain = row.get(f"plain_{what}_ms") or sinkattn_value(plain_row, what)
                    t = row.get(f"{what}_ms")
                    x = row.get(f"x_plain_{what}") or (plain / t if plain and t else None)
                    status = "met" if x is not None and x >= TARGET_X_PLAIN else self.missed(what, suffix)
                    cells = [LAYERS[layer], what, run.short, fmt_ms(plain), fmt_ms(t), fmt_x(x),
                             f">= {TARGET_X_PLAIN:.2f}x plain (issue 12)", status, run.cell()]
                    out.append("| " + " | ".join(cells) + " |")
        return out

    def decode_section(self):
        head = ["configurations", "GPU", "measured", "anchor (same run)", "target", "status", "run"]
        out = ["## Decode (paged KV, one new token per sequence)", "",
               "GPT-OSS-120B's attention (h_q 64, h_kv 8, d 64, learnable sinks), bf16 paged cache (pages of 16 and 64), "
               "batch 1-256, context 1k-128k, full and sliding layers; time per call in a replayed CUDA graph.", "",
               "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run, o in self.latest(lambda r: r.tool("sinkattn_gpu_bench_decode")):
            rows = o["rows"]
            copy = o["copy_gbs"]
            copy_name = "device copy (read + write)"
            no_read = "not judged: this run measured no streaming-read kernel (the copy figure counts read + write)"

            def against_copy(rs):
                v = sorted(r["gbs"] / copy for r in rs)
                return v, (f"{100 * v[0]:.1f}-{100 * v[-1]:.1f}% of the {copy_name} figure "
                           f"(median {100 * v[len(v) // 2]:.1f}%)"), f"{copy_name} {copy:.0f} GB/s"

            def against_read(rs, target, key):
                """(measured, anchor, status) against each row's streaming read of its own bytes, measured in the same
                run and graph-replay harness (sinkattn_gpu_bench_decode's "read_gbs"), or None when a row has none
                (runs before it: the copy figure alone)."""
                if not all(r.get("read_gbs") for r in rs):
                    return None
                share = sorted(((r["gbs"] / r["read_gbs"], r) for r in rs), key=lambda t: t[0])
                v = [x for x, _ in share]
                reads = sorted(r["read_gbs"] for r in rs)
                measured = (f"{100 * v[0]:.1f}-{100 * v[-1]:.1f}% of a streaming read of the same bytes "
                            f"(median {100 * v[len(v) // 2]:.1f}%)")
                anchor = f"streaming read of each configuration's bytes, {reads[0]:.0f}-{reads[-1]:.0f} GB/s"
                low = [(x, r) for x, r in share if x < target]
                if not low:
                    return measured, anchor, "met"
                lowest = ", ".join(f"{r['layer']} b{r['batch']} ctx{r['context']} page {r['page']} {100 * x:.1f}%"
                                   for x, r in low[:3])
                return measured, anchor, self.missed(
                    "decode", key, f"{len(low)} of {len(v)} configurations; lowest: {lowest}")

            def read_row(label, rs, target, key, copy_count):
                """A decode target's row: judged against the streaming read where the run measured one, else only
                against the copy figure (not judged; copy_count: say how many reach the target share of it)."""
                judged = against_read(rs, target, key)
                if judged:
                    text, anchor, status = judged
                else:
                    v, text, anchor = against_copy(rs)
                    status = no_read + (f"; {sum(x >= target for x in v)} of {len(v)} at >= {100 * target:.0f}% of "
                                        "the copy figure" if copy_count else "")
                return (f"| {label} ({len(rs)}) | {run.short} | {text} | {anchor} | >= {100 * target:.0f}% of a "
                        f"streaming-read kernel | {status} | {run.cell()} |")

            big = [r for r in rows if r["kv_mb"] >= 64]
            if big:
                out.append(read_row("K/V read >= 64 MB", big, TARGET_DECODE_READ, "read", True))
            sl = [r for r in rows if r["layer"] == "sliding" and r["batch"] == 256]
            if sl:
                out.append(read_row("sliding layer, batch 256", sl, TARGET_DECODE_SLIDING, "sliding", False))
            small = [r for r in rows if r["kv_mb"] < 4]
            if small:
                xs = sorted(r["us_graph"] / o["floor_graph_us"] for r in small)
                status = "met" if xs[-1] <= TARGET_DECODE_FLOOR_X else self.missed("decode", "small")
                out.append(f"| K/V read < 4 MB ({len(small)}) | {run.short} | {xs[0]:.1f}-{xs[-1]:.1f}x the launch "
                           f"floor | empty kernel in a graph, {o['floor_graph_us']:.2f} us | <= "
                           f"{TARGET_DECODE_FLOOR_X:.0f}x the floor | {status} | {run.cell()} |")
        return out

    def paged_section(self):
        head = ["layer", "GPU", "paged ms (pages of 16 / 64 / 256)", "contiguous cache, same run", "x contiguous",
                "target", "status", "run"]
        out = ["## Paged prefill", "",
               "A prefill chunk's forward reading K / V through a page table (pages randomly permuted in the pool, "
               "seqused_kv = s_kv), against the same call on a contiguous cache "
               "(sinkattn_gpu_bench_paged_prefill); \"x\" is the contiguous time over the paged one, the lowest "
               "over the page sizes.", "",
               "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run, o in self.latest(lambda r: r.tool("sinkattn_gpu_bench_paged_prefill")):
            layers = []
            for r in o["rows"]:
                if r["layer"] not in layers:
                    layers.append(r["layer"])
            for layer in layers:
                rs = sorted((r for r in o["rows"] if r["layer"] == layer), key=lambda r: r["page_size"])
                lo = min(r["x_dense"] for r in rs)
                first = rs[0]
                shape = (f"{LAYERS.get(layer, layer)} (b {first['b']}, s_q {first['s_q']}, s_kv {first['s_kv']}, "
                         f"h {first['h_q']}/{first['h_kv']}, d {first['d']})")
                paged = " / ".join(fmt_ms(r["paged_ms"]) for r in rs)
                dense = " / ".join(sorted({fmt_ms(r["dense_ms"]) for r in rs}, key=float))
                status = "met" if lo >= TARGET_PAGED_X else self.missed("paged", layer)
                out.append(f"| {shape} | {run.short} | {paged} | {dense} | {lo:.2f}x | >= {TARGET_PAGED_X:.1f}x | "
                           f"{status} | {run.cell()} |")
        return out

    def training_section(self):
        out = ["## Training steps", "",
               "| model | GPU | sinkattn | anchors (same run) | x anchors | target | status | run |",
               "|---|---|---|---|---|---|---|---|"]
        for run, o in self.latest(lambda r: r.tool("finetune_gpt_oss_hf.py")):
            res = o["benchmark"]
            others = [k for k in ("eager", "flex_attention", "flash_attention_4") if res.get(k)]
            out.append(
                f"| HF transformers GPT-OSS ({model_text(o.get('config', {}))}), training tokens/s | {run.short} | "
                f"{fmt_tps(res['sinkattn'])} | "
                + ", ".join(f"{k} {fmt_tps(res[k])}" for k in others) + " | "
                + ", ".join(f"{res['sinkattn'] / res[k]:.2f}x {k}" for k in others)
                + f" | none open | — | {run.cell()} |")
        for run, o in self.latest(lambda r: r.tool("train_sink_lm.py")):
            s, ref = o["sinkattn"]["train_step_tokens_per_s"], o["reference"]["train_step_tokens_per_s"]
            x = o.get("train_step_speedup", s / ref)  # a transcribed run keeps its log's ratio of unrounded values
            unit = 1e6 if s >= 1e6 else None  # both in one unit
            out.append(
                f"| JAX example LM ({model_text(o.get('config', {}))}), training tokens/s | {run.short} | {fmt_tps(s, unit)} | pure-JAX reference attention {fmt_tps(ref, unit)} | {x:.1f}x reference "
                f"| none open | — | {run.cell()} |")
        return out

    def cpu_section(self):
        out = ["## CPU backend", "",
               "`sinkattn bench --preset gpt-oss-20b --backend cpu`: one GPT-OSS-20B layer, b 1, s 4096, bf16, "
               "learnable sinks. The CPU backend is the exact reference; no target and no anchor.", "",
               "| layer | machine | fwd ms | bwd ms | run |", "|---|---|---|---|---|"]
        found = {}
        for run in self.runs:
            if run.tool("sinkattn bench"):
                found[run.device] = run
        for dev in sorted(found):
            run = found[dev]
            self.used.add(run.id)
            for r in run.tool("sinkattn bench")["rows"]:
                out.append(f"| {r['layer']} | {dev} | {fmt_ms(r['fwd_ms'])} | {fmt_ms(r['bwd_ms'])} | "
                           f"[{run.label}](#runs) {run.date} {run.commit} |")
        return out

    def checks_section(self):
        """The GPU checks (tools/gpu-check.sh, tools/gpu-wheel-check.sh; "gpu-check" outputs of a run file): per
        device, the newest run whose checks include the whole GPU suite, and the newer runs of fewer checks after
        it (e.g. the decode suite after a decode-only change), each with its command and summary lines."""
        out = ["## GPU checks", "",
               "The correctness checks on a GPU (float64 judging, compute-sanitizer, determinism, the decode suite): "
               "per device the newest run of the whole suite and any later, narrower ones."]
        by_device = {}
        for run in self.runs:
            for o in run.outputs:
                if o["tool"] == "gpu-check":
                    by_device.setdefault(run.short, []).append((run, o))
        for dev in sorted(by_device):
            items = by_device[dev]
            full = [i for i, (_, o) in enumerate(items) if "suite" in o.get("steps", "").split()]
            for run, o in items[full[-1] if full else 0:]:
                self.used.add(run.id)
                out += ["", f"- {dev}, [{run.label}](#runs) {run.date} {run.commit}: `{o['command']}`"]
                out += [f"  - {line}" for line in o.get("summary", [])]
        return out

    def runs_section(self):
        out = ["## Runs", "", "| run | date | device | commit | commands | log |", "|---|---|---|---|---|---|"]
        for run in self.runs:
            if run.id not in self.used:
                continue
            cmds = []
            for o in run.outputs:
                c = re.sub(r"\s--json\s+\S+", "", o.get("command", o["tool"]))
                if c not in cmds:
                    cmds.append(c)
            dev = run.device + (f" ({run.data['device_note']})" if run.data.get("device_note") else "")
            commit = run.commit + (f" ({run.data['commit_note']})" if run.data.get("commit_note") else "")
            log = run.log[len("bench/"):] if run.log.startswith("bench/") else "../" + run.log
            out.append(f"| {run.label} | {run.date} | {dev} | {commit} | " + "; ".join(f"`{c}`" for c in cmds)
                       + f" | [{Path(run.log).name}]({log}) |")
        return out

    def render(self):
        for i, run in enumerate(self.runs):
            run.label = f"R{i + 1}"
        parts = [INTRO.split("\n"),
                 self.speed_section("Training layers", [("gpt-oss-full", "fwd"), ("gpt-oss-full", "bwd"),
                                                        ("gpt-oss-sliding", "fb"), ("mha-d128", "fwd"),
                                                        ("mha-d128", "bwd")], flex=True),
                 self.speed_section("Head dims", [("hd256", "fwd"), ("hd256", "bwd")]),
                 self.speed_section("Long sequences", [("gpt-oss-full-16k", "fwd"), ("gpt-oss-full-16k", "bwd"),
                                                       ("mha-d128-16k", "fwd"), ("mha-d128-16k", "bwd")]),
                 self.det_section(),
                 self.extra_section("Bias (`[1, 1, s, s]` bf16 with d_bias)", "+bias", "bias"),
                 self.extra_section("Dropout (p 0.1)", "+dropout", "dropout"),
                 self.decode_section(),
                 self.paged_section(),
                 self.training_section(),
                 self.cpu_section(),
                 self.checks_section(),
                 self.runs_section()]
        return "\n\n".join("\n".join(p) for p in parts) + "\n"


def load_runs(runs_dir: Path):
    runs = []
    for p in sorted(runs_dir.glob("*.json")):
        data = json.loads(p.read_text())
        for key in ("date", "device", "commit", "log", "outputs"):
            if key not in data:
                raise SystemExit(f"{p}: no '{key}'")
        runs.append(Run(p, data))
    return runs


def check_links(text: str, out: Path):
    for target in re.findall(r"\]\(((?:\.\./|log/)[^)#]+)\)", text):
        if not (out.parent / target).exists():
            raise SystemExit(f"{out}: links to {target}, which does not exist")


def add_run(args):
    outputs = [json.loads(Path(f).read_text()) for f in args.outputs]
    devices = {o.get("gpu") or o.get("device") for o in outputs} - {None}
    if len(devices) != 1:
        raise SystemExit(f"the outputs name {len(devices)} devices ({sorted(devices)}): one run is one machine")
    dates = sorted(o["date"] for o in outputs if o.get("date"))
    if not dates:
        raise SystemExit("no output has a date")
    device = devices.pop()
    run = {"date": dates[0][:10], "time_utc": dates[0][11:16], "device": device, "commit": args.commit,
           "log": args.log, "outputs": outputs}
    name = args.name or f"{run['date']}-{short_device(device).lower().replace(' ', '-')}-{args.commit}"
    path = args.runs_dir / f"{name}.json"
    path.write_text(json.dumps(run, indent=1) + "\n")
    print(f"wrote {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "bench" / "runs")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if --out is not what the runs give")
    sub = ap.add_subparsers(dest="cmd")
    ad = sub.add_parser("add", help="a run file from benchmark JSON output, then write the dashboard")
    ad.add_argument("--commit", required=True, help="the commit the measured library was built from")
    ad.add_argument("--log", required=True, help="the bench/log file that describes the run")
    ad.add_argument("--name", default=None, help="run file name (default DATE-GPU-COMMIT)")
    ad.add_argument("outputs", nargs="+", help="JSON written by the benchmark programs on one machine")
    args = ap.parse_args(argv)
    if args.cmd == "add":
        add_run(args)
    text = Dashboard(load_runs(args.runs_dir)).render()
    check_links(text, args.out)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is not what {args.runs_dir} gives: run tools/results_dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
