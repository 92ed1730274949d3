"""Matrix products: MatMul (numpy semantics: 1-D promotion, broadcast batch dims), Gemm, and the fused
ops the compiler's passes create -- FusedMatMul (MatMul + bias + activation in one ``fused_matmul`` /
``matmul`` launch) and Attention (MatMul, scale, mask Add, Softmax, MatMul in one ``attention`` launch).

A product whose right operand is 2-D runs as ONE matmul over the flattened rows of the left operand
(``[B, S, K] @ [K, N]`` is ``[B*S, K] @ [K, N]``); batched products with equal batch dims run as
``batch_matmul``; other batch broadcasts are expanded first.
"""
from __future__ import annotations

import numpy as np

from .base import broadcast, dtype_error, numel, register, shape_error, unsupported
from .elementwise import FLOATS

#: activation name -> the unary kernel applied after a product that could not fuse it
ACT_KERNEL = {"relu": "relu", "gelu": "gelu", "tanh": "tanh", "sigmoid": "sigmoid"}


def _mm_shapes(node, a_shape, b_shape):
    a2 = tuple(a_shape) if len(a_shape) > 1 else (1,) + tuple(a_shape)
    b2 = tuple(b_shape) if len(b_shape) > 1 else tuple(b_shape) + (1,)
    if not a_shape or not b_shape:
        raise shape_error(node, "A", a_shape, "MatMul operands need at least 1 dim")
    if a2[-1] != b2[-2]:
        raise shape_error(node, "B", b_shape, f"inner dims differ: A {tuple(a_shape)}, B {tuple(b_shape)}")
    batch = broadcast(node, a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return a2, b2, batch, out


def _mm_infer(node, ins):
    a, b = ins[0], ins[1]
    if a.dtype not in FLOATS:
        raise dtype_error(node, "A", a.dtype, FLOATS)
    if b.dtype != a.dtype:
        raise dtype_error(node, "B", b.dtype, [a.dtype])
    return [(_mm_shapes(node, a.shape, b.shape)[3], a.dtype)]


def _mm_fold(node, ins):
    return [np.matmul(ins[0].const, ins[1].const).astype(ins[0].dtype)]


def _expand_to(ctx, view, shape):
    if tuple(view.shape) == tuple(shape):
        return view
    t = ctx.temp(shape, view.dtype, "expand")
    ctx.emit("expand", [view], [t])
    return t


def lower_product(ctx, node, a_name, b_name, bias=None, act="none", transpose_b=False):
    """out(node) = act(a @ b + bias); ``bias`` a [N] view, ``transpose_b`` with a 2-D b given as [N, K]."""
    a, b = ctx.val(a_name), ctx.val(b_name)
    b_shape = tuple(b.shape[::-1]) if transpose_b else tuple(b.shape)
    a2, b2, batch, _ = _mm_shapes(node, a.shape, b_shape)
    av = ctx.reshape(ctx.ref(a_name), a2)
    out = ctx.out(node)
    k, n = a2[-1], b2[-1]
    if len(b2) == 2 and quantized_product(ctx, b_name, transpose_b, ctx.reshape(av, (numel(a2[:-1]), k)), bias,
                                          act, ctx.reshape(out, (numel(a2[:-1]), n))):
        return                       # (before b's float32 view: a weight view puts it in the blob)
    bv = ctx.ref(b_name) if transpose_b else ctx.reshape(ctx.ref(b_name), b2)
    if len(b2) == 2:
        rows = numel(a2[:-1])
        ins = [ctx.reshape(av, (rows, k)), bv] + ([bias] if bias is not None else [])
        attrs = {"transpose_b": True} if transpose_b else {}
        if act != "none":
            attrs["act"] = act
        ctx.emit("fused_matmul" if act != "none" else "matmul", ins, [ctx.reshape(out, (rows, n))], attrs)
        return
    if bias is not None or act != "none" or transpose_b:
        raise unsupported(node, "bias/activation fusion needs a 2-D right operand")
    af = _expand_to(ctx, av, batch + a2[-2:])
    bf = _expand_to(ctx, bv, batch + b2[-2:])
    ctx.emit("batch_matmul", [af, bf], [ctx.reshape(out, batch + (a2[-2], n))])


def quantized_product(ctx, b_name, transpose_b, a, bias, act, out) -> bool:
    """Under ``--quant int8``: ``out = act(a @ B + bias)`` with the constant float32 2-D weight ``B`` as int8
    per output channel, one ``weight_quant_matmul`` (+ the activation's own kernel).  False (nothing
    emitted) when B is not such a constant or the activation has no kernel of its own."""
    b = ctx.val(b_name)
    if ctx.quant != "int8" or b.const is None or b.dtype != "float32" or len(b.shape) != 2 or \
            (act != "none" and act not in ACT_KERNEL):
        return False
    qv, sv = ctx.quantized_weight(b.const, not transpose_b, b_name)
    ctx.emit("weight_quant_matmul", [a, qv, sv] + ([bias] if bias is not None else []), [out], {"qtype": "int8"})
    if act != "none":
        ctx.emit(ACT_KERNEL[act], [out], [out])
    return True


def _mm_lower(ctx, node):
    lower_product(ctx, node, node.inputs[0], node.inputs[1])


register("MatMul", _mm_infer, _mm_fold, _mm_lower)


def _fused_mm_infer(node, ins):
    return _mm_infer(node, ins)


def _fused_mm_lower(ctx, node):
    bias = ctx.ref(node.inputs[2]) if node.input(2) else None
    lower_product(ctx, node, node.inputs[0], node.inputs[1], bias, node.attrs.get("act", "none"))


register("FusedMatMul", _fused_mm_infer, None, _fused_mm_lower)


# ---------------------------------------------------------------------------------------------- gemm
def _gemm_dims(node, ins):
    a, b = ins[0], ins[1]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise shape_error(node, "A", a.shape, "Gemm operands must be 2-D")
    m, k = a.shape[::-1] if int(node.attrs.get("transA", 0)) else a.shape
    kb, n = b.shape[::-1] if int(node.attrs.get("transB", 0)) else b.shape
    if k != kb:
        raise shape_error(node, "B", b.shape, f"inner dims differ: A {tuple(a.shape)}, B {tuple(b.shape)} "
                                              f"(transA={node.attrs.get('transA', 0)}, transB={node.attrs.get('transB', 0)})")
    return m, k, n


def _gemm_infer(node, ins):
    a, b = ins[0], ins[1]
    if a.dtype not in FLOATS or b.dtype != a.dtype:
        raise dtype_error(node, "A", a.dtype, FLOATS)
    m, _, n = _gemm_dims(node, ins)
    c = ins[2] if len(ins) > 2 else None
    if c is not None:
        try:
            ok = np.broadcast_shapes(tuple(c.shape), (m, n)) == (m, n)
        except ValueError:
            ok = False
        if not ok:
            raise shape_error(node, "C", c.shape, f"does not broadcast to [M, N] = [{m}, {n}]")
    return [((m, n), a.dtype)]


def _gemm_fold(node, ins):
    a, b = ins[0].const.astype(np.float64), ins[1].const.astype(np.float64)
    a = a.T if int(node.attrs.get("transA", 0)) else a
    b = b.T if int(node.attrs.get("transB", 0)) else b
    y = float(node.attrs.get("alpha", 1.0)) * (a @ b)
    if len(ins) > 2 and ins[2] is not None:
        y = y + float(node.attrs.get("beta", 1.0)) * ins[2].const
    return [y.astype(ins[0].dtype)]


def _gemm_lower(ctx, node):
    """Y = act(alpha * A' @ B' + beta * C): alpha folds into a constant B (or A), transB into a constant
    B's layout (a run-time B is read with transpose_b), transA into a constant A (a run-time A gets a
    transpose), and beta * C into the kernel's bias when C is a [N]-like constant; otherwise alpha is a
    ``mul_scalar`` and C an ``add`` after the product."""
    ins = [ctx.val(n) if n else None for n in node.inputs]
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    m, k, n = _gemm_dims(node, ins)
    alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
    ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
    act = node.attrs.get("act", "none")
    scale_a = alpha != 1.0 and b.const is None and a.const is not None
    post_alpha = alpha != 1.0 and b.const is None and a.const is None
    if a.const is not None and (ta or scale_a):
        arr = a.const.T if ta else a.const
        av = ctx.weight(np.asarray(arr * np.asarray(alpha, arr.dtype) if scale_a else arr, order="C"), a.name)
    elif ta:
        av = ctx.temp((m, k), a.dtype, "transA")
        ctx.emit("transpose", [ctx.ref(a.name)], [av], {"perm": (1, 0)})
    else:
        av = ctx.ref(a.name)
    attrs = {}
    quant_b = ctx.quant == "int8" and b.const is not None and alpha == 1.0 and b.dtype == "float32" and \
        act in ("none",) + tuple(ACT_KERNEL)
    if quant_b:
        bv = None
    elif b.const is not None:
        arr = b.const.T if tb else b.const
        if alpha != 1.0:
            arr = arr * np.asarray(alpha, arr.dtype)
        bv = ctx.weight(np.asarray(arr, order="C"), b.name)
    else:
        bv = ctx.ref(b.name)
        if tb:
            attrs["transpose_b"] = True
    bias, add_c = None, False
    if c is not None and beta != 0.0:
        if c.const is not None and not post_alpha and (c.const.size == 1 or (c.const.size == n and c.shape[-1] == n)):
            bias = ctx.weight(np.asarray(np.broadcast_to(c.const.reshape(-1) * np.asarray(beta, c.dtype), (n,)),
                                         order="C"), f"{node.name}.bias")
        else:
            add_c = True
    out = ctx.out(node)
    fused_act = act if not (add_c or post_alpha) else "none"
    if fused_act != "none":
        attrs["act"] = fused_act
    mm_out = ctx.temp((m, n), a.dtype, "gemm") if (add_c or post_alpha) else out
    if quant_b:                     # --quant int8: the weight as int8 per output channel
        qv, sv = ctx.quantized_weight(b.const, not tb, b.name)
        ctx.emit("weight_quant_matmul", [av, qv, sv] + ([bias] if bias is not None else []), [mm_out],
                 {"qtype": "int8"})
        if fused_act != "none":
            ctx.emit(ACT_KERNEL[fused_act], [mm_out], [mm_out])
    else:
        ctx.emit("fused_matmul" if fused_act != "none" else "matmul", [av, bv] + ([bias] if bias is not None else []),
                 [mm_out], attrs)
    if post_alpha:
        ctx.emit("mul_scalar", [mm_out], [out if not add_c else mm_out], {"value": alpha})
        mm_out = out if not add_c else mm_out
    if add_c:
        if c.const is not None:
            cv = ctx.weight(np.asarray(c.const * np.asarray(beta, c.dtype), order="C"), c.name)
        else:
            cv = ctx.ref(c.name)
            if beta != 1.0:
                scaled = ctx.temp(c.shape, c.dtype, "beta_c")
                ctx.emit("mul_scalar", [cv], [scaled], {"value": beta})
                cv = scaled
        ctx.emit("add", [mm_out, cv], [out])
    if act != "none" and fused_act == "none":
        ctx.emit(ACT_KERNEL[act], [out], [out])


register("Gemm", _gemm_infer, _gemm_fold, _gemm_lower)


# ---------------------------------------------------------------------------------------------- attention
def _attn_infer(node, ins):
    q, k, v = ins[0], ins[1], ins[2]
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise shape_error(node, "q", q.shape, "attention needs 4-D q, k, v")
    return [((q.shape[0], q.shape[1], q.shape[2], v.shape[3]), q.dtype)]


def _attn_lower(ctx, node):
    ins = [ctx.ref(n) for n in node.inputs if n]
    ctx.emit("attention", ins, [ctx.out(node)], {"scale": float(node.attrs["scale"])})


register("Attention", _attn_infer, None, _attn_lower)
