"""A tiny GPT-OSS model built by MaxText from its own GPT-OSS config, and its loss and gradients.

The config is MaxText's ``configs/models/gpt-oss-20b.yml`` (learnable sinks, sliding window alternating with full
causal layers, GQA, YaRN RoPE, MoE, projection biases) scaled down: 2 decoder layers (layer 0 sliding, layer 1
global), 8 query heads, 2 KV heads, head dim 16, window 8, 32 tokens. float32 throughout. The loss is MaxText's
own ``loss_fn`` of its pre-training step (trainers/pre_train/train.py), differentiated with respect to every
parameter as its ``train_step`` does, under the mesh and logical axis rules the train loop sets.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx
from flax.core.spmd import logical_axis_rules

from maxtext.configs import pyconfig
from maxtext.trainers.pre_train import train as maxtext_train
from maxtext.utils import maxtext_utils, maxtext_utils_nnx, model_creation_utils

SEQ = 32
BATCH = 2
HEADS, KV_HEADS, HEAD_DIM, WINDOW, VOCAB = 8, 2, 16, 8, 256

TINY = dict(
    model_name="gpt-oss-20b", override_model_config=True, base_emb_dim=64, base_num_query_heads=HEADS,
    base_num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, base_mlp_dim=64, base_moe_mlp_dim=64, num_experts=4,
    num_experts_per_tok=2, base_num_decoder_layers=2, vocab_size=VOCAB, sliding_window_size=WINDOW,
    max_target_length=SEQ, dtype="float32", weight_dtype="float32", matmul_precision="highest",
    # MaxText's dense MoE path (its sparse path needs the TPU megablox kernels)
    sparse_matmul=False,
    hardware="cpu", skip_jax_distributed_system=True, enable_checkpointing=False, dataset_type="synthetic",
    run_name="sinkattn_test", base_output_directory=os.path.join(os.environ.get("TMPDIR", "/tmp"), "sinkattn_maxtext"),
    log_config=False,
)


def make_config(attention: str, num_devices: int = 1, **overrides):
    """MaxText config of the tiny GPT-OSS model; the global batch is BATCH rows whatever the device count."""
    kw = dict(TINY, attention=attention, per_device_batch_size=BATCH / jax.device_count(), ici_fsdp_parallelism=1)
    if num_devices > 1:
        kw["ici_fsdp_parallelism"] = -1  # whatever the other axes leave
    kw.update(overrides)
    return pyconfig.initialize([None, os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")], **kw)


class Model:
    """A MaxText Transformer on a mesh of the first ``num_devices`` devices, with its compiled loss-and-grad."""

    def __init__(self, config, num_devices: int = 1):
        self.config = config
        self.mesh = maxtext_utils.get_mesh_from_config(config, devices=jax.devices()[:num_devices])
        rngs = maxtext_utils_nnx.create_nnx_rngs(config, model_mode="train", rng_key=jax.random.key(0))
        with self.context():
            self.model = model_creation_utils.from_config(config, mesh=self.mesh, rngs=rngs)
        self.graphdef, params, self.rest = nnx.split(self.model, nnx.Param, ...)
        self.params = params
        self._compiled = None
        self.hlo = None

    def context(self):
        """The mesh and logical axis rules MaxText's train loop runs its step under."""
        return _Both(jax.set_mesh(self.mesh), logical_axis_rules(self.config.logical_axis_rules))

    def loss_and_grads(self, params, batch):
        """(loss, grads) of MaxText's loss_fn for host (numpy) params and batch; the lowered StableHLO text of the
        step is kept in self.hlo."""
        graphdef, cfg = self.graphdef, self.config

        def loss(params, rest, batch):
            model = nnx.merge(graphdef, params, rest, copy=True)
            value, _ = maxtext_train.loss_fn(model, cfg, dict(batch), None, None, is_train=True)
            return value

        with self.context():
            if self._compiled is None:
                lowered = jax.jit(jax.value_and_grad(loss)).lower(params, self.rest, batch)
                self.hlo = lowered.as_text()
                self._compiled = lowered.compile()
            value, grads = self._compiled(params, self.rest, batch)
        return float(value), jax.tree.map(np.asarray, grads)


class _Both:
    def __init__(self, *cms):
        self.cms = cms

    def __enter__(self):
        for cm in self.cms:
            cm.__enter__()

    def __exit__(self, *exc):
        for cm in reversed(self.cms):
            cm.__exit__(*exc)


def leaf_name(path) -> str:
    return "/".join(str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path)


def randomized_params(params, seed: int = 0):
    """Host copy of MaxText's initial params with random biases (MaxText initialises them to 0) and large, varied
    sinks per head and layer: 20 (the sink takes almost all the mass), log(SEQ), negative and moderate values."""
    rng = np.random.default_rng(seed)
    sink_values = np.array([0.5, -1.0, np.log(SEQ), 20.0, 2.0, -3.0, 1.5, 0.25], np.float32)
    layers_seen = [0]

    def fill(path, x):
        x = np.array(x)
        name = leaf_name(path)
        if "sinks" in name.split("/"):  # [heads, scanned layers]
            per_layer = []
            for _ in range(int(np.prod(x.shape[1:]))):
                per_layer.append(np.roll(sink_values, 3 * layers_seen[0]))
                layers_seen[0] += 1
            return np.stack(per_layer, axis=-1).reshape(x.shape).astype(x.dtype)
        if "bias" in name:
            return (0.05 * rng.standard_normal(x.shape)).astype(x.dtype)
        return x

    return jax.tree_util.tree_map_with_path(fill, params)


def make_batch(packed: bool, seed: int = 0):
    """A MaxText training batch [BATCH, SEQ] (inputs, targets, positions, segmentations) as host arrays.

    packed: row 0 holds three sequences (10, 15, 5 tokens) and 2 padding tokens (segment id 0), row 1 two (20, 12).
    Unpacked (MaxText's packing: false): one sequence per row, row 0 ending in 5 padding tokens."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (BATCH, SEQ + 1))
    if packed:
        lengths = [[(1, 10), (2, 15), (3, 5), (0, 2)], [(1, 20), (2, 12)]]
    else:
        lengths = [[(1, SEQ - 5), (0, 5)], [(1, SEQ)]]
    seg = np.array([np.concatenate([np.full(n, i, np.int32) for i, n in row]) for row in lengths])
    pos = np.array([np.concatenate([np.arange(n, dtype=np.int32) for _, n in row]) for row in lengths])
    return dict(inputs=tokens[:, :-1].astype(np.int32), targets=tokens[:, 1:].astype(np.int32),
                inputs_position=pos, targets_position=pos, inputs_segmentation=seg, targets_segmentation=seg)


def assert_grads_close(actual, expected, rtol=1e-5, what=""):
    """Every gradient leaf equal within fp32 tolerance (atol relative to the leaf's largest entry)."""
    exp_leaves = jax.tree_util.tree_leaves_with_path(expected)
    act_leaves = jax.tree_util.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves)
    for (path, e), a in zip(exp_leaves, act_leaves):
        e, a = np.asarray(e), np.asarray(a)
        assert np.all(np.isfinite(a)), f"{what} {leaf_name(path)}: non-finite gradient"
        scale = float(np.abs(e).max())
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * max(scale, 1e-12),
                                   err_msg=f"{what} gradient of {leaf_name(path)}")


def sink_grads(grads):
    return {leaf_name(p): np.asarray(g) for p, g in jax.tree_util.tree_leaves_with_path(grads)
            if "sinks" in leaf_name(p).split("/")}
