"""What each stream op reads and writes: the declared memory footprint of a device task.

A sanitizer (``runtime.sanitize``) checks ordering and initialisation on these declarations, so they are
part of the device model: a kernel launch reads its inputs and writes its outputs, a copy reads its
source and writes its destination, a memset or a stream-ordered host write writes its range, an HCCL
operator reads this rank's send buffer and writes its recv buffer (the sizes per operator and rank are
:meth:`devices.hccl.HcclEngine.buffer_counts`'; a broadcast's root reads the buffer the others write),
and records and waits touch no memory.  A graph replay is the concatenation of its captured ops.

Declarations are whole ranges.  A kernel that reads an input only at data-dependent places (a gather,
attention over a KV cache up to lengths held in device memory) names it in its ``gathers``
(:class:`devices.registry.KernelDef`); one that writes an output only at data-dependent places (a
scatter) names it in ``scatters``: such accesses still order like any other, but they neither prove
nor require that every byte of the range was written (:attr:`Access.partial`).
"""
from __future__ import annotations

from typing import NamedTuple

from .hccl import CollectiveOp, HcclEngine, itemsize
from .kernel import lookup
from .errors import AclError
from .tasks import Collective, CopyD2D, ExecGraph, Launch, Memset, StreamOp, WriteH2D


class Access(NamedTuple):
    """``nbytes`` at ``ptr``, read or written (``write``) by one task; ``what`` names the argument
    ("input 0", "dst", "send" ...); ``partial``: only data-dependent parts of the range are touched."""
    ptr: int
    nbytes: int
    write: bool
    what: str
    partial: bool = False


#: argument names, made once
_IN = tuple(f"input {i}" for i in range(64))
_OUT = tuple(f"output {i}" for i in range(64))
#: kernel name -> (gathers, scatters) of the kernels seen so far (built-ins are immutable; a user kernel
#: declares none)
_DECLS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def _decl(name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    d = _DECLS.get(name)
    if d is None:
        try:
            k = lookup(name)
        except AclError:
            return (), ()
        d = (k.gathers, k.scatters)
        if not k.user:
            _DECLS[name] = d
    return d


def kernel_accesses(op: Launch) -> tuple[Access, ...]:
    """Inputs read, then outputs written, with the kernel's ``gathers``/``scatters`` marked partial (a
    kernel this process does not know -- another tenant's, registered on a remote device -- declares
    none)."""
    gathers, scatters = _decl(op.kernel)
    ins, outs = op.inputs, op.outputs
    out = [Access(d.ptr, d.nbytes, False, _IN[i] if i < 64 else f"input {i}", i in gathers)
           for i, d in enumerate(ins)]
    out += [Access(d.ptr, d.nbytes, True, _OUT[i] if i < 64 else f"output {i}", i in scatters)
            for i, d in enumerate(outs)]
    return tuple(out)


def collective_accesses(op: Collective, rank: int, nranks: int) -> tuple[Access, ...]:
    """This rank's buffers of one HCCL operator (``rank`` of ``nranks``)."""
    isz = itemsize(op.dtype)
    if op.op == "broadcast":
        n = op.count * isz
        return (Access(op.send, n, rank != op.root, "buffer"),) if n else ()
    cop = CollectiveOp(op.comm, op.op, op.send, op.recv, op.count, op.dtype, op.redop, op.root, op.peer)
    ns, nr = HcclEngine.buffer_counts(cop, nranks, rank)
    out = []
    if ns:
        out.append(Access(op.send, ns * isz, False, "send"))
    if nr:
        out.append(Access(op.recv, nr * isz, True, "recv"))
    return tuple(out)


def op_accesses(op: StreamOp, comm: tuple[int, int] | None = None) -> tuple[Access, ...]:
    """The declared accesses of one non-graph stream op, in order (``comm``: this rank's ``(rank,
    nranks)`` for a Collective; without it a collective declares nothing).  An ExecGraph's accesses
    are those of its captured ops (the caller holds them)."""
    if isinstance(op, Launch):
        return kernel_accesses(op)
    if isinstance(op, CopyD2D):
        return (Access(op.src, op.nbytes, False, "src"), Access(op.dst, op.nbytes, True, "dst"))
    if isinstance(op, Memset):
        return (Access(op.ptr, op.nbytes, True, "dst"),)
    if isinstance(op, WriteH2D):
        return (Access(op.dst, len(op.data), True, "dst"),)
    if isinstance(op, Collective):
        return collective_accesses(op, *comm) if comm is not None else ()
    return ()


def op_label(op: StreamOp) -> str:
    """How a report names the task: ``kernel matmul``, ``memcpy_d2d``, ``hccl allreduce`` ..."""
    if isinstance(op, Launch):
        return f"kernel {op.kernel}"
    if isinstance(op, Collective):
        return f"hccl {op.op}"
    if isinstance(op, ExecGraph):
        return f"graph {op.graph} replay"
    return {CopyD2D: "memcpy_d2d (stream)", Memset: "memset (stream)",
            WriteH2D: "memcpy_h2d (stream)"}.get(type(op), type(op).__name__.lower())
