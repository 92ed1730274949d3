"""Offline models on a device: load a compiled ``.om`` (or an ``.onnx``, compiled on load -- a vnpu
extension), describe it, execute it as ONE graph replay per call, switch gears (dynamic batch or
dynamic image size), unload.

What a load does (host-synchronous): the weights go to the device once (one allocation), the workspace
that the compiler's memory plan sized is allocated once (one allocation, shared by all gears: only one
gear runs at a time), and each gear's kernel sequence is captured ONCE on a private stream as a graph
(``Stream.capture``; the device validates and binds every launch at capture).  Nothing is launched per
kernel afterwards.  The launches let the device choose their block_dim (as the runtime's own jobs do):
a replay runs each step's blocks one after another on one AI Core thread, so splitting a kernel into
the SoC's 20 blocks would only cost host time; the compiler's per-SoC tiling (``block_dim`` in the
manifest) is what its report's modeled device time is priced with.

What an execution does (only orders the device, :meth:`OfflineModel.execute_async`): D2D copies of the
caller's input buffers into the gear's staging slots, one graph replay, D2D copies of the outputs into
the caller's buffers, all on the caller's stream; :meth:`OfflineModel.execute` then blocks the host until
that stream is done.  Executions on two streams are ordered one after the other (an event), so they never
share the workspace at the same time.  Buffers are device pointers with sizes (:class:`DataBuffer`, or a
``runtime.api.Tensor``, which also carries a dtype that is checked).

Gears: the model's last input ``ascend_mbatch_shape_data`` holds the gear, written as GE writes it: the
batch size by :meth:`set_dynamic_batch_size` (uint64 when the buffer has 8 bytes or more, else uint32),
or height then width by :meth:`set_dynamic_hw_size` (two uint64 when it has 16 bytes or more, else two
uint32); each execution reads it (host-synchronous read of 8 or 16 bytes) and replays that gear's graph.
Input and output buffers may be those of the largest gear (the sizes the description gives): an
execution copies only the gear's bytes.

Errors (typed, with CANN codes; nothing is queued when an argument is refused and the device stays
usable): unloaded / unknown model 145003 ACL_ERROR_GE_EXEC_MODEL_ID_INVALID; wrong number of input or
output buffers 100017 / 100018 (ACL_ERROR_MODEL_INPUT/OUTPUT_NOT_MATCH); a buffer of the wrong size
145000 ACL_ERROR_GE_PARAM_INVALID (GE's own check); a typed buffer of the wrong dtype 145022
ACL_ERROR_GE_DATATYPE_INVALID; a null buffer, or one that is not memory of the model's device (host
memory, another device's) 100000 ACL_ERROR_INVALID_PARAM; a buffer that runs past the end of its
allocation 107000 (the runtime's memory check); a stream of another device
107003 ACL_ERROR_RT_STREAM_CONTEXT; dynamic input null / too short (4 B for a batch, 8 B for an image
size) / a batch or (height, width) that is not a gear 145011 / 145012 / 145013; a model built for
another SoC 545001 ACL_ERROR_GE_LOAD_MODEL; a missing file 145002; a file that is not a vnpu .om: see
:mod:`runtime.atc.om`.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import (ACL_ERROR_GE_DATATYPE_INVALID, ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID,
                            ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID, ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
                            ACL_ERROR_GE_EXEC_MODEL_ID_INVALID, ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID,
                            ACL_ERROR_GE_LOAD_MODEL, ACL_ERROR_GE_PARAM_INVALID, ACL_ERROR_INVALID_PARAM,
                            ACL_ERROR_MODEL_INPUT_NOT_MATCH, ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                            ACL_ERROR_RT_STREAM_CONTEXT, AclError, ModelError)
from devices.arena import is_device_ptr, ptr_device
from devices.kernel import TensorDesc

from runtime.atc.om import gear_key

from .desc import ModelDesc


@dataclass(frozen=True)
class DataBuffer:
    """A device buffer handed to a model: pointer, size in bytes, and optionally its dtype."""
    ptr: int
    size: int
    dtype: str | None = None


def as_buffer(x) -> DataBuffer:
    """A :class:`DataBuffer` from a DataBuffer, a ``runtime.api.Tensor``, or a ``(ptr, size)`` pair."""
    if isinstance(x, DataBuffer):
        return x
    if hasattr(x, "ptr") and hasattr(x, "nbytes") and hasattr(x, "dtype"):
        return DataBuffer(int(x.ptr), int(x.nbytes), str(x.dtype))
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return DataBuffer(int(x[0] or 0), int(x[1]))
    if x is None:
        return DataBuffer(0, 0)
    raise ModelError(f"a model buffer is a DataBuffer, a Tensor or (ptr, size), not {type(x).__name__}",
                     code=ACL_ERROR_INVALID_PARAM)


_ids = itertools.count(1)
_MODELS: dict[int, "OfflineModel"] = {}
_models_lock = threading.Lock()


def get_model(model_id: int) -> "OfflineModel":
    """The loaded model with this id (145003 for an unknown or unloaded one)."""
    m = _MODELS.get(model_id) if isinstance(model_id, int) else None
    if m is None:
        raise ModelError(f"no loaded model with id {model_id!r}", code=ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)
    return m


def _tuples(attrs: dict) -> dict:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}


class OfflineModel:
    """A compiled model loaded on one device.  Use :func:`load` / :func:`load_from_bytes`."""

    def __init__(self, manifest: dict, weights, device, origin: str = "<memory>"):
        self.manifest = manifest
        self.desc = ModelDesc.from_manifest(manifest)
        self.device = device
        self.origin = origin
        chip = device.info().chip
        if manifest["soc_version"] != chip:
            raise ModelError(f"model was built for {manifest['soc_version']} (atc --soc_version); device "
                             f"{device.index} is an {chip}", code=ACL_ERROR_GE_LOAD_MODEL)
        self._lock = threading.Lock()
        self._unloaded = False
        self._weights = self._workspace = None
        self._stream = self._done = None
        self._last_stream = None
        self.graphs: dict = {}
        self.cur_gear = self.desc.largest_gear
        try:
            self._load(weights)
        except BaseException:
            self._release()
            raise
        self.id = next(_ids)
        with _models_lock:
            _MODELS[self.id] = self

    # ------------------------------------------------------------------ load
    def _load(self, weights) -> None:
        from runtime.api import Tensor
        dev = self.device
        wsize = len(weights)
        if wsize:
            self._weights = dev.malloc(wsize)
            Tensor(dev, self._weights, (wsize,), "uint8").copy_from(np.frombuffer(weights, np.uint8))
        self._workspace = dev.malloc(max(int(self.manifest["workspace_size"]), 64))
        self._stream = dev.stream()
        self._done = dev.event()
        for gear in self.manifest["gears"]:
            with self._stream.capture() as cap:
                for s in gear["steps"]:
                    self._stream.launch(s["kernel"], [self._desc(v) for v in s["inputs"]],
                                        [self._desc(v) for v in s["outputs"]], _tuples(s["attrs"]), 0)
            self.graphs[gear_key(gear)] = cap.graph
        self._io = {gear_key(g): ([self._ptr(v) for v in g["inputs"]], [self._ptr(v) for v in g["outputs"]])
                    for g in self.manifest["gears"]}

    def _ptr(self, v) -> int:
        return (self._workspace if v[0] == "ws" else self._weights) + int(v[1])

    def _desc(self, v) -> TensorDesc:
        return TensorDesc(self._ptr(v), tuple(v[2]), v[3])

    @property
    def report(self) -> dict:
        """The compiler's report (launches and intermediate bytes before/after fusion, plan peak ...)."""
        return self.manifest["report"]

    @property
    def hbm_bytes(self) -> int:
        """Device memory the model holds: weights + workspace."""
        return self.manifest["weights"]["size"] + max(int(self.manifest["workspace_size"]), 64)

    def __repr__(self) -> str:
        state = "unloaded" if self._unloaded else f"device {self.device.index}"
        return f"<vnpu OfflineModel {getattr(self, 'id', '?')} {self.desc.name!r} on {state}>"

    # ------------------------------------------------------------------ checks
    def _live(self) -> None:
        if self._unloaded:
            raise ModelError(f"model {self.id} was unloaded", code=ACL_ERROR_GE_EXEC_MODEL_ID_INVALID)

    def _check_stream(self, stream):
        stream = stream if stream is not None else self.device.default_stream
        if getattr(stream, "device", None) is None or stream.device.physical_id != self.device.physical_id:
            raise AclError(f"the stream belongs to device {getattr(getattr(stream, 'device', None), 'index', '?')}; "
                           f"model {self.id} is loaded on device {self.device.index}", code=ACL_ERROR_RT_STREAM_CONTEXT)
        return stream

    def _check_dynamic_buffer(self, buf: DataBuffer, values: int) -> int:
        """The gear input buffer for ``values`` values (1: a batch, 2: height and width): 145011 when null
        or not memory of this device, 145012 when it holds fewer than 4 bytes each (GE's checks); -> the
        bytes of one value (8 when the buffer holds 8 each, else 4)."""
        if not buf.ptr or not is_device_ptr(buf.ptr) or ptr_device(buf.ptr) != self.device.physical_id:
            what = "null" if not buf.ptr else f"0x{buf.ptr:x}, not memory of device {self.device.index}"
            raise ModelError(f"the dynamic-gear input (ascend_mbatch_shape_data) buffer is {what}",
                             code=ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID)
        if buf.size < 4 * values:
            raise ModelError(f"the dynamic-gear input buffer has {buf.size} B, needs at least {4 * values}",
                             code=ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID)
        item = 8 if buf.size >= 8 * values else 4
        self.device.check_range(buf.ptr, item * values)
        return item

    def _read_gear(self, buf: DataBuffer):
        """The gear the dynamic input buffer holds (host-synchronous read)."""
        values = 2 if self.desc.dynamic_hw else 1
        item = self._check_dynamic_buffer(buf, values)
        n = item * values
        self.device.queue.flush()
        raw = self.device.handle.memcpy_d2h(buf.ptr, n)
        raw = np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw.view(np.uint8).reshape(-1)
        vals = [int(v) for v in raw[:n].view("<u8" if item == 8 else "<u4")]
        return (vals[0], vals[1]) if self.desc.dynamic_hw else vals[0]

    def _gear(self, gear) -> None:
        d = self.desc
        if gear not in d.gears or gear is None:
            what = f"height x width {gear[0]}x{gear[1]}" if isinstance(gear, tuple) else f"batch size {gear}"
            gears = (", ".join(f"{h}x{w}" for h, w in d.dynamic_hw) + " (height x width)" if d.dynamic_hw else
                     ", ".join(map(str, d.dynamic_batch)) or "none: the model is not dynamic")
            raise ModelError(f"{what} is not one of model {self.id}'s gears ({gears})",
                             code=ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)

    def _check_io(self, inputs, outputs):
        ins = [as_buffer(x) for x in inputs]
        outs = [as_buffer(x) for x in outputs]
        d = self.desc
        if len(ins) != len(d.inputs):
            raise ModelError(f"model {self.id} has {len(d.inputs)} inputs, got {len(ins)} buffers",
                             code=ACL_ERROR_MODEL_INPUT_NOT_MATCH)
        if len(outs) != len(d.outputs):
            raise ModelError(f"model {self.id} has {len(d.outputs)} outputs, got {len(outs)} buffers",
                             code=ACL_ERROR_MODEL_OUTPUT_NOT_MATCH)
        batch = None
        if d.dynamic:
            batch = self._read_gear(ins[d.dynamic_input])
            self._gear(batch)
        for kind, bufs, specs in (("input", ins, d.inputs), ("output", outs, d.outputs)):
            for i, (b, spec) in enumerate(zip(bufs, specs)):
                if kind == "input" and i == d.dynamic_input:
                    continue
                if not b.ptr:
                    raise ModelError(f"{kind} {i} ({spec.name}): null buffer", code=ACL_ERROR_INVALID_PARAM)
                if not is_device_ptr(b.ptr) or ptr_device(b.ptr) != self.device.physical_id:
                    where = (f"memory of device {ptr_device(b.ptr)}" if is_device_ptr(b.ptr) else
                             "host memory (copy it to the device first: the run mode is ACL_HOST)")
                    raise ModelError(f"{kind} {i} ({spec.name}): buffer 0x{b.ptr:x} is {where}; model {self.id} "
                                     f"runs on device {self.device.index}", code=ACL_ERROR_INVALID_PARAM)
                need = spec.nbytes_at(batch)
                if b.size < need or (kind == "input" and b.size > spec.size):
                    at = f" at gear {batch}" if batch is not None else ""
                    most = f" and at most {spec.size} B" if kind == "input" and spec.size != need else ""
                    raise ModelError(f"{kind} {i} ({spec.name}): buffer has {b.size} B; the model needs {need} B"
                                     f"{at}{most} ({spec.dtype} {list(spec.dims_at(batch))})",
                                     code=ACL_ERROR_GE_PARAM_INVALID)
                if b.dtype is not None and b.dtype != spec.dtype:
                    raise ModelError(f"{kind} {i} ({spec.name}): buffer holds {b.dtype}, the model's {kind} is "
                                     f"{spec.dtype}", code=ACL_ERROR_GE_DATATYPE_INVALID)
                self.device.check_range(b.ptr, need)     # past the end of its allocation: 107000, nothing queued
        return ins, outs, batch

    # ------------------------------------------------------------------ execution
    def execute_async(self, inputs, outputs, stream=None) -> None:
        """Queue one execution on ``stream`` (default: the device's default stream): copies in, one graph
        replay, copies out.  Only orders the device; errors of the replayed kernels surface at the
        stream's next synchronize.  Argument errors raise here and queue nothing."""
        with self._lock:
            self._live()
            stream = self._check_stream(stream)
            ins, outs, batch = self._check_io(inputs, outputs)
            slots_in, slots_out = self._io[batch]
            if self._last_stream is not None and self._last_stream is not stream:
                stream.wait(self._done)                     # never two executions in the workspace at once
            d = self.desc
            for i, (b, spec) in enumerate(zip(ins, d.inputs)):
                if i != d.dynamic_input and spec.nbytes_at(batch):
                    stream.copy(slots_in[i], b.ptr, spec.nbytes_at(batch))
            self.graphs[batch].execute_async(stream)
            for b, spec, slot in zip(outs, d.outputs, slots_out):
                if spec.nbytes_at(batch):
                    stream.copy(b.ptr, slot, spec.nbytes_at(batch))
            self._done.record(stream)
            self._last_stream = stream
            self.cur_gear = batch if batch is not None else self.cur_gear

    def execute(self, inputs, outputs, stream=None, timeout_ms: float = -1) -> None:
        """:meth:`execute_async`, then block the host until the stream has finished it."""
        stream = self._check_stream(stream) if not self._unloaded else stream
        self.execute_async(inputs, outputs, stream)
        stream.synchronize(timeout_ms)

    def run_in_place(self, arrays, batch: int | None, stream) -> list[np.ndarray]:
        """One execution from host arrays straight into the model's own input slots and back out of its
        output slots: one upload per input and one graph replay queued on ``stream`` (the replay
        :meth:`execute_async` queues), one wait, one download per output -- no buffers of the caller and no
        device-to-device copies in between (a server's per-batch path).  ``arrays``: the inputs in the
        model's order without the dynamic-gear input, each exactly its size at ``batch`` (a gear of a model
        with gears: a batch size or a (height, width); else None) in the model's dtype; the outputs are new
        host arrays.  Argument errors raise before anything is queued.  Blocks the host until the stream
        has finished (holding the model's lock throughout: the outputs are read before another execution
        can reuse the slots)."""
        with self._lock:
            self._live()
            stream = self._check_stream(stream)
            d = self.desc
            if d.dynamic:
                self._gear(batch)
            else:
                batch = None
            specs = [spec for i, spec in enumerate(d.inputs) if i != d.dynamic_input]
            slots = [slot for i, slot in enumerate(self._io[batch][0]) if i != d.dynamic_input]
            if len(arrays) != len(specs):
                raise ModelError(f"model {self.id} takes {len(specs)} input(s), got {len(arrays)}",
                                 code=ACL_ERROR_GE_PARAM_INVALID)
            datas = []
            for spec, a in zip(specs, arrays):
                a = np.ascontiguousarray(a, dtype=spec.dtype)
                if a.nbytes != spec.nbytes_at(batch):
                    raise ModelError(f"input {spec.name}: {a.nbytes} B; the model needs {spec.nbytes_at(batch)} B "
                                     f"({spec.dtype} {list(spec.dims_at(batch))})", code=ACL_ERROR_GE_PARAM_INVALID)
                datas.append(a)
            if self._last_stream is not None and self._last_stream is not stream:
                stream.wait(self._done)                     # never two executions in the workspace at once
            for slot, a in zip(slots, datas):
                stream.write(slot, a)
            self.graphs[batch].execute_async(stream)
            self._done.record(stream)
            self._last_stream = stream
            self.cur_gear = batch if batch is not None else self.cur_gear
            stream.synchronize()
            return [self.device.memcpy_d2h(slot, spec.nbytes_at(batch)).view(spec.dtype).reshape(spec.dims_at(batch))
                    for slot, spec in zip(self._io[batch][1], d.outputs)]

    def run(self, arrays: list, batch: int | None = None, stream=None) -> list[np.ndarray]:
        """Convenience for scripts and tests: host arrays in, host arrays out (allocates device buffers for
        one call, uploads, executes, downloads, frees); ``batch`` is the gear: on a dynamic-batch model it
        defaults to the first array's length, on an image-size model to the (height, width) of the first
        input with -1 dims.  Host-synchronous."""
        from runtime.api import Tensor
        self._live()
        d = self.desc
        if d.dynamic and batch is None:
            batch = self._gear_of(arrays)
        dev = self.device
        made: list[Tensor] = []
        try:
            ins = []
            for i, spec in enumerate(d.inputs):
                if i == d.dynamic_input:
                    t = dev.empty((2,), "int64")
                    made.append(t)
                    if isinstance(batch, tuple):
                        self.set_dynamic_hw_size(DataBuffer(t.ptr, 16), *batch)
                    else:
                        self.set_dynamic_batch_size(DataBuffer(t.ptr, 8), batch)
                    ins.append(DataBuffer(t.ptr, t.nbytes))
                    continue
                t = dev.from_numpy(np.asarray(arrays[i], dtype=spec.dtype))
                made.append(t)
                ins.append(t)
            outs = []
            for spec in d.outputs:
                t = dev.empty(spec.dims_at(batch), spec.dtype)
                made.append(t)
                outs.append(t)
            self.execute(ins, outs, stream)
            return [t.numpy(stream) for t in outs]
        finally:
            for t in made:
                t.free()

    def _gear_of(self, arrays):
        d = self.desc
        if d.dynamic_batch:
            return int(np.shape(arrays[0])[0])
        for spec, a in zip(d.inputs, arrays):
            if len(spec.dims) == 4 and spec.dims[2] == spec.dims[3] == -1 and np.ndim(a) == 4:
                return (int(np.shape(a)[2]), int(np.shape(a)[3]))
        raise ModelError(f"model {self.id} has image-size gears; say which: run(arrays, (height, width))",
                         code=ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)

    # ------------------------------------------------------------------ gears
    def set_dynamic_batch_size(self, buffer, batch: int) -> None:
        """Write ``batch`` into the model's dynamic-gear input buffer (host-synchronous), after checking
        that it is one of the gears (145013; also on an image-size model) and that the buffer can hold it
        (145011 / 145012)."""
        self._live()
        self._gear(batch)
        b = as_buffer(buffer)
        item = self._check_dynamic_buffer(b, 1)
        self._write(b, [batch], item)

    def set_dynamic_hw_size(self, buffer, height: int, width: int) -> None:
        """Write ``height`` then ``width`` into the model's dynamic-gear input buffer (host-synchronous), as
        GE does: after checking the buffer (145011 null or not this device's, 145012 under 8 bytes) and that
        (height, width) is one of the gears (145013, also for a model without image-size gears)."""
        self._live()
        b = as_buffer(buffer)
        item = self._check_dynamic_buffer(b, 2)
        self._gear((int(height), int(width)))
        self._write(b, [height, width], item)

    def _write(self, b: DataBuffer, values: list, item: int) -> None:
        raw = np.array(values, "<u8" if item == 8 else "<u4").view(np.uint8)
        self.device.queue.flush()
        self.device.handle.memcpy_h2d(b.ptr, raw)
        self.cur_gear = values[0] if len(values) == 1 else (int(values[0]), int(values[1]))

    # ------------------------------------------------------------------ AIPP
    def aipp_type(self, index: int) -> tuple[str, int | None]:
        """How input ``index`` meets AIPP: ("none" | "static" | "dynamic" | "params", the index of the
        dynamic-AIPP parameter input a "dynamic" input reads)."""
        self._live()
        names = [s.name for s in self.desc.inputs]
        if not 0 <= index < len(names):
            raise ModelError(f"input index {index} is out of range: model {self.id} has {len(names)} inputs",
                             code=ACL_ERROR_INVALID_PARAM)
        from runtime.atc.aipp import DYNAMIC_AIPP_NAME
        for e in self.manifest.get("aipp", []):
            if e["input"] == names[index]:
                return e["mode"], (names.index(DYNAMIC_AIPP_NAME) if e["mode"] == "dynamic" else None)
        return ("params", None) if names[index] == DYNAMIC_AIPP_NAME else ("none", None)

    def set_input_aipp(self, buffer, index: int, rows: np.ndarray) -> None:
        """Write dynamic-AIPP parameters (float64 [pictures, PARAMS], one row per picture) into the
        parameter input's buffer (host-synchronous), after checking that ``index`` is that input, the
        buffer holds them, and each row turns its picture into the model input (145000 naming the row)."""
        from runtime.atc.aipp import PARAMS_BYTES, check_row
        kind, _ = self.aipp_type(index)
        if kind != "params":
            raise ModelError(f"input {index} of model {self.id} is not its dynamic-AIPP parameter input "
                             "(ascend_dynamic_aipp_data)", code=ACL_ERROR_INVALID_PARAM)
        entry = next(e for e in self.manifest["aipp"] if e["mode"] == "dynamic")
        spec = self.desc.inputs[index]
        pictures = spec.dims[0]
        if rows.shape[0] > pictures:
            raise ModelError(f"the parameter set has {rows.shape[0]} pictures; model {self.id} takes {pictures}",
                             code=ACL_ERROR_GE_PARAM_INVALID)
        for i, r in enumerate(rows):
            try:
                check_row(r, tuple(entry["chw"]), f"picture {i}")
            except ValueError as e:
                raise ModelError(str(e), code=ACL_ERROR_GE_PARAM_INVALID) from None
            if _picture_bytes(r) > entry["bytes"]:
                raise ModelError(f"picture {i}: {_picture_bytes(r)} B is more than the model's max_src_image_size "
                                 f"({entry['bytes']} B)", code=ACL_ERROR_GE_PARAM_INVALID)
        full = np.zeros((pictures, rows.shape[1]), np.float64)
        full[:len(rows)] = rows
        full[len(rows):] = rows[-1]
        raw = full.astype("<f8").view(np.uint8).reshape(-1)
        b = as_buffer(buffer)
        if not b.ptr or b.size < raw.size or len(raw) != pictures * PARAMS_BYTES:
            raise ModelError(f"the dynamic-AIPP parameter buffer has {b.size} B, needs {raw.size}",
                             code=ACL_ERROR_GE_PARAM_INVALID)
        self.device.check_range(b.ptr, raw.size)
        self.device.queue.flush()
        self.device.handle.memcpy_h2d(b.ptr, raw)

    def output_dims(self, index: int, gear=None) -> tuple[int, ...]:
        """Dims of output ``index`` at ``gear`` (default: the gear last set or executed)."""
        self._live()
        return self.desc.outputs[index].dims_at(self.cur_gear if gear is None else gear)

    # ------------------------------------------------------------------ unload
    def unload(self) -> None:
        """Wait for this model's queued executions, then free everything it holds (graphs, workspace,
        weights, its stream and event).  Host-synchronous."""
        with self._lock:
            self._live()
            self._unloaded = True
            with _models_lock:
                _MODELS.pop(self.id, None)
            try:
                self._done.synchronize()
            except AclError:
                pass                              # a failed execution: its stream's synchronize reports it
            finally:
                self._release()

    def _release(self) -> None:
        errors = []
        for g in list(self.graphs.values()):
            try:
                g.destroy()
            except AclError as e:
                errors.append(e)
        self.graphs = {}
        for ptr in (self._workspace, self._weights):
            if ptr:
                try:
                    self.device.free(ptr)
                except AclError as e:
                    errors.append(e)
        self._workspace = self._weights = None
        for h in (self._done, self._stream):
            if h is not None:
                try:
                    h.destroy()
                except AclError as e:
                    errors.append(e)
        self._done = self._stream = None
        if errors:
            raise errors[0]


# ---------------------------------------------------------------------------------------------- loading
def _device(device):
    if device is not None:
        return device
    from runtime.api import get_runtime
    return get_runtime().device(0)


def load_from_bytes(data, device=None, origin: str = "<memory>") -> OfflineModel:
    """Load a vnpu ``.om`` held in memory (``aclmdlLoadFromMem``)."""
    from runtime.atc.om import read_om
    manifest, weights = read_om(data)
    return OfflineModel(manifest, weights, _device(device), origin)


def load(path, device=None, *, input_shape=None, dynamic_batch_size=None, dynamic_image_size=None) -> OfflineModel:
    """Load ``path`` (``aclmdlLoadFromFile``): a vnpu ``.om``, or an ``.onnx`` compiled on load for the
    device's SoC (a vnpu extension; ``input_shape`` / ``dynamic_batch_size`` / ``dynamic_image_size`` as
    ``vnpu atc`` takes them)."""
    p = Path(path)
    try:
        if not p.is_file():
            raise ModelError(f"model file {str(path)!r} does not exist or is not a file",
                             code=ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID)
        data = p.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read model file {str(path)!r}: {e.strerror}",
                         code=ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID) from None
    dev = _device(device)
    if p.suffix.lower() == ".onnx":
        from runtime.atc import compile_model, make_options
        cm = compile_model(data, make_options(input_shape, dynamic_batch_size, dev.info().chip,
                                              dynamic_image_size=dynamic_image_size))
        cm.manifest["source"]["file"] = p.name
        return OfflineModel(cm.manifest, cm.weights, dev, str(p))
    return load_from_bytes(data, dev, str(p))


def _picture_bytes(row) -> int:
    from devices.ops.aipp import COL, image_bytes
    return image_bytes(int(row[COL["input_format"]]), int(row[COL["src_image_size_w"]]),
                       int(row[COL["src_image_size_h"]]))
