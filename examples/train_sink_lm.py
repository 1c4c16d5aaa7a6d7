#!/usr/bin/env python3
"""Train a small GPT-OSS-style decoder as a byte-level language model with sinkattn attention.

Model (GPT-OSS shape, scaled down): token embedding, L pre-norm blocks (RMSNorm; grouped-query attention with
RoPE and one learnable sink logit per query head; SwiGLU MLP), final RMSNorm, untied output head. Layers
alternate a sliding-window causal layer (keys i-127 .. i: window_left = 127, window_right = 0, SPEC.md section 2)
and a full causal layer, starting with the sliding one. Attention is

    LSE_i = log(exp(sinks[h]) + sum_j exp(S_ij)),  out_i = sum_j exp(S_ij - LSE_i) v_j     (SPEC.md section 2)

computed by ``sinkattn.jax.dot_product_attention(..., softmax_type="learnable")`` (or, with
``--attention reference``, by the plain-XLA formulation below: scores with the sink logit appended as an extra
column, softmax, sink column dropped, as GPT-OSS's reference code does).

Data: the license texts under /usr/share/common-licenses (present on every Debian/Ubuntu machine), read as bytes
(vocabulary 256), deduplicated, last 10% held out.

What it prints: the loss curve (train loss every --log-every steps, held-out loss every --eval-every steps); a
check that the first --check-steps training steps of the same model with the reference attention give the same
losses (from the same initial parameters and batches); the sinks of every layer before and after training.

    python examples/train_sink_lm.py                      # CPU: a few minutes; GPU when one is present
    python examples/train_sink_lm.py --steps 50 --context 128
    python examples/train_sink_lm.py --benchmark          # tokens/s, sinkattn vs reference, context 4096

Exit status 1 when the reference check fails, when the loss does not go down, or when the sinks do not move.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

LICENSE_DIR = "/usr/share/common-licenses"


# ----------------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------------
def load_corpus(directory=LICENSE_DIR):
    """All license texts as one uint8 array (files with identical content, e.g. GPL -> GPL-3, counted once)."""
    seen, parts = set(), []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        parts.append(data)
    if not parts:
        raise SystemExit(f"no text found under {directory}")
    return np.frombuffer(b"\n\n".join(parts), dtype=np.uint8)


class Batches:
    """Random windows of context + 1 bytes (inputs and next-byte targets); deterministic in the seed."""

    def __init__(self, data, context, batch, seed):
        if len(data) <= context + 1:
            raise SystemExit(f"corpus of {len(data)} bytes too short for context {context}")
        self.data, self.context, self.batch = data, context, batch
        self.rng = np.random.default_rng(seed)

    def next(self):
        starts = self.rng.integers(0, len(self.data) - self.context - 1, size=self.batch)
        w = np.stack([self.data[s: s + self.context + 1] for s in starts]).astype(np.int32)
        return w[:, :-1], w[:, 1:]


# ----------------------------------------------------------------------------------------------------------------
# attention implementations: [B, T, N, H] x [B, T, K, H] -> [B, T, N, H]
# ----------------------------------------------------------------------------------------------------------------
def reference_attention(q, k, v, sinks, window_left):
    """Plain XLA causal GQA attention with a learnable sink per head (materialises [B, N, T, T] scores).

    S = q k^T / sqrt(H) with keys i - window_left .. i visible; the sink logit sinks[h] is appended as one extra
    column, the softmax taken over T + 1 columns in fp32, and the sink column dropped (it has no value)."""
    B, T, N, H = q.shape
    K = k.shape[2]
    G = N // K
    qg = q.reshape(B, T, K, G, H)
    acc = jnp.promote_types(q.dtype, jnp.float32)  # fp32 scores and softmax (float64 stays float64)
    s = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=acc) / math.sqrt(H)
    i = jnp.arange(T)[:, None]
    j = jnp.arange(T)[None, :]
    visible = j <= i
    if window_left is not None:
        visible &= j >= i - window_left
    s = jnp.where(visible, s, -jnp.inf)
    sink = jnp.broadcast_to(sinks.astype(acc).reshape(1, K, G, 1, 1), (B, K, G, T, 1))
    p = jax.nn.softmax(jnp.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]
    out = jnp.einsum("bkgts,bskh->btkgh", p.astype(v.dtype), v, preferred_element_type=acc)
    return out.reshape(B, T, N, H).astype(q.dtype)


def sinkattn_attention(q, k, v, sinks, window_left):
    """The fused op: one XLA FFI custom call forward, one backward (sinkattn.jax)."""
    from sinkattn.jax import dot_product_attention

    return dot_product_attention(q, k, v, sinks=sinks.astype(jnp.float32), softmax_type="learnable",
                                 is_causal=True, local_window_size=None if window_left is None else (window_left, 0),
                                 mask_alignment="bottom_right")


ATTENTION = {"sinkattn": sinkattn_attention, "reference": reference_attention}


# ----------------------------------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------------------------------
def init_params(key, cfg):
    D, N, K, H, F, L = cfg["d_model"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["d_ff"], cfg["layers"]
    keys = iter(jax.random.split(key, 4 + 8 * L))

    def dense(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) / math.sqrt(fan_in)

    layers = []
    for _ in range(L):
        layers.append({
            "attn_norm": jnp.ones((D,), jnp.float32),
            "wq": dense((D, N * H), D), "wk": dense((D, K * H), D), "wv": dense((D, K * H), D),
            "wo": dense((N * H, D), N * H) / math.sqrt(2 * L),
            "sinks": jnp.zeros((N,), jnp.float32),  # one learnable sink logit per query head
            "mlp_norm": jnp.ones((D,), jnp.float32),
            "w_gate": dense((D, F), D), "w_up": dense((D, F), D),
            "w_down": dense((F, D), F) / math.sqrt(2 * L),
        })
    return {"embed": dense((256, D), 1.0) * 0.5, "layers": layers, "final_norm": jnp.ones((D,), jnp.float32),
            "unembed": dense((D, 256), D)}


def rms_norm(x, w, eps=1e-5):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps) * w).astype(x.dtype)


def rope(x, base=10000.0):
    """Rotary position embedding on [B, T, heads, H] (rotate-half form), positions 0 .. T-1."""
    T, H = x.shape[1], x.shape[-1]
    inv = base ** (-jnp.arange(0, H, 2, dtype=jnp.float32) / H)
    ang = jnp.arange(T, dtype=jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def layer_window(cfg, layer):
    """GPT-OSS alternation: even layers sliding window (window_left = cfg window), odd layers full causal."""
    return cfg["window"] if layer % 2 == 0 else None


def forward(params, tokens, cfg, attention):
    dt = jnp.dtype(cfg["dtype"])
    B, T = tokens.shape
    N, K, H = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    x = params["embed"][tokens].astype(dt)
    for li, lp in enumerate(params["layers"]):
        h = rms_norm(x, lp["attn_norm"])
        q = rope((h @ lp["wq"].astype(dt)).reshape(B, T, N, H))
        k = rope((h @ lp["wk"].astype(dt)).reshape(B, T, K, H))
        v = (h @ lp["wv"].astype(dt)).reshape(B, T, K, H)
        a = attention(q, k, v, lp["sinks"], layer_window(cfg, li))
        x = x + a.reshape(B, T, N * H) @ lp["wo"].astype(dt)
        h = rms_norm(x, lp["mlp_norm"])
        x = x + (jax.nn.silu(h @ lp["w_gate"].astype(dt)) * (h @ lp["w_up"].astype(dt))) @ lp["w_down"].astype(dt)
    x = rms_norm(x, params["final_norm"])
    return (x @ params["unembed"].astype(dt)).astype(jnp.float32)


def loss_fn(params, tokens, targets, cfg, attention):
    logits = forward(params, tokens, cfg, attention)
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))


# ----------------------------------------------------------------------------------------------------------------
# optimiser: plain Adam (optax is not a dependency), global-norm clipping, linear warmup + cosine decay
# ----------------------------------------------------------------------------------------------------------------
def adam_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.95, eps=1e-8, clip=1.0, weight_decay=0.0):
    gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, clip / (gnorm + 1e-12)), grads)
    t = state["t"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
    params = jax.tree.map(lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * p),
                          params, m, v)
    return params, {"m": m, "v": v, "t": t}, gnorm


def lr_at(step, cfg):
    warm = max(1, cfg["warmup"])
    if step < warm:
        return cfg["lr"] * (step + 1) / warm
    frac = (step - warm) / max(1, cfg["steps"] - warm)
    return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def make_train_step(cfg, attention):
    @jax.jit
    def train_step(params, opt, tokens, targets, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, cfg, attention)
        params, opt, gnorm = adam_update(params, grads, opt, lr)
        return params, opt, loss, gnorm

    return train_step


def make_eval(cfg, attention):
    return jax.jit(lambda params, tokens, targets: loss_fn(params, tokens, targets, cfg, attention))


# ----------------------------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------------------------
def sinks_table(params):
    return np.stack([np.asarray(lp["sinks"]) for lp in params["layers"]])


def _check_run(cfg, params0, data, n_steps, name):
    step = make_train_step(cfg, ATTENTION[name])
    params, opt = params0, adam_init(params0)
    batches = Batches(data, cfg["context"], cfg["batch"], cfg["seed"] + 1)
    losses = []
    for s in range(n_steps):
        x, y = batches.next()
        params, opt, loss, _ = step(params, opt, jnp.asarray(x), jnp.asarray(y), lr_at(s, cfg))
        losses.append(float(loss))
    return losses


def check_against_reference(cfg, params0, data, n_steps, log):
    """Train n_steps from the same parameters and batches with both attentions; return per-step losses."""
    out = {}
    # float32 on a GPU: XLA's default matmul precision is TF32, which would blur the check; use full fp32
    precision = "highest" if cfg["dtype"] == "float32" else None
    for name in ("sinkattn", "reference"):
        with jax.default_matmul_precision(precision):
            out[name] = _check_run(cfg, params0, data, n_steps, name)
    a, b = np.array(out["sinkattn"]), np.array(out["reference"])

    rel = float(np.max(np.abs(a - b) / np.abs(b)))
    log(f"reference check, first {n_steps} steps (same init, same batches):")
    for s in range(n_steps):
        log(f"  step {s:3d}  sinkattn {a[s]:.6f}  reference {b[s]:.6f}  |diff| {abs(a[s] - b[s]):.2e}")
    return out, rel


def train(cfg, log=print):
    data = load_corpus(cfg["data_dir"])
    n_val = max(cfg["context"] + 2, len(data) // 10)
    train_data, val_data = data[:-n_val], data[-n_val:]
    log(f"corpus: {len(data)} bytes of English license text ({len(train_data)} train / {len(val_data)} held out)")
    log(f"device: {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), dtype {cfg['dtype']}, "
        f"attention {cfg['attention']}")
    params = init_params(jax.random.PRNGKey(cfg["seed"]), cfg)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    log(f"model: {cfg['layers']} layers (sliding window {cfg['window']} / full causal, alternating), d_model "
        f"{cfg['d_model']}, {cfg['heads']} query heads / {cfg['kv_heads']} KV heads of {cfg['head_dim']}, "
        f"{n_params / 1e6:.2f} M parameters; context {cfg['context']}, batch {cfg['batch']}")

    result = {"config": cfg}
    if cfg["check_steps"] > 0:
        losses, rel = check_against_reference(cfg, params, train_data, cfg["check_steps"], log)
        tol = cfg["check_tol"]
        result.update(check_losses=losses, check_rel_diff=rel, check_ok=bool(rel <= tol))
        log(f"  max relative loss difference {rel:.2e} (tolerance {tol:.0e} for {cfg['dtype']}): "
            f"{'OK' if rel <= tol else 'MISMATCH'}")

    attention = ATTENTION[cfg["attention"]]
    step = make_train_step(cfg, attention)
    evaluate = make_eval(cfg, attention)
    opt = adam_init(params)
    sinks0 = sinks_table(params)
    batches = Batches(train_data, cfg["context"], cfg["batch"], cfg["seed"] + 1)
    vb = Batches(val_data, cfg["context"], cfg["batch"], 12345)
    val_set = [vb.next() for _ in range(cfg["eval_batches"])]

    def val_loss(params):
        return float(np.mean([float(evaluate(params, jnp.asarray(x), jnp.asarray(y))) for x, y in val_set]))

    curve, val_curve = [], []
    v0 = val_loss(params)
    val_curve.append((0, v0))
    log(f"step     0  held-out loss {v0:.4f}  (uniform bytes: {math.log(256):.4f})")
    t0, tokens_seen = time.perf_counter(), 0
    for s in range(cfg["steps"]):
        x, y = batches.next()
        params, opt, loss, gnorm = step(params, opt, jnp.asarray(x), jnp.asarray(y), lr_at(s, cfg))
        if s == 0:  # throughput from step 2 on (step 1 includes compilation)
            jax.block_until_ready(loss)
            t0 = time.perf_counter()
        else:
            tokens_seen += x.size
        if (s + 1) % cfg["log_every"] == 0 or s == 0 or s + 1 == cfg["steps"]:
            loss = float(loss)
            curve.append((s + 1, loss))
            dt = time.perf_counter() - t0
            tps = f"{tokens_seen / dt:,.0f} tok/s" if tokens_seen else "(compiling)"
            msg = f"step {s + 1:5d}  train loss {loss:.4f}  |grad| {float(gnorm):.3f}  {tps}"
            if (s + 1) % cfg["eval_every"] == 0 or s + 1 == cfg["steps"]:
                vl = val_loss(params)
                val_curve.append((s + 1, vl))
                msg += f"  held-out loss {vl:.4f}"
            log(msg)
    sinks1 = sinks_table(params)
    log("sinks per layer (query heads), before -> after training:")
    for li in range(len(params["layers"])):
        kind = f"window {cfg['window']}" if layer_window(cfg, li) is not None else "full"
        log(f"  layer {li} ({kind:>10}): " + " ".join(f"{a:+.3f}->{b:+.3f}" for a, b in zip(sinks0[li], sinks1[li])))
    moved = float(np.max(np.abs(sinks1 - sinks0)))
    first = np.mean([l for _, l in curve[:2]])
    last = np.mean([l for _, l in curve[-2:]])
    result.update(curve=curve, val_curve=val_curve, sinks_before=sinks0.tolist(), sinks_after=sinks1.tolist(),
                  sinks_max_change=moved, loss_first=float(first), loss_last=float(last),
                  loss_down=bool(val_curve[-1][1] < val_curve[0][1] and last < first), sinks_moved=bool(moved > 1e-3))
    log(f"loss: held-out {val_curve[0][1]:.4f} -> {val_curve[-1][1]:.4f}; train {first:.4f} -> {last:.4f}; "
        f"sinks moved by up to {moved:.3f}")
    return result


def benchmark(cfg, log=print, steps=10):
    """tokens/s of a full training step (forward, backward, Adam) with each attention, and of attention alone."""
    params = init_params(jax.random.PRNGKey(cfg["seed"]), cfg)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, (cfg["batch"], cfg["context"]), dtype=np.int32))
    y = jnp.asarray(rng.integers(0, 256, (cfg["batch"], cfg["context"]), dtype=np.int32))
    dt = jnp.dtype(cfg["dtype"])
    B, T, N, K, H = cfg["batch"], cfg["context"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(ks[0], (B, T, N, H), dt)
    k = jax.random.normal(ks[1], (B, T, K, H), dt)
    v = jax.random.normal(ks[2], (B, T, K, H), dt)
    sinks = jnp.full((N,), math.log(T), jnp.float32)
    log(f"benchmark on {jax.devices()[0].device_kind}: context {T}, batch {B}, {cfg['layers']} layers, "
        f"{N}/{K} heads of {H}, {cfg['dtype']}")
    res = {}
    for name in ("sinkattn", "reference"):
        att = ATTENTION[name]
        step = make_train_step(cfg, att)
        p, o = params, adam_init(params)
        for _ in range(2):
            p, o, loss, _ = step(p, o, x, y, 1e-4)
        jax.block_until_ready(loss)
        t0 = time.perf_counter()
        for _ in range(steps):
            p, o, loss, _ = step(p, o, x, y, 1e-4)
        jax.block_until_ready(loss)
        train_tps = steps * B * T / (time.perf_counter() - t0)
        row = {}
        for win in (None, cfg["window"]):
            f = jax.jit(jax.grad(lambda q, k, v, s: jnp.sum(att(q, k, v, s, win).astype(jnp.float32)),
                                 argnums=(0, 1, 2, 3)))
            jax.block_until_ready(f(q, k, v, sinks))
            t0 = time.perf_counter()
            for _ in range(steps):
                r = f(q, k, v, sinks)
            jax.block_until_ready(r)
            row["full" if win is None else f"window{win}"] = steps * B * T / (time.perf_counter() - t0)
        res[name] = {"train_step_tokens_per_s": train_tps,
                     "attention_fwd_bwd_tokens_per_s": row}
        log(f"  {name:>9}: train step {train_tps:12,.0f} tok/s;  attention fwd+bwd (one layer): "
            + ", ".join(f"{kk} {vv:,.0f} tok/s" for kk, vv in row.items()))
    log(f"  speedup (train step): {res['sinkattn']['train_step_tokens_per_s'] / res['reference']['train_step_tokens_per_s']:.2f}x")
    res.update(tool="train_sink_lm.py", device=jax.devices()[0].device_kind,
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), config=dict(cfg))
    return res


def parse_args(argv=None):
    on_gpu = jax.default_backend() == "gpu"
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attention", choices=sorted(ATTENTION), default="sinkattn", help="(default: %(default)s)")
    ap.add_argument("--context", type=int, default=None, help="tokens per sequence (default 256; 4096 with --benchmark)")
    ap.add_argument("--steps", type=int, default=250, help="(default: %(default)s)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 8; 4 with --benchmark)")
    ap.add_argument("--layers", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--d-model", type=int, default=128, help="(default: %(default)s)")
    ap.add_argument("--heads", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--kv-heads", type=int, default=2, help="(default: %(default)s)")
    ap.add_argument("--head-dim", type=int, default=32, help="(default: %(default)s)")
    ap.add_argument("--d-ff", type=int, default=None, help="MLP width (default 4 * d_model)")
    ap.add_argument("--window", type=int, default=127, help="window_left of the sliding-window layers (default: %(default)s, as GPT-OSS)")
    ap.add_argument("--lr", type=float, default=3e-3, help="(default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=20, help="(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16" if on_gpu else "float32", help="(default: %(default)s)")
    ap.add_argument("--check-steps", type=int, default=5, help="steps compared with the reference attention (0: skip; default: %(default)s)")
    ap.add_argument("--check-tol", type=float, default=None,
                    help="max relative loss difference in the check (default 1e-4 float32, 2e-3 bf16/fp16)")
    ap.add_argument("--log-every", type=int, default=10, help="(default: %(default)s)")
    ap.add_argument("--eval-every", type=int, default=50, help="(default: %(default)s)")
    ap.add_argument("--eval-batches", type=int, default=4, help="(default: %(default)s)")
    ap.add_argument("--data-dir", default=LICENSE_DIR, help="(default: %(default)s)")
    ap.add_argument("--benchmark", action="store_true", help="report tokens/s of sinkattn vs reference and exit")
    ap.add_argument("--json", default=None, help="write the results as JSON to this path")
    a = ap.parse_args(argv)
    if a.heads % a.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    cfg = {
        "attention": a.attention, "context": a.context or (4096 if a.benchmark else 256), "steps": a.steps,
        "batch": a.batch or (4 if a.benchmark else 8), "layers": a.layers, "d_model": a.d_model, "heads": a.heads,
        "kv_heads": a.kv_heads, "head_dim": a.head_dim, "d_ff": a.d_ff or 4 * a.d_model, "window": a.window,
        "lr": a.lr, "warmup": a.warmup, "seed": a.seed, "dtype": a.dtype, "check_steps": a.check_steps,
        "check_tol": a.check_tol if a.check_tol is not None else (1e-4 if a.dtype == "float32" else 2e-3),
        "log_every": a.log_every, "eval_every": a.eval_every, "eval_batches": a.eval_batches, "data_dir": a.data_dir,
    }
    return a, cfg


def main(argv=None, log=print):
    a, cfg = parse_args(argv)
    if a.benchmark:
        result = benchmark(cfg, log)
        result["command"] = " ".join(["python3 examples/train_sink_lm.py"] + list(sys.argv[1:] if argv is None else argv))
        ok = True
    else:
        result = train(cfg, log)
        ok = result["loss_down"] and result["sinks_moved"] and result.get("check_ok", True)
        if not result["loss_down"]:
            log("FAIL: the loss did not go down")
        if not result["sinks_moved"]:
            log("FAIL: the sinks did not move")
        if not result.get("check_ok", True):
            log("FAIL: sinkattn and reference attention disagree in the first steps")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    result["ok"] = ok
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
