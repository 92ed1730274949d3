"""Strided views of a flat buffer: ``strided_gather`` reads one into a contiguous tensor, ``strided_scatter``
writes a contiguous tensor into one in place (what a framework's non-contiguous views -- a transposed
weight, a slice of a KV cache, ``x[:, 0] = y`` -- need from the device).

The view is described like ``torch.as_strided``: attrs ``size`` and ``stride`` (elements, one per axis,
strides >= 0) and ``offset`` (elements from the buffer's start).  The buffer is the kernel's flat 1-D
operand (input 0 of the gather, output 0 of the scatter); every element the view names must lie inside
it, checked at launch (InvalidParamError).  Blocks split the view's elements (row-major).  The scatter
leaves the buffer's other elements untouched; a view whose elements overlap (a zero stride) is written
in element order, the last write wins, as numpy assignment does.
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..registry import builtin
from .blocks import block_boxes, numel, out_numel
from .checks import ANY, arity, dtype_in, is_int, need, same_dtype, shape_is
from .work import vector_work


def _view_attrs(nm, attrs, buffer) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    size, stride, off = attrs.get("size"), attrs.get("stride"), attrs.get("offset", 0)
    need(isinstance(size, (tuple, list)) and all(is_int(i) and i >= 0 for i in size), nm,
         f"attr 'size' must be a tuple of non-negative ints, got {size!r}")
    need(isinstance(stride, (tuple, list)) and len(stride) == len(size) and all(is_int(i) and i >= 0 for i in stride),
         nm, f"attr 'stride' must be {len(size)} non-negative ints, got {stride!r}")
    need(is_int(off) and off >= 0, nm, f"attr 'offset' must be a non-negative int, got {off!r}")
    need(len(buffer.shape) == 1, nm, f"the buffer must be 1-D, got shape {tuple(buffer.shape)}")
    size, stride, off = tuple(int(i) for i in size), tuple(int(i) for i in stride), int(off)
    if numel(size):
        last = off + sum((n - 1) * s for n, s in zip(size, stride))
        need(last < buffer.shape[0], nm, f"the view (size {size}, stride {stride}, offset {off}) reaches element "
                                         f"{last} of a {buffer.shape[0]}-element buffer")
    return size, stride, off


def _view(buf: np.ndarray, size, stride, off) -> np.ndarray:
    item = buf.itemsize
    return np.lib.stride_tricks.as_strided(buf[off:], shape=size, strides=tuple(s * item for s in stride))


def _check_gather(inputs, outputs, attrs):
    nm = "strided_gather"
    arity(nm, inputs, outputs, 1)
    dtype_in(nm, inputs[0], ANY, "buffer")
    same_dtype(nm, ("buffer", inputs[0]), ("output", outputs[0]))
    size, _stride, _off = _view_attrs(nm, attrs, inputs[0])
    shape_is(nm, outputs[0], size)


@builtin("strided_gather", unit="vector", check=_check_gather, work=vector_work(0), parallel_dim=out_numel,
         gathers=(0,))
def _gather_run(ctx, inputs, outputs, attrs):
    """out = as_strided(buffer, size, stride, offset) (buffer 1-D; out contiguous of shape ``size``)"""
    size, stride, off = _view_attrs("strided_gather", attrs, inputs[0])
    view, out = _view(inputs[0], size, stride, off), outputs[0]
    if out.ndim == 0:
        if ctx.block_idx == 0:
            out[...] = view
        return
    for box in block_boxes(ctx, out.shape):
        b = box + (Ellipsis,)
        np.copyto(out[b], view[b])


def _check_scatter(inputs, outputs, attrs):
    nm = "strided_scatter"
    arity(nm, inputs, outputs, 1)
    dtype_in(nm, outputs[0], ANY, "buffer")
    same_dtype(nm, ("source", inputs[0]), ("buffer", outputs[0]))
    size, _stride, _off = _view_attrs(nm, attrs, outputs[0])
    shape_is(nm, inputs[0], size, "source")


def _scatter_pd(inputs, outputs, attrs) -> int:
    return inputs[0].numel


def _scatter_work(inputs, outputs, attrs):
    n = inputs[0].nbytes
    return Work(flops=0.0, bytes=2 * n, unit="vector")


@builtin("strided_scatter", unit="vector", check=_check_scatter, work=_scatter_work, parallel_dim=_scatter_pd,
         scatters=(0,))
def _scatter_run(ctx, inputs, outputs, attrs):
    """In place: as_strided(buffer, size, stride, offset)[...] = source (source contiguous of shape
    ``size``; the buffer's other elements keep their values)"""
    size, stride, off = _view_attrs("strided_scatter", attrs, outputs[0])
    src = inputs[0]
    view = _view(outputs[0], size, stride, off)
    if src.ndim == 0 or ctx.block_dim == 1:
        if ctx.block_idx == 0:
            view[...] = src
        return
    for box in block_boxes(ctx, src.shape):
        b = box + (Ellipsis,)
        view[b] = src[b]
