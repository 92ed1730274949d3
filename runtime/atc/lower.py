"""Lowering: the IR graph -> a :class:`~runtime.atc.program.Program` of device kernels.

Each node is lowered by its op's ``lower`` function (see :mod:`runtime.atc.ops`) through a
:class:`LowerCtx`: ``ref`` gives the view of a value (a graph input, a constant packed as a weight, or an
earlier node's output), ``out`` a fresh intermediate for a node output, ``alias`` binds an output to a
reshaped view of another (Reshape, Squeeze, Flatten ... cost nothing), and ``emit`` appends a kernel
launch.  ``emit`` runs the kernel's own launch check on the views (so a shape the device would refuse is
refused here, naming the ONNX node), picks the block_dim the target chip's cores allow and prices the
launch with that chip's cost model.
"""
from __future__ import annotations

import numpy as np

from devices.chip import CostModel, Work, chip_by_name
from devices.errors import (ACL_ERROR_FEATURE_UNSUPPORTED, ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_INTERNAL_ERROR,
                            ACL_ERROR_GE_SHAPE_INVALID, AclError, AtcError)
from devices.kernel import DTYPES, TensorDesc, check_launch, default_block_dim, lookup
from devices.ops.qformats import quantize_int8

from .ir import Graph, Node
from .program import ACT, INPUT, WEIGHT, Buffer, Program, Step, View


class LowerCtx:
    def __init__(self, g: Graph, soc: str, quant: str = "none"):
        self.g = g
        self.quant = quant                           #: "int8": constant matmul weights lowered quantized
        self.chip = chip_by_name(soc)
        self.cost = CostModel(self.chip)
        self.prog = Program()
        self.refs: dict[str, View] = {}
        self._weights: dict[int, View] = {}          # id(array) -> its weight view
        self._pinned: list[np.ndarray] = []          # arrays made while lowering: their ids stay unique
        self._quantized: dict[tuple[int, bool], tuple[View, View]] = {}   # (id(array), transposed) -> views
        self.node: Node | None = None
        self.used = {i for n in g.nodes for i in n.inputs if i} | set(g.outputs)   #: values something reads

    # ------------------------------------------------------------------ buffers and views
    def _buffer(self, kind: str, nbytes: int, name: str) -> int:
        bid = len(self.prog.buffers)
        self.prog.buffers.append(Buffer(bid, kind, int(nbytes), name))
        return bid

    def val(self, name: str):
        return self.g.value(name)

    def weight(self, arr: np.ndarray, name: str = "const") -> View:
        """A constant as a weight view (one buffer per distinct array object)."""
        key = id(arr)
        v = self._weights.get(key)
        if v is None:
            a = np.asarray(arr, order="C")
            if a.dtype.name not in DTYPES:
                raise AtcError("EZ0007", ACL_ERROR_GE_DATATYPE_INVALID, param_name=name,
                               op_name=self.where(), data_dtype=a.dtype.name, expected_dtype_list=", ".join(DTYPES))
            bid = self._buffer(WEIGHT, max(a.nbytes, 1), name)
            self.prog.weights[bid] = a
            v = View(bid, 0, tuple(a.shape), a.dtype.name)
            self._weights[key] = v
            self._pinned.append(arr)
        return v

    def quantized_weight(self, w: np.ndarray, transpose: bool, name: str) -> tuple[View, View]:
        """A constant float32 weight (``[N, K]``, or ``[K, N]`` with ``transpose``) as (int8 ``[N, K]``,
        float32 scales ``[N]``) weight views: symmetric per output channel
        (:func:`devices.ops.qformats.quantize_int8`), made once per source array."""
        key = (id(w), transpose)
        got = self._quantized.get(key)
        if got is None:
            q, scale = quantize_int8(w.T if transpose else w)
            got = (self.weight(q, f"{name}.int8"), self.weight(scale, f"{name}.scale"))
            self._quantized[key] = got
            self._pinned.extend((w, q, scale))
        return got

    def ref(self, name: str) -> View:
        v = self.refs.get(name)
        if v is not None:
            return v
        val = self.g.value(name)
        if val is None:
            raise AclError(f"{self.where()}: value {name!r} is used before any node produces it",
                           code=ACL_ERROR_GE_INTERNAL_ERROR)
        if val.const is None:
            raise AtcError("EZ0009", ACL_ERROR_GE_SHAPE_INVALID, param_name=name, op_name=self.where(),
                           incorrect_shape=",".join(map(str, val.shape or ())),
                           reason="no node produces this value")
        v = self.weight(val.const, name)
        self.refs[name] = v
        return v

    def input(self, name: str) -> View:
        val = self.g.value(name)
        bid = self._buffer(INPUT, max(val.nbytes, 1), name)
        v = View(bid, 0, tuple(val.shape), val.dtype)
        self.refs[name] = v
        return v

    def temp(self, shape, dtype: str, name: str = "tmp") -> View:
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return View(self._buffer(ACT, max(nbytes, 1), name), 0, shape, dtype)

    def out(self, node: Node, i: int = 0) -> View:
        """A fresh intermediate for output ``i`` of ``node`` (at its inferred shape and dtype)."""
        name = node.outputs[i]
        val = self.g.value(name)
        v = self.temp(val.shape, val.dtype, name)
        self.refs[name] = v
        return v

    @staticmethod
    def reshape(v: View, shape) -> View:
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(v.shape, dtype=np.int64)):
            raise AclError(f"internal: cannot view {v.shape} as {shape}")
        return View(v.buf, v.offset, shape, v.dtype)

    def alias(self, name: str, v: View, shape=None) -> View:
        """Bind value ``name`` to ``v`` (reshaped to the value's shape): no kernel, no copy."""
        val = self.g.value(name)
        view = self.reshape(v, val.shape if shape is None else shape)
        self.refs[name] = view
        return view

    # ------------------------------------------------------------------ launches
    def where(self) -> str:
        """The node being lowered, as an error message names it (``name(Op)``; ``graph`` outside a node)."""
        n = self.node
        return f"{n.name}({n.op})" if n is not None else "graph"

    def emit(self, kernel: str, ins, outs, attrs: dict | None = None) -> Step:
        attrs = dict(attrs or {})
        k = lookup(kernel)
        di = tuple(TensorDesc(0, v.shape, v.dtype) for v in ins)
        do = tuple(TensorDesc(0, v.shape, v.dtype) for v in outs)
        try:
            check_launch(k, di, do, attrs, 1)
        except AclError as e:
            raise AtcError("EZ0009", ACL_ERROR_GE_SHAPE_INVALID, param_name=f"kernel {kernel}", op_name=self.where(),
                           incorrect_shape="; ".join(",".join(map(str, v.shape)) for v in ins),
                           reason=e.detail) from None
        bd = default_block_dim(k, di, do, attrs, self.chip.ai_cores, self.chip.ai_cores)
        work = k.work(di, do, attrs) if k.work else Work(bytes=sum(d.nbytes for d in di + do))
        step = Step(kernel, tuple(ins), tuple(outs), attrs, int(bd), self.node.name if self.node else "",
                    self.cost.kernel(work, bd))
        self.prog.steps.append(step)
        return step


def lower_graph(g: Graph, soc: str, quant: str = "none") -> Program:
    """Lower every node of ``g`` (after folding and fusion) to kernel launches (``quant="int8"``: constant
    matmul weights as int8 per channel, see :func:`runtime.atc.ops.matmul.quantized_product`)."""
    from .ops import lookup_op
    ctx = LowerCtx(g, soc, quant)
    for name in g.inputs:
        ctx.prog.inputs.append(ctx.input(name))
    for node in g.nodes:
        ctx.node = node
        od = lookup_op(node, g.opset)
        if od.lower is None:
            raise AtcError("E10055", ACL_ERROR_FEATURE_UNSUPPORTED,
                           reason=f"{node.op} node {node.name} computes a runtime value but vnpu only folds it "
                                  "at compile time (its inputs must be constants)")
        try:
            od.lower(ctx, node)
        except AclError:
            raise
        except Exception as e:  # noqa: BLE001 - a malformed attribute: name the node, never a traceback
            raise AtcError("E19999", ACL_ERROR_GE_INTERNAL_ERROR,
                           reason=f"lowering {ctx.where()} failed: {type(e).__name__}: {e}") from None
    ctx.node = None
    for name in g.outputs:
        ctx.prog.outputs.append(ctx.ref(name))
    return ctx.prog

