"""Quantized weight layouts and their dequantization, in numpy: the GGUF block formats Q8_0, Q4_1 and Q4_K
(rows of raw ``uint8`` blocks, as a GGUF file stores them) and int8 per-channel (``int8`` rows with one
float32 scale per output row, what ``vnpu atc --quant int8`` writes).

A quantized matrix ``[N, K]`` is held as ``uint8 [N, K / block * block_bytes]``: each row is K/block
consecutive blocks, so a row slice is a row slice of the bytes and rows of different matrices concatenate.
Block layouts (little-endian; GGML's, read from the format's definition, not from any code):

- ``q8_0``: 32 weights in 34 bytes: fp16 scale ``d``, 32 int8 ``q``; ``w = d * q``.
- ``q4_1``: 32 weights in 20 bytes: fp16 ``d``, fp16 ``m``, 16 bytes whose low nibbles are weights 0..15
  and high nibbles weights 16..31; ``w = d * q + m``.
- ``q4_k``: 256 weights in 144 bytes: fp16 ``d``, fp16 ``dmin``, 12 bytes of eight 6-bit (scale, min)
  pairs, 128 bytes of nibbles (each 32 bytes: low nibbles are sub-block 2j, high nibbles 2j+1);
  ``w = d * sc_j * q - dmin * m_j``.

Nothing here touches device memory; the kernels (:mod:`.quant`) call these on tiles of rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidParamError


@dataclass(frozen=True)
class QFormat:
    name: str
    block: int          #: weights per block
    block_bytes: int    #: bytes per block

    def row_bytes(self, k: int) -> int:
        if k % self.block:
            raise InvalidParamError(f"{self.name}: a row of {k} weights is not a whole number of "
                                    f"{self.block}-weight blocks")
        return k // self.block * self.block_bytes

    def row_len(self, nbytes: int) -> int:
        """Weights in a row of ``nbytes`` bytes."""
        if nbytes % self.block_bytes:
            raise InvalidParamError(f"{self.name}: a row of {nbytes} bytes is not a whole number of "
                                    f"{self.block_bytes}-byte blocks")
        return nbytes // self.block_bytes * self.block


#: the block formats a kernel computes on, by the name a launch's ``qtype`` attribute gives
GGUF_FORMATS: dict[str, QFormat] = {f.name: f for f in (QFormat("q8_0", 32, 34), QFormat("q4_1", 32, 20),
                                                         QFormat("q4_k", 256, 144))}
#: GGUF tensor type names (``GGMLQuantizationType``) of the formats above
GGUF_TYPE_NAMES = {"Q8_0": "q8_0", "Q4_1": "q4_1", "Q4_K": "q4_k"}


_F16_TABLE: np.ndarray | None = None

#: each block as a record: numpy gathers a field of every block in ONE strided pass of whole items (a
#: byte slice of the blocks would cost a loop run per block and per operation)
_RECORDS = {"q8_0": np.dtype([("d", "<u2"), ("qs", "V32")]),
            "q4_1": np.dtype([("dm", "<u4"), ("qs", "V16")]),
            "q4_k": np.dtype([("dd", "<u4"), ("sc", "V12"), ("qs", "V128")])}


def _field(raw: np.ndarray, fmt: str, name: str, dtype) -> np.ndarray:
    """Field ``name`` of every block of ``raw [N, row_bytes]`` as a contiguous ``[N, S, ...]`` of ``dtype``."""
    rec = raw.view(_RECORDS[fmt])                        # [N, S] records
    f = np.ascontiguousarray(rec[name])
    return f.view(dtype).reshape(rec.shape + (-1,))


def _f16(bits: np.ndarray) -> np.ndarray:
    """fp16 bit patterns (uint16) as float32, by a lookup in a 65536-entry table (numpy's fp16 cast is
    several times slower)."""
    global _F16_TABLE
    if _F16_TABLE is None:
        _F16_TABLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return np.take(_F16_TABLE, bits)


_LOW = np.uint32(0x0F0F0F0F)
_FOUR = np.uint32(4)


def _nibbles(words: np.ndarray, inner: tuple[int, ...]) -> np.ndarray:
    """Payload ``uint32 [N, S, W]`` (contiguous) -> ``uint8 [N, 2, S, *inner]``: plane 0 the low nibbles of
    its bytes, plane 1 the high ones (32-bit operations: the masks keep every byte's nibble in place)."""
    n = words.shape[0]
    out = np.empty((n, 2) + words.shape[1:], np.uint32)
    np.bitwise_and(words, _LOW, out=out[:, 0])
    np.right_shift(words, _FOUR, out=out[:, 1])
    np.bitwise_and(out[:, 1], _LOW, out=out[:, 1])
    return out.view(np.uint8).reshape((n, 2, words.shape[1]) + inner)


def k4_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes ``[..., 12]`` -> (scales, mins) ``uint8 [..., 8]`` (6 bits each): pairs 0..3 are the
    low 6 bits of bytes 0..3 / 4..7; pairs 4..7 take their low 4 bits from bytes 8..11 (scale: low nibble,
    min: high nibble) and their top 2 bits from the top bits of bytes 0..3 / 4..7."""
    s = np.empty(sc.shape[:-1] + (8,), np.uint8)
    m = np.empty_like(s)
    s[..., :4] = sc[..., 0:4] & 63
    m[..., :4] = sc[..., 4:8] & 63
    s[..., 4:] = (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)
    m[..., 4:] = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    return s, m


def _natural(fmt: str, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """How a row's ``k`` weights (natural order) fold into the format's planes: the shape to reshape them
    to and the axes that make it ``(P, S', L)`` (see :func:`block_terms`)."""
    if fmt == "q8_0":
        return (1, k // 32, 32), (0, 1, 2)
    if fmt == "q4_1":                              # weight 32 s + 16 p + j: plane p, sub-block s, lane j
        return (k // 32, 2, 16), (1, 0, 2)
    return (k // 256, 4, 2, 32), (2, 0, 1, 3)      # q4_k: weight 256 b + 64 c + 32 p + j


def to_planes(fmt: str, x: np.ndarray) -> np.ndarray:
    """``x [M, K]`` (natural order) as ``[M, P, S', L]`` in the order of :func:`block_terms`' quants (a
    copy): what the activations of a matmul are permuted to, once per call."""
    m, k = x.shape
    shape, axes = _natural(fmt, k)
    y = x.reshape((m,) + shape).transpose((0,) + tuple(1 + a for a in axes))
    return np.ascontiguousarray(y).reshape(m, 2 if fmt != "q8_0" else 1, -1, 16 if fmt == "q4_1" else 32)


def from_planes(fmt: str, y: np.ndarray) -> np.ndarray:
    """The inverse of :func:`to_planes`: ``[N, P, S', L]`` -> ``[N, K]`` in natural order."""
    n = y.shape[0]
    k = y[0].size
    shape, axes = _natural(fmt, k)
    planes = tuple(shape[a] for a in axes)
    inv = tuple(int(i) for i in np.argsort(axes))
    return np.ascontiguousarray(y.reshape((n,) + planes).transpose((0,) + tuple(1 + a for a in inv))).reshape(n, k)


def block_terms(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A quantized matrix ``uint8 [N, row_bytes]`` as ``(q, scale, offset)``: ``q uint8/int8 [N, P, S',
    L]`` (P planes of S' sub-blocks of L lanes, the order :func:`to_planes` gives the activations),
    ``scale float32 [N, P or 1, S']`` (per sub-block, broadcast over the planes when 1) and ``offset
    float32 [N, K/32]`` (per 32 weights in natural order) or None:
    ``w = from_planes(q * scale) + offset`` repeated over each 32.  Planes keep every step on
    contiguous runs: Q4_1's low nibbles are weights 0..15 of each block, its high nibbles 16..31; Q4_K's
    are its sub-blocks 2c and 2c+1.  The matmul kernel folds the offset term into a small matmul of the
    activations' 32-sums and applies the scale to the tile or to the per-sub-block partial products."""
    n = raw.shape[0]
    raw = np.ascontiguousarray(raw).reshape(n, -1)
    nb = raw.shape[1] // GGUF_FORMATS[fmt].block_bytes
    if fmt == "q8_0":
        q = _field(raw, fmt, "qs", np.int8)
        return q[:, None], _f16(_field(raw, fmt, "d", np.uint16))[:, None, :, 0], None
    if fmt == "q4_1":
        dm = _f16(_field(raw, fmt, "dm", np.uint16))
        return _nibbles(_field(raw, fmt, "qs", np.uint32), (16,)), dm[:, None, :, 0], dm[..., 1]
    # q4_k: 8 sub-blocks of 32 per 256; each 32 bytes of nibbles are sub-blocks 2c (low) and 2c+1 (high)
    dd = _f16(_field(raw, fmt, "dd", np.uint16))
    sc, mn = k4_scales(_field(raw, fmt, "sc", np.uint8))
    q = _nibbles(_field(raw, fmt, "qs", np.uint32), (4, 32))
    scale = (dd[..., :1] * sc).reshape(n, nb, 4, 2).transpose(0, 3, 1, 2).reshape(n, 2, nb * 4)
    off = -(dd[..., 1:] * mn).reshape(n, nb * 8)
    return q.reshape(n, 2, nb * 4, 32), scale, off


def dequantize(fmt: str, raw: np.ndarray) -> np.ndarray:
    """float32 ``[N, K]`` of a quantized matrix ``uint8 [N, row_bytes]`` (``fmt`` in :data:`GGUF_FORMATS`)."""
    if fmt not in GGUF_FORMATS:
        raise InvalidParamError(f"unknown quantized format {fmt!r} (known: {', '.join(GGUF_FORMATS)})")
    raw = np.asarray(raw, np.uint8)
    n = raw.shape[0]
    q, scale, off = block_terms(fmt, raw.reshape(n, -1))
    w = from_planes(fmt, q * scale[..., None])
    if off is not None:
        w = (w.reshape(n, -1, 32) + off[..., None]).reshape(n, -1)
    return w


# ------------------------------------------------------------------------------ row-interleaved (repacked)
#: rows of the smallest group of the repacked layouts (the lanes of :mod:`.qfused`'s loops): a repacked
#: matrix has a whole number of them
ROWS = 32
#: rows of a group when the matrix's row count allows it (:func:`group_rows`): the integer loops of
#: :mod:`.qfused` run their 16-bit lanes 64 at a time (LLVM's vector loop is 4 x 16 lanes; over 32 rows it
#: would run only its 8-lane remainder loop)
WIDE_ROWS = 64
#: the repacked layouts, by the GGUF format each is made from (what a weight uploaded for the fused kernels
#: holds; the cost model still prices the source format's bytes)
PACKED: dict[str, str] = {"q8_0r": "q8_0", "q4_1r": "q4_1", "q4_kr": "q4_k"}


#: bytes per 32 weights of a row: quants + scale (+ offset); q8_0r and q4_1r keep the file's fp16 scales
#: (the GGUF block size), q4_kr float32 ones (Q4_K's d * sc needs 17 bits)
_PER32 = {"q8_0r": 32 + 2, "q4_1r": 16 + 2 * 2, "q4_kr": 16 + 2 * 4}


def group_rows(n: int) -> int:
    """Rows per group of a repacked matrix of ``n`` rows: :data:`WIDE_ROWS` when they divide ``n``, else
    :data:`ROWS`.  A function of the row count alone, so every reader of a matrix finds its groups from its
    shape; a slice of rows is read with the groups of the matrix it was cut from."""
    return WIDE_ROWS if n % WIDE_ROWS == 0 else ROWS


def half_scales(qtype: str) -> bool:
    """Whether repacked layout ``qtype`` holds fp16 scales (else float32)."""
    return qtype != "q4_kr"


def packed_row_bytes(qtype: str, k: int) -> int:
    """Bytes per row of ``k`` weights in repacked layout ``qtype``: 1 (q8) or 1/2 (q4) byte per weight, a
    scale per 32 and, for q4, an offset per 32 (fp16 for q8_0r / q4_1r, float32 for q4_kr)."""
    if k % 32:
        raise InvalidParamError(f"{qtype}: a row of {k} weights is not a whole number of 32-weight blocks")
    return k // 32 * _PER32[qtype]


def packed_row_len(qtype: str, nbytes: int) -> int:
    """Weights in a row of ``nbytes`` bytes of repacked layout ``qtype`` (inverse of :func:`packed_row_bytes`)."""
    per = _PER32[qtype]
    if nbytes % per:
        raise InvalidParamError(f"{qtype}: a row of {nbytes} bytes is not a whole number of {per}-byte blocks")
    return nbytes // per * 32


def _natural_terms(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``raw [N, row_bytes]`` as (quants ``[N, K]`` natural order, scale ``float32 [N, K/32]``, offset
    ``float32 [N, K/32]`` or None): ``w = scale * q + offset`` per 32 weights (Q4_K's ``d * sc`` and
    ``-dmin * m`` are exact in float32)."""
    n = raw.shape[0]
    q, scale, off = block_terms(fmt, raw)
    qn = from_planes(fmt, q)
    if fmt == "q4_k":                                        # [N, 2, nb*4] planes -> sub-block 8b + 2c + p
        nb = scale.shape[2] // 4
        sc = scale.reshape(n, 2, nb, 4).transpose(0, 2, 3, 1).reshape(n, nb * 8)
    else:
        sc = scale.reshape(n, -1)
    return qn, np.ascontiguousarray(sc, np.float32), off


def repack(fmt: str, raw: np.ndarray) -> tuple[str, np.ndarray]:
    """GGUF blocks ``uint8 [N, row_bytes]`` (N a multiple of :data:`ROWS`) as the row-interleaved layout
    of :mod:`.qfused`: ``(qtype, uint8 [N, packed_row_bytes])`` -- the array's byte rows are no longer the
    weight rows: every R = :func:`group_rows` (N) of them hold one group (quants ``[NB, L, R]``, then the
    scales ``[NB, R]`` and, for q4, the offsets; fp16 for Q8_0 and Q4_1, so the bytes are the file's,
    float32 for Q4_K).  Lossless (the dequantised weights are equal)."""
    if fmt not in GGUF_FORMATS:
        raise InvalidParamError(f"unknown quantized format {fmt!r} (known: {', '.join(GGUF_FORMATS)})")
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.shape[0]
    if n % ROWS:
        raise InvalidParamError(f"repack: {n} rows is not a whole number of {ROWS}-row groups")
    qn, sc, off = _natural_terms(fmt, raw)
    k = qn.shape[1]
    rows = group_rows(n)
    nb, g = k // 32, n // rows
    if fmt == "q8_0":
        qs = qn.astype(np.int8, copy=False).reshape(n, nb, 32).view(np.uint8)
    else:                                                    # one byte: weights j (low) and 16 + j (high)
        q = qn.reshape(n, nb, 2, 16).astype(np.uint8)
        qs = q[:, :, 0] | (q[:, :, 1] << 4)

    def lanes(x: np.ndarray) -> np.ndarray:                  # [N, NB, ...] -> [G, NB, ..., rows] bytes
        x = x.reshape((g, rows) + x.shape[1:])
        return np.ascontiguousarray(np.moveaxis(x, 1, -1)).view(np.uint8).reshape(g, -1)

    qtype = fmt + "r"
    st = np.float16 if half_scales(qtype) else np.float32   # fp16 values are exact: the file's own
    parts = [lanes(qs), lanes(sc.astype(st))] + ([] if off is None else [lanes(np.asarray(off).astype(st))])
    return qtype, np.concatenate(parts, axis=1).reshape(n, packed_row_bytes(qtype, k))


# ------------------------------------------------------------------------------ activations (GGML's Q8_1)
def q8_1_values(a: np.ndarray) -> np.ndarray:
    """Activations ``a [M, K]`` (K a multiple of 32) as the kernels on GGUF weights compute with them,
    llama.cpp's way: quantized per 32 values like GGML's Q8_1 -- ``d = amax / 127``,
    ``q = rint(a * (127 / amax))`` in float32 (ties to even), value ``q * d`` (float32).  The same
    quants as :func:`.qfused.quantize_rows` gives the fused loops; a block holding a NaN or inf is NaN."""
    a = np.asarray(a, np.float32)
    b = a.reshape(a.shape[0], -1, 32)
    amax = np.abs(b).max(axis=2, keepdims=True)
    with np.errstate(invalid="ignore"):
        inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
        v = np.rint(b * inv) * (amax / np.float32(127))
    v[~np.isfinite(amax[..., 0])] = np.nan
    return v.reshape(a.shape)


# ---------------------------------------------------------------------------------------------- int8
def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of ``w [N, K]``: ``(q int8 [N, K], scale float32 [N])`` with
    ``w ~= q * scale[:, None]`` (scale = max |row| / 127; an all-zero row gets scale 1)."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale
