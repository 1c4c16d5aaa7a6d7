"""Context parallelism with softmax sinks on torch.distributed: all-to-all ("Ulysses") and ring attention.

The sequence of q, k, v is split over the ranks of a process group (``group``, p ranks; gloo for CPU tensors, NCCL
for CUDA tensors); every rank calls the function on its own block, and the results are those of one unsharded call
(SPEC.md sections 2-3), gradients included. Process management is the caller's (torchrun, accelerate, ...).

    import sinkattn.torch.distributed as scp
    out = scp.ulysses_attention(q, k, v, group=cp, learnable_sink=sinks, causal=True)          # [b, s/p, h, d]
    zq, zk, zv = (scp.shard_sequence(x, group=cp, layout="zigzag") for x in (q_full, k_full, v_full))
    out = scp.ring_attention(zq, zk, zv, group=cp, learnable_sink=sinks, causal=True, layout="zigzag")

**All-to-all** (:func:`ulysses_attention`): one ``all_to_all_single`` turns each rank's sequence block of all heads
into the whole sequence of h/p heads (q, k and v in one message), one fused call with those heads' sinks, and the
inverse all-to-all brings out (and lse) back. Every rank sees whole sequences, so everything the op supports per
head is exact: causal and two-sided windows, both alignments, packed varlen (THD with the global ``cu_seqlens``).
Rule: h_q divisible by p; KV heads are replicated p / gcd(h_kv, p) times when p does not divide h_kv (GQA / MQA with
fewer KV heads than ranks), and the replicas' dk / dv are summed back by autograd.

**Ring** (:func:`ring_attention`): each rank keeps its queries; key / value blocks travel by ``batch_isend_irecv``
to the next rank while the current block's fused call runs (double buffer: the transfer of step t + 1 is issued
before the call of step t and waited for after it; on CUDA the transfers run on the process group's communication
stream and ``Work.wait()`` orders them into the current stream, no host synchronisation). Every piece of work is one
fused call returning its LSE; the partial (out, lse) are merged in fp32, and the sink (learnable or off_by_one) is
part of the first call that covers each query row (step 0: the rank's own block), so it is counted exactly once.
The backward calls the fused backward per piece with the MERGED out / LSE and that piece's keys, which is its exact
share of the unsharded gradient (SPEC.md section 3: dS = P (dP - D + d_lse) with P = exp(S - LSE)); d_sinks comes
from the step-0 calls. K / V travel the ring again with their dk / dv accumulators in fp32. The schedule is static
(``sinkattn._context_parallel.RingPlan``, shared with ``sinkattn.jax.ring``):

- non-causal: p steps of one call; causal, ``layout="contiguous"``: p steps, rank r computes only the blocks of
  ranks <= r; causal, ``layout="zigzag"`` (load balance: rank r holds chunks r and 2p-1-r of 2p chunks, see
  :func:`zigzag_permute` / :func:`shard_sequence`): a causal call on the local block, then two c x c calls a step;
- causal sliding window ``window_size=(w, 0)`` (either layout): only the chunk pairs the band reaches are computed,
  and only the key rows it reaches are sent, straight from the rank that holds them: GPT-OSS's sliding layer (w =
  127) costs about one local call (plus a 127-row call), not p steps (:func:`ring_schedule`).
- THD (packed varlen, ``cu_seqlens`` of the whole batch, the same on every rank): every sequence is cut in p
  (contiguous) or 2p (zigzag) equal chunks (each length divisible by that) and rank r holds its chunks of every
  sequence, slot by slot (:func:`shard_sequence` with ``cu_seqlens``). No sliding window with THD (use the
  all-to-all mode).

**d_sinks**: the sinks are a parameter replicated over the group, and each rank's backward sees only its own query
rows. With ``reduce_d_sinks=True`` (default) the functions all-reduce (sum) d_sinks over ``group`` in the backward,
so every rank's ``sinks.grad`` is the gradient of the sum of all ranks' losses, like dq / dk / dv. Pass
``reduce_d_sinks=False`` when the training framework already sums parameter gradients over the context-parallel
ranks (DDP or FSDP over a mesh that includes them, as for every other weight of the model: the HF route of
:mod:`sinkattn.torch.hf` does this), or the sink's gradient is counted p times.

Under ``torch.autocast`` q, k and v run in the autocast dtype (as in ``sinkattn.torch.dot_product_attention``).
Not supported (raise): bias, dropout, and in the ring two-sided windows, a window without causal, sliding windows
with THD. Shapes and dtypes as ``flash_attn_func`` / ``flash_attn_varlen_func`` (sinkattn.torch.attention).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from .. import _args, _context_parallel as _cp
from .._context_parallel import ring_schedule, ulysses_kv_replication, zigzag_order
from . import _ops
from .attention import _autocast, _check, _int32, dot_product_attention

__all__ = ["ulysses_attention", "ring_attention", "ring_schedule", "ulysses_kv_replication", "zigzag_order",
           "zigzag_permute", "zigzag_unpermute", "shard_sequence", "gather_sequence"]

_VANILLA = _ops.SOFTMAX_TYPES["vanilla"]
_LEARNABLE = _ops.SOFTMAX_TYPES["learnable"]
_TOP_LEFT = _ops.ALIGNMENTS["top_left"]
_FULL, _CAUSAL = (-1, -1), (-1, 0)
_TAG_KV, _TAG_DKV, _TAG_BAND = 0, 1, 2  # P2P tags (gloo matches messages by tag; NCCL orders them)


# ----------------------------------------------------------------------------------------------------------------
# process group and arguments
# ----------------------------------------------------------------------------------------------------------------
def _group_info(group):
    _check(dist.is_available() and dist.is_initialized(), "context parallelism needs an initialised torch.distributed "
           "process group (torch.distributed.init_process_group)", RuntimeError)
    group = dist.group.WORLD if group is None else group
    return group, dist.get_world_size(group), dist.get_rank(group)


def _resolve_sinks(learnable_sink, s_aux, softmax_type):
    _check(learnable_sink is None or s_aux is None, "give learnable_sink or its alias s_aux, not both")
    sinks = learnable_sink if learnable_sink is not None else s_aux
    softmax_type = _args.resolve_softmax_type(softmax_type, sinks)
    _args.check_softmax_type(softmax_type)
    if softmax_type == "learnable":
        _check(sinks is not None, "softmax_type='learnable' needs sinks [h_q] (SPEC.md section 4)")
        _check(isinstance(sinks, torch.Tensor) and sinks.is_floating_point(), "sinks must be a float tensor [h_q]",
               TypeError)
        if sinks.dtype != torch.float32:
            sinks = sinks.to(torch.float32)  # differentiable: d_sinks comes back in the sinks' own dtype
    else:
        sinks = None
    return sinks, softmax_type


def _unsupported(mode, bias, dropout_p):
    _check(bias is None, f"{mode} attention: bias is not supported (a [s, s] tensor per head has no place in "
           "context-parallel training)", NotImplementedError)
    _check(not dropout_p, f"{mode} attention: dropout is not supported", NotImplementedError)


def _peer(group, rank):
    """The global rank of group rank ``rank`` (what P2POp takes in every PyTorch release)."""
    return dist.get_global_rank(group, rank) if group is not dist.group.WORLD else rank


class _ReduceGrad(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over ``group`` (a parameter replicated over the group)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


# ----------------------------------------------------------------------------------------------------------------
# zig-zag layout and sharding helpers
# ----------------------------------------------------------------------------------------------------------------
def _chunks(x, n, dim):
    _check(x.shape[dim] % n == 0, lambda: f"zigzag: sequence length {x.shape[dim]} not divisible by {n}")
    return x.chunk(n, dim)


def zigzag_permute(x: torch.Tensor, world_size: int, dim: int = 1) -> torch.Tensor:
    """Natural sequence order -> zig-zag order along ``dim`` (the length divisible by 2 * world_size): chunks
    [0, 2p-1, 1, 2p-2, ...], so that splitting the result in p equal blocks gives rank r chunks r and 2p-1-r."""
    ch = _chunks(x, 2 * world_size, dim)
    return torch.cat([ch[c] for c in zigzag_order(world_size)], dim)


def zigzag_unpermute(x: torch.Tensor, world_size: int, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`zigzag_permute`."""
    ch = _chunks(x, 2 * world_size, dim)
    pos = {c: i for i, c in enumerate(zigzag_order(world_size))}
    return torch.cat([ch[pos[c]] for c in range(2 * world_size)], dim)


def _varlen_rows(cu_seqlens, world_size, rank, layout):
    """Row indices (host, int64) of rank's THD block in the ring's layout: every sequence cut in p (contiguous) or
    2p (zigzag) equal chunks, the rank's chunk of every sequence for slot 0, then (zigzag) for slot 1."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    n = world_size * (2 if layout == "zigzag" else 1)
    slots = [rank] + ([2 * world_size - 1 - rank] if layout == "zigzag" else [])
    rows = []
    for chunk in slots:
        for a, b in zip(cu[:-1], cu[1:]):
            _check((b - a) % n == 0, lambda: f"ring THD layout: sequence length {b - a} not divisible by {n}")
            c = (b - a) // n
            rows.append(torch.arange(a + chunk * c, a + (chunk + 1) * c))
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)


def shard_sequence(x: torch.Tensor, group=None, dim: int = 1, layout: str = "contiguous",
                   cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """This rank's block of a global tensor (the same on every rank) along the sequence dimension ``dim``:
    ``layout="contiguous"``: rows [r s/p, (r+1) s/p); ``"zigzag"``: chunks r and 2p-1-r of 2p (the ring's
    load-balanced causal layout; for input_ids, position_ids, labels, activations alike).

    With ``cu_seqlens`` (THD, ``dim`` is the packed row dimension): the ring's THD layout, every sequence cut in p
    (contiguous) or 2p (zigzag) equal chunks and this rank's chunk of each sequence, slot by slot (reads cu_seqlens
    on the host: a data-preparation helper)."""
    group, p, r = _group_info(group)
    _check(layout in ("contiguous", "zigzag"), lambda: f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    if cu_seqlens is not None:
        return x.index_select(dim, _varlen_rows(cu_seqlens, p, r, layout).to(x.device))
    if layout == "zigzag":
        ch = _chunks(x, 2 * p, dim)
        return torch.cat([ch[r], ch[2 * p - 1 - r]], dim)
    return _chunks(x, p, dim)[r]


def gather_sequence(x: torch.Tensor, group=None, dim: int = 1, layout: str = "contiguous",
                    cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Inverse of :func:`shard_sequence`: the global tensor from every rank's block (all_gather; not
    differentiable: for evaluation and tests). The blocks must have equal sizes."""
    group, p, r = _group_info(group)
    parts = [torch.empty_like(x) for _ in range(p)]
    dist.all_gather(parts, x.contiguous(), group=group)
    full = torch.cat(parts, dim)
    if cu_seqlens is not None:
        idx = torch.cat([_varlen_rows(cu_seqlens, p, s, layout) for s in range(p)]).to(x.device)
        return torch.empty_like(full).index_copy_(dim, idx, full)
    return zigzag_unpermute(full, p, dim) if layout == "zigzag" else full


# ----------------------------------------------------------------------------------------------------------------
# all-to-all (Ulysses)
# ----------------------------------------------------------------------------------------------------------------
def _a2a(send, group):
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def _to_heads(xs, specs, group, p, zigzag):
    """Sequence blocks of all heads -> the whole sequence of this rank's heads, for tensors of one dtype in ONE
    all-to-all. specs[i] = (sequence dim, head dim) of xs[i]; heads split in p groups (group j to rank j)."""
    parts, shapes = [], []
    for x, (sd, hd) in zip(xs, specs):
        y = x.unflatten(hd, (p, x.shape[hd] // p)).movedim(hd, 0)  # [p, ..., h/p at hd, ...]
        shapes.append(y.shape[1:])
        parts.append(y.reshape(p, -1))
    recv = _a2a(torch.cat(parts, 1) if len(parts) > 1 else parts[0].contiguous(), group)
    out, off = [], 0
    for shape, (sd, hd) in zip(shapes, specs):
        n = math.prod(shape)
        y = recv[:, off:off + n].reshape(p, *shape)  # dim 0: the source rank = the sequence block
        off += n
        y = y.movedim(0, sd).flatten(sd, sd + 1)
        out.append(zigzag_unpermute(y, p, sd) if zigzag else y)
    return out


def _to_rows(xs, specs, group, p, zigzag):
    """Inverse of _to_heads: the whole sequence of this rank's heads -> this rank's sequence block of all heads."""
    parts, shapes = [], []
    for x, (sd, hd) in zip(xs, specs):
        if zigzag:
            x = zigzag_permute(x, p, sd)
        y = x.unflatten(sd, (p, x.shape[sd] // p)).movedim(sd, 0)
        shapes.append(y.shape[1:])
        parts.append(y.reshape(p, -1))
    recv = _a2a(torch.cat(parts, 1) if len(parts) > 1 else parts[0].contiguous(), group)
    out, off = [], 0
    for shape, (sd, hd) in zip(shapes, specs):
        n = math.prod(shape)
        y = recv[:, off:off + n].reshape(p, *shape)  # dim 0: the source rank = the head group
        off += n
        out.append(y.movedim(0, hd).flatten(hd, hd + 1))
    return out


class _AllToAll(torch.autograd.Function):
    """_to_heads (forward="heads") or _to_rows (forward="rows") of tensors of one dtype; the backward is the other."""

    @staticmethod
    def forward(ctx, direction, specs, group, p, zigzag, *xs):
        ctx.args = (direction, specs, group, p, zigzag)
        fn = _to_heads if direction == "heads" else _to_rows
        return tuple(fn(list(xs), specs, group, p, zigzag))

    @staticmethod
    def backward(ctx, *gs):
        direction, specs, group, p, zigzag = ctx.args
        fn = _to_rows if direction == "heads" else _to_heads
        return (None,) * 5 + tuple(fn(list(gs), specs, group, p, zigzag))


def _all_to_all(direction, xs, specs, group, p, zigzag):
    """One differentiable all-to-all per dtype among xs."""
    res = [None] * len(xs)
    by_dtype = {}
    for i, x in enumerate(xs):
        by_dtype.setdefault(x.dtype, []).append(i)
    for idx in by_dtype.values():
        got = _AllToAll.apply(direction, [specs[i] for i in idx], group, p, zigzag, *[xs[i] for i in idx])
        for i, y in zip(idx, got):
            res[i] = y
    return res


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    learnable_sink: Optional[torch.Tensor] = None,
    s_aux: Optional[torch.Tensor] = None,
    softmax_type: Optional[str] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Optional[Sequence[Optional[int]]] = (-1, -1),
    mask_alignment: str = "bottom_right",
    layout: str = "contiguous",
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    reduce_d_sinks: bool = True,
    trust_device_batch_tensors: bool = False,
    bias: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
):
    """All-to-all context-parallel attention of this rank's sequence block (module docstring).

    Shapes: dense ``q [b, s_q/p, h_q, d]``, ``k / v [b, s_kv/p, h_kv, d | d_v]`` (this rank's block, in ``layout``
    order: ``"contiguous"`` or ``"zigzag"``, the ring's, undone and redone locally around the call); or THD
    ``q [total_q/p, h_q, d]``, ``k / v [total_kv/p, h_kv, d | d_v]`` (rank r holds rows [r total/p, (r+1) total/p)
    of the packed buffers) with ``cu_seqlens_q`` / ``cu_seqlens_kv`` int ``[num_seqs + 1]`` of the WHOLE buffers
    (the same on every rank) and ``max_seqlen_q`` / ``max_seqlen_kv``. ``h_q`` must be divisible by p; sinks
    ``[h_q]`` (``learnable_sink`` or its alias ``s_aux``; float32 / bf16 / fp16), the same on every rank.
    The mask, scale, softmax type, alignment, ``deterministic`` and ``trust_device_batch_tensors`` are those of
    ``sinkattn.torch.dot_product_attention`` applied to the whole sequence.

    Returns ``out`` like q with ``d_v`` (this rank's block), or ``(out, lse)`` with ``return_lse`` (float32
    ``[b, h_q, s_q/p]`` or ``[h_q, total_q/p]``, including the sink, differentiable). Differentiable w.r.t. q, k, v
    and the sinks (d_sinks summed over ``group`` unless ``reduce_d_sinks=False``, module docstring).

    Raises ValueError for head counts the rule excludes or lengths not divisible by p (2p for zigzag),
    NotImplementedError for bias and dropout.
    """
    _unsupported("ulysses", bias, dropout_p)
    group, p, r = _group_info(group)
    sinks, softmax_type = _resolve_sinks(learnable_sink, s_aux, softmax_type)
    _check(layout in ("contiguous", "zigzag"), lambda: f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    varlen = cu_seqlens_q is not None or cu_seqlens_kv is not None
    if varlen:
        _check(cu_seqlens_q is not None and cu_seqlens_kv is not None,
               "cu_seqlens_q and cu_seqlens_kv must be given together")
        _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "THD q, k, v must be [total/p, h, d]")
        _check(layout == "contiguous", "ulysses attention: the zig-zag layout is for dense [b, s, h, d] inputs")
        seq_ax, head_ax = 0, 1
    else:
        _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "q, k, v must be [b, s/p, h, d] (or THD with "
               "cu_seqlens_q / cu_seqlens_kv)")
        seq_ax, head_ax = 1, 2
    if layout == "zigzag":
        _check(q.shape[1] % 2 == 0 and k.shape[1] % 2 == 0, "zig-zag layout needs even local block lengths")
    n_q, n_kv = q.shape[head_ax], k.shape[head_ax]
    try:
        rep = ulysses_kv_replication(n_q, n_kv, p)
    except ValueError as e:
        raise ValueError(f"sinkattn: {e}") from None
    q, k, v = _autocast(q, k, v)  # under torch.autocast: the autocast dtype before the all-to-all (half the bytes)
    if rep > 1:  # autograd sums the replicas' dk / dv back into each KV head
        k = k.repeat_interleave(rep, dim=head_ax)
        v = v.repeat_interleave(rep, dim=head_ax)
    zz = layout == "zigzag"
    spec = (seq_ax, head_ax)
    qh, kh, vh = _all_to_all("heads", [q, k, v], [spec] * 3, group, p, zz)
    local_sinks = None
    if sinks is not None:
        if reduce_d_sinks:
            sinks = _ReduceGrad.apply(sinks, group)
        n_loc = n_q // p
        local_sinks = sinks[r * n_loc:(r + 1) * n_loc]
    kw = {}
    if varlen:
        kw = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                  max_seqlen_kv=max_seqlen_kv, trust_device_batch_tensors=trust_device_batch_tensors)
    res = dot_product_attention(qh, kh, vh, sinks=local_sinks, softmax_type=softmax_type, softmax_scale=softmax_scale,
                                causal=causal, window_size=window_size, mask_alignment=mask_alignment,
                                deterministic=deterministic, return_lse=return_lse, **kw)
    if not return_lse:
        return _all_to_all("rows", [res], [spec], group, p, zz)[0]
    out, lse = res
    lse_spec = (1, 0) if varlen else (2, 1)
    out, lse = _all_to_all("rows", [out, lse], [spec, lse_spec], group, p, zz)
    return out, lse


# ----------------------------------------------------------------------------------------------------------------
# ring: one call's static context
# ----------------------------------------------------------------------------------------------------------------
class _RingCall:
    """What every step of one ring call needs: the group and peers, the static plan, the slots of the local block
    (rows, for dense dim 1 / lse dim 2, THD dim 0 / lse dim 1), and the fused calls' options."""

    def __init__(self, *, group, p, r, plan, varlen, slots, rows, softmax_type, scale, deterministic, reduce_d_sinks,
                 cu=None, max_seqlen=None):
        self.group, self.p, self.r, self.plan = group, p, r, plan
        self.next, self.prev = _peer(group, (r + 1) % p), _peer(group, (r - 1) % p)
        self.varlen, self.slots, self.rows = varlen, slots, rows
        self.od, self.ld = (0, 1) if varlen else (1, 2)  # the row dims of out-like tensors and of lse
        self.softmax_type, self.scale, self.deterministic = softmax_type, scale, deterministic
        self.reduce_d_sinks = reduce_d_sinks
        self.cu, self.max_seqlen = cu, max_seqlen  # THD: the cu_seqlens of one slot (one chunk per sequence)
        self.sinks = None  # the fp32 sinks [h_q] of a learnable call, set by _Ring

    def sel(self, x, slot, lse=False, n=None):
        """The rows of a slot (None: every row) of an out-like tensor (or of an lse), optionally the first n."""
        dim = self.ld if lse else self.od
        if slot is None:
            return x if n is None else x.narrow(dim, 0, n)
        return x.narrow(dim, slot * self.rows, self.rows if n is None else n)

    def weight(self, w):
        """lse-shaped weights -> broadcastable against out."""
        return w.transpose(self.ld - 1, self.ld).unsqueeze(-1)

    def _args(self, q, k, sink):
        """(softmax_type, sinks, varlen batch tensors, max lengths) of one fused call; ``sink``: the call carries the
        sink (learnable or off_by_one), else it is vanilla."""
        st, s = _VANILLA, None
        if sink and self.softmax_type != _VANILLA:
            st = self.softmax_type
            s = self.sinks if st == _LEARNABLE else None
        if self.varlen:
            return st, s, self.cu, self.max_seqlen, self.max_seqlen
        return st, s, None, q.shape[1], k.shape[1]

    def fwd(self, q, k, v, window, sink):
        """(out in q's dtype, lse fp32) of one fused call (top-left aligned, no dropout)."""
        st, s, cu, mq, mk = self._args(q, k, sink)
        with torch._C._AutoDispatchBelowAutograd():
            out, lse, _ = torch.ops.sinkattn.fwd.default(
                q, k, v, s, None, cu, cu, None, None, None, None, mq, mk, st, self.scale, window[0], window[1],
                _TOP_LEFT, 0.0, None, self.deterministic, True, 0)
        return out, lse

    def bwd(self, d_out, q, k, v, out, lse, d_lse, window, sink):
        """(dq, dk, dv, d_sinks or None) of one fused backward given the MERGED out / lse (and their gradients)."""
        st, s, cu, mq, mk = self._args(q, k, sink)
        with torch._C._AutoDispatchBelowAutograd():
            dq, dk, dv, ds, _ = torch.ops.sinkattn.bwd.default(
                d_out, q, k, v, out, lse, d_lse, s, None, cu, cu, None, None, None, mq, mk, st, self.scale,
                window[0], window[1], _TOP_LEFT, 0.0, None, self.deterministic, True)
        return dq, dk, dv, (ds if s is not None else None)

    def exchange(self, items):
        """Issues [(tag, tensor sent to peer, tensor received from peer, send peer, recv peer)] as one batch of
        point-to-point ops; returns the works (wait() before reading what was received)."""
        ops = []
        for tag, send, recv, to, frm in items:
            if send is not None:
                ops.append(dist.P2POp(dist.isend, send, to, self.group, tag))
            if recv is not None:
                ops.append(dist.P2POp(dist.irecv, recv, frm, self.group, tag))
        return dist.batch_isend_irecv(ops) if ops else []


def _wait(works):
    for w in works:
        w.wait()


def _pack(k, v, dtype=None):
    """k and v in one contiguous buffer (one message)."""
    dtype = k.dtype if dtype is None else dtype
    return torch.cat([k.reshape(-1).to(dtype), v.reshape(-1).to(dtype)])


def _unpack(buf, k_shape, v_shape):
    nk = math.prod(k_shape)
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def _merge_(cx, acc_out, acc_lse, out, lse):
    """acc = merge(acc, (out, lse)) in place, fp32, -inf safe: lse' = logaddexp(acc_lse, lse),
    out' = exp(acc_lse - lse') acc_out + exp(lse - lse') out."""
    new = torch.logaddexp(acc_lse, lse)
    fin = torch.isfinite(new)
    safe = torch.where(fin, new, 0.0)
    wa = torch.where(fin, torch.exp(acc_lse - safe), 0.0)
    wb = torch.where(fin, torch.exp(lse - safe), 0.0)
    acc_out.mul_(cx.weight(wa)).add_(out * cx.weight(wb))
    acc_lse.copy_(new)


class _Acc:
    """The fp32 merged (out, lse) of the local query rows; the first piece that covers a slot is copied in."""

    def __init__(self, cx, q, v):
        self.cx = cx
        self.out = q.new_empty(q.shape[:-1] + (v.shape[-1],), dtype=torch.float32)
        lse_shape = (q.shape[1], q.shape[0]) if cx.varlen else (q.shape[0], q.shape[2], q.shape[1])
        self.lse = q.new_empty(lse_shape, dtype=torch.float32)
        self.seen = set()

    def add(self, slot, out, lse, n=None):
        cx = self.cx
        slots = set(range(cx.slots)) if slot is None else {slot}
        o, l = cx.sel(self.out, slot, n=n), cx.sel(self.lse, slot, lse=True, n=n)
        if slots <= self.seen:
            _merge_(cx, o, l, out, lse)
        else:
            assert not slots & self.seen and n is None, "a schedule's first piece of a slot covers all its rows"
            o.copy_(out)
            l.copy_(lse)
            self.seen |= slots


# ----------------------------------------------------------------------------------------------------------------
# ring: full / causal / zig-zag (p steps)
# ----------------------------------------------------------------------------------------------------------------
def _chain_calls(cx, t):
    """[(query slot, key slot, window, sink)] of step t (slot None: the whole block; the key block is the one that
    started on rank r - t). sink: this call carries the sink (step 0, once per query row)."""
    two = cx.slots == 2
    if cx.plan.mode == "full":
        if not two:
            return [(None, None, _FULL, t == 0)]
        return [(a, b, _FULL, t == 0 and a == b) for a in (0, 1) for b in (0, 1)]
    if t == 0:
        if two and cx.varlen:  # THD: the two chunks of every sequence are not adjacent rows
            return [(0, 0, _CAUSAL, True), (1, 1, _CAUSAL, True), (1, 0, _FULL, False)]
        return [(None, None, _CAUSAL, True)]  # zig-zag: chunk r precedes chunk 2p-1-r, one causal call
    earlier = cx.r >= t  # the visiting block left an earlier rank
    if cx.plan.mode == "causal":
        return [(None, None, _FULL, False)] if earlier else []
    # zig-zag: the local second chunk sees the visiting first chunk; the local first chunk sees the visiting first
    # chunk (earlier) or the local second chunk the visiting second chunk (later)
    return [(1, 0, _FULL, False), (0, 0, _FULL, False) if earlier else (1, 1, _FULL, False)]


def _chain_forward(cx, q, k, v):
    acc = _Acc(cx, q, v)
    p = cx.p
    bufs = [_pack(k, v), None]
    if p > 1:
        bufs[1] = torch.empty_like(bufs[0])
    for t in range(p):
        cur = bufs[t % 2]
        works = cx.exchange([(_TAG_KV, cur, bufs[(t + 1) % 2], cx.next, cx.prev)]) if t + 1 < p else []
        kt, vt = (k, v) if t == 0 else _unpack(cur, k.shape, v.shape)
        for qs, ks, win, sink in _chain_calls(cx, t):
            o, l = cx.fwd(cx.sel(q, qs), cx.sel(kt, ks), cx.sel(vt, ks), win, sink)
            acc.add(qs, o, l)
        _wait(works)
    return acc.out, acc.lse


def _chain_backward(cx, q, k, v, out, lse, d_out, d_lse):
    p = cx.p
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    d_sinks = None
    bufs = [_pack(k, v), None]
    if p > 1:
        bufs[1] = torch.empty_like(bufs[0])
    acc = None  # the fp32 dk / dv accumulator of the block held in the previous step, travelling with it
    for t in range(p):
        cur = bufs[t % 2]
        items = []
        if t + 1 < p:
            items.append((_TAG_KV, cur, bufs[(t + 1) % 2], cx.next, cx.prev))
        arriving = None
        if acc is not None:  # the accumulator of the block now held arrives from rank r - 1
            arriving = torch.empty_like(acc)
            items.append((_TAG_DKV, acc, arriving, cx.next, cx.prev))
        works = cx.exchange(items)
        kt, vt = (k, v) if t == 0 else _unpack(cur, k.shape, v.shape)
        dkv = torch.zeros(bufs[0].shape, dtype=torch.float32, device=q.device)
        dk_t, dv_t = _unpack(dkv, k.shape, v.shape)
        for qs, ks, win, sink in _chain_calls(cx, t):
            dq_c, dk_c, dv_c, ds_c = cx.bwd(cx.sel(d_out, qs), cx.sel(q, qs), cx.sel(kt, ks), cx.sel(vt, ks),
                                            cx.sel(out, qs), cx.sel(lse, qs, lse=True),
                                            None if d_lse is None else cx.sel(d_lse, qs, lse=True), win, sink)
            cx.sel(dq, qs).add_(dq_c)
            cx.sel(dk_t, ks).add_(dk_c)
            cx.sel(dv_t, ks).add_(dv_c)
            if ds_c is not None:
                d_sinks = ds_c if d_sinks is None else d_sinks + ds_c
        _wait(works)
        if arriving is not None:
            dkv.add_(arriving)
        acc = dkv
    if p > 1:  # after p - 1 hops the accumulator is one rank short of home
        home = torch.empty_like(acc)
        _wait(cx.exchange([(_TAG_DKV, acc, home, cx.next, cx.prev)]))
        acc = home
    dk, dv = _unpack(acc, k.shape, v.shape)
    return dq, dk, dv, d_sinks


# ----------------------------------------------------------------------------------------------------------------
# ring: causal sliding window (the band pieces)
# ----------------------------------------------------------------------------------------------------------------
def _tail(cx, x, slot, e):
    """Key rows [e, c) of a local slot (dense)."""
    c = cx.rows
    return x.narrow(1, slot * c + e, c - e)


def _band_forward(cx, q, k, v):
    plan, r, W = cx.plan, cx.r, cx.plan.window_left
    tail_shape = lambda x, e: (x.shape[0], cx.rows - e) + tuple(x.shape[2:])
    items, fetched = [], []
    for i, pc in enumerate(plan.pieces):
        for dst, s in pc.destinations(r):
            items.append((_TAG_BAND + i, _pack(_tail(cx, k, s, pc.e), _tail(cx, v, s, pc.e)), None,
                          _peer(cx.group, dst), None))
        src = pc.source(r)
        if src is None:
            fetched.append(None)
        elif src[0] == r:
            fetched.append(("local", src[1]))
        else:
            n = math.prod(tail_shape(k, pc.e)) + math.prod(tail_shape(v, pc.e))
            buf = k.new_empty(n)
            items.append((_TAG_BAND + i, None, buf, None, _peer(cx.group, src[0])))
            fetched.append(buf)
    works = cx.exchange(items)  # every transfer first: they run while the local chunks compute
    acc = _Acc(cx, q, v)
    for u in range(cx.slots):
        o, l = cx.fwd(cx.sel(q, u), cx.sel(k, u), cx.sel(v, u), (W, 0), True)
        acc.add(u, o, l)
    _wait(works)
    keys = []
    for pc, f in zip(plan.pieces, fetched):
        kv = _band_keys(cx, pc, f, k, v)
        keys.append(kv)
        if kv is None:
            continue
        win = (-1 if pc.window_left is None else pc.window_left, -1)
        o, l = cx.fwd(cx.sel(q, pc.u, n=pc.rows), kv[0], kv[1], win, False)
        acc.add(pc.u, o, l, n=pc.rows)
    saved = [f for f in fetched if isinstance(f, torch.Tensor)]
    return acc.out, acc.lse, saved


def _band_keys(cx, pc, f, k, v):
    if f is None:
        return None
    if isinstance(f, tuple):  # this rank's other slot
        return _tail(cx, k, f[1], pc.e), _tail(cx, v, f[1], pc.e)
    ks = (k.shape[0], cx.rows - pc.e) + tuple(k.shape[2:])
    vs = (v.shape[0], cx.rows - pc.e) + tuple(v.shape[2:])
    return _unpack(f, ks, vs)


def _band_backward(cx, q, k, v, out, lse, d_out, d_lse, saved):
    plan, r, W = cx.plan, cx.r, cx.plan.window_left
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    saved = list(saved)
    sel_lse = lambda x, u, n: None if x is None else cx.sel(x, u, lse=True, n=n)
    items, incoming = [], []
    # the band pieces first: their dk / dv go straight back to the rank (and slot) the keys came from, in fp32,
    # while the local chunks' backward runs
    for i, pc in enumerate(plan.pieces):
        src = pc.source(r)
        if src is not None:
            f = ("local", src[1]) if src[0] == r else saved.pop(0)
            kb, vb = _band_keys(cx, pc, f, k, v)
            u, n = pc.u, pc.rows
            win = (-1 if pc.window_left is None else pc.window_left, -1)
            dqp, dkp, dvp, _ = cx.bwd(cx.sel(d_out, u, n=n), cx.sel(q, u, n=n), kb, vb, cx.sel(out, u, n=n),
                                      sel_lse(lse, u, n), sel_lse(d_lse, u, n), win, False)
            cx.sel(dq, u, n=n).add_(dqp)
            if src[0] == r:
                _tail(cx, dk, src[1], pc.e).add_(dkp)
                _tail(cx, dv, src[1], pc.e).add_(dvp)
            else:
                items.append((_TAG_BAND + i, _pack(dkp, dvp, torch.float32), None, _peer(cx.group, src[0]), None))
        for dst, s in pc.destinations(r):
            n = math.prod(_tail(cx, k, s, pc.e).shape) + math.prod(_tail(cx, v, s, pc.e).shape)
            buf = torch.empty(n, dtype=torch.float32, device=q.device)
            items.append((_TAG_BAND + i, None, buf, None, _peer(cx.group, dst)))
            incoming.append((buf, s, pc.e))
    works = cx.exchange(items)
    d_sinks = None
    for u in range(cx.slots):
        dq_u, dk_u, dv_u, ds_u = cx.bwd(cx.sel(d_out, u), cx.sel(q, u), cx.sel(k, u), cx.sel(v, u), cx.sel(out, u),
                                        sel_lse(lse, u, None), sel_lse(d_lse, u, None), (W, 0), True)
        cx.sel(dq, u).add_(dq_u)
        cx.sel(dk, u).add_(dk_u)
        cx.sel(dv, u).add_(dv_u)
        if ds_u is not None:
            d_sinks = ds_u if d_sinks is None else d_sinks + ds_u
    _wait(works)
    for buf, s, e in incoming:
        tk, tv = _tail(cx, dk, s, e), _tail(cx, dv, s, e)
        gk, gv = _unpack(buf, tk.shape, tv.shape)
        tk.add_(gk)
        tv.add_(gv)
    return dq, dk, dv, d_sinks


# ----------------------------------------------------------------------------------------------------------------
# ring: autograd
# ----------------------------------------------------------------------------------------------------------------
class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, cx):
        ctx.set_materialize_grads(False)
        cx.sinks = sinks
        if cx.plan.mode == "band":
            out, lse, saved = _band_forward(cx, q, k, v)
        else:
            (out, lse), saved = _chain_forward(cx, q, k, v), []
        cx.sinks = None  # the saved tensors hold it for the backward
        out = out.to(q.dtype)  # the backward reads the stored, rounded out (SPEC.md section 3)
        ctx.cx = cx
        ctx.has_sinks = sinks is not None
        ctx.save_for_backward(q, k, v, sinks, out, lse, *saved)
        return out, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, sinks, out, lse, *saved = ctx.saved_tensors
        cx = ctx.cx
        d_out = torch.zeros_like(out) if d_out is None else d_out.to(out.dtype)
        if d_out.stride(-1) != 1:
            d_out = d_out.contiguous()
        if d_lse is not None:
            d_lse = d_lse.to(torch.float32)
            if d_lse.stride(-1) != 1:
                d_lse = d_lse.contiguous()
        cx.sinks = sinks
        if cx.plan.mode == "band":
            dq, dk, dv, d_sinks = _band_backward(cx, q, k, v, out, lse, d_out, d_lse, saved)
        else:
            dq, dk, dv, d_sinks = _chain_backward(cx, q, k, v, out, lse, d_out, d_lse)
        cx.sinks = None
        if ctx.has_sinks:
            if d_sinks is None:
                d_sinks = torch.zeros_like(sinks)
            if cx.reduce_d_sinks:
                dist.all_reduce(d_sinks, group=cx.group)
        else:
            d_sinks = None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), d_sinks, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    learnable_sink: Optional[torch.Tensor] = None,
    s_aux: Optional[torch.Tensor] = None,
    softmax_type: Optional[str] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Optional[Sequence[Optional[int]]] = (-1, -1),
    layout: str = "contiguous",
    cu_seqlens: Optional[torch.Tensor] = None,
    max_seqlen: Optional[int] = None,
    deterministic: bool = False,
    return_lse: bool = False,
    reduce_d_sinks: bool = True,
    trust_device_batch_tensors: bool = False,
    bias: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
):
    """Ring context-parallel self-attention of this rank's sequence block (module docstring).

    Shapes: dense ``q [b, s/p, h_q, d]``, ``k / v [b, s/p, h_kv, d | d_v]`` (this rank's block in ``layout``
    order: ``"contiguous"`` = rows [r s/p, (r+1) s/p), ``"zigzag"`` = chunks r and 2p-1-r of 2p, see
    :func:`shard_sequence`); or THD ``[total/p, h, d]`` with ``cu_seqlens`` int ``[num_seqs + 1]`` of the whole
    packed batch (the same on every rank; every sequence length divisible by p, 2p for zigzag) and ``max_seqlen``
    (of the whole sequences), the rows in the ring's THD layout (:func:`shard_sequence` with ``cu_seqlens``). Every
    rank's block has the same length. ``causal`` is self-attention (queries and keys at the same positions);
    ``window_size=(w, 0)`` with causal is a sliding window (GPT-OSS: ``(127, 0)``); sinks ``[h_q]``
    (``learnable_sink`` / ``s_aux``; float32 / bf16 / fp16), the same on every rank.

    Returns ``out`` like q with ``d_v``, or ``(out, lse)`` with ``return_lse`` (float32 ``[b, h_q, s/p]`` or
    ``[h_q, total/p]``, including the sink, differentiable). Differentiable w.r.t. q, k, v and the sinks (d_sinks
    summed over ``group`` unless ``reduce_d_sinks=False``, module docstring). With ``trust_device_batch_tensors``
    a THD call does not check ``cu_seqlens`` (the check reads it back to the host).

    Raises NotImplementedError for bias, dropout, two-sided windows, windows without causal and THD windows;
    ValueError for blocks of unequal lengths or lengths the layout cannot split.
    """
    _unsupported("ring", bias, dropout_p)
    group, p, r = _group_info(group)
    sinks, softmax_type = _resolve_sinks(learnable_sink, s_aux, softmax_type)
    varlen = cu_seqlens is not None
    if varlen:
        _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "THD q, k, v must be [total/p, h, d]")
        t_loc, s_loc = q.shape[0], k.shape[0]
    else:
        _check(q.dim() == 4 and k.dim() == 4 and v.dim() == 4, "q, k, v must be [b, s/p, h, d] (or THD with "
               "cu_seqlens)")
        t_loc, s_loc = q.shape[1], k.shape[1]
    wl, wr = _args.window_size_bounds(causal, window_size)
    window = None if wl < 0 and wr < 0 else (wl, wr)
    try:
        is_causal, window_left, layout = _cp.resolve_ring_masks(bool(causal), window, layout, t_loc)
    except NotImplementedError as e:
        raise NotImplementedError(f"sinkattn: {e}") from None
    except ValueError as e:
        raise ValueError(f"sinkattn: {e}") from None
    _check(t_loc == s_loc, lambda: f"ring attention is self-attention: the local query and key blocks must have "
           f"the same length, got {t_loc} and {s_loc}")
    scale = _args.softmax_scale(softmax_scale, q.shape[-1])
    plan = _cp.RingPlan(p=p, t_loc=t_loc, is_causal=is_causal, window_left=window_left, layout=layout)
    slots = plan.layout.slots
    cu_slot = max_slot = None
    if varlen:
        _check(plan.mode != "band", "ring attention: sliding windows with THD (cu_seqlens) inputs are not supported; "
               "use ulysses_attention", NotImplementedError)
        slots = 2 if layout == "zigzag" else 1  # THD zig-zag: two slots even without a mask (rows slot by slot)
        n = p * slots
        _check(t_loc % slots == 0, "THD zig-zag layout needs an even local block length")
        cu = _int32(cu_seqlens, "cu_seqlens").to(q.device)
        if not trust_device_batch_tensors:
            cu_host = cu.cpu()
            _check(bool(((cu_host % n) == 0).all()) and int(cu_host[-1]) == t_loc * p,
                   lambda: f"ring THD: every sequence length must be divisible by {n} and cu_seqlens[-1] must be the "
                   f"{p} ranks' rows ({t_loc * p}), got cu_seqlens {cu_host.tolist()}")
        cu_slot = torch.div(cu, n, rounding_mode="floor")
        max_seqlen = t_loc * p if max_seqlen is None else int(max_seqlen)
        max_slot = -(-max_seqlen // n)
    cx = _RingCall(group=group, p=p, r=r, plan=plan, varlen=varlen, slots=slots, rows=t_loc // slots,
                   softmax_type=_ops.SOFTMAX_TYPES[softmax_type], scale=scale, deterministic=bool(deterministic),
                   reduce_d_sinks=bool(reduce_d_sinks), cu=cu_slot, max_seqlen=max_slot)
    q, k, v = _autocast(q, k, v)  # under torch.autocast: the autocast dtype, as dot_product_attention
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    _check(q.dtype == k.dtype == v.dtype, lambda: f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
           TypeError)
    out, lse = _Ring.apply(q, k, v, sinks, cx)
    return (out, lse) if return_lse else out
