"""Neural-network ops: Softmax, LayerNormalization, ReduceMean/Sum/Max/Min, ArgMax, BatchNormalization, Conv
(1-D and 2-D; FusedConv is Conv with a folded BatchNormalization and an activation), MaxPool,
AveragePool, GlobalAveragePool, GlobalMaxPool.

1-D convolutions and pools run as 2-D ones over an ``[N, C, 1, L]`` view; LayerNormalization over the
trailing axes from ``axis`` runs the ``layernorm`` kernel on a ``[rows, D]`` view; Softmax of opsets
below 13 (which flattens from ``axis``) likewise.
"""
from __future__ import annotations

import numpy as np

from devices.ops.cnn import window_out

from .base import dtype_error, ints, norm_axis, numel, register, same, shape_error, unsupported
from .elementwise import FLOATS


def _no_extra_outputs(ctx, node, what: str) -> None:
    for o in node.outputs[1:]:
        if o and o in ctx.used:
            raise unsupported(node, f"its {what} output is not supported (only the first output may be used)")


# ---------------------------------------------------------------------------------------------- softmax
def _softmax_axis(node, ins):
    """Opset 13 made Softmax single-axis with default -1; earlier opsets flatten from axis (default 1)."""
    return norm_axis(node, int(node.attrs.get("axis", -1 if node.opset >= 13 else 1)), len(ins[0].shape))


def _softmax_infer(node, ins):
    if ins[0].dtype not in FLOATS:
        raise dtype_error(node, "input", ins[0].dtype, FLOATS)
    return same(ins[0])


def _softmax_fold(node, ins):
    x = ins[0].const.astype(np.float64)
    ax = _softmax_axis(node, ins)
    if node.opset < 13:
        x2 = x.reshape(numel(x.shape[:ax]), -1)
        e = np.exp(x2 - x2.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).reshape(x.shape).astype(ins[0].dtype)]
    e = np.exp(x - x.max(axis=ax, keepdims=True))
    return [(e / e.sum(axis=ax, keepdims=True)).astype(ins[0].dtype)]


def _softmax_lower(ctx, node):
    x = ctx.val(node.inputs[0])
    ax = _softmax_axis(node, [x])
    if node.opset < 13 and ax != len(x.shape) - 1:
        rows = (numel(x.shape[:ax]), numel(x.shape[ax:]))
        out = ctx.out(node)
        ctx.emit("softmax", [ctx.reshape(ctx.ref(x.name), rows)], [ctx.reshape(out, rows)], {"axis": -1})
        return
    ctx.emit("softmax", [ctx.ref(x.name)], [ctx.out(node)], {"axis": ax})


register("Softmax", _softmax_infer, _softmax_fold, _softmax_lower)


# ---------------------------------------------------------------------------------------------- layer norm
def _ln_axis(node, x):
    return norm_axis(node, int(node.attrs.get("axis", -1)), len(x.shape))


def _ln_infer(node, ins):
    x = ins[0]
    if x.dtype not in FLOATS:
        raise dtype_error(node, "X", x.dtype, FLOATS)
    norm_shape = tuple(x.shape[_ln_axis(node, x):])
    for what, v in (("Scale", ins[1] if len(ins) > 1 else None), ("B", ins[2] if len(ins) > 2 else None)):
        if v is not None:
            try:
                ok = np.broadcast_shapes(tuple(v.shape), norm_shape) == norm_shape
            except ValueError:
                ok = False
            if not ok:
                raise shape_error(node, what, v.shape, f"does not broadcast to the normalized shape {norm_shape}")
    return [(tuple(x.shape), x.dtype)] + [((), "float32")] * (len(node.outputs) - 1)


def _ln_param(ctx, node, name, norm_shape, dtype, fill: float):
    d = numel(norm_shape)
    pdt = dtype if dtype != "float64" else "float64"
    if not name:
        return ctx.weight(np.full((d,), fill, pdt), f"{node.name}.{'gamma' if fill else 'beta'}")
    v = ctx.val(name)
    if v.const is not None:
        arr = np.asarray(np.broadcast_to(v.const, norm_shape).reshape(d).astype(pdt), order="C")
        return ctx.weight(arr, name)
    if tuple(v.shape) != tuple(norm_shape) or v.dtype not in (dtype, "float32"):
        raise unsupported(node, f"a run-time {name} must have the normalized shape {norm_shape}")
    return ctx.reshape(ctx.ref(name), (d,))


def _ln_lower(ctx, node):
    _no_extra_outputs(ctx, node, "Mean/InvStdDev")
    x = ctx.val(node.inputs[0])
    ax = _ln_axis(node, x)
    norm_shape = tuple(x.shape[ax:])
    rows = (numel(x.shape[:ax]), numel(norm_shape))
    gamma = _ln_param(ctx, node, node.input(1), norm_shape, x.dtype, 1.0)
    beta = _ln_param(ctx, node, node.input(2), norm_shape, x.dtype, 0.0)
    out = ctx.out(node)
    ctx.emit("layernorm", [ctx.reshape(ctx.ref(x.name), rows), gamma, beta], [ctx.reshape(out, rows)],
             {"eps": float(node.attrs.get("epsilon", 1e-5))})


register("LayerNormalization", _ln_infer, None, _ln_lower)


# ---------------------------------------------------------------------------------------------- reductions
_REDUCE = {"ReduceMean": ("reduce_mean", np.mean), "ReduceSum": ("reduce_sum", np.sum),
           "ReduceMax": ("reduce_max", np.max), "ReduceMin": ("reduce_min", np.min)}


def _reduce_axes(node, ins):
    rank = len(ins[0].shape)
    axes = ints(node, ins, 1, "axes")
    if not axes:
        return None if int(node.attrs.get("noop_with_empty_axes", 0)) else tuple(range(rank))
    norm = sorted({norm_axis(node, a, rank, "axes") for a in axes})
    return tuple(norm)


def _reduce_infer(node, ins):
    x = ins[0]
    if node.op == "ReduceMean" and x.dtype not in FLOATS:
        raise dtype_error(node, "data", x.dtype, FLOATS)
    axes = _reduce_axes(node, ins)
    if axes is None:
        return same(x)
    keep = int(node.attrs.get("keepdims", 1))
    shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(shape, x.dtype)]


def _reduce_fold(node, ins):
    axes = _reduce_axes(node, ins)
    x = ins[0].const
    if axes is None:
        return [x]
    r = _REDUCE[node.op][1](x, axis=axes, keepdims=bool(int(node.attrs.get("keepdims", 1))))
    return [np.asarray(r, dtype=x.dtype)]


def _reduce_lower(ctx, node):
    ins = [ctx.val(n) if n else None for n in node.inputs]
    axes = _reduce_axes(node, ins)
    if axes is None:
        return ctx.alias(node.outputs[0], ctx.ref(node.inputs[0]))
    ctx.emit(_REDUCE[node.op][0], [ctx.ref(node.inputs[0])], [ctx.out(node)],
             {"axis": axes, "keepdims": bool(int(node.attrs.get("keepdims", 1)))})


register(list(_REDUCE), _reduce_infer, _reduce_fold, _reduce_lower)


# ---------------------------------------------------------------------------------------------- argmax
def _argmax_axis(node, ins):
    if int(node.attrs.get("select_last_index", 0)):
        raise unsupported(node, "select_last_index=1 is not supported (the first maximum is taken)")
    return norm_axis(node, int(node.attrs.get("axis", 0)), len(ins[0].shape))


def _argmax_infer(node, ins):
    x = ins[0]
    ax = _argmax_axis(node, ins)
    if x.shape[ax] == 0:
        raise shape_error(node, "data", x.shape, f"cannot take the argmax over empty axis {ax}")
    keep = int(node.attrs.get("keepdims", 1))
    return [(tuple((1 if i == ax else d) for i, d in enumerate(x.shape) if keep or i != ax), "int64")]


def _argmax_fold(node, ins):
    ax = _argmax_axis(node, ins)
    r = np.argmax(ins[0].const, axis=ax)
    if int(node.attrs.get("keepdims", 1)):
        r = np.expand_dims(r, ax)
    return [np.asarray(r, dtype=np.int64)]


def _argmax_lower(ctx, node):
    x = ctx.val(node.inputs[0])
    ctx.emit("argmax", [ctx.ref(node.inputs[0])], [ctx.out(node)],
             {"axis": _argmax_axis(node, [x]), "keepdims": bool(int(node.attrs.get("keepdims", 1)))})


register("ArgMax", _argmax_infer, _argmax_fold, _argmax_lower)


def _global_infer(node, ins):
    x = ins[0]
    if len(x.shape) < 3:
        raise shape_error(node, "X", x.shape, "needs [N, C, spatial...]")
    if x.dtype not in FLOATS:
        raise dtype_error(node, "X", x.dtype, FLOATS)
    return [(tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2), x.dtype)]


def _global_lower(ctx, node):
    x = ctx.val(node.inputs[0])
    kernel = "reduce_mean" if node.op == "GlobalAveragePool" else "reduce_max"
    ctx.emit(kernel, [ctx.ref(x.name)], [ctx.out(node)], {"axis": tuple(range(2, len(x.shape))), "keepdims": True})


register(["GlobalAveragePool", "GlobalMaxPool"], _global_infer, None, _global_lower)


# ---------------------------------------------------------------------------------------------- batch norm
def _bn_infer(node, ins):
    x = ins[0]
    if len(x.shape) < 2:
        raise shape_error(node, "X", x.shape, "needs [N, C, ...]")
    if x.dtype not in FLOATS:
        raise dtype_error(node, "X", x.dtype, FLOATS)
    if int(node.attrs.get("training_mode", 0)):
        raise unsupported(node, "training_mode=1 (vnpu compiles inference graphs)")
    for what, v in zip(("scale", "B", "input_mean", "input_var"), ins[1:5]):
        if v is None or tuple(v.shape) != (x.shape[1],):
            raise shape_error(node, what, None if v is None else v.shape, f"must be [C] = [{x.shape[1]}]")
    return [(tuple(x.shape), x.dtype)] + [((x.shape[1],), x.dtype)] * (len(node.outputs) - 1)


def _bn_lower(ctx, node):
    _no_extra_outputs(ctx, node, "running mean/var")
    x = ctx.val(node.inputs[0])
    params = []
    for name in node.inputs[1:5]:
        v = ctx.val(name)
        params.append(ctx.weight(v.const.astype(np.float32), name) if v.const is not None and v.dtype != x.dtype
                      and v.dtype != "float32" else ctx.ref(name))
    ctx.emit("batch_norm", [ctx.ref(x.name)] + params, [ctx.out(node)],
             {"eps": float(node.attrs.get("epsilon", 1e-5))})


register("BatchNormalization", _bn_infer, None, _bn_lower)


# ---------------------------------------------------------------------------------------------- conv / pools
def _spatial(node, x, what="X"):
    if len(x.shape) not in (3, 4):
        raise unsupported(node, f"{what} has shape {tuple(x.shape)}: vnpu runs 1-D and 2-D convolutions and pools "
                                "([N, C, L] or [N, C, H, W])")
    return tuple(x.shape[2:])


def _pair(node, key, nsp, default):
    v = node.attrs.get(key)
    v = [default] * nsp if v is None else [int(i) for i in v]
    if len(v) != nsp:
        raise shape_error(node, key, v, f"needs {nsp} values")
    return v


def _geometry(node, spatial, kernel, pool: bool):
    """(strides, pads [begin..., end...], dilations) for 1 or 2 spatial dims, auto_pad resolved."""
    nsp = len(spatial)
    strides = _pair(node, "strides", nsp, 1)
    dil = _pair(node, "dilations", nsp, 1)
    if any(s < 1 for s in strides) or any(d < 1 for d in dil):
        raise shape_error(node, "strides", strides, "strides and dilations must be >= 1")
    auto = node.attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if auto in ("NOTSET", ""):
        pads = _pair(node, "pads", 2 * nsp, 0)
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(spatial, kernel, strides, dil):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = begin + end
    else:
        raise unsupported(node, f"auto_pad={auto!r}")
    if any(p < 0 for p in pads):
        raise shape_error(node, "pads", pads, "pads must be >= 0")
    return strides, pads, dil


def _to2d(vals, fill):
    """1-D geometry as 2-D: an extra leading spatial dim of size 1."""
    return [fill] + list(vals)


def _conv_geometry(node, x, w):
    sp = _spatial(node, x)
    if len(w.shape) != len(x.shape):
        raise shape_error(node, "W", w.shape, f"must have {len(x.shape)} dims like X {tuple(x.shape)}")
    kernel = tuple(w.shape[2:])
    ks = node.attrs.get("kernel_shape")
    if ks is not None and tuple(int(k) for k in ks) != kernel:
        raise shape_error(node, "kernel_shape", ks, f"differs from the weight's {kernel}")
    g = int(node.attrs.get("group", 1))
    c, m = x.shape[1], w.shape[0]
    if g < 1 or c % g or m % g or w.shape[1] != c // g:
        raise shape_error(node, "W", w.shape, f"group={g} does not fit {c} input and {m} output channels")
    strides, pads, dil = _geometry(node, sp, kernel, False)
    nsp = len(sp)
    out = []
    for i in range(nsp):
        o = window_out(sp[i], kernel[i], strides[i], dil[i], pads[i], pads[nsp + i])
        if o < 1:
            raise shape_error(node, "X", x.shape, f"kernel {kernel} does not fit the padded input")
        out.append(o)
    return strides, pads, dil, g, tuple(out)


def _conv_infer(node, ins):
    x, w = ins[0], ins[1]
    if x.dtype not in FLOATS or w.dtype != x.dtype:
        raise dtype_error(node, "X", x.dtype, FLOATS)
    _, _, _, _, out = _conv_geometry(node, x, w)
    b = ins[2] if len(ins) > 2 else None
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise shape_error(node, "B", b.shape, f"must be [M] = [{w.shape[0]}]")
    return [((x.shape[0], w.shape[0]) + out, x.dtype)]


def _conv_lower(ctx, node):
    x, w = ctx.val(node.inputs[0]), ctx.val(node.inputs[1])
    strides, pads, dil, g, out_sp = _conv_geometry(node, x, w)
    xv, wv = ctx.ref(x.name), ctx.ref(w.name)
    out = ctx.out(node)
    if len(x.shape) == 3:                                   # 1-D: run as 2-D over [N, C, 1, L]
        xv = ctx.reshape(xv, (x.shape[0], x.shape[1], 1, x.shape[2]))
        wv = ctx.reshape(wv, (w.shape[0], w.shape[1], 1, w.shape[2]))
        ov = ctx.reshape(out, (x.shape[0], w.shape[0], 1, out_sp[0]))
        strides, dil = _to2d(strides, 1), _to2d(dil, 1)
        pads = [0, pads[0], 0, pads[1]]
    else:
        ov = out
    ins = [xv, wv] + ([ctx.ref(node.inputs[2])] if node.input(2) else [])
    ctx.emit("conv2d", ins, [ov], {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil),
                                   "groups": g, "act": node.attrs.get("act", "none")})


register(["Conv", "FusedConv"], _conv_infer, None, _conv_lower)


def _pool_geometry(node, x):
    sp = _spatial(node, x)
    ks = node.attrs.get("kernel_shape")
    if ks is None or len(ks) != len(sp):
        raise shape_error(node, "kernel_shape", ks, f"needs {len(sp)} values")
    kernel = tuple(int(k) for k in ks)
    strides, pads, dil = _geometry(node, sp, kernel, True)
    ceil = bool(int(node.attrs.get("ceil_mode", 0)))
    nsp = len(sp)
    out = []
    for i in range(nsp):
        if pads[i] >= dil[i] * (kernel[i] - 1) + 1 or pads[nsp + i] >= dil[i] * (kernel[i] - 1) + 1:
            raise shape_error(node, "pads", pads, "pads must be smaller than the window")
        o = window_out(sp[i], kernel[i], strides[i], dil[i], pads[i], pads[nsp + i], ceil)
        if o < 1:
            raise shape_error(node, "X", x.shape, f"window {kernel} does not fit the padded input")
        out.append(o)
    return kernel, strides, pads, dil, ceil, tuple(out)


def _pool_infer(node, ins):
    x = ins[0]
    if x.dtype not in FLOATS:
        raise dtype_error(node, "X", x.dtype, FLOATS)
    if int(node.attrs.get("storage_order", 0)):
        raise unsupported(node, "storage_order=1")
    out = _pool_geometry(node, x)[-1]
    return [(tuple(x.shape[:2]) + out, x.dtype)] + [(tuple(x.shape[:2]) + out, "int64")] * (len(node.outputs) - 1)


def _pool_lower(ctx, node):
    _no_extra_outputs(ctx, node, "Indices")
    x = ctx.val(node.inputs[0])
    kernel, strides, pads, dil, ceil, out_sp = _pool_geometry(node, x)
    xv, out = ctx.ref(x.name), ctx.out(node)
    if len(x.shape) == 3:
        xv = ctx.reshape(xv, (x.shape[0], x.shape[1], 1, x.shape[2]))
        out = ctx.reshape(out, (x.shape[0], x.shape[1], 1, out_sp[0]))
        kernel, strides, dil = _to2d(kernel, 1), _to2d(strides, 1), _to2d(dil, 1)
        pads = [0, pads[0], 0, pads[1]]
    attrs = {"kernel_shape": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads),
             "dilations": tuple(dil), "ceil_mode": ceil}
    if node.op == "AveragePool":
        attrs["count_include_pad"] = bool(int(node.attrs.get("count_include_pad", 0)))
    ctx.emit("max_pool2d" if node.op == "MaxPool" else "avg_pool2d", [xv], [out], attrs)


register(["MaxPool", "AveragePool"], _pool_infer, None, _pool_lower)

