#!/usr/bin/env python3
"""How evenly the warp-specialised Hopper forward's persistent blocks share a causal call's key blocks.

The forward (src/cuda/hopper/fwd_sm90_ws.cuh) walks its tiles (query block x head x sequence) in the longest-first
order of src/cuda/scheduler.hpp, in L2 sections of `section` (head, sequence) pairs, block b taking tiles b,
b + blocks, b + 2 blocks, ... (the fixed stride). A tile counter (docs/design/hopper-forward.md) would have a block
take the next untaken tile when it is ready for one, which this model takes to be when it has finished its previous
tile.
Model: a tile costs its key blocks plus `overhead` (its prologue and epilogue, in key-block steps), every step costs
the same on every SM. Printed: the busiest block's steps over the mean (1.00: perfectly even), per layer.

  tools/fwd_tile_balance.py [--sms 132] [--overhead 1.0]
"""
import argparse
import heapq


def tile_order(pairs, mblocks, section):
    """Query-block index of every tile in launch order (heavy_last: the last query blocks see the most keys)."""
    if section <= 0 or section >= pairs:
        section = pairs
    order = []
    first = 0
    while first < pairs:
        width = min(section, pairs - first)
        for o in range(mblocks):
            order += [mblocks - 1 - o] * width
        first += width
    return order


def costs(pairs, s, block_m, block_n, section, overhead):
    """Steps of every tile of a causal (bottom-right, s_q = s_kv = s) call."""
    mblocks = (s + block_m - 1) // block_m
    return [(min((b + 1) * block_m, s) + block_n - 1) // block_n + overhead
            for b in tile_order(pairs, mblocks, section)]


def fixed_stride(cost, blocks):
    load = [0.0] * blocks
    for i, c in enumerate(cost):
        load[i % blocks] += c
    return max(load)


def counter(cost, blocks):
    heap = [(0.0, b) for b in range(blocks)]
    for c in cost:
        t, b = heapq.heappop(heap)
        heapq.heappush(heap, (t + c, b))
    return max(t for t, _ in heap)


# name, (head, sequence) pairs, s, block_m, block_n, L2 section (dispatch.cpp's rule on a 50 MiB L2)
LAYERS = [
    ("GPT-OSS full (h 64, d 64, b 2, s 4096)", 128, 4096, 192, 128, 0),
    ("MHA d128 (h 32, b 2, s 4096)", 64, 4096, 128, 128, 13),
    ("head dim 256 (h 16, b 2, s 4096)", 32, 4096, 128, 64, 0),
    ("GPT-OSS full, s 16384 (b 1)", 64, 16384, 192, 128, 0),
    ("MHA d128, s 16384 (b 1)", 32, 16384, 128, 128, 3),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sms", type=int, default=132, help="persistent blocks (one per SM; H100 / H200 SXM: 132)")
    ap.add_argument("--overhead", type=float, default=1.0, help="a tile's steps beyond its key blocks")
    a = ap.parse_args()
    print(f"{'layer':45s} {'tiles':>6s} {'fixed stride':>13s} {'counter':>8s}")
    for name, pairs, s, bm, bn, section in LAYERS:
        c = costs(pairs, s, bm, bn, section, a.overhead)
        blocks = min(a.sms, len(c))
        mean = sum(c) / blocks
        print(f"{name:45s} {len(c):6d} {fixed_stride(c, blocks) / mean:12.3f}x {counter(c, blocks) / mean:7.3f}x")


if __name__ == "__main__":
    main()
