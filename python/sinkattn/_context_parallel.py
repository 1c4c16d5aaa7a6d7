"""The framework-free part of context parallelism, shared by the JAX (``sinkattn.jax.ring``, ``sinkattn.jax.ulysses``)
and PyTorch (``sinkattn.torch.distributed``) implementations: the zig-zag chunk order, the static ring schedule
(which fused calls a device makes, which key rows it receives from where), the mask rules of the ring, and the
KV-head replication rule of the all-to-all mode. Pure Python and numpy: no arrays of either framework.

Zig-zag layout: the sequence is cut in 2p chunks and device r holds chunks r and 2p-1-r, so that under a causal mask
every device has the same work. Ring schedule (``RingPlan``): "full" (non-causal) and "causal" (contiguous layout)
take p steps of one call; "zigzag" takes a causal 2c x 2c call then two c x c calls per step; "band" (a causal
sliding window) computes only the chunk pairs the window reaches, and of a chunk a - delta only its last
``window_left - (delta - 1) c`` keys (c the chunk length), fetched straight from the device that holds them.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["zigzag_order", "ulysses_kv_replication", "resolve_ring_masks", "RingLayout", "RingPlan", "ring_schedule"]


def zigzag_order(num_shards: int):
    """Chunk order of the zig-zag layout: device r holds chunks r and 2p-1-r, i.e. [0, 2p-1, 1, 2p-2, ...]."""
    order = []
    for r in range(num_shards):
        order += [r, 2 * num_shards - 1 - r]
    return order


def ulysses_kv_replication(num_heads: int, num_kv_heads: int, axis_size: int) -> int:
    """How many times each KV head is replicated before the all-to-all: p / gcd(K, p) (1 when p divides K).
    Raises ValueError when the query heads cannot be split: N % p != 0, or N % K != 0."""
    if num_heads % num_kv_heads:
        raise ValueError(f"ulysses: query heads N={num_heads} must be a multiple of KV heads K={num_kv_heads}")
    if num_heads % axis_size:
        raise ValueError(f"ulysses: query heads N={num_heads} must be divisible by the {axis_size} devices of the "
                         f"sequence axis (each device gets N / p query heads for the whole sequence)")
    return axis_size // math.gcd(num_kv_heads, axis_size)


def resolve_ring_masks(is_causal, window, layout, t_loc):
    """(is_causal, window_left or None, layout) of a ring call; raises for what the ring does not support.

    window: None, an int (both sides) or (window_left, window_right), negative or None = unbounded; a window whose
    right side is 0 is causal. The ring computes causal sliding windows (window_left, 0) only."""
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    window_left = None
    if window is not None:
        wl, wr = (window, window) if isinstance(window, int) else window
        wl = None if wl is None or wl < 0 else int(wl)
        wr = None if wr is None or wr < 0 else int(wr)
        if is_causal:
            wr = 0
        if wr is None and wl is not None or wr is not None and wr != 0:
            raise NotImplementedError("ring attention supports causal sliding windows (window_left, 0) only")
        window_left = wl
        is_causal = is_causal or wr == 0
    if layout == "zigzag" and is_causal and t_loc % 2:
        raise ValueError("zig-zag layout needs an even local block length")
    return is_causal, window_left, layout


class RingLayout:
    """Device r holds ``slots`` chunks of ``c`` rows: contiguous chunk r, or zig-zag chunks r and 2p-1-r."""

    def __init__(self, p, t_loc, zigzag):
        self.p = p
        self.slots = 2 if zigzag else 1
        self.c = t_loc // self.slots

    def chunk(self, r, u):
        return r if u == 0 else 2 * self.p - 1 - r

    def home(self, b):
        """(device, slot) holding global chunk b."""
        if self.slots == 1 or b < self.p:
            return b, 0
        return 2 * self.p - 1 - b, 1


def _band(c, delta, window_left):
    """Query chunk a against key chunk a - delta (delta >= 1) under a causal window: None if no pair is visible,
    else (query rows [0, rows), key rows [e, c), window_left of the sliced call or None for no mask). The sliced
    call is top-left aligned with an unbounded right side: key j' (of the slice) is visible to query i iff
    j' >= i + (delta c - e - window_left)."""
    e = delta * c - window_left
    if e >= c:
        return None
    if e <= -(c - 1):
        return c, 0, None
    if e <= 0:
        return c, 0, -e
    return c - e, e, 0


class RingTransfer:
    """One exchange of a band piece: static source -> destination pairs, and per device the slot it sends (a device
    sends at most one array per transfer)."""

    def __init__(self, p):
        self.pairs = []
        self.send_slot = np.zeros(p, np.int32)
        self.sender = np.zeros(p, bool)
        self.receiver = np.zeros(p, bool)


class RingPiece:
    """A band piece (local chunk slot u, distance delta >= 1), the same static description on every device: the
    query rows [0, rows) of slot u against the key rows [e, c) of global chunk chunk(r, u) - delta, masked by
    ``window_left`` (None: unmasked; else a top-left window (window_left, unbounded))."""

    def __init__(self, layout, u, delta, rows, e, window_left):
        p = layout.p
        self.u, self.delta, self.rows, self.e, self.window_left = u, delta, rows, e, window_left
        self.valid = np.zeros(p, bool)
        self.local = np.zeros(p, bool)
        self.local_slot = np.zeros(p, np.int32)
        self.transfers = []
        for r in range(p):
            b = layout.chunk(r, u) - delta
            if b < 0:
                continue
            self.valid[r] = True
            d, s = layout.home(b)
            if d == r:  # the key chunk is this device's other slot (zig-zag, r = p - 1)
                self.local[r], self.local_slot[r] = True, s
                continue
            for tr in self.transfers:
                if not tr.sender[d]:
                    break
            else:
                tr = RingTransfer(p)
                self.transfers.append(tr)
            tr.pairs.append((d, r))
            tr.sender[d], tr.send_slot[d], tr.receiver[r] = True, s, True

    def source(self, r):
        """(device, slot) that holds the key rows device r needs, or None when r has no chunk a - delta."""
        if not self.valid[r]:
            return None
        if self.local[r]:
            return r, int(self.local_slot[r])
        for tr in self.transfers:
            for d, dst in tr.pairs:
                if dst == r:
                    return d, int(tr.send_slot[d])
        raise AssertionError("unreachable: a valid piece is local or received")

    def destinations(self, r):
        """[(device, slot of r that it reads)] of the devices (other than r) that need key rows of r."""
        return [(dst, int(tr.send_slot[d])) for tr in self.transfers for d, dst in tr.pairs if d == r]


class RingPlan:
    """Static description of the ring (everything known before any array exists): mode "full", "causal",
    "zigzag" or "band", the layout, and the band pieces."""

    def __init__(self, *, p, t_loc, is_causal, window_left, layout):
        self.p = p
        self.t_loc = t_loc
        total = p * t_loc
        if window_left is not None and window_left >= total - 1:
            window_left = None  # the band covers every causal pair
        self.window_left = window_left
        zigzag = layout == "zigzag" and is_causal
        self.layout = RingLayout(p, t_loc, zigzag)
        if not is_causal:
            self.mode = "full"
        elif window_left is not None:
            self.mode = "band"
        else:
            self.mode = "zigzag" if zigzag else "causal"
        self.pieces = []
        if self.mode == "band":
            c = self.layout.c
            for u in range(self.layout.slots):
                for delta in range(1, (window_left + c - 1) // c + 1):
                    band = _band(c, delta, window_left)
                    if band is None:
                        continue
                    piece = RingPiece(self.layout, u, delta, *band)
                    if piece.valid.any():
                        self.pieces.append(piece)

    def describe(self):
        """Per device: the fused forward calls and the key rows received (for tests and the README)."""
        c, slots = self.layout.c, self.layout.slots
        if self.mode == "band":
            calls = [(c, c, "causal window")] * slots + [(pc.rows, c - pc.e, "band") for pc in self.pieces]
            return dict(mode=self.mode, calls=calls, ppermutes=sum(len(pc.transfers) for pc in self.pieces),
                        key_rows_received=sum(c - pc.e for pc in self.pieces if pc.transfers))
        if self.mode == "zigzag":
            calls = [(2 * c, 2 * c, "causal")] + [(c, c, "full")] * (2 * (self.p - 1))
        else:
            calls = [(self.t_loc, self.t_loc, "causal" if self.mode == "causal" else "full")] * self.p
        return dict(mode=self.mode, calls=calls, ppermutes=self.p - 1, key_rows_received=(self.p - 1) * self.t_loc)


def ring_schedule(*, axis_size, local_len, is_causal=False, local_window_size=None, layout="contiguous"):
    """The static schedule ring attention uses on every device (no arrays needed): dict(mode, calls = [(query rows,
    key rows, mask)] of the fused forward calls, ppermutes = exchanges in the forward, key_rows_received).
    E.g. ``ring_schedule(axis_size=8, local_len=4096, local_window_size=(127, 0))`` (GPT-OSS sliding layer,
    32k tokens on 8 devices): one 4096 x 4096 causal-window call and one 127 x 127 call, 127 key rows received."""
    is_causal, window_left, layout = resolve_ring_masks(is_causal, local_window_size, layout, local_len)
    return RingPlan(p=axis_size, t_loc=local_len, is_causal=is_causal, window_left=window_left,
                    layout=layout).describe()
