"""Image ops the compiler inserts: ``Aipp`` (domain vnpu), the AIPP stage of ``--insert_op_conf``
(:mod:`runtime.atc.aipp`), lowered to the ``aipp`` kernel."""
from __future__ import annotations

from .base import register


def _aipp_infer(node, ins):
    c, h, w = node.attrs["chw"]
    return [((ins[0].shape[0], c, h, w), node.attrs["dtype"])]


def _aipp_lower(ctx, node):
    ctx.emit("aipp", [ctx.ref(node.inputs[0]), ctx.ref(node.inputs[1])], [ctx.out(node)], {})


register("Aipp", _aipp_infer, None, _aipp_lower)
