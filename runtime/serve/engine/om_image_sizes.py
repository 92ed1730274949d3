"""The image-size gears of a compiled model (``vnpu atc --dynamic_image_size``) as the server serves them.

Such a ``.om`` has -1 on H and W of its NCHW inputs and a list of (height, width) gears; every input with
-1 takes the same (h, w) in one execution, chosen through atc's ``ascend_mbatch_shape_data`` input, which
the runner fills (clients never see it).  :meth:`ImageSizes.of_request` reads a request's (h, w) from its
tensors' last two axes and refuses, as an :class:`~.errors.InvalidRequest` (400) naming the accepted
sizes, a request whose inputs disagree or whose size is not a gear -- before anything is queued.  The
(h, w) is then the request's batching key: requests of different sizes never share an execution.

Pure and host-only; nothing blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from runtime.atc.options import DYNAMIC_INPUT_NAME

from .errors import InvalidRequest

HW = tuple[int, int]


@dataclass(frozen=True)
class ImageSizes:
    """``gears``: the (height, width) gears as compiled; ``inputs``: the inputs whose H and W (their last
    two axes) follow the gear."""
    gears: tuple[HW, ...]
    inputs: tuple[str, ...]

    @classmethod
    def of_manifest(cls, manifest: dict) -> "ImageSizes | None":
        """The image-size gears of a ``.om`` manifest (None for a model without them)."""
        gears = tuple((int(h), int(w)) for h, w in manifest.get("dynamic_hw") or ())
        if not gears:
            return None
        ins = tuple(io["name"] for io in manifest["inputs"]
                    if io["name"] != DYNAMIC_INPUT_NAME and len(io["dims"]) >= 2 and -1 in io["dims"][-2:])
        return cls(gears, ins)

    @property
    def text(self) -> str:
        """The accepted sizes as a refusal names them: ``8x12, 16x16 (height x width)``."""
        return ", ".join(f"{h}x{w}" for h, w in self.gears) + " (height x width)"

    def of_request(self, model: str, inputs: Mapping[str, np.ndarray]) -> HW:
        """The (height, width) a request of ``model`` with these ``inputs`` executes at; InvalidRequest
        when its image inputs disagree or the size is not one of the gears."""
        sizes = {n: tuple(int(d) for d in np.shape(inputs[n])[-2:]) for n in self.inputs if n in inputs}
        if len(set(sizes.values())) > 1:
            got = ", ".join(f"{n} {h}x{w}" for n, (h, w) in sizes.items())
            raise InvalidRequest(f"the image inputs of model {model!r} must share one height x width, got {got}",
                                 "shape")
        hw = next(iter(sizes.values()), None)
        if hw is None or len(hw) != 2 or hw not in self.gears:
            what = f"{hw[0]}x{hw[1]}" if hw is not None and len(hw) == 2 else "none"
            raise InvalidRequest(f"image size {what} (height x width) is not one of model {model!r}'s sizes: "
                                 f"it accepts {self.text}", "shape")
        return (hw[0], hw[1])


__all__ = ["ImageSizes"]
