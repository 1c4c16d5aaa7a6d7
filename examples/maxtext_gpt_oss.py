#!/usr/bin/env python3
"""Train a tiny GPT-OSS in MaxText with sinkattn's fused attention (attention=sinkattn).

The model is MaxText's own GPT-OSS (``model_name=gpt-oss-20b``: learnable sinks, sliding-window layers alternating
with full causal layers, GQA, YaRN RoPE, MoE, projection biases) scaled down by config overrides, built by
MaxText and trained with MaxText's own loss (``trainers/pre_train/train.py: loss_fn``) and optax's AdamW.
``sinkattn.jax.maxtext.install()`` before the model is built, and ``attention=sinkattn`` in the config, route
every layer's attention through ``sinkattn.jax.dot_product_attention``.

Data: the license texts under /usr/share/common-licenses as bytes (vocabulary 256), packed MaxText-style: each row
holds two documents (segment ids 1 and 2, positions restarting at each).

What it prints: the loss of the first step with attention=dot_product (MaxText's unfused path) and with sinkattn
from the same parameters and batch (they must agree), the loss every --log-every steps, and the sinks of both
layers before and after training. Exit status 1 when the two first losses differ, the loss does not go down, or
the sinks do not move.

    python examples/maxtext_gpt_oss.py                  # CPU by default; the GPU when JAX has one
    python examples/maxtext_gpt_oss.py --steps 100
    python examples/maxtext_gpt_oss.py --benchmark      # training tokens/s, sinkattn vs dot_product, context 4096

Needs MaxText 0.2.5 and the packages of tools/maxtext-requirements.txt (tools/setup-maxtext.sh), and sinkattn
(installed, or ``PYTHONPATH=python`` with ``SINKATTN_JAX_FFI_LIBRARY`` naming a build's libsinkattn_jax_ffi.so).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

LICENSE_DIR = "/usr/share/common-licenses"


def load_documents(directory=LICENSE_DIR):
    """Each license text once (files of identical content counted once), as uint8 arrays."""
    seen, docs = set(), []
    for path in sorted(glob.glob(os.path.join(directory, "*"))):
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen and len(data) > 64:
            seen.add(digest)
            docs.append(np.frombuffer(data, dtype=np.uint8))
    if not docs:
        raise SystemExit(f"no text found under {directory}")
    return docs


def packed_batch(docs, rng, batch, context):
    """MaxText's packed batch: each row a slice of one document (segment 1) followed by a slice of another
    (segment 2); targets are the next bytes of the same slice; positions restart at each segment."""
    rows = {k: [] for k in ("inputs", "targets", "inputs_position", "inputs_segmentation")}
    for _ in range(batch):
        n1 = int(rng.integers(context // 4, 3 * context // 4))
        parts = []
        for seg, n in ((1, n1), (2, context - n1)):
            while True:
                doc = docs[int(rng.integers(len(docs)))]
                if len(doc) > n + 1:
                    break
            s = int(rng.integers(0, len(doc) - n - 1))
            parts.append((seg, doc[s: s + n + 1].astype(np.int32)))
        rows["inputs"].append(np.concatenate([w[:-1] for _, w in parts]))
        rows["targets"].append(np.concatenate([w[1:] for _, w in parts]))
        rows["inputs_position"].append(np.concatenate([np.arange(len(w) - 1, dtype=np.int32) for _, w in parts]))
        rows["inputs_segmentation"].append(np.concatenate([np.full(len(w) - 1, seg, np.int32) for seg, w in parts]))
    out = {k: np.stack(v) for k, v in rows.items()}
    out["targets_position"] = out["inputs_position"]
    out["targets_segmentation"] = out["inputs_segmentation"]
    return out


def random_batch(rng, batch, context, vocab):
    """One unpacked row per sequence of random tokens (the benchmark's input)."""
    tok = rng.integers(1, vocab, (batch, context + 1)).astype(np.int32)
    pos = np.broadcast_to(np.arange(context, dtype=np.int32), (batch, context)).copy()
    seg = np.ones((batch, context), np.int32)
    return dict(inputs=tok[:, :-1], targets=tok[:, 1:], inputs_position=pos, targets_position=pos,
                inputs_segmentation=seg, targets_segmentation=seg)


def maxtext_config(attention, a, **extra):
    """MaxText's GPT-OSS config (configs/models/gpt-oss-20b.yml) scaled down; the global batch is a.batch rows."""
    from maxtext.configs import pyconfig

    on_gpu = jax.default_backend() == "gpu"
    kw = dict(
        model_name="gpt-oss-20b", override_model_config=True, attention=attention,
        base_emb_dim=a.emb_dim, base_num_query_heads=a.heads, base_num_kv_heads=a.kv_heads, head_dim=a.head_dim,
        base_mlp_dim=a.emb_dim, base_moe_mlp_dim=a.emb_dim, num_experts=4, num_experts_per_tok=2,
        base_num_decoder_layers=a.layers, vocab_size=a.vocab, sliding_window_size=a.window,
        max_target_length=a.context, per_device_batch_size=a.batch / jax.device_count(),
        dtype=a.dtype, weight_dtype="float32",
        # float32 runs check sinkattn against dot_product: MaxText's einsums in full fp32 (no TF32 on the GPU)
        matmul_precision="highest" if a.dtype == "float32" else "default",
        sparse_matmul=False,  # MaxText's dense MoE path (its sparse path wants TPU / megablox kernels)
        hardware="gpu" if on_gpu else "cpu", skip_jax_distributed_system=True, enable_checkpointing=False,
        dataset_type="synthetic", run_name="maxtext_gpt_oss_example",
        base_output_directory=os.path.join(os.environ.get("TMPDIR", "/tmp"), "maxtext_gpt_oss_example"),
        log_config=False,
    )
    kw.update(extra)
    return pyconfig.initialize([None, os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")], **kw)


class Trainer:
    """A MaxText GPT-OSS on all devices (batch over fsdp) and its jitted AdamW train step."""

    def __init__(self, config, params=None, lr=3e-3):
        import optax
        from flax import nnx
        from flax.core.spmd import logical_axis_rules
        from maxtext.trainers.pre_train import train as maxtext_train
        from maxtext.utils import maxtext_utils, maxtext_utils_nnx, model_creation_utils

        self.config = config
        self.mesh = maxtext_utils.get_mesh_from_config(config)
        self._rules = lambda: logical_axis_rules(config.logical_axis_rules)  # MaxText's train loop runs under them
        with jax.set_mesh(self.mesh), self._rules():
            rngs = maxtext_utils_nnx.create_nnx_rngs(config, model_mode="train", rng_key=jax.random.key(0))
            model = model_creation_utils.from_config(config, mesh=self.mesh, rngs=rngs)
        graphdef, own_params, rest = nnx.split(model, nnx.Param, ...)
        self.params = own_params if params is None else jax.tree.map(jnp.asarray, params)
        self.rest = rest
        tx = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.0)
        self.opt_state = tx.init(self.params)

        def loss(params, rest, batch):
            m = nnx.merge(graphdef, params, rest, copy=True)
            value, _ = maxtext_train.loss_fn(m, config, dict(batch), None, None, is_train=True)
            return value

        def step(params, opt_state, rest, batch):
            value, grads = jax.value_and_grad(loss)(params, rest, batch)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, value

        self._step = jax.jit(step, donate_argnums=(0, 1))

    def step(self, batch):
        with jax.set_mesh(self.mesh), self._rules():
            self.params, self.opt_state, value = self._step(self.params, self.opt_state, self.rest, batch)
        return value


def sinks_of(params):
    """{layer: sinks [heads]} of a GPT-OSS parameter tree."""
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(params):
        names = [str(getattr(p, "key", getattr(p, "name", p))) for p in path]
        if "sinks" in names:
            layer = next((n for n in names if n.startswith("layers_")), "?")
            out[layer] = np.asarray(x).reshape(-1)
    return out


def train(a, log=print):
    docs = load_documents()
    rng = np.random.default_rng(a.seed)
    first = packed_batch(docs, rng, a.batch, a.context)
    log(f"MaxText GPT-OSS ({a.layers} layers, sliding window {a.window} / full causal, {a.heads}/{a.kv_heads} heads "
        f"of {a.head_dim}, 4 experts) on {jax.device_count()} {jax.devices()[0].platform} device(s), context "
        f"{a.context}, batch {a.batch}, {a.dtype}")
    trainer = Trainer(maxtext_config("sinkattn", a))
    initial = jax.tree.map(np.asarray, trainer.params)
    # the same first step through MaxText's own (unfused) path
    reference = Trainer(maxtext_config("dot_product", a), params=initial)
    ref_loss = float(reference.step(first))
    del reference
    sinks_before = sinks_of(initial)
    losses = []
    t0 = None
    for step in range(a.steps):
        batch = first if step == 0 else packed_batch(docs, rng, a.batch, a.context)
        loss = float(trainer.step(batch))
        losses.append(loss)
        if step == 0:
            t0 = time.perf_counter()  # the rate below leaves out the first step (compilation)
            ok = abs(loss - ref_loss) <= 1e-4 * abs(ref_loss) + (1e-2 if a.dtype != "float32" else 0.0)
            log(f"step 0: loss {loss:.5f} (sinkattn) vs {ref_loss:.5f} (dot_product): {'match' if ok else 'MISMATCH'}")
            if not ok:
                return 1
        elif (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            tps = step * a.batch * a.context / (time.perf_counter() - t0)
            log(f"step {step + 1:4d}: loss {loss:.4f}  ({tps:,.0f} tok/s)")
    sinks_after = sinks_of(trainer.params)
    moved = True
    for layer in sorted(sinks_before):
        b, e = sinks_before[layer], sinks_after[layer]
        log(f"sinks {layer}: before {np.array2string(b, precision=3)}  after {np.array2string(e, precision=3)}")
        moved &= bool(np.abs(e - b).max() > 1e-3)
    went_down = np.mean(losses[-3:]) < losses[0] - 0.1
    log(f"loss {losses[0]:.4f} -> {np.mean(losses[-3:]):.4f}: {'down' if went_down else 'NOT DOWN'}; "
        f"sinks {'moved' if moved else 'DID NOT MOVE'}")
    return 0 if went_down and moved else 1


def benchmark(a, log=print):
    """Training tokens/s (forward, backward, AdamW) of the same MaxText model with sinkattn and with dot_product."""
    rng = np.random.default_rng(a.seed)
    batch = random_batch(rng, a.batch, a.context, a.vocab)
    log(f"benchmark on {jax.devices()[0].device_kind} ({jax.device_count()} device(s)): MaxText GPT-OSS, "
        f"{a.layers} layers (sliding {a.window} / full), emb {a.emb_dim}, {a.heads}/{a.kv_heads} heads of "
        f"{a.head_dim}, vocab {a.vocab}, context {a.context}, batch {a.batch}, {a.dtype}, {a.bench_steps} steps")
    res = {"device": jax.devices()[0].device_kind, "context": a.context, "batch": a.batch, "layers": a.layers,
           "emb_dim": a.emb_dim, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
           "vocab": a.vocab, "window": a.window, "dtype": a.dtype}
    params = None
    for name in ("sinkattn", "dot_product"):
        try:
            trainer = Trainer(maxtext_config(name, a), params=params, lr=1e-4)
            if params is None:
                params = jax.tree.map(np.asarray, trainer.params)
            t0 = time.perf_counter()
            loss = trainer.step(batch)
            jax.block_until_ready(loss)
            compile_s = time.perf_counter() - t0
            loss = trainer.step(batch)
            jax.block_until_ready(loss)
            t0 = time.perf_counter()
            for _ in range(a.bench_steps):
                loss = trainer.step(batch)
            jax.block_until_ready(loss)
            tps = a.bench_steps * a.batch * a.context / (time.perf_counter() - t0)
            res[name] = {"train_tokens_per_s": tps, "first_step_s": compile_s, "loss": float(loss)}
            log(f"  {name:>11}: {tps:12,.0f} tok/s  (first step incl. compile {compile_s:.1f} s, "
                f"loss {float(loss):.4f})")
            del trainer
        except Exception as e:  # e.g. the unfused path running out of memory: reported, not hidden
            res[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            log(f"  {name:>11}: FAILED {res[name]['error']}")
    if "train_tokens_per_s" in res["sinkattn"] and "train_tokens_per_s" in res["dot_product"]:
        res["speedup"] = res["sinkattn"]["train_tokens_per_s"] / res["dot_product"]["train_tokens_per_s"]
        log(f"  speedup (sinkattn / dot_product): {res['speedup']:.2f}x")
    log("RESULT " + json.dumps(res))
    return 0 if "train_tokens_per_s" in res["sinkattn"] else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", action="store_true",
                    help="training tokens/s of sinkattn vs dot_product (defaults: context 4096, a small GPT-OSS-like "
                         "model in bfloat16) and exit")
    ap.add_argument("--steps", type=int, default=40, help="training steps (default %(default)s)")
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--context", type=int, default=None, help="tokens per row (default 128; 4096 with --benchmark)")
    ap.add_argument("--batch", type=int, default=None, help="rows per step (default 8; 2 with --benchmark)")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers, alternating sliding / full "
                    "(default 2; 4 with --benchmark)")
    ap.add_argument("--emb-dim", type=int, default=None, help="default 64; 512 with --benchmark")
    ap.add_argument("--heads", type=int, default=None, help="query heads (default 8; 16 with --benchmark)")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=None, help="default 16; 64 with --benchmark")
    ap.add_argument("--window", type=int, default=None, help="sliding window (default 32; GPT-OSS's 128 with "
                    "--benchmark)")
    ap.add_argument("--vocab", type=int, default=256, help="default 256 (bytes); the benchmark feeds random tokens")
    ap.add_argument("--dtype", default=None, help="activations (default float32; bfloat16 with --benchmark)")
    ap.add_argument("--bench-steps", type=int, default=10, help="timed steps per attention (default %(default)s)")
    ap.add_argument("--context-parallel", choices=("auto", "all_to_all", "ring"), default="auto",
                    help="sinkattn.jax.maxtext.install(context_parallel=...) (default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    bench = a.benchmark
    for name, small, large in (("context", 128, 4096), ("batch", 8, 2), ("layers", 2, 4), ("emb_dim", 64, 512),
                               ("heads", 8, 16), ("head_dim", 16, 64), ("window", 32, 128),
                               ("dtype", "float32", "bfloat16")):
        if getattr(a, name) is None:
            setattr(a, name, large if bench else small)
    return a


def main(argv=None):
    a = parse_args(argv)
    import sinkattn.jax.maxtext

    sinkattn.jax.maxtext.install(context_parallel=a.context_parallel)  # before the model is built
    return benchmark(a) if a.benchmark else train(a)


if __name__ == "__main__":
    sys.exit(main())
