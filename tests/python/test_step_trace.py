"""tools/prof/step_trace.py reads the stamps a -DSINKATTN_STEP_TRACE build of the Hopper dK dV kernel writes
(src/cuda/hopper/step_trace.cuh: header, per-block table, [block][warp][step][point] clock64 stamps) and gives each
phase's cycles per warpgroup, which warp arrived last at each block barrier and the step's length. Checked here on a
trace written by hand with known durations."""
import importlib.util
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "prof" / "step_trace.py"
NB, NW, NS, NPT = 4, 8, 16, 10  # blocks, warps, steps, points (step_trace.cuh: kTracePoints)


def load_module():
    spec = importlib.util.spec_from_file_location("step_trace", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_trace(path, traced_blocks=2, steps=10, late_warp=0, late_by=500):
    """Every phase takes 100 + 10 * point cycles; warp `late_warp` reaches the barriers `late_by` cycles after the
    others (its loads and its dS^T phase take that much longer) and every warp leaves a barrier together."""
    blocks = [0] * (NB * 4)
    stamps = [0] * (NB * NW * NS * NPT)
    for b in range(traced_blocks):
        blocks[4 * b: 4 * b + 4] = [b, b, 1000 + b, 9000 + b]
        t_step = 10_000 * (b + 1)
        for s in range(steps):
            for w in range(NW):
                t = t_step
                for p in range(NPT):
                    if p > 0:
                        t += 100 + 10 * p
                        if w == late_warp and p in (1, 6):  # arrivals at barrier A (loaded) and B (dq buffer)
                            t += late_by
                        if w != late_warp and p in (2, 7):  # the others wait for it at the barriers
                            t += late_by
                    stamps[((b * NW + w) * NS + s) * NPT + p] = t
            t_step = t + 50  # the next step starts 50 cycles after the last point
    hdr = struct.pack("<9q", 0x53544550, 64, 128, 0, 8, NB, NW, NS, NPT)
    path.write_bytes(hdr + struct.pack(f"<{len(blocks)}Q", *blocks) + struct.pack(f"<{len(stamps)}Q", *stamps))


def test_phases_barriers_and_step_length(tmp_path):
    f = tmp_path / "dkdv_hd64_bm128_det0.bin"
    write_trace(f, late_warp=0, late_by=500)
    mod = load_module()
    out = mod.summarise(*mod.load(str(f)))
    assert out["traced_blocks"] == 2
    phases = out["phases"]
    # the phases warp 0 does not stretch: 100 + 10 * (the point it ends at), the same for both warpgroups
    assert phases["P^T, issue dV, wait dP^T"]["wg0"]["median"] == 140
    assert phases["P^T, issue dV, wait dP^T"]["wg1"]["median"] == 140
    assert phases["store next LSE2 / D"]["wg1"]["median"] == 190
    # warpgroup 1 waits at barrier A: its warps' loads land on time, warp 0's 500 cycles late
    assert phases["barrier A"]["wg1"]["median"] == 120 + 500
    assert phases["wait for the step's loads"]["wg0"]["mean"] == (110 * 3 + 610) / 4
    # warp 0 arrives last at both barriers in every judged step (steps 1 .. 8 of 10, 2 blocks)
    assert out["barrier_a_last_warp"] == [16, 0, 0, 0, 0, 0, 0, 0]
    assert out["barrier_b_last_warp"] == [16, 0, 0, 0, 0, 0, 0, 0]
    step = sum(100 + 10 * p for p in range(1, NPT)) + 2 * 500 + 50  # both barriers' waits
    assert out["step_cycles_median"] == step
    assert phases["end -> next step"]["wg0"]["median"] == 50


def test_untraced_blocks_and_the_command(tmp_path):
    f = tmp_path / "t.bin"
    write_trace(f, traced_blocks=1, late_warp=5, late_by=300)
    r = subprocess.run([sys.executable, str(SCRIPT), str(f), "--json", str(tmp_path / "t.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "1 blocks traced" in r.stdout
    assert "barrier B: last to arrive, per warp: [0, 0, 0, 0, 0, 8, 0, 0]" in r.stdout
    assert (tmp_path / "t.json").read_text().startswith("{")


def test_not_a_trace(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"\0" * 128)
    r = subprocess.run([sys.executable, str(SCRIPT), str(f)], capture_output=True, text=True)
    assert r.returncode != 0 and "not a step trace" in r.stderr
