"""``acl.create_tensor_desc`` and its getters: aclTensorDesc (data type, dims, format, name).

A model dataset may carry one per input (``acl.mdl.set_dataset_tensor_desc``); its data type is then
checked against the model's input at execution (145022 ACL_ERROR_GE_DATATYPE_INVALID), which is how a
wrong dtype becomes detectable for plain (address, size) data buffers.  Getters of an unknown or
destroyed description return C's failure values (0, ACL_DT_UNDEFINED, ACL_FORMAT_UNDEFINED, "").
"""
from __future__ import annotations

import numpy as np

from ._args import as_int, host_view
from ._buffers import data_type_size
from ._calls import acl_call, acl_value
from ._constants import ACL_DT_UNDEFINED, ACL_FORMAT_UNDEFINED, ACL_MAX_DIM_CNT, ACL_UNKNOWN_RANK
from ._state import STATE, TensorDescRecord, add_object, object_record

ACL_NAMESPACE = "acl"               # these are acl.* calls (runtime.acl._calls names them so)

#: aclTensorDesc dims of a tensor whose rank is unknown (C: numDims = ACL_UNKNOWN_RANK, dims [-2])
_UNKNOWN_RANK_DIMS = (-2,)


@acl_value(0, init=False)
def create_tensor_desc(data_type, dims, format):  # noqa: A002 - pyACL's parameter name
    """aclCreateTensorDesc(data_type, dims_list, format) -> handle (0 on failure: a dim below -2, or more
    than ACL_MAX_DIM_CNT dims).  ``dims`` [-2] is a tensor of unknown rank, -1 an unknown dim."""
    dt, fmt = as_int(data_type, "data type"), as_int(format, "format")
    if dims is None:
        dims = ()
    elif isinstance(dims, (int, np.integer)):
        dims = (dims,)
    shape = tuple(as_int(d, "dimension") for d in dims)
    if len(shape) > ACL_MAX_DIM_CNT or any(d < -2 for d in shape) or (-2 in shape and shape != _UNKNOWN_RANK_DIMS):
        raise ValueError(f"invalid tensor dims {list(shape)} (at most {ACL_MAX_DIM_CNT} dims, each >= -1, "
                         "or [-2] for an unknown rank)")
    return add_object(STATE.tensor_descs,
                      lambda h: TensorDescRecord(h, dt, None if shape == _UNKNOWN_RANK_DIMS else shape, fmt))


def destroy_tensor_desc(desc) -> None:
    """aclDestroyTensorDesc: returns None (a C void function); an unknown description is ignored."""
    if isinstance(desc, int) and not isinstance(desc, bool):
        with STATE.lock:
            STATE.tensor_descs.pop(desc, None)


@acl_value(ACL_DT_UNDEFINED, init=False)
def get_tensor_desc_type(desc):
    """aclGetTensorDescType -> aclDataType."""
    return _desc(desc).dtype


@acl_value(ACL_FORMAT_UNDEFINED, init=False)
def get_tensor_desc_format(desc):
    """aclGetTensorDescFormat -> aclFormat."""
    return _desc(desc).format


@acl_value(0, init=False)
def get_tensor_desc_num_dims(desc):
    """aclGetTensorDescNumDims -> number of dims (ACL_UNKNOWN_RANK for an unknown rank)."""
    d = _desc(desc)
    return ACL_UNKNOWN_RANK if d.dims is None else len(d.dims)


@acl_value(-1, init=False)
def get_tensor_desc_dim(desc, index):
    """aclGetTensorDescDim (deprecated) -> dim ``index`` (-1 on failure)."""
    return _dim(desc, index)


@acl_call(outs=(-1,), init=False)
def get_tensor_desc_dim_v2(desc, index):
    """aclGetTensorDescDimV2 -> (dim, ret); 100000 for an index out of range."""
    return _dim(desc, index)


@acl_value(0, init=False)
def get_tensor_desc_element_count(desc):
    """aclGetTensorDescElementCount -> elements (0 when a dim or the rank is unknown)."""
    return _count(_desc(desc))


@acl_value(0, init=False)
def get_tensor_desc_size(desc):
    """aclGetTensorDescSize -> bytes (elements x data_type_size; 0 when a dim or the rank is unknown)."""
    d = _desc(desc)
    return _count(d) * data_type_size(d.dtype)


@acl_value("", init=False)
def get_tensor_desc_name(desc):
    """aclGetTensorDescName -> the name set by set_tensor_desc_name ("" when none)."""
    return _desc(desc).name


def set_tensor_desc_name(desc, name) -> None:
    """aclSetTensorDescName: returns None (a C void function)."""
    rec = STATE.tensor_descs.get(desc) if isinstance(desc, int) and not isinstance(desc, bool) else None
    if rec is not None:
        rec.name = "" if name is None else str(name)


@acl_call(init=False)
def set_tensor_const(desc, data_buffer, length):
    """aclSetTensorConst(desc, data, length): make ``desc`` a constant tensor holding the ``length`` bytes at
    host address ``data_buffer`` (copied now).  ``length`` must be the description's size; a single
    operator (``acl.op``) then matches a model compiled with that constant (``is_const``/``const_value``)."""
    d = _desc(desc)
    n = as_int(length, "length")
    size = _count(d) * data_type_size(d.dtype)
    if n <= 0 or n != size:
        raise ValueError(f"length {n} is not the description's size ({size} B: {_count(d)} elements of "
                         f"{data_type_size(d.dtype)} B)")
    d.const = host_view(data_buffer, n, "constant data").tobytes()


def _desc(desc) -> TensorDescRecord:
    return object_record(STATE.tensor_descs, desc, "tensor description")


def _count(d: TensorDescRecord) -> int:
    if d.dims is None or any(x < 0 for x in d.dims):
        return 0
    return int(np.prod(d.dims, dtype=np.int64))


def _dim(desc, index) -> int:
    d, i = _desc(desc), as_int(index, "index")
    if d.dims is None or not 0 <= i < len(d.dims):
        raise ValueError(f"dim index {i} is out of range for dims "
                         f"{'of unknown rank' if d.dims is None else list(d.dims)}")
    return d.dims[i]
