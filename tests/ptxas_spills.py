#!/usr/bin/env python3
"""Checks the register spills of the CUDA kernels against a committed baseline (CTest: ptxas_spills).

  tests/ptxas_spills.py LOG BASELINE            fails if a kernel spills more bytes (stores or loads) than BASELINE
                                                lists for it, or spills and is not listed
  tests/ptxas_spills.py LOG BASELINE --update   rewrites BASELINE from LOG

LOG: build/ptxas.log, ptxas's report of every kernel (nvcc -Xptxas -v, written by cmake/ptxas_log.sh while the CUDA
objects compile). BASELINE: tests/ptxas_spills.txt, one line per (architecture, function) that spills:
"ARCH STORES LOADS MANGLED_NAME". Architectures the log does not hold (a build for fewer of them) are not checked;
a listed function that spills less, or was not compiled, is reported (run --update), not failed.
"""
import argparse
import re
import shutil
import subprocess
import sys

HEADER = """\
# Register spills of the CUDA kernels (bytes of spill stores / loads per function and architecture), from ptxas's
# report in build/ptxas.log. tests/ptxas_spills.py fails when a kernel spills more than listed here or a kernel not
# listed spills. After a change that removes spills (or one whose extra spills were measured worth it):
#   tests/ptxas_spills.py build/ptxas.log tests/ptxas_spills.txt --update
# ARCH STORES LOADS FUNCTION
"""


def parse_log(path):
    """{(arch, function): (stack, spill stores, spill loads)} from ptxas's -v report. Each ptxas run starts with an
    "N bytes gmem" line and compiles for one architecture ("Compiling entry function '...' for 'sm_90a'"); its
    non-entry functions may come before any entry, so a run's functions take the run's architecture at its end."""
    out, run, arch, func = {}, [], None, None

    def close():
        for f, v in run:
            out[(arch or "?", f)] = v
        run.clear()

    with open(path, errors="replace") as fh:
        for line in fh:
            if re.match(r"ptxas info\s*: \d+ bytes gmem", line):
                close()
                arch = None
                continue
            m = re.match(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\w+)'", line)
            if m:
                arch = m.group(2)
                continue
            m = re.match(r"ptxas info\s*: Function properties for (\S+)", line)
            if m:
                func = m.group(1)
                continue
            m = re.match(r"\s+(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and func:
                run.append((func, tuple(int(x) for x in m.groups())))
                func = None
    close()
    return out


def parse_baseline(path):
    base = {}
    with open(path) as fh:
        for line in fh:
            if not line.strip() or line.startswith("#"):
                continue
            arch, stores, loads, func = line.split()
            base[(arch, func)] = (int(stores), int(loads))
    return base


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    r = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = r.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log")
    ap.add_argument("baseline")
    ap.add_argument("--update", action="store_true", help="rewrite BASELINE from LOG")
    a = ap.parse_args()

    kernels = parse_log(a.log)
    if not kernels:
        sys.exit(f"{a.log}: no ptxas report found (was the CUDA backend built with cmake/ptxas_log.sh?)")
    spills = {k: (v[1], v[2]) for k, v in kernels.items() if v[1] or v[2]}
    if a.update:
        with open(a.baseline, "w") as fh:
            fh.write(HEADER)
            for (arch, func), (st, ld) in sorted(spills.items()):
                fh.write(f"{arch} {st} {ld} {func}\n")
        print(f"{a.baseline}: {len(spills)} spilling functions of {len(kernels)}")
        return 0

    base = parse_baseline(a.baseline)
    archs = {arch for arch, _ in kernels}
    names = demangle(sorted({f for _, f in set(spills) | set(base)}))
    bad, stale = [], []
    for key, (st, ld) in sorted(spills.items()):
        arch, func = key
        if key not in base:
            bad.append(f"new spill: {arch} {names[func]}: {st} bytes stores, {ld} bytes loads ({func})")
        elif st > base[key][0] or ld > base[key][1]:
            bad.append(f"spills grew: {arch} {names[func]}: stores {base[key][0]} -> {st}, loads {base[key][1]} -> "
                       f"{ld} bytes ({func})")
    for key, (st, ld) in sorted(base.items()):
        arch, func = key
        if arch not in archs:
            continue
        now = spills.get(key, (0, 0))
        if now[0] < st or now[1] < ld:
            state = "not compiled" if key not in kernels else f"now {now[0]} / {now[1]} bytes"
            stale.append(f"spills less than listed: {arch} {names[func]}: listed {st} / {ld}, {state}")
    for line in bad:
        print("FAIL " + line)
    for line in stale:
        print("note " + line)
    if stale:
        print(f"note: {len(stale)} listed functions spill less now; update the list with\n"
              f"  {sys.argv[0]} {a.log} {a.baseline} --update")
    print(f"{len(kernels)} functions ({', '.join(sorted(archs))}), {len(spills)} spill; {len(bad)} above the "
          f"baseline ({a.baseline})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
