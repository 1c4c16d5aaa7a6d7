#!/usr/bin/env python3
"""`sinkattn info` (cli/cmd_info.cpp) as a user sees it.

  check_info.py SINKATTN tables            the tables fit 100 columns and hold every backend, kernel family and switch
                                           the library reports (--json); --verbose holds every rule in full; a switch
                                           set in the environment shows its value, an unknown SINKATTN_CUDA_*
                                           variable a warning
  check_info.py SINKATTN design DESIGN_MD  docs/DESIGN.md's switch table (between <!-- switches:begin --> and
                                           <!-- switches:end -->) is `sinkattn info --switches-markdown`'s output
Exit status 77 (CTest: skipped) for `design` when the library has no backend with switches (CUDA not compiled in).
"""
import json
import os
import re
import subprocess
import sys

WIDTH = 100


def run(cli, *args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SINKATTN_CUDA_")}
    e.update(env or {})
    r = subprocess.run([cli, "info", *args], capture_output=True, text=True, env=e)
    if r.returncode != 0:
        sys.exit(f"sinkattn info {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r.stdout


def squash(text):
    return re.sub(r"\s+", " ", text).strip()


def check(cond, what, failures):
    if not cond:
        failures.append(what)


def tables(cli):
    failures = []
    info = json.loads(run(cli, "--json"))
    backends = {b["name"]: b for b in info["backends"]}
    check(backends.get("cpu", {}).get("compiled_in") is True, "--json: the cpu backend is compiled in", failures)
    for args in ((), ("--verbose",)):
        out = run(cli, *args)
        name = "sinkattn info " + " ".join(args)
        long = [line for line in out.splitlines() if len(line) > WIDTH]
        check(not long, f"{name}: {len(long)} lines over {WIDTH} columns, the first: {long[:1]}", failures)
        check(info["version"] in out.splitlines()[0], f"{name}: the version on the first line", failures)
        flat = squash(out)
        for b in backends.values():
            check(re.search(rf"^{b['name']}\b", out, re.M) is not None, f"{name}: a row of backend {b['name']}",
                  failures)
            if not b["compiled_in"]:
                continue
            for t in b["topics"]:
                check(squash(t["text"]) in flat, f"{name}: {b['name']} topic {t['label']!r} in full", failures)
            for label in ("dtypes", "head dims"):
                check(any(t["label"] == label for t in b["topics"]), f"--json: {b['name']} has {label!r}", failures)
            check(len(b["kernel_families"]) > 0, f"--json: {b['name']} has kernel families", failures)
            for f in b["kernel_families"]:
                check(all(f[k] for k in ("name", "sources", "runs_when", "rule")),
                      f"--json: {b['name']} {f['name']}: every field", failures)
                check(f["name"] in out, f"{name}: kernel family {b['name']} {f['name']}", failures)
                check(squash(f["runs_when"]) in flat, f"{name}: when {f['name']} runs, in full", failures)
                if args:
                    check(squash(f["rule"]) in flat, f"{name}: the rule of {f['name']} in full", failures)
            for s in b["switches"]:
                check(f"{s['name']}={s['values']}" in out, f"{name}: switch {s['name']}", failures)
                check(squash(s["effect"]) in flat, f"{name}: what {s['name']} does", failures)
                if args:
                    check(squash(s["use"]) in flat, f"{name}: when to use {s['name']}", failures)
                check(s["value"] is None, f"--json: {s['name']} unset in the test's environment", failures)
    check("kernel family" in run(cli) and "runs when" in run(cli), "sinkattn info: the kernel family table's header",
          failures)

    # A switch set in the environment: its value in the table and in --json; an unknown one: a warning.
    cuda = backends.get("cuda", {})
    if cuda.get("switches"):
        s = cuda["switches"][0]
        env = {s["name"]: "1", "SINKATTN_CUDA_NO_SUCH_SWITCH": "1"}
        out = run(cli, env=env)
        row = next((line for line in out.splitlines() if line.startswith(f"{s['name']}=")), "")
        check(re.match(rf"{s['name']}=\S+\s+1\s", row) is not None, f"the row of {s['name']}=1 shows 1: {row!r}",
              failures)
        check("SINKATTN_CUDA_NO_SUCH_SWITCH is set but is not a switch" in out, "a warning for an unknown variable",
              failures)
        j = json.loads(run(cli, "--json", env=env))
        jc = next(b for b in j["backends"] if b["name"] == "cuda")
        check(jc["switches"][0]["value"] == "1", "--json: the switch's value", failures)
        check(j["unknown_switches_set"] == ["SINKATTN_CUDA_NO_SUCH_SWITCH"], "--json: unknown_switches_set", failures)
    else:
        print("(the library has no CUDA backend: the switch rows are not checked)")

    for f in failures:
        print("FAIL " + f)
    print(f"sinkattn info: {len(failures)} failures; backends {sorted(backends)}, "
          f"{sum(len(b.get('kernel_families', [])) for b in backends.values())} kernel families, "
          f"{sum(len(b.get('switches', [])) for b in backends.values())} switches")
    return 1 if failures else 0


def design(cli, design_md):
    r = subprocess.run([cli, "info", "--switches-markdown"], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr.strip())
        return 77
    text = open(design_md).read()
    m = re.search(r"<!-- switches:begin[^>]*-->\n(.*?)<!-- switches:end -->", text, re.S)
    if not m:
        print(f"FAIL {design_md}: no <!-- switches:begin --> ... <!-- switches:end --> block")
        return 1
    if m.group(1) != r.stdout:
        print(f"FAIL {design_md}'s switch table differs from `sinkattn info --switches-markdown`; replace the block "
              f"between the markers with that output.\n--- {design_md}\n{m.group(1)}--- generated\n{r.stdout}")
        return 1
    print(f"{design_md}: the switch table is the generated one ({len(r.stdout.splitlines()) - 2} switches)")
    return 0


def main():
    if len(sys.argv) >= 3 and sys.argv[2] == "tables":
        return tables(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "design":
        return design(sys.argv[1], sys.argv[3])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
