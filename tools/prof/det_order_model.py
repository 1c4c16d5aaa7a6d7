#!/usr/bin/env python3
"""A schedule model of the deterministic backward's fixed dq order (src/cuda/dq_order.hpp) against the default one.

132 SMs run one dK dV block each, blocks start in ticket order (key blocks ascending, every (head, batch) pair of a key
block before the next), a step takes 1, and a block may add its tile of step (query head, query block) only once its
predecessor in that query block's order has added its own and the release is visible L steps later. "cur" is the
library's order (query blocks descending, key blocks ascending within a query block); "fa" FlashAttention-3's causal
one (shortest blocks first, query blocks ascending, key blocks descending); "nodet" no turns. It prints each
layer's makespan in steps and the default / deterministic ratio: the start-up chain's share of the deterministic
backward's time, everything else (the turns' own cost in each step) left out.
Usage: det_order_model.py
"""
import heapq


def run(nq, nk, ratio, group, pairs, sms, lat, mode):
    """Makespan of one layer: nq query blocks, nk key blocks (key block kb sees query blocks kb * ratio ..), `group`
    query heads a KV head, `pairs` (KV head, batch) pairs."""
    kbs = list(range(nk)) if mode in ("cur", "nodet") else list(range(nk - 1, -1, -1))
    blocks = [(pr, kb) for kb in kbs for pr in range(pairs)]
    done = {}
    free = [(0.0, s) for s in range(sms)]
    heapq.heapify(free)
    end_all = 0.0
    for pr, kb in blocks:
        t, s = heapq.heappop(free)
        qbs = list(range(kb * ratio, nq))
        if mode == "cur":
            qbs.reverse()
        for qb in qbs:
            for ih in range(group):
                if mode == "cur":
                    pred = kb - 1 if kb > 0 else None
                elif mode == "fa":
                    pred = kb + 1 if kb + 1 <= min(nk - 1, qb // ratio) else None
                else:
                    pred = None
                start = t if pred is None else max(t, done[(pr, qb, ih, pred)])
                t = start + 1.0
                done[(pr, qb, ih, kb)] = t + lat
        end_all = max(end_all, t)
        heapq.heappush(free, (t, s))
    return end_all


def main():
    layers = [("GPT-OSS full, s 4096", 32, 32, 1, 8, 16), ("MHA d128, s 4096", 64, 32, 2, 1, 64),
              ("GPT-OSS full, s 16384", 128, 128, 1, 8, 8), ("MHA d128, s 16384", 256, 128, 2, 1, 32)]
    for name, nq, nk, ratio, group, pairs in layers:
        base = run(nq, nk, ratio, group, pairs, 132, 0, "nodet")
        for lat in (0.5, 1.0, 2.0):
            cur = run(nq, nk, ratio, group, pairs, 132, lat, "cur")
            fa = run(nq, nk, ratio, group, pairs, 132, lat, "fa")
            print(f"{name:24s} L {lat}: default {base:.0f} steps; fixed order {cur:.0f} ({base / cur:.3f}x); "
                  f"FA3's causal order {fa:.0f} ({base / fa:.3f}x)")


if __name__ == "__main__":
    main()
