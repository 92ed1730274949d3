"""Kernels on weights kept quantized in HBM (weight-only quantization, like CANN's
``WeightQuantBatchMatmulV2``): ``weight_quant_matmul`` and ``quant_embedding``.

Weights are ``[N, K]`` matrices (``transpose_b`` layout: one row per output feature) held as
``uint8 [N, row_bytes]`` blocks of a GGUF format (attr ``qtype`` = ``q8_0``, ``q4_1``, ``q4_k``), as the
same blocks repacked at upload into row-interleaved groups (``q8_0r``, ``q4_1r``, ``q4_kr``: see
:func:`.qformats.repack`; N a multiple of 32) or as ``int8 [N, K]`` with a float32 per-row scale input
(``qtype="int8"``).  A repacked weight of N rows has groups of :func:`.qformats.group_rows` (N)
rows; a block's (or a caller's) slice of rows is read with those groups.  Activations and outputs are float32 (or float16, computed in float32).

How it computes:

- repacked weights, at most :data:`FUSED_ROWS` activation rows (decode up to batch 16): one compiled loop
  (:mod:`.qfused`) quantizes the activations per 32 values to 8 bits (GGML's Q8_1) and takes exact integer
  dot products with the 4- or 8-bit quants, scaled per block -- llama.cpp's CPU numerics, not float32's
  (:mod:`.qfused` says how they differ); 64 (or 32) weight rows per SIMD lane group; nothing is expanded
  to memory;
- repacked weights, more rows (prefill): tiles of rows expanded to float32 by a compiled loop, each tile
  ONE BLAS call ``a' @ tile^T`` where ``a'`` are the activations quantized the same way
  (:func:`.qformats.q8_1_values`): the same numbers as the fused loops up to float32 summation order,
  so a token's result does not depend on how many rows its launch had;
- GGUF blocks as stored (activations quantized as above), int8 (float32 activations): tiles expanded by
  numpy, each tile sized to stay in a core's L2
  (:data:`TILE_BYTES` of float32) and ONE BLAS call.  Only ``scale * q`` is expanded; the offset term of
  the formats that have one (Q4_1's ``m``, Q4_K's mins) is a small matmul of the activations' 32-sums by
  the offsets.  The full float32 weight never exists.

Cost model: a cube task at the chip's INT8 rate over the quantized weights' bytes -- for a repacked
weight, the bytes of the GGUF format it was made from, so repacking does not change the modelled clock.
Blocks split the output features N (every block expands only its rows; repacked: whole groups).
"""
from __future__ import annotations

import numpy as np

from ..chip import Work
from ..errors import KernelError
from ..registry import builtin
from .blocks import as_rows
from .checks import FLOATS, ID_TYPES, arity, choice_attr, dtype_in, ndim_in, need, same_dtype, shape_is
from .precision import F16, F32, quiet
from .qformats import (GGUF_FORMATS, PACKED, ROWS, block_terms, from_planes, group_rows, half_scales,
                       packed_row_len, q8_1_values, to_planes)
from .work import io_bytes

QTYPES = tuple(GGUF_FORMATS) + tuple(PACKED) + ("int8",)
#: float32 bytes of one expanded weight tile: half of a core's L2 on the 2-core development machine
#: (1 MiB), so the tile is still in cache when the BLAS call reads it
TILE_BYTES = 512 << 10
#: at most this many activation rows, a repacked weight is computed on by the fused loop (no expansion);
#: more rows expand tiles for BLAS.  Measured on SmolLM2's weights (thread CPU time, 2-core machine): the
#: fused loop's time grows about linearly with the rows, the tile path's stays near its expansion cost;
#: they cross at 20-24 rows for the projections, 12-16 for the 49152-row LM head (docs/quantization.md)
FUSED_ROWS = 16


def _qtype(nm, attrs) -> str:
    return choice_attr(nm, attrs, "qtype", None, QTYPES)


def weight_k(nm: str, qtype: str, w) -> int:
    """Weights per row of quantized matrix ``w`` (a desc or an array)."""
    if qtype == "int8":
        return int(w.shape[-1])
    if qtype in PACKED:
        return packed_row_len(qtype, int(w.shape[-1]))
    return GGUF_FORMATS[qtype].row_len(int(w.shape[-1]))


def _weight_dtype(nm, qtype, w) -> None:
    dtype_in(nm, w, ("int8",) if qtype == "int8" else ("uint8",), f"{qtype} weight")
    need(qtype not in PACKED or w.shape[-2] % ROWS == 0, nm,
         f"a {qtype} weight has whole groups of {ROWS} rows, got {w.shape[-2]}")


def _check_wqmm(inputs, outputs, attrs):
    nm = "weight_quant_matmul"
    qt = _qtype(nm, attrs)
    extra = 1 if qt == "int8" else 0
    arity(nm, inputs, outputs, (2 + extra, 3 + extra))
    a, w, o = inputs[0], inputs[1], outputs[0]
    dtype_in(nm, a, FLOATS, "a")
    same_dtype(nm, ("a", a), ("output", o))
    _weight_dtype(nm, qt, w)
    ndim_in(nm, a, "a", 2, 2)
    ndim_in(nm, w, "weight", 2, 3)
    k = weight_k(nm, qt, w)
    need(k == a.shape[1], nm, f"inner dims differ: a {tuple(a.shape)}, {qt} weight of {k} per row")
    lead, n = tuple(w.shape[:-2]), w.shape[-2]
    if qt == "int8":
        dtype_in(nm, inputs[2], ("float32",), "antiquant_scale")
        shape_is(nm, inputs[2], lead + (n,), "antiquant_scale")
    if len(inputs) == 3 + extra:
        same_dtype(nm, ("a", a), ("bias", inputs[-1]))
        shape_is(nm, inputs[-1], (n,), "bias")
    shape_is(nm, o, lead + (a.shape[0], n))


def _wqmm_work(inputs, outputs, attrs):
    a, w = inputs[0], inputs[1]
    qt = attrs["qtype"]
    k = weight_k("weight_quant_matmul", qt, w)
    g = int(np.prod(w.shape[:-2], dtype=np.int64))
    nbytes = io_bytes(inputs, outputs)
    if qt in PACKED:                              # priced as the GGUF blocks it was repacked from
        nbytes += g * w.shape[-2] * GGUF_FORMATS[PACKED[qt]].row_bytes(k) - w.nbytes
    return Work(flops=2.0 * g * a.shape[0] * w.shape[-2] * k, bytes=nbytes, unit="cube", int8=True)


def _wqmm_pd(inputs, outputs, attrs):
    return outputs[0].shape[-1]


#: at most this many activation rows, a tile is expanded without its scales and the scales multiply the
#: per-sub-block partial products ``[S, M, n]`` (M x fewer multiplies than the tile has weights)
PARTIAL_ROWS = 8


def packed_matmul(a: np.ndarray, w: np.ndarray, qtype: str, out: np.ndarray, rows: int | None = None,
                  quantize_a: bool = True) -> None:
    """``out[M, N] = a[M, K] @ dequant(w)[N, K]^T`` (float32) on a repacked weight ``w [N, row bytes]``
    whose groups have ``rows`` rows (default :func:`.qformats.group_rows` (N); a slice of a matrix passes
    the matrix's): the fused loop for at most :data:`FUSED_ROWS` rows (``quantize_a``: on activations
    quantized to 8 bits, llama.cpp's numerics; else on float32 activations), else tiles of whole groups
    expanded by the compiled loop and one BLAS call each (on the activations quantized the same way, unless
    not ``quantize_a``).  Blocks the calling thread."""
    from . import qfused
    m, k = a.shape
    n = w.shape[0]
    r = group_rows(n) if rows is None else rows
    q4, half = qtype != "q8_0r", half_scales(qtype)
    wg = np.ascontiguousarray(w).reshape(n // r, -1)
    a = np.ascontiguousarray(a, F32)
    if m <= FUSED_ROWS:
        dst = out if out.flags.c_contiguous else np.empty((m, n), F32)
        if quantize_a:
            dot = qfused.q4_dot if q4 else qfused.q8_dot
        else:
            dot = qfused.q4_dot_f32 if q4 else qfused.q8_dot_f32
        dot(a, wg, half, 0, n // r, dst)
        if dst is not out:
            out[...] = dst
        return
    if quantize_a:
        a = q8_1_values(a)
    groups = max(1, TILE_BYTES // (4 * k * r))
    tile = np.empty((k, min(groups, n // r) * r), F32)                   # transposed: [K, rows]
    for g0 in range(0, n // r, groups):
        g1 = min(n // r, g0 + groups)
        t = tile if (g1 - g0) * r == tile.shape[1] else np.empty((k, (g1 - g0) * r), F32)
        qfused.expand(wg, q4, half, g0, g1, t)
        out[:, g0 * r:g1 * r] = a @ t


def qmatmul(a: np.ndarray, w: np.ndarray, qtype: str, out: np.ndarray, scale: np.ndarray | None = None) -> None:
    """``out[M, N] = a[M, K] @ dequant(w)[N, K]^T`` (float32), expanding ``w`` tile by tile of rows.

    int8: each tile converted, one BLAS call, the per-row scales applied to the output columns.  GGUF
    blocks: each tile's quants converted to float32 in the planes of :func:`.qformats.block_terms` (the
    activations permuted to match once per call); for a few rows (decode) batched BLAS calls give the
    partial products of every sub-block, scaled and summed per row; for many rows (prefill) the tile is
    scaled in place and multiplied by one BLAS call.  The offsets (Q4_1's ``m``, Q4_K's mins) add
    ``sums32(a) @ offset^T``."""
    m, k = a.shape
    n = w.shape[0]
    rows = max(1, TILE_BYTES // (4 * k))
    tile = np.empty((min(rows, n), k), F32)
    gguf = qtype != "int8"
    partial = gguf and m <= PARTIAL_ROWS
    ap = to_planes(qtype, a) if gguf else a                                   # [M, P, S', L]
    a_sub = [np.ascontiguousarray(ap[:, p].transpose(1, 0, 2)) for p in range(ap.shape[1])] if partial else None
    a_flat = ap.reshape(m, k) if gguf else a
    asums = None
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        t = tile[:r1 - r0]
        if not gguf:
            np.copyto(t, w[r0:r1], casting="unsafe")
            res = a @ t.T
            res *= scale[r0:r1]
        else:
            q, sc, off = block_terms(qtype, w[r0:r1])
            t4 = t.reshape(q.shape)
            np.copyto(t4, q, casting="unsafe")
            if partial:
                res = np.zeros((m, r1 - r0), F32)
                for p, a_p in enumerate(a_sub):
                    prod = np.matmul(a_p, t4[:, p].transpose(1, 2, 0))          # [S', M, n]
                    res += np.einsum("smn,ns->mn", prod, sc[:, p if sc.shape[1] > 1 else 0])
            else:
                t4 *= sc[..., None]
                res = a_flat @ t.T
            if off is not None:
                if asums is None:
                    asums = a.reshape(m, -1, 32).sum(axis=2)                      # [M, K/32]
                res += asums @ off.T
        out[:, r0:r1] = res


@builtin("weight_quant_matmul", unit="cube", check=_check_wqmm, work=_wqmm_work, parallel_dim=_wqmm_pd)
@quiet
def _wqmm_run(ctx, inputs, outputs, attrs):
    """out[M,N] = a[M,K] @ dequant(weight)[N,K]^T (+ bias[N]); a 3-D weight [G,N,.] gives out[G,M,N]
    (each g with the same a).  attr qtype: q8_0, q4_1, q4_k (weight uint8 GGUF blocks), q8_0r, q4_1r,
    q4_kr (the blocks repacked by qformats.repack) or int8 (weight int8 [.., N, K] and an
    antiquant_scale float32 [.., N] input before the bias)"""
    qt = attrs["qtype"]
    a, w, out = inputs[0], inputs[1], outputs[0]
    if qt in PACKED and len(inputs) == 2 and ctx.block_dim == 1 and w.ndim == 2 and a.shape[0] <= FUSED_ROWS \
            and a.dtype == F32 and out.dtype == F32 and a.flags.c_contiguous and w.flags.c_contiguous \
            and out.flags.c_contiguous:          # decode's common launch: straight to the fused loop
        from . import qfused
        n = w.shape[0]
        r = group_rows(n)
        (qfused.q8_dot if qt == "q8_0r" else qfused.q4_dot)(a, w.reshape(n // r, -1), half_scales(qt), 0, n // r, out)
        return
    scale = inputs[2] if qt == "int8" else None
    bias = inputs[-1] if len(inputs) == (4 if qt == "int8" else 3) else None
    n = w.shape[-2]
    lo, hi = 0, n
    rows = group_rows(n) if qt in PACKED else 1
    if ctx.block_dim > 1:
        step = rows                                         # repacked: whole row groups
        r = ctx.split(n // step)
        if not r:
            return
        lo, hi = r.start * step, r.stop * step
    a32 = a.astype(F32) if a.dtype == F16 else a
    if qt in GGUF_FORMATS:                                  # llama.cpp's numerics (see packed_matmul)
        a32 = q8_1_values(a32)
    w3 = w.reshape((-1,) + w.shape[-2:])
    o3 = out.reshape((-1,) + out.shape[-2:])
    if qt in PACKED and w3.shape[0] > 1 and a32.shape[0] == 1 and (lo, hi) == (0, n) and bias is None \
            and o3.dtype == F32 and o3.flags.c_contiguous and w3.flags.c_contiguous:
        # one row on stacked weights (gate|up at batch 1): the stack is one matrix of G N rows (whole
        # groups of the same size) and out [G, 1, N] its one output row -- one loop call, one quantization
        packed_matmul(a32, w3.reshape(-1, w3.shape[-1]), qt, o3.reshape(1, -1), rows)
        return
    s2 = None if scale is None else scale.reshape(-1, n)
    for g in range(w3.shape[0]):
        o = o3[g, :, lo:hi]
        dst = o if o.dtype == F32 else np.empty(o.shape, F32)
        if qt in PACKED:
            packed_matmul(a32, w3[g, lo:hi], qt, dst, rows)
        else:
            qmatmul(a32, w3[g, lo:hi], qt, dst, None if s2 is None else s2[g, lo:hi])
        if bias is not None:
            dst += bias[lo:hi]
        if dst is not o:
            np.copyto(o, dst, casting="same_kind")


def _check_qembedding(inputs, outputs, attrs):
    nm = "quant_embedding"
    qt = _qtype(nm, attrs)
    arity(nm, inputs, outputs, 3 if qt == "int8" else 2)
    table, ids, o = inputs[0], inputs[1], outputs[0]
    _weight_dtype(nm, qt, table)
    ndim_in(nm, table, "table", 2, 2)
    dtype_in(nm, ids, ID_TYPES, "ids")
    dtype_in(nm, o, ("float32",), "output")
    if qt == "int8":
        dtype_in(nm, inputs[2], ("float32",), "antiquant_scale")
        shape_is(nm, inputs[2], (table.shape[0],), "antiquant_scale")
    shape_is(nm, o, tuple(ids.shape) + (weight_k(nm, qt, table),))


def _qembedding_work(inputs, outputs, attrs):
    row = inputs[0].nbytes // max(1, inputs[0].shape[0])
    return Work(flops=outputs[0].numel, bytes=inputs[1].nbytes + inputs[1].numel * row + outputs[0].nbytes,
                unit="vector")


@builtin("quant_embedding", unit="vector", check=_check_qembedding, work=_qembedding_work,
         parallel_dim=lambda i, o, a: i[1].numel, gathers=(0,))
@quiet
def _qembedding_run(ctx, inputs, outputs, attrs):
    """out[*S, K] = dequant(table)[ids] (float32); attr qtype as weight_quant_matmul's (int8: an
    antiquant_scale [V] input follows the ids; repacked: a compiled row gather); an id outside [0, V) is a
    KernelError"""
    qt = attrs["qtype"]
    table, ids = inputs[0], inputs[1]
    v = table.shape[0]
    k = outputs[0].shape[-1]
    ids1 = ids.reshape(-1)
    o2 = as_rows(outputs[0], k, True)
    base = 0
    if ctx.block_dim > 1:
        r = ctx.split(ids1.size)
        if not r:
            return
        ids1, o2, base = ids1[r.start:r.stop], o2[r.start:r.stop], r.start
    if ids1.size == 0:
        return
    bad = np.flatnonzero((ids1 < 0) | (ids1 >= v))
    if bad.size:
        raise KernelError(f"quant_embedding: id {int(ids1[bad[0]])} at flat index {base + int(bad[0])} is outside "
                          f"the table's [0, {v}) rows ({bad.size} bad id(s) in block {ctx.block_idx})")
    if qt in PACKED:
        from .qfused import gather
        dst = o2 if o2.flags.c_contiguous else np.empty(o2.shape, F32)
        gather(np.ascontiguousarray(table).reshape(v // group_rows(v), -1), qt != "q8_0r", half_scales(qt),
               ids1.astype(np.int64), dst)
        if dst is not o2:
            o2[...] = dst
        return
    rows = np.take(table, ids1, axis=0)
    if qt == "int8":
        np.multiply(rows, inputs[2][ids1][:, None], out=o2)
        return
    q, sc, off = block_terms(qt, rows)
    w = from_planes(qt, q * sc[..., None])
    if off is not None:
        w = (w.reshape(w.shape[0], -1, 32) + off[..., None]).reshape(w.shape)
    o2[...] = w
