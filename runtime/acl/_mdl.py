"""The implementation of ``acl.mdl`` (:mod:`runtime.acl.mdl` lists the API and says what it does)."""
from __future__ import annotations

import logging
import os

from devices.errors import InvalidParamError
from runtime import offline

from ._args import as_int, host_view, invalid
from ._calls import acl_call, acl_value
from ._constants import ACL_DT_UNDEFINED, ACL_FORMAT_UNDEFINED, ACL_MAX_TENSOR_NAME_LEN
from ._state import (STATE, DatasetRecord, ModelDescRecord, ModelRecord, add_object, current_context, drop_object,
                     model_record, object_record, stream_record)

ACL_NAMESPACE = "acl.mdl"           # these are acl.mdl.* calls (runtime.acl._calls names them so)

log = logging.getLogger("vnpu.acl")

#: numpy dtype name of each aclDataType a model can take (for a dataset's tensor descriptions)
_DTYPE_NAME = {v: k for k, v in offline.ACL_DTYPES.items()}


# ---------------------------------------------------------------- load / unload
@acl_call(outs=(0,))
def load_from_file(model_path):
    """aclmdlLoadFromFile -> (model_id, ret): a vnpu .om (or an .onnx, compiled on load) onto the current
    context's device.  Host-synchronous: weights uploaded, workspace allocated, every gear captured."""
    c = current_context()
    if not isinstance(model_path, (str, os.PathLike)) or not os.fspath(model_path):
        raise invalid(f"model path must be a non-empty path, got {model_path!r}")
    return _register(offline.load(model_path, c.dev), c)


@acl_call(outs=(0,))
def load_from_mem(model, model_size):
    """aclmdlLoadFromMem(model, model_size) -> (model_id, ret): the .om bytes at host address ``model``
    (e.g. ``acl.util.bytes_to_ptr(om_bytes)``); the range must lie in a live host buffer acl knows."""
    c = current_context()
    ptr, size = as_int(model, "model address"), as_int(model_size, "model size")
    if size <= 0:
        raise invalid(f"model size must be positive, got {size}")
    data = host_view(ptr, size, "model").tobytes()
    return _register(offline.load_from_bytes(data, c.dev, origin=f"<host memory 0x{ptr:x}>"), c)


@acl_call()
def unload(model_id):
    """aclmdlUnload: wait for the model's queued executions, then free its device memory."""
    with STATE.lock:
        rec = model_record(model_id)
        del STATE.models[rec.model_id]
        rec.ctx.models.discard(rec.model_id)
    rec.model.unload()


def _register(model, c) -> int:
    with STATE.lock:
        STATE.models[model.id] = ModelRecord(model.id, c, model)
        c.models.add(model.id)
    return model.id


# ---------------------------------------------------------------- model descriptions
@acl_value(0, init=False)
def create_desc():
    """aclmdlCreateDesc -> an empty model description (filled by get_desc)."""
    return add_object(STATE.model_descs, ModelDescRecord)


@acl_call(init=False)
def destroy_desc(model_desc):
    drop_object(STATE.model_descs, model_desc, "model description")


@acl_call()
def get_desc(model_desc, model_id):
    """aclmdlGetDesc: fill ``model_desc`` with the description of a loaded model (a snapshot: it stays
    readable after the model is unloaded; get_cur_output_dims asks the model itself)."""
    rec = object_record(STATE.model_descs, model_desc, "model description")
    m = model_record(model_id)
    rec.model_id, rec.desc = m.model_id, m.model.desc


@acl_value(0, init=False)
def get_num_inputs(model_desc):
    """Inputs, the dynamic-gear input ``ascend_mbatch_shape_data`` included."""
    return len(_desc(model_desc).inputs)


@acl_value(0, init=False)
def get_num_outputs(model_desc):
    return len(_desc(model_desc).outputs)


@acl_value(0, init=False)
def get_input_size_by_index(model_desc, index):
    """Bytes of input ``index`` at the largest gear (batch or image size)."""
    return _spec(model_desc, "input", index).size


@acl_value(0, init=False)
def get_output_size_by_index(model_desc, index):
    """Bytes of output ``index`` at the largest gear (batch or image size)."""
    return _spec(model_desc, "output", index).size


@acl_call(outs=({"name": "", "dimCount": 0, "dims": []},), init=False)
def get_input_dims(model_desc, index):
    """-> ({"name", "dimCount", "dims"}, ret); -1 on the dynamic axes (the batch, or H and W)."""
    rec = _filled(model_desc)
    i = _index(rec, "input", index)
    return _dims(rec, "input", i, rec.desc.inputs[i].dims)


@acl_call(outs=({"name": "", "dimCount": 0, "dims": []},), init=False)
def get_output_dims(model_desc, index):
    """-> ({"name", "dimCount", "dims"}, ret) at the largest gear."""
    rec = _filled(model_desc)
    i = _index(rec, "output", index)
    return _dims(rec, "output", i, rec.desc.outputs[i].dims)


@acl_call(outs=({"name": "", "dimCount": 0, "dims": []},))
def get_cur_output_dims(model_desc, index):
    """-> ({"name", "dimCount", "dims"}, ret) at the gear last set by set_dynamic_batch_size /
    set_dynamic_hw_size or executed (the largest before either); 145003 once the model is unloaded."""
    rec = _filled(model_desc)
    i = _index(rec, "output", index)
    return _dims(rec, "output", i, model_record(rec.model_id).model.output_dims(i))


@acl_value(ACL_DT_UNDEFINED, init=False)
def get_input_data_type(model_desc, index):
    """-> aclDataType of input ``index`` (ACL_DT_UNDEFINED on failure)."""
    return _spec(model_desc, "input", index).acl_dtype


@acl_value(ACL_DT_UNDEFINED, init=False)
def get_output_data_type(model_desc, index):
    return _spec(model_desc, "output", index).acl_dtype


@acl_value(ACL_FORMAT_UNDEFINED, init=False)
def get_input_format(model_desc, index):
    """-> aclFormat of input ``index`` (ACL_FORMAT_UNDEFINED on failure)."""
    return _spec(model_desc, "input", index).acl_format


@acl_value(ACL_FORMAT_UNDEFINED, init=False)
def get_output_format(model_desc, index):
    return _spec(model_desc, "output", index).acl_format


@acl_value("", init=False)
def get_input_name_by_index(model_desc, index):
    return _spec(model_desc, "input", index).name


@acl_value("", init=False)
def get_output_name_by_index(model_desc, index):
    return _spec(model_desc, "output", index).name


@acl_call(outs=(0,), init=False)
def get_input_index_by_name(model_desc, name):
    """-> (index, ret); 100000 when no input has that name (samples detect dynamic-batch models with
    ``get_input_index_by_name(desc, "ascend_mbatch_shape_data")``)."""
    return _index_by_name(model_desc, "input", name)


@acl_call(outs=(0,), init=False)
def get_output_index_by_name(model_desc, name):
    return _index_by_name(model_desc, "output", name)


@acl_call(outs=({"batchCount": 0, "batch": []},), init=False)
def get_dynamic_batch(model_desc):
    """-> ({"batchCount": n, "batch": [gears]}, ret); batchCount 0 for a static model."""
    gears = list(_desc(model_desc).dynamic_batch)
    return {"batchCount": len(gears), "batch": gears}


@acl_call(outs=({"hwCount": 0, "hw": []},), init=False)
def get_dynamic_hw(model_desc, index):
    """-> ({"hwCount": n, "hw": [[height, width], ...]}, ret): the image-size gears of a model compiled
    with ``vnpu atc --dynamic_image_size`` (hwCount 0 for any other model; ``index`` is reserved: pass
    -1)."""
    d = _desc(model_desc)
    as_int(index, "index")
    return {"hwCount": len(d.dynamic_hw), "hw": [[h, w] for h, w in d.dynamic_hw]}


# ---------------------------------------------------------------- datasets
@acl_value(0, init=False)
def create_dataset():
    """aclmdlCreateDataset -> an empty dataset handle."""
    return add_object(STATE.datasets, DatasetRecord)


@acl_call(init=False)
def destroy_dataset(dataset):
    """aclmdlDestroyDataset: forget the dataset (its data buffers and their memory stay)."""
    drop_object(STATE.datasets, dataset, "dataset")


@acl_call(outs=(0,), init=False)
def add_dataset_buffer(dataset, data_buffer):
    """aclmdlAddDatasetBuffer -> (dataset, ret): append a data buffer (the same dataset handle back)."""
    with STATE.lock:
        rec = object_record(STATE.datasets, dataset, "dataset")
        buf = object_record(STATE.data_buffers, data_buffer, "data buffer")
        rec.buffers.append(buf.handle)
    return rec.handle


@acl_value(0, init=False)
def get_dataset_buffer(dataset, index):
    """-> the data buffer at ``index`` (0 when out of range)."""
    rec = object_record(STATE.datasets, dataset, "dataset")
    i = as_int(index, "index")
    if not 0 <= i < len(rec.buffers):
        raise invalid(f"index {i} is out of range: the dataset holds {len(rec.buffers)} buffers")
    return rec.buffers[i]


@acl_value(0, init=False)
def get_dataset_num_buffers(dataset):
    return len(object_record(STATE.datasets, dataset, "dataset").buffers)


@acl_call(init=False)
def set_dataset_tensor_desc(dataset, tensor_desc, index):
    """aclmdlSetDatasetTensorDesc: describe buffer ``index``; its data type is checked against the
    model at execution (145022 when they differ)."""
    rec = object_record(STATE.datasets, dataset, "dataset")
    td = object_record(STATE.tensor_descs, tensor_desc, "tensor description")
    i = as_int(index, "index")
    if not 0 <= i < len(rec.buffers):
        raise invalid(f"index {i} is out of range: the dataset holds {len(rec.buffers)} buffers")
    rec.tensor_descs[i] = td.handle


@acl_value(0, init=False)
def get_dataset_tensor_desc(dataset, index):
    """-> the tensor description set for buffer ``index`` (0 when none)."""
    rec = object_record(STATE.datasets, dataset, "dataset")
    h = rec.tensor_descs.get(as_int(index, "index"))
    if h is None:
        raise invalid(f"no tensor description is set for index {index}")
    return h


# ---------------------------------------------------------------- execution
@acl_call()
def execute(model_id, input, output):  # noqa: A002 - pyACL's parameter names
    """aclmdlExecute: run the model once on the current context's default stream and block the host
    until it is done (its errors return here)."""
    rec = model_record(model_id)
    ins, outs = _buffers(input, "input"), _buffers(output, "output")
    rec.model.execute(ins, outs, stream_record(0).stream)


@acl_call()
def execute_async(model_id, input, output, stream):  # noqa: A002 - pyACL's parameter names
    """aclmdlExecuteAsync: queue one execution on ``stream`` (returns at once; only orders the device).
    Read the outputs after ``acl.rt.synchronize_stream(stream)``, which also reports its errors."""
    rec = model_record(model_id)
    ins, outs = _buffers(input, "input"), _buffers(output, "output")
    rec.model.execute_async(ins, outs, stream_record(stream).stream)


@acl_call()
def set_dynamic_hw_size(model_id, dataset, index, height, width):
    """aclmdlSetDynamicHWSize: write ``height`` and ``width`` into the dataset's buffer ``index`` (the
    model's ``ascend_mbatch_shape_data`` input; host-synchronous), selecting that image-size gear for the
    next executions with this dataset.  100000 for a zero size, an index out of range, a null buffer
    (acl's checks) or an index that is not the dynamic-gear input; then GE's: 145011 / 145012 for a
    buffer not of the device / under 8 bytes, 145013 for a (height, width) that is not a gear (also on a
    model without image-size gears)."""
    rec = model_record(model_id)
    ds = object_record(STATE.datasets, dataset, "dataset")
    i, h, w = as_int(index, "index"), as_int(height, "height"), as_int(width, "width")
    if h <= 0 or w <= 0:
        raise invalid(f"height and width can not be zero or negative, got {h}x{w}")
    buf = _gear_buffer(ds, i)
    _check_gear_index(rec, i)
    rec.model.set_dynamic_hw_size(offline.DataBuffer(buf.ptr, buf.size), h, w)


def _check_gear_index(rec, i: int) -> None:
    """100000 when the model has a gear input and ``i`` is another input (a vnpu check: GE would write
    the gear over that input's data)."""
    dyn = rec.model.desc.dynamic_input
    if dyn is not None and i != dyn:
        raise invalid(f"index {i} is input {rec.model.desc.inputs[i].name!r}, not the dynamic-gear input "
                      f"(ascend_mbatch_shape_data is input {dyn})")


def _gear_buffer(ds, i: int):
    if not 0 <= i < len(ds.buffers):
        raise invalid(f"index {i} is out of range: the dataset holds {len(ds.buffers)} buffers")
    buf = object_record(STATE.data_buffers, ds.buffers[i], f"data buffer {i} of the dataset")
    if not buf.ptr:
        raise invalid(f"data buffer {i} of the dataset has a null address")
    return buf


@acl_call()
def set_dynamic_batch_size(model_id, dataset, index, batch_size):
    """aclmdlSetDynamicBatchSize: write ``batch_size`` into the dataset's buffer ``index`` (the model's
    ``ascend_mbatch_shape_data`` input; host-synchronous).  100000 for batch 0, an index out of range, a
    null buffer or an index that is not the dynamic-gear input; 145013 for a batch that is not a gear."""
    rec = model_record(model_id)
    ds = object_record(STATE.datasets, dataset, "dataset")
    i, batch = as_int(index, "index"), as_int(batch_size, "batch size")
    if batch == 0:
        raise invalid("batch size can not be zero")
    buf = _gear_buffer(ds, i)
    _check_gear_index(rec, i)
    rec.model.set_dynamic_batch_size(offline.DataBuffer(buf.ptr, buf.size), batch)


# ---------------------------------------------------------------- helpers
def _filled(model_desc) -> ModelDescRecord:
    rec = object_record(STATE.model_descs, model_desc, "model description")
    if rec.desc is None:
        raise invalid(f"model description {model_desc!r} is empty: call acl.mdl.get_desc first")
    return rec


def _desc(model_desc) -> offline.ModelDesc:
    return _filled(model_desc).desc


def _index(rec: ModelDescRecord, kind: str, index) -> int:
    specs = rec.desc.inputs if kind == "input" else rec.desc.outputs
    i = as_int(index, "index")
    if not 0 <= i < len(specs):
        raise invalid(f"{kind} index {i} is out of range: the model has {len(specs)} {kind}s")
    return i


def _spec(model_desc, kind: str, index) -> offline.IOSpec:
    rec = _filled(model_desc)
    i = _index(rec, kind, index)
    return (rec.desc.inputs if kind == "input" else rec.desc.outputs)[i]


def _dims(rec: ModelDescRecord, kind: str, index: int, dims) -> dict:
    """pyACL's aclmdlIODims dict; a name longer than C's 128-byte field reads as GE's conversion name."""
    spec = (rec.desc.inputs if kind == "input" else rec.desc.outputs)[index]
    name = spec.name
    if len(name.encode()) + 1 > ACL_MAX_TENSOR_NAME_LEN:
        name = f"acl_modelId_{rec.model_id}_{kind}_{index}"
    return {"name": name, "dimCount": len(dims), "dims": [int(d) for d in dims]}


def _index_by_name(model_desc, kind: str, name) -> int:
    d = _desc(model_desc)
    if not isinstance(name, str):
        raise invalid(f"tensor name must be a string, got {name!r}")
    i = d.input_index(name) if kind == "input" else d.output_index(name)
    if i is None:
        raise invalid(f"the model has no {kind} named {name!r}")
    return i


def dataset_buffer(dataset, index: int) -> offline.DataBuffer:
    """Buffer ``index`` of ``dataset`` as a runtime.offline DataBuffer (100000 when out of range)."""
    ds = object_record(STATE.datasets, dataset, "dataset")
    if not 0 <= index < len(ds.buffers):
        raise invalid(f"index {index} is out of range: the dataset holds {len(ds.buffers)} buffers")
    b = object_record(STATE.data_buffers, ds.buffers[index], f"data buffer {index} of the dataset")
    return offline.DataBuffer(b.ptr, b.size)


def _buffers(dataset, kind: str) -> list:
    """The dataset's buffers as runtime.offline DataBuffers (with the data type of a tensor description
    set on them); 100000 for an unknown dataset or a destroyed buffer or description in it."""
    ds = object_record(STATE.datasets, dataset, f"{kind} dataset")
    out = []
    for i, h in enumerate(ds.buffers):
        b = object_record(STATE.data_buffers, h, f"data buffer {i} of the {kind} dataset")
        dtype = None
        td = ds.tensor_descs.get(i)
        if td is not None:
            t = object_record(STATE.tensor_descs, td, f"tensor description {i} of the {kind} dataset")
            dtype = _DTYPE_NAME.get(t.dtype, f"aclDataType {t.dtype}")
        out.append(offline.DataBuffer(b.ptr, b.size, dtype))
    return out


# ---------------------------------------------------------------- model run instances (aclmdlRI)
@acl_call()
def ri_capture_begin(stream, mode=0):
    """aclmdlRICaptureBegin: later tasks on ``stream`` are recorded, not run."""
    stream_record(stream).stream.begin_capture(as_int(mode, "mode"))


@acl_call(outs=(0, 0))
def ri_capture_get_info(stream):
    """aclmdlRICaptureGetInfo -> (status, model_ri, ret): status 0 none / 1 active / 2 invalidated;
    model_ri is 0 until the capture ends."""
    return stream_record(stream).stream.capture_status(), 0


@acl_call(outs=(0,))
def ri_capture_end(stream):
    """aclmdlRICaptureEnd -> (model_ri, ret)."""
    g = stream_record(stream).stream.end_capture()
    h = STATE.new_handle()
    STATE.model_ris[h] = g
    return h


@acl_call()
def ri_execute_async(model_ri, stream):
    """aclmdlRIExecuteAsync: queue one replay on ``stream`` (returns at once)."""
    _model_ri(model_ri).execute_async(stream_record(stream).stream)


@acl_call()
def ri_execute(model_ri, timeout):
    """aclmdlRIExecute: replay and wait (``timeout`` ms, -1 forever)."""
    _model_ri(model_ri).execute(as_int(timeout, "timeout"))


@acl_call()
def ri_debug_print(model_ri):
    """aclmdlRIDebugPrint: log the model's tasks (also returned by runtime.graph.Graph.info)."""
    log.info("model RI 0x%x: %s", int(model_ri), _model_ri(model_ri).info())


@acl_call()
def ri_destroy(model_ri):
    """aclmdlRIDestroy (replays already queued still run)."""
    g = _model_ri(model_ri)
    STATE.model_ris.pop(int(model_ri), None)
    g.destroy()


def _model_ri(handle):
    g = STATE.model_ris.get(as_int(handle, "model_ri"))
    if g is None:
        raise InvalidParamError(f"unknown or destroyed model run instance {handle!r}")
    return g


