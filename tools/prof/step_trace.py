#!/usr/bin/env python3
"""Summarise the step timelines of a profiling build of the Hopper dK dV kernel (src/cuda/hopper/step_trace.cuh).

A library built with -DSINKATTN_STEP_TRACE writes $SINKATTN_STEP_TRACE_DIR/dkdv_hd<HD>_bm<BM>_det<0|1>.bin after each
launch of that kernel: a header of 9 int64 (magic, head-dim tile, BM, deterministic, group, blocks, warps, steps,
points), then per traced block 4 uint64 (SM, tile, start ns, end ns), then the clock64 stamps
[block][warp][step][point] (0: not reached: a warpgroup that skipped the step's softmax, or steps past the block's).

For every phase between consecutive points (and from a step's end to the next step's top) this prints the median and
mean cycles over the traced warps and steps (step 0 and each block's last traced step left out), per warpgroup; for
the two block barriers, which warp arrived last how often and how long the others waited; and the cycles of a whole
step. Usage: step_trace.py FILE.bin [--json OUT.json]
"""
import argparse
import json
import statistics
import struct
import sys

# the phases between the points of step_trace.cuh's TracePoint: (from point, to point, name)
PHASES = [
    (0, 1, "wait for the step's loads"),
    (1, 2, "barrier A"),
    (2, 3, "issue S^T dP^T (thread 0: reduce-adds, loads), wait S^T"),
    (3, 4, "P^T, issue dV, wait dP^T"),
    (4, 5, "dS^T, store to sdS, pack"),
    (5, 6, "wait sdQ buffer read"),
    (6, 7, "barrier B"),
    (7, 8, "issue dQ dK (kDet: turn), wait dQ, stage dQ, wait dK"),
    (8, 9, "store next LSE2 / D"),
]


def load(path):
    data = open(path, "rb").read()
    hdr = struct.unpack_from("<9q", data, 0)
    if hdr[0] != 0x53544550:
        sys.exit(f"{path}: not a step trace")
    _, hd, bm, det, group, nb, nw, ns, npt = hdr
    off = 9 * 8
    blocks = struct.unpack_from(f"<{nb * 4}Q", data, off)
    off += nb * 4 * 8
    stamps = struct.unpack_from(f"<{nb * nw * ns * npt}Q", data, off)
    return dict(hd=hd, bm=bm, det=det, group=group, nb=nb, nw=nw, ns=ns, npt=npt), blocks, stamps


def summarise(meta, blocks, stamps):
    nb, nw, ns, npt = meta["nb"], meta["nw"], meta["ns"], meta["npt"]

    def st(b, w, s, p):
        return stamps[((b * nw + w) * ns + s) * npt + p]

    phase = {name: {0: [], 1: []} for _, _, name in PHASES}
    phase["end -> next step"] = {0: [], 1: []}
    step_cycles = []
    last_a = [0] * nw
    last_b = [0] * nw
    wait_a = {0: [], 1: []}
    wait_b = {0: [], 1: []}
    traced = 0
    for b in range(nb):
        if blocks[4 * b + 2] == 0:
            continue
        traced += 1
        steps = [s for s in range(ns) if all(st(b, w, s, 0) for w in range(nw))]
        for s in steps[1:-1]:
            for w in range(nw):
                wg = w // 4
                for p0, p1, name in PHASES:
                    a, c = st(b, w, s, p0), st(b, w, s, p1)
                    if a and c and c >= a:
                        phase[name][wg].append(c - a)
                if s + 1 in steps and st(b, w, s, npt - 1):
                    phase["end -> next step"][wg].append(st(b, w, s + 1, 0) - st(b, w, s, npt - 1))
            if s + 1 in steps:
                step_cycles.append(st(b, 0, s + 1, 0) - st(b, 0, s, 0))
            # barrier A: arrival = loaded, exit = barrier A; barrier B: arrival = dq buffer, exit = barrier B
            for arr, ext, last, waits in ((1, 2, last_a, wait_a), (6, 7, last_b, wait_b)):
                t_arr = [st(b, w, s, arr) for w in range(nw)]
                t_ext = [st(b, w, s, ext) for w in range(nw)]
                if not all(t_arr) or not all(t_ext):
                    continue
                lw = max(range(nw), key=lambda w: t_arr[w])
                last[lw] += 1
                for w in range(nw):
                    waits[w // 4].append(t_ext[w] - t_arr[w])
    out = {"meta": meta, "traced_blocks": traced, "step_cycles_median": statistics.median(step_cycles)
           if step_cycles else None, "phases": {}, "barrier_a_last_warp": last_a, "barrier_b_last_warp": last_b}
    for name, per in phase.items():
        out["phases"][name] = {f"wg{wg}": {"median": statistics.median(v), "mean": statistics.fmean(v), "n": len(v)}
                               for wg, v in per.items() if v}
    out["barrier_wait"] = {"A": {f"wg{k}": statistics.median(v) for k, v in wait_a.items() if v},
                           "B": {f"wg{k}": statistics.median(v) for k, v in wait_b.items() if v}}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json")
    a = ap.parse_args()
    meta, blocks, stamps = load(a.trace)
    out = summarise(meta, blocks, stamps)
    m = out["meta"]
    print(f"{a.trace}: head-dim tile {m['hd']}, {m['bm']} query rows a step, deterministic {m['det']}, group "
          f"{m['group']}; {out['traced_blocks']} blocks traced; a step: median {out['step_cycles_median']} cycles")
    print(f"{'phase':58s} {'wg0 median':>10s} {'mean':>8s} {'wg1 median':>10s} {'mean':>8s}")
    for name, per in out["phases"].items():
        w0, w1 = per.get("wg0", {}), per.get("wg1", {})
        print(f"{name:58s} {w0.get('median', 0):10.0f} {w0.get('mean', 0):8.0f} {w1.get('median', 0):10.0f} "
              f"{w1.get('mean', 0):8.0f}")
    print("barrier A: last to arrive, per warp:", out["barrier_a_last_warp"], " median wait per warpgroup:",
          out["barrier_wait"]["A"])
    print("barrier B: last to arrive, per warp:", out["barrier_b_last_warp"], " median wait per warpgroup:",
          out["barrier_wait"]["B"])
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
