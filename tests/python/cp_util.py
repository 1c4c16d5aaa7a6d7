"""Helpers of the context-parallel tests (test_ring.py, test_ulysses.py): random inputs with large sinks, the loss
that reads out and lse (the d_lse path), the one-device fused op, the float64 reference, SPEC.md section 5's plain
low-precision implementation, and the comparisons (fp32: sharded vs one device at the fp32 tolerances; bf16 on a
GPU: SPEC.md section 5's rule against float64), plus HLO text helpers."""

import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np

import sinkattn.jax as sj
from conftest import enable_x64, rel_err

TOL = {"out": 1e-5, "lse": 1e-5, "grad": 1e-4}  # SPEC.md section 5, fp32
# The CUDA backend runs fp16/bf16 (fp32 is the CPU backend's): on a GPU the cases run in bf16 and are judged by
# SPEC.md section 5's low-precision rule against float64 (compare_low_precision); on the CPU in fp32.
ON_GPU = jax.default_backend() == "gpu"
DT = jnp.bfloat16 if ON_GPU or os.environ.get("SINKATTN_TEST_BF16") else jnp.float32
GRAD_NAMES = ("dq", "dk", "dv", "d_sinks")


def inputs(B, T, N, K, H, seed, S=None):
    """q [B,T,N,H], k/v [B,S,K,H], sinks [N] (log(S), 20, then uniform(-1, 3)), cotangents g [B,T,N,H], g_lse."""
    S = T if S is None else S
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, N, H)).astype(np.float32)
    k = rng.standard_normal((B, S, K, H)).astype(np.float32)
    v = rng.standard_normal((B, S, K, H)).astype(np.float32)
    sinks = np.array([math.log(S), 20.0] + list(rng.uniform(-1, 3, N - 2)), np.float32)[:N]
    g = rng.standard_normal((B, T, N, H)).astype(np.float32)
    g_lse = rng.standard_normal((B, N, T)).astype(np.float32)
    rnd = lambda x: jnp.asarray(x, DT)  # inputs (and the out cotangent) in the run dtype
    return rnd(q), rnd(k), rnd(v), sinks, rnd(g), g_lse


def loss(out, lse, g, g_lse):
    # d_lse path: the loss reads the LSE too (finite rows only: vanilla rows that see no key have lse = -inf)
    return jnp.sum(out.astype(jnp.float32) * g) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0) * g_lse)


def single(q, k, v, sinks, g, g_lse, **kw):
    """The fused op on one device: out, lse, (dq, dk, dv, d_sinks)."""
    kw.setdefault("mask_alignment", "top_left")

    def f(q, k, v, s):
        out, lse = sj.dot_product_attention(q, k, v, sinks=s, return_lse=True, **kw)
        return loss(out, lse, g, g_lse), (out, lse)

    (_, (out, lse)), grads = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True))(q, k, v, sinks)
    return out, lse, grads


def float64(q, k, v, sinks, g, g_lse, **kw):
    """The pure-JAX reference of SPEC.md in float64 on the same (rounded) inputs: out, lse, grads."""
    kw.setdefault("mask_alignment", "top_left")
    with enable_x64():
        f64 = lambda x: jnp.asarray(np.asarray(x, np.float64))

        def f(q, k, v, s):
            out, lse = sj.reference.dot_product_attention(q, k, v, sinks=s, return_lse=True, **kw)
            return loss(out, lse, f64(g), f64(g_lse)), (out, lse)

        (_, (out, lse)), grads = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(
            f64(q), f64(k), f64(v), f64(sinks))
        return np.asarray(out), np.asarray(lse), [np.asarray(x) for x in grads]


def visibility(B, T, S, is_causal=False, local_window_size=None, mask_alignment="top_left", segment_ids=None,
               key_value_seq_lengths=None):
    """[B, T, S] bool: key j visible to query i (SPEC.md section 2) for the dense cases of these tests."""
    wl, wr = sj.reference.resolve_window(is_causal, local_window_size)
    if segment_ids is not None:  # self-attention runs: same run, positions from the run start, off = 0
        run, pos, _ = (np.asarray(x) for x in sj.reference._runs(jnp.asarray(segment_ids)))
        same = run[:, :, None] == run[:, None, :]
        pi, pj, off = pos[:, :, None], pos[:, None, :], 0
    else:
        lk = np.full(B, S) if key_value_seq_lengths is None else np.asarray(key_value_seq_lengths)
        same = np.broadcast_to(np.arange(S)[None, None, :] < lk[:, None, None], (B, T, S))
        pi, pj = np.arange(T)[None, :, None], np.arange(S)[None, None, :]
        off = (lk - T)[:, None, None] if mask_alignment == "bottom_right" else 0
    vis = same.copy()
    if wl >= 0:
        vis &= pj >= pi + off - wl
    if wr >= 0:
        vis &= pj <= pi + off + wr
    return vis


def plain_low_precision(q, k, v, sinks, g, g_lse, softmax_type, vis):
    """SPEC.md section 5's plain low-precision implementation: scores and softmax (with the sink) in fp32 on the
    rounded inputs, probabilities rounded to the input dtype before P V, out and gradients rounded to it.
    vis: [B, T, S] or [T, S] visibility (see visibility())."""
    B, T, N, Hd = q.shape
    K = k.shape[2]
    vis = jnp.asarray(vis)
    vis = vis[:, None] if vis.ndim == 3 else vis

    def f(q, k, v, s):
        kk, vv = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
        sc = jnp.einsum("btnh,bsnh->bnts", q, kk, preferred_element_type=jnp.float32) / math.sqrt(Hd)
        sc = jnp.where(vis, sc, -jnp.inf)
        sig = {"learnable": s, "off_by_one": jnp.zeros_like(s), "vanilla": jnp.full_like(s, -jnp.inf)}[softmax_type]
        full = jnp.concatenate([sc, jnp.broadcast_to(sig[None, :, None, None], (B, N, T, 1))], -1)
        lse = jax.nn.logsumexp(full, -1)
        lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
        p = jnp.exp(sc - lse_safe[..., None]).astype(q.dtype)
        out = jnp.einsum("bnts,bsnh->btnh", p, vv, preferred_element_type=jnp.float32).astype(q.dtype)
        return loss(out, lse, g, g_lse), (out, lse)

    with jax.default_matmul_precision("highest"):
        (_, (out, lse)), grads = jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, sinks)
    # SPEC.md section 3's d_sinks with D_i = dot(d_out_i, out_i) of the stored (rounded) out:
    # d_sinks[h] = sum_{n,i} exp(sigma_h - lse_i) (d_lse_i - D_i); the tolerance takes the larger of the two
    d_rows = jnp.einsum("btnh,btnh->bnt", g.astype(jnp.float32), out.astype(jnp.float32), precision="highest")
    d_sinks_rounded = jnp.sum(jnp.exp(sinks[None, :, None] - lse) * (g_lse - d_rows), axis=(0, 2))
    return out, lse, list(grads) + [d_sinks_rounded]


def compare_low_precision(ref64, plain, sharded, softmax_type, fp32=False):
    """SPEC.md section 5: err(sharded) <= 2 * err(plain low-precision) + 1e-3, both against float64; fp32: at most
    the fixed bounds (TOL) or 2 * err(plain fp32 evaluation) where that is larger."""
    out6, lse6, g6 = ref64
    outp, lsep, gp = plain
    out2, lse2, g2 = sharded[:3]
    pairs = {"out": (out2, outp, out6), "lse": (lse2, lsep, lse6)}
    for name, a, b, r in zip(GRAD_NAMES, g2, gp, g6):
        if name != "d_sinks" or softmax_type == "learnable":
            pairs[name] = (a, b, r)
    fixed = lambda name: TOL[name] if name in TOL else TOL["grad"]  # noqa: E731
    rule = (lambda e, name: max(fixed(name), 2 * e)) if fp32 else (lambda e, name: 2 * e + 1e-3)  # noqa: E731
    for name, (a, b, r) in pairs.items():
        tol = rule(rel_err(np.asarray(b, np.float64), r), name)
        if name == "d_sinks":  # the larger of the two plain d_sinks estimates (autodiff; D from the rounded out)
            tol = max(tol, rule(rel_err(np.asarray(gp[4], np.float64), r), name))
        e = rel_err(np.asarray(a, np.float64), r)
        assert e <= tol, f"{name}: err {e:.3e} > {tol:.3e}"


def compare(single_res, sharded, softmax_type):
    """fp32: the sharded results == the one-device ones within SPEC.md section 5's fp32 tolerances."""
    out1, lse1, g1 = single_res
    out2, lse2, g2 = sharded[:3]
    errs = {"out": rel_err(out2, out1), "lse": rel_err(lse2, lse1)}
    for name, a, b in zip(GRAD_NAMES[:3], g2[:3], g1[:3]):
        errs[name] = rel_err(a, b)
    if softmax_type == "learnable":
        errs["d_sinks"] = rel_err(g2[3], g1[3])
        assert float(np.max(np.abs(np.asarray(g1[3])))) > 0.0
    else:  # no gradient reaches the sinks
        assert np.all(np.asarray(g2[3]) == 0.0)
    for name, e in errs.items():
        tol = TOL[name] if name in TOL else TOL["grad"]
        assert e <= tol, f"{name}: err {e:.3e} > {tol:.0e} ({errs})"
    return errs


def check(q, k, v, sinks, g, g_lse, sharded, vis=None, **kw):
    """The comparison of the run dtype: fp32 against the one-device op, bf16 by SPEC.md section 5 (vis: the mask
    of the plain low-precision implementation, default from kw's is_causal / local_window_size). kw: the op's
    arguments, softmax_type included."""
    softmax_type = kw["softmax_type"]
    if DT == jnp.float32:
        return compare(single(q, k, v, sinks, g, g_lse, **kw), sharded, softmax_type)
    return check_float64(q, k, v, sinks, g, g_lse, sharded, vis, **kw)


def check_float64(q, k, v, sinks, g, g_lse, sharded, vis=None, **kw):
    """The sharded results against the pure-JAX float64 reference of SPEC.md directly, by SPEC.md section 5's rule
    (fp32: the fixed bounds or 2x the plain fp32 evaluation's error where larger; bf16: 2x the plain low-precision
    error + 1e-3)."""
    softmax_type = kw["softmax_type"]
    ref64 = float64(q, k, v, sinks, g, g_lse, **kw)
    if vis is None:
        vis = visibility(q.shape[0], q.shape[1], k.shape[1], kw.get("is_causal", False),
                         kw.get("local_window_size"))
    compare_low_precision(ref64, plain_low_precision(q, k, v, sinks, g, g_lse, softmax_type, vis), sharded,
                          softmax_type, fp32=DT == jnp.float32)


# ----------------------------------------------------------------------------------------------------------------
# HLO text
# ----------------------------------------------------------------------------------------------------------------
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")


def _instruction(line):
    """(name, shape, opcode, operand names, attributes) of one HLO instruction line, or None. The opcode is the
    first identifier followed by "(" outside the (possibly tuple) shape."""
    m = _INSTR.match(line)
    if not m:
        return None
    body, depth, op = line[m.end():], 0, None
    for i, ch in enumerate(body):
        if ch == "(" and depth == 0:
            mo = re.search(r"(?:^|[\s\]}])([a-z][\w\-]*)$", body[:i])
            if mo:
                op = (mo.start(1), i)
                break
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    if op is None:
        return None
    depth = 0
    for j in range(op[1], len(body)):
        depth += {"(": 1, ")": -1}.get(body[j], 0)
        if depth == 0:
            operands = re.findall(r"%([\w.\-]+)", body[op[1] + 1:j])
            return m.group(1), body[:op[0]].strip(), body[op[0]:op[1]], operands, body[j + 1:]
    return None


def hlo_computations(text):
    """{computation name: [(name, shape, opcode, [operand names], attributes)]} of an HLO module's text, in
    instruction (for a scheduled module: execution) order; 'ENTRY' maps to the entry computation's name."""
    comps, cur = {}, None
    for line in text.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)  # /*index=5*/ comments
        head = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and "=" not in line.split("{")[0]:
            cur = head.group(2)
            comps[cur] = []
            if head.group(1):
                comps["ENTRY"] = cur
            continue
        ins = _instruction(line) if cur is not None else None
        if ins:
            comps[cur].append(ins)
    return comps


_CALLEE_ATTR = re.compile(r"(?:to_apply|calls|branch_computations|body|condition)=\{?([^}=]*)")


def callees(ins):
    """Names of the computations one instruction calls (fusions, calls, command buffers, async wrappers)."""
    names = []
    for group in _CALLEE_ATTR.findall(ins[4]):
        names += [n for n in re.split(r"[,\s%]+", group) if n]
    return names


def runs_custom_call(comps, ins, target, seen=None):
    """Whether instruction ins is, or calls a computation containing, a custom-call whose target contains target."""
    if ins[2] == "custom-call" and f'custom_call_target="{target}' in ins[4]:
        return True
    seen = set() if seen is None else seen
    for c in callees(ins):
        if c in comps and c not in seen:
            seen.add(c)
            if any(runs_custom_call(comps, i, target, seen) for i in comps[c]):
                return True
    return False
