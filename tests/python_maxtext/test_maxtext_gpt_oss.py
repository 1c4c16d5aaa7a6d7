"""MaxText's tiny GPT-OSS with attention=sinkattn against MaxText's own dot_product path.

Loss and every gradient (the sinks' included) of MaxText's training loss must equal those of the same model with
attention=dot_product (MaxText's unfused path, the reference) within fp32 tolerance: on one device with and
without packing, and with context parallelism on 8 virtual CPU devices (fsdp 2 x context 4, MaxText's
load-balanced DUAL_CHUNK_SWAP order) through the all-to-all (packed) and the ring (unpacked) against the
unsharded reference.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax

import sinkattn.jax.maxtext as sinkattn_maxtext
from sinkattn.jax import _ffi

from gpt_oss_tiny import (Model, assert_grads_close, make_batch, make_config, sink_grads, randomized_params)

CP = 4  # context-parallel size of the 8-device mesh (fsdp 2 x context 4)


@pytest.fixture(scope="module", autouse=True)
def installed():
    sinkattn_maxtext.install()
    yield
    sinkattn_maxtext.install(context_parallel="auto")


@pytest.fixture(scope="module")
def reference():
    """MaxText's dot_product model on one device; (loss, grads) per packing, computed once."""
    model = Model(make_config("dot_product"))
    params = randomized_params(model.params)
    results = {}

    def run(packed):
        if packed not in results:
            results[packed] = model.loss_and_grads(params, make_batch(packed))
        return results[packed]

    return model, params, run


@pytest.fixture(scope="module")
def single_device_sinkattn():
    return Model(make_config("sinkattn"))


def _check_against_reference(ref_loss, ref_grads, loss, grads, what):
    assert np.isfinite(ref_loss) and ref_loss > 0
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, err_msg=f"{what}: loss")
    assert_grads_close(grads, ref_grads, what=what)
    sinks = sink_grads(grads)
    assert len(sinks) == 2, sorted(sinks)  # one sinks parameter per decoder layer (sliding, global)
    for name, g in sinks.items():  # the sinks learn: their gradient is not zero
        assert np.abs(g).max() > 1e-4, (name, g)


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_single_device_matches_dot_product(reference, single_device_sinkattn, packed):
    ref_model, params, run = reference
    ref_loss, ref_grads = run(packed)
    loss, grads = single_device_sinkattn.loss_and_grads(params, make_batch(packed))
    _check_against_reference(ref_loss, ref_grads, loss, grads, f"1 device, {'packed' if packed else 'unpacked'}")
    # the fused op ran (forward and backward custom calls), and MaxText's path did not
    assert _ffi.FORWARD_TARGET in single_device_sinkattn.hlo and _ffi.BACKWARD_TARGET in single_device_sinkattn.hlo
    assert _ffi.FORWARD_TARGET not in ref_model.hlo


@pytest.mark.parametrize("mode,packed,collective", [("all_to_all", True, "all_to_all"),
                                                    ("ring", False, "collective_permute")],
                         ids=["all_to_all-packed", "ring-unpacked"])
def test_context_parallel_matches_unsharded(reference, mode, packed, collective):
    """8 virtual devices: batch over fsdp (2), sequence over context (4) in MaxText's load-balanced order."""
    from maxtext.common.common_types import ReorderStrategy
    from maxtext.utils import max_utils

    assert jax.device_count() >= 8, "needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
    _, params, run = reference
    ref_loss, ref_grads = run(packed)
    sinkattn_maxtext.install(context_parallel=mode)
    model = Model(make_config("sinkattn", num_devices=8, ici_fsdp_parallelism=2, ici_context_parallelism=CP,
                              packing=packed, context_parallel_load_balance=True), num_devices=8)
    assert model.mesh.shape["context"] == CP and model.mesh.shape["fsdp"] == 2
    # what MaxText's train loop feeds a load-balanced context-parallel step (utils/train_utils.py)
    batch = max_utils.reorder_causal_load_balanced(make_batch(packed), CP, ReorderStrategy.DUAL_CHUNK_SWAP, "cpu")
    batch = jax.tree.map(np.asarray, batch)
    loss, grads = model.loss_and_grads(params, batch)
    _check_against_reference(ref_loss, ref_grads, loss, grads, f"context parallel {mode}")
    assert _ffi.FORWARD_TARGET in model.hlo and collective in model.hlo


def test_maxtext_reorder_is_sinkattn_zigzag():
    """MaxText's DUAL_CHUNK_SWAP order is the layout sinkattn's ring and all-to-all call zig-zag."""
    from maxtext.utils import max_utils
    from sinkattn.jax.ring import zigzag_permute

    x = np.arange(3 * 64).reshape(3, 64)
    for cp in (2, 4, 8):
        np.testing.assert_array_equal(np.asarray(max_utils.reorder_sequence(x, cp_size=cp, seq_dim=1)),
                                      np.asarray(zigzag_permute(x, cp, axis=1)))
