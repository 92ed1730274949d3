"""The static memory plan: every input staging buffer and intermediate of a program gets an offset in
ONE workspace allocation, and buffers whose lifetimes do not overlap share memory.

Lifetimes are step intervals ``[first, last]``: a model input is live from before the first step (-1,
it is copied in before the replay), an intermediate from the step that first touches it to the step
that last touches it, and a model output until after the last step (it is copied out after the replay).
Views (Reshape, Slice-as-view ...) are part of their buffer, so they extend its lifetime.

Placement is greedy by size (TFLite's "greedy by size" arena planner): the largest buffers first, each
at the lowest aligned offset where it overlaps no already placed buffer that is live at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .program import INPUT, WEIGHT, Program

ALIGN = 64


@dataclass(frozen=True)
class Placement:
    buf: int
    offset: int
    nbytes: int
    first: int
    last: int


@dataclass
class MemoryPlan:
    placements: dict[int, Placement]
    size: int                               #: the workspace: the plan's peak
    naive: int                              #: what the buffers need without any reuse (aligned sum)

    def offset(self, buf: int) -> int:
        return self.placements[buf].offset


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def lifetimes(prog: Program) -> dict[int, tuple[int, int]]:
    """buffer id -> (first step, last step) for the workspace buffers of ``prog``."""
    spans: dict[int, list[int]] = {}
    for b in prog.buffers:
        if b.kind == INPUT:
            spans[b.id] = [-1, -1]
    for i, st in enumerate(prog.steps):
        for v in st.inputs + st.outputs:
            if prog.buffers[v.buf].kind == WEIGHT:
                continue
            s = spans.setdefault(v.buf, [i, i])
            s[0], s[1] = min(s[0], i), max(s[1], i)
    n = len(prog.steps)
    for v in prog.outputs:
        if prog.buffers[v.buf].kind != WEIGHT:
            spans.setdefault(v.buf, [n, n])[1] = n
    return {k: (a, b) for k, (a, b) in spans.items()}


def plan_memory(prog: Program, reuse: bool = True) -> MemoryPlan:
    """Place the workspace buffers; ``reuse=False`` (ATC's --disable_reuse_memory 1) gives every buffer
    its own bytes."""
    spans = lifetimes(prog)
    if not reuse:
        spans = {b: (-1, len(prog.steps)) for b in spans}
    items = sorted(spans, key=lambda b: (-prog.buffers[b].nbytes, spans[b][0], b))
    placed: list[Placement] = []
    out: dict[int, Placement] = {}
    for b in items:
        size = _align(prog.buffers[b].nbytes)
        first, last = spans[b]
        busy = sorted((p.offset, p.offset + _align(p.nbytes)) for p in placed if p.first <= last and first <= p.last)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, hi)
        p = Placement(b, off, prog.buffers[b].nbytes, first, last)
        placed.append(p)
        out[b] = p
    peak = max((p.offset + _align(p.nbytes) for p in placed), default=0)
    naive = sum(_align(prog.buffers[b].nbytes) for b in spans)
    return MemoryPlan(out, peak, naive)
