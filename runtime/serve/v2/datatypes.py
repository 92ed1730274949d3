"""The Open Inference Protocol's tensor datatypes, one table: each name (``FP32``...) with its numpy
dtype (little-endian, as the protocol's binary data is), the repeated field of ``InferTensorContents`` that
carries it over gRPC, and the model-configuration enum name (``TYPE_FP32``).  ``BYTES`` tensors are numpy
object arrays of :class:`bytes`; their binary form is each element as a 4-byte little-endian length and
its bytes (:func:`pack_bytes` / :func:`unpack_bytes`).  ``BF16`` is not served (numpy has no such type).
Pure data and functions; nothing blocks."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..engine.errors import InvalidRequest


@dataclass(frozen=True)
class Datatype:
    name: str                #: the protocol's name ("FP32")
    dtype: np.dtype          #: numpy dtype (object for BYTES)
    contents: str            #: the InferTensorContents field that carries it ("" for raw-only FP16)
    config: str              #: model configuration's DataType enum name ("TYPE_FP32")


def _t(name: str, dtype, contents: str, config: str) -> Datatype:
    return Datatype(name, np.dtype(dtype), contents, config)


#: the protocol's datatypes by name
DATATYPES: dict[str, Datatype] = {d.name: d for d in (
    _t("BOOL", np.bool_, "bool_contents", "TYPE_BOOL"),
    _t("UINT8", "<u1", "uint_contents", "TYPE_UINT8"),
    _t("UINT16", "<u2", "uint_contents", "TYPE_UINT16"),
    _t("UINT32", "<u4", "uint_contents", "TYPE_UINT32"),
    _t("UINT64", "<u8", "uint64_contents", "TYPE_UINT64"),
    _t("INT8", "<i1", "int_contents", "TYPE_INT8"),
    _t("INT16", "<i2", "int_contents", "TYPE_INT16"),
    _t("INT32", "<i4", "int_contents", "TYPE_INT32"),
    _t("INT64", "<i8", "int64_contents", "TYPE_INT64"),
    _t("FP16", "<f2", "", "TYPE_FP16"),
    _t("FP32", "<f4", "fp32_contents", "TYPE_FP32"),
    _t("FP64", "<f8", "fp64_contents", "TYPE_FP64"),
    _t("BYTES", object, "bytes_contents", "TYPE_STRING"),
)}

#: numpy dtype -> protocol name (native byte order); str arrays are BYTES too
_BY_DTYPE = {d.dtype.newbyteorder("="): d.name for d in DATATYPES.values()}


def datatype(name: str, param: str = "datatype") -> Datatype:
    """The datatype called ``name`` (400 for an unknown one)."""
    d = DATATYPES.get(name) if isinstance(name, str) else None
    if d is None:
        known = ", ".join(DATATYPES)
        raise InvalidRequest(f"unknown datatype {name!r} (the protocol's datatypes served here: {known})", param)
    return d


def datatype_of(arr: np.ndarray) -> str:
    """The protocol's name for ``arr``'s dtype (``BYTES`` for object and str arrays)."""
    if arr.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_DTYPE.get(arr.dtype.newbyteorder("="))
    if name is None:
        raise TypeError(f"numpy dtype {arr.dtype} has no Open Inference Protocol datatype")
    return name


def pack_bytes(arr: np.ndarray) -> bytes:
    """A BYTES tensor (elements :class:`bytes` or :class:`str`, utf-8) flattened row-major, each element
    as a 4-byte little-endian length and its bytes."""
    parts = []
    for x in arr.reshape(-1):
        b = x.encode() if isinstance(x, str) else bytes(x)
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def unpack_bytes(buf: bytes | memoryview, count: int, what: str) -> np.ndarray:
    """``count`` elements of the BYTES binary form that fill ``buf`` exactly (a flat object array of
    :class:`bytes`); 400 when the lengths do not add up to ``buf``."""
    mv = memoryview(buf)
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + 4 > len(mv):
            raise InvalidRequest(f"{what}: the BYTES data ends after {i} of {count} elements")
        (n,) = struct.unpack_from("<I", mv, pos)
        pos += 4
        if pos + n > len(mv):
            raise InvalidRequest(f"{what}: BYTES element {i} declares {n} bytes, {len(mv) - pos} are left")
        out[i] = bytes(mv[pos:pos + n])
        pos += n
    if pos != len(mv):
        raise InvalidRequest(f"{what}: {len(mv) - pos} bytes are left after the {count} BYTES elements of the "
                             f"shape")
    return out


def element_count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
