"""Tensor data types of a served compiled model, under their three names: the Open Inference Protocol's
(KServe v2 ``datatype``: ``FP32``), Triton's model configuration's (``data_type: TYPE_FP32``) and numpy's
(what an ``.om`` manifest and the device hold: ``float32``).

Only the types a vnpu device holds (:data:`devices.kernel.DTYPES`) are servable; the others of either
table (``BYTES``/``TYPE_STRING``, ``BF16``, unsigned 16-64 bit) are refused by name.
"""
from __future__ import annotations

from devices.kernel import DTYPES

#: KServe v2 datatype -> numpy dtype name (the types a vnpu device holds)
V2_TO_NUMPY: dict[str, str] = {"BOOL": "bool", "UINT8": "uint8", "INT8": "int8", "INT16": "int16", "INT32": "int32",
                               "INT64": "int64", "FP16": "float16", "FP32": "float32", "FP64": "float64"}
NUMPY_TO_V2: dict[str, str] = {v: k for k, v in V2_TO_NUMPY.items()}
#: the protocol's types vnpu cannot serve (named in the refusal, not "unknown")
UNSERVABLE = ("BYTES", "BF16", "UINT16", "UINT32", "UINT64")
TRITON_PREFIX = "TYPE_"

assert set(V2_TO_NUMPY.values()) == set(DTYPES)


def v2_datatype(text: str) -> str:
    """The v2 name of ``FP32``, ``TYPE_FP32`` or ``float32`` (``TYPE_STRING`` is ``BYTES``); ValueError with
    the reason for anything else."""
    if not isinstance(text, str):
        raise ValueError(f"expected a data type name (TYPE_FP32, FP32 or float32), got {text!r}")
    t = text.strip()
    if t in NUMPY_TO_V2:
        return NUMPY_TO_V2[t]
    v2 = t.upper()
    v2 = v2[len(TRITON_PREFIX):] if v2.startswith(TRITON_PREFIX) else v2
    v2 = "BYTES" if v2 == "STRING" else v2
    if v2 in V2_TO_NUMPY:
        return v2
    if v2 in UNSERVABLE:
        raise ValueError(f"data type {text} is not servable by a vnpu .om model (it holds "
                         f"{', '.join(TRITON_PREFIX + k for k in V2_TO_NUMPY)})")
    raise ValueError(f"unknown data type {text!r} (known: {', '.join(TRITON_PREFIX + k for k in V2_TO_NUMPY)})")


def triton_data_type(v2: str) -> str:
    """``FP32`` -> ``TYPE_FP32`` (the model configuration's spelling)."""
    return TRITON_PREFIX + v2


__all__ = ["NUMPY_TO_V2", "UNSERVABLE", "V2_TO_NUMPY", "triton_data_type", "v2_datatype"]
