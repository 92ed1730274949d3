"""A compiled gear run on the host by numpy, one pass, no runtime: the physical bound of the device replay.

:class:`HostRun` lays the gear's workspace and the weights out in host memory exactly as the device
would (same offsets, same views) and calls each step's kernel directly as one block, so it executes the
SAME kernel graph with nothing of the emulator around it: no launch path, no graph replay, no copies
between host and device.  ``vnpu bench mdl`` reports the device replay against it.
"""
from __future__ import annotations

import numpy as np

from devices.kernel import BlockCtx, lookup

from .om import gear_key


def _tuples(attrs: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}


class HostRun:
    """``batch``: the gear to run -- a batch size, an (h, w) of an image-size model, or None (the last)."""

    def __init__(self, manifest: dict, weights, batch: int | tuple[int, int] | None = None):
        gears = manifest["gears"]
        key = tuple(batch) if isinstance(batch, (tuple, list)) else batch
        gear = next((g for g in gears if gear_key(g) == key), None) if key is not None else gears[-1]
        if gear is None:
            raise ValueError(f"no gear {key}; gears: {[gear_key(g) for g in gears]}")
        self.gear = gear
        self.ws = np.zeros(max(gear["workspace_size"], 1), np.uint8)
        self.w = np.frombuffer(weights, np.uint8) if len(weights) else np.zeros(1, np.uint8)
        regions = {"ws": self.ws, "w": self.w}

        def view(v):
            region, off, shape, dtype = v
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            return regions[region][off:off + n].view(dtype).reshape(shape)
        self.steps = [(lookup(s["kernel"]).run, [view(v) for v in s["inputs"]], [view(v) for v in s["outputs"]],
                       _tuples(s["attrs"])) for s in gear["steps"]]
        self.inputs = [view(v) for v in gear["inputs"]]
        self.outputs = [view(v) for v in gear["outputs"]]
        self._ctx = BlockCtx(0, 1, 0)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Copy ``inputs`` in, run every kernel once, return copies of the outputs."""
        for dst, src in zip(self.inputs, inputs):
            np.copyto(dst, np.asarray(src).reshape(dst.shape), casting="same_kind")
        ctx = self._ctx
        for run, ins, outs, attrs in self.steps:
            run(ctx, ins, outs, attrs)
        return [o.copy() for o in self.outputs]
