"""The operators the compiler understands: one :class:`OpDef` per ONNX op type (and per fused vnpu op),
looked up by name in :data:`OPS`.

An op definition holds the op's three jobs in one place:

- ``infer(node, ins) -> [(shape, dtype), ...]``: static output shapes from the input values (every input
  shape is concrete: a graph is instantiated per batch gear);
- ``fold(node, ins) -> [array, ...]``: numpy evaluation when every input is a constant (``shape_only``
  ops such as Shape fold from shapes alone), which is how shape arithmetic disappears;
- ``lower(ctx, node)``: the device kernels (or views) that compute it (``None``: fold-only).

Families: :mod:`.elementwise` (Add .. Where, Cast, Clip), :mod:`.tensor` (Shape, Reshape, Gather, Slice,
Concat, Expand ...), :mod:`.nn` (Softmax, norms, reductions, Conv, pools, BatchNormalization),
:mod:`.matmul` (MatMul, Gemm and the fused matmul / attention ops).
"""
from .base import INTERNAL, OPS, OpDef, lookup_op, register, where  # noqa: F401
from . import elementwise, image, matmul, nn, tensor  # noqa: F401,E402  (each family registers its ops)

__all__ = ["OPS", "OpDef", "INTERNAL", "lookup_op", "register", "where"]
