"""The argument rules of a call, shared by the JAX binding (``sinkattn.jax``: the op, decode, ring and all-to-all
attention), its float64 reference (``sinkattn.jax.reference``) and the PyTorch binding (``sinkattn.torch``), so
that they cannot disagree: the C ABI's enums of softmax_type and mask_alignment (include/sinkattn/sinkattn.h), the
softmax type a call resolves to, the window bounds of SPEC.md section 2, the default softmax_scale and the layout
of the dropout seed/offset words. Pure Python: no arrays of either framework.

Errors are ValueError / TypeError with messages ``"sinkattn: <argument>: ..."`` / ``"sinkattn: <argument> must
..."``, naming the argument as the API at hand spells it (``_errors.argument_names`` rewords them for the aliases
of FlashAttention and HF).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SOFTMAX_TYPES", "ALIGNMENTS", "resolve_softmax_type", "resolve_options", "check_softmax_type",
           "window_bounds", "resolve_window", "window_size_bounds", "softmax_scale", "seed_offset_words",
           "words_seed_offset"]

# sinkattn_softmax_type_t and sinkattn_mask_alignment_t of include/sinkattn/sinkattn.h.
SOFTMAX_TYPES = {"vanilla": 0, "off_by_one": 1, "learnable": 2}
ALIGNMENTS = {"bottom_right": 0, "top_left": 1}


def resolve_softmax_type(softmax_type, sinks) -> str:
    """The softmax type of a call: as given, or (None) "learnable" when sinks are given, else "vanilla". One rule for
    every entry point and the reference, so that sinks passed without a softmax type are never dropped."""
    if softmax_type is None:
        return "learnable" if sinks is not None else "vanilla"
    return softmax_type


def check_softmax_type(softmax_type) -> None:
    """ValueError unless softmax_type is one of SOFTMAX_TYPES' names."""
    if softmax_type not in SOFTMAX_TYPES:
        raise ValueError(f"sinkattn: softmax_type must be one of {list(SOFTMAX_TYPES)}, got {softmax_type!r}")


def resolve_options(softmax_type, sinks, mask_alignment) -> str:
    """The resolved softmax type of a call (resolve_softmax_type), checked together with mask_alignment (ValueError
    for a name the library does not have)."""
    softmax_type = resolve_softmax_type(softmax_type, sinks)
    check_softmax_type(softmax_type)
    if mask_alignment not in ALIGNMENTS:
        raise ValueError(f"sinkattn: mask_alignment must be one of {list(ALIGNMENTS)}, got {mask_alignment!r}")
    return softmax_type


def window_bounds(left, right, causal: bool) -> tuple[int, int]:
    """(window_left, window_right) of SPEC.md section 2: a negative bound (or None) is unbounded (-1); ``causal``
    sets the right bound to 0 whatever was given, as FlashAttention does (causal with (127, 5) is (127, 0))."""
    left = -1 if left is None or left < 0 else int(left)
    right = -1 if right is None or right < 0 else int(right)
    if causal:
        right = 0
    return left, right


def _is_int(x) -> bool:
    """A Python or numpy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def resolve_window(is_causal: bool, local_window_size) -> tuple[int, int]:
    """(window_left, window_right) from jax.nn-style arguments: ``local_window_size`` None, an int (both sides) or a
    pair (left, right) of ints (JAX op, decode, reference)."""
    left = right = -1
    if local_window_size is not None:
        w = local_window_size
        if not (_is_int(w) or (isinstance(w, (tuple, list)) and len(w) == 2 and all(_is_int(x) for x in w))):
            raise TypeError(f"sinkattn: local_window_size must be an int or a pair (left, right) of ints (a negative "
                            f"bound is unbounded; GPT-OSS sliding layers: (127, 0)), got {type(w).__name__} {w!r}")
        left, right = (int(x) for x in w) if isinstance(w, (tuple, list)) else (int(w), int(w))
    return window_bounds(left, right, is_causal)


def window_size_bounds(causal: bool, window_size) -> tuple[int, int]:
    """(window_left, window_right) from FlashAttention's arguments: ``window_size = (left, right)``, a pair of ints,
    inclusive, -1 (or None) unbounded; None for the pair itself is (-1, -1) (PyTorch binding)."""
    if window_size is None:
        window_size = (-1, -1)
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in window_size)):
        raise TypeError(f"sinkattn: window_size must be a pair (left, right) of ints, -1 (or None) for unbounded, as "
                        f"FlashAttention takes it (GPT-OSS sliding layers: (127, 0)), got "
                        f"{type(window_size).__name__} {window_size!r}")
    return window_bounds(window_size[0], window_size[1], causal)


def softmax_scale(scale, head_dim: int) -> float:
    """The softmax_scale of a call: as given, default 1/sqrt(d) (SPEC.md section 2). The fused ops pass None on
    to the library, which applies the same default; code that scales by itself (ring attention) uses this."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def seed_offset_words(seed: int, offset: int) -> list[int]:
    """The dropout key as 4 uint32 words {lo32(seed), hi32(seed), lo32(offset), hi32(offset)}: the byte image of the
    library's int64 [2] ``rng_seed_offset`` {seed, offset} (SPEC.md section 2), which is what the JAX op passes
    (``sinkattn.jax.attention.rng_seed_offset_words`` draws the words from a JAX key)."""
    seed, offset = int(seed) & 0xFFFFFFFFFFFFFFFF, int(offset) & 0xFFFFFFFFFFFFFFFF
    return [seed & 0xFFFFFFFF, seed >> 32, offset & 0xFFFFFFFF, offset >> 32]


def words_seed_offset(words) -> tuple[int, int]:
    """(seed, offset) as signed int64 values (PyTorch's ``rng_seed_offset`` / ``rng_state``) of the 4 words of
    seed_offset_words."""
    w = [int(x) & 0xFFFFFFFF for x in words]
    signed = lambda u: u - (1 << 64) if u >> 63 else u
    return signed(w[0] | w[1] << 32), signed(w[2] | w[3] << 32)
