"""CNN kernels, NCHW: conv2d (groups, strides, pads, dilations, a fused activation), max_pool2d and
avg_pool2d (ceil_mode, count_include_pad), batch_norm (inference), and :func:`window_out` (the sliding
window arithmetic the compiler shares).

Blocks split the output rows ``N * Ho`` (conv2d), the ``N * C`` planes (pools) or the output's elements
(batch_norm).  Float16 accumulates in float32.
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..registry import builtin
from .activations import ACTIVATIONS, apply_activation
from .blocks import apply_elementwise, out_numel
from .checks import (FLOATS, arity, bool_attr, choice_attr, dtype_in, int_attr, is_int, ndim_in, need, num_attr,
                     same_dtype, shape_is)
from .precision import F64, compute_dtype, quiet
from .work import cube_work, io_bytes, vector_work


def _pair_attr(nm, attrs, key, default, lo=1):
    v = attrs.get(key, default)
    need(isinstance(v, (tuple, list)) and len(v) == 2 and all(is_int(i) and i >= lo for i in v), nm,
         f"attr {key!r} must be 2 ints >= {lo}, got {v!r}")
    return int(v[0]), int(v[1])


def _pads_attr(nm, attrs):
    v = attrs.get("pads", (0, 0, 0, 0))
    need(isinstance(v, (tuple, list)) and len(v) == 4 and all(is_int(i) and i >= 0 for i in v), nm,
         f"attr 'pads' must be 4 ints >= 0 (top, left, bottom, right), got {v!r}")
    return tuple(int(i) for i in v)


def window_out(n, k, stride, dil, pad_lo, pad_hi, ceil=False) -> int:
    """Output length of a sliding window (ONNX/PyTorch rules; with ceil the last window must start
    inside the input or its leading pad)."""
    span = dil * (k - 1) + 1
    room = n + pad_lo + pad_hi - span
    if room < 0:
        return 0
    out = (-(-room // stride) if ceil else room // stride) + 1
    if ceil and (out - 1) * stride >= n + pad_lo:
        out -= 1
    return out


def _check_conv2d(inputs, outputs, attrs):
    nm = "conv2d"
    arity(nm, inputs, outputs, (2, 3))
    x, w, o = inputs[0], inputs[1], outputs[0]
    ndim_in(nm, x, "x", 4, 4)
    ndim_in(nm, w, "weight", 4, 4)
    dtype_in(nm, x, FLOATS, "x")
    same_dtype(nm, ("x", x), ("weight", w), ("output", o))
    g = int_attr(nm, attrs, "groups", 1)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    need(g >= 1 and c % g == 0 and m % g == 0, nm, f"groups {g} must divide input channels {c} and output "
                                                   f"channels {m}")
    need(cg == c // g, nm, f"weight shape {tuple(w.shape)} needs C/groups = {c // g} input channels, has {cg}")
    if len(inputs) == 3:
        same_dtype(nm, ("x", x), ("bias", inputs[2]))
        shape_is(nm, inputs[2], (m,), "bias")
    sh, sw = _pair_attr(nm, attrs, "strides", (1, 1))
    dh, dw = _pair_attr(nm, attrs, "dilations", (1, 1))
    pt, pl, pb, pr = _pads_attr(nm, attrs)
    choice_attr(nm, attrs, "act", "none", tuple(ACTIVATIONS))
    ho, wo = window_out(h, kh, sh, dh, pt, pb), window_out(wd, kw, sw, dw, pl, pr)
    need(ho >= 1 and wo >= 1, nm, f"kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit the padded input "
                                  f"{h + pt + pb}x{wd + pl + pr}")
    shape_is(nm, o, (n, m, ho, wo))


def _conv_pd(inputs, outputs, attrs):
    return outputs[0].shape[0] * outputs[0].shape[2]


def _conv_work(inputs, outputs, attrs):
    m, cg, kh, kw = inputs[1].shape
    n, _, ho, wo = outputs[0].shape
    return cube_work(inputs, outputs, 2.0 * n * m * ho * wo * cg * kh * kw)


def _padded_rows(xn, r0, r1, pl, pr, ct):
    """Rows [r0, r1) of the zero-padded image ``xn`` [C, H, W] (r0 may be < 0, r1 > H), padded left/right."""
    c, h, w = xn.shape
    slab = np.zeros((c, r1 - r0, w + pl + pr), ct)
    a, b = max(r0, 0), min(r1, h)
    if b > a:
        slab[:, a - r0:b - r0, pl:pl + w] = xn[:, a:b]
    return slab


def _windows(slab, kh, kw, sh, sw, dh, dw, rows, cols):
    """[C, rows, cols, kh, kw] strided view of the sliding windows of ``slab``."""
    sv = np.lib.stride_tricks.sliding_window_view(slab, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(1, 2))
    return sv[:, ::sh, ::sw, ::dh, ::dw][:, :rows, :cols]


@builtin("conv2d", unit="cube", check=_check_conv2d, work=_conv_work, parallel_dim=_conv_pd)
@quiet
def _conv2d_run(ctx, inputs, outputs, attrs):
    """2-D convolution, NCHW: x [N,C,H,W], weight [M,C/groups,kh,kw], optional bias [M]; attrs strides,
    pads (top, left, bottom, right), dilations, groups, act (as fused_matmul's).  Float16 accumulates in
    float32.  Blocks split the output rows N*Ho."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    out = outputs[0]
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    g = int(attrs.get("groups", 1))
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    ho, wo = out.shape[2], out.shape[3]
    ct = compute_dtype(out.dtype)
    wf = w.astype(ct) if w.dtype != ct else w
    bf = None if bias is None else (bias.astype(ct) if bias.dtype != ct else bias)
    act = attrs.get("act", "none")
    rows = range(n * ho) if ctx.block_dim == 1 else ctx.split(n * ho)
    i = rows.start
    while i < rows.stop:
        b, h0 = divmod(i, ho)
        h1 = min(ho, h0 + rows.stop - i)
        i += h1 - h0
        slab = _padded_rows(x[b], h0 * sh - pt, (h1 - 1) * sh - pt + dh * (kh - 1) + 1, pl, pr, ct)
        win = _windows(slab, kh, kw, sh, sw, dh, dw, h1 - h0, wo)           # [C, r, Wo, kh, kw]
        if g == 1:
            res = np.tensordot(wf, win, axes=([1, 2, 3], [0, 3, 4]))       # [M, r, Wo]
        else:
            res = np.einsum("gmckl,gcrwkl->gmrw", wf.reshape(g, m // g, cg, kh, kw),
                            win.reshape((g, cg) + win.shape[1:]), optimize=True).reshape(m, h1 - h0, wo)
        if bf is not None:
            res += bf[:, None, None]
        apply_activation(res, act)
        np.copyto(out[b, :, h0:h1], res, casting="same_kind")


def _check_pool(nm, avg):
    def check(inputs, outputs, attrs):
        arity(nm, inputs, outputs, 1)
        x, o = inputs[0], outputs[0]
        ndim_in(nm, x, "x", 4, 4)
        dtype_in(nm, x, FLOATS, "x")
        same_dtype(nm, ("x", x), ("output", o))
        kh, kw = _pair_attr(nm, attrs, "kernel_shape", None)
        sh, sw = _pair_attr(nm, attrs, "strides", (1, 1))
        dh, dw = _pair_attr(nm, attrs, "dilations", (1, 1))
        pt, pl, pb, pr = _pads_attr(nm, attrs)
        need(pt < dh * (kh - 1) + 1 and pb < dh * (kh - 1) + 1 and pl < dw * (kw - 1) + 1 and
             pr < dw * (kw - 1) + 1, nm, f"pads {(pt, pl, pb, pr)} must be smaller than the window")
        ceil = bool_attr(nm, attrs, "ceil_mode")
        if avg:
            bool_attr(nm, attrs, "count_include_pad")
        n, c, h, w = x.shape
        ho, wo = window_out(h, kh, sh, dh, pt, pb, ceil), window_out(w, kw, sw, dw, pl, pr, ceil)
        need(ho >= 1 and wo >= 1, nm, f"window {kh}x{kw} does not fit the padded input {h + pt + pb}x{w + pl + pr}")
        shape_is(nm, o, (n, c, ho, wo))
    return check


def _pool_pd(inputs, outputs, attrs):
    return outputs[0].shape[0] * outputs[0].shape[1]


def _pool_work(inputs, outputs, attrs):
    kh, kw = attrs["kernel_shape"]
    return Work(flops=float(outputs[0].numel * kh * kw), bytes=io_bytes(inputs, outputs), unit="vector")


def _pool_geometry(x, out, attrs):
    kh, kw = attrs["kernel_shape"]
    sh, sw = attrs.get("strides", (1, 1))
    dh, dw = attrs.get("dilations", (1, 1))
    pt, pl, pb, pr = attrs.get("pads", (0, 0, 0, 0))
    h, w = x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    eb = max(pb, (ho - 1) * sh + dh * (kh - 1) + 1 - h - pt)     # bottom/right incl. ceil_mode's extra
    er = max(pr, (wo - 1) * sw + dw * (kw - 1) + 1 - w - pl)
    return (kh, kw, sh, sw, dh, dw), (pt, pl, pb, pr), (eb, er), (ho, wo)


def _pool_run(avg):
    def run(ctx, inputs, outputs, attrs):
        x, out = inputs[0], outputs[0]
        win, (pt, pl, pb, pr), (eb, er), (ho, wo) = _pool_geometry(x, out, attrs)
        kh, kw, sh, sw, dh, dw = win
        n, c, h, w = x.shape
        ct = compute_dtype(out.dtype)
        planes = x.reshape(n * c, h, w)
        o3 = out.reshape((n * c, ho, wo), copy=False)
        r = range(n * c) if ctx.block_dim == 1 else ctx.split(n * c)
        if not r:
            return
        fill = 0.0 if avg else -np.inf
        slab = np.full((len(r), pt + h + eb, pl + w + er), fill, ct)
        slab[:, pt:pt + h, pl:pl + w] = planes[r.start:r.stop]
        v = _windows(slab, kh, kw, sh, sw, dh, dw, ho, wo)                 # [planes, Ho, Wo, kh, kw]
        if not avg:
            np.copyto(o3[r.start:r.stop], v.max(axis=(3, 4)), casting="same_kind")
            return
        mask = np.zeros((1,) + slab.shape[1:], ct)
        if attrs.get("count_include_pad", False):
            mask[:, :pt + h + pb, :pl + w + pr] = 1          # explicit pads count, ceil_mode's extra does not
        else:
            mask[:, pt:pt + h, pl:pl + w] = 1
        cnt = _windows(mask, kh, kw, sh, sw, dh, dw, ho, wo).sum(axis=(3, 4))
        s = v.sum(axis=(3, 4))
        np.divide(s, cnt, out=s)
        np.copyto(o3[r.start:r.stop], s, casting="same_kind")
    return run


_MAXPOOL = _pool_run(False)
_MAXPOOL.__doc__ = "Max pooling, NCHW; attrs kernel_shape, strides, pads (top, left, bottom, right), dilations, ceil_mode"
_AVGPOOL = _pool_run(True)
_AVGPOOL.__doc__ = ("Average pooling, NCHW; attrs kernel_shape, strides, pads, dilations, ceil_mode, "
                    "count_include_pad (the extra windows of ceil_mode never count padding)")
builtin("max_pool2d", unit="vector", check=_check_pool("max_pool2d", False), work=_pool_work,
        parallel_dim=_pool_pd)(quiet(_MAXPOOL))
builtin("avg_pool2d", unit="vector", check=_check_pool("avg_pool2d", True), work=_pool_work,
        parallel_dim=_pool_pd)(quiet(_AVGPOOL))


def _check_batch_norm(inputs, outputs, attrs):
    nm = "batch_norm"
    arity(nm, inputs, outputs, 5)
    x, o = inputs[0], outputs[0]
    ndim_in(nm, x, "x", 2)
    dtype_in(nm, x, FLOATS, "x")
    same_dtype(nm, ("x", x), ("output", o))
    c = x.shape[1]
    for what, p in zip(("scale", "bias", "mean", "var"), inputs[1:]):
        shape_is(nm, p, (c,), what)
        need(p.dtype in (x.dtype, "float32"), nm, f"{what} dtype {p.dtype} must be the input's ({x.dtype}) or float32")
    shape_is(nm, o, x.shape)
    eps = num_attr(nm, attrs, "eps", 1e-5)
    need(eps >= 0, nm, f"attr 'eps' must be >= 0, got {eps!r}")


@builtin("batch_norm", unit="vector", check=_check_batch_norm, work=vector_work(2), parallel_dim=out_numel)
@quiet
def _batch_norm_run(ctx, inputs, outputs, attrs):
    """Inference batch norm over channel axis 1: (x - mean) / sqrt(var + eps) * scale + bias (inputs x,
    scale, bias, mean, var; attr eps)"""
    x, scale, bias, mean, var = inputs
    out = outputs[0]
    ct = compute_dtype(out.dtype)
    a = scale.astype(F64) / np.sqrt(var.astype(F64) + float(attrs.get("eps", 1e-5)))
    b = bias.astype(F64) - mean.astype(F64) * a
    shape = (x.shape[1],) + (1,) * (x.ndim - 2)
    a, b = a.astype(ct).reshape(shape), b.astype(ct).reshape(shape)

    def fn(xv, av, bv, out):
        if out.dtype == ct:
            np.multiply(xv, av, out=out)
            out += bv
        else:
            np.copyto(out, xv.astype(ct) * av + bv, casting="same_kind")
    apply_elementwise(ctx, fn, (x, a, b), out)
