#!/usr/bin/env python3
"""One line per kernel launch from `ncu --metrics gpu__time_duration.sum --csv` on stdin: duration, unit, kernel
name (its first 110 characters). Used by tools/prof/bwd_profile.sh and tools/prof/kernel_times.sh."""
import csv
import sys

rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
if rows:
    h = rows[0]
    kn, mv, mu = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    for r in rows[1:]:
        print(f"{r[mv]:>12s} {r[mu]:8s} {r[kn][:110]}")
