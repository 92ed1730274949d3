"""What the compiled-model engine builds on a placement (:mod:`.om_engine`'s ``_build``): a runner that
executes one batch of a ``.om`` as ONE call and returns host arrays.

- :class:`DeviceRunner` (an NPU placement): the model loaded with :func:`runtime.offline.load` on the
  placement's device -- weights uploaded and every gear's graph captured once -- and executed through
  :meth:`runtime.offline.OfflineModel.execute` into device buffers the runner keeps per gear: the
  inputs' uploads and one graph replay per batch queued on the runner's own stream, one wait, the outputs
  downloaded -- the same path as ``acl.mdl`` (instances sharing a device do not wait on each other's
  streams);
- :class:`HostRunner` (the ``cpu`` end of the chain): the same kernel graph run by numpy on the host
  (:class:`runtime.atc.hostrun.HostRun`, one per gear, made on first use), no device in between.

Both take the inputs in the ``.om``'s order (``input_names``; the dynamic-batch input is the runner's
business) and a gear (the batch size executed; None for a model without dynamic batch gears), and give
the outputs in the ``.om``'s order (``output_names``).  Blocking: building uploads the weights and captures
the graphs (host-synchronous); :meth:`run` blocks for the execution; :meth:`close` frees the device memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from devices.errors import InvalidParamError
from runtime.atc.hostrun import HostRun
from runtime.atc.om import read_om
from runtime.atc.options import DYNAMIC_INPUT_NAME

from .placement import SERVE_CPU_ID


def _names(manifest: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    ins = tuple(io["name"] for io in manifest["inputs"] if not (manifest["dynamic_batch"] and
                                                                io["name"] == DYNAMIC_INPUT_NAME))
    return ins, tuple(io["name"] for io in manifest["outputs"])


class DeviceRunner:
    """A ``.om`` loaded on one NPU (``devices[0]``), with device buffers of its own per gear (the inputs,
    the outputs and the dynamic-batch input, allocated at a gear's first execution and kept): an execution
    queues the inputs' uploads, the graph replay and nothing else on the runner's stream, waits for it once
    and downloads the outputs -- no allocation, no free, no extra synchronisation per batch."""

    def __init__(self, path: str | Path, devices: list):
        from runtime import offline
        self.devices = list(devices)
        dev = self.devices[0]
        self.model = offline.load(path, dev)
        self.dynamic = bool(self.model.desc.dynamic_batch)
        self.input_names, self.output_names = _names(self.model.manifest)
        self._gears: dict[int | None, tuple[list, list, list, list]] = {}
        try:
            self.stream = dev.stream()
        except BaseException:
            self.model.unload()
            raise

    def _buffers(self, gear: int | None) -> tuple[list, list, list, list]:
        """``(execute's inputs, the tensors the arrays go to, the outputs, every tensor)`` of ``gear`` (made
        once)."""
        bufs = self._gears.get(gear)
        if bufs is not None:
            return bufs
        from runtime.memory import LONG
        from runtime.offline import DataBuffer
        dev, d = self.devices[0], self.model.desc
        made: list = []
        try:
            ins, data = [], []
            for i, spec in enumerate(d.inputs):
                if self.dynamic and i == d.dynamic_input:
                    t = dev.empty((1,), "int64", stream=self.stream, lifetime=LONG)
                    made.append(t)
                    self.model.set_dynamic_batch_size(DataBuffer(t.ptr, 8), gear)
                    ins.append(DataBuffer(t.ptr, 8))
                    continue
                t = dev.empty(spec.dims_at(gear), spec.dtype, stream=self.stream, lifetime=LONG)
                made.append(t)
                ins.append(t)
                data.append(t)
            outs = []
            for spec in d.outputs:
                t = dev.empty(spec.dims_at(gear), spec.dtype, stream=self.stream, lifetime=LONG)
                made.append(t)
                outs.append(t)
        except BaseException:
            for t in made:
                t.free()
            raise
        self._gears[gear] = bufs = (ins, data, outs, made)
        return bufs

    def run(self, arrays: Sequence[np.ndarray], gear: int | None) -> list[np.ndarray]:
        key = gear if self.dynamic else None
        ins, data, outs, _ = self._buffers(key)
        s = self.stream
        for t, a in zip(data, arrays):
            a = np.ascontiguousarray(a, dtype=t.dtype)
            if a.nbytes != t.nbytes:
                raise InvalidParamError(f"an input of {a.nbytes} B for a buffer of {t.nbytes} B at gear {gear}")
            s.write(t.ptr, a)
        self.model.execute(ins, outs, s)
        dev = self.devices[0]
        return [dev.memcpy_d2h(t.ptr, t.nbytes).view(t.dtype).reshape(t.shape) for t in outs]

    def close(self) -> None:
        """Free the buffers, unload the model and destroy the stream (all are tried; the first failure is
        raised)."""
        try:
            for *_, made in self._gears.values():
                for t in made:
                    t.free()
            self._gears.clear()
            self.model.unload()
        finally:
            self.stream.destroy()


class HostRunner:
    """A ``.om`` run on the host by numpy (the CPU fallback placement; ``devices``: its CPU device, which
    only says where the runner is)."""

    def __init__(self, path: str | Path, devices: list):
        self.devices = list(devices)
        self.manifest, self.weights = read_om(Path(path).read_bytes())
        self.dynamic = bool(self.manifest["dynamic_batch"])
        self.input_names, self.output_names = _names(self.manifest)
        self._gears: dict[int | None, HostRun] = {}

    def run(self, arrays: Sequence[np.ndarray], gear: int | None) -> list[np.ndarray]:
        key = gear if self.dynamic else None
        hr = self._gears.get(key)
        if hr is None:
            hr = self._gears[key] = HostRun(self.manifest, self.weights, key)
        return hr.run(list(arrays))

    def close(self) -> None:
        self._gears.clear()


def build_runner(path: str | Path, devices: list) -> DeviceRunner | HostRunner:
    """The runner of ``path`` on ``devices``: on the host for the serve CPU fallback device, else on the
    NPU.  Raises what loading raises (a :class:`devices.errors.ModelError` with its CANN code)."""
    if devices and devices[0].physical_id == SERVE_CPU_ID:
        return HostRunner(path, devices)
    return DeviceRunner(path, devices)


__all__ = ["DeviceRunner", "HostRunner", "build_runner"]
