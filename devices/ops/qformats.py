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


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte ``at`` of every block ``raw [..., bytes]`` as float32 ``[..., 1]``."""
    return np.ascontiguousarray(raw[..., at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``uint8 [..., n]`` -> ``uint8 [..., 2n]``: the low nibbles, then the high nibbles."""
    out = np.empty(qs.shape[:-1] + (2 * qs.shape[-1],), np.uint8)
    n = qs.shape[-1]
    np.bitwise_and(qs, 15, out=out[..., :n])
    np.right_shift(qs, 4, out=out[..., n:])
    return out


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


def block_terms(fmt: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A quantized matrix ``uint8 [N, row_bytes]`` as ``(q, scale, offset)`` over sub-blocks of 32:
    ``q uint8/int8 [N, S, 32]``, ``scale float32 [N, S, 1]``, ``offset float32 [N, S, 1]`` or None, with
    ``w = scale * q + offset``.  What the matmul kernel folds: the offset term is a small matmul of the
    activations' sub-block sums, so only ``scale * q`` is ever expanded."""
    f = GGUF_FORMATS[fmt]
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, f.block_bytes)
    if fmt == "q8_0":
        return blocks[..., 2:].view(np.int8), _f16(blocks, 0), None
    if fmt == "q4_1":
        return _nibbles(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2)
    # q4_k: 8 sub-blocks of 32 per 256
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    sc, mn = k4_scales(blocks[..., 4:16])
    nb = blocks.shape[1]
    q = _nibbles(blocks[..., 16:].reshape(n, nb, 4, 32))          # [n, nb, 4, 64]: sub-blocks 2j, 2j+1
    q = q.reshape(n, nb * 8, 32)
    scale = (d * sc).reshape(n, nb * 8, 1)
    off = -(dmin * mn).reshape(n, nb * 8, 1)
    return q, scale, off


def dequantize(fmt: str, raw: np.ndarray) -> np.ndarray:
    """float32 ``[N, K]`` of a quantized matrix ``uint8 [N, row_bytes]`` (``fmt`` in :data:`GGUF_FORMATS`)."""
    if fmt not in GGUF_FORMATS:
        raise InvalidParamError(f"unknown quantized format {fmt!r} (known: {', '.join(GGUF_FORMATS)})")
    raw = np.asarray(raw, np.uint8)
    n = raw.shape[0]
    q, scale, off = block_terms(fmt, raw.reshape(n, -1))
    w = q * scale
    if off is not None:
        w += off
    return w.reshape(n, -1)


# ---------------------------------------------------------------------------------------------- int8
def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 of ``w [N, K]``: ``(q int8 [N, K], scale float32 [N])`` with
    ``w ~= q * scale[:, None]`` (scale = max |row| / 127; an all-zero row gets scale 1)."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale
