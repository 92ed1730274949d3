"""A request's tensors against the model's metadata, before their data is decoded and before any device
work: every input named once and known, every required input there, each of the model's datatype and
rank, each fixed dimension as declared (``-1`` takes any), and -- for a model that batches
(``max_batch_size > 0``, Triton's semantics: the first dimension is the batch) -- one batch size for all
inputs, from 1 to ``max_batch_size``; the outputs asked for named once and known.  Each refusal is an
:class:`InvalidRequest` (400) that says what the model takes.  Pure; nothing blocks."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.errors import InvalidRequest
from .repository import ModelMetadata, TensorSpec


@dataclass(frozen=True)
class TensorHeader:
    """An input tensor as a request declares it (its data not decoded yet)."""
    name: str
    datatype: str
    shape: tuple[int, ...]


def _names(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(s.name for s in specs) or "none"


def _once(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise InvalidRequest(f"{what} {n!r} is given more than once", what + "s")
        seen.add(n)


def _check_tensor(meta: ModelMetadata, spec: TensorSpec, h: TensorHeader) -> None:
    what = f"input {h.name!r} of model {meta.name!r}"
    if h.datatype != spec.datatype:
        raise InvalidRequest(f"{what}: datatype {h.datatype}, the model takes {spec.datatype}", "datatype")
    if len(h.shape) != len(spec.shape):
        raise InvalidRequest(f"{what}: shape {list(h.shape)} has {len(h.shape)} dimensions, the model takes "
                             f"{list(spec.shape)}", "shape")
    first = 1 if meta.max_batch_size > 0 else 0
    for i in range(first, len(spec.shape)):
        if spec.shape[i] != -1 and h.shape[i] != spec.shape[i]:
            raise InvalidRequest(f"{what}: shape {list(h.shape)} does not match the model's {list(spec.shape)} "
                                 f"(dimension {i})", "shape")


def _rows(meta: ModelMetadata, headers: list[TensorHeader]) -> int:
    """The request's batch size (1 for a model that does not batch)."""
    if meta.max_batch_size <= 0 or not headers:
        return 1
    sizes = {h.name: h.shape[0] for h in headers}
    rows = headers[0].shape[0]
    if any(b != rows for b in sizes.values()):
        raise InvalidRequest(f"the inputs of model {meta.name!r} must share one batch size (first dimension), "
                             f"got {sizes}", "shape")
    if not 1 <= rows <= meta.max_batch_size:
        raise InvalidRequest(f"batch size {rows} of model {meta.name!r} is out of range: the model takes 1 to "
                             f"{meta.max_batch_size} rows per request (max_batch_size)", "shape")
    return rows


def check_request(meta: ModelMetadata, headers: list[TensorHeader], outputs: list[str]) -> int:
    """Check the request's inputs and requested outputs against ``meta``; its batch size (rows)."""
    _once([h.name for h in headers], "input")
    _once(outputs, "output")
    specs = {s.name: s for s in meta.inputs}
    for h in headers:
        spec = specs.get(h.name)
        if spec is None:
            raise InvalidRequest(f"model {meta.name!r} has no input {h.name!r} (its inputs: {_names(meta.inputs)})",
                                 "inputs")
        _check_tensor(meta, spec, h)
    given = {h.name for h in headers}
    missing = [s.name for s in meta.inputs if not s.optional and s.name not in given]
    if missing:
        raise InvalidRequest(f"model {meta.name!r} needs input(s) {', '.join(missing)} (its inputs: "
                             f"{_names(meta.inputs)})", "inputs")
    known = {s.name for s in meta.outputs}
    for o in outputs:
        if o not in known:
            raise InvalidRequest(f"model {meta.name!r} has no output {o!r} (its outputs: {_names(meta.outputs)})",
                                 "outputs")
    return _rows(meta, headers)
