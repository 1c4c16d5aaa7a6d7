#!/usr/bin/env python3
"""Train a small GPT-OSS (HF transformers) with sinkattn attention: attn_implementation="sinkattn".

Model: transformers' GptOssForCausalLM, built from a GptOssConfig scaled down (random init), or a local checkpoint
(--checkpoint DIR, from_pretrained; no download). Its layers alternate sliding-window (128 tokens, keys i-127 .. i)
and full causal attention, grouped-query attention with one learnable sink per query head (the `sinks` parameter
that reaches the attention function as `s_aux`), and a mixture-of-experts MLP. sinkattn computes the attention
forward and backward fused, d_sinks included (sinkattn.torch.hf.register()).

Data: the byte-level corpus of examples/train_sink_lm.py (the license texts under /usr/share/common-licenses, one
token per byte), random windows of --context bytes.

What it prints: the loss curve (train loss every --log-every steps, held-out loss every --eval-every steps); a check
that the first --check-steps training steps give the same losses with attn_implementation="eager" (same initial
weights, same batches); how far the sinks of every layer moved. Exit status 1 when the check fails, when the loss
does not go down, or when the sinks do not move. CPU by default, the GPU when PyTorch sees one (bf16 autocast).

--benchmark: training tokens/s (forward, backward, AdamW step) of sinkattn against eager, against FlexAttention
(attn_implementation="flex_attention", which applies sinks through its LSE; GPU only for GPT-OSS in transformers) and
against FlashAttention-4 (attn_implementation="flash_attention_4", a name transformers 5 has built in: it calls
flash-attn-4's `flash_attn.cute.flash_attn_func` with the layer's sinks as `learnable_sink` and the sliding window as
window_size (127, 127) with causal, i.e. keys i - 127 .. i; GPU only), at --context (default 4096 with --benchmark);
--impls picks some. FlashAttention-4 is looked for first (flash_attn.cute imports, transformers sees the flash-attn-4
distribution, a GPU of compute capability 9 or more): where it is not there the line says "not available: <why>"
(the JSON's "unavailable") and the others still run; transformers is never left to fetch a kernel from the Hub in
its place. On a GPU machine without network: tools/fa4-install.sh puts it in /tmp/fa4-site (`. /tmp/fa4-site/env.sh`
before this starts).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import sys
import time

import numpy as np
import torch

import sinkattn.torch.hf as sthf

HERE = os.path.dirname(os.path.abspath(__file__))


def corpus_module():
    """examples/train_sink_lm.py's corpus loader and batcher (one definition of the byte-level data)."""
    spec = importlib.util.spec_from_file_location("train_sink_lm", os.path.join(HERE, "train_sink_lm.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gpt_oss_config(a):
    from transformers import GptOssConfig

    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(a.layers)]
    return GptOssConfig(
        vocab_size=256, hidden_size=a.hidden, intermediate_size=a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        num_local_experts=a.experts, num_experts_per_tok=2, sliding_window=a.sliding_window, layer_types=layer_types,
        max_position_embeddings=max(a.context, 256), rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_dropout=a.attention_dropout, router_aux_loss_coef=0.0, tie_word_embeddings=False, pad_token_id=None)


def build_model(a, attn, state=None):
    from transformers import AutoModelForCausalLM

    if a.checkpoint:
        model = AutoModelForCausalLM.from_pretrained(a.checkpoint, attn_implementation=attn, dtype=torch.float32)
    else:
        torch.manual_seed(a.seed)
        model = AutoModelForCausalLM.from_config(gpt_oss_config(a), attn_implementation=attn, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state)
    return model.to(a.device).train()


def sinks_of(model):
    return [layer.self_attn.sinks.detach().float().cpu().clone() for layer in model.model.layers]


class Trainer:
    def __init__(self, a, model):
        self.a, self.model = a, model
        self.opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.step_no = 0
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if a.device == "cuda" and a.dtype == "bfloat16"
                         else torch.autocast("cpu", enabled=False))

    def lr(self):
        a, s = self.a, self.step_no
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        return a.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - a.warmup) / max(1, a.steps - a.warmup))))

    def step(self, x, y):
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        with self.autocast:
            loss = self.model(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_no += 1
        return loss.detach()

    @torch.no_grad()
    def evaluate(self, batches):
        self.model.eval()
        with self.autocast:
            losses = [float(self.model(input_ids=x, labels=y).loss) for x, y in batches]
        self.model.train()
        return float(np.mean(losses))


def to_batch(w, device):
    """train_sink_lm's (inputs, targets) windows -> HF causal-LM inputs (labels are the inputs; HF shifts them)."""
    x, y = w
    ids = torch.from_numpy(np.concatenate([x, y[:, -1:]], axis=1).astype(np.int64)).to(device)
    return ids, ids


def check_against_eager(a, state, batches, log):
    """The first --check-steps steps with sinkattn and with eager from the same weights: the same losses."""
    losses = {}
    for attn in ("sinkattn", "eager"):
        t = Trainer(a, build_model(a, attn, state))
        losses[attn] = [float(t.step(*b)) for b in batches]
    tol = a.check_tol if a.check_tol is not None else (1e-4 if a.dtype == "float32" else 3e-2)
    err = max(abs(s - e) / abs(e) for s, e in zip(losses["sinkattn"], losses["eager"]))
    log(f"check: first {len(batches)} steps, sinkattn {['%.5f' % v for v in losses['sinkattn']]} vs eager "
        f"{['%.5f' % v for v in losses['eager']]}: max relative difference {err:.2e} (tolerance {tol:.0e})")
    return err <= tol, err


def train(a, log=print):
    lm = corpus_module()
    data = lm.load_corpus(a.data_dir)
    split = int(len(data) * 0.9)
    train_b = lm.Batches(data[:split], a.context, a.batch, a.seed)
    val = [to_batch(lm.Batches(data[split:], a.context, a.batch, a.seed + 1).next(), a.device)
           for _ in range(a.eval_batches)]
    sthf.register()
    model = build_model(a, "sinkattn")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())
    log(f"GPT-OSS ({'checkpoint ' + a.checkpoint if a.checkpoint else 'from config'}): {n_params / 1e6:.2f}M "
        f"parameters, {model.config.num_hidden_layers} layers ({', '.join(model.config.layer_types)}), "
        f"{model.config.num_attention_heads}/{model.config.num_key_value_heads} heads of {model.config.head_dim}, "
        f"sliding window {model.config.sliding_window}; attn_implementation={model.config._attn_implementation}; "
        f"{a.device} {a.dtype}; corpus {len(data):,} bytes; context {a.context}, batch {a.batch}")
    result = {"config": vars(a)}
    ok = True
    if a.check_steps > 0:
        check_batches = [to_batch(train_b.next(), a.device) for _ in range(a.check_steps)]
        good, err = check_against_eager(a, state, check_batches, log)
        result["check"] = {"ok": good, "max_rel_diff": err}
        ok &= good
        train_b = lm.Batches(data[:split], a.context, a.batch, a.seed)
    sinks0 = sinks_of(model)
    t = Trainer(a, model)
    curve, evals = [], []
    first = t.evaluate(val)
    evals.append((0, first))
    log(f"step     0  held-out loss {first:.4f}")
    t0 = time.perf_counter()
    for s in range(1, a.steps + 1):
        loss = t.step(*to_batch(train_b.next(), a.device))
        if s % a.log_every == 0 or s == a.steps:
            curve.append((s, float(loss)))
            log(f"step {s:5d}  train loss {float(loss):.4f}  lr {t.lr():.2e}  "
                f"({s * a.batch * a.context / (time.perf_counter() - t0):,.0f} tok/s)")
        if s % a.eval_every == 0 or s == a.steps:
            evals.append((s, t.evaluate(val)))
            log(f"step {s:5d}  held-out loss {evals[-1][1]:.4f}")
    sinks1 = sinks_of(model)
    log("sinks (per layer: mean before -> after, max |change|):")
    moved = []
    for i, (s0, s1) in enumerate(zip(sinks0, sinks1)):
        d = float((s1 - s0).abs().max())
        moved.append(d)
        log(f"  layer {i} ({model.config.layer_types[i]:17s}) {float(s0.mean()):+.3f} -> {float(s1.mean()):+.3f}, "
            f"max |change| {d:.3f}: {[round(float(x), 2) for x in s1]}")
    went_down = evals[-1][1] < evals[0][1] - 0.5
    log(f"held-out loss {evals[0][1]:.3f} -> {evals[-1][1]:.3f} ({'down' if went_down else 'NOT down'}); sinks "
        f"{'moved' if min(moved) > 1e-3 else 'did NOT move'}")
    ok &= went_down and min(moved) > 1e-3
    result.update(curve=curve, evals=evals, sinks_before=[s.tolist() for s in sinks0],
                  sinks_after=[s.tolist() for s in sinks1], ok=ok)
    return result


IMPLS = ("sinkattn", "eager", "flex_attention", "flash_attention_4")
GPU_ONLY = ("flex_attention", "flash_attention_4")


def fa4_unavailable(device):
    """Why attn_implementation="flash_attention_4" cannot run here (None when it can): it needs flash-attn-4's
    `flash_attn.cute` importable, transformers to see the flash-attn-4 distribution (else transformers would turn to
    the `kernels` package and the Hub) and a CUDA GPU of compute capability 9 or more (Hopper, Blackwell)."""
    if device != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"needs compute capability 9.0 or more (this GPU: {major}.{minor})"
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as e:  # noqa: BLE001 (absent, or it does not load here)
        return f"flash_attn.cute does not import: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    try:
        from transformers.utils import is_flash_attn_4_available
    except ImportError:
        return "this transformers has no flash_attention_4"
    if not is_flash_attn_4_available():
        return "transformers does not see the flash-attn-4 distribution (is_flash_attn_4_available() is False)"
    return None


def benchmark(a, log=print):
    """Training tokens/s (forward, backward, AdamW) of each attention implementation on the same model."""
    sthf.register()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (a.batch, a.context), generator=g).to(a.device)
    impls = a.impls.split(",") if a.impls else [i for i in IMPLS if a.device == "cuda" or i not in GPU_ONLY]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise SystemExit(f"--impls: unknown {unknown} (known: {', '.join(IMPLS)})")
    state = None
    res, unavailable = {}, {}
    dev_name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    log(f"benchmark on {dev_name}: context {a.context}, batch {a.batch}, {a.layers} layers, {a.heads}/{a.kv_heads} "
        f"heads of {a.head_dim}, hidden {a.hidden}, {a.experts} experts, {a.dtype}, torch {torch.__version__}")
    for attn in impls:
        why = fa4_unavailable(a.device) if attn == "flash_attention_4" else None
        if why is not None:
            res[attn], unavailable[attn] = None, why
            log(f"  {attn:17s} not available: {why}")
            continue
        try:
            model = build_model(a, attn, state)
            state = state or {k: v.detach().clone() for k, v in model.state_dict().items()}
            t = Trainer(a, model)
            for _ in range(a.bench_warmup):
                t.step(x, x)
            if a.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.bench_steps):
                loss = t.step(x, x)
            float(loss)
            tps = a.bench_steps * a.batch * a.context / (time.perf_counter() - t0)
            res[attn] = tps
            log(f"  {attn:17s} {tps:12,.0f} training tokens/s")
        except Exception as e:  # noqa: BLE001 (report, keep benchmarking the others)
            res[attn] = None
            log(f"  {attn:17s} failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        finally:
            model = t = None
            if a.device == "cuda":
                torch.cuda.empty_cache()
    for other in impls:
        if other != "sinkattn" and res.get(other) and res.get("sinkattn"):
            log(f"  sinkattn / {other}: {res['sinkattn'] / res[other]:.2f}x")
    out = {"tool": "finetune_gpt_oss_hf.py", "device": dev_name,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "torch": torch.__version__, "benchmark": res, "config": vars(a)}
    if unavailable:
        out["unavailable"] = unavailable
    return out


def parse_args(argv=None):
    on_gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=None, help="local GPT-OSS checkpoint directory (default: from config)")
    ap.add_argument("--steps", type=int, default=300, help="(default: %(default)s)")
    ap.add_argument("--context", type=int, default=None, help="tokens per sequence (default 256; 4096 with --benchmark)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 4; 2 with --benchmark)")
    ap.add_argument("--layers", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=128, help="(default: %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--kv-heads", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--head-dim", type=int, default=32, help="(default: %(default)s)")
    ap.add_argument("--experts", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--sliding-window", type=int, default=128,
                    help="HF's sliding_window (tokens incl. the current one; default %(default)s as GPT-OSS)")
    ap.add_argument("--attention-dropout", type=float, default=0.0, help="(default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3, help="(default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=20, help="(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    ap.add_argument("--device", default="cuda" if on_gpu else "cpu", help="(default: %(default)s)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16" if on_gpu else "float32",
                    help="bfloat16: autocast on the GPU, fp32 weights (default: %(default)s)")
    ap.add_argument("--check-steps", type=int, default=3, help="steps compared with eager (0: skip; default: %(default)s)")
    ap.add_argument("--check-tol", type=float, default=None, help="relative loss tolerance (default 1e-4 fp32, 3e-2 bf16)")
    ap.add_argument("--log-every", type=int, default=10, help="(default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=50, help="(default: %(default)s)")
    ap.add_argument("--eval-batches", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--data-dir", default="/usr/share/common-licenses", help="(default: %(default)s)")
    ap.add_argument("--benchmark", action="store_true",
                    help="training tokens/s: sinkattn vs eager, flex_attention and flash_attention_4 (GPU)")
    ap.add_argument("--impls", default=None,
                    help=f"--benchmark's attention implementations, a comma list of {', '.join(IMPLS)} (default: "
                         "all of them on the GPU, sinkattn and eager on the CPU)")
    ap.add_argument("--bench-steps", type=int, default=10, help="(default: %(default)s)")
    ap.add_argument("--bench-warmup", type=int, default=3, help="(default: %(default)s)")
    ap.add_argument("--json", default=None, help="write the results as JSON to this path")
    a = ap.parse_args(argv)
    if a.context is None:
        a.context = 4096 if a.benchmark else 256
    if a.batch is None:
        a.batch = 2 if a.benchmark else 4
    return a


def main(argv=None, log=print):
    a = parse_args(argv)
    res = benchmark(a, log) if a.benchmark else train(a, log)
    if a.benchmark:
        res["command"] = " ".join(["python3 examples/finetune_gpt_oss_hf.py"] + list(sys.argv[1:] if argv is None else argv))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0 if a.benchmark or res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
