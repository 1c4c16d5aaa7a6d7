"""The argument rules both bindings share (python/sinkattn/_args.py), checked without either framework's op: the
C ABI enums against include/sinkattn/sinkattn.h, the window rules of SPEC.md section 2 (FlashAttention's causal
rule), the default scale and the byte layout of the dropout words."""

import math
import os
import re

import numpy as np
import pytest

from sinkattn import _args

_HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "include", "sinkattn", "sinkattn.h")


def test_enums_match_the_c_header():
    text = open(_HEADER).read()
    for name, value in _args.SOFTMAX_TYPES.items():
        m = re.search(rf"SINKATTN_SOFTMAX_{name.upper()}\s*=\s*(\d+)", text)
        assert m is not None and int(m.group(1)) == value, name
    for name, value in _args.ALIGNMENTS.items():
        m = re.search(rf"SINKATTN_ALIGN_{name.upper()}\s*=\s*(\d+)", text)
        assert m is not None and int(m.group(1)) == value, name


def test_softmax_type_follows_the_sinks():
    assert _args.resolve_softmax_type(None, np.zeros(2)) == "learnable"
    assert _args.resolve_softmax_type(None, None) == "vanilla"
    assert _args.resolve_softmax_type("off_by_one", np.zeros(2)) == "off_by_one"
    with pytest.raises(ValueError, match=r"^sinkattn: softmax_type must be one of \['vanilla', 'off_by_one', "
                       r"'learnable'\], got 'sink'$"):
        _args.resolve_options("sink", None, "bottom_right")
    with pytest.raises(ValueError, match=r"^sinkattn: mask_alignment must be one of"):
        _args.resolve_options(None, None, "top_right")


def test_windows():
    # FlashAttention's rule: causal sets the right bound to 0 whatever was given; negative or None is unbounded
    assert _args.window_size_bounds(True, (127, 5)) == (127, 0)
    assert _args.window_size_bounds(False, (127, 5)) == (127, 5)
    assert _args.window_size_bounds(False, (None, -7)) == (-1, -1)
    assert _args.window_size_bounds(True, None) == (-1, 0)
    assert _args.resolve_window(True, (127, 5)) == (127, 0)
    assert _args.resolve_window(False, np.int64(3)) == (3, 3)
    assert _args.resolve_window(False, (-2, 4)) == (-1, 4)
    assert _args.resolve_window(False, None) == (-1, -1)
    for bad in (127, (127,), (127.0, 0), (True, 0)):
        with pytest.raises(TypeError, match=r"^sinkattn: window_size must be a pair \(left, right\) of ints"):
            _args.window_size_bounds(False, bad)
    for bad in ((1, 2, 3), 1.5, True):
        with pytest.raises(TypeError, match=r"^sinkattn: local_window_size must be an int or a pair"):
            _args.resolve_window(False, bad)


def test_default_scale():
    assert _args.softmax_scale(None, 64) == 0.125
    assert _args.softmax_scale(None, 80) == 1.0 / math.sqrt(80)
    assert _args.softmax_scale(0.3, 64) == 0.3


@pytest.mark.parametrize("seed, offset", [(0, 0), (0x0123456789ABCDEF, 7), (-1, -(2**63)), (2**63 - 1, 123 << 33)])
def test_dropout_words_are_the_bytes_of_int64_seed_offset(seed, offset):
    words = np.asarray(_args.seed_offset_words(seed, offset), np.uint32)
    assert words.view(np.int64).tolist() == [seed, offset]  # little-endian, as the library reads I64[2]
    assert _args.words_seed_offset(words) == (seed, offset)
