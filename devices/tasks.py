"""Stream operations as plain frozen dataclasses: what the runtime sends, one by one or in batches.

The same objects travel in-process (the local backend hands them to :meth:`devices.device.Device.submit`)
and over the wire (the driver converts them to and from protobuf), so they hold only ints, floats,
strings, bytes, tuples and :class:`~devices.kernel.TensorDesc`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .kernel import TensorDesc


@dataclass(frozen=True)
class Launch:
    """Run kernel ``kernel`` as ``block_dim`` blocks (0 = let the device choose)."""
    stream: int
    kernel: str
    inputs: tuple[TensorDesc, ...] = ()
    outputs: tuple[TensorDesc, ...] = ()
    attrs: dict = field(default_factory=dict, hash=False, compare=False)
    block_dim: int = 0


def launch_key(op: Launch) -> tuple | None:
    """What makes two launches the same launch (everything but the stream), hashable; None when an
    attribute value cannot be hashed.  Keys the device's plan cache and the wire's launch templates."""
    try:
        attrs = tuple(sorted((k, _freeze(v)) for k, v in op.attrs.items())) if op.attrs else ()
        key = (op.kernel, op.inputs, op.outputs, attrs, op.block_dim)
        hash(key)
        return key
    except TypeError:
        return None


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class Record:
    stream: int
    event: int


@dataclass(frozen=True)
class Wait:
    """Later tasks of ``stream`` wait for the event's record number ``gen`` (0 = the latest one)."""
    stream: int
    event: int
    gen: int = 0


@dataclass(frozen=True)
class CopyD2D:
    stream: int
    dst: int
    src: int
    nbytes: int


@dataclass(frozen=True)
class Memset:
    stream: int
    ptr: int
    value: int
    nbytes: int


@dataclass(frozen=True)
class WriteH2D:
    """Stream-ordered host-to-device copy of bytes captured at enqueue (pageable-memory semantics)."""
    stream: int
    dst: int
    data: bytes


@dataclass(frozen=True)
class Collective:
    """An HCCL operator of this rank: ``op`` is allreduce | allgather | reducescatter | broadcast |
    reduce | alltoall | send | recv | barrier; ``count``/``dtype``/``redop``/``root`` as in HCCL."""
    stream: int
    comm: str
    op: str
    send: int = 0
    recv: int = 0
    count: int = 0
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    peer: int = -1


@dataclass(frozen=True)
class ExecGraph:
    """Replay captured graph ``graph`` (a model run instance of this owner) as one task of ``stream``."""
    stream: int
    graph: int


StreamOp = Launch | Record | Wait | CopyD2D | Memset | WriteH2D | Collective | ExecGraph
