#!/usr/bin/env python3
"""Compares the SASS of the CUDA kernels in two builds (or dumps one), function by function.

  tools/sass_compare.py OLD_DIR NEW_DIR [--filter REGEX] [--show N]
  tools/sass_compare.py --dump DIR [--filter REGEX]

OLD_DIR / NEW_DIR: object files, or directories searched recursively for *.o / *.cubin (e.g. build/src/cuda/CMakeFiles/sinkattn_cuda.dir).
For every (architecture, function) it prints `same`, `DIFF` (with the number of differing instructions, and with
--show the first N differing lines), `only-old` or `only-new`, plus registers / spill bytes from `cuobjdump
-res-usage`. Instruction text is compared with addresses and encodings stripped. cuobjdump: $CUOBJDUMP, else the
one on PATH, else Triton's bundled copy in ./.venv (`pip install triton`).
"""
import argparse
import difflib
import glob
import os
import re
import shutil
import subprocess
import sys


def cuobjdump():
    c = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if c:
        return c
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    hits = glob.glob(os.path.join(here, ".venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump"))
    if hits:
        return hits[0]
    sys.exit("cuobjdump not found (set CUOBJDUMP or pip install triton into .venv)")


def objects(d):
    if os.path.isfile(d):
        return [d]
    out = []
    for root, _, files in os.walk(d):
        for f in files:
            if f.endswith(".o") or f.endswith(".cubin"):
                out.append(os.path.join(root, f))
    return sorted(out)


def anon(name):
    """Mangled names of anonymous-namespace functions carry a hash of the source path: drop it."""
    return re.sub(r"_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_[0-9a-f]{8}", r"_GLOBAL__N__\1", name)


def sass_of(path, tool):
    """{(arch, function): [instruction lines]} of one object."""
    r = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    funcs, arch, name = {}, "?", None
    for line in r.stdout.splitlines():
        m = re.match(r"\s*code for (sm_\w+)", line)
        if m:
            arch, name = m.group(1), None
            continue
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            name = anon(m.group(1))
            funcs[(arch, name)] = []
            continue
        if name is None:
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*/\* 0x[0-9a-f]+ \*/\s*$", line)
        if m:
            funcs[(arch, name)].append(m.group(1))
    return funcs


def res_of(path, tool):
    """{(arch, function): 'REG:n STACK:n ...'}"""
    r = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True)
    out, arch, name = {}, "?", None
    for line in r.stdout.splitlines():
        m = re.search(r"arch = (sm_\w+)", line)
        if m:
            arch = m.group(1)
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = anon(m.group(1))
            continue
        m = re.match(r"\s*(REG:\d+.*)", line)
        if m and name:
            out[(arch, name)] = m.group(1).strip()
            name = None
    return out


def collect(d, tool, flt):
    """The SASS of the functions whose mangled or demangled name matches the regex flt (all when empty)."""
    funcs, res = {}, {}
    for o in objects(d):
        sass = sass_of(o, tool)
        dm = demangle(sorted({k[1] for k in sass})) if flt else {}
        for k, v in sass.items():
            if flt and not (re.search(flt, k[1]) or re.search(flt, dm.get(k[1], ""))):
                continue
            funcs[k] = v
        res.update(res_of(o, tool))
    return funcs, res


def demangle(names):
    cf = shutil.which("c++filt")
    if not cf:
        return {n: n for n in names}
    r = subprocess.run([cf], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, r.stdout.splitlines()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="*")
    ap.add_argument("--dump", metavar="DIR")
    ap.add_argument("--filter", default="", metavar="REGEX",
                    help="only the functions whose mangled or demangled name matches, e.g. "
                         "'bwd_dkdv_sm90_kernel<__nv_bfloat16, 64, true'")
    ap.add_argument("--show", type=int, default=0)
    ap.add_argument("--rename", action="append", default=[], metavar="REGEX=REPL",
                    help="rewrite old (demangled) function names before matching, e.g. a template parameter added "
                         "with its default: 'kernel<(\\w+), (\\d+)>=kernel<\\1, \\2, false>'")
    ap.add_argument("--ignore-const", action="store_true",
                    help="mask constant-bank offsets c[0x0][...] (kernel parameter layout changes) before comparing")
    a = ap.parse_args()
    tool = cuobjdump()
    if a.dump:
        funcs, res = collect(a.dump, tool, a.filter)
        dm = demangle(sorted({k[1] for k in funcs}))
        for k in sorted(funcs):
            print(f"{k[0]} {len(funcs[k]):6d} instr  {res.get(k, '')}  {dm[k[1]]}")
        return 0
    if len(a.dirs) != 2:
        ap.error("two directories, or --dump DIR")
    old, rold = collect(a.dirs[0], tool, a.filter)
    new, rnew = collect(a.dirs[1], tool, a.filter)
    # Match by demangled name (after --rename on the old side).
    dm = demangle(sorted({k[1] for k in list(old) + list(new)}))
    rules = [r.split("=", 1) for r in a.rename]

    def key(k, renames):
        n = dm[k[1]]
        for pat, rep in renames:
            n = re.sub(pat, rep, n)
        return (k[0], n)

    old = {key(k, rules): v for k, v in old.items()}
    rold = {key(k, rules): v for k, v in rold.items() if k[1] in dm}
    new = {key(k, []): v for k, v in new.items()}
    rnew = {key(k, []): v for k, v in rnew.items() if k[1] in dm}
    if a.ignore_const:
        mask = lambda v: [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][*]", l) for l in v]
        old = {k: mask(v) for k, v in old.items()}
        new = {k: mask(v) for k, v in new.items()}
    keys = sorted(set(old) | set(new))
    ndiff = 0
    for k in keys:
        name = f"{k[0]} {k[1]}"
        if k not in new:
            print(f"only-old  {name}")
            ndiff += 1
            continue
        if k not in old:
            print(f"only-new  {name}  [{rnew.get(k, '')}]")
            ndiff += 1
            continue
        if old[k] == new[k]:
            print(f"same      {name}  [{rnew.get(k, '')}]")
            continue
        ndiff += 1
        d = [l for l in difflib.unified_diff(old[k], new[k], lineterm="", n=0)
             if l[:1] in "+-" and l[:3] not in ("+++", "---")]
        print(f"DIFF      {name}  {len(old[k])} -> {len(new[k])} instr, {len(d)} lines differ  "
              f"[{rold.get(k, '')}] -> [{rnew.get(k, '')}]")
        for l in d[: a.show]:
            print("          " + l)
    print(f"{len(keys)} functions, {ndiff} differ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
