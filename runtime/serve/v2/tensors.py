"""One tensor between the wire and numpy: a shape as the protocol sends it, JSON ``data`` (flat or nested,
row-major) and raw bytes (Triton's binary tensor data, gRPC's raw contents) to an array of the datatype,
and back.  Every malformed tensor -- a shape that is not a list of non-negative integers, an element count
or byte size that does not match the shape, a value of the wrong kind (a float for an INT32, a number for a
BYTES, an integer out of the datatype's range) -- is an :class:`InvalidRequest` (400) naming the tensor.
Arrays decoded from raw bytes are read-only views of the request's buffer.  Nothing blocks."""
from __future__ import annotations

import numpy as np

from ..engine.errors import EngineFailure, InvalidRequest
from .datatypes import Datatype, datatype_of, element_count, pack_bytes, unpack_bytes

#: the largest rank a tensor may have (what one request can make the server allocate is bounded anyway)
MAX_RANK = 32


def parse_shape(shape, what: str) -> tuple[int, ...]:
    """A protocol shape: a list of non-negative integers (400 otherwise)."""
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidRequest(f"{what}: shape must be a list of at most {MAX_RANK} non-negative integers, got "
                             f"{shape!r}", "shape")
    return tuple(int(d) for d in shape)


def _flat(data, what: str) -> list:
    """Nested lists flattened row-major (400 for anything but lists of scalars)."""
    if not isinstance(data, list):
        raise InvalidRequest(f"{what}: data must be a (flat or nested) list, got {type(data).__name__}", "data")
    out: list = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def _numeric(flat: list, dt: Datatype, what: str) -> np.ndarray:
    """JSON values as ``dt``: true/false for BOOL, integers in range for the integer types, numbers for the
    floating types (exact types checked: a bool is not an integer here)."""
    kind = dt.dtype.kind
    if kind == "b":
        ok, want = all(type(x) is bool for x in flat), "true/false"
    elif kind in "iu":
        ok, want = all(type(x) is int for x in flat), "integers"
        if ok and flat:
            info = np.iinfo(dt.dtype)
            if min(flat) < info.min or max(flat) > info.max:
                raise InvalidRequest(f"{what}: a value is out of the range of {dt.name} [{info.min}, {info.max}]",
                                     "data")
    else:
        ok, want = all(type(x) in (int, float) for x in flat), "numbers"
    if not ok:
        bad = next(x for x in flat if not (type(x) is bool if kind == "b" else type(x) is int if kind in "iu"
                                           else type(x) in (int, float)))
        raise InvalidRequest(f"{what}: {dt.name} data must be {want}, got {bad!r}", "data")
    try:
        return np.array(flat, dtype=dt.dtype)
    except OverflowError:                      # an integer too large for a float
        raise InvalidRequest(f"{what}: a value is out of the range of {dt.name}", "data") from None


def from_json(data, dt: Datatype, shape: tuple[int, ...], what: str) -> np.ndarray:
    """JSON ``data`` (flat or nested) as an array of ``dt`` and ``shape``; BYTES elements are strings
    (sent as their utf-8 bytes)."""
    flat = _flat(data, what)
    count = element_count(shape)
    if len(flat) != count:
        raise InvalidRequest(f"{what}: shape {list(shape)} holds {count} elements, data has {len(flat)}", "data")
    if dt.name != "BYTES":
        return _numeric(flat, dt, what).reshape(shape)
    if not all(isinstance(x, str) for x in flat):
        bad = next(x for x in flat if not isinstance(x, str))
        raise InvalidRequest(f"{what}: BYTES data must be strings, got {type(bad).__name__}", "data")
    arr = np.empty(count, dtype=object)
    arr[:] = [x.encode() for x in flat]
    return arr.reshape(shape)


def from_raw(buf: bytes | memoryview, dt: Datatype, shape: tuple[int, ...], what: str) -> np.ndarray:
    """Raw little-endian bytes (BYTES: length-prefixed elements) as an array of ``dt`` and ``shape``."""
    count = element_count(shape)
    if dt.name == "BYTES":
        return unpack_bytes(buf, count, what).reshape(shape)
    want = count * dt.dtype.itemsize
    if len(buf) != want:
        raise InvalidRequest(f"{what}: shape {list(shape)} of {dt.name} is {want} bytes, the binary data has "
                             f"{len(buf)}", "binary_data_size")
    if dt.name == "BOOL":
        return np.frombuffer(buf, dtype=np.uint8).astype(np.bool_).reshape(shape)
    return np.frombuffer(buf, dtype=dt.dtype).reshape(shape)


def to_raw(arr: np.ndarray, dt: Datatype) -> bytes:
    """An output's raw bytes, row-major little-endian (BYTES: length-prefixed elements)."""
    if dt.name == "BYTES":
        return pack_bytes(arr)
    return np.ascontiguousarray(arr, dtype=dt.dtype).tobytes()


def to_json(arr: np.ndarray, dt: Datatype, what: str) -> list:
    """An output's elements, flat, as JSON values (BYTES as utf-8 strings: 400 for bytes that are not
    utf-8 -- ask for binary data)."""
    flat = arr.reshape(-1)
    if dt.name != "BYTES":
        return flat.tolist()
    try:
        return [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    except UnicodeDecodeError:
        raise InvalidRequest(f"{what} holds bytes that are not UTF-8 and cannot be JSON: ask for it as binary "
                             f"data (parameters.binary_data: true)", "outputs") from None


def check_output(arr, spec_datatype: str, what: str) -> np.ndarray:
    """An engine's output array of the datatype its metadata declares (EngineFailure otherwise: the
    engine's bug, not the client's)."""
    if not isinstance(arr, np.ndarray):
        raise EngineFailure(f"{what}: the engine returned {type(arr).__name__}, not an array")
    try:
        got = datatype_of(arr)
    except TypeError:
        got = str(arr.dtype)
    if got != spec_datatype:
        raise EngineFailure(f"{what}: the engine returned {got}, the model's metadata says {spec_datatype}")
    return arr
