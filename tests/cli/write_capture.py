#!/usr/bin/env python3
"""Writes a small attention call capture (SPEC.md section 6) with known inputs, using only struct and json.

Independent of the C++ capture code: tests/cli/test_capture.cpp regenerates the same values with its own copy of
the generator below and checks that the reader returns every tensor and option exactly.

Values: a 64-bit LCG per tensor (seed derived from the tensor name), value = m / 32 with m in -96..-1, 1..96
(never zero, exact in bf16, fp16 and fp32).

Usage: write_capture.py --variant NAME --out FILE
"""
import argparse
import json
import struct

MASK64 = (1 << 64) - 1


def name_seed(name):
    return len(name) * 1000 + sum(ord(c) for c in name)


def values(name, n):
    state = name_seed(name)
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
        m = (state >> 33) % 192
        out.append((m - 96 + (1 if m >= 96 else 0)) / 32.0)
    return out


def encode(dtype, vals):
    if dtype == "F32":
        return b"".join(struct.pack("<f", v) for v in vals)
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in vals)
    if dtype == "BF16":  # values are exact in bf16: the upper half of the fp32 bits
        return b"".join(struct.pack("<f", v)[2:4] for v in vals)
    if dtype == "I32":
        return b"".join(struct.pack("<i", v) for v in vals)
    raise ValueError(dtype)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# Each variant: tensors {name: (dtype, shape, explicit values or None for generated)}, metadata.
VARIANTS = {
    # dense bf16, GQA 4/2, d != d_v, learnable sinks with large values, sliding window + causal, bias, d_out.
    "bf16-gqa-window": dict(
        tensors={
            "q": ("BF16", [2, 5, 4, 16], None),
            "k": ("BF16", [2, 7, 2, 16], None),
            "v": ("BF16", [2, 7, 2, 8], None),
            "sinks": ("F32", [4], [1.9459101090932196, 20.0, -1.5, 0.75]),  # log(s_kv) = log(7), 20
            "bias": ("F32", [1, 4, 5, 7], None),
            "d_out": ("BF16", [2, 5, 4, 8], None),
        },
        metadata={
            "softmax_type": "learnable",
            "softmax_scale": "0.3",
            "window_left": "3",
            "window_right": "0",
            "mask_alignment": "bottom_right",
            "deterministic": "1",
        },
    ),
    # varlen fp32 with a zero-length query sequence and a sequence without keys, dropout, d_lse, top-left,
    # seed above 2^63; max_seqlen keys omitted (default: the longest sequence).
    "f32-varlen-dropout": dict(
        tensors={
            "q": ("F32", [7, 2, 8], None),
            "k": ("F32", [7, 1, 8], None),
            "v": ("F32", [7, 1, 8], None),
            "sinks": ("F32", [2], [2.0794415416798357, 20.0]),  # log(8), 20
            "d_out": ("F32", [7, 2, 8], None),
            "d_lse": ("F32", [2, 7], None),
            "cu_seqlens_q": ("I32", [4], [0, 3, 3, 7]),
            "cu_seqlens_kv": ("I32", [4], [0, 5, 7, 7]),
        },
        metadata={
            "softmax_type": "learnable",
            "window_left": "-1",
            "window_right": "-1",
            "mask_alignment": "top_left",
            "dropout_p": "0.25",
            "seed": "12345678901234567890",
            "offset": "7",
        },
    ),
    # dense fp16 off-by-one with padding (seqlens_q, seqlens_kv), causal, defaults for the other keys.
    "f16-padding-offbyone": dict(
        tensors={
            "q": ("F16", [2, 6, 2, 8], None),
            "k": ("F16", [2, 6, 2, 8], None),
            "v": ("F16", [2, 6, 2, 8], None),
            "d_out": ("F16", [2, 6, 2, 8], None),
            "seqlens_q": ("I32", [2], [6, 4]),
            "seqlens_kv": ("I32", [2], [5, 6]),
        },
        metadata={"softmax_type": "off_by_one", "window_right": "0"},
    ),
    # paged KV decode (SPEC.md section 1), bf16, GQA 8/2: k, v page pools [7 pages, 16 rows]; sequence 0 uses 3 pages
    # (40 keys, ends mid-page), 1 none, 2 two pages (17 keys); sequences 0 and 2 share page 0 (a common page); table
    # entries past each sequence's pages are garbage, which is never read. Learnable sinks, GPT-OSS window, forward.
    "bf16-paged-decode": dict(
        tensors={
            "q": ("BF16", [3, 1, 8, 16], None),
            "k": ("BF16", [7, 16, 2, 16], None),
            "v": ("BF16", [7, 16, 2, 16], None),
            "sinks": ("F32", [8], [3.6888794541139363, 20.0, -1.5, 0.75, 1.0, 2.0, 0.25, -3.0]),  # log(40), 20
            "seqused_kv": ("I32", [3], [40, 0, 17]),
            "page_table": ("I32", [3, 4], [5, 0, 6, -1, 99, -7, 2147483647, 3, 0, 3, 1000, -5]),
        },
        metadata={"softmax_type": "learnable", "window_left": "31", "window_right": "0"},
    ),
    # paged KV with varlen queries (chunked prefill / speculative tokens): fp16, 3 sequences of 2, 0 and 3 queries,
    # causal, pages of 8 rows (page pools [5, 8, 1, 8]); max_seqlen keys omitted (default: the longest sequence,
    # max(seqused_kv) for the keys).
    "f16-paged-varlen": dict(
        tensors={
            "q": ("F16", [5, 2, 8], None),
            "k": ("F16", [5, 8, 1, 8], None),
            "v": ("F16", [5, 8, 1, 8], None),
            "cu_seqlens_q": ("I32", [4], [0, 2, 2, 5]),
            "seqused_kv": ("I32", [3], [9, 3, 16]),
            "page_table": ("I32", [3, 2], [4, 1, 2, -1, 0, 3]),
        },
        metadata={"softmax_type": "off_by_one", "window_right": "0"},
    ),
}


def build(variant):
    spec = VARIANTS[variant]
    header = {}
    data = b""
    for name, (dtype, shape, vals) in spec["tensors"].items():
        if vals is None:
            vals = values(name, numel(shape))
        assert len(vals) == numel(shape), name
        blob = encode(dtype, vals)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    header["__metadata__"] = spec["metadata"]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.out, "wb") as f:
        f.write(build(args.variant))


if __name__ == "__main__":
    main()
