"""Compiled loops (numba) over the row-interleaved quantized layouts of :mod:`.qformats` (``q8_0r``,
``q4_1r``, ``q4_kr``): the fused dequantise-and-dot of a few activation rows (decode), the expansion of a
tile of rows to float32 (prefill: the caller multiplies the tile with one BLAS call) and the row gather of
an embedding.

Layout of one group of R = :func:`~.qformats.group_rows` (N) weight rows (64, or 32 when 64 do not
divide N), ``NB = K / 32`` blocks each (bytes, in
this order): the quants ``[NB, L, R]`` (q8: ``int8``, L = 32, weight ``32 b + j``; q4: ``uint8``, L = 16,
low nibble weight ``32 b + j``, high nibble ``32 b + 16 + j``), the scales ``[NB, R]`` and, for q4, the
offsets ``[NB, R]``: ``w[r, 32 b + j] = scale[b, r] * q + offset[b, r]``.  Scales and offsets are fp16
(``half``: Q8_0's and Q4_1's own, so the layout has the GGUF file's bytes) or float32 (Q4_K's products
of a super-block scale and a 6-bit one need 17 bits); the loops convert a group's fp16 scales to
float32 once (a bit-level conversion, exact, subnormals included).  Lanes are
rows, so the innermost loop runs over R rows with contiguous loads and no horizontal sums (what
llama.cpp's CPU backend gets by interleaving rows of blocks when it repacks them).

Numerics of the fused loops :func:`q4_dot` / :func:`q8_dot` (llama.cpp's CPU numerics, its
``vec_dot_q4_1_q8_1`` / ``vec_dot_q8_0_q8_0``): each activation row is first quantized per 32 values like
GGML's Q8_1 (:func:`quantize_rows`: ``da = amax / 127``, ``aq = rint(a * 127 / amax)`` in [-127, 127],
ties to even as llama.cpp's AVX2 path, and ``sa = da * sum(aq)``); each block's dot product is then an
exact integer sum ``sum(q * aq)`` (16-bit lanes: the 4-bit quants enter as ``q - 8``, so 32 products stay
within int16; Q8_0 pairs of products are widened to int32), scaled in float32:
``d * da * isum + offset * sa`` per block (Q4_K: per 32-weight sub-block with its ``d * sc`` and
``-dmin * m``, where llama.cpp quantizes activations per 256 as Q8_K).  The result equals the float64
product of the dequantised weight and the *quantized* activations ``da * aq`` up to float32 rounding of
the per-block terms; against float32 activations it differs by the activations' quantization (relative
~1e-3 of a dot product's magnitude).  A NaN or inf in a 32-block of activations makes that row's outputs
NaN.  :func:`q4_dot_f32` / :func:`q8_dot_f32` keep the float32-activation loops (results equal to a
float32 matmul of the dequantised weight up to summation order), as the tiles of prefill do.

Everything here blocks the calling thread; nothing touches device state.  The first
call of each loop in a process compiles it (``cache=True``: later processes load the compiled code from
``__pycache__``); :func:`compile_all` does that up front and returns the seconds it took.
"""
from __future__ import annotations

import time

import numpy as np
from numba import njit

from ..errors import InvalidParamError
from .qformats import PACKED, ROWS, group_rows, half_scales, packed_row_len

_F32 = np.float32
#: reassociation (sums vectorize) and fused multiply-add; not the no-NaN / no-inf flags: a NaN or inf in
#: the activations comes out as it would from numpy
_FAST = {"reassoc", "contract"}
_LOW = np.uint8(15)
_HIGH = np.uint8(0xF0)
_FOUR = np.uint8(4)
_SIXTEENTH = np.float32(1 / 16)


@njit(cache=True, fastmath=_FAST, nogil=True)
def _block_sums(a):
    m_, k = a.shape
    nb = k // 32
    s = np.empty((m_, nb), np.float32)
    for m in range(m_):
        for b in range(nb):
            t = np.float32(0)
            for j in range(32):
                t += a[m, 32 * b + j]
            s[m, b] = t
    return s


_MAGIC = np.float32(2.0 ** 112)


@njit(cache=True, nogil=True)
def _scales(grp, start, n, half, bits_i, bits_f, dst):
    """``dst[:n] =`` the ``n`` scales at byte ``start`` of ``grp`` as float32 (``half``: fp16 bit patterns;
    ``bits_f`` is ``bits_i`` viewed as float32).  fp16 -> float32 by bits: the exponent and mantissa moved
    to float32's places and the value rescaled by 2**112 (exact, subnormals included); inf / NaN kept."""
    if not half:
        dst[:n] = grp[start:start + 4 * n].view(np.float32)
        return
    h16 = grp[start:start + 2 * n].view(np.uint16)
    for i in range(n):
        bits_i[i] = (np.int32(h16[i]) & 0x7FFF) << 13
    for i in range(n):
        h = np.int32(h16[i])
        v = bits_f[i] * _MAGIC
        if (h & 0x7C00) == 0x7C00:
            v = np.float32(np.inf) if (h & 0x3FF) == 0 else np.float32(np.nan)
        dst[i] = -v if h & 0x8000 else v


@njit(cache=True, nogil=True, inline="always")
def _layout(wg, k, q4, half):
    """``(nb, rr, qb, sb)`` of a repacked group of ``wg [G, group bytes]`` for rows of ``k`` values: blocks of 32
    per row, rows per group (``R``; computed from the group's bytes, a run-time trip count: LLVM vectorizes the
    lane loops over it instead of unrolling them into scalar code), the quants' bytes (16 a block's row for
    q4, 32 for q8) and one scale array's bytes (fp16 or float32); q4 groups hold a second scale array (the
    offsets) after the first.  Inlined into its callers (numba ``inline="always"``): called, it cost the q4
    decode loop ~5 % at one row."""
    nb = k // 32
    lanes = 16 if q4 else 32
    sz = 2 if half else 4
    rr = wg.shape[1] // (nb * (lanes + (2 if q4 else 1) * sz))
    return nb, rr, nb * lanes * rr, nb * rr * sz


@njit(cache=True, nogil=True, inline="always")
def _scale_buffers(n):
    """``(bits_i, bits_f, d1, m1)``: :func:`_scales`' bit buffer and its float32 view, and room for ``n`` scales
    and ``n`` offsets for it to fill."""
    bits_i = np.empty(n, np.int32)
    return bits_i, bits_i.view(np.float32), np.empty(n, np.float32), np.empty(n, np.float32)


@njit(cache=True, fastmath=_FAST, nogil=True)
def q4_dot_f32(a, wg, half, g0, g1, out):
    """``out[M, R (g1 - g0)] = a[M, K] @ W^T`` for the q4 groups ``g0 .. g1`` of ``wg [G, group bytes]``,
    float32 activations."""
    m_, k = a.shape
    nb, rr, qb, sb = _layout(wg, k, True, half)
    asum = _block_sums(a)
    s = np.empty((m_, rr), np.float32)
    acc = np.empty((m_, rr), np.float32)
    lo = np.empty(rr, np.float32)
    hi = np.empty(rr, np.float32)
    bits_i, bits_f, d1, m1 = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    mn = m1.reshape((nb, rr))
    for g in range(g0, g1):
        grp = wg[g]
        qs = grp[:qb].reshape((nb, 16, rr))
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        _scales(grp, qb + sb, nb * rr, half, bits_i, bits_f, m1)
        acc[:] = 0
        for b in range(nb):
            s[:] = 0
            for j in range(16):                 # the high nibble as 16 q (a byte mask, no widening shift)
                qj = qs[b, j]                   # times a / 16: the same product, exactly
                if m_ == 1:
                    a0 = a[0, 32 * b + j]
                    a1 = a[0, 32 * b + 16 + j] * _SIXTEENTH
                    for r in range(rr):
                        q = qj[r]
                        s[0, r] += np.float32(q & _LOW) * a0 + np.float32(q & _HIGH) * a1
                else:
                    for r in range(rr):
                        q = qj[r]
                        lo[r] = np.float32(q & _LOW)
                        hi[r] = np.float32(q & _HIGH)
                    for m in range(m_):
                        a0 = a[m, 32 * b + j]
                        a1 = a[m, 32 * b + 16 + j] * _SIXTEENTH
                        for r in range(rr):
                            s[m, r] += lo[r] * a0 + hi[r] * a1
            db = d[b]
            mb = mn[b]
            for m in range(m_):
                sm = asum[m, b]
                for r in range(rr):
                    acc[m, r] += db[r] * s[m, r] + mb[r] * sm
        c0 = rr * (g - g0)
        for m in range(m_):
            for r in range(rr):
                out[m, c0 + r] = acc[m, r]


@njit(cache=True, fastmath=_FAST, nogil=True)
def q8_dot_f32(a, wg, half, g0, g1, out):
    """``out[M, R (g1 - g0)] = a[M, K] @ W^T`` for the q8 groups ``g0 .. g1`` of ``wg [G, group bytes]``,
    float32 activations."""
    m_, k = a.shape
    nb, rr, qb, _ = _layout(wg, k, False, half)
    s = np.empty((m_, rr), np.float32)
    acc = np.empty((m_, rr), np.float32)
    wf = np.empty(rr, np.float32)
    bits_i, bits_f, d1, _ = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    for g in range(g0, g1):
        grp = wg[g]
        qs = grp[:qb].view(np.int8).reshape((nb, 32, rr))
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        acc[:] = 0
        for b in range(nb):
            s[:] = 0
            for j in range(32):
                qj = qs[b, j]
                if m_ == 1:
                    a0 = a[0, 32 * b + j]
                    for r in range(rr):
                        s[0, r] += np.float32(qj[r]) * a0
                else:
                    for r in range(rr):
                        wf[r] = np.float32(qj[r])
                    for m in range(m_):
                        a0 = a[m, 32 * b + j]
                        for r in range(rr):
                            s[m, r] += wf[r] * a0
            db = d[b]
            for m in range(m_):
                for r in range(rr):
                    acc[m, r] += db[r] * s[m, r]
        c0 = rr * (g - g0)
        for m in range(m_):
            for r in range(rr):
                out[m, c0 + r] = acc[m, r]


_BIG = np.float32(np.inf)
_Q8 = np.float32(127)


@njit(cache=True, nogil=True)
def quantize_rows(a, aq, da, sa):
    """Activations ``a [M, K]`` quantized per 32 values like GGML's Q8_1: ``aq int16 [M, K]`` in
    [-127, 127], ``da [M, K/32] = amax / 127`` and ``sa [M, K/32] = da * sum(aq)`` (no fast-math: the
    quants are the ones llama.cpp's AVX2 quantization gives, bit for bit).  A block holding a NaN or inf
    gets ``aq = 0`` and ``da = sa = NaN``."""
    m_, k = a.shape
    for m in range(m_):
        for b in range(k // 32):
            amax = np.float32(0)
            bad = False
            for j in range(32):
                v = abs(a[m, 32 * b + j])
                bad = bad or not v < _BIG
                if v > amax:
                    amax = v
            t = 0
            if bad:
                for j in range(32):
                    aq[m, 32 * b + j] = 0
                da[m, b] = np.float32(np.nan)
                sa[m, b] = np.float32(np.nan)
                continue
            inv = _Q8 / amax if amax > 0 else np.float32(0)
            for j in range(32):
                q = np.int16(np.rint(a[m, 32 * b + j] * inv))
                aq[m, 32 * b + j] = q
                t += q
            d = amax / _Q8
            da[m, b] = d
            sa[m, b] = d * np.float32(t)


@njit(cache=True, fastmath=_FAST, nogil=True)
def q4_dot(a, wg, half, g0, g1, out):
    """``out[M, R (g1 - g0)] = a[M, K] @ W^T`` for the q4 groups ``g0 .. g1`` of ``wg [G, group bytes]``:
    activations quantized per 32 (:func:`quantize_rows`), exact int16 sums of ``(q - 8) * aq`` per block
    (at most 32 * 8 * 127 = 32512), then ``d * da * isum + (offset + 8 d) * sa`` in float32."""
    m_, k = a.shape
    nb, rr, qb, sb = _layout(wg, k, True, half)
    aq = np.empty((m_, k), np.int16)
    da = np.empty((m_, nb), np.float32)
    sa = np.empty((m_, nb), np.float32)
    quantize_rows(a, aq, da, sa)
    s = np.empty((m_, rr), np.int16)
    acc = np.empty((m_, rr), np.float32)
    lo = np.empty(rr, np.int16)
    hi = np.empty(rr, np.int16)
    bits_i, bits_f, d1, m1 = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    mn = m1.reshape((nb, rr))
    for g in range(g0, g1):
        grp = wg[g]
        qs = grp[:qb].reshape((nb, 16, rr))
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        _scales(grp, qb + sb, nb * rr, half, bits_i, bits_f, m1)
        for i in range(nb * rr):
            m1[i] += 8 * d1[i]                  # offset + 8 d: the quants enter as q - 8
        acc[:] = 0
        for b in range(nb):
            s[:] = 0
            for j in range(16):
                qj = qs[b, j]
                if m_ == 1:
                    a0 = aq[0, 32 * b + j]
                    a1 = aq[0, 32 * b + 16 + j]
                    for r in range(rr):
                        q = np.int16(qj[r])
                        s[0, r] += ((q & 15) - 8) * a0 + ((q >> 4) - 8) * a1
                else:
                    for r in range(rr):
                        q = np.int16(qj[r])
                        lo[r] = (q & 15) - 8
                        hi[r] = (q >> 4) - 8
                    for m in range(m_):
                        a0 = aq[m, 32 * b + j]
                        a1 = aq[m, 32 * b + 16 + j]
                        for r in range(rr):
                            s[m, r] += lo[r] * a0 + hi[r] * a1
            db = d[b]
            mb = mn[b]
            for m in range(m_):
                dm = da[m, b]
                sm = sa[m, b]
                for r in range(rr):
                    acc[m, r] += db[r] * (dm * np.float32(s[m, r])) + mb[r] * sm
        c0 = rr * (g - g0)
        for m in range(m_):
            for r in range(rr):
                out[m, c0 + r] = acc[m, r]


@njit(cache=True, fastmath=_FAST, nogil=True)
def q8_dot(a, wg, half, g0, g1, out):
    """``out[M, R (g1 - g0)] = a[M, K] @ W^T`` for the q8 groups ``g0 .. g1`` of ``wg [G, group bytes]``:
    activations quantized per 32 (:func:`quantize_rows`), exact int32 sums of ``q * aq`` per block (pairs
    of products in int16: at most 2 * 128 * 127 = 32512), then ``d * da * isum`` in float32."""
    m_, k = a.shape
    nb, rr, qb, _ = _layout(wg, k, False, half)
    aq = np.empty((m_, k), np.int16)
    da = np.empty((m_, nb), np.float32)
    sa = np.empty((m_, nb), np.float32)
    quantize_rows(a, aq, da, sa)
    s = np.empty((m_, rr), np.int32)
    acc = np.empty((m_, rr), np.float32)
    w0 = np.empty(rr, np.int16)
    w1 = np.empty(rr, np.int16)
    bits_i, bits_f, d1, _ = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    for g in range(g0, g1):
        grp = wg[g]
        qs = grp[:qb].view(np.int8).reshape((nb, 32, rr))
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        acc[:] = 0
        for b in range(nb):
            s[:] = 0
            for j in range(0, 32, 2):
                q0 = qs[b, j]
                q1 = qs[b, j + 1]
                if m_ == 1:
                    a0 = aq[0, 32 * b + j]
                    a1 = aq[0, 32 * b + j + 1]
                    for r in range(rr):
                        s[0, r] += np.int32(np.int16(q0[r]) * a0 + np.int16(q1[r]) * a1)
                else:
                    for r in range(rr):
                        w0[r] = q0[r]
                        w1[r] = q1[r]
                    for m in range(m_):
                        a0 = aq[m, 32 * b + j]
                        a1 = aq[m, 32 * b + j + 1]
                        for r in range(rr):
                            s[m, r] += np.int32(w0[r] * a0 + w1[r] * a1)
            db = d[b]
            for m in range(m_):
                dm = da[m, b]
                for r in range(rr):
                    acc[m, r] += db[r] * (dm * np.float32(s[m, r]))
        c0 = rr * (g - g0)
        for m in range(m_):
            for r in range(rr):
                out[m, c0 + r] = acc[m, r]


@njit(cache=True, fastmath=_FAST, nogil=True)
def expand(wg, q4, half, g0, g1, tile_t):
    """float32 weights of groups ``g0 .. g1`` into ``tile_t [K, R (g1 - g0)]``: transposed (column ``c``
    is weight row ``R g0 + c``), so both the quants' reads and the tile's writes run along the rows."""
    k = tile_t.shape[0]
    nb, rr, qb, sb = _layout(wg, k, q4, half)
    bits_i, bits_f, d1, m1 = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    mn = m1.reshape((nb, rr))
    for g in range(g0, g1):
        grp = wg[g]
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        c0 = rr * (g - g0)
        if q4:
            _scales(grp, qb + sb, nb * rr, half, bits_i, bits_f, m1)
            qs = grp[:qb].reshape((nb, 16, rr))
            for b in range(nb):
                db = d[b]
                mb = mn[b]
                for j in range(16):
                    qj = qs[b, j]
                    lo = tile_t[32 * b + j]
                    hi = tile_t[32 * b + 16 + j]
                    for r in range(rr):
                        lo[c0 + r] = db[r] * np.float32(qj[r] & _LOW) + mb[r]
                        hi[c0 + r] = db[r] * np.float32(qj[r] >> _FOUR) + mb[r]
        else:
            q8 = grp[:qb].view(np.int8).reshape((nb, 32, rr))
            for b in range(nb):
                db = d[b]
                for j in range(32):
                    qj = q8[b, j]
                    row = tile_t[32 * b + j]
                    for r in range(rr):
                        row[c0 + r] = db[r] * np.float32(qj[r])


@njit(cache=True, fastmath=_FAST, nogil=True)
def gather(wg, q4, half, ids, out):
    """``out[i] = W[ids[i]]`` (float32, natural order); ids already checked to be in range."""
    k = out.shape[1]
    nb, rr, qb, sb = _layout(wg, k, q4, half)
    bits_i, bits_f, d1, m1 = _scale_buffers(nb * rr)
    d = d1.reshape((nb, rr))
    mn = m1.reshape((nb, rr))
    for i in range(ids.shape[0]):
        g = ids[i] // rr
        r = ids[i] % rr
        grp = wg[g]
        _scales(grp, qb, nb * rr, half, bits_i, bits_f, d1)
        row = out[i]
        if q4:
            _scales(grp, qb + sb, nb * rr, half, bits_i, bits_f, m1)
            qs = grp[:qb].reshape((nb, 16, rr))
            for b in range(nb):
                for j in range(16):
                    q = qs[b, j, r]
                    row[32 * b + j] = d[b, r] * np.float32(q & _LOW) + mn[b, r]
                    row[32 * b + 16 + j] = d[b, r] * np.float32(q >> _FOUR) + mn[b, r]
        else:
            q8 = grp[:qb].view(np.int8).reshape((nb, 32, rr))
            for b in range(nb):
                for j in range(32):
                    row[32 * b + j] = d[b, r] * np.float32(q8[b, j, r])


def dequantize_packed(qtype: str, w: np.ndarray) -> np.ndarray:
    """float32 ``[N, K]`` (natural row order) of a repacked matrix ``uint8 [N, packed_row_bytes]``."""
    if qtype not in PACKED:
        raise InvalidParamError(f"unknown repacked format {qtype!r} (known: {', '.join(PACKED)})")
    w = np.ascontiguousarray(w, np.uint8)
    n = w.shape[0]
    r = group_rows(n)
    out = np.empty((packed_row_len(qtype, w.shape[1]), n), np.float32)
    expand(w.reshape(n // r, -1), qtype != "q8_0r", half_scales(qtype), 0, n // r, out)
    return np.ascontiguousarray(out.T)


def compile_all() -> float:
    """Compile (or load from the cache) every loop for the argument types the kernels pass; returns the
    seconds it took (blocks the host)."""
    t0 = time.perf_counter()
    k = 32
    for q4, lanes in ((True, 16), (False, 32)):
        for half in (True, False):
            sz = 2 if half else 4
            wg = np.zeros((1, ROWS * (k // 32) * (lanes + (2 if q4 else 1) * sz)), np.uint8)
            a = np.zeros((1, k), _F32)
            for dot in ((q4_dot, q4_dot_f32) if q4 else (q8_dot, q8_dot_f32)):
                dot(a, wg, half, 0, 1, np.empty((1, ROWS), _F32))
            expand(wg, q4, half, 0, 1, np.empty((k, ROWS), _F32))
            gather(wg, q4, half, np.zeros(1, np.int64), np.empty((1, k), _F32))
    return time.perf_counter() - t0
