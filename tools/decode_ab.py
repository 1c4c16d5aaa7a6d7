#!/usr/bin/env python3
"""Decode A/B table: sinkattn_gpu_bench_decode runs of several libraries side by side.

Input: the files that `AB_OUT=DIR BENCH=$AB_DIR/sinkattn_gpu_bench_decode tools/gpu-ab.sh run REPS ROUNDS` writes,
DIR/NAME_ROUND.json (the bench's --json report). Usage: tools/decode_ab.py DIR NAME1,NAME2,...

Per configuration: the K/V megabytes, the streaming read of the same bytes (us, the fastest of all runs), and per
library the fastest of its rounds (us per call in the CUDA graph), its share of the streaming read and its split
count; then per library the ranges the decode targets of bench/RESULTS.md judge (K/V >= 64 MB, the sliding layer at
batch 256, calls under 4 MB against the launch floor).
"""
import glob
import json
import sys


def runs_of(directory, name):
    out = []
    for f in sorted(glob.glob(f"{directory}/{name}_*.json")):
        j = json.load(open(f))
        out.append(j["outputs"][0] if "outputs" in j else j)
    return out


def main():
    directory, names = sys.argv[1], sys.argv[2].split(",")
    runs = {v: runs_of(directory, v) for v in names}
    floors = [r["floor_graph_us"] for v in names for r in runs[v]]
    print("runs", {v: len(runs[v]) for v in names}, runs[names[0]][0].get("gpu"), "floor (us)",
          [round(f, 2) for f in floors])
    rows = {}
    for v in names:
        for run in runs[v]:
            for r in run["rows"]:
                rows.setdefault((r["layer"], r["page"], r["batch"], r["context"]), {}).setdefault(v, []).append(r)
    print(f"{'config':32s} {'MB':>8s} {'read':>7s} " + " ".join(f"{v + ' us':>9s} {'%':>5s} {'sp':>3s}" for v in names))
    agg = {v: [] for v in names}
    for k, per in rows.items():
        read = min(r["read_us_graph"] for v in names for r in per[v])
        mb = per[names[0]][0]["kv_mb"]
        line = f"{k[0][:4]} ps{k[1]} b{k[2]} ctx{k[3]:<6d}".ljust(32) + f" {mb:8.2f} {read:7.2f} "
        for v in names:
            t = min(r["us_graph"] for r in per[v])
            agg[v].append((k, mb, t, read))
            line += f"{t:9.2f} {100 * read / t:5.1f} {per[v][0]['splits']:3d} "
        print(line)
    floor = min(floors)
    for v in names:
        big = [100 * rd / t for k, mb, t, rd in agg[v] if mb >= 64]
        sliding = [100 * rd / t for k, mb, t, rd in agg[v] if k[0] == "sliding" and k[2] == 256]
        small = [t / floor for k, mb, t, rd in agg[v] if mb < 4]
        print(v, f"K/V >= 64 MB: {min(big):.1f}-{max(big):.1f}% of the read (>= 90%: {sum(x >= 90 for x in big)} of "
              f"{len(big)}); sliding b256: {min(sliding):.1f}-{max(sliding):.1f}%; under 4 MB: {min(small):.1f}-"
              f"{max(small):.1f}x the floor")


if __name__ == "__main__":
    main()
