"""What the compiled-model engine builds on a placement (:mod:`.om_engine`'s ``_build``): a runner that
executes one batch of a ``.om`` as ONE call and returns host arrays.

- :class:`DeviceRunner` (an NPU placement): the model loaded with :func:`runtime.offline.load` on the
  placement's device -- weights uploaded and every gear's graph captured once -- and executed through
  :meth:`runtime.offline.OfflineModel.run_in_place`: the inputs uploaded into the model's own input slots
  and the graph replay ``acl.mdl``'s execute queues (one per batch) on the runner's own stream, one wait,
  the outputs downloaded from the model's output slots (instances sharing a device do not wait on each
  other's streams);
- :class:`HostRunner` (the ``cpu`` end of the chain): the same kernel graph run by numpy on the host
  (:class:`runtime.atc.hostrun.HostRun`, one per gear, made on first use), no device in between.

Both take the inputs in the ``.om``'s order (``input_names``; the dynamic-batch input is the runner's
business) and a gear (the batch size executed, or the (height, width) of a model with image-size gears --
``image_sizes``, see :mod:`.om_image_sizes`; None for a static model), and give the outputs in the ``.om``'s
order (``output_names``).  Blocking: building uploads the weights and captures
the graphs (host-synchronous); :meth:`run` blocks for the execution; :meth:`close` frees the device memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence, Union

import numpy as np

from runtime.atc.hostrun import HostRun
from runtime.atc.om import read_om
from runtime.atc.options import DYNAMIC_INPUT_NAME

from .om_image_sizes import ImageSizes
from .placement import SERVE_CPU_ID

#: the gear of one execution: a batch size, an image model's (height, width), or None (a static model)
Gear = Union[int, tuple[int, int], None]


def _dynamic(manifest: dict) -> bool:
    """Whether the model has gears (batch sizes or image sizes) and so atc's gear input."""
    return bool(manifest["dynamic_batch"] or manifest.get("dynamic_hw"))


def _names(manifest: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    ins = tuple(io["name"] for io in manifest["inputs"] if not (_dynamic(manifest) and
                                                                io["name"] == DYNAMIC_INPUT_NAME))
    return ins, tuple(io["name"] for io in manifest["outputs"])


class DeviceRunner:
    """A ``.om`` loaded on one NPU (``devices[0]``) with a stream of its own: an execution uploads the
    inputs straight into the model's input slots, queues the graph replay, waits once and downloads the
    outputs from the model's output slots (:meth:`runtime.offline.OfflineModel.run_in_place`) -- no
    buffers of its own, no device-to-device copies, no allocation per batch."""

    def __init__(self, path: str | Path, devices: list):
        from runtime import offline
        self.devices = list(devices)
        dev = self.devices[0]
        self.model = offline.load(path, dev)
        self.manifest = self.model.manifest
        self.dynamic = _dynamic(self.manifest)
        self.input_names, self.output_names = _names(self.manifest)
        self.image_sizes = ImageSizes.of_manifest(self.manifest)
        try:
            self.stream = dev.stream()
        except BaseException:
            self.model.unload()
            raise

    def run(self, arrays: Sequence[np.ndarray], gear: Gear) -> list[np.ndarray]:
        return self.model.run_in_place(list(arrays), gear if self.dynamic else None, self.stream)

    def close(self) -> None:
        """Unload the model and destroy the stream (both are tried; the first failure is raised)."""
        try:
            self.model.unload()
        finally:
            self.stream.destroy()


class HostRunner:
    """A ``.om`` run on the host by numpy (the CPU fallback placement; ``devices``: its CPU device, which
    only says where the runner is)."""

    def __init__(self, path: str | Path, devices: list):
        self.devices = list(devices)
        self.manifest, self.weights = read_om(Path(path).read_bytes())
        self.dynamic = _dynamic(self.manifest)
        self.input_names, self.output_names = _names(self.manifest)
        self.image_sizes = ImageSizes.of_manifest(self.manifest)
        self._gears: dict[Gear, HostRun] = {}

    def run(self, arrays: Sequence[np.ndarray], gear: Gear) -> list[np.ndarray]:
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
