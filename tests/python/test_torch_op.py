"""sinkattn.torch (torch.ops.sinkattn.fwd / bwd) against the float64 reference of SPEC.md, plus what PyTorch's
subsystems need: opcheck of both operators, torch.compile(fullgraph=True), CUDA graph capture (GPU), errors.

The cases are test_jax_op's (same builder, same float64 pure-JAX reference, same SPEC.md section 5 error measure and
tolerances: fp32 1e-5 for out / lse and 1e-4 for gradients or 2x the plain fp32 evaluation's error where larger,
bf16 2x the plain low-precision error + 1e-3), run through
the torch API on every device present (CPU always; CUDA on a GPU machine), with NaN in never-visible inputs and in
the cotangents of padding rows, and every output buffer allocated as NaN (torch_util.poisoned_outputs)."""

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")  # without torch the package has no PyTorch operators; with it they must load

import sinkattn.torch as st  # noqa: E402
from test_jax_op import CASES, _BF16_ON_CPU, build, rel_err, run_ref_given_out, spec5_tolerances  # noqa: E402
from torch_util import DEVICES, poisoned_outputs, run_torch, to_numpy, torch_kwargs, words_to_rng  # noqa: E402

_GPU = torch.cuda.is_available()
_PARAMS = [(n, "float32", dev) for dev in DEVICES for n in CASES] + [
    (n, "bfloat16", dev) for dev in DEVICES for n in CASES if dev == "cuda" or n in _BF16_ON_CPU]


def _names(kw, inputs):
    return ["q", "k", "v"] + (["sinks"] if kw["softmax_type"] == "learnable" else []) + (
        ["bias"] if inputs["bias"] is not None else [])


def check_against_reference(kw, clean, poisoned, rows, cts, cts_op, dt, device):
    tkw = torch_kwargs(kw, device)
    names = _names(kw, clean)
    out, lse, grads = run_torch(tkw, poisoned, cts_op, device, names)
    # the float64 judge of the backward takes D_i from the out the backward was fed (SPEC.md sections 3, 5)
    r_out, r_lse, r_grads = run_ref_given_out(kw, clean, cts, to_numpy(out))
    # SPEC.md section 5 (fp32: the fixed bounds or 2x the plain fp32 evaluation's error; lower precision: 2x the plain
    # low-precision error + 1e-3)
    tol = spec5_tolerances(kw, clean, cts, dt, r_out, r_lse, r_grads, rows, names, lse is not None)
    assert out.dtype == {np.float32: torch.float32}.get(dt, torch.bfloat16) and out.device.type == device
    o = to_numpy(out)
    assert o.shape == r_out.shape
    assert rel_err(o, r_out) <= tol["out"], ("out", rel_err(o, r_out), tol["out"])
    assert np.all(o[~rows["out"]] == 0.0), "padding rows must be exactly 0"
    if lse is not None:
        assert lse.dtype == torch.float32
        l = to_numpy(lse)
        assert l.shape == r_lse.shape and not np.isnan(l).any()
        e = rel_err(l, r_lse, rows["lse"])
        assert e <= tol["lse"], ("lse", e, tol["lse"])
    for n in names:
        g = to_numpy(grads[n])
        assert g.shape == r_grads[n].shape, n
        e = rel_err(g, r_grads[n])
        assert e <= tol[n], (n, e, tol[n])
    assert np.all(to_numpy(grads["q"])[~rows["out"]] == 0.0), "padding rows get dq = 0"


@pytest.mark.parametrize("name,dtype,device", _PARAMS)
def test_against_float64_reference(name, dtype, device):
    c = dict(CASES[name])
    dt = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    c["dtype"] = dt
    kw, clean, poisoned, rows, cts, cts_op = build(c, seed=len(name))
    check_against_reference(kw, clean, poisoned, rows, cts, cts_op, dt, device)


def _qkv(device="cpu", b=2, s_q=24, s_kv=24, h_q=4, h_kv=2, d=32, dtype=torch.float32, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)
    sinks = torch.tensor([math.log(s_kv), 20.0] + [0.5] * (h_q - 2), device=device).requires_grad_(grad)
    return mk(b, s_q, h_q, d), mk(b, s_kv, h_kv, d), mk(b, s_kv, h_kv, d), sinks


# ---- the FlashAttention API: its conventions, checked against the reference through dot_product_attention ----
@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_conventions(device):
    q, k, v, sinks = _qkv(device, s_q=19, s_kv=27)
    # window_size inclusive, causal bottom-right: FA's (left, right) = SPEC's (window_left, window_right)
    for causal, window in ((True, (-1, -1)), (True, (5, -1)), (False, (3, 2)), (False, (-1, -1))):
        o1, l1 = st.flash_attn_func(q, k, v, causal=causal, window_size=window, learnable_sink=sinks, return_lse=True)
        o2, l2 = st.dot_product_attention(q, k, v, sinks=sinks, causal=causal, window_size=window, return_lse=True)
        torch.testing.assert_close(o1, o2, rtol=0, atol=0)
        torch.testing.assert_close(l1, l2, rtol=0, atol=0)
    # window = (left, right) means keys i + off - left .. i + off + right: compare with an explicit -inf bias
    off = 27 - 19
    i, j = torch.arange(19)[:, None], torch.arange(27)[None, :]
    visible = (j >= i + off - 4) & (j <= i + off)
    bias = torch.where(visible, 0.0, float("-inf")).to(device)
    o1 = st.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), learnable_sink=sinks)
    o2 = st.dot_product_attention(q, k, v, bias, sinks=sinks)
    torch.testing.assert_close(o1, o2, rtol=1e-6, atol=1e-6)
    # s_aux is an alias of learnable_sink; return_attn_probs gives (out, lse) as FlashAttention 3
    o3, l3 = st.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), s_aux=sinks, return_attn_probs=True)
    torch.testing.assert_close(o1, o3, rtol=0, atol=0)
    assert l3.shape == (2, 4, 19) and l3.dtype == torch.float32
    # no sink: vanilla softmax; default softmax_scale 1/sqrt(d)
    o4 = st.flash_attn_func(q, k, v, softmax_scale=1.0 / math.sqrt(32))
    o5 = st.dot_product_attention(q, k, v, softmax_type="vanilla")
    torch.testing.assert_close(o4, o5, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_autocast_runs_in_the_autocast_dtype(device):
    """Under torch.autocast, float32 q, k, v are cast to the autocast dtype (as autocast does for SDPA), never run on
    the float32 path: out in that dtype, bitwise the call on the cast tensors; gradients in float32 (through the cast),
    equal to the low-precision call's gradients; the sink stays float32."""
    q, k, v, sinks = _qkv(device, s_q=19, s_kv=27)
    d_out = torch.randn(2, 19, 4, 32, generator=torch.Generator().manual_seed(5)).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks)
        ref = st.flash_attn_func(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), causal=True,
                                 learnable_sink=sinks)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    g = torch.autograd.grad(out, [q, k, v, sinks], d_out.to(torch.bfloat16))
    g_ref = torch.autograd.grad(ref, [q, k, v, sinks], d_out.to(torch.bfloat16))
    assert [x.dtype for x in g] == [torch.float32] * 4
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # outside autocast nothing is cast
    assert st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks).dtype == torch.float32


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_learnable_sink_dtypes(sink_dtype):
    q, k, v, sinks = _qkv(grad=False)
    sinks = sinks.to(sink_dtype).requires_grad_(True)
    out = st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks)
    (g,) = torch.autograd.grad(out.square().sum(), [sinks])
    assert g.dtype == sink_dtype and torch.isfinite(g.float()).all()
    s32 = sinks.detach().float().requires_grad_(True)
    (g32,) = torch.autograd.grad(st.flash_attn_func(q, k, v, causal=True, learnable_sink=s32).square().sum(), [s32])
    torch.testing.assert_close(g.float(), g32.to(sink_dtype).float(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_varlen_func_matches_dense_runs(device):
    """Each sequence of a varlen call equals the dense call of that sequence alone (values and gradients)."""
    lens_q, lens_k = [5, 0, 9, 3], [7, 4, 9, 1]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q) + 2, 4, 16, generator=g).to(device).requires_grad_(True)  # 2 rows of no sequence
    k = torch.randn(sum(lens_k) + 1, 2, 16, generator=g).to(device).requires_grad_(True)
    v = torch.randn(sum(lens_k) + 1, 2, 16, generator=g).to(device).requires_grad_(True)
    sinks = torch.tensor([2.0, 20.0, -1.0, 0.3], device=device).requires_grad_(True)
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int64, device=device)  # int64 is accepted
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32, device=device)
    with poisoned_outputs():
        out, lse = st.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                             window_size=(3, 0), learnable_sink=sinks, return_lse=True)
        loss = (out * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum() + lse[:, :17].sum()
        dq, dk, dv, ds = torch.autograd.grad(loss, [q, k, v, sinks])
    assert out.shape == (19, 4, 16) and lse.shape == (4, 19)
    assert torch.all(out[17:] == 0) and torch.all(lse[:, 17:] == float("-inf"))  # SPEC.md section 1
    assert torch.all(dq[17:] == 0) and torch.all(dk[21:] == 0) and torch.all(dv[21:] == 0)
    ds_sum = torch.zeros_like(sinks)
    weights = torch.linspace(-1, 1, out.numel(), device=device).view_as(out)
    for n in range(4):
        a, b = int(cu_q[n]), int(cu_q[n + 1])
        c, e = int(cu_k[n]), int(cu_k[n + 1])
        qs, ks, vs = (x.detach()[lo:hi][None].requires_grad_(True) for x, lo, hi in ((q, a, b), (k, c, e), (v, c, e)))
        sn = sinks.detach().requires_grad_(True)
        o, l = st.flash_attn_func(qs, ks, vs, causal=True, window_size=(3, 0), learnable_sink=sn, return_lse=True)
        torch.testing.assert_close(o[0], out[a:b], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(l[0], lse[:, a:b], rtol=1e-6, atol=1e-6)
        gq, gk, gv, gs = torch.autograd.grad((o[0] * weights[a:b]).sum() + l.sum(), [qs, ks, vs, sn], allow_unused=True)
        torch.testing.assert_close(gq[0], dq[a:b], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gk[0], dk[c:e], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(gv[0], dv[c:e], rtol=1e-5, atol=1e-5)
        ds_sum += gs
    torch.testing.assert_close(ds, ds_sum, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_transposed_views_need_no_copy(device):
    """HF passes [b, h, s, d].transpose(1, 2): the op reads the strided view directly and gets the same result."""
    q, k, v, sinks = _qkv(device, grad=False)
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    torch.testing.assert_close(st.flash_attn_func(qt, kt, vt, causal=True, learnable_sink=sinks),
                               st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_mask_is_the_library_keep_function(device):
    """The mask is SPEC.md's Philox keep(seed, offset, n, h, i, j) of the returned rng_state (bit-identical on every
    backend): out equals sum_j keep_ij P_ij v_j / (1 - p) with keep from the library's sinkattn_dropout_keep."""
    import ctypes

    from sinkattn.torch import _ops

    lib = ctypes.CDLL(_ops.library_path())  # libsinkattn_torch.so links libsinkattn: its C ABI is reachable
    lib.sinkattn_dropout_keep.argtypes = [ctypes.c_uint64, ctypes.c_uint64] + [ctypes.c_int64] * 7 + [ctypes.c_double]
    lib.sinkattn_dropout_keep.restype = ctypes.c_int32
    p, b, s, h = 0.3, 1, 6, 2
    q, k, v, sinks = _qkv("cpu", b=b, s_q=s, s_kv=s, h_q=h, h_kv=h, d=8, grad=False, seed=5)
    out, lse, rng = st.dot_product_attention(q.to(device), k.to(device), v.to(device), sinks=sinks.to(device),
                                             dropout_p=p, return_lse=True, return_rng_state=True)
    seed, offset = (int(x) % 2**64 for x in rng.cpu())
    keep = torch.tensor([[[lib.sinkattn_dropout_keep(seed, offset, 0, hh, i, j, h, s, s, p) for j in range(s)]
                          for i in range(s)] for hh in range(h)], dtype=torch.float64)
    sc = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / math.sqrt(8)
    prob = torch.exp(sc - lse.cpu().double()[..., None])
    want = torch.einsum("bhij,bjhd->bihd", prob * keep / (1 - p), v.double())
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-5, atol=1e-5)
    assert 0 < keep.mean() < 1
    # the same rng_state reproduces the output bit for bit; another seed gives another mask
    again = st.dot_product_attention(q.to(device), k.to(device), v.to(device), sinks=sinks.to(device), dropout_p=p,
                                     rng_seed_offset=rng)
    assert torch.equal(out, again)
    other = st.dot_product_attention(q.to(device), k.to(device), v.to(device), sinks=sinks.to(device), dropout_p=p,
                                     generator=torch.Generator(device).manual_seed(123))
    assert not torch.equal(out, other)


@pytest.mark.skipif(not _GPU, reason="needs a GPU")
def test_dropout_cpu_and_cuda_agree():
    q, k, v, sinks = _qkv("cpu", grad=False, seed=2)
    rng = words_to_rng([11, 22, 33, 44], "cpu")
    o_cpu = st.dot_product_attention(q, k, v, sinks=sinks, causal=True, dropout_p=0.25, rng_seed_offset=rng)
    o_gpu = st.dot_product_attention(q.cuda(), k.cuda(), v.cuda(), sinks=sinks.cuda(), causal=True, dropout_p=0.25,
                                     rng_seed_offset=rng.cuda())
    # same kept entries: the zero pattern of P is invisible in out, so compare values at fp32 accuracy
    torch.testing.assert_close(o_gpu.cpu(), o_cpu, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_backward_bitwise(device):
    q, k, v, sinks = _qkv(device, h_q=8, h_kv=2, s_q=40, s_kv=40)
    grads = []
    for _ in range(3):
        out = st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks, deterministic=True)
        grads.append(torch.autograd.grad(out.square().sum(), [q, k, v, sinks]))
    for a, b in zip(grads[0], grads[1]):
        assert torch.equal(a, b)
    for a, b in zip(grads[0], grads[2]):
        assert torch.equal(a, b)


# ---- torch.library.opcheck on both operators ----
def _fwd_args(q, k, v, sinks=None, bias=None, cu=None, max_q=None, max_kv=None, softmax_type=2, causal=True,
              dropout_p=0.0, rng=None):
    cu_q, cu_k = cu if cu is not None else (None, None)
    mq = max_q if max_q is not None else q.shape[1]
    mk = max_kv if max_kv is not None else k.shape[1]
    return (q, k, v, sinks, bias, cu_q, cu_k, None, None, None, None, mq, mk, softmax_type, None, -1,
            0 if causal else -1, 0, dropout_p, rng, False, False, 0)


def _opcheck_cases(device):
    q, k, v, sinks = _qkv(device, s_q=12, s_kv=16, d=16)
    bias = torch.randn(1, 4, 12, 16, device=device, requires_grad=True)
    rng = torch.tensor([5, 7], dtype=torch.int64, device=device)
    g = torch.Generator().manual_seed(1)
    qv = torch.randn(20, 4, 16, generator=g).to(device).requires_grad_(True)
    kv = torch.randn(22, 2, 16, generator=g).to(device).requires_grad_(True)
    vv = torch.randn(22, 2, 16, generator=g).to(device).requires_grad_(True)
    cu = (torch.tensor([0, 7, 7, 18], dtype=torch.int32, device=device),
          torch.tensor([0, 9, 12, 22], dtype=torch.int32, device=device))
    return {
        "dense-learnable-causal": _fwd_args(q, k, v, sinks),
        "dense-bias-vanilla": _fwd_args(q, k, v, bias=bias, softmax_type=0, causal=False),
        "dense-dropout": _fwd_args(q, k, v, sinks, dropout_p=0.2, rng=rng),
        "varlen-learnable": _fwd_args(qv, kv, vv, sinks, cu=cu, max_q=11, max_kv=10),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["dense-learnable-causal", "dense-bias-vanilla", "dense-dropout", "varlen-learnable"])
def test_opcheck(device, case):
    args = _opcheck_cases(device)[case]
    torch.library.opcheck(torch.ops.sinkattn.fwd.default, args)
    out, lse, rng_state = torch.ops.sinkattn.fwd(*args)
    q, k, v, sinks, bias, cu_q, cu_k = args[:7]
    d_out = torch.randn_like(out)
    d_lse = torch.randn_like(lse)
    (max_q, max_kv, st_, scale, wl, wr, align, p) = args[11:19]
    assert rng_state.dtype == torch.int64 and rng_state.shape == ((2,) if p > 0 else (0,))  # [0] without dropout
    bwd_args = tuple(x.detach() if isinstance(x, torch.Tensor) else x for x in (
        d_out, q, k, v, out, lse, d_lse, sinks, bias, cu_q, cu_k, None, None, None, max_q, max_kv, st_, scale, wl, wr,
        align, p, rng_state, False, False))
    torch.library.opcheck(torch.ops.sinkattn.bwd.default, bwd_args)


def test_autograd_kernel_of_the_operator():
    """The stable ABI has no autograd: fwd's Autograd kernel is the formula of _ops.py, registered from Python (for
    callers of torch.ops.sinkattn.fwd itself), and the API takes the same formula through _ops.attention: both routes
    give the same gradients, bit for bit (deterministic backward)."""
    dump = torch._C._dispatch_dump("sinkattn::fwd")
    assert any(x.startswith("Autograd") for x in dump.splitlines()), dump
    from sinkattn.torch import _ops

    grads = []
    for fwd in (torch.ops.sinkattn.fwd.default, _ops.attention):
        q, k, v, sinks = _qkv(seed=3)
        args = list(_fwd_args(q, k, v, sinks))
        args[20] = True  # deterministic
        out, lse, _ = fwd(*args)
        g = torch.Generator().manual_seed(4)
        loss = (out * torch.randn(out.shape, generator=g)).sum() + (lse * torch.randn(lse.shape, generator=g)).sum()
        grads.append(torch.autograd.grad(loss, (q, k, v, sinks)))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    # a call that needs no gradient returns tensors without autograd history, one that does gets it
    q, k, v, sinks = _qkv(grad=False)
    out = torch.ops.sinkattn.fwd(*_fwd_args(q, k, v, sinks))[0]
    assert out.grad_fn is None and not out.requires_grad
    out = torch.ops.sinkattn.fwd(*_fwd_args(q, k, v, sinks.clone().requires_grad_(True)))[0]
    assert out.requires_grad and out.grad_fn is not None


# ---- torch.compile ----
class TinyAttention(torch.nn.Module):
    """A GPT-OSS-style attention block: projections, a learnable sink per head, sliding or full causal attention."""

    def __init__(self, dim=32, heads=4, kv_heads=2, head_dim=8, window=None):
        super().__init__()
        self.h, self.kv, self.d, self.window = heads, kv_heads, head_dim, window
        self.q = torch.nn.Linear(dim, heads * head_dim)
        self.kvp = torch.nn.Linear(dim, 2 * kv_heads * head_dim)
        self.o = torch.nn.Linear(heads * head_dim, dim)
        self.sinks = torch.nn.Parameter(torch.linspace(-1.0, 3.0, heads))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d)
        k, v = self.kvp(x).view(b, s, 2, self.kv, self.d).unbind(2)
        win = (-1, -1) if self.window is None else (self.window, 0)
        y = st.flash_attn_func(q, k, v, causal=True, window_size=win, learnable_sink=self.sinks)
        return x + self.o(y.reshape(b, s, -1))


def test_torch_compile_fullgraph_no_graph_break():
    torch.manual_seed(0)
    model = torch.nn.Sequential(TinyAttention(window=3), TinyAttention())
    x = torch.randn(2, 10, 32)
    compiled = torch.compile(model, fullgraph=True, dynamic=False)
    y_ref = model(x)
    grads_ref = torch.autograd.grad(y_ref.square().sum(), list(model.parameters()))
    y = compiled(x)  # fullgraph=True: a graph break would raise
    grads = torch.autograd.grad(y.square().sum(), list(model.parameters()))
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    for g, gr in zip(grads, grads_ref):
        torch.testing.assert_close(g, gr, rtol=1e-5, atol=1e-5)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1


def test_torch_compile_varlen_and_lse():
    q, k, v, sinks = _qkv(grad=False)
    qv, kv, vv = (x.reshape(-1, x.shape[2], x.shape[3]) for x in (q, k, v))
    cu = torch.tensor([0, 10, 24, 48], dtype=torch.int32)

    def f(q, k, v, s):
        o, l = st.flash_attn_varlen_func(q, k, v, cu, cu, 24, 24, causal=True, learnable_sink=s, return_lse=True)
        return o.sum() + l.sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(qv, kv, vv, sinks), f(qv, kv, vv, sinks), rtol=1e-6, atol=1e-6)


# ---- CUDA graphs (GPU) ----
@pytest.mark.skipif(not _GPU, reason="needs a GPU")
@pytest.mark.parametrize("varlen", [False, True])
def test_cuda_graph_capture_and_replay(varlen):
    """Forward and backward captured into one CUDA graph (no host synchronisation inside the op) replay to the
    eager result, also after the inputs are overwritten in place."""
    dev = "cuda"
    q, k, v, sinks = _qkv(dev, b=2, s_q=64, s_kv=64, h_q=8, h_kv=2, d=64, dtype=torch.bfloat16)
    sinks = sinks.detach().requires_grad_(True)
    cu = torch.tensor([0, 50, 128], dtype=torch.int32, device=dev)

    def step():
        # deterministic: the replay is compared bit for bit with eager runs (the default backward may use atomics)
        if varlen:
            qq, kk, vv = (x.reshape(-1, x.shape[2], x.shape[3]) for x in (q, k, v))
            out = st.flash_attn_varlen_func(qq, kk, vv, cu, cu, 78, 78, causal=True, window_size=(31, 0),
                                            learnable_sink=sinks, deterministic=True, trust_device_batch_tensors=True)
        else:
            out = st.flash_attn_func(q, k, v, causal=True, window_size=(31, 0), learnable_sink=sinks,
                                     deterministic=True)
        return (out,) + torch.autograd.grad(out.float().square().sum(), [q, k, v, sinks])

    # detached: an eager result that keeps its autograd graph alive keeps the leaves' AccumulateGrad nodes made on
    # the default stream, which the captured backward would then have to synchronise with (capture error)
    eager = tuple(x.detach() for x in step())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(static, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.no_grad():
        for x in (q, k, v):
            x.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    fresh = tuple(x.detach() for x in step())
    for a, b in zip(static, fresh):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(not _GPU, reason="needs a GPU")
def test_runs_on_the_current_stream():
    """Calls made under torch.cuda.stream(side) run on that stream (ordered after the side stream's earlier work,
    visible to its later work) and give the default stream's result."""
    q, k, v, sinks = _qkv("cuda", b=2, s_q=256, s_kv=256, h_q=8, h_kv=2, d=64, dtype=torch.bfloat16)
    want = st.flash_attn_func(q, k, v, causal=True, learnable_sink=sinks)
    gw = torch.autograd.grad(want.float().sum(), [q, k, v, sinks])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)  # the side stream is busy for a while, then writes q2, then the call reads it:
        q2 = q.detach().clone().requires_grad_(True)  # a call on another stream would read q2 before it is written
        got = st.flash_attn_func(q2, k, v, causal=True, learnable_sink=sinks, deterministic=True)
        gg = torch.autograd.grad(got.float().sum(), [q2, k, v, sinks])
    torch.cuda.synchronize()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(gg, gw):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


# ---- errors carry the library's message ----
def test_errors():
    q, k, v, sinks = _qkv(grad=False)
    with pytest.raises(RuntimeError, match="sinkattn: .*h_q % h_kv"):
        st.flash_attn_func(q[:, :, :3], k, v)
    with pytest.raises(RuntimeError, match="sinkattn: learnable_sink: shape"):  # the argument as the caller spelled it
        st.flash_attn_func(q, k, v, learnable_sink=sinks[:3])
    with pytest.raises(RuntimeError, match="sinkattn: .*dropout_p"):
        st.flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(RuntimeError, match="sinkattn: .*LEARNABLE requires sinks"):
        torch.ops.sinkattn.fwd(*_fwd_args(q, k, v, None))
    cu = torch.tensor([0, 30, 20, 48], dtype=torch.int32)
    qv = q.reshape(48, 4, 32)
    with pytest.raises(RuntimeError, match="sinkattn: cu_seqlens_q: must be non-decreasing"):
        st.flash_attn_varlen_func(qv, qv[:, :2], qv[:, :2], cu, cu, 30, 30)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        st.flash_attn_func(q.double(), k, v)
    with pytest.raises(ValueError, match="softcap"):
        st.flash_attn_func(q, k, v, softcap=30.0)
    with pytest.raises(ValueError, match="learnable_sink or its alias s_aux"):
        st.flash_attn_func(q, k, v, learnable_sink=sinks, s_aux=sinks)
    if _GPU:
        with pytest.raises(RuntimeError, match="sinkattn: k: must be on the device of q"):
            st.flash_attn_func(q.cuda(), k, v.cuda())


def test_kernels_hub_style_signature():
    """transformers' flash-attention wrapper inspects the varlen function's parameters to decide what it passes;
    sinkattn.torch as a kernels-hub style module gets the sink (s_aux), windows, dropout and determinism."""
    mfa = pytest.importorskip("transformers.modeling_flash_attention_utils")
    if not hasattr(mfa, "_lazy_define_process_function"):
        pytest.skip("this transformers maps flash-attention arguments differently")
    process = mfa._lazy_define_process_function(st.flash_attn_varlen_func)
    kwargs = process(query_length=8, key_length=300, is_causal=True, dropout=0.1, softmax_scale=0.125,
                     sliding_window=128, deterministic=True, s_aux=torch.zeros(4), max_seqlen_q=8, max_seqlen_k=300)
    assert kwargs["window_size"] == (127, 127) and kwargs["causal"] is True and "s_aux" in kwargs
    assert kwargs["dropout_p"] == 0.1 and kwargs["deterministic"] is True and kwargs["max_seqlen_k"] == 300
