"""sinkattn as an attention implementation of HF transformers (GPT-OSS and every model with an attention
interface), trained and run with the fused sink forward and backward.

    import sinkattn.torch.hf
    sinkattn.torch.hf.register()                                   # name "sinkattn"
    model = AutoModelForCausalLM.from_config(GptOssConfig(...), attn_implementation="sinkattn")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sinkattn")

One config object per model: transformers keeps the attention implementation in the model's config, and
``from_config(cfg, attn_implementation=...)`` (also ``GptOssForCausalLM._from_config``) uses ``cfg`` itself, not a
copy. A second model built from the same config object with another ``attn_implementation`` therefore switches the
first model's attention as well, silently (seen with transformers 5.25: an "eager" model then runs "sinkattn").
To compare sinkattn with another implementation, give each model its own config::

    ref = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="sinkattn")

``register`` adds ``attention_forward`` to ``transformers.AttentionInterface`` and FlashAttention's mask function
(a 2-D padding mask or None: no dense mask is built) to ``AttentionMaskInterface`` under a name without "flash"
(transformers swaps names containing it for GPT-OSS to its own kernels). What reaches the attention function:

- ``s_aux`` (GPT-OSS: the layer's ``sinks`` parameter): the learnable sink, in its own dtype (upcast inside, its
  gradient back in its dtype). Without it the softmax is vanilla.
- ``sliding_window``: HF counts the current token (keys ``i - sliding_window + 1 .. i``), so the window is
  ``(sliding_window - 1, 0)`` causal (GPT-OSS: 127).
- a 2-D ``attention_mask`` (padding, any side): the rows are unpadded to a varlen call and scattered back (out = 0
  on padding rows); a 4-D mask (bool or additive float) is applied as the post-scale bias of a dense call.
- packed sequences: ``cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k`` kwargs (TRL's padding-free
  collator), or else ``position_ids`` whose runs restart (any batch size: every run is one sequence).
- ``dropout`` (HF passes the config's attention dropout in training, 0 in eval): SPEC.md's Philox dropout keyed by
  PyTorch's RNG; ``deterministic`` kwarg, else ``FLASH_ATTENTION_DETERMINISTIC=1``, for a bitwise reproducible
  backward; ``scaling`` is ``softmax_scale``. ``softcap`` is rejected (not silently dropped).

The padding and packing paths read lengths back to the host (as HF's FlashAttention path does); the cu_seqlens they
build are trusted by the library (no second check). Dense batches read nothing back.

Context parallelism (the sequence split over a process group, ``sinkattn.torch.distributed``):

    name = sinkattn.torch.hf.register_context_parallel(cp_group, mode="ring", layout="zigzag")   # "sinkattn_cp"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=name)
    ids, pos, labels = cp_inputs(input_ids, cp_group, layout="zigzag")   # this rank's tokens, global positions
    loss = model(input_ids=ids, position_ids=pos, labels=labels, shift_labels=labels,
                 num_items_in_batch=n_global).loss                        # local sum / global count
    loss.backward()                                   # then sum the parameter gradients over cp_group (DDP / FSDP)

Every rank holds the model and its block of every sequence; position ids are the tokens' global positions (rotary
embeddings are per token, so the zig-zag order needs nothing else), labels are shifted once globally (the shift of
HF's loss would cross the block boundaries), and each rank's loss is its tokens' summed loss over the global token
count, so that the sum of the ranks' gradients is the unsharded model's gradient. The attention function leaves
d_sinks local (``reduce_d_sinks=False``): the sinks are a parameter like every other, summed over the group by the
framework (DDP / FSDP over the context-parallel ranks, or an all-reduce), not counted twice.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from .._errors import argument_names
from .attention import dot_product_attention

__all__ = ["NAME", "register", "attention_forward", "CP_NAME", "register_context_parallel", "cp_inputs"]

NAME = "sinkattn"
CP_NAME = "sinkattn_cp"
_TRUST_CU_SEQ_LENS = [False]


def register(name: str = NAME, trust_cu_seq_lens: bool = False) -> str:
    """Registers sinkattn with transformers under ``name`` (no "flash" in it) and returns the name.

    ``trust_cu_seq_lens``: skip the library's check of caller-given ``cu_seq_lens_*`` kwargs on CUDA (one
    synchronising read-back per layer; the lengths this module computes itself are always trusted)."""
    if "flash" in name.lower():
        raise ValueError(f"sinkattn: the name {name!r} contains 'flash', which transformers replaces for GPT-OSS")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    _TRUST_CU_SEQ_LENS[0] = bool(trust_cu_seq_lens)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def _cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _runs_of(position_ids: torch.Tensor, batch: int, length: int) -> Optional[tuple]:
    """Packed sequences from position_ids [b or 1, s] (a run ends where the next id is not this id + 1, as
    transformers' masks see it): (cu_seqlens int32, max length) over the flattened b * s tokens, or None when every
    row is a single run (a plain dense batch). Reads the result back to the host."""
    pos = position_ids.expand(batch, length)
    start = torch.ones_like(pos, dtype=torch.bool)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    if not bool(start[:, 1:].any()):
        return None
    starts = torch.nonzero(start.reshape(-1)).reshape(-1)
    cu = torch.cat([starts.to(torch.int32), torch.tensor([batch * length], dtype=torch.int32, device=pos.device)])
    return cu, int(cu.diff().max())


def _same_dtype(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """query, key, value in one dtype, as transformers' FlashAttention path does it: a float32 query (rotary
    embeddings upcast q and k; a float32 model under autocast) goes to the autocast dtype when autocast is on for its
    device (sinkattn.torch.dot_product_attention casts), else to the dtype of the layer's first Linear weight; key and
    value follow the query."""
    target = query.dtype
    if query.dtype == torch.float32 and not torch.is_autocast_enabled(query.device.type):
        linear = next((m for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
        if linear is not None and linear.weight.is_floating_point():
            target = linear.weight.dtype
    return tuple(x if x.dtype == target else x.to(target) for x in (query, key, value))


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, s_aux: Optional[torch.Tensor] = None, **kwargs):
    """transformers' attention-interface function: query [b, h_q, s_q, d], key / value [b, h_kv, s_kv, d] (HF's
    layout; read as strided [b, s, h, d] views without a copy) -> (out [b, s_q, h_q, d_v], None). Errors name the
    arguments as transformers passes them (query, s_aux, ...)."""
    with argument_names(q="query", k="key", v="value", sinks="s_aux", softmax_scale="scaling", dropout_p="dropout",
                        window_size="sliding_window", bias="attention_mask"):
        return _attention_forward(module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
                                  is_causal, s_aux, **kwargs)


def _window_size(sliding_window, causal: bool) -> tuple[int, int]:
    """FlashAttention's window_size of HF's ``sliding_window`` (keys ``i - sliding_window + 1 .. i``, the current
    token counted): ``(sliding_window - 1, 0)`` causal, the same bound on both sides otherwise; (-1, -1) without."""
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    return (sliding_window - 1, 0 if causal else sliding_window - 1)


def _attention_forward(module, query, key, value, attention_mask, dropout, scaling, sliding_window, softcap,
                       is_causal, s_aux, **kwargs):
    if softcap is not None:
        raise ValueError("sinkattn: softcap is not supported (SPEC.md has no logit soft-capping)")
    b, s_q, s_kv = query.shape[0], query.shape[2], key.shape[2]
    q, k, v = (x.transpose(1, 2) for x in _same_dtype(module, query, key, value))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and not (attention_mask is not None and attention_mask.dim() == 4)
    window = _window_size(sliding_window, causal)
    deterministic = kwargs.get("deterministic")
    if deterministic is None:
        deterministic = os.environ.get("FLASH_ATTENTION_DETERMINISTIC", "0") == "1"
    opts = dict(sinks=s_aux, softmax_scale=scaling, causal=causal, window_size=window, dropout_p=dropout,
                deterministic=bool(deterministic))
    h_q, d_v = q.shape[2], v.shape[3]

    if attention_mask is not None and attention_mask.dim() == 4:  # a prepared mask: the bias of a dense call
        mask = attention_mask
        if mask.dtype == torch.bool:
            bias = torch.where(mask, 0.0, float("-inf"))
        else:  # transformers' additive masks use the dtype's lowest value: -inf for the library (SPEC.md section 3)
            bias = mask.masked_fill(mask == torch.finfo(mask.dtype).min, float("-inf"))
        return dot_product_attention(q, k, v, bias[..., -s_kv:], **opts), None

    if attention_mask is not None:  # 2-D padding mask [b, >= s_kv]: unpad to varlen, pad the result back
        mask_k = attention_mask[:, -s_kv:].to(torch.bool)
        mask_q = mask_k[:, -s_q:]
        len_k, len_q = mask_k.sum(-1, dtype=torch.int32), mask_q.sum(-1, dtype=torch.int32)
        idx_k = torch.nonzero(mask_k.reshape(-1)).reshape(-1)
        idx_q = idx_k if s_q == s_kv else torch.nonzero(mask_q.reshape(-1)).reshape(-1)
        max_q, max_k = (int(x) for x in torch.stack([len_q.max(), len_k.max()]).cpu())
        out = dot_product_attention(
            q.reshape(b * s_q, h_q, -1)[idx_q], k.reshape(b * s_kv, k.shape[2], -1)[idx_k],
            v.reshape(b * s_kv, v.shape[2], -1)[idx_k], cu_seqlens_q=_cu_seqlens(len_q), cu_seqlens_kv=_cu_seqlens(len_k),
            max_seqlen_q=max_q, max_seqlen_kv=max_k, trust_device_batch_tensors=True, **opts)
        full = out.new_zeros(b * s_q, h_q, d_v).index_copy(0, idx_q, out)
        return full.view(b, s_q, h_q, d_v), None

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    trust = _TRUST_CU_SEQ_LENS[0]
    if cu_q is None or cu_k is None or max_q is None or max_k is None:
        cu_q = None
        position_ids = kwargs.get("position_ids")
        if position_ids is not None and s_q == s_kv and s_q > 1:
            runs = _runs_of(position_ids, b, s_q)
            if runs is not None:
                (cu_q, max_q), trust = runs, True
                cu_k, max_k = cu_q, max_q
    if cu_q is not None:  # packed sequences: b * s tokens as one varlen batch
        max_q = int(max_q) if not isinstance(max_q, torch.Tensor) else int(max_q.item())
        max_k = int(max_k) if not isinstance(max_k, torch.Tensor) else int(max_k.item())
        out = dot_product_attention(
            q.reshape(b * s_q, h_q, -1), k.reshape(b * s_kv, k.shape[2], -1), v.reshape(b * s_kv, v.shape[2], -1),
            cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=max_q, max_seqlen_kv=max_k,
            trust_device_batch_tensors=trust, **opts)
        return out.view(b, s_q, h_q, d_v), None

    return dot_product_attention(q, k, v, **opts), None


# ----------------------------------------------------------------------------------------------------------------
# context parallelism
# ----------------------------------------------------------------------------------------------------------------
def register_context_parallel(group=None, mode: str = "ring", layout: str = "zigzag", name: str = CP_NAME,
                              reduce_d_sinks: bool = False) -> str:
    """Registers a context-parallel attention function with transformers under ``name`` and returns the name: every
    attention layer of a model built with ``attn_implementation=name`` calls ``sinkattn.torch.distributed``'s
    ``ring_attention`` (``mode="ring"``) or ``ulysses_attention`` (``mode="ulysses"``) over ``group`` (None: the
    default group) on its rank's block of the sequence, in ``layout`` order ("zigzag": the ring's load-balanced
    causal layout; "contiguous"), with the layer's sinks and sliding window. See the module docstring for the inputs
    (:func:`cp_inputs`) and the gradient reduction; ``reduce_d_sinks``: all-reduce d_sinks in the attention instead
    of leaving it to the framework (only when nothing else sums the model's gradients over ``group``).

    Not supported (raise): padding masks (pack or fill the sequences instead), attention dropout, softcap."""
    if "flash" in name.lower():
        raise ValueError(f"sinkattn: the name {name!r} contains 'flash', which transformers replaces for GPT-OSS")
    if mode not in ("ring", "ulysses"):
        raise ValueError(f"sinkattn: mode must be 'ring' or 'ulysses', got {mode!r}")
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"sinkattn: layout must be 'contiguous' or 'zigzag', got {layout!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    from . import distributed

    fn = distributed.ring_attention if mode == "ring" else distributed.ulysses_attention

    def cp_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                             sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
        """query [b, h_q, s/p, d], key / value [b, h_kv, s/p, d] (HF's layout, this rank's block) -> (out
        [b, s/p, h_q, d_v], None)."""
        if softcap is not None:
            raise ValueError("sinkattn: softcap is not supported (SPEC.md has no logit soft-capping)")
        if dropout:
            raise NotImplementedError("sinkattn: attention dropout is not supported with context parallelism")
        if attention_mask is not None:
            raise NotImplementedError("sinkattn: padding masks are not supported with context parallelism (every "
                                      "rank holds a block of each sequence): pack or fill the sequences instead")
        q, k, v = (x.transpose(1, 2) for x in _same_dtype(module, query, key, value))
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
        window = _window_size(sliding_window, causal)
        out = fn(q, k, v, group=group, learnable_sink=s_aux, softmax_scale=scaling, causal=causal,
                 window_size=window, layout=layout, reduce_d_sinks=reduce_d_sinks)
        return out, None

    AttentionInterface.register(name, cp_attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def cp_inputs(input_ids: torch.Tensor, group=None, layout: str = "zigzag", labels: Optional[torch.Tensor] = None,
              ignore_index: int = -100):
    """(input_ids, position_ids, shift_labels) of this rank for a context-parallel causal LM step: the rank's block
    (``layout`` order, as ``register_context_parallel``'s) of the tokens [b, s], of their global positions and of
    the labels shifted once over the whole sequence (labels default to input_ids; the last position gets
    ``ignore_index``). s must be divisible by p (2p for zigzag). Pass the labels as both ``labels`` and
    ``shift_labels``, and ``num_items_in_batch`` = the global count of labels != ignore_index."""
    from .distributed import shard_sequence

    labels = input_ids if labels is None else labels
    shift = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index)
    pos = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
    return tuple(shard_sequence(x, group, dim=1, layout=layout).contiguous() for x in (input_ids, pos, shift))
