"""The sizes a compiled model fixes on its inputs, checked before a request is queued.

A model configuration may say ``-1`` (any size) on an axis that the ``.om`` was compiled with a fixed size
on -- Triton accepts such a config, and the backend then refuses a request of another size as an invalid
argument.  Served here, :meth:`FixedDims.check` refuses it the same way, as an
:class:`~.errors.InvalidRequest` (400) naming the compiled size, before anything is queued -- never as a
failed execution (500).  The batch axis of a model that batches (``max_batch_size`` > 0) is the batcher's
(requests are padded up to a gear), and ``-1`` axes of the ``.om`` (dynamic batch, image-size gears:
:mod:`.om_image_sizes`) take any size here.

Pure and host-only; nothing blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .errors import InvalidRequest


@dataclass(frozen=True)
class FixedDims:
    """``dims``: (input name, its dims as compiled) for each input; ``first``: the first axis checked (1 when
    the model batches on axis 0, else 0)."""
    dims: tuple[tuple[str, tuple[int, ...]], ...]
    first: int

    @classmethod
    def of_manifest(cls, manifest: dict, batching: bool) -> "FixedDims":
        return cls(tuple((io["name"], tuple(int(d) for d in io["dims"])) for io in manifest["inputs"]),
                   1 if batching else 0)

    def check(self, model: str, inputs: Mapping[str, np.ndarray]) -> None:
        """InvalidRequest when an input's size differs from the compiled one on a fixed axis."""
        for name, dims in self.dims:
            if name not in inputs:
                continue
            shape = tuple(int(d) for d in np.shape(inputs[name]))
            for i in range(self.first, min(len(shape), len(dims))):
                if dims[i] != -1 and shape[i] != dims[i]:
                    raise InvalidRequest(f"input {name!r} of model {model!r}: shape {list(shape)} does not match "
                                         f"the compiled model's {list(dims)} (dimension {i} is fixed at {dims[i]})",
                                         "shape")


__all__ = ["FixedDims"]
