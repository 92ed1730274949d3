"""The compiled form of one graph: device buffers, tensor views into them, and the kernel launches.

A :class:`Program` is what lowering produces for one batch gear: ``steps`` in execution order, each a
kernel of :mod:`devices.ops` with the views it reads and writes, its attributes and block_dim (tiled
for the target chip) and its modeled duration on that chip.  Buffers are of three kinds: ``input``
(the model inputs, staged in the workspace), ``act`` (intermediates, placed by the memory plan) and
``weight`` (constants, packed once into the weights blob).  Views of one buffer share its memory
(a Reshape is a view, not a copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INPUT, ACT, WEIGHT = "input", "act", "weight"


@dataclass(frozen=True)
class Buffer:
    id: int
    kind: str
    nbytes: int
    name: str


@dataclass(frozen=True)
class View:
    buf: int
    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Step:
    kernel: str
    inputs: tuple[View, ...]
    outputs: tuple[View, ...]
    attrs: dict
    block_dim: int
    node: str
    modeled_s: float


@dataclass
class Program:
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    inputs: list[View] = field(default_factory=list)
    outputs: list[View] = field(default_factory=list)
    weights: dict[int, np.ndarray] = field(default_factory=dict)      #: weight buffer id -> its array

    def buffer(self, bid: int) -> Buffer:
        return self.buffers[bid]

    @property
    def launches(self) -> int:
        return len(self.steps)

    @property
    def intermediate_bytes(self) -> int:
        """Sum of all intermediate (activation) tensors: the workspace a plan without reuse would need."""
        return sum(b.nbytes for b in self.buffers if b.kind == ACT)

    @property
    def modeled_s(self) -> float:
        return sum(s.modeled_s for s in self.steps)

    def kernel_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.kernel] = out.get(s.kernel, 0) + 1
        return dict(sorted(out.items()))
