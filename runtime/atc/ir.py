"""The compiler's graph IR: named values (shape, dtype, and a constant when one is known) and nodes.

A :class:`Graph` is one instantiation of an imported model at concrete input shapes (one per dynamic
batch gear): every value gets a static shape, constants are folded into ``Value.const``, fusion passes
rewrite nodes, and lowering turns the nodes into device kernel launches.  Nodes are kept in topological
order (ONNX requires it of its files; the passes preserve it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the consumer-list entry that marks a graph output (such a value cannot be fused away)
GRAPH_OUTPUT = None


@dataclass
class Value:
    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    const: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def is_const(self) -> bool:
        return self.const is not None


@dataclass
class Node:
    op: str                              #: ONNX op type, or a fused vnpu op (``FusedMatMul`` ...)
    name: str
    inputs: list[str]                    #: "" marks an absent optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    opset: int = 13                      #: the model's default-domain opset (some ops changed meaning)

    def copy(self) -> "Node":
        return Node(self.op, self.name, list(self.inputs), list(self.outputs), dict(self.attrs), self.domain,
                    self.opset)

    def input(self, i: int) -> str:
        """Name of input ``i`` ("" when absent)."""
        return self.inputs[i] if i < len(self.inputs) else ""


@dataclass
class Graph:
    values: dict[str, Value]
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    opset: int
    name: str = "model"

    def value(self, name: str) -> Value | None:
        return self.values.get(name) if name else None

    def consumers(self) -> dict[str, list]:
        """value name -> the nodes reading it (and :data:`GRAPH_OUTPUT` for graph outputs)."""
        out: dict[str, list] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        for o in self.outputs:
            out.setdefault(o, []).append(GRAPH_OUTPUT)
        return out

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def prune(self) -> int:
        """Drop nodes none of whose outputs is needed for the graph outputs; returns how many."""
        need = set(self.outputs)
        keep = []
        for n in reversed(self.nodes):
            if any(o in need for o in n.outputs if o):
                keep.append(n)
                need.update(i for i in n.inputs if i)
        dropped = len(self.nodes) - len(keep)
        self.nodes = keep[::-1]
        return dropped
